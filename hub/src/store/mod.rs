//! The durable state of the hub: one redb file under `$CORTEX_HOME/hub/` (`hub.redb`),
//! and beside it the journal (`hub.journal`, `hub.journal2`).
//!
//! The persistence machinery is the kernel (`kernel/`, domain-free): every operation is a
//! closure run on one writer thread against the tables' layers, a batch of them is one
//! journal record of the changes, and a caller is answered once that record is
//! `fdatasync`ed. redb is a checkpoint written by another thread a moment later, so no
//! answer waits for a redb commit. This module is the domain's side: the handle
//! ([`Store`]: `exec`, `read`, `device_wait_done_then`), the tables it registers
//! (`tables.rs`), and the operations (`ops/`, `devices.rs`, `device_waits.rs`).
//!
//! After a crash, the store opens at its last checkpoint and applies the journal's newer
//! records in order. [`Store::read`] holds every change acknowledged before it: it reads
//! redb directly when the last checkpoint holds them all, and through the writer's layers
//! otherwise.

pub mod agent;
pub mod budgets;
pub mod claims;
pub mod consumers;
pub mod device_waits;
pub mod devices;
pub mod exec_asks;
pub mod kernel;
pub mod logged;
pub mod mcp;
pub mod notices;
pub mod ops;
pub mod posts;
pub mod schema;
pub mod tables;
pub mod timers;

pub use device_waits::{DeviceWaitDone, DoneOutcome};
pub use kernel::Notifier;
pub use kernel::error::StoreError;
pub use logged::Logged;
pub use ops::{SignalIn, SignalOutcome};
pub use tables::{ReadTx, Tx};

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use redb::{Database, ReadableDatabase};
use tokio::sync::{mpsc, oneshot, watch};

use kernel::journal::Journal;
use kernel::pg::Pg;
use kernel::table::{Overlay, Snapshot};
use kernel::{Completion, Job, Writer, WriterParts};
use tables::{Ctx, REGISTRY, TOPIC_HUB};

use crate::config::Limits;
use crate::engine::Settings;
use crate::time;

/// Where the store keeps its state.
#[derive(Clone)]
enum Backend {
    /// redb under the home, behind the journal.
    Redb {
        db: Arc<Database>,
        /// The newest journal record acknowledged to a caller.
        acked: Arc<AtomicU64>,
        /// The newest journal record a checkpoint holds.
        landed: watch::Receiver<u64>,
    },
    /// A PostgreSQL database, and the reads that may run on it at once (each on a
    /// connection of the pool, on a blocking thread).
    Pg {
        pg: Arc<Pg>,
        reads: Arc<tokio::sync::Semaphore>,
    },
}

/// How many reads run on PostgreSQL at once: a burst of long polls waking together waits
/// for a connection rather than opening one each (past the server's `max_connections`).
const PG_READS: usize = 16;

/// Handle to the store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    backend: Backend,
    jobs: mpsc::Sender<Job<Ctx>>,
    pub notifier: Arc<Notifier>,
    /// The earliest due time in the timer queue (`u64::MAX`: none).
    pub next_timer: watch::Receiver<u64>,
    pub settings: Arc<Settings>,
    /// settings.json `limits`, which the store's writes hold.
    pub limits: Arc<Limits>,
    /// Why the store cannot go on in this process (the hub must stop), once it cannot.
    pub fatal: watch::Receiver<Option<String>>,
    /// Test only: how many next journal flushes fail (both files).
    #[cfg(test)]
    journal_fail: [Arc<std::sync::atomic::AtomicU32>; 2],
}

