//! The waitpoint rules through the real hub: barriers, quorum, fail_fast, heartbeats,
//! monitors, the hourly cap, and the expiry notices.

use std::time::{Duration, Instant};

use cortex_tests::{Hub, body};
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(30);

fn id(wp: &Value) -> &str {
    wp["id"].as_str().expect("id")
}

#[test]
fn a_three_member_barrier_wakes_once_three_seconds_after_it_completes() {
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "T2 ladder", "intent": "all three arms", "members": ["arm2", "arm6", "arm8"]}));
    for m in ["arm2", "arm6"] {
        assert_eq!(
            hub.signal(&body(
                &wp,
                json!({"member": m, "message": format!("{m} done")})
            ))
            .0,
            202
        );
    }
    assert!(hub.wakes(&sid).is_empty(), "two of three do not wake");
    let completed = Instant::now();
    assert_eq!(hub.signal(&body(&wp, json!({"member": "arm8"}))).0, 202);
    // Recorded inside the 3 s window: carried by the wake.
    assert_eq!(
        hub.signal(&body(
            &wp,
            json!({"member": "arm2", "status": "progress", "message": "late note"})
        ))
        .0,
        202
    );
    let wake = hub.wait_wake(&sid, id(&wp), 1, LIMIT);
    let waited = completed.elapsed();
    assert!(
        waited >= Duration::from_millis(2_900),
        "woke after {waited:?}, before the 3 s"
    );
    assert_eq!(wake["reason"], "fired");
    assert_eq!(wake["signals"].as_array().expect("signals").len(), 4);
    let text = wake["text"].as_str().expect("text");
    assert!(text.contains("arm2 ok, arm6 ok, arm8 ok"), "{text}");
    assert!(text.contains("all three arms"));
    // Resolved: another arm is answered "already resolved", and no second wake exists.
    assert_eq!(hub.signal(&body(&wp, json!({"member": "arm6"}))).0, 410);
    assert_eq!(hub.wakes(&sid).len(), 1);
}

#[test]
fn quorum_two_of_three() {
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "2 of 3", "intent": "any two", "members": ["a", "b", "c"], "quorum": 2}),
    );
    assert_eq!(hub.signal(&body(&wp, json!({"member": "c"}))).0, 202);
    assert_eq!(hub.signal(&body(&wp, json!({"member": "a"}))).0, 202);
    let wake = hub.wait_wake(&sid, id(&wp), 1, LIMIT);
    assert_eq!(wake["reason"], "fired");
    assert!(
        wake["text"]
            .as_str()
            .expect("text")
            .contains("b (no report)")
    );
    assert_eq!(hub.signal(&body(&wp, json!({"member": "b"}))).0, 410);
}

#[test]
fn fail_fast_wakes_on_the_first_failure() {
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "ladder", "intent": "wake me if one dies", "members": ["a", "b", "c"]}),
    );
    assert_eq!(hub.signal(&body(&wp, json!({"member": "a"}))).0, 202);
    let (st, v) = hub.signal(&body(
        &wp,
        json!({"member": "b", "status": "fail", "message": "CUDA OOM"}),
    ));
    assert_eq!(
        (st, v["state"].as_str()),
        (202, Some("resolved")),
        "no 3 s wait for a failure"
    );
    let wake = hub
        .wakes(&sid)
        .pop()
        .expect("a wake, delivered with the signal");
    assert_eq!(wake["reason"], "failed");
    assert!(wake["text"].as_str().expect("text").contains("CUDA OOM"));

    // Without fail_fast the failure waits for the set.
    let wp2 = hub.waitpoint(
        &sid,
        json!({"label": "x", "intent": "y", "members": ["a", "b"], "fail_fast": false}),
    );
    assert_eq!(
        hub.signal(&body(&wp2, json!({"member": "a", "status": "fail"})))
            .1["state"],
        "armed"
    );
    assert_eq!(hub.signal(&body(&wp2, json!({"member": "b"}))).0, 202);
    let wake = hub.wait_wake(&sid, id(&wp2), 1, LIMIT);
    assert_eq!(wake["reason"], "failed");
}

