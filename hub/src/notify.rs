//! Outgoing notices, pure: settings.json `notify` (the targets: a generic webhook, Slack's
//! incoming webhook, an ntfy topic, each with the events it wants), the notice an event
//! becomes (what asks a person: an approval, a question; what went wrong: a failed wake,
//! an expiry nobody answered, a device lost), the request each target's shape sends, and
//! the retry schedule. No I/O: the store queues notices in its outbox (`store/notices.rs`)
//! and the server's task (`server/notices.rs`) sends them.
//!
//! A notice never carries a secret: it is built from the event's ids, labels, tool name,
//! reason and questions, a failing signal's message, never a call's arguments, a
//! waitpoint's secret, a device's token or the operator token. A target's URL is itself a
//! secret-ish setting (a Slack webhook's path, an ntfy topic): it is shown only as
//! `scheme://host/…` ([`Target::shown_url`]).

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use cortex_protocol::api::{EventBody, PendingRequest, Wake, WakeReason};
use serde::{Deserialize, Serialize};

/// What a notice is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NoticeEvent {
    /// A tool call waits for a person's approval.
    Approval,
    /// The model asked a person (`ask_user`).
    Question,
    /// A waitpoint woke with a failure (a `fail` signal).
    Failed,
    /// A waitpoint expired unresolved (a monitor only when it never heard a signal).
    Expired,
    /// A device remote waits depend on has been offline past `deviceLossGraceMs`.
    DeviceLost,
}

impl NoticeEvent {
    pub const ALL: [NoticeEvent; 5] = [
        NoticeEvent::Approval,
        NoticeEvent::Question,
        NoticeEvent::Failed,
        NoticeEvent::Expired,
        NoticeEvent::DeviceLost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NoticeEvent::Approval => "approval",
            NoticeEvent::Question => "question",
            NoticeEvent::Failed => "failed",
            NoticeEvent::Expired => "expired",
            NoticeEvent::DeviceLost => "device-lost",
        }
    }

    fn parse(s: &str) -> Option<NoticeEvent> {
        NoticeEvent::ALL.into_iter().find(|e| e.as_str() == s)
    }

    /// A bit of the mask the store keeps of the events some target wants.
    pub fn bit(self) -> u64 {
        1 << (self as u64)
    }

    /// ntfy's priority (1 min … 5 urgent): a person is asked, or something broke.
    fn ntfy_priority(self) -> &'static str {
        match self {
            NoticeEvent::Approval | NoticeEvent::Question | NoticeEvent::Failed => "4",
            NoticeEvent::DeviceLost => "4",
            NoticeEvent::Expired => "3",
        }
    }

    /// ntfy's tags (emoji short codes shown beside the title).
    fn ntfy_tags(self) -> &'static str {
        match self {
            NoticeEvent::Approval => "cortex,raised_hand",
            NoticeEvent::Question => "cortex,question",
            NoticeEvent::Failed => "cortex,x",
            NoticeEvent::Expired => "cortex,hourglass",
            NoticeEvent::DeviceLost => "cortex,warning",
        }
    }
}

/// A notice as the outbox keeps it and every shape renders it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notice {
    pub event: NoticeEvent,
    /// One line (ASCII in ntfy's `Title` header).
    pub title: String,
    /// What happened and what to do, a few lines.
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waitpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// When the event happened (ms since the epoch).
    pub at: u64,
}

/// The longest text a notice carries of what others wrote (a signal's message, a question).
const EXCERPT: usize = 300;