/// Joins the writer thread on drop of the last handle's owner.
pub struct WriterGuard {
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WriterGuard {
    /// Waits until every job sent before the last [`Store`] handle was dropped is
    /// answered and checkpointed.
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The journal files beside a database file: `hub.redb` → `hub.journal`, `hub.journal2`.
pub fn journal_paths(db: &Path) -> [std::path::PathBuf; 2] {
    [db.with_extension("journal"), db.with_extension("journal2")]
}

/// The journal's size limit per file (past it, writes wait for a checkpoint).
const JOURNAL_CAP: u64 = 256 << 20;

impl Store {
    /// Opens (or creates) the database at `path` and its journal beside it, replays the
    /// journal's records newer than the last checkpoint, and starts the writer thread.
    pub fn open(path: &Path, settings: Settings) -> Result<(Store, WriterGuard), StoreError> {
        Store::open_limited(path, settings, Limits::default())
    }

    /// [`Store::open`] with settings.json `limits` for the store's writes to hold.
    pub fn open_limited(
        path: &Path,
        settings: Settings,
        limits: Limits,
    ) -> Result<(Store, WriterGuard), StoreError> {
        let limits = Arc::new(limits);
        let db = kernel::paced::open_database(path).map_err(|source| StoreError::Open {
            path: path.display().to_string(),
            source,
        })?;
        let db = Arc::new(db);
        {
            let mut wtx = db.begin_write()?;
            // As every commit (`kernel::checkpoint::commit`): a crash now repairs quickly.
            wtx.set_quick_repair(true);
            for t in REGISTRY.iter() {
                t.create(&wtx)?;
            }
            wtx.commit()?;
        }
        let settings = Arc::new(settings);
        let paths = journal_paths(path);
        let stored = stored_settings(&db)?;
        let (used, clean, mark) = read_now(&db, &ctx_of(&settings, &limits), |t| {
            Ok((stored.is_some(), t.clean_stop()?, t.journal_seq()?))
        })?;
        // A store that ran before keeps its journal beside it; a missing one after a stop
        // that was not clean may have held acknowledged changes.
        if used && !clean && !paths[0].exists() {
            return Err(StoreError::Damaged(format!(
                "the journal {} is missing, and the hub did not stop cleanly: acknowledged changes may be lost. {}",
                paths[0].display(),
                RECOVER_HINT
            )));
        }
        let open_journal = |p: &Path| {
            let (j, records) =
                Journal::open(p, JOURNAL_CAP).map_err(|source| StoreError::Journal {
                    path: p.display().to_string(),
                    source,
                })?;
            // Damage among records the last checkpoint already holds loses nothing.
            if let Some(d) = j.damage().filter(|d| d.beyond.iter().any(|s| *s > mark)) {
                return Err(StoreError::Damaged(format!(
                    "the journal {} is damaged at byte {}: after record {}, records {:?} are readable but cannot be replayed in order. {}",
                    p.display(),
                    d.at,
                    d.last_good,
                    d.beyond,
                    RECOVER_HINT
                )));
            }
            Ok((j, records))
        };
        let (j0, mut records) = open_journal(&paths[0])?;
        let (j1, r1) = open_journal(&paths[1])?;
        records.extend(r1);
        let mut journals = [j0, j1];
        // The files' names are durable only once their directory is synced (and the
        // directory's own name once its parent is): without it a power cut after the first
        // acknowledgement can take the whole store.
        sync_dirs(path)?;
        // Records an older hub wrote are operations, replayed with the settings that hub
        // ran with.
        let legacy_ctx = ctx_of(
            &Arc::new(stored.unwrap_or_else(|| (*settings).clone())),
            &limits,
        );
        let replayed = kernel::writer_recover(
            &db,
            &REGISTRY,
            &legacy_ctx,
            &mut journals,
            records,
            &|t, payload| Logged::decode(payload)?.replay(t),
            false,
        )
        .map_err(|e| match e {
            StoreError::Damaged(m) => StoreError::Damaged(format!("{m}. {RECOVER_HINT}")),
            e => e,
        })?
        .applied;
        if replayed > 0 {
            tracing::info!(
                records = replayed,
                "replayed acknowledged changes from the journal"
            );
        }
        let ctx = ctx_of(&settings, &limits);
        // This hub's settings, for a later hub that replays an older journal; the timers
        // of older hubs' tables, into the queue.
        run_once(&db, &ctx, |t| {
            t.store_settings(&settings)?;
            t.set_clean_stop(false)?;
            t.migrate_timers().map(drop)
        })?;
        let (first, hub_seq, states) = read_now(&db, &ctx, |t| {
            Ok((t.first_timer()?, t.last_hub_seq()?, t.waitpoint_counts()?))
        })?;
        crate::metrics::metrics().set_waitpoints(&states);
        let notifier = Arc::new(Notifier::default());
        let seq = journals[0].last_seq();
        #[cfg(test)]
        let journal_fail = [journals[0].fail_handle(), journals[1].fail_handle()];
        let (jobs, rx) = mpsc::channel::<Job<Ctx>>(16 * 1024);
        let acked = Arc::new(AtomicU64::new(seq));
        let (landed_tx, landed) = watch::channel(seq);
        let (fatal_tx, fatal) = watch::channel(None);
        let w = Writer::new(WriterParts {
            db: db.clone(),
            registry: &REGISTRY,
            ctx,
            rx,
            wake: jobs.downgrade(),
            journals,
            paths,
            notifier: notifier.clone(),
            acked: acked.clone(),
            landed: landed_tx,
            fatal: fatal_tx,
        })?;
        start(
            Opened {
                backend: Backend::Redb { db, acked, landed },
                jobs,
                notifier,
                first,
                hub_seq,
                fatal,
                run: Box::new(move || w.run()),
                #[cfg(test)]
                journal_fail,
            },
            settings,
            limits,
        )
    }

    /// Opens the store on the PostgreSQL database at `url`: brings its schema to this
    /// hub's version (or refuses a newer one), and starts the writer thread, whose every
    /// batch is one transaction answered once committed.
    /// `token_hash` is the operator token this hub answers to: the first hub on the
    /// database keeps it, and one with another is refused (hubs on a database share one).
    /// `notify`: each batch's number is sent as a `NOTIFY` (off: the other hubs hear of it
    /// by their poll, within a second).
    pub fn open_postgres(
        url: &str,
        settings: Settings,
        limits: Limits,
        token_hash: [u8; 32],
        notify: bool,
    ) -> Result<(Store, WriterGuard), StoreError> {
        let limits = Arc::new(limits);
        let settings = Arc::new(settings);
        let ctx = ctx_of(&settings, &limits);
        // PostgreSQL's blocking client runs a runtime of its own, which may not start on
        // a thread of the hub's: the opening runs on a thread of its own.
        let opened = std::thread::scope(|s| {
            s.spawn(|| open_pg(url, ctx, &token_hash, notify))
                .join()
                .unwrap_or_else(|_| Err(StoreError::Broken("opening the store panicked".into())))
        });
        let (pg, w, first, hub_seq, notifier, jobs) = opened?;
        // Nothing here stops the hub for good (a lost database is answered 503): the
        // channel is only kept open.
        let (fatal_tx, fatal) = watch::channel(None);
        start(
            Opened {
                backend: Backend::Pg {
                    pg,
                    reads: Arc::new(tokio::sync::Semaphore::new(PG_READS)),
                },
                jobs,
                notifier,
                first,
                hub_seq,
                fatal,
                run: Box::new(move || {
                    let _fatal = fatal_tx;
                    w.run()
                }),
                #[cfg(test)]
                journal_fail: Default::default(),
            },
            settings,
            limits,
        )
    }

    /// Runs `f` on the writer and returns its result once its changes are durable (in
    /// the journal). A failing `f` changes nothing.
    pub async fn exec<R, F>(&self, f: F) -> Result<R, Arc<StoreError>>
    where
        R: Send + 'static,
        F: for<'a> FnOnce(&mut Tx<'a>) -> Result<R, StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel::<Result<R, Arc<StoreError>>>();
        self.send(job(f, move |out| {
            let _ = tx.send(out);
        }))
        .await?;
        rx.await.map_err(|_| Arc::new(StoreError::Closed))?
    }

