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

use super::super::error::StoreError;
use super::super::notice::Notifier;
use super::super::table::{AnyTable, Overlay, Snapshot};
use super::super::writer::{Job, MAX_BATCH, answer, run_batch};
use super::snap::{Shared, lock, snapshot};
use super::{Conn, Pg, qualified};

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

impl<C> PgWriter<C> {
    pub(crate) fn new(p: PgParts<C>) -> Result<Self, StoreError> {
        let conn: Shared = Arc::new(Mutex::new(p.pg.conn()?));
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
            while batch.len() < MAX_BATCH {
                match self.rx.try_recv() {
                    Ok(j) => batch.push(j),
                    Err(_) => break,
                }
            }
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
            let result = self.commit(changed);
            // Committed or rolled back, the database now says what is true.
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
        if c.client.is_closed() {
            *c = self.pg.conn()?;
            tracing::info!(database = %self.pg.shown, "the store connected to PostgreSQL again");
        }
        c.simple("BEGIN")
    }

    /// Phase 2: the batch's changes, then `COMMIT`; a failure rolls it all back.
    fn commit(&mut self, changed: bool) -> Result<(), StoreError> {
        let mut c = lock(&self.conn)?;
        let r = if changed {
            write(&mut c, self.registry, &self.cur)
        } else {
            Ok(())
        };
        match r.and_then(|()| c.simple("COMMIT")) {
            Ok(()) => Ok(()),
            Err(e) => {
                if !c.client.is_closed() {
                    let _ = c.simple("ROLLBACK");
                }
                Err(e)
            }
        }
    }
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
            c.client
                .execute(&st, &[&ks, &raws, &vs])
                .map_err(StoreError::pg)?;
        }
        if !gone.is_empty() {
            let st = c.stmt(&format!("DELETE FROM {name} WHERE k = ANY($1::bytea[])"))?;
            c.client.execute(&st, &[&gone]).map_err(StoreError::pg)?;
        }
    }
    Ok(())
}
