//! `/api/devices` and `/api/events`: enrolling and revoking devices, the fleet's status,
//! and the hub's own event log (devices added, revoked, online, offline) as a long poll
//! or SSE. Behind the operator token like the rest of `/api`.

use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use cortex_protocol::api::{CreateDevice, DeviceCreated, DeviceView};
use serde::Deserialize;
use tokio_stream::wrappers::ReceiverStream;

use super::AppState;
use super::error::{ApiError, parse_json};
use crate::secret;
use crate::store::devices::DeviceRecord;
use crate::time::now_ms;

/// The longest long poll one request may ask for.
const MAX_WAIT_S: u64 = 120;
/// Events per page.
const PAGE: usize = 1_000;
/// Longest device name.
pub const MAX_DEVICE_CHARS: usize = 64;

/// A device name: 1-64 letters, digits, '.', '_' or '-', not starting with '.' or '-'.
/// Narrower than a member name on purpose: no ':' (a device's file identity is
/// `file:DEVICE:FILE`, which must not be ambiguous) and no '/' (it is a URL path segment
/// and a header value).
pub fn valid_device_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().count() <= MAX_DEVICE_CHARS
        && !name.starts_with(['.', '-'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn no_device(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no device {name:?}; list them with `cortex devices`"),
    )
}

/// The line that starts the agent on the device; the token itself goes in a file, so it
/// stays off the command line and out of the process's environment.
pub fn install_line(mesh_url: Option<&str>, name: &str) -> String {
    let url = mesh_url.unwrap_or("ws://HUB-HOST:3002/mesh/v1");
    let ca = if url.starts_with("wss://") {
        " [--ca-cert CA.pem]"
    } else {
        ""
    };
    format!("cortex-device-agent --hub {url} --name {name} --token-file ~/.cortex/device-token{ca}")
}

pub async fn create_device(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: CreateDevice = parse_json(&body)?;
    let name = req.name.trim().to_string();
    if !valid_device_name(&name) {
        return Err(ApiError::bad_request(format!(
            "device name {name:?} is not usable; use 1-{MAX_DEVICE_CHARS} letters, digits, '.', '_' or '-' (not starting with '.' or '-')"
        )));
    }
    let token = secret::random_hex(32);
    let hash = secret::hash(&token);
    let n = name.clone();
    let added = state
        .store
        .exec(move |t| t.add_device(&n, hash, now_ms()))
        .await
        .map_err(ApiError::store)?;
    if !added {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "device_exists",
            format!(
                "device {name:?} already exists; to give it a new token, revoke it first (cortex device revoke {name}), then add it again"
            ),
        ));
    }
    state.devices.allow(&name, hash);
    tracing::info!(device = %name, "device added");
    let install = install_line(state.mesh_url.as_deref(), &name);
    Ok((
        StatusCode::CREATED,
        Json(DeviceCreated {
            name,
            token,
            install,
        }),
    )
        .into_response())
}

/// A stored device merged with its live link, if it has one.
pub fn view(state: &AppState, rec: DeviceRecord) -> DeviceView {
    match state.devices.link(&rec.name) {
        Some(link) => DeviceView {
            name: rec.name,
            state: "online".into(),
            since: Some(link.online_since),
            last_seen: Some(link.last_seen()),
            agent_version: Some(link.agent_version.clone()),
            host: Some(link.host.clone()),
            spool: link.spool(),
            // Remote waits arrive with a later issue; until then a device holds none.
            waits: 0,
            offline_reason: None,
        },
        None => DeviceView {
            name: rec.name,
            state: "offline".into(),
            since: rec.offline_since,
            last_seen: rec.last_seen,
            agent_version: rec.agent_version,
            host: rec.host,
            spool: rec.spool,
            waits: 0,
            offline_reason: rec.offline_reason,
        },
    }
}

pub async fn list_devices(State(state): State<AppState>) -> Result<Response, ApiError> {
    let records = state.store.read(|r| r.devices()).map_err(ApiError::store)?;
    let views: Vec<DeviceView> = records.into_iter().map(|r| view(&state, r)).collect();
    Ok(Json(views).into_response())
}

pub async fn revoke_device(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let n = name.clone();
    let found = state
        .store
        .exec(move |t| t.revoke_device(&n, now_ms()))
        .await
        .map_err(ApiError::store)?;
    if !found {
        return Err(no_device(&name));
    }
    // The record is gone; now no new link is accepted and the live one ends at once.
    let dropped = state.devices.revoke(&name);
    tracing::info!(device = %name, dropped, "device revoked");
    Ok(
        Json(serde_json::json!({"name": name, "revoked": true, "dropped_link": dropped}))
            .into_response(),
    )
}

#[derive(Debug, Deserialize)]
pub struct EventsQuery {
    #[serde(default)]
    after: u64,
    wait: Option<u64>,
}

fn events_body(raw: &[Vec<u8>]) -> Response {
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

/// `GET /api/events?after=SEQ[&wait=S]`, or SSE with `Accept: text/event-stream`.
pub async fn hub_events(
    State(state): State<AppState>,
    Query(q): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let sse = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    // Subscribe before reading, so nothing committed in between is missed.
    let mut rx = state.store.notifier.subscribe_hub();
    if sse {
        return Ok(sse_stream(state, q.after, rx));
    }
    let deadline = q
        .wait
        .map(|w| tokio::time::Instant::now() + Duration::from_secs(w.min(MAX_WAIT_S)));
    loop {
        rx.borrow_and_update();
        let raw = state
            .store
            .read(|r| r.hub_events_after(q.after, PAGE))
            .map_err(ApiError::store)?;
        if !raw.is_empty() {
            return Ok(events_body(&raw));
        }
        let Some(deadline) = deadline else {
            return Ok(events_body(&raw));
        };
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return Ok(events_body(&raw)) },
            () = tokio::time::sleep_until(deadline) => return Ok(events_body(&raw)),
            () = state.shutdown.cancelled() => return Ok(events_body(&raw)),
        }
    }
}

fn sse_stream(state: AppState, after: u64, mut rx: tokio::sync::watch::Receiver<u64>) -> Response {
    let (tx, out) = tokio::sync::mpsc::channel::<Result<SseEvent, Infallible>>(64);
    tokio::spawn(async move {
        let mut cursor = after;
        loop {
            rx.borrow_and_update();
            let Ok(raw) = state.store.read(|r| r.hub_events_after(cursor, PAGE)) else {
                return;
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
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return },
                () = tx.closed() => return,
                () = state.shutdown.cancelled() => return,
            }
        }
    });
    Sse::new(ReceiverStream::new(out))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names() {
        for ok in ["gpu1", "trainer-2.lab", "a_b", "A"] {
            assert!(valid_device_name(ok), "{ok}");
        }
        for bad in ["", "a:b", "a/b", "-x", ".x", "a b", "é", &"x".repeat(65)] {
            assert!(!valid_device_name(bad), "{bad}");
        }
    }

    #[test]
    fn install_line_keeps_the_token_off_it() {
        let l = install_line(Some("ws://127.0.0.1:3002/mesh/v1"), "gpu1");
        assert_eq!(
            l,
            "cortex-device-agent --hub ws://127.0.0.1:3002/mesh/v1 --name gpu1 --token-file ~/.cortex/device-token"
        );
        assert!(install_line(Some("wss://hub:3002/mesh/v1"), "g").contains("--ca-cert"));
    }
}