    /// Runs `f` on the writer like [`Store::exec`], but answers as soon as `f` ran, before
    /// the batch is durable; the returned [`Durable`] says when (and whether) it is. For
    /// work that may start early and be thrown away: the runner calls the model with a
    /// step's result while the step's record goes to disk, and awaits the `Durable` before
    /// anything it does outside the hub. Whatever `f` changed is seen by others only once
    /// durable (notices and readers wait for the journal as usual); should the journal
    /// fail, the changes are undone and the `Durable` carries the error.
    pub async fn exec_ahead<R, F>(&self, f: F) -> Result<(R, Durable), Arc<StoreError>>
    where
        R: Send + 'static,
        F: for<'a> FnOnce(&mut Tx<'a>) -> Result<R, StoreError> + Send + 'static,
    {
        let (early_tx, early_rx) = oneshot::channel::<Result<R, Arc<StoreError>>>();
        let (durable_tx, durable_rx) = oneshot::channel::<Result<(), Arc<StoreError>>>();
        self.send(Job::Run(Box::new(move |t: Option<&mut Tx<'_>>| {
            let r = match t {
                None => Err(Arc::new(StoreError::Closed)),
                Some(t) => f(t).map_err(Arc::new),
            };
            let failed = r.is_err();
            let _ = early_tx.send(r);
            let done: Completion = Box::new(move |durable| {
                let _ = durable_tx.send(durable);
            });
            (done, failed)
        })))
        .await?;
        let r = early_rx.await.map_err(|_| Arc::new(StoreError::Closed))??;
        Ok((r, Durable(durable_rx)))
    }

    /// A remote wait's outcome, without a task waiting for it: `then` runs on the writer
    /// thread with the answer, the moment the change is durable (so it must be quick: a
    /// log line, a channel send). For a device's link, which has a loop of its own to
    /// hear from: no task is spawned and woken per outcome. Jobs keep their order while
    /// the writer's queue has room; one that finds it full waits on a task of its own (so
    /// this is called from within the runtime), and order is not kept among those.
    pub fn device_wait_done_then<C>(&self, done: DeviceWaitDone, then: C)
    where
        C: FnOnce(Result<DoneOutcome, Arc<StoreError>>) + Send + 'static,
    {
        self.send_now(job(move |t| t.device_wait_done(&done), then));
    }

    /// Test only: any operation the way [`Store::device_wait_done_then`] sends one.
    #[cfg(test)]
    pub(crate) fn exec_then<R, F, C>(&self, f: F, then: C)
    where
        R: Send + 'static,
        F: for<'a> FnOnce(&mut Tx<'a>) -> Result<R, StoreError> + Send + 'static,
        C: FnOnce(Result<R, Arc<StoreError>>) + Send + 'static,
    {
        self.send_now(job(f, then));
    }

    /// Queues `job` without waiting (see [`Store::device_wait_done_then`]).
    fn send_now(&self, job: Job<Ctx>) {
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

    async fn send(&self, job: Job<Ctx>) -> Result<(), Arc<StoreError>> {
        self.jobs.send(job).await.map_err(|e| {
            refuse(e.0);
            Arc::new(StoreError::Closed)
        })
    }

    /// Whether other hubs may share this store (it is on PostgreSQL).
    pub fn is_shared(&self) -> bool {
        matches!(self.backend, Backend::Pg { .. })
    }

    /// On a shared store: this hub, by name, holds its session lock from now on (the
    /// others read its death from the lock's absence).
    pub fn announce_hub(&self, name: &str) {
        if let Backend::Pg { pg, .. } = &self.backend {
            pg.announce(claims::hub_key(name));
        }
    }

    /// On a shared store: the keys ([`claims::hub_key`]) of the hubs whose session lock
    /// is held now, i.e. whose process lives and reaches the database; `None` on redb.
    pub async fn hubs_alive(&self) -> Option<Result<std::collections::HashSet<u32>, StoreError>> {
        let Backend::Pg { pg, .. } = &self.backend else {
            return None;
        };
        let pg = pg.clone();
        Some(
            tokio::task::spawn_blocking(move || pg.alive_keys())
                .await
                .unwrap_or_else(|e| {
                    Err(StoreError::Broken(format!(
                        "a read of the store failed: {e}"
                    )))
                }),
        )
    }

    /// A signal from any route.
    pub async fn signal(&self, s: SignalIn) -> Result<SignalOutcome, Arc<StoreError>> {
        self.exec(move |t| t.signal(&s, time::now_ms())).await
    }

    /// A consistent read holding every change acknowledged before the call: straight from
    /// the last checkpoint when it holds them all, else on the writer, through the
    /// changes kept in memory.
    pub async fn read<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: for<'a> FnOnce(&ReadTx<'a>) -> Result<R, StoreError> + Send + 'static,
    {
        let ctx = ctx_of(&self.settings, &self.limits);
        match &self.backend {
            Backend::Redb { db, acked, landed } => {
                let want = acked.load(Ordering::Acquire);
                if *landed.borrow() >= want {
                    return read_now(db, &ctx, f);
                }
            }
            Backend::Pg { pg, reads } => {
                let pg = pg.clone();
                let permit = reads
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| StoreError::Closed)?;
                return tokio::task::spawn_blocking(move || {
                    let _permit = permit;
                    pg.read(&REGISTRY, &ctx, f)
                })
                .await
                .map_err(|e| StoreError::Broken(format!("a read of the store failed: {e}")))?;
            }
        }
        self.exec(move |t| f(t))
            .await
            .map_err(|e| match Arc::try_unwrap(e) {
                Ok(e) => e,
                Err(e) => StoreError::Broken(e.to_string()),
            })
    }

    /// Test only: the next `n` flushes of the journal fail (as a failing disk would).
    #[cfg(test)]
    pub(crate) fn fail_next_journal_syncs(&self, n: u32) {
        for f in &self.journal_fail {
            f.store(n, Ordering::Release);
        }
    }

    /// Test only: checkpoints everything acknowledged so far, and waits until it landed.
    #[cfg(test)]
    pub(crate) async fn checkpoint(&self) {
        let Backend::Redb { acked, landed, .. } = &self.backend else {
            return;
        };
        let want = acked.load(Ordering::Acquire);
        let _ = self.jobs.send(Job::Freeze).await;
        let mut landed = landed.clone();
        let _ = landed.wait_for(|l| *l >= want).await;
    }

    /// Test only: the newest journal record a checkpoint holds, on redb.
    #[cfg(test)]
    pub(crate) fn landed(&self) -> watch::Receiver<u64> {
        match &self.backend {
            Backend::Redb { landed, .. } => landed.clone(),
            Backend::Pg { .. } => panic!("the store is on PostgreSQL"),
        }
    }

    /// Test only: the redb database under a store opened on redb.
    #[cfg(test)]
    pub(crate) fn redb(&self) -> &Database {
        match &self.backend {
            Backend::Redb { db, .. } => db,
            Backend::Pg { .. } => panic!("the store is on PostgreSQL"),
        }
    }

    /// Test only: the writer stops at once, as if the process died: nothing after its
    /// last checkpoint is in redb, only in the journal.
    #[cfg(test)]
    pub(crate) async fn crash(&self) {
        let _ = self.jobs.send(Job::Crash).await;
    }
}

