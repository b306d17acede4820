//! Starting a command on a device: [`exec`] sends one `HubFrame::Exec` over the device's
//! live link and waits, bounded, for the agent's `ExecStarted` or `ExecRefused`.
//!
//! Not durable by itself: nothing is stored here. The caller makes a start durable by
//! choosing the `exec_id` before asking and asking again with the same id after a hub
//! restart, a timeout or a lost link: the agent records every run under its id and answers
//! a second ask with the same run (`already: true`) instead of starting another.
//!
//! The waiter for the answer lives on the link (`registry::Requests`), is registered
//! before the frame is queued (so the answer cannot outrun it) and is removed however the
//! call ends: answered, timed out, the link ended, or the caller's future dropped.
//!
//! On a shared store the device's link may be another hub's: the request then goes as an
//! ask through the store (`store::exec_asks`), sealed (its environment may carry a
//! secret), that hub starts it over its link ([`serve_ask`]) and writes the answer, and
//! this hub reads it. An ask unanswered within the request's timeout (and a little for
//! the relay) is "state unknown", as a device that did not answer.

use std::time::Duration;

use cortex_protocol::mesh::{AgentFrame, CAP_EXEC, ExecRequest, Frame, FrameError, HubFrame};
use tokio::time::Instant;

use crate::registry::{Link, Registry};
use crate::state::AppState;
use crate::store::exec_asks::{ExecAsk, TOPIC_EXEC_ANSWER};

#[cfg(test)]
mod tests;

/// What the key sealing asks through the store is derived for.
pub const ASK_KEY: &str = "exec-asks";
/// Time for an ask to reach the holding hub and its answer to come back, beyond the
/// request's own timeout.
const RELAY_SLACK: Duration = Duration::from_secs(3);
/// How often the asker reads an ask's answer when no notice came.
const RELAY_POLL: Duration = Duration::from_secs(1);

/// The device's answer: the command runs (or ran) as `pid`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExecStarted {
    pub pid: i32,
    /// Field 22 of `/proc/PID/stat`: pin a pid wait to it (`WaitSpec::Pid`'s
    /// `start_time`).
    pub start_time: u64,
    /// The absolute path of the run's log (stdout and stderr) on the device.
    pub log: String,
    /// This id had been started before: this is that run, nothing new was started.
    pub already: bool,
}

/// Why nothing is known to have started; the text is what a model reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ExecError {
    #[error("no device named {device} is enrolled")]
    NoDevice { device: String },
    #[error("device {device} is offline; nothing was started")]
    Offline { device: String },
    #[error("device {device} does not allow exec; its agent runs without --allow-exec")]
    NotAllowed { device: String },
    /// The agent refused: nothing was started (or, for a run its agent stopped while
    /// starting, the reason says its state is unknown).
    #[error("device {device} refused: {reason}")]
    Refused { device: String, reason: String },
    #[error(
        "state unknown, exec id {exec_id}: no answer from device {device} within {}; the command may be running: do not start it again",
        secs(*.timeout)
    )]
    TimedOut {
        device: String,
        exec_id: String,
        timeout: Duration,
    },
    #[error(
        "state unknown, exec id {exec_id}: the link to device {device} dropped before it answered; the command may be running: do not start it again"
    )]
    LinkLost { device: String, exec_id: String },
    /// Asked before (by a hub that stopped, or on a link that dropped) and not answered
    /// since: the command may be running; only the device can say.
    #[error(
        "state unknown, exec id {exec_id}: {why}; the command may be running on device {device}: do not start it again"
    )]
    Unknown {
        device: String,
        exec_id: String,
        why: String,
    },
    #[error(
        "the command is too large to send to device {device} ({bytes} bytes, at most {max}); pass long inputs in a file; nothing was started"
    )]
    TooLarge {
        device: String,
        bytes: usize,
        max: usize,
    },
}

impl ExecError {
    /// This error for a request asked before under the same `exec_id` (whose first ask may
    /// have reached the device): what says "nothing was started" of this ask alone says
    /// "state unknown" of the run.
    pub fn reasked(self, exec_id: &str) -> ExecError {
        let why = match &self {
            ExecError::Offline { device } => format!("device {device} is offline"),
            ExecError::NotAllowed { device } => {
                format!("device {device}'s agent now runs without --allow-exec")
            }
            ExecError::NoDevice { device } => format!("device {device} is no longer enrolled"),
            _ => return self,
        };
        let device = match self {
            ExecError::Offline { device }
            | ExecError::NotAllowed { device }
            | ExecError::NoDevice { device } => device,
            other => return other,
        };
        ExecError::Unknown {
            device,
            exec_id: exec_id.to_owned(),
            why,
        }
    }
}

