//! Waits as MCP tasks (the `io.modelcontextprotocol/tasks` extension): a call that
//! answers at once with a task, kept in the store and bound to its caller's token, that
//! completes with its waitpoint's wake. Nothing of a task is held in memory: a task
//! survives a restart, and any hub on a shared store answers for it.

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolResponse, CallToolResult, CreateTaskResult, DetailedTask, GetTaskResult, JsonObject,
    Task, TaskPayload, TaskStatus,
};
use serde_json::{Value, json};

use super::answer::{Caller, error_result, result};
use super::wait::{self, Standing};
use crate::state::AppState;
use crate::store::mcp::{McpTask, TASK_KEPT_MS};
use crate::time::{now_ms, rfc3339};

/// How often a client is asked to poll a working task.
pub const POLL_MS: u64 = 1_000;

/// A task made: its id, record and where its wait stood then.
pub struct Made {
    pub id: String,
    pub task: McpTask,
    pub standing: Standing,
}

/// Makes the task for waitpoint `args.id` of session `sid`, by `tool` (`ttl_ms`: what the
/// client asked to keep it for); an unknown waitpoint, or a refusal, is the call's answer.
pub async fn make(
    state: &AppState,
    caller: &Caller,
    sid: &str,
    tool: &str,
    args: &Value,
    ttl_ms: Option<u64>,
) -> Result<Made, CallToolResult> {
    let Some(id) = args["id"].as_str().filter(|s| !s.trim().is_empty()) else {
        return Err(error_result(
            "wait_for needs \"id\": the waitpoint to wait for",
        ));
    };
    let after = args.get("after_seq").and_then(Value::as_u64);
    let (standing, last) = wait::standing(state, sid, id, after)
        .await
        .map_err(|e| error_result(&format!("the hub's store failed: {e}; try again")))?;
    if standing == Standing::Unknown {
        let (text, value) = standing.answer(id);
        return Err(result(false, Some(text), value));
    }
    let task = McpTask {
        owner: caller.owner,
        session: sid.to_string(),
        waitpoint: id.to_string(),
        tool: tool.to_string(),
        created_at: now_ms(),
        // Still waiting: what it waits for comes after the log's end now.
        after: match (&standing, after) {
            (_, Some(a)) => a,
            (Standing::Waiting { .. }, None) => last,
            _ => 0,
        },
        ttl_ms: ttl_ms.map(|t| t.min(TASK_KEPT_MS)),
        cancelled_at: None,
    };
    let t = task.clone();
    match state.store.exec(move |tx| tx.create_mcp_task(&t)).await {
        Ok(Some(id)) => Ok(Made { id, task, standing }),
        Ok(None) => Err(error_result(
            "this token holds the most tasks it may; let some complete or cancel them",
        )),
        Err(e) => Err(error_result(&format!(
            "the hub's store failed: {e}; try again"
        ))),
    }
}

/// The task for a wait, as the tasks extension answers a call.
pub async fn for_wait(
    state: &AppState,
    caller: &Caller,
    sid: &str,
    tool: &str,
    args: &Value,
) -> CallToolResponse {
    match make(state, caller, sid, tool, args, None).await {
        Ok(m) => {
            let seed = wire(&m.id, &m.task, &m.standing, now_ms()).task;
            CallToolResponse::Task(CreateTaskResult::new(seed))
        }
        Err(r) => r.into(),
    }
}

/// `tasks/get`.
pub async fn get(state: &AppState, caller: &Caller, id: &str) -> Result<GetTaskResult, McpError> {
    let (task, standing) = look(state, caller, id).await?;
    Ok(GetTaskResult::new(wire(id, &task, &standing, now_ms())))
}

