//! Waiting for the first of several conditions: every one is armed (each with its own
//! pidfd, watches or lock file), the first that fires fires the wait, saying which, and
//! the others are dropped with it at once (their descriptors closed, their watches
//! removed). One that breaks breaks the whole wait, saying which: the wait can no longer
//! tell whether "the first of them" has happened.

use cortex_protocol::mesh::WaitSpec;
use cortex_protocol::waits::condition_string;
use futures_util::future::select_all;
use serde_json::json;

use super::{Armed, Captured, Fire, WaitError, Waits};

pub(crate) struct AnyWait {
    /// The conditions as asked for, and each armed.
    specs: Vec<WaitSpec>,
    armed: Vec<Armed>,
}

impl std::fmt::Debug for AnyWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnyWait")
            .field("conditions", &self.specs.len())
            .finish_non_exhaustive()
    }
}

fn condition_error(which: usize, spec: &WaitSpec, source: WaitError) -> WaitError {
    WaitError::Condition {
        which,
        condition: condition_string(spec),
        source: Box::new(source),
    }
}

pub(crate) fn arm(waits: &Waits, conditions: &[WaitSpec]) -> Result<AnyWait, WaitError> {
    if conditions.is_empty() {
        return Err(WaitError::BadSpec(
            "an any wait needs at least one condition".into(),
        ));
    }
    let mut armed = Vec::with_capacity(conditions.len());
    for (i, spec) in conditions.iter().enumerate() {
        if matches!(spec, WaitSpec::Any { .. }) {
            return Err(WaitError::BadSpec(
                "an any wait cannot hold another any; list all the conditions in one".into(),
            ));
        }
        // Those armed so far are dropped (released) with `armed` on an error.
        armed.push(waits.arm(spec).map_err(|e| condition_error(i, spec, e))?);
    }
    Ok(AnyWait {
        specs: conditions.to_vec(),
        armed,
    })
}

impl AnyWait {
    pub(crate) fn captured(&self) -> Vec<Captured> {
        self.armed.iter().map(Armed::captured).collect()
    }

    pub(crate) fn resume_specs(&self) -> Vec<WaitSpec> {
        self.armed.iter().map(Armed::resume_spec).collect()
    }

    fn fire(&self, which: usize, fired: Fire) -> Fire {
        Fire {
            payload: json!({
                "kind": "any",
                "which": which,
                "condition": condition_string(&self.specs[which]),
                "fired": fired.payload,
            }),
            cursor: None,
        }
    }

    pub(crate) fn ready(&self) -> Option<Fire> {
        self.armed
            .iter()
            .enumerate()
            .find_map(|(i, a)| a.fired_at_arm().map(|f| self.fire(i, f)))
    }

    pub(crate) async fn until_fired(&mut self) -> Result<Fire, WaitError> {
        if let Some(f) = self.ready() {
            return Ok(f);
        }
        let (which, result) = {
            let futures = self
                .armed
                .iter_mut()
                .enumerate()
                .map(|(i, a)| Box::pin(async move { (i, a.until_fired().await) }));
            let ((which, result), _, _rest) = select_all(futures).await;
            (which, result)
        };
        match result {
            Ok(fired) => Ok(self.fire(which, fired)),
            Err(e) => Err(condition_error(which, &self.specs[which], e)),
        }
    }
}
