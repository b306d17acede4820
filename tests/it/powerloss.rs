//! Power-loss torture: the real hub (and then a real device agent) runs with its home on
//! lazyfs, a filesystem that keeps un-synced writes in memory only, and the power is cut:
//! the process is SIGKILLed at the instant every un-synced change is dropped (or, every
//! other cut, a random prefix of each file's kept), the filesystem is mounted again over
//! what survived, and the process restarted. A SIGKILL alone keeps the page cache; this
//! shows a missing `fsync`, or a write that overtook one.
//!
//! The hub: clients send keyed signals to one-shots, two-member barriers and monitors
//! (re-sending on 5xx and lost connections, as a client would); after each restart every
//! key answered 202 before the cut is recorded exactly once, a key answered 410 is not
//! recorded, and nothing seen in a session's log is gone; once the load stops every due
//! wake was delivered exactly once. The device agent (hub on a disk that does not lose
//! power): spool files dropped durably (tmp, fsync, rename, fsync of the directory) are
//! each recorded exactly once, whether the agent had them acknowledged before the cut (a
//! file whose deletion did not survive comes back, and the hub answers it as a duplicate)
//! or not; the remote waits it held are armed again after the cut and each fires once.
//!
//! lazyfs runs with `Names::Strict` (POSIX's promise alone: a name is durable only with
//! its directory's fsync; see [`powerloss_strict_a_fresh_hubs_store_survives_a_cut`]);
//! `CORTEX_POWERLOSS_NAMES=journaled` makes any fsync commit earlier names, as on ext4 or
//! XFS. `CORTEX_POWERLOSS_CUTS` sets the cuts per test (default 2, so
//! `cargo test` stays fast); `cargo xtask powerloss` runs 30. `CORTEX_POWERLOSS_SEED`
//! replays a run's choices (the seed is printed; when the cut lands is the OS's).
//! Skipped, saying why, where `/dev/fuse` or `fusermount3` is missing.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cortex_cli::http::Method;
use cortex_tests::agent::Agent;
use cortex_tests::{Hub, wait_until};
use lazyfs::{Cut, CutReport, LazyFs, Names};
use serde_json::{Value, json};

use crate::signal_load::{
    self, Kind, Outcome, Rng, Until, View, count_from_env, keyed_body, seed_from_env, view,
};

const T: Duration = Duration::from_secs(60);
const PER_KIND: usize = 60;
const CLIENTS: usize = 3;
/// Signals one waitpoint gets at most (its view lists its latest 1,000).
const BUDGET: u32 = 300;
const RESEND_ONE_IN: u64 = 16;
/// A client's pause between two signals, so the budgets last through 30 cuts.
const PACE: Duration = Duration::from_millis(5);

/// The cuts per test and the run's seed, printed so a run can be repeated.
fn params(what: &str) -> Option<(usize, u64)> {
    if let Err(why) = lazyfs::available() {
        eprintln!("powerloss {what}: skipped: {why}");
        return None;
    }
    let cuts = count_from_env("CORTEX_POWERLOSS_CUTS", 2);
    let seed = seed_from_env("CORTEX_POWERLOSS_SEED");
    eprintln!(
        "powerloss {what}: {cuts} cuts, seed {seed}, names {:?}",
        names()
    );
    Some((cuts, seed))
}

/// The default, `strict`, makes a name change durable only with its directory's fsync
/// (POSIX's promise alone); `CORTEX_POWERLOSS_NAMES=journaled` makes any fsync commit
/// every earlier name change, as ext4 or XFS would.
fn names() -> Names {
    match std::env::var("CORTEX_POWERLOSS_NAMES").as_deref() {
        Ok("strict") | Err(_) => Names::Strict,
        Ok("journaled") => Names::Journaled,
        Ok(other) => panic!("CORTEX_POWERLOSS_NAMES is strict or journaled, not {other:?}"),
    }
}

