//! The API listener's connections: the hub's own accept loop over hyper's HTTP/1.1, so an
//! idle, slow or hostile client cannot hold the hub. A connection gets [`HEADER_TIMEOUT`]
//! to send each request's head (which also ends an idle keep-alive connection) and
//! [`BODY_TIMEOUT`] for its body; at most [`connection_cap`] are open, and a new one
//! past the cap evicts the oldest connection with no request in flight, so a flood of
//! idle sockets never crowds out a job's signal nor takes the descriptors the store and
//! the spool need (the mechanism is `crate::admission`'s, shared with the mesh's
//! listener). Every refusal here, hyper's own included (bad request line, head too
//! large), is the one JSON error shape.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

use super::error::ApiError;
use crate::admission::{self, Admitted, Conns, Throttle};
use crate::state::Shutdown;

/// How long a connection may take to send a request's head; the same clock runs while a
/// keep-alive connection waits for its next request, so it is also the idle timeout. A
/// request in flight (a long poll, an SSE stream) is not idle and is never cut by it.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request's body may take to arrive, whole.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(20);
/// The request line and headers together, at most (hyper's read buffer).
pub const MAX_HEAD_BYTES: usize = 32 * 1024;
/// The request target (path and query), at most.
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// Any request's body, at most (the signal route keeps its own 64 KB).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// The most API connections open at once: half of the descriptors left after
/// `admission::RESERVED_FDS` (the other half is the mesh's), from the soft `RLIMIT_NOFILE`
/// (which `main` raises to the hard limit at start).
pub fn connection_cap() -> usize {
    admission::api_cap(admission::nofile())
}

/// Serves `app` on `listener` until `stop` resolves; then stops accepting, lets every
/// connection finish its request in flight (`shutdown` is cancelled by then, which ends
/// long polls and SSE streams), and returns.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    cap: usize,
    stop: impl Future<Output = ()>,
    shutdown: Shutdown,
) {
    let conns = Conns::new("API connection cap reached: evicting the oldest idle connections");
    let mut tasks = tokio::task::JoinSet::new();
    let mut accept_errors = Throttle::default();
    let mut refused = Throttle::default();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        // Out of descriptors (the cap should prevent it) or a connection
                        // reset before it was taken: pause a moment, never spin.
                        if accept_errors.due() {
                            tracing::warn!(error = %e, times = accept_errors.take(), "accepting an API connection failed");
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Some(conn) = conns.admit(cap) else {
                    if refused.due() {
                        tracing::warn!(cap, refused = refused.take(), "API connection cap reached with every connection busy: refusing new ones");
                    }
                    continue;
                };
                let (stream, peer) = stream;
                let _ = stream.set_nodelay(true);
                tasks.spawn(connection(stream, peer, app.clone(), conn, shutdown.clone()));
            }
        }
    }
    drop(listener);
    let evicted = conns.evicted.load(Ordering::Relaxed);
    if evicted > 0 {
        tracing::info!(
            evicted,
            "idle API connections evicted at the cap since start"
        );
    }
    while tasks.join_next().await.is_some() {}
}

/// Ends the connection a request came on, at once: handed to every request (an
/// extension) for a response that cannot end by itself, as a dropped log follower's
/// whose socket is full and whose body hyper no longer asks for.
#[derive(Clone, Default)]
pub struct Hangup(Arc<tokio::sync::Notify>);

impl Hangup {
    pub fn hang_up(&self) {
        // A permit is kept when the connection is not listening this instant.
        self.0.notify_one();
    }
}

async fn connection(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    app: Router,
    conn: Admitted,
    shutdown: Shutdown,
) {
    let busy = conn.busy.clone();
    let hangup = Hangup::default();
    let given = hangup.clone();
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        let app = app.clone();
        let guard = InFlight::enter(busy.clone());
        // The peer's address, for the routes that answer only loopback (the page).
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        req.extensions_mut().insert(given.clone());
        async move {
            let resp = match app.oneshot(req.map(Body::new)).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            Ok::<_, Infallible>(resp.map(|inner| Tracked {
                inner,
                _in_flight: guard,
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES);
    let served = builder.serve_connection(
        Io {
            inner: TokioIo::new(stream),
            rewrite: None,
            answered: false,
        },
        svc,
    );
    tokio::pin!(served);
    let stop = shutdown.cancelled();
    tokio::pin!(stop);
    let mut stopping = false;
    loop {
        tokio::select! {
            r = served.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "API connection ended");
                }
                break;
            }
            () = conn.evict.notified() => break,
            () = hangup.0.notified() => break,
            () = &mut stop, if !stopping => {
                served.as_mut().graceful_shutdown();
                stopping = true;
            }
        }
    }
}

