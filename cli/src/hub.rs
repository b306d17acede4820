//! The operator API client: JSON requests to the hub's `/api/...` with the bearer token, over
//! [`crate::http`] (`http://` or `https://`), and the operator token's lookup. It maps answers onto typed errors whose
//! messages say what to do next; it prints nothing.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cortex_protocol::signal::ErrorBody;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::home::{self, HomeError};
use crate::http::{self, HttpError, Method, Request};
use crate::urls::{self, ListError};

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// No hub answered: each URL tried, with why, in the order tried. `unsent`: nothing
    /// reached the last one (see [`HttpError::never_sent`]).
    #[error(
        "{}; start cortex-hub, or point --hub / CORTEX_HUB at it",
        unreachable_text(tried)
    )]
    Unreachable { tried: Vec<Tried>, unsent: bool },
    #[error("{0}")]
    Urls(ListError),
    #[error(
        "the hub at {base} gave an unreadable answer ({reason}); is --hub / CORTEX_HUB really a cortex hub?"
    )]
    Protocol { base: String, reason: String },
    /// The hub answered with an error status; `message` is its own words.
    #[error("{message} (HTTP {status}{})", hint_for(*status))]
    Api {
        status: u16,
        error: Option<String>,
        message: String,
    },
    #[error(
        "TLS with the hub at {base} failed ({reason}); check that --hub / CORTEX_HUB names the hub's https address, and that this machine trusts its certificate"
    )]
    Tls { base: String, reason: String },
    #[error(
        "unexpected answer from the hub to {what}: {reason}; are the hub and this cortex the same version?"
    )]
    Decode { what: String, reason: String },
    #[error("{0}")]
    Request(HttpError),
}

/// One hub that did not answer, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tried {
    pub base: String,
    pub reason: String,
}

fn unreachable_text(tried: &[Tried]) -> String {
    match tried {
        [one] => format!("cannot reach the hub at {} ({})", one.base, one.reason),
        _ => {
            let each: Vec<String> = tried
                .iter()
                .map(|t| format!("{} ({})", t.base, t.reason))
                .collect();
            format!("cannot reach any hub: {}", each.join(", "))
        }
    }
}

fn hint_for(status: u16) -> &'static str {
    match status {
        401 => {
            "; check CORTEX_WEBHOOK_TOKEN, or the token file $CORTEX_HOME/hub/token on the hub's machine"
        }
        _ => "",
    }
}

impl HubError {
    /// The hub could not be asked, or failed on its side: worth asking again later.
    pub fn is_transient(&self) -> bool {
        match self {
            HubError::Unreachable { .. } => true,
            HubError::Api { status, .. } => *status >= 500,
            _ => false,
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            HubError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The hub's error code (`store_unavailable`, `not_found`…), when it gave one.
    pub fn code(&self) -> Option<&str> {
        match self {
            HubError::Api { error, .. } => error.as_deref(),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(
        "no operator token: set CORTEX_WEBHOOK_TOKEN or run on the hub's machine where $CORTEX_HOME/hub/token exists ({0})"
    )]
    Missing(String),
}

/// The operator token: `CORTEX_WEBHOOK_TOKEN`, else the file `$CORTEX_HOME/hub/token`
/// (whitespace trimmed either way).
pub fn load_token(
    from_env: Option<&str>,
    cortex_home: &Result<PathBuf, HomeError>,
) -> Result<String, TokenError> {
    if let Some(t) = from_env.map(str::trim).filter(|t| !t.is_empty()) {
        return Ok(t.to_string());
    }
    let home = cortex_home
        .as_ref()
        .map_err(|e| TokenError::Missing(e.to_string()))?;
    let path = home::token_file(home);
    match std::fs::read_to_string(&path) {
        Ok(t) if !t.trim().is_empty() => Ok(t.trim().to_string()),
        Ok(_) => Err(TokenError::Missing(format!("{} is empty", path.display()))),
        Err(e) => Err(TokenError::Missing(format!(
            "cannot read {}: {e}",
            path.display()
        ))),
    }
}

/// A body from the hub, kept as bytes so `--json` can print it exactly as it came.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json<T: DeserializeOwned>(&self, what: &str) -> Result<T, HubError> {
        serde_json::from_slice(&self.body).map_err(|e| HubError::Decode {
            what: what.to_string(),
            reason: e.to_string(),
        })
    }

    /// The body as text, without a trailing newline.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).trim_end().to_string()
    }
}

