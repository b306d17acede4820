//! Tests of the client against servers on loopback port 0: what is sent, how answers are
//! read, how failures are classified (unreachable, TLS, bad answer), and `https://` against
//! a rustls server with a certificate made for the test.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::thread;

use super::*;
use crate::testserver::{TestServer, refused_addr, tls_server};

fn get(url: &str) -> Result<Response, HttpError> {
    Request::new(Method::Get, url).send()
}

#[test]
fn parses_urls() {
    let u = Url::parse("http://127.0.0.1:3001/webhook/signal").expect("url");
    assert_eq!(
        (u.authority.as_str(), u.path().as_str(), u.is_https()),
        ("127.0.0.1:3001", "/webhook/signal", false)
    );
    let u = Url::parse("HTTP://localhost").expect("url");
    assert_eq!(
        (u.authority.as_str(), u.path().as_str()),
        ("localhost", "/")
    );
    let u = Url::parse("http://[::1]:9/a?b=c#frag").expect("url");
    assert_eq!(
        (u.authority.as_str(), u.path().as_str()),
        ("[::1]:9", "/a?b=c")
    );
    let u = Url::parse("http://h:1?x=1").expect("url");
    assert_eq!(u.path(), "/?x=1");
    let u = Url::parse("https://hub.example:8443/webhook/signal").expect("https");
    assert!(u.is_https());
}

#[test]
fn refuses_junk_urls() {
    for bad in [
        "ftp://x",
        "127.0.0.1:3001",
        "http://",
        "http://h:0/",
        "http://h:99999/",
        "http://u@h/",
        "http://::1/",
        "http://h/a b",
    ] {
        assert!(
            matches!(Url::parse(bad), Err(HttpError::InvalidUrl { .. })),
            "{bad}"
        );
    }
    let e = Url::parse("127.0.0.1:3001").expect_err("no scheme");
    assert!(e.to_string().contains("http:// and https://"), "{e}");
}

