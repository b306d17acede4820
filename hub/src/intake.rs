//! Where signals come in. A signal arrives four ways: the HTTP route, the hub's own spool,
//! a device's spool file (a `File` frame) and a remote wait's outcome. [`SignalSource`]
//! names the way, and owns what depends on it: the `source` stored with the signal, its
//! dedupe key (the body's `key`, else one made from the file's name or the wait's id),
//! and what the store's outcome becomes for that way in (an HTTP code, a device's ack,
//! the spool file deleted or parked under `bad/` with a reason). A remote wait's outcome
//! becomes its signal here too ([`wait_outcome_signal`]). [`SignalIn`] is what the store
//! is handed and [`SignalOutcome`] what it answers, whatever the way. Also the miss budgets:
//! the signal route's, shared ([`MissBudget`]), and each device's ([`DeviceMisses`]),
//! which also keeps a device's refusal warnings to one line a minute.
//!
//! The strings here are stored: a signal's key must be the same after an upgrade, or a
//! file sent again would count twice. Change none of them.

use std::collections::{HashMap, VecDeque};
use std::fmt::Display;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use cortex_protocol::SignalRequest;
use cortex_protocol::mesh::{FileOutcome, WaitEnd};
use cortex_protocol::signal::{
    ErrorBody, MAX_DATA_CHARS, MAX_MESSAGE_CHARS, SignalAccepted, SignalResult,
};

use crate::engine::{Refusal, State};

/// The device name whose files cannot use the `file:DEVICE:NAME` form: the hub's own
/// spool files are `file:local:NAME`.
pub const LOCAL: &str = "local";

/// How a signal came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalSource<'a> {
    /// `POST /webhook/signal`.
    Http,
    /// A file in the hub's own spool (`$CORTEX_HOME/tmp/signals/`).
    Spool { file: &'a str },
    /// A file from a device's spool, sent over its link.
    DeviceFile { device: &'a str, file: &'a str },
    /// A remote wait's outcome (the wait's id is its waitpoint's).
    DeviceWait { wait: &'a str },
}

/// A signal as the store records it, whatever way it came in (built by
/// [`SignalSource::signal_in`]).
#[derive(Debug, Clone)]
pub struct SignalIn {
    pub req: SignalRequest,
    /// [`SignalSource::source`]: `http`, `spool`, `device:<name>`, `device-wait`.
    pub source: String,
    /// [`SignalSource::dedupe`]: the identity used for de-duplication.
    pub dedupe: Option<String>,
}

/// What the store did with a signal; each way in turns it into its own answer.
#[derive(Debug, Clone, PartialEq)]
pub enum SignalOutcome {
    Accepted { state: State },
    Duplicate { state: State },
    Unknown,
    WrongSecret,
    Refused(Refusal),
}

impl SignalOutcome {
    /// Its name in the hub's log and metrics: `accepted`, `duplicate`, else the route's
    /// error code (`unknown_waitpoint`, `wrong_secret`, `already_resolved`, `bad_member`).
    pub fn as_str(&self) -> &'static str {
        match self {
            SignalOutcome::Accepted { .. } => "accepted",
            SignalOutcome::Duplicate { .. } => "duplicate",
            SignalOutcome::Unknown => "unknown_waitpoint",
            SignalOutcome::WrongSecret => "wrong_secret",
            SignalOutcome::Refused(Refusal::Gone { .. }) => "already_resolved",
            SignalOutcome::Refused(_) => "bad_member",
        }
    }
}

/// What the HTTP route answers.
#[derive(Debug, PartialEq)]
pub enum HttpAnswer {
    /// 202.
    Accepted(SignalAccepted),
    Error(StatusCode, ErrorBody),
}

/// What happens to a file of the hub's own spool.
#[derive(Debug, PartialEq, Eq)]
pub enum SpoolAction {
    /// Taken (recorded, a duplicate, or its waitpoint already resolved).
    Delete,
    /// Refused for good: parked under `bad/` with this reason.
    Park(String),
    /// The store failed: left for the next rescan.
    Keep,
}

