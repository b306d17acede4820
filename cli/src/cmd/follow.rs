//! Following a session's event log live: the hub's SSE stream read as it arrives (on a
//! thread of its own, so silence can be bounded), and reconnected, a bounded number of
//! times in a row, after the last stored event it delivered when the stream drops.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::thread;
use std::time::Duration;

use crate::hub::{Hub, HubError, segment};
use crate::sse::{self, Parser, SseError};

use super::render::Out;

/// The largest event the stream may carry (a step's whole text, a wake with its signals).
pub const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;
/// The hub sends a keep-alive comment every 15 s; this long without a byte means the
/// connection is dead even if no error says so.
const IDLE: Duration = Duration::from_secs(45);
/// Failed connections in a row before giving up.
const ATTEMPTS: u32 = 8;
const BACKOFF_START: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("session {sid} does not exist (or was deleted)")]
    Gone { sid: String },
    #[error("lost the event stream of session {sid} ({reason}); gave up after {attempts} tries")]
    Lost {
        sid: String,
        reason: String,
        attempts: u32,
    },
    #[error("the hub's event stream cannot be read: {0}")]
    Stream(#[from] SseError),
    #[error("cannot start a thread to read the stream: {0}")]
    Thread(std::io::Error),
    #[error(transparent)]
    Hub(HubError),
}

/// What [`Follow::next_item`] gives.
#[derive(Debug)]
pub enum Item {
    /// One SSE message (a stored event, or a live piece).
    Message(sse::Message),
    /// The stream ended or went silent; it is being reconnected.
    Dropped { reason: String },
    /// Connected again after a drop, resuming after the last stored event seen.
    Back,
}

enum Chunk {
    Bytes(Vec<u8>),
    /// The body ended: cleanly (`None`) or with a read error.
    End(Option<String>),
}

/// A live follow of one session's events.
pub struct Follow {
    hub: Hub,
    sid: String,
    /// The seq of the last stored event delivered (where a reconnect resumes).
    cursor: u64,
    conn: Option<Receiver<Chunk>>,
    parser: Parser,
    queue: VecDeque<sse::Message>,
    /// Connections failed in a row, and why the last one did.
    failures: u32,
    last_failure: String,
    dropped: bool,
    idle: Duration,
}

impl Follow {
    /// Connects now, for the events after `after`; an error here is the caller's to report
    /// (nothing is retried before the first connection).
    pub fn open(hub: &Hub, sid: &str, after: u64) -> Result<Follow, FollowError> {
        let mut f = Follow {
            hub: hub.clone(),
            sid: sid.to_string(),
            cursor: after,
            conn: None,
            parser: Parser::new(MAX_EVENT_BYTES),
            queue: VecDeque::new(),
            failures: 0,
            last_failure: String::new(),
            dropped: false,
            idle: IDLE,
        };
        f.connect()?;
        Ok(f)
    }

    /// Bounds silence on the stream (tests use a short one).
    pub fn with_idle(mut self, idle: Duration) -> Follow {
        self.idle = idle;
        self
    }

    /// The seq of the last stored event delivered.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Starts over from the events after `after`, on a new connection.
    pub fn restart(&mut self, after: u64) -> Result<(), FollowError> {
        self.conn = None;
        self.queue.clear();
        self.cursor = after;
        self.connect()
    }

    fn connect(&mut self) -> Result<(), FollowError> {
        let path = format!(
            "/api/sessions/{}/events?after={}",
            segment(&self.sid),
            self.cursor
        );
        let body = self.hub.stream(&path).map_err(|e| match e.status() {
            Some(404) => FollowError::Gone {
                sid: self.sid.clone(),
            },
            _ => FollowError::Hub(e),
        })?;
        self.parser = Parser::new(MAX_EVENT_BYTES);
        self.conn = Some(spawn_reader(body)?);
        Ok(())
    }

