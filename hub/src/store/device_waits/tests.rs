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
            start_time: Some(777)
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
