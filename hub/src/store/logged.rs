//! The operations the journal holds ([`Logged`]): the hot path of acknowledgements.
//!
//! Each record carries everything the operation read from outside the store, its time
//! included, so replaying it on the store as it stood gives the same result: the same
//! signal number, the same wake, the same event. A signal's secret is checked before it
//! is logged and never written; its replay takes the trusted path.

use cortex_protocol::SignalRequest;
use cortex_protocol::mesh::WaitEnd;
use serde::{Deserialize, Serialize};

use super::StoreError;
use super::device_waits::DoneOutcome;
use super::ops::{SignalIn, SignalOutcome};
use super::tables::{Tx, decode, encode};

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
    /// A remote wait's outcome from the link of its device.
    DeviceWaitDone {
        device: String,
        id: String,
        end: WaitEnd,
        payload: String,
        message: String,
        now: u64,
    },
}

impl Logged {
    pub(crate) fn encode(&self) -> Result<Vec<u8>, StoreError> {
        encode(self)
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
            Logged::DeviceWaitDone {
                device,
                id,
                end,
                payload,
                message,
                now,
            } => t
                .device_wait_done(device, id, *end, payload, message, *now)
                .map(drop),
        }
    }
}

impl Tx<'_> {
    /// [`Tx::signal`], with the record to journal when it changed anything.
    pub fn signal_logged(
        &mut self,
        s: &SignalIn,
        now: u64,
    ) -> Result<(SignalOutcome, Option<Logged>), StoreError> {
        let outcome = self.signal(s, now)?;
        let changed = matches!(
            outcome,
            SignalOutcome::Accepted { .. } | SignalOutcome::Refused(_)
        );
        let logged = changed.then(|| Logged::Signal {
            req: SignalRequest {
                secret: String::new(),
                ..s.req.clone()
            },
            source: s.source.clone(),
            dedupe: s.dedupe.clone(),
            now,
        });
        Ok((outcome, logged))
    }

    /// [`Tx::device_wait_done`], with the record to journal when it changed anything.
    pub fn device_wait_done_logged(
        &mut self,
        device: &str,
        id: &str,
        end: WaitEnd,
        payload: &str,
        message: &str,
        now: u64,
    ) -> Result<(DoneOutcome, Option<Logged>), StoreError> {
        let outcome = self.device_wait_done(device, id, end, payload, message, now)?;
        let logged = matches!(outcome, DoneOutcome::Recorded(_)).then(|| Logged::DeviceWaitDone {
            device: device.to_string(),
            id: id.to_string(),
            end,
            payload: payload.to_string(),
            message: message.to_string(),
            now,
        });
        Ok((outcome, logged))
    }
}
