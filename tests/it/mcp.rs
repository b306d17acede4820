//! The hub as an MCP server, driven by a real client nobody here wrote (the official
//! Python SDK, `tests/mcp/client.py`) over streamable HTTP and over `cortex mcp`: the
//! tools are the model tools and `wait_for`; a remote pid wait on a real device agent is
//! a task that completes with the exit, also across a hub SIGKILL and restart between the
//! arm and the end; a blocking `wait_for` answers the wake, or "still waiting" at its
//! bound, never a false end; a cancelled task cancels its waitpoint; two clients never
//! see each other's waits; a wrong token and a foreign Origin are refused. Skipped,
//! saying why, where the SDK is not installed (never under `CI=true`).

// Fields of JSON the hub just answered with; a panic is the test failing.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use cortex_cli::http::{Method, Request};
use cortex_tests::agent::Agent;
use cortex_tests::mcp_client::{McpClient, Via, node_or_skip, python_or_skip};
use cortex_tests::{Hub, body, wait_until};
use serde_json::{Value, json};

use super::remote_waits::Sleep;

const T: Duration = Duration::from_secs(30);

/// The tools a client is offered, in order.
const TOOLS: [&str; 11] = [
    "wait_create",
    "wait_check",
    "wait_cancel",
    "devices",
    "device_wait_pid",
    "device_wait_file",
    "device_wait_flock",
    "device_wait_log",
    "device_exec",
    "device_wait_any",
    "wait_for",
];

fn client(py: &std::path::Path, hub: &Hub, via: Via<'_>, mode: &str, tasks: bool) -> McpClient {
    McpClient::start(py, hub, via, mode, tasks).unwrap_or_else(|e| panic!("{e}\n{}", hub.log()))
}

#[test]
fn the_tools_are_the_model_tools_and_wait_for_over_http_and_over_cortex_mcp() {
    let Some(py) = python_or_skip("mcp tools") else {
        return;
    };
    let hub = Hub::start();
    for (via, mode, revision) in [
        (Via::Http(&[]), "legacy", "2025-11-25"),
        (Via::Http(&[]), "auto", "2026-07-28"),
        (Via::Stdio(&[]), "legacy", "2025-11-25"),
        (Via::Stdio(&[]), "auto", "2026-07-28"),
    ] {
        let mut c = client(&py, &hub, via, mode, false);
        assert_eq!(c.protocol, revision);
        let listed = c.ask(json!({"op": "tools"}));
        let names: Vec<&str> = listed["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        assert_eq!(names, TOOLS, "{listed}");
        // The parameters are the model tools'.
        let pid = &listed["schemas"]["device_wait_pid"];
        assert_eq!(pid["required"], json!(["device", "pid"]), "{pid}");
        assert_eq!(listed["schemas"]["wait_for"]["required"], json!(["id"]));
    }
}

#[test]
fn a_wait_wakes_the_client_that_armed_it_and_no_other_client_sees_it() {
    let Some(py) = python_or_skip("mcp waits") else {
        return;
    };
    let hub = Hub::start();
    let mut a = client(&py, &hub, Via::Http(&[]), "legacy", false);
    let mut b = client(&py, &hub, Via::Stdio(&[]), "legacy", false);
    let made = a.call(
        "wait_create",
        json!({"label": "train 7", "intent": "read the loss"}),
    );
    assert_eq!(made["ok"], true, "{made}");
    let wp = made["structured"].clone();
    let id = wp["id"].as_str().unwrap().to_string();
    assert!(wp["secret"].as_str().is_some_and(|s| s.len() == 64), "{wp}");

    // B's session holds none of A's waits, and B can neither wait on nor cancel them.
    let listed = b.call("wait_check", json!({}));
    assert_eq!(listed["structured"]["waitpoints"], json!([]), "{listed}");
    let other = b.call("wait_for", json!({"id": id, "timeout_s": 1}));
    assert_eq!(other["ok"], false, "{other}");
    assert!(
        other["text"].as_str().unwrap().contains("no waitpoint"),
        "{other}"
    );
    let cancel = b.call("wait_cancel", json!({"id": id}));
    assert_eq!(cancel["ok"], false, "{cancel}");

    // A's wait, bounded short: still waiting, never a false end.
    let early = a.call("wait_for", json!({"id": id, "timeout_s": 1}));
    assert_eq!(early["ok"], true, "{early}");
    assert_eq!(early["structured"]["waiting"], true, "{early}");
    assert_eq!(early["structured"]["state"], "armed");
    assert!(
        early["text"]
            .as_str()
            .unwrap()
            .contains("call wait_for again")
    );

    // The job reports while A waits; A's call answers with the wake.
    let waiting = std::thread::spawn({
        let hub_url = hub.url("/webhook/signal");
        let signal = body(&wp, json!({"status": "ok", "message": "loss=0.12"}));
        move || {
            std::thread::sleep(Duration::from_millis(300));
            let b = serde_json::to_vec(&signal).unwrap();
            Request::new(Method::Post, &hub_url)
                .json(&b)
                .send()
                .unwrap()
                .status
        }
    });
    let woke = a.ask_within(
        json!({"op": "call", "name": "wait_for", "args": {"id": id}}),
        T,
    );
    assert_eq!(waiting.join().unwrap(), 202);
    assert_eq!(woke["ok"], true, "{woke}");
    let s = &woke["structured"];
    assert_eq!(s["state"], "resolved", "{woke}");
    assert_eq!(s["wake"]["reason"], "fired");
    assert_eq!(s["wake"]["signals"][0]["message"], "loss=0.12");
    let text = woke["text"].as_str().unwrap();
    assert!(
        text.contains("loss=0.12") && text.contains("never instructions"),
        "{text}"
    );
    // Asked again, the same wake: the waitpoint ended.
    let again = a.call("wait_for", json!({"id": id, "timeout_s": 1}));
    assert_eq!(again["structured"]["seq"], s["seq"], "{again}");

    // A's waits are in one session the page shows under the client's name.
    let (_, sessions) = hub.api(Method::Get, "/api/sessions", None);
    let titles: Vec<&str> = sessions
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["title"].as_str())
        .collect();
    assert_eq!(
        titles.iter().filter(|t| t.starts_with("mcp")).count(),
        2,
        "{sessions}"
    );
}

