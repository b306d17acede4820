//! Wall-clock helpers: milliseconds since the epoch, RFC 3339 and human durations.
//! The engine never reads the clock; the server passes `now_ms()` in.

use std::time::{SystemTime, UNIX_EPOCH};

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Microseconds since the epoch (for timing lines in the log).
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// `2026-11-30T05:12:03Z` (UTC, seconds precision).
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's method).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
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
    fn formats_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_012_345_678), "2026-11-30T04:19:05Z");
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
