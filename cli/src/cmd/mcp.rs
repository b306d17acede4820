//! `cortex mcp`: an MCP server on stdio that is the hub's `/mcp`, so a client that starts
//! its servers as commands (`claude mcp add cortex -- cortex mcp`, Codex's
//! `[mcp_servers.cortex]`) reaches the hub. Each JSON-RPC message read from stdin is
//! POSTed to the hub (with the operator token, the connection's `Mcp-Session-Id` once
//! the handshake gave one, and `--session` as `Cortex-Session`); whatever the hub answers
//! (one JSON body, or an event stream of notifications and the response) is written to
//! stdout, one message a line. Requests run side by side: a `wait_for` that blocks does
//! not hold up the others. Nothing here knows the tools: they are the hub's.

use std::io::{BufRead, Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::hub::{Hub, HubError};

/// How long a message is retried while no hub answers (one restarting).
const UNREACHABLE_FOR: Duration = Duration::from_secs(30);
/// An event or a JSON body larger than this is not passed on.
const MAX_MESSAGE: usize = 16 * 1024 * 1024;
/// The JSON-RPC error code for what the bridge itself could not do.
const BRIDGE_ERROR: i64 = -32000;

/// What the connection's messages share.
struct Bridge {
    hub: Hub,
    session_name: Option<String>,
    /// The hub's `Mcp-Session-Id`, from the handshake's answer.
    session_id: Mutex<Option<String>>,
    /// The negotiated protocol version, sent as `MCP-Protocol-Version` after it.
    version: Mutex<Option<String>>,
    out: Mutex<Box<dyn Write + Send>>,
}

/// Runs the bridge until stdin ends; returns the exit code.
pub fn run(
    hub: Hub,
    session_name: Option<String>,
    input: impl BufRead,
    out: Box<dyn Write + Send>,
    err: &mut dyn Write,
) -> u8 {
    let bridge = Arc::new(Bridge {
        hub,
        session_name,
        session_id: Mutex::new(None),
        version: Mutex::new(None),
        out: Mutex::new(out),
    });
    let mut running = Vec::new();
    let mut listening = false;
    for line in input.lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                let _ = writeln!(err, "cortex mcp: reading stdin: {e}");
                break;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let msg: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                bridge.write(&json!({"jsonrpc": "2.0", "id": null,
                    "error": {"code": -32700, "message": format!("not JSON: {e}")}}));
                continue;
            }
        };
        // The handshake first and alone: what follows needs the connection it makes.
        if msg["method"] == "initialize" {
            bridge.pass(&msg, line.as_bytes());
            if !listening {
                listening = true;
                let b = bridge.clone();
                std::thread::spawn(move || b.listen());
            }
            continue;
        }
        let b = bridge.clone();
        running.retain(|h: &std::thread::JoinHandle<()>| !h.is_finished());
        running.push(std::thread::spawn(move || b.pass(&msg, line.as_bytes())));
    }
    for h in running {
        let _ = h.join();
    }
    0
}

/// Reads an event stream to its end, handing each message's JSON to `f`.
fn read_events(mut body: Box<dyn Read + Send>, mut f: impl FnMut(&Value)) {
    let mut parser = cortex_host::sse::Parser::new(MAX_MESSAGE);
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let Ok(messages) = parser.feed(&buf[..n]) else {
            break;
        };
        for m in messages {
            if let Ok(v) = serde_json::from_str::<Value>(&m.data) {
                f(&v);
            }
        }
    }
}

/// What streamable HTTP says in headers of a message (2026-07-28 asks for them): its
/// method, the name it acts on (a tool's, a resource's, a task's), and the revision the
/// message states in its `_meta`. A name that is not plain printable ASCII is left out.
fn routing(msg: &Value) -> (Option<String>, Option<String>, Option<String>) {
    let method = msg["method"].as_str().map(str::to_string);
    let params = &msg["params"];
    let key = match method.as_deref() {
        Some("tools/call" | "prompts/get") => Some("name"),
        Some("resources/read" | "resources/subscribe" | "resources/unsubscribe") => Some("uri"),
        Some("tasks/get" | "tasks/update" | "tasks/cancel") => Some("taskId"),
        _ => None,
    };
    let name = key
        .and_then(|k| params[k].as_str())
        .filter(|n| n.bytes().all(|b| (0x21..0x7f).contains(&b)))
        .map(str::to_string);
    let stated = params["_meta"]["io.modelcontextprotocol/protocolVersion"]
        .as_str()
        .map(str::to_string);
    (method, name, stated)
}

