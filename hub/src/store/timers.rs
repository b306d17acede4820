//! The hub's timer kinds and their handlers, over the kernel's timer queue: a decided
//! wake (`wake`) and a remote wait's hub deadline (`device-wait`). The server's one
//! timer loop calls [`Tx::fire_due`] when the queue's earliest time has come.

use std::collections::HashSet;

use super::kernel::error::StoreError;
use super::ops::PASS_LIMIT;
use super::tables::{TIMER_DEVICE_WAIT, TIMER_WAKE, Tx};

impl Tx<'_> {
    /// Runs every timer due at `now` (at most a pass's worth): each kind's handler removes
    /// or moves its entry. `online` is the devices with a live link, for the remote-wait
    /// rule. Returns how many it ran.
    pub fn fire_due(&mut self, now: u64, online: &HashSet<String>) -> Result<usize, StoreError> {
        let due = self.due_timers(now, None, PASS_LIMIT)?;
        for d in &due {
            match d.kind.as_str() {
                TIMER_WAKE => self.wake_due(&d.id, d.at, now)?,
                TIMER_DEVICE_WAIT => self.device_wait_due(&d.id, d.at, now, online)?,
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
}
