//! Tasks pushed, not polled: `subscriptions/listen` naming `notifications.taskIds` (the
//! tasks extension). The answer is an event stream: the acknowledgment naming the tasks
//! honored (the caller's own), each one's state at once (one that ended before the
//! listen is told), then each change as `notifications/tasks` (the task as `tasks/get`
//! shows it, its result inline), and the listen's final result once every task followed
//! has ended, or the hub stops. Nothing is kept but the stream: each look reads the
//! store, so any hub on a shared store serves it, and a restart loses no task (the
//! client listens again). The SDK's subscription filter has no `taskIds`, so this is
//! answered in front of it (`tasks_2025::layer` routes it here).

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, WatchStream};

use super::answer::Caller;
use super::tasks;
use crate::state::AppState;
use crate::store::mcp::McpTask;
use crate::time::now_ms;

/// Tasks one listen may follow.
pub const MAX_TASKS: usize = 100;
/// Listens one token may hold open at once.
pub const MAX_OPEN: usize = 64;
/// A comment line this often keeps a quiet stream open through proxies.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
const TASKS_EXT: &str = "io.modelcontextprotocol/tasks";
const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
const MISSING_CAPABILITY: i64 = -32003;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL: i64 = -32603;

/// Whether `msg` is a listen answered here: one that names tasks.
pub fn wanted(msg: &Value) -> bool {
    msg["method"] == "subscriptions/listen"
        && msg["params"]["notifications"].get("taskIds").is_some()
}

/// A task followed: its id, its record, and what was last told of it.
struct Followed {
    id: String,
    task: McpTask,
    told: Option<(String, Option<String>)>,
    ended: bool,
}

/// The listens open now, by token.
static OPEN: LazyLock<Mutex<HashMap<[u8; 32], usize>>> = LazyLock::new(Default::default);

/// One open listen of a token, counted while it lives.
struct Open([u8; 32]);

impl Open {
    fn take(owner: [u8; 32]) -> Option<Open> {
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(owner).or_default();
        if *n >= MAX_OPEN {
            return None;
        }
        *n += 1;
        Some(Open(owner))
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.0);
            }
        }
    }
}

