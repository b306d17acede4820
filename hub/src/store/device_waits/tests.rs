//! The durable half of remote waits: created with its waitpoint (and a session when none
//! is named), its outcome recorded once under `device-wait:{id}`, ended with its
//! waitpoint however that ends, ended by the hub at its deadline (`timed_out` online,
//! `broke` offline), and the device's link told after each change.

use std::collections::HashSet;

use cortex_protocol::api::{Event, EventBody, WakeReason};
use cortex_protocol::mesh::{WaitEnd, WaitSpec};

use super::*;
use crate::store::ops::CancelOutcome;
use crate::store::tests::{crash, open, signal_count};
use crate::store::{Store, StoreError};

const T0: u64 = 1_796_000_000_000;

async fn add_device(store: &Store, name: &str) {
    let n = name.to_string();
    assert!(
        store
            .exec(move |t| t.add_device(&n, [1; 32], T0))
            .await
            .expect("add")
    );
}

fn new_wait(device: &str, pid: i32, timeout_ms: u64, session: Option<String>) -> NewDeviceWait {
    NewDeviceWait {
        device: device.into(),
        spec: WaitSpec::Pid {
            pid,
            start_time: None,
            must_exist: false,
        },
        timeout_ms,
        session,
        title: format!("wait pid {pid} on {device}"),
        label: format!("pid {pid} on {device}"),
        intent: "wake when it exits".into(),
        waitpoint_id: None,
    }
}

async fn create(store: &Store, w: NewDeviceWait, now: u64) -> CreateDeviceWaitOutcome {
    store
        .exec(move |t| t.create_device_wait(w, [2; 32], now))
        .await
        .expect("create")
}

async fn created(store: &Store, w: NewDeviceWait, now: u64) -> (Waitpoint, DeviceWaitRecord) {
    match create(store, w, now).await {
        CreateDeviceWaitOutcome::Created {
            waitpoint, wait, ..
        } => (*waitpoint, *wait),
        other => panic!("{other:?}"),
    }
}

async fn events(store: &Store, sid: &str) -> Vec<Event> {
    store
        .read({
            let sid = sid.to_string();
            move |r| r.events_after(&sid, 0, 1000)
        })
        .await
        .expect("read")
        .expect("session")
        .iter()
        .map(|b| serde_json::from_slice(b).expect("event json"))
        .collect()
}

async fn wakes(store: &Store, sid: &str) -> Vec<cortex_protocol::api::Wake> {
    events(store, sid)
        .await
        .into_iter()
        .filter_map(|e| match e.body {
            EventBody::Wake(w) => Some(*w),
            _ => None,
        })
        .collect()
}

async fn active(store: &Store, device: &str) -> Vec<DeviceWaitRecord> {
    let device = device.to_string();
    store
        .read(move |r| r.device_waits(&device))
        .await
        .expect("read")
}

