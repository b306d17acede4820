//! Tests of `cortex`'s commands against canned hubs on port 0: flags to request bodies,
//! tables, `--json`, and exit codes.

use std::time::Duration;

use clap::{CommandFactory, Parser};
use cortex_protocol::api::{HowToSignal, SessionView, WaitpointCreated, WaitpointHead};
use serde_json::{Value, json};

use super::*;
use crate::testserver::{TestServer, json as answer, refused_addr};

/// `wait create --session s --label l --intent i EXTRA…`'s request body, as JSON.
fn create_body_of(extra: &[&str]) -> Value {
    let mut argv = vec![
        "wait",
        "create",
        "--session",
        "s",
        "--label",
        "l",
        "--intent",
        "i",
    ];
    argv.extend_from_slice(extra);
    let cli = parse(&argv).expect("parse");
    let Command::Wait(WaitCommand::Create(args)) = cli.command else {
        panic!("not wait create")
    };
    serde_json::to_value(wait::create_body(&args).expect("body")).expect("ser")
}

fn parse(argv: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("cortex").chain(argv.iter().copied()))
}

fn env() -> CortexEnv {
    CortexEnv {
        webhook_port: None,
        token: Some("tok".into()),
        cortex_home: Err(HomeError::NoHome),
        user: Some("ada".into()),
        term: Term::default(),
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
        spawned_from: None,
        runs: true,
        state: Default::default(),
        config: None,
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
    let body = serde_json::to_value(wait::create_body(&args).expect("body")).expect("ser");
    assert_eq!(
        body,
        json!({"label": "T2 ladder", "intent": "all three arms", "members": ["arm2", "arm6", "arm8"],
            "quorum": 2, "fail_fast": false, "max_signals": 3, "expires_in_hours": 1.5, "device": "box"})
    );

    let body = create_body_of(&["--expires-in", "90s"]);
    assert_eq!(
        body["expires_in_hours"]
            .as_f64()
            .map(|h| (h * 3_600_000.0).round()),
        Some(90_000.0),
        "--expires-in is a duration, to the millisecond: {body}"
    );
    assert!(
        parse(&[
            "wait",
            "create",
            "--session",
            "s",
            "--label",
            "l",
            "--intent",
            "i",
            "--expires-in",
            "1m",
            "--expires-in-hours",
            "1",
        ])
        .is_err(),
        "one deadline"
    );

    let body = create_body_of(&["--quorum", "all"]);
    assert_eq!(body, json!({"label": "l", "intent": "i", "quorum": "all"}));
}

#[test]
fn wait_create_takes_the_monitor_rules() {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("spawn.txt");
    std::fs::write(&file, "Triage the report.\n").expect("write");
    let at_file = format!("@{}", file.display());
    let cli = parse(&[
        "wait",
        "create",
        "--session",
        "s",
        "--label",
        "l",
        "--intent",
        "i",
        "--max-signals",
        "10",
        "--silence-after",
        "20m",
        "--coalesce",
        "1.5",
        "--spawn-instructions",
        &at_file,
        "--spawn-title",
        "triage",
    ])
    .expect("parse");
    let Command::Wait(WaitCommand::Create(args)) = cli.command else {
        panic!("not wait create")
    };
    let body = serde_json::to_value(wait::create_body(&args).expect("body")).expect("ser");
    assert_eq!(
        body,
        json!({"label": "l", "intent": "i", "max_signals": 10, "silence_after": 1200.0,
            "coalesce": 1.5, "spawn": {"instructions": "Triage the report.\n", "title": "triage"}})
    );
    // A title alone is a usage error; so is a duration that is not one.
    for argv in [
        &[
            "wait",
            "create",
            "--label",
            "l",
            "--intent",
            "i",
            "--spawn-title",
            "t",
        ][..],
        &[
            "wait",
            "create",
            "--label",
            "l",
            "--intent",
            "i",
            "--silence-after",
            "soon",
        ][..],
    ] {
        assert!(parse(argv).is_err(), "{argv:?}");
    }
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
    let file = Some("http://127.0.0.1:40123");
    for (flag, port, from_file, want) in [
        (None, None, None, "http://127.0.0.1:3001"),
        (None, Some("4000"), None, "http://127.0.0.1:4000"),
        (Some("http://h:1"), Some("4000"), file, "http://h:1"),
        (Some(""), None, None, "http://127.0.0.1:3001"),
        // The running hub's own word, when nothing was said.
        (None, None, file, "http://127.0.0.1:40123"),
        (Some(""), Some(" "), file, "http://127.0.0.1:40123"),
        // What was said wins over the file.
        (None, Some("4000"), file, "http://127.0.0.1:4000"),
        (Some("http://h:1"), None, file, "http://h:1"),
        (None, None, Some("  "), "http://127.0.0.1:3001"),
    ] {
        assert_eq!(
            hub_url(flag, port, from_file).expect("an address"),
            want,
            "{flag:?} {port:?} {from_file:?}"
        );
    }
    assert!(hub_url(None, Some("x"), file).is_err());
}

#[test]
fn no_token_says_where_to_get_one() {
    let home = tempfile::tempdir().expect("tempdir");
    let cli = parse(&["--hub", "http://127.0.0.1:9", "sessions"]).expect("parse");
    let env = CortexEnv {
        webhook_port: None,
        token: None,
        cortex_home: Ok(home.path().to_path_buf()),
        user: None,
        term: Term::default(),
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
    use cortex_protocol::api::SessionState;
    // The hub lists them oldest first; the table shows the newest first, with the state.
    let newer = SessionView {
        created_at: 1_786_615_446_000,
        state: SessionState::WaitingOnMachine,
        runs: false,
        ..session_view("ses_22", None, 1)
    };
    let older = SessionView {
        state: SessionState::WaitingOnYou,
        ..session_view("ses_1", Some("nightly"), 0)
    };
    let list = serde_json::to_string(&vec![older, newer]).expect("ser");
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
        lines[0].starts_with("ID      TITLE    STATE                 KIND     ARMED  CREATED"),
        "{out}"
    );
    assert!(
        lines[1].starts_with(
            "ses_22  -        waiting on a machine  mailbox  1      2026-08-13 10:04:06Z"
        ),
        "{out}"
    );
    assert!(
        lines[2].starts_with(
            "ses_1   nightly  waiting on you        agent    0      2026-08-13 10:04:05Z"
        ),
        "{out}"
    );
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
        head: WaitpointHead {
            id: "wp_1a2b".into(),
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
            silence_after_ms: None,
            coalesce_ms: None,
            spawn: false,
        },
        secret: "s3cr3t".into(),
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
            {"status": "progress", "message": "epoch 3 of 10", "member": "a", "data": null, "source": "http", "key": null, "at": 2}
        ],
        "wakes": [{"reason": "fired", "at": 3, "delivered": true}],
        "badges": {"wake_limit_reached": true, "delivery_attempts": 0, "wakes_this_hour": 1, "max_wakes_per_hour": 12}})
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
    // The signals, wakes and badges --json has, for people too.
    assert!(
        out.contains("\nsignals:\n  STATUS    MEMBER  SOURCE  AT"),
        "{out}"
    );
    assert!(
        out.contains("\n  ok        -       http    1970-01-01"),
        "{out}"
    );
    assert!(
        out.contains("\n  progress  a       http    1970-01-01"),
        "{out}"
    );
    assert!(out.contains("epoch 3 of 10"), "{out}");
    assert!(out.contains("\nwakes:\n  REASON  AT"), "{out}");
    assert!(out.contains("\n  fired   1970-01-01 00:00:00Z"), "{out}");
    assert!(
        out.contains("badges: 1 of 12 wakes this hour; wake limit reached"),
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
    assert!(
        err.starts_with("cortex: listing the sessions: the hub refused the operator token (HTTP 401; check CORTEX_WEBHOOK_TOKEN"),
        "{err}"
    );
    assert_eq!(err.matches("CORTEX_WEBHOOK_TOKEN").count(), 1, "{err}");
}

