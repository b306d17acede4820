//! The signal spool: a directory other processes drop `<name>.json` signal files into
//! (a job writes `$f.tmp`, then renames it into place:
//! `printf … > "$f.tmp" && mv "$f.tmp" "$f.json"`).
//!
//! This module owns the directory's safety: it opens the spool once, keeps directory handles
//! (`O_DIRECTORY | O_NOFOLLOW`) for it and for `bad/`, and does every file operation relative
//! to those handles (`openat`, `renameat2`, `unlinkat`), never through a joined path, so a
//! swapped parent or a planted link cannot redirect it.
//!
//! What it must not do:
//! - follow a link: spool entries are opened with `O_NOFOLLOW`; a refused link is parked by
//!   renaming the link itself, and its target is never opened or touched;
//! - block on a strange entry: FIFOs and devices are refused before opening, and the open uses
//!   `O_NONBLOCK` in case one is swapped in between;
//! - delete anything on its own: a file leaves the spool only through [`Spool::remove`] (the
//!   caller says the signal was acknowledged) or [`Spool::park`] (the caller refused it);
//! - read more than [`MAX_BODY_BYTES`] + 1 bytes of any file, even one growing while read;
//! - be collected twice: a collector calls [`Spool::claim`] and holds the spool's
//!   [`LOCK_FILE`] for its life (the `lock` module); a second one is refused, naming the first.
//!   When the directory is recreated, [`Spool::reopen`] takes the lock on the new one; if
//!   another process got it first, the spool is lost ([`SpoolError::LockLost`]) and
//!   [`Spool::list`] refuses from then on;
//! - park a file that is still being written: a file that does not parse is parked only
//!   when [`Spool::settled`] says it stopped changing (see there).
//!
//! Every entry of the spool is, by its name:
//! - `NAME.json`, a regular file: a signal file ([`Spool::list`] returns it). Entries of other
//!   kinds with such a name (links, FIFOs, devices) are returned too, refused by
//!   [`Spool::read`] and parked by the caller; a directory named `NAME.json` is parked by
//!   [`Spool::list`] itself;
//! - a dotfile (the collector lock, `.reason` temporaries) or a `NAME.tmp`: a writer's
//!   temporary, never touched nor reported;
//! - a name that is not UTF-8: parked by [`Spool::list`], under a lossless escape of its
//!   bytes (`\xNN` for each byte that is not UTF-8, `\\` for a backslash);
//! - `bad/`: the parked entries;
//! - anything else (no `.json`): not a signal, left alone and logged once per name for the
//!   life of the process.
//!
//! Callers must treat handling one name twice as harmless: a name can arrive both in a
//! [`SpoolEvent::Rescan`] listing and as a [`SpoolEvent::File`] event, and a crash between
//! forwarding and [`Spool::remove`] sends it again after restart. The hub de-duplicates by
//! name; [`InFlight`] keeps a caller from forwarding a name again while it awaits the ack.
//!
//! The operations here are short blocking syscalls on a local directory; call them from
//! `spawn_blocking` if the spool may sit on a slow network filesystem.

mod dir;
mod error;
mod lock;
mod names;
mod watch;
mod writers;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

pub use error::{Refusal, SpoolError};
pub use lock::{Collector, LOCK_FILE};
pub use names::{escape_name, is_candidate};
pub use watch::{RescanReason, SpoolEvent, SpoolWatcher};

use dir::{Handles, for_each_entry, is_directory, normalize, open_and_read, open_handles};
use names::{Odd, check_name, cut_name, file_kind, is_temporary};

/// The subdirectory of the spool where refused files are parked with a `.reason` beside them.
pub const BAD_DIR: &str = "bad";

/// Only these names are signal files; everything else (`.tmp`, dotfiles) is a writer's business.
const CANDIDATE_SUFFIX: &str = ".json";

/// A `.reason` file sits beside each parked file in `bad/`.
const REASON_SUFFIX: &str = ".reason";

/// How many `.<n>` suffixes `park` tries before giving up; far more than any real collision.
const MAX_PARK_SUFFIX: u32 = 10_000;