/// What a damaged store's error tells the operator to do.
const RECOVER_HINT: &str = "Keep a copy of the hub directory, then run `cortex-hub --recover-journal` (with the same --home): it keeps every record it can read and says what was lost";

/// What a recovery kept and lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// Records applied.
    pub applied: usize,
    /// Numbers of records that were acknowledged but could not be read (ranges, inclusive).
    pub lost: Vec<(u64, u64)>,
    /// Bytes of the journal files that held no readable record.
    pub unreadable_bytes: u64,
}

impl Store {
    /// Recovers a store whose journal is damaged: every record readable anywhere in the
    /// journal files and newer than the last checkpoint is applied in order, the gaps are
    /// reported, the result is checkpointed and the journal files start over. The hub
    /// must not be running.
    pub fn recover_journal(path: &Path, settings: Settings) -> Result<Recovered, StoreError> {
        let db = kernel::paced::open_database(path).map_err(|source| StoreError::Open {
            path: path.display().to_string(),
            source,
        })?;
        {
            let mut wtx = db.begin_write()?;
            // As every commit (`kernel::checkpoint::commit`): a crash now repairs quickly.
            wtx.set_quick_repair(true);
            for t in REGISTRY.iter() {
                t.create(&wtx)?;
            }
            wtx.commit()?;
        }
        let paths = journal_paths(path);
        let mut records = Vec::new();
        let mut unreadable_bytes = 0;
        for p in &paths {
            let (r, u) = Journal::salvage(p).map_err(|source| StoreError::Journal {
                path: p.display().to_string(),
                source,
            })?;
            records.extend(r);
            unreadable_bytes += u;
        }
        records.sort_by_key(|r| r.seq);
        records.dedup_by_key(|r| r.seq);
        let settings = Arc::new(stored_settings(&db)?.unwrap_or(settings));
        let ctx = ctx_of(&settings, &Arc::new(Limits::default()));
        let mut journals = [
            Journal::open(&paths[0], JOURNAL_CAP)
                .map_err(|source| StoreError::Journal {
                    path: paths[0].display().to_string(),
                    source,
                })?
                .0,
            Journal::open(&paths[1], JOURNAL_CAP)
                .map_err(|source| StoreError::Journal {
                    path: paths[1].display().to_string(),
                    source,
                })?
                .0,
        ];
        let r = kernel::writer_recover(
            &db,
            &REGISTRY,
            &ctx,
            &mut journals,
            records,
            &|t, payload| Logged::decode(payload)?.replay(t),
            true,
        )?;
        drop(journals);
        for p in &paths {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .and_then(|f| f.set_len(0).and_then(|()| f.sync_all()));
            if let Err(source) = f {
                return Err(StoreError::Journal {
                    path: p.display().to_string(),
                    source,
                });
            }
        }
        Ok(Recovered {
            applied: r.applied,
            lost: r.gaps,
            unreadable_bytes,
        })
    }
}

