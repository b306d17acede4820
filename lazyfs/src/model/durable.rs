//! The model's durability: fsync and its kin making changes durable (each step handed to
//! the [`Mirror`]), the power cut that drops what was not, the reboot after it, and a
//! durable state loaded back from the backing tree.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::PathBuf;

use super::{
    Body, Cut, CutReport, Durable, Errno, FileNode, Ino, Kind, Meta, Mirror, Model, NameOp, Names,
    ROOT, Rng,
};

impl Model {
    // ---- making things durable ----

    /// `fsync`/`fdatasync` of a file: its data becomes durable (and, with
    /// [`Names::Journaled`], every name change so far).
    pub fn fsync(&mut self, m: &mut dyn Mirror, ino: Ino) -> Result<(), Errno> {
        self.live()?;
        if self.kind(ino)? == Kind::Dir {
            return self.fsync_dir(m, ino);
        }
        if self.names == Names::Journaled {
            self.commit_all_names(m)?;
        }
        self.commit_file(m, ino, usize::MAX)
    }

    /// `fsync` of a directory: its name changes become durable (and, with
    /// [`Names::Journaled`], every other directory's).
    pub fn fsync_dir(&mut self, m: &mut dyn Mirror, dir: Ino) -> Result<(), Errno> {
        self.live()?;
        self.dir(dir)?;
        if self.names == Names::Journaled {
            self.commit_all_names(m)
        } else {
            self.commit_dir(m, dir, usize::MAX)
        }
    }

    /// `sync(2)`: everything becomes durable.
    pub fn sync_all(&mut self, m: &mut dyn Mirror) -> Result<(), Errno> {
        self.live()?;
        self.commit_all_names(m)?;
        for ino in self.sorted(Kind::File) {
            self.commit_file(m, ino, usize::MAX)?;
        }
        Ok(())
    }

    fn sorted(&self, kind: Kind) -> Vec<Ino> {
        let mut v: Vec<Ino> = self
            .nodes
            .iter()
            .filter(|(_, n)| match n.body {
                Body::File(_) => kind == Kind::File,
                Body::Dir(_) => kind == Kind::Dir,
            })
            .map(|(i, _)| *i)
            .collect();
        v.sort_unstable();
        v
    }

    fn commit_all_names(&mut self, m: &mut dyn Mirror) -> Result<(), Errno> {
        for dir in self.sorted(Kind::Dir) {
            self.commit_dir(m, dir, usize::MAX)?;
        }
        Ok(())
    }

    /// One current name of file `ino`, if it has any.
    fn current_path(&self, ino: Ino) -> Result<Option<PathBuf>, Errno> {
        for (dir, n) in &self.nodes {
            if let Body::Dir(d) = &n.body
                && let Some((name, _)) = d.current.iter().find(|(_, i)| **i == ino)
            {
                return Ok(Some(self.dir_path(*dir)?.join(name)));
            }
        }
        Ok(None)
    }

    /// One durable name of file `ino`, if it has any.
    pub(super) fn durable_path(&self, ino: Ino) -> Result<Option<PathBuf>, Errno> {
        let f = self.file(ino)?;
        match f.durable_links.iter().next() {
            Some((d, n)) => Ok(Some(self.dir_path(*d)?.join(n))),
            None => Ok(None),
        }
    }

    /// Makes the first `n` of a file's pending changes durable and forgets the rest (all
    /// of them for an fsync; a cut keeps fewer).
    fn commit_file(&mut self, m: &mut dyn Mirror, ino: Ino, n: usize) -> Result<(), Errno> {
        let path = self.durable_path(ino)?;
        let f = self.file_mut(ino)?;
        let pending = std::mem::take(&mut f.pending);
        for change in pending.iter().take(n) {
            change.apply(&mut f.durable);
            if let Some(path) = &path {
                m.apply(Durable::Data { path, change })
                    .map_err(|_| Errno::IO)?;
            }
        }
        Ok(())
    }

    /// Applies the first `n` of a directory's pending name changes to its durable names.
    pub(super) fn commit_dir(
        &mut self,
        m: &mut dyn Mirror,
        dir: Ino,
        n: usize,
    ) -> Result<(), Errno> {
        let base = self.dir_path(dir)?;
        let pending = std::mem::take(&mut self.dir_mut(dir)?.pending);
        for op in pending.into_iter().take(n) {
            match op {
                NameOp::Link(name, ino) => {
                    self.drop_durable_name(dir, &name)?;
                    let path = base.join(&name);
                    let like = self.durable_path(ino)?;
                    let perm = self.node(ino)?.meta.perm;
                    let f = self.file(ino)?;
                    m.apply(Durable::Link {
                        path: &path,
                        like: like.as_deref(),
                        content: &f.durable,
                        perm,
                    })
                    .map_err(|_| Errno::IO)?;
                    self.file_mut(ino)?
                        .durable_links
                        .insert((dir, name.clone()));
                    self.dir_mut(dir)?.durable.insert(name, ino);
                }
                NameOp::Unlink(name) => {
                    if self.drop_durable_name(dir, &name)? {
                        m.apply(Durable::Unlink {
                            path: &base.join(&name),
                        })
                        .map_err(|_| Errno::IO)?;
                    }
                }
                NameOp::Rename(from, to) => {
                    let Some(ino) = self.dir(dir)?.durable.get(&from).copied() else {
                        // Not durable (cannot happen: the rename's source was linked by an
                        // earlier change of this directory, applied first).
                        return Err(Errno::IO);
                    };
                    self.drop_durable_name(dir, &to)?;
                    m.apply(Durable::Rename {
                        from: &base.join(&from),
                        to: &base.join(&to),
                    })
                    .map_err(|_| Errno::IO)?;
                    let d = self.dir_mut(dir)?;
                    d.durable.remove(&from);
                    d.durable.insert(to.clone(), ino);
                    let f = self.file_mut(ino)?;
                    f.durable_links.remove(&(dir, from));
                    f.durable_links.insert((dir, to));
                }
            }
        }
        Ok(())
    }

