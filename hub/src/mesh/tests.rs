use std::collections::HashMap;
use std::sync::Arc;

use cortex_protocol::mesh::{CloseReason, HostFacts, SpoolCounts};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::link::close_frame;
use super::{MeshSetup, public_url, tls, url};
use crate::registry::{End, Link, Registry};
use crate::secret;

fn link(reg: &Registry, device: &str) -> Arc<Link> {
    Arc::new(Link::new(
        reg.next_link_id(),
        device.into(),
        "0.1".into(),
        HostFacts::default(),
        SpoolCounts::default(),
        1,
    ))
}

#[test]
fn only_the_stored_token_authenticates() {
    let reg = Registry::default();
    let token = secret::random_hex(32);
    reg.load([("gpu1".to_string(), secret::hash(&token))]);
    assert_eq!(reg.authenticate("gpu1", &token), Ok(secret::hash(&token)));
    assert!(reg.authenticate("gpu1", "wrong").is_err());
    assert!(reg.authenticate("gpu1", "").is_err());
    assert!(reg.authenticate("gpu2", &token).is_err());
    reg.allow("gpu2", secret::hash("t2"));
    assert!(reg.authenticate("gpu2", "t2").is_ok());
}

#[test]
fn a_second_link_replaces_the_first_and_the_first_cannot_unregister_it() {
    let reg = Registry::default();
    let h = secret::hash("t");
    reg.allow("d", h);
    let a = link(&reg, "d");
    assert!(reg.register(a.clone(), &h).expect("first").is_none());
    let b = link(&reg, "d");
    let old = reg.register(b.clone(), &h).expect("second").expect("old");
    assert_eq!(old.id, a.id);
    assert_eq!(a.ended_with(), Some(End::Replaced));
    assert_eq!(b.ended_with(), None);
    // The replaced link's end leaves its successor in place.
    reg.unregister("d", a.id);
    assert_eq!(reg.link("d").map(|l| l.id), Some(b.id));
    reg.unregister("d", b.id);
    assert!(reg.link("d").is_none());
}

#[test]
fn revoke_ends_the_live_link_and_blocks_a_late_registration() {
    let reg = Registry::default();
    let h = secret::hash("t");
    reg.allow("d", h);
    let a = link(&reg, "d");
    reg.register(a.clone(), &h).expect("registered");
    assert!(reg.revoke("d"));
    assert_eq!(a.ended_with(), Some(End::Revoked));
    assert!(reg.link("d").is_none());
    // A link that authenticated before the revoke but registers after it is refused.
    assert!(reg.register(link(&reg, "d"), &h).is_err());
    assert!(!reg.revoke("d"), "nothing left to drop");
    // A new token is a new device: the old hash no longer registers.
    reg.allow("d", secret::hash("t2"));
    assert!(reg.register(link(&reg, "d"), &h).is_err());
}

#[test]
fn the_first_end_reason_wins_and_rescans_reach_every_link() {
    let reg = Registry::default();
    let h = secret::hash("t");
    for d in ["a", "b"] {
        reg.allow(d, h);
        reg.register(link(&reg, d), &h).expect("registered");
    }
    assert_eq!(reg.rescan_all(), 2);
    let a = reg.link("a").expect("a");
    a.end(End::PingTimeout);
    a.end(End::Shutdown);
    assert_eq!(a.ended_with(), Some(End::PingTimeout));
    a.seen(50);
    a.seen(40);
    assert_eq!(a.last_seen(), 50, "last seen never goes back");
    reg.end_all(End::Shutdown);
    assert_eq!(
        reg.link("b").and_then(|l| l.ended_with()),
        Some(End::Shutdown)
    );
}

#[test]
fn offline_reasons_read_as_the_contract_says() {
    assert_eq!(End::PingTimeout.reason(), "ping timed out");
    assert_eq!(End::ClosedByAgent.reason(), "closed by the agent");
    assert_eq!(End::Revoked.reason(), "revoked");
    assert_eq!(End::Replaced.reason(), "replaced by a new connection");
    assert_eq!(End::Protocol("x".into()).reason(), "protocol error: x");
}

