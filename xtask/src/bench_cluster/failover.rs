//! Failover: two hubs on a database of their own (the default lease, 10 s), a session
//! driven by the first whose model call hangs, and device agents linked to it, each given
//! both hubs. The first hub is SIGKILLed; timed from the kill: every device linked to the
//! second hub, and the session's model call made again by the second (it took the claim
//! once the first's lease ran out). Each trial starts afresh.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use cortex_tests::postgres::Postgres;
use cortex_tests::scripted_model::{Reply, ScriptedModel};
use serde_json::json;

use crate::bench_kit::agent::Agent;
use crate::bench_kit::hub::Hub;
use crate::bench_kit::procs::{Procs, poll_every};

/// Device agents per trial.
pub const DEVICES: usize = 4;
/// The longest a trial waits for either to happen.
const BOUND: Duration = Duration::from_secs(60);

/// One trial's times from the kill, in ms.
pub struct Trial {
    pub devices_ms: f64,
    pub session_ms: f64,
}

/// Runs `n` trials on `cluster`, homes under `dir`.
pub fn trials(
    hub_bin: &Path,
    agent_bin: &Path,
    cluster: &Postgres,
    dir: &Path,
    n: usize,
) -> anyhow::Result<Vec<Trial>> {
    let mut out = Vec::new();
    for i in 0..n {
        let db = format!("failover{i}");
        cluster.create_database(&db);
        let trial = trial(hub_bin, agent_bin, &cluster.url(&db), &dir.join(&db))
            .with_context(|| format!("failover trial {}", i + 1))?;
        eprintln!(
            "bench: failover {}: devices linked again in {:.0} ms, the session driven again in {:.0} ms",
            i + 1,
            trial.devices_ms,
            trial.session_ms
        );
        out.push(trial);
    }
    Ok(out)
}

fn trial(hub_bin: &Path, agent_bin: &Path, url: &str, dir: &Path) -> anyhow::Result<Trial> {
    let mut procs = Procs::default();
    // The first call hangs (its hub dies under it); the one made again is answered.
    let model = ScriptedModel::start_with_default(vec![Reply::hang()], Reply::text("taken over"));
    let murl = model.url();
    let env = [
        ("CORTEX_STORE_URL", url),
        ("CORTEX_LLM_BASE_URL", murl.as_str()),
        ("CORTEX_LLM_MODEL", "scripted"),
    ];
    let a = Hub::start_with_mesh_env(hub_bin, &dir.join("a"), &env, &mut procs)?;
    let s = a.api_json("POST", "/api/sessions", Some(json!({"runs": true})), 201)?;
    let sid = s["id"].as_str().context("a session id")?.to_string();
    let r = a.api(
        "POST",
        &format!("/api/sessions/{sid}/messages"),
        Some(json!({"text": "train it"})),
    )?;
    anyhow::ensure!(
        matches!(r.status, 200 | 201),
        "posting a message: HTTP {}: {}",
        r.status,
        r.text()
    );
    poll_every(
        Duration::from_millis(5),
        BOUND,
        "the first model call",
        || Ok((model.request_count() >= 1).then_some(())),
    )?;
    // Started once the first hub drives the session: the second finds it claimed.
    let token = a.token().to_string();
    let mut env_b = env.to_vec();
    env_b.push(("CORTEX_WEBHOOK_TOKEN", token.as_str()));
    let b = Hub::start_with_mesh_env(hub_bin, &dir.join("b"), &env_b, &mut procs)?;
    let a_name = std::fs::read_to_string(dir.join("a").join("hub").join("hub-name"))
        .context("the first hub's name")?;
    let b_mesh = b.mesh_url.clone().context("the second hub's mesh")?;
    let mut agents = Vec::new();
    for d in 0..DEVICES {
        let home = dir.join(format!("dev{d}"));
        std::fs::create_dir_all(&home)?;
        agents.push(Agent::start_with(
            agent_bin,
            &a,
            &format!("dev{d}"),
            &home,
            &["--hub", &b_mesh],
            &mut procs,
        )?);
    }
    let killed = Instant::now();
    procs.kill(a.index);
    let (mut devices, mut session) = (None, None);
    poll_every(Duration::from_millis(5), BOUND, "the failover", || {
        if session.is_none() && model.request_count() >= 2 {
            session = Some(killed.elapsed());
        }
        if devices.is_none() {
            let v = b.api_json("GET", "/api/devices", None, 200)?;
            let moved = v.as_array().is_some_and(|l| {
                l.iter()
                    .filter(|d| d["state"] == "online" && d["hub"] != a_name.trim())
                    .count()
                    == DEVICES
            });
            if moved {
                devices = Some(killed.elapsed());
            }
        }
        Ok(devices.zip(session))
    })
    .with_context(|| format!("the second hub said:\n{}", b.log_tail()))?;
    let ms = |d: Option<Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1e3);
    drop(agents);
    drop(procs);
    Ok(Trial {
        devices_ms: ms(devices),
        session_ms: ms(session),
    })
}
