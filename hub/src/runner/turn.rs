//! The runner's writes: each runs inside one store write, so a step boundary (inbox
//! taken, run started or ended, next step begun) and a step's result (the model's reply,
//! its tool calls run and answered) each land whole or not at all. A crash between them
//! leaves the session `running` in the ready queue, and the restarted runner goes on from
//! the transcript: a model call cut off is simply made again.

use cortex_protocol::api::{
    DeltaChannel, Envelope, EventBody, Observation, RunError, RunInput, RunMeta, RunResult,
    SessionResult, ToolCallView, Usage,
};

use super::{prefix, rules, tools};
use crate::config::AgentDefaults;
use crate::model::{ChatMessage, StepOutput, ToolCall};
use crate::store::agent::{AgentRecord, RunStatus, Turn};
use crate::store::{StoreError, Tx};

/// What the runner does next for a session.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Nothing unread: the session was handed back, idle.
    Idle,
    /// Make model call `step` of run `run_id`.
    Step {
        run_id: String,
        step: u32,
        max_tokens: Option<u32>,
        /// The session log's newest seq (live pieces carry it).
        seq: u64,
    },
}

/// A retry the model client made during a step, recorded with the step.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryNote {
    pub attempt: u32,
    pub issues: String,
    pub delay_ms: u64,
}

/// Which step a result belongs to.
#[derive(Debug, Clone)]
pub struct StepAt {
    pub sid: String,
    pub run_id: String,
    pub step: u32,
}

/// A run that ended without an answer.
fn failed(code: &str, stop: Option<&str>, message: String) -> RunResult {
    RunResult {
        ok: false,
        output: None,
        error: Some(RunError {
            code: code.into(),
            stop: stop.map(str::to_string),
            message,
        }),
    }
}

/// A tool answer whose stored copy hides a secret: transcript position and the content
/// the model must read for the rest of the run.
pub type Unredacted = (u64, String);

fn inbox_item(body: EventBody, seq: u64) -> Option<(RunInput, bool)> {
    match body {
        EventBody::Message { text, when, .. } => Some((
            RunInput {
                seq,
                kind: "message".into(),
                text,
            },
            when == cortex_protocol::api::When::Now,
        )),
        EventBody::Wake(w) => Some((
            RunInput {
                seq,
                kind: "wake".into(),
                text: w.text,
            },
            false,
        )),
        _ => None,
    }
}

/// The inbox items of `sid` after log seq `after`, with whether each joins a running
/// turn, and the newest seq looked at (the runner's own events in between are passed
/// over once, not at every boundary).
fn unread(t: &Tx<'_>, sid: &str, after: u64) -> Result<(Vec<(RunInput, bool)>, u64), StoreError> {
    let mut out = Vec::new();
    let mut cursor = after;
    loop {
        let Some(page) = t.events_after(sid, cursor, 1_000)? else {
            return Ok((out, cursor));
        };
        if page.is_empty() {
            return Ok((out, cursor));
        }
        for raw in page {
            let ev: cortex_protocol::api::Event = serde_json::from_slice(&raw)
                .map_err(|e| StoreError::Decode(format!("a session event: {e}")))?;
            cursor = ev.seq;
            if let Some(item) = inbox_item(ev.body, ev.seq) {
                out.push(item);
            }
        }
    }
}

fn event(t: &mut Tx<'_>, sid: &str, body: EventBody, now: u64) -> Result<u64, StoreError> {
    t.append_event(sid, body, now)?
        .ok_or_else(|| StoreError::Decode(format!("session {sid} vanished mid-write")))
}

