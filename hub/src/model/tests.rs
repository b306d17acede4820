//! The client's parts against the shapes real servers stream (OpenAI, vLLM, Ollama,
//! llama.cpp), each fed through the SSE decoder byte by byte and in uneven pieces, and
//! the client against loopback sockets for what needs no model server (refused
//! connections, a TLS handshake over rustls).

use std::time::Duration;

use serde_json::{Value, json};

use super::assemble::{Assembler, Progress};
use super::{
    ChatMessage, Delta, ModelClient, ModelConfig, ModelError, StepOutput, StepRequest, ToolSpec,
    request_body,
};
use cortex_host::sse::Parser;

/// Decodes a whole stream fed in pieces of `piece` bytes (`[DONE]` ends it early, as the
/// client does); returns the deltas and the step.
fn run_pieces(stream: &[u8], piece: usize) -> (Vec<Delta>, Result<StepOutput, ModelError>) {
    let mut deltas = Vec::new();
    let mut on_delta = |d: Delta| deltas.push(d);
    let mut dec = Parser::new(super::client::MAX_EVENT_BYTES);
    let mut asm = Assembler::new();
    let mut events = Vec::new();
    let result = (|| {
        for bytes in stream.chunks(piece.max(1)) {
            events.extend(
                dec.feed(bytes)
                    .map_err(|e| ModelError::Malformed(e.to_string()))?
                    .into_iter()
                    .map(|m| m.data),
            );
            for data in events.drain(..) {
                if asm.payload(&data, &mut on_delta)? == Progress::Done {
                    return Ok(true);
                }
            }
        }
        events.extend(
            dec.finish()
                .map_err(|e| ModelError::Malformed(e.to_string()))?
                .into_iter()
                .map(|m| m.data),
        );
        for data in events.drain(..) {
            if asm.payload(&data, &mut on_delta)? == Progress::Done {
                break;
            }
        }
        Ok(false)
    })();
    let result = result.and_then(|_| asm.finish());
    (deltas, result)
}

/// The same stream fed byte by byte, in threes, in sevens and whole must give the same
/// step and the same text; returns it with the byte-by-byte deltas.
fn run(stream: &str) -> (Vec<Delta>, Result<StepOutput, ModelError>) {
    let bytes = stream.as_bytes();
    let (deltas, result) = run_pieces(bytes, 1);
    for piece in [3, 7, bytes.len()] {
        let (d, r) = run_pieces(bytes, piece);
        assert_eq!(r, result, "pieces of {piece}");
        assert_eq!(joined(&d), joined(&deltas), "pieces of {piece}");
    }
    (deltas, result)
}

fn joined(deltas: &[Delta]) -> (String, String) {
    let mut text = String::new();
    let mut reasoning = String::new();
    for d in deltas {
        match d {
            Delta::Text(t) => text.push_str(t),
            Delta::Reasoning(r) => reasoning.push_str(r),
            Delta::Retry { .. } => panic!("no retry expected: {d:?}"),
            Delta::ToolArgs { .. } => {}
        }
    }
    (text, reasoning)
}

/// An SSE stream of these chunks (JSON values, or `[DONE]` as a string).
fn sse(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| match e.as_str() {
            Some(raw) => format!("data: {raw}\n\n"),
            None => format!("data: {e}\n\n"),
        })
        .collect()
}

