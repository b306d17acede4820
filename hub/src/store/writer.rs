//! The writer thread: the only code that writes redb or the journal.
//!
//! It keeps one redb write transaction open and runs batches of jobs in it (group commit:
//! everything pending at once, up to [`MAX_BATCH`]). After a batch:
//! - if a job needs a commit ([`Kind::Durable`], or a [`Kind::Barrier`] with anything
//!   uncommitted), or the journal is full, the transaction commits, storing the newest
//!   journal number it holds, and the journal starts over; then the batch is answered;
//! - otherwise the batch's journal records ([`Kind::Journal`]) are appended and synced,
//!   and the batch is answered. The transaction stays open for the next batch; it
//!   commits about [`COMMIT_AFTER`] later (the [`Ticker`] nudges it; at most twice that),
//!   once [`COMMIT_BYTES`] of records wait, when a reader needs it, or at once when the
//!   batch added events someone may be waiting for (a wake, a hub event, a device's waits).
//!
//! A job may carry its journal record before it runs ([`RunJob::early`]: a remote wait's
//! outcome, whose record is its input). When a batch starts with such jobs, their records
//! are written first and their writeback started ([`Journal::start_writeback`]), so the
//! data travels to the disk *while* their operations run; the `fdatasync` after them then
//! mostly waits for the disk's flush. A record whose operation then changes nothing
//! replays as nothing. Only a prefix of the batch goes early, so the journal's order is
//! still the order operations ran in.
//!
//! A failed job, commit or journal write aborts the transaction; the batch's own records
//! are erased from the journal (none of them was acknowledged), and the journal's records
//! since the last commit (all of them acknowledged) are replayed into a new one, exactly
//! as after a crash. If erasing or replaying fails, the writer answers every later job
//! with an error until the hub restarts.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redb::{Database, ReadableDatabase};
use tokio::sync::{mpsc, watch};

use super::journal::{Journal, JournalError, Mark, Record};
use super::{Logged, Notifier, StoreError, Tx};
use crate::engine::Settings;

/// How many jobs one batch takes at most.
const MAX_BATCH: usize = 1024;
/// Journaled changes are committed to redb at most this long after the first of them.
pub(super) const COMMIT_AFTER: Duration = Duration::from_millis(1000);
/// The journal's size limit (a batch that would pass it is committed instead).
pub(super) const JOURNAL_CAP: u64 = 64 << 20;
/// Under load, journaled changes are committed once the journal holds this much of them
/// (about 8,000 signals): a commit stops the writer for as long as it takes to write what
/// it carries. A second's worth at 35k signals/s took 21-32 ms here; 1 MiB's worth at
/// most ~9 ms, which took the 50-connection p99 from 10-11 ms to 6-7 ms at the same rate.
const COMMIT_BYTES: u64 = 1 << 20;

pub(super) type Completion = Box<dyn FnOnce(Result<(), Arc<StoreError>>) + Send>;
/// A job: run on the writer's transaction, or, given `None`, not run at all (the writer
/// is broken) and only its answer taken.
pub(super) type RunFn =
    Box<dyn for<'a, 'b> FnOnce(Option<&'b mut Tx<'a>>) -> (Completion, Kind) + Send>;

/// What a job needs before its caller may be answered.
pub(super) enum Kind {
    /// A redb commit.
    Durable,
    /// This record in the journal.
    Journal(Vec<u8>),
    /// Nothing: it changed nothing (it still waits for the batch's journal write, since it
    /// may have read what the batch wrote).
    Unchanged,
    /// A commit if anything is journaled but not committed (a read that must see it).
    Barrier,
}

/// A job to run on the writer's transaction.
pub(super) struct RunJob {
    /// Its journal record, known before it runs (see the module docs).
    pub(super) early: Option<Vec<u8>>,
    pub(super) f: RunFn,
}

pub(super) enum Job {
    Run(RunJob),
    /// From the [`Ticker`]: a commit may be due.
    Tick,
    /// Test only: end the thread at once, committing nothing.
    #[cfg(test)]
    Crash,
}

impl Job {
    /// Its answer, without running it (the writer stopped, or its batch was refused);
    /// `None` for a job nobody waits on.
    pub(super) fn unrun(self) -> Option<Completion> {
        match self {
            Job::Run(j) => Some((j.f)(None).0),
            _ => None,
        }
    }
}

