//! The hub's tables, registered with the kernel ([`REGISTRY`]), the view type [`Tx`] and its
//! accessors, and the notice topics.
//!
//! Layout (keys → values; records are MessagePack with field names, events are JSON):
//! - `waitpoints`: (waitpoint, seq) → signal, (waitpoint, [`STATE`]) → engine state, and
//!   for a `spawn` monitor (waitpoint, [`SPAWN_SETUP`]) → the spawned sessions' setup.
//!   A waitpoint's state sits right after its newest signals, in the same B-tree leaf, so
//!   recording a signal rewrites one leaf per waitpoint rather than one in each of two
//!   tables: a group commit over many waitpoints writes about half the pages.
//! - `signal_keys`: (waitpoint, key) → seq, for de-duplication
//! - `deadlines`: (time, waitpoint) → (), read by the sweep: expiry, then purge
//! - `timer_queue` (the kernel's): (time, kind, id) → (): a decided wake (`wake`, the
//!   waitpoint) and a remote wait's hub deadline (`device-wait`, its waitpoint)
//! - `sessions`: id → session; `session_wps`: (session, waitpoint) → ()
//! - `events`: (session, seq) → event JSON; `message_keys`: (session, key) → seq
//! - `devices`: name → device record (token SHA-256, last seen, host facts, …)
//! - `hub_events`: seq → hub event JSON (devices added, revoked, online, offline)
//! - `device_waits`: (device, waitpoint) → an active remote wait (`device_waits.rs`)
//! - `timers`, `device_wait_due`: what the timer queue replaced; emptied into it at start
//! - `agents`, `transcript`, `ready`: the runner's (`agent.rs`)
//! - `wait_consumers`: (waitpoint, consumer) → the seq of the last wake it took
//! - `notices`: seq → a queued notice and its deliveries; `notice_keys`: event key → seq
//!   (`notices.rs`, the outbox)
//! - `mcp_connections`: SHA-256 of an MCP connection id → its record; `mcp_tasks`: task
//!   id → a task; `mcp_tokens`: name → an MCP token's hash (`mcp.rs`)
//! - `meta`: name → number; `journal_seq` is the newest journal record a checkpoint holds

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::kernel::error::StoreError;
use super::kernel::{AnyTable, Table, TableSpec};
use crate::engine::{Settings, State, Waitpoint};

pub(crate) use super::kernel::checkpoint::META;

pub(crate) use super::kernel::timers::TIMER_QUEUE;

pub(crate) const WAITPOINTS: TableSpec<(&str, u64), &[u8]> = TableSpec::new(2, "waitpoints_v2");
/// The key of a waitpoint's state record in [`WAITPOINTS`]; its signals use 0, 1, 2…
pub(crate) const STATE: u64 = u64::MAX;
/// The key of a `spawn` monitor's session setup in [`WAITPOINTS`] (written once, at
/// creation, so a signal's write does not carry its instructions).
pub(crate) const SPAWN_SETUP: u64 = u64::MAX - 1;
pub(crate) const SIGNAL_KEYS: TableSpec<(&str, &str), u64> = TableSpec::new(3, "signal_keys");
pub(crate) const DEADLINES: TableSpec<(u64, &str), ()> = TableSpec::new(4, "deadlines");
pub(crate) const SESSIONS: TableSpec<&str, &[u8]> = TableSpec::new(5, "sessions");
pub(crate) const SESSION_WPS: TableSpec<(&str, &str), ()> = TableSpec::new(6, "session_waitpoints");
pub(crate) const EVENTS: TableSpec<(&str, u64), &[u8]> = TableSpec::new(7, "events");
pub(crate) const MESSAGE_KEYS: TableSpec<(&str, &str), u64> = TableSpec::new(8, "message_keys");
pub(crate) const DEVICES: TableSpec<&str, &[u8]> = TableSpec::new(9, "devices");
pub(crate) const HUB_EVENTS: TableSpec<u64, &[u8]> = TableSpec::new(10, "hub_events");
pub(crate) const DEVICE_WAITS: TableSpec<(&str, &str), &[u8]> = TableSpec::new(11, "device_waits");
/// Before the timer queue: a decided wake's due time, (time, waitpoint) → (). Emptied
/// into the queue at start.
const LEGACY_TIMERS: TableSpec<(u64, &str), ()> = TableSpec::new(12, "timers");
/// Before the timer queue: a remote wait's hub deadline, (time, waitpoint) → device.
/// Emptied into the queue at start.
const LEGACY_DEVICE_WAIT_DUE: TableSpec<(u64, &str), &str> = TableSpec::new(13, "device_wait_due");

