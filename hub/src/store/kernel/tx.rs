//! The view an operation runs against: every registered table through its layers, the
//! timer queue, and the notices the batch raises.

use redb::{Key, Value};

use super::notice::Notices;
use super::table::{AnyTable, Layers, Overlay, Snapshot, Table, TableRef, TableSpec, Undo};

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

/// Runs `f` on a view of `snap` under `cur`, outside the writer (at open, in a replay, a
/// direct read): the undo log and notices are thrown away.
pub fn outside_writer<C, R>(
    registry: &[&'static dyn AnyTable],
    snap: &Snapshot,
    cur: &mut Overlay,
    ctx: &C,
    f: impl for<'a> FnOnce(&mut Tx<'a, C>) -> R,
) -> R {
    let mut undo = Vec::new();
    let mut notices = Notices::new();
    let mut t = Tx::new(registry, snap, None, cur, &mut undo, &mut notices, ctx);
    f(&mut t)
}
