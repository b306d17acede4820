//! A registered table read through to PostgreSQL, within whatever transaction the
//! connection has open (the writer's batch, a read's snapshot): the kernel's layers sit
//! on it exactly as on a redb snapshot. A range is read a page at a time, so a walk
//! that stops at its first entry (the next timer, the oldest ready session) reads one
//! page, not the table.
//!
//! What is read is kept: the database changes one batch at a time (the writers' lock), so
//! a key read once holds until this writer changes it or another writer commits (the
//! writer then forgets it all, see [`super::writer`]). A batch's own
//! changes sit in the layers above; once it committed, [`SnapTable::settle`] writes them
//! into what is kept, and a batch that failed forgets it all. Range pages are kept only for the batch
//! (a write anywhere in a page's bounds would change it), so the jobs of a batch that all
//! read one session's last events ask the server once. Point reads are kept up to
//! [`KEPT_MAX`] keys a table.

use std::collections::{HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use super::conn::{Conn, qualified};
use crate::store::kernel::error::StoreError;
use crate::store::kernel::table::{AnyTable, Changes, RawItem, RawIter, SnapTable, Snapshot};

/// A connection the snapshot's tables share.
pub type Shared = Arc<Mutex<Conn>>;

pub(crate) fn lock(c: &Shared) -> Result<MutexGuard<'_, Conn>, StoreError> {
    c.lock()
        .map_err(|_| StoreError::Pg("the store's connection was poisoned by a panic".into()))
}

/// Every table of `registry` on `conn`.
pub fn snapshot(conn: &Shared, registry: &[&'static dyn AnyTable]) -> Snapshot {
    let tables = registry
        .iter()
        .map(|t| {
            Box::new(PgTable {
                conn: conn.clone(),
                table: qualified(t.name()),
                order: t.order(),
                kept: Arc::default(),
            }) as Box<dyn SnapTable>
        })
        .collect();
    Snapshot { tables }
}

/// How many point reads a table keeps before it forgets them all and starts over.
const KEPT_MAX: usize = 65_536;

/// A page of a range: (ordered key, raw key, value) rows.
type Page = Vec<(Vec<u8>, Vec<u8>, Vec<u8>)>;
/// A page's query: its bounds (ordered), direction and length.
type PageQuery = (Bound<Vec<u8>>, Bound<Vec<u8>>, bool, i64);

/// What the current batch read from one table.
#[derive(Default)]
struct Kept {
    gets: HashMap<Vec<u8>, Option<Vec<u8>>>,
    pages: HashMap<PageQuery, Page>,
}

struct PgTable {
    conn: Shared,
    table: String,
    order: fn(&[u8]) -> Vec<u8>,
    kept: Arc<Mutex<Kept>>,
}

/// The first page a range reads; each next one is twice as long, up to [`PAGE_MAX`].
const PAGE_FIRST: i64 = 16;
const PAGE_MAX: i64 = 1024;

impl SnapTable for PgTable {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let k = (self.order)(key);
        if let Some(v) = self.kept.lock().ok().and_then(|m| m.gets.get(&k).cloned()) {
            return Ok(v);
        }
        let mut c = lock(&self.conn)?;
        let st = c.stmt(&format!("SELECT v FROM {} WHERE k = $1", self.table))?;
        let row = c.run(|cl| cl.query_opt(&st, &[&k]))?;
        drop(c);
        let v = row.map(|r| r.get::<_, Vec<u8>>(0));
        if let Ok(mut m) = self.kept.lock() {
            m.gets.insert(k, v.clone());
        }
        Ok(v)
    }

    fn range(&self, lo: Bound<&[u8]>, hi: Bound<&[u8]>, rev: bool) -> Result<RawIter, StoreError> {
        let enc = |b: Bound<&[u8]>| b.map(|k| (self.order)(k));
        Ok(Box::new(Pages {
            conn: self.conn.clone(),
            table: self.table.clone(),
            kept: self.kept.clone(),
            lo: enc(lo),
            hi: enc(hi),
            rev,
            buf: VecDeque::new(),
            page: PAGE_FIRST,
            done: false,
        }))
    }

    fn count(&self) -> Result<u64, StoreError> {
        let mut c = lock(&self.conn)?;
        let st = c.stmt(&format!("SELECT count(*) FROM {}", self.table))?;
        let n: i64 = c.run(|cl| cl.query_one(&st, &[]))?.get(0);
        Ok(n.max(0) as u64)
    }

    fn settle(&self, committed: Option<&Changes>) {
        let Ok(mut m) = self.kept.lock() else { return };
        m.pages.clear();
        match committed {
            Some(changes) if m.gets.len() + changes.len() <= KEPT_MAX => {
                for (k, v) in changes {
                    m.gets.insert((self.order)(&k.bytes), v.clone());
                }
            }
            _ => m.gets.clear(),
        }
    }
}

/// A range walked a page at a time; each page starts past the last key of the one before.
struct Pages {
    conn: Shared,
    table: String,
    kept: Arc<Mutex<Kept>>,
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
    rev: bool,
    /// Read, not yet handed out: (ordered key, raw key, value).
    buf: VecDeque<(Vec<u8>, Vec<u8>, Vec<u8>)>,
    page: i64,
    done: bool,
}

impl Pages {
    fn fetch(&mut self) -> Result<(), StoreError> {
        let query: PageQuery = (self.lo.clone(), self.hi.clone(), self.rev, self.page);
        let kept = self
            .kept
            .lock()
            .ok()
            .and_then(|m| m.pages.get(&query).cloned());
        let rows = match kept {
            Some(rows) => rows,
            None => {
                let rows = self.query()?;
                if let Ok(mut m) = self.kept.lock() {
                    m.pages.insert(query, rows.clone());
                }
                rows
            }
        };
        if (rows.len() as i64) < self.page {
            self.done = true;
        }
        self.page = (self.page * 2).min(PAGE_MAX);
        self.buf.extend(rows);
        if let Some((k, _, _)) = self.buf.back() {
            let past = Bound::Excluded(k.clone());
            if self.rev {
                self.hi = past;
            } else {
                self.lo = past;
            }
        }
        Ok(())
    }

    /// The next page from the server.
    fn query(&self) -> Result<Page, StoreError> {
        let mut conds = Vec::new();
        let mut args: Vec<&(dyn postgres::types::ToSql + Sync)> = Vec::new();
        for (b, incl, excl) in [(&self.lo, ">=", ">"), (&self.hi, "<=", "<")] {
            let (op, k) = match b {
                Bound::Included(k) => (incl, k),
                Bound::Excluded(k) => (excl, k),
                Bound::Unbounded => continue,
            };
            args.push(k);
            conds.push(format!("k {op} ${}", args.len()));
        }
        args.push(&self.page);
        let sql = format!(
            "SELECT k, raw, v FROM {} {}{} ORDER BY k {} LIMIT ${}",
            self.table,
            if conds.is_empty() { "" } else { "WHERE " },
            conds.join(" AND "),
            if self.rev { "DESC" } else { "ASC" },
            args.len()
        );
        let mut c = lock(&self.conn)?;
        let st = c.stmt(&sql)?;
        let rows = c.run(|cl| cl.query(&st, &args))?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect())
    }
}

impl Iterator for Pages {
    type Item = RawItem;

    fn next(&mut self) -> Option<RawItem> {
        if self.buf.is_empty()
            && !self.done
            && let Err(e) = self.fetch()
        {
            self.done = true;
            return Some(Err(e));
        }
        self.buf.pop_front().map(|(_, raw, v)| Ok((raw, v)))
    }
}