/// A lazyfs mount in a temp dir: `mnt` over `backing`.
struct Disk {
    lfs: Option<LazyFs>,
    names: Names,
    mnt: PathBuf,
    backing: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Disk {
    fn new(names: Names) -> Disk {
        let tmp = tempfile::tempdir().expect("tmp");
        let (mnt, backing) = (tmp.path().join("mnt"), tmp.path().join("backing"));
        std::fs::create_dir(&mnt).expect("mnt");
        std::fs::create_dir(&backing).expect("backing");
        let lfs = LazyFs::mount(&mnt, &backing, names).expect("mount lazyfs");
        Disk {
            lfs: Some(lfs),
            names,
            mnt,
            backing,
            _tmp: tmp,
        }
    }

    /// Even cuts drop every un-synced change; odd ones keep a random prefix of each.
    fn how(cycle: usize, rng: &mut Rng) -> Cut {
        if cycle % 2 == 1 {
            Cut::Prefix { seed: rng.next() }
        } else {
            Cut::Whole
        }
    }

    /// The power cut, at the first moment within a second that some change is not yet
    /// durable: the disk keeps only what survived from here on.
    fn cut(&mut self, how: Cut) -> CutReport {
        self.lfs
            .as_ref()
            .expect("mounted")
            .cut_when_unsynced(how, Duration::from_secs(1))
            .expect("cut")
    }

    /// The machine back up: the filesystem mounted again over what survived.
    fn remount(&mut self) {
        if let Some(l) = self.lfs.take() {
            l.unmount();
        }
        self.lfs = Some(LazyFs::mount(&self.mnt, &self.backing, self.names).expect("remount"));
    }
}

/// `[hub/hub.journal: kept 1, dropped 2]`: which files the cut found un-synced.
fn per_file(r: &CutReport) -> String {
    let files: Vec<String> = r
        .per_file
        .iter()
        .map(|(p, k, d)| format!("{}: kept {k}, dropped {d}", p.display()))
        .collect();
    if files.is_empty() {
        return String::new();
    }
    format!("[{}]", files.join("; "))
}

// ---------------------------------------------------------------------------------------
// The hub
// ---------------------------------------------------------------------------------------

struct Wp {
    id: String,
    secret: String,
    kind: Kind,
    sent: AtomicU32,
    gone: AtomicBool,
}

#[derive(Debug, Clone)]
struct Sent {
    wp: usize,
    status: &'static str,
    member: Option<&'static str>,
    outcome: Outcome,
}

struct Shared {
    addr: RwLock<String>,
    stop: AtomicBool,
    wps: Vec<Wp>,
    ledger: Mutex<HashMap<String, Sent>>,
    resends: AtomicU32,
    retries: AtomicUsize,
    violations: Mutex<BTreeSet<String>>,
}

impl Shared {
    fn ledger(&self) -> std::sync::MutexGuard<'_, HashMap<String, Sent>> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn violation(&self, v: String) {
        self.violations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(v);
    }
}

/// POSTs `body` until an answer that is not a 5xx (the hub was cut or is starting), at
/// most `signal_load::RETRY_LIMIT`; every attempt sent again is counted in `retries`.
fn send(sh: &Shared, body: &[u8]) -> Outcome {
    let s = signal_load::send(&sh.addr, body, Until::Below500);
    sh.retries.fetch_add(s.retried as usize, Ordering::Relaxed);
    s.outcome
}

fn client(sh: Arc<Shared>, n: usize, seed: u64) {
    let mut rng = Rng(seed);
    let mut count = 0u64;
    while !sh.stop.load(Ordering::Relaxed) {
        let i = rng.below(sh.wps.len() as u64) as usize;
        let wp = &sh.wps[i];
        if (wp.gone.load(Ordering::Relaxed) && rng.below(20) != 0)
            || wp.sent.fetch_add(1, Ordering::Relaxed) >= BUDGET
        {
            continue;
        }
        let (status, member) = match wp.kind {
            Kind::OneShot => (if rng.below(3) == 0 { "ok" } else { "progress" }, None),
            Kind::Barrier => ("ok", Some(["a", "b"][rng.below(2) as usize])),
            Kind::Monitor => (if rng.below(2) == 0 { "ok" } else { "progress" }, None),
        };
        count += 1;
        let key = format!("c{n}-{count}");
        let body = keyed_body(&wp.id, &wp.secret, status, member, &key, false);
        sh.ledger().insert(
            key.clone(),
            Sent {
                wp: i,
                status,
                member,
                outcome: Outcome::InFlight,
            },
        );
        let outcome = send(&sh, &body);
        if outcome == Outcome::Gone {
            wp.gone.store(true, Ordering::Relaxed);
        }
        std::thread::sleep(PACE);
        let resend = outcome == Outcome::Accepted && rng.below(RESEND_ONE_IN) == 0;
        if let Some(s) = sh.ledger().get_mut(&key) {
            s.outcome = outcome;
        }
        if resend {
            sh.resends.fetch_add(1, Ordering::Relaxed);
            let again = send(&sh, &body);
            if again != Outcome::Duplicate {
                sh.violation(format!(
                    "{key} to {}: answered 202 accepted, then its resend {again:?}: the first was lost",
                    wp.id
                ));
            }
        }
    }
}

