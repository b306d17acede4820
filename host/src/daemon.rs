//! What both daemons (`cortex-hub`, `cortex-device-agent`) do around their real work: log
//! to stderr (colour only on a terminal; `RUST_LOG`, default `info`, never past `debug` for
//! the websocket crates, whose traces print tokens and secrets), and turn an error
//! into one line on stderr and a failing exit status; with `CORTEX_TIMING_FILE` set, the
//! benchmarks' timing records ([`crate::timing`]); and the one wait for SIGTERM/SIGINT
//! (the daemons and `cortex wait` stop on it).

use std::process::ExitCode;

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry};

/// Log targets never logged past `debug`, whatever `RUST_LOG` asks: at `trace`, tungstenite
/// prints the WebSocket upgrade request with its headers (the device's bearer token) and
/// every frame with its payload (a spool file's body, with its waitpoint's secret), and
/// tokio-tungstenite wraps it. Their `debug` lines carry no header and no payload.
pub const CLAMPED_TARGETS: [&str; 2] = ["tungstenite", "tokio_tungstenite"];

/// The daemons' subscriber: `filter` (from `RUST_LOG`) and, beside it, a second filter
/// that caps [`CLAMPED_TARGETS`] at `debug`. Both must let an event through, so no
/// directive in `RUST_LOG` (not `tungstenite=trace`, nor a narrower target under it)
/// raises the cap.
pub fn subscriber<W>(filter: EnvFilter, writer: W, ansi: bool) -> impl tracing::Subscriber
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let clamp = Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_targets(CLAMPED_TARGETS.map(|t| (t, LevelFilter::DEBUG)));
    Registry::default().with(filter).with(clamp).with(
        tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .with_ansi(ansi),
    )
}

/// Sets up logging, then runs `real_main`; an error is printed as `NAME: error: causes`.
pub fn main(name: &str, real_main: impl FnOnce() -> anyhow::Result<()>) -> ExitCode {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // `init` also routes the `log` crate's records (tungstenite's, rustls's) through it.
    subscriber(filter, std::io::stderr, ansi).init();
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
    use std::sync::{Arc, Mutex};

    /// What the subscriber wrote, shared with the test.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> tracing_subscriber::fmt::MakeWriter<'w> for Captured {
        type Writer = Captured;
        fn make_writer(&'w self) -> Captured {
            self.clone()
        }
    }

    /// However `RUST_LOG` asks for the websocket crates' traces, none is written; their
    /// debug lines and every other target's traces are.
    #[test]
    fn no_directive_raises_the_websocket_crates_past_debug() {
        for directives in [
            "trace",
            "trace,tungstenite=trace,tokio_tungstenite=trace",
            "tungstenite::handshake::client=trace,tungstenite::protocol=trace,tokio_tungstenite::compat=trace,trace",
        ] {
            let out = Captured::default();
            let filter = tracing_subscriber::EnvFilter::new(directives);
            let sub = super::subscriber(filter, out.clone(), false);
            tracing::subscriber::with_default(sub, || {
                tracing::trace!(target: "tungstenite::handshake::client", "HEADERS");
                tracing::trace!(target: "tungstenite::protocol", "PAYLOAD");
                tracing::trace!(target: "tokio_tungstenite", "WRAPPED");
                tracing::debug!(target: "tungstenite::protocol", "close-frame");
                tracing::trace!(target: "cortex_device_agent::agent", "ours");
            });
            let text = String::from_utf8(out.0.lock().expect("lock").clone()).expect("utf-8");
            for hidden in ["HEADERS", "PAYLOAD", "WRAPPED"] {
                assert!(!text.contains(hidden), "{directives}: {hidden} in {text}");
            }
            for shown in ["close-frame", "ours"] {
                assert!(
                    text.contains(shown),
                    "{directives}: {shown} missing in {text}"
                );
            }
        }
    }

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
