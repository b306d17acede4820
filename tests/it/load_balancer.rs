//! A real HAProxy in front of the hubs (tests/haproxy.rs, the config docs/operating.md
//! shows): a signal sent by `cortex-signal` to HAProxy's URL only lands, and `cortex wait
//! for` long-polling through it returns; a device agent links through it (the WebSocket
//! upgrade passes the proxy) and a remote wait asked through it fires; a hub SIGKILLed
//! behind it costs a client nothing (the refused connection goes to the live hub) and is
//! out of rotation once its health check fails; an agent dials `wss://` to HAProxy, which
//! ends TLS before the hub's plain loopback mesh; a standby started on the dead hub's
//! store behind it is taken into rotation, and the dead hub's long poll, device and
//! waitpoint carry on through the same URLs. Skipped, saying why, where haproxy is not
//! installed (never under `CI=true`: `.ci/run` installs it).

// Fields of JSON the hub just answered with; a panic is the test failing.
#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cortex_tests::agent::Agent;
use cortex_tests::haproxy::{Backend, haproxy_or_skip, haproxy_or_skip_tls};
use cortex_tests::{Hub, bin, dead_port, run, wait_until};
use serde_json::{Value, json};

use super::remote_waits::Sleep;

const T: Duration = Duration::from_secs(30);

/// `cortex --hub URL ARGS` with `hub`'s operator token, started (stdout and stderr piped).
fn spawn_cortex(hub: &Hub, url: &str, args: &[&str]) -> Child {
    cortex_command(hub, url, args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cortex")
}

/// `cortex --hub URL ARGS` with `hub`'s operator token, stdout piped.
fn cortex_command(hub: &Hub, url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin("cortex"));
    cmd.args(["--hub", url])
        .args(args)
        .env_remove("CORTEX_HUB")
        .env_remove("CORTEX_HOME")
        .env("CORTEX_WEBHOOK_TOKEN", &hub.token)
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    cmd
}

/// Waits (bounded) for `child` to exit: (exit code, stdout, stderr).
fn finish(mut child: Child, what: &str) -> (i32, String, String) {
    wait_until(T, what, || child.try_wait().ok().flatten());
    let out = child.wait_with_output().expect("its output");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// `cortex-signal` for waitpoint `wp` with `--url URL` only (and a spool of its own):
/// (exit code, stderr, the spool's home).
fn signal_to(url: &str, wp: &Value, message: &str) -> (i32, String, tempfile::TempDir) {
    let home = tempfile::tempdir().expect("tmp");
    let (code, _, err) = run(
        "cortex-signal",
        &["--exit-code", "0", "--message", message, "--url", url],
        &[
            ("CORTEX_SIGNAL_ID", wp["id"].as_str().unwrap()),
            ("CORTEX_SIGNAL_SECRET", wp["secret"].as_str().unwrap()),
            ("CORTEX_HOME", home.path().to_str().expect("utf8")),
        ],
    );
    (code, err, home)
}

/// The messages of the signals recorded on waitpoint `wp`.
fn messages(hub: &Hub, wp: &str) -> Vec<String> {
    hub.get_waitpoint(wp)["signals"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["message"].as_str().map(str::to_string))
        .collect()
}

/// The session ids `cortex sessions` lists, asked through `url`.
fn sessions_through(hub: &Hub, url: &str) -> String {
    let (code, out, err) = run(
        "cortex",
        &["--hub", url, "sessions"],
        &[("CORTEX_WEBHOOK_TOKEN", hub.token.as_str())],
    );
    assert_eq!(code, 0, "cortex sessions through haproxy: {err}");
    out
}

#[test]
fn a_signal_sent_only_to_haproxy_lands_and_wait_for_through_it_returns() {
    let hub = Hub::start();
    let Some(lb) = haproxy_or_skip("load_balancer signal", &[Backend::of("hub1", &hub)]) else {
        return;
    };
    lb.wait_server("hubs", "hub1", "UP");
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "job", "intent": "look"}));
    let id = wp["id"].as_str().unwrap();
    // A long poll through the proxy, armed before or after the signal lands: `wait for`
    // reads the log from before the waitpoint either way.
    let waiter = spawn_cortex(&hub, &lb.url(""), &["wait", "for", id, "--timeout", "60s"]);

    let (code, err, home) = signal_to(&lb.url("/webhook/signal"), &wp, "through haproxy");
    assert_eq!(code, 0, "{err}\nhaproxy:\n{}", lb.log());
    assert_eq!(err, "", "delivered at once, nothing to say");
    assert!(
        !home.path().join("tmp/signals").exists(),
        "delivered, so nothing spooled"
    );
    assert_eq!(messages(&hub, id), ["through haproxy"]);

    let (code, out, err) = finish(waiter, "cortex wait for through haproxy");
    assert_eq!(code, 0, "{err}");
    let wake: Value = serde_json::from_str(out.trim()).expect("the wake on stdout");
    assert_eq!(wake["reason"], "fired", "{wake}");
    assert_eq!(wake["waitpoint"]["id"], id, "{wake}");

    // It went through the proxy: HAProxy logged the 202 to the hub.
    let log = lb.log();
    assert!(
        log.lines()
            .any(|l| l.contains(" 202 ") && l.contains("\"POST /webhook/signal HTTP/1.1\"")),
        "{log}"
    );
}