/// Syncs the directory holding the store's files, and its parent.
fn sync_dirs(db: &Path) -> Result<(), StoreError> {
    let dir = db.parent().unwrap_or(Path::new("."));
    for d in [Some(dir), dir.parent()].into_iter().flatten() {
        let d = if d.as_os_str().is_empty() {
            Path::new(".")
        } else {
            d
        };
        std::fs::File::open(d)
            .and_then(|f| f.sync_all())
            .map_err(|source| StoreError::Journal {
                path: d.display().to_string(),
                source,
            })?;
    }
    Ok(())
}

/// What either backend hands over once open: the handle's parts, the first timer and the
/// newest hub event (where the notices start), and the writer to run.
struct Opened {
    backend: Backend,
    jobs: mpsc::Sender<Job<Ctx>>,
    notifier: Arc<Notifier>,
    first: Option<u64>,
    hub_seq: u64,
    fatal: watch::Receiver<Option<String>>,
    run: Box<dyn FnOnce() + Send>,
    #[cfg(test)]
    journal_fail: [Arc<std::sync::atomic::AtomicU32>; 2],
}

/// The handle, and the writer on a thread of its own.
fn start(
    o: Opened,
    settings: Arc<Settings>,
    limits: Arc<Limits>,
) -> Result<(Store, WriterGuard), StoreError> {
    let next_timer = o
        .notifier
        .watch(kernel::timers::TOPIC, "", o.first.unwrap_or(u64::MAX));
    // Kept open by the notifier's first subscriber for the hub's life.
    let hub_rx = o.notifier.watch(TOPIC_HUB, "", o.hub_seq);
    let run = o.run;
    let thread = std::thread::Builder::new()
        .name("store-writer".into())
        .spawn(move || {
            let _hub_rx = hub_rx;
            run()
        })
        .map_err(|e| StoreError::Decode(format!("cannot start the writer thread: {e}")))?;
    Ok((
        Store {
            backend: o.backend,
            jobs: o.jobs,
            notifier: o.notifier,
            next_timer,
            settings,
            limits,
            fatal: o.fatal,
            #[cfg(test)]
            journal_fail: o.journal_fail,
        },
        WriterGuard {
            thread: Some(thread),
        },
    ))
}

