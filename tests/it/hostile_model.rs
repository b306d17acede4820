//! A hostile model server (`cortex_tests::hostile_model`) cannot exhaust the hub: a reply
//! without end is cut at `limits.replyBytes` and fails once; a cancel cuts the stream at
//! once; a server dripping a byte at a time is ended by `limits.callDeadlineMs`; a run's
//! `stop.durationMs` and `stop.tokens` hold while a reply streams; a reply too large for
//! one record of the session log fails once and is never fetched again.

use std::time::Duration;

use cortex_cli::http::Method;
use cortex_tests::hostile_model::Mode;
use cortex_tests::scripted_model::{Outcome, ScriptedModel};
use cortex_tests::{Hub, wait_until};
use serde_json::{Value, json};

use crate::runner::{LIMIT, count, hub_with, new_session, run_end, say};

/// A hub running `model` with these `limits`.
fn hub(model: &ScriptedModel, limits: Value) -> (Hub, tempfile::TempDir) {
    hub_with(model, json!({ "limits": limits }))
}

/// A session told one message; its first run's end.
fn one_run(hub: &Hub, session: Value) -> (String, Value) {
    let sid = new_session(hub, session);
    say(hub, &sid, json!({"text": "go"}));
    let end = run_end(hub, &sid, 1);
    (sid, end)
}

/// The tests that move tens of MiB through a debug hub on a shared machine wait longer.
const BIG: Duration = Duration::from_secs(180);

/// The session's first `run-end`, waited for up to [`BIG`].
fn first_run_end(hub: &Hub, sid: &str) -> Value {
    hub.wait_event(sid, BIG, |e| e["kind"] == "run-end")
}

fn error(end: &Value) -> (String, String, String) {
    let e = &end["result"]["error"];
    let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
    (s("code"), s("stop"), s("message"))
}

/// The hub still answers, and the model was called once, its answer cut by the hub
/// (the server saw it leave).
fn called_once_and_cut(hub: &Hub, model: &ScriptedModel) {
    assert_eq!(
        model.wait_outcome(0, LIMIT),
        Outcome::ClientGone,
        "the hub left the stream"
    );
    let (st, _) = hub.api(Method::Get, "/healthz", None);
    assert_eq!(st, 200);
    assert_eq!(model.request_count(), 1, "the model was called once");
}

#[test]
fn an_endless_reply_fails_once_at_the_reply_cap() {
    let model = Mode::Endless.start();
    let (hub, _tmp) = hub(&model, json!({"replyBytes": 1 << 20}));
    let (sid, end) = one_run(&hub, json!({}));
    let (code, _, message) = error(&end);
    assert_eq!(code, "model_call_failed", "{end}");
    assert!(message.contains("limits.replyBytes"), "{message}");
    assert!(message.contains("1048576"), "{message}");
    called_once_and_cut(&hub, &model);
    let events = hub.events(&sid, 0);
    assert_eq!(count(&events, "run-end"), 1);
    assert_eq!(count(&events, "retry"), 0, "not retried");
}

#[test]
fn a_cancel_cuts_an_endless_stream_at_once() {
    let model = Mode::Endless.start();
    // No cap in reach: only the cancel ends the stream.
    let (hub, _tmp) = hub(&model, json!({"replyBytes": 1u64 << 40}));
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "go"}));
    wait_until(LIMIT, "the model call", || {
        (model.bytes_sent() > 64 << 10).then_some(())
    });
    let (st, v) = hub.api(
        Method::Post,
        &format!("/api/sessions/{sid}/cancel"),
        Some(&json!({"turn_only": true})),
    );
    assert_eq!(st, 202, "{v}");
    assert_eq!(
        model.wait_outcome(0, LIMIT),
        Outcome::ClientGone,
        "the stream was cut"
    );
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], false, "{end}");
    let (st, _) = hub.api(Method::Get, "/healthz", None);
    assert_eq!(st, 200);
    assert_eq!(model.request_count(), 1);
}

