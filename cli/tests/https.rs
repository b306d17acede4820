//! `cortex-signal` to an `https://` hub, as a job runs it: the real binary, trusting the
//! test's certificate through `SSL_CERT_FILE` (the CA-store override rustls-native-certs
//! honours), against a rustls server on loopback port 0 that answers 202.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::Arc;
use std::sync::mpsc::channel;
use std::thread;
use std::time::Duration;

#[test]
fn cortex_signal_delivers_over_https_to_a_hub_this_machine_trusts() {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, made.cert.pem()).expect("write the certificate");
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(vec![made.cert.der().clone()], key)
    .expect("server config");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (tx, rx) = channel();
    thread::spawn(move || {
        let Ok((stream, _)) = listener.accept() else {
            return;
        };
        let conn = rustls::ServerConnection::new(Arc::new(config)).expect("conn");
        let mut tls = rustls::StreamOwned::new(conn, stream);
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        // The head, then the body's Content-Length bytes.
        loop {
            let n = tls.read(&mut buf).unwrap_or(0);
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_string())
                    })
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                if body.len() >= len {
                    break;
                }
            }
        }
        let body = r#"{"result":"accepted","waitpoint":"wp_t","state":"resolved"}"#;
        let _ = write!(
            tls,
            "HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = tls.flush();
        tls.conn.send_close_notify();
        let _ = tls.flush();
        let _ = tx.send(String::from_utf8_lossy(&got).into_owned());
    });

    let out = Command::new(env!("CARGO_BIN_EXE_cortex-signal"))
        .args(["--exit-code", "0", "--no-spool", "--url"])
        .arg(format!("https://localhost:{port}/webhook/signal"))
        .env("CORTEX_SIGNAL_ID", "wp_t")
        .env("CORTEX_SIGNAL_SECRET", "s3cr3t-for-the-test")
        .env("CORTEX_HOME", dir.path().join("home"))
        .env("SSL_CERT_FILE", &ca_file)
        .env_remove("SSL_CERT_DIR")
        .output()
        .expect("run cortex-signal");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(stderr, "", "an accepted signal is quiet");
    let request = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the server saw the request");
    assert!(
        request.starts_with("POST /webhook/signal HTTP/1.1\r\n"),
        "{request}"
    );
    assert!(request.contains(r#""id":"wp_t""#), "{request}");
}
