//! The device mesh: frames between the hub and a device agent, MessagePack (rmp-serde)
//! in WebSocket binary frames on `/mesh/v1`. Listed, with their meaning, in
//! `docs/protocol.md`.
//!
//! The link is versioned by the agent's [`Hello`]; the hub answers [`HubFrame::Welcome`]
//! with the intervals and limits both sides then keep. An unknown or oversized frame
//! closes the link with a reason; it never crashes either side.

use serde::{Deserialize, Serialize};

/// The mesh protocol version this build speaks.
pub const MESH_VERSION: u32 = 1;
/// The WebSocket endpoint on the hub's mesh listener.
pub const MESH_PATH: &str = "/mesh/v1";
/// Upgrade request header naming the device (the token goes in `Authorization: Bearer`).
pub const DEVICE_HEADER: &str = "x-cortex-device";
/// Largest WebSocket message either side accepts: a 64 KB spool file and its envelope.
pub const MAX_MESSAGE_BYTES: usize = 128 * 1024;
/// Default keepalive interval (under the 60 s idle limit of common proxies).
pub const DEFAULT_PING_MS: u64 = 20_000;
/// Spool files a device may have in flight without an ack.
pub const DEFAULT_WINDOW: u32 = 64;
/// Remote waits one device may hold at once. Bounds the hello, which lists them: 4,096
/// waitpoint ids fit well inside [`MAX_MESSAGE_BYTES`].
pub const MAX_WAITS_PER_DEVICE: usize = 4096;

/// Capabilities an agent announces in its [`Hello`] for the remote waits it runs; the hub
/// sends a [`HubFrame::WaitArm`] of a kind only to an agent that announced it.
pub const CAP_WAIT_PID: &str = "wait-pid";
pub const CAP_WAIT_FILE: &str = "wait-file";
pub const CAP_WAIT_FLOCK: &str = "wait-flock";
/// A line matching a pattern appended to a log ([`WaitSpec::Log`]).
pub const CAP_WAIT_LOG: &str = "wait-log";
/// `silence_ms` on file and log waits: fires when the file stopped growing.
pub const CAP_WAIT_SILENCE: &str = "wait-silence";
/// Several conditions in one wait, the first that holds fires it ([`WaitSpec::Any`]).
pub const CAP_WAIT_ANY: &str = "wait-any";
/// `must_exist` on a pid wait: a pid not running at arm time breaks the wait. An agent
/// without it would ignore the field and fire, so the hub sends such a wait only to an
/// agent that announces this.
pub const CAP_WAIT_PID_MUST_EXIST: &str = "wait-pid-must-exist";
/// Announced only by an agent started with `--allow-exec`: it takes [`HubFrame::Exec`].
/// The hub sends none to an agent without it.
pub const CAP_EXEC: &str = "exec";
/// The hub's capability (in its welcome) to take [`AgentFrame::WaitArmed`] and
/// [`AgentFrame::WaitDone`]; an agent sends neither to a hub without it.
pub const HUB_CAP_WAITS: &str = "waits";

/// What a host tells the hub about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct HostFacts {
    pub hostname: String,
    pub kernel: String,
    pub cpus: u32,
    /// GPU names, from `nvidia-smi` or `/proc/driver/nvidia`; empty when none are seen.
    #[serde(default)]
    pub gpus: Vec<String>,
}

/// The agent's first frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub version: u32,
    pub device: String,
    pub agent_version: String,
    pub host: HostFacts,
    /// What this agent can do: `spool`, `wait-pid`, `wait-file`, `wait-flock`, `wait-log`,
    /// `wait-silence`, `wait-any`, `wait-pid-must-exist`, `exec`.
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Spool counts at connect time.
    #[serde(default)]
    pub spool: SpoolCounts,
    /// The remote waits this agent holds (waitpoint ids): armed, or ended with an outcome
    /// the hub has not acknowledged yet. The hub reconciles against it after every connect.
    #[serde(default)]
    pub waits: Vec<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct SpoolCounts {
    pub pending: u32,
    pub bad: u32,
}