/// The hub's API at one base URL or several (tried in order), with the operator token.
#[derive(Debug, Clone)]
pub struct Hub {
    bases: Arc<[String]>,
    /// Where in `bases` the next request starts: the hub that answered last. Clones share it,
    /// so the whole process keeps to the hub that answered.
    current: Arc<AtomicUsize>,
    auth: String,
}

impl Hub {
    /// `list`: one base URL, or several separated by commas ([`urls::parse`]).
    pub fn new(list: &str, token: &str) -> Result<Hub, HubError> {
        let bases: Vec<String> = urls::parse(list)
            .map_err(|e| match e {
                ListError::Url(e) => HubError::Request(e),
                e => HubError::Urls(e),
            })?
            .into_iter()
            .map(|b| b.trim_end_matches('/').to_string())
            .collect();
        Ok(Hub {
            bases: bases.into(),
            current: Arc::new(AtomicUsize::new(0)),
            auth: format!("Bearer {token}"),
        })
    }

    /// The base URL requests go to first: the hub that answered last.
    pub fn base(&self) -> &str {
        &self.bases[self.start()]
    }

    /// Every base URL, in the order the next request tries them.
    pub fn bases(&self) -> Vec<String> {
        let n = self.bases.len();
        (0..n)
            .map(|k| self.bases[(self.start() + k) % n].clone())
            .collect()
    }

    fn start(&self) -> usize {
        self.current.load(Ordering::Relaxed) % self.bases.len()
    }

    /// Asks each hub in turn with `ask`, from the one that answered last, until one answers.
    /// It moves on only when nothing reached a hub (its name did not resolve, the
    /// connection was refused or timed out), or when the hub answered 503
    /// `store_unavailable`, which says nothing was recorded: a request is never seen twice.
    /// Any other answer or failure is the result. When none answers, the error names each
    /// URL tried and why.
    fn each<T>(&self, mut ask: impl FnMut(&str) -> Result<T, HubError>) -> Result<T, HubError> {
        let (n, start) = (self.bases.len(), self.start());
        let mut tried = Vec::new();
        for k in 0..n {
            let i = (start + k) % n;
            let base = &self.bases[i];
            match ask(base) {
                Err(HubError::Unreachable {
                    tried: mut this,
                    unsent,
                }) => {
                    tried.append(&mut this);
                    if !unsent || k + 1 == n {
                        return Err(HubError::Unreachable { tried, unsent });
                    }
                }
                Err(e @ HubError::Api { status: 503, .. })
                    if k + 1 < n && e.code() == Some("store_unavailable") =>
                {
                    tried.push(Tried {
                        base: base.clone(),
                        reason: "HTTP 503 store_unavailable".to_string(),
                    });
                }
                answered => {
                    if matches!(answered, Ok(_) | Err(HubError::Api { .. })) {
                        self.current.store(i, Ordering::Relaxed);
                    }
                    return answered;
                }
            }
        }
        // `bases` is never empty, so the loop always returns; this keeps it free of panics.
        Err(HubError::Unreachable {
            tried,
            unsent: true,
        })
    }

    pub fn get(&self, path: &str) -> Result<Reply, HubError> {
        self.call(Method::Get, path, None, http::DEFAULT_TIMEOUT)
    }

    /// A GET that may take `timeout` (a long poll).
    pub fn get_slow(&self, path: &str, timeout: Duration) -> Result<Reply, HubError> {
        self.call(Method::Get, path, None, timeout)
    }

    pub fn post(&self, path: &str, body: &impl Serialize) -> Result<Reply, HubError> {
        let body = serde_json::to_vec(body).map_err(|e| HubError::Decode {
            what: path.to_string(),
            reason: e.to_string(),
        })?;
        self.call(Method::Post, path, Some(&body), http::DEFAULT_TIMEOUT)
    }

    pub fn put(&self, path: &str, body: &impl Serialize) -> Result<Reply, HubError> {
        let body = serde_json::to_vec(body).map_err(|e| HubError::Decode {
            what: path.to_string(),
            reason: e.to_string(),
        })?;
        self.call(Method::Put, path, Some(&body), http::DEFAULT_TIMEOUT)
    }

