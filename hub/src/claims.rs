//! This hub's side of the claims on sessions (`store::claims`): its name among the hubs
//! on a store, the lease it takes, the sessions it holds now and under which epoch, and
//! the renewal (`server/cluster.rs`). A claim found lost (another hub took it once its
//! lease ran out: this hub was stopped, cut off or too slow) is forgotten here and its
//! driver is stopped: its next write is refused anyway.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use anyhow::Context;

/// The shortest lease allowed: renewals go out three times per lease.
pub const MIN_LEASE_MS: u64 = 1_000;

/// The sessions this hub holds.
pub struct Claims {
    /// This hub's name among the hubs on the store (`$CORTEX_HOME/hub/hub-name`).
    pub hub: String,
    pub lease_ms: u64,
    held: Mutex<HashMap<String, u64>>,
}

impl Claims {
    pub fn new(hub: String, lease_ms: u64) -> Claims {
        Claims {
            hub,
            lease_ms: lease_ms.max(MIN_LEASE_MS),
            held: Mutex::default(),
        }
    }

    fn held_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `sid` is held under `epoch`.
    pub fn hold(&self, sid: &str, epoch: u64) {
        let mut m = self.held_map();
        m.insert(sid.to_string(), epoch);
        crate::metrics::metrics().claims_held(m.len());
    }

    /// The epoch `sid` is held under, while it is.
    pub fn epoch(&self, sid: &str) -> Option<u64> {
        self.held_map().get(sid).copied()
    }

    /// `sid` is no longer held under `epoch` (a newer hold of it stays).
    pub fn forget(&self, sid: &str, epoch: u64) {
        let mut m = self.held_map();
        if m.get(sid) == Some(&epoch) {
            m.remove(sid);
        }
        crate::metrics::metrics().claims_held(m.len());
    }

    /// Every session held, with its epoch.
    pub fn held(&self) -> Vec<(String, u64)> {
        self.held_map()
            .iter()
            .map(|(s, e)| (s.clone(), *e))
            .collect()
    }
}

/// This hub's name: read from `hub/hub-name` under the home, made (the host's name and a
/// random suffix) the first time. Kept across restarts, so a hub that starts again takes
/// back the claims its last run left at once; the home's lock says that run is gone.
pub fn hub_name(home: &Path) -> anyhow::Result<String> {
    let path = home.join("hub").join("hub-name");
    match std::fs::read_to_string(&path) {
        Ok(s) if !s.trim().is_empty() => return Ok(s.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "hub".into());
    let suffix = getrandom::u32().context("no randomness for the hub's name")? & 0xff_ffff;
    let name = format!("{host}-{suffix:06x}");
    std::fs::write(&path, format!("{name}\n"))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hubs_name_is_made_once_and_kept() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir_all(dir.path().join("hub")).expect("hub dir");
        let a = hub_name(dir.path()).expect("made");
        assert!(a.len() > 7, "{a}");
        assert_eq!(hub_name(dir.path()).expect("read"), a);
    }

    #[test]
    fn a_hold_is_forgotten_only_under_its_own_epoch() {
        let c = Claims::new("h".into(), 10);
        assert_eq!(
            c.lease_ms, MIN_LEASE_MS,
            "a lease is never shorter than the floor"
        );
        c.hold("s", 1);
        c.hold("s", 2);
        c.forget("s", 1);
        assert_eq!(c.epoch("s"), Some(2));
        c.forget("s", 2);
        assert_eq!(c.epoch("s"), None);
    }
}
