//! Several hubs on one PostgreSQL database, each a real `cortex-hub` process: one store
//! seen from every hub, a signal on one waking a waiter on another (the bus), a timer
//! fired once, and the sessions' claims: a session driven by one hub at a time, taken
//! over once its hub is SIGKILLed, and a hub SIGSTOPped past its lease writing nothing
//! when it wakes. Each of these fails on a design where a hub owns its state implicitly.

use std::time::Duration;

use cortex_cli::http::Method;
use cortex_tests::agent::Agent;
use cortex_tests::cut_proxy::CutProxy;
use cortex_tests::postgres::Postgres;
use cortex_tests::scripted_model::{Outcome, Reply, ScriptedModel};
use cortex_tests::{Hub, body, wait_until};
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(60);
/// The lease the model-running hubs take: short, so a takeover comes soon.
pub(crate) const LEASE_MS: u64 = 1500;

fn id(v: &Value) -> &str {
    v["id"].as_str().expect("id")
}

/// A series of `/metrics` (a counter's `_total`, a gauge as named), 0 when absent.
fn metric(hub: &Hub, series: &str) -> f64 {
    crate::metrics::scrape(hub)
        .get(series)
        .copied()
        .unwrap_or(0.0)
}

fn counter(hub: &Hub, name: &str) -> f64 {
    metric(hub, &format!("{name}_total"))
}

fn gauge(hub: &Hub, name: &str) -> f64 {
    metric(hub, name)
}

/// Two plain hubs on one new database: the second given the first's token.
pub(crate) fn two_hubs(extra: &[(&str, &str)]) -> (Hub, Hub) {
    let pg = Postgres::shared();
    let url = pg.url(&pg.database());
    let a = Hub::start_with_args(extra, &["--store", &url]);
    let mut env = extra.to_vec();
    env.push(("CORTEX_WEBHOOK_TOKEN", &a.token));
    let b = Hub::start_with_args(&env, &["--store", &url]);
    (a, b)
}

#[test]
fn hubs_on_one_database_share_the_store_and_a_signal_on_one_wakes_a_waiter_on_another() {
    let (a, b) = two_hubs(&[]);
    cross_hub_wake(&a, &b);
    // a heard b's batch through the bus (a notification, or its poll when one was lost).
    let heard = counter(&a, "cortex_bus_notifications") + counter(&a, "cortex_bus_polled_batches");
    assert!(heard >= 1.0, "a heard nothing of b's batches");
    assert!(counter(&b, "cortex_store_batches_logged") >= 1.0);
}

#[test]
fn with_notify_off_a_signal_on_one_hub_still_wakes_a_waiter_on_another_by_the_poll() {
    let (a, b) = two_hubs(&[("CORTEX_STORE_NOTIFY", "off")]);
    cross_hub_wake(&a, &b);
    assert_eq!(
        counter(&a, "cortex_bus_notifications"),
        0.0,
        "nothing was notified"
    );
    assert!(
        counter(&a, "cortex_bus_polled_batches") >= 1.0,
        "a found b's batch by its poll"
    );
}

/// Made on a, seen on b; a waiter on a woken by a signal through b; recorded once.
fn cross_hub_wake(a: &Hub, b: &Hub) {
    let sid = a.session();
    let (st, v) = b.api(Method::Get, &format!("/api/sessions/{sid}"), None);
    assert_eq!(st, 200, "{v}");
    let wp = a.waitpoint(&sid, json!({"label": "train", "intent": "read the loss"}));
    // A waiter on a (`cortex wait for`: a long poll on the session's events there), the
    // signal through b.
    let (code, out, err) = std::thread::scope(|s| {
        let waiter = s.spawn(|| a.cortex(&["wait", "for", id(&wp)]));
        // The waiter is listening once a's session has a watcher.
        wait_until(LIMIT, "the waiter's long poll on a", || {
            (gauge(a, "cortex_session_watchers") >= 1.0).then_some(())
        });
        let (st, v) = b.signal(&body(&wp, json!({"status": "ok", "message": "loss 0.1"})));
        assert_eq!(st, 202, "{v}");
        waiter.join().expect("waiter")
    });
    assert_eq!(code, 0, "{out}\n{err}\n{}", a.log());
    assert!(out.contains("loss 0.1"), "{out}");
    // The signal is recorded once, whichever hub is asked.
    for h in [a, b] {
        let seen = h.get_waitpoint(id(&wp));
        assert_eq!(seen["state"], "resolved", "{seen}");
        assert_eq!(seen["signals"].as_array().map(Vec::len), Some(1), "{seen}");
    }
}

