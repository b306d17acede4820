//! The release hub and agent of the waits bench, each with every line of its log kept
//! where it names a remote wait ending: the hub logs `remote wait ended … wait=WP` right
//! after the commit holding the outcome returned, the agent logs it when the wait's task
//! reported. Their timestamps (RFC 3339, microseconds, the machine's realtime clock) are
//! two of the bench's measuring points.
//!
//! Each daemon's stderr goes to a file in the scratch directory, read only when the bench
//! asks (after a run): a thread reading a pipe line by line would wake at every log line,
//! on these two cores, in the middle of the very path being timed.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, ensure};
use serde_json::Value;

use crate::bench_kit::procs::{Procs, poll};
use crate::bench_kit::request;

/// The log lines timed: the agent's and the hub's end of a wait, the hub's receipt.
pub const MARKS: [&str; 2] = ["remote wait ended", "remote wait outcome received"];

/// A daemon's log file, read as far as it was written each time the bench asks.
pub struct Log {
    path: PathBuf,
    state: Mutex<LogState>,
}

#[derive(Default)]
struct LogState {
    /// Bytes read so far.
    offset: u64,
    /// A line not yet ended by a newline.
    partial: String,
    /// (what, waitpoint id) → ns since the epoch, for `what` in [`MARKS`].
    ends: HashMap<(&'static str, String), i128>,
    /// The first line holding the start marker.
    start_line: Option<String>,
    /// The last 20 lines.
    tail: VecDeque<String>,
}

impl Log {
    /// A new, empty file at `path`; the file handle is the daemon's stderr.
    fn create(path: PathBuf) -> anyhow::Result<(Log, File)> {
        let f = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok((
            Log {
                path,
                state: Mutex::new(LogState::default()),
            },
            f,
        ))
    }

    /// Reads what was appended since the last call, line by line.
    fn refresh(&self, start_marker: &str) -> anyhow::Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut f =
            File::open(&self.path).with_context(|| format!("opening {}", self.path.display()))?;
        f.seek(SeekFrom::Start(st.offset))
            .with_context(|| format!("reading {}", self.path.display()))?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)
            .with_context(|| format!("reading {}", self.path.display()))?;
        st.offset += bytes.len() as u64;
        let text = String::from_utf8_lossy(&bytes);
        let mut pending = std::mem::take(&mut st.partial);
        pending.push_str(&text);
        let (whole, rest) = match pending.rfind('\n') {
            Some(i) => (&pending[..i], &pending[i + 1..]),
            None => ("", pending.as_str()),
        };
        st.partial = rest.to_string();
        for line in whole.lines() {
            if st.start_line.is_none() && line.contains(start_marker) {
                st.start_line = Some(line.to_string());
            }
            if let Some(mark) = MARKS.iter().find(|m| line.contains(*m))
                && let (Some(ts), Some(wp)) = (mark_time(line), field(line, "wait="))
            {
                st.ends.insert((mark, wp.to_string()), ts);
            }
            if st.tail.len() >= 20 {
                st.tail.pop_front();
            }
            st.tail.push_back(line.to_string());
        }
        Ok(())
    }

    /// When the log said `what` for `wp` (once: the entry is removed).
    pub fn take(&self, what: &'static str, wp: &str) -> anyhow::Result<Option<i128>> {
        self.refresh("\u{0}")?;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        Ok(st.ends.remove(&(what, wp.to_string())))
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

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(key)? + key.len();
    line[at..].split_whitespace().next()
}

/// When a marked line says its event happened, in ns since the epoch: its `received_us=`
/// field if it has one (the hub writes its receipt line after handing the outcome on, with
/// the moment it arrived), else the line's own time.
fn mark_time(line: &str) -> Option<i128> {
    match field(line, "received_us=") {
        Some(us) => us.parse::<i128>().ok().map(|us| us * 1_000),
        None => line_time(line),
    }
}

/// The leading `2026-11-30T06:13:59.123456Z` of a log line, in ns since the epoch.
pub fn line_time(line: &str) -> Option<i128> {
    let ts = line.split_whitespace().next()?;
    let (date, time) = ts.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, dd) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<i64>());
    let (h, mi, s) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let digits: String = frac.chars().take(9).collect();
    let ns_frac: i128 = format!("{digits:0<9}").parse().ok()?;
    let days = days_from_civil(y, m, dd);
    let secs = i128::from(days) * 86_400 + i128::from(h * 3600 + mi * 60 + s);
    Some(secs * 1_000_000_000 + ns_frac)
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
    token: String,
}

impl Hub {
    /// Starts the hub with its home at `home` and its log in `home`'s parent.
    pub fn start(bin: &Path, home: &Path, procs: &mut Procs) -> anyhow::Result<Hub> {
        let token = format!("bench-{:x}", now_ns());
        let (log, stderr) = Log::create(home.with_extension("log"))?;
        let mut cmd = Command::new(bin);
        cmd.arg("--home")
            .arg(home)
            .args(["--listen", "127.0.0.1:0", "--mesh-listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        clean_env(&mut cmd);
        cmd.env("CORTEX_WEBHOOK_TOKEN", &token)
            .env("RUST_LOG", "warn,cortex_hub::mesh::waits=debug");
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
        let r = request(self.addr, method, path, Some(&self.token), bytes.as_deref())?;
        let what = format!("{method} {path}");
        ensure!(
            r.status == want,
            "{what}: HTTP {} (wanted {want}): {}",
            r.status,
            r.text()
        );
        r.json(&what)
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
        cmd.env("RUST_LOG", "warn,cortex_device_agent::agent::waits=info");
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id();
        let index = procs.add("cortex-device-agent", child);
        let agent = Agent { index, pid, log };
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
    fn log_times_parse_to_the_microsecond() {
        let t = line_time("2026-11-30T06:13:59.123456Z  INFO x: remote wait ended wait=wp_1")
            .expect("time");
        // 2026-11-30 is day 20,787 since the epoch.
        let want = (20_787i128 * 86_400 + 6 * 3600 + 13 * 60 + 59) * 1_000_000_000 + 123_456_000;
        assert_eq!(t, want);
        assert_eq!(field("a wait=wp_1 outcome=x", "wait="), Some("wp_1"));
        assert_eq!(line_time("garbage"), None);
    }

    #[test]
    fn a_receipt_line_is_timed_by_its_received_field() {
        let line = "2026-11-30T06:13:59.999999Z DEBUG x: remote wait outcome received device=d wait=wp_1 received_us=1764483239123456";
        assert_eq!(mark_time(line), Some(1_764_483_239_123_456_000));
        let plain = "2026-11-30T06:13:59.123456Z  INFO x: remote wait ended wait=wp_1";
        assert_eq!(mark_time(plain), line_time(plain));
        assert_eq!(
            mark_time("2026-11-30T06:13:59.1Z x received_us=soon"),
            None,
            "a field that is not a number times nothing"
        );
    }
}
