//! One device connection, from the TCP accept to the close.
//!
//! 0. A place under the mesh's caps ([`Places`]): until its hello, a connection may be
//!    evicted for a newer one (closed at once), so idle sockets cannot hold the listener.
//! 1. TLS (when configured) and the WebSocket upgrade, bounded in time. The upgrade is
//!    refused with 404 (wrong path), 401 (no credentials) or 403 (unknown device or wrong
//!    token) and a JSON [`CloseReason`] body.
//! 2. The agent's `Hello` (bounded in time): version and name checked, the link
//!    registered (a second connection for a device replaces the first), the device
//!    recorded online, then `Welcome`.
//! 3. The loop, shaped like the agent's: [`Live::next`] turns every source (the agent's
//!    messages, a file's store answer, a remote wait's store write, the store's notice
//!    that the device's waits changed, the sweep's rescan, the keepalive tick, silence,
//!    revocation or shutdown) into one [`Event`], and [`Live::handle`] is where the
//!    link's state changes. The socket is `cortex_daemon::connection`'s `Connection`, the
//!    agent's own (its limits, its frame codec, its close), split in a reader the loop
//!    always polls (tungstenite answers pings only while read) and a writer task; each
//!    `File` is recorded in its own task up to the window so a burst
//!    shares group commits, and its answer comes back as an event whose ack is queued
//!    for the one writer task (a bounded channel). A link from which nothing arrived for
//!    two ping intervals is dropped.
//! 4. The close: in-flight files answered first, then a close frame whose reason is a
//!    JSON [`CloseReason`], and the device recorded offline with a typed reason.
//!
//! Nothing an agent sends can panic the hub: every frame error ends only this link.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cortex_daemon::connection::{
    Connection, ConnectionError, FrameSink, FrameStream, Incoming, ws_config,
};
use cortex_protocol::SignalRequest;
use cortex_protocol::mesh::{
    AgentFrame, CloseReason, DEFAULT_WINDOW, DEVICE_HEADER, FileOutcome, Frame, HUB_CAP_WAITS,
    Hello, HubFrame, MAX_MESSAGE_BYTES, MAX_WAITS_PER_DEVICE, MESH_PATH, MESH_VERSION,
};
use cortex_protocol::signal::MAX_BODY_BYTES;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::tungstenite::Error as WsError;
use tokio_tungstenite::tungstenite::error::ProtocolError;
use tokio_tungstenite::tungstenite::handshake::server::{
    Callback, ErrorResponse, Request, Response,
};
use tokio_tungstenite::tungstenite::http::{StatusCode, header};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::waits::{LinkWaits, Written};
use crate::admission::Admitted;
use crate::intake::{MAX_REASON_CHARS, SignalSource, cut};
use crate::registry::{End, Link};
use crate::state::AppState;
use crate::store::devices::Online;
use crate::time::now_ms;

/// TLS plus the upgrade request: a connection that says nothing is dropped after this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The agent's hello must arrive this soon after the upgrade.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// On shutdown, in-flight files get this long to be answered.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// After our close frame, how long we wait for the agent's.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// A close frame's reason holds at most 123 bytes (RFC 6455, 5.5.1).
const CLOSE_REASON_BYTES: usize = 123;
/// A spool file's name as the hub accepts it (a file name, not a path).
const MAX_FILE_NAME_BYTES: usize = 255;
/// Reconnect delay asked of an agent whose token was refused or revoked.
const RETRY_FORBIDDEN_MS: u64 = 60_000;
/// How many refused connections look their device up in a shared store at once; past
/// that, a refusal is answered from what this hub knows.
const LOOKUPS: usize = 4;
static LOOKING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(LOOKUPS);
/// Reconnect delay asked of an agent whose link was replaced, so two agents started
/// with one name flap slowly and visibly instead of fighting.
const RETRY_REPLACED_MS: u64 = 30_000;
/// Reconnect delay asked when the hub stops (it is usually back at once).
const RETRY_SHUTDOWN_MS: u64 = 1_000;
/// The floor a link refused for the store's sake asks: the database is usually back
/// within seconds (a restart, a failover), and the agents' own jitter spreads the fleet.
const RETRY_STORE_MS: u64 = 1_000;