#[test]
fn a_timer_fires_once_whichever_hubs_watch_it() {
    let (a, b) = two_hubs(&[("CORTEX_WAITPOINT_SWEEP_MS", "100")]);
    let sid = b.session();
    // 0.0005 h = 1.8 s: both hubs' timer loops have it (b made it; a heard of it).
    let wp = b.waitpoint(
        &sid,
        json!({"label": "silent", "intent": "x", "expires_in_hours": 0.0005}),
    );
    let wake = a.wait_wake(&sid, id(&wp), 1, LIMIT);
    assert_eq!(wake["reason"], "expired", "{wake:#}");
    // A second timer made later falls due well past the first: by its wake both hubs'
    // loops have run past the first's due time.
    let next = a.waitpoint(
        &sid,
        json!({"label": "later", "intent": "x", "expires_in_hours": 0.0005}),
    );
    b.wait_wake(&sid, id(&next), 1, LIMIT);
    let expired: Vec<Value> = a
        .wakes(&sid)
        .into_iter()
        .filter(|w| w["waitpoint"]["id"].as_str() == Some(id(&wp)))
        .collect();
    assert_eq!(expired.len(), 1, "{expired:#?}");
}

/// A hub on the database at `url` with a short lease, its home `dir/name`: given
/// `token` to share another hub's, running `model` when given one.
pub(crate) fn lease_hub(
    dir: &std::path::Path,
    name: &str,
    url: &str,
    token: Option<&str>,
    model: Option<&ScriptedModel>,
) -> Hub {
    lease_hub_with(dir, name, url, token, model, LEASE_MS, &[])
}

/// [`lease_hub`] with a lease of `lease_ms` and more flags (`--mesh-listen ADDR`: a mesh
/// port kept across restarts).
pub(crate) fn lease_hub_with(
    dir: &std::path::Path,
    name: &str,
    url: &str,
    token: Option<&str>,
    model: Option<&ScriptedModel>,
    lease_ms: u64,
    more: &[&str],
) -> Hub {
    let settings = json!({"agent": {"leaseMs": lease_ms}});
    settings_hub(dir, name, url, token, model, &settings, more)
}

/// [`lease_hub_with`] with `settings` as its settings.json.
pub(crate) fn settings_hub(
    dir: &std::path::Path,
    name: &str,
    url: &str,
    token: Option<&str>,
    model: Option<&ScriptedModel>,
    settings: &Value,
    more: &[&str],
) -> Hub {
    let home = dir.join(name);
    std::fs::create_dir_all(&home).expect("home");
    std::fs::write(home.join("settings.json"), settings.to_string()).expect("settings");
    let murl = model.map(|m| m.url());
    let mut env = Vec::new();
    if let Some(u) = &murl {
        env.push(("CORTEX_LLM_BASE_URL", u.as_str()));
        env.push(("CORTEX_LLM_MODEL", "scripted"));
    }
    if let Some(t) = token {
        env.push(("CORTEX_WEBHOOK_TOKEN", t));
    }
    let log = dir.join(format!("{name}.log"));
    let mut args = vec!["--store", url];
    args.extend_from_slice(more);
    let mut hub = Hub::at(&home, &log, &env, &args);
    hub.spawn();
    hub
}

/// [`lease_hub`] running `model`, in a temp dir of its own.
fn model_hub(model: &ScriptedModel, url: &str, token: Option<&str>) -> (Hub, tempfile::TempDir) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let hub = lease_hub(tmp.path(), "home", url, token, Some(model));
    (hub, tmp)
}

fn agent_session(hub: &Hub, text: &str) -> String {
    let (st, v) = hub.api(Method::Post, "/api/sessions", Some(&json!({"runs": true})));
    assert_eq!(st, 201, "{v}");
    let sid = v["id"].as_str().expect("id").to_string();
    let (st, v) = hub.api(
        Method::Post,
        &format!("/api/sessions/{sid}/messages"),
        Some(&json!({"text": text})),
    );
    assert!(st == 200 || st == 201, "{st} {v}");
    sid
}

/// Sends `which` (`-STOP`, `-CONT`) to process `pid`.
pub(crate) fn signal(pid: &str, which: &str) {
    let st = std::process::Command::new("kill")
        .args([which, pid])
        .status()
        .expect("kill");
    assert!(st.success(), "kill {which} {pid}");
}

