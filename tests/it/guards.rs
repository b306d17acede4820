//! Guards on what a client or a session may hold in the hub: a delete stops what the
//! session runs, an output schema is compiled once within its budget, and live log
//! followers share one byte budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cortex_cli::http::{Method, Request};
use cortex_tests::scripted_model::{Outcome, Reply, ScriptedModel};
use cortex_tests::{Hub, wait_until};
use serde_json::{Map, Value, json};

use crate::runner::{LIMIT, hub_with, new_session, run_end, say};

#[test]
fn deleting_a_session_stops_its_model_call() {
    // The call would hang for ten minutes: only the delete can end it within the test.
    let model = ScriptedModel::start_with_default(vec![Reply::hang()], Reply::text("fine"));
    let (hub, _tmp) = hub_with(
        &model,
        json!({"llm": {"firstByteTimeoutMs": 600000, "idleTimeoutMs": 600000, "maxRetries": 0}}),
    );
    let sid = new_session(&hub, json!({}));
    say(&hub, &sid, json!({"text": "think about it"}));
    model.wait_requests(1, LIMIT);
    let (st, v) = hub.api(Method::Delete, &format!("/api/sessions/{sid}"), None);
    assert_eq!(st, 200, "{v}");
    // The hub dropped the call: the server saw its client go.
    assert_eq!(model.wait_outcome(0, LIMIT), Outcome::ClientGone);
    // A cancel now finds no session; the model call is over all the same.
    let (st, v) = hub.api(Method::Post, &format!("/api/sessions/{sid}/cancel"), None);
    assert_eq!(st, 404, "{v}");
    // Another session runs to its end after the stopped one's task wrote what it wrote.
    let other = new_session(&hub, json!({}));
    say(&hub, &other, json!({"text": "hello"}));
    let end = run_end(&hub, &other, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    // The deleted session stays deleted: no event, no agent record brought back.
    let (st, v) = hub.api(Method::Get, &format!("/api/sessions/{sid}"), None);
    assert_eq!(st, 404, "{v}");
    let (st, v) = hub.api(Method::Get, &format!("/api/sessions/{sid}/events"), None);
    assert_eq!(st, 404, "{v}");
    let (_, list) = hub.api(Method::Get, "/api/sessions", None);
    let listed = list
        .as_array()
        .is_some_and(|l| l.iter().any(|s| s["id"] == sid));
    assert!(!listed, "{list}");
    assert_eq!(
        model.request_count(),
        2,
        "the deleted session's call was not made again"
    );
    let log = hub.log();
    assert!(!log.contains("stopped driving a session"), "{log}");
}

/// The schema the issue found: `d{n}` is `anyOf` over two `$ref`s of `d{n-1}`, `depth`
/// times (2^depth paths in a 2 KB document).
fn chained_any_of(depth: usize) -> Value {
    let mut defs = Map::new();
    defs.insert("d0".into(), json!({"type": "string"}));
    for n in 1..=depth {
        let prev = format!("#/$defs/d{}", n - 1);
        defs.insert(
            format!("d{n}"),
            json!({"anyOf": [{"$ref": prev}, {"$ref": prev}]}),
        );
    }
    json!({"$defs": defs, "$ref": format!("#/$defs/d{depth}")})
}

/// `/healthz` asked over and over on another thread until the answer is dropped: every
/// answer must be 200; the count is returned.
struct Health {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl Health {
    fn poll(hub: &Hub) -> Health {
        let url = hub.url("/healthz");
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut n = 0;
            while !s.load(Ordering::Relaxed) {
                let r = Request::new(Method::Get, &url)
                    .timeout(Duration::from_secs(10))
                    .send()
                    .expect("/healthz answers");
                assert_eq!(r.status, 200, "/healthz");
                n += 1;
                // A pace, not a wait: the poller asks again and again.
                std::thread::sleep(Duration::from_millis(5));
            }
            n
        });
        Health {
            stop,
            thread: Some(thread),
        }
    }

    fn answered(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .map(|t| t.join().expect("the /healthz poller"))
            .unwrap_or_default()
    }
}

