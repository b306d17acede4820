//! A throwaway PostgreSQL for the tests: Debian's server (`/usr/lib/postgresql/N/bin`, the
//! newest N, or `$CORTEX_PG_BIN`), a cluster made by `initdb` in a temp dir, its socket in
//! that dir, listening on a free loopback port, `fsync` and `synchronous_commit` on (as a
//! real deployment runs), stopped and removed when dropped or when the test process ends.
//! A test takes a database of its own ([`Postgres::database`]), on its own cluster
//! ([`Postgres::start`]) or the binary's ([`Postgres::shared`]).
//!
//! `initdb` refuses root: run as root (CI), the cluster belongs to the `postgres` user and
//! every server program runs as it; otherwise as the caller.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long a fresh cluster may take to accept connections.
const START_LIMIT: Duration = Duration::from_secs(60);

/// The server runs under this keeper, which stops it with the fast shutdown (SIGINT) once
/// its stdin closes: when the [`Postgres`] is dropped, or when the test process ends however
/// it ends (the kernel closes its end of the pipe). Once the server is gone, for that or any
/// reason, the keeper removes the cluster's directory and exits; the log's goes when stdin
/// closes, so a server that would not start can still be explained. So no test leaves a
/// server or a directory behind. (An asynchronous list's stdin is `/dev/null`, hence the
/// pipe kept as fd 3.)
const KEEPER: &str = r#"exec 3<&0
"$@" & pid=$!
{ read -r _ <&3; kill -INT "$pid" 2>/dev/null; rm -rf "$LOG_DIR"; } &
wait "$pid"
rm -rf "$CLUSTER_DIR""#;

/// A running cluster; see the module docs.
pub struct Postgres {
    bin: PathBuf,
    /// Holds the data directory (`data/`) and the socket.
    dir: tempfile::TempDir,
    /// Holds the server's log (`server.log`).
    logs: tempfile::TempDir,
    port: u16,
    /// The server's owner when the tests run as root.
    owner: Option<(u32, u32)>,
    server: Child,
}

