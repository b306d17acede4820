//! Connections to the store's database: where it is ([`Pg`], shown without its password),
//! a small pool, and the statements each connection prepared once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use postgres::fallible_iterator::FallibleIterator;
use postgres::{Client, NoTls, Statement};

use crate::store::kernel::error::StoreError;

/// The schema every table of the store lives in.
pub const SCHEMA: &str = "cortex";

/// A connection and the statements prepared on it. Every statement goes through it, so
/// it knows when one failed since the transaction began: PostgreSQL then answers the
/// transaction's `COMMIT` with a rollback and no error, and the writer must not take
/// that for a commit.
pub struct Conn {
    client: Client,
    stmts: HashMap<String, Statement>,
    /// A statement failed since the last `BEGIN`.
    failed: bool,
    /// The server ended this session (SQLSTATE class 57: an administrator, a shutdown),
    /// possibly before the socket closed.
    ended: bool,
}

impl Conn {
    fn new(client: Client) -> Conn {
        Conn {
            client,
            stmts: HashMap::new(),
            failed: false,
            ended: false,
        }
    }

    fn seen<T>(&mut self, r: Result<T, postgres::Error>) -> Result<T, StoreError> {
        r.map_err(|e| {
            self.failed = true;
            if e.code().is_some_and(|c| c.code().starts_with("57")) {
                self.ended = true;
            }
            StoreError::pg(e)
        })
    }

    /// `sql`, prepared once per connection.
    pub(crate) fn stmt(&mut self, sql: &str) -> Result<Statement, StoreError> {
        if let Some(s) = self.stmts.get(sql) {
            return Ok(s.clone());
        }
        let r = self.client.prepare(sql);
        let s = self.seen(r)?;
        self.stmts.insert(sql.to_string(), s.clone());
        Ok(s)
    }

    /// Statements without parameters (`BEGIN`, `COMMIT`, DDL); a `BEGIN` that succeeds
    /// starts with no failure seen.
    pub(crate) fn simple(&mut self, sql: &str) -> Result<(), StoreError> {
        let r = self.client.batch_execute(sql);
        self.seen(r)?;
        if sql.starts_with("BEGIN") {
            self.failed = false;
        }
        Ok(())
    }

