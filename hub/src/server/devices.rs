//! `/api/devices` and `/api/events`: enrolling and revoking devices, the fleet's status,
//! remote waits (`POST /api/devices/{name}/waits`), and the hub's own event log (devices
//! added, revoked, online, offline) as a long poll or SSE. Behind the operator token like
//! the rest of `/api`.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use cortex_protocol::api::{
    CreateDevice, CreateDeviceWait, DeviceCreated, DeviceFiles, DeviceRemoved, DeviceRevoked,
    DeviceView, DeviceWaitCreated,
};
use cortex_protocol::mesh::MAX_WAITS_PER_DEVICE;

use super::error::{ApiError, parse_json};
use super::log::{self, LogQuery};
use crate::state::AppState;
use crate::store::device_waits::CreateDeviceWaitOutcome;
use crate::store::devices::{DeviceRecord, Forget};
use crate::time::{human_duration, now_ms};
use crate::{remote_wait, secret};

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
    ApiError::cap_chars("name", &name, MAX_DEVICE_CHARS)?;
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

/// A stored device merged with its live link, if it has one; `waits` is the count of
/// its active remote waits.
pub fn view(state: &AppState, rec: DeviceRecord, waits: u32) -> DeviceView {
    state.devices.view(rec, waits, &state.claims.hub)
}

pub async fn list_devices(State(state): State<AppState>) -> Result<Response, ApiError> {
    let (records, revoked) = state
        .store
        .read(|r| Ok((r.devices_with_wait_counts()?, r.revoked_devices()?)))
        .await
        .map_err(ApiError::store)?;
    // Every device the hub has known, as `tailscale status` lists every peer: a revoked
    // one stays visible (state `revoked`) until its name is added again.
    let mut views: Vec<DeviceView> = records
        .into_iter()
        .map(|(r, n)| view(&state, r, n))
        .collect();
    views.extend(revoked.into_iter().map(|d| DeviceView {
        name: d.name,
        state: "revoked".into(),
        since: Some(d.revoked_at),
        last_seen: d.last_seen,
        agent_version: d.agent_version,
        host: d.host,
        spool: Default::default(),
        waits: 0,
        offline_reason: Some("revoked".into()),
        wait_list: None,
        hub: None,
    }));
    views.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(views).into_response())
}

/// `GET /api/devices/{name}`: one device, with its active remote waits listed.
pub async fn get_device(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let found = state
        .store
        .read({
            let name = name.clone();
            move |r| match r.device(&name)? {
                Some(d) => Ok(Some((d, r.device_waits(&name)?))),
                None => Ok(None),
            }
        })
        .await
        .map_err(ApiError::store)?;
    let Some((rec, waits)) = found else {
        return Err(no_device(&name));
    };
    let mut v = view(&state, rec, waits.len() as u32);
    v.wait_list = Some(waits.iter().map(|w| w.view()).collect());
    Ok(Json(v).into_response())
}

/// `GET /api/devices/{name}/files`: the device's latest spool files (at most
/// `registry::FILE_NOTES`, newest first, since the hub started) and what the hub answered
/// each: `{"files": [{at, name, outcome, reason?}]}`. A refused file is one the agent
/// parked under `bad/`, with the reason it was given.
pub async fn device_files(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let exists = state
        .store
        .read({
            let name = name.clone();
            move |r| Ok(r.device(&name)?.is_some())
        })
        .await
        .map_err(ApiError::store)?;
    if !exists {
        return Err(no_device(&name));
    }
    let files = state.devices.files(&name);
    Ok(Json(DeviceFiles { files }).into_response())
}

