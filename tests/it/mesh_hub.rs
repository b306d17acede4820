//! The hub's side of the device mesh, driven by simulated devices (`cortex_tests::sim`):
//! enrolment and auth, files and their acks, de-duplication by (device, file name),
//! keepalive in both directions, bad frames, a second connection, TLS, restart and
//! shutdown, and the `cortex devices` / `cortex device` commands.

// Fields of JSON the hub just answered with; a panic is the test failing.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use cortex_cli::http::Method;
use cortex_protocol::mesh::{AgentFrame, FileOutcome, HubFrame, MAX_MESSAGE_BYTES};
use cortex_tests::sim::{self, Options, SimDevice, SimError, SimEvent, file_body};
use cortex_tests::{Hub, bin, run, wait_until};
use serde_json::{Value, json};
use tokio::runtime::Runtime;
use tokio_tungstenite::tungstenite::Message;

const T: Duration = Duration::from_secs(10);

fn rt() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn devices(hub: &Hub) -> Vec<Value> {
    let (st, v) = hub.api(Method::Get, "/api/devices", None);
    assert_eq!(st, 200, "{v}");
    v.as_array().cloned().expect("array")
}

fn device(hub: &Hub, name: &str) -> Option<Value> {
    devices(hub).into_iter().find(|d| d["name"] == name)
}

fn hub_events(hub: &Hub) -> Vec<Value> {
    let (st, v) = hub.api(Method::Get, "/api/events?after=0", None);
    assert_eq!(st, 200, "{v}");
    v["events"].as_array().cloned().expect("events")
}

fn connect(rt: &Runtime, hub: &Hub, name: &str, token: &str) -> SimDevice {
    rt.block_on(SimDevice::connect(&Options::new(
        &hub.mesh_url,
        name,
        token,
    )))
    .unwrap_or_else(|e| panic!("{name} cannot connect: {e:?}\n{}", hub.log()))
}

fn refused_code(e: &SimError) -> (u16, String) {
    match e {
        SimError::Refused { status, reason } => (
            *status,
            reason.as_ref().map(|r| r.code.clone()).unwrap_or_default(),
        ),
        other => panic!("expected a refused upgrade, got {other:?}"),
    }
}

fn closed_code(e: Option<SimError>) -> String {
    match e {
        Some(SimError::Closed(Some(r))) => r.code,
        other => panic!("expected a close with a reason, got {other:?}"),
    }
}

