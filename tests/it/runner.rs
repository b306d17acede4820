//! The hub's runner against a scripted OpenAI-compatible server over real HTTP: the whole
//! story (a message, `wait_create`, the turn ends, a curl signal wakes the session, the
//! model answers the wake), a remote pid wait on a real device agent, the inbox's rules
//! (a dedupe key, a message sent `now`), the bounds, the model server failing or hanging,
//! and the hub SIGKILLed mid-stream and mid-tool.

use std::process::Command;
use std::time::Duration;

use cortex_cli::http::Method;
use cortex_tests::scripted_model::{Reply, ScriptedModel};
use cortex_tests::{Hub, wait_until};
use serde_json::{Value, json};

pub(crate) const LIMIT: Duration = Duration::from_secs(30);

/// A hub that runs `model`, with `settings` written to its settings.json first.
pub(crate) fn hub_with(model: &ScriptedModel, settings: Value) -> (Hub, tempfile::TempDir) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    std::fs::write(home.join("settings.json"), settings.to_string()).expect("settings");
    let url = model.url();
    let mut hub = Hub::at(
        &home,
        &tmp.path().join("hub.log"),
        &[
            ("CORTEX_LLM_BASE_URL", url.as_str()),
            ("CORTEX_LLM_MODEL", "scripted"),
        ],
        &[],
    );
    hub.spawn();
    (hub, tmp)
}

pub(crate) fn hub(model: &ScriptedModel) -> (Hub, tempfile::TempDir) {
    hub_with(model, json!({}))
}

/// An agent session (`runs: true` unless `body` says): a model runs its turns.
pub(crate) fn new_session(hub: &Hub, mut body: Value) -> String {
    if body.get("runs").is_none() {
        body["runs"] = json!(true);
    }
    let (st, v) = hub.api(Method::Post, "/api/sessions", Some(&body));
    assert_eq!(st, 201, "{v}");
    v["id"].as_str().expect("id").to_string()
}

pub(crate) fn say(hub: &Hub, sid: &str, body: Value) -> Value {
    let (st, v) = hub.api(
        Method::Post,
        &format!("/api/sessions/{sid}/messages"),
        Some(&body),
    );
    assert!(st == 201 || st == 200, "{st} {v}");
    v
}

/// The n-th `run-end` (1-based) of the session.
pub(crate) fn run_end(hub: &Hub, sid: &str, n: usize) -> Value {
    let seen = std::cell::Cell::new(0usize);
    hub.wait_event(sid, LIMIT, |e| {
        if e["kind"] == "run-end" {
            seen.set(seen.get() + 1);
            seen.get() == n
        } else {
            false
        }
    })
}

pub(crate) fn kinds(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or_default().to_string())
        .collect()
}

pub(crate) fn count(events: &[Value], kind: &str) -> usize {
    events.iter().filter(|e| e["kind"] == kind).count()
}

