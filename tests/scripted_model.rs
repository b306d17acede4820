//! A scripted OpenAI-compatible model server for tests and benchmarks: a real HTTP/1.1
//! server (hyper, keep-alive, chunked `text/event-stream`) on `127.0.0.1:0` that answers
//! `POST /v1/chat/completions` with the [`Reply`]s it was given, in order, then with a
//! default reply forever. It records every request body, and whether each answer was sent
//! whole or the client went away first. For benchmarks it also keeps when each request
//! arrived and when its answer was written ([`Timing`]), and how many answers are open at
//! once and the most ever open ([`ScriptedModel::max_in_flight`]).
//!
//! The server runs on its own thread and runtime, so sync tests and async tests use it
//! alike; dropping the [`ScriptedModel`] stops it (and every answer still hanging).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};

mod reply;

use reply::Kind;
pub use reply::Reply;

/// A rule-based answer: the reply for a request body.
type ReplyFn = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;

/// A generated body: write `n` (0-based) of the stream, `None` to end it.
type WriteFn = Arc<dyn Fn(usize) -> Option<Vec<u8>> + Send + Sync>;

/// How an answer ended, by the server's account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every byte handed to the connection.
    Sent,
    /// The client closed the connection before the answer was whole.
    ClientGone,
}

/// When one request came and went, by the server's clock (the same process's `Instant`s, so
/// a bench in the process can compare them with its own).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// The request's head was read (its body follows at once; reading and parsing it is
    /// the server's work, not the client's).
    pub arrived: Instant,
    /// The answer's last byte was handed to the connection; `None` while it is open, or
    /// when the client left first.
    pub answered: Option<Instant>,
}

struct Shared {
    script: Mutex<VecDeque<Reply>>,
    default: Mutex<Reply>,
    requests: Mutex<Vec<Value>>,
    timings: Mutex<Vec<Timing>>,
    auth: Mutex<Vec<Option<String>>>,
    targets: Mutex<Vec<String>>,
    outcomes: Mutex<Vec<Option<Outcome>>>,
    changed: Condvar,
    async_changed: tokio::sync::Notify,
    connections: AtomicUsize,
    /// Chat requests whose answer has not ended yet, and the most there ever were.
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// A context size in tokens, as llama.cpp's server has one: reported at `GET /props`,
    /// and a chat request whose prompt reaches it refused (400) as llama.cpp refuses it.
    context: Mutex<Option<u64>>,
    /// Whether `GET /props` tells the context (a server that does not: 404).
    context_reported: AtomicBool,
    refused: AtomicUsize,
    /// Bytes of streamed answers handed to the connections so far.
    bytes_sent: std::sync::atomic::AtomicU64,
}

impl Shared {
    fn set_outcome(&self, n: usize, o: Outcome) {
        let at = Instant::now();
        let mut outcomes = self.outcomes.lock().expect("outcomes");
        if outcomes.len() <= n {
            outcomes.resize(n + 1, None);
        }
        let first = outcomes[n].is_none();
        outcomes[n].get_or_insert(o);
        drop(outcomes);
        if first
            && o == Outcome::Sent
            && let Some(t) = self.timings.lock().expect("timings").get_mut(n)
        {
            t.answered = Some(at);
        }
        self.notify();
    }

    fn notify(&self) {
        // The requests' lock is the condvar's: take it so no waiter misses the change.
        drop(self.requests.lock().expect("requests"));
        self.changed.notify_all();
        self.async_changed.notify_waiters();
    }
}

/// The running server.
pub struct ScriptedModel {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ScriptedModel {
    /// Serves `replies` in order, then `Reply::text("ok")` for ever.
    pub fn start(replies: Vec<Reply>) -> ScriptedModel {
        ScriptedModel::start_with_default(replies, Reply::text("ok"))
    }

