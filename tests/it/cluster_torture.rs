//! Cluster torture: three hubs on one PostgreSQL database (a cluster of its own; the first
//! hub reaches it through a TCP proxy the test controls), clients sending keyed signals to
//! monitors over all three (a refused or dead hub: the next one, the same key), and agent
//! sessions against the scripted model whose turns start a command on one of four devices
//! (`device_exec`; each device agent is given all three hubs, so the session's hub and the
//! link's are often not the same), in two of them only once a person approved it from a
//! random hub, and every third turn sets a timer whose wake is a run of its own. Every
//! cycle a random hub is SIGKILLed and started again; every third cycle another is also
//! SIGSTOPped past its lease and continued; every fourth (from the second) the proxy
//! resets the first hub's connections to the database; every fifth (from the fourth)
//! PostgreSQL itself crashes and recovers (a backend SIGKILLed: every connection ends,
//! the WAL is replayed). After every cycle, every signal answered 202 is recorded exactly
//! once and every device is linked again; at the end, every message and every timer got
//! exactly one run, every call ran once (none twice, none lost), every approval was asked
//! once per call and none is left waiting, every timer fired once, no command was started
//! twice on a device, and no session is left running.
//!
//! `CORTEX_CLUSTER_TORTURE_CYCLES` sets the cycles (default 4, one of each fault, so
//! `cargo test` stays fast); the full run is `cargo xtask cluster-torture` (30). `CORTEX_TORTURE_SEED`
//! replays a run's choices (the seed is printed; the timing is the OS's).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use cortex_cli::http::{Method, Request};
use cortex_tests::cut_proxy::CutProxy;
use cortex_tests::postgres::Postgres;
use cortex_tests::scripted_model::{Reply, ScriptedModel};
use cortex_tests::{Hub, wait_until};
use serde_json::{Value, json};

use crate::cluster::{LEASE_MS, lease_hub_with, signal};
use crate::signal_load::{Rng, count_from_env, keyed_body, seed_from_env, view};
use cortex_tests::agent::Agent;

const HUBS: usize = 3;
const CLIENTS: usize = 3;
const MONITORS: usize = 100;
/// Keys one monitor gets at most, so its view (the latest 1,000 signals) lists them all.
const BUDGET: usize = 900;
const SESSIONS: usize = 4;
const DEVICES: usize = 4;
/// How long a run may take across kills: a lease, a restart, the model's answers.
const RUN_LIMIT: Duration = Duration::from_secs(120);
/// The sessions (the first ones) whose `device_exec` calls wait for a person's approval.
const APPROVING: usize = 2;
/// Every third message of a session asks for a timer this far off (the shortest the
/// hub allows by default), which wakes the session for a run of its own.
const TIMER_S: u64 = 5;

/// What one session was asked, to check against its log.
#[derive(Default, Debug)]
struct Asked {
    /// Runs that must have ended: one per message, one more per timer.
    runs: usize,
    /// `device_exec` calls that must have run, once each.
    execs: usize,
    /// `schedule_wakeup` calls, and the timers that must have fired once each.
    timers: usize,
    /// Approvals answered (a request seen again after a hub's death is answered again).
    approvals: usize,
}

/// What the load and the checks share.
struct Shared {
    /// Each hub's `IP:PORT`, changed at each restart.
    addrs: Vec<RwLock<String>>,
    token: String,
    stop: AtomicBool,
    /// Monitor ids and secrets.
    monitors: Vec<(String, String)>,
    /// Per monitor: every key sent, and those answered 202.
    sent: Vec<Mutex<HashSet<String>>>,
    acked: Vec<Mutex<HashSet<String>>>,
    /// Sends that went to another hub after one refused or was down.
    failovers: AtomicUsize,
    /// Runs asked of the sessions (one message each, the next once it ended).
    runs: AtomicUsize,
    /// A session whose run did not end within [`RUN_LIMIT`], and what its talker saw.
    stuck: Mutex<Option<(String, String)>>,
}