/// A request in flight on a connection, until its response's body is done.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn enter(busy: Arc<AtomicUsize>) -> Self {
        busy.fetch_add(1, Ordering::AcqRel);
        InFlight(busy)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its connection counted busy while it streams (SSE).
struct Tracked {
    inner: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The socket as hyper sees it, with one change: hyper's automatic answers to a request
/// it could not parse (400, 414, 431: a bare status line, no body) are replaced by the
/// same answer with the JSON error body every other refusal has.
struct Io {
    inner: TokioIo<TcpStream>,
    /// The replacement being written, how much of it is, and the length hyper gave.
    rewrite: Option<(Vec<u8>, usize, usize)>,
    /// A replacement went out: hyper closes next; anything else it writes is dropped.
    answered: bool,
}

impl hyper::rt::Read for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.answered {
            return Poll::Ready(Ok(buf.len()));
        }
        if this.rewrite.is_none() {
            match automatic_answer(buf) {
                Some(bytes) => this.rewrite = Some((bytes, 0, buf.len())),
                None => return Pin::new(&mut this.inner).poll_write(cx, buf),
            }
        }
        let Some((bytes, pos, claimed)) = this.rewrite.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        while *pos < bytes.len() {
            match ready!(Pin::new(&mut this.inner).poll_write(cx, &bytes[*pos..])) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => *pos += n,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        let claimed = *claimed;
        this.rewrite = None;
        this.answered = true;
        Poll::Ready(Ok(claimed))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    // One buffer per write, so an automatic answer is always seen whole.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

/// The JSON answer replacing `buf` when it is one of hyper's automatic 4xx answers: a
/// whole head with no `content-type` and nothing after it. Every answer the router
/// gives carries a content type, so none of them matches.
fn automatic_answer(buf: &[u8]) -> Option<Vec<u8>> {
    if !buf.starts_with(b"HTTP/1.1 4") || !buf.ends_with(b"\r\n\r\n") {
        return None;
    }
    let head = String::from_utf8_lossy(buf).to_ascii_lowercase();
    if head.contains("\r\ncontent-type:") || head.matches("\r\n\r\n").count() != 1 {
        return None;
    }
    let code: u16 = std::str::from_utf8(buf.get(9..12)?).ok()?.parse().ok()?;
    let status = StatusCode::from_u16(code).ok()?;
    let err = match status {
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => headers_too_large(),
        StatusCode::URI_TOO_LONG => uri_too_long(),
        StatusCode::BAD_REQUEST => ApiError::bad_request(
            "the request is not valid HTTP/1.1 (request line or headers); send a request as RFC 9112 describes",
        ),
        _ => ApiError::new(
            status,
            "refused",
            "the request was refused before it was read",
        ),
    };
    let body = err.body_bytes();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        status.as_str(),
        status.canonical_reason().unwrap_or("Error"),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    Some(out)
}

fn headers_too_large() -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "headers_too_large",
        format!(
            "the request line and headers are over {MAX_HEAD_BYTES} bytes, or over 100 headers; send fewer or shorter headers"
        ),
    )
}

fn uri_too_long() -> ApiError {
    ApiError::new(
        StatusCode::URI_TOO_LONG,
        "uri_too_long",
        format!(
            "the request target is over {MAX_URI_BYTES} bytes; send shorter paths and query strings"
        ),
    )
}

