//! The hub under a hostile local user or a careless operator: its files are private
//! whatever the umask, every refusal is the one JSON error shape (framework errors
//! included), every stored field has a cap, and idle or slowloris connections neither
//! stay open nor crowd out a well-behaved signal.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use cortex_tests::{Hub, wait_until};
use serde_json::{Value, json};

#[test]
fn the_hubs_directory_and_files_are_private_whatever_the_umask() {
    // A wide umask, as a login shell has: the hub must not inherit it.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
    let mut hub = Hub::start();
    // A session, so the store has written; then a clean stop, so every file exists.
    hub.session();
    assert!(hub.stop().success());
    let mode = |rel: &str| {
        let p = hub.home.join(rel);
        let m = std::fs::metadata(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode();
        m & 0o777
    };
    assert_eq!(mode("hub"), 0o700, "hub/");
    let files: &[&str] = if cortex_tests::on_postgres() {
        // The store is in the database: none of its files is under the home.
        assert!(!hub.home.join("hub/hub.redb").exists());
        &["hub/token"]
    } else {
        &[
            "hub/hub.redb",
            "hub/hub.journal",
            "hub/hub.journal2",
            "hub/token",
        ]
    };
    for f in files {
        assert_eq!(mode(f), 0o600, "{f}");
    }
}

/// Sends `request` on a fresh connection and reads the answer to its end (every request
/// here closes its connection, or the hub does); returns the status and the JSON body.
fn raw(addr: &str, request: &[u8]) -> (u16, Value) {
    let to: std::net::SocketAddr = addr.parse().expect("addr");
    let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(10)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    // The hub may answer before the whole request is sent, and close.
    let _ = s.write_all(request);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let v = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("{status}: the body is not JSON ({e}): {body:?}"));
    (status, v)
}

fn assert_error(what: &str, (status, v): (u16, Value), want: u16) {
    assert_eq!(status, want, "{what}: {v}");
    assert!(
        v["error"].as_str().is_some_and(|e| !e.is_empty())
            && v["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: not the error shape: {v}"
    );
}

#[test]
fn every_refusal_is_the_json_error_shape_framework_errors_included() {
    let hub = Hub::start();
    let sid = hub.session();
    let a = hub.addr.as_str();
    let auth = format!("Authorization: Bearer {}\r\n", hub.token);
    let get = |target: &str, extra: &str| {
        format!("GET {target} HTTP/1.1\r\nHost: localhost\r\n{extra}Connection: close\r\n\r\n")
            .into_bytes()
    };

    assert_error("unknown route", raw(a, &get("/nope", "")), 404);
    assert_error(
        "wrong method",
        raw(
            a,
            b"PUT /webhook/signal HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        ),
        405,
    );
    assert_error(
        "bad query string",
        raw(
            a,
            &get(&format!("/api/sessions/{sid}/events?after=abc"), &auth),
        ),
        400,
    );
    assert_error(
        "bad path encoding",
        raw(a, &get("/api/waitpoints/%FF%FE", &auth)),
        400,
    );
    assert_error(
        "long URI",
        raw(a, &get(&format!("/api/{}", "a".repeat(10_000)), "")),
        414,
    );
    assert_error(
        "URI past hyper's buffer",
        raw(a, &get(&format!("/{}", "a".repeat(100_000)), "")),
        431,
    );
    assert_error(
        "one large header",
        raw(
            a,
            &get("/healthz", &format!("X-Big: {}\r\n", "a".repeat(40_000))),
        ),
        431,
    );
    let many: String = (0..150).map(|i| format!("X-H{i}: 1\r\n")).collect();
    assert_error("150 headers", raw(a, &get("/healthz", &many)), 431);
    assert_error("not HTTP", raw(a, b"GARBAGE\r\n\r\n"), 400);

    // A body over the limit, announced, and one sent chunked without a length.
    let big = "a".repeat(2 * 1024 * 1024);
    let announced = format!(
        "POST /api/sessions HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{big}",
        big.len()
    );
    assert_error("body over the limit", raw(a, announced.as_bytes()), 413);
    let chunk = "a".repeat(64 * 1024);
    let mut chunked = format!(
        "POST /api/sessions HTTP/1.1\r\nHost: localhost\r\n{auth}Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    for _ in 0..32 {
        chunked.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
    }
    chunked.push_str("0\r\n\r\n");
    assert_error(
        "chunked body over the limit",
        raw(a, chunked.as_bytes()),
        413,
    );
    // The signal route's own 64 KB stays.
    let over = format!(
        "{{\"id\":\"wp_000000000000\",\"secret\":\"x\",\"data\":\"{}\"}}",
        "d".repeat(70_000)
    );
    let post = format!(
        "POST /webhook/signal HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{over}",
        over.len()
    );
    assert_error("signal body over 64 KB", raw(a, post.as_bytes()), 413);
}

/// True once the hub closed `s` (end of stream or reset); reads what it answered.
fn closed_by_hub(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[test]
fn idle_and_slowloris_connections_are_closed_but_a_long_poll_is_not() {
    let hub = Hub::start();
    let sid = hub.session();
    // A long poll longer than the header timeout, in flight the whole time.
    let poll = {
        let (addr, token, sid) = (hub.addr.clone(), hub.token.clone(), sid.clone());
        std::thread::spawn(move || {
            let req = format!(
                "GET /api/sessions/{sid}/events?after=0&wait=14 HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
            );
            let mut s = TcpStream::connect(&addr).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(60)))
                .expect("timeout");
            s.write_all(req.as_bytes()).expect("write");
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            out
        })
    };
    let mut idle = TcpStream::connect(&hub.addr).expect("connect");
    let mut slow = TcpStream::connect(&hub.addr).expect("connect");
    slow.write_all(b"POST /webhook/signal HTTP/1.1\r\nHost: localhost\r\n")
        .expect("write");
    for s in [&idle, &slow] {
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .expect("timeout");
    }
    let start = Instant::now();
    let (mut idle_closed, mut slow_closed) = (false, false);
    let mut sent = 0;
    while !(idle_closed && slow_closed) {
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "after {:?}: idle closed {idle_closed}, slowloris closed {slow_closed}",
            start.elapsed()
        );
        if !slow_closed {
            // One header line a second, never the blank line that ends the head.
            let _ = slow.write_all(format!("X-Slow-{sent}: 1\r\n").as_bytes());
            sent += 1;
        }
        idle_closed = idle_closed || closed_by_hub(&mut idle);
        slow_closed = slow_closed || closed_by_hub(&mut slow);
    }
    eprintln!(
        "idle and slowloris ({sent} header lines) closed by the hub after {:?}",
        start.elapsed()
    );
    let out = poll.join().expect("long poll");
    assert!(
        out.starts_with("HTTP/1.1 200") && out.contains("\"events\""),
        "the long poll was cut: {out:?}"
    );
}

