//! redb tables, the write transaction wrapper [`Tx`] and the read wrapper [`ReadTx`].
//!
//! Layout (keys → values; records are MessagePack with field names, events are JSON):
//! - `waitpoints`: (waitpoint, seq) → signal, and (waitpoint, [`STATE`]) → engine state.
//!   A waitpoint's state sits right after its newest signals, in the same B-tree leaf, so
//!   recording a signal rewrites one leaf per waitpoint rather than one in each of two
//!   tables: a group commit over many waitpoints writes about half the pages.
//! - `signal_keys`: (waitpoint, key) → seq, for de-duplication
//! - `deadlines`: (time, waitpoint) → (), read by the sweep: expiry, then purge
//! - `timers`: (time, waitpoint) → (), a decided wake's due time
//! - `sessions`: id → session; `session_wps`: (session, waitpoint) → ()
//! - `events`: (session, seq) → event JSON; `message_keys`: (session, key) → seq
//! - `devices`: name → device record (token SHA-256, last seen, host facts, …)
//! - `hub_events`: seq → hub event JSON (devices added, revoked, online, offline)
//! - `device_waits`: (device, waitpoint) → an active remote wait (`device_waits.rs`)
//! - `device_wait_due`: (time, waitpoint) → device, when the hub ends an active remote
//!   wait nobody reported on
//! - `meta`: name → number; `journal_seq` is the newest journal record a commit holds

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use redb::{
    ReadOnlyTable, ReadTransaction, ReadableTable, Table, TableDefinition, WriteTransaction,
};
use serde::{Deserialize, Serialize};

use super::StoreError;
use crate::engine::{Settings, Waitpoint};

pub(crate) const WAITPOINTS: TableDefinition<(&str, u64), &[u8]> =
    TableDefinition::new("waitpoints_v2");
/// The key of a waitpoint's state record in [`WAITPOINTS`]; its signals use 0, 1, 2…
pub(crate) const STATE: u64 = u64::MAX;
pub(crate) const SIGNAL_KEYS: TableDefinition<(&str, &str), u64> =
    TableDefinition::new("signal_keys");
pub(crate) const DEADLINES: TableDefinition<(u64, &str), ()> = TableDefinition::new("deadlines");
pub(crate) const TIMERS: TableDefinition<(u64, &str), ()> = TableDefinition::new("timers");
pub(crate) const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");
pub(crate) const SESSION_WPS: TableDefinition<(&str, &str), ()> =
    TableDefinition::new("session_waitpoints");
pub(crate) const EVENTS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("events");
pub(crate) const MESSAGE_KEYS: TableDefinition<(&str, &str), u64> =
    TableDefinition::new("message_keys");
pub(crate) const DEVICES: TableDefinition<&str, &[u8]> = TableDefinition::new("devices");
pub(crate) const HUB_EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("hub_events");
pub(crate) const DEVICE_WAITS: TableDefinition<(&str, &str), &[u8]> =
    TableDefinition::new("device_waits");
pub(crate) const DEVICE_WAIT_DUE: TableDefinition<(u64, &str), &str> =
    TableDefinition::new("device_wait_due");
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The key in [`META`] of the newest journal record that redb holds.
pub(crate) const JOURNAL_SEQ: &str = "journal_seq";
/// The keys in [`META`] of the settings the running hub applies, stored at each start: the
/// journal's records newer than the last commit were applied with them, so a replay after
/// a crash uses them, not the settings of the hub that restarts.
const SETTING_KEYS: [&str; 6] = [
    "settings.default_ttl_ms",
    "settings.max_ttl_ms",
    "settings.max_wakes_per_hour",
    "settings.wake_window_ms",
    "settings.barrier_delay_ms",
    "settings.retention_ms",
];

/// A stored session.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionRecord {
    pub id: String,
    pub title: Option<String>,
    pub created_at: u64,
    pub last_seq: u64,
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, StoreError> {
    rmp_serde::to_vec_named(v).map_err(|e| StoreError::Decode(e.to_string()))
}

