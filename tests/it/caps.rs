//! The caps of settings.json `limits` against a model that never stops asking (the
//! scripted server's default reply, the same tool calls forever): tool calls per reply,
//! armed waitpoints per session, spawn depth and spawns per root per hour, a timer's
//! shortest delay, and runs per session per hour from wakes and timers. Each refusal
//! reaches the model as a tool error naming its limit (or the log as a `limit-reached`
//! event), and what was held back is kept. Small limits keep each test short.

use std::time::Duration;

use cortex_cli::http::Method;
use cortex_tests::scripted_model::{Reply, ScriptedModel};
use cortex_tests::{Hub, body, wait_until};
use serde_json::{Value, json};

use crate::runner::{LIMIT, count, hub_with, new_session, run_end, say};

/// Every session, as `GET /api/sessions` lists them.
fn sessions(hub: &Hub) -> Vec<Value> {
    let (st, v) = hub.api(Method::Get, "/api/sessions", None);
    assert_eq!(st, 200, "{v}");
    v.as_array().cloned().unwrap_or_default()
}

fn session(hub: &Hub, sid: &str) -> Value {
    let (st, v) = hub.api(Method::Get, &format!("/api/sessions/{sid}"), None);
    assert_eq!(st, 200, "{v}");
    v
}

/// The session's whole log, page by page.
fn all_events(hub: &Hub, sid: &str) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    loop {
        let after = out.last().and_then(|e| e["seq"].as_u64()).unwrap_or(0);
        let page = hub.events(sid, after);
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

/// The session's `tool-end` observations, in order.
fn tool_ends(hub: &Hub, sid: &str) -> Vec<Value> {
    all_events(hub, sid)
        .into_iter()
        .filter(|e| e["kind"] == "tool-end")
        .map(|e| e["observation"].clone())
        .collect()
}

fn error_of(observation: &Value) -> String {
    observation["result"]["error"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The `limit-reached` events of every session, with the session's id.
fn limit_events(hub: &Hub) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for s in sessions(hub) {
        let sid = s["id"].as_str().unwrap_or_default().to_string();
        for e in hub.events(&sid, 0) {
            if e["kind"] == "limit-reached" {
                out.push((sid.clone(), e));
            }
        }
    }
    out
}

#[test]
fn one_reply_of_ten_thousand_wait_creates_arms_the_cap_and_answers_the_rest() {
    let call = json!({"label": "job", "intent": "report"}).to_string();
    let calls: Vec<(&str, &str)> = (0..10_000)
        .map(|_| ("wait_create", call.as_str()))
        .collect();
    let model =
        ScriptedModel::start_with_default(vec![Reply::tool_calls(&calls)], Reply::text("done"));
    let (hub, _tmp) = hub_with(
        &model,
        json!({"limits": {"armedWaitpointsPerSession": 1000}}),
    );
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "arm everything"}));
    // A debug build streams and records ten thousand calls in about half a minute.
    hub.wait_event(&sid, Duration::from_secs(180), |e| e["kind"] == "run-end");

    // The default cap, 32: as many armed, every other call answered with the reason.
    assert_eq!(session(&hub, &sid)["armed_waitpoints"], 32);
    let ends = tool_ends(&hub, &sid);
    assert_eq!(ends.len(), 10_000, "every call is answered");
    assert!(ends[..32].iter().all(|o| o["ok"] == true));
    for o in &ends[32..] {
        assert_eq!(o["ok"], false, "{o}");
        let e = error_of(o);
        assert!(
            e.contains("made 10000 tool calls") && e.contains("toolCallsPerReply = 32"),
            "{e}"
        );
    }
}

