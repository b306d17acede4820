//! The blocking HTTP client both binaries use: one request per connection over `ureq`, so no
//! async runtime (`cortex-signal` starts in about a millisecond), with rustls (the *ring*
//! provider) for `https://`, trusting this machine's CA store (loaded only for an `https`
//! URL). No proxies and no redirects: the hub is asked exactly where the URL says.
//!
//! Its errors tell apart what the callers act on: the server could not be reached (the
//! signal is spooled, `cortex wait for` asks again), TLS failed, or something answered that
//! is not HTTP; and a URL that cannot be used, before anything is sent.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use ureq::http::{self, Uri};
use ureq::tls::{Certificate, RootCerts, TlsConfig, TlsProvider};
use ureq::{Agent, Timeout};

/// How long to wait for the connection (TCP, and TLS if `https`).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long each step of the exchange may take once connected.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Bodies larger than this are refused.
const MAX_BODY_BYTES: u64 = 64 * 1024 * 1024;
/// Each of the connection's read and write buffers, and the most an answer's head may take.
const BUFFER_BYTES: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The URL is not one this client can use; nothing was sent.
    #[error("bad URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// The request cannot be built (a header value with a line break); nothing was sent.
    #[error("bad request: {reason}")]
    InvalidRequest { reason: String },
    /// Nothing answered: name resolution, connect, or the connection ended (or went
    /// silent) before a status line arrived. The request may or may not have been seen,
    /// unless `unsent`: it failed before anything was written (the name did not resolve,
    /// the connection was refused or timed out), so the server certainly did not see it.
    #[error("cannot reach {addr}: {reason}")]
    Unreachable {
        addr: String,
        reason: String,
        unsent: bool,
    },
    /// The TLS handshake failed (most often: this machine does not trust the server's
    /// certificate, or the server does not speak TLS). Nothing was sent.
    #[error("TLS with {addr} failed: {reason}")]
    Tls { addr: String, reason: String },
    /// Something answered, but not with a well-formed HTTP response.
    #[error("bad answer from {addr}: {reason}")]
    Protocol { addr: String, reason: String },
}

impl HttpError {
    pub fn is_unreachable(&self) -> bool {
        matches!(self, HttpError::Unreachable { .. })
    }

    /// Nothing reached the server: it could not be resolved or connected to.
    pub fn never_sent(&self) -> bool {
        matches!(self, HttpError::Unreachable { unsent: true, .. })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Put,
    Delete,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
        }
    }

    fn http(self) -> http::Method {
        match self {
            Method::Get => http::Method::GET,
            Method::Post => http::Method::POST,
            Method::Put => http::Method::PUT,
            Method::Delete => http::Method::DELETE,
        }
    }
}

/// An `http://` or `https://` URL with a host, checked before anything is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    uri: Uri,
    /// `host:port` as written in the URL (for messages).
    pub authority: String,
}

impl Url {
    pub fn parse(url: &str) -> Result<Url, HttpError> {
        let bad = |reason: &str| HttpError::InvalidUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        // A fragment is never sent.
        let without_fragment = url.split('#').next().unwrap_or_default();
        let uri: Uri = without_fragment.parse().map_err(|e: http::uri::InvalidUri| {
            if without_fragment.contains("://") {
                bad(&format!(
                    "{e}; percent-encode spaces and control characters, and put an IPv6 address in brackets"
                ))
            } else {
                bad("only http:// and https:// URLs are supported, e.g. http://127.0.0.1:3001")
            }
        })?;
        match uri.scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https") => {}
            _ => {
                return Err(bad(
                    "only http:// and https:// URLs are supported, e.g. http://127.0.0.1:3001",
                ));
            }
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        if authority.as_str().contains('@') {
            return Err(bad("user info in the URL is not supported"));
        }
        if authority.host().is_empty() {
            return Err(bad("no host"));
        }
        // After the host (an IPv6 host is in brackets): `:port`, which must fit.
        let after_host = authority.as_str().rsplit(']').next().unwrap_or_default();
        if after_host.contains(':') && !matches!(authority.port_u16(), Some(1..)) {
            return Err(bad("the port must be a number from 1 to 65535"));
        }
        let authority = authority.to_string();
        Ok(Url { uri, authority })
    }