pub(crate) fn decode<T: for<'de> Deserialize<'de>>(b: &[u8]) -> Result<T, StoreError> {
    rmp_serde::from_slice(b).map_err(|e| StoreError::Decode(e.to_string()))
}

pub(crate) fn create_all(wtx: &WriteTransaction) -> Result<(), StoreError> {
    wtx.open_table(WAITPOINTS)?;
    wtx.open_table(SIGNAL_KEYS)?;
    wtx.open_table(DEADLINES)?;
    wtx.open_table(TIMERS)?;
    wtx.open_table(SESSIONS)?;
    wtx.open_table(SESSION_WPS)?;
    wtx.open_table(EVENTS)?;
    wtx.open_table(MESSAGE_KEYS)?;
    wtx.open_table(DEVICES)?;
    wtx.open_table(HUB_EVENTS)?;
    wtx.open_table(DEVICE_WAITS)?;
    wtx.open_table(DEVICE_WAIT_DUE)?;
    wtx.open_table(META)?;
    Ok(())
}

pub(crate) fn first_device_wait_due(rtx: &ReadTransaction) -> Result<Option<u64>, StoreError> {
    let t = rtx.open_table(DEVICE_WAIT_DUE)?;
    Ok(t.first()?.map(|(k, _)| k.value().0))
}

pub(crate) fn first_timer(rtx: &ReadTransaction) -> Result<Option<u64>, StoreError> {
    let t = rtx.open_table(TIMERS)?;
    Ok(t.first()?.map(|(k, _)| k.value().0))
}

/// One group commit's view: every table open for writing, plus what to publish after.
pub struct Tx<'a> {
    /// Waitpoint states and their signals ([`WAITPOINTS`]).
    pub(crate) wps: Table<'a, (&'static str, u64), &'static [u8]>,
    pub(crate) keys: Table<'a, (&'static str, &'static str), u64>,
    pub(crate) deadlines: Table<'a, (u64, &'static str), ()>,
    pub(crate) timers: Table<'a, (u64, &'static str), ()>,
    pub(crate) sessions: Table<'a, &'static str, &'static [u8]>,
    pub(crate) session_wps: Table<'a, (&'static str, &'static str), ()>,
    pub(crate) events: Table<'a, (&'static str, u64), &'static [u8]>,
    pub(crate) msg_keys: Table<'a, (&'static str, &'static str), u64>,
    pub(crate) devices: Table<'a, &'static str, &'static [u8]>,
    pub(crate) hub_events: Table<'a, u64, &'static [u8]>,
    pub(crate) device_waits: Table<'a, (&'static str, &'static str), &'static [u8]>,
    pub(crate) device_wait_due: Table<'a, (u64, &'static str), &'static str>,
    pub(crate) meta: Table<'a, &'static str, u64>,
    pub settings: Arc<Settings>,
    /// Sessions whose log grew, with their newest seq.
    pub(crate) touched: HashMap<String, u64>,
    /// The newest hub event appended in this transaction.
    pub(crate) hub_seq: Option<u64>,
    pub(crate) timers_changed: bool,
    /// Devices whose set of active remote waits changed: their links reconcile.
    pub(crate) devices_touched: HashSet<String>,
    pub(crate) device_wait_due_changed: bool,
    pub(crate) poisoned: Option<String>,
}

impl<'a> Tx<'a> {
    pub(crate) fn open(
        wtx: &'a WriteTransaction,
        settings: Arc<Settings>,
    ) -> Result<Self, StoreError> {
        Ok(Tx {
            wps: wtx.open_table(WAITPOINTS)?,
            keys: wtx.open_table(SIGNAL_KEYS)?,
            deadlines: wtx.open_table(DEADLINES)?,
            timers: wtx.open_table(TIMERS)?,
            sessions: wtx.open_table(SESSIONS)?,
            session_wps: wtx.open_table(SESSION_WPS)?,
            events: wtx.open_table(EVENTS)?,
            msg_keys: wtx.open_table(MESSAGE_KEYS)?,
            devices: wtx.open_table(DEVICES)?,
            hub_events: wtx.open_table(HUB_EVENTS)?,
            device_waits: wtx.open_table(DEVICE_WAITS)?,
            device_wait_due: wtx.open_table(DEVICE_WAIT_DUE)?,
            meta: wtx.open_table(META)?,
            settings,
            touched: HashMap::new(),
            hub_seq: None,
            timers_changed: false,
            devices_touched: HashSet::new(),
            device_wait_due_changed: false,
            poisoned: None,
        })
    }