fn count_kind(events: &[Value], kind: &str) -> usize {
    events.iter().filter(|e| e["kind"] == kind).count()
}

#[test]
fn a_session_a_killed_hub_drove_is_taken_over_by_another_and_run_once() {
    let pg = Postgres::shared();
    let url = pg.url(&pg.database());
    // The first call hangs (the hub dies under it); the next is answered.
    let model = ScriptedModel::start(vec![Reply::hang(), Reply::text("done on b")]);
    let (mut a, _ta) = model_hub(&model, &url, None);
    let sid = agent_session(&a, "train it");
    model.wait_requests(1, LIMIT);
    let token = a.token.clone();
    a.kill();
    let (b, _tb) = model_hub(&model, &url, Some(&token));
    // b finds the session claimed by a, and takes it once a's lease ran out.
    let end = b.wait_event(&sid, LIMIT, |e| e["kind"] == "run-end");
    assert_eq!(end["result"]["ok"], true, "{end:#}");
    let events = b.events(&sid, 0);
    assert_eq!(count_kind(&events, "run-end"), 1, "{events:#?}");
    assert_eq!(
        model.request_count(),
        2,
        "one call each: a's lost, b's answered"
    );
    let text = serde_json::to_string(&events).expect("json");
    assert!(text.contains("done on b"), "{text}");
}

/// A session driven by hub a, its model call hanging (for the default 120 s), and hub b
/// (no model) on the same database.
fn hung_on_a(url: &str) -> (ScriptedModel, Hub, Hub, String, Vec<tempfile::TempDir>) {
    let model = ScriptedModel::start(vec![Reply::hang()]);
    let (a, ta) = model_hub(&model, url, None);
    let tb = tempfile::tempdir().expect("tempdir");
    let b = lease_hub(tb.path(), "b", url, Some(&a.token), None);
    let sid = agent_session(&a, "train it");
    model.wait_requests(1, LIMIT);
    (model, a, b, sid, vec![ta, tb])
}

#[test]
fn a_cancel_posted_on_one_hub_stops_the_model_call_another_hub_waits_on() {
    let pg = Postgres::shared();
    let (model, a, b, sid, _dirs) = hung_on_a(&pg.url(&pg.database()));
    let (st, v) = b.api(
        Method::Post,
        &format!("/api/sessions/{sid}/cancel"),
        Some(&json!({"turn_only": true})),
    );
    assert_eq!(st, 202, "{v}");
    assert_eq!(
        v["running"], true,
        "a's live claim: a turn runs, and is told: {v}"
    );
    // a hears the stop through the store and drops the call, long before it times out.
    assert_eq!(model.wait_outcome(0, LIMIT), Outcome::ClientGone);
    let end = a.wait_event(&sid, LIMIT, |e| e["kind"] == "run-end");
    assert_eq!(end["result"]["ok"], false, "{end:#}");
    assert_eq!(
        model.request_count(),
        1,
        "the stopped call is not made again"
    );
}

