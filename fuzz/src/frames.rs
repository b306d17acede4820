//! Target `frames`: the mesh codec (`Frame::decode`/`encode` of `AgentFrame` and
//! `HubFrame`, MessagePack). Properties: any bytes decode to a frame or a typed
//! `FrameError` (`TooLarge` only over the cap); a decoded frame encodes and decodes back to
//! itself; a generated frame encodes (or is `TooLarge`) and decodes back exactly.

use cortex_protocol::mesh::{
    AgentFrame, FileCursor, FileOutcome, Frame, FrameError, Hello, HostFacts, HubFrame, LogCursor,
    MAX_MESSAGE_BYTES, SpoolCounts, WaitEnd, WaitSpec,
};
use proptest::prelude::*;

use crate::driver::{self, Budget, Outcome, Target};

pub const TARGET: Target = Target {
    name: "frames",
    check,
    fuzz,
    seeds,
};

/// Every property of one message, read both as an agent's and as a hub's frame.
pub fn check(bytes: &[u8]) -> Result<(), String> {
    decoded::<AgentFrame>(bytes)?;
    decoded::<HubFrame>(bytes)
}

fn decoded<F: Frame + PartialEq + std::fmt::Debug>(bytes: &[u8]) -> Result<(), String> {
    match F::decode(bytes) {
        Ok(f) => match f.encode() {
            // Re-encoding can legitimately grow (a compact array form read back named).
            Err(FrameError::TooLarge { .. }) => Ok(()),
            Err(e) => Err(format!("decoded {f:?}, which does not encode: {e}")),
            Ok(b) => round_trip(&f, &b),
        },
        Err(FrameError::TooLarge { bytes: n, max }) => {
            if n == bytes.len() && max == MAX_MESSAGE_BYTES && n > max {
                Ok(())
            } else {
                Err(format!(
                    "TooLarge {{ bytes: {n}, max: {max} }} for {} bytes",
                    bytes.len()
                ))
            }
        }
        Err(e @ FrameError::Malformed(_)) => {
            let _ = e.to_string();
            Ok(())
        }
    }
}

fn round_trip<F: Frame + PartialEq + std::fmt::Debug>(f: &F, b: &[u8]) -> Result<(), String> {
    match F::decode(b) {
        Ok(back) if back == *f => Ok(()),
        Ok(back) => Err(format!("round trip changed {f:?} into {back:?}")),
        Err(e) => Err(format!("{f:?} encodes to bytes it cannot decode: {e}")),
    }
}

/// A generated frame of either direction, or raw bytes.
#[derive(Debug, Clone)]
pub enum Case {
    Agent(AgentFrame),
    Hub(HubFrame),
    Bytes(Vec<u8>),
}

impl Case {
    /// The message on the wire, as the codec writes it before its size check (a frame
    /// over the cap is stored whole, so the corpus replays it as the `TooLarge` it is).
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            Case::Agent(f) => rmp_serde::to_vec_named(f).unwrap_or_default(),
            Case::Hub(f) => rmp_serde::to_vec_named(f).unwrap_or_default(),
            Case::Bytes(b) => b.clone(),
        }
    }
}

fn check_case(c: &Case) -> Result<(), String> {
    match c {
        Case::Agent(f) => generated(f)?,
        Case::Hub(f) => generated(f)?,
        Case::Bytes(_) => {}
    }
    check(&c.bytes())
}

fn generated<F: Frame + PartialEq + std::fmt::Debug>(f: &F) -> Result<(), String> {
    match f.encode() {
        Ok(b) => round_trip(f, &b),
        Err(FrameError::TooLarge { bytes, max }) if bytes > max => Ok(()),
        Err(e) => Err(format!("{f:?} does not encode: {e}")),
    }
}

/// Any text, weighted towards what frames carry (names, JSON, unicode).
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9_.-]{0,16}",
        2 => any::<String>(),
        1 => Just("{}".to_owned()),
        1 => Just(r#"{"id":"wp_1","secret":"s"}"#.to_owned()),
        1 => (0usize..3).prop_map(|i| "x".repeat([1_000, 65_536, MAX_MESSAGE_BYTES][i])),
    ]
}

fn texts() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec(text(), 0..4)
}

fn wait_spec() -> impl Strategy<Value = WaitSpec> {
    let cursor = (
        any::<bool>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<i64>(),
    )
        .prop_map(|(exists, dev, ino, size, mtime_ns)| FileCursor {
            exists,
            dev,
            ino,
            size,
            mtime_ns,
        });
    let log_cursor = (any::<bool>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
        |(exists, dev, ino, offset)| LogCursor {
            exists,
            dev,
            ino,
            offset,
        },
    );
    let leaf = prop_oneof![
        (any::<i32>(), any::<Option<u64>>(), any::<bool>()).prop_map(
            |(pid, start_time, must_exist)| WaitSpec::Pid {
                pid,
                start_time,
                must_exist
            }
        ),
        (text(), proptest::option::of(cursor), any::<Option<u64>>()).prop_map(
            |(path, cursor, silence_ms)| WaitSpec::File {
                path,
                cursor,
                silence_ms
            }
        ),
        text().prop_map(|path| WaitSpec::Flock { path }),
        (
            text(),
            text(),
            proptest::option::of(log_cursor),
            any::<Option<u64>>()
        )
            .prop_map(|(path, pattern, cursor, silence_ms)| WaitSpec::Log {
                path,
                pattern,
                cursor,
                silence_ms
            }),
    ];
    leaf.prop_recursive(1, 8, 8, |inner| {
        proptest::collection::vec(inner, 0..8).prop_map(|conditions| WaitSpec::Any { conditions })
    })
}