fn content(text: &str) -> Value {
    json!({"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
}

fn finish(reason: &str) -> Value {
    json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
}

fn usage_only(p: u64, c: u64) -> Value {
    json!({"choices": [], "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}})
}

/// The tool-call pieces among `deltas`: (index, name, text).
fn tool_args(deltas: &[Delta]) -> Vec<(usize, Option<&str>, &str)> {
    deltas
        .iter()
        .filter_map(|d| match d {
            Delta::ToolArgs { index, name, text } => Some((*index, name.as_deref(), text.as_str())),
            _ => None,
        })
        .collect()
}

/// Each call's pieces joined, by index: (name, arguments).
fn joined_calls(deltas: &[Delta]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (index, name, text) in tool_args(deltas) {
        if out.len() <= index {
            out.resize(index + 1, Default::default());
        }
        out[index].0.push_str(name.unwrap_or_default());
        out[index].1.push_str(text);
    }
    out
}

fn calls(out: &StepOutput) -> Vec<(&str, &str, &str)> {
    out.tool_calls
        .iter()
        .map(|c| {
            (
                c.id.as_str(),
                c.function.name.as_str(),
                c.function.arguments.as_str(),
            )
        })
        .collect()
}

#[test]
fn openai_text_with_usage_in_a_last_chunk_with_no_choices() {
    let stream = sse(&[
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}], "usage": null}),
        content("Hel"),
        content("lo, wor"),
        content("ld"),
        finish("stop"),
        usage_only(12, 3),
        json!("[DONE]"),
    ]);
    let (deltas, out) = run(&stream);
    let out = out.expect("step");
    assert_eq!(out.text, "Hello, world");
    assert_eq!(joined(&deltas).0, "Hello, world");
    assert_eq!(deltas.len(), 3, "one delta per piece of text: {deltas:?}");
    assert_eq!(out.finish_reason.as_deref(), Some("stop"));
    let usage = out.usage.expect("usage");
    assert_eq!(
        (
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.total_tokens
        ),
        (12, 3, 15)
    );
    assert!(out.tool_calls.is_empty());
}

#[test]
fn vllm_tool_call_as_id_and_name_then_fragments_split_mid_string() {
    let frag = |s: &str| json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": s}}]}, "finish_reason": null}], "usage": null});
    let stream = sse(&[
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [{"index": 0, "id": "chatcmpl-tool-9", "type": "function", "function": {"name": "wait_create"}}]}, "finish_reason": null}], "usage": null}),
        frag("{\"lab"),
        frag("el\": \"trai"),
        frag("n\", \"intent\": \"é"),
        frag("\"}"),
        json!({"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "tool_calls"}], "usage": null}),
        usage_only(40, 9),
        json!("[DONE]"),
    ]);
    let (deltas, out) = run(&stream);
    // The call streams as it comes: the name first, then each fragment as sent.
    assert_eq!(
        tool_args(&deltas),
        [
            (0, Some("wait_create"), ""),
            (0, None, "{\"lab"),
            (0, None, "el\": \"trai"),
            (0, None, "n\", \"intent\": \"é"),
            (0, None, "\"}"),
        ]
    );
    let out = out.expect("step");
    assert_eq!(
        calls(&out),
        [(
            "chatcmpl-tool-9",
            "wait_create",
            "{\"label\": \"train\", \"intent\": \"é\"}"
        )]
    );
    assert_eq!(out.tool_calls[0].kind, "function");
    assert_eq!(out.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(out.usage.expect("usage").total_tokens, 49);
}

#[test]
fn ollama_whole_call_in_one_chunk_then_stop() {
    let stream = sse(&[
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "qwen3:8b", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "", "tool_calls": [{"id": "call_abc", "index": 0, "type": "function", "function": {"name": "devices", "arguments": "{}"}}]}, "finish_reason": null}]}),
        json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": "stop"}]}),
        usage_only(30, 5),
        json!("[DONE]"),
    ]);
    let out = run(&stream).1.expect("step");
    assert_eq!(calls(&out), [("call_abc", "devices", "{}")]);
    // Tool calls present means tool calls, whatever finish_reason said.
    assert_eq!(out.finish_reason.as_deref(), Some("tool_calls"));
}

#[test]
fn older_ollama_calls_without_index_are_told_apart_by_id() {
    let stream = sse(&[
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "wait_check", "arguments": "{\"id\":\"wp_1\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "devices", "arguments": "{}"}}
        ]}, "finish_reason": null}]}),
        finish("stop"),
        json!("[DONE]"),
    ]);
    let out = run(&stream).1.expect("step");
    assert_eq!(
        calls(&out),
        [
            ("call_1", "wait_check", "{\"id\":\"wp_1\"}"),
            ("call_2", "devices", "{}")
        ]
    );
}

