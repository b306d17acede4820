//! Spool tests: real files in temp dirs and a real inotify instance. Waits are bounded
//! (`timeout` around `next()`), never sleeps; "nothing else happened" is shown by ordering:
//! a sentinel file dropped afterwards must be the very next event.

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::*;

mod collectors;
mod files;
mod settle;
mod undelivered;
mod watcher;

const BOUND: Duration = Duration::from_secs(10);

struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    dir: PathBuf,
    spool: Arc<Spool>,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().to_owned();
    let dir = root.join("home/tmp/signals");
    let spool = Arc::new(Spool::open(&dir).expect("open spool"));
    Fixture {
        _tmp: tmp,
        root,
        dir,
        spool,
    }
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).expect("stat").mode() & 0o7777
}

/// The one-line shell drop, run by a real shell: printf into `$f.tmp`, then mv to `$f.json`.
fn seed_drop(dir: &Path, stem: &str) -> String {
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(
            r#"f="$1/$2"; printf '{"id":"wp_1a2b3c4d5e6f","secret":"s","status":"%s","message":"exit=%s"}' ok 0 > "$f.tmp" && mv "$f.tmp" "$f.json""#,
        )
        .arg("sh")
        .arg(dir)
        .arg(stem)
        .status()
        .expect("run sh");
    assert!(status.success());
    format!("{stem}.json")
}

/// A `.json` written in place: create, write, close.
fn write_in_place(dir: &Path, name: &str, body: &[u8]) {
    let mut f = fs::File::create(dir.join(name)).expect("create");
    f.write_all(body).expect("write");
}

async fn next(w: &mut SpoolWatcher) -> SpoolEvent {
    tokio::time::timeout(BOUND, w.next())
        .await
        .expect("an event within the bound")
        .expect("watcher error")
}

async fn started(spool: &Arc<Spool>, periodic: Option<Duration>) -> SpoolWatcher {
    let mut w = SpoolWatcher::new(Arc::clone(spool), periodic).expect("watcher");
    assert_eq!(next(&mut w).await, SpoolEvent::Rescan(RescanReason::Start));
    w
}

/// Polls `f` until it is `Ok`, for at most 5 s: long enough for another test's forked
/// child to reach its exec and drop the copies of our descriptors it holds.
fn within_forks<E: std::fmt::Display>(what: &str, mut f: impl FnMut() -> Result<(), E>) {
    let limit = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while let Err(e) = f() {
        assert!(std::time::Instant::now() < limit, "{what}: {e}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn hub() -> Collector {
    Collector::new("cortex-hub", None)
}
