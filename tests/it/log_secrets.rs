//! No token or secret in a daemon's log at any level: the real hub and device agent run at
//! `RUST_LOG=trace` (the websocket crates' own traces included, were they not clamped),
//! a device connects, forwards a spool file carrying its waitpoint's secret, and runs a
//! remote wait; neither stderr holds the device token, the operator token or a secret,
//! as text or as the hex a frame dump would print, and neither does the hub's `/metrics`.

// Fields of JSON the hub just answered with; a panic is the test failing.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::Duration;

use cortex_cli::http::Method;
use cortex_tests::agent::Agent;
use cortex_tests::{Hub, body, wait_until};
use serde_json::json;

const T: Duration = Duration::from_secs(20);

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The lines of `log` holding a secret (as text or hex), each with the secret's name.
fn leaks(log: &str, secrets: &[(&str, &str)]) -> Vec<String> {
    let mut found = Vec::new();
    for (name, s) in secrets {
        assert!(!s.is_empty(), "{name} is empty");
        let forms = [s.to_string(), hex(s)];
        for line in log.lines().filter(|l| forms.iter().any(|f| l.contains(f))) {
            found.push(format!("{name}: {line}"));
        }
    }
    found
}

#[test]
fn no_token_or_secret_reaches_either_log_at_trace() {
    let mut hub = Hub::start_with(&[("RUST_LOG", "trace")]);
    let token = hub.add_device("gpu1");
    let mut agent = Agent::new(&hub, "gpu1", &token);
    agent.set_env("RUST_LOG", "trace");
    agent.spawn();
    wait_until(T, "the device online", || {
        let (st, v) = hub.api(Method::Get, "/api/devices/gpu1", None);
        (st == 200 && v["state"] == "online").then_some(())
    });

    // A spool file on the device carrying its waitpoint's secret, forwarded and recorded.
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "job", "intent": "x", "device": "gpu1"}),
    );
    let spool = agent.spool();
    let file = body(&wp, json!({"status": "ok", "message": "done"})).to_string();
    std::fs::write(spool.join("job.tmp"), file).unwrap();
    std::fs::rename(spool.join("job.tmp"), spool.join("job.json")).unwrap();
    let wake = hub.wait_wake(&sid, wp["id"].as_str().unwrap(), 1, T);
    assert_eq!(wake["signals"][0]["source"], "device:gpu1", "{wake}");

    // The same secret's sibling through the HTTP route, for the hub's side.
    let other = hub.waitpoint(&sid, json!({"label": "http", "intent": "x"}));
    assert_eq!(hub.signal(&body(&other, json!({}))).0, 202);

    // A remote wait: a process on the device exits.
    let mut sleep = Command::new("sleep")
        .arg("3600")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let (st, remote) = hub.api(
        Method::Post,
        "/api/devices/gpu1/waits",
        Some(&json!({"kind": "pid", "pid": sleep.id(), "timeout_s": 600})),
    );
    assert_eq!(st, 201, "{remote}");
    let (rid, rsid) = (
        remote["id"].as_str().unwrap(),
        remote["session"].as_str().unwrap(),
    );
    wait_until(T, "the remote wait armed", || {
        let (_, d) = hub.api(Method::Get, "/api/devices/gpu1", None);
        d["wait_list"]
            .as_array()
            .and_then(|l| l.iter().find(|w| w["id"] == rid && w["state"] == "armed"))
            .map(|_| ())
    });
    let _ = sleep.kill();
    let _ = sleep.wait();
    let wake = hub.wait_wake(rsid, rid, 1, T);
    assert_eq!(wake["reason"], "fired", "{wake}");

    // The metrics, which need no token, carry none either.
    let metrics = cortex_cli::http::Request::new(Method::Get, &hub.url("/metrics"))
        .send()
        .unwrap()
        .text()
        .to_string();
    // The fleet as it stands: this device online on its one link, its pid wait armed.
    for series in [
        r#"cortex_devices{state="online"} 1"#,
        r#"cortex_devices{state="offline"} 0"#,
        "cortex_mesh_links 1",
        "cortex_mesh_links_opened_total 1",
        r#"cortex_remote_waits_armed_total{kind="pid"} 1"#,
        r#"cortex_signals_total{source="device:gpu1",result="accepted"} 1"#,
    ] {
        assert!(
            metrics.lines().any(|l| l == series),
            "no {series} in:\n{metrics}"
        );
    }

    assert!(agent.stop().success(), "{}", agent.log());
    assert!(hub.stop().success(), "{}", hub.log());
    let (agent_log, hub_log) = (agent.log(), hub.log());
    // The logs ran at trace: our own debug lines are there, so a leak would have been too.
    assert!(
        agent_log.contains("dialing the hub") && agent_log.contains("remote wait ended"),
        "the agent logged at debug level:\n{agent_log}"
    );
    assert!(
        hub_log.contains("arming a remote wait"),
        "the hub logged at debug level:\n{hub_log}"
    );
    let secrets = [
        ("device token", token.as_str()),
        ("operator token", hub.token.as_str()),
        ("waitpoint secret", wp["secret"].as_str().unwrap()),
        ("HTTP waitpoint's secret", other["secret"].as_str().unwrap()),
        ("remote wait's secret", remote["secret"].as_str().unwrap()),
    ];
    let (in_agent, in_hub) = (leaks(&agent_log, &secrets), leaks(&hub_log, &secrets));
    assert!(
        leaks(&metrics, &secrets).is_empty(),
        "secrets in /metrics:\n{metrics}"
    );
    assert!(
        in_agent.is_empty() && in_hub.is_empty(),
        "secrets in the agent's log:\n{}\n\nsecrets in the hub's log:\n{}",
        in_agent.join("\n"),
        in_hub.join("\n")
    );
}
