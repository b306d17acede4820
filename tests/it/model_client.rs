//! The hub's model client against the scripted model server over real HTTP: a stream
//! split everywhere assembled right, the servers' shapes, retries (500 then 200, 429 with
//! `Retry-After`, an error inside the stream), timeouts on a hung server, errors that
//! name the trouble and never the key, keep-alive, and a dropped step closing its
//! connection.

use std::future::Future;
use std::time::Duration;

use cortex_hub::model::{
    ChatMessage, Delta, ModelClient, ModelConfig, ModelError, Role, StepOutput, StepRequest,
    ToolSpec,
};
use cortex_tests::scripted_model::{Outcome, Reply, ScriptedModel};
use serde_json::{Value, json};

const KEY: &str = "sk-scripted-secret";
const LIMIT: Duration = Duration::from_secs(20);

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

fn config(model: &ScriptedModel) -> ModelConfig {
    let mut cfg = ModelConfig::new(model.url(), "scripted");
    cfg.api_key = Some(KEY.to_string());
    cfg.backoff = Duration::from_millis(1);
    cfg.first_byte_timeout = Duration::from_secs(10);
    cfg.idle_timeout = Duration::from_secs(10);
    cfg
}

fn tools() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "wait_create".into(),
        description: "arm a waitpoint".into(),
        parameters: json!({"type": "object", "properties": {"label": {"type": "string"}}}),
        strict: false,
    }]
}

/// One step with a user message; returns the deltas and the result.
async fn step(
    client: &ModelClient,
    tools: &[ToolSpec],
) -> (Vec<Delta>, Result<StepOutput, ModelError>) {
    let messages = [
        ChatMessage::system("be brief"),
        ChatMessage::user("train it"),
    ];
    let req = StepRequest {
        messages: &messages,
        tools,
        max_tokens: Some(64),
        response_format: None,
        tool_choice_required: false,
    };
    let mut deltas = Vec::new();
    let out = client.step(req, &mut |d| deltas.push(d)).await;
    (deltas, out)
}

