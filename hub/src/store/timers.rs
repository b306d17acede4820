//! The hub's timer kinds and their handlers, over the kernel's timer queue: a decided
//! wake (`wake`), a remote wait's hub deadline (`device-wait`), a timer a session's model
//! set (`agent-timer`), an approval's expiry (`approval`), a device's loss report
//! (`device-loss`) and the end of a session's wait for its runs' hour (`run-defer`). The server's one
//! timer loop calls [`Tx::fire_due`] when the queue's earliest time has come.

use std::collections::HashSet;

use super::kernel::error::StoreError;
use super::ops::PASS_LIMIT;
use cortex_protocol::api::{AnswerItem, Decision, EventBody};

use super::agent::{SessionTimer, split_timer_id};
use super::device_waits::TIMER_DEVICE_LOSS;
use super::tables::{
    TIMER_AGENT, TIMER_APPROVAL, TIMER_DEVICE_WAIT, TIMER_RUN_DEFER, TIMER_WAKE, Tx,
};

impl Tx<'_> {
    /// Runs every timer due at `now` (at most a pass's worth): each kind's handler removes
    /// or moves its entry. `online` is the devices with a live link, for the remote-wait
    /// rule and the loss report. Returns how many it ran.
    pub fn fire_due(&mut self, now: u64, online: &HashSet<String>) -> Result<usize, StoreError> {
        let due = self.due_timers(now, None, PASS_LIMIT)?;
        for d in &due {
            match d.kind.as_str() {
                TIMER_WAKE => self.wake_due(&d.id, d.at, now)?,
                TIMER_DEVICE_WAIT => self.device_wait_due(&d.id, d.at, now, online)?,
                TIMER_AGENT => {
                    self.reschedule(TIMER_AGENT, &d.id, Some(d.at), None)?;
                    self.agent_timer_due(&d.id, d.at, now)?;
                }
                TIMER_APPROVAL => {
                    self.reschedule(TIMER_APPROVAL, &d.id, Some(d.at), None)?;
                    self.approval_due(&d.id, d.at, now)?;
                }
                TIMER_RUN_DEFER => {
                    self.reschedule(TIMER_RUN_DEFER, &d.id, Some(d.at), None)?;
                    self.run_defer_due(&d.id, d.at)?;
                }
                TIMER_DEVICE_LOSS => {
                    self.device_loss_due(&d.id, d.at, now, online)?;
                }
                other => {
                    tracing::warn!(kind = other, id = %d.id, "a timer of a kind this hub does not know; dropped");
                    self.reschedule(other, &d.id, Some(d.at), None)?;
                }
            }
        }
        Ok(due.len())
    }

    /// Moves the timers of `kind` due at `now` to `until`; returns how many. At start,
    /// remote waits whose deadline passed while the hub was down get time for their
    /// devices to reconnect and report before the hub judges them.
    pub fn postpone_due(&mut self, kind: &str, now: u64, until: u64) -> Result<usize, StoreError> {
        let due = self.due_timers(now, Some(kind), usize::MAX)?;
        for d in &due {
            self.reschedule(kind, &d.id, Some(d.at), Some(until))?;
        }
        Ok(due.len())
    }

    /// A session's timer came due: it fires now if the session is idle, else once its
    /// turn ends (marked due). Firing posts its text to the inbox, keyed
    /// `timer:NAME:SEQ`, so it counts once however often it is posted.
    fn agent_timer_due(&mut self, id: &str, at: u64, now: u64) -> Result<(), StoreError> {
        let Some((sid, name)) = split_timer_id(id) else {
            return Ok(());
        };
        let Some(mut rec) = self.agent(sid)? else {
            return Ok(());
        };
        let Some(i) = rec
            .timers
            .iter()
            .position(|t| t.name == name && t.at == at && !t.due)
        else {
            return Ok(());
        };
        if rec.turn.is_some() && !rec.cancelled {
            rec.timers[i].due = true;
            return self.put_agent(sid, &rec);
        }
        let timer = rec.timers.remove(i);
        self.put_agent(sid, &rec)?;
        if !rec.cancelled {
            self.fire_timer(sid, timer, now)?;
        }
        Ok(())
    }

    /// Posts a timer's firing to its session's inbox (the caller has taken it out of the
    /// session's row and saved that).
    pub fn fire_timer(&mut self, sid: &str, t: SessionTimer, now: u64) -> Result<(), StoreError> {
        let key = format!("timer:{}:{}", t.name, t.set_seq);
        let body = EventBody::Timer {
            name: t.name,
            text: t.text,
            dedupe_key: key.clone(),
        };
        self.post_inbox(sid, body, Some(key), now)?;
        Ok(())
    }

    /// A session's input waited for `limits.runsPerHour` until `at`: the session is made
    /// ready, and its boundary starts the run (unless it was moved, or a message started
    /// one meanwhile).
    fn run_defer_due(&mut self, sid: &str, at: u64) -> Result<(), StoreError> {
        let Some(mut rec) = self.agent(sid)? else {
            return Ok(());
        };
        if rec.deferred_until != Some(at) || rec.cancelled {
            return Ok(());
        }
        // Its queue entry is gone (the caller took it): should the boundary find the
        // window still full, it waits and says so again.
        rec.deferred_until = None;
        if rec.status == super::agent::RunStatus::Idle && !rec.deferred.is_empty() {
            self.make_ready(sid, &mut rec)?;
        }
        self.put_agent(sid, &rec)
    }

    /// An approval expired unanswered: it is denied, as an answer from `timeout`.
    fn approval_due(&mut self, id: &str, at: u64, now: u64) -> Result<(), StoreError> {
        let Some((sid, request)) = split_timer_id(id) else {
            return Ok(());
        };
        let Some(rec) = self.agent(sid)? else {
            return Ok(());
        };
        if !rec
            .parked
            .as_ref()
            .is_some_and(|p| p.id == request && p.expires_at == Some(at))
        {
            return Ok(());
        }
        let body = EventBody::Answer(Box::new(AnswerItem {
            request_id: request.to_string(),
            decision: Some(Decision::Deny),
            always: false,
            args: None,
            data: None,
            by: "timeout".into(),
        }));
        self.post_inbox(sid, body, Some(format!("answer:{request}")), now)?;
        Ok(())
    }
}
