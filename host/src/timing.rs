//! Timing records for benchmarks: with `CORTEX_TIMING_FILE=PATH` in a daemon's environment,
//! [`record`] appends one JSON line per event to PATH (`{"event": …, "wait": …, "us":
//! microseconds since the epoch}`), so a benchmark reads named records instead of log
//! lines people read and reword. Without the variable nothing is opened and [`on`] is one
//! load of a static that says no.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// The environment variable naming the file records go to.
pub const ENV: &str = "CORTEX_TIMING_FILE";

static SINK: OnceLock<Sink> = OnceLock::new();

/// Opens the file `CORTEX_TIMING_FILE` names, if it is set; the daemons call it at start.
pub fn install_from_env() -> std::io::Result<()> {
    let Some(path) = std::env::var_os(ENV) else {
        return Ok(());
    };
    let sink = Sink::open(Path::new(&path)).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("{ENV}={}: {e}", Path::new(&path).display()),
        )
    })?;
    let _ = SINK.set(sink);
    Ok(())
}

/// Whether records are written; check it before reading a clock for one.
pub fn on() -> bool {
    SINK.get().is_some()
}

/// Records `event` for `wait` at `us` (now when `None`). Nothing when records are off.
pub fn record(event: &str, wait: &str, us: Option<u64>) {
    if let Some(s) = SINK.get() {
        s.write(event, wait, us.unwrap_or_else(now_us));
    }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A file of records.
struct Sink(Mutex<File>);

impl Sink {
    /// Appends to `path` (created if missing).
    fn open(path: &Path) -> std::io::Result<Sink> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Sink(Mutex::new(file)))
    }

    fn write(&self, event: &str, wait: &str, us: u64) {
        let mut line = serde_json::json!({"event": event, "wait": wait, "us": us}).to_string();
        line.push('\n');
        // One write per record, so a reader never sees half of one; a failed write loses
        // a record, which the benchmark reports as missing.
        let mut f = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let _ = f.write_all(line.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_json_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("timing.jsonl");
        let sink = Sink::open(&path).expect("open");
        sink.write("remote_wait_ended", "wp_1", 42);
        sink.write("remote_wait_ended", "wp_\"2", 43);
        let text = std::fs::read_to_string(&path).expect("read");
        let recs: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert_eq!(recs.len(), 2, "{text}");
        assert_eq!(recs[0]["event"], "remote_wait_ended");
        assert_eq!(recs[0]["wait"], "wp_1");
        assert_eq!(recs[0]["us"], 42);
        assert_eq!(recs[1]["wait"], "wp_\"2");
    }

    #[test]
    fn off_unless_installed() {
        // No test installs the global sink: records are off and cost nothing.
        assert!(!on());
        record("x", "y", None);
    }
}