impl SignalSource<'_> {
    /// The `source` stored with the signal.
    pub fn source(&self) -> String {
        match self {
            SignalSource::Http => "http".into(),
            SignalSource::Spool { .. } => "spool".into(),
            SignalSource::DeviceFile { device, .. } => format!("device:{device}"),
            SignalSource::DeviceWait { .. } => "device-wait".into(),
        }
    }

    /// The identity the store de-duplicates on: the body's `key` (cortex-signal's, shared
    /// with its HTTP attempt) when it has one, else the file's (device and name) or the
    /// wait's. A device named `local` gets `device-file:local:NAME`, so its files never
    /// meet the hub's own (`file:local:NAME`); every other device keeps
    /// `file:DEVICE:NAME`. A device name has no ':', so no two devices' forms meet.
    pub fn dedupe(&self, req: &SignalRequest) -> Option<String> {
        match self {
            SignalSource::DeviceWait { wait } => Some(wait_key(wait)),
            _ if req.key.is_some() => req.key.clone(),
            SignalSource::Http => None,
            SignalSource::Spool { file } => Some(format!("file:{LOCAL}:{file}")),
            SignalSource::DeviceFile { device, file } if *device == LOCAL => {
                Some(format!("device-file:{LOCAL}:{file}"))
            }
            SignalSource::DeviceFile { device, file } => Some(format!("file:{device}:{file}")),
        }
    }

    /// The store's input for `req` coming in this way.
    pub fn signal_in(&self, req: SignalRequest) -> SignalIn {
        SignalIn {
            dedupe: self.dedupe(&req),
            source: self.source(),
            req,
        }
    }

    /// The HTTP route's answer: the contract's codes. Unknown ids and wrong secrets spend
    /// `misses`; once it is spent they are answered 429.
    pub fn http_answer(
        &self,
        req: &SignalRequest,
        outcome: Result<SignalOutcome, impl Display>,
        misses: &MissBudget,
    ) -> HttpAnswer {
        let error = |status, code: &str, message: String| {
            HttpAnswer::Error(
                status,
                ErrorBody {
                    error: code.to_string(),
                    message,
                    members: None,
                },
            )
        };
        let accepted = |result, st: State| {
            HttpAnswer::Accepted(SignalAccepted {
                result,
                waitpoint: req.id.clone(),
                state: st.as_str().to_string(),
            })
        };
        let via = self.source();
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(error = %e, "store failure");
                return error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    "the hub could not write to its store; nothing was recorded, retry shortly (cortex-signal spools the signal by itself)".into(),
                );
            }
        };
        match outcome {
            SignalOutcome::Accepted { state } => accepted(SignalResult::Accepted, state),
            SignalOutcome::Duplicate { state } => accepted(SignalResult::Duplicate, state),
            SignalOutcome::Unknown | SignalOutcome::WrongSecret => {
                let unknown = matches!(outcome, SignalOutcome::Unknown);
                if !misses.spend(Instant::now()) {
                    return error(
                        StatusCode::TOO_MANY_REQUESTS,
                        "miss_budget_spent",
                        format!(
                            "more than {MISS_BUDGET} unknown ids or wrong secrets in the last minute; check the id and secret your job was given, then retry in a minute"
                        ),
                    );
                }
                if unknown {
                    tracing::warn!(waitpoint = %req.id, via, "signal for an unknown waitpoint id (a typo, or a waitpoint resolved more than 3 days ago)");
                    error(
                        StatusCode::NOT_FOUND,
                        "unknown_waitpoint",
                        format!(
                            "no waitpoint {:?}; check the id (CORTEX_SIGNAL_ID) your job was given; a resolved waitpoint is forgotten after 3 days",
                            req.id
                        ),
                    )
                } else {
                    tracing::warn!(waitpoint = %req.id, via, "signal with a wrong secret");
                    error(
                        StatusCode::UNAUTHORIZED,
                        "wrong_secret",
                        format!(
                            "the secret does not match waitpoint {}; use the secret handed out when it was armed (CORTEX_SIGNAL_SECRET)",
                            req.id
                        ),
                    )
                }
            }
            SignalOutcome::Refused(r) => {
                let msg = r.to_string();
                match r {
                    Refusal::Gone { state, .. } => error(
                        StatusCode::GONE,
                        match state {
                            "expired" => "expired",
                            "cancelled" => "cancelled",
                            _ => "already_resolved",
                        },
                        format!("{msg}; this is not an error for the job"),
                    ),
                    Refusal::MemberMissing { members }
                    | Refusal::MemberUnlisted { members, .. } => {
                        let message = format!("{msg}; expected one of: {}", members.join(", "));
                        HttpAnswer::Error(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            ErrorBody {
                                error: "bad_member".into(),
                                message,
                                members: Some(members),
                            },
                        )
                    }
                }
            }
        }
    }

    /// A device's ack for its file. Past the device's miss budget an unknown id or a wrong
    /// secret is answered `Retry` (the file stays in its spool and comes again later)
    /// instead of `Refused` (parked in `bad/`), and the warnings are one line a minute.
    pub fn file_ack(
        &self,
        req: &SignalRequest,
        outcome: Result<SignalOutcome, impl Display>,
        misses: &DeviceMisses,
    ) -> FileOutcome {
        let (device, file) = match self {
            SignalSource::DeviceFile { device, file } => (*device, *file),
            _ => ("-", "-"),
        };
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(device, file, error = %e, "store failure; the device keeps the file and sends it again");
                return FileOutcome::Retry {
                    reason:
                        "the hub could not write to its store; keep the file and send it again later"
                            .into(),
                };
            }
        };
        match outcome {
            SignalOutcome::Accepted { .. } => FileOutcome::Accepted,
            SignalOutcome::Duplicate { .. } => FileOutcome::Duplicate,
            SignalOutcome::Refused(Refusal::Gone { .. }) => FileOutcome::Resolved,
            o => {
                let miss = matches!(o, SignalOutcome::Unknown | SignalOutcome::WrongSecret);
                let reason = refusal_reason(req, &o).unwrap_or_else(|| "refused".into());
                if !misses.refused(device, file, &req.id, &reason, miss, Instant::now()) {
                    return FileOutcome::Retry {
                        reason: format!(
                            "more than {MISS_BUDGET} unknown ids or wrong secrets from this device in the last minute; the file stays and is sent again later"
                        ),
                    };
                }
                FileOutcome::Refused {
                    reason: cut(&reason, MAX_REASON_CHARS),
                }
            }
        }
    }

    /// What becomes of a file of the hub's own spool.
    pub fn spool_action(
        &self,
        req: &SignalRequest,
        outcome: Result<SignalOutcome, impl Display>,
    ) -> SpoolAction {
        let file = match self {
            SignalSource::Spool { file } => *file,
            _ => "-",
        };
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(file, error = %e, "store failure; the spool file stays for the next rescan");
                return SpoolAction::Keep;
            }
        };
        match refusal_reason(req, &outcome) {
            None => SpoolAction::Delete,
            Some(reason) => {
                tracing::warn!(file, waitpoint = %req.id, reason = %reason, "spool file refused");
                SpoolAction::Park(reason)
            }
        }
    }
}

