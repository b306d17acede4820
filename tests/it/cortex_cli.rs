//! `cortex`: sessions and waitpoints from the command line, and `cortex wait for` with
//! the wait contract (0 fired, 1 timed out or expired, 2 broke; one line on stderr when
//! armed, the wake as one JSON object on stdout).

use cortex_tests::{Hub, bin, body, run};
use serde_json::{Value, json};
use std::process::{Command, Stdio};

#[test]
fn sessions_and_waitpoints_from_the_command_line() {
    let hub = Hub::start();
    let (code, out, err) = hub.cortex(&["session", "new", "--title", "cli"]);
    assert_eq!(code, 0, "{err}");
    let sid = out.trim().to_string();
    assert!(sid.starts_with("ses_"), "{out}");
    let (code, out, err) = hub.cortex(&[
        "--json",
        "wait",
        "create",
        "--session",
        &sid,
        "--label",
        "train",
        "--intent",
        "compare",
        "--members",
        "a,b",
        "--quorum",
        "1",
    ]);
    assert_eq!(code, 0, "{err}");
    let wp: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(wp["quorum"], 1);
    let (code, out, _) = hub.cortex(&["wait", "check", "--session", &sid]);
    assert_eq!(code, 0);
    assert!(
        out.contains(wp["id"].as_str().expect("id")) && out.contains("armed"),
        "{out}"
    );
    assert!(
        !out.contains(wp["secret"].as_str().expect("secret")),
        "wait check never shows the secret"
    );
    let (code, out, _) = hub.cortex(&["--json", "sessions"]);
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<Value>(&out)
            .expect("json")
            .as_array()
            .expect("list")
            .len(),
        1
    );
    let (code, _, err) = hub.cortex(&["session", "say", &sid, "hello there"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = hub.cortex(&["--json", "session", "events", &sid]);
    assert_eq!(code, 0);
    assert!(out.lines().any(|l| l.contains("hello there")), "{out}");
    let (code, _, err) = hub.cortex(&["wait", "cancel", wp["id"].as_str().expect("id")]);
    assert_eq!(code, 0, "{err}");
    // Without a token the CLI says where to find one.
    let url = hub.url("");
    let empty = tempfile::tempdir().expect("tmp");
    let (code, _, err) = run(
        "cortex",
        &["--hub", &url, "sessions"],
        &[("CORTEX_HOME", empty.path().to_str().expect("utf8"))],
    );
    assert_ne!(code, 0);
    assert!(err.contains("CORTEX_WEBHOOK_TOKEN"), "{err}");
}

fn spawn_wait_for(hub: &Hub, id: &str, timeout: &str) -> std::process::Child {
    Command::new(bin("cortex"))
        .args([
            "--hub",
            &hub.url(""),
            "wait",
            "for",
            id,
            "--timeout",
            timeout,
        ])
        .env("CORTEX_WEBHOOK_TOKEN", &hub.token)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cortex wait for")
}

fn finish(child: std::process::Child) -> (i32, String, String) {
    let out = child.wait_with_output().expect("wait");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn wait_for_exits_0_when_the_waitpoint_fires() {
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "job", "intent": "x"}));
    let child = spawn_wait_for(&hub, wp["id"].as_str().expect("id"), "60s");
    // No sleep: whether the signal lands before or after the waiter arms, `wait for`
    // reads the log's position before the waitpoint, so it reports the wake either way.
    assert_eq!(hub.signal(&body(&wp, json!({"message": "landed"}))).0, 202);
    let (code, out, err) = finish(child);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        err.lines().count(),
        2,
        "one line when armed, one naming the seq to resume after: {err}"
    );
    let wake: Value = serde_json::from_str(out.trim()).expect("one JSON object on stdout");
    assert_eq!(wake["kind"], "wake");
    assert_eq!(wake["reason"], "fired");
}

#[test]
fn wait_for_exits_1_on_its_timeout_and_on_expiry() {
    let hub = Hub::start_with(&[("CORTEX_WAITPOINT_SWEEP_MS", "100")]);
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "quiet", "intent": "x"}));
    let (code, out, _) = finish(spawn_wait_for(&hub, wp["id"].as_str().expect("id"), "1s"));
    assert_eq!(code, 1);
    assert!(
        out.trim().is_empty(),
        "nothing on stdout when nothing fired"
    );
    let short = hub.waitpoint(
        &sid,
        json!({"label": "short", "intent": "x", "expires_in_hours": 0.0005}),
    );
    let (code, out, _) = finish(spawn_wait_for(
        &hub,
        short["id"].as_str().expect("id"),
        "60s",
    ));
    assert_eq!(code, 1, "an expired waitpoint is a timeout");
    let wake: Value = serde_json::from_str(out.trim()).expect("the expiry notice on stdout");
    assert_eq!(wake["reason"], "expired");
}

#[test]
fn wait_for_exits_2_when_the_waitpoint_is_cancelled_or_unknown() {
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "job", "intent": "x"}));
    let id = wp["id"].as_str().expect("id").to_string();
    let child = spawn_wait_for(&hub, &id, "60s");
    let (code, _, err) = hub.cortex(&["wait", "cancel", &id]);
    assert_eq!(code, 0, "{err}");
    let (code, _, _) = finish(child);
    assert_eq!(code, 2, "cancelled is broke, not quiet");
    let (code, _, err) = hub.cortex(&["wait", "for", "wp_000000000000", "--timeout", "5s"]);
    assert_eq!(code, 2, "{err}");
}
