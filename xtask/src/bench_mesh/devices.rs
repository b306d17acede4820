//! The hub's memory per device link: a fresh hub, `n` devices enrolled through the API,
//! then `n` simulated agents (`cortex_tests::sim`: hello, welcome, then a reader that
//! answers pings and a ping every interval the welcome set) connected and held for a
//! while, reading the hub's resident memory at each step. The simulated devices run on
//! one tokio worker thread in the bench's process.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cortex_tests::sim::{Options, SimDevice, SimEvent};
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

use super::idle;
use crate::bench_kit::hub::Hub;
use crate::bench_kit::procs::poll_every;

/// Handshakes in flight at once while connecting.
const CONNECTING: usize = 64;

/// What the hub did with `n` devices.
pub struct Devices {
    pub n: usize,
    /// VmRSS in KiB: fresh, after enrolment, once all were connected, after the hold.
    pub rss_fresh: u64,
    pub rss_enrolled: u64,
    pub rss_connected: u64,
    pub rss_held: u64,
    pub enrol: Duration,
    pub connect: Duration,
    /// Devices that could not connect, and the first reason.
    pub failed: usize,
    pub first_failure: Option<String>,
    /// Listed online by `GET /api/devices` once connected, and after the hold.
    pub online_connected: usize,
    pub online_held: usize,
    /// Links that ended during the hold, as the simulated devices saw it.
    pub ended: usize,
    pub hold: Duration,
    /// The hub over the hold.
    pub hub_idle: idle::Figures,
}

impl Devices {
    /// Bytes of resident memory per connection, over the enrolled hub.
    pub fn per_link_bytes(&self) -> f64 {
        self.rss_held
            .max(self.rss_connected)
            .saturating_sub(self.rss_enrolled) as f64
            * 1024.0
            / self.n as f64
    }

    /// The same over the fresh hub (enrolment's memory included).
    pub fn per_device_bytes(&self) -> f64 {
        self.rss_held
            .max(self.rss_connected)
            .saturating_sub(self.rss_fresh) as f64
            * 1024.0
            / self.n as f64
    }
}

pub fn run(hub: &Hub, hub_pid: u32, n: usize, hold: Duration) -> anyhow::Result<Devices> {
    let url = hub.mesh_url.clone().context("the hub's mesh is off")?;
    std::thread::sleep(Duration::from_secs(1));
    let (rss_fresh, _) = idle::memory_kib(hub_pid)?;

    eprintln!("bench: enrolling {n} devices");
    let start = Instant::now();
    let mut creds = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("sim-{i:05}");
        let token = hub.add_device(&name)?;
        creds.push((name, token));
    }
    let enrol = start.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    let (rss_enrolled, _) = idle::memory_kib(hub_pid)?;

    eprintln!("bench: connecting {n} simulated devices");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting a tokio runtime for the simulated devices")?;
    let start = Instant::now();
    let (mut sims, failures) = connect_all(&rt, &url, creds);
    let connect = start.elapsed();
    let failed = failures.len();
    let first_failure = failures.into_iter().next();
    if sims.is_empty() {
        bail!(
            "no simulated device could connect: {}\nhub log tail:\n{}",
            first_failure.unwrap_or_default(),
            hub.log_tail()
        );
    }
    let online_connected = poll_every(
        Duration::from_millis(500),
        Duration::from_secs(60),
        "the devices listed online",
        || {
            let (_, online) = hub.devices_online()?;
            Ok((online >= sims.len()).then_some(online))
        },
    )
    .or_else(|_| hub.devices_online().map(|(_, o)| o))?;
    std::thread::sleep(Duration::from_secs(3));
    let (rss_connected, _) = idle::memory_kib(hub_pid)?;

    eprintln!(
        "bench: holding {} links for {} s (pings both ways)",
        sims.len(),
        hold.as_secs()
    );
    let hub_idle = idle::observe(&[hub_pid], hold)?
        .pop()
        .context("no figures for the hub")?;
    let (rss_held, _) = idle::memory_kib(hub_pid)?;
    let (_, online_held) = hub.devices_online()?;
    // Unconstrained: tokio's cooperative budget would make a long drain look empty.
    let ended = rt.block_on(tokio::task::unconstrained(async {
        let mut ended = 0;
        for s in &mut sims {
            while let Some(ev) = s.next(Duration::ZERO).await {
                if matches!(ev, SimEvent::Ended(_)) {
                    ended += 1;
                }
            }
        }
        ended
    }));
    // The caller kills the hub; the links then just end. Don't wait for their tasks.
    drop(sims);
    rt.shutdown_background();
    Ok(Devices {
        n,
        rss_fresh,
        rss_enrolled,
        rss_connected,
        rss_held,
        enrol,
        connect,
        failed,
        first_failure,
        online_connected,
        online_held,
        ended,
        hold,
        hub_idle,
    })
}

/// Connects every device, [`CONNECTING`] at a time; the connected ones and the failures.
fn connect_all(
    rt: &Runtime,
    url: &str,
    creds: Vec<(String, String)>,
) -> (Vec<SimDevice>, Vec<String>) {
    rt.block_on(async {
        let gate = Arc::new(Semaphore::new(CONNECTING));
        let mut tasks = tokio::task::JoinSet::new();
        for (name, token) in creds {
            let gate = gate.clone();
            let o = Options::new(url, &name, &token);
            tasks.spawn(async move {
                let _permit = gate.acquire_owned().await;
                SimDevice::connect(&o)
                    .await
                    .map_err(|e| format!("{name}: {e:?}"))
            });
        }
        let mut sims = Vec::new();
        let mut failures = Vec::new();
        while let Some(r) = tasks.join_next().await {
            match r {
                Ok(Ok(s)) => sims.push(s),
                Ok(Err(e)) => failures.push(e),
                Err(e) => failures.push(format!("a connecting task failed: {e}")),
            }
        }
        (sims, failures)
    })
}
