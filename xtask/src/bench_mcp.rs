//! `cargo xtask bench mcp`: the hub as an MCP server beside its own HTTP API. On one
//! release hub (redb): a tool call's round trip over MCP (`tools/call` on a connection
//! with a handshake, its answer read from the event stream) against the same work over
//! the HTTP API, interleaved call by call over one kept-alive client, for a read
//! (`devices` / `GET /api/devices`) and a durable write (`wait_create` / `POST
//! /api/sessions/{sid}/waitpoints`); then a signal's 202 until the client holds the
//! wake, pushed (a channel message on the connection's own stream; a task's
//! `notifications/tasks` on a `subscriptions/listen` stream, revision 2026-07-28) and
//! polled (a task whose `tasks/get` the client asks at the interval the task names).
//! Prints p50/p99 and the ratios. Method and figures: docs/benchmarks.md.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use serde_json::{Value, json};

use crate::bench_kit::hub::Hub;
use crate::bench_kit::procs::{Procs, ScratchDir};
use crate::bench_kit::report::{machine, ms, us, utc_now};
use crate::bench_kit::{cargo_build, target_dir, workspace_root};

/// `cargo xtask bench mcp` flags.
#[derive(clap::Parser)]
#[command(name = "cargo xtask bench mcp", disable_help_flag = true)]
struct Options {
    /// Calls of each kind, each way.
    #[arg(long, default_value_t = 500, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(10..=100_000))]
    calls: usize,
    /// Wakes timed, pushed and polled each.
    #[arg(long, default_value_t = 30, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..=10_000))]
    wakes: usize,
    /// Build the hub first (`--no-build`: use target/release/cortex-hub).
    #[arg(long = "no-build", action = clap::ArgAction::SetFalse)]
    build: bool,
}

