//! `cortex` for sessions that run a model, against a real hub that runs none: a session
//! made with instructions and examples from files, `say --follow` saying that nothing
//! will answer (exit 2), `chat` ending on Ctrl-C with 0, `session result` before any run.
//! The model's side (streamed answers, tool calls) is pinned by the CLI's unit tests
//! against canned streams.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc::channel;
use std::time::Duration;

use cortex_tests::{Hub, bin};
use rustix::process::{Pid, Signal, kill_process};

#[test]
fn a_session_with_instructions_and_examples_from_files() {
    let hub = Hub::start();
    let dir = tempfile::tempdir().expect("tmp");
    let sys = dir.path().join("sys.txt");
    std::fs::write(&sys, "You watch training runs and say when they land.\n").expect("write");
    let ex = dir.path().join("ex.json");
    std::fs::write(
        &ex,
        r#"[{"role":"user","content":"watch pid 4242"},{"role":"assistant","content":"armed"}]"#,
    )
    .expect("write");
    let (code, out, err) = hub.cortex(&[
        "session",
        "new",
        "--title",
        "watcher",
        "--instructions",
        &format!("@{}", sys.display()),
        "--examples",
        &format!("@{}", ex.display()),
        "--max-tokens",
        "512",
    ]);
    assert_eq!(code, 0, "{err}");
    let sid = out.trim();
    assert!(sid.starts_with("ses_"), "{out}");
    let (code, out, _) = hub.cortex(&["sessions"]);
    assert_eq!(code, 0);
    assert!(out.contains(sid) && out.contains("watcher"), "{out}");

    let missing = dir.path().join("nope.txt");
    let (code, out, err) = hub.cortex(&[
        "session",
        "new",
        "--instructions",
        &format!("@{}", missing.display()),
    ]);
    assert_eq!((code, out.as_str()), (1, ""));
    assert!(err.contains("cannot read the file"), "{err}");
}

#[test]
fn say_follow_on_a_hub_without_a_model_exits_2_and_keeps_the_message() {
    let hub = Hub::start();
    // An agent session (a mailbox says that it is one, below).
    let (code, out, err) = hub.cortex(&["session", "new", "--runs"]);
    assert_eq!(code, 0, "{err}");
    let sid = out.trim().to_string();
    let (code, out, err) = hub.cortex(&["session", "say", &sid, "anyone there?", "--follow"]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(
        err.contains("the hub runs no model") && err.contains("CORTEX_LLM_BASE_URL"),
        "{err}"
    );
    let events = hub.events(&sid, 0);
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "message" && e["text"] == "anyone there?"),
        "{events:?}"
    );
    let (code, _, err) = hub.cortex(&["session", "say", "ses_gone", "hi", "--follow"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn chat_ends_on_ctrl_c_with_status_0() {
    let hub = Hub::start();
    let (code, out, err) = hub.cortex(&["session", "new", "--runs"]);
    assert_eq!(code, 0, "{err}");
    let sid = out.trim().to_string();
    let mut child = Command::new(bin("cortex"))
        .args(["--hub", &hub.url(""), "chat", &sid])
        .env("CORTEX_WEBHOOK_TOKEN", &hub.token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cortex chat");
    let mut stdin = child.stdin.take().expect("stdin");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    writeln!(stdin, "hello").expect("write a line");
    // Once it answered the post, Ctrl-C is caught (it is set up before the first line
    // is read).
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("chat says the hub runs no model");
    assert!(line.contains("the hub runs no model"), "{line}");
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid")).expect("pid");
    kill_process(pid, Signal::INT).expect("SIGINT");
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(0), "Ctrl-C ends the chat with 0");
    drop(stdin);
    let events = hub.events(&sid, 0);
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "message" && e["text"] == "hello"),
        "{events:?}"
    );
}

#[test]
fn result_before_any_run_is_an_error() {
    let hub = Hub::start();
    let sid = hub.session();
    let (code, out, err) = hub.cortex(&["session", "result", &sid]);
    assert_eq!((code, out.as_str()), (1, ""));
    assert!(err.contains("HTTP 404"), "{err}");
}
