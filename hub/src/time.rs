//! Wall-clock helpers: milliseconds since the epoch, RFC 3339 and human durations.
//! The engine never reads the clock; the server passes `now_ms()` in.
//!
//! On a shared store the clock is the store's: hubs on one PostgreSQL database decide
//! leases and due timers by the database's clock, which each hub reads with every write
//! and follows ([`follow`]); on redb it is this machine's.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use ::time::OffsetDateTime;
use ::time::macros::format_description;

/// How far the store's clock is ahead of this machine's, in ms.
static AHEAD_MS: AtomicI64 = AtomicI64::new(0);
/// A difference smaller than this is the round trip's, not the clocks': it is not followed,
/// so the clock does not jitter back and forth.
const FOLLOW_PAST_MS: i64 = 5;

/// The store's clock, in ms since the epoch.
pub fn now_ms() -> u64 {
    let local = local_ms();
    let ahead = AHEAD_MS.load(Ordering::Relaxed);
    local.saturating_add_signed(ahead)
}

fn local_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The store's clock read `store_ms` just now: [`now_ms`] follows it from here on, when it
/// differs from this machine's by more than a round trip.
pub fn follow(store_ms: i64) {
    let ahead = store_ms.saturating_sub(local_ms() as i64);
    let was = AHEAD_MS.load(Ordering::Relaxed);
    if (ahead - was).abs() >= FOLLOW_PAST_MS {
        AHEAD_MS.store(ahead, Ordering::Relaxed);
    }
}

/// Microseconds since the epoch (for timing lines in the log).
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// `2026-11-30T05:12:03Z` (UTC, seconds precision). Past 9999-12-31T23:59:59Z, that.
pub fn rfc3339(ms: u64) -> String {
    let layout = format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    utc(ms).format(&layout).unwrap_or_default()
}

/// An RFC 3339 date and time (`2026-12-01T18:00:00Z`, any offset) as ms since the epoch;
/// `None` when it is not one, or is before the epoch.
pub fn parse_rfc3339(s: &str) -> Option<u64> {
    let t =
        OffsetDateTime::parse(s.trim(), &::time::format_description::well_known::Rfc3339).ok()?;
    u64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// The last second RFC 3339's four-digit year can write.
const LAST_SECOND: i64 = 253_402_300_799;

/// `ms` since the epoch as a UTC date and time, whole seconds.
fn utc(ms: u64) -> OffsetDateTime {
    let secs = i64::try_from(ms / 1000).map_or(LAST_SECOND, |s| s.min(LAST_SECOND));
    OffsetDateTime::from_unix_timestamp(secs).unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// `3.2s`, `4m 10s`, `6h 2m`, `2d 3h`.
pub fn human_duration(ms: u64) -> String {
    let s = ms / 1000;
    if s < 60 {
        let tenths = (ms % 1000) / 100;
        return if s < 10 {
            format!("{s}.{tenths}s")
        } else {
            format!("{s}s")
        };
    }
    let (d, h, m) = (s / 86_400, (s % 86_400) / 3600, (s % 3600) / 60);
    if d > 0 {
        format!("{d}d {h}h")
    } else if h > 0 {
        format!("{h}h {m}m")
    } else {
        format!("{m}m {}s", s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dates_with_any_offset() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:01Z"), Some(1_000));
        assert_eq!(parse_rfc3339("1970-01-01T01:00:01.5+01:00"), Some(1_500));
        assert_eq!(
            parse_rfc3339(&rfc3339(1_764_547_200_000)),
            Some(1_764_547_200_000)
        );
        assert_eq!(parse_rfc3339("tomorrow"), None);
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59Z"), None);
    }

    #[test]
    fn formats_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_012_345_678), "2026-11-30T04:19:05Z");
        assert_eq!(rfc3339(4_107_542_399_999), "2100-02-28T23:59:59Z");
        assert_eq!(rfc3339(4_107_542_400_000), "2100-03-01T00:00:00Z");
        assert_eq!(rfc3339(u64::MAX), "9999-12-31T23:59:59Z");
    }

    #[test]
    fn formats_durations() {
        assert_eq!(human_duration(3_250), "3.2s");
        assert_eq!(human_duration(42_000), "42s");
        assert_eq!(human_duration(250_000), "4m 10s");
        assert_eq!(human_duration((6 * 3600 + 2 * 60) * 1000), "6h 2m");
        assert_eq!(human_duration((2 * 86_400 + 3 * 3600) * 1000), "2d 3h");
    }
}
