//! The Host check every route sits behind: [`crate::hosts::Hosts`] applied to each request.

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use crate::state::AppState;

/// The middleware: 421 for a Host that is not the hub's, with the names it answers to.
pub async fn check(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .map(|v| v.to_str().unwrap_or("\u{fffd}").to_string());
    match host {
        Some(h) if !state.hosts.allows(&h) => {
            tracing::warn!(host = %h.chars().take(100).collect::<String>(), "refused a request for a name this hub does not serve");
            ApiError::new(
                StatusCode::MISDIRECTED_REQUEST,
                "unknown_host",
                format!(
                    "this hub answers to {}, not to the Host this request names; if you serve it under that name, add it to settings.json allowedHosts",
                    state.hosts.describe()
                ),
            )
            .into_response()
        }
        _ => next.run(req).await,
    }
}
