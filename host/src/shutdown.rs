//! The one wait for SIGTERM/SIGINT ([`shutdown_signal`]), for both daemons and `cortex wait`.

/// Resolves on the first SIGTERM or SIGINT with its name (`"SIGTERM"`, `"SIGINT"`), logged
/// as `SIGTERM: stopping`; never, if the handlers cannot be installed (logged as an error:
/// the process then stops only by SIGKILL, rather than at once). The daemons stop
/// gracefully on it; `cortex wait` ends as "broke" on it.
pub async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => (term, int),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM and SIGINT");
            return std::future::pending().await;
        }
    };
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!("{name}: stopping");
    name
}

#[cfg(test)]
mod tests {
    /// A SIGTERM sent to this process ends the wait with its name. The first poll installs
    /// the handlers, before the signal goes, so the default action (exit) never runs.
    #[tokio::test]
    async fn sigterm_is_reported_by_name() {
        let mut stop = std::pin::pin!(super::shutdown_signal());
        tokio::select! {
            biased;
            name = &mut stop => panic!("stopped before any signal: {name}"),
            () = std::future::ready(()) => {}
        }
        rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::TERM)
            .expect("kill");
        let name = tokio::time::timeout(std::time::Duration::from_secs(10), stop)
            .await
            .expect("SIGTERM seen");
        assert_eq!(name, "SIGTERM");
    }
}
