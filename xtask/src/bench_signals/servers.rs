//! The servers under test and their lifetimes: a scratch directory and a process guard that
//! remove and kill everything on drop (also when the bench fails half-way), the hub on port
//! 0 with its monitors, and adnanh/webhook with its two hooks. Loopback only.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use serde_json::json;

use super::http::{self, Reply};

/// A directory under the system temp dir, removed on drop.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    pub fn new() -> anyhow::Result<Self> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let path = std::env::temp_dir().join(format!(
            "cortex-bench-signals-{}-{nanos:x}",
            std::process::id()
        ));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(ScratchDir(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!("xtask: could not remove {}: {e}", self.0.display());
        }
    }
}

/// Every process the bench starts; each is killed and reaped on drop.
#[derive(Default)]
pub struct Procs(Vec<(String, Child)>);

impl Procs {
    pub fn add(&mut self, name: &str, child: Child) -> usize {
        self.0.push((name.to_string(), child));
        self.0.len() - 1
    }

    /// Fails if the process at `index` has already exited.
    pub fn check_alive(&mut self, index: usize) -> anyhow::Result<()> {
        let Some((name, child)) = self.0.get_mut(index) else {
            bail!("no process #{index}");
        };
        match child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => bail!("{name} exited early ({status})"),
            Err(e) => Err(e).with_context(|| format!("checking on {name}")),
        }
    }

    pub fn pid(&self, index: usize) -> Option<u32> {
        self.0.get(index).map(|(_, c)| c.id())
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (name, child) in self.0.iter_mut().rev() {
            if let Ok(None) = child.try_wait() {
                if let Err(e) = child.kill() {
                    eprintln!("xtask: could not kill {name} (pid {}): {e}", child.id());
                }
                let _ = child.wait();
            }
        }
    }
}

/// A free loopback port: bind port 0, read it, release it.
pub fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(l.local_addr().context("reading a bound address")?.port())
}

