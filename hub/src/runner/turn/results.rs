//! A step's results as the driver brings them: the model's reply (its calls opened, or
//! its answer taken), a call cut off (a cancel, a bound), calls prepared, work outside the
//! hub done, a model call failed, a compaction waited for; each then takes the boundary.

use std::collections::HashMap;

use cortex_protocol::api::{DeltaChannel, EventBody, RunError, RunResult};

use crate::model::{ChatMessage, StepOutput, ToolCall};
use crate::runner::output::{Transport, Verdict, correct, last_output};
use crate::runner::rules;
use crate::runner::tools;
use crate::store::agent::{AgentRecord, OpenCall};
use crate::store::{StoreError, Tx};

use super::boundary::{boundary, boundary_at};
use super::calls::answer_first;
use super::run::{Env, Next, StepAt, Unredacted, end_run, event, failed};

/// The marker after the text of a reply a cancel cut off.
pub const INTERRUPTED_MARKER: &str = "[Request interrupted by user]";

/// A retry the model client made during a step, recorded with the step.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryNote {
    pub attempt: u32,
    pub issues: String,
    pub delay_ms: u64,
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

/// A model turn as the driver judged it ([`crate::runner::output::Output::judge_turn`]).
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
    outside: crate::runner::external::Outside,
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
        if matches!(outside, crate::runner::external::Outside::NotSent) {
            // Nothing went out: the call is as before it started, for the boundary's
            // cancel to answer.
            rec.open[0].started = false;
            return Ok(());
        }
        let answered = crate::runner::external::finish(t, sid, &first, outside, env.now)?;
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
