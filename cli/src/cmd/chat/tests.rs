//! `cortex chat` against a small hub on port 0 that streams a session's events only once
//! the message was posted: the answer, tool calls, a wake, a retry and a failed run, all
//! on stdout; EOF on a pipe waits for the answer.

use std::io::{Cursor, Write};
use std::net::TcpListener;
use std::sync::mpsc::{Receiver, channel};
use std::thread;
use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::testserver::{Recorded, json as answer, read_request};

fn stored(seq: u64, mut body: Value) -> String {
    body["seq"] = json!(seq);
    body["ts"] = json!(1_786_615_445_000u64);
    format!("event: event\nid: {seq}\ndata: {body}\n\n")
}

fn live(run: &str, step: u32, text: &str) -> String {
    let ev = json!({"seq": 0, "ts": 0, "kind": "model-delta", "run_id": run, "step": step,
        "text": text, "channel": "text", "live": true});
    format!("event: live\ndata: {ev}\n\n")
}

fn run_end(run: &str, result: Value) -> Value {
    json!({"kind": "run-end", "run_id": run, "result": result, "meta": {"usage":
        {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, "strategy": "emit",
        "steps": 1, "outputRetries": 0, "elapsedMs": 1}})
}

/// A hub for session `ses_1` (last seq 2, its past events 1 and 2 `history`): the events
/// stream writes `events` once a message was posted (answered `seq 4`, `runs`), then
/// stays open. Returns its address and the messages posted.
fn chat_hub(events: String, runs: bool, history: Vec<Value>) -> (String, Receiver<Recorded>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (posted_tx, posted_rx) = channel::<Recorded>();
    let (go_tx, go_rx) = channel::<()>();
    let go_rx = std::sync::Arc::new(std::sync::Mutex::new(go_rx));
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let (posted_tx, go_tx, go_rx) = (posted_tx.clone(), go_tx.clone(), go_rx.clone());
            let events = events.clone();
            let history = json!({"events": history.clone()}).to_string();
            thread::spawn(move || {
                let Some(req) = read_request(&mut stream) else {
                    return;
                };
                match (req.method.as_str(), req.path.as_str()) {
                    ("GET", "/api/sessions/ses_1") => {
                        let view = json!({"id": "ses_1", "title": "watch", "created_at": 1,
                            "last_seq": 2, "armed_waitpoints": 0, "runs": true});
                        let _ = stream.write_all(&answer(200, &view.to_string()));
                    }
                    ("GET", "/api/sessions/ses_1/events?after=0") => {
                        let _ = stream.write_all(&answer(200, &history));
                    }
                    ("GET", p) if p.starts_with("/api/sessions/ses_1/events?after=2") => {
                        let _ = stream.write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n: hi\n\n",
                        );
                        let _ = stream.flush();
                        let got = go_rx
                            .lock()
                            .map(|rx| rx.recv_timeout(Duration::from_secs(30)));
                        if let Ok(Ok(())) = got {
                            let _ = stream.write_all(events.as_bytes());
                            let _ = stream.flush();
                        }
                        // Held open, as the hub's stream is, until the client leaves.
                        let mut sink = [0u8; 64];
                        let _ = std::io::Read::read(&mut stream, &mut sink);
                    }
                    ("POST", "/api/sessions/ses_1/messages") => {
                        let body = json!({"seq": 4, "duplicate": false, "runs": runs});
                        let _ = posted_tx.send(req);
                        let _ = stream.write_all(&answer(201, &body.to_string()));
                        let _ = go_tx.send(());
                    }
                    _ => {
                        let _ = stream
                            .write_all(&answer(404, r#"{"error":"not_found","message":"no"}"#));
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), posted_rx)
}

fn chat(url: &str, input: &str, term: Term) -> (u8, String, String) {
    let hub = Hub::new(url, "tok").expect("hub");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let input = Box::new(Cursor::new(input.to_string().into_bytes()));
    let code = run(&hub, "ses_1", false, &term, input, &mut out, &mut err).expect("chat runs");
    (
        code,
        String::from_utf8(out).expect("utf8"),
        String::from_utf8(err).expect("utf8"),
    )
}

const PIPE: Term = Term {
    stdin_tty: false,
    stdout_tty: false,
    width: Some(72),
    catch_interrupt: false,
};

#[test]
fn a_piped_line_is_posted_and_everything_the_session_does_is_printed() {
    let wake = json!({"kind": "wake", "waitpoint": {"id": "wp_0", "label": "train",
        "intent": "compare"}, "reason": "fired", "waited_ms": 3_000, "signals": [],
        "text": "Waitpoint wp_0 \"train\" fired after waiting 3s.\nmore"});
    let retry = json!({"kind": "retry", "run_id": "r0", "step": 1, "cause": "provider",
        "attempt": 2, "issues": "502", "delay_ms": 1000});
    let failed = json!({"ok": false, "error": {"code": "model_call_failed",
        "message": "502 three times"}});
    let tool_start = json!({"kind": "tool-start", "run_id": "r1", "step": 1, "call":
        {"id": "c1", "name": "wait_create", "args": {"label": "eval", "intent": "x"}}});
    let tool_end = json!({"kind": "tool-end", "run_id": "r1", "step": 1, "observation":
        {"call_id": "c1", "name": "wait_create", "ok": false, "result": {"error": "too many"}}});
    let events = [
        // A wake's run before the message's: it fails after a retry.
        stored(3, wake),
        // The line posted here is not echoed; a message from elsewhere is shown.
        stored(
            4,
            json!({"kind": "message", "text": "hi there", "when": "next_turn"}),
        ),
        stored(
            5,
            json!({"kind": "run-start", "run_id": "r0",
            "input": [{"seq": 3, "kind": "wake", "text": "w"}]}),
        ),
        live("r0", 1, "Checking"),
        format!("event: live\ndata: {}\n\n", {
            let mut r = retry.clone();
            r["seq"] = json!(5);
            r["ts"] = json!(1);
            r
        }),
        stored(6, retry),
        stored(7, run_end("r0", failed)),
        stored(
            8,
            json!({"kind": "message", "text": "from the page\nsecond line",
            "when": "next_turn"}),
        ),
        // The message's run.
        stored(
            9,
            json!({"kind": "run-start", "run_id": "r1",
            "input": [{"seq": 4, "kind": "message", "text": "hi"}]}),
        ),
        live("r1", 1, "On it."),
        stored(10, tool_start),
        stored(11, tool_end),
        stored(
            12,
            json!({"kind": "model-delta", "run_id": "r1", "step": 1,
            "text": "On it.", "channel": "text"}),
        ),
        live("r1", 2, "Done."),
        stored(
            13,
            run_end("r1", json!({"ok": true, "output": {"response": "Done."}})),
        ),
    ]
    .concat();
    let (url, posted) = chat_hub(events, true, Vec::new());
    let (code, out, err) = chat(&url, "hi there\n", PIPE);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "⏰ wake: train fired after 3s\n   \
         Waitpoint wp_0 \"train\" fired after waiting 3s.\n\
         Checking\n\
         ↻ retry 2 in 1s, the text above is void: provider: 502\n\
         ✗ run failed: model_call_failed: 502 three times\n\
         » from the page\n\
         On it.\n\
         → wait_create {\"intent\":\"x\",\"label\":\"eval\"}\n\
         ← error too many\n\
         Done.\n"
    );
    let req = posted
        .recv_timeout(Duration::from_secs(30))
        .expect("posted");
    assert_eq!(req.json(), json!({"text": "hi there", "when": "next_turn"}));
}

/// On open, the recent past: the session's last messages and wakes with what came of
/// them, before anything new.
#[test]
fn chat_opens_with_the_recent_history() {
    let history = vec![
        json!({"seq": 1, "ts": 1, "kind": "message", "text": "how is the run?",
            "when": "next_turn"}),
        json!({"seq": 2, "ts": 2, "kind": "run-end", "run_id": "r0",
            "result": {"ok": true, "output": {"response": "Loss 0.3, still going."}},
            "meta": {"usage": {"prompt_tokens": 0, "completion_tokens": 0,
            "total_tokens": 0}, "strategy": "emit", "steps": 1, "outputRetries": 0,
            "elapsedMs": 1}}),
    ];
    let (url, _) = chat_hub(String::new(), false, history);
    let (code, out, err) = chat(&url, "", PIPE);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("» how is the run?\n"), "{out}");
    assert!(out.contains("Loss 0.3, still going."), "{out}");
}

#[test]
fn without_a_model_chat_says_so_and_ends_at_eof() {
    let (url, posted) = chat_hub(String::new(), false, Vec::new());
    let (code, out, err) = chat(&url, "hello\n\n", PIPE);
    assert_eq!((code, out.as_str()), (0, ""));
    assert!(err.contains("the hub runs no model"), "{err}");
    assert_eq!(posted.try_iter().count(), 1, "the empty line is not posted");
}

#[test]
fn an_unknown_session_is_exit_2() {
    let (url, _) = chat_hub(String::new(), true, Vec::new());
    let hub = Hub::new(&url, "tok").expect("hub");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run(
        &hub,
        "ses_nope",
        false,
        &PIPE,
        Box::new(Cursor::new(Vec::new())),
        &mut out,
        &mut err,
    )
    .expect("runs");
    assert_eq!(code, 2);
    assert!(String::from_utf8_lossy(&err).contains("HTTP 404"));
}