    pub fn is_https(&self) -> bool {
        self.uri
            .scheme_str()
            .is_some_and(|s| s.eq_ignore_ascii_case("https"))
    }

    /// Path and query, always starting with `/`.
    pub fn path(&self) -> String {
        match self.uri.query() {
            Some(q) => format!("{}?{q}", self.uri.path()),
            None => self.uri.path().to_string(),
        }
    }
}

/// A response, read to its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first header of that name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }
}

/// An answer whose body is still arriving ([`Request::open`]).
pub struct Streaming {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// The body as it comes (chunked transfer decoded); ends when the server closes it.
    pub body: Box<dyn io::Read + Send>,
}

impl std::fmt::Debug for Streaming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streaming")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

fn headers_of(parts: &http::response::Parts) -> Vec<(String, String)> {
    parts
        .headers
        .iter()
        .map(|(k, v)| {
            let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
            (k.as_str().to_string(), v)
        })
        .collect()
}

/// Which CAs an `https` request trusts.
#[derive(Debug, Clone, Default)]
pub enum Trust {
    /// This machine's CA store (`rustls-native-certs`: the system's bundle, or the PEM
    /// file `SSL_CERT_FILE` names, or the directory `SSL_CERT_DIR` names).
    #[default]
    Native,
    /// Only these DER certificates (tests, with a CA of their own).
    Only(Arc<Vec<Vec<u8>>>),
}

/// One request; build it, then [`Request::send`].
#[derive(Debug, Clone)]
pub struct Request<'a> {
    method: Method,
    url: &'a str,
    headers: Vec<(&'a str, &'a str)>,
    body: Option<&'a [u8]>,
    connect_timeout: Duration,
    timeout: Duration,
    trust: Trust,
}

impl<'a> Request<'a> {
    pub fn new(method: Method, url: &'a str) -> Self {
        Request {
            method,
            url,
            headers: Vec::new(),
            body: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            timeout: DEFAULT_TIMEOUT,
            trust: Trust::Native,
        }
    }

    pub fn header(mut self, name: &'a str, value: &'a str) -> Self {
        self.headers.push((name, value));
        self
    }

    /// A JSON body, sent with `Content-Type: application/json` and its `Content-Length`.
    pub fn json(mut self, body: &'a [u8]) -> Self {
        self.body = Some(body);
        self
    }

    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Bound on each step after the connection is made: sending the request, sending the
    /// body, waiting for the answer's head, reading its body.
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    pub fn trust(mut self, trust: Trust) -> Self {
        self.trust = trust;
        self
    }

    pub fn send(&self) -> Result<Response, HttpError> {
        let (url, parts, mut body) = self.exchange("application/json", Some(self.timeout))?;
        let body = body
            .with_config()
            .limit(MAX_BODY_BYTES)
            .read_to_vec()
            .map_err(|e| self.classify(&url, Phase::Body, e))?;
        Ok(Response {
            status: parts.status.as_u16(),
            headers: headers_of(&parts),
            body,
        })
    }

    /// Sends the request and returns once the answer's head is in, with its body as a
    /// reader: for a stream that never ends (SSE, asked for with `accept`). The body has
    /// no time bound; the caller decides how long silence may last.
    pub fn open(&self, accept: &str) -> Result<Streaming, HttpError> {
        let (_, parts, body) = self.exchange(accept, None)?;
        Ok(Streaming {
            status: parts.status.as_u16(),
            headers: headers_of(&parts),
            body: Box::new(body.into_reader()),
        })
    }

