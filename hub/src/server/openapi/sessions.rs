//! The operations of sessions, their messages and their event logs.

use cortex_protocol::api::{
    CreateSession, EventsPage, MessagePosted, PostMessage, SessionResult, SessionView,
};
use serde_json::json;
use utoipa::openapi::HttpMethod;

use super::doc::*;
use super::examples::*;

pub(super) fn sessions(d: &mut Doc) {
    let created = d.json::<SessionView>("The session", session_example());
    let body = d.body::<CreateSession>(
        false,
        json!({"title": "nightly eval", "instructions": "You watch training jobs.",
               "policy": {"requireApproval": ["device_exec"]}, "stop": {"steps": 10}}),
    );
    let bad = d.error(
        "Not such JSON, or a runner setting the hub cannot use (an output schema that does not \
         compile, …); `schema_too_complex`: the output schema expands to more than 20,000 \
         subschemas once its `$ref`s are followed, or nests deeper than 128 levels; \
         `schema_compile_timeout`: it did not compile within `limits.schemaCompileMs`",
        &[
            "bad_request",
            "schema_too_complex",
            "schema_compile_timeout",
        ],
    );
    let busy = d.error(
        "Another output schema still compiles past its budget (one compiles at a time); ask again",
        &["schema_compile_busy"],
    );
    let large = d.error(
        "`title` over 200 characters or `instructions` over 64 KiB, or a body over 1 MiB",
        &["too_large"],
    );
    d.add(
        HttpMethod::Post,
        "/api/sessions",
        Access::Operator,
        op(
            "sessions",
            "createSession",
            "Create a session",
            "Every field is optional, and so is the body. `instructions`, `examples`, \
             `maxTokens`, `stop`, `policy`, `unattended` and `output` configure the hub's agent \
             loop for the session (the hub's defaults, settings.json `agent`, fill the rest); \
             any of them makes an agent session, whose messages and wakes a model answers. \
             Without any (or with `runs: false`) it is a mailbox: messages and wakes are \
             recorded for a script and no turn runs. `runs: true` makes an agent session on \
             the defaults alone.",
        )
        .request_body(Some(body.build()))
        .response("201", created)
        .response("400", bad)
        .response("413", large)
        .response("503", busy),
    );

    let list = d.json_list::<SessionView>("Every session", json!([session_example()]));
    d.add(
        HttpMethod::Get,
        "/api/sessions",
        Access::Operator,
        op(
            "sessions",
            "listSessions",
            "List the sessions",
            "Every session, oldest first, with `runs` (an agent session or a mailbox) and \
             its `state`.",
        )
        .response("200", list),
    );

    let one = d.json::<SessionView>("The session", session_with_config_example());
    let missing = d.error("No such session", &["not_found"]);
    d.add(
        HttpMethod::Get,
        "/api/sessions/{sid}",
        Access::Operator,
        op(
            "sessions",
            "getSession",
            "One session",
            "One session, with its `state` and, for an agent session, its `config` (the \
             instructions, worked example, bounds, policy and the tools it is shown; never a \
             secret).",
        )
        .parameter(sid())
        .response("200", one)
        .response("404", missing),
    );

    let deleted = d.json::<cortex_protocol::api::SessionDeleted>(
        "The session is gone",
        json!({"id": "ses_f34c0a6e83ea", "deleted": true}),
    );
    let missing = d.error("No such session", &["not_found"]);
    d.add(
        HttpMethod::Delete,
        "/api/sessions/{sid}",
        Access::Operator,
        op(
            "sessions",
            "deleteSession",
            "Delete a session",
            "Deletes the session and its log, and cancels its armed waitpoints.",
        )
        .parameter(sid())
        .response("200", deleted)
        .response("404", missing),
    );

    let result = d.json::<SessionResult>(
        "The last run's result and meta",
        json!({"run_id": "run_1", "result": {"ok": true, "output": {"response": "The eval scored 0.91."}},
               "meta": {"usage": {"prompt_tokens": 812, "completion_tokens": 40, "total_tokens": 852},
                        "strategy": "emit", "steps": 2, "outputRetries": 0, "elapsedMs": 2310}}),
    );
    let missing = d.error(
        "No such session (`not_found`), or no run of it has finished yet (`no_result`)",
        &["not_found", "no_result"],
    );
    d.add(
        HttpMethod::Get,
        "/api/sessions/{sid}/result",
        Access::Operator,
        op(
            "people",
            "getSessionResult",
            "The last run's result",
            "The `result` and `meta` of the session's last finished run (its `run-end` event).",
        )
        .parameter(sid())
        .response("200", result)
        .response("404", missing),
    );
}

pub(super) fn messages_and_events(d: &mut Doc) {
    let body = d.body::<PostMessage>(
        true,
        json!({"text": "check the eval when it ends", "when": "next_turn",
               "dedupe_key": "eval-42"}),
    );
    let posted = d.json::<MessagePosted>(
        "Posted: its `seq` in the session's log",
        json!({"seq": 1, "duplicate": false, "runs": true}),
    );
    let duplicate = d.json::<MessagePosted>(
        "`dedupe_key` matched an earlier post: nothing was posted, `seq` is that post's",
        json!({"seq": 1, "duplicate": true, "runs": true}),
    );
    let bad = d.error("Not such JSON, or `text` is empty", &["bad_request"]);
    let missing = d.error("No such session", &["not_found"]);
    let cancelled = d.error(
        "The session was cancelled; it takes no more messages",
        &["session_cancelled"],
    );
    let large = d.error(
        "`text` over 64 KiB or `dedupe_key` over 200 characters",
        &["too_large"],
    );
    d.add(
        HttpMethod::Post,
        "/api/sessions/{sid}/messages",
        Access::Operator,
        op(
            "messages",
            "postMessage",
            "Post a message to a session",
            "An inbox item: a `message` event in the session's log. With a model configured, \
             an idle session runs a turn for it; `when: now` also joins a running turn at its \
             next step. `runs` says whether the hub runs a model at all.",
        )
        .parameter(sid())
        .request_body(Some(body.build()))
        .response("201", posted)
        .response("200", duplicate)
        .response("400", bad)
        .response("404", missing)
        .response("409", cancelled)
        .response("413", large),
    );

    let page = d.schema::<EventsPage>();
    let missing = d.error("No such session", &["not_found"]);
    let bad = d.error("`after` or `wait` is not a number", &["bad_request"]);
    d.add(
        HttpMethod::Get,
        "/api/sessions/{sid}/events",
        Access::Operator,
        log_params(op(
            "events",
            "getSessionEvents",
            "A session's events: a page, a long poll, or SSE",
            "The session's log: messages, wakes (`kind: wake`, what an agent waits for), \
             waitpoints armed and cancelled, and the runner's events (`run-start` … `run-end`).",
        ))
        .parameter(sid())
        .response("200", log_ok(page, events_example()))
        .response("400", bad)
        .response("404", missing),
    );

    let page = d.schema::<cortex_protocol::api::HubEventsPage>();
    let bad = d.error("`after` or `wait` is not a number", &["bad_request"]);
    d.add(
        HttpMethod::Get,
        "/api/events",
        Access::Operator,
        log_params(op(
            "events",
            "getHubEvents",
            "The hub's events: a page, a long poll, or SSE",
            "The hub's own log: devices added, revoked, online and offline, and commands \
             started on devices.",
        ))
        .response(
            "200",
            log_ok(
                page,
                json!({"events": [{"seq": 1, "ts": 1796166169393_u64, "kind": "device-added",
                                   "device": "gpu1"}]}),
            ),
        )
        .response("400", bad),
    );
}
