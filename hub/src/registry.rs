//! The live half of the device registry: which devices may connect (their token hashes,
//! loaded from the store at start and kept in step with `device add|revoke`) and which
//! are connected now (one [`Link`] each, with a handle to end it).
//!
//! Authentication and registration go through one mutex, so a revoke can never miss a
//! link: either the link registered before the revoke took the lock (and is ended by
//! it), or it registers after (and finds its token gone).
//!
//! A link also carries [`Requests`]: frames other parts of the hub hand to its loop to
//! send (`device_exec`'s `Exec`), and the waiters for the agent's answers, keyed by the
//! request's id. They end with the link: a waiter of an ended link sees its channel
//! closed, and a new link starts with none.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cortex_protocol::mesh::{AgentFrame, FileOutcome, HostFacts, HubFrame, SpoolCounts};
use tokio::sync::{Notify, mpsc, oneshot};

use cortex_protocol::api::{DeviceView, FileAnswer, FileNote};

use crate::secret;
use crate::store::devices::DeviceRecord;

/// Why a link ended; its text is the offline reason people read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    PingTimeout,
    ClosedByAgent,
    Revoked,
    Replaced,
    Shutdown,
    /// The agent broke the protocol (unknown, malformed or oversized frame, …).
    Protocol(String),
    /// The connection failed under us (reset, EOF without a close).
    Lost(String),
    /// The store could not record the link.
    Store,
    /// Another hub recorded the device offline while this one was silent (frozen, or
    /// cut from the database): the link is made again, and recorded again.
    Disowned,
}

impl End {
    pub fn reason(&self) -> String {
        match self {
            End::PingTimeout => "ping timed out".into(),
            End::ClosedByAgent => "closed by the agent".into(),
            End::Revoked => "revoked".into(),
            End::Replaced => "replaced by a new connection".into(),
            End::Shutdown => "hub shutting down".into(),
            End::Protocol(e) => format!("protocol error: {e}"),
            End::Lost(e) => format!("connection lost: {e}"),
            End::Store => "the hub's store failed".into(),
            End::Disowned => "recorded offline by another hub while this one was silent".into(),
        }
    }
}

/// One live link, shared between its task, the registry and the API.
pub struct Link {
    pub id: u64,
    pub device: String,
    pub agent_version: String,
    pub host: HostFacts,
    /// What the agent announced in its hello (`spool`, `wait-pid`, …).
    pub capabilities: Vec<String>,
    pub online_since: u64,
    /// Milliseconds since the epoch of the last thing received (frame, ping or pong).
    pub last_seen: AtomicU64,
    spool: Mutex<SpoolCounts>,
    end: Mutex<Option<End>>,
    pub ended: Notify,
    pub rescan: Notify,
    /// Frames for the agent from outside the link's loop, and their answers' waiters.
    pub requests: Requests,
}

impl Link {
    pub fn new(
        id: u64,
        device: String,
        agent_version: String,
        host: HostFacts,
        spool: SpoolCounts,
        now: u64,
    ) -> Self {
        Link {
            id,
            device,
            agent_version,
            host,
            capabilities: Vec::new(),
            online_since: now,
            last_seen: AtomicU64::new(now),
            spool: Mutex::new(spool),
            end: Mutex::new(None),
            ended: Notify::new(),
            rescan: Notify::new(),
            requests: Requests::new(),
        }
    }

