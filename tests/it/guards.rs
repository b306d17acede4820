//! Guards on what a client or a session may hold in the hub: a delete stops what the
//! session runs, an output schema is compiled once within its budget, and live log
//! followers share one byte budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cortex_cli::http::{Method, Request};
use cortex_tests::scripted_model::{Outcome, Reply, ScriptedModel};
use cortex_tests::{Hub, wait_until};
use serde_json::{Map, Value, json};

use crate::runner::{LIMIT, hub_with, new_session, run_end, say};

#[test]
fn deleting_a_session_stops_its_model_call() {
    // The call would hang for ten minutes: only the delete can end it within the test.
    let model = ScriptedModel::start_with_default(vec![Reply::hang()], Reply::text("fine"));
    let (hub, _tmp) = hub_with(
        &model,
        json!({"llm": {"firstByteTimeoutMs": 600000, "idleTimeoutMs": 600000, "maxRetries": 0}}),
    );
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "think about it"}));
    model.wait_requests(1, LIMIT);
    let (st, v) = hub.api(Method::Delete, &format!("/api/sessions/{sid}"), None);
    assert_eq!(st, 200, "{v}");
    // The hub dropped the call: the server saw its client go.
    assert_eq!(model.wait_outcome(0, LIMIT), Outcome::ClientGone);
    // A cancel now finds no session; the model call is over all the same.
    let (st, v) = hub.api(Method::Post, &format!("/api/sessions/{sid}/cancel"), None);
    assert_eq!(st, 404, "{v}");
    // Another session runs to its end after the stopped one's task wrote what it wrote.
    let other = new_session(&hub, json!({}));
    say(&hub, &other, json!({"text": "hello"}));
    let end = run_end(&hub, &other, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    // The deleted session stays deleted: no event, no agent record brought back.
    let (st, v) = hub.api(Method::Get, &format!("/api/sessions/{sid}"), None);
    assert_eq!(st, 404, "{v}");
    let (st, v) = hub.api(Method::Get, &format!("/api/sessions/{sid}/events"), None);
    assert_eq!(st, 404, "{v}");
    let (_, list) = hub.api(Method::Get, "/api/sessions", None);
    let listed = list
        .as_array()
        .is_some_and(|l| l.iter().any(|s| s["id"] == sid));
    assert!(!listed, "{list}");
    assert_eq!(
        model.request_count(),
        2,
        "the deleted session's call was not made again"
    );
    let log = hub.log();
    assert!(!log.contains("stopped driving a session"), "{log}");
}

/// The schema the issue found: `d{n}` is `anyOf` over two `$ref`s of `d{n-1}`, `depth`
/// times (2^depth paths in a 2 KB document).
fn chained_any_of(depth: usize) -> Value {
    let mut defs = Map::new();
    defs.insert("d0".into(), json!({"type": "string"}));
    for n in 1..=depth {
        let prev = format!("#/$defs/d{}", n - 1);
        defs.insert(
            format!("d{n}"),
            json!({"anyOf": [{"$ref": prev}, {"$ref": prev}]}),
        );
    }
    json!({"$defs": defs, "$ref": format!("#/$defs/d{depth}")})
}

/// `/healthz` asked over and over on another thread until the answer is dropped: every
/// answer must be 200; the count is returned.
struct Health {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl Health {
    fn poll(hub: &Hub) -> Health {
        let url = hub.url("/healthz");
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut n = 0;
            while !s.load(Ordering::Relaxed) {
                let r = Request::new(Method::Get, &url)
                    .timeout(Duration::from_secs(10))
                    .send()
                    .expect("/healthz answers");
                assert_eq!(r.status, 200, "/healthz");
                n += 1;
                // A pace, not a wait: the poller asks again and again.
                std::thread::sleep(Duration::from_millis(5));
            }
            n
        });
        Health {
            stop,
            thread: Some(thread),
        }
    }

    fn answered(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .map(|t| t.join().expect("the /healthz poller"))
            .unwrap_or_default()
    }
}

#[test]
fn a_schema_whose_checks_never_end_is_refused_and_healthz_answers() {
    let model = ScriptedModel::start(vec![]);
    let (hub, _tmp) = hub_with(&model, json!({}));
    let health = Health::poll(&hub);
    let schema = chained_any_of(40);
    assert!(schema.to_string().len() < 2_600, "a 2 KB document");
    for _ in 0..5 {
        let t = Instant::now();
        let (st, v) = hub.api(
            Method::Post,
            "/api/sessions",
            Some(&json!({"runs": true, "output": {"schema": schema}})),
        );
        assert_eq!(st, 400, "{v}");
        assert_eq!(v["error"], "schema_too_complex", "{v}");
        let m = v["message"].as_str().unwrap_or_default();
        assert!(m.contains("more than 20000 subschemas"), "{m}");
        eprintln!("the depth-40 chain refused in {:?}", t.elapsed());
    }
    // The same shape a level short of the bound is a session.
    let (st, v) = hub.api(
        Method::Post,
        "/api/sessions",
        Some(&json!({"runs": true, "output": {"schema": chained_any_of(12)}})),
    );
    assert_eq!(st, 201, "{v}");
    let n = health.answered();
    assert!(n > 0, "/healthz was asked");
    eprintln!("/healthz answered {n} times meanwhile");
}

#[test]
fn a_schema_that_compiles_past_its_budget_is_refused_while_the_hub_answers() {
    let model = ScriptedModel::start(vec![]);
    let (hub, _tmp) = hub_with(&model, json!({"limits": {"schemaCompileMs": 100}}));
    // 2,000 patterns pass the precheck (2,001 subschemas) and take seconds to compile in
    // a debug build, hundreds of milliseconds in a release one: past 100 ms either way.
    let mut props = Map::new();
    for i in 0..2_000 {
        props.insert(
            format!("p{i}"),
            json!({"type": "string", "pattern": format!("^(a|b|c|d|e){{2,40}}[a-z0-9]{{1,64}}x{i}$")}),
        );
    }
    let slow = json!({"type": "object", "properties": props});
    let health = Health::poll(&hub);
    let t = Instant::now();
    let (st, v) = hub.api(
        Method::Post,
        "/api/sessions",
        Some(&json!({"runs": true, "output": {"schema": slow}})),
    );
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"], "schema_compile_timeout", "{v}");
    let m = v["message"].as_str().unwrap_or_default();
    assert!(m.contains("limits.schemaCompileMs (100 ms)"), "{m}");
    eprintln!("refused after {:?}", t.elapsed());
    // The compile goes on on its blocking thread; the hub answers meanwhile, and a
    // small schema waits its turn (503 while the slow one still holds the slot).
    let (st, _) = hub.api(Method::Get, "/api/sessions", None);
    assert_eq!(st, 200);
    let small = json!({"runs": true, "output": {"schema": {"type": "object"}}});
    let busy = std::cell::Cell::new(0);
    wait_until(Duration::from_secs(120), "a small schema accepted", || {
        let (st, v) = hub.api(Method::Post, "/api/sessions", Some(&small));
        match st {
            201 => Some(()),
            503 => {
                assert_eq!(v["error"], "schema_compile_busy", "{v}");
                busy.set(busy.get() + 1);
                None
            }
            _ => panic!("{st} {v}"),
        }
    });
    let n = health.answered();
    assert!(n > 0, "/healthz was asked");
    eprintln!(
        "/healthz answered {n} times meanwhile; the small schema was told busy {} times",
        busy.get()
    );
}