#[tokio::test]
async fn a_wait_is_created_with_its_waitpoint_and_a_session_of_its_own() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    assert_eq!(
        create(&store, new_wait("gpu1", 42, 10_000, None), T0).await,
        CreateDeviceWaitOutcome::NoDevice
    );
    add_device(&store, "gpu1").await;
    assert_eq!(
        create(
            &store,
            new_wait("gpu1", 42, 10_000, Some("ses_nope".into())),
            T0
        )
        .await,
        CreateDeviceWaitOutcome::NoSession
    );
    let changed = store.notifier.subscribe_device("gpu1");
    let (wp, rec) = match create(&store, new_wait("gpu1", 42, 10_000, None), T0).await {
        CreateDeviceWaitOutcome::Created {
            waitpoint,
            wait,
            session_created,
        } => {
            assert!(session_created);
            (*waitpoint, *wait)
        }
        other => panic!("{other:?}"),
    };
    assert!(changed.has_changed().expect("open"), "the link is told");
    assert_eq!(wp.device.as_deref(), Some("gpu1"));
    assert_eq!(wp.max_signals, 1);
    assert_eq!(rec.deadline, T0 + 10_000);
    assert_eq!(rec.phase, Phase::Pending);
    // The waitpoint outlives the hub's deadline, so the wait's own end comes first.
    assert_eq!(
        wp.expires_at,
        T0 + 10_000 + TIMEOUT_GRACE_MS + EXPIRY_MARGIN_MS
    );
    assert_eq!(
        Some(*store.next_timer.borrow()).filter(|t| *t != u64::MAX),
        Some(T0 + 10_000 + TIMEOUT_GRACE_MS)
    );
    let session = store
        .read({
            let sid = wp.session.clone();
            move |r| r.session(&sid)
        })
        .await
        .expect("read")
        .expect("session");
    assert_eq!(session.title.as_deref(), Some("wait pid 42 on gpu1"));
    assert_eq!(active(&store, "gpu1").await, vec![rec.clone()]);
    assert_eq!(
        store
            .read(|r| r.device_wait_count("gpu1"))
            .await
            .expect("n"),
        1
    );
    assert_eq!(
        store
            .read(|r| r.device_wait_count("gpu2"))
            .await
            .expect("n"),
        0
    );

    // In a named session: no new session.
    let sid = wp.session.clone();
    match create(&store, new_wait("gpu1", 43, 10_000, Some(sid.clone())), T0).await {
        CreateDeviceWaitOutcome::Created {
            waitpoint,
            session_created,
            ..
        } => {
            assert!(!session_created);
            assert_eq!(waitpoint.session, sid);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        store
            .read(|r| r.device_wait_count("gpu1"))
            .await
            .expect("n"),
        2
    );
}

#[tokio::test]
async fn an_outcome_is_recorded_once_as_a_device_wait_signal() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    add_device(&store, "gpu1").await;
    let (wp, _) = created(&store, new_wait("gpu1", 42, 60_000, None), T0).await;
    let id = wp.id.clone();

    let i = id.clone();
    let resume = Some(WaitSpec::Pid {
        pid: 42,
        start_time: Some(777),
        must_exist: false,
    });
    assert!(
        store
            .exec(move |t| t.device_wait_armed(
                "gpu1",
                &i,
                r#"{"comm":"sleep"}"#.into(),
                resume,
                T0 + 1
            ))
            .await
            .expect("armed")
    );
    let rec = &active(&store, "gpu1").await[0];
    assert_eq!(rec.phase, Phase::Armed);
    assert_eq!(
        rec.arm_spec(),
        &WaitSpec::Pid {
            pid: 42,
            start_time: Some(777),
            must_exist: false,
        },
        "later arms send the pinned spec"
    );
    // Another device cannot report this one.
    let other = fired("gpu2", &id, "{}", "x", T0 + 2);
    assert_eq!(
        store
            .exec(move |t| t.device_wait_done(&other))
            .await
            .expect("done"),
        DoneOutcome::NotActive
    );
    let changed = store.notifier.subscribe_device("gpu1");
    for n in 0..2 {
        let done = fired(
            "gpu1",
            &id,
            r#"{"pid":42,"exited":true}"#,
            "pid 42 (sleep) exited",
            T0 + 5,
        );
        let out = store
            .exec(move |t| t.device_wait_done(&done))
            .await
            .expect("done");
        if n == 0 {
            assert!(
                matches!(out, DoneOutcome::Recorded(SignalOutcome::Accepted { .. })),
                "{out:?}"
            );
        } else {
            assert_eq!(out, DoneOutcome::NotActive, "a resend counts once");
        }
    }
    assert!(changed.has_changed().expect("open"));
    assert!(active(&store, "gpu1").await.is_empty());
    let w = wakes(&store, &wp.session).await;
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].reason, WakeReason::Fired);
    let s = &w[0].signals[0];
    assert_eq!(s.source, "device-wait");
    assert_eq!(s.key, Some(format!("device-wait:{id}")));
    assert_eq!(s.message.as_deref(), Some("pid 42 (sleep) exited"));
    let data: serde_json::Value =
        serde_json::from_str(s.data.as_deref().expect("data")).expect("json");
    assert_eq!(data["outcome"], "fired");
    assert_eq!(data["device"], "gpu1");
    assert_eq!(data["payload"]["exited"], true);
    // Armed reports for an ended wait tell the link to cancel it.
    let i = id.clone();
    assert!(
        !store
            .exec(move |t| t.device_wait_armed("gpu1", &i, "{}".into(), None, T0 + 6))
            .await
            .expect("armed")
    );
}