#[test]
fn close_frames_fit_the_123_byte_limit() {
    let r = CloseReason {
        code: "protocol_error".into(),
        message: "é".repeat(200),
        retry_after_ms: Some(1000),
    };
    let f = close_frame(CloseCode::Protocol, &r);
    assert!(f.reason.len() <= 123, "{}", f.reason.len());
    let back: CloseReason = serde_json::from_str(f.reason.as_str()).expect("still JSON");
    assert_eq!(back.code, "protocol_error");
    assert_eq!(back.retry_after_ms, Some(1000));
    assert!(back.message.starts_with('é'));
    let short = CloseReason {
        code: "revoked".into(),
        message: "bye".into(),
        retry_after_ms: None,
    };
    let f = close_frame(CloseCode::Policy, &short);
    assert_eq!(f.reason.as_str(), r#"{"code":"revoked","message":"bye"}"#);
}

#[test]
fn plaintext_only_on_loopback_unless_insecure() {
    let mut m = MeshSetup::new("127.0.0.1:3002".parse().expect("addr"));
    assert!(m.check().is_ok());
    m.listen = "0.0.0.0:3002".parse().expect("addr");
    let e = m.check().expect_err("refused");
    assert!(e.to_string().contains("--mesh-insecure"), "{e}");
    m.insecure = true;
    assert!(m.check().is_ok());
    m.insecure = false;
    m.tls = Some(("c.pem".into(), "k.pem".into()));
    assert!(m.check().is_ok());
}

#[test]
fn urls_name_a_reachable_host() {
    assert_eq!(
        url("127.0.0.1:3002".parse().expect("addr"), false),
        "ws://127.0.0.1:3002/mesh/v1"
    );
    assert_eq!(
        url("[::1]:3002".parse().expect("addr"), true),
        "wss://[::1]:3002/mesh/v1"
    );
    let any = url("0.0.0.0:3002".parse().expect("addr"), false);
    assert!(
        !any.contains("0.0.0.0") && any.ends_with(":3002/mesh/v1"),
        "{any}"
    );
}

#[test]
fn a_public_url_is_checked_and_completed() {
    assert_eq!(
        public_url("wss://hub.example:3002", true).expect("ok"),
        "wss://hub.example:3002/mesh/v1"
    );
    assert_eq!(
        public_url("wss://hub.example/mesh/v1/", true).expect("ok"),
        "wss://hub.example/mesh/v1"
    );
    let e = public_url("ws://hub.example:3002", true).expect_err("scheme");
    assert!(e.to_string().contains("starts with wss://"), "{e}");
    assert!(public_url("wss://hub.example:3002", false).is_err());
    assert!(public_url("wss:///mesh/v1", true).is_err());
    assert!(public_url("wss://hub.example/other", true).is_err());
}

#[test]
fn a_tls_url_names_a_host_the_certificate_is_valid_for() {
    let dir = tempfile::tempdir().expect("tmp");
    let cert = |names: &[&str]| {
        let c = rcgen::generate_simple_self_signed(
            names.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
        )
        .expect("cert");
        let p = dir.path().join(format!("{}.pem", names.join("_")));
        std::fs::write(&p, c.cert.pem()).expect("write");
        p
    };
    let lo: std::net::SocketAddr = "127.0.0.1:3002".parse().expect("addr");
    let any: std::net::SocketAddr = "0.0.0.0:3002".parse().expect("addr");
    // A certificate for localhost, served on 127.0.0.1: the name, not the address.
    let localhost = cert(&["localhost"]);
    assert_eq!(
        tls::url_host(&localhost, lo, Some("box")).as_deref(),
        Some("localhost")
    );
    // The address itself when the certificate holds it.
    let ip = cert(&["127.0.0.1", "hub.example"]);
    assert_eq!(
        tls::url_host(&ip, lo, Some("box")).as_deref(),
        Some("127.0.0.1")
    );
    // On 0.0.0.0: this host's name when the certificate holds it, else its first name.
    let named = cert(&["*.example", "hub.example", "box"]);
    assert_eq!(
        tls::url_host(&named, any, Some("box")).as_deref(),
        Some("box")
    );
    assert_eq!(
        tls::url_host(&named, any, Some("other")).as_deref(),
        Some("hub.example")
    );
    // A wildcard alone names no host to dial.
    let wild = cert(&["*.example"]);
    assert_eq!(tls::url_host(&wild, any, Some("other")), None);
}

#[tokio::test]
async fn wait_link_returns_the_link_that_registers_and_nothing_past_its_bound() {
    let reg = Arc::new(Registry::default());
    let h = secret::hash("t");
    reg.allow("d", h);
    let soon = || tokio::time::Instant::now() + std::time::Duration::from_millis(20);
    assert!(reg.wait_link("d", soon()).await.is_none(), "none registers");
    let waiting = {
        let reg = reg.clone();
        tokio::spawn(async move {
            let far = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
            reg.wait_link("d", far).await.map(|l| l.id)
        })
    };
    // Registered while the waiter waits (or before it looks): it is found either way.
    let a = link(&reg, "d");
    reg.register(a.clone(), &h).expect("registered");
    assert_eq!(waiting.await.expect("joined"), Some(a.id));
    assert_eq!(reg.wait_link("d", soon()).await.map(|l| l.id), Some(a.id));
    // One that ended (not yet unregistered) is passed over until its successor registers.
    a.requests.close();
    assert!(reg.wait_link("d", soon()).await.is_none());
    let b = link(&reg, "d");
    reg.register(b.clone(), &h).expect("registered");
    assert_eq!(reg.wait_link("d", soon()).await.map(|l| l.id), Some(b.id));
}

/// A view of the store's devices read before a local revoke never allows the revoked
/// device again: applied late (the follower's read raced the revoke), it is refused, and
/// so is a refused device's lookup begun before it.
#[test]
fn a_read_begun_before_a_revoke_never_allows_the_device_again() {
    let reg = Registry::default();
    let h = secret::hash("t");
    reg.allow("d", h);
    // The follower reads the store (d still in it), then d is revoked here.
    let read_at = reg.revision();
    let stale: HashMap<String, [u8; 32]> = [("d".to_string(), h)].into();
    assert!(!reg.revoke("d"), "no live link");
    assert_eq!(
        reg.follow(stale.clone(), read_at),
        None,
        "the read is older"
    );
    assert!(reg.authenticate("d", "t").is_err(), "still revoked");
    assert!(!reg.allow_read("d", h, read_at), "a lookup begun before");
    assert!(reg.authenticate("d", "t").is_err(), "still revoked");
    // Read again after the revoke: what it says is applied.
    let read_at = reg.revision();
    let fresh: HashMap<String, [u8; 32]> = [("e".to_string(), h)].into();
    assert_eq!(reg.follow(fresh, read_at), Some(vec![]));
    assert!(reg.authenticate("e", "t").is_ok());
    assert!(reg.authenticate("d", "t").is_err());
    assert!(
        reg.allow_read("d", h, reg.revision()),
        "enrolled again elsewhere"
    );
    assert!(reg.authenticate("d", "t").is_ok());
}
