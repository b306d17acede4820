//! Exec through the whole daemon against the in-test hub: the capability only with
//! `--allow-exec`; a real command started detached (its own session and process group),
//! its output in its log, its environment from the frame; the same id answered with the
//! same run (also after the agent restarted, the command still running); a pid wait on it
//! firing with its exit code; the exit recorded and the child reaped.

use std::path::{Path, PathBuf};

use cortex_protocol::mesh::{AgentFrame, CAP_EXEC, ExecRequest, HubFrame, WaitEnd, WaitSpec};

use super::daemon::{Agent, config, eventually};
use super::fake_hub::{FakeHub, LIMIT};
use crate::agent::Config;
use crate::agent::exec::{ExecState, ExecStore, NOT_ALLOWED};

/// The built `cortex-device-agent` (the launcher), beside this test's directory:
/// `target/<profile>/deps/<test>` → `target/<profile>/cortex-device-agent`. Cargo builds
/// it for this package's tests because the package has an integration test.
fn launcher() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let p = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("cortex-device-agent");
    assert!(
        p.exists(),
        "{} is missing: `cargo test -p cortex-device-agent` builds it",
        p.display()
    );
    p
}

fn exec_config(home: &Path, url: &str) -> Config {
    let mut c = config(home, url);
    c.allow_exec = true;
    c.exec_launcher = launcher();
    c
}

fn exec_frame(id: &str, argv: &[&str], shell: bool, cwd: &Path) -> HubFrame {
    HubFrame::Exec(ExecRequest {
        exec_id: id.into(),
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        shell,
        cwd: Some(cwd.to_string_lossy().into_owned()),
        env: vec![("EXEC_TEST_SECRET".into(), "s3cret-value".into())],
        timeout_ms: LIMIT.as_millis() as u64,
    })
}

/// The next exec answer, skipping status frames.
async fn answer(conn: &mut super::fake_hub::Conn) -> AgentFrame {
    loop {
        match conn.frame().await {
            Some(AgentFrame::Status { .. }) => {}
            Some(f @ (AgentFrame::ExecStarted { .. } | AgentFrame::ExecRefused { .. })) => {
                return f;
            }
            other => panic!("expected an exec answer, got {other:?}"),
        }
    }
}

/// (pgrp, session) of `pid`: fields 5 and 6 of /proc/PID/stat.
fn pgrp_and_session(pid: i32) -> (i32, i32) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after = &stat[stat.rfind(')').expect("comm") + 1..];
    let f: Vec<&str> = after.split_ascii_whitespace().collect();
    (f[2].parse().expect("pgrp"), f[3].parse().expect("session"))
}

