//! The hub's configuration: `$CORTEX_HOME`, settings.json (`waitpointTtlMs`, `waitpointSweepMs`,
//! `deviceLossGraceMs`, `notify`, …; a key missing there falls back to its `CORTEX_…` environment
//! variable, then to its default), the operator token, and the listen address rule.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::engine::{DAY_MS, Settings};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON: {source}; fix it or remove it to use the defaults")]
    SettingsJson {
        path: String,
        source: serde_json::Error,
    },
    #[error("{key} = {value:?} is not usable: {why}")]
    BadValue {
        key: String,
        value: String,
        why: &'static str,
    },
    #[error("settings.json {key} = {value} is not usable: {why_owned}")]
    BadSection {
        key: String,
        value: String,
        why_owned: String,
    },
    #[error(transparent)]
    Notify(#[from] crate::notify::NotifyConfigError),
    #[error(
        "{0} is not a loopback address; the hub's signal route and API listen on loopback only (use 127.0.0.1:PORT or [::1]:PORT, and reach other machines through the device mesh)"
    )]
    NotLoopback(SocketAddr),
}

/// The hub's numbers: the engine's rules and the sweep interval; the runner's defaults
/// and the model's settings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HubSettings {
    pub engine: Settings,
    /// `waitpointSweepMs`: how often the sweep runs; 0 turns it off.
    pub sweep_ms: u64,
    /// `deviceLossGraceMs`: how long a device may be offline before each session waiting
    /// on one of its remote waits hears of it (a `report` wake; the wait stays armed).
    pub device_loss_grace_ms: u64,
    /// `agent`: what a session gets when its creator does not say.
    pub agent: AgentDefaults,
    /// `llm`, as written (the model client reads it with the `CORTEX_LLM_*` variables).
    pub llm: Option<serde_json::Value>,
    /// `allowedHosts` (else `CORTEX_ALLOWED_HOSTS`, comma-separated): names the listener
    /// answers to besides loopback, `localhost` and the mesh's public host.
    pub allowed_hosts: Vec<String>,
    /// `notify`: where outgoing notices go (`crate::notify`; none by default).
    pub notify: Vec<crate::notify::Target>,
    /// `limits`: what one model, client or session may cost the hub.
    pub limits: Limits,
    /// `store` (else `CORTEX_STORE_URL`; `--store` wins over both): the PostgreSQL
    /// database the store is in (`postgres://…`); `None`: redb under the home.
    pub store: Option<String>,
    /// `CORTEX_STORE_NOTIFY=off`: the store's batches are not announced to the other
    /// hubs with a `NOTIFY` (they find them by their poll, within a second; for a pooler
    /// that drops notifications). Off by default: they are.
    pub store_unannounced: bool,
}

/// settings.json `limits: {…}`: the bounds no model or client can break. Each has a
/// default that a real session never reaches; past one the hub refuses with a reason
/// (to the model as a tool error, to a client as an HTTP error) and loses nothing.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Limits {
    /// The most bytes one model reply may stream (text, reasoning and tool calls);
    /// past it the call ends `model_call_failed`, once, and is not retried.
    pub reply_bytes: u64,
    /// The longest one model call may take, retries and all, however steadily its
    /// server drips bytes.
    pub call_deadline_ms: u64,
    /// The most tool calls one reply may make; the calls past it are answered with an
    /// error and not run.
    pub tool_calls_per_reply: u32,
    /// The most waitpoints one session may hold armed at once.
    pub armed_waitpoints_per_session: u32,
    /// How deep sessions may spawn sessions (a root session is depth 0; 0: none spawns).
    pub spawn_depth: u32,
    /// The most sessions one root and all it spawned may spawn in an hour.
    pub spawns_per_hour: u32,
    /// A timer's shortest delay.
    pub timer_min_delay_ms: u64,
    /// The most runs wakes and timers may start in one session in an hour; past it the
    /// wake waits in the inbox until the hour allows.
    pub runs_per_hour: u32,
    /// The bytes all live log followers (SSE) may have waiting unread together; past
    /// it the slowest are dropped (they resume from their last seq).
    pub follower_bytes: u64,
    /// The longest an output schema may take to compile; past it the request is 400.
    pub schema_compile_ms: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            reply_bytes: 4 * 1024 * 1024,
            call_deadline_ms: 10 * 60_000,
            tool_calls_per_reply: 32,
            armed_waitpoints_per_session: 64,
            spawn_depth: 3,
            spawns_per_hour: 60,
            timer_min_delay_ms: 5_000,
            runs_per_hour: 120,
            follower_bytes: 64 * 1024 * 1024,
            schema_compile_ms: 1_000,
        }
    }
}