#[test]
fn enrol_connect_and_a_file_wakes_a_session_once() {
    let hub = Hub::start();
    assert!(
        hub.mesh_url.starts_with("ws://127.0.0.1:"),
        "{}",
        hub.mesh_url
    );
    let (st, v) = hub.api(Method::Post, "/api/devices", Some(&json!({"name": "gpu1"})));
    assert_eq!(st, 201, "{v}");
    let token = v["token"].as_str().expect("token").to_string();
    assert_eq!(token.len(), 64);
    let install = v["install"].as_str().expect("install");
    assert!(
        install.contains(&hub.mesh_url) && install.contains("--name gpu1"),
        "{install}"
    );
    assert!(
        !install.contains(&token),
        "the install line keeps the token off the command line"
    );
    assert!(!hub.log().contains(&token), "a token is never logged");
    let (st, v) = hub.api(Method::Post, "/api/devices", Some(&json!({"name": "gpu1"})));
    assert_eq!(
        (st, v["error"].as_str()),
        (409, Some("device_exists")),
        "{v}"
    );
    let (st, v) = hub.api(Method::Post, "/api/devices", Some(&json!({"name": "a:b"})));
    assert_eq!(st, 400, "{v}");
    let d = device(&hub, "gpu1").expect("listed");
    assert_eq!(d["state"], "offline");
    assert_eq!(d["last_seen"], Value::Null);

    let rt = rt();
    let mut dev = connect(&rt, &hub, "gpu1", &token);
    assert_eq!(dev.welcome.ping_interval_ms, 20_000);
    assert_eq!(dev.welcome.window, 64);
    assert_eq!(dev.welcome.max_message_bytes, MAX_MESSAGE_BYTES as u64);
    let d = device(&hub, "gpu1").expect("listed");
    assert_eq!(d["state"], "online", "{d}");
    assert_eq!(d["agent_version"], "sim-0.1");
    assert_eq!(d["host"]["hostname"], "gpu1.sim");
    assert_eq!(d["waits"], 0);

    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "train", "intent": "look at the loss", "device": "gpu1"}),
    );
    assert_eq!(wp["how_to_signal"]["recommended"], "shell");
    let (id, secret) = (wp["id"].as_str().unwrap(), wp["secret"].as_str().unwrap());
    let body = file_body(id, secret, &[("status", "ok"), ("message", "exit=0")]);
    rt.block_on(async {
        dev.send_file("1-a.json", &body).await;
        assert_eq!(dev.ack(T).await, ("1-a.json".into(), FileOutcome::Accepted));
        // The same file name again (a rescan, a reconnect): heard once.
        dev.send_file("1-a.json", &body).await;
        assert_eq!(
            dev.ack(T).await,
            ("1-a.json".into(), FileOutcome::Duplicate)
        );
        // Another file for the now-resolved waitpoint: not an error for the job.
        dev.send_file("2-b.json", &body).await;
        assert_eq!(dev.ack(T).await, ("2-b.json".into(), FileOutcome::Resolved));
    });
    let wake = hub.wait_wake(&sid, id, 1, T);
    assert_eq!(wake["reason"], "fired");
    let view = hub.get_waitpoint(id);
    assert_eq!(view["signal_count"], 1, "{view}");
    assert_eq!(view["signals"][0]["source"], "device:gpu1");
    assert_eq!(view["signals"][0]["key"], "file:gpu1:1-a.json");

    // The body's key, when it has one, is the identity (shared with an HTTP attempt).
    let wp2 = hub.waitpoint(&sid, json!({"label": "m", "intent": "i", "max_signals": 5}));
    let (id2, secret2) = (wp2["id"].as_str().unwrap(), wp2["secret"].as_str().unwrap());
    let keyed = file_body(id2, secret2, &[("status", "progress"), ("key", "k1")]);
    let (st, _) = hub.signal(&serde_json::from_str(&keyed).unwrap());
    assert_eq!(st, 202);
    rt.block_on(async {
        dev.send_file("3-c.json", &keyed).await;
        assert_eq!(dev.ack(T).await.1, FileOutcome::Duplicate);
    });

    // The hub's events say what happened to the device, and a long poll follows them.
    let kinds: Vec<String> = hub_events(&hub)
        .iter()
        .map(|e| {
            format!(
                "{}:{}",
                e["kind"].as_str().unwrap(),
                e["device"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(kinds, ["device-added:gpu1", "device-online:gpu1"]);
    let (st, v) = hub.api(Method::Get, "/api/events?after=2&wait=1", None);
    assert_eq!(st, 200);
    assert!(v["events"].as_array().unwrap().is_empty(), "{v}");
}

/// The hub's own spool files are known as `file:local:NAME`; a device that happens to be
/// named `local` must not have its files taken for those (answered duplicate, deleted,
/// never recorded).
#[test]
fn a_device_named_local_keeps_its_files_apart_from_the_hubs_spool() {
    let hub = Hub::start();
    let token = hub.add_device("local");
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "l", "intent": "i", "max_signals": 5}));
    let (id, secret) = (wp["id"].as_str().unwrap(), wp["secret"].as_str().unwrap());
    let body = file_body(id, secret, &[("status", "progress")]);

    // The hub's spool takes 1.json first.
    let tmp = hub.spool().join(".1.json.tmp");
    std::fs::write(&tmp, &body).expect("write");
    std::fs::rename(&tmp, hub.spool().join("1.json")).expect("rename");
    wait_until(T, "the hub's spool file recorded", || {
        (hub.get_waitpoint(id)["signal_count"] == 1).then_some(())
    });

    // Device `local` sends a file of the same name: another signal, not a duplicate.
    let rt = rt();
    let mut dev = connect(&rt, &hub, "local", &token);
    rt.block_on(async {
        dev.send_file("1.json", &body).await;
        assert_eq!(dev.ack(T).await, ("1.json".into(), FileOutcome::Accepted));
        // Its own file sent again is still its duplicate.
        dev.send_file("1.json", &body).await;
        assert_eq!(dev.ack(T).await, ("1.json".into(), FileOutcome::Duplicate));
    });
    let view = hub.get_waitpoint(id);
    assert_eq!(view["signal_count"], 2, "{view}");
    let sources: Vec<(&str, &str)> = view["signals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["source"].as_str().unwrap(), s["key"].as_str().unwrap()))
        .collect();
    assert_eq!(
        sources,
        [
            ("spool", "file:local:1.json"),
            ("device:local", "device-file:local:1.json")
        ]
    );
}

#[test]
fn refused_files_say_what_to_fix_and_the_link_stays_up() {
    let hub = Hub::start();
    let token = hub.add_device("box");
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "ladder", "intent": "i", "members": ["arm2", "arm6"]}),
    );
    let (id, secret) = (wp["id"].as_str().unwrap(), wp["secret"].as_str().unwrap());
    let rt = rt();
    let mut dev = connect(&rt, &hub, "box", &token);
    let cases: Vec<(&str, String, &str)> = vec![
        ("bad.json", "{not json".into(), "not a signal"),
        (
            "unknown.json",
            file_body("wp_000000000000", "x", &[]),
            "no waitpoint",
        ),
        ("secret.json", file_body(id, "nope", &[]), "wrong secret"),
        ("nomember.json", file_body(id, secret, &[]), "arm2, arm6"),
        (
            "stranger.json",
            file_body(id, secret, &[("member", "arm9")]),
            "arm2, arm6",
        ),
        (
            "big.json",
            file_body(id, secret, &[("data", &"x".repeat(70_000))]),
            "over the cap",
        ),
        (
            "a/b",
            file_body(id, secret, &[("member", "arm2")]),
            "not usable",
        ),
    ];
    rt.block_on(async {
        for (name, body, want) in &cases {
            dev.send_file(name, body).await;
            let (n, outcome) = dev.ack(T).await;
            assert_eq!(&n, name);
            match outcome {
                FileOutcome::Refused { reason } => {
                    assert!(
                        reason.contains(want),
                        "{name}: {reason:?} should say {want:?}"
                    )
                }
                other => panic!("{name}: expected refused, got {other:?}"),
            }
        }
        dev.send_file("ok.json", &file_body(id, secret, &[("member", "arm2")]))
            .await;
        assert_eq!(dev.ack(T).await.1, FileOutcome::Accepted);
    });
    assert_eq!(hub.get_waitpoint(id)["signal_count"], 1);
    assert!(
        hub.log().contains("device spool file refused"),
        "misses are logged as warnings"
    );
}