#[test]
fn calls_without_index_or_id_get_made_up_ids_in_order() {
    let stream = sse(&[
        json!({"choices": [{"delta": {"tool_calls": [{"function": {"name": "a", "arguments": "{\"x\":"}}]}}]}),
        json!({"choices": [{"delta": {"tool_calls": [{"function": {"arguments": "1}"}}]}}]}),
        json!({"choices": [{"delta": {"tool_calls": [{"function": {"name": "b", "arguments": {"y": 2}}}]}}]}),
        json!({"choices": [{"delta": {"tool_calls": [{"function": {"name": "c", "arguments": ""}}]}}]}),
        finish("tool_calls"),
    ]);
    let out = run(&stream).1.expect("step");
    // Arguments sent as an object become its JSON text; none at all becomes `{}`.
    assert_eq!(
        calls(&out),
        [
            ("call_0", "a", "{\"x\":1}"),
            ("call_1", "b", "{\"y\":2}"),
            ("call_2", "c", "{}")
        ]
    );
}

#[test]
fn parallel_calls_interleaved_by_index_come_out_in_index_order() {
    let piece = |i: u64, v: Value| json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "function": v}]}}]});
    let stream = sse(&[
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "id": "B", "function": {"name": "second", "arguments": ""}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "A", "function": {"name": "first", "arguments": ""}}]}}]}),
        piece(1, json!({"arguments": "{\"b\""})),
        piece(0, json!({"arguments": "{\"a\""})),
        piece(0, json!({"arguments": ":1}"})),
        piece(1, json!({"arguments": ":2}"})),
        finish("tool_calls"),
        json!("[DONE]"),
    ]);
    let (deltas, out) = run(&stream);
    let out = out.expect("step");
    assert_eq!(
        calls(&out),
        [("A", "first", "{\"a\":1}"), ("B", "second", "{\"b\":2}")]
    );
    // The pieces are numbered in the order the calls began: `second` began first.
    assert_eq!(
        tool_args(&deltas),
        [
            (0, Some("second"), ""),
            (1, Some("first"), ""),
            (0, None, "{\"b\""),
            (1, None, "{\"a\""),
            (1, None, ":1}"),
            (0, None, ":2}"),
        ]
    );
    assert_eq!(
        joined_calls(&deltas),
        [
            ("second".to_string(), "{\"b\":2}".to_string()),
            ("first".to_string(), "{\"a\":1}".to_string())
        ]
    );
}

#[test]
fn tool_call_pieces_stream_as_they_come_and_join_into_the_calls() {
    // A name in two pieces, a name sent again whole with a fragment, a call whose
    // arguments come as an object, two calls numbered 0 told apart by id, and pieces
    // that add nothing (an id alone, an empty fragment).
    let piece = |v: Value| json!({"choices": [{"index": 0, "delta": {"tool_calls": [v]}}]});
    let stream = sse(&[
        piece(json!({"index": 0, "id": "a", "function": {"name": "wait_"}})),
        piece(json!({"index": 0, "function": {"name": "check", "arguments": ""}})),
        piece(json!({"index": 0, "function": {"name": "wait_check", "arguments": "{\"id\":"}})),
        piece(json!({"index": 0, "id": "a"})),
        piece(json!({"index": 0, "function": {"arguments": "\"wp_1\"}"}})),
        piece(
            json!({"index": 0, "id": "b", "function": {"name": "respond", "arguments": {"data": {"loss": 0.5}}}}),
        ),
        finish("tool_calls"),
        json!("[DONE]"),
    ]);
    let (deltas, out) = run(&stream);
    let out = out.expect("step");
    assert_eq!(
        tool_args(&deltas),
        [
            (0, Some("wait_"), ""),
            (0, Some("check"), ""),
            (0, None, "{\"id\":"),
            (0, None, "\"wp_1\"}"),
            (1, Some("respond"), "{\"data\":{\"loss\":0.5}}"),
        ]
    );
    // Nothing but tool-call pieces streamed.
    assert_eq!(tool_args(&deltas).len(), deltas.len(), "{deltas:?}");
    // The pieces joined are the step's calls.
    let want: Vec<(String, String)> = out
        .tool_calls
        .iter()
        .map(|c| (c.function.name.clone(), c.function.arguments.clone()))
        .collect();
    assert_eq!(joined_calls(&deltas), want);
    // Every way of cutting the stream gives the same pieces (they follow the chunks).
    for piece in [1, 5, stream.len()] {
        let (d, _) = run_pieces(stream.as_bytes(), piece);
        assert_eq!(d, deltas, "pieces of {piece}");
    }
}