/// What a check of the recorded signals against the ledger counted.
#[derive(Debug, Default)]
struct Tally {
    acked: usize,
    once: usize,
    lost: usize,
    doubled: usize,
}

/// Every key of `acked` recorded exactly once, no key answered 410 recorded, every
/// recorded key one that was sent to that waitpoint as sent. Problems go to `sh`.
fn check_signals(
    sh: &Shared,
    hub: &Hub,
    acked: &HashMap<String, Sent>,
    when: &str,
) -> (Tally, Vec<View>) {
    let views: Vec<View> = sh.wps.iter().map(|w| view(hub, &w.id)).collect();
    // After the views: every key they hold was in the ledger before it was sent.
    let ledger = sh.ledger().clone();
    let mut tally = Tally::default();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, v) in views.iter().enumerate() {
        let id = &sh.wps[i].id;
        for s in &v.signals {
            *seen.entry(s.key.as_str()).or_default() += 1;
            match ledger.get(&s.key) {
                None => sh.violation(format!(
                    "{when}: {id}: key {:?} recorded, never sent",
                    s.key
                )),
                Some(l) if l.wp != i || l.status != s.status || l.member != s.member.as_deref() => {
                    sh.violation(format!(
                        "{when}: {id}: key {:?} recorded as {}/{:?}, sent {l:?}",
                        s.key, s.status, s.member
                    ))
                }
                Some(l) if l.outcome == Outcome::Gone => sh.violation(format!(
                    "{when}: {id}: key {:?} answered 410 yet recorded",
                    s.key
                )),
                Some(_) => {}
            }
        }
    }
    for (k, s) in acked {
        if !s.outcome.acked() {
            continue;
        }
        tally.acked += 1;
        match seen.get(k.as_str()).copied().unwrap_or(0) {
            0 => {
                tally.lost += 1;
                sh.violation(format!(
                    "{when}: key {k:?} to {} ({}) answered 202 ({:?}) but not recorded",
                    sh.wps[s.wp].id, s.status, s.outcome
                ));
            }
            1 => tally.once += 1,
            n => {
                tally.doubled += 1;
                sh.violation(format!("{when}: key {k:?} recorded {n} times"));
            }
        }
    }
    (tally, views)
}

/// The session logs as read so far: each read must extend them (nothing seen is lost).
struct Logs {
    sids: Vec<String>,
    events: Vec<Vec<Value>>,
}

impl Logs {
    fn check(&mut self, sh: &Shared, hub: &Hub, when: &str) -> usize {
        let mut wakes = 0;
        for (sid, seen) in self.sids.iter().zip(self.events.iter_mut()) {
            // The whole log, page after page.
            let mut now: Vec<Value> = Vec::new();
            loop {
                let after = now.last().and_then(|e| e["seq"].as_u64()).unwrap_or(0);
                let page = hub.events(sid, after);
                if page.is_empty() {
                    break;
                }
                now.extend(page);
            }
            if now.len() < seen.len() || now[..seen.len()] != seen[..] {
                sh.violation(format!(
                    "{when}: session {sid}: {} events seen before, {} now, or changed",
                    seen.len(),
                    now.len()
                ));
            }
            wakes += now.iter().filter(|e| e["kind"] == "wake").count();
            *seen = now;
        }
        wakes
    }

    /// Wake events per waitpoint id.
    fn wakes(&self) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for e in self.events.iter().flatten().filter(|e| e["kind"] == "wake") {
            *out.entry(e["waitpoint"]["id"].as_str().unwrap_or("").to_string())
                .or_default() += 1;
        }
        out
    }
}

