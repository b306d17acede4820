//! `cortex-hub`'s command line: its flags, and the environment, files and logging its
//! help names. Here in the library, not in `main.rs`, so `cargo xtask` can build its shell
//! completions and man page from the same definition.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;

const AFTER_HELP: &str = "\
Examples:
  cortex-hub
  cortex-hub --listen 127.0.0.1:3001 --mesh-listen 0.0.0.0:3002 --tls-cert hub.pem --tls-key hub.key
  RUST_LOG=cortex_hub=debug cortex-hub --home /srv/cortex

Environment:
  CORTEX_HOME            the data directory when --home is not given (default ~/.cortex)
  WEBHOOK_PORT           the port of --listen's default (3001)
  CORTEX_WEBHOOK_TOKEN   the operator token; else the file $CORTEX_HOME/hub/token, made (0600)
                         on the first start
  CORTEX_LLM_BASE_URL, CORTEX_LLM_MODEL, CORTEX_LLM_API_KEY, CORTEX_LLM_ENDPOINT
                         the model the hub runs for sessions (none: no turn runs)
  CORTEX_WAITPOINT_TTL_MS, CORTEX_WAITPOINT_SWEEP_MS, CORTEX_WAITPOINT_MAX_WAKES_PER_HOUR,
  CORTEX_DEVICE_LOSS_GRACE_MS
                         read only when settings.json lacks the key
  CORTEX_STORE_URL       the PostgreSQL database of the store (postgres://…) when neither
                         --store nor settings.json store names one; else redb under the home
  CORTEX_STORE_NOTIFY    off: the store's batches send no NOTIFY to the other hubs on the
                         database (they find them by their poll, within a second)
  CORTEX_MESH_PING_MS    the keepalive interval told to device agents (default 20 s)
  CORTEX_MESH_LISTEN, CORTEX_TLS_CERT, CORTEX_TLS_KEY, CORTEX_PUBLIC_URL
                         --mesh-listen, --tls-cert, --tls-key, --public-url (the system
                         unit sets them; /etc/cortex/hub.env overrides)
  NOTIFY_SOCKET, WATCHDOG_USEC
                         set by systemd for a Type=notify unit: READY once it serves, the
                         watchdog fed while the store commits
  RUST_LOG               the log filter (default info; logs go to stderr); no level logs a
                         secret or a token

Files:
  $CORTEX_HOME/settings.json   waitpointTtlMs, waitpointSweepMs, waitpointMaxWakesPerHour,
                               deviceLossGraceMs, llm {…}, agent {…}: each key wins over its
                               environment variable
  $CORTEX_HOME/hub/            the store (redb), its journal and the operator token (0700,
                               files 0600); with --store, only the token
  $CORTEX_HOME/tmp/signals/    the local spool the hub collects

SIGTERM or SIGINT stops it gracefully (what is in flight finishes, the store is flushed).";

/// The cortex hub: sessions, waitpoints, the signal route and its API.
#[derive(Debug, Parser)]
#[command(name = "cortex-hub", version, after_help = AFTER_HELP)]
pub struct Args {
    /// Data directory (default $CORTEX_HOME, else ~/.cortex); the store lives in DIR/hub/.
    #[arg(long, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// Address of the signal route and the API; loopback only
    /// (default 127.0.0.1:$WEBHOOK_PORT, port 3001). Port 0 picks a free port.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Address of the device mesh (WebSocket, /mesh/v1), or `off`. Plaintext only on
    /// loopback unless --mesh-insecure; give --tls-cert/--tls-key for wss://.
    /// Port 0 picks a free port.
    #[arg(long, value_name = "ADDR|off", env = "CORTEX_MESH_LISTEN", default_value = cortex_protocol::DEFAULT_MESH_LISTEN)]
    pub mesh_listen: String,
    /// PEM certificate chain for the mesh (wss://); goes with --tls-key.
    #[arg(
        long,
        value_name = "PEM",
        env = "CORTEX_TLS_CERT",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert (the system unit passes it as a systemd credential).
    #[arg(
        long,
        value_name = "PEM",
        env = "CORTEX_TLS_KEY",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// Allow a plaintext mesh on a non-loopback address (device tokens travel in the
    /// clear: only on a network you trust).
    #[arg(long)]
    pub mesh_insecure: bool,
    /// The URL agents dial for the mesh, when it is not the listen address (a DNS name
    /// the certificate is valid for, a proxy): printed on start and put in `cortex device
    /// add`'s install line. Without it, a TLS mesh prints a name its certificate holds.
    #[arg(long, value_name = "URL", env = "CORTEX_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// The PostgreSQL database the store is in (postgres://USER@HOST:PORT/DATABASE); wins
    /// over settings.json `store` and CORTEX_STORE_URL. Without any, the store is redb
    /// under DIR/hub/. Several hubs may share one database.
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
    /// Recover a store whose journal is damaged (the hub refuses to start on one, and says
    /// so): apply every journal record that can still be read, report what was lost,
    /// start the journal over, and exit. The hub must not be running.
    #[arg(long)]
    pub recover_journal: bool,
}
