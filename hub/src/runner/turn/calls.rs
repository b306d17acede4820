//! A reply's tool calls, answered in the model's order: each announced, gated, then run;
//! the first that waits on a person parks the session until the answer comes. Also how the
//! open calls are closed when a turn stops (a cancel, or a person needed and nobody there).

use std::collections::HashMap;

use cortex_protocol::api::{
    AnswerItem, Decision, EventBody, Observation, PendingRequest, Question, RunResult, ToolCallView,
};
use serde_json::json;

use crate::model::{ChatMessage, ToolCall};
use crate::runner::decide::{self, Admit, Prep, Run};
use crate::runner::gate;
use crate::runner::rules;
use crate::runner::tools;
use crate::store::agent::{AgentConfig, AgentRecord};
use crate::store::{StoreError, Tx};

use super::run::{Env, Unredacted, end_run, event, failed, run_of};

/// How far [`advance`] got with the open calls.
pub(super) enum Progress {
    /// All answered.
    Done,
    /// The first waits on a person.
    Parked,
    /// The run ended (it needed a person and nobody is there).
    Ended,
    /// These calls need preparing before they can run.
    Prepare(Vec<ToolCall>),
    /// This call's work is outside the hub; `true`: it was begun before.
    External(ToolCall, bool),
}

/// Answers the open calls in order: each is announced (`tool-start`), gated, then run
/// from `prepared`. Stops at the first that waits on a person, that is not prepared, or
/// whose work is outside the hub.
pub(super) fn advance(
    t: &mut Tx<'_>,
    sid: &str,
    rec: &mut AgentRecord,
    config: &AgentConfig,
    env: &Env<'_>,
    prepared: &mut HashMap<String, tools::Prepared>,
    unredacted: &mut Vec<Unredacted>,
) -> Result<Progress, StoreError> {
    let now = env.now;
    while let Some(first) = rec.open.first().cloned() {
        let name = first.call.function.name.clone();
        announce_first(t, sid, rec, now)?;
        let always = rec.always.contains(&name);
        let gate = || gate::gate(&config.policy, &rec.always, &name);
        match decide::admit(
            first.refused.is_some(),
            first.allowed,
            config.unattended,
            always,
            gate,
        ) {
            Admit::Refused => {
                // The calls past the reply's cap (its last ones): each announced and
                // answered with the reason, in order.
                let mut rest = std::mem::take(&mut rec.open).into_iter().peekable();
                while let Some(o) = rest.next_if(|o| o.refused.is_some()) {
                    let why = o.refused.clone().unwrap_or_default();
                    rec.open.push(o);
                    announce_first(t, sid, rec, now)?;
                    answer_first(t, sid, rec, false, json!({"error": why}), now)?;
                }
                rec.open.extend(rest);
                continue;
            }
            Admit::Run { by: None } => {}
            Admit::Run { by: Some(by) } => {
                rec.open[0].allowed = true;
                rec.open[0].approved_by = Some(by.into());
            }
            Admit::Deny(reason) => {
                answer_first(t, sid, rec, false, json!({"error": reason}), now)?;
                continue;
            }
            Admit::NeedsHuman(reason) => {
                needs_human(t, sid, rec, &name, &reason, now)?;
                return Ok(Progress::Ended);
            }
            Admit::Park(reason) => {
                let expires_at = config
                    .policy
                    .approval_timeout_ms
                    .map(|ms| now.saturating_add(ms));
                park(t, sid, rec, "approval", reason, Vec::new(), expires_at, now)?;
                return Ok(Progress::Parked);
            }
        }
        let prep = match prepared.remove(&first.call.id) {
            None => Prep::Missing,
            Some(tools::Prepared::Ask { questions }) => Prep::Ask(questions),
            Some(tools::Prepared::External) => Prep::External,
            Some(p) => Prep::Store(p),
        };
        // A job to be waited on arms a waitpoint: capped before it starts (once started,
        // it is made again as it was).
        let capped = || tools::exec_capped(t, sid, &first.call);
        match decide::run(prep, config.unattended, first.started, capped)? {
            Run::Prepare => {
                return Ok(Progress::Prepare(
                    rec.open
                        .iter()
                        .filter(|o| o.refused.is_none())
                        .map(|o| o.call.clone())
                        .collect(),
                ));
            }
            Run::NeedsHuman => {
                needs_human(t, sid, rec, &name, "a question for the person", now)?;
                return Ok(Progress::Ended);
            }
            Run::AskPerson(questions) => {
                let reason = "the model asks the person".to_string();
                park(t, sid, rec, "question", reason, questions, None, now)?;
                return Ok(Progress::Parked);
            }
            Run::Capped(why) => {
                answer_first(t, sid, rec, false, json!({"error": why}), now)?;
            }
            Run::External { again } => {
                // Marked in the write that hands it out, before anything is sent: a call
                // found marked was asked before, and its fate is unknown until asked again.
                rec.open[0].started = true;
                return Ok(Progress::External(first.call, again));
            }
            Run::Store(p) => {
                let a = tools::execute(t, sid, rec, p, env.signal_url, now)?;
                if a.secret.is_some() {
                    unredacted.push((rec.transcript_len, a.result.to_string()));
                }
                let stored = tools::redacted(&a.result, a.secret.as_deref());
                answer_first(t, sid, rec, a.ok, stored, now)?;
            }
        }
    }
    Ok(Progress::Done)
}

