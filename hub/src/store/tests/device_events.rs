//! Devices and hub events.

use super::*;
use crate::store::devices::Forget;

async fn hub_kinds(store: &Store) -> Vec<String> {
    store
        .read(|r| r.hub_events_after(0, 1000))
        .await
        .expect("read")
        .iter()
        .map(|b| {
            let e: cortex_protocol::api::HubEvent = serde_json::from_slice(b).expect("json");
            serde_json::to_value(&e).expect("value")["kind"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

fn online(link: u64) -> devices::Online {
    devices::Online {
        hub: "test-hub".into(),
        link,
        agent_version: "0.1".into(),
        host: cortex_protocol::mesh::HostFacts {
            hostname: "box".into(),
            ..Default::default()
        },
        capabilities: vec!["spool".into()],
        spool: cortex_protocol::mesh::SpoolCounts { pending: 2, bad: 1 },
    }
}

#[tokio::test]
async fn devices_are_added_once_and_revoked_with_their_events() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    let mut hub_rx = store.notifier.subscribe_hub();
    let h = crate::secret::hash("tok");
    assert!(
        store
            .exec(move |t| t.add_device("gpu1", h, T0))
            .await
            .expect("add")
    );
    assert!(
        !store
            .exec(move |t| t.add_device("gpu1", h, T0))
            .await
            .expect("again")
    );
    assert!(hub_rx.has_changed().expect("open"), "a long poll is woken");
    assert_eq!(*hub_rx.borrow_and_update(), 1);
    let rec = store
        .read(|r| r.device("gpu1"))
        .await
        .expect("read")
        .expect("stored");
    assert_eq!(rec.token_hash, h, "only the hash is stored");
    assert_eq!((rec.created_at, rec.last_seen), (T0, None));
    assert!(
        store
            .exec(|t| t.revoke_device("gpu1", T0))
            .await
            .expect("revoke")
    );
    assert!(
        !store
            .exec(|t| t.revoke_device("gpu1", T0))
            .await
            .expect("revoke")
    );
    assert!(store.read(|r| r.devices()).await.expect("read").is_empty());
    assert_eq!(hub_kinds(&store).await, ["device-added", "device-revoked"]);
    // Revoked, it is remembered (listed as revoked) until removed, once.
    let gone = store
        .read(|r| r.revoked_device("gpu1"))
        .await
        .expect("read");
    assert_eq!(gone.map(|d| d.revoked_at), Some(T0));
    let forget = |n: &'static str| store.exec(move |t| t.forget_revoked_device(n));
    assert_eq!(forget("gpu1").await.expect("forget"), Forget::Removed);
    assert_eq!(forget("gpu1").await.expect("forget"), Forget::Unknown);
    assert!(
        store
            .read(|r| r.revoked_devices())
            .await
            .expect("read")
            .is_empty()
    );
    // An enrolled device is not removed: it is revoked first.
    assert!(
        store
            .exec(|t| t.add_device("gpu2", [7; 32], T0))
            .await
            .expect("add")
    );
    assert_eq!(forget("gpu2").await.expect("forget"), Forget::Enrolled);
    // A revoked device cannot be recorded online.
    let up = online(1);
    assert!(
        !store
            .exec(move |t| t.device_online("gpu1", &up, None, T0))
            .await
            .expect("online")
    );
}

#[tokio::test]
async fn an_old_link_never_overwrites_a_newer_one() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    let h = crate::secret::hash("tok");
    store
        .exec(move |t| t.add_device("d", h, T0))
        .await
        .expect("add");
    let up = online(1);
    assert!(
        store
            .exec(move |t| t.device_online("d", &up, None, T0 + 1))
            .await
            .expect("on")
    );
    let rec = store
        .read(|r| r.device("d"))
        .await
        .expect("read")
        .expect("rec");
    assert_eq!(
        (rec.link, rec.online_since, rec.spool.pending),
        (Some(1), Some(T0 + 1), 2)
    );
    // Link 2 replaces link 1: the replacement's offline is recorded before its online.
    let up = online(2);
    store
        .exec(move |t| t.device_online("d", &up, Some("replaced by a new connection"), T0 + 2))
        .await
        .expect("on");
    // Link 1's own end comes later and must not mark the device offline.
    let spool = cortex_protocol::mesh::SpoolCounts::default();
    store
        .exec(move |t| t.device_offline("d", 1, "closed by the agent", T0 + 3, spool, T0 + 3))
        .await
        .expect("off");
    let rec = store
        .read(|r| r.device("d"))
        .await
        .expect("read")
        .expect("rec");
    assert_eq!(rec.link, Some(2));
    assert_eq!(rec.offline_reason, None);
    store
        .exec(|t| t.touch_devices(&[("d".into(), 2, T0 + 9, Default::default())]))
        .await
        .expect("touch");
    store
        .exec(move |t| t.device_offline("d", 2, "ping timed out", T0 + 10, spool, T0 + 11))
        .await
        .expect("off");
    let rec = store
        .read(|r| r.device("d"))
        .await
        .expect("read")
        .expect("rec");
    assert_eq!(rec.link, None);
    assert_eq!(rec.last_seen, Some(T0 + 10));
    assert_eq!(rec.offline_since, Some(T0 + 11));
    assert_eq!(rec.offline_reason.as_deref(), Some("ping timed out"));
    assert_eq!(
        hub_kinds(&store).await,
        [
            "device-added",
            "device-online",
            "device-offline",
            "device-online",
            "device-offline"
        ],
        "the superseded link's late end adds no event"
    );
    // A link that ended on its own before its successor registered is not reported
    // offline a second time by the successor.
    let up = online(3);
    store
        .exec(move |t| t.device_online("d", &up, Some("replaced by a new connection"), T0 + 12))
        .await
        .expect("on");
    assert_eq!(
        hub_kinds(&store).await.last().map(String::as_str),
        Some("device-online")
    );
    assert_eq!(hub_kinds(&store).await.len(), 6);
}

#[tokio::test]
async fn a_restart_records_links_of_the_last_run_offline() {
    let dir = tempfile::tempdir().expect("tmp");
    {
        let (store, guard) = open(dir.path());
        let h = crate::secret::hash("tok");
        store
            .exec(move |t| t.add_device("d", h, T0))
            .await
            .expect("add");
        store
            .exec(move |t| t.add_device("idle", h, T0))
            .await
            .expect("add");
        let up = online(7);
        store
            .exec(move |t| t.device_online("d", &up, None, T0 + 5))
            .await
            .expect("on");
        store
            .exec(|t| t.touch_devices(&[("d".into(), 7, T0 + 8, Default::default())]))
            .await
            .expect("touch");
        drop(store);
        guard.join();
    }
    let (store, _guard) = open(dir.path());
    assert_eq!(
        *store.notifier.subscribe_hub().borrow(),
        3,
        "the hub seq survives"
    );
    assert_eq!(
        store
            .exec(|t| t.devices_restarted(T0 + 100, "test-hub"))
            .await
            .expect("restart"),
        1
    );
    assert_eq!(
        store
            .exec(|t| t.devices_restarted(T0 + 200, "test-hub"))
            .await
            .expect("again"),
        0
    );
    let rec = store
        .read(|r| r.device("d"))
        .await
        .expect("read")
        .expect("rec");
    assert_eq!(
        rec.offline_since,
        Some(T0 + 8),
        "offline since it was last seen"
    );
    assert_eq!(rec.offline_reason.as_deref(), Some("the hub restarted"));
    let events = store
        .read(|r| r.hub_events_after(3, 10))
        .await
        .expect("read");
    assert_eq!(events.len(), 1);
}

#[tokio::test]
async fn the_hub_log_keeps_a_bounded_tail() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    store
        .exec(|t| {
            for i in 0..devices::HUB_EVENTS_KEPT + 5 {
                t.append_hub_event(
                    cortex_protocol::api::HubEventBody::DeviceAdded {
                        device: format!("d{i}"),
                    },
                    T0,
                )?;
            }
            Ok(())
        })
        .await
        .expect("append");
    let first = store
        .read(|r| r.hub_events_after(0, 1))
        .await
        .expect("read");
    let e: cortex_protocol::api::HubEvent = serde_json::from_slice(&first[0]).expect("json");
    assert_eq!(e.seq, 6, "the oldest five were dropped");
    assert_eq!(
        store.read(|r| r.last_hub_seq()).await.expect("read"),
        devices::HUB_EVENTS_KEPT + 5
    );
}
