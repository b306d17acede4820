//! Waiting for a file to be written: fires on the next close of the file after writing
//! (`IN_CLOSE_WRITE`), on a file moved into place under its name (`IN_MOVED_TO`, the
//! atomic-replace pattern), or on its creation when nobody is left writing it (a link, a
//! FIFO); never on an open for reading (`IN_CLOSE_NOWRITE`) or on a bare `IN_CREATE` of a
//! regular file, which is still empty then (its close after writing comes next).
//!
//! Two watches, both added *before* the file is looked at, so a write between the two can
//! never fall through:
//! - the parent directory, for events about the file's name: creation, a move into place,
//!   a close after writing. It follows the *name*, which is what a path means: a file
//!   replaced by `rename(2)` is a new inode that a watch on the old one would never see.
//! - the file itself, when it exists, for writes through another name (a hard link).
//!
//! A cursor ([`FileCursor`]: device, inode, size, mtime), persisted by the caller:
//! armed with one, the wait fires at once if the file changed since (so a write made while
//! no wait was armed is not missed), and otherwise waits; the payload carries the cursor as
//! of the fire, for the caller to store. Limit: two writes of the same size within one tick
//! of the kernel's file clock (a few ms) look alike to a cursor; a live wait still sees both.
//!
//! The parent directory moved, deleted or unmounted breaks the wait (exit 2): its name
//! no longer leads where the watch looks. The file deleted is not a write: the wait goes on,
//! and fires when it is written again.
//!
//! It reads no file contents and creates nothing.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use cortex_protocol::mesh::FileCursor;
use inotify::{EventMask, WatchMask};
use serde_json::{Value, json};

use super::watches::{Delivery, FileWatches, Subscription};
use super::{Cursor, DIR_GONE, Fire, WaitError, lost_dir, watch_name};

/// The cursor of a file from its metadata (`fstat`/`stat`): device, inode, size, mtime.
pub fn cursor_of(meta: &fs::Metadata) -> FileCursor {
    FileCursor {
        exists: true,
        dev: meta.dev(),
        ino: meta.ino(),
        size: meta.size(),
        mtime_ns: meta
            .mtime()
            .saturating_mul(1_000_000_000)
            .saturating_add(meta.mtime_nsec()),
    }
}

/// The cursor of the file at `path` now (following links), or [`FileCursor::absent`].
pub fn read_cursor(path: &Path) -> io::Result<FileCursor> {
    match fs::metadata(path) {
        Ok(m) => Ok(cursor_of(&m)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(FileCursor::absent()),
        Err(e) => Err(e),
    }
}

/// What was found at arm time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileCaptured {
    pub path: PathBuf,
    /// The file as it was when the watches were in place.
    pub now: FileCursor,
    /// The cursor it was armed with, if any.
    pub since: Option<FileCursor>,
    /// Whether the file itself is watched too (it existed and could be watched).
    pub watching_file: bool,
    /// A silence wait's bound: it fires when the file has not grown for this long.
    pub silence_ms: Option<u64>,
}

/// Which watch an event came from.
const PARENT: u32 = 0;
const FILE: u32 = 1;

const PARENT_MASK: WatchMask = WatchMask::ONLYDIR
    .union(WatchMask::CREATE)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::CLOSE_WRITE)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::EXCL_UNLINK);

/// Follows links: `wait file LINK` is about the file the link leads to.
const FILE_MASK: WatchMask = WatchMask::CLOSE_WRITE;

/// What an event means for the wait. Pure, so the mapping is a table test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Ignore,
    /// Fire, with this event name in the payload.
    Fire(&'static str),
    /// The name was created: fire only if nobody is left writing it (see [`created_fires`]).
    Created,
    /// The parent directory's watch is gone: the wait can no longer see the name.
    ParentGone,
}

pub(crate) fn classify(key: u32, mask: EventMask, name: Option<&OsStr>, ours: &OsStr) -> Action {
    if key == PARENT {
        if mask.intersects(DIR_GONE) {
            return Action::ParentGone;
        }
        if name != Some(ours) || mask.contains(EventMask::ISDIR) {
            return Action::Ignore;
        }
        if mask.contains(EventMask::CLOSE_WRITE) {
            return Action::Fire("close_write");
        }
        if mask.contains(EventMask::MOVED_TO) {
            return Action::Fire("moved_to");
        }
        if mask.contains(EventMask::CREATE) {
            return Action::Created;
        }
        return Action::Ignore;
    }
    // The file's own watch: only a close after writing. Its IN_IGNORED (deleted) is fine,
    // the parent's watch still covers the name.
    if mask.contains(EventMask::CLOSE_WRITE) {
        return Action::Fire("close_write");
    }
    Action::Ignore
}

/// On `IN_CREATE` of the name: a regular file with one link was just created by someone
/// who has it open for writing, and its `IN_CLOSE_WRITE` follows; anything else (a hard
/// link to an existing file, a symbolic link, a FIFO) will get no close, so it fires now.
pub(crate) fn created_fires(meta: Option<&fs::Metadata>) -> bool {
    match meta {
        Some(m) => !(m.file_type().is_file() && m.nlink() == 1),
        // Gone already: nothing to wait for on this name yet.
        None => false,
    }
}

