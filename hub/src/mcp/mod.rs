//! The hub as an MCP server: streamable HTTP at `/mcp` on the hub's (loopback) listener,
//! over the official Rust SDK (`rmcp`); `cortex mcp` bridges stdio to it. A client is an
//! outside agent: its connection is bound to its token and to a cortex session (a
//! mailbox) its waits are armed in; its waits can be MCP tasks, kept in the store.
//!
//! `calls.rs`: the tools and how a call runs; `wait.rs`: where a wait stands;
//! `tasks.rs`: tasks; `listen.rs`: tasks pushed; `connections.rs`: connections kept in the store;
//! `answer.rs`: who calls, and a call's answer.

mod answer;
mod calls;
mod channel;
mod connections;
mod exec;
mod listen;
mod tasks;
mod tasks_2025;
mod wait;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, GetTaskParams,
    GetTaskResult, Implementation, InitializeResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ProtocolVersion, ServerCapabilities, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio::time::Instant;

pub use answer::Caller;
use answer::{error_result, result};

use crate::secret;
use crate::state::AppState;

/// The header a client names its session with (`cortex mcp --session NAME`): calls
/// naming one name share one session, across connections and restarts.
pub const SESSION_HEADER: &str = "cortex-session";
/// A session name's length at most.
const MAX_SESSION_NAME: usize = 100;
/// How often a blocking wait tells the client it is still waiting.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// `/mcp`, behind [`guard`].
pub fn router(state: AppState) -> Router<AppState> {
    let handler = Cortex {
        state: state.clone(),
        followed: channel::Followed::default(),
    };
    let mut config = StreamableHttpServerConfig::default()
        // The hub's own Host rule runs first (`server::hosts`); the Origin rule is ours.
        .disable_allowed_hosts()
        .with_sse_keep_alive(Some(Duration::from_secs(15)));
    config.session_store = Some(Arc::new(connections::Kept::new(state.clone())));
    // The hub stopping ends every connection: their workers hold the hub's state, which
    // must be dropped for the store to close.
    let stop = config.cancellation_token.clone();
    let shutdown = state.shutdown.clone();
    tokio::spawn(async move {
        shutdown.cancelled().await;
        stop.cancel();
    });
    let service = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            tasks_2025::layer,
        ))
        .layer(axum::middleware::from_fn_with_state(state, guard))
}

/// The bearer token (the operator token, or an MCP token), and an `Origin`, when sent, that is one of the
/// hub's own: a page elsewhere in a browser on this machine must not reach the tools.
pub async fn guard(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !origin_allowed(&state, origin) {
            tracing::warn!("refused an MCP request from a foreign Origin");
            return refusal(
                StatusCode::FORBIDDEN,
                "forbidden_origin",
                "this MCP endpoint serves only clients on the hub's own origin; a request from a web page elsewhere is refused",
            );
        }
    }
    let given = bearer(req.headers()).map(secret::hash);
    let allowed = match given {
        Some(h) if secret::same_hash(&h, &state.token_hash) => Some(h),
        // An MCP token: it reaches only this endpoint.
        Some(h) => match state.store.read(move |r| r.mcp_token_named(&h)).await {
            Ok(Some(_)) => Some(h),
            _ => None,
        },
        None => None,
    };
    let Some(owner) = allowed else {
        let mut r = refusal(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "/mcp needs the operator token or an MCP token (cortex mcp-token add NAME): send Authorization: Bearer <token>",
        );
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        return r;
    };
    let named = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    if named
        .as_ref()
        .is_some_and(|n| n.chars().count() > MAX_SESSION_NAME || n.chars().any(char::is_control))
    {
        return refusal(
            StatusCode::BAD_REQUEST,
            "bad_session_name",
            "Cortex-Session is a name of 1 to 100 printable characters",
        );
    }
    let caller = Caller { owner, named };
    req.extensions_mut().insert(caller);
    next.run(req).await
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// `http://HOST[:PORT]` or `https://…` whose host the hub answers to.
fn origin_allowed(state: &AppState, origin: &str) -> bool {
    let Some(rest) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    !rest.is_empty() && !rest.contains('/') && state.hosts.allows(rest)
}

