//! Tasks as revision 2025-11-25 has them, for its clients (the TypeScript SDK's
//! `callToolStream`): the server declares `capabilities.tasks`, a tool says
//! `execution.taskSupport`, a `tools/call` carrying `task` answers `{task}` at once, and
//! `tasks/get`, `tasks/result`, `tasks/list`, `tasks/cancel` follow. The SDK serves only
//! the tasks extension (2026-07-28), and its types carry neither field, so this layer in
//! front of it answers these methods itself, over the same stored tasks, and adds the
//! two declarations to the handshake's and `tools/list`'s answers. A `subscriptions/listen`
//! naming tasks goes to `listen.rs`. Every other message, and every message of another
//! revision, passes through untouched.

use std::time::Duration;

use axum::body::{Body, Bytes, to_bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::answer::{self, Caller};
use super::calls;
use super::listen;
use super::tasks;
use super::wait;
use crate::state::AppState;
use crate::store::mcp::connection_key;
use crate::time::now_ms;

/// The revision served here.
const REVISION: &str = "2025-11-25";
/// A request body read here at most (the SDK's own bound is larger; a tool call's
/// arguments are far below it).
const MAX_BODY: usize = 4 * 1024 * 1024;
/// `tasks/list` pages.
const PAGE: usize = 100;

/// The middleware (inside the guard, which set the [`Caller`]).
pub async fn layer(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if req.method() != axum::http::Method::POST {
        return next.run(req).await;
    }
    let stated = req
        .headers()
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let (parts, body) = req.into_parts();
    let bytes = match to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                "an MCP message of more than 4 MiB",
            )
                .into_response();
        }
    };
    let msg: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let method = msg["method"].as_str().unwrap_or("").to_string();
    let caller = parts.extensions.get::<Caller>().cloned();
    let session_id = parts
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let pass = |parts, bytes: Bytes| Request::from_parts(parts, Body::from(bytes));

    if method == "initialize" {
        let asked = msg["params"]["protocolVersion"].as_str() == Some(REVISION);
        let r = next.run(pass(parts, bytes)).await;
        return if asked {
            rewrite(r, declare_tasks).await
        } else {
            r
        };
    }
    let legacy = stated.as_deref().is_some_and(|v| v.starts_with("2025-"));
    if !legacy
        && listen::wanted(&msg)
        && let Some(caller) = caller.clone()
    {
        return listen::serve(&state, caller, &msg).await;
    }
    if stated.as_deref() != Some(REVISION) {
        return next.run(pass(parts, bytes)).await;
    }
    let (Some(caller), Some(id)) = (caller, msg.get("id").cloned()) else {
        return next.run(pass(parts, bytes)).await;
    };
    match method.as_str() {
        "tools/list" => rewrite(next.run(pass(parts, bytes)).await, declare_execution).await,
        "tools/call" if msg["params"].get("task").is_some() => {
            let tool = msg["params"]["name"].as_str().unwrap_or("");
            if tool != calls::WAIT_FOR && !calls::is_remote_wait(tool) {
                return next.run(pass(parts, bytes)).await;
            }
            let Some(client) = known(&state, session_id.as_deref()).await else {
                return gone();
            };
            reply(
                &id,
                call(
                    &state,
                    &caller,
                    session_id.as_deref(),
                    client,
                    &msg["params"],
                )
                .await,
            )
        }
        "tasks/get" | "tasks/result" | "tasks/cancel" | "tasks/list" => {
            if known(&state, session_id.as_deref()).await.is_none() {
                return gone();
            }
            let r = match method.as_str() {
                "tasks/get" => get(&state, &caller, &msg["params"]).await,
                "tasks/result" => result(&state, &caller, &msg["params"]).await,
                "tasks/cancel" => cancel(&state, &caller, &msg["params"]).await,
                _ => list(&state, &caller, &msg["params"]).await,
            };
            reply(&id, r)
        }
        _ => next.run(pass(parts, bytes)).await,
    }
}