#[tokio::test]
async fn a_waitpoint_ending_otherwise_ends_its_wait() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    add_device(&store, "gpu1").await;
    let (a, _) = created(&store, new_wait("gpu1", 1, 60_000, None), T0).await;
    let (b, _) = created(&store, new_wait("gpu1", 2, 60_000, None), T0).await;
    let changed = store.notifier.subscribe_device("gpu1");
    let id = a.id.clone();
    assert_eq!(
        store
            .exec(move |t| t.cancel_waitpoint(&id, None, "operator", T0 + 1))
            .await
            .expect("cancel"),
        CancelOutcome::Cancelled
    );
    assert!(changed.has_changed().expect("open"));
    assert_eq!(active(&store, "gpu1").await.len(), 1);
    let sid = b.session.clone();
    assert!(
        store
            .exec(move |t| t.delete_session(&sid, T0 + 2))
            .await
            .expect("delete")
    );
    assert!(active(&store, "gpu1").await.is_empty());
    assert_eq!(
        Some(*store.next_timer.borrow()).filter(|t| *t != u64::MAX),
        None,
        "the deadlines went too"
    );
}

#[tokio::test]
async fn the_hubs_deadline_times_out_online_and_breaks_offline() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    add_device(&store, "up").await;
    add_device(&store, "down").await;
    let (a, _) = created(&store, new_wait("up", 1, 10_000, None), T0).await;
    let (b, _) = created(&store, new_wait("down", 2, 10_000, None), T0).await;
    let (c, _) = created(&store, new_wait("up", 3, 50_000, None), T0).await;
    let online: HashSet<String> = ["up".to_string()].into();
    let o = online.clone();
    assert_eq!(
        store
            .exec(move |t| t.device_waits_due(T0 + 10_000 + TIMEOUT_GRACE_MS - 1, &o))
            .await
            .expect("due"),
        0
    );
    let o = online.clone();
    assert_eq!(
        store
            .exec(move |t| t.device_waits_due(T0 + 10_000 + TIMEOUT_GRACE_MS, &o))
            .await
            .expect("due"),
        2
    );
    let outcome = async |wp: &Waitpoint| {
        let w = wakes(&store, &wp.session).await;
        assert_eq!(w.len(), 1, "one wake");
        assert_eq!(w[0].reason, WakeReason::Failed);
        let s = &w[0].signals[0];
        let data: serde_json::Value =
            serde_json::from_str(s.data.as_deref().expect("data")).expect("json");
        (
            data["outcome"].as_str().unwrap_or_default().to_string(),
            s.message.clone().unwrap_or_default(),
        )
    };
    let (o, m) = outcome(&a).await;
    assert_eq!(o, "timed_out");
    assert!(m.contains("timed out after 10s"), "{m}");
    let (o, m) = outcome(&b).await;
    assert_eq!(o, "broke");
    assert!(m.contains("offline"), "{m}");
    assert!(wakes(&store, &c.session).await.is_empty());
    assert_eq!(
        Some(*store.next_timer.borrow()).filter(|t| *t != u64::MAX),
        Some(T0 + 50_000 + TIMEOUT_GRACE_MS)
    );
}

