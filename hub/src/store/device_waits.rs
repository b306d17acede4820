//! Remote waits (a pid, a file or a lock on a device, watched by its agent): the
//! durable half.
//!
//! A device wait is a waitpoint bound to a device plus a record here, keyed
//! (device, waitpoint id), created in the same transaction as the waitpoint. The record
//! lives exactly as long as the wait is *active*: wanted on the device and without an
//! outcome. It ends, and is deleted, in the transaction that records the outcome (the
//! agent's report, the hub's own timeout) or that ends the waitpoint any other way
//! (cancelled, expired, its session deleted, resolved by another signal), so "active" is
//! simply "has a record", and a device's count of waits is the size of its key range.
//!
//! Every outcome is recorded as the signal the intake makes of it
//! (`intake::wait_outcome_signal`: `source: "device-wait"`, dedupe key
//! `device-wait:{id}`), so a report the agent sends again (after a reconnect or a restart)
//! counts once. An index `(due, id) → device` holds each active wait's hub deadline (its
//! bound plus [`TIMEOUT_GRACE_MS`]), read by the hub's device-wait timer.
//!
//! Every transaction that adds or ends a device's waits marks the device touched; after
//! the commit its link task reconciles what the agent holds against these records.
//!
//! A device offline past the grace is told to the sessions waiting on it, once per
//! offline spell (`loss.rs`).

use std::collections::HashSet;

use cortex_protocol::api::DeviceWaitView;
use cortex_protocol::mesh::{MAX_WAITS_PER_DEVICE, WaitEnd, WaitSpec};
use cortex_protocol::signal::MAX_DATA_CHARS;
use serde::{Deserialize, Serialize};

use super::kernel::error::StoreError;
use super::ops::{CreateOutcome, SignalOutcome};
use super::tables::{DEVICE_WAITS, TIMER_DEVICE_WAIT, Tx, decode, encode};
use crate::engine::{CreateParams, HOUR_MS, State, Waitpoint};
use crate::intake::{WaitOutcome, wait_outcome_signal};

/// After a wait's bound, how long the hub leaves the agent to report `timed_out` itself
/// before the hub records the end on its own.
pub const TIMEOUT_GRACE_MS: u64 = 2_000;
/// A device wait's waitpoint expires this long after the hub's deadline, so the device
/// wait's own end (timed out, broke) always comes first and the expiry is only a backstop
/// for a hub that was down across both.
pub const EXPIRY_MARGIN_MS: u64 = 60_000;

/// A device wait's state while it is active.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// The hub has it; the agent has not said it armed it (offline, or not yet answered).
    Pending,
    /// The agent armed it.
    Armed,
}

/// A stored, active device wait.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceWaitRecord {
    /// The waitpoint's id.
    pub id: String,
    pub device: String,
    /// As asked for.
    pub spec: WaitSpec,
    /// As the agent reported it at arm time (pid pinned to its start time, file cursor):
    /// what later arms send.
    #[serde(default)]
    pub resume: Option<WaitSpec>,
    pub created_at: u64,
    /// The bound on the hub's clock.
    pub deadline: u64,
    pub phase: Phase,
    #[serde(default)]
    pub armed_at: Option<u64>,
    /// The agent's arm-time facts, JSON.
    #[serde(default)]
    pub captured: Option<String>,
    /// The device's offline spell (its start) the session was told of (`loss.rs`);
    /// cleared when the device comes back.
    #[serde(default)]
    pub loss_reported: Option<u64>,
}

impl DeviceWaitRecord {
    /// What to send in a `WaitArm`.
    pub fn arm_spec(&self) -> &WaitSpec {
        self.resume.as_ref().unwrap_or(&self.spec)
    }

    /// When the hub ends it if nobody reported.
    pub fn due(&self) -> u64 {
        self.deadline.saturating_add(TIMEOUT_GRACE_MS)
    }

    pub fn view(&self) -> DeviceWaitView {
        let (pid, path) = match &self.spec {
            WaitSpec::Pid { pid, .. } => (Some(*pid), None),
            other => (None, other.path().map(str::to_string)),
        };
        DeviceWaitView {
            id: self.id.clone(),
            device: self.device.clone(),
            kind: self.spec.kind().to_string(),
            pid,
            path,
            pattern: match &self.spec {
                WaitSpec::Log { pattern, .. } => Some(pattern.clone()),
                _ => None,
            },
            silence_ms: self.spec.silence_ms(),
            conditions: match &self.spec {
                WaitSpec::Any { conditions } => Some(
                    conditions
                        .iter()
                        .map(cortex_protocol::waits::condition_string)
                        .collect(),
                ),
                _ => None,
            },
            state: match self.phase {
                Phase::Pending => "pending",
                Phase::Armed => "armed",
            }
            .to_string(),
            created_at: self.created_at,
            deadline: self.deadline,
            armed_at: self.armed_at,
            captured: self
                .captured
                .as_deref()
                .and_then(|c| serde_json::from_str(c).ok()),
        }
    }
}

