//! `device_exec` for an MCP client, gated by the hub itself: the hub's policy decides
//! (by default a person is asked). A client that offers elicitation asks its person
//! there; otherwise the call waits on a pending approval in the client's session, shown
//! on the page and by `cortex approvals`, answered there or with `cortex answer`. The
//! call blocks (with progress) at most its bound, then says it still waits: `wait_for`
//! with the request's id goes on waiting, and runs the command once it is allowed. The
//! command runs as the runner runs it (`runner::external`: one exec id per call, so a
//! device starts it once, the hub's `device-exec` event, the pid wait with `wait`).
//! Nothing runs unanswered: a denial, a timeout or no answer starts nothing.

use std::time::Duration;

use cortex_protocol::api::{AnswerItem, Decision, EventBody, PendingRequest};
use rmcp::RoleServer;
use rmcp::model::{ElicitRequestParams, ElicitationAction, ElicitationSchema};
use rmcp::service::Peer;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::answer::{error_result, result};
use crate::model::{FunctionCall, ToolCall};
use crate::runner::external::{self, Outside};
use crate::runner::gate::{self, Gate};
use crate::runner::tools::ExecArgs;
use crate::state::AppState;
use crate::store::StoreError;
use crate::store::agent::{AgentRecord, OpenCall};
use crate::time::now_ms;

/// The tool's name.
pub const TOOL: &str = "device_exec";
/// How long a person has to answer an elicitation.
const ELICIT_FOR: Duration = Duration::from_secs(600);

/// How a call's wait for a person ended.
enum Waited {
    Allowed { call: ToolCall, by: String },
    Denied(String),
    Still(String),
}

/// Runs a `device_exec` call of session `sid`: gated, maybe asked, then run.
pub async fn call(
    state: &AppState,
    sid: &str,
    args: &Value,
    elicit: Option<&Peer<RoleServer>>,
    until: Instant,
    tick: impl FnMut(u64),
) -> rmcp::model::CallToolResult {
    // `timeout_s` bounds this call's wait, not the command: it is not the command's.
    let mut args = args.clone();
    if let Some(o) = args.as_object_mut() {
        o.remove("timeout_s");
    }
    let call = ToolCall {
        id: format!("mcp_{}", crate::secret::random_hex(12)),
        kind: "function".into(),
        function: FunctionCall {
            name: TOOL.into(),
            arguments: args.to_string(),
        },
    };
    let a = match ExecArgs::parse(&call) {
        Ok(a) => a,
        Err(e) => return error_result(&e),
    };
    let policy = match gate::resolve(None, state.agent_defaults.policy.clone()) {
        Ok(p) => p,
        Err(e) => return error_result(&e),
    };
    match gate::gate(&policy, &[], TOOL) {
        Gate::Deny(why) => error_result(&why),
        Gate::Allow => run(state, sid, call, "policy").await,
        Gate::Ask(reason) => match elicit {
            Some(peer) => match ask_client(peer, &a, &reason).await {
                Ok(true) => run(state, sid, call, "person (asked by the MCP client)").await,
                Ok(false) => error_result("the person declined: nothing was started"),
                Err(e) => error_result(&format!(
                    "the client could not ask its person ({e}); nothing was started"
                )),
            },
            None => {
                let expires = policy
                    .approval_timeout_ms
                    .map(|ms| now_ms().saturating_add(ms));
                let req = match park(state, sid, &call, &reason, expires).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(held)) => {
                        return error_result(&format!(
                            "this connection already waits on a person for {held}: call wait_for with id {held} first"
                        ));
                    }
                    Err(e) => {
                        return error_result(&format!(
                            "the hub's store failed: {e}; nothing was started"
                        ));
                    }
                };
                wait(state, sid, &req, until, tick).await
            }
        },
    }
}

/// `wait_for` on a pending approval's id: waits on, and runs the command once allowed.
pub async fn wait(
    state: &AppState,
    sid: &str,
    req: &str,
    until: Instant,
    tick: impl FnMut(u64),
) -> rmcp::model::CallToolResult {
    match answered(state, sid, req, until, tick).await {
        Ok(Waited::Allowed { call, by }) => run(state, sid, call, &by).await,
        Ok(Waited::Denied(why)) => error_result(&why),
        Ok(Waited::Still(text)) => result(
            true,
            Some(text.clone()),
            json!({"id": req, "waiting": true, "state": "waiting_on_person",
                   "note": "still waiting; call wait_for again with this id"}),
        ),
        Err(e) => error_result(&format!("the hub's store failed: {e}; try again")),
    }
}

/// Asks the client's person (elicitation): allowed or not.
async fn ask_client(peer: &Peer<RoleServer>, a: &ExecArgs, reason: &str) -> Result<bool, String> {
    let schema = ElicitationSchema::builder()
        .required_bool("approve")
        .build()
        .map_err(str::to_string)?;
    let message = format!(
        "cortex asks: run {:?} on device {}{}? ({reason})",
        a.argv.join(" "),
        a.device,
        a.cwd
            .as_deref()
            .map(|c| format!(" in {c}"))
            .unwrap_or_default()
    );
    let params = ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: schema,
    };
    let r = peer
        .create_elicitation_with_timeout(params, Some(ELICIT_FOR))
        .await
        .map_err(|e| e.to_string())?;
    Ok(r.action == ElicitationAction::Accept
        && r.content
            .as_ref()
            .and_then(|c| c["approve"].as_bool())
            .unwrap_or(false))
}