/// Device → hub.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentFrame {
    Hello(Hello),
    /// A spool file: its name (the signal's identity on this device) and its text.
    File {
        name: String,
        body: String,
    },
    /// The spool's counts changed.
    Status {
        spool: SpoolCounts,
    },
    /// The answer to [`HubFrame::WaitArm`]: the wait is armed (or was already).
    WaitArmed {
        wait_id: String,
        /// What arming found, as a JSON object (a pid's command and start time, a file's
        /// cursor, whether a lock was free).
        captured: String,
        /// The spec to re-arm with after a restart: the pid pinned to its start time, the
        /// file to its arm-time cursor. The hub keeps it and sends it in later arms.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resume: Option<WaitSpec>,
    },
    /// A remote wait ended. Sent again on every link until the hub's [`HubFrame::WaitAck`].
    WaitDone {
        wait_id: String,
        outcome: WaitEnd,
        /// The wait's payload, a JSON object (`{}` when it did not fire).
        payload: String,
        /// One line for people: what happened (`pid 4242 (sleep) exited`).
        message: String,
    },
    /// The answer to [`HubFrame::Exec`]: the command runs (or ran) as `pid`.
    ExecStarted {
        exec_id: String,
        pid: i32,
        /// Field 22 of `/proc/PID/stat` (clock ticks since boot), so a pid wait can be
        /// pinned to this process ([`WaitSpec::Pid`]'s `start_time`).
        start_time: u64,
        /// The absolute path of the run's log on the device (stdout and stderr).
        log: String,
        /// This `exec_id` had been started before and this is that same run: nothing new
        /// was started.
        already: bool,
    },
    /// The answer to [`HubFrame::Exec`]: nothing was started, for this reason (one line,
    /// for the model and for people).
    ExecRefused {
        exec_id: String,
        reason: String,
    },
}

/// What a wait waits for: a remote wait's spec on the wire, what the agent persists in its
/// `waits.json`, and what the wait library (`cortex_host::wait`) arms, local or remote.
/// Built from what people and models write by [`crate::waits`], the one parser.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WaitSpec {
    /// The process `pid` exits; with `start_time` (field 22 of `/proc/PID/stat`), only the
    /// process that started then. With `must_exist`, a process not running when the wait
    /// is armed breaks it (`cortex wait pid --must-exist`) instead of firing at once; a
    /// resume spec never carries it (the process was running at the first arm).
    Pid {
        pid: i32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        start_time: Option<u64>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        must_exist: bool,
    },
    /// The file at `path` (absolute, on the device) is written; with `cursor`, fires at
    /// once if it changed since. With `silence_ms`, it fires instead when the file has not
    /// grown for that long (a writer gone quiet), and a write is no event.
    File {
        path: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cursor: Option<FileCursor>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        silence_ms: Option<u64>,
    },
    /// The `flock(2)` lock on the file at `path` (absolute, on the device) is free.
    Flock { path: String },
    /// A line matching `pattern` (a regular expression, `regex` crate syntax) is appended
    /// to the file at `path`: from `cursor` (where an earlier arm left off), else from the
    /// file's end at arm time. Follows the name across a rotation by rename and a
    /// truncation. With `silence_ms`, it also fires when the file has not grown for that
    /// long, whichever comes first.
    Log {
        path: String,
        #[serde(rename = "match")]
        pattern: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cursor: Option<LogCursor>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        silence_ms: Option<u64>,
    },
    /// Whichever of `conditions` holds first (2 to [`crate::waits::MAX_CONDITIONS`], none an
    /// `any`); the others are dropped then.
    Any { conditions: Vec<WaitSpec> },
}