/// The last message of a recorded model request.
pub(crate) fn last_message(req: &Value) -> Value {
    req["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap_or(Value::Null)
}

#[test]
fn a_session_arms_a_wait_sleeps_and_wakes_to_answer() {
    let args = r#"{"label":"train run 7","intent":"report the final loss"}"#;
    let model = ScriptedModel::start(vec![
        Reply::tool_call("wait_create", args).split_every(7),
        Reply::text("I armed a waitpoint; the job will report.").split_every(5),
        Reply::text("The run finished: loss 0.12.").without_usage(),
    ]);
    let (hub, _tmp) = hub(&model);
    let sid = new_session(&hub, json!({"title": "story", "instructions": "Be brief."}));
    let posted = say(
        &hub,
        &sid,
        json!({"text": "start run 7 and tell me when it ends"}),
    );
    assert_eq!(posted["runs"], true, "{posted}");

    // The turn: a tool call, its answer, a reply, the end.
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    assert_eq!(
        end["result"]["output"]["response"],
        "I armed a waitpoint; the job will report."
    );
    assert_eq!(end["meta"]["steps"], 2, "{end}");
    let events = hub.events(&sid, 0);
    let k = kinds(&events);
    for want in [
        "message",
        "input-taken",
        "run-start",
        "step-start",
        "tool-start",
        "waitpoint-armed",
        "tool-end",
        "model-delta",
        "run-end",
    ] {
        assert!(k.iter().any(|x| x == want), "no {want} in {k:?}");
    }
    let tool_end = events
        .iter()
        .find(|e| e["kind"] == "tool-end")
        .expect("tool-end");
    assert_eq!(tool_end["observation"]["name"], "wait_create");
    assert_eq!(tool_end["observation"]["ok"], true, "{tool_end}");
    let wp = tool_end["observation"]["result"]["id"]
        .as_str()
        .expect("the waitpoint's id")
        .to_string();

    // The model read the secret in the step after the call; the store never kept it.
    let reqs = model.requests();
    assert_eq!(reqs.len(), 2, "{reqs:#?}");
    let answer: Value = serde_json::from_str(
        last_message(&reqs[1])["content"]
            .as_str()
            .expect("the tool's answer"),
    )
    .expect("json");
    let secret = answer["secret"].as_str().expect("secret").to_string();
    assert!(secret.len() >= 16, "{answer}");
    let stored = serde_json::to_string(&hub.events(&sid, 0)).expect("json");
    assert!(!stored.contains(&secret), "a stored event holds the secret");
    // Every request starts with the same prefix bytes.
    assert_eq!(reqs[0]["messages"][0], reqs[1]["messages"][0]);
    assert!(
        reqs[0]["messages"][0]["content"]
            .as_str()
            .is_some_and(|s| s.starts_with("Be brief.")),
        "{}",
        reqs[0]["messages"][0]
    );

    // The job reports with curl; the session wakes and the model answers the wake.
    let body = json!({"id": wp, "secret": secret, "status": "ok", "message": "loss 0.12"});
    let out = Command::new("curl")
        .args(["-sS", "-XPOST", &hub.url("/webhook/signal")])
        .args([
            "-H",
            "content-type: application/json",
            "-d",
            &body.to_string(),
        ])
        .output()
        .expect("curl");
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("accepted"),
        "{out:?}"
    );
    let wake = hub.wait_wake(&sid, &wp, 1, LIMIT);
    let end2 = run_end(&hub, &sid, 2);
    assert_eq!(
        end2["result"]["output"]["response"],
        "The run finished: loss 0.12."
    );
    let reqs = model.requests();
    assert_eq!(reqs.len(), 3);
    let woke = last_message(&reqs[2]);
    assert_eq!(woke["role"], "user");
    assert_eq!(
        woke["content"], wake["text"],
        "the wake's text is the next user turn"
    );
    // The second run's prefix is the first's, byte for byte.
    assert_eq!(reqs[2]["messages"][0], reqs[0]["messages"][0]);

    let (st, result) = hub.api(Method::Get, &format!("/api/sessions/{sid}/result"), None);
    assert_eq!(st, 200, "{result}");
    assert_eq!(
        result["result"]["output"]["response"],
        "The run finished: loss 0.12."
    );
}

#[test]
fn ollama_and_split_shapes_are_understood() {
    let model = ScriptedModel::start(vec![
        Reply::ollama_tool_call("wait_check", "{}"),
        Reply::text("Nothing armed yet.")
            .split_every(1)
            .without_usage()
            .without_done(),
    ]);
    let (hub, _tmp) = hub(&model);
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "anything armed?"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    assert_eq!(end["result"]["output"]["response"], "Nothing armed yet.");
    let events = hub.events(&sid, 0);
    assert_eq!(count(&events, "tool-end"), 1, "{events:#?}");
    let obs = &events
        .iter()
        .find(|e| e["kind"] == "tool-end")
        .expect("tool-end")["observation"];
    assert_eq!(obs["name"], "wait_check");
    assert_eq!(obs["result"]["waitpoints"], json!([]), "{obs}");
}

