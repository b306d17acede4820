//! The release `cortex-device-agent` under test, in the bench's process guard, with its
//! own home and its token in a 0600 file, started the way its install line says
//! (`--hub URL --name NAME --token-file FILE`).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;

use super::hub::Hub;
use super::procs::{LogTail, Procs, poll};

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
        Agent::start_with(bin, hub, name, dir, &[], procs)
    }

    /// [`Agent::start`] with more flags (`--allow-exec`, …).
    pub fn start_with(
        bin: &Path,
        hub: &Hub,
        name: &str,
        dir: &Path,
        extra: &[&str],
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
            .args(extra)
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
