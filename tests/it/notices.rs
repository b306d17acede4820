//! A person hears it: the real hub with settings.json `notify` naming a webhook, a Slack
//! incoming webhook and an ntfy topic, all on a tiny HTTP receiver in this test (port 0).
//! An approval is one notice per target (the webhook's first answer a 500, so it is
//! retried and lands once); a failed job's report is one more, answered 500 while the hub
//! is SIGKILLed and started again, then 200: retried by the new hub, not lost, and the
//! approval not sent again. No request carries the waitpoint's secret or a token.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cortex_tests::scripted_model::{Reply, ScriptedModel};
use cortex_tests::{Hub, body, wait_until};
use serde_json::{Value, json};

use super::metrics::scrape;
use super::runner::{LIMIT, hub_with, new_session, say};

/// One request the receiver took, and what it answered.
#[derive(Debug, Clone)]
struct Got {
    path: String,
    headers: HashMap<String, String>,
    body: String,
    answered: u16,
}

impl Got {
    fn notice_id(&self) -> &str {
        self.headers
            .get("x-cortex-notice")
            .map_or("", String::as_str)
    }
}

/// A receiver of notices: answers 500 while `down`, and to the first `fail_hook`
/// requests on `/hook`; 200 otherwise. Keep-alive connections are served in turn.
struct Receiver {
    port: u16,
    got: Arc<Mutex<Vec<Got>>>,
    down: Arc<AtomicBool>,
    fail_hook: Arc<AtomicUsize>,
}

impl Receiver {
    fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the receiver");
        let port = listener.local_addr().expect("addr").port();
        let r = Receiver {
            port,
            got: Arc::default(),
            down: Arc::default(),
            fail_hook: Arc::default(),
        };
        let (got, down, fail_hook) = (r.got.clone(), r.down.clone(), r.fail_hook.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (got, down, fail_hook) = (got.clone(), down.clone(), fail_hook.clone());
                std::thread::spawn(move || serve(conn, &got, &down, &fail_hook));
            }
        });
        r
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().map(|g| g.clone()).unwrap_or_default()
    }

    /// The requests on `path` whose body says `what`.
    fn on(&self, path: &str, what: &str) -> Vec<Got> {
        self.got()
            .into_iter()
            .filter(|g| g.path == path && g.body.contains(what))
            .collect()
    }
}

