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

use cortex_protocol::api::{RunInput, SessionResult, StopConfig, Usage};
use serde::{Deserialize, Serialize};

use super::kernel::error::StoreError;
use super::tables::{AGENTS, META, READY, TRANSCRIPT, Tx, decode, encode};
use crate::model::ChatMessage;

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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    pub run_id: String,
    pub started_at: u64,
    /// Steps begun (model calls made or being made).
    pub steps: u32,
    pub usage: Usage,
    /// The last tool call's name, arguments and answer, and how many times in a row the
    /// model made it with that answer.
    pub repeat: Option<(String, u32)>,
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
        Ok(())
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
        self.table_mut(&AGENTS).remove(sid)?;
        Ok(())
    }
}
