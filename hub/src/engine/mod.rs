//! The waitpoint engine: a pure state machine for the waitpoint rules (members, quorum,
//! fail_fast, monitors, the hourly wake cap, expiry, retention, and the monitors' rules:
//! `silence_after`, `coalesce`, `spawn`); `remote.rs` holds the rules for a remote wait's
//! outcome.
//!
//! It takes an event (create, signal, tick, cancel) and the current time, mutates one
//! [`Waitpoint`] and returns what must happen ([`Effect`]s). It does no I/O, reads no clock
//! and draws no random numbers: the store applies its effects inside one transaction, and
//! every rule (quorum, fail_fast, max_signals, the hourly cap, expiry, retention) is a
//! table-driven test in `tests.rs`.
//!
//! Signals themselves are stored by the caller, numbered by `seq`; the engine keeps only
//! what its rules need (counts, which members reported, which seqs a wake has carried).

use cortex_protocol::SignalStatus;
use cortex_protocol::api::{
    MAX_INSTRUCTIONS_BYTES, MAX_TITLE_CHARS, Quorum, SpawnConfig, WakeReason,
};
use cortex_protocol::waits::{DurationValue, format_duration_ms};
use serde::{Deserialize, Serialize};

pub mod remote;
#[cfg(test)]
mod tests;

pub const HOUR_MS: u64 = 3_600_000;
pub const DAY_MS: u64 = 24 * HOUR_MS;
/// The most members one waitpoint may name.
pub const MAX_MEMBERS: usize = 256;
/// The highest `max_signals` accepted.
pub const MAX_MAX_SIGNALS: u32 = 10_000;
pub const MAX_LABEL_CHARS: usize = 200;
pub const MAX_INTENT_CHARS: usize = 4_000;
pub const MAX_MEMBER_CHARS: usize = 64;
/// The shortest `silence_after`: a quieter spell than this is noise, not news.
pub const MIN_SILENCE_MS: u64 = 1_000;

/// The rules' numbers, from `settings.json` or the environment (`waitpointTtlMs`,
/// `waitpointMaxWakesPerHour`, …; see `config.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Default lifetime (`waitpointTtlMs`, 7 days).
    pub default_ttl_ms: u64,
    /// Hard ceiling on a lifetime (30 days).
    pub max_ttl_ms: u64,
    /// Wakes per waitpoint per sliding hour (`waitpointMaxWakesPerHour`, 12).
    pub max_wakes_per_hour: u32,
    /// The cap's sliding window: an hour (`waitpointWakeWindowMs`; shorter only for tests).
    pub wake_window_ms: u64,
    /// A waitpoint that needs more than one signal wakes this long after it completes.
    pub barrier_delay_ms: u64,
    /// How long an ended waitpoint still answers "already resolved".
    pub retention_ms: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            default_ttl_ms: 7 * DAY_MS,
            max_ttl_ms: 30 * DAY_MS,
            max_wakes_per_hour: 12,
            wake_window_ms: HOUR_MS,
            barrier_delay_ms: 3_000,
            retention_ms: 3 * DAY_MS,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum State {
    Armed,
    Resolved,
    Expired,
    Cancelled,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Armed => "armed",
            State::Resolved => "resolved",
            State::Expired => "expired",
            State::Cancelled => "cancelled",
        }
    }
}

/// `wait_create`'s parameters, already parsed from the wire.
#[derive(Debug, Clone, Default)]
pub struct CreateParams {
    pub label: String,
    pub intent: String,
    pub members: Option<Vec<String>>,
    pub quorum: Option<Quorum>,
    pub fail_fast: Option<bool>,
    pub max_signals: Option<u32>,
    pub expires_in_hours: Option<f64>,
    pub device: Option<String>,
    pub silence_after: Option<DurationValue>,
    pub coalesce: Option<DurationValue>,
    pub spawn: Option<SpawnConfig>,
}