/// `code` + `message` as a close frame reason: JSON, cut to fit the 123-byte limit.
pub fn close_frame(code: CloseCode, reason: &CloseReason) -> CloseFrame {
    let mut r = reason.clone();
    let mut text = serde_json::to_string(&r).unwrap_or_default();
    while text.len() > CLOSE_REASON_BYTES && !r.message.is_empty() {
        let over = text.len() - CLOSE_REASON_BYTES;
        let mut keep = r.message.len().saturating_sub(over.max(1));
        while !r.message.is_char_boundary(keep) {
            keep -= 1;
        }
        r.message.truncate(keep);
        text = serde_json::to_string(&r).unwrap_or_default();
    }
    if text.len() > CLOSE_REASON_BYTES {
        text.clear();
    }
    CloseFrame {
        code,
        reason: text.into(),
    }
}

fn reason(code: &str, message: impl Into<String>, retry_after_ms: Option<u64>) -> CloseReason {
    CloseReason {
        code: code.to_string(),
        message: message.into(),
        retry_after_ms,
    }
}

/// The close frame that tells an agent why its link ended.
fn close_for(end: &End) -> CloseFrame {
    let (code, r) = match end {
        End::PingTimeout => (
            CloseCode::Policy,
            reason("ping_timeout", "nothing heard for two ping intervals", None),
        ),
        End::ClosedByAgent | End::Lost(_) => (CloseCode::Normal, reason("closed", "", None)),
        End::Revoked => (
            CloseCode::Policy,
            reason(
                "revoked",
                "this device was revoked; enrol it again with cortex device add",
                Some(RETRY_FORBIDDEN_MS),
            ),
        ),
        End::Replaced => (
            CloseCode::Policy,
            reason(
                "replaced",
                "another connection for this device took over; is the agent running twice?",
                Some(RETRY_REPLACED_MS),
            ),
        ),
        End::Shutdown => (
            CloseCode::Away,
            reason(
                "shutting_down",
                "hub shutting down; reconnect shortly",
                Some(RETRY_SHUTDOWN_MS),
            ),
        ),
        End::Protocol(e) if e.starts_with("message over") => {
            (CloseCode::Size, reason("too_large", e.clone(), None))
        }
        End::Protocol(e) => (
            CloseCode::Protocol,
            reason("protocol_error", e.clone(), None),
        ),
        End::Disowned => (
            CloseCode::Away,
            reason(
                "disowned",
                "another hub recorded this device offline while this hub was silent; link again",
                Some(RETRY_SHUTDOWN_MS),
            ),
        ),
        End::Store => (
            CloseCode::Error,
            reason(
                "store_unavailable",
                "the hub could not record the link; retry shortly",
                Some(RETRY_STORE_MS),
            ),
        ),
    };
    close_frame(code, &r)
}

/// A connection's places under the mesh's two caps: among the connections still in
/// their handshake (TLS, upgrade, hello) and among all of them. Until the hello either
/// may evict it; after, it is a link and is never evicted.
pub struct Places {
    pub handshake: Admitted,
    pub link: Admitted,
}

impl Places {
    /// Resolves once the connection was evicted for a newer one.
    async fn evicted(&self) {
        tokio::select! {
            () = self.handshake.evict.notified() => {}
            () = self.link.evict.notified() => {}
        }
    }

    /// The hello arrived: the handshake's place is freed and the link's is kept, busy.
    fn hello_done(self) -> Admitted {
        let Places { handshake, link } = self;
        drop(handshake);
        link.busy.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        link
    }
}

/// Handles one accepted TCP connection until it closes.
pub async fn connection(
    state: AppState,
    tls: Option<TlsAcceptor>,
    tcp: TcpStream,
    peer: SocketAddr,
    ping: Duration,
    places: Places,
) {
    match tls {
        Some(acceptor) => {
            let tls = tokio::select! {
                r = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)) => r,
                () = places.evicted() => return evicted(peer),
                () = state.shutdown.cancelled() => return,
            };
            match tls {
                Ok(Ok(stream)) => serve(state, stream, peer, ping, places).await,
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "mesh TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "mesh TLS handshake timed out"),
            }
        }
        None => serve(state, tcp, peer, ping, places).await,
    }
}

/// An evicted connection is dropped (closed) without a word: the cap's own warning
/// counts them.
fn evicted(peer: SocketAddr) {
    tracing::debug!(%peer, "mesh connection evicted before its hello");
}

