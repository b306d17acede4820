//! `/api/...`: sessions, their event logs (long poll and SSE) and waitpoints. Every route
//! here sits behind the operator token (see `auth`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use cortex_protocol::api::{
    self, CreateSession, CreateWaitpoint, MAX_DEDUPE_KEY_CHARS, MAX_INSTRUCTIONS_BYTES,
    MAX_TEXT_BYTES, MAX_TITLE_CHARS, MessagePosted, PostMessage, WaitpointList,
};
use serde::Deserialize;

use super::error::{ApiError, parse_json};
use super::http::Hangup;
use super::log::{self, LogQuery};
use super::page::{self, CookieAuth, Logins};
use crate::engine::CreateParams;
use crate::runner::output::{self, ConfigError, OutputConfig};
use crate::runner::prefix;
use crate::state::AppState;
use crate::store::agent::AgentRecord;
use crate::store::ops::{CancelOutcome, CreateOutcome, SpawnSetup};
use crate::time::now_ms;
use crate::{secret, text};

/// `Authorization: Bearer <operator token>`, compared in constant time; or the page's
/// login cookie from a loopback peer, with its CSRF token on anything but GET and HEAD
/// (`page::cookie_auth`).
pub async fn auth(
    State(state): State<AppState>,
    logins: Option<Extension<Arc<Logins>>>,
    req: Request,
    next: Next,
) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    if let Some(t) = given {
        if secret::matches(t, &state.token_hash) {
            return next.run(req).await;
        }
        return unauthorized();
    }
    match logins.map(|Extension(l)| page::cookie_auth(&l, &req)) {
        Some(CookieAuth::Allowed) => next.run(req).await,
        Some(CookieAuth::NoCsrf) => ApiError::new(
            StatusCode::FORBIDDEN,
            "csrf",
            "a change made with the page's login must carry its X-CSRF-Token; reload the page",
        )
        .into_response(),
        Some(CookieAuth::None) | None => unauthorized(),
    }
}

fn unauthorized() -> Response {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "this route needs the operator token: send Authorization: Bearer <token> (CORTEX_WEBHOOK_TOKEN, or the file $CORTEX_HOME/hub/token on the hub's machine)",
    )
    .into_response()
}

fn json_or_empty<T: serde::de::DeserializeOwned + Default>(bytes: &Bytes) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        Ok(T::default())
    } else {
        parse_json(bytes)
    }
}

// ------------------------------------------------------------------ sessions

pub async fn create_session(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: CreateSession = json_or_empty(&body)?;
    if let Some(t) = &req.title {
        ApiError::cap_chars("title", t, MAX_TITLE_CHARS)?;
    }
    if let Some(i) = &req.instructions
        && i.len() > MAX_INSTRUCTIONS_BYTES
    {
        return Err(ApiError::too_long(
            "instructions",
            i.len(),
            MAX_INSTRUCTIONS_BYTES,
            "bytes",
        ));
    }
    let title = req.title.clone();
    let given = req.agent_settings();
    if req.runs == Some(false) && !given.is_empty() {
        return Err(ApiError::bad_request(format!(
            "runs: false makes a mailbox, which no model runs, so it takes no agent settings (given: {}); drop them, or drop runs: false",
            given.join(", ")
        )));
    }
    if let Some(o) = &req.output {
        // Compiled here under the hub's budget, and kept for the session's runs.
        schema_compiled(&state, o).await?;
    }
    // Fixed now: an agent session's configuration and prefix, or none for a mailbox.
    let agent = match req.wants_runs() {
        true => {
            let config = prefix::config(&state.agent_defaults, &state.caps, req)
                .map_err(ApiError::bad_request)?;
            let prefix = prefix::build(&config, &state.caps);
            Some((config, prefix))
        }
        false => None,
    };
    let model = state.runs_model;
    let view = state
        .store
        .exec(move |t| {
            let view = t.create_session(title, now_ms())?;
            let rec = match agent {
                Some((config, prefix)) => {
                    let mut rec = AgentRecord::new(None);
                    t.fix_agent(&view.id, &mut rec, config, &prefix)?;
                    rec
                }
                None => AgentRecord::mailbox(),
            };
            t.put_agent(&view.id, &rec)?;
            t.session_seen(&view.id, model)
        })
        .await
        .map_err(ApiError::store)?
        .ok_or_else(|| ApiError::store("the session just made cannot be read"))?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

/// Compiles an output schema under `limits.schemaCompileMs`, on a blocking thread: a
/// 400 says why it is refused (503 while another compile still runs past its budget).
async fn schema_compiled(state: &AppState, o: &OutputConfig) -> Result<(), ApiError> {
    let budget = Duration::from_millis(state.settings.limits.schema_compile_ms);
    match output::budget::compile_within(o, budget).await {
        Ok(_) => Ok(()),
        Err(e @ (ConfigError::TooLarge(_) | ConfigError::TooDeep(_))) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "schema_too_complex",
            e.to_string(),
        )),
        Err(e @ ConfigError::TooSlow(_)) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "schema_compile_timeout",
            e.to_string(),
        )),
        Err(e @ ConfigError::Busy(_)) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "schema_compile_busy",
            e.to_string(),
        )),
        Err(e) => Err(ApiError::bad_request(e.to_string())),
    }
}

