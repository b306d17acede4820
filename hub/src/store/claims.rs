//! Claims on sessions: which hub drives a session now. A hub's runner claims a session
//! before its first write for it and holds the claim while it drives it: a lease (until a
//! time of the store's clock, renewed while the hub lives) and an epoch, raised by every
//! new claim. Each of the runner's writes for the session checks the claim ([`Tx::fence`]),
//! in the same write: a hub that was frozen past its lease while another hub took the
//! session writes nothing more for it. Writes are made one batch at a time across the
//! hubs on a store, so a check and the write after it see the same claim.
//!
//! A claim is released when the session is handed back idle or parked; one left by a hub
//! that died ends with its lease, and the hub's own next start takes it at once (the home
//! lock says the old process is gone).

use serde::{Deserialize, Serialize};

use super::kernel::error::StoreError;
use std::collections::HashMap;

use super::tables::{HUB_BEATS, SESSION_CLAIMS, Tx, decode, encode};

/// A session's claim: the hub holding it, the claim's epoch and the end of its lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub hub: String,
    pub epoch: u64,
    pub until: u64,
}

/// What a claim attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// This hub holds the session under this epoch.
    Held(u64),
    /// Another hub holds it until then.
    Elsewhere { hub: String, until: u64 },
}

/// A hub's name as the key of its session lock on a shared store (FNV-1a): two names
/// with one key make a dead hub look alive, so its sessions wait for its lease.
pub fn hub_key(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

impl Tx<'_> {
    /// The hubs other than `me` that hold a claim whose lease has not ended at `now`.
    pub fn hubs_claiming(&self, me: &str, now: u64) -> Result<Vec<String>, StoreError> {
        let mut out: Vec<String> = Vec::new();
        for r in self.table(&SESSION_CLAIMS).iter()? {
            let c: Claim = decode(r?.1.value())?;
            if c.hub != me && c.until > now && !out.contains(&c.hub) {
                out.push(c.hub);
            }
        }
        Ok(out)
    }

    /// `hub` is gone (its process and its session lock with it): its claims end now, and
    /// each session it drove is queued again, so a hub takes it at once instead of at the
    /// end of the lease. Returns the sessions.
    pub fn end_claims_of(&mut self, hub: &str, now: u64) -> Result<Vec<String>, StoreError> {
        let mut ended = Vec::new();
        for r in self.table(&SESSION_CLAIMS).iter()? {
            let (k, v) = r?;
            let c: Claim = decode(v.value())?;
            if c.hub == hub && c.until > now {
                ended.push((k.value().to_string(), c));
            }
        }
        for (sid, mut c) in ended.iter().cloned() {
            c.until = now;
            self.table_mut(&SESSION_CLAIMS)
                .insert(sid.as_str(), encode(&c)?.as_slice())?;
            if let Some(mut rec) = self.agent(&sid)?
                && rec.status != super::agent::RunStatus::Idle
            {
                self.make_ready(&sid, &mut rec)?;
                self.put_agent(&sid, &rec)?;
            }
        }
        Ok(ended.into_iter().map(|(sid, _)| sid).collect())
    }

    /// The claim on `sid`, if one was made and not released.
    pub fn claim(&self, sid: &str) -> Result<Option<Claim>, StoreError> {
        match self.table(&SESSION_CLAIMS).get(sid)? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    /// Claims `sid` for `hub` until `now + lease`, under a new epoch: when nobody holds
    /// it, its lease ran out, or `hub` itself held it (a claim of this hub's last run).
    pub fn claim_session(
        &mut self,
        sid: &str,
        hub: &str,
        now: u64,
        lease: u64,
    ) -> Result<Claimed, StoreError> {
        let old = self.claim(sid)?;
        if let Some(c) = &old
            && c.hub != hub
            && c.until > now
        {
            return Ok(Claimed::Elsewhere {
                hub: c.hub.clone(),
                until: c.until,
            });
        }
        let epoch = old.map_or(0, |c| c.epoch) + 1;
        let claim = Claim {
            hub: hub.to_string(),
            epoch,
            until: now.saturating_add(lease),
        };
        self.table_mut(&SESSION_CLAIMS)
            .insert(sid, encode(&claim)?.as_slice())?;
        Ok(Claimed::Held(epoch))
    }

    /// Refuses unless `hub` holds `sid` under `epoch`. A lease that ran out while no other
    /// hub took the session still holds: nobody else wrote for it meanwhile (writes are
    /// made one batch at a time), so this hub's next write follows its own last one.
    pub fn fence(&self, sid: &str, hub: &str, epoch: u64) -> Result<(), StoreError> {
        match self.claim(sid)? {
            Some(c) if c.hub == hub && c.epoch == epoch => Ok(()),
            Some(c) => Err(StoreError::Fenced(format!(
                "session {sid} is claimed by hub {} (epoch {}) since this hub's claim (epoch {epoch}) ran out; this hub writes nothing more for it",
                c.hub, c.epoch
            ))),
            None => Err(StoreError::Fenced(format!(
                "this hub's claim on session {sid} (epoch {epoch}) was released; it writes nothing more for it"
            ))),
        }
    }

    /// Extends each of `held` (session, epoch) that `hub` still holds (its lease may have
    /// run out while nobody took it: a slow batch, a pause); the sessions it no longer
    /// holds.
    pub fn renew_claims(
        &mut self,
        hub: &str,
        held: &[(String, u64)],
        now: u64,
        lease: u64,
    ) -> Result<Vec<String>, StoreError> {
        let mut lost = Vec::new();
        for (sid, epoch) in held {
            match self.claim(sid)? {
                Some(mut c) if c.hub == hub && c.epoch == *epoch => {
                    c.until = now.saturating_add(lease);
                    self.table_mut(&SESSION_CLAIMS)
                        .insert(sid.as_str(), encode(&c)?.as_slice())?;
                }
                _ => lost.push(sid.clone()),
            }
        }
        Ok(lost)
    }

    /// Releases `hub`'s claim on `sid` under `epoch` (a claim since taken is left alone).
    pub fn release_claim(&mut self, sid: &str, hub: &str, epoch: u64) -> Result<(), StoreError> {
        if self
            .claim(sid)?
            .is_some_and(|c| c.hub == hub && c.epoch == epoch)
        {
            self.table_mut(&SESSION_CLAIMS).remove(sid)?;
        }
        Ok(())
    }

    /// `hub` is alive at `now` (each hub says so three times per lease).
    pub fn hub_beat(&mut self, hub: &str, now: u64) -> Result<(), StoreError> {
        self.table_mut(&HUB_BEATS).insert(hub, now)?;
        Ok(())
    }

    /// When each hub last said it is alive.
    pub fn hub_beats(&self) -> Result<HashMap<String, u64>, StoreError> {
        let mut out = HashMap::new();
        for r in self.table(&HUB_BEATS).iter()? {
            let (k, v) = r?;
            out.insert(k.value().to_string(), v.value());
        }
        Ok(out)
    }

    /// The devices linked to hubs other than `me` silent for `silent_after` at `now` (or
    /// never heard) are recorded offline; returns how many.
    pub fn devices_of_hubs_gone(
        &mut self,
        me: &str,
        now: u64,
        silent_after: u64,
    ) -> Result<usize, StoreError> {
        let beats = self.hub_beats()?;
        self.devices_of_silent_hubs(now, |h| {
            h != me
                && beats
                    .get(h)
                    .is_none_or(|b| b.saturating_add(silent_after) < now)
        })
    }

    /// Forgets the claim on a deleted session.
    pub(crate) fn forget_claim(&mut self, sid: &str) -> Result<(), StoreError> {
        self.table_mut(&SESSION_CLAIMS).remove(sid)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_claim_is_one_hubs_until_its_lease_ends_and_fences_every_other_epoch() {
        let dir = tempfile::tempdir().expect("dir");
        let (store, _guard) = crate::store::tests::open(dir.path());
        let r = store
            .exec(|t| {
                let mut got = Vec::new();
                got.push(t.claim_session("s", "a", 1000, 100)?);
                // Another hub is told who holds it and until when.
                got.push(t.claim_session("s", "b", 1050, 100)?);
                t.fence("s", "a", 1)?;
                // Run out, but nobody took it: still a's, and renewed.
                let late = t.renew_claims("a", &[("s".into(), 1)], 1100, 0)?;
                t.fence("s", "a", 1)?;
                // The lease ran out: another hub takes it under a new epoch ...
                got.push(t.claim_session("s", "b", 1100, 100)?);
                // ... and the old holder is fenced, and cannot renew.
                let fenced = t.fence("s", "a", 1).is_err();
                let lost = t.renew_claims("a", &[("s".into(), 1)], 1101, 100)?;
                let kept = t.renew_claims("b", &[("s".into(), 2)], 1150, 100)?;
                t.fence("s", "b", 2)?;
                // The same hub claiming again (its own restart) takes it at once.
                got.push(t.claim_session("s", "b", 1160, 100)?);
                // A release under an old epoch leaves the claim alone.
                t.release_claim("s", "b", 2)?;
                let still = t.claim("s")?.map(|c| c.epoch);
                t.release_claim("s", "b", 3)?;
                let gone = t.claim("s")?;
                Ok((got, late, fenced, lost, kept, still, gone))
            })
            .await
            .expect("claims");
        let (got, late, fenced, lost, kept, still, gone) = r;
        assert_eq!(
            got,
            vec![
                Claimed::Held(1),
                Claimed::Elsewhere {
                    hub: "a".into(),
                    until: 1100
                },
                Claimed::Held(2),
                Claimed::Held(3),
            ]
        );
        assert!(
            late.is_empty(),
            "a lease run out that nobody took is renewed"
        );
        assert!(fenced, "a claim taken since fences the old epoch");
        assert_eq!(lost, vec!["s".to_string()]);
        assert!(kept.is_empty());
        assert_eq!(still, Some(3));
        assert_eq!(gone, None);
    }
}
