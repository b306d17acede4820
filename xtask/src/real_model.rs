//! `cargo xtask real-model`: the runner's story against a real model server, not one we
//! wrote. It starts an OpenAI-compatible server (by default llama.cpp's `llama-server` with
//! SmolLM2-135M, through a serve script; or one already running, `--base-url`), the release
//! hub pointed at it, a device agent, and a `sleep` process on "the device"; then it asks a
//! session to wake it when the process exits, and checks the structure (never the words):
//! the model's tool call was parsed and executed, the turn ended, the process's exit woke
//! the session, and the wake ran a turn. Then a second session starts a job on the
//! device (`device_exec`, which asks a person first): the task allows it and checks the
//! job started and its exit woke the session. Then typed answers: a session with an
//! output schema under `native` and one under `respond` each end a run with data the
//! schema accepts. It prints the sessions' events as it goes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use serde_json::{Value, json};

use crate::bench_kit::agent::Agent;
use crate::bench_kit::hub::Hub;
use crate::bench_kit::procs::{Procs, ScratchDir, free_port, poll};
use crate::bench_kit::{cargo_build, target_dir, workspace_root};

/// How long a turn of a small local model may take (generation runs at ~60 tokens/s here).
const TURN: Duration = Duration::from_secs(180);
/// How long the serve script may take to answer: its first run builds the server.
const SERVER_READY: Duration = Duration::from_secs(30 * 60);

/// `cargo xtask real-model` flags.
#[derive(clap::Parser)]
#[command(name = "cargo xtask real-model", disable_help_flag = true)]
struct Options {
    /// A running OpenAI-compatible server's base URL (`http://HOST:PORT/v1`); none: start
    /// one with the serve script.
    #[arg(long)]
    base_url: Option<String>,
    /// The script that serves a model: called as `SCRIPT --port N`, it must serve
    /// `http://127.0.0.1:N/v1` until killed. Default: `$CORTEX_MODEL_SERVE`, else
    /// `../shared/tools/model-server/serve.sh` beside the workspace.
    #[arg(long)]
    serve: Option<PathBuf>,
    /// The model name to ask for.
    #[arg(long, default_value = "SmolLM2-135M-Instruct")]
    model: String,
    /// Use the binaries in target/release as they are.
    #[arg(long = "no-build", action = clap::ArgAction::SetFalse)]
    build: bool,
}

pub fn run(args: &[&str]) -> anyhow::Result<()> {
    let opts: Options = crate::bench_kit::parse_flags(args)?;
    let root = workspace_root();
    if opts.build {
        cargo_build(&root, &["cortex-hub", "cortex-device-agent"]).context("building")?;
    }
    let release = target_dir(&root).join("release");
    let scratch = ScratchDir::new("real-model")?;
    let mut procs = Procs::default();
    let mut server: Option<Child> = None;
    let result = (|| {
        let base_url = match &opts.base_url {
            Some(u) => u.trim_end_matches('/').to_string(),
            None => {
                let (child, url) = start_server(&opts, &root)?;
                server = Some(child);
                url
            }
        };
        story(&opts, &base_url, &release, scratch.path(), &mut procs)
    })();
    drop(procs);
    if let Some(mut s) = server {
        // The serve script execs the server: one process to stop.
        let _ = s.kill();
        let _ = s.wait();
    }
    result
}

fn serve_script(opts: &Options, root: &Path) -> anyhow::Result<PathBuf> {
    if let Some(p) = &opts.serve {
        return Ok(p.clone());
    }
    if let Some(p) = std::env::var_os("CORTEX_MODEL_SERVE").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let beside = root.join("../shared/tools/model-server/serve.sh");
    ensure!(
        beside.is_file(),
        "no model server: give --base-url of a running OpenAI-compatible server (Ollama, vLLM, llama-server), or --serve SCRIPT (or CORTEX_MODEL_SERVE) that serves one on --port N"
    );
    Ok(beside)
}

