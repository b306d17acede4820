//! The step boundary: the inbox taken, the open calls answered (`calls.rs`), a run
//! started, put off or ended, the next step begun; or the session handed back, idle or
//! parked on a person.

use std::collections::HashMap;

use cortex_protocol::api::{AnswerItem, CreateSession, EventBody, RunInput, Usage};

use crate::model::ChatMessage;
use crate::runner::compact;
use crate::runner::decide::{self, Seen, Settle, Then};
use crate::runner::prefix;
use crate::runner::rules;
use crate::runner::tools;
use crate::store::agent::{AgentConfig, AgentRecord, RunStatus, Summary, Turn};
use crate::store::{StoreError, Tx};

use super::calls::{Progress, advance, answered, interrupt};
use super::run::{Env, Next, StepAt, Unredacted, end_run, event, failed, run_of};

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
pub(super) fn boundary_at(
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
            let caps = crate::runner::output::Caps::default();
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
