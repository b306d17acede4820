//! Crash torture: several clients send keyed signals to hundreds of waitpoints (one-shots,
//! three-member barriers, monitors) while the hub is SIGKILLed and restarted, cycle after
//! cycle. It shows that after every restart the store opens, every signal answered 202 is
//! recorded exactly once (a resend of its key is a duplicate, never a second record), a
//! signal answered 410 is not recorded, and nothing seen in a session's log is lost or
//! changed; and, once the load stops, that every due wake was delivered exactly once with
//! the signals it must carry, and that a further restart delivers nothing again.
//!
//! `CORTEX_TORTURE_CYCLES` sets the number of kills (default 3 so `cargo test` stays
//! fast); the full run is
//! `CORTEX_TORTURE_CYCLES=30 cargo test --release -p cortex-tests --test it torture -- --nocapture`.
//! `CORTEX_TORTURE_SEED` replays a run's choices (the seed is printed; the kill timing is
//! the OS's).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cortex_cli::http::Method;
use cortex_tests::{Hub, wait_until};
use serde_json::{Value, json};

use crate::signal_load::{
    self, Kind, Outcome, Rng, Sig, Until, View, count_from_env, keyed_body, seed_from_env, view,
};

const SESSIONS: usize = 4;
/// Waitpoints of each kind.
const PER_KIND: usize = 100;
const CLIENTS: usize = 4;
/// Signals one monitor gets at most, so its view (the latest 1,000) lists all of them and
/// it never reaches `max_signals`.
const MONITOR_BUDGET: u32 = 380;
const MONITOR_MAX_SIGNALS: u32 = 500;
/// Signals any other waitpoint gets at most: one that stays armed (a one-shot fed only
/// progress, a barrier missing a member) records every one, and its view lists 1,000.
const ARMED_BUDGET: u32 = 900;
const MEMBERS: [&str; 3] = ["a", "b", "c"];
/// Bound on waiting for the decided wakes once the load stops.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);
/// One in this many accepted signals is deliberately sent again, expecting a duplicate.
const RESEND_ONE_IN: u64 = 16;
/// A wake lists at most this many terminal signals (the hub's `text::MAX_LISTED`).
const MAX_LISTED: usize = 100;
/// A complete barrier wakes this long after completing.
const BARRIER_DELAY_MS: u64 = 3_000;

struct Wp {
    id: String,
    secret: String,
    kind: Kind,
    /// Must stay armed: a one-shot that only gets progress, a barrier that never hears `c`.
    partial: bool,
    /// The cycle from which the clients signal it, so waitpoints complete all run long.
    active_from: usize,
    /// Keys sent to it (its budget).
    sent: AtomicU32,
    /// A 410 was answered: it resolved.
    gone: AtomicBool,
}

#[derive(Debug, Clone)]
struct Sent {
    wp: usize,
    status: &'static str,
    member: Option<&'static str>,
    /// Attempts that got no HTTP answer before the one that did.
    lost: u32,
    outcome: Outcome,
}

struct Shared {
    addr: RwLock<String>,
    cycle: AtomicUsize,
    stop: AtomicBool,
    wps: Vec<Wp>,
    ledger: Mutex<HashMap<String, Sent>>,
    resends: AtomicU32,
    violations: Mutex<Vec<String>>,
}

