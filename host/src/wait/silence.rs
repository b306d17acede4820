//! Waiting for a file to go quiet: a file wait with a silence fires when the file at the
//! name has not grown for that long (a writer stopped or hung), and a write is no event.
//!
//! Growth: the name leading to a file whose identity or size differs from the last seen
//! (it grew, was cut shorter, or was replaced). A missing file does not grow; a file that
//! goes away is no growth either.
//!
//! Cost: nothing while idle. The parent directory is watched for the name (created, moved
//! in or out, deleted) and the file under it for its writes (`IN_MODIFY`: on the file's own
//! watch, so writes to other files in the directory wake nobody here; moved to the new
//! file when the name changes); an event only notes its time. One timer sleeps until the
//! last growth plus the silence; when it wakes the file is looked at (one `stat`): grown
//! since, the clock restarts from the last event's time and the timer sleeps again;
//! unchanged, it fires. No periodic wake-up.
//!
//! The clock starts at the arm, or, armed with a cursor (a re-arm after a restart), at the
//! file's modification time, so the time the wait was down counts.
//!
//! It reads no file contents and creates nothing.

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use cortex_protocol::mesh::FileCursor;
use inotify::WatchMask;
use serde_json::json;
use tokio::time::Instant;

use super::file::{FileCaptured, Watched, read_cursor, watch_file};
use super::log::{instant_of, ms};
use super::watches::{Delivery, FileWatches, Subscription};
use super::{Cursor, DIR_GONE, Fire, WaitError, lost_dir};

/// Which watch an event came from.
const DIR: u32 = 0;
const FILE: u32 = 1;

const FILE_MASK: WatchMask = WatchMask::MODIFY;

const DIR_MASK: WatchMask = WatchMask::ONLYDIR
    .union(WatchMask::CREATE)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::DELETE)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::EXCL_UNLINK);

/// Did the file grow (or get cut, or replaced) from `old` to `new`? Its going away is not
/// growth, nor is a change of its times alone.
pub fn grew(old: &FileCursor, new: &FileCursor) -> bool {
    new.exists && (old.exists, old.dev, old.ino, old.size) != (true, new.dev, new.ino, new.size)
}

pub(crate) struct SilenceWait {
    captured: FileCaptured,
    name: OsString,
    sub: Subscription,
    silence: Duration,
    /// The file as last seen.
    seen: FileCursor,
    last_growth: Instant,
    /// The latest event about the name, since the last look.
    last_event: Option<Instant>,
}

impl std::fmt::Debug for SilenceWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SilenceWait")
            .field("captured", &self.captured)
            .finish_non_exhaustive()
    }
}

pub(crate) fn arm(
    watches: &FileWatches,
    path: &Path,
    cursor: Option<FileCursor>,
    silence_ms: u64,
) -> Result<SilenceWait, WaitError> {
    let Watched {
        name,
        sub,
        meta,
        watching_file,
        now,
    } = watch_file(watches, path, (DIR_MASK, DIR), (FILE_MASK, FILE))?;
    let last_growth = match (&cursor, &meta) {
        (Some(_), Some(m)) => instant_of(m),
        _ => Instant::now(),
    };
    Ok(SilenceWait {
        captured: FileCaptured {
            path: path.to_owned(),
            now,
            since: cursor,
            watching_file,
            silence_ms: Some(silence_ms),
        },
        name,
        sub,
        silence: Duration::from_millis(silence_ms),
        seen: now,
        last_growth,
        last_event: None,
    })
}

impl SilenceWait {
    pub(crate) fn captured(&self) -> &FileCaptured {
        &self.captured
    }

    pub(crate) fn resume_cursor(&self) -> FileCursor {
        self.captured.since.unwrap_or(self.captured.now)
    }

    pub(crate) async fn until_fired(&mut self) -> Result<Fire, WaitError> {
        loop {
            let deadline = self.last_growth + self.silence;
            tokio::select! {
                biased;
                d = self.sub.next() => self.note(d)?,
                () = tokio::time::sleep_until(deadline) => {
                    let now = read_cursor(&self.captured.path).map_err(|source| WaitError::Path {
                        path: self.captured.path.clone(),
                        action: "look at",
                        source,
                    })?;
                    if grew(&self.seen, &now) {
                        // It grew since the last look, at the latest event's time (or now,
                        // if no event said so).
                        self.last_growth = self
                            .last_event
                            .filter(|t| *t > self.last_growth)
                            .unwrap_or_else(Instant::now);
                        self.seen = now;
                        self.last_event = None;
                        continue;
                    }
                    self.seen = now;
                    return Ok(self.fire());
                }
            }
        }
    }

    fn note(&mut self, d: Delivery) -> Result<(), WaitError> {
        match d {
            Delivery::Event { key, mask, name } => {
                if key == FILE {
                    self.last_event = Some(Instant::now());
                    return Ok(());
                }
                if mask.intersects(DIR_GONE) {
                    return Err(lost_dir(self.captured.path.clone()));
                }
                if name.as_deref() == Some(self.name.as_os_str()) {
                    self.last_event = Some(Instant::now());
                    // Another file under the name (or none): watch what is there now. A
                    // file that cannot be watched still has its size looked at.
                    self.sub.remove_key(FILE);
                    self.captured.watching_file =
                        self.sub.add(&self.captured.path, FILE_MASK, FILE).is_ok();
                }
                Ok(())
            }
            Delivery::Overflow => {
                self.last_event = Some(Instant::now());
                Ok(())
            }
            Delivery::Failed(why) => Err(WaitError::Inotify(why)),
        }
    }

    fn fire(&self) -> Fire {
        let c = self.seen;
        Fire {
            payload: json!({
                "kind": "file",
                "reason": "silent",
                "event": "silent",
                "path": self.captured.path.to_string_lossy(),
                "silent_ms": ms(self.last_growth.elapsed()),
                "silence_ms": ms(self.silence),
                "exists": c.exists,
                "size": c.size,
                "cursor": c,
            }),
            cursor: Some(Cursor::File(c)),
        }
    }
}
