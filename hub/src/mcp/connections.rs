//! MCP connections kept in the store (the SDK's `SessionStore`): a client's handshake is
//! written when it is made, so after a restart (or on another hub on the database) the
//! same connection id is served again without a new handshake, in the same session.
//! A connection the SDK closes (its client idle past the keep-alive) is kept all the
//! same: its client may come back with its id; unused ones are forgotten after
//! `CONNECTION_KEPT_MS`.

use rmcp::transport::streamable_http_server::session::{
    SessionState, SessionStore, SessionStoreError,
};

use crate::state::AppState;
use crate::store::mcp::{McpConnection, connection_key};
use crate::time::now_ms;

pub struct Kept {
    state: AppState,
}

impl Kept {
    pub fn new(state: AppState) -> Kept {
        Kept { state }
    }
}

fn failed(e: impl std::fmt::Display) -> SessionStoreError {
    format!("the hub's store failed: {e}").into()
}

#[async_trait::async_trait]
impl SessionStore for Kept {
    async fn load(&self, session_id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        let key = connection_key(session_id);
        let c = self
            .state
            .store
            .read(move |r| r.mcp_connection(&key))
            .await
            .map_err(failed)?;
        match c {
            Some(c) if !c.init.is_empty() => Ok(serde_json::from_str(&c.init).ok()),
            _ => Ok(None),
        }
    }

    async fn store(&self, session_id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let key = connection_key(session_id);
        let init = serde_json::to_string(state).map_err(failed)?;
        self.state
            .store
            .exec(move |t| {
                let now = now_ms();
                let c = match t.mcp_connection(&key)? {
                    Some(mut c) => {
                        c.init = init;
                        c.used_at = now;
                        c
                    }
                    None => McpConnection {
                        init,
                        created_at: now,
                        used_at: now,
                        owner: None,
                        session: None,
                    },
                };
                t.put_mcp_connection(&key, &c)
            })
            .await
            .map_err(failed)
    }

    async fn delete(&self, _session_id: &str) -> Result<(), SessionStoreError> {
        Ok(())
    }
}