#[test]
fn progress_never_wakes() {
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "training", "intent": "the run"}));
    for step in [1000, 2000, 3000, 4000, 5000] {
        let (st, v) = hub.signal(&body(
            &wp,
            json!({"status": "progress", "message": format!("step {step}")}),
        ));
        assert_eq!((st, v["state"].as_str()), (202, Some("armed")));
    }
    assert_eq!(hub.get_waitpoint(id(&wp))["signal_count"], 5);
    assert!(
        hub.wakes(&sid).is_empty(),
        "heartbeats are recorded, never woken for"
    );
    hub.signal(&body(&wp, json!({"message": "done"})));
    let wakes = hub.wakes(&sid);
    assert_eq!(wakes.len(), 1, "the only wake is the ok");
    assert_eq!(
        wakes[0]["omitted"], 2,
        "older heartbeats are counted, the latest listed"
    );
}

#[test]
fn a_monitor_of_three_wakes_on_every_report_then_resolves() {
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "nightly", "intent": "each report", "max_signals": 3}),
    );
    for i in 1..=3 {
        assert_eq!(
            hub.signal(&body(&wp, json!({"message": format!("report {i}")})))
                .0,
            202
        );
        let wake = hub.wait_wake(&sid, id(&wp), i, LIMIT);
        assert_eq!(wake["reason"], "report");
        assert!(
            wake["text"]
                .as_str()
                .expect("text")
                .contains(&format!("report {i}"))
        );
    }
    assert_eq!(hub.get_waitpoint(id(&wp))["state"], "resolved");
    assert_eq!(hub.signal(&body(&wp, json!({}))).0, 410);
}

/// A lowered cap (2 per window) and a short window (3 s) stand in for 12 an hour.
#[test]
fn the_hourly_cap_holds_wakes_and_folds_them_into_one_late_wake() {
    let hub = Hub::start_with(&[
        ("CORTEX_WAITPOINT_MAX_WAKES_PER_HOUR", "2"),
        ("CORTEX_WAITPOINT_WAKE_WINDOW_MS", "3000"),
    ]);
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "chatty", "intent": "every report", "max_signals": 10}),
    );
    for i in 1..=5 {
        assert_eq!(
            hub.signal(&body(&wp, json!({"message": format!("r{i}")})))
                .0,
            202
        );
    }
    assert_eq!(hub.wakes(&sid).len(), 2, "the cap holds the third");
    let v = hub.get_waitpoint(id(&wp));
    assert_eq!(v["badges"]["wake_limit_reached"], true, "{v:#}");
    assert_eq!(v["badges"]["wakes_this_hour"], 2);
    assert_eq!(
        v["wakes"]
            .as_array()
            .expect("wakes")
            .last()
            .expect("pending")["delivered"],
        false
    );
    let late = hub.wait_wake(&sid, id(&wp), 3, LIMIT);
    let messages: Vec<&str> = late["signals"]
        .as_array()
        .expect("s")
        .iter()
        .filter_map(|s| s["message"].as_str())
        .collect();
    assert_eq!(
        messages,
        vec!["r3", "r4", "r5"],
        "one late wake carrying everything held"
    );
    assert_eq!(
        hub.get_waitpoint(id(&wp))["badges"]["wake_limit_reached"],
        false
    );
    assert_eq!(hub.wakes(&sid).len(), 3);
}

fn expiring_hub() -> Hub {
    Hub::start_with(&[("CORTEX_WAITPOINT_SWEEP_MS", "100")])
}

/// 0.0005 h = 1.8 s.
const SHORT: f64 = 0.0005;

fn expiry_text(hub: &Hub, sid: &str, wp: &Value) -> String {
    let wake = hub.wait_wake(sid, id(wp), 1, LIMIT);
    assert_eq!(wake["reason"], "expired", "{wake:#}");
    assert_eq!(hub.get_waitpoint(id(wp))["state"], "expired");
    // A late signal is told it came too late, not "already resolved".
    let (code, answer) = hub.signal(&body(wp, json!({"member": "a"})));
    assert_eq!(
        (code, &answer["error"]),
        (410, &json!("expired")),
        "{answer}"
    );
    assert!(
        answer["message"]
            .as_str()
            .is_some_and(|m| m.contains("too late")),
        "{answer}"
    );
    wake["text"].as_str().expect("text").to_string()
}

