use super::*;
use crate::engine::{CreateParams, State};
use crate::store::agent::{AgentRecord, AnswerOutcome, CancelPosted};
use crate::store::devices::Forget;
use crate::store::ops::{CancelOutcome, CreateOutcome};
use cortex_protocol::SignalRequest;
use cortex_protocol::api::{Decision, Event, EventBody, PendingRequest, PostAnswer, WakeReason};

pub(super) const T0: u64 = 1_796_000_000_000;

/// A store in `dir`, with the default settings (the device-wait tests share it).
pub(crate) fn open(dir: &std::path::Path) -> (Store, WriterGuard) {
    Store::open(&dir.join("hub.redb"), Settings::default()).expect("open")
}

pub(super) async fn session(store: &Store) -> String {
    store
        .exec(|t| t.create_session(Some("t".into()), T0))
        .await
        .expect("session")
        .id
}

pub(super) async fn waitpoint(store: &Store, sid: &str, p: CreateParams) -> (String, String) {
    let secret = crate::secret::new_secret();
    let hash = crate::secret::hash(&secret);
    let sid = sid.to_string();
    match store
        .exec(move |t| t.create_waitpoint(&sid, p, hash, T0))
        .await
        .expect("create")
    {
        CreateOutcome::Created(wp) => (wp.id, secret),
        other => panic!("{other:?}"),
    }
}

pub(super) fn params() -> CreateParams {
    CreateParams {
        label: "job".into(),
        intent: "look at it".into(),
        ..Default::default()
    }
}

/// The writer stops as if the process died (nothing after its last commit is in redb),
/// and every handle is gone: the store at its path can be opened again.
pub(super) async fn crash(store: Store, guard: WriterGuard) {
    store.crash().await;
    drop(store);
    guard.join();
}

/// A monitor taking up to `max` signals: its id and secret.
pub(super) async fn monitor(store: &Store, sid: &str, max: u32) -> (String, String) {
    let p = CreateParams {
        max_signals: Some(max),
        ..params()
    };
    waitpoint(store, sid, p).await
}

pub(super) fn sig(id: &str, secret: &str, key: Option<&str>) -> SignalIn {
    SignalIn {
        req: SignalRequest {
            id: id.into(),
            secret: secret.into(),
            status: None,
            message: Some("done".into()),
            member: None,
            data: None,
            key: key.map(Into::into),
        },
        source: "http".into(),
        dedupe: key.map(Into::into),
    }
}

pub(super) async fn send(store: &Store, s: SignalIn, now: u64) -> SignalOutcome {
    store
        .exec(move |t| t.signal(&s, now))
        .await
        .expect("signal")
}

/// The earliest decided wake the store announces.
pub(super) fn next_timer(store: &Store) -> Option<u64> {
    Some(*store.next_timer.borrow()).filter(|t| *t != u64::MAX)
}

pub(super) async fn events(store: &Store, sid: &str) -> Vec<Event> {
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

pub(super) async fn wakes(store: &Store, sid: &str) -> Vec<WakeReason> {
    events(store, sid)
        .await
        .into_iter()
        .filter_map(|e| match e.body {
            EventBody::Wake(w) => Some(w.reason),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_signal_wakes_the_session_once_and_survives_reopen() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, guard) = open(dir.path());
    let sid = session(&store).await;
    let (id, secret) = waitpoint(&store, &sid, params()).await;

    assert_eq!(
        send(&store, sig(&id, "wrong", None), T0 + 1).await,
        SignalOutcome::WrongSecret
    );
    assert_eq!(
        send(&store, sig("wp_nope", &secret, None), T0 + 1).await,
        SignalOutcome::Unknown
    );
    assert_eq!(
        send(&store, sig(&id, &secret, Some("k1")), T0 + 2).await,
        SignalOutcome::Accepted {
            state: State::Resolved
        }
    );
    // The same key again: a duplicate, not a second signal.
    assert_eq!(
        send(&store, sig(&id, &secret, Some("k1")), T0 + 3).await,
        SignalOutcome::Duplicate {
            state: State::Resolved
        }
    );
    assert!(matches!(
        send(&store, sig(&id, &secret, Some("k2")), T0 + 3).await,
        SignalOutcome::Refused(crate::engine::Refusal::Gone { .. })
    ));
    assert_eq!(wakes(&store, &sid).await, vec![WakeReason::Fired]);

    drop(store);
    guard.join();
    let (store, _guard) = open(dir.path());
    assert_eq!(wakes(&store, &sid).await, vec![WakeReason::Fired]);
    let view = store
        .read({
            let id = id.clone();
            move |r| r.waitpoint(&id, T0, &Settings::default())
        })
        .await
        .expect("read")
        .expect("wp");
    assert_eq!(view.head.state, "resolved");
    assert_eq!(view.signals.len(), 1);
    assert_eq!(view.signals[0].key.as_deref(), Some("k1"));
}

#[tokio::test]
async fn a_barrier_wake_is_a_timer_that_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, guard) = open(dir.path());
    let sid = session(&store).await;
    let p = CreateParams {
        quorum: Some(cortex_protocol::api::Quorum::Count(2)),
        ..params()
    };
    let (id, secret) = waitpoint(&store, &sid, p).await;
    send(&store, sig(&id, &secret, Some("a")), T0 + 10).await;
    send(&store, sig(&id, &secret, Some("b")), T0 + 20).await;
    assert_eq!(next_timer(&store), Some(T0 + 20 + 3_000));
    assert!(wakes(&store, &sid).await.is_empty());
    drop(store);
    guard.join();

    let (store, _guard) = open(dir.path());
    assert_eq!(next_timer(&store), Some(T0 + 3_020), "the timer is durable");
    assert_eq!(
        store
            .exec(|t| t.fire_timers(T0 + 3_019))
            .await
            .expect("fire"),
        0
    );
    assert_eq!(
        store
            .exec(|t| t.fire_timers(T0 + 3_020))
            .await
            .expect("fire"),
        1
    );
    assert_eq!(
        store
            .exec(|t| t.fire_timers(T0 + 9_999))
            .await
            .expect("fire"),
        0,
        "once"
    );
    assert_eq!(wakes(&store, &sid).await, vec![WakeReason::Fired]);
    assert_eq!(next_timer(&store), None);
}

