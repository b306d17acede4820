//! The exec rules that need no child: the allow-list, exec ids, program resolution, the
//! record file, and the refusals that come before anything is spawned.

use std::os::unix::fs::PermissionsExt;

use super::*;

fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

fn policy(programs: &[&str]) -> ExecPolicy {
    ExecPolicy {
        allow: true,
        programs: argv(programs),
    }
}

#[test]
fn exec_is_refused_unless_allowed() {
    let off = ExecPolicy::default();
    assert_eq!(off.check(&argv(&["true"]), false), Err(NOT_ALLOWED.into()));
    assert!(NOT_ALLOWED.contains("--allow-exec"));
    assert!(policy(&[]).check(&argv(&["true"]), false).is_ok());
}

#[test]
fn argv_shapes() {
    let p = policy(&[]);
    assert_eq!(p.check(&[], false), Err("argv is empty".into()));
    assert_eq!(p.check(&argv(&[""]), false), Err("argv[0] is empty".into()));
    assert_eq!(
        p.check(&argv(&["echo", "a\0b"]), false),
        Err("argv[1] holds a NUL byte".into())
    );
    // A shell takes exactly one string: the script.
    assert!(p.check(&argv(&["echo hi && sleep 1"]), true).is_ok());
    let e = p
        .check(&argv(&["echo", "hi"]), true)
        .expect_err("two strings");
    assert!(e.contains("exactly one string"), "{e}");
    assert_eq!(
        p.check(&argv(&[""]), true),
        Err("the script is empty".into())
    );
}

#[test]
fn the_allow_list_matches_full_paths_and_bare_names() {
    let p = policy(&["python3", "/opt/bin/train"]);
    // A bare entry: argv[0]'s file name, wherever it is.
    assert!(p.permits("python3", None));
    assert!(p.permits("/usr/bin/python3", None));
    assert!(!p.permits("python", None));
    assert!(!p.permits("/usr/bin/python3.11", None));
    // A full-path entry: argv[0] as given, or the file it resolved to.
    assert!(p.permits("/opt/bin/train", None));
    assert!(!p.permits("train", None));
    assert!(p.permits("train", Some(Path::new("/opt/bin/train"))));
    assert!(!p.permits("/usr/bin/train", Some(Path::new("/usr/bin/train"))));
    // No list: anything.
    assert!(policy(&[]).permits("anything", None));

    let e = p
        .check_program("/usr/bin/perl", None, false)
        .expect_err("perl");
    assert_eq!(
        e,
        "perl is not on this device's exec allow-list: python3, /opt/bin/train"
    );
    // A shell needs sh on the list, by name or path.
    let e = p.check_program("/bin/sh", None, true).expect_err("no sh");
    assert!(e.starts_with("a shell (sh) is not on"), "{e}");
    assert!(policy(&["sh"]).check_program("/bin/sh", None, true).is_ok());
    assert!(
        policy(&["/bin/sh"])
            .check_program("/bin/sh", None, true)
            .is_ok()
    );
}

#[test]
fn exec_ids_are_plain_file_names() {
    for ok in [
        "ex_1",
        "exec-0123abcd",
        "a.b",
        "A",
        &"x".repeat(MAX_EXEC_ID),
    ] {
        assert!(check_exec_id(ok).is_ok(), "{ok}");
    }
    for bad in [
        "",
        ".",
        "..",
        ".hidden",
        "a/b",
        "../x",
        "a b",
        "a\0b",
        "é",
        &"x".repeat(MAX_EXEC_ID + 1),
    ] {
        let e = check_exec_id(bad).expect_err(bad);
        assert!(e.contains("not usable"), "{e}");
    }
}

#[test]
fn programs_resolve_by_path_or_on_path() {
    let dir = tempfile::tempdir().expect("tmp");
    let bin = dir.path().join("bin");
    fs::create_dir(&bin).expect("mkdir");
    let tool = bin.join("tool");
    fs::write(&tool, "#!/bin/sh\n").expect("write");
    fs::set_permissions(&tool, fs::Permissions::from_mode(0o755)).expect("chmod");
    let plain = bin.join("plain");
    fs::write(&plain, "x").expect("write");
    fs::set_permissions(&plain, fs::Permissions::from_mode(0o644)).expect("chmod");
    let path = std::env::join_paths([Path::new("/nonexistent"), &bin]).expect("path");

    assert_eq!(resolve("tool", dir.path(), Some(&path)), Ok(tool.clone()));
    // Relative to the run's cwd when it holds a '/'.
    assert_eq!(resolve("bin/tool", dir.path(), None), Ok(tool.clone()));
    assert_eq!(
        resolve(tool.to_str().expect("utf8"), Path::new("/"), None),
        Ok(tool)
    );
    let e = resolve("missing", dir.path(), Some(&path)).expect_err("missing");
    assert!(
        e.starts_with("missing is not found on this device's PATH"),
        "{e}"
    );
    // A file that is not executable is not a program.
    assert!(resolve("plain", dir.path(), Some(&path)).is_err());
    let e = resolve("bin/plain", dir.path(), None).expect_err("plain");
    assert_eq!(e, "bin/plain: is not executable");
    let e = resolve("./nope", dir.path(), None).expect_err("nope");
    assert_eq!(e, "./nope: no such file");
}

