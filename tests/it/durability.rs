//! Restarts: waitpoints and wake history survive, a decided wake is delivered once after a
//! hard kill, sessions and their API (messages, long poll, SSE, deletion).

use std::io::{BufRead, BufReader, Write};
use std::time::Duration;

use cortex_cli::http::Method;
use cortex_tests::{Hub, body, wait_until};
use serde_json::json;

use crate::metrics::scrape;

const LIMIT: Duration = Duration::from_secs(30);

#[test]
fn a_waitpoint_and_its_wake_history_survive_a_restart() {
    let mut hub = Hub::start();
    let sid = hub.session();
    let done = hub.waitpoint(&sid, json!({"label": "done", "intent": "x"}));
    let open = hub.waitpoint(
        &sid,
        json!({"label": "open", "intent": "y", "members": ["a", "b"]}),
    );
    assert_eq!(
        hub.signal(&body(&done, json!({"message": "finished"}))).0,
        202
    );
    assert_eq!(hub.signal(&body(&open, json!({"member": "a"}))).0, 202);
    let before = hub.events(&sid, 0);
    hub.restart();
    assert_eq!(
        hub.events(&sid, 0),
        before,
        "the log is unchanged by a hard restart"
    );
    let v = hub.get_waitpoint(done["id"].as_str().expect("id"));
    assert_eq!(v["state"], "resolved");
    assert_eq!(v["wakes"].as_array().expect("wakes").len(), 1);
    assert_eq!(v["wakes"][0]["delivered"], true);
    // The armed one still counts what it had, and the old secret still works.
    assert_eq!(hub.signal(&body(&open, json!({"member": "b"}))).0, 202);
    let wake = hub.wait_wake(&sid, open["id"].as_str().expect("id"), 1, LIMIT);
    assert_eq!(wake["signals"].as_array().expect("s").len(), 2);
}

/// A barrier completes, and the hub is SIGKILLed inside its 3 s window: the decided wake
/// is delivered after the restart, once.
#[test]
fn a_decided_wake_is_delivered_once_after_a_hard_kill() {
    let mut hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "pair", "intent": "both", "members": ["a", "b"]}),
    );
    hub.signal(&body(&wp, json!({"member": "a"})));
    hub.signal(&body(&wp, json!({"member": "b"})));
    hub.kill();
    hub.spawn();
    let wake = hub.wait_wake(&sid, wp["id"].as_str().expect("id"), 1, LIMIT);
    assert_eq!(wake["reason"], "fired");
    hub.restart();
    assert_eq!(
        hub.wakes(&sid).len(),
        1,
        "exactly once, also after another restart"
    );
}

#[test]
fn sessions_messages_long_poll_and_deletion() {
    let hub = Hub::start();
    let sid = hub.session();
    let (st, list) = hub.api(Method::Get, "/api/sessions", None);
    assert_eq!(st, 200);
    assert_eq!(list.as_array().expect("list").len(), 1);

    let (st, v) = hub.api(
        Method::Post,
        &format!("/api/sessions/{sid}/messages"),
        Some(&json!({"text": "hello", "dedupe_key": "m1"})),
    );
    assert_eq!(st, 201, "{v}");
    let (st, again) = hub.api(
        Method::Post,
        &format!("/api/sessions/{sid}/messages"),
        Some(&json!({"text": "hello", "dedupe_key": "m1"})),
    );
    assert_eq!((st, again["duplicate"].as_bool()), (200, Some(true)));
    assert_eq!(again["seq"], v["seq"]);

    // A long poll answers as soon as the wake lands.
    let wp = hub.waitpoint(&sid, json!({"label": "job", "intent": "x"}));
    let last = hub.events(&sid, 0).last().expect("events")["seq"]
        .as_u64()
        .expect("seq");
    let (addr, token, sid2) = (hub.addr.clone(), hub.token.clone(), sid.clone());
    let poller = std::thread::spawn(move || {
        let url = format!("http://{addr}/api/sessions/{sid2}/events?after={last}&wait=60");
        let bearer = format!("Bearer {token}");
        let r = cortex_cli::http::Request::new(Method::Get, &url)
            .header("authorization", &bearer)
            .timeout(Duration::from_secs(90))
            .send()
            .expect("poll");
        serde_json::from_slice::<serde_json::Value>(&r.body).expect("json")
    });
    // Parked: the hub counts it among the sessions' watchers until it answers.
    let watchers = |hub: &Hub| scrape(hub).get("cortex_session_watchers").copied();
    wait_until(LIMIT, "the long poll parked", || {
        (watchers(&hub) == Some(1.0)).then_some(())
    });
    hub.signal(&body(&wp, json!({"message": "done"})));
    let got = poller.join().expect("join");
    assert_eq!(got["events"][0]["kind"], "wake", "{got}");
    assert_eq!(watchers(&hub), Some(0.0), "the answered poll is no watcher");

    // Deleting the session cancels its armed waitpoints: a late signal is 410.
    let armed = hub.waitpoint(&sid, json!({"label": "armed", "intent": "x"}));
    let (st, _) = hub.api(Method::Delete, &format!("/api/sessions/{sid}"), None);
    assert_eq!(st, 200);
    assert_eq!(
        hub.api(Method::Get, &format!("/api/sessions/{sid}"), None)
            .0,
        404
    );
    assert_eq!(hub.signal(&body(&armed, json!({}))).0, 410);
    assert_eq!(
        hub.get_waitpoint(armed["id"].as_str().expect("id"))["state"],
        "cancelled"
    );
}

