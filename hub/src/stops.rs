//! Stopping a turn at once: the runner's task driving a session listens here while it
//! waits on the model or a device, and a cancel (`POST /api/sessions/{sid}/cancel`) rings
//! after its inbox item is durable. The item is what counts: a stop that rings before a
//! task listens, or while none drives the session, is taken at the next step boundary.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// The sessions being driven, each with its stop bell.
#[derive(Default)]
pub struct Stops {
    bells: Mutex<HashMap<String, Arc<watch::Sender<u64>>>>,
}

impl Stops {
    /// Listens for stops of `sid` until the listener is dropped.
    pub fn listen(self: &Arc<Self>, sid: &str) -> Listener {
        let mut bells = self.bells.lock().unwrap_or_else(|e| e.into_inner());
        let bell = bells
            .entry(sid.to_string())
            .or_insert_with(|| Arc::new(watch::channel(0).0))
            .clone();
        Listener {
            rx: bell.subscribe(),
            stops: self.clone(),
            sid: sid.to_string(),
            bell,
        }
    }

    /// Rings `sid`'s bell; `false` when no task drives it now.
    pub fn ring(&self, sid: &str) -> bool {
        let bells = self.bells.lock().unwrap_or_else(|e| e.into_inner());
        match bells.get(sid) {
            Some(b) => {
                b.send_modify(|n| *n += 1);
                true
            }
            None => false,
        }
    }
}

/// One driver's ear.
pub struct Listener {
    rx: watch::Receiver<u64>,
    stops: Arc<Stops>,
    sid: String,
    bell: Arc<watch::Sender<u64>>,
}

impl Listener {
    /// Resolves at the next ring (one that came since the last `rung` counts).
    pub async fn rung(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Whether a ring came since the last `clear` (without waiting).
    pub fn heard(&self) -> bool {
        self.rx.has_changed().unwrap_or(false)
    }

    /// Forgets rings heard so far (the boundary that follows takes their items).
    pub fn clear(&mut self) {
        self.rx.borrow_and_update();
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let mut bells = self.stops.bells.lock().unwrap_or_else(|e| e.into_inner());
        if bells
            .get(&self.sid)
            .is_some_and(|b| Arc::ptr_eq(b, &self.bell))
        {
            bells.remove(&self.sid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_ring_reaches_the_listener_and_a_dropped_one_is_forgotten() {
        let stops = Arc::new(Stops::default());
        assert!(!stops.ring("ses_a"), "nobody listens yet");
        let mut l = stops.listen("ses_a");
        assert!(stops.ring("ses_a"));
        tokio::time::timeout(Duration::from_secs(5), l.rung())
            .await
            .expect("heard");
        l.clear();
        let quiet = tokio::time::timeout(Duration::from_millis(50), l.rung()).await;
        assert!(quiet.is_err(), "no ring since");
        drop(l);
        assert!(!stops.ring("ses_a"));
    }
}