pub fn run(args: &[&str]) -> anyhow::Result<()> {
    let opts: Options = crate::bench_kit::parse_flags(args)?;
    let root = workspace_root();
    if opts.build {
        cargo_build(&root, &["cortex-hub"]).context("building cortex-hub")?;
    }
    let hub_bin = target_dir(&root).join("release").join("cortex-hub");
    ensure!(
        hub_bin.is_file(),
        "{} is missing; run without --no-build",
        hub_bin.display()
    );
    let scratch = ScratchDir::new("mcp")?;
    let mut procs = Procs::default();
    let hub = Hub::start_with_env(&hub_bin, &scratch.path().join("home"), &[], &mut procs)?;
    let client = Client::new(hub.addr, hub.token())?;

    // A session for the API's calls: the MCP connection's own, from its first waitpoint.
    let first = client.call("wait_create", json!({"label": "probe", "intent": "bench"}))?;
    let sid = first["session"]
        .as_str()
        .context("wait_create's answer names no session")?
        .to_string();

    eprintln!(
        "bench: {} calls of each kind, each way, interleaved",
        opts.calls
    );
    let mut read = (Vec::new(), Vec::new());
    let mut write = (Vec::new(), Vec::new());
    let arm = json!({"label": "b", "intent": "bench"});
    let wp_path = format!("/api/sessions/{sid}/waitpoints");
    // Each waitpoint made is cancelled after, untimed: a session holds at most 64 armed.
    let cancel = |made: &Value| -> anyhow::Result<()> {
        let id = made["id"].as_str().unwrap_or("");
        client.api("DELETE", &format!("/api/waitpoints/{id}"), None, 200)?;
        Ok(())
    };
    for i in 0..opts.calls {
        // The order alternates: neither way always runs on a warm cache.
        for mcp_first in [i % 2 == 0, i % 2 != 0] {
            if mcp_first {
                read.0
                    .push(timed(|| client.call("devices", json!({}))).map(|(d, _)| d)?);
                let (d, made) = timed(|| client.call("wait_create", arm.clone()))?;
                write.0.push(d);
                cancel(&made)?;
            } else {
                let (d, _) = timed(|| client.api("GET", "/api/devices", None, 200))?;
                read.1.push(d);
                let (d, made) = timed(|| client.api("POST", &wp_path, Some(&arm), 201))?;
                write.1.push(d);
                cancel(&made)?;
            }
        }
    }

    eprintln!(
        "bench: {} wakes pushed, then {} polled",
        opts.wakes, opts.wakes
    );
    let stream = client.listen()?;
    let mut pushed = Vec::new();
    for _ in 0..opts.wakes {
        let wp = client.call("wait_create", arm.clone())?;
        let at = client.signal(&wp)?;
        let id = wp["id"].as_str().unwrap_or("").to_string();
        let heard = loop {
            let (when, msg) = stream
                .recv_timeout(Duration::from_secs(30))
                .context("no channel message within 30 s")?;
            if msg["params"]["meta"]["waitpoint"] == id.as_str() {
                break when;
            }
        };
        pushed.push(heard.saturating_duration_since(at));
    }
    let mut listened = Vec::new();
    for _ in 0..opts.wakes {
        let wp = client.modern_call("wait_create", arm.clone())?;
        let wp = &wp["structuredContent"];
        let id = wp["id"].as_str().unwrap_or("");
        let task = client.modern_call("wait_for", json!({"id": id}))?;
        ensure!(
            task["resultType"] == "task",
            "wait_for made no task: {task}"
        );
        let task_id = task["taskId"].as_str().unwrap_or("").to_string();
        let notes = client.listen_tasks(&task_id)?;
        let next = |what: &str| {
            notes
                .recv_timeout(Duration::from_secs(30))
                .with_context(|| format!("no {what} on the listen within 30 s"))
        };
        let (_, ack) = next("acknowledgment")?;
        ensure!(
            ack["params"]["notifications"]["taskIds"][0] == task_id.as_str(),
            "the listen honored no task: {ack}"
        );
        let (_, first) = next("first state")?;
        ensure!(first["params"]["status"] == "working", "{first}");
        let at = client.signal(wp)?;
        let (heard, done) = next("completion")?;
        ensure!(done["params"]["status"] == "completed", "{done}");
        listened.push(heard.saturating_duration_since(at));
    }
    let mut polled = Vec::new();
    for k in 0..opts.wakes {
        let wp = client.call("wait_create", arm.clone())?;
        let id = wp["id"].as_str().unwrap_or("").to_string();
        let task = client.task_for(&id)?;
        let interval = Duration::from_millis(task["pollInterval"].as_u64().unwrap_or(1000));
        let task_id = task["taskId"].as_str().unwrap_or("").to_string();
        let poller = {
            let c = client.clone_session()?;
            std::thread::spawn(move || -> anyhow::Result<Instant> {
                loop {
                    let t = c.tasks_get(&task_id)?;
                    if t["status"] == "completed" {
                        return Ok(Instant::now());
                    }
                    std::thread::sleep(interval);
                }
            })
        };
        // The job reports at a moment the client's polls do not know of.
        std::thread::sleep(interval.mul_f64((k as f64 * 0.37 + 0.05) % 1.0));
        let at = client.signal(&wp)?;
        let done = poller
            .join()
            .map_err(|_| anyhow::anyhow!("the poller panicked"))??;
        polled.push(done.saturating_duration_since(at));
    }
    drop(stream);

    let p = |v: &mut Vec<Duration>, q: f64| {
        v.sort();
        v[((v.len() - 1) as f64 * q).round() as usize].as_secs_f64()
    };
    println!("bench mcp: {} on {}", utc_now(), machine());
    println!(
        "a tool call's round trip, {} each way, interleaved (one kept-alive client):",
        opts.calls
    );
    for (name, (m, a)) in [
        ("read  devices / GET /api/devices", &mut read),
        ("write wait_create / POST waitpoints", &mut write),
    ] {
        let (m50, m99, a50, a99) = (p(m, 0.5), p(m, 0.99), p(a, 0.5), p(a, 0.99));
        println!(
            "  {name}: MCP p50 {} p99 {}; API p50 {} p99 {}; MCP/API p50 {:.2}x",
            us(m50 * 1e6),
            us(m99 * 1e6),
            us(a50 * 1e6),
            us(a99 * 1e6),
            m50 / a50
        );
    }
    println!(
        "a signal's 202 until the client holds the wake, {} each:",
        opts.wakes
    );
    println!(
        "  pushed (channel message): p50 {} p99 {}",
        ms(p(&mut pushed, 0.5)),
        ms(p(&mut pushed, 0.99))
    );
    println!(
        "  pushed (task, notifications/tasks on subscriptions/listen): p50 {} p99 {}",
        ms(p(&mut listened, 0.5)),
        ms(p(&mut listened, 0.99))
    );
    println!(
        "  polled (task, tasks/get every pollInterval): p50 {} p99 {}",
        ms(p(&mut polled, 0.5)),
        ms(p(&mut polled, 0.99))
    );
    Ok(())
}

fn timed(f: impl FnOnce() -> anyhow::Result<Value>) -> anyhow::Result<(Duration, Value)> {
    let t = Instant::now();
    let v = f()?;
    Ok((t.elapsed(), v))
}

