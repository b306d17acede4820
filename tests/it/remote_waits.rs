//! Remote waits end to end: the real hub, the real `cortex-device-agent`, real `sleep`
//! processes. A pid wait fires when its process is killed and wakes the session (source
//! `device-wait`); `cortex wait pid --device` exits 0 on the exit, 1 on its timeout, 2 when
//! the device stays offline past the bound; the agent SIGKILLed mid-wait re-arms and
//! fires once (also when the pid exits while it is down); a wait asked of an offline
//! device fires once it connects; the hub SIGKILLed while outcomes arrive records each
//! once after it returns; `cortex devices` counts the active waits; cancelling the
//! waitpoint cancels the agent's wait; refusals say why.

// Fields of JSON the hub just answered with; a panic is the test failing.
#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cortex_cli::http::Method;
use cortex_tests::agent::Agent;
use cortex_tests::sim::{Options, SimDevice};
use cortex_tests::{Hub, bin, wait_until};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(20);

/// A `sleep 3600`, killed and reaped when dropped (the other remote and log wait tests
/// use it too).
pub(crate) struct Sleep(Child);

impl Sleep {
    pub(crate) fn start() -> Sleep {
        Sleep(
            Command::new("sleep")
                .arg("3600")
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn sleep"),
        )
    }

    pub(crate) fn pid(&self) -> u32 {
        self.0.id()
    }

    pub(crate) fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    pub(crate) fn alive(&mut self) -> bool {
        self.0.try_wait().expect("try_wait").is_none()
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.kill();
    }
}

fn listed_waits(hub: &Hub, name: &str) -> u64 {
    let (st, v) = hub.api(Method::Get, "/api/devices", None);
    assert_eq!(st, 200, "{v}");
    v.as_array()
        .and_then(|a| a.iter().find(|d| d["name"] == name))
        .and_then(|d| d["waits"].as_u64())
        .expect("listed with waits")
}

pub(crate) fn wait_armed(hub: &Hub, name: &str, wp: &str) -> Value {
    wait_until(T, "the wait armed on the device", || {
        let d = hub.device(name);
        d["wait_list"]
            .as_array()
            .and_then(|l| l.iter().find(|w| w["id"] == wp && w["state"] == "armed"))
            .cloned()
    })
}

fn remote_pid_wait(hub: &Hub, name: &str, pid: u32, timeout_s: f64) -> Value {
    let (st, v) = hub.api(
        Method::Post,
        &format!("/api/devices/{name}/waits"),
        Some(&json!({"kind": "pid", "pid": pid, "timeout_s": timeout_s})),
    );
    assert_eq!(st, 201, "{v}");
    v
}

/// The device-wait signals recorded on a waitpoint.
pub(crate) fn device_wait_signals(hub: &Hub, wp: &str) -> Vec<Value> {
    hub.get_waitpoint(wp)["signals"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["source"] == "device-wait")
        .cloned()
        .collect()
}

pub(crate) fn outcome_of(signal: &Value) -> String {
    let data: Value = serde_json::from_str(signal["data"].as_str().unwrap()).unwrap();
    data["outcome"].as_str().unwrap().to_string()
}

/// The agent forgot the wait: not armed, no outcome waiting for an ack.
pub(crate) fn agent_forgot(agent: &Agent, wp: &str) -> bool {
    let f = agent.saved_waits();
    let has = |k: &str| {
        f[k].as_array()
            .is_some_and(|a| a.iter().any(|w| w["id"] == wp))
    };
    !f.is_null() && !has("waits") && !has("outbox")
}

