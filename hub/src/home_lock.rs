//! One hub per home: a hub holds an exclusive `flock` on `$CORTEX_HOME/hub/lock` for its
//! whole life, with its pid written in it, taken before it binds or prints anything. A
//! second hub on the same home stops at once and names the first, instead of printing
//! its start line and failing on the store's own lock.
//!
//! The lock is the open file's: it goes with the process, however it ends, so a stale
//! file never blocks a start. On a filesystem without locks the hub starts without one,
//! with a warning (refusing would stop every signal there).

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

/// The lock file, under the home's `hub/` directory.
pub const LOCK_FILE: &str = "lock";

/// Held for the hub's life; dropping it releases the home.
#[derive(Debug)]
pub struct HomeLock {
    _fd: Option<OwnedFd>,
}

#[derive(Debug, thiserror::Error)]
pub enum HomeLockError {
    #[error(
        "another cortex-hub (pid {pid}) is using this home ({home}); stop it or use another --home/CORTEX_HOME"
    )]
    Held { pid: String, home: PathBuf },
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl HomeLock {
    /// Takes the lock of `home` (creating `home/hub/`, private, if needed) and writes
    /// this process's pid into it; [`HomeLockError::Held`], naming the holder's pid,
    /// while another process holds it.
    pub fn take(home: &Path) -> Result<HomeLock, HomeLockError> {
        let dir = home.join("hub");
        let path = dir.join(LOCK_FILE);
        let io = |action, path: &Path| {
            let path = path.to_path_buf();
            move |source: std::io::Error| HomeLockError::Io {
                action,
                path,
                source,
            }
        };
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(io("create", &dir))?;
        }
        let errno = |action| io(action, &path);
        let fd = rustix::fs::open(
            &path,
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| errno("open")(e.into()))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| errno("inspect")(e.into()))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(errno("use (not a regular file)")(Errno::INVAL.into()));
        }
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => {
                return Err(HomeLockError::Held {
                    pid: holder(&fd),
                    home: home.to_path_buf(),
                });
            }
            Err(e @ (Errno::NOLCK | Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL)) => {
                tracing::warn!(
                    lock = %path.display(),
                    error = %e,
                    "this filesystem cannot lock the hub's home; a second hub on it would not be refused"
                );
                return Ok(HomeLock { _fd: None });
            }
            Err(e) => return Err(errno("lock")(e.into())),
        }
        let text = format!("{}\n", std::process::id());
        rustix::fs::ftruncate(&fd, 0).map_err(|e| errno("write")(e.into()))?;
        let mut at = 0;
        while at < text.len() {
            let n = rustix::io::pwrite(&fd, &text.as_bytes()[at..], at as u64)
                .map_err(|e| errno("write")(e.into()))?;
            if n == 0 {
                return Err(errno("write")(Errno::IO.into()));
            }
            at += n;
        }
        Ok(HomeLock { _fd: Some(fd) })
    }
}

/// The holder's pid as it wrote it. A holder that has just locked may not have written
/// it yet, so an empty file is read again for a moment.
fn holder(fd: &OwnedFd) -> String {
    for _ in 0..10 {
        let mut buf = [0u8; 32];
        let n = rustix::io::pread(fd, &mut buf, 0).unwrap_or(0);
        let pid: String = String::from_utf8_lossy(&buf[..n])
            .trim()
            .chars()
            .filter(char::is_ascii_digit)
            .collect();
        if !pid.is_empty() {
            return pid;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    "unknown".to_owned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_second_lock_on_one_home_names_the_first_holder() {
        let home = tempfile::tempdir().unwrap();
        let first = HomeLock::take(home.path()).unwrap();
        // flock is per open file: a second open in this process is refused like another
        // process would be.
        match HomeLock::take(home.path()) {
            Err(HomeLockError::Held { pid, home: h }) => {
                assert_eq!(pid, std::process::id().to_string());
                assert_eq!(h, home.path());
            }
            other => panic!("expected Held, got {other:?}"),
        }
        drop(first);
        HomeLock::take(home.path()).unwrap();
    }
}