/// One MCP connection (revision 2025-11-25, named `claude-code` so its wakes are pushed)
/// and the API, over one kept-alive `ureq` agent.
struct Client {
    addr: SocketAddr,
    bearer: String,
    session: String,
    agent: ureq::Agent,
    next: std::cell::Cell<u64>,
}

impl Client {
    fn new(addr: SocketAddr, token: &str) -> anyhow::Result<Client> {
        let mut c = Client {
            addr,
            bearer: format!("Bearer {token}"),
            session: String::new(),
            agent: crate::bench_kit::agent(),
            next: std::cell::Cell::new(1),
        };
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "claude-code", "version": "bench"}}});
        let r = c.post(&init)?;
        c.session = r
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .context("the handshake gave no Mcp-Session-Id")?
            .to_string();
        read_answer(r)?;
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        c.post(&note)?;
        Ok(c)
    }

    /// A second client on the same connection (the poller's thread).
    fn clone_session(&self) -> anyhow::Result<Client> {
        Ok(Client {
            addr: self.addr,
            bearer: self.bearer.clone(),
            session: self.session.clone(),
            agent: crate::bench_kit::agent(),
            next: std::cell::Cell::new(1_000_000),
        })
    }

    fn post(&self, msg: &Value) -> anyhow::Result<ureq::http::Response<ureq::Body>> {
        let mut req = self
            .agent
            .post(format!("http://{}/mcp", self.addr))
            .header("Authorization", &self.bearer)
            .header("Accept", "application/json, text/event-stream")
            .header("Content-Type", "application/json");
        if !self.session.is_empty() {
            req = req
                .header("Mcp-Session-Id", &self.session)
                .header("MCP-Protocol-Version", "2025-11-25");
        }
        req.send(msg.to_string().as_bytes()).context("POST /mcp")
    }

    fn id(&self) -> u64 {
        let n = self.next.get();
        self.next.set(n + 1);
        n
    }

    /// `tools/call`: the structured answer.
    fn call(&self, name: &str, args: Value) -> anyhow::Result<Value> {
        let msg = json!({"jsonrpc": "2.0", "id": self.id(), "method": "tools/call",
            "params": {"name": name, "arguments": args}});
        let r = read_answer(self.post(&msg)?)?;
        ensure!(
            r["result"]["isError"] != true,
            "{name} failed: {}",
            r["result"]
        );
        Ok(r["result"]["structuredContent"].clone())
    }

    /// `wait_for {id}` as a task (revision 2025-11-25's `task`).
    fn task_for(&self, id: &str) -> anyhow::Result<Value> {
        let msg = json!({"jsonrpc": "2.0", "id": self.id(), "method": "tools/call",
            "params": {"name": "wait_for", "arguments": {"id": id}, "task": {}}});
        let r = read_answer(self.post(&msg)?)?;
        Ok(r["result"]["task"].clone())
    }

    fn tasks_get(&self, task: &str) -> anyhow::Result<Value> {
        let msg = json!({"jsonrpc": "2.0", "id": self.id(), "method": "tasks/get",
            "params": {"taskId": task}});
        Ok(read_answer(self.post(&msg)?)?["result"].clone())
    }

    fn api(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        want: u16,
    ) -> anyhow::Result<Value> {
        let b = body.map(|b| b.to_string().into_bytes());
        let r = crate::bench_kit::request_on(
            &self.agent,
            self.addr,
            method,
            path,
            Some(self.bearer.trim_start_matches("Bearer ")),
            b.as_deref(),
        )?;
        r.expect(want, path)
    }

    /// A POST of revision 2026-07-28 (no handshake), for method `method` on `name`.
    fn modern(&self, method: &str, name: &str) -> ureq::RequestBuilder<ureq::typestate::WithBody> {
        self.agent
            .post(format!("http://{}/mcp", self.addr))
            .header("Authorization", &self.bearer)
            .header("Accept", "application/json, text/event-stream")
            .header("Content-Type", "application/json")
            .header("MCP-Protocol-Version", MODERN)
            .header("Mcp-Method", method)
            .header("Mcp-Name", name)
    }

    /// `tools/call` of revision 2026-07-28: the result (a task, where it made one).
    fn modern_call(&self, name: &str, args: Value) -> anyhow::Result<Value> {
        let params = json!({"name": name, "arguments": args});
        let msg = json!({"jsonrpc": "2.0", "id": self.id(), "method": "tools/call",
            "params": with_meta(params)});
        let r = self
            .modern("tools/call", name)
            .send(msg.to_string().as_bytes())
            .context("POST /mcp")?;
        let r = read_answer(r)?;
        ensure!(
            r["result"]["isError"] != true,
            "{name} failed: {}",
            r["result"]
        );
        Ok(r["result"].clone())
    }

    /// `subscriptions/listen` naming `task`, read on a thread: each message with the
    /// moment it was read.
    fn listen_tasks(&self, task: &str) -> anyhow::Result<Receiver<(Instant, Value)>> {
        let params = json!({"notifications": {"taskIds": [task]}});
        let msg = json!({"jsonrpc": "2.0", "id": self.id(), "method": "subscriptions/listen",
            "params": with_meta(params)});
        let r = crate::bench_kit::agent()
            .post(format!("http://{}/mcp", self.addr))
            .header("Authorization", &self.bearer)
            .header("Accept", "application/json, text/event-stream")
            .header("Content-Type", "application/json")
            .header("MCP-Protocol-Version", MODERN)
            .header("Mcp-Method", "subscriptions/listen")
            .config()
            .timeout_global(None)
            .build()
            .send(msg.to_string().as_bytes())
            .context("POST /mcp subscriptions/listen")?;
        ensure!(
            r.status() == 200,
            "subscriptions/listen: HTTP {}",
            r.status()
        );
        Ok(read_stream(r))
    }

    /// Signals waitpoint `wp` (its `id` and `secret`); the moment its 202 came.
    fn signal(&self, wp: &Value) -> anyhow::Result<Instant> {
        let body = json!({"id": wp["id"], "secret": wp["secret"], "status": "ok"});
        let r = crate::bench_kit::request_on(
            &self.agent,
            self.addr,
            "POST",
            "/webhook/signal",
            None,
            Some(body.to_string().as_bytes()),
        )?;
        let at = Instant::now();
        ensure!(r.status == 202, "the signal: HTTP {}", r.status);
        Ok(at)
    }

    /// The connection's own stream (`GET /mcp`), read on a thread: each message with the
    /// moment it was read.
    fn listen(&self) -> anyhow::Result<Receiver<(Instant, Value)>> {
        let r = crate::bench_kit::agent()
            .get(format!("http://{}/mcp", self.addr))
            .header("Authorization", &self.bearer)
            .header("Accept", "text/event-stream")
            .header("Mcp-Session-Id", &self.session)
            .header("MCP-Protocol-Version", "2025-11-25")
            .config()
            .timeout_global(None)
            .build()
            .call()
            .context("GET /mcp")?;
        ensure!(r.status() == 200, "GET /mcp: HTTP {}", r.status());
        Ok(read_stream(r))
    }
}

