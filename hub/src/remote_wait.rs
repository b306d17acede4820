//! A remote wait as asked for (`POST /api/devices/{name}/waits`, or the runner's
//! `device_wait_*` tools): its body checked, its bound, the words it is shown with when the
//! asker gives none, and whether the device's agent runs that kind. One place, so the API
//! and the model get the same rules and the same sentences.

use cortex_protocol::api::CreateDeviceWait;
use cortex_protocol::mesh::WaitSpec;
use cortex_protocol::waits::{Place, condition_string, format_duration_ms};

use crate::engine::Settings;
use crate::registry::Registry;
use crate::store::device_waits::{EXPIRY_MARGIN_MS, NewDeviceWait, TIMEOUT_GRACE_MS};
use crate::time::human_duration;

/// Why a remote wait is refused: an HTTP status, a code and a sentence that says what to
/// do instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

/// Checks a remote wait on `device` and words it: the record to create and its bound in
/// ms. Refused for a bad body, and for an online agent that does not run its kind.
pub fn plan(
    settings: &Settings,
    devices: &Registry,
    device: &str,
    req: &CreateDeviceWait,
) -> Result<(NewDeviceWait, u64), Refusal> {
    let cap = |field: &str, value: &str, max: usize| {
        let n = value.chars().count();
        if n > max {
            return Err(Refusal {
                status: 413,
                code: "too_large",
                message: format!("{field} is {n} characters, over the cap of {max}; shorten it"),
            });
        }
        Ok(())
    };
    if let Some(l) = &req.label {
        cap("label", l.trim(), crate::engine::MAX_LABEL_CHARS)?;
    }
    if let Some(i) = &req.intent {
        cap("intent", i.trim(), crate::engine::MAX_INTENT_CHARS)?;
    }
    let (spec, timeout_ms) = parse_wait(req, settings.default_ttl_ms, max_timeout_ms(settings))?;
    if let Some(link) = devices.link(device) {
        let missing: Vec<&str> = spec
            .capabilities()
            .into_iter()
            .filter(|cap| !link.capabilities.iter().any(|c| c == cap))
            .collect();
        if !missing.is_empty() {
            return Err(Refusal {
                status: 409,
                code: "unsupported_wait",
                message: format!(
                    "the agent on {device} (version {}) does not run this {} wait (it does not announce {}); upgrade cortex-device-agent there",
                    link.agent_version,
                    spec.kind(),
                    missing.join(", ")
                ),
            });
        }
    }
    let (title, label, intent) = wait_words(&spec, device);
    let new = NewDeviceWait {
        device: device.to_string(),
        spec,
        timeout_ms,
        session: req.session.clone().filter(|s| !s.is_empty()),
        title,
        label: req
            .label
            .clone()
            .filter(|l| !l.trim().is_empty())
            .unwrap_or(label),
        intent: req
            .intent
            .clone()
            .filter(|i| !i.trim().is_empty())
            .unwrap_or(intent),
        waitpoint_id: None,
    };
    Ok((new, timeout_ms))
}

/// The bound a device wait may ask for at most: the longest waitpoint lifetime less what
/// the hub adds after the bound.
fn max_timeout_ms(settings: &Settings) -> u64 {
    settings
        .max_ttl_ms
        .saturating_sub(TIMEOUT_GRACE_MS + EXPIRY_MARGIN_MS)
}

/// The body checked: the spec and the bound in ms.
pub fn parse_wait(
    req: &CreateDeviceWait,
    default_ms: u64,
    max_ms: u64,
) -> Result<(WaitSpec, u64), Refusal> {
    let bad = |m: String| Refusal {
        status: 400,
        code: "invalid_wait",
        message: m,
    };
    let spec = req
        .condition
        .spec(Place::Device)
        .map_err(|e| bad(e.to_string()))?;
    let timeout_ms = match req.timeout_s {
        None => default_ms.min(max_ms),
        Some(s) if s.is_finite() && s > 0.0 => {
            let ms = (s * 1000.0).round().max(1.0);
            if ms > max_ms as f64 {
                return Err(bad(format!(
                    "timeout_s {s} is over the longest bound, {}s ({}); wait in parts",
                    max_ms / 1000,
                    human_duration(max_ms)
                )));
            }
            ms as u64
        }
        Some(s) => {
            return Err(bad(format!(
                "timeout_s must be a number of seconds above 0; got {s}"
            )));
        }
    };
    Ok((spec, timeout_ms))
}