impl From<cortex_protocol::api::CreateWaitpoint> for CreateParams {
    /// The API's body (and the `wait_create` tool's arguments) as the engine's parameters.
    fn from(req: cortex_protocol::api::CreateWaitpoint) -> Self {
        CreateParams {
            label: req.label,
            intent: req.intent,
            members: req.members,
            quorum: req.quorum,
            fail_fast: req.fail_fast,
            max_signals: req.max_signals,
            expires_in_hours: req.expires_in_hours,
            device: req.device,
            silence_after: req.silence_after,
            coalesce: req.coalesce,
            spawn: req.spawn,
        }
    }
}

/// Why `wait_create` refused its parameters. Each message says what to send instead.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CreateError {
    #[error(
        "label is empty; give the waitpoint a short name (at most {MAX_LABEL_CHARS} characters)"
    )]
    EmptyLabel,
    #[error("waitpoint id {0} is taken")]
    Taken(String),
    #[error(
        "label is {0} characters; keep it under {MAX_LABEL_CHARS} and put the detail in intent"
    )]
    LabelTooLong(usize),
    #[error("intent is empty; say what you are waiting for and what you will do when it lands")]
    EmptyIntent,
    #[error("intent is {0} characters; keep it under {MAX_INTENT_CHARS}")]
    IntentTooLong(usize),
    #[error("members is an empty list; leave it out, or name the jobs that will report")]
    NoMembers,
    #[error("{0} members named; at most {MAX_MEMBERS}")]
    TooManyMembers(usize),
    #[error(
        "member name {0:?} is not usable; use 1-{MAX_MEMBER_CHARS} characters of letters, digits, '.', '_', '-', ':' or '/'"
    )]
    BadMember(String),
    #[error("member {0:?} is named twice; every member must be unique")]
    DuplicateMember(String),
    #[error("quorum \"all\" needs members; name them, or leave quorum out")]
    AllWithoutMembers,
    #[error("quorum must be at least 1")]
    ZeroQuorum,
    #[error(
        "quorum {quorum} is more than the {members} members named; use at most {members} or \"all\""
    )]
    QuorumOverMembers { quorum: u32, members: usize },
    #[error("max_signals must be between 1 and {MAX_MAX_SIGNALS}")]
    BadMaxSignals,
    #[error("expires_in_hours must be a number above 0 and at most {max_hours}; got {got}")]
    BadExpiry { got: f64, max_hours: f64 },
    #[error("device name {0:?} is not usable; use the name the device was added with")]
    BadDevice(String),
    /// A duration field that is not one (negative, not a number, an unknown unit).
    #[error("{0}")]
    BadDuration(String),
    #[error(
        "silence_after must be between 1s and the waitpoint's lifetime ({max}); got {got}. Give a duration like \"20m\", or a longer expires_in_hours"
    )]
    BadSilence { got: String, max: String },
    #[error("coalesce must be above 0 and at most the waitpoint's lifetime ({max}); got {got}")]
    BadCoalesce { got: String, max: String },
    #[error(
        "{0} is for monitors only: set max_signals above 1 (a one-shot waitpoint wakes once anyway)"
    )]
    MonitorsOnly(&'static str),
    #[error(
        "spawn.instructions is empty; say what each new session is for (at most {MAX_INSTRUCTIONS_BYTES} bytes)"
    )]
    EmptySpawnInstructions,
    #[error("spawn.title is {0} characters; keep it under {MAX_TITLE_CHARS}")]
    SpawnTitleTooLong(usize),
    /// The caller did not prepare the spawned sessions' configuration (a way in that does
    /// not take `spawn`).
    #[error(
        "spawn is not available here; arm it through POST /api/sessions/{{sid}}/waitpoints or wait_create"
    )]
    SpawnUnprepared,
}

/// A recorded signal, as far as the rules need it.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalMeta<'a> {
    pub status: SignalStatus,
    pub member: Option<&'a str>,
}

/// Why a signal is refused. The hub maps these to 410 and 422.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{}", gone_message(id, state))]
    Gone { id: String, state: &'static str },
    #[error(
        "this waitpoint names its members; say which one you are (--member NAME or \"member\":\"NAME\")"
    )]
    MemberMissing { members: Vec<String> },
    #[error("member {member:?} is not one of this waitpoint's members")]
    MemberUnlisted {
        member: String,
        members: Vec<String>,
    },
}

