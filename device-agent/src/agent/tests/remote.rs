//! Remote waits through the whole daemon against the in-test hub: arm, fire, ack; the same
//! id armed twice arms once; cancel; the bound; an outcome sent again on every link until
//! acknowledged; the saved state re-armed after a restart (a pid that exited meanwhile
//! fires at once, once); a relative path refused; the waits file's round trip, and a file
//! of an earlier agent read and written back unchanged; log, silence and any-of waits with
//! their one-line messages.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cortex_protocol::mesh::{AgentFrame, FileCursor, HubFrame, WaitEnd, WaitSpec};

use super::daemon::{Agent, config, eventually};
use super::fake_hub::{FakeHub, LIMIT};
use crate::agent::waits::{DoneWait, HeldWait, WaitsFile, WaitsStore};

/// A `sleep` child, killed and reaped when dropped.
struct Proc(Child);

impl Proc {
    fn sleep() -> Proc {
        Proc(
            Command::new("sleep")
                .arg("300")
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn sleep"),
        )
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn pid_spec(pid: i32) -> WaitSpec {
    WaitSpec::Pid {
        pid,
        start_time: None,
        must_exist: false,
    }
}

fn arm(id: &str, spec: WaitSpec, timeout: Duration) -> HubFrame {
    HubFrame::WaitArm {
        wait_id: id.into(),
        spec,
        timeout_ms: timeout.as_millis() as u64,
        deadline_ms: 0,
    }
}

fn saved(home: &std::path::Path) -> WaitsFile {
    let (f, problem) = WaitsStore::under(home).load();
    assert!(problem.is_none(), "{problem:?}");
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pid_wait_arms_fires_and_is_forgotten_once_acknowledged() {
    let home = tempfile::tempdir().expect("tmp");
    let hub = FakeHub::bind().await;
    let agent = Agent::start(config(home.path(), &hub.url()));
    let mut conn = hub.accept().await;
    conn.welcome_default().await;
    let mut p = Proc::sleep();

    conn.send(&arm("wp_a", pid_spec(p.pid()), LIMIT * 6)).await;
    let (captured, resume) = match conn.wait_frame().await {
        AgentFrame::WaitArmed {
            wait_id,
            captured,
            resume,
        } => {
            assert_eq!(wait_id, "wp_a");
            (captured, resume)
        }
        other => panic!("{other:?}"),
    };
    let captured: serde_json::Value = serde_json::from_str(&captured).expect("json");
    assert_eq!(captured["comm"], "sleep", "{captured}");
    // The resume spec pins the process by its start time.
    let Some(WaitSpec::Pid {
        pid,
        start_time: Some(st),
        must_exist: false,
    }) = resume
    else {
        panic!("no pinned resume spec: {resume:?}");
    };
    assert_eq!(pid, p.pid());
    assert_eq!(captured["start_time"], st);

    // The same id again: answered again, nothing new armed.
    conn.send(&arm("wp_a", pid_spec(p.pid()), LIMIT * 6)).await;
    assert!(matches!(
        conn.wait_frame().await,
        AgentFrame::WaitArmed { wait_id, .. } if wait_id == "wp_a"
    ));
    eventually("the wait saved", || saved(home.path()).waits.len() == 1).await;

    p.kill();
    match conn.wait_frame().await {
        AgentFrame::WaitDone {
            wait_id,
            outcome,
            payload,
            message,
        } => {
            assert_eq!(wait_id, "wp_a");
            assert_eq!(outcome, WaitEnd::Fired);
            assert_eq!(message, format!("pid {} (sleep) exited", p.pid()));
            let payload: serde_json::Value = serde_json::from_str(&payload).expect("json");
            assert_eq!(payload["exited"], true, "{payload}");
        }
        other => panic!("{other:?}"),
    }
    // Fired once: the duplicate arm left no second wait behind.
    assert!(
        conn.wait_frame_within(Duration::from_millis(300))
            .await
            .is_none()
    );
    eventually("the outcome saved", || {
        let f = saved(home.path());
        f.waits.is_empty() && f.outbox.len() == 1
    })
    .await;
    conn.send(&HubFrame::WaitAck {
        wait_id: "wp_a".into(),
    })
    .await;
    eventually("the outcome forgotten", || {
        saved(home.path()).outbox.is_empty()
    })
    .await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_drops_the_wait_and_the_bound_times_out() {
    let home = tempfile::tempdir().expect("tmp");
    let hub = FakeHub::bind().await;
    let agent = Agent::start(config(home.path(), &hub.url()));
    let mut conn = hub.accept().await;
    conn.welcome_default().await;
    let mut p = Proc::sleep();

    conn.send(&arm("wp_c", pid_spec(p.pid()), LIMIT * 6)).await;
    assert!(matches!(
        conn.wait_frame().await,
        AgentFrame::WaitArmed { .. }
    ));
    // Saved first, so "gone from disk" below means the cancel was handled.
    eventually("the wait saved", || saved(home.path()).waits.len() == 1).await;
    conn.send(&HubFrame::WaitCancel {
        wait_id: "wp_c".into(),
    })
    .await;
    eventually("the cancelled wait gone from disk", || {
        saved(home.path()).waits.is_empty()
    })
    .await;
    p.kill();
    assert!(
        conn.wait_frame_within(Duration::from_millis(300))
            .await
            .is_none(),
        "a cancelled wait reports nothing"
    );

    let q = Proc::sleep();
    conn.send(&arm("wp_t", pid_spec(q.pid()), Duration::from_millis(150)))
        .await;
    assert!(matches!(
        conn.wait_frame().await,
        AgentFrame::WaitArmed { .. }
    ));
    match conn.wait_frame().await {
        AgentFrame::WaitDone {
            outcome, message, ..
        } => {
            assert_eq!(outcome, WaitEnd::TimedOut);
            assert!(message.contains("still running"), "{message}");
        }
        other => panic!("{other:?}"),
    }

    // A relative path means nothing on the device: broke, with the reason.
    conn.send(&arm(
        "wp_r",
        WaitSpec::Flock {
            path: "rel/lock".into(),
        },
        LIMIT,
    ))
    .await;
    match conn.wait_frame().await {
        AgentFrame::WaitDone {
            wait_id,
            outcome,
            message,
            ..
        } => {
            assert_eq!(wait_id, "wp_r");
            assert_eq!(outcome, WaitEnd::Broke);
            assert!(message.contains("absolute"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_goes_again_on_every_link_until_acknowledged() {
    let home = tempfile::tempdir().expect("tmp");
    let hub = FakeHub::bind().await;
    let agent = Agent::start(config(home.path(), &hub.url()));
    let mut conn = hub.accept().await;
    conn.welcome_default().await;
    let mut p = Proc::sleep();
    conn.send(&arm("wp_o", pid_spec(p.pid()), LIMIT * 6)).await;
    assert!(matches!(
        conn.wait_frame().await,
        AgentFrame::WaitArmed { .. }
    ));
    p.kill();
    assert!(matches!(
        conn.wait_frame().await,
        AgentFrame::WaitDone { .. }
    ));
    // The link drops before the hub's ack.
    drop(conn);

    let mut conn = hub.accept().await;
    let hello = conn.welcome_default().await;
    assert_eq!(hello.waits, ["wp_o"], "the hello lists what it holds");
    match conn.wait_frame().await {
        AgentFrame::WaitDone {
            wait_id, outcome, ..
        } => {
            assert_eq!(wait_id, "wp_o");
            assert_eq!(outcome, WaitEnd::Fired);
        }
        other => panic!("{other:?}"),
    }
    conn.send(&HubFrame::WaitAck {
        wait_id: "wp_o".into(),
    })
    .await;
    eventually("acknowledged", || saved(home.path()).outbox.is_empty()).await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_re_arms_and_a_pid_gone_meanwhile_fires_once() {
    let home = tempfile::tempdir().expect("tmp");
    let hub = FakeHub::bind().await;
    let mut stays = Proc::sleep();
    let mut goes = Proc::sleep();
    {
        let agent = Agent::start(config(home.path(), &hub.url()));
        let mut conn = hub.accept().await;
        conn.welcome_default().await;
        conn.send(&arm("wp_stays", pid_spec(stays.pid()), LIMIT * 6))
            .await;
        conn.send(&arm("wp_goes", pid_spec(goes.pid()), LIMIT * 6))
            .await;
        for _ in 0..2 {
            assert!(matches!(
                conn.wait_frame().await,
                AgentFrame::WaitArmed { .. }
            ));
        }
        eventually("both saved", || saved(home.path()).waits.len() == 2).await;
        let stop = tokio::spawn(agent.stop());
        let _ = conn.close_reason().await;
        stop.await.expect("stop");
    }
    let f = saved(home.path());
    assert!(
        f.waits.iter().all(|w| matches!(
            w.spec,
            WaitSpec::Pid {
                start_time: Some(_),
                ..
            }
        )),
        "saved pinned to start times: {f:?}"
    );
    // While the agent is down, one of them exits.
    goes.kill();

    let agent = Agent::start(config(home.path(), &hub.url()));
    let mut conn = hub.accept().await;
    let hello = conn.welcome_default().await;
    assert_eq!(hello.waits, ["wp_goes", "wp_stays"]);
    match conn.wait_frame().await {
        AgentFrame::WaitDone {
            wait_id,
            outcome,
            payload,
            ..
        } => {
            assert_eq!(wait_id, "wp_goes");
            assert_eq!(outcome, WaitEnd::Fired);
            assert!(payload.contains("already"), "{payload}");
        }
        other => panic!("{other:?}"),
    }
    conn.send(&HubFrame::WaitAck {
        wait_id: "wp_goes".into(),
    })
    .await;
    stays.kill();
    match conn.wait_frame().await {
        AgentFrame::WaitDone {
            wait_id, outcome, ..
        } => {
            assert_eq!(wait_id, "wp_stays");
            assert_eq!(outcome, WaitEnd::Fired);
        }
        other => panic!("{other:?}"),
    }
    // Once each: nothing more comes.
    assert!(
        conn.wait_frame_within(Duration::from_millis(300))
            .await
            .is_none()
    );
    agent.stop().await;
}

#[test]
fn the_waits_file_round_trips_and_a_bad_one_is_moved_aside() {
    let home = tempfile::tempdir().expect("tmp");
    let store = WaitsStore::under(home.path());
    let file = WaitsFile {
        version: 1,
        waits: vec![HeldWait {
            id: "wp_1".into(),
            spec: WaitSpec::Pid {
                pid: 42,
                start_time: Some(7),
                must_exist: false,
            },
            deadline_ms: 10,
            armed_at_ms: 5,
            captured: "{}".into(),
        }],
        outbox: vec![DoneWait {
            id: "wp_2".into(),
            outcome: WaitEnd::Broke,
            payload: "{}".into(),
            message: "m".into(),
        }],
    };
    store.save(&file).expect("save");
    let (back, problem) = store.load();
    assert!(problem.is_none());
    assert_eq!(back, file);
    let mode = std::fs::metadata(home.path().join("agent"))
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
        .expect("dir");
    assert_eq!(mode, 0o700);

    std::fs::write(store.path(), b"{not json").expect("write");
    let (back, problem) = store.load();
    assert_eq!(back, WaitsFile::default());
    assert!(
        problem.is_some_and(|p| p.to_string().contains("moved aside")),
        "reported"
    );
    assert!(!store.path().exists(), "moved aside, not deleted");
}

/// A `waits.json` as the agent wrote it before the wait types were unified (one of each
/// kind, a file cursor, an outcome): read as it was, and written back byte for byte.
#[test]
fn a_waits_file_of_an_earlier_agent_reads_and_writes_back_unchanged() {
    const OLD: &str = concat!(
        r#"{"version":1,"waits":["#,
        r#"{"id":"wp_p","spec":{"kind":"pid","pid":4242,"start_time":987654},"deadline_ms":1700000060000,"armed_at_ms":1700000000000,"captured":"{\"kind\":\"pid\",\"pid\":4242}"},"#,
        r#"{"id":"wp_f","spec":{"kind":"file","path":"/data/run/out.log","cursor":{"exists":true,"dev":2049,"ino":131,"size":10,"mtime_ns":1700000000123456789}},"deadline_ms":2,"armed_at_ms":1,"captured":"{}"},"#,
        r#"{"id":"wp_a","spec":{"kind":"file","path":"/data/new.log","cursor":{"exists":false,"dev":0,"ino":0,"size":0,"mtime_ns":0}},"deadline_ms":2,"armed_at_ms":1,"captured":"{}"},"#,
        r#"{"id":"wp_l","spec":{"kind":"flock","path":"/tmp/train.lock"},"deadline_ms":2,"armed_at_ms":1,"captured":"{}"}"#,
        r#"],"outbox":[{"id":"wp_d","outcome":"timed_out","payload":"{}","message":"pid 7 is still running"}]}"#,
        "\n"
    );
    let home = tempfile::tempdir().expect("tmp");
    let store = WaitsStore::under(home.path());
    std::fs::create_dir_all(home.path().join("agent")).expect("mkdir");
    std::fs::write(store.path(), OLD).expect("write");
    let file = saved(home.path());
    let held = |id: &str, spec, deadline_ms, armed_at_ms, captured: &str| HeldWait {
        id: id.into(),
        spec,
        deadline_ms,
        armed_at_ms,
        captured: captured.into(),
    };
    let expected = WaitsFile {
        version: 1,
        waits: vec![
            held(
                "wp_p",
                WaitSpec::Pid {
                    pid: 4242,
                    start_time: Some(987_654),
                    must_exist: false,
                },
                1_700_000_060_000,
                1_700_000_000_000,
                r#"{"kind":"pid","pid":4242}"#,
            ),
            held(
                "wp_f",
                WaitSpec::File {
                    path: "/data/run/out.log".into(),
                    cursor: Some(FileCursor {
                        exists: true,
                        dev: 2049,
                        ino: 131,
                        size: 10,
                        mtime_ns: 1_700_000_000_123_456_789,
                    }),
                    silence_ms: None,
                },
                2,
                1,
                "{}",
            ),
            held(
                "wp_a",
                WaitSpec::File {
                    path: "/data/new.log".into(),
                    cursor: Some(FileCursor::absent()),
                    silence_ms: None,
                },
                2,
                1,
                "{}",
            ),
            held(
                "wp_l",
                WaitSpec::Flock {
                    path: "/tmp/train.lock".into(),
                },
                2,
                1,
                "{}",
            ),
        ],
        outbox: vec![DoneWait {
            id: "wp_d".into(),
            outcome: WaitEnd::TimedOut,
            payload: "{}".into(),
            message: "pid 7 is still running".into(),
        }],
    };
    assert_eq!(file, expected);
    store.save(&file).expect("save");
    assert_eq!(
        std::fs::read_to_string(store.path()).expect("read"),
        OLD,
        "written back in the same bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_and_flock_waits_run_on_the_spools_inotify_instance() {
    let home = tempfile::tempdir().expect("tmp");
    let hub = FakeHub::bind().await;
    let agent = Agent::start(config(home.path(), &hub.url()));
    let mut conn = hub.accept().await;
    conn.welcome_default().await;

    // Beside the spool (`home/tmp/signals`), so its directory's descriptor is shared.
    let target = home.path().join("tmp").join("result.json");
    conn.send(&arm(
        "wp_f",
        WaitSpec::File {
            path: target.to_string_lossy().into_owned(),
            cursor: None,
            silence_ms: None,
        },
        LIMIT * 6,
    ))
    .await;
    assert!(matches!(
        conn.wait_frame().await,
        AgentFrame::WaitArmed { .. }
    ));
    std::fs::write(&target, b"{}").expect("write");
    match conn.wait_frame().await {
        AgentFrame::WaitDone {
            outcome, message, ..
        } => {
            assert_eq!(outcome, WaitEnd::Fired);
            assert!(message.ends_with("was written (close_write)"), "{message}");
        }
        other => panic!("{other:?}"),
    }

    // A flock held here (another open file description than the wait's), released by
    // closing it.
    let lock = home.path().join("train.lock");
    let held = std::fs::File::create(&lock).expect("lock file");
    rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive).expect("flock");
    conn.send(&arm(
        "wp_l",
        WaitSpec::Flock {
            path: lock.to_string_lossy().into_owned(),
        },
        LIMIT * 6,
    ))
    .await;
    match conn.wait_frame().await {
        AgentFrame::WaitArmed { captured, .. } => {
            assert!(captured.contains("\"free\":false"), "{captured}")
        }
        other => panic!("{other:?}"),
    }
    drop(held);
    match conn.wait_frame().await {
        AgentFrame::WaitDone {
            outcome, message, ..
        } => {
            assert_eq!(outcome, WaitEnd::Fired);
            assert!(message.contains("is free"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    agent.stop().await;
}

/// The next `WaitDone`: (outcome, payload, message).
async fn done(conn: &mut super::fake_hub::Conn) -> (WaitEnd, serde_json::Value, String) {
    loop {
        match conn.wait_frame().await {
            AgentFrame::WaitDone {
                outcome,
                payload,
                message,
                ..
            } => {
                return (
                    outcome,
                    serde_json::from_str(&payload).expect("json"),
                    message,
                );
            }
            AgentFrame::WaitArmed { .. } => {}
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_silence_and_any_waits_run_and_say_what_fired() {
    let home = tempfile::tempdir().expect("tmp");
    let hub = FakeHub::bind().await;
    let agent = Agent::start(config(home.path(), &hub.url()));
    let mut conn = hub.accept().await;
    conn.welcome_default().await;
    let log = home.path().join("train.log");
    std::fs::write(&log, "loss=nan (before the arm)\n").expect("write");
    let path = log.to_string_lossy().into_owned();
    let log_spec = WaitSpec::Log {
        path: path.clone(),
        pattern: "nan".into(),
        cursor: None,
        silence_ms: None,
    };

    conn.send(&arm("wp_log", log_spec.clone(), LIMIT * 6)).await;
    match conn.wait_frame().await {
        AgentFrame::WaitArmed {
            captured, resume, ..
        } => {
            let c: serde_json::Value = serde_json::from_str(&captured).expect("json");
            assert_eq!(
                (c["kind"].as_str(), c["exists"].as_bool()),
                (Some("log"), Some(true))
            );
            assert!(
                matches!(resume, Some(WaitSpec::Log { cursor: Some(c), .. }) if c.offset == 26),
                "{resume:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .expect("open");
    std::io::Write::write_all(&mut f, b"loss=0.4\nloss=nan\n").expect("append");
    let (end, payload, message) = done(&mut conn).await;
    assert_eq!(end, WaitEnd::Fired);
    assert_eq!(payload["line"], "loss=nan");
    assert_eq!(
        message,
        format!("{path}: a line matched /nan/: \"loss=nan\"")
    );

    // A silence on a file nobody writes.
    let quiet = home.path().join("quiet");
    conn.send(&arm(
        "wp_quiet",
        WaitSpec::File {
            path: quiet.to_string_lossy().into_owned(),
            cursor: None,
            silence_ms: Some(200),
        },
        LIMIT * 6,
    ))
    .await;
    let (end, payload, message) = done(&mut conn).await;
    assert_eq!(
        (end, payload["reason"].as_str()),
        (WaitEnd::Fired, Some("silent"))
    );
    assert!(message.contains("has not grown for"), "{message}");

    // The first of a pid and the log: the log.
    let p = Proc::sleep();
    conn.send(&arm(
        "wp_any",
        WaitSpec::Any {
            conditions: vec![pid_spec(p.pid()), log_spec],
        },
        LIMIT * 6,
    ))
    .await;
    eventually("the any wait saved", || {
        saved(home.path()).waits.iter().any(|w| w.id == "wp_any")
    })
    .await;
    std::io::Write::write_all(&mut f, b"nan again\n").expect("append");
    let (end, payload, message) = done(&mut conn).await;
    assert_eq!((end, payload["which"].as_u64()), (WaitEnd::Fired, Some(1)));
    assert_eq!(
        message,
        format!("any: log:{path}~nan fired first: {path}: a line matched /nan/: \"nan again\"")
    );
    agent.stop().await;
}
