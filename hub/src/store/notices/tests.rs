//! The outbox: a delivery's state machine (due, backoff, give up), a notice's fan-out and
//! end, and the store's side (queued once per event in the event's own write, only what
//! some target wants, across a crash; the pending list; the purge), with the events that
//! queue one (an approval, a question, a failed wake, an unanswered expiry) and those
//! that do not.

use cortex_protocol::api::{EventBody, PendingRequest, Question, WakeReason};

use super::*;
use crate::engine::CreateParams;
use crate::notify::{self, NoticeEvent, Verdict};
use crate::store::Store;
use crate::store::tests::{T0, crash, open, params, send, session, sig, waitpoint, wakes};

const ALL: u64 = u64::MAX;

fn targets(json: &str) -> Vec<Target> {
    let v: serde_json::Value = serde_json::from_str(json).expect("json");
    notify::parse(Some(&v)).expect("targets")
}

fn notice(event: NoticeEvent) -> Notice {
    Notice {
        event,
        title: "t".into(),
        text: "x".into(),
        session: None,
        waitpoint: None,
        device: None,
        at: T0,
    }
}

// ------------------------------------------------------------------ the state machine

#[test]
fn a_delivery_is_sent_retried_with_backoff_or_given_up() {
    use Outcome::*;
    let none = u64::MAX;
    // (verdicts in order, the outcomes, attempts after, ended sent / failed / pending)
    let retry = Verdict::Retry;
    let cases: Vec<(&str, Vec<Verdict>, Vec<Outcome>, &str)> = vec![
        ("2xx at once", vec![Verdict::Sent], vec![Sent], "sent"),
        (
            "500 then 200",
            vec![retry, Verdict::Sent],
            vec![Retry, Sent],
            "sent",
        ),
        (
            "404: refused, not retried",
            vec![Verdict::Refused],
            vec![GaveUp],
            "failed",
        ),
        (
            "a refusal after retries ends it too",
            vec![retry, retry, Verdict::Refused],
            vec![Retry, Retry, GaveUp],
            "failed",
        ),
        (
            "out of attempts",
            vec![retry; notify::MAX_ATTEMPTS as usize],
            [vec![Retry; notify::MAX_ATTEMPTS as usize - 1], vec![GaveUp]].concat(),
            "failed",
        ),
        (
            "the last attempt can still land",
            [
                vec![retry; notify::MAX_ATTEMPTS as usize - 1],
                vec![Verdict::Sent],
            ]
            .concat(),
            [vec![Retry; notify::MAX_ATTEMPTS as usize - 1], vec![Sent]].concat(),
            "sent",
        ),
    ];
    for (what, verdicts, want, end) in cases {
        let mut d = Delivery::new("hook", T0);
        assert!(d.due(T0), "{what}: due when queued");
        assert!(!d.due(T0 - 1), "{what}");
        let mut at = T0;
        let mut got = Vec::new();
        let mut last_delay = 0;
        for v in &verdicts {
            assert!(d.due(at), "{what}: attempted only when due");
            let o = d.attempted(*v, "HTTP 500", at, 1.0);
            if o == Retry {
                let delay = d.next_at - at;
                // Backoff: each wait at least as long as the last (doubling to the cap).
                assert!(delay >= last_delay, "{what}: {delay} after {last_delay}");
                assert!(!d.due(at + delay - 1), "{what}: not before its backoff");
                last_delay = delay;
                at = d.next_at;
            } else {
                at += 1;
            }
            got.push(o);
        }
        assert_eq!(got, want, "{what}");
        assert_eq!(d.attempts as usize, verdicts.len(), "{what}");
        let state = match &d.state {
            DeliveryState::Sent { .. } => "sent",
            DeliveryState::Failed { .. } => "failed",
            DeliveryState::Pending => "pending",
        };
        assert_eq!(state, end, "{what}");
        if end != "pending" {
            assert!(!d.due(none), "{what}: an ended delivery is never due again");
        }
    }
    // The backoff doubles from a second to its cap.
    let mut d = Delivery::new("hook", 0);
    let delays: Vec<u64> = (0..4)
        .map(|_| {
            let before = d.next_at;
            d.attempted(Verdict::Retry, "no answer", before, 1.0);
            d.next_at - before
        })
        .collect();
    assert_eq!(delays, vec![1_000, 2_000, 4_000, 8_000]);
    // Why it was given up is kept, without more than the answer's status.
    let mut d = Delivery::new("hook", 0);
    d.attempted(Verdict::Refused, "HTTP 403", 5, 0.5);
    assert_eq!(
        d.state,
        DeliveryState::Failed {
            at: 5,
            why: "refused: HTTP 403".into()
        }
    );
}