/// What a signal to an ended waitpoint is told: a late one (the waitpoint expired) or one
/// for a cancelled waitpoint must not read as "done already".
fn gone_message(id: &str, state: &str) -> String {
    match state {
        "expired" => format!(
            "waitpoint {id} expired before this signal came (its deadline passed); the signal was too late and is not counted"
        ),
        "cancelled" => format!("waitpoint {id} was cancelled; the signal is not counted"),
        _ => format!("waitpoint {id} is already {state}; nothing more is counted"),
    }
}

/// Terminal signals since the last wake: what decides the next one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Round {
    /// Terminal signals in this round.
    pub terminal: u32,
    /// Distinct members with a terminal signal in this round.
    pub members: Vec<String>,
    pub failed: bool,
    /// When its first terminal signal came: a coalesce window opens there.
    #[serde(default)]
    pub first_at: Option<u64>,
}

/// A wake that has been decided and not delivered yet: a barrier's 3 s, or the hourly cap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    pub due_at: u64,
    pub decided_at: u64,
    /// The hourly cap is what holds it (the badge).
    pub held_by_cap: bool,
    /// True for a fail that woke under fail_fast.
    pub failed_fast: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WakeRecord {
    pub reason: WakeReason,
    pub at: u64,
    /// Event seq of the wake in the session's log (the spawned session's, with `spawn`).
    pub event_seq: u64,
    /// The session this wake spawned (`spawn`), instead of waking the waitpoint's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawned: Option<String>,
}

/// A monitor's `spawn`, as the engine keeps it: each wake starts a new session. Its
/// configuration (instructions and prefix) is the store's, kept beside the state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpawnRule {
    /// The new sessions' title; the label and the wake's number without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

/// What the expiry notice says: nobody reported, only some members did, or only
/// heartbeats arrived.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ExpiryNotice {
    NobodyReported,
    OnlyHeartbeats {
        count: u64,
    },
    /// With members: who reported and who did not.
    SomeMembers {
        reported: Vec<String>,
        missing: Vec<String>,
        quorum: u32,
    },
    /// Without members: how many terminal signals of the quorum arrived.
    SomeSignals {
        got: u32,
        quorum: u32,
    },
    /// A monitor reached its deadline: how often it woke the session.
    MonitorDeadline {
        wakes: u32,
        max_signals: u32,
    },
}

/// A wake to deliver now: append it to the session's log in the same transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct WakePlan {
    /// Index of this wake in [`Waitpoint::wakes`].
    pub index: usize,
    pub reason: WakeReason,
    /// Signals with `from_seq <= seq < to_seq` are carried by this wake.
    pub from_seq: u64,
    pub to_seq: u64,
    pub waited_ms: u64,
    pub notice: Option<ExpiryNotice>,
    /// A `silent` wake: how long nothing arrived, and the last signal's seq (none since
    /// creation when `None`).
    pub silence: Option<Silence>,
    /// Deliver it as the first message of a new session (`spawn`), not to the waitpoint's.
    pub spawn: bool,
}

/// What a `silent` wake says about the quiet spell.
#[derive(Debug, Clone, PartialEq)]
pub struct Silence {
    /// How long nothing arrived (counted from the last signal, or from creation).
    pub quiet_ms: u64,
    /// The last signal's seq and when it came; `None` when nothing came since creation.
    pub last: Option<(u64, u64)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Deliver this wake now. The caller then calls [`Waitpoint::delivered`].
    Wake(WakePlan),
    /// The retention has passed: forget the waitpoint, its signals and keys.
    Purge,
}

