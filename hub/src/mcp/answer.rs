//! Who calls (what the guard found), and a tool call's answer as a client reads it.

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{Value, json};

use crate::secret;
use crate::state::AppState;
use crate::store::mcp::{ConnectionRefused, connection_key};

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

/// The stored connection a request belongs to, and the title its session gets: the
/// session its client names, else its MCP session (`session_id`), else (a request of
/// the stateless revision without a name) the token's own.
pub fn connection(
    caller: &Caller,
    session_id: Option<&str>,
    client: Option<&str>,
) -> (String, String) {
    let key = match (&caller.named, session_id) {
        (Some(name), _) => connection_key(&format!("named:{}:{name}", secret::hex(&caller.owner))),
        (None, Some(id)) => connection_key(id),
        (None, None) => connection_key(&format!("token:{}", secret::hex(&caller.owner))),
    };
    let title = match (&caller.named, client.filter(|c| !c.trim().is_empty())) {
        (Some(n), _) => format!("mcp: {n}"),
        (None, Some(c)) => format!("mcp: {}", c.chars().take(60).collect::<String>()),
        (None, None) => "mcp".to_string(),
    };
    (key, title)
}

/// How stale a connection's last use may be before a call writes it again.
const USED_EVERY_MS: u64 = 3_600_000;

/// The session of connection `key` for the token whose hash is `owner`, made (titled
/// `title`) at its first call; a refusal is the call's answer.
pub async fn session_of(
    state: &AppState,
    key: &str,
    owner: [u8; 32],
    title: &str,
) -> Result<String, CallToolResult> {
    let (key, title) = (key.to_string(), title.to_string());
    // Most calls find their session made: a read, not a durable write.
    let k = key.clone();
    let now = crate::time::now_ms();
    let known = state
        .store
        .read(move |r| {
            let Some(c) = r.mcp_connection(&k)? else {
                return Ok(None);
            };
            let fresh = c.used_at.saturating_add(USED_EVERY_MS) > now;
            match (c.owner, c.session) {
                (Some(o), Some(sid)) if fresh && secret::same_hash(&o, &owner) => {
                    Ok(r.get_session(&sid)?.map(|_| sid))
                }
                _ => Ok(None),
            }
        })
        .await;
    if let Ok(Some(sid)) = known {
        return Ok(sid);
    }
    match state
        .store
        .exec(move |t| t.mcp_session(&key, owner, &title, crate::time::now_ms()))
        .await
    {
        Ok(Ok(sid)) => Ok(sid),
        Ok(Err(ConnectionRefused::OtherOwner)) => Err(error_result(
            "this connection was opened with another token; open a new one",
        )),
        Err(e) => Err(error_result(&format!(
            "the hub's store failed: {e}; try again"
        ))),
    }
}
