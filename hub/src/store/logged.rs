//! The operations the journal holds ([`Logged`]): the hot path of acknowledgements.
//!
//! Each record carries everything the operation read from outside the store, its time
//! included, so replaying it on the store as it stood gives the same result: the same
//! signal number, the same wake, the same event. A signal's secret is checked before it
//! is logged and never written; its replay takes the trusted path.

use cortex_protocol::SignalRequest;
use serde::{Deserialize, Serialize};

use super::device_waits::DeviceWaitDone;
use super::kernel::error::StoreError;
use super::ops::SignalIn;
use super::tables::{Tx, decode};

/// One journaled operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Logged {
    /// A signal that passed its secret check (the secret is blanked).
    Signal {
        req: SignalRequest,
        source: String,
        dedupe: Option<String>,
        now: u64,
    },
    /// A remote wait's outcome from the link of its device: its input is its record, so
    /// it may be journaled before it runs (the store's early records).
    DeviceWaitDone(DeviceWaitDone),
}

impl Logged {
    #[cfg(test)]
    pub(crate) fn encode(&self) -> Result<Vec<u8>, StoreError> {
        super::tables::encode(self)
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Logged, StoreError> {
        decode(b)
    }

    /// Does again what the operation did when it was acknowledged.
    pub(crate) fn replay(&self, t: &mut Tx<'_>) -> Result<(), StoreError> {
        match self {
            Logged::Signal {
                req,
                source,
                dedupe,
                now,
            } => {
                let s = SignalIn {
                    req: req.clone(),
                    source: source.clone(),
                    dedupe: dedupe.clone(),
                };
                t.signal_trusted(&s, *now).map(drop)
            }
            Logged::DeviceWaitDone(d) => t.device_wait_done(d).map(drop),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cortex_protocol::mesh::WaitEnd;

    #[test]
    fn a_remote_wait_record_is_read_as_before() {
        // Written by the hub before `DeviceWaitDone` became a struct of its own (a record
        // in a journal left by a crash is replayed by the next version).
        let hex = "81ae44657669636557616974446f6e6586a6646576696365a467707531a26964a477705f31a3656e64a56669726564a77061796c6f6164a27b7da76d657373616765a16da36e6f7707";
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect();
        let want = Logged::DeviceWaitDone(DeviceWaitDone {
            device: "gpu1".into(),
            id: "wp_1".into(),
            end: WaitEnd::Fired,
            payload: "{}".into(),
            message: "m".into(),
            now: 7,
        });
        assert_eq!(Logged::decode(&bytes).expect("decode"), want);
        assert_eq!(want.encode().expect("encode"), bytes);
    }
}
