//! The writer and its journal: what it commits, replays after a crash and refuses.

use super::*;

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
    let committed = read_now(store.redb(), &ctx(), |r| r.journal_seq()).expect("meta");
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
    let mut landed = store.landed();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        landed.wait_for(|l| *l > 0),
    )
    .await
    .expect("a checkpoint within 30 s")
    .expect("the writer runs");
    let committed = read_now(store.redb(), &ctx(), |r| {
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