#[test]
fn a_burst_of_files_is_acked_once_each() {
    let hub = Hub::start();
    let token = hub.add_device("burst");
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "m", "intent": "i", "max_signals": 1000}),
    );
    let (id, secret) = (wp["id"].as_str().unwrap(), wp["secret"].as_str().unwrap());
    let rt = rt();
    let mut dev = connect(&rt, &hub, "burst", &token);
    let window = dev.welcome.window as usize;
    let body = file_body(id, secret, &[("status", "progress")]);
    let n = 500;
    let acked = rt.block_on(async {
        let (mut sent, mut acked) = (0, std::collections::BTreeSet::new());
        while acked.len() < n {
            while sent < n && sent - acked.len() < window {
                dev.send_file(&format!("f{sent}.json"), &body).await;
                sent += 1;
            }
            let (name, outcome) = dev.ack(T).await;
            assert_eq!(outcome, FileOutcome::Accepted, "{name}");
            assert!(acked.insert(name), "one ack per file");
        }
        acked
    });
    assert_eq!(acked.len(), n);
    assert_eq!(hub.get_waitpoint(id)["signal_count"], n as u64);
}

#[test]
fn bad_tokens_are_refused_and_revoking_drops_the_link_at_once() {
    let hub = Hub::start();
    let token = hub.add_device("gpu2");
    let rt = rt();
    let url = hub.mesh_url.clone();
    let try_open = |name: &str, token: &str, url: &str| match rt
        .block_on(sim::open(&Options::new(url, name, token)))
    {
        Ok(_) => panic!("{name}: the upgrade should be refused"),
        Err(e) => e,
    };
    assert_eq!(
        refused_code(&try_open("gpu2", "0".repeat(64).as_str(), &url)),
        (403, "forbidden".into())
    );
    assert_eq!(
        refused_code(&try_open("nobody", &token, &url)),
        (403, "forbidden".into())
    );
    assert_eq!(
        refused_code(&try_open("gpu2", "", &url)),
        (401, "unauthorized".into())
    );
    assert_eq!(
        refused_code(&try_open(
            "gpu2",
            &token,
            &url.replace("/mesh/v1", "/other")
        )),
        (404, "not_found".into())
    );
    assert!(!hub.log().contains(&token), "a token is never logged");

    let mut dev = connect(&rt, &hub, "gpu2", &token);
    let (st, v) = hub.api(Method::Delete, "/api/devices/gpu2", None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["dropped_link"], true);
    let started = Instant::now();
    let end = rt.block_on(dev.ended(T));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "dropped at once, not at a ping"
    );
    assert_eq!(closed_code(end), "revoked");
    assert_eq!(
        refused_code(&try_open("gpu2", &token, &url)),
        (403, "forbidden".into())
    );
    // Listed as revoked, not dropped from the fleet view.
    assert_eq!(
        device(&hub, "gpu2").map(|d| d["state"].clone()),
        Some(json!("revoked"))
    );
    // Revoking it again changes nothing, and says so.
    let (st, v) = hub.api(Method::Delete, "/api/devices/gpu2", None);
    assert_eq!(st, 409, "{v}");
    assert_eq!(v["error"], "already_revoked");
    let events = wait_until(T, "the offline event", || {
        let e = hub_events(&hub);
        (e.len() >= 4).then_some(e)
    });
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "device-added",
            "device-online",
            "device-revoked",
            "device-offline"
        ]
    );
    assert_eq!(events[3]["reason"], "revoked");
    // Enrolled again, it gets a new token; the old one stays dead.
    let token2 = hub.add_device("gpu2");
    assert_ne!(token, token2);
    assert_eq!(refused_code(&try_open("gpu2", &token, &url)).0, 403);
    connect(&rt, &hub, "gpu2", &token2);
}