#[test]
fn a_server_that_numbers_every_call_zero_is_told_apart_by_id() {
    let stream = sse(&[
        json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "x1", "function": {"name": "a", "arguments": "{}"}}]}}]}),
        json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "x2", "function": {"name": "b", "arguments": "{}"}}]}}]}),
        // The id sent again with a fragment is still the same call.
        json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "x2", "function": {"name": "b", "arguments": ""}}]}}]}),
        finish("tool_calls"),
    ]);
    let out = run(&stream).1.expect("step");
    assert_eq!(calls(&out), [("x1", "a", "{}"), ("x2", "b", "{}")]);
}

#[test]
fn llamacpp_usage_beside_the_finish_and_text_before_a_call() {
    let stream = sse(&[
        json!({"choices": [{"finish_reason": null, "index": 0, "delta": {"role": "assistant", "content": null}}], "object": "chat.completion.chunk"}),
        content("Let me check."),
        json!({"choices": [{"finish_reason": null, "index": 0, "delta": {"tool_calls": [{"index": 0, "id": "Xyz123", "type": "function", "function": {"name": "wait_check", "arguments": ""}}]}}]}),
        json!({"choices": [{"finish_reason": null, "index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]}),
        json!({"choices": [{"finish_reason": "tool_calls", "index": 0, "delta": {}}], "usage": {"completion_tokens": 20, "prompt_tokens": 100, "total_tokens": 120}, "timings": {"predicted_ms": 12.5}}),
        json!("[DONE]"),
    ]);
    let out = run(&stream).1.expect("step");
    assert_eq!(out.text, "Let me check.");
    assert_eq!(calls(&out), [("Xyz123", "wait_check", "{}")]);
    assert_eq!(out.usage.expect("usage").prompt_tokens, 100);
}

#[test]
fn no_usage_and_no_done_is_a_whole_answer_once_it_finished() {
    let stream = sse(&[content("ok"), finish("stop")]);
    let out = run(&stream).1.expect("step");
    assert_eq!(out.text, "ok");
    assert_eq!(out.usage, None);
    assert_eq!(out.finish_reason.as_deref(), Some("stop"));
}

#[test]
fn a_stream_closed_before_it_finished_is_truncated() {
    let stream = sse(&[content("half an ans")]);
    assert_eq!(run(&stream).1, Err(ModelError::Truncated));
    assert!(ModelError::Truncated.is_retryable());
    // An answer with no text at all, but [DONE], is an empty answer.
    let out = run(&sse(&[json!("[DONE]")])).1.expect("step");
    assert_eq!(out, StepOutput::default());
}

#[test]
fn reasoning_comes_as_reasoning_content_or_reasoning_and_is_counted_once() {
    let stream = sse(&[
        json!({"choices": [{"index": 0, "delta": {"reasoning_content": "think"}}]}),
        json!({"choices": [{"index": 0, "delta": {"reasoning": "ing"}}]}),
        json!({"choices": [{"index": 0, "delta": {"reasoning_content": "...", "reasoning": "..."}}]}),
        content("Done."),
        finish("stop"),
    ]);
    let (deltas, out) = run(&stream);
    let out = out.expect("step");
    assert_eq!(out.reasoning, "thinking...");
    assert_eq!(out.text, "Done.");
    assert_eq!(
        joined(&deltas),
        ("Done.".to_string(), "thinking...".to_string())
    );
    assert_eq!(deltas[0], Delta::Reasoning("think".into()));
}

#[test]
fn comments_event_lines_and_crlf_around_the_chunks() {
    let stream = format!(
        ": ping\r\n\r\nevent: message\r\ndata: {}\r\n\r\n: keep-alive\r\n\r\ndata: {}\r\n\r\ndata: [DONE]\r\n\r\n",
        content("ünïcödé ✓"),
        finish("stop")
    );
    let out = run(&stream).1.expect("step");
    assert_eq!(out.text, "ünïcödé ✓");
}

#[test]
fn chunks_on_consecutive_data_lines_without_a_blank_line() {
    let stream = format!(
        "data: {}\ndata: {}\ndata: [DONE]\n\n",
        content("a"),
        finish("stop")
    );
    let out = run(&stream).1.expect("step");
    assert_eq!(out.text, "a");
}

#[test]
fn an_error_inside_a_200_stream() {
    let stream = sse(&[
        content("par"),
        json!({"error": {"message": "model overloaded, try again", "type": "overloaded_error", "code": 503}}),
    ]);
    match run(&stream).1 {
        Err(ModelError::Server { message, retryable }) => {
            assert_eq!(message, "model overloaded, try again");
            assert!(retryable);
        }
        other => panic!("{other:?}"),
    }
    let stream = sse(&[
        json!({"error": {"message": "context length exceeded", "type": "invalid_request_error", "code": "context_length_exceeded"}}),
    ]);
    match run(&stream).1 {
        Err(e @ ModelError::Server { .. }) => {
            assert!(!e.is_retryable());
            assert!(e.to_string().contains("context length exceeded"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let stream = sse(&[json!({"error": "plain words"})]);
    assert!(
        matches!(run(&stream).1, Err(ModelError::Server { message, .. }) if message == "plain words")
    );
}

#[test]
fn a_line_that_is_not_a_chunk_is_malformed() {
    match run("data: {\"choices\": [\n\n").1 {
        Err(ModelError::Malformed(m)) => assert!(m.contains("{\"choices\": ["), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(!ModelError::Malformed(String::new()).is_retryable());
}

#[test]
fn a_non_streamed_answer_is_one_chunk() {
    let body = json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "devices", "arguments": "{}"}}]}, "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}});
    let mut asm = Assembler::new();
    let mut deltas = Vec::new();
    assert_eq!(
        asm.payload(&body.to_string(), &mut |d| deltas.push(d))
            .expect("ok"),
        Progress::More
    );
    let out = asm.finish().expect("step");
    assert_eq!(calls(&out), [("call_9", "devices", "{}")]);
    // The whole call is one piece.
    assert_eq!(tool_args(&deltas), [(0, Some("devices"), "{}")]);
}

#[test]
fn the_request_body_has_what_servers_need_and_nothing_empty() {
    let messages = [ChatMessage::system("be brief"), ChatMessage::user("hi")];
    let tools = [ToolSpec {
        name: "devices".into(),
        description: "the fleet".into(),
        parameters: json!({"type": "object", "properties": {}}),
        strict: false,
    }];
    let req = StepRequest {
        messages: &messages,
        tools: &tools,
        max_tokens: Some(256),
        response_format: None,
        tool_choice_required: false,
    };
    let v: Value = serde_json::from_slice(&request_body("m", &req).expect("body")).expect("json");
    assert_eq!(v["model"], "m");
    assert_eq!(v["stream"], true);
    assert_eq!(v["stream_options"], json!({"include_usage": true}));
    assert_eq!(v["messages"][1], json!({"role": "user", "content": "hi"}));
    assert_eq!(v["tools"][0]["type"], "function");
    assert_eq!(v["tools"][0]["function"]["name"], "devices");
    assert_eq!(v["max_tokens"], 256);
    let bare = StepRequest {
        messages: &messages,
        tools: &[],
        max_tokens: None,
        response_format: None,
        tool_choice_required: false,
    };
    let v: Value = serde_json::from_slice(&request_body("m", &bare).expect("body")).expect("json");
    let keys: Vec<&str> = v
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["messages", "model", "stream", "stream_options"]);
    // A typed answer's asks: `response_format` as given, `tool_choice` only when
    // required, `strict` inside the function only when set.
    let format = json!({"type": "json_schema", "json_schema": {"name": "envelope", "strict": true, "schema": {"type": "object"}}});
    let strict = [ToolSpec {
        strict: true,
        ..tools[0].clone()
    }];
    let typed = StepRequest {
        messages: &messages,
        tools: &strict,
        max_tokens: None,
        response_format: Some(&format),
        tool_choice_required: true,
    };
    let v: Value = serde_json::from_slice(&request_body("m", &typed).expect("body")).expect("json");
    assert_eq!(v["response_format"], format);
    assert_eq!(v["tool_choice"], "required");
    assert_eq!(v["tools"][0]["function"]["strict"], true);
    let v: Value = serde_json::from_slice(&request_body("m", &req).expect("body")).expect("json");
    assert!(v.get("tool_choice").is_none(), "{v}");
    assert!(v.get("response_format").is_none(), "{v}");
    assert!(v["tools"][0]["function"].get("strict").is_none(), "{v}");
}

/// A one-shot HTTP server on loopback: answers the first request with `stream` (an SSE
/// body) and hands back the request's body.
async fn one_answer(stream: String) -> (String, tokio::task::JoinHandle<Value>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/v1", listener.local_addr().expect("addr"));
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let (head_end, length) = loop {
            let n = s.read(&mut chunk).await.expect("read");
            assert!(n > 0, "the request ended early");
            buf.extend_from_slice(&chunk[..n]);
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..at]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .expect("a content length");
                break (at + 4, length);
            }
        };
        while buf.len() < head_end + length {
            let n = s.read(&mut chunk).await.expect("read");
            assert!(n > 0, "the body ended early");
            buf.extend_from_slice(&chunk[..n]);
        }
        let body: Value = serde_json::from_slice(&buf[head_end..head_end + length]).expect("json");
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{stream}"
        );
        s.write_all(answer.as_bytes()).await.expect("write");
        let _ = s.shutdown().await;
        body
    });
    (url, server)
}

