//! The vocabulary of waits, in one place: the conditions `cortex wait` takes on its command
//! line (`pid:4123`, `log:/runs/7/train.log~Traceback|nan`), the API's `kind`s
//! (`{"kind": "log", "path": …, "match": …}`) and the model's `device_wait_*` tools all go
//! through [`parse_condition`] or [`WaitCondition::spec`] into one [`WaitSpec`], checked by
//! the same rules ([`check`]), and `docs/waits.md` lists them once.
//!
//! | condition | API | holds when |
//! | --- | --- | --- |
//! | `pid:N` (`pid:N@START`) | `{kind: "pid", pid, start_time?, must_exist?}` | the process exits (with `must_exist`, one not running at arm time breaks the wait) |
//! | `file:PATH` | `{kind: "file", path}` | the file is written (closed after writing, moved into place) |
//! | `flock:PATH` | `{kind: "flock", path}` | the `flock(2)` lock on it is free |
//! | `log:PATH~REGEX` | `{kind: "log", path, match}` | a line matching REGEX is appended |
//! | `silence:PATH~DUR` | `{kind: "file", path, silence}` | the file has not grown for DUR |
//! | `log:PATH~REGEX~DUR` | `{kind: "log", path, match, silence}` | a match, or DUR of silence |
//! | several | `{kind: "any", conditions: [...]}` | the first of them holds |
//!
//! Pure: no I/O. The pattern is compiled here only to refuse a bad one early with the
//! regex crate's own words; the wait library compiles it again to use it.

use serde::{Deserialize, Serialize};

pub use crate::duration::{BadDuration, format_duration_ms, parse_duration};
use crate::mesh::WaitSpec;

/// The most conditions one `any` may hold.
pub const MAX_CONDITIONS: usize = 8;
/// The longest pattern a log wait takes, in bytes.
pub const MAX_PATTERN_BYTES: usize = 1_000;
/// The compiled pattern's size limit (the regex crate's `size_limit`): a pattern past it is
/// refused rather than allowed to take the device's memory.
pub const PATTERN_SIZE_LIMIT: usize = 1 << 20;
/// The longest path a wait takes, in bytes (`PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4_096;
/// The shortest silence a wait takes: below it, a writer's ordinary pauses would fire it.
pub const MIN_SILENCE_MS: u64 = 100;
/// The longest silence: thirty days, the longest waitpoint lifetime.
pub const MAX_SILENCE_MS: u64 = 30 * 86_400_000;
/// Lines before the matching one a log wait's payload carries.
pub const LOG_LINES_BEFORE: usize = 5;
/// A line in a log wait's payload is cut to this many bytes (at a character boundary), with
/// an ellipsis, so a fired payload always fits a signal's data.
pub const LOG_LINE_MAX_BYTES: usize = 1_000;

/// Why a condition is refused. Each message says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConditionError {
    #[error("{0}")]
    Bad(String),
}

fn bad(m: impl Into<String>) -> ConditionError {
    ConditionError::Bad(m.into())
}

/// A duration as the API takes it: a number of seconds (`1200`, `0.5`) or a string
/// (`"20m"`, `"1.5h"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum DurationValue {
    Seconds(f64),
    Text(String),
}

impl DurationValue {
    /// In milliseconds, at least 1 for anything above zero; refused when negative, not a
    /// number, or not a duration.
    pub fn to_ms(&self, field: &str) -> Result<u64, ConditionError> {
        let secs = match self {
            DurationValue::Seconds(s) => *s,
            DurationValue::Text(t) => parse_duration(t)
                .map_err(|e| bad(format!("{field}: {e}")))?
                .as_secs_f64(),
        };
        if !secs.is_finite() || secs < 0.0 || secs > u64::MAX as f64 / 1000.0 {
            return Err(bad(format!(
                "{field} must be a duration above 0 (seconds, or like \"20m\")"
            )));
        }
        Ok(((secs * 1000.0).round() as u64).max(u64::from(secs > 0.0)))
    }
}