#[tokio::test]
async fn the_sweep_expires_then_purges_reading_only_what_is_due() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    let sid = session(&store).await;
    let short = CreateParams {
        expires_in_hours: Some(1.0),
        ..params()
    };
    let (id, secret) = waitpoint(&store, &sid, short).await;
    for _ in 0..20 {
        waitpoint(&store, &sid, params()).await;
    }
    let h = crate::engine::HOUR_MS;
    assert_eq!(
        store
            .exec(move |t| t.sweep(T0 + h - 1))
            .await
            .expect("sweep"),
        0
    );
    assert_eq!(
        store.exec(move |t| t.sweep(T0 + h)).await.expect("sweep"),
        1
    );
    assert_eq!(wakes(&store, &sid).await, vec![WakeReason::Expired]);
    assert!(matches!(
        send(&store, sig(&id, &secret, None), T0 + h + 1).await,
        SignalOutcome::Refused(crate::engine::Refusal::Gone {
            state: "expired",
            ..
        })
    ));
    let d = crate::engine::DAY_MS;
    assert_eq!(
        store
            .exec(move |t| t.sweep(T0 + h + 3 * d))
            .await
            .expect("sweep"),
        1
    );
    assert_eq!(
        send(&store, sig(&id, &secret, None), T0 + h + 3 * d).await,
        SignalOutcome::Unknown
    );
    assert_eq!(store.read(|r| r.deadline_count()).await.expect("count"), 20);
}

#[tokio::test]
async fn deleting_a_session_cancels_its_waitpoints() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    let sid = session(&store).await;
    let (id, secret) = waitpoint(&store, &sid, params()).await;
    let s2 = sid.clone();
    assert!(
        store
            .exec(move |t| t.delete_session(&s2, T0 + 5))
            .await
            .expect("delete")
    );
    assert!(
        store
            .read({
                let sid = sid.clone();
                move |r| r.session(&sid)
            })
            .await
            .expect("read")
            .is_none()
    );
    assert!(matches!(
        send(&store, sig(&id, &secret, None), T0 + 6).await,
        SignalOutcome::Refused(crate::engine::Refusal::Gone {
            state: "cancelled",
            ..
        })
    ));
}

#[tokio::test]
async fn cancel_is_scoped_to_the_session() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    let a = session(&store).await;
    let b = session(&store).await;
    let (id, _) = waitpoint(&store, &a, params()).await;
    let (i2, b2) = (id.clone(), b.clone());
    assert_eq!(
        store
            .exec(move |t| t.cancel_waitpoint(&i2, Some(&b2), "agent", T0))
            .await
            .expect("x"),
        CancelOutcome::NotFound,
        "another session cannot see it"
    );
    let (i2, a2) = (id.clone(), a.clone());
    assert_eq!(
        store
            .exec(move |t| t.cancel_waitpoint(&i2, Some(&a2), "agent", T0))
            .await
            .expect("x"),
        CancelOutcome::Cancelled
    );
    assert_eq!(
        store
            .exec(move |t| t.cancel_waitpoint(&id, None, "agent", T0))
            .await
            .expect("x"),
        CancelOutcome::AlreadyEnded(State::Cancelled)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_signals_share_commits_and_each_counts_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    let sid = session(&store).await;
    let mut ids = Vec::new();
    for _ in 0..50 {
        let p = CreateParams {
            max_signals: Some(1000),
            ..params()
        };
        ids.push(waitpoint(&store, &sid, p).await);
    }
    let mut tasks = Vec::new();
    for (i, (id, secret)) in ids.iter().cloned().enumerate() {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            for j in 0..20 {
                // Every signal twice: the second is a duplicate.
                let key = format!("k{i}-{j}");
                for _ in 0..2 {
                    let mut s = sig(&id, &secret, Some(&key));
                    s.req.status = Some(cortex_protocol::SignalStatus::Progress);
                    if matches!(
                        send(&store, s, T0 + 1).await,
                        SignalOutcome::Accepted { .. }
                    ) {
                        n += 1;
                    }
                }
            }
            n
        }));
    }
    let mut accepted = 0;
    for t in tasks {
        accepted += t.await.expect("join");
    }
    assert_eq!(accepted, 50 * 20);
    for (id, _) in &ids {
        let v = store
            .read({
                let id = id.clone();
                move |r| r.waitpoint(&id, T0, &Settings::default())
            })
            .await
            .expect("read")
            .expect("wp");
        assert_eq!(v.signal_count, 20);
    }
}

#[tokio::test]
async fn message_dedupe_keys() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    let sid = session(&store).await;
    let s = sid.clone();
    let a = store
        .exec(move |t| t.post_message(&s, "hi".into(), Default::default(), Some("x".into()), T0))
        .await
        .expect("post")
        .expect("session");
    let s = sid.clone();
    let b = store
        .exec(move |t| t.post_message(&s, "hi".into(), Default::default(), Some("x".into()), T0))
        .await
        .expect("post")
        .expect("session");
    assert_eq!(a.seq, b.seq);
    assert!(b.duplicate);
    assert!(
        store
            .exec(|t| t.post_message("ses_none", "hi".into(), Default::default(), None, T0))
            .await
            .expect("post")
            .is_none()
    );
}

