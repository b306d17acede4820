//! A release `cortex-hub` for a bench: its own home, the HTTP listener on port 0, the mesh
//! off or on port 0, found from its start line; its operator API (sessions, monitors,
//! devices, counts) through `super::request`. Loopback only.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use serde_json::json;

use super::procs::{LogTail, Procs, poll};
use super::{Reply, request, request_on};

/// The HTTP address and, when the mesh is on, its URL from the hub's start line
/// (`listening on http://ADDR (…), mesh ws://127.0.0.1:PORT/mesh/v1, home DIR`, or
/// `mesh off`).
pub fn start_line(line: &str) -> anyhow::Result<(SocketAddr, Option<String>)> {
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|s| s.split([' ', '/']).next())
        .and_then(|s| s.parse::<SocketAddr>().ok())
        .with_context(|| format!("no address in the hub's start line {line:?}"))?;
    let mesh_url = line
        .split(", mesh ")
        .nth(1)
        .and_then(|m| m.split(',').next())
        .filter(|m| *m != "off")
        .map(str::to_string);
    Ok((addr, mesh_url))
}

/// One monitor on the hub: a waitpoint that takes up to 10,000 wakes, fed progress signals.
pub struct Monitor {
    pub id: String,
    pub secret: String,
}

/// A running hub.
pub struct Hub {
    pub addr: SocketAddr,
    /// The device mesh's URL (`ws://127.0.0.1:PORT/mesh/v1`) when the mesh is on.
    pub mesh_url: Option<String>,
    pub index: usize,
    token: String,
    log_tail: LogTail,
}

impl Hub {
    /// Starts `bin --home HOME --listen 127.0.0.1:0 --mesh-listen off` (no devices here; the
    /// mesh's fixed default port would clash with a running hub) and reads its start line;
    /// the hub writes its timing records (`CORTEX_TIMING_FILE`, e.g. each checkpoint that
    /// landed) to `timing`. Its stderr is drained for the rest of its life (the last lines
    /// are kept for errors).
    pub fn start_timed(
        bin: &Path,
        home: &Path,
        timing: &Path,
        procs: &mut Procs,
    ) -> anyhow::Result<Hub> {
        Hub::start_with(bin, home, "off", Some(timing), &[], procs)
    }

    /// Starts the hub (mesh off, no timing records) with `env` set for it (the only
    /// `CORTEX_*` variables it sees besides its token).
    pub fn start_with_env(
        bin: &Path,
        home: &Path,
        env: &[(&str, &str)],
        procs: &mut Procs,
    ) -> anyhow::Result<Hub> {
        Hub::start_with(bin, home, "off", None, env, procs)
    }

    /// Starts the hub with its device mesh on a loopback port chosen at run time (no timing
    /// records).
    pub fn start_with_mesh(bin: &Path, home: &Path, procs: &mut Procs) -> anyhow::Result<Hub> {
        Hub::start_with_mesh_env(bin, home, &[], procs)
    }

    /// [`Hub::start_with_mesh`] with extra environment (e.g. `CORTEX_LLM_BASE_URL`).
    pub fn start_with_mesh_env(
        bin: &Path,
        home: &Path,
        env: &[(&str, &str)],
        procs: &mut Procs,
    ) -> anyhow::Result<Hub> {
        let hub = Hub::start_with(bin, home, "127.0.0.1:0", None, env, procs)?;
        ensure!(
            hub.mesh_url.is_some(),
            "the hub's start line names no mesh URL"
        );
        Ok(hub)
    }