/// One waitpoint's durable state. The secret is kept only as its SHA-256.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Waitpoint {
    pub id: String,
    pub session: String,
    pub label: String,
    pub intent: String,
    pub secret_hash: [u8; 32],
    pub members: Vec<String>,
    pub quorum: u32,
    pub fail_fast: bool,
    pub max_signals: u32,
    pub device: Option<String>,
    pub created_at: u64,
    pub expires_at: u64,
    pub state: State,
    pub ended_at: Option<u64>,
    /// Signals recorded so far; the next one gets this seq.
    pub signal_count: u64,
    /// Signals with seq below this were carried by a delivered wake.
    pub delivered_through: u64,
    pub progress_count: u64,
    /// Members with a terminal signal at any time (for the expiry notice).
    pub ever_reported: Vec<String>,
    pub terminal_count: u64,
    pub round: Round,
    pub wakes: Vec<WakeRecord>,
    pub pending: Option<Pending>,
    /// `silence_after`: a `silent` wake once nothing arrived for this long.
    #[serde(default)]
    pub silence_after_ms: Option<u64>,
    /// When the next `silent` wake is due; `None` once it went out, until a new signal
    /// starts another quiet spell.
    #[serde(default)]
    pub silence_due: Option<u64>,
    /// When the newest signal (of any status) was recorded.
    #[serde(default)]
    pub last_signal_at: Option<u64>,
    /// `coalesce`: a monitor's reports within this long of a round's first are one wake.
    #[serde(default)]
    pub coalesce_ms: Option<u64>,
    /// `spawn`: each wake starts a new session.
    #[serde(default)]
    pub spawn: Option<SpawnRule>,
    /// Terminal signals that said `fail` (0 in a state written before it was counted).
    #[serde(default)]
    pub fail_count: u64,
}

fn valid_member(m: &str) -> bool {
    !m.is_empty()
        && m.chars().count() <= MAX_MEMBER_CHARS
        && m.chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '/'))
}

