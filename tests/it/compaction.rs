//! Compaction against a scripted server with a small context, as llama.cpp's is: the
//! server reports it at `GET /props` and refuses (400, "exceeds the available context
//! size") a request that reaches it. A session keeps answering turn after turn; a server
//! that does not report its context refuses once and the step is compacted and made
//! again; a message too big for any context fails its run once and the next turn still
//! answers; `cortex session compact SID` compacts at once.

use cortex_cli::http::Method;
use cortex_tests::scripted_model::{Reply, ScriptedModel};
use serde_json::{Value, json};

use crate::runner::{hub, new_session, run_end, say};

/// The summary the scripted model writes when asked for one.
const SUMMARY: &str = "SUMMARY: the person sent numbered notes about job 7";
/// The head of the summary's message in a request.
const HEAD: &str = "[cortex: the conversation before this point, summarized";

fn is_summary_call(body: &Value) -> bool {
    body["messages"][0]["content"]
        .as_str()
        .is_some_and(|c| c.starts_with("You summarize a conversation"))
}

/// A model that answers a summary call with [`SUMMARY`] and anything else with "noted".
fn model(context: u64, reported: bool) -> ScriptedModel {
    let model = ScriptedModel::start_with_default(
        Vec::new(),
        Reply::from_fn(|body| match is_summary_call(body) {
            true => Reply::text(SUMMARY),
            false => Reply::text("noted"),
        }),
    );
    model.set_context(Some(context));
    model.report_context(reported);
    model
}

/// A note of about 300 bytes (some 75 of the scripted server's tokens).
fn note(n: usize) -> String {
    format!(
        "note {n}: {}",
        "job 7 wrote another line of its log; ".repeat(8)
    )
}

/// A chat session as `cortex chat` against a small model has: one tool shown, short
/// answers.
fn session(hub: &cortex_tests::Hub, title: &str) -> String {
    new_session(
        hub,
        json!({"title": title, "instructions": "Be brief.", "maxTokens": 64,
               "policy": {"allow": ["wait_create"]}}),
    )
}

fn compactions(events: &[Value]) -> Vec<&Value> {
    events
        .iter()
        .filter(|e| e["kind"] == "compaction")
        .collect()
}

/// The requests that were the session's own steps (not summary calls).
fn steps(model: &ScriptedModel) -> Vec<Value> {
    model
        .requests()
        .into_iter()
        .filter(|b| !b.is_null() && !is_summary_call(b))
        .collect()
}

fn carries_summary(body: &Value) -> bool {
    body["messages"].as_array().is_some_and(|m| {
        m.iter()
            .any(|m| m["content"].as_str().is_some_and(|c| c.starts_with(HEAD)))
    })
}

/// The first request's prefix (its messages before the first person's) is in `body` as
/// it was.
fn keeps_prefix(first: &Value, body: &Value) -> bool {
    let first = first["messages"].as_array().cloned().unwrap_or_default();
    let n = first
        .iter()
        .position(|m| m["role"] == "user")
        .unwrap_or(first.len());
    body["messages"]
        .as_array()
        .is_some_and(|m| m.len() >= n && m[..n] == first[..n])
}

#[test]
fn a_session_near_its_context_is_compacted_and_keeps_answering() {
    // A 2,048-token context, as SmolLM2's with llama.cpp: the first request holds some 790
    // of the server's tokens, each turn adds some 93, so by turn 15 the whole transcript
    // no longer fits.
    let model = model(2_048, true);
    let (hub, _tmp) = hub(&model);
    let sid = session(&hub, "small context");
    for n in 1..=20 {
        say(&hub, &sid, json!({"text": note(n)}));
        let end = run_end(&hub, &sid, n);
        assert_eq!(end["result"]["ok"], true, "turn {n}: {end}");
    }
    assert_eq!(model.refused(), 0, "compacted before the server refused");
    let events = hub.events(&sid, 0);
    let done = compactions(&events);
    assert!(!done.is_empty(), "no compaction in {events:?}");
    for c in &done {
        assert_eq!(c["cause"], "threshold", "{c}");
        assert!(c.get("error").is_none(), "{c}");
        assert_eq!(c["summary"], SUMMARY, "{c}");
        assert_eq!(c["contextTokens"], 2_048, "the server's /props: {c}");
        assert!(
            c["tokensAfter"].as_u64() < c["tokensBefore"].as_u64(),
            "it saves: {c}"
        );
        assert!(
            c["usage"]["prompt_tokens"].as_u64() > Some(0),
            "its cost: {c}"
        );
    }
    let steps = steps(&model);
    let last = steps.last().expect("a step");
    assert!(carries_summary(last), "the last request: {last}");
    assert!(
        keeps_prefix(&steps[0], last),
        "the prefix stays as it was: {last}"
    );
    let text = last.to_string();
    assert!(
        text.contains("note 20:"),
        "the newest note is whole: {text}"
    );
    assert!(
        !text.contains("note 1:"),
        "the oldest is summarized: {text}"
    );
    assert!(text.contains(SUMMARY), "{text}");
}

