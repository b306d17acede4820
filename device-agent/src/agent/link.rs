//! The link to the hub: one WebSocket on `/mesh/v1`, MessagePack frames in binary messages
//! (`cortex_protocol::mesh`), through `cortex_daemon::connection` (its limits and its
//! frame-speaking [`Connection`]).
//!
//! [`Dialer::dial`] does the connect to the hub URL it is given (the daemon picks it,
//! `rotation`): TCP, TLS, upgrade with the bearer token and the device header, all under
//! one timeout; then it sends the hello and waits, bounded, for the welcome.
//! [`Link::start`] then splits the socket between two tasks:
//! - the **reader** polls at all times (tungstenite answers the hub's pings only while
//!   something reads), turns binary messages into [`HubFrame`]s for the daemon loop, and
//!   declares the link dead when nothing at all (frame, ping, pong) arrived for two ping
//!   intervals;
//! - the **writer** is the only task that writes: it drains a bounded channel of encoded
//!   frames and sends a ping every interval the hub set in its welcome.
//!
//! Neither task decides anything: each reports [`LinkMsg`]s, tagged with the link's
//! generation so that a late message of a replaced link is recognised and dropped, and the
//! daemon loop owns what happens next. Both ends cap message and frame sizes.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use cortex_daemon::connection::{
    Connection, ConnectionError, FrameSink, FrameStream, Incoming, ws_config,
};
use cortex_protocol::mesh::{
    AgentFrame, CloseReason, DEVICE_HEADER, HUB_CAP_WAITS, Hello, HubFrame, MAX_MESSAGE_BYTES,
    MESH_VERSION,
};
use rustls::ClientConfig;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderValue, header};
use tokio_tungstenite::tungstenite::protocol::frame::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::{Connector, MaybeTlsStream};

use super::config::{HubUrl, Token};

/// The socket under the WebSocket: TCP, or TLS over TCP for `wss://`.
type Socket = MaybeTlsStream<TcpStream>;

/// How long a closing link may take to send its close frame before its writer is stopped.
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Bounds on what the hub may set in its welcome, so a misconfigured hub cannot make the
/// agent ping in a tight loop or hold thousands of files in memory.
const MIN_PING: Duration = Duration::from_millis(50);
const MAX_PING: Duration = Duration::from_secs(600);
const MAX_WINDOW: u32 = 4096;

/// Frames the writer's channel holds beyond the window: status frames and the close.
const CHANNEL_SLACK: usize = 16;

/// The close frame's reason is a control-frame payload: at most 123 bytes after the code.
const MAX_CLOSE_REASON: usize = 123;

/// What the hub's welcome set for this link, after clamping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub ping_interval: Duration,
    /// Files unacknowledged at once.
    pub window: usize,
    /// The largest frame the hub takes from us.
    pub max_message_bytes: usize,
    /// The hub takes remote waits' frames (`WaitArmed`, `WaitDone`): its welcome said so.
    pub hub_waits: bool,
}

impl Params {
    fn from_welcome(ping_interval_ms: u64, window: u32, max_message_bytes: u64) -> Params {
        let ping = if ping_interval_ms == 0 {
            Duration::from_millis(cortex_protocol::mesh::DEFAULT_PING_MS)
        } else {
            Duration::from_millis(ping_interval_ms).clamp(MIN_PING, MAX_PING)
        };
        let max = usize::try_from(max_message_bytes).unwrap_or(usize::MAX);
        Params {
            ping_interval: ping,
            window: window.clamp(1, MAX_WINDOW) as usize,
            max_message_bytes: if max == 0 {
                MAX_MESSAGE_BYTES
            } else {
                max.min(MAX_MESSAGE_BYTES)
            },
            hub_waits: false,
        }
    }

    /// A link silent this long is dead.
    pub fn silence_limit(&self) -> Duration {
        self.ping_interval * 2
    }
}

/// How the hub said goodbye, from a close frame's code and its JSON [`CloseReason`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseInfo {
    pub code: u16,
    pub reason: Option<CloseReason>,
    /// The close frame's text when it was not a [`CloseReason`].
    pub text: String,
}

