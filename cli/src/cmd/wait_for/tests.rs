//! Tests of `cortex wait for` against a fake hub on port 0: every exit a `cortex wait`
//! can take (0 fired, 1 timed out or expired, 2 broke, 3 fired with a failure), and the requests it makes (cursor first, then state, then long polls).

use std::collections::VecDeque;

use cortex_protocol::api::{
    Badges, SessionView, WaitpointHead, WaitpointView, WakeReason, WakeView,
};
use serde_json::json;

use super::*;
use crate::testserver::{TestServer, json as answer, refused_addr};

const FAR: u64 = 4_000_000_000_000;

fn view(state: &str, expires_at: u64, wakes: Vec<WakeView>, device: Option<&str>) -> String {
    let v = WaitpointView {
        head: WaitpointHead {
            id: "wp_1".into(),
            session: "ses_1".into(),
            label: "nightly".into(),
            intent: "compare the loss".into(),
            state: state.into(),
            created_at: 1,
            expires_at,
            members: vec![],
            quorum: 1,
            fail_fast: true,
            max_signals: 1,
            device: device.map(Into::into),
            silence_after_ms: None,
            coalesce_ms: None,
            spawn: false,
        },
        resolved_at: None,
        silence_due_at: None,
        signal_count: 0,
        signals: vec![],
        wakes,
        badges: Badges {
            wake_limit_reached: false,
            delivery_attempts: 0,
            wakes_this_hour: 0,
            max_wakes_per_hour: 12,
        },
        progress: None,
    };
    serde_json::to_string(&v).expect("ser")
}

fn session(last_seq: u64) -> String {
    let s = SessionView {
        id: "ses_1".into(),
        title: None,
        created_at: 1,
        last_seq,
        armed_waitpoints: 1,
        spawned_from: None,
        runs: false,
        state: Default::default(),
        config: None,
    };
    serde_json::to_string(&s).expect("ser")
}

fn wake(seq: u64, wp: &str, reason: &str) -> Value {
    json!({"seq": seq, "ts": 1_700_000_000_000u64, "kind": "wake",
        "waitpoint": {"id": wp, "label": "nightly", "intent": "compare the loss"},
        "reason": reason, "waited_ms": 5, "signals": [], "omitted": 0, "text": "woke: 33k steps"})
}

fn page(events: Vec<Value>) -> Vec<u8> {
    answer(200, &json!({ "events": events }).to_string())
}

/// A hub that answers the waitpoint with `states` in turn (the last one repeats), the
/// session with `last_seq`, a plain events read from `log`, and each long poll with the
/// next of `polls` (then 404: a test that polls too far ends rather than hangs).
struct Fake {
    states: Vec<&'static str>,
    expires_at: u64,
    wakes: Vec<WakeView>,
    last_seq: u64,
    log: Vec<Value>,
    polls: Vec<Vec<u8>>,
    /// The device a remote wait's waitpoint is bound to.
    device: Option<&'static str>,
}

impl Fake {
    fn armed(polls: Vec<Vec<u8>>) -> Fake {
        Fake {
            states: vec!["armed"],
            expires_at: FAR,
            wakes: vec![],
            last_seq: 5,
            log: vec![],
            polls,
            device: None,
        }
    }