/// A connection with a handshake behind it: its client's name, for its session's title.
async fn known(state: &AppState, session_id: Option<&str>) -> Option<Option<String>> {
    let key = connection_key(session_id?);
    let c = state
        .store
        .read(move |r| r.mcp_connection(&key))
        .await
        .ok()??;
    let init: Value = serde_json::from_str(&c.init).ok()?;
    Some(
        init["initialize_params"]["clientInfo"]["name"]
            .as_str()
            .map(str::to_string),
    )
}

fn gone() -> Response {
    (StatusCode::NOT_FOUND, "Session not found").into_response()
}

fn reply(id: &Value, r: Result<Value, (i64, String)>) -> Response {
    let body = match r {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, message)) => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        }
    };
    (StatusCode::OK, axum::Json(body)).into_response()
}

const INVALID_PARAMS: i64 = -32602;
const INTERNAL: i64 = -32603;

fn store_failed(e: impl std::fmt::Display) -> (i64, String) {
    (INTERNAL, format!("the hub's store failed: {e}"))
}

/// A wait called as a task: the remote wait is armed (its answer names the waitpoint),
/// then the task made on it: `{task}`. A call refused makes no task: a task-augmented
/// request is answered with a task or an error, so the refusal is the error's message.
async fn call(
    state: &AppState,
    caller: &Caller,
    session_id: Option<&str>,
    client: Option<String>,
    params: &Value,
) -> Result<Value, (i64, String)> {
    let tool = params["name"].as_str().unwrap_or("");
    let args = match params.get("arguments") {
        Some(a @ Value::Object(_)) => a.clone(),
        _ => json!({}),
    };
    let ttl = params["task"]["ttl"].as_u64();
    let (key, title) = answer::connection(caller, session_id, client.as_deref());
    let sid = answer::session_of(state, &key, caller.owner, &title)
        .await
        .map_err(refused)?;
    let waited = if tool == calls::WAIT_FOR {
        args
    } else {
        let a = calls::run(state, &sid, tool, &args).await;
        match (a.ok, calls::waitpoint_of(&a.value)) {
            (true, Some(wp)) => json!({"id": wp}),
            _ => return Err(refused(answer::result(a.ok, None, a.value))),
        }
    };
    let m = tasks::make(state, caller, &sid, tool, &waited, ttl)
        .await
        .map_err(refused)?;
    Ok(json!({"task": tasks::legacy(&m.id, &m.task, &m.standing, now_ms())}))
}

/// A refused call as a JSON-RPC error: its message is the call's answer's text.
fn refused(r: rmcp::model::CallToolResult) -> (i64, String) {
    let text = r
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("");
    (INVALID_PARAMS, text)
}

fn task_id(params: &Value) -> Result<&str, (i64, String)> {
    params["taskId"]
        .as_str()
        .filter(|s| !s.is_empty())
        .ok_or((INVALID_PARAMS, "taskId is missing".to_string()))
}

async fn get(state: &AppState, caller: &Caller, params: &Value) -> Result<Value, (i64, String)> {
    let id = task_id(params)?;
    let (task, standing) = tasks::look(state, caller, id)
        .await
        .map_err(|e| (e.code.0 as i64, e.message.to_string()))?;
    Ok(tasks::legacy(id, &task, &standing, now_ms()))
}

/// `tasks/result`: the call's result once the task ended; it waits for the end at most
/// [`calls::BLOCK_MAX_S`], then says to poll `tasks/get`.
async fn result(state: &AppState, caller: &Caller, params: &Value) -> Result<Value, (i64, String)> {
    let id = task_id(params)?;
    let until = Instant::now() + Duration::from_secs(calls::BLOCK_MAX_S);
    loop {
        let (task, standing) = tasks::look(state, caller, id)
            .await
            .map_err(|e| (e.code.0 as i64, e.message.to_string()))?;
        if let Some(mut r) = tasks::final_result(id, &task, &standing) {
            r["_meta"] = json!({"io.modelcontextprotocol/related-task": {"taskId": id}});
            return Ok(r);
        }
        if Instant::now() >= until {
            return Err((
                INTERNAL,
                format!(
                    "task {id} is still working; poll tasks/get and ask for its result once it completed"
                ),
            ));
        }
        wait::until_final(
            state,
            &task.session,
            &task.waitpoint,
            Some(task.after),
            until,
            Duration::from_secs(3600),
            |_| {},
        )
        .await
        .map_err(store_failed)?;
    }
}

