//! `GET /api/openapi.json` against the hub that serves it: the document is OpenAPI 3, every
//! route it names is served, and every answer seen here (the probes and a whole session's
//! worth of real calls) carries a code the document lists for it, with a body its schema
//! for that code accepts.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use cortex_cli::http::{Method, Request};
use cortex_tests::{Hub, body};
use serde_json::{Value, json};

/// The document's operations, as (method, path template).
fn operations(doc: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            if ["get", "post", "put", "delete", "patch", "head", "options"]
                .contains(&method.as_str())
            {
                out.push((method.clone(), path.clone()));
            }
        }
    }
    out
}

fn method_of(m: &str) -> Method {
    match m {
        "get" => Method::Get,
        "post" => Method::Post,
        "put" => Method::Put,
        "delete" => Method::Delete,
        other => panic!("the document names {other}, which this test cannot send"),
    }
}

/// Checks `body` against the schema `schema`, whose refs point into `doc`'s components.
fn fits(doc: &Value, schema: &Value, body: &Value) -> Vec<String> {
    let mut root = schema.clone();
    root["components"] = doc["components"].clone();
    let v = jsonschema::validator_for(&root).expect("the schema compiles");
    v.iter_errors(body).map(|e| e.to_string()).collect()
}

/// That the document lists `status` for `method template`, and that `body` fits its
/// JSON schema there (when the answer is JSON by the document).
fn check(doc: &Value, method: &str, template: &str, status: u16, body: &Value) {
    let op = &doc["paths"][template][method];
    assert!(op.is_object(), "{method} {template} is not in the document");
    let response = &op["responses"][status.to_string()];
    assert!(
        response.is_object(),
        "{method} {template} answered {status}, a code the document does not list: {body}"
    );
    if let Some(schema) = response["content"]
        .get("application/json")
        .map(|c| &c["schema"])
    {
        let errors = fits(doc, schema, body);
        assert!(
            errors.is_empty(),
            "{method} {template} {status}: the body does not fit the document's schema: {errors:?}\n{body}"
        );
    }
}

/// One API call with the token, checked against the document.
fn call(
    hub: &Hub,
    doc: &Value,
    method: &str,
    template: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let (st, v) = hub.api(method_of(method), path, body);
    check(doc, method, template, st, &v);
    (st, v)
}

fn signal(hub: &Hub, doc: &Value, body: &Value) -> (u16, Value) {
    let (st, v) = hub.signal(body);
    check(doc, "post", "/webhook/signal", st, &v);
    (st, v)
}

