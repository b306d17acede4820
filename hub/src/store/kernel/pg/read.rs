//! Outside the writer: a read, one `REPEATABLE READ READ ONLY` transaction on a pooled
//! connection with the kernel's layers on it as on a redb snapshot; and a write at start,
//! before the writer runs (a transaction like a batch's: the write lock, a row in the log).

use std::sync::{Arc, Mutex};

use super::conn::Pg;
use super::{snap, writer};
use crate::store::kernel::error::StoreError;
use crate::store::kernel::notice::Notices;
use crate::store::kernel::table::{AnyTable, Overlay};
use crate::store::kernel::tx::{Tx, outside_writer};

const BEGIN: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";

impl Pg {
    /// Runs `f` and commits what it changed, on the caller's thread (at start).
    pub fn write_once<C>(
        &self,
        registry: &[&'static dyn AnyTable],
        ctx: &C,
        f: impl for<'a> FnOnce(&mut Tx<'a, C>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let conn: snap::Shared = Arc::new(Mutex::new(self.conn()?));
        writer::begin(&mut *snap::lock(&conn)?)?;
        let snap = snap::snapshot(&conn, registry);
        let mut cur = Overlay::new(registry.len());
        let r = outside_writer(registry, &snap, &mut cur, ctx, f);
        drop(snap);
        let none = Notices::default();
        let ended = writer::end(
            &mut *snap::lock(&conn)?,
            registry,
            r.is_ok().then_some(self.ending(&cur, &none)),
        );
        r.and(ended.map(|_| ()))
    }

    /// A transaction's ending outside the writer: logged, announced, never pruning.
    fn ending<'a>(&self, changes: &'a Overlay, notices: &'a Notices) -> writer::Ending<'a> {
        writer::Ending {
            changes,
            notices,
            writer: self.me,
            prune: false,
            notify: true,
        }
    }

    /// The newest batch number of the batches log (0: none yet).
    pub fn newest_batch(&self) -> Result<i64, StoreError> {
        let mut c = self.take()?;
        let sql = format!(
            "SELECT coalesce(max(n), 0) FROM {}",
            super::conn::qualified(writer::BATCHES)
        );
        let n = c.run(|cl| cl.query_one(&sql, &[]))?.get(0);
        self.put_back(c);
        Ok(n)
    }

    /// Runs `f` against one consistent view of the database, on the caller's thread:
    /// every change committed before the call is in it.
    pub fn read<C, R>(
        &self,
        registry: &[&'static dyn AnyTable],
        ctx: &C,
        f: impl for<'a> FnOnce(&Tx<'a, C>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let mut c = self.take()?;
        if let Err(e) = c.simple(BEGIN) {
            // A pooled connection lost while idle: nothing was done on it.
            if !c.is_closed() {
                return Err(e);
            }
            c = self.conn()?;
            c.simple(BEGIN)?;
        }
        let conn: snap::Shared = Arc::new(Mutex::new(c));
        let snap = snap::snapshot(&conn, registry);
        let mut nothing = Overlay::new(registry.len());
        let r = outside_writer(registry, &snap, &mut nothing, ctx, |t| f(t));
        drop(snap);
        // A read changes nothing: `end` commits (or rolls back) an empty transaction.
        let none = Notices::default();
        let end = writer::end(
            &mut *snap::lock(&conn)?,
            registry,
            r.is_ok().then_some(self.ending(&nothing, &none)),
        )
        .map(|_| ());
        if end.is_ok()
            && let Ok(m) = Arc::try_unwrap(conn)
            && let Ok(c) = m.into_inner()
        {
            self.put_back(c);
        }
        let v = r?;
        end.map(|()| v)
    }
}