/// Starts the serve script on a free port and waits until `/v1/models` answers.
fn start_server(opts: &Options, root: &Path) -> anyhow::Result<(Child, String)> {
    let script = serve_script(opts, root)?;
    let port = free_port()?;
    let url = format!("http://127.0.0.1:{port}/v1");
    eprintln!(
        "real-model: starting {} --port {port} (its first run builds the server: minutes)",
        script.display()
    );
    let mut child = Command::new("bash")
        .arg(&script)
        .args(["--port", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", script.display()))?;
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let started = Instant::now();
    let ready = poll(SERVER_READY, "the model server's /v1/models", || {
        if let Some(st) = child.try_wait().context("the model server")? {
            bail!("the model server exited ({st}) before it answered");
        }
        Ok(
            crate::bench_kit::request(addr, "GET", "/v1/models", None, None)
                .ok()
                .filter(|r| r.status == 200)
                .map(|_| ()),
        )
    });
    if let Err(e) = ready {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    eprintln!(
        "real-model: the model server answers at {url} ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    Ok((child, url))
}

/// The worked example a small model needs before it calls a tool: a request, the call,
/// its answer, the closing line.
fn example() -> Vec<Value> {
    vec![
        json!({"role": "user", "content": "Process 4242 on device box-a is my build. Wake me when it exits."}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_ex1", "type": "function", "function": {"name": "device_wait_pid", "arguments": "{\"device\": \"box-a\", \"pid\": 4242}"}}]}),
        json!({"role": "tool", "tool_call_id": "call_ex1", "content": "{\"waitpoint\": {\"id\": \"wp_example\", \"label\": \"pid 4242 on box-a\", \"state\": \"armed\"}}"}),
        json!({"role": "assistant", "content": "I am waiting for process 4242 on box-a; I will tell you when it exits."}),
    ]
}

fn story(
    opts: &Options,
    base_url: &str,
    release: &Path,
    scratch: &Path,
    procs: &mut Procs,
) -> anyhow::Result<()> {
    let mut env = vec![
        ("CORTEX_LLM_BASE_URL", base_url),
        ("CORTEX_LLM_MODEL", opts.model.as_str()),
        ("RUST_LOG", "info"),
    ];
    // The server the serve script starts is llama.cpp's: named, `auto` knows what it
    // enforces.
    if opts.base_url.is_none() {
        env.push(("CORTEX_LLM_ENDPOINT", "llamacpp"));
    }
    let hub_home = scratch.join("hub-home");
    std::fs::create_dir_all(&hub_home).context("the hub's home")?;
    // Small models ramble: bound each step's generation.
    std::fs::write(
        hub_home.join("settings.json"),
        json!({"agent": {"maxTokens": 256}}).to_string(),
    )
    .context("settings.json")?;
    let hub = Hub::start_with_mesh_env(&release.join("cortex-hub"), &hub_home, &env, procs)?;
    let agent_dir = scratch.join("agent");
    std::fs::create_dir_all(&agent_dir).context("the agent's dir")?;
    let _agent = Agent::start_with(
        &release.join("cortex-device-agent"),
        &hub,
        "gpu1",
        &agent_dir,
        &["--allow-exec"],
        procs,
    )?;
    let sleep = Command::new("sleep")
        .arg("3600")
        .stdin(Stdio::null())
        .spawn()
        .context("starting sleep")?;
    let pid = sleep.id();
    let sleep_index = procs.add("sleep", sleep);
    let mut armed = None;
    for attempt in 1..=ATTEMPTS {
        match wait_attempt(&hub, pid)? {
            Ok(found) => {
                armed = Some(found);
                break;
            }
            Err(why) => println!("attempt {attempt} of {ATTEMPTS}: {why}"),
        }
    }
    let Some((sid, wp, mut after)) = armed else {
        bail!("in {ATTEMPTS} fresh sessions the model never armed a wait on the process");
    };
    println!("the model armed {wp} on gpu1 for pid {pid}; ending the process");
    poll(Duration::from_secs(20), "the wait armed on gpu1", || {
        let d = hub.api_json("GET", "/api/devices/gpu1", None, 200)?;
        Ok(d["wait_list"]
            .as_array()
            .and_then(|l| {
                l.iter()
                    .find(|w| w["id"] == wp.as_str() && w["state"] == "armed")
            })
            .map(|_| ()))
    })?;
    let ended = Instant::now();
    procs.kill(sleep_index);
    let second = follow(&hub, &sid, &mut after, 1)?;
    ensure!(
        second
            .iter()
            .any(|e| e["kind"] == "wake" && e["waitpoint"]["id"] == wp.as_str()),
        "the run after the exit was not started by the wake"
    );
    println!(
        "the wake ran turn 2, ended {:.1} s after the process did",
        ended.elapsed().as_secs_f64()
    );
    println!(
        "real-model: the story holds (a tool call parsed and executed, the turn ended, the exit woke the session, the wake ran a turn)"
    );
    exec_story(&hub)?;
    println!(
        "real-model: the exec story holds (device_exec asked for approval and ran once allowed; with wait: true, the job's exit woke the session)"
    );
    typed_story(&hub, opts.base_url.is_none())?;
    Ok(())
}

/// The data schema of the typed story's answer.
fn report_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"converged": {"type": "boolean"}, "loss": {"type": "number"}},
        "required": ["converged", "loss"],
        "additionalProperties": false
    })
}

