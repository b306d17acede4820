//! When to call the model again: exponential backoff with jitter, or the server's own
//! `Retry-After` (seconds or an HTTP date). Pure: the random draw and the clock are passed in.

use std::time::{Duration, SystemTime};

/// The longest backoff the client picks by itself.
pub const BACKOFF_CAP: Duration = Duration::from_secs(30);
/// The longest `Retry-After` honoured: a server asking for more is waited on this long,
/// then tried again (the retry budget bounds the whole).
pub const RETRY_AFTER_CAP: Duration = Duration::from_secs(60);

/// The delay before retry number `retry` (1 for the first): the server's `Retry-After`
/// when it sent one (capped at [`RETRY_AFTER_CAP`]), else [`backoff`].
pub fn delay(base: Duration, retry: u32, retry_after: Option<Duration>, unit: f64) -> Duration {
    match retry_after {
        Some(d) => d.min(RETRY_AFTER_CAP),
        None => backoff(base, retry, unit),
    }
}

/// `base · 2^(retry-1)`, capped at [`BACKOFF_CAP`], then jittered into its upper half
/// (`unit` is a draw from `[0, 1)`): clients that failed together do not retry together,
/// and none retries sooner than half the schedule.
pub fn backoff(base: Duration, retry: u32, unit: f64) -> Duration {
    let doublings = retry.saturating_sub(1).min(31);
    let full = base
        .checked_mul(1u32 << doublings)
        .unwrap_or(BACKOFF_CAP)
        .min(BACKOFF_CAP);
    let unit = if unit.is_finite() {
        unit.clamp(0.0, 1.0)
    } else {
        0.0
    };
    full / 2 + (full / 2).mul_f64(unit)
}

/// A `Retry-After` value: whole seconds, or an HTTP date (a date in the past is no wait).
/// `None` when it is neither. Not capped here: [`delay`] caps.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// A uniform draw from `[0, 1)` for the jitter (0.5 if the system has no randomness to give).
pub fn unit_draw() -> f64 {
    match getrandom::u64() {
        Ok(x) => (x >> 11) as f64 / (1u64 << 53) as f64,
        Err(_) => 0.5,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn backoff_doubles_from_the_base_and_jitters_in_the_upper_half() {
        let base = 500 * MS;
        assert_eq!(backoff(base, 1, 0.0), 250 * MS);
        assert_eq!(
            backoff(base, 1, 0.999_999),
            base.mul_f64(0.5 + 0.5 * 0.999_999)
        );
        assert_eq!(backoff(base, 2, 0.0), 500 * MS);
        assert_eq!(backoff(base, 3, 0.5), 1500 * MS);
        assert_eq!(backoff(base, 4, 1.0), 4000 * MS);
    }

    #[test]
    fn backoff_stops_at_the_cap_however_many_retries() {
        let base = 500 * MS;
        assert_eq!(backoff(base, 7, 1.0), BACKOFF_CAP);
        assert_eq!(backoff(base, 40, 1.0), BACKOFF_CAP);
        assert_eq!(backoff(base, u32::MAX, 0.0), BACKOFF_CAP / 2);
        assert_eq!(backoff(Duration::MAX, 1, 1.0), BACKOFF_CAP);
        // A draw out of range never makes a longer wait.
        assert_eq!(backoff(base, 40, f64::NAN), BACKOFF_CAP / 2);
        assert_eq!(backoff(base, 40, 7.0), BACKOFF_CAP);
    }

    #[test]
    fn retry_after_in_seconds_or_as_an_http_date() {
        let now = httpdate::parse_http_date("Tue, 01 Dec 2026 12:00:00 GMT").expect("date");
        assert_eq!(parse_retry_after("1", now), Some(Duration::from_secs(1)));
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Tue, 01 Dec 2026 12:00:07 GMT", now),
            Some(Duration::from_secs(7))
        );
        // The obsolete date forms HTTP still allows.
        assert_eq!(
            parse_retry_after("Tuesday, 01-Dec-26 12:00:05 GMT", now),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            parse_retry_after("Tue, 01 Dec 2026 11:59:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-1", now), None);
        assert_eq!(parse_retry_after("1.5", now), None);
    }

    #[test]
    fn the_servers_wait_wins_over_the_backoff_up_to_its_cap() {
        let base = 500 * MS;
        assert_eq!(
            delay(base, 1, Some(Duration::from_secs(1)), 0.9),
            Duration::from_secs(1)
        );
        assert_eq!(delay(base, 3, Some(Duration::ZERO), 0.9), Duration::ZERO);
        assert_eq!(
            delay(base, 1, Some(Duration::from_secs(3600)), 0.0),
            RETRY_AFTER_CAP
        );
        assert_eq!(delay(base, 2, None, 0.0), 500 * MS);
    }

    #[test]
    fn draws_are_in_the_unit_interval() {
        for _ in 0..100 {
            let u = unit_draw();
            assert!((0.0..1.0).contains(&u), "{u}");
        }
    }
}
