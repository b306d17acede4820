//! `device_exec`'s device side end to end: the hub's `mesh::exec::exec`, called in this
//! process on a hub state serving the real mesh listener and link code, against the real
//! `cortex-device-agent` run with `--allow-exec --exec-allow sh`. A command starts
//! detached (its own session and process group, the frame's environment, its output in
//! the device's log); the same exec id is the same run; a program off the allow-list is
//! refused; a SIGKILL of the agent leaves the command running, the hub says the device is
//! offline, and the restarted agent answers the same id with the same run. The agent's log
//! never holds the secret the environment carried, and the command does not inherit the
//! device token the agent got from its environment.
//!
//! (No HTTP route calls `exec`: the runner's `device_exec` tool does.) Through the runner
//! (a real hub with a scripted model): an approval and a cancel posted at once never leave
//! a run on the device that no `device-exec` event records.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cortex_hub::engine::Settings;
use cortex_hub::mesh::exec::{ExecError, exec};
use cortex_hub::mesh::{Bound, MeshSetup};
use cortex_hub::state::{AppState, Inner, Shutdown};
use cortex_hub::store::Store;
use cortex_protocol::mesh::ExecRequest;
use cortex_tests::bin;

const T: Duration = Duration::from_secs(20);
const SECRET: &str = "s3cret-e2e-value";

/// The token in the environment, the least safe place: the commands must not inherit it.
fn start_agent(url: &str, home: &Path, token: &str, log: &Path) -> Child {
    Command::new(bin("cortex-device-agent"))
        .args(["--hub", url, "--name", "gpu1"])
        .env("CORTEX_DEVICE_TOKEN", token)
        .env_remove("CORTEX_DEVICE_TOKEN_FILE")
        .arg("--home")
        .arg(home)
        .args(["--allow-exec", "--exec-allow", "sh"])
        .env("RUST_LOG", "debug")
        .env_remove("CORTEX_ALLOW_EXEC")
        .env_remove("CORTEX_EXEC_ALLOW")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .expect("agent log"),
        )
        .spawn()
        .expect("spawn the agent")
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < T, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn request(script: &str, cwd: &Path) -> ExecRequest {
    ExecRequest {
        exec_id: "ex_e2e_1".into(),
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        shell: false,
        cwd: Some(cwd.to_string_lossy().into_owned()),
        env: vec![("CORTEX_SIGNAL_SECRET".into(), SECRET.into())],
        timeout_ms: 15_000,
    }
}

/// (state, pgrp, session) of `pid` from /proc/PID/stat.
fn stat(pid: i32) -> Option<(char, i32, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = s[s.rfind(')')? + 1..].split_whitespace().collect();
    Some((f[0].chars().next()?, f[2].parse().ok()?, f[3].parse().ok()?))
}

#[test]
fn exec_through_a_real_link_starts_a_detached_command_once() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(scenario());
}