impl Limits {
    /// A limit of 0 would refuse everything; each must be at least 1 (the timer's
    /// minimum delay and the spawn depth may be 0).
    fn check(&self) -> Result<(), String> {
        let zero = [
            ("replyBytes", self.reply_bytes),
            ("callDeadlineMs", self.call_deadline_ms),
            ("toolCallsPerReply", self.tool_calls_per_reply as u64),
            (
                "armedWaitpointsPerSession",
                self.armed_waitpoints_per_session as u64,
            ),
            ("spawnsPerHour", self.spawns_per_hour as u64),
            ("runsPerHour", self.runs_per_hour as u64),
            ("followerBytes", self.follower_bytes),
            ("schemaCompileMs", self.schema_compile_ms),
        ];
        match zero.iter().find(|(_, v)| *v == 0) {
            Some((k, _)) => Err(format!("{k} must be above 0")),
            None => Ok(()),
        }
    }
}

/// settings.json `agent: {instructions?, maxTokens?, stop?, concurrency?, policy?, unattended?}`.
#[derive(Debug, Clone, PartialEq, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AgentDefaults {
    /// A session's instructions when it gives none (the hub's own text when unset).
    #[serde(default)]
    pub instructions: Option<String>,
    /// The most tokens one model call may generate (none: the server's own cap).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub stop: cortex_protocol::api::StopConfig,
    /// How many sessions the runner drives at once; the others wait in order (default 8).
    #[serde(default)]
    pub concurrency: Option<usize>,
    /// The gate's lists for sessions that give none (default: `device_exec` asks).
    #[serde(default)]
    pub policy: Option<cortex_protocol::api::Policy>,
    /// Sessions are unattended unless they say otherwise.
    #[serde(default)]
    pub unattended: Option<bool>,
    /// How long a hub's claim on a session it drives lasts unless renewed, in ms (default
    /// 10 s, at least 1 s): after a hub dies, another takes its sessions once it passes.
    #[serde(default)]
    pub lease_ms: Option<u64>,
}

/// The default of `deviceLossGraceMs`: two minutes, more than an agent's reconnect
/// backoff (at most 60 s), so a link that drops and comes back says nothing.
pub const DEFAULT_DEVICE_LOSS_GRACE_MS: u64 = 120_000;

impl AgentDefaults {
    pub const DEFAULT_CONCURRENCY: usize = 8;
    /// The lease a claim on a session takes unless `leaseMs` says otherwise.
    pub const DEFAULT_LEASE_MS: u64 = 10_000;

    pub fn concurrency(&self) -> usize {
        self.concurrency.unwrap_or(Self::DEFAULT_CONCURRENCY)
    }

    pub fn lease_ms(&self) -> u64 {
        self.lease_ms.unwrap_or(Self::DEFAULT_LEASE_MS)
    }
}

/// `$CORTEX_HOME`, else `~/.cortex`.
pub fn default_home() -> PathBuf {
    if let Some(h) = std::env::var_os("CORTEX_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"));
    home.join(".cortex")
}

