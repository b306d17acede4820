//! The runner's writes: each runs inside one store write, so a step boundary (inbox
//! taken, answers and cancels applied, open tool calls gated and run, run started or
//! ended, next step begun) and a step's result (the model's reply, its calls opened) each
//! land whole or not at all. A crash between them leaves the session `running` in the
//! ready queue (or parked on a person, out of it), and the restarted runner goes on from
//! the transcript: a model call cut off is simply made again.
//!
//! A reply's tool calls are answered strictly in the model's order: each announced
//! (`tool-start`), gated (`super::gate`), then run. The first that waits on a person
//! parks the session (the calls after it are neither run nor refused until it is
//! answered); one that needs preparing outside the store, or has work outside the hub,
//! hands control back to the driver, which comes back with it ([`calls_ready`],
//! [`external_done`]).

use std::collections::HashMap;

use cortex_protocol::api::{
    AnswerItem, CreateSession, Decision, DeltaChannel, EventBody, Observation, PendingRequest,
    Question, RunError, RunInput, RunMeta, RunResult, SessionResult, ToolCallView, Usage,
};
use serde_json::json;

use super::decide::{self, Admit, Prep, Run, Seen, Settle, Then};
use super::gate;
use super::output::{Transport, Verdict, correct, last_output};
use super::{compact, prefix, rules, tools};
use crate::config::AgentDefaults;
use crate::model::{ChatMessage, StepOutput, ToolCall};
use crate::store::agent::{AgentConfig, AgentRecord, OpenCall, RunStatus, Summary, Turn};
use crate::store::{StoreError, Tx};

/// What the runner does next for a session.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Nothing to do: the session was handed back (idle, or parked on a person).
    Idle,
    /// Make model call `step` of run `run_id`.
    Step {
        run_id: String,
        step: u32,
        max_tokens: Option<u32>,
        /// The session log's newest seq (live pieces carry it).
        seq: u64,
        /// What the request carries: the prefix's length and the summary in force.
        prefix_len: u64,
        summary: Option<Summary>,
        /// The run's bounds the call must keep while it streams.
        during: rules::During,
    },
    /// A person asked for a compaction: compute it and post it back (a `compaction`).
    Compact {
        prefix_len: u64,
        summary: Option<Summary>,
        max_tokens: Option<u32>,
    },
    /// Prepare these open calls outside the store and bring them to [`calls_ready`].
    Prepare {
        run_id: String,
        calls: Vec<ToolCall>,
    },
    /// Do this call's work outside the hub (`device_exec`), then [`external_done`];
    /// `again`: it was begun before (an earlier ask may have reached the device).
    External {
        run_id: String,
        call: ToolCall,
        again: bool,
    },
}

/// What a write of the runner needs besides the store.
pub struct Env<'a> {
    pub defaults: &'a AgentDefaults,
    pub signal_url: &'a str,
    pub now: u64,
}

/// The marker after the text of a reply a cancel cut off.
pub const INTERRUPTED_MARKER: &str = "[Request interrupted by user]";

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

/// An inbox item as a boundary takes it.
enum Item {
    /// Input for the model, and whether it joins a running turn (`when: now`).
    Input(RunInput, bool),
    Answer(AnswerItem),
    Cancel {
        turn_only: bool,
    },
    /// A person asked for a compaction.
    Compact,
    /// A summary computed beside the steps.
    Compaction(Box<cortex_protocol::api::Compaction>),
}

fn inbox_item(body: EventBody, seq: u64) -> Option<Item> {
    match body {
        EventBody::Message { text, when, .. } => Some(Item::Input(
            RunInput {
                seq,
                kind: "message".into(),
                text,
            },
            when == cortex_protocol::api::When::Now,
        )),
        EventBody::Wake(w) => Some(Item::Input(
            RunInput {
                seq,
                kind: "wake".into(),
                text: w.text,
            },
            false,
        )),
        EventBody::Timer { text, .. } => Some(Item::Input(
            RunInput {
                seq,
                kind: "timer".into(),
                text,
            },
            false,
        )),
        EventBody::Answer(a) => Some(Item::Answer(*a)),
        EventBody::Cancel { turn_only } => Some(Item::Cancel { turn_only }),
        EventBody::Compact {} => Some(Item::Compact),
        EventBody::Compaction(c) => Some(Item::Compaction(c)),
        _ => None,
    }
}