#[test]
fn a_remote_pid_wait_fires_when_its_process_is_killed_and_wakes_the_session() {
    let hub = Hub::start();
    let token = hub.add_device("gpu1");
    let agent = Agent::start(&hub, "gpu1", &token);
    hub.wait_online("gpu1");
    let d = hub.device("gpu1");
    assert_eq!(d["waits"], 0);
    assert_eq!(d["wait_list"], json!([]));

    let mut sleep = Sleep::start();
    let created = remote_pid_wait(&hub, "gpu1", sleep.pid(), 600.0);
    let wp = created["id"].as_str().unwrap().to_string();
    let sid = created["session"].as_str().unwrap().to_string();
    assert_eq!(created["device"], "gpu1");
    assert_eq!(created["max_signals"], 1);
    assert_eq!(created["wait"]["kind"], "pid");
    assert_eq!(created["wait"]["pid"], sleep.pid());
    assert_eq!(created["label"], format!("pid {} on gpu1", sleep.pid()));
    let (_, s) = hub.api(Method::Get, &format!("/api/sessions/{sid}"), None);
    assert_eq!(s["title"], format!("wait pid {} on gpu1", sleep.pid()));

    let w = wait_armed(&hub, "gpu1", &wp);
    assert_eq!(w["captured"]["comm"], "sleep", "{w}");
    assert_eq!(listed_waits(&hub, "gpu1"), 1);
    let (code, out, err) = hub.cortex(&["devices"]);
    assert_eq!(code, 0, "{err}");
    let row = out.lines().find(|l| l.starts_with("gpu1")).expect("a row");
    let at = out
        .lines()
        .next()
        .and_then(|h| h.find("WAITS"))
        .expect("a WAITS column");
    assert_eq!(
        row.get(at..).and_then(|c| c.split_whitespace().next()),
        Some("1"),
        "the WAITS column: {out}"
    );

    sleep.kill();
    let wake = hub.wait_wake(&sid, &wp, 1, T);
    assert_eq!(wake["reason"], "fired", "{wake}");
    let sig = &wake["signals"][0];
    assert_eq!(sig["source"], "device-wait");
    assert_eq!(sig["status"], "ok");
    assert_eq!(sig["key"], format!("device-wait:{wp}"));
    assert_eq!(
        sig["message"],
        format!("pid {} (sleep) exited", sleep.pid())
    );
    assert_eq!(outcome_of(sig), "fired");
    assert!(wake["text"].as_str().unwrap().contains("exited"), "{wake}");

    wait_until(T, "the agent's outcome acknowledged", || {
        agent_forgot(&agent, &wp).then_some(())
    });
    assert_eq!(listed_waits(&hub, "gpu1"), 0);
    assert_eq!(device_wait_signals(&hub, &wp).len(), 1);
    assert_eq!(hub.wakes(&sid).len(), 1);
}

