//! The waitpoint rules for watching jobs, through the real hub: `silence_after` (a
//! `silent` wake once per quiet spell), `coalesce` (a burst of reports as one wake) and
//! `spawn` (each wake a new session that runs one turn on the scripted model, one session
//! per wake across a SIGKILL of the hub).

use cortex_cli::http::Method;
use cortex_tests::scripted_model::{Reply, ScriptedModel};
use cortex_tests::{Hub, body, wait_until};
use serde_json::{Value, json};

use crate::runner::{LIMIT, count, hub, new_session, run_end};

#[test]
fn silence_after_wakes_once_per_quiet_spell_and_stays_armed() {
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "train", "intent": "look at the run", "silence_after": "1s"}),
    );
    assert_eq!(wp["silence_after_ms"], 1_000, "{wp}");
    let id = wp["id"].as_str().expect("id");

    // Nothing since creation.
    let first = hub.wait_wake(&sid, id, 1, LIMIT);
    assert_eq!(first["reason"], "silent", "{first}");
    assert_eq!(first["signals"], json!([]), "{first}");
    let text = first["text"].as_str().expect("text");
    assert!(text.contains("has been silent for"), "{text}");
    assert!(
        text.contains("Nothing has reported since it was armed"),
        "{text}"
    );
    assert!(text.contains("It stays armed"), "{text}");
    let view = hub.get_waitpoint(id);
    assert_eq!(view["state"], "armed", "{view}");
    assert!(
        view.get("silence_due_at").is_none(),
        "once per spell: nothing due until a signal: {view}"
    );

    // A heartbeat starts the next spell; its silent wake names it.
    let (st, v) = hub.signal(&body(
        &wp,
        json!({"status": "progress", "message": "step 120", "key": "hb1"}),
    ));
    assert_eq!(st, 202, "{v}");
    assert!(hub.get_waitpoint(id)["silence_due_at"].is_u64());
    let second = hub.wait_wake(&sid, id, 2, LIMIT);
    assert_eq!(second["reason"], "silent", "{second}");
    let text = second["text"].as_str().expect("text");
    assert!(
        text.contains("The last signal was progress via http"),
        "{text}"
    );
    assert!(text.contains(r#"with the message "step 120""#), "{text}");

    // Neither counted: the report still fires the one-shot waitpoint, carrying the
    // heartbeat.
    let (st, v) = hub.signal(&body(&wp, json!({"status": "ok", "message": "done"})));
    assert_eq!(st, 202, "{v}");
    let fired = hub.wait_wake(&sid, id, 3, LIMIT);
    assert_eq!(fired["reason"], "fired", "{fired}");
    assert_eq!(
        fired["signals"].as_array().map(Vec::len),
        Some(2),
        "{fired}"
    );
    let view = hub.get_waitpoint(id);
    assert_eq!(view["state"], "resolved", "{view}");
    let reasons: Vec<&str> = view["wakes"]
        .as_array()
        .expect("wakes")
        .iter()
        .filter_map(|w| w["reason"].as_str())
        .collect();
    assert_eq!(reasons, ["silent", "silent", "fired"]);
}

#[test]
fn the_rules_are_refused_where_they_do_not_fit() {
    let hub = Hub::start();
    let sid = hub.session();
    for (extra, says) in [
        (
            json!({"silence_after": 0.5}),
            "silence_after must be between 1s",
        ),
        (
            json!({"silence_after": "2h", "expires_in_hours": 1}),
            "lifetime (1h)",
        ),
        (json!({"silence_after": "soon"}), "silence_after"),
        (json!({"coalesce": "10s"}), "coalesce is for monitors only"),
        (
            json!({"spawn": {"instructions": "triage"}}),
            "spawn is for monitors only",
        ),
        (
            json!({"max_signals": 3, "spawn": {"instructions": " "}}),
            "spawn.instructions is empty",
        ),
    ] {
        let mut b = json!({"label": "l", "intent": "i"});
        for (k, v) in extra.as_object().expect("object") {
            b[k] = v.clone();
        }
        let (st, v) = hub.api(
            Method::Post,
            &format!("/api/sessions/{sid}/waitpoints"),
            Some(&b),
        );
        assert_eq!(st, 400, "{b} -> {v}");
        let message = v["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{b}: {message}");
    }
    // Through the CLI: its flags make the same body.
    let (code, out, err) = hub.cortex(&[
        "wait",
        "create",
        "--session",
        &sid,
        "--label",
        "evals",
        "--intent",
        "each eval",
        "--max-signals",
        "5",
        "--silence-after",
        "20m",
        "--coalesce",
        "30s",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("silent after: 20m"), "{out}");
    assert!(out.contains("coalesce: reports within 30s"), "{out}");
}

#[test]
fn a_burst_of_ten_reports_within_the_window_is_one_wake() {
    let hub = Hub::start();
    let sid = hub.session();
    // The window is far longer than ten POSTs take on loopback, so all ten fall in it.
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "evals", "intent": "read each eval", "max_signals": 5, "coalesce": "8s"}),
    );
    assert_eq!(wp["coalesce_ms"], 8_000, "{wp}");
    let id = wp["id"].as_str().expect("id");
    for i in 0..10 {
        let (st, v) = hub.signal(&body(
            &wp,
            json!({"status": "ok", "message": format!("eval {i}"), "key": format!("e{i}")}),
        ));
        assert_eq!(st, 202, "{v}");
    }
    let wake = hub.wait_wake(&sid, id, 1, LIMIT);
    assert_eq!(wake["reason"], "report", "{wake}");
    let messages: Vec<&str> = wake["signals"]
        .as_array()
        .expect("signals")
        .iter()
        .filter_map(|s| s["message"].as_str())
        .collect();
    let want: Vec<String> = (0..10).map(|i| format!("eval {i}")).collect();
    assert_eq!(messages, want, "{wake}");
    let text = wake["text"].as_str().expect("text");
    assert!(text.contains("(wake 1 of at most 5"), "{text}");
    assert!(
        text.contains("10 reports came within its 8s coalesce window"),
        "{text}"
    );
    let view = hub.get_waitpoint(id);
    assert_eq!(
        view["state"], "armed",
        "one wake toward max_signals: {view}"
    );
    assert_eq!(view["badges"]["wakes_this_hour"], 1, "{view}");
    assert_eq!(view["wakes"].as_array().map(Vec::len), Some(1), "{view}");
    assert_eq!(hub.wakes(&sid).len(), 1);
}

