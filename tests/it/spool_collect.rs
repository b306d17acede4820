//! Who collects a spool, and when a file in it is taken, with the real binaries: a second
//! collector on one home (the hub and a device agent, or two agents) refuses to start and
//! names the first, so a burst of key-less files is recorded once each; a file written in
//! place, held open across rescans, is never parked and is recorded once when finished.

// Fields of JSON the hub just answered with; a panic is the test failing.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, SystemTime};

use cortex_tests::agent::Agent;
use cortex_tests::{Hub, bin, wait_until};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);

/// Runs `cmd` until it exits (at most `T`; killed past it) and returns its status and
/// stderr. A collector that should refuse but runs on fails the test, not hangs it.
fn run_to_exit(mut cmd: Command, what: &str) -> (ExitStatus, String) {
    let tmp = tempfile::tempdir().expect("tmp");
    let err_path = tmp.path().join("stderr");
    let err = std::fs::File::create(&err_path).expect("stderr file");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("spawn");
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if start.elapsed() > T {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} did not exit within {T:?}; it should have refused the spool:\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status,
        std::fs::read_to_string(&err_path).unwrap_or_default(),
    )
}

/// A second hub on `home`, as an operator would start it.
fn hub_command(home: &Path) -> Command {
    let mut cmd = Command::new(bin("cortex-hub"));
    cmd.arg("--home")
        .arg(home)
        .args(["--listen", "127.0.0.1:0", "--mesh-listen", "off"])
        .env_remove("CORTEX_WEBHOOK_TOKEN")
        .env("RUST_LOG", "info");
    cmd
}

/// The spool's lock names `who` (the collector started and took it).
fn wait_locked_by(spool: &Path, who: &str) {
    wait_until(T, &format!("the spool locked by {who}"), || {
        std::fs::read_to_string(spool.join(".collector.lock"))
            .ok()
            .filter(|t| t.contains(who))
            .map(|_| ())
    });
}

fn assert_refused(status: ExitStatus, stderr: &str, spool: &Path, holder: &str) {
    assert_eq!(status.code(), Some(1), "a failing exit:\n{stderr}");
    let said = format!("spool {} is already collected by {holder}", spool.display());
    assert!(stderr.contains(&said), "expected {said:?} in:\n{stderr}");
    assert!(stderr.contains("another --home"), "{stderr}");
}

/// `n` key-less progress files, each dropped the documented way (`.tmp`, then a rename).
fn burst(spool: &Path, wp: &Value, n: usize) {
    for i in 0..n {
        let body = json!({"id": wp["id"], "secret": wp["secret"], "status": "progress",
            "message": format!("step {i}")});
        let tmp = spool.join(format!("b{i:04}.tmp"));
        std::fs::write(&tmp, body.to_string()).expect("write");
        std::fs::rename(&tmp, spool.join(format!("b{i:04}.json"))).expect("rename");
    }
}

fn pending(spool: &Path) -> usize {
    std::fs::read_dir(spool)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
                .count()
        })
        .unwrap_or(0)
}

fn bad(spool: &Path) -> Vec<String> {
    std::fs::read_dir(spool.join("bad"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits for the spool to drain, then checks each of the `n` files was recorded exactly
/// once, all through `source`.
fn assert_once_each(hub: &Hub, wp: &Value, spool: &Path, n: usize, source: &str) {
    let id = wp["id"].as_str().unwrap();
    wait_until(Duration::from_secs(90), "the burst recorded", || {
        let v = hub.get_waitpoint(id);
        (pending(spool) == 0 && v["signal_count"].as_u64() >= Some(n as u64)).then_some(())
    });
    let v = hub.get_waitpoint(id);
    assert_eq!(v["signal_count"], n, "each file counted once");
    let signals = v["signals"].as_array().unwrap();
    assert_eq!(signals.len(), n, "{v}");
    let messages: HashSet<&str> = signals
        .iter()
        .filter_map(|s| s["message"].as_str())
        .collect();
    assert_eq!(messages.len(), n, "no message twice");
    assert!(
        signals.iter().all(|s| s["source"] == source),
        "every one through {source}: {v}"
    );
    assert!(bad(spool).is_empty(), "nothing parked: {:?}", bad(spool));
}

#[test]
fn a_device_agent_on_the_hubs_home_is_refused_and_a_burst_is_counted_once() {
    let hub = Hub::start();
    let token = hub.add_device("gpu1");
    let spool = hub.spool();
    wait_locked_by(&spool, "cortex-hub pid");
    let agent = Agent::new_at(&hub, "gpu1", &token, Some(&hub.home));
    let (status, stderr) = run_to_exit(agent.command(), "an agent on the hub's home");
    let holder = format!("cortex-hub pid {} on host ", hub.pid().unwrap());
    assert_refused(status, &stderr, &spool, &holder);

    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "m", "intent": "i", "max_signals": 1000}),
    );
    burst(&spool, &wp, 200);
    assert_once_each(&hub, &wp, &spool, 200, "spool");
}