/// The worked example of the `respond` story: a report given by calling `respond`.
fn respond_example() -> Vec<Value> {
    let args = json!({"data": {"converged": false, "loss": 1.3}}).to_string();
    vec![
        json!({"role": "user", "content": "The run finished: loss 1.3, not converged. Report it."}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_ex3", "type": "function", "function": {"name": "respond", "arguments": args}}]}),
        json!({"role": "tool", "tool_call_id": "call_ex3", "content": "accepted: this answer ends your turn"}),
    ]
}

/// The third story: typed answers. A session with an output schema and no tools under
/// `native` (the server's grammar holds the reply to the envelope), then one with a tool
/// under `respond` (the answer is a `respond` call; its params are the strict envelope).
/// Checked: the run ends `ok` on the transport asked for, and its data holds the schema's
/// fields with their types (the hub validated it; the words and numbers are the model's).
/// When the story started the server itself it is known as llama.cpp, and `auto` is
/// checked too: with tools there it is `respond`.
fn typed_story(hub: &Hub, known_llamacpp: bool) -> anyhow::Result<()> {
    let text = "The training run finished: loss 0.42, and it converged. Report it.";
    let mut cases = vec![
        (
            "native",
            json!({"title": "real model, native", "instructions": "You report on training runs.",
                "policy": {"allow": []},
                "output": {"schema": report_schema(), "strategy": "native"}}),
        ),
        (
            "respond",
            json!({"title": "real model, respond", "instructions": "You report on training runs. Give your report by calling respond.",
                "examples": respond_example(), "policy": {"allow": ["wait_check"]},
                "output": {"schema": report_schema(), "strategy": "respond"}}),
        ),
    ];
    if known_llamacpp {
        cases.push((
            "respond",
            json!({"title": "real model, auto", "instructions": "You report on training runs. Give your report by calling respond.",
                "examples": respond_example(), "policy": {"allow": ["wait_check"]},
                "output": {"schema": report_schema()}}),
        ));
    }
    for (want, body) in cases {
        let mut last = String::new();
        let mut held = false;
        for attempt in 1..=ATTEMPTS {
            let (sid, _) = ask(hub, body.clone(), text)?;
            let mut after = 0;
            let seen = follow(hub, &sid, &mut after, 1)?;
            let end = seen
                .iter()
                .find(|e| e["kind"] == "run-end")
                .context("a run-end")?;
            let strategy = end["meta"]["strategy"].as_str().unwrap_or_default();
            ensure!(
                strategy == want,
                "{}: the run went by {strategy}, not {want}",
                body["title"]
            );
            let data = &end["result"]["output"]["data"];
            if end["result"]["ok"] == true
                && data["converged"].is_boolean()
                && data["loss"].is_number()
            {
                println!(
                    "typed ({}): ok by {strategy} in {} steps, {} output retries: data {data}",
                    body["title"], end["meta"]["steps"], end["meta"]["outputRetries"]
                );
                held = true;
                break;
            }
            last = format!("{}", end["result"]);
            println!(
                "typed attempt {attempt} of {ATTEMPTS} ({}): {last}",
                body["title"]
            );
        }
        ensure!(
            held,
            "{}: in {ATTEMPTS} fresh sessions no run ended ok with valid data; the last: {last}",
            body["title"]
        );
    }
    println!(
        "real-model: the typed story holds (native's grammar and respond's call each ended a run with data the schema accepts)"
    );
    Ok(())
}

/// How many fresh sessions each story gives a small model to make its call: a 135M model
/// does not always call the tool, or calls it with a wrong argument; each miss is printed.
const ATTEMPTS: usize = 3;

/// One session of the first story: the model asked to wait for `pid` on gpu1. `Ok(Err(why))`
/// when it armed nothing; else the session, the waitpoint and the log seq read so far.
#[allow(clippy::type_complexity)]
fn wait_attempt(hub: &Hub, pid: u32) -> anyhow::Result<Result<(String, String, u64), String>> {
    let text = format!("Process {pid} on device gpu1 is my training run. Wake me when it exits.");
    // A small model's context is short (2,048 tokens a slot here): show it only the tool
    // it needs.
    let session = json!({
        "title": "real model",
        "instructions": "You watch processes on devices. When asked to wait for a process, call device_wait_pid with the device and pid, then say you are waiting.",
        "examples": example(),
        "policy": {"allow": ["device_wait_pid"]},
    });
    let (sid, started) = ask(hub, session, &text)?;
    let mut after = 0;
    let first = follow(hub, &sid, &mut after, 1)?;
    println!("turn 1 ended in {:.1} s", started.elapsed().as_secs_f64());
    let calls: Vec<&Value> = first.iter().filter(|e| e["kind"] == "tool-end").collect();
    if calls.is_empty() {
        return Ok(Err(
            "the model made no tool call the hub could run (it wrote prose only)".into(),
        ));
    }
    let armed = calls.iter().find_map(|e| {
        let o = &e["observation"];
        (o["name"] == "device_wait_pid" && o["ok"] == true)
            .then(|| o["result"]["waitpoint"]["id"].as_str().map(str::to_string))
            .flatten()
    });
    let Some(wp) = armed else {
        return Ok(Err(format!(
            "the model's calls ran but none armed a wait on the process: {}",
            calls
                .iter()
                .map(|e| e["observation"].to_string())
                .collect::<Vec<_>>()
                .join("; ")
        )));
    };
    Ok(Ok((sid, wp, after)))
}

/// A worked `device_exec` call, for the second session's prefix.
fn exec_example() -> Vec<Value> {
    vec![
        json!({"role": "user", "content": "Run `sleep 2` on device box-a and wake me when it ends."}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_ex2", "type": "function", "function": {"name": "device_exec", "arguments": "{\"device\": \"box-a\", \"argv\": [\"sleep\", \"2\"], \"wait\": true}"}}]}),
        json!({"role": "tool", "tool_call_id": "call_ex2", "content": "{\"pid\": 4242, \"log\": \"/home/me/.cortex/exec/ex_1.log\", \"waitpoint\": {\"id\": \"wp_example\", \"label\": \"sleep on box-a\", \"state\": \"armed\"}}"}),
        json!({"role": "assistant", "content": "Started sleep on box-a (pid 4242); I will tell you when it ends."}),
    ]
}

