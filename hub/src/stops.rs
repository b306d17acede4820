//! Stopping a turn at once: the runner's task driving a session listens here while it
//! waits on the model or a device. A cancel (`POST /api/sessions/{sid}/cancel`) or a
//! delete raises the store's stop notice of the session with its write, so the driver
//! hears it on whichever hub it runs (the store's bus carries it between hubs); this
//! hub's own reasons to stop a driver (its claim lost) ring its bell. The item is what
//! counts: a stop heard before a task listens, or while none drives the session, is taken
//! at the next step boundary.

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
            store: None,
            stops: self.clone(),
            sid: sid.to_string(),
            bell,
        }
    }

    /// Whether a task drives `sid` here now.
    pub fn driving(&self, sid: &str) -> bool {
        let bells = self.bells.lock().unwrap_or_else(|e| e.into_inner());
        bells.contains_key(sid)
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
    /// The store's stop notices of the session.
    store: Option<watch::Receiver<u64>>,
    stops: Arc<Stops>,
    sid: String,
    bell: Arc<watch::Sender<u64>>,
}

/// Resolves at `rx`'s next change; never when its sender is gone.
async fn changed(rx: &mut watch::Receiver<u64>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

impl Listener {
    /// Also hears `notices` (the store's stop notices of the session).
    pub fn hearing(mut self, notices: watch::Receiver<u64>) -> Self {
        self.store = Some(notices);
        self
    }

    /// Resolves at the next ring or stop notice (one that came since the last `rung`
    /// counts).
    pub async fn rung(&mut self) {
        match &mut self.store {
            Some(store) => tokio::select! {
                () = changed(&mut self.rx) => {}
                () = changed(store) => {}
            },
            None => changed(&mut self.rx).await,
        }
    }

    /// Whether a ring came since the last `clear` (without waiting).
    pub fn heard(&self) -> bool {
        self.rx.has_changed().unwrap_or(false)
            || self
                .store
                .as_ref()
                .is_some_and(|s| s.has_changed().unwrap_or(false))
    }

    /// Forgets rings heard so far (the boundary that follows takes their items).
    pub fn clear(&mut self) {
        self.rx.borrow_and_update();
        if let Some(s) = &mut self.store {
            s.borrow_and_update();
        }
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

    #[tokio::test]
    async fn a_stop_notice_is_heard_like_a_ring_and_cleared_with_it() {
        let stops = Arc::new(Stops::default());
        let (tx, rx) = watch::channel(0u64);
        let mut l = stops.listen("ses_a").hearing(rx);
        assert!(stops.driving("ses_a") && !stops.driving("ses_b"));
        assert!(!l.heard());
        tx.send_replace(7);
        assert!(l.heard());
        tokio::time::timeout(Duration::from_secs(5), l.rung())
            .await
            .expect("heard");
        l.clear();
        assert!(!l.heard());
        let quiet = tokio::time::timeout(Duration::from_millis(50), l.rung()).await;
        assert!(quiet.is_err(), "nothing since");
        // A sender gone is silence, not a stop.
        drop(tx);
        let quiet = tokio::time::timeout(Duration::from_millis(50), l.rung()).await;
        assert!(quiet.is_err(), "a closed notice channel never rings");
        assert!(stops.ring("ses_a"));
        tokio::time::timeout(Duration::from_secs(5), l.rung())
            .await
            .expect("the bell still rings");
    }
}
