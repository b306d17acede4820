//! The device registry's durable half and the hub's own event log.
//!
//! A device record keeps what survives a restart: the token's SHA-256 (never the token),
//! when it was added, the facts its agent last reported, and when and why it last went
//! online or offline. Whether a device is online *now* is not stored: only the mesh's
//! registry of live links knows that, so after a restart every device reads as offline
//! with its last seen. While a device is offline its record also holds when the sessions
//! waiting on it are told it is lost (`loss_at`, see `device_waits/loss.rs`). The hub
//! events (`device-added`, `-revoked`, `-online`, `-offline`) are appended in the same
//! transaction as the change they describe.

use cortex_protocol::api::{HubEvent, HubEventBody};
use cortex_protocol::mesh::{HostFacts, SpoolCounts};
use serde::{Deserialize, Serialize};

use super::kernel::error::StoreError;
use super::tables::{DEVICES, HUB_EVENTS, REVOKED_DEVICES, Tx, decode, encode};

/// How many hub events are kept; older ones are dropped as new ones arrive.
pub const HUB_EVENTS_KEPT: u64 = 100_000;

/// A stored device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRecord {
    pub name: String,
    pub token_hash: [u8; 32],
    pub created_at: u64,
    #[serde(default)]
    pub last_seen: Option<u64>,
    #[serde(default)]
    pub agent_version: Option<String>,
    #[serde(default)]
    pub host: Option<HostFacts>,
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    pub spool: SpoolCounts,
    /// The live link that last recorded it online; an older link's end must not
    /// overwrite a newer link's state.
    #[serde(default)]
    pub link: Option<u64>,
    /// When it last came online, while the record says online.
    #[serde(default)]
    pub online_since: Option<u64>,
    #[serde(default)]
    pub offline_since: Option<u64>,
    #[serde(default)]
    pub offline_reason: Option<String>,
    /// While offline: when the sessions waiting on its remote waits are told it is lost
    /// (`device_waits/loss.rs`); `None` while online.
    #[serde(default)]
    pub loss_at: Option<u64>,
    /// While online: the hub that holds the link (its name among the hubs on the store).
    #[serde(default)]
    pub hub: Option<String>,
}

/// What is kept of a revoked device: enough for the fleet view to show it (state
/// `revoked`) as it last was, never its token's hash. Adding the name again forgets it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokedDevice {
    pub name: String,
    pub revoked_at: u64,
    #[serde(default)]
    pub last_seen: Option<u64>,
    #[serde(default)]
    pub agent_version: Option<String>,
    #[serde(default)]
    pub host: Option<HostFacts>,
}

/// What [`Tx::forget_revoked_device`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forget {
    /// It was revoked, and is no longer listed.
    Removed,
    /// It is enrolled: revoke it first.
    Enrolled,
    /// No device of that name, revoked or not.
    Unknown,
}

/// How many revoked devices are remembered; the oldest revocation is forgotten first.
pub const REVOKED_KEPT: usize = 1_000;

/// What an agent's hello tells, as recorded when its link comes up.
#[derive(Debug, Clone)]
pub struct Online {
    pub link: u64,
    /// The hub the link is on.
    pub hub: String,
    pub agent_version: String,
    pub host: HostFacts,
    pub capabilities: Vec<String>,
    pub spool: SpoolCounts,
}