/// The second story: the model starts a job on the device with `device_exec`, which asks
/// a person first (the hub's default gate); the task allows it, the job runs, and its exit
/// wakes the session. A 135M model does not always call the tool: a turn that ends in
/// prose is printed and tried again in a fresh session, up to [`ATTEMPTS`] times.
fn exec_story(hub: &Hub) -> anyhow::Result<()> {
    for attempt in 1..=ATTEMPTS {
        match exec_attempt(hub)? {
            None => return Ok(()),
            Some(why) => println!("exec attempt {attempt} of {ATTEMPTS}: {why}"),
        }
    }
    bail!("in {ATTEMPTS} fresh sessions the model never called device_exec")
}

/// One session of the exec story; `Some(why)` when the model made no call to gate.
fn exec_attempt(hub: &Hub) -> anyhow::Result<Option<String>> {
    // device_exec alone; the hub's default gate still asks before it runs.
    let session = json!({
        "title": "real model, exec",
        "instructions": "You start jobs on devices. When asked to run a command on a device, call device_exec with the device, the command as an argv list, and wait set to true, then say you started it.",
        "examples": exec_example(),
        "policy": {"allow": ["device_exec"]},
    });
    let text = "Run `sleep 4` on device gpu1 and wake me when it ends.";
    let (sid, started) = ask(hub, session, text)?;
    // The model's call parks the session on an approval (or the turn ends without one).
    let mut after = 0;
    let request = loop {
        ensure!(
            started.elapsed() < TURN,
            "no approval asked within {} s",
            TURN.as_secs()
        );
        let mut found = None;
        for e in page(hub, &sid, &mut after)? {
            if e["kind"] == "run-end" {
                return Ok(Some(
                    "the turn ended without asking to run anything (the model wrote prose)".into(),
                ));
            }
            if e["kind"] == "approval-required" {
                found = Some(e["approval"].clone());
            }
        }
        if let Some(r) = found {
            break r;
        }
    };
    ensure!(
        request["tool"] == "device_exec",
        "the approval is for {} (the model called another tool): {request}",
        request["tool"]
    );
    let listed = hub.api_json("GET", "/api/approvals", None, 200)?;
    ensure!(
        listed["approvals"]
            .as_array()
            .is_some_and(|a| a.iter().any(|p| p["id"] == request["id"])),
        "GET /api/approvals does not list {}: {listed}",
        request["id"]
    );
    println!(
        "device_exec {} waits for approval {}; allowing it",
        request["args"], request["id"]
    );
    hub.api_json(
        "POST",
        &format!("/api/sessions/{sid}/answers"),
        Some(json!({"request_id": request["id"], "decision": "allow"})),
        201,
    )?;
    let first = follow(hub, &sid, &mut after, 1)?;
    let exec = first
        .iter()
        .find(|e| e["kind"] == "tool-end" && e["observation"]["name"] == "device_exec")
        .context("no device_exec answer after the approval")?;
    let obs = &exec["observation"];
    if obs["ok"] != true {
        return Ok(Some(format!(
            "device_exec was asked for, allowed and sent, but did not start (the model's arguments): {}",
            obs["result"]
        )));
    }
    let pid = obs["result"]["pid"]
        .as_i64()
        .context("no pid in the answer")?;
    println!(
        "turn 1 ended in {:.1} s; the job runs on gpu1 as pid {pid}",
        started.elapsed().as_secs_f64()
    );
    if let Some(wp) = obs["result"]["waitpoint"]["id"].as_str() {
        // A short job may end while turn 1 still runs: its wake is then among turn 1's
        // events; either way it starts the next run.
        let second = follow(hub, &sid, &mut after, 1)?;
        let wake_seq = first
            .iter()
            .chain(second.iter())
            .find(|e| e["kind"] == "wake" && e["waitpoint"]["id"] == wp)
            .and_then(|e| e["seq"].as_u64())
            .context("the job's exit woke nothing")?;
        ensure!(
            second.iter().any(|e| e["kind"] == "run-start"
                && e["input"]
                    .as_array()
                    .is_some_and(|i| i.iter().any(|x| x["seq"] == wake_seq))),
            "the run after the job's exit was not started by its wake"
        );
        println!("the job's exit woke the session and ran turn 2");
    } else {
        println!(
            "the model started the job without wait: true; no wake to check (its answer: {})",
            obs["result"]
        );
    }
    let events = hub.api_json("GET", "/api/events", None, 200)?;
    ensure!(
        events["events"].as_array().is_some_and(|l| l
            .iter()
            .any(|e| e["kind"] == "device-exec" && e["approved_by"] == "person")),
        "the hub's events hold no device-exec approved by a person: {events}"
    );
    Ok(None)
}

