//! Remote waits on one device link: keeping what the agent holds in step with the store.
//!
//! The store's `device_waits` records are what the hub wants armed on the device; the
//! agent's hello lists what it holds. Reconciliation is level-based, not a log of edits:
//! after the hello, and after every commit that added or ended one of this device's waits
//! (the store's per-device notifier), the link compares the two and
//! - arms (`WaitArm`) what is wanted and not held, or held but never confirmed armed (the
//!   agent answers `WaitArmed` again and arms nothing new: the id is the identity);
//! - cancels (`WaitCancel`) what is held and no longer wanted;
//! - leaves alone a wanted wait whose bound passed (the hub's timer ends it) and ends as
//!   `broke` one the agent cannot run (it does not announce the kind's capability).
//!
//! So a wait asked for while the device was offline goes out with the next hello, and a
//! cancel that could not be sent is sent on the next link. The agent's `WaitArmed` is
//! written to the store by a task, its `WaitDone` handed to the store's writer with a
//! callback (either way a burst shares group commits); their results come back to the
//! link's loop, the one owner of `held`. `WaitDone` is answered `WaitAck` only once the
//! store's journal (or a commit) holds its signal.

use std::collections::HashSet;

use cortex_host::timing;
use cortex_protocol::mesh::{HubFrame, MAX_WAITS_PER_DEVICE, WaitEnd, WaitSpec};
use tokio::sync::{mpsc, watch};

use crate::registry::End;
use crate::state::AppState;
use crate::store::device_waits::{DeviceWaitDone, DeviceWaitRecord, DoneOutcome, Phase};
use crate::time::now_ms;

/// What one reconciliation decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// (id, spec to send, bound left in ms, deadline on the hub's clock)
    pub arm: Vec<(String, WaitSpec, u64, u64)>,
    pub cancel: Vec<String>,
    /// Some wanted wait is of a kind the agent does not announce.
    pub unsupported: bool,
}

/// The pure rule; see the module docs. `asked`: ids armed on this link already.
pub fn plan(
    wanted: &[DeviceWaitRecord],
    held: &HashSet<String>,
    asked: &HashSet<String>,
    capabilities: &[String],
    now: u64,
) -> Plan {
    let mut p = Plan::default();
    for rec in wanted {
        // Every capability the wait needs (a silence, must-exist, an any's parts), not only
        // its kind's: an agent that lacks one would run another wait than the one asked.
        let runs = |cap: &str| capabilities.iter().any(|c| c == cap);
        if !rec.spec.capabilities().into_iter().all(runs) {
            p.unsupported = true;
            continue;
        }
        if now >= rec.deadline || asked.contains(&rec.id) {
            continue;
        }
        if !held.contains(&rec.id) || rec.phase == Phase::Pending {
            p.arm.push((
                rec.id.clone(),
                rec.arm_spec().clone(),
                rec.deadline - now,
                rec.deadline,
            ));
        }
    }
    let ids: HashSet<&str> = wanted.iter().map(|r| r.id.as_str()).collect();
    let mut cancel: Vec<String> = held
        .iter()
        .filter(|id| !ids.contains(id.as_str()))
        .cloned()
        .collect();
    cancel.sort();
    p.cancel = cancel;
    p
}

/// A store write's result, back in the link's loop.
#[derive(Debug)]
pub enum Written {
    /// `WaitArmed` recorded; `active: false` means the wait is no longer wanted.
    Armed { id: String, active: bool },
    /// `WaitDone` recorded (or found already ended): acknowledge it.
    Done { id: String },
    /// The store failed: the link ends, and the agent sends it all again on the next.
    Failed,
}

/// A link's remote-wait state; owned by its loop.
pub struct LinkWaits {
    device: String,
    agent_version: String,
    capabilities: Vec<String>,
    /// What the agent holds, as far as this link knows: the hello's list, plus arms sent,
    /// minus cancels sent and outcomes received.
    held: HashSet<String>,
    /// Armed on this link already (not asked again until the next link).
    asked: HashSet<String>,
    pub changed: watch::Receiver<u64>,
    written_tx: mpsc::UnboundedSender<Written>,
    pub written: mpsc::UnboundedReceiver<Written>,
    /// Store writes in flight; an agent past the bound is breaking the protocol.
    in_flight: usize,
}

impl LinkWaits {
    /// Subscribes to the device's changes first, so nothing committed between this and the
    /// first reconciliation is missed.
    pub fn new(
        state: &AppState,
        device: &str,
        agent_version: &str,
        capabilities: Vec<String>,
        held: Vec<String>,
    ) -> Self {
        let (written_tx, written) = mpsc::unbounded_channel();
        LinkWaits {
            device: device.to_string(),
            agent_version: agent_version.to_string(),
            capabilities,
            held: held.into_iter().collect(),
            asked: HashSet::new(),
            changed: state.store.notifier.subscribe_device(device),
            written_tx,
            written,
            in_flight: 0,
        }
    }

