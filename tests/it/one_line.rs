//! A job needs no edit and no configuration: the hub writes its address beside its token
//! (`$CORTEX_HOME/hub/url`) and `cortex` and `cortex-signal` find it there (a hub on port 0
//! included); `cortex-signal` takes `CORTEX_HUB` as `cortex` does; `cortex run -- CMD`
//! arms a waitpoint, runs the command with the signal environment, and reports its end
//! (the exit code, a signal, the hub away and back, no hub at all); `cortex completion`
//! prints a shell's completions; every listing's `--json` is an array; the hub's refusals
//! name the flags the user typed.

// Fields of JSON the hub just answered with; a panic is the test failing.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use cortex_cli::http::Method;
use cortex_tests::{Hub, bin, command as bare, dead_port, wait_until};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);

fn output(mut cmd: Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("run");
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).to_string(),
        String::from_utf8_lossy(&stderr).to_string(),
    )
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn a_hub_on_port_0_is_found_through_the_address_it_writes() {
    let mut hub = Hub::start();
    let file = hub.home.join("hub/url");
    assert_eq!(
        std::fs::read_to_string(&file).expect("the hub wrote its address"),
        format!("http://{}\n", hub.addr)
    );
    let home = s(&hub.home).to_string();

    // `cortex` with only CORTEX_HOME: the address and the token both come from the home.
    let (code, out, err) = output(bare(
        "cortex",
        &["sessions", "--json"],
        &[("CORTEX_HOME", &home)],
    ));
    assert_eq!((code, out.trim()), (0, "[]"), "{err}");

    // `cortex-signal` the same way: delivered to the hub, not spooled.
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "found", "intent": "x"}));
    let (id, secret) = (wp["id"].as_str().unwrap(), wp["secret"].as_str().unwrap());
    let (code, _, err) = output(bare(
        "cortex-signal",
        &["--exit-code", "0"],
        &[
            ("CORTEX_HOME", &home),
            ("CORTEX_SIGNAL_ID", id),
            ("CORTEX_SIGNAL_SECRET", secret),
        ],
    ));
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("spool"), "sent, not spooled: {err}");
    assert_eq!(hub.get_waitpoint(id)["state"], "resolved");

    // CORTEX_HUB for cortex-signal, from a home that knows no hub.
    let elsewhere = tempfile::tempdir().expect("tmp");
    let wp = hub.waitpoint(&sid, json!({"label": "named", "intent": "x"}));
    let (id, secret) = (wp["id"].as_str().unwrap(), wp["secret"].as_str().unwrap());
    let (code, _, err) = output(bare(
        "cortex-signal",
        &["--exit-code", "0"],
        &[
            ("CORTEX_HOME", s(elsewhere.path())),
            ("CORTEX_HUB", &hub.url("")),
            ("CORTEX_SIGNAL_ID", id),
            ("CORTEX_SIGNAL_SECRET", secret),
        ],
    ));
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("spool"), "sent, not spooled: {err}");
    assert_eq!(hub.get_waitpoint(id)["state"], "resolved");
    assert_eq!(
        std::fs::read_dir(elsewhere.path().join("tmp/signals"))
            .map(|d| d.count())
            .unwrap_or(0),
        0,
        "nothing spooled"
    );

    // A clean stop takes the address away; the next start writes its new one.
    hub.stop();
    assert!(!file.exists(), "a stopped hub leaves no address behind");
    hub.spawn();
    assert_eq!(
        std::fs::read_to_string(&file).expect("written again"),
        format!("http://{}\n", hub.addr)
    );
}

/// The session `cortex run` without `--session` reports to, and its one waitpoint.
fn run_waitpoint(hub: &Hub) -> (String, Value) {
    let (_, list) = hub.api(Method::Get, "/api/sessions", None);
    let sid = list
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["title"] == "cortex waits (ada)")
        .map(|s| s["id"].as_str().unwrap().to_string())
        .expect("the default session");
    let (_, wps) = hub.api(
        Method::Get,
        &format!("/api/sessions/{sid}/waitpoints"),
        None,
    );
    let wp = wps["waitpoints"]
        .as_array()
        .unwrap()
        .last()
        .cloned()
        .unwrap();
    (sid, wp)
}