/// Odd names remembered as already logged; past this many, new ones are logged no more.
const MAX_ODD_NAMES: usize = 4096;

/// A parked name longer than this (escaped bytes of a name that is not UTF-8) is cut; the
/// `.reason` holds the whole escaped name. Room is left for `.N` and `.reason`.
const MAX_PARKED_NAME: usize = 200;

/// How many files wait in the spool and how many were parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpoolTally {
    /// Candidate names ([`Spool::list`]).
    pub pending: usize,
    /// Parked entries in `bad/`, not counting their `.reason` files.
    pub bad: usize,
}

/// The open spool directory. Share it as `Arc<Spool>` between the reader and a
/// [`SpoolWatcher`]: when the directory is deleted or moved, the watcher recreates it and
/// swaps the handles inside, and every later call uses the new ones.
#[derive(Debug)]
pub struct Spool {
    /// Absolute, without a trailing slash (which would make the kernel follow a final link).
    path: PathBuf,
    handles: RwLock<Arc<Handles>>,
    /// The collector lock, once [`Spool::claim`] took it.
    claim: Mutex<Option<Claim>>,
    /// The last look at each file that did not parse: [`Spool::settled`].
    looks: Mutex<HashMap<String, Look>>,
    /// Odd names already logged ([`Spool::list`]): each is logged once per process.
    odd_logged: Mutex<HashSet<Vec<u8>>>,
}

#[derive(Debug)]
struct Claim {
    /// What the lock file says about us.
    line: String,
    /// The lock, on the directory `dir`; `None` on a filesystem without locks, or once lost.
    fd: Option<OwnedFd>,
    dir: (u64, u64),
    /// Who took the spool from us when it was recreated.
    lost: Option<String>,
}

/// What a look at a file sees change while it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Look {
    dev: u64,
    ino: u64,
    size: i64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Look {
    fn of(st: &rustix::fs::Stat) -> Look {
        Look {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size,
            mtime: (st.st_mtime, st.st_mtime_nsec as i64),
            ctime: (st.st_ctime, st.st_ctime_nsec as i64),
        }
    }

    fn age(&self) -> std::time::Duration {
        let written = std::time::UNIX_EPOCH
            + std::time::Duration::new(
                self.mtime.0.max(0) as u64,
                self.mtime.1.clamp(0, 999_999_999) as u32,
            );
        written.elapsed().unwrap_or_default()
    }
}

impl Spool {
    /// Open (creating with mode 0700 if missing, parents included) the spool at `dir` and its
    /// `bad/`. Refuses a spool or `bad/` that is a symlink, not a directory, or writable by
    /// group or others.
    pub fn open(dir: &Path) -> Result<Spool, SpoolError> {
        let path = normalize(dir)?;
        let handles = open_handles(&path)?;
        Ok(Spool {
            path,
            handles: RwLock::new(Arc::new(handles)),
            claim: Mutex::new(None),
            looks: Mutex::new(HashMap::new()),
            odd_logged: Mutex::new(HashSet::new()),
        })
    }

    /// Become the spool's one collector: take its [`LOCK_FILE`] (exclusive, not waiting)
    /// and write `who` into it, for as long as this `Spool` lives. Refused with
    /// [`SpoolError::Held`], naming the holder, while another process holds it. Claiming
    /// twice is harmless.
    pub fn claim(&self, who: &Collector) -> Result<(), SpoolError> {
        let mut claim = lock_or_inner(&self.claim);
        if claim.is_some() {
            return Ok(());
        }
        let h = self.handles();
        let line = who.holder_line();
        let fd = lock::take(&h.dir, &self.path, &line)?;
        *claim = Some(Claim {
            line,
            fd,
            dir: (h.dev, h.ino),
            lost: None,
        });
        Ok(())
    }

    /// Whether this process may collect the spool: not claimed (a plain reader), or claimed
    /// and still held. Once lost, it is lost for good.
    fn check_collecting(&self) -> Result<(), SpoolError> {
        match lock_or_inner(&self.claim)
            .as_ref()
            .and_then(|c| c.lost.clone())
        {
            Some(holder) => Err(SpoolError::LockLost {
                path: self.path.clone(),
                holder,
            }),
            None => Ok(()),
        }
    }

