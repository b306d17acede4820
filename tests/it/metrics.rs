//! What an operator watches: `GET /metrics` (Prometheus text, no token, on the loopback
//! listener) counts a signal and its wake as they happen and shows the waitpoints by
//! state; the log has one structured line per lifecycle step; a second hub on a home
//! already in use stops before it binds or prints anything, naming the first one's pid.

// Values read from the hub's answers; a panic is the test failing.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use cortex_cli::http::{Method, Request};
use cortex_tests::{Hub, bin, body, wait_until};
use serde_json::json;

const T: Duration = Duration::from_secs(20);

/// One scrape: the samples by `name{labels}` as written, each line checked to be a
/// comment or `name{labels} value`.
pub(crate) fn scrape(hub: &Hub) -> HashMap<String, f64> {
    let resp = Request::new(Method::Get, &hub.url("/metrics"))
        .send()
        .expect("GET /metrics");
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert!(
        resp.header("content-type")
            .is_some_and(|c| c.starts_with("text/plain; version=0.0.4")),
        "{:?}",
        resp.headers
    );
    let text = resp.text().to_string();
    let mut out = HashMap::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("not `series value`: {line:?}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
                && !name.starts_with(|c: char| c.is_ascii_digit()),
            "metric name {name:?} in {line:?}"
        );
        if name_end < series.len() {
            let labels = &series[name_end..];
            assert!(
                labels.ends_with('}')
                    && labels[1..labels.len() - 1]
                        .split("\",")
                        .all(|kv| kv.split_once("=\"").is_some()),
                "labels {labels:?} in {line:?}"
            );
        }
        let v: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("value {v:?} in {line:?}")),
        };
        out.insert(series.to_string(), v);
    }
    out
}

fn get(m: &HashMap<String, f64>, series: &str) -> f64 {
    m.get(series).copied().unwrap_or(0.0)
}

const ACCEPTED_HTTP: &str = r#"cortex_signals_total{source="http",result="accepted"}"#;
const FIRED: &str = r#"cortex_wakes_total{reason="fired"}"#;
const ARMED: &str = r#"cortex_waitpoints{state="armed"}"#;
const RESOLVED: &str = r#"cortex_waitpoints{state="resolved"}"#;

#[test]
fn metrics_count_a_signal_and_its_wake_and_the_log_tells_each_step() {
    let hub = Hub::start();
    // No token for the metrics; the API beside them still wants it.
    let before = scrape(&hub);
    let api = Request::new(Method::Get, &hub.url("/api/sessions"))
        .send()
        .unwrap();
    assert_eq!(api.status, 401);
    assert_eq!(get(&before, ARMED), 0.0, "{before:?}");
    assert_eq!(get(&before, r#"cortex_devices{state="online"}"#), 0.0);

    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "job", "intent": "look"}));
    let id = wp["id"].as_str().unwrap().to_string();
    // The counts follow the answer by a moment (they are taken once it is durable).
    let armed = wait_until(T, "the waitpoint counted armed", || {
        let m = scrape(&hub);
        (get(&m, ARMED) >= 1.0).then_some(m)
    });
    assert_eq!(get(&armed, ARMED), 1.0, "{armed:?}");

    let (st, v) = hub.signal(&body(&wp, json!({"status": "ok", "message": "done"})));
    assert_eq!((st, v["result"].as_str()), (202, Some("accepted")), "{v}");
    hub.wait_wake(&sid, &id, 1, T);
    let after = wait_until(T, "the signal and its wake counted", || {
        let m = scrape(&hub);
        (get(&m, ACCEPTED_HTTP) > get(&before, ACCEPTED_HTTP)
            && get(&m, FIRED) > get(&before, FIRED)
            && get(&m, RESOLVED) >= 1.0)
            .then_some(m)
    });
    assert_eq!(
        get(&after, ACCEPTED_HTTP) - get(&before, ACCEPTED_HTTP),
        1.0,
        "{after:?}"
    );
    assert_eq!(get(&after, FIRED) - get(&before, FIRED), 1.0, "{after:?}");
    assert_eq!(get(&after, ARMED), 0.0, "{after:?}");
    assert_eq!(get(&after, RESOLVED), 1.0, "{after:?}");
    assert!(get(&after, "cortex_store_commit_seconds_count") >= 1.0);
    // The journal's syncs are redb's; on PostgreSQL the commit is the database's.
    if !cortex_tests::on_postgres() {
        assert!(get(&after, "cortex_store_fsync_seconds_count") >= 1.0);
        assert_eq!(
            get(&after, r#"cortex_store_fsync_seconds_bucket{le="+Inf"}"#),
            get(&after, "cortex_store_fsync_seconds_count")
        );
    }

    // The log: one line per step, fields as text (no Rust Debug), no secret.
    let log = hub.log();
    let line = |what: &str, fields: &[&str]| {
        let found = log
            .lines()
            .find(|l| l.contains(what) && fields.iter().all(|f| l.contains(f)));
        assert!(
            found.is_some(),
            "no {what:?} line with {fields:?} in:\n{log}"
        );
    };
    let w = format!("waitpoint={id}");
    let s = format!("session={sid}");
    line("waitpoint armed", &[&w, &s]);
    line(
        "signal answered",
        &[&w, &s, "source=http", "result=accepted", "state=resolved"],
    );
    line("wake delivered", &[&w, &s, "reason=fired"]);
    line("waitpoint ended", &[&w, "state=resolved"]);
    let secret = wp["secret"].as_str().unwrap();
    assert!(!log.contains(secret), "the secret is in the log:\n{log}");
    assert!(
        !log.contains("Accepted {") && !log.contains("Some(\""),
        "Rust Debug in the log:\n{log}"
    );
}

#[test]
fn a_second_hub_on_a_home_in_use_is_refused_naming_the_first() {
    let hub = Hub::start();
    let pid = hub.pid().unwrap();
    let mut second = Command::new(bin("cortex-hub"))
        .arg("--home")
        .arg(&hub.home)
        .args(["--listen", "127.0.0.1:0", "--mesh-listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_until(T, "the second hub to exit", || second.try_wait().unwrap());
    let out = second.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!status.success(), "{status}: {stderr}");
    assert!(
        stderr.contains(&format!(
            "another cortex-hub (pid {pid}) is using this home"
        )),
        "{stderr}"
    );
    assert!(stderr.contains(&hub.home.display().to_string()), "{stderr}");
    assert!(!stderr.contains("listening"), "{stderr}");
    assert!(!stderr.contains("Database already open"), "{stderr}");
    assert!(out.stdout.is_empty());
    // The first one is untouched.
    let (st, _) = hub.api(Method::Get, "/api/sessions", None);
    assert_eq!(st, 200);
}