/// The inbox items of `sid` after log seq `after`, and the newest seq looked at (the
/// runner's own events in between are passed over once, not at every boundary).
#[allow(clippy::type_complexity)]
fn unread(t: &Tx<'_>, sid: &str, after: u64) -> Result<(Vec<Item>, u64, Option<u64>), StoreError> {
    let mut out = Vec::new();
    let mut cursor = after;
    let mut last_item = None;
    loop {
        let Some(page) = t.events_after(sid, cursor, 1_000)? else {
            break;
        };
        if page.is_empty() {
            break;
        }
        for raw in page {
            let ev: cortex_protocol::api::Event = serde_json::from_slice(&raw)
                .map_err(|e| StoreError::Decode(format!("a session event: {e}")))?;
            cursor = ev.seq;
            if let Some(item) = inbox_item(ev.body, ev.seq) {
                out.push(item);
                last_item = Some(ev.seq);
            }
        }
    }
    Ok((out, cursor, last_item))
}

fn event(t: &mut Tx<'_>, sid: &str, body: EventBody, now: u64) -> Result<u64, StoreError> {
    t.append_event(sid, body, now)?
        .ok_or_else(|| StoreError::Decode(format!("session {sid} vanished mid-write")))
}

/// A step boundary: takes what the inbox holds (input, answers, cancels), answers the
/// open calls it can (gated, then run from `prepared`, the calls the caller prepared), starts a
/// run if none is going and there is input, ends one whose bounds are spent, and begins
/// the next step; or hands the session back: idle, or parked on a person. Also claims the
/// session (`running`). Answers whose stored copy hides a secret go to `unredacted`.
pub fn boundary(
    t: &mut Tx<'_>,
    sid: &str,
    env: &Env<'_>,
    prepared: &mut HashMap<String, tools::Prepared>,
    unredacted: &mut Vec<Unredacted>,
) -> Result<Next, StoreError> {
    boundary_at(t, sid, env, prepared, unredacted, None)
}