/// The dedupe key (and the body's `key`) of every outcome of the remote wait `wait`.
fn wait_key(wait: &str) -> String {
    format!("device-wait:{wait}")
}

/// What a remote wait ended with, as its agent or the hub's timer reported it.
#[derive(Debug, Clone, Copy)]
pub struct WaitOutcome<'a> {
    /// The wait's id: its waitpoint's.
    pub wait: &'a str,
    pub device: &'a str,
    /// The wait's kind (`pid`, `file`, `flock`).
    pub kind: &'a str,
    pub end: WaitEnd,
    /// The agent's JSON payload (kept as a string when it is not JSON).
    pub payload: &'a str,
    pub message: &'a str,
}

/// The signal a remote wait's outcome is recorded as ([`SignalSource::DeviceWait`]): `ok`
/// when it fired, `fail` otherwise (`engine::remote::status`); the data is a JSON object
/// `{outcome, device, kind, payload}` (the payload left out, `payload_omitted: true`, if
/// the whole would pass the data cap), the message cut to the message cap. The body's
/// `key` is the dedupe key, so the stored signal shows it.
pub fn wait_outcome_signal(o: &WaitOutcome<'_>) -> SignalIn {
    let payload: serde_json::Value = serde_json::from_str(o.payload)
        .unwrap_or_else(|_| serde_json::Value::String(o.payload.into()));
    let mut data = serde_json::json!({
        "outcome": o.end.as_str(),
        "device": o.device,
        "kind": o.kind,
        "payload": payload,
    });
    let mut text = data.to_string();
    if text.chars().count() > MAX_DATA_CHARS {
        data["payload"] = serde_json::Value::Null;
        data["payload_omitted"] = serde_json::Value::Bool(true);
        text = data.to_string();
    }
    let message: String = o.message.chars().take(MAX_MESSAGE_CHARS).collect();
    SignalSource::DeviceWait { wait: o.wait }.signal_in(SignalRequest {
        id: o.wait.to_string(),
        secret: String::new(),
        status: Some(crate::engine::remote::status(o.end)),
        message: Some(message),
        member: None,
        data: Some(text),
        key: Some(wait_key(o.wait)),
    })
}

/// How long a refusal's reason may be in a device's ack.
pub const MAX_REASON_CHARS: usize = 1_000;

/// `s`, cut to at most `max` characters.
pub fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => s[..i].to_string(),
        None => s.to_string(),
    }
}

/// Unknown ids and wrong secrets share this many misses a minute; then 429.
pub const MISS_BUDGET: usize = 60;
const MISS_WINDOW: Duration = Duration::from_secs(60);

/// The sliding minute of misses.
#[derive(Default)]
pub struct MissBudget {
    times: Mutex<VecDeque<Instant>>,
}

impl MissBudget {
    /// Records a miss; false when the budget was already spent.
    pub fn spend(&self, now: Instant) -> bool {
        let mut t = self.times.lock().unwrap_or_else(|e| e.into_inner());
        while t
            .front()
            .is_some_and(|&f| now.duration_since(f) >= MISS_WINDOW)
        {
            t.pop_front();
        }
        if t.len() >= MISS_BUDGET {
            return false;
        }
        t.push_back(now);
        true
    }
}