/// `POST /api/devices/{name}/waits`.
pub async fn create_wait(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    if !valid_device_name(&name) {
        return Err(no_device(&name));
    }
    let req: CreateDeviceWait = parse_json(&body)?;
    let (new, timeout_ms) = remote_wait::plan(&state.store.settings, &state.devices, &name, &req)
        .map_err(|r| {
        ApiError::new(
            StatusCode::from_u16(r.status).unwrap_or(StatusCode::BAD_REQUEST),
            r.code,
            r.message,
        )
    })?;
    let secret = secret::new_secret();
    let hash = secret::hash(&secret);
    let out = state
        .store
        .exec(move |t| t.create_device_wait(new, hash, now_ms()))
        .await
        .map_err(ApiError::store)?;
    let (wp, wait, session_created) = match out {
        CreateDeviceWaitOutcome::Created {
            waitpoint,
            wait,
            session_created,
        } => (waitpoint, wait, session_created),
        CreateDeviceWaitOutcome::NoDevice => return Err(no_device(&name)),
        CreateDeviceWaitOutcome::NoSession => {
            return Err(ApiError::not_found(
                "session",
                req.session.as_deref().unwrap_or_default(),
            ));
        }
        CreateDeviceWaitOutcome::TooMany => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "too_many_waits",
                format!(
                    "device {name} holds {MAX_WAITS_PER_DEVICE} remote waits already; cancel some (cortex wait cancel WP_ID) before arming more"
                ),
            ));
        }
        CreateDeviceWaitOutcome::Invalid(e) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_waitpoint",
                e.to_string(),
            ));
        }
    };
    tracing::info!(
        device = %name,
        waitpoint = %wp.id,
        what = %wait.spec.describe(),
        bound = %human_duration(timeout_ms),
        session_created,
        online = state.devices.link(&name).is_some(),
        "remote wait created"
    );
    let reply = DeviceWaitCreated {
        waitpoint: crate::text::waitpoint_created(&wp, secret, &state.signal_url),
        wait: wait.view(),
    };
    Ok((StatusCode::CREATED, Json(reply)).into_response())
}

pub async fn revoke_device(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let n = name.clone();
    let now = now_ms();
    // Whether a link is up before the revoke: on a shared store, this hub may end it
    // itself as it follows the store's devices, before the line below does.
    let linked = state.devices.link(&name).is_some();
    let (found, revoked) = state
        .store
        .exec(move |t| {
            let found = t.revoke_device(&n, now)?;
            let revoked = if found { None } else { t.revoked_device(&n)? };
            Ok((found, revoked))
        })
        .await
        .map_err(ApiError::store)?;
    if let Some(gone) = revoked {
        // Said, not pretended: nothing changed, and the list still shows it revoked.
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_revoked",
            format!(
                "device {name:?} was already revoked ({} ago); nothing changed. `cortex device remove {name}` drops it from the list, `cortex device add {name}` enrols it again",
                human_duration(now.saturating_sub(gone.revoked_at))
            ),
        ));
    }
    if !found {
        return Err(no_device(&name));
    }
    // The record is gone; now no new link is accepted and the live one ends at once.
    let dropped = state.devices.revoke(&name) || linked;
    tracing::info!(device = %name, dropped, "device revoked");
    Ok(Json(DeviceRevoked {
        name,
        revoked: true,
        dropped_link: dropped,
    })
    .into_response())
}

/// `DELETE /api/devices/{name}/revoked`: a revoked device leaves the list (`cortex device
/// remove`). Only a revoked one: an enrolled device is revoked first (409 `not_revoked`),
/// so this never cuts a live device off.
pub async fn remove_device(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let n = name.clone();
    let outcome = state
        .store
        .exec(move |t| t.forget_revoked_device(&n))
        .await
        .map_err(ApiError::store)?;
    match outcome {
        Forget::Removed => {
            tracing::info!(device = %name, "revoked device removed from the list");
            Ok(Json(DeviceRemoved {
                name,
                removed: true,
            })
            .into_response())
        }
        Forget::Enrolled => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_revoked",
            format!(
                "device {name:?} is enrolled, not revoked; revoke it first (`cortex device revoke {name} --remove` does both)"
            ),
        )),
        Forget::Unknown => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no revoked device {name:?}; list them with `cortex devices`"),
        )),
    }
}

/// `GET /api/events?after=SEQ[&wait=S]`, or SSE with `Accept: text/event-stream`.
pub async fn hub_events(
    State(state): State<AppState>,
    Query(q): Query<LogQuery>,
    headers: HeaderMap,
    hangup: Option<axum::Extension<super::http::Hangup>>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
) -> Result<Response, ApiError> {
    let conn = log::Conn::of(&headers, hangup.map(|h| h.0), peer.map(|p| (p.0).0));
    // Subscribe before reading, so nothing committed in between is missed.
    let rx = state.store.notifier.subscribe_hub();
    let read = |after: u64, limit: usize| -> log::LogReader {
        Box::new(move |r| r.hub_events_after(after, limit).map(Some))
    };
    let gone = || ApiError::new(StatusCode::NOT_FOUND, "not_found", "no hub event log");
    let sse = log::wants_sse(&headers);
    log::serve(state, q, sse, rx, read, gone, None, conn).await
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
