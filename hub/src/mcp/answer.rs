//! Who calls (what the guard found), and a tool call's answer as a client reads it.

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{Value, json};

/// Who calls: set by the guard on each request that passed it.
#[derive(Debug, Clone)]
pub struct Caller {
    /// SHA-256 of the bearer token.
    pub owner: [u8; 32],
    /// The session name the request carries ([`SESSION_HEADER`]), if any.
    pub named: Option<String>,
}

/// A tool's answer: its text (what a model reads) and the same as structured JSON.
pub fn result(ok: bool, text: Option<String>, value: Value) -> CallToolResult {
    let text = text.unwrap_or_else(|| value.to_string());
    let mut r = if ok {
        CallToolResult::success(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::error(vec![ContentBlock::text(text)])
    };
    r.structured_content = Some(value);
    r
}

pub fn error_result(message: &str) -> CallToolResult {
    result(false, Some(message.to_string()), json!({"error": message}))
}