    /// The next message, blocking; reconnects when the stream drops. Stored events
    /// already delivered (at or before the cursor) are not delivered again.
    pub fn next_item(&mut self) -> Result<Item, FollowError> {
        loop {
            if let Some(m) = self.queue.pop_front() {
                if m.event == "event"
                    && let Some(seq) = m.id.as_deref().and_then(|i| i.parse::<u64>().ok())
                {
                    if seq <= self.cursor {
                        continue;
                    }
                    self.cursor = seq;
                }
                return Ok(Item::Message(m));
            }
            let Some(rx) = &self.conn else {
                if self.failures > 0 {
                    let shift = (self.failures - 1).min(8);
                    thread::sleep((BACKOFF_START * (1 << shift)).min(BACKOFF_MAX));
                }
                match self.connect() {
                    Ok(()) => {
                        self.dropped = false;
                        return Ok(Item::Back);
                    }
                    Err(FollowError::Hub(e)) if e.is_transient() => {
                        self.fail(e.to_string())?;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            };
            let why = match rx.recv_timeout(self.idle) {
                Ok(Chunk::Bytes(b)) => {
                    // A connection that delivers is a good one again.
                    self.failures = 0;
                    self.queue.extend(self.parser.feed(&b)?);
                    continue;
                }
                Ok(Chunk::End(None)) => "the hub closed the stream".to_string(),
                Ok(Chunk::End(Some(e))) => e,
                Err(RecvTimeoutError::Timeout) => {
                    format!("nothing for {}s", self.idle.as_secs())
                }
                Err(RecvTimeoutError::Disconnected) => "the reader stopped".to_string(),
            };
            // What a dropped connection left unfinished is read again from the cursor.
            self.conn = None;
            self.fail(why.clone())?;
            if !self.dropped {
                self.dropped = true;
                return Ok(Item::Dropped { reason: why });
            }
        }
    }

    fn fail(&mut self, reason: String) -> Result<(), FollowError> {
        self.failures += 1;
        self.last_failure = reason;
        if self.failures >= ATTEMPTS {
            return Err(FollowError::Lost {
                sid: self.sid.clone(),
                reason: self.last_failure.clone(),
                attempts: self.failures,
            });
        }
        Ok(())
    }
}

/// Reads the body on its own thread, in pieces as they arrive. A reader left blocked on a
/// dead connection ends with the process (or at its next piece, once nobody listens).
fn spawn_reader(mut body: Box<dyn Read + Send>) -> Result<Receiver<Chunk>, FollowError> {
    let (tx, rx): (SyncSender<Chunk>, Receiver<Chunk>) = sync_channel(64);
    thread::Builder::new()
        .name("cortex-sse".into())
        .spawn(move || {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match body.read(&mut buf) {
                    Ok(0) => {
                        let _ = tx.send(Chunk::End(None));
                        return;
                    }
                    Ok(n) => {
                        if tx.send(Chunk::Bytes(buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        let _ = tx.send(Chunk::End(Some(e.to_string())));
                        return;
                    }
                }
            }
        })
        .map_err(FollowError::Thread)?;
    Ok(rx)
}

/// Where rendered pieces go: the text to `text`, notes to `notes` (or to `text` when
/// there is none); reasoning dimmed when `dim` (a terminal).
pub struct Screen<'a> {
    pub text: &'a mut dyn Write,
    pub notes: Option<&'a mut dyn Write>,
    pub dim: bool,
}

impl Screen<'_> {
    pub fn put(&mut self, outs: &[Out]) -> std::io::Result<()> {
        for o in outs {
            match o {
                Out::Text(t) => self.text.write_all(t.as_bytes())?,
                Out::Reasoning(t) if self.dim => write!(self.text, "\x1b[2m{t}\x1b[0m")?,
                Out::Reasoning(t) => self.text.write_all(t.as_bytes())?,
                Out::Note(n) => match &mut self.notes {
                    Some(w) => {
                        self.text.flush()?;
                        writeln!(w, "{n}")?;
                        w.flush()?;
                    }
                    None => writeln!(self.text, "{n}")?,
                },
            }
        }
        self.text.flush()
    }
}

#[cfg(test)]
mod tests;
