//! `cortex-device-agent`'s command line: its flags and their environment forms, and the
//! files and logging its help names. Here in the library, not in `main.rs`, so `cargo
//! xtask` can build its shell completions and man page from the same definition.

use std::path::PathBuf;

use clap::Parser;

const AFTER_HELP: &str = "\
Examples:
  cortex-device-agent --hub wss://hub.example:3002/mesh/v1 --name gpu1 --token-file ~/.cortex/device-token
  CORTEX_DEVICE_TOKEN=… cortex-device-agent --hub ws://127.0.0.1:3002/mesh/v1 --name gpu1
  cortex-device-agent --hub wss://a.example/mesh/v1 --hub wss://b.example/mesh/v1 --name gpu1
  CORTEX_HUB_URL=wss://a.example/mesh/v1,wss://b.example/mesh/v1 cortex-device-agent --name gpu1
  RUST_LOG=debug cortex-device-agent --hub wss://hub.example:3002/mesh/v1 --name gpu1 --allow-exec --exec-allow python3

Environment (besides each flag's own, shown with it):
  CORTEX_DEVICE_TOKEN     the device token, when neither --token-file nor the systemd
                          credential `token` ($CREDENTIALS_DIRECTORY/token) gives it
  RUST_LOG                the log filter (default info; logs go to stderr); no level logs the
                          token

Files:
  $CORTEX_HOME/tmp/signals/    the spool jobs drop signal files into; forwarded, then deleted
  $CORTEX_HOME/tmp/signals/bad/  refused or malformed files, each with a .reason beside it
  $CORTEX_HOME/agent/waits.json  the remote waits it holds, armed again after a restart
  $CORTEX_HOME/exec/           with --allow-exec: each started command's record and log

SIGTERM or SIGINT stops it; files not yet acknowledged stay in the spool for the next start.";

/// The cortex device agent: forwards this machine's signal spool (~/.cortex/tmp/signals/) to
/// the hub over one WebSocket, deleting each file only once the hub has it. Given several
/// hubs (--hub twice), it links to one and moves to the next when that one dies.
///
/// Files wait on disk while the hub is unreachable, and refused or malformed ones are
/// parked under bad/ with a .reason file beside them. The device token comes from
/// --token-file (or CORTEX_DEVICE_TOKEN_FILE), else the systemd credential `token`
/// ($CREDENTIALS_DIRECTORY/token), else CORTEX_DEVICE_TOKEN; it is never logged.
#[derive(Debug, Parser)]
#[command(name = "cortex-device-agent", version, after_help = AFTER_HELP)]
pub struct Args {
    /// The hub's mesh URL: ws://HOST:3002/mesh/v1, or wss://HOST/mesh/v1 when the hub serves
    /// TLS. Plaintext ws:// only to this machine (loopback) unless --mesh-insecure.
    /// Repeatable for hubs that share one store (a standby): the agent links to one at a
    /// time, in order, and moves to the next when a dial fails or the link dies; the
    /// environment form is comma-separated
    #[arg(
        long,
        env = "CORTEX_HUB_URL",
        value_name = "URL",
        value_delimiter = ',',
        required = true
    )]
    pub hub: Vec<String>,

    /// This device's name, as enrolled on the hub with `cortex device add NAME`
    #[arg(long, env = "CORTEX_DEVICE_NAME", value_name = "NAME")]
    pub name: String,

    /// File holding the device token (keep it mode 0600)
    #[arg(long, env = "CORTEX_DEVICE_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// Home directory (default $CORTEX_HOME, else ~/.cortex); the spool is DIR/tmp/signals/
    #[arg(long, env = "CORTEX_HOME", value_name = "DIR")]
    pub home: Option<PathBuf>,

    /// PEM file of CA certificates to trust besides the system's, for a hub whose certificate
    /// a private CA signed (or the hub's own self-signed certificate, if made with
    /// basicConstraints CA:FALSE)
    #[arg(long, env = "CORTEX_CA_CERT", value_name = "PEM")]
    pub ca_cert: Option<PathBuf>,

    /// Let agents start commands on this device (the hub's device_exec), each detached in
    /// its own session with its output in $CORTEX_HOME/exec/ID.log. Off by default
    #[arg(long, env = "CORTEX_ALLOW_EXEC", value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_exec: bool,

    /// With --allow-exec, only this program may be started: a full path, or a bare name
    /// matched against argv[0]'s file name (`sh` allows shell commands). Repeatable; the
    /// environment form is comma-separated
    #[arg(
        long,
        env = "CORTEX_EXEC_ALLOW",
        value_name = "PROG",
        value_delimiter = ','
    )]
    pub exec_allow: Vec<String>,

    /// Allow plaintext ws:// to a host other than this machine; the token then crosses the
    /// network in the clear (the hub's --mesh-insecure is the same rule on its side)
    #[arg(long)]
    pub mesh_insecure: bool,
}
