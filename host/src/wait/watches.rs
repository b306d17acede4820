//! One inotify instance shared by every file and flock wait of a process, with waiters
//! counted per watch descriptor.
//!
//! Watches and instances are limited per user (`max_user_watches`, `max_user_instances`), so
//! a daemon with many waits must not open an instance per wait. The kernel gives one watch
//! descriptor per inode and instance: two waits on the same file (or on files in the same
//! directory) share it, so this module
//! - adds every watch with `IN_MASK_ADD` (a plain second `inotify_add_watch` would replace
//!   the first waiter's mask);
//! - keeps a list of subscribers per descriptor, and removes the kernel's watch only when
//!   the last one leaves (inotify-rs issue 62); the widened mask is never narrowed again,
//!   each subscriber filters the event types it asked for;
//! - forgets a descriptor when `IN_IGNORED` says the kernel dropped it, so a later removal
//!   cannot hit a reused number;
//! - turns `IN_Q_OVERFLOW` (and a subscriber's own queue overflowing) into
//!   [`Delivery::Overflow`] for every subscriber: events were lost, look at the file again.
//!
//! Who reads the instance: [`FileWatches::own`] creates one on first use and reads it in a
//! task of its own, aborted when the last handle (a `Waits` or an armed wait) is dropped.
//! [`FileWatches::sharing`] takes the `Watches` of an instance someone else reads (the
//! device agent's `SpoolWatcher`); that reader must hand every event to
//! [`FileWatches::dispatch`], the spool's own descriptors included, since a wait may watch
//! the very directory the spool watcher watches and then shares its descriptor. That
//! reader's own watches are *pinned* ([`FileWatches::pin`]): the last waiter leaving a
//! pinned descriptor leaves the kernel's watch in place, and the reader lets go of it with
//! [`FileWatches::release_pinned`], which removes it only if no waiter uses it either.
//!
//! It never interprets an event: what a close or a create means belongs to the waits.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsString;
use std::io;
use std::os::raw::c_int;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use inotify::{EventMask, EventOwned, EventStream, Inotify, WatchDescriptor, WatchMask, Watches};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;

/// Big enough for a burst of a few hundred events; one needs at most 16 + NAME_MAX + 1.
const READ_BUF_BYTES: usize = 16 * 1024;

/// Events queued for one subscriber beyond this are dropped and replaced by an overflow,
/// so a busy directory cannot grow a slow waiter's queue without bound.
const MAILBOX_CAP: usize = 256;

/// Event types every subscriber gets, whatever it asked for.
const ALWAYS: EventMask = EventMask::IGNORED
    .union(EventMask::UNMOUNT)
    .union(EventMask::Q_OVERFLOW);

/// A handle on the shared instance. Cheap to clone.
#[derive(Clone)]
pub struct FileWatches {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FileWatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let reg = self.shared.lock();
        f.debug_struct("FileWatches")
            .field("own", &self.shared.own)
            .field("descriptors", &reg.by_wd.len())
            .finish_non_exhaustive()
    }
}

struct Shared {
    /// True when this module creates and reads the instance itself.
    own: bool,
    reg: Mutex<Registry>,
}

struct Registry {
    /// `None` until an own instance is first needed.
    watches: Option<Watches>,
    by_wd: HashMap<c_int, WdEntry>,
    /// Descriptors the instance's reader added for itself (see the module docs).
    pinned: HashSet<c_int>,
    next_id: u64,
    /// Set once the instance can no longer be read; every subscriber then breaks.
    failed: Option<String>,
    /// The reader task of an own instance.
    pump: Option<JoinHandle<()>>,
}

struct WdEntry {
    wd: WatchDescriptor,
    subs: Vec<Sub>,
}

struct Sub {
    id: u64,
    key: u32,
    wants: EventMask,
    mailbox: Arc<Mailbox>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.reg.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let reg = self.reg.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(pump) = reg.pump.take() {
            pump.abort();
        }
    }
}

impl FileWatches {
    /// An instance of our own, created (and its reader task spawned) on first use, which
    /// must then happen inside a Tokio runtime.
    pub fn own() -> Self {
        FileWatches::with(true, None)
    }

    /// Watches on an instance someone else reads; they must pass every event to
    /// [`FileWatches::dispatch`].
    pub fn sharing(watches: Watches) -> Self {
        FileWatches::with(false, Some(watches))
    }

    fn with(own: bool, watches: Option<Watches>) -> Self {
        FileWatches {
            shared: Arc::new(Shared {
                own,
                reg: Mutex::new(Registry {
                    watches,
                    by_wd: HashMap::new(),
                    pinned: HashSet::new(),
                    next_id: 1,
                    failed: None,
                    pump: None,
                }),
            }),
        }
    }

