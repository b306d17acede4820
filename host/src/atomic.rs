//! Replacing a file atomically and durably: the body goes into a temp file beside the
//! destination, is fsynced, renamed over the destination, and the directory is fsynced, so
//! after a crash the name holds either the old file or the whole new one, and a completed
//! write survives a power cut. The hub's token, the agent's `waits.json`, the CLI's
//! spool files and its `--cursor` files are all written here.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A temp file created exclusively (`O_EXCL`), not yet in place. Dropped without
/// [`TempFile::commit`], it stays on disk: the caller chose its name, and a reader of the
/// directory must already ignore names like it.
#[derive(Debug)]
pub struct TempFile {
    path: PathBuf,
    file: File,
}

impl TempFile {
    /// Creates `path` with `mode` (before the umask); fails with `AlreadyExists` if it is
    /// there, so a caller that picks fresh names can pick again.
    pub fn create_new(path: PathBuf, mode: u32) -> io::Result<TempFile> {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)?;
        Ok(TempFile { path, file })
    }

    /// The temp file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `body`, fsyncs, renames the file to `to` (in the same directory) and fsyncs
    /// the directory. On any failure the temp file is removed and the error returned; `to`
    /// is then either untouched or already the whole new file.
    pub fn commit(mut self, body: &[u8], to: &Path) -> io::Result<()> {
        let dir = to.parent().filter(|d| !d.as_os_str().is_empty());
        let result = self
            .file
            .write_all(body)
            .and_then(|()| self.file.sync_all())
            .and_then(|()| std::fs::rename(&self.path, to))
            .and_then(|()| File::open(dir.unwrap_or(Path::new(".")))?.sync_all());
        if result.is_err() {
            let _ = std::fs::remove_file(&self.path);
        }
        result
    }
}

/// Replaces `path` with `body`, atomically and durably (see the module docs). The temp
/// file is `.NAME.PID.tmp` beside it, created with `mode` (before the umask); one left by
/// an earlier process with this pid is removed first, so its mode never carries over.
pub fn write_file(path: &Path, body: &[u8], mode: u32) -> io::Result<()> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        )
    })?;
    let tmp = path.with_file_name(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let file = match TempFile::create_new(tmp.clone(), mode) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(&tmp)?;
            TempFile::create_new(tmp, mode)?
        }
        other => other?,
    };
    file.commit(body, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).expect("meta").permissions().mode() & 0o777
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn replaces_the_file_whole_with_its_mode_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("token");
        write_file(&path, b"one\n", 0o600).expect("write");
        assert_eq!(std::fs::read(&path).expect("read"), b"one\n");
        assert_eq!(mode(&path), 0o600);
        write_file(&path, b"two\n", 0o600).expect("replace");
        assert_eq!(std::fs::read(&path).expect("read"), b"two\n");
        assert_eq!(names(dir.path()), ["token"]);
    }

    #[test]
    fn a_stale_temp_file_of_this_pid_is_replaced_not_reused() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("waits.json");
        let stale = dir
            .path()
            .join(format!(".waits.json.{}.tmp", std::process::id()));
        std::fs::write(&stale, b"stale and longer than the body").expect("stale");
        std::fs::set_permissions(&stale, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        write_file(&path, b"{}\n", 0o600).expect("write");
        assert_eq!(std::fs::read(&path).expect("read"), b"{}\n");
        assert_eq!(
            mode(&path),
            0o600,
            "the stale file's mode did not carry over"
        );
        assert_eq!(names(dir.path()), ["waits.json"]);
    }

    #[test]
    fn a_failed_write_removes_its_temp_file_and_keeps_the_old_one() {
        let dir = tempfile::tempdir().expect("tmp");
        // Renaming a file over a directory fails after the body was written.
        let target = dir.path().join("cursor");
        std::fs::create_dir(&target).expect("mkdir");
        std::fs::write(target.join("inside"), b"x").expect("write");
        let e = write_file(&target, b"new", 0o600).expect_err("a directory is in the way");
        assert_ne!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert_eq!(names(dir.path()), ["cursor"]);
        assert_eq!(names(&target), ["inside"]);
    }

    #[test]
    fn create_new_refuses_an_existing_name() {
        let dir = tempfile::tempdir().expect("tmp");
        let tmp = dir.path().join("1-2-3.tmp");
        let t = TempFile::create_new(tmp.clone(), 0o600).expect("create");
        assert_eq!(t.path(), tmp);
        let e = TempFile::create_new(tmp.clone(), 0o600).expect_err("exists");
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        t.commit(b"{}", &dir.path().join("1-2-3.json"))
            .expect("commit");
        assert_eq!(names(dir.path()), ["1-2-3.json"]);
        assert_eq!(mode(&dir.path().join("1-2-3.json")), 0o600);
    }

    #[test]
    fn a_path_that_names_no_file_is_refused() {
        let e = write_file(Path::new("/"), b"x", 0o600).expect_err("no name");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