/// The spawned sessions of waitpoint `wp`, in wake order.
fn spawned(hub: &Hub, wp: &str) -> Vec<Value> {
    let (st, v) = hub.api(Method::Get, "/api/sessions", None);
    assert_eq!(st, 200, "{v}");
    let mut out: Vec<Value> = v
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s["spawned_from"]["waitpoint"] == wp)
        .collect();
    out.sort_by_key(|s| s["spawned_from"]["wake"].as_u64());
    out
}

#[test]
fn a_spawning_monitor_starts_one_session_per_wake_across_a_sigkill() {
    let model = ScriptedModel::start_with_default(vec![], Reply::text("triaged"));
    let (mut hub, _tmp) = hub(&model);
    let parent = new_session(
        &hub,
        json!({"title": "watcher", "instructions": "You watch evals.", "maxTokens": 321}),
    );
    let wp = hub.waitpoint(
        &parent,
        json!({"label": "evals", "intent": "triage each failing eval", "max_signals": 3,
            "spawn": {"instructions": "You triage one eval report.", "title": "triage"}}),
    );
    assert_eq!(wp["spawn"], true, "{wp}");
    let id = wp["id"].as_str().expect("id").to_string();

    // The first report: its session is durable with the 202; the hub dies at once.
    let (st, v) = hub.signal(&body(
        &wp,
        json!({"status": "fail", "message": "eval 1 regressed", "key": "r1"}),
    ));
    assert_eq!(st, 202, "{v}");
    let first = wait_until(LIMIT, "the first spawned session", || {
        spawned(&hub, &id).into_iter().next()
    });
    hub.kill();
    hub.spawn();
    let s1 = first["id"].as_str().expect("id").to_string();
    assert_eq!(
        first["spawned_from"],
        json!({"waitpoint": id, "session": parent, "wake": 1})
    );
    assert_eq!(first["title"], "triage #1");
    let end = run_end(&hub, &s1, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");

    // The same report again is a duplicate: no session for it.
    let (st, v) = hub.signal(&body(
        &wp,
        json!({"status": "fail", "message": "eval 1 regressed", "key": "r1"}),
    ));
    assert_eq!((st, v["result"].as_str()), (202, Some("duplicate")), "{v}");
    let (st, v) = hub.signal(&body(
        &wp,
        json!({"status": "ok", "message": "eval 2 fine", "key": "r2"}),
    ));
    assert_eq!(st, 202, "{v}");
    let second = wait_until(LIMIT, "the second spawned session", || {
        spawned(&hub, &id).into_iter().nth(1)
    });
    let s2 = second["id"].as_str().expect("id").to_string();
    let end = run_end(&hub, &s2, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");

    // One session per wake, each with exactly one run, its first input the wake.
    let all = spawned(&hub, &id);
    assert_eq!(all.len(), 2, "{all:#?}");
    for (sid, report) in [(&s1, "eval 1 regressed"), (&s2, "eval 2 fine")] {
        let events = hub.events(sid, 0);
        assert_eq!(count(&events, "run-start"), 1, "{sid}: {events:#?}");
        assert_eq!(count(&events, "run-end"), 1, "{sid}: {events:#?}");
        let wake = events
            .iter()
            .find(|e| e["kind"] == "wake")
            .expect("the wake is the new session's first input");
        assert_eq!(wake["waitpoint"]["id"], id.as_str());
        assert!(
            wake["text"].as_str().unwrap_or_default().contains(report),
            "{wake}"
        );
    }
    // The parent is not woken; its waitpoint lists the sessions per wake.
    assert!(hub.wakes(&parent).is_empty());
    let view = hub.get_waitpoint(&id);
    let listed: Vec<&str> = view["wakes"]
        .as_array()
        .expect("wakes")
        .iter()
        .filter_map(|w| w["spawned"].as_str())
        .collect();
    assert_eq!(listed, [s1.as_str(), s2.as_str()], "{view}");
    let (st, one) = hub.api(Method::Get, &format!("/api/sessions/{s2}"), None);
    assert_eq!(st, 200, "{one}");
    assert_eq!(one["spawned_from"]["wake"], 2, "{one}");

    // The model saw the spawn's instructions and the parent's other settings, and the
    // wake's text as the first user message.
    let requests = model.requests();
    let system_of = |r: &Value| r["messages"][0]["content"].as_str().map(str::to_string);
    let spawned_requests: Vec<&Value> = requests
        .iter()
        .filter(|r| system_of(r).is_some_and(|s| s.starts_with("You triage one eval report.")))
        .collect();
    assert_eq!(spawned_requests.len(), 2, "one model call per run");
    for r in spawned_requests {
        assert_eq!(r["max_tokens"], 321, "the parent's maxTokens: {r}");
        let user = &r["messages"][1];
        assert_eq!(user["role"], "user", "{r}");
        assert!(
            user["content"]
                .as_str()
                .unwrap_or_default()
                .contains(&format!("Monitor {id}")),
            "{user}"
        );
    }
}

#[test]
fn a_model_arms_a_spawning_monitor_with_wait_create() {
    let args = json!({"label": "evals", "intent": "triage each eval", "max_signals": 2,
        "silence_after": "1h", "coalesce": 1,
        "spawn": {"instructions": "You triage one eval report."}})
    .to_string();
    let model = ScriptedModel::start_with_default(
        vec![
            Reply::tool_call("wait_create", &args),
            Reply::text("Armed."),
        ],
        Reply::text("triaged"),
    );
    let (hub, _tmp) = hub(&model);
    let parent = new_session(&hub, json!({"title": "watcher"}));
    crate::runner::say(&hub, &parent, json!({"text": "watch the evals"}));
    run_end(&hub, &parent, 1);
    let requests = model.requests();
    let answer: Value = serde_json::from_str(
        crate::runner::last_message(&requests[1])["content"]
            .as_str()
            .expect("the tool's answer"),
    )
    .expect("json");
    assert_eq!(answer["spawn"], true, "{answer}");
    assert_eq!(answer["silence_after_ms"], 3_600_000, "{answer}");
    assert_eq!(answer["coalesce_ms"], 1_000, "{answer}");
    let id = answer["id"].as_str().expect("id").to_string();
    let (st, v) = hub.signal(&json!({"id": id, "secret": answer["secret"], "message": "eval 1"}));
    assert_eq!(st, 202, "{v}");
    let child = wait_until(LIMIT, "the spawned session", || {
        spawned(&hub, &id).into_iter().next()
    });
    assert_eq!(child["title"], "evals #1");
    let sid = child["id"].as_str().expect("id");
    let end = run_end(&hub, sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    let last = model.requests().pop().expect("a request");
    assert!(
        last["messages"][0]["content"]
            .as_str()
            .is_some_and(|s| s.starts_with("You triage one eval report.")),
        "{last}"
    );
    let view = hub.get_waitpoint(&id);
    assert_eq!(view["coalesce_ms"], 1_000, "{view}");
    assert!(hub.wakes(&parent).is_empty(), "the parent is not woken");
}
