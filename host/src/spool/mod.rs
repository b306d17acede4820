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
//! - read more than [`MAX_BODY_BYTES`] + 1 bytes of any file, even one growing while read.
//!
//! Callers must treat handling one name twice as harmless: a name can arrive both in a
//! [`SpoolEvent::Rescan`] listing and as a [`SpoolEvent::File`] event, and a crash between
//! forwarding and [`Spool::remove`] sends it again after restart. The hub de-duplicates by
//! name; [`InFlight`] keeps a caller from forwarding a name again while it awaits the ack.
//!
//! The operations here are short blocking syscalls on a local directory; call them from
//! `spawn_blocking` if the spool may sit on a slow network filesystem.

mod watch;

#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::ffi::CStr;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use cortex_protocol::signal::MAX_BODY_BYTES;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

pub use watch::{RescanReason, SpoolEvent, SpoolWatcher};

/// The subdirectory of the spool where refused files are parked with a `.reason` beside them.
pub const BAD_DIR: &str = "bad";

/// Only these names are signal files; everything else (`.tmp`, dotfiles) is a writer's business.
const CANDIDATE_SUFFIX: &str = ".json";

/// A `.reason` file sits beside each parked file in `bad/`.
const REASON_SUFFIX: &str = ".reason";

/// How many `.<n>` suffixes `park` tries before giving up; far more than any real collision.
const MAX_PARK_SUFFIX: u32 = 10_000;

/// Why the spool cannot be used. Each message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error(
        "spool {} is a symbolic link, and cortex never follows links there; replace it with a real directory (rm it, then mkdir -m 700 it)",
        .path.display()
    )]
    Symlink { path: PathBuf },

    #[error(
        "spool {} exists but is not a directory; move it away so cortex can create the directory",
        .path.display()
    )]
    NotDirectory { path: PathBuf },

    #[error(
        "spool {} is writable by group or others (mode {mode:04o}), so another user could plant or swap files in it; run chmod 700 on it",
        .path.display()
    )]
    Insecure { path: PathBuf, mode: u32 },

    #[error(
        "spool {} belongs to uid {owner}, but cortex runs as uid {euid} and could not remove or park files there; chown it to uid {euid}, or remove it so cortex creates its own",
        .path.display()
    )]
    NotOwner {
        path: PathBuf,
        owner: u32,
        euid: u32,
    },

    #[error("{name:?} is not a plain file name in the spool")]
    BadName { name: String },

    #[error("cannot watch spool {}: {source}{hint}", .path.display())]
    Watch {
        path: PathBuf,
        source: io::Error,
        /// Advice for the limits a user can hit, empty otherwise.
        hint: &'static str,
    },

    #[error("cannot {action} {}: {source}", .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

/// Why one spool file was not read. Everything but [`Refusal::Gone`] and a transient
/// [`Refusal::Io`] is permanent: see [`Refusal::should_park`].
///
/// The messages are written for the `.reason` file beside a parked file, so they tell the
/// writer what to do differently.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The name no longer exists: another reader took it, or the writer removed it. Not an
    /// error for callers.
    #[error("the file is gone (already taken)")]
    Gone,

    #[error(
        "refused: a symbolic link; a spool file must be a regular file (write NAME.tmp, then mv it to NAME.json)"
    )]
    Symlink,

    #[error("refused: not a regular file ({kind}); a spool file must be a regular file")]
    NotRegular { kind: &'static str },

    #[error(
        "refused: owned by uid {uid}, but the spool belongs to uid {owner}; only the spool's owner may drop signals"
    )]
    WrongOwner { uid: u32, owner: u32 },

    #[error(
        "refused: the file has {nlink} links; a spool file must have exactly one (write a fresh file and mv it in, never ln)"
    )]
    HardLinked { nlink: u64 },

    #[error("refused: {bytes} bytes is over the {MAX_BODY_BYTES}-byte cap for a signal body")]
    TooLarge { bytes: u64 },

    #[error("cannot read: {0}")]
    Io(#[source] io::Error),
}