#[test]
fn a_schema_whose_checks_never_end_is_refused_and_healthz_answers() {
    let model = ScriptedModel::start(vec![]);
    let (hub, _tmp) = hub_with(&model, json!({}));
    let health = Health::poll(&hub);
    let schema = chained_any_of(40);
    assert!(schema.to_string().len() < 2_600, "a 2 KB document");
    for _ in 0..5 {
        let t = Instant::now();
        let (st, v) = hub.api(
            Method::Post,
            "/api/sessions",
            Some(&json!({"runs": true, "output": {"schema": schema}})),
        );
        assert_eq!(st, 400, "{v}");
        assert_eq!(v["error"], "schema_too_complex", "{v}");
        let m = v["message"].as_str().unwrap_or_default();
        assert!(m.contains("more than 20000 subschemas"), "{m}");
        eprintln!("the depth-40 chain refused in {:?}", t.elapsed());
    }
    // The same shape a level short of the bound is a session.
    let (st, v) = hub.api(
        Method::Post,
        "/api/sessions",
        Some(&json!({"runs": true, "output": {"schema": chained_any_of(12)}})),
    );
    assert_eq!(st, 201, "{v}");
    let n = health.answered();
    assert!(n > 0, "/healthz was asked");
    eprintln!("/healthz answered {n} times meanwhile");
}

#[test]
fn a_schema_that_compiles_past_its_budget_is_refused_while_the_hub_answers() {
    let model = ScriptedModel::start(vec![]);
    let (hub, _tmp) = hub_with(&model, json!({"limits": {"schemaCompileMs": 100}}));
    // 2,000 patterns pass the precheck (2,001 subschemas) and take seconds to compile in
    // a debug build, hundreds of milliseconds in a release one: past 100 ms either way.
    let mut props = Map::new();
    for i in 0..2_000 {
        props.insert(
            format!("p{i}"),
            json!({"type": "string", "pattern": format!("^(a|b|c|d|e){{2,40}}[a-z0-9]{{1,64}}x{i}$")}),
        );
    }
    let slow = json!({"type": "object", "properties": props});
    let health = Health::poll(&hub);
    let t = Instant::now();
    let (st, v) = hub.api(
        Method::Post,
        "/api/sessions",
        Some(&json!({"runs": true, "output": {"schema": slow}})),
    );
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"], "schema_compile_timeout", "{v}");
    let m = v["message"].as_str().unwrap_or_default();
    assert!(m.contains("limits.schemaCompileMs (100 ms)"), "{m}");
    eprintln!("refused after {:?}", t.elapsed());
    // The compile goes on on its blocking thread; the hub answers meanwhile, and a
    // small schema waits its turn (503 while the slow one still holds the slot).
    let (st, _) = hub.api(Method::Get, "/api/sessions", None);
    assert_eq!(st, 200);
    let small = json!({"runs": true, "output": {"schema": {"type": "object"}}});
    let busy = std::cell::Cell::new(0);
    wait_until(Duration::from_secs(120), "a small schema accepted", || {
        let (st, v) = hub.api(Method::Post, "/api/sessions", Some(&small));
        match st {
            201 => Some(()),
            503 => {
                assert_eq!(v["error"], "schema_compile_busy", "{v}");
                busy.set(busy.get() + 1);
                None
            }
            _ => panic!("{st} {v}"),
        }
    });
    let n = health.answered();
    assert!(n > 0, "/healthz was asked");
    eprintln!(
        "/healthz answered {n} times meanwhile; the small schema was told busy {} times",
        busy.get()
    );
}

/// One SSE client on a raw socket that sends its request and reads nothing until told.
struct Stuck {
    sock: std::net::TcpStream,
    port: u16,
}

impl Stuck {
    fn open(hub: &Hub, path: &str) -> Stuck {
        use std::io::Write;
        let mut sock = std::net::TcpStream::connect(&hub.addr).expect("connect");
        let port = sock.local_addr().expect("local addr").port();
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\n\r\n",
            hub.addr, hub.token
        );
        sock.write_all(req.as_bytes()).expect("request");
        Stuck { sock, port }
    }

    /// Reads what the hub sent until it closed the connection: the seqs of the whole
    /// events in it (a message cut off by the close is not one).
    fn read_to_close(mut self) -> Vec<u64> {
        use std::io::Read;
        self.sock
            .set_read_timeout(Some(LIMIT))
            .expect("read timeout");
        let mut raw = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match self.sock.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("the hub did not close a dropped follower's connection: {e}"),
            }
        }
        sse_seqs(&unchunked(&raw))
    }
}