/// A condition as the API and the model's tools write it (`POST /api/devices/{name}/waits`,
/// `device_wait_log`, each of `device_wait_any`'s `conditions`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WaitCondition {
    /// `pid`, `file`, `flock`, `log` or `any`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// On `pid`: its start time (field 22 of `/proc/PID/stat`), so another process that
    /// got the same pid is never waited on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<u64>,
    /// On `pid`: a process not running when the wait is armed breaks it instead of firing
    /// at once (a typo'd pid, or a job that already ended, is then an error).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub must_exist: bool,
    /// On `file`, `flock` and `log`: a path (absolute on a device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A log wait's pattern (a regular expression a line must match).
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// On `file` and `log`: fire when the file has not grown for this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silence: Option<DurationValue>,
    /// An `any`'s conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // The schema refers to itself here; its references are collected once.
    #[cfg_attr(feature = "schema", schema(no_recursion))]
    pub conditions: Option<Vec<WaitCondition>>,
}

/// Where a wait runs: on a device (paths must be absolute there, and nobody can resolve a
/// relative one for it) or on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Device,
    Here,
}

impl WaitCondition {
    /// The condition that asks for `spec`, as the API takes it (what `cortex wait any
    /// --device` posts). A spec's cursors are left out: a new wait starts without one.
    pub fn from_spec(spec: &WaitSpec) -> WaitCondition {
        let silence = spec
            .silence_ms()
            .map(|ms| DurationValue::Seconds(ms as f64 / 1000.0));
        let base = WaitCondition {
            kind: spec.kind().to_string(),
            ..WaitCondition::default()
        };
        match spec {
            WaitSpec::Pid {
                pid,
                start_time,
                must_exist,
            } => WaitCondition {
                pid: Some(*pid),
                start_time: *start_time,
                must_exist: *must_exist,
                ..base
            },
            WaitSpec::File { path, .. } | WaitSpec::Flock { path } => WaitCondition {
                path: Some(path.clone()),
                silence,
                ..base
            },
            WaitSpec::Log { path, pattern, .. } => WaitCondition {
                path: Some(path.clone()),
                pattern: Some(pattern.clone()),
                silence,
                ..base
            },
            WaitSpec::Any { conditions } => WaitCondition {
                conditions: Some(conditions.iter().map(WaitCondition::from_spec).collect()),
                ..base
            },
        }
    }

    /// The spec this condition asks for, checked ([`check`]).
    pub fn spec(&self, place: Place) -> Result<WaitSpec, ConditionError> {
        let spec = self.spec_unchecked(0)?;
        check(&spec, place)?;
        Ok(spec)
    }

