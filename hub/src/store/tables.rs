//! The hub's tables, registered with the kernel ([`REGISTRY`]), the view type [`Tx`] and its
//! accessors, and the notice topics.
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
//! - `meta`: name → number; `journal_seq` is the newest journal record a checkpoint holds

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::StoreError;
use super::kernel::{AnyTable, Table, TableSpec};
use crate::engine::{Settings, Waitpoint};

pub(crate) use super::kernel::checkpoint::META;

pub(crate) const WAITPOINTS: TableSpec<(&str, u64), &[u8]> = TableSpec::new(1, "waitpoints_v2");
/// The key of a waitpoint's state record in [`WAITPOINTS`]; its signals use 0, 1, 2…
pub(crate) const STATE: u64 = u64::MAX;
pub(crate) const SIGNAL_KEYS: TableSpec<(&str, &str), u64> = TableSpec::new(2, "signal_keys");
pub(crate) const DEADLINES: TableSpec<(u64, &str), ()> = TableSpec::new(3, "deadlines");
pub(crate) const TIMERS: TableSpec<(u64, &str), ()> = TableSpec::new(4, "timers");
pub(crate) const SESSIONS: TableSpec<&str, &[u8]> = TableSpec::new(5, "sessions");
pub(crate) const SESSION_WPS: TableSpec<(&str, &str), ()> = TableSpec::new(6, "session_waitpoints");
pub(crate) const EVENTS: TableSpec<(&str, u64), &[u8]> = TableSpec::new(7, "events");
pub(crate) const MESSAGE_KEYS: TableSpec<(&str, &str), u64> = TableSpec::new(8, "message_keys");
pub(crate) const DEVICES: TableSpec<&str, &[u8]> = TableSpec::new(9, "devices");
pub(crate) const HUB_EVENTS: TableSpec<u64, &[u8]> = TableSpec::new(10, "hub_events");
pub(crate) const DEVICE_WAITS: TableSpec<(&str, &str), &[u8]> = TableSpec::new(11, "device_waits");
pub(crate) const DEVICE_WAIT_DUE: TableSpec<(u64, &str), &str> =
    TableSpec::new(12, "device_wait_due");

/// Every table of the hub, each at its position.
pub(crate) static REGISTRY: [&dyn AnyTable; 13] = [
    &META,
    &WAITPOINTS,
    &SIGNAL_KEYS,
    &DEADLINES,
    &TIMERS,
    &SESSIONS,
    &SESSION_WPS,
    &EVENTS,
    &MESSAGE_KEYS,
    &DEVICES,
    &HUB_EVENTS,
    &DEVICE_WAITS,
    &DEVICE_WAIT_DUE,
];

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

/// What the hub's operations need besides the tables.
pub struct Ctx {
    pub settings: Arc<Settings>,
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
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, StoreError> {
    rmp_serde::to_vec_named(v).map_err(|e| StoreError::Decode(e.to_string()))
}

pub(crate) fn decode<T: for<'de> Deserialize<'de>>(b: &[u8]) -> Result<T, StoreError> {
    rmp_serde::from_slice(b).map_err(|e| StoreError::Decode(e.to_string()))
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
    pub(crate) fn timers(&mut self) -> Table<'_, (u64, &'static str), ()> {
        self.table_mut(&TIMERS)
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
    pub(crate) fn device_wait_due(&mut self) -> Table<'_, (u64, &'static str), &'static str> {
        self.table_mut(&DEVICE_WAIT_DUE)
    }
    fn meta(&mut self) -> Table<'_, &'static str, u64> {
        self.table_mut(&META)
    }

    /// The hub's settings.
    pub fn settings(&self) -> &Arc<Settings> {
        &self.ctx.settings
    }

    /// The newest journal record the last checkpoint holds (for tests).
    #[cfg(test)]
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

    pub(crate) fn first_timer(&self) -> Result<Option<u64>, StoreError> {
        Ok(self.table(&TIMERS).first()?.map(|(k, _)| k.value().0))
    }

    pub(crate) fn first_device_wait_due(&self) -> Result<Option<u64>, StoreError> {
        Ok(self
            .table(&DEVICE_WAIT_DUE)
            .first()?
            .map(|(k, _)| k.value().0))
    }

    /// Announces the earliest decided wake (after a change to the timers).
    pub(crate) fn timers_changed(&mut self) -> Result<(), StoreError> {
        let first = self.first_timer()?;
        self.notify(TOPIC_TIMERS, TIMER_WAKE, first.unwrap_or(u64::MAX));
        Ok(())
    }

    /// Announces the earliest remote-wait deadline (after a change to them).
    pub(crate) fn device_wait_due_changed(&mut self) -> Result<(), StoreError> {
        let first = self.first_device_wait_due()?;
        self.notify(TOPIC_TIMERS, TIMER_DEVICE_WAIT, first.unwrap_or(u64::MAX));
        Ok(())
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
        let timer = wp.timer();
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
            if let Some(t) = old_timer {
                self.timers().remove((t, id))?;
            }
            if let Some(t) = timer {
                self.timers().insert((t, id), ())?;
            }
            self.timers_changed()?;
        }
        self.wps().insert((id, STATE), encode(wp)?.as_slice())?;
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
pub const TOPIC_TIMERS: &str = "timers";
/// Keys under [`TOPIC_TIMERS`]: the earliest decided wake, the earliest remote-wait deadline
/// (`u64::MAX`: none).
pub const TIMER_WAKE: &str = "wake";
pub const TIMER_DEVICE_WAIT: &str = "device-wait";
