//! The runner's durable state, one row per session that a model runs: its configuration,
//! whether it is idle, ready or running, how far it has read its inbox, the run in
//! progress; its transcript (the chat messages every model request carries, append-only);
//! and the ready queue the runner drains in order.
//!
//! The inbox is the session's event log: a `message` or a `wake` appended there is an
//! item for the runner. Appending one to an idle session makes it ready in the same
//! write ([`Tx::inbox_arrived`]), so nothing can fall between "the runner looked" and
//! "the session went idle": handing a session back is a write too, and it leaves the
//! session ready when unread items exist. A session that is idle holds no task and no
//! memory, only these rows.
//!
//! Tables:
//! - `agents`: session → [`AgentRecord`] (MessagePack)
//! - `transcript`: (session, n) → one chat message (JSON, the bytes the request carries)
//! - `ready`: (order, session) → (): sessions the runner must drive, oldest first. An entry
//!   stays while its session runs, so a restarted hub finds the runs a crash cut off.
//! - `pending`: (asked at, session) → (): sessions waiting on a person, oldest first.

use cortex_protocol::api::{
    OutputConfig, OutputTransport, PendingRequest, Policy, RunInput, SessionResult, StopConfig,
    Usage,
};
use serde::{Deserialize, Serialize};

use super::kernel::error::StoreError;
use super::tables::{
    AGENTS, META, PENDING, READY, TIMER_AGENT, TIMER_APPROVAL, TIMER_RUN_DEFER, TRANSCRIPT, Tx,
    decode, encode,
};
use crate::model::{ChatMessage, ToolCall};

/// The notice raised when a session became ready; its value is the ready order.
pub const TOPIC_READY: &str = "ready";
/// The meta key of the last ready order given out.
const READY_ORDER: &str = "agent.ready_order";

/// How a session is run: fixed when it is created.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentConfig {
    pub instructions: String,
    pub examples: Vec<ChatMessage>,
    pub max_tokens: Option<u32>,
    pub stop: StopConfig,
    /// The gate before every tool call, each list resolved against the hub's defaults.
    #[serde(default)]
    pub policy: Policy,
    /// A turn that needs a person ends with `needs_human` instead of waiting.
    #[serde(default)]
    pub unattended: bool,
    /// The output schema's settings (none: a chat agent, whose answer is its text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputConfig>,
    /// The transport chosen for `output` when the session was made (its prefix says how
    /// to answer, so later runs keep it whatever the model server's settings become).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<OutputTransport>,
}

/// A tool call of the model's last reply that has no answer yet. Calls are answered in
/// the model's order; the first open call is the one being gated, run or waited on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenCall {
    /// The call (its arguments as a person edited them, if one did).
    pub call: ToolCall,
    pub step: u32,
    /// Its `tool-start` is in the log.
    #[serde(default)]
    pub announced: bool,
    /// The gate (or a person) let it through: it runs once prepared.
    #[serde(default)]
    pub allowed: bool,
    /// Its work outside the hub began (`device_exec`): after a crash it is made again
    /// under the same identity, which the device recognises.
    #[serde(default)]
    pub started: bool,
    /// Who let it run: `policy`, `person` or `person (always)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    /// Not run, and answered with this error: the call came past the reply's
    /// `limits.toolCallsPerReply`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// A timer the model set (`schedule_wakeup`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionTimer {
    pub name: String,
    /// When it is due (ms since the epoch).
    pub at: u64,
    pub text: String,
    /// The log seq current when it was set: with the name, its firing's dedupe key.
    pub set_seq: u64,
    /// It came due during a turn: it fires once the turn ends.
    #[serde(default)]
    pub due: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Waiting for input: no task, nothing in memory.
    #[default]
    Idle,
    /// Unread input: in the ready queue.
    Ready,
    /// A runner task drives it (or did, when the hub stopped).
    Running,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Idle => "idle",
            RunStatus::Ready => "ready",
            RunStatus::Running => "running",
        }
    }
}

/// The run (one turn) in progress.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    pub run_id: String,
    pub started_at: u64,
    /// Steps begun (model calls made or being made).
    pub steps: u32,
    pub usage: Usage,
    /// The last tool call's name, arguments and answer, and how many times in a row the
    /// model made it with that answer.
    pub repeat: Option<(String, u32)>,
    /// Answers the output schema refused and sent back to the model this run.
    #[serde(default)]
    pub output_retries: u32,
    /// Turns that ended with no answer in them, sent back with a correction this run
    /// (not bounded by `outputRetries`).
    #[serde(default)]
    pub terminations: u32,
    /// Why the last model call stopped, as the server said (`length`: cut at the token cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

