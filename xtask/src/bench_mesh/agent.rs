//! The release `cortex-device-agent` under test, and `inotifywait -m` beside it: each in
//! the bench's process guard, the agent with its own home and its token in a 0600 file,
//! started the way its install line says (`--hub URL --name NAME --token-file FILE`).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;

use crate::bench_kit::hub::Hub;
use crate::bench_kit::procs::{LogTail, Procs, poll};

/// A running agent.
pub struct Agent {
    pub index: usize,
    pub pid: u32,
    pub spool: PathBuf,
    log: LogTail,
}

impl Agent {
    /// Enrols `name` on `hub`, starts the agent with a home under `dir`, and waits until
    /// the hub lists the device online and the spool directory exists.
    pub fn start(
        bin: &Path,
        hub: &Hub,
        name: &str,
        dir: &Path,
        procs: &mut Procs,
    ) -> anyhow::Result<Agent> {
        let url = hub.mesh_url.as_deref().context("the hub's mesh is off")?;
        let token = hub.add_device(name)?;
        let token_file = dir.join("device-token");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&token_file)
            .with_context(|| format!("creating {}", token_file.display()))?;
        writeln!(f, "{token}").with_context(|| format!("writing {}", token_file.display()))?;
        let home = dir.join("agent-home");
        let mut cmd = Command::new(bin);
        cmd.args(["--hub", url, "--name", name])
            .arg("--token-file")
            .arg(&token_file)
            .arg("--home")
            .arg(&home)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("CORTEX_") {
                cmd.env_remove(k);
            }
        }
        // Not under systemd: no notify socket, no credentials, no watchdog.
        cmd.env_remove("NOTIFY_SOCKET")
            .env_remove("CREDENTIALS_DIRECTORY")
            .env_remove("WATCHDOG_USEC")
            .env("RUST_LOG", "warn");
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id();
        let stderr = child.stderr.take().context("the agent's stderr")?;
        let index = procs.add("cortex-device-agent", child);
        let (log, _) = LogTail::drain(stderr, "\u{0}");
        let agent = Agent {
            index,
            pid,
            spool: home.join("tmp").join("signals"),
            log,
        };
        poll(Duration::from_secs(20), "the device online", || {
            procs
                .check_alive(index)
                .with_context(|| format!("the agent said:\n{}", agent.log.text()))?;
            let v = hub.api_json("GET", &format!("/api/devices/{name}"), None, 200)?;
            Ok((v["state"] == "online" && agent.spool.is_dir()).then_some(()))
        })
        .with_context(|| format!("the agent said:\n{}", agent.log.text()))?;
        Ok(agent)
    }

    /// The agent's last log lines, for an error message.
    pub fn log_tail(&self) -> String {
        self.log.text()
    }
}

/// What the idle part compares the agent with, and how to get it.
pub const INOTIFYWAIT: &str = "inotifywait";
pub const INSTALL: &str = "apt-get update && apt-get install -y inotify-tools";

/// Starts `inotifywait -m -q -e close_write,moved_to DIR` (the smallest watcher that
/// would see a shell drop: the `.tmp` written, then renamed) and waits until its watch is set up.
pub fn start_inotifywait(dir: &Path, procs: &mut Procs) -> anyhow::Result<(usize, u32)> {
    let mut child = Command::new(INOTIFYWAIT)
        .args(["-m", "-e", "close_write,moved_to"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting inotifywait")?;
    let pid = child.id();
    let stderr = child.stderr.take().context("inotifywait's stderr")?;
    let index = procs.add("inotifywait", child);
    // It says "Watches established." on stderr once it watches.
    let (log, rx) = LogTail::drain(stderr, "Watches established");
    if rx.recv_timeout(Duration::from_secs(10)).is_err() {
        procs.check_alive(index)?;
        anyhow::bail!(
            "inotifywait did not establish its watch within 10 s: {}",
            log.text()
        );
    }
    Ok((index, pid))
}
