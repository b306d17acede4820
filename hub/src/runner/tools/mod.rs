//! The built-in tools the model sees: their specs and guides (part of a session's fixed
//! prefix), and how a call runs. A call is first *prepared* outside the store (arguments
//! parsed and checked, the fleet read, a secret drawn), then *executed* inside the write
//! that records its answer: a step's calls and their answers land together or not at
//! all, so a call is never run twice, and `wait_create` never arms a second waitpoint for
//! one call.
//!
//! `specs.rs`: the tools as the model sees them (specs, guides, hints, which a policy
//! shows); here: preparing and executing a call.

mod specs;

pub use specs::{Shown, guides, shown, specs, unknown_tool};

use cortex_protocol::api::{CreateDeviceWait, CreateWaitpoint, Question, WaitpointList};
use cortex_protocol::waits::{DurationValue, WaitCondition};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::engine::CreateParams;
use crate::model::ToolCall;
use crate::remote_wait;
use crate::secret;
use crate::state::AppState;
use crate::store::agent::{AgentRecord, SessionTimer};
use crate::store::device_waits::{CreateDeviceWaitOutcome, NewDeviceWait};
use crate::store::ops::{CancelOutcome, CreateOutcome, SpawnSetup};
use crate::store::{StoreError, Tx};
use crate::text;

/// A call made ready to run in the store.
pub enum Prepared {
    /// Already answered: an error the model sees, or a read (`devices`).
    Answer {
        ok: bool,
        result: Value,
    },
    WaitCreate {
        params: Box<CreateParams>,
        /// A `spawn` monitor's sessions' configuration.
        spawn: Option<Box<SpawnPrep>>,
        secret: String,
        hash: [u8; 32],
    },
    WaitCheck {
        id: Option<String>,
    },
    WaitCancel {
        id: String,
    },
    DeviceWait {
        new: Box<NewDeviceWait>,
        secret: String,
        hash: [u8; 32],
    },
    /// `ask_user`: the call waits for the person's answers.
    Ask {
        questions: Vec<Question>,
    },
    /// `schedule_wakeup`.
    Timer {
        name: String,
        at: u64,
        text: String,
    },
    /// Work outside the hub (`device_exec`): the runner does it between two writes.
    External,
}

impl Prepared {
    /// A call that is not run (past `limits.toolCallsPerReply`; the turn answers it).
    pub fn not_run() -> Prepared {
        error("not run")
    }
}

/// The timers one session may hold at once.
pub const MAX_TIMERS: usize = 32;
/// How far ahead a timer may be set.
pub const MAX_TIMER_AHEAD_MS: u64 = 366 * 24 * 3_600_000;
/// `ask_user`'s questions at most, and options per question.
pub const MAX_QUESTIONS: usize = 8;
pub const MAX_OPTIONS: usize = 16;

/// `device_exec`'s arguments.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecArgs {
    pub device: String,
    pub argv: Vec<String>,
    #[serde(default)]
    pub shell: bool,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub wait: bool,
    #[serde(default)]
    pub label: Option<String>,
    #[serde(default)]
    pub intent: Option<String>,
}

/// argv entries at most, and bytes in all.
pub const MAX_ARGV: usize = 256;
pub const MAX_ARGV_BYTES: usize = 64 * 1024;

