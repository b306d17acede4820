//! A simulated device agent: just enough of the mesh protocol to drive the hub's side in
//! tests and, later, to stand in for thousands of devices in a benchmark. One tokio task
//! per device owns its WebSocket: it keeps reading (so pings are answered), pings at the
//! interval the hub's welcome sets, notices a hub that went silent for two intervals, and
//! hands every frame to the test through a channel. No spool, no files on disk. The socket
//! is the agent's: `cortex_daemon::connection` (its limits, its frames).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cortex_daemon::connection::{Connection, ConnectionError, Incoming, ws_config};
use cortex_protocol::mesh::{
    AgentFrame, CloseReason, DEVICE_HEADER, FileOutcome, Hello, HostFacts, HubFrame, MESH_VERSION,
    SpoolCounts,
};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::frame::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How long connecting and the hello/welcome exchange may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a simulated device could not connect, or lost its link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimError {
    /// The upgrade was refused with this HTTP status and body.
    Refused {
        status: u16,
        reason: Option<CloseReason>,
    },
    /// The hub closed the link, with this reason if it gave one.
    Closed(Option<CloseReason>),
    /// Nothing came from the hub for two ping intervals.
    HubSilent,
    Io(String),
    Timeout,
}

/// What the hub's welcome set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Welcome {
    pub version: u32,
    pub ping_interval_ms: u64,
    pub window: u32,
    pub max_message_bytes: u64,
}

/// What the device's task reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimEvent {
    Frame(HubFrame),
    /// The link ended; no more events follow.
    Ended(SimError),
}

enum Cmd {
    /// A frame, encoded by the connection.
    Frame(Box<AgentFrame>),
    /// Any message, as it is (what a frame never is, for the hub's refusals).
    Send(Message),
    /// Stop reading and pinging (a frozen or unplugged agent), keeping the socket open.
    Silence,
    Close,
}

/// How to connect.
#[derive(Debug, Clone)]
pub struct Options {
    pub url: String,
    pub name: String,
    pub token: String,
    /// A PEM CA to trust for `wss://`.
    pub ca_pem: Option<Vec<u8>>,
    /// The hello to send (default: [`hello`] for `name`).
    pub hello: Option<Hello>,
}

impl Options {
    pub fn new(url: &str, name: &str, token: &str) -> Self {
        Options {
            url: url.to_string(),
            name: name.to_string(),
            token: token.to_string(),
            ca_pem: None,
            hello: None,
        }
    }
}

/// The hello a simulated device sends.
pub fn hello(name: &str) -> Hello {
    Hello {
        version: MESH_VERSION,
        device: name.to_string(),
        agent_version: "sim-0.1".into(),
        host: HostFacts {
            hostname: format!("{name}.sim"),
            kernel: "6.1.0-sim".into(),
            cpus: 2,
            gpus: vec![],
        },
        capabilities: vec!["spool".into()],
        spool: SpoolCounts::default(),
        waits: Vec::new(),
    }
}

/// One connected simulated device.
pub struct SimDevice {
    pub welcome: Welcome,
    cmds: mpsc::Sender<Cmd>,
    events: mpsc::UnboundedReceiver<SimEvent>,
}

fn connector(ca_pem: Option<&[u8]>) -> Result<Option<Connector>, SimError> {
    let Some(pem) = ca_pem else {
        return Ok(None);
    };
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pem) {
        let c = c.map_err(|e| SimError::Io(format!("CA PEM: {e}")))?;
        roots
            .add(c)
            .map_err(|e| SimError::Io(format!("CA PEM: {e}")))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| SimError::Io(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Some(Connector::Rustls(Arc::new(config))))
}

