//! `exec` against a registry whose link's loop is played by the test: the frame sent, each
//! answer mapped, every way nothing is known (offline, not allowed, no answer, the link
//! lost, a reconnect in between), and no waiter left behind by any of them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cortex_protocol::mesh::{AgentFrame, CAP_EXEC, ExecRequest, HostFacts, HubFrame, SpoolCounts};

use super::{ExecError, ExecStarted, exec_on};
use crate::registry::{End, Link, Registry};
use crate::secret;

/// Long enough never to pass in a test that expects an answer.
const LONG: Duration = Duration::from_secs(60);

fn registry() -> Registry {
    let reg = Registry::default();
    reg.allow("gpu1", secret::hash("t"));
    reg
}

fn connect(reg: &Registry, caps: &[&str]) -> Arc<Link> {
    let mut l = Link::new(
        reg.next_link_id(),
        "gpu1".into(),
        "0.1".into(),
        HostFacts::default(),
        SpoolCounts::default(),
        1,
    );
    l.capabilities = caps.iter().map(|c| (*c).to_owned()).collect();
    let l = Arc::new(l);
    reg.register(l.clone(), &secret::hash("t"))
        .expect("register");
    l
}

fn request(id: &str, timeout: Duration) -> ExecRequest {
    ExecRequest {
        exec_id: id.into(),
        argv: vec!["python3".into(), "train.py".into()],
        shell: false,
        cwd: Some("/data".into()),
        env: vec![("CORTEX_SIGNAL_SECRET".into(), "s".into())],
        timeout_ms: timeout.as_millis() as u64,
    }
}

/// Plays the link's loop: answers each queued frame with `answer(frame)` (`None`: no
/// answer); returns the frames it took.
fn agent(
    link: &Arc<Link>,
    answer: impl Fn(&HubFrame) -> Option<AgentFrame> + Send + 'static,
) -> Arc<Mutex<Vec<HubFrame>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (link, frames) = (link.clone(), seen.clone());
    let mut rx = link.requests.take_receiver().expect("receiver");
    tokio::spawn(async move {
        while let Some(f) = rx.recv().await {
            frames.lock().expect("lock").push(f.clone());
            if let HubFrame::Exec(ExecRequest { exec_id, .. }) = &f
                && let Some(a) = answer(&f)
            {
                link.requests.answer(exec_id, &a);
            }
        }
    });
    seen
}

fn started(id: &str, already: bool) -> AgentFrame {
    AgentFrame::ExecStarted {
        exec_id: id.into(),
        pid: 4242,
        start_time: 99,
        log: format!("/home/u/.cortex/exec/{id}.log"),
        already,
    }
}

#[tokio::test]
async fn unknown_offline_and_not_allowed_devices_start_nothing() {
    let reg = registry();
    let e = exec_on(&reg, "nope", request("ex_1", LONG))
        .await
        .expect_err("unknown");
    assert_eq!(
        e,
        ExecError::NoDevice {
            device: "nope".into()
        }
    );
    let e = exec_on(&reg, "gpu1", request("ex_1", LONG))
        .await
        .expect_err("offline");
    assert_eq!(e.to_string(), "device gpu1 is offline; nothing was started");
    let link = connect(&reg, &["spool", "wait-pid"]);
    let e = exec_on(&reg, "gpu1", request("ex_1", LONG))
        .await
        .expect_err("no exec");
    assert_eq!(
        e.to_string(),
        "device gpu1 does not allow exec; its agent runs without --allow-exec"
    );
    assert_eq!(link.requests.pending(), 0);
}

