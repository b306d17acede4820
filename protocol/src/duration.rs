//! Durations as people write and read them: `30s`, `10m`, `1.5h` in ([`parse_duration`]),
//! `20m`, `1h 30m` out ([`format_duration_ms`]). Pure; the wait parser ([`crate::waits`])
//! and the wire types' descriptions ([`crate::mesh::WaitSpec::describe`]) both use it.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a duration; write it like 30s, 10m, 2h, 1.5h, 1d or a number of seconds")]
pub struct BadDuration(pub String);

/// `30s`, `10m`, `2h`, `1.5h`, `1d`, `500ms`, or bare (fractional) seconds.
pub fn parse_duration(s: &str) -> Result<Duration, BadDuration> {
    let fail = || BadDuration(s.to_string());
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| fail())?;
    let secs_per = match unit.trim() {
        "" | "s" | "sec" | "secs" => 1.0,
        "ms" => 0.001,
        "m" | "min" | "mins" => 60.0,
        "h" | "hr" | "hrs" => 3600.0,
        "d" | "day" | "days" => 86400.0,
        _ => return Err(fail()),
    };
    Duration::try_from_secs_f64(n * secs_per).map_err(|_| fail())
}

/// `20m`, `1h 30m`, `45s`, `500ms`: the two largest units, for messages.
pub fn format_duration_ms(ms: u64) -> String {
    let s = ms / 1000;
    let (days, hours, mins, secs) = (s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
    match (days, hours, mins) {
        (0, 0, 0) if s == 0 => format!("{ms}ms"),
        (0, 0, 0) => format!("{secs}s"),
        (0, 0, _) if secs > 0 => format!("{mins}m {secs}s"),
        (0, 0, _) => format!("{mins}m"),
        (0, _, 0) => format!("{hours}h"),
        (0, _, _) => format!("{hours}h {mins}m"),
        (_, 0, _) => format!("{days}d"),
        _ => format!("{days}d {hours}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_and_print() {
        assert_eq!(
            parse_duration("1.5h").expect("accepted"),
            Duration::from_secs(5400)
        );
        assert_eq!(
            parse_duration("500ms").expect("accepted"),
            Duration::from_millis(500)
        );
        assert!(parse_duration("5 parsecs").is_err());
        assert_eq!(format_duration_ms(1_200_000), "20m");
        assert_eq!(format_duration_ms(5_400_000), "1h 30m");
        assert_eq!(format_duration_ms(250), "250ms");
    }
}