pub(crate) struct FileWait {
    captured: FileCaptured,
    name: OsString,
    sub: Subscription,
    /// Fired at arm time (the cursor said the file changed).
    ready: Option<Fire>,
}

impl std::fmt::Debug for FileWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWait")
            .field("captured", &self.captured)
            .finish_non_exhaustive()
    }
}

pub(crate) fn arm(
    watches: &FileWatches,
    path: &Path,
    cursor: Option<FileCursor>,
) -> Result<FileWait, WaitError> {
    let Watched {
        name,
        sub,
        watching_file,
        now,
        ..
    } = watch_file(watches, path, (PARENT_MASK, PARENT), (FILE_MASK, FILE))?;
    let ready = cursor.filter(|since| now.changed_since(since)).map(|_| {
        fire(
            path,
            "changed",
            now,
            Some("the file changed since the cursor (while no wait was armed)"),
        )
    });
    Ok(FileWait {
        captured: FileCaptured {
            path: path.to_owned(),
            now,
            since: cursor,
            watching_file,
            silence_ms: None,
        },
        name,
        sub,
        ready,
    })
}

/// A file a wait follows the content of, its watches in place and looked at once.
pub(crate) struct Watched {
    pub name: OsString,
    pub sub: Subscription,
    /// The file as found (`None`: not there yet).
    pub meta: Option<fs::Metadata>,
    /// The file's own watch is set (besides its directory's).
    pub watching_file: bool,
    /// The look, taken once both watches are in place.
    pub now: FileCursor,
}

/// The arm-time work of a wait on a file's content (a file or a silence wait): the name's
/// directory watch (`dir`: its mask and key), a directory at `path` refused, the file's own
/// watch (`file`), then one look. The file's watch comes after the directory's, so a file
/// created in between is seen by the directory's; it is a bonus (writes through other
/// names): without read access to the file, or if it vanished in between, the directory's
/// watch still covers the name.
pub(crate) fn watch_file(
    watches: &FileWatches,
    path: &Path,
    dir: (WatchMask, u32),
    file: (WatchMask, u32),
) -> Result<Watched, WaitError> {
    let (name, mut sub) = watch_name(watches, path, dir.0, dir.1)?;
    let look_err = |source: io::Error| WaitError::Path {
        path: path.to_owned(),
        action: "look at",
        source,
    };
    let meta = match fs::metadata(path) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(look_err(e)),
    };
    if meta.as_ref().is_some_and(fs::Metadata::is_dir) {
        return Err(WaitError::BadPath {
            path: path.to_owned(),
            why: "is a directory; wait for a file in it instead",
        });
    }
    let watching_file = meta.is_some() && sub.add(path, file.0, file.1).is_ok();
    let now = read_cursor(path).map_err(look_err)?;
    Ok(Watched {
        name,
        sub,
        meta,
        watching_file,
        now,
    })
}

fn fire(path: &Path, event: &str, cursor: FileCursor, note: Option<&str>) -> Fire {
    let mut payload = json!({
        "kind": "file",
        "path": path.to_string_lossy(),
        "event": event,
        "cursor": cursor,
    });
    if let (Some(note), Value::Object(m)) = (note, &mut payload) {
        m.insert("note".into(), Value::String(note.to_string()));
    }
    Fire {
        payload,
        cursor: Some(Cursor::File(cursor)),
    }
}

impl FileWait {
    pub(crate) fn captured(&self) -> &FileCaptured {
        &self.captured
    }

    pub(crate) fn ready(&self) -> Option<Fire> {
        self.ready.clone()
    }

    /// The cursor to re-arm from if this wait is lost: the one it was armed with, else the
    /// file as it was at arm time.
    pub(crate) fn resume_cursor(&self) -> FileCursor {
        self.captured.since.unwrap_or(self.captured.now)
    }

    pub(crate) async fn until_fired(&mut self) -> Result<Fire, WaitError> {
        if let Some(f) = &self.ready {
            return Ok(f.clone());
        }
        let path = self.captured.path.clone();
        let base = self.resume_cursor();
        loop {
            let event = match self.sub.next().await {
                Delivery::Event { key, mask, name } => {
                    match classify(key, mask, name.as_deref(), &self.name) {
                        Action::Ignore => None,
                        Action::Fire(ev) => Some((ev, None)),
                        Action::Created => {
                            let meta = fs::symlink_metadata(&path).ok();
                            created_fires(meta.as_ref()).then_some(("created", None))
                        }
                        Action::ParentGone => return Err(lost_dir(path)),
                    }
                }
                // Events were lost: compare with where the wait started.
                Delivery::Overflow => {
                    let now = self.look(&path)?;
                    now.changed_since(&base).then_some((
                        "changed",
                        Some("inotify lost events; the file differs from when the wait was armed"),
                    ))
                }
                Delivery::Failed(why) => return Err(WaitError::Inotify(why)),
            };
            if let Some((ev, note)) = event {
                let now = self.look(&path)?;
                return Ok(fire(&path, ev, now, note));
            }
        }
    }

    fn look(&self, path: &Path) -> Result<FileCursor, WaitError> {
        read_cursor(path).map_err(|source| WaitError::Path {
            path: path.to_owned(),
            action: "look at",
            source,
        })
    }
}