/// Who the upgrade request authenticated.
struct Authed {
    device: String,
    token_hash: [u8; 32],
}

fn refuse(status: StatusCode, r: &CloseReason) -> ErrorResponse {
    let mut resp = ErrorResponse::new(serde_json::to_string(r).ok());
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// Checks the upgrade request: path, device header, bearer token.
fn check_upgrade(state: &AppState, req: &Request) -> Result<Authed, (StatusCode, CloseReason)> {
    if req.uri().path() != MESH_PATH {
        return Err((
            StatusCode::NOT_FOUND,
            reason(
                "not_found",
                format!(
                    "no mesh endpoint at {}; the agent's --hub is ws://HOST:PORT{MESH_PATH} (wss:// with TLS)",
                    req.uri().path()
                ),
                None,
            ),
        ));
    }
    let device = req
        .headers()
        .get(DEVICE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|d| !d.is_empty());
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let (Some(device), Some(token)) = (device, token) else {
        return Err((
            StatusCode::UNAUTHORIZED,
            reason(
                "unauthorized",
                format!(
                    "send the device's name in {DEVICE_HEADER} and its token as Authorization: Bearer TOKEN (from cortex device add NAME)"
                ),
                Some(RETRY_FORBIDDEN_MS),
            ),
        ));
    };
    let known = state
        .devices
        .authenticate(device, token)
        .or_else(|e| match learn(state, device) {
            true => state.devices.authenticate(device, token),
            false => Err(e),
        });
    match known {
        Ok(token_hash) => Ok(Authed {
            device: device.to_string(),
            token_hash,
        }),
        Err(_) => Err((
            StatusCode::FORBIDDEN,
            reason(
                "forbidden",
                format!(
                    "device {device:?} is unknown or its token does not match (revoked, or never added): enrol it on the hub with cortex device add {device}"
                ),
                Some(RETRY_FORBIDDEN_MS),
            ),
        )),
    }
}

/// On a shared store, a device this hub refused is looked up in the store: another hub may
/// have added it, or given it a new token, a moment before its agent dialed here (the bus
/// tells within its poll, the agent would wait out a refusal). What is found is allowed;
/// true when the device was found. The check runs inside tungstenite's synchronous
/// callback, so the read blocks this worker (the runtime moves its other tasks), at most
/// [`LOOKUPS`] at once.
fn learn(state: &AppState, device: &str) -> bool {
    use tokio::runtime::{Handle, RuntimeFlavor};
    if !state.store.is_shared() {
        return false;
    }
    let Ok(rt) = Handle::try_current() else {
        return false;
    };
    if rt.runtime_flavor() != RuntimeFlavor::MultiThread {
        return false;
    }
    let Ok(_permit) = LOOKING.try_acquire() else {
        return false;
    };
    let name = device.to_string();
    // A revoke on this hub during the read wins over what it found.
    let read_at = state.devices.revision();
    let found =
        tokio::task::block_in_place(|| rt.block_on(state.store.read(move |r| r.get_device(&name))));
    match found {
        Ok(Some(rec)) => state.devices.allow_read(&rec.name, rec.token_hash, read_at),
        Ok(None) => false,
        Err(e) => {
            tracing::warn!(device, error = %e, "cannot look a refused device up in the store");
            false
        }
    }
}

/// The upgrade's check, run by tungstenite on the request; who it authenticated is left
/// in `authed`.
struct Upgrade {
    state: AppState,
    authed: Arc<Mutex<Option<Authed>>>,
    peer: SocketAddr,
}

impl Callback for Upgrade {
    fn on_request(self, req: &Request, resp: Response) -> Result<Response, ErrorResponse> {
        match check_upgrade(&self.state, req) {
            Ok(a) => {
                *self.authed.lock().unwrap_or_else(|e| e.into_inner()) = Some(a);
                Ok(resp)
            }
            Err((status, why)) => {
                tracing::warn!(
                    peer = %self.peer,
                    device = req.headers().get(DEVICE_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("-"),
                    %status,
                    code = %why.code,
                    "mesh connection refused"
                );
                Err(refuse(status, &why))
            }
        }
    }
}

/// What the writer task sends.
enum Out {
    /// An encoded [`HubFrame`].
    Frame(Vec<u8>),
    /// A keepalive ping.
    Ping,
    /// The last frame: after it the writer flushes and ends.
    Close(CloseFrame),
}

async fn serve<S>(state: AppState, stream: S, peer: SocketAddr, ping: Duration, places: Places)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let authed: Arc<Mutex<Option<Authed>>> = Arc::default();
    let callback = Upgrade {
        state: state.clone(),
        authed: authed.clone(),
        peer,
    };
    let upgrade =
        tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(ws_config()));
    let ws = tokio::select! {
        r = tokio::time::timeout(HANDSHAKE_TIMEOUT, upgrade) => r,
        () = places.evicted() => return evicted(peer),
        () = state.shutdown.cancelled() => return,
    };
    let conn = match ws {
        Ok(Ok(ws)) => Connection::new(ws),
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "mesh upgrade failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "mesh upgrade timed out");
            return;
        }
    };
    let Some(authed) = authed.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return;
    };
    run_link(state, conn, authed, peer, ping, places).await;
}

