//! Serving an append-only log over HTTP, for a session's events and the hub's own: one
//! page after a seq, a long poll (`wait`) that answers as soon as something lands, or a
//! live SSE stream. The log is read as stored JSON, never re-encoded.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::http::{HeaderMap, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::sync::{Notify, broadcast, watch};

use super::error::ApiError;
use super::http::Hangup;
use crate::state::AppState;
use crate::store::{ReadTx, StoreError};

/// The longest long poll one request may ask for.
pub const MAX_WAIT_S: u64 = 120;
/// Events per page.
pub const PAGE: usize = 1_000;

/// `?after=SEQ&wait=SECONDS`.
#[derive(Debug, Deserialize)]
pub struct LogQuery {
    #[serde(default)]
    pub after: u64,
    pub wait: Option<u64>,
}

/// A read of up to a number of entries of a log (at most [`PAGE`]), for
/// [`crate::store::Store::read`]; `None` when the log is gone.
pub type LogReader =
    Box<dyn for<'a> FnOnce(&ReadTx<'a>) -> Result<Option<Vec<Vec<u8>>>, StoreError> + Send>;

/// Makes the read of at most `limit` entries after a seq: `(after, limit)`.
pub trait ReadLog: Fn(u64, usize) -> LogReader + Send + Sync + 'static {}
impl<F> ReadLog for F where F: Fn(u64, usize) -> LogReader + Send + Sync + 'static {}

/// What a log request knows of its connection, for a live follower: how to end it, who
/// is at the other end (for the log line of a drop), and the `Last-Event-ID` a client
/// resuming a stream sends.
#[derive(Clone, Default)]
pub struct Conn {
    pub hangup: Option<Hangup>,
    pub peer: Option<SocketAddr>,
    pub last_event_id: Option<u64>,
}

impl Conn {
    pub fn of(headers: &HeaderMap, hangup: Option<Hangup>, peer: Option<SocketAddr>) -> Conn {
        let last_event_id = headers
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        Conn {
            hangup,
            peer,
            last_event_id,
        }
    }
}

pub fn wants_sse(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}

fn page(raw: &[Vec<u8>]) -> Response {
    let mut out = Vec::with_capacity(raw.iter().map(|r| r.len() + 1).sum::<usize>() + 16);
    out.extend_from_slice(b"{\"events\":[");
    for (i, r) in raw.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(r);
    }
    out.extend_from_slice(b"]}");
    ([(header::CONTENT_TYPE, "application/json")], out).into_response()
}

/// Answers a log request. `rx` must be subscribed before this reads, so nothing
/// committed in between is missed; `gone` is the answer when the log does not exist.
/// `live`: pieces that are streamed but never stored (a session's model text as it
/// arrives), sent to an SSE follower as `event: live` between the stored events.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    state: AppState,
    q: LogQuery,
    sse: bool,
    mut rx: watch::Receiver<u64>,
    read: impl ReadLog,
    gone: impl Fn() -> ApiError,
    live: Option<broadcast::Receiver<Arc<str>>>,
    conn: Conn,
) -> Result<Response, ApiError> {
    if sse {
        // A stream resumed by an SSE client names the last event it has.
        let after = q.after.max(conn.last_event_id.unwrap_or(0));
        return Ok(stream(state, after, rx, read, live, conn));
    }
    let deadline = q
        .wait
        .map(|w| tokio::time::Instant::now() + Duration::from_secs(w.min(MAX_WAIT_S)));
    loop {
        rx.borrow_and_update();
        let raw = state
            .store
            .read(read(q.after, PAGE))
            .await
            .map_err(ApiError::store)?
            .ok_or_else(&gone)?;
        if !raw.is_empty() {
            return Ok(page(&raw));
        }
        let Some(deadline) = deadline else {
            return Ok(page(&raw));
        };
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return Ok(page(&raw)) },
            () = tokio::time::sleep_until(deadline) => return Ok(page(&raw)),
            () = state.shutdown.cancelled() => return Ok(page(&raw)),
        }
    }
}