#[test]
fn a_session_deleted_on_one_hub_stops_the_model_call_another_hub_waits_on() {
    let pg = Postgres::shared();
    let (model, a, b, sid, _dirs) = hung_on_a(&pg.url(&pg.database()));
    let (st, v) = b.api(Method::Delete, &format!("/api/sessions/{sid}"), None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(model.wait_outcome(0, LIMIT), Outcome::ClientGone);
    // a's task wrote nothing back: the session stays deleted, on both hubs.
    for hub in [&a, &b] {
        let (st, v) = hub.api(Method::Get, &format!("/api/sessions/{sid}"), None);
        assert_eq!(st, 404, "{v}");
    }
    wait_until(LIMIT, "a's claim on the deleted session gone", || {
        (gauge(&a, "cortex_claims_held") == 0.0).then_some(())
    });
}

#[test]
fn a_device_exec_asked_on_one_hub_starts_once_through_the_hub_holding_the_link() {
    let pg = Postgres::shared();
    let db = pg.database();
    let url = pg.url(&db);
    let homes = tempfile::tempdir().expect("homes");
    // a holds the device's link and runs no model; b runs the session and its call.
    let a = lease_hub(homes.path(), "a", &url, None, None);
    let model = crate::device_exec::exec_model();
    let b = lease_hub(homes.path(), "b", &url, Some(&a.token), Some(&model));
    let token = a.add_device("gpu1");
    let mut agent = Agent::new(&a, "gpu1", &token);
    agent.set_env("CORTEX_ALLOW_EXEC", "1");
    agent.spawn();
    wait_until(LIMIT, "b showing gpu1 online on a", || {
        (b.device("gpu1")["hub"] == name_of(&a)).then_some(())
    });
    // b's metrics count the fleet, not its own links (it has none).
    assert_eq!(gauge(&b, r#"cortex_devices{state="online"}"#), 1.0);
    assert_eq!(gauge(&b, r#"cortex_devices{state="offline"}"#), 0.0);
    assert_eq!(gauge(&b, "cortex_mesh_links"), 0.0);
    let mark = homes.path().join("mark");
    let sid = crate::runner::new_session(&b, json!({"policy": {"requireApproval": []}}));
    let script = format!("echo run >> {}", mark.display());
    crate::runner::say(&b, &sid, json!({"text": format!("exec: {script}")}));
    let end = crate::runner::run_end(&b, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end:#}");
    // b recorded the run with the pid the device gave through a.
    let execs = crate::device_exec::device_execs(&b);
    assert_eq!(execs.len(), 1, "{execs:#?}");
    assert!(
        execs[0]["pid"].as_i64().is_some_and(|p| p > 0),
        "{execs:#?}"
    );
    wait_until(LIMIT, "the command's mark", || {
        std::fs::read_to_string(&mark)
            .ok()
            .filter(|m| !m.is_empty())
    });
    assert_eq!(
        std::fs::read_to_string(&mark).expect("mark"),
        "run\n",
        "started once"
    );
    assert_eq!(counter(&b, "cortex_exec_relayed"), 1.0);
    assert_eq!(counter(&a, "cortex_exec_served"), 1.0);
    // Answered, the ask is gone from the store.
    let left = pg.query(&db, "SELECT count(*) FROM cortex.exec_asks");
    assert_eq!(left, "0");
}

/// A call asked before its hub died, asked again by the hub that took the session while
/// its device is away, reaches the device once it links to a third hub: the re-ask waits
/// for a link anywhere, not only on the asking hub (which the device does not even
/// know), and the device answers with the run it holds. The command, which freezes its
/// hub and the agent as it starts (so the answer is not recorded), runs once.
#[test]
fn a_call_asked_again_after_its_hub_died_reaches_its_device_on_another_hub() {
    use crate::device_exec::{device_execs, exec_model};
    use rustix::process::Signal;
    let pg = Postgres::shared();
    let url = pg.url(&pg.database());
    let homes = tempfile::tempdir().expect("homes");
    let model = exec_model();
    let settings = json!({"agent": {"leaseMs": LEASE_MS}, "deviceLossGraceMs": 60_000});
    let hub = |name: &str, token: Option<&str>, model: Option<&ScriptedModel>| {
        settings_hub(homes.path(), name, &url, token, model, &settings, &[])
    };
    // c runs no model (it drives no session); the device knows a and c, never b.
    let c = hub("c", None, None);
    let token = c.add_device("gpu1");
    for cycle in 0..5 {
        let mut a = hub(&format!("a{cycle}"), Some(&c.token), Some(&model));
        let mut agent = Agent::new(&a, "gpu1", &token);
        agent.set_hub_urls(&[&a.mesh_url, &c.mesh_url]);
        agent.set_env("CORTEX_ALLOW_EXEC", "1");
        agent.spawn();
        wait_until(LIMIT, "gpu1 linked to a", || {
            (c.device("gpu1")["hub"] == name_of(&a) && c.device("gpu1")["state"] == "online")
                .then_some(())
        });
        let (pids, mark) = (
            homes.path().join("pids"),
            homes.path().join(format!("mark{cycle}")),
        );
        let both = format!("{} {}\n", a.pid().expect("a"), agent.pid().expect("agent"));
        std::fs::write(&pids, both).expect("pids");
        // Builtins only before the freeze: no fork the agent's answer could overtake.
        let script = format!(
            "read h d < {}; kill -STOP $h $d; echo run >> {}",
            pids.display(),
            mark.display()
        );
        let sid = crate::runner::new_session(&a, json!({"policy": {"requireApproval": []}}));
        crate::runner::say(&a, &sid, json!({"text": format!("exec: {script}")}));
        wait_until(LIMIT, "the command to start", || {
            std::fs::read_to_string(&mark)
                .ok()
                .filter(|m| !m.is_empty())
        });
        let told = |hub: &Hub| {
            device_execs(hub)
                .into_iter()
                .find(|e| e["session"] == sid.as_str())
        };
        if told(&c).is_some_and(|e| e["pid"].is_i64()) {
            // a recorded the answer before the freeze: this cycle proves nothing.
            crate::device_exec::signal(agent.pid(), Signal::CONT);
            a.kill();
            continue;
        }
        a.kill();
        wait_until(LIMIT, "gpu1 recorded offline once a is gone", || {
            (c.device("gpu1")["state"] != "online").then_some(())
        });
        let b = hub(&format!("b{cycle}"), Some(&c.token), Some(&model));
        let said = wait_until(LIMIT, "b saying the call's state is unknown", || {
            told(&b).filter(|e| {
                e["error"]
                    .as_str()
                    .is_some_and(|t| t.contains("state unknown"))
            })
        });
        assert!(said["pid"].is_null(), "{said}");
        // Back: the agent finds a gone and links to c; b asks again through c.
        crate::device_exec::signal(agent.pid(), Signal::CONT);
        let end = crate::runner::run_end(&b, &sid, 1);
        assert_eq!(end["result"]["ok"], true, "{end}");
        let evs = b.events(&sid, 0);
        let obs = &evs
            .iter()
            .find(|e| e["kind"] == "tool-end")
            .expect("the call's answer")["observation"];
        assert_eq!(obs["ok"], true, "{obs}");
        assert!(obs["result"]["pid"].is_i64(), "{obs}");
        assert!(
            obs["result"]["note"]
                .as_str()
                .is_some_and(|n| n.contains("started before")),
            "the agent answered with the run it holds: {obs}"
        );
        assert_eq!(counter(&b, "cortex_exec_relayed"), 1.0, "asked through c");
        assert_eq!(
            std::fs::read_to_string(&mark).expect("mark"),
            "run\n",
            "one run"
        );
        return;
    }
    panic!("in five cycles the hub always recorded the answer before the command froze it");
}

#[test]
fn a_database_out_of_reach_stops_nothing_for_good_turns_run_on_and_signals_are_taken() {
    let pg = Postgres::shared();
    let db = pg.database();
    // The hub reaches the database through a proxy the test takes down and up again.
    let proxy = CutProxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], pg.port())));
    let url = format!("postgres://postgres@127.0.0.1:{}/{db}", proxy.port());
    // The second call is answered late: by then the database is out of reach.
    let model = ScriptedModel::start_with_default(
        vec![
            Reply::text("fine"),
            Reply::text("late").head_delay(Duration::from_millis(1500)),
        ],
        Reply::text("after"),
    );
    let (hub, _t) = model_hub(&model, &url, None);
    let sid = agent_session(&hub, "before");
    crate::runner::run_end(&hub, &sid, 1);
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "job", "intent": "x", "max_signals": 10}),
    );
    crate::runner::say(&hub, &sid, json!({"text": "during"}));
    model.wait_requests(2, LIMIT);
    proxy.down();
    // The turn's write fails; the runner says so, and neither it nor its queue stops.
    wait_until(LIMIT, "the runner told the write failed", || {
        hub.log()
            .contains("the runner stopped driving a session")
            .then_some(())
    });
    proxy.up();
    // A signal is taken again (a 503 meanwhile loses nothing: the sender tries again).
    let (st, v) = wait_until(LIMIT, "a signal answered after the outage", || {
        let (st, v) = hub.signal(&body(&wp, json!({"status": "ok", "key": "after"})));
        (st != 503).then_some((st, v))
    });
    assert_eq!(st, 202, "{v}");
    // The turn is driven again without a restart, and ends once (the signal's wake may
    // start a run of its own after it).
    let end = crate::runner::run_end(&hub, &sid, 2);
    assert_eq!(end["result"]["ok"], true, "{end:#}");
    wait_until(LIMIT, "the session's runs over", || {
        let (_, v) = hub.api(Method::Get, &format!("/api/sessions/{sid}"), None);
        (v["state"] == "waiting_on_machine").then_some(())
    });
    let events = hub.events(&sid, 0);
    let runs = |kind: &str| -> Vec<Value> {
        events
            .iter()
            .filter(|e| e["kind"] == kind)
            .map(|e| e["run_id"].clone())
            .collect()
    };
    let (starts, ends) = (runs("run-start"), runs("run-end"));
    let distinct: std::collections::HashSet<String> = ends.iter().map(Value::to_string).collect();
    assert_eq!(distinct.len(), ends.len(), "a run ended twice: {events:#?}");
    assert_eq!(ends.len(), starts.len(), "{events:#?}");
}

