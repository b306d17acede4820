//! adnanh/webhook with its two hooks, the server the hub is measured against (the hub
//! itself and the process guards are `crate::bench_kit`'s). Loopback only.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::json;

use crate::bench_kit::hub::signal_body;
use crate::bench_kit::procs::{Procs, free_port, poll};
use crate::bench_kit::{Reply, request};

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
        request(
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