#[test]
fn cortex_wait_pid_device_exits_0_on_the_exit_and_1_on_its_timeout() {
    let hub = Hub::start();
    let token = hub.add_device("gpu1");
    let _agent = Agent::start(&hub, "gpu1", &token);
    hub.wait_online("gpu1");
    let url = format!("http://{}", hub.addr);

    let mut sleep = Sleep::start();
    let pid = sleep.pid().to_string();
    let child = Command::new(bin("cortex"))
        .args(["wait", "pid", &pid, "--device", "gpu1", "--timeout", "10m"])
        .env("CORTEX_HUB", &url)
        .env("CORTEX_WEBHOOK_TOKEN", &hub.token)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cortex");
    let armed = wait_until(T, "the wait armed", || {
        hub.device("gpu1")["wait_list"]
            .as_array()
            .and_then(|l| l.iter().find(|w| w["state"] == "armed").cloned())
    });
    assert_eq!(armed["pid"], sleep.pid());
    sleep.kill();
    let out = child.wait_with_output().expect("cortex ends");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one armed line: {stderr}");
    assert!(
        stderr.contains(&format!("waiting on gpu1 for pid {pid} to exit")),
        "{stderr}"
    );
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    // What `cortex wait pid` on this machine prints: the payload, not the wake.
    let printed: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(printed["pid"], sleep.pid(), "{printed}");
    assert_eq!(printed["device"], "gpu1", "{printed}");
    assert!(printed.get("signals").is_none(), "not the wake: {printed}");
    let wp = printed["waitpoint"].as_str().expect("the waitpoint's id");
    assert_eq!(
        hub.get_waitpoint(wp)["signals"][0]["source"],
        "device-wait",
        "{printed}"
    );

    // The bound passes with the process still running: 1, and stderr says so.
    let still = Sleep::start();
    let (code, stdout, stderr) = hub.cortex(&[
        "wait",
        "pid",
        &still.pid().to_string(),
        "--device",
        "gpu1",
        "--timeout",
        "1s",
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("timed out after 1s"), "{stderr}");
    assert!(stderr.contains("still running"), "{stderr}");
    assert_eq!(
        stdout, "",
        "a wait that did not fire prints nothing on stdout"
    );

    // A bad request is a broken wait (2), with the hub's reason.
    let (code, _, stderr) = hub.cortex(&[
        "wait",
        "flock",
        "rel/lock",
        "--device",
        "gpu1",
        "--timeout",
        "1s",
    ]);
    assert_eq!(code, 2);
    assert!(stderr.contains("absolute path"), "{stderr}");
    let (code, _, stderr) =
        hub.cortex(&["wait", "pid", "1", "--device", "nosuch", "--timeout", "1s"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("no device"), "{stderr}");
}

#[test]
fn the_agent_killed_mid_wait_re_arms_and_the_wait_fires_once() {
    let hub = Hub::start();
    let token = hub.add_device("gpu1");
    let mut agent = Agent::start(&hub, "gpu1", &token);
    hub.wait_online("gpu1");

    // Killed and restarted while the process runs.
    let mut sleep = Sleep::start();
    let a = remote_pid_wait(&hub, "gpu1", sleep.pid(), 600.0);
    let a_id = a["id"].as_str().unwrap().to_string();
    let a_st = wait_armed(&hub, "gpu1", &a_id)["captured"]["start_time"].clone();
    // The wait is on disk before the kill, pinned to the process's start time.
    wait_until(T, "the wait saved by the agent", || {
        agent.saved_waits()["waits"]
            .as_array()
            .and_then(|l| l.iter().find(|w| w["id"] == a_id))
            .map(|w| w["spec"]["start_time"].clone())
            .filter(|st| *st == a_st)
    });
    agent.kill();
    agent.spawn();
    wait_until(T, "the agent back, holding the wait", || {
        agent.log().contains("remote waits restored").then_some(())
    });
    hub.wait_online("gpu1");
    assert_eq!(
        hub.device_wait_state("gpu1", &a_id).as_deref(),
        Some("armed")
    );
    sleep.kill();
    let sid = a["session"].as_str().unwrap();
    let wake = hub.wait_wake(sid, &a_id, 1, T);
    assert_eq!(wake["reason"], "fired", "{wake}");
    wait_until(T, "acknowledged", || {
        agent_forgot(&agent, &a_id).then_some(())
    });
    assert_eq!(device_wait_signals(&hub, &a_id).len(), 1, "once");
    assert_eq!(hub.wakes(sid).len(), 1, "one wake");

    // The process exits while the agent is down: it fires at once on the restart, once.
    let mut sleep = Sleep::start();
    let b = remote_pid_wait(&hub, "gpu1", sleep.pid(), 600.0);
    let b_id = b["id"].as_str().unwrap().to_string();
    wait_armed(&hub, "gpu1", &b_id);
    wait_until(T, "the wait saved by the agent", || {
        agent.saved_waits()["waits"]
            .as_array()
            .is_some_and(|l| l.iter().any(|w| w["id"] == b_id))
            .then_some(())
    });
    agent.kill();
    sleep.kill();
    agent.spawn();
    let sid = b["session"].as_str().unwrap();
    let wake = hub.wait_wake(sid, &b_id, 1, T);
    assert_eq!(wake["reason"], "fired", "{wake}");
    let msg = wake["signals"][0]["message"].as_str().unwrap();
    assert!(
        msg.contains("already"),
        "said it was gone at the re-arm: {msg}"
    );
    wait_until(T, "acknowledged", || {
        agent_forgot(&agent, &b_id).then_some(())
    });
    assert_eq!(device_wait_signals(&hub, &b_id).len(), 1, "once");
    assert_eq!(hub.wakes(sid).len(), 1, "one wake");
    assert_eq!(listed_waits(&hub, "gpu1"), 0);
}

#[test]
fn the_hub_killed_while_outcomes_arrive_records_each_once_after_it_returns() {
    // The hub comes back on the same mesh address, chosen at run time.
    let mesh = format!("127.0.0.1:{}", cortex_tests::dead_port());
    let mut hub = Hub::start_with_args(&[], &["--mesh-listen", &mesh]);
    let token = hub.add_device("gpu1");
    let agent = Agent::start(&hub, "gpu1", &token);
    hub.wait_online("gpu1");
    let mut sleeps: Vec<Sleep> = (0..40).map(|_| Sleep::start()).collect();
    let waits: Vec<(String, String)> = sleeps
        .iter()
        .map(|s| {
            let c = remote_pid_wait(&hub, "gpu1", s.pid(), 600.0);
            let field = |k: &str| c[k].as_str().unwrap().to_string();
            (field("id"), field("session"))
        })
        .collect();
    for (id, _) in &waits {
        wait_armed(&hub, "gpu1", id);
    }
    // Every process ends, and the hub is SIGKILLed while their outcomes arrive: some
    // acknowledged from the journal, some written early and not yet answered, some not
    // yet read. The agent sends again what was not acknowledged.
    for s in &mut sleeps {
        s.kill();
    }
    std::thread::sleep(Duration::from_millis(2));
    hub.kill();
    hub.spawn();
    hub.wait_online("gpu1");
    for (id, sid) in &waits {
        let wake = hub.wait_wake(sid, id, 1, T);
        assert_eq!(wake["reason"], "fired", "{wake}");
    }
    wait_until(T, "every outcome acknowledged", || {
        waits
            .iter()
            .all(|(id, _)| agent_forgot(&agent, id))
            .then_some(())
    });
    for (id, sid) in &waits {
        assert_eq!(device_wait_signals(&hub, id).len(), 1, "once: {id}");
        assert_eq!(hub.wakes(sid).len(), 1, "one wake: {id}");
    }
    assert_eq!(listed_waits(&hub, "gpu1"), 0);
}

#[test]
fn a_wait_asked_of_an_offline_device_fires_after_it_connects() {
    let hub = Hub::start();
    let token = hub.add_device("gpu1");
    let mut agent = Agent::new(&hub, "gpu1", &token);

    let mut sleep = Sleep::start();
    let created = remote_pid_wait(&hub, "gpu1", sleep.pid(), 600.0);
    let wp = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["wait"]["state"], "pending");
    assert_eq!(hub.device("gpu1")["state"], "offline");
    assert_eq!(
        listed_waits(&hub, "gpu1"),
        1,
        "counted while it waits to go"
    );
    assert_eq!(
        hub.device_wait_state("gpu1", &wp).as_deref(),
        Some("pending")
    );

    agent.spawn();
    wait_armed(&hub, "gpu1", &wp);
    sleep.kill();
    let sid = created["session"].as_str().unwrap();
    let wake = hub.wait_wake(sid, &wp, 1, T);
    assert_eq!(wake["reason"], "fired", "{wake}");
    assert_eq!(wake["signals"][0]["source"], "device-wait");
    assert_eq!(device_wait_signals(&hub, &wp).len(), 1);
}

#[test]
fn a_bound_passing_while_the_device_is_offline_breaks_the_wait() {
    let hub = Hub::start();
    let token = hub.add_device("gpu1");
    let _agent = Agent::new(&hub, "gpu1", &token);
    let sleep = Sleep::start();
    // Offline, so nobody can say whether the process ended: broke (2), not timed out,
    // which would claim nothing happened.
    let (code, stdout, stderr) = hub.cortex(&[
        "wait",
        "pid",
        &sleep.pid().to_string(),
        "--device",
        "gpu1",
        "--timeout",
        "1s",
    ]);
    assert_eq!(code, 2, "{stderr}");
    let mut lines = stderr.lines();
    let armed = lines.next().unwrap_or_default();
    assert!(
        armed.contains("gpu1 is offline and gets the wait when it reconnects"),
        "{stderr}"
    );
    let why = lines.next().unwrap_or_default();
    assert!(why.contains("was offline when the bound of 1"), "{stderr}");
    assert_eq!(stdout, "", "a broken wait prints nothing on stdout");
    assert_eq!(listed_waits(&hub, "gpu1"), 0);
}

#[test]
fn cancelling_the_waitpoint_cancels_the_agents_wait() {
    let hub = Hub::start();
    let token = hub.add_device("gpu1");
    let agent = Agent::start(&hub, "gpu1", &token);
    hub.wait_online("gpu1");
    let mut sleep = Sleep::start();
    let created = remote_pid_wait(&hub, "gpu1", sleep.pid(), 600.0);
    let wp = created["id"].as_str().unwrap().to_string();
    wait_armed(&hub, "gpu1", &wp);
    wait_until(T, "the wait saved by the agent", || {
        agent.saved_waits()["waits"]
            .as_array()
            .is_some_and(|l| l.iter().any(|w| w["id"] == wp))
            .then_some(())
    });

    let (st, v) = hub.api(Method::Delete, &format!("/api/waitpoints/{wp}"), None);
    assert_eq!(st, 200, "{v}");
    wait_until(T, "the agent dropped the wait", || {
        agent_forgot(&agent, &wp).then_some(())
    });
    assert_eq!(listed_waits(&hub, "gpu1"), 0);
    sleep.kill();
    let v = hub.get_waitpoint(&wp);
    assert_eq!(v["state"], "cancelled");
    assert_eq!(
        v["signal_count"], 0,
        "nothing reported for a cancelled wait"
    );
    assert!(agent.log().contains("remote wait cancelled by the hub"));
}

#[test]
fn refusals_say_why() {
    let hub = Hub::start();
    let token = hub.add_device("old");
    let post = |name: &str, body: Value| {
        hub.api(
            Method::Post,
            &format!("/api/devices/{name}/waits"),
            Some(&body),
        )
    };
    let (st, v) = post("nosuch", json!({"kind": "pid", "pid": 1}));
    assert_eq!(st, 404, "{v}");
    let (st, v) = post("old", json!({"kind": "file", "path": "relative.txt"}));
    assert_eq!(st, 400, "{v}");
    assert!(v["message"].as_str().unwrap().contains("absolute"), "{v}");
    let (st, v) = post("old", json!({"kind": "pid"}));
    assert_eq!(st, 400, "{v}");
    let (st, v) = post("old", json!({"kind": "socket", "path": "/x"}));
    assert_eq!(st, 400, "{v}");
    let (st, v) = post("old", json!({"kind": "pid", "pid": 1, "timeout_s": 0}));
    assert_eq!(st, 400, "{v}");
    let (st, v) = post(
        "old",
        json!({"kind": "pid", "pid": 1, "session": "ses_nope"}),
    );
    assert_eq!(st, 404, "{v}");

    // An online agent that does not announce wait-pid (an older one) is refused at once.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let _dev = rt
        .block_on(SimDevice::connect(&Options::new(
            &hub.mesh_url,
            "old",
            &token,
        )))
        .expect("connect");
    let (st, v) = post("old", json!({"kind": "pid", "pid": 1}));
    assert_eq!(st, 409, "{v}");
    assert!(v["message"].as_str().unwrap().contains("wait-pid"), "{v}");
}

/// `cortex wait pid N --device D --must-exist` with N not running on the device: the agent
/// breaks the wait, so the hub records `broke` (a `fail` signal), the session's wake says
/// it broke, and the command exits 2. A live pid with the flag arms and fires as usual,
/// and an agent that does not announce must-exist is never sent such a wait.
#[test]
fn must_exist_on_a_device_breaks_the_wait_for_a_pid_not_running_there() {
    let hub = Hub::start();
    let token = hub.add_device("gpu1");
    let agent = Agent::start(&hub, "gpu1", &token);
    hub.wait_online("gpu1");
    let sid = hub.session();

    let mut child = Command::new("true").spawn().expect("spawn true");
    let gone = child.id().to_string();
    child.wait().expect("reap true");
    let (code, stdout, stderr) = hub.cortex(&[
        "wait",
        "pid",
        &gone,
        "--device",
        "gpu1",
        "--must-exist",
        "--session",
        &sid,
        "--timeout",
        "1m",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!("pid {gone} is not running")),
        "{stderr}"
    );
    assert_eq!(stdout, "", "nothing printed for a wait that did not fire");
    let wakes = hub.wakes(&sid);
    assert_eq!(wakes.len(), 1, "{wakes:?}");
    let wp = wakes[0]["waitpoint"]["id"].as_str().unwrap().to_string();
    let signals = device_wait_signals(&hub, &wp);
    assert_eq!(signals.len(), 1, "{signals:?}");
    assert_eq!(outcome_of(&signals[0]), "broke", "{signals:?}");
    assert_eq!(signals[0]["status"], "fail");
    let heard = hub.wait_wake(&sid, &wp, 1, T);
    assert_ne!(heard["reason"], "fired", "{heard}");
    assert_eq!(outcome_of(&heard["signals"][0]), "broke", "{heard}");
    assert!(
        heard["signals"][0]["message"]
            .as_str()
            .unwrap()
            .contains("is not running"),
        "{heard}"
    );
    assert_eq!(listed_waits(&hub, "gpu1"), 0);

    // A running pid with the flag: armed, saved without it (a re-arm after a restart
    // follows the process it found), and fired by the exit.
    let mut sleep = Sleep::start();
    let (st, v) = hub.api(
        Method::Post,
        "/api/devices/gpu1/waits",
        Some(&json!({"kind": "pid", "pid": sleep.pid(), "must_exist": true, "session": sid})),
    );
    assert_eq!(st, 201, "{v}");
    let live = v["id"].as_str().unwrap().to_string();
    wait_armed(&hub, "gpu1", &live);
    let saved = wait_until(T, "the wait saved by the agent", || {
        agent.saved_waits()["waits"]
            .as_array()
            .and_then(|l| l.iter().find(|w| w["id"] == live).cloned())
    });
    assert_eq!(saved["spec"].get("must_exist"), None, "{saved}");
    sleep.kill();
    let wake = hub.wait_wake(&sid, &live, 1, T);
    assert_eq!(wake["reason"], "fired", "{wake}");
    assert_eq!(outcome_of(&wake["signals"][0]), "fired");

    // An agent that runs pid waits but not must-exist (an older one) would fire: refused.
    let old = hub.add_device("old");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let mut hello = cortex_tests::sim::hello("old");
    hello.capabilities = vec!["spool".into(), "wait-pid".into()];
    let mut opts = Options::new(&hub.mesh_url, "old", &old);
    opts.hello = Some(hello);
    let _dev = rt.block_on(SimDevice::connect(&opts)).expect("connect");
    hub.wait_online("old");
    let (st, v) = hub.api(
        Method::Post,
        "/api/devices/old/waits",
        Some(&json!({"kind": "pid", "pid": 1, "must_exist": true})),
    );
    assert_eq!(st, 409, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("wait-pid-must-exist"),
        "{v}"
    );
}
