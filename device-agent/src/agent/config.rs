//! The agent's configuration: the hubs' URLs and the rule for plaintext, the device's name,
//! its token and where that came from, the home whose spool it watches, and the link's
//! timings. `main` builds it from flags and the environment; tests build it directly.
//!
//! The token never appears in a `Debug` or `Display` of anything here, nor in an error.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cortex_protocol::mesh::MESH_PATH;
use tokio_tungstenite::tungstenite::http::Uri;

/// Everything [`super::run`] needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The hubs to link to, in the order they are tried (`--hub` repeated, or
    /// `CORTEX_HUB_URL` comma-separated); one link at a time.
    pub hubs: HubUrls,
    /// The device's name, as enrolled on the hub (`cortex device add NAME`).
    pub name: String,
    pub token: Token,
    /// The file the token was read from (`--token-file`, or the systemd credential): read
    /// again when the hub refuses the token, and while it does, so a new token written
    /// there (a re-enrolment) is used without a restart. `None` for a token from the
    /// environment, which a running process cannot see change.
    pub token_file: Option<PathBuf>,
    /// `$CORTEX_HOME`: the spool is `home/tmp/signals/`.
    pub home: PathBuf,
    /// Extra trust anchors (PEM) for a hub whose certificate a private CA signed.
    pub ca_cert: Option<PathBuf>,
    /// `--allow-exec`: the hub may start commands here (`HubFrame::Exec`).
    pub allow_exec: bool,
    /// `--exec-allow`: when not empty, the only programs exec may start (see
    /// `exec::ExecPolicy::permits`).
    pub exec_allow: Vec<String>,
    /// The program that starts a command detached: this binary (`exec::SELF_EXE`); tests
    /// point it at the built `cortex-device-agent`.
    pub exec_launcher: PathBuf,
    pub timing: Timing,
}

impl Config {
    /// The spool this agent forwards: `$CORTEX_HOME/tmp/signals/`.
    pub fn spool_dir(&self) -> PathBuf {
        self.home.join("tmp").join("signals")
    }

    /// What exec may start here.
    pub fn exec_policy(&self) -> super::exec::ExecPolicy {
        super::exec::ExecPolicy {
            allow: self.allow_exec,
            programs: self.exec_allow.clone(),
        }
    }
}

/// The link's clocks. [`Timing::default`] is what the daemon uses; tests shorten them.
#[derive(Debug, Clone)]
pub struct Timing {
    /// TCP connect, TLS handshake and WebSocket upgrade together.
    pub connect_timeout: Duration,
    /// From sending the hello to the hub's welcome.
    pub welcome_timeout: Duration,
    /// The first reconnect's delay ceiling; it doubles per failure up to `backoff_cap`.
    pub backoff_base: Duration,
    pub backoff_cap: Duration,
    /// A link up this long without trouble counts as stable even if no file needed an ack,
    /// so an idle device that loses its hub reconnects from the small end again.
    pub stable_after: Duration,
    /// A link that lived this long after its welcome proved its hub worked: when it ends,
    /// the next hub is dialed at once (a new round of the rotation), while the backoff
    /// keeps counting until a link is stable. Shorter lives count as failures of the round,
    /// so hubs that welcome and drop at once are never dialed in a tight loop.
    pub lived_after: Duration,
    /// The backoff's ceiling when a hub answered but said its store is away for now
    /// (`store_unavailable`): the hub is up and the database comes back by itself.
    pub busy_cap: Duration,
    /// The spool watcher's slow rescan, inotify's backstop.
    pub rescan: Duration,
    /// How long a file the hub answered `retry` waits before it is sent again.
    pub retry_delay: Duration,
    /// A file unacknowledged this long means the hub stopped handling files on a link that
    /// still answers pings: drop the link and start over (files are sent again, answered
    /// `duplicate` where they were already recorded).
    pub ack_timeout: Duration,
    /// Status frames and systemd STATUS lines at most this often.
    pub status_every: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            connect_timeout: Duration::from_secs(10),
            welcome_timeout: Duration::from_secs(10),
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(60),
            stable_after: Duration::from_secs(60),
            lived_after: Duration::from_secs(1),
            busy_cap: Duration::from_secs(4),
            rescan: Duration::from_secs(30),
            retry_delay: Duration::from_secs(5),
            ack_timeout: Duration::from_secs(120),
            status_every: Duration::from_secs(1),
        }
    }
}

