//! A real `cortex-device-agent` for the whole-system tests: its own temp home, its token
//! in a file, logging to a file beside the home; SIGKILL, SIGTERM and start again on the
//! same home (so its spool and its saved remote waits survive).

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::{Hub, bin, wait_until};

/// A running (or stopped) agent.
pub struct Agent {
    pub home: PathBuf,
    _tmp: tempfile::TempDir,
    child: Option<Child>,
    pub name: String,
    /// The `--hub` flags, in order (none: the agent takes `CORTEX_HUB_URL` from `env`).
    hub_urls: Vec<String>,
    token_file: PathBuf,
    /// Extra environment, set after the defaults (so `RUST_LOG` here wins over `info`).
    env: Vec<(String, String)>,
}

impl Agent {
    /// Starts an agent for device `name` of `hub`.
    pub fn start(hub: &Hub, name: &str, token: &str) -> Agent {
        let mut a = Agent::new(hub, name, token);
        a.spawn();
        a
    }

    /// An agent ready to start, not started (a device that is offline when asked).
    pub fn new(hub: &Hub, name: &str, token: &str) -> Agent {
        Agent::new_at(hub, name, token, None)
    }

    /// Like [`Agent::new`], with the home at `home` when given (its log and token file
    /// stay in a temp dir of their own).
    pub fn new_at(hub: &Hub, name: &str, token: &str, home: Option<&std::path::Path>) -> Agent {
        let tmp = tempfile::tempdir().expect("tmp");
        let home = home.map_or_else(|| tmp.path().join("home"), |h| h.to_path_buf());
        let token_file = tmp.path().join("device-token");
        std::fs::write(&token_file, format!("{token}\n")).expect("token file");
        Agent {
            home,
            _tmp: tmp,
            child: None,
            name: name.to_string(),
            hub_urls: vec![hub.mesh_url.clone()],
            token_file,
            env: Vec::new(),
        }
    }

    /// Replaces the token in its token file, as a re-enrolment does (written to a temp file
    /// and renamed over it, as an installer would).
    pub fn write_token(&self, token: &str) {
        let tmp = self.token_file.with_extension("new");
        std::fs::write(&tmp, format!("{token}\n")).expect("new token file");
        std::fs::rename(&tmp, &self.token_file).expect("token file replaced");
    }

    /// Dials `url` instead of the hub's printed mesh URL at every later start.
    pub fn set_hub_url(&mut self, url: &str) {
        self.set_hub_urls(&[url]);
    }

    /// Passes `--hub` once for each of `urls`, in order, at every later start (several
    /// hubs); none leaves the hubs to `CORTEX_HUB_URL` (set it with [`Agent::set_env`]).
    pub fn set_hub_urls(&mut self, urls: &[&str]) {
        self.hub_urls = urls.iter().map(|u| u.to_string()).collect();
    }

    /// Starts an agent for device `name` of `hub` that is given `urls` as its hubs
    /// (`--hub` once each, in order) instead of `hub`'s mesh URL.
    pub fn start_with_hubs(hub: &Hub, urls: &[&str], name: &str, token: &str) -> Agent {
        let mut a = Agent::new(hub, name, token);
        a.set_hub_urls(urls);
        a.spawn();
        a
    }

    /// Sets `key=value` in the environment of every later start (e.g. `RUST_LOG`).
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.push((key.to_string(), value.to_string()));
    }

    fn log_path(&self) -> PathBuf {
        self._tmp.path().join("agent.log")
    }

    /// Starts the process (again) on the same home.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "the agent is already running");
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("log");
        let child = self
            .command()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn cortex-device-agent");
        self.child = Some(child);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The command line [`Agent::spawn`] runs, for a test that runs it itself.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(bin("cortex-device-agent"));
        for url in &self.hub_urls {
            cmd.args(["--hub", url]);
        }
        cmd.args(["--name", &self.name])
            .env_remove("CORTEX_HUB_URL")
            .arg("--token-file")
            .arg(&self.token_file)
            .arg("--home")
            .arg(&self.home)
            .env_remove("CORTEX_DEVICE_TOKEN")
            .env_remove("CREDENTIALS_DIRECTORY")
            .env_remove("NOTIFY_SOCKET")
            .env("RUST_LOG", "info");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL: nothing saved on the way out.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then waits (bounded) for the exit status.
    pub fn stop(&mut self) -> ExitStatus {
        let mut c = self.child.take().expect("running");
        let pid = rustix::process::Pid::from_raw(c.id() as i32).expect("pid");
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
        wait_until(Duration::from_secs(20), "the agent to exit", || {
            c.try_wait().ok().flatten()
        })
    }

    /// Its spool directory.
    pub fn spool(&self) -> PathBuf {
        self.home.join("tmp/signals")
    }

    /// Signal files waiting in its spool.
    pub fn pending(&self) -> usize {
        std::fs::read_dir(self.spool())
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
                    .count()
            })
            .unwrap_or(0)
    }

    /// Peak resident memory in KiB (`VmHWM` in /proc).
    pub fn peak_rss_kib(&self) -> u64 {
        let pid = self.pid().expect("running");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM")
    }

    /// `$HOME/agent/waits.json`: the remote waits it saved (`Null` when there is none).
    pub fn saved_waits(&self) -> Value {
        std::fs::read(self.home.join("agent/waits.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}
