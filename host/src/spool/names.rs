//! What a spool entry's name says it is, and names as they are logged and parked.

use std::io;

use rustix::fs::FileType;

use super::{CANDIDATE_SUFFIX, MAX_PARKED_NAME};

/// An odd spool entry: see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Odd {
    /// A name without `.json` (and not a temporary): logged once.
    NotJson,
    /// A directory named `*.json`: parked.
    Directory,
    /// A name that is not UTF-8: parked under its escape.
    NotUtf8,
}

/// A writer's temporary: a dotfile (the collector lock among them) or `NAME.tmp`.
pub(super) fn is_temporary(name: &[u8]) -> bool {
    name.starts_with(b".") || name.ends_with(b".tmp")
}

/// A name as text, losslessly: UTF-8 is kept, a backslash doubled, every other byte
/// written `\xNN`.
pub fn escape_name(name: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(name.len());
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// At most [`MAX_PARKED_NAME`] bytes of `name`, cut on a character boundary.
pub(super) fn cut_name(name: &str) -> String {
    if name.len() <= MAX_PARKED_NAME {
        return name.to_owned();
    }
    let mut end = MAX_PARKED_NAME;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_owned()
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
pub(super) fn check_name(name: &str) -> io::Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a plain file name"),
        ));
    }
    Ok(())
}

pub(super) fn file_kind(ft: FileType) -> &'static str {
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