/// What a batch publishes: sessions whose log grew, the new first timer if it moved, the
/// newest hub event if one was appended, devices whose remote waits changed, and the new
/// first device-wait deadline if it moved.
struct Published {
    touched: HashMap<String, u64>,
    timers: Option<Option<u64>>,
    hub_seq: Option<u64>,
    devices: HashSet<String>,
    device_wait_due: Option<Option<u64>>,
}

impl Published {
    /// Whether readers (long polls, device links) are waiting for this: it must be
    /// committed before it is announced.
    fn wants_readers(&self) -> bool {
        !self.touched.is_empty() || self.hub_seq.is_some() || !self.devices.is_empty()
    }
}

pub(super) struct Writer {
    pub(super) db: Arc<Database>,
    pub(super) rx: mpsc::Receiver<Job>,
    pub(super) notifier: Arc<Notifier>,
    pub(super) timer_tx: watch::Sender<Option<u64>>,
    pub(super) dw_tx: watch::Sender<Option<u64>>,
    pub(super) settings: Arc<Settings>,
    pub(super) journal: Journal,
    pub(super) jpath: PathBuf,
    pub(super) acked: Arc<AtomicU64>,
    pub(super) committed: watch::Sender<u64>,
    pub(super) broken: Option<String>,
    pub(super) ticker: Ticker,
}

/// Nudges the writer [`COMMIT_AFTER`] after it is armed, so journaled changes reach redb
/// without the writer waiting on a timer itself: it blocks on its queue alone, the
/// cheapest wake-up for the next job. Parked (no wake-ups at all) while nothing waits.
pub(super) struct Ticker {
    thread: std::thread::Thread,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Ticker {
    /// Starts the ticker thread; it holds only a weak handle on the queue, so it never
    /// keeps the writer alive.
    pub(super) fn start(jobs: mpsc::WeakSender<Job>) -> std::io::Result<Ticker> {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::Builder::new()
            .name("store-ticker".into())
            .spawn(move || {
                loop {
                    std::thread::park();
                    if s.load(Ordering::Acquire) {
                        return;
                    }
                    std::thread::sleep(COMMIT_AFTER);
                    let Some(tx) = jobs.upgrade() else { return };
                    // A full queue means the writer is busy and commits on its own when due.
                    let _ = tx.try_send(Job::Tick);
                }
            })?;
        Ok(Ticker {
            thread: handle.thread().clone(),
            stop,
        })
    }

    fn arm(&self) {
        self.thread.unpark();
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.ticker.stop();
    }
}

/// How one transaction ended.
enum End {
    /// Committed (or aborted and recovered); go on with a new one.
    Next,
    /// Every sender is gone: the last transaction is committed.
    Closed,
    /// A test's crash.
    #[cfg(test)]
    Crashed,
}

impl Writer {
    pub(super) fn run(mut self) {
        loop {
            if self.broken.is_some() {
                return self.refuse_all();
            }
            match self.transaction() {
                Ok(End::Next) => {}
                Ok(End::Closed) => return,
                #[cfg(test)]
                Ok(End::Crashed) => return,
                Err(e) => {
                    tracing::error!(error = %e, "the store cannot open a write transaction");
                    self.broken = Some(e.to_string());
                }
            }
        }
    }

    /// Answers every job with the error that broke the writer.
    fn refuse_all(mut self) {
        let why = self.broken.clone().unwrap_or_default();
        while let Some(job) = self.rx.blocking_recv() {
            if let Some(done) = job.unrun() {
                done(Err(Arc::new(StoreError::Broken(why.clone()))));
            }
        }
    }

