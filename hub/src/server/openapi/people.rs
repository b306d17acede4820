//! The operations of what a session asks of people: approvals and questions.

use cortex_protocol::api::{ApprovalList, MessagePosted, PostAnswer, PostCancel};
use serde_json::json;
use utoipa::openapi::HttpMethod;

use super::doc::*;

pub(super) fn people(d: &mut Doc) {
    let body = d.body::<PostAnswer>(
        true,
        json!({"request_id": "apr_5b1c0e2a", "decision": "allow", "always": false}),
    );
    let posted = d.json::<MessagePosted>(
        "Posted: the answer's `seq` in the session's log; the session runs again",
        json!({"seq": 9, "duplicate": false, "runs": true}),
    );
    let duplicate = d.json::<MessagePosted>(
        "The same answer was posted before (a retry: nothing more is counted)",
        json!({"seq": 9, "duplicate": true, "runs": true}),
    );
    let bad = d.error(
        "Not such JSON, an empty `request_id`, or an answer that does not fit what is asked",
        &["bad_request"],
    );
    let missing = d.error(
        "No such session (`not_found`), or nothing waits under `request_id` (`not_pending`: \
         answered, withdrawn by a cancel, or never asked)",
        &["not_found", "not_pending"],
    );
    let conflict = d.error(
        "An answer that decides otherwise than the one that stands (allow after deny, deny \
         after allow, allow after the approval's timeout denied it): the first answer wins, \
         and the message says which it was",
        &["already_answered"],
    );
    d.add(
        HttpMethod::Post,
        "/api/sessions/{sid}/answers",
        Access::Operator,
        op(
            "people",
            "postAnswer",
            "Answer an approval or a question",
            "`request_id` is the `approval.id` of an `approval-required` event (`GET \
             /api/approvals` lists them). An approval takes `decision` (`allow` or `deny`), \
             optionally `always` (allow this tool for the rest of the session) and edited \
             `args`; a question takes `data`.",
        )
        .parameter(sid())
        .request_body(Some(body.build()))
        .response("201", posted)
        .response("200", duplicate)
        .response("400", bad)
        .response("404", missing)
        .response("409", conflict),
    );

    let body = d.body::<PostCancel>(false, json!({"turn_only": true}));
    let accepted = d.json::<cortex_protocol::api::CancelPosted>(
        "The stop is recorded; the turn ends as soon as the runner hears it",
        json!({"seq": 4, "turn_only": true, "running": true}),
    );
    let bad = d.error("Not such JSON", &["bad_request"]);
    let missing = d.error("No such session", &["not_found"]);
    let ended = d.error("The session was cancelled before", &["session_cancelled"]);
    d.add(
        HttpMethod::Post,
        "/api/sessions/{sid}/cancel",
        Access::Operator,
        op(
            "people",
            "cancelSession",
            "Stop a session's turn, or end the session",
            "With `turn_only`, the running turn stops at once (a streaming model call too, its \
             text so far kept); without it the session ends and takes no more messages. The \
             body may be empty.",
        )
        .parameter(sid())
        .request_body(Some(body.build()))
        .response("202", accepted)
        .response("400", bad)
        .response("404", missing)
        .response("409", ended),
    );

    let accepted = d.json::<cortex_protocol::api::CompactPosted>(
        "The ask is recorded; the runner compacts at the session's next boundary",
        json!({"seq": 12}),
    );
    let missing = d.error("No such session", &["not_found"]);
    let refused = d.error(
        "The hub runs no model, the session was cancelled before, or it is a mailbox (no \
         model runs its turns)",
        &["no_model", "session_cancelled", "mailbox"],
    );
    d.add(
        HttpMethod::Post,
        "/api/sessions/{sid}/compact",
        Access::Operator,
        op(
            "people",
            "compactSession",
            "Compact a session's transcript now",
            "The transcript's older part (after the prefix: system, instructions, examples) is \
             summarized by the model and the requests from then on carry the prefix, the \
             summary and the newest messages; the stored transcript stays whole. The runner \
             takes the ask at the session's next boundary (after the step in flight) and \
             records a `compaction` event with `cause: forced`: what it summarized, the \
             prompt tokens before and after, the model call's time and usage, or `error` \
             when there was nothing to compact. No body.",
        )
        .parameter(sid())
        .response("202", accepted)
        .response("404", missing)
        .response("409", refused),
    );

    let list = d.json::<ApprovalList>(
        "What waits on a person, oldest first",
        json!({"approvals": [{"session": "ses_f34c0a6e83ea", "id": "apr_5b1c0e2a",
                              "kind": "approval", "tool": "device_exec", "call_id": "call_1",
                              "args": {"device": "gpu1", "argv": ["nvidia-smi"]},
                              "reason": "policy requireApproval: device_exec",
                              "asked_at": 1796166170000_u64}]}),
    );
    d.add(
        HttpMethod::Get,
        "/api/approvals",
        Access::Operator,
        op(
            "people",
            "listApprovals",
            "What waits on people",
            "Approvals and questions pending across sessions (at most 1,000).",
        )
        .response("200", list),
    );
}
