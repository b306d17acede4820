//! What the caps of settings.json `limits` count, read and kept in the store's writes
//! (the decisions are `crate::caps`'): a session's armed waitpoints, its place in a
//! spawn tree (its root, how deep it is), and the spawns of a root within the window.
//!
//! A spawned session's record names the session whose monitor spawned it
//! (`spawned_from.session`); its root is the first up that chain spawned by no one, and
//! its depth the steps to it. A parent deleted cuts the chain: the nearest one left
//! stands as the root.

use super::kernel::error::StoreError;
use super::ops::seconds_of;
use super::tables::{SESSION_WPS, SESSIONS, STATE, SessionRecord, Tx, WAITPOINTS, decode};
use crate::caps::{self, SpawnGate};
use crate::engine::State;

/// A session's place in a spawn tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lineage {
    /// The session at the top (the session itself when no one spawned it).
    pub root: String,
    /// Steps from the root (a root is 0).
    pub depth: u32,
}

/// How far up a spawn chain is walked; a chain longer (left by a hub without the cap)
/// counts as this deep, which every `spawnDepth` a hub takes refuses.
const MAX_WALK: u32 = 1_000;

impl Tx<'_> {
    /// How many waitpoints `sid` holds armed.
    pub fn armed_count(&self, sid: &str) -> Result<usize, StoreError> {
        let wps = self.table(&WAITPOINTS);
        let mut n = 0;
        for id in seconds_of(&self.table(&SESSION_WPS), sid)? {
            if let Some(v) = wps.get((id.as_str(), STATE))?
                && super::tables::state_of(v.value()) == Some(State::Armed)
            {
                n += 1;
            }
        }
        Ok(n)
    }

    /// `sid`'s root and depth; `None` if there is no such session.
    pub fn lineage(&self, sid: &str) -> Result<Option<Lineage>, StoreError> {
        let sessions = self.table(&SESSIONS);
        let Some(v) = sessions.get(sid)? else {
            return Ok(None);
        };
        let mut rec: SessionRecord = decode(v.value())?;
        let mut depth = 0u32;
        while let Some(from) = rec.spawned_from.clone() {
            let Some(v) = sessions.get(from.session.as_str())? else {
                break;
            };
            rec = decode(v.value())?;
            depth += 1;
            if depth >= MAX_WALK {
                break;
            }
        }
        Ok(Some(Lineage {
            root: rec.id,
            depth,
        }))
    }

    /// Whether `sid` may spawn one more session at `now`, and the session whose runner
    /// row counts its root's spawns: the root's, or, for a root without one (a session
    /// from before rows were), `sid`'s own.
    pub fn spawn_gate(&self, sid: &str, now: u64) -> Result<(SpawnGate, String), StoreError> {
        let lineage = self.lineage(sid)?.unwrap_or(Lineage {
            root: sid.to_string(),
            depth: 0,
        });
        let (holder, spawns) = match self.agent(&lineage.root)? {
            Some(r) => (lineage.root, r.spawns),
            None => (
                sid.to_string(),
                self.agent(sid)?.map(|r| r.spawns).unwrap_or_default(),
            ),
        };
        let window = self.settings().wake_window_ms;
        let gate = caps::spawn_gate(lineage.depth, &spawns, self.limits(), now, window);
        Ok((gate, holder))
    }

    /// Counts a spawn at `now` in `holder`'s row (from [`Tx::spawn_gate`]).
    pub fn count_spawn(&mut self, holder: &str, now: u64) -> Result<(), StoreError> {
        let Some(mut rec) = self.agent(holder)? else {
            return Ok(());
        };
        caps::trim(&mut rec.spawns, now, self.settings().wake_window_ms);
        rec.spawns.push(now);
        self.put_agent(holder, &rec)
    }
}