#[test]
fn a_repeated_dedupe_key_is_taken_once() {
    let model = ScriptedModel::start_with_default(Vec::new(), Reply::text("noted"));
    let (hub, _tmp) = hub(&model);
    let sid = new_session(&hub, json!({}));
    let a = say(&hub, &sid, json!({"text": "once only", "dedupe_key": "k1"}));
    let b = say(&hub, &sid, json!({"text": "once only", "dedupe_key": "k1"}));
    assert_eq!(b["duplicate"], true, "{b}");
    assert_eq!(a["seq"], b["seq"]);
    run_end(&hub, &sid, 1);
    let events = hub.events(&sid, 0);
    assert_eq!(count(&events, "message"), 1, "{events:#?}");
    assert_eq!(count(&events, "run-start"), 1);
    let reqs = model.requests();
    let users = reqs[0]["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["content"] == "once only")
        .count();
    assert_eq!(users, 1, "{:#}", reqs[0]);
}

#[test]
fn a_message_sent_now_joins_the_running_turn() {
    let model = ScriptedModel::start(vec![
        Reply::tool_call("wait_check", "{}").head_delay(Duration::from_secs(2)),
        Reply::text("Seen both."),
    ]);
    let (hub, _tmp) = hub(&model);
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "first"}));
    model.wait_requests(1, LIMIT);
    say(&hub, &sid, json!({"text": "also this", "when": "now"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    let reqs = model.requests();
    assert_eq!(reqs.len(), 2, "{reqs:#?}");
    let msgs = reqs[1]["messages"].as_array().expect("messages");
    let roles: Vec<&str> = msgs
        .iter()
        .map(|m| m["role"].as_str().unwrap_or(""))
        .collect();
    let n = roles.len();
    assert_eq!(&roles[n - 3..], &["assistant", "tool", "user"], "{roles:?}");
    assert_eq!(msgs[n - 1]["content"], "also this");
    assert_eq!(
        count(&hub.events(&sid, 0), "run-start"),
        1,
        "one run took both"
    );
}

#[test]
fn a_message_for_the_next_turn_waits_for_it() {
    let model = ScriptedModel::start(vec![
        Reply::tool_call("wait_check", "{}").head_delay(Duration::from_secs(2)),
        Reply::text("first done"),
        Reply::text("second done"),
    ]);
    let (hub, _tmp) = hub(&model);
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "first"}));
    model.wait_requests(1, LIMIT);
    say(&hub, &sid, json!({"text": "second"}));
    run_end(&hub, &sid, 1);
    let end2 = run_end(&hub, &sid, 2);
    assert_eq!(end2["result"]["output"]["response"], "second done");
    let reqs = model.requests();
    assert_eq!(
        last_message(&reqs[1])["role"],
        "tool",
        "not joined: {:#}",
        reqs[1]
    );
    assert_eq!(last_message(&reqs[2])["content"], "second");
}

#[test]
fn step_count_ends_a_run_that_never_finishes() {
    let model = ScriptedModel::start_with_default(Vec::new(), Reply::tool_call("wait_check", "{}"));
    let (hub, _tmp) = hub(&model);
    let sid = new_session(&hub, json!({"stop": {"steps": 2}}));
    say(&hub, &sid, json!({"text": "loop forever"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], false, "{end}");
    assert_eq!(end["result"]["error"]["code"], "stopped");
    assert_eq!(end["result"]["error"]["stop"], "steps");
    assert_eq!(end["meta"]["steps"], 2);
    assert_eq!(model.requests().len(), 2);
    // The session is idle again: the next message runs a new turn.
    model.set_default(Reply::text("ok"));
    say(&hub, &sid, json!({"text": "now stop"}));
    assert_eq!(run_end(&hub, &sid, 2)["result"]["ok"], true);
}

#[test]
fn the_same_call_and_answer_three_times_ends_the_run() {
    let model = ScriptedModel::start_with_default(Vec::new(), Reply::tool_call("wait_check", "{}"));
    let (hub, _tmp) = hub(&model);
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "check"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["error"]["stop"], "repeated_calls", "{end}");
    assert_eq!(model.requests().len(), 3);
}

#[test]
fn a_model_server_error_is_retried() {
    let model = ScriptedModel::start(vec![
        Reply::status(500, r#"{"error":{"message":"overloaded"}}"#),
        Reply::text("hello after a retry"),
    ]);
    let (hub, _tmp) = hub_with(&model, json!({"llm": {"backoffMs": 10}}));
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "hi"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(
        end["result"]["output"]["response"], "hello after a retry",
        "{end}"
    );
    let events = hub.events(&sid, 0);
    let retry = events
        .iter()
        .find(|e| e["kind"] == "retry")
        .expect("a retry event");
    assert_eq!(retry["cause"], "provider");
    assert_eq!(retry["attempt"], 1);
    assert!(
        retry["issues"].as_str().is_some_and(|s| s.contains("500")),
        "{retry}"
    );
}

#[test]
fn a_hung_model_server_times_out_and_the_session_is_not_stuck() {
    let model = ScriptedModel::start(vec![Reply::hang(), Reply::text("back")]);
    let (hub, _tmp) = hub_with(
        &model,
        json!({"llm": {"firstByteTimeoutMs": 500, "idleTimeoutMs": 500, "maxRetries": 0}}),
    );
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "hello?"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], false, "{end}");
    assert_eq!(end["result"]["error"]["code"], "model_call_failed");
    say(&hub, &sid, json!({"text": "again"}));
    let end2 = run_end(&hub, &sid, 2);
    assert_eq!(end2["result"]["output"]["response"], "back", "{end2}");
}