/// The runner's (`agent.rs`): a session's row, its transcript, the ready queue.
pub(crate) const AGENTS: TableSpec<&str, &[u8]> = TableSpec::new(14, "agents");
pub(crate) const TRANSCRIPT: TableSpec<(&str, u64), &[u8]> = TableSpec::new(15, "transcript");
pub(crate) const READY: TableSpec<(u64, &str), ()> = TableSpec::new(16, "ready");
/// Sessions waiting on a person: (asked at, session) → ().
pub(crate) const PENDING: TableSpec<(u64, &str), ()> = TableSpec::new(17, "pending");
/// Revoked devices, by name: what the fleet view still shows of them (`devices.rs`).
pub(crate) const REVOKED_DEVICES: TableSpec<&str, &[u8]> = TableSpec::new(18, "revoked_devices");
/// Named consumers' positions in a waitpoint's wakes (`consumers.rs`): (waitpoint, name) →
/// the session event seq of the last wake taken.
pub(crate) const CONSUMERS: TableSpec<(&str, &str), u64> = TableSpec::new(19, "wait_consumers");

/// The outbox of outgoing notices (`notices.rs`): seq → a queued notice and its deliveries.
pub(crate) const NOTICES: TableSpec<u64, &[u8]> = TableSpec::new(20, "notices");
/// The event's key → its notice's seq: an event is queued once.
pub(crate) const NOTICE_KEYS: TableSpec<&str, u64> = TableSpec::new(21, "notice_keys");
/// What the hubs sharing a store share (`operator_token`: the SHA-256 of the operator
/// token, on PostgreSQL).
pub(crate) const HUB_SECRETS: TableSpec<&str, &[u8]> = TableSpec::new(22, "hub_secrets");
/// Session → its claim (`claims::Claim`): the hub driving it, the epoch, the lease's end.
pub(crate) const SESSION_CLAIMS: TableSpec<&str, &[u8]> = TableSpec::new(23, "session_claims");
/// Hub name → when it last said it is alive (ms of the store's clock).
pub(crate) const HUB_BEATS: TableSpec<&str, u64> = TableSpec::new(24, "hub_beats");
/// Exec id → an ask to start a command over another hub's link (`exec_asks::ExecAsk`).
pub(crate) const EXEC_ASKS: TableSpec<&str, &[u8]> = TableSpec::new(25, "exec_asks");
/// MCP connections (`mcp.rs`): the SHA-256 of a connection's id → its record.
pub(crate) const MCP_CONNECTIONS: TableSpec<&str, &[u8]> = TableSpec::new(26, "mcp_connections");
/// MCP tasks (`mcp.rs`): task id → its record.
pub(crate) const MCP_TASKS: TableSpec<&str, &[u8]> = TableSpec::new(27, "mcp_tasks");
/// MCP tokens (`mcp.rs`): name → its SHA-256 and when it was made.
pub(crate) const MCP_TOKENS: TableSpec<&str, &[u8]> = TableSpec::new(28, "mcp_tokens");

