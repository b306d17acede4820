//! Pid waits.

use super::*;

#[tokio::test]
async fn pid_fires_when_the_process_exits() {
    let mut p = Proc::sleep();
    let waits = Waits::new();
    let armed = waits
        .arm(&WaitSpec::Pid {
            pid: p.pid(),
            start_time: None,
            must_exist: false,
        })
        .expect("arm");
    let Captured::Pid(c) = armed.captured() else {
        panic!("not a pid wait")
    };
    let start = read_stat(p.pid())
        .expect("stat")
        .expect("running")
        .start_time;
    assert_eq!(c.comm.as_deref(), Some("sleep"));
    assert_eq!(c.start_time, Some(start));
    assert_eq!(c.method, PidMethod::Pidfd);
    assert!(c.gone.is_none() && armed.fired_at_arm().is_none());
    assert_eq!(
        armed.resume_spec(),
        WaitSpec::Pid {
            pid: p.pid(),
            start_time: Some(start),
            must_exist: false,
        }
    );
    let task = tokio::spawn(async move { armed.wait(&opts(BOUND)).await });
    p.kill();
    let f = fired(task.await.expect("join"));
    assert_eq!(
        f.payload,
        json!({"kind":"pid","pid":p.pid(),"start_time":start,"exited":true,"already_gone":false,"method":"pidfd"})
    );
}

#[tokio::test]
async fn pid_times_out_while_the_process_runs() {
    let p = Proc::sleep();
    let armed = Waits::new()
        .arm(&WaitSpec::Pid {
            pid: p.pid(),
            start_time: None,
            must_exist: false,
        })
        .expect("arm");
    let out = armed.wait(&opts(Duration::from_millis(50))).await;
    assert!(matches!(out, WaitOutcome::TimedOut), "{out:?}");
    assert_eq!(out.exit_code(), 1);
}

#[tokio::test]
async fn a_pid_already_gone_fires_at_once_saying_so() {
    let mut child = Command::new("true").spawn().expect("spawn true");
    let pid = child.id() as i32;
    child.wait().expect("reap");
    let armed = Waits::new()
        .arm(&WaitSpec::Pid {
            pid,
            start_time: None,
            must_exist: false,
        })
        .expect("arm");
    let f = armed.fired_at_arm().expect("fired at arm");
    assert_eq!(f.payload["already_gone"], true);
    assert!(
        f.payload["note"]
            .as_str()
            .expect("note")
            .contains("already gone")
    );
    let out = armed.wait(&opts(Duration::ZERO)).await;
    assert_eq!(
        fired(out).payload["already_gone"],
        true,
        "fires even with a zero bound"
    );
}