/// Over HTTP: the typed answer's asks reach the server as sent, the tool call streams
/// as `ToolArgs` pieces, and the client answers its endpoint's caps.
#[tokio::test]
async fn a_typed_step_over_http_streams_its_tool_call() {
    use super::{Caps, Endpoint, Model};
    let args = |s: &str| json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": s}}]}}]});
    let stream = sse(&[
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "respond", "arguments": ""}}]}}]}),
        args("{\"data\": {\"lo"),
        args("ss\": 0.5}}"),
        finish("tool_calls"),
        json!("[DONE]"),
    ]);
    let (url, server) = one_answer(stream).await;
    let mut cfg = quick(url, 0);
    cfg.endpoint = Endpoint::LlamaCpp;
    let client = ModelClient::new(cfg).expect("client");
    assert_eq!(Model::caps(&client), Endpoint::LlamaCpp.caps());
    let messages = [ChatMessage::user("the loss?")];
    let tools = [ToolSpec {
        name: "respond".into(),
        description: "answer".into(),
        parameters: json!({"type": "object", "properties": {"data": {"type": "object"}}, "required": ["data"], "additionalProperties": false}),
        strict: true,
    }];
    let format = json!({"type": "json_schema", "json_schema": {"name": "envelope", "schema": {"type": "object"}}});
    let req = StepRequest {
        messages: &messages,
        tools: &tools,
        max_tokens: None,
        response_format: Some(&format),
        tool_choice_required: true,
    };
    let mut deltas = Vec::new();
    let out = client
        .step(req, &mut |d| deltas.push(d))
        .await
        .expect("step");
    assert_eq!(
        calls(&out),
        [("c1", "respond", "{\"data\": {\"loss\": 0.5}}")]
    );
    assert_eq!(
        tool_args(&deltas),
        [
            (0, Some("respond"), ""),
            (0, None, "{\"data\": {\"lo"),
            (0, None, "ss\": 0.5}}"),
        ]
    );
    let sent = server.await.expect("server");
    assert_eq!(sent["response_format"], format);
    assert_eq!(sent["tool_choice"], "required");
    assert_eq!(sent["tools"][0]["function"]["strict"], true);
    // A model that says nothing of its endpoint enforces nothing.
    struct Bare;
    impl Model for Bare {
        fn step<'a>(
            &'a self,
            _: StepRequest<'a>,
            _: &'a mut (dyn FnMut(Delta) + Send),
        ) -> super::StepFuture<'a> {
            Box::pin(async { Ok(StepOutput::default()) })
        }
    }
    assert_eq!(Bare.caps(), Caps::default());
}

