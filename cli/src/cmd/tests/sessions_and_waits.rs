//! Sessions and waits against a canned hub: tables, `--json`, and what the hub refuses.

use super::*;

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
