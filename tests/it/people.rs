//! A person in the loop, with the real hub and a scripted model over real HTTP: gates
//! (deny, ask, allow-listed), approvals that park the session and survive a SIGKILL,
//! gating that stops at the first ask, an approval timeout, unattended sessions,
//! questions answered with data, timers that fire only when the turn ends, and cancel
//! (the turn mid-stream, or the whole session).

use std::time::Duration;

use cortex_cli::http::Method;
use cortex_tests::scripted_model::{Reply, ScriptedModel};
use cortex_tests::{Hub, wait_until};
use serde_json::{Value, json};

use super::runner::{LIMIT, count, hub, hub_with, last_message, new_session, run_end, say};

/// The first event of `kind`.
fn first<'a>(events: &'a [Value], kind: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {events:#?}"))
}

/// The tool-end events, in order.
fn tool_ends(events: &[Value]) -> Vec<&Value> {
    events.iter().filter(|e| e["kind"] == "tool-end").collect()
}

fn answer(hub: &Hub, sid: &str, body: Value) -> (u16, Value) {
    hub.api(
        Method::Post,
        &format!("/api/sessions/{sid}/answers"),
        Some(&body),
    )
}

/// Waits for the session's first `approval-required` and returns its request.
fn pending(hub: &Hub, sid: &str) -> Value {
    hub.wait_event(sid, LIMIT, |e| e["kind"] == "approval-required")["approval"].clone()
}