    /// Take the lock again on the directory in `h` when it is not the one locked (the
    /// spool was recreated), or when the lock file was removed or replaced under us.
    /// Marks the spool lost, and says so, when another process holds it now.
    fn relock(&self, h: &Handles) -> Result<(), SpoolError> {
        let mut guard = lock_or_inner(&self.claim);
        let Some(claim) = guard.as_mut() else {
            return Ok(());
        };
        if let Some(holder) = &claim.lost {
            return Err(SpoolError::LockLost {
                path: self.path.clone(),
                holder: holder.clone(),
            });
        }
        let same_dir = claim.dir == (h.dev, h.ino);
        match &claim.fd {
            Some(fd) if same_dir && lock::intact(&h.dir, fd) => return Ok(()),
            // No locks on this filesystem: nothing to keep.
            None if same_dir => return Ok(()),
            _ => {}
        }
        // Let go of the old lock first: on the same directory, a second open file
        // description of ours would conflict with it.
        claim.fd = None;
        match lock::take(&h.dir, &self.path, &claim.line) {
            Ok(fd) => {
                claim.fd = fd;
                claim.dir = (h.dev, h.ino);
                Ok(())
            }
            Err(SpoolError::Held { holder, .. }) => {
                tracing::error!(
                    spool = %self.path.display(),
                    holder = %holder,
                    "another process took the spool's collector lock; this one stops collecting it"
                );
                claim.lost = Some(holder.clone());
                Err(SpoolError::LockLost {
                    path: self.path.clone(),
                    holder,
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Check that the collector lock is still ours (the lock file may have been removed or
    /// replaced; a new collector would lock the new file), taking it again if so. The
    /// watcher calls this on its periodic tick. Err([`SpoolError::LockLost`]): another
    /// process collects the spool now, and this one must stop.
    pub fn check_lock(&self) -> Result<(), SpoolError> {
        let h = self.handles();
        self.relock(&h)
    }

    /// The spool's path, as the watcher watches it.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The uid whose files are accepted: the spool directory's owner.
    pub fn owner(&self) -> u32 {
        self.handles().owner
    }

    /// Recreate the directory if it is gone and swap in fresh handles, with the same checks
    /// as [`Spool::open`]. The watcher calls this when the directory was deleted or moved.
    ///
    /// A claimed spool takes its lock on the new directory. When another process got it
    /// first, the handles are swapped all the same (the watcher still watches the
    /// directory, for the device agent's remote waits), and the error is
    /// [`SpoolError::LockLost`]: the caller must stop collecting.
    pub fn reopen(&self) -> Result<(), SpoolError> {
        let fresh = Arc::new(open_handles(&self.path)?);
        let locked = self.relock(&fresh);
        // A poisoned lock only means a panic elsewhere while swapping an Arc: the value
        // inside is still a whole Arc, so carry on with it.
        *self.handles.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        locked
    }

    /// Whether the spool's path still names the directory this `Spool` holds open. False when
    /// the directory (or a parent) was moved or deleted, or the path now holds something else.
    pub fn path_matches(&self) -> Result<bool, SpoolError> {
        let h = self.handles();
        match rustix::fs::lstat(&self.path) {
            Ok(st) => Ok(st.st_dev == h.dev && st.st_ino == h.ino),
            Err(Errno::NOENT | Errno::NOTDIR) => Ok(false),
            Err(e) => Err(self.io_err("stat", e)),
        }
    }

    /// Names of candidate files (ending in `.json`, not starting with `.`), sorted by name,
    /// which is arrival order for names that start with the time (`$(date +%s%N)-…`).
    /// Entries that are not regular files are listed too, so that [`Spool::read`] refuses
    /// them and the caller parks them. On the way, every entry that can never be delivered is settled as the module
    /// docs say: a directory named `*.json` and a name that is not UTF-8 are parked, another
    /// odd name is logged (once per process).
    ///
    /// Refused with [`SpoolError::LockLost`] once another process took the spool.
    pub fn list(&self) -> Result<Vec<String>, SpoolError> {
        self.check_collecting()?;
        let h = self.handles();
        let (names, odd) = self.scan(&h)?;
        for (name, kind) in odd {
            self.settle_odd(&name, kind);
        }
        // Looks of names no longer listed (taken, removed by their writer) are stale.
        lock_or_inner(&self.looks).retain(|name, _| names.binary_search(name).is_ok());
        Ok(names)
    }

    /// The candidates, sorted, and the odd entries, with no side effect.
    fn scan(&self, h: &Handles) -> Result<Listing, SpoolError> {
        let mut names = Vec::new();
        let mut odd = Vec::new();
        for_each_entry(&h.dir, &self.path, |name, ft| {
            let bytes = name.to_bytes();
            if is_temporary(bytes) || bytes == BAD_DIR.as_bytes() {
                return Ok(());
            }
            let Ok(name) = name.to_str() else {
                odd.push((bytes.to_vec(), Odd::NotUtf8));
                return Ok(());
            };
            if !is_candidate(name) {
                odd.push((bytes.to_vec(), Odd::NotJson));
            } else if is_directory(&h.dir, name, ft) {
                odd.push((bytes.to_vec(), Odd::Directory));
            } else {
                names.push(name.to_owned());
            }
            Ok(())
        })?;
        names.sort_unstable();
        Ok((names, odd))
    }

    /// Park an entry that can never be delivered, or log an odd name the first time.
    fn settle_odd(&self, name: &[u8], kind: Odd) {
        let shown = escape_name(name);
        let (dest, reason) = match kind {
            Odd::NotJson => {
                self.log_odd_once(name, || {
                    tracing::warn!(
                        spool = %self.path.display(),
                        name = ?shown,
                        "ignoring a spool entry that is not a signal file: a signal file's name ends in .json (NAME.tmp and dotfiles are a writer's temporaries); logged once"
                    );
                });
                return;
            }
            Odd::Directory => (
                shown.clone(),
                "refused: a directory; a spool file must be a regular file (write NAME.tmp, then mv it to NAME.json)".to_owned(),
            ),
            Odd::NotUtf8 => (
                cut_name(&shown),
                format!(
                    "refused: the file name is not UTF-8 (shown with each byte that is not UTF-8 as \\xNN and each backslash doubled: {shown}); name spool files in UTF-8, as $(date +%s%N)-$$.json does"
                ),
            ),
        };
        match self.park_entry(OsStr::from_bytes(name), &dest, &reason) {
            Ok(Some(parked)) => tracing::warn!(
                spool = %self.path.display(),
                name = ?shown,
                parked = %parked,
                reason = %reason,
                "spool entry parked under bad/"
            ),
            Ok(None) => {}
            Err(e) => self.log_odd_once(name, || {
                tracing::error!(name = ?shown, error = %e, "cannot park a spool entry that can never be delivered; logged once");
            }),
        }
    }

    fn log_odd_once(&self, name: &[u8], log: impl FnOnce()) {
        let mut seen = lock_or_inner(&self.odd_logged);
        if seen.contains(name) {
            return;
        }
        if seen.len() >= MAX_ODD_NAMES {
            if seen.len() == MAX_ODD_NAMES {
                // One more entry, never a name's: the marker that this was said.
                seen.insert(Vec::new());
                tracing::warn!(spool = %self.path.display(), "more odd spool entries than are logged one by one; the rest are not logged");
            }
            return;
        }
        seen.insert(name.to_vec());
        log();
    }

    /// Read one spool file, refusing anything that is not a regular file with one link owned
    /// by the spool's owner and at most [`MAX_BODY_BYTES`] long.
    pub fn read(&self, name: &str) -> Result<Vec<u8>, Refusal> {
        check_name(name).map_err(Refusal::Io)?;
        let h = self.handles();
        // Look before opening: opening a device node can have side effects (a tape rewinds,
        // a modem hangs up), so refuse what is plainly not a file without opening it. The
        // fstat after the open stays the authoritative check, since the entry can be swapped
        // in between.
        match rustix::fs::statat(&h.dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => match FileType::from_raw_mode(st.st_mode) {
                FileType::RegularFile => {}
                FileType::Symlink => return Err(Refusal::Symlink),
                other => {
                    return Err(Refusal::NotRegular {
                        kind: file_kind(other),
                    });
                }
            },
            Err(Errno::NOENT) => return Err(Refusal::Gone),
            Err(e) => return Err(Refusal::Io(e.into())),
        }
        open_and_read(&h, name)
    }

    /// Delete a file once the caller knows its signal was acknowledged. A name that is
    /// already gone is fine.
    pub fn remove(&self, name: &str) -> Result<(), SpoolError> {
        check_name(name).map_err(|_| SpoolError::BadName {
            name: name.to_owned(),
        })?;
        lock_or_inner(&self.looks).remove(name);
        let h = self.handles();
        match rustix::fs::unlinkat(&h.dir, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(self.io_err("remove a file from", e)),
        }
    }

    /// Move the entry `name` into `bad/` and write `bad/<final name>.reason` holding `reason`.
    /// The entry is renamed as it is (a link stays a link; its target is not touched), never
    /// replacing anything in `bad/`: when the name is taken, `.1`, `.2`, … is appended.
    ///
    /// Returns the name it got in `bad/`, or `None` when the entry was already gone.
    pub fn park(&self, name: &str, reason: &str) -> Result<Option<String>, SpoolError> {
        check_name(name).map_err(|_| SpoolError::BadName {
            name: name.to_owned(),
        })?;
        lock_or_inner(&self.looks).remove(name);
        self.park_entry(OsStr::new(name), name, reason)
    }

    /// [`Spool::park`] for any entry name (raw bytes), parked as `dest` (or `dest.N`).
    fn park_entry(
        &self,
        name: &OsStr,
        dest: &str,
        reason: &str,
    ) -> Result<Option<String>, SpoolError> {
        let mut h = self.handles();
        let mut reopened = false;
        let mut n = 0u32;
        let parked = loop {
            let to = if n == 0 {
                dest.to_owned()
            } else {
                format!("{dest}.{n}")
            };
            match rustix::fs::renameat_with(&h.dir, name, &h.bad, &to, RenameFlags::NOREPLACE) {
                Ok(()) => break to,
                Err(Errno::EXIST) if n < MAX_PARK_SUFFIX => n += 1,
                Err(Errno::NOENT) => {
                    // Either someone else took the file, or bad/ itself was removed under
                    // us; only the second is worth a retry.
                    match rustix::fs::statat(&h.dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                        Err(Errno::NOENT) => return Ok(None),
                        _ if !reopened => {
                            self.reopen()?;
                            h = self.handles();
                            reopened = true;
                        }
                        _ => return Err(self.io_err("move a file into bad/ of", Errno::NOENT)),
                    }
                }
                Err(e) => return Err(self.io_err("move a file into bad/ of", e)),
            }
        };
        self.write_reason(&h, &parked, reason)?;
        Ok(Some(parked))
    }

    /// How long a file found by a listing must have gone unwritten (its mtime) before it may
    /// be parked as malformed: [`Spool::settled`].
    pub const SETTLE: std::time::Duration = std::time::Duration::from_secs(5);

    /// Whether `name`, which did not parse, stopped changing, so that parking it is right;
    /// false means leave it: its close (`IN_CLOSE_WRITE`) or a later look brings it back.
    /// A file is still changing while
    /// - some process has it open for writing (seen in `/proc`: the `writers` module), or
    /// - found by a listing (`announced` false), its inode, size, mtime or ctime moved since
    ///   the last look, there was no last look, or it was written less than
    ///   [`Spool::SETTLE`] ago: two looks that agree, and quiet since, are needed.
    ///
    /// A file the kernel announced complete (`announced`: closed after writing, or renamed
    /// in) and that nobody holds open for writing is settled at once, so a malformed file
    /// that was written and closed is parked promptly. Looked at through the directory's
    /// handle; a name that is gone is not settled.
    pub fn settled(&self, name: &str, announced: bool) -> bool {
        if check_name(name).is_err() {
            return false;
        }
        let h = self.handles();
        let Ok(st) = rustix::fs::statat(&h.dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
            lock_or_inner(&self.looks).remove(name);
            return false;
        };
        let open = writers::open_for_writing(st.st_dev, st.st_ino) == Some(true);
        // Looked at again after the scan: a writer that finished and closed while the
        // caller read the old bytes, or while the scan ran, left a newer size or mtime
        // than the look before, so the file is not settled; looked at before the scan,
        // this look would match the last one and the finished file would be parked.
        let Ok(st) = rustix::fs::statat(&h.dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
            lock_or_inner(&self.looks).remove(name);
            return false;
        };
        let look = Look::of(&st);
        let mut looks = lock_or_inner(&self.looks);
        if open {
            looks.insert(name.to_owned(), look);
            return false;
        }
        if announced {
            looks.remove(name);
            return true;
        }
        let before = looks.insert(name.to_owned(), look);
        if before == Some(look) && look.age() >= Self::SETTLE {
            looks.remove(name);
            return true;
        }
        false
    }

    /// Pending and parked counts, for status displays.
    pub fn counts(&self) -> Result<SpoolTally, SpoolError> {
        let h = self.handles();
        let pending = self.scan(&h)?.0.len();
        let bad_path = self.path.join(BAD_DIR);
        let mut bad = 0;
        for_each_entry(&h.bad, &bad_path, |name, _| {
            let name = name.to_bytes();
            // Dotfiles here are our own half-written `.reason` temporaries.
            if !name.starts_with(b".") && !name.ends_with(REASON_SUFFIX.as_bytes()) {
                bad += 1;
            }
            Ok(())
        })?;
        Ok(SpoolTally { pending, bad })
    }

    fn handles(&self) -> Arc<Handles> {
        Arc::clone(&self.handles.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn io_err(&self, action: &'static str, e: impl Into<io::Error>) -> SpoolError {
        SpoolError::Io {
            action,
            path: self.path.clone(),
            source: e.into(),
        }
    }

    /// Write the reason through a dot-named temporary and a rename, so a reader of `bad/`
    /// never sees half a reason and `counts` never counts the temporary.
    fn write_reason(&self, h: &Handles, parked: &str, reason: &str) -> Result<(), SpoolError> {
        let final_name = format!("{parked}{REASON_SUFFIX}");
        let tmp_name = format!(".{final_name}.tmp");
        let fd = rustix::fs::openat(
            &h.bad,
            tmp_name.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| self.io_err("write a .reason file in bad/ of", e))?;
        let mut file = std::fs::File::from(fd);
        let mut text = String::with_capacity(reason.len() + 1);
        text.push_str(reason.trim_end_matches('\n'));
        text.push('\n');
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_data())
            .map_err(|e| self.io_err("write a .reason file in bad/ of", e))?;
        drop(file);
        rustix::fs::renameat(&h.bad, tmp_name.as_str(), &h.bad, final_name.as_str())
            .map_err(|e| self.io_err("write a .reason file in bad/ of", e))
    }
}

/// A listing: the candidates, sorted, and the odd entries' raw names.
type Listing = (Vec<String>, Vec<(Vec<u8>, Odd)>);

/// A mutex's value even if a panic elsewhere poisoned it: every value kept here stays
/// whole across a panic (a map or set, an option).
fn lock_or_inner<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Names a caller is handling right now (forwarded, ack not yet back), so that the same name
/// arriving again from a rescan or a second event is not forwarded twice in parallel.
/// Single-task: wrap it in a mutex if several tasks share it.
#[derive(Debug, Default)]
pub struct InFlight {
    names: HashSet<String>,
}

impl InFlight {
    pub fn new() -> Self {
        Self::default()
    }

    /// True when `name` was not in flight and now is: the caller should handle it. False
    /// when it is already being handled: skip it.
    pub fn begin(&mut self, name: &str) -> bool {
        if self.names.contains(name) {
            return false;
        }
        self.names.insert(name.to_owned())
    }

    /// The caller is done with `name` (removed, parked, or given up until the next rescan).
    pub fn finish(&mut self, name: &str) {
        self.names.remove(name);
    }

    pub fn contains(&self, name: &str) -> bool {
        self.names.contains(name)
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}