    pub fn delete(&self, path: &str) -> Result<Reply, HubError> {
        self.call(Method::Delete, path, None, http::DEFAULT_TIMEOUT)
    }

    fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Reply, HubError> {
        self.each(|base| {
            let url = format!("{base}{path}");
            let mut req = Request::new(method, &url)
                .header("Authorization", &self.auth)
                .timeout(timeout);
            if let Some(body) = body {
                req = req.json(body);
            }
            let resp = req.send().map_err(|e| request_error(base, e))?;
            if resp.is_success() {
                return Ok(Reply {
                    status: resp.status,
                    body: resp.body,
                });
            }
            Err(api_error(resp.status, &resp.body, method, path))
        })
    }

    /// `GET path` as a server-sent event stream (`Accept: text/event-stream`): returns
    /// once the hub answered 2xx, with the body still arriving. An error status is read
    /// (its small body) and returned as [`HubError::Api`]. Opening it moves from hub to hub
    /// as every request does; a stream that ends is not moved, the caller opens it again.
    pub fn stream(&self, path: &str) -> Result<Box<dyn Read + Send>, HubError> {
        self.each(|base| {
            let url = format!("{base}{path}");
            let open = Request::new(Method::Get, &url)
                .header("Authorization", &self.auth)
                .timeout(http::DEFAULT_TIMEOUT)
                .open("text/event-stream")
                .map_err(|e| request_error(base, e))?;
            if (200..300).contains(&open.status) {
                return Ok(open.body);
            }
            let mut body = Vec::new();
            // An error's body is one small JSON object; a broken one is still an error.
            let _ = open.body.take(64 * 1024).read_to_end(&mut body);
            Err(api_error(open.status, &body, Method::Get, path))
        })
    }
}

impl Hub {
    /// `POST path` with `body` and `headers`, answered as it arrives (`accept` names what
    /// may come back): for a bridge that passes on whatever the hub answers, error
    /// statuses included. Moves from hub to hub only as [`Hub::each`] does.
    pub fn open_post(
        &self,
        path: &str,
        body: &[u8],
        headers: &[(&str, &str)],
        accept: &str,
    ) -> Result<http::Streaming, HubError> {
        self.each(|base| {
            let url = format!("{base}{path}");
            let mut req = Request::new(Method::Post, &url)
                .header("Authorization", &self.auth)
                .timeout(http::DEFAULT_TIMEOUT)
                .json(body);
            for (k, v) in headers {
                req = req.header(k, v);
            }
            req.open(accept).map_err(|e| request_error(base, e))
        })
    }

    /// `GET path` with `headers`, answered as it arrives, error statuses included.
    pub fn open_get(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        accept: &str,
    ) -> Result<http::Streaming, HubError> {
        self.each(|base| {
            let url = format!("{base}{path}");
            let mut req = Request::new(Method::Get, &url)
                .header("Authorization", &self.auth)
                .timeout(http::DEFAULT_TIMEOUT);
            for (k, v) in headers {
                req = req.header(k, v);
            }
            req.open(accept).map_err(|e| request_error(base, e))
        })
    }
}

fn request_error(base: &str, e: HttpError) -> HubError {
    match e {
        HttpError::Unreachable { reason, unsent, .. } => HubError::Unreachable {
            tried: vec![Tried {
                base: base.to_string(),
                reason,
            }],
            unsent,
        },
        HttpError::Protocol { reason, .. } => HubError::Protocol {
            base: base.to_string(),
            reason,
        },
        HttpError::Tls { reason, .. } => HubError::Tls {
            base: base.to_string(),
            reason,
        },
        e => HubError::Request(e),
    }
}

