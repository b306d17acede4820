//! The writer thread: the only code that changes the tables or writes the journal.
//!
//! One batch (group commit: whatever is pending, up to [`MAX_BATCH`] jobs) goes through
//! four named phases, each a method:
//! 1. [`Writer::run_jobs`]: every job runs against the layers; a job that fails has its
//!    own changes undone and its caller told, the others go on;
//! 2. [`Writer::journal`]: the batch's changes become one record, appended and
//!    `fdatasync`ed ([`BatchOutcome`] says how that went);
//! 3. [`Writer::answer`]: notices are published, then every caller is answered, then
//!    what the batch's jobs deferred until it was durable runs (`Tx::on_durable`);
//! 4. [`Writer::checkpoint`]: finished checkpoints are taken in, and the changes are
//!    frozen and handed to the checkpoint thread once due.
//!
//! Nothing here waits for redb: a checkpoint runs on its own thread, and the writer only
//! swaps in the new snapshot once it landed.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redb::{Database, ReadableDatabase};
use tokio::sync::{mpsc, watch};

use super::checkpoint::{Checkpointer, Landed};
use super::delta;
use super::error::StoreError;
use super::journal::Journal;
use super::notice::{Notices, Notifier};
use super::table::{AnyTable, Overlay, Snapshot, Undo, rollback};
use super::tx::{Deferred, Tx, outside_writer};

/// How many jobs one batch takes at most.
pub(crate) const MAX_BATCH: usize = 1024;
/// Changes are checkpointed once no batch came for this long: nobody waits on the disk
/// then, so the checkpoint's writes delay no acknowledgement ...
const CHECKPOINT_IDLE: Duration = Duration::from_millis(200);
/// ... or, under steady load, once the journal holds this much since the last one: each
/// checkpoint's writes delay the acknowledgements made while they go out, so fewer,
/// larger checkpoints (one redb commit for many rewrites of the same keys) disturb fewer
/// of them. It also bounds what a start replays and what the writer holds in memory ...
const CHECKPOINT_JOURNAL_BYTES: u64 = 16 << 20;
/// ... or at the latest this long after the first change not yet checkpointed.
const CHECKPOINT_MAX_AGE: Duration = Duration::from_secs(30);
/// A failed checkpoint is tried again after this long.
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// A job's answer, given the batch's outcome.
pub(crate) type Completion = Box<dyn FnOnce(Result<(), Arc<StoreError>>) + Send>;
/// A job: run against the writer's view (or, given `None`, not run at all: the writer is
/// stopping or broken), returning its answer and whether it failed (its changes are then
/// undone).
pub(crate) type RunFn<C> =
    Box<dyn for<'a, 'b> FnOnce(Option<&'b mut Tx<'a, C>>) -> (Completion, bool) + Send>;

pub(crate) enum Job<C> {
    Run(RunFn<C>),
    /// From the ticker: a checkpoint may be due.
    Tick,
    /// From the checkpoint thread: one finished.
    Landed,
    /// Test only: end the thread at once, as if the process died.
    #[cfg(test)]
    Crash,
    /// Test only: checkpoint what there is now.
    #[cfg(test)]
    Freeze,
}

impl<C> Job<C> {
    /// Its answer, without running it; `None` for a job nobody waits on.
    pub(crate) fn unrun(self) -> Option<Completion> {
        match self {
            Job::Run(f) => Some(f(None).0),
            _ => None,
        }
    }
}

/// How the journal phase of a batch went.
enum BatchOutcome {
    /// The batch changed nothing: nothing to write.
    Unchanged,
    /// Its record is durable under this number.
    Durable,
    /// It could not be made durable: its changes are undone and its callers get this.
    Failed(Arc<StoreError>),
}