/// The words a device wait is shown with when the request gives none.
fn wait_words(spec: &WaitSpec, device: &str) -> (String, String, String) {
    let (title, label, intent) = match spec {
        WaitSpec::Pid { pid, .. } => (
            format!("wait pid {pid} on {device}"),
            format!("pid {pid} on {device}"),
            format!("wake when process {pid} on {device} exits"),
        ),
        WaitSpec::File {
            path,
            silence_ms: Some(ms),
            ..
        } => (
            format!("wait silence {path} on {device}"),
            format!("{path} silent on {device}"),
            format!(
                "wake when {path} on {device} has not grown for {}",
                format_duration_ms(*ms)
            ),
        ),
        WaitSpec::File { path, .. } => (
            format!("wait file {path} on {device}"),
            format!("{path} on {device}"),
            format!("wake when {path} on {device} is written"),
        ),
        WaitSpec::Log { path, .. } => (
            format!("wait log {path} on {device}"),
            format!("log {path} on {device}"),
            format!("wake when {} on {device}", spec.describe()),
        ),
        WaitSpec::Any { .. } => (
            format!("wait any {} on {device}", condition_string(spec)),
            format!("any of {} on {device}", condition_string(spec)),
            format!("wake when {} on {device} holds", spec.describe()),
        ),
        WaitSpec::Flock { path } => (
            format!("wait flock {path} on {device}"),
            format!("lock {path} on {device}"),
            format!("wake when the lock on {path} on {device} is free"),
        ),
    };
    let cut = |s: String, n: usize| -> String {
        match s.char_indices().nth(n) {
            Some((i, _)) => format!("{}…", &s[..i]),
            None => s,
        }
    };
    (
        cut(title, 200),
        cut(label, crate::engine::MAX_LABEL_CHARS - 1),
        cut(intent, crate::engine::MAX_INTENT_CHARS - 1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: serde_json::Value) -> CreateDeviceWait {
        serde_json::from_value(v).expect("a body")
    }

    #[test]
    fn every_kind_is_read_by_the_one_parser_and_worded() {
        let day = 86_400_000;
        let cases = [
            (
                json!({"kind": "log", "path": "/r/t.log", "match": "Traceback|nan", "silence": "20m"}),
                "log:/r/t.log~Traceback|nan~20m",
                "log /r/t.log on gpu1",
            ),
            (
                json!({"kind": "file", "path": "/r/t.log", "silence": 90}),
                "silence:/r/t.log~90s",
                "/r/t.log silent on gpu1",
            ),
            (
                json!({"kind": "any", "conditions": [
                    {"kind": "pid", "pid": 4123},
                    {"kind": "log", "path": "/r/t.log", "match": "nan"}
                ]}),
                "pid:4123 log:/r/t.log~nan",
                "any of pid:4123 log:/r/t.log~nan on gpu1",
            ),
        ];
        for (req, condition, label) in cases {
            let (spec, ms) = parse_wait(&body(req), day, 2 * day).expect("accepted");
            assert_eq!(ms, day);
            assert_eq!(condition_string(&spec), condition);
            assert_eq!(wait_words(&spec, "gpu1").1, label);
        }
    }

    #[test]
    fn a_bad_condition_is_a_400_with_the_parsers_words() {
        for (req, want) in [
            (json!({"kind": "log", "path": "/x"}), "needs \"match\""),
            (
                json!({"kind": "log", "path": "/x", "match": "(unclosed"}),
                "not a usable regular expression",
            ),
            (json!({"kind": "any", "conditions": []}), "2 to 8"),
            (json!({"kind": "file", "path": "rel/x"}), "absolute path"),
        ] {
            let r = parse_wait(&body(req), 1000, 2000).expect_err("refused");
            assert_eq!((r.status, r.code), (400, "invalid_wait"));
            assert!(r.message.contains(want), "{}", r.message);
        }
    }
}