#[tokio::test]
async fn must_exist_refuses_a_pid_not_running_and_arms_a_live_one_without_it() {
    let mut child = Command::new("true").spawn().expect("spawn true");
    let gone = child.id() as i32;
    child.wait().expect("reap");
    let mut zombie = Proc::sleep();
    zombie.kill();
    // SIGKILL lands when the kernel gets to it: wait until the process is a zombie.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(format!("/proc/{}/stat", zombie.pid()))
        .ok()
        .and_then(|st| st.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
        != Some(true)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the killed sleep never became a zombie"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let live = Proc::sleep();
    let spec = |pid| WaitSpec::Pid {
        pid,
        start_time: None,
        must_exist: true,
    };
    let waits = Waits::new();
    for pid in [gone, zombie.pid()] {
        match waits.arm(&spec(pid)) {
            Err(e @ WaitError::NotRunning { .. }) => {
                assert!(e.to_string().contains(&format!("pid {pid} is not running")));
            }
            other => panic!("pid {pid}: {other:?}"),
        }
    }
    // Pinned to another start time: the process meant is gone, whoever holds the pid.
    let reused = WaitSpec::Pid {
        pid: live.pid(),
        start_time: Some(1),
        must_exist: true,
    };
    assert!(matches!(
        waits.arm(&reused),
        Err(WaitError::NotRunning { .. })
    ));
    let armed = waits.arm(&spec(live.pid())).expect("a live pid arms");
    assert!(armed.fired_at_arm().is_none());
    // A re-arm (a restart) follows the process it found, and a pid that exited meanwhile
    // then fires: the must-exist check was the first arm's.
    assert!(matches!(
        armed.resume_spec(),
        WaitSpec::Pid {
            must_exist: false,
            start_time: Some(_),
            ..
        }
    ));
}

#[tokio::test]
async fn a_zombie_has_exited() {
    let mut p = Proc::sleep();
    p.kill();
    // Not reaped: it stays a zombie, whose pidfd is readable.
    eventually("the zombie", || {
        read_stat(p.pid())
            .ok()
            .flatten()
            .is_some_and(|s| s.exited())
    })
    .await;
    for waits in [Waits::new(), Waits::new().force_pid_poll()] {
        let armed = waits
            .arm(&WaitSpec::Pid {
                pid: p.pid(),
                start_time: None,
                must_exist: false,
            })
            .expect("arm");
        let f = armed.fired_at_arm().expect("fired at arm");
        assert_eq!(f.payload["already_gone"], true);
        assert!(
            f.payload["note"]
                .as_str()
                .expect("note")
                .contains("already exited")
        );
    }
}

#[tokio::test]
async fn a_reused_pid_is_not_mistaken_for_the_one_we_meant() {
    // The pid now belongs to a process that started at another time than the one we
    // meant: exactly what a reused pid looks like. Faked by asking for a start time off
    // by one, with a real process holding the pid.
    let p = Proc::sleep();
    let real = read_stat(p.pid())
        .expect("stat")
        .expect("running")
        .start_time;
    for waits in [Waits::new(), Waits::new().force_pid_poll()] {
        let armed = waits
            .arm(&WaitSpec::Pid {
                pid: p.pid(),
                start_time: Some(real + 1),
                must_exist: false,
            })
            .expect("arm");
        let Captured::Pid(c) = armed.captured() else {
            panic!("not a pid wait")
        };
        assert_eq!(c.gone, Some(Gone::Reused { now: real }));
        let f = fired(armed.wait(&opts(BOUND)).await);
        assert_eq!(f.payload["already_gone"], true);
        assert_eq!(f.payload["reused"], true);
        assert_eq!(f.payload["start_time"], real + 1, "the identity we meant");
        assert!(
            f.payload["note"]
                .as_str()
                .expect("note")
                .contains("now belongs to another process")
        );
    }
    // The right start time: it waits for this very process.
    let armed = Waits::new()
        .arm(&WaitSpec::Pid {
            pid: p.pid(),
            start_time: Some(real),
            must_exist: false,
        })
        .expect("arm");
    assert!(armed.fired_at_arm().is_none());
}

#[tokio::test]
async fn the_poll_fallback_sees_an_exit() {
    let mut p = Proc::sleep();
    let armed = Waits::new()
        .force_pid_poll()
        .arm(&WaitSpec::Pid {
            pid: p.pid(),
            start_time: None,
            must_exist: false,
        })
        .expect("arm");
    let Captured::Pid(c) = armed.captured() else {
        panic!("not a pid wait")
    };
    assert_eq!(c.method, PidMethod::Poll);
    let task = tokio::spawn(async move { armed.wait(&opts(BOUND)).await });
    // Killed, not reaped: kill(pid, 0) still succeeds on the zombie; its state says Z.
    p.kill();
    let f = fired(task.await.expect("join"));
    assert_eq!(f.payload["method"], "poll");
    assert_eq!(f.payload["already_gone"], false);
}

#[tokio::test]
async fn bad_pids_are_refused() {
    for pid in [0, -1, -4242] {
        let e = Waits::new()
            .arm(&WaitSpec::Pid {
                pid,
                start_time: None,
                must_exist: false,
            })
            .expect_err("bad pid");
        assert!(matches!(e, WaitError::BadPid { .. }), "{e}");
    }
}

#[tokio::test]
async fn a_cancelled_pid_wait_closes_its_pidfd() {
    let p = Proc::sleep();
    let armed = Waits::new()
        .arm(&WaitSpec::Pid {
            pid: p.pid(),
            start_time: None,
            must_exist: false,
        })
        .expect("arm");
    let Inner::Pid(w) = armed.inner() else {
        panic!("not a pid wait")
    };
    let fd = w.pidfd().expect("a pidfd").as_raw_fd();
    let fdinfo = format!("/proc/self/fdinfo/{fd}");
    let pid_line = format!("Pid:\t{}", p.pid());
    assert!(
        fs::read_to_string(&fdinfo)
            .expect("fdinfo")
            .contains(&pid_line)
    );
    // Cancel = drop the future, here by a bound that passes first.
    let r = tokio::time::timeout(Duration::from_millis(20), armed.wait(&opts(BOUND))).await;
    assert!(r.is_err(), "still waiting when cancelled");
    // The number may have been reused by another test since, but not for this pid.
    let now = fs::read_to_string(&fdinfo).unwrap_or_default();
    assert!(!now.contains(&pid_line), "pidfd {fd} still open: {now}");
}
