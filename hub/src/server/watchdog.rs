//! systemd's side of a running hub: `READY=1` once it serves, `WATCHDOG=1` while its
//! store still commits, `STOPPING=1` when it stops (`cortex_daemon::notify`; nothing outside
//! a `Type=notify` unit).
//!
//! The watchdog is fed only after a write through the store's writer comes back within
//! the interval: a hub whose writer is wedged (a stuck disk, a deadlock) stops feeding it,
//! and systemd restarts it. The journal makes that restart lose nothing.

use cortex_daemon::notify::SystemdNotifier;

use crate::state::AppState;

/// Feeds the watchdog every half `WatchdogSec=` while a no-op write commits in that time;
/// returns at once when the unit has no watchdog, and when the hub stops.
pub async fn feed(state: AppState) {
    let mut notifier = SystemdNotifier::from_env();
    let Some(every) = notifier.watchdog_every() else {
        return;
    };
    let stop = state.shutdown.clone();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        match tokio::time::timeout(every, state.store.exec(|_| Ok(()))).await {
            Ok(Ok(())) => notifier.watchdog(),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "the store failed a write; not feeding systemd's watchdog")
            }
            Err(_) => tracing::error!(
                waited_ms = every.as_millis() as u64,
                "the store did not commit within the watchdog's interval; not feeding systemd's watchdog"
            ),
        }
    }
}

/// `READY=1` with a `STATUS=` line saying where the hub serves.
pub fn ready(status: &str) -> SystemdNotifier {
    let mut n = SystemdNotifier::from_env();
    n.status(status);
    n.ready();
    n
}