#[test]
fn a_silent_agent_is_dropped_within_two_ping_intervals() {
    let ping_ms = 500;
    let hub = Hub::start_with(&[("CORTEX_MESH_PING_MS", "500")]);
    let quiet = hub.add_device("quiet");
    let chatty = hub.add_device("chatty");
    let rt = rt();
    let dev = connect(&rt, &hub, "quiet", &quiet);
    let mut live = connect(&rt, &hub, "chatty", &chatty);
    assert_eq!(dev.welcome.ping_interval_ms, ping_ms);
    rt.block_on(dev.silence());
    let silenced = Instant::now();
    let d = wait_until(T, "the silent device to be offline", || {
        device(&hub, "quiet").filter(|d| d["state"] == "offline")
    });
    let took = silenced.elapsed();
    assert!(
        took < Duration::from_millis(2 * ping_ms + 1_000),
        "noticed after {took:?}"
    );
    assert_eq!(d["offline_reason"], "ping timed out", "{d}");
    assert!(d["last_seen"].as_u64().is_some());
    // Pings kept the other link alive through the same stretch, and it still works.
    std::thread::sleep(Duration::from_millis(3 * ping_ms));
    assert_eq!(device(&hub, "chatty").expect("listed")["state"], "online");
    assert!(rt.block_on(live.next(Duration::from_millis(10))).is_none());
    drop(dev);
}