fn quick(base_url: String, retries: u32) -> ModelConfig {
    let mut cfg = ModelConfig::new(base_url, "m");
    cfg.api_key = Some("sk-never-shown".into());
    cfg.max_retries = retries;
    cfg.backoff = Duration::from_millis(1);
    cfg.connect_timeout = Duration::from_secs(5);
    cfg.first_byte_timeout = Duration::from_secs(10);
    cfg
}

#[tokio::test]
async fn a_refused_connection_is_retried_then_named_with_its_url() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let client = ModelClient::new(quick(format!("http://127.0.0.1:{port}/v1"), 2)).expect("client");
    let messages = [ChatMessage::user("hi")];
    let req = StepRequest {
        messages: &messages,
        tools: &[],
        max_tokens: None,
        response_format: None,
        tool_choice_required: false,
    };
    let mut deltas = Vec::new();
    let err = client
        .step(req, &mut |d| deltas.push(d))
        .await
        .expect_err("refused");
    let text = err.to_string();
    assert!(
        matches!(&err, ModelError::RetriesExhausted { attempts: 3, last } if matches!(**last, ModelError::Connect { .. })),
        "{err:?}"
    );
    assert!(
        text.contains(&format!("http://127.0.0.1:{port}/v1/chat/completions")),
        "{text}"
    );
    assert!(text.to_lowercase().contains("refused"), "{text}");
    assert!(!text.contains("sk-never-shown"), "{text}");
    let attempts: Vec<u32> = deltas
        .iter()
        .map(|d| match d {
            Delta::Retry {
                attempt, issues, ..
            } => {
                assert!(issues.contains("could not connect"), "{issues}");
                *attempt
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(attempts, [1, 2]);
}

/// The client speaks TLS through the ring provider the hub installs, without a second
/// provider that would make rustls panic: a handshake against a socket that answers
/// garbage ends in an error, not a panic.
#[tokio::test]
async fn https_goes_through_rustls_without_a_provider_clash() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let server = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        if let Ok((mut s, _)) = listener.accept().await {
            let mut buf = [0u8; 512];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(b"HTTP/1.1 400 Not TLS\r\n\r\n").await;
        }
    });
    let client =
        ModelClient::new(quick(format!("https://127.0.0.1:{port}/v1"), 0)).expect("client");
    let messages = [ChatMessage::user("hi")];
    let req = StepRequest {
        messages: &messages,
        tools: &[],
        max_tokens: None,
        response_format: None,
        tool_choice_required: false,
    };
    let err = client.step(req, &mut |_| {}).await.expect_err("not TLS");
    assert!(matches!(err, ModelError::Connect { .. }), "{err:?}");
    server.abort();
}