/// Reads the hello; `Err` carries why the link must end before it began.
async fn read_hello<S>(source: &mut FrameStream<S>) -> Result<Hello, End>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let read = async {
        loop {
            return match source.next::<AgentFrame>().await {
                Ok(None) => Err(End::Lost("closed before the hello".into())),
                Err(e) => Err(connection_error(e)),
                Ok(Some(Incoming::Frame(AgentFrame::Hello(h)))) => Ok(h),
                Ok(Some(Incoming::Frame(_))) => {
                    Err(End::Protocol("the first frame must be a hello".into()))
                }
                Ok(Some(Incoming::Closed(_))) => Err(End::ClosedByAgent),
                Ok(Some(Incoming::Alive)) => continue,
            };
        }
    };
    match tokio::time::timeout(HELLO_TIMEOUT, read).await {
        Ok(r) => r,
        Err(_) => Err(End::Protocol(format!(
            "no hello within {}s of the upgrade",
            HELLO_TIMEOUT.as_secs()
        ))),
    }
}

/// Why a read ended the link: the socket's error, a binary message that is no frame, or
/// a text message.
fn connection_error(e: ConnectionError) -> End {
    match e {
        ConnectionError::Ws(e) => ws_error(e),
        ConnectionError::Frame(e) => End::Protocol(e.to_string()),
        ConnectionError::Text => {
            End::Protocol("a text message; frames are MessagePack in binary messages".into())
        }
    }
}

fn ws_error(e: WsError) -> End {
    match e {
        WsError::Capacity(c) => End::Protocol(format!(
            "message over the {MAX_MESSAGE_BYTES}-byte cap ({c})"
        )),
        // A TCP connection cut without a close frame is a lost link, not a bad agent.
        WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => {
            End::Lost("the connection ended without a close".into())
        }
        WsError::Protocol(p) => End::Protocol(p.to_string()),
        WsError::ConnectionClosed | WsError::AlreadyClosed => End::ClosedByAgent,
        e => End::Lost(e.to_string()),
    }
}

/// Keeps what a hello reports to sizes worth storing.
fn tidy_hello(h: &mut Hello) {
    h.agent_version = cut(&h.agent_version, 64);
    h.host.hostname = cut(&h.host.hostname, 255);
    h.host.kernel = cut(&h.host.kernel, 255);
    h.host.gpus.truncate(64);
    for g in &mut h.host.gpus {
        *g = cut(g, 128);
    }
    h.capabilities.truncate(32);
    for c in &mut h.capabilities {
        *c = cut(c, 64);
    }
    // Waitpoint ids are short; anything else is not one of ours and is cancelled anyway.
    h.waits.truncate(MAX_WAITS_PER_DEVICE);
    h.waits.retain(|w| !w.is_empty() && w.len() <= 64);
}

/// Sends the close frame for `end` directly (before the writer task exists) and waits
/// briefly for the agent's.
async fn close_early<S>(mut sink: FrameSink<S>, mut source: FrameStream<S>, end: &End)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let bye = async {
        if !matches!(end, End::ClosedByAgent | End::Lost(_)) {
            sink.close(Some(close_for(end))).await;
        }
        drain(&mut source).await;
    };
    let _ = tokio::time::timeout(CLOSE_GRACE, bye).await;
}