impl Bridge {
    /// The connection's own stream (`GET /mcp`): what the hub sends unasked (a wake
    /// pushed as a channel message), passed on as it comes; opened again when it ends,
    /// for as long as the bridge runs. A hub that serves none (405) is not asked again.
    fn listen(&self) {
        let mut wait = Duration::from_millis(200);
        loop {
            let sid = self.session_id.lock().ok().and_then(|s| s.clone());
            let version = self.version.lock().ok().and_then(|s| s.clone());
            let Some(sid) = sid else {
                // A connection without a session (2026-07-28): nothing to listen on.
                return;
            };
            let mut headers: Vec<(&str, &str)> = vec![("Mcp-Session-Id", &sid)];
            if let Some(v) = &version {
                headers.push(("MCP-Protocol-Version", v));
            }
            if let Some(n) = &self.session_name {
                headers.push(("Cortex-Session", n));
            }
            match self.hub.open_get("/mcp", &headers, "text/event-stream") {
                Ok(s) if s.status == 405 => return,
                Ok(s) if (200..300).contains(&s.status) => {
                    wait = Duration::from_millis(200);
                    read_events(s.body, |v| self.write(v));
                }
                _ => {}
            }
            std::thread::sleep(wait);
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    }

    fn write(&self, msg: &Value) {
        let mut out = match self.out.lock() {
            Ok(o) => o,
            Err(p) => p.into_inner(),
        };
        let _ = writeln!(out, "{msg}");
        let _ = out.flush();
    }

    /// Sends one message to the hub and writes what comes back.
    fn pass(&self, msg: &Value, raw: &[u8]) {
        let id = msg
            .get("id")
            .cloned()
            .filter(|_| msg.get("method").is_some());
        let (method, name, stated) = routing(msg);
        let started = Instant::now();
        let mut wait = Duration::from_millis(100);
        let opened = loop {
            let sid = self.session_id.lock().ok().and_then(|s| s.clone());
            let version = stated
                .clone()
                .or_else(|| self.version.lock().ok().and_then(|s| s.clone()));
            let mut headers: Vec<(&str, &str)> = Vec::new();
            if let Some(s) = &sid {
                headers.push(("Mcp-Session-Id", s));
            }
            if let Some(v) = &version {
                headers.push(("MCP-Protocol-Version", v));
            }
            if let Some(n) = &self.session_name {
                headers.push(("Cortex-Session", n));
            }
            if let Some(m) = &method {
                headers.push(("Mcp-Method", m));
            }
            if let Some(n) = &name {
                headers.push(("Mcp-Name", n));
            }
            match self
                .hub
                .open_post("/mcp", raw, &headers, "application/json, text/event-stream")
            {
                Err(HubError::Unreachable { unsent: true, .. })
                    if started.elapsed() < UNREACHABLE_FOR =>
                {
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
                other => break other,
            }
        };
        let s = match opened {
            Ok(s) => s,
            Err(e) => return self.fail(id, &format!("{e}")),
        };
        let header = |name: &str| {
            s.headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        if let Some(sid) = header("mcp-session-id")
            && let Ok(mut slot) = self.session_id.lock()
        {
            *slot = Some(sid);
        }
        let kind = header("content-type").unwrap_or_default();
        let status = s.status;
        let mut body = s.body;
        if status == 202 {
            return;
        }
        if !(200..300).contains(&status) {
            let mut text = Vec::new();
            let _ = body.by_ref().take(64 * 1024).read_to_end(&mut text);
            return self.fail(
                id,
                &format!(
                    "the hub answered HTTP {status}: {}",
                    String::from_utf8_lossy(&text).trim()
                ),
            );
        }
        let mut answered = false;
        if kind.starts_with("text/event-stream") {
            read_events(body, |v| answered |= self.take(v, &id));
        } else {
            let mut text = Vec::new();
            let _ = body
                .by_ref()
                .take(MAX_MESSAGE as u64)
                .read_to_end(&mut text);
            if let Ok(v) = serde_json::from_slice::<Value>(&text) {
                answered |= self.take(&v, &id);
            }
        }
        if !answered && id.is_some() {
            self.fail(
                id,
                "the hub's connection ended before it answered; call again (a wait_for resumes where it was)",
            );
        }
    }

    /// Writes one message from the hub; whether it answers `id`.
    fn take(&self, v: &Value, id: &Option<Value>) -> bool {
        if let Some(version) = v["result"]["protocolVersion"].as_str()
            && let Ok(mut slot) = self.version.lock()
        {
            *slot = Some(version.to_string());
        }
        self.write(v);
        id.as_ref()
            .is_some_and(|id| v.get("id") == Some(id) && v.get("method").is_none())
    }

    fn fail(&self, id: Option<Value>, message: &str) {
        if let Some(id) = id {
            self.write(&json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": BRIDGE_ERROR, "message": format!("cortex mcp: {message}")}}));
        }
    }
}
