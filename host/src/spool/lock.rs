//! One collector per spool: whoever collects a spool (the hub, or a device agent) holds an
//! exclusive `flock` on [`LOCK_FILE`] inside it for its whole life, and writes who it is
//! into that file, so a second collector can refuse to start and name the first.
//!
//! Two collectors on one spool would each forward every file, and a file without a `key`
//! would then be counted twice (once per way in). The lock is a dotfile, so no collector
//! ever takes it for a signal, and it is opened through the spool's directory handle with
//! `O_NOFOLLOW`. A filesystem without locks (`ENOLCK`, `EOPNOTSUPP`) is collected without
//! one, with a warning: refusing to run there would stop every signal.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{FileType, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use super::SpoolError;

/// The lock file inside the spool.
pub const LOCK_FILE: &str = ".collector.lock";

/// How much of the lock file is read to name its holder.
const MAX_HOLDER_BYTES: usize = 1024;

/// Who collects a spool, as the lock file names it to a second collector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collector {
    /// The program (`cortex-hub`, `cortex-device-agent`).
    pub program: String,
    /// The device agent's device name.
    pub device: Option<String>,
}

impl Collector {
    pub fn new(program: &str, device: Option<&str>) -> Collector {
        Collector {
            program: program.to_owned(),
            device: device.map(str::to_owned),
        }
    }

    /// `PROGRAM pid PID on host HOST [(device NAME)] since TIME`: this process, now.
    pub(super) fn holder_line(&self) -> String {
        let host = crate::hostname().unwrap_or_else(|| "(unknown)".to_owned());
        let device = self
            .device
            .as_ref()
            .map(|d| format!(" (device {d})"))
            .unwrap_or_default();
        let since = time::OffsetDateTime::now_utc()
            .replace_nanosecond(0)
            .ok()
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_else(|| "(unknown time)".to_owned());
        format!(
            "{} pid {} on host {host}{device} since {since}",
            self.program,
            std::process::id()
        )
    }
}

/// Take the lock in the spool directory `dir` (shown as `path`) and write `line` into it.
/// `Ok(None)`: the filesystem has no locks; collect without one.
pub(super) fn take(dir: &OwnedFd, path: &Path, line: &str) -> Result<Option<OwnedFd>, SpoolError> {
    let io_err = |action, e: Errno| SpoolError::Io {
        action,
        path: path.join(LOCK_FILE),
        source: e.into(),
    };
    let fd = rustix::fs::openat(
        dir,
        LOCK_FILE,
        OFlags::RDWR
            | OFlags::CREATE
            | OFlags::NOFOLLOW
            | OFlags::NONBLOCK
            | OFlags::NOCTTY
            | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| io_err("open the collector lock", e))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| io_err("inspect the collector lock", e))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(io_err(
            "use the collector lock (not a regular file)",
            Errno::INVAL,
        ));
    }
    match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(Errno::WOULDBLOCK) => {
            return Err(SpoolError::Held {
                path: path.to_owned(),
                holder: holder(&fd),
            });
        }
        Err(e @ (Errno::NOLCK | Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL)) => {
            tracing::warn!(
                spool = %path.display(),
                error = %e,
                "this filesystem cannot lock the spool; a second collector on it would not be refused"
            );
            return Ok(None);
        }
        Err(e) => return Err(io_err("lock the collector lock", e)),
    }
    let text = format!("{line}\n");
    rustix::fs::ftruncate(&fd, 0).map_err(|e| io_err("write the collector lock", e))?;
    let mut at = 0;
    while at < text.len() {
        let n = rustix::io::pwrite(&fd, &text.as_bytes()[at..], at as u64)
            .map_err(|e| io_err("write the collector lock", e))?;
        if n == 0 {
            return Err(io_err("write the collector lock", Errno::IO));
        }
        at += n;
    }
    Ok(Some(fd))
}

/// Whether the lock file in `dir` is still the file `fd` locks: someone may have removed
/// or replaced it, and a new collector would then lock the new one.
pub(super) fn intact(dir: &OwnedFd, fd: &OwnedFd) -> bool {
    let (Ok(named), Ok(held)) = (
        rustix::fs::statat(dir, LOCK_FILE, rustix::fs::AtFlags::SYMLINK_NOFOLLOW),
        rustix::fs::fstat(fd),
    ) else {
        return false;
    };
    named.st_dev == held.st_dev && named.st_ino == held.st_ino
}

/// The holder's line, as it wrote it: one line of printable text. A holder that has just
/// locked may not have written it yet, so an empty file is read again for a moment.
fn holder(fd: &impl AsFd) -> String {
    for _ in 0..10 {
        let mut buf = vec![0u8; MAX_HOLDER_BYTES];
        let n = rustix::io::pread(fd, &mut buf, 0).unwrap_or(0);
        let text = String::from_utf8_lossy(&buf[..n]);
        let line: String = text
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        let line = line.trim();
        if !line.is_empty() {
            return line.to_owned();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    "another process (it has not written its name into the lock yet)".to_owned()
}