#[test]
fn a_device_notices_a_frozen_hub_within_two_ping_intervals() {
    let hub = Hub::start_with(&[("CORTEX_MESH_PING_MS", "500")]);
    let token = hub.add_device("watcher");
    let rt = rt();
    let mut dev = connect(&rt, &hub, "watcher", &token);
    let pid = rustix::process::Pid::from_raw(hub.pid().expect("pid") as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).expect("SIGSTOP");
    let stopped = Instant::now();
    let end = rt.block_on(dev.ended(Duration::from_secs(5)));
    let took = stopped.elapsed();
    rustix::process::kill_process(pid, rustix::process::Signal::CONT).expect("SIGCONT");
    assert_eq!(end, Some(SimError::HubSilent));
    assert!(
        took < Duration::from_millis(2_000),
        "noticed after {took:?}"
    );
}

#[test]
fn bad_frames_close_only_their_link_with_a_reason() {
    let hub = Hub::start();
    let names = ["garbage", "text", "huge", "hello2", "good"];
    let tokens: Vec<String> = names.iter().map(|n| hub.add_device(n)).collect();
    let rt = rt();
    let mut devs: Vec<SimDevice> = names
        .iter()
        .zip(&tokens)
        .map(|(n, t)| connect(&rt, &hub, n, t))
        .collect();
    let mut good = devs.pop().expect("good");
    let sends = [
        Message::Binary(vec![0xc1, 0x00, 0x13].into()),
        Message::text("{\"type\":\"file\"}"),
        Message::Binary(vec![0u8; MAX_MESSAGE_BYTES + 1024].into()),
        Message::Binary(
            cortex_protocol::mesh::Frame::encode(&AgentFrame::Hello(sim::hello("hello2")))
                .expect("encode")
                .into(),
        ),
    ];
    let want = [
        "protocol_error",
        "protocol_error",
        "too_large",
        "protocol_error",
    ];
    for ((dev, m), want) in devs.iter_mut().zip(sends).zip(want) {
        rt.block_on(dev.send_raw(m));
        let end = rt.block_on(dev.ended(T));
        match end {
            Some(SimError::Closed(Some(r))) => assert_eq!(r.code, want, "{r:?}"),
            // An oversized message may be cut off before its close frame is read.
            Some(SimError::Io(_)) | Some(SimError::Closed(None)) if want == "too_large" => {}
            other => panic!("expected a close with {want}, got {other:?}"),
        }
    }
    for n in &names[..4] {
        let d = wait_until(T, "the offline record", || {
            device(&hub, n).filter(|d| d["state"] == "offline")
        });
        let r = d["offline_reason"].as_str().unwrap_or_default();
        assert!(r.starts_with("protocol error"), "{n}: {r}");
    }
    // The hub kept serving the others.
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "l", "intent": "i"}));
    rt.block_on(async {
        good.send_file(
            "x.json",
            &file_body(
                wp["id"].as_str().unwrap(),
                wp["secret"].as_str().unwrap(),
                &[],
            ),
        )
        .await;
        assert_eq!(good.ack(T).await.1, FileOutcome::Accepted);
    });
    // A hello naming another device than the upgrade did is refused too.
    let mut o = Options::new(&hub.mesh_url, "good", &tokens[4]);
    o.hello = Some(sim::hello("someone-else"));
    let e = rt.block_on(SimDevice::connect(&o)).err().expect("refused");
    assert!(
        matches!(&e, SimError::Closed(Some(r)) if r.code == "protocol_error"),
        "{e:?}"
    );
}