/// Sends `body` to hub `first`, then the others in turn, until one answers below 500.
fn send(sh: &Shared, first: usize, body: &[u8]) -> Option<u16> {
    let start = Instant::now();
    let mut at = first;
    loop {
        let url = format!(
            "http://{}/webhook/signal",
            sh.addrs[at].read().unwrap_or_else(|e| e.into_inner())
        );
        let r = Request::new(Method::Post, &url)
            .json(body)
            .connect_timeout(Duration::from_millis(300))
            .timeout(Duration::from_secs(10))
            .send();
        match r {
            Ok(resp) if resp.status < 500 => return Some(resp.status),
            _ => {}
        }
        if start.elapsed() > Duration::from_secs(60) {
            return None;
        }
        at = (at + 1) % HUBS;
        sh.failovers.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn client(sh: Arc<Shared>, n: usize, seed: u64) {
    let mut rng = Rng(seed ^ (n as u64).wrapping_mul(0x9E37_79B9));
    let mut k = 0u64;
    while !sh.stop.load(Ordering::Relaxed) {
        let m = rng.below(MONITORS as u64) as usize;
        let key = format!("c{n}-{k}");
        k += 1;
        let (id, secret) = &sh.monitors[m];
        let body = keyed_body(id, secret, "progress", None, &key, false);
        {
            let mut sent = sh.sent[m].lock().expect("sent");
            if sent.len() >= BUDGET {
                if sh
                    .sent
                    .iter()
                    .all(|s| s.lock().expect("sent").len() >= BUDGET)
                {
                    return;
                }
                continue;
            }
            sent.insert(key.clone());
        }
        if send(&sh, rng.below(HUBS as u64) as usize, &body) == Some(202) {
            sh.acked[m].lock().expect("acked").insert(key);
        }
    }
}

/// One session's messages, each sent to a random hub once the last run ended: most ask
/// for a command on `device` that appends the turn's own line to `marks` (approved from a
/// random hub when the session asks a person), every third for a timer whose wake is a
/// run of its own. Returns what it asked.
fn talker(
    sh: Arc<Shared>,
    sid: String,
    device: String,
    marks: String,
    approving: bool,
    seed: u64,
) -> Asked {
    let mut rng = Rng(seed);
    let mut asked = Asked::default();
    let mut answered: HashSet<String> = HashSet::new();
    let mut n = 0;
    while !sh.stop.load(Ordering::Relaxed) {
        let timer = n % 3 == 2;
        let text = if timer {
            format!("timer t{n}")
        } else {
            format!("exec {device}: echo {sid}-{n} >> {marks}")
        };
        if api(
            &sh,
            rng.below(HUBS as u64) as usize,
            Method::Post,
            &format!("/api/sessions/{sid}/messages"),
            Some(&json!({ "text": text })),
        )
        .is_none()
        {
            continue;
        }
        n += 1;
        sh.runs.fetch_add(1, Ordering::Relaxed);
        if timer {
            asked.runs += 2;
            asked.timers += 1;
        } else {
            asked.runs += 1;
            asked.execs += 1;
        }
        let start = Instant::now();
        loop {
            let evs = events(&sh, &sid);
            if evs.iter().filter(|e| e["kind"] == "run-end").count() >= asked.runs {
                break;
            }
            if approving {
                for e in evs.iter().filter(|e| e["kind"] == "approval-required") {
                    let Some(id) = e["approval"]["id"].as_str() else {
                        continue;
                    };
                    if answered.contains(id) {
                        continue;
                    }
                    let body = json!({"request_id": id, "decision": "allow"});
                    let path = format!("/api/sessions/{sid}/answers");
                    let at = rng.below(HUBS as u64) as usize;
                    if api(&sh, at, Method::Post, &path, Some(&body)).is_some() {
                        answered.insert(id.to_string());
                        asked.approvals += 1;
                    }
                }
            }
            if start.elapsed() > RUN_LIMIT {
                let tail: Vec<String> = evs.iter().rev().take(8).map(Value::to_string).collect();
                let seen = format!(
                    "run {} did not end within {RUN_LIMIT:?}; its log ends (newest first):\n{}",
                    asked.runs,
                    tail.join("\n")
                );
                *sh.stuck.lock().unwrap_or_else(|e| e.into_inner()) = Some((sid.clone(), seen));
                return asked;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    asked
}

/// A session a talker found stuck, with what each hub said of it and its state now.
fn stuck(sh: &Shared, hubs: &[Hub], problems: &mut Vec<String>) {
    let Some((sid, seen)) = sh.stuck.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
        return;
    };
    let state = api(sh, 0, Method::Get, &format!("/api/sessions/{sid}"), None);
    let mut said = String::new();
    for (i, h) in hubs.iter().enumerate() {
        let log = h.log();
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(sid.as_str())).collect();
        let from = lines.len().saturating_sub(40);
        said.push_str(&format!(
            "\nhub {i} said of it:\n{}",
            lines[from..].join("\n")
        ));
    }
    problems.push(format!("{sid}: {seen}\nits state now: {state:?}{said}"));
}

/// An operator call on hub `first` or the next that answers; `None` if none did (or the
/// answer was not 2xx).
fn api(
    sh: &Shared,
    first: usize,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> Option<Value> {
    for i in 0..HUBS * 20 {
        let at = (first + i) % HUBS;
        let url = format!(
            "http://{}{path}",
            sh.addrs[at].read().unwrap_or_else(|e| e.into_inner())
        );
        let bearer = format!("Bearer {}", sh.token);
        let bytes = body.map(|b| serde_json::to_vec(b).expect("json"));
        let mut req = Request::new(method, &url)
            .header("authorization", &bearer)
            .connect_timeout(Duration::from_millis(300))
            .timeout(Duration::from_secs(10));
        if let Some(b) = &bytes {
            req = req.json(b);
        }
        if let Ok(resp) = req.send() {
            if (200..300).contains(&resp.status) {
                return serde_json::from_slice(&resp.body).ok();
            }
            if resp.status < 500 {
                return None;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// A session's whole log, a page at a time.
fn events(sh: &Shared, sid: &str) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    loop {
        let after = out.last().and_then(|e| e["seq"].as_u64()).unwrap_or(0);
        let page = api(
            sh,
            0,
            Method::Get,
            &format!("/api/sessions/{sid}/events?after={after}"),
            None,
        )
        .and_then(|v| v["events"].as_array().cloned())
        .unwrap_or_default();
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

/// Every 202 recorded once: a monitor's signals are the keys sent, each once, and hold
/// every key answered 202 before they were read.
fn check_signals(sh: &Shared, hub: &Hub, problems: &mut Vec<String>) -> usize {
    let mut recorded = 0;
    for (m, (id, _)) in sh.monitors.iter().enumerate() {
        // Taken before the view: a 202 answered while it is read may be after it.
        let acked = sh.acked[m].lock().expect("acked").clone();
        let v = view(hub, id);
        let keys: Vec<&str> = v.signals.iter().map(|s| s.key.as_str()).collect();
        let distinct: HashSet<&str> = keys.iter().copied().collect();
        if distinct.len() != keys.len() || v.signal_count as usize != keys.len() {
            problems.push(format!(
                "{id}: {} signals, {} keys, {} distinct",
                v.signal_count,
                keys.len(),
                distinct.len()
            ));
        }
        let sent = sh.sent[m].lock().expect("sent");
        for k in &distinct {
            if !sent.contains(*k) {
                problems.push(format!("{id}: recorded a key never sent: {k}"));
            }
        }
        for k in &acked {
            if !distinct.contains(k.as_str()) {
                problems.push(format!("{id}: the 202 for {k} is not recorded"));
            }
        }
        recorded += keys.len();
    }
    recorded
}

#[test]
fn cluster_torture_three_hubs_killed_and_stopped_lose_nothing_and_run_nothing_twice() {
    // It starts its own hubs on PostgreSQL whatever the pass: run once, in the first.
    if cortex_tests::redb_only("the cluster torture (its hubs are on PostgreSQL in either pass)") {
        return;
    }
    let cycles = count_from_env("CORTEX_CLUSTER_TORTURE_CYCLES", 4);
    let seed = seed_from_env("CORTEX_TORTURE_SEED");
    println!("cluster torture: {cycles} cycles, seed {seed}");
    let mut rng = Rng(seed);
    let mut pg = Postgres::start();
    let db = pg.database();
    let url = pg.url(&db);
    let proxy = CutProxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], pg.port())));
    let proxied = format!("postgres://postgres@127.0.0.1:{}/{db}", proxy.port());
    // Each turn: the command its message names (`exec DEVICE: SCRIPT`), then an answer.
    let model = ScriptedModel::start_with_default(
        Vec::new(),
        Reply::from_fn(|req| {
            let last = crate::runner::last_message(req);
            let said = (last["role"] == "user")
                .then(|| last["content"].as_str())
                .flatten()
                .unwrap_or_default();
            if let Some((device, script)) =
                said.strip_prefix("exec ").and_then(|c| c.split_once(": "))
            {
                let args = json!({"device": device, "argv": [script], "shell": true});
                return Reply::tool_call("device_exec", &args.to_string());
            }
            if let Some(name) = said.strip_prefix("timer ") {
                let args = json!({"name": name, "in_s": TIMER_S});
                return Reply::tool_call("schedule_wakeup", &args.to_string());
            }
            Reply::text("done")
        }),
    );
    let homes = tempfile::tempdir().expect("homes");
    let mut hubs: Vec<Hub> = Vec::new();
    let mut token = String::new();
    // Mesh ports kept across restarts: the device agents are given all three.
    let meshes: Vec<String> = (0..HUBS)
        .map(|_| format!("127.0.0.1:{}", cortex_tests::dead_port()))
        .collect();
    for (i, mesh) in meshes.iter().enumerate() {
        let shared = (i > 0).then_some(token.as_str());
        let to = if i == 0 { &proxied } else { &url };
        let more = ["--mesh-listen", mesh.as_str()];
        let h = lease_hub_with(
            homes.path(),
            &format!("hub{i}"),
            to,
            shared,
            Some(&model),
            LEASE_MS,
            &more,
        );
        if i == 0 {
            token = h.token.clone();
        }
        hubs.push(h);
    }
    let urls: Vec<String> = meshes.iter().map(|m| format!("ws://{m}/mesh/v1")).collect();
    let url_refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let devices: Vec<String> = (0..DEVICES).map(|i| format!("dev{i}")).collect();
    let mut agents: Vec<Agent> = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        let token = hubs[i % HUBS].add_device(d);
        let mut a = Agent::new(&hubs[0], d, &token);
        // Each starts at another hub of the list.
        let mut order = url_refs.clone();
        order.rotate_left(i % HUBS);
        a.set_hub_urls(&order);
        a.set_env("CORTEX_ALLOW_EXEC", "1");
        a.spawn();
        agents.push(a);
    }
    let online = |hub: &Hub| -> Duration {
        let start = Instant::now();
        wait_until(RUN_LIMIT, "every device linked", || {
            let (st, v) = hub.api(Method::Get, "/api/devices", None);
            let all = st == 200
                && v.as_array().is_some_and(|l| {
                    l.iter().filter(|d| d["state"] == "online").count() == DEVICES
                });
            all.then_some(())
        });
        start.elapsed()
    };
    online(&hubs[0]);
    let sid = hubs[0].session();
    let monitors: Vec<(String, String)> = (0..MONITORS)
        .map(|_| {
            let w = hubs[0].waitpoint(
                &sid,
                json!({"label": "mon", "intent": "x", "max_signals": 10_000}),
            );
            (
                w["id"].as_str().expect("id").to_string(),
                w["secret"].as_str().expect("secret").to_string(),
            )
        })
        .collect();
    let sh = Arc::new(Shared {
        addrs: hubs.iter().map(|h| RwLock::new(h.addr.clone())).collect(),
        token: token.clone(),
        stop: AtomicBool::new(false),
        sent: (0..MONITORS).map(|_| Mutex::default()).collect(),
        acked: (0..MONITORS).map(|_| Mutex::default()).collect(),
        monitors,
        failovers: AtomicUsize::new(0),
        runs: AtomicUsize::new(0),
        stuck: Mutex::new(None),
    });
    let sessions: Vec<String> = (0..SESSIONS)
        .map(|i| {
            let ask: &[&str] = if i < APPROVING { &["device_exec"] } else { &[] };
            let body = json!({"runs": true, "policy": {"requireApproval": ask}});
            let (st, v) = hubs[i % HUBS].api(Method::Post, "/api/sessions", Some(&body));
            assert_eq!(st, 201, "{v}");
            v["id"].as_str().expect("id").to_string()
        })
        .collect();
    let marks: Vec<std::path::PathBuf> = (0..SESSIONS)
        .map(|i| homes.path().join(format!("marks-{i}")))
        .collect();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|n| {
            let sh = sh.clone();
            std::thread::spawn(move || client(sh, n, seed))
        })
        .collect();
    let talkers: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(i, sid)| {
            let (sh, sid) = (sh.clone(), sid.clone());
            let device = devices[i % DEVICES].clone();
            let marks = marks[i].display().to_string();
            let seed = seed.wrapping_add(i as u64);
            std::thread::spawn(move || talker(sh, sid, device, marks, i < APPROVING, seed))
        })
        .collect();
    let (mut kills, mut stops, mut cuts, mut crashes) = (0, 0, 0, 0);
    let mut relinked = Duration::ZERO;
    let mut problems = Vec::new();
    for cycle in 1..=cycles {
        std::thread::sleep(Duration::from_millis(1500 + rng.below(1500)));
        // Where each log stood before the cycle, to show what it said if the devices were
        // slow to link again.
        let marks_at: Vec<usize> = hubs
            .iter()
            .map(|h| h.log().len())
            .chain(agents.iter().map(|a| a.log().len()))
            .collect();
        let victim = rng.below(HUBS as u64) as usize;
        let mut done = vec![format!("killed and restarted hub {victim}")];
        let hub = &mut hubs[victim];
        hub.kill();
        hub.spawn();
        *sh.addrs[victim].write().unwrap_or_else(|e| e.into_inner()) = hub.addr.clone();
        kills += 1;
        if cycle % 3 == 0 {
            // Frozen past its lease: the others take its sessions; continued, it must not
            // write for them.
            let other = (victim + 1 + rng.below(HUBS as u64 - 1) as usize) % HUBS;
            let pid = hubs[other].pid().expect("pid");
            signal(&pid.to_string(), "-STOP");
            std::thread::sleep(Duration::from_millis(2 * LEASE_MS + 500));
            signal(&pid.to_string(), "-CONT");
            stops += 1;
            done.push(format!(
                "stopped hub {other} past its lease and continued it"
            ));
        }
        if cycle % 4 == 2 {
            let n = proxy.cut();
            cuts += 1;
            done.push(format!(
                "cut hub 0 off the database ({n} connections since the last cut reset)"
            ));
        }
        if cycle % 5 == 4 {
            pg.crash_restart();
            crashes += 1;
            done.push("crashed PostgreSQL, which recovered".into());
        }
        let live = (victim + 1) % HUBS;
        let took = online(&hubs[live]);
        let recorded = check_signals(&sh, &hubs[live], &mut problems);
        relinked = relinked.max(took);
        if took > Duration::from_millis(LEASE_MS) {
            let logs = hubs
                .iter()
                .enumerate()
                .map(|(i, h)| (format!("hub {i}"), h.log()))
                .chain(
                    agents
                        .iter()
                        .enumerate()
                        .map(|(i, a)| (format!("agent {i}"), a.log())),
                );
            for ((who, log), from) in logs.zip(&marks_at) {
                let said: Vec<&str> = log
                    .get(*from..)
                    .unwrap_or("")
                    .lines()
                    .filter(|l| {
                        ["device", "link", "mesh", "disown", "store", "hub"]
                            .iter()
                            .any(|w| l.contains(w))
                    })
                    .take(40)
                    .collect();
                println!(
                    "cycle {cycle}, slow to link again: {who} said:\n{}",
                    said.join("\n")
                );
            }
        }
        println!(
            "cycle {cycle}: {}; every device linked again {} ms after; {recorded} signals recorded, {} runs asked",
            done.join(", "),
            took.as_millis(),
            sh.runs.load(Ordering::Relaxed)
        );
        stuck(&sh, &hubs, &mut problems);
        assert!(problems.is_empty(), "cycle {cycle}: {problems:#?}");
    }
    sh.stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("client");
    }
    let asked: Vec<Asked> = talkers
        .into_iter()
        .map(|t| t.join().expect("talker"))
        .collect();
    // Every run ended once; every call ran once (a command, a timer set); every timer
    // fired once; every approval asked once per call and answered; nothing left running.
    let (mut tools, mut fired, mut approved) = (0, 0, 0);
    for (i, (sid, asked)) in sessions.iter().zip(&asked).enumerate() {
        let evs = events(&sh, sid);
        let count = |kind: &str| evs.iter().filter(|e| e["kind"] == kind).count();
        let calls = |name: &str| -> (usize, usize) {
            let ends: Vec<&Value> = evs
                .iter()
                .filter(|e| e["kind"] == "tool-end" && e["observation"]["name"] == name)
                .collect();
            let ids: HashSet<String> = ends
                .iter()
                .map(|e| e["observation"]["call_id"].to_string())
                .collect();
            (ends.len(), ids.len())
        };
        let (ends, timers) = (count("run-end"), count("timer"));
        let (execs, exec_ids) = calls("device_exec");
        let (sets, set_ids) = calls("schedule_wakeup");
        let asks = count("approval-required");
        let want_asks = if i < APPROVING { asked.execs } else { 0 };
        if ends != asked.runs
            || (execs, exec_ids) != (asked.execs, asked.execs)
            || (sets, set_ids, timers) != (asked.timers, asked.timers, asked.timers)
            || (asks, asked.approvals) != (want_asks, want_asks)
        {
            problems.push(format!(
                "{sid}: asked {asked:?}; ran {ends} runs, {execs} device_exec ({exec_ids} distinct), {sets} schedule_wakeup ({set_ids} distinct), {timers} timers fired, {asks} approvals asked"
            ));
        }
        tools += execs + sets;
        fired += timers;
        approved += asked.approvals;
        let state = wait_until(RUN_LIMIT, "the session handed back idle", || {
            let v = api(&sh, 0, Method::Get, &format!("/api/sessions/{sid}"), None)?;
            (v["state"] != "running").then_some(v["state"].clone())
        });
        if state != "idle" {
            problems.push(format!("{sid}: left {state}"));
        }
    }
    // No command started twice: each turn's line is in its marks once at most.
    let mut started = 0;
    for m in &marks {
        let text = std::fs::read_to_string(m).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let distinct: HashSet<&str> = lines.iter().copied().collect();
        if distinct.len() != lines.len() {
            problems.push(format!(
                "{}: {} commands started, {} distinct",
                m.display(),
                lines.len(),
                distinct.len()
            ));
        }
        started += distinct.len();
    }
    // No hub ended by itself (a database crash or cut is not a reason to exit).
    for (i, h) in hubs.iter_mut().enumerate() {
        if let Some(st) = h.exited() {
            let log = h.log();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            problems.push(format!(
                "hub {i} exited by itself ({st}); its log ends:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
    }
    stuck(&sh, &hubs, &mut problems);
    match api(&sh, 0, Method::Get, "/api/approvals", None) {
        Some(v) if v["approvals"] == json!([]) => {}
        other => problems.push(format!("approvals left waiting: {other:?}")),
    }
    assert!(problems.is_empty(), "{problems:#?}");
    let relayed: f64 = hubs
        .iter()
        .map(|h| {
            crate::metrics::scrape(h)
                .get("cortex_exec_relayed_total")
                .copied()
                .unwrap_or(0.0)
        })
        .sum();
    let recorded = check_signals(&sh, &hubs[0], &mut problems);
    let acked: usize = sh
        .acked
        .iter()
        .map(|a| a.lock().expect("acked").len())
        .sum();
    let by_monitor: HashMap<usize, usize> = sh
        .acked
        .iter()
        .enumerate()
        .map(|(i, a)| (i, a.lock().expect("acked").len()))
        .collect();
    println!(
        "cluster torture: {kills} kills, {stops} stops past the lease, {cuts} cuts of a hub's database connections, {crashes} PostgreSQL crashes; {acked} signals answered 202 over {} monitors, {recorded} recorded, {} sends passed to another hub; {} runs, {tools} tool calls, each once ({approved} approved from a random hub, {fired} timers fired, each once); {started} commands started on the devices, each once ({relayed} asked through another hub since the hubs' last starts); every device linked again at most {} ms after a cycle",
        by_monitor.len(),
        sh.failovers.load(Ordering::Relaxed),
        asked.iter().map(|a| a.runs).sum::<usize>(),
        relinked.as_millis()
    );
    drop(agents);
    assert!(problems.is_empty(), "{problems:#?}");
}
