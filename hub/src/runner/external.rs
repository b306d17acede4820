//! Tool calls whose work is outside the hub: `device_exec` starts a command on a device
//! through its agent. The work runs between two writes: the first marks the call started
//! (so a crash in between is known), the work goes out, and the second ([`finish`])
//! records what came of it (for a job to be waited on, the pid wait armed on it, in the
//! same write) and answers the call.
//!
//! The work's identity, the exec id, comes from the session and the call: made again
//! after a crash, it reaches the same job on the device (which answers "already
//! started") instead of starting a second.
//!
//! A fate is never misreported. Asked again (the call was marked started by an earlier
//! write, so an earlier ask may have reached the device), no "nothing was started" of
//! this ask stands for the run: a device offline now is recorded "state unknown" with the
//! exec id at once, waited for within the device-loss grace (`deviceLossGraceMs`), and
//! asked again under the same id when it is back (its agent answers with the run it
//! holds); past the grace the answer stays "state unknown". A cancel does not cut an ask
//! that went out: the device's answer (bounded by [`EXEC_ANSWER_TIMEOUT`]) is recorded
//! first, then the cancel is taken. Only an ask a cancel stopped before it left the hub
//! ([`Outside::NotSent`]) records nothing.

use std::time::Duration;

use cortex_protocol::api::{CreateDeviceWait, HubEventBody};
use cortex_protocol::mesh::{ExecRequest, WaitSpec};
use cortex_protocol::waits::WaitCondition;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::tools::{Answered, ExecArgs};
use crate::mesh::exec::{ExecError, ExecStarted, secs};
use crate::model::ToolCall;
use crate::remote_wait;
use crate::secret;
use crate::state::AppState;
use crate::stops::Listener;
use crate::store::agent::OpenCall;
use crate::store::device_waits::{CreateDeviceWaitOutcome, NewDeviceWait};
use crate::store::{StoreError, Tx};

/// How long the runner waits for a device to say it started a command.
pub const EXEC_ANSWER_TIMEOUT: Duration = Duration::from_secs(15);

/// What the work outside the hub came to, for [`finish`] to record.
pub enum Outside {
    /// The call's answer as it is (its arguments were not usable).
    Answer(Answered),
    /// A cancel came before the ask left the hub (and no earlier ask was made): nothing
    /// went out, nothing is recorded; the call is as before it started.
    NotSent,
    /// The device refused, could not be reached, or did not answer (`error` says which,
    /// and whether the command may have started).
    Failed {
        device: String,
        argv: Vec<String>,
        exec_id: String,
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

/// Does the outside work of `call` of session `sid`; `again`: it was begun before (an
/// earlier ask may have reached the device). `stop` is the session's cancel bell.
pub async fn run(
    state: &AppState,
    sid: &str,
    call: &ToolCall,
    again: bool,
    stop: &mut Listener,
) -> Outside {
    match call.function.name.as_str() {
        "device_exec" => exec(state, sid, call, again, stop).await,
        other => error(format!("{other} has no work outside the hub")),
    }
}

async fn exec(
    state: &AppState,
    sid: &str,
    call: &ToolCall,
    again: bool,
    stop: &mut Listener,
) -> Outside {
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
            condition: WaitCondition {
                kind: "pid".into(),
                pid: Some(1),
                ..WaitCondition::default()
            },
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
        timeout_ms: EXEC_ANSWER_TIMEOUT.as_millis() as u64,
    };
    if !again && stop.heard() {
        // The cancel's item is in the inbox and nothing went out: the boundary takes it.
        return Outside::NotSent;
    }
    let outcome = match crate::mesh::exec::exec(state, &a.device, req.clone()).await {
        // Asked before, or the link dropped with this ask on it: the device may hold the
        // run, and only it can say.
        Err(e) if again || matches!(e, ExecError::LinkLost { .. }) => {
            let asked = Asked {
                sid,
                call_id: &call.id,
                device: &a.device,
                argv: &a.argv,
            };
            reask(state, &asked, req, e, stop).await
        }
        other => other,
    };
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
            exec_id,
            error: e.to_string(),
        },
    }
}

/// A call asked again, for [`reask`].
struct Asked<'a> {
    sid: &'a str,
    call_id: &'a str,
    device: &'a str,
    argv: &'a [String],
}

