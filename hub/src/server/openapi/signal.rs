//! The operations of the signal route and the operator's routes.

use cortex_protocol::api::Health;
use cortex_protocol::signal::{MAX_BODY_BYTES, SignalAccepted, SignalRequest};
use serde_json::json;
use utoipa::openapi::{ContentBuilder, HttpMethod, ObjectBuilder, ResponseBuilder, Type};

use super::doc::*;

pub(super) fn signal(d: &mut Doc) {
    let body = d.body::<SignalRequest>(
        true,
        json!({"id": "wp_136f3f1391b7",
               "secret": "a432420df037dd185c0f72554030a2a605adb6ad0a129c432956c8eb505564f4",
               "status": "ok", "message": "score 0.91", "key": "eval-42"}),
    );
    let accepted = d.json::<SignalAccepted>(
        "On disk: `result` is `accepted`, or `duplicate` for a `key` seen before (counted \
         once); `state` is the waitpoint's after it",
        json!({"result": "accepted", "waitpoint": "wp_136f3f1391b7", "state": "resolved"}),
    );
    let bad = d.error("Not JSON of the signal's shape", &["bad_request"]);
    let secret = d.error("The secret does not match the waitpoint", &["wrong_secret"]);
    let unknown = d.error(
        "No such waitpoint (a typo, or one resolved more than 3 days ago)",
        &["unknown_waitpoint"],
    );
    let gone = d.error(
        "The waitpoint no longer counts signals: resolved (`already_resolved`), past its \
         expiry (`expired`: the signal came too late) or cancelled (`cancelled`); not an \
         error for the job",
        &["already_resolved", "expired", "cancelled"],
    );
    let large = d.error(
        &format!(
            "A body over {MAX_BODY_BYTES} bytes, `message` over 2,000 characters, `data` over \
             16,000, or `id`, `secret`, `member` or `key` over 200"
        ),
        &["too_large"],
    );
    let member = d.error(
        "A waitpoint with members needs `member`, one of them; `members` lists them",
        &["bad_member"],
    );
    let budget = d.error(
        "More than 60 unknown ids or wrong secrets in the last minute",
        &["miss_budget_spent"],
    );
    let unavailable = d.error(
        "The hub could not write to its store; nothing was recorded, retry (cortex-signal \
         spools the signal by itself)",
        &["store_unavailable"],
    );
    d.add(
        HttpMethod::Post,
        "/webhook/signal",
        Access::Open,
        op(
            "signal",
            "signal",
            "Signal a waitpoint",
            "What a job calls (`cortex-signal` does). No operator token: the waitpoint's \
             secret is the capability. `status` is `ok` (default), `fail` or `progress` (a \
             heartbeat: recorded, never wakes); `member` names the reporter of a waitpoint \
             with members. A 202 means the signal is on disk.",
        )
        .request_body(Some(body.build()))
        .response("202", accepted)
        .response("400", bad)
        .response("401", secret)
        .response("404", unknown)
        .response("410", gone)
        .response("413", large)
        .response("422", member)
        .response("429", budget)
        .response("503", unavailable),
    );
}

pub(super) fn operators(d: &mut Doc) {
    let ok = d.json::<Health>("The hub is up", json!({"ok": true}));
    d.add(
        HttpMethod::Get,
        "/healthz",
        Access::Open,
        op(
            "operators",
            "health",
            "Health",
            "200 while the hub serves; no token.",
        )
        .response("200", ok),
    );
    d.add(
        HttpMethod::Get,
        "/metrics",
        Access::Open,
        op(
            "operators",
            "metrics",
            "Metrics",
            "The hub's counters and gauges in Prometheus' text format, for a scraper on the \
             hub's machine.",
        )
        .response(
            "200",
            text_response("Prometheus text format", "text/plain; version=0.0.4"),
        ),
    );
    let doc = ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some("An OpenAPI 3.1 document"))
        .build();
    d.add(
        HttpMethod::Get,
        "/api/openapi.json",
        Access::Operator,
        op(
            "operators",
            "openapi",
            "This document",
            "The API as an OpenAPI 3.1 document, behind the operator token like the rest of \
             `/api` (a generator fetches it with `Authorization: Bearer …`).",
        )
        .response(
            "200",
            ResponseBuilder::new().description("The document").content(
                "application/json",
                ContentBuilder::new().schema(Some(doc)).build(),
            ),
        ),
    );
}