/// Arms a pid wait on `device` as a task; returns the task's id and the waitpoint's.
fn pid_task(c: &mut McpClient, device: &str, pid: u32, _hub_log: impl Fn() -> String) -> String {
    let t = c.ask(json!({"op": "task", "name": "device_wait_pid",
        "args": {"device": device, "pid": pid, "label": "train"}}));
    let task = &t["task"];
    assert_eq!(task["status"], "working", "{t}\n{}", _hub_log());
    assert!(task["pollIntervalMs"].as_u64().is_some(), "{t}");
    task["taskId"].as_str().unwrap().to_string()
}

#[test]
fn a_remote_pid_wait_is_a_task_that_completes_with_the_exit_across_a_hub_sigkill() {
    let Some(py) = python_or_skip("mcp pid task") else {
        return;
    };
    let mut hub = Hub::start();
    let token = hub.add_device("gpu1");
    let _agent = Agent::start(&hub, "gpu1", &token);
    hub.wait_online("gpu1");

    // Over HTTP: the task completes when the process ends.
    let mut c = client(&py, &hub, Via::Http(&[]), "auto", true);
    let mut sleep = Sleep::start();
    let task = pid_task(&mut c, "gpu1", sleep.pid(), || hub.log());
    let got = c.ask(json!({"op": "get", "id": task}));
    assert_eq!(got["status"], "working", "{got}");
    sleep.kill();
    let done = c.ask(json!({"op": "until", "id": task, "timeout": 30}));
    assert_eq!(done["status"], "completed", "{done}");
    let r = &done["result"];
    assert_eq!(r["isError"], false, "{done}");
    assert_eq!(r["structuredContent"]["wake"]["reason"], "fired", "{done}");
    assert!(
        r["content"][0]["text"].as_str().unwrap().contains("exited"),
        "{done}"
    );

    // Over cortex mcp: armed, the hub SIGKILLed and started again, then the end.
    let mut s = client(&py, &hub, Via::Stdio(&[]), "auto", true);
    let mut sleep = Sleep::start();
    let task = pid_task(&mut s, "gpu1", sleep.pid(), || hub.log());
    hub.restart_in_place();
    hub.wait_online("gpu1");
    sleep.kill();
    let done = s.ask(json!({"op": "until", "id": task, "timeout": 30}));
    assert_eq!(done["status"], "completed", "{done}\n{}", hub.log());
    assert_eq!(
        done["result"]["structuredContent"]["wake"]["reason"],
        "fired"
    );
    // A task is its token's: the HTTP client, on the same token, reads it after the
    // restart too.
    let first = c.ask(json!({"op": "get", "id": task}));
    assert_eq!(first["status"], "completed", "{first}");
}

