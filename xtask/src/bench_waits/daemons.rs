//! The release hub and agent of the waits bench, each with every line of its log kept
//! where it names a remote wait ending: the hub logs `remote wait ended … wait=WP` right
//! after the commit holding the outcome returned, the agent logs it when the wait's task
//! reported. Their timestamps (RFC 3339, microseconds, the machine's realtime clock) are
//! two of the bench's measuring points.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use serde_json::Value;

use crate::bench_kit::http;
use crate::bench_kit::procs::{Procs, poll};

/// What the log lines say happened to a remote wait, and when: (what, waitpoint id) →
/// ns since the epoch, for `what` in [`MARKS`].
#[derive(Clone, Default)]
pub struct Ends(Arc<Mutex<HashMap<(&'static str, String), i128>>>);

/// The log lines timed: the agent's and the hub's end of a wait, the hub's receipt.
pub const MARKS: [&str; 2] = ["remote wait ended", "remote wait outcome received"];

impl Ends {
    pub fn take(&self, what: &'static str, wp: &str) -> Option<i128> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(what, wp.to_string()))
    }
}

/// Reads `pipe` to its end on a thread: the first line holding `marker` goes to the
/// returned channel, every "remote wait ended" line into `ends`, the last 20 lines into
/// the tail.
fn drain(
    pipe: impl std::io::Read + Send + 'static,
    marker: &'static str,
) -> (Ends, Arc<Mutex<Vec<String>>>, mpsc::Receiver<String>) {
    let ends = Ends::default();
    let tail = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    let (e, t) = (ends.clone(), tail.clone());
    std::thread::spawn(move || {
        let mut first = Some(tx);
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if line.contains(marker)
                && let Some(tx) = first.take()
            {
                let _ = tx.send(line.clone());
            }
            if let Some(mark) = MARKS.iter().find(|m| line.contains(*m))
                && let (Some(ts), Some(wp)) = (line_time(&line), field(&line, "wait="))
            {
                e.0.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert((mark, wp.to_string()), ts);
            }
            let mut tail = t.lock().unwrap_or_else(|e| e.into_inner());
            if tail.len() >= 20 {
                tail.remove(0);
            }
            tail.push(line);
        }
    });
    (ends, tail, rx)
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(key)? + key.len();
    line[at..].split_whitespace().next()
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
    pub ends: Ends,
    token: String,
    tail: Arc<Mutex<Vec<String>>>,
}

impl Hub {
    pub fn start(bin: &Path, home: &Path, procs: &mut Procs) -> anyhow::Result<Hub> {
        let token = format!("bench-{:x}", now_ns());
        let mut cmd = Command::new(bin);
        cmd.arg("--home")
            .arg(home)
            .args(["--listen", "127.0.0.1:0", "--mesh-listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        clean_env(&mut cmd);
        cmd.env("CORTEX_WEBHOOK_TOKEN", &token)
            .env("RUST_LOG", "warn,cortex_hub::mesh::waits=debug");
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id();
        let stderr = child.stderr.take().context("the hub's stderr")?;
        let index = procs.add("cortex-hub", child);
        let (ends, tail, rx) = drain(stderr, "listening on http://");
        let Ok(line) = rx.recv_timeout(Duration::from_secs(20)) else {
            std::thread::sleep(Duration::from_millis(100));
            bail!(
                "cortex-hub printed no start line within 20 s; it said:\n{}",
                tail_text(&tail)
            );
        };
        let (addr, mesh_url) = crate::bench_kit::hub::start_line(&line)?;
        let mesh_url = mesh_url.context("the hub's start line names no mesh URL")?;
        let hub = Hub {
            addr,
            mesh_url,
            index,
            pid,
            ends,
            token,
            tail,
        };
        poll(Duration::from_secs(10), "the hub's /healthz", || {
            procs.check_alive(index)?;
            Ok(http::request(addr, "GET", "/healthz", None, None)
                .ok()
                .filter(|r| r.status == 200))
        })?;
        Ok(hub)
    }

    pub fn log_tail(&self) -> String {
        tail_text(&self.tail)
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
        let r = http::request(self.addr, method, path, Some(&self.token), bytes.as_deref())?;
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

fn tail_text(t: &Arc<Mutex<Vec<String>>>) -> String {
    t.lock().unwrap_or_else(|e| e.into_inner()).join("\n")
}

/// A running agent.
pub struct Agent {
    pub index: usize,
    pub pid: u32,
    pub ends: Ends,
    tail: Arc<Mutex<Vec<String>>>,
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
        let mut cmd = Command::new(bin);
        cmd.args(["--hub", &hub.mesh_url, "--name", name])
            .arg("--token-file")
            .arg(&token_file)
            .arg("--home")
            .arg(dir.join("agent-home"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        clean_env(&mut cmd);
        cmd.env("RUST_LOG", "warn,cortex_device_agent::agent::waits=info");
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id();
        let stderr = child.stderr.take().context("the agent's stderr")?;
        let index = procs.add("cortex-device-agent", child);
        let (ends, tail, _) = drain(stderr, "\u{0}");
        let agent = Agent {
            index,
            pid,
            ends,
            tail,
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
        tail_text(&self.tail)
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
}
