//! A device lost mid-wait, end to end: the real hub (its grace shortened through
//! settings.json `deviceLossGraceMs`), the real `cortex-device-agent`, a real `sleep`.
//! The agent SIGKILLed while a remote pid wait runs: past the grace the session holds one
//! `report` wake naming the device and saying the wait stays armed, and no second one
//! while it stays down; `cortex wait pid --device` keeps waiting through it; the process
//! exits while the agent is down, the agent comes back, and the real outcome (`fired`)
//! arrives once. An agent back within the grace is never reported. And a hub SIGKILLed as
//! the device starts a command, back before the agent: the session is told "state
//! unknown" with the exec id, never "nothing was started", and the one run is found once
//! the agent is back (or stays unknown past the grace, or after a cancel).

// Fields of JSON the hub just answered with; a panic is the test failing.
#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cortex_tests::agent::Agent;
use cortex_tests::{Hub, bin, wait_until};

use super::remote_waits::Sleep;
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

/// A hub whose device-loss grace is `grace_ms`, set in its settings.json.
fn hub_with_grace(grace_ms: u64) -> (Hub, tempfile::TempDir) {
    let tmp = tempfile::tempdir().expect("tmp");
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    std::fs::write(
        home.join("settings.json"),
        format!(r#"{{"deviceLossGraceMs": {grace_ms}}}"#),
    )
    .expect("settings.json");
    let mut hub = Hub::at(&home, &tmp.path().join("hub.log"), &[], &[]);
    hub.spawn();
    (hub, tmp)
}

/// `cortex wait pid PID --device NAME --timeout 10m`, running.
fn cortex_wait_pid(hub: &Hub, name: &str, pid: u32) -> Child {
    Command::new(bin("cortex"))
        .args(["wait", "pid", &pid.to_string(), "--device", name])
        .args(["--timeout", "10m"])
        .env("CORTEX_HUB", format!("http://{}", hub.addr))
        .env("CORTEX_WEBHOOK_TOKEN", &hub.token)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cortex")
}

/// The wait on `name` armed by its agent and saved to its disk: (waitpoint, session).
fn armed_and_saved(hub: &Hub, agent: &Agent, name: &str) -> (String, String) {
    let wp = wait_until(T, "the wait armed on the device", || {
        hub.device(name)["wait_list"]
            .as_array()
            .and_then(|l| l.iter().find(|w| w["state"] == "armed"))
            .and_then(|w| w["id"].as_str())
            .map(str::to_string)
    });
    wait_until(T, "the wait saved by the agent", || {
        agent.saved_waits()["waits"]
            .as_array()
            .is_some_and(|l| l.iter().any(|w| w["id"] == wp.as_str()))
            .then_some(())
    });
    let sid = hub.get_waitpoint(&wp)["session"]
        .as_str()
        .unwrap()
        .to_string();
    (wp, sid)
}

fn wakes_of(hub: &Hub, sid: &str, wp: &str) -> Vec<Value> {
    hub.wakes(sid)
        .into_iter()
        .filter(|w| w["waitpoint"]["id"] == wp)
        .collect()
}

#[test]
fn a_device_lost_past_the_grace_is_reported_once_and_the_outcome_still_arrives() {
    let grace = Duration::from_millis(1_500);
    let (hub, _tmp) = hub_with_grace(grace.as_millis() as u64);
    let token = hub.add_device("gpu1");
    let mut agent = Agent::start(&hub, "gpu1", &token);
    hub.wait_online("gpu1");

    let mut sleep = Sleep::start();
    let cortex = cortex_wait_pid(&hub, "gpu1", sleep.pid());
    let (wp, sid) = armed_and_saved(&hub, &agent, "gpu1");

    agent.kill();
    wait_until(T, "the device offline", || {
        (hub.device("gpu1")["state"] == "offline").then_some(())
    });
    let report = hub.wait_wake(&sid, &wp, 1, T);
    assert_eq!(report["reason"], "report", "{report}");
    assert_eq!(report["signals"], serde_json::json!([]), "not a signal");
    let text = report["text"].as_str().unwrap();
    assert!(
        text.contains("device gpu1 has been offline since"),
        "{text}"
    );
    assert!(text.contains("The wait stays armed"), "{text}");
    assert!(text.contains(&format!("pid {}", sleep.pid())), "{text}");
    // The waitpoint is as it was.
    let view = hub.get_waitpoint(&wp);
    assert_eq!(view["state"], "armed", "{view}");
    assert_eq!(view["signal_count"], 0, "{view}");
    assert_eq!(hub.device_wait_state("gpu1", &wp).as_deref(), Some("armed"));

    // Still down for twice the grace again: room for a second report, were one due.
    std::thread::sleep(2 * grace);
    assert_eq!(wakes_of(&hub, &sid, &wp).len(), 1, "said once");

    // The process exits while the agent is down; the agent comes back and re-arms.
    sleep.kill();
    agent.spawn();
    let wake = hub.wait_wake(&sid, &wp, 2, T);
    assert_eq!(wake["reason"], "fired", "{wake}");
    let sig = &wake["signals"][0];
    assert_eq!(sig["source"], "device-wait");
    let data: Value = serde_json::from_str(sig["data"].as_str().unwrap()).unwrap();
    assert_eq!(data["outcome"], "fired", "{data}");
    assert_eq!(data["device"], "gpu1");

    // `cortex wait pid --device` kept waiting through the report: it prints the outcome.
    let out = cortex.wait_with_output().expect("cortex ends");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let printed: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(printed["waitpoint"], wp.as_str(), "{printed}");
    assert_eq!(printed["device"], "gpu1", "{printed}");
    assert_eq!(stderr.lines().count(), 1, "only the armed line: {stderr}");

    let reasons: Vec<Value> = wakes_of(&hub, &sid, &wp)
        .iter()
        .map(|w| w["reason"].clone())
        .collect();
    assert_eq!(reasons, vec!["report", "fired"], "the outcome once");
    let signals = hub.get_waitpoint(&wp)["signals"].as_array().unwrap().len();
    assert_eq!(signals, 1);
}

#[test]
fn a_device_back_within_the_grace_is_never_reported() {
    let grace = Duration::from_secs(8);
    let (hub, _tmp) = hub_with_grace(grace.as_millis() as u64);
    let token = hub.add_device("gpu1");
    let mut agent = Agent::start(&hub, "gpu1", &token);
    hub.wait_online("gpu1");

    let mut sleep = Sleep::start();
    let cortex = cortex_wait_pid(&hub, "gpu1", sleep.pid());
    let (wp, sid) = armed_and_saved(&hub, &agent, "gpu1");

    agent.kill();
    let down = Instant::now();
    wait_until(T, "the device offline", || {
        (hub.device("gpu1")["state"] == "offline").then_some(())
    });
    agent.spawn();
    hub.wait_online("gpu1");
    let back_after = down.elapsed();
    // Past the time its report would have been due, were it still set.
    std::thread::sleep((grace + Duration::from_secs(1)).saturating_sub(back_after));
    assert!(
        wakes_of(&hub, &sid, &wp).is_empty(),
        "no report (the agent was back after {back_after:?}, the grace is {grace:?})"
    );

    sleep.kill();
    let wake = hub.wait_wake(&sid, &wp, 1, T);
    assert_eq!(wake["reason"], "fired", "{wake}");
    let out = cortex.wait_with_output().expect("cortex ends");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(wakes_of(&hub, &sid, &wp).len(), 1, "only the outcome");
}

/// A hub SIGKILLed as the device starts a command, and back before the device's agent
/// reconnects. The command's first act freezes the hub and the agent (SIGSTOP; their pids
/// in a file), so the agent's answer is never recorded and the agent stays away until the
/// test lets it go; then it marks its run.
struct Killed {
    hub: Hub,
    agent: Agent,
    sid: String,
    mark: std::path::PathBuf,
    /// What the restarted hub said first of the call.
    said: Value,
    _model: cortex_tests::scripted_model::ScriptedModel,
    _tmp: tempfile::TempDir,
}

/// A hub with a device's agent linked to it, the model it calls, and their directory.
pub type ExecHub = (
    Hub,
    Agent,
    cortex_tests::scripted_model::ScriptedModel,
    tempfile::TempDir,
);

/// A hub running [`super::device_exec::exec_model`] with `settings`, on a mesh address
/// it keeps across restarts, and an agent with `--allow-exec` linked to it.
fn exec_hub(settings: Value) -> ExecHub {
    exec_hub_with(super::device_exec::exec_model(), settings)
}

/// [`exec_hub`] with `model`.
pub fn exec_hub_with(
    model: cortex_tests::scripted_model::ScriptedModel,
    settings: Value,
) -> ExecHub {
    let tmp = tempfile::tempdir().expect("tmp");
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    std::fs::write(home.join("settings.json"), settings.to_string()).expect("settings");
    // The hub comes back on the same mesh address, where the agent reconnects.
    let (url, mesh) = (
        model.url(),
        format!("127.0.0.1:{}", cortex_tests::dead_port()),
    );
    let mut hub = Hub::at(
        &home,
        &tmp.path().join("hub.log"),
        &[
            ("CORTEX_LLM_BASE_URL", url.as_str()),
            ("CORTEX_LLM_MODEL", "scripted"),
        ],
        &["--mesh-listen", &mesh],
    );
    hub.spawn();
    let token = hub.add_device("gpu1");
    let mut agent = Agent::new(&hub, "gpu1", &token);
    agent.set_env("CORTEX_ALLOW_EXEC", "1");
    agent.spawn();
    hub.wait_online("gpu1");
    (hub, agent, model, tmp)
}

/// [`Killed`], with `settings` in the hub's settings.json; the hub is back, the agent
/// still frozen.
fn killed_as_it_starts(settings: Value) -> Killed {
    use serde_json::json;

    use super::runner::{new_session, say};

    let (mut hub, agent, model, tmp) = exec_hub(settings);
    // The freeze races the agent's answer; should the answer be recorded first (the hub
    // got it before the command froze it), that cycle proves nothing and another is run.
    for cycle in 0..5 {
        let pids = tmp.path().join("pids");
        let mark = tmp.path().join(format!("mark{cycle}"));
        std::fs::write(
            &pids,
            format!(
                "{} {}\n",
                hub.pid().expect("hub"),
                agent.pid().expect("agent")
            ),
        )
        .expect("pids");
        // Builtins only before the freeze: no fork the agent's answer could overtake.
        let script = format!(
            "read h a < {}; kill -STOP $h $a; echo run >> {}",
            pids.display(),
            mark.display()
        );
        let sid = new_session(&hub, json!({"policy": {"requireApproval": []}}));
        say(&hub, &sid, json!({"text": format!("exec: {script}")}));
        wait_until(T, "the command to start", || {
            std::fs::read_to_string(&mark)
                .ok()
                .filter(|m| !m.is_empty())
        });
        hub.kill();
        hub.spawn();
        // What the restarted hub says first of the call (today's code: "offline;
        // nothing was started"), or its answer recorded before the freeze.
        let said = wait_until(T, "the hub to say what became of the call", || {
            let told = super::device_exec::device_execs(&hub)
                .into_iter()
                .find(|e| e["session"] == sid.as_str());
            let ended = hub
                .events(&sid, 0)
                .into_iter()
                .find(|e| e["kind"] == "tool-end");
            told.or(ended)
        });
        if said["pid"].is_i64() {
            super::device_exec::signal(agent.pid(), rustix::process::Signal::CONT);
            hub.wait_online("gpu1");
            continue;
        }
        return Killed {
            hub,
            agent,
            sid,
            mark,
            said,
            _model: model,
            _tmp: tmp,
        };
    }
    panic!("in five cycles the hub always recorded the answer before the command froze it");
}

/// Every `device-exec` event and session event of `k`'s session, as text.
fn told(k: &Killed) -> String {
    let execs: Vec<Value> = super::device_exec::device_execs(&k.hub)
        .into_iter()
        .filter(|e| e["session"] == k.sid.as_str())
        .collect();
    format!(
        "{}{}",
        serde_json::to_string(&k.hub.events(&k.sid, 0)).expect("json"),
        serde_json::to_string(&execs).expect("json")
    )
}

/// The restarted hub asks again while the device is offline: the session is told "state
/// unknown" with the exec id (never "nothing was started"), and once the agent is back
/// the same id reaches the one run it holds.
#[test]
fn a_hub_killed_as_the_device_starts_a_command_never_says_nothing_was_started() {
    use rustix::process::Signal;

    use super::device_exec::{device_execs, signal};
    use super::runner::run_end;

    let k = killed_as_it_starts(serde_json::json!({}));
    let (hub, sid, said) = (&k.hub, k.sid.as_str(), &k.said);
    // The restarted hub asked again, with the agent still frozen, and recorded what it
    // knows (today's code answered the call "offline; nothing was started").
    let error = said["error"].as_str().unwrap_or_default();
    assert!(!said.to_string().contains("nothing was started"), "{said}");
    let exec_id = said["exec_id"].as_str().expect("the exec id").to_string();
    assert!(
        error.starts_with(&format!("state unknown, exec id {exec_id}")),
        "{said}"
    );
    assert!(said["pid"].is_null(), "{said}");
    let events = hub.events(sid, 0);
    assert_eq!(
        events.iter().filter(|e| e["kind"] == "tool-end").count(),
        0,
        "the call is not answered while the device is away: {events:#?}"
    );

    signal(k.agent.pid(), Signal::CONT);
    let end = run_end(hub, sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    let events = hub.events(sid, 0);
    let obs = call_answer(&events);
    assert_eq!(obs["ok"], true, "{obs}");
    assert_eq!(obs["result"]["exec_id"], exec_id.as_str(), "{obs}");
    let pid = obs["result"]["pid"].as_i64().expect("the run's pid");
    assert!(
        obs["result"]["note"]
            .as_str()
            .is_some_and(|n| n.contains("started before")),
        "the agent answered with the run it holds: {obs}"
    );
    let execs: Vec<Value> = device_execs(hub)
        .into_iter()
        .filter(|e| e["session"] == sid)
        .collect();
    assert_eq!(
        execs.iter().filter(|e| e["pid"] == pid).count(),
        1,
        "{execs:#?}"
    );
    let all = told(&k);
    assert!(!all.contains("nothing was started"), "{all}");
    let runs = std::fs::read_to_string(&k.mark).expect("mark");
    assert_eq!(runs, "run\n", "one run");
}

/// As above, with a device that stays away past the grace (`deviceLossGraceMs`): the
/// call's answer stays "state unknown" with the exec id, never "nothing was started".
#[test]
fn a_device_away_past_the_grace_leaves_the_call_unknown_not_unstarted() {
    use rustix::process::Signal;

    use super::device_exec::signal;
    use super::runner::run_end;

    let k = killed_as_it_starts(serde_json::json!({"deviceLossGraceMs": 300}));
    let end = run_end(&k.hub, &k.sid, 1);
    assert_eq!(end["result"]["ok"], true, "the model goes on: {end}");
    let events = k.hub.events(&k.sid, 0);
    let obs = unknown_answer(&events);
    assert_eq!(obs["ok"], false, "{obs}");
    let error = obs["result"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("stayed offline"), "{obs}");
    let all = told(&k);
    assert!(!all.contains("nothing was started"), "{all}");
    signal(k.agent.pid(), Signal::CONT);
    assert_eq!(std::fs::read_to_string(&k.mark).expect("mark"), "run\n");
}

/// A cancel while the restarted hub waits for the device to come back: the wait ends at
/// once, and the call's answer is "state unknown" with the exec id (the run is not
/// forgotten because the turn was stopped).
#[test]
fn a_cancel_while_the_device_is_awaited_leaves_the_call_unknown() {
    use rustix::process::Signal;
    use serde_json::json;

    use super::device_exec::signal;
    use super::runner::run_end;

    let k = killed_as_it_starts(json!({}));
    let (hub, sid, said) = (&k.hub, k.sid.as_str(), &k.said);
    assert!(
        said["error"]
            .as_str()
            .is_some_and(|m| m.starts_with("state unknown")),
        "{said}\n{}",
        hub.log()
    );
    let (st, v) = hub.api(
        cortex_cli::http::Method::Post,
        &format!("/api/sessions/{sid}/cancel"),
        Some(&json!({"turn_only": true})),
    );
    assert_eq!(st, 202, "{v}");
    let end = run_end(hub, sid, 1);
    assert_eq!(end["result"]["error"]["code"], "aborted", "{end}");
    let events = hub.events(sid, 0);
    unknown_answer(&events);
    let all = told(&k);
    assert!(!all.contains("nothing was started"), "{all}");
    signal(k.agent.pid(), Signal::CONT);
}

/// A cancel posted while the ask is at a device slow to answer (its agent stopped), then
/// the hub SIGKILLed before the answer came: the restarted hub takes the cancel before it
/// asks again, and records the begun call as "state unknown" with its exec id (a
/// `device-exec` event, and the call's answer), not as a plain "interrupted".
#[test]
fn a_cancel_taken_after_a_restart_records_the_begun_call_unknown() {
    use rustix::process::Signal;
    use serde_json::json;

    use super::device_exec::{device_execs, signal, unread_bytes};
    use super::runner::{LIMIT, new_session, run_end, say};

    let (mut hub, agent, _model, tmp) = exec_hub(json!({}));
    let mark = tmp.path().join("mark");
    let sid = new_session(&hub, json!({"policy": {"requireApproval": []}}));
    signal(agent.pid(), Signal::STOP);
    let unread = unread_bytes(agent.pid());
    say(
        &hub,
        &sid,
        json!({"text": format!("exec: echo run >> {}", mark.display())}),
    );
    wait_until(LIMIT, "the ask to reach the device", || {
        (unread_bytes(agent.pid()) > unread).then_some(())
    });
    let (st, v) = hub.api(
        cortex_cli::http::Method::Post,
        &format!("/api/sessions/{sid}/cancel"),
        Some(&json!({"turn_only": true})),
    );
    assert_eq!(st, 202, "{v}");
    hub.kill();
    hub.spawn();
    let end = run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["error"]["code"], "aborted", "{end}");
    let events = hub.events(&sid, 0);
    let exec_id = unknown_answer(&events)["result"]["exec_id"].clone();
    let execs: Vec<Value> = device_execs(&hub)
        .into_iter()
        .filter(|e| e["session"] == sid.as_str())
        .collect();
    assert!(
        execs
            .iter()
            .any(|e| e["exec_id"] == exec_id && e["pid"].is_null()),
        "{execs:#?}"
    );
    signal(agent.pid(), Signal::CONT);
}

/// The observation of the session's one answered call (its `tool-end`).
fn call_answer(events: &[Value]) -> &Value {
    &events
        .iter()
        .find(|e| e["kind"] == "tool-end")
        .expect("the call's answer")["observation"]
}

/// The call's answer, checked to say "state unknown" with its exec id.
fn unknown_answer(events: &[Value]) -> &Value {
    let obs = call_answer(events);
    let exec_id = obs["result"]["exec_id"].as_str().expect("exec id");
    let error = obs["result"]["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with(&format!("state unknown, exec id {exec_id}")),
        "{obs}"
    );
    obs
}