fn stream(
    state: AppState,
    after: u64,
    mut rx: watch::Receiver<u64>,
    read: impl ReadLog,
    mut live: Option<broadcast::Receiver<Arc<str>>>,
    conn: Conn,
) -> Response {
    let budget = state.settings.limits.follower_bytes;
    let f = FOLLOWERS.join(conn);
    let feed = Feed {
        f: f.clone(),
        told: false,
    };
    tokio::spawn(async move {
        let share = share(budget);
        let mut cursor = after;
        let (mut limit, mut each) = (FIRST_PAGE, FIRST_GUESS);
        loop {
            rx.borrow_and_update();
            // What the read will hold counts before it is made, so followers reading at
            // once cannot pass the budget between them unseen.
            let expected = (limit as u64).saturating_mul(each);
            if !FOLLOWERS.reserve(&f, expected, budget) {
                return f.end();
            }
            let raw = state.store.read(read(cursor, limit)).await;
            FOLLOWERS.release(&f, expected);
            let raw = match raw {
                Ok(Some(raw)) => raw,
                Ok(None) | Err(_) => return f.end(),
            };
            let more = raw.len() >= limit;
            (limit, each) = next_limit(&raw, share);
            // The pieces sent before these events were stored go first: a step's pieces
            // are sent before its write, so they are all queued by now.
            while let Some(json) = queued_live(&mut live) {
                let item = Item {
                    seq: None,
                    data: json.as_ref().to_owned(),
                };
                if !FOLLOWERS.push(&f, item, false, budget) {
                    return f.end();
                }
            }
            for r in raw {
                let seq = serde_json::from_slice::<Seq>(&r).map_or(cursor, |s| s.seq);
                cursor = cursor.max(seq);
                let data = String::from_utf8(r)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
                let item = Item {
                    seq: Some(seq),
                    data,
                };
                // This follower read its page after draining the last: it is not the
                // slow one, whoever else is.
                if !FOLLOWERS.push(&f, item, true, budget) {
                    return f.end();
                }
            }
            // The next page once this one is mostly read, and once there is one.
            let mut changed = more;
            loop {
                let room = f.unread() <= share / 2;
                if room && changed {
                    break;
                }
                tokio::select! {
                    c = rx.changed(), if !changed => match c {
                        Ok(()) => changed = true,
                        Err(_) => return f.end(),
                    },
                    piece = next_live(&mut live) => match piece {
                        Some(json) => {
                            let item = Item { seq: None, data: json.as_ref().to_owned() };
                            if !FOLLOWERS.push(&f, item, false, budget) {
                                return f.end();
                            }
                        }
                        None => live = None,
                    },
                    // Read from, dropped, or gone.
                    () = f.space.notified() => {}
                    () = state.shutdown.cancelled() => return f.end(),
                }
                if f.over() {
                    return f.end();
                }
            }
        }
    });
    Sse::new(feed)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// Events a follower reads first, before their size is known, and the size guessed.
const FIRST_PAGE: usize = 8;
const FIRST_GUESS: u64 = 4096;

/// A stored event's seq (the rest of it is passed on as stored).
#[derive(Deserialize)]
struct Seq {
    seq: u64,
}

/// The most one follower holds unread (a page and what is left of the last): an eighth
/// of the budget, so a reading follower never looks like the slowest for long.
fn share(budget: u64) -> u64 {
    (budget / 8).max(1)
}

/// How many events to read next, so a page is about half a follower's share, and the
/// bytes an event is expected to hold (the last page's mean).
fn next_limit(raw: &[Vec<u8>], share: u64) -> (usize, u64) {
    let bytes: usize = raw.iter().map(Vec::len).sum();
    if raw.is_empty() || bytes == 0 {
        return (FIRST_PAGE, FIRST_GUESS);
    }
    let each = (bytes / raw.len()).max(1) as u64;
    let n = usize::try_from(share / 2 / each)
        .unwrap_or(PAGE)
        .clamp(1, PAGE);
    (n, each)
}

/// Every live follower of every log, and their unread bytes together: one budget for
/// all of them (`limits.followerBytes`).
static FOLLOWERS: LazyLock<Followers> = LazyLock::new(Followers::default);

#[derive(Default)]
struct Followers {
    each: Mutex<HashMap<u64, Arc<Follower>>>,
    next: AtomicU64,
    /// The unread bytes of all followers (each follower's, added and taken under its
    /// queue's lock).
    total: AtomicU64,
    dropped: AtomicU64,
    /// A clock that ticks at every take, for [`Follower::moved`].
    clock: AtomicU64,
}

/// One live follower: what it was handed and has not read, and the bell its task waits
/// on for room.
struct Follower {
    id: u64,
    queue: Mutex<Queue>,
    unread: AtomicU64,
    /// When (on [`Followers::clock`]) it last showed it reads: it took a message, held
    /// nothing, or asked for (and was handed) a page. The slowest is the one that moved longest ago.
    moved: AtomicU64,
    space: Notify,
    conn: Conn,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Item>,
    waker: Option<Waker>,
    /// Dropped for the budget: its stream ends with an error and its connection closes.
    dropped: bool,
    /// Its stream is over (the client went, or the task ended).
    ended: bool,
}

/// A stored event (`seq`) or a live piece, as its SSE message will carry it.
struct Item {
    seq: Option<u64>,
    data: String,
}

impl Item {
    fn bytes(&self) -> u64 {
        self.data.len() as u64 + 32
    }
}

impl Followers {
    fn join(&self, conn: Conn) -> Arc<Follower> {
        let f = Arc::new(Follower {
            id: self.next.fetch_add(1, Ordering::Relaxed),
            queue: Mutex::default(),
            unread: AtomicU64::new(0),
            moved: AtomicU64::new(self.tick()),
            space: Notify::new(),
            conn,
        });
        self.lock().insert(f.id, f.clone());
        f
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Follower>>> {
        self.each.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// `f`'s client took `n` bytes: they are no longer unread, and `f` moved.
    fn took(&self, f: &Follower, n: u64) {
        f.unread.fetch_sub(n, Ordering::Relaxed);
        self.total.fetch_sub(n, Ordering::Relaxed);
        f.moved.store(self.tick(), Ordering::Relaxed);
    }

    /// Hands `item` to `f`; `false` when `f` is over. Past the budget the slowest
    /// followers are dropped until it holds again (`f` spared when it `reads` a page: it
    /// has just read what it held).
    fn push(&self, f: &Arc<Follower>, item: Item, reads: bool, budget: u64) -> bool {
        let n = item.bytes();
        let waker = {
            let mut q = f.lock();
            if q.dropped || q.ended {
                return false;
            }
            q.items.push_back(item);
            // A page it asked for (it had read down to half its share), or anything handed
            // to it while it held nothing: it reads.
            if f.unread.fetch_add(n, Ordering::Relaxed) == 0 || reads {
                f.moved.store(self.tick(), Ordering::Relaxed);
            }
            self.total.fetch_add(n, Ordering::Relaxed);
            q.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        if self.total.load(Ordering::Relaxed) > budget {
            self.shed(budget, reads.then_some(f.id));
        }
        true
    }

    /// Counts `n` bytes `f` is about to read as its own (sparing it, as a page it reads);
    /// `false` when `f` is over.
    fn reserve(&self, f: &Arc<Follower>, n: u64, budget: u64) -> bool {
        {
            let q = f.lock();
            if q.dropped || q.ended {
                return false;
            }
            f.unread.fetch_add(n, Ordering::Relaxed);
            self.total.fetch_add(n, Ordering::Relaxed);
            f.moved.store(self.tick(), Ordering::Relaxed);
        }
        if self.total.load(Ordering::Relaxed) > budget {
            self.shed(budget, Some(f.id));
        }
        true
    }

    /// Takes back what [`Followers::reserve`] counted (unless `f` was dropped since, which
    /// took all it held).
    fn release(&self, f: &Follower, n: u64) {
        let q = f.lock();
        if q.dropped || q.ended {
            return;
        }
        let n = n.min(f.unread.load(Ordering::Relaxed));
        f.unread.fetch_sub(n, Ordering::Relaxed);
        self.total.fetch_sub(n, Ordering::Relaxed);
    }

    /// Drops the slowest followers until the budget holds: of those holding unread bytes,
    /// the one that moved longest ago (a client that stopped reading), the most unread
    /// among equals. A client reading as fast as it is handed pages keeps moving, so it
    /// is never the one, however much it holds for a moment.
    fn shed(&self, budget: u64, spare: Option<u64>) {
        let each = self.lock();
        while self.total.load(Ordering::Relaxed) > budget {
            let victim = each
                .values()
                .filter(|v| Some(v.id) != spare && v.unread.load(Ordering::Relaxed) > 0)
                .min_by_key(|v| {
                    (
                        v.moved.load(Ordering::Relaxed),
                        std::cmp::Reverse(v.unread.load(Ordering::Relaxed)),
                    )
                });
            let Some(v) = victim else {
                return;
            };
            let unread = v.drop_for_budget(&self.total);
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::info!(
                peer = %v.conn.peer.map(|p| p.to_string()).unwrap_or_default(),
                unread,
                budget,
                dropped,
                "a slow log follower was dropped: the followers' unread bytes passed limits.followerBytes; it may resume after the last seq it read"
            );
        }
    }

    fn leave(&self, f: &Follower) {
        self.lock().remove(&f.id);
        let mut q = f.lock();
        q.ended = true;
        q.items.clear();
        let n = f.unread.swap(0, Ordering::Relaxed);
        self.total.fetch_sub(n, Ordering::Relaxed);
        drop(q);
        f.space.notify_one();
    }
}

impl Follower {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn unread(&self) -> u64 {
        self.unread.load(Ordering::Relaxed)
    }

    fn over(&self) -> bool {
        let q = self.lock();
        q.dropped || q.ended
    }

    /// Its stream ends (the task is done): what is queued is still read.
    fn end(&self) {
        let waker = {
            let mut q = self.lock();
            q.ended = true;
            q.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Forgets what it holds, ends its stream with an error and closes its connection;
    /// the bytes it held.
    fn drop_for_budget(&self, total: &AtomicU64) -> u64 {
        let (waker, n) = {
            let mut q = self.lock();
            q.dropped = true;
            q.items.clear();
            let n = self.unread.swap(0, Ordering::Relaxed);
            total.fetch_sub(n, Ordering::Relaxed);
            (q.waker.take(), n)
        };
        if let Some(w) = waker {
            w.wake();
        }
        self.space.notify_one();
        if let Some(h) = &self.conn.hangup {
            h.hang_up();
        }
        n
    }
}

/// Why a follower's stream ended early.
#[derive(Debug, thiserror::Error)]
#[error("dropped: the hub's live followers had more unread than limits.followerBytes")]
struct Dropped;

/// A follower's SSE messages, as its connection asks for them.
struct Feed {
    f: Arc<Follower>,
    told: bool,
}

impl tokio_stream::Stream for Feed {
    type Item = Result<SseEvent, Dropped>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let f = self.f.clone();
        let mut q = f.lock();
        if q.dropped {
            if self.told {
                return Poll::Ready(None);
            }
            self.told = true;
            return Poll::Ready(Some(Err(Dropped)));
        }
        let Some(item) = q.items.pop_front() else {
            if q.ended {
                return Poll::Ready(None);
            }
            q.waker = Some(cx.waker().clone());
            return Poll::Pending;
        };
        FOLLOWERS.took(&f, item.bytes());
        drop(q);
        f.space.notify_one();
        let ev = match item.seq {
            Some(seq) => SseEvent::default()
                .id(seq.to_string())
                .event("event")
                .data(item.data),
            None => SseEvent::default().event("live").data(item.data),
        };
        Poll::Ready(Some(Ok(ev)))
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        FOLLOWERS.leave(&self.f);
    }
}

/// A live piece already queued, if any (a follower that fell behind skips what it
/// missed); `None` also once the channel is gone, which [`next_live`] then tells.
fn queued_live(live: &mut Option<broadcast::Receiver<Arc<str>>>) -> Option<Arc<str>> {
    let rx = live.as_mut()?;
    loop {
        match rx.try_recv() {
            Ok(piece) => return Some(piece),
            Err(broadcast::error::TryRecvError::Lagged(_)) => continue,
            Err(_) => return None,
        }
    }
}

/// The next live piece; `None` once the channel is gone. A follower that fell behind
/// skips what it missed (the stored event of each step holds its whole text).
async fn next_live(live: &mut Option<broadcast::Receiver<Arc<str>>>) -> Option<Arc<str>> {
    let Some(rx) = live else {
        return std::future::pending().await;
    };
    loop {
        match rx.recv().await {
            Ok(piece) => return Some(piece),
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(bytes: usize) -> Item {
        Item {
            seq: Some(1),
            data: "x".repeat(bytes.saturating_sub(32)),
        }
    }

    #[test]
    fn past_the_budget_the_slowest_followers_are_dropped_and_a_reader_is_spared() {
        let all = Followers::default();
        let (a, b, c) = (
            all.join(Conn::default()),
            all.join(Conn::default()),
            all.join(Conn::default()),
        );
        // Under the budget nothing is dropped.
        assert!(all.push(&a, item(400), true, 1_000));
        assert!(all.push(&b, item(300), true, 1_000));
        assert!(all.push(&c, item(200), true, 1_000));
        assert!(!a.over() && !b.over() && !c.over());
        // `a` reads a page past the budget: it is spared, `b` (of the others the one
        // that moved longest ago) goes, and that is enough.
        assert!(all.push(&a, item(400), true, 1_000));
        assert!(b.over() && !a.over() && !c.over());
        assert_eq!(all.total.load(Ordering::Relaxed), 1_000);
        assert!(
            !all.push(&b, item(10), true, 1_000),
            "a dropped follower takes nothing"
        );
        // A live piece is no sign of reading: `c`, whose one page came before `a`'s
        // second, moved longest ago and goes, though `a` holds more.
        assert!(all.push(&c, item(100), false, 1_000));
        assert!(c.over() && !a.over());
        assert_eq!(all.total.load(Ordering::Relaxed), 800);
        // One alone past the budget, reading: nobody else to drop.
        assert!(all.push(&a, item(5_000), true, 1_000));
        assert!(!a.over());
        all.leave(&c);
        all.leave(&a);
        all.leave(&b);
        assert_eq!(all.total.load(Ordering::Relaxed), 0);
        assert!(all.lock().is_empty());
    }

    #[test]
    fn the_follower_dropped_is_the_one_that_stopped_reading_not_the_one_holding_most() {
        let all = Followers::default();
        let (reader, stuck) = (all.join(Conn::default()), all.join(Conn::default()));
        // The stuck one takes a little, then nothing; the reader holds more, but takes.
        assert!(all.push(&stuck, item(300), true, 1_000));
        all.took(&stuck, 100);
        assert!(all.push(&reader, item(600), true, 1_000));
        all.took(&reader, 100);
        assert!(all.push(&reader, item(100), false, 1_000));
        // Past the budget: the stuck one goes, though the reader holds 600 to its 200.
        let other = all.join(Conn::default());
        assert!(all.push(&other, item(300), true, 1_000));
        assert!(stuck.over(), "the one that stopped reading");
        assert!(!reader.over() && !other.over());
        // Held nothing and is handed a page: it had read all it had, so it moved then.
        let idle = all.join(Conn::default());
        let old = all.join(Conn::default());
        assert!(all.push(&old, item(50), true, 10_000));
        assert!(all.push(&idle, item(50), false, 10_000));
        assert!(old.moved.load(Ordering::Relaxed) < idle.moved.load(Ordering::Relaxed));
    }

    #[test]
    fn a_read_counts_before_it_is_made() {
        let all = Followers::default();
        let (a, b) = (all.join(Conn::default()), all.join(Conn::default()));
        assert!(all.push(&b, item(600), true, 1_000));
        // `a` is about to read 600 bytes: `b`, holding the most of the others, goes first.
        assert!(all.reserve(&a, 600, 1_000));
        assert!(b.over() && !a.over());
        all.release(&a, 600);
        assert_eq!(all.total.load(Ordering::Relaxed), 0);
        // A follower dropped while it read is not taken back twice.
        assert!(all.reserve(&a, 700, 1_000));
        let c = all.join(Conn::default());
        assert!(all.push(&c, item(400), false, 1_000));
        assert!(
            a.over(),
            "a live piece spares no one: `a` moved longest ago"
        );
        all.release(&a, 700);
        assert_eq!(all.total.load(Ordering::Relaxed), 400);
    }

    #[test]
    fn a_page_is_about_half_a_followers_share() {
        let ev = |n: usize| vec![vec![b'x'; n]; 4];
        let cases = [
            // (event size, budget, events read next)
            (2_500, 64 << 20, PAGE),
            (60_000, 1 << 20, 1),
            (1_000, 1 << 20, 65),
            (10, 1 << 30, PAGE),
        ];
        for (size, budget, want) in cases {
            let next = next_limit(&ev(size), share(budget));
            assert_eq!(next, (want, size as u64), "{size} {budget}");
        }
        assert_eq!(next_limit(&[], share(1 << 20)), (FIRST_PAGE, FIRST_GUESS));
    }
}
