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
//! (No HTTP route calls `exec` yet: the runner's `device_exec` tool does, and its own test
//! covers the tool.)

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cortex_hub::engine::Settings;
use cortex_hub::mesh::exec::{ExecError, ExecRequest, exec};
use cortex_hub::mesh::{Bound, MeshSetup};
use cortex_hub::state::{AppState, Inner, Shutdown};
use cortex_hub::store::Store;
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
        timeout: Duration::from_secs(15),
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
