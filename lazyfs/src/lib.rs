//! lazyfs: a FUSE filesystem that loses what was not made durable, for tests that need a
//! power cut rather than a SIGKILL (which keeps the page cache, so it cannot show a
//! missing `fsync` or a write that overtook one). In the manner of Jepsen's LazyFS.
//!
//! A [`LazyFs`] mounts a directory over a *backing directory*. The backing directory
//! holds the durable state and nothing else; everything not yet durable lives in memory,
//! and reads are answered from there, so the programs see their own writes.
//!
//! # The model (what is durable when)
//!
//! - **File data.** Writes and size changes (`write`, `ftruncate`, `O_TRUNC`,
//!   `fallocate`) are kept in memory, in order. `fsync` or `fdatasync` of the file makes
//!   all of them durable (the two are the same here). `close` makes nothing durable.
//! - **File names.** Creating a file, a hard link, a rename and an unlink are un-synced
//!   changes of their directory, in order. With [`Names::Strict`] (POSIX's promise only)
//!   they become durable when that directory is fsynced; a rename across directories is
//!   an unlink in one and a link in the other, each durable with its own directory. With
//!   [`Names::Journaled`] any fsync, of a file or a directory, also makes every name change
//!   made before it durable (ext4 with a journal and XFS commit their whole running
//!   transaction on an fsync). A rename inside one directory is atomic in both.
//!   A newly created file whose name became durable before its data holds what of its
//!   data was synced: nothing, if none was.
//! - **Directories** (`mkdir`, `rmdir`, renaming a directory) are written through at
//!   once, after making their parent's earlier name changes durable: the programs under
//!   test create their directories once and never rename them, and modelling them would
//!   buy nothing.
//! - **Metadata** other than the size: permission bits are written through; owners and
//!   times are kept in memory only and are not part of what a cut is checked for.
//! - Symbolic links, device nodes, `O_TMPFILE` and extended attributes are not supported
//!   (the call fails); locks (`flock`, `fcntl`) are the kernel's local ones.
//!
//! # A power cut
//!
//! [`LazyFs::cut`] is the instant the power goes: with [`Cut::Whole`] every un-synced
//! change is thrown away; with [`Cut::Prefix`] each file keeps a random prefix (in write
//! order) of its un-synced writes, and each directory of its un-synced name changes,
//! chosen from a seed so a failing run can be repeated. From that instant every request
//! fails with EIO (no write of a process still running reaches the disk); the caller then
//! kills the processes, [`LazyFs::unmount`]s, and mounts again over the same backing
//! directory, which then shows exactly the durable state.
//!
//! The kernel caches nothing (names and attributes have no time to live; files are opened
//! with direct I/O), so no page outlives a cut. One lock serialises requests: an fsync has
//! reached the backing directory before it returns, and a cut falls between two requests.

mod backing;
mod fs;
pub mod model;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use model::{Cut, CutReport, Names};

/// Why mounting, cutting or unmounting failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("backing directory: {path}: {source}")]
    Backing {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("{0}: only directories and regular files may be in a backing directory")]
    Unsupported(PathBuf),
    #[error("FUSE is not available here: {0}")]
    Unavailable(String),
    #[error("mounting at {path}: {source}")]
    Mount {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} failed ({errno}); the backing directory may be behind the model")]
    Model {
        what: &'static str,
        errno: model::Errno,
    },
}

/// A mounted lazyfs. Dropping it unmounts, as [`LazyFs::unmount`] does.
pub struct LazyFs {
    shared: Arc<Mutex<fs::Shared>>,
    session: Option<fuser::BackgroundSession>,
    mountpoint: PathBuf,
}

/// Whether this machine can mount a lazyfs: `/dev/fuse` and `fusermount3` on `PATH`.
/// `Err` says what is missing.
pub fn available() -> Result<(), String> {
    if !Path::new("/dev/fuse").exists() {
        return Err("/dev/fuse does not exist".into());
    }
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("fusermount3").is_file()))
        .unwrap_or(false);
    if !found {
        return Err("fusermount3 is not on PATH (Debian's fuse3 package)".into());
    }
    Ok(())
}

impl LazyFs {
    /// Mounts at `mountpoint` (an existing directory) the durable state held in `backing`
    /// (an existing directory; empty for a fresh filesystem).
    pub fn mount(mountpoint: &Path, backing: &Path, names: Names) -> Result<LazyFs, Error> {
        available().map_err(Error::Unavailable)?;
        let model = backing::load(backing, names)?;
        let shared = Arc::new(Mutex::new(fs::Shared {
            model,
            backing: backing::BackingDir::new(backing),
        }));
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("lazyfs".into()),
            fuser::MountOption::Subtype("lazyfs".into()),
            fuser::MountOption::DefaultPermissions,
            fuser::MountOption::NoAtime,
        ];
        config.n_threads = Some(1);
        let session = fuser::spawn_mount(
            fs::Fs {
                shared: shared.clone(),
            },
            mountpoint,
            &config,
        )
        .map_err(|source| Error::Mount {
            path: mountpoint.to_path_buf(),
            source,
        })?;
        Ok(LazyFs {
            shared,
            session: Some(session),
            mountpoint: mountpoint.to_path_buf(),
        })
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    fn with<T>(
        &self,
        what: &'static str,
        f: impl FnOnce(&mut fs::Shared) -> Result<T, model::Errno>,
    ) -> Result<T, Error> {
        let mut sh = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut sh).map_err(|errno| Error::Model { what, errno })
    }

    /// The power cut (see the crate's docs): from its return on, every request to this
    /// mount fails with EIO, and the backing directory holds what survived.
    pub fn cut(&self, how: Cut) -> Result<CutReport, Error> {
        self.with("the cut", |sh| sh.model.cut(&mut sh.backing, how))
    }

    /// The power cut at the first moment within `within` when some change is not yet
    /// durable (a program between its write and its fsync), or at the end of `within`.
    /// A cut at a random moment mostly finds a program that synced everything: this one
    /// aims at the windows a missing or misplaced fsync leaves open.
    pub fn cut_when_unsynced(
        &self,
        how: Cut,
        within: std::time::Duration,
    ) -> Result<CutReport, Error> {
        let end = std::time::Instant::now() + within;
        loop {
            {
                let mut sh = self.shared.lock().unwrap_or_else(|e| e.into_inner());
                if sh.model.unsynced() || std::time::Instant::now() >= end {
                    let sh = &mut *sh;
                    return sh
                        .model
                        .cut(&mut sh.backing, how)
                        .map_err(|errno| Error::Model {
                            what: "the cut",
                            errno,
                        });
                }
            }
            // Long enough to let the FUSE thread take the lock, short enough to land
            // inside a write-to-fsync window of a few requests.
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }

    /// `sync(2)`: everything becomes durable.
    pub fn sync_all(&self) -> Result<(), Error> {
        self.with("sync", |sh| sh.model.sync_all(&mut sh.backing))
    }

    /// Unmounts (a lazy unmount: the mountpoint is free at once). Call it once the
    /// processes that used the mount have ended; after a cut the old connection can
    /// change nothing, so a new mount over the same backing directory may follow at once.
    pub fn unmount(mut self) {
        // Dropping the session unmounts; its thread ends when the kernel closes the
        // connection, which a file still open elsewhere would delay (never wait on it).
        self.session.take();
    }
}
