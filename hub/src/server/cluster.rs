//! What a hub does for the others on a shared store, and for itself among them: three
//! times per lease it renews its claims on sessions (a claim found lost has its driver
//! stopped), and on PostgreSQL says it is alive, records offline the devices of a hub
//! silent for two leases (their agents link to another hub); every second it ends the
//! claims of a hub whose session lock went with its process, seen at two checks in a row
//! (its sessions are queued again at once, not at the end of its lease); it follows the devices
//! another hub adds or revokes (a revocation anywhere ends the link here at once); and it
//! starts the `device_exec` asks other hubs leave for the devices linked here.

use std::collections::HashMap;
use std::time::Duration;

use crate::state::AppState;
use crate::store::tables::TOPIC_HUB;
use crate::time::now_ms;

/// Renewals, beats and the sweep of gone hubs' devices, until the hub stops.
pub(super) async fn keep(state: AppState) {
    let lease = state.claims.lease_ms;
    let every = Duration::from_millis(lease / 3);
    let shared = state.store.is_shared();
    // The first beat goes at once: a device linked here before it would read to the
    // others as linked to a hub never heard of.
    let mut wait = Duration::ZERO;
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = state.shutdown.cancelled() => return,
        }
        wait = every;
        let held = state.claims.held();
        if held.is_empty() && !shared {
            continue;
        }
        let (hub, asked) = (state.claims.hub.clone(), held.clone());
        // Links up for a lease at least: their own online was recorded long since.
        let settled = now_ms().saturating_sub(lease);
        let links: Vec<(String, u64)> = if shared {
            state
                .devices
                .links()
                .iter()
                .filter(|l| l.online_since <= settled)
                .map(|l| (l.device.clone(), l.id))
                .collect()
        } else {
            Vec::new()
        };
        let r = state
            .store
            .exec(move |t| {
                let now = now_ms();
                let lost = t.renew_claims(&hub, &asked, now, lease)?;
                let (gone, disowned) = if shared {
                    t.hub_beat(&hub, now)?;
                    (
                        t.devices_of_hubs_gone(&hub, now, 2 * lease)?,
                        t.links_disowned(&links)?,
                    )
                } else {
                    (0, Vec::new())
                };
                Ok((lost, gone, disowned))
            })
            .await;
        match r {
            Ok((lost, gone, disowned)) => {
                for (device, id) in disowned {
                    if let Some(l) = state.devices.link(&device).filter(|l| l.id == id) {
                        tracing::warn!(%device, "another hub recorded this device offline while this hub was silent; its link is made again");
                        l.end(crate::registry::End::Disowned);
                    }
                }
                if gone > 0 {
                    tracing::warn!(
                        devices = gone,
                        "devices linked to a hub that stopped answering are recorded offline; their agents link to another hub"
                    );
                }
                crate::metrics::metrics().claims_renewed(held.len() - lost.len(), lost.len());
                for sid in lost {
                    if let Some((_, epoch)) = held.iter().find(|(s, _)| *s == sid) {
                        state.claims.forget(&sid, *epoch);
                    }
                    tracing::warn!(session = %sid, "this hub's claim on a session is lost (another hub took it once its lease ran out); its driver stops");
                    state.stops.ring(&sid);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot renew this hub's claims on sessions; they are tried again shortly")
            }
        }
    }
}

/// How often a hub looks for the hubs that hold claims and lost their session lock.
const GONE_CHECK: Duration = Duration::from_secs(1);

/// On a shared store, every [`GONE_CHECK`]: a hub holding claims whose session lock is
/// missing at two checks in a row is gone (its process died, its connection with it): its
/// claims end and its sessions are queued again, so they are driven within seconds, not
/// at the end of its lease. Two checks, so a bus reconnecting for a moment is not taken
/// for a death (a mistake costs a model call made twice: the live hub's writes are fenced).
pub(super) async fn end_gone_hubs(state: AppState) {
    if !state.store.is_shared() {
        return;
    }
    let mut suspects: Vec<String> = Vec::new();
    loop {
        tokio::select! {
            () = tokio::time::sleep(GONE_CHECK) => {}
            () = state.shutdown.cancelled() => return,
        }
        let me = state.claims.hub.clone();
        let claiming = match state
            .store
            .read(move |r| r.hubs_claiming(&me, now_ms()))
            .await
        {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the other hubs' claims");
                continue;
            }
        };
        suspects = end_claims_of_gone(&state, claiming, &suspects).await;
    }
}

