//! Test-only HTTP servers on loopback port 0: canned answers, a handler, or silence, each
//! recording the requests that arrived so tests can look at exactly what was sent; and an
//! HTTPS one with a certificate made for the test.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread;
use std::time::Duration;

/// A request as the server saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    /// Path and query.
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("request body is JSON")
    }
}

pub struct TestServer {
    pub addr: SocketAddr,
    rx: Receiver<Recorded>,
}

impl TestServer {
    /// Answers the n-th connection with the n-th canned bytes (an empty one closes without
    /// answering), then stops accepting.
    pub fn canned(responses: Vec<Vec<u8>>) -> TestServer {
        let mut responses = responses.into_iter();
        Self::start(move |_| responses.next())
    }

    /// Calls `handler` for every request, until it returns `None` (the connection is then
    /// closed without an answer and the server stops).
    pub fn handler(
        handler: impl FnMut(&Recorded) -> Option<Vec<u8>> + Send + 'static,
    ) -> TestServer {
        Self::start(handler)
    }

    /// Accepts one connection, reads the request and never answers (until the client leaves).
    pub fn silent() -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = channel();
        thread::spawn(move || {
            if let Ok((mut stream, _)) = listener.accept() {
                if let Some(req) = read_request(&mut stream) {
                    let _ = tx.send(req);
                }
                let mut sink = Vec::new();
                let _ = stream.read_to_end(&mut sink);
            }
        });
        TestServer { addr, rx }
    }

    fn start(mut handler: impl FnMut(&Recorded) -> Option<Vec<u8>> + Send + 'static) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx): (Sender<Recorded>, Receiver<Recorded>) = channel();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let Some(req) = read_request(&mut stream) else {
                    continue;
                };
                let answer = handler(&req);
                let _ = tx.send(req);
                match answer {
                    Some(bytes) => {
                        let _ = stream.write_all(&bytes);
                        let _ = stream.flush();
                    }
                    None => return,
                }
            }
        });
        TestServer { addr, rx }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The next request the server received (waits for it, with a generous bound).
    pub fn next_request(&self) -> Recorded {
        self.rx
            .recv_timeout(Duration::from_secs(30))
            .expect("a request arrived")
    }

    /// Every request received so far that has not been taken yet.
    pub fn requests(&self) -> Vec<Recorded> {
        self.rx.try_iter().collect()
    }
}

/// An address on which nothing listens (a port that was just free).
pub fn refused_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

/// A complete HTTP answer with a JSON body.
pub fn json(status: u16, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Reads one request (head and `Content-Length` body) from a connection.
pub fn read_request(stream: &mut TcpStream) -> Option<Recorded> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_string();
    let path = first.next()?.to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Recorded {
        method,
        path,
        headers,
        body,
    })
}

/// A one-connection-at-a-time HTTPS server with a certificate for `localhost` and
/// 127.0.0.1, answering every request 200 with `{"ok":true}`; returns its port and the
/// certificate (DER) a client must trust.
pub fn tls_server() -> (u16, Vec<u8>) {
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let made = rcgen::generate_simple_self_signed(names).expect("certificate");
    let cert_der = made.cert.der().to_vec();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(vec![cert_der.clone().into()], key)
    .expect("server config");
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let Ok(conn) = rustls::ServerConnection::new(config.clone()) else {
                continue;
            };
            let mut tls = rustls::StreamOwned::new(conn, stream);
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match tls.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            if head.ends_with(b"\r\n\r\n") {
                let body = r#"{"ok":true}"#;
                let _ = write!(
                    tls,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.flush();
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
        }
    });
    (port, cert_der)
}