/// Reads what the agent still sends until its close (or the connection's end), so its
/// close frame is answered.
async fn drain<S>(source: &mut FrameStream<S>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    while let Ok(Some(_)) = source.next::<AgentFrame>().await {}
}

async fn run_link<S>(
    state: AppState,
    conn: Connection<S>,
    authed: Authed,
    peer: SocketAddr,
    ping: Duration,
    places: Places,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sink, mut source) = conn.split();
    let hello = tokio::select! {
        h = read_hello(&mut source) => h,
        () = places.evicted() => return evicted(peer),
    };
    // Held until the link ends: its place among all the mesh's connections.
    let _place = places.hello_done();
    let opened = match hello {
        Ok(h) => open(&state, h, &authed, peer).await,
        Err(end) => {
            tracing::warn!(%peer, device = authed.device, reason = %end.reason(), "mesh link ended before its hello");
            Err(end)
        }
    };
    let (link, hello) = match opened {
        Ok(opened) => opened,
        Err(end) => return close_early(sink, source, &end).await,
    };
    let window = DEFAULT_WINDOW;
    let (out, rx) = mpsc::channel::<Out>(window as usize * 2 + 8);
    let writer = tokio::spawn(writer(sink, rx));
    let welcome = HubFrame::Welcome {
        version: MESH_VERSION,
        ping_interval_ms: ping.as_millis() as u64,
        window,
        max_message_bytes: MAX_MESSAGE_BYTES as u64,
        capabilities: vec![HUB_CAP_WAITS.to_string()],
    };
    if let Ok(b) = welcome.encode() {
        let _ = out.send(Out::Frame(b)).await;
    }
    tracing::info!(%peer, device = %link.device, agent_version = %hello.agent_version, link = link.id, waits = hello.waits.len(), "device online");

    // Taken once, by this link's one loop; a missing one (never) gets a closed channel.
    let requests = link
        .requests
        .take_receiver()
        .unwrap_or_else(|| mpsc::channel(1).1);
    let waits = LinkWaits::new(
        &state,
        &link.device,
        &hello.agent_version,
        hello.capabilities,
        hello.waits,
    );
    let mut live = Live {
        state,
        link,
        source,
        out,
        writer,
        files: tokio::task::JoinSet::new(),
        in_flight: 0,
        window,
        waits,
        requests,
        ping,
        last_rx: Instant::now(),
        pinger: tokio::time::interval_at(Instant::now() + ping, ping),
    };
    live.pinger
        .set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let end = live.run().await;
    live.close(end, peer).await;
}

/// The hello checked, the link registered and recorded online; `Err` carries why the
/// link ends before it began (its log line written).
async fn open(
    state: &AppState,
    mut hello: Hello,
    authed: &Authed,
    peer: SocketAddr,
) -> Result<(Arc<Link>, Hello), End> {
    let device = authed.device.clone();
    if hello.version != MESH_VERSION {
        let end = End::Protocol(format!(
            "this hub speaks mesh v{MESH_VERSION} and the agent v{}; run the same cortex version on both",
            hello.version
        ));
        tracing::warn!(%peer, device, agent_version = %hello.agent_version, reason = %end.reason(), "mesh link refused");
        return Err(end);
    }
    if hello.device != device {
        let end = End::Protocol(format!(
            "the hello names device {:?} but the upgrade named {device:?}",
            hello.device
        ));
        tracing::warn!(%peer, device, reason = %end.reason(), "mesh link refused");
        return Err(end);
    }
    tidy_hello(&mut hello);

    let now = now_ms();
    let mut new_link = Link::new(
        state.devices.next_link_id(),
        device.clone(),
        hello.agent_version.clone(),
        hello.host.clone(),
        hello.spool,
        now,
    );
    new_link.capabilities = hello.capabilities.clone();
    let link = Arc::new(new_link);
    let replaced = state
        .devices
        .register(link.clone(), &authed.token_hash)
        .map_err(|_| End::Revoked)?;
    if replaced.is_some() {
        tracing::warn!(%peer, device, "a second connection for this device replaces the first; is its agent running twice?");
    }
    let up = Online {
        link: link.id,
        hub: state.claims.hub.clone(),
        agent_version: hello.agent_version.clone(),
        host: hello.host.clone(),
        capabilities: hello.capabilities.clone(),
        spool: hello.spool,
    };
    let replaced_reason = replaced.as_ref().map(|_| End::Replaced.reason());
    let recorded = {
        let d = device.clone();
        state
            .store
            .exec(move |t| t.device_online(&d, &up, replaced_reason.as_deref(), now))
            .await
    };
    match recorded {
        Ok(true) => Ok((link, hello)),
        Ok(false) => {
            state.devices.unregister(&device, link.id);
            Err(End::Revoked)
        }
        Err(e) => {
            tracing::error!(device, error = %e, "cannot record a device online; closing its link");
            state.devices.unregister(&device, link.id);
            Err(End::Store)
        }
    }
}