#[test]
fn a_killed_hubs_session_is_taken_long_before_its_lease_ends() {
    let pg = Postgres::shared();
    let url = pg.url(&pg.database());
    let model = ScriptedModel::start(vec![Reply::hang(), Reply::text("taken at once")]);
    // A lease of 10 minutes: only the dead hub's lost session lock can end it in time.
    let homes = tempfile::tempdir().expect("homes");
    let long = |name: &str, token: Option<&str>| {
        lease_hub_with(homes.path(), name, &url, token, Some(&model), 600_000, &[])
    };
    let mut a = long("a", None);
    let sid = agent_session(&a, "train it");
    model.wait_requests(1, LIMIT);
    // Started once a drives the session: b finds it claimed.
    let b = long("b", Some(&a.token));
    a.kill();
    // Its lock went with it: b ends a's claims at its second check and drives the session.
    let end = b.wait_event(&sid, LIMIT, |e| e["kind"] == "run-end");
    assert_eq!(end["result"]["ok"], true, "{end:#}");
    assert!(b.log().contains("its claims end now"), "{}", b.log());
    assert_eq!(model.request_count(), 2);
}

#[test]
fn a_hub_stopped_past_its_lease_writes_nothing_for_the_session_when_it_wakes() {
    let pg = Postgres::shared();
    let url = pg.url(&pg.database());
    // a's call is answered while a is stopped; b's is the one that counts.
    let model = ScriptedModel::start(vec![
        Reply::text("written by a").head_delay(Duration::from_millis(500)),
        Reply::text("written by b"),
    ]);
    let (a, _ta) = model_hub(&model, &url, None);
    let sid = agent_session(&a, "train it");
    model.wait_requests(1, LIMIT);
    let pid = a.pid().expect("pid").to_string();
    signal(&pid, "-STOP");
    let (b, _tb) = model_hub(&model, &url, Some(&a.token));
    let end = b.wait_event(&sid, LIMIT, |e| e["kind"] == "run-end");
    assert_eq!(end["result"]["ok"], true, "{end:#}");
    // a wakes with its answer in hand: its write for the session is refused.
    signal(&pid, "-CONT");
    wait_until(
        LIMIT,
        "a told it writes nothing more for the session",
        || a.log().contains("writes nothing more for it").then_some(()),
    );
    // What a would have written is nowhere; b's run is there once.
    let events = b.events(&sid, 0);
    let text = serde_json::to_string(&events).expect("json");
    assert!(!text.contains("written by a"), "{text}");
    assert!(text.contains("written by b"), "{text}");
    assert_eq!(count_kind(&events, "run-end"), 1, "{events:#?}");
    // And a goes on serving: the session reads the same from it.
    let (st, v) = a.api(
        Method::Get,
        &format!("/api/sessions/{sid}/events?after=0"),
        None,
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["events"].as_array().map(Vec::len), Some(events.len()));
}