fn key_value(
    json: &serde_json::Value,
    key: &str,
    env: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<u64>, ConfigError> {
    let bad = |value: String, why| ConfigError::BadValue {
        key: key.to_string(),
        value,
        why,
    };
    if let Some(v) = json.get(key) {
        return match v.as_u64() {
            Some(n) => Ok(Some(n)),
            None => Err(bad(v.to_string(), "expected a whole number of at least 0")),
        };
    }
    match lookup(env) {
        Some(s) if !s.trim().is_empty() => {
            s.trim()
                .parse::<u64>()
                .map(Some)
                .map_err(|_| ConfigError::BadValue {
                    key: env.to_string(),
                    value: s,
                    why: "expected a whole number of at least 0",
                })
        }
        _ => Ok(None),
    }
}

/// Reads `$home/settings.json` (missing is fine), then the environment for absent keys.
pub fn load_settings(home: &Path) -> Result<HubSettings, ConfigError> {
    load_settings_with(home, &|k| std::env::var(k).ok())
}

pub fn load_settings_with(
    home: &Path,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<HubSettings, ConfigError> {
    let path = home.join("settings.json");
    let json = match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice::<serde_json::Value>(&b).map_err(|source| {
            ConfigError::SettingsJson {
                path: path.display().to_string(),
                source,
            }
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::Value::Null,
        Err(source) => {
            return Err(ConfigError::Io {
                path: path.display().to_string(),
                source,
            });
        }
    };
    let mut engine = Settings::default();
    if let Some(ttl) = key_value(&json, "waitpointTtlMs", "CORTEX_WAITPOINT_TTL_MS", lookup)? {
        if ttl == 0 || ttl > 30 * DAY_MS {
            return Err(ConfigError::BadValue {
                key: "waitpointTtlMs".into(),
                value: ttl.to_string(),
                why: "a lifetime must be above 0 and at most 30 days (2592000000 ms)",
            });
        }
        engine.default_ttl_ms = ttl;
    }
    if let Some(cap) = key_value(
        &json,
        "waitpointMaxWakesPerHour",
        "CORTEX_WAITPOINT_MAX_WAKES_PER_HOUR",
        lookup,
    )? {
        if cap == 0 || cap > 3600 {
            return Err(ConfigError::BadValue {
                key: "waitpointMaxWakesPerHour".into(),
                value: cap.to_string(),
                why: "the cap must be between 1 and 3600",
            });
        }
        engine.max_wakes_per_hour = cap as u32;
    }
    if let Some(w) = key_value(
        &json,
        "waitpointWakeWindowMs",
        "CORTEX_WAITPOINT_WAKE_WINDOW_MS",
        lookup,
    )? {
        if w == 0 {
            return Err(ConfigError::BadValue {
                key: "waitpointWakeWindowMs".into(),
                value: w.to_string(),
                why: "the window must be above 0 (default 3600000, one hour)",
            });
        }
        engine.wake_window_ms = w;
    }
    let sweep_ms = key_value(
        &json,
        "waitpointSweepMs",
        "CORTEX_WAITPOINT_SWEEP_MS",
        lookup,
    )?
    .unwrap_or(30_000);
    let device_loss_grace_ms = match key_value(
        &json,
        "deviceLossGraceMs",
        "CORTEX_DEVICE_LOSS_GRACE_MS",
        lookup,
    )? {
        None => DEFAULT_DEVICE_LOSS_GRACE_MS,
        Some(g) if g == 0 || g > 30 * DAY_MS => {
            return Err(ConfigError::BadValue {
                key: "deviceLossGraceMs".into(),
                value: g.to_string(),
                why: "the grace must be above 0 and at most 30 days (default 120000, two minutes)",
            });
        }
        Some(g) => g,
    };
    let agent = match json.get("agent") {
        None | Some(serde_json::Value::Null) => AgentDefaults::default(),
        Some(v) => {
            let a = AgentDefaults::deserialize(v).map_err(|e| ConfigError::BadSection {
                key: "agent".into(),
                value: v.to_string(),
                why_owned: e.to_string(),
            })?;
            if a.concurrency == Some(0) || a.max_tokens == Some(0) {
                return Err(ConfigError::BadSection {
                    key: "agent".into(),
                    value: v.to_string(),
                    why_owned: "concurrency and maxTokens must be above 0".into(),
                });
            }
            a
        }
    };
    let llm = json.get("llm").filter(|v| !v.is_null()).cloned();
    let allowed_hosts = allowed_hosts(&json, lookup)?;
    let notify = crate::notify::parse(json.get("notify"))?;
    let limits = match json.get("limits") {
        None | Some(serde_json::Value::Null) => Limits::default(),
        Some(v) => {
            let bad = |why_owned: String| ConfigError::BadSection {
                key: "limits".into(),
                value: v.to_string(),
                why_owned,
            };
            let l = Limits::deserialize(v).map_err(|e| bad(e.to_string()))?;
            l.check().map_err(bad)?;
            l
        }
    };
    let store_unannounced = match lookup("CORTEX_STORE_NOTIFY").as_deref().map(str::trim) {
        None | Some("") | Some("on") => false,
        Some("off") => true,
        Some(v) => {
            return Err(ConfigError::BadSection {
                key: "CORTEX_STORE_NOTIFY".into(),
                value: v.to_string(),
                why_owned: "expected on or off".into(),
            });
        }
    };
    let store = match json.get("store") {
        None | Some(serde_json::Value::Null) => match lookup("CORTEX_STORE_URL") {
            Some(u) if !u.trim().is_empty() => Some(store_url("CORTEX_STORE_URL", u.trim())?),
            _ => None,
        },
        Some(serde_json::Value::String(u)) => Some(store_url("store", u)?),
        Some(v) => {
            return Err(ConfigError::BadSection {
                key: "store".into(),
                value: v.to_string(),
                why_owned: "expected a PostgreSQL URL as a string, like \"postgres://cortex@db.example:5432/cortex\"".into(),
            });
        }
    };
    Ok(HubSettings {
        engine,
        sweep_ms,
        device_loss_grace_ms,
        agent,
        llm,
        allowed_hosts,
        notify,
        limits,
        store,
        store_unannounced,
    })
}

/// A store URL as given under `key`: PostgreSQL's (`postgres://` or `postgresql://`). The
/// value is never repeated in an error: it may hold a password.
pub fn store_url(key: &str, url: &str) -> Result<String, ConfigError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(url.to_string());
    }
    Err(ConfigError::BadValue {
        key: key.to_string(),
        value: url.split(':').next().unwrap_or_default().to_string() + ":…",
        why: "the store is redb under the home unless this names a PostgreSQL database: postgres://USER@HOST:PORT/DATABASE (or ?host=/socket/dir)",
    })
}

/// `allowedHosts`: a list of host names (no scheme, port or path), else
/// `CORTEX_ALLOWED_HOSTS`, comma-separated.
fn allowed_hosts(
    json: &serde_json::Value,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>, ConfigError> {
    let (key, names): (&str, Vec<String>) = match json.get("allowedHosts") {
        None | Some(serde_json::Value::Null) => (
            "CORTEX_ALLOWED_HOSTS",
            lookup("CORTEX_ALLOWED_HOSTS")
                .unwrap_or_default()
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
        ),
        Some(v) => match v.as_array().and_then(|a| {
            a.iter()
                .map(|n| n.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
        }) {
            Some(names) => ("allowedHosts", names),
            None => {
                return Err(ConfigError::BadSection {
                    key: "allowedHosts".into(),
                    value: v.to_string(),
                    why_owned: "expected a list of host names, like [\"hub.example.com\"]".into(),
                });
            }
        },
    };
    for n in &names {
        let ok = !n.trim().is_empty()
            && n.len() <= 253
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
        if !ok {
            return Err(ConfigError::BadSection {
                key: key.into(),
                value: n.clone(),
                why_owned:
                    "a host name or address, without a scheme, port or path (like hub.example.com)"
                        .into(),
            });
        }
    }
    Ok(names)
}

/// The listen rule of the contract: loopback only.
pub fn check_loopback(addr: SocketAddr) -> Result<(), ConfigError> {
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(ConfigError::NotLoopback(addr))
    }
}

/// The operator token: `CORTEX_WEBHOOK_TOKEN`, else `$home/hub/token`, created (0600) on
/// first start and reused after.
pub fn operator_token(home: &Path, from_env: Option<String>) -> Result<String, ConfigError> {
    if let Some(t) = from_env.filter(|t| !t.trim().is_empty()) {
        return Ok(t.trim().to_string());
    }
    let path = home.join("hub").join("token");
    let io = |source| ConfigError::Io {
        path: path.display().to_string(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(s) if !s.trim().is_empty() => return Ok(s.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let token = crate::secret::random_hex(32);
    cortex_host::atomic::write_file(&path, format!("{token}\n").as_bytes(), 0o600).map_err(io)?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_json_wins_over_env_and_env_fills_gaps() {
        let dir = tempfile::tempdir().expect("tmp");
        let env = |k: &str| match k {
            "CORTEX_WAITPOINT_SWEEP_MS" => Some("250".to_string()),
            "CORTEX_WAITPOINT_MAX_WAKES_PER_HOUR" => Some("5".to_string()),
            _ => None,
        };
        let s = load_settings_with(dir.path(), &env).expect("load");
        assert_eq!(s.sweep_ms, 250);
        assert_eq!(s.engine.max_wakes_per_hour, 5);
        assert_eq!(s.engine.default_ttl_ms, 7 * DAY_MS);
        std::fs::write(
            dir.path().join("settings.json"),
            r#"{"waitpointMaxWakesPerHour": 3, "waitpointSweepMs": 0}"#,
        )
        .expect("write");
        let s = load_settings_with(dir.path(), &env).expect("load");
        assert_eq!(s.engine.max_wakes_per_hour, 3);
        assert_eq!(s.sweep_ms, 0, "0 turns the sweep off");
        std::fs::write(
            dir.path().join("settings.json"),
            r#"{"waitpointTtlMs": "soon"}"#,
        )
        .expect("write");
        assert!(load_settings_with(dir.path(), &env).is_err());
    }

    #[test]
    fn the_device_loss_grace_is_a_setting_with_an_environment_fallback() {
        let dir = tempfile::tempdir().expect("tmp");
        let none = |_: &str| None;
        let s = load_settings_with(dir.path(), &none).expect("load");
        assert_eq!(s.device_loss_grace_ms, DEFAULT_DEVICE_LOSS_GRACE_MS);
        let env = |k: &str| (k == "CORTEX_DEVICE_LOSS_GRACE_MS").then(|| "1500".to_string());
        let s = load_settings_with(dir.path(), &env).expect("load");
        assert_eq!(s.device_loss_grace_ms, 1_500);
        std::fs::write(
            dir.path().join("settings.json"),
            r#"{"deviceLossGraceMs": 30000}"#,
        )
        .expect("write");
        let s = load_settings_with(dir.path(), &env).expect("load");
        assert_eq!(s.device_loss_grace_ms, 30_000, "settings.json wins");
        std::fs::write(
            dir.path().join("settings.json"),
            r#"{"deviceLossGraceMs": 0}"#,
        )
        .expect("write");
        let e = load_settings_with(dir.path(), &env).expect_err("refused");
        assert!(e.to_string().contains("deviceLossGraceMs"), "{e}");
    }

    #[test]
    fn limits_default_when_absent_and_refuse_zero_and_unknown_keys() {
        let dir = tempfile::tempdir().expect("tmp");
        let none = |_: &str| None;
        let s = load_settings_with(dir.path(), &none).expect("load");
        assert_eq!(s.limits, Limits::default());
        std::fs::write(
            dir.path().join("settings.json"),
            r#"{"limits": {"toolCallsPerReply": 4, "timerMinDelayMs": 0}}"#,
        )
        .expect("write");
        let s = load_settings_with(dir.path(), &none).expect("load");
        assert_eq!(s.limits.tool_calls_per_reply, 4);
        assert_eq!(s.limits.timer_min_delay_ms, 0);
        assert_eq!(s.limits.reply_bytes, Limits::default().reply_bytes);
        for (body, says) in [
            (
                r#"{"limits": {"replyBytes": 0}}"#,
                "replyBytes must be above 0",
            ),
            (r#"{"limits": {"replyByte": 5}}"#, "unknown field"),
            (r#"{"limits": {"runsPerHour": -1}}"#, "invalid value"),
        ] {
            std::fs::write(dir.path().join("settings.json"), body).expect("write");
            let e = load_settings_with(dir.path(), &none).expect_err(body);
            assert!(e.to_string().contains(says), "{body}: {e}");
        }
    }

    #[test]
    fn only_loopback_listens() {
        assert!(check_loopback("127.0.0.1:3001".parse().expect("addr")).is_ok());
        assert!(check_loopback("[::1]:3001".parse().expect("addr")).is_ok());
        let e = check_loopback("0.0.0.0:3001".parse().expect("addr")).expect_err("refused");
        assert!(e.to_string().contains("loopback only"));
    }

    #[test]
    fn the_token_file_is_created_once_with_mode_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(dir.path().join("hub")).expect("mkdir");
        let a = operator_token(dir.path(), None).expect("token");
        let b = operator_token(dir.path(), None).expect("token");
        assert_eq!(a, b);
        let mode = std::fs::metadata(dir.path().join("hub/token"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            operator_token(dir.path(), Some("t0k".into())).expect("env"),
            "t0k"
        );
    }
}
