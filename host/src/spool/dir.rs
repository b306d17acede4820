//! The spool's directory handles and the syscalls on them: opening the spool and `bad/`
//! safely, checking owner and mode, listing entries, reading one file.

use std::ffi::CStr;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use cortex_protocol::signal::MAX_BODY_BYTES;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::names::file_kind;
use super::{BAD_DIR, Refusal, SpoolError};

#[derive(Debug)]
pub(super) struct Handles {
    pub(super) dir: OwnedFd,
    pub(super) bad: OwnedFd,
    /// The spool directory's owner: the only uid whose files are accepted.
    pub(super) owner: u32,
    pub(super) dev: u64,
    pub(super) ino: u64,
}

/// Open, check with `fstat`, and read at most `MAX_BODY_BYTES + 1` bytes. Separate from
/// [`Spool::read`]'s look-before-open so tests can prove the open alone never blocks on a FIFO.
pub(super) fn open_and_read(h: &Handles, name: &str) -> Result<Vec<u8>, Refusal> {
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
pub(super) fn open_handles(path: &Path) -> Result<Handles, SpoolError> {
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

pub(super) fn open_dir<Fd: AsFd + Copy, P: rustix::path::Arg + Copy>(
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
pub(super) fn check_owner(path: &Path, owner: u32, euid: u32) -> Result<(), SpoolError> {
    if euid != 0 && owner != euid {
        return Err(SpoolError::NotOwner {
            path: path.to_owned(),
            owner,
            euid,
        });
    }
    Ok(())
}

pub(super) fn check_mode(path: &Path, st_mode: u32) -> Result<(), SpoolError> {
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
pub(super) fn normalize(dir: &Path) -> Result<PathBuf, SpoolError> {
    let abs = std::path::absolute(dir).map_err(|e| SpoolError::Io {
        action: "resolve the spool path",
        path: dir.to_owned(),
        source: e,
    })?;
    Ok(abs.components().collect())
}

/// Walk a directory through its handle; `f` gets each name (without `.` and `..`) and the
/// type readdir reported, which may be `Unknown` on some filesystems.
pub(super) fn for_each_entry(
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

pub(super) fn is_directory(dir: &OwnedFd, name: &str, ft: FileType) -> bool {
    match ft {
        FileType::Directory => true,
        FileType::Unknown => rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .map(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
            .unwrap_or(false),
        _ => false,
    }
}
