//! The writer on PostgreSQL: the redb writer's phases with one transaction per batch in
//! place of the journal. Phase 1 runs the jobs ([`super::super::writer::run_batch`]) with
//! their reads going to the database through the batch's changes; phase 2 writes the
//! changes (one statement per table and kind), the batch's row in the batches log, and
//! commits; phase 3 answers ([`super::super::writer::answer`]) only after `COMMIT`
//! returned. There is nothing to checkpoint: the database holds every change once it is
//! committed.
//!
//! Several hubs may write to one database: each batch first takes [`WRITE_LOCK`], a
//! lock held until its transaction ends, so batches are made one at a time across the
//! hubs and an operation's read-then-write (a counter read and set again, a row read and
//! replaced) holds as on one hub. Every batch that changed something adds a row to the
//! batches log ([`BATCHES`]: its number, the process that wrote it, the notices it raised)
//! and sends its number on [`CHANNEL`]; the other hubs' [`super::bus`] reads the row and
//! raises its notices there. What a writer keeps of its reads holds while the log's
//! newest number is its own last.
//!
//! A connection lost between batches is made again before the next; a batch that cannot
//! begin or commit has every caller told, and changes nothing.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::mpsc;

use super::conn::{Conn, Pg, qualified};
use super::snap::{Shared, lock, snapshot};
use crate::store::kernel::error::StoreError;
use crate::store::kernel::notice::{Notices, Notifier};
use crate::store::kernel::table::{AnyTable, Overlay, Snapshot};
use crate::store::kernel::writer::{Job, MAX_BATCH, answer, run_batch, take_pending};

/// What the writer is built from.
pub(crate) struct PgParts<C> {
    pub pg: Arc<Pg>,
    pub registry: &'static [&'static dyn AnyTable],
    pub ctx: C,
    pub rx: mpsc::Receiver<Job<C>>,
    pub notifier: Arc<Notifier>,
    /// Given the database's clock with every batch: the hub's clock follows it.
    pub follow: fn(i64),
    /// Whether a batch's number is sent as a `NOTIFY` (off: the other hubs find it by
    /// their poll of the log).
    pub notify: bool,
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
    /// The newest batch of the log that what the tables keep has seen (0: none yet).
    seen: i64,
    /// Batches written by this writer, for pruning the log now and then.
    written: u64,
    follow: fn(i64),
    notify: bool,
}

/// The lock every write transaction takes first, whichever hub makes it: held until the
/// transaction ends, so batches are made one at a time across the hubs on the database.
const WRITE_LOCK: i64 = 0x0063_6f72_7465_7877; // "cortexw"

/// The batches log: one row per batch that changed something, numbered in commit order
/// (numbers are taken under [`WRITE_LOCK`]).
pub const BATCHES: &str = "batches";
/// The channel a batch's number and writer (`N:WRITER`) are sent on once it commits (a
/// hint: the log is the truth).
pub const CHANNEL: &str = "cortex_batches";
/// How many batches of the log are kept: a hub whose listener was away for longer wakes
/// every watcher once instead (see [`super::bus`]).
pub const BATCHES_KEPT: i64 = 100_000;
/// How often (in batches) a writer prunes the log.
const PRUNE_EVERY: u64 = 1024;

/// Opens a write transaction on `c`: `BEGIN`, [`WRITE_LOCK`], then (once it is held) the
/// log's newest batch number and the database's clock (ms since the epoch). One round
/// trip.
pub(crate) fn begin(c: &mut Conn) -> Result<(i64, i64), StoreError> {
    let rows = c.simple_rows(&format!(
        "BEGIN; SELECT pg_advisory_xact_lock({WRITE_LOCK}); \
         SELECT coalesce(max(n), 0)::text, (extract(epoch from clock_timestamp()) * 1000)::int8::text FROM {}",
        qualified(BATCHES)
    ))?;
    let got = |i: usize| -> Option<i64> { rows.last()?.get(i)?.as_deref()?.parse().ok() };
    let (Some(newest), Some(clock)) = (got(0), got(1)) else {
        return Err(StoreError::Pg(
            "the batches log's newest number did not come back".into(),
        ));
    };
    Ok((newest, clock))
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
            seen: 0,
            written: 0,
            follow: p.follow,
            notify: p.notify,
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
            let result = self.commit(&ran.notices);
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

    /// Opens the batch's transaction, on a new connection if the last one was lost; what
    /// the tables keep is forgotten when another writer committed since this one's last.
    fn begin(&mut self) -> Result<(), StoreError> {
        let mut c = lock(&self.conn)?;
        let begun = if c.is_closed() {
            None
        } else {
            match begin(&mut c) {
                Ok(b) => Some(b),
                // Lost while idle (the server restarted, a proxy cut it): nothing was done
                // on it, so the batch begins again on a new one.
                Err(_) if c.is_closed() => None,
                Err(e) => return Err(e),
            }
        };
        let (newest, clock) = match begun {
            Some(b) => b,
            None => {
                *c = self.pg.conn()?;
                tracing::info!(database = %self.pg.shown, "the store connected to PostgreSQL again");
                begin(&mut c)?
            }
        };
        (self.follow)(clock);
        if newest != self.seen {
            for t in &self.snap.tables {
                t.settle(None);
            }
            self.seen = newest;
        }
        Ok(())
    }

    /// Phase 2: the batch's changes and its row in the log, then `COMMIT`; a failure
    /// rolls it all back.
    fn commit(&mut self, notices: &Notices) -> Result<(), StoreError> {
        let mut c = lock(&self.conn)?;
        let prune = self.written % PRUNE_EVERY == PRUNE_EVERY - 1;
        let n = end(
            &mut c,
            self.registry,
            Some(Ending {
                changes: &self.cur,
                notices,
                writer: self.pg.me,
                prune,
                notify: self.notify,
            }),
        )?;
        if let Some(n) = n {
            self.seen = n;
            self.written += 1;
            crate::metrics::metrics().batch_logged();
        }
        Ok(())
    }
}