/// Every table of the hub, each at its position.
pub(crate) static REGISTRY: [&dyn AnyTable; 29] = [
    &META,
    &TIMER_QUEUE,
    &WAITPOINTS,
    &SIGNAL_KEYS,
    &DEADLINES,
    &SESSIONS,
    &SESSION_WPS,
    &EVENTS,
    &MESSAGE_KEYS,
    &DEVICES,
    &HUB_EVENTS,
    &DEVICE_WAITS,
    &LEGACY_TIMERS,
    &LEGACY_DEVICE_WAIT_DUE,
    &AGENTS,
    &TRANSCRIPT,
    &READY,
    &PENDING,
    &REVOKED_DEVICES,
    &CONSUMERS,
    &NOTICES,
    &NOTICE_KEYS,
    &HUB_SECRETS,
    &SESSION_CLAIMS,
    &HUB_BEATS,
    &EXEC_ASKS,
    &MCP_CONNECTIONS,
    &MCP_TASKS,
    &MCP_TOKENS,
];

/// The timer kinds of the hub's domains (see [`super::kernel::timers`]): a decided wake
/// (id: the waitpoint), a remote wait's hub deadline (id: its waitpoint), a session's own
/// timer and an approval's expiry.
pub const TIMER_WAKE: &str = "wake";
pub const TIMER_DEVICE_WAIT: &str = "device-wait";
/// A timer a session's model set (id: `SESSION/NAME`).
pub const TIMER_AGENT: &str = "agent-timer";
/// An approval's expiry (id: `SESSION/REQUEST`).
pub const TIMER_APPROVAL: &str = "approval";
/// The end of a session's wait for `limits.runsPerHour` (id: the session).
pub const TIMER_RUN_DEFER: &str = "run-defer";

/// The keys in [`META`] of the settings the running hub applies, stored at each start:
/// journal records an older hub wrote (operations, not their changes) are replayed with
/// the settings they were written under, not the settings of the hub that restarts.
const SETTING_KEYS: [&str; 6] = [
    "settings.default_ttl_ms",
    "settings.max_ttl_ms",
    "settings.max_wakes_per_hour",
    "settings.wake_window_ms",
    "settings.barrier_delay_ms",
    "settings.retention_ms",
];

/// What the hub's operations need besides the tables: the engine's rules and the
/// bounds of settings.json `limits` a write holds (armed waitpoints, spawns, runs).
#[derive(Clone)]
pub struct Ctx {
    pub settings: Arc<Settings>,
    pub limits: Arc<crate::config::Limits>,
}

/// The view every operation runs against (reads and writes).
pub type Tx<'a> = super::kernel::Tx<'a, Ctx>;
/// The same view, for reads.
pub type ReadTx<'a> = Tx<'a>;

/// A stored session.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionRecord {
    pub id: String,
    pub title: Option<String>,
    pub created_at: u64,
    pub last_seq: u64,
    /// The monitor's wake that started it (`spawn`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawned_from: Option<cortex_protocol::api::SpawnedFrom>,
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, StoreError> {
    rmp_serde::to_vec_named(v).map_err(|e| StoreError::Decode(e.to_string()))
}

pub(crate) fn decode<T: for<'de> Deserialize<'de>>(b: &[u8]) -> Result<T, StoreError> {
    rmp_serde::from_slice(b).map_err(|e| StoreError::Decode(e.to_string()))
}

/// The state alone of a stored waitpoint (the metrics' count by state); `None` if it
/// cannot be read, which the metrics then miss and nothing else notices.
pub(crate) fn state_of(b: &[u8]) -> Option<State> {
    #[derive(Deserialize)]
    struct StateOnly {
        state: State,
    }
    rmp_serde::from_slice::<StateOnly>(b).ok().map(|s| s.state)
}