fn record(id: &str, state: ExecState, pid: Option<i32>) -> ExecRecord {
    ExecRecord {
        version: RECORD_VERSION,
        exec_id: id.into(),
        state,
        argv: argv(&["sleep", "1"]),
        shell: false,
        cwd: "/".into(),
        log: format!("/h/exec/{id}.log"),
        requested_at_ms: 1,
        pid,
        start_time: pid.map(|_| 77),
        exit_code: None,
        signal: None,
        ended_at_ms: None,
    }
}

#[test]
fn records_round_trip_privately() {
    let home = tempfile::tempdir().expect("tmp");
    let store = ExecStore::under(home.path());
    assert_eq!(store.load("ex_1").expect("load"), None);
    let rec = record("ex_1", ExecState::Running, Some(42));
    store.save(&rec).expect("save");
    assert_eq!(store.load("ex_1").expect("load"), Some(rec));
    let mode = |p: &Path| fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&store.record_path("ex_1")), 0o600);
    assert_eq!(mode(store.dir()), 0o700);
    // Only the record is left: no temp file beside it.
    let names: Vec<_> = fs::read_dir(store.dir())
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("ex_1.json")]);
    fs::write(store.record_path("bad"), "{").expect("write");
    assert!(store.load("bad").is_err());
}

fn execs(home: &Path, policy: ExecPolicy) -> Execs {
    Execs::new(
        policy,
        ExecStore::under(home),
        home.to_owned(),
        // Never reached by these tests: each is refused or answered before a spawn.
        PathBuf::from("/nonexistent/launcher"),
    )
}

fn request(id: &str, a: &[&str]) -> ExecRequest {
    ExecRequest {
        exec_id: id.into(),
        argv: argv(a),
        shell: false,
        cwd: None,
        env: Vec::new(),
        timeout_ms: 15_000,
    }
}

fn refused(f: AgentFrame) -> String {
    match f {
        AgentFrame::ExecRefused { reason, .. } => reason,
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn refusals_start_nothing_and_say_why() {
    let home = tempfile::tempdir().expect("tmp");
    let mut off = execs(home.path(), ExecPolicy::default());
    assert_eq!(
        refused(off.start(request("ex_1", &["true"]), Duration::ZERO)),
        NOT_ALLOWED
    );
    assert!(!home.path().join("exec").exists(), "nothing written");

    let mut x = execs(home.path(), policy(&["sleep"]));
    let e = refused(x.start(request("../etc", &["true"]), Duration::ZERO));
    assert!(e.contains("not usable"), "{e}");
    assert_eq!(
        refused(x.start(request("ex_1", &[]), Duration::ZERO)),
        "argv is empty".to_owned()
    );
    let e = refused(x.start(request("ex_1", &["true"]), Duration::ZERO));
    assert_eq!(e, "true is not on this device's exec allow-list: sleep");
    let mut r = request("ex_1", &["sleep", "1"]);
    r.cwd = Some("/nonexistent/dir".into());
    assert_eq!(
        refused(x.start(r, Duration::ZERO)),
        "cwd /nonexistent/dir does not exist"
    );
    let mut r = request("ex_1", &["sleep", "1"]);
    r.cwd = Some("relative".into());
    assert!(refused(x.start(r, Duration::ZERO)).contains("not an absolute path"));
    let mut r = request("ex_1", &["sleep", "1"]);
    r.env = vec![("A=B".into(), "secret-value".into())];
    let e = refused(x.start(r, Duration::ZERO));
    assert!(e.contains("env name") && !e.contains("secret-value"), "{e}");
    // Reached after the hub gave up: refused, not started late.
    let r = request("ex_1", &["sleep", "1"]);
    assert!(refused(x.start(r, Duration::from_secs(20))).contains("after the hub stopped waiting"));
    assert!(
        x.store.load("ex_1").expect("load").is_none(),
        "no record for a refusal"
    );
}

#[test]
fn a_recorded_run_is_answered_not_started_again() {
    let home = tempfile::tempdir().expect("tmp");
    let mut x = execs(home.path(), policy(&[]));
    x.store
        .save(&record("ex_1", ExecState::Running, Some(42)))
        .expect("save");
    match x.start(request("ex_1", &["sleep", "1"]), Duration::ZERO) {
        AgentFrame::ExecStarted {
            exec_id,
            pid,
            start_time,
            log,
            already,
        } => {
            assert_eq!(
                (exec_id.as_str(), pid, start_time, already),
                ("ex_1", 42, 77, true)
            );
            assert_eq!(log, "/h/exec/ex_1.log");
        }
        other => panic!("{other:?}"),
    }
    // Even when the frame came late: the answer is the run's, not a refusal.
    let r = request("ex_1", &["sleep", "1"]);
    assert!(matches!(
        x.start(r, Duration::from_secs(60)),
        AgentFrame::ExecStarted { already: true, .. }
    ));
    // Left "starting" by an agent that stopped in between: unknown, never a second start.
    x.store
        .save(&record("ex_2", ExecState::Starting, None))
        .expect("save");
    let e = refused(x.start(request("ex_2", &["sleep", "1"]), Duration::ZERO));
    assert!(
        e.starts_with("state unknown: the agent stopped while starting it"),
        "{e}"
    );
    // Every answer is queued for the hub.
    assert_eq!(x.queue.len(), 3);
}
