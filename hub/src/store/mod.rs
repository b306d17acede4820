//! The durable state of the hub: one redb file under `$CORTEX_HOME/hub/`, and beside it
//! the acknowledgement journal (`journal.rs`).
//!
//! Only this module knows redb. Every mutation is a closure sent to one writer thread
//! (`writer.rs`), which runs whatever is pending in its open write transaction (group
//! commit). A caller's answer is sent only once its change is on disk, in one of two ways:
//! - the hot operations (signals, remote wait outcomes; [`Logged`]) are appended to the
//!   journal and `fdatasync`ed; redb commits them later, many at once;
//! - every other mutation is answered after a redb commit (which also holds everything
//!   journaled before it, so the journal starts over).
//!
//! After a crash, the store opens at its last commit and replays the journal's newer
//! records in order. Reads use redb read transactions beside the writer; [`Store::read`]
//! first makes sure that every acknowledged change is committed, so a 202 is visible to
//! any read that follows it.

pub mod device_waits;
pub mod devices;
pub mod journal;
pub mod logged;
pub mod ops;
pub mod tables;
mod writer;

pub use device_waits::{DeviceWaitDone, DoneOutcome};
pub use logged::Logged;
pub use ops::{SignalIn, SignalOutcome};
pub use tables::Tx;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use redb::{Database, ReadableDatabase};
use tokio::sync::{mpsc, oneshot, watch};

use writer::{Job, Kind};

use crate::engine::Settings;
use crate::time;

/// Errors of the storage layer. A caller sees them as 503/500.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage: {0}")]
    Db(#[from] redb::Error),
    #[error("stored record is unreadable: {0}")]
    Decode(String),
    #[error("the store is shutting down")]
    Closed,
    #[error("the acknowledgement journal {path}: {source}")]
    Journal {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "the store stopped taking writes after a failure it could not recover from ({0}); restart the hub, which replays its journal"
    )]
    Broken(String),
    #[error("opening {path}: {source}")]
    Open {
        path: String,
        source: redb::DatabaseError,
    },
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self { StoreError::Db(e.into()) }
        }
    )*};
}
from_redb!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::DatabaseError
);

/// Per-session "newest event seq" channels, and one for the hub's own events, for long
/// polls and SSE; per-device "remote waits changed" counters for the devices' links.
pub struct Notifier {
    sessions: Mutex<HashMap<String, watch::Sender<u64>>>,
    hub: watch::Sender<u64>,
    devices: Mutex<HashMap<String, watch::Sender<u64>>>,
}

impl Notifier {
    fn new(hub_seq: u64) -> Self {
        Notifier {
            sessions: Mutex::default(),
            hub: watch::channel(hub_seq).0,
            devices: Mutex::default(),
        }
    }

