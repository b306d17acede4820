//! The rendering rules, fed canned SSE text (as the hub writes it) cut into pieces at odd
//! places: live pieces printed once, the stored copy skipped or completed, a late joiner's
//! stored copy printed, a retry voiding the pieces, tool calls and wakes on one line.

use serde_json::{Value, json};

use super::*;
use crate::sse::Parser;

fn stored(seq: u64, body: Value) -> String {
    let mut ev = body;
    ev["seq"] = json!(seq);
    ev["ts"] = json!(1_786_615_445_000u64 + seq);
    format!("event: event\nid: {seq}\ndata: {ev}\n\n")
}

fn live(seq: u64, run: &str, step: u32, text: &str) -> String {
    let ev = json!({"seq": seq, "ts": 1, "kind": "model-delta", "run_id": run, "step": step,
        "text": text, "channel": "text", "live": true});
    // The hub's keep-alive comments fall between messages.
    format!(": ping\r\nevent: live\r\ndata: {ev}\r\n\r\n")
}

/// Any event sent live (a retry is sent live as it happens, and stored later).
fn live_event(seq: u64, body: Value) -> String {
    let mut ev = body;
    ev["seq"] = json!(seq);
    ev["ts"] = json!(1);
    format!("event: live\ndata: {ev}\n\n")
}

fn delta(run: &str, step: u32, text: &str) -> Value {
    json!({"kind": "model-delta", "run_id": run, "step": step, "text": text, "channel": "text"})
}

fn run_start(run: &str, seqs: &[u64]) -> Value {
    let input: Vec<Value> = seqs
        .iter()
        .map(|s| json!({"seq": s, "kind": "message", "text": "hi"}))
        .collect();
    json!({"kind": "run-start", "run_id": run, "input": input})
}