/// What a transaction ends with when its work succeeded.
#[derive(Clone, Copy)]
pub(crate) struct Ending<'a> {
    pub changes: &'a Overlay,
    /// The notices they raised, logged with them.
    pub notices: &'a Notices,
    /// The process that wrote them ([`Pg::me`]).
    pub writer: i64,
    /// Whether to prune the log first.
    pub prune: bool,
    /// Whether to send the batch's number as a `NOTIFY`.
    pub notify: bool,
}

/// Ends the open transaction: with `changes` (the work succeeded) writes them and
/// commits, without them rolls back. A statement that failed since `BEGIN` makes it an
/// error either way: PostgreSQL answers an aborted transaction's `COMMIT` with a
/// rollback, and no error.
pub(crate) fn end(
    c: &mut Conn,
    registry: &[&'static dyn AnyTable],
    ending: Option<Ending<'_>>,
) -> Result<Option<i64>, StoreError> {
    let r = match ending {
        _ if c.failed() => Err(StoreError::Pg(
            "a statement failed, so its transaction was aborted; nothing of it was stored".into(),
        )),
        None => Ok(None),
        Some(e) if e.changes.is_empty() => c.simple("COMMIT").map(|()| None),
        Some(e) => write(c, registry, e.changes)
            .and_then(|()| commit_logged(c, &e))
            .map(Some),
    };
    if (r.is_err() || ending.is_none()) && !c.is_closed() {
        let rolled = c.simple("ROLLBACK");
        return r.and_then(|n| rolled.map(|()| n));
    }
    r
}

/// The batch's row in the log, its number sent on [`CHANNEL`], then `COMMIT`: one round
/// trip. The notices are JSON (`[[kind, key, value], …]`) in hex, so nothing in them is
/// read as SQL.
fn commit_logged(c: &mut Conn, e: &Ending<'_>) -> Result<i64, StoreError> {
    let list: Vec<(&str, &str, u64)> = e
        .notices
        .iter()
        .map(|((kind, key), v)| (*kind, key.as_str(), *v))
        .collect();
    let json = serde_json::to_vec(&list)
        .map_err(|e| StoreError::Decode(format!("a batch's notices: {e}")))?;
    let log = qualified(BATCHES);
    let pruned = if e.prune {
        format!("DELETE FROM {log} WHERE n < (SELECT max(n) FROM {log}) - {BATCHES_KEPT}; ")
    } else {
        String::new()
    };
    let told = if e.notify {
        format!(", pg_notify('{CHANNEL}', n::text || ':' || writer::text)")
    } else {
        String::new()
    };
    let rows = c.simple_rows(&format!(
        "{pruned}WITH b AS (INSERT INTO {log} (writer, notices) VALUES ({}, '\\x{}'::bytea) RETURNING n, writer) \
         SELECT n::text{told} FROM b; COMMIT",
        e.writer,
        hex(&json)
    ))?;
    rows.first()
        .and_then(|r| r.first()?.as_deref()?.parse().ok())
        .ok_or_else(|| StoreError::Pg("the batch's number in the log did not come back".into()))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// Writes `changes` in the open transaction: per table, one upsert of what was set and
/// one delete of what was removed (the bytes as parameters: a batch sent as SQL text with
/// its `COMMIT`, one round trip less, measured slower, 0.53x the floor against 0.69x,
/// as the server parsed the hex).
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