#[tokio::test]
async fn waits_an_agent_cannot_run_and_waits_of_a_revoked_device_break() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    add_device(&store, "old").await;
    let (a, _) = created(&store, new_wait("old", 1, 60_000, None), T0).await;
    let mut f = new_wait("old", 0, 60_000, None);
    f.spec = WaitSpec::File {
        path: "/x".into(),
        cursor: None,
        silence_ms: None,
    };
    let (b, _) = created(&store, f, T0).await;
    let caps = vec!["spool".to_string(), "wait-pid".to_string()];
    assert_eq!(
        store
            .exec(move |t| t.device_waits_unsupported("old", &caps, "0.0.9", T0 + 1))
            .await
            .expect("unsupported"),
        1
    );
    let w = wakes(&store, &b.session).await;
    assert_eq!(w.len(), 1);
    let m = w[0].signals[0].message.clone().unwrap_or_default();
    assert!(m.contains("does not announce wait-file"), "{m}");
    assert!(wakes(&store, &a.session).await.is_empty());

    assert!(
        store
            .exec(|t| t.revoke_device("old", T0 + 2))
            .await
            .expect("revoke")
    );
    let w = wakes(&store, &a.session).await;
    assert_eq!(w.len(), 1);
    assert!(
        w[0].signals[0]
            .message
            .as_deref()
            .is_some_and(|m| m.contains("revoked"))
    );
    assert!(active(&store, "old").await.is_empty());
}

/// `device` reporting that wait `id` fired, `message` saying how.
fn fired(device: &str, id: &str, payload: &str, message: &str, now: u64) -> DeviceWaitDone {
    DeviceWaitDone {
        device: device.into(),
        id: id.into(),
        end: WaitEnd::Fired,
        payload: payload.into(),
        message: message.into(),
        now,
    }
}

/// A remote wait's outcome as the mesh link sends it: its record written (and on its way
/// to the disk) before the operation runs. The callback's answer comes back on `rx`.
fn done_early(
    store: &Store,
    device: &str,
    id: &str,
    now: u64,
) -> std::sync::mpsc::Receiver<Result<DoneOutcome, String>> {
    let (tx, rx) = std::sync::mpsc::channel();
    store.device_wait_done_then(fired(device, id, "{}", "exited", now), move |r| {
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    rx
}

fn answer(
    rx: &std::sync::mpsc::Receiver<Result<DoneOutcome, String>>,
) -> Result<DoneOutcome, String> {
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .expect("answered within 10 s")
}

#[tokio::test]
async fn an_outcome_journaled_before_it_runs_counts_once_across_a_crash() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, guard) = open(dir.path());
    add_device(&store, "gpu1").await;
    let (wp, _) = created(&store, new_wait("gpu1", 42, 60_000, None), T0).await;
    let out = answer(&done_early(&store, "gpu1", &wp.id, T0 + 5));
    assert!(matches!(out, Ok(DoneOutcome::Recorded(_))), "{out:?}");
    // Reported again before any commit: nothing more (the record replays as nothing).
    let again = answer(&done_early(&store, "gpu1", &wp.id, T0 + 6));
    assert_eq!(again, Ok(DoneOutcome::NotActive));
    crash(store, guard).await;
    let (store, _guard) = open(dir.path());
    assert_eq!(signal_count(&store, &wp.id).await, 1);
    assert!(
        store
            .read(|r| r.device_waits("gpu1"))
            .await
            .expect("read")
            .is_empty()
    );
    let wakes = events(&store, &wp.session)
        .await
        .into_iter()
        .filter(|e| matches!(e.body, EventBody::Wake { .. }))
        .count();
    assert_eq!(wakes, 1);
}

