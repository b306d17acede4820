//! `ModelError`: why a model call failed, in words an operator can act on. No variant
//! carries the API key; the URLs in it are the endpoint without user info or query.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// The configuration cannot work (no model, a bad URL, a bad number).
    #[error("model configuration: {0}")]
    Config(String),
    #[error("could not connect to the model server at {url}: {reason}")]
    Connect { url: String, reason: String },
    /// The request went out but no answer came back (the connection dropped first).
    #[error("the request to the model server at {url} failed: {reason}")]
    Request { url: String, reason: String },
    /// A non-2xx answer. `retry_after` is the server's `Retry-After`, capped.
    #[error("the model server at {url} answered HTTP {status}: {excerpt}")]
    Status {
        url: String,
        status: u16,
        excerpt: String,
        retry_after: Option<Duration>,
    },
    #[error("timed out after {after:?} waiting for the model server at {url} to start answering")]
    FirstByteTimeout { url: String, after: Duration },
    #[error("the model server at {url} sent nothing for {after:?} in the middle of its answer")]
    IdleTimeout { url: String, after: Duration },
    /// The connection broke while the answer streamed.
    #[error("the connection to the model server at {url} broke mid-answer: {reason}")]
    Stream { url: String, reason: String },
    /// The bytes were not the Server-Sent Events of chat completion chunks.
    #[error("the model server's answer was malformed: {0}")]
    Malformed(String),
    /// A `data: {"error": …}` inside a 200 stream (or a 200 JSON error body).
    #[error("the model server reported an error mid-answer: {message}")]
    Server { message: String, retryable: bool },
    /// The stream closed cleanly with neither a `finish_reason` nor `[DONE]`.
    #[error(
        "the model server's stream ended before the answer was complete (no finish_reason, no [DONE])"
    )]
    Truncated,
    /// The reply streamed more than one reply may (settings.json `limits.replyBytes`).
    #[error(
        "the model's reply passed {limit} bytes {what}, the most one reply may stream (settings.json limits.replyBytes); the call was stopped and is not made again"
    )]
    ReplyTooLarge { limit: u64, what: &'static str },
    /// The call, retries and all, took longer than one call may (settings.json
    /// `limits.callDeadlineMs`).
    #[error(
        "the model call took more than {after:?}, the most one call may take with its retries (settings.json limits.callDeadlineMs); it was stopped and is not made again"
    )]
    Deadline { after: Duration },
    #[error("gave up after {attempts} attempts; last error: {last}")]
    RetriesExhausted {
        attempts: u32,
        last: Box<ModelError>,
    },
}

impl ModelError {
    /// Whether calling again may succeed: connection trouble, 408, 429, 5xx, a timeout, a
    /// stream cut short, a server error mid-stream that says it is transient. Other 4xx,
    /// a bad configuration and a malformed stream would fail the same way again.
    pub fn is_retryable(&self) -> bool {
        match self {
            ModelError::Connect { .. }
            | ModelError::Request { .. }
            | ModelError::FirstByteTimeout { .. }
            | ModelError::IdleTimeout { .. }
            | ModelError::Stream { .. }
            | ModelError::Truncated => true,
            ModelError::Status { status, .. } => *status == 408 || *status == 429 || *status >= 500,
            ModelError::Server { retryable, .. } => *retryable,
            ModelError::Config(_)
            | ModelError::Malformed(_)
            | ModelError::ReplyTooLarge { .. }
            | ModelError::Deadline { .. }
            | ModelError::RetriesExhausted { .. } => false,
        }
    }

    /// The wait the server asked for, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ModelError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}