/// An HTTP/1.1 response's body, chunked transfer decoded as far as it goes.
fn unchunked(raw: &[u8]) -> Vec<u8> {
    let text = raw;
    let Some(head_end) = text.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Vec::new();
    };
    let head = String::from_utf8_lossy(&text[..head_end]);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut at = head_end + 4;
    let mut out = Vec::new();
    loop {
        let Some(eol) = text[at..].windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = std::str::from_utf8(&text[at..at + eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok());
        let Some(size) = size else { return out };
        if size == 0 {
            return out;
        }
        at += eol + 2;
        let end = (at + size).min(text.len());
        out.extend_from_slice(&text[at..end]);
        if end < at + size {
            return out;
        }
        at = end + 2;
        if at > text.len() {
            return out;
        }
    }
}

/// The seqs of the whole `event: event` messages in an SSE body, checked against their
/// data.
fn sse_seqs(body: &[u8]) -> Vec<u64> {
    let text = String::from_utf8_lossy(body);
    let mut seqs = Vec::new();
    let mut frames: Vec<&str> = text.split("\n\n").collect();
    // What follows the last blank line is a message the close cut off (or nothing).
    frames.pop();
    for frame in frames {
        let mut id = None;
        let mut data = String::new();
        for line in frame.lines() {
            if let Some(v) = line.strip_prefix("id:") {
                id = v.trim().parse::<u64>().ok();
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push_str(v.trim_start());
            }
        }
        if let Some(id) = id {
            let v: Value = serde_json::from_str(&data).expect("an event's JSON");
            assert_eq!(v["seq"], id, "the id is the event's seq");
            seqs.push(id);
        }
    }
    seqs
}

/// A reading SSE client: the seqs of the events it reads, until one is `last`.
fn read_until(hub: &Hub, path: &str, last_event_id: Option<u64>, last: u64) -> Vec<u64> {
    use std::io::BufRead;
    let bearer = format!("Bearer {}", hub.token);
    let url = hub.url(path);
    let mut req = Request::new(Method::Get, &url)
        .header("authorization", &bearer)
        .timeout(LIMIT);
    let id = last_event_id.map(|n| n.to_string());
    if let Some(id) = &id {
        req = req.header("last-event-id", id);
    }
    let mut stream = req.open("text/event-stream").expect("stream");
    assert_eq!(stream.status, 200);
    let mut seqs = Vec::new();
    let mut lines = std::io::BufReader::new(&mut stream.body).lines();
    while seqs.last() != Some(&last) {
        let line = lines.next().expect("a line before the end").expect("read");
        if let Some(v) = line.strip_prefix("id:") {
            seqs.push(v.trim().parse::<u64>().expect("a seq"));
        }
    }
    seqs
}

