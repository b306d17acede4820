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

pub mod compact;
mod compactor;
pub mod decide;
pub mod external;
pub mod gate;
pub mod output;
pub mod prefix;
pub mod rules;
mod step;
pub mod tools;
pub mod turn;
/// Prepares one tool call as the runner does (a `wait_create` spawn built with its prefix).
pub use step::prepare as prepare_call;
mod write;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cortex_protocol::api::{Compaction, EventBody};
use tokio::sync::{Semaphore, mpsc};

use crate::model::{ChatMessage, Model};
use crate::state::AppState;
use crate::store::agent::{RunStatus, TOPIC_READY};
use crate::store::claims::Claimed;
use crate::store::{Durable, StoreError, Tx};
use crate::time::now_ms;
use compactor::{Compactor, Summed, summarize_here, window_or_estimate};
use step::{Shape, StepCall, Stepped, prepare, step_once};
use turn::{Next, RetryNote, StepAt};
use write::{DriveError, Wrote, write};

/// Ready sessions read per pass over the queue.
const PASS: usize = 256;

/// Runs the runner until the hub stops.
pub async fn run(state: AppState, model: Arc<dyn Model>) {
    let compactor = Arc::new(Compactor::default());
    // Asked beside the queue: a server slow to say does not hold the sessions back (until
    // it answers, a session is compacted only when a request is refused for its size).
    {
        let (me, model, stop) = (compactor.clone(), model.clone(), state.shutdown.clone());
        compactor.jobs.lock().unwrap_or_else(|e| e.into_inner()).spawn(async move {
            let window = tokio::select! {
                w = model.context_window() => w,
                () = stop.cancelled() => return,
            };
            match &window {
                Some(w) => {
                    tracing::info!(context_tokens = w.tokens, source = %w.source, "the model's context; sessions are compacted as they near it");
                    me.learn_context(w.tokens);
                }
                None => tracing::info!(
                    "the model's context is unknown (set llm.contextTokens or CORTEX_LLM_CONTEXT_TOKENS): a session is compacted only when the server refuses a request for its size"
                ),
            }
        });
    }
    let mut drivers = tokio::task::JoinSet::new();
    queue(&state, model, &compactor, &mut drivers).await;
    // The drivers see the stop too: a model call in flight is dropped, a store write
    // finishes. Each holds the state, so the store closes only once they are gone.
    while drivers.join_next().await.is_some() {}
    let mut jobs = std::mem::take(&mut *compactor.jobs.lock().unwrap_or_else(|e| e.into_inner()));
    while jobs.join_next().await.is_some() {}
}

/// How long the runner waits after its store failed before it reads its queue again or
/// drives the session again.
const AFTER_STORE_FAILURE: Duration = Duration::from_secs(2);