#[tokio::test]
async fn an_outcome_whose_flush_or_batch_fails_is_not_recorded() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, guard) = open(dir.path());
    add_device(&store, "gpu1").await;
    let (wp, _) = created(&store, new_wait("gpu1", 42, 60_000, None), T0).await;
    // The flush of its early record fails.
    store.fail_next_journal_syncs(1);
    assert!(answer(&done_early(&store, "gpu1", &wp.id, T0 + 5)).is_err());
    // In the same batch as a job that fails: only the failing job is undone, the outcome
    // is recorded. The writer is held up (in a batch of its own: the outcome is sent once
    // it is running) so that both are taken in the next batch.
    let (hold, held) = std::sync::mpsc::channel::<()>();
    let (running_tx, running) = std::sync::mpsc::channel::<()>();
    store.exec_then(
        move |_| {
            let _ = running_tx.send(());
            let _ = held.recv_timeout(std::time::Duration::from_secs(5));
            Ok(())
        },
        |_| {},
    );
    running
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("the writer runs the holding job");
    let s2 = store.clone();
    let failing = tokio::spawn(async move {
        s2.exec(|t| {
            t.create_session(Some("doomed".into()), T0 + 6)?;
            Err::<(), _>(StoreError::Decode("boom".into()))
        })
        .await
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let rx = done_early(&store, "gpu1", &wp.id, T0 + 6);
    let _ = hold.send(());
    assert!(matches!(answer(&rx), Ok(DoneOutcome::Recorded(_))));
    assert!(failing.await.expect("task").is_err());
    assert_eq!(signal_count(&store, &wp.id).await, 1);
    crash(store, guard).await;
    // After a restart: the outcome once, the failed job's session nowhere, and a report
    // sent again is a duplicate.
    let (store, _guard) = open(dir.path());
    assert_eq!(signal_count(&store, &wp.id).await, 1);
    let titles: Vec<Option<String>> = store
        .read(|r| r.sessions())
        .await
        .expect("sessions")
        .into_iter()
        .map(|s| s.title)
        .collect();
    assert!(!titles.contains(&Some("doomed".to_string())));
    let out = answer(&done_early(&store, "gpu1", &wp.id, T0 + 7));
    assert!(matches!(out, Ok(DoneOutcome::NotActive)), "{out:?}");
    assert_eq!(signal_count(&store, &wp.id).await, 1);
}

// ------------------------------------------------------------------ the loss report

const GRACE: u64 = 1_000;

fn up(link: u64) -> crate::store::devices::Online {
    crate::store::devices::Online {
        hub: "test-hub".into(),
        link,
        agent_version: "0.1".into(),
        host: Default::default(),
        capabilities: vec!["spool".into(), "wait-pid".into()],
        spool: Default::default(),
    }
}

async fn go_online(store: &Store, device: &str, link: u64, now: u64) {
    let d = device.to_string();
    assert!(
        store
            .exec(move |t| t.device_online(&d, &up(link), None, now))
            .await
            .expect("online")
    );
}

async fn go_offline(store: &Store, device: &str, link: u64, now: u64) {
    let d = device.to_string();
    store
        .exec(move |t| t.device_offline(&d, link, "ping timed out", now, Default::default(), now))
        .await
        .expect("offline");
}

/// Runs the timers due at `now` with `online` the devices with a live link.
async fn fire(store: &Store, now: u64, online: &[&str]) {
    let online: HashSet<String> = online.iter().map(|s| s.to_string()).collect();
    store
        .exec(move |t| t.fire_due(now, &online))
        .await
        .expect("fire");
}

/// The hub's start: the previous run's links offline, the grace kept.
async fn start(store: &Store, now: u64) {
    store
        .exec(move |t| {
            t.devices_restarted(now, "test-hub")?;
            t.device_losses_restarted(now, GRACE)
        })
        .await
        .expect("start");
}

async fn reports(store: &Store, sid: &str) -> Vec<cortex_protocol::api::Wake> {
    wakes(store, sid)
        .await
        .into_iter()
        .filter(|w| w.reason == WakeReason::Report)
        .collect()
}

async fn loss_timer(store: &Store, device: &str) -> Option<u64> {
    let d = device.to_string();
    store
        .read(move |r| {
            Ok(r.due_timers(u64::MAX - 1, Some(TIMER_DEVICE_LOSS), 100)?
                .into_iter()
                .find(|x| x.id == d)
                .map(|x| x.at))
        })
        .await
        .expect("read")
}

async fn wp_view(store: &Store, id: &str) -> cortex_protocol::api::WaitpointView {
    let id = id.to_string();
    store
        .read(move |r| r.waitpoint(&id, T0, &crate::engine::Settings::default()))
        .await
        .expect("read")
        .expect("waitpoint")
}

#[tokio::test]
async fn a_device_offline_past_the_grace_is_told_once_per_wait_and_per_outage() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    start(&store, T0).await;
    add_device(&store, "gpu1").await;
    go_online(&store, "gpu1", 1, T0 + 10).await;
    let (a, _) = created(&store, new_wait("gpu1", 42, 600_000, None), T0 + 20).await;
    assert_eq!(
        loss_timer(&store, "gpu1").await,
        None,
        "online: nothing due"
    );

    go_offline(&store, "gpu1", 1, T0 + 100).await;
    assert_eq!(loss_timer(&store, "gpu1").await, Some(T0 + 100 + GRACE));
    fire(&store, T0 + 100 + GRACE - 1, &[]).await;
    assert!(reports(&store, &a.session).await.is_empty(), "not yet");
    fire(&store, T0 + 100 + GRACE, &[]).await;
    let told = reports(&store, &a.session).await;
    assert_eq!(told.len(), 1);
    let w = &told[0];
    assert_eq!(w.waitpoint.id, a.id);
    assert!(w.signals.is_empty(), "not a signal");
    assert!(
        w.text.contains("device gpu1 has been offline since"),
        "{}",
        w.text
    );
    assert!(
        w.text.contains(&crate::time::rfc3339(T0 + 100)),
        "{}",
        w.text
    );
    assert!(w.text.contains("The wait stays armed"), "{}", w.text);
    assert!(w.text.contains("pid 42"), "{}", w.text);
    assert!(
        w.text.contains("wake when it exits"),
        "the intent: {}",
        w.text
    );
    // The waitpoint is as it was: armed, no signal, no wake of its own.
    let v = wp_view(&store, &a.id).await;
    assert_eq!(v.head.state, "armed");
    assert_eq!(v.signal_count, 0);
    assert!(v.wakes.is_empty());
    assert_eq!(
        active(&store, "gpu1").await[0].loss_reported,
        Some(T0 + 100)
    );

    // Said once: nothing more while it stays down.
    fire(&store, T0 + 100 + 10 * GRACE, &[]).await;
    assert_eq!(reports(&store, &a.session).await.len(), 1);
    assert_eq!(loss_timer(&store, "gpu1").await, None);

    // A wait asked while it is down is told at once, with since when.
    let (b, _) = created(&store, new_wait("gpu1", 43, 600_000, None), T0 + 5_000).await;
    assert_eq!(loss_timer(&store, "gpu1").await, Some(T0 + 100 + GRACE));
    fire(&store, T0 + 5_000, &[]).await;
    let told = reports(&store, &b.session).await;
    assert_eq!(told.len(), 1);
    assert!(told[0].text.contains(&crate::time::rfc3339(T0 + 100)));
    assert_eq!(
        reports(&store, &a.session).await.len(),
        1,
        "a is not told twice"
    );

    // Back: the spell is forgotten; the next outage is told again, to both.
    go_online(&store, "gpu1", 2, T0 + 6_000).await;
    assert!(
        active(&store, "gpu1")
            .await
            .iter()
            .all(|w| w.loss_reported.is_none())
    );
    go_offline(&store, "gpu1", 2, T0 + 7_000).await;
    fire(&store, T0 + 7_000 + GRACE, &[]).await;
    assert_eq!(reports(&store, &a.session).await.len(), 2);
    assert_eq!(reports(&store, &b.session).await.len(), 2);

    // The outcome still comes once, when the device is back.
    go_online(&store, "gpu1", 3, T0 + 9_000).await;
    let (device, id) = ("gpu1".to_string(), a.id.clone());
    store
        .exec(move |t| t.device_wait_done(&fired(&device, &id, "{}", "pid 42 exited", T0 + 9_100)))
        .await
        .expect("done");
    let all = wakes(&store, &a.session).await;
    assert_eq!(
        all.iter().map(|w| w.reason).collect::<Vec<_>>(),
        vec![WakeReason::Report, WakeReason::Report, WakeReason::Fired]
    );
}