/// A device wait to create, already checked by the API.
#[derive(Debug, Clone)]
pub struct NewDeviceWait {
    pub device: String,
    pub spec: WaitSpec,
    /// The bound, from now.
    pub timeout_ms: u64,
    /// The session to wake; `None` creates one titled `title`.
    pub session: Option<String>,
    pub title: String,
    pub label: String,
    pub intent: String,
    /// The waitpoint's id when the caller chose it (a job started with it in its
    /// environment); else a fresh one.
    pub waitpoint_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum CreateDeviceWaitOutcome {
    Created {
        waitpoint: Box<Waitpoint>,
        wait: Box<DeviceWaitRecord>,
        session_created: bool,
    },
    NoDevice,
    NoSession,
    /// The device holds [`MAX_WAITS_PER_DEVICE`] waits already.
    TooMany,
    Invalid(crate::engine::CreateError),
}

/// A remote wait's outcome as its agent reported it, with the hub's time of receipt: the
/// input of [`Tx::device_wait_done`], and as such its journal record
/// ([`super::Logged::DeviceWaitDone`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceWaitDone {
    pub device: String,
    pub id: String,
    pub end: WaitEnd,
    pub payload: String,
    pub message: String,
    pub now: u64,
}

/// What recording an outcome did.
#[derive(Debug, Clone, PartialEq)]
pub enum DoneOutcome {
    /// Recorded now, as this signal outcome.
    Recorded(SignalOutcome),
    /// No active wait by that id on that device: recorded before, or ended otherwise.
    /// The agent is acknowledged all the same, so it forgets it.
    NotActive,
}

