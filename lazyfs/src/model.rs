//! The durability model without FUSE: a tree of files and directories held twice, as the
//! running programs see it (*current*) and as it would be after a power cut (*durable*),
//! with the un-synced changes between the two kept in order, so a cut can drop them all or
//! keep a prefix of each.
//!
//! Every step that changes the durable state is handed to a [`Mirror`] at once (the
//! backing directory, in the real filesystem), so what the mirror holds is always exactly
//! the durable state.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// An inode number (FUSE's: the root is 1).
pub type Ino = u64;

/// The root directory's inode.
pub const ROOT: Ino = 1;

/// When a name change (create, link, rename, unlink) becomes durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Names {
    /// Only when its directory is fsynced (POSIX's promise and nothing more).
    Strict,
    /// Also when any file or directory is fsynced: every name change made before it is
    /// committed with it, as a journaling filesystem (ext4 `data=ordered`, XFS) commits
    /// its whole running transaction on any fsync.
    Journaled,
}

/// What a power cut keeps of the un-synced changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Nothing: the durable state is exactly what was synced.
    Whole,
    /// Each file keeps a random prefix (in write order) of its un-synced writes and size
    /// changes, and each directory a random prefix of its un-synced name changes; the
    /// choices follow from `seed`, so a cut over the same changes keeps the same ones.
    Prefix { seed: u64 },
}

/// A failed operation: the errno the caller gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("errno {0}")]
pub struct Errno(pub i32);

impl Errno {
    pub const NOENT: Errno = Errno(libc::ENOENT);
    pub const EXIST: Errno = Errno(libc::EEXIST);
    pub const NOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const ISDIR: Errno = Errno(libc::EISDIR);
    pub const NOTEMPTY: Errno = Errno(libc::ENOTEMPTY);
    pub const INVAL: Errno = Errno(libc::EINVAL);
    pub const IO: Errno = Errno(libc::EIO);
}

/// One un-synced change to a file's data, in the order it was made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Write { at: u64, data: Vec<u8> },
    SetLen(u64),
}

impl Change {
    fn apply(&self, to: &mut Vec<u8>) {
        match self {
            Change::Write { at, data } => {
                let at = usize::try_from(*at).unwrap_or(usize::MAX);
                let end = at.saturating_add(data.len());
                if to.len() < end {
                    to.resize(end, 0);
                }
                to[at..end].copy_from_slice(data);
            }
            Change::SetLen(len) => to.resize(usize::try_from(*len).unwrap_or(usize::MAX), 0),
        }
    }
}

/// One un-synced change to a directory's names. A rename inside one directory is one
/// change (atomic, as every journaling filesystem makes it); a rename across directories
/// is an unlink in one and a link in the other.
#[derive(Clone, Debug, PartialEq, Eq)]
enum NameOp {
    /// `name` now refers to `ino` (replacing what it named).
    Link(OsString, Ino),
    Unlink(OsString),
    Rename(OsString, OsString),
}

/// A step that changes the durable state; paths are relative to the filesystem's root.
#[derive(Debug)]
pub enum Durable<'a> {
    /// A file's durable data changed; `path` is one of its durable names (hard links
    /// share the data).
    Data {
        path: &'a Path,
        change: &'a Change,
    },
    /// `path` now names a file whose durable data is `content`; `like` is another durable
    /// name of the same file (link to it rather than write a copy). Replaces what `path`
    /// named.
    Link {
        path: &'a Path,
        like: Option<&'a Path>,
        content: &'a [u8],
        perm: u16,
    },
    Unlink {
        path: &'a Path,
    },
    /// A file renamed inside one directory (replacing what `to` named).
    Rename {
        from: &'a Path,
        to: &'a Path,
    },
    Mkdir {
        path: &'a Path,
        perm: u16,
    },
    /// A directory and whatever durable names were still in it.
    Rmdir {
        path: &'a Path,
    },
    RenameDir {
        from: &'a Path,
        to: &'a Path,
    },
    Perm {
        path: &'a Path,
        perm: u16,
    },
}