    pub fn spool(&self) -> SpoolCounts {
        *self.spool.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_spool(&self, s: SpoolCounts) {
        *self.spool.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }

    pub fn seen(&self, now: u64) {
        self.last_seen.fetch_max(now, Ordering::Relaxed);
    }

    pub fn last_seen(&self) -> u64 {
        self.last_seen.load(Ordering::Relaxed)
    }

    /// Asks the link's task to end with `why`; the first reason given wins.
    pub fn end(&self, why: End) {
        let mut e = self.end.lock().unwrap_or_else(|e| e.into_inner());
        if e.is_none() {
            *e = Some(why);
        }
        drop(e);
        // notify_one keeps a permit, so a task not yet waiting still sees it.
        self.ended.notify_one();
    }

    /// The reason given to [`Link::end`], if any.
    pub fn ended_with(&self) -> Option<End> {
        self.end.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Frames queued for the agent beyond this many make a sender wait (its own bound).
const REQUEST_QUEUE: usize = 64;

/// Requests to the agent from outside the link's loop (see the module docs).
pub struct Requests {
    tx: mpsc::Sender<HubFrame>,
    rx: Mutex<Option<mpsc::Receiver<HubFrame>>>,
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    /// The link ended: no new waiter.
    closed: bool,
    next_ticket: u64,
    /// Waiters by request id; several when one id is asked twice at once.
    waiting: HashMap<String, Vec<(u64, oneshot::Sender<AgentFrame>)>>,
}

impl Requests {
    fn new() -> Self {
        let (tx, rx) = mpsc::channel(REQUEST_QUEUE);
        Requests {
            tx,
            rx: Mutex::new(Some(rx)),
            pending: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The frames' receiving end, for the link's loop (once).
    pub fn take_receiver(&self) -> Option<mpsc::Receiver<HubFrame>> {
        self.rx.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Where to queue a frame for the agent; sending fails once the loop is gone.
    pub fn sender(&self) -> mpsc::Sender<HubFrame> {
        self.tx.clone()
    }

    /// Waits for the answer to request `id`: a ticket (for [`Requests::forget`]) and the
    /// answer's channel. `None` once the link ended.
    pub fn expect(&self, id: &str) -> Option<(u64, oneshot::Receiver<AgentFrame>)> {
        let mut g = self.lock();
        if g.closed {
            return None;
        }
        g.next_ticket += 1;
        let ticket = g.next_ticket;
        let (tx, rx) = oneshot::channel();
        g.waiting
            .entry(id.to_owned())
            .or_default()
            .push((ticket, tx));
        Some((ticket, rx))
    }

    /// Drops one waiter (answered, timed out or cancelled).
    pub fn forget(&self, id: &str, ticket: u64) {
        let mut g = self.lock();
        if let Some(v) = g.waiting.get_mut(id) {
            v.retain(|(t, _)| *t != ticket);
            if v.is_empty() {
                g.waiting.remove(id);
            }
        }
    }

    /// The agent's answer to request `id`, handed to every waiter for it; false when
    /// nobody waited (an answer after its caller gave up).
    pub fn answer(&self, id: &str, frame: &AgentFrame) -> bool {
        let waiters = self.lock().waiting.remove(id).unwrap_or_default();
        let any = !waiters.is_empty();
        for (_, tx) in waiters {
            let _ = tx.send(frame.clone());
        }
        any
    }

    /// The link ended: every waiter's channel closes, and none is taken after.
    pub fn close(&self) {
        let mut g = self.lock();
        g.closed = true;
        g.waiting.clear();
    }

    /// Whether the link ended (no request is taken).
    pub fn closed(&self) -> bool {
        self.lock().closed
    }

    /// Waiters now (tests check none is left behind).
    pub fn pending(&self) -> usize {
        self.lock().waiting.values().map(Vec::len).sum()
    }
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The device is unknown or the token does not match (revoked, or never added).
    Forbidden,
}

#[derive(Default)]
struct Inner {
    tokens: HashMap<String, [u8; 32]>,
    /// Bumped by every local change to `tokens` (an add, a revoke): a view of the store
    /// read before one is older than it, and must not be applied over it.
    revision: u64,
    links: HashMap<String, Arc<Link>>,
    /// Devices that had a link since the hub started (a new one is a reconnect).
    linked: std::collections::HashSet<String>,
}

/// Devices allowed to connect, and their live links.
#[derive(Default)]
pub struct Registry {
    inner: Mutex<Inner>,
    next_id: AtomicU64,
    /// Each device's latest spool files and what the hub answered them (the page's device
    /// view); in memory only, since the hub started. Its own lock, off the auth path.
    files: Mutex<HashMap<String, VecDeque<FileNote>>>,
    /// Told each time a link registers (what [`Registry::wait_link`] waits on).
    linked: Notify,
}

/// Files remembered per device, newest kept.
pub const FILE_NOTES: usize = 100;

/// Compared against when the device is unknown, so both answers take the same time.
const NO_TOKEN: [u8; 32] = [0; 32];

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the allowed devices (at start, from the store).
    pub fn load(&self, tokens: impl IntoIterator<Item = (String, [u8; 32])>) {
        self.lock().tokens = tokens.into_iter().collect();
    }

    /// Where the local changes to the allowed devices stand: taken before a read of the
    /// store's devices, given back with what it read ([`Registry::follow`],
    /// [`Registry::allow_read`]).
    pub fn revision(&self) -> u64 {
        self.lock().revision
    }

    /// Follows the store's devices (another hub added or revoked one): the allowed set
    /// becomes `tokens`, and a device no longer in it, or whose token changed, has its
    /// link here ended as revoked. Returns the devices whose links were ended, or `None`
    /// (nothing applied) when a local add or revoke came after `read_at`, the
    /// [`Registry::revision`] taken before the read: applied, the older read would undo it
    /// (a revoked device allowed again).
    pub fn follow(&self, tokens: HashMap<String, [u8; 32]>, read_at: u64) -> Option<Vec<String>> {
        let gone: Vec<String> = {
            let g = self.lock();
            if g.revision != read_at {
                return None;
            }
            g.tokens
                .iter()
                .filter(|(name, hash)| tokens.get(*name) != Some(*hash))
                .map(|(name, _)| name.clone())
                .collect()
        };
        let mut ended = Vec::new();
        for name in gone {
            if self.end_revoked(&name) {
                ended.push(name);
            }
        }
        let mut g = self.lock();
        if g.revision == read_at {
            g.tokens = tokens;
        }
        Some(ended)
    }

    /// A device was added (after its record committed).
    pub fn allow(&self, name: &str, token_hash: [u8; 32]) {
        let mut g = self.lock();
        g.tokens.insert(name.to_string(), token_hash);
        g.revision += 1;
    }

    /// A device found in the store by a read begun at [`Registry::revision`] `read_at`:
    /// allowed unless a local add or revoke came since (whether it was).
    pub fn allow_read(&self, name: &str, token_hash: [u8; 32], read_at: u64) -> bool {
        let mut g = self.lock();
        if g.revision != read_at {
            return false;
        }
        g.tokens.insert(name.to_string(), token_hash);
        true
    }

    /// A device was revoked (after its record was deleted): no new link is accepted and
    /// the live one, if any, is told to end now.
    pub fn revoke(&self, name: &str) -> bool {
        self.lock().revision += 1;
        self.end_revoked(name)
    }

    /// [`Registry::revoke`]'s forgetting and ending, without marking a local change.
    fn end_revoked(&self, name: &str) -> bool {
        let mut g = self.lock();
        g.tokens.remove(name);
        g.linked.remove(name);
        let link = g.links.remove(name);
        drop(g);
        self.files
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        match link {
            Some(l) => {
                l.end(End::Revoked);
                true
            }
            None => false,
        }
    }

    /// Checks `token` for `device` in constant time; returns the hash it matched.
    pub fn authenticate(&self, device: &str, token: &str) -> Result<[u8; 32], Refused> {
        let stored = self.lock().tokens.get(device).copied();
        let ok = secret::matches(token, stored.as_ref().unwrap_or(&NO_TOKEN));
        match stored {
            Some(h) if ok => Ok(h),
            _ => Err(Refused::Forbidden),
        }
    }

    /// A link's id: unique across the hubs on a store (a device's record names the link
    /// that last said it is online, whichever hub holds it), so each process counts from
    /// a random base of its own; under 2^53, so JSON keeps it whole.
    pub fn next_link_id(&self) -> u64 {
        static BASE: std::sync::LazyLock<u64> =
            std::sync::LazyLock::new(|| (getrandom::u32().unwrap_or(0) as u64) << 20);
        *BASE + self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Registers a link authenticated with `token_hash`. The device's previous link, if
    /// any, is told to end (`Replaced`) and returned. Refused when the token was revoked
    /// (or changed) since the upgrade was authenticated.
    pub fn register(
        &self,
        link: Arc<Link>,
        token_hash: &[u8; 32],
    ) -> Result<Option<Arc<Link>>, Refused> {
        let mut g = self.lock();
        if g.tokens.get(&link.device) != Some(token_hash) {
            return Err(Refused::Forbidden);
        }
        let again = !g.linked.insert(link.device.clone());
        let old = g.links.insert(link.device.clone(), link);
        drop(g);
        crate::metrics::metrics().link_opened(again);
        if let Some(o) = &old {
            o.end(End::Replaced);
        }
        self.linked.notify_waiters();
        Ok(old)
    }

    /// `device`'s live link (one that takes requests: not one that ended and is not yet
    /// unregistered), waiting for one to register until `until`; `None` if none did by
    /// then.
    pub async fn wait_link(&self, device: &str, until: tokio::time::Instant) -> Option<Arc<Link>> {
        let usable = || self.link(device).filter(|l| !l.requests.closed());
        loop {
            // Listening before looking, so a link registered in between is not missed.
            let registered = self.linked.notified();
            tokio::pin!(registered);
            registered.as_mut().enable();
            if let Some(l) = usable() {
                return Some(l);
            }
            if tokio::time::timeout_at(until, registered).await.is_err() {
                return usable();
            }
        }
    }

    /// Removes the device's link if it is still `id` (a replaced link leaves its
    /// successor in place).
    pub fn unregister(&self, device: &str, id: u64) {
        let mut g = self.lock();
        if g.links.get(device).is_some_and(|l| l.id == id) {
            g.links.remove(device);
        }
    }

    /// Whether `device` is enrolled (allowed to connect), online or not.
    pub fn knows(&self, device: &str) -> bool {
        self.lock().tokens.contains_key(device)
    }

    pub fn link(&self, device: &str) -> Option<Arc<Link>> {
        self.lock().links.get(device).cloned()
    }

    /// The fleet as `GET /metrics` shows it: enrolled devices online and offline, open
    /// links.
    pub fn fleet(&self) -> crate::metrics::Fleet {
        let g = self.lock();
        let online = g.links.keys().filter(|d| g.tokens.contains_key(*d)).count() as i64;
        crate::metrics::Fleet {
            online,
            offline: g.tokens.len() as i64 - online,
            links: g.links.len() as i64,
            ..Default::default()
        }
    }

    /// Every live link (a snapshot).
    pub fn links(&self) -> Vec<Arc<Link>> {
        self.lock().links.values().cloned().collect()
    }

    /// The sweep's backstop to inotify: every connected agent lists its spool again.
    pub fn rescan_all(&self) -> usize {
        let links = self.links();
        for l in &links {
            l.rescan.notify_one();
        }
        links.len()
    }

    /// Ends every link (the hub is stopping).
    pub fn end_all(&self, why: End) {
        for l in self.links() {
            l.end(why.clone());
        }
    }
}

impl Registry {
    /// Remembers a device's file and the hub's answer (the newest [`FILE_NOTES`]).
    pub fn note_file(&self, device: &str, name: &str, outcome: &FileOutcome, at: u64) {
        let (outcome, reason) = match outcome {
            FileOutcome::Accepted => (FileAnswer::Accepted, None),
            FileOutcome::Duplicate => (FileAnswer::Duplicate, None),
            FileOutcome::Resolved => (FileAnswer::Resolved, None),
            FileOutcome::Refused { reason } => (FileAnswer::Refused, Some(reason.clone())),
            FileOutcome::Retry { reason } => (FileAnswer::Retry, Some(reason.clone())),
        };
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        let notes = files.entry(device.to_string()).or_default();
        if notes.len() >= FILE_NOTES {
            notes.pop_front();
        }
        notes.push_back(FileNote {
            at,
            name: name.to_string(),
            outcome,
            reason,
        });
    }

    /// A device's remembered files, newest first.
    pub fn files(&self, device: &str) -> Vec<FileNote> {
        let files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        files
            .get(device)
            .map(|n| n.iter().rev().cloned().collect())
            .unwrap_or_default()
    }

    /// A stored device merged with its live link, if it has one; `waits` is the count of
    /// its active remote waits; `me` this hub's name. A device another hub holds the
    /// link of is online as its record says, on that hub.
    pub fn view(&self, rec: DeviceRecord, waits: u32, me: &str) -> DeviceView {
        match self.link(&rec.name) {
            Some(link) => DeviceView {
                name: rec.name,
                state: "online".into(),
                hub: Some(me.to_string()),
                since: Some(link.online_since),
                last_seen: Some(link.last_seen()),
                agent_version: Some(link.agent_version.clone()),
                host: Some(link.host.clone()),
                spool: link.spool(),
                waits,
                offline_reason: None,
                wait_list: None,
            },
            None if rec.link.is_some() && rec.hub.as_deref().is_some_and(|h| h != me) => {
                DeviceView {
                    name: rec.name,
                    state: "online".into(),
                    since: rec.online_since,
                    last_seen: rec.last_seen,
                    agent_version: rec.agent_version,
                    host: rec.host,
                    spool: rec.spool,
                    waits,
                    offline_reason: None,
                    wait_list: None,
                    hub: rec.hub,
                }
            }
            None => DeviceView {
                name: rec.name,
                state: "offline".into(),
                hub: None,
                since: rec.offline_since,
                last_seen: rec.last_seen,
                agent_version: rec.agent_version,
                host: rec.host,
                spool: rec.spool,
                waits,
                offline_reason: rec.offline_reason,
                wait_list: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_devices_files_are_kept_newest_first_up_to_the_cap_and_go_with_a_revoke() {
        let r = Registry::default();
        let refused = FileOutcome::Refused {
            reason: "wrong secret".into(),
        };
        r.note_file("gpu1", "a.json", &FileOutcome::Accepted, 1);
        r.note_file("gpu1", "b.json", &refused, 2);
        r.note_file("gpu2", "c.json", &FileOutcome::Duplicate, 3);
        let files = r.files("gpu1");
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].name, "b.json");
        assert_eq!(files[0].outcome, FileAnswer::Refused);
        assert_eq!(files[0].reason.as_deref(), Some("wrong secret"));
        assert_eq!(files[1].outcome, FileAnswer::Accepted);
        assert_eq!(files[1].reason, None);
        for i in 0..FILE_NOTES as u64 + 5 {
            r.note_file("gpu1", &format!("{i}.json"), &FileOutcome::Resolved, 10 + i);
        }
        let files = r.files("gpu1");
        assert_eq!(files.len(), FILE_NOTES);
        assert_eq!(files[0].name, format!("{}.json", FILE_NOTES + 4));
        r.revoke("gpu1");
        assert!(r.files("gpu1").is_empty());
        assert_eq!(r.files("gpu2").len(), 1);
    }
}