/// Every notice kind the store raises: what another hub's batches may carry.
static TOPICS: &[&str] = &[
    tables::TOPIC_SESSION,
    TOPIC_HUB,
    tables::TOPIC_DEVICE,
    tables::TOPIC_STOP,
    exec_asks::TOPIC_EXEC_ASK,
    exec_asks::TOPIC_EXEC_ANSWER,
    agent::TOPIC_READY,
    notices::TOPIC_NOTICE,
    kernel::timers::TOPIC,
];

/// What [`Store::open_postgres`] opens on a thread of its own: the pool, the writer, the
/// first timer and the newest hub event.
type PgOpened = (
    Arc<Pg>,
    kernel::pg::writer::PgWriter<Ctx>,
    Option<u64>,
    u64,
    Arc<Notifier>,
    mpsc::Sender<Job<Ctx>>,
);

fn open_pg(
    url: &str,
    ctx: Ctx,
    token_hash: &[u8; 32],
    notify: bool,
) -> Result<PgOpened, StoreError> {
    let pg = Pg::connect(url)?;
    let migrated = {
        let mut c = pg.take()?;
        let m = kernel::pg::migrate::migrate(&mut c, schema::MIGRATIONS, &REGISTRY);
        pg.put_back(c);
        m?
    };
    tracing::info!(
        database = %pg.shown,
        schema = migrated.to,
        was = migrated.from,
        "the store is on PostgreSQL"
    );
    let notifier = Arc::new(Notifier::default());
    let (jobs, rx) = mpsc::channel::<Job<Ctx>>(16 * 1024);
    let w = kernel::pg::writer::PgWriter::new(kernel::pg::writer::PgParts {
        pg: pg.clone(),
        registry: &REGISTRY,
        ctx: ctx.clone(),
        rx,
        notifier: notifier.clone(),
        follow: crate::time::follow,
        notify,
    })?;
    pg.write_once(&REGISTRY, &ctx, |t| t.share_operator_token(token_hash))?;
    // The other hubs' batches from here on are heard; what came before is in what is
    // read next.
    let from = pg.newest_batch()?;
    let (first, hub_seq, states) = pg.read(&REGISTRY, &ctx, |t| {
        Ok((t.first_timer()?, t.last_hub_seq()?, t.waitpoint_counts()?))
    })?;
    crate::metrics::metrics().set_waitpoints(&states);
    kernel::pg::bus::start(kernel::pg::bus::BusParts {
        pg: pg.clone(),
        notifier: Arc::downgrade(&notifier),
        kinds: TOPICS,
        from,
    })
    .map_err(|e| StoreError::Decode(format!("cannot start the store's bus thread: {e}")))?;
    Ok((pg, w, first, hub_seq, notifier, jobs))
}