/// The hub's error answer as a [`HubError::Api`], in its own words when it gave them. A
/// 401 is said in ours: the hub's words tell an API user how to send a token, and the
/// hint (`hint_for`) tells this CLI's user where its token comes from, once.
fn api_error(status: u16, body: &[u8], method: Method, path: &str) -> HubError {
    let parsed = serde_json::from_slice::<ErrorBody>(body);
    if status == 401 {
        return HubError::Api {
            status,
            error: parsed.ok().map(|b| b.error),
            message: "the hub refused the operator token".to_string(),
        };
    }
    let (error, message) = match parsed {
        Ok(b) => (Some(b.error), b.message),
        Err(_) => {
            let text: String = String::from_utf8_lossy(body)
                .trim()
                .chars()
                .take(300)
                .collect();
            let message = if text.is_empty() {
                format!(
                    "the hub answered {} {} to {}",
                    method.as_str(),
                    path_only(path),
                    status
                )
            } else {
                format!(
                    "the hub answered {} to {} {}: {text}",
                    status,
                    method.as_str(),
                    path_only(path)
                )
            };
            (None, message)
        }
    };
    HubError::Api {
        status,
        error,
        message,
    }
}

fn path_only(path: &str) -> &str {
    path.split('?').next().unwrap_or(path)
}

