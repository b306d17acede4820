//! Tests of `cortex`'s commands against canned hubs on port 0: flags to request bodies,
//! tables, `--json`, and exit codes.

use clap::{CommandFactory, Parser};
use cortex_protocol::api::{HowToSignal, SessionView, WaitpointCreated};
use serde_json::{Value, json};

use super::*;
use crate::testserver::{TestServer, json as answer};

fn parse(argv: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("cortex").chain(argv.iter().copied()))
}

fn env() -> CortexEnv {
    CortexEnv {
        webhook_port: None,
        token: Some("tok".into()),
        cortex_home: Err(HomeError::NoHome),
    }
}

/// Runs `cortex --hub <server> argv…`; returns exit status, stdout, stderr.
fn exec(server: &TestServer, argv: &[&str]) -> (u8, String, String) {
    let url = server.url("");
    let mut full = vec!["--hub", url.as_str()];
    full.extend_from_slice(argv);
    let cli = parse(&full).expect("flags parse");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run(&cli, &env(), &mut out, &mut err);
    (
        code,
        String::from_utf8(out).expect("utf8"),
        String::from_utf8(err).expect("utf8"),
    )
}

fn session_view(id: &str, title: Option<&str>, armed: u32) -> SessionView {
    SessionView {
        id: id.into(),
        title: title.map(Into::into),
        created_at: 1_786_615_445_000,
        last_seq: 3,
        armed_waitpoints: armed,
    }
}

#[test]
fn flags_are_well_formed() {
    Cli::command().debug_assert();
}

#[test]
fn create_flags_become_the_protocol_body() {
    let cli = parse(&[
        "wait",
        "create",
        "--session",
        "ses_1",
        "--label",
        "T2 ladder",
        "--intent",
        "all three arms",
        "--member",
        "arm2",
        "--members",
        "arm6, arm8,arm2",
        "--quorum",
        "2",
        "--fail-fast",
        "false",
        "--max-signals",
        "3",
        "--expires-in-hours",
        "1.5",
        "--device",
        "box",
    ])
    .expect("parse");
    let Command::Wait(WaitCommand::Create(args)) = cli.command else {
        panic!("not wait create")
    };
    let body = serde_json::to_value(wait::create_body(&args)).expect("ser");
    assert_eq!(
        body,
        json!({"label": "T2 ladder", "intent": "all three arms", "members": ["arm2", "arm6", "arm8"],
            "quorum": 2, "fail_fast": false, "max_signals": 3, "expires_in_hours": 1.5, "device": "box"})
    );

    let cli = parse(&[
        "wait",
        "create",
        "--session",
        "s",
        "--label",
        "l",
        "--intent",
        "i",
        "--quorum",
        "all",
    ])
    .expect("parse");
    let Command::Wait(WaitCommand::Create(args)) = cli.command else {
        panic!("not wait create")
    };
    let body = serde_json::to_value(wait::create_body(&args)).expect("ser");
    assert_eq!(body, json!({"label": "l", "intent": "i", "quorum": "all"}));
}

#[test]
fn bad_arguments_are_usage_errors() {
    for argv in [
        &[
            "wait", "create", "--label", "l", "--intent", "i", "--quorum", "most",
        ][..],
        &[
            "wait",
            "create",
            "--label",
            "l",
            "--intent",
            "i",
            "--expires-in-hours",
            "-1",
        ],
        &[
            "wait",
            "create",
            "--label",
            "l",
            "--intent",
            "i",
            "--fail-fast",
            "maybe",
        ],
        &["wait", "create", "--label", "l"],
        &["wait", "for", "wp_1", "--timeout", "soon"],
        &["wait", "for"],
        &[],
    ] {
        let e = parse(argv).expect_err("usage error");
        assert_eq!(e.exit_code(), 2, "{argv:?}");
    }
    let cli = parse(&["wait", "for", "wp_1", "--timeout", "1.5h"]).expect("parse");
    let Command::Wait(WaitCommand::For { timeout, .. }) = cli.command else {
        panic!("not wait for")
    };
    assert_eq!(timeout, Some(Duration::from_secs(5400)));
}