async fn queue(
    state: &AppState,
    model: Arc<dyn Model>,
    compactor: &Arc<Compactor>,
    drivers: &mut tokio::task::JoinSet<()>,
) {
    let slots = Arc::new(Semaphore::new(state.agent_defaults.concurrency()));
    let in_flight: Arc<Mutex<HashSet<String>>> = Arc::default();
    // A driver's end: its session, and when another hub held it, until when.
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(String, Option<u64>)>();
    let mut ready = state.store.notifier.watch(TOPIC_READY, "", 0);
    // From the start of the queue: what a stopped hub left ready or running comes first.
    let mut cursor = 0u64;
    let mut recheck: Vec<String> = Vec::new();
    // Sessions another hub holds, tried again once its lease would have ended.
    let mut later: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    loop {
        ready.borrow_and_update();
        let mut found: Vec<String> = std::mem::take(&mut recheck);
        loop {
            let after = cursor;
            let page = match state.store.read(move |r| r.ready_after(after, PASS)).await {
                Ok(p) => p,
                Err(e) => {
                    // The store is away (PostgreSQL restarting, a connection cut): the
                    // page is read again shortly.
                    tracing::warn!(error = %e, "the runner cannot read its queue; it reads it again shortly");
                    tokio::select! {
                        () = tokio::time::sleep(AFTER_STORE_FAILURE) => {}
                        () = state.shutdown.cancelled() => return,
                    }
                    continue;
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
            let compactor = compactor.clone();
            drivers.spawn(async move {
                let elsewhere = match claimed(&state, &model, &compactor, &sid).await {
                    Ok(e) => e,
                    Err(e) => {
                        tracing::error!(session = %sid, error = %e, "the runner stopped driving a session; it is tried again shortly");
                        Some(now_ms() + AFTER_STORE_FAILURE.as_millis() as u64)
                    }
                };
                drop(permit);
                let _ = done.send((sid, elsewhere));
            });
        }
        let next_later = later.keys().next().copied();
        tokio::select! {
            changed = ready.changed() => if changed.is_err() { return },
            // A finished driver's handle, reaped so the set does not grow with every run.
            Some(_) = drivers.join_next(), if !drivers.is_empty() => {}
            Some((sid, elsewhere)) = done_rx.recv() => {
                in_flight.lock().unwrap_or_else(|e| e.into_inner()).remove(&sid);
                if let Some(until) = elsewhere {
                    later.entry(until).or_default().push(sid);
                    continue;
                }
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
            () = until_ms(next_later) => {
                let now = now_ms();
                while let Some(e) = later.first_entry() {
                    if *e.key() > now {
                        break;
                    }
                    recheck.extend(e.remove());
                }
            }
            () = state.shutdown.cancelled() => return,
        }
    }
}

/// Sleeps until `at` (ms of the store's clock), or for ever without one.
async fn until_ms(at: Option<u64>) {
    match at {
        Some(at) => {
            tokio::time::sleep(Duration::from_millis(at.saturating_sub(now_ms()) + 1)).await;
        }
        None => std::future::pending().await,
    }
}

/// Claims `sid` for this hub and drives it while the claim holds, then releases it;
/// when another hub holds it, the end of that hub's lease (nothing is driven). A session
/// handed back idle since it was queued is left as it is.
async fn claimed(
    state: &AppState,
    model: &Arc<dyn Model>,
    compactor: &Arc<Compactor>,
    sid: &str,
) -> Result<Option<u64>, DriveError> {
    let (hub, lease, s) = (
        state.claims.hub.clone(),
        state.claims.lease_ms,
        sid.to_string(),
    );
    let claimed = state
        .store
        .exec(move |t| {
            if t.agent(&s)?.is_none_or(|r| r.status == RunStatus::Idle) {
                return Ok(None);
            }
            t.claim_session(&s, &hub, now_ms(), lease).map(Some)
        })
        .await?;
    let epoch = match claimed {
        None => return Ok(None),
        Some(Claimed::Held(epoch)) => epoch,
        Some(Claimed::Elsewhere { hub, until }) => {
            tracing::debug!(session = %sid, %hub, until, "another hub drives this session");
            return Ok(Some(until));
        }
    };
    state.claims.hold(sid, epoch);
    let r = drive(state, model, compactor, sid).await;
    state.claims.forget(sid, epoch);
    if let Err(DriveError::Store(e)) = &r
        && let StoreError::Fenced(why) = &**e
    {
        // Another hub holds it now (or will once it sees the lease ended): nothing of
        // this driver's is written from here on, and nothing is released.
        tracing::warn!(session = %sid, "{why}");
        return Ok(None);
    }
    // Released, so another hub may take it at once (it is idle or parked, or this hub
    // stops).
    let (hub, s) = (state.claims.hub.clone(), sid.to_string());
    if let Err(e) = state
        .store
        .exec(move |t| t.release_claim(&s, &hub, epoch))
        .await
    {
        tracing::warn!(session = %sid, error = %e, "cannot release this hub's claim on a session; it ends with its lease");
    }
    r.map(|()| None)
}

/// Drives one session until it is handed back idle or parked (or the hub stops).
async fn drive(
    state: &AppState,
    model: &Arc<dyn Model>,
    compactor: &Arc<Compactor>,
    sid: &str,
) -> Result<(), DriveError> {
    // Heard while this task waits on the model or a device: a cancel. Rings that came
    // before a write are forgotten as it starts: the write takes their items.
    let mut stop = state
        .stops
        .listen(sid)
        .hearing(state.store.notifier.subscribe_stop(sid));
    // The transcript as stored (secrets redacted), kept for the life of this task and
    // grown from what each write returns.
    let mut messages: Vec<ChatMessage> = Vec::new();
    // Tool answers whose stored copy hides a secret, for the rest of the run.
    let mut unredacted: HashMap<u64, String> = HashMap::new();
    stop.clear();
    let s = sid.to_string();
    let mut wrote = write(state, sid, 0, move |t, env| {
        // A mailbox is never driven (an older hub may have queued one).
        if !t.claim_runs(&s)? {
            return Ok((Next::Idle, Vec::new()));
        }
        let (mut prepared, mut secrets) = (HashMap::new(), Vec::new());
        let next = turn::boundary(t, &s, env, &mut prepared, &mut secrets)?;
        Ok((next, secrets))
    })
    .await?;
    // The tools the model is shown and how its answer travels: fixed with the session's
    // configuration (read once, after the first write fixed one for a session made
    // without).
    let config = {
        let s = sid.to_string();
        state
            .store
            .read(move |r| Ok(r.agent(&s)?.and_then(|a| a.config)))
            .await
            .map_err(|e| DriveError::Store(Arc::new(e)))?
    };
    let typed = config.as_ref().and_then(|c| c.output.as_ref());
    let output = output::budget::for_run(typed, state.settings.limits.schema_compile_ms).await;
    let shape = Shape::of(config.as_ref(), output, &state.caps);
    // The last step's record, answered before it was durable: the next model call goes
    // out while it is written, and nothing else happens until it is on disk.
    let mut writing: Option<Durable> = None;
    // The bytes a request carries besides its messages.
    let overhead = serde_json::to_vec(&shape.specs).map_or(0, |v| v.len()) + 200;
    // The step made again after a compaction it waited for, or after a refusal for size:
    // once each.
    let (mut waited_for, mut refused_for): (Option<StepAt>, Option<StepAt>) = (None, None);
    loop {
        let (next, tail, secrets) = wrote;
        if matches!(next, Next::Step { step: 1, .. }) {
            // A new run: what this task kept for the last one does not carry over.
            unredacted.clear();
        }
        unredacted.extend(secrets);
        messages.extend(tail);
        if !matches!(next, Next::Step { .. })
            && let Some(w) = writing.take()
        {
            w.wait().await?;
        }
        let known = messages.len() as u64;
        wrote = match next {
            Next::Idle => return Ok(()),
            Next::Prepare { calls, .. } => {
                let mut ready = Vec::with_capacity(calls.len());
                for c in calls {
                    let p = prepare(state, sid, &c, &shape.shown).await;
                    ready.push((c, p));
                }
                let s = sid.to_string();
                stop.clear();
                write(state, sid, known, move |t, env| {
                    turn::calls_ready(t, &s, ready, env)
                })
                .await?
            }
            Next::External {
                run_id,
                call,
                again,
            } => {
                // Not cut by a cancel: an ask that went out is answered (bounded) and
                // recorded, then the boundary takes the cancel. The work itself listens
                // where nothing is in flight.
                let done = tokio::select! {
                    a = external::run(state, sid, &call, again, &mut stop) => a,
                    () = state.shutdown.cancelled() => return Ok(()),
                };
                let s = sid.to_string();
                stop.clear();
                write(state, sid, known, move |t, env| {
                    turn::external_done(t, &s, &run_id, &call.id, done, env)
                })
                .await?
            }
            Next::Compact {
                prefix_len,
                summary,
                max_tokens,
            } => {
                let job = compact::Job {
                    messages: messages.clone(),
                    prefix_len,
                    summary,
                    context: compactor.context().unwrap_or(0),
                    max_tokens,
                    per_byte: compactor.per_byte(sid),
                    overhead,
                    cause: "forced",
                };
                let job = compact::Job {
                    context: window_or_estimate(&job),
                    ..job
                };
                let c = match summarize_here(state, model.as_ref(), &mut stop, &job).await {
                    Summed::Done(c) => c,
                    Summed::Stopping => return Ok(()),
                    // Answered still, so the ask does not come back after the cancel.
                    Summed::Stopped => Compaction {
                        cause: "forced".into(),
                        from: job.from(),
                        through: job.from(),
                        error: Some("a cancel stopped it".into()),
                        ..Compaction::default()
                    },
                };
                let s = sid.to_string();
                stop.clear();
                write(state, sid, known, move |t, env| {
                    event(t, &s, EventBody::Compaction(Box::new(c)), env.now)?;
                    let (mut prepared, mut secrets) = (HashMap::new(), Vec::new());
                    let next = turn::boundary(t, &s, env, &mut prepared, &mut secrets)?;
                    Ok((next, secrets))
                })
                .await?
            }
            Next::Step {
                run_id,
                step,
                max_tokens,
                seq,
                prefix_len,
                summary,
                during,
            } => {
                let at = StepAt {
                    sid: sid.to_string(),
                    run_id: run_id.clone(),
                    step,
                };
                let sent = compact::context(
                    &patched(&messages, &unredacted),
                    prefix_len,
                    summary.as_ref(),
                );
                let per_byte = compactor.per_byte(sid);
                let bytes: usize =
                    sent.iter().map(compact::message_bytes).sum::<usize>() + overhead;
                let estimate = compact::tokens(bytes, per_byte);
                let context = compactor.context();
                let plan = context.map_or(compact::Plan::Fits, |ctx| {
                    compact::plan(estimate, compact::reserve(max_tokens, ctx), ctx)
                });
                let job = |cause, context: u64, per_byte: f64| compact::Job {
                    messages: messages.clone(),
                    prefix_len,
                    summary: summary.clone(),
                    context,
                    max_tokens,
                    per_byte,
                    overhead,
                    cause,
                };
                let waited = waited_for.as_ref().is_some_and(|w| same_step(w, &at));
                if plan == compact::Plan::Now && !waited {
                    // It would not fit: the step waits for the summary (once).
                    tracing::info!(session = %sid, estimate, context = context.unwrap_or(0), "the next request nears the model's context; it waits for a compaction");
                    waited_for = Some(at.clone());
                    let j = job("threshold", context.unwrap_or(0), per_byte);
                    let summed = summarize_here(state, model.as_ref(), &mut stop, &j).await;
                    if let Some(w) = writing.take() {
                        w.wait().await?;
                    }
                    wrote = match summed {
                        Summed::Done(c) => {
                            post_and_step_again(state, sid, known, c, at, None).await?
                        }
                        Summed::Stopping => return Ok(()),
                        Summed::Stopped => interrupted(state, sid, known, &mut stop, at).await?,
                    };
                    continue;
                }
                if plan == compact::Plan::Soon {
                    let ctx = context.unwrap_or(0);
                    let from = summary.as_ref().map_or(prefix_len, |s| s.through);
                    let job = || job("threshold", ctx, per_byte);
                    compactor.start(state, model, sid, from, job);
                }
                let may_retry = !refused_for.as_ref().is_some_and(|r| same_step(r, &at));
                let stepped = step_once(
                    state,
                    model.as_ref(),
                    compactor,
                    sid,
                    &sent,
                    bytes,
                    &shape,
                    &mut stop,
                    StepCall {
                        run_id,
                        step,
                        max_tokens,
                        seq,
                        known,
                        during,
                    },
                    may_retry,
                    writing.take(),
                )
                .await?;
                match stepped {
                    Stepped::Stopping => return Ok(()),
                    Stepped::Wrote(w, done) => {
                        writing = done;
                        w
                    }
                    Stepped::Refused {
                        message,
                        retries,
                        context: said,
                        prompt_tokens,
                    } => {
                        tracing::info!(session = %sid, estimate, error = %message, "the model server refused a request for its size; the transcript is compacted and the step made again");
                        refused_for = Some(at.clone());
                        // What the refusal says: the context, and the request's real size.
                        if let Some(n) = said
                            && context.is_none_or(|c| n < c)
                        {
                            tracing::info!(session = %sid, context_tokens = n, "the model's context, as the server's refusal names it");
                            compactor.learn_context(n);
                        }
                        let mut per_byte = per_byte;
                        if let Some(p) = prompt_tokens.and_then(|p| compact::calibrate(p, bytes)) {
                            compactor.learn(sid, p);
                            per_byte = p;
                        }
                        // The request was bigger than it looked: size the summary for
                        // three quarters of it, or of the context if that is smaller.
                        let real = compact::tokens(bytes, per_byte);
                        let ctx = compactor
                            .context()
                            .map_or(real * 3 / 4, |c| c.min(real * 3 / 4))
                            .max(256);
                        let j = job("refused", ctx, per_byte);
                        match summarize_here(state, model.as_ref(), &mut stop, &j).await {
                            Summed::Done(c) => {
                                let refused = Some((message, retries));
                                post_and_step_again(state, sid, known, c, at, refused).await?
                            }
                            Summed::Stopping => return Ok(()),
                            Summed::Stopped => {
                                interrupted(state, sid, known, &mut stop, at).await?
                            }
                        }
                    }
                }
            }
        };
    }
}

/// Step `at`, begun and waiting on a summary, was stopped by a cancel: recorded as a
/// model call the cancel cut off before it wrote anything.
async fn interrupted(
    state: &AppState,
    sid: &str,
    known: u64,
    stop: &mut crate::stops::Listener,
    at: StepAt,
) -> Result<Wrote, DriveError> {
    stop.clear();
    write(state, sid, known, move |t, env| {
        turn::step_interrupted(t, &at, String::new(), Vec::new(), env)
    })
    .await
}

fn same_step(a: &StepAt, b: &StepAt) -> bool {
    a.run_id == b.run_id && a.step == b.step
}

/// `messages` with the answers whose stored copy hides a secret as the model must read them.
fn patched(messages: &[ChatMessage], unredacted: &HashMap<u64, String>) -> Vec<ChatMessage> {
    let mut copy = messages.to_vec();
    for (i, content) in unredacted {
        if let Some(m) = usize::try_from(*i).ok().and_then(|i| copy.get_mut(i)) {
            m.content = Some(content.clone());
        }
    }
    copy
}

/// Posts compaction `c` (to the inbox: the boundary takes it) and makes step `at` again.
async fn post_and_step_again(
    state: &AppState,
    sid: &str,
    known: u64,
    c: cortex_protocol::api::Compaction,
    at: StepAt,
    refused: Option<(String, Vec<RetryNote>)>,
) -> Result<Wrote, DriveError> {
    let s = sid.to_string();
    write(state, sid, known, move |t, env| {
        event(t, &s, EventBody::Compaction(Box::new(c)), env.now)?;
        turn::step_again(t, &at, refused, env)
    })
    .await
}

/// Appends `body` to `sid`'s log.
fn event(t: &mut Tx<'_>, sid: &str, body: EventBody, now: u64) -> Result<u64, StoreError> {
    t.append_event(sid, body, now)?
        .ok_or_else(|| StoreError::Decode(format!("session {sid} vanished mid-write")))
}
