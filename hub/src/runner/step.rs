//! A step's model call: the request's shape ([`Shape`]), the call streamed live to
//! followers and kept to its run's bounds, the reply judged, its tool calls prepared, and
//! the step recorded ([`step_once`]).

use cortex_host::timing;
use cortex_protocol::api::{DeltaChannel, Event, EventBody};

use crate::model::{ChatMessage, Delta, Model, StepRequest, ToolSpec};
use crate::state::AppState;
use crate::store::agent::AgentConfig;
use crate::store::{Durable, StoreError, Tx};
use crate::time::now_ms;

use super::compactor::Compactor;
use super::output::{self, Judged, Output, Transport};
use super::turn::{self, Next, RetryNote, StepAt};
use super::write::{DriveError, Fence, Wrote, in_write, write_or};
use super::{compact, gate, prefix, rules, tools};

/// How a model call came out.
pub(super) enum Stepped {
    /// The hub is stopping.
    Stopping,
    /// Recorded: the write's answer and, for a reply, the record still going to disk.
    Wrote(Wrote, Option<Durable>),
    /// The server refused the request for its size (not recorded yet), naming perhaps
    /// the model's context and the request's tokens.
    Refused {
        message: String,
        retries: Vec<RetryNote>,
        context: Option<u64>,
        prompt_tokens: Option<u64>,
    },
}

/// What a session's model calls carry, fixed for the life of a driving task: the tools
/// the model is shown (the session's policy, and `respond` when the answer travels on
/// it) and its output's checks and transport.
pub(super) struct Shape {
    pub(super) specs: Vec<ToolSpec>,
    /// The built-in tools among `specs`: what a tool error's hint may name.
    pub(super) shown: tools::Shown,
    output: Output,
    transport: Transport,
    plan: Option<output::Plan>,
}

impl Shape {
    /// `output`: the session's schema compiled ([`output::budget::for_run`]).
    pub(super) fn of(
        config: Option<&AgentConfig>,
        output: Option<Output>,
        caps: &output::Caps,
    ) -> Shape {
        let policy = config.map(|c| c.policy.clone()).unwrap_or_default();
        let mut specs = gate::shown_specs(&policy);
        let shown = tools::Shown::of(&policy);
        let typed = config.and_then(|c| c.output.as_ref().zip(c.transport));
        let Some((o, transport)) = typed else {
            return Shape {
                specs,
                shown,
                output: Output::chat(),
                transport: Transport::Emit,
                plan: None,
            };
        };
        let output = output.unwrap_or_else(|| Output::refusing(o.clone()));
        let plan = output.plan_for(transport, caps);
        if let Some(tool) = &plan.respond {
            specs.push(tool.spec.clone());
        }
        Shape {
            specs,
            shown,
            output,
            transport,
            plan: Some(plan),
        }
    }
}

/// One model call's coordinates.
pub(super) struct StepCall {
    pub(super) run_id: String,
    pub(super) step: u32,
    pub(super) max_tokens: Option<u32>,
    pub(super) seq: u64,
    /// The transcript's length when the call was made.
    pub(super) known: u64,
    /// The run's bounds the call keeps while it streams.
    pub(super) during: rules::During,
}

/// How a model call ended, as the driver saw it.
enum Called {
    Done(Result<crate::model::StepOutput, crate::model::ModelError>),
    /// A cancel rang: the call was dropped mid-stream.
    Cancelled,
    /// The run's bound was reached mid-stream: the call was dropped.
    Bound(rules::Stop),
}