#[test]
fn a_session_named_by_its_client_and_its_tasks_survive_a_restart_and_a_cancel_cancels_the_waitpoint()
 {
    let Some(py) = python_or_skip("mcp cancel") else {
        return;
    };
    let mut hub = Hub::start();
    let mut c = client(
        &py,
        &hub,
        Via::Stdio(&["--session", "train-7"]),
        "auto",
        true,
    );
    let made = c.call("wait_create", json!({"label": "eval", "intent": "compare"}));
    let id = made["structured"]["id"].as_str().unwrap().to_string();
    let t = c.ask(json!({"op": "task", "name": "wait_for", "args": {"id": id}}));
    let task = t["task"]["taskId"].as_str().unwrap().to_string();
    assert!(
        task.starts_with("task_") && task.len() > 30,
        "a random id: {task}"
    );

    hub.restart_in_place();
    // A second client naming the same session sees the wait; one naming another does not.
    let mut same = client(
        &py,
        &hub,
        Via::Http(&["--session", "train-7"]),
        "legacy",
        false,
    );
    let listed = same.call("wait_check", json!({}));
    assert_eq!(listed["structured"]["waitpoints"][0]["id"], id, "{listed}");
    let mut other = client(
        &py,
        &hub,
        Via::Http(&["--session", "train-8"]),
        "legacy",
        false,
    );
    let listed = other.call("wait_check", json!({}));
    assert_eq!(listed["structured"]["waitpoints"], json!([]), "{listed}");

    let got = c.ask(json!({"op": "get", "id": task}));
    assert_eq!(got["status"], "working", "{got}");
    let cancelled = c.ask(json!({"op": "cancel", "id": task}));
    assert!(cancelled.get("error").is_none(), "{cancelled}");
    let got = c.ask(json!({"op": "get", "id": task}));
    assert_eq!(got["status"], "cancelled", "{got}");
    assert_eq!(hub.get_waitpoint(&id)["state"], "cancelled");
    let again = c.ask(json!({"op": "cancel", "id": task}));
    assert!(again["error"].as_str().is_some(), "an ended task: {again}");
    let unknown = c.ask(json!({"op": "get", "id": "task_0000"}));
    assert!(unknown["error"].as_str().is_some(), "{unknown}");
}

fn post_mcp(hub: &Hub, headers: &[(&str, &str)]) -> (u16, Value) {
    let url = hub.url("/mcp");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "probe", "version": "1"}}});
    let b = serde_json::to_vec(&init).unwrap();
    let mut req = Request::new(Method::Post, &url)
        .header("Accept", "application/json, text/event-stream")
        .json(&b);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let r = req.send().unwrap();
    (
        r.status,
        serde_json::from_slice(&r.body).unwrap_or(Value::Null),
    )
}

#[test]
fn a_wrong_token_and_a_foreign_origin_are_refused() {
    let hub = Hub::start();
    let bearer = format!("Bearer {}", hub.token);
    let own = format!("http://{}", hub.addr);
    let (st, v) = post_mcp(&hub, &[]);
    assert_eq!(st, 401, "{v}");
    assert_eq!(v["error"]["code"], "unauthorized");
    let (st, _) = post_mcp(&hub, &[("Authorization", "Bearer not-the-token")]);
    assert_eq!(st, 401);
    let (st, v) = post_mcp(
        &hub,
        &[
            ("Authorization", &bearer),
            ("Origin", "http://evil.example"),
        ],
    );
    assert_eq!(st, 403, "{v}");
    assert_eq!(v["error"]["code"], "forbidden_origin");
    let (st, _) = post_mcp(&hub, &[("Authorization", &bearer), ("Origin", "null")]);
    assert_eq!(st, 403);
    let (st, v) = post_mcp(&hub, &[("Authorization", &bearer), ("Origin", &own)]);
    assert_eq!(st, 200, "the hub's own origin: {v}");
    let (st, _) = post_mcp(&hub, &[("Authorization", &bearer)]);
    assert_eq!(st, 200);

    let Some(py) = python_or_skip("mcp refusals") else {
        return;
    };
    let refused = McpClient::start(&py, &hub, Via::Http(&["--token", "nope"]), "legacy", false);
    assert!(
        refused.is_err(),
        "a client with a wrong token connects to nothing"
    );
    wait_until(T, "the hub still serving", || {
        (post_mcp(&hub, &[("Authorization", &bearer)]).0 == 200).then_some(())
    });
}