/// Of the hubs `claiming` sessions, those whose session lock is missing now; the claims of
/// those also missing at the last check (`suspects`) end here. Returns the new suspects.
async fn end_claims_of_gone(
    state: &AppState,
    claiming: Vec<String>,
    suspects: &[String],
) -> Vec<String> {
    if claiming.is_empty() {
        return Vec::new();
    }
    let alive = match state.store.hubs_alive().await {
        Some(Ok(a)) => a,
        Some(Err(e)) => {
            tracing::warn!(error = %e, "cannot read which hubs hold their session lock");
            return suspects.to_vec();
        }
        None => return Vec::new(),
    };
    let missing: Vec<String> = claiming
        .into_iter()
        .filter(|h| !alive.contains(&crate::store::claims::hub_key(h)))
        .collect();
    for hub in missing.iter().filter(|h| suspects.contains(h)) {
        let h = hub.clone();
        match state
            .store
            .exec(move |t| t.end_claims_of(&h, now_ms()))
            .await
        {
            Ok(sessions) if !sessions.is_empty() => tracing::warn!(
                %hub,
                sessions = sessions.len(),
                "a hub's session lock went with its process: its claims end now and its sessions are driven again here or elsewhere"
            ),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(%hub, error = %e, "cannot end the claims of a hub that is gone")
            }
        }
    }
    missing
}

/// How often the asks for this hub are looked for when no notice came.
const ASKS_POLL: Duration = Duration::from_secs(1);

/// On a shared store: the `device_exec` asks other hubs wrote for this one (the device's
/// link is here) are taken, each once, and started; told by the store's notice, and
/// looked for every [`ASKS_POLL`] besides.
pub(super) async fn serve_exec_asks(state: AppState) {
    if !state.store.is_shared() {
        return;
    }
    let me = state.claims.hub.clone();
    let mut told = state
        .store
        .notifier
        .watch(crate::store::exec_asks::TOPIC_EXEC_ASK, &me, 0);
    loop {
        tokio::select! {
            _ = told.changed() => {}
            () = tokio::time::sleep(ASKS_POLL) => {}
            () = state.shutdown.cancelled() => return,
        }
        told.borrow_and_update();
        let m = me.clone();
        match state.store.read(move |r| r.exec_asks_waiting(&m)).await {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for the device_exec asks of other hubs");
                continue;
            }
        }
        let m = me.clone();
        let taken = match state
            .store
            .exec(move |t| t.take_exec_asks(&m, now_ms()))
            .await
        {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "cannot take the device_exec asks of other hubs");
                continue;
            }
        };
        for (exec_id, ask) in taken {
            let state = state.clone();
            tokio::spawn(async move { crate::mesh::exec::serve_ask(&state, exec_id, ask).await });
        }
    }
}

/// On a shared store: whenever the hub's events move (a device added, revoked, linked
/// anywhere), the allowed devices are read again and a device revoked (or given a new
/// token) elsewhere has its link here ended.
pub(super) async fn follow_devices(state: AppState) {
    if !state.store.is_shared() {
        return;
    }
    let mut events = state.store.notifier.watch(TOPIC_HUB, "", 0);
    loop {
        tokio::select! {
            r = events.changed() => if r.is_err() { return },
            () = state.shutdown.cancelled() => return,
        }
        events.borrow_and_update();
        // Read again when a local add or revoke came during the read (it is newer).
        let ended = loop {
            let read_at = state.devices.revision();
            let records = match state.store.read(|r| r.devices()).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the devices to follow the other hubs' changes");
                    break Vec::new();
                }
            };
            let tokens: HashMap<String, [u8; 32]> = records
                .into_iter()
                .map(|r| (r.name, r.token_hash))
                .collect();
            if let Some(ended) = state.devices.follow(tokens, read_at) {
                break ended;
            }
        };
        for device in ended {
            tracing::info!(%device, "a device revoked on another hub: its link here is ended");
        }
    }
}
