//! `cortex-hub`: parses flags, binds the listener, and hands over to `cortex_hub::run`.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use cortex_hub::config;

/// The cortex hub: sessions, waitpoints, the signal route and its API.
#[derive(Debug, Parser)]
#[command(name = "cortex-hub", version)]
struct Args {
    /// Data directory (default $CORTEX_HOME, else ~/.cortex); the store lives in DIR/hub/.
    #[arg(long, value_name = "DIR")]
    home: Option<PathBuf>,
    /// Address of the signal route and the API; loopback only
    /// (default 127.0.0.1:$WEBHOOK_PORT, port 3001). Port 0 picks a free port.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    match real_main(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cortex-hub: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn real_main(args: Args) -> anyhow::Result<()> {
    let home = args.home.unwrap_or_else(config::default_home);
    let settings = config::load_settings(&home)?;
    let listen = match args.listen {
        Some(a) => a,
        None => {
            let port = match std::env::var("WEBHOOK_PORT") {
                Ok(p) if !p.is_empty() => p
                    .parse::<u16>()
                    .with_context(|| format!("WEBHOOK_PORT={p:?} is not a port number"))?,
                _ => cortex_protocol::DEFAULT_WEBHOOK_PORT,
            };
            SocketAddr::from(([127, 0, 0, 1], port))
        }
    };
    config::check_loopback(listen)?;
    std::fs::create_dir_all(home.join("hub"))
        .with_context(|| format!("creating {}", home.join("hub").display()))?;
    let token = config::operator_token(&home, std::env::var("CORTEX_WEBHOOK_TOKEN").ok())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}; is another hub running? (set --listen or WEBHOOK_PORT)"))?;
        let addr = listener.local_addr().context("reading the bound address")?;
        eprintln!(
            "cortex-hub listening on http://{addr} (signal route /webhook/signal, API /api), home {}",
            home.display()
        );
        let config = cortex_hub::server::Config { home, settings, token };
        cortex_hub::server::run(config, listener, shutdown_signal()).await
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            std::future::pending::<()>().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
    }
}