// ---------------------------------------------------------------- devices and hub events

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
            .exec(|t| t.devices_restarted(T0 + 100))
            .await
            .expect("restart"),
        1
    );
    assert_eq!(
        store
            .exec(|t| t.devices_restarted(T0 + 200))
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

// ------------------------------------------------------------------ the journal

fn progress(id: &str, secret: &str, key: &str) -> SignalIn {
    let mut s = sig(id, secret, Some(key));
    s.req.status = Some(cortex_protocol::SignalStatus::Progress);
    s
}

pub(super) async fn signal_count(store: &Store, id: &str) -> usize {
    let id = id.to_string();
    store
        .read(move |r| r.waitpoint(&id, T0, &Settings::default()))
        .await
        .expect("read")
        .expect("wp")
        .signals
        .len()
}

/// The journal number of the last commit in the closed store at `dir`.
fn journal_seq(dir: &std::path::Path) -> u64 {
    let db = redb::Database::open(dir.join("hub.redb")).expect("reopen db");
    read_now(&db, &ctx(), |r| r.journal_seq()).expect("meta")
}

fn ctx() -> Ctx {
    Ctx {
        settings: Arc::new(Settings::default()),
        limits: Arc::default(),
    }
}

#[tokio::test]
async fn a_read_after_an_ack_sees_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    let sid = session(&store).await;
    let (id, secret) = monitor(&store, &sid, 100).await;
    for i in 0..3 {
        let key = format!("k{i}");
        assert!(matches!(
            send(&store, progress(&id, &secret, &key), T0 + 1).await,
            SignalOutcome::Accepted { .. }
        ));
        // Journaled, not committed (redb commits it up to a second later): the read
        // asks for the commit first.
        assert_eq!(signal_count(&store, &id).await, i + 1);
    }
}

#[tokio::test]
async fn journaled_signals_survive_a_crash_once_each() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, guard) = open(dir.path());
    let sid = session(&store).await;
    let (barrier, bsecret) = waitpoint(
        &store,
        &sid,
        CreateParams {
            members: Some(vec!["a".into(), "b".into()]),
            ..params()
        },
    )
    .await;
    let (mon, msecret) = waitpoint(
        &store,
        &sid,
        CreateParams {
            max_signals: Some(100),
            ..params()
        },
    )
    .await;
    // Two progress signals, then something committed (they go with it), then three more
    // and the barrier's first member, journaled only.
    for k in ["p1", "p2"] {
        send(&store, progress(&mon, &msecret, k), T0 + 1).await;
    }
    session(&store).await;
    store.checkpoint().await;
    let committed = read_now(&store.db, &ctx(), |r| r.journal_seq()).expect("meta");
    assert!(
        committed >= 3,
        "the checkpoint holds the first three records"
    );
    for k in ["p3", "p4", "p5"] {
        send(&store, progress(&mon, &msecret, k), T0 + 2).await;
    }
    let mut a = sig(&barrier, &bsecret, Some("a1"));
    a.req.member = Some("a".into());
    assert!(matches!(
        send(&store, a, T0 + 3).await,
        SignalOutcome::Accepted { .. }
    ));
    crash(store, guard).await;
    assert_eq!(
        journal_seq(dir.path()),
        committed,
        "nothing after the commit reached redb"
    );

    let (store, guard) = open(dir.path());
    assert_eq!(signal_count(&store, &mon).await, 5, "each signal once");
    assert_eq!(signal_count(&store, &barrier).await, 1);
    // The replayed keys de-duplicate, and the secret was checked, not stored.
    assert!(matches!(
        send(&store, progress(&mon, &msecret, "p4"), T0 + 4).await,
        SignalOutcome::Duplicate { .. }
    ));
    let journal = std::fs::read(dir.path().join("hub.journal")).expect("journal");
    assert!(
        !journal
            .windows(msecret.len())
            .any(|w| w == msecret.as_bytes()),
        "a secret reached the journal"
    );
    // The second member completes the barrier after the restart, as if nothing happened.
    let mut b = sig(&barrier, &bsecret, Some("b1"));
    b.req.member = Some("b".into());
    assert!(
        next_timer(&store).is_some_and(|t| t >= T0 + 168 * crate::engine::HOUR_MS),
        "no wake decided: only the deadlines are queued"
    );
    assert!(matches!(
        send(&store, b, T0 + 5).await,
        SignalOutcome::Accepted { .. }
    ));
    assert_eq!(
        next_timer(&store),
        Some(T0 + 5 + 3_000),
        "both members reported: the barrier's wake is due 3 s later"
    );
    // A clean stop after a replay, then a start: no record is applied twice.
    drop(store);
    guard.join();
    let (store, _guard) = open(dir.path());
    assert_eq!(signal_count(&store, &mon).await, 5);
    assert_eq!(signal_count(&store, &barrier).await, 2);
}

#[tokio::test]
async fn a_failed_job_rolls_back_only_itself() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    let sid = session(&store).await;
    let (id, secret) = monitor(&store, &sid, 100).await;
    for k in ["a", "b"] {
        send(&store, progress(&id, &secret, k), T0 + 1).await;
    }
    // A job that writes and then fails: its transaction is aborted, which also drops the
    // journaled signals from it; they are applied again from the journal.
    let failed = store
        .exec(|t| {
            t.create_session(Some("doomed".into()), T0 + 2)?;
            Err::<(), _>(StoreError::Decode("boom".into()))
        })
        .await;
    assert!(failed.is_err());
    assert_eq!(signal_count(&store, &id).await, 2);
    let titles: Vec<Option<String>> = store
        .read(|r| r.sessions())
        .await
        .expect("sessions")
        .into_iter()
        .map(|s| s.title)
        .collect();
    assert_eq!(titles, vec![Some("t".to_string())]);
    // And the store goes on.
    send(&store, progress(&id, &secret, "c"), T0 + 3).await;
    assert_eq!(signal_count(&store, &id).await, 3);
}