fn text_of(deltas: &[Delta]) -> String {
    deltas
        .iter()
        .filter_map(|d| match d {
            Delta::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

fn retries(deltas: &[Delta]) -> Vec<(u32, String, Duration)> {
    deltas
        .iter()
        .filter_map(|d| match d {
            Delta::Retry {
                attempt,
                issues,
                delay,
            } => Some((*attempt, issues.clone(), *delay)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_stream_split_everywhere_is_assembled_and_the_request_is_whole() {
    let text = "Héllo wörld ✓ — the job is armed 🦀";
    let model = ScriptedModel::start(vec![
        Reply::text(text)
            .with_reasoning("thinking ✓")
            .split_every(3)
            .crlf()
            .with_pings(),
        Reply::tool_call("wait_create", r#"{"label": "träin", "intent": "wake me"}"#)
            .split_every(1),
    ]);
    let client = ModelClient::new(config(&model)).expect("client");
    let tools = tools();
    let (deltas, out) = block_on(step(&client, &tools));
    let out = out.expect("text step");
    assert_eq!(out.text, text);
    assert_eq!(text_of(&deltas), text);
    assert_eq!(out.reasoning, "thinking ✓");
    assert_eq!(out.finish_reason.as_deref(), Some("stop"));
    let usage = out.usage.expect("usage, asked for with include_usage");
    assert!(usage.prompt_tokens > 0 && usage.total_tokens > usage.prompt_tokens);

    let (_, out) = block_on(step(&client, &tools));
    let out = out.expect("tool step");
    assert_eq!(out.tool_calls.len(), 1);
    let call = &out.tool_calls[0];
    assert_eq!(call.function.name, "wait_create");
    assert_eq!(
        call.function.arguments,
        r#"{"label": "träin", "intent": "wake me"}"#
    );
    assert!(call.id.starts_with("call_"), "{}", call.id);
    assert_eq!(out.finish_reason.as_deref(), Some("tool_calls"));

    let reqs = model.requests();
    assert_eq!(reqs.len(), 2);
    let r = &reqs[0];
    assert_eq!(r["model"], "scripted");
    assert_eq!(r["stream"], true);
    assert_eq!(r["stream_options"]["include_usage"], true);
    assert_eq!(r["max_tokens"], 64);
    assert_eq!(
        r["messages"][1],
        json!({"role": "user", "content": "train it"})
    );
    assert_eq!(r["tools"][0]["function"]["name"], "wait_create");
    assert_eq!(
        model.authorizations(),
        [Some(format!("Bearer {KEY}")), Some(format!("Bearer {KEY}"))]
    );
}

#[test]
fn steps_share_one_kept_alive_connection() {
    let model = ScriptedModel::start(vec![]);
    let client = ModelClient::new(config(&model)).expect("client");
    // One runtime: the pool's connections live on the runtime that opened them.
    block_on(async {
        for _ in 0..3 {
            let (_, out) = step(&client, &[]).await;
            assert_eq!(out.expect("step").text, "ok");
        }
    });
    assert_eq!(model.requests().len(), 3);
    assert_eq!(
        model.connections(),
        1,
        "HTTP/1.1 keep-alive reuses the connection"
    );
}

#[test]
fn ollama_shape_without_usage_or_done() {
    let model = ScriptedModel::start(vec![
        Reply::ollama_tool_call("wait_create", r#"{"label":"x"}"#)
            .without_usage()
            .without_done(),
    ]);
    let client = ModelClient::new(config(&model)).expect("client");
    let (_, out) = block_on(step(&client, &tools()));
    let out = out.expect("step");
    assert_eq!(out.tool_calls[0].function.arguments, r#"{"label":"x"}"#);
    assert_eq!(out.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(out.usage, None);
}

#[test]
fn a_500_is_retried_and_the_retry_reported_first() {
    let model = ScriptedModel::start(vec![
        Reply::status(
            500,
            r#"{"error": {"message": "boom in the engine", "type": "server_error"}}"#,
        ),
        Reply::text("recovered"),
    ]);
    let client = ModelClient::new(config(&model)).expect("client");
    let (deltas, out) = block_on(step(&client, &[]));
    assert_eq!(out.expect("step").text, "recovered");
    let r = retries(&deltas);
    assert_eq!(r.len(), 1, "{deltas:?}");
    assert_eq!(r[0].0, 1);
    assert!(
        r[0].1.contains("HTTP 500") && r[0].1.contains("boom in the engine"),
        "{}",
        r[0].1
    );
    assert!(
        matches!(deltas[0], Delta::Retry { .. }),
        "the retry comes before the answer"
    );
    assert_eq!(model.requests().len(), 2);
}

#[test]
fn retry_after_is_honoured() {
    let model = ScriptedModel::start(vec![
        Reply::status(429, r#"{"error": {"message": "slow down"}}"#).retry_after(1),
        Reply::text("ok"),
    ]);
    let client = ModelClient::new(config(&model)).expect("client");
    let (deltas, out) = block_on(step(&client, &[]));
    assert_eq!(out.expect("step").text, "ok");
    let r = retries(&deltas);
    assert_eq!(r.len(), 1, "{deltas:?}");
    // The server's one second, not the client's one-millisecond backoff.
    assert_eq!(r[0].2, Duration::from_secs(1));
    assert!(
        r[0].1.contains("HTTP 429") && r[0].1.contains("slow down"),
        "{}",
        r[0].1
    );
}

#[test]
fn an_error_inside_a_200_stream_is_retried_when_passing() {
    let model = ScriptedModel::start(vec![
        Reply::stream_error(json!({"message": "engine overloaded", "type": "overloaded_error"})),
        Reply::text("second try"),
    ]);
    let client = ModelClient::new(config(&model)).expect("client");
    let (deltas, out) = block_on(step(&client, &[]));
    assert_eq!(out.expect("step").text, "second try");
    // What the failed attempt streamed came before its Retry: the runner drops it.
    let kinds: Vec<&str> = deltas
        .iter()
        .map(|d| match d {
            Delta::Text(_) => "text",
            Delta::Reasoning(_) => "reasoning",
            Delta::Retry { .. } => "retry",
            Delta::ToolArgs { .. } => "tool_args",
        })
        .collect();
    assert_eq!(kinds.first(), Some(&"text"));
    assert_eq!(
        kinds.iter().filter(|k| **k == "retry").count(),
        1,
        "{kinds:?}"
    );
    let after_retry = kinds.iter().position(|k| *k == "retry").expect("retry") + 1;
    assert_eq!(text_of(&deltas[after_retry..]), "second try");
}

#[test]
fn a_client_error_is_named_not_retried_and_never_shows_the_key() {
    let model = ScriptedModel::start(vec![Reply::status(
        401,
        &format!(
            r#"{{"error": {{"message": "Incorrect API key provided: {KEY}", "type": "invalid_request_error"}}}}"#
        ),
    )]);
    let client = ModelClient::new(config(&model)).expect("client");
    let (deltas, out) = block_on(step(&client, &[]));
    let err = out.expect_err("401");
    let text = err.to_string();
    assert!(
        matches!(err, ModelError::Status { status: 401, .. }),
        "{err:?}"
    );
    assert!(
        text.contains("HTTP 401") && text.contains("Incorrect API key provided"),
        "{text}"
    );
    assert!(text.contains(&model.url()), "{text}");
    assert!(!text.contains(KEY), "{text}");
    assert!(!format!("{err:?}").contains(KEY));
    assert!(retries(&deltas).is_empty());
    assert_eq!(model.requests().len(), 1);
}

#[test]
fn retries_run_out_with_the_last_error_said() {
    let model = ScriptedModel::start(vec![
        Reply::status(503, "upstream down"),
        Reply::status(503, "upstream down"),
        Reply::status(503, "still down"),
    ]);
    let mut cfg = config(&model);
    cfg.max_retries = 2;
    let client = ModelClient::new(cfg).expect("client");
    let (deltas, out) = block_on(step(&client, &[]));
    let err = out.expect_err("503s");
    assert!(
        matches!(&err, ModelError::RetriesExhausted { attempts: 3, last } if matches!(**last, ModelError::Status { status: 503, .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains("still down"), "{err}");
    assert_eq!(
        retries(&deltas).iter().map(|r| r.0).collect::<Vec<_>>(),
        [1, 2]
    );
    assert_eq!(model.requests().len(), 3);
}

#[test]
fn a_hung_server_times_out_with_a_clear_error() {
    // Headers then silence, twice: the first-byte bound, retried once.
    let model = ScriptedModel::start(vec![Reply::hang(), Reply::hang_before_headers()]);
    let mut cfg = config(&model);
    cfg.first_byte_timeout = Duration::from_millis(300);
    cfg.max_retries = 1;
    let client = ModelClient::new(cfg).expect("client");
    let (deltas, out) = block_on(step(&client, &[]));
    let err = out.expect_err("hung");
    match &err {
        ModelError::RetriesExhausted { attempts: 2, last } => {
            assert!(
                matches!(**last, ModelError::FirstByteTimeout { .. }),
                "{last:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("timed out after 300ms") && text.contains("start answering"),
        "{text}"
    );
    assert!(text.contains(&model.url()), "{text}");
    assert_eq!(retries(&deltas).len(), 1);

    // A stream that stops mid-answer: the idle bound.
    let model = ScriptedModel::start(vec![
        Reply::text("a long answer that stalls").stall_after(2),
    ]);
    let mut cfg = config(&model);
    cfg.idle_timeout = Duration::from_millis(300);
    cfg.max_retries = 0;
    let client = ModelClient::new(cfg).expect("client");
    let (deltas, out) = block_on(step(&client, &[]));
    let err = out.expect_err("stalled");
    assert!(matches!(err, ModelError::IdleTimeout { .. }), "{err:?}");
    assert!(err.to_string().contains("sent nothing for 300ms"), "{err}");
    assert_eq!(
        text_of(&deltas),
        "a lo",
        "what came before the stall was streamed"
    );
    // The client gave up on the stalled stream: it closed its connection.
    assert_eq!(model.wait_outcome(0, LIMIT), Outcome::ClientGone);
}

#[test]
fn dropping_a_step_closes_its_connection_at_once() {
    let long = "word ".repeat(400);
    let model = ScriptedModel::start(vec![
        Reply::text(&long).chunk_delay(Duration::from_millis(20)),
    ]);
    let client = ModelClient::new(config(&model)).expect("client");
    block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let messages = [ChatMessage::user("go")];
        let req = StepRequest {
            messages: &messages,
            tools: &[],
            max_tokens: None,
            response_format: None,
            tool_choice_required: false,
        };
        let mut on_delta = move |d: Delta| {
            let _ = tx.send(d);
        };
        let mut fut = Box::pin(client.step(req, &mut on_delta));
        tokio::select! {
            out = &mut fut => panic!("the step ended before it was dropped: {out:?}"),
            first = rx.recv() => assert!(matches!(first, Some(Delta::Text(_))), "{first:?}"),
        }
        drop(fut);
    });
    // 500 chunks 20 ms apart would take 10 s to send: the server sees the client leave.
    assert_eq!(model.wait_outcome(0, LIMIT), Outcome::ClientGone);
    assert_eq!(model.requests().len(), 1, "no retry after the drop");
}

#[test]
fn a_rule_based_model_answers_by_the_transcript() {
    // Calls wait_create first; answers in words once the last message is the tool's.
    let rule = Reply::from_fn(|req: &Value| {
        let last = req["messages"].as_array().and_then(|m| m.last()).cloned();
        match last {
            Some(m) if m["role"] == "tool" => Reply::text("armed; I will wait"),
            _ => Reply::tool_call("wait_create", r#"{"label":"train"}"#),
        }
    });
    let model = ScriptedModel::start_with_default(vec![], rule);
    let client = ModelClient::new(config(&model)).expect("client");
    let tools = tools();
    let mut transcript = vec![ChatMessage::user("train it and wake me")];
    let out = block_on(async {
        let req = StepRequest {
            messages: &transcript,
            tools: &tools,
            max_tokens: None,
            response_format: None,
            tool_choice_required: false,
        };
        client.step(req, &mut |_| {}).await
    })
    .expect("first step");
    assert_eq!(out.tool_calls[0].function.name, "wait_create");
    let id = out.tool_calls[0].id.clone();
    transcript.push(ChatMessage::assistant(out.text, out.tool_calls));
    transcript.push(ChatMessage::tool(id.clone(), r#"{"id":"wp_1"}"#));
    let out = block_on(async {
        let req = StepRequest {
            messages: &transcript,
            tools: &tools,
            max_tokens: None,
            response_format: None,
            tool_choice_required: false,
        };
        client.step(req, &mut |_| {}).await
    })
    .expect("second step");
    assert_eq!(out.text, "armed; I will wait");
    let reqs = model.wait_requests(2, LIMIT);
    let sent = &reqs[1]["messages"];
    assert_eq!(sent[1]["role"], "assistant");
    assert_eq!(sent[1]["tool_calls"][0]["id"], id.as_str());
    assert_eq!(
        sent[2],
        json!({"role": "tool", "content": "{\"id\":\"wp_1\"}", "tool_call_id": id})
    );
    assert_eq!(transcript[2].role, Role::Tool);
}

#[test]
fn a_stream_cut_short_is_retried() {
    let model = ScriptedModel::start(vec![
        // Paced, so what comes before the cut reaches the client first.
        Reply::text("this answer is cut")
            .chunk_delay(Duration::from_millis(20))
            .cut_after(2),
        Reply::text("whole"),
    ]);
    let client = ModelClient::new(config(&model)).expect("client");
    let (deltas, out) = block_on(step(&client, &[]));
    assert_eq!(out.expect("step").text, "whole");
    let r = retries(&deltas);
    assert_eq!(r.len(), 1, "{deltas:?}");
    assert!(r[0].1.contains("broke mid-answer"), "{}", r[0].1);
    assert_eq!(deltas[0], Delta::Text("this".into()), "{deltas:?}");
    assert_eq!(model.requests().len(), 2);
}

#[test]
fn a_web_page_at_the_url_is_named_not_retried() {
    let model = ScriptedModel::start(vec![
        Reply::raw(vec![
            b"<html><body>Sign in to continue</body></html>\n".to_vec(),
        ])
        .header("content-type", "text/html; charset=utf-8"),
    ]);
    let client = ModelClient::new(config(&model)).expect("client");
    let (_, out) = block_on(step(&client, &[]));
    let err = out.expect_err("not a stream");
    let text = err.to_string();
    assert!(matches!(err, ModelError::Malformed(_)), "{err:?}");
    assert!(
        text.contains("text/html") && text.contains("Sign in to continue"),
        "{text}"
    );
    assert_eq!(model.requests().len(), 1);
}

#[test]
fn a_redirect_is_named_with_its_target_and_not_followed() {
    let model = ScriptedModel::start(vec![Reply::status(301, "").header(
        "location",
        "https://user:pw@models.example/v1/chat/completions?key=zzz",
    )]);
    let client = ModelClient::new(config(&model)).expect("client");
    let (_, out) = block_on(step(&client, &[]));
    let err = out.expect_err("redirect");
    let text = err.to_string();
    assert!(
        matches!(err, ModelError::Status { status: 301, .. }),
        "{err:?}"
    );
    assert!(
        text.contains("redirects to https://models.example/v1/chat/completions"),
        "{text}"
    );
    assert!(!text.contains("zzz") && !text.contains("pw@"), "{text}");
    assert_eq!(model.targets().len(), 1, "not followed");
}

#[test]
fn a_query_on_the_base_url_goes_with_every_request() {
    let model = ScriptedModel::start(vec![]);
    let mut cfg = config(&model);
    cfg.base_url = format!("{}/?api-version=2024-10-21", model.url());
    let client = ModelClient::new(cfg).expect("client");
    let (_, out) = block_on(step(&client, &[]));
    assert_eq!(out.expect("step").text, "ok");
    assert_eq!(
        model.targets(),
        ["/v1/chat/completions?api-version=2024-10-21"]
    );
}

/// The scripted server speaks HTTP/1.1 as model servers do: a chunked
/// `text/event-stream`, and the same connection kept for the next request.
#[test]
fn the_scripted_server_streams_chunked_sse_and_keeps_the_connection() {
    use std::io::{Read, Write};
    let model = ScriptedModel::start(vec![Reply::text("one"), Reply::text("two")]);
    let addr = model
        .url()
        .trim_start_matches("http://")
        .trim_end_matches("/v1")
        .to_string();
    let mut sock = std::net::TcpStream::connect(&addr).expect("connect");
    sock.set_read_timeout(Some(LIMIT)).expect("timeout");
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#;
    let mut answers = Vec::new();
    for _ in 0..2 {
        write!(
            sock,
            "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("write");
        // Up to the chunked body's last chunk.
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.ends_with(b"0\r\n\r\n") {
            let n = sock.read(&mut buf).expect("read");
            assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        answers.push(String::from_utf8_lossy(&got).to_lowercase());
    }
    for (a, word) in answers.iter().zip(["one", "two"]) {
        assert!(a.starts_with("http/1.1 200"), "{a}");
        assert!(a.contains("content-type: text/event-stream"), "{a}");
        assert!(a.contains("transfer-encoding: chunked"), "{a}");
        assert!(a.contains(&format!("\"content\":\"{word}\"")), "{a}");
        assert!(a.contains("data: [done]"), "{a}");
        // No usage chunk: this request did not ask for one.
        assert!(!a.contains("\"usage\""), "{a}");
    }
    assert_eq!(model.connections(), 1);
}

#[test]
fn a_key_echoed_inside_the_stream_is_blanked() {
    let model = ScriptedModel::start(vec![Reply::stream_error(
        json!({"message": format!("bad key {KEY} for this model"), "type": "invalid_request_error"}),
    )]);
    let client = ModelClient::new(config(&model)).expect("client");
    let (_, out) = block_on(step(&client, &[]));
    let text = out.expect_err("error").to_string();
    assert!(text.contains("bad key [api key] for this model"), "{text}");
}