impl WaitSpec {
    /// `pid`, `file`, `flock`, `log` or `any`.
    pub fn kind(&self) -> &'static str {
        match self {
            WaitSpec::Pid { .. } => "pid",
            WaitSpec::File { .. } => "file",
            WaitSpec::Flock { .. } => "flock",
            WaitSpec::Log { .. } => "log",
            WaitSpec::Any { .. } => "any",
        }
    }

    /// The capability an agent must announce for this kind of wait (see
    /// [`WaitSpec::capabilities`] for all it needs).
    pub fn capability(&self) -> &'static str {
        match self {
            WaitSpec::Pid { .. } => CAP_WAIT_PID,
            WaitSpec::File { .. } => CAP_WAIT_FILE,
            WaitSpec::Flock { .. } => CAP_WAIT_FLOCK,
            WaitSpec::Log { .. } => CAP_WAIT_LOG,
            WaitSpec::Any { .. } => CAP_WAIT_ANY,
        }
    }

    /// Every capability an agent must announce to run this wait: its kind's, `wait-silence`
    /// for a silence, `wait-pid-must-exist` for a pid that must exist, and each
    /// condition's for an `any`. Sorted, no repeats.
    pub fn capabilities(&self) -> Vec<&'static str> {
        let mut out = vec![self.capability()];
        match self {
            WaitSpec::File {
                silence_ms: Some(_),
                ..
            }
            | WaitSpec::Log {
                silence_ms: Some(_),
                ..
            } => out.push(CAP_WAIT_SILENCE),
            WaitSpec::Pid {
                must_exist: true, ..
            } => out.push(CAP_WAIT_PID_MUST_EXIST),
            WaitSpec::Any { conditions } => {
                for c in conditions {
                    out.extend(c.capabilities());
                }
            }
            _ => {}
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The silence bound of a file or log wait.
    pub fn silence_ms(&self) -> Option<u64> {
        match self {
            WaitSpec::File { silence_ms, .. } | WaitSpec::Log { silence_ms, .. } => *silence_ms,
            _ => None,
        }
    }

    /// The file a file, flock or log wait is about.
    pub fn path(&self) -> Option<&str> {
        match self {
            WaitSpec::File { path, .. } | WaitSpec::Flock { path } | WaitSpec::Log { path, .. } => {
                Some(path)
            }
            _ => None,
        }
    }

    /// What is waited for, for people: `pid 4242`, `a write to /x`, `the lock on /x`,
    /// `a line matching /nan/ in /x`, `/x silent for 20m`, `the first of: …`.
    pub fn describe(&self) -> String {
        match self {
            WaitSpec::Pid { pid, .. } => format!("pid {pid}"),
            WaitSpec::File {
                path,
                silence_ms: Some(ms),
                ..
            } => format!(
                "{path} silent for {}",
                crate::duration::format_duration_ms(*ms)
            ),
            WaitSpec::File { path, .. } => format!("a write to {path}"),
            WaitSpec::Flock { path } => format!("the lock on {path}"),
            WaitSpec::Log {
                path,
                pattern,
                silence_ms,
                ..
            } => {
                let mut s = format!("a line matching /{pattern}/ in {path}");
                if let Some(ms) = silence_ms {
                    s.push_str(&format!(
                        " (or {} of silence)",
                        crate::duration::format_duration_ms(*ms)
                    ));
                }
                s
            }
            WaitSpec::Any { conditions } => {
                let parts: Vec<String> = conditions.iter().map(WaitSpec::describe).collect();
                format!("the first of: {}", parts.join("; "))
            }
        }
    }
}

/// A log wait's position: the file's identity (device and inode) and the byte offset up to
/// which it was read. A re-arm from it reads on from `offset` in the same file, or from the
/// start of a file that replaced it (rotated) or was cut below it (truncated), so it
/// neither misses a line nor reports one again. `exists: false`: the file was not there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogCursor {
    pub exists: bool,
    #[serde(default)]
    pub dev: u64,
    #[serde(default)]
    pub ino: u64,
    #[serde(default)]
    pub offset: u64,
}

