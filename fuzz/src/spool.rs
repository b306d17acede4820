//! Target `spool`: the bytes a job drops into a spool directory, through what the hub's
//! local spool and the device agent do with them: `cortex_host::spool::Spool::read` (the
//! file's bytes, or a typed `Refusal`), `SignalRequest::parse`, the agent's UTF-8 check and
//! `AgentFrame::File` encoding, the hub's parse of that frame's body, then `remove` or
//! `park` with the refusal's text. Properties: no panic; a plain file is read exactly (or
//! refused as `TooLarge` only over the cap); the hub's two ways in agree; the file leaves
//! the spool by the caller's call and by no other way.

use cortex_host::spool::{Refusal, Spool};
use cortex_protocol::SignalRequest;
use cortex_protocol::mesh::{AgentFrame, Frame, FrameError};
use cortex_protocol::signal::MAX_BODY_BYTES;
use proptest::prelude::*;

use crate::driver::{self, Budget, Outcome, Target};

pub const TARGET: Target = Target {
    name: "spool",
    check,
    fuzz,
    seeds: crate::signal::seeds,
};

/// The name a job would give the file (`<time>-<pid>-<rand>.json`).
const NAME: &str = "1733000000-4242-7.json";

/// Every property of one dropped file.
pub fn check(bytes: &[u8]) -> Result<(), String> {
    let tmp = tempfile::tempdir().map_err(|e| format!("setup: a temp dir: {e}"))?;
    let spool = Spool::open(&tmp.path().join("signals")).map_err(|e| format!("setup: {e}"))?;
    std::fs::write(spool.path().join(NAME), bytes).map_err(|e| format!("setup: {e}"))?;
    let listed = spool.list().map_err(|e| format!("list: {e}"))?;
    if listed != [NAME] {
        return Err(format!(
            "the spool lists {listed:?}, not the one file dropped"
        ));
    }
    let read = match spool.read(NAME) {
        Ok(read) => read,
        Err(Refusal::TooLarge { bytes: n }) => {
            if n != bytes.len() as u64 || bytes.len() <= MAX_BODY_BYTES {
                return Err(format!(
                    "TooLarge {{ bytes: {n} }} for a file of {} bytes",
                    bytes.len()
                ));
            }
            return leaves(
                &spool,
                bytes,
                Err(Refusal::TooLarge { bytes: n }.to_string()),
            );
        }
        Err(other) => return Err(format!("a plain file of the owner is refused: {other}")),
    };
    if read != bytes {
        return Err(format!(
            "read {} bytes back from a file of {} bytes, not the same",
            read.len(),
            bytes.len()
        ));
    }
    // The hub's local spool: the bytes straight to the parser, whose properties hold.
    crate::signal::check(&read)?;
    let parsed = SignalRequest::parse(&read);
    let verdict = match &parsed {
        Ok(req) => device_link(&read, req),
        Err(e) => Err(e.to_string()),
    };
    match verdict {
        Ok(()) => leaves(&spool, bytes, Ok(())),
        Err(reason) if parsed.is_err() => leaves(&spool, bytes, Err(reason)),
        Err(violation) => Err(violation),
    }
}

/// What a device agent does with a file the parser accepted, and the hub with its frame.
fn device_link(read: &[u8], req: &SignalRequest) -> Result<(), String> {
    // JSON the parser accepted is UTF-8 text: the agent's own check never refuses it.
    let body = String::from_utf8(read.to_vec())
        .map_err(|e| format!("the parser accepted bytes that are not UTF-8 ({e})"))?;
    let frame = AgentFrame::File {
        name: NAME.to_owned(),
        body,
    };
    let wire = match frame.encode() {
        Ok(b) => b,
        // The agent parks such a file with a reason; a body under the body cap never
        // makes a frame over the frame cap.
        Err(FrameError::TooLarge { bytes, max }) => {
            return Err(format!(
                "a {}-byte spool file makes a {bytes}-byte frame, over {max}",
                read.len()
            ));
        }
        Err(e) => return Err(format!("the file's frame does not encode: {e}")),
    };
    let AgentFrame::File { body, .. } =
        AgentFrame::decode(&wire).map_err(|e| format!("the file's frame does not decode: {e}"))?
    else {
        return Err("the file's frame decodes as another frame".into());
    };
    // The hub's link parses the frame's body: the same request as from the hub's spool.
    match SignalRequest::parse(body.as_bytes()) {
        Ok(r) if r == *req => Ok(()),
        Ok(r) => Err(format!("the device link parsed {r:?}, the spool {req:?}")),
        Err(e) => Err(format!(
            "the device link refused what the spool accepted: {e}"
        )),
    }
}

/// The file leaves the spool as the callers make it: removed once accepted, parked with
/// the reason when refused; after either, the spool is empty. Parking syncs its reason
/// file (milliseconds, against microseconds for the rest), so one refused input in
/// eight (by content, the same on replay) is parked and the others removed.
fn leaves(spool: &Spool, bytes: &[u8], verdict: Result<(), String>) -> Result<(), String> {
    let park = match &verdict {
        Err(reason) if bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b)) % 8 == 0 => {
            spool
                .park(NAME, reason)
                .map_err(|e| format!("park: {e}"))?
                .ok_or("park found no file to park")?;
            true
        }
        _ => {
            spool.remove(NAME).map_err(|e| format!("remove: {e}"))?;
            false
        }
    };
    let left = spool.list().map_err(|e| format!("list: {e}"))?;
    if !left.is_empty() {
        return Err(format!("the spool still lists {left:?}"));
    }
    let counts = spool.counts().map_err(|e| format!("counts: {e}"))?;
    if counts.pending != 0 || counts.bad != usize::from(park) {
        return Err(format!(
            "after one file {}, the spool counts {counts:?}",
            if park { "parked" } else { "removed" }
        ));
    }
    Ok(())
}

pub fn strategy() -> impl Strategy<Value = Vec<u8>> {
    // Around the cap: files just under and just over it.
    crate::signal::bodies(TARGET.name, 16)
}

fn fuzz(budget: Budget, known: Vec<String>) -> Outcome {
    driver::fuzz(
        TARGET.name,
        strategy(),
        |b| check(b),
        Clone::clone,
        budget,
        known,
    )
}
