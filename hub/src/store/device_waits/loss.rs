//! A device's loss, told to the sessions waiting on it: when a device with active remote
//! waits has been offline longer than the grace (`deviceLossGraceMs`), each of those
//! sessions gets one wake with reason `report` saying which device, since when, and that
//! the wait stays armed. The wake is only appended to the session's log: the waitpoint's
//! state, signals and counts do not change, and the wait's real outcome still comes once
//! (when the device is back), or the bound's `broke` if it never is.
//!
//! One durable timer per device (kind `device-loss`, id: the device) stands at the
//! device record's `loss_at` while it is offline with active waits. Each wait records the
//! offline spell it was told of (`loss_reported`: the spell's start), so a spell is told
//! once per wait, across hub restarts too; the device coming back clears it, so the next
//! outage is told again. After a hub restart every device is offline until its agent
//! reconnects, so the grace is measured from the later of its last seen and the hub's
//! start: a restart alone is never reported as a loss.

use std::collections::HashSet;

use cortex_protocol::api::{EventBody, WaitpointRef, Wake, WakeReason};

use crate::config::DEFAULT_DEVICE_LOSS_GRACE_MS;
use crate::store::devices::DeviceRecord;
use crate::store::kernel::error::StoreError;
use crate::store::tables::{DEVICE_WAITS, META, Tx};

/// The timer kind of a device's loss report (id: the device's name).
pub const TIMER_DEVICE_LOSS: &str = "device-loss";

/// Where the grace the running hub applies is kept ([`META`]), set at each start, so every
/// operation that schedules a report reads the same number.
const LOSS_GRACE_KEY: &str = "device_loss_grace_ms";

/// When a device offline since `since` is told lost: `grace` after the later of that,
/// its last seen and the hub's start (a hub cannot have missed a device for longer than it
/// has been up).
pub fn loss_at(since: u64, last_seen: Option<u64>, hub_start: u64, grace: u64) -> u64 {
    since
        .max(last_seen.unwrap_or(0))
        .max(hub_start)
        .saturating_add(grace)
}

/// Whether a wait's session is told of its device's loss now: the device is still
/// offline, and this offline spell (its start) was not told on this wait yet.
pub fn to_report(online: bool, spell: u64, reported: Option<u64>) -> bool {
    !online && reported != Some(spell)
}

impl DeviceRecord {
    /// The start of its current offline spell: since it went offline, or since it was
    /// added when it never connected.
    pub fn offline_spell(&self) -> u64 {
        self.offline_since.unwrap_or(self.created_at)
    }
}