#[test]
fn hub_address() {
    assert_eq!(
        hub_url(None, None).expect("default"),
        "http://127.0.0.1:3001"
    );
    assert_eq!(
        hub_url(None, Some("4000")).expect("port"),
        "http://127.0.0.1:4000"
    );
    assert_eq!(
        hub_url(Some("http://h:1"), Some("4000")).expect("flag"),
        "http://h:1"
    );
    assert_eq!(
        hub_url(Some(""), None).expect("empty flag"),
        "http://127.0.0.1:3001"
    );
    assert!(hub_url(None, Some("x")).is_err());
}

#[test]
fn no_token_says_where_to_get_one() {
    let home = tempfile::tempdir().expect("tempdir");
    let cli = parse(&["--hub", "http://127.0.0.1:9", "sessions"]).expect("parse");
    let env = CortexEnv {
        webhook_port: None,
        token: None,
        cortex_home: Ok(home.path().to_path_buf()),
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(run(&cli, &env, &mut out, &mut err), 1);
    let err = String::from_utf8(err).expect("utf8");
    assert!(
        err.contains("no operator token: set CORTEX_WEBHOOK_TOKEN"),
        "{err}"
    );
}

#[test]
fn sessions_as_a_table_or_json() {
    let list = serde_json::to_string(&vec![
        session_view("ses_1", Some("nightly"), 1),
        session_view("ses_22", None, 0),
    ])
    .expect("ser");
    let server = TestServer::canned(vec![
        answer(200, &list),
        answer(200, &list),
        answer(200, "[]"),
    ]);
    let (code, out, err) = exec(&server, &["sessions"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with("ID      TITLE    ARMED  CREATED"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("ses_1   nightly  1      2026-08-13 10:04:05Z"),
        "{out}"
    );
    assert!(lines[2].starts_with("ses_22  -        0"), "{out}");
    let req = server.next_request();
    assert_eq!(
        (req.method.as_str(), req.path.as_str()),
        ("GET", "/api/sessions")
    );
    assert_eq!(req.header("authorization"), Some("Bearer tok"));

    let (_, out, _) = exec(&server, &["sessions", "--json"]);
    assert_eq!(out, format!("{list}\n"));
    let (_, out, _) = exec(&server, &["sessions"]);
    assert!(out.contains("no sessions yet"), "{out}");
}

#[test]
fn session_new_prints_the_id() {
    let server = TestServer::canned(vec![answer(
        201,
        &serde_json::to_string(&session_view("ses_9", Some("T"), 0)).expect("ser"),
    )]);
    let (code, out, _) = exec(&server, &["session", "new", "--title", "T"]);
    assert_eq!((code, out.as_str()), (0, "ses_9\n"));
    let req = server.next_request();
    assert_eq!(
        (req.method.as_str(), req.path.as_str()),
        ("POST", "/api/sessions")
    );
    assert_eq!(req.json(), json!({"title": "T"}));
}

#[test]
fn session_say_posts_the_message() {
    let server = TestServer::canned(vec![
        answer(200, r#"{"seq":4,"duplicate":false}"#),
        answer(200, r#"{"seq":4,"duplicate":true}"#),
    ]);
    let (code, out, _) = exec(
        &server,
        &[
            "session",
            "say",
            "ses_1",
            "look at the queue",
            "--now",
            "--dedupe-key",
            "k1",
        ],
    );
    assert_eq!((code, out.as_str()), (0, "seq 4\n"));
    let req = server.next_request();
    assert_eq!(req.path, "/api/sessions/ses_1/messages");
    assert_eq!(
        req.json(),
        json!({"text": "look at the queue", "when": "now", "dedupe_key": "k1"})
    );
    let (_, out, _) = exec(&server, &["session", "say", "ses_1", "again"]);
    assert!(out.contains("duplicate"), "{out}");
    assert_eq!(
        server.next_request().json(),
        json!({"text": "again", "when": "next_turn"})
    );
}

fn some_events() -> Value {
    json!({"events": [
        {"seq": 1, "ts": 1_786_615_445_000u64, "kind": "message", "text": "hello\nsecond line", "when": "now"},
        {"seq": 2, "ts": 1_786_615_446_000u64, "kind": "wake", "waitpoint": {"id": "wp_1", "label": "nightly", "intent": "i"},
         "reason": "fired", "waited_ms": 10, "signals": [], "text": "Waitpoint nightly fired.\n\nData: ok"},
        {"seq": 3, "ts": 1_786_615_447_000u64, "kind": "tool-start", "tool": "wait_check"}
    ]})
}

#[test]
fn session_events_read_page_after_page() {
    let server = TestServer::canned(vec![
        answer(200, &some_events().to_string()),
        answer(200, r#"{"events":[]}"#),
        answer(200, &some_events().to_string()),
        answer(200, r#"{"events":[]}"#),
    ]);
    let (code, out, err) = exec(&server, &["session", "events", "ses_1", "--after", "0"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "    1  2026-08-13 10:04:05Z  message              [now] hello …"
    );
    assert_eq!(
        lines[1],
        "    2  2026-08-13 10:04:06Z  wake                 wp_1 \"nightly\" fired"
    );
    assert_eq!(lines[2], "    Waitpoint nightly fired.");
    assert_eq!(lines[3], "", "no trailing spaces on an empty line");
    assert_eq!(lines[4], "    Data: ok");
    assert_eq!(
        lines[5],
        r#"    3  2026-08-13 10:04:07Z  tool-start           {"tool":"wait_check"}"#
    );
    let paths: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        [
            "/api/sessions/ses_1/events?after=0",
            "/api/sessions/ses_1/events?after=3"
        ]
    );

    let (_, out, _) = exec(&server, &["--json", "session", "events", "ses_1"]);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[1]["kind"], "wake");
}

fn created() -> WaitpointCreated {
    WaitpointCreated {
        id: "wp_1a2b".into(),
        secret: "s3cr3t".into(),
        state: "armed".into(),
        session: "ses_1".into(),
        label: "nightly".into(),
        intent: "compare".into(),
        created_at: 1,
        expires_at: 1_786_615_445_000,
        members: vec!["arm2".into()],
        quorum: 1,
        fail_fast: true,
        max_signals: 1,
        device: None,
        how_to_signal: HowToSignal {
            env: "export CORTEX_SIGNAL_ID=wp_1a2b CORTEX_SIGNAL_SECRET=s3cr3t".into(),
            cli: "cortex-signal --exit-code $? --member MEMBER".into(),
            curl: "curl …".into(),
            shell: "printf …".into(),
            attach_to_pid: "(while kill -0 PID …".into(),
            recommended: "cli".into(),
        },
        member_note: Some("replace MEMBER with one of: arm2".into()),
    }
}

#[test]
fn wait_create_hands_out_the_secret_and_how_to_signal() {
    let body = serde_json::to_string(&created()).expect("ser");
    let server = TestServer::canned(vec![answer(201, &body), answer(201, &body)]);
    let (code, out, err) = exec(
        &server,
        &[
            "wait",
            "create",
            "--session",
            "ses_1",
            "--label",
            "nightly",
            "--intent",
            "compare",
            "--member",
            "arm2",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "wp_1a2b  armed  nightly");
    assert!(lines[1].starts_with("secret: s3cr3t"), "{out}");
    assert!(
        lines[2].starts_with("expires: 2026-08-13 10:04:05Z"),
        "{out}"
    );
    assert_eq!(
        &lines[3..],
        [
            "signal it with:",
            "  export CORTEX_SIGNAL_ID=wp_1a2b CORTEX_SIGNAL_SECRET=s3cr3t",
            "  cortex-signal --exit-code $? --member MEMBER",
            "note: replace MEMBER with one of: arm2"
        ]
    );
    let req = server.next_request();
    assert_eq!(
        (req.method.as_str(), req.path.as_str()),
        ("POST", "/api/sessions/ses_1/waitpoints")
    );
    assert_eq!(req.json()["members"], json!(["arm2"]));

    let (_, out, _) = exec(
        &server,
        &[
            "wait",
            "create",
            "--json",
            "--session",
            "ses_1",
            "--label",
            "l",
            "--intent",
            "i",
        ],
    );
    assert_eq!(out, format!("{body}\n"));
}

#[test]
fn wait_create_without_a_session_breaks() {
    if std::env::var_os("CORTEX_SESSION").is_some() {
        return; // the variable would supply the session
    }
    let server = TestServer::canned(vec![]);
    let (code, _, err) = exec(
        &server,
        &["wait", "create", "--label", "l", "--intent", "i"],
    );
    assert_eq!(code, 2);
    assert!(
        err.contains("no session: pass --session SID or set CORTEX_SESSION"),
        "{err}"
    );
}

fn waitpoint_view(id: &str, state: &str) -> Value {
    json!({"id": id, "session": "ses_1", "label": "nightly", "intent": "i", "state": state,
        "created_at": 1, "expires_at": 1_786_615_445_000u64, "members": [], "quorum": 2, "fail_fast": true,
        "max_signals": 1, "signal_count": 2,
        "signals": [
            {"status": "ok", "message": null, "member": null, "data": null, "source": "http", "key": null, "at": 1},
            {"status": "progress", "message": null, "member": null, "data": null, "source": "http", "key": null, "at": 2}
        ],
        "wakes": [], "badges": {"wake_limit_reached": false, "delivery_attempts": 0, "wakes_this_hour": 0, "max_wakes_per_hour": 12}})
}

#[test]
fn wait_check_one_or_a_sessions() {
    let list = json!({"waitpoints": [waitpoint_view("wp_1", "armed"), waitpoint_view("wp_2", "resolved")]});
    let server = TestServer::canned(vec![
        answer(200, &waitpoint_view("wp_1", "armed").to_string()),
        answer(200, &list.to_string()),
    ]);
    let (code, out, err) = exec(&server, &["wait", "check", "wp_1"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(server.next_request().path, "/api/waitpoints/wp_1");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "ID    LABEL    STATE  SIGNALS          EXPIRES");
    assert!(
        lines[1].starts_with("wp_1  nightly  armed  1/2 +1 progress  2026-08-13 10:04:05Z"),
        "{out}"
    );

    let (code, out, _) = exec(&server, &["wait", "check", "--session", "ses_1"]);
    assert_eq!(code, 0);
    assert_eq!(server.next_request().path, "/api/sessions/ses_1/waitpoints");
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(out.contains("wp_2  nightly  resolved"), "{out}");
}

#[test]
fn wait_cancel_deletes() {
    let server = TestServer::canned(vec![
        answer(200, r#"{"id":"wp_1","state":"cancelled","cancelled":true}"#),
        b"HTTP/1.1 204 No Content\r\n\r\n".to_vec(),
        answer(200, r#"{"id":"wp_1","state":"resolved","cancelled":false}"#),
        answer(
            404,
            r#"{"error":"unknown_waitpoint","message":"no waitpoint wp_x; check the id"}"#,
        ),
    ]);
    let (code, out, _) = exec(&server, &["wait", "cancel", "wp_1"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("cancelled wp_1"), "{out}");
    let req = server.next_request();
    assert_eq!(
        (req.method.as_str(), req.path.as_str()),
        ("DELETE", "/api/waitpoints/wp_1")
    );
    let (_, out, _) = exec(&server, &["wait", "cancel", "wp_1", "--json"]);
    assert_eq!(
        serde_json::from_str::<Value>(&out).expect("json"),
        json!({"id": "wp_1", "state": "cancelled"})
    );
    let (code, out, _) = exec(&server, &["wait", "cancel", "wp_1"]);
    assert_eq!(
        (code, out.as_str()),
        (0, "wp_1 had already ended (resolved); nothing to cancel\n")
    );
    let (code, _, err) = exec(&server, &["wait", "cancel", "wp_x"]);
    assert_eq!(
        code, 2,
        "a failed `cortex wait …` is 2, never 1 (timed out)"
    );
    assert!(
        err.contains("no waitpoint wp_x; check the id (HTTP 404)"),
        "{err}"
    );
}

#[test]
fn hub_refusals_print_its_message_and_exit_1() {
    let server = TestServer::canned(vec![answer(
        401,
        r#"{"error":"unauthorized","message":"wrong operator token"}"#,
    )]);
    let (code, out, err) = exec(&server, &["sessions"]);
    assert_eq!((code, out.as_str()), (1, ""));
    assert!(err.starts_with("cortex: listing the sessions: wrong operator token (HTTP 401; check CORTEX_WEBHOOK_TOKEN"), "{err}");
}
