//! The notices' shapes, settings and retry schedule.

use super::*;
use cortex_protocol::SignalStatus;
use cortex_protocol::api::{SignalView, WaitpointRef};

fn wake(reason: WakeReason, message: Option<&str>) -> Wake {
    Wake {
        waitpoint: WaitpointRef {
            id: "wp_1".into(),
            label: "train run 7".into(),
            intent: String::new(),
        },
        reason,
        waited_ms: 90_000,
        signals: vec![SignalView {
            status: SignalStatus::Fail,
            message: message.map(str::to_string),
            member: Some("gpu1".into()),
            data: Some("{\"secret\":\"never\"}".into()),
            source: "http".into(),
            key: None,
            at: 5,
        }],
        omitted: 0,
        text: "whatever the agent reads".into(),
    }
}

fn targets(json: &str) -> Result<Vec<Target>, NotifyConfigError> {
    let v: serde_json::Value = serde_json::from_str(json).expect("json");
    parse(Some(&v))
}

#[test]
fn a_failed_wake_names_the_waitpoint_and_the_failing_message_not_its_data() {
    let body = EventBody::Wake(Box::new(wake(
        WakeReason::Failed,
        Some("loss=nan at step 40"),
    )));
    let n = from_event("s_1", Some("nightly"), &body, |_| true, 7).expect("a notice");
    assert_eq!(n.event, NoticeEvent::Failed);
    assert!(n.text.contains("train run 7 (wp_1)"), "{}", n.text);
    assert!(n.text.contains("loss=nan at step 40"), "{}", n.text);
    assert!(n.text.contains("s_1 (nightly)"), "{}", n.text);
    assert!(!n.text.contains("never"), "a signal's data stays out");
    assert_eq!(n.waitpoint.as_deref(), Some("wp_1"));
}

#[test]
fn only_failures_expiries_and_people_are_told() {
    for (reason, told) in [
        (WakeReason::Fired, false),
        (WakeReason::Report, false),
        (WakeReason::Silent, false),
        (WakeReason::Failed, true),
        (WakeReason::Expired, true),
    ] {
        let body = EventBody::Wake(Box::new(wake(reason, None)));
        assert_eq!(
            from_event("s", None, &body, |_| true, 0).is_some(),
            told,
            "{reason:?}"
        );
    }
    // A monitor that heard from its job before it expired is not told: its life ended.
    let body = EventBody::Wake(Box::new(wake(WakeReason::Expired, None)));
    assert!(from_event("s", None, &body, |_| false, 0).is_none());
    let msg = EventBody::Message {
        text: "hi".into(),
        when: Default::default(),
        dedupe_key: None,
    };
    assert!(from_event("s", None, &msg, |_| true, 0).is_none());
}

#[test]
fn an_approval_names_the_tool_and_reason_never_the_arguments() {
    let p = PendingRequest {
        id: "req_9".into(),
        kind: "approval".into(),
        tool: "device_exec".into(),
        call_id: "c1".into(),
        args: serde_json::json!({"argv": ["deploy", "--token", "tok_SECRET"]}),
        reason: "policy requireApproval".into(),
        questions: Vec::new(),
        asked_at: 0,
        expires_at: None,
    };
    let body = EventBody::ApprovalRequired {
        run_id: "r".into(),
        step: 1,
        approval: p,
    };
    let n = from_event("s_2", None, &body, |_| true, 0).expect("notice");
    assert_eq!(n.event, NoticeEvent::Approval);
    assert!(
        n.text.contains("device_exec") && n.text.contains("req_9"),
        "{}",
        n.text
    );
    assert!(!n.text.contains("tok_SECRET") && !n.title.contains("tok_SECRET"));
}

