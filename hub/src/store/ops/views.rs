//! The read side: session and waitpoint views, events after a cursor, counts.

use cortex_protocol::api::{Badges, SessionView, SignalView, WaitpointView, WakeView};

use crate::engine::{State, Waitpoint};
use crate::store::kernel::error::StoreError;
use crate::store::tables::{
    DEADLINES, EVENTS, SESSION_WPS, SESSIONS, STATE, SessionRecord, Tx, WAITPOINTS, decode,
};

use super::{VIEW_SIGNALS, seconds_of};

impl Tx<'_> {
    /// The session `sid`, its state as on a hub that runs a model.
    pub fn session(&self, sid: &str) -> Result<Option<SessionView>, StoreError> {
        self.session_seen(sid, true)
    }

    /// The session `sid`, its state as on a hub that runs a model (`model`) or not.
    pub fn session_seen(&self, sid: &str, model: bool) -> Result<Option<SessionView>, StoreError> {
        let t = self.table(&SESSIONS);
        let Some(v) = t.get(sid)? else {
            return Ok(None);
        };
        let rec: SessionRecord = decode(v.value())?;
        Ok(Some(self.session_view(rec, model)?))
    }

    fn session_view(&self, rec: SessionRecord, model: bool) -> Result<SessionView, StoreError> {
        let mut armed = 0;
        for wp in self.session_waitpoints_raw(&rec.id)? {
            if wp.state == State::Armed {
                armed += 1;
            }
        }
        let agent = self.agent(&rec.id)?;
        let runs = self.session_runs(&rec.id, agent.as_ref())?;
        let facts = crate::session_state::Facts {
            cancelled: agent.as_ref().is_some_and(|a| a.cancelled),
            asks_a_person: agent.as_ref().is_some_and(|a| a.parked.is_some()),
            turn_queued: agent
                .as_ref()
                .is_some_and(|a| a.status != crate::store::agent::RunStatus::Idle),
            model_runs: model && runs,
            last_run_failed: agent
                .as_ref()
                .and_then(|a| a.last_run.as_ref())
                .is_some_and(|r| !r.result.ok),
            armed_waitpoints: armed,
        };
        Ok(SessionView {
            id: rec.id,
            title: rec.title,
            created_at: rec.created_at,
            last_seq: rec.last_seq,
            armed_waitpoints: armed,
            spawned_from: rec.spawned_from,
            runs,
            state: crate::session_state::state(facts),
            config: None,
        })
    }

    /// Every session, oldest first, their state as on a hub that runs a model.
    pub fn sessions(&self) -> Result<Vec<SessionView>, StoreError> {
        self.sessions_seen(true)
    }

    /// Every session, oldest first, their state as on a hub that runs a model (`model`)
    /// or not.
    pub fn sessions_seen(&self, model: bool) -> Result<Vec<SessionView>, StoreError> {
        let t = self.table(&SESSIONS);
        let mut out = Vec::new();
        for r in t.iter()? {
            let rec: SessionRecord = decode(r?.1.value())?;
            out.push(self.session_view(rec, model)?);
        }
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// Every armed waitpoint of every session, oldest first.
    pub fn armed_waitpoints(
        &self,
        now: u64,
        settings: &crate::engine::Settings,
    ) -> Result<Vec<WaitpointView>, StoreError> {
        let mut sids = Vec::new();
        for r in self.table(&SESSIONS).iter()? {
            sids.push(r?.0.value().to_string());
        }
        let mut out = Vec::new();
        for sid in sids {
            for wp in self.session_waitpoints_raw(&sid)? {
                if wp.state == State::Armed {
                    out.push(self.view(&wp, now, settings)?);
                }
            }
        }
        out.sort_by(|a, b| {
            a.head
                .created_at
                .cmp(&b.head.created_at)
                .then(a.head.id.cmp(&b.head.id))
        });
        Ok(out)
    }

    /// Raw JSON of the events after `after`, at most `limit`; `None` if no such session.
    pub fn events_after(
        &self,
        sid: &str,
        after: u64,
        limit: usize,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        if self.table(&SESSIONS).get(sid)?.is_none() {
            return Ok(None);
        }
        let t = self.table(&EVENTS);
        let mut out = Vec::new();
        for r in t.range((sid, after.saturating_add(1))..=(sid, u64::MAX))? {
            out.push(r?.1.value().to_vec());
            if out.len() >= limit {
                break;
            }
        }
        Ok(Some(out))
    }

    fn session_waitpoints_raw(&self, sid: &str) -> Result<Vec<Waitpoint>, StoreError> {
        let idx = self.table(&SESSION_WPS);
        let wps = self.table(&WAITPOINTS);
        let mut out = Vec::new();
        for id in seconds_of(&idx, sid)? {
            if let Some(v) = wps.get((id.as_str(), STATE))? {
                out.push(decode::<Waitpoint>(v.value())?);
            }
        }
        Ok(out)
    }

    /// wait_check: the session's waitpoints, or `None` if the session does not exist.
    pub fn session_waitpoints(
        &self,
        sid: &str,
        now: u64,
        settings: &crate::engine::Settings,
    ) -> Result<Option<Vec<WaitpointView>>, StoreError> {
        if self.table(&SESSIONS).get(sid)?.is_none() {
            return Ok(None);
        }
        let mut out = Vec::new();
        for wp in self.session_waitpoints_raw(sid)? {
            out.push(self.view(&wp, now, settings)?);
        }
        out.sort_by_key(|a| a.head.created_at);
        Ok(Some(out))
    }

    pub fn waitpoint(
        &self,
        id: &str,
        now: u64,
        settings: &crate::engine::Settings,
    ) -> Result<Option<WaitpointView>, StoreError> {
        let t = self.table(&WAITPOINTS);
        let Some(v) = t.get((id, STATE))? else {
            return Ok(None);
        };
        let wp: Waitpoint = decode(v.value())?;
        Ok(Some(self.view(&wp, now, settings)?))
    }

    /// The raw engine state, for callers that act on it.
    pub fn waitpoint_state(&self, id: &str) -> Result<Option<Waitpoint>, StoreError> {
        let t = self.table(&WAITPOINTS);
        match t.get((id, STATE))? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    fn view(
        &self,
        wp: &Waitpoint,
        now: u64,
        settings: &crate::engine::Settings,
    ) -> Result<WaitpointView, StoreError> {
        let t = self.table(&WAITPOINTS);
        let from = wp.signal_count.saturating_sub(VIEW_SIGNALS as u64);
        let mut signals = Vec::new();
        for r in t.range((wp.id.as_str(), from)..(wp.id.as_str(), wp.signal_count))? {
            signals.push(decode::<SignalView>(r?.1.value())?);
        }
        let mut wakes: Vec<WakeView> = wp
            .wakes
            .iter()
            .map(|w| WakeView {
                reason: w.reason,
                at: w.at,
                delivered: true,
                spawned: w.spawned.clone(),
            })
            .collect();
        let pending = wp.wake_pending();
        if let Some(p) = pending {
            let reason = if wp.round.failed {
                cortex_protocol::api::WakeReason::Failed
            } else if wp.is_monitor() {
                cortex_protocol::api::WakeReason::Report
            } else {
                cortex_protocol::api::WakeReason::Fired
            };
            wakes.push(WakeView {
                reason,
                at: p.due_at,
                delivered: false,
                spawned: None,
            });
        }
        let mut facts = wp.progress_facts();
        // A state written before fails were counted: the listed signals say at least this.
        let listed_fails = signals
            .iter()
            .filter(|s| s.status == cortex_protocol::SignalStatus::Fail)
            .count() as u64;
        facts.failed = facts.failed.max(listed_fails);
        Ok(WaitpointView {
            head: crate::text::waitpoint_head(wp),
            resolved_at: wp.ended_at,
            silence_due_at: wp.silence_due_at(),
            signal_count: wp.signal_count,
            signals,
            wakes,
            badges: Badges {
                wake_limit_reached: pending.is_some_and(|p| p.held_by_cap),
                delivery_attempts: 0,
                wakes_this_hour: wp.wakes_in_hour(now, settings),
                max_wakes_per_hour: settings.max_wakes_per_hour,
            },
            progress: Some(cortex_protocol::progress::progress(facts)),
        })
    }

    /// How many entries the deadline index holds (for tests and status).
    pub fn deadline_count(&self) -> Result<u64, StoreError> {
        self.table(&DEADLINES).count()
    }

    /// How many waitpoints the store holds in each state (the metrics' gauge at start):
    /// every waitpoint has one entry in the deadline index.
    pub fn waitpoint_counts(&self) -> Result<Vec<(&'static str, i64)>, StoreError> {
        let mut counts = [0i64; 4];
        let states = [
            State::Armed,
            State::Resolved,
            State::Expired,
            State::Cancelled,
        ];
        let wps = self.table(&WAITPOINTS);
        for r in self.table(&DEADLINES).iter()? {
            let (k, _) = r?;
            let (_, id) = k.value();
            if let Some(v) = wps.get((id, STATE))?
                && let Some(st) = crate::store::tables::state_of(v.value())
                && let Some(i) = states.iter().position(|s| *s == st)
            {
                counts[i] += 1;
            }
        }
        Ok(states
            .iter()
            .zip(counts)
            .map(|(s, n)| (s.as_str(), n))
            .collect())
    }
}
