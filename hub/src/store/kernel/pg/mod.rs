//! The kernel on PostgreSQL: the same tables, the same [`super::Tx`], the same writer's
//! phases, with PostgreSQL as the durable store in place of the journal and redb.
//!
//! - each registered table is a table of the `cortex` schema: `k bytea PRIMARY KEY` (the
//!   key in [`super::ordered`]'s encoding, so PostgreSQL's byte order is redb's), `raw`
//!   (the key as redb encodes it, what a read hands back) and `v` (the value);
//! - a batch of jobs is one PostgreSQL transaction: the jobs read through to the database
//!   ([`snap`]) under the batch's changes kept in memory, the changes are written in one
//!   statement per table and kind, and the callers are answered only once `COMMIT`
//!   returned (`synchronous_commit` is whatever the server says; on by default);
//! - a read outside the writer is one `REPEATABLE READ READ ONLY` transaction on a pooled
//!   connection: a consistent view holding every acknowledged change;
//! - the schema is versioned ([`migrate`]): applied at start under an advisory lock, so
//!   one hub of several applies it, and a hub refuses a schema newer than it knows.

pub mod migrate;
pub mod snap;
pub mod writer;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use postgres::{Client, NoTls, Statement};

use super::error::StoreError;
use super::table::{AnyTable, Overlay};
use super::tx::{Tx, outside_writer};

/// The schema every table of the store lives in.
pub const SCHEMA: &str = "cortex";

/// A connection and the statements prepared on it.
pub struct Conn {
    pub(crate) client: Client,
    stmts: HashMap<String, Statement>,
}

impl Conn {
    /// `sql`, prepared once per connection.
    pub(crate) fn stmt(&mut self, sql: &str) -> Result<Statement, StoreError> {
        if let Some(s) = self.stmts.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql).map_err(StoreError::pg)?;
        self.stmts.insert(sql.to_string(), s.clone());
        Ok(s)
    }

    pub(crate) fn simple(&mut self, sql: &str) -> Result<(), StoreError> {
        self.client.batch_execute(sql).map_err(StoreError::pg)
    }
}

/// Where the store's database is, and a pool of connections to it.
pub struct Pg {
    config: postgres::Config,
    /// What the logs and errors say of the database: no password.
    pub shown: String,
    idle: Mutex<Vec<Conn>>,
}

/// How many idle connections the pool keeps.
const POOL_IDLE: usize = 8;

impl Pg {
    /// Parses `url` (`postgres://user@host:port/db`, `?host=/socket/dir` for a Unix socket)
    /// and connects once, so a wrong URL or a database that is down is said at start.
    pub fn connect(url: &str) -> Result<Arc<Pg>, StoreError> {
        let config: postgres::Config = url.parse().map_err(|e: postgres::Error| {
            StoreError::Config(format!(
                "the store's URL is not a PostgreSQL URL ({e}); write it as postgres://USER@HOST:PORT/DATABASE"
            ))
        })?;
        let pg = Arc::new(Pg {
            shown: shown(&config),
            config,
            idle: Mutex::new(Vec::new()),
        });
        let c = pg.conn()?;
        pg.put_back(c);
        Ok(pg)
    }

    /// A new connection of its own (the writer's, a listener's).
    pub fn conn(&self) -> Result<Conn, StoreError> {
        let client = self.config.connect(NoTls).map_err(|e| {
            StoreError::Unreachable(format!(
                "cannot connect to PostgreSQL at {}: {e}",
                self.shown
            ))
        })?;
        Ok(Conn {
            client,
            stmts: HashMap::new(),
        })
    }

    /// An idle pooled connection, or a new one.
    pub fn take(&self) -> Result<Conn, StoreError> {
        let idle = self.idle.lock().ok().and_then(|mut v| v.pop());
        match idle {
            Some(c) if !c.client.is_closed() => Ok(c),
            _ => self.conn(),
        }
    }

    /// Returns `c` to the pool (dropped if the pool is full or it is closed).
    pub fn put_back(&self, c: Conn) {
        if c.client.is_closed() {
            return;
        }
        if let Ok(mut v) = self.idle.lock()
            && v.len() < POOL_IDLE
        {
            v.push(c);
        }
    }
}

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
        let conn: snap::Shared = Arc::new(Mutex::new(self.take()?));
        let lock = snap::lock;
        lock(&conn)?.simple(begin)?;
        let snap = snap::snapshot(&conn, registry);
        let mut cur = Overlay::new(registry.len());
        let r = outside_writer(registry, &snap, &mut cur, ctx, |t| f(t, ()));
        drop(snap);
        let end = {
            let mut c = lock(&conn)?;
            match &r {
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

impl Drop for Pg {
    fn drop(&mut self) {
        // A blocking client closes on a runtime of its own, which may not run on a thread
        // of the hub's runtime (where the last handle may be dropped).
        let idle = std::mem::take(self.idle.get_mut().unwrap_or_else(|e| e.into_inner()));
        if !idle.is_empty() {
            let _ = std::thread::Builder::new()
                .name("store-pg-close".into())
                .spawn(move || drop(idle));
        }
    }
}

/// `config` as `postgres://USER@HOST:PORT/DB`, without its password.
fn shown(config: &postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            postgres::config::Host::Tcp(h) => h.clone(),
            postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "postgres://{}@{host}:{port}/{}",
        config.get_user().unwrap_or(""),
        config.get_dbname().unwrap_or("")
    )
}

/// A table's name in the store's schema, quoted.
pub fn qualified(name: &str) -> String {
    format!("\"{SCHEMA}\".\"{name}\"")
}