#[test]
fn a_denied_call_is_seen_by_the_model_which_goes_on() {
    let model = ScriptedModel::start(vec![
        Reply::tool_call("devices", "{}"),
        Reply::text("I could not list the devices."),
    ]);
    let (hub, _tmp) = hub(&model);
    let sid = new_session(&hub, json!({"policy": {"deny": ["devices"]}}));
    say(&hub, &sid, json!({"text": "which devices are there?"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    let events = hub.events(&sid, 0);
    let obs = &first(&events, "tool-end")["observation"];
    assert_eq!(obs["ok"], false, "{obs}");
    assert!(
        obs["result"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("denied")),
        "{obs}"
    );
    let told = last_message(&model.requests()[1]);
    assert_eq!(told["role"], "tool");
    assert!(
        told["content"]
            .as_str()
            .is_some_and(|c| c.contains("denied")),
        "{told}"
    );
    // A denied tool is not shown; called anyway, it is still gated.
    let reqs = model.requests();
    let shown: Vec<&str> = reqs[0]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert!(!shown.contains(&"devices"), "{shown:?}");
    assert!(shown.contains(&"wait_create"), "{shown:?}");
}

#[test]
fn gating_stops_at_the_first_ask_and_an_approval_survives_a_sigkill() {
    // Three calls in one reply: the first runs, the second asks, the third waits for
    // the second's answer before it is even gated.
    let model = ScriptedModel::start(vec![
        Reply::tool_calls(&[
            ("wait_check", "{}"),
            ("devices", "{}"),
            ("wait_check", "{}"),
        ]),
        Reply::text("Done with all three."),
    ]);
    let (mut hub, _tmp) = hub(&model);
    let sid = new_session(&hub, json!({"policy": {"requireApproval": ["devices"]}}));
    say(&hub, &sid, json!({"text": "check everything"}));
    let req = pending(&hub, &sid);
    assert_eq!(req["kind"], "approval", "{req}");
    assert_eq!(req["tool"], "devices", "{req}");
    let id = req["id"].as_str().expect("request id").to_string();
    let events = hub.events(&sid, 0);
    assert_eq!(tool_ends(&events).len(), 1, "only the first call ran");
    assert_eq!(count(&events, "tool-start"), 2, "the third is not started");
    assert_eq!(count(&events, "run-end"), 0);

    // Parked: nothing runs, and a hub killed now still knows what waits.
    hub.kill();
    hub.spawn();
    let (st, list) = hub.api(Method::Get, "/api/approvals", None);
    assert_eq!(st, 200, "{list}");
    let listed = list["approvals"].as_array().expect("approvals");
    assert_eq!(listed.len(), 1, "{list}");
    assert_eq!(listed[0]["session"], sid.as_str());
    assert_eq!(listed[0]["id"], id.as_str());
    assert_eq!(model.request_count(), 1, "no model call while parked");

    // An id nothing waits under is refused; the real one is taken once.
    let (st, v) = answer(
        &hub,
        &sid,
        json!({"request_id": "req_nope", "decision": "allow"}),
    );
    assert_eq!(st, 404, "{v}");
    assert_eq!(v["error"], "not_pending", "{v}");
    let (st, v) = answer(&hub, &sid, json!({"request_id": id, "decision": "allow"}));
    assert_eq!(st, 201, "{v}");
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    let events = hub.events(&sid, 0);
    let ends = tool_ends(&events);
    assert_eq!(ends.len(), 3, "{events:#?}");
    let names: Vec<&str> = ends
        .iter()
        .map(|e| e["observation"]["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(names, ["wait_check", "devices", "wait_check"]);
    assert!(ends.iter().all(|e| e["observation"]["ok"] == true));
    let (st, v) = answer(&hub, &sid, json!({"request_id": id, "decision": "allow"}));
    assert_eq!(st, 200, "the same answer again is a duplicate: {v}");
    assert_eq!(v["duplicate"], true, "{v}");
    // Deny after allow: the first answer stands, and the second is told which it was.
    let (st, v) = answer(&hub, &sid, json!({"request_id": id, "decision": "deny"}));
    assert_eq!(st, 409, "{v}");
    assert_eq!(v["error"], "already_answered", "{v}");
    let msg = v["message"].as_str().unwrap_or_default();
    assert!(msg.contains("already answered allow by a person"), "{msg}");
    let (st, list) = hub.api(Method::Get, "/api/approvals", None);
    assert_eq!(st, 200);
    assert_eq!(list["approvals"], json!([]), "{list}");
    // The model saw the three answers, in order, after its reply.
    let msgs = model.requests()[1]["messages"]
        .as_array()
        .expect("messages")
        .clone();
    let roles: Vec<&str> = msgs
        .iter()
        .map(|m| m["role"].as_str().unwrap_or(""))
        .collect();
    let n = roles.len();
    assert_eq!(
        &roles[n - 4..],
        ["assistant", "tool", "tool", "tool"],
        "{roles:?}"
    );
}

#[test]
fn an_approval_timeout_denies_and_the_run_goes_on() {
    let model = ScriptedModel::start(vec![
        Reply::tool_call("devices", "{}"),
        Reply::text("Nobody approved; going on."),
    ]);
    let (hub, _tmp) = hub(&model);
    let sid = new_session(
        &hub,
        json!({"policy": {"requireApproval": ["devices"], "approvalTimeoutMs": 300}}),
    );
    say(&hub, &sid, json!({"text": "list devices"}));
    let req = pending(&hub, &sid);
    assert!(req["expires_at"].as_u64().is_some(), "{req}");
    let end = run_end(&hub, &sid, 1);
    assert_eq!(
        end["result"]["ok"], true,
        "a timeout is not an error: {end}"
    );
    let events = hub.events(&sid, 0);
    let a = first(&events, "answer");
    assert_eq!(a["by"], "timeout", "{a}");
    assert_eq!(a["decision"], "deny", "{a}");
    // Allow after the timeout's deny: 409, the deny stands.
    let id = a["request_id"].as_str().unwrap_or_default().to_string();
    let (st, v) = answer(&hub, &sid, json!({"request_id": id, "decision": "allow"}));
    assert_eq!(st, 409, "{v}");
    let msg = v["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("already answered deny by the approval's timeout"),
        "{msg}"
    );
    let obs = &first(&events, "tool-end")["observation"];
    assert_eq!(obs["ok"], false);
    assert!(
        obs["result"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("nobody approved")),
        "{obs}"
    );
}

#[test]
fn an_unattended_session_ends_with_needs_human_and_goes_on_after() {
    let model = ScriptedModel::start(vec![
        Reply::tool_calls(&[("devices", "{}"), ("wait_check", "{}")]),
        Reply::text("fresh turn"),
    ]);
    let (hub, _tmp) = hub(&model);
    let sid = new_session(
        &hub,
        json!({"unattended": true, "policy": {"requireApproval": ["devices"]}}),
    );
    say(&hub, &sid, json!({"text": "list devices"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], false, "{end}");
    assert_eq!(end["result"]["error"]["code"], "needs_human", "{end}");
    let events = hub.events(&sid, 0);
    assert_eq!(count(&events, "approval-required"), 0);
    assert_eq!(tool_ends(&events).len(), 2, "every open call is answered");
    // The transcript stays one a server takes: the next turn runs.
    say(&hub, &sid, json!({"text": "and now?"}));
    let end = run_end(&hub, &sid, 2);
    assert_eq!(end["result"]["output"]["response"], "fresh turn", "{end}");
}

#[test]
fn a_question_is_answered_with_data() {
    let q = r#"{"questions":[{"question":"Which GPU?","options":["a100","h100"]}]}"#;
    let model = ScriptedModel::start(vec![
        Reply::tool_call("ask_user", q),
        Reply::text("Using the h100."),
    ]);
    let (hub, _tmp) = hub(&model);
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "pick a gpu with me"}));
    let req = pending(&hub, &sid);
    assert_eq!(req["kind"], "question", "{req}");
    assert_eq!(req["questions"][0]["options"], json!(["a100", "h100"]));
    let id = req["id"].as_str().expect("id");
    // A question's answer needs data.
    let (st, v) = answer(&hub, &sid, json!({"request_id": id, "decision": "allow"}));
    assert_eq!(st, 400, "{v}");
    let (st, v) = answer(
        &hub,
        &sid,
        json!({"request_id": id, "data": {"answers": ["h100"]}}),
    );
    assert_eq!(st, 201, "{v}");
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    let told = last_message(&model.requests()[1]);
    let content: Value =
        serde_json::from_str(told["content"].as_str().expect("content")).expect("json");
    assert_eq!(content, json!({"answers": {"answers": ["h100"]}}));
}

#[test]
fn a_timer_due_during_a_turn_fires_once_after_it() {
    let model = ScriptedModel::start(vec![
        Reply::tool_call(
            "schedule_wakeup",
            r#"{"name":"check","in_s":0.2,"text":"time to check the run"}"#,
        ),
        // Still in the turn when the timer is due.
        Reply::text("Timer set.").head_delay(Duration::from_millis(1_000)),
        Reply::text("Checked."),
    ]);
    // A timer due within the turn: sooner than the default shortest delay.
    let (hub, _tmp) = hub_with(&model, json!({"limits": {"timerMinDelayMs": 0}}));
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "remind me"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    let end2 = run_end(&hub, &sid, 2);
    assert_eq!(end2["result"]["output"]["response"], "Checked.", "{end2}");
    let reqs = model.requests();
    assert_eq!(reqs.len(), 3, "{reqs:#?}");
    assert_eq!(last_message(&reqs[2])["content"], "time to check the run");
    let events = hub.events(&sid, 0);
    assert_eq!(count(&events, "timer"), 1, "it fired once");
    let starts: Vec<&Value> = events.iter().filter(|e| e["kind"] == "run-start").collect();
    assert_eq!(starts[1]["input"][0]["kind"], "timer", "{:#?}", starts[1]);
    // The timer fired after the first run's end, not during it.
    let timer_seq = first(&events, "timer")["seq"].as_u64().expect("seq");
    let end_seq = first(&events, "run-end")["seq"].as_u64().expect("seq");
    assert!(
        timer_seq > end_seq,
        "timer {timer_seq} before run-end {end_seq}"
    );
}

#[test]
fn a_turn_only_cancel_mid_stream_keeps_the_text_so_far() {
    let model = ScriptedModel::start(vec![
        Reply::text("Counting slowly: one two three four five six seven eight nine ten")
            .chunk_delay(Duration::from_millis(150)),
        Reply::text("Here for the next one."),
    ]);
    let (hub, _tmp) = hub(&model);
    let sid = new_session(&hub, json!({}));
    let mut follow = hub.follow(&sid);
    say(&hub, &sid, json!({"text": "count"}));
    // The model's first words reached the hub: its text so far is on the session's stream.
    follow.until("the first live text", |event, v| {
        event == "live"
            && v["kind"] == "model-delta"
            && v["text"].as_str().is_some_and(|t| !t.is_empty())
    });
    let (st, v) = hub.api(
        Method::Post,
        &format!("/api/sessions/{sid}/cancel"),
        Some(&json!({"turn_only": true})),
    );
    assert_eq!(st, 202, "{v}");
    say(&hub, &sid, json!({"text": "next question"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], false, "{end}");
    assert_eq!(end["result"]["error"]["code"], "aborted", "{end}");
    let end2 = run_end(&hub, &sid, 2);
    assert_eq!(
        end2["result"]["output"]["response"], "Here for the next one.",
        "{end2}"
    );
    let reqs = model.requests();
    assert_eq!(reqs.len(), 2, "{reqs:#?}");
    let msgs = reqs[1]["messages"].as_array().expect("messages");
    let n = msgs.len();
    assert_eq!(msgs[n - 1]["content"], "next question");
    let kept = msgs[n - 2]["content"].as_str().expect("the cut reply");
    assert_eq!(msgs[n - 2]["role"], "assistant");
    assert!(kept.starts_with("Coun"), "{kept}");
    assert!(kept.ends_with("[Request interrupted by user]"), "{kept}");
    assert!(!kept.contains("ten"), "the stream was stopped: {kept}");
}

#[test]
fn a_session_cancel_ends_it_and_its_waitpoints() {
    let model = ScriptedModel::start(vec![Reply::text("hello")]);
    let (hub, _tmp) = hub(&model);
    let sid = new_session(&hub, json!({}));
    let wp = hub.waitpoint(&sid, json!({"label": "job", "intent": "see"}));
    let wp_id = wp["id"].as_str().expect("id");
    let (code, out, err) = hub.cortex(&["session", "cancel", &sid]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("cancelled"), "{out}");
    wait_until(LIMIT, "the waitpoint cancelled", || {
        (hub.get_waitpoint(wp_id)["state"] == "cancelled").then_some(())
    });
    let (st, v) = hub.api(
        Method::Post,
        &format!("/api/sessions/{sid}/messages"),
        Some(&json!({"text": "still there?"})),
    );
    assert_eq!(st, 409, "{v}");
    let (st, _) = hub.api(Method::Post, &format!("/api/sessions/{sid}/cancel"), None);
    assert_eq!(st, 409, "cancelled before");
    assert_eq!(model.request_count(), 0, "no turn ran");
}

#[test]
fn cortex_approvals_and_answer_from_the_command_line() {
    let model = ScriptedModel::start(vec![
        Reply::tool_call("devices", "{}"),
        Reply::text("listed"),
    ]);
    let (hub, _tmp) = hub(&model);
    let (code, sid, err) = hub.cortex(&["session", "new", "--require-approval", "devices"]);
    assert_eq!(code, 0, "{err}");
    let sid = sid.trim().to_string();
    say(&hub, &sid, json!({"text": "list them"}));
    let req = pending(&hub, &sid);
    let id = req["id"].as_str().expect("id");
    let (code, out, err) = hub.cortex(&["approvals"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&sid) && out.contains(id), "{out}");
    assert!(out.contains("devices"), "{out}");
    let (code, out, err) = hub.cortex(&["answer", &sid, id, "allow", "--always"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("allowed"), "{out}");
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    let (code, out, _) = hub.cortex(&["approvals"]);
    assert_eq!(code, 0);
    assert!(out.contains("nothing waits"), "{out}");
}

#[test]
fn a_device_exec_parked_across_a_sigkill_runs_once_allowed_and_wakes_the_session() {
    let dir = tempfile::tempdir().expect("tmp");
    let mark = dir.path().join("mark");
    let script = format!("echo \"$CORTEX_SIGNAL_ID\" > {}; sleep 1", mark.display());
    let args = json!({"device": "gpu1", "argv": ["sh", "-c", script], "wait": true}).to_string();
    let model = ScriptedModel::start(vec![
        Reply::tool_call("device_exec", &args),
        Reply::text("Started it."),
        Reply::text("It finished."),
    ]);
    // The hub comes back on the same mesh address (chosen at run time), where the
    // device's agent reconnects.
    let (mut hub, agent, _model, _tmp) = super::device_loss::exec_hub_with(model, json!({}));
    // The hub's default gate asks before a command starts on a device.
    let sid = new_session(&hub, json!({}));
    say(
        &hub,
        &sid,
        json!({"text": "run the job on gpu1 and tell me when it ends"}),
    );
    let req = pending(&hub, &sid);
    assert_eq!(req["tool"], "device_exec", "{req}");
    let id = req["id"].as_str().expect("id").to_string();
    assert!(!mark.exists(), "nothing started before the approval");

    hub.kill();
    hub.spawn();
    hub.wait_online("gpu1");
    assert!(!mark.exists(), "nothing started by the restart");
    let (st, v) = answer(&hub, &sid, json!({"request_id": id, "decision": "allow"}));
    assert_eq!(st, 201, "{v}");
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    let events = hub.events(&sid, 0);
    let obs = &first(&events, "tool-end")["observation"];
    assert_eq!(obs["ok"], true, "{obs}");
    assert!(
        obs["result"]["pid"].as_i64().is_some_and(|p| p > 0),
        "{obs}"
    );
    assert!(
        obs["result"]["log"]
            .as_str()
            .is_some_and(|l| l.starts_with(agent.home.to_str().expect("utf-8"))),
        "the log is under the device's home: {obs}"
    );
    let wp = obs["result"]["waitpoint"]["id"]
        .as_str()
        .expect("a pid wait armed in the same step")
        .to_string();
    // The job ran with the waitpoint in its environment, and its exit woke the session.
    let told = wait_until(LIMIT, "the job to write its mark", || {
        std::fs::read_to_string(&mark)
            .ok()
            .filter(|s| !s.is_empty())
    });
    assert_eq!(told.trim(), wp, "CORTEX_SIGNAL_ID is the waitpoint");
    hub.wait_wake(&sid, &wp, 1, LIMIT);
    let end2 = run_end(&hub, &sid, 2);
    assert_eq!(
        end2["result"]["output"]["response"], "It finished.",
        "{end2}"
    );
    // Recorded for operators, with who let it run.
    let (st, hub_events) = hub.api(Method::Get, "/api/events", None);
    assert_eq!(st, 200, "{hub_events}");
    let execs: Vec<&Value> = hub_events["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["kind"] == "device-exec")
        .collect();
    assert_eq!(execs.len(), 1, "{hub_events}");
    assert_eq!(execs[0]["approved_by"], "person");
    assert_eq!(execs[0]["session"], sid.as_str());
    assert_eq!(execs[0]["pid"], obs["result"]["pid"]);
}

#[test]
fn a_device_exec_on_a_device_without_allow_exec_is_a_clear_tool_error() {
    let args = json!({"device": "gpu1", "argv": ["true"]}).to_string();
    let model = ScriptedModel::start(vec![
        Reply::tool_call("device_exec", &args),
        Reply::text("That device does not run commands."),
    ]);
    let (hub, _tmp) = hub(&model);
    let token = hub.add_device("gpu1");
    let _agent = cortex_tests::agent::Agent::start(&hub, "gpu1", &token);
    hub.wait_online("gpu1");
    let sid = new_session(&hub, json!({"policy": {"requireApproval": []}}));
    say(&hub, &sid, json!({"text": "run true on gpu1"}));
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "the model goes on: {end}");
    let events = hub.events(&sid, 0);
    assert_eq!(
        count(&events, "approval-required"),
        0,
        "the session's policy asks nobody"
    );
    let obs = &first(&events, "tool-end")["observation"];
    assert_eq!(obs["ok"], false, "{obs}");
    let error = obs["result"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("--allow-exec"), "{error}");
    let told = last_message(&model.requests()[1]);
    assert!(
        told["content"]
            .as_str()
            .is_some_and(|c| c.contains("--allow-exec")),
        "{told}"
    );
}