/// `tasks/cancel`: the task ends cancelled, and its waitpoint with it while armed.
pub async fn cancel(state: &AppState, caller: &Caller, id: &str) -> Result<(), McpError> {
    let (task, standing) = look(state, caller, id).await?;
    if task.cancelled_at.is_some() || standing.is_final() {
        return Err(McpError::invalid_params(
            format!("task {id} has already ended"),
            None,
        ));
    }
    let (tid, owner) = (id.to_string(), caller.owner);
    state
        .store
        .exec(move |t| {
            let now = now_ms();
            if let Some(mut task) = t.mcp_task(&tid, &owner)? {
                t.cancel_waitpoint(&task.waitpoint, Some(&task.session), "mcp", now)?;
                task.cancelled_at = Some(now);
                t.put_mcp_task(&tid, &task)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| McpError::internal_error(format!("the hub's store failed: {e}"), None))
}

pub async fn look(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<(McpTask, Standing), McpError> {
    let (tid, owner) = (id.to_string(), caller.owner);
    let task = state
        .store
        .read(move |r| r.mcp_task(&tid, &owner))
        .await
        .map_err(|e| McpError::internal_error(format!("the hub's store failed: {e}"), None))?
        .ok_or_else(|| McpError::invalid_params(format!("there is no task {id}"), None))?;
    if task.cancelled_at.is_some() {
        return Ok((
            task,
            Standing::Ended {
                state: "cancelled".into(),
            },
        ));
    }
    let (standing, _) = wait::standing(state, &task.session, &task.waitpoint, Some(task.after))
        .await
        .map_err(|e| McpError::internal_error(format!("the hub's store failed: {e}"), None))?;
    Ok((task, standing))
}

/// The task as the extension shows it, with its result once it has one.
fn wire(id: &str, task: &McpTask, standing: &Standing, now: u64) -> DetailedTask {
    let base = Task::new(
        id,
        TaskStatus::Working,
        rfc3339(task.created_at),
        rfc3339(task.cancelled_at.unwrap_or(now)),
    )
    .with_ttl_ms(TASK_KEPT_MS)
    .with_poll_interval_ms(POLL_MS);
    let payload = match standing {
        Standing::Waiting { state, label } => {
            return DetailedTask::new(
                base.with_status_message(format!(
                    "waiting on {} \"{label}\" ({state})",
                    task.waitpoint
                )),
                TaskPayload::Working,
            );
        }
        Standing::Ended { state } if state == "cancelled" && task.cancelled_at.is_some() => {
            TaskPayload::Cancelled
        }
        Standing::Unknown => TaskPayload::Completed {
            result: object(json!({
                "content": [{"type": "text", "text": format!("waitpoint {} is gone", task.waitpoint)}],
                "structuredContent": {"error": format!("waitpoint {} is gone", task.waitpoint)},
                "isError": true
            })),
        },
        done => {
            let (text, value) = done.answer(&task.waitpoint);
            TaskPayload::Completed {
                result: object(json!({
                    "content": [{"type": "text", "text": text}],
                    "structuredContent": value,
                    "isError": false
                })),
            }
        }
    };
    DetailedTask::new(base, payload)
}

fn object(v: Value) -> JsonObject {
    match v {
        Value::Object(o) => o,
        _ => JsonObject::new(),
    }
}

/// The task as `tasks/get` and `notifications/tasks` show it, as JSON.
pub fn detailed(id: &str, task: &McpTask, standing: &Standing, now: u64) -> Value {
    serde_json::to_value(wire(id, task, standing, now)).unwrap_or(Value::Null)
}

/// Whether the task has ended (completed, failed or cancelled).
pub fn ended(task: &McpTask, standing: &Standing) -> bool {
    task.cancelled_at.is_some() || standing.is_final()
}

/// The task as revision 2025-11-25 shows it (`Task`: `ttl`, `pollInterval`).
pub fn legacy(id: &str, task: &McpTask, standing: &Standing, now: u64) -> Value {
    let d = detailed(id, task, standing, now);
    let mut t = json!({
        "taskId": id,
        "status": d["status"],
        "createdAt": d["createdAt"],
        "lastUpdatedAt": d["lastUpdatedAt"],
        "ttl": task.ttl_ms.unwrap_or(TASK_KEPT_MS),
        "pollInterval": POLL_MS,
    });
    if let Some(m) = d.get("statusMessage").filter(|m| m.is_string()) {
        t["statusMessage"] = m.clone();
    }
    t
}

/// The call's result once the task ended (`tasks/result`), as `CallToolResult`.
pub fn final_result(id: &str, task: &McpTask, standing: &Standing) -> Option<Value> {
    if !ended(task, standing) {
        return None;
    }
    let d = detailed(id, task, standing, now_ms());
    Some(match d.get("result") {
        Some(r) => r.clone(),
        None => json!({
            "content": [{"type": "text", "text": format!("task {id} was cancelled")}],
            "isError": true
        }),
    })
}
