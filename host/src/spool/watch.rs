//! Watching the spool with inotify: says *when* to look, never reads or deletes a file.
//!
//! [`SpoolWatcher`] owns the process's one inotify instance (watches and instances are
//! limited per user, so file waits will share it) and yields [`SpoolEvent`]s:
//! - `Rescan(Start)` first, always: the watch is added before the caller can list, so a file
//!   dropped between the two cannot be missed (inotify-tools issue 126);
//! - `File(name)` on `IN_MOVED_TO` (the shell drop's `mv "$f.tmp" "$f.json"`) and on
//!   `IN_CLOSE_WRITE` (a `.json` written in place) of a candidate name; never on `IN_CREATE`,
//!   when the file is still empty; `.tmp` names and dotfiles are ignored;
//! - `Rescan(Overflow)` on `IN_Q_OVERFLOW`: events were dropped;
//! - `Rescan(Recreated)` after the directory was deleted, moved or unmounted, once it is
//!   recreated (0700, with `bad/`), the [`Spool`]'s handles are reopened (a claimed spool
//!   takes its collector lock on the new directory) and the watch re-added;
//! - `Rescan(Periodic)` on an optional slow timer, since inotify never sees writes made on
//!   another host of a network filesystem, nor through mmap (inotify(7)); the tick also
//!   checks that the collector lock file is still the one locked.
//!
//! A claimed spool that another process took (its lock, after a recreate or a removed lock
//! file) is reported once as `Err(`[`SpoolError::LockLost`]`)`: the caller must stop
//! collecting. The watcher goes on watching (the device agent's waits share it).
//!
//! While nothing happens the task sleeps in the kernel: no timer runs except the optional
//! periodic rescan and, after an error, the retry delay.
//!
//! The parent directory is watched too. The [`Spool`] keeps the directory open, and an open
//! directory's `IN_DELETE_SELF` is only reported once the last descriptor on it is closed:
//! after `rm -rf` of the spool the kernel stays silent on the spool's own watch. The parent's
//! `IN_DELETE` / `IN_MOVED_FROM` / `IN_MOVED_TO` of the spool's name is what says it went away
//! or was replaced. The parent is watched following links (a symlinked `~/.cortex` is
//! normal); the spool itself never is.
//!
//! Routing is by watch descriptor: events for the spool's descriptor are mapped here; an
//! overflow (descriptor -1) concerns every watch. File and flock waits (the device agent's
//! remote waits) share this instance through [`SpoolWatcher::waits`]: every event read here
//! is handed to their registry ([`crate::wait::FileWatches::dispatch`]) before this module
//! looks at it, the spool's own descriptors included (a wait on a file in the spool's parent
//! shares the parent's descriptor: one inode, one descriptor). So that sharing never
//! clobbers a waiter, this module adds its watches with `IN_MASK_ADD` (a plain second
//! `inotify_add_watch` on one inode replaces its mask), pins them in the registry (the last
//! waiter leaving keeps them), and lets go of them through it (removed only if no waiter
//! uses them). The caller must then poll [`SpoolWatcher::next`] at all times, or the waits
//! hear nothing.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use inotify::{EventMask, EventOwned, EventStream, Inotify, WatchDescriptor, WatchMask, Watches};
use rustix::io::Errno;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_stream::StreamExt;

use super::{Spool, SpoolError, is_candidate};
use crate::wait::{FileWatches, Waits};

/// What the spool's watch asks of the kernel. `IN_IGNORED`, `IN_UNMOUNT` and `IN_Q_OVERFLOW`
/// are always reported. `ONLYDIR | DONT_FOLLOW`: never watch a file, or a directory a link
/// points to, in the spool's place. `EXCL_UNLINK`: no events for files already unlinked.
const SPOOL_MASK: WatchMask = WatchMask::ONLYDIR
    .union(WatchMask::MASK_ADD)
    .union(WatchMask::DONT_FOLLOW)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::CLOSE_WRITE)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::EXCL_UNLINK);

/// What the parent's watch asks: the spool's name leaving or being replaced, and the parent
/// itself going away. No `DONT_FOLLOW`: a parent reached through a link is legitimate.
const PARENT_MASK: WatchMask = WatchMask::ONLYDIR
    .union(WatchMask::MASK_ADD)
    .union(WatchMask::DELETE)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::EXCL_UNLINK);

/// The read buffer. One event needs `sizeof(inotify_event) + NAME_MAX + 1` = 16 + 256 bytes;
/// 64 KiB takes a burst of a few hundred events in one read.
const READ_BUF_BYTES: usize = 64 * 1024;

/// After an error, wait this long before the next try, doubling up to the maximum, so a
/// caller that loops on `next()` does not spin while, say, the parent directory is unusable.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// How often `attach` retries when the spool path is swapped between opening and watching.
const ATTACH_TRIES: usize = 3;