/// `GET /api/sessions/{sid}/result`: the last run's result and meta.
pub async fn session_result(
    State(state): State<AppState>,
    Path(sid): Path<String>,
) -> Result<Response, ApiError> {
    let s = sid.clone();
    let (exists, result) = state
        .store
        .read(move |r| Ok((r.session(&s)?.is_some(), r.agent_result(&s)?)))
        .await
        .map_err(ApiError::store)?;
    match result {
        Some(res) => Ok(Json(res).into_response()),
        None if exists => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_result",
            format!(
                "session {sid} has no finished run yet; post a message, and follow its events for the run-end"
            ),
        )),
        None => Err(ApiError::not_found("session", &sid)),
    }
}

pub async fn list_sessions(State(state): State<AppState>) -> Result<Response, ApiError> {
    let model = state.runs_model;
    let list = state
        .store
        .read(move |r| r.sessions_seen(model))
        .await
        .map_err(ApiError::store)?;
    Ok(Json(list).into_response())
}

pub async fn get_session(
    State(state): State<AppState>,
    Path(sid): Path<String>,
) -> Result<Response, ApiError> {
    let model = state.runs_model;
    let model_name = state.model_name.clone();
    match state
        .store
        .read({
            let sid = sid.clone();
            move |r| {
                let Some(mut v) = r.session_seen(&sid, model)? else {
                    return Ok(None);
                };
                v.config = r
                    .agent(&sid)?
                    .and_then(|a| a.config)
                    .filter(|_| v.runs)
                    .map(|c| prefix::config_view(&c, model_name));
                Ok(Some(v))
            }
        })
        .await
        .map_err(ApiError::store)?
    {
        Some(v) => Ok(Json(v).into_response()),
        None => Err(ApiError::not_found("session", &sid)),
    }
}

/// `DELETE /api/sessions/{sid}`: the session, its log and agent record go, its armed
/// waitpoints are cancelled, and a model call its runner task waits on is stopped.
pub async fn delete_session(
    State(state): State<AppState>,
    Path(sid): Path<String>,
) -> Result<Response, ApiError> {
    let s = sid.clone();
    let found = state
        .store
        .exec(move |t| t.delete_session(&s, now_ms()))
        .await
        .map_err(ApiError::store)?;
    if !found {
        return Err(ApiError::not_found("session", &sid));
    }
    // The delete raised the session's stop notice: a model call its task waits on (on
    // this hub or another) stops now, and the write that follows finds no session
    // (nothing recorded, nothing made again).
    Ok(Json(api::SessionDeleted {
        id: sid,
        deleted: true,
    })
    .into_response())
}

pub async fn post_message(
    State(state): State<AppState>,
    Path(sid): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: PostMessage = parse_json(&body)?;
    if req.text.trim().is_empty() {
        return Err(ApiError::bad_request("text is empty; say something"));
    }
    if req.text.len() > MAX_TEXT_BYTES {
        return Err(ApiError::too_long(
            "text",
            req.text.len(),
            MAX_TEXT_BYTES,
            "bytes",
        ));
    }
    if let Some(k) = &req.dedupe_key {
        ApiError::cap_chars("dedupe_key", k, MAX_DEDUPE_KEY_CHARS)?;
    }
    let s = sid.clone();
    let posted = state
        .store
        .exec(move |t| {
            if t.agent_cancelled(&s)? {
                return Ok(Err(()));
            }
            let posted = t.post_message(&s, req.text, req.when, req.dedupe_key, now_ms())?;
            let rec = t.agent(&s)?;
            let mailbox = !t.session_runs(&s, rec.as_ref())?;
            Ok(Ok(posted.map(|p| MessagePosted { mailbox, ..p })))
        })
        .await
        .map_err(ApiError::store)?;
    let Ok(posted) = posted else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "session_cancelled",
            format!("session {sid} was cancelled; it takes no more messages (start a new session)"),
        ));
    };
    match posted.map(|p| MessagePosted {
        runs: state.runs_model && !p.mailbox,
        ..p
    }) {
        Some(p) if p.duplicate => Ok((StatusCode::OK, Json(p)).into_response()),
        Some(p) => Ok((StatusCode::CREATED, Json(p)).into_response()),
        None => Err(ApiError::not_found("session", &sid)),
    }
}

