//! Waiting for a line in a log: fires on the first complete line (ended by `\n`) appended
//! after the arm position that matches a regular expression; with a silence, also when the
//! file has not grown for that long, whichever comes first.
//!
//! Position: from a [`LogCursor`] (where an earlier wait left off: the same file reads on
//! from its offset, another file at the name or one cut shorter from 0), else from the
//! file's end at arm time; a file not there yet is read from 0 once it comes. A line begun
//! before the position and ended after it is matched whole (its first part is read back,
//! bounded). The arm-time position is the resume spec, so a re-arm after a restart neither
//! misses a line appended meanwhile nor reports one from before the arm.
//!
//! How it blocks: inotify only, no polling. The parent directory is watched for the name
//! (`IN_CREATE`, `IN_MOVED_TO`, `IN_MOVED_FROM`, `IN_DELETE`), and the file being read for
//! its own writes (`IN_MODIFY`, `IN_CLOSE_WRITE`, `IN_MOVE_SELF`), through the descriptor
//! held (`/proc/self/fd/N`), so the watch is on the very inode read even if the name moved
//! in between. Every event is only a hint: the wait then looks (one `stat` of the name, one
//! `fstat` of the file) and reads what is new, in chunks of at most 64 KiB, yielding to
//! the runtime between chunks, so a huge backlog never sits in memory or holds the thread.
//!
//! Rotation: another file at the name (rename, then a new file: logrotate's default) means
//! the old file is read to its end through the descriptor held, then the new one from 0. The
//! name gone with nothing in its place: the old file is still read (its writer may not have
//! reopened yet). Truncation (`copytruncate`): the file shorter than the offset read so far
//! is read again from 0. Limit: a file cut and written past the old offset between two looks
//! cannot be told from one that only grew.
//!
//! Silence: the time of the last growth seen (bytes read, a truncation, a new file) is
//! noted; one timer sleeps until that time plus the silence, and when it wakes the file is
//! read once more: nothing new, it fires. No periodic wake-up: an idle log wait costs nothing.
//!
//! It reads the file and creates nothing.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use cortex_protocol::mesh::LogCursor;
use inotify::WatchMask;
use rustix::io::Errno;
use serde_json::json;
use tokio::time::Instant;

use super::lines::{FileState, Hit, MAX_PARTIAL_BYTES, Scanner, Turn, start_offset, turn};
use super::watches::{Delivery, FileWatches, Subscription};
use super::{Cursor, DIR_GONE, Fire, WaitError, lost_dir, watch_error, watch_name};

/// The largest read at once.
const CHUNK_BYTES: usize = 64 * 1024;

/// Which watch an event came from.
const DIR: u32 = 0;
const FILE: u32 = 1;

const DIR_MASK: WatchMask = WatchMask::ONLYDIR
    .union(WatchMask::CREATE)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::DELETE)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::EXCL_UNLINK);

const FILE_MASK: WatchMask = WatchMask::MODIFY
    .union(WatchMask::CLOSE_WRITE)
    .union(WatchMask::MOVE_SELF);

/// What was found at arm time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogCaptured {
    pub path: PathBuf,
    pub pattern: String,
    pub exists: bool,
    /// The file's size when armed (0 when it was not there).
    pub size: u64,
    /// Where reading starts: the cursor's offset, the end, or 0.
    pub start: u64,
    /// The cursor it was armed with, if any.
    pub since: Option<LogCursor>,
    /// The file's own writes are watched (else only the directory: the name's changes).
    pub watching: bool,
    pub silence_ms: Option<u64>,
}

/// The file being read.
struct Open {
    file: File,
    dev: u64,
    ino: u64,
}

pub(crate) struct LogWait {
    captured: LogCaptured,
    name: OsString,
    sub: Subscription,
    /// The file read is watched itself.
    sub_has_file: bool,
    open: Option<Open>,
    scanner: Scanner,
    /// The arm-time position (the resume spec's cursor).
    resume: LogCursor,
    /// The first look (the backlog from the cursor) is done.
    started: bool,
    silence: Option<Duration>,
    /// The last growth seen (or the arm).
    last_growth: Instant,
}