#[test]
fn a_typescript_sdk_client_waits_as_a_2025_11_25_task_over_http_and_over_cortex_mcp() {
    let Some(node) = node_or_skip("mcp typescript") else {
        return;
    };
    let hub = Hub::start();
    for via in [Via::Http(&[]), Via::Stdio(&[])] {
        let mut c = McpClient::start_node(&node, &hub, via).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.protocol, "2025-11-25");
        let listed = c.ask(json!({"op": "tools"}));
        assert_eq!(
            listed["execution"]["wait_for"]["taskSupport"], "optional",
            "{listed}"
        );
        assert_eq!(
            listed["execution"]["device_wait_pid"]["taskSupport"],
            "optional"
        );
        assert_eq!(listed["execution"]["wait_create"], Value::Null);

        let made = c.call("wait_create", json!({"label": "build", "intent": "ship"}));
        let wp = made["structured"].clone();
        let id = wp["id"].as_str().unwrap().to_string();
        let signal = {
            let url = hub.url("/webhook/signal");
            let b = serde_json::to_vec(&body(&wp, json!({"status": "ok", "message": "built"})))
                .unwrap();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(500));
                Request::new(Method::Post, &url)
                    .json(&b)
                    .send()
                    .unwrap()
                    .status
            })
        };
        // callToolStream: a task, polled with tasks/get, its result from tasks/result.
        let streamed = c.ask_within(
            json!({"op": "stream", "name": "wait_for", "args": {"id": id}}),
            T,
        );
        assert_eq!(signal.join().unwrap(), 202);
        let messages = streamed["messages"].as_array().unwrap();
        assert_eq!(messages[0]["type"], "taskCreated", "{streamed}");
        let task = messages[0]["task"]["taskId"].as_str().unwrap().to_string();
        let last = messages.last().unwrap();
        assert_eq!(last["type"], "result", "{streamed}");
        assert_eq!(
            last["result"]["structuredContent"]["wake"]["reason"],
            "fired"
        );
        assert!(
            last["result"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains("built")
        );

        let got = c.ask(json!({"op": "get", "id": task}));
        assert_eq!(got["status"], "completed", "{got}");
        let listed = c.ask(json!({"op": "list"}));
        assert!(
            listed["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["taskId"] == task.as_str()),
            "{listed}"
        );
        let cancel = c.ask(json!({"op": "cancel", "id": task}));
        assert!(
            cancel["error"].as_str().is_some(),
            "an ended task: {cancel}"
        );
        // A refused wait makes no task: the error says why.
        let refused = c.ask(json!({"op": "stream", "name": "device_wait_pid",
            "args": {"device": "nowhere", "pid": 1}}));
        let last = refused["messages"]
            .as_array()
            .unwrap()
            .last()
            .cloned()
            .unwrap();
        assert_eq!(last["type"], "error", "{refused}");
        assert!(
            last["message"].as_str().unwrap().contains("nowhere"),
            "{refused}"
        );
    }
}

#[test]
fn the_hub_stops_at_once_with_clients_connected_and_a_wait_for_blocking() {
    let Some(py) = python_or_skip("mcp stop") else {
        return;
    };
    let mut hub = Hub::start();
    let mut c = client(&py, &hub, Via::Http(&[]), "legacy", false);
    let made = c.call("wait_create", json!({"label": "long", "intent": "wait"}));
    let id = made["structured"]["id"].as_str().unwrap().to_string();
    c.send(json!({"op": "call", "name": "wait_for", "args": {"id": id}}));
    // The call is in: it follows the session's log.
    wait_until(T, "the wait_for to block", || {
        let text = Request::new(Method::Get, &hub.url("/metrics"))
            .header("Authorization", &format!("Bearer {}", hub.token))
            .send()
            .ok()?;
        String::from_utf8_lossy(&text.body)
            .lines()
            .any(|l| l.starts_with("cortex_session_watchers") && !l.ends_with(" 0"))
            .then_some(())
    });
    let st = hub.stop();
    assert!(
        st.success(),
        "a clean stop with a client connected: {st}\n{}",
        hub.log()
    );
    let answered = c.answer(T);
    let text = answered.to_string();
    assert!(
        text.contains("hub is stopping") || answered.get("error").is_some(),
        "the blocked call is answered, never a false end: {answered}"
    );
    assert!(!text.contains("\"state\": \"resolved\""), "{answered}");
}