/// `GET /api/sessions/{sid}/events?after=SEQ[&wait=S]`, or SSE with `Accept: text/event-stream`.
pub async fn events(
    State(state): State<AppState>,
    Path(sid): Path<String>,
    Query(q): Query<LogQuery>,
    headers: HeaderMap,
    hangup: Option<Extension<Hangup>>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
) -> Result<Response, ApiError> {
    let conn = log::Conn::of(&headers, hangup.map(|h| h.0), peer.map(|p| (p.0).0));
    let current = match state
        .store
        .read({
            let sid = sid.clone();
            move |r| r.session(&sid)
        })
        .await
        .map_err(ApiError::store)?
    {
        Some(s) => s.last_seq,
        None => return Err(ApiError::not_found("session", &sid)),
    };
    // Subscribe before reading, so nothing committed in between is missed.
    let rx = state.store.notifier.subscribe(&sid, current);
    let sse = log::wants_sse(&headers);
    let live = sse.then(|| state.live.subscribe(&sid));
    let (read_sid, gone_sid) = (sid.clone(), sid);
    let read = move |after: u64, limit: usize| -> log::LogReader {
        let sid = read_sid.clone();
        Box::new(move |r| r.events_after(&sid, after, limit))
    };
    let gone = move || ApiError::not_found("session", &gone_sid);
    log::serve(state, q, sse, rx, read, gone, live, conn).await
}

// ------------------------------------------------------------------ waitpoints

pub async fn create_waitpoint(
    State(state): State<AppState>,
    Path(sid): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: CreateWaitpoint = parse_json(&body)?;
    cap_waitpoint(&req)?;
    let setup = match &req.spawn {
        Some(spawn) => Some(spawn_setup(&state, &sid, &spawn.instructions).await?),
        None => None,
    };
    let params = CreateParams::from(req);
    let secret = secret::new_secret();
    let hash = secret::hash(&secret);
    let s = sid.clone();
    let out = state
        .store
        .exec(move |t| t.create_waitpoint_spawning(&s, params, hash, setup, now_ms()))
        .await
        .map_err(ApiError::store)?;
    let wp = match out {
        CreateOutcome::Created(wp) => wp,
        CreateOutcome::NoSession => return Err(ApiError::not_found("session", &sid)),
        CreateOutcome::NoDevice(d) => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_device",
                format!(
                    "no device named {d:?}; `cortex devices` lists them, `cortex device add {d}` adds it"
                ),
            ));
        }
        CreateOutcome::Invalid(e) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_waitpoint",
                e.to_string(),
            ));
        }
    };
    let reply = text::waitpoint_created(&wp, secret, &state.signal_url);
    Ok((StatusCode::CREATED, Json(reply)).into_response())
}

/// A `spawn` monitor's sessions' configuration: session `sid`'s own (read now) with the
/// spawn's instructions, or the hub's defaults with them; a 400 says what is wrong.
async fn spawn_setup(
    state: &AppState,
    sid: &str,
    instructions: &str,
) -> Result<SpawnSetup, ApiError> {
    let s = sid.to_string();
    let parent = state
        .store
        .read(move |r| Ok(r.agent(&s)?.and_then(|a| a.config)))
        .await
        .map_err(ApiError::store)?;
    if let Some(o) = parent.as_ref().and_then(|p| p.output.as_ref()) {
        // The spawned sessions share the parent's schema: compiled (or found compiled)
        // under the budget, so building their prefix here compiles nothing.
        schema_compiled(state, o).await?;
    }
    let (config, prefix) =
        prefix::spawned(&state.agent_defaults, &state.caps, parent, instructions)
            .map_err(ApiError::bad_request)?;
    Ok(SpawnSetup { config, prefix })
}