/// A step boundary: takes what the inbox holds, starts a run if none is going and there
/// is input, ends one whose bounds are spent, and begins the next step; or hands the
/// session back idle. Also claims the session (`running`).
pub fn boundary(
    t: &mut Tx<'_>,
    sid: &str,
    defaults: &AgentDefaults,
    now: u64,
) -> Result<Next, StoreError> {
    if t.get_session(sid)?.is_none() {
        return Ok(Next::Idle);
    }
    let mut rec = t.agent(sid)?.unwrap_or_else(|| AgentRecord::new(None));
    let config = match rec.config.clone() {
        Some(c) => c,
        None => {
            let c = prefix::config(defaults, None, None, None, None).map_err(StoreError::Decode)?;
            let p = prefix::build(&c);
            t.fix_agent(sid, &mut rec, c.clone(), &p)?;
            c
        }
    };
    if rec.ready_order == 0 {
        // Claimed without a queue entry (a wake raced the hand-back): queue it, so a
        // crash from here on is found again.
        t.make_ready(sid, &mut rec)?;
    }
    rec.status = RunStatus::Running;
    loop {
        let (items, seen) = unread(t, sid, rec.read_through)?;
        rec.read_through = seen;
        if let Some((last, _)) = items.last() {
            event(t, sid, EventBody::InputTaken { through: last.seq }, now)?;
        }
        let turn = match rec.turn.take() {
            Some(turn) => {
                for (item, now_joins) in items {
                    if now_joins {
                        t.append_transcript(sid, &mut rec, &ChatMessage::user(item.text))?;
                    } else {
                        rec.deferred.push(item);
                    }
                }
                turn
            }
            None => {
                let mut input = std::mem::take(&mut rec.deferred);
                input.extend(items.into_iter().map(|(i, _)| i));
                if input.is_empty() {
                    t.make_idle(sid, &mut rec)?;
                    t.put_agent(sid, &rec)?;
                    return Ok(Next::Idle);
                }
                for i in &input {
                    t.append_transcript(sid, &mut rec, &ChatMessage::user(i.text.clone()))?;
                }
                let run_id = crate::secret::new_id("run");
                event(
                    t,
                    sid,
                    EventBody::RunStart {
                        run_id: run_id.clone(),
                        input,
                    },
                    now,
                )?;
                Turn {
                    run_id,
                    started_at: now,
                    steps: 0,
                    usage: Usage::default(),
                    repeat: None,
                }
            }
        };
        if let Some(stop) = rules::stop_before_step(&turn, &config.stop, now) {
            end_run(
                t,
                sid,
                &mut rec,
                &turn,
                failed("stopped", Some(stop.stop), stop.message),
                now,
            )?;
            continue;
        }
        let mut turn = turn;
        turn.steps += 1;
        let step = turn.steps;
        let run_id = turn.run_id.clone();
        let seq = event(
            t,
            sid,
            EventBody::StepStart {
                run_id: run_id.clone(),
                step,
            },
            now,
        )?;
        rec.turn = Some(turn);
        t.put_agent(sid, &rec)?;
        return Ok(Next::Step {
            run_id,
            step,
            max_tokens: config.max_tokens,
            seq,
        });
    }
}

/// Ends the run `turn` with `result` (the caller saves `rec`).
fn end_run(
    t: &mut Tx<'_>,
    sid: &str,
    rec: &mut AgentRecord,
    turn: &Turn,
    result: RunResult,
    now: u64,
) -> Result<(), StoreError> {
    let meta = RunMeta {
        usage: turn.usage,
        strategy: "emit".into(),
        steps: turn.steps,
        output_retries: 0,
        elapsed_ms: now.saturating_sub(turn.started_at),
    };
    event(
        t,
        sid,
        EventBody::RunEnd {
            run_id: turn.run_id.clone(),
            result: result.clone(),
            meta: meta.clone(),
        },
        now,
    )?;
    rec.last_run = Some(SessionResult {
        run_id: turn.run_id.clone(),
        result,
        meta,
    });
    rec.turn = None;
    Ok(())
}

fn record_retries(
    t: &mut Tx<'_>,
    sid: &str,
    run_id: &str,
    step: u32,
    retries: Vec<RetryNote>,
    now: u64,
) -> Result<(), StoreError> {
    for r in retries {
        event(
            t,
            sid,
            EventBody::Retry {
                run_id: run_id.to_string(),
                step,
                cause: "provider".into(),
                attempt: r.attempt,
                issues: r.issues,
                delay_ms: r.delay_ms,
            },
            now,
        )?;
    }
    Ok(())
}

/// The turn of `rec` if it is run `run_id`; a stale result (the run ended meanwhile) is
/// dropped.
fn current(rec: &mut AgentRecord, run_id: &str) -> Option<Turn> {
    match rec.turn.take() {
        Some(t) if t.run_id == run_id => Some(t),
        other => {
            rec.turn = other;
            None
        }
    }
}

/// A model call's arguments, parsed for people and gates; the raw text when not JSON.
fn args_value(call: &ToolCall) -> serde_json::Value {
    let raw = call.function.arguments.trim();
    if raw.is_empty() {
        return serde_json::json!({});
    }
    serde_json::from_str(raw).unwrap_or_else(|_| serde_json::Value::String(raw.to_string()))
}