    /// Changes whenever a commit added or ended remote waits of `device`.
    pub fn subscribe_device(&self, device: &str) -> watch::Receiver<u64> {
        let mut map = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(device.to_string())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    fn publish_devices(&self, touched: &HashSet<String>) {
        if touched.is_empty() {
            return;
        }
        let mut map = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        for d in touched {
            if let Some(tx) = map.get(d) {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
        if map.len() > 1024 {
            map.retain(|_, tx| tx.receiver_count() > 0);
        }
    }

    /// The newest hub event's seq, as of the last commit.
    pub fn subscribe_hub(&self) -> watch::Receiver<u64> {
        self.hub.subscribe()
    }

    pub fn subscribe(&self, sid: &str, current: u64) -> watch::Receiver<u64> {
        let mut map = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(sid.to_string())
            .or_insert_with(|| watch::channel(current).0)
            .subscribe()
    }

    fn publish(&self, touched: &HashMap<String, u64>) {
        let mut map = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        for (sid, seq) in touched {
            if let Some(tx) = map.get(sid) {
                tx.send_replace(*seq);
            }
        }
        if map.len() > 1024 {
            map.retain(|_, tx| tx.receiver_count() > 0);
        }
    }
}

/// Handle to the store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    db: Arc<Database>,
    jobs: mpsc::Sender<Job>,
    pub notifier: Arc<Notifier>,
    /// The earliest precise timer (a decided wake), updated after each batch.
    pub next_timer: watch::Receiver<Option<u64>>,
    /// The earliest hub deadline of an active remote wait, updated after each batch.
    pub next_device_wait: watch::Receiver<Option<u64>>,
    pub settings: Arc<Settings>,
    /// The newest journal record acknowledged to a caller.
    acked: Arc<AtomicU64>,
    /// The newest journal record redb has committed.
    committed: watch::Receiver<u64>,
    /// Test only: how many next journal flushes fail.
    #[cfg(test)]
    journal_fail: Arc<std::sync::atomic::AtomicU32>,
}

/// Joins the writer thread on drop of the last handle's owner.
pub struct WriterGuard {
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WriterGuard {
    /// Waits until every job sent before the last [`Store`] handle was dropped is
    /// committed and answered.
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The journal beside a database file: `hub.redb` → `hub.journal`.
pub fn journal_path(db: &Path) -> std::path::PathBuf {
    db.with_extension("journal")
}

impl Store {
    /// Opens (or creates) the database at `path` and its journal beside it, replays the
    /// journal's records newer than the last commit, and starts the writer thread.
    pub fn open(path: &Path, settings: Settings) -> Result<(Store, WriterGuard), StoreError> {
        let db = Database::create(path).map_err(|source| StoreError::Open {
            path: path.display().to_string(),
            source,
        })?;
        let db = Arc::new(db);
        {
            let wtx = db.begin_write()?;
            tables::create_all(&wtx)?;
            wtx.commit()?;
        }
        let settings = Arc::new(settings);
        let jpath = journal_path(path);
        let (mut journal, records) =
            journal::Journal::open(&jpath, writer::JOURNAL_CAP).map_err(|source| {
                StoreError::Journal {
                    path: jpath.display().to_string(),
                    source,
                }
            })?;
        let replayed = writer::recover(&db, &settings, &mut journal, records)?;
        if replayed > 0 {
            tracing::info!(
                records = replayed,
                "replayed acknowledged changes from the journal"
            );
        }
        let (first, first_dw, hub_seq) = {
            let rtx = db.begin_read()?;
            let first = tables::first_timer(&rtx)?;
            let first_dw = tables::first_device_wait_due(&rtx)?;
            (first, first_dw, tables::ReadTx::new(rtx).last_hub_seq()?)
        };
        let (timer_tx, next_timer) = watch::channel(first);
        let (dw_tx, next_device_wait) = watch::channel(first_dw);
        let (jobs, rx) = mpsc::channel::<Job>(16 * 1024);
        let notifier = Arc::new(Notifier::new(hub_seq));
        let acked = Arc::new(AtomicU64::new(journal.last_seq()));
        let (committed_tx, committed) = watch::channel(journal.last_seq());
        #[cfg(test)]
        let journal_fail = journal.fail_handle();
        let w = writer::Writer {
            db: db.clone(),
            rx,
            notifier: notifier.clone(),
            timer_tx,
            dw_tx,
            settings: settings.clone(),
            journal,
            jpath,
            acked: acked.clone(),
            committed: committed_tx,
            broken: None,
            ticker: writer::Ticker::start(jobs.downgrade())
                .map_err(|e| StoreError::Decode(format!("cannot start the commit ticker: {e}")))?,
        };
        let thread = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || w.run())
            .map_err(|e| StoreError::Decode(format!("cannot start the writer thread: {e}")))?;
        Ok((
            Store {
                db,
                jobs,
                notifier,
                next_timer,
                next_device_wait,
                settings,
                acked,
                committed,
                #[cfg(test)]
                journal_fail,
            },
            WriterGuard {
                thread: Some(thread),
            },
        ))
    }

    /// Runs `f` in the writer's transaction and returns its result once a redb commit
    /// holds it.
    pub async fn exec<R, F>(&self, f: F) -> Result<R, Arc<StoreError>>
    where
        R: Send + 'static,
        F: for<'a> FnOnce(&mut Tx<'a>) -> Result<R, StoreError> + Send + 'static,
    {
        self.submit(move |t| f(t).map(|r| (r, Kind::Durable))).await
    }

    /// As [`Store::exec`] for a pass that says whether it changed anything (`true`): one
    /// that did not is answered without waiting for a commit.
    pub async fn exec_if<R, F>(&self, f: F) -> Result<R, Arc<StoreError>>
    where
        R: Send + 'static,
        F: for<'a> FnOnce(&mut Tx<'a>) -> Result<(R, bool), StoreError> + Send + 'static,
    {
        self.submit(move |t| {
            f(t).map(|(r, changed)| {
                (
                    r,
                    if changed {
                        Kind::Durable
                    } else {
                        Kind::Unchanged
                    },
                )
            })
        })
        .await
    }

    /// Runs a journaled operation: answered once its record is in the journal (or once
    /// a commit holds it), without waiting for redb.
    pub async fn exec_logged<R, F>(&self, f: F) -> Result<R, Arc<StoreError>>
    where
        R: Send + 'static,
        F: for<'a> FnOnce(&mut Tx<'a>) -> Result<(R, Option<Logged>), StoreError> + Send + 'static,
    {
        self.submit(logged_job(f)).await
    }

