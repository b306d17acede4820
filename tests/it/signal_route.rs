//! `POST /webhook/signal`: every code of the contract, and the API's token.

use cortex_cli::http::Method;
use cortex_tests::{Hub, body};
use serde_json::json;
use std::time::Duration;

#[test]
fn every_code_of_the_signal_route() {
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "job", "intent": "look", "max_signals": 2}),
    );
    let barrier = hub.waitpoint(
        &sid,
        json!({"label": "ladder", "intent": "all arms", "members": ["arm2", "arm6"]}),
    );

    // 202 accepted, then 202 duplicate for the same key, counted once.
    let (st, v) = hub.signal(&body(&wp, json!({"key": "k1", "message": "first"})));
    assert_eq!((st, v["result"].as_str()), (202, Some("accepted")), "{v}");
    let (st, v) = hub.signal(&body(&wp, json!({"key": "k1", "message": "again"})));
    assert_eq!((st, v["result"].as_str()), (202, Some("duplicate")), "{v}");
    assert_eq!(
        hub.get_waitpoint(wp["id"].as_str().expect("id"))["signal_count"],
        1
    );

    // 401 wrong secret, 404 unknown id.
    let (st, v) = hub.signal(&json!({"id": wp["id"], "secret": "0".repeat(64)}));
    assert_eq!(
        (st, v["error"].as_str()),
        (401, Some("wrong_secret")),
        "{v}"
    );
    let (st, v) = hub.signal(&json!({"id": "wp_000000000000", "secret": "x"}));
    assert_eq!(
        (st, v["error"].as_str()),
        (404, Some("unknown_waitpoint")),
        "{v}"
    );

    // 422 missing and unlisted member, with the expected members listed.
    let (st, v) = hub.signal(&body(&barrier, json!({})));
    assert_eq!(st, 422, "{v}");
    assert_eq!(v["members"], json!(["arm2", "arm6"]));
    let (st, v) = hub.signal(&body(&barrier, json!({"member": "arm9"})));
    assert_eq!(st, 422, "{v}");
    assert!(
        v["message"]
            .as_str()
            .expect("message")
            .contains("arm2, arm6")
    );

    // 413: a body over 64 KB, and a message over 2,000 characters.
    let (st, v) = hub.signal(&body(&wp, json!({"data": "x".repeat(70_000)})));
    assert_eq!((st, v["error"].as_str()), (413, Some("too_large")), "{v}");
    let (st, _) = hub.signal(&body(&wp, json!({"message": "m".repeat(2_001)})));
    assert_eq!(st, 413);
    let (st, _) = hub.signal(&body(&wp, json!({"data": "d".repeat(16_001)})));
    assert_eq!(st, 413);

    // 400: not JSON, wrong shape, unknown status.
    for raw in [
        &b"not json"[..],
        br#"{"id":1}"#,
        br#"{"id":"wp_1","secret":"s","status":"done"}"#,
    ] {
        let (st, v) = hub.post_signal_raw(raw);
        assert_eq!((st, v["error"].as_str()), (400, Some("bad_request")), "{v}");
    }

    // 410 once resolved: the second ok resolves the monitor of 2.
    let (st, v) = hub.signal(&body(&wp, json!({"key": "k2"})));
    assert_eq!((st, v["state"].as_str()), (202, Some("resolved")), "{v}");
    let (st, v) = hub.signal(&body(&wp, json!({"key": "k3"})));
    assert_eq!(
        (st, v["error"].as_str()),
        (410, Some("already_resolved")),
        "{v}"
    );
    // A duplicate of a signal that was counted is still a duplicate, not a 410.
    let (st, v) = hub.signal(&body(&wp, json!({"key": "k2"})));
    assert_eq!((st, v["result"].as_str()), (202, Some("duplicate")), "{v}");

    // Every answer is a JSON object; misses are logged as warnings.
    let log = hub.log();
    assert!(
        log.contains("WARN") && log.contains("wrong secret"),
        "{log}"
    );
    assert!(log.contains("unknown waitpoint"), "{log}");
}