// ------------------------------------------------------------- a session that runs a model

/// An SSE answer whose body is `body`, ended by closing the connection.
fn sse(body: &str) -> Vec<u8> {
    format!("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n{body}").into_bytes()
}

/// A stored event as the hub streams it.
fn stored(seq: u64, mut body: Value) -> String {
    body["seq"] = json!(seq);
    body["ts"] = json!(1_786_615_445_000u64);
    format!("id: {seq}\nevent: event\ndata: {body}\n\n")
}

fn live(run: &str, text: &str) -> String {
    let ev = json!({"seq": 0, "ts": 0, "kind": "model-delta", "run_id": run, "step": 1,
        "text": text, "channel": "text", "live": true});
    format!("event: live\ndata: {ev}\n\n")
}

fn run_start(run: &str, seq: u64) -> Value {
    json!({"kind": "run-start", "run_id": run, "input": [{"seq": seq, "kind": "message", "text": "q"}]})
}

fn run_end(run: &str, ok: bool) -> Value {
    let result = match ok {
        true => json!({"ok": true, "output": {"response": "Hello there."}}),
        false => json!({"ok": false, "error": {"code": "model_call_failed",
            "message": "the model server answered 502 three times"}}),
    };
    json!({"kind": "run-end", "run_id": run, "result": result, "meta": {"usage":
        {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}, "strategy": "emit",
        "steps": 1, "outputRetries": 0, "elapsedMs": 9}})
}

