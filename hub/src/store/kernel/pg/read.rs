//! A read outside the writer: one `REPEATABLE READ READ ONLY` transaction on a pooled
//! connection, the kernel's layers on it as on a redb snapshot.

use std::sync::{Arc, Mutex};

use super::conn::Pg;
use super::snap;
use crate::store::kernel::error::StoreError;
use crate::store::kernel::table::{AnyTable, Overlay};
use crate::store::kernel::tx::{Tx, outside_writer};

const BEGIN: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";

impl Pg {
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
        let r = outside_writer(
            registry,
            &snap,
            &mut Overlay::new(registry.len()),
            ctx,
            |t| f(t),
        );
        drop(snap);
        let end = {
            let mut c = snap::lock(&conn)?;
            // A statement that failed while `f` went on aborted the transaction: what it
            // read then is not to be trusted.
            let failed = c.failed();
            c.simple(if r.is_ok() && !failed {
                "COMMIT"
            } else {
                "ROLLBACK"
            })
            .and_then(|()| match failed {
                true => Err(StoreError::Pg(
                    "a statement failed, so the read's transaction was aborted".into(),
                )),
                false => Ok(()),
            })
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