#[test]
fn a_session_holds_at_most_the_cap_armed_and_arms_again_once_one_resolves() {
    let wait = |label: &str| json!({"label": label, "intent": "go on"}).to_string();
    let (a, b, c, d) = (wait("a"), wait("b"), wait("c"), wait("d"));
    let model = ScriptedModel::start_with_default(
        vec![
            Reply::tool_calls(&[
                ("wait_create", &a),
                ("wait_create", &b),
                ("wait_create", &c),
            ]),
            Reply::text("armed two"),
            Reply::tool_call("wait_create", &d),
            Reply::text("armed again"),
        ],
        Reply::text("ok"),
    );
    let (hub, _tmp) = hub_with(&model, json!({"limits": {"armedWaitpointsPerSession": 2}}));
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "arm three"}));
    run_end(&hub, &sid, 1);
    assert_eq!(session(&hub, &sid)["armed_waitpoints"], 2);
    let ends = tool_ends(&hub, &sid);
    assert_eq!(ends.len(), 3);
    let refused = error_of(&ends[2]);
    assert!(
        refused.contains("holds 2 armed waitpoints")
            && refused.contains("armedWaitpointsPerSession = 2")
            && refused.contains("wait_cancel"),
        "{refused}"
    );

    // One resolves: its wake's run arms one again.
    let created: Value = serde_json::from_str(
        model.requests()[1]["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .find(|m| m["role"] == "tool")
            .and_then(|m| m["content"].as_str())
            .expect("the first answer"),
    )
    .expect("json");
    let (st, v) = hub.signal(&body(&created, json!({"message": "done"})));
    assert_eq!(st, 202, "{v}");
    run_end(&hub, &sid, 2);
    let ends = tool_ends(&hub, &sid);
    assert_eq!(ends.len(), 4);
    assert_eq!(ends[3]["ok"], true, "{}", ends[3]);
    assert_eq!(session(&hub, &sid)["armed_waitpoints"], 2);
}

#[test]
fn a_device_exec_to_be_waited_on_is_refused_before_it_starts_at_the_armed_cap() {
    let wait = json!({"label": "a", "intent": "go on"}).to_string();
    let exec = json!({"device": "gpu1", "argv": ["true"], "wait": true}).to_string();
    let model = ScriptedModel::start_with_default(
        vec![Reply::tool_calls(&[
            ("wait_create", &wait),
            ("device_exec", &exec),
        ])],
        Reply::text("ok"),
    );
    let (hub, _tmp) = hub_with(&model, json!({"limits": {"armedWaitpointsPerSession": 1}}));
    let sid = new_session(&hub, json!({"policy": {"requireApproval": []}}));
    say(&hub, &sid, json!({"text": "run it and wait"}));
    run_end(&hub, &sid, 1);
    let ends = tool_ends(&hub, &sid);
    assert_eq!(ends.len(), 2);
    let e = error_of(&ends[1]);
    // Refused before the device is asked (there is none: it would have said so).
    assert!(e.contains("armedWaitpointsPerSession = 1"), "{e}");
    assert_eq!(session(&hub, &sid)["armed_waitpoints"], 1);
}

/// Three `wait_create` with `spawn` whose monitors wake on a second of silence, and
/// every spawned session's model asking for the same again.
fn spawn_loop(limits: Value) -> (ScriptedModel, Hub, tempfile::TempDir, String) {
    let arm = json!({"label": "loop", "intent": "spawn again", "max_signals": 2,
        "silence_after": 1, "spawn": {"instructions": "Arm three more."}})
    .to_string();
    let model = ScriptedModel::start_with_default(
        vec![],
        Reply::tool_calls(&[
            ("wait_create", &arm),
            ("wait_create", &arm),
            ("wait_create", &arm),
        ]),
    );
    let (hub, tmp) = hub_with(&model, json!({"limits": limits}));
    let root = new_session(&hub, json!({"stop": {"steps": 1}}));
    say(&hub, &root, json!({"text": "go"}));
    (model, hub, tmp, root)
}