/// A cancel that finds more text than one record of the log holds (the cap raised out of
/// reach) records a note in its place, once: the run ends, the model is not called
/// again, and the store is not said to be failing.
#[test]
fn a_cancel_with_too_much_text_to_record_keeps_a_note_once() {
    let model = Mode::Endless.start();
    let (hub, _tmp) = hub(&model, json!({"replyBytes": 1u64 << 40}));
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "go"}));
    wait_until(BIG, "80 MiB streamed", || {
        (model.bytes_sent() > 80 << 20).then_some(())
    });
    let (st, v) = hub.api(
        Method::Post,
        &format!("/api/sessions/{sid}/cancel"),
        Some(&json!({"turn_only": true})),
    );
    assert_eq!(st, 202, "{v}");
    assert_eq!(model.wait_outcome(0, LIMIT), Outcome::ClientGone);
    let end = first_run_end(&hub, &sid);
    assert_eq!(end["result"]["error"]["code"], "aborted", "{end}");
    let events = hub.events(&sid, 0);
    assert!(
        events.iter().any(|e| e["kind"] == "model-delta"
            && e["text"]
                .as_str()
                .is_some_and(|t| t.contains("was too large to record"))),
        "{:?}",
        crate::runner::kinds(&events)
    );
    assert_eq!(count(&events, "run-end"), 1);
    assert_eq!(model.request_count(), 1);
    let log = hub.log();
    assert!(!log.contains("stopped driving a session"), "{log}");
    assert!(!log.contains("checkpoints into redb are failing"), "{log}");
}

#[test]
fn a_dripping_server_is_ended_by_the_call_deadline() {
    let model = Mode::Drip {
        every: Duration::from_millis(50),
    }
    .start();
    let (hub, _tmp) = hub(&model, json!({"callDeadlineMs": 1500}));
    let (_, end) = one_run(&hub, json!({}));
    let (code, _, message) = error(&end);
    assert_eq!(code, "model_call_failed", "{end}");
    assert!(message.contains("limits.callDeadlineMs"), "{message}");
    called_once_and_cut(&hub, &model);
}

#[test]
fn a_runs_duration_holds_while_a_reply_streams() {
    let model = Mode::Drip {
        every: Duration::from_millis(50),
    }
    .start();
    let (hub, _tmp) = hub(&model, json!({}));
    let (sid, end) = one_run(&hub, json!({"stop": {"durationMs": 1500}}));
    let (code, stop, _) = error(&end);
    assert_eq!(
        (code.as_str(), stop.as_str()),
        ("stopped", "duration"),
        "{end}"
    );
    called_once_and_cut(&hub, &model);
    // What streamed before the stop is kept, marked.
    let events = hub.events(&sid, 0);
    assert!(
        events.iter().any(|e| e["kind"] == "model-delta"
            && e["text"].as_str().is_some_and(|t| t.contains("[Stopped:"))),
        "{events:?}"
    );
}

#[test]
fn a_runs_tokens_hold_while_a_reply_streams() {
    let model = Mode::Endless.start();
    let (hub, _tmp) = hub(&model, json!({"replyBytes": 1u64 << 40}));
    let (_, end) = one_run(&hub, json!({"stop": {"tokens": 1000}}));
    let (code, stop, message) = error(&end);
    assert_eq!(
        (code.as_str(), stop.as_str()),
        ("stopped", "tokens"),
        "{end}"
    );
    assert!(message.contains("stop.tokens"), "{message}");
    called_once_and_cut(&hub, &model);
}

#[test]
fn a_huge_reply_over_the_cap_fails_once() {
    let model = Mode::Huge { bytes: 8 << 20 }.start();
    let (hub, _tmp) = hub(&model, json!({}));
    let (_, end) = one_run(&hub, json!({}));
    let (code, _, message) = error(&end);
    assert_eq!(code, "model_call_failed", "{end}");
    assert!(message.contains("limits.replyBytes"), "{message}");
    // (All of it may be in the socket's buffers before the hub stops reading.)
    let (st, _) = hub.api(Method::Get, "/healthz", None);
    assert_eq!(st, 200);
    assert_eq!(model.request_count(), 1, "the model was called once");
}

/// Under a cap raised past what one record of the log holds, a whole reply that arrives
/// but cannot be recorded ends its run once, with the reason; it is not fetched again.
#[test]
fn a_reply_too_large_to_record_fails_once_and_is_not_fetched_again() {
    let model = Mode::Huge { bytes: 40 << 20 }.start();
    let (hub, _tmp) = hub(&model, json!({"replyBytes": 128 << 20}));
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "go"}));
    let end = first_run_end(&hub, &sid);
    let (code, _, message) = error(&end);
    assert_eq!(code, "model_call_failed", "{end}");
    assert!(message.contains("could not be recorded"), "{message}");
    assert!(message.contains("more than one record"), "{message}");
    assert_eq!(model.wait_outcome(0, BIG), Outcome::Sent);
    let (st, _) = hub.api(Method::Get, "/healthz", None);
    assert_eq!(st, 200);
    assert_eq!(model.request_count(), 1, "fetched once");
    assert_eq!(count(&hub.events(&sid, 0), "run-end"), 1);
    assert!(
        !hub.log().contains("checkpoints into redb are failing"),
        "{}",
        hub.log()
    );
}
