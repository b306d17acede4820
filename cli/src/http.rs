//! A tiny blocking HTTP/1.1 client over `std::net::TcpStream`: one request per connection.
//!
//! It exists so `cortex-signal` starts in about a millisecond. It speaks `http://` only and
//! must stay small: no TLS, no redirects, no keep-alive, no proxies. Its errors say whether
//! the server could not be reached at all (the caller may spool and retry) or answered
//! something that is not HTTP.

use std::borrow::Cow;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// How long to wait for the TCP connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the whole exchange may take once connected.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Status line and headers larger than this are refused.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Bodies larger than this are refused.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
const READ_CHUNK: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The URL is not one this client can use; nothing was sent.
    #[error("bad URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// A header name or value that cannot be sent; nothing was sent.
    #[error("bad header {name:?}: {reason}")]
    InvalidHeader { name: String, reason: String },
    /// Nothing answered: name resolution, connect, or the connection ended (or went
    /// silent) before a status line arrived. The request may or may not have been seen.
    #[error("cannot reach {addr}: {reason}")]
    Unreachable { addr: String, reason: String },
    /// Something answered, but not with a well-formed HTTP response.
    #[error("bad answer from {addr}: {reason}")]
    Protocol { addr: String, reason: String },
}

impl HttpError {
    pub fn is_unreachable(&self) -> bool {
        matches!(self, HttpError::Unreachable { .. })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Delete,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Delete => "DELETE",
        }
    }
}

/// An `http://host[:port][/path][?query]` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub host: String,
    pub port: u16,
    /// Path and query, always starting with `/`.
    pub path: String,
}

impl Url {
    pub fn parse(url: &str) -> Result<Url, HttpError> {
        let bad = |reason: &str| HttpError::InvalidUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        if strip_prefix_ci(url, "https://").is_some() {
            return Err(bad(
                "https is not supported: the hub serves plain http on loopback; use http://host:port",
            ));
        }
        let rest = strip_prefix_ci(url, "http://")
            .ok_or_else(|| bad("only http://host:port/path URLs are supported"))?;
        let (authority, path) = match rest.find(['/', '?', '#']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let path = path.split('#').next().unwrap_or_default();
        let path = if path.starts_with('/') {
            path.to_string()
        } else {
            format!("/{path}")
        };
        if path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(bad(
                "the path contains spaces or control characters; percent-encode them",
            ));
        }
        if authority.contains('@') {
            return Err(bad("user info in the URL is not supported"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| bad("unclosed [ in the host"))?;
            match after {
                "" => (host, None),
                _ => match after.strip_prefix(':') {
                    Some(p) => (host, Some(p)),
                    None => return Err(bad("unexpected characters after ]")),
                },
            }
        } else {
            match authority.split_once(':') {
                Some((h, p)) if !p.contains(':') => (h, Some(p)),
                Some(_) => {
                    return Err(bad(
                        "an IPv6 address must be in brackets, e.g. http://[::1]:3001",
                    ));
                }
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let port = match port {
            None | Some("") => 80,
            Some(p) => match p.parse::<u16>() {
                Ok(0) | Err(_) => return Err(bad("the port must be a number from 1 to 65535")),
                Ok(p) => p,
            },
        };
        Ok(Url {
            host: host.to_string(),
            port,
            path,
        })
    }

    /// `host:port` as written in a `Host` header (IPv6 in brackets).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// A response, read to its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub reason: String,
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

    pub fn text(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }
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

    /// Bound on the whole exchange after the connection is made (write and read).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    pub fn send(&self) -> Result<Response, HttpError> {
        let url = Url::parse(self.url)?;
        let head = self.head(&url)?;
        let addr = url.authority();
        let stream = connect(&url, self.connect_timeout)?;
        let deadline = Instant::now() + self.timeout;
        let mut conn = Conn {
            stream,
            buf: Vec::new(),
            pos: 0,
            deadline,
            timeout: self.timeout,
        };

        let mut wire = head.into_bytes();
        if let Some(body) = self.body {
            wire.extend_from_slice(body);
        }
        conn.write_all(&wire).map_err(|e| HttpError::Unreachable {
            addr: addr.clone(),
            reason: format!("sending the request failed: {}", describe(&e, self.timeout)),
        })?;
        read_response(&mut conn, &addr)
    }

    fn head(&self, url: &Url) -> Result<String, HttpError> {
        let mut head = format!(
            "{} {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nUser-Agent: cortex/{}\r\nAccept: application/json\r\n",
            self.method.as_str(),
            url.path,
            url.authority(),
            env!("CARGO_PKG_VERSION"),
        );
        for (name, value) in &self.headers {
            let bad = |reason: &str| HttpError::InvalidHeader {
                name: name.to_string(),
                reason: reason.to_string(),
            };
            if name.is_empty() || name.bytes().any(|b| !(b.is_ascii_graphic() && b != b':')) {
                return Err(bad("not a valid header name"));
            }
            if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
                return Err(bad("the value contains a line break"));
            }
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        match self.body {
            Some(body) => head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            )),
            None if self.method == Method::Post => head.push_str("Content-Length: 0\r\n"),
            None => {}
        }
        head.push_str("\r\n");
        Ok(head)
    }
}