/// `15 s`, `0.5 s`.
pub fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.1} s")
    }
}

/// Starts `req` on `device` through its live link and waits for the answer, at most
/// `req.timeout()`. See the module docs for what the caller owns.
pub async fn exec(
    state: &AppState,
    device: &str,
    req: ExecRequest,
) -> Result<ExecStarted, ExecError> {
    if state.devices.link(device).is_none()
        && let Some(holder) = holder_elsewhere(state, device).await
    {
        return relay(state, device, &holder, req).await;
    }
    exec_on(&state.devices, device, req).await
}

/// Waits until `device` is linked to this hub or, on a shared store, to another one
/// (looked up in the store each [`RELAY_POLL`]), at most until `until`; whether it is.
/// What [`exec`] then asks goes over the link, wherever it is.
pub async fn wait_linked(state: &AppState, device: &str, until: tokio::time::Instant) -> bool {
    loop {
        if state.devices.link(device).is_some() || holder_elsewhere(state, device).await.is_some() {
            return true;
        }
        let now = tokio::time::Instant::now();
        if now >= until {
            return false;
        }
        let step = if state.store.is_shared() {
            until.min(now + RELAY_POLL)
        } else {
            until
        };
        if state.devices.wait_link(device, step).await.is_some() {
            return true;
        }
    }
}

/// On a shared store: the hub that holds `device`'s link, when it is another.
async fn holder_elsewhere(state: &AppState, device: &str) -> Option<String> {
    if !state.store.is_shared() {
        return None;
    }
    let d = device.to_string();
    let rec = state.store.read(move |r| r.get_device(&d)).await.ok()??;
    rec.link?;
    rec.hub.filter(|h| *h != state.claims.hub)
}

/// Asks `holder` to start `req` on `device` over its link, through the store, and waits
/// for its answer (see the module docs).
async fn relay(
    state: &AppState,
    device: &str,
    holder: &str,
    req: ExecRequest,
) -> Result<ExecStarted, ExecError> {
    let exec_id = req.exec_id.clone();
    let timeout = req.timeout();
    let deadline = Instant::now() + timeout + RELAY_SLACK;
    let store_failed = |e: &dyn std::fmt::Display| ExecError::Unknown {
        device: device.to_owned(),
        exec_id: exec_id.clone(),
        why: format!("the ask to the hub holding its link could not be stored ({e})"),
    };
    let plain = serde_json::to_vec(&req).map_err(|e| store_failed(&e))?;
    let ask = ExecAsk {
        device: device.to_owned(),
        holder: holder.to_owned(),
        request: crate::secret::seal(&state.exec_key, exec_id.as_bytes(), &plain),
        asked_at: crate::time::now_ms(),
        taken: false,
        answer: None,
    };
    // Heard before it is asked, so the answer cannot come unheard.
    let mut told = state.store.notifier.watch(TOPIC_EXEC_ANSWER, &exec_id, 0);
    let id = exec_id.clone();
    state
        .store
        .exec(move |t| t.ask_exec(&id, &ask))
        .await
        .map_err(|e| store_failed(&e))?;
    crate::metrics::metrics().exec_relayed();
    tracing::info!(
        device,
        hub = holder,
        exec_id,
        "device_exec asked of the hub holding the device's link"
    );
    let answer = loop {
        let id = exec_id.clone();
        if let Ok(Some(a)) = state.store.read(move |r| r.exec_answer(&id)).await {
            break Some(a);
        }
        let now = Instant::now();
        if now >= deadline {
            break None;
        }
        let _ = tokio::time::timeout_at(deadline.min(now + RELAY_POLL), told.changed()).await;
    };
    let id = exec_id.clone();
    // Answered or given up on, the ask goes (an answer that came meanwhile is taken).
    let last = state.store.exec(move |t| t.forget_exec_ask(&id)).await;
    let answer = answer.or_else(|| last.ok().flatten());
    match answer {
        Some(a) => {
            serde_json::from_slice::<Result<ExecStarted, ExecError>>(&a).unwrap_or_else(|e| {
                Err(ExecError::Unknown {
                    device: device.to_owned(),
                    exec_id: exec_id.clone(),
                    why: format!("the answer of the hub holding its link is unreadable ({e})"),
                })
            })
        }
        None => Err(ExecError::TimedOut {
            device: device.to_owned(),
            exec_id,
            timeout: timeout + RELAY_SLACK,
        }),
    }
}