/// A file wait's position: what the file was when the wait was armed. Compared whole;
/// `exists: false` (all else zero) for a file that was not there. Persisted by the agent
/// (`waits.json`) and by `cortex wait file --cursor`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileCursor {
    pub exists: bool,
    #[serde(default)]
    pub dev: u64,
    #[serde(default)]
    pub ino: u64,
    #[serde(default)]
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    #[serde(default)]
    pub mtime_ns: i64,
}

impl FileCursor {
    /// The cursor of a file that is not there.
    pub fn absent() -> Self {
        FileCursor::default()
    }

    /// Has the file been written (or created, or replaced) since `old`? A file that went
    /// away is not a write: a deleted file reports nothing until it is back.
    pub fn changed_since(&self, old: &FileCursor) -> bool {
        self.exists && self != old
    }
}

/// How a remote wait ended; a `cortex wait` exits 0 when it fired, 1 when it timed out,
/// 2 when it broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitEnd {
    /// The condition holds.
    Fired,
    /// The bound passed and nothing happened.
    TimedOut,
    /// The wait failed and can no longer tell (a path gone, an error, the device lost).
    Broke,
}

impl WaitEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            WaitEnd::Fired => "fired",
            WaitEnd::TimedOut => "timed_out",
            WaitEnd::Broke => "broke",
        }
    }

    /// The exit status of a `cortex wait` that ended so: 0 fired, 1 timed out, 2 broke.
    pub fn exit_code(self) -> u8 {
        match self {
            WaitEnd::Fired => 0,
            WaitEnd::TimedOut => 1,
            WaitEnd::Broke => 2,
        }
    }

    pub fn parse(s: &str) -> Option<WaitEnd> {
        match s {
            "fired" => Some(WaitEnd::Fired),
            "timed_out" => Some(WaitEnd::TimedOut),
            "broke" => Some(WaitEnd::Broke),
            _ => None,
        }
    }
}

/// What the hub did with a spool file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum FileOutcome {
    /// Recorded durably: delete the file.
    Accepted,
    /// Already recorded under this identity: delete the file.
    Duplicate,
    /// The waitpoint had already resolved: not an error, delete the file.
    Resolved,
    /// Refused for good (malformed, unknown id, wrong secret, missing or unlisted member):
    /// park it under `bad/` with this reason.
    Refused { reason: String },
    /// The hub could not take it now (its store failed, or the device's miss budget is
    /// spent): keep it, send it again later.
    Retry { reason: String },
}

/// Hub → device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HubFrame {
    /// The answer to [`Hello`]: the link is up. The agent resets its backoff only now.
    Welcome {
        version: u32,
        /// Send a WebSocket ping this often; a link silent for two intervals is dead.
        ping_interval_ms: u64,
        /// Spool files the agent may have unacknowledged at once.
        window: u32,
        max_message_bytes: u64,
        /// What this hub takes beyond spool files: `waits` ([`HUB_CAP_WAITS`]).
        #[serde(default)]
        capabilities: Vec<String>,
    },
    /// The hub's answer for one spool file.
    Ack { name: String, outcome: FileOutcome },
    /// List the spool again (the sweep's backstop to inotify).
    Rescan,
    /// Arm a remote wait (only of a kind the agent announced). `wait_id` is the waitpoint's
    /// id and the wait's identity on both sides: an agent that already holds it arms
    /// nothing new and answers [`AgentFrame::WaitArmed`] again.
    WaitArm {
        wait_id: String,
        spec: WaitSpec,
        /// The bound left when the hub sent this, relative, so the two machines' clocks
        /// need not agree; past it the agent reports `timed_out`.
        timeout_ms: u64,
        /// The same bound on the hub's clock (ms since the epoch), for logs.
        deadline_ms: u64,
    },
    /// Drop the wait (its waitpoint ended, or was cancelled); no answer.
    WaitCancel { wait_id: String },
    /// The outcome of [`AgentFrame::WaitDone`] is recorded (or was already): forget it.
    WaitAck { wait_id: String },
    /// Start a command, detached from the agent (only to an agent that announced
    /// [`CAP_EXEC`]). `exec_id` is the run's identity: an agent that started it already
    /// starts nothing and answers [`AgentFrame::ExecStarted`] with `already: true`. The
    /// answer is [`AgentFrame::ExecStarted`] or [`AgentFrame::ExecRefused`].
    Exec(ExecRequest),
}

