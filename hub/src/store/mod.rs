//! The durable state of the hub, in one redb file under `$CORTEX_HOME/hub/`.
//!
//! Only this module knows redb. Every mutation is a closure sent to one writer thread,
//! which gathers whatever is pending into one write transaction and commits it once
//! (group commit): redb fsyncs each commit and serialises commits (~5k/s here), so
//! concurrent callers share a commit instead of queueing for one each. A caller's answer
//! is sent only after the commit that holds its change returned: a 202 means on disk.
//!
//! Reads use redb read transactions directly and run beside the writer.

pub mod device_waits;
pub mod devices;
pub mod ops;
pub mod tables;

pub use ops::{SignalIn, SignalOutcome};
pub use tables::Tx;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use redb::{Database, ReadableDatabase};
use tokio::sync::{mpsc, oneshot, watch};

use crate::engine::Settings;

/// Errors of the storage layer. A caller sees them as 503/500.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage: {0}")]
    Db(#[from] redb::Error),
    #[error("stored record is unreadable: {0}")]
    Decode(String),
    #[error("the store is shutting down")]
    Closed,
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

/// How many jobs one transaction takes at most.
const MAX_BATCH: usize = 1024;

type Completion = Box<dyn FnOnce(Result<(), Arc<StoreError>>) + Send>;
type Job = Box<dyn for<'a> FnOnce(&mut Tx<'a>) -> Completion + Send>;
/// What a commit publishes: sessions whose log grew, the new first timer if it moved,
/// the newest hub event if one was appended, devices whose remote waits changed, and the
/// new first device-wait deadline if it moved.
struct Published {
    touched: HashMap<String, u64>,
    timers: Option<Option<u64>>,
    hub_seq: Option<u64>,
    devices: HashSet<String>,
    device_wait_due: Option<Option<u64>>,
}

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
    /// The earliest precise timer (a decided wake), updated after each commit.
    pub next_timer: watch::Receiver<Option<u64>>,
    /// The earliest hub deadline of an active remote wait, updated after each commit.
    pub next_device_wait: watch::Receiver<Option<u64>>,
    pub settings: Arc<Settings>,
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

impl Store {
    /// Opens (or creates) the database at `path` and starts the writer thread.
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
        let settings = Arc::new(settings);
        let thread = {
            let db = db.clone();
            let notifier = notifier.clone();
            let settings = settings.clone();
            std::thread::Builder::new()
                .name("store-writer".into())
                .spawn(move || writer(db, rx, notifier, (timer_tx, dw_tx), settings))
                .map_err(|e| StoreError::Decode(format!("cannot start the writer thread: {e}")))?
        };
        Ok((
            Store {
                db,
                jobs,
                notifier,
                next_timer,
                next_device_wait,
                settings,
            },
            WriterGuard {
                thread: Some(thread),
            },
        ))
    }

    /// Runs `f` inside the next group commit and returns its result once it is durable.
    pub async fn exec<R, F>(&self, f: F) -> Result<R, Arc<StoreError>>
    where
        R: Send + 'static,
        F: for<'a> FnOnce(&mut Tx<'a>) -> Result<R, StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel::<Result<R, Arc<StoreError>>>();
        let job: Job = Box::new(move |t: &mut Tx<'_>| {
            let r = f(t);
            if let Err(e) = &r {
                t.poison(e);
            }
            Box::new(move |committed: Result<(), Arc<StoreError>>| {
                let out = match (committed, r) {
                    (Ok(()), Ok(v)) => Ok(v),
                    (Err(e), _) => Err(e),
                    (Ok(()), Err(e)) => Err(Arc::new(e)),
                };
                let _ = tx.send(out);
            })
        });
        self.jobs
            .send(job)
            .await
            .map_err(|_| Arc::new(StoreError::Closed))?;
        rx.await.map_err(|_| Arc::new(StoreError::Closed))?
    }

    /// A consistent read of the current state.
    pub fn read<R>(
        &self,
        f: impl FnOnce(&tables::ReadTx) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let rtx = self.db.begin_read()?;
        let r = tables::ReadTx::new(rtx);
        f(&r)
    }
}

type TimerWatches = (watch::Sender<Option<u64>>, watch::Sender<Option<u64>>);

fn writer(
    db: Arc<Database>,
    mut rx: mpsc::Receiver<Job>,
    notifier: Arc<Notifier>,
    (timer_tx, dw_tx): TimerWatches,
    settings: Arc<Settings>,
) {
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        let mut completions: Vec<Completion> = Vec::with_capacity(batch.len());
        let result = (|| -> Result<Published, StoreError> {
            let wtx = db.begin_write()?;
            let (published, poisoned) = {
                let mut tx = Tx::open(&wtx, settings.clone())?;
                for job in batch.drain(..) {
                    completions.push(job(&mut tx));
                }
                let timers = if tx.timers_changed {
                    Some(tx.first_timer()?)
                } else {
                    None
                };
                let device_wait_due = if tx.device_wait_due_changed {
                    Some(tx.first_device_wait_due()?)
                } else {
                    None
                };
                (
                    Published {
                        touched: std::mem::take(&mut tx.touched),
                        timers,
                        hub_seq: tx.hub_seq,
                        devices: std::mem::take(&mut tx.devices_touched),
                        device_wait_due,
                    },
                    tx.poisoned.take(),
                )
            };
            if let Some(e) = poisoned {
                wtx.abort()?;
                return Err(StoreError::Decode(e));
            }
            wtx.commit()?;
            Ok(published)
        })();
        batch.clear();
        match result {
            Ok(p) => {
                // Publish before answering, so a caller sees its own change everywhere.
                notifier.publish(&p.touched);
                if let Some(seq) = p.hub_seq {
                    notifier.hub.send_replace(seq);
                }
                if let Some(t) = p.timers {
                    timer_tx.send_replace(t);
                }
                if let Some(t) = p.device_wait_due {
                    dw_tx.send_replace(t);
                }
                notifier.publish_devices(&p.devices);
                for c in completions {
                    c(Ok(()));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "a store commit failed; its callers get an error and nothing of it is kept");
                let e = Arc::new(e);
                for c in completions {
                    c(Err(e.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