fn serve(conn: TcpStream, got: &Mutex<Vec<Got>>, down: &AtomicBool, fail_hook: &AtomicUsize) {
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut headers = HashMap::new();
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        let len: usize = headers
            .get("content-length")
            .and_then(|l| l.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let fail_once = path == "/hook"
            && fail_hook
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        let answered = if down.load(Ordering::SeqCst) || fail_once {
            500
        } else {
            200
        };
        if let Ok(mut g) = got.lock() {
            g.push(Got {
                path,
                headers,
                body: String::from_utf8_lossy(&body).into_owned(),
                answered,
            });
        }
        let reply = format!("HTTP/1.1 {answered} X\r\ncontent-length: 0\r\n\r\n");
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// `cortex_notices_total{event, result}` as the hub counts it now (0 when absent).
fn counted(hub: &Hub, event: &str, result: &str) -> f64 {
    scrape(hub)
        .get(&format!(
            "cortex_notices_total{{event=\"{event}\",result=\"{result}\"}}"
        ))
        .copied()
        .unwrap_or(0.0)
}

const PATHS: [&str; 3] = ["/hook", "/slack", "/topic"];

#[test]
fn an_approval_and_a_failed_job_are_told_once_each_through_500s_and_a_restart() {
    let rx = Receiver::start();
    rx.fail_hook.store(1, Ordering::SeqCst);
    let model = ScriptedModel::start_with_default(
        vec![Reply::tool_call("devices", "{}")],
        Reply::text("Noted."),
    );
    let settings = json!({"notify": [
        {"type": "webhook", "url": rx.url("/hook"), "name": "hook"},
        {"type": "slack", "url": rx.url("/slack")},
        {"type": "ntfy", "url": rx.url("/topic"), "events": ["approval", "failed"]},
    ]});
    let (mut hub, _tmp) = hub_with(&model, settings);

    // An approval: one notice to each target; the webhook's 500 is retried.
    let sid = new_session(&hub, json!({"policy": {"requireApproval": ["devices"]}}));
    say(&hub, &sid, json!({"text": "which devices are there?"}));
    let req = hub.wait_event(&sid, LIMIT, |e| e["kind"] == "approval-required")["approval"].clone();
    let req_id = req["id"].as_str().expect("request id").to_string();
    wait_until(LIMIT, "the approval's notices, recorded", || {
        (counted(&hub, "approval", "sent") == 3.0).then_some(())
    });
    assert_eq!(counted(&hub, "approval", "retry"), 1.0, "the webhook's 500");
    let hook = rx.on("/hook", &req_id);
    assert_eq!(
        hook.iter().map(|g| g.answered).collect::<Vec<_>>(),
        vec![500, 200],
        "{hook:#?}"
    );
    assert_eq!(hook[0].notice_id(), hook[1].notice_id(), "the same notice");
    let v: Value = serde_json::from_str(&hook[1].body).expect("webhook json");
    assert_eq!(v["event"], "approval", "{v}");
    assert_eq!(v["session"], sid.as_str(), "{v}");
    assert_eq!(v["id"], hook[1].notice_id(), "{v}");
    assert!(
        v["text"].as_str().is_some_and(|t| t.contains("devices")),
        "names the tool: {v}"
    );
    assert_eq!(
        hook[1].headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    let slack = rx.on("/slack", &req_id);
    assert_eq!(slack.len(), 1, "{slack:#?}");
    let v: Value = serde_json::from_str(&slack[0].body).expect("slack json");
    assert_eq!(
        v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()),
        Some(vec!["text".to_string()]),
        "Slack's shape: {v}"
    );
    let topic = rx.on("/topic", &req_id);
    assert_eq!(topic.len(), 1, "{topic:#?}");
    let h = &topic[0].headers;
    assert!(
        h.get("title").is_some_and(|t| t.contains("approval")),
        "{h:?}"
    );
    assert_eq!(h.get("priority").map(String::as_str), Some("4"), "{h:?}");
    assert!(h.contains_key("tags"), "{h:?}");
    assert!(
        h.get("content-type")
            .is_some_and(|c| c.starts_with("text/plain")),
        "{h:?}"
    );
    assert!(topic[0].body.contains("devices"), "{}", topic[0].body);

    // A job fails while every target answers 500; the hub dies and comes back.
    rx.down.store(true, Ordering::SeqCst);
    let other = hub.session();
    let wp = hub.waitpoint(
        &other,
        json!({"label": "nightly build", "intent": "read the log"}),
    );
    let secret = wp["secret"].as_str().expect("secret").to_string();
    let (st, v) = hub.signal(&body(
        &wp,
        json!({"status": "fail", "message": "make exited with code 2"}),
    ));
    assert_eq!(st, 202, "{v}");
    for p in ["/hook", "/slack", "/topic"] {
        wait_until(LIMIT, "a failed notice answered 500", || {
            (!rx.on(p, "nightly build").is_empty()).then_some(())
        });
    }
    hub.kill();
    rx.down.store(false, Ordering::SeqCst);
    hub.spawn();
    wait_until(
        LIMIT,
        "the failed notices, delivered after the restart",
        || (counted(&hub, "failed", "sent") == 3.0).then_some(()),
    );
    for p in PATHS {
        let failed = rx.on(p, "nightly build");
        let answers: Vec<u16> = failed.iter().map(|g| g.answered).collect();
        assert_eq!(answers.last(), Some(&200), "{p}: {failed:#?}");
        assert_eq!(
            answers.iter().filter(|a| **a == 200).count(),
            1,
            "{p}: delivered once: {failed:#?}"
        );
        assert!(answers.len() >= 2, "{p}: retried after a 500: {answers:?}");
        let ids: Vec<&str> = failed.iter().map(Got::notice_id).collect();
        assert!(ids.iter().all(|i| *i == ids[0]), "{p}: one notice: {ids:?}");
        assert!(
            failed[0].body.contains("make exited with code 2"),
            "{p}: the failing report: {}",
            failed[0].body
        );
        // The approval was delivered before the kill: never again.
        let approvals = rx.on(p, &req_id);
        let want = if p == "/hook" { 2 } else { 1 };
        assert_eq!(approvals.len(), want, "{p}: {approvals:#?}");
    }
    assert_eq!(counted(&hub, "approval", "sent"), 0.0, "nothing sent again");
    let v: Value =
        serde_json::from_str(&rx.on("/hook", "nightly build")[0].body).expect("webhook json");
    assert_eq!(v["event"], "failed", "{v}");
    assert_eq!(v["waitpoint"], wp["id"], "{v}");

    // Nothing secret in any request: not the waitpoint's secret, not the operator token.
    let all = rx.got();
    assert!(all.len() >= 7, "{all:#?}");
    for g in &all {
        let whole = format!("{:?} {}", g.headers, g.body);
        assert!(!whole.contains(&secret), "the secret in {g:#?}");
        assert!(!whole.contains(&hub.token), "the token in {g:#?}");
    }
    // The hub's log names the targets, not their URLs' paths.
    let log = hub.log();
    assert!(log.contains("notices go to this target"), "{log}");
    assert!(!log.contains("/slack"), "a target's path in the log");
}

#[test]
fn a_bad_notify_setting_stops_the_hub_at_start_without_showing_the_url() {
    let tmp = tempfile::tempdir().expect("tmp");
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    std::fs::write(
        home.join("settings.json"),
        json!({"notify": [{"type": "pager", "url": "https://example.com/SECRET_PATH"}]})
            .to_string(),
    )
    .expect("settings");
    let (code, _out, err) = cortex_tests::run(
        "cortex-hub",
        &[
            "--home",
            home.to_str().expect("utf-8"),
            "--listen",
            "127.0.0.1:0",
            "--mesh-listen",
            "off",
        ],
        &[],
    );
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("settings.json notify[0]"), "{err}");
    assert!(!err.contains("SECRET_PATH"), "{err}");
}

#[test]
fn a_target_taken_out_of_the_settings_is_given_up_after_the_restart() {
    let rx = Receiver::start();
    rx.down.store(true, Ordering::SeqCst);
    let tmp = tempfile::tempdir().expect("tmp");
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    let settings = home.join("settings.json");
    std::fs::write(
        &settings,
        json!({"notify": [{"type": "webhook", "url": rx.url("/hook"), "name": "hook"}]})
            .to_string(),
    )
    .expect("settings");
    let mut hub = Hub::at(&home, &tmp.path().join("hub.log"), &[], &[]);
    hub.spawn();
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "deploy", "intent": "check it"}));
    let (st, v) = hub.signal(&body(&wp, json!({"status": "fail"})));
    assert_eq!(st, 202, "{v}");
    wait_until(LIMIT, "the notice answered 500", || {
        (counted(&hub, "failed", "retry") >= 1.0).then_some(())
    });
    hub.stop();
    std::fs::write(&settings, "{}").expect("settings");
    hub.spawn();
    wait_until(LIMIT, "the notice given up", || {
        (counted(&hub, "failed", "failed") == 1.0).then_some(())
    });
    assert!(
        hub.log()
            .contains("a notice's target is no longer in settings.json notify; given up"),
        "{}",
        hub.log()
    );
    let tried = rx.on("/hook", "deploy");
    assert!(
        tried.iter().all(|g| g.answered == 500),
        "never delivered: {tried:#?}"
    );
}

