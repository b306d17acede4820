//! `/api/mcp/tokens`: tokens that reach only `/mcp`, one per agent or client (`cortex
//! mcp-token`). Each is shown once, when made, and kept as its SHA-256; a client's tasks
//! and connections are bound to its token, so one agent never sees another's.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use cortex_protocol::api::{CreateMcpToken, McpTokenCreated, McpTokenRevoked, McpTokenView};

use super::devices::{MAX_DEVICE_CHARS, valid_device_name};
use super::error::{ApiError, parse_json};
use crate::secret;
use crate::state::AppState;
use crate::time::now_ms;

/// `POST /api/mcp/tokens {name}`: 201 with the token, shown this once.
pub async fn create(State(state): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let req: CreateMcpToken = parse_json(&body)?;
    let name = req.name.trim().to_string();
    ApiError::cap_chars("name", &name, MAX_DEVICE_CHARS)?;
    if !valid_device_name(&name) {
        return Err(ApiError::bad_request(format!(
            "token name {name:?} is not usable; use 1-{MAX_DEVICE_CHARS} letters, digits, '.', '_' or '-' (not starting with '.' or '-')"
        )));
    }
    let token = format!("mcp_{}", secret::random_hex(32));
    let hash = secret::hash(&token);
    let n = name.clone();
    let added = state
        .store
        .exec(move |t| t.add_mcp_token(&n, hash, now_ms()))
        .await
        .map_err(ApiError::store)?;
    if !added {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "token_exists",
            format!(
                "an MCP token named {name:?} exists; revoke it first (cortex mcp-token revoke {name})"
            ),
        ));
    }
    tracing::info!(token = %name, "MCP token added");
    Ok((StatusCode::CREATED, Json(McpTokenCreated { name, token })).into_response())
}

/// `GET /api/mcp/tokens`: their names and when each was made, never a token.
pub async fn list(State(state): State<AppState>) -> Result<Response, ApiError> {
    let all = state
        .store
        .read(|r| r.mcp_tokens())
        .await
        .map_err(ApiError::store)?;
    let views: Vec<McpTokenView> = all
        .into_iter()
        .map(|(name, t)| McpTokenView {
            name,
            created_at: t.created_at,
        })
        .collect();
    Ok(Json(views).into_response())
}

/// `DELETE /api/mcp/tokens/{name}`: the token reaches nothing from now on.
pub async fn revoke(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let n = name.clone();
    let revoked = state
        .store
        .exec(move |t| t.revoke_mcp_token(&n))
        .await
        .map_err(ApiError::store)?;
    if !revoked {
        return Err(ApiError::not_found("MCP token", &name));
    }
    tracing::info!(token = %name, "MCP token revoked");
    Ok(Json(McpTokenRevoked {
        name,
        revoked: true,
    })
    .into_response())
}
