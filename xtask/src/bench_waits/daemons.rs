//! The release hub and agent of the waits bench. Each writes timing records (JSON lines,
//! `CORTEX_TIMING_FILE`, see `cortex_host::timing`) to a file the bench names: the
//! agent's `remote_wait_ended` when its loop reported a wait's outcome, the hub's
//! `remote_wait_received` (the moment its link read the `WaitDone` frame) and
//! `remote_wait_recorded` (the moment the record holding the outcome was durable). Their
//! `us` (microseconds, the machine's realtime clock) are the bench's measuring points; no
//! log line is read for them, so rewording a log message changes no figure.
//!
//! Each daemon's stderr goes to a file in the scratch directory too (its start line and,
//! on a failure, its last lines). Both files are read only when the bench asks (after a
//! run): a thread reading a pipe would wake in the middle of the very path being timed.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::Value;

use crate::bench_kit::procs::{Procs, poll};
use crate::bench_kit::request;

/// The agent's record: its loop reported the wait's outcome.
pub const AGENT_ENDED: &str = "remote_wait_ended";
/// The hub's record: its link read the `WaitDone` frame.
pub const HUB_RECEIVED: &str = "remote_wait_received";
/// The hub's record: the outcome's record is durable.
pub const HUB_RECORDED: &str = "remote_wait_recorded";

/// A file a daemon appends to, read as far as it was written each time the bench asks,
/// whole lines only.
struct Tail {
    path: PathBuf,
    /// Bytes read so far.
    offset: u64,
    /// A line not yet ended by a newline.
    partial: String,
}

impl Tail {
    fn new(path: PathBuf) -> Self {
        Tail {
            path,
            offset: 0,
            partial: String::new(),
        }
    }

    /// The whole lines appended since the last call (none while the file does not exist).
    fn lines(&mut self) -> anyhow::Result<Vec<String>> {
        let mut f = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("opening {}", self.path.display())),
        };
        f.seek(SeekFrom::Start(self.offset))
            .with_context(|| format!("reading {}", self.path.display()))?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)
            .with_context(|| format!("reading {}", self.path.display()))?;
        self.offset += bytes.len() as u64;
        let mut pending = std::mem::take(&mut self.partial);
        pending.push_str(&String::from_utf8_lossy(&bytes));
        let (whole, rest) = match pending.rfind('\n') {
            Some(i) => (&pending[..i], &pending[i + 1..]),
            None => ("", pending.as_str()),
        };
        self.partial = rest.to_string();
        Ok(whole.lines().map(String::from).collect())
    }
}

/// A daemon's log file (its stderr): its start line and its last lines.
pub struct Log {
    state: Mutex<LogState>,
}

struct LogState {
    file: Tail,
    /// The first line holding the start marker.
    start_line: Option<String>,
    /// The last 20 lines.
    tail: VecDeque<String>,
}

impl Log {
    /// A new, empty file at `path`; the file handle is the daemon's stderr.
    fn create(path: PathBuf) -> anyhow::Result<(Log, File)> {
        let f = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let state = LogState {
            file: Tail::new(path),
            start_line: None,
            tail: VecDeque::new(),
        };
        Ok((
            Log {
                state: Mutex::new(state),
            },
            f,
        ))
    }

    /// Reads what was appended since the last call, line by line.
    fn refresh(&self, start_marker: &str) -> anyhow::Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for line in st.file.lines()? {
            if st.start_line.is_none() && line.contains(start_marker) {
                st.start_line = Some(line.clone());
            }
            if st.tail.len() >= 20 {
                st.tail.pop_front();
            }
            st.tail.push_back(line);
        }
        Ok(())
    }

    fn start_line(&self, marker: &str) -> anyhow::Result<Option<String>> {
        self.refresh(marker)?;
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        Ok(st.start_line.clone())
    }

    /// The last lines read (after reading what is new).
    pub fn tail(&self) -> String {
        let _ = self.refresh("\u{0}");
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

/// A daemon's timing records (`CORTEX_TIMING_FILE`).
pub struct Timing {
    state: Mutex<TimingState>,
}

struct TimingState {
    file: Tail,
    /// (event, waitpoint id) → ns since the epoch.
    at: HashMap<(String, String), i128>,
}

impl Timing {
    fn new(path: PathBuf) -> Self {
        Timing {
            state: Mutex::new(TimingState {
                file: Tail::new(path),
                at: HashMap::new(),
            }),
        }
    }

    /// The path the daemon is told to write to.
    fn path(&self) -> PathBuf {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.file.path.clone()
    }

    /// When the daemon recorded `event` for `wp`, in ns since the epoch (once: the entry
    /// is removed).
    pub fn take(&self, event: &str, wp: &str) -> anyhow::Result<Option<i128>> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for line in st.file.lines()? {
            if let Some((event, wait, ns)) = crate::bench_kit::timing_record(&line) {
                st.at.insert((event, wait), ns);
            }
        }
        Ok(st.at.remove(&(event.to_string(), wp.to_string())))
    }
}

/// The realtime clock now, ns since the epoch (what the log timestamps read).
pub fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

fn clean_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("CORTEX_") {
            cmd.env_remove(k);
        }
    }
    cmd.env_remove("NOTIFY_SOCKET")
        .env_remove("CREDENTIALS_DIRECTORY")
        .env_remove("WATCHDOG_USEC");
}

/// A running hub with the mesh on loopback.
pub struct Hub {
    pub addr: SocketAddr,
    pub mesh_url: String,
    pub index: usize,
    pub pid: u32,
    pub log: Log,
    pub timing: Timing,
    token: String,
}

