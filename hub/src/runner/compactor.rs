//! Compaction as the driver runs it: what it knows ([`Compactor`]: the model's context,
//! each session's tokens per byte, the summaries computed beside the steps), and a
//! summary computed in a step's place ([`summarize_here`]).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cortex_protocol::api::{Compaction, EventBody};

use crate::model::Model;
use crate::state::AppState;
use crate::time::now_ms;

use super::compact;

/// What the runner knows for compaction: the model's context, the sessions with a
/// summary being computed beside their steps, and each session's tokens per byte as the
/// server counted its last request. All of it is in memory only: lost with the process,
/// it is asked or computed again.
#[derive(Default)]
pub(super) struct Compactor {
    /// The model's context in tokens; 0: unknown.
    context: AtomicU64,
    pub(super) jobs: Mutex<tokio::task::JoinSet<()>>,
    running: Mutex<HashSet<String>>,
    /// Per session, where the last summary posted from beside the steps starts: another
    /// from the same place would only repeat it before the boundary takes it.
    posted: Mutex<HashMap<String, u64>>,
    per_byte: Mutex<HashMap<String, f64>>,
}

impl Compactor {
    pub(super) fn context(&self) -> Option<u64> {
        Some(self.context.load(Ordering::Relaxed)).filter(|&n| n > 0)
    }

    /// The context is `tokens`, or less if it was known to be less.
    pub(super) fn learn_context(&self, tokens: u64) {
        let _ = self
            .context
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                Some(match now {
                    0 => tokens,
                    n => n.min(tokens),
                })
            });
    }

    pub(super) fn per_byte(&self, sid: &str) -> f64 {
        let m = self.per_byte.lock().unwrap_or_else(|e| e.into_inner());
        m.get(sid)
            .copied()
            .unwrap_or(compact::DEFAULT_TOKENS_PER_BYTE)
    }

    pub(super) fn learn(&self, sid: &str, per_byte: f64) {
        let mut m = self.per_byte.lock().unwrap_or_else(|e| e.into_inner());
        m.insert(sid.to_string(), per_byte);
    }

    /// Starts computing `job` beside `sid`'s steps unless one is already, or one from the
    /// same place waits in the inbox; a summary is posted to the session's inbox (a
    /// failure is logged, and a later step tries again).
    pub(super) fn start(
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

/// How a summary computed in the step's place came out.
pub(super) enum Summed {
    Done(Compaction),
    /// A cancel was heard: its item is in the inbox.
    Stopped,
    /// The hub is stopping.
    Stopping,
}

/// Computes `job` while the session's step waits on it.
pub(super) async fn summarize_here(
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

/// A forced compaction's context when the model's is unknown: the whole request's.
pub(super) fn window_or_estimate(job: &compact::Job) -> u64 {
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
