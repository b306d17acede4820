//! What both daemons (`cortex-hub`, `cortex-device-agent`) do around their real work: log
//! to stderr (colour only on a terminal; `RUST_LOG`, default `info`), and turn an error
//! into one line on stderr and a failing exit status.

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
    match real_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            ExitCode::FAILURE
        }
    }
}
