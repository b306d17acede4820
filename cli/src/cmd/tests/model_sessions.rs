//! A session that runs a model.

use super::*;

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
