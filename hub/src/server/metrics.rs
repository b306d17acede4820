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
    let read = crate::metrics::Fleet {
        session_watchers: i64::try_from(state.store.notifier.session_watchers())
            .unwrap_or(i64::MAX),
        ..state.devices.fleet()
    };
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
