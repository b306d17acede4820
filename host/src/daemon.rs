//! What both daemons (`cortex-hub`, `cortex-device-agent`) do around their real work: log
//! to stderr (colour only on a terminal; `RUST_LOG`, default `info`), and turn an error
//! into one line on stderr and a failing exit status; with `CORTEX_TIMING_FILE` set, the
//! benchmarks' timing records ([`crate::timing`]); and the one wait for SIGTERM/SIGINT
//! (the daemons and `cortex wait` stop on it).

use std::process::ExitCode;

/// Sets up logging, then runs `real_main`; an error is printed as `NAME: error: causes`.
pub fn main(name: &str, real_main: impl FnOnce() -> anyhow::Result<()>) -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    if let Err(e) = crate::timing::install_from_env() {
        eprintln!("{name}: error: {e}");
        return ExitCode::FAILURE;
    }
    match real_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

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