impl CloseInfo {
    fn from_frame(frame: Option<&CloseFrame>) -> CloseInfo {
        match frame {
            None => CloseInfo {
                code: u16::from(CloseCode::Status),
                reason: None,
                text: String::new(),
            },
            Some(f) => CloseInfo {
                code: u16::from(f.code),
                reason: serde_json::from_str(f.reason.as_str()).ok(),
                text: f.reason.as_str().to_owned(),
            },
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        self.reason
            .as_ref()
            .and_then(|r| r.retry_after_ms)
            .map(Duration::from_millis)
    }
}

impl fmt::Display for CloseInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            Some(r) => write!(f, "{}: {}", r.code, r.message),
            None if !self.text.is_empty() => write!(f, "{} (code {})", self.text, self.code),
            None => write!(f, "code {}", self.code),
        }
    }
}

/// Why a dial did not give a link. [`ConnectError::needs_operator`] tells apart what only
/// a person can fix (retried slowly) from what passes by itself.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("no connection within {0:?} (TCP, TLS and the WebSocket upgrade together)")]
    Timeout(Duration),

    #[error(
        "the hub refused this device's token (HTTP {status}{}): on the hub, `cortex device add NAME` if it was revoked, or `cortex device revoke NAME` and then `add` if the token is wrong, and install the new token (docs/install.md)",
        reason_suffix(.reason)
    )]
    Unauthorized {
        status: u16,
        reason: Option<CloseReason>,
    },

    #[error("the hub answered the upgrade with HTTP {status}{}", reason_suffix(.reason))]
    Http {
        status: u16,
        reason: Option<CloseReason>,
        retry_after: Option<Duration>,
    },

    #[error("cannot connect: {0}")]
    Io(String),

    #[error("no welcome within {0:?} after the hello")]
    WelcomeTimeout(Duration),

    #[error("the hub closed the link before its welcome: {0}")]
    Closed(CloseInfo),

    #[error(
        "the hub speaks mesh protocol version {hub} and this agent version {ours}; install matching versions of cortex-hub and cortex-device-agent"
    )]
    Version { hub: u32, ours: u32 },

    #[error("the hub's answer to the hello was not a welcome: {0}")]
    Protocol(String),
}

fn reason_suffix(reason: &Option<CloseReason>) -> String {
    match reason {
        Some(r) => format!(", {}: {}", r.code, r.message),
        None => String::new(),
    }
}

impl ConnectError {
    /// Only an operator can fix this (a revoked or wrong token, mismatched versions):
    /// retry near the backoff's cap, never in a tight loop.
    pub fn needs_operator(&self) -> bool {
        match self {
            ConnectError::Unauthorized { .. } | ConnectError::Version { .. } => true,
            // A hello the hub refuses (another protocol version, a name it does not match)
            // is refused again until someone upgrades or reconfigures.
            ConnectError::Closed(info) => info
                .reason
                .as_ref()
                .is_some_and(|r| r.code == "protocol_error"),
            _ => false,
        }
    }

    /// The hub answered and refused only because its store is away for now: the database
    /// comes back by itself, so the retry need not back off far.
    pub fn hub_busy(&self) -> bool {
        match self {
            ConnectError::Closed(info) => info
                .reason
                .as_ref()
                .is_some_and(|r| r.code == "store_unavailable"),
            _ => false,
        }
    }

    /// The earliest the hub asked to be called again.
    pub fn retry_after(&self) -> Option<Duration> {
        let ms = |r: &Option<CloseReason>| {
            r.as_ref()
                .and_then(|r| r.retry_after_ms)
                .map(Duration::from_millis)
        };
        match self {
            ConnectError::Unauthorized { reason, .. } => ms(reason),
            ConnectError::Http {
                reason,
                retry_after,
                ..
            } => ms(reason).or(*retry_after),
            ConnectError::Closed(info) => info.retry_after(),
            _ => None,
        }
    }
}

/// Why an established link ended.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Down {
    #[error("the hub closed the link: {0}")]
    Closed(CloseInfo),

    #[error("the connection ended without a close frame")]
    Eof,

    #[error("nothing from the hub for {0:?} (two ping intervals): the link is dead")]
    Silent(Duration),

    #[error("reading from the hub failed: {0}")]
    Read(String),

    #[error("writing to the hub failed: {0}")]
    Write(String),

    #[error("the hub sent something this agent cannot read: {0}")]
    BadFrame(String),

    #[error("the hub acknowledged no file for {0:?} while files were in flight")]
    AckTimeout(Duration),
}

