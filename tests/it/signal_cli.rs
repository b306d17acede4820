//! `cortex-signal`: every exit code, its spool fallback, and exactly-once with the hub.

use cortex_tests::{Hub, body, dead_port, run, wait_until};
use serde_json::json;
use std::time::Duration;

fn env<'a>(wp: &'a serde_json::Value, home: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("CORTEX_SIGNAL_ID", wp["id"].as_str().expect("id")),
        (
            "CORTEX_SIGNAL_SECRET",
            wp["secret"].as_str().expect("secret"),
        ),
        ("CORTEX_HOME", home),
    ]
}

#[test]
fn exit_codes() {
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "job", "intent": "look"}));
    let url = hub.url("/webhook/signal");
    let home = hub.home.to_str().expect("utf8").to_string();
    let e = env(&wp, &home);

    // 2: usage, missing id or secret, no arguments at all (prints help, sends nothing).
    let (code, out, err) = run("cortex-signal", &[], &[]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(format!("{out}{err}").contains("--exit-code"));
    let (code, _, err) = run("cortex-signal", &["--exit-code", "0", "--url", &url], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("CORTEX_SIGNAL_ID"), "{err}");
    let (code, _, _) = run("cortex-signal", &["--status", "done", "--url", &url], &e);
    assert_eq!(code, 2);

    // 1: refused (wrong secret).
    let (code, _, err) = run(
        "cortex-signal",
        &["--exit-code", "0", "--url", &url],
        &[
            ("CORTEX_SIGNAL_ID", wp["id"].as_str().expect("id")),
            ("CORTEX_SIGNAL_SECRET", "bad"),
            ("CORTEX_HOME", &home),
        ],
    );
    assert_eq!(code, 1, "{err}");

    // 0: accepted, with the exit code turned into status and message.
    let (code, _, err) = run("cortex-signal", &["--exit-code", "3", "--url", &url], &e);
    assert_eq!(code, 0, "{err}");
    let v = hub.get_waitpoint(wp["id"].as_str().expect("id"));
    assert_eq!(v["signals"][0]["status"], "fail");
    assert_eq!(v["signals"][0]["message"], "exit=3");
    assert!(
        v["signals"][0]["key"]
            .as_str()
            .is_some_and(|k| !k.is_empty()),
        "a fresh key per signal"
    );

    // 0: already resolved.
    let (code, _, err) = run("cortex-signal", &["--url", &url], &e);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("already resolved"), "{err}");

    // 1: unreachable with --no-spool; 0: unreachable, spooled.
    let dead = format!("http://127.0.0.1:{}/webhook/signal", dead_port());
    let spool_home = tempfile::tempdir().expect("tmp");
    let sh = spool_home.path().to_str().expect("utf8");
    let e2 = env(&wp, sh);
    let (code, _, err) = run("cortex-signal", &["--no-spool", "--url", &dead], &e2);
    assert_eq!(code, 1, "{err}");
    let (code, _, err) = run("cortex-signal", &["--message", "late", "--url", &dead], &e2);
    assert_eq!(code, 0, "{err}");
    let spooled: Vec<_> = std::fs::read_dir(spool_home.path().join("tmp/signals"))
        .expect("spool dir")
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().ends_with(".json"))
        .collect();
    assert_eq!(spooled.len(), 1, "exactly one spool file");
    let req =
        cortex_protocol::SignalRequest::parse(&std::fs::read(spooled[0].path()).expect("read"))
            .expect("a valid signal");
    assert_eq!(req.message.as_deref(), Some("late"));
    assert!(req.key.is_some());
}

/// The hub is down: cortex-signal spools; the hub drains the spool when it comes back,
/// and a signal that reached the hub over HTTP and was also spooled counts once.
#[test]
fn spool_fallback_while_the_hub_is_down_counts_once_after_it_returns() {
    let mut hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "job", "intent": "look", "max_signals": 5}),
    );
    let id = wp["id"].as_str().expect("id").to_string();
    let home = hub.home.to_str().expect("utf8").to_string();

    // Reached over HTTP *and* spooled with the same key (a timeout after the hub wrote it).
    let both = body(&wp, json!({"key": "same-key", "message": "both ways"}));
    assert_eq!(hub.signal(&both).0, 202);
    std::fs::write(
        hub.spool().join("0001-both.json"),
        serde_json::to_vec(&both).expect("json"),
    )
    .expect("write");

    let url = hub.url("/webhook/signal");
    assert!(hub.stop().success(), "SIGTERM exits 0");
    for i in 0..3 {
        let (code, _, err) = run(
            "cortex-signal",
            &["--message", &format!("while down {i}"), "--url", &url],
            &env(&wp, &home),
        );
        assert_eq!(code, 0, "{err}");
        assert!(err.contains("spool"), "{err}");
    }
    hub.spawn();
    wait_until(Duration::from_secs(20), "the spool to drain", || {
        let left = std::fs::read_dir(hub.spool())
            .ok()?
            .flatten()
            // The hub's collector lock (a dotfile) stays while it runs.
            .filter(|f| f.path().is_file() && !f.file_name().to_string_lossy().starts_with('.'))
            .count();
        (left == 0).then_some(())
    });
    let v = hub.get_waitpoint(&id);
    assert_eq!(v["signal_count"], 4, "{v:#}");
    let messages: Vec<&str> = v["signals"]
        .as_array()
        .expect("signals")
        .iter()
        .filter_map(|s| s["message"].as_str())
        .collect();
    assert_eq!(messages.iter().filter(|m| **m == "both ways").count(), 1);
    assert!(
        v["signals"]
            .as_array()
            .expect("signals")
            .iter()
            .skip(1)
            .all(|s| s["source"] == "spool")
    );
    let wakes = hub.wakes(&sid);
    assert_eq!(wakes.len(), 4, "one report per signal");
}

/// Malformed and refused spool files are parked under bad/ with the reason beside them.
#[test]
fn bad_spool_files_are_parked_with_a_reason() {
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "job", "intent": "look", "members": ["a"]}),
    );
    let files = [
        ("1-malformed.json", b"{not json".to_vec()),
        (
            "2-wrong-secret.json",
            serde_json::to_vec(&json!({"id": wp["id"], "secret": "nope", "member": "a"}))
                .expect("j"),
        ),
        (
            "3-no-member.json",
            serde_json::to_vec(&body(&wp, json!({}))).expect("j"),
        ),
        (
            "4-unknown.json",
            serde_json::to_vec(&json!({"id": "wp_000000000000", "secret": "x"})).expect("j"),
        ),
        ("5-huge.json", vec![b' '; 70_000]),
    ];
    for (name, bytes) in &files {
        let tmp = hub.spool().join(format!("{name}.tmp"));
        std::fs::write(&tmp, bytes).expect("write");
        std::fs::rename(&tmp, hub.spool().join(name)).expect("rename");
    }
    let bad = hub.spool().join("bad");
    cortex_tests::wait_parked(&bad, 5, Duration::from_secs(20));
    let reason =
        |n: &str| std::fs::read_to_string(bad.join(format!("{n}.reason"))).expect("reason");
    assert!(reason("1-malformed.json").contains("not a signal"));
    assert!(reason("2-wrong-secret.json").contains("wrong secret"));
    assert!(reason("3-no-member.json").contains("member"));
    assert!(reason("4-unknown.json").contains("no waitpoint"));
    assert!(reason("5-huge.json").contains("cap"));
    assert_eq!(
        hub.get_waitpoint(wp["id"].as_str().expect("id"))["signal_count"],
        0
    );
}