#[test]
fn a_wake_is_pushed_to_a_claude_code_session_as_a_channel_message_over_http_and_cortex_mcp() {
    let Some(py) = python_or_skip("mcp channel") else {
        return;
    };
    let hub = Hub::start();
    for via in [Via::Http(&[]), Via::Stdio(&[])] {
        let mut c = McpClient::start_as(&py, &hub, via, "legacy", false, "claude-code")
            .unwrap_or_else(|e| panic!("{e}"));
        let made = c.call(
            "wait_create",
            json!({"label": "train", "intent": "read it"}),
        );
        let wp = made["structured"].clone();
        let (st, _) = hub.signal(&body(
            &wp,
            json!({"status": "ok", "message": "epoch 3 done"}),
        ));
        assert_eq!(st, 202);
        let pushed = c.ask_within(json!({"op": "channel", "timeout": 20}), T);
        assert!(pushed.get("error").is_none(), "{pushed}\n{}", c.stderr());
        assert!(
            pushed["content"].as_str().unwrap().contains("epoch 3 done"),
            "{pushed}"
        );
        assert!(
            pushed["content"]
                .as_str()
                .unwrap()
                .contains("never instructions")
        );
        assert_eq!(pushed["meta"]["waitpoint"], wp["id"], "{pushed}");
        assert_eq!(pushed["meta"]["reason"], "fired");
    }
}

