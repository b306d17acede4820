//! Reconnect delays: exponential backoff with full jitter (AWS's "full jitter": a delay drawn
//! uniformly below a ceiling that doubles per failure), so a fleet of devices that lost the
//! same hub does not come back in lockstep. Pure: the random source is seeded by the caller,
//! and no clock is read here.
//!
//! The caller decides when to [`Backoff::reset`]: only once a link proved stable, never on a
//! bare TCP connect (a hub that accepts and then drops would otherwise be hammered).

use std::time::Duration;

/// The backoff state of one link.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    /// Failures since the last reset.
    failures: u32,
    rng: SplitMix64,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration, seed: u64) -> Backoff {
        Backoff {
            base,
            cap: cap.max(base),
            failures: 0,
            rng: SplitMix64(seed),
        }
    }

    /// The ceiling of the next delay: `base · 2^failures`, at most the cap.
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32.checked_shl(self.failures.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// Records a failure and returns how long to wait: uniform in `[floor, ceiling]`, where
    /// the floor (a tenth of the base) only keeps a zero draw from becoming a tight loop.
    pub fn fail(&mut self) -> Duration {
        let ceiling = self.ceiling();
        self.failures = self.failures.saturating_add(1);
        self.draw(self.floor(), ceiling)
    }

    /// Records a failure and returns how long to wait, as [`Backoff::fail`] but at most
    /// `max` (a hub that answered and will be fine shortly).
    pub fn fail_within(&mut self, max: Duration) -> Duration {
        let ceiling = self.ceiling().min(max);
        self.failures = self.failures.saturating_add(1);
        self.draw(self.floor(), ceiling)
    }

    /// Records a failure that more attempts will not cure soon (a refused token, a
    /// protocol version the hub does not speak): wait near the cap, in `[cap/2, cap]`, so
    /// it is retried in case the operator fixes it, but slowly.
    pub fn fail_at_cap(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1).max(self.failures_to_cap());
        self.draw(self.cap / 2, self.cap)
    }

    /// The link proved stable: the next failure starts from the base again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }

    fn floor(&self) -> Duration {
        self.base / 10
    }

    fn failures_to_cap(&self) -> u32 {
        let mut n = 0;
        while n < 31 && self.base.saturating_mul(1 << n) < self.cap {
            n += 1;
        }
        n
    }

    fn draw(&mut self, low: Duration, high: Duration) -> Duration {
        if high <= low {
            return high;
        }
        let span = u64::try_from((high - low).as_nanos()).unwrap_or(u64::MAX);
        let r = if span == u64::MAX {
            self.rng.next()
        } else {
            self.rng.next() % (span + 1)
        };
        low + Duration::from_nanos(r)
    }
}

/// A seed that differs between processes and between calls, from std's randomly keyed
/// hasher; enough for jitter, which needs spread, not secrecy.
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    h.finish()
}

/// Steele, Lea and Flood's SplitMix64: tiny, fast, and good enough for spreading delays.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}
