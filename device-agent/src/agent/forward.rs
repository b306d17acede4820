//! Forwarding the spool over the link: which names to send, at most a window of them
//! unacknowledged, and what each ack does to the file.
//!
//! The [`Forwarder`] is driven by the daemon loop and touches nothing but the spool (through
//! [`Spool`], which owns the file safety) and an [`Outbox`]; tests drive it with a fake one.
//!
//! Rules:
//! - A name is read only when the link is up and the window has room; while the window is
//!   full or the hub is gone, files stay on disk. Names wait in a queue of at most
//!   [`QUEUE_CAP`]; past that the forwarder only remembers to list the spool again, so a
//!   backlog of any size costs no memory: the disk holds it.
//! - Each file is checked here before it is sent ([`SignalRequest::parse`]: JSON of the
//!   right shape, fields within their caps); a malformed one is parked under `bad/` with the
//!   parse error as its reason once it stopped changing ([`Spool::settled`]: nobody holds
//!   it open for writing, and, found by a listing, two looks agree); until then it stays,
//!   and its close event, or the next rescan, brings it back.
//! - Once another process took the spool's collector lock ([`Forwarder::stop`]), nothing
//!   more is listed or sent; acks of files already sent still remove them.
//! - Accepted, duplicate and resolved remove the file; refused parks it with the hub's
//!   reason; retry keeps it and sends it again after a delay. Nothing else deletes a file,
//!   so a crash between send and remove only means the hub answers "duplicate" later.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use cortex_protocol::SignalRequest;
use cortex_protocol::mesh::{AgentFrame, FileOutcome, Frame};
use tokio::time::Instant;

use cortex_host::spool::{InFlight, Refusal, Spool};

/// Names queued in memory at most; beyond, the spool is listed again once the queue drains.
pub const QUEUE_CAP: usize = 4096;

/// Where encoded frames go: the link's writer channel, or a test's vector.
pub trait Outbox {
    /// Whether a frame can be queued now without waiting.
    fn has_room(&self) -> bool;
    /// Queue a frame; false when the link is gone.
    fn send(&mut self, frame: Vec<u8>) -> bool;
}

#[derive(Debug)]
struct Queued {
    name: String,
    /// Found by a listing rather than announced complete by inotify.
    listed: bool,
}

/// What happened to one queued name.
enum Prepared {
    Frame(Vec<u8>),
    /// Parked, gone, or left for later: nothing to send.
    Nothing,
}

/// The forwarding state; see the module docs.
#[derive(Debug)]
pub struct Forwarder {
    spool: Arc<Spool>,
    queue: VecDeque<Queued>,
    queued: HashSet<String>,
    /// Every name handled right now: sent and awaiting its ack, or waiting for a retry.
    /// Keeps a rescan from queueing them again.
    inflight: InFlight,
    /// Sent on the current link, with when: the window and the ack timeout count these.
    sent: HashMap<String, Instant>,
    retry: Vec<(Instant, String)>,
    retry_delay: Duration,
    /// List the spool again when the queue has room.
    relist: bool,
    /// Zero while there is no link.
    window: usize,
    max_frame: usize,
    /// The spool's counts may have changed since they were last read.
    dirty: bool,
    /// Another process collects the spool now: send nothing more.
    stopped: bool,
}

impl Forwarder {
    pub fn new(spool: Arc<Spool>, retry_delay: Duration) -> Forwarder {
        Forwarder {
            spool,
            queue: VecDeque::new(),
            queued: HashSet::new(),
            inflight: InFlight::new(),
            sent: HashMap::new(),
            retry: Vec::new(),
            retry_delay,
            relist: true,
            window: 0,
            max_frame: 0,
            dirty: true,
            stopped: false,
        }
    }

    /// A link is up: send up to `window` files at once, each frame at most `max_frame`
    /// bytes. Everything pending is listed again.
    pub fn link_up(&mut self, window: usize, max_frame: usize) {
        self.window = window.max(1);
        self.max_frame = max_frame;
        self.relist = true;
    }

