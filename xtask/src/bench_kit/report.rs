//! What a bench report says besides its own figures: the date, the machine, the disk under
//! a path; and how numbers are written (thousands separators, us/ms).

use std::path::Path;

use time::OffsetDateTime;
use time::macros::format_description;

/// `nproc 2 (AMD EPYC …), 23.5 GiB, Linux 6.x`.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpuinfo = read("/proc/cpuinfo");
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU", |(_, m)| m.trim())
        .to_string();
    let mem_gib = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .map_or("?".to_string(), |kb| format!("{:.1}", kb / 1024.0 / 1024.0));
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_string();
    format!("nproc {cpus} ({model}), {mem_gib} GiB, Linux {kernel}")
}

/// `PATH on FS (DEVICE)`.
pub fn disk(path: &Path) -> String {
    let (fs, dev) = mount_of(path, &read("/proc/self/mountinfo"));
    format!("{} on {fs} ({dev})", path.display())
}

fn read(p: &str) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// The filesystem type and source of the mount holding `path` (longest mount point
/// that prefixes it).
fn mount_of(path: &Path, mountinfo: &str) -> (String, String) {
    let mut best: Option<(usize, String, String)> = None;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (Some(mnt), Some(fs), Some(src)) =
            (fields.get(4), fields.get(sep + 1), fields.get(sep + 2))
        else {
            continue;
        };
        if path.starts_with(mnt) && best.as_ref().is_none_or(|b| mnt.len() >= b.0) {
            best = Some((mnt.len(), fs.to_string(), src.to_string()));
        }
    }
    best.map_or(("?".into(), "?".into()), |(_, fs, src)| (fs, src))
}

/// `1234567.8` → `1,234,568`.
pub fn thousands(v: f64) -> String {
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Microseconds, shown as us below 1 ms and as ms above.
pub fn us(v: f64) -> String {
    if v < 1_000.0 {
        format!("{v:.0} us")
    } else {
        format!("{:.2} ms", v / 1_000.0)
    }
}

/// Seconds, shown as ms.
pub fn ms(s: f64) -> String {
    format!("{:.2} ms", s * 1e3)
}

/// Now as `YYYY-MM-DD HH:MM UTC`.
pub fn utc_now() -> String {
    utc_minutes(OffsetDateTime::now_utc())
}

/// `YYYY-MM-DD HH:MM UTC`.
fn utc_minutes(at: OffsetDateTime) -> String {
    at.format(format_description!(
        "[year]-[month]-[day] [hour]:[minute] UTC"
    ))
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(thousands(1_234_567.6), "1,234,568");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(us(140.4), "140 us");
        assert_eq!(us(1_270.0), "1.27 ms");
        let at = |secs| OffsetDateTime::from_unix_timestamp(secs).expect("in range");
        assert_eq!(utc_minutes(at(0)), "1970-01-01 00:00 UTC");
        assert_eq!(
            utc_minutes(at(20_513 * 86_400 + 3_599)),
            "2026-03-01 00:59 UTC"
        );
    }

    #[test]
    fn mount_lookup_takes_the_longest_prefix() {
        let info = "22 1 254:0 / / rw - ext4 /dev/vda rw\n\
                    30 22 0:25 / /tmp rw - tmpfs tmpfs rw\n";
        assert_eq!(
            mount_of(Path::new("/tmp/x"), info),
            ("tmpfs".into(), "tmpfs".into())
        );
        assert_eq!(
            mount_of(Path::new("/work/x"), info),
            ("ext4".into(), "/dev/vda".into())
        );
    }
}