#[test]
fn the_document_describes_the_hub_that_serves_it() {
    let hub = Hub::start();

    // Behind the operator token, like the rest of /api.
    let resp = Request::new(Method::Get, &hub.url("/api/openapi.json"))
        .send()
        .expect("answer");
    assert_eq!(resp.status, 401, "{}", resp.text());
    let (st, doc) = hub.api(Method::Get, "/api/openapi.json", None);
    assert_eq!(st, 200, "{doc}");
    let version = doc["openapi"].as_str().expect("openapi");
    assert!(version.starts_with("3."), "{version}");
    assert!(doc["components"]["schemas"]["ErrorBody"].is_object());

    // Every documented route is served: the router's own 404 (`no_route`) and 405 are
    // what an undocumented or misspelled route gets. The answer's code is one the
    // document lists, and a JSON body fits its schema.
    let ops = operations(&doc);
    assert!(ops.len() > 25, "{ops:?}");
    for (method, template) in &ops {
        let path = template
            .replace("{sid}", "ses_probe")
            .replace("{id}", "wp_probe")
            .replace("{name}", "probe");
        assert!(
            !path.contains('{'),
            "a parameter this test does not fill: {template}"
        );
        let (st, v) = hub.api(method_of(method), &path, None);
        assert!(
            st != 405 && !(st == 404 && v["error"] == "no_route"),
            "{method} {template} is documented but not served: {st} {v}"
        );
        check(&doc, method, template, st, &v);
    }

    // A session's worth of real answers, each against its schema.
    let (st, session) = call(
        &hub,
        &doc,
        "post",
        "/api/sessions",
        "/api/sessions",
        Some(&json!({"title": "openapi", "stop": {"steps": 5}})),
    );
    assert_eq!(st, 201, "{session}");
    let sid = session["id"].as_str().expect("id").to_string();
    let s = |tail: &str| format!("/api/sessions/{sid}{tail}");
    call(&hub, &doc, "get", "/api/sessions", "/api/sessions", None);
    call(&hub, &doc, "get", "/api/sessions/{sid}", &s(""), None);
    let (st, _) = call(
        &hub,
        &doc,
        "post",
        "/api/sessions/{sid}/messages",
        &s("/messages"),
        Some(&json!({"text": "tell me when it ends", "dedupe_key": "m1"})),
    );
    assert_eq!(st, 201);
    let (st, _) = call(
        &hub,
        &doc,
        "post",
        "/api/sessions/{sid}/messages",
        &s("/messages"),
        Some(&json!({"text": "tell me when it ends", "dedupe_key": "m1"})),
    );
    assert_eq!(st, 200, "a duplicate");

    let (st, wp) = call(
        &hub,
        &doc,
        "post",
        "/api/sessions/{sid}/waitpoints",
        &s("/waitpoints"),
        Some(&json!({"label": "job", "intent": "read it",
                     "silence_after": "20m"})),
    );
    assert_eq!(st, 201, "{wp}");
    let (st, team) = call(
        &hub,
        &doc,
        "post",
        "/api/sessions/{sid}/waitpoints",
        &s("/waitpoints"),
        Some(
            &json!({"label": "team", "intent": "all arms", "members": ["a", "b"], "quorum": "all"}),
        ),
    );
    assert_eq!(st, 201, "{team}");
    let (st, v) = signal(
        &hub,
        &doc,
        &body(&wp, json!({"status": "progress", "key": "p1"})),
    );
    assert_eq!((st, v["result"].as_str()), (202, Some("accepted")));
    let (st, v) = signal(
        &hub,
        &doc,
        &body(&wp, json!({"status": "progress", "key": "p1"})),
    );
    assert_eq!((st, v["result"].as_str()), (202, Some("duplicate")));
    let (st, _) = signal(
        &hub,
        &doc,
        &body(&wp, json!({"message": "done", "data": "x=1"})),
    );
    assert_eq!(st, 202);
    let (st, v) = signal(&hub, &doc, &body(&wp, json!({})));
    assert_eq!((st, v["error"].as_str()), (410, Some("already_resolved")));
    let (st, v) = signal(&hub, &doc, &body(&team, json!({"member": "z"})));
    assert_eq!(st, 422, "{v}");
    let (st, _) = signal(
        &hub,
        &doc,
        &json!({"id": wp["id"], "secret": "0".repeat(64)}),
    );
    assert_eq!(st, 401);
    let (st, _) = signal(&hub, &doc, &json!({"id": "wp_000000000000", "secret": "x"}));
    assert_eq!(st, 404);
    let (st, _) = signal(
        &hub,
        &doc,
        &body(&wp, json!({"message": "m".repeat(2_001)})),
    );
    assert_eq!(st, 413);

    let id = wp["id"].as_str().expect("id");
    hub.wait_wake(&sid, id, 1, Duration::from_secs(30));
    let (_, page) = call(
        &hub,
        &doc,
        "get",
        "/api/sessions/{sid}/events",
        &s("/events?after=0"),
        None,
    );
    let kinds: Vec<_> = page["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["kind"].as_str().expect("kind").to_string())
        .collect();
    assert!(kinds.contains(&"wake".to_string()), "{kinds:?}");
    assert!(kinds.contains(&"waitpoint-armed".to_string()), "{kinds:?}");

    // The same log as SSE: each event's data fits the Event schema.
    let url = hub.url(&s("/events?after=0"));
    let bearer = format!("Bearer {}", hub.token);
    let mut stream = Request::new(Method::Get, &url)
        .header("authorization", &bearer)
        .timeout(Duration::from_secs(30))
        .open("text/event-stream")
        .expect("stream");
    assert_eq!(stream.status, 200);
    let content = &doc["paths"]["/api/sessions/{sid}/events"]["get"]["responses"]["200"]["content"];
    assert!(content["text/event-stream"].is_object(), "{content}");
    let event_schema = json!({"$ref": "#/components/schemas/Event"});
    let mut lines = BufReader::new(&mut stream.body).lines();
    let mut seen = 0;
    while seen < kinds.len() {
        let line = lines.next().expect("a line before the end").expect("read");
        if let Some(data) = line.strip_prefix("data:") {
            let event: Value = serde_json::from_str(data.trim()).expect("an event's JSON");
            let errors = fits(&doc, &event_schema, &event);
            assert!(errors.is_empty(), "{errors:?}\n{event}");
            seen += 1;
        }
    }
    drop(lines);
    drop(stream);

    call(
        &hub,
        &doc,
        "get",
        "/api/waitpoints/{id}",
        &format!("/api/waitpoints/{id}"),
        None,
    );
    call(
        &hub,
        &doc,
        "get",
        "/api/sessions/{sid}/waitpoints",
        &s("/waitpoints"),
        None,
    );
    let team_id = team["id"].as_str().expect("id");
    let (st, v) = call(
        &hub,
        &doc,
        "delete",
        "/api/waitpoints/{id}",
        &format!("/api/waitpoints/{team_id}"),
        None,
    );
    assert_eq!((st, &v["cancelled"]), (200, &json!(true)));
    let (st, v) = call(
        &hub,
        &doc,
        "delete",
        "/api/waitpoints/{id}",
        &format!("/api/waitpoints/{id}"),
        None,
    );
    assert_eq!((st, &v["cancelled"]), (200, &json!(false)));

    // People: nothing waits; a cancel of the turn; no result yet.
    call(&hub, &doc, "get", "/api/approvals", "/api/approvals", None);
    let (st, _) = call(
        &hub,
        &doc,
        "post",
        "/api/sessions/{sid}/answers",
        &s("/answers"),
        Some(&json!({"request_id": "apr_none", "decision": "allow"})),
    );
    assert_eq!(st, 404);
    let (st, _) = call(
        &hub,
        &doc,
        "post",
        "/api/sessions/{sid}/cancel",
        &s("/cancel"),
        Some(&json!({"turn_only": true})),
    );
    assert_eq!(st, 202);
    let (st, _) = call(
        &hub,
        &doc,
        "get",
        "/api/sessions/{sid}/result",
        &s("/result"),
        None,
    );
    assert_eq!(st, 404);

    // Devices: enrol, a remote wait (offline: pending), the listing, files, revoke.
    let (st, _) = call(
        &hub,
        &doc,
        "post",
        "/api/devices",
        "/api/devices",
        Some(&json!({"name": "gpu1"})),
    );
    assert_eq!(st, 201);
    let (st, _) = call(
        &hub,
        &doc,
        "post",
        "/api/devices",
        "/api/devices",
        Some(&json!({"name": "gpu1"})),
    );
    assert_eq!(st, 409);
    let (st, waited) = call(
        &hub,
        &doc,
        "post",
        "/api/devices/{name}/waits",
        "/api/devices/gpu1/waits",
        Some(&json!({"kind": "any", "conditions": [
            {"kind": "pid", "pid": 4242},
            {"kind": "log", "path": "/var/log/train.log", "match": "epoch 10", "silence": 600},
        ], "session": sid})),
    );
    assert_eq!(st, 201, "{waited}");
    call(&hub, &doc, "get", "/api/devices", "/api/devices", None);
    let (_, device) = call(
        &hub,
        &doc,
        "get",
        "/api/devices/{name}",
        "/api/devices/gpu1",
        None,
    );
    assert_eq!(device["wait_list"][0]["kind"], "any", "{device}");
    call(
        &hub,
        &doc,
        "get",
        "/api/devices/{name}/files",
        "/api/devices/gpu1/files",
        None,
    );
    let (st, _) = call(
        &hub,
        &doc,
        "delete",
        "/api/devices/{name}",
        "/api/devices/gpu1",
        None,
    );
    assert_eq!(st, 200);
    let (_, events) = call(
        &hub,
        &doc,
        "get",
        "/api/events",
        "/api/events?after=0",
        None,
    );
    assert!(
        events["events"].as_array().expect("events").len() >= 2,
        "{events}"
    );

    let (st, _) = call(&hub, &doc, "delete", "/api/sessions/{sid}", &s(""), None);
    assert_eq!(st, 200);
    let (st, v) = call(&hub, &doc, "get", "/api/sessions/{sid}", &s(""), None);
    assert_eq!((st, v["error"].as_str()), (404, Some("not_found")));

    let resp = Request::new(Method::Get, &hub.url("/healthz"))
        .send()
        .expect("answer");
    let health: Value = serde_json::from_slice(&resp.body).expect("json");
    check(&doc, "get", "/healthz", resp.status, &health);
}
