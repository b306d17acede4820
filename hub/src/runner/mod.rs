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
pub mod decide;
pub mod external;
pub mod gate;
pub mod output;
pub mod prefix;
pub mod rules;
pub mod tools;
pub mod turn;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cortex_host::timing;
use cortex_protocol::api::{Compaction, DeltaChannel, Event, EventBody};
use tokio::sync::{Semaphore, mpsc};

use crate::model::{ChatMessage, Delta, Model, StepRequest, ToolSpec};
use crate::state::AppState;
use crate::store::agent::AgentConfig;
use crate::store::agent::{RunStatus, TOPIC_READY};
use crate::store::{Durable, StoreError, Tx};
use crate::time::now_ms;
use output::{Judged, Output, Transport};
use turn::{Next, RetryNote, StepAt};

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

/// What the runner knows for compaction: the model's context, the sessions with a
/// summary being computed beside their steps, and each session's tokens per byte as the
/// server counted its last request. All of it is in memory only: lost with the process,
/// it is asked or computed again.
#[derive(Default)]
struct Compactor {
    /// The model's context in tokens; 0: unknown.
    context: AtomicU64,
    jobs: Mutex<tokio::task::JoinSet<()>>,
    running: Mutex<HashSet<String>>,
    /// Per session, where the last summary posted from beside the steps starts: another
    /// from the same place would only repeat it before the boundary takes it.
    posted: Mutex<HashMap<String, u64>>,
    per_byte: Mutex<HashMap<String, f64>>,
}

impl Compactor {
    fn context(&self) -> Option<u64> {
        Some(self.context.load(Ordering::Relaxed)).filter(|&n| n > 0)
    }

    /// The context is `tokens`, or less if it was known to be less.
    fn learn_context(&self, tokens: u64) {
        let _ = self
            .context
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                Some(match now {
                    0 => tokens,
                    n => n.min(tokens),
                })
            });
    }

    fn per_byte(&self, sid: &str) -> f64 {
        let m = self.per_byte.lock().unwrap_or_else(|e| e.into_inner());
        m.get(sid)
            .copied()
            .unwrap_or(compact::DEFAULT_TOKENS_PER_BYTE)
    }

    fn learn(&self, sid: &str, per_byte: f64) {
        let mut m = self.per_byte.lock().unwrap_or_else(|e| e.into_inner());
        m.insert(sid.to_string(), per_byte);
    }

    /// Starts computing `job` beside `sid`'s steps unless one is already, or one from the
    /// same place waits in the inbox; a summary is posted to the session's inbox (a
    /// failure is logged, and a later step tries again).
    fn start(
        self: &Arc<Self>,
        state: &AppState,
        model: &Arc<dyn Model>,
        sid: &str,
        from: u64,
        job: impl FnOnce() -> compact::Job,
    ) {
        let posted = self
            .posted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(sid)
            == Some(&from);
        if posted
            || !self
                .running
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(sid.to_string())
        {
            return;
        }
        let job = job();
        let (state, model, me, sid) = (state.clone(), model.clone(), self.clone(), sid.to_string());
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        while jobs.try_join_next().is_some() {}
        jobs.spawn(async move {
            tracing::debug!(session = %sid, "a compaction starts beside the steps");
            let done = tokio::select! {
                c = compact::summarize(model.as_ref(), &job) => Some(c),
                () = state.shutdown.cancelled() => None,
            };
            match done {
                Some(c) if c.error.is_none() => {
                    let s = sid.clone();
                    let body = EventBody::Compaction(Box::new(c));
                    match state.store.exec(move |t| t.append_event(&s, body, now_ms())).await {
                        Ok(_) => {
                            me.posted.lock().unwrap_or_else(|e| e.into_inner()).insert(sid.clone(), from);
                        }
                        Err(e) => tracing::warn!(session = %sid, error = %e, "a compaction could not be posted"),
                    }
                }
                Some(c) => {
                    tracing::info!(session = %sid, error = c.error.as_deref().unwrap_or_default(), "a compaction beside the steps came to nothing");
                }
                None => {}
            }
            me.running.lock().unwrap_or_else(|e| e.into_inner()).remove(&sid);
        });
    }
}

