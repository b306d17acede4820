//! What streams to a session's followers but is never stored: the model's text as it
//! arrives. The runner sends; an SSE follower of the session receives. With nobody
//! following, a send costs a map lookup and nothing is built.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

/// Pieces a slow follower may lag behind by before it misses some (it then gets the
/// stored whole text of the step).
const BACKLOG: usize = 1024;

/// The live channels, one per followed session.
#[derive(Default)]
pub struct Live {
    sessions: Mutex<HashMap<String, broadcast::Sender<Arc<str>>>>,
}

impl Live {
    /// Starts following `sid`'s live pieces (JSON of an event each).
    pub fn subscribe(&self, sid: &str) -> broadcast::Receiver<Arc<str>> {
        let mut map = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(sid.to_string())
            .or_insert_with(|| broadcast::channel(BACKLOG).0)
            .subscribe()
    }

    /// Whether anyone follows `sid` now.
    pub fn followed(&self, sid: &str) -> bool {
        let map = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        map.get(sid).is_some_and(|tx| tx.receiver_count() > 0)
    }

    /// Sends what `make` builds to `sid`'s followers, if there are any.
    pub fn send(&self, sid: &str, make: impl FnOnce() -> String) {
        let mut map = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = map.get(sid) else {
            return;
        };
        if tx.receiver_count() == 0 {
            map.remove(sid);
            return;
        }
        let _ = tx.send(Arc::from(make()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_followed_sessions_get_pieces() {
        let live = Live::default();
        let mut built = 0;
        live.send("ses_a", || {
            built += 1;
            "x".into()
        });
        assert_eq!(built, 0, "nobody follows: nothing is built");
        let mut rx = live.subscribe("ses_a");
        assert!(live.followed("ses_a"));
        live.send("ses_a", || "one".into());
        assert_eq!(rx.try_recv().expect("a piece").as_ref(), "one");
        drop(rx);
        live.send("ses_a", || "two".into());
        assert!(
            !live.followed("ses_a"),
            "the last follower left: the channel goes"
        );
    }
}
