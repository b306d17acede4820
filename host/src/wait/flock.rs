//! Waiting for a `flock(2)` lock to be free, as `flock FILE true` would, without ever
//! blocking in `flock()` (a thread blocked there cannot be aborted and holds up shutdown)
//! and without making the job's own `flock -n` fail for more than an instant.
//!
//! How: the file is opened once at arm time (read-only, never created) and *probed*:
//! `flock(LOCK_EX | LOCK_NB)`, and on success an immediate `LOCK_UN`. While someone holds
//! the lock the probe fails at once and takes nothing, so the only moment this wait ever
//! holds the lock is the probe that finds it free, which is also the one that fires; the
//! descriptor is closed right after, which releases it even if the unlock failed. A probe
//! runs on every close of the file anybody makes (`IN_CLOSE_WRITE | IN_CLOSE_NOWRITE` on
//! the shared inotify instance: a holder that exits or closes releases its lock by that
//! very close, so this catches the usual release at once) and on a backstop timer from
//! 100 ms doubling to 1 s, for a holder that unlocks with `LOCK_UN` and keeps the file open.
//!
//! Measured on this project's 2 vCPU VM (ext4 on virtio, kernel 6.18, other builds running:
//! load average 3.8), with `cargo run --release -p cortex-host --example
//! flock_probe`, two runs agreeing:
//!
//! | what | p50 | p99 | p99.99 | max |
//! |---|---|---|---|---|
//! | probe on a free lock: `LOCK_EX\|LOCK_NB` asked → `LOCK_UN` returned (the most the lock is held) | 0.56 µs | 0.8-0.95 µs | 70-270 µs | 4.8 ms |
//! | probe on a held lock (one failing syscall, nothing taken) | 0.3 µs | 0.5 µs | 40-170 µs | 4.7 ms |
//! | read and parse `/proc/locks`, 3 locks in the system | 15-21 µs | 36-390 µs | 4 ms | 6.6 ms |
//! | the same with 1,000 more flocks held | 515-545 µs | 4.9-5.1 ms | 12-17 ms | 63 ms |
//! | a job hammering `flock -n` on a free lock (~1M tries/s) beside a prober probing every 1 ms | 1 failed try in 5,500-8,500 | | | |
//!
//! The tails are the prober preempted by the scheduler (one tick, 4 ms) while in or between
//! the two syscalls: on a loaded machine a probe can hold a free lock for milliseconds,
//! rarely. In the hammering test that came to about one failed `flock -n` of the job per
//! two probes that found the lock free; a real wait makes exactly one such probe, the one
//! that fires, and a job that tries `flock -n` now and then hits that window with a
//! probability of about its width over the time between its tries.
//!
//! Watching `/proc/locks` instead (it cannot be watched with inotify, only polled) never
//! holds the lock, but costs a read of every lock in the system per poll, and it would miss
//! holders: it lists only locks of processes in the reader's pid namespace (checked here:
//! under `unshare --pid --fork --mount-proc`, a lock held outside is not listed), so a job
//! in a container and a waiter outside, or the reverse, would look free; and on NFS it sees
//! only this host's locks. The probe asks the kernel the question `flock FILE true` asks, with the
//! same conflict rules, for every holder. A job's `flock -n` can fail only if it lands
//! inside the one window at the fire (under a microsecond, rarely a scheduler tick), after
//! which the wait is gone: that is the trade taken.
//!
//! The wait is on the file opened at arm time: if the path is replaced by another file
//! meanwhile, the lock of the old one is what it reports (the payload says so).
//!
//! It never creates the file, never blocks in `flock()`, and never leaves a lock behind:
//! a probe takes and releases within one synchronous step, so dropping the wait at any
//! await point finds nothing held.

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use inotify::WatchMask;
use rustix::fs::{FlockOperation, Mode, OFlags};
use rustix::io::Errno;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::watches::{Delivery, FileWatches, Subscription};
use super::{Fire, WaitError};

/// The backstop timer's first and longest interval.
pub const PROBE_MIN: Duration = Duration::from_millis(100);
pub const PROBE_MAX: Duration = Duration::from_secs(1);

/// Any close of the lock file may be its holder letting go.
const HINT_MASK: WatchMask = WatchMask::CLOSE_WRITE.union(WatchMask::CLOSE_NOWRITE);