fn posted(seq: u64, duplicate: bool, runs: bool) -> Vec<u8> {
    answer(
        201,
        &json!({"seq": seq, "duplicate": duplicate, "runs": runs}).to_string(),
    )
}

fn session_json() -> Vec<u8> {
    answer(
        200,
        &serde_json::to_string(&session_view("ses_1", Some("t"), 0)).expect("json"),
    )
}

#[test]
fn session_new_reads_instructions_and_examples_from_files() {
    let dir = tempfile::tempdir().expect("tmp");
    let instructions = dir.path().join("sys.txt");
    std::fs::write(&instructions, "You watch training runs.\n").expect("write");
    let examples = dir.path().join("ex.json");
    std::fs::write(
        &examples,
        r#"[{"role":"user","content":"train"},{"role":"assistant","content":"armed"}]"#,
    )
    .expect("write");
    let server = TestServer::canned(vec![answer(
        201,
        &serde_json::to_string(&session_view("ses_9", None, 0)).expect("json"),
    )]);
    let (code, out, err) = exec(
        &server,
        &[
            "session",
            "new",
            "--title",
            "watch",
            "--instructions",
            &format!("@{}", instructions.display()),
            "--examples",
            &format!("@{}", examples.display()),
            "--max-tokens",
            "256",
        ],
    );
    assert_eq!((code, out.as_str()), (0, "ses_9\n"), "{err}");
    let req = server.next_request();
    assert_eq!(
        req.json(),
        json!({"title": "watch", "instructions": "You watch training runs.\n",
            "examples": [{"role": "user", "content": "train"},
                {"role": "assistant", "content": "armed"}],
            "maxTokens": 256})
    );
}