/// What the caller should do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpoolEvent {
    /// Read this name (it may already be gone: [`super::Refusal::Gone`] is fine).
    File(String),
    /// List the whole spool ([`Spool::list`]) and handle every name.
    Rescan(RescanReason),
}

/// Why a full listing is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RescanReason {
    /// The watch was just added: files dropped before it are only found by listing.
    Start,
    /// The kernel's event queue overflowed (`IN_Q_OVERFLOW`): events were lost.
    Overflow,
    /// The directory was deleted, moved or unmounted and has been recreated.
    Recreated,
    /// The slow timer: catches writes inotify cannot see (network filesystems, mmap).
    Periodic,
}

impl RescanReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RescanReason::Start => "start",
            RescanReason::Overflow => "overflow",
            RescanReason::Recreated => "recreated",
            RescanReason::Periodic => "periodic",
        }
    }
}

impl fmt::Display for RescanReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one raw event on the spool's descriptor means. Pure, so the mapping is tested
/// without provoking the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    Ignore,
    File(String),
    Overflow,
    /// The watched directory is gone (deleted, moved, unmounted) or its watch was removed.
    DirGone,
}

const SELF_GONE: EventMask = EventMask::DELETE_SELF
    .union(EventMask::MOVE_SELF)
    .union(EventMask::IGNORED)
    .union(EventMask::UNMOUNT);

/// An event on the spool directory's own watch.
pub(crate) fn classify(mask: EventMask, name: Option<&OsStr>) -> Action {
    if mask.contains(EventMask::Q_OVERFLOW) {
        return Action::Overflow;
    }
    if mask.intersects(SELF_GONE) {
        return Action::DirGone;
    }
    if mask.contains(EventMask::ISDIR) {
        return Action::Ignore;
    }
    if mask.intersects(EventMask::MOVED_TO | EventMask::CLOSE_WRITE) {
        // A name that is not UTF-8 cannot be a candidate `list` returns either.
        if let Some(name) = name.and_then(OsStr::to_str)
            && is_candidate(name)
        {
            return Action::File(name.to_owned());
        }
    }
    Action::Ignore
}

/// An event on the parent directory's watch: only the spool's own name matters there.
pub(crate) fn classify_parent(mask: EventMask, name: Option<&OsStr>, spool_name: &OsStr) -> Action {
    if mask.contains(EventMask::Q_OVERFLOW) {
        return Action::Overflow;
    }
    // The parent moved or vanished: the spool's path now leads elsewhere, or nowhere.
    if mask.intersects(SELF_GONE) {
        return Action::DirGone;
    }
    if name == Some(spool_name)
        && mask.intersects(EventMask::DELETE | EventMask::MOVED_FROM | EventMask::MOVED_TO)
    {
        return Action::DirGone;
    }
    Action::Ignore
}

/// The spool's inotify watcher; see the module docs. Create it inside a Tokio runtime.
///
/// [`SpoolWatcher::next`] is cancel-safe: it can sit in a `tokio::select!` with the daemon's
/// other sources without losing events.
pub struct SpoolWatcher {
    spool: Arc<Spool>,
    events: EventStream<Vec<u8>>,
    watches: Watches,
    /// `None` while the directory is gone and not yet re-watched.
    spool_wd: Option<WatchDescriptor>,
    /// The parent's watch; `None` also when the spool is `/` (no parent).
    parent_wd: Option<WatchDescriptor>,
    queue: VecDeque<SpoolEvent>,
    periodic: Option<Interval>,
    needs_attach: bool,
    retry_at: Option<Instant>,
    retry_delay: Duration,
    /// The waits sharing this instance, once [`SpoolWatcher::waits`] was called.
    files: Option<FileWatches>,
    /// An error to hand out before anything else: the collector lock was lost.
    failed: Option<SpoolError>,
    /// The loss was reported; it is reported once.
    told_lost: bool,
}

impl fmt::Debug for SpoolWatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpoolWatcher")
            .field("spool", &self.spool.path())
            .field("spool_wd", &self.spool_wd)
            .field("queued", &self.queue.len())
            .field("periodic", &self.periodic.as_ref().map(Interval::period))
            .finish_non_exhaustive()
    }
}

enum Woke {
    Event(Option<io::Result<EventOwned>>),
    Tick,
}