    /// One redb write transaction, over as many batches as it takes until a commit.
    fn transaction(&mut self) -> Result<End, StoreError> {
        let wtx = self.db.begin_write()?;
        let mut tx = Tx::open(&wtx, self.settings.clone())?;
        // When the oldest journaled change not yet committed was acknowledged.
        let mut dirty_since: Option<Instant> = None;
        let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
        loop {
            let first = self.rx.blocking_recv();
            let Some(first) = first else {
                let published = take_published(&mut tx)?;
                drop(tx);
                self.commit(wtx, Vec::new(), published, None)?;
                return Ok(End::Closed);
            };
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match self.rx.try_recv() {
                    Ok(j) => batch.push(j),
                    Err(_) => break,
                }
            }

            // The batch's leading jobs whose records are known: written now, on their way
            // to the disk while they run.
            let early: Vec<&[u8]> = batch
                .iter()
                .map_while(|j| match j {
                    Job::Run(RunJob { early: Some(r), .. }) => Some(r.as_slice()),
                    _ => None,
                })
                .collect();
            let early_n = early.len();
            let mut early_mark: Option<Mark> = None;
            if early_n > 0 {
                let bytes = early.iter().map(|r| r.len()).sum();
                if self.journal.fits(bytes, early.len()) {
                    let mark = self.journal.mark();
                    match self.journal.write(early) {
                        Ok(_) => {
                            self.journal.start_writeback(mark);
                            early_mark = Some(mark);
                        }
                        Err(e) => {
                            let completions = refuse_batch(&mut batch);
                            drop(tx);
                            self.journal_failed(wtx, completions, e, None)?;
                            return Ok(End::Next);
                        }
                    }
                }
            }
            let early_written = if early_mark.is_some() { early_n } else { 0 };

            let mut completions: Vec<Completion> = Vec::with_capacity(batch.len());
            let mut records: Vec<Vec<u8>> = Vec::new();
            let mut must_commit = false;
            for (i, job) in batch.drain(..).enumerate() {
                match job {
                    Job::Run(j) => {
                        let (done, kind) = (j.f)(Some(&mut tx));
                        completions.push(done);
                        match kind {
                            Kind::Durable => must_commit = true,
                            // Written before it ran.
                            Kind::Journal(_) if i < early_written => {}
                            Kind::Journal(r) => records.push(r),
                            Kind::Unchanged => {}
                            Kind::Barrier => must_commit |= dirty_since.is_some(),
                        }
                    }
                    Job::Tick => {
                        // The ticker's nudge: commit what the journal holds once it is due.
                        match dirty_since {
                            Some(t) if t.elapsed() >= COMMIT_AFTER => must_commit = true,
                            Some(_) => self.ticker.arm(),
                            None => {}
                        }
                    }
                    #[cfg(test)]
                    Job::Crash => {
                        drop(completions);
                        return Ok(End::Crashed);
                    }
                }
            }

            // The early records' flush: whatever comes next (a commit, more records, the
            // answers) comes after it.
            if early_mark.is_some()
                && let Err(source) = self.journal.sync()
            {
                drop(tx);
                self.journal_failed(wtx, completions, JournalError::Io(source), early_mark)?;
                return Ok(End::Next);
            }
            if let Some(e) = tx.poisoned.take() {
                drop(tx);
                self.abandon(wtx, completions, StoreError::Decode(e), early_mark)?;
                return Ok(End::Next);
            }
            let published = take_published(&mut tx)?;
            let bytes: usize = records.iter().map(Vec::len).sum();
            if !records.is_empty() && !self.journal.fits(bytes, records.len()) {
                must_commit = true;
            }
            if must_commit {
                drop(tx);
                self.commit(wtx, completions, published, early_mark)?;
                return Ok(End::Next);
            }
            let mut journaled = early_written > 0;
            if !records.is_empty() {
                match self.journal.append(records.iter().map(Vec::as_slice)) {
                    Ok(_) => journaled = true,
                    Err(e) => {
                        // Nothing of this batch is acknowledged, and the transaction holds
                        // it: start over from the last commit and the journal.
                        drop(tx);
                        self.journal_failed(wtx, completions, e, early_mark)?;
                        return Ok(End::Next);
                    }
                }
            }
            let mut arm = false;
            if journaled {
                self.acked.store(self.journal.last_seq(), Ordering::Release);
                if dirty_since.is_none() {
                    dirty_since = Some(Instant::now());
                    arm = true;
                }
            }
            // The early jobs (remote wait outcomes) are answered first: their callers read
            // no timers, and announcing timers wakes runtime threads that would run before
            // the answer on these cores.
            let rest = completions.split_off(early_written.min(completions.len()));
            answer(completions, Ok(()));
            // Timers are read through the writer's own transaction: announce them before
            // answering, so a caller sees its own change there; the rest follows a commit.
            let mut published = published;
            self.publish_timers(&mut published);
            answer(rest, Ok(()));
            // After the answers, for the same reason: it wakes the ticker's thread.
            if arm {
                self.ticker.arm();
            }
            let due = dirty_since.is_some_and(|t| t.elapsed() >= COMMIT_AFTER)
                || self.journal.used() >= COMMIT_BYTES;
            if published.wants_readers() || due {
                drop(tx);
                self.commit(wtx, Vec::new(), published, None)?;
                return Ok(End::Next);
            }
            self.publish(published);
        }
    }

