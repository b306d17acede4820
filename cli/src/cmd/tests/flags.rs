//! Flags to request bodies, the hub's address, and what is refused before anything is sent.

use std::time::Duration;

use clap::CommandFactory;

use super::*;

#[test]
fn flags_are_well_formed() {
    Cli::command().debug_assert();
}

#[test]
fn create_flags_become_the_protocol_body() {
    let cli = parse(&[
        "wait",
        "create",
        "--session",
        "ses_1",
        "--label",
        "T2 ladder",
        "--intent",
        "all three arms",
        "--member",
        "arm2",
        "--members",
        "arm6, arm8,arm2",
        "--quorum",
        "2",
        "--fail-fast",
        "false",
        "--max-signals",
        "3",
        "--expires-in-hours",
        "1.5",
        "--device",
        "box",
    ])
    .expect("parse");
    let Command::Wait(WaitCommand::Create(args)) = cli.command else {
        panic!("not wait create")
    };
    let body = serde_json::to_value(wait::create_body(&args).expect("body")).expect("ser");
    assert_eq!(
        body,
        json!({"label": "T2 ladder", "intent": "all three arms", "members": ["arm2", "arm6", "arm8"],
            "quorum": 2, "fail_fast": false, "max_signals": 3, "expires_in_hours": 1.5, "device": "box"})
    );

    let body = create_body_of(&["--expires-in", "90s"]);
    assert_eq!(
        body["expires_in_hours"]
            .as_f64()
            .map(|h| (h * 3_600_000.0).round()),
        Some(90_000.0),
        "--expires-in is a duration, to the millisecond: {body}"
    );
    assert!(
        parse(&[
            "wait",
            "create",
            "--session",
            "s",
            "--label",
            "l",
            "--intent",
            "i",
            "--expires-in",
            "1m",
            "--expires-in-hours",
            "1",
        ])
        .is_err(),
        "one deadline"
    );

    let body = create_body_of(&["--quorum", "all"]);
    assert_eq!(body, json!({"label": "l", "intent": "i", "quorum": "all"}));
}

#[test]
fn wait_create_takes_the_monitor_rules() {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("spawn.txt");
    std::fs::write(&file, "Triage the report.\n").expect("write");
    let at_file = format!("@{}", file.display());
    let cli = parse(&[
        "wait",
        "create",
        "--session",
        "s",
        "--label",
        "l",
        "--intent",
        "i",
        "--max-signals",
        "10",
        "--silence-after",
        "20m",
        "--coalesce",
        "1.5",
        "--spawn-instructions",
        &at_file,
        "--spawn-title",
        "triage",
    ])
    .expect("parse");
    let Command::Wait(WaitCommand::Create(args)) = cli.command else {
        panic!("not wait create")
    };
    let body = serde_json::to_value(wait::create_body(&args).expect("body")).expect("ser");
    assert_eq!(
        body,
        json!({"label": "l", "intent": "i", "max_signals": 10, "silence_after": 1200.0,
            "coalesce": 1.5, "spawn": {"instructions": "Triage the report.\n", "title": "triage"}})
    );
    // A title alone is a usage error; so is a duration that is not one.
    for argv in [
        &[
            "wait",
            "create",
            "--label",
            "l",
            "--intent",
            "i",
            "--spawn-title",
            "t",
        ][..],
        &[
            "wait",
            "create",
            "--label",
            "l",
            "--intent",
            "i",
            "--silence-after",
            "soon",
        ][..],
    ] {
        assert!(parse(argv).is_err(), "{argv:?}");
    }
}

#[test]
fn bad_arguments_are_usage_errors() {
    for argv in [
        &[
            "wait", "create", "--label", "l", "--intent", "i", "--quorum", "most",
        ][..],
        &[
            "wait",
            "create",
            "--label",
            "l",
            "--intent",
            "i",
            "--expires-in-hours",
            "-1",
        ],
        &[
            "wait",
            "create",
            "--label",
            "l",
            "--intent",
            "i",
            "--fail-fast",
            "maybe",
        ],
        &["wait", "create", "--label", "l"],
        &["wait", "for", "wp_1", "--timeout", "soon"],
        &["wait", "for"],
        &[],
    ] {
        let e = parse(argv).expect_err("usage error");
        assert_eq!(e.exit_code(), 2, "{argv:?}");
    }
    let cli = parse(&["wait", "for", "wp_1", "--timeout", "1.5h"]).expect("parse");
    let Command::Wait(WaitCommand::For { timeout, .. }) = cli.command else {
        panic!("not wait for")
    };
    assert_eq!(timeout, Some(Duration::from_secs(5400)));
}

#[test]
fn hub_address() {
    let file = Some("http://127.0.0.1:40123");
    for (flag, port, from_file, want) in [
        (None, None, None, "http://127.0.0.1:3001"),
        (None, Some("4000"), None, "http://127.0.0.1:4000"),
        (Some("http://h:1"), Some("4000"), file, "http://h:1"),
        (Some(""), None, None, "http://127.0.0.1:3001"),
        // The running hub's own word, when nothing was said.
        (None, None, file, "http://127.0.0.1:40123"),
        (Some(""), Some(" "), file, "http://127.0.0.1:40123"),
        // What was said wins over the file.
        (None, Some("4000"), file, "http://127.0.0.1:4000"),
        (Some("http://h:1"), None, file, "http://h:1"),
        (None, None, Some("  "), "http://127.0.0.1:3001"),
    ] {
        assert_eq!(
            hub_url(flag, port, from_file).expect("an address"),
            want,
            "{flag:?} {port:?} {from_file:?}"
        );
    }
    assert!(hub_url(None, Some("x"), file).is_err());
}

