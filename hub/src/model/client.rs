//! [`ModelClient`]: the [`Model`] over HTTP, an OpenAI-compatible Chat Completions
//! endpoint (`POST {base_url}/chat/completions`), always streamed, with tools; on
//! reqwest over rustls (the ring provider the hub installs). One step is a loop of
//! attempts: an attempt that fails with a passing trouble (no connection, 408, 429,
//! 5xx, a timeout, a stream cut short) is reported as [`Delta::Retry`] and made again
//! after a backoff or the server's `Retry-After`, at most `max_retries` times.
//! Everything runs inside the step's future: dropping it drops the connection.

use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use reqwest::header::{
    ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue, LOCATION, RETRY_AFTER,
};
use serde::Serialize;

use super::assemble::{Assembler, Progress, excerpt, server_error};
use super::caps::{Caps, Endpoint};
use super::config::{ModelConfig, RAW_BYTES_PER_REPLY_BYTE, base_url_of};
use super::error::ModelError;
use super::retry;
use super::step::{
    ContextFuture, ContextWindow, Delta, Model, StepFuture, StepOutput, StepRequest,
};
use super::wire::{ChatMessage, ToolSpec};
use cortex_host::sse::Parser;

/// The most of an error body read for its excerpt.
const ERROR_BODY_BYTES: usize = 4096;
/// How much of an answer without events an error shows.
const NO_EVENT_EXCERPT_BYTES: usize = 512;
/// How long the end of a body is waited for after `[DONE]`.
const DRAIN_AFTER_DONE: Duration = Duration::from_millis(50);
/// The most of a non-streamed JSON answer read.
const JSON_BODY_BYTES: usize = 16 * 1024 * 1024;

/// A client for one endpoint and model. Cheap to share: calls run concurrently on one
/// connection pool.
pub struct ModelClient {
    http: reqwest::Client,
    endpoint: reqwest::Url,
    /// The endpoint as errors show it: no user info, no query.
    shown: String,
    model: String,
    /// Which server it is, for what it enforces.
    server: Endpoint,
    /// `Bearer …`, marked sensitive; the one place the key lives.
    auth: Option<HeaderValue>,
    first_byte_timeout: Duration,
    idle_timeout: Duration,
    max_retries: u32,
    backoff: Duration,
    /// The key itself, only to blank it out of error excerpts a server might echo it in.
    key: Option<String>,
    /// The API's base (`…/v1`), for what the server says of itself.
    base: reqwest::Url,
    /// The context as set, if it was.
    context_tokens: Option<u64>,
    /// `limits.replyBytes`: the most a reply may hold.
    reply_bytes: u64,
    /// `limits.callDeadlineMs`: the longest a call may take, retries and all.
    call_deadline: Duration,
}

impl std::fmt::Debug for ModelClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelClient")
            .field("endpoint", &self.shown)
            .field("model", &self.model)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: &'a [ChatMessage],
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "no_tools")]
    tools: &'a [ToolSpec],
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<&'a serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'static str>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

fn no_tools(t: &&[ToolSpec]) -> bool {
    t.is_empty()
}

/// The request body of a step (what every attempt sends).
pub fn request_body(model: &str, req: &StepRequest<'_>) -> Result<Vec<u8>, ModelError> {
    serde_json::to_vec(&ChatRequest {
        model,
        messages: req.messages,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        tools: req.tools,
        max_tokens: req.max_tokens,
        response_format: req.response_format,
        tool_choice: req.tool_choice_required.then_some("required"),
    })
    .map_err(|e| ModelError::Config(format!("the request could not be encoded: {e}")))
}