/// Everything a live link's loop reacts to; [`Live::next`] turns the sources into these
/// and [`Live::handle`] is where the link's state changes.
enum Event {
    /// What the agent sent (`Ok(None)`: the connection ended without a close), or why
    /// reading failed.
    Agent(Result<Option<Incoming<AgentFrame>>, ConnectionError>),
    /// A file's signal came back from the store: its ack (`None`: its task died, and the
    /// agent sends the file again on its next link).
    FileDone(Option<(String, FileOutcome)>),
    /// A remote wait's store write came back.
    WaitWritten(Written),
    /// A commit changed this device's remote waits.
    WaitsChanged,
    /// The sweep asks the agent to list its spool again.
    Rescan,
    /// A frame from outside the loop (`Link::requests`: an `Exec`).
    Request(HubFrame),
    /// Time for a keepalive ping.
    Ping,
    /// Nothing heard from the agent for two ping intervals.
    Silent,
    /// Ended from outside: revoked, replaced, the hub stopping.
    Ended(End),
}

/// A live link: everything its loop owns.
struct Live<S> {
    state: AppState,
    link: Arc<Link>,
    source: FrameStream<S>,
    /// The writer task's queue: every frame out goes through it.
    out: mpsc::Sender<Out>,
    writer: tokio::task::JoinHandle<()>,
    /// Files being recorded, each in its own task so a burst shares group commits.
    files: tokio::task::JoinSet<(String, FileOutcome)>,
    /// Files taken and not yet answered. Lowered just before their ack is queued, so the
    /// hub never counts more than the agent does and a well-behaved agent is never cut.
    in_flight: usize,
    window: u32,
    waits: LinkWaits,
    /// Frames queued through `Link::requests`.
    requests: mpsc::Receiver<HubFrame>,
    ping: Duration,
    /// When something last arrived from the agent.
    last_rx: Instant,
    pinger: tokio::time::Interval,
}