/// The ask of a call begun before came to `first`: while the device is offline, its fate
/// is unknown. That is recorded at once (a `device-exec` event, `state unknown` with the
/// exec id); the device is waited for within the device-loss grace and asked again under
/// the same id when it is back, on this hub or (on a shared store) another. The result never says nothing was started.
async fn reask(
    state: &AppState,
    asked: &Asked<'_>,
    req: ExecRequest,
    first: ExecError,
    stop: &mut Listener,
) -> Result<ExecStarted, ExecError> {
    let exec_id = req.exec_id.clone();
    let unknown = |why: String| ExecError::Unknown {
        device: asked.device.to_owned(),
        exec_id: exec_id.clone(),
        why,
    };
    let mut err = first;
    let mut until = None;
    loop {
        let away = match &err {
            ExecError::Offline { .. } => format!(
                "device {} is offline, and it was asked before (by a hub that stopped, or over a link that dropped)",
                asked.device
            ),
            ExecError::LinkLost { .. } => format!(
                "the link to device {} dropped before it answered",
                asked.device
            ),
            _ => return Err(err.reasked(&exec_id)),
        };
        let (until, grace) = match until {
            Some(u) => u,
            None => {
                let grace = Duration::from_millis(
                    state
                        .store
                        .exec(|t| t.loss_grace())
                        .await
                        .unwrap_or(crate::config::DEFAULT_DEVICE_LOSS_GRACE_MS),
                );
                let waiting = unknown(format!(
                    "{away}; waiting up to {} (deviceLossGraceMs) for it to reconnect, to ask it again under the same id",
                    secs(grace)
                ));
                note(state, asked, &exec_id, waiting.to_string()).await;
                *until.insert((tokio::time::Instant::now() + grace, grace))
            }
        };
        let linked = tokio::select! {
            l = crate::mesh::exec::wait_linked(state, asked.device, until) => l,
            () = stop.rung() => {
                return Err(unknown(format!(
                    "a cancel stopped the wait for device {} to reconnect",
                    asked.device
                )));
            }
        };
        if !linked {
            return Err(unknown(format!(
                "device {} was asked before and stayed offline for {} (deviceLossGraceMs)",
                asked.device,
                secs(grace)
            )));
        }
        err = match crate::mesh::exec::exec(state, asked.device, req.clone()).await {
            Ok(started) => return Ok(started),
            Err(e) => e,
        };
    }
}

/// Records, before the answer is known, that the run of `asked` is in an unknown state.
async fn note(state: &AppState, asked: &Asked<'_>, exec_id: &str, error: String) {
    let (sid, call_id, device, argv, exec_id) = (
        asked.sid.to_owned(),
        asked.call_id.to_owned(),
        asked.device.to_owned(),
        asked.argv.to_vec(),
        exec_id.to_owned(),
    );
    let wrote = state
        .store
        .exec(move |t| {
            let approved_by = t
                .agent(&sid)?
                .and_then(|r| {
                    r.open
                        .into_iter()
                        .find(|o| o.call.id == call_id)
                        .and_then(|o| o.approved_by)
                })
                .unwrap_or_else(|| "policy".into());
            t.append_hub_event(
                HubEventBody::DeviceExec {
                    device,
                    session: sid,
                    call_id,
                    argv,
                    approved_by,
                    exec_id: Some(exec_id),
                    pid: None,
                    error: Some(error),
                },
                crate::time::now_ms(),
            )
        })
        .await;
    if let Err(e) = wrote {
        tracing::error!(error = %e, "cannot record a device exec's unknown state");
    }
}

/// What a call begun on the device and ended before its answer came is recorded as (a
/// cancel or an unattended end took it): `state unknown` with its exec id, the
/// `device-exec` event in the same write as the call's answer.
pub fn unknown_end(
    t: &mut Tx<'_>,
    sid: &str,
    call: &OpenCall,
    why: &str,
    now: u64,
) -> Result<serde_json::Value, StoreError> {
    let exec_id = exec_id(sid, &call.call.id);
    let (device, argv) = ExecArgs::parse(&call.call)
        .map(|a| (a.device, a.argv))
        .unwrap_or_default();
    let error = ExecError::Unknown {
        device: device.clone(),
        exec_id: exec_id.clone(),
        why: format!("{why} before the device answered"),
    }
    .to_string();
    t.append_hub_event(
        HubEventBody::DeviceExec {
            device,
            session: sid.to_string(),
            call_id: call.call.id.clone(),
            argv,
            approved_by: call.approved_by.clone().unwrap_or_else(|| "policy".into()),
            exec_id: Some(exec_id.clone()),
            pid: None,
            error: Some(error.clone()),
        },
        now,
    )?;
    Ok(json!({"error": error, "exec_id": exec_id}))
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
        // `external_done` never finishes one (the call is put back as not started).
        Outside::NotSent => answer(false, json!({"error": "not sent: a cancel came first"})),
        Outside::Failed {
            device,
            argv,
            exec_id,
            error,
        } => {
            t.append_hub_event(
                HubEventBody::DeviceExec {
                    device,
                    session: sid.to_string(),
                    call_id: call.call.id.clone(),
                    argv,
                    approved_by,
                    exec_id: Some(exec_id.clone()),
                    pid: None,
                    error: Some(error.clone()),
                },
                now,
            )?;
            answer(false, json!({"error": error, "exec_id": exec_id}))
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
                    exec_id: Some(exec_id.clone()),
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