fn run_end_ok(run: &str, response: Option<&str>) -> Value {
    let mut output = json!({});
    if let Some(r) = response {
        output["response"] = json!(r);
    }
    json!({"kind": "run-end", "run_id": run, "result": {"ok": true, "output": output},
        "meta": {"usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        "strategy": "emit", "steps": 1, "outputRetries": 0, "elapsedMs": 5}})
}

fn run_end_err(run: &str) -> Value {
    json!({"kind": "run-end", "run_id": run, "result": {"ok": false, "error":
        {"code": "stopped", "stop": "steps", "message": "20 steps without an answer, and the last of them asked for the same wait again\nmore"}},
        "meta": {"usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        "strategy": "emit", "steps": 20, "outputRetries": 0, "elapsedMs": 5}})
}

/// Everything printed, notes as `[note]` lines.
fn show(outs: &[Out]) -> String {
    let mut s = String::new();
    for o in outs {
        match o {
            Out::Text(t) => s.push_str(t),
            Out::Reasoning(t) => s.push_str(&format!("<{t}>")),
            Out::Note(n) => s.push_str(&format!("[{n}]\n")),
        }
    }
    s
}

fn render_in_pieces(stream: &str, scope: Scope, piece: usize, opts: Options) -> (String, Render) {
    let mut parser = Parser::new(1 << 20);
    let mut render = Render::new(scope, opts);
    let mut outs = Vec::new();
    for chunk in stream.as_bytes().chunks(piece) {
        for msg in parser.feed(chunk).expect("parses") {
            if let Some(ev) = parse(&msg) {
                outs.extend(render.event(&ev, msg.event == "live"));
            }
        }
    }
    (show(&outs), render)
}

const OPTS: Options = Options {
    reasoning: false,
    width: 60,
};

/// The same output whatever size the pieces of the stream come in.
fn render(stream: &str, scope: Scope) -> (String, Render) {
    let (whole, render) = render_in_pieces(stream, scope, stream.len().max(1), OPTS);
    for piece in [1, 2, 3, 5, 7, 13, 64] {
        let (got, _) = render_in_pieces(stream, scope, piece, OPTS);
        assert_eq!(got, whole, "pieces of {piece} bytes");
    }
    (whole, render)
}

#[test]
fn live_pieces_are_printed_once_and_the_stored_copy_is_skipped() {
    let s = [
        stored(4, run_start("r1", &[3])),
        stored(5, json!({"kind": "step-start", "run_id": "r1", "step": 1})),
        live(5, "r1", 1, "Hel"),
        live(5, "r1", 1, "lo, wörld"),
        stored(6, delta("r1", 1, "Hello, wörld")),
        stored(7, run_end_ok("r1", Some("Hello, wörld"))),
    ]
    .concat();
    let (got, r) = render(&s, Scope::All);
    assert_eq!(got, "Hello, wörld\n");
    assert!(r.ended().is_none(), "Scope::All follows no run");
}

#[test]
fn a_late_joiner_prints_the_stored_copy() {
    let s = [
        stored(6, delta("r1", 1, "all of it")),
        stored(7, run_end_ok("r1", Some("all of it"))),
    ]
    .concat();
    assert_eq!(render(&s, Scope::All).0, "all of it\n");
}

#[test]
fn after_a_cut_the_stored_copy_prints_only_the_rest() {
    // The stream dropped after "Hel"; the reconnect brings the stored copy.
    let s = [
        live(5, "r1", 1, "Hel"),
        stored(6, delta("r1", 1, "Hello")),
        stored(7, run_end_ok("r1", None)),
    ]
    .concat();
    assert_eq!(render(&s, Scope::All).0, "Hello\n");
}

#[test]
fn a_retry_voids_the_pieces_of_its_step() {
    let retry = json!({"kind": "retry", "run_id": "r1", "step": 1, "cause": "provider",
        "attempt": 2, "issues": "502 from the model server\ndetails", "delay_ms": 2000});
    // As the hub sends it: the retry live, in order with the pieces; its stored copy
    // with the step's end, after the new attempt's pieces.
    let s = [
        live(5, "r1", 1, "The answ"),
        live_event(5, retry.clone()),
        live(5, "r1", 1, "Forty-two."),
        stored(6, retry.clone()),
        stored(7, delta("r1", 1, "Forty-two.")),
        stored(8, run_end_ok("r1", Some("Forty-two."))),
    ]
    .concat();
    assert_eq!(
        render(&s, Scope::All).0,
        "The answ\n[↻ retry 2 in 2s, the text above is void: provider: 502 from…]\nForty-two.\n"
    );
    // A follower that joined after the live retry, or late: the stored copy is a marker
    // and voids nothing.
    let s = [
        live(5, "r1", 1, "Forty"),
        stored(6, retry),
        stored(7, delta("r1", 1, "Forty-two.")),
    ]
    .concat();
    assert_eq!(
        render(&s, Scope::All).0,
        "Forty\n[↻ retry 2 in 2s: provider: 502 from the model server]\n-two."
    );
}

#[test]
fn tool_calls_are_one_line_each_cut_to_the_width() {
    let start = json!({"kind": "tool-start", "run_id": "r1", "step": 1, "call": {"id": "c1",
        "name": "wait_create", "args": {"label": "train", "intent": "the 33k-step run\nthen compare"}}});
    let end = json!({"kind": "tool-end", "run_id": "r1", "step": 1, "observation":
        {"call_id": "c1", "name": "wait_create", "ok": true, "result": {"id": "wp_1", "state": "armed"}}});
    let failed = json!({"kind": "tool-end", "run_id": "r1", "step": 2, "observation":
        {"call_id": "c2", "name": "wait_check", "ok": false, "result": {"error": "no waitpoint wp_9"}}});
    let s = [
        live(4, "r1", 1, "Arming."),
        stored(5, start),
        stored(6, end),
        stored(7, failed),
    ]
    .concat();
    let (got, _) = render(&s, Scope::All);
    let lines: Vec<&str> = got.lines().collect();
    assert_eq!(lines[0], "Arming.");
    assert_eq!(
        lines[1],
        "[→ wait_create {\"intent\":\"the 33k-step run\\nthen compare\",\"l…]"
    );
    assert_eq!(lines[1].chars().count(), 60 + 2);
    assert_eq!(lines[2], "[← ok {\"id\":\"wp_1\",\"state\":\"armed\"}]");
    assert_eq!(lines[3], "[← error no waitpoint wp_9]");
}

#[test]
fn a_wake_is_its_label_and_reason_and_the_first_line_of_its_text() {
    let wake = json!({"kind": "wake", "waitpoint": {"id": "wp_1", "label": "train",
        "intent": "compare"}, "reason": "fired", "waited_ms": 61_000, "signals": [],
        "text": "Waitpoint wp_1 \"train\" fired after waiting 1m 1s.\nmessage: \"done\""});
    let (got, _) = render(&stored(9, wake), Scope::All);
    assert_eq!(
        got,
        "[⏰ wake: train fired after 1m 1s]\n[   Waitpoint wp_1 \"train\" fired after waiting 1m 1s.]\n"
    );
}

#[test]
fn a_run_that_fails_says_its_code_and_message() {
    let s = [live(5, "r1", 1, "partial"), stored(6, run_end_err("r1"))].concat();
    assert_eq!(
        render(&s, Scope::All).0,
        "partial\n[✗ run failed: stopped (steps): 20 steps without an answer, and the last of them asked for the same wait again]\n"
    );
}

#[test]
fn an_answer_cut_at_max_tokens_says_so() {
    let mut cut = run_end_ok("r1", None);
    cut["meta"]["finishReason"] = json!("length");
    let mut whole = run_end_ok("r2", None);
    whole["meta"]["finishReason"] = json!("stop");
    let s = [
        stored(4, run_start("r1", &[3])),
        live(5, "r1", 1, "The answer is"),
        stored(6, cut),
        stored(7, run_start("r2", &[8])),
        live(9, "r2", 1, "Done."),
        stored(10, whole),
    ]
    .concat();
    assert_eq!(
        render(&s, Scope::All).0,
        format!("The answer is\n[{TRUNCATED}]\nDone.\n")
    );
}

#[test]
fn an_answer_only_in_the_output_is_shown_at_the_end() {
    let s = [
        stored(4, run_start("r1", &[3])),
        stored(5, run_end_ok("r1", Some("only here"))),
    ]
    .concat();
    assert_eq!(render(&s, Scope::All).0, "only here\n");
}

#[test]
fn a_message_scope_shows_only_the_run_that_took_the_message() {
    let s = [
        // A run a wake started, before the message's run: not shown.
        stored(2, run_start("r0", &[1])),
        live(2, "r0", 1, "other"),
        stored(
            3,
            json!({"kind": "message", "text": "hi", "when": "next_turn"}),
        ),
        stored(4, run_end_ok("r0", Some("other"))),
        stored(5, run_start("r1", &[3])),
        live(5, "r1", 1, "mine"),
        stored(6, delta("r1", 1, "mine")),
        stored(7, run_end_ok("r1", Some("mine"))),
        // After the run's end nothing more.
        stored(8, run_start("r2", &[3])),
        live(8, "r2", 1, "later"),
    ]
    .concat();
    let (got, r) = render(&s, Scope::Message(3));
    assert_eq!(got, "mine\n");
    let ended = r.ended().expect("ended");
    assert_eq!(ended.run_id, "r1");
    assert!(ended.result.ok);
}

#[test]
fn reasoning_is_shown_apart_only_when_asked() {
    let reasoning = json!({"seq": 5, "ts": 1, "kind": "model-delta", "run_id": "r1", "step": 1,
        "text": "thinking", "channel": "reasoning", "live": true});
    let s = [
        format!("event: live\ndata: {reasoning}\n\n"),
        live(5, "r1", 1, "answer"),
        stored(6, run_end_ok("r1", None)),
    ]
    .concat();
    assert_eq!(render(&s, Scope::All).0, "answer\n");
    let opts = Options {
        reasoning: true,
        width: 60,
    };
    let (got, _) = render_in_pieces(&s, Scope::All, 3, opts);
    assert_eq!(got, "<thinking>\nanswer\n");
}

#[test]
fn unknown_kinds_and_other_messages_are_skipped() {
    let s = [
        "event: event\nid: 1\ndata: {\"seq\":1,\"ts\":1,\"kind\":\"approval-required\"}\n\n"
            .to_string(),
        "event: other\ndata: {}\n\n".to_string(),
        stored(2, delta("r1", 1, "ok")),
    ]
    .concat();
    assert_eq!(render(&s, Scope::All).0, "ok");
}

#[test]
fn fit_cuts_on_characters() {
    assert_eq!(fit("short", 60), "short");
    assert_eq!(fit("a\nb", 60), "a b");
    assert_eq!(fit("ééééééééééé", 8), "ééééééé…");
}

#[test]
fn a_message_is_its_first_line_and_a_live_piece_needs_no_seq() {
    let piece = json!({"kind": "model-delta", "run_id": "r1", "step": 1, "text": "hi",
        "channel": "text", "live": true});
    let s = [
        stored(
            3,
            json!({"kind": "message", "text": "status?\nand more", "when": "now"}),
        ),
        format!("event: live\ndata: {piece}\n\n"),
        stored(4, delta("r1", 1, "hi")),
    ]
    .concat();
    assert_eq!(render(&s, Scope::All).0, "[» status?]\nhi");
}
