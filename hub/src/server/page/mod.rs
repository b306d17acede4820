//! The hub's page for operators: `GET /` (the login form, or the page itself), `POST
//! /login`, `POST /logout` and the page's two assets, all embedded in the binary. Only a
//! loopback peer is answered (a remote operator comes through an SSH tunnel). A login is
//! a random id in an HttpOnly, SameSite=Strict cookie, kept here in memory as its hash
//! with an expiry and a CSRF token the page sends back on every change (`X-CSRF-Token`);
//! the operator token itself never reaches the page. `api::auth` takes the same cookie.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::secret;
use crate::state::AppState;

#[cfg(test)]
mod tests;

/// The login cookie's name.
pub const COOKIE: &str = "cortex_page";
/// The header a cookie-authenticated change must carry, equal to its login's CSRF token.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// How long a login lasts.
pub const LOGIN_TTL: Duration = Duration::from_secs(12 * 3600);
/// Logins kept at once; past it the one closest to its expiry goes.
pub const MAX_LOGINS: usize = 256;
/// Wrong tokens the login form takes in a sliding minute; past it, 429 without looking.
pub const LOGIN_MISSES: usize = 10;
const MISS_WINDOW: Duration = Duration::from_secs(60);

const APP_HTML: &str = include_str!("assets/app.html");
const LOGIN_HTML: &str = include_str!("assets/login.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// The page's logins and the login form's miss budget. One per router (`server::router`
/// adds it as an extension), so a restart logs everyone out.
#[derive(Default)]
pub struct Logins {
    by_hash: Mutex<HashMap<[u8; 32], Login>>,
    misses: Mutex<VecDeque<Instant>>,
}

struct Login {
    csrf: String,
    expires: Instant,
}

impl Logins {
    pub fn shared() -> Arc<Logins> {
        Arc::new(Logins::default())
    }

    /// A new login: its cookie id and its CSRF token. Only the id's hash is kept.
    pub fn start(&self, now: Instant) -> (String, String) {
        let id = secret::random_hex(32);
        let csrf = secret::random_hex(32);
        let mut map = self.by_hash.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, l| l.expires > now);
        if map.len() >= MAX_LOGINS
            && let Some(oldest) = map.iter().min_by_key(|(_, l)| l.expires).map(|(k, _)| *k)
        {
            map.remove(&oldest);
        }
        map.insert(
            secret::hash(&id),
            Login {
                csrf: csrf.clone(),
                expires: now + LOGIN_TTL,
            },
        );
        (id, csrf)
    }

    /// The CSRF token of the live login `id`, if there is one.
    pub fn csrf(&self, id: &str, now: Instant) -> Option<String> {
        let key = secret::hash(id);
        let mut map = self.by_hash.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&key) {
            Some(l) if l.expires > now => Some(l.csrf.clone()),
            Some(_) => {
                map.remove(&key);
                None
            }
            None => None,
        }
    }

    pub fn end(&self, id: &str) {
        let mut map = self.by_hash.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(&secret::hash(id));
    }

    /// Whether the form's budget of wrong tokens is spent for now.
    pub fn locked(&self, now: Instant) -> bool {
        let mut t = self.misses.lock().unwrap_or_else(|e| e.into_inner());
        while t
            .front()
            .is_some_and(|&f| now.duration_since(f) >= MISS_WINDOW)
        {
            t.pop_front();
        }
        t.len() >= LOGIN_MISSES
    }

    pub fn miss(&self, now: Instant) {
        self.misses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(now);
    }
}

/// Whether the request came from 127.0.0.0/8 or ::1 (also ::ffff:127.x). No peer
/// address known (a request not from the listener) is not loopback.
pub fn from_loopback(req_extensions: &axum::http::Extensions) -> bool {
    req_extensions
        .get::<ConnectInfo<SocketAddr>>()
        .is_some_and(|ConnectInfo(a)| match a.ip() {
            std::net::IpAddr::V4(v4) => v4.is_loopback(),
            std::net::IpAddr::V6(v6) => {
                v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
            }
        })
}

/// The value of the login cookie, if the request has one.
pub fn cookie_id(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim())
        .filter(|v| !v.is_empty())
}

/// What a cookie gives a request to `/api`: nothing (no cookie, not loopback, no such
/// login), or the login with whether the request may go on.
pub enum CookieAuth {
    None,
    Allowed,
    /// A change without the login's CSRF token.
    NoCsrf,
}

/// Checks the page's cookie on an API request: a live login from a loopback peer; a
/// request that is not GET or HEAD must also carry the login's CSRF token.
pub fn cookie_auth(logins: &Logins, req: &Request) -> CookieAuth {
    if !from_loopback(req.extensions()) {
        return CookieAuth::None;
    }
    let Some(id) = cookie_id(req.headers()) else {
        return CookieAuth::None;
    };
    let Some(csrf) = logins.csrf(id, Instant::now()) else {
        return CookieAuth::None;
    };
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        return CookieAuth::Allowed;
    }
    let given = req.headers().get(CSRF_HEADER).and_then(|v| v.to_str().ok());
    match given {
        Some(g) if secret::matches(g, &secret::hash(&csrf)) => CookieAuth::Allowed,
        _ => CookieAuth::NoCsrf,
    }
}

fn forbidden_remote() -> Response {
    (
        StatusCode::FORBIDDEN,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "the hub's page answers only on loopback; from another machine, open an SSH tunnel (ssh -L 3001:127.0.0.1:3001 HUB-HOST) and browse http://127.0.0.1:3001/\n",
    )
        .into_response()
}

/// The headers every page answer carries: no caching, no framing, nothing but the
/// page's own script and style.
fn page_headers(resp: &mut Response, content_type: &'static str) {
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
}