#[test]
fn a_notice_fans_out_to_the_targets_that_want_it_and_ends_with_the_last() {
    let ts = targets(
        r#"[{"type":"webhook","url":"http://127.0.0.1:9/a","name":"a"},
            {"type":"ntfy","url":"http://127.0.0.1:9/b","name":"b","events":["approval"]},
            {"type":"slack","url":"http://127.0.0.1:9/c","name":"c","events":["failed"]}]"#,
    );
    let mut rec = NoticeRecord {
        seq: 7,
        key: "k".into(),
        notice: notice(NoticeEvent::Failed),
        queued_at: T0,
        deliveries: None,
        done_at: None,
        taken: None,
    };
    assert_eq!(rec.next_due(), Some(T0), "due at once, before its fan-out");
    assert!(!rec.is_done());
    rec.fan_out(&ts, T0 + 1);
    let ds = rec.deliveries.clone().expect("fanned out");
    assert_eq!(
        ds.iter().map(|d| d.target.as_str()).collect::<Vec<_>>(),
        vec!["a", "c"]
    );
    // Fixed once: a second fan-out (a later pass) keeps what it has.
    rec.fan_out(&ts[..1], T0 + 2);
    assert_eq!(rec.deliveries.as_ref().map(Vec::len), Some(2));
    let Some(ds) = rec.deliveries.as_mut() else {
        unreachable!()
    };
    ds[0].attempted(Verdict::Sent, "HTTP 200", T0 + 3, 0.0);
    ds[1].attempted(Verdict::Retry, "HTTP 500", T0 + 3, 0.0);
    assert_eq!(
        rec.next_due(),
        Some(T0 + 3 + 500),
        "the pending one's retry"
    );
    assert!(!rec.is_done());
    let Some(ds) = rec.deliveries.as_mut() else {
        unreachable!()
    };
    ds[1].attempted(Verdict::Sent, "HTTP 200", T0 + 600, 0.0);
    assert!(rec.is_done());
    assert_eq!(rec.next_due(), None);
    assert_eq!(rec.id(), "n7");

    // No target wants it: done at its first pass.
    let mut rec = NoticeRecord {
        notice: notice(NoticeEvent::DeviceLost),
        deliveries: None,
        ..rec
    };
    rec.fan_out(&ts[1..], T0);
    assert!(rec.is_done());
}

// ------------------------------------------------------------------ the store

async fn wanted(store: &Store, mask: u64) {
    store
        .exec(move |t| t.set_notice_events(mask))
        .await
        .expect("mask");
}

async fn queue(store: &Store, key: &str, event: NoticeEvent) -> Option<u64> {
    let key = key.to_string();
    store
        .exec(move |t| t.queue_notice(&key, notice(event), T0))
        .await
        .expect("queue")
}

async fn all(store: &Store) -> Vec<NoticeRecord> {
    store.read(|r| r.notices_all()).await.expect("read")
}

async fn pending(store: &Store) -> Vec<NoticeRecord> {
    store.read(|r| r.notices_pending(100)).await.expect("read")
}

fn events_of(recs: &[NoticeRecord]) -> Vec<NoticeEvent> {
    recs.iter().map(|r| r.notice.event).collect()
}

/// What `hub` takes at `now` (held 100 ms): the seqs, and when it should look again.
async fn take(store: &Store, hub: &'static str, now: u64) -> (Vec<u64>, Option<u64>) {
    let got = store
        .exec(move |t| t.take_notices(hub, now, 100, 100))
        .await
        .expect("take");
    (got.due.iter().map(|r| r.seq).collect(), got.next)
}

