//! What a session is and what it shows, with the real hub: a mailbox (a session made
//! without agent settings, as scripts and remote waits make them) records its messages
//! and wakes and never runs a turn, also once the hub gains a model; the guides and hints
//! a model reads name only the tools it is shown, and `--allow ''` shows it none;
//! `cortex sessions` lists the newest first with each one's state; `cortex waits` lists
//! the armed waitpoints of every session; `session say` says when no turn will run;
//! `GET /api/sessions/{sid}` shows a session's configuration, never a secret.

use cortex_cli::http::Method;
use cortex_tests::scripted_model::{Reply, ScriptedModel};
use cortex_tests::{Hub, body, wait_until};
use serde_json::{Value, json};

use super::runner::{LIMIT, count, hub, hub_with, new_session, run_end, say};

/// `cortex ARGS` on `hub`, which must exit 0: its stdout and stderr.
fn ok(hub: &Hub, args: &[&str]) -> (String, String) {
    let (code, out, err) = hub.cortex(args);
    assert_eq!(code, 0, "cortex {args:?}\nstdout {out}\nstderr {err}");
    (out, err)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A session made with `body`, once the clock is past every session made before it (so
/// "newest first" has one answer).
fn made_after(hub: &Hub, body: Value) -> String {
    let (st, list) = hub.api(Method::Get, "/api/sessions", None);
    assert_eq!(st, 200, "{list}");
    let last = list
        .as_array()
        .and_then(|l| l.iter().filter_map(|s| s["created_at"].as_u64()).max())
        .unwrap_or(0);
    wait_until(LIMIT, "the clock to pass the last session's", || {
        (now_ms() > last).then_some(())
    });
    let (st, v) = hub.api(Method::Post, "/api/sessions", Some(&body));
    assert_eq!(st, 201, "{v}");
    v["id"].as_str().expect("id").to_string()
}

#[test]
fn a_mailbox_runs_no_turn_when_the_hub_gains_a_model() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    // One turn at a time: the queue's order is the order turns run in.
    std::fs::write(
        home.join("settings.json"),
        json!({"agent": {"concurrency": 1}}).to_string(),
    )
    .expect("settings");
    let mut plain = Hub::at(&home, &tmp.path().join("plain.log"), &[], &[]);
    plain.spawn();

    // A script's session (no agent flag) and a person's (instructions).
    let (out, _) = ok(&plain, &["session", "new", "--title", "jobs"]);
    let mailbox = out.trim().to_string();
    let (out, _) = ok(&plain, &["session", "new", "--instructions", "Be brief."]);
    let agent = out.trim().to_string();
    let (st, v) = plain.api(Method::Get, &format!("/api/sessions/{mailbox}"), None);
    assert_eq!((st, &v["runs"]), (200, &json!(false)), "{v}");
    assert!(
        v.get("config").is_none(),
        "a mailbox has no configuration: {v}"
    );

    // The mailbox holds a wake and a message, first in the queue a hub used to keep.
    let wp = plain.waitpoint(
        &mailbox,
        json!({"label": "train", "intent": "read the loss"}),
    );
    assert_eq!(plain.signal(&body(&wp, json!({"status": "ok"}))).0, 202);
    plain.wait_wake(&mailbox, wp["id"].as_str().expect("id"), 1, LIMIT);
    let (out, err) = ok(&plain, &["session", "say", &mailbox, "for the log"]);
    assert!(out.starts_with("seq "), "{out}");
    assert!(
        err.contains("mailbox") && err.contains("no turn runs"),
        "{err}"
    );
    // An agent session on a hub without a model: say tells that nothing will answer.
    let (_, err) = ok(&plain, &["session", "say", &agent, "hello"]);
    assert!(err.contains("the hub runs no model"), "{err}");
    let (_, err) = ok(&plain, &["--json", "session", "say", &agent, "again"]);
    assert!(err.contains("the hub runs no model"), "{err}");
    plain.stop();

    let model = ScriptedModel::start(vec![Reply::text("Hello."), Reply::text("Still here.")]);
    let url = model.url();
    let mut with = Hub::at(
        &home,
        &tmp.path().join("model.log"),
        &[
            ("CORTEX_LLM_BASE_URL", url.as_str()),
            ("CORTEX_LLM_MODEL", "scripted"),
        ],
        &[],
    );
    with.spawn();
    let end = run_end(&with, &agent, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    // Posted to the mailbox on a hub with a model: recorded, and no turn takes it.
    let posted = say(&with, &mailbox, json!({"text": "still a log"}));
    assert_eq!(
        (&posted["runs"], &posted["mailbox"]),
        (&json!(false), &json!(true))
    );
    let (code, _, err) = with.cortex(&["session", "say", &mailbox, "x", "--follow"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("mailbox"), "{err}");
    say(&with, &agent, json!({"text": "and now?"}));
    let end = run_end(&with, &agent, 2);
    assert_eq!(end["result"]["output"]["response"], "Still here.", "{end}");
    let events = with.events(&mailbox, 0);
    assert_eq!(count(&events, "run-start"), 0, "{events:#?}");
    assert_eq!(count(&events, "message"), 3, "{events:#?}");
    assert_eq!(model.request_count(), 2);

    // cortex chat opens with the recent past: the messages and what answered them.
    let (out, err) = ok(&with, &["chat", &agent]);
    let at = |t: &str| {
        out.find(t)
            .unwrap_or_else(|| panic!("no {t:?} in {out}\n{err}"))
    };
    assert!(
        at("» hello") < at("Hello.") && at("Hello.") < at("» and now?"),
        "{out}"
    );
    assert!(at("» and now?") < at("Still here."), "{out}");
}

#[test]
fn guides_and_hints_name_only_the_tools_shown() {
    let model = ScriptedModel::start(vec![
        Reply::text("No tools here."),
        Reply::tool_call("device_wait_pid", r#"{"device":"gpu9","pid":4242}"#),
        Reply::text("There is no gpu9."),
    ]);
    let (hub, _tmp) = hub(&model);

    // --allow '' is "no tools": none are sent, and the prefix guides none.
    let (out, _) = ok(&hub, &["session", "new", "--allow", ""]);
    let bare = out.trim().to_string();
    let (st, v) = hub.api(Method::Get, &format!("/api/sessions/{bare}"), None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["config"]["policy"]["allow"], json!([]), "{v}");
    assert_eq!(v["config"]["tools"], json!([]), "{v}");
    say(&hub, &bare, json!({"text": "hi"}));
    run_end(&hub, &bare, 1);
    let req = model.request(0).expect("the first request");
    assert!(
        req["tools"].as_array().is_none_or(|t| t.is_empty()),
        "{}",
        req["tools"]
    );
    let system = req["messages"][0]["content"].as_str().unwrap_or_default();
    for tool in ["wait_create", "devices", "device_exec", "schedule_wakeup"] {
        assert!(!system.contains(tool), "{tool} in {system}");
    }
    assert!(system.contains("no tools"), "{system}");
    assert!(!system.contains("device wait"), "{system}");

    // --deny '*' is the other way to say it.
    let (out, _) = ok(&hub, &["session", "new", "--deny", "*"]);
    let (st, v) = hub.api(Method::Get, &format!("/api/sessions/{}", out.trim()), None);
    assert_eq!((st, &v["config"]["tools"]), (200, &json!([])), "{v}");

    // Without `devices`, nothing tells the model to call it: not the prefix, not the
    // tools' descriptions, not a tool's error.
    let sid = new_session(&hub, json!({"policy": {"deny": ["devices"]}}));
    say(&hub, &sid, json!({"text": "watch pid 4242 on gpu9"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    let req = model.request(1).expect("the second request");
    let text = req.to_string();
    assert!(text.contains("device_wait_pid"), "{text}");
    assert!(!text.contains("call devices"), "{text}");
    assert!(!text.contains("`devices`"), "{text}");
    let events = hub.events(&sid, 0);
    let end = events
        .iter()
        .find(|e| e["kind"] == "tool-end")
        .expect("tool-end");
    let error = end["observation"]["result"]["error"]
        .as_str()
        .unwrap_or_default();
    assert!(error.contains("gpu9"), "{end}");
    assert!(!error.contains("devices"), "{error}");

    // A tool name that is empty is refused, with the way to say "no tools".
    let (st, v) = hub.api(
        Method::Post,
        "/api/sessions",
        Some(&json!({"policy": {"allow": [""]}})),
    );
    assert_eq!(st, 400, "{v}");
    assert!(
        v["message"]
            .as_str()
            .is_some_and(|m| m.contains("--allow ''")),
        "{v}"
    );
}

#[test]
fn sessions_newest_first_with_their_state_and_the_armed_waits_of_all() {
    let model = ScriptedModel::start(vec![
        Reply::status(400, r#"{"error":{"message":"bad request"}}"#),
        Reply::tool_call("devices", "{}"),
        Reply::hang(),
    ]);
    let (hub, _tmp) = hub_with(&model, json!({"llm": {"maxRetries": 0}}));
    let idle = made_after(&hub, json!({"title": "idle"}));
    let machine = made_after(&hub, json!({"title": "machine"}));
    let armed = hub.waitpoint(&machine, json!({"label": "train", "intent": "read it"}));
    let fired = hub.waitpoint(&machine, json!({"label": "done", "intent": "gone"}));
    assert_eq!(hub.signal(&body(&fired, json!({}))).0, 202);
    hub.wait_wake(&machine, fired["id"].as_str().expect("id"), 1, LIMIT);

    let failed = made_after(&hub, json!({"title": "failed", "runs": true}));
    say(&hub, &failed, json!({"text": "go"}));
    assert_eq!(run_end(&hub, &failed, 1)["result"]["ok"], false);

    let you = made_after(
        &hub,
        json!({"title": "you", "policy": {"requireApproval": ["devices"]}}),
    );
    say(&hub, &you, json!({"text": "which devices?"}));
    hub.wait_event(&you, LIMIT, |e| e["kind"] == "approval-required");
    let other = hub.waitpoint(&you, json!({"label": "eval", "intent": "score it"}));

    let running = made_after(&hub, json!({"title": "running", "instructions": "Hi."}));
    say(&hub, &running, json!({"text": "think"}));
    wait_until(LIMIT, "the third model call", || {
        (model.request_count() == 3).then_some(())
    });

    let cancelled = made_after(&hub, json!({"title": "cancelled", "runs": true}));
    let (st, v) = hub.api(
        Method::Post,
        &format!("/api/sessions/{cancelled}/cancel"),
        Some(&json!({})),
    );
    assert!(st == 200 || st == 202, "{st} {v}");

    let (out, _) = ok(&hub, &["sessions"]);
    let rows: Vec<&str> = out.lines().collect();
    assert!(rows[0].starts_with("ID "), "{out}");
    assert!(rows[0].contains("STATE"), "{out}");
    let want = [
        (&cancelled, "cancelled", "agent"),
        (&running, "running", "agent"),
        (&you, "waiting on you", "agent"),
        (&failed, "failed", "agent"),
        (&machine, "waiting on a machine", "mailbox"),
        (&idle, "idle", "mailbox"),
    ];
    assert_eq!(rows.len(), want.len() + 1, "{out}");
    for (row, (sid, state, kind)) in rows[1..].iter().zip(want) {
        assert!(row.starts_with(sid.as_str()), "{sid} in order:\n{out}");
        assert!(
            row.contains(state) && row.contains(kind),
            "{sid} {state}:\n{out}"
        );
    }
    let (out, _) = ok(&hub, &["--json", "sessions"]);
    let list: Value = serde_json::from_str(&out).expect("json");
    let states: Vec<(&str, &str)> = list
        .as_array()
        .expect("an array")
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap_or(""),
                s["state"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert!(
        states.contains(&(you.as_str(), "waiting_on_you")),
        "{states:?}"
    );
    assert!(
        states.contains(&(machine.as_str(), "waiting_on_machine")),
        "{states:?}"
    );

    // Hub-wide: the armed waitpoints of every session, not the fired one.
    let (out, _) = ok(&hub, &["waits"]);
    let (a, o) = (
        armed["id"].as_str().expect("id"),
        other["id"].as_str().expect("id"),
    );
    assert!(out.starts_with("ID "), "{out}");
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(out.contains(a) && out.contains(&machine), "{out}");
    assert!(out.contains(o) && out.contains(&you), "{out}");
    assert!(!out.contains(fired["id"].as_str().expect("id")), "{out}");
    let (out, _) = ok(&hub, &["--json", "waits"]);
    let list: Value = serde_json::from_str(&out).expect("json");
    let ids: Vec<&str> = list
        .as_array()
        .expect("an array")
        .iter()
        .filter_map(|w| w["id"].as_str())
        .collect();
    assert_eq!(ids, [a, o], "oldest first");
    assert!(!out.contains(armed["secret"].as_str().expect("secret")));
}

#[test]
fn a_session_shows_its_configuration_and_never_a_secret() {
    let model = ScriptedModel::start(vec![]);
    let tmp = tempfile::tempdir().expect("tempdir");
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    std::fs::write(
        home.join("settings.json"),
        json!({"agent": {"stop": {"steps": 7}}}).to_string(),
    )
    .expect("settings");
    let url = model.url();
    let key = "sk-session-config-test-4f1e";
    let mut hub = Hub::at(
        &home,
        &tmp.path().join("hub.log"),
        &[
            ("CORTEX_LLM_BASE_URL", url.as_str()),
            ("CORTEX_LLM_MODEL", "scripted-7b"),
            ("CORTEX_LLM_API_KEY", key),
        ],
        &[],
    );
    hub.spawn();
    let (out, _) = ok(
        &hub,
        &[
            "session",
            "new",
            "--instructions",
            "Watch the runs.",
            "--deny",
            "device_exec,devices",
        ],
    );
    let sid = out.trim();
    let (st, v) = hub.api(Method::Get, &format!("/api/sessions/{sid}"), None);
    assert_eq!(st, 200, "{v}");
    let c = &v["config"];
    assert_eq!(c["instructions"], "Watch the runs.", "{v}");
    assert_eq!(c["model"], "scripted-7b", "{v}");
    assert_eq!(c["stop"]["steps"], 7, "the hub's default filled in: {v}");
    assert_eq!(
        c["policy"]["deny"],
        json!(["device_exec", "devices"]),
        "{v}"
    );
    let tools: Vec<&str> = c["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(tools.contains(&"wait_create"), "{tools:?}");
    assert!(
        !tools.contains(&"devices") && !tools.contains(&"device_exec"),
        "{tools:?}"
    );
    assert!(!v.to_string().contains(key), "{v}");
    // A listing is lean: no configuration in it.
    let (_, list) = hub.api(Method::Get, "/api/sessions", None);
    assert!(list[0].get("config").is_none(), "{list}");
}