#[tokio::test]
async fn the_frame_goes_out_and_the_answer_comes_back() {
    let reg = registry();
    let link = connect(&reg, &["spool", CAP_EXEC]);
    let seen = agent(&link, |f| match f {
        HubFrame::Exec(ExecRequest { exec_id, .. }) if exec_id == "ex_bad" => {
            Some(AgentFrame::ExecRefused {
                exec_id: exec_id.clone(),
                reason: "python3 is not on this device's exec allow-list: sh".into(),
            })
        }
        HubFrame::Exec(ExecRequest { exec_id, .. }) => {
            Some(started(exec_id, exec_id == "ex_again"))
        }
        _ => None,
    });
    let ok = exec_on(&reg, "gpu1", request("ex_1", LONG))
        .await
        .expect("started");
    assert_eq!(
        ok,
        ExecStarted {
            pid: 4242,
            start_time: 99,
            log: "/home/u/.cortex/exec/ex_1.log".into(),
            already: false,
        }
    );
    let again = exec_on(&reg, "gpu1", request("ex_again", LONG))
        .await
        .expect("started");
    assert!(again.already);
    let e = exec_on(&reg, "gpu1", request("ex_bad", LONG))
        .await
        .expect_err("refused");
    assert_eq!(
        e.to_string(),
        "device gpu1 refused: python3 is not on this device's exec allow-list: sh"
    );
    assert_eq!(link.requests.pending(), 0);
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 3);
    match &seen[0] {
        HubFrame::Exec(ExecRequest {
            exec_id,
            argv,
            shell,
            cwd,
            env,
            timeout_ms,
        }) => {
            assert_eq!(exec_id, "ex_1");
            assert_eq!(argv, &["python3", "train.py"]);
            assert!(!shell);
            assert_eq!(cwd.as_deref(), Some("/data"));
            assert_eq!(env.len(), 1);
            assert_eq!(*timeout_ms, LONG.as_millis() as u64);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn no_answer_times_out_and_leaves_no_waiter() {
    let reg = registry();
    let link = connect(&reg, &[CAP_EXEC]);
    let _task = agent(&link, |_| None);
    let e = exec_on(&reg, "gpu1", request("ex_slow", Duration::from_millis(500)))
        .await
        .expect_err("no answer");
    assert!(matches!(e, ExecError::TimedOut { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "state unknown, exec id ex_slow: no answer from device gpu1 within 0.5 s; the command may be running: do not start it again"
    );
    assert_eq!(link.requests.pending(), 0);
    // An answer after the caller gave up finds nobody and is dropped.
    assert!(!link.requests.answer("ex_slow", &started("ex_slow", false)));
}

#[tokio::test]
async fn a_link_that_ends_or_is_replaced_mid_call_says_so_and_leaks_nothing() {
    let reg = registry();
    let first = connect(&reg, &[CAP_EXEC]);
    let mut rx = first.requests.take_receiver().expect("receiver");
    let call = {
        let reg = Arc::new(reg);
        let r = reg.clone();
        (
            reg,
            tokio::spawn(async move { exec_on(&r, "gpu1", request("ex_1", LONG)).await }),
        )
    };
    let (reg, handle) = call;
    // The frame reached the (played) loop; then the agent reconnects.
    assert!(matches!(rx.recv().await, Some(HubFrame::Exec(_))));
    let second = connect(&reg, &[CAP_EXEC]);
    assert_eq!(first.ended_with(), Some(End::Replaced));
    // The first link's loop closes, as `Live::close` does.
    first.requests.close();
    let e = handle.await.expect("task").expect_err("lost");
    assert_eq!(
        e,
        ExecError::LinkLost {
            device: "gpu1".into(),
            exec_id: "ex_1".into()
        }
    );
    assert!(e.to_string().starts_with("state unknown, exec id "), "{e}");
    assert_eq!(first.requests.pending(), 0);
    assert!(
        first.requests.expect("ex_2").is_none(),
        "a closed link takes no waiter"
    );

    // Asked again on the new link: the device's answer for the same run.
    let _task = agent(&second, |f| match f {
        HubFrame::Exec(ExecRequest { exec_id, .. }) => Some(started(exec_id, true)),
        _ => None,
    });
    let ok = exec_on(&reg, "gpu1", request("ex_1", LONG))
        .await
        .expect("answered");
    assert!(ok.already);
    assert_eq!(second.requests.pending(), 0);
}

#[tokio::test]
async fn a_dropped_call_leaves_no_waiter() {
    let reg = registry();
    let link = connect(&reg, &[CAP_EXEC]);
    let mut rx = link.requests.take_receiver().expect("receiver");
    let call = exec_on(&reg, "gpu1", request("ex_1", LONG));
    tokio::select! {
        _ = call => panic!("answered by nobody"),
        f = rx.recv() => assert!(matches!(f, Some(HubFrame::Exec(_)))),
    }
    assert_eq!(link.requests.pending(), 0);
}

/// Asked again (an earlier ask may have reached the device), no "nothing was started" of
/// this ask stands for the run: each becomes "state unknown" with the exec id; the rest
/// are kept as they are.
#[test]
fn a_reasked_error_never_says_nothing_was_started() {
    let d = || "gpu1".to_string();
    let cases: Vec<(ExecError, bool)> = vec![
        (ExecError::Offline { device: d() }, true),
        (ExecError::NotAllowed { device: d() }, true),
        (ExecError::NoDevice { device: d() }, true),
        (
            ExecError::LinkLost {
                device: d(),
                exec_id: "ex_1".into(),
            },
            false,
        ),
        (
            ExecError::Refused {
                device: d(),
                reason: "state unknown: the agent stopped while starting it".into(),
            },
            false,
        ),
    ];
    for (e, becomes_unknown) in cases {
        let before = e.to_string();
        let after = e.reasked("ex_1");
        let text = after.to_string();
        if becomes_unknown {
            assert!(
                matches!(&after, ExecError::Unknown { exec_id, .. } if exec_id == "ex_1"),
                "{before} -> {text}"
            );
            assert!(text.starts_with("state unknown, exec id ex_1: "), "{text}");
            assert!(!text.contains("nothing was started"), "{text}");
        } else {
            assert_eq!(text, before);
        }
    }
}