impl Down {
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Down::Closed(info) => info.retry_after(),
            _ => None,
        }
    }

    /// The close frame this agent sends for it (the hub logs it as the offline reason).
    fn close_reason(&self) -> CloseReason {
        // The hub's close codes where one fits (docs/protocol.md), so both ends read alike.
        let code = match self {
            Down::Silent(_) => "ping_timeout",
            Down::BadFrame(_) => "protocol_error",
            Down::AckTimeout(_) => "ack_timeout",
            Down::Closed(_) | Down::Eof | Down::Read(_) | Down::Write(_) => "link_error",
        };
        CloseReason {
            code: code.into(),
            message: self.to_string(),
            retry_after_ms: None,
        }
    }
}

/// What a link's tasks tell the daemon loop.
#[derive(Debug)]
pub struct LinkMsg {
    /// The link's generation: messages of a replaced link are dropped.
    pub generation: u64,
    pub kind: LinkMsgKind,
    /// When the reader took it off the socket (an exec's bound counts from there).
    pub at: tokio::time::Instant,
}

#[derive(Debug)]
pub enum LinkMsgKind {
    Frame(HubFrame),
    Down(Down),
}

/// What the writer sends.
#[derive(Debug)]
pub enum Outgoing {
    /// An encoded [`AgentFrame`].
    Frame(Vec<u8>),
    /// A close frame with this reason, then the writer ends.
    Close(CloseReason),
}

/// Everything needed to dial a hub but its URL (the daemon names the hub per dial), built
/// once at start.
pub struct Dialer {
    device: String,
    /// Replaced when the token file holds a new one ([`Dialer::set_token`]).
    token: std::sync::Mutex<Token>,
    tls: Option<Arc<ClientConfig>>,
    connect_timeout: Duration,
    welcome_timeout: Duration,
}

impl fmt::Debug for Dialer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dialer")
            .field("device", &self.device)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

/// A dialed link, welcomed, not yet started.
pub struct Connected {
    conn: Connection<Socket>,
    pub params: Params,
}

impl fmt::Debug for Connected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connected")
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}

impl Dialer {
    /// `tls`: the client config for `wss://` URLs (ignored for `ws://`).
    pub fn new(
        device: String,
        token: Token,
        tls: Option<Arc<ClientConfig>>,
        connect_timeout: Duration,
        welcome_timeout: Duration,
    ) -> Dialer {
        Dialer {
            device,
            token: std::sync::Mutex::new(token),
            tls,
            connect_timeout,
            welcome_timeout,
        }
    }

    /// The token the next dial sends.
    pub fn token(&self) -> Token {
        self.token.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sends `token` from the next dial on.
    pub fn set_token(&self, token: Token) {
        *self.token.lock().unwrap_or_else(|e| e.into_inner()) = token;
    }

    /// Connect to `url`, send `hello`, and wait for the welcome.
    pub async fn dial(
        self: Arc<Self>,
        url: HubUrl,
        hello: Hello,
    ) -> Result<Connected, ConnectError> {
        let request = self.request(&url)?;
        let connector = match (&self.tls, url.is_tls()) {
            (Some(cfg), true) => Some(Connector::Rustls(cfg.clone())),
            _ => Some(Connector::Plain),
        };
        let connect = tokio_tungstenite::connect_async_tls_with_config(
            request,
            Some(ws_config()),
            true,
            connector,
        );
        let mut conn = match tokio::time::timeout(self.connect_timeout, connect).await {
            Err(_) => return Err(ConnectError::Timeout(self.connect_timeout)),
            Ok(Err(e)) => return Err(classify(&url, e)),
            Ok(Ok((ws, _response))) => Connection::new(ws),
        };
        let hello = AgentFrame::Hello(hello);
        match tokio::time::timeout(self.welcome_timeout, welcome(&mut conn, &hello)).await {
            Err(_) => Err(ConnectError::WelcomeTimeout(self.welcome_timeout)),
            Ok(Err(e)) => Err(e),
            Ok(Ok(params)) => Ok(Connected { conn, params }),
        }
    }

    fn request(
        &self,
        url: &HubUrl,
    ) -> Result<tungstenite::handshake::client::Request, ConnectError> {
        let mut request = url
            .as_str()
            .into_client_request()
            .map_err(|e| ConnectError::Io(format!("bad hub URL: {e}")))?;
        // The token is checked to be visible ASCII at load, so this cannot fail on it; the
        // error must not carry it either way.
        let mut auth = HeaderValue::from_str(&format!("Bearer {}", self.token().expose()))
            .map_err(|_| ConnectError::Io("the device token is not a valid header value".into()))?;
        auth.set_sensitive(true);
        let device = HeaderValue::from_str(&self.device)
            .map_err(|_| ConnectError::Io("the device name is not a valid header value".into()))?;
        let headers = request.headers_mut();
        headers.insert(header::AUTHORIZATION, auth);
        headers.insert(DEVICE_HEADER, device);
        headers.insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("cortex-device-agent/", env!("CARGO_PKG_VERSION"))),
        );
        Ok(request)
    }
}