#[test]
fn a_hub_on_a_device_agents_home_is_refused_naming_the_agent() {
    let hub = Hub::start();
    let token = hub.add_device("gpu1");
    let agent = Agent::start(&hub, "gpu1", &token);
    wait_locked_by(&agent.spool(), "cortex-device-agent");
    let (status, stderr) = run_to_exit(hub_command(&agent.home), "a hub on the agent's home");
    let holder = format!("cortex-device-agent pid {} on host ", agent.pid().unwrap());
    assert_refused(status, &stderr, &agent.spool(), &holder);
    assert!(stderr.contains("(device gpu1) since "), "{stderr}");
}

#[test]
fn a_second_device_agent_on_one_home_is_refused_and_a_burst_is_counted_once() {
    let hub = Hub::start();
    let t1 = hub.add_device("gpu1");
    let t2 = hub.add_device("gpu2");
    let first = Agent::start(&hub, "gpu1", &t1);
    hub.wait_online("gpu1");
    wait_locked_by(&first.spool(), "(device gpu1)");
    let second = Agent::new_at(&hub, "gpu2", &t2, Some(&first.home));
    let (status, stderr) = run_to_exit(second.command(), "a second agent on one home");
    let holder = format!("cortex-device-agent pid {} on host ", first.pid().unwrap());
    assert_refused(status, &stderr, &first.spool(), &holder);
    assert!(stderr.contains("(device gpu1)"), "{stderr}");

    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "m", "intent": "i", "max_signals": 1000}),
    );
    burst(&first.spool(), &wp, 200);
    assert_once_each(&hub, &wp, &first.spool(), 200, "device:gpu1");
}

/// Opens `spool/name` for writing and writes the first half of `body`, dated a minute back
/// so that no "written just now" grace covers it: only "still open for writing" does.
fn start_in_place(spool: &Path, name: &str, body: &str) -> (std::fs::File, String) {
    let (head, tail) = body.split_at(body.len() / 2);
    let mut f = std::fs::File::create(spool.join(name)).expect("create");
    f.write_all(head.as_bytes()).expect("write");
    f.set_modified(SystemTime::now() - Duration::from_secs(60))
        .expect("set mtime");
    (f, tail.to_string())
}

/// Waits until `log()` holds `n` more lines containing `needle` than it did at the start.
fn wait_lines(log: impl Fn() -> String, needle: &str, n: usize, what: &str) {
    let before = log().matches(needle).count();
    wait_until(T, what, || {
        (log().matches(needle).count() >= before + n).then_some(())
    });
}

/// Writes half of a signal for `wp` in place into `spool` (mtime backdated, held open),
/// waits for two rescans to list it (`listed` in `log`), checks it was not parked, then
/// finishes it and checks it is recorded once, deleted and never parked. Returns the wake.
fn written_in_place_is_recorded_once(
    hub: &Hub,
    spool: &Path,
    log: impl Fn() -> String,
    listed: &str,
    sid: &str,
    wp: &Value,
) -> Value {
    let body = json!({"id": wp["id"], "secret": wp["secret"], "message": "slow"}).to_string();
    let (mut f, tail) = start_in_place(spool, "slow.json", &body);
    wait_lines(log, listed, 2, "two rescans listing the half-written file");
    assert!(bad(spool).is_empty(), "parked while open: {:?}", bad(spool));
    assert!(spool.join("slow.json").exists());
    f.write_all(tail.as_bytes()).expect("write");
    drop(f);
    let wake = hub.wait_wake(sid, wp["id"].as_str().unwrap(), 1, T);
    assert_eq!(wake["signals"][0]["message"], "slow", "{wake}");
    wait_until(T, "the file deleted", || {
        (pending(spool) == 0).then_some(())
    });
    assert_eq!(
        hub.get_waitpoint(wp["id"].as_str().unwrap())["signal_count"],
        1
    );
    assert!(bad(spool).is_empty(), "{:?}", bad(spool));
    wake
}

#[test]
fn a_file_written_in_place_on_the_hub_is_not_parked_while_open_and_is_recorded_once() {
    let hub = Hub::start_with(&[("CORTEX_WAITPOINT_SWEEP_MS", "100")]);
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "m", "intent": "i"}));
    // Each rescan logs the files it lists.
    written_in_place_is_recorded_once(
        &hub,
        &hub.spool(),
        || hub.log(),
        "collecting the local spool files=1 reason=periodic",
        &sid,
        &wp,
    );
}

#[test]
fn a_file_written_in_place_on_a_device_is_not_parked_while_open_and_is_recorded_once() {
    // The hub's sweep asks the agent to rescan its spool as often.
    let hub = Hub::start_with(&[("CORTEX_WAITPOINT_SWEEP_MS", "100")]);
    let token = hub.add_device("gpu1");
    let mut agent = Agent::new(&hub, "gpu1", &token);
    agent.set_env("RUST_LOG", "info,cortex_device_agent::agent::forward=debug");
    agent.spawn();
    hub.wait_online("gpu1");
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "m", "intent": "i", "device": "gpu1"}));
    let wake = written_in_place_is_recorded_once(
        &hub,
        &agent.spool(),
        || agent.log(),
        "listed the spool files=1",
        &sid,
        &wp,
    );
    assert_eq!(wake["signals"][0]["source"], "device:gpu1", "{wake}");
}