/// The device-lost notices the outbox holds: (device, key).
async fn lost_notices(store: &Store) -> Vec<(Option<String>, String)> {
    store
        .read(|r| r.notices_all())
        .await
        .expect("read")
        .into_iter()
        .filter(|n| n.notice.event == crate::notify::NoticeEvent::DeviceLost)
        .map(|n| (n.notice.device, n.key))
        .collect()
}

#[tokio::test]
async fn a_device_lost_is_one_notice_per_outage_however_many_waits_are_told() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, guard) = open(dir.path());
    store
        .exec(|t| t.set_notice_events(u64::MAX))
        .await
        .expect("mask");
    start(&store, T0).await;
    add_device(&store, "gpu1").await;
    go_online(&store, "gpu1", 1, T0 + 10).await;
    created(&store, new_wait("gpu1", 42, 600_000, None), T0 + 20).await;
    created(&store, new_wait("gpu1", 43, 600_000, None), T0 + 20).await;
    go_offline(&store, "gpu1", 1, T0 + 100).await;
    fire(&store, T0 + 100 + GRACE - 1, &[]).await;
    assert!(lost_notices(&store).await.is_empty(), "within the grace");
    fire(&store, T0 + 100 + GRACE, &[]).await;
    let first = format!("device-lost:gpu1:{}", T0 + 100);
    assert_eq!(
        lost_notices(&store).await,
        vec![(Some("gpu1".to_string()), first.clone())],
        "two waits told, one notice"
    );
    // A wait asked during the same outage is told of it; the person was already.
    created(&store, new_wait("gpu1", 44, 600_000, None), T0 + 5_000).await;
    fire(&store, T0 + 5_000, &[]).await;
    assert_eq!(lost_notices(&store).await.len(), 1);
    crash(store, guard).await;

    // The next outage is a notice of its own, and the first is not told again.
    let (store, _guard) = open(dir.path());
    start(&store, T0 + 6_000).await;
    go_online(&store, "gpu1", 2, T0 + 6_000).await;
    go_offline(&store, "gpu1", 2, T0 + 7_000).await;
    fire(&store, T0 + 7_000 + GRACE, &[]).await;
    assert_eq!(
        lost_notices(&store).await,
        vec![
            (Some("gpu1".to_string()), first),
            (
                Some("gpu1".to_string()),
                format!("device-lost:gpu1:{}", T0 + 7_000)
            )
        ]
    );
}