/// Step `step` of run `run_id` came back: records the reply, runs and answers its tool
/// calls (each prepared by the caller), ends the run when the reply has none, and goes on
/// to the next boundary. Returns what to do next and the answers whose stored copy hides
/// a secret.
#[allow(clippy::too_many_arguments)]
pub fn step_done(
    t: &mut Tx<'_>,
    at: &StepAt,
    out: StepOutput,
    retries: Vec<RetryNote>,
    calls: Vec<(ToolCall, tools::Prepared)>,
    signal_url: &str,
    defaults: &AgentDefaults,
    now: u64,
) -> Result<(Next, Vec<Unredacted>), StoreError> {
    let (sid, run_id, step) = (at.sid.as_str(), at.run_id.as_str(), at.step);
    let mut unredacted = Vec::new();
    let Some(mut rec) = t.agent(sid)? else {
        return Ok((Next::Idle, unredacted));
    };
    let Some(mut turn) = current(&mut rec, run_id) else {
        return Ok((boundary(t, sid, defaults, now)?, unredacted));
    };
    record_retries(t, sid, run_id, step, retries, now)?;
    if let Some(u) = out.usage {
        turn.usage.prompt_tokens += u.prompt_tokens;
        turn.usage.completion_tokens += u.completion_tokens;
        turn.usage.total_tokens += u.total_tokens;
    }
    let tool_calls: Vec<ToolCall> = calls.iter().map(|(c, _)| c.clone()).collect();
    t.append_transcript(
        sid,
        &mut rec,
        &ChatMessage::assistant(out.text.clone(), tool_calls),
    )?;
    for (text, channel) in [
        (&out.reasoning, DeltaChannel::Reasoning),
        (&out.text, DeltaChannel::Text),
    ] {
        if !text.is_empty() {
            event(
                t,
                sid,
                EventBody::ModelDelta {
                    run_id: run_id.to_string(),
                    step,
                    text: text.clone(),
                    channel,
                    live: false,
                },
                now,
            )?;
        }
    }
    if calls.is_empty() {
        let response = out.text.trim().to_string();
        end_run(
            t,
            sid,
            &mut rec,
            &turn,
            RunResult {
                ok: true,
                output: Some(Envelope {
                    response: Some(response),
                    data: None,
                    reasoning: None,
                }),
                error: None,
            },
            now,
        )?;
        t.put_agent(sid, &rec)?;
        return Ok((boundary(t, sid, defaults, now)?, unredacted));
    }
    for (call, prepared) in calls {
        let view = ToolCallView {
            id: call.id.clone(),
            name: call.function.name.clone(),
            args: args_value(&call),
        };
        event(
            t,
            sid,
            EventBody::ToolStart {
                run_id: run_id.to_string(),
                step,
                call: view,
            },
            now,
        )?;
        let answered = tools::execute(t, sid, prepared, signal_url, now)?;
        let stored = tools::redacted(&answered.result, answered.secret.as_deref());
        let stored_text = stored.to_string();
        if answered.secret.is_some() {
            unredacted.push((rec.transcript_len, answered.result.to_string()));
        }
        t.append_transcript(
            sid,
            &mut rec,
            &ChatMessage::tool(call.id.clone(), stored_text.clone()),
        )?;
        turn.repeat = Some(rules::count_repeat(
            turn.repeat.take(),
            format!(
                "{}\u{0}{}\u{0}{stored_text}",
                call.function.name, call.function.arguments
            ),
        ));
        event(
            t,
            sid,
            EventBody::ToolEnd {
                run_id: run_id.to_string(),
                step,
                observation: Observation {
                    call_id: call.id,
                    name: call.function.name,
                    ok: answered.ok,
                    result: stored,
                },
            },
            now,
        )?;
    }
    rec.turn = Some(turn);
    t.put_agent(sid, &rec)?;
    Ok((boundary(t, sid, defaults, now)?, unredacted))
}

/// Step `step` of run `run_id` failed for good (the model server): the run ends with
/// `model_call_failed`, and the session goes on to its next boundary.
pub fn step_failed(
    t: &mut Tx<'_>,
    at: &StepAt,
    message: String,
    retries: Vec<RetryNote>,
    defaults: &AgentDefaults,
    now: u64,
) -> Result<Next, StoreError> {
    let (sid, run_id, step) = (at.sid.as_str(), at.run_id.as_str(), at.step);
    let Some(mut rec) = t.agent(sid)? else {
        return Ok(Next::Idle);
    };
    let Some(turn) = current(&mut rec, run_id) else {
        return boundary(t, sid, defaults, now);
    };
    record_retries(t, sid, run_id, step, retries, now)?;
    end_run(
        t,
        sid,
        &mut rec,
        &turn,
        failed("model_call_failed", None, message),
        now,
    )?;
    t.put_agent(sid, &rec)?;
    boundary(t, sid, defaults, now)
}
