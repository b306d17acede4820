//! A device's token changing under a running agent, and the revocation's answers: the real
//! hub, the real `cortex-device-agent` and `cortex`. A refused agent reads its token file
//! again and says plainly what to do when that does not help (never the token); a new token
//! written there (a re-enrolment) is used without a restart; a second revoke says the
//! device is already revoked (exit 1) instead of answering as if it did something; a
//! revoked device is removed from the list, and only a revoked one.

// Fields of JSON the hub just answered with; a panic is the test failing.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use cortex_cli::http::Method;
use cortex_tests::agent::Agent;
use cortex_tests::{Hub, wait_until};
use serde_json::Value;

const T: Duration = Duration::from_secs(20);

fn listed(hub: &Hub, name: &str) -> Option<Value> {
    let (st, v) = hub.api(Method::Get, "/api/devices", None);
    assert_eq!(st, 200, "{v}");
    v.as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .cloned()
}

/// The hub refuses the token the agent started with; the agent says to enrol again and
/// write the new token to its file, then connects as soon as the file holds the right one
/// (the refusal's backoff and the hub's 60 s floor would keep it away far longer).
#[test]
fn a_refused_agent_reads_its_token_file_again_and_says_what_to_do() {
    let hub = Hub::start();
    let token = hub.add_device("gpu1");
    let wrong = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let agent = Agent::start(&hub, "gpu1", wrong);
    let log = wait_until(T, "the agent's refusal logged", || {
        let log = agent.log();
        log.contains("still holds the token the hub refuses")
            .then_some(log)
    });
    assert!(log.contains("cortex device add gpu1"), "{log}");
    assert!(log.contains("without a restart"), "{log}");
    assert!(!log.contains(wrong), "the token is never logged: {log}");
    assert_ne!(hub.device("gpu1")["state"], "online");

    agent.write_token(&token);
    wait_until(T, "the agent online with the new token", || {
        (hub.device("gpu1")["state"] == "online").then_some(())
    });
    let log = agent.log();
    assert!(log.contains("the token file holds a new token"), "{log}");
    assert!(!log.contains(&token), "the token is never logged: {log}");
}

/// Revoke, revoke again, enrol again with the agent running, then revoke and remove.
#[test]
fn revoking_twice_says_so_a_re_enrolment_needs_no_restart_and_a_revoked_device_is_removed() {
    let hub = Hub::start();
    let token = hub.add_device("gpu1");
    let agent = Agent::start(&hub, "gpu1", &token);
    hub.wait_online("gpu1");

    let (code, out, err) = hub.cortex(&["device", "revoke", "gpu1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("device gpu1 revoked"), "{out}");
    let (code, out, err) = hub.cortex(&["device", "revoke", "gpu1"]);
    assert_eq!(code, 1, "already revoked is not a success: {out} {err}");
    assert!(err.contains("already revoked"), "{err}");
    assert!(err.contains("nothing changed"), "{err}");
    assert!(err.contains("cortex device remove gpu1"), "{err}");
    assert!(!out.contains("revoked;"), "no claim that it revoked: {out}");
    let (st, v) = hub.api(Method::Delete, "/api/devices/gpu1", None);
    assert_eq!(
        (st, v["error"].as_str()),
        (409, Some("already_revoked")),
        "{v}"
    );
    wait_until(T, "the agent told it was revoked", || {
        agent
            .log()
            .contains("this device was revoked on the hub")
            .then_some(())
    });

    // Enrolled again; the new token written to the running agent's file is used.
    let (code, out, err) = hub.cortex(&["--json", "device", "add", "gpu1"]);
    assert_eq!(code, 0, "{err}");
    let added: Value = serde_json::from_str(out.trim()).expect("json");
    let fresh = added["token"].as_str().unwrap().to_string();
    assert_ne!(fresh, token);
    agent.write_token(&fresh);
    wait_until(T, "the agent back with the new token", || {
        (hub.device("gpu1")["state"] == "online").then_some(())
    });

    // Removing is for revoked devices only.
    let (code, _, err) = hub.cortex(&["device", "remove", "gpu1"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("revoke it first"), "{err}");
    assert_eq!(hub.device("gpu1")["state"], "online", "left alone");
    let (code, out, err) = hub.cortex(&["device", "revoke", "gpu1", "--remove"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("device gpu1 revoked"), "{out}");
    assert!(out.contains("device gpu1 removed from the list"), "{out}");
    assert_eq!(listed(&hub, "gpu1"), None);
    let (code, out, _) = hub.cortex(&["devices"]);
    assert_eq!(code, 0);
    assert!(!out.contains("gpu1"), "{out}");
    let (code, _, err) = hub.cortex(&["device", "remove", "gpu1"]);
    assert_eq!(code, 1);
    assert!(err.contains("no revoked device"), "{err}");

    // A plain `remove` of a revoked device, and `revoke --remove` of one already revoked.
    let other = hub.add_device("gpu2");
    drop(other);
    let (code, _, err) = hub.cortex(&["device", "revoke", "gpu2"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(listed(&hub, "gpu2").unwrap()["state"], "revoked");
    let (code, out, err) = hub.cortex(&["device", "revoke", "gpu2", "--remove"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("removed from the list"), "{out}");
    assert_eq!(listed(&hub, "gpu2"), None);
    hub.add_device("gpu3");
    let (code, _, err) = hub.cortex(&["device", "revoke", "gpu3"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = hub.cortex(&["device", "remove", "gpu3"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("device gpu3 removed from the list"), "{out}");
    assert_eq!(listed(&hub, "gpu3"), None);
}
