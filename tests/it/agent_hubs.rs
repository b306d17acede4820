//! The device agent given several hubs (`--hub` repeated, `CORTEX_HUB_URL` comma-separated):
//! a dead first URL costs no backoff before the live second is dialed; a hub killed under
//! a remote wait hands over to a standby hub on the same PostgreSQL database, which the
//! agent links to and through which the wait's wake arrives once; an outcome the agent
//! still holds (its report lost with the hub, or its ack) is reported again to the standby
//! and counted once; an empty or non-ws URL in the list is refused, named.

// Fields of JSON the hub just answered with; a panic is the test failing.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use cortex_cli::http::Method;
use cortex_tests::agent::Agent;
use cortex_tests::postgres::Postgres;
use cortex_tests::{Hub, dead_port, run, wait_until};
use serde_json::json;

use super::remote_waits::{Sleep, agent_forgot, device_wait_signals, wait_armed};

const T: Duration = Duration::from_secs(30);

/// A loopback mesh URL nothing listens on yet.
fn free_mesh_port() -> u16 {
    dead_port()
}

fn mesh_url(port: u16) -> String {
    format!("ws://127.0.0.1:{port}/mesh/v1")
}

/// A hub on the PostgreSQL database `store`, its mesh on `port`, with a home of its own.
/// A hub on `store` with its mesh on `port`; every hub here answers to one operator
/// token, as hubs sharing a database must.
fn hub_on(store: &str, port: u16) -> Hub {
    Hub::start_with_args(
        &[("CORTEX_WEBHOOK_TOKEN", "agent-hubs-shared-operator-token")],
        &[
            "--store",
            store,
            "--mesh-listen",
            &format!("127.0.0.1:{port}"),
        ],
    )
}

/// Waits until the agent's log says it linked to `url`, as the n-th link of its run.
fn wait_linked_to(agent: &Agent, url: &str, n: usize) {
    let line = format!("hub={url}");
    wait_until(T, &format!("the agent linked to {url}"), || {
        let log = agent.log();
        let count = log
            .lines()
            .filter(|l| l.contains("connected to the hub") && l.contains(&line))
            .count();
        (count >= n).then_some(())
    });
}

fn remote_pid_wait(hub: &Hub, name: &str, pid: u32) -> (String, String) {
    let (st, v) = hub.api(
        Method::Post,
        &format!("/api/devices/{name}/waits"),
        Some(&json!({"kind": "pid", "pid": pid, "timeout_s": 600.0})),
    );
    assert_eq!(st, 201, "{v}");
    (
        v["id"].as_str().unwrap().to_string(),
        v["session"].as_str().unwrap().to_string(),
    )
}

fn wakes_of(hub: &Hub, sid: &str, wp: &str) -> usize {
    hub.wakes(sid)
        .iter()
        .filter(|e| e["waitpoint"]["id"] == wp)
        .count()
}