fn fail_on(sh: &Shared, hub: &Hub, summary: &str) {
    let v = sh
        .violations
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if v.is_empty() {
        return;
    }
    let log = hub.log();
    let lines: Vec<&str> = log.lines().collect();
    panic!(
        "{summary}\n{} violations (first 40):\n{}\nhub log tail:\n{}",
        v.len(),
        v.iter().take(40).cloned().collect::<Vec<_>>().join("\n"),
        lines[lines.len().saturating_sub(30)..].join("\n")
    );
}

#[test]
fn powerloss_the_hubs_acked_signals_and_wakes_survive_power_cuts() {
    let Some((cuts, seed)) = params("hub") else {
        return;
    };
    let started = Instant::now();
    let mut rng = Rng(seed);
    let logs_dir = tempfile::tempdir().expect("tmp");
    // Declared after the disk: dropped (killed) before it is unmounted.
    let mut disk = Disk::new(names());
    let home = disk.mnt.join("home");
    std::fs::create_dir(&home).expect("home");
    let mut hub = Hub::at(
        &home,
        &logs_dir.path().join("hub.log"),
        &[
            ("CORTEX_WAITPOINT_SWEEP_MS", "100"),
            ("CORTEX_WAITPOINT_MAX_WAKES_PER_HOUR", "3600"),
        ],
        &["--mesh-listen", "off"],
    );
    hub.spawn();
    let sids: Vec<String> = (0..3).map(|_| hub.session()).collect();
    let mut wps = Vec::new();
    for kind in [Kind::OneShot, Kind::Barrier, Kind::Monitor] {
        for k in 0..PER_KIND {
            let body = match kind {
                Kind::OneShot => json!({"label": format!("one-shot {k}"), "intent": "x"}),
                Kind::Barrier => {
                    json!({"label": format!("barrier {k}"), "intent": "x", "members": ["a", "b"]})
                }
                Kind::Monitor => {
                    json!({"label": format!("monitor {k}"), "intent": "x", "max_signals": 10_000})
                }
            };
            let created = hub.waitpoint(&sids[wps.len() % sids.len()], body);
            wps.push(Wp {
                id: created["id"].as_str().expect("id").to_string(),
                secret: created["secret"].as_str().expect("secret").to_string(),
                kind,
                sent: AtomicU32::new(0),
                gone: AtomicBool::new(false),
            });
        }
    }
    let sh = Arc::new(Shared {
        addr: RwLock::new(hub.addr.clone()),
        stop: AtomicBool::new(false),
        wps,
        ledger: Mutex::new(HashMap::new()),
        resends: AtomicU32::new(0),
        retries: AtomicUsize::new(0),
        violations: Mutex::new(BTreeSet::new()),
    });
    let mut logs = Logs {
        events: vec![Vec::new(); sids.len()],
        sids,
    };
    let clients: Vec<JoinHandle<()>> = (0..CLIENTS)
        .map(|n| {
            let sh = sh.clone();
            let s = rng.next();
            std::thread::spawn(move || client(sh, n, s))
        })
        .collect();

    let mut dropped = CutReport::default();
    for c in 0..cuts {
        std::thread::sleep(Duration::from_millis(200 + rng.below(600)));
        let how = Disk::how(c, &mut rng);
        let report = disk.cut(how);
        hub.kill();
        // Every answer sent before the cut has arrived by now.
        std::thread::sleep(Duration::from_millis(50));
        let snapshot = sh.ledger().clone();
        disk.remount();
        hub.spawn();
        *sh.addr.write().unwrap_or_else(|e| e.into_inner()) = hub.addr.clone();
        let when = format!("cut {}", c + 1);
        logs.check(&sh, &hub, &when);
        let (tally, _) = check_signals(&sh, &hub, &snapshot, &when);
        eprintln!(
            "cut {:>2}/{cuts} ({how:?}): dropped {} un-synced writes in {} files {} and {} name changes (kept {} and {}); {} acked before it: {} recorded once, {} lost, {} doubled",
            c + 1,
            report.changes_dropped,
            report.files,
            per_file(&report),
            report.names_dropped,
            report.changes_kept,
            report.names_kept,
            tally.acked,
            tally.once,
            tally.lost,
            tally.doubled,
        );
        dropped.changes_dropped += report.changes_dropped;
        dropped.names_dropped += report.names_dropped;
    }
    sh.stop.store(true, Ordering::Relaxed);
    for t in clients {
        t.join().expect("client");
    }
    wait_until(T, "every decided wake delivered", || {
        sh.wps
            .iter()
            .all(|w| view(&hub, &w.id).undelivered == 0)
            .then_some(())
    });
    let ledger = sh.ledger().clone();
    let (tally, views) = check_signals(&sh, &hub, &ledger, "at the end");
    logs.check(&sh, &hub, "at the end");
    let wakes = logs.wakes();
    for (k, s) in &ledger {
        if !s.outcome.acked() && s.outcome != Outcome::Gone {
            sh.violation(format!("{k}: ended {:?}", s.outcome));
        }
    }
    let mut wake_count = 0;
    for (w, v) in sh.wps.iter().zip(&views) {
        let evs = wakes.get(&w.id).copied().unwrap_or(0);
        wake_count += evs;
        if v.wakes != evs || v.undelivered != 0 {
            sh.violation(format!(
                "{}: {} wakes ({} undelivered) but {evs} wake events",
                w.id, v.wakes, v.undelivered
            ));
        }
        let terminals = v.signals.iter().filter(|s| s.status != "progress").count();
        let want = match w.kind {
            Kind::OneShot => usize::from(terminals > 0),
            Kind::Barrier => {
                let members: HashSet<_> =
                    v.signals.iter().filter_map(|s| s.member.clone()).collect();
                usize::from(members.len() == 2)
            }
            Kind::Monitor => terminals,
        };
        if evs != want {
            sh.violation(format!(
                "{} ({:?}, {}): {evs} wakes, want {want} ({terminals} ok signals)",
                w.id, w.kind, v.state
            ));
        }
    }
    let summary = format!(
        "powerloss hub summary: {cuts} cuts in {} s ({} un-synced writes and {} name changes dropped); {} signals sent, {} acked: {} recorded once, {} lost, {} doubled; {} deliberate resends; {} retried sends; {wake_count} wakes delivered once",
        started.elapsed().as_secs(),
        dropped.changes_dropped,
        dropped.names_dropped,
        ledger.len(),
        tally.acked,
        tally.once,
        tally.lost,
        tally.doubled,
        sh.resends.load(Ordering::Relaxed),
        sh.retries.load(Ordering::Relaxed),
    );
    eprintln!("{summary}");
    fail_on(&sh, &hub, &summary);
    assert!(
        tally.acked > 0 && wake_count > 0,
        "the load reached the hub and woke something"
    );
    hub.kill();
}