/// Prints the session's events after `after` until `runs` more `run-end`s; returns them.
/// An approval asked meanwhile is denied.
fn follow(hub: &Hub, sid: &str, after: &mut u64, runs: usize) -> anyhow::Result<Vec<Value>> {
    let start = Instant::now();
    let mut seen = Vec::new();
    let mut ends = 0;
    while ends < runs {
        ensure!(
            start.elapsed() < TURN,
            "no run-end within {} s",
            TURN.as_secs()
        );
        for e in page(hub, sid, after)? {
            if e["kind"] == "run-end" {
                ends += 1;
            }
            if e["kind"] == "approval-required" {
                // Only the story's own first call is allowed (before this follows); a
                // small model's repeat of it is denied, as a person would.
                println!(
                    "  denying {} (a call after the one the story allowed)",
                    e["approval"]["id"]
                );
                hub.api_json(
                    "POST",
                    &format!("/api/sessions/{sid}/answers"),
                    Some(json!({"request_id": e["approval"]["id"], "decision": "deny"})),
                    201,
                )?;
            }
            seen.push(e);
        }
    }
    Ok(seen)
}

/// Creates a session with `body`, posts `text` to it; the session and when it was posted.
fn ask(hub: &Hub, body: Value, text: &str) -> anyhow::Result<(String, Instant)> {
    let s = hub.api_json("POST", "/api/sessions", Some(body), 201)?;
    let sid = s["id"].as_str().context("a session id")?.to_string();
    eprintln!("real-model: session {sid}; asking: {text}");
    let started = Instant::now();
    hub.api_json(
        "POST",
        &format!("/api/sessions/{sid}/messages"),
        Some(json!({ "text": text })),
        201,
    )?;
    Ok((sid, started))
}