impl ModelClient {
    pub fn new(cfg: ModelConfig) -> Result<ModelClient, ModelError> {
        let base = base_url_of(&cfg.base_url)?;
        let mut endpoint = reqwest::Url::parse(&base).map_err(|e| {
            ModelError::Config(format!("the model server's base URL {base:?}: {e}"))
        })?;
        let base = endpoint.clone();
        // The path grows; a query the base carries (`?api-version=…`) stays a query.
        let path = format!("{}/chat/completions", endpoint.path().trim_end_matches('/'));
        endpoint.set_path(&path);
        let mut shown_url = endpoint.clone();
        // Infallible for http(s) URLs, which `base_url_of` ensured.
        let _ = shown_url.set_username("");
        let _ = shown_url.set_password(None);
        shown_url.set_query(None);
        if cfg.model.trim().is_empty() {
            return Err(ModelError::Config("no model name given".into()));
        }
        let key = cfg
            .api_key
            .as_deref()
            .map(str::trim)
            .filter(|k| !k.is_empty());
        let auth = match key {
            Some(k) => {
                let mut v = HeaderValue::from_str(&format!("Bearer {k}")).map_err(|_| {
                    ModelError::Config(
                        "the API key holds characters an HTTP header cannot carry".into(),
                    )
                })?;
                v.set_sensitive(true);
                Some(v)
            }
            None => None,
        };
        let http = reqwest::Client::builder()
            .connect_timeout(cfg.connect_timeout)
            .user_agent(concat!("cortex-hub/", env!("CARGO_PKG_VERSION")))
            // A redirect is answered as what it is (a wrong base URL, named with its
            // target), not followed: a POST followed as a GET would fail obscurely,
            // and the key stays with the host it was set for.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| {
                ModelError::Config(format!("the HTTP client could not start: {}", causes(&e)))
            })?;
        Ok(ModelClient {
            http,
            endpoint,
            shown: shown_url.to_string(),
            model: cfg.model.trim().to_string(),
            server: cfg.endpoint,
            auth,
            first_byte_timeout: cfg.first_byte_timeout,
            idle_timeout: cfg.idle_timeout,
            max_retries: cfg.max_retries,
            backoff: cfg.backoff,
            key: key.map(str::to_string),
            base,
            context_tokens: cfg.context_tokens,
            reply_bytes: cfg.reply_bytes.max(1),
            call_deadline: cfg.call_deadline,
        })
    }

    /// The model's context: what the server reports (llama.cpp's `GET /props`
    /// `default_generation_settings.n_ctx`, else `GET {base}/models`' `max_model_len`,
    /// `context_length` or `meta.n_ctx_train`) and the setting; the smaller when both
    /// are known.
    pub async fn context_window(&self) -> Option<ContextWindow> {
        let reported = self.reported_context().await;
        let set = self.context_tokens.map(|n| ContextWindow {
            tokens: n,
            source: "the setting (llm.contextTokens or CORTEX_LLM_CONTEXT_TOKENS)".into(),
        });
        match (reported, set) {
            (Some(r), Some(s)) if s.tokens < r.tokens => Some(s),
            (Some(r), _) => Some(r),
            (None, s) => s,
        }
    }

    async fn reported_context(&self) -> Option<ContextWindow> {
        let mut root = self.base.clone();
        let path = root.path().trim_end_matches('/').to_string();
        root.set_path(&format!(
            "{}/props",
            path.strip_suffix("/v1").unwrap_or(&path)
        ));
        root.set_query(None);
        if let Some(v) = self.get_json(root).await {
            let n = v["default_generation_settings"]["n_ctx"]
                .as_u64()
                .or_else(|| v["n_ctx"].as_u64());
            if let Some(n) = n.filter(|&n| n > 0) {
                return Some(ContextWindow {
                    tokens: n,
                    source: "the server's /props (n_ctx)".into(),
                });
            }
        }
        let mut models = self.base.clone();
        models.set_path(&format!("{path}/models"));
        let v = self.get_json(models).await?;
        let list = v["data"].as_array()?;
        let entry = list
            .iter()
            .find(|m| m["id"].as_str() == Some(self.model.as_str()))
            .or_else(|| list.first())?;
        [
            ("max_model_len", &entry["max_model_len"]),
            ("context_length", &entry["context_length"]),
            ("meta.n_ctx_train", &entry["meta"]["n_ctx_train"]),
        ]
        .into_iter()
        .find_map(|(name, n)| {
            n.as_u64().filter(|&n| n > 0).map(|n| ContextWindow {
                tokens: n,
                source: format!("the server's /models ({name})"),
            })
        })
    }

    /// A small JSON answer to `GET url`, or `None` for anything else.
    async fn get_json(&self, url: reqwest::Url) -> Option<serde_json::Value> {
        let mut req = self.http.get(url).timeout(Duration::from_secs(5));
        if let Some(auth) = &self.auth {
            req = req.header(AUTHORIZATION, auth.clone());
        }
        let resp = req.send().await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let bytes = resp.bytes().await.ok()?;
        serde_json::from_slice(&bytes[..bytes.len().min(JSON_BODY_BYTES)]).ok()
    }

    /// One step: the request sent, the answer streamed (text and reasoning to
    /// `on_delta` as they come), retried as configured; all of it within the call's
    /// deadline (`limits.callDeadlineMs`), past which it is stopped (dropped) and fails.
    pub async fn step(
        &self,
        req: StepRequest<'_>,
        on_delta: &mut (dyn FnMut(Delta) + Send),
    ) -> Result<StepOutput, ModelError> {
        let body = request_body(&self.model, &req)?;
        match tokio::time::timeout(self.call_deadline, self.attempts(&body, on_delta)).await {
            Ok(r) => r,
            Err(_) => Err(ModelError::Deadline {
                after: self.call_deadline,
            }),
        }
    }

    /// The attempts of one step, made again as configured.
    async fn attempts(
        &self,
        body: &[u8],
        on_delta: &mut (dyn FnMut(Delta) + Send),
    ) -> Result<StepOutput, ModelError> {
        let mut retries = 0;
        loop {
            let err = match self.attempt(body, on_delta).await {
                Ok(out) => return Ok(out),
                Err(e) => self.redacted(e),
            };
            if !err.is_retryable() {
                return Err(err);
            }
            if retries >= self.max_retries {
                return Err(if retries == 0 {
                    err
                } else {
                    ModelError::RetriesExhausted {
                        attempts: retries + 1,
                        last: Box::new(err),
                    }
                });
            }
            retries += 1;
            let delay = retry::delay(self.backoff, retries, err.retry_after(), retry::unit_draw());
            tracing::debug!(attempt = retries, delay_ms = delay.as_millis() as u64, error = %err, "model call retried");
            on_delta(Delta::Retry {
                attempt: retries,
                issues: err.to_string(),
                delay,
            });
            tokio::time::sleep(delay).await;
        }
    }

    /// `text` with the API key blanked out, should a server have echoed it.
    fn redact(&self, text: String) -> String {
        match self.key.as_deref() {
            Some(key) if text.contains(key) => text.replace(key, "[api key]"),
            _ => text,
        }
    }

    /// The error with the key blanked out of whatever a server or a library wrote in it.
    fn redacted(&self, e: ModelError) -> ModelError {
        match e {
            ModelError::Connect { url, reason } => ModelError::Connect {
                url,
                reason: self.redact(reason),
            },
            ModelError::Request { url, reason } => ModelError::Request {
                url,
                reason: self.redact(reason),
            },
            ModelError::Stream { url, reason } => ModelError::Stream {
                url,
                reason: self.redact(reason),
            },
            ModelError::Status {
                url,
                status,
                excerpt,
                retry_after,
            } => ModelError::Status {
                url,
                status,
                excerpt: self.redact(excerpt),
                retry_after,
            },
            ModelError::Server { message, retryable } => ModelError::Server {
                message: self.redact(message),
                retryable,
            },
            ModelError::Malformed(m) => ModelError::Malformed(self.redact(m)),
            other => other,
        }
    }

    async fn attempt(
        &self,
        body: &[u8],
        on_delta: &mut (dyn FnMut(Delta) + Send),
    ) -> Result<StepOutput, ModelError> {
        let sent = Instant::now();
        let first_byte = |_| ModelError::FirstByteTimeout {
            url: self.shown.clone(),
            after: self.first_byte_timeout,
        };
        let mut resp = tokio::time::timeout(self.first_byte_timeout, self.send(body))
            .await
            .map_err(first_byte)??;
        if !resp.status().is_success() {
            return Err(self.status_error(resp).await);
        }
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .trim()
            .to_string();
        let json = content_type.starts_with("application/json");
        let left = self.first_byte_timeout.saturating_sub(sent.elapsed());
        let mut chunk = tokio::time::timeout(left, resp.chunk())
            .await
            .map_err(first_byte)?
            .map_err(|e| self.stream_error(&e))?;
        if json {
            return self.json_answer(resp, chunk, on_delta).await;
        }
        let raw_cap = self.raw_cap();
        let mut decoder =
            Parser::new(MAX_EVENT_BYTES.min(usize::try_from(raw_cap).unwrap_or(usize::MAX)));
        let mut asm = Assembler::new();
        // Every byte of the stream, envelopes and comments included.
        let mut raw = 0u64;
        let mut events = Vec::new();
        // The answer's first bytes, to show if it holds no event at all (a web page or
        // a proxy's answer at the wrong URL).
        let mut head = Vec::new();
        let mut any_event = false;
        while let Some(bytes) = chunk {
            raw += bytes.len() as u64;
            if raw > raw_cap {
                return Err(self.too_large(true));
            }
            if !any_event && head.len() < NO_EVENT_EXCERPT_BYTES {
                head.extend_from_slice(&bytes[..bytes.len().min(NO_EVENT_EXCERPT_BYTES)]);
            }
            events.extend(
                decoder
                    .feed(&bytes)
                    .map_err(malformed)?
                    .into_iter()
                    .map(|m| m.data),
            );
            any_event |= !events.is_empty();
            for data in events.drain(..) {
                let progress = asm.payload(&data, on_delta)?;
                if asm.bytes() > self.reply_bytes {
                    return Err(self.too_large(false));
                }
                if progress == Progress::Done {
                    drain(&mut resp).await;
                    return asm.finish();
                }
            }
            chunk = self.next_chunk(&mut resp).await?;
        }
        events.extend(
            decoder
                .finish()
                .map_err(malformed)?
                .into_iter()
                .map(|m| m.data),
        );
        any_event |= !events.is_empty();
        for data in events.drain(..) {
            let progress = asm.payload(&data, on_delta)?;
            if asm.bytes() > self.reply_bytes {
                return Err(self.too_large(false));
            }
            if progress == Progress::Done {
                break;
            }
        }
        if !any_event {
            let shown = if content_type.is_empty() {
                "no content type"
            } else {
                content_type.as_str()
            };
            let body = String::from_utf8_lossy(&head);
            return Err(ModelError::Malformed(format!(
                "HTTP 200 ({shown}) without a single server-sent event; is {} a chat completions endpoint? It began: {}",
                self.shown,
                match excerpt(&body, 200) {
                    b if b.is_empty() => "(nothing)".to_string(),
                    b => b,
                }
            )));
        }
        asm.finish()
    }

    async fn send(&self, body: &[u8]) -> Result<reqwest::Response, ModelError> {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        if let Some(auth) = &self.auth {
            headers.insert(AUTHORIZATION, auth.clone());
        }
        self.http
            .post(self.endpoint.clone())
            .headers(headers)
            .body(body.to_vec())
            .send()
            .await
            .map_err(|e| {
                if e.is_connect() {
                    ModelError::Connect {
                        url: self.shown.clone(),
                        reason: causes(&e),
                    }
                } else if e.is_builder() {
                    ModelError::Config(format!("the request could not be built: {}", causes(&e)))
                } else {
                    ModelError::Request {
                        url: self.shown.clone(),
                        reason: causes(&e),
                    }
                }
            })
    }

    async fn next_chunk(&self, resp: &mut reqwest::Response) -> Result<Option<Bytes>, ModelError> {
        tokio::time::timeout(self.idle_timeout, resp.chunk())
            .await
            .map_err(|_| ModelError::IdleTimeout {
                url: self.shown.clone(),
                after: self.idle_timeout,
            })?
            .map_err(|e| self.stream_error(&e))
    }

    fn stream_error(&self, e: &reqwest::Error) -> ModelError {
        ModelError::Stream {
            url: self.shown.clone(),
            reason: causes(e),
        }
    }

    /// A 200 with a JSON body: a server that did not stream (one whole completion) or
    /// that put an error there.
    async fn json_answer(
        &self,
        mut resp: reqwest::Response,
        mut chunk: Option<Bytes>,
        on_delta: &mut (dyn FnMut(Delta) + Send),
    ) -> Result<StepOutput, ModelError> {
        let mut body = Vec::new();
        while let Some(bytes) = chunk {
            if (body.len() + bytes.len()) as u64 > self.raw_cap() {
                return Err(self.too_large(true));
            }
            if body.len() + bytes.len() > JSON_BODY_BYTES {
                return Err(ModelError::Malformed(format!(
                    "a JSON answer longer than {JSON_BODY_BYTES} bytes"
                )));
            }
            body.extend_from_slice(&bytes);
            chunk = self.next_chunk(&mut resp).await?;
        }
        let text = String::from_utf8_lossy(&body);
        let mut asm = Assembler::new();
        asm.payload(&text, on_delta)?;
        if asm.bytes() > self.reply_bytes {
            return Err(self.too_large(false));
        }
        asm.finish()
    }

    /// The most bytes of stream one reply may take.
    fn raw_cap(&self) -> u64 {
        self.reply_bytes.saturating_mul(RAW_BYTES_PER_REPLY_BYTE)
    }

    /// The reply passed its cap: of its content, or (`raw`) of the stream's own bytes.
    fn too_large(&self, raw: bool) -> ModelError {
        if raw {
            ModelError::ReplyTooLarge {
                limit: self.raw_cap(),
                what: "of stream (envelopes and comments included: 16 times limits.replyBytes)",
            }
        } else {
            ModelError::ReplyTooLarge {
                limit: self.reply_bytes,
                what: "of text, reasoning and tool calls",
            }
        }
    }

    /// A non-2xx answer as an error: its status, a short excerpt of its body (the
    /// server's own message when it is JSON) and its `Retry-After`.
    async fn status_error(&self, mut resp: reqwest::Response) -> ModelError {
        let status = resp.status().as_u16();
        let location = resp
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .filter(|_| resp.status().is_redirection())
            .map(|l| {
                // The target as errors show URLs: no query, no user info.
                let l = l.split(['?', '#']).next().unwrap_or_default();
                match l
                    .split_once("://")
                    .map(|(s, rest)| (s, rest.rsplit_once('@')))
                {
                    Some((scheme, Some((_, host)))) => format!("{scheme}://{host}"),
                    _ => l.to_string(),
                }
            });
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry::parse_retry_after(v, SystemTime::now()));
        let mut body = Vec::new();
        // What arrives within the idle bound; a body that stalls is cut there.
        while body.len() < ERROR_BODY_BYTES {
            match tokio::time::timeout(self.idle_timeout, resp.chunk()).await {
                Ok(Ok(Some(bytes))) => body.extend_from_slice(&bytes),
                _ => break,
            }
        }
        body.truncate(ERROR_BODY_BYTES);
        let text = String::from_utf8_lossy(&body);
        let message = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| {
                let err = v.get("error").cloned();
                match err {
                    Some(e) if !e.is_null() => match server_error(&e) {
                        ModelError::Server { message, .. } => Some(message),
                        _ => None,
                    },
                    _ => ["message", "detail"]
                        .iter()
                        .find_map(|k| v.get(*k))
                        .map(|m| m.as_str().map_or_else(|| m.to_string(), str::to_string)),
                }
            })
            .unwrap_or_else(|| text.to_string());
        // Blanked before the cut, so no piece of the key is left at the end either.
        let mut excerpt = excerpt(&self.redact(message), 300);
        if let Some(to) = location {
            excerpt = format!("redirects to {to} (set the base URL to where it points)");
        } else if excerpt.is_empty() {
            excerpt = "(no body)".into();
        }
        ModelError::Status {
            url: self.shown.clone(),
            status,
            excerpt,
            retry_after,
        }
    }
}

