//! The operations of MCP tokens.

use cortex_protocol::api::{CreateMcpToken, McpTokenCreated, McpTokenRevoked, McpTokenView};
use serde_json::json;
use utoipa::openapi::HttpMethod;

use super::doc::*;

pub(super) fn tokens(d: &mut Doc) {
    let body = d.body::<CreateMcpToken>(true, json!({"name": "claude-laptop"}));
    let created = d.json::<McpTokenCreated>(
        "Made. The only answer that ever shows the token",
        json!({"name": "claude-laptop",
               "token": "mcp_5b1c0e0c8e2f4a8d9c3b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d"}),
    );
    let bad = d.error(
        "Not such JSON, or a name that is not 1-64 letters, digits, '.', '_' or '-'",
        &["bad_request"],
    );
    let exists = d.error("A token of that name exists", &["token_exists"]);
    d.add(
        HttpMethod::Post,
        "/api/mcp/tokens",
        Access::Operator,
        op(
            "mcp",
            "createMcpToken",
            "Make an MCP token",
            "A bearer token that reaches only `/mcp`: a client holding it sees only its own \
             sessions' waits and its own tasks.",
        )
        .request_body(Some(body.build()))
        .response("201", created)
        .response("400", bad)
        .response("409", exists),
    );
    let list = d.json_list::<McpTokenView>(
        "Every MCP token, never the token itself",
        json!([{"name": "claude-laptop", "created_at": 1796590000000u64}]),
    );
    d.add(
        HttpMethod::Get,
        "/api/mcp/tokens",
        Access::Operator,
        op(
            "mcp",
            "listMcpTokens",
            "List the MCP tokens",
            "Their names and when each was made.",
        )
        .response("200", list),
    );
    let revoked = d.json::<McpTokenRevoked>(
        "Revoked: the token reaches nothing from now on",
        json!({"name": "claude-laptop", "revoked": true}),
    );
    let missing = d.error("No MCP token of that name", &["not_found"]);
    d.add(
        HttpMethod::Delete,
        "/api/mcp/tokens/{name}",
        Access::Operator,
        op(
            "mcp",
            "revokeMcpToken",
            "Revoke an MCP token",
            "Requests carrying it are refused (401) at once.",
        )
        .parameter(path_param("name", "The token's name", "claude-laptop"))
        .response("200", revoked)
        .response("404", missing),
    );
}
