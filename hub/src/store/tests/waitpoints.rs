//! Sessions, waitpoints and their signals, wakes, timers and sweeps.

use super::*;
use crate::engine::State;
use crate::store::ops::CancelOutcome;

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