    fn serve(self) -> TestServer {
        let mut states: VecDeque<&str> = self.states.into();
        let mut polls: VecDeque<Vec<u8>> = self.polls.into();
        let (expires_at, wakes, last_seq, log, device) = (
            self.expires_at,
            self.wakes,
            self.last_seq,
            self.log,
            self.device,
        );
        TestServer::handler(move |req| {
            let p = req.path.as_str();
            let not_found = answer(404, r#"{"error":"not_found","message":"no such thing"}"#);
            Some(if p == "/api/waitpoints/wp_1" {
                let state = if states.len() > 1 {
                    states.pop_front()
                } else {
                    states.front().copied()
                };
                answer(
                    200,
                    &view(state.unwrap_or("armed"), expires_at, wakes.clone(), device),
                )
            } else if p == "/api/sessions/ses_1" {
                answer(200, &session(last_seq))
            } else if p.starts_with("/api/sessions/ses_1/events?") && p.contains("&wait=") {
                polls.pop_front().unwrap_or(not_found)
            } else if let Some(after) = p.strip_prefix("/api/sessions/ses_1/events?after=") {
                let after: u64 = after.parse().expect("after");
                page(
                    log.iter()
                        .filter(|e| e["seq"].as_u64() > Some(after))
                        .cloned()
                        .collect(),
                )
            } else {
                not_found
            })
        })
    }
}

fn wait(server: &TestServer, timeout: Option<Duration>) -> (u8, String, String) {
    let hub = Hub::new(&server.url(""), "tok").expect("hub");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run(&hub, "wp_1", timeout, &mut out, &mut err);
    (
        code,
        String::from_utf8(out).expect("utf8"),
        String::from_utf8(err).expect("utf8"),
    )
}

fn paths(server: &TestServer) -> Vec<String> {
    server.requests().into_iter().map(|r| r.path).collect()
}

#[test]
fn waits_for_this_waitpoints_wake_and_prints_it_as_one_line() {
    let message = json!({"seq": 6, "ts": 1, "kind": "message", "text": "hi", "when": "next_turn"});
    let armed = json!({"seq": 8, "ts": 1, "kind": "waitpoint-armed", "waitpoint": {"id": "wp_2", "label": "x", "intent": "y"}});
    let server = Fake::armed(vec![
        page(vec![]),
        page(vec![
            message,
            wake(7, "wp_other", "fired"),
            armed,
            json!({"seq": 9, "ts": 1, "kind": "run-start"}),
        ]),
        page(vec![wake(10, "wp_1", "fired")]),
    ])
    .serve();
    let (code, out, err) = wait(&server, None);
    assert_eq!(code, FIRED, "{err}");
    assert_eq!(out.lines().count(), 1);
    let printed: Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert_eq!(printed, wake(10, "wp_1", "fired"));
    assert_eq!(err.lines().count(), 2, "{err}");
    assert!(err.contains("waiting for wp_1 \"nightly\""), "{err}");
    assert!(
        err.lines()
            .last()
            .is_some_and(|l| l.ends_with("cortex wait for wp_1 --after 10")),
        "the seq to resume after: {err}"
    );
    assert_eq!(
        paths(&server),
        [
            "/api/waitpoints/wp_1",
            "/api/sessions/ses_1",
            "/api/waitpoints/wp_1",
            "/api/sessions/ses_1/events?after=5&wait=30",
            "/api/sessions/ses_1/events?after=5&wait=30",
            "/api/sessions/ses_1/events?after=9&wait=30",
        ]
    );
}

#[test]
fn sends_the_operator_token() {
    let server = Fake::armed(vec![page(vec![wake(6, "wp_1", "failed")])]).serve();
    let (code, _, _) = wait(&server, None);
    assert_eq!(code, FAILED, "fired, and the job reported failure");
    assert!(
        server
            .requests()
            .iter()
            .all(|r| r.header("authorization") == Some("Bearer tok"))
    );
}

#[test]
fn an_expired_wake_exits_1_with_the_wake() {
    let server = Fake::armed(vec![page(vec![wake(6, "wp_1", "expired")])]).serve();
    let (code, out, _) = wait(&server, None);
    assert_eq!(code, TIMED_OUT);
    assert_eq!(
        serde_json::from_str::<Value>(out.trim()).expect("json"),
        wake(6, "wp_1", "expired")
    );
}

#[test]
fn cancelled_while_waiting_breaks() {
    let cancel = json!({"seq": 6, "ts": 1, "kind": "waitpoint-cancelled",
        "waitpoint": {"id": "wp_1", "label": "nightly", "intent": "i"}, "by": "operator"});
    let server = Fake::armed(vec![page(vec![cancel])]).serve();
    let (code, out, err) = wait(&server, None);
    assert_eq!(code, BROKE);
    assert_eq!(out, "");
    assert!(err.contains("wp_1 was cancelled by operator"), "{err}");
}

/// A hub whose waitpoint is already resolved, its fired wake delivered into `log`.
fn resolved(log: Vec<Value>) -> Fake {
    let mut fake = Fake::armed(vec![]);
    fake.states = vec!["resolved"];
    fake.wakes = vec![WakeView {
        reason: WakeReason::Fired,
        at: 3,
        delivered: true,
        spawned: None,
    }];
    fake.log = log;
    fake
}

#[test]
fn already_resolved_prints_its_last_wake_without_polling() {
    let fake = resolved(vec![
        wake(2, "wp_1", "report"),
        json!({"seq": 3, "ts": 1, "kind": "message", "text": "x", "when": "now"}),
        wake(4, "wp_1", "fired"),
        wake(5, "wp_9", "fired"),
    ]);
    let server = fake.serve();
    let (code, out, err) = wait(&server, None);
    assert_eq!(code, FIRED, "{err}");
    assert!(err.contains("wp_1 is resolved; its last wake"), "{err}");
    assert_eq!(
        serde_json::from_str::<Value>(out.trim()).expect("json"),
        wake(4, "wp_1", "fired")
    );
    assert!(!paths(&server).iter().any(|p| p.contains("wait=")));
}

#[test]
fn a_caller_that_just_armed_it_gets_its_wake_without_the_already_line() {
    // `cortex wait pid --device` arms the waitpoint, says so, and then waits: a process
    // that ended before the first look is simply the outcome, not news from the past.
    let server = resolved(vec![wake(4, "wp_1", "fired")]).serve();
    let hub = Hub::new(&server.url(""), "tok").expect("hub");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let how = How {
        announce: false,
        payload: false,
    };
    let code = run_with(&hub, "wp_1", None, how, &mut out, &mut err);
    assert_eq!(code, FIRED);
    assert_eq!(String::from_utf8(err).expect("utf8"), "");
    let out = String::from_utf8(out).expect("utf8");
    assert_eq!(
        serde_json::from_str::<Value>(out.trim()).expect("json"),
        wake(4, "wp_1", "fired")
    );
}

#[test]
fn resolved_with_its_wake_still_due_waits_for_it() {
    let mut fake = Fake::armed(vec![page(vec![wake(6, "wp_1", "fired")])]);
    fake.states = vec!["resolved"];
    fake.wakes = vec![WakeView {
        reason: WakeReason::Fired,
        at: 3,
        delivered: false,
        spawned: None,
    }];
    let (code, out, err) = wait(&fake.serve(), None);
    assert_eq!(code, FIRED, "{err}");
    assert!(out.contains("\"seq\":6"), "{out}");
}

#[test]
fn a_wake_between_the_cursor_and_the_state_is_found() {
    // Armed when first read, resolved by the time it is read again after the cursor.
    let mut fake = Fake::armed(vec![]);
    fake.states = vec!["armed", "resolved"];
    fake.log = vec![wake(6, "wp_1", "fired")];
    let (code, out, err) = wait(&fake.serve(), None);
    assert_eq!(code, FIRED, "{err}");
    assert!(out.contains("\"seq\":6"), "{out}");
}

#[test]
fn already_cancelled_breaks() {
    let mut fake = Fake::armed(vec![]);
    fake.states = vec!["cancelled"];
    let (code, out, err) = wait(&fake.serve(), None);
    assert_eq!((code, out.as_str()), (BROKE, ""));
    assert!(err.contains("cancelled"), "{err}");
}

#[test]
fn unknown_waitpoint_breaks() {
    let server = TestServer::handler(|_| {
        Some(answer(
            404,
            r#"{"error":"unknown_waitpoint","message":"no wp_1"}"#,
        ))
    });
    let (code, _, err) = wait(&server, Some(Duration::from_secs(60)));
    assert_eq!(code, BROKE);
    assert!(err.contains("unknown waitpoint wp_1"), "{err}");
}

#[test]
fn session_gone_while_waiting_breaks() {
    let (code, _, err) = wait(&Fake::armed(vec![]).serve(), None);
    assert_eq!(code, BROKE);
    assert!(err.contains("session ses_1 of wp_1 is gone"), "{err}");
}

#[test]
fn a_hub_never_reached_breaks_at_once_saying_so() {
    let hub = Hub::new(&format!("http://{}", refused_addr()), "tok").expect("hub");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let started = Instant::now();
    // A bound of an hour: a hub that never answered is not waited out.
    let code = run(
        &hub,
        "wp_1",
        Some(Duration::from_secs(3600)),
        &mut out,
        &mut err,
    );
    assert_eq!(code, BROKE);
    assert!(started.elapsed() < Duration::from_secs(60), "at once");
    let err = String::from_utf8(err).expect("utf8");
    assert!(
        err.contains("cannot reach the hub") && err.contains("nothing was waited for"),
        "{err}"
    );
    assert!(out.is_empty());
}

#[test]
fn a_silent_wake_has_its_own_exit_status() {
    let mut sink = Vec::new();
    assert_eq!(exit_status(&wake(3, "wp_1", "silent"), &mut sink), SILENT);
    assert_eq!(exit_status(&wake(3, "wp_1", "fired"), &mut sink), FIRED);
    assert_eq!(exit_status(&wake(3, "wp_1", "report"), &mut sink), FIRED);
    assert_eq!(exit_status(&wake(3, "wp_1", "failed"), &mut sink), FAILED);
    assert_eq!(
        exit_status(&wake(3, "wp_1", "expired"), &mut sink),
        TIMED_OUT
    );
}

#[test]
fn after_a_seq_it_prints_a_wake_that_came_before_it_started() {
    let mut fake = Fake::armed(vec![]);
    fake.last_seq = 12;
    fake.log = vec![
        wake(4, "wp_1", "report"),
        wake(7, "wp_other", "fired"),
        wake(9, "wp_1", "report"),
    ];
    let server = fake.serve();
    let hub = Hub::new(&server.url(""), "tok").expect("hub");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_from(&hub, "wp_1", None, From::After(4), &mut out, &mut err);
    let err = String::from_utf8(err).expect("utf8");
    assert_eq!(code, FIRED, "{err}");
    let printed: Value =
        serde_json::from_str(String::from_utf8(out).expect("utf8").trim()).expect("json");
    assert_eq!(printed["seq"], 9, "the first of wp_1's after seq 4");
    assert!(err.contains("--after 9"), "{err}");
}

#[test]
fn after_its_last_wake_an_ended_waitpoint_breaks_rather_than_repeating_it() {
    let mut fake = Fake::armed(vec![]);
    fake.states = vec!["resolved"];
    fake.wakes = vec![WakeView {
        reason: WakeReason::Fired,
        at: 1,
        delivered: true,
        spawned: None,
    }];
    fake.log = vec![wake(9, "wp_1", "fired")];
    let server = fake.serve();
    let hub = Hub::new(&server.url(""), "tok").expect("hub");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_from(&hub, "wp_1", None, From::After(9), &mut out, &mut err);
    let err = String::from_utf8(err).expect("utf8");
    assert_eq!(code, BROKE, "{err}");
    assert!(err.contains("no wake after seq 9"), "{err}");
    assert!(out.is_empty());
}

#[test]
fn the_bound_passing_times_out() {
    let server = Fake::armed(vec![]).serve();
    let (code, out, err) = wait(&server, Some(Duration::ZERO));
    assert_eq!((code, out.as_str()), (TIMED_OUT, ""));
    assert!(err.contains("timed out"), "{err}");
    assert!(!paths(&server).iter().any(|p| p.contains("wait=")));
}

#[test]
fn without_a_timeout_the_bound_is_the_expiry_plus_grace() {
    let mut fake = Fake::armed(vec![]);
    fake.expires_at = timefmt::now_ms() - 3 * 60_000;
    let (code, _, err) = wait(&fake.serve(), None);
    assert_eq!(code, TIMED_OUT, "{err}");
}

#[test]
fn a_short_timeout_shortens_the_long_poll() {
    let server = Fake::armed(vec![page(vec![wake(6, "wp_1", "fired")])]).serve();
    let (code, _, _) = wait(&server, Some(Duration::from_secs(10)));
    assert_eq!(code, FIRED);
    let polls: Vec<String> = paths(&server)
        .into_iter()
        .filter(|p| p.contains("wait="))
        .collect();
    assert_eq!(polls, ["/api/sessions/ses_1/events?after=5&wait=10"]);
}

#[test]
fn a_failing_hub_is_asked_again() {
    let server = Fake::armed(vec![
        answer(503, r#"{"error":"unavailable","message":"restarting"}"#),
        page(vec![wake(6, "wp_1", "fired")]),
    ])
    .serve();
    let (code, _, err) = wait(&server, Some(Duration::from_secs(60)));
    assert_eq!(code, FIRED, "{err}");
}

fn device_wake(seq: u64, outcome: &str, message: &str) -> Value {
    let mut w = wake(
        seq,
        "wp_1",
        if outcome == "fired" {
            "fired"
        } else {
            "failed"
        },
    );
    w["signals"] = json!([{
        "status": if outcome == "fired" { "ok" } else { "fail" },
        "message": message, "member": null,
        "data": json!({"outcome": outcome, "device": "gpu1", "kind": "pid", "payload": {}}).to_string(),
        "source": "device-wait", "key": "device-wait:wp_1", "at": 1,
    }]);
    w
}

#[test]
fn a_remote_waits_outcome_decides_the_exit_status() {
    for (outcome, code) in [("fired", FIRED), ("timed_out", TIMED_OUT), ("broke", BROKE)] {
        let message = format!("the wait {outcome}");
        let server = Fake::armed(vec![page(vec![device_wake(6, outcome, &message)])]).serve();
        let (got, out, err) = wait(&server, None);
        assert_eq!(got, code, "{outcome}: {err}");
        assert_eq!(out.lines().count(), 1, "the wake, as for any wait");
        // Why it did not fire is said on stderr; a fire needs no words.
        assert_eq!(err.contains(&message), outcome != "fired", "{err}");
    }
    // A failure signal from elsewhere (a job holding the secret) is still a fired wait.
    let w = wake(6, "wp_1", "failed");
    assert_eq!(device_wait_outcome(&w), None);
}

#[test]
fn a_remote_waits_loss_report_is_passed_over_and_the_wait_goes_on() {
    // The hub's report that the device has been offline past the grace: the wait stays
    // armed, so nothing is printed and the outcome that follows decides.
    let mut fake = Fake::armed(vec![
        page(vec![wake(6, "wp_1", "report")]),
        page(vec![device_wake(7, "fired", "pid 4242 (python) exited")]),
    ]);
    fake.device = Some("gpu1");
    let (code, out, err) = wait(&fake.serve(), None);
    assert_eq!(code, FIRED, "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.contains("\"seq\":7"), "{out}");
    assert!(!err.contains("report"), "{err}");

    // Resolved already, its outcome's wake still on its way: the report is not it.
    let mut fake = Fake::armed(vec![page(vec![device_wake(7, "broke", "gone")])]);
    fake.device = Some("gpu1");
    fake.states = vec!["resolved"];
    fake.wakes = vec![WakeView {
        reason: WakeReason::Failed,
        at: 3,
        delivered: false,
        spawned: None,
    }];
    fake.log = vec![wake(6, "wp_1", "report")];
    let (code, out, err) = wait(&fake.serve(), None);
    assert_eq!(code, BROKE, "{err}");
    assert!(out.contains("\"seq\":7"), "{out}");

    // On a waitpoint bound to no device, a report is a monitor's and wakes the wait.
    let server = Fake::armed(vec![page(vec![wake(6, "wp_1", "report")])]).serve();
    let (code, out, _) = wait(&server, None);
    assert_eq!(code, FIRED);
    assert!(out.contains("\"seq\":6"), "{out}");
}

#[test]
fn a_failed_wake_exits_3_with_the_wake() {
    let server = Fake::armed(vec![page(vec![wake(6, "wp_1", "failed")])]).serve();
    let (code, out, err) = wait(&server, None);
    assert_eq!(code, FAILED, "{err}");
    assert_eq!(
        serde_json::from_str::<Value>(out.trim()).expect("json"),
        wake(6, "wp_1", "failed")
    );
}

#[test]
fn a_remote_wait_on_a_started_job_that_failed_exits_3() {
    let with_payload = |payload: Value| {
        let mut w = device_wake(6, "fired", "pid 4242 exited");
        w["signals"][0]["data"] = json!({"outcome": "fired", "device": "gpu1", "kind": "pid",
            "payload": payload})
        .to_string()
        .into();
        w
    };
    let mut sink = Vec::new();
    for (payload, code) in [
        (json!({"exit_code": 0}), FIRED),
        (json!({"exit_code": 1}), FAILED),
        (json!({"exit_code": null, "signal": 9}), FAILED),
        (json!({"already_gone": false}), FIRED),
    ] {
        assert_eq!(
            exit_status(&with_payload(payload.clone()), &mut sink),
            code,
            "{payload}"
        );
    }
}

#[test]
fn a_closed_stdout_keeps_the_outcomes_status() {
    struct Closed;
    impl std::io::Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut err = Vec::new();
    assert_eq!(
        fire(&wake(6, "wp_1", "failed"), false, &mut Closed, &mut err),
        FAILED
    );
    assert!(err.is_empty(), "quiet: {}", String::from_utf8_lossy(&err));
}

#[test]
fn a_remote_wait_prints_the_payload_a_local_one_would() {
    let mut w = device_wake(6, "fired", "a line matched");
    let payload = json!({"reason": "matched", "line": "loss=nan", "before": ["loss=0.2"]});
    w["signals"][0]["data"] = json!({"outcome": "fired", "device": "gpu1", "kind": "log",
        "payload": payload})
    .to_string()
    .into();
    let mut want = payload.clone();
    want["device"] = json!("gpu1");
    want["waitpoint"] = w["waitpoint"]["id"].clone();
    assert_eq!(printed_payload(&w), Some(want));
    for outcome in ["timed_out", "broke"] {
        let w = device_wake(7, outcome, "not fired");
        assert_eq!(printed_payload(&w), None, "{outcome}: nothing on stdout");
    }
    let plain = wake(8, "wp_1", "fired");
    assert_eq!(
        printed_payload(&plain),
        Some(plain.clone()),
        "no outcome: the wake"
    );
}