fn ctx_of(settings: &Arc<Settings>, limits: &Arc<Limits>) -> Ctx {
    Ctx {
        settings: settings.clone(),
        limits: limits.clone(),
    }
}

/// The store's topics, by what they are about.
impl Notifier {
    /// A session's newest event seq (`u64::MAX` once it is deleted).
    pub fn subscribe(&self, sid: &str, current: u64) -> watch::Receiver<u64> {
        self.watch(tables::TOPIC_SESSION, sid, current)
    }

    /// Stops of `sid`'s turn ([`tables::TOPIC_STOP`]), from any hub on the store.
    pub fn subscribe_stop(&self, sid: &str) -> watch::Receiver<u64> {
        let current = self.current(tables::TOPIC_STOP, sid).unwrap_or(0);
        self.watch(tables::TOPIC_STOP, sid, current)
    }

    /// The newest hub event's seq.
    pub fn subscribe_hub(&self) -> watch::Receiver<u64> {
        let current = self.current(TOPIC_HUB, "").unwrap_or(0);
        self.watch(TOPIC_HUB, "", current)
    }

    /// The sessions' open long polls and SSE streams (each holds one [`Notifier::subscribe`]).
    pub fn session_watchers(&self) -> usize {
        self.watchers(tables::TOPIC_SESSION)
    }