fn view(call: &ToolCall) -> ToolCallView {
    ToolCallView {
        id: call.id.clone(),
        name: call.function.name.clone(),
        args: args_value(call),
    }
}

/// Answers the first open call with `result` (as stored) and takes it off the list.
pub(super) fn answer_first(
    t: &mut Tx<'_>,
    sid: &str,
    rec: &mut AgentRecord,
    ok: bool,
    result: serde_json::Value,
    now: u64,
) -> Result<(), StoreError> {
    if rec.open.is_empty() {
        return Ok(());
    }
    let first = rec.open.remove(0);
    let call = first.call;
    let text = result.to_string();
    t.append_transcript(sid, rec, &ChatMessage::tool(call.id.clone(), text.clone()))?;
    let run_id = run_of(rec);
    if let Some(turn) = rec.turn.as_mut() {
        turn.repeat = Some(rules::count_repeat(
            turn.repeat.take(),
            format!(
                "{}\u{0}{}\u{0}{text}",
                call.function.name, call.function.arguments
            ),
        ));
    }
    event(
        t,
        sid,
        EventBody::ToolEnd {
            run_id,
            step: first.step,
            observation: Observation {
                call_id: call.id,
                name: call.function.name,
                ok,
                result,
            },
        },
        now,
    )?;
    Ok(())
}

/// Parks the first open call on a person (the caller saves `rec`).
#[allow(clippy::too_many_arguments)]
fn park(
    t: &mut Tx<'_>,
    sid: &str,
    rec: &mut AgentRecord,
    kind: &str,
    reason: String,
    questions: Vec<Question>,
    expires_at: Option<u64>,
    now: u64,
) -> Result<(), StoreError> {
    let Some(first) = rec.open.first() else {
        return Ok(());
    };
    let request = PendingRequest {
        id: crate::secret::new_id("req"),
        kind: kind.into(),
        tool: first.call.function.name.clone(),
        call_id: first.call.id.clone(),
        args: args_value(&first.call),
        reason,
        questions,
        asked_at: now,
        expires_at,
    };
    let step = first.step;
    event(
        t,
        sid,
        EventBody::ApprovalRequired {
            run_id: run_of(rec),
            step,
            approval: request.clone(),
        },
        now,
    )?;
    t.park(sid, rec, request)
}