impl Tx<'_> {
    pub(crate) fn get_device(&self, name: &str) -> Result<Option<DeviceRecord>, StoreError> {
        match self.table(&DEVICES).get(name)? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    pub(super) fn put_device(&mut self, rec: &DeviceRecord) -> Result<(), StoreError> {
        self.table_mut(&DEVICES)
            .insert(rec.name.as_str(), encode(rec)?.as_slice())?;
        Ok(())
    }

    /// Appends a hub event; returns its seq. Keeps at most [`HUB_EVENTS_KEPT`].
    pub fn append_hub_event(&mut self, body: HubEventBody, now: u64) -> Result<u64, StoreError> {
        let seq = match self.hub_events().last()? {
            Some((k, _)) => k.value() + 1,
            None => 1,
        };
        let ev = HubEvent { seq, ts: now, body };
        let json = serde_json::to_vec(&ev).map_err(|e| StoreError::Decode(e.to_string()))?;
        self.hub_events().insert(seq, json.as_slice())?;
        if seq > HUB_EVENTS_KEPT {
            self.hub_events().remove(seq - HUB_EVENTS_KEPT)?;
        }
        self.notify(super::tables::TOPIC_HUB, "", seq);
        Ok(seq)
    }

    /// `cortex device add`: false when the name is taken.
    pub fn add_device(
        &mut self,
        name: &str,
        token_hash: [u8; 32],
        now: u64,
    ) -> Result<bool, StoreError> {
        if self.get_device(name)?.is_some() {
            return Ok(false);
        }
        self.table_mut(&REVOKED_DEVICES).remove(name)?;
        // Offline from the start: a wait asked of it before it ever connects is told
        // when it has not connected within the grace.
        let loss_at = self.first_loss_at(now)?;
        self.put_device(&DeviceRecord {
            name: name.to_string(),
            token_hash,
            created_at: now,
            last_seen: None,
            agent_version: None,
            host: None,
            capabilities: Vec::new(),
            spool: SpoolCounts::default(),
            link: None,
            online_since: None,
            offline_since: None,
            offline_reason: None,
            loss_at: Some(loss_at),
            hub: None,
        })?;
        self.append_hub_event(
            HubEventBody::DeviceAdded {
                device: name.to_string(),
            },
            now,
        )?;
        Ok(true)
    }

    /// `cortex device revoke`: forgets the device and its token hash; false if unknown.
    /// Its remote waits end as broke: nothing will report them any more.
    pub fn revoke_device(&mut self, name: &str, now: u64) -> Result<bool, StoreError> {
        let Some(rec) = self.get_device(name)? else {
            return Ok(false);
        };
        self.table_mut(&DEVICES).remove(name)?;
        self.remember_revoked(RevokedDevice {
            name: name.to_string(),
            revoked_at: now,
            last_seen: rec.last_seen,
            agent_version: rec.agent_version.clone(),
            host: rec.host.clone(),
        })?;
        // Its waits break, and nobody is told it is lost.
        self.device_loss_forgotten(&rec)?;
        self.device_waits_revoked(name, now)?;
        self.append_hub_event(
            HubEventBody::DeviceRevoked {
                device: name.to_string(),
            },
            now,
        )?;
        Ok(true)
    }

    /// `cortex device remove`: drops a revoked device from the fleet view.
    pub fn forget_revoked_device(&mut self, name: &str) -> Result<Forget, StoreError> {
        if self.get_device(name)?.is_some() {
            return Ok(Forget::Enrolled);
        }
        let removed = self.table_mut(&REVOKED_DEVICES).remove(name)?.is_some();
        Ok(if removed {
            Forget::Removed
        } else {
            Forget::Unknown
        })
    }

    /// Keeps `gone` for the fleet view, forgetting the oldest revocation past
    /// [`REVOKED_KEPT`].
    fn remember_revoked(&mut self, gone: RevokedDevice) -> Result<(), StoreError> {
        let mut all = self.revoked_devices()?;
        if all.len() >= REVOKED_KEPT {
            all.sort_by_key(|d| d.revoked_at);
            let mut t = self.table_mut(&REVOKED_DEVICES);
            for old in &all[..=all.len() - REVOKED_KEPT] {
                t.remove(old.name.as_str())?;
            }
        }
        self.table_mut(&REVOKED_DEVICES)
            .insert(gone.name.as_str(), encode(&gone)?.as_slice())?;
        Ok(())
    }

    /// A link came up. `replaced`: the reason the device's previous link was ended, which
    /// is recorded here (before the new online) so a follower reads them in order.
    /// False when the device is gone (revoked meanwhile).
    pub fn device_online(
        &mut self,
        name: &str,
        up: &Online,
        replaced: Option<&str>,
        now: u64,
    ) -> Result<bool, StoreError> {
        let Some(mut rec) = self.get_device(name)? else {
            return Ok(false);
        };
        // Only if the record still says online: an old link that already recorded its own
        // end must not be reported offline twice.
        if let Some(reason) = replaced.filter(|_| rec.link.is_some()) {
            self.append_hub_event(
                HubEventBody::DeviceOffline {
                    device: name.to_string(),
                    reason: reason.to_string(),
                },
                now,
            )?;
        }
        rec.link = Some(up.link);
        rec.hub = Some(up.hub.clone());
        rec.last_seen = Some(now);
        rec.agent_version = Some(up.agent_version.clone());
        rec.host = Some(up.host.clone());
        rec.capabilities = up.capabilities.clone();
        rec.spool = up.spool;
        rec.online_since = Some(now);
        rec.offline_since = None;
        rec.offline_reason = None;
        self.device_back(&mut rec)?;
        self.put_device(&rec)?;
        // The hub holding the link is alive now: without its beat, another hub would take
        // the device for linked to a hub that stopped answering.
        self.hub_beat(&up.hub, now)?;
        self.append_hub_event(
            HubEventBody::DeviceOnline {
                device: name.to_string(),
                agent_version: up.agent_version.clone(),
            },
            now,
        )?;
        Ok(true)
    }

    /// A link ended. The record changes only if this link is still the one it names (a
    /// newer link's online state is never overwritten), and then the event is appended;
    /// for a link a newer one superseded, nothing is (the newer one recorded that end).
    /// A revoked device has no record left: only the event.
    pub fn device_offline(
        &mut self,
        name: &str,
        link: u64,
        reason: &str,
        last_seen: u64,
        spool: SpoolCounts,
        now: u64,
    ) -> Result<(), StoreError> {
        if let Some(mut rec) = self.get_device(name)? {
            if rec.link.is_some_and(|l| l != link) {
                return Ok(());
            }
            rec.link = None;
            rec.hub = None;
            rec.last_seen = Some(last_seen.max(rec.last_seen.unwrap_or(0)));
            rec.spool = spool;
            rec.online_since = None;
            rec.offline_since = Some(now);
            rec.offline_reason = Some(reason.to_string());
            self.device_lost(&mut rec)?;
            self.put_device(&rec)?;
        }
        self.append_hub_event(
            HubEventBody::DeviceOffline {
                device: name.to_string(),
                reason: reason.to_string(),
            },
            now,
        )?;
        Ok(())
    }

    /// Saves live links' last seen and spool counts (the sweep tick), so a hub that is
    /// killed still shows a recent last seen after its restart.
    pub fn touch_devices(
        &mut self,
        live: &[(String, u64, u64, SpoolCounts)],
    ) -> Result<(), StoreError> {
        for (name, link, last_seen, spool) in live {
            if let Some(mut rec) = self.get_device(name)?
                && rec.link == Some(*link)
            {
                rec.last_seen = Some(*last_seen);
                rec.spool = *spool;
                self.put_device(&rec)?;
            }
        }
        Ok(())
    }

    /// Of the links `held` here (device, link id), the devices whose record no longer
    /// names that link: another hub recorded them offline while this one was silent, or
    /// a newer link elsewhere replaced it. A device gone from the store is left to the
    /// revocation that removed it.
    pub fn links_disowned(&self, held: &[(String, u64)]) -> Result<Vec<(String, u64)>, StoreError> {
        let mut out = Vec::new();
        for (name, link) in held {
            if let Some(rec) = self.get_device(name)?
                && rec.link != Some(*link)
            {
                out.push((name.clone(), *link));
            }
        }
        Ok(out)
    }

    /// At start: every record still saying online on this hub (`me`; or on no hub named,
    /// as an older hub wrote it) belongs to a link of a previous run that ended without a
    /// word (the hub was killed). Each is recorded offline since its last seen, with a
    /// device-offline event. Returns how many.
    pub fn devices_restarted(&mut self, now: u64, me: &str) -> Result<usize, StoreError> {
        self.devices_gone_with(now, "the hub restarted", false, |h| {
            h.is_none_or(|h| h == me)
        })
    }

    /// Every record saying online on a hub that `silent` says stopped answering is
    /// recorded offline (its agent links to another hub in time), the devices' remote
    /// waits then judged as for any lost device. Returns how many.
    pub fn devices_of_silent_hubs(
        &mut self,
        now: u64,
        silent: impl Fn(&str) -> bool,
    ) -> Result<usize, StoreError> {
        self.devices_gone_with(now, "its hub stopped answering", true, |h| {
            h.is_some_and(&silent)
        })
    }

    fn devices_gone_with(
        &mut self,
        now: u64,
        reason: &str,
        lost: bool,
        held_by: impl Fn(Option<&str>) -> bool,
    ) -> Result<usize, StoreError> {
        let stale: Vec<DeviceRecord> = {
            let mut v = Vec::new();
            for r in self.table(&DEVICES).iter()? {
                let rec: DeviceRecord = decode(r?.1.value())?;
                if rec.link.is_some() && held_by(rec.hub.as_deref()) {
                    v.push(rec);
                }
            }
            v
        };
        let n = stale.len();
        for mut rec in stale {
            rec.link = None;
            rec.hub = None;
            rec.online_since = None;
            rec.offline_since = Some(rec.last_seen.unwrap_or(now));
            rec.offline_reason = Some(reason.to_string());
            if lost {
                self.device_lost(&mut rec)?;
            }
            self.put_device(&rec)?;
            self.append_hub_event(
                HubEventBody::DeviceOffline {
                    device: rec.name.clone(),
                    reason: reason.to_string(),
                },
                now,
            )?;
        }
        Ok(n)
    }
}