/// The length caps of a waitpoint's stored fields, as 413s naming the field; the engine
/// checks the same numbers (and everything else) as 400s.
fn cap_waitpoint(req: &CreateWaitpoint) -> Result<(), ApiError> {
    use crate::engine::{MAX_INTENT_CHARS, MAX_LABEL_CHARS, MAX_MEMBER_CHARS, MAX_MEMBERS};
    ApiError::cap_chars("label", req.label.trim(), MAX_LABEL_CHARS)?;
    ApiError::cap_chars("intent", req.intent.trim(), MAX_INTENT_CHARS)?;
    if let Some(members) = &req.members {
        if members.len() > MAX_MEMBERS {
            return Err(ApiError::too_long(
                "members",
                members.len(),
                MAX_MEMBERS,
                "names",
            ));
        }
        for m in members {
            ApiError::cap_chars("a member name", m, MAX_MEMBER_CHARS)?;
        }
    }
    if let Some(d) = &req.device {
        ApiError::cap_chars("device", d, MAX_MEMBER_CHARS)?;
    }
    if let Some(spawn) = &req.spawn {
        if spawn.instructions.len() > MAX_INSTRUCTIONS_BYTES {
            return Err(ApiError::too_long(
                "spawn.instructions",
                spawn.instructions.len(),
                MAX_INSTRUCTIONS_BYTES,
                "bytes",
            ));
        }
        if let Some(t) = &spawn.title {
            ApiError::cap_chars("spawn.title", t.trim(), MAX_TITLE_CHARS)?;
        }
    }
    Ok(())
}

/// The answer to a waitpoint's creation (also a remote wait's): the only time its secret
/// is shown, with the lines that signal it.
pub async fn session_waitpoints(
    State(state): State<AppState>,
    Path(sid): Path<String>,
) -> Result<Response, ApiError> {
    let cap = state.store.settings.clone();
    match state
        .store
        .read({
            let sid = sid.clone();
            move |r| r.session_waitpoints(&sid, now_ms(), &cap)
        })
        .await
        .map_err(ApiError::store)?
    {
        Some(waitpoints) => Ok(Json(WaitpointList { waitpoints }).into_response()),
        None => Err(ApiError::not_found("session", &sid)),
    }
}

#[derive(Debug, Deserialize)]
pub struct WaitpointsQuery {
    state: Option<String>,
}

/// `GET /api/waitpoints?state=armed`: every armed waitpoint across the sessions, oldest
/// first (a JSON array; never a secret).
pub async fn armed_waitpoints(
    State(state): State<AppState>,
    Query(q): Query<WaitpointsQuery>,
) -> Result<Response, ApiError> {
    if let Some(s) = q.state.as_deref().filter(|s| *s != "armed") {
        return Err(ApiError::bad_request(format!(
            "state={s:?}: only state=armed is listed across sessions; GET /api/sessions/{{sid}}/waitpoints lists a session's in every state"
        )));
    }
    let cap = state.store.settings.clone();
    let list = state
        .store
        .read(move |r| r.armed_waitpoints(now_ms(), &cap))
        .await
        .map_err(ApiError::store)?;
    Ok(Json(list).into_response())
}

#[derive(Debug, Deserialize)]
pub struct Scope {
    /// wait_check / wait_cancel as an agent: only this session's waitpoints are seen.
    session: Option<String>,
}

pub async fn get_waitpoint(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(scope): Query<Scope>,
) -> Result<Response, ApiError> {
    let cap = state.store.settings.clone();
    match state
        .store
        .read({
            let id = id.clone();
            move |r| r.waitpoint(&id, now_ms(), &cap)
        })
        .await
        .map_err(ApiError::store)?
    {
        Some(v) if scope.session.as_ref().is_none_or(|s| *s == v.head.session) => {
            Ok(Json(v).into_response())
        }
        _ => Err(ApiError::not_found("waitpoint", &id)),
    }
}

pub async fn cancel_waitpoint(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(scope): Query<Scope>,
) -> Result<Response, ApiError> {
    let i = id.clone();
    let by = if scope.session.is_some() {
        "agent"
    } else {
        "operator"
    };
    let out = state
        .store
        .exec(move |t| t.cancel_waitpoint(&i, scope.session.as_deref(), by, now_ms()))
        .await
        .map_err(ApiError::store)?;
    match out {
        CancelOutcome::Cancelled => Ok(Json(api::WaitpointCancelled {
            id,
            state: "cancelled".into(),
            cancelled: true,
        })
        .into_response()),
        CancelOutcome::AlreadyEnded(s) => Ok(Json(api::WaitpointCancelled {
            id,
            state: s.as_str().into(),
            cancelled: false,
        })
        .into_response()),
        CancelOutcome::NotFound => Err(ApiError::not_found("waitpoint", &id)),
    }
}

pub async fn not_found(req: Request<Body>) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_route",
        format!(
            "no route {} {}; see docs/api.md (or GET /api/openapi.json) for the routes",
            req.method(),
            req.uri().path()
        ),
    )
}