#[test]
fn a_hub_killed_mid_stream_finishes_the_turn_after_a_restart() {
    let model = ScriptedModel::start_with_default(
        vec![
            Reply::text("a slow answer that never completes")
                .split_every(3)
                .chunk_delay(Duration::from_millis(300)),
        ],
        Reply::text("answered after the restart"),
    );
    let (mut hub, _tmp) = hub(&model);
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "take your time"}));
    // Mid-stream: the answer's first bytes went out, the rest is still coming.
    wait_until(LIMIT, "the answer's first bytes", || {
        (model.bytes_sent() > 0).then_some(())
    });
    hub.kill();
    hub.spawn();
    let end = run_end(&hub, &sid, 1);
    assert_eq!(
        end["result"]["output"]["response"], "answered after the restart",
        "{end}"
    );
    let events = hub.events(&sid, 0);
    assert_eq!(count(&events, "run-start"), 1, "{events:#?}");
    assert_eq!(count(&events, "run-end"), 1);
    assert_eq!(model.requests().len(), 2, "the cut call was made again");
}

#[test]
fn a_hub_killed_mid_tool_arms_one_waitpoint() {
    // A model that calls the tool until it sees its result: a step killed before it was
    // recorded is asked again and calls again, as a real model would.
    let model = ScriptedModel::start_with_default(
        vec![],
        Reply::from_fn(|req| {
            let answered = req["messages"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
            if answered {
                Reply::text("armed")
            } else {
                Reply::tool_call("wait_create", r#"{"label":"build","intent":"ship it"}"#)
            }
        }),
    );
    let (mut hub, _tmp) = hub(&model);
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "build and wait"}));
    // The reply is fully sent; the hub is recording the step (or has).
    model.wait_outcome(1, LIMIT);
    hub.kill();
    hub.spawn();
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    let (st, v) = hub.api(
        Method::Get,
        &format!("/api/sessions/{sid}/waitpoints"),
        None,
    );
    assert_eq!(st, 200, "{v}");
    let armed = v["waitpoints"].as_array().map_or(0, Vec::len);
    assert!(armed <= 1, "{v}");
    // Whether the step landed before the kill or was made again after it, one call
    // armed at most one waitpoint, and the turn armed exactly one.
    assert_eq!(armed, 1, "{v}");
}

#[test]
fn a_hub_without_a_model_records_but_runs_nothing() {
    let hub = Hub::start();
    let sid = new_session(&hub, json!({"instructions": "unused"}));
    let posted = say(&hub, &sid, json!({"text": "anyone?"}));
    assert_eq!(posted["runs"], false, "{posted}");
    std::thread::sleep(Duration::from_millis(300));
    let events = hub.events(&sid, 0);
    assert_eq!(kinds(&events), vec!["message".to_string()], "{events:#?}");
    let (st, _) = hub.api(Method::Get, &format!("/api/sessions/{sid}/result"), None);
    assert_eq!(st, 404);
}

#[test]
fn bad_session_configurations_are_refused() {
    let hub = Hub::start();
    for (body, status) in [
        (
            json!({"examples": [{"role": "system", "content": "x"}]}),
            400,
        ),
        (json!({"examples": [{"content": "no role"}]}), 400),
        (json!({"maxTokens": 0}), 400),
        (json!({"stop": {"steps": 0}}), 400),
        (json!({"stop": {"nope": 1}}), 400),
        (json!({"instructions": "x".repeat(64 * 1024 + 1)}), 413),
    ] {
        let (st, v) = hub.api(Method::Post, "/api/sessions", Some(&body));
        assert_eq!(st, status, "{body} -> {v}");
    }
}

#[test]
fn a_device_wait_pid_wakes_the_session_when_the_process_ends() {
    let mut sleep = Command::new("sleep")
        .arg("3600")
        .spawn()
        .expect("spawn sleep");
    let pid = sleep.id();
    let args = json!({"device": "gpu1", "pid": pid, "label": "trainer"}).to_string();
    let model = ScriptedModel::start(vec![
        Reply::tool_call("device_wait_pid", &args),
        Reply::text("Waiting for the trainer."),
        Reply::text("The trainer exited."),
    ]);
    let (hub, _tmp) = hub(&model);
    let token = hub.add_device("gpu1");
    let _agent = cortex_tests::agent::Agent::start(&hub, "gpu1", &token);
    hub.wait_online("gpu1");
    let sid = new_session(&hub, json!({}));
    say(
        &hub,
        &sid,
        json!({"text": "tell me when the trainer exits"}),
    );
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    let events = hub.events(&sid, 0);
    let obs = &events
        .iter()
        .find(|e| e["kind"] == "tool-end")
        .expect("tool-end")["observation"];
    assert_eq!(obs["ok"], true, "{obs}");
    let wp = obs["result"]["waitpoint"]["id"]
        .as_str()
        .expect("the waitpoint")
        .to_string();
    // Armed on the device before the process ends, then the process ends.
    wait_until(LIMIT, "the wait armed on the device", || {
        (hub.device_wait_state("gpu1", &wp).as_deref() == Some("armed")).then_some(())
    });
    sleep.kill().expect("kill");
    sleep.wait().expect("reap");
    let wake = hub.wait_wake(&sid, &wp, 1, LIMIT);
    let end2 = run_end(&hub, &sid, 2);
    assert_eq!(
        end2["result"]["output"]["response"], "The trainer exited.",
        "{end2}"
    );
    assert_eq!(last_message(&model.requests()[2])["content"], wake["text"]);
}