fn wait_end() -> impl Strategy<Value = WaitEnd> {
    prop_oneof![
        Just(WaitEnd::Fired),
        Just(WaitEnd::TimedOut),
        Just(WaitEnd::Broke)
    ]
}

fn counts() -> impl Strategy<Value = SpoolCounts> {
    (any::<u32>(), any::<u32>()).prop_map(|(pending, bad)| SpoolCounts { pending, bad })
}

pub fn agent_frame() -> impl Strategy<Value = AgentFrame> {
    let hello = (
        any::<u32>(),
        text(),
        text(),
        (text(), text(), any::<u32>(), texts()),
        texts(),
        counts(),
        texts(),
    )
        .prop_map(
            |(
                version,
                device,
                agent_version,
                (hostname, kernel, cpus, gpus),
                capabilities,
                spool,
                waits,
            )| {
                AgentFrame::Hello(Hello {
                    version,
                    device,
                    agent_version,
                    host: HostFacts {
                        hostname,
                        kernel,
                        cpus,
                        gpus,
                    },
                    capabilities,
                    spool,
                    waits,
                })
            },
        );
    prop_oneof![
        hello,
        (text(), text()).prop_map(|(name, body)| AgentFrame::File { name, body }),
        counts().prop_map(|spool| AgentFrame::Status { spool }),
        (text(), text(), proptest::option::of(wait_spec())).prop_map(
            |(wait_id, captured, resume)| AgentFrame::WaitArmed {
                wait_id,
                captured,
                resume
            }
        ),
        (text(), wait_end(), text(), text()).prop_map(|(wait_id, outcome, payload, message)| {
            AgentFrame::WaitDone {
                wait_id,
                outcome,
                payload,
                message,
            }
        }),
    ]
}

pub fn hub_frame() -> impl Strategy<Value = HubFrame> {
    let outcome = prop_oneof![
        Just(FileOutcome::Accepted),
        Just(FileOutcome::Duplicate),
        Just(FileOutcome::Resolved),
        text().prop_map(|reason| FileOutcome::Refused { reason }),
        text().prop_map(|reason| FileOutcome::Retry { reason }),
    ];
    prop_oneof![
        (
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            any::<u64>(),
            texts()
        )
            .prop_map(
                |(version, ping_interval_ms, window, max_message_bytes, capabilities)| {
                    HubFrame::Welcome {
                        version,
                        ping_interval_ms,
                        window,
                        max_message_bytes,
                        capabilities,
                    }
                }
            ),
        (text(), outcome).prop_map(|(name, outcome)| HubFrame::Ack { name, outcome }),
        Just(HubFrame::Rescan),
        (text(), wait_spec(), any::<u64>(), any::<u64>()).prop_map(
            |(wait_id, spec, timeout_ms, deadline_ms)| HubFrame::WaitArm {
                wait_id,
                spec,
                timeout_ms,
                deadline_ms
            }
        ),
        text().prop_map(|wait_id| HubFrame::WaitCancel { wait_id }),
        text().prop_map(|wait_id| HubFrame::WaitAck { wait_id }),
    ]
}

/// Valid messages of each direction, the seeds when the corpus is empty.
pub fn seeds() -> Vec<Vec<u8>> {
    let agent = [
        AgentFrame::File {
            name: "1-2-3.json".into(),
            body: r#"{"id":"wp_1","secret":"s"}"#.into(),
        },
        AgentFrame::Status {
            spool: SpoolCounts { pending: 3, bad: 1 },
        },
        AgentFrame::WaitDone {
            wait_id: "wp_1".into(),
            outcome: WaitEnd::Fired,
            payload: "{}".into(),
            message: "pid 4242 (sleep) exited".into(),
        },
    ];
    let hub = [
        HubFrame::Ack {
            name: "1-2-3.json".into(),
            outcome: FileOutcome::Refused {
                reason: "unknown id".into(),
            },
        },
        HubFrame::WaitArm {
            wait_id: "wp_1".into(),
            spec: WaitSpec::File {
                path: "/tmp/x".into(),
                cursor: Some(FileCursor::absent()),
                silence_ms: None,
            },
            timeout_ms: 60_000,
            deadline_ms: 1_700_000_000_000,
        },
        HubFrame::Rescan,
    ];
    let mut out: Vec<Vec<u8>> = agent.iter().filter_map(|f| f.encode().ok()).collect();
    out.extend(hub.iter().filter_map(|f| f.encode().ok()));
    out
}

pub fn strategy() -> impl Strategy<Value = Case> {
    prop_oneof![
        3 => agent_frame().prop_map(Case::Agent),
        3 => hub_frame().prop_map(Case::Hub),
        3 => driver::mutated(driver::corpus_inputs(TARGET.name), seeds()).prop_map(Case::Bytes),
        2 => proptest::collection::vec(any::<u8>(), 0..256).prop_map(Case::Bytes),
        1 => (MAX_MESSAGE_BYTES - 2..MAX_MESSAGE_BYTES + 2)
            .prop_map(|n| Case::Bytes(vec![0x90; n])),
    ]
}

fn fuzz(budget: Budget, known: Vec<String>) -> Outcome {
    driver::fuzz(
        TARGET.name,
        strategy(),
        check_case,
        Case::bytes,
        budget,
        known,
    )
}