impl SpoolWatcher {
    /// Add the watch on `spool` and queue `Rescan(Start)`. `periodic_rescan`: how often to
    /// yield `Rescan(Periodic)` (`None` or zero: never).
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime (registering the inotify descriptor needs its reactor).
    pub fn new(spool: Arc<Spool>, periodic_rescan: Option<Duration>) -> Result<Self, SpoolError> {
        let path = spool.path().to_owned();
        let events = Inotify::init()
            .and_then(|inotify| inotify.into_event_stream(vec![0u8; READ_BUF_BYTES]))
            .map_err(|e| watch_error(&path, e))?;
        let watches = events.watches();
        let periodic = periodic_rescan.filter(|p| !p.is_zero()).map(|period| {
            let mut t = tokio::time::interval_at(Instant::now() + period, period);
            // A suspended laptop wakes to one rescan, not a burst of them.
            t.set_missed_tick_behavior(MissedTickBehavior::Delay);
            t
        });
        let mut watcher = SpoolWatcher {
            spool,
            events,
            watches,
            spool_wd: None,
            parent_wd: None,
            queue: VecDeque::new(),
            periodic,
            needs_attach: false,
            retry_at: None,
            retry_delay: RETRY_MIN,
            files: None,
            failed: None,
            told_lost: false,
        };
        watcher.attach(false)?;
        watcher
            .queue
            .push_back(SpoolEvent::Rescan(RescanReason::Start));
        Ok(watcher)
    }

    /// The spool this watcher watches (and reopens when it is recreated).
    pub fn spool(&self) -> &Arc<Spool> {
        &self.spool
    }

    /// The inotify instance's watch list, for adding other watches to the same instance.
    /// Events of descriptors other than the spool's are dropped by `next` unless they belong
    /// to [`SpoolWatcher::waits`].
    pub fn watches(&self) -> Watches {
        self.watches.clone()
    }

    /// File and flock waits on this instance: one inotify instance for the spool and every
    /// wait (watches and instances are limited per user). Their events are routed by `next`,
    /// which must therefore be polled at all times. Every call returns the same registry.
    pub fn waits(&mut self) -> Waits {
        let files = self
            .files
            .get_or_insert_with(|| FileWatches::sharing(self.watches.clone()))
            .clone();
        for wd in [&self.spool_wd, &self.parent_wd].into_iter().flatten() {
            files.pin(wd);
        }
        Waits::from_watches(files)
    }

    /// The next thing to do. The first call always returns `Rescan(Start)`.
    ///
    /// An error means the spool could not be recreated or re-watched, or reading the inotify
    /// instance failed. Calling `next` again retries, after a delay that grows from 1 s to 60 s
    /// while errors repeat, so a caller that logs and loops does not spin.
    pub async fn next(&mut self) -> Result<SpoolEvent, SpoolError> {
        if let Some(at) = self.retry_at {
            // Cancel-safe: `at` stays put until the sleep has completed once.
            tokio::time::sleep_until(at).await;
            self.retry_at = None;
        }
        let result = self.next_inner().await;
        match &result {
            // Not a failure of the watch: it goes on.
            Ok(_) | Err(SpoolError::LockLost { .. }) => self.retry_delay = RETRY_MIN,
            Err(_) => {
                self.retry_at = Some(Instant::now() + self.retry_delay);
                self.retry_delay = (self.retry_delay * 2).min(RETRY_MAX);
            }
        }
        result
    }

    async fn next_inner(&mut self) -> Result<SpoolEvent, SpoolError> {
        loop {
            if let Some(e) = self.failed.take() {
                return Err(e);
            }
            if let Some(event) = self.queue.pop_front() {
                return Ok(event);
            }
            if self.needs_attach {
                self.attach(true)?;
                self.push_rescan(RescanReason::Recreated);
                continue;
            }
            let woke = tokio::select! {
                ev = self.events.next() => Woke::Event(ev),
                () = tick(&mut self.periodic) => Woke::Tick,
            };
            match woke {
                Woke::Event(Some(Ok(ev))) => self.handle(ev),
                Woke::Event(Some(Err(e))) => return Err(watch_error(self.spool.path(), e)),
                Woke::Event(None) => {
                    return Err(watch_error(
                        self.spool.path(),
                        io::Error::new(io::ErrorKind::UnexpectedEof, "inotify stream ended"),
                    ));
                }
                Woke::Tick => self.on_tick(),
            }
        }
    }

    fn handle(&mut self, ev: EventOwned) {
        if let Some(files) = &self.files {
            // Waits first: a descriptor may be the spool's and a wait's at once.
            files.dispatch(&ev);
            files.forget_pinned(&ev);
        }
        let action = classify(ev.mask, ev.name.as_deref());
        if action == Action::Overflow {
            tracing::warn!(spool = %self.spool.path().display(), "inotify queue overflowed; rescanning");
            self.push_rescan(RescanReason::Overflow);
            return;
        }
        let action = if self.spool_wd.as_ref() == Some(&ev.wd) {
            action
        } else if self.parent_wd.as_ref() == Some(&ev.wd) {
            match self.spool.path().file_name() {
                Some(spool_name) => classify_parent(ev.mask, ev.name.as_deref(), spool_name),
                None => Action::Ignore,
            }
        } else {
            // Another registration's descriptor (file waits, later), or a previous descriptor
            // after a recreate (its trailing IN_IGNORED): not ours to act on.
            tracing::trace!(mask = ?ev.mask, "inotify event for another watch descriptor");
            return;
        };
        match action {
            Action::File(name) => self.queue.push_back(SpoolEvent::File(name)),
            Action::DirGone => {
                tracing::warn!(
                    spool = %self.spool.path().display(),
                    mask = ?ev.mask,
                    "spool directory went away; recreating it"
                );
                self.detach();
            }
            Action::Ignore | Action::Overflow => {}
        }
    }

