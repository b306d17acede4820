//! The tools an MCP client is offered and how a call runs: the hub's own model tools,
//! under the same names and parameters, run as the runner runs them (prepared, then
//! executed in the write that records them) in the caller's session, plus `wait_for`.
//! Their metadata is static: nothing a device or a job wrote is in it.

use cortex_protocol::api::Policy;
use serde_json::{Value, json};

use crate::model::{FunctionCall, ToolCall};
use crate::runner::{self, tools};
use crate::state::AppState;
use crate::store::agent::AgentRecord;
use crate::time::now_ms;

/// What an MCP client is told each tool does (the parameters are the model tools').
const OFFERED: &[(&str, &str)] = &[
    (
        "wait_create",
        "Arm a waitpoint: a durable 'wake me when this finishes'. Returns its id, a one-time secret and ready-to-paste lines (how_to_signal) for the job to report with. Hand the recommended line to the job, then call wait_for with the id.",
    ),
    (
        "wait_check",
        "Show this connection's waitpoints (or one, by id): state, signals so far, expiry. Never the secret.",
    ),
    (
        "wait_cancel",
        "Cancel one of this connection's armed waitpoints.",
    ),
    (
        "devices",
        "List the devices (other machines) with their state (online or offline), host and active waits, to choose one for a device_wait_* call.",
    ),
    (
        "device_wait_pid",
        "Wait for a process on a device to exit. Answers with the waitpoint (or, when your client takes tasks, a task that completes with the exit); then call wait_for with its id.",
    ),
    (
        "device_wait_file",
        "Wait for a file on a device to be written and closed; with silence, for it to stop growing for that long. Answers with the waitpoint (or a task that completes when it happens).",
    ),
    (
        "device_wait_flock",
        "Wait for a lock file on a device to be free (flock). Answers with the waitpoint (or a task that completes when it is free).",
    ),
    (
        "device_wait_log",
        "Wait for a line matching a regular expression to be appended to a log on a device (only lines written after this call count), or, with silence, for the log to go quiet. Answers with the waitpoint (or a task that completes with the line).",
    ),
    (
        "device_exec",
        "Start a command on a device (a training run, a build), detached, its output in a log on the device. Answers with its pid and the log's path; with wait: true it also arms a pid wait on it (then wait_for its waitpoint). The hub's policy decides whether a person must approve it first: asked through your client where it can ask, otherwise on the hub's page or with `cortex answer`; until then the call waits, and says so when it has waited long; nothing starts unapproved.",
    ),
    (
        "device_wait_any",
        "Wait for whichever of several conditions on one device holds first (a process exiting, a log line, a file going quiet); the wake says which. Answers with the waitpoint (or a task).",
    ),
];

/// `wait_for`'s description and parameters.
pub const WAIT_FOR: &str = "wait_for";

/// How long one blocking `wait_for` waits at most before it answers "still waiting"
/// (under the clients' own cut: Codex's 300 s, Claude Code's ~6 min).
pub const BLOCK_MAX_S: u64 = 240;

/// The tools, in a fixed order: each with its description and input schema.
pub fn offered() -> Vec<(String, String, Value)> {
    let specs = tools::specs();
    let mut out: Vec<(String, String, Value)> = OFFERED
        .iter()
        .filter_map(|(name, description)| {
            specs.iter().find(|s| s.name == *name).map(|s| {
                (
                    s.name.clone(),
                    description.to_string(),
                    s.parameters.clone(),
                )
            })
        })
        .collect();
    // A call that may wait on a person says how long it may block, as wait_for does.
    if let Some((_, _, schema)) = out.iter_mut().find(|(n, _, _)| n == "device_exec") {
        schema["properties"]["timeout_s"] = json!({"type": "number", "description": format!("how long this call may wait for a person's approval before it answers 'still waiting' (default and most: {BLOCK_MAX_S}); not the command's")});
    }
    out.push((
        WAIT_FOR.into(),
        format!("Wait for a waitpoint of this connection to wake (fire, fail, time out, go silent) and answer with its wake: the job's report, framed as data. Where your client takes tasks this is a task that completes at the wake, however long it takes; otherwise the call waits at most timeout_s (at most {BLOCK_MAX_S} s) and then says it is still waiting: call it again with the same id."),
        json!({
            "type": "object",
            "properties": {
                "id": {"type": "string", "description": "the waitpoint's id (wait_create's or a device_wait_* call's)"},
                "timeout_s": {"type": "number", "description": format!("how long this call may wait before it answers 'still waiting' (default and most: {BLOCK_MAX_S})")},
                "after_seq": {"type": "integer", "description": "for a monitor (max_signals above 1): the seq of the last wake you saw; the next one after it answers (optional)"}
            },
            "required": ["id"]
        }),
    ));
    out
}

/// Whether `name` is a remote wait (which may be a task).
pub fn is_remote_wait(name: &str) -> bool {
    name.starts_with("device_wait_")
}

/// A call's answer, as the client reads it.
pub struct Answer {
    pub ok: bool,
    pub value: Value,
}

/// Runs tool `name` (not `wait_for`) with `args` in session `sid`, as the runner would.
pub async fn run(state: &AppState, sid: &str, name: &str, args: &Value) -> Answer {
    if !OFFERED.iter().any(|(n, _)| *n == name) {
        return Answer {
            ok: false,
            value: json!({"error": format!("there is no tool {name:?}; tools/list names them")}),
        };
    }
    let call = ToolCall {
        id: format!("mcp_{}", crate::secret::random_hex(6)),
        kind: "function".into(),
        function: FunctionCall {
            name: name.to_string(),
            arguments: args.to_string(),
        },
    };
    let shown = tools::Shown::of(&Policy::default());
    let prepared = runner::prepare_call(state, sid, &call, &shown).await;
    let (s, url) = (sid.to_string(), state.signal_url.clone());
    let done = state
        .store
        .exec(move |t| {
            let mut rec = t.agent(&s)?.unwrap_or_else(AgentRecord::mailbox);
            let a = tools::execute(t, &s, &mut rec, prepared, &url, now_ms())?;
            Ok(a)
        })
        .await;
    match done {
        Ok(a) => Answer {
            ok: a.ok,
            value: a.result,
        },
        Err(e) => Answer {
            ok: false,
            value: json!({"error": format!("the hub's store failed: {e}; try again")}),
        },
    }
}

/// The waitpoint id in a remote wait's answer.
pub fn waitpoint_of(answer: &Value) -> Option<String> {
    answer["waitpoint"]["id"]
        .as_str()
        .or_else(|| answer["id"].as_str())
        .map(str::to_string)
}