#[test]
fn thousands_of_idle_connections_do_not_crowd_out_a_signal_or_the_spool() {
    // Room for this test's own sockets.
    cortex_tests::raise_nofile();
    // The hub gets 1,024 descriptors: far fewer than the connections thrown at it.
    let hub = Hub::start_with_nofile(1024);
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "flood", "intent": "signals through a flood", "max_signals": 5}),
    );
    let (idle_n, slow_n) = (3_000, 200);
    let mut socks = Vec::new();
    let mut refused = 0;
    let addr: std::net::SocketAddr = hub.addr.parse().expect("addr");
    let start = Instant::now();
    for i in 0..idle_n + slow_n {
        // Bounded: a hub that stopped accepting makes every connect wait for its timeout.
        if refused >= 10 || start.elapsed() > Duration::from_secs(60) {
            break;
        }
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(mut s) => {
                if i >= idle_n {
                    let _ = s.write_all(
                        b"POST /webhook/signal HTTP/1.1\r\nHost: localhost\r\nX-A: 1\r\n",
                    );
                }
                socks.push(s);
            }
            Err(_) => refused += 1,
        }
    }
    // A well-behaved signal, bounded: a plain POST, then `cortex-signal --no-spool`.
    let signal =
        json!({"id": wp["id"], "secret": wp["secret"], "status": "progress", "message": "through"})
            .to_string();
    let post = format!(
        "POST /webhook/signal HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{signal}",
        signal.len()
    );
    let (status, v) = raw(&hub.addr, post.as_bytes());
    assert_eq!(status, 202, "{v}");
    let url = hub.url("/webhook/signal");
    let (code, _, err) = cortex_tests::run(
        "cortex-signal",
        &[
            "--id",
            wp["id"].as_str().expect("id"),
            "--secret",
            wp["secret"].as_str().expect("secret"),
            "--status",
            "progress",
            "--url",
            &url,
            "--no-spool",
        ],
        &[],
    );
    assert_eq!(code, 0, "cortex-signal: {err}");
    // The spool still opens files: no descriptor famine.
    let spool = hub.spool();
    let tmp = spool.join("flood.tmp");
    std::fs::write(&tmp, &signal).expect("write");
    std::fs::rename(&tmp, spool.join("flood.json")).expect("rename");
    let id = wp["id"].as_str().expect("id").to_string();
    wait_until(Duration::from_secs(20), "the spool file's signal", || {
        (hub.get_waitpoint(&id)["signal_count"] == 3).then_some(())
    });
    let mut closed = 0;
    for s in &mut socks {
        s.set_nonblocking(true).expect("nonblocking");
        closed += usize::from(closed_by_hub(s));
    }
    eprintln!(
        "{} connections opened ({idle_n} idle, {slow_n} slowloris; {refused} not connected), {closed} already closed by the hub; signals and the spool answered",
        socks.len()
    );
    assert!(
        hub.log().contains("API connection cap reached"),
        "{}",
        hub.log()
    );
}