#[test]
fn sends_the_request_and_reads_the_answer() {
    let server = TestServer::canned(vec![
        b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: 21\r\n\r\n{\"result\":\"accepted\"}".to_vec(),
    ]);
    let url = server.url("/webhook/signal");
    let resp = Request::new(Method::Post, &url)
        .header("Authorization", "Bearer tok")
        .json(br#"{"id":"wp_1"}"#)
        .send()
        .expect("send");
    assert_eq!(resp.status, 202);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    assert_eq!(resp.body, br#"{"result":"accepted"}"#);

    let req = server.next_request();
    assert_eq!(req.method, "POST");
    assert_eq!(req.path, "/webhook/signal");
    assert_eq!(req.header("authorization"), Some("Bearer tok"));
    assert_eq!(req.header("content-type"), Some("application/json"));
    assert_eq!(req.header("accept"), Some("application/json"));
    assert_eq!(req.header("host"), Some(server.addr.to_string().as_str()));
    assert!(
        req.header("user-agent")
            .is_some_and(|u| u.starts_with("cortex/")),
        "{req:?}"
    );
    assert_eq!(req.body, br#"{"id":"wp_1"}"#);
}

#[test]
fn reads_chunked_and_close_delimited_bodies() {
    let server = TestServer::canned(vec![
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n".to_vec(),
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 404 Not Found\r\n\r\n{\"error\":\"x\"}\nmore".to_vec(),
    ]);
    assert_eq!(
        get(&server.url("/")).expect("chunked").body,
        b"hello, world"
    );
    let resp = get(&server.url("/")).expect("close-delimited");
    assert_eq!(resp.status, 404);
    assert_eq!(resp.text(), "{\"error\":\"x\"}\nmore");
}

#[test]
fn a_redirect_is_an_answer_not_followed() {
    let server = TestServer::canned(vec![
        b"HTTP/1.1 301 Moved\r\nLocation: http://127.0.0.1:1/elsewhere\r\nContent-Length: 0\r\n\r\n"
            .to_vec(),
    ]);
    let resp = get(&server.url("/")).expect("answer");
    assert_eq!(resp.status, 301);
}

#[test]
fn a_large_body_refused_by_its_length_gets_the_refusal() {
    // Like the hub over 64 KB: the answer comes from the head alone, and the connection
    // closes without the body being read.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
            head.push(byte[0]);
        }
        let body = r#"{"error":"too_large","message":"over 64 KB"}"#;
        let _ = write!(
            stream,
            "HTTP/1.1 413 Payload Too Large\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        String::from_utf8_lossy(&head).into_owned()
    });
    let big = vec![b'x'; 70_000];
    let resp = Request::new(Method::Post, &format!("http://{addr}/webhook/signal"))
        .json(&big)
        .send()
        .expect("the refusal, not a failed write");
    assert_eq!(resp.status, 413);
    assert!(resp.text().contains("too_large"), "{}", resp.text());
    let head = server.join().expect("server");
    assert!(
        head.to_ascii_lowercase().contains("expect: 100-continue"),
        "{head}"
    );
}

#[test]
fn no_body_for_204() {
    let server = TestServer::canned(vec![b"HTTP/1.1 204 No Content\r\n\r\n".to_vec()]);
    let resp = Request::new(Method::Delete, &server.url("/x"))
        .send()
        .expect("send");
    assert_eq!(resp.status, 204);
    assert!(resp.body.is_empty());
    assert_eq!(server.next_request().method, "DELETE");
}

#[test]
fn connection_refused_is_unreachable() {
    let url = format!("http://{}/", refused_addr());
    let e = get(&url).expect_err("refused");
    assert!(e.is_unreachable(), "{e}");
    assert!(e.to_string().contains("connection refused"), "{e}");
    assert!(e.never_sent(), "a refused connection saw nothing: {e}");
}

#[test]
fn an_unknown_host_is_unreachable() {
    // `.invalid` never resolves (RFC 2606).
    let e = get("http://cortex-hub.invalid:3001/").expect_err("no such host");
    assert!(e.is_unreachable(), "{e}");
    assert!(e.never_sent(), "{e}");
}

#[test]
fn close_before_a_status_line_is_unreachable() {
    let server = TestServer::canned(vec![Vec::new()]);
    let e = get(&server.url("/")).expect_err("closed");
    assert!(e.is_unreachable(), "{e}");
    assert!(!e.never_sent(), "the server may have seen it: {e}");
}

#[test]
fn silence_before_a_status_line_is_unreachable() {
    let server = TestServer::silent();
    let e = Request::new(Method::Get, &server.url("/"))
        .timeout(Duration::from_millis(100))
        .send()
        .expect_err("silent");
    assert!(e.is_unreachable(), "{e}");
    assert!(e.to_string().contains("no answer within 100ms"), "{e}");
    assert!(!e.never_sent(), "the server may have seen it: {e}");
}

#[test]
fn garbage_and_short_bodies_are_protocol_errors() {
    let server = TestServer::canned(vec![
        b"SSH-2.0-OpenSSH\r\n\r\n".to_vec(),
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc".to_vec(),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec(),
    ]);
    for what in ["not HTTP", "short body", "bad chunk"] {
        let e = get(&server.url("/")).expect_err(what);
        assert!(matches!(e, HttpError::Protocol { .. }), "{what}: {e}");
    }
}

#[test]
fn refuses_header_injection() {
    let e = Request::new(Method::Get, "http://127.0.0.1:1/")
        .header("X-A", "a\r\nX-B: b")
        .send()
        .expect_err("injection");
    assert!(matches!(e, HttpError::InvalidRequest { .. }), "{e}");
}

#[test]
fn https_works_with_a_trusted_certificate() {
    let (port, cert) = tls_server();
    for host in ["localhost", "127.0.0.1"] {
        let url = format!("https://{host}:{port}/api/sessions");
        let resp = Request::new(Method::Get, &url)
            .trust(Trust::Only(Arc::new(vec![cert.clone()])))
            .send()
            .expect("https");
        assert_eq!((resp.status, resp.text().as_ref()), (200, r#"{"ok":true}"#));
    }
}

#[test]
fn an_untrusted_certificate_is_a_clear_tls_error() {
    let (port, _) = tls_server();
    let url = format!("https://localhost:{port}/");
    // This machine's store does not hold the test's certificate.
    let e = get(&url).expect_err("untrusted");
    assert!(matches!(e, HttpError::Tls { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("SSL_CERT_FILE"), "{msg}");
    assert!(!e.is_unreachable());
}

#[test]
fn https_to_a_plain_http_server_is_a_tls_error() {
    // A plain HTTP server answers a TLS hello with a 400 of its own.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    thread::spawn(move || {
        if let Ok((mut stream, _)) = listener.accept() {
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n");
            let mut sink = [0u8; 1024];
            let _ = stream.read(&mut sink);
        }
    });
    let e = Request::new(Method::Get, &format!("https://{addr}/"))
        .trust(Trust::Only(Arc::new(Vec::new())))
        .send()
        .expect_err("not TLS");
    assert!(matches!(e, HttpError::Tls { .. }), "{e}");
    assert!(e.to_string().contains("http://"), "{e}");
}
