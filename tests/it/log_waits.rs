//! Log, silence and any-of waits end to end, with the real binaries: `cortex wait log|any`
//! and `cortex wait file --silence` on this machine, and the same waits through the real
//! hub and a real `cortex-device-agent`. A log wait fires on the first matching line
//! appended after its arm (never on an older one), after a rotation by rename and after a
//! truncation; `--cursor` makes the next run start after the match; a log wait re-armed by
//! an agent SIGKILLed and restarted reports the line written while it was down and none
//! from before the arm; a silence fires once the writer stops, not while it writes; an
//! any-of whose log fires first ends its pid condition too (the wait gone from the agent's
//! state and the device's `wait_list`, the process untouched) and says which fired.
//! Every wait is bounded; "not while it writes" is observed while the writer runs, never
//! timed.

// Fields of JSON the hub and the command just answered with; a panic is the test failing.
#![allow(clippy::unwrap_used)]

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use cortex_cli::http::Method;
use cortex_tests::agent::Agent;
use cortex_tests::{Hub, bin, wait_until};
use serde_json::{Value, json};

use super::local_waits::{Waiting, payload};
use super::remote_waits::{Sleep, agent_forgot, device_wait_signals, outcome_of, wait_armed};

const T: Duration = Duration::from_secs(30);

fn append(path: &Path, text: &str) {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open for append");
    f.write_all(text.as_bytes()).expect("append");
}

fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}

/// A process that appends a line every 100 ms until stopped.
struct Writer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    fn start(path: &Path) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, path) = (Arc::clone(&stop), path.to_owned());
        let thread = std::thread::spawn(move || {
            let mut i = 0;
            while !flag.load(Ordering::Relaxed) {
                append(&path, &format!("step {i}\n"));
                i += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Writer {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("writer");
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

// ---- on this machine ----

#[test]
fn cortex_wait_log_fires_on_the_first_matching_line_after_the_arm_and_keeps_its_cursor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("train.log");
    let cur = dir.path().join("train.cursor");
    append(&log, "epoch 1 loss=nan (before the arm)\n");
    let args = [
        "wait",
        "log",
        s(&log),
        "--match",
        "loss=nan",
        "--cursor",
        s(&cur),
        "--timeout",
        "30s",
    ];
    let mut w = Waiting::start(&args);
    let armed = w.armed();
    assert!(armed.contains("reading from its end"), "{armed}");
    append(
        &log,
        "epoch 2 loss=0.3\nepoch 3 loss=nan\nepoch 4 loss=nan again\n",
    );
    let (code, out, err) = w.finish();
    assert_eq!(code, 0, "{err:?}");
    assert_eq!(err.len(), 1, "one armed line: {err:?}");
    let p = payload(&out);
    assert_eq!(p["kind"], "log");
    assert_eq!(p["line"], "epoch 3 loss=nan");
    assert_eq!(p["before"], json!(["epoch 2 loss=0.3"]));

    // The cursor was kept just after the match: the next run reports the next line, once.
    let (code, out, err) = cortex_tests::run("cortex", &args, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(payload(&out)["line"], "epoch 4 loss=nan again");
    let mut quick = args.to_vec();
    let last = quick.len() - 1;
    quick[last] = "1s";
    let (code, _, err) = cortex_tests::run("cortex", &quick, &[]);
    assert_eq!(code, 1, "nothing new matched: {err}");
    assert!(err.contains("timed out after 1s"), "{err}");
}

#[test]
fn cortex_wait_log_follows_a_rename_rotation_and_a_truncation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("app.log");
    append(&log, "boot\nERROR old\n");
    let args = [
        "wait",
        "log",
        s(&log),
        "--match",
        "ERROR",
        "--timeout",
        "30s",
    ];

    let mut w = Waiting::start(&args);
    w.armed();
    fs::rename(&log, dir.path().join("app.log.1")).expect("rotate");
    append(&log, "fresh\nERROR in the new file\n");
    let (code, out, err) = w.finish();
    assert_eq!(code, 0, "{err:?}");
    let p = payload(&out);
    assert_eq!(
        (p["line"].as_str(), p["offset"].as_u64()),
        (Some("ERROR in the new file"), Some(6))
    );

    let mut w = Waiting::start(&args);
    w.armed();
    // copytruncate: cut to nothing, then written again, shorter than before.
    OpenOptions::new()
        .write(true)
        .open(&log)
        .expect("open")
        .set_len(0)
        .expect("truncate");
    append(&log, "ERROR x\n");
    let (code, out, err) = w.finish();
    assert_eq!(code, 0, "{err:?}");
    let p = payload(&out);
    assert_eq!(
        (p["line"].as_str(), p["offset"].as_u64()),
        (Some("ERROR x"), Some(0))
    );
}

#[test]
fn cortex_wait_file_silence_fires_when_the_writer_stops_not_while_it_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("progress.log");
    append(&f, "start\n");
    let writer = Writer::start(&f);
    let mut w = Waiting::start(&["wait", "file", s(&f), "--silence", "1s", "--timeout", "60s"]);
    let armed = w.armed();
    assert!(armed.contains("to go 1s without growing"), "{armed}");
    // Twice the silence of steady writes: only the growth keeps it from firing.
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(100));
        assert!(w.running(), "fired while the file grew");
    }
    writer.stop();
    let size = fs::metadata(&f).expect("meta").len();
    let (code, out, err) = w.finish();
    assert_eq!(code, 0, "{err:?}");
    let p = payload(&out);
    assert_eq!(
        (p["reason"].as_str(), p["size"].as_u64()),
        (Some("silent"), Some(size))
    );
}