    /// A remote wait's outcome, journaled, without a task waiting for it: `then` runs on
    /// the writer thread with the answer, the moment the change is durable (so it must be
    /// quick: a log line, a channel send). For a device's link, which has a loop of its
    /// own to hear from: no task is spawned and woken per outcome. Jobs keep their order
    /// while the writer's queue has room; one that finds it full waits on a task of its
    /// own (so this is called from within the runtime), and order is not kept among
    /// those.
    ///
    /// Its input is its journal record, so the writer may journal it before it runs and
    /// have it on its way to the disk while it does (see `writer.rs`); replayed where the
    /// wait already ended, it changes nothing.
    pub fn device_wait_done_then<C>(&self, done: DeviceWaitDone, then: C)
    where
        C: FnOnce(Result<DoneOutcome, Arc<StoreError>>) + Send + 'static,
    {
        let record = match Logged::DeviceWaitDone(done.clone()).encode() {
            Ok(r) => r,
            Err(e) => return then(Err(Arc::new(e))),
        };
        let early = record.clone();
        let f = move |t: &mut Tx<'_>| {
            let outcome = t.device_wait_done(&done)?;
            let kind = match outcome {
                DoneOutcome::Recorded(_) => Kind::Journal(record),
                DoneOutcome::NotActive => Kind::Unchanged,
            };
            Ok((outcome, kind))
        };
        self.send_now(job(Some(early), f, then));
    }

    /// Test only: any journaled operation the way [`Store::device_wait_done_then`] sends
    /// one, without an early record.
    #[cfg(test)]
    pub(crate) fn exec_logged_then<R, F, C>(&self, f: F, then: C)
    where
        R: Send + 'static,
        F: for<'a> FnOnce(&mut Tx<'a>) -> Result<(R, Option<Logged>), StoreError> + Send + 'static,
        C: FnOnce(Result<R, Arc<StoreError>>) + Send + 'static,
    {
        self.send_now(job(None, logged_job(f), then));
    }

    /// Queues `job` without waiting (see [`Store::device_wait_done_then`]).
    fn send_now(&self, job: Job) {
        match self.jobs.try_send(job) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(job)) => {
                // The writer is behind: wait for room without holding up the caller.
                let jobs = self.jobs.clone();
                tokio::spawn(async move {
                    if let Err(mpsc::error::SendError(job)) = jobs.send(job).await {
                        refuse(job);
                    }
                });
            }
            Err(mpsc::error::TrySendError::Closed(job)) => refuse(job),
        }
    }

    /// A signal from any route (journaled).
    pub async fn signal(&self, s: SignalIn) -> Result<SignalOutcome, Arc<StoreError>> {
        self.exec_logged(move |t| t.signal_logged(&s, time::now_ms()))
            .await
    }

    async fn submit<R, F>(&self, f: F) -> Result<R, Arc<StoreError>>
    where
        R: Send + 'static,
        F: for<'a> FnOnce(&mut Tx<'a>) -> Result<(R, Kind), StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel::<Result<R, Arc<StoreError>>>();
        let job = job(None, f, move |out| {
            let _ = tx.send(out);
        });
        self.jobs
            .send(job)
            .await
            .map_err(|_| Arc::new(StoreError::Closed))?;
        rx.await.map_err(|_| Arc::new(StoreError::Closed))?
    }

    /// A consistent read of the current state, holding every change acknowledged before
    /// the call.
    pub async fn read<R>(
        &self,
        f: impl FnOnce(&tables::ReadTx) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        self.fresh().await?;
        self.read_committed(f)
    }

    /// Waits until redb holds every change acknowledged before the call (journaled ones
    /// are committed on demand). Usually it already does, and this returns at once.
    pub async fn fresh(&self) -> Result<(), StoreError> {
        let want = self.acked.load(Ordering::Acquire);
        if *self.committed.borrow() >= want {
            return Ok(());
        }
        self.submit(|_| Ok(((), Kind::Barrier)))
            .await
            .map_err(|e| StoreError::Decode(e.to_string()))
    }

    /// A read of redb's last commit, without waiting: call [`Store::fresh`] first when it
    /// must hold what was just acknowledged.
    pub fn read_committed<R>(
        &self,
        f: impl FnOnce(&tables::ReadTx) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let rtx = self.db.begin_read()?;
        let r = tables::ReadTx::new(rtx);
        f(&r)
    }

    /// Test only: the next `n` flushes of the journal fail (as a failing disk would).
    #[cfg(test)]
    pub(crate) fn fail_next_journal_syncs(&self, n: u32) {
        self.journal_fail.store(n, Ordering::Release);
    }

    /// Test only: the writer stops at once, as if the process died: nothing after its last
    /// commit is in redb, only in the journal.
    #[cfg(test)]
    pub(crate) async fn crash(&self) {
        let _ = self.jobs.send(Job::Crash).await;
    }
}

