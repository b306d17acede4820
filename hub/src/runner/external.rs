//! Tool calls whose work is outside the hub: `device_exec` starts a command on a device
//! through its agent. The work runs between two writes: the first marks the call started
//! (so a crash in between is known), the work goes out, and the second ([`finish`])
//! records what came of it (for a job to be waited on, the pid wait armed on it, in the
//! same write) and answers the call.
//!
//! The work's identity, the exec id, comes from the session and the call: made again
//! after a crash, it reaches the same job on the device (which answers "already
//! started") instead of starting a second.

use std::time::Duration;

use cortex_protocol::api::{CreateDeviceWait, HubEventBody};
use cortex_protocol::mesh::WaitSpec;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::tools::{Answered, ExecArgs};
use crate::mesh::exec::{ExecRequest, ExecStarted};
use crate::model::ToolCall;
use crate::remote_wait;
use crate::secret;
use crate::state::AppState;
use crate::store::agent::OpenCall;
use crate::store::device_waits::{CreateDeviceWaitOutcome, NewDeviceWait};
use crate::store::{StoreError, Tx};

/// How long the runner waits for a device to say it started a command.
pub const EXEC_ANSWER_TIMEOUT: Duration = Duration::from_secs(15);

/// What the work outside the hub came to, for [`finish`] to record.
pub enum Outside {
    /// The call's answer as it is (its arguments were not usable).
    Answer(Answered),
    /// The device refused, or could not be reached.
    Failed {
        device: String,
        argv: Vec<String>,
        error: String,
    },
    /// The command runs on the device.
    Started {
        device: String,
        argv: Vec<String>,
        started: ExecStarted,
        exec_id: String,
        /// The pid wait to arm on it (`wait: true`), with its secret's hash.
        wait: Option<(Box<NewDeviceWait>, [u8; 32])>,
    },
}

/// The exec id of call `call_id` of session `sid`: the same after every restart.
pub fn exec_id(sid: &str, call_id: &str) -> String {
    let h = Sha256::digest(format!("{sid}\u{0}{call_id}").as_bytes());
    let hex: String = h.iter().take(12).map(|b| format!("{b:02x}")).collect();
    format!("ex_{hex}")
}

/// The waitpoint id a started job is told (`CORTEX_SIGNAL_ID`), chosen before it exists.
fn waitpoint_id(exec_id: &str) -> String {
    let h = Sha256::digest(format!("wp\u{0}{exec_id}").as_bytes());
    let hex: String = h.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("wp_{hex}")
}

fn error(message: impl Into<String>) -> Outside {
    Outside::Answer(Answered {
        ok: false,
        result: json!({"error": message.into()}),
        secret: None,
    })
}

/// Does the outside work of `call` of session `sid`.
pub async fn run(state: &AppState, sid: &str, call: &ToolCall) -> Outside {
    match call.function.name.as_str() {
        "device_exec" => exec(state, sid, call).await,
        other => error(format!("{other} has no work outside the hub")),
    }
}

async fn exec(state: &AppState, sid: &str, call: &ToolCall) -> Outside {
    let a = match ExecArgs::parse(call) {
        Ok(a) => a,
        Err(e) => return error(e),
    };
    let exec_id = exec_id(sid, &call.id);
    let mut env = Vec::new();
    let mut wait = None;
    let mut secret_text = None;
    if a.wait {
        // The pid is known only once it runs: the wait is checked now (so a refusal
        // starts nothing) and armed in the write that records the start.
        let req = CreateDeviceWait {
            kind: "pid".into(),
            pid: Some(1),
            start_time: None,
            path: None,
            timeout_s: None,
            session: Some(sid.to_string()),
            label: a.label.clone(),
            intent: a.intent.clone(),
            ..CreateDeviceWait::default()
        };
        let (mut new, _) =
            match remote_wait::plan(&state.store.settings, &state.devices, &a.device, &req) {
                Ok(p) => p,
                Err(r) => return error(r.message),
            };
        let program = a.argv.first().cloned().unwrap_or_default();
        if a.label.as_deref().is_none_or(|l| l.trim().is_empty()) {
            new.label = format!("{program} on {}", a.device);
        }
        if a.intent.as_deref().is_none_or(|i| i.trim().is_empty()) {
            new.intent = format!("act on how {program} on {} ended", a.device);
        }
        let id = waitpoint_id(&exec_id);
        new.waitpoint_id = Some(id.clone());
        let s = secret::new_secret();
        env.push(("CORTEX_SIGNAL_ID".to_string(), id));
        env.push(("CORTEX_SIGNAL_SECRET".to_string(), s.clone()));
        wait = Some((Box::new(new), secret::hash(&s)));
        secret_text = Some(s);
    }
    let req = ExecRequest {
        exec_id: exec_id.clone(),
        argv: a.argv.clone(),
        shell: a.shell,
        cwd: a.cwd.clone(),
        env,
        timeout: EXEC_ANSWER_TIMEOUT,
    };
    let outcome = crate::mesh::exec::exec(state, &a.device, req).await;
    drop(secret_text);
    match outcome {
        Ok(started) => Outside::Started {
            device: a.device,
            argv: a.argv,
            started,
            exec_id,
            wait,
        },
        Err(e) => Outside::Failed {
            device: a.device,
            argv: a.argv,
            error: e.to_string(),
        },
    }
}