impl Waitpoint {
    /// `wait_create`: validates the parameters and returns an armed waitpoint.
    pub fn create(
        id: String,
        session: String,
        secret_hash: [u8; 32],
        p: CreateParams,
        settings: &Settings,
        now: u64,
    ) -> Result<Waitpoint, CreateError> {
        let label = p.label.trim().to_string();
        if label.is_empty() {
            return Err(CreateError::EmptyLabel);
        }
        let n = label.chars().count();
        if n > MAX_LABEL_CHARS {
            return Err(CreateError::LabelTooLong(n));
        }
        let intent = p.intent.trim().to_string();
        if intent.is_empty() {
            return Err(CreateError::EmptyIntent);
        }
        let n = intent.chars().count();
        if n > MAX_INTENT_CHARS {
            return Err(CreateError::IntentTooLong(n));
        }
        let members = match p.members {
            None => Vec::new(),
            Some(list) => {
                if list.is_empty() {
                    return Err(CreateError::NoMembers);
                }
                if list.len() > MAX_MEMBERS {
                    return Err(CreateError::TooManyMembers(list.len()));
                }
                let mut seen: Vec<String> = Vec::with_capacity(list.len());
                for m in list {
                    if !valid_member(&m) {
                        return Err(CreateError::BadMember(m));
                    }
                    if seen.contains(&m) {
                        return Err(CreateError::DuplicateMember(m));
                    }
                    seen.push(m);
                }
                seen
            }
        };
        let quorum = match (p.quorum, members.is_empty()) {
            (None, true) => 1,
            (None, false) | (Some(Quorum::All(_)), false) => members.len() as u32,
            (Some(Quorum::All(_)), true) => return Err(CreateError::AllWithoutMembers),
            (Some(Quorum::Count(0)), _) => return Err(CreateError::ZeroQuorum),
            (Some(Quorum::Count(q)), false) if q as usize > members.len() => {
                return Err(CreateError::QuorumOverMembers {
                    quorum: q,
                    members: members.len(),
                });
            }
            (Some(Quorum::Count(q)), _) => q.min(MAX_MAX_SIGNALS),
        };
        let max_signals = p.max_signals.unwrap_or(1);
        if max_signals == 0 || max_signals > MAX_MAX_SIGNALS {
            return Err(CreateError::BadMaxSignals);
        }
        let max_hours = settings.max_ttl_ms as f64 / HOUR_MS as f64;
        let ttl_ms = match p.expires_in_hours {
            None => settings.default_ttl_ms.min(settings.max_ttl_ms),
            Some(h) => {
                if !h.is_finite() || h <= 0.0 || h > max_hours {
                    return Err(CreateError::BadExpiry { got: h, max_hours });
                }
                ((h * HOUR_MS as f64).round() as u64).max(1)
            }
        };
        let device = match p.device {
            Some(d) if !valid_member(&d) => return Err(CreateError::BadDevice(d)),
            d => d,
        };
        let duration = |v: &DurationValue, field: &str| {
            v.to_ms(field)
                .map_err(|e| CreateError::BadDuration(e.to_string()))
        };
        let silence_after_ms = match &p.silence_after {
            None => None,
            Some(v) => {
                let ms = duration(v, "silence_after")?;
                if !(MIN_SILENCE_MS..=ttl_ms).contains(&ms) {
                    return Err(CreateError::BadSilence {
                        got: format_duration_ms(ms),
                        max: format_duration_ms(ttl_ms),
                    });
                }
                Some(ms)
            }
        };
        let coalesce_ms = match &p.coalesce {
            None => None,
            Some(v) => {
                let ms = duration(v, "coalesce")?;
                if ms == 0 || ms > ttl_ms {
                    return Err(CreateError::BadCoalesce {
                        got: format_duration_ms(ms),
                        max: format_duration_ms(ttl_ms),
                    });
                }
                if max_signals <= 1 {
                    return Err(CreateError::MonitorsOnly("coalesce"));
                }
                Some(ms)
            }
        };
        let spawn = match p.spawn {
            None => None,
            Some(s) => {
                if max_signals <= 1 {
                    return Err(CreateError::MonitorsOnly("spawn"));
                }
                if s.instructions.trim().is_empty() {
                    return Err(CreateError::EmptySpawnInstructions);
                }
                let title = s
                    .title
                    .map(|t| t.trim().to_string())
                    .filter(|t| !t.is_empty());
                if let Some(t) = &title {
                    let n = t.chars().count();
                    if n > MAX_TITLE_CHARS {
                        return Err(CreateError::SpawnTitleTooLong(n));
                    }
                }
                Some(SpawnRule { title })
            }
        };
        Ok(Waitpoint {
            id,
            session,
            label,
            intent,
            secret_hash,
            members,
            quorum,
            fail_fast: p.fail_fast.unwrap_or(true),
            max_signals,
            device,
            created_at: now,
            expires_at: now.saturating_add(ttl_ms),
            state: State::Armed,
            ended_at: None,
            signal_count: 0,
            delivered_through: 0,
            progress_count: 0,
            ever_reported: Vec::new(),
            terminal_count: 0,
            round: Round::default(),
            wakes: Vec::new(),
            pending: None,
            silence_after_ms,
            silence_due: silence_after_ms.map(|ms| now.saturating_add(ms)),
            last_signal_at: None,
            coalesce_ms,
            spawn,
            fail_count: 0,
        })
    }

    pub fn is_monitor(&self) -> bool {
        self.max_signals > 1
    }

    /// Wakes that count toward `max_signals` and the hourly cap: neither the deadline's
    /// notice nor a `silent` wake does.
    fn counts(reason: WakeReason) -> bool {
        !matches!(reason, WakeReason::Expired | WakeReason::Silent)
    }

    /// Reports delivered so far (the wakes that count toward `max_signals`).
    pub fn reports_delivered(&self) -> u32 {
        self.wakes.iter().filter(|w| Self::counts(w.reason)).count() as u32
    }

    /// What its progress is counted from (`cortex_protocol::progress`, the one rule every
    /// view uses): a barrier counts each member once, a one-shot all its signals (its
    /// round ends only with it), a monitor its current round.
    pub fn progress_facts(&self) -> cortex_protocol::progress::Facts {
        let counted = match (self.is_monitor(), self.members.is_empty()) {
            (true, true) => u64::from(self.round.terminal),
            (true, false) => self.round.members.len() as u64,
            (false, true) => self.terminal_count,
            (false, false) => self.ever_reported.len() as u64,
        };
        cortex_protocol::progress::Facts {
            quorum: self.quorum,
            max_signals: self.max_signals,
            counted,
            reports: self.terminal_count,
            failed: self.fail_count,
            heartbeats: self.progress_count,
            wakes: self.reports_delivered(),
        }
    }