impl Postgres {
    /// Makes and starts a cluster; panics with the server's log when it does not start.
    pub fn start() -> Postgres {
        let bin = server_bin();
        let owner = if rustix::process::geteuid().is_root() {
            Some(user_ids("postgres"))
        } else {
            None
        };
        let dir = tempfile::Builder::new()
            .prefix("cortex-pg-")
            .tempdir()
            .expect("a temp dir for the cluster");
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown the dir");
        }
        let data = dir.path().join("data");
        let out = as_owner(Command::new(bin.join("initdb")), owner)
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-instructions",
                "-D",
            ])
            .arg(&data)
            .output()
            .expect("run initdb");
        assert!(out.status.success(), "initdb: {}", text(&out));
        let port = free_port();
        // Beside the cluster, not in it: the keeper removes the cluster when the server
        // ends, and a server that would not start is explained by its log.
        let logs = tempfile::Builder::new()
            .prefix("cortex-pg-log-")
            .tempdir()
            .expect("a temp dir for the log");
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(logs.path(), Some(uid), Some(gid)).expect("chown the log dir");
        }
        let log = std::fs::File::create(logs.path().join("server.log")).expect("the server log");
        let server = as_owner(Command::new("/bin/sh"), owner)
            .args(["-c", KEEPER, "keeper"])
            .arg(bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(dir.path())
            .args(["-p", &port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=on", "-c", "synchronous_commit=on"])
            .env("CLUSTER_DIR", dir.path())
            .env("LOG_DIR", logs.path())
            .stdin(Stdio::piped())
            .stdout(log.try_clone().expect("the log again"))
            .stderr(log)
            .spawn()
            .expect("start postgres");
        let mut pg = Postgres {
            bin,
            dir,
            logs,
            port,
            owner,
            server,
        };
        pg.wait_ready();
        pg
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory of its socket (`host=` for a client that takes a socket).
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// A connection URL for database `db` over TCP.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates database `name` (a test's own).
    pub fn create_database(&self, name: &str) {
        let out = self.psql("postgres", &format!("CREATE DATABASE \"{name}\""));
        assert!(
            out.status.success(),
            "create database {name}: {}",
            text(&out)
        );
    }

    /// Runs `sql` in database `db` through `psql` (unaligned, tuples only, stop on error).
    pub fn psql(&self, db: &str, sql: &str) -> Output {
        as_owner(Command::new(self.bin.join("psql")), self.owner)
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(self.dir.path())
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                db,
                "-c",
                sql,
            ])
            .output()
            .expect("run psql")
    }

    /// `sql`'s output in database `db`, trimmed; panics when it fails.
    pub fn query(&self, db: &str, sql: &str) -> String {
        let out = self.psql(db, sql);
        assert!(out.status.success(), "{sql}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A client tool of the server's (`psql`, `pgbench`) aimed at it over loopback TCP as
    /// `postgres`, run as the cluster's owner.
    pub fn tool(&self, name: &str) -> Command {
        let mut c = as_owner(Command::new(self.bin.join(name)), self.owner);
        c.args([
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
        ]);
        c
    }

    /// A new directory beside the cluster that its owner may write (a tool's logs).
    pub fn owned_dir(&self, name: &str) -> PathBuf {
        let d = self.dir.path().join(name);
        std::fs::create_dir_all(&d).expect("a directory beside the cluster");
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(&d, Some(uid), Some(gid)).expect("chown it");
        }
        d
    }

    /// The server's process id (the postmaster's, from `postmaster.pid`).
    pub fn pid(&self) -> u32 {
        let file = self.dir.path().join("data").join("postmaster.pid");
        std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| t.lines().next().and_then(|l| l.trim().parse().ok()))
            .unwrap_or_else(|| panic!("no pid in {}", file.display()))
    }

    /// Crashes the server and waits for it to come back: a backend SIGKILLed makes the
    /// postmaster end every connection, reinitialize and replay its WAL (crash recovery),
    /// as after a power cut, and then accept connections again. Returns when it does.
    pub fn crash_restart(&mut self) {
        let victim = self.query(
            "postgres",
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'",
        );
        let pid = victim
            .trim()
            .parse::<i32>()
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .unwrap_or_else(|| panic!("no checkpointer pid in {victim:?}"));
        rustix::process::kill_process(pid, rustix::process::Signal::KILL)
            .expect("SIGKILL the checkpointer");
        // Down first (the postmaster notices at once), then up again.
        let start = Instant::now();
        while self.ready() && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.wait_ready();
    }

    /// One cluster for the whole test binary, started on first use; its keeper stops and
    /// removes it when the binary exits.
    pub fn shared() -> &'static Postgres {
        static SHARED: std::sync::OnceLock<Postgres> = std::sync::OnceLock::new();
        SHARED.get_or_init(Postgres::start)
    }

    /// A new database of its own for one test (`test_1`, `test_2`, …), its name returned.
    pub fn database(&self) -> String {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("test_{n}");
        self.create_database(&name);
        name
    }

    fn wait_ready(&mut self) {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.server.try_wait() {
                panic!(
                    "postgres exited ({status}) before it was ready: {}",
                    self.log()
                );
            }
            if self.ready() {
                return;
            }
            assert!(
                start.elapsed() < START_LIMIT,
                "postgres not ready after {START_LIMIT:?}: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the server accepts connections now.
    fn ready(&self) -> bool {
        as_owner(Command::new(self.bin.join("pg_isready")), self.owner)
            .arg("-h")
            .arg(self.dir.path())
            .args(["-p", &self.port.to_string(), "-q"])
            .status()
            .is_ok_and(|s| s.success())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.logs.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // Closing the keeper's stdin stops the server (see `KEEPER`); then wait for it.
        drop(self.server.stdin.take());
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.server.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// Debian's newest server binaries, or `$CORTEX_PG_BIN`.
fn server_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("CORTEX_PG_BIN") {
        return PathBuf::from(p);
    }
    let root = Path::new("/usr/lib/postgresql");
    let newest = std::fs::read_dir(root)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").exists())
        .max_by_key(|(v, _)| *v);
    match newest {
        Some((_, bin)) => bin,
        None => panic!(
            "no PostgreSQL server under {}: apt-get install postgresql (or set CORTEX_PG_BIN)",
            root.display()
        ),
    }
}

/// `user`'s uid and gid, from `id`.
fn user_ids(user: &str) -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, user])
            .output()
            .expect("run id");
        assert!(out.status.success(), "no user {user}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a numeric id")
    };
    (id("-u"), id("-g"))
}

/// `cmd` run as the cluster's owner (when the tests run as root).
fn as_owner(mut cmd: Command, owner: Option<(u32, u32)>) -> Command {
    if let Some((uid, gid)) = owner {
        cmd.uid(uid).gid(gid);
    }
    // A directory every user may enter (initdb and postgres look at their working one).
    cmd.current_dir("/");
    cmd
}

/// A loopback port nobody listens on now.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    l.local_addr().expect("its address").port()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
