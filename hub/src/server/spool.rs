//! The hub's local spool (`$CORTEX_HOME/tmp/signals/`): drained on start, new files taken
//! as they land (inotify), each handled like a signal from the route. A file is deleted
//! only after its signal is durable (or was a duplicate, or its waitpoint already ended);
//! a file the hub refuses is parked under `bad/` with the reason beside it. A file whose
//! handling failed on the store stays for the next rescan; one that does not parse stays
//! while it is still being written ([`Spool::settled`]).
//!
//! The hub is the spool's one collector: [`open`] takes the spool's collector lock, and a
//! hub whose spool another collector holds (a device agent on the same home, another hub)
//! refuses to start, naming it. Should another process take the lock after the directory
//! was recreated, the collector stops, and says so.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use cortex_host::spool::{
    Collector, Refusal as ReadRefusal, Spool, SpoolError, SpoolEvent, SpoolWatcher,
};
use cortex_protocol::SignalRequest;
use tokio::sync::Semaphore;

use crate::intake::{SignalSource, SpoolAction};
use crate::state::AppState;

/// Files handled at once: enough to fill a group commit.
const IN_FLIGHT: usize = 256;

/// Opens the local spool at `dir` and claims it as its collector; refused, naming the
/// holder, when another process collects it.
pub fn open(dir: &std::path::Path) -> anyhow::Result<Spool> {
    let spool =
        Spool::open(dir).with_context(|| format!("opening the local spool {}", dir.display()))?;
    spool.claim(&Collector::new("cortex-hub", None))?;
    Ok(spool)
}

pub async fn collect(state: AppState, spool: Arc<Spool>, rescan: Option<std::time::Duration>) {
    let mut watcher = match SpoolWatcher::new(spool.clone(), rescan) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch the local spool; spooled signals will not be collected until the hub restarts");
            return;
        }
    };
    let busy: Arc<Mutex<HashSet<String>>> = Arc::default();
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let ev = tokio::select! {
            ev = watcher.next() => ev,
            () = state.shutdown.cancelled() => break,
        };
        let (names, listed) = match ev {
            Ok(SpoolEvent::File(name)) => (vec![name], false),
            Ok(SpoolEvent::Rescan(why)) => match spool.list() {
                Ok(names) => {
                    if !names.is_empty() {
                        tracing::info!(files = names.len(), reason = %why, "collecting the local spool");
                    }
                    (names, true)
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot list the local spool");
                    continue;
                }
            },
            Err(e @ SpoolError::LockLost { .. }) => {
                tracing::error!(error = %e, "the hub stopped collecting its local spool");
                break;
            }
            Err(e) => {
                tracing::error!(error = %e, "the local spool watch failed; retrying");
                continue;
            }
        };
        for name in names {
            if !busy
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(name.clone())
            {
                continue;
            }
            let permit = tokio::select! {
                p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                () = state.shutdown.cancelled() => break,
            };
            let (state, spool, busy) = (state.clone(), spool.clone(), busy.clone());
            tasks.spawn(async move {
                take(&state, &spool, &name, listed).await;
                busy.lock().unwrap_or_else(|e| e.into_inner()).remove(&name);
                drop(permit);
            });
            while tasks.try_join_next().is_some() {}
        }
    }
    while tasks.join_next().await.is_some() {}
}

/// Handles one spool file. `listed`: found by a listing, not announced by inotify as
/// complete (renamed in, or closed after writing).
async fn take(state: &AppState, spool: &Spool, name: &str, listed: bool) {
    let bytes = match spool.read(name) {
        Ok(b) => b,
        Err(ReadRefusal::Gone) => return,
        Err(r) if r.should_park() => return park(spool, name, &r.to_string()),
        Err(r) => {
            tracing::warn!(file = name, error = %r, "cannot read a spool file now; it stays for the next rescan");
            return;
        }
    };
    let req = match SignalRequest::parse(&bytes) {
        Ok(r) => r,
        Err(_) if !spool.settled(name, !listed) => {
            tracing::debug!(
                file = name,
                "a spool file that does not parse is still being written; left for later"
            );
            return;
        }
        Err(e) => return park(spool, name, &e.to_string()),
    };
    let src = SignalSource::Spool { file: name };
    let outcome = state.store.signal(src.signal_in(req.clone())).await;
    match src.spool_action(&req, outcome) {
        SpoolAction::Delete => {
            if let Err(e) = spool.remove(name) {
                tracing::warn!(file = name, error = %e, "cannot remove a handled spool file; it will be answered as a duplicate");
            }
        }
        SpoolAction::Park(reason) => park(spool, name, &reason),
        SpoolAction::Keep => {}
    }
}

fn park(spool: &Spool, name: &str, reason: &str) {
    match spool.park(name, reason) {
        Ok(Some(parked)) => {
            tracing::warn!(file = name, parked = %parked, reason, "spool file parked under bad/")
        }
        Ok(None) => {}
        Err(e) => tracing::error!(file = name, error = %e, "cannot park a bad spool file"),
    }
}
