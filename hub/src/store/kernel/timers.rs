//! The durable timer queue: one table `(due, kind, id) → ()` for every domain's timers (a
//! decided wake, a remote wait's hub deadline, later the agent's own), and one notice
//! with the earliest due time, which the hub's one timer loop sleeps on.
//!
//! A domain names its kind and its ids; it moves its timers with [`Tx::reschedule`] in
//! the same batch as the change that decides them, so a timer is exactly as durable as
//! the state it belongs to. When one falls due, the timer loop asks for the due entries
//! ([`Tx::due_timers`]) and hands each to its kind's handler, which removes or moves it.

use super::error::StoreError;
use super::table::TableSpec;
use super::tx::Tx;

/// The queue: (due time in ms, kind, id) → ().
pub const TIMER_QUEUE: TableSpec<(u64, &str, &str), ()> = TableSpec::new(1, "timer_queue");
/// The notice topic carrying the earliest due time (`u64::MAX`: none).
pub const TOPIC: &str = "timers";

/// A timer that fell due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub at: u64,
    pub kind: String,
    pub id: String,
}

impl<C> Tx<'_, C> {
    /// Moves `kind`'s timer for `id` from `old` to `new` (`None`: absent), and announces
    /// the earliest due time when it may have changed.
    pub fn reschedule(
        &mut self,
        kind: &str,
        id: &str,
        old: Option<u64>,
        new: Option<u64>,
    ) -> Result<(), StoreError> {
        if old == new {
            return Ok(());
        }
        let mut q = self.table_mut(&TIMER_QUEUE);
        if let Some(t) = old {
            q.remove((t, kind, id))?;
        }
        if let Some(t) = new {
            q.insert((t, kind, id), ())?;
        }
        let first = self.first_timer()?;
        self.notify(TOPIC, "", first.unwrap_or(u64::MAX));
        Ok(())
    }

    /// The earliest due time in the queue.
    pub fn first_timer(&self) -> Result<Option<u64>, StoreError> {
        Ok(self.table(&TIMER_QUEUE).first()?.map(|(k, _)| k.value().0))
    }

    /// The timers due at `now` (of `kind` only, when given), earliest first, at most
    /// `limit`.
    pub fn due_timers(
        &self,
        now: u64,
        kind: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Due>, StoreError> {
        let mut out = Vec::new();
        for r in self
            .table(&TIMER_QUEUE)
            .range(..(now.saturating_add(1), "", ""))?
        {
            let (k, _) = r?;
            let (at, k_kind, id) = k.value();
            if kind.is_some_and(|want| want != k_kind) {
                continue;
            }
            out.push(Due {
                at,
                kind: k_kind.to_string(),
                id: id.to_string(),
            });
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::table::{AnyTable, Overlay, Snapshot};
    use super::super::{Notices, Tx};
    use super::*;
    use redb::ReadableDatabase;

    static REG: [&dyn AnyTable; 2] = [&super::super::checkpoint::META, &TIMER_QUEUE];

    #[test]
    fn timers_move_fall_due_in_order_and_announce_the_earliest() {
        let dir = tempfile::tempdir().expect("tmp");
        let db = redb::Database::create(dir.path().join("t.redb")).expect("db");
        let snap = Snapshot::open(&db.begin_read().expect("r"), &REG).expect("snap");
        let (mut cur, mut undo, mut notices) = (Overlay::new(2), Vec::new(), Notices::new());
        {
            let mut after = Vec::new();
            let mut t = Tx::new(
                &REG,
                &snap,
                None,
                &mut cur,
                &mut undo,
                &mut notices,
                &mut after,
                &(),
            );
            t.reschedule("wake", "wp_b", None, Some(300)).expect("b");
            t.reschedule("wake", "wp_a", None, Some(200)).expect("a");
            t.reschedule("device-wait", "wp_c", None, Some(100))
                .expect("c");
            assert_eq!(t.first_timer().expect("first"), Some(100));
            t.reschedule("device-wait", "wp_c", Some(100), Some(400))
                .expect("move");
            assert_eq!(t.first_timer().expect("first"), Some(200));
            let due = t.due_timers(300, None, 10).expect("due");
            let ids: Vec<&str> = due.iter().map(|d| d.id.as_str()).collect();
            assert_eq!(ids, vec!["wp_a", "wp_b"]);
            assert_eq!(t.due_timers(300, None, 1).expect("due").len(), 1);
            assert!(
                t.due_timers(1_000, Some("nothing"), 10)
                    .expect("due")
                    .is_empty()
            );
            assert_eq!(
                t.due_timers(1_000, Some("device-wait"), 10).expect("due")[0].id,
                "wp_c"
            );
            t.reschedule("wake", "wp_a", Some(200), None)
                .expect("clear");
            t.reschedule("wake", "wp_b", Some(300), None)
                .expect("clear");
            t.reschedule("device-wait", "wp_c", Some(400), None)
                .expect("clear");
            assert_eq!(t.first_timer().expect("first"), None);
        }
        assert_eq!(notices.get(&(TOPIC, String::new())), Some(&u64::MAX));
    }
}