#[test]
fn a_device_agent_links_through_haproxy_and_a_remote_wait_through_it_fires() {
    let hub = Hub::start();
    let token = hub.add_device("gpu1");
    let Some(lb) = haproxy_or_skip("load_balancer agent", &[Backend::of("hub1", &hub)]) else {
        return;
    };
    // The mesh's server is checked on the hub's HTTP port (/healthz).
    lb.wait_server("meshes", "hub1", "UP");
    let mut agent = Agent::new(&hub, "gpu1", &token);
    agent.set_hub_url(&lb.mesh_url());
    agent.spawn();
    hub.wait_online("gpu1");
    let hub_field = format!("hub={}", lb.mesh_url());
    wait_until(T, "the agent's log: linked through haproxy", || {
        agent
            .log()
            .lines()
            .any(|l| l.contains("connected to the hub") && l.contains(&hub_field))
            .then_some(())
    });
    assert!(!agent.log().contains(&token), "the token is never logged");

    // `cortex wait pid --device` through the proxy: the wait goes to the agent over the
    // proxied WebSocket, its outcome comes back over it, the long poll returns through it.
    let mut sleep = Sleep::start();
    let pid = sleep.pid().to_string();
    let waiter = spawn_cortex(
        &hub,
        &lb.url(""),
        &["wait", "pid", &pid, "--device", "gpu1", "--timeout", "60s"],
    );
    wait_until(T, "the wait armed on the device", || {
        hub.device("gpu1")["wait_list"]
            .as_array()
            .and_then(|l| l.iter().find(|w| w["state"] == "armed").cloned())
    });
    sleep.kill();
    let (code, _, err) = finish(waiter, "cortex wait pid through haproxy");
    assert_eq!(code, 0, "{err}\nagent:\n{}", agent.log());
    assert!(
        err.contains(&format!("waiting on gpu1 for pid {pid} to exit")),
        "{err}"
    );
    // The link is one connection held open through the proxy's mesh frontend.
    assert_eq!(lb.stat("meshes", "hub1", "scur").as_deref(), Some("1"));
}

#[test]
fn a_hub_killed_behind_haproxy_is_passed_over_and_then_out_of_rotation() {
    // Two hubs of their own (two stores, one operator token): which one answered shows in
    // the sessions it lists.
    let token = [("CORTEX_WEBHOOK_TOKEN", "load-balancer-operator-token")];
    let mut a = Hub::start_with(&token);
    let b = Hub::start_with(&token);
    let Some(lb) = haproxy_or_skip(
        "load_balancer failover",
        &[Backend::of("hub1", &a), Backend::of("hub2", &b)],
    ) else {
        return;
    };
    lb.wait_server("hubs", "hub1", "UP");
    lb.wait_server("hubs", "hub2", "UP");
    let (sa, sb) = (a.session(), b.session());
    let lists: Vec<String> = (0..4).map(|_| sessions_through(&b, &lb.url(""))).collect();
    assert!(
        lists.iter().any(|l| l.contains(&sa)) && lists.iter().any(|l| l.contains(&sb)),
        "round robin reaches both hubs: {lists:?}"
    );

    let wp = b.waitpoint(
        &sb,
        json!({"label": "job", "intent": "look", "max_signals": 3}),
    );
    let id = wp["id"].as_str().unwrap();
    a.kill();
    // Before its check fails, a connection the dead hub refuses is sent to the live one
    // (`retries`, `option redispatch`): no client sees the dead hub.
    for _ in 0..4 {
        let list = sessions_through(&b, &lb.url(""));
        assert!(list.contains(&sb), "{list}\nhaproxy:\n{}", lb.log());
    }
    // Then its check fails and it is out of rotation.
    lb.wait_server("hubs", "hub1", "DOWN");
    lb.wait_server("hubs", "hub2", "UP");
    for n in 0..3 {
        let message = format!("signal {n}");
        let (code, err, _home) = signal_to(&lb.url("/webhook/signal"), &wp, &message);
        assert_eq!(code, 0, "{err}\nhaproxy:\n{}", lb.log());
        assert_eq!(err, "", "delivered at once, nothing to say");
    }
    assert_eq!(messages(&b, id), ["signal 0", "signal 1", "signal 2"]);
}