/// A command the hub asks a device to start, detached from its agent (`HubFrame::Exec`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// The run's identity on the device (a file name: 1-128 of `A-Za-z0-9_.-`, not
    /// starting with a dot). Asking again with the same id never starts a second run.
    pub exec_id: String,
    /// The program and its arguments; with `shell`, exactly one string: the script
    /// for `/bin/sh -c`.
    pub argv: Vec<String>,
    pub shell: bool,
    /// The working directory on the device (absolute); `None`: the agent's home.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Added to the agent's environment for this run (e.g. `CORTEX_SIGNAL_ID`,
    /// `CORTEX_SIGNAL_SECRET`). May hold secrets: never logged, on either side.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// How long the hub waits for the answer, relative: an agent that gets to the frame
    /// later than that refuses it rather than start a job the hub gave up on.
    pub timeout_ms: u64,
}

impl ExecRequest {
    /// `timeout_ms` as a duration.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.timeout_ms)
    }
}

/// Why the hub refuses or ends a link; sent as the WebSocket close reason, and for a
/// refused upgrade as the HTTP body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloseReason {
    pub code: String,
    pub message: String,
    /// Don't reconnect before this many milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

/// Encoding errors of a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    TooLarge { bytes: usize, max: usize },
    Malformed(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::TooLarge { bytes, max } => {
                write!(f, "frame of {bytes} bytes is over the {max}-byte cap")
            }
            FrameError::Malformed(e) => write!(f, "malformed frame: {e}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Frames to and from bytes (one WebSocket binary message each).
pub trait Frame: Serialize + for<'de> Deserialize<'de> + Sized {
    fn encode(&self) -> Result<Vec<u8>, FrameError> {
        let b = rmp_serde::to_vec_named(self).map_err(|e| FrameError::Malformed(e.to_string()))?;
        if b.len() > MAX_MESSAGE_BYTES {
            return Err(FrameError::TooLarge {
                bytes: b.len(),
                max: MAX_MESSAGE_BYTES,
            });
        }
        Ok(b)
    }

    fn decode(bytes: &[u8]) -> Result<Self, FrameError> {
        if bytes.len() > MAX_MESSAGE_BYTES {
            return Err(FrameError::TooLarge {
                bytes: bytes.len(),
                max: MAX_MESSAGE_BYTES,
            });
        }
        rmp_serde::from_slice(bytes).map_err(|e| FrameError::Malformed(e.to_string()))
    }
}

impl Frame for AgentFrame {}
impl Frame for HubFrame {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let frames = vec![
            AgentFrame::Hello(Hello {
                version: MESH_VERSION,
                device: "gpu1".into(),
                agent_version: "0.1.0".into(),
                host: HostFacts {
                    hostname: "box".into(),
                    kernel: "6.1".into(),
                    cpus: 2,
                    gpus: vec!["A100".into()],
                },
                capabilities: vec!["spool".into()],
                spool: SpoolCounts { pending: 3, bad: 1 },
                waits: vec!["wp_1".into()],
            }),
            AgentFrame::File {
                name: "1-2-3.json".into(),
                body: "{}".into(),
            },
            AgentFrame::Status {
                spool: SpoolCounts::default(),
            },
            AgentFrame::WaitArmed {
                wait_id: "wp_1".into(),
                captured: "{}".into(),
                resume: Some(WaitSpec::Pid {
                    pid: 7,
                    start_time: Some(99),
                    must_exist: false,
                }),
            },
            AgentFrame::WaitDone {
                wait_id: "wp_1".into(),
                outcome: WaitEnd::TimedOut,
                payload: "{}".into(),
                message: "timed out".into(),
            },
            AgentFrame::ExecStarted {
                exec_id: "ex_1".into(),
                pid: 4242,
                start_time: 123_456,
                log: "/home/u/.cortex/exec/ex_1.log".into(),
                already: true,
            },
            AgentFrame::ExecRefused {
                exec_id: "ex_2".into(),
                reason: "argv is empty".into(),
            },
        ];
        for f in frames {
            assert_eq!(
                AgentFrame::decode(&f.encode().expect("encode")).expect("decode"),
                f
            );
        }
        let frames = vec![
            HubFrame::Welcome {
                version: 1,
                ping_interval_ms: 20_000,
                window: 64,
                max_message_bytes: 1,
                capabilities: vec![HUB_CAP_WAITS.into()],
            },
            HubFrame::Ack {
                name: "a.json".into(),
                outcome: FileOutcome::Refused { reason: "x".into() },
            },
            HubFrame::Ack {
                name: "a.json".into(),
                outcome: FileOutcome::Accepted,
            },
            HubFrame::Rescan,
            HubFrame::WaitArm {
                wait_id: "wp_1".into(),
                spec: WaitSpec::File {
                    path: "/x".into(),
                    cursor: Some(FileCursor {
                        exists: true,
                        dev: 1,
                        ino: 2,
                        size: 3,
                        mtime_ns: -4,
                    }),
                    silence_ms: Some(60_000),
                },
                timeout_ms: 1,
                deadline_ms: 2,
            },
            HubFrame::WaitArm {
                wait_id: "wp_3".into(),
                spec: WaitSpec::Any {
                    conditions: vec![
                        WaitSpec::Pid {
                            pid: 7,
                            start_time: None,
                            must_exist: false,
                        },
                        WaitSpec::Log {
                            path: "/r/t.log".into(),
                            pattern: "nan|Traceback".into(),
                            cursor: Some(LogCursor {
                                exists: true,
                                dev: 1,
                                ino: 2,
                                offset: 3,
                            }),
                            silence_ms: None,
                        },
                    ],
                },
                timeout_ms: 1,
                deadline_ms: 2,
            },
            HubFrame::WaitArm {
                wait_id: "wp_2".into(),
                spec: WaitSpec::Flock { path: "/l".into() },
                timeout_ms: 1,
                deadline_ms: 2,
            },
            HubFrame::WaitCancel {
                wait_id: "wp_1".into(),
            },
            HubFrame::WaitAck {
                wait_id: "wp_1".into(),
            },
            HubFrame::Exec(ExecRequest {
                exec_id: "ex_1".into(),
                argv: vec!["python3".into(), "train.py".into()],
                shell: false,
                cwd: Some("/data".into()),
                env: vec![("CORTEX_SIGNAL_ID".into(), "wp_1".into())],
                timeout_ms: 15_000,
            }),
            HubFrame::Exec(ExecRequest {
                exec_id: "ex_2".into(),
                argv: vec!["sleep 1 && echo hi".into()],
                shell: true,
                cwd: None,
                env: Vec::new(),
                timeout_ms: 1,
            }),
        ];
        for f in frames {
            assert_eq!(
                HubFrame::decode(&f.encode().expect("encode")).expect("decode"),
                f
            );
        }
    }

    /// An exec frame is flat on the wire: its request's fields beside `type`.
    #[test]
    fn an_exec_frame_is_flat() {
        let wire = serde_json::json!({
            "type": "exec", "exec_id": "ex_1", "argv": ["true"], "shell": false, "timeout_ms": 5,
        });
        let bytes = rmp_serde::to_vec_named(&wire).expect("msgpack");
        let f = HubFrame::decode(&bytes).expect("decode");
        let HubFrame::Exec(req) = &f else {
            panic!("not an exec: {f:?}");
        };
        assert_eq!((req.cwd.as_deref(), req.env.len()), (None, 0));
        assert_eq!(req.timeout(), std::time::Duration::from_millis(5));
        let mut back = serde_json::to_value(&f).expect("json");
        assert_eq!(back["env"].take(), serde_json::json!([]));
        back.as_object_mut().expect("object").remove("env");
        assert_eq!(back, wire);
    }

    /// A hello and a welcome of a build before remote waits still decode: the new fields
    /// default to empty.
    #[test]
    fn older_hellos_and_welcomes_decode() {
        #[derive(Serialize)]
        #[serde(tag = "type", rename_all = "snake_case")]
        enum Old {
            Hello {
                version: u32,
                device: String,
                agent_version: String,
                host: HostFacts,
            },
            Welcome {
                version: u32,
                ping_interval_ms: u64,
                window: u32,
                max_message_bytes: u64,
            },
        }
        let hello = rmp_serde::to_vec_named(&Old::Hello {
            version: 1,
            device: "d".into(),
            agent_version: "0.0.9".into(),
            host: HostFacts::default(),
        })
        .expect("encode");
        match AgentFrame::decode(&hello).expect("decode") {
            AgentFrame::Hello(h) => assert!(h.waits.is_empty() && h.capabilities.is_empty()),
            other => panic!("{other:?}"),
        }
        let welcome = rmp_serde::to_vec_named(&Old::Welcome {
            version: 1,
            ping_interval_ms: 1,
            window: 1,
            max_message_bytes: 1,
        })
        .expect("encode");
        match HubFrame::decode(&welcome).expect("decode") {
            HubFrame::Welcome { capabilities, .. } => assert!(capabilities.is_empty()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_full_hello_of_waits_fits_in_a_message() {
        let hello = AgentFrame::Hello(Hello {
            version: MESH_VERSION,
            device: "d".repeat(64),
            agent_version: "v".repeat(64),
            host: HostFacts::default(),
            capabilities: vec!["spool".into()],
            spool: SpoolCounts::default(),
            waits: (0..MAX_WAITS_PER_DEVICE)
                .map(|i| format!("wp_{i:012x}"))
                .collect(),
        });
        assert!(hello.encode().is_ok());
    }

    #[test]
    fn wait_ends_parse_and_map_to_exit_codes() {
        for e in [WaitEnd::Fired, WaitEnd::TimedOut, WaitEnd::Broke] {
            assert_eq!(WaitEnd::parse(e.as_str()), Some(e));
            let json = serde_json::to_string(&e).expect("ser");
            assert_eq!(json, format!("\"{}\"", e.as_str()));
        }
        assert_eq!(WaitEnd::TimedOut.exit_code(), 1);
        assert_eq!(WaitEnd::parse("expired"), None);
    }

    #[test]
    fn unknown_and_oversized_frames_are_errors_not_panics() {
        assert!(matches!(
            AgentFrame::decode(b"\x81\xa4type\xa5bogus"),
            Err(FrameError::Malformed(_))
        ));
        assert!(matches!(
            HubFrame::decode(&[0xc1]),
            Err(FrameError::Malformed(_))
        ));
        assert!(matches!(
            AgentFrame::decode(&vec![0; MAX_MESSAGE_BYTES + 1]),
            Err(FrameError::TooLarge { .. })
        ));
        let big = AgentFrame::File {
            name: "x".into(),
            body: "y".repeat(MAX_MESSAGE_BYTES),
        };
        assert!(matches!(big.encode(), Err(FrameError::TooLarge { .. })));
    }
}
