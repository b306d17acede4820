//! `inotifywait -m` beside the release `cortex-device-agent` under test (which
//! `bench_kit::agent` starts), in the bench's process guard.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;

use crate::bench_kit::procs::{LogTail, Procs};

/// What the idle part compares the agent with, and how to get it.
pub const INOTIFYWAIT: &str = "inotifywait";
pub const INSTALL: &str = "apt-get update && apt-get install -y inotify-tools";

/// Starts `inotifywait -m -q -e close_write,moved_to DIR` (the smallest watcher that
/// would see a shell drop: the `.tmp` written, then renamed) and waits until its watch is set up.
pub fn start_inotifywait(dir: &Path, procs: &mut Procs) -> anyhow::Result<(usize, u32)> {
    let mut child = Command::new(INOTIFYWAIT)
        .args(["-m", "-e", "close_write,moved_to"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting inotifywait")?;
    let pid = child.id();
    let stderr = child.stderr.take().context("inotifywait's stderr")?;
    let index = procs.add("inotifywait", child);
    // It says "Watches established." on stderr once it watches.
    let (log, rx) = LogTail::drain(stderr, "Watches established");
    if rx.recv_timeout(Duration::from_secs(10)).is_err() {
        procs.check_alive(index)?;
        anyhow::bail!(
            "inotifywait did not establish its watch within 10 s: {}",
            log.text()
        );
    }
    Ok((index, pid))
}
