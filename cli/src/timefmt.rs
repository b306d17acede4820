//! Time for people: durations typed on a command line (`30s`, `1.5h`), and the hub's
//! millisecond timestamps shown as UTC dates or "in 3h". No clock of its own: callers pass
//! "now" in, so every rule here is a plain test.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use time::OffsetDateTime;
use time::macros::format_description;

/// Milliseconds since the Unix epoch, as the hub counts time.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `30s`, `10m`, `2h`, `1.5h`, `1d`, `500ms`, or bare seconds: the one reading of a duration,
/// shared with the API's and the wait conditions' (`cortex_protocol::waits`).
pub use cortex_protocol::waits::{BadDuration, parse_duration};

/// `1h 30m`, `45s`, `2d 3h`: the two largest units, for messages (the protocol's one
/// rendering; no time at all is `0s`).
pub fn human(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    cortex_protocol::duration::format_duration_ms(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `in 3h 2m` or `5m ago`.
pub fn relative(at_ms: u64, now_ms: u64) -> String {
    if at_ms >= now_ms {
        format!("in {}", human(Duration::from_millis(at_ms - now_ms)))
    } else {
        format!("{} ago", human(Duration::from_millis(now_ms - at_ms)))
    }
}

/// `2026-08-13 10:04:05Z` (UTC, whole seconds). Past 9999-12-31 23:59:59Z, that.
pub fn utc(ms: u64) -> String {
    // The last second a four-digit year can write.
    const LAST_SECOND: i64 = 253_402_300_799;
    let secs = i64::try_from(ms / 1000).map_or(LAST_SECOND, |s| s.min(LAST_SECOND));
    let at = OffsetDateTime::from_unix_timestamp(secs).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    at.format(format_description!(
        "[year]-[month]-[day] [hour]:[minute]:[second]Z"
    ))
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations() {
        let d = |s| parse_duration(s).expect(s);
        assert_eq!(d("30s"), Duration::from_secs(30));
        assert_eq!(d("10m"), Duration::from_secs(600));
        assert_eq!(d("2h"), Duration::from_secs(7200));
        assert_eq!(d("1.5h"), Duration::from_secs(5400));
        assert_eq!(d("90"), Duration::from_secs(90));
        assert_eq!(d("0.5"), Duration::from_millis(500));
        assert_eq!(d("1d"), Duration::from_secs(86400));
        assert_eq!(d("250ms"), Duration::from_millis(250));
        assert_eq!(d("0"), Duration::ZERO);
        for bad in ["", "h", "-1s", "1x", "1.2.3s", "ten", "1e99d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn formats_times() {
        assert_eq!(utc(0), "1970-01-01 00:00:00Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00Z");
        assert_eq!(utc(1_786_615_445_000), "2026-08-13 10:04:05Z");
        assert_eq!(utc(1_786_615_445_999), "2026-08-13 10:04:05Z");
        assert_eq!(utc(4_107_542_400_000), "2100-03-01 00:00:00Z");
        assert_eq!(utc(u64::MAX), "9999-12-31 23:59:59Z");
        assert_eq!(
            relative(10_000 + 3 * 3_600_000 + 120_000, 10_000),
            "in 3h 2m"
        );
        assert_eq!(relative(0, 300_000), "5m ago");
        assert_eq!(human(Duration::from_secs(45)), "45s");
        assert_eq!(human(Duration::from_secs(90)), "1m 30s");
        assert_eq!(human(Duration::from_secs(7 * 86400)), "7d");
        assert_eq!(human(Duration::from_secs(86400 + 7200)), "1d 2h");
        assert_eq!(human(Duration::from_millis(100)), "100ms");
    }
}