/// [`boundary`]; with `redo`, step `redo` of the run in progress, begun and never
/// answered (its call waited for a compaction, or was refused for its size), is made
/// again as it is rather than a new step begun.
fn boundary_at(
    t: &mut Tx<'_>,
    sid: &str,
    env: &Env<'_>,
    prepared: &mut HashMap<String, tools::Prepared>,
    unredacted: &mut Vec<Unredacted>,
    redo: Option<&StepAt>,
) -> Result<Next, StoreError> {
    let now = env.now;
    if t.get_session(sid)?.is_none() {
        return Ok(Next::Idle);
    }
    let mut rec = t.agent(sid)?.unwrap_or_else(|| AgentRecord::new(None));
    let config = match rec.config.clone() {
        Some(c) => c,
        None => {
            // A chat agent (no output schema): what the server enforces is moot.
            let caps = super::output::Caps::default();
            let c = prefix::config(env.defaults, &caps, CreateSession::default())
                .map_err(StoreError::Decode)?;
            let p = prefix::build(&c, &caps);
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
    'inbox: loop {
        let (items, seen, last) = unread(t, sid, rec.read_through)?;
        rec.read_through = seen;
        if let Some(through) = last {
            event(t, sid, EventBody::InputTaken { through }, now)?;
        }
        for item in items {
            if rec.cancelled {
                break;
            }
            take_item(t, sid, &mut rec, &config, item, now)?;
        }
        loop {
            let hand_back = match decide::settle(&seen_of(&rec), run_gate(t, &rec, now)) {
                Settle::Calls => break,
                Settle::Compact => {
                    t.put_agent(sid, &rec)?;
                    return Ok(Next::Compact {
                        prefix_len: rec.prefix_len,
                        summary: rec.summary.clone(),
                        max_tokens: config.max_tokens,
                    });
                }
                Settle::FireTimers => {
                    // Timers that came due during the turn fire now, once each; their
                    // items are taken on the next pass.
                    fire_due_timers(t, sid, &mut rec, now)?;
                    continue 'inbox;
                }
                Settle::Start { counted } => {
                    start_run(t, sid, &mut rec, counted, now)?;
                    continue;
                }
                Settle::Cancelled => {
                    // Ended by a cancel (which ends the session where it is posted): a
                    // turn still going stops here.
                    if rec.turn.is_some() {
                        interrupt(t, sid, &mut rec, now)?;
                    }
                    true
                }
                Settle::Defer { count, until } => {
                    // Put off for the hour's runs: the input waits, and a timer brings
                    // the session back.
                    defer_run(t, sid, &mut rec, count, until, now)?;
                    true
                }
                Settle::Idle | Settle::Parked => true,
            };
            if hand_back {
                t.make_idle(sid, &mut rec)?;
                t.put_agent(sid, &rec)?;
                return Ok(Next::Idle);
            }
        }
        match advance(t, sid, &mut rec, &config, env, prepared, unredacted)? {
            Progress::Done => {}
            Progress::Parked | Progress::Ended => continue,
            Progress::Prepare(calls) => {
                let run_id = run_of(&rec);
                t.put_agent(sid, &rec)?;
                return Ok(Next::Prepare { run_id, calls });
            }
            Progress::External(call, again) => {
                let run_id = run_of(&rec);
                t.put_agent(sid, &rec)?;
                return Ok(Next::External {
                    run_id,
                    call,
                    again,
                });
            }
        }
        for i in std::mem::take(&mut rec.joining) {
            t.append_transcript(sid, &mut rec, &ChatMessage::user(i.text))?;
        }
        let turn = rec.turn.as_ref();
        // A step made again was let through its bounds when it began.
        let again = turn.is_some_and(|turn| {
            redo.is_some_and(|at| at.run_id == turn.run_id && at.step == turn.steps)
        });
        let bound = || turn.and_then(|turn| rules::stop_before_step(turn, &config.stop, now));
        let again = match decide::then(turn.is_some(), again, bound) {
            Then::Look => continue,
            Then::End(stop) => {
                let result = failed("stopped", Some(stop.stop), stop.message);
                end_run(t, sid, &mut rec, result, now)?;
                continue;
            }
            Then::Step { again } => again,
        };
        let Some(turn) = rec.turn.as_mut() else {
            continue;
        };
        let (step, run_id) = (turn.steps + u32::from(!again), turn.run_id.clone());
        let seq = match again {
            true => t.get_session(sid)?.map_or(0, |s| s.last_seq),
            false => {
                turn.steps = step;
                event(
                    t,
                    sid,
                    EventBody::StepStart {
                        run_id: run_id.clone(),
                        step,
                    },
                    now,
                )?
            }
        };
        let during = rules::during(turn, &config.stop);
        t.put_agent(sid, &rec)?;
        return Ok(Next::Step {
            run_id,
            step,
            max_tokens: config.max_tokens,
            seq,
            prefix_len: rec.prefix_len,
            summary: rec.summary.clone(),
            during,
        });
    }
}

/// What the boundary sees of `rec` (see [`decide::settle`]).
fn seen_of(rec: &AgentRecord) -> Seen {
    Seen {
        cancelled: rec.cancelled,
        turn: rec.turn.is_some(),
        parked: rec.parked.is_some(),
        open_calls: !rec.open.is_empty(),
        compact_asked: rec.compact_asked,
        input: !rec.deferred.is_empty(),
        timers_due: rec.timers.iter().any(|x| x.due),
    }
}

/// Takes one inbox item into `rec`.
fn take_item(
    t: &mut Tx<'_>,
    sid: &str,
    rec: &mut AgentRecord,
    config: &AgentConfig,
    item: Item,
    now: u64,
) -> Result<(), StoreError> {
    match item {
        Item::Input(i, joins) => {
            if joins && rec.turn.is_some() {
                rec.joining.push(i);
            } else {
                rec.deferred.push(i);
            }
        }
        Item::Answer(a) => answered(t, sid, rec, config, a, now)?,
        Item::Cancel { turn_only } => {
            if rec.turn.is_some() {
                interrupt(t, sid, rec, now)?;
            }
            if !turn_only {
                t.end_agent_session(sid, rec, now)?;
            }
        }
        Item::Compact => rec.compact_asked = true,
        Item::Compaction(c) => take_compaction(t, sid, rec, &c)?,
    }
    Ok(())
}

/// Whether a run on the input waiting may start now (`limits.runsPerHour`: wakes and
/// timers start so many an hour; a person's message always may).
fn run_gate(t: &Tx<'_>, rec: &AgentRecord, now: u64) -> crate::caps::RunGate {
    let window = t.settings().wake_window_ms;
    let mut starts = rec.wake_runs.clone();
    crate::caps::trim(&mut starts, now, window);
    let from_person = rec.deferred.iter().any(|i| i.kind == "message");
    crate::caps::run_gate(from_person, &starts, t.limits(), now, window)
}

/// Starts a run on the input waiting (`counted` against the hour's runs).
fn start_run(
    t: &mut Tx<'_>,
    sid: &str,
    rec: &mut AgentRecord,
    counted: bool,
    now: u64,
) -> Result<(), StoreError> {
    let window = t.settings().wake_window_ms;
    crate::caps::trim(&mut rec.wake_runs, now, window);
    if counted {
        rec.wake_runs.push(now);
    }
    t.set_run_defer(sid, rec, None)?;
    let input = std::mem::take(&mut rec.deferred);
    for i in &input {
        t.append_transcript(sid, rec, &ChatMessage::user(i.text.clone()))?;
    }
    let run_id = crate::secret::new_id("run");
    let body = EventBody::RunStart {
        run_id: run_id.clone(),
        input,
    };
    event(t, sid, body, now)?;
    rec.turn = Some(Turn {
        run_id,
        started_at: now,
        steps: 0,
        usage: Usage::default(),
        repeat: None,
        output_retries: 0,
        terminations: 0,
        finish_reason: None,
    });
    Ok(())
}

/// A run put off for the hour's runs: sets the `run-defer` timer and says so in the log,
/// once per wait (the caller saves `rec`).
fn defer_run(
    t: &mut Tx<'_>,
    sid: &str,
    rec: &mut AgentRecord,
    count: usize,
    until: u64,
    now: u64,
) -> Result<(), StoreError> {
    let window = t.settings().wake_window_ms;
    crate::caps::trim(&mut rec.wake_runs, now, window);
    if rec.deferred_until == Some(until) {
        return Ok(());
    }
    let message = crate::caps::runs_deferred(count, rec.deferred.len(), until, t.limits());
    let body = EventBody::LimitReached {
        limit: "runsPerHour".into(),
        message,
        until: Some(until),
        waitpoint: None,
    };
    event(t, sid, body, now)?;
    t.set_run_defer(sid, rec, Some(until))
}

fn run_of(rec: &AgentRecord) -> String {
    rec.turn
        .as_ref()
        .map(|t| t.run_id.clone())
        .unwrap_or_default()
}

/// How far [`advance`] got with the open calls.
enum Progress {
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
fn advance(
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
        let p = prepared.remove(&first.call.id);
        let prep = match &p {
            None => Prep::Missing,
            Some(tools::Prepared::Ask { .. }) => Prep::Ask,
            Some(tools::Prepared::External) => Prep::External,
            Some(_) => Prep::Store,
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
            Run::AskPerson => {
                let questions = match p {
                    Some(tools::Prepared::Ask { questions }) => questions,
                    _ => Vec::new(),
                };
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
            Run::Store => {
                let Some(p) = p else {
                    continue;
                };
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
fn answer_first(
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
fn answered(
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
            super::external::unknown_end(t, sid, &first, &why(false), now)?
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
fn interrupt(t: &mut Tx<'_>, sid: &str, rec: &mut AgentRecord, now: u64) -> Result<(), StoreError> {
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

/// Fires the timers that came due during the turn.
fn fire_due_timers(
    t: &mut Tx<'_>,
    sid: &str,
    rec: &mut AgentRecord,
    now: u64,
) -> Result<(), StoreError> {
    let (due, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut rec.timers)
        .into_iter()
        .partition(|x| x.due);
    rec.timers = keep;
    t.put_agent(sid, rec)?;
    for timer in due {
        t.fire_timer(sid, timer, now)?;
    }
    if let Some(r) = t.agent(sid)? {
        *rec = r;
    }
    Ok(())
}

/// Ends the run in progress with `result` (the caller saves `rec`).
fn end_run(
    t: &mut Tx<'_>,
    sid: &str,
    rec: &mut AgentRecord,
    result: RunResult,
    now: u64,
) -> Result<(), StoreError> {
    let Some(turn) = rec.turn.take() else {
        return Ok(());
    };
    let strategy = rec
        .config
        .as_ref()
        .and_then(|c| c.transport)
        .unwrap_or(Transport::Emit);
    let meta = RunMeta {
        usage: turn.usage,
        strategy: strategy.as_str().into(),
        steps: turn.steps,
        output_retries: turn.output_retries,
        elapsed_ms: now.saturating_sub(turn.started_at),
        finish_reason: turn.finish_reason,
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
    let joining = std::mem::take(&mut rec.joining);
    rec.deferred.extend(joining);
    Ok(())
}

/// The retries the model client made during step `at` (the server failed: `provider`).
fn record_retries(
    t: &mut Tx<'_>,
    at: &StepAt,
    retries: Vec<RetryNote>,
    now: u64,
) -> Result<(), StoreError> {
    for r in retries {
        let RetryNote {
            attempt,
            issues,
            delay_ms,
        } = r;
        retry_event(t, at, "provider", attempt, issues, delay_ms, now)?;
    }
    Ok(())
}

/// Whether `rec`'s run in progress is `run_id` (else a result is stale: the run ended
/// meanwhile, and it is dropped).
fn is_current(rec: &AgentRecord, run_id: &str) -> bool {
    rec.turn.as_ref().is_some_and(|t| t.run_id == run_id)
}

/// A model call's arguments, parsed for people and gates; the raw text when not JSON.
fn args_value(call: &ToolCall) -> serde_json::Value {
    let raw = call.function.arguments.trim();
    if raw.is_empty() {
        return serde_json::json!({});
    }
    serde_json::from_str(raw).unwrap_or_else(|_| serde_json::Value::String(raw.to_string()))
}

/// Records the model's reply to step `at` and its text, with the retries it took.
fn record_reply(
    t: &mut Tx<'_>,
    rec: &mut AgentRecord,
    at: &StepAt,
    out: &StepOutput,
    calls: Vec<ToolCall>,
    now: u64,
) -> Result<(), StoreError> {
    let (sid, run_id, step) = (at.sid.as_str(), at.run_id.as_str(), at.step);
    if let Some(turn) = rec.turn.as_mut() {
        if let Some(u) = out.usage {
            turn.usage.prompt_tokens += u.prompt_tokens;
            turn.usage.completion_tokens += u.completion_tokens;
            turn.usage.total_tokens += u.total_tokens;
        }
        turn.finish_reason = out.finish_reason.clone();
    }
    t.append_transcript(sid, rec, &ChatMessage::assistant(out.text.clone(), calls))?;
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
    Ok(())
}

/// A model turn as the driver judged it ([`super::output::Output::judge_turn`]).
pub enum Reply {
    /// Tool calls to open, each prepared by the driver.
    Calls(Vec<(ToolCall, tools::Prepared)>),
    /// The turn's answer, carried by its text or by `via` (a `respond` call made alone).
    Answer {
        verdict: Verdict,
        via: Option<ToolCall>,
    },
}

/// Step `at` came back: records the reply; opens its calls, which the boundary gates and
/// runs; or takes its answer: a valid one ends the run, a refused one or none goes back
/// to the model with a correction (the run goes on). Returns what to do next and the
/// answers whose stored copy hides a secret.
pub fn step_done(
    t: &mut Tx<'_>,
    at: &StepAt,
    out: StepOutput,
    retries: Vec<RetryNote>,
    reply: Reply,
    env: &Env<'_>,
) -> Result<(Next, Vec<Unredacted>), StoreError> {
    let sid = at.sid.as_str();
    let mut unredacted = Vec::new();
    let mut prepared = HashMap::new();
    let Some(mut rec) = t.agent(sid)? else {
        return Ok((Next::Idle, unredacted));
    };
    if !is_current(&rec, &at.run_id) {
        let next = boundary(t, sid, env, &mut prepared, &mut unredacted)?;
        return Ok((next, unredacted));
    }
    record_retries(t, at, retries, env.now)?;
    match reply {
        Reply::Calls(calls) => {
            let tool_calls: Vec<ToolCall> = calls.iter().map(|(c, _)| c.clone()).collect();
            record_reply(t, &mut rec, at, &out, tool_calls, env.now)?;
            // The calls past the cap are answered with the reason, and not run.
            let (made, cap) = (calls.len(), t.limits().tool_calls_per_reply as usize);
            for (i, (call, p)) in calls.into_iter().enumerate() {
                let refused = (i >= cap).then(|| crate::caps::tool_calls_refused(made, t.limits()));
                if refused.is_none() {
                    prepared.insert(call.id.clone(), p);
                }
                rec.open.push(OpenCall {
                    refused,
                    call,
                    step: at.step,
                    announced: false,
                    allowed: false,
                    started: false,
                    approved_by: None,
                });
            }
        }
        Reply::Answer { verdict, via } => {
            record_reply(
                t,
                &mut rec,
                at,
                &out,
                via.iter().cloned().collect(),
                env.now,
            )?;
            take_answer(t, at, &mut rec, verdict, via, env.now)?;
        }
    }
    t.put_agent(sid, &rec)?;
    let next = boundary(t, sid, env, &mut prepared, &mut unredacted)?;
    Ok((next, unredacted))
}

/// What the respond call that carried an accepted answer is told (every recorded call
/// gets an answer, so the transcript stays one a model server takes).
const RESPOND_ACCEPTED: &str = "accepted: this answer ends your turn";

/// Takes step `at`'s answer (the caller saves `rec`). A valid envelope ends the run. One
/// that parsed and was refused goes back with the validator's issues while
/// `stop.outputRetries` allows, else the run ends `output_invalid` with it as the last
/// output. A turn with no envelope in it goes back with a correction that offers every
/// exit and is not counted (`stop.steps` bounds a model that keeps writing prose).
fn take_answer(
    t: &mut Tx<'_>,
    at: &StepAt,
    rec: &mut AgentRecord,
    verdict: Verdict,
    via: Option<ToolCall>,
    now: u64,
) -> Result<(), StoreError> {
    let sid = at.sid.as_str();
    let Some(config) = rec.config.clone() else {
        return Ok(());
    };
    let transport = config.transport.unwrap_or(Transport::Emit);
    // A correction (or the respond call's answer) follows the reply: as the respond
    // call's answer when one carried it, else as a message of its own.
    let follow = |t: &mut Tx<'_>, rec: &mut AgentRecord, text: String| match &via {
        Some(call) => t.append_transcript(sid, rec, &ChatMessage::tool(call.id.clone(), text)),
        None => t.append_transcript(sid, rec, &ChatMessage::user(text)),
    };
    match verdict {
        Verdict::Accepted { envelope, .. } => {
            if via.is_some() {
                follow(t, rec, RESPOND_ACCEPTED.into())?;
            }
            let result = RunResult {
                ok: true,
                output: Some(envelope),
                error: None,
            };
            end_run(t, sid, rec, result, now)
        }
        Verdict::Refused { issues, output } => {
            let used = rec.turn.as_ref().map_or(0, |x| x.output_retries);
            let listed = issues
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            let correction = correct::refused(&issues, transport);
            if !rules::may_retry_output(used, &config.stop) {
                follow(t, rec, correction)?;
                let message = format!(
                    "the answer did not match the output schema after {used} retries (stop.outputRetries): {listed}"
                );
                let result = RunResult {
                    ok: false,
                    output: Some(last_output(&output)),
                    error: Some(RunError {
                        code: "output_invalid".into(),
                        stop: None,
                        message,
                    }),
                };
                return end_run(t, sid, rec, result, now);
            }
            if let Some(turn) = rec.turn.as_mut() {
                turn.output_retries = used + 1;
            }
            retry_event(t, at, "output", used + 1, listed, 0, now)?;
            follow(t, rec, correction)
        }
        Verdict::NoEnvelope { syntax } => {
            let n = rec.turn.as_mut().map_or(1, |x| {
                x.terminations += 1;
                x.terminations
            });
            let issues = match &syntax {
                Some(e) => {
                    format!("the turn ended without an answer; its JSON does not parse: {e}")
                }
                None => "the turn ended without an answer in the required form".into(),
            };
            retry_event(t, at, "termination", n, issues, 0, now)?;
            follow(t, rec, correct::no_envelope(transport, syntax.as_deref()))
        }
    }
}

/// A `retry` event for step `at`: the model call made again after `delay_ms` (none when
/// an answer goes back to the model: the next step is the retry).
fn retry_event(
    t: &mut Tx<'_>,
    at: &StepAt,
    cause: &str,
    attempt: u32,
    issues: String,
    delay_ms: u64,
    now: u64,
) -> Result<(), StoreError> {
    event(
        t,
        &at.sid,
        EventBody::Retry {
            run_id: at.run_id.clone(),
            step: at.step,
            cause: cause.into(),
            attempt,
            issues,
            delay_ms,
        },
        now,
    )
    .map(drop)
}

/// Applies `f` to `sid`'s row when its run in progress is `run_id` (a result for a run
/// that ended meanwhile is dropped), saves it, and takes the boundary.
fn on_current<F>(
    t: &mut Tx<'_>,
    sid: &str,
    run_id: &str,
    env: &Env<'_>,
    f: F,
) -> Result<(Next, Vec<Unredacted>), StoreError>
where
    F: FnOnce(&mut Tx<'_>, &mut AgentRecord, &mut Vec<Unredacted>) -> Result<(), StoreError>,
{
    let (mut unredacted, mut prepared) = (Vec::new(), HashMap::new());
    if let Some(mut rec) = t.agent(sid)?
        && is_current(&rec, run_id)
    {
        f(t, &mut rec, &mut unredacted)?;
        t.put_agent(sid, &rec)?;
    }
    let next = boundary(t, sid, env, &mut prepared, &mut unredacted)?;
    Ok((next, unredacted))
}

/// A cancel stopped step `at` while the model was answering: the text so far is kept,
/// followed by [`INTERRUPTED_MARKER`], and the boundary takes the cancel.
pub fn step_interrupted(
    t: &mut Tx<'_>,
    at: &StepAt,
    partial: String,
    retries: Vec<RetryNote>,
    env: &Env<'_>,
) -> Result<(Next, Vec<Unredacted>), StoreError> {
    on_current(t, &at.sid, &at.run_id, env, |t, rec, _| {
        record_retries(t, at, retries, env.now)?;
        let text = if partial.trim().is_empty() {
            INTERRUPTED_MARKER.to_string()
        } else {
            format!("{partial}\n\n{INTERRUPTED_MARKER}")
        };
        let out = StepOutput {
            text,
            ..StepOutput::default()
        };
        record_reply(t, rec, at, &out, Vec::new(), env.now)
    })
}

/// Step `at` was stopped mid-stream by the run's bound `stop` (`stop.durationMs`,
/// `stop.tokens`): the text so far is kept, and the run ends `stopped` as the next
/// boundary would have ended it.
pub fn step_stopped(
    t: &mut Tx<'_>,
    at: &StepAt,
    partial: String,
    retries: Vec<RetryNote>,
    stop: rules::Stop,
    env: &Env<'_>,
) -> Result<(Next, Vec<Unredacted>), StoreError> {
    on_current(t, &at.sid, &at.run_id, env, |t, rec, _| {
        record_retries(t, at, retries, env.now)?;
        let marker = format!("[Stopped: {}]", stop.message);
        let text = if partial.trim().is_empty() {
            marker
        } else {
            format!("{partial}\n\n{marker}")
        };
        let out = StepOutput {
            text,
            ..StepOutput::default()
        };
        record_reply(t, rec, at, &out, Vec::new(), env.now)?;
        end_run(
            t,
            &at.sid,
            rec,
            failed("stopped", Some(stop.stop), stop.message),
            env.now,
        )
    })
}

/// The calls a boundary asked to prepare ([`Next::Prepare`]) are: it goes on with them.
pub fn calls_ready(
    t: &mut Tx<'_>,
    sid: &str,
    calls: Vec<(ToolCall, tools::Prepared)>,
    env: &Env<'_>,
) -> Result<(Next, Vec<Unredacted>), StoreError> {
    let mut unredacted = Vec::new();
    let mut prepared: HashMap<String, tools::Prepared> =
        calls.into_iter().map(|(c, p)| (c.id, p)).collect();
    let next = boundary(t, sid, env, &mut prepared, &mut unredacted)?;
    Ok((next, unredacted))
}

/// The work outside the hub of call `call_id` of run `run_id` ended with `outside`, which
/// is finished here (a started job's wait armed) and answers the call.
pub fn external_done(
    t: &mut Tx<'_>,
    sid: &str,
    run_id: &str,
    call_id: &str,
    outside: super::external::Outside,
    env: &Env<'_>,
) -> Result<(Next, Vec<Unredacted>), StoreError> {
    on_current(t, sid, run_id, env, |t, rec, unredacted| {
        let Some(first) = rec
            .open
            .first()
            .filter(|o| o.call.id == call_id && o.started)
            .cloned()
        else {
            return Ok(());
        };
        if matches!(outside, super::external::Outside::NotSent) {
            // Nothing went out: the call is as before it started, for the boundary's
            // cancel to answer.
            rec.open[0].started = false;
            return Ok(());
        }
        let answered = super::external::finish(t, sid, &first, outside, env.now)?;
        if answered.secret.is_some() {
            unredacted.push((rec.transcript_len, answered.result.to_string()));
        }
        let stored = tools::redacted(&answered.result, answered.secret.as_deref());
        answer_first(t, sid, rec, answered.ok, stored, env.now)
    })
}

/// Step `at` failed for good (the model server): the run ends with `model_call_failed`,
/// and the session goes on to its next boundary.
pub fn step_failed(
    t: &mut Tx<'_>,
    at: &StepAt,
    message: String,
    retries: Vec<RetryNote>,
    env: &Env<'_>,
) -> Result<(Next, Vec<Unredacted>), StoreError> {
    on_current(t, &at.sid, &at.run_id, env, |t, rec, _| {
        record_retries(t, at, retries, env.now)?;
        end_run(
            t,
            &at.sid,
            rec,
            failed("model_call_failed", None, message),
            env.now,
        )
    })
}

/// Takes a summary computed beside the steps: in force from now on if it still matches
/// the transcript and the summary it was computed from ([`compact::valid`]), else passed
/// over (a later step computes another). A forced compaction is answered either way.
fn take_compaction(
    t: &Tx<'_>,
    sid: &str,
    rec: &mut AgentRecord,
    c: &cortex_protocol::api::Compaction,
) -> Result<(), StoreError> {
    if c.cause == "forced" {
        rec.compact_asked = false;
    }
    let stored = t.transcript_from(sid, c.from)?;
    match compact::valid(c, rec.prefix_len, rec.summary.as_ref(), &stored) {
        Ok(()) => {
            let count = rec.summary.as_ref().map_or(0, |s| s.count) + 1;
            tracing::info!(session = %sid, cause = %c.cause, through = c.through,
                tokens_before = c.tokens_before, tokens_after = c.tokens_after,
                elapsed_ms = c.elapsed_ms, "the transcript was compacted");
            rec.summary = Some(Summary {
                through: c.through,
                text: c.summary.clone(),
                count,
            });
        }
        Err(why) => {
            let error = c.error.as_deref().unwrap_or(why);
            tracing::info!(session = %sid, cause = %c.cause, error, "a compaction was passed over");
        }
    }
    Ok(())
}

/// A compaction the step waited for was posted: the boundary takes it and makes step
/// `at` again with it (after a refusal for size, `refused` is the server's words and a
/// `retry` with cause `context` is recorded).
pub fn step_again(
    t: &mut Tx<'_>,
    at: &StepAt,
    refused: Option<(String, Vec<RetryNote>)>,
    env: &Env<'_>,
) -> Result<(Next, Vec<Unredacted>), StoreError> {
    let (mut unredacted, mut prepared) = (Vec::new(), HashMap::new());
    if let Some((issues, retries)) = refused
        && t.agent(&at.sid)?
            .is_some_and(|r| is_current(&r, &at.run_id))
    {
        record_retries(t, at, retries, env.now)?;
        retry_event(t, at, "context", 1, issues, 0, env.now)?;
    }
    let next = boundary_at(t, &at.sid, env, &mut prepared, &mut unredacted, Some(at))?;
    Ok((next, unredacted))
}