/// Starts an ask another hub wrote for this one (its device's link is here) and writes
/// the answer for the asker.
pub async fn serve_ask(state: &AppState, exec_id: String, ask: ExecAsk) {
    let plain = crate::secret::open(&state.exec_key, exec_id.as_bytes(), &ask.request);
    let req = plain.and_then(|p| serde_json::from_slice::<ExecRequest>(&p).ok());
    let outcome = match req {
        Some(req) if req.exec_id == exec_id => exec_on(&state.devices, &ask.device, req).await,
        _ => Err(ExecError::Refused {
            device: ask.device.clone(),
            reason: "the ask could not be opened by the hub holding the device's link (do the hubs share one operator token?); nothing was started".into(),
        }),
    };
    crate::metrics::metrics().exec_served();
    let answer = match serde_json::to_vec(&outcome) {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, exec_id, "cannot encode a device_exec answer for another hub");
            return;
        }
    };
    let id = exec_id.clone();
    if let Err(e) = state
        .store
        .exec(move |t| t.answer_exec_ask(&id, answer))
        .await
    {
        tracing::warn!(error = %e, exec_id, "cannot record a device_exec answer for another hub; it reads as state unknown there");
    }
}

/// [`exec`] against a registry (what it needs of the hub's state).
pub async fn exec_on(
    registry: &Registry,
    device: &str,
    req: ExecRequest,
) -> Result<ExecStarted, ExecError> {
    let timeout = req.timeout();
    let deadline = Instant::now() + timeout;
    let Some(link) = registry.link(device) else {
        return Err(if registry.knows(device) {
            ExecError::Offline {
                device: device.to_owned(),
            }
        } else {
            ExecError::NoDevice {
                device: device.to_owned(),
            }
        });
    };
    if !link.capabilities.iter().any(|c| c == CAP_EXEC) {
        return Err(ExecError::NotAllowed {
            device: device.to_owned(),
        });
    }
    let exec_id = req.exec_id.clone();
    let frame = HubFrame::Exec(req);
    // Checked here, where the caller hears why; the link's loop encodes it again.
    if let Err(FrameError::TooLarge { bytes, max }) = frame.encode() {
        return Err(ExecError::TooLarge {
            device: device.to_owned(),
            bytes,
            max,
        });
    }
    let lost = || ExecError::LinkLost {
        device: device.to_owned(),
        exec_id: exec_id.clone(),
    };
    let timed_out = || ExecError::TimedOut {
        device: device.to_owned(),
        exec_id: exec_id.clone(),
        timeout,
    };
    let Some(mut waiter) = Waiter::new(&link, &exec_id) else {
        // The link ended between the lookup and now: the frame never went.
        return Err(ExecError::Offline {
            device: device.to_owned(),
        });
    };
    match tokio::time::timeout_at(deadline, link.requests.sender().send(frame)).await {
        Ok(Ok(())) => {}
        // The link's loop is gone: the frame was not taken.
        Ok(Err(_)) => {
            return Err(ExecError::Offline {
                device: device.to_owned(),
            });
        }
        Err(_) => return Err(timed_out()),
    }
    let answer = match tokio::time::timeout_at(deadline, &mut waiter.answer).await {
        Ok(Ok(a)) => a,
        Ok(Err(_)) => return Err(lost()),
        Err(_) => return Err(timed_out()),
    };
    match answer {
        AgentFrame::ExecStarted {
            pid,
            start_time,
            log,
            already,
            ..
        } => Ok(ExecStarted {
            pid,
            start_time,
            log,
            already,
        }),
        AgentFrame::ExecRefused { reason, .. } => Err(ExecError::Refused {
            device: device.to_owned(),
            reason,
        }),
        // `Requests::answer` is only called with the two exec answers.
        _ => Err(lost()),
    }
}

/// One waiter on a link, removed when dropped.
struct Waiter<'a> {
    link: &'a Link,
    id: &'a str,
    ticket: u64,
    answer: tokio::sync::oneshot::Receiver<AgentFrame>,
}

impl<'a> Waiter<'a> {
    fn new(link: &'a Link, id: &'a str) -> Option<Self> {
        let (ticket, answer) = link.requests.expect(id)?;
        Some(Waiter {
            link,
            id,
            ticket,
            answer,
        })
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.link.requests.forget(self.id, self.ticket);
    }
}