#[test]
fn every_stored_field_has_a_cap_and_over_it_is_a_413_naming_it() {
    use cortex_cli::http::Method;
    let hub = Hub::start();
    let refused = |path: &str, body: Value, field: &str, cap: &str| {
        let (st, v) = hub.api(Method::Post, path, Some(&body));
        assert_eq!(
            (st, v["error"].as_str()),
            (413, Some("too_large")),
            "{field}: {v}"
        );
        let m = v["message"].as_str().expect("message");
        assert!(m.contains(field) && m.contains(cap), "{field}: {m}");
    };
    // At the cap is fine; one over is refused.
    let (st, v) = hub.api(
        Method::Post,
        "/api/sessions",
        Some(&json!({"title": "t".repeat(200)})),
    );
    assert_eq!(st, 201, "{v}");
    refused(
        "/api/sessions",
        json!({"title": "t".repeat(201)}),
        "title",
        "200",
    );
    refused(
        "/api/sessions",
        json!({"title": "t".repeat(500_000)}),
        "title",
        "200",
    );
    // 2 MB is over any body's cap before its fields are read.
    refused(
        "/api/sessions",
        json!({"title": "t".repeat(2_000_000)}),
        "body",
        "1048576",
    );

    let sid = hub.session();
    let msgs = format!("/api/sessions/{sid}/messages");
    let (st, v) = hub.api(
        Method::Post,
        &msgs,
        Some(&json!({"text": "m".repeat(65_536)})),
    );
    assert_eq!(st, 201, "{v}");
    refused(&msgs, json!({"text": "m".repeat(65_537)}), "text", "65536");
    refused(
        &msgs,
        json!({"text": "hi", "dedupe_key": "k".repeat(201)}),
        "dedupe_key",
        "200",
    );

    let wps = format!("/api/sessions/{sid}/waitpoints");
    let wp = |extra: Value| {
        let mut b = json!({"label": "l", "intent": "i"});
        for (k, v) in extra.as_object().expect("object") {
            b[k] = v.clone();
        }
        b
    };
    refused(&wps, wp(json!({"label": "l".repeat(201)})), "label", "200");
    refused(
        &wps,
        wp(json!({"intent": "i".repeat(4_001)})),
        "intent",
        "4000",
    );
    let many: Vec<String> = (0..257).map(|i| format!("m{i}")).collect();
    refused(&wps, wp(json!({"members": many})), "members", "256");
    refused(
        &wps,
        wp(json!({"members": ["a".repeat(65)]})),
        "member name",
        "64",
    );
    refused(&wps, wp(json!({"device": "d".repeat(65)})), "device", "64");

    refused(
        "/api/devices",
        json!({"name": "d".repeat(65)}),
        "name",
        "64",
    );
    let (st, v) = hub.api(Method::Post, "/api/devices", Some(&json!({"name": "gpu1"})));
    assert_eq!(st, 201, "{v}");
    let waits = "/api/devices/gpu1/waits";
    refused(
        waits,
        json!({"kind": "pid", "pid": 1, "label": "l".repeat(201)}),
        "label",
        "200",
    );
    refused(
        waits,
        json!({"kind": "pid", "pid": 1, "intent": "i".repeat(4_001)}),
        "intent",
        "4000",
    );
}