#[test]
fn no_token_says_where_to_get_one() {
    let home = tempfile::tempdir().expect("tempdir");
    let cli = parse(&["--hub", "http://127.0.0.1:9", "sessions"]).expect("parse");
    let env = CortexEnv {
        webhook_port: None,
        token: None,
        cortex_home: Ok(home.path().to_path_buf()),
        user: None,
        term: Term::default(),
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(run(&cli, &env, &mut out, &mut err), 1);
    let err = String::from_utf8(err).expect("utf8");
    assert!(
        err.contains("no operator token: set CORTEX_WEBHOOK_TOKEN"),
        "{err}"
    );
}

fn local_wait(argv: &[&str]) -> wait_local::LocalWait {
    match parse(argv).expect("flags parse").command {
        Command::Wait(WaitCommand::Local(w)) => w,
        other => panic!("not a local wait: {other:?}"),
    }
}

#[test]
fn log_silence_and_any_flags_become_the_remote_body() {
    let w = local_wait(&[
        "wait",
        "log",
        "/runs/7/train.log",
        "--match",
        "nan|Traceback",
        "--silence",
        "20m",
        "--device",
        "gpu1",
        "--timeout",
        "6h",
    ]);
    let b = serde_json::to_value(wait_remote::body(&w, "gpu1").expect("body")).expect("json");
    assert_eq!(
        b,
        json!({"kind": "log", "path": "/runs/7/train.log", "match": "nan|Traceback",
               "silence": 1200.0, "timeout_s": 21600.0})
    );
    let w = local_wait(&[
        "wait",
        "file",
        "/runs/7/progress",
        "--silence",
        "90s",
        "--device",
        "gpu1",
    ]);
    let b = serde_json::to_value(wait_remote::body(&w, "gpu1").expect("body")).expect("json");
    assert_eq!(
        (b["kind"].clone(), b["silence"].clone()),
        (json!("file"), json!(90.0))
    );
    let w = local_wait(&[
        "wait",
        "any",
        "pid:4123",
        "log:/runs/7/train.log~Traceback|nan",
        "silence:/runs/7/train.log~10m",
        "--device",
        "gpu1",
    ]);
    let b = serde_json::to_value(wait_remote::body(&w, "gpu1").expect("body")).expect("json");
    assert_eq!(b["kind"], "any");
    assert_eq!(
        b["conditions"],
        json!([
            {"kind": "pid", "pid": 4123},
            {"kind": "log", "path": "/runs/7/train.log", "match": "Traceback|nan"},
            {"kind": "file", "path": "/runs/7/train.log", "silence": 600.0},
        ])
    );
    // What the hub does with it: the same spec the command line names.
    let body: cortex_protocol::api::CreateDeviceWait = serde_json::from_value(b).expect("body");
    let spec = body
        .condition
        .spec(cortex_protocol::waits::Place::Device)
        .expect("accepted");
    assert_eq!(spec.kind(), "any");
    // Refused before the hub is asked: a relative path, a cursor, a bad condition.
    for argv in [
        &["wait", "log", "rel.log", "--match", "x", "--device", "gpu1"][..],
        &[
            "wait", "log", "/x", "--match", "x", "--cursor", "/c", "--device", "gpu1",
        ],
        &["wait", "any", "pid:1", "tail:/x", "--device", "gpu1"],
        &["wait", "any", "pid:1", "file:rel", "--device", "gpu1"],
    ] {
        assert!(
            wait_remote::body(&local_wait(argv), "gpu1").is_err(),
            "{argv:?}"
        );
    }
    // A silence and a cursor do not go together on a file wait.
    assert!(parse(&["wait", "file", "/x", "--silence", "1m", "--cursor", "/c"]).is_err());
    assert!(
        parse(&["wait", "log", "/x"]).is_err(),
        "--match is required"
    );
    assert!(parse(&["wait", "any"]).is_err(), "a condition is required");
}

#[test]
fn local_log_and_any_waits_refuse_what_cannot_run() {
    let run_local = |argv: &[&str]| {
        let w = local_wait(argv);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = wait_local::run(&w, &mut out, &mut err);
        (code, String::from_utf8(err).expect("utf8"))
    };
    let (code, err) = run_local(&["wait", "log", "/tmp/x.log", "--match", "("]);
    assert_eq!(code, 2);
    assert!(err.contains("not a usable regular expression"), "{err}");
    let (code, err) = run_local(&["wait", "any", "pid:1", "log:/x"]);
    assert_eq!(code, 2);
    assert!(err.contains("needs its pattern"), "{err}");
    let (code, err) = run_local(&["wait", "file", "/tmp/x", "--silence", "1ms"]);
    assert_eq!(code, 2);
    assert!(err.contains("out of range"), "{err}");
}
