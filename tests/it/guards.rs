//! Guards on what a client or a session may hold in the hub: a delete stops what the
//! session runs, an output schema is compiled once within its budget, and live log
//! followers share one byte budget.

use cortex_cli::http::Method;
use cortex_tests::scripted_model::{Outcome, Reply, ScriptedModel};
use serde_json::json;

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