impl std::fmt::Debug for LogWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogWait")
            .field("captured", &self.captured)
            .finish_non_exhaustive()
    }
}

fn state_of(m: &fs::Metadata) -> FileState {
    FileState {
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
    }
}

/// What the name leads to now (following links), `None` when nothing.
fn at_name(path: &Path) -> Result<Option<fs::Metadata>, WaitError> {
    match fs::metadata(path) {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if Errno::from_io_error(&e) == Some(Errno::NOTDIR) => Ok(None),
        Err(source) => Err(WaitError::Path {
            path: path.to_owned(),
            action: "look at",
            source,
        }),
    }
}

/// The instant `mtime` was, on the runtime's clock (never later than now).
pub(crate) fn instant_of(m: &fs::Metadata) -> Instant {
    let now = Instant::now();
    let age = m
        .modified()
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .unwrap_or_default();
    now.checked_sub(age).unwrap_or(now)
}

pub(crate) fn arm(
    watches: &FileWatches,
    path: &Path,
    pattern: &str,
    cursor: Option<LogCursor>,
    silence_ms: Option<u64>,
) -> Result<LogWait, WaitError> {
    let regex = cortex_protocol::waits::compile_pattern(pattern)
        .map_err(|e| WaitError::BadPattern(e.to_string()))?;
    // The directory's watch first: a file created after this is seen, one created before
    // is found by the open below.
    let (name, sub) = watch_name(watches, path, DIR_MASK, DIR)?;
    let mut wait = LogWait {
        captured: LogCaptured {
            path: path.to_owned(),
            pattern: pattern.to_string(),
            exists: false,
            size: 0,
            start: 0,
            since: cursor,
            watching: false,
            silence_ms,
        },
        name,
        sub,
        sub_has_file: false,
        open: None,
        scanner: Scanner::new(regex, 0),
        resume: LogCursor::default(),
        started: false,
        silence: silence_ms.map(Duration::from_millis),
        last_growth: Instant::now(),
    };
    let Some(meta) = wait.open_at_name()? else {
        return Ok(wait);
    };
    let now = state_of(&meta);
    let start = start_offset(cursor.as_ref(), &now);
    wait.captured.exists = true;
    wait.captured.size = now.size;
    wait.captured.start = start;
    wait.captured.watching = wait.open.is_some() && wait.watching_file();
    wait.resume = LogCursor {
        exists: true,
        dev: now.dev,
        ino: now.ino,
        offset: start,
    };
    if cursor.is_some() {
        // A re-arm: the silence counts from the file's last change, not from now.
        wait.last_growth = instant_of(&meta);
    }
    wait.begin_at(start)?;
    Ok(wait)
}

impl LogWait {
    pub(crate) fn captured(&self) -> &LogCaptured {
        &self.captured
    }

    pub(crate) fn resume_cursor(&self) -> LogCursor {
        self.resume
    }

    fn watching_file(&self) -> bool {
        self.sub_has_file
    }

    fn path(&self) -> &Path {
        &self.captured.path
    }

    fn io_err(&self, action: &'static str, source: io::Error) -> WaitError {
        WaitError::Path {
            path: self.captured.path.clone(),
            action,
            source,
        }
    }

