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

/// What a host tells the hub about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// What this agent can do: `spool`, `wait-pid`, `wait-file`, `wait-flock`, `exec`.
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Spool counts at connect time.
    #[serde(default)]
    pub spool: SpoolCounts,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The hub could not take it now (its store failed): keep it, send it again later.
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
    },
    /// The hub's answer for one spool file.
    Ack { name: String, outcome: FileOutcome },
    /// List the spool again (the sweep's backstop to inotify).
    Rescan,
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
            }),
            AgentFrame::File {
                name: "1-2-3.json".into(),
                body: "{}".into(),
            },
            AgentFrame::Status {
                spool: SpoolCounts::default(),
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
        ];
        for f in frames {
            assert_eq!(
                HubFrame::decode(&f.encode().expect("encode")).expect("decode"),
                f
            );
        }
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
