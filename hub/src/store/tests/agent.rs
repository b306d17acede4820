//! The agent rows: requests parked and answered, cancels, settling and putting off runs.

use super::*;
use crate::engine::State;
use crate::store::agent::AgentRecord;
use crate::store::posts::{AnswerOutcome, CancelPosted};
use cortex_protocol::api::{Decision, PendingRequest, PostAnswer};

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
