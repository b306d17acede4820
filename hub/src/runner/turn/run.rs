//! What the runner's writes share: what each is given ([`Env`]) and hands back ([`Next`],
//! [`Unredacted`]), which step a result belongs to ([`StepAt`]), and how the run in
//! progress ends ([`end_run`]).

use cortex_protocol::api::{EventBody, RunError, RunMeta, RunResult, SessionResult};

use crate::config::AgentDefaults;
use crate::model::ToolCall;
use crate::runner::output::Transport;
use crate::runner::rules;
use crate::store::agent::{AgentRecord, Summary};
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
    /// Prepare these open calls outside the store and bring them to
    /// [`calls_ready`](super::calls_ready).
    Prepare {
        run_id: String,
        calls: Vec<ToolCall>,
    },
    /// Do this call's work outside the hub (`device_exec`), then
    /// [`external_done`](super::external_done); `again`: it was begun before (an earlier
    /// ask may have reached the device).
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

/// Which step a result belongs to.
#[derive(Debug, Clone)]
pub struct StepAt {
    pub sid: String,
    pub run_id: String,
    pub step: u32,
}

/// A run that ended without an answer.
pub(super) fn failed(code: &str, stop: Option<&str>, message: String) -> RunResult {
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

pub(super) fn event(
    t: &mut Tx<'_>,
    sid: &str,
    body: EventBody,
    now: u64,
) -> Result<u64, StoreError> {
    t.append_event(sid, body, now)?
        .ok_or_else(|| StoreError::Decode(format!("session {sid} vanished mid-write")))
}

pub(super) fn run_of(rec: &AgentRecord) -> String {
    rec.turn
        .as_ref()
        .map(|t| t.run_id.clone())
        .unwrap_or_default()
}

/// Ends the run in progress with `result` (the caller saves `rec`).
pub(super) fn end_run(
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