    /// Opens the file at the name and watches it; `None` when there is none.
    fn open_at_name(&mut self) -> Result<Option<fs::Metadata>, WaitError> {
        let file = match fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc_flags())
            .open(self.path())
        {
            Ok(f) => f,
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    || Errno::from_io_error(&e) == Some(Errno::NOTDIR) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(self.io_err("open", e)),
        };
        let meta = file.metadata().map_err(|e| self.io_err("stat", e))?;
        if meta.is_dir() {
            return Err(WaitError::BadPath {
                path: self.captured.path.clone(),
                why: "is a directory; wait for a line in a file in it instead",
            });
        }
        if !meta.is_file() {
            return Err(WaitError::BadPath {
                path: self.captured.path.clone(),
                why: "is not a regular file (a log wait reads a file by offset)",
            });
        }
        // The watch on the inode opened, whatever the name leads to by now.
        self.sub.remove_key(FILE);
        let via_fd = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        if self.sub.add(&via_fd, FILE_MASK, FILE).is_err() {
            // Without /proc, by the name: the same inode unless it was replaced in between,
            // which the directory's watch reports, and the next look follows. A log whose
            // writes cannot be seen at all is no wait: it breaks, saying why.
            self.sub
                .add(self.captured.path.as_path(), FILE_MASK, FILE)
                .map_err(|e| watch_error(&self.captured.path, e))?;
        }
        self.sub_has_file = true;
        self.open = Some(Open {
            dev: meta.dev(),
            ino: meta.ino(),
            file,
        });
        Ok(Some(meta))
    }

    /// Sets the scanner at `start` in the open file, reading back the start of a line
    /// begun before it (at most [`MAX_PARTIAL_BYTES`]).
    fn begin_at(&mut self, start: u64) -> Result<(), WaitError> {
        self.scanner.restart(start);
        let Some(open) = &self.open else {
            return Ok(());
        };
        if start == 0 {
            return Ok(());
        }
        let back = start.min(MAX_PARTIAL_BYTES as u64);
        let mut buf = vec![0u8; back as usize];
        let n =
            read_full_at(&open.file, &mut buf, start - back).map_err(|e| self.io_err("read", e))?;
        buf.truncate(n);
        if n as u64 != back {
            // Cut shorter meanwhile: the next look sees it and starts over.
            return Ok(());
        }
        let head = match buf.iter().rposition(|&b| b == b'\n') {
            Some(i) => &buf[i + 1..],
            None => &buf[..],
        };
        if !head.is_empty() {
            self.scanner.resume_mid_line(start, head);
        }
        Ok(())
    }

    /// Until a line matches, or the silence passes.
    pub(crate) async fn until_fired(&mut self) -> Result<Fire, WaitError> {
        if !self.started {
            self.started = true;
            if let Some(hit) = self.look(false).await? {
                return Ok(self.fire_hit(hit));
            }
        }
        loop {
            let deadline = self.silence.map(|s| self.last_growth + s);
            let quiet = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                d = self.sub.next() => {
                    let mut wake = self.meaningful(d)?;
                    // A burst of writes is one look.
                    while let Some(d) = self.sub.try_next() {
                        wake |= self.meaningful(d)?;
                    }
                    if wake && let Some(hit) = self.look(true).await? {
                        return Ok(self.fire_hit(hit));
                    }
                }
                () = quiet => {
                    if let Some(hit) = self.look(true).await? {
                        return Ok(self.fire_hit(hit));
                    }
                    if let Some(s) = self.silence
                        && self.last_growth.elapsed() >= s
                    {
                        return self.fire_silent(s);
                    }
                }
            }
        }
    }

    /// Whether a delivery calls for a look; an error when the wait can no longer see.
    fn meaningful(&self, d: Delivery) -> Result<bool, WaitError> {
        match d {
            Delivery::Event { key, mask, name } => {
                if key != DIR {
                    return Ok(true);
                }
                if mask.intersects(DIR_GONE) {
                    return Err(lost_dir(self.captured.path.clone()));
                }
                Ok(name.as_deref() == Some(self.name.as_os_str()))
            }
            Delivery::Overflow => Ok(true),
            Delivery::Failed(why) => Err(WaitError::Inotify(why)),
        }
    }

    /// Looks at the name and the file read, and reads what is new. `growth`: what it
    /// finds counts as the file growing (not on the first look, which reads the backlog).
    async fn look(&mut self, growth: bool) -> Result<Option<Hit>, WaitError> {
        // At most one rotation per look (the old file finished, the new one read): a
        // second one is the next event's.
        for _ in 0..2 {
            let name_now = at_name(self.path())?;
            let Some(open) = &self.open else {
                if name_now.is_none() {
                    return Ok(None);
                }
                if self.open_at_name()?.is_none() {
                    return Ok(None);
                }
                // A file come under the name: all of it is new.
                self.scanner.restart(0);
                self.grew(growth);
                return self.read_on(growth).await;
            };
            let reading = state_of(&open.file.metadata().map_err(|e| self.io_err("stat", e))?);
            let named = name_now.as_ref().map(state_of);
            match turn(&reading, self.scanner.next_offset(), named.as_ref()) {
                Turn::ReadOn => {}
                Turn::Truncated => {
                    self.scanner.restart(0);
                    self.grew(growth);
                }
                Turn::Rotated => {
                    // What is left of the old file first, through the descriptor held.
                    if let Some(hit) = self.read_on(growth).await? {
                        return Ok(Some(hit));
                    }
                    self.open = None;
                    self.sub.remove_key(FILE);
                    self.sub_has_file = false;
                    continue;
                }
            }
            return self.read_on(growth).await;
        }
        Ok(None)
    }

    fn grew(&mut self, growth: bool) {
        if growth {
            self.last_growth = Instant::now();
        }
    }

    /// Reads the open file from the scanner's offset to its end.
    async fn read_on(&mut self, growth: bool) -> Result<Option<Hit>, WaitError> {
        let Some(open) = &self.open else {
            return Ok(None);
        };
        let size = open.file.metadata().map(|m| m.size()).unwrap_or(0);
        let left = size.saturating_sub(self.scanner.next_offset());
        // Sized to what is there: a one-line append costs a small buffer.
        let mut buf = vec![0u8; (left as usize).clamp(4096, CHUNK_BYTES)];
        let mut chunks = 0u32;
        loop {
            let Some(open) = &self.open else {
                return Ok(None);
            };
            let n = match open.file.read_at(&mut buf, self.scanner.next_offset()) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io_err("read", e)),
            };
            if n == 0 {
                return Ok(None);
            }
            self.grew(growth);
            if let Some(hit) = self.scanner.feed(&buf[..n]) {
                return Ok(Some(hit));
            }
            chunks += 1;
            if chunks.is_multiple_of(16) {
                // A megabyte read: let the other waits run.
                tokio::task::yield_now().await;
            }
        }
    }

    fn current_cursor(&self, offset: u64) -> LogCursor {
        match &self.open {
            Some(o) => LogCursor {
                exists: true,
                dev: o.dev,
                ino: o.ino,
                offset,
            },
            None => LogCursor::default(),
        }
    }

    fn fire_hit(&self, hit: Hit) -> Fire {
        let cursor = self.current_cursor(hit.end);
        Fire {
            payload: json!({
                "kind": "log",
                "reason": "match",
                "path": self.captured.path.to_string_lossy(),
                "match": self.captured.pattern,
                "line": hit.line,
                "before": hit.before,
                "offset": hit.offset,
                "cursor": cursor,
            }),
            cursor: Some(Cursor::Log(cursor)),
        }
    }

    fn fire_silent(&self, silence: Duration) -> Result<Fire, WaitError> {
        let size = at_name(self.path())?.map(|m| m.size());
        // From the start of the unfinished line: a re-arm reads it whole.
        let cursor = self.current_cursor(self.scanner.line_start());
        Ok(Fire {
            payload: json!({
                "kind": "log",
                "reason": "silent",
                "event": "silent",
                "path": self.captured.path.to_string_lossy(),
                "silent_ms": ms(self.last_growth.elapsed()),
                "silence_ms": ms(silence),
                "exists": size.is_some(),
                "size": size.unwrap_or(0),
                "cursor": cursor,
            }),
            cursor: Some(Cursor::Log(cursor)),
        })
    }
}

pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Opened for reading only: no controlling terminal, never blocking on a FIFO.
fn libc_flags() -> i32 {
    (rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::NONBLOCK).bits() as i32
}

/// `read_at` until `buf` is full or the file ends; the bytes read.
fn read_full_at(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], at + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
