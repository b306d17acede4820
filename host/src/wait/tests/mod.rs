//! Wait tests: real processes (`sleep`, killed), real files in temp dirs, real inotify, real
//! `flock(2)` locks held on other descriptors or by util-linux `flock`. Every wait is
//! bounded; nothing asserts on elapsed time. "It did not fire" is shown by ordering: a
//! sentinel event after the non-event has gone through the same instance, and the wait,
//! polled once, is still pending.

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use inotify::{EventMask, Inotify, WatchMask};
use serde_json::json;
use tokio_stream::StreamExt;

use super::*;

mod file_waits;
mod flock_waits;
mod heartbeat;
mod pid_waits;
mod pure_pieces;

/// The bound on anything expected to happen; never reached when things work.
const BOUND: Duration = Duration::from_secs(20);

fn opts(timeout: Duration) -> WaitOptions {
    WaitOptions::new(timeout)
}

/// A child that is killed and reaped when dropped.
struct Proc(Child);

impl Proc {
    fn sleep() -> Proc {
        Proc(
            Command::new("sleep")
                .arg("300")
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn sleep"),
        )
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    /// SIGKILL without reaping: the process stays a zombie until dropped.
    fn kill(&mut self) {
        self.0.kill().expect("kill");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Polls `f` until true, at most [`BOUND`].
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while !f() {
        assert!(start.elapsed() < BOUND, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn fired(outcome: WaitOutcome) -> Fire {
    match outcome {
        WaitOutcome::Fired(f) => f,
        other => panic!("expected Fired, got {other:?}"),
    }
}

/// A path as a spec holds it (temp paths are UTF-8).
pub(crate) fn utf8(path: &Path) -> String {
    path.to_str().expect("a UTF-8 temp path").to_owned()
}