impl Tx<'_> {
    fn get_device_wait(
        &self,
        device: &str,
        id: &str,
    ) -> Result<Option<DeviceWaitRecord>, StoreError> {
        match self.table(&DEVICE_WAITS).get((device, id))? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    fn put_device_wait(&mut self, rec: &DeviceWaitRecord) -> Result<(), StoreError> {
        self.table_mut(&DEVICE_WAITS).insert(
            (rec.device.as_str(), rec.id.as_str()),
            encode(rec)?.as_slice(),
        )?;
        Ok(())
    }

    /// Deletes an active wait and its deadline (and its device's loss report, when it was
    /// the last); the device is told to reconcile.
    fn drop_device_wait(&mut self, rec: &DeviceWaitRecord) -> Result<(), StoreError> {
        self.table_mut(&DEVICE_WAITS)
            .remove((rec.device.as_str(), rec.id.as_str()))?;
        self.reschedule(TIMER_DEVICE_WAIT, &rec.id, Some(rec.due()), None)?;
        self.device_loss_unwatch(&rec.device)?;
        self.notify(super::tables::TOPIC_DEVICE, &rec.device, 0);
        Ok(())
    }

    fn count_device_waits(&self, device: &str) -> Result<usize, StoreError> {
        let mut n = 0;
        for r in self.table(&DEVICE_WAITS).range((device, "")..)? {
            if r?.0.value().0 != device {
                break;
            }
            n += 1;
        }
        Ok(n)
    }

    /// `POST /api/devices/{name}/waits`: the waitpoint (bound to the device, one signal)
    /// and the wait, in one transaction, and a session for it when none was named.
    pub fn create_device_wait(
        &mut self,
        new: NewDeviceWait,
        secret_hash: [u8; 32],
        now: u64,
    ) -> Result<CreateDeviceWaitOutcome, StoreError> {
        if self.get_device(&new.device)?.is_none() {
            return Ok(CreateDeviceWaitOutcome::NoDevice);
        }
        if self.count_device_waits(&new.device)? >= MAX_WAITS_PER_DEVICE {
            return Ok(CreateDeviceWaitOutcome::TooMany);
        }
        let (sid, session_created) = match &new.session {
            Some(s) => {
                if self.get_session(s)?.is_none() {
                    return Ok(CreateDeviceWaitOutcome::NoSession);
                }
                (s.clone(), false)
            }
            None => (self.create_session(Some(new.title.clone()), now)?.id, true),
        };
        let lifetime = new
            .timeout_ms
            .saturating_add(TIMEOUT_GRACE_MS + EXPIRY_MARGIN_MS);
        let params = CreateParams {
            label: new.label,
            intent: new.intent,
            max_signals: Some(1),
            expires_in_hours: Some(lifetime as f64 / HOUR_MS as f64),
            device: Some(new.device.clone()),
            ..CreateParams::default()
        };
        let wp = match self.create_waitpoint_as(&sid, new.waitpoint_id, params, secret_hash, now)? {
            CreateOutcome::Created(wp) => wp,
            CreateOutcome::NoSession => return Ok(CreateDeviceWaitOutcome::NoSession),
            // Checked above in this transaction; kept total.
            CreateOutcome::NoDevice(_) => return Ok(CreateDeviceWaitOutcome::NoDevice),
            CreateOutcome::Invalid(e) => {
                if session_created {
                    // Nothing of this request is kept; the batch's other jobs are unaffected.
                    self.delete_session(&sid, now)?;
                }
                return Ok(CreateDeviceWaitOutcome::Invalid(e));
            }
        };
        let rec = DeviceWaitRecord {
            id: wp.id.clone(),
            device: new.device,
            spec: new.spec,
            resume: None,
            created_at: now,
            deadline: now.saturating_add(new.timeout_ms),
            phase: Phase::Pending,
            armed_at: None,
            captured: None,
            loss_reported: None,
        };
        self.put_device_wait(&rec)?;
        self.reschedule(TIMER_DEVICE_WAIT, &rec.id, None, Some(rec.due()))?;
        self.device_loss_watch(&rec.device, now)?;
        self.notify(super::tables::TOPIC_DEVICE, &rec.device, 0);
        Ok(CreateDeviceWaitOutcome::Created {
            waitpoint: wp,
            wait: Box::new(rec),
            session_created,
        })
    }

    /// The agent armed the wait. False when it is no longer active (the agent must drop it).
    pub fn device_wait_armed(
        &mut self,
        device: &str,
        id: &str,
        captured: String,
        resume: Option<WaitSpec>,
        now: u64,
    ) -> Result<bool, StoreError> {
        let Some(mut rec) = self.get_device_wait(device, id)? else {
            return Ok(false);
        };
        // Only the kind asked for: an agent cannot turn a pid wait into a file wait.
        let resume = resume.filter(|r| r.kind() == rec.spec.kind());
        if rec.phase == Phase::Armed && rec.resume == resume && rec.captured.is_some() {
            return Ok(true);
        }
        rec.phase = Phase::Armed;
        if rec.armed_at.is_none() {
            let kind = rec.spec.kind();
            self.on_durable(move || crate::metrics::metrics().remote_wait_armed(kind));
        }
        rec.armed_at = Some(rec.armed_at.unwrap_or(now));
        rec.captured = Some(captured.chars().take(MAX_DATA_CHARS).collect());
        if resume.is_some() {
            rec.resume = resume;
        }
        self.put_device_wait(&rec)?;
        Ok(true)
    }

    /// A device wait's outcome, from its agent: recorded once, as a signal under
    /// `device-wait:{id}`, and the wait ends.
    pub fn device_wait_done(&mut self, d: &DeviceWaitDone) -> Result<DoneOutcome, StoreError> {
        let Some(rec) = self.get_device_wait(&d.device, &d.id)? else {
            return Ok(DoneOutcome::NotActive);
        };
        self.end_device_wait(&rec, d.end, &d.payload, &d.message, d.now)
            .map(DoneOutcome::Recorded)
    }

    /// Ends an active wait with `end`: its record goes first, so the waitpoint's own end
    /// that the signal may cause finds nothing left to cancel.
    fn end_device_wait(
        &mut self,
        rec: &DeviceWaitRecord,
        end: WaitEnd,
        payload: &str,
        message: &str,
        now: u64,
    ) -> Result<SignalOutcome, StoreError> {
        self.drop_device_wait(rec)?;
        let s = wait_outcome_signal(&WaitOutcome {
            wait: &rec.id,
            device: &rec.device,
            kind: rec.spec.kind(),
            end,
            payload,
            message,
        });
        self.signal_trusted(&s, now)
    }

    /// One remote wait's hub deadline fell due: see [`Tx::device_waits_due`]. A timer
    /// whose wait is gone is dropped.
    pub(crate) fn device_wait_due(
        &mut self,
        id: &str,
        at: u64,
        now: u64,
        online: &HashSet<String>,
    ) -> Result<(), StoreError> {
        // This entry goes whatever happens (the wait's own may sit elsewhere after a
        // restart postponed it).
        self.reschedule(TIMER_DEVICE_WAIT, id, Some(at), None)?;
        let rec = match self.get_wp(id)?.and_then(|wp| wp.device) {
            Some(device) => self.get_device_wait(&device, id)?,
            None => None,
        };
        let Some(rec) = rec else {
            return Ok(());
        };
        let bound = crate::time::human_duration(rec.deadline.saturating_sub(rec.created_at));
        let (end, message) = crate::engine::remote::overdue(
            &rec.device,
            &rec.spec.describe(),
            &bound,
            online.contains(&rec.device)
                || self
                    .get_device(&rec.device)?
                    .is_some_and(|d| d.link.is_some()),
        );
        self.end_device_wait(&rec, end, "{}", &message, now)?;
        Ok(())
    }

    /// The hub's device-wait timer: every active wait whose hub deadline passed is ended,
    /// `timed_out` when its device is online (its agent should have said so by now),
    /// `broke` when it is offline (nobody can tell what happened there). Returns how many.
    pub fn device_waits_due(
        &mut self,
        now: u64,
        online: &HashSet<String>,
    ) -> Result<usize, StoreError> {
        let due = self.due_timers(now, Some(TIMER_DEVICE_WAIT), super::ops::PASS_LIMIT)?;
        for d in &due {
            self.device_wait_due(&d.id, d.at, now, online)?;
        }
        Ok(due.len())
    }

    /// Ends `device`'s waits that its agent cannot run (it does not announce a capability
    /// the wait needs: its kind's, a silence's, must-exist's), each as `broke` with the
    /// reason. Returns how many.
    pub fn device_waits_unsupported(
        &mut self,
        device: &str,
        capabilities: &[String],
        agent_version: &str,
        now: u64,
    ) -> Result<usize, StoreError> {
        let mut n = 0;
        for rec in self.active_device_waits(device)? {
            let missing: Vec<&str> = rec
                .spec
                .capabilities()
                .into_iter()
                .filter(|cap| !capabilities.iter().any(|c| c == cap))
                .collect();
            if missing.is_empty() {
                continue;
            }
            let message = format!(
                "the agent on {device} (version {agent_version}) cannot wait for {}: it does not announce {}; upgrade cortex-device-agent there",
                rec.spec.describe(),
                missing.join(", ")
            );
            self.end_device_wait(&rec, WaitEnd::Broke, "{}", &message, now)?;
            n += 1;
        }
        Ok(n)
    }

    /// Ends every active wait of a revoked device as `broke`.
    pub(crate) fn device_waits_revoked(
        &mut self,
        device: &str,
        now: u64,
    ) -> Result<(), StoreError> {
        for rec in self.active_device_waits(device)? {
            let message = format!(
                "device {device} was revoked, so its wait for {} can no longer report",
                rec.spec.describe()
            );
            self.end_device_wait(&rec, WaitEnd::Broke, "{}", &message, now)?;
        }
        Ok(())
    }

    fn active_device_waits(&self, device: &str) -> Result<Vec<DeviceWaitRecord>, StoreError> {
        let mut out = Vec::new();
        for r in self.table(&DEVICE_WAITS).range((device, "")..)? {
            let (k, v) = r?;
            if k.value().0 != device {
                break;
            }
            out.push(decode(v.value())?);
        }
        Ok(out)
    }

    /// Called whenever a waitpoint is saved: once a device-bound waitpoint is no longer
    /// armed, its wait (if still active) is not wanted any more.
    pub(crate) fn waitpoint_ended(&mut self, wp: &Waitpoint) -> Result<(), StoreError> {
        if wp.state == State::Armed {
            return Ok(());
        }
        let Some(device) = &wp.device else {
            return Ok(());
        };
        if let Some(rec) = self.get_device_wait(device, &wp.id)? {
            self.drop_device_wait(&rec)?;
        }
        Ok(())
    }
}

