//! The whole daemon (`agent::run`) against the in-test hub of `fake_hub.rs`: the hello and
//! its headers, forwarding and acks, refusals, the window, reconnects, dead-link
//! detection, retry-after, TLS, and a clean stop.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cortex_protocol::mesh::{AgentFrame, CloseReason, DEVICE_HEADER, FileOutcome, MESH_VERSION};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::fake_hub::{FakeHub, LIMIT};
use super::forward::{drop_file, signal};
use crate::agent::{self, AgentError, Config, HubUrl, HubUrls, Timing, Token};

const TOKEN: &str = "tok_s3cret_for_tests";

/// Timings shortened for tests; the rules are the daemon's.
fn timing() -> Timing {
    Timing {
        connect_timeout: Duration::from_secs(2),
        welcome_timeout: Duration::from_secs(2),
        backoff_base: Duration::from_millis(50),
        backoff_cap: Duration::from_millis(200),
        stable_after: Duration::from_secs(60),
        lived_after: Duration::from_millis(100),
        busy_cap: Duration::from_millis(100),
        rescan: Duration::from_secs(30),
        retry_delay: Duration::from_millis(200),
        ack_timeout: Duration::from_secs(120),
        status_every: Duration::from_millis(50),
    }
}

pub(super) fn config(home: &Path, url: &str) -> Config {
    Config {
        hubs: HubUrls::one(HubUrl::parse(url, false).expect("url")),
        name: "gpu1".into(),
        token: Token::new(TOKEN, "test").expect("token"),
        token_file: None,
        home: home.to_owned(),
        ca_cert: None,
        allow_exec: false,
        exec_allow: Vec::new(),
        exec_launcher: crate::agent::exec::SELF_EXE.into(),
        timing: timing(),
    }
}

/// A running agent; dropping it without [`Agent::stop`] aborts it.
pub(super) struct Agent {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), AgentError>>,
    spool: PathBuf,
}

impl Agent {
    pub(super) fn start(config: Config) -> Agent {
        let spool = config.spool_dir();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(agent::run(config, async {
            let _ = rx.await;
        }));
        Agent {
            stop: Some(tx),
            task,
            spool,
        }
    }