#[test]
fn cortex_run_reports_the_commands_end_and_exits_with_its_status() {
    let hub = Hub::start();
    let url = hub.url("");
    let sig = bin("cortex-signal");
    // The job sees the signal environment: it reports progress itself, then fails with 3.
    let script = r#"test -n "$CORTEX_SIGNAL_ID" && "$SIG" --status progress --message half && echo out && exit 3"#;
    let (code, out, err) = output(bare(
        "cortex",
        &[
            "--hub", &url, "run", "--label", "job", "--", "sh", "-c", script,
        ],
        &[
            ("CORTEX_WEBHOOK_TOKEN", &hub.token),
            ("USER", "ada"),
            ("SIG", s(&sig)),
        ],
    ));
    assert_eq!((code, out.as_str()), (3, "out\n"), "{err}");
    let (sid, wp) = run_waitpoint(&hub);
    let id = wp["id"].as_str().unwrap();
    assert_eq!(wp["label"], "job");
    assert!(
        err.starts_with(&format!("cortex: armed {id} in session {sid}")),
        "{err}"
    );
    assert!(err.contains("reported exit=3 after"), "{err}");
    let wake = hub.wait_wake(&sid, id, 1, T);
    assert_eq!(wake["reason"], "failed", "{wake}");
    let view = hub.get_waitpoint(id);
    let statuses: Vec<&str> = view["signals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["progress", "fail"]);

    // A zero exit is ok; the label defaults to the program's name.
    let (code, _, err) = output(bare(
        "cortex",
        &["--hub", &url, "run", "--", "true"],
        &[("CORTEX_WEBHOOK_TOKEN", &hub.token), ("USER", "ada")],
    ));
    assert_eq!(code, 0, "{err}");
    let (sid, wp) = run_waitpoint(&hub);
    assert_eq!(wp["label"], "true");
    let wake = hub.wait_wake(&sid, wp["id"].as_str().unwrap(), 1, T);
    assert_eq!(wake["reason"], "fired", "{wake}");

    // A command that does not exist: 127, and the session hears why.
    let (code, _, err) = output(bare(
        "cortex",
        &["--hub", &url, "run", "--", "/nonexistent/cmd"],
        &[("CORTEX_WEBHOOK_TOKEN", &hub.token), ("USER", "ada")],
    ));
    assert_eq!(code, 127, "{err}");
    let (sid, wp) = run_waitpoint(&hub);
    let wake = hub.wait_wake(&sid, wp["id"].as_str().unwrap(), 1, T);
    assert_eq!(wake["reason"], "failed", "{wake}");
    assert!(
        wake["signals"][0]["message"]
            .as_str()
            .unwrap()
            .starts_with("cannot start /nonexistent/cmd"),
        "{wake}"
    );

    // No hub at all: the command still runs, and its status is still the exit status.
    let dead = format!("http://127.0.0.1:{}", dead_port());
    let (code, out, err) = output(bare(
        "cortex",
        &["--hub", &dead, "run", "--", "sh", "-c", "echo ran; exit 5"],
        &[("CORTEX_WEBHOOK_TOKEN", "x")],
    ));
    assert_eq!((code, out.as_str()), (5, "ran\n"), "{err}");
    assert!(err.contains("no waitpoint armed"), "{err}");
}

/// `cortex run ARGS` on `hub`'s home as user ada, its stderr in `errf`, once it has
/// said it armed.
fn start_run(hub: &Hub, errf: &Path, args: &[&str]) -> std::process::Child {
    let url = hub.url("");
    let mut argv = vec!["--hub", url.as_str(), "run"];
    argv.extend_from_slice(args);
    let mut cmd = bare(
        "cortex",
        &argv,
        &[
            ("CORTEX_WEBHOOK_TOKEN", &hub.token),
            ("USER", "ada"),
            ("CORTEX_HOME", s(&hub.home)),
        ],
    );
    cmd.stderr(std::fs::File::create(errf).expect("err file"));
    let child = cmd.spawn().expect("spawn cortex run");
    wait_until(T, "the armed line", || {
        std::fs::read_to_string(errf)
            .ok()
            .filter(|e| e.contains("armed"))
    });
    child
}

#[test]
fn cortex_run_passes_sigterm_on_and_a_hub_away_at_the_end_gets_the_report_from_the_spool() {
    let mut hub = Hub::start();
    let files = tempfile::tempdir().expect("tmp");
    let gate = files.path().join("gate");
    std::fs::write(&gate, "").expect("gate");
    let errf = files.path().join("err");

    // SIGTERM to `cortex run` reaches the command, and its end is reported as such.
    let mut child = start_run(&hub, &errf, &["--label", "long", "--", "sleep", "300"]);
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    let status = wait_until(T, "cortex run to end", || child.try_wait().ok().flatten());
    assert_eq!(
        status.code(),
        Some(143),
        "{:?}",
        std::fs::read_to_string(&errf)
    );
    let (sid, wp) = run_waitpoint(&hub);
    let wake = hub.wait_wake(&sid, wp["id"].as_str().unwrap(), 1, T);
    assert_eq!(wake["reason"], "failed", "{wake}");
    let msg = wake["signals"][0]["message"].as_str().unwrap();
    assert!(msg.starts_with("killed by signal 15 (SIGTERM)"), "{msg}");

    // The hub goes away while the command runs: the end waits in the spool and is
    // delivered, once, when the hub is back.
    let script = format!("while [ -e '{}' ]; do sleep 0.05; done; exit 0", s(&gate));
    let mut child = start_run(
        &hub,
        &errf,
        &["--label", "spooled", "--", "sh", "-c", &script],
    );
    let (sid, wp) = run_waitpoint(&hub);
    let id = wp["id"].as_str().unwrap().to_string();
    assert_eq!(wp["label"], "spooled");
    hub.kill();
    std::fs::remove_file(&gate).expect("open the gate");
    let status = wait_until(T, "cortex run to end", || child.try_wait().ok().flatten());
    let err = std::fs::read_to_string(&errf).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(err.contains("waits in the spool"), "{err}");
    hub.spawn();
    let wake = hub.wait_wake(&sid, &id, 1, T);
    assert_eq!(wake["reason"], "fired", "{wake}");
    assert_eq!(
        hub.get_waitpoint(&id)["signals"].as_array().unwrap().len(),
        1
    );
}

#[test]
fn cortex_completion_prints_each_shells_script() {
    for (shell, mark) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef cortex"),
        ("fish", "complete -c cortex"),
    ] {
        let (code, out, err) = output(bare("cortex", &["completion", shell], &[]));
        assert_eq!(code, 0, "{shell}: {err}");
        assert!(
            out.contains(mark),
            "{shell}: {}",
            &out[..out.len().min(300)]
        );
        assert!(out.contains("wait"), "{shell} completes the subcommands");
    }
    let (code, _, err) = output(bare("cortex", &["completion", "tcsh"], &[]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("possible values"), "{err}");
}

#[test]
fn every_listing_prints_an_array_and_refusals_name_the_flags() {
    let hub = Hub::start();
    let sid = hub.session();
    hub.waitpoint(&sid, json!({"label": "listed", "intent": "x"}));
    let sessions = ["sessions"];
    let devices = ["devices"];
    let approvals = ["approvals"];
    let check = ["wait", "check", "--session", sid.as_str()];
    for args in [&sessions[..], &devices[..], &approvals[..], &check[..]] {
        let mut full = vec!["--json"];
        full.extend_from_slice(args);
        let (code, out, err) = hub.cortex(&full);
        assert_eq!(code, 0, "{args:?}: {err}");
        let v: Value = serde_json::from_str(out.trim()).expect("JSON");
        assert!(v.is_array(), "{args:?} --json is an array: {out}");
    }
    let (_, out, _) = hub.cortex(&["--json", "wait", "check", "--session", &sid]);
    let v: Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(v[0]["label"], "listed", "{v}");

    let (code, _, err) = hub.cortex(&[
        "wait",
        "create",
        "--session",
        &sid,
        "--label",
        "l",
        "--intent",
        "i",
        "--coalesce",
        "30s",
    ]);
    assert_eq!(code, 2, "a bad argument to a wait command: {err}");
    assert!(
        err.contains("--coalesce is for monitors only: set --max-signals above 1"),
        "{err}"
    );
    hub.add_device("gpu1");
    let (code, _, err) = hub.cortex(&[
        "wait",
        "log",
        "/x",
        "--match",
        "(unclosed",
        "--device",
        "gpu1",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--match \"(unclosed\" is not a usable"),
        "{err}"
    );
    let (code, _, err) = hub.cortex(&["wait", "pid", "1", "--device", "gpu1", "--timeout", "0s"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--timeout (in seconds) must be"), "{err}");
}