#[test]
fn a_bad_configuration_is_refused_up_front() {
    assert!(matches!(
        ModelClient::new(ModelConfig::new("localhost", "m")),
        Err(ModelError::Config(_))
    ));
    assert!(matches!(
        ModelClient::new(ModelConfig::new("http://h/v1", " ")),
        Err(ModelError::Config(_))
    ));
    let mut cfg = ModelConfig::new("http://h/v1", "m");
    cfg.api_key = Some("bad\nkey".into());
    match ModelClient::new(cfg) {
        Err(ModelError::Config(m)) => assert!(!m.contains("bad\nkey"), "{m}"),
        other => panic!("{other:?}"),
    }
}

/// A server that answers every request with a 200 stream of `piece`, written again and
/// again (after `every`, if any) until the client leaves; counts its connections.
async fn endless(
    piece: Vec<u8>,
    every: Option<Duration>,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/v1", listener.local_addr().expect("addr"));
    let count = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            let piece = piece.clone();
            tokio::spawn(async move {
                // The request: enough of it that the client is past sending.
                let mut buf = vec![0u8; 64 * 1024];
                let _ = s.read(&mut buf).await;
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                loop {
                    if let Some(d) = every {
                        tokio::time::sleep(d).await;
                    }
                    if s.write_all(&piece).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, count)
}

fn hi() -> [ChatMessage; 1] {
    [ChatMessage::user("hi")]
}

fn bare(messages: &[ChatMessage]) -> StepRequest<'_> {
    StepRequest {
        messages,
        tools: &[],
        max_tokens: None,
        response_format: None,
        tool_choice_required: false,
    }
}

/// An endless stream of text is cut once the reply passes `limits.replyBytes`: the call
/// fails with the limit named, once, and is not made again.
#[tokio::test]
async fn an_endless_reply_is_cut_at_the_reply_cap_and_not_retried() {
    let piece = format!("data: {}\n\n", content(&"x".repeat(4096)));
    let (url, connections) = endless(piece.into_bytes(), None).await;
    let mut cfg = quick(url, 3);
    cfg.reply_bytes = 256 * 1024;
    let client = ModelClient::new(cfg).expect("client");
    let messages = hi();
    let mut text = 0usize;
    let err = client
        .step(bare(&messages), &mut |d| {
            if let Delta::Text(t) = d {
                text += t.len();
            }
        })
        .await
        .expect_err("cut");
    assert!(
        matches!(err, ModelError::ReplyTooLarge { limit: 262_144, .. }),
        "{err:?}"
    );
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("limits.replyBytes"), "{err}");
    assert!(text <= 256 * 1024 + 4096, "{text}");
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A stream of nothing but comments holds no text, yet its own bytes are bounded too.
#[tokio::test]
async fn an_endless_stream_of_pings_is_cut_by_its_own_bytes() {
    let (url, connections) = endless(b": ping\n\n".repeat(512), None).await;
    let mut cfg = quick(url, 3);
    cfg.reply_bytes = 4 * 1024;
    let client = ModelClient::new(cfg).expect("client");
    let messages = hi();
    let err = client
        .step(bare(&messages), &mut |_| {})
        .await
        .expect_err("cut");
    assert!(
        matches!(err, ModelError::ReplyTooLarge { limit, .. } if limit == 4 * 1024 * super::RAW_BYTES_PER_REPLY_BYTE),
        "{err:?}"
    );
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A server that drips a byte now and then never trips the idle bound, but the call's
/// deadline ends it, retries and all.
#[tokio::test]
async fn a_dripping_server_is_stopped_by_the_call_deadline() {
    let (url, connections) = endless(b":".to_vec(), Some(Duration::from_millis(20))).await;
    let mut cfg = quick(url, 3);
    cfg.idle_timeout = Duration::from_secs(5);
    cfg.call_deadline = Duration::from_millis(400);
    let client = ModelClient::new(cfg).expect("client");
    let messages = hi();
    let err = client
        .step(bare(&messages), &mut |_| {})
        .await
        .expect_err("deadline");
    assert!(
        matches!(err, ModelError::Deadline { after } if after == Duration::from_millis(400)),
        "{err:?}"
    );
    assert!(err.to_string().contains("limits.callDeadlineMs"), "{err}");
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
}
