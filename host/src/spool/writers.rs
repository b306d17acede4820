//! Whether some process still has a spool file open for writing, read from `/proc`: every
//! process's `fd/` entries are compared (device and inode) with the file, and a match's
//! `fdinfo` says whether that descriptor was opened for writing.
//!
//! The kernel's own answer, a read lease (`fcntl(F_SETLEASE, F_RDLCK)`, refused with EAGAIN
//! while any descriptor is open for writing), needs `unsafe` here (neither rustix nor nix
//! wraps it), which this workspace forbids. `/proc` gives the same answer for every process
//! this one may inspect: all of the spool owner's (the only uid allowed to write there),
//! and every process when the daemon runs as root. Where `/proc` cannot be read the answer
//! is "unknown", and the caller falls back to watching the file's size and times.
//!
//! The walk costs one `stat` per open descriptor on the machine (a few milliseconds for tens
//! of thousands), and runs only for a file that failed to parse.

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// `O_ACCMODE` bits of `fdinfo`'s `flags:` (octal): 1 is `O_WRONLY`, 2 `O_RDWR`.
const ACCMODE: u32 = 0o3;

/// `Some(true)` when a process has the file `(dev, ino)` open for writing, `Some(false)`
/// when none this process can see has, `None` when `/proc` cannot be read at all.
pub(super) fn open_for_writing(dev: u64, ino: u64) -> Option<bool> {
    open_for_writing_in(Path::new("/proc"), dev, ino)
}

fn open_for_writing_in(proc: &Path, dev: u64, ino: u64) -> Option<bool> {
    // Our own descriptors must be readable, or `/proc` is not what we expect.
    std::fs::read_dir(proc.join("self/fd")).ok()?;
    let procs = std::fs::read_dir(proc).ok()?;
    for p in procs.flatten() {
        let pid = p.file_name();
        if !is_pid(&pid) {
            continue;
        }
        // Another user's process (EACCES), or one that just exited: not ours to see.
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            // Follows the descriptor's link to the open file itself, whatever its path.
            let Ok(md) = std::fs::metadata(fd.path()) else {
                continue;
            };
            if md.dev() == dev && md.ino() == ino && writable(&p.path(), &fd.file_name()) {
                return Some(true);
            }
        }
    }
    Some(false)
}

fn is_pid(name: &OsStr) -> bool {
    let b = name.as_encoded_bytes();
    !b.is_empty() && b.iter().all(u8::is_ascii_digit)
}

/// Whether descriptor `fd` of the process at `pid_dir` was opened for writing. A descriptor
/// that closed in between is not.
fn writable(pid_dir: &Path, fd: &OsStr) -> bool {
    let Ok(info) = std::fs::read_to_string(pid_dir.join("fdinfo").join(fd)) else {
        return false;
    };
    info.lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
        .is_some_and(|flags| matches!(flags & ACCMODE, 1 | 2))
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    use super::open_for_writing;

    #[test]
    fn a_file_open_for_writing_is_seen_and_a_closed_or_read_one_is_not() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("x.json");
        let mut w = std::fs::File::create(&path).expect("create");
        w.write_all(b"{\"id\":").expect("write");
        let md = std::fs::metadata(&path).expect("stat");
        assert_eq!(open_for_writing(md.dev(), md.ino()), Some(true));
        drop(w);
        assert_eq!(open_for_writing(md.dev(), md.ino()), Some(false));
        let _reader = std::fs::File::open(&path).expect("open");
        assert_eq!(
            open_for_writing(md.dev(), md.ino()),
            Some(false),
            "a reader is not a writer"
        );
    }

    #[test]
    fn a_writer_in_another_process_is_seen() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("y.json");
        std::fs::write(&path, b"{").expect("create");
        let md = std::fs::metadata(&path).expect("stat");
        // `sleep` holds the file open for appending (the shell's `>>`) until killed.
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg("exec sleep 30 >> \"$0\"")
            .arg(&path)
            .spawn()
            .expect("sh");
        let seen = (0..200).any(|_| {
            let s = open_for_writing(md.dev(), md.ino()) == Some(true);
            if !s {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            s
        });
        let _ = child.kill();
        let _ = child.wait();
        assert!(seen, "the child's descriptor was never seen");
        assert_eq!(open_for_writing(md.dev(), md.ino()), Some(false));
    }
}