#[test]
fn an_agent_dials_wss_to_haproxy_which_ends_tls_before_the_hubs_plain_mesh() {
    // The documented layout: TLS ends at the balancer, the hub's mesh is ws:// on loopback.
    let dir = tempfile::tempdir().expect("tmp");
    let cert =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .expect("self-signed certificate");
    let (cert_pem, key_pem) = (cert.cert.pem(), cert.signing_key.serialize_pem());
    let (pem, ca) = (dir.path().join("hub.pem"), dir.path().join("ca.pem"));
    std::fs::write(&pem, format!("{cert_pem}{key_pem}")).expect("write hub.pem");
    std::fs::write(&ca, &cert_pem).expect("write ca.pem");

    let hub = Hub::start();
    assert!(
        hub.mesh_url.starts_with("ws://127.0.0.1:"),
        "{}",
        hub.mesh_url
    );
    let token = hub.add_device("gpu1");
    let Some(lb) = haproxy_or_skip_tls(
        "load_balancer wss",
        &[Backend::of("hub1", &hub)],
        Some(&pem),
    ) else {
        return;
    };
    lb.wait_server("meshes", "hub1", "UP");
    let url = lb.mesh_url();
    assert!(url.starts_with("wss://"), "{url}");
    let mut agent = Agent::new(&hub, "gpu1", &token);
    agent.set_hub_url(&url);
    agent.set_env("CORTEX_CA_CERT", ca.to_str().expect("utf8"));
    agent.spawn();
    hub.wait_online("gpu1");

    // A job on the device drops a signal file; the agent forwards it over wss:// through
    // the balancer, and the hub records it.
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "job", "intent": "look"}));
    let id = wp["id"].as_str().unwrap();
    let spool = agent.spool();
    std::fs::create_dir_all(&spool).expect("the agent's spool");
    let body = json!({"id": id, "secret": wp["secret"], "message": "over wss"}).to_string();
    std::fs::write(spool.join("job.tmp"), body).expect("write");
    std::fs::rename(spool.join("job.tmp"), spool.join("job.json")).expect("rename");
    let wake = hub.wait_wake(&sid, id, 1, T);
    assert_eq!(wake["reason"], "fired", "{wake}");
    assert_eq!(messages(&hub, id), ["over wss"]);
    wait_until(T, "the agent's spool emptied", || {
        (agent.pending() == 0).then_some(())
    });
}

/// A hub started by hand on fixed ports (HAProxy's config names them before it runs):
/// the standby of a dead hub, on its home and its store. Killed when dropped.
struct Standby {
    child: Child,
    _logs: tempfile::TempDir,
}