#[tokio::test]
async fn a_full_journal_step_is_committed_without_a_reader_asking() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    let sid = session(&store).await;
    let (id, secret) = monitor(&store, &sid, 1_000).await;
    // 80 signals of 15,000 characters of data: more than the 1 MiB a commit waits for.
    for i in 0..80 {
        let mut s = progress(&id, &secret, &format!("k{i}"));
        s.req.data = Some("x".repeat(15_000));
        send(&store, s, T0 + 1).await;
    }
    let mut landed = store.landed.clone();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        landed.wait_for(|l| *l > 0),
    )
    .await
    .expect("a checkpoint within 30 s")
    .expect("the writer runs");
    let committed = read_now(&store.db, &ctx(), |r| {
        r.waitpoint(&id, T0, &Settings::default())
    })
    .expect("read")
    .expect("wp")
    .signals
    .len();
    assert!(
        (60..=80).contains(&committed),
        "redb holds the first megabyte's signals without a read asking ({committed})"
    );
}

#[tokio::test]
async fn a_callback_job_is_answered_on_the_writer_even_when_the_queue_is_full() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    let sid = session(&store).await;
    let (id, secret) = monitor(&store, &sid, 1_000).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // The writer is held up, and more than its queue holds (16 Ki jobs) is sent without
    // waiting: the ones that find it full wait for room on a task of their own.
    store.exec_then(
        |_| {
            std::thread::sleep(std::time::Duration::from_millis(300));
            Ok(())
        },
        |_| {},
    );
    let n = 20_000;
    for i in 0..n {
        let s = if i % 100 == 0 {
            progress(&id, &secret, &format!("k{i}"))
        } else {
            sig("wp_unknown", "x", None)
        };
        let tx = tx.clone();
        store.exec_then(
            move |t| t.signal(&s, T0 + 1),
            move |r| {
                let _ = tx.send(r.map(|o| matches!(o, SignalOutcome::Accepted { .. })));
            },
        );
    }
    let mut accepted = 0;
    for _ in 0..n {
        let r = tokio::time::timeout(std::time::Duration::from_secs(30), rx.recv())
            .await
            .expect("every callback within 30 s")
            .expect("a callback");
        accepted += usize::from(r.expect("no store error"));
    }
    assert_eq!(accepted, 200);
    // Answered means durable: a read sees them all.
    assert_eq!(signal_count(&store, &id).await, 200);
}

#[tokio::test]
async fn a_callback_job_after_the_writer_stopped_gets_an_error() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, guard) = open(dir.path());
    store.crash().await;
    guard.join();
    let (tx, rx) = std::sync::mpsc::channel();
    store.exec_then(
        |t| t.signal(&sig("wp_unknown", "x", None), T0),
        move |r| {
            let _ = tx.send(r.is_err());
        },
    );
    assert_eq!(
        rx.recv_timeout(std::time::Duration::from_secs(5)),
        Ok(true),
        "the callback runs at once with the store's error"
    );
}

#[tokio::test]
async fn a_failed_journal_flush_counts_nothing_and_the_store_goes_on() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, guard) = open(dir.path());
    let sid = session(&store).await;
    let (id, secret) = monitor(&store, &sid, 100).await;
    send(&store, progress(&id, &secret, "before"), T0 + 1).await;
    // The disk fails the flush: the caller gets an error, and nothing of it counts, now
    // or after a restart; what was acknowledged before stays.
    store.fail_next_journal_syncs(1);
    let s = progress(&id, &secret, "k");
    let failed = store.exec(move |t| t.signal(&s, T0 + 2)).await;
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(signal_count(&store, &id).await, 1);
    // Sent again (same key): counted once.
    assert!(matches!(
        send(&store, progress(&id, &secret, "k"), T0 + 3).await,
        SignalOutcome::Accepted { .. }
    ));
    assert_eq!(signal_count(&store, &id).await, 2);
    crash(store, guard).await;
    let (store, _guard) = open(dir.path());
    assert_eq!(signal_count(&store, &id).await, 2);
}

#[tokio::test]
async fn a_replay_decides_wakes_with_the_settings_the_journal_was_written_under() {
    let dir = tempfile::tempdir().expect("tmp");
    let capped = Settings {
        max_wakes_per_hour: 1,
        ..Settings::default()
    };
    let (store, guard) = Store::open(&dir.path().join("hub.redb"), capped).expect("open");
    let sid = session(&store).await;
    let (id, secret) = monitor(&store, &sid, 10).await;
    // One wake an hour: the first signal wakes, the second is held back.
    for k in ["a", "b"] {
        assert!(matches!(
            send(&store, sig(&id, &secret, Some(k)), T0 + 1).await,
            SignalOutcome::Accepted { .. }
        ));
    }
    crash(store, guard).await;
    // Restarted with the default cap (12): the replay still holds the second wake back,
    // as the hub that acknowledged it had decided.
    let (store, _guard) = open(dir.path());
    assert_eq!(signal_count(&store, &id).await, 2);
    assert_eq!(wakes(&store, &sid).await.len(), 1);
}

// ------------------------------------------------------------------ damage

/// Offsets of the records at the start of the journal file at `path`, in order.
fn record_offsets(path: &std::path::Path) -> Vec<usize> {
    let b = std::fs::read(path).expect("journal");
    let mut out = Vec::new();
    let mut at = 0;
    while at + 16 <= b.len() {
        let len = u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes")) as usize;
        if len == 0 {
            break;
        }
        out.push(at);
        at += 16 + len;
    }
    out
}

/// The journal file holding the newest records (the two alternate at each checkpoint).
fn newest_journal(dir: &std::path::Path) -> std::path::PathBuf {
    let paths = journal_paths(&dir.join("hub.redb"));
    let newest = |p: &std::path::Path| {
        Journal::open(p, 1 << 20)
            .expect("journal")
            .1
            .last()
            .map_or(0, |r| r.seq)
    };
    if newest(&paths[0]) >= newest(&paths[1]) {
        paths[0].clone()
    } else {
        paths[1].clone()
    }
}