async fn scenario() {
    let hub_home = tempfile::tempdir().expect("tmp");
    let dev_home = tempfile::tempdir().expect("tmp");
    let work = tempfile::tempdir().expect("tmp");
    let (store, writer) =
        Store::open(&hub_home.path().join("hub.redb"), Settings::default()).expect("store");
    let token = cortex_hub::secret::random_hex(16);
    let hash = cortex_hub::secret::hash(&token);
    store
        .exec(move |t| t.add_device("gpu1", hash, 1))
        .await
        .expect("device added");
    let state = AppState::new(Inner {
        store,
        token_hash: cortex_hub::secret::hash("operator"),
        exec_key: cortex_hub::secret::derive_key("operator", "test"),
        misses: Default::default(),
        device_misses: Default::default(),
        signal_url: "http://127.0.0.1:1/webhook/signal".into(),
        shutdown: Shutdown::default(),
        devices: Default::default(),
        mesh_url: None,
        live: Default::default(),
        agent_defaults: Default::default(),
        runs_model: false,
        model_name: None,
        caps: Default::default(),
        stops: Default::default(),
        claims: cortex_hub::claims::Claims::new("test-hub".into(), 10_000),
        hosts: Default::default(),
        settings: Default::default(),
    });
    cortex_hub::mesh::start(&state, cortex_hub::config::DEFAULT_DEVICE_LOSS_GRACE_MS)
        .await
        .expect("mesh start");
    let bound = Bound::bind(&MeshSetup::new("127.0.0.1:0".parse().expect("addr")))
        .await
        .expect("bind");
    let url = bound.url.clone();
    let serve = tokio::spawn(cortex_hub::mesh::serve(state.clone(), bound));

    let agent_log = hub_home.path().join("agent.log");
    let mut agent = start_agent(&url, dev_home.path(), &token, &agent_log);
    until("the device online", || state.devices.link("gpu1").is_some()).await;

    let script = r#"echo "secret=$CORTEX_SIGNAL_SECRET token=${CORTEX_DEVICE_TOKEN:-unset}"; pwd; i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"#;
    let first = exec(&state, "gpu1", request(script, work.path()))
        .await
        .expect("started");
    assert!(!first.already);
    let pid = first.pid;
    assert!(
        first.log.ends_with("/exec/ex_e2e_1.log") && Path::new(&first.log).is_absolute(),
        "{first:?}"
    );
    let (st, pgrp, sid) = stat(pid).expect("running");
    assert_ne!(st, 'Z');
    assert_eq!(
        (pgrp, sid),
        (pid, pid),
        "its own session and process group: {:?}",
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
    );
    assert_eq!(
        cortex_host::wait::read_stat(pid)
            .expect("stat")
            .expect("there")
            .start_time,
        first.start_time
    );

    // Asked again: the same run.
    let again = exec(&state, "gpu1", request(script, work.path()))
        .await
        .expect("answered");
    assert_eq!(
        (again.pid, again.start_time, again.already),
        (pid, first.start_time, true)
    );

    // Off the allow-list: refused, saying why.
    let mut py = request("", work.path());
    py.exec_id = "ex_e2e_py".into();
    py.argv = vec!["python3".into(), "-c".into(), "print(1)".into()];
    let e = exec(&state, "gpu1", py).await.expect_err("refused");
    assert_eq!(
        e.to_string(),
        "device gpu1 refused: python3 is not on this device's exec allow-list: sh"
    );

    // SIGKILL the agent: the command goes on; the hub says the device is offline.
    let _ = agent.kill();
    let _ = agent.wait();
    until("the link gone", || state.devices.link("gpu1").is_none()).await;
    let (st, _, _) = stat(pid).expect("still there");
    assert_ne!(st, 'Z', "the command outlives its agent");
    let e = exec(&state, "gpu1", request(script, work.path()))
        .await
        .expect_err("offline");
    assert_eq!(
        e,
        ExecError::Offline {
            device: "gpu1".into()
        }
    );

    // A restarted agent answers the same id with the same run.
    let mut agent = start_agent(&url, dev_home.path(), &token, &agent_log);
    until("the device back", || state.devices.link("gpu1").is_some()).await;
    let after = exec(&state, "gpu1", request(script, work.path()))
        .await
        .expect("answered");
    assert_eq!((after.pid, after.already), (pid, true));

    std::fs::write(work.path().join("go"), "").expect("go");
    until("the command ended", || {
        stat(pid).is_none_or(|(st, _, _)| st == 'Z')
    })
    .await;
    let out = std::fs::read_to_string(&first.log).expect("the run's log");
    assert!(
        out.contains(&format!("secret={SECRET} token=unset\n")),
        "{out}"
    );
    assert!(
        out.contains(&format!("{}\n", work.path().display())),
        "{out}"
    );

    let _ = agent.kill();
    let _ = agent.wait();
    let logged = std::fs::read_to_string(&agent_log).expect("agent log");
    assert!(logged.contains("exec started"), "{logged}");
    assert!(!logged.contains(SECRET), "the agent logged the secret");
    assert!(!logged.contains(&token), "the agent logged its token");

    state.shutdown.cancel();
    let _ = tokio::time::timeout(T, serve).await;
    drop(state);
    let _ = tokio::task::spawn_blocking(move || writer.join()).await;
}

/// A model that starts on `gpu1` the shell script each message names (`exec: SCRIPT`),
/// and answers anything else (a tool's answer) with text.
pub(crate) fn exec_model() -> cortex_tests::scripted_model::ScriptedModel {
    use cortex_tests::scripted_model::{Reply, ScriptedModel};
    ScriptedModel::start_with_default(
        Vec::new(),
        Reply::from_fn(|req| {
            let last = super::runner::last_message(req);
            let script = (last["role"] == "user")
                .then(|| last["content"].as_str())
                .flatten()
                .and_then(|c| c.split_once("exec: "))
                .map(|(_, s)| s.to_string());
            match script {
                Some(s) => {
                    let args = serde_json::json!({"device": "gpu1", "argv": [s], "shell": true});
                    Reply::tool_call("device_exec", &args.to_string())
                }
                None => Reply::text("ok"),
            }
        }),
    )
}

/// The hub's `device-exec` events.
pub(crate) fn device_execs(hub: &cortex_tests::Hub) -> Vec<serde_json::Value> {
    let (st, v) = hub.api(cortex_cli::http::Method::Get, "/api/events", None);
    assert_eq!(st, 200, "{v}");
    v["events"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|e| e["kind"] == "device-exec")
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// The bytes waiting unread in the TCP sockets of process `pid`.
pub(crate) fn unread_bytes(pid: Option<u32>) -> u64 {
    let pid = pid.expect("running");
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|f| std::fs::read_link(f.ok()?.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    let mut unread = 0;
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 9 && inodes.iter().any(|i| i == f[9]) {
                let rx = f[4].split(':').nth(1).unwrap_or("0");
                unread += u64::from_str_radix(rx, 16).unwrap_or(0);
            }
        }
    }
    unread
}

