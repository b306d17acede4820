//! The backing directory: the durable state on a real disk. The model's durable steps are
//! applied to it as they happen ([`BackingDir`] is a [`Mirror`]); a mount loads it back.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::Error;
use crate::model::{Change, Durable, Ino, Mirror, Model, Names, ROOT};

/// The backing directory's root.
pub struct BackingDir {
    root: PathBuf,
}

impl BackingDir {
    pub fn new(root: &Path) -> BackingDir {
        BackingDir {
            root: root.to_path_buf(),
        }
    }

    fn at(&self, rel: &Path) -> PathBuf {
        self.root.join(rel)
    }
}

fn remove_if_there(p: &Path) -> io::Result<()> {
    match fs::remove_file(p) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

impl Mirror for BackingDir {
    fn apply(&mut self, step: Durable<'_>) -> io::Result<()> {
        match step {
            Durable::Data { path, change } => {
                let f = fs::OpenOptions::new().write(true).open(self.at(path))?;
                match change {
                    Change::Write { at, data } => f.write_all_at(data, *at),
                    Change::SetLen(len) => f.set_len(*len),
                }
            }
            Durable::Link {
                path,
                like,
                content,
                perm,
            } => {
                let to = self.at(path);
                remove_if_there(&to)?;
                match like {
                    Some(like) => fs::hard_link(self.at(like), &to),
                    None => {
                        let f = fs::OpenOptions::new()
                            .write(true)
                            .create_new(true)
                            .mode(u32::from(perm))
                            .open(&to)?;
                        f.write_all_at(content, 0)?;
                        // The creation mode passed the umask; the model's is exact.
                        f.set_permissions(fs::Permissions::from_mode(u32::from(perm)))
                    }
                }
            }
            Durable::Unlink { path } => remove_if_there(&self.at(path)),
            Durable::Rename { from, to } | Durable::RenameDir { from, to } => {
                fs::rename(self.at(from), self.at(to))
            }
            Durable::Mkdir { path, perm } => {
                let p = self.at(path);
                fs::DirBuilder::new().mode(u32::from(perm)).create(&p)?;
                fs::set_permissions(&p, fs::Permissions::from_mode(u32::from(perm)))
            }
            Durable::Rmdir { path } => fs::remove_dir_all(self.at(path)),
            Durable::Perm { path, perm } => {
                fs::set_permissions(self.at(path), fs::Permissions::from_mode(u32::from(perm)))
            }
        }
    }
}

/// Reads the backing directory into a model whose current and durable states are both
/// what it holds. Only directories and regular files may be in it.
pub fn load(root: &Path, names: Names) -> Result<Model, Error> {
    let md = fs::metadata(root).map_err(|source| Error::Backing {
        path: root.to_path_buf(),
        source,
    })?;
    if !md.is_dir() {
        return Err(Error::NotADirectory(root.to_path_buf()));
    }
    let mut model = Model::new(names, perm(&md), md.uid(), md.gid());
    let mut seen = HashMap::new();
    load_dir(&mut model, root, ROOT, &mut seen)?;
    Ok(model)
}

fn perm(md: &fs::Metadata) -> u16 {
    (md.mode() & 0o7777) as u16
}

fn load_dir(
    model: &mut Model,
    at: &Path,
    dir: Ino,
    seen: &mut HashMap<(u64, u64), Ino>,
) -> Result<(), Error> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Backing { path, source }
    };
    let mut entries: Vec<fs::DirEntry> = fs::read_dir(at)
        .map_err(io(at))?
        .collect::<Result<_, _>>()
        .map_err(io(at))?;
    entries.sort_by_key(fs::DirEntry::file_name);
    for e in entries {
        let path = e.path();
        let md = fs::symlink_metadata(&path).map_err(io(&path))?;
        let meta = (perm(&md), md.uid(), md.gid());
        let name = e.file_name();
        let model_err = |_| Error::Unsupported(path.clone());
        if md.is_dir() {
            let ino = model.load_dir(dir, &name, meta).map_err(model_err)?;
            load_dir(model, &path, ino, seen)?;
        } else if md.is_file() {
            let key = (md.dev(), md.ino());
            let same = seen.get(&key).copied();
            let content = match same {
                Some(_) => Vec::new(),
                None => fs::read(&path).map_err(io(&path))?,
            };
            let ino = model
                .load_file(dir, &name, meta, content, same)
                .map_err(model_err)?;
            seen.insert(key, ino);
        } else {
            return Err(Error::Unsupported(path));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Cut;
    use std::ffi::OsStr;

    /// The mirror holds exactly the durable state: after a cut, the backing directory
    /// loaded again equals the model rebooted in memory, for whole and prefix cuts over a
    /// mix of writes, truncations, creates, renames (in and across directories), links
    /// and unlinks, some synced and some not.
    #[test]
    fn the_backing_directory_is_the_durable_state() {
        for (names, how) in [
            (Names::Strict, Cut::Whole),
            (Names::Journaled, Cut::Whole),
            (Names::Strict, Cut::Prefix { seed: 7 }),
            (Names::Journaled, Cut::Prefix { seed: 11 }),
            (Names::Strict, Cut::Prefix { seed: 12345 }),
        ] {
            let tmp = tempfile::tempdir().expect("tmp");
            let mut b = BackingDir::new(tmp.path());
            let mut m = Model::new(names, 0o755, 0, 0);
            let n = OsStr::new;
            let a = m.mkdir(&mut b, ROOT, n("a"), 0o700, 0, 0).expect("mkdir");
            let c = m.mkdir(&mut b, ROOT, n("c"), 0o755, 0, 0).expect("mkdir");
            let f = m.create(a, n("f"), 0o600, 0, 0).expect("create");
            m.write(f, 0, b"hello world").expect("write");
            m.fsync(&mut b, f).expect("fsync");
            m.fsync_dir(&mut b, a).expect("fsync dir");
            m.write(f, 6, b"there").expect("write");
            m.set_len(f, 8).expect("truncate");
            m.write(f, 20, b"tail").expect("write");
            let g = m.create(a, n("g.tmp"), 0o644, 0, 0).expect("create");
            m.write(g, 0, b"new g").expect("write");
            m.fsync(&mut b, g).expect("fsync");
            m.rename(&mut b, a, n("g.tmp"), a, n("g"), false)
                .expect("rename");
            m.link(f, c, n("f2")).expect("link");
            m.fsync_dir(&mut b, c).expect("fsync c");
            m.rename(&mut b, a, n("f"), c, n("moved"), false)
                .expect("rename across");
            let h = m.create(c, n("h"), 0o644, 0, 0).expect("create");
            m.write(h, 0, b"h data").expect("write");
            m.unlink(c, n("f2")).expect("unlink");
            m.write(g, 0, b"G").expect("write");
            m.cut(&mut b, how).expect("cut");
            m.reboot();
            let loaded = load(tmp.path(), names).expect("load");
            assert_eq!(
                loaded.snapshot(),
                m.snapshot(),
                "{names:?} {how:?}: the backing directory differs from the durable state"
            );
        }
    }
}