#[test]
fn sessions_beyond_the_concurrency_bound_wait_in_order() {
    let model = ScriptedModel::start_with_default(
        Vec::new(),
        Reply::text("done").head_delay(Duration::from_millis(800)),
    );
    let (hub, _tmp) = hub_with(&model, json!({"agent": {"concurrency": 1}}));
    let sids: Vec<String> = (0..3).map(|_| new_session(&hub, json!({}))).collect();
    for (i, sid) in sids.iter().enumerate() {
        say(&hub, sid, json!({"text": format!("session {i}")}));
    }
    // While the first call is answered slowly, no second one starts.
    model.wait_requests(1, LIMIT);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        model.requests().len(),
        1,
        "a second session ran beside the first"
    );
    for sid in &sids {
        run_end(&hub, sid, 1);
    }
    let order: Vec<Value> = model
        .requests()
        .iter()
        .map(|r| last_message(r)["content"].clone())
        .collect();
    assert_eq!(
        order,
        vec![json!("session 0"), json!("session 1"), json!("session 2")],
        "one at a time, in the order they became ready"
    );
}

#[test]
fn cortex_say_follow_streams_the_answer_and_exits_with_the_run() {
    let model = ScriptedModel::start(vec![
        Reply::tool_call("wait_check", "{}"),
        Reply::text("All quiet on the waitpoint front.")
            .split_every(4)
            .chunk_delay(Duration::from_millis(20)),
        Reply::status(400, r#"{"error":{"message":"bad request"}}"#),
    ]);
    let (hub, _tmp) = hub(&model);
    let (code, out, err) = hub.cortex(&["session", "new", "--instructions", "Be brief."]);
    assert_eq!(code, 0, "{err}");
    let sid = out.trim().to_string();
    let (code, out, err) = hub.cortex(&["session", "say", &sid, "anything armed?", "--follow"]);
    assert_eq!(code, 0, "stdout {out}\nstderr {err}");
    assert_eq!(
        out.matches("All quiet on the waitpoint front.").count(),
        1,
        "the answer once: {out}"
    );
    assert!(
        err.contains("wait_check"),
        "the tool call in one line: {err}"
    );
    let (code, out, _) = hub.cortex(&["session", "result", &sid]);
    assert_eq!(code, 0);
    assert!(out.contains("All quiet"), "{out}");
    // A run that fails: exit 1, the error on stderr.
    let (code, _, err) = hub.cortex(&["session", "say", &sid, "again", "--follow"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("model_call_failed"), "{err}");
}

#[test]
fn an_answer_cut_at_max_tokens_is_marked_in_run_end_and_say_follow() {
    let model = ScriptedModel::start(vec![
        Reply::cut_at_max_tokens("The three reasons are: first, the"),
        Reply::text("Short and whole."),
    ]);
    let (hub, _tmp) = hub(&model);
    let (code, out, err) = hub.cortex(&["session", "new", "--max-tokens", "8"]);
    assert_eq!(code, 0, "{err}");
    let sid = out.trim().to_string();
    let (code, out, err) =
        hub.cortex(&["session", "say", &sid, "give me three reasons", "--follow"]);
    assert_eq!(code, 0, "stdout {out}\nstderr {err}");
    assert!(out.contains("first, the"), "{out}");
    assert!(err.contains("(answer cut at maxTokens"), "{err}");
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    assert_eq!(end["meta"]["finishReason"], "length", "{end}");
    assert_eq!(model.request(0).expect("request")["max_tokens"], 8);
    // A whole answer is not marked.
    let (code, _, err) = hub.cortex(&["session", "say", &sid, "and briefly?", "--follow"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("answer cut"), "{err}");
    assert_eq!(run_end(&hub, &sid, 2)["meta"]["finishReason"], "stop");
}