    /// Compares the store with what the agent holds; the frames that send the difference.
    pub(crate) async fn reconcile(&mut self, state: &AppState) -> Result<Vec<HubFrame>, End> {
        self.changed.borrow_and_update();
        let device = self.device.clone();
        let wanted = match state.store.read(move |r| r.device_waits(&device)).await {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(device = %self.device, error = %e, "cannot read the device's remote waits");
                return Err(End::Store);
            }
        };
        let p = plan(
            &wanted,
            &self.held,
            &self.asked,
            &self.capabilities,
            now_ms(),
        );
        if p.unsupported {
            let (d, caps, v) = (
                self.device.clone(),
                self.capabilities.clone(),
                self.agent_version.clone(),
            );
            // Ended in the store; the commit touches the device, so the next pass is clean.
            if let Err(e) = state
                .store
                .exec(move |t| t.device_waits_unsupported(&d, &caps, &v, now_ms()))
                .await
            {
                tracing::error!(device = %self.device, error = %e, "cannot end the remote waits this agent cannot run");
                return Err(End::Store);
            }
        }
        let mut frames = Vec::with_capacity(p.arm.len() + p.cancel.len());
        for (id, spec, timeout_ms, deadline_ms) in p.arm {
            self.held.insert(id.clone());
            self.asked.insert(id.clone());
            tracing::debug!(device = %self.device, wait = %id, "arming a remote wait");
            frames.push(HubFrame::WaitArm {
                wait_id: id,
                spec,
                timeout_ms,
                deadline_ms,
            });
        }
        for id in p.cancel {
            self.held.remove(&id);
            self.asked.remove(&id);
            tracing::debug!(device = %self.device, wait = %id, "cancelling a remote wait");
            frames.push(HubFrame::WaitCancel { wait_id: id });
        }
        Ok(frames)
    }

    /// One more store write whose answer the link waits for; too many is a protocol error.
    fn count_in_flight(&mut self) -> Result<(), End> {
        if self.in_flight >= 2 * MAX_WAITS_PER_DEVICE {
            return Err(End::Protocol(format!(
                "more than {} remote-wait frames unanswered",
                2 * MAX_WAITS_PER_DEVICE
            )));
        }
        self.in_flight += 1;
        Ok(())
    }

    fn spawn_write<F>(&mut self, f: F) -> Result<(), End>
    where
        F: Future<Output = Written> + Send + 'static,
    {
        self.count_in_flight()?;
        let tx = self.written_tx.clone();
        tokio::spawn(async move {
            let _ = tx.send(f.await);
        });
        Ok(())
    }

    /// The agent's `WaitArmed`.
    pub fn armed(
        &mut self,
        state: &AppState,
        id: String,
        captured: String,
        resume: Option<WaitSpec>,
    ) -> Result<(), End> {
        let (st, device) = (state.clone(), self.device.clone());
        self.spawn_write(async move {
            let i = id.clone();
            match st
                .store
                .exec(move |t| t.device_wait_armed(&device, &i, captured, resume, now_ms()))
                .await
            {
                Ok(active) => Written::Armed { id, active },
                Err(e) => {
                    tracing::error!(error = %e, "cannot record a remote wait armed");
                    Written::Failed
                }
            }
        })
    }

    /// The agent's `WaitDone`: the agent no longer holds it armed, whatever the store says.
    /// The outcome goes straight to the store's writer, which may journal it before it
    /// runs; its answer comes back to the link's loop from the writer thread, the moment
    /// the record is durable (no task per outcome, no wake-up of one before the record
    /// is announced).
    pub fn done(
        &mut self,
        state: &AppState,
        id: String,
        end: WaitEnd,
        payload: String,
        message: String,
    ) -> Result<(), End> {
        // The bench (cargo xtask bench waits) times the hub's receipt by this moment. Its
        // record is written after the outcome went to the writer: a write costs tens of
        // microseconds cold, which would otherwise sit on the record's path (only when
        // timing records are on: CORTEX_TIMING_FILE).
        let received_us = timing::on().then(crate::time::now_us);
        self.held.remove(&id);
        self.count_in_flight()?;
        let (device, tx) = (self.device.clone(), self.written_tx.clone());
        let logged_id = received_us.map(|_| id.clone());
        let done = DeviceWaitDone {
            device: device.clone(),
            id: id.clone(),
            end,
            payload,
            message,
            now: now_ms(),
        };
        state.store.device_wait_done_then(done, move |r| {
            let w = match r {
                Ok(DoneOutcome::Recorded(o)) => {
                    // The bench times "exit to the hub's record" to this record (first, so
                    // the log line's cost is not in it).
                    timing::record("remote_wait_recorded", &id, None);
                    tracing::info!(device = %device, wait = %id, outcome = %end.as_str(), result = %o.as_str(), "remote wait ended");
                    Written::Done { id }
                }
                Ok(DoneOutcome::NotActive) => Written::Done { id },
                Err(e) => {
                    tracing::error!(device, error = %e, "cannot record a remote wait's outcome; the link ends so the agent sends it again");
                    Written::Failed
                }
            };
            let _ = tx.send(w);
        });
        if let (Some(us), Some(wait)) = (received_us, logged_id) {
            timing::record("remote_wait_received", &wait, Some(us));
        }
        Ok(())
    }

    /// A store write came back; the frame that answers it, if any.
    pub(crate) fn written(&mut self, w: Written) -> Result<Option<HubFrame>, End> {
        self.in_flight = self.in_flight.saturating_sub(1);
        match w {
            Written::Armed { active: true, .. } => Ok(None),
            Written::Armed { id, active: false } => {
                self.held.remove(&id);
                self.asked.remove(&id);
                Ok(Some(HubFrame::WaitCancel { wait_id: id }))
            }
            Written::Done { id } => Ok(Some(HubFrame::WaitAck { wait_id: id })),
            Written::Failed => Err(End::Store),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, spec: WaitSpec, deadline: u64, phase: Phase) -> DeviceWaitRecord {
        DeviceWaitRecord {
            id: id.into(),
            device: "gpu1".into(),
            spec,
            resume: None,
            created_at: 0,
            deadline,
            phase,
            armed_at: None,
            captured: None,
            loss_reported: None,
        }
    }

    fn pid(p: i32) -> WaitSpec {
        WaitSpec::Pid {
            pid: p,
            start_time: None,
            must_exist: false,
        }
    }

    fn set(ids: &[&str]) -> HashSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    fn all_caps() -> Vec<String> {
        ["spool", "wait-pid", "wait-file", "wait-flock"]
            .map(String::from)
            .to_vec()
    }

    #[test]
    fn arms_what_is_wanted_and_cancels_what_is_not() {
        let wanted = vec![
            rec("a", pid(1), 100, Phase::Pending),
            rec("b", pid(2), 100, Phase::Armed),
            rec("c", pid(3), 100, Phase::Armed),
        ];
        // The agent holds b and x; c it lost (its waits file, say).
        let p = plan(&wanted, &set(&["b", "x"]), &set(&[]), &all_caps(), 40);
        let armed: Vec<&str> = p.arm.iter().map(|a| a.0.as_str()).collect();
        assert_eq!(armed, ["a", "c"]);
        assert_eq!(p.arm[0].2, 60, "the bound left, relative");
        assert_eq!(p.arm[0].3, 100);
        assert_eq!(p.cancel, ["x"]);
        assert!(!p.unsupported);
    }

    #[test]
    fn a_held_wait_never_confirmed_is_asked_once_per_link() {
        let wanted = vec![rec("a", pid(1), 100, Phase::Pending)];
        let p = plan(&wanted, &set(&["a"]), &set(&[]), &all_caps(), 0);
        assert_eq!(p.arm.len(), 1, "asked again so its WaitArmed comes");
        let p = plan(&wanted, &set(&["a"]), &set(&["a"]), &all_caps(), 0);
        assert!(p.arm.is_empty(), "not twice on one link");
    }

    #[test]
    fn the_resume_spec_is_what_goes_out() {
        let mut r = rec("a", pid(7), 100, Phase::Armed);
        r.resume = Some(WaitSpec::Pid {
            pid: 7,
            start_time: Some(4242),
            must_exist: false,
        });
        let p = plan(&[r], &set(&[]), &set(&[]), &all_caps(), 0);
        assert_eq!(
            p.arm[0].1,
            WaitSpec::Pid {
                pid: 7,
                start_time: Some(4242),
                must_exist: false,
            }
        );
    }

    #[test]
    fn past_their_bound_and_unsupported_waits_are_not_sent() {
        let wanted = vec![
            rec("late", pid(1), 10, Phase::Pending),
            rec(
                "file",
                WaitSpec::File {
                    path: "/x".into(),
                    cursor: None,
                    silence_ms: None,
                },
                100,
                Phase::Pending,
            ),
        ];
        let p = plan(
            &wanted,
            &set(&[]),
            &set(&[]),
            &["spool".into(), "wait-pid".into()],
            10,
        );
        assert!(p.arm.is_empty());
        assert!(p.unsupported);
        assert!(p.cancel.is_empty(), "wanted ones are never cancelled");
    }

    #[test]
    fn a_must_exist_pid_wait_goes_only_to_an_agent_that_announces_it() {
        let must = WaitSpec::Pid {
            pid: 7,
            start_time: None,
            must_exist: true,
        };
        let wanted = vec![rec("m", must, 100, Phase::Pending)];
        // An older agent runs pid waits but would ignore must_exist and fire.
        let p = plan(&wanted, &set(&[]), &set(&[]), &all_caps(), 0);
        assert!(p.arm.is_empty() && p.unsupported, "{p:?}");
        let mut caps = all_caps();
        caps.push("wait-pid-must-exist".into());
        let p = plan(&wanted, &set(&[]), &set(&[]), &caps, 0);
        assert_eq!(p.arm.len(), 1);
        assert!(!p.unsupported);
    }
}
