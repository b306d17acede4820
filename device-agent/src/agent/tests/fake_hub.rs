//! A minimal hub for the link tests: a tokio-tungstenite server on a loopback port that
//! speaks the mesh frames and does exactly what the test body says, one step at a time
//! (welcome, ack, refuse, close, fall silent). Every wait is bounded.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cortex_protocol::mesh::{
    AgentFrame, CloseReason, DEFAULT_WINDOW, FileOutcome, Frame, HUB_CAP_WAITS, Hello, HubFrame,
    MAX_MESSAGE_BYTES, MESH_VERSION,
};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderMap, StatusCode};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Bytes, Message};

/// Anything a WebSocket can run over: TCP, or TLS over TCP.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Bound on every wait of the fake hub.
pub const LIMIT: Duration = Duration::from_secs(10);

pub struct FakeHub {
    listener: TcpListener,
    pub addr: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl FakeHub {
    pub async fn bind() -> FakeHub {
        FakeHub::bind_at("127.0.0.1:0".parse().expect("addr")).await
    }

    /// Bind a given address (a restarted hub on its old port).
    pub async fn bind_at(addr: SocketAddr) -> FakeHub {
        let listener = TcpListener::bind(addr).await.expect("bind the fake hub");
        let addr = listener.local_addr().expect("local addr");
        FakeHub {
            listener,
            addr,
            tls: None,
        }
    }

    /// A hub serving `wss://` with the test certificate (`tests/tls/hub.pem`, for
    /// `localhost` and 127.0.0.1, signed by `tests/tls/ca.pem`).
    pub async fn bind_tls() -> FakeHub {
        super::super::tls::install_provider();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/agent/tests/tls");
        use rustls_pki_types::pem::PemObject;
        let certs: Vec<_> = rustls_pki_types::CertificateDer::pem_file_iter(dir.join("hub.pem"))
            .expect("hub.pem")
            .collect::<Result<_, _>>()
            .expect("hub.pem");
        let key =
            rustls_pki_types::PrivateKeyDer::from_pem_file(dir.join("hub.key")).expect("hub.key");
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config");
        let mut hub = FakeHub::bind().await;
        hub.tls = Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)));
        hub
    }

    pub fn url(&self) -> String {
        format!("ws://{}/mesh/v1", self.addr)
    }

    pub fn wss_url(&self) -> String {
        format!("wss://localhost:{}/mesh/v1", self.addr.port())
    }

    async fn accept_io(&self) -> Result<Box<dyn Io>, String> {
        let (tcp, _) = tokio::time::timeout(LIMIT, self.listener.accept())
            .await
            .map_err(|_| "no connection from the agent".to_string())?
            .map_err(|e| e.to_string())?;
        match &self.tls {
            None => Ok(Box::new(tcp)),
            Some(acceptor) => acceptor
                .accept(tcp)
                .await
                .map(|s| Box::new(s) as Box<dyn Io>)
                .map_err(|e| format!("TLS handshake failed: {e}")),
        }
    }

    /// Accept the agent's next connection and upgrade it, remembering its headers.
    pub async fn accept(&self) -> Conn {
        self.try_accept().await.expect("accept the agent")
    }

    pub async fn try_accept(&self) -> Result<Conn, String> {
        let io = self.accept_io().await?;
        let (tx, rx) = std::sync::mpsc::channel();
        let callback = move |req: &Request, resp: Response| {
            let _ = tx.send(req.headers().clone());
            Ok::<_, ErrorResponse>(resp)
        };
        let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE_BYTES));
        let ws = tokio_tungstenite::accept_hdr_async_with_config(io, callback, Some(config))
            .await
            .map_err(|e| format!("upgrade failed: {e}"))?;
        let headers = rx.recv().map_err(|e| e.to_string())?;
        Ok(Conn { ws, headers })
    }

    /// Accept the agent's next connection and refuse its upgrade with `status` and `body`.
    pub async fn refuse(&self, status: u16, body: &str) {
        let io = self.accept_io().await.expect("accept the agent");
        let body = body.to_owned();
        let callback = move |_: &Request, _: Response| {
            let mut resp = ErrorResponse::new(Some(body));
            *resp.status_mut() = StatusCode::from_u16(status).expect("status");
            Err(resp)
        };
        let r = tokio_tungstenite::accept_hdr_async(io, callback).await;
        assert!(r.is_err(), "the refused upgrade must not succeed");
    }
}

/// One accepted link, driven by the test.
pub struct Conn {
    ws: WebSocketStream<Box<dyn Io>>,
    pub headers: HeaderMap,
}

impl Conn {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    /// The agent's hello.
    pub async fn hello(&mut self) -> Hello {
        match self.frame().await {
            Some(AgentFrame::Hello(h)) => h,
            other => panic!("expected a hello, got {other:?}"),
        }
    }