#[test]
fn expiry_when_nobody_reported() {
    let hub = expiring_hub();
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "silent", "intent": "x", "expires_in_hours": SHORT}),
    );
    assert!(expiry_text(&hub, &sid, &wp).contains("nobody reported"));
}

#[test]
fn expiry_when_only_some_members_reported() {
    let hub = expiring_hub();
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "ladder", "intent": "x", "members": ["a", "b", "c"], "expires_in_hours": SHORT}));
    hub.signal(&body(&wp, json!({"member": "b"})));
    let t = expiry_text(&hub, &sid, &wp);
    assert!(
        t.contains("only some members reported") && t.contains("Missing: a, c"),
        "{t}"
    );
}

#[test]
fn expiry_when_only_heartbeats_arrived() {
    let hub = expiring_hub();
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "train", "intent": "x", "expires_in_hours": SHORT}),
    );
    hub.signal(&body(
        &wp,
        json!({"status": "progress", "message": "step 100"}),
    ));
    let t = expiry_text(&hub, &sid, &wp);
    assert!(
        t.contains("only heartbeats arrived (1 progress report)"),
        "{t}"
    );
    assert!(t.contains("step 100"));
}

#[test]
fn a_monitor_deadline_says_how_often_it_woke_you() {
    let hub = Hub::start_with(&[
        ("CORTEX_WAITPOINT_SWEEP_MS", "100"),
        ("CORTEX_WAITPOINT_MAX_WAKES_PER_HOUR", "1"),
    ]);
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "mon", "intent": "x", "max_signals": 5, "expires_in_hours": SHORT}),
    );
    hub.signal(&body(&wp, json!({"message": "first"})));
    hub.signal(&body(&wp, json!({"message": "held by the cap"})));
    let wake = hub.wait_wake(&sid, id(&wp), 2, LIMIT);
    assert_eq!(wake["reason"], "expired");
    let t = wake["text"].as_str().expect("text");
    assert!(
        t.contains("woke you 1 time (of at most 5)")
            && t.contains("1 report had not reached you yet"),
        "{t}"
    );
    assert!(t.contains("held by the cap"));
}

#[test]
fn creation_refuses_bad_parameters_with_a_clear_message() {
    let hub = Hub::start();
    let sid = hub.session();
    let path = format!("/api/sessions/{sid}/waitpoints");
    for (bad, needle) in [
        (
            json!({"label": "x", "intent": "y", "expires_in_hours": 721}),
            "at most 720",
        ),
        (
            json!({"label": "x", "intent": "y", "quorum": "all"}),
            "needs members",
        ),
        (
            json!({"label": "x", "intent": "y", "members": ["a"], "quorum": 2}),
            "more than the 1 members",
        ),
        (json!({"label": "", "intent": "y"}), "label is empty"),
        (
            json!({"label": "x", "intent": "y", "max_signals": 0}),
            "max_signals",
        ),
        (
            json!({"label": "x", "intent": "y", "colour": "red"}),
            "unknown field",
        ),
    ] {
        let (st, v) = hub.api(cortex_cli::http::Method::Post, &path, Some(&bad));
        assert_eq!(st, 400, "{bad} → {v}");
        assert!(
            v["message"].as_str().expect("message").contains(needle),
            "{bad} → {v}"
        );
    }
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "x", "intent": "y", "expires_in_hours": 0.25}),
    );
    let span = wp["expires_at"].as_u64().expect("t") - wp["created_at"].as_u64().expect("t");
    assert_eq!(span, 900_000, "fractional hours");
    let wp = hub.waitpoint(&sid, json!({"label": "x", "intent": "y"}));
    let span = wp["expires_at"].as_u64().expect("t") - wp["created_at"].as_u64().expect("t");
    assert_eq!(span, 168 * 3_600_000, "7 days by default");
    assert_eq!(wp["how_to_signal"]["recommended"], "cli");
    hub.add_device("gpu1");
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "x", "intent": "y", "device": "gpu1", "members": ["a"]}),
    );
    assert_eq!(wp["how_to_signal"]["recommended"], "shell");
    assert!(wp["member_note"].as_str().expect("note").contains("a"));
}