#[test]
fn cortex_wait_any_says_which_condition_fired() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("train.log");
    append(&log, "");
    let mut job = Sleep::start();
    let pid = format!("pid:{}", job.pid());
    let cond = format!("log:{}~Traceback|nan", s(&log));
    let mut w = Waiting::start(&["wait", "any", &pid, &cond, "--timeout", "30s"]);
    let armed = w.armed();
    assert!(armed.contains("the first of:"), "{armed}");
    append(&log, "Traceback (most recent call last):\n");
    let (code, out, err) = w.finish();
    assert_eq!(code, 0, "{err:?}");
    let p = payload(&out);
    assert_eq!(p["kind"], "any");
    assert_eq!(p["which"], 1);
    assert_eq!(p["condition"], cond);
    assert_eq!(p["fired"]["line"], "Traceback (most recent call last):");
    assert!(job.alive(), "the pid condition was only watched");
}

// ---- on a device ----

fn post_wait(hub: &Hub, body: Value) -> (String, String) {
    let (st, v) = hub.api(Method::Post, "/api/devices/gpu1/waits", Some(&body));
    assert_eq!(st, 201, "{v}");
    (
        v["id"].as_str().unwrap().to_string(),
        v["session"].as_str().unwrap().to_string(),
    )
}

/// The fired wake's device-wait payload and message.
fn fired(hub: &Hub, sid: &str, wp: &str) -> (Value, String) {
    let wake = hub.wait_wake(sid, wp, 1, T);
    let sig = &wake["signals"][0];
    assert_eq!(outcome_of(sig), "fired", "{wake}");
    let data: Value = serde_json::from_str(sig["data"].as_str().unwrap()).unwrap();
    (
        data["payload"].clone(),
        sig["message"].as_str().unwrap().to_string(),
    )
}

fn online_agent(hub: &Hub) -> Agent {
    let token = hub.add_device("gpu1");
    let agent = Agent::start(hub, "gpu1", &token);
    hub.wait_online("gpu1");
    agent
}

#[test]
fn a_remote_log_wait_fires_after_the_arm_and_follows_rotation_and_truncation() {
    let hub = Hub::start();
    let files = tempfile::tempdir().expect("tempdir");
    let _agent = online_agent(&hub);
    let log = files.path().join("train.log");
    append(&log, "loss=nan (before the arm)\n");

    // `cortex wait log --device`: armed on the device, then the line.
    let child = Command::new(bin("cortex"))
        .args([
            "wait",
            "log",
            s(&log),
            "--match",
            "nan",
            "--device",
            "gpu1",
            "--timeout",
            "10m",
        ])
        .env("CORTEX_HUB", format!("http://{}", hub.addr))
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
    assert_eq!(
        (armed["kind"].as_str(), armed["match"].as_str()),
        (Some("log"), Some("nan"))
    );
    append(&log, "loss=0.2\nloss=nan\n");
    let out = child.wait_with_output().expect("cortex ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("a line matching /nan/ appended to"),
        "{stderr}"
    );
    // One payload shape: what `cortex wait log` on this machine prints, plus where.
    let printed: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(printed["line"], "loss=nan", "{printed}");
    assert_eq!(printed["before"], json!(["loss=0.2"]), "{printed}");
    assert_eq!(printed["device"], "gpu1", "{printed}");
    let view = hub.get_waitpoint(printed["waitpoint"].as_str().unwrap());
    let sig = &view["signals"][0];
    assert_eq!(
        sig["message"],
        format!("{}: a line matched /nan/: \"loss=nan\"", s(&log))
    );
    let data: Value = serde_json::from_str(sig["data"].as_str().unwrap()).unwrap();
    let mut local_shape = printed.clone();
    for k in ["device", "waitpoint"] {
        local_shape.as_object_mut().unwrap().remove(k);
    }
    assert_eq!(
        data["payload"], local_shape,
        "the device's payload, as it made it"
    );

    // Rotated by rename, the match in the new file.
    let body = json!({"kind": "log", "path": s(&log), "match": "ERROR", "timeout_s": 600});
    let (wp, sid) = post_wait(&hub, body.clone());
    wait_armed(&hub, "gpu1", &wp);
    fs::rename(&log, files.path().join("train.log.1")).expect("rotate");
    append(&log, "ERROR after the rotation\n");
    let (p, _) = fired(&hub, &sid, &wp);
    assert_eq!(
        (p["line"].as_str(), p["offset"].as_u64()),
        (Some("ERROR after the rotation"), Some(0))
    );

    // Truncated in place, the match after the cut.
    append(&log, &"filler\n".repeat(20));
    let (wp, sid) = post_wait(&hub, body);
    wait_armed(&hub, "gpu1", &wp);
    OpenOptions::new()
        .write(true)
        .open(&log)
        .expect("open")
        .set_len(0)
        .expect("truncate");
    append(&log, "ERROR after the cut\n");
    let (p, _) = fired(&hub, &sid, &wp);
    assert_eq!(
        (p["line"].as_str(), p["offset"].as_u64()),
        (Some("ERROR after the cut"), Some(0))
    );
}