impl ExecArgs {
    /// Parses and checks a `device_exec` call; the error is what the model is told.
    pub fn parse(call: &ToolCall) -> Result<ExecArgs, String> {
        let a: ExecArgs = args(call)?;
        if a.device.trim().is_empty() {
            return Err("device_exec needs \"device\": the name of an enrolled device".into());
        }
        if a.argv.is_empty() || a.argv[0].trim().is_empty() {
            return Err("device_exec needs \"argv\": the program and its arguments, e.g. [\"python3\", \"train.py\"]".into());
        }
        if a.shell && a.argv.len() != 1 {
            return Err("with shell: true, argv is one string: the shell script".into());
        }
        let bytes: usize = a.argv.iter().map(String::len).sum();
        if a.argv.len() > MAX_ARGV || bytes > MAX_ARGV_BYTES {
            return Err(format!(
                "argv is too long ({} entries, {bytes} bytes; at most {MAX_ARGV} and {MAX_ARGV_BYTES})",
                a.argv.len()
            ));
        }
        if a.argv.iter().any(|s| s.contains('\0')) {
            return Err("argv holds a NUL byte".into());
        }
        if let Some(c) = &a.cwd
            && !c.starts_with('/')
        {
            return Err(format!("cwd {c:?} is not an absolute path"));
        }
        Ok(a)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AskArgs {
    questions: Vec<Question>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TimerArgs {
    name: String,
    #[serde(default)]
    in_s: Option<f64>,
    #[serde(default)]
    at: Option<String>,
    #[serde(default)]
    text: Option<String>,
}

/// When a `schedule_wakeup` is due, from its arguments at `now`.
fn timer_due(a: &TimerArgs, now: u64) -> Result<u64, String> {
    let at = match (a.in_s, a.at.as_deref()) {
        (Some(_), Some(_)) => return Err("give in_s or at, not both".into()),
        (None, None) => return Err("give in_s (seconds from now) or at (RFC 3339)".into()),
        (Some(s), None) => {
            if !s.is_finite() || s < 0.0 {
                return Err(format!("in_s {s} is not a number of seconds ahead"));
            }
            now.saturating_add((s * 1000.0).min(u64::MAX as f64) as u64)
        }
        (None, Some(at)) => crate::time::parse_rfc3339(at)
            .ok_or_else(|| format!("at {at:?} is not a date and time like 2026-12-01T18:00:00Z"))?,
    };
    if at > now.saturating_add(MAX_TIMER_AHEAD_MS) {
        return Err("a timer may be set at most 366 days ahead".into());
    }
    Ok(at.max(now))
}

/// A call's answer.
pub struct Answered {
    pub ok: bool,
    /// As the model reads it.
    pub result: Value,
    /// A secret in `result`, handed out once: the stored copies (the transcript and the
    /// `tool-end` event) hold it replaced by [`REDACTED`].
    pub secret: Option<String>,
}

/// What stands in for a handed-out secret in what is stored.
pub const REDACTED: &str = "[secret handed out once; not kept]";

fn error(message: impl Into<String>) -> Prepared {
    Prepared::Answer {
        ok: false,
        result: json!({"error": message.into()}),
    }
}

/// Parses a call's arguments (empty means `{}`); the error is what the model is told.
fn args<T: for<'de> Deserialize<'de>>(call: &ToolCall) -> Result<T, String> {
    let raw = call.function.arguments.trim();
    let raw = if raw.is_empty() { "{}" } else { raw };
    serde_json::from_str(raw).map_err(|e| {
        format!(
            "the arguments of {} are not usable ({e}); send a JSON object with the parameters the tool lists",
            call.function.name
        )
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IdArg {
    #[serde(default)]
    id: Option<String>,
}

#[derive(Deserialize)]
struct DeviceWaitArgs {
    device: String,
    #[serde(default)]
    pid: Option<i64>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default, rename = "match")]
    pattern: Option<String>,
    #[serde(default)]
    silence: Option<DurationValue>,
    #[serde(default)]
    conditions: Option<Vec<WaitCondition>>,
    #[serde(default)]
    timeout_s: Option<f64>,
    #[serde(default)]
    label: Option<String>,
    #[serde(default)]
    intent: Option<String>,
}

/// A `spawn` monitor's sessions' configuration for `wait_create`: what `prepare` read
/// (the session's own configuration), then built with its prefix by the runner
/// ([`Prepared::build_spawn`]), which knows how a prefix is made; this module cannot,
/// since a prefix holds its guides.
pub enum SpawnPrep {
    Wanted {
        parent: Option<crate::store::agent::AgentConfig>,
        instructions: String,
    },
    Ready(SpawnSetup),
}

impl Prepared {
    /// Builds a `wait_create`'s spawn setup with `build`; a refusal is the call's answer.
    pub fn build_spawn(
        self,
        build: impl FnOnce(Option<crate::store::agent::AgentConfig>, &str) -> Result<SpawnSetup, String>,
    ) -> Prepared {
        match self {
            Prepared::WaitCreate {
                params,
                spawn: Some(prep),
                secret,
                hash,
            } => match *prep {
                SpawnPrep::Wanted {
                    parent,
                    instructions,
                } => match build(parent, &instructions) {
                    Ok(setup) => Prepared::WaitCreate {
                        params,
                        spawn: Some(Box::new(SpawnPrep::Ready(setup))),
                        secret,
                        hash,
                    },
                    Err(message) => error(message),
                },
                ready => Prepared::WaitCreate {
                    params,
                    spawn: Some(Box::new(ready)),
                    secret,
                    hash,
                },
            },
            other => other,
        }
    }
}

/// Prepares one call of session `sid`, whose model is shown `shown`.
pub async fn prepare(state: &AppState, sid: &str, call: &ToolCall, shown: &Shown) -> Prepared {
    match prepare_inner(state, sid, call, shown).await {
        Ok(p) => p,
        Err(message) => error(message),
    }
}

async fn prepare_inner(
    state: &AppState,
    sid: &str,
    call: &ToolCall,
    shown: &Shown,
) -> Result<Prepared, String> {
    let name = call.function.name.as_str();
    match name {
        "wait_create" => {
            let req: CreateWaitpoint = args(call)?;
            let spawn = match &req.spawn {
                Some(spawn) => {
                    let s = sid.to_string();
                    let parent = state
                        .store
                        .read(move |r| Ok(r.agent(&s)?.and_then(|a| a.config)))
                        .await
                        .map_err(|e| format!("this session's settings cannot be read: {e}"))?;
                    Some(Box::new(SpawnPrep::Wanted {
                        parent,
                        instructions: spawn.instructions.clone(),
                    }))
                }
                None => None,
            };
            let secret = secret::new_secret();
            let hash = secret::hash(&secret);
            Ok(Prepared::WaitCreate {
                params: Box::new(CreateParams::from(req)),
                spawn,
                secret,
                hash,
            })
        }
        "wait_check" => {
            let a: IdArg = args(call)?;
            Ok(Prepared::WaitCheck { id: a.id })
        }
        "wait_cancel" => {
            let a: IdArg = args(call)?;
            match a.id {
                Some(id) if !id.trim().is_empty() => Ok(Prepared::WaitCancel { id }),
                _ => Err("wait_cancel needs \"id\": the waitpoint to cancel".into()),
            }
        }
        "devices" => {
            let records = state
                .store
                .read(|r| r.devices_with_wait_counts())
                .await
                .map_err(|e| format!("the device list cannot be read: {e}"))?;
            let views: Vec<_> = records
                .into_iter()
                .map(|(r, n)| state.devices.view(r, n, &state.claims.hub))
                .collect();
            Ok(Prepared::Answer {
                ok: true,
                result: json!({ "devices": views }),
            })
        }
        "device_wait_pid" | "device_wait_file" | "device_wait_flock" | "device_wait_log"
        | "device_wait_any" => {
            let a: DeviceWaitArgs = args(call)?;
            let kind = name.trim_start_matches("device_wait_");
            let pid = match a.pid {
                None => None,
                Some(p) => match i32::try_from(p) {
                    Ok(p) => Some(p),
                    Err(_) => return Err(format!("pid {p} is not a process id")),
                },
            };
            let req = CreateDeviceWait {
                condition: WaitCondition {
                    kind: kind.to_string(),
                    pid,
                    path: a.path,
                    pattern: a.pattern,
                    silence: a.silence,
                    conditions: a.conditions,
                    ..WaitCondition::default()
                },
                timeout_s: a.timeout_s,
                session: Some(sid.to_string()),
                label: a.label,
                intent: a.intent,
            };
            let (new, _) =
                remote_wait::plan(&state.store.settings, &state.devices, &a.device, &req)
                    .map_err(|r| r.message)?;
            let secret = secret::new_secret();
            let hash = secret::hash(&secret);
            Ok(Prepared::DeviceWait {
                new: Box::new(new),
                secret,
                hash,
            })
        }
        "ask_user" => {
            let a: AskArgs = args(call)?;
            if a.questions.is_empty() || a.questions.len() > MAX_QUESTIONS {
                return Err(format!(
                    "ask_user needs 1 to {MAX_QUESTIONS} questions, got {}",
                    a.questions.len()
                ));
            }
            for q in &a.questions {
                if q.question.trim().is_empty() {
                    return Err("a question is empty".into());
                }
                if q.options.len() > MAX_OPTIONS {
                    return Err(format!("a question offers more than {MAX_OPTIONS} options"));
                }
            }
            Ok(Prepared::Ask {
                questions: a.questions,
            })
        }
        "schedule_wakeup" => {
            let a: TimerArgs = args(call)?;
            let name = a.name.trim().to_string();
            if name.is_empty() || name.chars().count() > 100 {
                return Err("name must be 1 to 100 characters".into());
            }
            let now = crate::time::now_ms();
            let at = timer_due(&a, now)?;
            if crate::caps::timer_too_soon(at, now, &state.store.limits) {
                return Err(crate::caps::timer_refused(
                    at.saturating_sub(now),
                    &state.store.limits,
                ));
            }
            let text = a
                .text
                .clone()
                .filter(|t| !t.trim().is_empty())
                .unwrap_or_else(|| format!("The timer {name:?} you set fired."));
            if text.len() > cortex_protocol::api::MAX_TEXT_BYTES {
                return Err("text is too long".into());
            }
            Ok(Prepared::Timer { name, at, text })
        }
        "device_exec" => {
            ExecArgs::parse(call)?;
            Ok(Prepared::External)
        }
        other => Err(unknown_tool(other, shown)),
    }
}

/// Runs a prepared call of session `sid` (row `rec`, which the caller saves) inside the
/// store's write. `Ask` and `External` are the turn's to handle; here they are errors.
pub fn execute(
    t: &mut Tx<'_>,
    sid: &str,
    rec: &mut AgentRecord,
    p: Prepared,
    signal_url: &str,
    now: u64,
) -> Result<Answered, StoreError> {
    let plain = |ok: bool, result: Value| Answered {
        ok,
        result,
        secret: None,
    };
    if let Some(why) = capped(t, sid, &p, now)? {
        return Ok(plain(false, json!({ "error": why })));
    }
    Ok(match p {
        Prepared::Answer { ok, result } => plain(ok, result),
        Prepared::Ask { .. } | Prepared::External => plain(
            false,
            json!({"error": "this call cannot run here (an internal error of the hub)"}),
        ),
        Prepared::Timer { name, at, text } => {
            let replaced = rec.timers.iter().any(|t| t.name == name);
            if !replaced && rec.timers.len() >= MAX_TIMERS {
                plain(
                    false,
                    json!({"error": format!("this session holds {MAX_TIMERS} timers, the most it may; let one fire or set one of the same name to move it")}),
                )
            } else {
                let set_seq = t.get_session(sid)?.map_or(0, |s| s.last_seq);
                t.set_timer(
                    sid,
                    rec,
                    SessionTimer {
                        name: name.clone(),
                        at,
                        text,
                        set_seq,
                        due: false,
                    },
                )?;
                plain(
                    true,
                    json!({"name": name, "at": crate::time::rfc3339(at), "in_s": at.saturating_sub(now) / 1000, "replaced": replaced, "note": "it fires when no turn is running; end your turn"}),
                )
            }
        }
        Prepared::WaitCreate {
            params,
            spawn,
            secret,
            hash,
        } => match t.create_waitpoint_spawning(
            sid,
            *params,
            hash,
            match spawn.map(|b| *b) {
                Some(SpawnPrep::Ready(setup)) => Some(setup),
                // Not built: the store refuses the spawn, and the model is told.
                Some(SpawnPrep::Wanted { .. }) | None => None,
            },
            now,
        )? {
            CreateOutcome::Created(wp) => {
                let created = text::waitpoint_created(&wp, secret.clone(), signal_url);
                Answered {
                    ok: true,
                    result: serde_json::to_value(created)
                        .map_err(|e| StoreError::Decode(e.to_string()))?,
                    secret: Some(secret),
                }
            }
            CreateOutcome::NoSession => plain(false, json!({"error": "this session is gone"})),
            CreateOutcome::NoDevice(d) => plain(
                false,
                json!({"error": format!("no device named {d:?}{}", Shown::of_record(rec).devices_hint())}),
            ),
            CreateOutcome::Invalid(e) => plain(false, json!({"error": e.to_string()})),
        },
        Prepared::WaitCheck { id: None } => {
            let settings = t.settings().clone();
            match t.session_waitpoints(sid, now, &settings)? {
                Some(waitpoints) => plain(
                    true,
                    serde_json::to_value(WaitpointList { waitpoints })
                        .map_err(|e| StoreError::Decode(e.to_string()))?,
                ),
                None => plain(false, json!({"error": "this session is gone"})),
            }
        }
        Prepared::WaitCheck { id: Some(id) } => {
            let settings = t.settings().clone();
            match t.waitpoint(&id, now, &settings)? {
                Some(v) if v.head.session == sid => plain(
                    true,
                    serde_json::to_value(v).map_err(|e| StoreError::Decode(e.to_string()))?,
                ),
                _ => plain(
                    false,
                    json!({"error": format!("this session has no waitpoint {id:?}; call wait_check without id to list them")}),
                ),
            }
        }
        Prepared::WaitCancel { id } => match t.cancel_waitpoint(&id, Some(sid), "agent", now)? {
            CancelOutcome::Cancelled => plain(true, json!({"id": id, "state": "cancelled"})),
            CancelOutcome::AlreadyEnded(s) => plain(
                false,
                json!({"error": format!("waitpoint {id} already ended ({})", s.as_str())}),
            ),
            CancelOutcome::NotFound => plain(
                false,
                json!({"error": format!("this session has no waitpoint {id:?}")}),
            ),
        },
        Prepared::DeviceWait { new, secret, hash } => {
            let device = new.device.clone();
            match t.create_device_wait(*new, hash, now)? {
                CreateDeviceWaitOutcome::Created { waitpoint, .. } => {
                    // The secret signs the device agent's report; the model needs none.
                    drop(secret);
                    plain(
                        true,
                        json!({"waitpoint": {
                            "id": waitpoint.id,
                            "label": waitpoint.label,
                            "state": waitpoint.state.as_str(),
                            "device": device,
                        }}),
                    )
                }
                CreateDeviceWaitOutcome::NoDevice => plain(
                    false,
                    json!({"error": format!("there is no device {device:?}{}", Shown::of_record(rec).devices_hint())}),
                ),
                CreateDeviceWaitOutcome::NoSession => {
                    plain(false, json!({"error": "this session is gone"}))
                }
                CreateDeviceWaitOutcome::TooMany => plain(
                    false,
                    json!({"error": format!("device {device} holds too many remote waits; cancel some first")}),
                ),
                CreateDeviceWaitOutcome::Invalid(e) => {
                    plain(false, json!({"error": e.to_string()}))
                }
            }
        }
    })
}

/// Why a call that arms a waitpoint may not (`limits`): the session holds the most it
/// may armed, or the spawn it asks for is too deep or past its root's hour.
fn capped(t: &Tx<'_>, sid: &str, p: &Prepared, now: u64) -> Result<Option<String>, StoreError> {
    let spawns = match p {
        Prepared::WaitCreate { spawn, .. } => spawn.is_some(),
        Prepared::DeviceWait { .. } => false,
        _ => return Ok(None),
    };
    let armed = t.armed_count(sid)?;
    if armed >= t.limits().armed_waitpoints_per_session as usize {
        return Ok(Some(crate::caps::armed_refused(armed, t.limits())));
    }
    if spawns {
        let (gate, _) = t.spawn_gate(sid, now)?;
        if gate.limit().is_some() {
            return Ok(Some(crate::caps::spawn_refused(gate, t.limits(), true)));
        }
    }
    Ok(None)
}

/// Why a `device_exec` with `wait: true` may not start: the session holds the most
/// waitpoints it may armed, and the job's pid wait would be one more.
pub fn exec_capped(t: &Tx<'_>, sid: &str, call: &ToolCall) -> Result<Option<String>, StoreError> {
    if !ExecArgs::parse(call).is_ok_and(|a| a.wait) {
        return Ok(None);
    }
    let armed = t.armed_count(sid)?;
    Ok((armed >= t.limits().armed_waitpoints_per_session as usize)
        .then(|| crate::caps::armed_refused(armed, t.limits())))
}

/// `result` as stored: the secret replaced.
pub fn redacted(result: &Value, secret: Option<&str>) -> Value {
    let Some(secret) = secret.filter(|s| !s.is_empty()) else {
        return result.clone();
    };
    match result {
        Value::String(s) => Value::String(s.replace(secret, REDACTED)),
        Value::Array(a) => Value::Array(a.iter().map(|v| redacted(v, Some(secret))).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), redacted(v, Some(secret))))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_never_stored() {
        let v = json!({"secret": "abc123", "how_to_signal": {"cli": "cortex-signal --secret abc123", "n": 3}});
        let r = redacted(&v, Some("abc123"));
        let text = r.to_string();
        assert!(!text.contains("abc123"), "{text}");
        assert_eq!(r["how_to_signal"]["n"], 3);
        assert_eq!(r["secret"], REDACTED);
        assert_eq!(redacted(&v, None), v);
    }
}
