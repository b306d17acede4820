//! Wakes pushed into a client's session: Claude Code's channel contract (the server
//! declares `experimental["claude/channel"]` and sends `notifications/claude/channel`
//! `{content, meta}`), so a session idle at its prompt hears a wake without polling.
//! A connection with a handshake (its client named `claude-code`, or declaring the same
//! experimental capability) gets one follower of its cortex session once it made a call:
//! each wake after that is sent as it is logged, its text (the payload framed as data)
//! the content. The follower ends with the connection or the hub.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cortex_protocol::api::EventBody;
use rmcp::RoleServer;
use rmcp::model::{ClientCapabilities, CustomNotification, ServerNotification};
use rmcp::service::Peer;
use serde_json::json;

use super::wait;
use crate::state::AppState;

/// The capability and the notification's method.
pub const CAPABILITY: &str = "claude/channel";
pub const METHOD: &str = "notifications/claude/channel";
/// How often a follower looks whether its connection is still there.
const LOOK: Duration = Duration::from_secs(15);

/// Whether a client takes channel messages.
pub fn wanted(client_name: Option<&str>, caps: Option<&ClientCapabilities>) -> bool {
    client_name.is_some_and(|n| n.starts_with("claude-code"))
        || caps
            .and_then(|c| c.experimental.as_ref())
            .is_some_and(|e| e.contains_key(CAPABILITY))
}

/// The connections followed now (by their stored key).
#[derive(Clone, Default)]
pub struct Followed(Arc<Mutex<HashSet<String>>>);

impl Followed {
    /// Follows session `sid` for connection `key` through `peer`, unless it is followed.
    pub fn follow(&self, state: &AppState, key: &str, sid: &str, peer: Peer<RoleServer>) {
        {
            let mut set = match self.0.lock() {
                Ok(s) => s,
                Err(p) => p.into_inner(),
            };
            if !set.insert(key.to_string()) {
                return;
            }
        }
        let (state, key, sid, me) = (
            state.clone(),
            key.to_string(),
            sid.to_string(),
            self.clone(),
        );
        tokio::spawn(async move {
            follow(&state, &sid, &peer).await;
            let mut set = match me.0.lock() {
                Ok(s) => s,
                Err(p) => p.into_inner(),
            };
            set.remove(&key);
        });
    }
}

async fn follow(state: &AppState, sid: &str, peer: &Peer<RoleServer>) {
    let s = sid.to_string();
    let Ok(Some(mut cursor)) = state
        .store
        .read(move |r| Ok(r.get_session(&s)?.map(|x| x.last_seq)))
        .await
    else {
        return;
    };
    loop {
        let Ok(Some(page)) = wait::page_after(state, sid, cursor, 256).await else {
            return;
        };
        let (full, mut rx) = (page.full, page.watch);
        cursor = page.last;
        for ev in page.events {
            if let EventBody::Wake(w) = &ev.body {
                let params = json!({
                    "content": w.text,
                    "meta": {
                        "source": "cortex",
                        "waitpoint": w.waitpoint.id,
                        "reason": serde_json::to_value(w.reason).ok()
                            .and_then(|v| v.as_str().map(str::to_string))
                            .unwrap_or_default(),
                        "seq": ev.seq.to_string(),
                    }
                });
                let n = ServerNotification::CustomNotification(CustomNotification::new(
                    METHOD,
                    Some(params),
                ));
                if peer.send_notification(n).await.is_err() {
                    return;
                }
            }
        }
        if full {
            continue;
        }
        if *rx.borrow() == u64::MAX {
            return;
        }
        tokio::select! {
            _ = rx.changed() => {}
            _ = tokio::time::sleep(LOOK) => {
                if peer.is_transport_closed() {
                    return;
                }
            }
            _ = state.shutdown.cancelled() => return,
        }
    }
}