fn connect(url: &Url, timeout: Duration) -> Result<TcpStream, HttpError> {
    let addr = url.authority();
    let addrs: Vec<SocketAddr> = (url.host.as_str(), url.port)
        .to_socket_addrs()
        .map_err(|e| HttpError::Unreachable {
            addr: addr.clone(),
            reason: format!("cannot resolve {}: {e}", url.host),
        })?
        .collect();
    let mut last = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, timeout) {
            Ok(s) => {
                // Small requests: send them now rather than wait for an ACK.
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    let reason = match last {
        Some(e)
            if matches!(
                e.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ) =>
        {
            format!("connect timed out after {}", human_duration(timeout))
        }
        Some(e) => describe(&e, timeout),
        None => format!("{} resolves to no address", url.host),
    };
    Err(HttpError::Unreachable { addr, reason })
}

/// A short, stable description of an I/O error for messages.
fn describe(e: &io::Error, timeout: Duration) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
        io::ErrorKind::ConnectionReset => "connection reset".to_string(),
        io::ErrorKind::ConnectionAborted => "connection aborted".to_string(),
        io::ErrorKind::BrokenPipe => "connection closed while sending".to_string(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
            format!("no answer within {}", human_duration(timeout))
        }
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

/// The connection with a read buffer and one deadline for the whole exchange.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    pos: usize,
    deadline: Instant,
    timeout: Duration,
}

/// Why a read stopped.
enum ReadErr {
    Io(io::Error),
    Eof,
    TooLong,
}