pub(crate) fn signal(pid: Option<u32>, sig: rustix::process::Signal) {
    let pid = pid
        .and_then(|p| rustix::process::Pid::from_raw(p as i32))
        .expect("a running process");
    rustix::process::kill_process(pid, sig).expect("signal");
}

/// An approval and a cancel posted at the same moment on a pending `device_exec`, ten
/// times, with the device slow to answer (its agent stopped across the race, so an ask
/// that went out is still unanswered when the cancel rings; in every other round the
/// cancel goes once the ask is at the device, the widest window): every run the device holds
/// is recorded as a `device-exec` event with its pid, or as `state unknown` with its exec
/// id, and every command that ran (its mark exists) is among them.
#[test]
fn approve_and_cancel_at_once_never_hide_a_run() {
    use cortex_cli::http::Method;
    use rustix::process::Signal;
    use serde_json::{Value, json};

    let model = exec_model();
    let (hub, tmp) = super::runner::hub(&model);
    let token = hub.add_device("gpu1");
    let mut agent = cortex_tests::agent::Agent::new(&hub, "gpu1", &token);
    agent.set_env("CORTEX_ALLOW_EXEC", "1");
    agent.spawn();
    hub.wait_online("gpu1");
    const RACES: usize = 10;
    let marks: Vec<_> = (0..RACES)
        .map(|i| tmp.path().join(format!("mark{i}")))
        .collect();
    let mut sids = Vec::new();
    for mark in &marks {
        let sid = super::runner::new_session(&hub, json!({}));
        let script = format!("echo run >> {}", mark.display());
        super::runner::say(&hub, &sid, json!({"text": format!("exec: {script}")}));
        let req = hub.wait_event(&sid, super::runner::LIMIT, |e| {
            e["kind"] == "approval-required"
        })["approval"]
            .clone();
        let id = req["id"].as_str().expect("request id").to_string();
        signal(agent.pid(), Signal::STOP);
        let unread = unread_bytes(agent.pid());
        // Every other round the cancel waits until the ask is at the device (the stopped
        // agent's socket holds unread bytes): the moment today's runner dropped it.
        let after_the_ask = sids.len() % 2 == 1;
        let barrier = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            let allow = s.spawn(|| {
                barrier.wait();
                hub.api(
                    Method::Post,
                    &format!("/api/sessions/{sid}/answers"),
                    Some(&json!({"request_id": id, "decision": "allow"})),
                )
            });
            let cancel = s.spawn(|| {
                barrier.wait();
                if after_the_ask {
                    cortex_tests::wait_until(
                        super::runner::LIMIT,
                        "the ask to reach the device",
                        || (unread_bytes(agent.pid()) > unread).then_some(()),
                    );
                }
                hub.api(
                    Method::Post,
                    &format!("/api/sessions/{sid}/cancel"),
                    Some(&json!({"turn_only": true})),
                )
            });
            let (a, c) = (allow.join().expect("allow"), cancel.join().expect("cancel"));
            assert!(a.0 < 500, "{a:?}");
            assert_eq!(c.0, 202, "{c:?}");
        });
        signal(agent.pid(), Signal::CONT);
        super::runner::run_end(&hub, &sid, 1);
        sids.push(sid);
    }
    // One more command over the same link, once the races are over: the agent handles
    // its frames in order, so every ask of the races has reached it (and its run, if it
    // started one, is in its records) when this one is answered.
    let sid = super::runner::new_session(&hub, json!({"policy": {"requireApproval": []}}));
    super::runner::say(&hub, &sid, json!({"text": "exec: true"}));
    let end = super::runner::run_end(&hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    let execs = device_execs(&hub);
    let recorded = |argv: &Value| {
        execs.iter().any(|e| {
            e["argv"] == *argv
                && (e["pid"].as_i64().is_some_and(|p| p > 0)
                    || (e["exec_id"].is_string()
                        && e["error"]
                            .as_str()
                            .is_some_and(|m| m.starts_with("state unknown"))))
        })
    };
    let dir = agent.home.join("exec");
    let mut runs = 0;
    for f in std::fs::read_dir(&dir).expect("the agent's exec records") {
        let path = f.expect("entry").path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let rec: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("record")).expect("json");
        runs += 1;
        assert!(
            recorded(&rec["argv"]),
            "the device holds a run the hub never recorded: {rec}\nevents: {execs:#?}"
        );
    }
    assert!(runs >= 1, "the barrier's run is a record");
    for (mark, sid) in marks.iter().zip(&sids) {
        let argv = json!([format!("echo run >> {}", mark.display())]);
        if mark.exists() {
            assert!(recorded(&argv), "{sid}: it ran, unrecorded: {execs:#?}");
        }
        let text = serde_json::to_string(&hub.events(sid, 0)).expect("json");
        assert!(!text.contains("nothing was started"), "{sid}: {text}");
    }
}