impl<S> Live<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// The loop: the first reconciliation, then events until one ends the link.
    async fn run(&mut self) -> End {
        if let Err(end) = self.reconcile().await {
            return end;
        }
        loop {
            let ev = self.next().await;
            if let Err(end) = self.handle(ev).await {
                return end;
            }
        }
    }

    /// Waits for the next thing to happen. Ending comes first, then the agent.
    async fn next(&mut self) -> Event {
        let silent_until = self.last_rx + 2 * self.ping;
        tokio::select! {
            biased;
            () = self.link.ended.notified() => {
                Event::Ended(self.link.ended_with().unwrap_or(End::Shutdown))
            }
            () = self.state.shutdown.cancelled() => Event::Ended(End::Shutdown),
            msg = self.source.next() => Event::Agent(msg),
            Some(done) = self.files.join_next(), if !self.files.is_empty() => {
                Event::FileDone(done.ok())
            }
            Some(w) = self.waits.written.recv() => Event::WaitWritten(w),
            changed = self.waits.changed.changed() => match changed {
                Ok(()) => Event::WaitsChanged,
                // The store's notifier is gone: the hub is stopping.
                Err(_) => Event::Ended(End::Shutdown),
            },
            () = self.link.rescan.notified() => Event::Rescan,
            Some(f) = self.requests.recv() => Event::Request(f),
            _ = self.pinger.tick() => Event::Ping,
            () = tokio::time::sleep_until(silent_until) => Event::Silent,
        }
    }

    /// Where the link's state changes; `Err` ends the link with that reason.
    async fn handle(&mut self, ev: Event) -> Result<(), End> {
        match ev {
            Event::Agent(Ok(None)) => Err(End::Lost("the connection ended without a close".into())),
            Event::Agent(Err(e)) => Err(connection_error(e)),
            Event::Agent(Ok(Some(m))) => {
                self.last_rx = Instant::now();
                self.link.seen(now_ms());
                self.message(m)
            }
            Event::FileDone(Some((name, outcome))) => {
                self.in_flight = self.in_flight.saturating_sub(1);
                self.state
                    .devices
                    .note_file(&self.link.device, &name, &outcome, now_ms());
                self.send(HubFrame::Ack { name, outcome }).await
            }
            Event::FileDone(None) => {
                self.in_flight = self.in_flight.saturating_sub(1);
                tracing::error!(device = %self.link.device, "a file's task failed; the agent sends the file again on its next link");
                Ok(())
            }
            Event::WaitWritten(w) => match self.waits.written(w)? {
                Some(f) => self.send(f).await,
                None => Ok(()),
            },
            Event::WaitsChanged => self.reconcile().await,
            Event::Rescan => {
                // A full queue means the agent is busy or stuck: the next sweep asks again.
                self.try_send(HubFrame::Rescan);
                Ok(())
            }
            Event::Request(f) => self.send(f).await,
            Event::Ping => {
                let _ = self.out.try_send(Out::Ping);
                Ok(())
            }
            Event::Silent => Err(End::PingTimeout),
            Event::Ended(end) => Err(end),
        }
    }

    /// One thing from the agent.
    fn message(&mut self, m: Incoming<AgentFrame>) -> Result<(), End> {
        let frame = match m {
            Incoming::Frame(f) => f,
            Incoming::Closed(_) => return Err(End::ClosedByAgent),
            Incoming::Alive => return Ok(()),
        };
        match frame {
            AgentFrame::File { name, body } => {
                if self.in_flight >= self.window as usize {
                    return Err(End::Protocol(format!(
                        "more than {} files unacknowledged (the window in the welcome)",
                        self.window
                    )));
                }
                self.in_flight += 1;
                let (state, device) = (self.state.clone(), self.link.device.clone());
                self.files.spawn(async move {
                    let outcome = take_file(&state, &device, &name, &body).await;
                    (name, outcome)
                });
                Ok(())
            }
            AgentFrame::Status { spool } => {
                self.link.set_spool(spool);
                Ok(())
            }
            AgentFrame::WaitArmed {
                wait_id,
                captured,
                resume,
            } => self.waits.armed(&self.state, wait_id, captured, resume),
            AgentFrame::WaitDone {
                wait_id,
                outcome,
                payload,
                message,
            } => self
                .waits
                .done(&self.state, wait_id, outcome, payload, message),
            AgentFrame::ExecStarted { ref exec_id, .. }
            | AgentFrame::ExecRefused { ref exec_id, .. } => {
                if !self.link.requests.answer(exec_id, &frame) {
                    tracing::debug!(device = %self.link.device, exec = %exec_id, "an exec answer nobody waits for (its caller gave up)");
                }
                Ok(())
            }
            AgentFrame::Hello(_) => Err(End::Protocol("a second hello on one link".into())),
        }
    }

    /// Reconciles the link's remote waits and sends what that decided.
    async fn reconcile(&mut self) -> Result<(), End> {
        for f in self.waits.reconcile(&self.state).await? {
            self.send(f).await?;
        }
        Ok(())
    }

    /// Queues one frame for the writer. A full queue (an agent that stopped reading) holds
    /// the loop, but never past a revocation or the hub's stop.
    async fn send(&self, f: HubFrame) -> Result<(), End> {
        tokio::select! {
            biased;
            r = self.queue(f) => r,
            () = self.link.ended.notified() => {
                Err(self.link.ended_with().unwrap_or(End::Shutdown))
            }
            () = self.state.shutdown.cancelled() => Err(End::Shutdown),
        }
    }

    /// Queues one frame, waiting for room as long as it takes (the caller bounds it).
    async fn queue(&self, f: HubFrame) -> Result<(), End> {
        let bytes = f.encode().map_err(|e| End::Protocol(e.to_string()))?;
        self.out
            .send(Out::Frame(bytes))
            .await
            // The writer is gone: the link is ending anyway.
            .map_err(|_| End::Lost("the link's writer stopped".into()))
    }

    /// Queues one frame if there is room; dropped otherwise.
    fn try_send(&self, f: HubFrame) {
        if let Ok(b) = f.encode() {
            let _ = self.out.try_send(Out::Frame(b));
        }
    }

    /// Ends the link: in-flight files answered (when the agent can still hear it), the
    /// device recorded offline with its reason, the close frame, the writer stopped.
    async fn close(mut self, end: End, peer: SocketAddr) {
        let device = self.link.device.clone();
        // Exec's waiters learn at once that no answer comes on this link.
        self.link.requests.close();
        if !matches!(end, End::ClosedByAgent | End::Lost(_) | End::PingTimeout) {
            let drain = async {
                while let Some(done) = self.files.join_next().await {
                    if let Ok((name, outcome)) = done {
                        let _ = self.queue(HubFrame::Ack { name, outcome }).await;
                    }
                }
            };
            let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
        }
        self.files.abort_all();

        let why = end.reason();
        match &end {
            End::Protocol(_) => {
                tracing::warn!(%peer, device, reason = %why, "device link closed for a protocol error")
            }
            _ => tracing::info!(%peer, device, reason = %why, "device offline"),
        }
        // Recorded while the link is still registered, so nobody reads the device offline
        // without its reason. A replaced link's successor already recorded this end, before
        // its own online.
        let link = &self.link;
        if end != End::Replaced {
            let (id, seen, spool) = (link.id, link.last_seen(), link.spool());
            let (d, w) = (device.clone(), why.clone());
            if let Err(e) = self
                .state
                .store
                .exec(move |t| t.device_offline(&d, id, &w, seen, spool, now_ms()))
                .await
            {
                tracing::error!(device, error = %e, "cannot record a device offline");
            }
        }
        self.state.devices.unregister(&device, link.id);

        if !matches!(end, End::ClosedByAgent | End::Lost(_)) {
            let _ = self.out.send(Out::Close(close_for(&end))).await;
        }
        drop(self.out);
        // The writer may be stuck on an agent that stopped reading: bounded.
        if tokio::time::timeout(CLOSE_GRACE, &mut self.writer)
            .await
            .is_err()
        {
            self.writer.abort();
        }
        let _ = tokio::time::timeout(CLOSE_GRACE, drain(&mut self.source)).await;
    }
}

