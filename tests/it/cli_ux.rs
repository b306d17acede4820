//! `cortex` as a person and a script meet it, against the real hub (and a real device
//! agent where a device is needed): the devices table's host facts, `wait for`'s exit 3,
//! `wait pid`'s `already_gone` and `--must-exist`, an unknown device refused in one line,
//! one exit status for an unreachable hub, a closed pipe ended quietly, the wrong-token
//! hint said once, `wait check`'s signals, wakes and badges, `session delete`, and bare
//! remote waits sharing one default session.

// Fields of JSON the hub just answered with; a panic is the test failing.
#![allow(clippy::unwrap_used)]

use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::time::Duration;

use cortex_cli::http::Method;
use cortex_tests::agent::Agent;
use cortex_tests::{Hub, bin, body, run};
use serde_json::{Value, json};

/// A pid no process has: a child that ran and was reaped. (The kernel hands pids out in
/// order, so it is not given again within a test's time.)
fn gone_pid() -> String {
    let mut child = Command::new("true").spawn().expect("spawn true");
    let pid = child.id();
    child.wait().expect("reap true");
    pid.to_string()
}

/// `cortex --hub <hub> ARGS` with the operator token and `USER=ada`.
fn cortex_as(hub: &Hub, args: &[&str]) -> (i32, String, String) {
    let url = hub.url("");
    let mut full = vec!["--hub", url.as_str()];
    full.extend_from_slice(args);
    run(
        "cortex",
        &full,
        &[
            ("CORTEX_WEBHOOK_TOKEN", hub.token.as_str()),
            ("USER", "ada"),
        ],
    )
}

