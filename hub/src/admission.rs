//! Which connections a listener admits, shared by the API listener (`server::http`) and
//! the mesh's (`mesh::serve`): the descriptor budget both caps come from, the set of open
//! connections with a cap that evicts the oldest idle one for a new one ([`Conns`]), and
//! the throttle that keeps a flood of refusals to one log line ([`Throttle`]).
//!
//! What "idle" means is the listener's: an API connection with no request in flight, a
//! mesh connection that has not finished its hello. A busy connection is never evicted;
//! with every one busy, a new connection is refused.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Descriptors kept back from the connection caps for the store, the journal, the spool
/// and the runtime.
pub const RESERVED_FDS: u64 = 256;
/// The most mesh connections that may be mid-handshake (TLS, upgrade, hello) at once:
/// enough for every device of a large fleet reconnecting after a hub restart, each
/// handshake taking milliseconds.
pub const MAX_MESH_HANDSHAKES: usize = 1_024;

/// The soft `RLIMIT_NOFILE` (which `main` raises to the hard limit at start).
pub fn nofile() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(1 << 20)
}

/// The most API connections open at once under a descriptor limit of `nofile`: half of
/// what is left after [`RESERVED_FDS`] (the mesh holds the other half: a device's link
/// lives as long as the device, so a fleet needs as many as a busy API).
pub fn api_cap(nofile: u64) -> usize {
    let cap = nofile.saturating_sub(RESERVED_FDS) / 2;
    usize::try_from(cap.max(16)).unwrap_or(usize::MAX)
}

/// The mesh's caps under a descriptor limit of `nofile`: (every connection, those that
/// have not finished their hello). The mesh gets the half the API leaves; of it, a
/// quarter (at most [`MAX_MESH_HANDSHAKES`]) may be mid-handshake, so idle sockets never
/// crowd out the devices' links.
pub fn mesh_caps(nofile: u64) -> (usize, usize) {
    let total =
        usize::try_from((nofile.saturating_sub(RESERVED_FDS) / 2).max(16)).unwrap_or(usize::MAX);
    let handshakes = (total / 4).clamp(4, MAX_MESH_HANDSHAKES);
    (total, handshakes)
}

/// One admitted connection: its place in [`Conns`], its count of work in flight (while
/// above zero it is busy) and the signal that evicts it. Dropping it frees the place.
pub struct Admitted {
    id: u64,
    pub busy: Arc<AtomicUsize>,
    pub evict: Arc<Notify>,
    conns: Arc<Conns>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.conns.lock().remove(&self.id);
    }
}

struct Entry {
    busy: Arc<AtomicUsize>,
    evict: Arc<Notify>,
}

/// The open connections of one listener (or one stage of it), oldest first.
pub struct Conns {
    open: Mutex<BTreeMap<u64, Entry>>,
    next: AtomicU64,
    /// How many were evicted since start.
    pub evicted: AtomicU64,
    evict_log: Mutex<Throttle>,
    /// The warning logged (at most every ten seconds) when the cap evicts.
    evicting: &'static str,
}

impl Conns {
    /// An empty set; `evicting` is its warning when the cap evicts (a fixed text: a
    /// flood's count goes in its `evicted` field).
    pub fn new(evicting: &'static str) -> Arc<Conns> {
        Arc::new(Conns {
            open: Mutex::default(),
            next: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            evict_log: Mutex::default(),
            evicting,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Entry>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a new connection; at the cap, the oldest idle connection is evicted
    /// for it, and with none idle the new one is refused (`None`).
    pub fn admit(self: &Arc<Self>, cap: usize) -> Option<Admitted> {
        let mut open = self.lock();
        if open.len() >= cap {
            let oldest = open
                .iter()
                .find(|(_, e)| e.busy.load(Ordering::Acquire) == 0)
                .map(|(id, _)| *id)?;
            if let Some(e) = open.remove(&oldest) {
                // A stored permit: the connection ends even if it is not waiting yet.
                e.evict.notify_one();
            }
            self.evicted.fetch_add(1, Ordering::Relaxed);
            let mut log = self
                .evict_log
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if log.due() {
                tracing::warn!(cap, evicted = log.take(), "{}", self.evicting);
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let busy = Arc::new(AtomicUsize::new(0));
        let evict = Arc::new(Notify::new());
        open.insert(
            id,
            Entry {
                busy: busy.clone(),
                evict: evict.clone(),
            },
        );
        Some(Admitted {
            id,
            busy,
            evict,
            conns: self.clone(),
        })
    }
}

/// Counts events and says when one log line about them is due (at most one every ten
/// seconds), so a flood is one line, not one per event.
#[derive(Default)]
pub struct Throttle {
    last: Option<Instant>,
    count: u64,
}

impl Throttle {
    const EVERY: Duration = Duration::from_secs(10);

    /// Counts one event; true when a line is due.
    pub fn due(&mut self) -> bool {
        self.count += 1;
        let now = Instant::now();
        if self
            .last
            .is_none_or(|l| now.duration_since(l) >= Self::EVERY)
        {
            self.last = Some(now);
            true
        } else {
            false
        }
    }

    /// The count since the last line, reset.
    pub fn take(&mut self) -> u64 {
        std::mem::take(&mut self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_cap_the_oldest_idle_connection_goes_and_a_busy_one_stays() {
        let conns = Conns::new("cap reached");
        let a = conns.admit(2).expect("first");
        let b = conns.admit(2).expect("second");
        a.busy.fetch_add(1, Ordering::AcqRel);
        // Full: `a` is busy, so `b` (the oldest idle) is evicted for `c`.
        let c = conns.admit(2).expect("third");
        assert!(conns.lock().contains_key(&a.id));
        assert!(!conns.lock().contains_key(&b.id));
        assert!(conns.lock().contains_key(&c.id));
        assert_eq!(conns.evicted.load(Ordering::Relaxed), 1);
        // Full with every connection busy: the new one is refused.
        c.busy.fetch_add(1, Ordering::AcqRel);
        assert!(conns.admit(2).is_none());
        drop(a);
        assert!(conns.admit(2).is_some());
    }

    #[test]
    fn an_evicted_connection_is_told_even_before_it_waits() {
        let conns = Conns::new("cap reached");
        let a = conns.admit(1).expect("first");
        let _b = conns.admit(1).expect("second");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        // The permit was stored: this returns at once.
        rt.block_on(a.evict.notified());
    }

    #[test]
    fn the_caps_leave_descriptors_for_the_store_and_share_the_rest() {
        for nofile in [64, 1_024, 65_536, 1 << 20] {
            let (mesh, handshakes) = mesh_caps(nofile);
            let api = api_cap(nofile);
            assert!(handshakes <= mesh && handshakes <= MAX_MESH_HANDSHAKES);
            if nofile >= 1_024 {
                assert!(
                    api as u64 + mesh as u64 + RESERVED_FDS <= nofile,
                    "{nofile}"
                );
            }
        }
        assert_eq!(api_cap(1_024), 384);
        assert_eq!(mesh_caps(1_024), (384, 96));
        // The mesh bench's 5,000 devices fit under its 20,000 descriptors.
        assert_eq!(mesh_caps(20_000).0, 9_872);
        assert_eq!(mesh_caps(1 << 20).1, MAX_MESH_HANDSHAKES);
    }
}