/// Where the durable state goes as it changes.
pub trait Mirror {
    fn apply(&mut self, step: Durable<'_>) -> io::Result<()>;
}

/// A mirror that keeps nothing (the model alone is enough for its tests).
pub struct NoMirror;

impl Mirror for NoMirror {
    fn apply(&mut self, _: Durable<'_>) -> io::Result<()> {
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
}

/// What `stat` shows of a node (the current state).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: Kind,
    pub size: u64,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

#[derive(Clone, Debug)]
struct Meta {
    perm: u16,
    uid: u32,
    gid: u32,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
}

impl Meta {
    fn new(perm: u16, uid: u32, gid: u32) -> Meta {
        let now = SystemTime::now();
        Meta {
            perm,
            uid,
            gid,
            atime: now,
            mtime: now,
            ctime: now,
        }
    }
}

#[derive(Debug, Default)]
struct FileNode {
    current: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Change>,
    /// Names in the current tree.
    links: u32,
    /// Names in the durable tree: (directory, name).
    durable_links: BTreeSet<(Ino, OsString)>,
}

#[derive(Debug, Default)]
struct DirNode {
    current: BTreeMap<OsString, Ino>,
    durable: BTreeMap<OsString, Ino>,
    pending: Vec<NameOp>,
    /// Directories are written through (see the crate's docs), so their place is the same
    /// in both trees.
    parent: Ino,
    name: OsString,
}

#[derive(Debug)]
enum Body {
    File(FileNode),
    Dir(DirNode),
}

#[derive(Debug)]
struct Node {
    meta: Meta,
    body: Body,
}

/// What a cut dropped and kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CutReport {
    /// Files with un-synced changes at the cut.
    pub files: usize,
    /// Un-synced writes and size changes kept (by a prefix cut) and dropped.
    pub changes_kept: usize,
    pub changes_dropped: usize,
    /// Un-synced name changes kept and dropped.
    pub names_kept: usize,
    pub names_dropped: usize,
    /// Per file with un-synced changes: a name of it (its current one, else a durable
    /// one, else `?`), and the changes kept and dropped.
    pub per_file: Vec<(PathBuf, usize, usize)>,
}

/// splitmix64: the prefix cut's choices, replayable from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..=n`.
    fn upto(&mut self, n: usize) -> usize {
        (self.next() % (n as u64 + 1)) as usize
    }
}

/// The whole filesystem: current and durable trees, and a cut that has happened or not.
#[derive(Debug)]
pub struct Model {
    nodes: HashMap<Ino, Node>,
    next: Ino,
    names: Names,
    /// After a cut every operation fails with EIO: the disk is gone.
    cut: bool,
}

fn not_found() -> Errno {
    Errno::NOENT
}

