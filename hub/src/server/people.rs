//! What a person does to a session's agent: answer what it waits on (an approval or a
//! question), stop its turn or end it, and see what waits on people across sessions.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use cortex_protocol::api::{self, ApprovalList, Decision, PendingView, PostAnswer, PostCancel};

use super::error::{ApiError, parse_json};
use crate::state::AppState;
use crate::store::posts::{AnswerOutcome, CancelPosted};
use crate::time::now_ms;

/// Pending requests listed at most.
const LIST_LIMIT: usize = 1_000;

/// `POST /api/sessions/{sid}/answers`: allow or deny an approval (optionally `always`,
/// optionally with edited `args`), or answer a question with `data`. 404 for an id
/// nothing waits under.
pub async fn answer(
    State(state): State<AppState>,
    Path(sid): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: PostAnswer = parse_json(&body)?;
    if req.request_id.trim().is_empty() {
        return Err(ApiError::bad_request(
            "request_id is empty; it is the id of the approval-required event (cortex approvals lists them)",
        ));
    }
    let id = req.request_id.clone();
    let s = sid.clone();
    let outcome = state
        .store
        .exec(move |t| t.post_answer(&s, req, now_ms()))
        .await
        .map_err(ApiError::store)?;
    match outcome {
        AnswerOutcome::Posted(p) if p.duplicate => Ok((StatusCode::OK, Json(p)).into_response()),
        AnswerOutcome::Posted(p) => Ok((StatusCode::CREATED, Json(p)).into_response()),
        AnswerOutcome::NoSession => Err(ApiError::not_found("session", &sid)),
        AnswerOutcome::NotPending => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_pending",
            format!(
                "session {sid} waits on nothing under {id}: it was answered, withdrawn by a cancel, or never asked (cortex approvals lists what waits)"
            ),
        )),
        AnswerOutcome::Invalid(why) => Err(ApiError::bad_request(why)),
        AnswerOutcome::Conflict { decision, by, seq } => {
            let stands = match decision {
                Some(Decision::Allow) => "allow",
                Some(Decision::Deny) => "deny",
                None => "an answer",
            };
            let who = if by == "timeout" {
                "the approval's timeout".to_string()
            } else {
                format!("a {by}")
            };
            Err(ApiError::new(
                StatusCode::CONFLICT,
                "already_answered",
                format!(
                    "{id} was already answered {stands} by {who} (event {seq}); the first answer stands and this one is not counted"
                ),
            ))
        }
    }
}

/// `POST /api/sessions/{sid}/cancel` `{turn_only?}`: stops the running turn at once
/// (with `turn_only`), or ends the session. 202: the stop is recorded; the turn ends
/// as soon as the runner hears it.
pub async fn cancel(
    State(state): State<AppState>,
    Path(sid): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: PostCancel = if body.iter().all(u8::is_ascii_whitespace) {
        PostCancel::default()
    } else {
        parse_json(&body)?
    };
    let s = sid.clone();
    let turn_only = req.turn_only;
    let me = state.claims.hub.clone();
    let (outcome, elsewhere) = state
        .store
        .exec(move |t| {
            let now = now_ms();
            let posted = t.post_cancel(&s, turn_only, now)?;
            // Driven by another hub now: its claim is live.
            let elsewhere = t.claim(&s)?.is_some_and(|c| c.hub != me && c.until > now);
            Ok((posted, elsewhere))
        })
        .await
        .map_err(ApiError::store)?;
    match outcome {
        CancelPosted::Posted(p) => {
            // The write raised the session's stop notice: its driver, on this hub or
            // another, hears it after the item is durable and finds it.
            let running = elsewhere || state.stops.driving(&sid);
            Ok((
                StatusCode::ACCEPTED,
                Json(api::CancelPosted {
                    seq: p.seq,
                    turn_only,
                    running,
                }),
            )
                .into_response())
        }
        CancelPosted::NoSession => Err(ApiError::not_found("session", &sid)),
        CancelPosted::Ended => Err(ApiError::new(
            StatusCode::CONFLICT,
            "session_cancelled",
            format!("session {sid} was cancelled before; it runs no more turns"),
        )),
        // Not an answer of post_cancel: a cancel goes to any session.
        CancelPosted::Mailbox => Err(ApiError::not_found("session", &sid)),
    }
}

/// `POST /api/sessions/{sid}/compact`: compacts the session's transcript now (its older
/// part summarized by the model; the prefix and the newest messages kept). 202: the ask
/// is recorded; the runner takes it at the session's next boundary and records a
/// `compaction` event (`cause: forced`). 409 when the hub runs no model, the session
/// was cancelled, or it is a mailbox (no model runs its turns).
pub async fn compact(
    State(state): State<AppState>,
    Path(sid): Path<String>,
) -> Result<Response, ApiError> {
    if !state.runs_model {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "no_model",
            "this hub runs no model, so nothing can summarize the transcript (set llm.baseUrl and llm.model, docs/agent.md)",
        ));
    }
    let s = sid.clone();
    let outcome = state
        .store
        .exec(move |t| t.post_compact(&s, now_ms()))
        .await
        .map_err(ApiError::store)?;
    match outcome {
        CancelPosted::Posted(p) => Ok((
            StatusCode::ACCEPTED,
            Json(api::CompactPosted { seq: p.seq }),
        )
            .into_response()),
        CancelPosted::NoSession => Err(ApiError::not_found("session", &sid)),
        CancelPosted::Ended => Err(ApiError::new(
            StatusCode::CONFLICT,
            "session_cancelled",
            format!("session {sid} was cancelled before; it runs no more turns"),
        )),
        CancelPosted::Mailbox => Err(ApiError::new(
            StatusCode::CONFLICT,
            "mailbox",
            format!(
                "session {sid} runs no model turns (a mailbox): it has no transcript to compact"
            ),
        )),
    }
}

/// `GET /api/approvals`: what waits on a person (approvals and questions) across
/// sessions, oldest first.
pub async fn approvals(State(state): State<AppState>) -> Result<Response, ApiError> {
    let list = state
        .store
        .read(|r| r.pending_requests(LIST_LIMIT))
        .await
        .map_err(ApiError::store)?;
    let approvals = list
        .into_iter()
        .map(|(session, request)| PendingView { session, request })
        .collect();
    Ok(Json(ApprovalList { approvals }).into_response())
}