impl Model for ModelClient {
    fn caps(&self) -> Caps {
        self.server.caps()
    }

    fn context_window(&self) -> ContextFuture<'_> {
        Box::pin(ModelClient::context_window(self))
    }

    fn step<'a>(
        &'a self,
        req: StepRequest<'a>,
        on_delta: &'a mut (dyn FnMut(Delta) + Send),
    ) -> StepFuture<'a> {
        Box::pin(ModelClient::step(self, req, on_delta))
    }
}

/// Reads what is left after `[DONE]` (the chunked body's end, usually already here) so
/// the connection goes back to the pool; a server that keeps the stream open after
/// `[DONE]` is left after a moment.
async fn drain(resp: &mut reqwest::Response) {
    let until = tokio::time::Instant::now() + DRAIN_AFTER_DONE;
    while let Ok(Ok(Some(_))) = tokio::time::timeout_at(until, resp.chunk()).await {}
}

/// What went wrong, from reqwest's error: its causes joined (its own text names only
/// the outermost, with the URL, which may hold user info).
fn causes(e: &reqwest::Error) -> String {
    let mut out = Vec::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = match std::error::Error::source(e) {
        Some(s) => Some(s),
        None => Some(e),
    };
    while let Some(err) = cur {
        let s = err.to_string();
        if !out.iter().any(|o: &String| o.contains(&s)) {
            out.push(s);
        }
        cur = err.source();
    }
    out.join(": ")
}

/// The most one event of a model's stream may hold; a stream that never ends its line is
/// refused rather than buffered without end.
pub const MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

fn malformed(e: cortex_host::sse::SseError) -> ModelError {
    ModelError::Malformed(e.to_string())
}