/// One session's runner row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRecord {
    /// `None` until fixed: a session made without a configuration takes the hub's
    /// defaults (and its prefix is written) when its first run starts.
    pub config: Option<AgentConfig>,
    pub status: RunStatus,
    /// Its key in the ready queue while ready or running; 0 when idle.
    pub ready_order: u64,
    /// The newest log seq the runner has looked at: every inbox item up to it is taken.
    pub read_through: u64,
    /// Inbox items taken during a run that wait for the next one.
    pub deferred: Vec<RunInput>,
    /// How many messages the transcript holds; the first `prefix_len` are the prefix.
    pub transcript_len: u64,
    pub prefix_len: u64,
    pub turn: Option<Turn>,
    pub last_run: Option<SessionResult>,
    /// The calls of the turn's last reply not answered yet, in the model's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub open: Vec<OpenCall>,
    /// What the first open call waits for: a person's approval or answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parked: Option<PendingRequest>,
    /// Tools a person allowed for the rest of the session (`always`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub always: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timers: Vec<SessionTimer>,
    /// `now` messages taken while calls were open: they join at the next step.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joining: Vec<RunInput>,
    /// The session was cancelled: it runs no more turns.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancelled: bool,
    /// A model runs turns for it (`true`, an agent session) or it is a mailbox (`false`):
    /// fixed when it is made. `None` in rows from before sessions said so, decided from
    /// what they hold ([`Tx::session_runs`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<bool>,
    /// The transcript's older part as summarized (compaction): a request carries the
    /// prefix, this summary, then the messages from `through` on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<Summary>,
    /// A person asked for a compaction that has not been answered yet.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compact_asked: bool,
    /// When runs that wakes and timers started began, within the last window
    /// (`limits.runsPerHour`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wake_runs: Vec<u64>,
    /// The input taken waits for the window (`limits.runsPerHour`) until then: a
    /// `run-defer` timer makes the session ready at that time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deferred_until: Option<u64>,
    /// As a root: when it or a session it spawned spawned one, within the last window
    /// (`limits.spawnsPerHour`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spawns: Vec<u64>,
}

/// The summary a compaction left: it stands for transcript positions `prefix_len..through`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub through: u64,
    pub text: String,
    /// Compactions taken so far.
    pub count: u32,
}

impl AgentRecord {
    pub fn new(config: Option<AgentConfig>) -> Self {
        AgentRecord {
            config,
            status: RunStatus::Idle,
            ready_order: 0,
            read_through: 0,
            deferred: Vec::new(),
            transcript_len: 0,
            prefix_len: 0,
            turn: None,
            last_run: None,
            open: Vec::new(),
            parked: None,
            always: Vec::new(),
            timers: Vec::new(),
            joining: Vec::new(),
            cancelled: false,
            runs: None,
            summary: None,
            compact_asked: false,
            wake_runs: Vec::new(),
            deferred_until: None,
            spawns: Vec::new(),
        }
    }

    /// The row of a mailbox: no configuration, and no turn ever runs.
    pub fn mailbox() -> Self {
        AgentRecord {
            runs: Some(false),
            ..AgentRecord::new(None)
        }
    }
}

fn json<T: Serialize>(v: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(v).map_err(|e| StoreError::Decode(e.to_string()))
}