#[tokio::test]
async fn hubs_sharing_the_outbox_take_each_due_notice_one_at_a_time() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, _guard) = open(dir.path());
    wanted(&store, NoticeEvent::Approval.bit()).await;
    queue(&store, "event:s:1", NoticeEvent::Approval).await;
    queue(&store, "event:s:2", NoticeEvent::Approval).await;
    // A takes both; B, a moment later, none: it looks again when A's hold ends.
    assert_eq!(take(&store, "a", T0).await, (vec![1, 2], None));
    assert_eq!(take(&store, "b", T0 + 10).await, (vec![], Some(T0 + 100)));
    // A records 1 sent, 2 to be retried later: its holds end with the record.
    let mut sent = Delivery::new("hook", T0);
    sent.attempted(Verdict::Sent, "HTTP 200", T0 + 20, 0.0);
    let mut again = Delivery::new("hook", T0);
    again.attempted(Verdict::Retry, "HTTP 500", T0 + 20, 0.0);
    let retry_at = again.next_at;
    for (seq, d) in [(1, sent), (2, again)] {
        store
            .exec(move |t| t.notice_progress(seq, vec![d], T0 + 20))
            .await
            .expect("progress");
    }
    // Not due yet: nobody takes 2, and both hubs know when it is.
    assert_eq!(take(&store, "b", T0 + 30).await, (vec![], Some(retry_at)));
    // Due: whichever hub looks first takes it, the other not.
    assert_eq!(take(&store, "b", retry_at).await, (vec![2], None));
    assert_eq!(
        take(&store, "a", retry_at).await,
        (vec![], Some(retry_at + 100))
    );
    // B died sending: once its hold ended, A takes it.
    assert_eq!(take(&store, "a", retry_at + 100).await, (vec![2], None));
    // A hub started again under its name takes back what it held.
    assert_eq!(take(&store, "a", retry_at + 101).await, (vec![2], None));
}

#[tokio::test]
async fn a_notice_is_queued_once_per_event_only_when_wanted_and_survives_a_crash() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, guard) = open(dir.path());
    // No target (the default): nothing is queued at all.
    assert_eq!(
        queue(&store, "event:s:1", NoticeEvent::Approval).await,
        None
    );
    wanted(&store, NoticeEvent::Approval.bit()).await;
    assert_eq!(queue(&store, "event:s:2", NoticeEvent::Failed).await, None);
    assert_eq!(
        queue(&store, "event:s:3", NoticeEvent::Approval).await,
        Some(1)
    );
    assert_eq!(
        queue(&store, "event:s:3", NoticeEvent::Approval).await,
        None,
        "the same event again"
    );
    assert_eq!(
        queue(&store, "event:s:4", NoticeEvent::Approval).await,
        Some(2)
    );
    crash(store, guard).await;

    let (store, guard) = open(dir.path());
    let recs = pending(&store).await;
    assert_eq!(recs.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(recs[0].key, "event:s:3");
    assert_eq!(
        queue(&store, "event:s:3", NoticeEvent::Approval).await,
        None,
        "still once after the crash"
    );
    assert_eq!(
        queue(&store, "event:s:5", NoticeEvent::Approval).await,
        Some(3),
        "seqs go on"
    );

    // Delivered: it leaves the pending list, durably.
    let mut d = Delivery::new("hook", T0);
    d.attempted(Verdict::Sent, "HTTP 200", T0 + 1, 0.0);
    let done = vec![d.clone()];
    assert!(
        store
            .exec(move |t| t.notice_progress(1, done, T0 + 1))
            .await
            .expect("progress")
    );
    let mut retry = Delivery::new("hook", T0);
    retry.attempted(Verdict::Retry, "HTTP 500", T0 + 1, 0.0);
    let half = vec![retry.clone()];
    store
        .exec(move |t| t.notice_progress(2, half, T0 + 1))
        .await
        .expect("progress");
    assert!(
        !store
            .exec(|t| t.notice_progress(99, Vec::new(), T0))
            .await
            .expect("progress"),
        "gone"
    );
    crash(store, guard).await;

    let (store, _guard) = open(dir.path());
    let recs = pending(&store).await;
    assert_eq!(recs.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![2, 3]);
    assert_eq!(
        recs[0].deliveries.as_deref(),
        Some(&[retry][..]),
        "the attempt and its backoff are kept"
    );
    let kept = all(&store).await;
    assert_eq!(kept[0].done_at, Some(T0 + 1));
    assert_eq!(kept[0].deliveries.as_deref(), Some(&[d][..]));

    // Done a day ago: forgotten, its key with it; pending ones stay.
    assert_eq!(
        store
            .exec(|t| t.purge_notices(T0 + 1, 10))
            .await
            .expect("purge"),
        0,
        "not yet"
    );
    assert_eq!(
        store
            .exec(|t| t.purge_notices(T0 + 2, 10))
            .await
            .expect("purge"),
        1
    );
    assert_eq!(
        all(&store).await.iter().map(|r| r.seq).collect::<Vec<_>>(),
        vec![2, 3]
    );
}

fn approval(kind: &str) -> EventBody {
    EventBody::ApprovalRequired {
        run_id: "r".into(),
        step: 1,
        approval: PendingRequest {
            id: "req_1".into(),
            kind: kind.into(),
            tool: if kind == "question" {
                "ask_user".into()
            } else {
                "device_exec".into()
            },
            call_id: "c".into(),
            args: serde_json::json!({"token": "tok_NEVER_SHOWN"}),
            reason: "policy requireApproval".into(),
            questions: if kind == "question" {
                vec![Question {
                    question: "Which branch?".into(),
                    options: vec!["main".into(), "dev".into()],
                    multi: false,
                }]
            } else {
                Vec::new()
            },
            asked_at: T0,
            expires_at: None,
        },
    }
}