impl Shared {
    fn violation(&self, v: String) {
        self.violations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(v);
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, HashMap<String, Sent>> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// POSTs `body` until some HTTP answer arrives, at most `signal_load::RETRY_LIMIT`.
/// Returns the outcome and how many attempts got no answer.
fn send(sh: &Shared, body: &[u8]) -> (Outcome, u32) {
    let s = signal_load::send(&sh.addr, body, Until::Answered);
    (s.outcome, s.unanswered)
}

/// A waitpoint to signal now, or `None` when every active one is spent.
fn pick(sh: &Shared, rng: &mut Rng, cycle: usize) -> Option<usize> {
    for _ in 0..32 {
        let i = rng.below(sh.wps.len() as u64) as usize;
        let wp = &sh.wps[i];
        if wp.active_from > cycle {
            continue;
        }
        // A resolved one still gets the odd late signal (answered 410).
        if wp.gone.load(Ordering::Relaxed) && rng.below(20) != 0 {
            continue;
        }
        let budget = if wp.kind == Kind::Monitor {
            MONITOR_BUDGET
        } else {
            ARMED_BUDGET
        };
        if wp.sent.fetch_add(1, Ordering::Relaxed) >= budget {
            continue;
        }
        return Some(i);
    }
    None
}

fn shape(wp: &Wp, rng: &mut Rng) -> (&'static str, Option<&'static str>) {
    match wp.kind {
        Kind::OneShot if wp.partial => ("progress", None),
        Kind::OneShot => match rng.below(10) {
            0..6 => ("ok", None),
            6..9 => ("progress", None),
            _ => ("fail", None),
        },
        // Only ok: a complete barrier waits out its 3 s, which the kills must cross.
        Kind::Barrier => {
            let n = if wp.partial { 2 } else { 3 };
            ("ok", Some(MEMBERS[rng.below(n) as usize]))
        }
        Kind::Monitor => match rng.below(20) {
            0..9 => ("progress", None),
            9..18 => ("ok", None),
            _ => ("fail", None),
        },
    }
}

fn client(sh: Arc<Shared>, n: usize, seed: u64) {
    let mut rng = Rng(seed);
    let mut count = 0u64;
    while !sh.stop.load(Ordering::Relaxed) {
        let cycle = sh.cycle.load(Ordering::Relaxed);
        let Some(i) = pick(&sh, &mut rng, cycle) else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        let wp = &sh.wps[i];
        let (status, member) = shape(wp, &mut rng);
        count += 1;
        let key = format!("c{n}-{count}");
        let body = keyed_body(&wp.id, &wp.secret, status, member, &key, true);
        sh.ledger().insert(
            key.clone(),
            Sent {
                wp: i,
                status,
                member,
                lost: 0,
                outcome: Outcome::InFlight,
            },
        );
        let (outcome, lost) = send(&sh, &body);
        if outcome == Outcome::Gone {
            wp.gone.store(true, Ordering::Relaxed);
        }
        if outcome == Outcome::Duplicate && lost == 0 {
            sh.violation(format!(
                "{key} to {}: answered duplicate on its first and only attempt",
                wp.id
            ));
        }
        let resend = outcome == Outcome::Accepted && rng.below(RESEND_ONE_IN) == 0;
        if let Some(s) = sh.ledger().get_mut(&key) {
            s.lost = lost;
            s.outcome = outcome;
        }
        if resend {
            sh.resends.fetch_add(1, Ordering::Relaxed);
            let (again, _) = send(&sh, &body);
            if again != Outcome::Duplicate {
                sh.violation(format!(
                    "{key} to {}: accepted, then its resend was answered {again:?} instead of duplicate",
                    wp.id
                ));
            }
        }
    }
}

/// A session's log as read so far, event by event.
struct Log {
    sid: String,
    events: Vec<Value>,
}

impl Log {
    fn last_seq(&self) -> u64 {
        self.events
            .last()
            .map_or(0, |e| e["seq"].as_u64().unwrap_or(0))
    }

    /// Appends what was committed since the last read; seqs must run on without a gap.
    fn catch_up(&mut self, hub: &Hub) {
        loop {
            let page = hub.events(&self.sid, self.last_seq());
            if page.is_empty() {
                return;
            }
            for e in page {
                let seq = e["seq"].as_u64().expect("seq");
                assert_eq!(
                    seq,
                    self.last_seq() + 1,
                    "session {}: event seqs run on without a gap or a repeat",
                    self.sid
                );
                self.events.push(e);
            }
        }
    }
}

/// One `wake` event, as far as the checks need it.
#[derive(Debug)]
struct WakeEv {
    seq: u64,
    /// When it was appended (the hub's clock, ms).
    ts: u64,
    reason: String,
    keys: Vec<String>,
    statuses: Vec<String>,
    omitted: u64,
}

/// Every wake event of every log, by waitpoint id.
fn wakes_by_wp(logs: &[Log]) -> HashMap<String, Vec<WakeEv>> {
    let mut out: HashMap<String, Vec<WakeEv>> = HashMap::new();
    for log in logs {
        for e in log.events.iter().filter(|e| e["kind"] == "wake") {
            let signals = e["signals"].as_array().cloned().unwrap_or_default();
            out.entry(e["waitpoint"]["id"].as_str().expect("id").to_string())
                .or_default()
                .push(WakeEv {
                    seq: e["seq"].as_u64().expect("seq"),
                    ts: e["ts"].as_u64().unwrap_or(0),
                    reason: e["reason"].as_str().unwrap_or("").to_string(),
                    keys: signals
                        .iter()
                        .map(|s| s["key"].as_str().unwrap_or("").to_string())
                        .collect(),
                    statuses: signals
                        .iter()
                        .map(|s| s["status"].as_str().unwrap_or("").to_string())
                        .collect(),
                    omitted: e["omitted"].as_u64().unwrap_or(0),
                });
        }
    }
    out
}

/// The signal invariants of one waitpoint's view against the ledger: every key recorded
/// at most once, each one a key sent to this waitpoint with what was sent; every key in
/// `acked` present, every key in `gone` absent.
fn check_signals(
    sh: &Shared,
    i: usize,
    v: &View,
    ledger: &HashMap<String, Sent>,
    acked: &[String],
    gone: &[String],
    problems: &mut Vec<String>,
) {
    let id = &sh.wps[i].id;
    if v.signals.len() as u64 != v.signal_count {
        problems.push(format!(
            "{id}: signal_count {} but {} signals listed",
            v.signal_count,
            v.signals.len()
        ));
    }
    let mut keys = HashSet::new();
    for Sig {
        key: k,
        status,
        member,
        ..
    } in &v.signals
    {
        if !keys.insert(k.as_str()) {
            problems.push(format!("{id}: key {k:?} recorded twice"));
        }
        match ledger.get(k) {
            None => problems.push(format!("{id}: key {k:?} recorded but never sent")),
            Some(s) if s.wp != i => {
                problems.push(format!("{id}: key {k:?} was sent to {}", sh.wps[s.wp].id))
            }
            Some(s) if s.status != status || s.member != member.as_deref() => problems.push(
                format!("{id}: key {k:?} recorded as {status}/{member:?}, sent {s:?}"),
            ),
            Some(s) if s.outcome == Outcome::Gone => {
                problems.push(format!("{id}: key {k:?} answered 410 yet recorded"))
            }
            Some(_) => {}
        }
    }
    for k in acked {
        if !keys.contains(k.as_str()) {
            problems.push(format!("{id}: key {k:?} answered 202 but not recorded"));
        }
    }
    for k in gone {
        if keys.contains(k.as_str()) {
            problems.push(format!("{id}: key {k:?} answered 410 but recorded"));
        }
    }
}

/// What one verification pass saw.
#[derive(Default)]
struct Checked {
    acked: usize,
    wake_events: usize,
}

/// After a restart, with the load still running: the snapshot's keys (answered before
/// the kill) against every waitpoint, nothing seen in the logs lost, no wake delivered
/// twice. Logs are read before views, so a view may only be ahead of the log.
fn verify_cycle(
    hub: &Hub,
    sh: &Shared,
    logs: &mut [Log],
    snapshot: &HashMap<String, Sent>,
) -> Checked {
    for log in logs.iter_mut() {
        log.catch_up(hub);
    }
    let wakes = wakes_by_wp(logs);
    let views: Vec<View> = sh.wps.iter().map(|w| view(hub, &w.id)).collect();
    let ledger = sh.ledger().clone();
    let mut acked: Vec<Vec<String>> = vec![Vec::new(); sh.wps.len()];
    let mut gone: Vec<Vec<String>> = vec![Vec::new(); sh.wps.len()];
    for (k, s) in snapshot {
        if s.outcome.acked() {
            acked[s.wp].push(k.clone());
        } else if s.outcome == Outcome::Gone {
            gone[s.wp].push(k.clone());
        }
    }
    let mut problems = Vec::new();
    let mut checked = Checked::default();
    for (i, v) in views.iter().enumerate() {
        check_signals(sh, i, v, &ledger, &acked[i], &gone[i], &mut problems);
        checked.acked += acked[i].len();
        let id = &sh.wps[i].id;
        let evs = wakes.get(id).map_or(&[][..], Vec::as_slice);
        checked.wake_events += evs.len();
        check_wakes_once(id, v, evs, &mut problems);
        if v.wakes - v.undelivered < evs.len() {
            problems.push(format!(
                "{id}: {} wake events in the log but {} delivered wakes",
                evs.len(),
                v.wakes - v.undelivered
            ));
        }
        if sh.wps[i].kind != Kind::Monitor && evs.len() > 1 {
            problems.push(format!("{id}: {} wakes for a one-shot", evs.len()));
        }
    }
    report(sh, hub, &problems);
    checked
}

/// No two wake events of a waitpoint share a seq or carry the same signal.
fn check_wakes_once(id: &str, v: &View, evs: &[WakeEv], problems: &mut Vec<String>) {
    let recorded: HashSet<&str> = v.signals.iter().map(|s| s.key.as_str()).collect();
    let mut seqs = HashSet::new();
    let mut carried = HashSet::new();
    for w in evs {
        if !seqs.insert(w.seq) {
            problems.push(format!("{id}: two wake events at seq {}", w.seq));
        }
        for k in &w.keys {
            if !carried.insert(k.as_str()) {
                problems.push(format!("{id}: signal {k:?} carried by two wakes"));
            }
            if !recorded.contains(k.as_str()) {
                problems.push(format!(
                    "{id}: wake at seq {} carries {k:?}, which is not recorded",
                    w.seq
                ));
            }
        }
    }
}

fn report(sh: &Shared, hub: &Hub, problems: &[String]) {
    let violations = sh
        .violations
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if problems.is_empty() && violations.is_empty() {
        return;
    }
    let mut all: Vec<&String> = violations.iter().chain(problems).collect();
    let n = all.len();
    all.truncate(40);
    let tail: String = {
        let log = hub.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    };
    panic!(
        "{n} invariant violations (first 40):\n{}\nhub log tail:\n{tail}",
        all.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The final, exact check once everything is settled: the full logs equal what was seen
/// across the kills, and each waitpoint has exactly the wakes its rules decide.
/// What the final check counted.
#[derive(Debug, Default, PartialEq)]
struct Final {
    wakes: usize,
    /// Barrier wakes decided before a kill and delivered by the next process.
    barriers_across_kill: usize,
    /// Completion to wake, ms, per fired barrier.
    barrier_delays: Vec<u64>,
    /// The most signals one barrier's wake carried.
    barrier_most_signals: u64,
}

fn verify_final(hub: &Hub, sh: &Shared, logs: &mut [Log], kills: &[u64]) -> Final {
    for log in logs.iter_mut() {
        let mut fresh = Log {
            sid: log.sid.clone(),
            events: Vec::new(),
        };
        fresh.catch_up(hub);
        assert!(
            fresh.events.len() >= log.events.len()
                && fresh.events[..log.events.len()] == log.events[..],
            "session {}: the log differs from what was read before the kills",
            log.sid
        );
        *log = fresh;
    }
    let wakes = wakes_by_wp(logs);
    let ledger = sh.ledger().clone();
    let mut acked: Vec<Vec<String>> = vec![Vec::new(); sh.wps.len()];
    let mut gone: Vec<Vec<String>> = vec![Vec::new(); sh.wps.len()];
    let mut problems = Vec::new();
    for (k, s) in &ledger {
        match &s.outcome {
            o if o.acked() => acked[s.wp].push(k.clone()),
            Outcome::Gone => gone[s.wp].push(k.clone()),
            o => problems.push(format!("{k}: ended {o:?}")),
        }
    }
    let mut stats = Final::default();
    for (i, wp) in sh.wps.iter().enumerate() {
        let v = view(hub, &wp.id);
        check_signals(sh, i, &v, &ledger, &acked[i], &gone[i], &mut problems);
        let id = &wp.id;
        let evs = wakes.get(id).map_or(&[][..], Vec::as_slice);
        check_wakes_once(id, &v, evs, &mut problems);
        stats.wakes += evs.len();
        if v.wakes != evs.len() || v.undelivered != 0 {
            problems.push(format!(
                "{id}: {} wakes ({} undelivered) but {} wake events",
                v.wakes,
                v.undelivered,
                evs.len()
            ));
        }
        let terminals: Vec<&Sig> = v
            .signals
            .iter()
            .filter(|s| s.status != "progress")
            .collect();
        let mut want = |cond: bool, what: String| {
            if !cond {
                problems.push(format!("{id} ({:?}): {what}", wp.kind));
            }
        };
        match wp.kind {
            Kind::OneShot | Kind::Barrier => {
                let complete = if wp.kind == Kind::OneShot {
                    !terminals.is_empty()
                } else {
                    MEMBERS
                        .iter()
                        .all(|m| v.signals.iter().any(|s| s.member.as_deref() == Some(*m)))
                };
                if wp.partial {
                    want(!complete, "a partial one completed".into());
                }
                if !complete {
                    want(evs.is_empty(), format!("{} wakes, want none", evs.len()));
                    want(v.state == "armed", format!("state {}, want armed", v.state));
                    continue;
                }
                want(
                    v.state == "resolved",
                    format!("state {}, want resolved", v.state),
                );
                want(evs.len() == 1, format!("{} wakes, want 1", evs.len()));
                let Some(w) = evs.first() else { continue };
                let failed = terminals.iter().any(|s| s.status == "fail");
                let reason = if failed { "failed" } else { "fired" };
                want(
                    w.reason == reason,
                    format!("wake {}, want {reason}", w.reason),
                );
                want(
                    w.keys.len() as u64 + w.omitted == v.signal_count,
                    format!(
                        "the wake carries {} listed + {} omitted of {} signals",
                        w.keys.len(),
                        w.omitted,
                        v.signal_count
                    ),
                );
                if wp.kind == Kind::OneShot {
                    want(
                        terminals.len() == 1 && v.signals.last() == terminals.first().copied(),
                        "a one-shot records one terminal signal, last".into(),
                    );
                }
                // A wake lists its latest terminal signals, at most MAX_LISTED.
                let listed: Vec<&String> = w
                    .keys
                    .iter()
                    .zip(&w.statuses)
                    .filter(|(_, s)| *s != "progress")
                    .map(|(k, _)| k)
                    .collect();
                let latest: Vec<&String> = terminals[terminals.len().saturating_sub(MAX_LISTED)..]
                    .iter()
                    .map(|s| &s.key)
                    .collect();
                want(
                    listed == latest,
                    format!(
                        "the wake lists {} terminal signals, want the latest {} of {}",
                        listed.len(),
                        latest.len(),
                        terminals.len()
                    ),
                );
                if wp.kind == Kind::Barrier {
                    let mut seen = HashSet::new();
                    let done_at = v.signals.iter().find_map(|s| {
                        seen.insert(s.member.clone());
                        (seen.len() == MEMBERS.len()).then_some(s.at)
                    });
                    let Some(t) = done_at else { continue };
                    // Decided before a kill, delivered after it: the 3 s crossed a crash.
                    if kills.iter().any(|&k| t < k && k < w.ts) {
                        stats.barriers_across_kill += 1;
                    }
                    let delay = w.ts.saturating_sub(t);
                    want(
                        delay >= BARRIER_DELAY_MS,
                        format!("woke {delay} ms after completing, before the 3 s"),
                    );
                    stats.barrier_delays.push(delay);
                    stats.barrier_most_signals = stats.barrier_most_signals.max(v.signal_count);
                }
            }
            Kind::Monitor => {
                want(v.state == "armed", format!("state {}, want armed", v.state));
                want(
                    evs.len() == terminals.len(),
                    format!(
                        "{} wakes for {} ok/fail reports",
                        evs.len(),
                        terminals.len()
                    ),
                );
                for (w, t) in evs.iter().zip(&terminals) {
                    let carried: Vec<&String> = w
                        .keys
                        .iter()
                        .zip(&w.statuses)
                        .filter(|(_, s)| *s != "progress")
                        .map(|(k, _)| k)
                        .collect();
                    want(
                        carried == vec![&t.key],
                        format!(
                            "wake at seq {} carries {carried:?}, want [{}]",
                            w.seq, t.key
                        ),
                    );
                    let reason = if t.status == "fail" {
                        "failed"
                    } else {
                        "report"
                    };
                    want(
                        w.reason == reason,
                        format!("wake at seq {}: {}, want {reason}", w.seq, w.reason),
                    );
                }
                let through = v
                    .signals
                    .iter()
                    .rposition(|s| s.status != "progress")
                    .map_or(0, |p| p + 1) as u64;
                let total: u64 = evs.iter().map(|w| w.keys.len() as u64 + w.omitted).sum();
                want(
                    total == through,
                    format!("the wakes carry {total} signals, want {through}"),
                );
            }
        }
    }
    report(sh, hub, &problems);
    stats
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(sorted.len() - 1) * p / 100]
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// SIGKILL, restart on the same home; with `early`, the new process is killed again as
/// soon as it has bound its port (while it opens the store and delivers what fell due)
/// and started once more. Records each kill's wall time (once the process is gone);
/// returns the last start's times to the listen line and to the first API answer.
fn kill_and_restart(
    hub: &mut Hub,
    sh: &Shared,
    kills: &mut Vec<u64>,
    early: bool,
) -> (Duration, Duration) {
    hub.kill();
    kills.push(wall_ms());
    if early {
        hub.spawn();
        hub.kill();
        kills.push(wall_ms());
    }
    let t0 = Instant::now();
    hub.spawn();
    let listening = t0.elapsed();
    *sh.addr.write().unwrap_or_else(|e| e.into_inner()) = hub.addr.clone();
    let (st, v) = hub.api(Method::Get, "/api/sessions", None);
    assert_eq!(st, 200, "{v}");
    (listening, t0.elapsed())
}

#[test]
fn torture_signals_and_wakes_survive_repeated_sigkill() {
    let cycles = count_from_env("CORTEX_TORTURE_CYCLES", 3);
    let seed = seed_from_env("CORTEX_TORTURE_SEED");
    eprintln!(
        "torture: {cycles} cycles, {CLIENTS} clients, {} waitpoints, seed {seed}",
        3 * PER_KIND
    );
    let started = Instant::now();
    let mut rng = Rng(seed);
    let mut hub = Hub::start_with(&[
        ("CORTEX_WAITPOINT_SWEEP_MS", "100"),
        ("CORTEX_WAITPOINT_MAX_WAKES_PER_HOUR", "3600"),
    ]);
    let mut logs: Vec<Log> = (0..SESSIONS)
        .map(|_| Log {
            sid: hub.session(),
            events: Vec::new(),
        })
        .collect();
    let mut wps = Vec::new();
    for kind in [Kind::OneShot, Kind::Barrier, Kind::Monitor] {
        for k in 0..PER_KIND {
            let session = wps.len() % SESSIONS;
            let body = match kind {
                Kind::OneShot => json!({"label": format!("one-shot {k}"), "intent": "x"}),
                Kind::Barrier => {
                    json!({"label": format!("barrier {k}"), "intent": "x", "members": MEMBERS})
                }
                Kind::Monitor => {
                    json!({"label": format!("monitor {k}"), "intent": "x", "max_signals": MONITOR_MAX_SIGNALS})
                }
            };
            let created = hub.waitpoint(&logs[session].sid, body);
            // Half from the start, the rest joining cycle by cycle.
            let half = PER_KIND / 2;
            let active_from = if k < half {
                0
            } else {
                (k - half) * cycles / half
            };
            wps.push(Wp {
                id: created["id"].as_str().expect("id").to_string(),
                secret: created["secret"].as_str().expect("secret").to_string(),
                kind,
                partial: match kind {
                    Kind::OneShot => k % 5 == 4,
                    Kind::Barrier => k % 4 == 3,
                    Kind::Monitor => false,
                },
                active_from,
                sent: AtomicU32::new(0),
                gone: AtomicBool::new(false),
            });
        }
    }
    let sh = Arc::new(Shared {
        addr: RwLock::new(hub.addr.clone()),
        cycle: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        wps,
        ledger: Mutex::new(HashMap::new()),
        resends: AtomicU32::new(0),
        violations: Mutex::new(Vec::new()),
    });
    let clients: Vec<JoinHandle<()>> = (0..CLIENTS)
        .map(|n| {
            let sh = sh.clone();
            let s = rng.next();
            std::thread::spawn(move || client(sh, n, s))
        })
        .collect();

    let mut listening = Vec::new();
    let mut serving = Vec::new();
    let mut wake_checks = 0;
    let mut kills = Vec::new();
    let mut early_kills = 0;
    for c in 0..cycles {
        sh.cycle.store(c, Ordering::Relaxed);
        let load = Duration::from_millis(100 + rng.below(501));
        std::thread::sleep(load);
        let snapshot = sh.ledger().clone();
        let in_flight = snapshot
            .values()
            .filter(|s| s.outcome == Outcome::InFlight)
            .count();
        let acked = snapshot.values().filter(|s| s.outcome.acked()).count();
        // One cycle in four also kills the next process while it starts.
        let early = rng.below(4) == 0;
        early_kills += usize::from(early);
        let (l, s) = kill_and_restart(&mut hub, &sh, &mut kills, early);
        listening.push(l);
        serving.push(s);
        let checked = verify_cycle(&hub, &sh, &mut logs, &snapshot);
        wake_checks += checked.wake_events;
        eprintln!(
            "cycle {:>2}/{cycles}: load {:>3} ms, {acked} acked before the kill ({in_flight} in flight){}, restart {} ms to listening / {} ms to serving, {} acked keys and {} wake events verified",
            c + 1,
            load.as_millis(),
            if early {
                ", killed again while starting"
            } else {
                ""
            },
            l.as_millis(),
            s.as_millis(),
            checked.acked,
            checked.wake_events,
        );
    }

    sh.stop.store(true, Ordering::Relaxed);
    for t in clients {
        t.join().expect("client thread");
    }
    let settle = |hub: &Hub| {
        wait_until(SETTLE_LIMIT, "every decided wake delivered", || {
            sh.wps
                .iter()
                .all(|w| view(hub, &w.id).undelivered == 0)
                .then_some(())
        })
    };
    settle(&hub);
    let fin = verify_final(&hub, &sh, &mut logs, &kills);
    // Once more: a restart after everything settled delivers nothing again.
    let (l, s) = kill_and_restart(&mut hub, &sh, &mut kills, false);
    listening.push(l);
    serving.push(s);
    settle(&hub);
    let again = verify_final(&hub, &sh, &mut logs, &kills);
    assert_eq!(fin, again, "a restart after the load changed the wakes");
    wake_checks += fin.wakes;
    let wakes = fin.wakes;

    let ledger = sh.ledger().clone();
    let count = |f: &dyn Fn(&Sent) -> bool| ledger.values().filter(|s| f(s)).count();
    let accepted = count(&|s| s.outcome == Outcome::Accepted);
    let dup = count(&|s| s.outcome == Outcome::Duplicate);
    let gone = count(&|s| s.outcome == Outcome::Gone);
    let retried = count(&|s| s.lost > 0);
    let recorded: u64 = sh.wps.iter().map(|w| view(&hub, &w.id).signal_count).sum();
    listening.sort();
    serving.sort();
    let mut delays = fin.barrier_delays.clone();
    delays.sort();
    eprintln!(
        "torture summary: {} SIGKILLs ({cycles} cycles, {early_kills} also killed while starting, 1 after settling), {} s; {} signals sent, {} acked ({accepted} accepted, {dup} answered duplicate after a lost answer), {} deliberate resends answered duplicate, {gone} answered 410, {retried} needed a resend across a kill; {recorded} recorded, each acked key exactly once; {wakes} wakes delivered once ({} barrier wakes decided before a kill and delivered after it, barrier completion to wake p50 {} ms max {} ms, at most {} signals on one barrier wake; {wake_checks} wake-event checks); restart to listening p50 {} ms max {} ms, to serving p50 {} ms max {} ms",
        kills.len(),
        started.elapsed().as_secs(),
        ledger.len(),
        accepted + dup,
        sh.resends.load(Ordering::Relaxed),
        fin.barriers_across_kill,
        delays.get(delays.len() / 2).copied().unwrap_or(0),
        delays.last().copied().unwrap_or(0),
        fin.barrier_most_signals,
        percentile(&listening, 50).as_millis(),
        percentile(&listening, 100).as_millis(),
        percentile(&serving, 50).as_millis(),
        percentile(&serving, 100).as_millis(),
    );
    assert!(
        accepted > 0 && wakes > 0,
        "the load reached the hub and woke something"
    );
}