    /// A new, empty subscription: one mailbox that any number of watches feed.
    pub fn subscribe(&self) -> Subscription {
        Subscription {
            watches: self.clone(),
            mailbox: Arc::new(Mailbox::default()),
            ids: Vec::new(),
        }
    }

    /// How many descriptors have subscribers now (for tests and the agent's status).
    pub fn descriptors(&self) -> usize {
        self.shared.lock().by_wd.len()
    }

    /// The shared instance's reader added `wd` for itself (adding with `IN_MASK_ADD`, so a
    /// waiter's mask on the same inode is widened, not replaced): waiters leaving it never
    /// remove the kernel's watch.
    pub fn pin(&self, wd: &WatchDescriptor) {
        self.shared
            .lock()
            .pinned
            .insert(wd.get_watch_descriptor_id());
    }

    /// The reader no longer needs `wd`: the kernel's watch is removed unless a waiter still
    /// uses it. Errors of the removal (the kernel dropped it already) are ignored.
    pub fn release_pinned(&self, wd: WatchDescriptor) {
        let mut reg = self.shared.lock();
        let id = wd.get_watch_descriptor_id();
        reg.pinned.remove(&id);
        if !reg.by_wd.contains_key(&id)
            && let Some(watches) = reg.watches.as_mut()
        {
            let _ = watches.remove(wd);
        }
    }

    /// Routes one event of the shared instance to its subscribers. Returns whether anyone
    /// here had asked for the event's descriptor.
    pub fn dispatch(&self, ev: &EventOwned) -> bool {
        let mut reg = self.shared.lock();
        if ev.mask.contains(EventMask::Q_OVERFLOW) {
            for sub in reg.by_wd.values().flat_map(|e| &e.subs) {
                sub.mailbox.overflow();
            }
            return !reg.by_wd.is_empty();
        }
        let id = ev.wd.get_watch_descriptor_id();
        let Some(entry) = reg.by_wd.get(&id) else {
            return false;
        };
        for sub in &entry.subs {
            if ev.mask.intersects(sub.wants | ALWAYS) {
                sub.mailbox.push(Delivery::Event {
                    key: sub.key,
                    mask: ev.mask,
                    name: ev.name.clone(),
                });
            }
        }
        if ev.mask.contains(EventMask::IGNORED) {
            // The kernel dropped the watch (file deleted, unmounted): its number may be
            // handed out again, so nobody may remove it later.
            reg.by_wd.remove(&id);
        }
        true
    }

    /// Forgets a pinned descriptor the kernel dropped (its `IN_IGNORED`), so a later
    /// waiter's removal of a reused number is not held back. Called by the reader.
    pub fn forget_pinned(&self, ev: &EventOwned) {
        if ev.mask.contains(EventMask::IGNORED) {
            self.shared
                .lock()
                .pinned
                .remove(&ev.wd.get_watch_descriptor_id());
        }
    }

    /// Marks the instance as unreadable: every subscriber, now and later, breaks.
    fn fail(&self, why: String) {
        let mut reg = self.shared.lock();
        for sub in reg.by_wd.values().flat_map(|e| &e.subs) {
            sub.mailbox.fail(&why);
        }
        reg.failed = Some(why);
    }

    /// Adds (or widens) the watch on `path` and registers `mailbox` for it.
    fn add(
        &self,
        path: &Path,
        mask: WatchMask,
        key: u32,
        mailbox: &Arc<Mailbox>,
    ) -> io::Result<(c_int, u64)> {
        let mut reg = self.shared.lock();
        if let Some(why) = &reg.failed {
            return Err(io::Error::other(why.clone()));
        }
        if reg.watches.is_none() && self.shared.own {
            let stream = Inotify::init()?.into_event_stream(vec![0u8; READ_BUF_BYTES])?;
            reg.watches = Some(stream.watches());
            reg.pump = Some(tokio::spawn(pump(stream, Arc::downgrade(&self.shared))));
        }
        let Some(watches) = reg.watches.as_mut() else {
            return Err(io::Error::other("no inotify instance to add the watch to"));
        };
        let wd = watches.add(path, mask | WatchMask::MASK_ADD)?;
        let id = reg.next_id;
        reg.next_id += 1;
        let wants = EventMask::from_bits_truncate(mask.bits());
        let sub = Sub {
            id,
            key,
            wants,
            mailbox: Arc::clone(mailbox),
        };
        let wd_id = wd.get_watch_descriptor_id();
        reg.by_wd
            .entry(wd_id)
            .or_insert_with(|| WdEntry {
                wd,
                subs: Vec::new(),
            })
            .subs
            .push(sub);
        Ok((wd_id, id))
    }

