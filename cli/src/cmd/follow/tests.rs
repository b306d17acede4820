//! The follower against small SSE servers on port 0: resuming after the last stored event
//! when the stream drops, a session gone at the reconnect, and silence bounded.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::mpsc::channel;
use std::time::Duration;

use super::*;
use crate::testserver::{TestServer, json};

/// An SSE answer whose body is `body`, ended by closing the connection.
pub fn sse_answer(body: &str) -> Vec<u8> {
    format!("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n{body}")
        .into_bytes()
}

fn hub(server: &TestServer) -> Hub {
    Hub::new(&server.url(""), "tok").expect("hub")
}

fn seqs(items: &[Item]) -> Vec<String> {
    items
        .iter()
        .map(|i| match i {
            Item::Message(m) => format!("{}:{}", m.event, m.id.clone().unwrap_or_default()),
            Item::Dropped { .. } => "dropped".to_string(),
            Item::Back => "back".to_string(),
        })
        .collect()
}

#[test]
fn a_dropped_stream_resumes_after_the_last_stored_event() {
    let server = TestServer::canned(vec![
        // Cut in the middle of event 6: it is read again whole after the reconnect.
        sse_answer(
            "event: event\nid: 5\ndata: {}\n\nevent: live\ndata: {}\n\nevent: event\nid: 6\nda",
        ),
        sse_answer("event: event\nid: 5\ndata: {}\n\nevent: event\nid: 6\ndata: {}\n\n"),
        json(404, r#"{"error":"not_found","message":"no session ses_1"}"#),
    ]);
    let mut f = Follow::open(&hub(&server), "ses_1", 4).expect("open");
    let mut items = Vec::new();
    let end = loop {
        match f.next_item() {
            Ok(i) => items.push(i),
            Err(e) => break e,
        }
    };
    assert_eq!(
        seqs(&items),
        ["event:5", "live:", "dropped", "back", "event:6", "dropped"],
        "event 5 is not delivered twice"
    );
    assert!(matches!(end, FollowError::Gone { .. }), "{end}");
    assert_eq!(f.cursor(), 6);
    let paths: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        [
            "/api/sessions/ses_1/events?after=4",
            "/api/sessions/ses_1/events?after=5",
            "/api/sessions/ses_1/events?after=6",
        ]
    );
}

#[test]
fn the_stream_is_asked_for_as_sse_with_the_token() {
    let server = TestServer::canned(vec![sse_answer("")]);
    Follow::open(&hub(&server), "ses_1", 0).expect("open");
    let req = server.next_request();
    assert_eq!(req.header("accept"), Some("text/event-stream"));
    assert_eq!(req.header("authorization"), Some("Bearer tok"));
}

#[test]
fn an_unknown_session_is_gone_at_once() {
    let server = TestServer::canned(vec![json(
        404,
        r#"{"error":"not_found","message":"no session ses_x"}"#,
    )]);
    let e = Follow::open(&hub(&server), "ses_x", 0).err().expect("gone");
    assert!(matches!(e, FollowError::Gone { .. }), "{e}");
}

#[test]
fn silence_past_the_bound_is_a_drop() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (done_tx, done_rx) = channel::<()>();
    std::thread::spawn(move || {
        // The first connection: a head, then nothing, held open until the test ends.
        let Ok((mut first, _)) = listener.accept() else {
            return;
        };
        let mut buf = [0u8; 4096];
        let _ = first.read(&mut buf);
        let _ = first.write_all(&sse_answer(""));
        // The second: the session is gone.
        if let Ok((mut second, _)) = listener.accept() {
            let _ = second.read(&mut buf);
            let _ = second.write_all(&json(404, r#"{"error":"not_found","message":"gone"}"#));
        }
        let _ = done_rx.recv_timeout(Duration::from_secs(30));
    });
    let hub = Hub::new(&format!("http://{addr}"), "tok").expect("hub");
    let mut f = Follow::open(&hub, "ses_1", 0)
        .expect("open")
        .with_idle(Duration::from_millis(200));
    match f.next_item() {
        Ok(Item::Dropped { reason }) => assert!(reason.contains("nothing for"), "{reason}"),
        other => panic!("expected a drop, got {other:?}"),
    }
    let e = f.next_item().expect_err("gone");
    assert!(matches!(e, FollowError::Gone { .. }), "{e}");
    let _ = done_tx.send(());
}

#[test]
fn notes_go_apart_from_the_text() {
    let (mut text, mut notes) = (Vec::new(), Vec::new());
    let mut screen = Screen {
        text: &mut text,
        notes: Some(&mut notes),
        dim: true,
    };
    screen
        .put(&[
            Out::Text("a".into()),
            Out::Reasoning("r".into()),
            Out::Note("→ x".into()),
        ])
        .expect("write");
    assert_eq!(String::from_utf8_lossy(&text), "a\x1b[2mr\x1b[0m");
    assert_eq!(String::from_utf8_lossy(&notes), "→ x\n");
}