impl Tx<'_> {
    /// Whether `device` has an active wait: the first key of its range, so ending each of
    /// many waits stays cheap.
    fn has_device_waits(&self, device: &str) -> Result<bool, StoreError> {
        match self.table(&DEVICE_WAITS).range((device, "")..)?.next() {
            Some(r) => Ok(r?.0.value().0 == device),
            None => Ok(false),
        }
    }

    /// The grace the running hub applies (the default when no start has set it).
    pub(crate) fn loss_grace(&self) -> Result<u64, StoreError> {
        Ok(self
            .table(&META)
            .get(LOSS_GRACE_KEY)?
            .map_or(DEFAULT_DEVICE_LOSS_GRACE_MS, |v| v.value()))
    }

    /// When a device added at `added`, offline until it first connects, is told lost.
    pub(crate) fn first_loss_at(&self, added: u64) -> Result<u64, StoreError> {
        Ok(loss_at(added, None, 0, self.loss_grace()?))
    }

    /// At the hub's start, after the previous run's links were recorded offline: keeps
    /// `grace`, and moves every device's report to `grace` after the later of its last
    /// seen and `now` (the start). Reports already told stay told (their spell is the
    /// same), so a restart repeats none.
    pub fn device_losses_restarted(&mut self, now: u64, grace: u64) -> Result<(), StoreError> {
        if self.table(&META).get(LOSS_GRACE_KEY)?.map(|v| v.value()) != Some(grace) {
            self.table_mut(&META).insert(LOSS_GRACE_KEY, grace)?;
        }
        for mut rec in self.devices()? {
            let at = loss_at(rec.offline_spell(), rec.last_seen, now, grace);
            let old = rec.loss_at.replace(at);
            self.put_device(&rec)?;
            let new = self.has_device_waits(&rec.name)?.then_some(at);
            self.reschedule(TIMER_DEVICE_LOSS, &rec.name, old, new)?;
        }
        Ok(())
    }

    /// The device went offline at `rec.offline_since` (the caller saves `rec`): its report
    /// is due a grace later, and its timer is set when it has active waits.
    pub(crate) fn device_lost(&mut self, rec: &mut DeviceRecord) -> Result<(), StoreError> {
        let grace = self.loss_grace()?;
        let at = loss_at(rec.offline_spell(), None, 0, grace);
        let old = rec.loss_at.replace(at);
        let new = self.has_device_waits(&rec.name)?.then_some(at);
        self.reschedule(TIMER_DEVICE_LOSS, &rec.name, old, new)
    }

    /// The device is back (the caller saves `rec`): no report is due, and its waits
    /// forget the spell they were told of, so a later outage is told again.
    pub(crate) fn device_back(&mut self, rec: &mut DeviceRecord) -> Result<(), StoreError> {
        if let Some(old) = rec.loss_at.take() {
            self.reschedule(TIMER_DEVICE_LOSS, &rec.name, Some(old), None)?;
        }
        for mut w in self.device_waits(&rec.name)? {
            if w.loss_reported.take().is_some() {
                self.put_device_wait(&w)?;
            }
        }
        Ok(())
    }

    /// The device is revoked: its report goes (its waits break instead).
    pub(crate) fn device_loss_forgotten(&mut self, rec: &DeviceRecord) -> Result<(), StoreError> {
        self.reschedule(TIMER_DEVICE_LOSS, &rec.name, rec.loss_at, None)
    }

    /// A wait was created on `device`: when the device is offline, its report timer
    /// stands at the spell's time (a wait created after that time is told at once, with
    /// since when the device has been offline).
    pub(crate) fn device_loss_watch(&mut self, device: &str, now: u64) -> Result<(), StoreError> {
        let Some(mut rec) = self.get_device(device)? else {
            return Ok(());
        };
        if rec.link.is_some() {
            return Ok(());
        }
        let at = match rec.loss_at {
            Some(at) => at,
            None => {
                // A record from before reports were kept: from now.
                let at = loss_at(rec.offline_spell(), None, now, self.loss_grace()?);
                rec.loss_at = Some(at);
                self.put_device(&rec)?;
                at
            }
        };
        // The same entry again is no change.
        self.reschedule(TIMER_DEVICE_LOSS, device, None, Some(at))
    }

    /// A wait on `device` ended: with none left, nobody is waiting to be told.
    pub(crate) fn device_loss_unwatch(&mut self, device: &str) -> Result<(), StoreError> {
        if self.has_device_waits(device)? {
            return Ok(());
        }
        match self.get_device(device)?.and_then(|r| r.loss_at) {
            Some(at) => self.reschedule(TIMER_DEVICE_LOSS, device, Some(at), None),
            None => Ok(()),
        }
    }

    /// A device's report timer fell due at `at`: if it is offline still, each active wait
    /// on it whose session was not told of this spell gets one `report` wake. Returns how
    /// many were told.
    pub(crate) fn device_loss_due(
        &mut self,
        device: &str,
        at: u64,
        now: u64,
        online: &HashSet<String>,
    ) -> Result<usize, StoreError> {
        self.reschedule(TIMER_DEVICE_LOSS, device, Some(at), None)?;
        let Some(rec) = self.get_device(device)? else {
            return Ok(0);
        };
        let is_online = online.contains(device) || rec.link.is_some();
        match rec.loss_at {
            // Moved since this entry was set (a restart): its own entry stands.
            Some(due) if due > now => {
                if !is_online && self.has_device_waits(device)? {
                    self.reschedule(TIMER_DEVICE_LOSS, device, None, Some(due))?;
                }
                return Ok(0);
            }
            Some(_) => {}
            None => return Ok(0),
        }
        let spell = rec.offline_spell();
        let mut told = 0;
        for mut w in self.device_waits(device)? {
            if !to_report(is_online, spell, w.loss_reported) {
                continue;
            }
            let Some(wp) = self.get_wp(&w.id)? else {
                continue;
            };
            let text = crate::text::device_loss_text(&crate::text::DeviceLoss {
                waitpoint: &wp,
                device,
                what: &w.spec.describe(),
                since: spell,
                ever_seen: rec.last_seen.is_some(),
                deadline: w.deadline,
                now,
            });
            let wake = Wake {
                waitpoint: WaitpointRef {
                    id: wp.id.clone(),
                    label: wp.label.clone(),
                    intent: wp.intent.clone(),
                },
                reason: WakeReason::Report,
                waited_ms: now.saturating_sub(wp.created_at),
                signals: Vec::new(),
                omitted: 0,
                text,
            };
            self.append_event(&wp.session, EventBody::Wake(Box::new(wake)), now)?;
            w.loss_reported = Some(spell);
            self.put_device_wait(&w)?;
            told += 1;
        }
        if told > 0 {
            // One notice per outage, however many waits (or later ones) are told of it.
            let n = crate::notify::device_lost(device, spell, told, now);
            self.queue_notice(&format!("device-lost:{device}:{spell}"), n, now)?;
        }
        Ok(told)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grace_runs_from_the_later_of_the_spell_the_last_seen_and_the_hubs_start() {
        // An ordinary outage: from when the link ended.
        assert_eq!(loss_at(1_000, None, 0, 500), 1_500);
        // After a restart: the hub was down, so from its start, not from the last seen.
        assert_eq!(loss_at(1_000, Some(1_000), 9_000, 500), 9_500);
        // A last seen after the spell's start (a clock that stepped back) still counts.
        assert_eq!(loss_at(1_000, Some(2_000), 0, 500), 2_500);
        assert_eq!(loss_at(u64::MAX - 1, None, 0, 500), u64::MAX);
    }

    #[test]
    fn a_spell_is_told_once_per_wait_and_never_while_online() {
        assert!(to_report(false, 1_000, None));
        assert!(!to_report(false, 1_000, Some(1_000)), "told already");
        assert!(to_report(false, 2_000, Some(1_000)), "a later outage");
        assert!(!to_report(true, 1_000, None), "back before the timer");
    }
}