    /// Commits `wtx` (storing the journal's newest number), then publishes and answers.
    /// A failed commit loses nothing acknowledged: the journal is replayed, without the
    /// records written since `unacked` (this batch's, which its callers are told failed).
    fn commit(
        &mut self,
        wtx: redb::WriteTransaction,
        completions: Vec<Completion>,
        published: Published,
        unacked: Option<Mark>,
    ) -> Result<(), StoreError> {
        let seq = self.journal.last_seq();
        match commit_at(wtx, seq) {
            Ok(()) => {
                self.journal.rewind(seq);
                self.committed.send_replace(seq);
                // Publish before answering, so a caller sees its own change everywhere.
                self.publish(published);
                answer(completions, Ok(()));
            }
            Err(e) => {
                tracing::error!(error = %e, "a store commit failed; its callers get an error, and the journal is replayed");
                self.fail_batch(completions, e, unacked);
            }
        }
        Ok(())
    }

    /// Aborts the transaction (everything since the last commit), then fails the batch
    /// ([`Writer::fail_batch`]).
    fn abandon(
        &mut self,
        wtx: redb::WriteTransaction,
        completions: Vec<Completion>,
        e: StoreError,
        mark: Option<Mark>,
    ) -> Result<(), StoreError> {
        wtx.abort()?;
        self.fail_batch(completions, e, mark);
        Ok(())
    }

    /// After the batch's transaction is gone: erases its records written since `mark`
    /// (none acknowledged), answers `completions` with `e`, and replays the journal's
    /// acknowledged records into a new transaction.
    fn fail_batch(&mut self, completions: Vec<Completion>, e: StoreError, mark: Option<Mark>) {
        if let Some(m) = mark
            && let Err(erase) = self.journal.erase(m)
        {
            return self.unerased(completions, e, &erase);
        }
        answer(completions, Err(Arc::new(e)));
        self.recover_tail();
    }

    /// The journal could not take the batch: its callers get an error (see
    /// [`Writer::abandon`]).
    fn journal_failed(
        &mut self,
        wtx: redb::WriteTransaction,
        completions: Vec<Completion>,
        e: JournalError,
        mark: Option<Mark>,
    ) -> Result<(), StoreError> {
        let path = self.jpath.display().to_string();
        match e {
            JournalError::Io(source) => {
                tracing::error!(error = %source, "cannot write the store's journal; this batch's callers get an error");
                self.abandon(wtx, completions, StoreError::Journal { path, source }, mark)
            }
            JournalError::Unerased { source, erase } => {
                wtx.abort()?;
                self.unerased(completions, StoreError::Journal { path, source }, &erase);
                Ok(())
            }
        }
    }

    /// Records nobody was told about are in the journal and cannot be erased: a replay
    /// would count them. Refuse everything until the hub restarts (and say what a restart
    /// may replay).
    fn unerased(&mut self, completions: Vec<Completion>, e: StoreError, erase: &std::io::Error) {
        tracing::error!(error = %e, erase_error = %erase, journal = %self.jpath.display(), "the store's journal holds records of a failed batch that cannot be erased; the store takes no more writes until the hub restarts, and a restart may count that batch although its callers got an error");
        answer(completions, Err(Arc::new(e)));
        self.broken = Some(format!(
            "the journal {} could not be written or repaired: {erase}",
            self.jpath.display()
        ));
    }