/// Closes the connection after this answer: what is left of its request cannot be read.
fn closing(mut resp: Response) -> Response {
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// The router's edge: the target's length, the body read whole within [`BODY_TIMEOUT`]
/// and [`MAX_BODY_BYTES`], and every error answer below (the framework's rejections, a
/// wrong method) turned into the JSON error shape.
pub async fn edge(req: Request, next: Next) -> Response {
    let target_len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if target_len > MAX_URI_BYTES {
        return closing(uri_too_long().into_response());
    }
    // hyper refuses a head over its buffer only when it arrives in pieces; this is the
    // same limit for one that arrived in one read.
    let head_len: usize = req
        .headers()
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum::<usize>()
        + target_len;
    if head_len > MAX_HEAD_BYTES || req.headers().len() > 100 {
        return closing(headers_too_large().into_response());
    }
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let too_large = || {
        closing(
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("the body is over {MAX_BODY_BYTES} bytes; send less"),
            )
            .into_response(),
        )
    };
    let (parts, body) = req.into_parts();
    if parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > MAX_BODY_BYTES as u64)
    {
        return too_large();
    }
    let bytes = match tokio::time::timeout(
        BODY_TIMEOUT,
        Limited::new(body, MAX_BODY_BYTES).collect(),
    )
    .await
    {
        Ok(Ok(c)) => c.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => return too_large(),
        Ok(Err(e)) => {
            return closing(
                ApiError::bad_request(format!("the body could not be read: {e}")).into_response(),
            );
        }
        Err(_) => {
            return closing(
                ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "timeout",
                    format!(
                        "the body did not arrive within {} s; send it whole, at once",
                        BODY_TIMEOUT.as_secs()
                    ),
                )
                .into_response(),
            );
        }
    };
    let resp = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    as_json_error(resp, &method, &path).await
}

/// An error answer the handlers did not write (axum's rejections of a path, query or
/// body; a wrong method) as the JSON error shape (HTML is the page's, left as it is), keeping its headers (`Allow`).
async fn as_json_error(resp: Response, method: &Method, path: &str) -> Response {
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json") || v.starts_with("text/html"));
    // The page's own answers (its login form with an error) are HTML, written on purpose.
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let said = match axum::body::to_bytes(body, 4096).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_string(),
        Err(_) => String::new(),
    };
    let (code, hint) = match status {
        StatusCode::BAD_REQUEST => (
            "bad_request",
            "fix the request; docs/waitpoints.md lists the routes and their parameters".to_string(),
        ),
        // axum adds `Allow` after this layer ran, so it is named, not quoted.
        StatusCode::METHOD_NOT_ALLOWED => (
            "method_not_allowed",
            format!(
                "{method} is not a method of {path}; the answer's Allow header lists its methods"
            ),
        ),
        StatusCode::PAYLOAD_TOO_LARGE => ("too_large", "send a smaller body".to_string()),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (
            "unsupported_media_type",
            "send the body as JSON (content-type: application/json)".to_string(),
        ),
        StatusCode::UNPROCESSABLE_ENTITY => ("unprocessable", "fix the body".to_string()),
        s if s.is_server_error() => ("server_error", "retry shortly".to_string()),
        _ => (
            "refused",
            "see docs/api.md (or GET /api/openapi.json) for the routes".to_string(),
        ),
    };
    let message = if said.is_empty() {
        hint
    } else {
        format!("{said}; {hint}")
    };
    let mut out = ApiError::new(status, code, message).into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_automatic_answers_become_json_and_the_routers_do_not() {
        let auto = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Tue, 01 Dec 2026 06:00:00 GMT\r\n\r\n";
        let out = automatic_answer(auto).expect("rewritten");
        let text = String::from_utf8(out).expect("utf8");
        assert!(text.starts_with("HTTP/1.1 431 "), "{text}");
        let body = text.split("\r\n\r\n").nth(1).expect("body");
        let v: serde_json::Value = serde_json::from_str(body).expect("json");
        assert_eq!(v["error"], "headers_too_large");
        assert!(text.contains(&format!("content-length: {}\r\n", body.len())));

        let ours = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        assert!(automatic_answer(ours).is_none());
        let head_only = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n";
        assert!(automatic_answer(head_only).is_none());
        assert!(automatic_answer(b"HTTP/1.1 100 Continue\r\n\r\n").is_none());
        assert!(automatic_answer(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
    }
}
