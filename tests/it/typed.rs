//! Typed answers against a scripted model over real HTTP: a session with an output schema
//! ends each run in a validated envelope, whichever transport carries it (`emit`,
//! `respond`, `native`); a refused answer goes back with the validator's issues and counts
//! against `outputRetries`, prose goes back with a correction that does not, and retries
//! spent end the run `output_invalid` with the last output. The envelope streams to
//! followers as `output-delta` and `output-partial`; `cortex session result` prints the data.

use std::io::{BufRead, BufReader, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use cortex_cli::http::Method;
use cortex_tests::scripted_model::{Reply, ScriptedModel};
use cortex_tests::{Hub, wait_until};
use serde_json::{Value, json};

use crate::runner::{LIMIT, count, hub, hub_with, last_message, new_session, run_end, say};

/// The data schema of a training run's report: strict (no other keys), so a bare payload
/// may be taken as `{data}`.
fn report_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "converged": {"type": "boolean"},
            "loss": {"type": "number"}
        },
        "required": ["converged", "loss"],
        "additionalProperties": false
    })
}

fn typed(strategy: &str) -> Value {
    json!({"instructions": "Report on the run.", "output": {"schema": report_schema(), "strategy": strategy}})
}

fn system_prompt(req: &Value) -> String {
    req["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn tool_names(req: &Value) -> Vec<String> {
    req["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|x| x["function"]["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Follows `sid`'s events over SSE from a thread, keeping every `data:` line's JSON
/// until a `run-end` arrives or `limit` passes.
fn follow(hub: &Hub, sid: &str, limit: Duration) -> std::thread::JoinHandle<Vec<Value>> {
    let addr = hub.addr.clone();
    let token = hub.token.clone();
    let path = format!("/api/sessions/{sid}/events?after=0");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let mut s = TcpStream::connect(&addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
        )
        .expect("request");
        let mut r = BufReader::new(s);
        let mut out = Vec::new();
        let mut line = String::new();
        let end = Instant::now() + limit;
        let mut head_done = false;
        while Instant::now() < end {
            // A read timeout may come mid-line: what was read stays in `line`, and the
            // next read completes it (clearing it there lost a piece under load).
            match r.read_line(&mut line) {
                Ok(0) => break,
                Ok(_) if line.ends_with('\n') => {}
                Ok(_) | Err(_) => continue,
            }
            let line = std::mem::take(&mut line);
            if !head_done {
                if line == "\r\n" {
                    head_done = true;
                    let _ = ready_tx.send(());
                }
                continue;
            }
            if let Some(data) = line.trim_end().strip_prefix("data:")
                && let Ok(v) = serde_json::from_str::<Value>(data.trim())
            {
                let done = v["kind"] == "run-end";
                out.push(v);
                if done {
                    break;
                }
            }
        }
        out
    });
    ready_rx
        .recv_timeout(LIMIT)
        .expect("the event stream opened");
    handle
}

#[test]
fn emit_ends_a_run_with_a_valid_envelope_that_streams_as_it_forms() {
    let answer = r#"Here it is:
```json
{"response": "It converged.", "data": {"converged": true, "loss": 0.12}, "reasoning": "the loss is flat"}
```"#;
    let model = ScriptedModel::start(vec![
        Reply::text(answer).chunk_delay(Duration::from_millis(5)),
    ]);
    let (hub, _tmp) = hub(&model);
    let sid = new_session(&hub, typed("emit"));
    let seen = follow(&hub, &sid, LIMIT);
    say(&hub, &sid, json!({"text": "did run 7 converge?"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    assert_eq!(
        end["result"]["output"],
        json!({"response": "It converged.", "data": {"converged": true, "loss": 0.12}, "reasoning": "the loss is flat"})
    );
    assert_eq!(end["meta"]["strategy"], "emit");
    assert_eq!(end["meta"]["outputRetries"], 0);
    assert_eq!(end["meta"]["steps"], 1);

    // The schema rides the prompt; no respond tool, no grammar.
    let req = model.request(0).expect("a request");
    assert!(system_prompt(&req).contains("OUTPUT SCHEMA"), "{req}");
    assert!(system_prompt(&req).contains("loss"), "{req}");
    assert!(!tool_names(&req).contains(&"respond".to_string()));
    assert!(req.get("response_format").is_none(), "{req}");

    // The envelope streamed: its text piece by piece, then ever fuller partials.
    let seen = seen.join().expect("follower");
    let deltas: String = seen
        .iter()
        .filter(|e| e["kind"] == "output-delta")
        .map(|e| e["text"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        deltas, answer,
        "output-delta pieces add up to the completion"
    );
    let partials: Vec<&Value> = seen
        .iter()
        .filter(|e| e["kind"] == "output-partial")
        .map(|e| &e["partial"])
        .collect();
    assert!(partials.len() >= 2, "{partials:?}");
    assert_eq!(
        partials.last().copied(),
        Some(&end["result"]["output"]),
        "the last partial is the envelope"
    );
    // Live only: the stored log has none.
    let stored = hub.events(&sid, 0);
    assert_eq!(count(&stored, "output-delta"), 0);
    assert_eq!(count(&stored, "output-partial"), 0);
    // The result route gives the same.
    let (st, res) = hub.api(Method::Get, &format!("/api/sessions/{sid}/result"), None);
    assert_eq!(st, 200);
    assert_eq!(res["result"]["output"]["data"]["loss"], 0.12);
}

#[test]
fn respond_is_the_exit_and_counts_only_alone() {
    let good = r#"{"data": {"converged": false, "loss": 2.5}, "response": "Not yet."}"#;
    let model = ScriptedModel::start(vec![
        // respond beside another call: dropped; wait_check runs.
        Reply::tool_calls(&[("wait_check", "{}"), ("respond", good)]),
        Reply::tool_call("respond", good),
    ]);
    let (hub, _tmp) = hub(&model);
    // `auto` on a server the hub knows nothing of, with a small strict schema: respond.
    let sid = new_session(&hub, typed("auto"));
    let seen = follow(&hub, &sid, LIMIT);
    say(&hub, &sid, json!({"text": "did run 7 converge?"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    assert_eq!(end["result"]["output"]["data"]["loss"], 2.5);
    assert_eq!(end["result"]["output"]["response"], "Not yet.");
    assert_eq!(end["meta"]["strategy"], "respond");
    assert_eq!(end["meta"]["steps"], 2);

    let first = model.request(0).expect("request 1");
    assert!(
        tool_names(&first).contains(&"respond".to_string()),
        "{first}"
    );
    let respond = first["tools"]
        .as_array()
        .and_then(|t| t.iter().find(|x| x["function"]["name"] == "respond"))
        .cloned()
        .expect("the respond tool");
    // Small and strict-compatible: the schema is in the params, not the prompt.
    assert_eq!(
        respond["function"]["parameters"]["properties"]["data"]["properties"]["loss"]["type"],
        "number",
        "{respond}"
    );
    assert_eq!(respond["function"]["strict"], true, "{respond}");
    assert!(!system_prompt(&first).contains("OUTPUT SCHEMA"));
    assert!(first.get("response_format").is_none(), "{first}");
    assert!(first.get("tool_choice").is_none(), "{first}");
    // The respond calls' arguments streamed as the answer (the dropped one too: it came
    // before the turn was judged); the other call's did not.
    let seen = seen.join().expect("follower");
    let step_text = |step: u64| -> String {
        seen.iter()
            .filter(|e| e["kind"] == "output-delta" && e["step"] == step)
            .map(|e| e["text"].as_str().unwrap_or_default())
            .collect()
    };
    assert_eq!(step_text(1), good);
    assert_eq!(step_text(2), good);
    // The dropped call is not in the record: the second request's assistant message holds
    // only wait_check, answered.
    let second = model.request(1).expect("request 2");
    let msgs = second["messages"].as_array().expect("messages");
    let assistant = msgs
        .iter()
        .rev()
        .find(|m| m["role"] == "assistant")
        .expect("the first reply");
    let calls: Vec<&str> = assistant["tool_calls"]
        .as_array()
        .expect("calls")
        .iter()
        .filter_map(|c| c["function"]["name"].as_str())
        .collect();
    assert_eq!(calls, ["wait_check"]);
    assert_eq!(last_message(&second)["role"], "tool");
    let events = hub.events(&sid, 0);
    assert_eq!(count(&events, "tool-start"), 1, "respond is no tool call");
}

#[test]
fn native_sends_the_grammar_and_auto_takes_it_where_the_server_enforces_it() {
    let answer =
        r#"{"response": null, "data": {"converged": true, "loss": 0.2}, "reasoning": null}"#;
    let model = ScriptedModel::start(vec![Reply::text(answer), Reply::text(answer)]);
    // An endpoint that enforces a strict response_format beside tools.
    let (hub, _tmp) = hub_with(&model, json!({"llm": {"endpoint": "openai"}}));
    for (n, strategy) in ["auto", "native"].into_iter().enumerate() {
        let sid = new_session(&hub, typed(strategy));
        say(&hub, &sid, json!({"text": "report"}));
        let end = run_end(&hub, &sid, 1);
        assert_eq!(end["result"]["ok"], true, "{strategy}: {end}");
        assert_eq!(end["meta"]["strategy"], "native", "{strategy}");
        assert_eq!(
            end["result"]["output"],
            json!({"data": {"converged": true, "loss": 0.2}}),
            "the strict form's nulls are absent fields"
        );
        let req = model.request(n).expect("request");
        let rf = &req["response_format"];
        assert_eq!(rf["type"], "json_schema", "{req}");
        assert_eq!(rf["json_schema"]["strict"], true);
        assert_eq!(
            rf["json_schema"]["schema"]["properties"]["data"]["properties"]["loss"]["type"],
            "number"
        );
        assert!(!tool_names(&req).contains(&"respond".to_string()));
        assert!(
            !system_prompt(&req).contains("OUTPUT SCHEMA"),
            "the grammar carries it"
        );
    }
}

#[test]
fn force_tool_asks_for_a_tool_call_on_every_step() {
    let model = ScriptedModel::start(vec![Reply::tool_call(
        "respond",
        r#"{"data": {"converged": true, "loss": 1.5}}"#,
    )]);
    let (hub, _tmp) = hub(&model);
    let sid = new_session(
        &hub,
        json!({"output": {"schema": report_schema(), "forceTool": true}}),
    );
    say(&hub, &sid, json!({"text": "report"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    assert_eq!(end["meta"]["strategy"], "respond");
    let req = model.request(0).expect("request");
    assert_eq!(req["tool_choice"], "required", "{req}");
}

#[test]
fn an_invalid_envelope_is_corrected_in_the_same_run() {
    let model = ScriptedModel::start(vec![
        Reply::text(r#"{"data": {"converged": true, "loss": "low"}}"#),
        Reply::text(r#"{"data": {"converged": true, "loss": 0.3}}"#),
    ]);
    let (hub, _tmp) = hub(&model);
    let sid = new_session(&hub, typed("emit"));
    say(&hub, &sid, json!({"text": "report"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    assert_eq!(end["result"]["output"]["data"]["loss"], 0.3);
    assert_eq!(end["meta"]["outputRetries"], 1);
    assert_eq!(end["meta"]["steps"], 2);
    // The model read its answer and the validator's issue, where and why.
    let second = model.request(1).expect("request 2");
    let msgs = second["messages"].as_array().expect("messages");
    let n = msgs.len();
    assert_eq!(msgs[n - 2]["role"], "assistant");
    let correction = msgs[n - 1]["content"].as_str().unwrap_or_default();
    assert!(correction.contains("/data/loss"), "{correction}");
    assert!(
        correction.contains("does not match the output schema"),
        "{correction}"
    );
    let events = hub.events(&sid, 0);
    let retry = events
        .iter()
        .find(|e| e["kind"] == "retry")
        .expect("a retry event");
    assert_eq!(retry["cause"], "output");
    assert_eq!(retry["attempt"], 1);
    assert!(
        retry["issues"]
            .as_str()
            .unwrap_or_default()
            .contains("/data/loss"),
        "{retry}"
    );
}

#[test]
fn prose_is_corrected_without_counting_and_a_bare_payload_is_unwrapped() {
    let model = ScriptedModel::start(vec![
        Reply::text("Let me think about the loss curve."),
        Reply::text("Still thinking."),
        // The payload without its envelope: the strict schema tells it apart.
        Reply::text(r#"{"converged": true, "loss": 0.05}"#),
    ]);
    let (hub, _tmp) = hub(&model);
    let sid = new_session(
        &hub,
        json!({"output": {"schema": report_schema(), "strategy": "emit"}, "stop": {"outputRetries": 0}}),
    );
    say(&hub, &sid, json!({"text": "report"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    assert_eq!(
        end["result"]["output"],
        json!({"data": {"converged": true, "loss": 0.05}})
    );
    // Two prose turns went back, none counted (the bound is 0 retries).
    assert_eq!(end["meta"]["outputRetries"], 0);
    assert_eq!(end["meta"]["steps"], 3);
    let events = hub.events(&sid, 0);
    let causes: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "retry")
        .filter_map(|e| e["cause"].as_str())
        .collect();
    assert_eq!(causes, ["termination", "termination"]);
    let second = model.request(1).expect("request 2");
    let correction = last_message(&second);
    assert_eq!(correction["role"], "user");
    let text = correction["content"].as_str().unwrap_or_default();
    assert!(text.contains("without an answer"), "{text}");
    assert!(text.contains("If you are not done"), "{text}");
}

#[test]
fn retries_spent_end_the_run_output_invalid_with_the_last_output() {
    let bad = |loss: &str| {
        Reply::tool_call(
            "respond",
            &format!(r#"{{"data": {{"converged": true, "loss": "{loss}"}}}}"#),
        )
    };
    let model = ScriptedModel::start_with_default(
        vec![bad("a"), bad("b"), bad("c"), bad("d")],
        Reply::text("the next turn"),
    );
    let (hub, _tmp) = hub(&model);
    let sid = new_session(&hub, typed("respond"));
    say(&hub, &sid, json!({"text": "report"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], false, "{end}");
    assert_eq!(end["result"]["error"]["code"], "output_invalid", "{end}");
    assert!(
        end["result"]["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("/data/loss"),
        "{end}"
    );
    assert_eq!(
        end["result"]["output"]["data"]["loss"], "d",
        "the last output"
    );
    assert_eq!(end["meta"]["outputRetries"], 3);
    assert_eq!(end["meta"]["steps"], 4);
    // Every respond call was answered: the next turn's request is one a server takes.
    say(&hub, &sid, json!({"text": "again"}));
    run_end(&hub, &sid, 2);
    let next = model.request(4).expect("the next turn's request");
    let msgs = next["messages"].as_array().expect("messages");
    let calls = msgs
        .iter()
        .filter(|m| m["role"] == "assistant")
        .filter_map(|m| m["tool_calls"].as_array())
        .flatten()
        .count();
    let answers = msgs.iter().filter(|m| m["role"] == "tool").count();
    assert_eq!((calls, answers), (4, 4), "{next}");
}

#[test]
fn a_session_without_a_schema_answers_in_prose() {
    let model = ScriptedModel::start(vec![Reply::text("Hello there.")]);
    let (hub, _tmp) = hub(&model);
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "hi"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["output"], json!({"response": "Hello there."}));
    assert_eq!(end["meta"]["strategy"], "emit");
    let req = model.request(0).expect("request");
    assert!(!system_prompt(&req).contains("OUTPUT SCHEMA"));
    assert!(!tool_names(&req).contains(&"respond".to_string()));
}

#[test]
fn unusable_output_settings_are_refused() {
    let hub = Hub::start();
    for (body, word) in [
        (
            json!({"output": {"schema": {"type": "bogus"}}}),
            "output.schema",
        ),
        (json!({"output": {"schema": 5}}), "output.schema"),
        (
            json!({"output": {"schema": report_schema(), "strategy": "emit", "forceTool": true}}),
            "forceTool",
        ),
        (json!({"output": {"schema": {}, "strategy": "grammar"}}), ""),
        (json!({"output": {"strategy": "emit"}}), ""),
    ] {
        let (st, v) = hub.api(Method::Post, "/api/sessions", Some(&body));
        assert_eq!(st, 400, "{body} -> {v}");
        assert!(v.to_string().contains(word), "{body} -> {v}");
    }
}

#[test]
fn cortex_session_new_with_a_schema_and_result_print_the_data() {
    let model = ScriptedModel::start(vec![Reply::tool_call(
        "respond",
        r#"{"data": {"converged": true, "loss": 0.01}, "response": "Done."}"#,
    )]);
    let (hub, tmp) = hub_with(&model, json!({}));
    let schema = tmp.path().join("report.json");
    std::fs::write(&schema, report_schema().to_string()).expect("schema file");
    let at = format!("@{}", schema.display());
    let (code, out, err) = hub.cortex(&["session", "new", "--schema", &at]);
    assert_eq!(code, 0, "{err}");
    let sid = out.trim().to_string();
    let (code, _, err) = hub.cortex(&["session", "say", &sid, "report", "--follow"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = hub.cortex(&["session", "result", &sid]);
    assert_eq!(code, 0, "{err}");
    let data: Value = serde_json::from_str(&out).expect("stdout is the data");
    assert_eq!(data, json!({"converged": true, "loss": 0.01}));
    assert_eq!(err.trim(), "Done.");
    wait_until(LIMIT, "the request recorded", || model.request(0));
}