#[test]
fn each_shape_sends_what_its_service_takes() {
    let ts = targets(
        r#"[{"type":"webhook","url":"https://example.com/hook/abc?k=1"},
            {"type":"slack","url":"https://hooks.slack.com/services/T/B/XYZ","name":"team"},
            {"type":"ntfy","url":"https://ntfy.sh/my-topic","events":["approval","question"]}]"#,
    )
    .expect("targets");
    let n = device_lost("gpu1", 0, 2, 600_000);
    let hook = ts[0].request("n3", &n);
    let v: serde_json::Value = serde_json::from_slice(&hook.body).expect("json");
    assert_eq!(v["id"], "n3");
    assert_eq!(v["event"], "device-lost");
    assert_eq!(v["device"], "gpu1");
    assert_eq!(hook.content_type, "application/json");

    let slack = ts[1].request("n3", &n);
    let v: serde_json::Value = serde_json::from_slice(&slack.body).expect("json");
    assert_eq!(v.as_object().map(|o| o.len()), Some(1), "only text: {v}");
    assert!(v["text"].as_str().is_some_and(|t| t.contains("gpu1")));
    let odd = device_lost("<!channel> & co", 0, 1, 1);
    let v: serde_json::Value =
        serde_json::from_slice(&ts[1].request("n4", &odd).body).expect("json");
    assert!(
        v["text"]
            .as_str()
            .is_some_and(|t| t.contains("&lt;!channel&gt; &amp; co") && !t.contains('<')),
        "Slack's control characters escaped: {v}"
    );
    assert_eq!(ts[1].id, "team");

    let ntfy = ts[2].request("n3", &n);
    assert_eq!(ntfy.body, n.text.as_bytes());
    let h = |k: &str| {
        ntfy.headers
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        h("Title").as_deref(),
        Some("cortex: device gpu1 is offline")
    );
    assert_eq!(h("Priority").as_deref(), Some("4"));
    assert!(h("Tags").is_some_and(|t| t.contains("warning")));
    assert!(!ts[2].wants(NoticeEvent::DeviceLost) && ts[2].wants(NoticeEvent::Question));
    assert!(
        ts[0].wants(NoticeEvent::DeviceLost),
        "all events by default"
    );
    assert_eq!(
        wanted(&ts[2..]),
        NoticeEvent::Approval.bit() | NoticeEvent::Question.bit()
    );
}

#[test]
fn a_target_url_is_never_shown_past_its_host() {
    let ts = targets(r#"[{"type":"slack","url":"https://hooks.slack.com/services/T/B/XYZ"}]"#)
        .expect("targets");
    assert_eq!(ts[0].shown_url(), "https://hooks.slack.com/…");
    let dbg = format!("{:?}", ts[0]);
    assert!(!dbg.contains("XYZ"), "{dbg}");
    assert!(ts[0].id.starts_with("slack-") && !ts[0].id.contains("XYZ"));
    // Nor in what is wrong with one.
    for bad in [
        r#"[{"type":"slack","url":"ftp://h/T/B/XYZ"}]"#,
        r#"[{"type":"pager","url":"https://h/XYZ"}]"#,
        r#"[{"type":"ntfy","url":"https://h/XYZ","events":["everything"]}]"#,
        r#"[{"type":"ntfy","url":"https://h/XYZ","name":"a"},{"type":"ntfy","url":"https://h/XYZ2","name":"a"}]"#,
        r#"[{"type":"ntfy","url":7}]"#,
        r#"{"type":"ntfy","url":"https://h/XYZ"}"#,
    ] {
        let e = targets(bad).expect_err(bad).to_string();
        assert!(!e.contains("XYZ"), "{bad}: {e}");
        assert!(e.starts_with("settings.json notify["), "{e}");
    }
    assert!(parse(None).expect("none").is_empty());
}

#[test]
fn retries_double_from_a_second_to_a_quarter_hour_jittered_and_end() {
    assert_eq!(retry_delay(1, 0.0), Duration::from_millis(500));
    assert_eq!(retry_delay(1, 1.0), Duration::from_secs(1));
    assert_eq!(retry_delay(4, 1.0), Duration::from_secs(8));
    assert_eq!(retry_delay(30, 1.0), RETRY_CAP);
    assert_eq!(retry_delay(u32::MAX, 0.0), RETRY_CAP / 2);
    let total: Duration = (1..MAX_ATTEMPTS).map(|a| retry_delay(a, 1.0)).sum();
    assert!(
        total > Duration::from_secs(30 * 60) && total < Duration::from_secs(60 * 60),
        "{total:?}"
    );
    assert_eq!(verdict(Some(204)), Verdict::Sent);
    assert_eq!(verdict(Some(500)), Verdict::Retry);
    assert_eq!(verdict(Some(429)), Verdict::Retry);
    assert_eq!(verdict(None), Verdict::Retry);
    assert_eq!(verdict(Some(404)), Verdict::Refused);
    assert_eq!(verdict(Some(302)), Verdict::Refused);
}
