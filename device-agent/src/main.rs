//! `cortex-device-agent`: flags and environment, logging to stderr, SIGTERM/SIGINT; the
//! daemon itself is `cortex_device_agent::agent::run`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;
use cortex_device_agent::agent::{self, Config, HubUrls, Timing, config};
use cortex_device_agent::cli::Args;

fn main() -> std::process::ExitCode {
    // The exec launcher (agent::exec): no flags, no logging, it becomes the command.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == agent::exec::LAUNCH_ARG) {
        return agent::exec::launch(&args[2..]);
    }
    cortex_daemon::main("cortex-device-agent", || real_main(Args::parse()))
}

fn real_main(args: Args) -> anyhow::Result<()> {
    let hubs = HubUrls::parse(&args.hub, args.mesh_insecure)?;
    config::check_name(&args.name)?;
    let env_token = std::env::var("CORTEX_DEVICE_TOKEN").ok();
    let credentials = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
    let (token, source) = config::load_token(
        args.token_file.as_deref(),
        credentials.as_deref(),
        env_token.as_deref(),
    )?;
    let home = config::home_or_default(args.home, std::env::var_os("HOME").map(PathBuf::from))?;
    let config = Config {
        hubs,
        name: args.name,
        token,
        token_file: source.file().map(Path::to_path_buf),
        home,
        ca_cert: args.ca_cert,
        allow_exec: args.allow_exec,
        exec_allow: args
            .exec_allow
            .into_iter()
            .map(|p| p.trim().to_owned())
            .filter(|p| !p.is_empty())
            .collect(),
        exec_launcher: PathBuf::from(agent::exec::SELF_EXE),
        timing: Timing::default(),
    };
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        device = %config.name,
        hubs = %config.hubs,
        spool = %config.spool_dir().display(),
        token_from = %source,
        "cortex-device-agent starting"
    );
    // One thread: a pid's exit, the loop that turns it into a frame and the link's writer
    // then run on the thread that saw it, with no wake-up of another thread between them
    // (each cost 50-100 us on the 2-vCPU test machine). Nothing here needs two cores:
    // spool files are small and the waits are descriptors the reactor watches.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let shutdown = async {
        cortex_host::shutdown_signal().await;
    };
    rt.block_on(agent::run(config, shutdown))
        .context("the device agent could not start")
}