impl Standby {
    fn start(of: &Hub, http: &str, mesh: &str) -> Standby {
        let logs = tempfile::tempdir().expect("tmp");
        let log = std::fs::File::create(logs.path().join("hub.log")).expect("log");
        let mut cmd = Command::new(bin("cortex-hub"));
        cmd.arg("--home")
            .arg(&of.home)
            .args(["--listen", http, "--mesh-listen", mesh])
            .env("CORTEX_WEBHOOK_TOKEN", &of.token)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(url) = cortex_tests::store_url(&of.home) {
            cmd.arg("--store").arg(url);
        }
        Standby {
            child: cmd.spawn().expect("spawn the standby"),
            _logs: logs,
        }
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` through `url` with the operator token: (status, JSON body).
fn get_via(url: &str, token: &str, path: &str) -> (u16, Value) {
    let resp =
        cortex_cli::http::Request::new(cortex_cli::http::Method::Get, &format!("{url}{path}"))
            .header("authorization", &format!("Bearer {token}"))
            .timeout(Duration::from_secs(10))
            .send()
            .expect("an answer from haproxy");
    let v = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
    (resp.status, v)
}

#[test]
fn a_standby_started_behind_haproxy_takes_the_dead_hubs_clients_and_devices() {
    let mut a = Hub::start_with(&[("CORTEX_WEBHOOK_TOKEN", "load-balancer-standby-token")]);
    // The standby's place is in HAProxy's config before it runs, as an operator writes it.
    let (http, mesh) = (
        format!("127.0.0.1:{}", dead_port()),
        format!("127.0.0.1:{}", dead_port()),
    );
    let standby = Backend {
        name: "hub2".to_string(),
        http: http.clone(),
        mesh: Some(mesh.clone()),
    };
    let Some(lb) = haproxy_or_skip("load_balancer standby", &[Backend::of("hub1", &a), standby])
    else {
        return;
    };
    lb.wait_server("hubs", "hub1", "UP");
    lb.wait_server("hubs", "hub2", "DOWN");

    let token = a.add_device("gpu1");
    let mut agent = Agent::new(&a, "gpu1", &token);
    agent.set_hub_url(&lb.mesh_url());
    agent.spawn();
    a.wait_online("gpu1");
    let sid = a.session();
    let wp = a.waitpoint(&sid, json!({"label": "job", "intent": "look"}));
    let id = wp["id"].as_str().unwrap().to_string();
    // A long poll through the proxy, in flight on hub1 when it dies: past its announcement
    // (after which a lost hub is waited for), its one connection open.
    let said = tempfile::NamedTempFile::new().expect("tmp");
    let waiter = cortex_command(&a, &lb.url(""), &["wait", "for", &id, "--timeout", "120s"])
        .stderr(said.reopen().expect("the stderr file"))
        .spawn()
        .expect("spawn cortex wait for");
    wait_until(T, "the waiter's long poll open on hub1", || {
        let announced = std::fs::read_to_string(said.path())
            .is_ok_and(|t| t.contains(&format!("cortex: waiting for {id}")));
        (announced && lb.stat("hubs", "hub1", "scur").as_deref() == Some("1")).then_some(())
    });

    a.kill();
    lb.wait_server("hubs", "hub1", "DOWN");
    let _standby = Standby::start(&a, &http, &mesh);
    // Taken in by its first good check; no client is told.
    lb.wait_server("hubs", "hub2", "UP");
    lb.wait_server("meshes", "hub2", "UP");
    wait_until(T, "the device online again, through haproxy", || {
        let (st, d) = get_via(&lb.url(""), &a.token, "/api/devices/gpu1");
        (st == 200 && d["state"] == "online").then_some(())
    });

    let (code, err, _home) = signal_to(&lb.url("/webhook/signal"), &wp, "to the standby");
    assert_eq!(code, 0, "{err}\nhaproxy:\n{}", lb.log());
    assert_eq!(err, "", "delivered at once, nothing to say");
    let (code, out, _) = finish(waiter, "cortex wait for across the failover");
    let err = std::fs::read_to_string(said.path()).unwrap_or_default();
    assert_eq!(code, 0, "{err}\nhaproxy:\n{}", lb.log());
    let wake: Value = serde_json::from_str(out.trim()).expect("the wake on stdout");
    assert_eq!(wake["reason"], "fired", "{wake}");
    let (st, v) = get_via(&lb.url(""), &a.token, &format!("/api/waitpoints/{id}"));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["signals"][0]["message"], "to the standby", "{v}");
    assert_eq!(lb.stat("meshes", "hub2", "scur").as_deref(), Some("1"));
}

/// The harness's config is the one the docs show: the same checks, timeouts and retries,
/// and the same server lines for the docs' two hubs (their binds, log target and check
/// interval are the test's own).
#[test]
fn the_documented_config_is_the_tested_one() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operating.md"),
    )
    .expect("docs/operating.md");
    let hub = |n: u16| Backend {
        name: format!("hub{n}"),
        http: format!("127.0.0.1:3{n}01"),
        mesh: Some(format!("127.0.0.1:3{n}02")),
    };
    let cfg = cortex_tests::haproxy::config(
        "127.0.0.1:3001",
        "127.0.0.1:3002",
        std::path::Path::new("/run/haproxy/admin.sock"),
        &[hub(1), hub(2)],
        None,
    );
    let own = ["bind ", "stats socket ", "log ", "default-server "];
    for line in cfg
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !own.iter().any(|o| l.starts_with(o)))
    {
        assert!(
            doc.lines().any(|d| d.trim() == line),
            "docs/operating.md's HAProxy config lacks `{line}`"
        );
    }
}
