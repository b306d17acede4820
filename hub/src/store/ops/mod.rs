//! The hub's operations on the store: each runs inside one group commit ([`Tx`]) or one
//! read snapshot ([`ReadTx`]). The rules come from the engine; this module only loads,
//! applies effects and saves, keeping the indexes true.

mod sessions;
mod views;
mod waitpoints;

use cortex_protocol::api::WaitpointRef;
use serde::{Deserialize, Serialize};

use super::agent::AgentConfig;
use super::kernel::error::StoreError;
use crate::engine::{CreateError, State, Waitpoint};
use crate::model::ChatMessage;

/// How many due waitpoints one timer or sweep pass takes.
pub const PASS_LIMIT: usize = 512;
/// How many signals a waitpoint view lists.
pub const VIEW_SIGNALS: usize = 1_000;

/// A signal and what recording it did: the intake's types (it builds the one for every
/// way in and maps the other back).
pub use crate::intake::{SignalIn, SignalOutcome};

#[derive(Debug, Clone, PartialEq)]
pub enum CreateOutcome {
    Created(Box<Waitpoint>),
    NoSession,
    /// `device` names no device the hub knows (a typo, or one revoked).
    NoDevice(String),
    Invalid(CreateError),
}

/// A `spawn` monitor's sessions, decided when it is armed (by the caller, which knows the
/// hub's defaults and the model server): the configuration each new session is fixed
/// with and its prefix. Kept beside the waitpoint's state, read only when a wake spawns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpawnSetup {
    pub config: AgentConfig,
    pub prefix: Vec<ChatMessage>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum CancelOutcome {
    Cancelled,
    AlreadyEnded(State),
    NotFound,
}

/// The second halves of the keys `(first, _)` of a table keyed by string pairs: a session's
/// waitpoints, a waitpoint's signal keys, a session's message keys.
pub(super) fn seconds_of<V: redb::Value + 'static>(
    t: &super::kernel::TableRef<'_, (&'static str, &'static str), V>,
    first: &str,
) -> Result<Vec<String>, StoreError> {
    let mut v = Vec::new();
    for r in t.range((first, "")..)? {
        let (k, _) = r?;
        let (f, second) = k.value();
        if f != first {
            break;
        }
        v.push(second.to_string());
    }
    Ok(v)
}

fn wp_ref(wp: &Waitpoint) -> WaitpointRef {
    WaitpointRef {
        id: wp.id.clone(),
        label: wp.label.clone(),
        intent: wp.intent.clone(),
    }
}