/// Two hubs on one PostgreSQL database with the same targets share one outbox: each
/// notice goes out from one of them, once. (With each hub reading the outbox on its own,
/// both heard every notice queued, read it pending, and sent it.)
#[test]
fn hubs_sharing_a_database_send_each_notice_once() {
    const JOBS: usize = 10;
    let rx = Receiver::start();
    let pg = cortex_tests::postgres::Postgres::shared();
    let url = pg.url(&pg.database());
    let tmp = tempfile::tempdir().expect("tmp");
    let settings = json!({"notify": [{"type": "webhook", "url": rx.url("/hook"), "name": "hook"}]});
    let mut token = String::new();
    let mut hubs = Vec::new();
    for name in ["a", "b"] {
        let home = tmp.path().join(name);
        std::fs::create_dir_all(&home).expect("home");
        std::fs::write(home.join("settings.json"), settings.to_string()).expect("settings");
        let env: Vec<(&str, &str)> = if token.is_empty() {
            vec![]
        } else {
            vec![("CORTEX_WEBHOOK_TOKEN", token.as_str())]
        };
        let log = tmp.path().join(format!("{name}.log"));
        let mut hub = Hub::at(&home, &log, &env, &["--store", &url]);
        hub.spawn();
        token = hub.token.clone();
        hubs.push(hub);
    }
    let sid = hubs[0].session();
    for i in 0..JOBS {
        let wp = hubs[i % 2].waitpoint(&sid, json!({"label": format!("job {i}"), "intent": "x"}));
        let (st, v) = hubs[(i + 1) % 2].signal(&body(&wp, json!({"status": "fail"})));
        assert_eq!(st, 202, "{v}");
    }
    let sent = || -> f64 { hubs.iter().map(|h| counted(h, "failed", "sent")).sum() };
    wait_until(LIMIT, "every failed job's notice sent", || {
        (sent() >= JOBS as f64).then_some(())
    });
    let got = rx.on("/hook", "job ");
    let mut by_id: HashMap<String, usize> = HashMap::new();
    for g in got.iter().filter(|g| g.answered == 200) {
        *by_id.entry(g.notice_id().to_string()).or_default() += 1;
    }
    assert_eq!(by_id.len(), JOBS, "{by_id:?}");
    assert!(by_id.values().all(|n| *n == 1), "each sent once: {by_id:?}");
    assert_eq!(sent(), JOBS as f64, "each counted once");
}
