//! The checkpoint thread: writes frozen changes into redb, one commit each, so the writer
//! never waits for redb.
//!
//! Each checkpoint stores, in the same commit, the newest journal record its changes
//! reach ([`JOURNAL_SEQ`] in [`META`]): a replay after a crash starts after it. A failed
//! checkpoint changes nothing in redb; the writer keeps the changes in memory and tries
//! again.

use std::sync::Arc;
use std::sync::mpsc as std_mpsc;

use redb::Database;
use tokio::sync::mpsc;

use super::error::StoreError;
use super::table::{AnyTable, Overlay, TableSpec};

/// The kernel's own table: name → number.
pub const META: TableSpec<&str, u64> = TableSpec::new(0, "meta");
/// The key in [`META`] of the newest journal record redb holds.
pub const JOURNAL_SEQ: &str = "journal_seq";
/// The key in [`META`] that says the last stop was clean (1): its checkpoint holds every
/// change, so the journal holds nothing more.
pub const CLEAN_STOP: &str = "clean_stop";

/// How a checkpoint went.
pub struct Landed {
    pub seq: u64,
    pub result: Result<(), StoreError>,
}

struct Work {
    changes: Arc<Overlay>,
    seq: u64,
}

/// The checkpoint thread's handle.
pub struct Checkpointer {
    work: Option<std_mpsc::Sender<Work>>,
    done: std_mpsc::Receiver<Landed>,
    /// Checkpoints handed over whose outcome was not taken yet.
    in_flight: usize,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Writes `changes` into redb with `seq` as the journal number it reaches, in one commit.
pub fn write(
    db: &Database,
    registry: &[&'static dyn AnyTable],
    changes: &Overlay,
    seq: u64,
) -> Result<(), StoreError> {
    write_marked(db, registry, changes, seq, false)
}

/// [`write`], marking the stop clean when `clean`.
pub fn write_marked(
    db: &Database,
    registry: &[&'static dyn AnyTable],
    changes: &Overlay,
    seq: u64,
    clean: bool,
) -> Result<(), StoreError> {
    commit(db, registry, changes, Some((seq, clean)))
}

/// Writes `changes` into redb in one commit; with `mark`, also the journal number they
/// reach and, when it says so, that the stop is clean. Without it (before the journal
/// is in use, at open), the changes carry no journal number.
pub fn commit(
    db: &Database,
    registry: &[&'static dyn AnyTable],
    changes: &Overlay,
    mark: Option<(u64, bool)>,
) -> Result<(), StoreError> {
    let mut wtx = db.begin_write()?;
    // The allocator's state goes with each commit: after a crash redb opens from it
    // instead of walking every page of the file (which grows with the store: minutes
    // for a few GB).
    wtx.set_quick_repair(true);
    for (t, c) in registry.iter().zip(&changes.tables) {
        if !c.is_empty() {
            t.apply(&wtx, c)?;
        }
    }
    if let Some((seq, clean)) = mark {
        let mut meta = wtx.open_table(META.def)?;
        meta.insert(JOURNAL_SEQ, seq)?;
        if clean {
            meta.insert(CLEAN_STOP, 1)?;
        }
    }
    wtx.commit()?;
    Ok(())
}

impl Checkpointer {
    /// Starts the thread; `wake` nudges the writer when a checkpoint is done (a weak
    /// handle, so the thread never keeps the writer's queue open).
    pub fn start<J: Send + 'static>(
        db: Arc<Database>,
        registry: &'static [&'static dyn AnyTable],
        wake: mpsc::WeakSender<J>,
        nudge: fn() -> J,
    ) -> std::io::Result<Checkpointer> {
        let (work_tx, work_rx) = std_mpsc::channel::<Work>();
        let (done_tx, done) = std_mpsc::channel::<Landed>();
        let thread = std::thread::Builder::new()
            .name("store-checkpoint".into())
            .spawn(move || {
                while let Ok(w) = work_rx.recv() {
                    let result = write(&db, registry, &w.changes, w.seq);
                    if done_tx.send(Landed { seq: w.seq, result }).is_err() {
                        return;
                    }
                    if let Some(q) = wake.upgrade() {
                        // A full queue means the writer is busy and looks by itself.
                        let _ = q.try_send(nudge());
                    }
                }
            })?;
        Ok(Checkpointer {
            work: Some(work_tx),
            done,
            in_flight: 0,
            thread: Some(thread),
        })
    }

    /// Hands `changes` (reaching journal record `seq`) to the thread.
    pub fn send(&mut self, changes: Arc<Overlay>, seq: u64) -> Result<(), StoreError> {
        self.work
            .as_ref()
            .and_then(|w| w.send(Work { changes, seq }).ok())
            .ok_or(StoreError::Closed)?;
        self.in_flight += 1;
        Ok(())
    }

    /// A finished checkpoint's outcome, if one is ready.
    pub fn finished(&mut self) -> Option<Landed> {
        let l = self.done.try_recv().ok()?;
        self.in_flight -= 1;
        Some(l)
    }

    /// Waits for the checkpoint in flight, if there is one (none after a failed one that
    /// was not handed over again).
    pub fn wait(&mut self) -> Option<Landed> {
        if self.in_flight == 0 {
            return None;
        }
        let l = self.done.recv().ok()?;
        self.in_flight -= 1;
        Some(l)
    }

    /// Stops the thread once it finished what it was given.
    pub fn stop(&mut self) {
        self.work = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop();
    }
}