/// An answer came for what the session waits on (one for anything else is passed over:
/// answered before, withdrawn, or never asked).
pub(super) fn answered(
    t: &mut Tx<'_>,
    sid: &str,
    rec: &mut AgentRecord,
    config: &AgentConfig,
    a: AnswerItem,
    now: u64,
) -> Result<(), StoreError> {
    let Some(p) = rec.parked.clone().filter(|p| p.id == a.request_id) else {
        return Ok(());
    };
    t.clear_parked(sid, rec)?;
    if rec.open.first().is_none_or(|o| o.call.id != p.call_id) {
        return Ok(());
    }
    if p.kind == "question" {
        return match a.decision {
            Some(Decision::Deny) => answer_first(
                t,
                sid,
                rec,
                false,
                json!({"error": "the person declined to answer"}),
                now,
            ),
            _ => answer_first(
                t,
                sid,
                rec,
                true,
                json!({"answers": a.data.unwrap_or(serde_json::Value::Null)}),
                now,
            ),
        };
    }
    match a.decision {
        Some(Decision::Allow) => {
            let first = &mut rec.open[0];
            first.allowed = true;
            first.approved_by = Some(
                if a.always {
                    "person (always)"
                } else {
                    "person"
                }
                .into(),
            );
            if let Some(args) = a.args {
                first.call.function.arguments = match args {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
            }
            if a.always && !rec.always.contains(&p.tool) {
                rec.always.push(p.tool);
            }
            Ok(())
        }
        _ => {
            let why = if a.by == "timeout" {
                format!(
                    "not run: nobody approved {} within {} ms (policy.approvalTimeoutMs); go on without it",
                    p.tool,
                    config.policy.approval_timeout_ms.unwrap_or_default()
                )
            } else {
                format!(
                    "not run: the person denied this {} call; go on without it",
                    p.tool
                )
            };
            answer_first(t, sid, rec, false, json!({"error": why}), now)
        }
    }
}

/// Emits `tool-start` for the first open call unless it was (the caller saves `rec`).
fn announce_first(
    t: &mut Tx<'_>,
    sid: &str,
    rec: &mut AgentRecord,
    now: u64,
) -> Result<(), StoreError> {
    let Some(first) = rec.open.first().filter(|o| !o.announced).cloned() else {
        return Ok(());
    };
    event(
        t,
        sid,
        EventBody::ToolStart {
            run_id: run_of(rec),
            step: first.step,
            call: view(&first.call),
        },
        now,
    )?;
    rec.open[0].announced = true;
    Ok(())
}

/// Ends the run with `result`, every open call answered first with the error `why`
/// (given whether its work outside the hub began), so the transcript stays one a model
/// server takes.
fn close_open(
    t: &mut Tx<'_>,
    sid: &str,
    rec: &mut AgentRecord,
    why: impl Fn(bool) -> String,
    result: RunResult,
    now: u64,
) -> Result<(), StoreError> {
    while let Some(first) = rec.open.first().cloned() {
        announce_first(t, sid, rec, now)?;
        let result = if first.started && first.call.function.name == "device_exec" {
            // Begun, with no answer recorded: what became of it is recorded as unknown,
            // with the exec id that finds it on the device.
            crate::runner::external::unknown_end(t, sid, &first, &why(false), now)?
        } else {
            json!({"error": why(first.started)})
        };
        answer_first(t, sid, rec, false, result, now)?;
    }
    end_run(t, sid, rec, result, now)
}

/// A cancel stops the running turn: open calls answered "interrupted", what waited on
/// a person withdrawn, the run ended `aborted`. `now` messages that had not joined yet
/// wait for the next turn.
pub(super) fn interrupt(
    t: &mut Tx<'_>,
    sid: &str,
    rec: &mut AgentRecord,
    now: u64,
) -> Result<(), StoreError> {
    t.clear_parked(sid, rec)?;
    let why = |started: bool| match started {
        true => {
            "interrupted: the person stopped the turn; the command may have started on the device"
                .into()
        }
        false => "interrupted: the person stopped the turn".into(),
    };
    let result = failed(
        "aborted",
        None,
        "the person stopped the turn (cancel)".into(),
    );
    close_open(t, sid, rec, why, result, now)
}

/// The turn needs a person and the session is unattended: the open calls are answered
/// "not run" and the run ends `needs_human`.
fn needs_human(
    t: &mut Tx<'_>,
    sid: &str,
    rec: &mut AgentRecord,
    tool: &str,
    reason: &str,
    now: u64,
) -> Result<(), StoreError> {
    let why =
        |_| "not run: the turn ended waiting for a person, and this session is unattended".into();
    let message = format!("{tool} needs a person ({reason}), and this session is unattended");
    close_open(t, sid, rec, why, failed("needs_human", None, message), now)
}

/// A model call's arguments, parsed for people and gates; the raw text when not JSON.
fn args_value(call: &ToolCall) -> serde_json::Value {
    let raw = call.function.arguments.trim();
    if raw.is_empty() {
        return serde_json::json!({});
    }
    serde_json::from_str(raw).unwrap_or_else(|_| serde_json::Value::String(raw.to_string()))
}