/// What a failed connect to `url` means, with advice for the TLS mix-ups people meet.
fn classify(url: &HubUrl, e: tungstenite::Error) -> ConnectError {
    match e {
        tungstenite::Error::Http(response) => {
            let status = response.status().as_u16();
            let reason = response
                .body()
                .as_deref()
                .and_then(|b| serde_json::from_slice::<CloseReason>(b).ok());
            if status == 401 || status == 403 {
                return ConnectError::Unauthorized { status, reason };
            }
            let retry_after = response
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            ConnectError::Http {
                status,
                reason,
                retry_after,
            }
        }
        other => {
            let mut text = other.to_string();
            if url.is_tls() {
                text.push_str(tls_hint(&text));
            } else if matches!(
                other,
                tungstenite::Error::Protocol(tungstenite::error::ProtocolError::HttparseError(_))
            ) {
                // A TLS listener answers a plaintext upgrade with a TLS alert, which
                // reads as a broken HTTP answer.
                text.push_str(PLAIN_TO_TLS_HINT);
            }
            ConnectError::Io(text)
        }
    }
}

/// A `ws://` URL whose hub answered in TLS.
pub(crate) const PLAIN_TO_TLS_HINT: &str = "; the answer is not HTTP: this hub speaks TLS on that port, so use wss:// in --hub (CORTEX_HUB_URL) (docs/install.md, Troubleshooting)";

/// Advice for the certificate errors people meet with a private hub.
pub(crate) fn tls_hint(error: &str) -> &'static str {
    if error.contains("InvalidContentType") || error.contains("corrupt message") {
        "; the hub does not speak TLS on that port: use ws:// in --hub, or give the hub --tls-cert/--tls-key (docs/install.md, TLS)"
    } else if error.contains("CaUsedAsEndEntity") {
        "; the hub's certificate is a CA certificate (what `openssl req -x509` makes by default): sign a server certificate with that CA for the hub, or make the self-signed one with -addext basicConstraints=critical,CA:FALSE (docs/install.md, TLS)"
    } else if error.contains("UnknownIssuer") {
        "; the hub's certificate comes from a CA this machine does not trust: pass that CA's certificate with --ca-cert (docs/install.md, TLS)"
    } else if error.to_ascii_lowercase().contains("certificate") {
        "; check the hub's certificate names the host in the URL, and pass its CA with --ca-cert if it is private (docs/install.md, TLS)"
    } else {
        ""
    }
}

