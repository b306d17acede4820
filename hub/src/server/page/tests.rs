//! The page's access rules through the real router: loopback only, the login form and
//! its miss budget, the cookie's attributes, the cookie on `/api` with its CSRF token,
//! Bearer unchanged, logout, and the HTML carrying no token.

use std::net::SocketAddr;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use tower::ServiceExt;

use super::*;
use crate::engine::Settings;
use crate::state::{AppState, Inner, Shutdown};
use crate::store::{Store, WriterGuard};

const TOKEN: &str = "operator-token-for-tests-0123456789";

struct Hub {
    app: Router,
    _dir: tempfile::TempDir,
    _writer: WriterGuard,
}

fn hub() -> Hub {
    let dir = tempfile::tempdir().expect("tmp");
    let (store, writer) =
        Store::open(&dir.path().join("hub.redb"), Settings::default()).expect("store");
    let state = AppState::new(Inner {
        store,
        token_hash: secret::hash(TOKEN),
        exec_key: secret::derive_key(TOKEN, "test"),
        misses: Default::default(),
        device_misses: Default::default(),
        signal_url: "http://127.0.0.1:1/webhook/signal".into(),
        shutdown: Shutdown::default(),
        devices: Default::default(),
        mesh_url: Some("ws://127.0.0.1:3002/mesh/v1".into()),
        live: Default::default(),
        agent_defaults: Default::default(),
        runs_model: false,
        model_name: None,
        caps: Default::default(),
        stops: Default::default(),
        claims: crate::claims::Claims::new("test-hub".into(), 10_000),
        hosts: Default::default(),
        settings: Default::default(),
    });
    Hub {
        app: crate::server::router(state),
        _dir: dir,
        _writer: writer,
    }
}

fn local() -> SocketAddr {
    "127.0.0.1:40000".parse().expect("addr")
}

fn remote() -> SocketAddr {
    "192.0.2.7:40000".parse().expect("addr")
}

fn req(method: &str, uri: &str, peer: SocketAddr) -> axum::http::request::Builder {
    let mut b = Request::builder().method(method).uri(uri);
    if let Some(ext) = b.extensions_mut() {
        ext.insert(ConnectInfo(peer));
    }
    b
}

async fn send(app: &Router, r: Request<Body>) -> (StatusCode, axum::http::HeaderMap, String) {
    let resp = app.clone().oneshot(r).await.expect("infallible");
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

async fn post_login(
    app: &Router,
    token: &str,
    peer: SocketAddr,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let body = format!("token={}", token.replace('+', "%2B"));
    send(
        app,
        req("POST", "/login", peer)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(body))
            .expect("req"),
    )
    .await
}

