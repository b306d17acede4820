//! MCP tokens: bearer tokens that reach only `/mcp`, one per agent or client, so each
//! agent's tasks are its own (`/api/mcp/tokens`).

use serde::{Deserialize, Serialize};

/// `POST /api/mcp/tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateMcpToken {
    /// A name for whoever holds it (1-64 letters, digits, '.', '_' or '-').
    pub name: String,
}

/// The answer to `POST /api/mcp/tokens`: the only one that shows the token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct McpTokenCreated {
    pub name: String,
    pub token: String,
}

/// One MCP token as listed (never the token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct McpTokenView {
    pub name: String,
    pub created_at: u64,
}

/// `DELETE /api/mcp/tokens/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct McpTokenRevoked {
    pub name: String,
    pub revoked: bool,
}