#[test]
fn devices_show_the_host_facts_the_agent_told() {
    let hub = Hub::start();
    let token = hub.add_device("gpu1");
    hub.add_device("spare");
    let _agent = Agent::start(&hub, "gpu1", &token);
    hub.wait_online("gpu1");
    let host = hub.device("gpu1")["host"].clone();
    let hostname = host["hostname"].as_str().unwrap();
    assert!(!hostname.is_empty(), "{host}");

    let (code, out, err) = hub.cortex(&["devices"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().take(4).collect();
    assert_eq!(header, ["NAME", "STATE", "HOST", "GPUS"], "{out}");
    let gpu1 = lines.iter().find(|l| l.starts_with("gpu1 ")).unwrap();
    assert!(
        gpu1.contains(&format!("{hostname} ({} CPUs, ", host["cpus"])),
        "{out}"
    );
    assert!(gpu1.contains(host["kernel"].as_str().unwrap()), "{out}");
    // A device that never connected has no host facts: a dash, not a gap or an error.
    let spare = lines.iter().find(|l| l.starts_with("spare ")).unwrap();
    assert!(spare.contains("never connected  -"), "{out}");

    // Revoked, it stays in the list as revoked, with the host it last had.
    let (code, _, err) = hub.cortex(&["device", "revoke", "gpu1"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = hub.cortex(&["devices"]);
    assert_eq!(code, 0, "{err}");
    let gpu1 = out.lines().find(|l| l.starts_with("gpu1 ")).unwrap_or("");
    assert!(gpu1.contains("revoked") && gpu1.contains(hostname), "{out}");
}

#[test]
fn wait_for_exits_3_when_the_job_reported_failure() {
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "job", "intent": "x"}));
    let st = hub.signal(&body(&wp, json!({"status": "fail", "message": "oom"})));
    assert_eq!(st.0, 202, "{}", st.1);
    let (code, out, err) = hub.cortex(&["wait", "for", wp["id"].as_str().unwrap()]);
    assert_eq!(code, 3, "{err}");
    let wake: Value = serde_json::from_str(out.trim()).expect("the wake on stdout");
    assert_eq!(wake["reason"], "failed");

    // A job that reported ok is still 0.
    let ok = hub.waitpoint(&sid, json!({"label": "job", "intent": "x"}));
    assert_eq!(hub.signal(&body(&ok, json!({}))).0, 202);
    let (code, _, err) = hub.cortex(&["wait", "for", ok["id"].as_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_pid_not_running_fires_already_gone_or_with_must_exist_is_refused() {
    let pid = gone_pid();
    let (code, out, err) = run("cortex", &["wait", "pid", &pid], &[]);
    assert_eq!(code, 0, "{err}");
    let payload: Value = serde_json::from_str(out.trim()).expect("payload");
    assert_eq!(payload["already_gone"], true, "{payload}");

    let (code, out, err) = run("cortex", &["wait", "pid", &pid, "--must-exist"], &[]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(out, "", "nothing fired");
    assert_eq!(
        err.trim(),
        format!(
            "cortex: pid {pid} is not running (no such process, or it has already ended); --must-exist refuses a pid that is not alive when the wait is armed"
        )
    );

    // A live process is armed as ever, and its exit fires without already_gone.
    let mut sleep = Command::new("sleep")
        .arg("0.5")
        .spawn()
        .expect("spawn sleep");
    let live = sleep.id().to_string();
    let (code, out, err) = run(
        "cortex",
        &["wait", "pid", &live, "--must-exist", "--timeout", "60s"],
        &[],
    );
    let _ = sleep.wait();
    assert_eq!(code, 0, "{err}");
    let payload: Value = serde_json::from_str(out.trim()).expect("payload");
    assert_eq!(payload["already_gone"], false, "{payload}");
}

#[test]
fn an_unknown_device_is_refused_in_one_line() {
    let hub = Hub::start();
    let sid = hub.session();
    let line = "cortex: no device named gpu9 (cortex devices lists them)\n";
    let (code, out, err) = hub.cortex(&[
        "wait",
        "create",
        "--session",
        &sid,
        "--label",
        "l",
        "--intent",
        "i",
        "--device",
        "gpu9",
    ]);
    assert_eq!((code, out.as_str(), err.as_str()), (2, "", line));
    let (_, v) = hub.api(
        Method::Get,
        &format!("/api/sessions/{sid}/waitpoints"),
        None,
    );
    assert_eq!(v["waitpoints"], json!([]), "nothing was armed");

    let (code, out, err) = hub.cortex(&["wait", "pid", "1", "--device", "gpu9"]);
    assert_eq!((code, out.as_str(), err.as_str()), (2, "", line));
}

#[test]
fn an_unreachable_hub_is_exit_2_for_every_command() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let url = format!("http://{closed}");
    for args in [
        &["sessions"][..],
        &["session", "new", "--title", "t"],
        &["session", "delete", "ses_1"],
        &["devices"],
        &[
            "wait",
            "create",
            "--session",
            "ses_1",
            "--label",
            "l",
            "--intent",
            "i",
        ],
        &["wait", "check", "wp_1"],
    ] {
        let mut full = vec!["--hub", url.as_str()];
        full.extend_from_slice(args);
        let (code, _, err) = run("cortex", &full, &[("CORTEX_WEBHOOK_TOKEN", "t")]);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("cannot reach the hub"), "{args:?}: {err}");
    }
}

/// Runs `cortex --hub <hub> ARGS` with stdout a pipe whose reader is already closed.
fn into_closed_pipe(hub: &Hub, args: &[&str]) -> (i32, String) {
    let (reader, writer): (OwnedFd, OwnedFd) = rustix::pipe::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(bin("cortex"))
        .arg("--hub")
        .arg(hub.url(""))
        .args(args)
        .env("CORTEX_WEBHOOK_TOKEN", &hub.token)
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .expect("run cortex");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn a_closed_pipe_ends_quietly_with_0() {
    let hub = Hub::start();
    let sid = hub.session();
    for i in 0..3 {
        let (code, _, err) = hub.cortex(&["session", "say", &sid, &format!("line {i}")]);
        assert_eq!(code, 0, "{err}");
    }
    for args in [
        &["sessions"][..],
        &["session", "events", &sid],
        &["--json", "session", "events", &sid],
    ] {
        let (code, err) = into_closed_pipe(&hub, args);
        assert_eq!((code, err.as_str()), (0, ""), "{args:?}");
    }
    // And as a shell pipeline reading one line: head's status and cortex's both 0.
    let script = format!(
        "'{}' --hub '{}' session events {sid} | head -1 >/dev/null; echo \"${{PIPESTATUS[0]}}\"",
        bin("cortex").display(),
        hub.url("")
    );
    let out = Command::new("bash")
        .args(["-c", &script])
        .env("CORTEX_WEBHOOK_TOKEN", &hub.token)
        .output()
        .expect("bash");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn a_wrong_token_says_its_hint_once() {
    let hub = Hub::start();
    let (code, _, err) = run(
        "cortex",
        &["--hub", &hub.url(""), "sessions"],
        &[("CORTEX_WEBHOOK_TOKEN", "wrong")],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("refused the operator token"), "{err}");
    assert_eq!(err.matches("CORTEX_WEBHOOK_TOKEN").count(), 1, "{err}");
    assert_eq!(err.matches("hub/token").count(), 1, "{err}");
}

#[test]
fn wait_check_shows_signals_wakes_and_badges() {
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "train", "intent": "compare", "members": ["a", "b"], "quorum": 1}),
    );
    let id = wp["id"].as_str().unwrap();
    for (member, message) in [("a", "epoch 1"), ("b", "epoch 2")] {
        let st = hub.signal(&body(
            &wp,
            json!({"status": "progress", "member": member, "message": message}),
        ));
        assert_eq!(st.0, 202, "{}", st.1);
    }
    let (code, out, err) = hub.cortex(&["wait", "check", id]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("0/1 +2 progress"), "{out}");
    assert!(
        out.contains("signals:\n  STATUS    MEMBER  SOURCE  AT"),
        "{out}"
    );
    assert!(out.contains("  progress  b       http    "), "{out}");
    assert!(out.contains("epoch 2"), "{out}");
    assert!(out.contains("wakes: none yet"), "{out}");
    assert!(out.contains("badges: 0 of 12 wakes this hour"), "{out}");

    assert_eq!(
        hub.signal(&body(&wp, json!({"member": "a", "message": "done"})))
            .0,
        202
    );
    hub.wait_wake(&sid, id, 1, std::time::Duration::from_secs(20));
    let (_, out, _) = hub.cortex(&["wait", "check", id]);
    assert!(out.contains("  ok        a       http    "), "{out}");
    assert!(out.contains("wakes:\n  REASON  AT"), "{out}");
    assert!(out.contains("  fired   "), "{out}");
    assert!(out.contains("badges: 1 of 12 wakes this hour"), "{out}");
}

#[test]
fn bare_remote_waits_share_one_default_session_that_survives_its_deletion() {
    let hub = Hub::start();
    let token = hub.add_device("gpu1");
    let _agent = Agent::start(&hub, "gpu1", &token);
    hub.wait_online("gpu1");
    let session_of = |out: &str| -> String {
        let printed: Value = serde_json::from_str(out.trim()).expect("the payload");
        hub.get_waitpoint(printed["waitpoint"].as_str().unwrap())["session"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let mut sids = Vec::new();
    for _ in 0..2 {
        let (code, out, err) = cortex_as(&hub, &["wait", "pid", &gone_pid(), "--device", "gpu1"]);
        assert_eq!(code, 0, "{err}");
        sids.push(session_of(&out));
    }
    assert_eq!(sids[0], sids[1], "one session for both");
    let (_, list) = hub.api(Method::Get, "/api/sessions", None);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["title"], "cortex waits (ada)");
    // A script's session: a mailbox, which no model ever runs.
    assert_eq!(list[0]["runs"], false, "{list:?}");

    // The CLI deletes it; the next bare wait makes a new one with the same title.
    let (code, out, err) = hub.cortex(&["session", "delete", &sids[0]]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("deleted session {}", sids[0])),
        "{out}"
    );
    let (st, _) = hub.api(Method::Get, &format!("/api/sessions/{}", sids[0]), None);
    assert_eq!(st, 404);
    let (code, out, err) = cortex_as(&hub, &["wait", "pid", &gone_pid(), "--device", "gpu1"]);
    assert_eq!(code, 0, "{err}");
    let again = session_of(&out);
    assert_ne!(again, sids[0]);
    let (_, list) = hub.api(Method::Get, "/api/sessions", None);
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");

    // --must-exist on a device: the agent finds the pid gone, and the wait breaks.
    let pid = gone_pid();
    let (code, out, err) = cortex_as(
        &hub,
        &["wait", "pid", &pid, "--device", "gpu1", "--must-exist"],
    );
    assert_eq!(code, 2, "{err}");
    assert_eq!(out, "");
    assert!(err.contains(&format!("pid {pid} is not running")), "{err}");
}

/// One rule counts a waitpoint's progress, and every view shows it: a barrier of three
/// where one member reported three times is 1/3 in `wait check` (its table and --json)
/// and in the API's view; a monitor says its wakes against max_signals.
#[test]
fn wait_check_counts_a_member_once_and_a_monitors_wakes() {
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "sweep", "intent": "compare", "members": ["a", "b", "c"]}),
    );
    let id = wp["id"].as_str().unwrap();
    for i in 0..3 {
        let st = hub.signal(&body(
            &wp,
            json!({"status": "ok", "member": "a", "message": format!("try {i}")}),
        ));
        assert_eq!(st.0, 202, "{}", st.1);
    }
    let (code, out, err) = hub.cortex(&["wait", "check", id]);
    assert_eq!(code, 0, "{err}");
    let row = out.lines().nth(1).unwrap_or_default();
    assert!(row.contains("  1/3  "), "{out}");
    let (code, out, err) = hub.cortex(&["--json", "wait", "check", id]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(v["progress"]["received"], 1, "{v}");
    assert_eq!(v["progress"]["summary"], "1/3", "{v}");
    assert_eq!(hub.get_waitpoint(id)["progress"]["received"], 1);

    let mon = hub.waitpoint(
        &sid,
        json!({"label": "mon", "intent": "watch", "max_signals": 4}),
    );
    let mid = mon["id"].as_str().unwrap();
    for status in ["ok", "fail", "ok"] {
        let st = hub.signal(&body(&mon, json!({"status": status})));
        assert_eq!(st.0, 202, "{}", st.1);
    }
    hub.wait_wake(&sid, mid, 3, Duration::from_secs(10));
    let (code, out, err) = hub.cortex(&["wait", "check", "--session", &sid]);
    assert_eq!(code, 0, "{err}");
    let row = out.lines().find(|l| l.starts_with(mid)).unwrap_or_default();
    assert!(row.contains("3/4 wakes, 3 reports (1 failed)"), "{out}");
    assert!(!row.contains("3/1"), "{out}");
}