    /// Connects, sends, and waits for the answer's head; `body_timeout` bounds reading
    /// the whole body (`None`: no bound).
    fn exchange(
        &self,
        accept: &str,
        body_timeout: Option<Duration>,
    ) -> Result<(Url, http::response::Parts, ureq::Body), HttpError> {
        let url = Url::parse(self.url)?;
        let invalid = |e: http::Error| HttpError::InvalidRequest {
            reason: e.to_string(),
        };
        let mut req = http::Request::builder()
            .method(self.method.http())
            .uri(url.uri.clone())
            .header(http::header::ACCEPT, accept);
        for (name, value) in &self.headers {
            req = req.header(*name, *value);
        }
        let agent = self.agent(&url, body_timeout)?;
        let answer = match self.body {
            Some(body) => {
                req = req.header(http::header::CONTENT_TYPE, "application/json");
                // A body that takes more than one write waits for the server's go-ahead:
                // a server that refuses it by its length alone (the hub's 413 over 64 KB)
                // answers at once, and that answer is read instead of the write failing
                // on a closed connection. ureq sends the body anyway after a second.
                if body.len() > BUFFER_BYTES {
                    req = req.header(http::header::EXPECT, "100-continue");
                }
                agent.run(req.body(body).map_err(invalid)?)
            }
            None => agent.run(req.body(()).map_err(invalid)?),
        };
        let (parts, body) = answer
            .map_err(|e| self.classify(&url, Phase::Exchange, e))?
            .into_parts();
        Ok((url, parts, body))
    }

    fn agent(&self, url: &Url, body_timeout: Option<Duration>) -> Result<Agent, HttpError> {
        let mut config = Agent::config_builder()
            // Statuses are answers the callers read, not errors.
            .http_status_as_error(false)
            .max_redirects(0)
            .proxy(None)
            .max_idle_connections(0)
            // Smaller than ureq's 128 KiB each: a fresh buffer costs page faults, and
            // `cortex-signal` pays them on every run. Heads here are small; a body passes
            // through in pieces.
            .input_buffer_size(BUFFER_BYTES)
            .output_buffer_size(BUFFER_BYTES)
            .max_response_header_size(BUFFER_BYTES)
            .user_agent(format!("cortex/{}", env!("CARGO_PKG_VERSION")))
            // Each step has its own bound. No bound on name resolution, and none on the
            // whole call: either makes ureq resolve on a thread of its own, which costs
            // `cortex-signal` a third of its time; the system's resolver has its own
            // timeouts.
            .timeout_connect(Some(self.connect_timeout))
            .timeout_send_request(Some(self.timeout))
            .timeout_send_body(Some(self.timeout))
            .timeout_recv_response(Some(self.timeout))
            .timeout_recv_body(body_timeout);
        if url.is_https() {
            config = config.tls_config(tls_config(&self.trust, &url.authority)?);
        }
        Ok(config.build().new_agent())
    }