    fn remove(&self, wd_id: c_int, sub_id: u64) {
        let mut reg = self.shared.lock();
        let Some(entry) = reg.by_wd.get_mut(&wd_id) else {
            return;
        };
        entry.subs.retain(|s| s.id != sub_id);
        if entry.subs.is_empty()
            && let Some(entry) = reg.by_wd.remove(&wd_id)
            && !reg.pinned.contains(&wd_id)
            && let Some(watches) = reg.watches.as_mut()
        {
            // EINVAL here means the kernel already dropped it; its IN_IGNORED is on its way.
            let _ = watches.remove(entry.wd);
        }
    }
}

/// Reads an own instance until it fails or the last handle is gone.
async fn pump(mut stream: EventStream<Vec<u8>>, shared: Weak<Shared>) {
    let why = loop {
        match stream.next().await {
            Some(Ok(ev)) => {
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                FileWatches { shared }.dispatch(&ev);
            }
            Some(Err(e)) => break format!("reading inotify failed: {e}"),
            None => break "the inotify instance was closed".to_string(),
        }
    };
    if let Some(shared) = shared.upgrade() {
        FileWatches { shared }.fail(why);
    }
}

/// What a subscription receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// An event on the watch registered with `key`.
    Event {
        key: u32,
        mask: EventMask,
        name: Option<OsString>,
    },
    /// Events were lost (the kernel's queue or this subscriber's): look again.
    Overflow,
    /// The instance can no longer be read; nothing more will come.
    Failed(String),
}

#[derive(Default)]
struct Mailbox {
    state: Mutex<MailboxState>,
    notify: Notify,
}

#[derive(Default)]
struct MailboxState {
    queue: VecDeque<Delivery>,
    overflowed: bool,
    failed: Option<String>,
}

impl Mailbox {
    fn lock(&self) -> MutexGuard<'_, MailboxState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, d: Delivery) {
        {
            let mut st = self.lock();
            if st.queue.len() >= MAILBOX_CAP {
                st.queue.clear();
                st.overflowed = true;
            } else {
                st.queue.push_back(d);
            }
        }
        // One consumer: `notify_one` keeps a permit if it is not waiting right now.
        self.notify.notify_one();
    }

    fn overflow(&self) {
        self.lock().overflowed = true;
        self.notify.notify_one();
    }

    fn fail(&self, why: &str) {
        self.lock().failed = Some(why.to_string());
        self.notify.notify_one();
    }

    fn take(&self) -> Option<Delivery> {
        let mut st = self.lock();
        if let Some(why) = &st.failed {
            return Some(Delivery::Failed(why.clone()));
        }
        // Events queued before the overflow are still worth reading first; the overflow
        // comes once they are drained.
        if let Some(d) = st.queue.pop_front() {
            return Some(d);
        }
        if std::mem::take(&mut st.overflowed) {
            return Some(Delivery::Overflow);
        }
        None
    }
}

/// Some watches feeding one mailbox. Dropping it removes its subscribers, and the kernel's
/// watches that no one else uses.
pub struct Subscription {
    watches: FileWatches,
    mailbox: Arc<Mailbox>,
    /// (descriptor, subscriber id, key) of each watch added.
    ids: Vec<(c_int, u64, u32)>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("watches", &self.ids.len())
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// Watches `path` for `mask`; its events arrive tagged with `key`.
    pub fn add(&mut self, path: &Path, mask: WatchMask, key: u32) -> io::Result<()> {
        let (wd, id) = self.watches.add(path, mask, key, &self.mailbox)?;
        self.ids.push((wd, id, key));
        Ok(())
    }

    /// Stops the watches added with `key` (a log wait letting go of a rotated file).
    /// Their events already queued still arrive, tagged with `key`.
    pub fn remove_key(&mut self, key: u32) {
        let watches = &self.watches;
        self.ids.retain(|&(wd, id, k)| {
            if k == key {
                watches.remove(wd, id);
            }
            k != key
        });
    }

    /// The next delivery if one is queued, without waiting (to take a burst at once).
    pub fn try_next(&self) -> Option<Delivery> {
        self.mailbox.take()
    }

    /// The next delivery. Cancel-safe: nothing is taken until it is returned.
    pub async fn next(&self) -> Delivery {
        loop {
            if let Some(d) = self.mailbox.take() {
                return d;
            }
            self.mailbox.notify.notified().await;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        for (wd, id, _) in self.ids.drain(..) {
            self.watches.remove(wd, id);
        }
    }
}