fn proc_gone(pid: i32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_allow_exec_nothing_is_announced_or_started() {
    let home = tempfile::tempdir().expect("tmp");
    let hub = FakeHub::bind().await;
    let agent = Agent::start(config(home.path(), &hub.url()));
    let mut conn = hub.accept().await;
    let hello = conn.welcome_default().await;
    assert!(!hello.capabilities.iter().any(|c| c == CAP_EXEC));
    conn.send(&exec_frame("ex_no", &["true"], false, home.path()))
        .await;
    match answer(&mut conn).await {
        AgentFrame::ExecRefused { exec_id, reason } => {
            assert_eq!(exec_id, "ex_no");
            assert_eq!(reason, NOT_ALLOWED);
        }
        other => panic!("{other:?}"),
    }
    assert!(!home.path().join("exec").exists());
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_starts_detached_logs_and_its_exit_reaches_a_pid_wait() {
    let home = tempfile::tempdir().expect("tmp");
    let work = tempfile::tempdir().expect("tmp");
    let hub = FakeHub::bind().await;
    let agent = Agent::start(exec_config(home.path(), &hub.url()));
    let mut conn = hub.accept().await;
    let hello = conn.welcome_default().await;
    assert!(
        hello.capabilities.iter().any(|c| c == CAP_EXEC),
        "{hello:?}"
    );

    // Waits for a file, so the test decides when it ends (at most 30 s: a test that fails
    // before it writes the file leaves no command running for ever).
    let script = "echo out; echo err >&2; echo \"env $EXEC_TEST_SECRET\"; pwd; \
                  i=0; while [ ! -e go ] && [ $i -lt 1500 ]; do sleep 0.02; i=$((i+1)); done; exit 3";
    conn.send(&exec_frame(
        "ex_a",
        &["sh", "-c", script],
        false,
        work.path(),
    ))
    .await;
    let (pid, start_time, log) = match answer(&mut conn).await {
        AgentFrame::ExecStarted {
            exec_id,
            pid,
            start_time,
            log,
            already,
        } => {
            assert_eq!(exec_id, "ex_a");
            assert!(!already);
            (pid, start_time, log)
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(
        PathBuf::from(&log),
        std::path::absolute(home.path().join("exec").join("ex_a.log")).expect("abs")
    );
    // Its own session and process group, not the agent's (this test process's).
    let (pgrp, sid) = pgrp_and_session(pid);
    let (_, my_sid) = pgrp_and_session(std::process::id() as i32);
    assert_eq!(pgrp, pid, "a process group of its own");
    assert_eq!(sid, pid, "a session of its own");
    assert_ne!(sid, my_sid);
    let stat = cortex_host::wait::read_stat(pid)
        .expect("stat")
        .expect("running");
    assert_eq!(stat.start_time, start_time);
    let store = ExecStore::under(home.path());
    let rec = store.load("ex_a").expect("load").expect("record");
    assert_eq!((rec.state, rec.pid), (ExecState::Running, Some(pid)));
    let saved = std::fs::read_to_string(store.record_path("ex_a")).expect("read");
    assert!(
        !saved.contains("s3cret-value"),
        "no env value in the record"
    );

    // The same id again: the same run, nothing new.
    conn.send(&exec_frame(
        "ex_a",
        &["sh", "-c", script],
        false,
        work.path(),
    ))
    .await;
    match answer(&mut conn).await {
        AgentFrame::ExecStarted {
            pid: p2,
            start_time: s2,
            already,
            ..
        } => assert_eq!((p2, s2, already), (pid, start_time, true)),
        other => panic!("{other:?}"),
    }

    // A pid wait pinned to the run, armed while it runs.
    conn.send(&HubFrame::WaitArm {
        wait_id: "wp_x".into(),
        spec: WaitSpec::Pid {
            pid,
            start_time: Some(start_time),
            must_exist: false,
        },
        timeout_ms: LIMIT.as_millis() as u64 * 4,
        deadline_ms: 0,
    })
    .await;
    assert!(matches!(
        conn.wait_frame().await,
        AgentFrame::WaitArmed { .. }
    ));
    std::fs::write(work.path().join("go"), "").expect("go");
    match conn.wait_frame().await {
        AgentFrame::WaitDone {
            wait_id,
            outcome,
            payload,
            message,
        } => {
            assert_eq!(wait_id, "wp_x");
            assert_eq!(outcome, WaitEnd::Fired);
            let payload: serde_json::Value = serde_json::from_str(&payload).expect("json");
            assert_eq!(payload["exit_code"], 3, "{payload}");
            assert!(message.ends_with("exited with code 3"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    eventually("the exit recorded", || {
        store
            .load("ex_a")
            .ok()
            .flatten()
            .is_some_and(|r| r.state == ExecState::Exited && r.exit_code == Some(3))
    })
    .await;
    // Reaped: no zombie left behind.
    eventually("the child reaped", || proc_gone(pid)).await;
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(text.contains("out\n") && text.contains("err\n"), "{text}");
    assert!(text.contains("env s3cret-value\n"), "{text}");
    assert!(
        text.contains(&format!("{}\n", work.path().display())),
        "ran in its cwd: {text}"
    );
    // A pid wait armed after the reaping still ends at once.
    conn.send(&HubFrame::WaitArm {
        wait_id: "wp_late".into(),
        spec: WaitSpec::Pid {
            pid,
            start_time: Some(start_time),
            must_exist: false,
        },
        timeout_ms: LIMIT.as_millis() as u64,
        deadline_ms: 0,
    })
    .await;
    loop {
        match conn.wait_frame().await {
            AgentFrame::WaitDone {
                wait_id, outcome, ..
            } => {
                assert_eq!((wait_id.as_str(), outcome), ("wp_late", WaitEnd::Fired));
                break;
            }
            AgentFrame::WaitArmed { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_outlives_its_agent_and_a_restarted_agent_answers_already() {
    let home = tempfile::tempdir().expect("tmp");
    let work = tempfile::tempdir().expect("tmp");
    let hub = FakeHub::bind().await;
    let agent = Agent::start(exec_config(home.path(), &hub.url()));
    let mut conn = hub.accept().await;
    conn.welcome_default().await;
    let script = "i=0; while [ ! -e go ] && [ $i -lt 1500 ]; do sleep 0.02; i=$((i+1)); done";
    conn.send(&exec_frame("ex_b", &[script], true, work.path()))
        .await;
    let pid = match answer(&mut conn).await {
        AgentFrame::ExecStarted { pid, .. } => pid,
        other => panic!("{other:?}"),
    };
    agent.stop().await;
    drop(conn);
    assert!(!proc_gone(pid), "the run outlives the agent");

    let agent = Agent::start(exec_config(home.path(), &hub.url()));
    let mut conn = hub.accept().await;
    conn.welcome_default().await;
    conn.send(&exec_frame("ex_b", &[script], true, work.path()))
        .await;
    match answer(&mut conn).await {
        AgentFrame::ExecStarted {
            pid: p2, already, ..
        } => assert_eq!((p2, already), (pid, true)),
        other => panic!("{other:?}"),
    }
    // Let it end. (It is a child of this test process, the first agent's, which nobody
    // reaps now: a real restarted agent's runs are re-parented and reaped by init.)
    std::fs::write(work.path().join("go"), "").expect("go");
    agent.stop().await;
}