#[test]
fn a_second_connection_replaces_the_first() {
    let hub = Hub::start();
    let token = hub.add_device("twin");
    let rt = rt();
    let mut first = connect(&rt, &hub, "twin", &token);
    let mut second = connect(&rt, &hub, "twin", &token);
    let end = rt.block_on(first.ended(T));
    match end {
        Some(SimError::Closed(Some(r))) => {
            assert_eq!(r.code, "replaced");
            assert!(r.retry_after_ms.unwrap_or(0) >= 10_000, "{r:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(device(&hub, "twin").expect("listed")["state"], "online");
    let kinds: Vec<String> = hub_events(&hub)
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        kinds,
        [
            "device-added",
            "device-online",
            "device-offline",
            "device-online"
        ]
    );
    assert!(
        rt.block_on(second.next(Duration::from_millis(200)))
            .is_none()
    );
}

#[test]
fn a_non_loopback_mesh_needs_tls_or_mesh_insecure() {
    let home = tempfile::tempdir().expect("tmp");
    let home_s = home.path().to_str().expect("utf-8");
    let (code, _, err) = run(
        "cortex-hub",
        &[
            "--home",
            home_s,
            "--listen",
            "127.0.0.1:0",
            "--mesh-listen",
            "0.0.0.0:0",
        ],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("not a loopback address") && err.contains("--mesh-insecure"),
        "{err}"
    );
    // Allowed when asked for; the URL names this machine, not 0.0.0.0.
    let hub = Hub::start_with_args(&[], &["--mesh-listen", "0.0.0.0:0", "--mesh-insecure"]);
    assert!(
        hub.mesh_url.starts_with("ws://") && !hub.mesh_url.contains("0.0.0.0"),
        "{}",
        hub.mesh_url
    );
    // `off` starts no mesh.
    let hub = Hub::start_with_args(&[], &["--mesh-listen", "off"]);
    assert_eq!(hub.mesh_url, "");
    assert!(hub.log().contains(", mesh off, home "), "{}", hub.log());
}

#[test]
fn wss_with_a_private_ca() {
    let dir = tempfile::tempdir().expect("tmp");
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])
        .expect("self-signed certificate");
    let (cert_pem, key_pem) = (cert.cert.pem(), cert.signing_key.serialize_pem());
    let (cert_path, key_path) = (dir.path().join("hub.pem"), dir.path().join("hub.key"));
    std::fs::write(&cert_path, &cert_pem).expect("write");
    std::fs::write(&key_path, &key_pem).expect("write");
    let hub = Hub::start_with_args(
        &[],
        &[
            "--tls-cert",
            cert_path.to_str().unwrap(),
            "--tls-key",
            key_path.to_str().unwrap(),
        ],
    );
    // The printed URL names what the certificate is valid for (localhost), not the
    // listen address (127.0.0.1), so it works when pasted.
    assert!(
        hub.mesh_url.starts_with("wss://localhost:"),
        "{}",
        hub.mesh_url
    );
    let url = hub.mesh_url.clone();
    let token = hub.add_device("secure");
    let (_, v) = hub.api(
        Method::Post,
        "/api/devices",
        Some(&json!({"name": "other"})),
    );
    assert!(v["install"].as_str().unwrap().contains("--ca-cert"), "{v}");
    let rt = rt();
    let mut o = Options::new(&url, "secure", &token);
    o.ca_pem = Some(cert_pem.into_bytes());
    let mut dev = rt.block_on(SimDevice::connect(&o)).expect("wss connects");
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "l", "intent": "i"}));
    rt.block_on(async {
        dev.send_file(
            "t.json",
            &file_body(
                wp["id"].as_str().unwrap(),
                wp["secret"].as_str().unwrap(),
                &[],
            ),
        )
        .await;
        assert_eq!(dev.ack(T).await.1, FileOutcome::Accepted);
    });
    // Without the CA the certificate is not trusted; plaintext gets nowhere.
    let o = Options::new(&url, "secure", &token);
    assert!(matches!(rt.block_on(sim::open(&o)), Err(SimError::Io(_))));
    let o = Options::new(&url.replace("wss://", "ws://"), "secure", &token);
    assert!(rt.block_on(sim::open(&o)).is_err());

    // The real agent given ws:// against this TLS mesh says what to do.
    let mut agent = cortex_tests::agent::Agent::new(&hub, "secure", &token);
    agent.set_hub_url(&url.replace("wss://", "ws://"));
    agent.spawn();
    wait_until(
        Duration::from_secs(20),
        "the agent's advice to use wss://",
        || {
            agent
                .log()
                .contains("this hub speaks TLS on that port, so use wss://")
                .then_some(())
        },
    );
    drop(agent);

    // --public-url: printed and put in install lines as given (completed with the path).
    let public = Hub::start_with_args(
        &[],
        &[
            "--tls-cert",
            cert_path.to_str().unwrap(),
            "--tls-key",
            key_path.to_str().unwrap(),
            "--public-url",
            "wss://hub.example:443",
        ],
    );
    assert_eq!(public.mesh_url, "wss://hub.example:443/mesh/v1");
    let (_, v) = public.api(Method::Post, "/api/devices", Some(&json!({"name": "p"})));
    assert!(
        v["install"]
            .as_str()
            .is_some_and(|l| l.contains("wss://hub.example:443/mesh/v1")),
        "{v}"
    );
    // A URL of the wrong scheme is refused at start, saying why.
    let home = tempfile::tempdir().expect("tmp");
    let (code, _, err) = run(
        "cortex-hub",
        &[
            "--home",
            home.path().to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--mesh-listen",
            "127.0.0.1:0",
            "--tls-cert",
            cert_path.to_str().unwrap(),
            "--tls-key",
            key_path.to_str().unwrap(),
            "--public-url",
            "ws://hub.example:3002",
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains("starts with wss://"), "{err}");
}