    /// Read the hello and answer with a welcome.
    pub async fn welcome(&mut self, ping_ms: u64, window: u32) -> Hello {
        let hello = self.hello().await;
        self.send(&HubFrame::Welcome {
            version: MESH_VERSION,
            ping_interval_ms: ping_ms,
            window,
            max_message_bytes: MAX_MESSAGE_BYTES as u64,
            capabilities: vec![HUB_CAP_WAITS.into()],
        })
        .await;
        hello
    }

    /// Read the hello and welcome with the defaults.
    pub async fn welcome_default(&mut self) -> Hello {
        self.welcome(20_000, DEFAULT_WINDOW).await
    }

    pub async fn send(&mut self, frame: &HubFrame) {
        let bytes = frame.encode().expect("encode");
        self.ws
            .send(Message::Binary(bytes.into()))
            .await
            .expect("send to the agent");
    }

    pub async fn ack(&mut self, name: &str, outcome: FileOutcome) {
        self.send(&HubFrame::Ack {
            name: name.to_owned(),
            outcome,
        })
        .await;
    }

    /// The next frame, skipping pings and pongs; `None` when the agent closed the link.
    pub async fn frame(&mut self) -> Option<AgentFrame> {
        match self.frame_within(LIMIT).await {
            Ok(f) => f,
            Err(()) => panic!("no frame from the agent within {LIMIT:?}"),
        }
    }

    /// Like [`Conn::frame`], but `Err` when nothing came within `limit`.
    pub async fn frame_within(&mut self, limit: Duration) -> Result<Option<AgentFrame>, ()> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let msg = match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Err(_) => return Err(()),
                Ok(None) | Ok(Some(Err(_))) => return Ok(None),
                Ok(Some(Ok(m))) => m,
            };
            match msg {
                Message::Binary(b) => {
                    return Ok(Some(AgentFrame::decode(&b).expect("a mesh frame")));
                }
                Message::Close(_) => return Ok(None),
                _ => {}
            }
        }
    }

    /// The next file frame (status frames are skipped): name and body.
    pub async fn file(&mut self) -> (String, String) {
        loop {
            match self.frame().await {
                Some(AgentFrame::File { name, body }) => return (name, body),
                Some(AgentFrame::Status { .. }) => {}
                other => panic!("expected a file, got {other:?}"),
            }
        }
    }

    /// A file frame within `limit`, or `None` (status frames are skipped).
    pub async fn file_within(&mut self, limit: Duration) -> Option<(String, String)> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.frame_within(left).await {
                Err(()) | Ok(None) => return None,
                Ok(Some(AgentFrame::File { name, body })) => return Some((name, body)),
                Ok(Some(_)) => {}
            }
        }
    }

    /// The next remote-wait frame (`WaitArmed` or `WaitDone`), skipping status frames.
    pub async fn wait_frame(&mut self) -> AgentFrame {
        loop {
            match self.frame().await {
                Some(f @ (AgentFrame::WaitArmed { .. } | AgentFrame::WaitDone { .. })) => {
                    return f;
                }
                Some(AgentFrame::Status { .. }) => {}
                other => panic!("expected a remote-wait frame, got {other:?}"),
            }
        }
    }

    /// A remote-wait frame within `limit`, or `None` (status frames are skipped).
    pub async fn wait_frame_within(&mut self, limit: Duration) -> Option<AgentFrame> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.frame_within(left).await {
                Err(()) | Ok(None) => return None,
                Ok(Some(f @ (AgentFrame::WaitArmed { .. } | AgentFrame::WaitDone { .. }))) => {
                    return Some(f);
                }
                Ok(Some(_)) => {}
            }
        }
    }

    /// The close frame the agent sends (skipping other frames), as its JSON reason.
    pub async fn close_reason(&mut self) -> Option<CloseReason> {
        loop {
            let msg = tokio::time::timeout(LIMIT, self.ws.next())
                .await
                .expect("the agent's close within the limit");
            match msg {
                Some(Ok(Message::Close(Some(f)))) => {
                    return serde_json::from_str(f.reason.as_str()).ok();
                }
                Some(Ok(Message::Close(None))) | None | Some(Err(_)) => return None,
                Some(Ok(_)) => {}
            }
        }
    }

    /// Close the link with a reason, as the hub does when it ends a link.
    pub async fn close_with(&mut self, reason: &CloseReason) {
        let frame = CloseFrame {
            code: CloseCode::Policy,
            reason: serde_json::to_string(reason).expect("json").into(),
        };
        let _ = self.ws.send(Message::Close(Some(frame))).await;
    }

    /// Answer pings from now on without the test's help, until the returned task is
    /// dropped or aborted: a healthy but idle hub.
    pub fn keep_alive(self) -> tokio::task::JoinHandle<Conn> {
        tokio::spawn(async move {
            let mut conn = self;
            while let Some(Ok(_)) = conn.ws.next().await {}
            conn
        })
    }

    #[allow(dead_code)]
    pub async fn ping(&mut self) {
        let _ = self.ws.send(Message::Ping(Bytes::new())).await;
    }
}
