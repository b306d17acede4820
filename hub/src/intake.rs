//! Where signals come in: what every route (the HTTP route, the hub's spool, a device's
//! spool file) shares about them.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cortex_protocol::SignalRequest;

use crate::engine::Refusal;
use crate::store::SignalOutcome;

/// Unknown ids and wrong secrets share this many misses a minute; then 429.
pub const MISS_BUDGET: usize = 60;
const MISS_WINDOW: Duration = Duration::from_secs(60);

/// The sliding minute of misses.
#[derive(Default)]
pub struct MissBudget {
    times: Mutex<VecDeque<Instant>>,
}

impl MissBudget {
    /// Records a miss; false when the budget was already spent.
    pub fn spend(&self, now: Instant) -> bool {
        let mut t = self.times.lock().unwrap_or_else(|e| e.into_inner());
        while t
            .front()
            .is_some_and(|&f| now.duration_since(f) >= MISS_WINDOW)
        {
            t.pop_front();
        }
        if t.len() >= MISS_BUDGET {
            return false;
        }
        t.push_back(now);
        true
    }
}

/// Why a signal from a file (local or a device's) was refused, in words that tell its
/// writer what to fix; `None` when the file was taken (accepted, duplicate, or its
/// waitpoint already resolved).
pub(crate) fn refusal_reason(req: &SignalRequest, outcome: &SignalOutcome) -> Option<String> {
    match outcome {
        SignalOutcome::Accepted { .. }
        | SignalOutcome::Duplicate { .. }
        | SignalOutcome::Refused(Refusal::Gone { .. }) => None,
        SignalOutcome::Unknown => Some(format!(
            "no waitpoint {:?}: check the id; a resolved waitpoint is forgotten after 3 days",
            req.id
        )),
        SignalOutcome::WrongSecret => Some(format!(
            "wrong secret for waitpoint {}: use the secret handed out when it was armed",
            req.id
        )),
        SignalOutcome::Refused(
            r @ (Refusal::MemberMissing { members } | Refusal::MemberUnlisted { members, .. }),
        ) => Some(format!(
            "{r}; add \"member\":\"NAME\" with one of: {}",
            members.join(", ")
        )),
    }
}