/// The commands the device ran: the `device-exec` events of the hub's log.
fn execs(hub: &Hub) -> Vec<Value> {
    let (st, v) = hub.api(Method::Get, "/api/events", None);
    assert_eq!(st, 200, "{v}");
    v["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "device-exec")
        .cloned()
        .collect()
}

#[test]
fn device_exec_runs_only_once_a_person_allowed_it_through_the_client_or_the_hub() {
    let Some(py) = python_or_skip("mcp device_exec") else {
        return;
    };
    let hub = Hub::start();
    let token = hub.add_device("gpu1");
    let mut agent = Agent::new(&hub, "gpu1", &token);
    agent.set_env("CORTEX_ALLOW_EXEC", "1");
    agent.set_env("CORTEX_EXEC_ALLOW", "sh");
    agent.spawn();
    hub.wait_online("gpu1");
    let dir = tempfile::tempdir().unwrap();
    let marker = |n: &str| dir.path().join(n);
    let script = |n: &str| {
        json!({"device": "gpu1", "shell": true,
        "argv": [format!("echo ran > {}", marker(n).display())]})
    };

    // A client that asks its person: declined, nothing runs; accepted, it runs.
    let mut no = McpClient::start_with(
        &py,
        &hub,
        Via::Http(&[]),
        "legacy",
        false,
        &["--elicit", "decline"],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let r = no.call("device_exec", script("declined"));
    assert_eq!(r["ok"], false, "{r}");
    assert!(
        r["text"].as_str().unwrap().contains("nothing was started"),
        "{r}"
    );
    let asked = no.ask(json!({"op": "asked"}));
    assert!(
        asked["asked"][0].as_str().unwrap().contains("gpu1"),
        "{asked}"
    );
    let mut yes = McpClient::start_with(
        &py,
        &hub,
        Via::Stdio(&[]),
        "legacy",
        false,
        &["--elicit", "accept"],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let r = yes.call("device_exec", script("accepted"));
    assert_eq!(r["ok"], true, "{r}");
    assert!(r["structured"]["pid"].as_u64().is_some(), "{r}");
    wait_until(T, "the accepted command's mark", || {
        marker("accepted").exists().then_some(())
    });

    // A client that cannot ask: the call waits on an approval the hub shows.
    let mut c = client(&py, &hub, Via::Http(&[]), "legacy", false);
    let r = c.call("device_exec", {
        let mut a = script("pending");
        a["timeout_s"] = json!(1);
        a
    });
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["structured"]["waiting"], true, "{r}");
    let req = r["structured"]["id"].as_str().unwrap().to_string();
    assert!(req.starts_with("req_"), "{r}");
    let (code, out, err) = hub.cortex(&["approvals", "--json"]);
    assert_eq!(code, 0, "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == req.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{req} among the approvals: {out}"));
    let sid = row["session"].as_str().unwrap().to_string();
    assert!(!marker("pending").exists(), "nothing runs unanswered");
    // Still unanswered: wait_for says so again, and runs nothing.
    let again = c.call("wait_for", json!({"id": req, "timeout_s": 1}));
    assert_eq!(again["structured"]["waiting"], true, "{again}");
    assert!(!marker("pending").exists());
    // A person allows it: the waiting call runs it, once.
    c.send(json!({"op": "call", "name": "wait_for", "args": {"id": req}}));
    let (code, _, err) = hub.cortex(&["answer", &sid, &req, "allow"]);
    assert_eq!(code, 0, "{err}");
    let ran = c.answer(T);
    assert_eq!(ran["ok"], true, "{ran}");
    assert!(ran["structured"]["pid"].as_u64().is_some(), "{ran}");
    wait_until(T, "the allowed command's mark", || {
        marker("pending").exists().then_some(())
    });
    let late = c.call("wait_for", json!({"id": req, "timeout_s": 1}));
    assert_eq!(late["ok"], false, "taken once: {late}");

    // Denied by a person: nothing runs.
    let r = c.call("device_exec", {
        let mut a = script("denied");
        a["timeout_s"] = json!(1);
        a
    });
    let req = r["structured"]["id"].as_str().unwrap().to_string();
    let (code, _, err) = hub.cortex(&["answer", &sid, &req, "deny"]);
    assert_eq!(code, 0, "{err}");
    let denied = c.call("wait_for", json!({"id": req, "timeout_s": 5}));
    assert_eq!(denied["ok"], false, "{denied}");
    assert!(
        denied["text"].as_str().unwrap().contains("denied"),
        "{denied}"
    );
    assert!(!marker("denied").exists() && !marker("declined").exists());
    let ran: Vec<Value> = execs(&hub)
        .into_iter()
        .filter(|e| e["pid"].is_u64())
        .collect();
    assert_eq!(ran.len(), 2, "two commands ran, each once: {ran:?}");
}

#[test]
fn a_task_made_on_one_hub_is_answered_by_another_on_the_same_database_even_after_the_first_died() {
    let Some(py) = python_or_skip("mcp tasks across hubs") else {
        return;
    };
    let (mut a, b) = super::cluster::two_hubs(&[]);
    let mut on_a = client(&py, &a, Via::Http(&[]), "auto", true);
    let made = on_a.call(
        "wait_create",
        json!({"label": "sweep", "intent": "pick the best"}),
    );
    let wp = made["structured"].clone();
    let t = on_a.ask(json!({"op": "task", "name": "wait_for", "args": {"id": wp["id"]}}));
    let task = t["task"]["taskId"].as_str().unwrap().to_string();

    // Another hub on the database answers for the task, and for the signal.
    let mut on_b = client(&py, &b, Via::Http(&[]), "auto", true);
    let got = on_b.ask(json!({"op": "get", "id": task}));
    assert_eq!(got["status"], "working", "{got}");
    a.kill();
    let (st, _) = b.signal(&body(
        &wp,
        json!({"status": "ok", "message": "best: lr=3e-4"}),
    ));
    assert_eq!(st, 202);
    let done = on_b.ask(json!({"op": "until", "id": task, "timeout": 30}));
    assert_eq!(done["status"], "completed", "{done}");
    let text = done["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("lr=3e-4"), "{done}");
}

#[test]
fn an_mcp_token_reaches_only_mcp_and_its_tasks_are_its_own_until_it_is_revoked() {
    let Some(py) = python_or_skip("mcp tokens") else {
        return;
    };
    let hub = Hub::start();
    let token = |name: &str| {
        let (code, out, err) = hub.cortex(&["mcp-token", "add", name, "--json"]);
        assert_eq!(code, 0, "{err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        v["token"].as_str().unwrap().to_string()
    };
    let (ta, tb) = (token("agent-a"), token("agent-b"));
    assert!(ta.starts_with("mcp_") && ta != tb);
    let (code, out, _) = hub.cortex(&["mcp-token", "list"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("agent-a") && out.contains("agent-b") && !out.contains(&ta),
        "{out}"
    );

    // An MCP token is no operator token.
    let api = Request::new(Method::Get, &hub.url("/api/sessions"))
        .header("Authorization", &format!("Bearer {ta}"))
        .send()
        .unwrap();
    assert_eq!(api.status, 401);

    let mut a = client(&py, &hub, Via::Http(&["--token", &ta]), "auto", true);
    let mut b = client(&py, &hub, Via::Http(&["--token", &tb]), "auto", true);
    let made = a.call("wait_create", json!({"label": "a's", "intent": "mine"}));
    let id = made["structured"]["id"].as_str().unwrap().to_string();
    let t = a.ask(json!({"op": "task", "name": "wait_for", "args": {"id": id}}));
    let task = t["task"]["taskId"].as_str().unwrap().to_string();
    assert_eq!(a.ask(json!({"op": "get", "id": task}))["status"], "working");
    // B, on the same stateless revision, has a session and tasks of its own.
    let theirs = b.ask(json!({"op": "get", "id": task}));
    assert!(
        theirs["error"].as_str().is_some(),
        "another token's task: {theirs}"
    );
    let listed = b.call("wait_check", json!({}));
    assert_eq!(listed["structured"]["waitpoints"], json!([]), "{listed}");

    let (code, _, err) = hub.cortex(&["mcp-token", "revoke", "agent-a"]);
    assert_eq!(code, 0, "{err}");
    let refused = a.ask(json!({"op": "get", "id": task}));
    assert!(
        refused.get("error").is_some(),
        "a revoked token reaches nothing: {refused}"
    );
    let still = b.call("wait_check", json!({}));
    assert_eq!(still["ok"], true, "{still}");
}

/// A waitpoint made by `c` and a task on it: the waitpoint (id and secret), the task's id.
fn waited_task(c: &mut McpClient, label: &str) -> (Value, String) {
    let made = c.call("wait_create", json!({"label": label, "intent": "x"}));
    let wp = made["structured"].clone();
    let t = c.ask(json!({"op": "task", "name": "wait_for", "args": {"id": wp["id"]}}));
    let task = t["task"]["taskId"].as_str().unwrap().to_string();
    (wp, task)
}

/// `c` listens on `task`: the listen follows it and tells it working at once.
fn listening(c: &mut McpClient, task: &str) {
    let ack = c.ask(json!({"op": "listen", "ids": [task]}));
    assert_eq!(
        ack["ack"]["notifications"]["taskIds"],
        json!([task]),
        "{ack}"
    );
    let first = c.ask(json!({"op": "pushed", "id": task}));
    assert_eq!(first["status"], "working", "{first}");
}

/// The job holding `wp` reports `message`.
fn report(hub: &Hub, wp: &Value, message: &str) {
    let signal = body(wp, json!({"status": "ok", "message": message}));
    let sent = Request::new(Method::Post, &hub.url("/webhook/signal"))
        .json(&serde_json::to_vec(&signal).unwrap())
        .send()
        .unwrap();
    assert_eq!(sent.status, 202);
}

#[test]
fn a_task_s_changes_are_pushed_through_subscriptions_listen_to_its_own_token_only() {
    let Some(py) = python_or_skip("mcp task notifications") else {
        return;
    };
    let mut hub = Hub::start();
    let mut c = client(&py, &hub, Via::Http(&[]), "auto", true);
    let (wp, task) = waited_task(&mut c, "train 9");

    // Another token's task, and one that does not exist, are not honored.
    let (code, out, err) = hub.cortex(&["mcp-token", "add", "other", "--json"]);
    assert_eq!(code, 0, "{err}");
    let other_token = serde_json::from_str::<Value>(&out).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mut o = client(
        &py,
        &hub,
        Via::Http(&["--token", &other_token]),
        "auto",
        true,
    );
    let (_, other_task) = waited_task(&mut o, "theirs");
    let ack = c.ask(json!({"op": "listen", "ids": [task, other_task, "task_none"]}));
    assert_eq!(
        ack["ack"]["notifications"]["taskIds"],
        json!([task]),
        "{ack}\n{}",
        hub.log()
    );
    // Its state at once, then its completion, the wake inline: no poll.
    let first = c.ask(json!({"op": "pushed", "id": task}));
    assert_eq!(first["status"], "working", "{first}");
    report(&hub, &wp, "loss=0.07");
    let done = c.ask(json!({"op": "pushed", "id": task}));
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["structuredContent"]["wake"]["signals"][0]["message"], "loss=0.07",
        "{done}"
    );
    assert!(
        !done["_meta"]["io.modelcontextprotocol/subscriptionId"].is_null(),
        "{done}"
    );
    // Every task followed ended: the hub ends the listen itself.
    let end = c.ask(json!({"op": "listen_end"}));
    assert_eq!(end["result"]["resultType"], "complete", "{end}");

    // Over cortex mcp: a task another client of the token cancels is pushed cancelled.
    let mut s = client(&py, &hub, Via::Stdio(&[]), "auto", true);
    let (wp, task) = waited_task(&mut s, "eval");
    listening(&mut s, &task);
    // The open listen holds up none of the client's other calls.
    let listed = s.call("wait_check", json!({}));
    let ids: Vec<&Value> = listed["structured"]["waitpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| &w["id"])
        .collect();
    assert!(ids.contains(&&wp["id"]), "{listed}");
    let cancelled = c.ask(json!({"op": "cancel", "id": task}));
    assert!(cancelled.get("error").is_none(), "{cancelled}");
    let pushed = s.ask(json!({"op": "pushed", "id": task}));
    assert_eq!(pushed["status"], "cancelled", "{pushed}");
    let end = s.ask(json!({"op": "listen_end"}));
    assert_eq!(end["result"]["resultType"], "complete", "{end}");

    // The hub SIGKILLed while a listen is open: the stream is lost, the task is not; the
    // client listens again, on the hub started again, and is told of the wake.
    let (wp, task) = waited_task(&mut c, "long");
    listening(&mut c, &task);
    hub.restart_in_place();
    let lost = c.ask(json!({"op": "listen_end"}));
    assert!(lost.get("error").is_some(), "{lost}");
    listening(&mut c, &task);
    report(&hub, &wp, "after");
    let done = c.ask(json!({"op": "pushed", "id": task}));
    assert_eq!(done["status"], "completed", "{done}\n{}", hub.log());

    // A client that did not declare the tasks extension is refused, saying what it lacks.
    let mut plain = client(&py, &hub, Via::Http(&[]), "auto", false);
    let refused = plain.ask(json!({"op": "listen", "ids": [task]}));
    let e = refused["error"].as_str().unwrap_or("");
    assert!(e.contains("capability"), "{refused}");

    // A token holds at most 64 listens open; the next is refused, saying so.
    let (_, task) = waited_task(&mut c, "open");
    for n in 0..64 {
        let ack = c.ask(json!({"op": "listen", "ids": [task]}));
        assert!(ack.get("ack").is_some(), "listen {n}: {ack}");
    }
    let over = c.ask(json!({"op": "listen", "ids": [task]}));
    assert!(
        over["error"].as_str().unwrap_or("").contains("64 listens"),
        "{over}"
    );
}

/// Runs Claude Code's `claude ARGS` in `dir` (its home and project), as a user would.
fn claude(bin: &std::path::Path, dir: &std::path::Path, hub: &Hub, args: &[&str]) -> String {
    let out = std::process::Command::new(bin)
        .args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .env("DISABLE_AUTOUPDATER", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("CORTEX_HUB", hub.url(""))
        .env("CORTEX_WEBHOOK_TOKEN", &hub.token)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "claude {args:?}: {text}");
    text
}

#[test]
fn claude_code_itself_connects_to_cortex_mcp_and_to_mcp_over_http_as_the_docs_add_them() {
    let Some(bin) = cortex_tests::mcp_client::claude_or_skip("claude code") else {
        return;
    };
    let hub = Hub::start();
    let dir = tempfile::tempdir().unwrap();
    let cortex = cortex_tests::bin("cortex");
    let cortex = cortex.to_str().unwrap();
    let url = hub.url("/mcp");
    let bearer = format!("Authorization: Bearer {}", hub.token);
    // The lines docs/mcp.md gives, with this build's `cortex`.
    claude(
        &bin,
        dir.path(),
        &hub,
        &["mcp", "add", "cortex", "--", cortex, "mcp"],
    );
    claude(
        &bin,
        dir.path(),
        &hub,
        &[
            "mcp",
            "add",
            "--transport",
            "http",
            "cortex-http",
            &url,
            "--header",
            &bearer,
        ],
    );
    // A wrong token: Claude Code must not find it connected.
    claude(
        &bin,
        dir.path(),
        &hub,
        &[
            "mcp",
            "add",
            "--transport",
            "http",
            "wrong",
            &url,
            "--header",
            "Authorization: Bearer nope",
        ],
    );
    let listed = claude(&bin, dir.path(), &hub, &["mcp", "list"]);
    let line = |name: &str| {
        listed
            .lines()
            .find(|l| l.starts_with(&format!("{name}:")))
            .unwrap_or_else(|| panic!("no {name} in {listed}"))
            .to_string()
    };
    assert!(
        line("cortex").contains("Connected"),
        "{listed}\n{}",
        hub.log()
    );
    assert!(
        line("cortex-http").contains("Connected"),
        "{listed}\n{}",
        hub.log()
    );
    assert!(!line("wrong").contains("✔"), "{listed}");
}