/// What is wrong with the configuration; each message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("hub URL {url:?}: {why}")]
    BadUrl { url: String, why: String },

    #[error(
        "no hub URL: pass --hub URL (repeat it for several hubs) or set CORTEX_HUB_URL (comma-separated for several)"
    )]
    NoHub,

    #[error(
        "hub URL number {position} of {count} is empty: remove the extra comma in CORTEX_HUB_URL (or the empty --hub)"
    )]
    EmptyUrl { position: usize, count: usize },

    #[error(
        "hub URL {url:?} is plaintext ws:// to a host that is not this machine, which would send the device token in the clear; use wss:// (start the hub with --tls-cert/--tls-key), or pass --mesh-insecure on a network you trust"
    )]
    Insecure { url: String },

    #[error(
        "device name {name:?} is not usable: use 1 to 128 visible ASCII characters without spaces, the name given to `cortex device add`"
    )]
    BadName { name: String },

    #[error(
        "no device token: pass --token-file FILE (or CORTEX_DEVICE_TOKEN_FILE), load it as the systemd credential `token`, or set CORTEX_DEVICE_TOKEN; `cortex device add NAME` on the hub prints one"
    )]
    NoToken,

    #[error(
        "the device token from {source_name} is empty or holds spaces or control characters; copy it again from `cortex device add`"
    )]
    BadToken { source_name: String },

    #[error("cannot read the device token from {}: {source}", .path.display())]
    TokenFile {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("no home directory: set CORTEX_HOME or pass --home DIR")]
    NoHome,
}

/// The hub's mesh URL, checked: `ws://` or `wss://`, a host, no credentials in it, and
/// plaintext only to a loopback host unless allowed.
#[derive(Clone, PartialEq, Eq)]
pub struct HubUrl {
    url: String,
    tls: bool,
}

impl HubUrl {
    /// Checks `s`. A URL with no path gets [`MESH_PATH`]; any other path is kept, for a
    /// proxy that maps the endpoint elsewhere. `allow_insecure` mirrors the hub's
    /// `--mesh-insecure`: without it, `ws://` must name a loopback host.
    pub fn parse(s: &str, allow_insecure: bool) -> Result<HubUrl, ConfigError> {
        let bad = |why: &str| ConfigError::BadUrl {
            url: s.to_owned(),
            why: why.to_owned(),
        };
        let uri: Uri = s
            .parse()
            .map_err(|_| bad("not a URL; expected ws://HOST:3002/mesh/v1 or wss://HOST/mesh/v1"))?;
        let tls = match uri.scheme_str() {
            Some("wss") => true,
            Some("ws") => false,
            _ => return Err(bad("the scheme must be ws:// or wss://")),
        };
        let authority = uri
            .authority()
            .ok_or_else(|| bad("no host; expected ws://HOST:3002/mesh/v1"))?;
        if authority.as_str().contains('@') {
            return Err(bad(
                "credentials in the URL are not used; give the token with --token-file",
            ));
        }
        let host = authority.host();
        if host.is_empty() {
            return Err(bad("no host; expected ws://HOST:3002/mesh/v1"));
        }
        if !tls && !allow_insecure && !is_loopback(host) {
            return Err(ConfigError::Insecure { url: s.to_owned() });
        }
        let url = match uri.path_and_query().map(|p| p.as_str()) {
            None | Some("") | Some("/") => {
                format!(
                    "{}://{}{}",
                    if tls { "wss" } else { "ws" },
                    authority,
                    MESH_PATH
                )
            }
            Some(_) => s.to_owned(),
        };
        Ok(HubUrl { url, tls })
    }

    pub fn as_str(&self) -> &str {
        &self.url
    }

    pub fn is_tls(&self) -> bool {
        self.tls
    }
}

impl fmt::Debug for HubUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url)
    }
}

impl fmt::Display for HubUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url)
    }
}

/// The hubs this agent links to, in order: never empty, each one a checked [`HubUrl`].
/// The agent holds one link at a time, to the URL [`super::rotation::Rotation`] names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubUrls(Vec<HubUrl>);

impl HubUrls {
    /// Checks every URL in `list` ([`HubUrl::parse`]); an empty element (`a,,b`, a trailing
    /// comma) or an empty list (a lone empty one included) is an error, never skipped, so a
    /// typo is not a silent missing standby. Duplicates are kept: each is tried in its turn.
    pub fn parse<S: AsRef<str>>(list: &[S], allow_insecure: bool) -> Result<HubUrls, ConfigError> {
        if list.iter().all(|s| s.as_ref().trim().is_empty()) {
            return Err(ConfigError::NoHub);
        }
        let count = list.len();
        list.iter()
            .enumerate()
            .map(|(i, s)| {
                let s = s.as_ref().trim();
                if s.is_empty() {
                    return Err(ConfigError::EmptyUrl {
                        position: i + 1,
                        count,
                    });
                }
                HubUrl::parse(s, allow_insecure)
            })
            .collect::<Result<Vec<_>, _>>()
            .map(HubUrls)
    }