async fn queue(
    state: &AppState,
    model: Arc<dyn Model>,
    compactor: &Arc<Compactor>,
    drivers: &mut tokio::task::JoinSet<()>,
) {
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
            let compactor = compactor.clone();
            drivers.spawn(async move {
                if let Err(e) = drive(&state, &model, &compactor, &sid).await {
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
        Next::Step { .. } | Next::Compact { .. } => t.transcript_from(sid, known)?,
        _ => Vec::new(),
    };
    Ok((next, tail))
}

/// What one of the runner's writes hands back: what to do next, the transcript's new
/// messages, and the answers whose stored copy hides a secret.
type Wrote = (Next, Vec<ChatMessage>, Vec<turn::Unredacted>);

/// Runs one of the runner's writes (`f`, given the write's [`turn::Env`]), with the
/// transcript read on from `known`.
async fn write<F>(state: &AppState, sid: &str, known: u64, f: F) -> Result<Wrote, DriveError>
where
    F: for<'e> FnOnce(
            &mut Tx<'_>,
            &turn::Env<'e>,
        ) -> Result<(Next, Vec<turn::Unredacted>), StoreError>
        + Send
        + 'static,
{
    let (defaults, url, sid) = (
        state.agent_defaults.clone(),
        state.signal_url.clone(),
        sid.to_string(),
    );
    Ok(state
        .store
        .exec(move |t| {
            let env = turn::Env {
                defaults: &defaults,
                signal_url: &url,
                now: now_ms(),
            };
            let (next, secrets) = f(t, &env)?;
            let (next, tail) = with_tail(t, &sid, next, known)?;
            Ok((next, tail, secrets))
        })
        .await?)
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
    let mut stop = state.stops.listen(sid);
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

/// How a summary computed in the step's place came out.
enum Summed {
    Done(Compaction),
    /// A cancel was heard: its item is in the inbox.
    Stopped,
    /// The hub is stopping.
    Stopping,
}

/// Computes `job` while the session's step waits on it.
async fn summarize_here(
    state: &AppState,
    model: &dyn Model,
    stop: &mut crate::stops::Listener,
    job: &compact::Job,
) -> Summed {
    tokio::select! {
        c = compact::summarize(model, job) => Summed::Done(c),
        () = stop.rung() => Summed::Stopped,
        () = state.shutdown.cancelled() => Summed::Stopping,
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

/// A forced compaction's context when the model's is unknown: the whole request's.
fn window_or_estimate(job: &compact::Job) -> u64 {
    if job.context > 0 {
        return job.context;
    }
    let bytes: usize = job
        .messages
        .iter()
        .map(compact::message_bytes)
        .sum::<usize>()
        + job.overhead;
    compact::tokens(bytes, job.per_byte).max(1024)
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

/// How a model call came out.
enum Stepped {
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
struct Shape {
    specs: Vec<ToolSpec>,
    /// The built-in tools among `specs`: what a tool error's hint may name.
    shown: tools::Shown,
    output: Output,
    transport: Transport,
    plan: Option<output::Plan>,
}

impl Shape {
    /// `output`: the session's schema compiled ([`output::budget::for_run`]).
    fn of(config: Option<&AgentConfig>, output: Option<Output>, caps: &output::Caps) -> Shape {
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
struct StepCall {
    run_id: String,
    step: u32,
    max_tokens: Option<u32>,
    seq: u64,
    /// The transcript's length when the call was made.
    known: u64,
    /// The run's bounds the call keeps while it streams.
    during: rules::During,
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
async fn step_once(
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
    let record = |f: StepWrite| {
        let sid = sid.to_string();
        state.store.exec_ahead(move |t| {
            let env = turn::Env {
                defaults: &defaults,
                signal_url: &url,
                now: now_ms(),
            };
            let (next, secrets) = f(t, &env)?;
            let (next, tail) = with_tail(t, &sid, next, known)?;
            Ok((next, tail, secrets))
        })
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

/// Whether a write failed in a way the same write would again: the store refused it
/// for its size. Such a write is never made again as it is.
fn refused_for_good(e: &DriveError) -> Option<String> {
    match e {
        DriveError::Store(e) if e.is_deterministic() => Some(e.to_string()),
        _ => None,
    }
}

/// Runs write `f`; should the store refuse it for good ([`refused_for_good`]), runs
/// `instead` (given the reason) in its place, so the refusal is recorded once and the
/// session goes on, rather than the write (and the model call before it) being made
/// again and again.
async fn write_or<F, G>(
    state: &AppState,
    sid: &str,
    known: u64,
    f: F,
    instead: G,
) -> Result<Wrote, DriveError>
where
    F: for<'e> FnOnce(
            &mut Tx<'_>,
            &turn::Env<'e>,
        ) -> Result<(Next, Vec<turn::Unredacted>), StoreError>
        + Send
        + 'static,
    G: for<'e> FnOnce(
            &mut Tx<'_>,
            &turn::Env<'e>,
            String,
        ) -> Result<(Next, Vec<turn::Unredacted>), StoreError>
        + Send
        + 'static,
{
    match write(state, sid, known, f).await {
        Err(e) => match refused_for_good(&e) {
            Some(why) => {
                tracing::warn!(session = %sid, error = %why, "the store refused a step's record for its size; the refusal is recorded in its place");
                write(state, sid, known, move |t, env| instead(t, env, why)).await
            }
            None => Err(e),
        },
        ok => ok,
    }
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
async fn prepare(
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

    /// Only a refusal the same write would meet again is recorded in the write's place;
    /// a store that failed for a passing reason is left to the restart.
    #[test]
    fn only_a_refusal_for_size_is_taken_as_for_good() {
        let table: [(StoreError, bool); 4] = [
            (
                StoreError::TooLarge {
                    bytes: 70 << 20,
                    limit: 64 << 20,
                },
                true,
            ),
            (StoreError::Closed, false),
            (StoreError::Full("the journal is full".into()), false),
            (StoreError::Broken("disk".into()), false),
        ];
        for (e, for_good) in table {
            let shown = e.to_string();
            let got = refused_for_good(&DriveError::Store(Arc::new(e)));
            assert_eq!(got.is_some(), for_good, "{shown}");
            if let Some(why) = got {
                assert!(why.contains("67108864"), "{why}");
            }
        }
    }

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