impl Model {
    /// An empty filesystem whose root has `perm`, owned by `uid`/`gid`.
    pub fn new(names: Names, perm: u16, uid: u32, gid: u32) -> Model {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node {
                meta: Meta::new(perm, uid, gid),
                body: Body::Dir(DirNode {
                    parent: ROOT,
                    ..DirNode::default()
                }),
            },
        );
        Model {
            nodes,
            next: ROOT + 1,
            names,
            cut: false,
        }
    }

    pub fn names(&self) -> Names {
        self.names
    }

    /// True while some change is not durable (a write, a size change or a name change).
    pub fn unsynced(&self) -> bool {
        self.nodes.values().any(|n| match &n.body {
            Body::File(f) => !f.pending.is_empty(),
            Body::Dir(d) => !d.pending.is_empty(),
        })
    }

    /// True once [`Model::cut`] ran.
    pub fn is_cut(&self) -> bool {
        self.cut
    }

    fn live(&self) -> Result<(), Errno> {
        if self.cut { Err(Errno::IO) } else { Ok(()) }
    }

    fn node(&self, ino: Ino) -> Result<&Node, Errno> {
        self.nodes.get(&ino).ok_or_else(not_found)
    }

    fn dir(&self, ino: Ino) -> Result<&DirNode, Errno> {
        match &self.node(ino)?.body {
            Body::Dir(d) => Ok(d),
            Body::File(_) => Err(Errno::NOTDIR),
        }
    }

    fn dir_mut(&mut self, ino: Ino) -> Result<&mut DirNode, Errno> {
        match &mut self.nodes.get_mut(&ino).ok_or_else(not_found)?.body {
            Body::Dir(d) => Ok(d),
            Body::File(_) => Err(Errno::NOTDIR),
        }
    }

    fn file(&self, ino: Ino) -> Result<&FileNode, Errno> {
        match &self.node(ino)?.body {
            Body::File(f) => Ok(f),
            Body::Dir(_) => Err(Errno::ISDIR),
        }
    }

    fn file_mut(&mut self, ino: Ino) -> Result<&mut FileNode, Errno> {
        match &mut self.nodes.get_mut(&ino).ok_or_else(not_found)?.body {
            Body::File(f) => Ok(f),
            Body::Dir(_) => Err(Errno::ISDIR),
        }
    }

    fn kind(&self, ino: Ino) -> Result<Kind, Errno> {
        Ok(match self.node(ino)?.body {
            Body::File(_) => Kind::File,
            Body::Dir(_) => Kind::Dir,
        })
    }

    /// The path of directory `dir` from the root (the same in both trees).
    fn dir_path(&self, mut dir: Ino) -> Result<PathBuf, Errno> {
        let mut parts = Vec::new();
        while dir != ROOT {
            let d = self.dir(dir)?;
            parts.push(d.name.clone());
            dir = d.parent;
        }
        Ok(parts.iter().rev().collect())
    }

    fn alloc(&mut self, meta: Meta, body: Body) -> Ino {
        let ino = self.next;
        self.next += 1;
        self.nodes.insert(ino, Node { meta, body });
        ino
    }

    // ---- reading the current tree ----

    pub fn attr(&self, ino: Ino) -> Result<Attr, Errno> {
        let n = self.node(ino)?;
        let (kind, size, nlink) = match &n.body {
            Body::File(f) => (Kind::File, f.current.len() as u64, f.links),
            Body::Dir(d) => {
                let subdirs = d
                    .current
                    .values()
                    .filter(|i| self.kind(**i) == Ok(Kind::Dir))
                    .count() as u32;
                (Kind::Dir, 4096, 2 + subdirs)
            }
        };
        Ok(Attr {
            ino,
            kind,
            size,
            perm: n.meta.perm,
            nlink,
            uid: n.meta.uid,
            gid: n.meta.gid,
            atime: n.meta.atime,
            mtime: n.meta.mtime,
            ctime: n.meta.ctime,
        })
    }

    pub fn lookup(&self, dir: Ino, name: &OsStr) -> Result<Ino, Errno> {
        self.live()?;
        self.dir(dir)?
            .current
            .get(name)
            .copied()
            .ok_or_else(not_found)
    }

    /// The current entries of `dir`, in name order, with their kinds.
    pub fn entries(&self, dir: Ino) -> Result<Vec<(OsString, Ino, Kind)>, Errno> {
        self.live()?;
        let d = self.dir(dir)?;
        d.current
            .iter()
            .map(|(n, i)| Ok((n.clone(), *i, self.kind(*i)?)))
            .collect()
    }

    /// The parent of directory `dir` (the root's is the root).
    pub fn parent(&self, dir: Ino) -> Result<Ino, Errno> {
        Ok(self.dir(dir)?.parent)
    }

    pub fn read(&self, ino: Ino, at: u64, len: usize) -> Result<&[u8], Errno> {
        self.live()?;
        let f = self.file(ino)?;
        let start = usize::try_from(at)
            .unwrap_or(usize::MAX)
            .min(f.current.len());
        let end = start.saturating_add(len).min(f.current.len());
        Ok(&f.current[start..end])
    }

    // ---- changing the current tree ----

    /// A new empty file at `dir`/`name` (not yet durable: its name is an un-synced change).
    pub fn create(
        &mut self,
        dir: Ino,
        name: &OsStr,
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> Result<Ino, Errno> {
        self.live()?;
        if self.dir(dir)?.current.contains_key(name) {
            return Err(Errno::EXIST);
        }
        let ino = self.alloc(
            Meta::new(perm, uid, gid),
            Body::File(FileNode {
                links: 1,
                ..FileNode::default()
            }),
        );
        let d = self.dir_mut(dir)?;
        d.current.insert(name.to_owned(), ino);
        d.pending.push(NameOp::Link(name.to_owned(), ino));
        Ok(ino)
    }

    /// A hard link `dir`/`name` to file `ino`.
    pub fn link(&mut self, ino: Ino, dir: Ino, name: &OsStr) -> Result<(), Errno> {
        self.live()?;
        self.file(ino)?;
        if self.dir(dir)?.current.contains_key(name) {
            return Err(Errno::EXIST);
        }
        self.file_mut(ino)?.links += 1;
        let d = self.dir_mut(dir)?;
        d.current.insert(name.to_owned(), ino);
        d.pending.push(NameOp::Link(name.to_owned(), ino));
        Ok(())
    }

    pub fn unlink(&mut self, dir: Ino, name: &OsStr) -> Result<(), Errno> {
        self.live()?;
        let ino = self.lookup(dir, name)?;
        self.file(ino)?;
        let d = self.dir_mut(dir)?;
        d.current.remove(name);
        d.pending.push(NameOp::Unlink(name.to_owned()));
        let f = self.file_mut(ino)?;
        f.links = f.links.saturating_sub(1);
        Ok(())
    }

    /// Renames a file (an un-synced name change) or a directory (written through).
    /// `noreplace` fails with EEXIST where the target exists.
    pub fn rename(
        &mut self,
        m: &mut dyn Mirror,
        dir: Ino,
        name: &OsStr,
        to_dir: Ino,
        to_name: &OsStr,
        noreplace: bool,
    ) -> Result<(), Errno> {
        self.live()?;
        let ino = self.lookup(dir, name)?;
        self.dir(to_dir)?;
        let target = self.dir(to_dir)?.current.get(to_name).copied();
        if dir == to_dir && name == to_name {
            return if noreplace { Err(Errno::EXIST) } else { Ok(()) };
        }
        if target.is_some() && noreplace {
            return Err(Errno::EXIST);
        }
        match self.kind(ino)? {
            Kind::Dir => self.rename_dir(m, ino, dir, name, to_dir, to_name, target),
            Kind::File => {
                if let Some(t) = target {
                    if self.kind(t)? == Kind::Dir {
                        return Err(Errno::ISDIR);
                    }
                    if t == ino {
                        // Two names of one file: rename(2) does nothing.
                        return Ok(());
                    }
                    let f = self.file_mut(t)?;
                    f.links = f.links.saturating_sub(1);
                }
                if dir == to_dir {
                    let d = self.dir_mut(dir)?;
                    d.current.remove(name);
                    d.current.insert(to_name.to_owned(), ino);
                    d.pending
                        .push(NameOp::Rename(name.to_owned(), to_name.to_owned()));
                } else {
                    let d = self.dir_mut(dir)?;
                    d.current.remove(name);
                    d.pending.push(NameOp::Unlink(name.to_owned()));
                    let t = self.dir_mut(to_dir)?;
                    t.current.insert(to_name.to_owned(), ino);
                    t.pending.push(NameOp::Link(to_name.to_owned(), ino));
                }
                Ok(())
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn rename_dir(
        &mut self,
        m: &mut dyn Mirror,
        ino: Ino,
        dir: Ino,
        name: &OsStr,
        to_dir: Ino,
        to_name: &OsStr,
        target: Option<Ino>,
    ) -> Result<(), Errno> {
        if target.is_some() {
            // Replacing a name by a directory is not needed by the programs under test.
            return Err(Errno::EXIST);
        }
        // A directory may not move below itself.
        let mut up = to_dir;
        loop {
            if up == ino {
                return Err(Errno::INVAL);
            }
            if up == ROOT {
                break;
            }
            up = self.dir(up)?.parent;
        }
        self.commit_dir(m, dir, usize::MAX)?;
        self.commit_dir(m, to_dir, usize::MAX)?;
        let from = self.dir_path(dir)?.join(name);
        let to = self.dir_path(to_dir)?.join(to_name);
        m.apply(Durable::RenameDir {
            from: &from,
            to: &to,
        })
        .map_err(|_| Errno::IO)?;
        for (d, add) in [(dir, false), (to_dir, true)] {
            let d = self.dir_mut(d)?;
            if add {
                d.current.insert(to_name.to_owned(), ino);
                d.durable.insert(to_name.to_owned(), ino);
            } else {
                d.current.remove(name);
                d.durable.remove(name);
            }
        }
        let me = self.dir_mut(ino)?;
        me.parent = to_dir;
        me.name = to_name.to_owned();
        // Durable names of files below moved with it.
        Ok(())
    }

    /// A new directory, written through: its parent's earlier name changes are made
    /// durable first, then the directory itself.
    #[allow(clippy::too_many_arguments)]
    pub fn mkdir(
        &mut self,
        m: &mut dyn Mirror,
        dir: Ino,
        name: &OsStr,
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> Result<Ino, Errno> {
        self.live()?;
        if self.dir(dir)?.current.contains_key(name) {
            return Err(Errno::EXIST);
        }
        self.commit_dir(m, dir, usize::MAX)?;
        let path = self.dir_path(dir)?.join(name);
        m.apply(Durable::Mkdir { path: &path, perm })
            .map_err(|_| Errno::IO)?;
        self.add_dir(dir, name, Meta::new(perm, uid, gid))
    }

    /// A new directory `name` in `dir`, its name durable and current at once (a mkdir is
    /// written through; a loaded one was found durable).
    fn add_dir(&mut self, dir: Ino, name: &OsStr, meta: Meta) -> Result<Ino, Errno> {
        let ino = self.alloc(
            meta,
            Body::Dir(DirNode {
                parent: dir,
                name: name.to_owned(),
                ..DirNode::default()
            }),
        );
        let d = self.dir_mut(dir)?;
        d.current.insert(name.to_owned(), ino);
        d.durable.insert(name.to_owned(), ino);
        Ok(ino)
    }

    /// Removes an empty directory, written through (with whatever durable names were
    /// still in it, and its parent's earlier name changes).
    pub fn rmdir(&mut self, m: &mut dyn Mirror, dir: Ino, name: &OsStr) -> Result<(), Errno> {
        self.live()?;
        let ino = self.lookup(dir, name)?;
        if !self.dir(ino)?.current.is_empty() {
            return Err(Errno::NOTEMPTY);
        }
        self.commit_dir(m, ino, usize::MAX)?;
        self.commit_dir(m, dir, usize::MAX)?;
        let path = self.dir_path(ino)?;
        m.apply(Durable::Rmdir { path: &path })
            .map_err(|_| Errno::IO)?;
        let d = self.dir_mut(dir)?;
        d.current.remove(name);
        d.durable.remove(name);
        self.nodes.remove(&ino);
        Ok(())
    }

    pub fn write(&mut self, ino: Ino, at: u64, data: &[u8]) -> Result<(), Errno> {
        self.live()?;
        let change = Change::Write {
            at,
            data: data.to_vec(),
        };
        let f = self.file_mut(ino)?;
        change.apply(&mut f.current);
        f.pending.push(change);
        self.touch(ino);
        Ok(())
    }

    pub fn set_len(&mut self, ino: Ino, len: u64) -> Result<(), Errno> {
        self.live()?;
        let f = self.file_mut(ino)?;
        if f.current.len() as u64 == len {
            return Ok(());
        }
        let change = Change::SetLen(len);
        change.apply(&mut f.current);
        f.pending.push(change);
        self.touch(ino);
        Ok(())
    }

    fn touch(&mut self, ino: Ino) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            let now = SystemTime::now();
            n.meta.mtime = now;
            n.meta.ctime = now;
        }
    }

    /// Changes the permission bits, written through (metadata other than size is not
    /// modelled).
    pub fn set_perm(&mut self, m: &mut dyn Mirror, ino: Ino, perm: u16) -> Result<(), Errno> {
        self.live()?;
        let path = match self.kind(ino)? {
            Kind::Dir => Some(self.dir_path(ino)?),
            Kind::File => self.durable_path(ino)?,
        };
        if let Some(path) = path {
            m.apply(Durable::Perm { path: &path, perm })
                .map_err(|_| Errno::IO)?;
        }
        let n = self.nodes.get_mut(&ino).ok_or_else(not_found)?;
        n.meta.perm = perm;
        n.meta.ctime = SystemTime::now();
        Ok(())
    }

    pub fn set_owner(&mut self, ino: Ino, uid: Option<u32>, gid: Option<u32>) -> Result<(), Errno> {
        self.live()?;
        let n = self.nodes.get_mut(&ino).ok_or_else(not_found)?;
        if let Some(u) = uid {
            n.meta.uid = u;
        }
        if let Some(g) = gid {
            n.meta.gid = g;
        }
        Ok(())
    }

    pub fn set_times(
        &mut self,
        ino: Ino,
        atime: Option<SystemTime>,
        mtime: Option<SystemTime>,
    ) -> Result<(), Errno> {
        self.live()?;
        let n = self.nodes.get_mut(&ino).ok_or_else(not_found)?;
        if let Some(a) = atime {
            n.meta.atime = a;
        }
        if let Some(t) = mtime {
            n.meta.mtime = t;
        }
        Ok(())
    }
}

mod durable;

#[cfg(test)]
mod tests;