impl Refusal {
    /// Whether the file should be parked under `bad/`: true when reading it again can never
    /// succeed. `Gone` has nothing to park; an I/O error such as EIO or EMFILE may pass, so the
    /// file stays for the next rescan. Permission errors do not pass by themselves.
    pub fn should_park(&self) -> bool {
        match self {
            Refusal::Gone => false,
            Refusal::Io(e) => matches!(
                Errno::from_io_error(e),
                Some(Errno::ACCESS | Errno::PERM | Errno::NXIO | Errno::NODEV)
            ),
            Refusal::Symlink
            | Refusal::NotRegular { .. }
            | Refusal::WrongOwner { .. }
            | Refusal::HardLinked { .. }
            | Refusal::TooLarge { .. } => true,
        }
    }
}

/// How many files wait in the spool and how many were parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpoolCounts {
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
}

#[derive(Debug)]
struct Handles {
    dir: OwnedFd,
    bad: OwnedFd,
    /// The spool directory's owner: the only uid whose files are accepted.
    owner: u32,
    dev: u64,
    ino: u64,
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
        })
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
    pub fn reopen(&self) -> Result<(), SpoolError> {
        let fresh = Arc::new(open_handles(&self.path)?);
        // A poisoned lock only means a panic elsewhere while swapping an Arc: the value
        // inside is still a whole Arc, so carry on with it.
        *self.handles.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        Ok(())
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
    /// which is arrival order for the seed's `$(date +%s%N)-…` names. Entries that are not
    /// regular files are listed too, so that [`Spool::read`] refuses them and the caller parks
    /// them; directories are not. Names that are not UTF-8 are skipped with a warning.
    pub fn list(&self) -> Result<Vec<String>, SpoolError> {
        let h = self.handles();
        let mut names = Vec::new();
        for_each_entry(&h.dir, &self.path, |name, ft| {
            let Some(name) = utf8_name(name, &self.path) else {
                return Ok(());
            };
            if !is_candidate(name) {
                return Ok(());
            }
            if is_directory(&h.dir, name, ft) {
                return Ok(());
            }
            names.push(name.to_owned());
            Ok(())
        })?;
        names.sort_unstable();
        Ok(names)
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
        let mut h = self.handles();
        let mut reopened = false;
        let mut n = 0u32;
        let parked = loop {
            let dest = if n == 0 {
                name.to_owned()
            } else {
                format!("{name}.{n}")
            };
            match rustix::fs::renameat_with(&h.dir, name, &h.bad, &dest, RenameFlags::NOREPLACE) {
                Ok(()) => break dest,
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

    /// How long after its last write a file found by a listing may still be being written in
    /// place (not via `.tmp` and a rename).
    pub const SETTLE: std::time::Duration = std::time::Duration::from_secs(5);

    /// Whether `name` was written less than [`Spool::SETTLE`] ago: a malformed file a listing
    /// found this fresh may be half-written, and its close (`IN_CLOSE_WRITE`) or the next
    /// rescan takes it instead of parking it. Looked at through the directory's handle.
    pub fn recently_written(&self, name: &str) -> bool {
        if check_name(name).is_err() {
            return false;
        }
        let h = self.handles();
        let Ok(st) = rustix::fs::statat(&h.dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
            return false;
        };
        let written = std::time::UNIX_EPOCH
            + std::time::Duration::new(
                st.st_mtime.max(0) as u64,
                st.st_mtime_nsec.clamp(0, 999_999_999) as u32,
            );
        written.elapsed().is_ok_and(|age| age < Self::SETTLE)
    }

    /// Pending and parked counts, for status displays.
    pub fn counts(&self) -> Result<SpoolCounts, SpoolError> {
        let pending = self.list()?.len();
        let h = self.handles();
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
        Ok(SpoolCounts { pending, bad })
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

/// Open, check with `fstat`, and read at most `MAX_BODY_BYTES + 1` bytes. Separate from
/// [`Spool::read`]'s look-before-open so tests can prove the open alone never blocks on a FIFO.
fn open_and_read(h: &Handles, name: &str) -> Result<Vec<u8>, Refusal> {
    let fd = match rustix::fs::openat(
        &h.dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Err(Refusal::Gone),
        // O_NOFOLLOW on a final symlink fails with ELOOP: the link is never followed.
        Err(Errno::LOOP) => return Err(Refusal::Symlink),
        Err(e) => return Err(Refusal::Io(e.into())),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| Refusal::Io(e.into()))?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {}
        other => {
            return Err(Refusal::NotRegular {
                kind: file_kind(other),
            });
        }
    }
    if st.st_uid != h.owner {
        return Err(Refusal::WrongOwner {
            uid: st.st_uid,
            owner: h.owner,
        });
    }
    if st.st_nlink != 1 {
        return Err(Refusal::HardLinked { nlink: st.st_nlink });
    }
    let size = u64::try_from(st.st_size).unwrap_or(0);
    if size > MAX_BODY_BYTES as u64 {
        return Err(Refusal::TooLarge { bytes: size });
    }
    // The file can grow after fstat (a writer still appending): cap the read itself too.
    let cap = MAX_BODY_BYTES as u64 + 1;
    let mut body = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    std::fs::File::from(fd)
        .take(cap)
        .read_to_end(&mut body)
        .map_err(Refusal::Io)?;
    if body.len() > MAX_BODY_BYTES {
        return Err(Refusal::TooLarge {
            bytes: body.len() as u64,
        });
    }
    Ok(body)
}

/// Create (0700) and open the spool and its `bad/`, refusing links, non-directories and
/// group/other-writable directories.
fn open_handles(path: &Path) -> Result<Handles, SpoolError> {
    let io_err = |action, source: io::Error| SpoolError::Io {
        action,
        path: path.to_owned(),
        source,
    };
    // Look first so the common mistakes get their own message; the O_NOFOLLOW open below is
    // what actually guarantees it.
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.file_type().is_symlink() => {
            return Err(SpoolError::Symlink {
                path: path.to_owned(),
            });
        }
        Ok(md) if !md.is_dir() => {
            return Err(SpoolError::NotDirectory {
                path: path.to_owned(),
            });
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)
                .map_err(|e| io_err("create the spool directory", e))?;
        }
        Err(e) => return Err(io_err("inspect the spool directory", e)),
    }
    let dir = open_dir(rustix::fs::CWD, path, path)?;
    let st =
        rustix::fs::fstat(&dir).map_err(|e| io_err("inspect the spool directory", e.into()))?;
    check_mode(path, st.st_mode)?;
    check_owner(path, st.st_uid, rustix::process::geteuid().as_raw())?;

    let bad_path = path.join(BAD_DIR);
    match rustix::fs::mkdirat(&dir, BAD_DIR, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(io_err("create the bad/ directory in", e.into())),
    }
    let bad = open_dir(dir.as_fd(), BAD_DIR, &bad_path)?;
    let bad_st = rustix::fs::fstat(&bad).map_err(|e| io_err("inspect bad/ in", e.into()))?;
    check_mode(&bad_path, bad_st.st_mode)?;

    Ok(Handles {
        dir,
        bad,
        owner: st.st_uid,
        dev: st.st_dev,
        ino: st.st_ino,
    })
}

fn open_dir<Fd: AsFd + Copy, P: rustix::path::Arg + Copy>(
    at: Fd,
    name: P,
    shown: &Path,
) -> Result<OwnedFd, SpoolError> {
    match rustix::fs::openat(
        at,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(fd),
        Err(Errno::LOOP) => Err(SpoolError::Symlink {
            path: shown.to_owned(),
        }),
        // With O_DIRECTORY, Linux reports a final symlink as ENOTDIR rather than ELOOP:
        // look at the entry itself to give the right advice.
        Err(Errno::NOTDIR) => match rustix::fs::statat(at, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
                Err(SpoolError::Symlink {
                    path: shown.to_owned(),
                })
            }
            _ => Err(SpoolError::NotDirectory {
                path: shown.to_owned(),
            }),
        },
        Err(e) => Err(SpoolError::Io {
            action: "open",
            path: shown.to_owned(),
            source: e.into(),
        }),
    }
}

/// The daemon must own its spool, or it could read files but never delete or park them.
/// Root may serve a user's spool (a system unit running for that user).
fn check_owner(path: &Path, owner: u32, euid: u32) -> Result<(), SpoolError> {
    if euid != 0 && owner != euid {
        return Err(SpoolError::NotOwner {
            path: path.to_owned(),
            owner,
            euid,
        });
    }
    Ok(())
}

fn check_mode(path: &Path, st_mode: u32) -> Result<(), SpoolError> {
    if st_mode & 0o022 != 0 {
        return Err(SpoolError::Insecure {
            path: path.to_owned(),
            mode: st_mode & 0o7777,
        });
    }
    Ok(())
}

/// Make the path absolute (the watcher re-adds its watch by path, possibly after the working
/// directory changed) and drop a trailing slash, which would make the kernel follow a final
/// symlink that O_NOFOLLOW is meant to refuse.
fn normalize(dir: &Path) -> Result<PathBuf, SpoolError> {
    let abs = std::path::absolute(dir).map_err(|e| SpoolError::Io {
        action: "resolve the spool path",
        path: dir.to_owned(),
        source: e,
    })?;
    Ok(abs.components().collect())
}

/// Walk a directory through its handle; `f` gets each name (without `.` and `..`) and the
/// type readdir reported, which may be `Unknown` on some filesystems.
fn for_each_entry(
    dir: &OwnedFd,
    shown: &Path,
    mut f: impl FnMut(&CStr, FileType) -> Result<(), SpoolError>,
) -> Result<(), SpoolError> {
    let io_err = |e: Errno| SpoolError::Io {
        action: "list",
        path: shown.to_owned(),
        source: e.into(),
    };
    // read_from opens its own "." so each listing starts at the beginning.
    let entries = rustix::fs::Dir::read_from(dir).map_err(io_err)?;
    for entry in entries {
        let entry = entry.map_err(io_err)?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        f(name, entry.file_type())?;
    }
    Ok(())
}

fn utf8_name<'a>(name: &'a CStr, dir: &Path) -> Option<&'a str> {
    match name.to_str() {
        Ok(s) => Some(s),
        Err(_) => {
            tracing::warn!(
                spool = %dir.display(),
                name = ?name,
                "skipping a spool entry whose name is not UTF-8"
            );
            None
        }
    }
}

fn is_directory(dir: &OwnedFd, name: &str, ft: FileType) -> bool {
    match ft {
        FileType::Directory => true,
        FileType::Unknown => rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .map(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
            .unwrap_or(false),
        _ => false,
    }
}

/// A signal file's name: ends in `.json`, not a dotfile (writers' temporaries), not a path.
pub fn is_candidate(name: &str) -> bool {
    name.len() > CANDIDATE_SUFFIX.len()
        && name.ends_with(CANDIDATE_SUFFIX)
        && !name.starts_with('.')
        && !name.contains('/')
}

/// Names come from readdir and inotify, which never give these; a caller passing one would
/// otherwise make `openat` walk out of the spool.
fn check_name(name: &str) -> io::Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a plain file name"),
        ));
    }
    Ok(())
}

fn file_kind(ft: FileType) -> &'static str {
    match ft {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "an unknown kind of file",
    }
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