#[test]
fn an_agent_whose_first_hub_is_dead_links_to_the_second_at_once() {
    let hub = Hub::start();
    let token = hub.add_device("gpu1");
    let dead = mesh_url(dead_port());
    let started = Instant::now();
    let agent = Agent::start_with_hubs(&hub, &[&dead, &hub.mesh_url], "gpu1", &token);
    hub.wait_online("gpu1");
    wait_linked_to(&agent, &hub.mesh_url, 1);
    let log = agent.log();
    assert!(log.contains(&format!("hub={dead}")), "{log}");
    assert!(log.contains("trying the next hub"), "{log}");
    // Straight on to the second: no backoff (its first ceiling is 1 s) between them.
    let refused = log
        .lines()
        .find(|l| l.contains("cannot reach the hub") && l.contains(&dead))
        .unwrap();
    assert!(refused.contains("retry_in=0.0s"), "{refused}");
    let connected = log
        .lines()
        .find(|l| l.contains("connected to the hub"))
        .unwrap();
    assert!(!connected.contains(&dead), "{connected}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert!(!log.contains(&token), "the token is never logged");
}

#[test]
fn the_hubs_may_come_comma_separated_in_cortex_hub_url() {
    let hub = Hub::start();
    let token = hub.add_device("gpu1");
    let dead = mesh_url(dead_port());
    let mut agent = Agent::new(&hub, "gpu1", &token);
    agent.set_hub_urls(&[]);
    agent.set_env("CORTEX_HUB_URL", &format!("{dead},{}", hub.mesh_url));
    agent.spawn();
    hub.wait_online("gpu1");
    wait_linked_to(&agent, &hub.mesh_url, 1);
}

#[test]
fn an_empty_or_non_websocket_hub_url_is_refused_by_name() {
    let live = "ws://127.0.0.1:1/mesh/v1";
    let (code, _, err) = run(
        "cortex-device-agent",
        &["--name", "gpu1"],
        &[
            (
                "CORTEX_HUB_URL",
                &format!("{live},,wss://b.example/mesh/v1"),
            ),
            ("CORTEX_DEVICE_TOKEN", "t0ken"),
        ],
    );
    assert_ne!(code, 0);
    assert!(err.contains("hub URL number 2 of 3 is empty"), "{err}");
    let (code, _, err) = run(
        "cortex-device-agent",
        &[
            "--hub",
            live,
            "--hub",
            "http://b.example:3002/mesh/v1",
            "--name",
            "gpu1",
        ],
        &[("CORTEX_DEVICE_TOKEN", "t0ken")],
    );
    assert_ne!(code, 0);
    assert!(err.contains("\"http://b.example:3002/mesh/v1\""), "{err}");
    assert!(err.contains("ws:// or wss://"), "{err}");
    assert!(!err.contains("t0ken"), "{err}");
}

/// Hub A on a fresh database with device gpu1, and the port hub B will take.
struct Pair {
    store: String,
    a: Hub,
    port_b: u16,
    token: String,
}

fn pair() -> Pair {
    let pg = Postgres::shared();
    let store = pg.url(&pg.database());
    let a = hub_on(&store, free_mesh_port());
    let token = a.add_device("gpu1");
    Pair {
        store,
        a,
        port_b: free_mesh_port(),
        token,
    }
}

#[test]
fn a_hub_killed_under_a_remote_wait_hands_over_to_a_standby_on_the_same_store() {
    let Pair {
        store,
        mut a,
        port_b,
        token,
    } = pair();
    let url_b = mesh_url(port_b);
    let agent = Agent::start_with_hubs(&a, &[&a.mesh_url.clone(), &url_b], "gpu1", &token);
    a.wait_online("gpu1");
    wait_linked_to(&agent, &a.mesh_url, 1);
    let mut sleep = Sleep::start();
    let (wp, sid) = remote_pid_wait(&a, "gpu1", sleep.pid());
    wait_armed(&a, "gpu1", &wp);

    a.kill();
    // Only once A is gone may another hub run on its database.
    let b = hub_on(&store, port_b);
    wait_linked_to(&agent, &url_b, 1);
    wait_until(T, "gpu1 online on hub B", || {
        (b.device("gpu1")["state"] == "online").then_some(())
    });
    wait_armed(&b, "gpu1", &wp);

    sleep.kill();
    b.wait_wake(&sid, &wp, 1, T);
    wait_until(T, "the agent to forget the wait", || {
        agent_forgot(&agent, &wp).then_some(())
    });
    assert_eq!(wakes_of(&b, &sid, &wp), 1);
    assert_eq!(device_wait_signals(&b, &wp).len(), 1);
    assert!(!agent.log().contains(&token), "the token is never logged");
}

#[test]
fn an_outcome_in_flight_when_its_hub_dies_is_reported_to_the_standby_once() {
    let Pair {
        store,
        mut a,
        port_b,
        token,
    } = pair();
    let url_b = mesh_url(port_b);
    let mut agent = Agent::start_with_hubs(&a, &[&a.mesh_url.clone(), &url_b], "gpu1", &token);
    a.wait_online("gpu1");
    let mut sleep = Sleep::start();
    let (wp, sid) = remote_pid_wait(&a, "gpu1", sleep.pid());
    wait_armed(&a, "gpu1", &wp);

    // Hub A frozen: the agent's report of the exit reaches no hub, and no ack comes back.
    let pid = rustix::process::Pid::from_raw(a.pid().unwrap() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    sleep.kill();
    wait_until(T, "the outcome saved by the agent", || {
        let f = agent.saved_waits();
        f["outbox"]
            .as_array()
            .is_some_and(|o| o.iter().any(|w| w["id"] == wp))
            .then_some(())
    });
    // The agent too dies: what it saved is all that is left of the outcome.
    agent.kill();
    a.kill();

    let b = hub_on(&store, port_b);
    agent.spawn();
    wait_linked_to(&agent, &url_b, 1);
    b.wait_wake(&sid, &wp, 1, T);
    wait_until(T, "the agent to forget the wait", || {
        agent_forgot(&agent, &wp).then_some(())
    });
    assert_eq!(wakes_of(&b, &sid, &wp), 1);
    let signals = device_wait_signals(&b, &wp);
    assert_eq!(signals.len(), 1, "{signals:?}");
}

#[test]
fn an_outcome_recorded_by_a_hub_whose_ack_was_lost_counts_once_at_the_standby() {
    let Pair {
        store,
        mut a,
        port_b,
        token,
    } = pair();
    let url_b = mesh_url(port_b);
    let mut agent = Agent::start_with_hubs(&a, &[&a.mesh_url.clone(), &url_b], "gpu1", &token);
    a.wait_online("gpu1");
    let mut sleep = Sleep::start();
    let (wp, sid) = remote_pid_wait(&a, "gpu1", sleep.pid());
    wait_armed(&a, "gpu1", &wp);
    sleep.kill();
    a.wait_wake(&sid, &wp, 1, T);
    wait_until(T, "the agent to forget the wait", || {
        agent_forgot(&agent, &wp).then_some(())
    });
    assert!(agent.stop().success());

    // The agent's file as it is when A recorded the outcome but its ack never arrived:
    // the outcome still held for the hub (the ack itself cannot be made to go missing on
    // cue, so the file is put back to the moment before it).
    let mut saved = agent.saved_waits();
    saved["outbox"] = json!([{
        "id": wp,
        "outcome": "fired",
        "payload": json!({"pid": sleep.pid()}).to_string(),
        "message": format!("pid {} exited", sleep.pid()),
    }]);
    std::fs::write(
        agent.home.join("agent/waits.json"),
        serde_json::to_vec(&saved).unwrap(),
    )
    .unwrap();
    a.kill();

    let b = hub_on(&store, port_b);
    agent.spawn();
    wait_linked_to(&agent, &url_b, 1);
    // B's store has the outcome and no active wait under that id: it answers the held
    // id (a cancel, or an ack of the report sent again), and records nothing new.
    wait_until(T, "the agent to forget the outcome B answered", || {
        agent_forgot(&agent, &wp).then_some(())
    });
    assert_eq!(wakes_of(&b, &sid, &wp), 1);
    assert_eq!(device_wait_signals(&b, &wp).len(), 1);
}