fn excerpt(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(EXCERPT) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

fn session_name(sid: &str, title: Option<&str>) -> String {
    match title.map(str::trim).filter(|t| !t.is_empty()) {
        Some(t) => format!("{sid} ({})", excerpt(t)),
        None => sid.to_string(),
    }
}

/// The notice a session's event becomes, if any: an approval or a question waiting on a
/// person, a failed wake, an expiry nobody answered (`unanswered(id)`: the waitpoint is a
/// one-shot, whose expiry means its reports never all came, or a monitor that never heard
/// a signal; a monitor that heard its job just reached the end of its life).
pub fn from_event(
    sid: &str,
    title: Option<&str>,
    body: &EventBody,
    unanswered: impl FnOnce(&str) -> bool,
    at: u64,
) -> Option<Notice> {
    match body {
        EventBody::ApprovalRequired { approval, .. } => Some(asked(sid, title, approval, at)),
        EventBody::Wake(w) => match w.reason {
            WakeReason::Failed => Some(failed(sid, title, w, at)),
            WakeReason::Expired if unanswered(&w.waitpoint.id) => Some(expired(sid, title, w, at)),
            _ => None,
        },
        _ => None,
    }
}

fn asked(sid: &str, title: Option<&str>, p: &PendingRequest, at: u64) -> Notice {
    let who = session_name(sid, title);
    let (event, head, mut text) = if p.kind == "question" {
        let mut text = format!("Session {who} asks:");
        for q in &p.questions {
            text.push_str(&format!("\n- {}", excerpt(&q.question)));
            if !q.options.is_empty() {
                let opts: Vec<String> = q.options.iter().map(|o| excerpt(o)).collect();
                text.push_str(&format!(" ({})", opts.join(" / ")));
            }
        }
        (NoticeEvent::Question, "A question waits for you", text)
    } else {
        let text = format!(
            "Session {who} wants to run {}: {}",
            p.tool,
            excerpt(&p.reason)
        );
        (NoticeEvent::Approval, "An approval waits for you", text)
    };
    text.push_str(&format!(
        "\nAnswer with `cortex approvals` (request {}) or on the hub's page.",
        p.id
    ));
    Notice {
        event,
        title: format!("cortex: {head} ({sid})"),
        text,
        session: Some(sid.to_string()),
        waitpoint: None,
        device: None,
        at,
    }
}

fn waitpoint_name(w: &Wake) -> String {
    let label = w.waitpoint.label.trim();
    if label.is_empty() {
        w.waitpoint.id.clone()
    } else {
        format!("{} ({})", excerpt(label), w.waitpoint.id)
    }
}

fn failed(sid: &str, title: Option<&str>, w: &Wake, at: u64) -> Notice {
    let what = waitpoint_name(w);
    let mut text = format!(
        "Waitpoint {what} of session {} failed.",
        session_name(sid, title)
    );
    let fail = w
        .signals
        .iter()
        .rev()
        .find(|s| s.status == cortex_protocol::SignalStatus::Fail);
    if let Some(s) = fail {
        let member = s
            .member
            .as_deref()
            .map(|m| format!(" {m}"))
            .unwrap_or_default();
        match s.message.as_deref().filter(|m| !m.trim().is_empty()) {
            Some(m) => text.push_str(&format!("\nThe failing report{member}: {}", excerpt(m))),
            None => text.push_str(&format!("\nA report{member} said fail.")),
        }
    }
    Notice {
        event: NoticeEvent::Failed,
        title: format!("cortex: {} failed", ascii_label(w)),
        text,
        session: Some(sid.to_string()),
        waitpoint: Some(w.waitpoint.id.clone()),
        device: None,
        at,
    }
}

fn expired(sid: &str, title: Option<&str>, w: &Wake, at: u64) -> Notice {
    let what = waitpoint_name(w);
    let text = format!(
        "Waitpoint {what} of session {} expired after {} without resolving ({} report(s) in its last round).",
        session_name(sid, title),
        crate::time::human_duration(w.waited_ms),
        w.signals.len() as u64 + w.omitted,
    );
    Notice {
        event: NoticeEvent::Expired,
        title: format!("cortex: {} expired", ascii_label(w)),
        text,
        session: Some(sid.to_string()),
        waitpoint: Some(w.waitpoint.id.clone()),
        device: None,
        at,
    }
}

/// A device's loss: offline since `since`, `waits` remote waits on it told.
pub fn device_lost(device: &str, since: u64, waits: usize, at: u64) -> Notice {
    Notice {
        event: NoticeEvent::DeviceLost,
        title: format!("cortex: device {} is offline", ascii(device)),
        text: format!(
            "Device {device} has been offline for {}; {waits} remote wait(s) on it stay armed until it is back. `cortex devices` shows it.",
            crate::time::human_duration(at.saturating_sub(since)),
        ),
        session: None,
        waitpoint: None,
        device: Some(device.to_string()),
        at,
    }
}

fn ascii_label(w: &Wake) -> String {
    let l = w.waitpoint.label.trim();
    let l = if l.is_empty() { &w.waitpoint.id } else { l };
    ascii(&excerpt(l))
}

/// Slack's three control characters escaped, so a label like `<nightly>` is shown as
/// written rather than read as a link or a mention.
fn slack_escaped(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Header-safe text: visible ASCII and spaces, anything else as `?`.
fn ascii(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .collect()
}

// ------------------------------------------------------------------ targets

/// A target's shape: what its body and headers look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    /// `POST` of the notice as JSON ([`Notice`] with its `id`).
    Webhook,
    /// Slack's incoming webhook: `{"text": …}`.
    Slack,
    /// An ntfy topic URL: the text as the body, `Title`, `Priority`, `Tags` headers.
    Ntfy,
}

impl Shape {
    fn as_str(self) -> &'static str {
        match self {
            Shape::Webhook => "webhook",
            Shape::Slack => "slack",
            Shape::Ntfy => "ntfy",
        }
    }
}