/// Send the hello and read up to the welcome; pings in between are fine.
async fn welcome(
    conn: &mut Connection<Socket>,
    hello: &AgentFrame,
) -> Result<Params, ConnectError> {
    conn.send(hello).await.map_err(|e| match e {
        ConnectionError::Frame(e) => {
            ConnectError::Protocol(format!("cannot encode the hello: {e}"))
        }
        e => ConnectError::Io(format!("sending the hello: {e}")),
    })?;
    loop {
        let frame = match conn.next::<HubFrame>().await {
            Ok(None) => return Err(ConnectError::Closed(CloseInfo::from_frame(None))),
            Ok(Some(Incoming::Alive)) => continue,
            Ok(Some(Incoming::Closed(frame))) => {
                return Err(ConnectError::Closed(CloseInfo::from_frame(frame.as_ref())));
            }
            Ok(Some(Incoming::Frame(f))) => f,
            Err(ConnectionError::Ws(e)) => {
                return Err(ConnectError::Io(format!("reading the welcome: {e}")));
            }
            Err(e) => return Err(ConnectError::Protocol(e.to_string())),
        };
        return match frame {
            HubFrame::Welcome {
                version,
                ping_interval_ms,
                window,
                max_message_bytes,
                capabilities,
            } => {
                if version != MESH_VERSION {
                    return Err(ConnectError::Version {
                        hub: version,
                        ours: MESH_VERSION,
                    });
                }
                let mut params = Params::from_welcome(ping_interval_ms, window, max_message_bytes);
                params.hub_waits = capabilities.iter().any(|c| c == HUB_CAP_WAITS);
                Ok(params)
            }
            other => Err(ConnectError::Protocol(format!(
                "expected a welcome, got {}",
                frame_kind(&other)
            ))),
        };
    }
}

fn frame_kind(f: &HubFrame) -> &'static str {
    match f {
        HubFrame::Welcome { .. } => "welcome",
        HubFrame::Ack { .. } => "ack",
        HubFrame::Rescan => "rescan",
        HubFrame::WaitArm { .. } => "wait_arm",
        HubFrame::WaitCancel { .. } => "wait_cancel",
        HubFrame::WaitAck { .. } => "wait_ack",
        HubFrame::Exec(_) => "exec",
    }
}

/// A running link: its reader and writer tasks and the writer's channel. Dropping it stops
/// both tasks; [`Link::close`] says goodbye first.
#[derive(Debug)]
pub struct Link {
    pub generation: u64,
    pub params: Params,
    tx: mpsc::Sender<Outgoing>,
    reader: Option<JoinHandle<()>>,
    writer: Option<JoinHandle<()>>,
}

impl Link {
    /// Start the reader and writer for a welcomed link.
    pub fn start(connected: Connected, generation: u64, events: mpsc::Sender<LinkMsg>) -> Link {
        let Connected { conn, params } = connected;
        let (sink, stream) = conn.split();
        let (tx, rx) = mpsc::channel(params.window + CHANNEL_SLACK);
        let reader = tokio::spawn(read_loop(
            stream,
            params.silence_limit(),
            generation,
            events.clone(),
        ));
        let writer = tokio::spawn(write_loop(
            sink,
            rx,
            params.ping_interval,
            generation,
            events,
        ));
        Link {
            generation,
            params,
            tx,
            reader: Some(reader),
            writer: Some(writer),
        }
    }

    /// The writer's channel. Never await on it from the daemon loop: use `try_send`.
    pub fn outbox(&self) -> &mpsc::Sender<Outgoing> {
        &self.tx
    }

    /// End the link: stop reading, hand the writer a close frame, and give it
    /// [`CLOSE_GRACE`] to send it. The returned future may be awaited (at shutdown) or
    /// spawned (on a reconnect).
    pub fn close(mut self, reason: CloseReason) -> impl Future<Output = ()> + Send + 'static {
        if let Some(r) = self.reader.take() {
            r.abort();
        }
        // Full or closed: the writer is stuck or gone, and the grace below ends it.
        let _ = self.tx.try_send(Outgoing::Close(reason));
        let writer = self.writer.take();
        async move {
            if let Some(w) = writer {
                let abort = w.abort_handle();
                if tokio::time::timeout(CLOSE_GRACE, w).await.is_err() {
                    abort.abort();
                }
            }
        }
    }

    /// End the link because of `down`, telling the hub why when the writer can.
    pub fn close_for(self, down: &Down) -> impl Future<Output = ()> + Send + 'static {
        self.close(down.close_reason())
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        for h in [self.reader.take(), self.writer.take()]
            .into_iter()
            .flatten()
        {
            h.abort();
        }
    }
}