    fn spec_unchecked(&self, depth: usize) -> Result<WaitSpec, ConditionError> {
        let kind = self.kind.as_str();
        let only = |allowed: &[&str]| -> Result<(), ConditionError> {
            let present = [
                ("pid", self.pid.is_some()),
                ("start_time", self.start_time.is_some()),
                ("must_exist", self.must_exist),
                ("path", self.path.is_some()),
                ("match", self.pattern.is_some()),
                ("silence", self.silence.is_some()),
                ("conditions", self.conditions.is_some()),
            ];
            for (name, here) in present {
                if here && !allowed.contains(&name) {
                    return Err(bad(format!(
                        "{name} does not belong to a {kind} wait; leave it out (a {kind} wait takes {})",
                        allowed.join(", ")
                    )));
                }
            }
            Ok(())
        };
        let path = || -> Result<String, ConditionError> {
            self.path.clone().ok_or_else(|| {
                bad(format!(
                    "a {kind} wait needs \"path\": the absolute path of the file on the device"
                ))
            })
        };
        let silence = || -> Result<Option<u64>, ConditionError> {
            self.silence
                .as_ref()
                .map(|d| d.to_ms("silence"))
                .transpose()
        };
        match kind {
            "pid" => {
                only(&["pid", "start_time", "must_exist"])?;
                let pid = self
                    .pid
                    .ok_or_else(|| bad("a pid wait needs \"pid\": the process id"))?;
                Ok(WaitSpec::Pid {
                    pid,
                    start_time: self.start_time,
                    must_exist: self.must_exist,
                })
            }
            "file" => {
                only(&["path", "silence"])?;
                Ok(WaitSpec::File {
                    path: path()?,
                    cursor: None,
                    silence_ms: silence()?,
                })
            }
            "flock" => {
                only(&["path"])?;
                Ok(WaitSpec::Flock { path: path()? })
            }
            "log" => {
                only(&["path", "match", "silence"])?;
                let pattern = self.pattern.clone().ok_or_else(|| {
                    bad("a log wait needs \"match\": the regular expression a line must match")
                })?;
                Ok(WaitSpec::Log {
                    path: path()?,
                    pattern,
                    cursor: None,
                    silence_ms: silence()?,
                })
            }
            "any" => {
                only(&["conditions"])?;
                if depth > 0 {
                    return Err(bad(
                        "an any wait cannot hold another any; list all the conditions in one",
                    ));
                }
                let list = self.conditions.as_deref().unwrap_or_default();
                let conditions = list
                    .iter()
                    .map(|c| c.spec_unchecked(depth + 1))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(WaitSpec::Any { conditions })
            }
            other => Err(bad(format!(
                "kind {other:?} is not a wait; use {}",
                KINDS
                    .iter()
                    .map(|k| format!("\"{k}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }
}

/// The kinds the API takes.
pub const KINDS: [&str; 5] = ["pid", "file", "flock", "log", "any"];

/// A condition as `cortex wait any` takes it: `pid:N`, `pid:N@START`, `file:PATH`,
/// `flock:PATH`, `log:PATH~REGEX`, `log:PATH~REGEX~DUR` (a match or DUR of silence),
/// `silence:PATH~DUR`. The path ends at the first `~`; a pattern may hold more.
pub fn parse_condition(s: &str, place: Place) -> Result<WaitSpec, ConditionError> {
    let spec = parse_one(s)?;
    check(&spec, place)?;
    Ok(spec)
}

const CONDITION_FORMS: &str =
    "pid:N, file:PATH, flock:PATH, log:PATH~REGEX, log:PATH~REGEX~DUR or silence:PATH~DUR";

fn parse_one(s: &str) -> Result<WaitSpec, ConditionError> {
    let Some((kind, rest)) = s.split_once(':') else {
        return Err(bad(format!(
            "condition {s:?} names no kind; write one of {CONDITION_FORMS}"
        )));
    };
    let duration = |d: &str| -> Result<u64, ConditionError> {
        let d = parse_duration(d).map_err(|e| bad(format!("in {s:?}: {e}")))?;
        Ok(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    };
    match kind {
        "pid" => {
            let (pid, start) = match rest.split_once('@') {
                Some((p, t)) => (p, Some(t)),
                None => (rest, None),
            };
            let pid: i32 = pid.trim().parse().map_err(|_| {
                bad(format!(
                    "in {s:?}: {pid:?} is not a process id; write pid:N"
                ))
            })?;
            let start_time = start
                .map(|t| {
                    t.trim().parse::<u64>().map_err(|_| {
                        bad(format!(
                            "in {s:?}: {t:?} is not a start time (field 22 of /proc/PID/stat)"
                        ))
                    })
                })
                .transpose()?;
            Ok(WaitSpec::Pid {
                pid,
                start_time,
                must_exist: false,
            })
        }
        "file" => Ok(WaitSpec::File {
            path: rest.to_string(),
            cursor: None,
            silence_ms: None,
        }),
        "flock" => Ok(WaitSpec::Flock {
            path: rest.to_string(),
        }),
        "silence" => {
            let Some((path, d)) = rest.rsplit_once('~') else {
                return Err(bad(format!(
                    "{s:?} needs its duration: silence:PATH~DUR, like silence:/runs/7/train.log~20m"
                )));
            };
            Ok(WaitSpec::File {
                path: path.to_string(),
                cursor: None,
                silence_ms: Some(duration(d)?),
            })
        }
        "log" => {
            let Some((path, tail)) = rest.split_once('~') else {
                return Err(bad(format!(
                    "{s:?} needs its pattern: log:PATH~REGEX, like log:/runs/7/train.log~Traceback|nan"
                )));
            };
            // A trailing `~DUR` is a silence, when it reads as one; else the `~` is the
            // pattern's own.
            let (pattern, silence_ms) = match tail.rsplit_once('~') {
                Some((p, d)) if parse_duration(d).is_ok() && !p.is_empty() => {
                    (p.to_string(), Some(duration(d)?))
                }
                _ => (tail.to_string(), None),
            };
            Ok(WaitSpec::Log {
                path: path.to_string(),
                pattern,
                cursor: None,
                silence_ms,
            })
        }
        "any" => Err(bad(
            "any is not a condition; list the conditions themselves (cortex wait any COND COND ...)",
        )),
        other => Err(bad(format!(
            "{other:?} in {s:?} is not a kind of condition; write one of {CONDITION_FORMS}"
        ))),
    }
}

/// Several conditions as one wait: one alone is itself, several an `any`.
pub fn any_of(conditions: Vec<WaitSpec>, place: Place) -> Result<WaitSpec, ConditionError> {
    let spec = match <[WaitSpec; 1]>::try_from(conditions) {
        Ok([one]) => one,
        Err(conditions) => WaitSpec::Any { conditions },
    };
    check(&spec, place)?;
    Ok(spec)
}

/// The condition written back the way `cortex wait any` takes it (for saying which of an
/// any's conditions fired): `pid:4123`, `log:/x~nan`, `silence:/x~20m`.
pub fn condition_string(spec: &WaitSpec) -> String {
    match spec {
        WaitSpec::Pid {
            pid,
            start_time: None,
            ..
        } => format!("pid:{pid}"),
        WaitSpec::Pid {
            pid,
            start_time: Some(t),
            ..
        } => format!("pid:{pid}@{t}"),
        WaitSpec::File {
            path,
            silence_ms: None,
            ..
        } => format!("file:{path}"),
        WaitSpec::File {
            path,
            silence_ms: Some(ms),
            ..
        } => format!("silence:{path}~{}", compact_ms(*ms)),
        WaitSpec::Flock { path } => format!("flock:{path}"),
        WaitSpec::Log {
            path,
            pattern,
            silence_ms,
            ..
        } => match silence_ms {
            None => format!("log:{path}~{pattern}"),
            Some(ms) => format!("log:{path}~{pattern}~{}", compact_ms(*ms)),
        },
        WaitSpec::Any { conditions } => conditions
            .iter()
            .map(condition_string)
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// A duration in one token [`parse_duration`] reads back exactly.
fn compact_ms(ms: u64) -> String {
    if ms.is_multiple_of(86_400_000) {
        format!("{}d", ms / 86_400_000)
    } else if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// Compiles a log wait's pattern as the wait library will (size-limited), or says why not.
pub fn compile_pattern(pattern: &str) -> Result<regex::Regex, ConditionError> {
    if pattern.is_empty() {
        return Err(bad(
            "match is empty; give the regular expression a line must match (like Traceback|nan)",
        ));
    }
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(bad(format!(
            "match is {} bytes, over the cap of {MAX_PATTERN_BYTES}; shorten the pattern",
            pattern.len()
        )));
    }
    regex::RegexBuilder::new(pattern)
        .size_limit(PATTERN_SIZE_LIMIT)
        .build()
        .map_err(|e| {
            bad(format!(
                "match {pattern:?} is not a usable regular expression: {e}"
            ))
        })
}

/// The rules every spec meets, whoever wrote it: a pid above 0; a path that names a file
/// (absolute on a device), at most [`MAX_PATH_BYTES`], no NUL; a pattern that compiles; a
/// silence between [`MIN_SILENCE_MS`] and [`MAX_SILENCE_MS`]; an `any` of 2 to
/// [`MAX_CONDITIONS`] conditions, none an `any`.
pub fn check(spec: &WaitSpec, place: Place) -> Result<(), ConditionError> {
    if let Some(path) = spec.path() {
        check_path(path, place)?;
    }
    if let Some(ms) = spec.silence_ms()
        && !(MIN_SILENCE_MS..=MAX_SILENCE_MS).contains(&ms)
    {
        return Err(bad(format!(
            "silence {} is out of range; give between {} and {}",
            format_duration_ms(ms),
            format_duration_ms(MIN_SILENCE_MS),
            format_duration_ms(MAX_SILENCE_MS)
        )));
    }
    match spec {
        WaitSpec::Pid { pid, .. } if *pid <= 0 => Err(bad(format!(
            "pid {pid} is not a process id; give a number above 0"
        ))),
        WaitSpec::Log { pattern, .. } => compile_pattern(pattern).map(drop),
        WaitSpec::Any { conditions } => {
            if conditions.len() < 2 || conditions.len() > MAX_CONDITIONS {
                return Err(bad(format!(
                    "an any wait takes 2 to {MAX_CONDITIONS} conditions; got {}",
                    conditions.len()
                )));
            }
            for c in conditions {
                if matches!(c, WaitSpec::Any { .. }) {
                    return Err(bad(
                        "an any wait cannot hold another any; list all the conditions in one",
                    ));
                }
                check(c, place)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn check_path(path: &str, place: Place) -> Result<(), ConditionError> {
    if path.is_empty() {
        return Err(bad("path is empty; give the path of the file"));
    }
    if path.len() > MAX_PATH_BYTES || path.contains('\0') {
        return Err(bad(format!(
            "path {:?} is not usable (at most {MAX_PATH_BYTES} bytes, no NUL)",
            path.chars().take(80).collect::<String>()
        )));
    }
    if place == Place::Device && !path.starts_with('/') {
        return Err(bad(format!(
            "path {path:?} is not usable; give the absolute path on the device (from /)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn api(v: serde_json::Value) -> Result<WaitSpec, ConditionError> {
        serde_json::from_value::<WaitCondition>(v)
            .map_err(|e| bad(e.to_string()))?
            .spec(Place::Device)
    }

    #[test]
    fn the_command_line_and_the_api_mean_the_same_waits() {
        let pairs = [
            ("pid:4123", json!({"kind": "pid", "pid": 4123})),
            (
                "pid:4123@8812",
                json!({"kind": "pid", "pid": 4123, "start_time": 8812}),
            ),
            ("file:/d/x", json!({"kind": "file", "path": "/d/x"})),
            ("flock:/d/l", json!({"kind": "flock", "path": "/d/l"})),
            (
                "log:/r/t.log~Traceback|nan",
                json!({"kind": "log", "path": "/r/t.log", "match": "Traceback|nan"}),
            ),
            (
                "log:/r/t.log~loss=~20m",
                json!({"kind": "log", "path": "/r/t.log", "match": "loss=", "silence": "20m"}),
            ),
            (
                "silence:/r/t.log~90s",
                json!({"kind": "file", "path": "/r/t.log", "silence": 90}),
            ),
        ];
        for (cli, body) in pairs {
            let a = parse_condition(cli, Place::Device).expect("accepted");
            let b = api(body).expect("accepted");
            assert_eq!(a, b, "{cli}");
            // And back to the API's form, the same wait.
            assert_eq!(
                WaitCondition::from_spec(&a)
                    .spec(Place::Device)
                    .expect("accepted"),
                a,
                "{cli}"
            );
            // Written back, it reads the same.
            assert_eq!(
                parse_condition(&condition_string(&a), Place::Device).expect("accepted"),
                a
            );
        }
    }

    #[test]
    fn a_tilde_that_is_not_a_duration_belongs_to_the_pattern() {
        let s = parse_condition("log:/x~a~b", Place::Device).expect("accepted");
        assert_eq!(
            s,
            WaitSpec::Log {
                path: "/x".into(),
                pattern: "a~b".into(),
                cursor: None,
                silence_ms: None
            }
        );
    }

    #[test]
    fn any_holds_two_to_eight_plain_conditions() {
        let any = api(json!({"kind": "any", "conditions": [
            {"kind": "pid", "pid": 4123},
            {"kind": "log", "path": "/runs/7/train.log", "match": "Traceback|nan"},
            {"kind": "file", "path": "/runs/7/done", "silence": "10m"},
        ]}))
        .expect("accepted");
        assert_eq!(any.kind(), "any");
        assert_eq!(
            any.capabilities(),
            vec![
                "wait-any",
                "wait-file",
                "wait-log",
                "wait-pid",
                "wait-silence"
            ]
        );
        let one = json!({"kind": "pid", "pid": 1});
        assert!(api(json!({"kind": "any", "conditions": [one]})).is_err());
        assert!(api(json!({"kind": "any", "conditions": vec![one.clone(); 9]})).is_err());
        let nested = json!({"kind": "any", "conditions": [one, one]});
        let e = api(json!({"kind": "any", "conditions": [nested, one]})).expect_err("refused");
        assert!(e.to_string().contains("cannot hold another any"), "{e}");
        // One condition on the command line is just that wait.
        let single = any_of(
            vec![parse_condition("pid:7", Place::Here).expect("accepted")],
            Place::Here,
        )
        .expect("accepted");
        assert_eq!(single.kind(), "pid");
    }

    #[test]
    fn refusals_say_what_to_write() {
        let cases = [
            (json!({"kind": "log", "path": "/x"}), "needs \"match\""),
            (
                json!({"kind": "log", "path": "/x", "match": "("}),
                "not a usable regular expression",
            ),
            (
                json!({"kind": "log", "path": "x", "match": "a"}),
                "absolute path",
            ),
            (json!({"kind": "pid", "pid": 0}), "above 0"),
            (
                json!({"kind": "pid", "pid": 3, "path": "/x"}),
                "path does not belong",
            ),
            (
                json!({"kind": "flock", "path": "/x", "silence": 5}),
                "silence does not belong",
            ),
            (
                json!({"kind": "file", "path": "/x", "silence": 0.01}),
                "out of range",
            ),
            (
                json!({"kind": "file", "path": "/x", "silence": "soon"}),
                "not a duration",
            ),
            (json!({"kind": "tail", "path": "/x"}), "not a wait"),
        ];
        for (body, want) in cases {
            let e = api(body.clone()).expect_err("refused").to_string();
            assert!(e.contains(want), "{body}: {e}");
        }
        for (cli, want) in [
            ("4123", "names no kind"),
            ("log:/x", "needs its pattern"),
            ("silence:/x", "needs its duration"),
            ("silence:/x~later", "not a duration"),
            ("pid:abc", "not a process id"),
            ("any:x", "not a condition"),
            ("tail:/x", "not a kind of condition"),
        ] {
            let e = parse_condition(cli, Place::Here)
                .expect_err("refused")
                .to_string();
            assert!(e.contains(want), "{cli}: {e}");
        }
        // A relative path is fine here, not on a device.
        assert!(parse_condition("file:out/done", Place::Here).is_ok());
        assert!(parse_condition("file:out/done", Place::Device).is_err());
        // A pattern too big to compile within the limit is refused.
        let huge = "\\w{50}".repeat(150);
        assert!(compile_pattern(&huge).is_err());
    }

    #[test]
    fn api_durations_in_ms() {
        assert_eq!(
            DurationValue::Text("2m".into())
                .to_ms("silence")
                .expect("accepted"),
            120_000
        );
        assert_eq!(
            DurationValue::Seconds(1.5)
                .to_ms("silence")
                .expect("accepted"),
            1_500
        );
        assert!(DurationValue::Seconds(-1.0).to_ms("silence").is_err());
    }
}