/// A store in `dir` left by a crash with `n` signals in its journal only.
async fn crashed_with_signals(dir: &std::path::Path, n: usize) -> String {
    let (store, guard) = open(dir);
    let sid = session(&store).await;
    let (id, secret) = monitor(&store, &sid, 1_000).await;
    store.checkpoint().await;
    for i in 0..n {
        send(&store, progress(&id, &secret, &format!("k{i}")), T0 + 1).await;
    }
    crash(store, guard).await;
    id
}

#[tokio::test]
async fn damage_in_the_middle_of_the_journal_refuses_to_start_and_a_recovery_keeps_the_rest() {
    let dir = tempfile::tempdir().expect("tmp");
    let id = crashed_with_signals(dir.path(), 10).await;
    let jpath = newest_journal(dir.path());
    let offsets = record_offsets(&jpath);
    assert!(offsets.len() >= 10, "{offsets:?}");
    // One byte of the fourth signal's record flipped.
    let at = offsets[offsets.len() - 7] + 20;
    let mut bytes = std::fs::read(&jpath).expect("read");
    bytes[at] ^= 0xff;
    std::fs::write(&jpath, &bytes).expect("write");
    let err = match Store::open(&dir.path().join("hub.redb"), Settings::default()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a damaged journal was opened"),
    };
    assert!(err.contains("damaged"), "{err}");
    assert!(err.contains("--recover-journal"), "{err}");
    // The recovery keeps the nine readable signals and names the lost record.
    let r =
        Store::recover_journal(&dir.path().join("hub.redb"), Settings::default()).expect("recover");
    assert_eq!(r.applied, 9);
    assert_eq!(r.lost.len(), 1);
    assert_eq!(r.lost[0].0, r.lost[0].1, "one record lost");
    let (store, _guard) = open(dir.path());
    assert_eq!(signal_count(&store, &id).await, 9);
}

#[tokio::test]
async fn a_torn_last_record_is_an_end_not_damage() {
    let dir = tempfile::tempdir().expect("tmp");
    let id = crashed_with_signals(dir.path(), 5).await;
    let jpath = newest_journal(dir.path());
    let offsets = record_offsets(&jpath);
    let last = *offsets.last().expect("records");
    let mut bytes = std::fs::read(&jpath).expect("read");
    bytes[last + 20] ^= 0xff;
    std::fs::write(&jpath, &bytes).expect("write");
    let (store, _guard) = open(dir.path());
    assert_eq!(signal_count(&store, &id).await, 4);
}

#[tokio::test]
async fn a_missing_journal_after_a_crash_refuses_to_start_but_not_after_a_clean_stop() {
    let dir = tempfile::tempdir().expect("tmp");
    crashed_with_signals(dir.path(), 3).await;
    std::fs::remove_file(dir.path().join("hub.journal")).expect("rm");
    let err = match Store::open(&dir.path().join("hub.redb"), Settings::default()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a store missing its journal was opened"),
    };
    assert!(err.contains("missing"), "{err}");

    let clean = tempfile::tempdir().expect("tmp");
    let (store, guard) = open(clean.path());
    session(&store).await;
    drop(store);
    guard.join();
    std::fs::remove_file(clean.path().join("hub.journal")).expect("rm");
    let (store, _guard) = open(clean.path());
    assert_eq!(store.read(|r| r.sessions()).await.expect("read").len(), 1);
}

/// A session parked on a request of `kind` (as the runner parks one), and the request.
async fn parked(store: &Store, kind: &str, expires_at: Option<u64>) -> (String, PendingRequest) {
    let sid = session(store).await;
    let request = PendingRequest {
        id: "req_1".into(),
        kind: kind.into(),
        tool: "devices".into(),
        call_id: "call_1".into(),
        args: serde_json::json!({}),
        reason: "asked".into(),
        questions: Vec::new(),
        asked_at: T0,
        expires_at,
    };
    let (s, r) = (sid.clone(), request.clone());
    store
        .exec(move |t| {
            let mut rec = AgentRecord {
                runs: Some(true),
                ..AgentRecord::new(None)
            };
            t.park(&s, &mut rec, r)?;
            t.put_agent(&s, &rec)
        })
        .await
        .expect("park");
    (sid, request)
}

fn post(request_id: &str) -> PostAnswer {
    PostAnswer {
        request_id: request_id.into(),
        decision: None,
        always: false,
        args: None,
        data: None,
    }
}

#[tokio::test]
async fn an_answer_must_fit_what_waits_and_is_taken_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _g) = open(dir.path());
    let (sid, _) = parked(&store, "approval", None).await;
    let answer = |a: PostAnswer| {
        let s = sid.clone();
        store.exec(move |t| t.post_answer(&s, a, T0 + 1))
    };
    assert_eq!(
        answer(post("req_2")).await.expect("ok"),
        AnswerOutcome::NotPending
    );
    assert!(matches!(
        answer(post("req_1")).await.expect("ok"),
        AnswerOutcome::Invalid(_)
    ));
    let deny_with_args = PostAnswer {
        decision: Some(Decision::Deny),
        args: Some(serde_json::json!({"x": 1})),
        ..post("req_1")
    };
    assert!(matches!(
        answer(deny_with_args).await.expect("ok"),
        AnswerOutcome::Invalid(_)
    ));
    let allow_list_args = PostAnswer {
        decision: Some(Decision::Allow),
        args: Some(serde_json::json!([1])),
        ..post("req_1")
    };
    assert!(matches!(
        answer(allow_list_args).await.expect("ok"),
        AnswerOutcome::Invalid(_)
    ));
    let allow = PostAnswer {
        decision: Some(Decision::Allow),
        ..post("req_1")
    };
    let AnswerOutcome::Posted(first) = answer(allow.clone()).await.expect("ok") else {
        panic!("not posted");
    };
    assert!(!first.duplicate);
    let AnswerOutcome::Posted(again) = answer(allow).await.expect("ok") else {
        panic!("not posted");
    };
    assert!(again.duplicate && again.seq == first.seq, "{again:?}");
    let listed = store.exec(|t| t.pending_requests(10)).await.expect("list");
    assert_eq!(
        listed.len(),
        1,
        "still listed until the runner takes the answer"
    );
    let ses = sid.clone();
    let rec = store
        .exec(move |t| t.agent(&ses))
        .await
        .expect("rec")
        .expect("row");
    assert_eq!(
        rec.status,
        crate::store::agent::RunStatus::Ready,
        "the answer woke it"
    );
}

