//! Waitpoints: arming one, its views, its consumers.

use serde::{Deserialize, Serialize};

use super::WakeReason;
use crate::signal::SignalStatus;

/// `quorum`: a number, or `"all"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum Quorum {
    Count(u32),
    All(AllMarker),
}

/// The literal string `"all"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum AllMarker {
    All,
}

impl Quorum {
    pub const ALL: Quorum = Quorum::All(AllMarker::All);
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateWaitpoint {
    pub label: String,
    pub intent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quorum: Option<Quorum>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_fast: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_signals: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_hours: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Wake the session (reason `silent`) when no signal, progress included, arrived for
    /// this long (seconds, or like `"20m"`); once per quiet spell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silence_after: Option<crate::waits::DurationValue>,
    /// A monitor's window: reports arriving within it of the first become one wake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coalesce: Option<crate::waits::DurationValue>,
    /// A monitor that starts a fresh session for each wake instead of waking this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawn: Option<SpawnConfig>,
}

/// A monitor's `spawn`: each wake creates a new session with these instructions (the
/// spawning session's runner settings otherwise) and the wake's text as its first message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SpawnConfig {
    pub instructions: String,
    /// The new sessions' title [default: the waitpoint's label and the wake's number].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

/// Ready-to-paste lines for signalling a waitpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct HowToSignal {
    pub env: String,
    pub cli: String,
    pub curl: String,
    pub shell: String,
    pub attach_to_pid: String,
    /// `"shell"` when the waitpoint names a device, otherwise `"cli"`.
    pub recommended: String,
}

/// What every answer about one waitpoint starts with: what it was armed with and its
/// state (`WaitpointCreated`, `WaitpointView`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct WaitpointHead {
    pub id: String,
    pub session: String,
    pub label: String,
    pub intent: String,
    /// `armed`, `resolved`, `expired` or `cancelled`.
    pub state: String,
    pub created_at: u64,
    pub expires_at: u64,
    pub members: Vec<String>,
    pub quorum: u32,
    pub fail_fast: bool,
    pub max_signals: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// `silence_after`, in ms, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silence_after_ms: Option<u64>,
    /// `coalesce`, in ms, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coalesce_ms: Option<u64>,
    /// Each wake starts a new session (`spawn`); a view's `wakes` names them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spawn: bool,
}

/// Answer to `POST /api/sessions/{sid}/waitpoints`: the only time the secret is shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct WaitpointCreated {
    #[serde(flatten)]
    pub head: WaitpointHead,
    pub secret: String,
    pub how_to_signal: HowToSignal,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct SignalView {
    pub status: SignalStatus,
    pub message: Option<String>,
    pub member: Option<String>,
    pub data: Option<String>,
    /// `http`, `spool`, `device:<name>` or `device-wait`.
    pub source: String,
    pub key: Option<String>,
    pub at: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct WakeView {
    pub reason: WakeReason,
    /// When it was delivered, or when it is due if not yet delivered.
    pub at: u64,
    pub delivered: bool,
    /// The session this wake started (a `spawn` monitor's), instead of waking this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawned: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Badges {
    /// The hourly cap is holding a wake back.
    pub wake_limit_reached: bool,
    /// Failed attempts at delivering a due wake (0 when none is failing). Delivery into the
    /// session's log commits with the decision, so only a failing store makes this rise.
    pub delivery_attempts: u32,
    pub wakes_this_hour: u32,
    pub max_wakes_per_hour: u32,
}

/// The longest name a waitpoint's consumer takes (`cortex wait for --consumer NAME`).
pub const MAX_CONSUMER_CHARS: usize = 64;

/// Whether `name` can name a consumer: 1 to [`MAX_CONSUMER_CHARS`] characters of letters,
/// digits, `.`, `_` and `-`. The error says what to write instead.
pub fn check_consumer_name(name: &str) -> Result<(), String> {
    let n = name.chars().count();
    if n == 0 || n > MAX_CONSUMER_CHARS {
        return Err(format!(
            "a consumer's name is 1 to {MAX_CONSUMER_CHARS} characters (this one has {n})"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "a consumer's name takes letters, digits, '.', '_' and '-', not {c:?}"
        ));
    }
    Ok(())
}

/// `GET|PUT /api/waitpoints/{id}/consumers/{name}`: where a named consumer stands in the
/// waitpoint's wakes. `after` is the session event seq of the last wake it took (0: none
/// yet); its next wake is the first after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct ConsumerPosition {
    pub waitpoint: String,
    pub consumer: String,
    pub after: u64,
}

/// `PUT /api/waitpoints/{id}/consumers/{name}`: the consumer took the wake at `after`. A
/// position only moves forward: an older `after` leaves it where it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct ConsumerAdvance {
    pub after: u64,
}

/// `DELETE /api/waitpoints/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct WaitpointCancelled {
    pub id: String,
    /// `cancelled`, or the state it had already ended in (`resolved`, `expired`).
    pub state: String,
    /// False when it had already ended.
    pub cancelled: bool,
}

/// `GET /api/waitpoints/{id}` and each entry of wait_check; never the secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct WaitpointView {
    #[serde(flatten)]
    pub head: WaitpointHead,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<u64>,
    /// When the next `silent` wake is due (armed, and no silent wake since the last
    /// signal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silence_due_at: Option<u64>,
    /// Every signal recorded; `signals` lists at most the latest 1,000 of them.
    pub signal_count: u64,
    pub signals: Vec<SignalView>,
    pub wakes: Vec<WakeView>,
    pub badges: Badges,
    /// How far it got, counted by the one rule every view uses
    /// (`cortex_protocol::progress`); absent from hubs older than it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
}

/// A waitpoint's progress, as every view shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Progress {
    /// Toward the quorum, at most `quorum`: members with a terminal signal (each once) when
    /// it names members, else terminal signals. A monitor counts its current round.
    pub received: u32,
    pub quorum: u32,
    /// Terminal signals (`ok` or `fail`), all told.
    pub reports: u64,
    /// Of those, the `fail` ones.
    pub failed: u64,
    /// `progress` signals (heartbeats): recorded, never counted toward the quorum.
    pub heartbeats: u64,
    /// Wakes that counted toward `max_signals` (neither expiry nor silence does).
    pub wakes: u32,
    pub max_signals: u32,
    /// One line for people: `1/3`, `1/3 (1 failed) +2 progress`; a monitor's
    /// `2/5 wakes, 3 reports (1 failed)`.
    pub summary: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct WaitpointList {
    pub waitpoints: Vec<WaitpointView>,
}