impl Tx<'_> {
    pub(crate) fn wps(&mut self) -> Table<'_, (&'static str, u64), &'static [u8]> {
        self.table_mut(&WAITPOINTS)
    }
    pub(crate) fn keys(&mut self) -> Table<'_, (&'static str, &'static str), u64> {
        self.table_mut(&SIGNAL_KEYS)
    }
    pub(crate) fn deadlines(&mut self) -> Table<'_, (u64, &'static str), ()> {
        self.table_mut(&DEADLINES)
    }
    pub(crate) fn session_wps(&mut self) -> Table<'_, (&'static str, &'static str), ()> {
        self.table_mut(&SESSION_WPS)
    }
    pub(crate) fn events(&mut self) -> Table<'_, (&'static str, u64), &'static [u8]> {
        self.table_mut(&EVENTS)
    }
    pub(crate) fn msg_keys(&mut self) -> Table<'_, (&'static str, &'static str), u64> {
        self.table_mut(&MESSAGE_KEYS)
    }
    pub(crate) fn hub_events(&mut self) -> Table<'_, u64, &'static [u8]> {
        self.table_mut(&HUB_EVENTS)
    }
    fn meta(&mut self) -> Table<'_, &'static str, u64> {
        self.table_mut(&META)
    }

    /// The hub's settings.
    pub fn settings(&self) -> &Arc<Settings> {
        &self.ctx.settings
    }

    /// settings.json `limits`.
    pub fn limits(&self) -> &crate::config::Limits {
        &self.ctx.limits
    }

    /// The newest journal record the last checkpoint holds.
    pub(crate) fn journal_seq(&self) -> Result<u64, StoreError> {
        Ok(self
            .table(&META)
            .get(super::kernel::checkpoint::JOURNAL_SEQ)?
            .map_or(0, |v| v.value()))
    }

    /// The settings the hub that wrote the journal applied (see [`SETTING_KEYS`]); `None`
    /// for a store from before they were kept.
    pub(crate) fn stored_settings(&self) -> Result<Option<Settings>, StoreError> {
        let mut v = [0u64; SETTING_KEYS.len()];
        let meta = self.table(&META);
        for (slot, key) in v.iter_mut().zip(SETTING_KEYS) {
            match meta.get(key)? {
                Some(x) => *slot = x.value(),
                None => return Ok(None),
            }
        }
        Ok(Some(Settings {
            default_ttl_ms: v[0],
            max_ttl_ms: v[1],
            max_wakes_per_hour: u32::try_from(v[2]).unwrap_or(u32::MAX),
            wake_window_ms: v[3],
            barrier_delay_ms: v[4],
            retention_ms: v[5],
        }))
    }

    /// Whether the last hub stopped cleanly (its last checkpoint holds everything).
    pub(crate) fn clean_stop(&self) -> Result<bool, StoreError> {
        Ok(self
            .table(&META)
            .get(super::kernel::checkpoint::CLEAN_STOP)?
            .map(|g| g.value())
            == Some(1))
    }

    /// Marks the store as in use (`false`, at start) or cleanly stopped.
    pub(crate) fn set_clean_stop(&mut self, clean: bool) -> Result<(), StoreError> {
        self.meta()
            .insert(super::kernel::checkpoint::CLEAN_STOP, u64::from(clean))?;
        Ok(())
    }

    /// The operator token every hub on this store answers to: the first hub's (its
    /// SHA-256, `hash`) is kept; a later hub with another is refused, with what to do.
    pub(crate) fn share_operator_token(&mut self, hash: &[u8; 32]) -> Result<(), StoreError> {
        const KEY: &str = "operator_token";
        let stored = self
            .table(&HUB_SECRETS)
            .get(KEY)?
            .map(|v| v.value().to_vec());
        match stored {
            None => {
                self.table_mut(&HUB_SECRETS).insert(KEY, hash.as_slice())?;
                Ok(())
            }
            Some(h) if crate::secret::same_hash(&h, hash) => Ok(()),
            Some(_) => Err(StoreError::Config(
                "the hubs on this database share one operator token, and this hub's is another: start it with the others' (CORTEX_WEBHOOK_TOKEN, or the first hub's $CORTEX_HOME/hub/token). To change the token of every hub: stop them all, run `DELETE FROM cortex.hub_secrets;` in psql, and start them with the new one".into(),
            )),
        }
    }

    /// Keeps `s` as the settings the running hub applies.
    pub(crate) fn store_settings(&mut self, s: &Settings) -> Result<(), StoreError> {
        let v = [
            s.default_ttl_ms,
            s.max_ttl_ms,
            u64::from(s.max_wakes_per_hour),
            s.wake_window_ms,
            s.barrier_delay_ms,
            s.retention_ms,
        ];
        for (key, x) in SETTING_KEYS.into_iter().zip(v) {
            if self.table(&META).get(key)?.map(|g| g.value()) != Some(x) {
                self.meta().insert(key, x)?;
            }
        }
        Ok(())
    }

    /// Moves the entries of the tables the timer queue replaced into it (once, at start).
    pub(crate) fn migrate_timers(&mut self) -> Result<usize, StoreError> {
        let mut moved = Vec::new();
        for r in self.table(&LEGACY_TIMERS).iter()? {
            let (k, _) = r?;
            let (t, id) = k.value();
            moved.push((TIMER_WAKE, t, id.to_string()));
        }
        for r in self.table(&LEGACY_DEVICE_WAIT_DUE).iter()? {
            let (k, _) = r?;
            let (t, id) = k.value();
            moved.push((TIMER_DEVICE_WAIT, t, id.to_string()));
        }
        for (kind, t, id) in &moved {
            if *kind == TIMER_WAKE {
                self.table_mut(&LEGACY_TIMERS).remove((*t, id.as_str()))?;
            } else {
                self.table_mut(&LEGACY_DEVICE_WAIT_DUE)
                    .remove((*t, id.as_str()))?;
            }
            self.reschedule(kind, id, None, Some(*t))?;
        }
        Ok(moved.len())
    }

    pub(crate) fn get_wp(&self, id: &str) -> Result<Option<Waitpoint>, StoreError> {
        match self.table(&WAITPOINTS).get((id, STATE))? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    /// Writes a waitpoint and moves its index entries. `before` is (deadline, timer) as
    /// it was when loaded, `None` for a new one.
    pub(crate) fn put_wp(
        &mut self,
        wp: &Waitpoint,
        before: Option<(u64, Option<u64>)>,
    ) -> Result<(), StoreError> {
        let deadline = wp.deadline(self.settings());
        let timer = wp.next_due();
        let id = wp.id.as_str();
        match before {
            Some((d, _)) if d == deadline => {}
            Some((d, _)) => {
                self.deadlines().remove((d, id))?;
                self.deadlines().insert((deadline, id), ())?;
            }
            None => {
                self.deadlines().insert((deadline, id), ())?;
            }
        }
        let old_timer = before.and_then(|b| b.1);
        if old_timer != timer {
            self.reschedule(TIMER_WAKE, id, old_timer, timer)?;
        }
        let old = self.wps().replace((id, STATE), encode(wp)?.as_slice())?;
        self.state_moved(wp, old.and_then(|o| state_of(o.value())));
        // A remote wait lives only as long as its waitpoint is armed.
        self.waitpoint_ended(wp)
    }

    pub(crate) fn get_session(&self, sid: &str) -> Result<Option<SessionRecord>, StoreError> {
        match self.table(&SESSIONS).get(sid)? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }
}

/// The notice topics the store raises (see [`super::kernel::Notifier`]).
pub const TOPIC_SESSION: &str = "session";
pub const TOPIC_HUB: &str = "hub";
pub const TOPIC_DEVICE: &str = "device";
/// A session's turn is to stop now (a cancel posted, the session deleted): heard by
/// whichever hub drives it.
pub const TOPIC_STOP: &str = "stop";