/// Parks the call on a person in the session (a mailbox holds one at a time): the
/// request's id, or the one it already waits on.
async fn park(
    state: &AppState,
    sid: &str,
    call: &ToolCall,
    reason: &str,
    expires_at: Option<u64>,
) -> Result<Result<String, String>, StoreError> {
    let (s, call, reason) = (sid.to_string(), call.clone(), reason.to_string());
    state
        .store
        .exec(move |t| {
            let now = now_ms();
            let mut rec = t.agent(&s)?.unwrap_or_else(AgentRecord::mailbox);
            if let Some(p) = &rec.parked {
                return Ok(Err(p.id.clone()));
            }
            let request = PendingRequest {
                id: crate::secret::new_id("req"),
                kind: "approval".into(),
                tool: TOOL.into(),
                call_id: call.id.clone(),
                args: serde_json::from_str(&call.function.arguments).unwrap_or(Value::Null),
                reason,
                questions: Vec::new(),
                asked_at: now,
                expires_at,
            };
            t.append_event(
                &s,
                EventBody::ApprovalRequired {
                    run_id: "mcp".into(),
                    step: 0,
                    approval: request.clone(),
                },
                now,
            )?;
            rec.open = vec![OpenCall {
                call,
                step: 0,
                announced: true,
                allowed: false,
                started: false,
                approved_by: None,
                refused: None,
            }];
            let id = request.id.clone();
            t.park(&s, &mut rec, request)?;
            t.put_agent(&s, &rec)?;
            Ok(Ok(id))
        })
        .await
        .map_err(|e| StoreError::Decode(e.to_string()))
}

/// Waits for the answer to request `req` of `sid`, at most until `until`.
async fn answered(
    state: &AppState,
    sid: &str,
    req: &str,
    until: Instant,
    mut tick: impl FnMut(u64),
) -> Result<Waited, StoreError> {
    let started = Instant::now();
    let mut cursor = 0;
    loop {
        let Some(page) = super::wait::page_after(state, sid, cursor, 512).await? else {
            return Ok(Waited::Denied("this session is gone".into()));
        };
        let (full, mut rx) = (page.full, page.watch);
        cursor = page.last;
        let answer = page.events.into_iter().rev().find_map(|ev| match ev.body {
            EventBody::Answer(a) if a.request_id == req => Some(*a),
            _ => None,
        });
        if let Some(a) = answer {
            return take(state, sid, req, a).await;
        }
        if full {
            continue;
        }
        if Instant::now() >= until {
            return Ok(Waited::Still(format!(
                "still waiting for a person to approve {req} (on the page, or: cortex answer {sid} {req} allow); call wait_for with id {req} to keep waiting: the command starts once it is allowed, never before"
            )));
        }
        tokio::select! {
            _ = rx.changed() => {}
            _ = tokio::time::sleep_until(until.min(Instant::now() + Duration::from_secs(10))) => {
                tick(started.elapsed().as_secs());
            }
            _ = state.shutdown.cancelled() => {
                return Ok(Waited::Still(format!(
                    "the hub is stopping; call wait_for with id {req} to keep waiting for its approval"
                )));
            }
        }
    }
}

/// Takes the answer: the parked call leaves the session in the write that takes it, so
/// one call runs it, once.
async fn take(state: &AppState, sid: &str, req: &str, a: AnswerItem) -> Result<Waited, StoreError> {
    let (s, r) = (sid.to_string(), req.to_string());
    state
        .store
        .exec(move |t| {
            let Some(mut rec) = t.agent(&s)? else {
                return Ok(Waited::Denied("this session is gone".into()));
            };
            let parked = rec.parked.as_ref().is_some_and(|p| p.id == r);
            let call = rec.open.first().map(|o| o.call.clone());
            if !parked {
                return Ok(Waited::Denied(format!(
                    "{r} was answered and taken by an earlier call; its outcome went to that call"
                )));
            }
            t.clear_parked(&s, &mut rec)?;
            rec.open.clear();
            t.put_agent(&s, &rec)?;
            let Some(mut call) = call else {
                return Ok(Waited::Denied(format!("{r} holds no command")));
            };
            Ok(match (a.decision, a.by.as_str()) {
                (Some(Decision::Allow), _) => {
                    if let Some(edited) = &a.args {
                        call.function.arguments = edited.to_string();
                    }
                    Waited::Allowed {
                        call,
                        by: "person".into(),
                    }
                }
                (_, "timeout") => Waited::Denied(format!(
                    "{r} expired unanswered (policy.approvalTimeoutMs): nothing was started"
                )),
                _ => Waited::Denied(format!("a person denied {r}: nothing was started")),
            })
        })
        .await
        .map_err(|e| StoreError::Decode(e.to_string()))
}

/// Runs the allowed call as the runner does and records it.
async fn run(state: &AppState, sid: &str, call: ToolCall, by: &str) -> rmcp::model::CallToolResult {
    let mut stop = state.stops.listen(sid);
    let outside = external::run(state, sid, &call, false, &mut stop).await;
    if let Outside::NotSent = outside {
        return error_result("the session was cancelled first: nothing was started");
    }
    let open = OpenCall {
        call,
        step: 0,
        announced: true,
        allowed: true,
        started: true,
        approved_by: Some(by.to_string()),
        refused: None,
    };
    let s = sid.to_string();
    match state
        .store
        .exec(move |t| external::finish(t, &s, &open, outside, now_ms()))
        .await
    {
        Ok(a) => result(a.ok, None, a.result),
        Err(e) => error_result(&format!(
            "the hub's store failed recording the run: {e}; its state is unknown"
        )),
    }
}