/// Records what the outside work of `call` (session `sid`) came to, inside the write that
/// answers it: the hub's event, and for a started job to be waited on, its pid wait.
pub fn finish(
    t: &mut Tx<'_>,
    sid: &str,
    call: &OpenCall,
    outside: Outside,
    now: u64,
) -> Result<Answered, StoreError> {
    let approved_by = call.approved_by.clone().unwrap_or_else(|| "policy".into());
    let answer = |ok: bool, result: serde_json::Value| Answered {
        ok,
        result,
        secret: None,
    };
    Ok(match outside {
        Outside::Answer(a) => a,
        Outside::Failed {
            device,
            argv,
            error,
        } => {
            t.append_hub_event(
                HubEventBody::DeviceExec {
                    device,
                    session: sid.to_string(),
                    call_id: call.call.id.clone(),
                    argv,
                    approved_by,
                    pid: None,
                    error: Some(error.clone()),
                },
                now,
            )?;
            answer(false, json!({"error": error}))
        }
        Outside::Started {
            device,
            argv,
            started,
            exec_id,
            wait,
        } => {
            t.append_hub_event(
                HubEventBody::DeviceExec {
                    device: device.clone(),
                    session: sid.to_string(),
                    call_id: call.call.id.clone(),
                    argv,
                    approved_by,
                    pid: Some(started.pid),
                    error: None,
                },
                now,
            )?;
            let mut result = json!({
                "pid": started.pid,
                "log": started.log,
                "device": device,
                "exec_id": exec_id,
            });
            if started.already {
                result["note"] =
                    json!("it had been started before under this call; this is that run");
            }
            if let Some((mut new, hash)) = wait {
                new.spec = WaitSpec::Pid {
                    pid: started.pid,
                    start_time: Some(started.start_time),
                    must_exist: false,
                };
                match t.create_device_wait(*new, hash, now)? {
                    CreateDeviceWaitOutcome::Created { waitpoint, .. } => {
                        result["waitpoint"] = json!({
                            "id": waitpoint.id,
                            "label": waitpoint.label,
                            "state": waitpoint.state.as_str(),
                            "device": device,
                        });
                        result["note"] = json!("end your turn: you are woken when it exits");
                    }
                    other => {
                        let why = match other {
                            CreateDeviceWaitOutcome::NoDevice => "the device is gone".to_string(),
                            CreateDeviceWaitOutcome::NoSession => "this session is gone".into(),
                            CreateDeviceWaitOutcome::TooMany => {
                                "the device holds too many remote waits".into()
                            }
                            CreateDeviceWaitOutcome::Invalid(e) => e.to_string(),
                            CreateDeviceWaitOutcome::Created { .. } => String::new(),
                        };
                        let shown = t
                            .agent(sid)?
                            .map(|r| super::tools::Shown::of_record(&r))
                            .unwrap_or_else(|| super::tools::Shown::of(&Default::default()));
                        let next = if shown.has("device_wait_pid") {
                            format!("call device_wait_pid with pid {}", started.pid)
                        } else {
                            format!(
                                "its pid is {}; nothing will wake you when it exits",
                                started.pid
                            )
                        };
                        result["wait_error"] = json!(format!(
                            "it runs, but its wait could not be armed ({why}); {next}"
                        ));
                    }
                }
            }
            answer(true, result)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exec_has_one_identity_per_call() {
        let a = exec_id("ses_1", "call_1");
        assert_eq!(a, exec_id("ses_1", "call_1"), "the same after a restart");
        assert_ne!(a, exec_id("ses_1", "call_2"));
        assert_ne!(a, exec_id("ses_2", "call_1"));
        assert!(a.starts_with("ex_") && a.len() == 27, "{a}");
        let w = waitpoint_id(&a);
        assert!(w.starts_with("wp_") && w.len() == 15, "{w}");
    }
}
