//! The operations of waitpoints.

use cortex_protocol::api::{
    ConsumerAdvance, ConsumerPosition, CreateWaitpoint, WaitpointCreated, WaitpointList,
    WaitpointView,
};
use serde_json::json;
use utoipa::openapi::{HttpMethod, ObjectBuilder, Type};

use super::doc::*;
use super::examples::*;

pub(super) fn waitpoints(d: &mut Doc) {
    let body = d.body::<CreateWaitpoint>(
        true,
        json!({"label": "eval", "intent": "read the score", "expires_in_hours": 6}),
    );
    let created = d.json::<WaitpointCreated>(
        "Armed. The only answer that ever shows the secret; `how_to_signal` holds ready lines",
        waitpoint_created_example(),
    );
    let bad = d.error(
        "Not such JSON, or rules that do not fit together (a quorum above the members, …)",
        &["bad_request", "invalid_waitpoint"],
    );
    let missing = d.error(
        "No such session, or `device` names no device the hub knows (a typo, or revoked)",
        &["not_found", "unknown_device"],
    );
    let large = d.error(
        "`label` over 200 characters, `intent` over 4,000, over 256 members or one over 64 \
         characters, `spawn.instructions` over 64 KiB",
        &["too_large"],
    );
    d.add(
        HttpMethod::Post,
        "/api/sessions/{sid}/waitpoints",
        Access::Operator,
        op(
            "waitpoints",
            "createWaitpoint",
            "Arm a waitpoint",
            "A durable \"wake me when this finishes\" for the session. The job reports with \
             the id and secret; see the signal route.",
        )
        .parameter(sid())
        .request_body(Some(body.build()))
        .response("201", created)
        .response("400", bad)
        .response("404", missing)
        .response("413", large),
    );

    let list = d.json::<WaitpointList>(
        "The session's waitpoints, never a secret",
        json!({"waitpoints": [waitpoint_view_example()]}),
    );
    let missing = d.error("No such session", &["not_found"]);
    d.add(
        HttpMethod::Get,
        "/api/sessions/{sid}/waitpoints",
        Access::Operator,
        op(
            "waitpoints",
            "listSessionWaitpoints",
            "A session's waitpoints",
            "What `wait_check` shows an agent.",
        )
        .parameter(sid())
        .response("200", list)
        .response("404", missing),
    );

    let armed = d.json_list::<WaitpointView>(
        "Every armed waitpoint across the sessions, oldest first, never a secret",
        json!([waitpoint_view_example()]),
    );
    let bad = d.error("A `state` other than `armed`", &["bad_request"]);
    d.add(
        HttpMethod::Get,
        "/api/waitpoints",
        Access::Operator,
        op(
            "waitpoints",
            "listArmedWaitpoints",
            "Armed waitpoints, hub-wide",
            "What is still waited on, in every session (`cortex waits`).",
        )
        .parameter(query_param(
            "state",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(["armed"]))
                .build()
                .into(),
            "Which waitpoints: `armed` (the default and only value)",
        ))
        .response("200", armed)
        .response("400", bad),
    );

    let scope = || {
        query_param(
            "session",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .build()
                .into(),
            "Scope to this session (as an agent's `wait_check`/`wait_cancel` does): another \
             session's waitpoint is answered 404",
        )
    };
    let wp = || path_param("id", "The waitpoint's id", "wp_136f3f1391b7");
    let view = d.json::<WaitpointView>("The waitpoint, never its secret", waitpoint_view_example());
    let missing = d.error(
        "No such waitpoint (or not the given session's)",
        &["not_found"],
    );
    d.add(
        HttpMethod::Get,
        "/api/waitpoints/{id}",
        Access::Operator,
        op(
            "waitpoints",
            "getWaitpoint",
            "One waitpoint",
            "Its state, signals (the latest 1,000; `signal_count` counts them all), wakes and \
             badges. A duplicate signal is never a second entry.",
        )
        .parameter(wp())
        .parameter(scope())
        .response("200", view)
        .response("404", missing),
    );

    let cancelled = d.json::<cortex_protocol::api::WaitpointCancelled>(
        "Cancelled now (`cancelled: true`), or it had already ended (`cancelled: false`, \
         `state` how)",
        json!({"id": "wp_136f3f1391b7", "state": "cancelled", "cancelled": true}),
    );
    let missing = d.error(
        "No such waitpoint (or not the given session's)",
        &["not_found"],
    );
    d.add(
        HttpMethod::Delete,
        "/api/waitpoints/{id}",
        Access::Operator,
        op(
            "waitpoints",
            "cancelWaitpoint",
            "Cancel a waitpoint",
            "Ends it without a wake (`waitpoint-cancelled` in the session's log); a later \
             signal is answered 410.",
        )
        .parameter(wp())
        .parameter(scope())
        .response("200", cancelled)
        .response("404", missing),
    );

    let name = || {
        path_param(
            "name",
            "The consumer's name: 1 to 64 letters, digits, `.`, `_` or `-`",
            "deploy-loop",
        )
    };
    let at = |d: &mut Doc| {
        d.json::<ConsumerPosition>(
            "Where the consumer stands: `after` is the session event seq of the last wake it \
             took (0: none yet)",
            json!({"waitpoint": "wp_136f3f1391b7", "consumer": "deploy-loop", "after": 12}),
        )
    };
    let bad = |d: &mut Doc| {
        d.error(
            "A name that is not a consumer's name, or a body not such JSON",
            &["bad_request"],
        )
    };
    let missing = |d: &mut Doc| d.error("No such waitpoint", &["not_found"]);
    let (ok, refused, gone) = (at(d), bad(d), missing(d));
    d.add(
        HttpMethod::Get,
        "/api/waitpoints/{id}/consumers/{name}",
        Access::Operator,
        op(
            "waitpoints",
            "getWaitpointConsumer",
            "A consumer's position",
            "Where a named consumer (`cortex wait for --consumer NAME`) stands in the \
             waitpoint's wakes; a name never used stands at 0.",
        )
        .parameter(wp())
        .parameter(name())
        .response("200", ok)
        .response("400", refused)
        .response("404", gone),
    );
    let body = d.body::<ConsumerAdvance>(true, json!({"after": 12}));
    let (ok, refused, gone) = (at(d), bad(d), missing(d));
    d.add(
        HttpMethod::Put,
        "/api/waitpoints/{id}/consumers/{name}",
        Access::Operator,
        op(
            "waitpoints",
            "advanceWaitpointConsumer",
            "Move a consumer's position",
            "The consumer took the wake at `after`. A position only moves forward: an older \
             `after` leaves it where it stands, and the answer says where that is.",
        )
        .parameter(wp())
        .parameter(name())
        .request_body(Some(body.build()))
        .response("200", ok)
        .response("400", refused)
        .response("404", gone),
    );
}