/// Makes model call `c` with `sent` (the request's messages, `bytes` with the tools) and
/// records what came of it; a refusal for size is handed back unrecorded when
/// `may_retry`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn step_once(
    state: &AppState,
    model: &dyn Model,
    compactor: &Compactor,
    sid: &str,
    sent: &[ChatMessage],
    bytes: usize,
    shape: &Shape,
    stop: &mut crate::stops::Listener,
    c: StepCall,
    may_retry: bool,
    writing: Option<Durable>,
) -> Result<Stepped, DriveError> {
    let mut retries: Vec<RetryNote> = Vec::new();
    // The reply's text so far, kept if a cancel cuts it off.
    let mut partial = String::new();
    // Benchmarks' timing records (`CORTEX_TIMING_FILE`): where a step's time goes.
    let mark = format!("{}/{}", c.run_id, c.step);
    timing::record("runner_model_call", &mark, None);
    // The answer's envelope as it streams (`output-delta`, `output-partial`), parsed only
    // when someone follows the session as the call begins.
    let followed = state.live.followed(sid);
    let mut stream = output::Stream::new(
        shape
            .output
            .config()
            .filter(|_| followed)
            .map(|_| shape.transport),
    );
    // The reply's bytes so far, for its tokens while the server reports none.
    let per_byte = compactor.per_byte(sid);
    let over = tokio::sync::Notify::new();
    let mut streamed = 0usize;
    let counts_tokens = c.during.tokens.is_some();
    let ends_in = c
        .during
        .ends_at
        .map(|at| std::time::Duration::from_millis(at.saturating_sub(now_ms())));
    let outcome = {
        let mut on_delta = |d: Delta| {
            streamed += match &d {
                Delta::Text(t) | Delta::Reasoning(t) => t.len(),
                Delta::ToolArgs { name, text, .. } => {
                    text.len() + name.as_ref().map_or(0, String::len)
                }
                Delta::Retry { .. } => 0,
            };
            if counts_tokens
                && rules::stop_during(&c.during, compact::tokens(streamed, per_byte), 0).is_some()
            {
                over.notify_one();
            }
            let piece = match &d {
                Delta::Text(t) => {
                    partial.push_str(t);
                    stream.text(t)
                }
                Delta::Retry { .. } => {
                    partial.clear();
                    stream.reset();
                    None
                }
                Delta::ToolArgs { index, name, text } => {
                    stream.tool_args(*index, name.as_deref(), text)
                }
                Delta::Reasoning(_) => None,
            };
            live_piece(state, sid, &c.run_id, c.step, c.seq, d, &mut retries);
            if let Some(p) = piece {
                live_output(state, sid, &c, p);
            }
        };
        let call = model.step(
            StepRequest {
                messages: sent,
                tools: &shape.specs,
                max_tokens: c.max_tokens,
                response_format: shape.plan.as_ref().and_then(|p| p.response_format.as_ref()),
                tool_choice_required: shape.plan.as_ref().is_some_and(|p| p.tool_choice_required),
            },
            &mut on_delta,
        );
        let time_up = async {
            match ends_in {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = call => Called::Done(r),
            // A cancel: the call stops at once (dropped).
            () = stop.rung() => Called::Cancelled,
            // The run's bounds hold mid-stream: the call is dropped as they are reached.
            () = over.notified() => Called::Bound(bound_stop(&c.during, streamed_tokens(&streamed, per_byte))),
            () = time_up => Called::Bound(bound_stop(&c.during, 0)),
            // The model call is dropped (stopped); the session stays running in the
            // queue and its step is made again after the restart.
            () = state.shutdown.cancelled() => return Ok(Stepped::Stopping),
        }
    };
    timing::record("runner_model_done", &mark, None);
    // The call was made from the last step's record; should that record not reach the
    // disk, the store refuses all writes and this answer is dropped unrecorded.
    if let Some(w) = writing {
        w.wait().await?;
    }
    let at = StepAt {
        sid: sid.to_string(),
        run_id: c.run_id.clone(),
        step: c.step,
    };
    let known = c.known;
    let outcome = match outcome {
        Called::Done(r) => r,
        Called::Cancelled => {
            stop.clear();
            let (again_at, again_retries, size) = (at.clone(), retries.clone(), partial.len());
            let w = write_or(
                state,
                sid,
                known,
                move |t, env| turn::step_interrupted(t, &at, partial, retries, env),
                move |t, env, _| {
                    turn::step_interrupted(t, &again_at, unrecorded(size), again_retries, env)
                },
            )
            .await?;
            return Ok(Stepped::Wrote(w, None));
        }
        Called::Bound(why) => {
            tracing::info!(session = %sid, run = %c.run_id, step = c.step, stop = why.stop, "a model call was stopped mid-stream by its run's bound");
            stop.clear();
            let (again_at, again_retries, again_why) = (at.clone(), retries.clone(), why.clone());
            let size = partial.len();
            let w = write_or(
                state,
                sid,
                known,
                move |t, env| turn::step_stopped(t, &at, partial, retries, why, env),
                move |t, env, _| {
                    turn::step_stopped(
                        t,
                        &again_at,
                        unrecorded(size),
                        again_retries,
                        again_why,
                        env,
                    )
                },
            )
            .await?;
            return Ok(Stepped::Wrote(w, None));
        }
    };
    if let Ok(out) = &outcome
        && let Some(per_byte) = out
            .usage
            .and_then(|u| compact::calibrate(u.prompt_tokens, bytes))
    {
        compactor.learn(sid, per_byte);
    }
    if let Err(e) = &outcome
        && may_retry
        && compact::is_context_refusal(e)
    {
        return Ok(Stepped::Refused {
            message: e.to_string(),
            retries,
            context: compact::refusal_context(e),
            prompt_tokens: compact::refusal_prompt_tokens(e),
        });
    }
    let (defaults, url) = (state.agent_defaults.clone(), state.signal_url.clone());
    let fence = Fence::of(state, sid)?;
    let record = |f: StepWrite| {
        let sid = sid.to_string();
        state
            .store
            .exec_ahead(move |t| in_write(t, &fence, &defaults, &url, &sid, known, f))
    };
    let (w, durable) = match outcome {
        Ok(out) => {
            let mut made = out.tool_calls.clone();
            for (n, call) in made.iter_mut().enumerate() {
                if call.id.trim().is_empty() {
                    call.id = format!("call_{}_{n}", c.step);
                }
            }
            let reply = match shape.output.judge_turn(shape.transport, &out.text, made) {
                Judged::Calls { run, dropped } => {
                    if dropped > 0 {
                        tracing::debug!(session = %sid, step = c.step, dropped, "respond called beside other tools: dropped");
                    }
                    let mut calls = Vec::with_capacity(run.len());
                    // Past the cap a call is answered, not run: not prepared either.
                    let cap = state.store.limits.tool_calls_per_reply as usize;
                    for (i, call) in run.into_iter().enumerate() {
                        let p = match i < cap {
                            true => prepare(state, sid, &call, &shape.shown).await,
                            false => tools::Prepared::not_run(),
                        };
                        calls.push((call, p));
                    }
                    turn::Reply::Calls(calls)
                }
                Judged::Answer { verdict, via } => turn::Reply::Answer { verdict, via },
            };
            stop.clear();
            let size = reply_size(&out);
            if size > RECORD_AHEAD_BYTES {
                // Recorded before anything else happens, so a refusal is heard here,
                // before another call is paid for.
                let (again_at, again_retries) = (at.clone(), retries.clone());
                let w = write_or(
                    state,
                    sid,
                    known,
                    move |t, env| turn::step_done(t, &at, out, retries, reply, env),
                    move |t, env, why| {
                        let msg = format!(
                            "the model's reply ({size} bytes) could not be recorded: {why}"
                        );
                        turn::step_failed(t, &again_at, msg, again_retries, env)
                    },
                )
                .await?;
                timing::record("runner_step_recorded", &mark, None);
                return Ok(Stepped::Wrote(w, None));
            }
            record(Box::new(move |t, env| {
                turn::step_done(t, &at, out, retries, reply, env)
            }))
            .await?
        }
        Err(e) => {
            tracing::warn!(session = %sid, run = %c.run_id, step = c.step, error = %e, "a model call failed; the run ends");
            let msg = e.to_string();
            stop.clear();
            record(Box::new(move |t, env| {
                turn::step_failed(t, &at, msg, retries, env)
            }))
            .await?
        }
    };
    timing::record("runner_step_recorded", &mark, None);
    Ok(Stepped::Wrote(w, Some(durable)))
}

/// A reply larger than this is recorded before the next model call goes out (smaller
/// ones are written while it does): a record the store refuses for its size is then
/// heard before another call is paid for.
const RECORD_AHEAD_BYTES: usize = 1 << 20;

/// A reply's bytes: its text, reasoning and tool calls.
fn reply_size(out: &crate::model::StepOutput) -> usize {
    out.text.len()
        + out.reasoning.len()
        + out
            .tool_calls
            .iter()
            .map(|c| c.function.name.len() + c.function.arguments.len())
            .sum::<usize>()
}

/// What a cut-off reply's text becomes when it was too large to record.
fn unrecorded(bytes: usize) -> String {
    format!("[the reply so far, {bytes} bytes, was too large to record]")
}

/// The stop a run's bound gives mid-stream, `streamed` tokens into the reply (the
/// duration's, when the time ran out with the tokens still under).
fn bound_stop(d: &rules::During, streamed: u64) -> rules::Stop {
    rules::stop_during(d, streamed, now_ms())
        .or_else(|| rules::stop_during(d, 0, u64::MAX))
        .unwrap_or(rules::Stop {
            stop: "duration",
            message: format!(
                "the run took more than {} ms (stop.durationMs)",
                d.duration_ms
            ),
        })
}

fn streamed_tokens(bytes: &usize, per_byte: f64) -> u64 {
    compact::tokens(*bytes, per_byte)
}

type StepResult = Result<(Next, Vec<turn::Unredacted>), StoreError>;
/// A step's record, run in the store's write.
type StepWrite = Box<dyn FnOnce(&mut Tx<'_>, &turn::Env<'_>) -> StepResult + Send>;

/// Sends a piece of the answer's envelope to `sid`'s followers (live only: the run's
/// `run-end` holds the envelope).
fn live_output(state: &AppState, sid: &str, c: &StepCall, p: output::stream::Piece) {
    let delta = EventBody::OutputDelta {
        run_id: c.run_id.clone(),
        step: c.step,
        text: p.delta,
        live: true,
    };
    let partial = p.partial.map(|partial| EventBody::OutputPartial {
        run_id: c.run_id.clone(),
        step: c.step,
        partial,
        live: true,
    });
    for body in std::iter::once(delta).chain(partial) {
        send_live(state, sid, c.seq, body);
    }
}

/// Sends `body` to `sid`'s followers as a live event (built only when someone follows).
fn send_live(state: &AppState, sid: &str, seq: u64, body: EventBody) {
    state.live.send(sid, || {
        serde_json::to_string(&Event {
            seq,
            ts: now_ms(),
            body,
        })
        .unwrap_or_default()
    });
}

/// Sends one streamed piece to `sid`'s followers; a retry is also kept for the record.
fn live_piece(
    state: &AppState,
    sid: &str,
    run_id: &str,
    step: u32,
    seq: u64,
    d: Delta,
    retries: &mut Vec<RetryNote>,
) {
    let body = match d {
        // Not shown live yet.
        Delta::ToolArgs { .. } => return,
        Delta::Text(text) => EventBody::ModelDelta {
            run_id: run_id.to_string(),
            step,
            text,
            channel: DeltaChannel::Text,
            live: true,
        },
        Delta::Reasoning(text) => EventBody::ModelDelta {
            run_id: run_id.to_string(),
            step,
            text,
            channel: DeltaChannel::Reasoning,
            live: true,
        },
        Delta::Retry {
            attempt,
            issues,
            delay,
        } => {
            let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            retries.push(RetryNote {
                attempt,
                issues: issues.clone(),
                delay_ms,
            });
            EventBody::Retry {
                run_id: run_id.to_string(),
                step,
                cause: "provider".into(),
                attempt,
                issues,
                delay_ms,
            }
        }
    };
    send_live(state, sid, seq, body);
}

/// Prepares one tool call ([`tools::prepare`]), building a `wait_create`'s spawned
/// sessions' configuration and prefix here, where the prefix is known.
pub async fn prepare(
    state: &AppState,
    sid: &str,
    call: &crate::model::ToolCall,
    shown: &tools::Shown,
) -> tools::Prepared {
    tools::prepare(state, sid, call, shown)
        .await
        .build_spawn(|parent, instructions| {
            let (config, prefix) =
                prefix::spawned(&state.agent_defaults, &state.caps, parent, instructions)?;
            Ok(crate::store::ops::SpawnSetup { config, prefix })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replys_size_counts_text_reasoning_and_calls() {
        let out = crate::model::StepOutput {
            text: "abc".into(),
            reasoning: "de".into(),
            tool_calls: vec![crate::model::ToolCall {
                id: "c".into(),
                kind: "function".into(),
                function: crate::model::FunctionCall {
                    name: "wait_create".into(),
                    arguments: "{}".into(),
                },
            }],
            ..Default::default()
        };
        assert_eq!(reply_size(&out), 3 + 2 + 11 + 2);
    }
}