    /// Wakes decided so far (delivered, or pending) that count toward `max_signals`.
    fn wakes_decided(&self) -> u32 {
        self.reports_delivered() + u32::from(self.pending.is_some())
    }

    /// Wakes delivered in the trailing hour (the cap's window).
    pub fn wakes_in_hour(&self, now: u64, settings: &Settings) -> u32 {
        let since = now.saturating_sub(settings.wake_window_ms);
        self.wakes
            .iter()
            .filter(|w| w.at > since && Self::counts(w.reason))
            .count() as u32
    }

    /// When the trailing hour next has room, if it is full now.
    fn cap_room_at(&self, now: u64, settings: &Settings) -> Option<u64> {
        let cap = settings.max_wakes_per_hour.max(1) as usize;
        let window = settings.wake_window_ms;
        let since = now.saturating_sub(window);
        let recent: Vec<u64> = self
            .wakes
            .iter()
            .filter(|w| w.at > since && Self::counts(w.reason))
            .map(|w| w.at)
            .collect();
        if recent.len() < cap {
            return None;
        }
        // The (len - cap + 1)-th oldest recent wake must leave the hour first.
        recent.get(recent.len() - cap).map(|t| t + window)
    }

    /// The time the sweep must look at this waitpoint: its deadline while armed, the end
    /// of its retention once ended.
    pub fn deadline(&self, settings: &Settings) -> u64 {
        match self.ended_at {
            Some(t) if self.state != State::Armed => t.saturating_add(settings.retention_ms),
            _ => self.expires_at,
        }
    }