/// A journaled operation as a writer operation: its record, if it changed anything, is
/// what the batch journals.
fn logged_job<R, F>(
    f: F,
) -> impl for<'a> FnOnce(&mut Tx<'a>) -> Result<(R, Kind), StoreError> + Send + 'static
where
    R: Send + 'static,
    F: for<'a> FnOnce(&mut Tx<'a>) -> Result<(R, Option<Logged>), StoreError> + Send + 'static,
{
    move |t| {
        let (r, logged) = f(t)?;
        let kind = match logged {
            Some(l) => Kind::Journal(l.encode()?),
            None => Kind::Unchanged,
        };
        Ok((r, kind))
    }
}

/// The writer's job for `f`, whose answer goes to `then` once the batch is durable (or
/// failed). A failing `f` poisons the transaction: the batch is rolled back.
fn job<R, F, C>(early: Option<Vec<u8>>, f: F, then: C) -> Job
where
    R: Send + 'static,
    F: for<'a> FnOnce(&mut Tx<'a>) -> Result<(R, Kind), StoreError> + Send + 'static,
    C: FnOnce(Result<R, Arc<StoreError>>) + Send + 'static,
{
    let f: writer::RunFn = Box::new(move |t: Option<&mut Tx<'_>>| {
        let (r, kind) = match t {
            None => (Err(StoreError::Closed), Kind::Unchanged),
            Some(t) => match f(t) {
                Ok((r, kind)) => (Ok(r), kind),
                Err(e) => {
                    t.poison(&e);
                    (Err(e), Kind::Unchanged)
                }
            },
        };
        let done: writer::Completion = Box::new(move |committed| {
            then(match (committed, r) {
                (Ok(()), Ok(v)) => Ok(v),
                (Err(e), _) => Err(e),
                (Ok(()), Err(e)) => Err(Arc::new(e)),
            });
        });
        (done, kind)
    });
    Job::Run(writer::RunJob { early, f })
}

/// Answers a job the writer will never see (it has stopped).
fn refuse(job: Job) {
    if let Some(done) = job.unrun() {
        done(Err(Arc::new(StoreError::Closed)));
    }
}

#[cfg(test)]
mod tests;