/// Why a signal from a file (local or a device's) was refused, in words that tell its
/// writer what to fix; `None` when the file was taken (accepted, duplicate, or its
/// waitpoint already resolved).
fn refusal_reason(req: &SignalRequest, outcome: &SignalOutcome) -> Option<String> {
    match outcome {
        SignalOutcome::Accepted { .. }
        | SignalOutcome::Duplicate { .. }
        | SignalOutcome::Refused(Refusal::Gone { .. }) => None,
        SignalOutcome::Unknown => Some(format!(
            "no waitpoint {:?}: check the id; a resolved waitpoint is forgotten after 3 days",
            req.id
        )),
        SignalOutcome::WrongSecret => Some(format!(
            "wrong secret for waitpoint {}: use the secret handed out when it was armed",
            req.id
        )),
        SignalOutcome::Refused(
            r @ (Refusal::MemberMissing { members } | Refusal::MemberUnlisted { members, .. }),
        ) => Some(format!(
            "{r}; add \"member\":\"NAME\" with one of: {}",
            members.join(", ")
        )),
    }
}

#[cfg(test)]
mod tests;

/// Each device's miss budget (the signal route's numbers, per device: one device's typos
/// never hold back another's files) and the throttle of its refusal warnings: the first
/// refusal in a minute is a line of its own, the ones after it are counted, and the next
/// line (a minute later at the soonest) says how many were kept quiet.
#[derive(Default)]
pub struct DeviceMisses {
    devices: Mutex<HashMap<String, DeviceRefusals>>,
}

#[derive(Default)]
struct DeviceRefusals {
    misses: VecDeque<Instant>,
    /// When the last warning line went out.
    warned: Option<Instant>,
    /// Refusals since that line, not logged; of them, held back past the budget.
    quiet: u64,
    held: u64,
}

/// What one refusal of a device's file comes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// False past the budget: answer `Retry`, not `Refused`.
    pub within_budget: bool,
    pub log: LogLine,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLine {
    /// A warning for this refusal (the first in a minute).
    This,
    /// A warning for this refusal that also counts the quiet ones since the last line.
    Summary { quiet: u64, held: u64 },
    /// Counted, not logged.
    Quiet,
}

impl DeviceMisses {
    /// The rule: records a refusal of `device`'s file (`miss`: an unknown id or a wrong
    /// secret, which spends the budget) and says what it comes to.
    pub fn verdict(&self, device: &str, miss: bool, now: Instant) -> Verdict {
        let mut all = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        if !all.contains_key(device) {
            all.insert(device.to_string(), DeviceRefusals::default());
        }
        let Some(d) = all.get_mut(device) else {
            return Verdict {
                within_budget: true,
                log: LogLine::This,
            };
        };
        let within_budget = if miss {
            while d
                .misses
                .front()
                .is_some_and(|&f| now.duration_since(f) >= MISS_WINDOW)
            {
                d.misses.pop_front();
            }
            let room = d.misses.len() < MISS_BUDGET;
            if room {
                d.misses.push_back(now);
            }
            room
        } else {
            true
        };
        let log = match d.warned {
            Some(t) if now.duration_since(t) < MISS_WINDOW => {
                d.quiet += 1;
                d.held += u64::from(!within_budget);
                LogLine::Quiet
            }
            _ => {
                d.warned = Some(now);
                let (quiet, held) = (std::mem::take(&mut d.quiet), std::mem::take(&mut d.held));
                if quiet == 0 {
                    LogLine::This
                } else {
                    LogLine::Summary { quiet, held }
                }
            }
        };
        Verdict { within_budget, log }
    }

    /// [`DeviceMisses::verdict`], and its warning line if one is due; true while within
    /// the budget.
    pub fn refused(
        &self,
        device: &str,
        file: &str,
        waitpoint: &str,
        reason: &str,
        miss: bool,
        now: Instant,
    ) -> bool {
        let v = self.verdict(device, miss, now);
        let held = !v.within_budget;
        match v.log {
            LogLine::This => {
                tracing::warn!(
                    device,
                    file,
                    waitpoint,
                    reason,
                    held,
                    "device spool file refused"
                );
            }
            LogLine::Summary {
                quiet,
                held: quiet_held,
            } => {
                tracing::warn!(
                    device,
                    file,
                    waitpoint,
                    reason,
                    held,
                    quiet,
                    quiet_held,
                    "device spool file refused; {quiet} more refused since the last line ({quiet_held} held back past the miss budget, kept in the device's spool), one line a minute per device"
                );
            }
            LogLine::Quiet => {}
        }
        v.within_budget
    }
}