    /// What a failure means for the caller; `phase` says whether the answer's head had
    /// arrived (a failure in the body is a bad answer, not an unreachable server).
    fn classify(&self, url: &Url, phase: Phase, e: ureq::Error) -> HttpError {
        let addr = url.authority.clone();
        let unreachable = |reason: String| HttpError::Unreachable {
            addr: addr.clone(),
            reason,
            unsent: false,
        };
        let unsent = |reason: String| HttpError::Unreachable {
            addr: addr.clone(),
            reason,
            unsent: true,
        };
        let protocol = |reason: String| match phase {
            Phase::Exchange => HttpError::Protocol {
                addr: addr.clone(),
                reason,
            },
            Phase::Body => HttpError::Protocol {
                addr: addr.clone(),
                reason: format!("reading the body: {reason}"),
            },
        };
        let waited = |reason: String| match phase {
            Phase::Exchange => unreachable(reason),
            Phase::Body => protocol(reason),
        };
        match e {
            ureq::Error::HostNotFound => unsent(format!(
                "cannot resolve {}",
                url.uri.host().unwrap_or_default()
            )),
            ureq::Error::ConnectionFailed => unsent("connection failed".to_string()),
            ureq::Error::Timeout(Timeout::Connect) => unsent(format!(
                "connect timed out after {}",
                human_duration(self.connect_timeout)
            )),
            ureq::Error::Timeout(_) => {
                waited(format!("no answer within {}", human_duration(self.timeout)))
            }
            ureq::Error::Io(e) => match rustls_error(&e) {
                Some(tls) => HttpError::Tls {
                    addr,
                    reason: describe_tls(tls),
                },
                // Said only by name resolution or `connect`: nothing was written. The
                // resolver's failure has no kind of its own, only std's words for it.
                None if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::HostUnreachable
                        | io::ErrorKind::NetworkUnreachable
                        | io::ErrorKind::AddrNotAvailable
                ) || e.to_string().starts_with("failed to lookup address") =>
                {
                    unsent(describe(&e))
                }
                None if e.kind() == io::ErrorKind::UnexpectedEof => {
                    waited("the connection closed before an answer".to_string())
                }
                None => waited(describe(&e)),
            },
            ureq::Error::Rustls(tls) => HttpError::Tls {
                addr,
                reason: describe_tls(&tls),
            },
            ureq::Error::Tls(reason) => HttpError::Tls {
                addr,
                reason: reason.to_string(),
            },
            ureq::Error::Http(e) => HttpError::InvalidRequest {
                reason: e.to_string(),
            },
            ureq::Error::BadUri(reason) => HttpError::InvalidUrl {
                url: self.url.to_string(),
                reason,
            },
            ureq::Error::BodyExceedsLimit(_) => protocol(format!(
                "the body is larger than {} MiB",
                MAX_BODY_BYTES / 1024 / 1024
            )),
            other => protocol(other.to_string()),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Connecting, sending, waiting for the status line and headers.
    Exchange,
    /// Reading the body after the head arrived.
    Body,
}

/// The TLS settings for an `https` URL: rustls with *ring* (installed as the process's
/// provider, as the hub and the agent do; never aws-lc-rs) and the CAs `trust` names.
fn tls_config(trust: &Trust, addr: &str) -> Result<TlsConfig, HttpError> {
    // Already installed (by an earlier request in this process) is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let roots: Vec<Certificate<'static>> = match trust {
        Trust::Native => {
            let found = rustls_native_certs::load_native_certs();
            if found.certs.is_empty() {
                let why = found
                    .errors
                    .first()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default();
                return Err(HttpError::Tls {
                    addr: addr.to_string(),
                    reason: format!(
                        "no trusted CA certificates found on this machine{why}; install the ca-certificates package or set SSL_CERT_FILE"
                    ),
                });
            }
            found
                .certs
                .iter()
                .map(|c| Certificate::from_der(c.as_ref()).to_owned())
                .collect()
        }
        Trust::Only(ders) => ders
            .iter()
            .map(|d| Certificate::from_der(d).to_owned())
            .collect(),
    };
    Ok(TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .root_certs(RootCerts::Specific(Arc::new(roots)))
        .build())
}

/// The rustls error inside an I/O error from the handshake, if that is what it is.
fn rustls_error(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

fn describe_tls(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(_) => format!(
            "{e}; the hub's certificate must chain to a CA this machine trusts (its CA store, or the PEM file SSL_CERT_FILE names)"
        ),
        rustls::Error::InvalidMessage(_) => {
            format!("{e}; is the server speaking TLS (or should the URL be http://)?")
        }
        e => e.to_string(),
    }
}

/// A short, stable description of an I/O error for messages.
fn describe(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
        io::ErrorKind::ConnectionReset => "connection reset".to_string(),
        io::ErrorKind::ConnectionAborted => "connection aborted".to_string(),
        io::ErrorKind::BrokenPipe => "connection closed while sending".to_string(),
        _ => e.to_string(),
    }
}

fn human_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests;