#[test]
fn session_new_flags_say_what_is_wrong() {
    let server = TestServer::canned(vec![]);
    let (code, _, err) = exec(
        &server,
        &["session", "new", "--instructions", "@/nonexistent/sys.txt"],
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("--instructions @/nonexistent/sys.txt: cannot read the file"),
        "{err}"
    );
    let dir = tempfile::tempdir().expect("tmp");
    let bad = dir.path().join("ex.json");
    std::fs::write(&bad, r#"{"role":"user"}"#).expect("write");
    let (code, _, err) = exec(
        &server,
        &[
            "session",
            "new",
            "--examples",
            &format!("@{}", bad.display()),
        ],
    );
    assert_eq!(code, 1);
    assert!(err.contains("not a JSON array of chat messages"), "{err}");
    let (code, _, err) = exec(&server, &["session", "new", "--examples", "[]"]);
    assert_eq!(code, 1);
    assert!(err.contains("--examples takes @FILE"), "{err}");
    assert!(parse(&["session", "new", "--max-tokens", "0"]).is_err());
    assert!(server.requests().is_empty(), "nothing was sent");
}

#[test]
fn instructions_text_at_at_and_stdin() {
    let args = |v: &str| NewArgs {
        title: None,
        instructions: Some(v.to_string()),
        examples: None,
        max_tokens: None,
        require_approval: None,
        deny: None,
        allow: None,
        approval_timeout: None,
        unattended: false,
        schema: None,
        strategy: None,
        runs: false,
    };
    let mut stdin = || Ok("from stdin".to_string());
    let body = sessions::create_body(&args("plain"), &mut stdin).expect("body");
    assert_eq!(body.instructions.as_deref(), Some("plain"));
    let body = sessions::create_body(&args("@@handle"), &mut stdin).expect("body");
    assert_eq!(body.instructions.as_deref(), Some("@handle"));
    let body = sessions::create_body(&args("@-"), &mut stdin).expect("body");
    assert_eq!(body.instructions.as_deref(), Some("from stdin"));
    let both = NewArgs {
        examples: Some("@-".into()),
        ..args("@-")
    };
    let e = sessions::create_body(&both, &mut stdin).expect_err("stdin twice");
    assert!(e.to_string().contains("stdin was already read"), "{e}");
}

#[test]
fn say_follow_prints_the_answer_of_the_run_that_took_the_message() {
    let tool_start = json!({"kind": "tool-start", "run_id": "r1", "step": 1, "call":
        {"id": "c1", "name": "wait_create", "args": {"label": "train"}}});
    let tool_end = json!({"kind": "tool-end", "run_id": "r1", "step": 1, "observation":
        {"call_id": "c1", "name": "wait_create", "ok": true, "result": {"id": "wp_1"}}});
    let stream = [
        // A run a wake started is not this message's.
        stored(4, run_start("r0", 2)),
        live("r0", "not mine"),
        stored(5, run_end("r0", true)),
        stored(6, run_start("r1", 4)),
        live("r1", "Hello "),
        live("r1", "there."),
        stored(7, tool_start),
        stored(8, tool_end),
        stored(
            9,
            json!({"kind": "model-delta", "run_id": "r1", "step": 1,
            "text": "Hello there.", "channel": "text"}),
        ),
        stored(10, run_end("r1", true)),
    ]
    .concat();
    let server = TestServer::canned(vec![session_json(), sse(&stream), posted(4, false, true)]);
    let (code, out, err) = exec(&server, &["session", "say", "ses_1", "hi", "--follow"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "Hello there.\n");
    assert_eq!(
        err,
        "→ wait_create {\"label\":\"train\"}\n← ok {\"id\":\"wp_1\"}\n"
    );
    let reqs = server.requests();
    let paths: Vec<&str> = reqs.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/api/sessions/ses_1",
            "/api/sessions/ses_1/events?after=3",
            "/api/sessions/ses_1/messages"
        ],
        "the stream is open before the message is posted"
    );
    assert_eq!(reqs[2].json(), json!({"text": "hi", "when": "next_turn"}));
}

#[test]
fn say_follow_exits_1_when_the_run_fails() {
    let stream = [
        stored(5, run_start("r1", 4)),
        live("r1", "Let me"),
        stored(6, run_end("r1", false)),
    ]
    .concat();
    let server = TestServer::canned(vec![session_json(), sse(&stream), posted(4, false, true)]);
    let (code, out, err) = exec(&server, &["session", "say", "ses_1", "hi", "--follow"]);
    assert_eq!((code, out.as_str()), (1, "Let me\n"));
    assert_eq!(
        err,
        "✗ run failed: model_call_failed: the model server answered 502 three times\n"
    );
}

#[test]
fn say_follow_exits_2_when_nothing_will_answer() {
    let server = TestServer::canned(vec![session_json(), sse(""), posted(4, false, false)]);
    let (code, out, err) = exec(&server, &["session", "say", "ses_1", "hi", "--follow"]);
    assert_eq!((code, out.as_str()), (2, ""));
    assert!(
        err.contains("the hub runs no model") && err.contains("CORTEX_LLM_BASE_URL"),
        "{err}"
    );

    let server = TestServer::canned(vec![answer(
        404,
        r#"{"error":"not_found","message":"no session ses_1"}"#,
    )]);
    let (code, _, err) = exec(&server, &["session", "say", "ses_1", "hi", "--follow"]);
    assert_eq!(code, 2);
    assert!(err.contains("no session ses_1"), "{err}");
}

