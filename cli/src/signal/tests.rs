//! Tests of `cortex-signal`: flags to body, caps, exit codes, and the spool fallback against
//! local servers on port 0 with a temp CORTEX_HOME.

use super::*;
use crate::testserver::{TestServer, json, refused_addr, tls_server};

const SECRET: &str = "5ec12e7";

fn args(argv: &[&str]) -> SignalArgs {
    let mut full = vec!["cortex-signal"];
    full.extend_from_slice(argv);
    SignalArgs::try_parse_from(full).expect("flags parse")
}

fn env_with(home: &Path) -> SignalEnv {
    SignalEnv {
        id: Some("wp_env".into()),
        secret: Some(SECRET.into()),
        hub: None,
        webhook_port: None,
        cortex_home: Ok(home.to_path_buf()),
    }
}

fn env() -> SignalEnv {
    env_with(Path::new("/nonexistent/cortex-home"))
}

fn prep(argv: &[&str]) -> Prepared {
    prepare(&args(argv), &env(), &mut io::empty()).expect("prepare")
}

/// Runs against `url` with a temp CORTEX_HOME; returns the outcome and stderr.
fn run_at(url: &str, extra: &[&str], home: &Path) -> (Outcome, String) {
    let mut argv = vec!["--url", url];
    argv.extend_from_slice(extra);
    let mut err = Vec::new();
    let outcome = run(&args(&argv), &env_with(home), &mut io::empty(), &mut err);
    (outcome, String::from_utf8(err).expect("utf8"))
}

