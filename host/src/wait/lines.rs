//! The pure half of a log wait: bytes read from a file, in chunks of any size, turned into
//! complete lines (each with its byte offset in the file), matched against the pattern,
//! with the few lines before kept for the payload; and where to start reading a file from
//! a cursor. No I/O, so every rule is a table test.
//!
//! A line is complete when its `\n` is read; the bytes after the last `\n` wait (at most
//! [`MAX_PARTIAL_BYTES`] of them: a longer line is matched on its first part) for the rest.
//! A trailing `\r` is not part of a line. Invalid UTF-8 is read lossily.

use std::collections::VecDeque;

use cortex_protocol::mesh::LogCursor;
use cortex_protocol::waits::{LOG_LINE_MAX_BYTES, LOG_LINES_BEFORE};
use regex::Regex;

/// The most of one line kept while waiting for its newline, and matched.
pub const MAX_PARTIAL_BYTES: usize = 64 * 1024;

/// Bytes of a line kept for the payload's `before`: enough to cut it at a character
/// boundary to [`LOG_LINE_MAX_BYTES`] and still know it was longer.
const KEPT_BYTES: usize = LOG_LINE_MAX_BYTES + 8;

/// A line that matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// Cut to [`LOG_LINE_MAX_BYTES`] ([`cut_line`]).
    pub line: String,
    /// Up to [`LOG_LINES_BEFORE`] lines before it, oldest first, each cut the same way.
    pub before: Vec<String>,
    /// The offset of the line's first byte in the file.
    pub offset: u64,
    /// The offset just after its `\n`: where reading goes on.
    pub end: u64,
}

/// Splits what is read from one file into lines and matches them.
#[derive(Debug)]
pub struct Scanner {
    regex: Regex,
    /// The bytes of the line not yet ended, at most [`MAX_PARTIAL_BYTES`].
    partial: Vec<u8>,
    /// The file offset of the first byte of `partial`.
    partial_start: u64,
    /// The file offset of the next byte to be fed.
    next: u64,
    before: VecDeque<Vec<u8>>,
}

impl Scanner {
    /// A scanner whose next byte is the file's byte `at`.
    pub fn new(regex: Regex, at: u64) -> Scanner {
        Scanner {
            regex,
            partial: Vec::new(),
            partial_start: at,
            next: at,
            before: VecDeque::with_capacity(LOG_LINES_BEFORE + 1),
        }
    }

    /// The offset of the next byte to feed.
    pub fn next_offset(&self) -> u64 {
        self.next
    }

    /// The offset where the line not yet ended starts.
    pub fn line_start(&self) -> u64 {
        self.partial_start
    }

    /// Starts over at `at` (another file, or this one cut shorter): the unfinished line is
    /// dropped; the lines before are kept as context.
    pub fn restart(&mut self, at: u64) {
        self.partial.clear();
        self.partial_start = at;
        self.next = at;
    }

    /// Starts at `at` in the middle of a line whose first bytes, `head`, lie before it
    /// (what a read of the bytes before `at` found after their last `\n`): the line is
    /// matched whole when it ends.
    pub fn resume_mid_line(&mut self, at: u64, head: &[u8]) {
        self.restart(at);
        let keep = head.len().min(MAX_PARTIAL_BYTES);
        self.partial.extend_from_slice(&head[..keep]);
        self.partial_start = at - head.len() as u64;
    }

    /// Feeds the next bytes of the file; returns the first line among them that matches,
    /// if any. After a hit the rest of `chunk` is not looked at (the wait is over).
    pub fn feed(&mut self, chunk: &[u8]) -> Option<Hit> {
        let mut rest = chunk;
        while !rest.is_empty() {
            match memchr_newline(rest) {
                None => {
                    let room = MAX_PARTIAL_BYTES.saturating_sub(self.partial.len());
                    self.partial
                        .extend_from_slice(&rest[..rest.len().min(room)]);
                    self.next += rest.len() as u64;
                    return None;
                }
                Some(i) => {
                    let room = MAX_PARTIAL_BYTES.saturating_sub(self.partial.len());
                    self.partial.extend_from_slice(&rest[..i.min(room)]);
                    self.next += i as u64 + 1;
                    rest = &rest[i + 1..];
                    let start = self.partial_start;
                    let line = std::mem::take(&mut self.partial);
                    self.partial_start = self.next;
                    if let Some(hit) = self.line(line, start) {
                        return Some(hit);
                    }
                }
            }
        }
        None
    }

    fn line(&mut self, mut line: Vec<u8>, start: u64) -> Option<Hit> {
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        let text = String::from_utf8_lossy(&line);
        if self.regex.is_match(&text) {
            return Some(Hit {
                line: cut_line(&line),
                before: self.before.iter().map(|b| cut_line(b)).collect(),
                offset: start,
                end: self.next,
            });
        }
        line.truncate(KEPT_BYTES);
        if self.before.len() == LOG_LINES_BEFORE {
            self.before.pop_front();
        }
        self.before.push_back(line);
        None
    }
}

fn memchr_newline(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

/// A line for a payload: lossy UTF-8, cut to [`LOG_LINE_MAX_BYTES`] at a character
/// boundary, with `…` when it was longer.
pub fn cut_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(KEPT_BYTES)]);
    if bytes.len() <= LOG_LINE_MAX_BYTES && text.len() <= LOG_LINE_MAX_BYTES {
        return text.into_owned();
    }
    let mut end = LOG_LINE_MAX_BYTES.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The file at the name as a log wait sees it: its identity and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileState {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
}

/// Where to start reading the file found at the name when a log wait is armed: from a
/// cursor, the same file at least as long reads on from the cursor's offset, another file
/// (rotated) or a shorter one (truncated) from 0, and a file that was not there when the
/// cursor was taken from 0; without a cursor, from the end.
pub fn start_offset(cursor: Option<&LogCursor>, now: &FileState) -> u64 {
    match cursor {
        None => now.size,
        Some(c) if c.exists && c.dev == now.dev && c.ino == now.ino && now.size >= c.offset => {
            c.offset
        }
        Some(_) => 0,
    }
}

/// What a look at the file means for a reader at `offset` in the file `reading`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Read on from the offset (there may be nothing new).
    ReadOn,
    /// The file was cut below the offset (`copytruncate`): read it again from 0.
    Truncated,
    /// Another file has the name now (rotated by rename): finish the old one through the
    /// descriptor held, then read the new one from 0.
    Rotated,
}

/// `reading`: the file read (its `fstat` now); `at_name`: what the name leads to now
/// (`None`: nothing, the old file was moved away or deleted and nothing replaced it yet,
/// so the old one is still read: its writer may not have noticed).
pub fn turn(reading: &FileState, offset: u64, at_name: Option<&FileState>) -> Turn {
    match at_name {
        Some(n) if (n.dev, n.ino) != (reading.dev, reading.ino) => Turn::Rotated,
        _ if reading.size < offset => Turn::Truncated,
        _ => Turn::ReadOn,
    }
}