/// What the writer is built from (see [`crate::store::Store::open`]).
pub(crate) struct WriterParts<C> {
    pub db: Arc<Database>,
    pub registry: &'static [&'static dyn AnyTable],
    pub ctx: C,
    pub rx: mpsc::Receiver<Job<C>>,
    pub wake: mpsc::WeakSender<Job<C>>,
    pub journals: [Journal; 2],
    pub paths: [PathBuf; 2],
    pub notifier: Arc<Notifier>,
    pub acked: Arc<AtomicU64>,
    pub landed: watch::Sender<u64>,
    pub fatal: watch::Sender<Option<String>>,
}

pub(crate) struct Writer<C> {
    db: Arc<Database>,
    registry: &'static [&'static dyn AnyTable],
    ctx: C,
    rx: mpsc::Receiver<Job<C>>,
    snap: Snapshot,
    /// The changes being checkpointed, and the journal number they reach.
    frozen: Option<(Arc<Overlay>, u64)>,
    /// A frozen set whose checkpoint failed waits until then to be tried again.
    retry_at: Option<Instant>,
    cur: Overlay,
    journals: [Journal; 2],
    paths: [PathBuf; 2],
    /// The journal being appended to; the other holds what `frozen` holds (or nothing).
    active: usize,
    notifier: Arc<Notifier>,
    acked: Arc<AtomicU64>,
    landed: watch::Sender<u64>,
    /// Set once checkpoints cannot succeed in this process any more (see [`Writer::landed`]).
    fatal: watch::Sender<Option<String>>,
    /// Checkpoints failed in a row.
    failures: u32,
    checkpointer: Checkpointer,
    ticker: Ticker,
    /// When the oldest change not yet frozen was made.
    dirty_since: Option<Instant>,
    /// When the newest batch with changes was made durable.
    last_change: Option<Instant>,
    broken: Option<String>,
    /// Test only: the next checkpoint phase freezes whatever there is.
    #[cfg(test)]
    force_freeze: bool,
}

impl<C> Writer<C> {
    pub(crate) fn new(p: WriterParts<C>) -> Result<Self, StoreError>
    where
        C: Send + 'static,
    {
        let snap = Snapshot::open(&p.db.begin_read()?, p.registry)?;
        let checkpointer =
            Checkpointer::start(p.db.clone(), p.registry, p.wake.clone(), || Job::Landed).map_err(
                |e| StoreError::Decode(format!("cannot start the checkpoint thread: {e}")),
            )?;
        let ticker = Ticker::start(p.wake)
            .map_err(|e| StoreError::Decode(format!("cannot start the store's ticker: {e}")))?;
        Ok(Writer {
            snap,
            frozen: None,
            retry_at: None,
            cur: Overlay::new(p.registry.len()),
            db: p.db,
            registry: p.registry,
            ctx: p.ctx,
            rx: p.rx,
            journals: p.journals,
            paths: p.paths,
            active: 0,
            notifier: p.notifier,
            acked: p.acked,
            landed: p.landed,
            fatal: p.fatal,
            failures: 0,
            checkpointer,
            ticker,
            dirty_since: None,
            last_change: None,
            broken: None,
            #[cfg(test)]
            force_freeze: false,
        })
    }

    pub(crate) fn run(mut self) {
        let mut batch: Vec<Job<C>> = Vec::with_capacity(MAX_BATCH);
        loop {
            let Some(first) = self.rx.blocking_recv() else {
                return self.close();
            };
            if self.broken.is_some() {
                self.refuse(first);
                continue;
            }
            batch.push(first);
            let started = Instant::now();
            take_pending(&mut self.rx, &mut batch);
            let Some(mut ran) = self.run_jobs(&mut batch) else {
                return; // a test's crash
            };
            let outcome = self.journal(&mut ran.undo);
            let durable = matches!(outcome, BatchOutcome::Durable);
            let result = match outcome {
                BatchOutcome::Unchanged | BatchOutcome::Durable => Ok(()),
                BatchOutcome::Failed(e) => Err(e),
            };
            if durable {
                crate::metrics::metrics().commit(started.elapsed().as_secs_f64());
            }
            answer(&self.notifier, ran, result);
            self.checkpoint();
        }
    }

