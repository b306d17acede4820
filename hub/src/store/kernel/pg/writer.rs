//! The writer on PostgreSQL: the redb writer's phases with one transaction per batch in
//! place of the journal. Phase 1 runs the jobs ([`super::super::writer::run_batch`]) with
//! their reads going to the database through the batch's changes; phase 2 writes the
//! changes (one statement per table and kind) and commits; phase 3 answers
//! ([`super::super::writer::answer`]) only after `COMMIT` returned. There is nothing to
//! checkpoint: the database holds every change once it is committed.
//!
//! A connection lost between batches is made again before the next; a batch that cannot
//! begin or commit has every caller told, and changes nothing.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::mpsc;

use super::conn::{Conn, Pg, qualified};
use super::snap::{Shared, lock, snapshot};
use crate::store::kernel::error::StoreError;
use crate::store::kernel::notice::Notifier;
use crate::store::kernel::table::{AnyTable, Overlay, Snapshot};
use crate::store::kernel::writer::{Job, MAX_BATCH, answer, run_batch, take_pending};

/// What the writer is built from.
pub(crate) struct PgParts<C> {
    pub pg: Arc<Pg>,
    pub registry: &'static [&'static dyn AnyTable],
    pub ctx: C,
    pub rx: mpsc::Receiver<Job<C>>,
    pub notifier: Arc<Notifier>,
}

pub(crate) struct PgWriter<C> {
    pg: Arc<Pg>,
    conn: Shared,
    snap: Snapshot,
    registry: &'static [&'static dyn AnyTable],
    ctx: C,
    rx: mpsc::Receiver<Job<C>>,
    cur: Overlay,
    notifier: Arc<Notifier>,
}

/// The session advisory lock the writer's connection holds while the hub runs: one
/// writer per database, until sessions are claimed with leases and fenced by epochs (the
/// operations' read-then-write counters rest on it).
const WRITER_LOCK: i64 = 0x0063_6f72_7465_7877; // "cortexw"

/// Takes [`WRITER_LOCK`] on `c`, or says who holds it.
fn take_lock(c: &mut Conn, shown: &str) -> Result<(), StoreError> {
    let st = c.stmt("SELECT pg_try_advisory_lock($1)")?;
    let got: bool = c.run(|cl| cl.query_one(&st, &[&WRITER_LOCK]))?.get(0);
    if got {
        return Ok(());
    }
    // Advisory locks are per database: the holder is looked for in this one (a cluster
    // may hold other hubs' databases, each with its own writer).
    let holder = c
        .run(|cl| {
            cl.query_opt(
            "SELECT coalesce(a.client_addr::text, 'a local socket') || ', backend pid ' || a.pid
               FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
              WHERE l.locktype = 'advisory' AND l.granted
                AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND ((l.classid::bigint << 32) | l.objid::bigint) = $1",
            &[&WRITER_LOCK],
        )
        })
        .map(|r| r.map(|r| r.get::<_, String>(0)));
    let holder = match holder {
        Ok(Some(h)) => h,
        Ok(None) => "gone since".into(),
        Err(e) => format!("unknown: {e}"),
    };
    Err(StoreError::Config(format!(
        "another cortex-hub writes to the store's database {shown} (its connection: {holder}); this version runs one hub per database: stop that one, or give this one a database of its own"
    )))
}

impl<C> PgWriter<C> {
    pub(crate) fn new(p: PgParts<C>) -> Result<Self, StoreError> {
        let mut first = p.pg.conn()?;
        take_lock(&mut first, &p.pg.shown)?;
        let conn: Shared = Arc::new(Mutex::new(first));
        let snap = snapshot(&conn, p.registry);
        Ok(PgWriter {
            pg: p.pg,
            conn,
            snap,
            cur: Overlay::new(p.registry.len()),
            registry: p.registry,
            ctx: p.ctx,
            rx: p.rx,
            notifier: p.notifier,
        })
    }