#[test]
fn say_follow_resumes_a_dropped_stream_after_the_last_stored_event() {
    let first = [stored(5, run_start("r1", 4)), live("r1", "Hel")].concat();
    let rest = [
        stored(
            6,
            json!({"kind": "model-delta", "run_id": "r1", "step": 1,
            "text": "Hello", "channel": "text"}),
        ),
        stored(7, run_end("r1", true)),
    ]
    .concat();
    let server = TestServer::canned(vec![
        session_json(),
        sse(&first),
        posted(4, false, true),
        sse(&rest),
    ]);
    let (code, out, err) = exec(&server, &["session", "say", "ses_1", "hi", "--follow"]);
    assert_eq!((code, out.as_str()), (0, "Hello\n"), "{err}");
    assert!(
        err.contains("dropped") && err.contains("reconnected"),
        "{err}"
    );
    let reqs = server.requests();
    assert_eq!(reqs[3].path, "/api/sessions/ses_1/events?after=5");
}

#[test]
fn say_follow_of_a_duplicate_reads_from_the_first_post() {
    let stream = [
        stored(2, run_start("r1", 2)),
        stored(3, run_end("r1", true)),
    ]
    .concat();
    let server = TestServer::canned(vec![
        session_json(),
        sse(""),
        answer(200, r#"{"seq":2,"duplicate":true,"runs":true}"#),
        sse(&stream),
    ]);
    let (code, out, err) = exec(
        &server,
        &[
            "session",
            "say",
            "ses_1",
            "hi",
            "--dedupe-key",
            "k1",
            "--follow",
        ],
    );
    assert_eq!((code, out.as_str()), (0, "Hello there.\n"), "{err}");
    let reqs = server.requests();
    assert_eq!(reqs[2].json()["dedupe_key"], "k1");
    assert_eq!(reqs[3].path, "/api/sessions/ses_1/events?after=1");
}

#[test]
fn result_prints_the_response_or_the_error() {
    let ok = json!({"run_id": "r1", "result": run_end("r1", true)["result"],
        "meta": run_end("r1", true)["meta"]});
    let failed = json!({"run_id": "r2", "result": run_end("r2", false)["result"],
        "meta": run_end("r2", false)["meta"]});
    let server = TestServer::canned(vec![
        answer(200, &ok.to_string()),
        answer(200, &failed.to_string()),
        answer(200, &ok.to_string()),
        answer(
            404,
            r#"{"error":"not_found","message":"no run has ended in ses_1"}"#,
        ),
    ]);
    let (code, out, _) = exec(&server, &["session", "result", "ses_1"]);
    assert_eq!((code, out.as_str()), (0, "Hello there.\n"));
    let (code, out, err) = exec(&server, &["session", "result", "ses_1"]);
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(
        err,
        "cortex: run r2 failed: model_call_failed: the model server answered 502 three times\n"
    );
    let (code, out, _) = exec(&server, &["--json", "session", "result", "ses_1"]);
    assert_eq!(code, 0);
    assert_eq!(serde_json::from_str::<Value>(&out).expect("json"), ok);
    let (code, _, err) = exec(&server, &["session", "result", "ses_1"]);
    assert_eq!(code, 1);
    assert!(err.contains("no run has ended in ses_1"), "{err}");
    assert_eq!(server.next_request().path, "/api/sessions/ses_1/result");
}

#[test]
fn result_prints_data_as_json_and_the_response_beside_it() {
    let typed = json!({"run_id": "r3", "result": {"ok": true, "output":
        {"response": "It converged.", "data": {"converged": true, "loss": 0.12}}},
        "meta": run_end("r3", true)["meta"]});
    let server = TestServer::canned(vec![answer(200, &typed.to_string())]);
    let (code, out, err) = exec(&server, &["session", "result", "ses_1"]);
    assert_eq!(code, 0, "{err}");
    let data: Value = serde_json::from_str(&out).expect("stdout is the data as JSON");
    assert_eq!(data, json!({"converged": true, "loss": 0.12}));
    assert_eq!(err, "It converged.\n");
}

#[test]
fn schema_flag_reads_the_file_into_the_output_setting() {
    let dir = tempfile::tempdir().expect("tmp");
    let good = dir.path().join("s.json");
    std::fs::write(
        &good,
        r#"{"type":"object","properties":{"loss":{"type":"number"}}}"#,
    )
    .expect("write");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{not json").expect("write");
    let body = |argv: &[&str]| {
        let mut full = vec!["session", "new"];
        full.extend_from_slice(argv);
        let cli = parse(&full).expect("flags parse");
        let Command::Session(SessionCommand::New(a)) = &cli.command else {
            panic!("not session new: {cli:?}");
        };
        sessions::create_body(a, &mut || Ok(String::new()))
    };
    let at = format!("@{}", good.display());
    let b = body(&["--schema", &at, "--strategy", "Respond"]).expect("body");
    let out = b.output.expect("an output setting");
    assert_eq!(out.schema["properties"]["loss"]["type"], "number");
    assert_eq!(out.strategy, cortex_protocol::api::OutputStrategy::Respond);
    assert_eq!(body(&[]).expect("body").output, None);
    let e = body(&["--schema", &format!("@{}", bad.display())]).expect_err("bad JSON");
    assert!(format!("{e:#}").contains("not JSON"), "{e:#}");
    let e = body(&["--schema", "{}"]).expect_err("not a file");
    assert!(e.to_string().contains("--schema takes @FILE"), "{e}");
    assert!(
        parse(&["session", "new", "--strategy", "emit"]).is_err(),
        "needs --schema"
    );
    assert!(parse(&["session", "new", "--schema", &at, "--strategy", "grammar"]).is_err());
}

#[test]
fn policy_flags_make_the_sessions_policy() {
    let cli = parse(&[
        "session",
        "new",
        "--require-approval",
        "device_exec,wait_cancel",
        "--deny",
        "devices",
        "--approval-timeout",
        "90s",
        "--unattended",
    ])
    .expect("parses");
    let Command::Session(SessionCommand::New(args)) = &cli.command else {
        panic!("not session new: {cli:?}");
    };
    let body = sessions::create_body(args, &mut || Ok(String::new())).expect("body");
    let p = body.policy.expect("a policy");
    assert_eq!(
        p.require_approval,
        Some(vec!["device_exec".to_string(), "wait_cancel".to_string()])
    );
    assert_eq!(p.deny, Some(vec!["devices".to_string()]));
    assert_eq!(p.allow, None);
    assert_eq!(p.approval_timeout_ms, Some(90_000));
    assert_eq!(body.unattended, Some(true));
    let plain = parse(&["session", "new"]).expect("parses");
    let Command::Session(SessionCommand::New(args)) = &plain.command else {
        panic!("not session new");
    };
    let body = sessions::create_body(args, &mut || Ok(String::new())).expect("body");
    assert!(
        body.policy.is_none() && body.unattended.is_none(),
        "the hub's defaults apply"
    );
}

#[test]
fn an_answer_is_allow_or_deny_with_json() {
    let b = people::answer_body("req_1", "allow", true, Some(r#"{"pid": 7}"#), None).expect("ok");
    assert_eq!(b.decision, Some(cortex_protocol::api::Decision::Allow));
    assert!(b.always);
    assert_eq!(b.args, Some(serde_json::json!({"pid": 7})));
    assert!(people::answer_body("req_1", "maybe", false, None, None).is_err());
    assert!(people::answer_body("req_1", "allow", false, Some("[1]"), None).is_err());
    assert!(people::answer_body("req_1", "allow", false, None, Some("{bad")).is_err());
    assert!(parse(&["answer", "ses_1", "req_1", "perhaps"]).is_err());
}

fn local_wait(argv: &[&str]) -> wait_local::LocalWait {
    match parse(argv).expect("flags parse").command {
        Command::Wait(WaitCommand::Local(w)) => w,
        other => panic!("not a local wait: {other:?}"),
    }
}

#[test]
fn log_silence_and_any_flags_become_the_remote_body() {
    let w = local_wait(&[
        "wait",
        "log",
        "/runs/7/train.log",
        "--match",
        "nan|Traceback",
        "--silence",
        "20m",
        "--device",
        "gpu1",
        "--timeout",
        "6h",
    ]);
    let b = serde_json::to_value(wait_remote::body(&w, "gpu1").expect("body")).expect("json");
    assert_eq!(
        b,
        json!({"kind": "log", "path": "/runs/7/train.log", "match": "nan|Traceback",
               "silence": 1200.0, "timeout_s": 21600.0})
    );
    let w = local_wait(&[
        "wait",
        "file",
        "/runs/7/progress",
        "--silence",
        "90s",
        "--device",
        "gpu1",
    ]);
    let b = serde_json::to_value(wait_remote::body(&w, "gpu1").expect("body")).expect("json");
    assert_eq!(
        (b["kind"].clone(), b["silence"].clone()),
        (json!("file"), json!(90.0))
    );
    let w = local_wait(&[
        "wait",
        "any",
        "pid:4123",
        "log:/runs/7/train.log~Traceback|nan",
        "silence:/runs/7/train.log~10m",
        "--device",
        "gpu1",
    ]);
    let b = serde_json::to_value(wait_remote::body(&w, "gpu1").expect("body")).expect("json");
    assert_eq!(b["kind"], "any");
    assert_eq!(
        b["conditions"],
        json!([
            {"kind": "pid", "pid": 4123},
            {"kind": "log", "path": "/runs/7/train.log", "match": "Traceback|nan"},
            {"kind": "file", "path": "/runs/7/train.log", "silence": 600.0},
        ])
    );
    // What the hub does with it: the same spec the command line names.
    let body: cortex_protocol::api::CreateDeviceWait = serde_json::from_value(b).expect("body");
    let spec = body
        .condition
        .spec(cortex_protocol::waits::Place::Device)
        .expect("accepted");
    assert_eq!(spec.kind(), "any");
    // Refused before the hub is asked: a relative path, a cursor, a bad condition.
    for argv in [
        &["wait", "log", "rel.log", "--match", "x", "--device", "gpu1"][..],
        &[
            "wait", "log", "/x", "--match", "x", "--cursor", "/c", "--device", "gpu1",
        ],
        &["wait", "any", "pid:1", "tail:/x", "--device", "gpu1"],
        &["wait", "any", "pid:1", "file:rel", "--device", "gpu1"],
    ] {
        assert!(
            wait_remote::body(&local_wait(argv), "gpu1").is_err(),
            "{argv:?}"
        );
    }
    // A silence and a cursor do not go together on a file wait.
    assert!(parse(&["wait", "file", "/x", "--silence", "1m", "--cursor", "/c"]).is_err());
    assert!(
        parse(&["wait", "log", "/x"]).is_err(),
        "--match is required"
    );
    assert!(parse(&["wait", "any"]).is_err(), "a condition is required");
}

#[test]
fn local_log_and_any_waits_refuse_what_cannot_run() {
    let run_local = |argv: &[&str]| {
        let w = local_wait(argv);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = wait_local::run(&w, &mut out, &mut err);
        (code, String::from_utf8(err).expect("utf8"))
    };
    let (code, err) = run_local(&["wait", "log", "/tmp/x.log", "--match", "("]);
    assert_eq!(code, 2);
    assert!(err.contains("not a usable regular expression"), "{err}");
    let (code, err) = run_local(&["wait", "any", "pid:1", "log:/x"]);
    assert_eq!(code, 2);
    assert!(err.contains("needs its pattern"), "{err}");
    let (code, err) = run_local(&["wait", "file", "/tmp/x", "--silence", "1ms"]);
    assert_eq!(code, 2);
    assert!(err.contains("out of range"), "{err}");
}

// ------------------------------------------------------------- devices, exits, pipes

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