#[tokio::test]
async fn an_expired_approval_is_denied_by_timeout_and_a_question_needs_data() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _g) = open(dir.path());
    let (sid, _) = parked(&store, "approval", Some(T0 + 500)).await;
    let fired = store
        .exec(|t| t.fire_due(T0 + 600, &Default::default()))
        .await
        .expect("fire");
    assert_eq!(fired, 1);
    let evs = events(&store, &sid).await;
    let Some(EventBody::Answer(a)) = evs.last().map(|e| e.body.clone()) else {
        panic!("no answer: {evs:?}");
    };
    assert_eq!(
        (a.by.as_str(), a.decision),
        ("timeout", Some(Decision::Deny))
    );

    let (qsid, _) = parked(&store, "question", None).await;
    let s = qsid.clone();
    let out = store
        .exec(move |t| {
            let allow = PostAnswer {
                decision: Some(Decision::Allow),
                ..post("req_1")
            };
            t.post_answer(&s, allow, T0)
        })
        .await
        .expect("ok");
    assert!(matches!(out, AnswerOutcome::Invalid(_)), "{out:?}");
}

#[tokio::test]
async fn a_session_cancel_ends_it_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _g) = open(dir.path());
    let sid = session(&store).await;
    let (wp, _) = waitpoint(&store, &sid, params()).await;
    let s = sid.clone();
    let out = store
        .exec(move |t| t.post_cancel(&s, false, T0))
        .await
        .expect("cancel");
    assert!(matches!(out, CancelPosted::Posted(_)), "{out:?}");
    let s = sid.clone();
    let again = store
        .exec(move |t| t.post_cancel(&s, true, T0))
        .await
        .expect("cancel");
    assert_eq!(again, CancelPosted::Ended);
    let state = store
        .exec(move |t| t.get_wp(&wp))
        .await
        .expect("wp")
        .expect("exists")
        .state;
    assert_eq!(state, State::Cancelled);
    let s = sid.clone();
    assert!(
        store
            .exec(move |t| t.agent_cancelled(&s))
            .await
            .expect("read")
    );
}

#[tokio::test]
async fn silence_is_a_timer_that_wakes_once_per_spell() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, guard) = open(dir.path());
    let sid = session(&store).await;
    let p = CreateParams {
        silence_after: Some(cortex_protocol::waits::DurationValue::Seconds(5.0)),
        ..params()
    };
    let (id, secret) = waitpoint(&store, &sid, p).await;
    assert_eq!(next_timer(&store), Some(T0 + 5_000));
    let mut hb = sig(&id, &secret, Some("p1"));
    hb.req.status = Some(cortex_protocol::SignalStatus::Progress);
    send(&store, hb, T0 + 1_000).await;
    assert_eq!(
        next_timer(&store),
        Some(T0 + 6_000),
        "moved by the heartbeat"
    );
    drop(store);
    guard.join();

    let (store, _guard) = open(dir.path());
    assert_eq!(next_timer(&store), Some(T0 + 6_000), "durable");
    let fired = |at: u64| {
        let store = store.clone();
        async move { store.exec(move |t| t.fire_timers(at)).await.expect("fire") }
    };
    assert_eq!(fired(T0 + 6_000).await, 1);
    assert_eq!(fired(T0 + 60_000).await, 0, "once per spell");
    assert_eq!(wakes(&store, &sid).await, vec![WakeReason::Silent]);
    let text = events(&store, &sid)
        .await
        .into_iter()
        .find_map(|e| match e.body {
            EventBody::Wake(w) => Some(w.text),
            _ => None,
        })
        .expect("wake");
    assert!(
        text.contains("The last signal was progress via http"),
        "{text}"
    );
    let view = store
        .read(move |r| r.waitpoint(&id, T0 + 60_000, &Settings::default()))
        .await
        .expect("read")
        .expect("view");
    assert_eq!(view.head.state, "armed");
    assert_eq!(view.head.silence_after_ms, Some(5_000));
    assert_eq!(view.silence_due_at, None, "due again only after a signal");
}

