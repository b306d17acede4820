//! One error type for every HTTP answer that is not a success: it maps to the contract's
//! codes and always answers a JSON object `{error, message, members?}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use cortex_protocol::signal::ErrorBody;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub members: Option<Vec<String>>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            members: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 413 for a field over its cap, naming both: `title is 2000000 characters, over
    /// the cap of 200`.
    pub fn too_long(field: &str, len: usize, max: usize, unit: &str) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("{field} is {len} {unit}, over the cap of {max}; shorten it"),
        )
    }

    /// [`ApiError::too_long`] when `value` has more than `max` characters.
    pub fn cap_chars(field: &str, value: &str, max: usize) -> Result<(), Self> {
        let n = value.chars().count();
        if n > max {
            return Err(Self::too_long(field, n, max, "characters"));
        }
        Ok(())
    }

    pub fn not_found(what: &str, id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no {what} {id:?}; list them with `cortex sessions` or `cortex wait check`"),
        )
    }

    /// The JSON body, for an answer written outside the router (`server::http`).
    pub fn body_bytes(&self) -> Vec<u8> {
        let body = ErrorBody {
            error: self.code.to_string(),
            message: self.message.clone(),
            members: self.members.clone(),
        };
        serde_json::to_vec(&body).unwrap_or_else(|_| b"{}".to_vec())
    }

    pub fn store(e: impl std::fmt::Display) -> Self {
        tracing::error!(error = %e, "store failure");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "the hub could not write to its store; nothing was recorded, retry shortly (cortex-signal spools the signal by itself)",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.code.to_string(),
            message: self.message,
            members: self.members,
        };
        (self.status, Json(body)).into_response()
    }
}

/// Parses a JSON body into `T`, answering 400 with serde's reason.
pub fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("body is not valid: {e}")))
}