/// The hub's resident memory, from /proc.
fn rss_kib(hub: &Hub) -> u64 {
    let pid = hub.pid().expect("the hub runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The ports of the followers the hub says it dropped.
fn dropped_ports(hub: &Hub) -> Vec<u16> {
    hub.log()
        .lines()
        .filter(|l| l.contains("a slow log follower was dropped"))
        .filter_map(|l| {
            let peer = l.split("peer=").nth(1)?.split_whitespace().next()?;
            peer.rsplit(':').next()?.parse().ok()
        })
        .collect()
}

fn contiguous(seqs: &[u64], from: u64, to: u64) {
    let want: Vec<u64> = (from..=to).collect();
    assert_eq!(
        seqs,
        want.as_slice(),
        "every event from {from} to {to}, once, in order"
    );
}

#[test]
fn slow_followers_are_dropped_past_one_budget_and_resume_without_loss() {
    let model = ScriptedModel::start(vec![]);
    let (hub, _tmp) = hub_with(&model, json!({"limits": {"followerBytes": 1048576}}));
    let (st, v) = hub.api(Method::Post, "/api/sessions", Some(&json!({"runs": false})));
    assert_eq!(st, 201, "{v}");
    let sid = v["id"].as_str().expect("id").to_string();
    // 12 MB of log: more than a socket's buffers hold, so a follower that never reads
    // keeps its share of it in the hub.
    let text = "x".repeat(60_000);
    for i in 0..200 {
        let (st, v) = hub.api(
            Method::Post,
            &format!("/api/sessions/{sid}/messages"),
            Some(&json!({"text": format!("{i} {text}")})),
        );
        assert_eq!(st, 201, "{v}");
    }
    let last = |hub: &Hub| {
        let (_, v) = hub.api(Method::Get, &format!("/api/sessions/{sid}"), None);
        v["last_seq"].as_u64().expect("last_seq")
    };
    let first_last = last(&hub);
    let path = format!("/api/sessions/{sid}/events?after=0");
    // A reading follower reads it all, then waits for more.
    let reader = {
        let (hub_addr, token, path) = (hub.addr.clone(), hub.token.clone(), path.clone());
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        let t = std::thread::spawn(move || {
            use std::io::BufRead;
            let (url, bearer) = (
                format!("http://{hub_addr}{path}"),
                format!("Bearer {token}"),
            );
            let mut stream = Request::new(Method::Get, &url)
                .header("authorization", &bearer)
                .timeout(LIMIT)
                .open("text/event-stream")
                .expect("stream");
            let mut lines = std::io::BufReader::new(&mut stream.body).lines();
            while let Some(Ok(line)) = lines.next() {
                if let Some(v) = line.strip_prefix("id:")
                    && tx.send(v.trim().parse().expect("a seq")).is_err()
                {
                    return;
                }
            }
        });
        (t, rx)
    };
    let mut read: Vec<u64> = Vec::new();
    while read.last() != Some(&first_last) {
        read.push(reader.1.recv_timeout(LIMIT).expect("the reader reads"));
    }
    contiguous(&read, 1, first_last);
    let before = rss_kib(&hub);
    // 24 followers that never read: past the budget together.
    let stuck: Vec<Stuck> = (0..24).map(|_| Stuck::open(&hub, &path)).collect();
    let dropped = wait_until(LIMIT, "the hub drops a slow follower", || {
        let d = dropped_ports(&hub);
        (!d.is_empty()).then_some(d)
    });
    let during = rss_kib(&hub);
    eprintln!(
        "hub RSS: {before} KiB with one reading follower; {during} KiB with 24 that never read (budget 1 MiB); dropped so far: {}",
        dropped.len()
    );
    // The reading follower goes on: what is posted now reaches it.
    let (st, v) = hub.api(
        Method::Post,
        &format!("/api/sessions/{sid}/messages"),
        Some(&json!({"text": "after the drops"})),
    );
    assert_eq!(st, 201, "{v}");
    let final_last = last(&hub);
    while read.last() != Some(&final_last) {
        read.push(reader.1.recv_timeout(LIMIT).expect("the reader reads on"));
    }
    contiguous(&read, 1, final_last);
    let drops = dropped_ports(&hub).len();
    // Each dropped follower's connection is closed; what it got is a whole prefix of
    // the log, and it resumes after its last seq with nothing lost.
    let (gone, kept): (Vec<Stuck>, Vec<Stuck>) =
        stuck.into_iter().partition(|s| dropped.contains(&s.port));
    assert!(!gone.is_empty());
    let kept_open = kept.len();
    // The ones still open hold the budget between them; closed, they make room for the
    // resumes (a resume that met them could be dropped in turn, and resume again).
    drop(kept);
    for s in gone.into_iter().take(3) {
        let got = s.read_to_close();
        let upto = got.last().copied().unwrap_or(0);
        contiguous(&got, 1, upto);
        // The browser's way: the same URL (after=0) with Last-Event-ID.
        let rest = read_until(&hub, &path, Some(upto), final_last);
        contiguous(&rest, upto + 1, final_last);
    }
    eprintln!(
        "{} of 24 never-reading followers dropped at first ({drops} by the end); {} still open; hub RSS now {} KiB",
        dropped.len(),
        kept_open,
        rss_kib(&hub)
    );
    drop(reader.1);
}

#[test]
fn a_store_killed_mid_write_opens_without_walking_every_page() {
    let mut hub = Hub::start();
    let (st, v) = hub.api(Method::Post, "/api/sessions", Some(&json!({"runs": false})));
    assert_eq!(st, 201, "{v}");
    let sid = v["id"].as_str().expect("id").to_string();
    let text = "z".repeat(4_000);
    for i in 0..300 {
        let (st, _) = hub.api(
            Method::Post,
            &format!("/api/sessions/{sid}/messages"),
            Some(&json!({"text": format!("{i} {text}")})),
        );
        assert_eq!(st, 201);
    }
    hub.kill();
    hub.spawn();
    // Every commit carries redb's allocator state: no full repair after the kill.
    let log = hub.log();
    assert!(!log.contains("repairing the store"), "{log}");
    assert_eq!(
        hub.events(&sid, 0).len(),
        300,
        "nothing acknowledged was lost"
    );
}