/// Takes the lock without blocking and gives it back at once. `Ok(true)`: it was free.
pub fn probe(fd: impl AsFd) -> io::Result<bool> {
    let fd = fd.as_fd();
    match rustix::fs::flock(fd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {
            // Explicitly, never in a Drop (nix's Flock panics there when unlocking fails);
            // if this fails, closing the descriptor releases the lock anyway.
            let _ = rustix::fs::flock(fd, FlockOperation::Unlock);
            Ok(true)
        }
        Err(Errno::WOULDBLOCK | Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Opens a lock file the way this wait does: read-only (enough for `flock`), never
/// creating it, never blocking on a FIFO, no controlling terminal.
pub fn open_lock_file(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
    )?)
}

/// How many `FLOCK` locks `/proc/locks` lists as held (not waited for) on device `dev`,
/// inode `ino`. Kept for the measurement and the tests: see the module docs for why the
/// wait does not rely on it.
pub fn proc_locks_held(proc_locks: &str, dev: u64, ino: u64) -> usize {
    let want = format!(
        "{:02x}:{:02x}:{ino}",
        rustix::fs::major(dev),
        rustix::fs::minor(dev)
    );
    proc_locks
        .lines()
        .filter(|l| {
            let mut f = l.split_ascii_whitespace().skip(1);
            // A blocked waiter's line reads `N: -> FLOCK …`.
            f.next() == Some("FLOCK") && f.nth(3) == Some(want.as_str())
        })
        .count()
}

/// What was found at arm time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlockCaptured {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    /// It was free when armed (the wait fires at once).
    pub free: bool,
    /// Closes of the file are watched (otherwise only the backstop timer probes).
    pub hinted: bool,
}

pub(crate) struct FlockWait {
    captured: FlockCaptured,
    /// `None` once fired: closed at once, so nothing can stay locked.
    fd: Option<OwnedFd>,
    hint: Option<Subscription>,
    armed_at: Instant,
}

impl std::fmt::Debug for FlockWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlockWait")
            .field("captured", &self.captured)
            .finish_non_exhaustive()
    }
}

pub(crate) fn arm(watches: &FileWatches, path: &Path) -> Result<FlockWait, WaitError> {
    let fd = open_lock_file(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => WaitError::BadPath {
            path: path.to_owned(),
            why: "does not exist, so nobody holds a lock on it (a job creates its lock file when it starts: wait for the file first)",
        },
        _ => WaitError::Path {
            path: path.to_owned(),
            action: "open",
            source: e,
        },
    })?;
    let st = rustix::fs::fstat(&fd).map_err(|e| WaitError::Path {
        path: path.to_owned(),
        action: "stat",
        source: e.into(),
    })?;
    // The hint watch first, then the first probe: a release in between is then seen. A
    // watch that cannot be added (the per-user limit) only costs latency.
    let mut sub = watches.subscribe();
    let hinted = sub.add(path, HINT_MASK, 0).is_ok();
    let free = probe(&fd).map_err(|e| WaitError::Path {
        path: path.to_owned(),
        action: "flock",
        source: e,
    })?;
    let mut wait = FlockWait {
        captured: FlockCaptured {
            path: path.to_owned(),
            dev: st.st_dev,
            ino: st.st_ino,
            free,
            hinted,
        },
        fd: Some(fd),
        hint: hinted.then_some(sub),
        armed_at: Instant::now(),
    };
    if free {
        wait.release();
    }
    Ok(wait)
}

impl FlockWait {
    pub(crate) fn captured(&self) -> &FlockCaptured {
        &self.captured
    }

    pub(crate) fn ready(&self) -> Option<Fire> {
        self.captured.free.then(|| self.fire(true))
    }

    /// Closes the descriptor and the hint watch: nothing of this wait is left in the kernel.
    fn release(&mut self) {
        self.fd = None;
        self.hint = None;
    }

    fn fire(&self, already_free: bool) -> Fire {
        let c = &self.captured;
        let waited_ms = self.armed_at.elapsed().as_millis() as u64;
        let mut payload = json!({
            "kind": "flock",
            "path": c.path.to_string_lossy(),
            "waited_ms": if already_free { 0 } else { waited_ms },
            "already_free": already_free,
        });
        let same = fs::metadata(&c.path).is_ok_and(|m| m.dev() == c.dev && m.ino() == c.ino);
        if !same && let Value::Object(m) = &mut payload {
            m.insert(
                "note".into(),
                Value::String(
                    "the path now names another file (or none); the lock waited on was the one of the file it named when armed".into(),
                ),
            );
        }
        Fire {
            payload,
            cursor: None,
        }
    }

    pub(crate) async fn until_fired(&mut self) -> Result<Fire, WaitError> {
        if self.captured.free {
            return Ok(self.fire(true));
        }
        let mut backoff = PROBE_MIN;
        let mut next_probe = Instant::now() + backoff;
        loop {
            let hinted = async {
                match &self.hint {
                    Some(sub) => sub.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                d = hinted => {
                    if let Delivery::Failed(_) = d {
                        // Only a hint: the timer alone goes on probing.
                        self.hint = None;
                    }
                }
                () = tokio::time::sleep_until(next_probe) => {
                    backoff = (backoff * 2).min(PROBE_MAX);
                    next_probe = Instant::now() + backoff;
                }
            }
            let Some(fd) = &self.fd else {
                return Ok(self.fire(false));
            };
            let free = probe(fd).map_err(|e| WaitError::Path {
                path: self.captured.path.clone(),
                action: "flock",
                source: e,
            })?;
            if free {
                self.release();
                return Ok(self.fire(false));
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn holds_fd(&self) -> bool {
        self.fd.is_some()
    }
}