    /// Phase 1: runs every job of the batch. Returns the answers, the batch's changes (to
    /// journal, or undo), its notices and what it deferred; `None` on a test's crash.
    fn run_jobs(&mut self, batch: &mut Vec<Job<C>>) -> Option<Ran> {
        let frozen = self.frozen.as_ref().map(|(f, _)| f.as_ref());
        let ran = run_batch(
            self.registry,
            &self.snap,
            frozen,
            &mut self.cur,
            &self.ctx,
            batch,
        )?;
        #[cfg(test)]
        {
            self.force_freeze |= ran.freeze;
        }
        Some(ran)
    }

    /// Phase 2: the batch's changes as one journal record, appended and synced. On
    /// failure the changes are undone.
    fn journal(&mut self, undo: &mut Vec<Undo>) -> BatchOutcome {
        if undo.is_empty() {
            return BatchOutcome::Unchanged;
        }
        let record = delta::encode(self.registry, &self.cur, undo);
        let j = &mut self.journals[self.active];
        let path = self.paths[self.active].display().to_string();
        let failed = if record.len() > super::journal::MAX_RECORD {
            // Several writes, each small enough alone (`run_jobs` refused any that was
            // not), together more than a record holds: each may be made again.
            tracing::warn!(
                bytes = record.len(),
                limit = super::journal::MAX_RECORD,
                "a batch of writes was more than one journal record may hold; its callers get an error and may write again"
            );
            Some(StoreError::Journal {
                path,
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "the batch's changes, {} bytes, are more than one record may hold ({} bytes); write again",
                        record.len(),
                        super::journal::MAX_RECORD
                    ),
                ),
            })
        } else if !j.fits(record.len(), 1) {
            Some(StoreError::Full(match self.broken.as_deref() {
                Some(why) => format!(
                    "the journal {path} is full ({} bytes used, a write of {} more does not fit): checkpoints into redb are failing ({why})",
                    j.used(),
                    record.len()
                ),
                None => format!(
                    "the journal {path} is full ({} bytes used, a write of {} more does not fit) until a checkpoint into redb lands",
                    j.used(),
                    record.len()
                ),
            }))
        } else {
            match j.append([record.as_slice()]) {
                Ok(seq) => {
                    self.acked.store(seq, Ordering::Release);
                    let now = Instant::now();
                    self.dirty_since.get_or_insert(now);
                    self.last_change = Some(now);
                    return BatchOutcome::Durable;
                }
                Err(super::journal::JournalError::Io(source)) => {
                    tracing::error!(error = %source, journal = %path, "cannot write the store's journal; this batch's callers get an error");
                    Some(StoreError::Journal { path, source })
                }
                Err(super::journal::JournalError::Unerased { source, erase }) => {
                    tracing::error!(error = %source, erase_error = %erase, journal = %path, "the store's journal holds records of a failed batch that cannot be erased; the store takes no more writes until the hub restarts, and a restart may count that batch although its callers got an error");
                    self.broken = Some(format!(
                        "the journal {path} could not be written or repaired: {erase}"
                    ));
                    Some(StoreError::Journal { path, source })
                }
            }
        };
        rollback(&mut self.cur, undo, 0);
        BatchOutcome::Failed(Arc::new(failed.unwrap_or(StoreError::Closed)))
    }

    /// Phase 4: takes in a finished checkpoint, and starts the next once it is due.
    fn checkpoint(&mut self) {
        while let Some(l) = self.checkpointer.finished() {
            self.landed(l);
        }
        if let Some((changes, seq)) = &self.frozen {
            if self.retry_at.is_some_and(|t| t <= Instant::now()) {
                self.retry_at = None;
                if let Err(e) = self.checkpointer.send(changes.clone(), *seq) {
                    self.broken = Some(e.to_string());
                }
            } else if self.retry_at.is_some() {
                self.ticker.arm();
            }
            return;
        }
        let idle = self
            .last_change
            .is_some_and(|t| t.elapsed() >= CHECKPOINT_IDLE);
        let large = self.journals[self.active].used() >= CHECKPOINT_JOURNAL_BYTES;
        let old = self
            .dirty_since
            .is_some_and(|t| t.elapsed() >= CHECKPOINT_MAX_AGE);
        #[allow(unused_mut)]
        let mut due = idle || large || old;
        #[cfg(test)]
        {
            due |= std::mem::take(&mut self.force_freeze);
        }
        if due && !self.cur.is_empty() {
            self.freeze();
        } else if self.dirty_since.is_some() {
            self.ticker.arm();
        }
    }

    /// Hands the current changes to the checkpoint thread and starts a fresh layer; the
    /// journal goes on in its other file.
    fn freeze(&mut self) {
        let seq = self.journals[self.active].last_seq();
        let changes = Arc::new(std::mem::replace(
            &mut self.cur,
            Overlay::new(self.registry.len()),
        ));
        self.dirty_since = None;
        if let Err(e) = self.checkpointer.send(changes.clone(), seq) {
            self.broken = Some(e.to_string());
        }
        self.frozen = Some((changes, seq));
        // Everything the other file holds is in the last checkpoint.
        self.active = 1 - self.active;
        self.journals[self.active].rewind(seq);
    }

    fn landed(&mut self, l: Landed) {
        match l.result {
            Ok(()) => match self
                .db
                .begin_read()
                .map_err(StoreError::from)
                .and_then(|r| Snapshot::open(&r, self.registry))
            {
                Ok(snap) => {
                    self.snap = snap;
                    self.frozen = None;
                    self.failures = 0;
                    self.landed.send_replace(l.seq);
                    // For benchmarks: how many checkpoints a measured run contained.
                    cortex_host::timing::record("checkpoint", "store", None);
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot read the store after a checkpoint; the store takes no more writes until the hub restarts");
                    self.broken = Some(e.to_string());
                }
            },
            Err(e) if self.failures == 0 => {
                self.failures += 1;
                tracing::error!(error = %e, "a checkpoint into redb failed; its changes stay in memory and in the journal, and it is tried again shortly");
                self.retry_at = Some(Instant::now() + RETRY_AFTER);
                self.ticker.arm();
            }
            Err(e) => {
                // redb refuses every write after an I/O error (a full disk, say) until it
                // is opened again: this process cannot checkpoint any more. Stop, so the
                // service manager restarts the hub, which replays the journal.
                let why = format!(
                    "checkpoints into redb keep failing ({e}); every acknowledged change is in the journal, and the next start applies it"
                );
                tracing::error!("{why}");
                self.broken = Some(why.clone());
                self.fatal.send_replace(Some(why));
            }
        }
    }

    /// Every handle is gone: the last changes are checkpointed before the thread ends.
    fn close(mut self) {
        // Only a checkpoint in flight is waited for: after a failed one nothing may be.
        if let Some(l) = self.checkpointer.wait() {
            self.landed(l);
        }
        if self.broken.is_some() || self.frozen.is_some() {
            return;
        }
        let seq = self.journals[self.active].last_seq();
        match super::checkpoint::write_marked(&self.db, self.registry, &self.cur, seq, true) {
            Ok(()) => {
                self.landed.send_replace(seq);
            }
            Err(e) => {
                tracing::error!(error = %e, "the last checkpoint failed; the journal keeps the changes and the next start applies them");
            }
        }
    }

    fn refuse(&self, job: Job<C>) {
        let why = self.broken.clone().unwrap_or_default();
        if let Some(done) = job.unrun() {
            done(Err(Arc::new(StoreError::Broken(why))));
        }
    }
}