/// Answers the listen `msg` of `caller`.
pub async fn serve(state: &AppState, caller: Caller, msg: &Value) -> Response {
    let id = msg.get("id").cloned().unwrap_or(Value::Null);
    let declared = msg["params"]["_meta"][CLIENT_CAPABILITIES]["extensions"]
        .get(TASKS_EXT)
        .is_some_and(Value::is_object);
    if !declared {
        return error(
            &id,
            MISSING_CAPABILITY,
            "Missing required client capability: task notifications need the io.modelcontextprotocol/tasks extension",
            Some(json!({"requiredCapabilities": {"extensions": {TASKS_EXT: {}}}})),
        );
    }
    let Some(asked) = msg["params"]["notifications"]["taskIds"]
        .as_array()
        .and_then(|a| a.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
    else {
        return error(
            &id,
            INVALID_PARAMS,
            "notifications.taskIds is a list of task ids",
            None,
        );
    };
    if asked.len() > MAX_TASKS {
        return error(
            &id,
            INVALID_PARAMS,
            &format!(
                "one listen follows at most {MAX_TASKS} tasks; {} were named",
                asked.len()
            ),
            None,
        );
    }
    let Some(open) = Open::take(caller.owner) else {
        return error(
            &id,
            INVALID_PARAMS,
            &format!(
                "this token holds {MAX_OPEN} listens open already; end one, or name several tasks in one"
            ),
            None,
        );
    };
    // Honored: each of the caller's own tasks, once; another's, or none, is left out.
    let mut followed: Vec<Followed> = Vec::new();
    for t in asked {
        if followed.iter().any(|f| f.id == t) {
            continue;
        }
        match tasks::look(state, &caller, t).await {
            Ok((task, _)) => followed.push(Followed {
                id: t.to_string(),
                task,
                told: None,
                ended: false,
            }),
            Err(e) if e.code.0 as i64 == INVALID_PARAMS => {}
            Err(e) => return error(&id, INTERNAL, &e.message, None),
        }
    }
    let honored: Vec<&str> = followed.iter().map(|f| f.id.as_str()).collect();
    let ack = json!({
        "jsonrpc": "2.0",
        "method": "notifications/subscriptions/acknowledged",
        "params": {"notifications": {"taskIds": honored}, "_meta": {SUBSCRIPTION_ID: id}},
    });
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(16);
    // Room for it: the channel is new.
    let _ = tx.try_send(Ok(frame(&ack)));
    let (state, caller) = (state.clone(), caller);
    tokio::spawn(async move {
        follow(state, caller, id, followed, tx).await;
        drop(open);
    });
    let mut r = Response::new(Body::from_stream(ReceiverStream::new(rx)));
    *r.status_mut() = StatusCode::OK;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// Tells each task's state, then each change, until every one ended, the client went
/// away, or the hub stops.
async fn follow(
    state: AppState,
    caller: Caller,
    id: Value,
    mut followed: Vec<Followed>,
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
) {
    loop {
        // Subscribed to each session before the look: a change after it is seen.
        let sessions: Vec<String> = {
            let mut s: Vec<String> = followed
                .iter()
                .filter(|f| !f.ended)
                .map(|f| f.task.session.clone())
                .collect();
            s.sort();
            s.dedup();
            s
        };
        let seqs = {
            let s = sessions.clone();
            state
                .store
                .read(move |r| {
                    s.iter()
                        .map(|sid| Ok(r.get_session(sid)?.map_or(0, |x| x.last_seq)))
                        .collect::<Result<Vec<u64>, _>>()
                })
                .await
        };
        let Ok(seqs) = seqs else {
            // The store failed: the client listens again, and loses nothing by it.
            return;
        };
        let mut watches: BTreeMap<usize, _> = BTreeMap::new();
        for (i, (sid, seq)) in sessions.iter().zip(seqs).enumerate() {
            watches.insert(
                i,
                WatchStream::from_changes(state.store.notifier.subscribe(sid, seq)),
            );
        }
        for f in followed.iter_mut().filter(|f| !f.ended) {
            let (task, standing) = match tasks::look(&state, &caller, &f.id).await {
                Ok(l) => l,
                // Gone (its time ran out): nothing more will be told of it.
                Err(e) if e.code.0 as i64 == INVALID_PARAMS => {
                    f.ended = true;
                    continue;
                }
                Err(_) => return,
            };
            let mut note = tasks::detailed(&f.id, &task, &standing, now_ms());
            let now = (
                note["status"].as_str().unwrap_or("").to_string(),
                note["statusMessage"].as_str().map(str::to_string),
            );
            f.ended = tasks::ended(&task, &standing);
            f.task = task;
            if f.told.as_ref() == Some(&now) {
                continue;
            }
            f.told = Some(now);
            note["_meta"] = json!({SUBSCRIPTION_ID: id});
            let n = json!({"jsonrpc": "2.0", "method": "notifications/tasks", "params": note});
            if tx.send(Ok(frame(&n))).await.is_err() {
                return;
            }
        }
        if followed.iter().all(|f| f.ended) {
            break;
        }
        let mut changed = tokio_stream::StreamMap::new();
        for (i, w) in watches {
            changed.insert(i, w);
        }
        loop {
            tokio::select! {
                _ = changed.next() => break,
                _ = tokio::time::sleep(KEEP_ALIVE) => {
                    if tx.send(Ok(Bytes::from_static(b": keep-alive\n\n"))).await.is_err() {
                        return;
                    }
                }
                _ = tx.closed() => return,
                _ = state.shutdown.cancelled() => {
                    let _ = tx.send(Ok(frame(&done(&id)))).await;
                    return;
                }
            }
        }
    }
    let _ = tx.send(Ok(frame(&done(&id)))).await;
}

/// The listen's final result: the server ended it.
fn done(id: &Value) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "result": {"resultType": "complete", "_meta": {SUBSCRIPTION_ID: id}},
    })
}

fn frame(v: &Value) -> Bytes {
    Bytes::from(format!("event: message\ndata: {v}\n\n"))
}

fn error(id: &Value, code: i64, message: &str, data: Option<Value>) -> Response {
    let mut e = json!({"code": code, "message": message});
    if let Some(d) = data {
        e["data"] = d;
    }
    (
        StatusCode::OK,
        axum::Json(json!({"jsonrpc": "2.0", "id": id, "error": e})),
    )
        .into_response()
}