/// Opens the WebSocket (upgrade with the device's headers) without saying hello.
pub async fn open(o: &Options) -> Result<Ws, SimError> {
    let mut req = o
        .url
        .as_str()
        .into_client_request()
        .map_err(|e| SimError::Io(format!("bad url {}: {e}", o.url)))?;
    let h = req.headers_mut();
    if !o.name.is_empty() {
        h.insert(
            DEVICE_HEADER,
            HeaderValue::from_str(&o.name).map_err(|e| SimError::Io(e.to_string()))?,
        );
    }
    if !o.token.is_empty() {
        h.insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {}", o.token))
                .map_err(|e| SimError::Io(e.to_string()))?,
        );
    }
    let host = req.uri().host().unwrap_or("127.0.0.1").to_string();
    let port = req.uri().port_u16().unwrap_or(3002);
    let connector = connector(o.ca_pem.as_deref())?;
    let connect = async {
        let tcp = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| SimError::Io(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        tokio_tungstenite::client_async_tls_with_config(req, tcp, Some(ws_config()), connector)
            .await
            .map(|(ws, _)| ws)
            .map_err(|e| match e {
                WsError::Http(resp) => SimError::Refused {
                    status: resp.status().as_u16(),
                    reason: resp
                        .body()
                        .as_deref()
                        .and_then(|b| serde_json::from_slice(b).ok()),
                },
                e => SimError::Io(e.to_string()),
            })
    };
    tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| SimError::Timeout)?
}

/// The reason in a close frame, as the hub writes it (JSON [`CloseReason`]).
pub fn close_reason(m: &Message) -> Option<CloseReason> {
    match m {
        Message::Close(f) => reason_of(f.as_ref()),
        _ => None,
    }
}

fn reason_of(f: Option<&CloseFrame>) -> Option<CloseReason> {
    f.and_then(|f| serde_json::from_str(f.reason.as_str()).ok())
}

impl SimDevice {
    /// Connects, says hello and waits for the welcome.
    pub async fn connect(o: &Options) -> Result<SimDevice, SimError> {
        let mut conn = Connection::new(open(o).await?);
        let hello = AgentFrame::Hello(o.hello.clone().unwrap_or_else(|| hello(&o.name)));
        conn.send(&hello)
            .await
            .map_err(|e| SimError::Io(e.to_string()))?;
        let welcome = tokio::time::timeout(CONNECT_TIMEOUT, async {
            loop {
                match conn.next::<HubFrame>().await {
                    Ok(None) => return Err(SimError::Closed(None)),
                    Err(e @ ConnectionError::Ws(_)) => return Err(SimError::Io(e.to_string())),
                    Ok(Some(Incoming::Closed(f))) => {
                        return Err(SimError::Closed(reason_of(f.as_ref())));
                    }
                    Ok(Some(Incoming::Frame(HubFrame::Welcome {
                        version,
                        ping_interval_ms,
                        window,
                        max_message_bytes,
                        ..
                    }))) => {
                        return Ok(Welcome {
                            version,
                            ping_interval_ms,
                            window,
                            max_message_bytes,
                        });
                    }
                    Ok(Some(Incoming::Frame(other))) => {
                        return Err(SimError::Io(format!("expected a welcome, got {other:?}")));
                    }
                    // The hub sends none; a simulated device skips one, as it always did.
                    Err(ConnectionError::Text) => {}
                    Err(e) => {
                        return Err(SimError::Io(format!("expected a welcome, got {e}")));
                    }
                    Ok(Some(Incoming::Alive)) => {}
                }
            }
        })
        .await
        .map_err(|_| SimError::Timeout)??;
        let (cmds, cmd_rx) = mpsc::channel(256);
        let (ev_tx, events) = mpsc::unbounded_channel();
        tokio::spawn(run(
            conn,
            Duration::from_millis(welcome.ping_interval_ms.max(1)),
            cmd_rx,
            ev_tx,
        ));
        Ok(SimDevice {
            welcome,
            cmds,
            events,
        })
    }

    pub async fn send(&self, f: &AgentFrame) {
        let _ = self.cmds.send(Cmd::Frame(Box::new(f.clone()))).await;
    }

    pub async fn send_raw(&self, m: Message) {
        let _ = self.cmds.send(Cmd::Send(m)).await;
    }

    pub async fn send_file(&self, name: &str, body: &str) {
        self.send(&AgentFrame::File {
            name: name.to_string(),
            body: body.to_string(),
        })
        .await;
    }

    /// Stops reading and pinging: to the hub, this device froze.
    pub async fn silence(&self) {
        let _ = self.cmds.send(Cmd::Silence).await;
    }

    /// Closes the link from the device's side.
    pub async fn close(&self) {
        let _ = self.cmds.send(Cmd::Close).await;
    }