impl Hub {
    /// Starts the hub with its home at `home` and its log in `home`'s parent.
    pub fn start(bin: &Path, home: &Path, procs: &mut Procs) -> anyhow::Result<Hub> {
        let token = format!("bench-{:x}", now_ns());
        let (log, stderr) = Log::create(home.with_extension("log"))?;
        let timing = Timing::new(home.with_extension("timing.jsonl"));
        let mut cmd = Command::new(bin);
        cmd.arg("--home")
            .arg(home)
            .args(["--listen", "127.0.0.1:0", "--mesh-listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        clean_env(&mut cmd);
        // The remote waits' info lines stay on, as on a hub run with the defaults.
        cmd.env("CORTEX_WEBHOOK_TOKEN", &token)
            .env("CORTEX_TIMING_FILE", timing.path())
            .env("RUST_LOG", "warn,cortex_hub::mesh::waits=info");
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id();
        let index = procs.add("cortex-hub", child);
        let line = poll(Duration::from_secs(20), "the hub's start line", || {
            procs
                .check_alive(index)
                .with_context(|| format!("cortex-hub said:\n{}", log.tail()))?;
            log.start_line("listening on http://")
        })
        .with_context(|| format!("cortex-hub said:\n{}", log.tail()))?;
        let (addr, mesh_url) = crate::bench_kit::hub::start_line(&line)?;
        let mesh_url = mesh_url.context("the hub's start line names no mesh URL")?;
        let hub = Hub {
            addr,
            mesh_url,
            index,
            pid,
            log,
            timing,
            token,
        };
        poll(Duration::from_secs(10), "the hub's /healthz", || {
            procs.check_alive(index)?;
            Ok(request(addr, "GET", "/healthz", None, None)
                .ok()
                .filter(|r| r.status == 200))
        })?;
        Ok(hub)
    }

    pub fn log_tail(&self) -> String {
        self.log.tail()
    }

    /// The operator token (the bench's own, made up at start).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// One API call that must answer `want`; the JSON body.
    pub fn api(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        want: u16,
    ) -> anyhow::Result<Value> {
        let bytes = body.map(|b| b.to_string().into_bytes());
        request(self.addr, method, path, Some(&self.token), bytes.as_deref())?
            .expect(want, &format!("{method} {path}"))
    }

    /// Enrols `name`; its token.
    pub fn add_device(&self, name: &str) -> anyhow::Result<String> {
        let v = self.api(
            "POST",
            "/api/devices",
            Some(serde_json::json!({"name": name})),
            201,
        )?;
        Ok(v["token"].as_str().context("no token")?.to_string())
    }
}

/// A running agent.
pub struct Agent {
    pub index: usize,
    pub pid: u32,
    pub log: Log,
    pub timing: Timing,
}

impl Agent {
    /// Enrols `name` and starts its agent with a home under `dir`; waits until online.
    pub fn start(
        bin: &Path,
        hub: &Hub,
        name: &str,
        dir: &Path,
        procs: &mut Procs,
    ) -> anyhow::Result<Agent> {
        let token = hub.add_device(name)?;
        let token_file = dir.join("device-token");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&token_file)
            .with_context(|| format!("creating {}", token_file.display()))?;
        writeln!(f, "{token}").with_context(|| format!("writing {}", token_file.display()))?;
        let (log, stderr) = Log::create(dir.join("agent.log"))?;
        let timing = Timing::new(dir.join("agent-timing.jsonl"));
        let mut cmd = Command::new(bin);
        cmd.args(["--hub", &hub.mesh_url, "--name", name])
            .arg("--token-file")
            .arg(&token_file)
            .arg("--home")
            .arg(dir.join("agent-home"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        clean_env(&mut cmd);
        cmd.env("CORTEX_TIMING_FILE", timing.path())
            .env("RUST_LOG", "warn,cortex_device_agent::agent::waits=info");
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id();
        let index = procs.add("cortex-device-agent", child);
        let agent = Agent {
            index,
            pid,
            log,
            timing,
        };
        poll(Duration::from_secs(20), "the device online", || {
            procs
                .check_alive(index)
                .with_context(|| format!("the agent said:\n{}", agent.log_tail()))?;
            let v = hub.api("GET", &format!("/api/devices/{name}"), None, 200)?;
            Ok((v["state"] == "online").then_some(()))
        })?;
        Ok(agent)
    }

    pub fn log_tail(&self) -> String {
        self.log.tail()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_read_by_event_and_wait_once_each() {
        let path = std::env::temp_dir().join(format!(
            "xtask-timing-{}-{}.jsonl",
            std::process::id(),
            now_ns()
        ));
        let t = Timing::new(path.clone());
        assert_eq!(
            t.take(HUB_RECORDED, "wp_1").expect("read"),
            None,
            "no file yet"
        );
        let mut f = File::create(&path).expect("create");
        write!(
            f,
            "{{\"event\":\"remote_wait_recorded\",\"wait\":\"wp_1\",\"us\":1764483239123456}}\n{{\"event\":\"remote_wait_rec"
        )
        .expect("write");
        assert_eq!(
            t.take(HUB_RECORDED, "wp_1").expect("read"),
            Some(1_764_483_239_123_456_000)
        );
        assert_eq!(t.take(HUB_RECORDED, "wp_1").expect("read"), None, "once");
        // The rest of a line written in two parts.
        writeln!(f, "eived\",\"wait\":\"wp_2\",\"us\":7}}").expect("write");
        assert_eq!(t.take(HUB_RECEIVED, "wp_2").expect("read"), Some(7_000));
        assert_eq!(crate::bench_kit::timing_record("not json"), None);
        assert_eq!(
            crate::bench_kit::timing_record("{\"event\":\"x\",\"us\":1}"),
            None,
            "no wait"
        );
        let _ = std::fs::remove_file(&path);
    }
}
