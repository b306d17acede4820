//! The hub's one timer loop: it sleeps until the earliest entry of the store's timer
//! queue (a decided wake, a remote wait's hub deadline; the store announces the earliest
//! after every batch) or the next sweep, whichever comes first, and runs what is due in
//! bounded passes. No polling: a store that keeps failing is retried every 200 ms, not in
//! a spin.

use std::collections::HashSet;
use std::time::Duration;

use crate::store::ops::PASS_LIMIT;
use crate::store::tables::TIMER_DEVICE_WAIT;
use crate::store::{StoreError, Tx};
use crate::time::now_ms;

use crate::state::AppState;

/// After a start, devices get this long to reconnect before the hub judges the remote
/// waits that fell due while it was down: an agent's reconnect backoff tops out at 60 s,
/// and its own outcome (kept until acknowledged) is better than the hub's guess.
const DEVICE_WAIT_RESTART_GRACE: Duration = Duration::from_secs(60);

/// At start: remote waits already overdue are held back for the grace; everything else
/// that fell due while the hub was down runs now, once; then the sweep.
pub(super) async fn start(state: &AppState, sweep: bool) {
    let until = now_ms().saturating_add(DEVICE_WAIT_RESTART_GRACE.as_millis() as u64);
    if let Err(e) = state
        .store
        .exec(move |t| t.postpone_due(TIMER_DEVICE_WAIT, now_ms(), until))
        .await
    {
        tracing::error!(error = %e, "cannot hold back the overdue remote waits");
    }
    fire_due(state).await;
    if sweep {
        sweep_once(state).await;
    }
}

/// The loop: the queue's earliest time (`u64::MAX`: none) or the sweep's next tick.
pub(super) async fn run(state: AppState, sweep: Option<Duration>) {
    let mut next = state.store.next_timer.clone();
    let mut sweep_at = sweep.map(|d| tokio::time::Instant::now() + d);
    loop {
        let due = *next.borrow_and_update();
        let now = now_ms();
        if due <= now {
            fire_due(&state).await;
            if *next.borrow() <= now_ms() {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                    () = state.shutdown.cancelled() => return,
                }
            }
            continue;
        }
        let timer = (due != u64::MAX).then(|| Duration::from_millis(due - now));
        tokio::select! {
            () = sleep_opt(timer) => {}
            () = sleep_until_opt(sweep_at) => {
                sweep_once(&state).await;
                sweep_at = sweep.map(|d| tokio::time::Instant::now() + d);
            }
            r = next.changed() => if r.is_err() { return },
            () = state.shutdown.cancelled() => return,
        }
    }
}

async fn sleep_opt(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Runs a store pass again while it takes a full page, so a backlog is cleared in bounded
/// batches. A failing store is logged; the pass runs again at its next time.
async fn drain<C>(state: &AppState, what: &str, mut pass: impl FnMut() -> C)
where
    C: for<'a> FnOnce(&mut Tx<'a>) -> Result<usize, StoreError> + Send + 'static,
{
    loop {
        match state.store.exec(pass()).await {
            Ok(n) if n >= PASS_LIMIT => continue,
            Ok(_) => return,
            Err(e) => {
                tracing::error!(error = %e, "{what} failed; it runs again shortly");
                return;
            }
        }
    }
}

/// Every due timer, with the devices online now (for the remote-wait rule).
async fn fire_due(state: &AppState) {
    drain(state, "running due timers", || {
        let online: HashSet<String> = state
            .devices
            .links()
            .iter()
            .map(|l| l.device.clone())
            .collect();
        move |t| t.fire_due(now_ms(), &online)
    })
    .await;
}

async fn sweep_once(state: &AppState) {
    drain(state, "the sweep", || |t| t.sweep(now_ms())).await;
}