#[test]
fn a_refusal_for_size_is_compacted_and_the_step_made_again_once() {
    // The server does not report its context: the first sign is a refusal. One step a
    // run: the step made again is the same step, not one over the bound.
    let model = model(2_048, false);
    let (hub, _tmp) = hub(&model);
    let sid = new_session(
        &hub,
        json!({"title": "unknown context", "instructions": "Be brief.", "maxTokens": 64,
               "policy": {"allow": ["wait_create"]}, "stop": {"steps": 1}}),
    );
    for n in 1..=20 {
        say(&hub, &sid, json!({"text": note(n)}));
        let end = run_end(&hub, &sid, n);
        assert_eq!(end["result"]["ok"], true, "turn {n}: {end}");
    }
    // Refused once; the refusal names the context (n_ctx), compacted by it from then on.
    assert_eq!(model.refused(), 1, "one refusal, then the context is known");
    let events = hub.events(&sid, 0);
    let done = compactions(&events);
    assert_eq!(
        done.first().map(|c| &c["cause"]),
        Some(&json!("refused")),
        "{done:?}"
    );
    assert!(
        done[1..].iter().all(|c| c["cause"] == "threshold"),
        "{done:?}"
    );
    let retry: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "retry" && e["cause"] == "context")
        .collect();
    assert_eq!(retry.len(), 1, "the step made again once: {events:?}");
    assert!(
        retry[0]["issues"]
            .as_str()
            .is_some_and(|i| i.contains("exceeds the available context size")),
        "{}",
        retry[0]
    );
}

#[test]
fn a_message_too_big_for_the_context_fails_its_run_once_and_the_next_still_answers() {
    let model = model(2_048, false);
    let (hub, _tmp) = hub(&model);
    let sid = session(&hub, "one huge message");
    // Some 3,000 tokens in one message: nothing before it to summarize.
    let huge = "the whole log of job 7, line after line. ".repeat(290);
    say(&hub, &sid, json!({"text": huge}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], false, "{end}");
    assert!(
        end["result"]["error"]
            .to_string()
            .contains("exceeds the available context size"),
        "{end}"
    );
    assert_eq!(
        model.refused(),
        2,
        "refused, compacted (nothing to), made again once"
    );
    let events = hub.events(&sid, 0);
    let done = compactions(&events);
    assert_eq!(done.len(), 1, "{done:?}");
    assert!(
        done[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("nothing to compact")),
        "{}",
        done[0]
    );
    // The next turn: the huge message is summarized (its first 1,500 characters read).
    say(&hub, &sid, json!({"text": "what did the log say?"}));
    let end = run_end(&hub, &sid, 2);
    assert_eq!(end["result"]["ok"], true, "{end}");
    let last = steps(&model).pop().expect("a step");
    assert!(carries_summary(&last), "{last}");
    assert!(!last.to_string().contains(&huge), "{last}");
}

#[test]
fn cortex_session_compact_summarizes_at_once_and_the_next_request_carries_it() {
    // A context the session is far from: only the person's ask compacts.
    let model = model(100_000, true);
    let (hub, _tmp) = hub(&model);
    let sid = session(&hub, "forced");
    for n in 1..=3 {
        say(&hub, &sid, json!({"text": note(n)}));
        run_end(&hub, &sid, n);
    }
    let (code, out, err) = hub.cortex(&["session", "compact", &sid]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("context compacted (forced)"), "{out}");
    assert!(out.contains("messages summarized"), "{out}");
    let events = hub.events(&sid, 0);
    let done = compactions(&events);
    assert_eq!(done.len(), 1, "{events:?}");
    assert_eq!(done[0]["cause"], "forced");
    assert_eq!(done[0]["summary"], SUMMARY);

    say(&hub, &sid, json!({"text": "and now?"}));
    run_end(&hub, &sid, 4);
    let steps = steps(&model);
    let last = steps.last().expect("a step");
    assert!(carries_summary(last), "{last}");
    assert!(keeps_prefix(&steps[0], last), "{last}");
    let text = last.to_string();
    assert!(!text.contains("note 1:"), "{text}");

    // The route: 404 for no such session, 409 for a mailbox; --json prints the event.
    let (st, v) = hub.api(Method::Post, "/api/sessions/ses_nope/compact", None);
    assert_eq!(st, 404, "{v}");
    let mailbox = new_session(&hub, json!({"title": "inbox only", "runs": false}));
    let (st, v) = hub.api(
        Method::Post,
        &format!("/api/sessions/{mailbox}/compact"),
        None,
    );
    assert_eq!((st, v["error"].as_str()), (409, Some("mailbox")), "{v}");
    let (code, out, err) = hub.cortex(&["session", "compact", &sid, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let ev: Value = serde_json::from_str(out.trim()).expect("one JSON event");
    assert_eq!(ev["kind"], "compaction", "{ev}");
    assert_eq!(ev["cause"], "forced", "{ev}");
}
