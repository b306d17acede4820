//! Devices, exits, pipes.

use super::*;
use crate::testserver::refused_addr;

fn device_json(name: &str, state: &str, host: Option<Value>) -> Value {
    json!({"name": name, "state": state, "since": 1, "last_seen": 1, "agent_version": "0.1.0",
        "host": host, "spool": {"pending": 0, "bad": 0}, "waits": 0})
}

#[test]
fn devices_show_host_facts_and_every_state_the_hub_gives() {
    let list = json!([
        device_json(
            "gpu1",
            "online",
            Some(json!({"hostname": "trainer-1", "kernel": "6.1.0",
            "cpus": 64, "gpus": ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"]}))
        ),
        device_json("old", "revoked", None),
        device_json(
            "cpu2",
            "offline",
            Some(json!({"hostname": "cpu-2", "kernel": "", "cpus": 0}))
        ),
    ]);
    let server = TestServer::canned(vec![answer(200, &list.to_string())]);
    let (code, out, err) = exec(&server, &["devices"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("NAME  STATE    HOST"), "{out}");
    assert!(lines[0].contains("  GPUS  "), "{out}");
    assert!(
        lines[1].contains("trainer-1 (64 CPUs, 6.1.0)") && lines[1].contains("2×A100"),
        "{out}"
    );
    assert!(
        lines[2].starts_with("old   revoked  -"),
        "a revoked device is a row: {out}"
    );
    assert!(lines[3].contains("cpu-2 "), "{out}");
    assert_eq!(lines.len(), 4, "{out}");
}

#[test]
fn an_unknown_device_is_refused_in_one_line() {
    // `wait create --device`: the device is looked up first.
    let server = TestServer::canned(vec![answer(
        404,
        r#"{"error":"not_found","message":"no device \"gpu9\"; list them with `cortex devices`"}"#,
    )]);
    let (code, out, err) = exec(
        &server,
        &[
            "wait",
            "create",
            "--session",
            "ses_1",
            "--label",
            "l",
            "--intent",
            "i",
            "--device",
            "gpu9",
        ],
    );
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert_eq!(
        err,
        "cortex: no device named gpu9 (cortex devices lists them)\n"
    );
    assert_eq!(server.next_request().path, "/api/devices/gpu9");

    // The hub's own 404 to the creation (the device revoked in between) says the same.
    let server = TestServer::canned(vec![
        answer(200, &device_json("gpu9", "online", None).to_string()),
        answer(
            404,
            r#"{"error":"unknown_device","message":"unknown device gpu9"}"#,
        ),
    ]);
    let (code, _, err) = exec(
        &server,
        &[
            "wait",
            "create",
            "--session",
            "ses_1",
            "--label",
            "l",
            "--intent",
            "i",
            "--device",
            "gpu9",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        err,
        "cortex: no device named gpu9 (cortex devices lists them)\n"
    );

    // `wait pid --device`: the same line, before anything is made.
    let server = TestServer::canned(vec![answer(
        404,
        r#"{"error":"not_found","message":"no device \"gpu9\"; list them with `cortex devices`"}"#,
    )]);
    let (code, _, err) = exec(&server, &["wait", "pid", "1", "--device", "gpu9"]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        err,
        "cortex: no device named gpu9 (cortex devices lists them)\n"
    );
}

#[test]
fn a_bare_remote_wait_reuses_the_users_default_session() {
    let created = json!({
        "waitpoint": serde_json::to_value(created()).expect("json"),
        "wait": {"id": "wp_1", "device": "gpu1", "kind": "pid", "pid": 42, "state": "pending",
            "created_at": 1, "deadline": 2},
    });
    let mut mine = session_view("ses_old", Some("cortex waits (ada)"), 0);
    mine.created_at = 1;
    let sessions = serde_json::to_string(&vec![
        session_view("ses_other", Some("cortex waits (bob)"), 0),
        session_view("ses_new", Some("cortex waits (ada)"), 0),
        mine,
    ])
    .expect("json");
    let server = TestServer::canned(vec![
        answer(200, &device_json("gpu1", "online", None).to_string()),
        answer(200, &sessions),
        answer(201, &created.to_string()),
        answer(404, r#"{"error":"not_found","message":"gone"}"#),
    ]);
    // The wait itself is not waited for here: the canned hub forgets the waitpoint after
    // the creation, so it breaks; what matters is where it went.
    let _ = exec(
        &server,
        &["wait", "pid", "42", "--device", "gpu1", "--timeout", "1s"],
    );
    assert_eq!(server.next_request().path, "/api/devices/gpu1");
    assert_eq!(server.next_request().path, "/api/sessions");
    let post = server.next_request();
    assert_eq!(post.path, "/api/devices/gpu1/waits");
    assert_eq!(
        post.json()["session"],
        "ses_old",
        "the oldest of the user's own"
    );

    // None yet, or deleted: one is made with the user's title.
    let server = TestServer::canned(vec![
        answer(200, &device_json("gpu1", "online", None).to_string()),
        answer(200, "[]"),
        answer(201, r#"{"id":"ses_made"}"#),
        answer(201, &created.to_string()),
        answer(404, r#"{"error":"not_found","message":"gone"}"#),
    ]);
    let _ = exec(
        &server,
        &["wait", "pid", "42", "--device", "gpu1", "--timeout", "1s"],
    );
    let _ = server.next_request();
    let _ = server.next_request();
    let made = server.next_request();
    assert_eq!(made.path, "/api/sessions");
    assert_eq!(made.json(), json!({"title": "cortex waits (ada)"}));
    assert_eq!(server.next_request().json()["session"], "ses_made");
}

#[test]
fn session_delete_deletes() {
    let server = TestServer::canned(vec![answer(200, r#"{"id":"ses_1","deleted":true}"#)]);
    let (code, out, err) = exec(&server, &["session", "delete", "ses_1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("deleted session ses_1"), "{out}");
    let req = server.next_request();
    assert_eq!(
        (req.method.as_str(), req.path.as_str()),
        ("DELETE", "/api/sessions/ses_1")
    );
}

#[test]
fn an_unreachable_hub_is_one_exit_status_for_every_command() {
    let url = format!("http://{}", refused_addr());
    for argv in [
        &["sessions"][..],
        &["session", "new"],
        &["devices"],
        &[
            "wait",
            "create",
            "--session",
            "ses_1",
            "--label",
            "l",
            "--intent",
            "i",
        ],
        &["wait", "check", "wp_1"],
    ] {
        let mut full = vec!["--hub", url.as_str()];
        full.extend_from_slice(argv);
        let cli = parse(&full).expect("parse");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(&cli, &env(), &mut out, &mut err);
        let err = String::from_utf8_lossy(&err);
        assert_eq!(code, UNREACHABLE, "{argv:?}: {err}");
        assert!(err.contains("cannot reach the hub"), "{err}");
    }
}

/// A reader that closed the pipe: every write fails with EPIPE.
struct ClosedPipe;

impl std::io::Write for ClosedPipe {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::BrokenPipe.into())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Err(std::io::ErrorKind::BrokenPipe.into())
    }
}

#[test]
fn a_closed_pipe_ends_quietly_with_0() {
    let list = serde_json::to_string(&vec![session_view("ses_1", Some("a"), 0)]).expect("json");
    let server = TestServer::canned(vec![
        answer(200, &list),
        answer(200, &some_events().to_string()),
    ]);
    for argv in [&["sessions"][..], &["session", "events", "ses_1"]] {
        let url = server.url("");
        let mut full = vec!["--hub", url.as_str()];
        full.extend_from_slice(argv);
        let cli = parse(&full).expect("parse");
        let mut err = Vec::new();
        let code = run(&cli, &env(), &mut ClosedPipe, &mut err);
        assert_eq!(code, 0, "{argv:?}");
        assert!(err.is_empty(), "quiet: {}", String::from_utf8_lossy(&err));
    }
}

#[test]
fn the_hubs_field_names_are_said_as_the_flags_typed() {
    let fields = [
        ("max_signals", "--max-signals"),
        ("silence_after", "--silence-after"),
        ("expires_in_hours", "--expires-in-hours"),
        ("spawn.title", "--spawn-title"),
        ("coalesce", "--coalesce"),
        ("quorum", "--quorum"),
        ("members", "--members"),
    ];
    for (hub_said, user_reads) in [
        (
            "coalesce is for monitors only: set max_signals above 1 (a one-shot waitpoint wakes once anyway)",
            "--coalesce is for monitors only: set --max-signals above 1 (a one-shot waitpoint wakes once anyway)",
        ),
        (
            "silence_after must be between 1s and the waitpoint's lifetime (7d); got 9d. Give a duration like \"20m\", or a longer expires_in_hours",
            "--silence-after must be between 1s and the waitpoint's lifetime (7d); got 9d. Give a duration like \"20m\", or a longer --expires-in-hours",
        ),
        (
            "quorum 3 is more than the 2 members named; use at most 2 or \"all\"",
            "--quorum 3 is more than the 2 members named; use at most 2 or \"all\"",
        ),
        (
            "spawn.title is 90 characters; keep it under 80",
            "--spawn-title is 90 characters; keep it under 80",
        ),
        // Not a field where it stands inside a longer name, or as a plain word mid-text.
        (
            "my_max_signals_x and max_signalsy",
            "my_max_signals_x and max_signalsy",
        ),
        ("nothing to coalesce here", "nothing to coalesce here"),
    ] {
        assert_eq!(in_flags(hub_said, &fields), user_reads);
    }
}
