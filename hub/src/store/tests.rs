use super::*;
use crate::engine::{CreateParams, State};
use crate::store::ops::{CancelOutcome, CreateOutcome};
use cortex_protocol::SignalRequest;
use cortex_protocol::api::{Event, EventBody, WakeReason};

const T0: u64 = 1_796_000_000_000;

fn open(dir: &std::path::Path) -> (Store, WriterGuard) {
    Store::open(&dir.join("hub.redb"), Settings::default()).expect("open")
}

async fn session(store: &Store) -> String {
    store
        .exec(|t| t.create_session(Some("t".into()), T0))
        .await
        .expect("session")
        .id
}

async fn waitpoint(store: &Store, sid: &str, p: CreateParams) -> (String, String) {
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

fn params() -> CreateParams {
    CreateParams {
        label: "job".into(),
        intent: "look at it".into(),
        ..Default::default()
    }
}

fn sig(id: &str, secret: &str, key: Option<&str>) -> SignalIn {
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

async fn send(store: &Store, s: SignalIn, now: u64) -> SignalOutcome {
    store
        .exec(move |t| t.signal(&s, now))
        .await
        .expect("signal")
}

fn events(store: &Store, sid: &str) -> Vec<Event> {
    store
        .read(|r| r.events_after(sid, 0, 1000))
        .expect("read")
        .expect("session")
        .iter()
        .map(|b| serde_json::from_slice(b).expect("event json"))
        .collect()
}

fn wakes(store: &Store, sid: &str) -> Vec<WakeReason> {
    events(store, sid)
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
    assert_eq!(wakes(&store, &sid), vec![WakeReason::Fired]);

    drop(store);
    guard.join();
    let (store, _guard) = open(dir.path());
    assert_eq!(wakes(&store, &sid), vec![WakeReason::Fired]);
    let view = store
        .read(|r| r.waitpoint(&id, T0, &Settings::default()))
        .expect("read")
        .expect("wp");
    assert_eq!(view.state, "resolved");
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
    assert_eq!(*store.next_timer.borrow(), Some(T0 + 20 + 3_000));
    assert!(wakes(&store, &sid).is_empty());
    drop(store);
    guard.join();

    let (store, _guard) = open(dir.path());
    assert_eq!(
        *store.next_timer.borrow(),
        Some(T0 + 3_020),
        "the timer is durable"
    );
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
    assert_eq!(wakes(&store, &sid), vec![WakeReason::Fired]);
    assert_eq!(*store.next_timer.borrow(), None);
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
    assert_eq!(wakes(&store, &sid), vec![WakeReason::Expired]);
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
    assert_eq!(store.read(|r| r.deadline_count()).expect("count"), 20);
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
    assert!(store.read(|r| r.session(&sid)).expect("read").is_none());
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
            .read(|r| r.waitpoint(id, T0, &Settings::default()))
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