async fn read_loop(
    mut stream: FrameStream<Socket>,
    silence: Duration,
    generation: u64,
    events: mpsc::Sender<LinkMsg>,
) {
    let down = loop {
        let frame = match tokio::time::timeout(silence, stream.next::<HubFrame>()).await {
            Err(_) => break Down::Silent(silence),
            Ok(Ok(None)) => break Down::Eof,
            Ok(Err(ConnectionError::Ws(e))) => break Down::Read(e.to_string()),
            Ok(Err(e)) => break Down::BadFrame(e.to_string()),
            // Liveness only: tungstenite queues the pong for a ping by itself.
            Ok(Ok(Some(Incoming::Alive))) => continue,
            Ok(Ok(Some(Incoming::Closed(frame)))) => {
                break Down::Closed(CloseInfo::from_frame(frame.as_ref()));
            }
            Ok(Ok(Some(Incoming::Frame(frame)))) => frame,
        };
        let m = LinkMsg {
            generation,
            kind: LinkMsgKind::Frame(frame),
            at: tokio::time::Instant::now(),
        };
        if events.send(m).await.is_err() {
            return;
        }
    };
    let _ = events
        .send(LinkMsg {
            generation,
            kind: LinkMsgKind::Down(down),
            at: tokio::time::Instant::now(),
        })
        .await;
}

async fn write_loop(
    mut sink: FrameSink<Socket>,
    mut rx: mpsc::Receiver<Outgoing>,
    ping_every: Duration,
    generation: u64,
    events: mpsc::Sender<LinkMsg>,
) {
    let mut ping = tokio::time::interval_at(Instant::now() + ping_every, ping_every);
    ping.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let result = loop {
        tokio::select! {
            out = rx.recv() => match out {
                Some(Outgoing::Frame(bytes)) => {
                    if let Err(e) = write_batch(&mut sink, &mut rx, bytes).await {
                        break e;
                    }
                }
                Some(Outgoing::Close(reason)) => {
                    send_close(&mut sink, &reason).await;
                    return;
                }
                None => {
                    sink.close(None).await;
                    return;
                }
            },
            _ = ping.tick() => {
                if let Err(e) = sink.ping().await {
                    break WriteEnd::Failed(Down::Write(e.to_string()));
                }
            }
        }
    };
    match result {
        WriteEnd::Failed(down) => {
            let _ = events
                .send(LinkMsg {
                    generation,
                    kind: LinkMsgKind::Down(down),
                    at: tokio::time::Instant::now(),
                })
                .await;
        }
        WriteEnd::Closed => {}
    }
}

enum WriteEnd {
    Failed(Down),
    /// A close was asked for while draining a batch; it has been sent.
    Closed,
}

/// Feed `first` and whatever else is already queued, then flush once: one syscall for a
/// burst instead of one per file.
async fn write_batch(
    sink: &mut FrameSink<Socket>,
    rx: &mut mpsc::Receiver<Outgoing>,
    first: Vec<u8>,
) -> Result<(), WriteEnd> {
    let failed = |e: ConnectionError| WriteEnd::Failed(Down::Write(e.to_string()));
    sink.feed(first).await.map_err(failed)?;
    while let Ok(next) = rx.try_recv() {
        match next {
            Outgoing::Frame(bytes) => sink.feed(bytes).await.map_err(failed)?,
            Outgoing::Close(reason) => {
                send_close(sink, &reason).await;
                return Err(WriteEnd::Closed);
            }
        }
    }
    sink.flush().await.map_err(failed)
}

async fn send_close(sink: &mut FrameSink<Socket>, reason: &CloseReason) {
    sink.close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: close_text(reason).into(),
    }))
    .await;
}

/// The reason as JSON, shortened to fit a close frame.
pub(crate) fn close_text(reason: &CloseReason) -> String {
    let mut r = reason.clone();
    loop {
        let text = serde_json::to_string(&r).unwrap_or_default();
        if text.len() <= MAX_CLOSE_REASON || r.message.is_empty() {
            return if text.len() <= MAX_CLOSE_REASON {
                text
            } else {
                String::new()
            };
        }
        // Cut the message at a character boundary, a few bytes at a time (JSON escapes
        // make the encoded length differ from the message's).
        let mut cut = r
            .message
            .len()
            .saturating_sub((text.len() - MAX_CLOSE_REASON).max(1));
        while !r.message.is_char_boundary(cut) {
            cut -= 1;
        }
        r.message.truncate(cut);
    }
}