#[tokio::test]
async fn what_asks_a_person_or_went_wrong_is_queued_with_its_event_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, guard) = open(dir.path());
    wanted(&store, ALL).await;
    let sid = session(&store).await;

    // Asked: an approval and a question, each one notice.
    for kind in ["approval", "question"] {
        let (s, body) = (sid.clone(), approval(kind));
        store
            .exec(move |t| t.append_event(&s, body, T0))
            .await
            .expect("append");
    }
    // A message is not.
    let s = sid.clone();
    store
        .exec(move |t| {
            t.append_event(
                &s,
                EventBody::Message {
                    text: "hi".into(),
                    when: Default::default(),
                    dedupe_key: None,
                },
                T0,
            )
        })
        .await
        .expect("append");

    // A waitpoint that fired is not; one whose job failed is.
    let (ok, ok_secret) = waitpoint(&store, &sid, params()).await;
    send(&store, sig(&ok, &ok_secret, None), T0 + 1).await;
    let (bad, bad_secret) = waitpoint(&store, &sid, params()).await;
    let mut failing = sig(&bad, &bad_secret, None);
    failing.req.status = Some(cortex_protocol::SignalStatus::Fail);
    failing.req.message = Some("exit 3".into());
    send(&store, failing, T0 + 2).await;

    // Expiries: a one-shot nobody answered is told, and a monitor that never heard; a
    // monitor that heard its job is not (its life just ended).
    let short = || CreateParams {
        expires_in_hours: Some(1.0),
        ..params()
    };
    waitpoint(&store, &sid, short()).await;
    let (silent_mon, _) = waitpoint(
        &store,
        &sid,
        CreateParams {
            max_signals: Some(5),
            ..short()
        },
    )
    .await;
    let (heard_mon, heard_secret) = waitpoint(
        &store,
        &sid,
        CreateParams {
            max_signals: Some(5),
            ..short()
        },
    )
    .await;
    send(&store, sig(&heard_mon, &heard_secret, None), T0 + 3).await;
    let h = crate::engine::HOUR_MS;
    store.exec(move |t| t.sweep(T0 + h)).await.expect("sweep");
    assert_eq!(
        wakes(&store, &sid)
            .await
            .iter()
            .filter(|r| **r == WakeReason::Expired)
            .count(),
        3,
        "three expired"
    );

    let recs = all(&store).await;
    assert_eq!(
        events_of(&recs),
        vec![
            NoticeEvent::Approval,
            NoticeEvent::Question,
            NoticeEvent::Failed,
            NoticeEvent::Expired,
            NoticeEvent::Expired,
        ],
        "{recs:#?}"
    );
    assert!(
        recs[1].notice.text.contains("Which branch? (main / dev)"),
        "{}",
        recs[1].notice.text
    );
    assert_eq!(recs[2].notice.waitpoint.as_deref(), Some(bad.as_str()));
    assert!(
        recs[2].notice.text.contains("exit 3"),
        "{}",
        recs[2].notice.text
    );
    let expired: Vec<Option<&str>> = recs[3..]
        .iter()
        .map(|r| r.notice.waitpoint.as_deref())
        .collect();
    assert!(expired.contains(&Some(silent_mon.as_str())), "{expired:?}");
    assert!(!expired.contains(&Some(heard_mon.as_str())), "{expired:?}");
    assert!(
        recs.iter()
            .all(|r| r.notice.session.as_deref() == Some(sid.as_str()))
    );
    // Each keyed by its event: the session's event seq.
    assert!(
        recs.iter()
            .all(|r| r.key.starts_with(&format!("event:{sid}:")))
    );
    // Nothing secret in any of them: not a waitpoint's secret, not a call's arguments.
    let json = serde_json::to_string(&recs).expect("json");
    for secret in [&ok_secret, &bad_secret, &heard_secret] {
        assert!(!json.contains(secret.as_str()));
    }
    assert!(!json.contains("tok_NEVER_SHOWN"));

    // A restart queues nothing again (what fell due is not re-delivered either).
    crash(store, guard).await;
    let (store, _guard) = open(dir.path());
    store
        .exec(move |t| t.sweep(T0 + 2 * h))
        .await
        .expect("sweep");
    assert_eq!(all(&store).await.len(), 5);
}