impl Conn {
    fn remaining(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"))
        } else {
            Ok(left)
        }
    }

    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        let left = self.remaining()?;
        self.stream.set_write_timeout(Some(left))?;
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Reads more bytes into the buffer; `Eof` when the peer closed.
    fn fill(&mut self) -> Result<(), ReadErr> {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        let mut chunk = [0u8; READ_CHUNK];
        loop {
            let left = self.remaining().map_err(ReadErr::Io)?;
            self.stream
                .set_read_timeout(Some(left))
                .map_err(ReadErr::Io)?;
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ReadErr::Eof),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ReadErr::Io(e)),
            }
        }
    }

    /// One line without its `\r\n` (a bare `\n` is accepted too).
    fn read_line(&mut self, limit: usize) -> Result<Vec<u8>, ReadErr> {
        loop {
            if let Some(i) = self.buf[self.pos..].iter().position(|&b| b == b'\n') {
                let mut line = self.buf[self.pos..self.pos + i].to_vec();
                self.pos += i + 1;
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(line);
            }
            if self.buf.len() - self.pos > limit {
                return Err(ReadErr::TooLong);
            }
            self.fill()?;
        }
    }

    fn read_exact_into(&mut self, mut n: usize, out: &mut Vec<u8>) -> Result<(), ReadErr> {
        loop {
            let take = (self.buf.len() - self.pos).min(n);
            out.extend_from_slice(&self.buf[self.pos..self.pos + take]);
            self.pos += take;
            n -= take;
            if n == 0 {
                return Ok(());
            }
            self.fill()?;
        }
    }

    fn read_to_end_into(&mut self, out: &mut Vec<u8>, limit: usize) -> Result<(), ReadErr> {
        loop {
            out.extend_from_slice(&self.buf[self.pos..]);
            self.pos = self.buf.len();
            if out.len() > limit {
                return Err(ReadErr::TooLong);
            }
            match self.fill() {
                Ok(()) => {}
                Err(ReadErr::Eof) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }
}

fn read_response(conn: &mut Conn, addr: &str) -> Result<Response, HttpError> {
    let timeout = conn.timeout;
    let unreachable = |e: ReadErr| HttpError::Unreachable {
        addr: addr.to_string(),
        reason: match e {
            ReadErr::Io(e) => describe(&e, timeout),
            ReadErr::Eof => "the connection closed before an answer".to_string(),
            ReadErr::TooLong => "the status line is too long".to_string(),
        },
    };
    let protocol = |reason: String| HttpError::Protocol {
        addr: addr.to_string(),
        reason,
    };
    let midway = |what: &str, e: ReadErr| {
        protocol(match e {
            ReadErr::Io(e) => format!("{what}: {}", describe(&e, timeout)),
            ReadErr::Eof => format!("{what}: the connection closed early"),
            ReadErr::TooLong => format!("{what}: too large"),
        })
    };

    loop {
        let line = conn.read_line(MAX_HEAD_BYTES).map_err(unreachable)?;
        let (status, reason) = parse_status_line(&line).ok_or_else(|| {
            protocol(format!(
                "not an HTTP status line: {:?}",
                String::from_utf8_lossy(&line)
            ))
        })?;

        let mut headers = Vec::new();
        let mut head_bytes = line.len();
        loop {
            let line = conn
                .read_line(MAX_HEAD_BYTES)
                .map_err(|e| midway("reading the headers", e))?;
            if line.is_empty() {
                break;
            }
            head_bytes += line.len();
            if head_bytes > MAX_HEAD_BYTES {
                return Err(protocol("the headers are too large".to_string()));
            }
            let line = String::from_utf8_lossy(&line);
            let (k, v) = line
                .split_once(':')
                .ok_or_else(|| protocol(format!("not a header line: {line:?}")))?;
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }

        // Interim answers (100 Continue and the like) precede the real one.
        if (100..200).contains(&status) && status != 101 {
            continue;
        }

        let mut resp = Response {
            status,
            reason,
            headers,
            body: Vec::new(),
        };
        let no_body = (100..200).contains(&status) || status == 204 || status == 304;
        if no_body {
            return Ok(resp);
        }
        let chunked = resp
            .header("transfer-encoding")
            .and_then(|te| te.rsplit(',').next())
            .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        if chunked {
            read_chunked(conn, &mut resp.body).map_err(|e| match e {
                ChunkErr::Read(e) => midway("reading a chunked body", e),
                ChunkErr::Bad(reason) => protocol(reason),
            })?;
        } else if let Some(len) = resp.header("content-length") {
            let len: usize = len
                .trim()
                .parse()
                .map_err(|_| protocol(format!("bad Content-Length {len:?}")))?;
            if len > MAX_BODY_BYTES {
                return Err(protocol(format!("the body is too large ({len} bytes)")));
            }
            conn.read_exact_into(len, &mut resp.body)
                .map_err(|e| midway("reading the body", e))?;
        } else {
            conn.read_to_end_into(&mut resp.body, MAX_BODY_BYTES)
                .map_err(|e| midway("reading the body", e))?;
        }
        return Ok(resp);
    }
}

fn parse_status_line(line: &[u8]) -> Option<(u16, String)> {
    let line = std::str::from_utf8(line).ok()?;
    let rest = line.strip_prefix("HTTP/1.")?;
    let mut parts = rest.splitn(3, ' ');
    let _minor = parts
        .next()
        .filter(|m| m.len() == 1 && m.bytes().all(|b| b.is_ascii_digit()))?;
    let code = parts.next()?;
    if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let status = code.parse().ok()?;
    Some((status, parts.next().unwrap_or_default().to_string()))
}

enum ChunkErr {
    Read(ReadErr),
    Bad(String),
}

fn read_chunked(conn: &mut Conn, out: &mut Vec<u8>) -> Result<(), ChunkErr> {
    loop {
        let line = conn.read_line(1024).map_err(ChunkErr::Read)?;
        let line = String::from_utf8_lossy(&line);
        let size = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16)
            .map_err(|_| ChunkErr::Bad(format!("bad chunk size {size:?}")))?;
        if size == 0 {
            // Trailers, up to the empty line; a server that closes here instead is fine.
            loop {
                match conn.read_line(MAX_HEAD_BYTES) {
                    Ok(l) if l.is_empty() => return Ok(()),
                    Ok(_) => {}
                    Err(ReadErr::Eof) => return Ok(()),
                    Err(e) => return Err(ChunkErr::Read(e)),
                }
            }
        }
        if out.len().saturating_add(size) > MAX_BODY_BYTES {
            return Err(ChunkErr::Bad("the body is too large".to_string()));
        }
        conn.read_exact_into(size, out).map_err(ChunkErr::Read)?;
        let end = conn.read_line(2).map_err(ChunkErr::Read)?;
        if !end.is_empty() {
            return Err(ChunkErr::Bad("a chunk is longer than its size".to_string()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testserver::{TestServer, refused_addr};

    fn get(url: &str) -> Result<Response, HttpError> {
        Request::new(Method::Get, url).send()
    }

    #[test]
    fn parses_urls() {
        let u = Url::parse("http://127.0.0.1:3001/webhook/signal").expect("url");
        assert_eq!(
            u,
            Url {
                host: "127.0.0.1".into(),
                port: 3001,
                path: "/webhook/signal".into()
            }
        );
        let u = Url::parse("HTTP://localhost").expect("url");
        assert_eq!((u.port, u.path.as_str()), (80, "/"));
        let u = Url::parse("http://[::1]:9/a?b=c#frag").expect("url");
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("::1", 9, "/a?b=c")
        );
        assert_eq!(u.authority(), "[::1]:9");
        let u = Url::parse("http://h:1?x=1").expect("url");
        assert_eq!(u.path, "/?x=1");
    }

    #[test]
    fn refuses_https_and_junk_urls() {
        let e = Url::parse("https://127.0.0.1:3001/").expect_err("https");
        assert!(e.to_string().contains("https is not supported"), "{e}");
        for bad in [
            "ftp://x",
            "127.0.0.1:3001",
            "http://",
            "http://h:0/",
            "http://h:99999/",
            "http://u@h/",
            "http://::1/",
            "http://h/a b",
        ] {
            assert!(
                matches!(Url::parse(bad), Err(HttpError::InvalidUrl { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn reads_a_content_length_body_and_sends_the_request() {
        let server = TestServer::canned(vec![
            b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: 21\r\n\r\n{\"result\":\"accepted\"}".to_vec(),
        ]);
        let url = server.url("/webhook/signal");
        let resp = Request::new(Method::Post, &url)
            .header("Authorization", "Bearer tok")
            .json(br#"{"id":"wp_1"}"#)
            .send()
            .expect("send");
        assert_eq!(resp.status, 202);
        assert_eq!(resp.reason, "Accepted");
        assert_eq!(resp.header("content-type"), Some("application/json"));
        assert_eq!(resp.body, br#"{"result":"accepted"}"#);

        let req = server.next_request();
        assert_eq!(req.method, "POST");
        assert_eq!(req.path, "/webhook/signal");
        assert_eq!(req.header("authorization"), Some("Bearer tok"));
        assert_eq!(req.header("content-type"), Some("application/json"));
        assert_eq!(req.header("connection"), Some("close"));
        assert_eq!(req.header("host"), Some(server.addr.to_string().as_str()));
        assert_eq!(req.body, br#"{"id":"wp_1"}"#);
    }

    #[test]
    fn reads_a_chunked_body() {
        let server = TestServer::canned(vec![
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n".to_vec(),
        ]);
        let resp = get(&server.url("/")).expect("send");
        assert_eq!(resp.status, 200);
        assert_eq!(resp.body, b"hello, world");
    }

    #[test]
    fn reads_a_close_delimited_body_after_an_interim_answer() {
        let server = TestServer::canned(vec![
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 404 Not Found\r\n\r\n{\"error\":\"x\"}\nmore"
                .to_vec(),
        ]);
        let resp = get(&server.url("/")).expect("send");
        assert_eq!(resp.status, 404);
        assert_eq!(resp.text(), "{\"error\":\"x\"}\nmore");
    }

    #[test]
    fn reads_bodies_larger_than_a_read() {
        let big: Vec<u8> = (0..200_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let mut fixed =
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", big.len()).into_bytes();
        fixed.extend_from_slice(&big);
        let mut chunked = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
            big.len()
        )
        .into_bytes();
        chunked.extend_from_slice(&big);
        chunked.extend_from_slice(b"\r\n0\r\n\r\n");
        let server = TestServer::canned(vec![fixed, chunked]);
        assert_eq!(get(&server.url("/")).expect("fixed").body, big);
        assert_eq!(get(&server.url("/")).expect("chunked").body, big);
    }

    #[test]
    fn no_body_for_204() {
        let server = TestServer::canned(vec![b"HTTP/1.1 204 No Content\r\n\r\n".to_vec()]);
        let resp = Request::new(Method::Delete, &server.url("/x"))
            .send()
            .expect("send");
        assert_eq!(resp.status, 204);
        assert!(resp.body.is_empty());
        assert_eq!(server.next_request().method, "DELETE");
    }

    #[test]
    fn connection_refused_is_unreachable() {
        let url = format!("http://{}/", refused_addr());
        let e = get(&url).expect_err("refused");
        assert!(e.is_unreachable(), "{e}");
        assert!(e.to_string().contains("connection refused"), "{e}");
    }

    #[test]
    fn close_before_a_status_line_is_unreachable() {
        let server = TestServer::canned(vec![Vec::new()]);
        let e = get(&server.url("/")).expect_err("closed");
        assert!(e.is_unreachable(), "{e}");
    }

    #[test]
    fn silence_before_a_status_line_is_unreachable() {
        let server = TestServer::silent();
        let e = Request::new(Method::Get, &server.url("/"))
            .timeout(Duration::from_millis(100))
            .send()
            .expect_err("silent");
        assert!(e.is_unreachable(), "{e}");
        assert!(e.to_string().contains("no answer within 100ms"), "{e}");
    }

    #[test]
    fn garbage_and_short_bodies_are_protocol_errors() {
        let server = TestServer::canned(vec![
            b"SSH-2.0-OpenSSH\r\n".to_vec(),
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc".to_vec(),
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec(),
        ]);
        for _ in 0..3 {
            let e = get(&server.url("/")).expect_err("protocol");
            assert!(matches!(e, HttpError::Protocol { .. }), "{e}");
        }
    }

    #[test]
    fn refuses_header_injection() {
        let e = Request::new(Method::Get, "http://127.0.0.1:1/")
            .header("X-A", "a\r\nX-B: b")
            .send()
            .expect_err("injection");
        assert!(matches!(e, HttpError::InvalidHeader { .. }), "{e}");
    }
}