impl<C> Drop for Writer<C> {
    fn drop(&mut self) {
        self.ticker.stop();
        self.checkpointer.stop();
    }
}

/// Adds to `batch` (group commit) whatever else is queued, up to [`MAX_BATCH`] jobs.
pub(crate) fn take_pending<C>(rx: &mut mpsc::Receiver<Job<C>>, batch: &mut Vec<Job<C>>) {
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(j) => batch.push(j),
            Err(_) => break,
        }
    }
}

/// What phase 1 made of a batch: the answers, its changes (to make durable, or undo), its
/// notices and what it deferred.
pub(crate) struct Ran {
    pub completions: Vec<Completion>,
    pub undo: Vec<Undo>,
    pub notices: Notices,
    pub after: Vec<Deferred>,
    /// Test only: a job asked for a checkpoint now.
    #[cfg(test)]
    pub freeze: bool,
}

/// Phase 1, whatever the backend: every job of `batch` runs against `snap` under the
/// layers; a job that fails, or whose changes alone are more than a journal record may
/// hold, has its own changes undone and its caller told, the others go on. `None` on a
/// test's crash.
pub(crate) fn run_batch<C>(
    registry: &'static [&'static dyn AnyTable],
    snap: &Snapshot,
    frozen: Option<&Overlay>,
    cur: &mut Overlay,
    ctx: &C,
    batch: &mut Vec<Job<C>>,
) -> Option<Ran> {
    let mut ran = Ran {
        completions: Vec::with_capacity(batch.len()),
        undo: Vec::new(),
        notices: Notices::new(),
        after: Vec::new(),
        #[cfg(test)]
        freeze: false,
    };
    for job in batch.drain(..) {
        match job {
            Job::Run(f) => {
                let mark = ran.undo.len();
                let deferred = ran.after.len();
                let before = ran.notices.clone();
                let mut tx = Tx::new(
                    registry,
                    snap,
                    frozen,
                    cur,
                    &mut ran.undo,
                    &mut ran.notices,
                    &mut ran.after,
                    ctx,
                );
                let (done, failed) = f(Some(&mut tx));
                // A job whose changes alone are more than a record may hold is refused
                // alone: the jobs batched with it go on.
                let alone = (!failed)
                    .then(|| delta::encoded_len(registry, cur, &ran.undo[mark..]))
                    .filter(|&n| n > super::journal::MAX_RECORD);
                if failed || alone.is_some() {
                    rollback(cur, &mut ran.undo, mark);
                    ran.notices = before;
                    ran.after.truncate(deferred);
                }
                match alone {
                    Some(bytes) => {
                        tracing::warn!(
                            bytes,
                            limit = super::journal::MAX_RECORD,
                            "a write was refused: its changes are more than one journal record may hold"
                        );
                        done(Err(Arc::new(StoreError::TooLarge {
                            bytes,
                            limit: super::journal::MAX_RECORD,
                        })));
                    }
                    None => ran.completions.push(done),
                }
            }
            Job::Tick | Job::Landed => {}
            #[cfg(test)]
            Job::Crash => return None,
            #[cfg(test)]
            Job::Freeze => ran.freeze = true,
        }
    }
    Some(ran)
}