/// One entry of settings.json `notify`, as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TargetSetting {
    #[serde(rename = "type")]
    shape: Shape,
    url: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    events: Option<Vec<String>>,
}

/// A target to send notices to. Its `Debug` and [`Target::shown_url`] never show the URL
/// past its host.
#[derive(Clone, PartialEq)]
pub struct Target {
    /// Stable across restarts: the setting's `name`, else drawn from the URL's hash (the
    /// outbox records deliveries under it).
    pub id: String,
    pub shape: Shape,
    url: String,
    events: HashSet<NoticeEvent>,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("id", &self.id)
            .field("shape", &self.shape)
            .field("url", &self.shown_url())
            .field("events", &self.events)
            .finish()
    }
}

/// What is wrong with settings.json `notify`; never shows a URL past its host.
#[derive(Debug, thiserror::Error)]
#[error("settings.json notify[{index}]: {why}")]
pub struct NotifyConfigError {
    pub index: usize,
    pub why: String,
}

/// `scheme://host[:port]/…`: enough to tell targets apart in a log, not enough to post.
pub fn shown_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(u) => {
            let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
            format!("{}://{}{port}/…", u.scheme(), u.host_str().unwrap_or(""))
        }
        Err(_) => "(not a URL)".into(),
    }
}

impl Target {
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn shown_url(&self) -> String {
        shown_url(&self.url)
    }

    pub fn wants(&self, e: NoticeEvent) -> bool {
        self.events.contains(&e)
    }

    /// The request for `notice` (its outbox id `id`, also sent as `X-Cortex-Notice`
    /// so a receiver can drop a repeat): the content type, extra headers and body.
    pub fn request(&self, id: &str, notice: &Notice) -> Request {
        match self.shape {
            Shape::Webhook => {
                let mut v = serde_json::to_value(notice).unwrap_or_default();
                if let Some(o) = v.as_object_mut() {
                    o.insert("id".into(), id.into());
                }
                Request {
                    content_type: "application/json",
                    headers: vec![("X-Cortex-Notice", id.to_string())],
                    body: v.to_string().into_bytes(),
                }
            }
            Shape::Slack => Request {
                content_type: "application/json",
                headers: vec![("X-Cortex-Notice", id.to_string())],
                body: serde_json::json!({
                    "text": format!("*{}*\n{}", slack_escaped(&notice.title), slack_escaped(&notice.text))
                })
                .to_string()
                .into_bytes(),
            },
            Shape::Ntfy => Request {
                content_type: "text/plain; charset=utf-8",
                headers: vec![
                    ("Title", ascii(&notice.title)),
                    ("Priority", notice.event.ntfy_priority().to_string()),
                    ("Tags", notice.event.ntfy_tags().to_string()),
                    ("X-Cortex-Notice", id.to_string()),
                ],
                body: notice.text.clone().into_bytes(),
            },
        }
    }
}

/// What one delivery sends: always a `POST` to the target's URL.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub content_type: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