#[test]
fn a_spawn_loop_stops_at_the_roots_spawns_per_hour() {
    let (model, hub, _tmp, _root) = spawn_loop(json!({"spawnsPerHour": 5, "spawnDepth": 10}));
    // The sixth spawn is refused when its wake comes, in its monitor's session's log.
    let (parent, refused) = wait_until(LIMIT, "a spawn refused", || {
        limit_events(&hub).into_iter().next()
    });
    assert_eq!(refused["limit"], "spawnsPerHour", "{refused}");
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("no session spawned for this wake")
            && message.contains("spawned 5 sessions")
            && message.contains("spawnsPerHour = 5"),
        "{message}"
    );
    let wp = refused["waitpoint"]["id"].as_str().expect("the monitor");
    let view = hub.get_waitpoint(wp);
    assert_eq!(view["session"], parent.as_str(), "{view}");
    let wakes = view["wakes"].as_array().expect("wakes");
    assert!(
        wakes
            .iter()
            .any(|w| w["delivered"] == true && w["spawned"].is_null()),
        "the wake is recorded as delivered, with no session: {view}"
    );
    // The root and the five it and its sessions spawned; and no more for the hour.
    assert_eq!(sessions(&hub).len(), 6, "{:#?}", sessions(&hub));
    wait_until(LIMIT, "every session idle", || {
        sessions(&hub)
            .iter()
            .all(|s| s["state"] != "running")
            .then_some(())
    });
    assert_eq!(sessions(&hub).len(), 6);
    let spawned: Vec<Value> = sessions(&hub)
        .into_iter()
        .filter(|s| !s["spawned_from"].is_null())
        .collect();
    assert_eq!(spawned.len(), 5);
    // One model call per session (each run is one step): the root's and the five's.
    assert_eq!(model.request_count(), 6);
}

#[test]
fn a_spawn_loop_stops_at_the_spawn_depth() {
    let (model, hub, _tmp, root) = spawn_loop(json!({"spawnsPerHour": 60, "spawnDepth": 1}));
    // The root's three monitors spawn three sessions, each 1 deep; their own spawns
    // would be 2 deep and are refused when they arm them.
    let children = wait_until(LIMIT, "three spawned sessions", || {
        let c: Vec<Value> = sessions(&hub)
            .into_iter()
            .filter(|s| s["spawned_from"]["session"] == root.as_str())
            .collect();
        (c.len() == 3).then_some(c)
    });
    for c in &children {
        let sid = c["id"].as_str().expect("id");
        run_end(&hub, sid, 1);
        let ends = tool_ends(&hub, sid);
        assert_eq!(ends.len(), 3, "{ends:#?}");
        for o in &ends {
            let e = error_of(o);
            assert!(
                e.starts_with("not armed") && e.contains("2 deep") && e.contains("spawnDepth = 1"),
                "{e}"
            );
        }
        assert_eq!(session(&hub, sid)["armed_waitpoints"], 0);
    }
    assert_eq!(sessions(&hub).len(), 4);
    // One model call for the root, one per child.
    assert_eq!(model.request_count(), 4);
}

#[test]
fn a_timer_sooner_than_the_shortest_delay_is_refused_and_a_legal_one_fires() {
    let model = ScriptedModel::start_with_default(
        vec![
            Reply::tool_call("schedule_wakeup", r#"{"name": "t", "in_s": 0}"#),
            Reply::tool_call("schedule_wakeup", r#"{"name": "t", "in_s": 1}"#),
            Reply::text("set"),
        ],
        Reply::text("woke"),
    );
    let (hub, _tmp) = hub_with(&model, json!({"limits": {"timerMinDelayMs": 1000}}));
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "wake me"}));
    run_end(&hub, &sid, 1);
    let ends = tool_ends(&hub, &sid);
    assert_eq!(ends.len(), 2);
    let e = error_of(&ends[0]);
    assert!(
        e.contains("in 0 s") && e.contains("timerMinDelayMs = 1000") && e.contains("at least 1"),
        "{e}"
    );
    assert_eq!(ends[1]["ok"], true, "{}", ends[1]);
    // The legal one fires once and starts one run.
    run_end(&hub, &sid, 2);
    assert_eq!(count(&hub.events(&sid, 0), "timer"), 1);
}