    /// The link is gone: what was sent and not acknowledged stays on disk and is sent again
    /// on the next link (answered "duplicate" where the hub had recorded it).
    pub fn link_down(&mut self) {
        for (name, _) in self.sent.drain() {
            self.inflight.finish(&name);
        }
        self.window = 0;
        self.relist = true;
    }

    /// Another process took the spool: list and send nothing more, forget what is queued.
    pub fn stop(&mut self) {
        self.stopped = true;
        self.queue.clear();
        self.queued.clear();
        self.relist = false;
    }

    /// inotify announced a complete file.
    pub fn file(&mut self, name: String) {
        if self.stopped {
            return;
        }
        self.dirty = true;
        self.enqueue(name, false);
    }

    /// List the whole spool when there is room (the watcher's or the hub's rescan).
    pub fn rescan(&mut self) {
        if self.stopped {
            return;
        }
        self.dirty = true;
        self.relist = true;
    }

    /// Whether the queue has room. The loop reads the spool's events regardless (remote
    /// waits share its inotify instance); a file announced while the queue is full only
    /// sets the flag to list the spool again once it drained, so memory stays bounded.
    pub fn wants_events(&self) -> bool {
        self.queue.len() < QUEUE_CAP
    }

    /// Whether a tick has work here: files in flight (the ack timeout), retries to
    /// schedule, counts to report, or files to send over a live link. An idle forwarder
    /// needs no timer at all.
    pub fn busy(&self) -> bool {
        !self.sent.is_empty()
            || !self.retry.is_empty()
            || self.dirty
            || (self.window > 0 && (!self.queue.is_empty() || self.relist))
    }

    /// Files sent and not yet acknowledged.
    pub fn unacked(&self) -> usize {
        self.sent.len()
    }

    /// How long the oldest unacknowledged file has waited.
    pub fn oldest_unacked(&self, now: Instant) -> Option<Duration> {
        self.sent
            .values()
            .map(|t| now.saturating_duration_since(*t))
            .max()
    }

    /// The counts need reading again (a status could not be sent).
    pub fn mark_dirty(&mut self) {
        self.dirty = true;
    }

    /// Takes the "counts may have changed" flag.
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    /// The hub's answer for `name`. False when no such file was in flight on this link
    /// (the answer is ignored: the file, if any, is sent again later).
    pub fn ack(&mut self, name: &str, outcome: FileOutcome, now: Instant) -> bool {
        if self.sent.remove(name).is_none() {
            tracing::warn!(
                file = name,
                "the hub acknowledged a file that is not in flight; ignored"
            );
            return false;
        }
        self.dirty = true;
        match outcome {
            FileOutcome::Accepted | FileOutcome::Duplicate | FileOutcome::Resolved => {
                if let Err(e) = self.spool.remove(name) {
                    tracing::warn!(file = name, error = %e, "cannot remove an acknowledged spool file; it will be sent again and answered duplicate");
                }
                tracing::debug!(file = name, outcome = ?outcome, "spool file acknowledged");
                self.inflight.finish(name);
            }
            FileOutcome::Refused { reason } => {
                self.park(name, &format!("refused by the hub: {reason}"));
                self.inflight.finish(name);
            }
            FileOutcome::Retry { reason } => {
                tracing::info!(file = name, reason = %reason, retry_in = ?self.retry_delay, "the hub cannot take a file now; it stays and is sent again");
                self.retry.push((now + self.retry_delay, name.to_owned()));
            }
        }
        true
    }

    /// Files whose retry delay passed go back to the front of the queue.
    pub fn tick(&mut self, now: Instant) {
        let mut due = Vec::new();
        self.retry.retain(|(at, name)| {
            if *at <= now {
                due.push(name.clone());
                false
            } else {
                true
            }
        });
        for name in due.into_iter().rev() {
            self.inflight.finish(&name);
            if !self.stopped && self.queued.insert(name.clone()) {
                self.queue.push_front(Queued {
                    name,
                    listed: false,
                });
            }
        }
    }

