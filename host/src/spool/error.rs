//! Why the spool cannot be used ([`SpoolError`]) and why one file was not read ([`Refusal`]).

use std::io;
use std::path::PathBuf;

use cortex_protocol::signal::MAX_BODY_BYTES;
use rustix::io::Errno;

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

    #[error(
        "spool {} is already collected by {holder}; stop it, or give this one another --home / spool",
        .path.display()
    )]
    Held { path: PathBuf, holder: String },

    #[error(
        "spool {} was recreated and is now collected by {holder}; this process stopped collecting it (restart it with another --home, or stop the other one and restart this one)",
        .path.display()
    )]
    LockLost { path: PathBuf, holder: String },

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