    fn start_with(
        bin: &Path,
        home: &Path,
        mesh_listen: &str,
        timing: Option<&Path>,
        env: &[(&str, &str)],
        procs: &mut Procs,
    ) -> anyhow::Result<Hub> {
        // Given one (hubs sharing a database share one), else made here.
        let token = match env.iter().find(|(k, _)| *k == "CORTEX_WEBHOOK_TOKEN") {
            Some((_, t)) => t.to_string(),
            None => format!(
                "bench-{:x}",
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or_default()
            ),
        };
        let mut cmd = Command::new(bin);
        cmd.arg("--home")
            .arg(home)
            .args(["--listen", "127.0.0.1:0"])
            .args(["--mesh-listen", mesh_listen])
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
        if let Some(t) = timing {
            cmd.env("CORTEX_TIMING_FILE", t);
        }
        cmd.envs(env.iter().copied());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stderr = child.stderr.take().context("the hub's stderr")?;
        let index = procs.add("cortex-hub", child);

        let (log_tail, rx) = LogTail::drain(stderr, "listening on http://");
        let line = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => line,
            Err(_) => {
                // Give the reader a moment to collect what a failing hub said last.
                std::thread::sleep(Duration::from_millis(100));
                bail!(
                    "cortex-hub printed no \"listening on\" line within 20 s; it said:\n{}",
                    log_tail.text()
                );
            }
        };
        let (addr, mesh_url) = start_line(&line)?;
        let hub = Hub {
            addr,
            mesh_url,
            index,
            token,
            log_tail,
        };
        poll(Duration::from_secs(10), "the hub's /healthz", || {
            procs.check_alive(index)?;
            Ok(request(addr, "GET", "/healthz", None, None)
                .ok()
                .filter(|r| r.status == 200))
        })?;
        Ok(hub)
    }

    /// The hub's last log lines, for an error message.
    pub fn log_tail(&self) -> String {
        self.log_tail.text()
    }

    pub fn signal_url(&self) -> String {
        format!("http://{}/webhook/signal", self.addr)
    }

    pub fn api(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> anyhow::Result<Reply> {
        let bytes = body.map(|b| b.to_string().into_bytes());
        request(self.addr, method, path, Some(&self.token), bytes.as_deref())
    }

    /// One operator API call through `agent`'s kept-alive connection; any status.
    pub fn api_reply_on(
        &self,
        agent: &ureq::Agent,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> anyhow::Result<Reply> {
        let bytes = body.map(|b| b.to_string().into_bytes());
        request_on(
            agent,
            self.addr,
            method,
            path,
            Some(&self.token),
            bytes.as_deref(),
        )
    }

    /// [`Hub::api_json`] through `agent`'s kept-alive connection.
    pub fn api_on(
        &self,
        agent: &ureq::Agent,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
        want: u16,
    ) -> anyhow::Result<serde_json::Value> {
        self.api_reply_on(agent, method, path, body)?
            .expect(want, &format!("{method} {path}"))
    }

    /// One operator API call that must answer `want`; returns the JSON body.
    pub fn api_json(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
        want: u16,
    ) -> anyhow::Result<serde_json::Value> {
        self.api(method, path, body)?
            .expect(want, &format!("{method} {path}"))
    }

    /// The operator token it answers to.
    pub fn token(&self) -> &str {
        &self.token
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

    /// Enrols a device (`POST /api/devices`); returns its token.
    pub fn add_device(&self, name: &str) -> anyhow::Result<String> {
        let v = self.api_json("POST", "/api/devices", Some(json!({"name": name})), 201)?;
        Ok(v["token"]
            .as_str()
            .with_context(|| format!("device {name}: no token in the answer"))?
            .to_string())
    }

    /// `GET /api/devices`: how many devices are listed, and how many of them are online.
    pub fn devices_online(&self) -> anyhow::Result<(usize, usize)> {
        let v = self.api_json("GET", "/api/devices", None, 200)?;
        let list = v.as_array().context("GET /api/devices: not an array")?;
        let online = list.iter().filter(|d| d["state"] == "online").count();
        Ok((list.len(), online))
    }
}

/// The signal body, the same shape for the hub and for webhook.
pub fn signal_body(id: &str, secret: &str) -> String {
    json!({"id": id, "secret": secret, "status": "progress", "message": "bench"}).to_string()
}
