//! Topic-keyed notices: what a batch announces once it is durable (a session's newest
//! event, a device's waits changed, the timer queue's earliest time), and the watches
//! readers hold on them.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

/// What a notice is about: a kind (`"session"`, `"device"`, `"timers"`, …) and a key
/// within it (a session id, a device name, or empty).
pub type Topic = (&'static str, String);

/// The notices one batch raised: the newest value per topic. Published only once the
/// batch is durable.
pub type Notices = HashMap<Topic, u64>;

/// The published side of notices: one watch per topic, created by the first subscriber.
#[derive(Default)]
pub struct Notifier {
    topics: Mutex<HashMap<Topic, watch::Sender<u64>>>,
}

impl Notifier {
    /// Changes whenever a durable batch raised `topic`; starts at `current` for a topic
    /// nobody watched yet.
    pub fn watch(&self, kind: &'static str, key: &str, current: u64) -> watch::Receiver<u64> {
        let mut map = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        map.entry((kind, key.to_string()))
            .or_insert_with(|| watch::channel(current).0)
            .subscribe()
    }

    pub(crate) fn publish(&self, notices: Notices) {
        if notices.is_empty() {
            return;
        }
        let mut map = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        for (topic, v) in notices {
            if let Some(tx) = map.get(&topic) {
                tx.send_replace(v);
            }
        }
        if map.len() > 1024 {
            map.retain(|_, tx| tx.receiver_count() > 0);
        }
    }

    /// Wakes every watcher, its value unchanged: each reads the store again (notices may
    /// have been missed).
    pub fn wake_all(&self) {
        let map = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        for tx in map.values() {
            tx.send_modify(|_| {});
        }
    }

    /// How many watches readers hold now on the topics of `kind`.
    pub fn watchers(&self, kind: &str) -> usize {
        let map = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        map.iter()
            .filter(|((k, _), _)| *k == kind)
            .map(|(_, tx)| tx.receiver_count())
            .sum()
    }

    /// The value a topic holds now, if anyone created it.
    pub fn current(&self, kind: &'static str, key: &str) -> Option<u64> {
        let map = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&(kind, key.to_string())).map(|t| *t.borrow())
    }
}