impl Tx<'_> {
    /// Every device, by name.
    pub fn devices(&self) -> Result<Vec<DeviceRecord>, StoreError> {
        let t = self.table(&DEVICES);
        let mut out = Vec::new();
        for r in t.iter()? {
            out.push(decode(r?.1.value())?);
        }
        Ok(out)
    }

    /// The revoked devices still remembered, by name.
    pub fn revoked_devices(&self) -> Result<Vec<RevokedDevice>, StoreError> {
        let t = self.table(&REVOKED_DEVICES);
        let mut out = Vec::new();
        for r in t.iter()? {
            out.push(decode(r?.1.value())?);
        }
        Ok(out)
    }

    /// The revoked device `name`, while it is remembered.
    pub fn revoked_device(&self, name: &str) -> Result<Option<RevokedDevice>, StoreError> {
        match self.table(&REVOKED_DEVICES).get(name)? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    pub fn device(&self, name: &str) -> Result<Option<DeviceRecord>, StoreError> {
        let t = self.table(&DEVICES);
        match t.get(name)? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    /// Raw JSON of the hub events after `after`, at most `limit`.
    pub fn hub_events_after(&self, after: u64, limit: usize) -> Result<Vec<Vec<u8>>, StoreError> {
        let t = self.table(&HUB_EVENTS);
        let mut out = Vec::new();
        for r in t.range(after.saturating_add(1)..)? {
            out.push(r?.1.value().to_vec());
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// The newest hub event's seq (0 when there is none).
    pub fn last_hub_seq(&self) -> Result<u64, StoreError> {
        let t = self.table(&HUB_EVENTS);
        Ok(t.last()?.map_or(0, |(k, _)| k.value()))
    }
}