async fn cancel(state: &AppState, caller: &Caller, params: &Value) -> Result<Value, (i64, String)> {
    let id = task_id(params)?;
    tasks::cancel(state, caller, id)
        .await
        .map_err(|e| (e.code.0 as i64, e.message.to_string()))?;
    get(state, caller, params).await
}

/// `tasks/list`: the caller's tasks, oldest first, a page at a time (`cursor`: the last
/// id of the page before).
async fn list(state: &AppState, caller: &Caller, params: &Value) -> Result<Value, (i64, String)> {
    let owner = caller.owner;
    let all = state
        .store
        .read(move |r| r.mcp_tasks_of(&owner))
        .await
        .map_err(store_failed)?;
    let from = match params["cursor"].as_str() {
        Some(c) => match all.iter().position(|(id, _)| id == c) {
            Some(i) => i + 1,
            None => return Err((INVALID_PARAMS, format!("cursor {c:?} is not a task id"))),
        },
        None => 0,
    };
    let mut out = Vec::new();
    for (id, _) in all.iter().skip(from).take(PAGE) {
        let (task, standing) = tasks::look(state, caller, id)
            .await
            .map_err(|e| (e.code.0 as i64, e.message.to_string()))?;
        out.push(tasks::legacy(id, &task, &standing, now_ms()));
    }
    let next = (from + PAGE < all.len()).then(|| all[from + PAGE - 1].0.clone());
    let mut r = json!({"tasks": out});
    if let Some(n) = next {
        r["nextCursor"] = json!(n);
    }
    Ok(r)
}

/// The handshake's answer declares what this layer serves.
fn declare_tasks(v: &mut Value) {
    if v["result"]["protocolVersion"] == REVISION
        && let Some(caps) = v["result"]["capabilities"].as_object_mut()
    {
        caps.insert(
            "tasks".into(),
            json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}),
        );
    }
}

/// `tools/list`'s answer says which tools may be called as tasks.
fn declare_execution(v: &mut Value) {
    if let Some(tools) = v["result"]["tools"].as_array_mut() {
        for t in tools {
            let name = t["name"].as_str().unwrap_or("");
            if name == calls::WAIT_FOR || calls::is_remote_wait(name) {
                t["execution"] = json!({"taskSupport": "optional"});
            }
        }
    }
}

/// The SDK's answer (one JSON body, or an event stream that ends after it) with `edit`
/// applied to each JSON-RPC response in it.
async fn rewrite(r: Response, edit: fn(&mut Value)) -> Response {
    if r.status() != StatusCode::OK {
        return r;
    }
    let (mut parts, body) = r.into_parts();
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    let Ok(bytes) = to_bytes(body, 16 * MAX_BODY).await else {
        return (StatusCode::BAD_GATEWAY, "the MCP answer could not be read").into_response();
    };
    let text = String::from_utf8_lossy(&bytes);
    let out = if sse {
        text.split('\n')
            .map(|line| match line.strip_prefix("data: ") {
                Some(data) => match serde_json::from_str::<Value>(data) {
                    Ok(mut v) if v.get("result").is_some() => {
                        edit(&mut v);
                        format!("data: {v}")
                    }
                    _ => line.to_string(),
                },
                None => line.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        match serde_json::from_str::<Value>(&text) {
            Ok(mut v) => {
                edit(&mut v);
                v.to_string()
            }
            Err(_) => text.into_owned(),
        }
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    if let Ok(len) = HeaderValue::from_str(&out.len().to_string()) {
        parts.headers.insert(header::CONTENT_LENGTH, len);
    }
    Response::from_parts(parts, Body::from(out))
}