#[tokio::test]
async fn a_spawning_monitor_starts_one_session_per_wake_in_the_deciding_write() {
    use crate::store::ops::SpawnSetup;
    let dir = tempfile::tempdir().expect("tmp");
    let (store, guard) = open(dir.path());
    let sid = session(&store).await;
    let p = CreateParams {
        max_signals: Some(3),
        spawn: Some(cortex_protocol::api::SpawnConfig {
            instructions: "triage it".into(),
            title: None,
        }),
        ..params()
    };
    let secret = crate::secret::new_secret();
    let hash = crate::secret::hash(&secret);
    // Without its setup the store refuses a spawn.
    let (s, p2) = (sid.clone(), p.clone());
    assert!(matches!(
        store
            .exec(move |t| t.create_waitpoint(&s, p2, hash, T0))
            .await
            .expect("create"),
        CreateOutcome::Invalid(crate::engine::CreateError::SpawnUnprepared)
    ));
    let setup = SpawnSetup {
        config: crate::store::agent::AgentConfig {
            instructions: "triage it".into(),
            ..Default::default()
        },
        prefix: vec![crate::model::ChatMessage::system("triage it")],
    };
    let s = sid.clone();
    let id = match store
        .exec(move |t| t.create_waitpoint_spawning(&s, p, hash, Some(setup), T0))
        .await
        .expect("create")
    {
        CreateOutcome::Created(wp) => wp.id,
        other => panic!("{other:?}"),
    };
    send(&store, sig(&id, &secret, Some("a")), T0 + 1).await;
    assert!(
        wakes(&store, &sid).await.is_empty(),
        "the parent is not woken"
    );
    crash(store, guard).await;

    let (store, _guard) = open(dir.path());
    send(&store, sig(&id, &secret, Some("a")), T0 + 2).await; // a duplicate
    send(&store, sig(&id, &secret, Some("b")), T0 + 3).await;
    let sessions = store.read(|r| r.sessions()).await.expect("sessions");
    let spawned: Vec<_> = sessions
        .iter()
        .filter(|s| s.spawned_from.is_some())
        .collect();
    assert_eq!(spawned.len(), 2, "one per wake: {sessions:?}");
    for (i, s) in spawned.iter().enumerate() {
        let from = s.spawned_from.as_ref().expect("from");
        assert_eq!(
            (from.waitpoint.as_str(), from.session.as_str()),
            (id.as_str(), sid.as_str())
        );
        assert_eq!(wakes(&store, &s.id).await, vec![WakeReason::Report]);
        let (sid2, n) = (s.id.clone(), i);
        let rec = store
            .read(move |r| r.agent(&sid2))
            .await
            .expect("read")
            .expect("a runner row");
        assert_eq!(
            rec.config.map(|c| c.instructions).as_deref(),
            Some("triage it")
        );
        assert_eq!(rec.prefix_len, 1, "fixed with its prefix ({n})");
        assert_ne!(
            rec.status,
            crate::store::agent::RunStatus::Idle,
            "ready to run"
        );
    }
    let view = store
        .read(move |r| r.waitpoint(&id, T0 + 4, &Settings::default()))
        .await
        .expect("read")
        .expect("view");
    let listed: Vec<_> = view
        .wakes
        .iter()
        .filter_map(|w| w.spawned.clone())
        .collect();
    let mut want: Vec<_> = spawned.iter().map(|s| s.id.clone()).collect();
    let mut got = listed.clone();
    want.sort();
    got.sort();
    assert_eq!(got, want);
    assert!(view.head.spawn);
}

#[tokio::test]
async fn a_waitpoint_expires_by_its_timer_without_a_sweep() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    let sid = session(&store).await;
    let p = CreateParams {
        expires_in_hours: Some(7.0 / 3600.0),
        ..params()
    };
    waitpoint(&store, &sid, p).await;
    assert_eq!(
        next_timer(&store),
        Some(T0 + 7_000),
        "the deadline is queued"
    );
    let fired = store
        .exec(|t| t.fire_timers(T0 + 7_000))
        .await
        .expect("fire");
    assert_eq!(fired, 1);
    assert_eq!(wakes(&store, &sid).await, vec![WakeReason::Expired]);
    assert_eq!(next_timer(&store), None);
}

#[tokio::test]
async fn a_consumer_position_moves_forward_only_and_goes_with_its_waitpoint() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, guard) = open(dir.path());
    let sid = session(&store).await;
    let (id, _) = waitpoint(&store, &sid, params()).await;
    let i = id.clone();
    let pos = move |name: &'static str| {
        let i = i.clone();
        move |t: &mut Tx<'_>| t.consumer_position(&i, name)
    };
    assert_eq!(store.exec(pos("loop")).await.expect("read"), Some(0));
    let i = id.clone();
    let moved = store
        .exec(move |t| t.advance_consumer(&i, "loop", 7))
        .await
        .expect("advance");
    assert_eq!(moved, Some(7));
    let i = id.clone();
    let back = store
        .exec(move |t| t.advance_consumer(&i, "loop", 3))
        .await
        .expect("advance");
    assert_eq!(back, Some(7), "never back");
    assert_eq!(store.exec(pos("other")).await.expect("read"), Some(0));
    let unknown = store
        .exec(|t| t.advance_consumer("wp_nope", "loop", 1))
        .await
        .expect("advance");
    assert_eq!(unknown, None);
    drop(store);
    guard.join();

    let (store, _guard) = open(dir.path());
    assert_eq!(
        store.exec(pos("loop")).await.expect("read"),
        Some(7),
        "durable"
    );
    let i = id.clone();
    store
        .exec(move |t| t.cancel_waitpoint(&i, None, "operator", T0 + 1))
        .await
        .expect("cancel");
    let d = crate::engine::DAY_MS;
    store
        .exec(move |t| t.sweep(T0 + 30 * d))
        .await
        .expect("sweep");
    assert_eq!(store.exec(pos("loop")).await.expect("read"), None, "purged");
    let left = store
        .read(|r| {
            let mut n = 0;
            for row in r.table(&tables::CONSUMERS).iter()? {
                row?;
                n += 1;
            }
            Ok(n)
        })
        .await
        .expect("count");
    assert_eq!(left, 0, "its rows went with it");
}

/// A runner row as a hub from before rows said whether a model runs them wrote it:
/// `instructions`, no `runs`, queued (as that hub queued every wake).
fn legacy_row(instructions: &str) -> AgentRecord {
    use crate::store::agent::AgentConfig;
    AgentRecord {
        config: Some(AgentConfig {
            instructions: instructions.into(),
            examples: Vec::new(),
            max_tokens: None,
            stop: Default::default(),
            policy: Default::default(),
            unattended: false,
            output: None,
            transport: None,
        }),
        ..AgentRecord::new(None)
    }
}