/// Logs in; returns the cookie pair (`cortex_page=ID`) and the page's CSRF token.
async fn logged_in(app: &Router) -> (String, String) {
    let (status, headers, _) = post_login(app, TOKEN, local()).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let set = headers
        .get(header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .expect("set-cookie")
        .to_string();
    let pair = set.split(';').next().expect("pair").to_string();
    let (_, _, page) = send(
        app,
        req("GET", "/", local())
            .header(header::COOKIE, &pair)
            .body(Body::empty())
            .expect("req"),
    )
    .await;
    let marker = "<meta name=\"csrf-token\" content=\"";
    let at = page.find(marker).expect("csrf meta") + marker.len();
    let csrf = page[at..].split('"').next().expect("csrf").to_string();
    assert_eq!(csrf.len(), 64);
    (pair, csrf)
}

#[tokio::test]
async fn without_a_cookie_the_page_is_the_login_form() {
    let h = hub();
    let (status, headers, body) = send(
        &h.app,
        req("GET", "/", local()).body(Body::empty()).expect("req"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("data-test=\"login\""), "{body}");
    assert!(body.contains("name=\"token\" type=\"password\""));
    assert!(body.contains("data-test=\"login-submit\""));
    assert!(!body.contains("data-test=\"login-error\""));
    assert!(!body.contains("csrf-token"));
    let csp = headers
        .get(header::CONTENT_SECURITY_POLICY)
        .and_then(|v| v.to_str().ok())
        .expect("csp");
    assert!(csp.contains("script-src 'self'"));
    assert_eq!(headers.get(header::CACHE_CONTROL).expect("cc"), "no-store");
}

#[tokio::test]
async fn only_a_loopback_peer_is_answered() {
    let h = hub();
    for (m, uri) in [
        ("GET", "/"),
        ("POST", "/login"),
        ("POST", "/logout"),
        ("GET", "/page/app.js"),
    ] {
        let (status, _, body) = send(
            &h.app,
            req(m, uri, remote())
                .body(Body::from("token=x"))
                .expect("req"),
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{m} {uri}");
        assert!(body.contains("SSH tunnel"));
    }
    // The right token from afar is refused too, and does not log in.
    let (status, headers, _) = post_login(&h.app, TOKEN, remote()).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(headers.get(header::SET_COOKIE).is_none());
    // No peer address at all is not loopback either.
    let r = Request::builder()
        .uri("/")
        .body(Body::empty())
        .expect("req");
    assert_eq!(send(&h.app, r).await.0, StatusCode::FORBIDDEN);
    let v6: SocketAddr = "[::1]:4000".parse().expect("addr");
    assert_eq!(
        send(
            &h.app,
            req("GET", "/", v6).body(Body::empty()).expect("req")
        )
        .await
        .0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn the_right_token_logs_in_with_a_strict_httponly_cookie() {
    let h = hub();
    let (status, headers, _) = post_login(&h.app, TOKEN, local()).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers.get(header::LOCATION).expect("location"), "/");
    let set = headers
        .get(header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .expect("cookie");
    assert!(set.starts_with("cortex_page="));
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set.contains(attr), "{set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP: no Secure");
    assert!(!set.contains(TOKEN));
    let (pair, csrf) = logged_in(&h.app).await;
    let (status, _, page) = send(
        &h.app,
        req("GET", "/", local())
            .header(header::COOKIE, format!("other=1; {pair}"))
            .body(Body::empty())
            .expect("req"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("data-test=\"nav-devices\""));
    assert!(page.contains("data-test=\"logout\""));
    assert!(page.contains(&csrf));
    assert!(page.contains("ws://127.0.0.1:3002/mesh/v1"));
    assert!(!page.contains(TOKEN), "the token never reaches the page");
    let (_, _, js) = send(
        &h.app,
        req("GET", "/page/app.js", local())
            .body(Body::empty())
            .expect("req"),
    )
    .await;
    assert!(!js.contains(TOKEN));
}

#[tokio::test]
async fn a_wrong_token_is_401_the_budget_stops_guessing_and_the_right_token_always_passes() {
    let h = hub();
    let (status, headers, body) = post_login(&h.app, "wrong", local()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body.contains("data-test=\"login-error\""));
    assert!(body.contains("data-test=\"login\""));
    assert!(headers.get(header::SET_COOKIE).is_none());
    assert!(!body.contains("wrong\""), "the attempt is not echoed");
    for _ in 1..LOGIN_MISSES {
        assert_eq!(
            post_login(&h.app, "wrong", local()).await.0,
            StatusCode::UNAUTHORIZED
        );
    }
    // The budget is spent: another wrong token is 429 without a look...
    let (status, headers, body) = post_login(&h.app, "wrong", local()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(headers.get(header::SET_COOKIE).is_none());
    assert!(body.contains("data-test=\"login-error\""));
    // ...and the right one still logs in: guesses never lock the operator out.
    let (status, headers, _) = post_login(&h.app, TOKEN, local()).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(headers.get(header::SET_COOKIE).is_some());
}

#[tokio::test]
async fn the_cookie_opens_the_api_and_changes_need_the_csrf_token() {
    let h = hub();
    let (pair, csrf) = logged_in(&h.app).await;
    let get = |cookie: &str, peer| {
        req("GET", "/api/devices", peer)
            .header(header::COOKIE, cookie.to_string())
            .body(Body::empty())
            .expect("req")
    };
    assert_eq!(send(&h.app, get(&pair, local())).await.0, StatusCode::OK);
    assert_eq!(
        send(&h.app, get(&pair, remote())).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        send(&h.app, get("cortex_page=deadbeef", local())).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        send(&h.app, get("", local())).await.0,
        StatusCode::UNAUTHORIZED
    );

    let create = |csrf: Option<&str>| {
        let mut b = req("POST", "/api/sessions", local()).header(header::COOKIE, pair.clone());
        if let Some(c) = csrf {
            b = b.header(CSRF_HEADER, c);
        }
        b.body(Body::from("{}")).expect("req")
    };
    let (status, _, body) = send(&h.app, create(None)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("csrf"));
    assert_eq!(
        send(&h.app, create(Some("0".repeat(64).as_str()))).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        send(&h.app, create(Some(&csrf))).await.0,
        StatusCode::CREATED
    );

    // Bearer works as before, with or without a cookie, and needs no CSRF token.
    let bearer = req("POST", "/api/sessions", remote())
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::from("{}"))
        .expect("req");
    assert_eq!(send(&h.app, bearer).await.0, StatusCode::CREATED);
    // A wrong Bearer is not rescued by a good cookie.
    let wrong = req("GET", "/api/devices", local())
        .header(header::AUTHORIZATION, "Bearer nope")
        .header(header::COOKIE, pair.clone())
        .body(Body::empty())
        .expect("req");
    assert_eq!(send(&h.app, wrong).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn logout_needs_the_csrf_token_and_ends_the_login() {
    let h = hub();
    let (pair, csrf) = logged_in(&h.app).await;
    let out = |c: Option<&str>| {
        let mut b = req("POST", "/logout", local()).header(header::COOKIE, pair.clone());
        if let Some(c) = c {
            b = b.header(CSRF_HEADER, c);
        }
        b.body(Body::empty()).expect("req")
    };
    assert_eq!(send(&h.app, out(None)).await.0, StatusCode::FORBIDDEN);
    let (status, headers, _) = send(&h.app, out(Some(&csrf))).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let set = headers
        .get(header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .expect("cleared");
    assert!(
        set.starts_with("cortex_page=;") && set.contains("Max-Age=0"),
        "{set}"
    );
    let (_, _, page) = send(
        &h.app,
        req("GET", "/", local())
            .header(header::COOKIE, pair.clone())
            .body(Body::empty())
            .expect("req"),
    )
    .await;
    assert!(
        page.contains("data-test=\"login\""),
        "logged out: the form again"
    );
    let api = req("GET", "/api/devices", local())
        .header(header::COOKIE, pair)
        .body(Body::empty())
        .expect("req");
    assert_eq!(send(&h.app, api).await.0, StatusCode::UNAUTHORIZED);
}

#[test]
fn logins_expire_and_are_kept_only_as_hashes() {
    let logins = Logins::default();
    let now = Instant::now();
    let (id, csrf) = logins.start(now);
    assert_eq!(logins.csrf(&id, now).as_deref(), Some(csrf.as_str()));
    assert!(logins.csrf(&id, now + LOGIN_TTL).is_none());
    assert!(
        logins.csrf(&id, now).is_none(),
        "an expired login is forgotten"
    );
    let (id, _) = logins.start(now);
    let map = logins.by_hash.lock().expect("lock");
    assert!(map.contains_key(&secret::hash(&id)));
    assert!(map.values().all(|l| l.csrf != id));
}

#[test]
fn forms_and_cookies_parse() {
    assert_eq!(
        form_field(b"token=a%2Bb+c&x=1", "token").as_deref(),
        Some("a+b c")
    );
    assert_eq!(form_field(b"x=1", "token"), None);
    // A malformed escape is kept as it is: a wrong token, not a parse failure.
    assert_eq!(form_field(b"token=%zz", "token").as_deref(), Some("%zz"));
    assert_eq!(form_field(b"\xff=1", "token"), None);
    let mut h = HeaderMap::new();
    h.insert(
        header::COOKIE,
        HeaderValue::from_static("a=1; cortex_page=abc ; b=2"),
    );
    assert_eq!(cookie_id(&h), Some("abc"));
    assert_eq!(
        escape_html("<a href=\"x\">'&"),
        "&lt;a href=&quot;x&quot;&gt;&#39;&amp;"
    );
    assert!(login_page(Some("<b>")).contains("&lt;b&gt;"));
}

#[tokio::test]
async fn a_devices_files_route_answers_for_a_known_device_only() {
    let h = hub();
    let (pair, csrf) = logged_in(&h.app).await;
    let add = req("POST", "/api/devices", local())
        .header(header::COOKIE, pair.clone())
        .header(CSRF_HEADER, csrf)
        .body(Body::from(r#"{"name":"gpu1"}"#))
        .expect("req");
    let (status, _, body) = send(&h.app, add).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let files = |name: &str| {
        req("GET", &format!("/api/devices/{name}/files"), local())
            .header(header::COOKIE, pair.clone())
            .body(Body::empty())
            .expect("req")
    };
    let (status, _, body) = send(&h.app, files("gpu1")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, r#"{"files":[]}"#);
    assert_eq!(send(&h.app, files("nope")).await.0, StatusCode::NOT_FOUND);
}