    pub(crate) fn run(mut self) {
        let mut batch: Vec<Job<C>> = Vec::with_capacity(MAX_BATCH);
        loop {
            let Some(first) = self.rx.blocking_recv() else {
                return;
            };
            batch.push(first);
            let started = Instant::now();
            take_pending(&mut self.rx, &mut batch);
            if let Err(e) = self.begin() {
                tracing::error!(error = %e, "the store cannot begin a transaction; this batch's callers get an error");
                let e = Arc::new(e);
                for job in batch.drain(..) {
                    if let Some(done) = job.unrun() {
                        done(Err(e.clone()));
                    }
                }
                continue;
            }
            let Some(ran) = run_batch(
                self.registry,
                &self.snap,
                None,
                &mut self.cur,
                &self.ctx,
                &mut batch,
            ) else {
                return; // a test's crash
            };
            let changed = !ran.undo.is_empty();
            let result = self.commit();
            // Committed or rolled back, the database now says what is true.
            for (t, changes) in self.snap.tables.iter().zip(&self.cur.tables) {
                t.settle(result.is_ok().then_some(changes));
            }
            self.cur = Overlay::new(self.registry.len());
            if let Err(e) = &result {
                tracing::error!(error = %e, "the store could not commit a batch; its callers get an error and nothing of it is stored");
            } else if changed {
                crate::metrics::metrics().commit(started.elapsed().as_secs_f64());
            }
            answer(&self.notifier, ran, result.map_err(Arc::new));
        }
    }

    /// Opens the batch's transaction, on a new connection if the last one was lost.
    fn begin(&mut self) -> Result<(), StoreError> {
        let mut c = lock(&self.conn)?;
        if !c.is_closed() {
            match c.simple("BEGIN") {
                Ok(()) => return Ok(()),
                // Lost while idle (the server restarted, a proxy cut it): nothing was done
                // on it, so the batch begins again on a new one.
                Err(_) if c.is_closed() => {}
                Err(e) => return Err(e),
            }
        }
        let mut again = self.pg.conn()?;
        // The lock went with the lost connection: another hub may have taken it since,
        // and written; what was read before is forgotten.
        take_lock(&mut again, &self.pg.shown)?;
        *c = again;
        for t in &self.snap.tables {
            t.settle(None);
        }
        tracing::info!(database = %self.pg.shown, "the store connected to PostgreSQL again");
        c.simple("BEGIN")
    }

    /// Phase 2: the batch's changes, then `COMMIT`; a failure rolls it all back.
    fn commit(&mut self) -> Result<(), StoreError> {
        let mut c = lock(&self.conn)?;
        end(&mut c, self.registry, Some(&self.cur))
    }
}

/// Ends the open transaction: with `changes` (the work succeeded) writes them and
/// commits, without them rolls back. A statement that failed since `BEGIN` makes it an
/// error either way: PostgreSQL answers an aborted transaction's `COMMIT` with a
/// rollback, and no error.
pub(crate) fn end(
    c: &mut Conn,
    registry: &[&'static dyn AnyTable],
    changes: Option<&Overlay>,
) -> Result<(), StoreError> {
    let r = match changes {
        _ if c.failed() => Err(StoreError::Pg(
            "a statement failed, so its transaction was aborted; nothing of it was stored".into(),
        )),
        None => Ok(()),
        Some(changes) => write(c, registry, changes).and_then(|()| c.simple("COMMIT")),
    };
    if (r.is_err() || changes.is_none()) && !c.is_closed() {
        let rolled = c.simple("ROLLBACK");
        return r.and(rolled);
    }
    r
}

/// Writes `changes` in the open transaction: per table, one upsert of what was set and
/// one delete of what was removed.
pub(crate) fn write(
    c: &mut Conn,
    registry: &[&'static dyn AnyTable],
    changes: &Overlay,
) -> Result<(), StoreError> {
    for (t, tab) in registry.iter().zip(&changes.tables) {
        if tab.is_empty() {
            continue;
        }
        let order = t.order();
        let (mut ks, mut raws, mut vs, mut gone) = (vec![], vec![], vec![], vec![]);
        for (k, v) in tab {
            match v {
                Some(v) => {
                    ks.push(order(&k.bytes));
                    raws.push(k.bytes.clone());
                    vs.push(v.clone());
                }
                None => gone.push(order(&k.bytes)),
            }
        }
        let name = qualified(t.name());
        if !ks.is_empty() {
            let st = c.stmt(&format!(
                "INSERT INTO {name} (k, raw, v) SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[]) ON CONFLICT (k) DO UPDATE SET raw = EXCLUDED.raw, v = EXCLUDED.v"
            ))?;
            c.run(|cl| cl.execute(&st, &[&ks, &raws, &vs]))?;
        }
        if !gone.is_empty() {
            let st = c.stmt(&format!("DELETE FROM {name} WHERE k = ANY($1::bytea[])"))?;
            c.run(|cl| cl.execute(&st, &[&gone]))?;
        }
    }
    Ok(())
}