    /// Serves `replies` in order, then `default` for ever (a [`Reply::from_fn`] makes a
    /// rule-based model).
    pub fn start_with_default(replies: Vec<Reply>, default: Reply) -> ScriptedModel {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the model server");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared {
            script: Mutex::new(replies.into()),
            default: Mutex::new(default),
            requests: Mutex::new(Vec::new()),
            timings: Mutex::new(Vec::new()),
            auth: Mutex::new(Vec::new()),
            targets: Mutex::new(Vec::new()),
            outcomes: Mutex::new(Vec::new()),
            changed: Condvar::new(),
            async_changed: tokio::sync::Notify::new(),
            connections: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            context: Mutex::new(None),
            context_reported: AtomicBool::new(true),
            refused: AtomicUsize::new(0),
            bytes_sent: std::sync::atomic::AtomicU64::new(0),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = shared.clone();
        let thread = std::thread::Builder::new()
            .name("scripted-model".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                    tokio::select! {
                        _ = stopped => {}
                        _ = accept_loop(listener, serving) => {}
                    }
                });
                // Dropping the runtime ends every connection and hanging answer.
            })
            .expect("spawn the model server");
        ScriptedModel {
            addr,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The base URL, `http://127.0.0.1:PORT/v1`.
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request body received, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.shared.requests.lock().expect("requests").clone()
    }

    /// How many requests arrived so far (without copying their bodies).
    pub fn request_count(&self) -> usize {
        self.shared.requests.lock().expect("requests").len()
    }

    /// Request `n`'s body (0-based), once it arrived.
    pub fn request(&self, n: usize) -> Option<Value> {
        self.shared
            .requests
            .lock()
            .expect("requests")
            .get(n)
            .cloned()
    }

    /// When each request arrived and was answered, in order (the same order as
    /// [`ScriptedModel::requests`]).
    pub fn timings(&self) -> Vec<Timing> {
        self.shared.timings.lock().expect("timings").clone()
    }

    /// Chat requests being answered right now (arrived, answer not ended).
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// The most chat requests ever answered at once, since the start or the last
    /// [`ScriptedModel::reset_max_in_flight`].
    pub fn max_in_flight(&self) -> usize {
        self.shared.max_in_flight.load(Ordering::SeqCst)
    }

    /// Starts counting the most at once afresh (from those open now).
    pub fn reset_max_in_flight(&self) {
        let now = self.shared.in_flight.load(Ordering::SeqCst);
        self.shared.max_in_flight.store(now, Ordering::SeqCst);
    }

    /// Each request's `Authorization` header, in order.
    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.shared.auth.lock().expect("auth").clone()
    }

    /// Each request's target (path and query), in order, whatever its route.
    pub fn targets(&self) -> Vec<String> {
        self.shared.targets.lock().expect("targets").clone()
    }

    /// TCP connections accepted so far (keep-alive reuses one for many requests).
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Gives the server a context of `tokens`, as llama.cpp's has: `GET /props` reports it
    /// (`default_generation_settings.n_ctx`), and a chat request whose prompt holds that
    /// many tokens or more (a token every four bytes of the body, as its usage counts) is
    /// answered 400 with llama.cpp's words and numbers (recorded as a request; no reply of
    /// the script is used).
    pub fn set_context(&self, tokens: Option<u64>) {
        *self.shared.context.lock().expect("context") = tokens;
    }

    /// Whether `GET /props` tells the context set (default yes; no: 404, as a server
    /// without the route answers).
    pub fn report_context(&self, yes: bool) {
        self.shared.context_reported.store(yes, Ordering::SeqCst);
    }

    /// Bytes of streamed answers handed to the connections so far.
    pub fn bytes_sent(&self) -> u64 {
        self.shared.bytes_sent.load(Ordering::SeqCst)
    }

    /// Chat requests refused for their size so far.
    pub fn refused(&self) -> usize {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// Adds a reply at the end of the script.
    pub fn push(&self, reply: Reply) {
        self.shared.script.lock().expect("script").push_back(reply);
    }

    /// Replaces the reply given once the script ran out.
    pub fn set_default(&self, reply: Reply) {
        *self.shared.default.lock().expect("default") = reply;
    }

    /// Blocks until `n` requests arrived (at most `limit`, then panics); returns them all.
    pub fn wait_requests(&self, n: usize, limit: Duration) -> Vec<Value> {
        let deadline = Instant::now() + limit;
        let mut reqs = self.shared.requests.lock().expect("requests");
        while reqs.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "timed out after {limit:?} waiting for request {n} (got {})",
                reqs.len()
            );
            reqs = self
                .shared
                .changed
                .wait_timeout(reqs, left)
                .expect("requests")
                .0;
        }
        reqs.clone()
    }

    /// [`ScriptedModel::wait_requests`] for async tests.
    pub async fn requests_reached(&self, n: usize, limit: Duration) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.shared.async_changed.notified();
            let reqs = self.requests();
            if reqs.len() >= n {
                return reqs;
            }
            assert!(
                tokio::time::timeout_at(deadline, notified).await.is_ok(),
                "timed out after {limit:?} waiting for request {n} (got {})",
                reqs.len()
            );
        }
    }

    /// How answer `n` (0-based) ended, once it did.
    pub fn outcome(&self, n: usize) -> Option<Outcome> {
        self.shared
            .outcomes
            .lock()
            .expect("outcomes")
            .get(n)
            .copied()
            .flatten()
    }

    /// Blocks until answer `n` (0-based) ended (at most `limit`, then panics).
    pub fn wait_outcome(&self, n: usize, limit: Duration) -> Outcome {
        let deadline = Instant::now() + limit;
        let mut guard = self.shared.requests.lock().expect("requests");
        loop {
            if let Some(o) = self.outcome(n) {
                return o;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "timed out after {limit:?} waiting for answer {n} to end"
            );
            guard = self
                .shared
                .changed
                .wait_timeout(guard, left)
                .expect("requests")
                .0;
        }
    }
}