#[tokio::test]
async fn a_device_back_within_the_grace_is_never_told() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    start(&store, T0).await;
    add_device(&store, "gpu1").await;
    go_online(&store, "gpu1", 1, T0 + 10).await;
    let (a, _) = created(&store, new_wait("gpu1", 42, 600_000, None), T0 + 20).await;
    go_offline(&store, "gpu1", 1, T0 + 100).await;
    go_online(&store, "gpu1", 2, T0 + 600).await;
    assert_eq!(loss_timer(&store, "gpu1").await, None, "the report is off");
    fire(&store, T0 + 100 + 5 * GRACE, &[]).await;
    assert!(wakes(&store, &a.session).await.is_empty());

    // Its link up, its record not yet saying so: the registry's word is enough.
    go_offline(&store, "gpu1", 2, T0 + 10_000).await;
    fire(&store, T0 + 10_000 + GRACE, &["gpu1"]).await;
    assert!(wakes(&store, &a.session).await.is_empty());
}

#[tokio::test]
async fn after_a_restart_the_grace_runs_from_the_start_and_nothing_told_is_told_again() {
    let dir = tempfile::tempdir().expect("tmp");
    let (a, b) = {
        let (store, guard) = open(dir.path());
        start(&store, T0).await;
        add_device(&store, "gpu1").await;
        add_device(&store, "gpu2").await;
        go_online(&store, "gpu1", 1, T0 + 10).await;
        go_online(&store, "gpu2", 2, T0 + 10).await;
        let (a, _) = created(&store, new_wait("gpu1", 1, 3_600_000, None), T0 + 20).await;
        let (b, _) = created(&store, new_wait("gpu2", 2, 3_600_000, None), T0 + 20).await;
        // gpu2 goes away and is told; gpu1 is online when the hub is killed.
        go_offline(&store, "gpu2", 2, T0 + 100).await;
        fire(&store, T0 + 100 + GRACE, &["gpu1"]).await;
        assert_eq!(reports(&store, &b.session).await.len(), 1);
        crash(store, guard).await;
        (a, b)
    };
    // Started long after gpu1 was last seen: its loss is measured from the start.
    let t1 = T0 + 1_000_000;
    let (store, _guard) = open(dir.path());
    start(&store, t1).await;
    assert_eq!(loss_timer(&store, "gpu1").await, Some(t1 + GRACE));
    fire(&store, t1, &[]).await;
    assert!(
        wakes(&store, &a.session).await.is_empty(),
        "a restart is no loss"
    );
    fire(&store, t1 + GRACE, &[]).await;
    let told = reports(&store, &a.session).await;
    assert_eq!(told.len(), 1, "not back within the grace after the start");
    assert!(
        told[0].text.contains(&crate::time::rfc3339(T0 + 10)),
        "since its last seen: {}",
        told[0].text
    );
    assert_eq!(
        reports(&store, &b.session).await.len(),
        1,
        "gpu2's outage was told before"
    );
}