// ---------------------------------------------------------------------------------------
// The device agent
// ---------------------------------------------------------------------------------------

/// A `sleep 3600`, killed and reaped when dropped.
struct Sleep(std::process::Child);

impl Sleep {
    fn start() -> Sleep {
        Sleep(
            std::process::Command::new("sleep")
                .arg("3600")
                .stdin(std::process::Stdio::null())
                .spawn()
                .expect("spawn sleep"),
        )
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A spool file made durable the way `cortex-signal`'s fallback makes it: a tmp file,
/// fsync, rename, fsync of the directory.
fn drop_durably(spool: &Path, name: &str, body: &[u8]) {
    let tmp = spool.join(format!(".{name}.tmp"));
    let mut f = std::fs::File::create(&tmp).expect("create");
    f.write_all(body).expect("write");
    f.sync_all().expect("fsync");
    std::fs::rename(&tmp, spool.join(format!("{name}.json"))).expect("rename");
    std::fs::File::open(spool)
        .and_then(|d| d.sync_all())
        .expect("fsync the spool");
}

/// Messages of the signals recorded on `wp` (its view lists the latest 1,000).
fn messages(hub: &Hub, wp: &str) -> Vec<String> {
    hub.get_waitpoint(wp)["signals"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|s| s["message"].as_str().unwrap_or("").to_string())
        .collect()
}

/// A remote pid wait on the device, its sleep, and whether it was killed.
struct RemoteWait {
    id: String,
    session: String,
    sleep: Sleep,
    killed: bool,
}

#[test]
fn powerloss_the_device_agents_spool_and_waits_survive_power_cuts() {
    let Some((cuts, seed)) = params("agent") else {
        return;
    };
    const FILES: usize = 20;
    const NAME: &str = "gpu1";
    let started = Instant::now();
    let mut rng = Rng(seed);
    let hub = Hub::start();
    let (st, v) = hub.api(Method::Post, "/api/devices", Some(&json!({"name": NAME})));
    assert_eq!(st, 201, "{v}");
    let token = v["token"].as_str().expect("token").to_string();
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "spool", "intent": "x", "max_signals": 10_000}),
    );
    let wp_id = wp["id"].as_str().expect("id").to_string();
    let mut disk = Disk::new(names());
    let home = disk.mnt.join("agent-home");
    std::fs::create_dir(&home).expect("home");
    let mut agent = Agent::new_at(&hub, NAME, &token, Some(&home));
    agent.spawn();
    hub.wait_online(NAME);
    wait_until(T, "the agent's spool", || {
        agent.spool().is_dir().then_some(())
    });

    let mut waits: Vec<RemoteWait> = Vec::new();
    let mut dropped_files = 0usize;
    let mut came_back = 0usize;
    let mut torn = Vec::new();
    for c in 0..cuts {
        // Files and waits land while the agent forwards and arms.
        let spool = agent.spool();
        for i in 0..FILES {
            let name = format!("c{c}-{i:03}");
            let body = json!({"id": wp["id"], "secret": wp["secret"], "status": "progress", "message": name});
            drop_durably(&spool, &name, body.to_string().as_bytes());
            dropped_files += 1;
        }
        for _ in 0..2 {
            let sleep = Sleep::start();
            let (st, v) = hub.api(
                Method::Post,
                &format!("/api/devices/{NAME}/waits"),
                Some(&json!({"kind": "pid", "pid": sleep.0.id(), "timeout_s": 3600})),
            );
            assert_eq!(st, 201, "{v}");
            waits.push(RemoteWait {
                id: v["id"].as_str().expect("id").to_string(),
                session: v["session"].as_str().expect("session").to_string(),
                sleep,
                killed: false,
            });
        }
        // One process of an older wait exits now: its outcome is on its way at the cut.
        if let Some(w) = waits
            .iter_mut()
            .filter(|w| !w.killed)
            .nth(rng.below(3) as usize)
        {
            w.sleep.kill();
            w.killed = true;
        }
        std::thread::sleep(Duration::from_millis(rng.below(300)));
        let how = Disk::how(c, &mut rng);
        let report = disk.cut(how);
        agent.kill();
        let recorded: HashSet<String> = messages(&hub, &wp_id).into_iter().collect();
        disk.remount();
        // What the disk holds now: spool files already recorded came back (their deletion
        // was not durable), and the saved waits must parse.
        let back = std::fs::read_dir(agent.spool())
            .map(|d| {
                d.flatten()
                    .filter_map(|e| {
                        e.file_name()
                            .to_str()?
                            .strip_suffix(".json")
                            .map(str::to_string)
                    })
                    .filter(|n| recorded.contains(n))
                    .count()
            })
            .unwrap_or(0);
        came_back += back;
        let saved = home.join("agent/waits.json");
        if let Ok(b) = std::fs::read(&saved)
            && serde_json::from_slice::<Value>(&b).is_err()
        {
            torn.push(format!(
                "cut {}: waits.json does not parse ({} bytes)",
                c + 1,
                b.len()
            ));
        }
        agent.spawn();
        hub.wait_online(NAME);
        // Every wait whose process still runs is armed again.
        for w in waits.iter().filter(|w| !w.killed) {
            wait_until(T, "a held wait armed again after the cut", || {
                (hub.device_wait_state(NAME, &w.id).as_deref() == Some("armed")).then_some(())
            });
        }
        eprintln!(
            "cut {:>2}/{cuts} ({how:?}): dropped {} un-synced writes {} and {} name changes (kept {} and {}); {back} acknowledged spool files came back; {} waits armed again",
            c + 1,
            report.changes_dropped,
            per_file(&report),
            report.names_dropped,
            report.changes_kept,
            report.names_kept,
            waits.iter().filter(|w| !w.killed).count(),
        );
    }
    for w in &mut waits {
        w.sleep.kill();
    }
    let mut problems = torn;
    for w in &waits {
        let wake = hub.wait_wake(&w.session, &w.id, 1, T);
        if wake["reason"] != "fired" {
            problems.push(format!("{}: woke {}", w.id, wake["reason"]));
        }
    }
    wait_until(Duration::from_secs(120), "the spool drained", || {
        (agent.pending() == 0).then_some(())
    });
    // Settled: nothing more arrives.
    let msgs = messages(&hub, &wp_id);
    let mut once = HashSet::new();
    let doubled: Vec<&String> = msgs.iter().filter(|m| !once.insert(m.as_str())).collect();
    let lost = (0..cuts)
        .flat_map(|c| (0..FILES).map(move |i| format!("c{c}-{i:03}")))
        .filter(|n| !once.contains(n.as_str()))
        .count();
    if !doubled.is_empty() {
        problems.push(format!("spool files recorded twice: {doubled:?}"));
    }
    if lost > 0 {
        problems.push(format!("{lost} durably dropped spool files never recorded"));
    }
    for w in &waits {
        let n = hub.get_waitpoint(&w.id)["signals"]
            .as_array()
            .map_or(0, |s| {
                s.iter().filter(|s| s["source"] == "device-wait").count()
            });
        let wakes = hub
            .wakes(&w.session)
            .iter()
            .filter(|e| e["waitpoint"]["id"] == w.id)
            .count();
        if n != 1 || wakes != 1 {
            problems.push(format!("{}: {n} outcomes recorded, {wakes} wakes", w.id));
        }
    }
    let bad = std::fs::read_dir(agent.spool().join("bad")).map_or(0, |d| d.count());
    if bad > 0 {
        problems.push(format!("{bad} entries parked in bad/"));
    }
    let summary = format!(
        "powerloss agent summary: {cuts} cuts in {} s; {dropped_files} spool files dropped durably: {} recorded once, {lost} lost, {} doubled, {came_back} returns of an acknowledged file after a cut (its deletion not durable; answered duplicate); {} remote waits, each armed again while its process ran and fired once",
        started.elapsed().as_secs(),
        once.len(),
        doubled.len(),
        waits.len(),
    );
    eprintln!("{summary}");
    assert!(
        problems.is_empty(),
        "{summary}\n{}\nagent log tail:\n{}",
        problems.join("\n"),
        agent
            .log()
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .join("\n")
    );
    agent.kill();
}

