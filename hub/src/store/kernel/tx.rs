//! The view an operation runs against: every registered table through its layers, the
//! timer queue, the notices the batch raises, and what runs once it is durable.

use redb::{Key, Value};

use super::notice::Notices;

/// Something to do once the batch is durable (a log line, a metric): dropped with a job
/// that failed or a batch the journal could not take, and outside the writer.
pub type Deferred = Box<dyn FnOnce() + Send>;
use super::table::{AnyTable, Layers, Overlay, Snapshot, Table, TableRef, TableSpec, Undo};

/// The view an operation runs against, and through which it writes.
pub struct Tx<'a, C> {
    registry: &'a [&'static dyn AnyTable],
    snap: &'a Snapshot,
    frozen: Option<&'a Overlay>,
    cur: &'a mut Overlay,
    undo: &'a mut Vec<Undo>,
    notices: &'a mut Notices,
    after: &'a mut Vec<Deferred>,
    /// The domain's context (its settings).
    pub ctx: &'a C,
}

impl<'a, C> Tx<'a, C> {
    // The writer's parts, each borrowed on its own (one struct would borrow them all).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        registry: &'a [&'static dyn AnyTable],
        snap: &'a Snapshot,
        frozen: Option<&'a Overlay>,
        cur: &'a mut Overlay,
        undo: &'a mut Vec<Undo>,
        notices: &'a mut Notices,
        after: &'a mut Vec<Deferred>,
        ctx: &'a C,
    ) -> Self {
        Tx {
            registry,
            snap,
            frozen,
            cur,
            undo,
            notices,
            after,
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

    /// Runs `f` on the writer thread once this batch is durable, after its callers were
    /// answered; never if the job fails or the batch cannot be journaled. Keep it quick:
    /// a log line, a counter.
    pub fn on_durable(&mut self, f: impl FnOnce() + Send + 'static) {
        self.after.push(Box::new(f));
    }

    /// Where the next [`Tx::on_durable`] would go: a caller that learns what to say only
    /// after its inner steps deferred theirs passes it to [`Tx::on_durable_at`], so its
    /// line comes first.
    pub fn durable_mark(&self) -> usize {
        self.after.len()
    }

    /// [`Tx::on_durable`], run before whatever was deferred since `mark`.
    pub fn on_durable_at(&mut self, mark: usize, f: impl FnOnce() + Send + 'static) {
        let at = mark.min(self.after.len());
        self.after.insert(at, Box::new(f));
    }
}

/// Runs `f` on a view of `snap` under `cur`, outside the writer (at open, in a replay, a
/// direct read): the undo log, notices and deferred work are thrown away.
pub fn outside_writer<C, R>(
    registry: &[&'static dyn AnyTable],
    snap: &Snapshot,
    cur: &mut Overlay,
    ctx: &C,
    f: impl for<'a> FnOnce(&mut Tx<'a, C>) -> R,
) -> R {
    let mut undo = Vec::new();
    let mut notices = Notices::new();
    let mut after = Vec::new();
    let mut t = Tx::new(
        registry,
        snap,
        None,
        cur,
        &mut undo,
        &mut notices,
        &mut after,
        ctx,
    );
    f(&mut t)
}