    fn on_tick(&mut self) {
        match self.spool.check_lock() {
            Ok(()) => {}
            Err(e @ SpoolError::LockLost { .. }) => self.lost(e),
            Err(e) => tracing::warn!(error = %e, "cannot check the spool's collector lock"),
        }
        // A moved parent directory gives the spool no event of its own; the periodic check
        // is where that is noticed.
        match self.spool.path_matches() {
            Ok(true) => self.push_rescan(RescanReason::Periodic),
            Ok(false) => {
                tracing::warn!(
                    spool = %self.spool.path().display(),
                    "spool path no longer names the watched directory; recreating it"
                );
                self.detach();
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot check the spool path; rescanning anyway");
                self.push_rescan(RescanReason::Periodic);
            }
        }
    }

    /// Report a lost collector lock, once.
    fn lost(&mut self, e: SpoolError) {
        if !self.told_lost {
            self.told_lost = true;
            self.failed = Some(e);
        }
    }

    /// Forget the current watch; the next `next()` recreates the directory and re-watches.
    fn detach(&mut self) {
        // After a move the watches still follow the moved directories: remove them, or their
        // events would keep coming. A watch the kernel already dropped fails with EINVAL,
        // which is expected. Their trailing IN_IGNORED then carries a stale descriptor.
        for wd in [self.spool_wd.take(), self.parent_wd.take()]
            .into_iter()
            .flatten()
        {
            match &self.files {
                // A wait may use the same descriptor: removed only if none does.
                Some(files) => files.release_pinned(wd),
                None => {
                    let _ = self.watches.remove(wd);
                }
            }
        }
        self.needs_attach = true;
    }

    /// Watch the spool's parent and path, and make sure the watch and the Spool's handles are
    /// on the same directory: someone could swap the path between the two, so compare and
    /// retry. The parent is watched first, so a removal right after is never missed.
    fn attach(&mut self, reopen_first: bool) -> Result<(), SpoolError> {
        let path = self.spool.path().to_owned();
        for attempt in 0..ATTACH_TRIES {
            if reopen_first || attempt > 0 {
                match self.spool.reopen() {
                    Ok(()) => {}
                    // The handles are fresh all the same: watch them, and say it once.
                    Err(e @ SpoolError::LockLost { .. }) => self.lost(e),
                    Err(e) => return Err(e),
                }
            }
            if let Some(parent) = path.parent() {
                let wd = self
                    .watches
                    .add(parent, PARENT_MASK)
                    .map_err(|e| watch_error(parent, e))?;
                if let Some(files) = &self.files {
                    files.pin(&wd);
                }
                self.parent_wd = Some(wd);
            }
            let wd = self
                .watches
                .add(&path, SPOOL_MASK)
                .map_err(|e| watch_error(&path, e))?;
            if let Some(files) = &self.files {
                files.pin(&wd);
            }
            self.spool_wd = Some(wd);
            if self.spool.path_matches()? {
                self.needs_attach = false;
                return Ok(());
            }
            self.detach();
        }
        Err(SpoolError::Io {
            action: "watch (the path keeps changing under us)",
            path: self.spool.path().to_owned(),
            source: io::Error::other("spool path replaced while adding the watch"),
        })
    }

    /// A rescan already queued (not yet handed out) covers everything a new one would, since
    /// the caller lists only after receiving it.
    fn push_rescan(&mut self, reason: RescanReason) {
        if !self
            .queue
            .iter()
            .any(|e| matches!(e, SpoolEvent::Rescan(_)))
        {
            self.queue.push_back(SpoolEvent::Rescan(reason));
        }
    }
}

async fn tick(periodic: &mut Option<Interval>) {
    match periodic {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

fn watch_error(path: &std::path::Path, source: io::Error) -> SpoolError {
    let hint = match Errno::from_io_error(&source) {
        Some(Errno::NOSPC) => {
            "; the per-user inotify watch limit is reached: raise fs.inotify.max_user_watches"
        }
        Some(Errno::MFILE) => {
            "; the per-user inotify instance limit is reached: raise fs.inotify.max_user_instances"
        }
        _ => "",
    };
    SpoolError::Watch {
        path: path.to_owned(),
        source,
        hint,
    }
}
