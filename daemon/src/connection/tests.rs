//! A connection's two ends over an in-memory pipe: frames both ways, liveness, the
//! closing handshake, and what is not a frame.

use cortex_protocol::mesh::{AgentFrame, FileOutcome, FrameError, HubFrame, MAX_MESSAGE_BYTES};
use tokio::io::DuplexStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::protocol::frame::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Bytes, Message};

use super::*;

async fn pair() -> (Connection<DuplexStream>, Connection<DuplexStream>) {
    let (a, b) = tokio::io::duplex(4 * MAX_MESSAGE_BYTES);
    let agent = WebSocketStream::from_raw_socket(a, Role::Client, Some(ws_config())).await;
    let hub = WebSocketStream::from_raw_socket(b, Role::Server, Some(ws_config())).await;
    (Connection::new(agent), Connection::new(hub))
}

fn file(name: &str) -> AgentFrame {
    AgentFrame::File {
        name: name.into(),
        body: "{}".into(),
    }
}

#[tokio::test]
async fn frames_cross_both_ways_and_pings_count_as_alive() {
    let (mut agent, mut hub) = pair().await;
    agent.send(&file("a.json")).await.expect("send");
    match hub.next::<AgentFrame>().await.expect("read") {
        Some(Incoming::Frame(f)) => assert_eq!(f, file("a.json")),
        other => panic!("{other:?}"),
    }
    let ack = HubFrame::Ack {
        name: "a.json".into(),
        outcome: FileOutcome::Accepted,
    };
    hub.send(&ack).await.expect("send");
    hub.ping().await.expect("ping");
    assert_eq!(
        agent.next::<HubFrame>().await.expect("read"),
        Some(Incoming::Frame(ack))
    );
    assert_eq!(
        agent.next::<HubFrame>().await.expect("read"),
        Some(Incoming::Alive)
    );
}

#[tokio::test]
async fn a_burst_fed_through_the_sink_arrives_in_order_after_one_flush() {
    let (agent, mut hub) = pair().await;
    let (mut sink, _stream) = agent.split();
    for i in 0..5 {
        sink.feed(file(&format!("{i}.json")).encode().expect("encode"))
            .await
            .expect("feed");
    }
    sink.flush().await.expect("flush");
    for i in 0..5 {
        match hub.next::<AgentFrame>().await.expect("read") {
            Some(Incoming::Frame(f)) => assert_eq!(f, file(&format!("{i}.json"))),
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn a_close_frame_is_reported_with_its_reason_and_then_the_end() {
    let (agent, mut hub) = pair().await;
    let (mut sink, mut stream) = agent.split();
    sink.close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "bye".into(),
    }))
    .await;
    match hub.next::<AgentFrame>().await.expect("read") {
        Some(Incoming::Closed(Some(f))) => assert_eq!(f.reason.as_str(), "bye"),
        other => panic!("{other:?}"),
    }
    // Reading on, the hub's side sends the answer tungstenite queued, and ends; the agent
    // then sees that answer, and the end once the hub lets go of the socket.
    assert!(hub.next::<AgentFrame>().await.expect("end").is_none());
    // The server closes the socket (RFC 6455); the client waits for that.
    drop(hub);
    assert!(matches!(
        stream.next::<HubFrame>().await.expect("read"),
        Some(Incoming::Closed(_))
    ));
    assert!(stream.next::<HubFrame>().await.expect("end").is_none());
}

#[tokio::test]
async fn text_and_undecodable_messages_are_errors_of_their_own() {
    let (mut agent, mut hub) = pair().await;
    agent
        .send_message(Message::Text("hello".into()))
        .await
        .expect("text");
    assert!(matches!(
        hub.next::<AgentFrame>().await,
        Err(ConnectionError::Text)
    ));
    agent
        .send_message(Message::Binary(Bytes::from_static(&[0xc1])))
        .await
        .expect("junk");
    assert!(matches!(
        hub.next::<AgentFrame>().await,
        Err(ConnectionError::Frame(FrameError::Malformed(_)))
    ));
}

#[tokio::test]
async fn an_oversized_frame_is_refused_before_it_is_sent_or_read() {
    let (mut agent, mut hub) = pair().await;
    let big = AgentFrame::File {
        name: "big.json".into(),
        body: "x".repeat(MAX_MESSAGE_BYTES),
    };
    assert!(matches!(
        agent.send(&big).await,
        Err(ConnectionError::Frame(FrameError::TooLarge { .. }))
    ));
    // Nothing went: the next thing the hub reads is the next frame.
    agent.send(&file("after.json")).await.expect("send");
    assert_eq!(
        hub.next::<AgentFrame>().await.expect("read"),
        Some(Incoming::Frame(file("after.json")))
    );
    // A message over the cap from a peer that skips the check: the WebSocket layer
    // refuses it.
    agent
        .send_message(Message::Binary(vec![0; MAX_MESSAGE_BYTES + 1].into()))
        .await
        .expect("raw");
    assert!(matches!(
        hub.next::<AgentFrame>().await,
        Err(ConnectionError::Ws(_))
    ));
}