    /// Changes whenever a batch added or ended remote waits of `device`.
    pub fn subscribe_device(&self, device: &str) -> watch::Receiver<u64> {
        self.watch(tables::TOPIC_DEVICE, device, 0)
    }
}

/// Runs a read against redb's last commit, on the caller's thread.
fn read_now<R>(
    db: &Database,
    ctx: &Ctx,
    f: impl for<'a> FnOnce(&ReadTx<'a>) -> Result<R, StoreError>,
) -> Result<R, StoreError> {
    let snap = Snapshot::open(&db.begin_read()?, &REGISTRY)?;
    let mut cur = Overlay::new(REGISTRY.len());
    kernel::tx::outside_writer(&REGISTRY, &snap, &mut cur, ctx, |t| f(t))
}

/// Runs a write straight into redb, before the writer starts (at open).
fn run_once(
    db: &Database,
    ctx: &Ctx,
    f: impl for<'a> FnOnce(&mut Tx<'a>) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let snap = Snapshot::open(&db.begin_read()?, &REGISTRY)?;
    let mut cur = Overlay::new(REGISTRY.len());
    kernel::tx::outside_writer(&REGISTRY, &snap, &mut cur, ctx, f)?;
    if cur.is_empty() {
        return Ok(());
    }
    kernel::checkpoint::commit(db, &REGISTRY, &cur, None)
}

fn stored_settings(db: &Database) -> Result<Option<Settings>, StoreError> {
    let ctx = ctx_of(&Arc::new(Settings::default()), &Arc::default());
    read_now(db, &ctx, |t| t.stored_settings())
}

/// The writer's job for `f`, whose answer goes to `then` once the batch is durable (or
/// failed). A failing `f` has its changes undone.
fn job<R, F, C>(f: F, then: C) -> Job<Ctx>
where
    R: Send + 'static,
    F: for<'a> FnOnce(&mut Tx<'a>) -> Result<R, StoreError> + Send + 'static,
    C: FnOnce(Result<R, Arc<StoreError>>) + Send + 'static,
{
    Job::Run(Box::new(move |t: Option<&mut Tx<'_>>| {
        let r = match t {
            None => Err(StoreError::Closed),
            Some(t) => f(t),
        };
        let failed = r.is_err();
        let done: Completion = Box::new(move |durable| {
            then(match (durable, r) {
                (Ok(()), Ok(v)) => Ok(v),
                (Err(e), _) => Err(e),
                (Ok(()), Err(e)) => Err(Arc::new(e)),
            });
        });
        (done, failed)
    }))
}

/// When a write answered early by [`Store::exec_ahead`] is durable.
#[must_use = "a write answered early must be awaited before anything depends on it outside the hub"]
pub struct Durable(oneshot::Receiver<Result<(), Arc<StoreError>>>);

impl Durable {
    /// Waits until the write is in the journal; the error when it could not be.
    pub async fn wait(self) -> Result<(), Arc<StoreError>> {
        self.0.await.map_err(|_| Arc::new(StoreError::Closed))?
    }
}

/// Answers a job the writer will never see (it has stopped).
fn refuse(job: Job<Ctx>) {
    if let Some(done) = job.unrun() {
        done(Err(Arc::new(StoreError::Closed)));
    }
}

#[cfg(test)]
mod tests;