#[test]
fn restart_and_shutdown_keep_devices_and_say_why() {
    let mut hub = Hub::start_with(&[("CORTEX_WAITPOINT_SWEEP_MS", "300")]);
    let token = hub.add_device("keep");
    let rt = rt();
    let mut dev = connect(&rt, &hub, "keep", &token);
    // The sweep asks every connected agent to rescan.
    let rescan = rt.block_on(dev.next(T));
    assert_eq!(rescan, Some(SimEvent::Frame(HubFrame::Rescan)));
    hub.kill();
    assert!(rt.block_on(dev.ended(T)).is_some());
    hub.spawn();
    let d = device(&hub, "keep").expect("kept across a restart");
    assert_eq!(d["state"], "offline");
    assert_eq!(d["offline_reason"], "the hub restarted");
    assert!(d["last_seen"].as_u64().is_some(), "{d}");
    // The token survived the restart.
    let mut dev = connect(&rt, &hub, "keep", &token);
    let status = hub.stop();
    assert!(status.success(), "{status}");
    match rt.block_on(dev.ended(T)) {
        Some(SimError::Closed(Some(r))) => {
            assert_eq!(r.code, "shutting_down");
            assert!(r.retry_after_ms.is_some());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn cortex_devices_and_device_add_revoke() {
    let hub = Hub::start();
    let url = hub.url("");
    let env = [
        ("CORTEX_HUB", url.as_str()),
        ("CORTEX_WEBHOOK_TOKEN", hub.token.as_str()),
    ];
    let (code, out, err) = run("cortex", &["devices"], &env);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("no devices yet"), "{out}");
    let (code, out, err) = run("cortex", &["device", "add", "lab1"], &env);
    assert_eq!(code, 0, "{err}");
    let token = out
        .lines()
        .map(str::trim)
        .find(|l| l.len() == 64 && l.chars().all(|c| c.is_ascii_hexdigit()))
        .expect("the token on a line of its own")
        .to_string();
    assert!(out.contains("shown this once"), "{out}");
    assert!(
        out.contains(&format!("cortex-device-agent --hub {}", hub.mesh_url)),
        "{out}"
    );
    assert!(out.contains("--token-file ~/.cortex/device-token"), "{out}");
    assert!(
        out.contains("loopback only"),
        "a loopback mesh is pointed out: {out}"
    );
    let (code, _, err) = run("cortex", &["device", "add", "lab1"], &env);
    assert_eq!(code, 1);
    assert!(err.contains("revoke it first"), "{err}");

    let rt = rt();
    let _dev = connect(&rt, &hub, "lab1", &token);
    let (code, out, _) = run("cortex", &["devices"], &env);
    assert_eq!(code, 0);
    let header = out.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("NAME") && header.contains("LAST SEEN"),
        "{out}"
    );
    assert!(
        out.contains("lab1") && out.contains("online") && out.contains("sim-0.1"),
        "{out}"
    );
    let (code, out, _) = run("cortex", &["devices", "--json"], &env);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v[0]["state"], "online");
    let (code, out, err) = run("cortex", &["device", "revoke", "lab1"], &env);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("revoked") && out.contains("dropped"), "{out}");
    let (code, _, err) = run("cortex", &["device", "revoke", "lab1"], &env);
    assert_eq!(code, 1);
    assert!(err.contains("already revoked"), "{err}");
    let (code, _, err) = run("cortex", &["device", "revoke", "nosuch"], &env);
    assert_eq!(code, 1);
    assert!(err.contains("no device"), "{err}");
    let _ = bin("cortex");
}