    /// The next event, or `None` after `limit`.
    pub async fn next(&mut self, limit: Duration) -> Option<SimEvent> {
        tokio::time::timeout(limit, self.events.recv())
            .await
            .ok()
            .flatten()
    }

    /// The next ack (rescans are skipped); panics if the link ends or nothing comes.
    pub async fn ack(&mut self, limit: Duration) -> (String, FileOutcome) {
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Some(SimEvent::Frame(HubFrame::Ack { name, outcome })) => return (name, outcome),
                Some(SimEvent::Frame(_)) => {}
                Some(SimEvent::Ended(e)) => {
                    panic!("the link ended while waiting for an ack: {e:?}")
                }
                None => panic!("no ack within {limit:?}"),
            }
        }
    }

    /// Waits for the link to end (frames before it are skipped); `None` if it does not.
    pub async fn ended(&mut self, limit: Duration) -> Option<SimError> {
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Some(SimEvent::Ended(e)) => return Some(e),
                Some(SimEvent::Frame(_)) => {}
                None => return None,
            }
        }
    }
}

/// The device's one task: owns the socket until the link ends.
async fn run(
    mut conn: Connection<MaybeTlsStream<TcpStream>>,
    ping: Duration,
    mut cmds: mpsc::Receiver<Cmd>,
    events: mpsc::UnboundedSender<SimEvent>,
) {
    let mut last_rx = Instant::now();
    let mut pinger = tokio::time::interval_at(Instant::now() + ping, ping);
    let mut silent = false;
    let end = loop {
        let hub_silent = last_rx + 2 * ping;
        tokio::select! {
            cmd = cmds.recv() => match cmd {
                Some(Cmd::Frame(f)) => {
                    if let Err(e) = conn.send(f.as_ref()).await {
                        break SimError::Io(e.to_string());
                    }
                }
                Some(Cmd::Send(m)) => {
                    if let Err(e) = conn.send_message(m).await {
                        break SimError::Io(e.to_string());
                    }
                }
                Some(Cmd::Silence) => silent = true,
                Some(Cmd::Close) | None => {
                    let _ = conn.close(None).await;
                    // Read the hub's answer to our close, then stop.
                    let _ = tokio::time::timeout(Duration::from_secs(2), async {
                        while let Ok(Some(_)) = conn.next::<HubFrame>().await {}
                    })
                    .await;
                    break SimError::Closed(None);
                }
            },
            msg = conn.next::<HubFrame>(), if !silent => {
                last_rx = Instant::now();
                match msg {
                    Ok(None) => break SimError::Closed(None),
                    Err(ConnectionError::Ws(e)) => break SimError::Io(e.to_string()),
                    // The hub sends none; a simulated device skips one, as it always did.
                    Err(ConnectionError::Text) => {}
                    Err(e) => break SimError::Io(format!("bad frame from the hub: {e}")),
                    Ok(Some(Incoming::Closed(f))) => break SimError::Closed(reason_of(f.as_ref())),
                    Ok(Some(Incoming::Frame(f))) => { let _ = events.send(SimEvent::Frame(f)); }
                    Ok(Some(Incoming::Alive)) => {}
                }
            }
            _ = pinger.tick(), if !silent => {
                if let Err(e) = conn.ping().await {
                    break SimError::Io(e.to_string());
                }
            }
            () = tokio::time::sleep_until(hub_silent), if !silent => break SimError::HubSilent,
        }
    };
    let _ = events.send(SimEvent::Ended(end));
    if silent {
        // A frozen device keeps its socket open until the test lets go of it.
        while cmds.recv().await.is_some() {}
    }
}

/// A signal body for a spool file.
pub fn file_body(id: &str, secret: &str, extra: &[(&str, &str)]) -> String {
    let mut m = serde_json::Map::new();
    m.insert("id".into(), id.into());
    m.insert("secret".into(), secret.into());
    for (k, v) in extra {
        m.insert((*k).into(), (*v).into());
    }
    serde_json::Value::Object(m).to_string()
}

/// Reads a PEM file (for `Options::ca_pem`).
pub fn read_pem(p: &Path) -> Vec<u8> {
    std::fs::read(p).expect("read PEM")
}