/// Percent-encodes one path segment (an id typed by a person), so it cannot change the path.
pub fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testserver::{TestServer, json, refused_addr, tls_server};

    #[test]
    fn sends_the_token_and_maps_errors() {
        let server = TestServer::canned(vec![
            json(200, r#"[]"#),
            json(
                401,
                r#"{"error":"unauthorized","message":"this route needs the operator token (CORTEX_WEBHOOK_TOKEN, or the file $CORTEX_HOME/hub/token on the hub's machine)"}"#,
            ),
            b"HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\nboom".to_vec(),
        ]);
        let hub = Hub::new(&format!("http://{}/", server.addr), "tok").expect("hub");
        let r = hub.get("/api/sessions").expect("ok");
        assert_eq!(r.text(), "[]");
        let req = server.next_request();
        assert_eq!(req.path, "/api/sessions");
        assert_eq!(req.header("authorization"), Some("Bearer tok"));

        let e = hub.get("/api/sessions").expect_err("401");
        assert_eq!(e.status(), Some(401));
        let msg = e.to_string();
        assert!(msg.contains("refused the operator token"), "{msg}");
        assert_eq!(
            msg.matches("CORTEX_WEBHOOK_TOKEN").count(),
            1,
            "the hint once: {msg}"
        );
        assert!(!e.is_transient());

        let e = hub.delete("/api/waitpoints/wp_1").expect_err("500");
        assert!(e.is_transient());
        assert!(e.to_string().contains("boom"), "{e}");
    }

    #[test]
    fn unreachable_says_what_to_do() {
        let hub = Hub::new(&format!("http://{}", refused_addr()), "tok").expect("hub");
        let e = hub.get("/api/sessions").expect_err("refused");
        assert!(e.is_transient());
        assert!(e.to_string().contains("start cortex-hub"), "{e}");
        assert!(Hub::new("https://hub.example:3001", "t").is_ok());
        assert!(Hub::new("ftp://x", "t").is_err());
    }

    #[test]
    fn a_refused_hub_is_passed_over_and_the_one_that_answered_kept() {
        let live = TestServer::canned(vec![json(200, "[]"), json(200, "[1]")]);
        let dead = format!("http://{}", refused_addr());
        let hub = Hub::new(&format!("{dead}, {}/", live.url("")), "tok").expect("hub");
        assert_eq!(hub.get("/api/sessions").expect("second").text(), "[]");
        assert_eq!(hub.base(), live.url(""), "the one that answered is kept");
        assert_eq!(hub.bases(), [live.url(""), dead.clone()]);
        assert_eq!(
            hub.clone().get("/api/sessions").expect("again").text(),
            "[1]"
        );
        assert_eq!(live.requests().len(), 2);
    }

    #[test]
    fn a_hub_that_dies_is_passed_over_by_the_next_request() {
        use std::io::Write;
        // The first hub answers once and is gone: what a follow or `wait for` asks next
        // (their reconnect) goes to the second.
        let first = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let first_url = format!("http://{}", first.local_addr().expect("addr"));
        let serve_once = std::thread::spawn(move || {
            let (mut conn, _) = first.accept().expect("accept");
            crate::testserver::read_request(&mut conn).expect("request");
            conn.write_all(&json(200, r#"["first"]"#)).expect("answer");
        });
        let second = TestServer::canned(vec![json(200, r#"["second"]"#)]);
        let hub = Hub::new(&format!("{first_url},{}", second.url("")), "t").expect("hub");
        assert_eq!(
            hub.get("/api/sessions").expect("first").text(),
            r#"["first"]"#
        );
        serve_once.join().expect("served");
        assert_eq!(
            hub.get("/api/sessions").expect("second").text(),
            r#"["second"]"#
        );
        assert_eq!(hub.base(), second.url(""));
    }

    #[test]
    fn an_answer_is_the_result_even_an_error() {
        let first = TestServer::canned(vec![json(500, r#"{"error":"internal","message":"boom"}"#)]);
        let second = TestServer::canned(vec![json(200, "[]")]);
        let hub = Hub::new(&format!("{},{}", first.url(""), second.url("")), "t").expect("hub");
        let e = hub.post("/api/sessions", &"x").expect_err("500");
        assert_eq!(e.status(), Some(500));
        assert!(
            second.requests().is_empty(),
            "a hub that answered is not passed over"
        );
    }

    #[test]
    fn a_store_unavailable_503_moves_on_and_nothing_else_does() {
        let down = TestServer::canned(vec![json(
            503,
            r#"{"error":"store_unavailable","message":"nothing was recorded"}"#,
        )]);
        let up = TestServer::canned(vec![json(200, "[]")]);
        let hub = Hub::new(&format!("{},{}", down.url(""), up.url("")), "t").expect("hub");
        assert_eq!(hub.get("/api/sessions").expect("second").text(), "[]");
        assert_eq!(hub.base(), up.url(""));
    }

    #[test]
    fn none_answering_names_each_url_and_why() {
        let (a, b) = (
            format!("http://{}", refused_addr()),
            format!("http://{}", refused_addr()),
        );
        let hub = Hub::new(&format!("{a},{b}"), "t").expect("hub");
        let e = hub.get("/api/sessions").expect_err("none");
        assert!(
            matches!(&e, HubError::Unreachable { tried, .. } if tried.len() == 2),
            "{e}"
        );
        let msg = e.to_string();
        assert!(msg.starts_with("cannot reach any hub: "), "{msg}");
        assert!(
            msg.contains(&format!(
                "{a} (connection refused), {b} (connection refused)"
            )),
            "{msg}"
        );
        assert!(e.is_transient());
        let e = hub.stream("/api/sessions/s/events").err().expect("none");
        assert!(
            matches!(&e, HubError::Unreachable { tried, .. } if tried.len() == 2),
            "{e}"
        );
    }

    #[test]
    fn a_bad_list_is_refused_naming_the_element() {
        let e = Hub::new("http://a:1,,http://b:2", "t").expect_err("empty");
        assert!(e.to_string().contains("URL number 2 is empty"), "{e}");
        let e = Hub::new("http://a:1,b:2", "t").expect_err("no scheme");
        assert!(e.to_string().contains("\"b:2\""), "{e}");
    }

    #[test]
    fn an_https_hub_is_asked_and_a_tls_failure_says_what_to_check() {
        let (port, _) = tls_server();
        let hub = Hub::new(&format!("https://localhost:{port}"), "tok").expect("hub");
        let e = hub.get("/api/sessions").expect_err("untrusted");
        assert!(matches!(e, HubError::Tls { .. }), "{e}");
        assert!(
            !e.is_transient(),
            "a certificate problem does not pass by itself"
        );
        assert!(e.to_string().contains("trusts its certificate"), "{e}");
    }

    #[test]
    fn token_from_env_or_file() {
        let home = tempfile::tempdir().expect("tempdir");
        let h = Ok(home.path().to_path_buf());
        assert_eq!(load_token(Some(" t1\n"), &h).expect("env"), "t1");
        let e = load_token(None, &h).expect_err("no file");
        assert!(e.to_string().contains("set CORTEX_WEBHOOK_TOKEN"), "{e}");
        std::fs::create_dir_all(home.path().join("hub")).expect("mkdir");
        std::fs::write(home.path().join("hub/token"), "t2\n").expect("write");
        assert_eq!(load_token(Some(""), &h).expect("file"), "t2");
        assert!(load_token(None, &Err(HomeError::NoHome)).is_err());
    }

    #[test]
    fn segments_are_encoded() {
        assert_eq!(segment("wp_1a2B-3x~"), "wp_1a2B-3x~");
        assert_eq!(segment("../a b?c"), "%2E%2E%2Fa%20b%3Fc");
    }
}
