//! The runner: the hub's own agent loop. It drives the sessions in the ready queue, a
//! bounded number at once (settings.json `agent.concurrency`, default 8), the others
//! waiting in the order they became ready. Driving a session is: at a step boundary take
//! its inbox (`turn::boundary`), call the model with the whole transcript (the text
//! streaming live to followers), prepare the reply's tool calls, and record the step
//! (`turn::step_done`), until the run ends and nothing is unread; then the session is
//! handed back idle and the task ends. An idle session costs nothing but its rows.
//!
//! After a crash or restart the queue still holds every session that was ready or
//! running, so the runner goes on where it stopped.

pub mod prefix;
pub mod rules;
pub mod tools;
pub mod turn;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use cortex_host::timing;
use cortex_protocol::api::{DeltaChannel, Event, EventBody};
use tokio::sync::{Semaphore, mpsc};

use crate::model::{ChatMessage, Delta, Model, StepRequest, ToolCall};
use crate::state::AppState;
use crate::store::agent::{RunStatus, TOPIC_READY};
use crate::store::{StoreError, Tx};
use crate::time::now_ms;
use turn::{Next, RetryNote, StepAt};

/// Ready sessions read per pass over the queue.
const PASS: usize = 256;

/// Runs the runner until the hub stops.
pub async fn run(state: AppState, model: Arc<dyn Model>) {
    let mut drivers = tokio::task::JoinSet::new();
    queue(&state, model, &mut drivers).await;
    // The drivers see the stop too: a model call in flight is dropped, a store write
    // finishes. Each holds the state, so the store closes only once they are gone.
    while drivers.join_next().await.is_some() {}
}

