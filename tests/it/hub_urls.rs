//! Clients of a dead hub: `cortex --hub` / `CORTEX_HUB` and `cortex-signal --url` take
//! comma-separated URLs and move to the next when one refuses; when none answers, `cortex`
//! exits 2 naming each URL and `cortex-signal` spools as it does for one.

use cortex_tests::{Hub, dead_port, run};
use serde_json::json;

fn dead() -> String {
    format!("http://127.0.0.1:{}", dead_port())
}

#[test]
fn cortex_passes_a_refusing_hub_over() {
    let hub = Hub::start();
    let sid = hub.session();
    let list = format!("{},{}", dead(), hub.url(""));
    let token = [("CORTEX_WEBHOOK_TOKEN", hub.token.as_str())];
    let (code, out, err) = run("cortex", &["--hub", &list, "sessions"], &token);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&sid), "{out}");
    assert_eq!(err, "", "passing a dead hub over is not worth a word");

    // CORTEX_HUB takes the same list.
    let (code, out, err) = run(
        "cortex",
        &["--json", "sessions"],
        &[token[0], ("CORTEX_HUB", &list)],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&sid), "{out}");
}

#[test]
fn cortex_with_no_hub_answering_exits_2_naming_each_url() {
    let (a, b) = (dead(), dead());
    let (code, _, err) = run(
        "cortex",
        &["--hub", &format!("{a},{b}"), "sessions"],
        &[("CORTEX_WEBHOOK_TOKEN", "t")],
    );
    assert_eq!(code, 2, "{err}");
    for url in [&a, &b] {
        assert!(
            err.contains(&format!("{url} (connection refused)")),
            "{err}"
        );
    }
}

#[test]
fn a_bad_list_is_a_clear_error() {
    for (list, says) in [
        (
            "http://127.0.0.1:1,,http://127.0.0.1:2",
            "URL number 2 is empty",
        ),
        ("http://127.0.0.1:1,127.0.0.1:2", "\"127.0.0.1:2\""),
    ] {
        let (code, _, err) = run(
            "cortex",
            &["--hub", list, "sessions"],
            &[("CORTEX_WEBHOOK_TOKEN", "t")],
        );
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains("--hub / CORTEX_HUB") && err.contains(says),
            "{err}"
        );
        let (code, _, err) = run(
            "cortex-signal",
            &["--url", list],
            &[("CORTEX_SIGNAL_ID", "wp_x"), ("CORTEX_SIGNAL_SECRET", "s")],
        );
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("--url: ") && err.contains(says), "{err}");
    }
}

#[test]
fn cortex_signal_passes_a_refusing_hub_over_and_counts_once() {
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "job", "intent": "look"}));
    let id = wp["id"].as_str().expect("id");
    let home = tempfile::tempdir().expect("tmp");
    let list = format!("{}/webhook/signal,{}", dead(), hub.url("/webhook/signal"));
    let (code, _, err) = run(
        "cortex-signal",
        &["--exit-code", "0", "--url", &list],
        &[
            ("CORTEX_SIGNAL_ID", id),
            (
                "CORTEX_SIGNAL_SECRET",
                wp["secret"].as_str().expect("secret"),
            ),
            ("CORTEX_HOME", home.path().to_str().expect("utf8")),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(err, "");
    let v = hub.get_waitpoint(id);
    assert_eq!(v["signals"].as_array().map(Vec::len), Some(1), "{v}");
    assert!(
        !home.path().join("tmp/signals").exists(),
        "delivered, so nothing spooled"
    );
}

#[test]
fn cortex_signal_with_no_hub_answering_spools_naming_each_url() {
    let (a, b) = (
        format!("{}/webhook/signal", dead()),
        format!("{}/webhook/signal", dead()),
    );
    let home = tempfile::tempdir().expect("tmp");
    let (code, _, err) = run(
        "cortex-signal",
        &["--exit-code", "0", "--url", &format!("{a},{b}")],
        &[
            ("CORTEX_SIGNAL_ID", "wp_0123456789ab"),
            ("CORTEX_SIGNAL_SECRET", "secret"),
            ("CORTEX_HOME", home.path().to_str().expect("utf8")),
        ],
    );
    assert_eq!(code, 0, "spooled is success: {err}");
    for url in [&a, &b] {
        assert!(err.contains(&format!("hub unreachable at {url}")), "{err}");
    }
    assert!(err.contains("spooled the signal"), "{err}");
    let spooled: Vec<_> = std::fs::read_dir(home.path().join("tmp/signals"))
        .expect("spool dir")
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().ends_with(".json"))
        .collect();
    assert_eq!(
        spooled.len(),
        1,
        "one spool file, whatever the number of URLs"
    );
}

#[test]
fn cortex_run_hands_its_command_every_hub_the_one_that_answered_first() {
    let hub = Hub::start();
    let dead = dead();
    let (code, out, err) = run(
        "cortex",
        &[
            "--hub",
            &format!("{dead},{}", hub.url("")),
            "run",
            "--",
            "sh",
            "-c",
            "echo \"$CORTEX_HUB\"",
        ],
        &[("CORTEX_WEBHOOK_TOKEN", &hub.token), ("USER", "ada")],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), format!("{},{dead}", hub.url("")));
    assert!(err.contains("cortex: reported exit=0"), "{err}");
}

/// A hub that records the signal but whose answer is lost: `cortex-signal` sends the same
/// key to the next URL, and the store counts it once.
#[test]
fn a_signal_whose_answer_was_lost_counts_once_at_the_next_hub() {
    use std::io::{BufRead, BufReader, Read, Write};
    let hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "job", "intent": "look"}));
    let id = wp["id"].as_str().expect("id");
    // In front of the hub: passes the signal on, then hangs up without answering.
    let front = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let front_url = format!(
        "http://{}/webhook/signal",
        front.local_addr().expect("addr")
    );
    let addr = hub.addr.clone();
    let forwarder = std::thread::spawn(move || {
        let (conn, _) = front.accept().expect("accept");
        let mut conn = BufReader::new(conn);
        let mut length = 0;
        loop {
            let mut line = String::new();
            conn.read_line(&mut line).expect("head");
            if line.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().expect("length");
            }
        }
        let mut body = vec![0; length];
        conn.read_exact(&mut body).expect("body");
        let mut up = std::net::TcpStream::connect(&addr).expect("the hub");
        write!(
            up,
            "POST /webhook/signal HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
        )
        .expect("send");
        up.write_all(&body).expect("send body");
        let mut answer = String::new();
        up.read_to_string(&mut answer).expect("answer");
        assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
        // `conn` is dropped here: the answer never reaches cortex-signal.
    });
    let home = tempfile::tempdir().expect("tmp");
    let list = format!("{front_url},{}", hub.url("/webhook/signal"));
    let (code, _, err) = run(
        "cortex-signal",
        &["--exit-code", "0", "--url", &list],
        &[
            ("CORTEX_SIGNAL_ID", id),
            (
                "CORTEX_SIGNAL_SECRET",
                wp["secret"].as_str().expect("secret"),
            ),
            ("CORTEX_HOME", home.path().to_str().expect("utf8")),
        ],
    );
    forwarder.join().expect("forwarded");
    assert_eq!(code, 0, "{err}");
    let v = hub.get_waitpoint(id);
    assert_eq!(v["signals"].as_array().map(Vec::len), Some(1), "{v}");
    assert!(!home.path().join("tmp/signals").exists(), "nothing spooled");
}
