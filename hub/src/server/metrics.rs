//! `GET /metrics`: the hub's metrics in the Prometheus text format, on the API listener
//! (loopback only) and, like `/healthz`, without the operator token: a scraper on this
//! machine reads counts and times, never a secret, a token or a name a job chose (a
//! device's name is the operator's).

use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use crate::state::AppState;

pub async fn route(State(state): State<AppState>) -> Response {
    let mut read = crate::metrics::Fleet {
        session_watchers: i64::try_from(state.store.notifier.session_watchers())
            .unwrap_or(i64::MAX),
        ..state.devices.fleet()
    };
    // On a store shared by several hubs, a device linked to another is online too (as
    // `GET /api/devices` says): the fleet's states come from the store; the links gauge
    // stays this hub's own.
    if state.store.is_shared() {
        match state.store.read(|r| r.devices()).await {
            Ok(all) => {
                let me = state.claims.hub.as_str();
                let online = all
                    .iter()
                    .filter(|d| {
                        state.devices.link(&d.name).is_some()
                            || (d.link.is_some() && d.hub.as_deref().is_some_and(|h| h != me))
                    })
                    .count() as i64;
                read.online = online;
                read.offline = all.len() as i64 - online;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the devices for /metrics; showing this hub's links only");
            }
        }
    }
    match crate::metrics::metrics().encode(read) {
        Ok(text) => ([(CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response(),
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "metrics_unavailable",
            format!("the metrics could not be written out: {e}"),
        )
        .into_response(),
    }
}