    /// Statements without parameters, sent in one round trip, and the rows they return
    /// (as text, one `Vec` per row, in order); a batch that begins with `BEGIN` and
    /// succeeds starts with no failure seen.
    pub(crate) fn simple_rows(
        &mut self,
        sql: &str,
    ) -> Result<Vec<Vec<Option<String>>>, StoreError> {
        let r = self.client.simple_query(sql);
        let msgs = self.seen(r)?;
        if sql.starts_with("BEGIN") {
            self.failed = false;
        }
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                postgres::SimpleQueryMessage::Row(r) => {
                    Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
                }
                _ => None,
            })
            .collect())
    }

    /// Waits up to `timeout` for a notification on a channel this connection listens to;
    /// the payloads of those that came (those arriving together are taken together).
    pub(crate) fn notifications(
        &mut self,
        timeout: std::time::Duration,
    ) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        let r = (|| {
            let mut got = self.client.notifications();
            let Some(first) = got.timeout_iter(timeout).next()? else {
                return Ok(());
            };
            out.push(first.payload().to_string());
            // Whatever else already arrived, without waiting again.
            let mut more = got.iter();
            while let Some(n) = more.next()? {
                out.push(n.payload().to_string());
            }
            Ok(())
        })();
        self.seen(r).map(|()| out)
    }

    /// Whether a statement failed since the last `BEGIN` (the transaction is aborted).
    pub(crate) fn failed(&self) -> bool {
        self.failed
    }

    /// Whether the connection is gone: closed, or ended by the server.
    pub(crate) fn is_closed(&self) -> bool {
        self.ended || self.client.is_closed()
    }

    /// Runs a statement on the client; its failure is noted (see [`Conn::failed`]).
    pub(crate) fn run<T>(
        &mut self,
        f: impl FnOnce(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, StoreError> {
        let r = f(&mut self.client);
        self.seen(r)
    }
}

/// Where the store's database is, and a pool of connections to it.
pub struct Pg {
    config: postgres::Config,
    /// This process among the hubs on the database: the batches it writes carry it, so
    /// it knows its own when it reads them back.
    pub me: i64,
    /// What the logs and errors say of the database: no password.
    pub shown: String,
    idle: Mutex<Vec<Conn>>,
    /// The key of this hub's session lock, once named ([`Pg::announce`]): held by the
    /// bus's connection while it lives, so it goes with the process (see `bus.rs`).
    alive: Mutex<Option<u32>>,
}

/// The advisory locks' first key for the hubs' session locks ("cort").
pub const ALIVE_LOCKS: i32 = 0x636f_7274;

/// How many idle connections the pool keeps.
const POOL_IDLE: usize = 16;

impl Pg {
    /// Parses `url` (`postgres://user@host:port/db`, `?host=/socket/dir` for a Unix socket)
    /// and connects once, so a wrong URL or a database that is down is said at start.
    pub fn connect(url: &str) -> Result<Arc<Pg>, StoreError> {
        let config: postgres::Config = url.parse().map_err(|e: postgres::Error| {
            StoreError::Config(format!(
                "the store's URL is not a PostgreSQL URL ({e}); write it as postgres://USER@HOST:PORT/DATABASE"
            ))
        })?;
        let me = getrandom::u64()
            .map_err(|e| StoreError::Config(format!("no randomness for the hub's id: {e}")))?;
        let pg = Arc::new(Pg {
            me: (me >> 1) as i64,
            shown: shown(&config),
            config,
            idle: Mutex::new(Vec::new()),
            alive: Mutex::new(None),
        });
        let c = pg.conn()?;
        pg.put_back(c);
        Ok(pg)
    }

    /// Names the key this hub's bus holds its session lock under.
    pub fn announce(&self, key: u32) {
        if let Ok(mut a) = self.alive.lock() {
            *a = Some(key);
        }
    }

    /// The key named by [`Pg::announce`], if any.
    pub fn alive_key(&self) -> Option<u32> {
        self.alive.lock().ok().and_then(|a| *a)
    }

    /// The keys of the hubs' session locks held now in this database: each is a hub
    /// whose bus is connected (a process that died has lost its lock with its connection).
    pub fn alive_keys(&self) -> Result<std::collections::HashSet<u32>, StoreError> {
        let mut c = self.take()?;
        let rows = c.simple_rows(&format!(
            "SELECT objid::int8::text FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND classid = {} AND objsubid = 2 \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            ALIVE_LOCKS as u32
        ));
        let out = rows.map(|rows| {
            rows.iter()
                .filter_map(|r| r.first()?.as_deref()?.parse::<u32>().ok())
                .collect()
        });
        self.put_back(c);
        out
    }

    /// A new connection of its own (the writer's, a listener's).
    pub fn conn(&self) -> Result<Conn, StoreError> {
        let client = self.config.connect(NoTls).map_err(|e| {
            StoreError::Unreachable(format!(
                "cannot connect to PostgreSQL at {}: {e}",
                self.shown
            ))
        })?;
        Ok(Conn::new(client))
    }

    /// An idle pooled connection, or a new one.
    pub fn take(&self) -> Result<Conn, StoreError> {
        let idle = self.idle.lock().ok().and_then(|mut v| v.pop());
        match idle {
            Some(c) if !c.is_closed() => Ok(c),
            _ => self.conn(),
        }
    }

    /// Returns `c` to the pool (dropped if the pool is full or it is closed).
    pub fn put_back(&self, c: Conn) {
        if c.is_closed() {
            return;
        }
        if let Ok(mut v) = self.idle.lock()
            && v.len() < POOL_IDLE
        {
            v.push(c);
        }
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