    pub(super) async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let task = &mut self.task;
        tokio::time::timeout(LIMIT, task)
            .await
            .expect("the agent stops within the limit")
            .expect("no panic")
            .expect("run returns Ok");
    }

    fn exists(&self, name: &str) -> bool {
        self.spool.join(name).exists()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The spool dir, created 0700 before the agent starts (so files can be dropped first).
fn spool_in(home: &Path) -> PathBuf {
    let dir = home.join("tmp").join("signals");
    cortex_host::spool::Spool::open(&dir).expect("spool");
    dir
}

/// Polls `f` until true, at most [`LIMIT`].
pub(super) async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < LIMIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_forwarded_and_deleted_only_once_acknowledged() {
    let home = tempfile::tempdir().expect("tmp");
    let spool = spool_in(home.path());
    for i in 0..3 {
        drop_file(&spool, &format!("100{i}.json"), &signal(i));
    }
    let hub = FakeHub::bind().await;
    let agent = Agent::start(config(home.path(), &hub.url()));

    let mut conn = hub.accept().await;
    assert_eq!(
        conn.header("authorization").as_deref(),
        Some(&*format!("Bearer {TOKEN}"))
    );
    assert_eq!(conn.header(DEVICE_HEADER).as_deref(), Some("gpu1"));
    let hello = conn.welcome_default().await;
    assert_eq!(hello.version, MESH_VERSION);
    assert_eq!(hello.device, "gpu1");
    assert_eq!(hello.agent_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(
        hello.capabilities,
        [
            "spool",
            "wait-pid",
            "wait-file",
            "wait-flock",
            "wait-log",
            "wait-silence",
            "wait-any",
            "wait-pid-must-exist"
        ]
    );
    assert!(hello.waits.is_empty());
    assert_eq!(hello.spool.pending, 3);
    assert!(!hello.host.hostname.is_empty());

    let mut names = Vec::new();
    for _ in 0..3 {
        let (name, body) = conn.file().await;
        assert!(body.contains("s3cret"), "the file's text as written");
        names.push(name);
    }
    names.sort();
    assert_eq!(names, ["1000.json", "1001.json", "1002.json"]);
    // Not acknowledged yet: still on disk.
    assert!(names.iter().all(|n| agent.exists(n)));
    conn.ack(&names[0], FileOutcome::Accepted).await;
    conn.ack(&names[1], FileOutcome::Duplicate).await;
    eventually("acked files removed", || {
        !agent.exists(&names[0]) && !agent.exists(&names[1])
    })
    .await;
    assert!(agent.exists(&names[2]));

    // A file dropped while connected goes at once (inotify).
    drop_file(&spool, "2000.json", &signal(9));
    let (name, _) = conn.file().await;
    assert_eq!(name, "2000.json");
    conn.ack(&name, FileOutcome::Resolved).await;
    eventually("resolved file removed", || !agent.exists("2000.json")).await;

    // Stopping closes the link with a reason; the unacknowledged file stays.
    let stop = tokio::spawn(agent.stop());
    let reason = conn.close_reason().await.expect("a close reason");
    assert_eq!(reason.code, "shutting_down");
    stop.await.expect("stop");
    assert!(spool.join(&names[2]).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_files_are_parked_with_the_hubs_reason() {
    let home = tempfile::tempdir().expect("tmp");
    let spool = spool_in(home.path());
    drop_file(&spool, "a.json", &signal(1));
    let hub = FakeHub::bind().await;
    let agent = Agent::start(config(home.path(), &hub.url()));
    let mut conn = hub.accept().await;
    conn.welcome_default().await;
    let (name, _) = conn.file().await;
    conn.ack(
        &name,
        FileOutcome::Refused {
            reason: "waitpoint wp_1 has members; add \"member\":\"NAME\" with one of: arm2".into(),
        },
    )
    .await;
    let reason = spool.join("bad").join("a.json.reason");
    eventually("parked with a reason", || reason.exists()).await;
    assert!(!agent.exists("a.json"));
    let text = std::fs::read_to_string(&reason).expect("reason");
    assert!(text.contains("one of: arm2"), "{text}");

    // The status frame tells the hub about the parked file.
    let mut saw = None;
    while let Ok(Some(f)) = conn.frame_within(Duration::from_secs(2)).await {
        if let AgentFrame::Status { spool } = f {
            saw = Some(spool);
            if spool.bad == 1 {
                break;
            }
        }
    }
    let counts = saw.expect("a status frame");
    assert_eq!((counts.pending, counts.bad), (0, 1));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_keeps_the_file_and_sends_it_again_later() {
    let home = tempfile::tempdir().expect("tmp");
    let spool = spool_in(home.path());
    drop_file(&spool, "a.json", &signal(1));
    let hub = FakeHub::bind().await;
    let agent = Agent::start(config(home.path(), &hub.url()));
    let mut conn = hub.accept().await;
    conn.welcome_default().await;
    let (name, _) = conn.file().await;
    let at = Instant::now();
    conn.ack(
        &name,
        FileOutcome::Retry {
            reason: "store failure".into(),
        },
    )
    .await;
    let (again, _) = conn.file().await;
    assert_eq!(again, name);
    assert!(
        at.elapsed() >= Duration::from_millis(150),
        "{:?}",
        at.elapsed()
    );
    assert!(agent.exists(&name));
    conn.ack(&name, FileOutcome::Accepted).await;
    eventually("removed after the second try", || !agent.exists(&name)).await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_window_stops_reading_the_spool() {
    let home = tempfile::tempdir().expect("tmp");
    let spool = spool_in(home.path());
    for i in 0..10 {
        drop_file(&spool, &format!("{i:02}.json"), &signal(i));
    }
    let hub = FakeHub::bind().await;
    let agent = Agent::start(config(home.path(), &hub.url()));
    let mut conn = hub.accept().await;
    conn.welcome(20_000, 3).await;
    let mut sent = Vec::new();
    for _ in 0..3 {
        sent.push(conn.file().await.0);
    }
    assert_eq!(sent, ["00.json", "01.json", "02.json"]);
    assert!(
        conn.file_within(Duration::from_millis(500)).await.is_none(),
        "a fourth file while three are unacknowledged"
    );
    conn.ack("01.json", FileOutcome::Accepted).await;
    assert_eq!(conn.file().await.0, "03.json");
    assert!(conn.file_within(Duration::from_millis(300)).await.is_none());
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_reconnects_after_the_hub_restarts_and_sends_what_waited() {
    let home = tempfile::tempdir().expect("tmp");
    let spool = spool_in(home.path());
    let hub = FakeHub::bind().await;
    let addr = hub.addr;
    let agent = Agent::start(config(home.path(), &hub.url()));
    let mut conn = hub.accept().await;
    conn.welcome_default().await;

    // The hub goes away: its listener and the link.
    drop(conn);
    drop(hub);
    drop_file(&spool, "while-down.json", &signal(1));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        agent.exists("while-down.json"),
        "files wait while the hub is away"
    );

    let hub = FakeHub::bind_at(addr).await;
    let mut conn = hub.accept().await;
    let hello = conn.welcome_default().await;
    assert_eq!(hello.spool.pending, 1);
    let (name, _) = conn.file().await;
    assert_eq!(name, "while-down.json");
    conn.ack(&name, FileOutcome::Accepted).await;
    eventually("removed after the reconnect", || !agent.exists(&name)).await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_hub_is_detected_within_two_ping_intervals() {
    let home = tempfile::tempdir().expect("tmp");
    spool_in(home.path());
    let hub = FakeHub::bind().await;
    let agent = Agent::start(config(home.path(), &hub.url()));
    let ping = Duration::from_millis(200);

    // A hub that reads (and so answers pings) keeps the link for many intervals.
    let mut conn = hub.accept().await;
    conn.welcome(200, 64).await;
    let alive = conn.keep_alive();
    let quiet = tokio::time::timeout(ping * 6, hub.try_accept()).await;
    assert!(
        quiet.is_err(),
        "the agent reconnected although the hub answered pings"
    );
    alive.abort();
    let _ = alive.await;

    // A hub that stops reading (SIGSTOP, a dead route) answers nothing: the agent drops
    // the link after two intervals and dials again.
    let mut conn = hub.accept().await;
    conn.welcome(200, 64).await;
    let silent_since = Instant::now();
    let _held = conn; // kept open, never read again
    let next = hub.accept().await;
    let took = silent_since.elapsed();
    assert!(
        took >= ping * 2 - Duration::from_millis(50),
        "too early: {took:?}"
    );
    // Two intervals, plus at most the test backoff's cap, plus scheduling slack.
    assert!(
        took <= ping * 2 + Duration::from_millis(200 + 400),
        "too late: {took:?}"
    );
    drop(next);
    drop(agent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_is_retried_slowly_and_after_the_hubs_retry_after() {
    let home = tempfile::tempdir().expect("tmp");
    spool_in(home.path());
    let hub = FakeHub::bind().await;
    let agent = Agent::start(config(home.path(), &hub.url()));

    let body = serde_json::to_string(&CloseReason {
        code: "unauthorized".into(),
        message: "unknown device or wrong token".into(),
        retry_after_ms: Some(700),
    })
    .expect("json");
    hub.refuse(401, &body).await;
    let refused_at = Instant::now();
    // Not before the hub's retry-after, although the test backoff's cap is 200 ms.
    let mut conn = hub.accept().await;
    let waited = refused_at.elapsed();
    assert!(
        waited >= Duration::from_millis(650),
        "retried after {waited:?}"
    );
    conn.welcome_default().await;

    // A hub that ends the link with a retry-after is called again only after it, too.
    conn.close_with(&CloseReason {
        code: "overloaded".into(),
        message: "try later".into(),
        retry_after_ms: Some(600),
    })
    .await;
    let closed_at = Instant::now();
    let _conn = hub.accept().await;
    let waited = closed_at.elapsed();
    assert!(
        waited >= Duration::from_millis(550),
        "redialed after {waited:?}"
    );
    agent.stop().await;
}

/// Two hubs: a refusal by the first (with a minute-long floor) sends the agent to the
/// second at once; once that link proved stable (an ack), its loss, floor and all, sends
/// the agent straight back to the first. The floors and the backoff wait only at the end of
/// a round (`rotation.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_hubs_a_refusal_or_a_lost_link_moves_to_the_other_at_once() {
    let home = tempfile::tempdir().expect("tmp");
    let spool = spool_in(home.path());
    let a = FakeHub::bind().await;
    let b = FakeHub::bind().await;
    let mut c = config(home.path(), &a.url());
    c.hubs = HubUrls::parse(&[a.url(), b.url()], false).expect("urls");
    let agent = Agent::start(c);
    let minute = |code: &str| CloseReason {
        code: code.into(),
        message: "later".into(),
        retry_after_ms: Some(60_000),
    };

    let body = serde_json::to_string(&minute("unauthorized")).expect("json");
    a.refuse(401, &body).await;
    let refused_at = Instant::now();
    let mut conn = b.accept().await;
    assert!(
        refused_at.elapsed() < Duration::from_secs(5),
        "{:?}",
        refused_at.elapsed()
    );
    conn.welcome_default().await;
    drop_file(&spool, "1000.json", &signal(1));
    let (name, _) = conn.file().await;
    conn.ack(&name, FileOutcome::Accepted).await;
    eventually("the acked file removed", || !agent.exists(&name)).await;

    conn.close_with(&minute("shutting_down")).await;
    let closed_at = Instant::now();
    let mut back = a.accept().await;
    assert!(
        closed_at.elapsed() < Duration::from_secs(5),
        "{:?}",
        closed_at.elapsed()
    );
    back.welcome_default().await;
    agent.stop().await;
}

/// Three hubs restarted one after another (a rolling restart), each link lost long
/// before it could prove stable: a link that lived past `lived_after` sends the agent to
/// the next hub at once every time, however many in a row. Before, the third loss ended
/// the rotation's round and waited for the backoff (here at least 3 s, its floor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_that_lived_are_followed_by_the_next_hub_at_once_however_many_in_a_row() {
    let home = tempfile::tempdir().expect("tmp");
    spool_in(home.path());
    let hubs = [
        FakeHub::bind().await,
        FakeHub::bind().await,
        FakeHub::bind().await,
    ];
    let mut c = config(home.path(), &hubs[0].url());
    c.hubs =
        HubUrls::parse(&hubs.iter().map(FakeHub::url).collect::<Vec<_>>(), false).expect("urls");
    c.timing.backoff_base = Duration::from_secs(30);
    c.timing.backoff_cap = Duration::from_secs(60);
    let agent = Agent::start(c);
    let mut conn = hubs[0].accept().await;
    conn.welcome_default().await;
    for i in 1..=7 {
        tokio::time::sleep(Duration::from_millis(150)).await; // past lived_after
        drop(conn);
        let lost_at = Instant::now();
        conn = hubs[i % 3].accept().await;
        assert!(
            lost_at.elapsed() < Duration::from_secs(2),
            "loss {i}: the next hub dialed {:?} after",
            lost_at.elapsed()
        );
        conn.welcome_default().await;
    }
    agent.stop().await;
}

/// Hubs that answer but refuse the link because their store is away (the database
/// restarting): the rounds wait at most `busy_cap`, however many fail, not the backoff
/// (here at least 3 s, its floor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hubs_whose_store_is_away_are_dialed_again_within_the_busy_cap() {
    let home = tempfile::tempdir().expect("tmp");
    spool_in(home.path());
    let hubs = [FakeHub::bind().await, FakeHub::bind().await];
    let mut c = config(home.path(), &hubs[0].url());
    c.hubs =
        HubUrls::parse(&hubs.iter().map(FakeHub::url).collect::<Vec<_>>(), false).expect("urls");
    c.timing.backoff_base = Duration::from_secs(30);
    c.timing.backoff_cap = Duration::from_secs(60);
    let agent = Agent::start(c);
    let busy = CloseReason {
        code: "store_unavailable".into(),
        message: "the hub could not record the link; retry shortly".into(),
        retry_after_ms: None,
    };
    let mut refused_at = Instant::now();
    for i in 0..6 {
        let mut conn = hubs[i % 2]
            .try_accept()
            .await
            .unwrap_or_else(|e| panic!("dial {i}: {e}"));
        assert!(
            refused_at.elapsed() < Duration::from_secs(2),
            "refusal {i}: dialed again {:?} after",
            refused_at.elapsed()
        );
        conn.hello().await;
        conn.close_with(&busy).await;
        refused_at = Instant::now();
    }
    let mut conn = hubs[0].accept().await;
    conn.welcome_default().await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_token_in_the_token_file_is_dialed_at_once_after_a_refusal() {
    let home = tempfile::tempdir().expect("tmp");
    spool_in(home.path());
    let file = home.path().join("device-token");
    std::fs::write(&file, format!("{TOKEN}\n")).expect("token file");
    let hub = FakeHub::bind().await;
    let mut c = config(home.path(), &hub.url());
    c.token_file = Some(file.clone());
    let agent = Agent::start(c);

    // Refused, with the hub's minute-long floor: the same token would wait it out.
    let body = serde_json::to_string(&CloseReason {
        code: "forbidden".into(),
        message: "unknown device or wrong token".into(),
        retry_after_ms: Some(60_000),
    })
    .expect("json");
    hub.refuse(403, &body).await;
    // Re-enrolled: the new token goes to the file (replaced, as an installer does).
    let tmp = home.path().join("device-token.new");
    std::fs::write(&tmp, "fresh-token\n").expect("new token");
    std::fs::rename(&tmp, &file).expect("replace");
    // Within the fake hub's accept bound (10 s), far inside the refused token's 60 s.
    let mut conn = hub.accept().await;
    assert_eq!(
        conn.header("authorization").as_deref(),
        Some("Bearer fresh-token")
    );
    conn.welcome_default().await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_with_a_private_ca_given_by_ca_cert() {
    let home = tempfile::tempdir().expect("tmp");
    let spool = spool_in(home.path());
    drop_file(&spool, "tls.json", &signal(1));
    let ca = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/agent/tests/tls/ca.pem");

    // Without the CA the agent does not trust the hub: the handshake fails.
    let hub = FakeHub::bind_tls().await;
    let agent = Agent::start(config(home.path(), &hub.wss_url()));
    let err = hub.try_accept().await.err().expect("an untrusted hub");
    assert!(err.contains("TLS handshake failed"), "{err}");
    drop(agent);

    let mut cfg = config(home.path(), &hub.wss_url());
    cfg.ca_cert = Some(ca);
    let agent = Agent::start(cfg);
    // A dial of the first agent may still be in the backlog: skip failed handshakes.
    let mut conn = None;
    for _ in 0..5 {
        if let Ok(c) = hub.try_accept().await {
            conn = Some(c);
            break;
        }
    }
    let mut conn = conn.expect("the agent trusts the hub with --ca-cert");
    conn.welcome_default().await;
    let (name, _) = conn.file().await;
    assert_eq!(name, "tls.json");
    conn.ack(&name, FileOutcome::Accepted).await;
    eventually("removed over wss", || !agent.exists("tls.json")).await;
    agent.stop().await;
}

#[tokio::test]
async fn a_spool_writable_by_others_is_refused_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().expect("tmp");
    let spool = spool_in(home.path());
    std::fs::set_permissions(&spool, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let r = agent::run(config(home.path(), "ws://127.0.0.1:1/mesh/v1"), async {}).await;
    let e = r.expect_err("an insecure spool");
    assert!(e.to_string().contains("chmod 700"), "{e}");
}