fn html(status: StatusCode, body: String) -> Response {
    let mut resp = (status, body).into_response();
    page_headers(&mut resp, "text/html; charset=utf-8");
    resp
}

/// `&`, `<`, `>`, `"` and `'` as entities, for text put into the served HTML.
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The login form, with an error line when `error` is given.
pub fn login_page(error: Option<&str>) -> String {
    let error = match error {
        Some(e) => format!(
            "<p class=\"error\" data-test=\"login-error\" role=\"alert\">{}</p>",
            escape_html(e)
        ),
        None => String::new(),
    };
    LOGIN_HTML.replace("{{ERROR}}", &error)
}

/// The page for a live login: its CSRF token and the mesh's URL in `<meta>` tags.
pub fn app_page(csrf: &str, mesh_url: Option<&str>) -> String {
    APP_HTML
        .replace("{{CSRF}}", &escape_html(csrf))
        .replace("{{MESH_URL}}", &escape_html(mesh_url.unwrap_or("")))
}

/// `GET /`: the page for a live login, else the login form.
pub async fn index(
    State(state): State<AppState>,
    Extension(logins): Extension<Arc<Logins>>,
    req: Request,
) -> Response {
    if !from_loopback(req.extensions()) {
        return forbidden_remote();
    }
    let csrf = cookie_id(req.headers()).and_then(|id| logins.csrf(id, Instant::now()));
    match csrf {
        Some(csrf) => html(StatusCode::OK, app_page(&csrf, state.mesh_url.as_deref())),
        None => html(StatusCode::OK, login_page(None)),
    }
}

/// The value of `name` in a form-encoded body (`a=1&b=2`), decoded; `None` when the
/// body is not a form or lacks the field.
pub fn form_field(body: &[u8], name: &str) -> Option<String> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(body).ok()?;
    pairs.into_iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

/// `POST /login` `token=...`: right, a new login and 303 to `/`, whatever the budget;
/// wrong, 401 with the form; wrong with the minute's budget of wrong tokens spent, 429.
pub async fn login(
    State(state): State<AppState>,
    Extension(logins): Extension<Arc<Logins>>,
    req: Request,
) -> Response {
    if !from_loopback(req.extensions()) {
        return forbidden_remote();
    }
    let secure = req.uri().scheme_str() == Some("https");
    let body = match axum::body::to_bytes(req.into_body(), 64 * 1024).await {
        Ok(b) => b,
        Err(_) => Bytes::new(),
    };
    let now = Instant::now();
    let token = form_field(&body, "token").unwrap_or_default();
    let token = token.trim();
    // The right token always passes: the budget slows guessing (the token is 256 random
    // bits), and wrong guesses, anyone's, must never lock the operator out.
    let right = !token.is_empty() && secret::matches(token, &state.token_hash);
    if !right && logins.locked(now) {
        tracing::warn!("the page's login form: too many wrong tokens this minute");
        return html(
            StatusCode::TOO_MANY_REQUESTS,
            login_page(Some(
                "Too many wrong tokens in the last minute. Wait a minute, then try again.",
            )),
        );
    }
    if !right {
        logins.miss(now);
        return html(
            StatusCode::UNAUTHORIZED,
            login_page(Some(
                "That is not the hub's token. It is in $CORTEX_HOME/hub/token on the hub's machine.",
            )),
        );
    }
    let (id, _csrf) = logins.start(now);
    tracing::info!("the page: logged in");
    let mut cookie = format!(
        "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        LOGIN_TTL.as_secs()
    );
    if secure {
        cookie.push_str("; Secure");
    }
    redirect_home(&cookie)
}

fn redirect_home(cookie: &str) -> Response {
    let mut resp = StatusCode::SEE_OTHER.into_response();
    let h = resp.headers_mut();
    h.insert(header::LOCATION, HeaderValue::from_static("/"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Ok(v) = HeaderValue::from_str(cookie) {
        h.insert(header::SET_COOKIE, v);
    }
    resp
}

/// `POST /logout`, with the cookie and the login's CSRF token (the `X-CSRF-Token` header
/// or a `csrf` form field): the login ends, the cookie is cleared, 303 to `/`.
pub async fn logout(Extension(logins): Extension<Arc<Logins>>, req: Request) -> Response {
    if !from_loopback(req.extensions()) {
        return forbidden_remote();
    }
    let id = cookie_id(req.headers()).map(str::to_string);
    let header_csrf = req
        .headers()
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = axum::body::to_bytes(req.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let given = header_csrf.or_else(|| form_field(&body, "csrf"));
    let Some(id) = id else {
        return redirect_home(&cleared());
    };
    let Some(csrf) = logins.csrf(&id, Instant::now()) else {
        return redirect_home(&cleared());
    };
    match given {
        Some(g) if secret::matches(&g, &secret::hash(&csrf)) => {
            logins.end(&id);
            tracing::info!("the page: logged out");
            redirect_home(&cleared())
        }
        _ => (
            StatusCode::FORBIDDEN,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "logging out needs the page's CSRF token (X-CSRF-Token)\n",
        )
            .into_response(),
    }
}

fn cleared() -> String {
    format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0")
}

/// `GET /page/app.js`.
pub async fn script(req: Request) -> Response {
    asset(&req, APP_JS, "text/javascript; charset=utf-8")
}

/// `GET /page/app.css`.
pub async fn style(req: Request) -> Response {
    asset(&req, APP_CSS, "text/css; charset=utf-8")
}

fn asset(req: &Request, body: &'static str, content_type: &'static str) -> Response {
    if !from_loopback(req.extensions()) {
        return forbidden_remote();
    }
    let mut resp = body.into_response();
    page_headers(&mut resp, content_type);
    resp
}