    /// After an abort: replays the journal's records since the last commit.
    fn recover_tail(&mut self) {
        let records = match self.journal.scan() {
            Ok((r, _)) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the store's journal back");
                self.broken = Some(format!("reading the journal back: {e}"));
                return;
            }
        };
        match recover(&self.db, &self.settings, &mut self.journal, records) {
            Ok(n) => {
                tracing::warn!(
                    records = n,
                    "the journal's acknowledged changes were applied again"
                );
                self.committed.send_replace(self.journal.last_seq());
                // Timers may have moved with what was replayed.
                if let Ok(rtx) = self.db.begin_read() {
                    if let Ok(t) = super::tables::first_timer(&rtx) {
                        self.timer_tx.send_replace(t);
                    }
                    if let Ok(t) = super::tables::first_device_wait_due(&rtx) {
                        self.dw_tx.send_replace(t);
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot apply the journal again; the store takes no more writes until the hub restarts");
                self.broken = Some(e.to_string());
            }
        }
    }

    fn publish(&self, mut p: Published) {
        self.publish_timers(&mut p);
        self.notifier.publish(&p.touched);
        if let Some(seq) = p.hub_seq {
            self.notifier.hub.send_replace(seq);
        }
        self.notifier.publish_devices(&p.devices);
    }

    /// Announces the timers that moved (and takes them out of `p`).
    fn publish_timers(&self, p: &mut Published) {
        if let Some(t) = p.timers.take() {
            self.timer_tx.send_replace(t);
        }
        if let Some(t) = p.device_wait_due.take() {
            self.dw_tx.send_replace(t);
        }
    }
}

/// Runs nothing of `batch` and takes its answers (for a batch refused before it ran).
fn refuse_batch(batch: &mut Vec<Job>) -> Vec<Completion> {
    batch.drain(..).filter_map(Job::unrun).collect()
}

fn answer(completions: Vec<Completion>, r: Result<(), Arc<StoreError>>) {
    for c in completions {
        c(r.clone());
    }
}

fn take_published(tx: &mut Tx<'_>) -> Result<Published, StoreError> {
    let timers = if std::mem::take(&mut tx.timers_changed) {
        Some(tx.first_timer()?)
    } else {
        None
    };
    let device_wait_due = if std::mem::take(&mut tx.device_wait_due_changed) {
        Some(tx.first_device_wait_due()?)
    } else {
        None
    };
    Ok(Published {
        touched: std::mem::take(&mut tx.touched),
        timers,
        hub_seq: tx.hub_seq.take(),
        devices: std::mem::take(&mut tx.devices_touched),
        device_wait_due,
    })
}

/// Commits `wtx`, storing in it `seq`, the newest journal record it holds.
fn commit_at(wtx: redb::WriteTransaction, seq: u64) -> Result<(), StoreError> {
    {
        let mut meta = wtx.open_table(super::tables::META)?;
        meta.insert(super::tables::JOURNAL_SEQ, seq)?;
    }
    wtx.commit()?;
    Ok(())
}

/// Applies the journal's records newer than redb's last commit, in order, commits, and
/// rewinds the journal. Returns how many were applied. Used at start and after an abort.
pub(super) fn recover(
    db: &Database,
    settings: &Arc<Settings>,
    journal: &mut Journal,
    records: Vec<Record>,
) -> Result<usize, StoreError> {
    let wtx = db.begin_write()?;
    let (applied, last) = {
        let mut tx = Tx::open(&wtx, settings.clone())?;
        // The records were applied with the settings of the hub that wrote them.
        if let Some(then) = tx.stored_settings()?
            && then != **settings
        {
            tracing::info!(
                "replaying the journal with the settings it was written under; the new ones apply from now on"
            );
            tx.settings = Arc::new(then);
        }
        let mark = tx.journal_seq()?;
        let mut last = mark;
        let mut applied = 0;
        for rec in records.into_iter().filter(|r| r.seq > mark) {
            if rec.seq != last + 1 {
                // A gap means records were lost from the journal; say so loudly and go on
                // with what is there.
                tracing::error!(
                    expected = last + 1,
                    found = rec.seq,
                    "the store's journal has a gap; acknowledged changes may be missing"
                );
            }
            let op = Logged::decode(&rec.payload).map_err(|e| {
                StoreError::Decode(format!(
                    "journal record {} cannot be read ({e}); this hub cannot replay it. Keep the journal file for a hub version that can, or move it away to start without it",
                    rec.seq
                ))
            })?;
            op.replay(&mut tx)?;
            last = rec.seq;
            applied += 1;
        }
        if let Some(e) = tx.poisoned.take() {
            return Err(StoreError::Decode(e));
        }
        // What the journal's next records will be applied with.
        tx.store_settings(settings)?;
        (applied, last)
    };
    commit_at(wtx, last)?;
    journal.rewind(last);
    Ok(applied)
}