async fn queue(state: &AppState, model: Arc<dyn Model>, drivers: &mut tokio::task::JoinSet<()>) {
    let slots = Arc::new(Semaphore::new(state.agent_defaults.concurrency()));
    let in_flight: Arc<Mutex<HashSet<String>>> = Arc::default();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<String>();
    let mut ready = state.store.notifier.watch(TOPIC_READY, "", 0);
    // From the start of the queue: what a stopped hub left ready or running comes first.
    let mut cursor = 0u64;
    let mut recheck: Vec<String> = Vec::new();
    loop {
        ready.borrow_and_update();
        let mut found: Vec<String> = std::mem::take(&mut recheck);
        loop {
            let after = cursor;
            let page = match state.store.read(move |r| r.ready_after(after, PASS)).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(error = %e, "the runner cannot read its queue; it stops");
                    return;
                }
            };
            let Some((last, _)) = page.last() else {
                break;
            };
            cursor = *last;
            found.extend(page.into_iter().map(|(_, sid)| sid));
        }
        for sid in found {
            if !in_flight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(sid.clone())
            {
                continue;
            }
            let permit = tokio::select! {
                p = slots.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
                () = state.shutdown.cancelled() => return,
            };
            let (state, model, done) = (state.clone(), model.clone(), done_tx.clone());
            drivers.spawn(async move {
                if let Err(e) = drive(&state, model.as_ref(), &sid).await {
                    tracing::error!(session = %sid, error = %e, "the runner stopped driving a session; it goes on after the hub restarts");
                }
                drop(permit);
                let _ = done.send(sid);
            });
        }
        tokio::select! {
            changed = ready.changed() => if changed.is_err() { return },
            // A finished driver's handle, reaped so the set does not grow with every run.
            Some(_) = drivers.join_next(), if !drivers.is_empty() => {}
            Some(sid) = done_rx.recv() => {
                in_flight.lock().unwrap_or_else(|e| e.into_inner()).remove(&sid);
                // It may have become ready again while it was handed back (a post
                // between the hand-back and now): its queue entry is then behind the
                // cursor already.
                let s = sid.clone();
                if let Ok(Some(rec)) = state.store.read(move |r| r.agent(&s)).await
                    && rec.status != RunStatus::Idle
                {
                    recheck.push(sid);
                }
            }
            () = state.shutdown.cancelled() => return,
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum DriveError {
    #[error("the store failed: {0}")]
    Store(#[from] Arc<crate::store::StoreError>),
}

/// `next`, with the transcript's messages from `known` on when it is a step: read in the
/// write that produced them, so a step needs no second trip to the store.
fn with_tail(
    t: &Tx<'_>,
    sid: &str,
    next: Next,
    known: u64,
) -> Result<(Next, Vec<ChatMessage>), StoreError> {
    let tail = match next {
        Next::Step { .. } => t.transcript_from(sid, known)?,
        Next::Idle => Vec::new(),
    };
    Ok((next, tail))
}

/// Drives one session until it is handed back idle (or the hub stops).
async fn drive(state: &AppState, model: &dyn Model, sid: &str) -> Result<(), DriveError> {
    let defaults = Arc::new(state.agent_defaults.clone());
    // The transcript as stored (secrets redacted), kept for the life of this task and
    // grown from what each write returns.
    let mut messages: Vec<ChatMessage> = Vec::new();
    // Tool answers whose stored copy hides a secret, for the rest of the run.
    let mut unredacted: HashMap<u64, String> = HashMap::new();
    let (mut next, tail) = {
        let (s, d) = (sid.to_string(), defaults.clone());
        state
            .store
            .exec(move |t| {
                let next = turn::boundary(t, &s, &d, now_ms())?;
                with_tail(t, &s, next, 0)
            })
            .await?
    };
    messages.extend(tail);
    loop {
        let Next::Step {
            run_id,
            step,
            max_tokens,
            seq,
        } = next
        else {
            return Ok(());
        };
        let patched;
        let sent: &[ChatMessage] = if unredacted.is_empty() {
            &messages
        } else {
            let mut copy = messages.clone();
            for (i, content) in &unredacted {
                if let Some(m) = usize::try_from(*i).ok().and_then(|i| copy.get_mut(i)) {
                    m.content = Some(content.clone());
                }
            }
            patched = copy;
            &patched
        };
        let specs = tools::specs();
        let mut retries: Vec<RetryNote> = Vec::new();
        // Benchmarks' timing records (`CORTEX_TIMING_FILE`): where a step's time goes.
        let mark = format!("{run_id}/{step}");
        timing::record("runner_model_call", &mark, None);
        let outcome = {
            let mut on_delta =
                |d: Delta| live_piece(state, sid, &run_id, step, seq, d, &mut retries);
            let call = model.step(
                StepRequest {
                    messages: sent,
                    tools: &specs,
                    max_tokens,
                },
                &mut on_delta,
            );
            tokio::select! {
                r = call => r,
                // The model call is dropped (stopped); the session stays running in the
                // queue and its step is made again after the restart.
                () = state.shutdown.cancelled() => return Ok(()),
            }
        };
        timing::record("runner_model_done", &mark, None);
        let known = messages.len() as u64;
        let at = StepAt {
            sid: sid.to_string(),
            run_id: run_id.clone(),
            step,
        };
        let d = defaults.clone();
        let (after, tail, secrets) = match outcome {
            Ok(out) => {
                let mut calls: Vec<(ToolCall, tools::Prepared)> = Vec::new();
                for (n, mut call) in out.tool_calls.clone().into_iter().enumerate() {
                    if call.id.trim().is_empty() {
                        call.id = format!("call_{step}_{n}");
                    }
                    let p = tools::prepare(state, sid, &call).await;
                    calls.push((call, p));
                }
                let url = state.signal_url.clone();
                state
                    .store
                    .exec(move |t| {
                        let (next, secrets) =
                            turn::step_done(t, &at, out, retries, calls, &url, &d, now_ms())?;
                        let (next, tail) = with_tail(t, &at.sid, next, known)?;
                        Ok((next, tail, secrets))
                    })
                    .await?
            }
            Err(e) => {
                tracing::warn!(session = %sid, run = %run_id, step, error = %e, "a model call failed; the run ends");
                let msg = e.to_string();
                state
                    .store
                    .exec(move |t| {
                        let next = turn::step_failed(t, &at, msg, retries, &d, now_ms())?;
                        let (next, tail) = with_tail(t, &at.sid, next, known)?;
                        Ok((next, tail, Vec::new()))
                    })
                    .await?
            }
        };
        timing::record("runner_step_recorded", &mark, None);
        if matches!(after, Next::Step { step: 1, .. }) {
            // A new run: what this task kept for the last one does not carry over.
            unredacted.clear();
        }
        unredacted.extend(secrets);
        messages.extend(tail);
        next = after;
    }
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
    state.live.send(sid, || {
        serde_json::to_string(&Event {
            seq,
            ts: now_ms(),
            body,
        })
        .unwrap_or_default()
    });
}