#[test]
fn schedule_wakeup_in_zero_in_a_loop_never_fires() {
    let model = ScriptedModel::start_with_default(
        vec![],
        Reply::tool_call("schedule_wakeup", r#"{"name": "again", "in_s": 0}"#),
    );
    let (hub, _tmp) = hub_with(&model, json!({}));
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "loop"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["error"]["stop"], "repeated_calls", "{end}");
    let ends = tool_ends(&hub, &sid);
    assert!(
        ends.iter()
            .all(|o| error_of(o).contains("timerMinDelayMs = 5000"))
    );
    let events = hub.events(&sid, 0);
    assert_eq!(count(&events, "timer"), 0);
    assert_eq!(count(&events, "run-start"), 1);
    assert_eq!(model.request_count(), 3);
}

/// Arms a waitpoint on `sid` through the API and signals it: one wake.
fn wake(hub: &Hub, sid: &str, label: &str) -> u64 {
    let wp = hub.waitpoint(sid, json!({"label": label, "intent": "go on"}));
    let (st, v) = hub.signal(&body(&wp, json!({"message": label})));
    assert_eq!(st, 202, "{v}");
    let id = wp["id"].as_str().expect("id").to_string();
    hub.wait_wake(sid, &id, 1, LIMIT)["seq"]
        .as_u64()
        .expect("seq")
}

/// The `run-start` whose input holds seq `seq`.
fn run_start_with(hub: &Hub, sid: &str, seq: u64) -> Value {
    hub.wait_event(sid, LIMIT, |e| {
        e["kind"] == "run-start"
            && e["input"]
                .as_array()
                .is_some_and(|i| i.iter().any(|x| x["seq"] == seq))
    })
}

#[test]
fn wakes_past_the_runs_per_hour_wait_and_run_when_the_window_allows() {
    let model = ScriptedModel::start_with_default(vec![], Reply::text("ok"));
    // A short window (the hourly caps' hour), so the deferred run comes within the test.
    let (hub, _tmp) = hub_with(
        &model,
        json!({"waitpointWakeWindowMs": 10_000, "limits": {"runsPerHour": 2}}),
    );
    let sid = new_session(&hub, json!({}));
    wake(&hub, &sid, "one");
    run_end(&hub, &sid, 1);
    wake(&hub, &sid, "two");
    run_end(&hub, &sid, 2);
    let third = wake(&hub, &sid, "three");
    let deferred = hub.wait_event(&sid, LIMIT, |e| e["kind"] == "limit-reached");
    assert_eq!(deferred["limit"], "runsPerHour", "{deferred}");
    let message = deferred["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("started 2 runs") && message.contains("runsPerHour = 2"),
        "{message}"
    );
    let until = deferred["until"].as_u64().expect("until");
    // The run starts once the window allows, with the wake that waited as its input.
    let start = run_start_with(&hub, &sid, third);
    assert!(
        start["ts"].as_u64().expect("ts") >= until,
        "{start} {deferred}"
    );
    run_end(&hub, &sid, 3);
    let events = hub.events(&sid, 0);
    assert_eq!(count(&events, "limit-reached"), 1, "one event per wait");
    assert_eq!(count(&events, "run-start"), 3);
    assert_eq!(model.request_count(), 3);
}

#[test]
fn a_persons_message_is_not_held_by_the_runs_per_hour() {
    let model = ScriptedModel::start_with_default(vec![], Reply::text("ok"));
    let (hub, _tmp) = hub_with(&model, json!({"limits": {"runsPerHour": 1}}));
    let sid = new_session(&hub, json!({}));
    wake(&hub, &sid, "one");
    run_end(&hub, &sid, 1);
    let second = wake(&hub, &sid, "two");
    let deferred = hub.wait_event(&sid, LIMIT, |e| e["kind"] == "limit-reached");
    assert!(deferred["until"].as_u64().is_some(), "{deferred}");
    assert_eq!(count(&hub.events(&sid, 0), "run-start"), 1);
    // A message runs at once, and takes the wake that waited with it.
    let posted = say(&hub, &sid, json!({"text": "go on"}));
    let start = run_start_with(&hub, &sid, second);
    let input: Vec<u64> = start["input"]
        .as_array()
        .expect("input")
        .iter()
        .filter_map(|i| i["seq"].as_u64())
        .collect();
    assert_eq!(
        input,
        [second, posted["seq"].as_u64().expect("seq")],
        "{start}"
    );
    run_end(&hub, &sid, 2);
}
