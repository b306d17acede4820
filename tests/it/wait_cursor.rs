//! `cortex wait for` as a script's loop sees it: a cursor (`--after SEQ`, or a named
//! `--consumer` whose position the hub keeps) that prints every wake once, reports sent
//! before the loop started included, across a restart of the hub; the exit status of a
//! `silent` wake; a deadline kept by a timer rather than by the sweep; a hub never reached.

use std::time::Duration;

use cortex_tests::{Hub, body, dead_port, run};
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(30);

fn wake_of(out: &str) -> Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("one JSON wake ({e}): {out:?}"))
}

#[test]
fn a_consumer_loop_sees_every_report_once_even_those_sent_before_it_and_across_a_restart() {
    let mut hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "sweep", "intent": "each arm's result", "max_signals": 10}),
    );
    let id = wp["id"].as_str().expect("id").to_string();
    // Three reports before any waiter exists.
    for k in ["a", "b", "c"] {
        let (st, v) = hub.signal(&body(&wp, json!({"message": format!("arm {k}"), "key": k})));
        assert_eq!(st, 202, "{v}");
    }
    hub.wait_wake(&sid, &id, 3, LIMIT);
    let seqs: Vec<u64> = hub
        .wakes(&sid)
        .iter()
        .filter(|w| w["waitpoint"]["id"] == id.as_str())
        .map(|w| w["seq"].as_u64().expect("seq"))
        .collect();
    assert_eq!(seqs.len(), 3);

    let take = |hub: &Hub| {
        let (code, out, err) =
            hub.cortex(&["wait", "for", &id, "--consumer", "loop", "--timeout", "3s"]);
        (code, out, err)
    };
    let (code, out, err) = take(&hub);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        wake_of(&out)["seq"],
        seqs[0],
        "the first report, sent before the loop"
    );
    assert!(err.contains("consumer loop took seq"), "{err}");
    let (code, out, err) = take(&hub);
    assert_eq!(code, 0, "{err}");
    assert_eq!(wake_of(&out)["seq"], seqs[1]);

    // The position is the hub's: it survives the hub's restart.
    hub.restart();
    let (code, out, err) = take(&hub);
    assert_eq!(code, 0, "{err}");
    assert_eq!(wake_of(&out)["seq"], seqs[2], "once each, in order");
    assert_eq!(wake_of(&out)["signals"][0]["message"], "arm c");

    // Nothing more yet: the bound passes (1), and the next report is the next wake.
    let (code, out, _) = take(&hub);
    assert_eq!(code, 1, "armed, nothing new: timed out");
    assert!(out.trim().is_empty());
    assert_eq!(hub.signal(&body(&wp, json!({"message": "arm d"}))).0, 202);
    let (code, out, err) = take(&hub);
    assert_eq!(code, 0, "{err}");
    assert_eq!(wake_of(&out)["signals"][0]["message"], "arm d");

    // Another consumer starts from the beginning; --after starts where it is told.
    let (code, out, err) =
        hub.cortex(&["wait", "for", &id, "--consumer", "audit", "--timeout", "3s"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(wake_of(&out)["seq"], seqs[0]);
    let after = seqs[0].to_string();
    let (code, out, err) = hub.cortex(&["wait", "for", &id, "--after", &after, "--timeout", "3s"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(wake_of(&out)["seq"], seqs[1]);
    assert!(
        err.contains(&format!("--after {}", seqs[1])),
        "the seq to resume after: {err}"
    );

    let (code, _, err) = hub.cortex(&["wait", "for", &id, "--consumer", "no spaces"]);
    assert_eq!(code, 2);
    assert!(err.contains("--consumer"), "{err}");
}

#[test]
fn a_silent_wake_exits_4_not_0() {
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "train", "intent": "is it stuck?", "silence_after": "1s"}),
    );
    let id = wp["id"].as_str().expect("id");
    let (code, out, err) = hub.cortex(&["wait", "for", id, "--timeout", "30s"]);
    assert_eq!(code, 4, "the job went quiet: not a success: {err}");
    assert_eq!(wake_of(&out)["reason"], "silent");
}

#[test]
fn a_waitpoint_expires_at_its_deadline_with_the_sweep_an_hour_away() {
    // The sweep runs at start and then hourly: only the deadline's own timer can expire
    // the waitpoint armed after the start.
    let hub = Hub::start_with(&[("CORTEX_WAITPOINT_SWEEP_MS", "3600000")]);
    let sid = hub.session();
    let (code, out, err) = hub.cortex(&[
        "--json",
        "wait",
        "create",
        "--session",
        &sid,
        "--label",
        "short",
        "--intent",
        "x",
        "--expires-in",
        "2s",
    ]);
    assert_eq!(code, 0, "{err}");
    let created: Value = serde_json::from_str(out.trim()).expect("json");
    let id = created["id"].as_str().expect("id");
    let (code, out, err) = hub.cortex(&["wait", "for", id, "--timeout", "60s"]);
    assert_eq!(code, 1, "expired: {err}");
    let wake = wake_of(&out);
    assert_eq!(wake["reason"], "expired", "{wake}");
    assert!(
        wake["waited_ms"].as_u64().is_some_and(|ms| ms >= 2_000),
        "not before its deadline: {wake}"
    );
}

#[test]
fn a_hub_never_reached_is_said_at_once_and_breaks() {
    let url = format!("http://127.0.0.1:{}", dead_port());
    let (code, out, err) = run(
        "cortex",
        &[
            "--hub",
            &url,
            "wait",
            "for",
            "wp_0123456789ab",
            "--timeout",
            "20m",
        ],
        &[("CORTEX_WEBHOOK_TOKEN", "t")],
    );
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty());
    assert!(
        err.contains("cannot reach the hub") && err.contains("nothing was waited for"),
        "{err}"
    );
}