    /// A precise timer: when a decided wake falls due, or the silence does, whichever
    /// comes first.
    pub fn timer(&self) -> Option<u64> {
        if self.state != State::Armed {
            return None;
        }
        let pending = self.pending.as_ref().map(|p| p.due_at);
        match (pending, self.silence_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When the store must next run this waitpoint's rules: its [`Self::timer`], or its
    /// expiry, whichever comes first. Expiry is a timer like the others, so a waitpoint
    /// expires at its deadline, not at the next sweep.
    pub fn next_due(&self) -> Option<u64> {
        if self.state != State::Armed {
            return None;
        }
        Some(
            self.timer()
                .map_or(self.expires_at, |t| t.min(self.expires_at)),
        )
    }

    /// When the next `silent` wake is due, while armed.
    pub fn silence_due_at(&self) -> Option<u64> {
        if self.state == State::Armed {
            self.silence_due
        } else {
            None
        }
    }

    /// Checks a signal against the rules and records it. Returns the wakes due now.
    /// The caller stores the signal under seq `self.signal_count - 1` on success.
    pub fn signal(
        &mut self,
        sig: SignalMeta<'_>,
        settings: &Settings,
        now: u64,
    ) -> Result<Vec<Effect>, Refusal> {
        if self.state != State::Armed {
            return Err(Refusal::Gone {
                id: self.id.clone(),
                state: self.state.as_str(),
            });
        }
        if !self.members.is_empty() {
            match sig.member {
                None => {
                    return Err(Refusal::MemberMissing {
                        members: self.members.clone(),
                    });
                }
                Some(m) if !self.members.iter().any(|x| x == m) => {
                    return Err(Refusal::MemberUnlisted {
                        member: m.to_string(),
                        members: self.members.clone(),
                    });
                }
                Some(_) => {}
            }
        }
        self.signal_count += 1;
        // Any signal, progress included, ends a quiet spell and starts the next one.
        self.last_signal_at = Some(now);
        if let Some(ms) = self.silence_after_ms {
            self.silence_due = Some(now.saturating_add(ms));
        }
        if !sig.status.is_terminal() {
            self.progress_count += 1;
            return Ok(Vec::new());
        }
        self.terminal_count += 1;
        if sig.status == SignalStatus::Fail {
            self.fail_count += 1;
        }
        if let Some(m) = sig.member
            && !self.ever_reported.iter().any(|x| x == m)
        {
            self.ever_reported.push(m.to_string());
        }
        let last_decided = self.wakes_decided() >= self.max_signals;
        // fail_fast: a failure does not wait out the barrier's delay of the last wake, nor
        // a coalesce window (the cap still holds what it holds).
        if (last_decided || self.coalesce_ms.is_some())
            && sig.status == SignalStatus::Fail
            && self.fail_fast
            && let Some(p) = &mut self.pending
            && !p.held_by_cap
            && p.due_at > now
        {
            p.due_at = now;
            p.failed_fast = true;
            self.round.failed = true;
            if !last_decided {
                self.count_in_round(sig.member);
            }
            return Ok(self.tick(settings, now));
        }
        if last_decided {
            // The last wake is already decided and will carry this signal.
            self.round.failed |= sig.status == SignalStatus::Fail;
            return Ok(Vec::new());
        }
        self.count_in_round(sig.member);
        self.round.failed |= sig.status == SignalStatus::Fail;
        self.round.first_at.get_or_insert(now);
        if self.pending.is_some() {
            // Held by the cap, or inside a coalesce window: folded into that wake.
            return Ok(Vec::new());
        }
        let met = if self.members.is_empty() {
            self.round.terminal >= self.quorum
        } else {
            self.round.members.len() as u32 >= self.quorum
        };
        let fail_now = sig.status == SignalStatus::Fail && self.fail_fast;
        if !met && !fail_now {
            return Ok(Vec::new());
        }
        let delay = if fail_now || self.quorum <= 1 {
            0
        } else {
            settings.barrier_delay_ms
        };
        let mut due_at = now.saturating_add(delay);
        if let (Some(window), false) = (self.coalesce_ms, fail_now) {
            // The window is fixed from the round's first report: bounded latency, however
            // the burst goes on.
            let first = self.round.first_at.unwrap_or(now);
            due_at = due_at.max(first.saturating_add(window));
        }
        self.pending = Some(Pending {
            due_at,
            decided_at: now,
            held_by_cap: false,
            failed_fast: fail_now,
        });
        Ok(self.tick(settings, now))
    }

    /// Counts a terminal signal in the current round.
    fn count_in_round(&mut self, member: Option<&str>) {
        self.round.terminal += 1;
        if let Some(m) = member
            && !self.round.members.iter().any(|x| x == m)
        {
            self.round.members.push(m.to_string());
        }
    }

    /// Advances time: delivers a due wake (or holds it for the cap), expires at the
    /// deadline, and purges after the retention.
    pub fn tick(&mut self, settings: &Settings, now: u64) -> Vec<Effect> {
        let mut out = Vec::new();
        if self.state != State::Armed {
            if now >= self.deadline(settings) {
                out.push(Effect::Purge);
            }
            return out;
        }
        let expiring = now >= self.expires_at;
        if let Some(p) = self.pending.clone() {
            // At the deadline a one-shot's decided wake still resolves it; a monitor's
            // unheard reports ride on its deadline notice instead.
            let deliver = if expiring {
                !self.is_monitor()
            } else {
                p.due_at <= now
            };
            if deliver {
                // The final word goes out past the cap.
                let hold = if expiring {
                    None
                } else {
                    self.cap_room_at(now, settings)
                };
                match hold {
                    Some(room) => {
                        if let Some(p) = &mut self.pending {
                            p.due_at = room;
                            p.held_by_cap = true;
                        }
                    }
                    None => {
                        let reason = if self.round.failed {
                            WakeReason::Failed
                        } else if self.is_monitor() {
                            WakeReason::Report
                        } else {
                            WakeReason::Fired
                        };
                        out.push(Effect::Wake(WakePlan {
                            index: self.wakes.len(),
                            reason,
                            from_seq: self.delivered_through,
                            to_seq: self.signal_count,
                            waited_ms: now.saturating_sub(self.created_at),
                            notice: None,
                            silence: None,
                            spawn: self.spawn.is_some(),
                        }));
                        self.pending = None;
                        self.round = Round::default();
                        self.delivered_through = self.signal_count;
                        self.wakes.push(WakeRecord {
                            reason,
                            at: now,
                            event_seq: 0,
                            spawned: None,
                        });
                        if self.reports_delivered() >= self.max_signals {
                            self.state = State::Resolved;
                            self.ended_at = Some(now);
                            return out;
                        }
                    }
                }
            }
        }
        if expiring {
            let notice = self.expiry_notice();
            out.push(Effect::Wake(WakePlan {
                index: self.wakes.len(),
                reason: WakeReason::Expired,
                from_seq: self.delivered_through,
                to_seq: self.signal_count,
                waited_ms: now.saturating_sub(self.created_at),
                notice: Some(notice),
                silence: None,
                spawn: self.spawn.is_some(),
            }));
            self.pending = None;
            self.delivered_through = self.signal_count;
            self.wakes.push(WakeRecord {
                reason: WakeReason::Expired,
                at: now,
                event_seq: 0,
                spawned: None,
            });
            self.state = State::Expired;
            self.ended_at = Some(now);
            return out;
        }
        if let Some(due) = self.silence_due
            && due <= now
        {
            // Once per quiet spell: the next one needs a new signal first. It carries no
            // signal, counts toward nothing and leaves the waitpoint as it was.
            self.silence_due = None;
            let since = self.last_signal_at.unwrap_or(self.created_at);
            out.push(Effect::Wake(WakePlan {
                index: self.wakes.len(),
                reason: WakeReason::Silent,
                from_seq: self.signal_count,
                to_seq: self.signal_count,
                waited_ms: now.saturating_sub(self.created_at),
                notice: None,
                silence: Some(Silence {
                    quiet_ms: now.saturating_sub(since),
                    last: self
                        .last_signal_at
                        .filter(|_| self.signal_count > 0)
                        .map(|at| (self.signal_count - 1, at)),
                }),
                spawn: self.spawn.is_some(),
            }));
            self.wakes.push(WakeRecord {
                reason: WakeReason::Silent,
                at: now,
                event_seq: 0,
                spawned: None,
            });
        }
        out
    }

    fn expiry_notice(&self) -> ExpiryNotice {
        if self.is_monitor() {
            return ExpiryNotice::MonitorDeadline {
                wakes: self.reports_delivered(),
                max_signals: self.max_signals,
            };
        }
        if self.terminal_count == 0 {
            if self.progress_count == 0 {
                return ExpiryNotice::NobodyReported;
            }
            return ExpiryNotice::OnlyHeartbeats {
                count: self.progress_count,
            };
        }
        if self.members.is_empty() {
            return ExpiryNotice::SomeSignals {
                got: self.round.terminal,
                quorum: self.quorum,
            };
        }
        let missing = self
            .members
            .iter()
            .filter(|m| !self.round.members.contains(m))
            .cloned()
            .collect();
        ExpiryNotice::SomeMembers {
            reported: self.round.members.clone(),
            missing,
            quorum: self.quorum,
        }
    }

    /// Records the event seq the store gave the wake it just appended, and the session it
    /// spawned for it, if it did.
    pub fn delivered(&mut self, index: usize, event_seq: u64, spawned: Option<String>) {
        if let Some(w) = self.wakes.get_mut(index) {
            w.event_seq = event_seq;
            w.spawned = spawned;
        }
    }

    /// wait_cancel / session deletion. Returns false when it had already ended.
    pub fn cancel(&mut self, now: u64) -> bool {
        if self.state != State::Armed {
            return false;
        }
        self.state = State::Cancelled;
        self.ended_at = Some(now);
        self.pending = None;
        self.silence_due = None;
        true
    }

    /// Whether a wake is decided and waiting (barrier delay or the cap).
    pub fn wake_pending(&self) -> Option<&Pending> {
        if self.state == State::Armed {
            self.pending.as_ref()
        } else {
            None
        }
    }
}