    /// Just `url`.
    pub fn one(url: HubUrl) -> HubUrls {
        HubUrls(vec![url])
    }

    /// The `i`-th URL, wrapping (so any index names one).
    pub fn get(&self, i: usize) -> &HubUrl {
        &self.0[i % self.0.len()]
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true; here for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether any URL is `wss://` (the TLS client config is then built at start).
    pub fn any_tls(&self) -> bool {
        self.0.iter().any(HubUrl::is_tls)
    }

    pub fn iter(&self) -> impl Iterator<Item = &HubUrl> {
        self.0.iter()
    }
}

impl fmt::Display for HubUrls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, u) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(u.as_str())?;
        }
        Ok(())
    }
}

/// `localhost` or a loopback address (IPv6 in brackets, as URLs write it).
fn is_loopback(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Checks a device name: it travels in an HTTP header and in logs on both ends.
pub fn check_name(name: &str) -> Result<(), ConfigError> {
    if name.is_empty() || name.len() > 128 || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError::BadName {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// The device's bearer token. Its `Debug` is redacted; only the link reads it.
#[derive(Clone)]
pub struct Token(String);

impl Token {
    /// Trims surrounding whitespace (a token file usually ends in a newline) and refuses
    /// what cannot be a header value. `source_name` says where it came from, for the error.
    pub fn new(raw: &str, source_name: &str) -> Result<Token, ConfigError> {
        let t = raw.trim();
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ConfigError::BadToken {
                source_name: source_name.to_owned(),
            });
        }
        Ok(Token(t.to_owned()))
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// The same token (not constant-time: both are this agent's own).
    pub fn same_as(&self, other: &Token) -> bool {
        self.0 == other.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Where the token was found, for the start-up log line (never the token itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    File(PathBuf),
    Credential(PathBuf),
    Environment,
}

impl TokenSource {
    /// The file to read the token from again, if it came from one.
    pub fn file(&self) -> Option<&Path> {
        match self {
            TokenSource::File(p) | TokenSource::Credential(p) => Some(p),
            TokenSource::Environment => None,
        }
    }
}

impl fmt::Display for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSource::File(p) => write!(f, "file {}", p.display()),
            TokenSource::Credential(p) => write!(f, "systemd credential {}", p.display()),
            TokenSource::Environment => f.write_str("CORTEX_DEVICE_TOKEN"),
        }
    }
}

/// The token, from (in this order) an explicit file, the systemd credential
/// `$CREDENTIALS_DIRECTORY/token`, or the environment's value. Files come first: the
/// environment of a process is easier to leak (`/proc/PID/environ`, child processes) than
/// a 0600 file.
pub fn load_token(
    token_file: Option<&Path>,
    credentials_dir: Option<&Path>,
    env_token: Option<&str>,
) -> Result<(Token, TokenSource), ConfigError> {
    if let Some(path) = token_file {
        let t = read_token_file(path)?;
        warn_if_readable_by_others(path);
        return Ok((t, TokenSource::File(path.to_owned())));
    }
    if let Some(dir) = credentials_dir {
        let path = dir.join("token");
        if path.exists() {
            let t = read_token_file(&path)?;
            return Ok((t, TokenSource::Credential(path)));
        }
    }
    match env_token {
        Some(raw) if !raw.trim().is_empty() => Ok((
            Token::new(raw, "CORTEX_DEVICE_TOKEN")?,
            TokenSource::Environment,
        )),
        _ => Err(ConfigError::NoToken),
    }
}

/// The token in `path` now (the agent's re-read after a refusal).
pub fn read_token_file(path: &Path) -> Result<Token, ConfigError> {
    let raw = std::fs::read_to_string(path).map_err(|source| ConfigError::TokenFile {
        path: path.to_owned(),
        source,
    })?;
    Token::new(&raw, &path.display().to_string())
}

fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(md) = std::fs::metadata(path)
        && md.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            file = %path.display(),
            mode = format_args!("{:04o}", md.permissions().mode() & 0o7777),
            "the device token file is readable by others; run chmod 600 on it"
        );
    }
}

/// `$CORTEX_HOME` when given, else `~/.cortex` (systemd sets `HOME` for a `User=` unit).
pub fn home_or_default(
    home: Option<PathBuf>,
    env_home: Option<PathBuf>,
) -> Result<PathBuf, ConfigError> {
    match home {
        Some(h) => Ok(h),
        None => env_home
            .filter(|h| !h.as_os_str().is_empty())
            .map(|h| h.join(".cortex"))
            .ok_or(ConfigError::NoHome),
    }
}