#[test]
fn a_log_wait_re_armed_after_the_agent_was_killed_misses_nothing_and_repeats_nothing() {
    let hub = Hub::start();
    let files = tempfile::tempdir().expect("tempdir");
    let mut agent = online_agent(&hub);
    let log = files.path().join("run.log");
    append(&log, "nan before the arm\n");
    let (wp, sid) = post_wait(
        &hub,
        json!({"kind": "log", "path": s(&log), "match": "nan", "timeout_s": 600}),
    );
    wait_armed(&hub, "gpu1", &wp);
    wait_until(T, "the wait saved with its position", || {
        agent.saved_waits()["waits"]
            .as_array()
            .and_then(|l| l.iter().find(|w| w["id"] == wp))
            .map(|w| w["spec"]["cursor"]["offset"].clone())
            .filter(|o| *o == json!("nan before the arm\n".len()))
    });
    agent.kill();
    // Written while no agent runs.
    append(&log, "ok\nnan while the agent was down\n");
    agent.spawn();
    let (p, message) = fired(&hub, &sid, &wp);
    assert_eq!(p["line"], "nan while the agent was down");
    assert!(
        message.contains("nan while the agent was down"),
        "{message}"
    );
    wait_until(T, "acknowledged", || {
        agent_forgot(&agent, &wp).then_some(())
    });
    assert_eq!(device_wait_signals(&hub, &wp).len(), 1, "once");
    assert_eq!(hub.wakes(&sid).len(), 1, "one wake");
}

#[test]
fn a_remote_silence_fires_when_the_writer_stops_not_while_it_writes() {
    let hub = Hub::start();
    let files = tempfile::tempdir().expect("tempdir");
    let _agent = online_agent(&hub);
    let log = files.path().join("train.log");
    append(&log, "start\n");
    let writer = Writer::start(&log);
    let (wp, sid) = post_wait(
        &hub,
        json!({"kind": "log", "path": s(&log), "match": "never printed", "silence": "1s",
               "timeout_s": 600}),
    );
    let w = wait_armed(&hub, "gpu1", &wp);
    assert_eq!(w["silence_ms"], 1000, "{w}");
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            hub.get_waitpoint(&wp)["signal_count"],
            0,
            "fired while the log grew"
        );
    }
    writer.stop();
    let (p, message) = fired(&hub, &sid, &wp);
    assert_eq!(p["reason"], "silent");
    assert_eq!(p["size"], fs::metadata(&log).expect("meta").len());
    assert!(message.contains("has not grown for"), "{message}");
}

#[test]
fn a_remote_any_whose_log_fires_first_ends_its_pid_condition_and_says_which() {
    let hub = Hub::start();
    let files = tempfile::tempdir().expect("tempdir");
    let agent = online_agent(&hub);
    let log = files.path().join("train.log");
    append(&log, "");
    let mut job = Sleep::start();
    let (wp, sid) = post_wait(
        &hub,
        json!({"kind": "any", "timeout_s": 600, "conditions": [
            {"kind": "pid", "pid": job.pid()},
            {"kind": "log", "path": s(&log), "match": "Traceback"},
        ]}),
    );
    let w = wait_armed(&hub, "gpu1", &wp);
    assert_eq!(w["kind"], "any", "{w}");
    assert_eq!(
        w["conditions"],
        json!([
            format!("pid:{}", job.pid()),
            format!("log:{}~Traceback", s(&log))
        ])
    );
    wait_until(T, "the wait saved by the agent", || {
        agent.saved_waits()["waits"]
            .as_array()
            .is_some_and(|l| l.iter().any(|w| w["id"] == wp))
            .then_some(())
    });
    append(&log, "Traceback (most recent call last):\n");
    let (p, message) = fired(&hub, &sid, &wp);
    assert_eq!(p["which"], 1);
    assert_eq!(p["condition"], format!("log:{}~Traceback", s(&log)));
    assert_eq!(p["fired"]["line"], "Traceback (most recent call last):");
    assert!(
        message.starts_with(&format!("any: log:{}~Traceback fired first:", s(&log))),
        "{message}"
    );
    // The whole wait is gone, its pid condition with it; the process runs on.
    wait_until(T, "the agent forgot the wait", || {
        agent_forgot(&agent, &wp).then_some(())
    });
    let d = hub.device("gpu1");
    assert_eq!(d["wait_list"], json!([]), "{d}");
    assert_eq!(d["waits"], 0);
    assert!(job.alive());
    assert_eq!(device_wait_signals(&hub, &wp).len(), 1);
}