/// The session's events after `after` (a long poll of up to 10 s), each printed in one
/// line; `after` moves past them.
fn page(hub: &Hub, sid: &str, after: &mut u64) -> anyhow::Result<Vec<Value>> {
    let page = hub.api_json(
        "GET",
        &format!("/api/sessions/{sid}/events?after={after}&wait=10"),
        None,
        200,
    )?;
    let events = page["events"].as_array().cloned().unwrap_or_default();
    for e in &events {
        *after = (*after).max(e["seq"].as_u64().unwrap_or(0));
        println!("  {}", one_line(e));
    }
    Ok(events)
}

/// An event in one line: its kind and what matters of it, cut at 160 characters.
fn one_line(e: &Value) -> String {
    let kind = e["kind"].as_str().unwrap_or("?");
    let detail = match kind {
        "message" => e["text"].to_string(),
        "model-delta" => e["text"].to_string(),
        "tool-start" => format!("{} {}", e["call"]["name"], e["call"]["args"]),
        "tool-end" => format!(
            "{} ok={} {}",
            e["observation"]["name"], e["observation"]["ok"], e["observation"]["result"]
        ),
        "wake" => format!("{} {}", e["waitpoint"]["label"], e["reason"]),
        "run-end" => format!("{} {}", e["result"], e["meta"]),
        "retry" => format!("{} {}", e["attempt"], e["issues"]),
        _ => String::new(),
    };
    let mut line = format!("{:>4} {kind} {detail}", e["seq"]);
    if let Some((i, _)) = line.char_indices().nth(160) {
        line.truncate(i);
        line.push('…');
    }
    line
}