// ---------------------------------------------------------------------------------------
// Strict POSIX: a known loss
// ---------------------------------------------------------------------------------------

/// The durable files under `dir`, relative to it.
fn durable_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(rel) = p.strip_prefix(dir) {
                out.push(rel.display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// Under POSIX's promise alone (a name is durable only with its directory's fsync): a
/// fresh hub creates `hub/hub.redb`, `hub/hub.journal` and `hub/token` (the last by a
/// rename), and a power cut right after its first 202 must leave all of them. It did not
/// while the store never fsynced `$CORTEX_HOME/hub/` (on ext4 or XFS any later fsync
/// commits those names, so it did not show there).
#[test]
fn powerloss_strict_a_fresh_hubs_store_survives_a_cut() {
    if cortex_tests::redb_only("the names of redb's files under the home after a cut") {
        return;
    }
    if let Err(why) = lazyfs::available() {
        eprintln!("powerloss strict: skipped: {why}");
        return;
    }
    let logs_dir = tempfile::tempdir().expect("tmp");
    let mut disk = Disk::new(Names::Strict);
    let home = disk.mnt.join("home");
    std::fs::create_dir(&home).expect("home");
    let mut hub = Hub::at(
        &home,
        &logs_dir.path().join("hub.log"),
        &[],
        &["--mesh-listen", "off"],
    );
    hub.spawn();
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "build", "intent": "x"}));
    let (st, v) =
        hub.signal(&json!({"id": wp["id"], "secret": wp["secret"], "status": "ok", "key": "k1"}));
    assert_eq!(st, 202, "{v}");
    disk.cut(Cut::Whole);
    hub.kill();
    let survived = durable_files(&disk.backing.join("home"));
    disk.remount();
    assert!(
        survived.iter().any(|f| f == "hub/hub.redb")
            && survived.iter().any(|f| f == "hub/hub.journal"),
        "signal k1 to {} was answered 202, then a power cut left only {survived:?} of \
         $CORTEX_HOME: hub/hub.redb and hub/hub.journal were fsynced but their names were \
         never made durable (no fsync of $CORTEX_HOME/hub/ after creating them)",
        wp["id"]
    );
    hub.spawn();
    let v = hub.get_waitpoint(wp["id"].as_str().expect("id"));
    assert_eq!(v["signals"][0]["key"], "k1", "{v}");
    hub.kill();
}