    /// Removes `dir`/`name` from the durable tree (bookkeeping only); true if it was there.
    fn drop_durable_name(&mut self, dir: Ino, name: &OsStr) -> Result<bool, Errno> {
        let Some(old) = self.dir_mut(dir)?.durable.remove(name) else {
            return Ok(false);
        };
        if let Ok(f) = self.file_mut(old) {
            f.durable_links.remove(&(dir, name.to_owned()));
        }
        Ok(true)
    }

    /// The power cut: every un-synced change is dropped (or, with [`Cut::Prefix`], a
    /// random prefix of each file's and each directory's is made durable first). From
    /// now on every operation fails with EIO; the durable state is final.
    pub fn cut(&mut self, m: &mut dyn Mirror, how: Cut) -> Result<CutReport, Errno> {
        self.live()?;
        self.cut = true;
        let mut rng = match how {
            Cut::Whole => None,
            Cut::Prefix { seed } => Some(Rng(seed)),
        };
        let mut report = CutReport::default();
        for ino in self.sorted(Kind::File) {
            let n = self.file(ino)?.pending.len();
            if n == 0 {
                continue;
            }
            report.files += 1;
            let keep = rng.as_mut().map_or(0, |r| r.upto(n));
            report.changes_kept += keep;
            report.changes_dropped += n - keep;
            let name = match self.current_path(ino)? {
                Some(p) => p,
                None => self
                    .durable_path(ino)?
                    .unwrap_or_else(|| PathBuf::from("?")),
            };
            report.per_file.push((name, keep, n - keep));
            self.commit_file(m, ino, keep)?;
        }
        for dir in self.sorted(Kind::Dir) {
            let n = self.dir(dir)?.pending.len();
            let keep = rng.as_mut().map_or(0, |r| r.upto(n));
            report.names_kept += keep;
            report.names_dropped += n - keep;
            self.commit_dir(m, dir, keep)?;
        }
        Ok(report)
    }

    /// After a cut: the machine comes back with the durable state as the current one.
    pub fn reboot(&mut self) {
        for n in self.nodes.values_mut() {
            match &mut n.body {
                Body::File(f) => {
                    f.current = f.durable.clone();
                    f.pending.clear();
                    f.links = f.durable_links.len() as u32;
                }
                Body::Dir(d) => {
                    d.current = d.durable.clone();
                    d.pending.clear();
                }
            }
        }
        // Files no durable name reaches are gone.
        self.nodes.retain(|_, n| match &n.body {
            Body::File(f) => !f.durable_links.is_empty(),
            Body::Dir(_) => true,
        });
        self.cut = false;
    }

    /// The current tree as paths: files with their data, directories with `None`.
    pub fn snapshot(&self) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
        let mut out = BTreeMap::new();
        self.walk(ROOT, PathBuf::new(), &mut out);
        out
    }

    fn walk(&self, dir: Ino, at: PathBuf, out: &mut BTreeMap<PathBuf, Option<Vec<u8>>>) {
        let Ok(d) = self.dir(dir) else { return };
        for (name, ino) in &d.current {
            let p = at.join(name);
            match self.nodes.get(ino).map(|n| &n.body) {
                Some(Body::File(f)) => {
                    out.insert(p, Some(f.current.clone()));
                }
                Some(Body::Dir(_)) => {
                    out.insert(p.clone(), None);
                    self.walk(*ino, p, out);
                }
                None => {}
            }
        }
    }

    // ---- loading a durable state ----

    /// Adds a directory found in the backing tree (durable and current).
    pub fn load_dir(
        &mut self,
        dir: Ino,
        name: &OsStr,
        meta: (u16, u32, u32),
    ) -> Result<Ino, Errno> {
        self.add_dir(dir, name, Meta::new(meta.0, meta.1, meta.2))
    }

    /// Adds a file found in the backing tree; `same` is an inode already loaded for
    /// another name of the same file (a hard link).
    pub fn load_file(
        &mut self,
        dir: Ino,
        name: &OsStr,
        meta: (u16, u32, u32),
        content: Vec<u8>,
        same: Option<Ino>,
    ) -> Result<Ino, Errno> {
        let ino = match same {
            Some(i) => i,
            None => self.alloc(
                Meta::new(meta.0, meta.1, meta.2),
                Body::File(FileNode {
                    durable: content.clone(),
                    current: content,
                    ..FileNode::default()
                }),
            ),
        };
        let f = self.file_mut(ino)?;
        f.links += 1;
        f.durable_links.insert((dir, name.to_owned()));
        let d = self.dir_mut(dir)?;
        d.current.insert(name.to_owned(), ino);
        d.durable.insert(name.to_owned(), ino);
        Ok(ino)
    }
}