/// Writes every frame of the link, flushing when the queue runs dry, so a burst of acks
/// leaves in few writes.
async fn writer<S>(mut sink: FrameSink<S>, mut rx: mpsc::Receiver<Out>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(o) = next {
            let sent = match o {
                Out::Frame(b) => sink.feed(b).await,
                Out::Ping => sink.ping().await,
                Out::Close(f) => {
                    sink.close(Some(f)).await;
                    return;
                }
            };
            if sent.is_err() {
                return;
            }
            next = rx.try_recv().ok();
        }
        if sink.flush().await.is_err() {
            return;
        }
    }
}

/// A device's spool file: the same checks and store operation as the signal route and
/// the local spool; its identity and its ack are [`SignalSource::DeviceFile`]'s.
pub async fn take_file(state: &AppState, device: &str, name: &str, body: &str) -> FileOutcome {
    let refused = |reason: String| FileOutcome::Refused {
        reason: cut(&reason, MAX_REASON_CHARS),
    };
    if name.is_empty()
        || name.len() > MAX_FILE_NAME_BYTES
        || name.contains(['/', '\0'])
        || name == "."
        || name == ".."
    {
        return refused(format!(
            "file name {:?} is not usable; a spool file's name is 1-{MAX_FILE_NAME_BYTES} bytes without '/'",
            cut(name, 64)
        ));
    }
    if body.len() > MAX_BODY_BYTES {
        return refused(format!(
            "the file is {} bytes, over the cap of {MAX_BODY_BYTES}; write at most 2,000 characters of message and 16,000 of data",
            body.len()
        ));
    }
    let req = match SignalRequest::parse(body.as_bytes()) {
        Ok(r) => r,
        Err(e) => {
            let reason = e.to_string();
            // Counted against nothing, but its warning shares the device's one line a minute.
            state.device_misses.refused(
                device,
                name,
                "-",
                &reason,
                false,
                std::time::Instant::now(),
            );
            return refused(reason);
        }
    };
    let src = SignalSource::DeviceFile { device, file: name };
    let outcome = state.store.signal(src.signal_in(req.clone())).await;
    src.file_ack(&req, outcome, &state.device_misses)
}