fn refusal(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

/// The server, one per connection (they share the hub's state).
#[derive(Clone)]
pub struct Cortex {
    state: AppState,
    /// The connections whose wakes are pushed to them (`channel.rs`).
    followed: channel::Followed,
}

/// What a request says of its caller and connection.
struct Asking {
    caller: Caller,
    /// The connection has a handshake (an MCP session id).
    session_mode: bool,
    /// The stored connection's key.
    key: String,
    title: String,
}

fn asking(ctx: &RequestContext<RoleServer>) -> Result<Asking, McpError> {
    let parts = ctx.extensions.get::<axum::http::request::Parts>();
    let caller = parts
        .and_then(|p| p.extensions.get::<Caller>())
        .cloned()
        .ok_or_else(|| McpError::internal_error("the request carries no caller", None))?;
    let client = ctx
        .peer
        .peer_info()
        .map(|i| i.client_info.name.clone())
        .filter(|n| !n.trim().is_empty());
    let session_id = parts
        .and_then(|p| p.headers.get("mcp-session-id"))
        .and_then(|v| v.to_str().ok());
    let (key, title) = answer::connection(&caller, session_id, client.as_deref());
    let session_mode = session_id.is_some();
    Ok(Asking {
        caller,
        session_mode,
        key,
        title,
    })
}

impl Cortex {
    /// The caller's session, made at its connection's first call.
    async fn session(&self, a: &Asking) -> Result<String, CallToolResult> {
        answer::session_of(&self.state, &a.key, a.caller.owner, &a.title).await
    }

    /// How long a blocking call waits (its `timeout_s`, at most [`calls::BLOCK_MAX_S`]),
    /// and what tells the client, meanwhile, that it still waits.
    fn bound(
        &self,
        args: &Value,
        ctx: &RequestContext<RoleServer>,
    ) -> (Instant, impl FnMut(u64) + use<>) {
        let secs = args
            .get("timeout_s")
            .and_then(Value::as_f64)
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map_or(calls::BLOCK_MAX_S as f64, |s| {
                s.min(calls::BLOCK_MAX_S as f64)
            });
        let token = ctx.meta.get_progress_token();
        let peer = ctx.peer.clone();
        let tick = move |secs: u64| {
            if let Some(tok) = token.clone() {
                let peer = peer.clone();
                tokio::spawn(async move {
                    let _ = peer
                        .notify_progress(
                            ProgressNotificationParam::new(tok, secs as f64)
                                .with_message(format!("still waiting ({secs} s)")),
                        )
                        .await;
                });
            }
        };
        (Instant::now() + Duration::from_secs_f64(secs), tick)
    }

    /// A blocking `wait_for`: at most its bound, with progress while it waits.
    async fn wait_for(
        &self,
        sid: &str,
        args: &Value,
        ctx: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let Some(id) = args["id"].as_str().filter(|s| !s.trim().is_empty()) else {
            return error_result("wait_for needs \"id\": the waitpoint to wait for");
        };
        if args
            .get("timeout_s")
            .is_some_and(|t| !t.as_f64().is_some_and(|s| s.is_finite() && s >= 0.0))
        {
            return error_result("timeout_s is a number of seconds, 0 or more");
        }
        let after = args.get("after_seq").and_then(Value::as_u64);
        let (until, tick) = self.bound(args, ctx);
        let waited = tokio::select! {
            w = wait::until_final(&self.state, sid, id, after, until, PROGRESS_EVERY, tick) => w,
            _ = ctx.ct.cancelled() => return error_result("cancelled by the client"),
            _ = self.state.shutdown.cancelled() => {
                return error_result("the hub is stopping; call wait_for again with this id");
            }
        };
        match waited {
            Ok(standing) => {
                let (text, value) = standing.answer(id);
                result(
                    !matches!(standing, wait::Standing::Unknown),
                    Some(text),
                    value,
                )
            }
            Err(e) => error_result(&format!("the hub's store failed: {e}; try again")),
        }
    }
}

impl ServerHandler for Cortex {
    fn get_info(&self) -> InitializeResult {
        let mut info = Implementation::from_build_env();
        info.name = "cortex".into();
        info.title = Some("cortex hub".into());
        info.version = env!("CARGO_PKG_VERSION").into();
        InitializeResult::new(
            ServerCapabilities::builder()
                .enable_experimental_with(
                    [(channel::CAPABILITY.to_string(), serde_json::Map::new())]
                        .into_iter()
                        .collect(),
                )
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        .with_server_info(info)
        .with_instructions(
            "cortex: durable waits. Arm a wait (wait_create for a job that reports, device_wait_* for a process, file, lock or log on a device), then wait_for its id: the answer is the wake, whenever it comes. A wait survives the hub restarting; where your client takes tasks, waits are tasks.",
        )
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Borrowed(&[
            ProtocolVersion::V_2026_07_28,
            ProtocolVersion::V_2025_11_25,
            ProtocolVersion::V_2025_06_18,
        ])
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools = calls::offered()
            .into_iter()
            .map(|(name, description, schema)| {
                let schema = match schema {
                    Value::Object(o) => o,
                    _ => serde_json::Map::new(),
                };
                Tool::new(name, description, Arc::new(schema))
            })
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let a = asking(&ctx)?;
        let sid = match self.session(&a).await {
            Ok(s) => s,
            Err(r) => return Ok(r.into()),
        };
        if a.session_mode {
            let info = ctx.peer.peer_info();
            let name = info.as_ref().map(|i| i.client_info.name.as_str());
            if channel::wanted(name, info.as_ref().map(|i| &i.capabilities)) {
                self.followed
                    .follow(&self.state, &a.key, &sid, ctx.peer.clone());
            }
        }
        let args = Value::Object(request.arguments.unwrap_or_default());
        let name = request.name.as_ref();
        if name == exec::TOOL {
            let elicit = (a.session_mode
                && ctx
                    .client_capabilities()
                    .is_some_and(|c| c.elicitation.is_some()))
            .then_some(&ctx.peer);
            let (until, tick) = self.bound(&args, &ctx);
            return Ok(exec::call(&self.state, &sid, &args, elicit, until, tick)
                .await
                .into());
        }
        if name == calls::WAIT_FOR
            && let Some(req) = args["id"].as_str().filter(|i| i.starts_with("req_"))
        {
            let (until, tick) = self.bound(&args, &ctx);
            return Ok(exec::wait(&self.state, &sid, req, until, tick).await.into());
        }
        let as_task = ctx
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks());
        if name == calls::WAIT_FOR {
            if as_task {
                return Ok(tasks::for_wait(&self.state, &a.caller, &sid, name, &args).await);
            }
            return Ok(self.wait_for(&sid, &args, &ctx).await.into());
        }
        let answer = calls::run(&self.state, &sid, name, &args).await;
        if answer.ok
            && as_task
            && calls::is_remote_wait(name)
            && let Some(wp) = calls::waitpoint_of(&answer.value)
        {
            let args = json!({"id": wp});
            return Ok(tasks::for_wait(&self.state, &a.caller, &sid, name, &args).await);
        }
        Ok(result(answer.ok, None, answer.value).into())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let a = asking(&ctx)?;
        tasks::get(&self.state, &a.caller, &request.task_id).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let a = asking(&ctx)?;
        tasks::cancel(&self.state, &a.caller, &request.task_id).await
    }
}