    /// A job failed half-way: the whole batch is aborted, so nothing half-done is kept.
    pub(crate) fn poison(&mut self, e: &StoreError) {
        if self.poisoned.is_none() {
            self.poisoned = Some(e.to_string());
        }
    }

    /// The newest journal record this transaction's state holds.
    pub(crate) fn journal_seq(&self) -> Result<u64, StoreError> {
        Ok(self.meta.get(JOURNAL_SEQ)?.map_or(0, |v| v.value()))
    }

    /// The settings the hub that wrote the journal applied (see [`SETTING_KEYS`]); `None`
    /// for a store from before they were kept.
    pub(crate) fn stored_settings(&self) -> Result<Option<Settings>, StoreError> {
        let mut v = [0u64; SETTING_KEYS.len()];
        for (slot, key) in v.iter_mut().zip(SETTING_KEYS) {
            match self.meta.get(key)? {
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

    /// Keeps `s` as the settings the journal's next records are applied with.
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
            self.meta.insert(key, x)?;
        }
        Ok(())
    }

    pub(crate) fn first_timer(&self) -> Result<Option<u64>, StoreError> {
        Ok(self.timers.first()?.map(|(k, _)| k.value().0))
    }

    pub(crate) fn first_device_wait_due(&self) -> Result<Option<u64>, StoreError> {
        Ok(self.device_wait_due.first()?.map(|(k, _)| k.value().0))
    }

    pub(crate) fn get_wp(&self, id: &str) -> Result<Option<Waitpoint>, StoreError> {
        match self.wps.get((id, STATE))? {
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
        let deadline = wp.deadline(&self.settings);
        let timer = wp.timer();
        let id = wp.id.as_str();
        match before {
            Some((d, _)) if d == deadline => {}
            Some((d, _)) => {
                self.deadlines.remove((d, id))?;
                self.deadlines.insert((deadline, id), ())?;
            }
            None => {
                self.deadlines.insert((deadline, id), ())?;
            }
        }
        let old_timer = before.and_then(|b| b.1);
        if old_timer != timer {
            if let Some(t) = old_timer {
                self.timers.remove((t, id))?;
            }
            if let Some(t) = timer {
                self.timers.insert((t, id), ())?;
            }
            self.timers_changed = true;
        }
        self.wps.insert((id, STATE), encode(wp)?.as_slice())?;
        // A remote wait lives only as long as its waitpoint is armed.
        self.waitpoint_ended(wp)
    }

    pub(crate) fn get_session(&self, sid: &str) -> Result<Option<SessionRecord>, StoreError> {
        match self.sessions.get(sid)? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }
}

/// A read snapshot.
pub struct ReadTx {
    rtx: ReadTransaction,
}

impl ReadTx {
    pub(crate) fn new(rtx: ReadTransaction) -> Self {
        ReadTx { rtx }
    }

    /// The newest journal record redb's last commit holds (the writer reads it through
    /// its own transaction; tests through this).
    #[cfg(test)]
    pub(crate) fn journal_seq(&self) -> Result<u64, StoreError> {
        let t = self.table(META)?;
        Ok(t.get(JOURNAL_SEQ)?.map_or(0, |v| v.value()))
    }

    pub(crate) fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        def: TableDefinition<K, V>,
    ) -> Result<ReadOnlyTable<K, V>, StoreError> {
        Ok(self.rtx.open_table(def)?)
    }
}