#[test]
fn the_miss_budget_answers_429_and_spares_real_signals() {
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "job", "intent": "look"}));
    let mut codes = Vec::new();
    for i in 0..61 {
        let (st, _) = hub.signal(&json!({"id": format!("wp_{i:012}"), "secret": "nope"}));
        codes.push(st);
    }
    assert!(codes[..60].iter().all(|&c| c == 404), "{codes:?}");
    assert_eq!(codes[60], 429);
    let (st, _) = hub.signal(&json!({"id": wp["id"], "secret": "wrong"}));
    assert_eq!(st, 429, "wrong secrets share the budget");
    // The right secret still gets through.
    let (st, v) = hub.signal(&body(&wp, json!({})));
    assert_eq!(st, 202, "{v}");
}

#[test]
fn the_api_needs_the_operator_token_and_healthz_does_not() {
    let hub = Hub::start();
    let resp = cortex_cli::http::Request::new(Method::Get, &hub.url("/api/sessions"))
        .send()
        .expect("get");
    assert_eq!(resp.status, 401);
    let v: serde_json::Value = serde_json::from_slice(&resp.body).expect("json");
    assert!(
        v["message"]
            .as_str()
            .expect("msg")
            .contains("Authorization: Bearer")
    );
    let resp = cortex_cli::http::Request::new(Method::Get, &hub.url("/api/sessions"))
        .header("authorization", "Bearer wrong")
        .send()
        .expect("get");
    assert_eq!(resp.status, 401);
    let resp = cortex_cli::http::Request::new(Method::Get, &hub.url("/healthz"))
        .send()
        .expect("get");
    assert_eq!(resp.status, 200);
    // The signal route does not take the operator token as a secret.
    let (st, _) = hub.signal(&json!({"id": "wp_000000000000", "secret": hub.token}));
    assert_eq!(st, 404);
}

#[test]
fn the_hub_refuses_a_non_loopback_listen_address() {
    let home = tempfile::tempdir().expect("tmp");
    let (code, _, err) = cortex_tests::run(
        "cortex-hub",
        &[
            "--home",
            home.path().to_str().expect("utf8"),
            "--listen",
            "0.0.0.0:0",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(err.contains("loopback only"), "{err}");
}

/// The curl line the hub hands out fails the job's shell on a refusal (a wrong secret is
/// a 401, an unknown id a 404: never a silent exit 0), shows the hub's answer either way,
/// and succeeds when the signal is taken (202) and on a resend after the waitpoint
/// resolved (410, which is no error for the job), so a `set -e` job lives on.
#[test]
fn the_handed_out_curl_line_fails_on_a_refusal_and_not_on_410() {
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "job", "intent": "look"}));
    let line = wp["how_to_signal"]["curl"].as_str().expect("curl line");
    let id = wp["id"].as_str().expect("id");
    let secret = wp["secret"].as_str().expect("secret");
    let run = |line: &str| {
        let out = std::process::Command::new("sh")
            .args(["-ec", &format!("{line}\necho still-running")])
            .output()
            .expect("sh");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let wrong = run(&line.replace(secret, &"0".repeat(secret.len())));
    assert_ne!(wrong.0, Some(0), "a 401 must fail the line: {wrong:?}");
    assert!(
        wrong.1.contains("wrong_secret"),
        "the body says why: {wrong:?}"
    );
    assert!(
        !wrong.1.contains("still-running"),
        "set -e stops: {wrong:?}"
    );
    let unknown = run(&line.replace(id, "wp_000000000000"));
    assert_ne!(unknown.0, Some(0), "a 404 must fail the line: {unknown:?}");
    assert!(unknown.1.contains("unknown"), "{unknown:?}");

    let right = run(line);
    assert_eq!(right.0, Some(0), "{right:?}");
    assert!(right.1.contains("accepted"), "{right:?}");
    assert!(right.1.contains("still-running"), "{right:?}");
    hub.wait_wake(&sid, id, 1, Duration::from_secs(10));
    // The same line again, after the waitpoint resolved: 410, and the job goes on.
    let again = run(line);
    assert_eq!(again.0, Some(0), "a 410 is no error for the job: {again:?}");
    assert!(again.1.contains("already_resolved"), "{again:?}");
    assert!(again.1.contains("still-running"), "{again:?}");
}
