//! The driver's store writes: one of the runner's writes (`turn`) run with the
//! transcript's new messages read in the same write ([`write`](fn@write)), and one the
//! store refuses for good replaced by its refusal ([`write_or`]).

use std::sync::Arc;

use crate::config::AgentDefaults;
use crate::model::ChatMessage;
use crate::state::AppState;
use crate::store::{StoreError, Tx};
use crate::time::now_ms;

use super::turn::{self, Next};

#[derive(Debug, thiserror::Error)]
pub(super) enum DriveError {
    #[error("the store failed: {0}")]
    Store(#[from] Arc<crate::store::StoreError>),
}

/// The claim a driver's writes hold to: this hub, and the epoch it holds the session under.
pub(super) struct Fence {
    hub: String,
    epoch: u64,
}

impl Fence {
    /// The claim this hub holds on `sid` now; none is an error (its writes are refused).
    pub(super) fn of(state: &AppState, sid: &str) -> Result<Fence, DriveError> {
        match state.claims.epoch(sid) {
            Some(epoch) => Ok(Fence {
                hub: state.claims.hub.clone(),
                epoch,
            }),
            None => Err(DriveError::Store(Arc::new(StoreError::Fenced(format!(
                "this hub no longer holds a claim on session {sid}; it writes nothing more for it"
            ))))),
        }
    }
}

/// One of the runner's writes inside the store's job, refused unless `fence` still holds
/// (checked in the same write): `f`, given the write's
/// [`turn::Env`] (the clock read in the write), then the transcript's messages from `known`
/// on when what comes next is a step, read in the write that produced them so a step needs
/// no second trip to the store.
pub(super) fn in_write<F>(
    t: &mut Tx<'_>,
    fence: &Fence,
    defaults: &AgentDefaults,
    signal_url: &str,
    sid: &str,
    known: u64,
    f: F,
) -> Result<Wrote, StoreError>
where
    F: for<'e> FnOnce(
        &mut Tx<'_>,
        &turn::Env<'e>,
    ) -> Result<(Next, Vec<turn::Unredacted>), StoreError>,
{
    let env = turn::Env {
        defaults,
        signal_url,
        now: now_ms(),
    };
    t.fence(sid, &fence.hub, fence.epoch)?;
    let (next, secrets) = f(t, &env)?;
    let tail = match next {
        Next::Step { .. } | Next::Compact { .. } => t.transcript_from(sid, known)?,
        _ => Vec::new(),
    };
    Ok((next, tail, secrets))
}

/// What one of the runner's writes hands back: what to do next, the transcript's new
/// messages, and the answers whose stored copy hides a secret.
pub(super) type Wrote = (Next, Vec<ChatMessage>, Vec<turn::Unredacted>);

/// Runs one of the runner's writes (`f`, given the write's [`turn::Env`]), with the
/// transcript read on from `known`.
pub(super) async fn write<F>(
    state: &AppState,
    sid: &str,
    known: u64,
    f: F,
) -> Result<Wrote, DriveError>
where
    F: for<'e> FnOnce(
            &mut Tx<'_>,
            &turn::Env<'e>,
        ) -> Result<(Next, Vec<turn::Unredacted>), StoreError>
        + Send
        + 'static,
{
    let fence = Fence::of(state, sid)?;
    let (defaults, url, sid) = (
        state.agent_defaults.clone(),
        state.signal_url.clone(),
        sid.to_string(),
    );
    Ok(state
        .store
        .exec(move |t| in_write(t, &fence, &defaults, &url, &sid, known, f))
        .await?)
}

/// Whether a write failed in a way the same write would again: the store refused it
/// for its size. Such a write is never made again as it is.
fn refused_for_good(e: &DriveError) -> Option<String> {
    match e {
        DriveError::Store(e) if e.is_deterministic() => Some(e.to_string()),
        _ => None,
    }
}

/// Runs write `f`; should the store refuse it for good ([`refused_for_good`]), runs
/// `instead` (given the reason) in its place, so the refusal is recorded once and the
/// session goes on, rather than the write (and the model call before it) being made
/// again and again.
pub(super) async fn write_or<F, G>(
    state: &AppState,
    sid: &str,
    known: u64,
    f: F,
    instead: G,
) -> Result<Wrote, DriveError>
where
    F: for<'e> FnOnce(
            &mut Tx<'_>,
            &turn::Env<'e>,
        ) -> Result<(Next, Vec<turn::Unredacted>), StoreError>
        + Send
        + 'static,
    G: for<'e> FnOnce(
            &mut Tx<'_>,
            &turn::Env<'e>,
            String,
        ) -> Result<(Next, Vec<turn::Unredacted>), StoreError>
        + Send
        + 'static,
{
    match write(state, sid, known, f).await {
        Err(e) => match refused_for_good(&e) {
            Some(why) => {
                tracing::warn!(session = %sid, error = %why, "the store refused a step's record for its size; the refusal is recorded in its place");
                write(state, sid, known, move |t, env| instead(t, env, why)).await
            }
            None => Err(e),
        },
        ok => ok,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a refusal the same write would meet again is recorded in the write's place;
    /// a store that failed for a passing reason is left to the restart.
    #[test]
    fn only_a_refusal_for_size_is_taken_as_for_good() {
        let table: [(StoreError, bool); 4] = [
            (
                StoreError::TooLarge {
                    bytes: 70 << 20,
                    limit: 64 << 20,
                },
                true,
            ),
            (StoreError::Closed, false),
            (StoreError::Full("the journal is full".into()), false),
            (StoreError::Broken("disk".into()), false),
        ];
        for (e, for_good) in table {
            let shown = e.to_string();
            let got = refused_for_good(&DriveError::Store(Arc::new(e)));
            assert_eq!(got.is_some(), for_good, "{shown}");
            if let Some(why) = got {
                assert!(why.contains("67108864"), "{why}");
            }
        }
    }
}