/// Phase 3, whatever the backend: notices first (so a caller sees its own change
/// everywhere), then the answers, then (only if the batch is durable) what its jobs
/// deferred until it was.
pub(crate) fn answer(notifier: &Notifier, ran: Ran, result: Result<(), Arc<StoreError>>) {
    let ok = result.is_ok();
    if ok {
        notifier.publish(ran.notices);
    }
    for c in ran.completions {
        c(result.clone());
    }
    if ok {
        for f in ran.after {
            f();
        }
    }
}

/// Nudges the writer [`CHECKPOINT_IDLE`] after it is armed, so changes reach redb
/// without the writer waiting on a timer itself: it blocks on its queue alone. Parked
/// (no wake-ups at all) while nothing waits.
pub(crate) struct Ticker {
    thread: std::thread::Thread,
    stop: Arc<std::sync::atomic::AtomicBool>,
    armed: Arc<std::sync::atomic::AtomicBool>,
}

impl Ticker {
    fn start<C: Send + 'static>(jobs: mpsc::WeakSender<Job<C>>) -> std::io::Result<Ticker> {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s, a) = (stop.clone(), armed.clone());
        let handle = std::thread::Builder::new()
            .name("store-ticker".into())
            .spawn(move || {
                loop {
                    std::thread::park();
                    if s.load(Ordering::Acquire) {
                        return;
                    }
                    if !a.swap(false, Ordering::AcqRel) {
                        continue;
                    }
                    std::thread::sleep(RETRY_AFTER.min(CHECKPOINT_IDLE));
                    let Some(tx) = jobs.upgrade() else { return };
                    // A full queue means the writer is busy and looks by itself.
                    let _ = tx.try_send(Job::Tick);
                }
            })?;
        Ok(Ticker {
            thread: handle.thread().clone(),
            stop,
            armed,
        })
    }

    fn arm(&self) {
        if !self.armed.swap(true, Ordering::AcqRel) {
            self.thread.unpark();
        }
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// Applies a journal record an older hub wrote (an operation, not its changes).
pub(crate) type Legacy<C> = dyn Fn(&mut Tx<'_, C>, &[u8]) -> Result<(), StoreError>;

/// What a replay applied, and the records it found missing (ranges, inclusive).
pub(crate) struct Replayed {
    pub applied: usize,
    pub gaps: Vec<(u64, u64)>,
}

/// Applies the journal records newer than the last checkpoint, in order, and
/// checkpoints them. `legacy` applies a record older hubs wrote (an operation, not its
/// changes). A gap in the numbers is damage; with `salvage` it is reported and skipped
/// (a recovery keeps what it can read).
pub(crate) fn recover<C>(
    db: &Database,
    registry: &'static [&'static dyn AnyTable],
    ctx: &C,
    journals: &mut [Journal; 2],
    records: Vec<super::journal::Record>,
    legacy: &Legacy<C>,
    salvage: bool,
) -> Result<Replayed, StoreError> {
    let snap = Snapshot::open(&db.begin_read()?, registry)?;
    let mark = outside_writer(
        registry,
        &snap,
        &mut Overlay::new(registry.len()),
        ctx,
        |t| {
            t.table(&super::checkpoint::META)
                .get(super::checkpoint::JOURNAL_SEQ)
                .map(|v| v.map_or(0, |v| v.value()))
        },
    )?;
    let mut records: Vec<_> = records.into_iter().filter(|r| r.seq > mark).collect();
    records.sort_by_key(|r| r.seq);
    let mut cur = Overlay::new(registry.len());
    let mut last = mark;
    let mut gaps = Vec::new();
    for rec in &records {
        if rec.seq != last + 1 {
            if !salvage {
                return Err(StoreError::Damaged(format!(
                    "the journal has a gap: record {} follows {last}; acknowledged changes are missing",
                    rec.seq
                )));
            }
            gaps.push((last + 1, rec.seq - 1));
        }
        if rec.payload.first() == Some(&delta::TAG) {
            let changes = delta::decode(registry, &rec.payload)?;
            delta::apply(registry, &mut cur, changes);
        } else {
            outside_writer(registry, &snap, &mut cur, ctx, |t| legacy(t, &rec.payload)).map_err(
                |e| {
                    StoreError::Decode(format!(
                        "journal record {} cannot be replayed ({e}); keep the journal files for a hub version that can",
                        rec.seq
                    ))
                },
            )?;
        }
        last = rec.seq;
    }
    if !cur.is_empty() || last != mark {
        super::checkpoint::write(db, registry, &cur, last)?;
    }
    for j in journals.iter_mut() {
        j.rewind(last);
    }
    Ok(Replayed {
        applied: records.len(),
        gaps,
    })
}