/// Stored sessions are decided once at the start: one that only ever held the default
/// instructions (the built-in ones or the hub's) and wakes is a mailbox and leaves the
/// queue a hub that ran every session left it in; one with instructions of its own stays
/// an agent session, queued.
#[tokio::test]
async fn stored_sessions_are_settled_once_and_a_queued_mailbox_leaves_the_queue() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    let builtin = session(&store).await;
    let hubs = session(&store).await;
    let own = session(&store).await;
    let rows = [
        (builtin.clone(), crate::session_state::DEFAULT_INSTRUCTIONS),
        (hubs.clone(), "You watch this lab's jobs."),
        (own.clone(), "Tell me when run 7 lands."),
    ];
    store
        .exec(move |t| {
            for (sid, instructions) in rows {
                let mut rec = legacy_row(instructions);
                t.make_ready(&sid, &mut rec)?;
                t.put_agent(&sid, &rec)?;
            }
            Ok(())
        })
        .await
        .expect("rows");
    assert!(store.read(|r| r.unsettled_runs()).await.expect("read"));
    let settled = store
        .exec(|t| t.settle_runs(Some("You watch this lab's jobs.")))
        .await
        .expect("settle");
    assert_eq!(settled, 3);
    let (b, h, o) = (builtin.clone(), hubs.clone(), own.clone());
    let (rows, queue) = store
        .read(move |r| {
            let rows = [r.agent(&b)?, r.agent(&h)?, r.agent(&o)?];
            Ok((rows, r.ready_after(0, 10)?))
        })
        .await
        .expect("read");
    let runs: Vec<Option<bool>> = rows
        .iter()
        .map(|r| r.as_ref().and_then(|r| r.runs))
        .collect();
    assert_eq!(runs, [Some(false), Some(false), Some(true)]);
    let queued: Vec<&str> = queue.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(
        queued,
        [own.as_str()],
        "only the agent session stays queued"
    );
    // A wake to a settled mailbox is recorded and queues nothing.
    let b = builtin.clone();
    store
        .exec(move |t| t.post_message(&b, "hi".into(), Default::default(), None, T0))
        .await
        .expect("post");
    let again = store.exec(|t| t.settle_runs(None)).await.expect("settle");
    assert_eq!(again, 0, "settled once");
    assert!(!store.read(|r| r.unsettled_runs()).await.expect("read"));
    let queue = store.read(|r| r.ready_after(0, 10)).await.expect("read");
    assert_eq!(queue.len(), 1, "{queue:?}");
}

/// A session's input put off for `limits.runsPerHour`: its `run-defer` timer makes it
/// ready at `until`, unless the wait was moved, ended or the session cancelled. (what is
/// done before the timer is due, whether it comes back ready)
#[tokio::test]
async fn a_run_put_off_for_the_hour_comes_back_ready_at_its_time() {
    use crate::store::agent::RunStatus;
    use cortex_protocol::api::RunInput;
    let until = T0 + 60_000;
    type Before = fn(&mut Tx<'_>, &str, &mut AgentRecord) -> Result<(), StoreError>;
    let cases: &[(&str, Before, bool)] = &[
        ("waits", |_, _, _| Ok(()), true),
        (
            "moved later",
            |t, sid, rec| t.set_run_defer(sid, rec, Some(T0 + 120_000)),
            false,
        ),
        (
            "ended",
            |t, sid, rec| t.set_run_defer(sid, rec, None),
            false,
        ),
        (
            "cancelled",
            |t, sid, rec| t.end_agent_session(sid, rec, T0),
            false,
        ),
    ];
    for (what, before, ready) in cases {
        let dir = tempfile::tempdir().expect("tmp");
        let (store, _g) = open(dir.path());
        let sid = session(&store).await;
        let (s, before) = (sid.clone(), *before);
        store
            .exec(move |t| {
                let mut rec = AgentRecord {
                    runs: Some(true),
                    ..AgentRecord::new(None)
                };
                rec.deferred.push(RunInput {
                    seq: 1,
                    kind: "wake".into(),
                    text: "it finished".into(),
                });
                t.set_run_defer(&s, &mut rec, Some(until))?;
                before(t, &s, &mut rec)?;
                t.put_agent(&s, &rec)
            })
            .await
            .expect("put off");
        let s = sid.clone();
        let rec = store
            .exec(move |t| {
                t.fire_due(until, &Default::default())?;
                t.agent(&s)
            })
            .await
            .expect("fire")
            .expect("row");
        assert_eq!(rec.status == RunStatus::Ready, *ready, "{what}: {rec:?}");
        if *ready {
            assert_eq!(rec.deferred.len(), 1, "{what}: the input is kept");
            assert_eq!(rec.deferred_until, None, "{what}: the wait ended");
        }
    }
}

/// A write larger than one journal record is refused as such (not as a full journal),
/// alone (a write sent beside it is taken), nothing of it is stored, and the store goes
/// on taking writes.
#[tokio::test]
async fn a_write_too_large_for_one_record_is_refused_for_what_it_is() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    let sid = session(&store).await;
    let before = events(&store, &sid).await.len();
    let message = |text: String| EventBody::Message {
        text,
        when: Default::default(),
        dedupe_key: None,
    };
    let (s, s2) = (sid.clone(), sid.clone());
    let huge = message("x".repeat(kernel::journal::MAX_RECORD + 1));
    let small = message("beside it".into());
    let (err, beside) = tokio::join!(
        store.exec(move |t| t.append_event(&s, huge, T0)),
        store.exec(move |t| t.append_event(&s2, small, T0)),
    );
    beside.expect("the write beside it is taken");
    let err = err.expect_err("refused");
    assert!(err.is_deterministic(), "{err}");
    let text = err.to_string();
    assert!(text.contains("more than one record"), "{text}");
    assert!(!text.contains("checkpoints"), "{text}");
    assert_eq!(
        events(&store, &sid).await.len(),
        before + 1,
        "nothing of it stored"
    );
    let s = sid.clone();
    store
        .exec(move |t| {
            t.append_event(
                &s,
                EventBody::Message {
                    text: "small".into(),
                    when: Default::default(),
                    dedupe_key: None,
                },
                T0,
            )
        })
        .await
        .expect("the next write is taken");
}
