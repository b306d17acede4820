//! What the two daemons (`cortex-hub`, `cortex-device-agent`) share beyond `cortex-host`,
//! and the CLI never links (so `cortex` and `cortex-signal` build no WebSocket stack and
//! no log subscriber):
//!
//! - [`main`]: log to stderr (colour only on a terminal; `RUST_LOG`, default `info`, never
//!   past `debug` for the websocket crates, whose traces print tokens and secrets), turn an
//!   error into one line on stderr and a failing exit status, and with
//!   `CORTEX_TIMING_FILE` set, write the benchmarks' timing records
//!   (`cortex_host::timing`).
//! - [`notify`]: systemd's notify socket (`READY=1`, `STATUS=`, `WATCHDOG=1`) for both
//!   daemons' `Type=notify` units.
//! - [`connection`]: the device mesh's connection: one [`connection::ws_config`] and a
//!   [`connection::Connection`] that sends and reads protocol's frames over a WebSocket.

pub mod connection;
pub mod notify;

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
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // The MCP SDK logs each connection's handshake at `info`: kept to warnings unless
    // RUST_LOG names it.
    if !std::env::var("RUST_LOG").is_ok_and(|v| v.contains("rmcp"))
        && let Ok(d) = "rmcp=warn".parse()
    {
        filter = filter.add_directive(d);
    }
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // `init` also routes the `log` crate's records (tungstenite's, rustls's) through it.
    subscriber(filter, std::io::stderr, ansi).init();
    if let Err(e) = cortex_host::timing::install_from_env() {
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
}