impl Drop for ScriptedModel {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        shared.connections.fetch_add(1, Ordering::SeqCst);
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| answer(req, shared.clone()));
            // HTTP/1.1 with keep-alive, as model servers run.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

type Body = UnsyncBoxBody<Bytes, std::io::Error>;

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

fn json_answer(status: StatusCode, body: Value) -> Response<Body> {
    let mut resp = Response::new(full(body.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

async fn answer(req: Request<Incoming>, shared: Arc<Shared>) -> Result<Response<Body>, Infallible> {
    let target = req.uri().path_and_query().map_or_else(
        || req.uri().path().to_string(),
        |pq| pq.as_str().to_string(),
    );
    shared.targets.lock().expect("targets").push(target);
    if req.method() == hyper::Method::GET && req.uri().path() == "/props" {
        let ctx = *shared.context.lock().expect("context");
        let ctx = ctx.filter(|_| shared.context_reported.load(Ordering::SeqCst));
        return Ok(match ctx {
            Some(n) => json_answer(
                StatusCode::OK,
                json!({"default_generation_settings": {"n_ctx": n}, "total_slots": 1}),
            ),
            None => json_answer(
                StatusCode::NOT_FOUND,
                json!({"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}),
            ),
        });
    }
    if req.method() != hyper::Method::POST || req.uri().path() != "/v1/chat/completions" {
        return Ok(json_answer(
            StatusCode::NOT_FOUND,
            json!({"error": {"message": format!("no route {} {}", req.method(), req.uri().path()), "type": "invalid_request_error"}}),
        ));
    }
    // Open from the request's head until its answer ends (written whole, or dropped when
    // the client leaves): a streamed answer's writer holds it to the end.
    let open = InFlight::open(&shared);
    let head_at = Instant::now();
    let auth = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let bytes = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let n = {
        let mut reqs = shared.requests.lock().expect("requests");
        reqs.push(body.clone());
        shared.timings.lock().expect("timings").push(Timing {
            arrived: head_at,
            answered: None,
        });
        shared.auth.lock().expect("auth").push(auth);
        reqs.len() - 1
    };
    shared.notify();
    if body.is_null() {
        shared.set_outcome(n, Outcome::Sent);
        return Ok(json_answer(
            StatusCode::BAD_REQUEST,
            json!({"error": {"message": "the body is not JSON", "type": "invalid_request_error"}}),
        ));
    }
    let ctx = *shared.context.lock().expect("context");
    if let Some(n_ctx) = ctx {
        let n_prompt = bytes.len() as u64 / 4;
        if n_prompt >= n_ctx {
            shared.refused.fetch_add(1, Ordering::SeqCst);
            shared.set_outcome(n, Outcome::Sent);
            return Ok(json_answer(
                StatusCode::BAD_REQUEST,
                json!({"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                    "type": "exceed_context_size_error", "n_prompt_tokens": n_prompt, "n_ctx": n_ctx}}),
            ));
        }
    }
    let mut reply = {
        let next = shared.script.lock().expect("script").pop_front();
        next.unwrap_or_else(|| shared.default.lock().expect("default").clone())
    };
    // A rule may pick another rule; a few levels are plenty.
    for _ in 0..8 {
        let Kind::Rule(f) = &reply.kind else { break };
        reply = f(&body);
    }
    if !reply.head_delay.is_zero() {
        tokio::time::sleep(reply.head_delay).await;
    }
    let mut resp = match &reply.kind {
        Kind::HangBeforeHead => std::future::pending().await,
        Kind::Rule(_) => {
            shared.set_outcome(n, Outcome::Sent);
            return Ok(json_answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": {"message": "the scripted rules chose rules eight levels deep", "type": "server_error"}}),
            ));
        }
        Kind::Status { code, body } => {
            shared.set_outcome(n, Outcome::Sent);
            let mut r = Response::new(full(body.clone()));
            *r.status_mut() =
                StatusCode::from_u16(*code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            r
        }
        Kind::HangAfterHead | Kind::Chunks(_) | Kind::Raw(_) | Kind::Generated(_) => {
            let include_usage = body["stream_options"]["include_usage"] == json!(true);
            let writes = if matches!(reply.kind, Kind::HangAfterHead) {
                Vec::new()
            } else {
                reply.writes(include_usage, bytes.len())
            };
            let stall_after = match reply.kind {
                Kind::HangAfterHead => Some(0),
                _ => reply.stall_after,
            };
            let stream = futures_util::stream::unfold(
                Writer {
                    writes: writes.into(),
                    generate: match &reply.kind {
                        Kind::Generated(f) => Some(f.clone()),
                        _ => None,
                    },
                    sent: 0,
                    delay: reply.chunk_delay,
                    stall_after,
                    cut_after: reply.cut_after,
                    shared: shared.clone(),
                    n,
                    finished: false,
                    _open: open,
                },
                Writer::next,
            );
            let mut r = Response::new(StreamBody::new(stream).boxed_unsync());
            let h = r.headers_mut();
            h.insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/event-stream"),
            );
            h.insert(
                hyper::header::CACHE_CONTROL,
                hyper::header::HeaderValue::from_static("no-cache"),
            );
            r
        }
    };
    for (k, v) in &reply.headers {
        if let (Ok(k), Ok(v)) = (
            hyper::header::HeaderName::from_bytes(k.as_bytes()),
            hyper::header::HeaderValue::from_str(v),
        ) {
            resp.headers_mut().insert(k, v);
        }
    }
    Ok(resp)
}

/// A streamed answer's body: its writes, paced; records how it ended.
struct Writer {
    writes: VecDeque<Vec<u8>>,
    /// Makes the writes after `writes`, one when it is due.
    generate: Option<WriteFn>,
    sent: usize,
    delay: Duration,
    stall_after: Option<usize>,
    cut_after: Option<usize>,
    shared: Arc<Shared>,
    n: usize,
    finished: bool,
    _open: InFlight,
}

/// One chat request counted as open while this lives.
struct InFlight(Arc<Shared>);

impl InFlight {
    fn open(shared: &Arc<Shared>) -> InFlight {
        let now = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        shared.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(shared.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Writer {
    async fn next(mut self) -> Option<(Result<Frame<Bytes>, std::io::Error>, Writer)> {
        if self.stall_after.is_some_and(|s| self.sent >= s) {
            std::future::pending::<()>().await;
        }
        if self.finished {
            return None;
        }
        if self.sent > 0 && !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if self.cut_after.is_some_and(|c| self.sent >= c) {
            // A body error makes hyper drop the connection mid-body. The answer counts
            // as sent: the server, not the client, ended it.
            self.finished = true;
            self.shared.set_outcome(self.n, Outcome::Sent);
            let cut = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "scripted cut");
            return Some((Err(cut), self));
        }
        let next = match self.writes.pop_front() {
            Some(w) => Some(w),
            None => self.generate.as_ref().and_then(|f| f(self.sent)),
        };
        let Some(bytes) = next else {
            self.finished = true;
            self.shared.set_outcome(self.n, Outcome::Sent);
            return None;
        };
        self.sent += 1;
        self.shared
            .bytes_sent
            .fetch_add(bytes.len() as u64, Ordering::SeqCst);
        Some((Ok(Frame::data(Bytes::from(bytes))), self))
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if !self.finished {
            self.shared.set_outcome(self.n, Outcome::ClientGone);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use super::*;

    /// One chat request over a fresh connection (closed after the answer); the answer's text.
    fn post(addr: SocketAddr) -> String {
        let body = json!({"model": "scripted", "messages": [{"role": "user", "content": "hi"}]})
            .to_string();
        let mut s = TcpStream::connect(addr).expect("connect");
        write!(
            s,
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        out
    }

    #[test]
    fn timings_and_the_most_in_flight_are_kept() {
        let model = ScriptedModel::start_with_default(
            Vec::new(),
            Reply::text("slow").head_delay(Duration::from_millis(300)),
        );
        let addr = model.addr;
        let (a, b) = (
            std::thread::spawn(move || post(addr)),
            std::thread::spawn(move || post(addr)),
        );
        for t in [a, b] {
            let answer = t.join().expect("client");
            assert!(answer.contains("data: [DONE]"), "{answer}");
        }
        model.wait_outcome(1, Duration::from_secs(10));
        model.wait_outcome(0, Duration::from_secs(10));
        // Both were held by the delay at the same time.
        assert_eq!(model.max_in_flight(), 2);
        assert_eq!(model.request_count(), 2);
        assert_eq!(
            model.request(1).map(|r| r["model"].clone()),
            Some(json!("scripted"))
        );
        let timings = model.timings();
        assert_eq!(timings.len(), 2);
        for t in &timings {
            let answered = t.answered.expect("answered");
            assert!(answered >= t.arrived, "{t:?}");
        }
        // Every answer ended: nothing open, and a reset starts from none.
        let open = (0..500)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(10));
                model.in_flight()
            })
            .find(|&n| n == 0);
        assert_eq!(open, Some(0));
        model.reset_max_in_flight();
        assert_eq!(model.max_in_flight(), 0);
        post(addr);
        assert_eq!(model.max_in_flight(), 1);
    }
}