    /// Send what the window allows.
    pub fn pump(&mut self, out: &mut impl Outbox, now: Instant) {
        if self.window == 0 || self.stopped {
            return;
        }
        while self.sent.len() < self.window {
            if self.relist && self.queue.len() < QUEUE_CAP / 2 {
                self.list();
            }
            if self.queue.is_empty() || !out.has_room() {
                return;
            }
            let Some(q) = self.queue.pop_front() else {
                return;
            };
            self.queued.remove(&q.name);
            if !self.inflight.begin(&q.name) {
                continue;
            }
            match self.prepare(&q) {
                Prepared::Frame(bytes) => {
                    if out.send(bytes) {
                        self.sent.insert(q.name, now);
                    } else {
                        // The link went away under us: the next link lists everything.
                        self.inflight.finish(&q.name);
                        self.relist = true;
                        return;
                    }
                }
                Prepared::Nothing => self.inflight.finish(&q.name),
            }
        }
    }

    fn enqueue(&mut self, name: String, listed: bool) {
        if self.inflight.contains(&name) || self.queued.contains(&name) {
            return;
        }
        if self.queue.len() >= QUEUE_CAP {
            self.relist = true;
            return;
        }
        self.queued.insert(name.clone());
        self.queue.push_back(Queued { name, listed });
    }

    fn list(&mut self) {
        self.relist = false;
        match self.spool.list() {
            Ok(names) => {
                if !names.is_empty() {
                    tracing::debug!(files = names.len(), "listed the spool");
                }
                for name in names {
                    self.enqueue(name, true);
                }
            }
            // The watcher's periodic rescan tries again.
            Err(e) => tracing::error!(error = %e, "cannot list the spool"),
        }
    }

    /// Read, check and encode one file; park it when it can never be sent.
    fn prepare(&mut self, q: &Queued) -> Prepared {
        let name = q.name.as_str();
        let bytes = match self.spool.read(name) {
            Ok(b) => b,
            Err(Refusal::Gone) => return Prepared::Nothing,
            Err(r) if r.should_park() => {
                self.park(name, &r.to_string());
                return Prepared::Nothing;
            }
            Err(r) => {
                tracing::warn!(file = name, error = %r, "cannot read a spool file now; it stays for the next rescan");
                return Prepared::Nothing;
            }
        };
        if let Err(e) = SignalRequest::parse(&bytes) {
            if !self.spool.settled(name, !q.listed) {
                tracing::debug!(
                    file = name,
                    "a spool file that does not parse is still being written; left for later"
                );
                return Prepared::Nothing;
            }
            self.park(name, &e.to_string());
            return Prepared::Nothing;
        }
        let Ok(body) = String::from_utf8(bytes) else {
            self.park(
                name,
                "refused: the file is not UTF-8 text; write the signal as JSON",
            );
            return Prepared::Nothing;
        };
        let frame = AgentFrame::File {
            name: name.to_owned(),
            body,
        };
        match frame.encode() {
            Ok(b) if b.len() <= self.max_frame => Prepared::Frame(b),
            Ok(b) => {
                self.park(
                    name,
                    &format!(
                        "refused: the file makes a {}-byte frame, over the hub's {}-byte cap; shorten message or data",
                        b.len(),
                        self.max_frame
                    ),
                );
                Prepared::Nothing
            }
            Err(e) => {
                self.park(name, &format!("refused: {e}; shorten message or data"));
                Prepared::Nothing
            }
        }
    }

    fn park(&mut self, name: &str, reason: &str) {
        self.dirty = true;
        match self.spool.park(name, reason) {
            Ok(Some(parked)) => {
                tracing::warn!(file = name, parked = %parked, reason, "spool file parked under bad/");
            }
            Ok(None) => {}
            Err(e) => tracing::error!(file = name, error = %e, "cannot park a bad spool file"),
        }
    }
}