/// A hub's name among the hubs on its store.
fn name_of(hub: &Hub) -> String {
    std::fs::read_to_string(hub.home.join("hub/hub-name"))
        .expect("hub-name")
        .trim()
        .to_string()
}

#[test]
fn a_device_linked_to_one_hub_is_online_on_another_and_a_wait_armed_there_fires() {
    let (a, b) = two_hubs(&[]);
    let token = a.add_device("gpu1");
    let _agent = Agent::start(&a, "gpu1", &token);
    a.wait_online("gpu1");
    // b says it is online, and on which hub; so does a.
    let on_b = wait_until(LIMIT, "b showing gpu1 online", || {
        let d = b.device("gpu1");
        (d["state"] == "online").then_some(d)
    });
    assert_eq!(on_b["hub"], name_of(&a), "{on_b}");
    assert_eq!(a.device("gpu1")["hub"], name_of(&a));
    let (code, out, err) = b.cortex(&["devices"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("HUB") && out.contains(&name_of(&a)), "{out}");
    // A remote wait asked of b reaches the agent through a, and its outcome comes back.
    let mut sleep = crate::remote_waits::Sleep::start();
    let pid = sleep.pid().to_string();
    let (code, stdout, stderr) = std::thread::scope(|s| {
        let waiter =
            s.spawn(|| b.cortex(&["wait", "pid", &pid, "--device", "gpu1", "--timeout", "10m"]));
        wait_until(LIMIT, "the wait armed on the device", || {
            a.device("gpu1")["wait_list"]
                .as_array()
                .and_then(|l| l.iter().find(|w| w["state"] == "armed").cloned())
        });
        sleep.kill();
        waiter.join().expect("waiter")
    });
    assert_eq!(code, 0, "{stdout}\n{stderr}");
}

#[test]
fn a_device_added_on_one_hub_links_to_another_and_a_revocation_on_the_first_ends_it() {
    let (a, b) = two_hubs(&[]);
    // Added on a, its agent given only b: b knows its token from the store.
    let token = a.add_device("gpu1");
    let mut agent = Agent::new(&b, "gpu1", &token);
    agent.spawn();
    b.wait_online("gpu1");
    wait_until(LIMIT, "a showing gpu1 online on b", || {
        (a.device("gpu1")["hub"] == name_of(&b)).then_some(())
    });
    // Revoked on a: b ends its link at once, and the agent is told why.
    let (code, _, err) = a.cortex(&["device", "revoke", "gpu1"]);
    assert_eq!(code, 0, "{err}");
    wait_until(LIMIT, "b ending the revoked device's link", || {
        b.log()
            .contains("a device revoked on another hub: its link here is ended")
            .then_some(())
    });
    wait_until(LIMIT, "the agent told it is revoked", || {
        agent.log().contains("revoked").then_some(())
    });
    let (st, _) = b.api(Method::Get, "/api/devices/gpu1", None);
    assert_ne!(st, 200, "gpu1 is gone from b too");
}

#[test]
fn the_devices_of_a_killed_hub_are_recorded_offline_by_another() {
    let pg = Postgres::shared();
    let url = pg.url(&pg.database());
    // A short lease: a hub silent for two of them is taken for gone.
    let homes = tempfile::tempdir().expect("homes");
    let mut a = lease_hub(homes.path(), "a", &url, None, None);
    let b = lease_hub(homes.path(), "b", &url, Some(&a.token), None);
    let token = a.add_device("gpu1");
    let _agent = Agent::start(&a, "gpu1", &token);
    a.wait_online("gpu1");
    wait_until(LIMIT, "b showing gpu1 online on a", || {
        (b.device("gpu1")["hub"] == name_of(&a)).then_some(())
    });
    a.kill();
    // a says nothing more: b records its device offline, saying why.
    let gone = wait_until(LIMIT, "b recording gpu1 offline", || {
        let d = b.device("gpu1");
        (d["state"] == "offline").then_some(d)
    });
    assert_eq!(
        gone["offline_reason"], "its hub stopped answering",
        "{gone}"
    );
    assert!(gone.get("hub").is_none(), "{gone}");
}

#[test]
fn a_hub_frozen_past_two_leases_makes_its_devices_links_again_and_they_read_online() {
    let pg = Postgres::shared();
    let url = pg.url(&pg.database());
    let homes = tempfile::tempdir().expect("homes");
    let a = lease_hub(homes.path(), "a", &url, None, None);
    let b = lease_hub(homes.path(), "b", &url, Some(&a.token), None);
    let token = a.add_device("gpu1");
    let agent = Agent::start(&a, "gpu1", &token);
    wait_until(LIMIT, "b showing gpu1 online on a", || {
        (b.device("gpu1")["hub"] == name_of(&a)).then_some(())
    });
    // Frozen, a says nothing: b records gpu1 offline, though its link to a is still up.
    let pid = a.pid().expect("pid").to_string();
    signal(&pid, "-STOP");
    wait_until(LIMIT, "b recording gpu1 offline", || {
        (b.device("gpu1")["offline_reason"] == "its hub stopped answering").then_some(())
    });
    // Woken, a sees its link disowned and makes it again: the store says online again.
    signal(&pid, "-CONT");
    wait_until(LIMIT, "a ending the disowned link", || {
        a.log().contains("its link is made again").then_some(())
    });
    let back = wait_until(LIMIT, "b reading gpu1 online again", || {
        let d = b.device("gpu1");
        (d["state"] == "online").then_some(d)
    });
    assert_eq!(back["hub"], name_of(&a), "{back}");
    assert!(agent.log().contains("disowned"), "{}", agent.log());
}
