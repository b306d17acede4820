//! Serving an append-only log over HTTP, for a session's events and the hub's own: one
//! page after a seq, a long poll (`wait`) that answers as soon as something lands, or a
//! live SSE stream. The log is read as stored JSON, never re-encoded.

use std::convert::Infallible;
use std::time::Duration;

use axum::http::{HeaderMap, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::sync::Arc;

use tokio::sync::{broadcast, watch};
use tokio_stream::wrappers::ReceiverStream;

use super::error::ApiError;
use crate::state::AppState;
use crate::store::{ReadTx, StoreError};

/// The longest long poll one request may ask for.
pub const MAX_WAIT_S: u64 = 120;
/// Events per page.
pub const PAGE: usize = 1_000;

/// `?after=SEQ&wait=SECONDS`.
#[derive(Debug, Deserialize)]
pub struct LogQuery {
    #[serde(default)]
    pub after: u64,
    pub wait: Option<u64>,
}

/// A read of up to [`PAGE`] entries of a log, for [`crate::store::Store::read`]; `None`
/// when the log is gone.
pub type LogReader =
    Box<dyn for<'a> FnOnce(&ReadTx<'a>) -> Result<Option<Vec<Vec<u8>>>, StoreError> + Send>;

/// Makes the read of the entries after a seq.
pub trait ReadLog: Fn(u64) -> LogReader + Send + Sync + 'static {}
impl<F> ReadLog for F where F: Fn(u64) -> LogReader + Send + Sync + 'static {}

pub fn wants_sse(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}

fn page(raw: &[Vec<u8>]) -> Response {
    let mut out = Vec::with_capacity(raw.iter().map(|r| r.len() + 1).sum::<usize>() + 16);
    out.extend_from_slice(b"{\"events\":[");
    for (i, r) in raw.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(r);
    }
    out.extend_from_slice(b"]}");
    ([(header::CONTENT_TYPE, "application/json")], out).into_response()
}

/// Answers a log request. `rx` must be subscribed before this reads, so nothing
/// committed in between is missed; `gone` is the answer when the log does not exist.
/// `live`: pieces that are streamed but never stored (a session's model text as it
/// arrives), sent to an SSE follower as `event: live` between the stored events.
pub async fn serve(
    state: AppState,
    q: LogQuery,
    sse: bool,
    mut rx: watch::Receiver<u64>,
    read: impl ReadLog,
    gone: impl Fn() -> ApiError,
    live: Option<broadcast::Receiver<Arc<str>>>,
) -> Result<Response, ApiError> {
    if sse {
        return Ok(stream(state, q.after, rx, read, live));
    }
    let deadline = q
        .wait
        .map(|w| tokio::time::Instant::now() + Duration::from_secs(w.min(MAX_WAIT_S)));
    loop {
        rx.borrow_and_update();
        let raw = state
            .store
            .read(read(q.after))
            .await
            .map_err(ApiError::store)?
            .ok_or_else(&gone)?;
        if !raw.is_empty() {
            return Ok(page(&raw));
        }
        let Some(deadline) = deadline else {
            return Ok(page(&raw));
        };
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return Ok(page(&raw)) },
            () = tokio::time::sleep_until(deadline) => return Ok(page(&raw)),
            () = state.shutdown.cancelled() => return Ok(page(&raw)),
        }
    }
}

fn stream(
    state: AppState,
    after: u64,
    mut rx: watch::Receiver<u64>,
    read: impl ReadLog,
    mut live: Option<broadcast::Receiver<Arc<str>>>,
) -> Response {
    let (tx, out) = tokio::sync::mpsc::channel::<Result<SseEvent, Infallible>>(64);
    tokio::spawn(async move {
        let mut cursor = after;
        loop {
            rx.borrow_and_update();
            let raw = match state.store.read(read(cursor)).await {
                Ok(Some(raw)) => raw,
                Ok(None) | Err(_) => return,
            };
            for r in raw {
                let seq = serde_json::from_slice::<serde_json::Value>(&r)
                    .ok()
                    .and_then(|v| v.get("seq").and_then(|s| s.as_u64()))
                    .unwrap_or(cursor);
                cursor = cursor.max(seq);
                let ev = SseEvent::default()
                    .id(seq.to_string())
                    .event("event")
                    .data(String::from_utf8_lossy(&r));
                if tx.send(Ok(ev)).await.is_err() {
                    return;
                }
            }
            loop {
                tokio::select! {
                    changed = rx.changed() => if changed.is_err() { return } else { break },
                    piece = next_live(&mut live) => match piece {
                        Some(json) => {
                            let ev = SseEvent::default().event("live").data(json.as_ref());
                            if tx.send(Ok(ev)).await.is_err() {
                                return;
                            }
                        }
                        None => live = None,
                    },
                    () = tx.closed() => return,
                    () = state.shutdown.cancelled() => return,
                }
            }
        }
    });
    Sse::new(ReceiverStream::new(out))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// The next live piece; `None` once the channel is gone. A follower that fell behind
/// skips what it missed (the stored event of each step holds its whole text).
async fn next_live(live: &mut Option<broadcast::Receiver<Arc<str>>>) -> Option<Arc<str>> {
    let Some(rx) = live else {
        return std::future::pending().await;
    };
    loop {
        match rx.recv().await {
            Ok(piece) => return Some(piece),
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return None,
        }
    }
}