#[test]
fn a_devices_wrong_secrets_past_the_budget_are_held_back_and_logged_once() {
    use cortex_cli::http::Method;
    use cortex_protocol::mesh::FileOutcome;
    use cortex_tests::sim::{Options, SimDevice, file_body};
    let hub = Hub::start();
    let (st, v) = hub.api(
        Method::Post,
        "/api/devices",
        Some(&json!({"name": "rogue"})),
    );
    assert_eq!(st, 201, "{v}");
    let token = v["token"].as_str().expect("token").to_string();
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "l", "intent": "i", "max_signals": 5}));
    let id = wp["id"].as_str().expect("id");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (mut refused, mut held) = (0, 0);
    rt.block_on(async {
        let mut dev = SimDevice::connect(&Options::new(&hub.mesh_url, "rogue", &token))
            .await
            .expect("connect");
        let wrong = file_body(id, &"0".repeat(64), &[]);
        // In rounds under the window (64 unacknowledged files).
        for round in 0..5 {
            for i in 0..40 {
                dev.send_file(&format!("bad-{round}-{i}.json"), &wrong)
                    .await;
            }
            for _ in 0..40 {
                match dev.ack(Duration::from_secs(20)).await.1 {
                    FileOutcome::Refused { .. } => refused += 1,
                    FileOutcome::Retry { reason } => {
                        assert!(reason.contains("sent again later"), "{reason}");
                        held += 1;
                    }
                    other => panic!("a wrong secret answered {other:?}"),
                }
            }
        }
        // The right secret still goes through at once.
        let good = file_body(
            id,
            wp["secret"].as_str().expect("secret"),
            &[("status", "progress")],
        );
        dev.send_file("good.json", &good).await;
        assert_eq!(
            dev.ack(Duration::from_secs(20)).await.1,
            FileOutcome::Accepted
        );
    });
    assert_eq!(
        (refused, held),
        (60, 140),
        "60 parked, the rest kept for later"
    );
    let lines = hub.log().matches("device spool file refused").count();
    assert_eq!(
        lines,
        1,
        "one warning line for 200 wrong secrets:\n{}",
        hub.log()
    );
}

/// A page on another site that resolves its own name to 127.0.0.1 (DNS rebinding) sends
/// that name as the Host: the hub answers only to its own names, on every route.
#[test]
fn a_request_for_a_name_the_hub_does_not_serve_is_refused_on_every_route() {
    let tmp = tempfile::tempdir().expect("tmp");
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    std::fs::write(
        home.join("settings.json"),
        r#"{"allowedHosts": ["hub.internal"]}"#,
    )
    .expect("settings.json");
    let mut hub = Hub::at(&home, &tmp.path().join("hub.log"), &[], &[]);
    hub.spawn();
    let port = hub.addr.rsplit(':').next().expect("port").to_string();
    let get = |path: &str, host: Option<&str>| {
        let host = host.map_or(String::new(), |h| format!("Host: {h}\r\n"));
        let version = if host.is_empty() { "1.0" } else { "1.1" };
        let req = format!("GET {path} HTTP/{version}\r\n{host}Connection: close\r\n\r\n");
        let to: std::net::SocketAddr = hub.addr.parse().expect("addr");
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(10)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let _ = s.write_all(req.as_bytes());
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out).to_string();
        let status: u16 = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {text:?}"));
        (status, text)
    };
    let evil = format!("evil.example:{port}");
    for path in [
        "/healthz",
        "/metrics",
        "/",
        "/api/sessions",
        "/webhook/signal",
    ] {
        let (status, text) = get(path, Some(&evil));
        assert_eq!(status, 421, "{path}: {text}");
        assert!(text.contains("\"unknown_host\""), "{path}: {text}");
        assert!(text.contains("allowedHosts"), "{path}: {text}");
    }
    let local = format!("localhost:{port}");
    let internal = format!("hub.internal:{port}");
    for host in [
        Some(hub.addr.as_str()),
        Some(&local),
        Some(&internal),
        Some("[::1]"),
        None,
    ] {
        let (status, text) = get("/healthz", host);
        assert_eq!(status, 200, "{host:?}: {text}");
    }
    assert!(
        hub.log()
            .contains("refused a request for a name this hub does not serve")
    );
}

/// A start after a SIGKILL says what the recovery does, and takes connections only once
/// the store is open: the listen line (and the bound port) come after "the store is open".
#[test]
fn a_start_after_a_kill_listens_only_once_the_store_is_open() {
    let mut hub = Hub::start();
    hub.session();
    hub.kill();
    hub.spawn();
    let log = hub.log();
    let second = log
        .rfind("opening the store")
        .expect("the second start says it opens the store");
    let tail = &log[second..];
    let open = tail.find("the store is open").expect("the store is open");
    let listening = tail.find("cortex-hub listening on").expect("listening");
    assert!(open < listening, "{tail}");
    // A repair, should redb need one, is said while the store opens.
    if let Some(repair) = tail.find("repairing the store after a stop that was not clean") {
        assert!(repair < open, "{tail}");
    }
    assert!(hub.session().starts_with("ses_"), "and it serves");
}