#[tokio::test]
async fn a_revoked_device_is_not_told_lost_and_a_device_without_waits_has_no_timer() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    start(&store, T0).await;
    add_device(&store, "gpu1").await;
    go_online(&store, "gpu1", 1, T0 + 10).await;
    go_offline(&store, "gpu1", 1, T0 + 100).await;
    assert_eq!(
        loss_timer(&store, "gpu1").await,
        None,
        "no waits, nobody to tell"
    );
    let (a, _) = created(&store, new_wait("gpu1", 42, 600_000, None), T0 + 200).await;
    assert_eq!(loss_timer(&store, "gpu1").await, Some(T0 + 100 + GRACE));
    assert!(
        store
            .exec(|t| t.revoke_device("gpu1", T0 + 300))
            .await
            .expect("revoke")
    );
    assert_eq!(loss_timer(&store, "gpu1").await, None);
    fire(&store, T0 + 100 + GRACE, &[]).await;
    let all = wakes(&store, &a.session).await;
    assert_eq!(all.len(), 1, "only the broke outcome");
    assert_eq!(all[0].reason, WakeReason::Failed);

    // A device that never connected is offline since it was added.
    add_device(&store, "gpu2").await;
    let (b, _) = created(&store, new_wait("gpu2", 43, 600_000, None), T0 + 50).await;
    assert_eq!(loss_timer(&store, "gpu2").await, Some(T0 + GRACE));
    fire(&store, T0 + GRACE, &[]).await;
    let told = reports(&store, &b.session).await;
    assert_eq!(told.len(), 1);
    assert!(
        told[0]
            .text
            .contains("device gpu2 has not connected since it was added at"),
        "{}",
        told[0].text
    );
    // The timer goes with the last wait, not before.
    let (c, _) = created(&store, new_wait("gpu2", 44, 600_000, None), T0 + GRACE + 10).await;
    assert_eq!(loss_timer(&store, "gpu2").await, Some(T0 + GRACE));
    for (id, at) in [(b.id.clone(), Some(T0 + GRACE)), (c.id.clone(), None)] {
        store
            .exec(move |t| t.cancel_waitpoint(&id, None, "operator", T0 + GRACE + 20))
            .await
            .expect("cancel");
        assert_eq!(loss_timer(&store, "gpu2").await, at);
    }
}
