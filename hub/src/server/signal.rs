//! `POST /webhook/signal`: the route jobs call. No operator token: the waitpoint's own
//! secret is the capability. The body's checks are here; what the store's answer becomes
//! (the contract's codes) is [`crate::intake`]'s.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cortex_protocol::SignalRequest;
use cortex_protocol::signal::MAX_BODY_BYTES;

use super::error::ApiError;
use crate::intake::{HttpAnswer, SignalSource};
use crate::state::AppState;

pub async fn route(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the body is over {MAX_BODY_BYTES} bytes; send at most 2,000 characters of message and 16,000 of data (cortex-signal trims data to its tail by itself)"),
        )
        .into_response()
    };
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        && len > MAX_BODY_BYTES
    {
        return too_large();
    }
    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => return too_large(),
    };
    let req = match SignalRequest::parse(&bytes) {
        Ok(r) => r,
        Err(e @ cortex_protocol::signal::ShapeError::TooLong { .. }) => {
            return ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", e.to_string())
                .into_response();
        }
        Err(e) => return ApiError::bad_request(e.to_string()).into_response(),
    };
    let src = SignalSource::Http;
    let outcome = state.store.signal(src.signal_in(req.clone())).await;
    match src.http_answer(&req, outcome, &state.misses) {
        HttpAnswer::Accepted(a) => (StatusCode::ACCEPTED, Json(a)).into_response(),
        HttpAnswer::Error(status, body) => (status, Json(body)).into_response(),
    }
}
