//! `POST /webhook/signal`: the route jobs call. No operator token: the waitpoint's own
//! secret is the capability. Codes exactly as seed 000 and the contract.

use std::time::Instant;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cortex_protocol::SignalRequest;
use cortex_protocol::signal::{MAX_BODY_BYTES, SignalAccepted, SignalResult};

use super::error::ApiError;
use crate::engine::Refusal;
use crate::intake::MISS_BUDGET;
use crate::state::AppState;
use crate::store::{SignalIn, SignalOutcome};

/// What the route does with a signal, shared with the local spool.
pub enum Answer {
    Accepted(SignalAccepted),
    Error(ApiError),
}

/// Maps a store outcome to the contract's answer. `route` names where it came from, for
/// the log line of a miss.
pub fn answer(
    state: &AppState,
    req: &SignalRequest,
    outcome: SignalOutcome,
    route: &str,
) -> Answer {
    let accepted = |result, st: crate::engine::State| {
        Answer::Accepted(SignalAccepted {
            result,
            waitpoint: req.id.clone(),
            state: st.as_str().to_string(),
        })
    };
    match outcome {
        SignalOutcome::Accepted { state } => accepted(SignalResult::Accepted, state),
        SignalOutcome::Duplicate { state } => accepted(SignalResult::Duplicate, state),
        SignalOutcome::Unknown | SignalOutcome::WrongSecret => {
            let unknown = matches!(outcome, SignalOutcome::Unknown);
            if !state.misses.spend(Instant::now()) {
                return Answer::Error(ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "miss_budget_spent",
                    format!(
                        "more than {MISS_BUDGET} unknown ids or wrong secrets in the last minute; check the id and secret your job was given, then retry in a minute"
                    ),
                ));
            }
            if unknown {
                tracing::warn!(waitpoint = %req.id, via = route, "signal for an unknown waitpoint id (a typo, or a waitpoint resolved more than 3 days ago)");
                Answer::Error(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "unknown_waitpoint",
                    format!(
                        "no waitpoint {:?}; check the id (CORTEX_SIGNAL_ID) your job was given; a resolved waitpoint is forgotten after 3 days",
                        req.id
                    ),
                ))
            } else {
                tracing::warn!(waitpoint = %req.id, via = route, "signal with a wrong secret");
                Answer::Error(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "wrong_secret",
                    format!(
                        "the secret does not match waitpoint {}; use the secret handed out when it was armed (CORTEX_SIGNAL_SECRET)",
                        req.id
                    ),
                ))
            }
        }
        SignalOutcome::Refused(r) => {
            let msg = r.to_string();
            match r {
                Refusal::Gone { .. } => Answer::Error(ApiError::new(
                    StatusCode::GONE,
                    "already_resolved",
                    format!("{msg}; this is not an error for the job"),
                )),
                Refusal::MemberMissing { members } | Refusal::MemberUnlisted { members, .. } => {
                    let mut e = ApiError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "bad_member",
                        format!("{msg}; expected one of: {}", members.join(", ")),
                    );
                    e.members = Some(members);
                    Answer::Error(e)
                }
            }
        }
    }
}

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
    let input = SignalIn {
        dedupe: req.key.clone(),
        req: req.clone(),
        source: "http".into(),
    };
    let outcome = match state.store.signal(input).await {
        Ok(o) => o,
        Err(e) => return ApiError::store(e).into_response(),
    };
    match answer(&state, &req, outcome, "http") {
        Answer::Accepted(a) => (StatusCode::ACCEPTED, Json(a)).into_response(),
        Answer::Error(e) => e.into_response(),
    }
}
