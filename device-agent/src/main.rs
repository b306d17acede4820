//! `cortex-device-agent`: flags and environment, logging to stderr, SIGTERM/SIGINT; the
//! daemon itself is `cortex_device_agent::agent::run`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use cortex_device_agent::agent::{self, Config, HubUrl, Timing, config};

/// The cortex device agent: forwards this machine's signal spool (~/.cortex/tmp/signals/) to
/// the hub over one WebSocket, deleting each file only once the hub has it.
///
/// Files wait on disk while the hub is unreachable, and refused or malformed ones are
/// parked under bad/ with a .reason file beside them. The device token comes from
/// --token-file (or CORTEX_DEVICE_TOKEN_FILE), else the systemd credential `token`
/// ($CREDENTIALS_DIRECTORY/token), else CORTEX_DEVICE_TOKEN; it is never logged.
#[derive(Debug, Parser)]
#[command(name = "cortex-device-agent", version)]
struct Args {
    /// The hub's mesh URL: ws://HOST:3002/mesh/v1, or wss://HOST/mesh/v1 when the hub serves
    /// TLS. Plaintext ws:// only to this machine (loopback) unless --mesh-insecure
    #[arg(long, env = "CORTEX_HUB_URL", value_name = "URL")]
    hub: String,

    /// This device's name, as enrolled on the hub with `cortex device add NAME`
    #[arg(long, env = "CORTEX_DEVICE_NAME", value_name = "NAME")]
    name: String,

    /// File holding the device token (keep it mode 0600)
    #[arg(long, env = "CORTEX_DEVICE_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<PathBuf>,

    /// Home directory (default $CORTEX_HOME, else ~/.cortex); the spool is DIR/tmp/signals/
    #[arg(long, env = "CORTEX_HOME", value_name = "DIR")]
    home: Option<PathBuf>,

    /// PEM file of CA certificates to trust besides the system's, for a hub whose certificate
    /// a private CA signed (or the hub's own self-signed certificate, if made with
    /// basicConstraints CA:FALSE)
    #[arg(long, env = "CORTEX_CA_CERT", value_name = "PEM")]
    ca_cert: Option<PathBuf>,

    /// Let agents start commands on this device (the hub's device_exec), each detached in
    /// its own session with its output in $CORTEX_HOME/exec/ID.log. Off by default
    #[arg(long, env = "CORTEX_ALLOW_EXEC", value_parser = clap::builder::BoolishValueParser::new())]
    allow_exec: bool,

    /// With --allow-exec, only this program may be started: a full path, or a bare name
    /// matched against argv[0]'s file name (`sh` allows shell commands). Repeatable; the
    /// environment form is comma-separated
    #[arg(
        long,
        env = "CORTEX_EXEC_ALLOW",
        value_name = "PROG",
        value_delimiter = ','
    )]
    exec_allow: Vec<String>,

    /// Allow plaintext ws:// to a host other than this machine; the token then crosses the
    /// network in the clear (the hub's --mesh-insecure is the same rule on its side)
    #[arg(long)]
    mesh_insecure: bool,
}

fn main() -> std::process::ExitCode {
    // The exec launcher (agent::exec): no flags, no logging, it becomes the command.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == agent::exec::LAUNCH_ARG) {
        return agent::exec::launch(&args[2..]);
    }
    cortex_host::daemon::main("cortex-device-agent", || real_main(Args::parse()))
}

fn real_main(args: Args) -> anyhow::Result<()> {
    let hub = HubUrl::parse(&args.hub, args.mesh_insecure)?;
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
        hub,
        name: args.name,
        token,
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
        hub = %config.hub,
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
        cortex_host::daemon::shutdown_signal().await;
    };
    rt.block_on(agent::run(config, shutdown))
        .context("the device agent could not start")
}
