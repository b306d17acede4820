//! A read (or a one-off write) outside the writer: one transaction on a pooled
//! connection, the kernel's layers on it as on a redb snapshot.

use std::sync::{Arc, Mutex};

use super::conn::Pg;
use super::{snap, writer};
use crate::store::kernel::error::StoreError;
use crate::store::kernel::table::{AnyTable, Overlay};
use crate::store::kernel::tx::{Tx, outside_writer};

impl Pg {
    /// Runs `f` against one consistent view of the database (`REPEATABLE READ READ
    /// ONLY`), on the caller's thread: every change committed before the call is in it.
    pub fn read<C, R>(
        &self,
        registry: &[&'static dyn AnyTable],
        ctx: &C,
        f: impl for<'a> FnOnce(&Tx<'a, C>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        self.in_transaction(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
            registry,
            ctx,
            |t, _| f(t),
        )
    }

    fn in_transaction<C, R>(
        &self,
        begin: &str,
        registry: &[&'static dyn AnyTable],
        ctx: &C,
        f: impl for<'a> FnOnce(&mut Tx<'a, C>, ()) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let mut c = self.take()?;
        if let Err(e) = c.simple(begin) {
            // A pooled connection lost while idle: nothing was done on it.
            if !c.is_closed() {
                return Err(e);
            }
            c = self.conn()?;
            c.simple(begin)?;
        }
        let conn: snap::Shared = Arc::new(Mutex::new(c));
        let lock = snap::lock;
        let snap = snap::snapshot(&conn, registry);
        let mut cur = Overlay::new(registry.len());
        let r = outside_writer(registry, &snap, &mut cur, ctx, |t| f(t, ()));
        drop(snap);
        let end = {
            let mut c = lock(&conn)?;
            match &r {
                // A statement failed and the work went on: its transaction is aborted, and
                // what it read or would write is not to be trusted.
                Ok(_) if c.failed() => c.simple("ROLLBACK").and(Err(StoreError::Pg(
                    "a statement failed, so the transaction was aborted".into(),
                ))),
                Ok(_) => writer::write(&mut c, registry, &cur).and_then(|()| c.simple("COMMIT")),
                Err(_) => c.simple("ROLLBACK"),
            }
        };
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