/// The revision without a handshake.
const MODERN: &str = "2026-07-28";

/// `params` with the `_meta` a 2026-07-28 request carries: its version, and the
/// client's capabilities (the tasks extension).
fn with_meta(mut params: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities":
            {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    });
    params
}

/// An event stream's messages, read on a thread, each with the moment it was read.
fn read_stream(r: ureq::http::Response<ureq::Body>) -> Receiver<(Instant, Value)> {
    let (tx, rx) = channel();
    let body = r.into_body().into_reader();
    std::thread::spawn(move || {
        for line in BufReader::new(body).lines().map_while(Result::ok) {
            if let Some(data) = line.strip_prefix("data: ")
                && let Ok(v) = serde_json::from_str::<Value>(data)
                && tx.send((Instant::now(), v)).is_err()
            {
                break;
            }
        }
    });
    rx
}

/// The JSON-RPC answer in a response: its JSON body, or the message with an `id` in its
/// event stream.
fn read_answer(r: ureq::http::Response<ureq::Body>) -> anyhow::Result<Value> {
    let sse = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    let status = r.status();
    let mut text = String::new();
    r.into_body()
        .into_reader()
        .read_to_string(&mut text)
        .context("reading the answer")?;
    if status == 202 {
        return Ok(Value::Null);
    }
    if status != 200 {
        bail!("HTTP {status}: {text}");
    }
    if !sse {
        return serde_json::from_str(&text).context("the answer is not JSON");
    }
    for line in text.lines() {
        if let Some(data) = line.strip_prefix("data: ")
            && let Ok(v) = serde_json::from_str::<Value>(data)
            && v.get("id").is_some()
        {
            return Ok(v);
        }
    }
    bail!("no answer in the event stream: {text}")
}