impl Tx<'_> {
    pub fn agent(&self, sid: &str) -> Result<Option<AgentRecord>, StoreError> {
        match self.table(&AGENTS).get(sid)? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    pub fn put_agent(&mut self, sid: &str, rec: &AgentRecord) -> Result<(), StoreError> {
        self.table_mut(&AGENTS)
            .insert(sid, encode(rec)?.as_slice())?;
        Ok(())
    }

    /// Fixes a session's configuration and writes its prefix (the messages every
    /// request starts with, written once and never rebuilt); the caller saves `rec`.
    pub fn fix_agent(
        &mut self,
        sid: &str,
        rec: &mut AgentRecord,
        config: AgentConfig,
        prefix: &[ChatMessage],
    ) -> Result<(), StoreError> {
        for m in prefix {
            self.append_transcript(sid, rec, m)?;
        }
        rec.prefix_len = rec.transcript_len;
        rec.config = Some(config);
        rec.runs = Some(true);
        Ok(())
    }

    /// Whether a model runs turns for `sid` (row `rec`): as the row says, else (a row
    /// from before rows said so, not yet settled by [`Tx::settle_runs`]) from what it
    /// holds, by [`crate::session_state::legacy_runs`]. No row: a mailbox.
    pub fn session_runs(&self, sid: &str, rec: Option<&AgentRecord>) -> Result<bool, StoreError> {
        match rec {
            None => Ok(false),
            Some(rec) => match rec.runs {
                Some(r) => Ok(r),
                None => self.legacy_runs(sid, rec, None),
            },
        }
    }

    /// [`crate::session_state::legacy_runs`] over what row `rec` of `sid` holds.
    fn legacy_runs(
        &self,
        sid: &str,
        rec: &AgentRecord,
        hub_default: Option<&str>,
    ) -> Result<bool, StoreError> {
        let c = rec.config.as_ref();
        let stored = crate::session_state::Stored {
            instructions: c.map(|c| c.instructions.as_str()),
            examples: c.is_some_and(|c| !c.examples.is_empty()),
            output: c.is_some_and(|c| c.output.is_some()),
            hub_default,
        };
        let mut failed = None;
        let replied =
            crate::session_state::legacy_runs(stored, || match self.model_replied(sid, rec) {
                Ok(r) => r,
                Err(e) => {
                    failed = Some(e);
                    false
                }
            });
        match failed {
            Some(e) => Err(e),
            None => Ok(replied),
        }
    }

    /// Whether any runner row is from before rows said whether a model runs them.
    pub fn unsettled_runs(&self) -> Result<bool, StoreError> {
        for r in self.table(&AGENTS).iter()? {
            let rec: AgentRecord = decode(r?.1.value())?;
            if rec.runs.is_none() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// At the hub's start: decides, once, whether each row from before rows said so runs
    /// turns (`hub_default`: the hub's default instructions), and writes it down. A
    /// mailbox a hub that did not tell them apart left queued leaves the queue, its
    /// input unread. Returns how many rows were settled.
    pub fn settle_runs(&mut self, hub_default: Option<&str>) -> Result<usize, StoreError> {
        let mut open = Vec::new();
        for r in self.table(&AGENTS).iter()? {
            let (k, v) = r?;
            let rec: AgentRecord = decode(v.value())?;
            if rec.runs.is_none() {
                open.push((k.value().to_string(), rec));
            }
        }
        let settled = open.len();
        for (sid, mut rec) in open {
            let runs = self.legacy_runs(&sid, &rec, hub_default)?;
            rec.runs = Some(runs);
            if !runs && (rec.status != RunStatus::Idle || rec.ready_order != 0) {
                self.make_idle(&sid, &mut rec)?;
            }
            self.put_agent(&sid, &rec)?;
        }
        Ok(settled)
    }

    /// Whether the transcript holds a model's reply after the prefix (read until the
    /// first one).
    fn model_replied(&self, sid: &str, rec: &AgentRecord) -> Result<bool, StoreError> {
        #[derive(Deserialize)]
        struct RoleOnly {
            role: crate::model::Role,
        }
        for r in self
            .table(&TRANSCRIPT)
            .range((sid, rec.prefix_len)..(sid, rec.transcript_len.max(rec.prefix_len)))?
        {
            let v = r?.1;
            let m: RoleOnly = serde_json::from_slice(v.value())
                .map_err(|e| StoreError::Decode(format!("a transcript message: {e}")))?;
            if m.role == crate::model::Role::Assistant {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The runner's check before it drives `sid`: whether a model runs turns for it. A
    /// mailbox found in the ready queue (queued by a hub that did not tell them apart)
    /// is taken out of it, its input left unread; a row that did not say is fixed to
    /// what was decided.
    pub fn claim_runs(&mut self, sid: &str) -> Result<bool, StoreError> {
        let Some(mut rec) = self.agent(sid)? else {
            return Ok(false);
        };
        let runs = self.session_runs(sid, Some(&rec))?;
        let before = rec.clone();
        rec.runs = Some(runs);
        if !runs && (rec.status != RunStatus::Idle || rec.ready_order != 0) {
            self.make_idle(sid, &mut rec)?;
        }
        if rec != before {
            self.put_agent(sid, &rec)?;
        }
        Ok(runs)
    }

    /// Appends one message to a session's transcript (the caller saves `rec`).
    pub fn append_transcript(
        &mut self,
        sid: &str,
        rec: &mut AgentRecord,
        m: &ChatMessage,
    ) -> Result<(), StoreError> {
        self.table_mut(&TRANSCRIPT)
            .insert((sid, rec.transcript_len), json(m)?.as_slice())?;
        rec.transcript_len += 1;
        Ok(())
    }

    /// The whole transcript, in order.
    pub fn transcript(&self, sid: &str) -> Result<Vec<ChatMessage>, StoreError> {
        self.transcript_from(sid, 0)
    }

    /// The transcript's messages from position `from` on, in order.
    pub fn transcript_from(&self, sid: &str, from: u64) -> Result<Vec<ChatMessage>, StoreError> {
        let mut out = Vec::new();
        for r in self
            .table(&TRANSCRIPT)
            .range((sid, from)..=(sid, u64::MAX))?
        {
            let v = r?.1;
            out.push(
                serde_json::from_slice(v.value())
                    .map_err(|e| StoreError::Decode(format!("a transcript message: {e}")))?,
            );
        }
        Ok(out)
    }

    /// An inbox item (a `message` or `wake` event) was appended to `sid`'s log: an idle
    /// session becomes ready in this same write. A session with no row yet (made before
    /// the runner, or without a configuration) gets one.
    pub fn inbox_arrived(&mut self, sid: &str) -> Result<(), StoreError> {
        let (mut rec, fresh) = match self.agent(sid)? {
            Some(r) => (r, false),
            None => (AgentRecord::new(None), true),
        };
        // A mailbox only records: no turn runs, so it never joins the queue.
        if !self.session_runs(sid, (!fresh).then_some(&rec))? {
            if rec.runs.is_none() && !fresh {
                rec.runs = Some(false);
                self.put_agent(sid, &rec)?;
            }
            return Ok(());
        }
        // A ready or running session takes the item at its next boundary: its row does
        // not change, and is not written again.
        if rec.status != RunStatus::Idle && !fresh {
            return Ok(());
        }
        if rec.status == RunStatus::Idle {
            self.make_ready(sid, &mut rec)?;
        }
        self.put_agent(sid, &rec)
    }

    /// Puts `sid` at the end of the ready queue and announces it (the caller saves `rec`).
    pub fn make_ready(&mut self, sid: &str, rec: &mut AgentRecord) -> Result<(), StoreError> {
        if rec.ready_order != 0 {
            self.table_mut(&READY).remove((rec.ready_order, sid))?;
        }
        let order = self.table(&META).get(READY_ORDER)?.map_or(0, |v| v.value()) + 1;
        self.table_mut(&META).insert(READY_ORDER, order)?;
        self.table_mut(&READY).insert((order, sid), ())?;
        rec.status = RunStatus::Ready;
        rec.ready_order = order;
        self.notify(TOPIC_READY, "", order);
        Ok(())
    }

    /// Takes `sid` out of the ready queue: it waits for input (the caller saves `rec`).
    pub fn make_idle(&mut self, sid: &str, rec: &mut AgentRecord) -> Result<(), StoreError> {
        if rec.ready_order != 0 {
            self.table_mut(&READY).remove((rec.ready_order, sid))?;
        }
        rec.status = RunStatus::Idle;
        rec.ready_order = 0;
        Ok(())
    }

    /// Up to `limit` queued sessions with an order above `after`, oldest first.
    pub fn ready_after(&self, after: u64, limit: usize) -> Result<Vec<(u64, String)>, StoreError> {
        let mut out = Vec::new();
        for r in self.table(&READY).range((after.saturating_add(1), "")..)? {
            let (k, _) = r?;
            let (order, sid) = k.value();
            out.push((order, sid.to_string()));
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// The newest ready order given out (0: none yet).
    pub fn ready_order(&self) -> Result<u64, StoreError> {
        Ok(self.table(&META).get(READY_ORDER)?.map_or(0, |v| v.value()))
    }

    /// The last run's result, if a run ended.
    pub fn agent_result(&self, sid: &str) -> Result<Option<SessionResult>, StoreError> {
        Ok(self.agent(sid)?.and_then(|r| r.last_run))
    }

    /// Removes a deleted session's rows.
    pub fn delete_agent(&mut self, sid: &str) -> Result<(), StoreError> {
        let Some(rec) = self.agent(sid)? else {
            return Ok(());
        };
        if rec.ready_order != 0 {
            self.table_mut(&READY).remove((rec.ready_order, sid))?;
        }
        for n in 0..rec.transcript_len {
            self.table_mut(&TRANSCRIPT).remove((sid, n))?;
        }
        let mut rec = rec;
        self.clear_parked(sid, &mut rec)?;
        self.clear_timers(sid, &mut rec)?;
        self.table_mut(&AGENTS).remove(sid)?;
        self.forget_claim(sid)
    }

    /// Parks `sid` on `request`: listed as waiting on a person, and, with an expiry, a
    /// timer that denies it then (the caller saves `rec`).
    pub fn park(
        &mut self,
        sid: &str,
        rec: &mut AgentRecord,
        request: PendingRequest,
    ) -> Result<(), StoreError> {
        self.clear_parked(sid, rec)?;
        self.table_mut(&PENDING)
            .insert((request.asked_at, sid), ())?;
        if let Some(at) = request.expires_at {
            self.reschedule(TIMER_APPROVAL, &timer_id(sid, &request.id), None, Some(at))?;
        }
        rec.parked = Some(request);
        Ok(())
    }

    /// Takes back what `sid` waits on (answered, withdrawn, or the session deleted).
    pub fn clear_parked(&mut self, sid: &str, rec: &mut AgentRecord) -> Result<(), StoreError> {
        if let Some(p) = rec.parked.take() {
            self.table_mut(&PENDING).remove((p.asked_at, sid))?;
            if let Some(at) = p.expires_at {
                self.reschedule(TIMER_APPROVAL, &timer_id(sid, &p.id), Some(at), None)?;
            }
        }
        Ok(())
    }

    /// Sets (or moves) the timer `timer.name` of `sid` (the caller saves `rec`).
    pub fn set_timer(
        &mut self,
        sid: &str,
        rec: &mut AgentRecord,
        timer: SessionTimer,
    ) -> Result<(), StoreError> {
        if let Some(i) = rec.timers.iter().position(|t| t.name == timer.name) {
            let old = rec.timers.remove(i);
            if !old.due {
                self.reschedule(TIMER_AGENT, &timer_id(sid, &old.name), Some(old.at), None)?;
            }
        }
        self.reschedule(
            TIMER_AGENT,
            &timer_id(sid, &timer.name),
            None,
            Some(timer.at),
        )?;
        rec.timers.push(timer);
        Ok(())
    }

    /// Sets when `sid`'s input waiting for `limits.runsPerHour` goes ahead (`None`: it
    /// does not wait), moving its `run-defer` timer (the caller saves `rec`).
    pub fn set_run_defer(
        &mut self,
        sid: &str,
        rec: &mut AgentRecord,
        until: Option<u64>,
    ) -> Result<(), StoreError> {
        if rec.deferred_until == until {
            return Ok(());
        }
        self.reschedule(TIMER_RUN_DEFER, sid, rec.deferred_until, until)?;
        rec.deferred_until = until;
        Ok(())
    }

    /// Drops every timer of `sid` (the caller saves `rec`).
    pub fn clear_timers(&mut self, sid: &str, rec: &mut AgentRecord) -> Result<(), StoreError> {
        self.set_run_defer(sid, rec, None)?;
        for t in std::mem::take(&mut rec.timers) {
            if !t.due {
                self.reschedule(TIMER_AGENT, &timer_id(sid, &t.name), Some(t.at), None)?;
            }
        }
        Ok(())
    }

    /// Up to `limit` sessions waiting on a person, oldest first, with what they wait on.
    pub fn pending_requests(
        &self,
        limit: usize,
    ) -> Result<Vec<(String, PendingRequest)>, StoreError> {
        let mut out = Vec::new();
        let mut sids = Vec::new();
        for r in self.table(&PENDING).iter()? {
            let (k, _) = r?;
            sids.push(k.value().1.to_string());
            if sids.len() >= limit {
                break;
            }
        }
        for sid in sids {
            if let Some(p) = self.agent(&sid)?.and_then(|r| r.parked) {
                out.push((sid, p));
            }
        }
        Ok(out)
    }
}

/// A session's timer id in the timer queue: `SESSION/NAME` (a session id has no `/`).
pub fn timer_id(sid: &str, name: &str) -> String {
    format!("{sid}/{name}")
}

/// The session and name of a timer id.
pub fn split_timer_id(id: &str) -> Option<(&str, &str)> {
    id.split_once('/')
}