/// The targets of settings.json `notify` (absent or `null`: none). Names are unique;
/// URLs are `http://` or `https://`; `events` defaults to all of them.
pub fn parse(value: Option<&serde_json::Value>) -> Result<Vec<Target>, NotifyConfigError> {
    let list = match value {
        None | Some(serde_json::Value::Null) => return Ok(Vec::new()),
        Some(serde_json::Value::Array(a)) => a,
        Some(_) => {
            return Err(NotifyConfigError {
                index: 0,
                why: "notify must be a list of targets, like [{\"type\": \"ntfy\", \"url\": \"https://ntfy.sh/TOPIC\"}]".into(),
            });
        }
    };
    let mut out: Vec<Target> = Vec::new();
    for (index, v) in list.iter().enumerate() {
        let bad = |why: String| NotifyConfigError { index, why };
        // serde's message could quote the URL: say only what is wrong in general.
        let s = TargetSetting::deserialize(v).map_err(|e| {
            let e = e.to_string();
            let why = if e.contains("unknown field") || e.contains("unknown variant") || e.contains("missing field") {
                e
            } else {
                "expected {\"type\": \"webhook\"|\"slack\"|\"ntfy\", \"url\": \"https://…\", \"name\"?: \"…\", \"events\"?: [\"approval\", …]}".into()
            };
            bad(why)
        })?;
        let url = reqwest::Url::parse(&s.url)
            .map_err(|_| bad("url is not a URL (expected https://HOST/PATH)".into()))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(bad(format!(
                "url {} is not an http:// or https:// URL",
                shown_url(&s.url)
            )));
        }
        let events = match s.events {
            None => NoticeEvent::ALL.into_iter().collect(),
            Some(list) => {
                let mut set = HashSet::new();
                for e in list {
                    let ev = NoticeEvent::parse(&e).ok_or_else(|| {
                        bad(format!(
                            "unknown event {e:?}; the events are {}",
                            NoticeEvent::ALL.map(NoticeEvent::as_str).join(", ")
                        ))
                    })?;
                    set.insert(ev);
                }
                set
            }
        };
        let id = match s.name.map(|n| n.trim().to_string()) {
            Some(n) if !n.is_empty() && n.len() <= 64 => n,
            Some(_) => return Err(bad("name must be 1 to 64 characters".into())),
            None => format!(
                "{}-{}",
                s.shape.as_str(),
                &crate::secret::hex(&crate::secret::hash(&s.url))[..8]
            ),
        };
        if out.iter().any(|t| t.id == id) {
            return Err(bad(format!(
                "two targets are named {id:?}; give each its own name"
            )));
        }
        out.push(Target {
            id,
            shape: s.shape,
            url: s.url,
            events,
        });
    }
    Ok(out)
}

/// The mask of the events some target wants ([`NoticeEvent::bit`]): the store queues
/// only those.
pub fn wanted(targets: &[Target]) -> u64 {
    targets
        .iter()
        .flat_map(|t| t.events.iter())
        .fold(0, |m, e| m | e.bit())
}

// ------------------------------------------------------------------ retries

/// How many times a notice is tried on one target before it is given up (about 45
/// minutes of trying with [`retry_delay`]).
pub const MAX_ATTEMPTS: u32 = 12;
/// The first retry's delay; each next one doubles, up to [`RETRY_CAP`].
pub const RETRY_BASE: Duration = Duration::from_secs(1);
pub const RETRY_CAP: Duration = Duration::from_secs(15 * 60);
/// One attempt's bound: connect, send, and the answer's head.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// The delay after failed attempt `attempt` (1 for the first): `RETRY_BASE · 2^(n-1)`,
/// capped at [`RETRY_CAP`], jittered into its upper half (`unit` from `[0, 1)`), so
/// targets that failed together are not tried together again.
pub fn retry_delay(attempt: u32, unit: f64) -> Duration {
    let doublings = attempt.saturating_sub(1).min(31);
    let full = RETRY_BASE
        .checked_mul(1u32 << doublings)
        .unwrap_or(RETRY_CAP)
        .min(RETRY_CAP);
    let unit = if unit.is_finite() {
        unit.clamp(0.0, 1.0)
    } else {
        0.0
    };
    full / 2 + (full / 2).mul_f64(unit)
}

/// What an attempt's answer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx: delivered.
    Sent,
    /// No answer, 408, 429 or 5xx: try again later (while attempts remain).
    Retry,
    /// Any other answer (400, 401, 403, 404, a redirect): the target refuses it, and will
    /// again; given up at once.
    Refused,
}

/// The verdict on an HTTP status (`None`: no answer: a connection error or a timeout).
pub fn verdict(status: Option<u16>) -> Verdict {
    match status {
        Some(s) if (200..300).contains(&s) => Verdict::Sent,
        None | Some(408) | Some(429) => Verdict::Retry,
        Some(s) if s >= 500 => Verdict::Retry,
        Some(_) => Verdict::Refused,
    }
}

/// A uniform draw from `[0, 1)` for the jitter (0.5 without randomness).
pub fn unit_draw() -> f64 {
    match getrandom::u64() {
        Ok(x) => (x >> 11) as f64 / (1u64 << 53) as f64,
        Err(_) => 0.5,
    }
}

#[cfg(test)]
mod tests;