#[test]
fn a_connection_cut_without_a_close_reads_as_lost() {
    use futures_util::{SinkExt, StreamExt};
    let hub = Hub::start();
    let token = hub.add_device("cut");
    let rt = rt();
    rt.block_on(async {
        let mut ws = sim::open(&Options::new(&hub.mesh_url, "cut", &token))
            .await
            .expect("upgrade");
        let hello = cortex_protocol::mesh::Frame::encode(&AgentFrame::Hello(sim::hello("cut")))
            .expect("encode");
        ws.send(Message::Binary(hello.into())).await.expect("hello");
        let welcome = ws.next().await.expect("a frame").expect("welcome");
        assert!(matches!(welcome, Message::Binary(_)));
        // Dropped without a close frame: the TCP connection just ends.
    });
    // Offline at once (the link is gone), and its reason once the store recorded it.
    let d = wait_until(T, "the cut device to be offline, with its reason", || {
        device(&hub, "cut").filter(|d| d["state"] == "offline" && d["offline_reason"].is_string())
    });
    let r = d["offline_reason"].as_str().unwrap_or_default();
    assert!(r.starts_with("connection lost"), "{r}");
}

/// A waitpoint bound to a device the hub does not know is refused (404, naming it), and a
/// revoked device stays in the fleet list as `revoked` until its name is added again.
#[test]
fn unknown_devices_are_refused_and_revoked_ones_stay_listed() {
    let hub = Hub::start();
    let sid = hub.session();
    let (st, v) = hub.api(
        Method::Post,
        &format!("/api/sessions/{sid}/waitpoints"),
        Some(&json!({"label": "l", "intent": "i", "device": "gpu9"})),
    );
    assert_eq!(
        (st, v["error"].as_str()),
        (404, Some("unknown_device")),
        "{v}"
    );
    assert!(
        v["message"].as_str().is_some_and(|m| m.contains("gpu9")),
        "{v}"
    );

    hub.add_device("lab1");
    let (st, v) = hub.api(
        Method::Post,
        &format!("/api/sessions/{sid}/waitpoints"),
        Some(&json!({"label": "l", "intent": "i", "device": "lab1"})),
    );
    assert_eq!(st, 201, "{v}");

    let (st, _) = hub.api(Method::Delete, "/api/devices/lab1", None);
    assert_eq!(st, 200);
    let (_, list) = hub.api(Method::Get, "/api/devices", None);
    assert_eq!(list[0]["name"], "lab1", "{list}");
    assert_eq!(list[0]["state"], "revoked", "{list}");
    // A revoked device takes no new waitpoints, and its token no longer connects.
    let (st, _) = hub.api(
        Method::Post,
        &format!("/api/sessions/{sid}/waitpoints"),
        Some(&json!({"label": "l", "intent": "i", "device": "lab1"})),
    );
    assert_eq!(st, 404);
    // Added again: one entry, a fresh device.
    hub.add_device("lab1");
    let (_, list) = hub.api(Method::Get, "/api/devices", None);
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list[0]["state"], "offline", "{list}");
}