/// Polls `f` every 20 ms until it returns `Some`, for at most `bound`.
fn poll<T>(
    bound: Duration,
    what: &str,
    mut f: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        if start.elapsed() > bound {
            bail!("{what}: not ready after {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One monitor on the hub: a waitpoint that takes up to 10,000 wakes, fed progress signals.
pub struct Monitor {
    pub id: String,
    pub secret: String,
}

/// A running hub.
pub struct Hub {
    pub addr: SocketAddr,
    pub index: usize,
    token: String,
    log_tail: Arc<Mutex<VecDeque<String>>>,
}

impl Hub {
    /// Starts `bin --home HOME --listen 127.0.0.1:0 --mesh-listen off` and reads its start
    /// line. Its
    /// stderr is drained for the rest of its life (the last lines are kept for errors).
    pub fn start(bin: &Path, home: &Path, procs: &mut Procs) -> anyhow::Result<Hub> {
        let token = format!(
            "bench-{:x}",
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        );
        let mut cmd = Command::new(bin);
        cmd.arg("--home")
            .arg(home)
            .args(["--listen", "127.0.0.1:0"])
            // No devices here; the mesh's fixed default port would clash with a running hub.
            .args(["--mesh-listen", "off"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("CORTEX_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("CORTEX_WEBHOOK_TOKEN", &token)
            .env("RUST_LOG", "warn");
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stderr = child.stderr.take().context("the hub's stderr")?;
        let index = procs.add("cortex-hub", child);

        let log_tail = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, rx) = mpsc::channel();
        let tail = log_tail.clone();
        std::thread::spawn(move || {
            let mut start_line = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("listening on http://")
                    && let Some(tx) = start_line.take()
                {
                    let _ = tx.send(line.clone());
                }
                let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                if t.len() >= 20 {
                    t.pop_front();
                }
                t.push_back(line);
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => line,
            Err(_) => {
                // Give the reader a moment to collect what a failing hub said last.
                std::thread::sleep(Duration::from_millis(100));
                let t = log_tail.lock().unwrap_or_else(|e| e.into_inner());
                bail!(
                    "cortex-hub printed no \"listening on\" line within 20 s; it said:\n{}",
                    t.iter().cloned().collect::<Vec<_>>().join("\n")
                );
            }
        };
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|s| s.split([' ', '/']).next())
            .and_then(|s| s.parse::<SocketAddr>().ok())
            .with_context(|| format!("no address in the hub's start line {line:?}"))?;
        let hub = Hub {
            addr,
            index,
            token,
            log_tail,
        };
        poll(Duration::from_secs(10), "the hub's /healthz", || {
            procs.check_alive(index)?;
            Ok(http::request(addr, "GET", "/healthz", None, None)
                .ok()
                .filter(|r| r.status == 200))
        })?;
        Ok(hub)
    }

    /// The hub's last log lines, for an error message.
    pub fn log_tail(&self) -> String {
        let t = self.log_tail.lock().unwrap_or_else(|e| e.into_inner());
        t.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    pub fn signal_url(&self) -> String {
        format!("http://{}/webhook/signal", self.addr)
    }

    fn api(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> anyhow::Result<Reply> {
        let bytes = body.map(|b| b.to_string().into_bytes());
        http::request(self.addr, method, path, Some(&self.token), bytes.as_deref())
    }

    fn api_json(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
        want: u16,
    ) -> anyhow::Result<serde_json::Value> {
        let r = self.api(method, path, body)?;
        let what = format!("{method} {path}");
        ensure!(
            r.status == want,
            "{what}: HTTP {} (wanted {want}): {}",
            r.status,
            r.text()
        );
        r.json(&what)
    }

    /// Creates a session and `n` monitors in it.
    pub fn create_monitors(&self, n: usize) -> anyhow::Result<Vec<Monitor>> {
        let s = self.api_json(
            "POST",
            "/api/sessions",
            Some(json!({"title": "bench"})),
            201,
        )?;
        let sid = s["id"].as_str().context("the new session has no id")?;
        let path = format!("/api/sessions/{sid}/waitpoints");
        (0..n)
            .map(|_| {
                let w = self.api_json(
                    "POST",
                    &path,
                    Some(json!({"label": "bench", "intent": "bench", "max_signals": 10000})),
                    201,
                )?;
                Ok(Monitor {
                    id: w["id"]
                        .as_str()
                        .context("a waitpoint without id")?
                        .to_string(),
                    secret: w["secret"]
                        .as_str()
                        .context("a waitpoint without secret")?
                        .to_string(),
                })
            })
            .collect()
    }

    /// The number of signals the hub recorded, summed over `monitors`.
    pub fn recorded(&self, monitors: &[Monitor]) -> anyhow::Result<u64> {
        let mut sum = 0;
        for m in monitors {
            let v = self.api_json("GET", &format!("/api/waitpoints/{}", m.id), None, 200)?;
            sum += v["signal_count"]
                .as_u64()
                .with_context(|| format!("waitpoint {} has no signal_count", m.id))?;
        }
        Ok(sum)
    }
}

/// The signal body, the same shape for the hub and for webhook.
pub fn signal_body(id: &str, secret: &str) -> String {
    json!({"id": id, "secret": secret, "status": "progress", "message": "bench"}).to_string()
}

/// A running adnanh/webhook with hooks `check` and `true`.
pub struct Webhook {
    pub addr: SocketAddr,
    pub index: usize,
    pub secret: String,
}

impl Webhook {
    /// Writes hooks.json into `dir` and starts `webhook` on a free loopback port. Both hooks
    /// match the payload's `secret`; a mismatch answers 401 (webhook's default would be 200
    /// with "Hook rules were not satisfied.", which wrk would count as a success).
    pub fn start(dir: &Path, procs: &mut Procs) -> anyhow::Result<Webhook> {
        let secret = "b7e1d2c3a4f5061728394a5b6c7d8e9f".to_string();
        let rule = json!({"match": {"type": "value", "value": secret,
            "parameter": {"source": "payload", "name": "secret"}}});
        let hooks = json!([
            {"id": "check", "trigger-rule": rule,
             "trigger-rule-mismatch-http-response-code": 401},
            {"id": "true", "execute-command": "/bin/true", "trigger-rule": rule,
             "trigger-rule-mismatch-http-response-code": 401},
        ]);
        let file = dir.join("hooks.json");
        std::fs::write(&file, hooks.to_string())
            .with_context(|| format!("writing {}", file.display()))?;
        let port = free_port()?;
        let child = Command::new("webhook")
            .arg("-hooks")
            .arg(&file)
            .args(["-ip", "127.0.0.1", "-port", &port.to_string()])
            // A hook without execute-command still makes webhook look the empty name up
            // in PATH (a stat per entry, in a goroutine after it answered): one entry
            // keeps that to a single failed stat.
            .env("PATH", "/usr/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting webhook")?;
        let index = procs.add("webhook", child);
        let wh = Webhook {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            index,
            secret,
        };
        poll(Duration::from_secs(10), "webhook", || {
            procs.check_alive(index)?;
            Ok(wh.post("check", &wh.secret).ok())
        })?;
        for hook in ["check", "true"] {
            let ok = wh.post(hook, &wh.secret)?;
            ensure!(
                ok.status == 200,
                "webhook hook {hook}: HTTP {} with the right secret: {}",
                ok.status,
                ok.text()
            );
            let bad = wh.post(hook, "not-the-secret")?;
            ensure!(
                bad.status == 401,
                "webhook hook {hook} did not refuse a wrong secret (HTTP {}: {}); the rule is not checked",
                bad.status,
                bad.text()
            );
        }
        Ok(wh)
    }

    fn post(&self, hook: &str, secret: &str) -> anyhow::Result<Reply> {
        let body = signal_body("wp_bench", secret);
        http::request(
            self.addr,
            "POST",
            &format!("/hooks/{hook}"),
            None,
            Some(body.as_bytes()),
        )
    }

    pub fn url(&self, hook: &str) -> String {
        format!("http://{}/hooks/{hook}", self.addr)
    }
}