impl Tx<'_> {
    /// A device's active waits, by waitpoint id.
    pub fn device_waits(&self, device: &str) -> Result<Vec<DeviceWaitRecord>, StoreError> {
        let t = self.table(&DEVICE_WAITS);
        let mut out = Vec::new();
        for r in t.range((device, "")..)? {
            let (k, v) = r?;
            if k.value().0 != device {
                break;
            }
            out.push(decode(v.value())?);
        }
        Ok(out)
    }

    /// How many active waits a device has.
    /// Every device with the count of its active remote waits (the fleet's list).
    pub fn devices_with_wait_counts(
        &self,
    ) -> Result<Vec<(super::devices::DeviceRecord, u32)>, StoreError> {
        let mut out = Vec::new();
        for d in self.devices()? {
            let n = self.device_wait_count(&d.name)?;
            out.push((d, n));
        }
        Ok(out)
    }

    pub fn device_wait_count(&self, device: &str) -> Result<u32, StoreError> {
        let t = self.table(&DEVICE_WAITS);
        let mut n = 0u32;
        for r in t.range((device, "")..)? {
            if r?.0.value().0 != device {
                break;
            }
            n += 1;
        }
        Ok(n)
    }
}

mod loss;
pub use loss::TIMER_DEVICE_LOSS;

#[cfg(test)]
mod tests;
