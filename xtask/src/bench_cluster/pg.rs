//! A throwaway PostgreSQL cluster for the bench: Debian's server, initdb'd in the scratch
//! directory (as the `postgres` user when run as root), durable settings (fsync and
//! synchronous_commit on), loopback only on a free port; killed with the bench's other
//! processes.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use anyhow::{Context, bail, ensure};

use crate::bench_kit::procs::{Procs, free_port, poll};

pub struct Cluster {
    pub bin: PathBuf,
    pub dir: PathBuf,
    pub port: u16,
    pub index: usize,
    owner: Option<(u32, u32)>,
}

impl Cluster {
    /// Makes a cluster under `scratch/pg` and starts it.
    pub fn start(scratch: &Path, procs: &mut Procs) -> anyhow::Result<Cluster> {
        let bin = server_bin()?;
        let owner = if rustix::process::geteuid().is_root() {
            Some((id("-u")?, id("-g")?))
        } else {
            None
        };
        let dir = scratch.join("pg");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        if let Some((uid, gid)) = owner {
            // The server's owner walks into the scratch directory and owns its own.
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).context("chown the cluster")?;
            let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
            std::fs::set_permissions(scratch, mode).context("open the scratch directory")?;
        }
        let data = dir.join("data");
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
            .context("running initdb")?;
        ensure!(out.status.success(), "initdb failed: {}", text(&out));
        let port = free_port()?;
        let log = std::fs::File::create(dir.join("server.log")).context("the server's log")?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir.join("server.log"), Some(uid), Some(gid))?;
        }
        let child = as_owner(Command::new(bin.join("postgres")), owner)
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(&dir)
            .args(["-p", &port.to_string()])
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "max_connections=200",
            ])
            .args(["-c", "fsync=on", "-c", "synchronous_commit=on"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting postgres")?;
        let index = procs.add("postgres", child);
        let c = Cluster {
            bin,
            dir,
            port,
            index,
            owner,
        };
        poll(
            Duration::from_secs(30),
            "postgres to accept connections",
            || {
                procs.check_alive(index)?;
                let ready = as_owner(Command::new(c.bin.join("pg_isready")), c.owner)
                    .arg("-h")
                    .arg(&c.dir)
                    .args(["-p", &c.port.to_string(), "-q"])
                    .status()?;
                Ok(ready.success().then_some(()))
            },
        )
        .with_context(|| std::fs::read_to_string(c.dir.join("server.log")).unwrap_or_default())?;
        Ok(c)
    }

    /// A URL for database `db` over loopback TCP.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Runs `sql` in `db` with psql; its output, trimmed.
    pub fn psql(&self, db: &str, sql: &str) -> anyhow::Result<String> {
        let out = self
            .tool("psql")
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                db,
                "-c",
                sql,
            ])
            .output()
            .context("running psql")?;
        ensure!(out.status.success(), "psql {sql:?}: {}", text(&out));
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// A client tool of the server's (`psql`, `pgbench`) aimed at the cluster over TCP,
    /// run as its owner.
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

    /// The bytes the database `db` takes on disk.
    pub fn size(&self, db: &str) -> anyhow::Result<u64> {
        self.psql(db, "SELECT pg_database_size(current_database())")?
            .parse()
            .context("pg_database_size")
    }
}

fn server_bin() -> anyhow::Result<PathBuf> {
    if let Some(b) = std::env::var_os("CORTEX_PG_BIN") {
        return Ok(PathBuf::from(b));
    }
    let root = Path::new("/usr/lib/postgresql");
    let newest = std::fs::read_dir(root)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").exists())
        .max_by_key(|(v, _)| *v);
    match newest {
        Some((_, bin)) => Ok(bin),
        None => bail!(
            "no PostgreSQL server under {}: apt-get install postgresql (or set CORTEX_PG_BIN)",
            root.display()
        ),
    }
}

fn id(flag: &str) -> anyhow::Result<u32> {
    let out = Command::new("id").args([flag, "postgres"]).output()?;
    ensure!(out.status.success(), "no postgres user: {}", text(&out));
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .context("a numeric id")
}

fn as_owner(mut cmd: Command, owner: Option<(u32, u32)>) -> Command {
    if let Some((uid, gid)) = owner {
        cmd.uid(uid).gid(gid);
    }
    cmd.current_dir("/");
    cmd
}

pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