fn spooled_files(home: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(home::spool_dir(home)) {
        Ok(rd) => rd.map(|e| e.expect("entry").path()).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn flags_are_well_formed() {
    SignalArgs::command().debug_assert();
    let h = help();
    for needle in [
        "--exit-code",
        "--no-spool",
        "--data",
        "exits 2",
        "CORTEX_SIGNAL_ID",
    ] {
        assert!(h.contains(needle), "help lacks {needle}:\n{h}");
    }
}

#[test]
fn clap_usage_errors_exit_2() {
    for argv in [
        &["cortex-signal", "--status", "done"][..],
        &["cortex-signal", "--exit-code", "x"],
        &["cortex-signal", "--bogus"],
    ] {
        let e = SignalArgs::try_parse_from(argv).expect_err("usage error");
        assert_eq!(e.exit_code(), 2, "{argv:?}");
    }
    assert_eq!(args(&["--exit-code", "-1"]).exit_code, Some(-1));
}

#[test]
fn exit_code_sets_status_and_message() {
    let p = prep(&["--exit-code", "0"]);
    assert_eq!(
        (p.request.status, p.request.message.as_deref()),
        (Some(SignalStatus::Ok), Some("exit=0"))
    );
    let p = prep(&["--exit-code", "137"]);
    assert_eq!(
        (p.request.status, p.request.message.as_deref()),
        (Some(SignalStatus::Fail), Some("exit=137"))
    );
    let p = prep(&[
        "--exit-code",
        "1",
        "--status",
        "progress",
        "--message",
        "step 12000",
    ]);
    assert_eq!(
        (p.request.status, p.request.message.as_deref()),
        (Some(SignalStatus::Progress), Some("step 12000"))
    );
    let p = prep(&["--member", "arm2"]);
    assert_eq!(
        (p.request.status, p.request.message.as_deref()),
        (Some(SignalStatus::Ok), None)
    );
    assert_eq!(p.request.member.as_deref(), Some("arm2"));
}

#[test]
fn the_body_is_the_protocol_signal_with_a_fresh_key() {
    let p = prep(&["--exit-code", "2", "--data", "tail"]);
    let parsed = SignalRequest::parse(&p.body).expect("a valid signal body");
    assert_eq!(parsed, p.request);
    assert_eq!(parsed.id, "wp_env");
    assert_eq!(parsed.data.as_deref(), Some("tail"));
    let key = parsed.key.expect("key");
    assert_eq!(key.len(), 32);
    assert!(key.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_ne!(prep(&[]).request.key, prep(&[]).request.key);
    assert_eq!(p.urls, ["http://127.0.0.1:3001/webhook/signal"]);
    assert!(p.warnings.is_empty());
}

#[test]
fn id_and_secret_come_from_flags_or_env() {
    let p = prep(&["--id", "wp_flag", "--secret", "s2"]);
    assert_eq!(
        (p.request.id.as_str(), p.request.secret.as_str()),
        ("wp_flag", "s2")
    );

    let mut e = env();
    e.id = None;
    assert_eq!(
        prepare(&args(&[]), &e, &mut io::empty()).err(),
        Some(UsageError::NoId)
    );
    e.id = Some(String::new());
    assert_eq!(
        prepare(&args(&[]), &e, &mut io::empty()).err(),
        Some(UsageError::NoId)
    );
    let mut e = env();
    e.secret = None;
    let err = prepare(&args(&[]), &e, &mut io::empty()).expect_err("no secret");
    assert_eq!(err, UsageError::NoSecret);
    let msg = err.to_string();
    assert!(
        msg.contains("--secret") && msg.contains("CORTEX_SIGNAL_SECRET"),
        "{msg}"
    );
    assert!(UsageError::NoId.to_string().contains("CORTEX_SIGNAL_ID"));
}

#[test]
fn missing_secret_is_a_usage_error_and_sends_nothing() {
    let mut e = env();
    e.secret = None;
    let mut err = Vec::new();
    let outcome = run(&args(&["--exit-code", "0"]), &e, &mut io::empty(), &mut err);
    assert_eq!(outcome, Outcome::Usage);
    assert_eq!(outcome.exit_code(), 2);
    assert!(String::from_utf8_lossy(&err).contains("no secret"));
}

#[test]
fn url_from_cortex_hub_and_the_hubs_url_file() {
    let home = tempfile::tempdir().expect("tmp");
    let mut e = env_with(home.path());
    let url = |e: &SignalEnv| {
        prepare(&args(&[]), e, &mut io::empty())
            .expect("prepare")
            .urls
            .join(",")
    };
    assert_eq!(
        url(&e),
        "http://127.0.0.1:3001/webhook/signal",
        "nothing said"
    );
    std::fs::create_dir_all(home.path().join("hub")).expect("mkdir");
    std::fs::write(home.path().join("hub/url"), "http://127.0.0.1:40999\n").expect("write");
    assert_eq!(
        url(&e),
        "http://127.0.0.1:40999/webhook/signal",
        "the hub's file"
    );
    e.webhook_port = Some("4555".into());
    assert_eq!(
        url(&e),
        "http://127.0.0.1:4555/webhook/signal",
        "WEBHOOK_PORT wins"
    );
    e.hub = Some("https://hub.example:8443/".into());
    assert_eq!(
        url(&e),
        "https://hub.example:8443/webhook/signal",
        "CORTEX_HUB wins"
    );
    let p = prepare(
        &args(&["--url", "http://127.0.0.1:1/webhook/signal"]),
        &e,
        &mut io::empty(),
    )
    .expect("prepare");
    assert_eq!(p.urls, ["http://127.0.0.1:1/webhook/signal"], "--url wins");
}

#[test]
fn url_from_webhook_port_or_flag() {
    let mut e = env();
    e.webhook_port = Some("4555".into());
    let p = prepare(&args(&[]), &e, &mut io::empty()).expect("prepare");
    assert_eq!(p.urls, ["http://127.0.0.1:4555/webhook/signal"]);
    e.webhook_port = Some("http".into());
    assert_eq!(
        prepare(&args(&[]), &e, &mut io::empty()).err(),
        Some(UsageError::BadPort("http".into()))
    );
    let p = prepare(
        &args(&["--url", "https://hub.example/webhook/signal"]),
        &env(),
        &mut io::empty(),
    )
    .expect("https is a URL like any other");
    assert_eq!(p.urls, ["https://hub.example/webhook/signal"]);
    for bad in ["ftp://hub/webhook/signal", "hub:3001/webhook/signal"] {
        let err = prepare(&args(&["--url", bad]), &env(), &mut io::empty()).expect_err(bad);
        assert!(matches!(err, UsageError::BadUrl(_)), "{err}");
    }
    assert_eq!(Outcome::Usage.exit_code(), 2);
}

#[test]
fn a_long_message_keeps_its_first_2000_chars() {
    let msg = "é".repeat(MAX_MESSAGE_CHARS + 500);
    let p = prep(&["--message", &msg]);
    let sent = p.request.message.as_deref().expect("message");
    assert_eq!(sent.chars().count(), MAX_MESSAGE_CHARS);
    assert!(msg.starts_with(sent));
    assert_eq!(p.warnings.len(), 1);
    assert!(
        p.warnings[0].contains("2500 characters"),
        "{}",
        p.warnings[0]
    );
    assert!(SignalRequest::parse(&p.body).is_ok());
}

#[test]
fn long_data_keeps_its_tail_after_a_marker() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("train.log");
    let text: String = (0..20_000).map(|i| format!("step {i}\n")).collect();
    std::fs::write(&log, &text).expect("write log");
    let p = prep(&["--data", &format!("@{}", log.display())]);
    let data = p.request.data.as_deref().expect("data");
    assert!(data.chars().count() <= MAX_DATA_CHARS);
    assert!(data.ends_with("step 19999\n"));
    let (marker, kept) = data.split_once('\n').expect("marker line");
    let cut: usize = marker
        .strip_prefix("[… ")
        .and_then(|m| m.strip_suffix(" characters cut]"))
        .and_then(|n| n.parse().ok())
        .expect("marker shape");
    assert_eq!(cut + kept.chars().count(), text.chars().count());
    assert!(text.ends_with(kept));
    assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
    assert!(SignalRequest::parse(&p.body).is_ok());
}

#[test]
fn data_from_stdin_and_literal() {
    let mut stdin = &b"from stdin\n"[..];
    let p = prepare(&args(&["--data", "-"]), &env(), &mut stdin).expect("prepare");
    assert_eq!(p.request.data.as_deref(), Some("from stdin\n"));
    let p = prep(&["--data", "literal text"]);
    assert_eq!(p.request.data.as_deref(), Some("literal text"));
}

#[test]
fn unreadable_data_file_still_signals_with_a_note() {
    let p = prep(&["--exit-code", "1", "--data", "@/nonexistent/train.log"]);
    let data = p.request.data.as_deref().expect("data");
    assert!(
        data.contains("could not read /nonexistent/train.log"),
        "{data}"
    );
    assert_eq!(p.request.status, Some(SignalStatus::Fail));
    assert_eq!(p.warnings.len(), 1);
}

#[test]
fn wide_characters_are_trimmed_to_fit_64k_without_splitting() {
    // 16,000 four-byte characters are within the character cap but not within 64 KB.
    let wide = "😀".repeat(MAX_DATA_CHARS);
    let p = prep(&["--message", &"m".repeat(MAX_MESSAGE_CHARS), "--data", &wide]);
    assert!(p.body.len() <= MAX_BODY_BYTES, "{}", p.body.len());
    assert!(
        p.body.len() > MAX_BODY_BYTES - 200,
        "not trimmed more than needed: {}",
        p.body.len()
    );
    let parsed = SignalRequest::parse(&p.body).expect("valid");
    let data = parsed.data.expect("data");
    assert!(data.starts_with("[… "));
    assert!(data.ends_with("😀😀"));
    assert!(
        p.warnings.iter().any(|w| w.contains("64 KB")),
        "{:?}",
        p.warnings
    );

    // Control characters take six bytes each in JSON.
    let ctl = "\u{1}".repeat(MAX_DATA_CHARS);
    let p = prep(&["--data", &ctl]);
    assert!(p.body.len() <= MAX_BODY_BYTES);
    assert!(SignalRequest::parse(&p.body).is_ok());
}

#[test]
fn read_tail_counts_everything_and_never_starts_mid_character() {
    let text = format!(
        "{}{}",
        "a".repeat(3 * TAIL_BYTES),
        "é".repeat(TAIL_BYTES / 2 + 1)
    );
    let tail = read_tail(&mut text.as_bytes()).expect("read");
    assert_eq!(tail.total_chars, text.chars().count());
    assert!(tail.text.len() <= TAIL_BYTES);
    assert!(text.ends_with(&tail.text));
    assert!(tail.text.starts_with('é'));
    let small = read_tail(&mut "héllo".as_bytes()).expect("read");
    assert_eq!(
        small,
        Tail {
            text: "héllo".into(),
            total_chars: 5
        }
    );
}

#[test]
fn exit_codes() {
    assert_eq!(Outcome::Accepted.exit_code(), 0);
    assert_eq!(Outcome::AlreadyResolved.exit_code(), 0);
    assert_eq!(Outcome::Spooled(PathBuf::new()).exit_code(), 0);
    assert_eq!(Outcome::Refused(401).exit_code(), 1);
    assert_eq!(Outcome::NotDelivered.exit_code(), 1);
    assert_eq!(Outcome::Usage.exit_code(), 2);
}

#[test]
fn accepted_is_quiet_and_sends_the_body() {
    let home = tempfile::tempdir().expect("tempdir");
    let server = TestServer::canned(vec![json(
        202,
        r#"{"result":"accepted","waitpoint":"wp_env","state":"resolved"}"#,
    )]);
    let (outcome, err) = run_at(
        &server.url("/webhook/signal"),
        &["--exit-code", "3", "--member", "arm2"],
        home.path(),
    );
    assert_eq!(outcome, Outcome::Accepted);
    assert_eq!(err, "");
    let req = server.next_request();
    assert_eq!(
        (req.method.as_str(), req.path.as_str()),
        ("POST", "/webhook/signal")
    );
    let body = req.json();
    assert_eq!(body["id"], "wp_env");
    assert_eq!(body["secret"], SECRET);
    assert_eq!(body["status"], "fail");
    assert_eq!(body["message"], "exit=3");
    assert_eq!(body["member"], "arm2");
    assert_eq!(body["key"].as_str().map(str::len), Some(32));
    assert!(spooled_files(home.path()).is_empty());
}

#[test]
fn duplicate_is_accepted_too() {
    let home = tempfile::tempdir().expect("tempdir");
    let server = TestServer::canned(vec![json(
        202,
        r#"{"result":"duplicate","waitpoint":"wp_env","state":"armed"}"#,
    )]);
    let (outcome, err) = run_at(&server.url("/webhook/signal"), &[], home.path());
    assert_eq!((outcome, err.as_str()), (Outcome::Accepted, ""));
}

#[test]
fn already_resolved_exits_0_with_one_line() {
    let home = tempfile::tempdir().expect("tempdir");
    let server = TestServer::canned(vec![json(
        410,
        r#"{"error":"resolved","message":"waitpoint wp_env already resolved"}"#,
    )]);
    let (outcome, err) = run_at(&server.url("/webhook/signal"), &[], home.path());
    assert_eq!(outcome, Outcome::AlreadyResolved);
    assert_eq!(outcome.exit_code(), 0);
    assert_eq!(err.lines().count(), 1);
    assert!(err.contains("already resolved; nothing to do"), "{err}");
}

#[test]
fn a_late_signal_is_told_it_was_late_and_exits_0() {
    let home = tempfile::tempdir().expect("tempdir");
    let server = TestServer::canned(vec![json(
        410,
        r#"{"error":"expired","message":"waitpoint wp_env expired before this signal came (its deadline passed); the signal was too late and is not counted"}"#,
    )]);
    let (outcome, err) = run_at(&server.url("/webhook/signal"), &[], home.path());
    assert_eq!(outcome, Outcome::AlreadyResolved);
    assert_eq!(outcome.exit_code(), 0);
    assert_eq!(err.lines().count(), 1);
    assert!(err.contains("expired before this signal came"), "{err}");
    assert!(!err.contains("already resolved"), "{err}");
}

#[test]
fn refusals_exit_1_with_the_hubs_message() {
    let home = tempfile::tempdir().expect("tempdir");
    for status in [400, 401, 404, 413, 429, 403] {
        let server = TestServer::canned(vec![json(
            status,
            &format!(r#"{{"error":"e{status}","message":"because {status}; do the thing"}}"#),
        )]);
        let (outcome, err) = run_at(&server.url("/webhook/signal"), &[], home.path());
        assert_eq!(outcome, Outcome::Refused(status));
        assert_eq!(outcome.exit_code(), 1);
        assert!(
            err.contains(&format!("because {status}; do the thing")),
            "{err}"
        );
        assert!(err.contains(&format!("HTTP {status} e{status}")), "{err}");
    }
    assert!(
        spooled_files(home.path()).is_empty(),
        "a refusal is never spooled"
    );
}

#[test]
fn a_refusal_without_a_json_body_still_says_what_to_do() {
    let home = tempfile::tempdir().expect("tempdir");
    let server = TestServer::canned(vec![
        b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n".to_vec(),
    ]);
    let (outcome, err) = run_at(&server.url("/webhook/signal"), &[], home.path());
    assert_eq!(outcome, Outcome::Refused(401));
    assert!(err.contains("CORTEX_SIGNAL_SECRET"), "{err}");
}

#[test]
fn unlisted_member_lists_the_expected_ones() {
    let home = tempfile::tempdir().expect("tempdir");
    let server = TestServer::canned(vec![json(
        422,
        r#"{"error":"unknown_member","message":"arm9 is not a member of wp_env","members":["arm2","arm6"]}"#,
    )]);
    let (outcome, err) = run_at(
        &server.url("/webhook/signal"),
        &["--member", "arm9"],
        home.path(),
    );
    assert_eq!(outcome, Outcome::Refused(422));
    assert!(err.contains("arm9 is not a member"), "{err}");
    assert!(
        err.contains("expected members: arm2, arm6; pass one with --member NAME"),
        "{err}"
    );
}

#[test]
fn the_secret_is_never_printed() {
    let home = tempfile::tempdir().expect("tempdir");
    let server = TestServer::canned(vec![json(
        400,
        &format!(r#"{{"error":"bad","message":"cannot use {SECRET}"}}"#),
    )]);
    let (_, err) = run_at(&server.url("/webhook/signal"), &[], home.path());
    assert!(!err.contains(SECRET), "{err}");
    let (_, err) = run_at(
        &format!("http://{}/webhook/signal", refused_addr()),
        &[],
        home.path(),
    );
    assert!(!err.contains(SECRET), "{err}");
}

#[test]
fn unreachable_hub_spools_the_same_body() {
    let home = tempfile::tempdir().expect("tempdir");
    let url = format!("http://{}/webhook/signal", refused_addr());
    let (outcome, err) = run_at(
        &url,
        &["--exit-code", "0", "--message", "done"],
        home.path(),
    );
    let Outcome::Spooled(path) = &outcome else {
        panic!("expected spooled, got {outcome:?}: {err}")
    };
    assert_eq!(outcome.exit_code(), 0);
    assert_eq!(spooled_files(home.path()), vec![path.clone()]);
    assert!(path.starts_with(home.path().join("tmp/signals")));
    let spooled =
        SignalRequest::parse(&std::fs::read(path).expect("read spool")).expect("valid signal");
    assert_eq!(spooled.message.as_deref(), Some("done"));
    assert_eq!(spooled.key.as_deref().map(str::len), Some(32));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("unreachable") && err.contains(&url) && err.contains("connection refused"),
        "{err}"
    );
    assert!(
        err.contains(&path.display().to_string()) && err.contains("drains the spool"),
        "{err}"
    );
}

#[test]
fn server_errors_and_garbled_answers_spool_the_body_that_was_sent() {
    let home = tempfile::tempdir().expect("tempdir");
    let server = TestServer::canned(vec![
        json(503, r#"{"error":"busy","message":"shutting down"}"#),
        b"garbage\r\n".to_vec(),
    ]);
    for _ in 0..2 {
        let (outcome, err) = run_at(&server.url("/webhook/signal"), &[], home.path());
        let Outcome::Spooled(path) = outcome else {
            panic!("expected spooled: {err}")
        };
        let sent = server.next_request();
        assert_eq!(
            std::fs::read(&path).expect("read"),
            sent.body,
            "same body, same key"
        );
    }
    assert_eq!(spooled_files(home.path()).len(), 2);
}

#[test]
fn an_https_hub_is_asked_and_a_tls_failure_spools() {
    // The test's certificate is in no CA store on this machine: the handshake fails, and
    // says so, rather than the URL being refused.
    let home = tempfile::tempdir().expect("tempdir");
    let (port, _) = tls_server();
    let url = format!("https://localhost:{port}/webhook/signal");
    let (outcome, err) = run_at(&url, &["--exit-code", "0"], home.path());
    let Outcome::Spooled(path) = &outcome else {
        panic!("expected spooled, got {outcome:?}: {err}")
    };
    assert_eq!(spooled_files(home.path()), vec![path.clone()]);
    assert!(
        err.contains("TLS with the hub at") && err.contains(&url),
        "{err}"
    );
    assert!(!err.contains("bad URL"), "{err}");

    let (outcome, err) = run_at(&url, &["--no-spool"], home.path());
    assert_eq!(outcome, Outcome::NotDelivered);
    assert!(err.contains("TLS"), "{err}");
}

#[test]
fn no_spool_makes_unreachable_exit_1() {
    let home = tempfile::tempdir().expect("tempdir");
    let url = format!("http://{}/webhook/signal", refused_addr());
    let (outcome, err) = run_at(&url, &["--no-spool"], home.path());
    assert_eq!(outcome, Outcome::NotDelivered);
    assert_eq!(outcome.exit_code(), 1);
    assert!(err.contains("--no-spool") && err.contains(&url), "{err}");
    assert!(spooled_files(home.path()).is_empty());
}

#[test]
fn an_unwritable_spool_exits_1() {
    let home = tempfile::tempdir().expect("tempdir");
    let not_a_dir = home.path().join("file");
    std::fs::write(&not_a_dir, b"x").expect("write");
    let url = format!("http://{}/webhook/signal", refused_addr());
    let (outcome, err) = run_at(&url, &[], &not_a_dir);
    assert_eq!(outcome, Outcome::NotDelivered);
    assert!(err.contains("NOT delivered"), "{err}");
}

#[test]
fn no_spool_makes_a_server_error_exit_1() {
    let home = tempfile::tempdir().expect("tempdir");
    let server = TestServer::canned(vec![json(
        503,
        r#"{"error":"store_unavailable","message":"retry shortly"}"#,
    )]);
    let (outcome, err) = run_at(&server.url("/webhook/signal"), &["--no-spool"], home.path());
    assert_eq!(outcome, Outcome::NotDelivered);
    assert!(err.contains("HTTP 503 (retry shortly)"), "{err}");
    assert!(spooled_files(home.path()).is_empty());
}

#[test]
fn status_overrides_the_exit_code_either_way() {
    let p = prep(&["--exit-code", "1", "--status", "ok"]);
    assert_eq!(
        (p.request.status, p.request.message.as_deref()),
        (Some(SignalStatus::Ok), Some("exit=1"))
    );
    let p = prep(&["--exit-code", "0", "--status", "fail"]);
    assert_eq!(p.request.status, Some(SignalStatus::Fail));
}

#[test]
fn each_url_is_tried_with_the_same_key_until_one_takes_it() {
    let home = tempfile::tempdir().expect("tempdir");
    let failing = TestServer::canned(vec![json(
        503,
        r#"{"error":"store_unavailable","message":"nothing was recorded"}"#,
    )]);
    let taking = TestServer::canned(vec![json(
        202,
        r#"{"result":"duplicate","waitpoint":"wp_env","state":"armed"}"#,
    )]);
    let dead = format!("http://{}/webhook/signal", refused_addr());
    let list = format!(
        "{dead},{},{}",
        failing.url("/webhook/signal"),
        taking.url("/webhook/signal")
    );
    let (outcome, err) = run_at(&list, &[], home.path());
    assert_eq!((outcome, err.as_str()), (Outcome::Accepted, ""));
    let (first, second) = (failing.next_request().json(), taking.next_request().json());
    assert_eq!(first["key"], second["key"], "one key on every attempt");
    assert!(spooled_files(home.path()).is_empty());
}

#[test]
fn a_refusal_is_the_answer_and_the_next_url_is_not_asked() {
    let home = tempfile::tempdir().expect("tempdir");
    let refusing = TestServer::canned(vec![json(
        401,
        r#"{"error":"unauthorized","message":"wrong secret"}"#,
    )]);
    let other = TestServer::canned(vec![json(202, "{}")]);
    let list = format!(
        "{},{}",
        refusing.url("/webhook/signal"),
        other.url("/webhook/signal")
    );
    let (outcome, _) = run_at(&list, &[], home.path());
    assert_eq!(outcome, Outcome::Refused(401));
    assert!(other.requests().is_empty());
}

#[test]
fn none_taking_it_spools_once_naming_every_url() {
    let home = tempfile::tempdir().expect("tempdir");
    let (a, b) = (
        format!("http://{}/webhook/signal", refused_addr()),
        format!("http://{}/webhook/signal", refused_addr()),
    );
    let (outcome, err) = run_at(&format!("{a},{b}"), &[], home.path());
    assert!(matches!(outcome, Outcome::Spooled(_)), "{outcome:?}");
    assert_eq!(outcome.exit_code(), 0);
    assert_eq!(spooled_files(home.path()).len(), 1);
    assert!(
        err.contains(&format!(
            "hub unreachable at {a} (connection refused), hub unreachable at {b} (connection refused); spooled the signal"
        )),
        "{err}"
    );
}

#[test]
fn a_bad_list_is_a_usage_error_naming_the_element_and_where_it_came_from() {
    let e = prepare(
        &args(&["--url", "http://a/webhook/signal,,http://b/webhook/signal"]),
        &env(),
        &mut io::empty(),
    )
    .expect_err("empty");
    assert!(e.to_string().starts_with("--url: "), "{e}");
    assert!(e.to_string().contains("URL number 2 is empty"), "{e}");
    let mut with_hub = env();
    with_hub.hub = Some("http://a:1, b:2".into());
    let e = prepare(&args(&[]), &with_hub, &mut io::empty()).expect_err("no scheme");
    assert!(e.to_string().starts_with("CORTEX_HUB: "), "{e}");
    assert!(e.to_string().contains("\"b:2\""), "{e}");
    with_hub.hub = Some("http://a:1/, https://b:2".into());
    let p = prepare(&args(&[]), &with_hub, &mut io::empty()).expect("two");
    assert_eq!(
        p.urls,
        ["http://a:1/webhook/signal", "https://b:2/webhook/signal"]
    );
}
