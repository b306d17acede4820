//! The persistence kernel: tables, the writer thread, group commit, the journal,
//! checkpoints and replay. It knows no domain: a domain registers its tables
//! ([`table::TableSpec`]), runs operations against a [`Tx`], and announces what changed
//! through topic-keyed notices ([`Notices`]).
//!
//! How a change becomes durable, and why an answer never waits for redb:
//! - every operation runs on the one writer thread, against the tables' layers: the last
//!   checkpoint (a redb read snapshot) under the changes made since, kept in memory;
//! - a batch of operations (group commit) is one journal record: the keys it changed and
//!   their new values. It is appended and `fdatasync`ed, and only then are the batch's
//!   callers answered and its notices published;
//! - about once a second (or once enough has changed) the writer freezes the changes and
//!   hands them to the checkpoint thread, which writes them into redb in one commit and
//!   stores the journal number they reach. The writer goes on answering meanwhile, from
//!   memory, with a fresh layer on top; the journal switches to its other file;
//! - at start, the journal records newer than the last checkpoint are applied again (they
//!   are the changes themselves, so a replay is exact) and checkpointed.

pub mod checkpoint;
pub mod delta;
pub mod journal;
pub mod table;
pub mod timers;
mod writer;

pub use table::{AnyTable, Guard, Table, TableRef, TableSpec};
pub(crate) use writer::{Completion, Job, Writer, WriterParts, recover as writer_recover};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use redb::{Key, Value};
use tokio::sync::watch;

use table::{Layers, Overlay, Snapshot, Undo};

/// What a notice is about: a kind (`"session"`, `"device"`, `"timers"`, …) and a key
/// within it (a session id, a device name, or empty).
pub type Topic = (&'static str, String);

/// The notices one batch raised: the newest value per topic. Published only once the
/// batch is durable.
pub type Notices = HashMap<Topic, u64>;

/// The view an operation runs against, and through which it writes.
pub struct Tx<'a, C> {
    registry: &'a [&'static dyn AnyTable],
    snap: &'a Snapshot,
    frozen: Option<&'a Overlay>,
    cur: &'a mut Overlay,
    undo: &'a mut Vec<Undo>,
    notices: &'a mut Notices,
    /// The domain's context (its settings).
    pub ctx: &'a C,
}

impl<'a, C> Tx<'a, C> {
    pub(crate) fn new(
        registry: &'a [&'static dyn AnyTable],
        snap: &'a Snapshot,
        frozen: Option<&'a Overlay>,
        cur: &'a mut Overlay,
        undo: &'a mut Vec<Undo>,
        notices: &'a mut Notices,
        ctx: &'a C,
    ) -> Self {
        Tx {
            registry,
            snap,
            frozen,
            cur,
            undo,
            notices,
            ctx,
        }
    }

    fn check<K: Key + 'static, V: Value + 'static>(&self, spec: &TableSpec<K, V>) -> usize {
        debug_assert!(
            self.registry
                .get(spec.index)
                .is_some_and(|t| t.name() == spec.name),
            "table {} is not registered at {}",
            spec.name,
            spec.index
        );
        spec.index
    }

    /// A table, to read.
    pub fn table<K: Key + 'static, V: Value + 'static>(
        &self,
        spec: &TableSpec<K, V>,
    ) -> TableRef<'_, K, V> {
        let i = self.check(spec);
        TableRef::new(Layers {
            snap: self.snap.tables[i].as_ref(),
            frozen: self.frozen.map(|f| &f.tables[i]),
            cur: &self.cur.tables[i],
            cmp: K::compare,
        })
    }

    /// A table, to read and write.
    pub fn table_mut<K: Key + 'static, V: Value + 'static>(
        &mut self,
        spec: &TableSpec<K, V>,
    ) -> Table<'_, K, V> {
        let i = self.check(spec);
        Table::new(
            i,
            self.snap.tables[i].as_ref(),
            self.frozen.map(|f| &f.tables[i]),
            self.cur,
            self.undo,
        )
    }

    /// Announces `value` on `topic` once this batch is durable (a later value in the same
    /// batch replaces it).
    pub fn notify(&mut self, kind: &'static str, key: &str, value: u64) {
        self.notices.insert((kind, key.to_string()), value);
    }
}

/// The published side of notices: one watch per topic, created by the first subscriber.
#[derive(Default)]
pub struct Notifier {
    topics: Mutex<HashMap<Topic, watch::Sender<u64>>>,
}

impl Notifier {
    /// Changes whenever a durable batch raised `topic`; starts at `current` for a topic
    /// nobody watched yet.
    pub fn watch(&self, kind: &'static str, key: &str, current: u64) -> watch::Receiver<u64> {
        let mut map = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        map.entry((kind, key.to_string()))
            .or_insert_with(|| watch::channel(current).0)
            .subscribe()
    }

    pub(crate) fn publish(&self, notices: Notices) {
        if notices.is_empty() {
            return;
        }
        let mut map = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        for (topic, v) in notices {
            if let Some(tx) = map.get(&topic) {
                tx.send_replace(v);
            }
        }
        if map.len() > 1024 {
            map.retain(|_, tx| tx.receiver_count() > 0);
        }
    }

    /// The value a topic holds now, if anyone created it.
    pub fn current(&self, kind: &'static str, key: &str) -> Option<u64> {
        let map = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&(kind, key.to_string())).map(|t| *t.borrow())
    }
}

/// The store's shared counters: the newest journal record acknowledged to a caller, and
/// the newest one a checkpoint holds.
#[derive(Clone)]
pub struct Progress {
    pub acked: Arc<std::sync::atomic::AtomicU64>,
    pub landed: watch::Receiver<u64>,
}