#[test]
fn wait_check_and_cancel_are_scoped_to_the_session() {
    let hub = Hub::start();
    let a = hub.session();
    let b = hub.session();
    let wp = hub.waitpoint(&a, json!({"label": "mine", "intent": "x"}));
    let id = wp["id"].as_str().expect("id");
    let (st, v) = hub.api(Method::Get, &format!("/api/sessions/{a}/waitpoints"), None);
    assert_eq!(st, 200);
    assert_eq!(v["waitpoints"].as_array().expect("list").len(), 1);
    assert!(
        v.to_string()
            .find(wp["secret"].as_str().expect("s"))
            .is_none(),
        "never the secret"
    );
    assert_eq!(
        hub.api(Method::Get, &format!("/api/sessions/{b}/waitpoints"), None)
            .1["waitpoints"],
        json!([])
    );
    assert_eq!(
        hub.api(
            Method::Get,
            &format!("/api/waitpoints/{id}?session={b}"),
            None
        )
        .0,
        404
    );
    assert_eq!(
        hub.api(
            Method::Delete,
            &format!("/api/waitpoints/{id}?session={b}"),
            None
        )
        .0,
        404
    );
    let (st, v) = hub.api(
        Method::Delete,
        &format!("/api/waitpoints/{id}?session={a}"),
        None,
    );
    assert_eq!((st, v["state"].as_str()), (200, Some("cancelled")));
    assert_eq!(hub.signal(&body(&wp, json!({}))).0, 410);
    let cancelled = hub
        .events(&a, 0)
        .into_iter()
        .find(|e| e["kind"] == "waitpoint-cancelled")
        .expect("event");
    assert_eq!(cancelled["by"], "agent");
}

#[test]
fn sse_streams_events_as_they_land() {
    let hub = Hub::start();
    let sid = hub.session();
    let mut s = std::net::TcpStream::connect(&hub.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(s, "GET /api/sessions/{sid}/events?after=0 HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\nAuthorization: Bearer {}\r\n\r\n", hub.token).expect("write");
    let mut r = BufReader::new(s);
    let wp = hub.waitpoint(&sid, json!({"label": "live", "intent": "x"}));
    hub.signal(&body(&wp, json!({"message": "streamed"})));
    let mut line = String::new();
    let mut saw = Vec::new();
    while saw.len() < 2 {
        line.clear();
        assert!(r.read_line(&mut line).expect("read") > 0, "stream ended");
        if let Some(d) = line.strip_prefix("data: ") {
            let v: serde_json::Value = serde_json::from_str(d.trim()).expect("json");
            saw.push(v["kind"].as_str().expect("kind").to_string());
        }
    }
    assert_eq!(saw, vec!["waitpoint-armed", "wake"]);
}

#[test]
fn sigterm_exits_zero_and_nothing_accepted_is_lost() {
    let mut hub = Hub::start();
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "m", "intent": "x", "max_signals": 1000}),
    );
    for i in 0..50 {
        assert_eq!(
            hub.signal(&body(
                &wp,
                json!({"status": "progress", "key": format!("k{i}")})
            ))
            .0,
            202
        );
    }
    assert!(hub.stop().success());
    hub.spawn();
    assert_eq!(
        hub.get_waitpoint(wp["id"].as_str().expect("id"))["signal_count"],
        50
    );
}
