//! `cargo xtask bench waits`: remote waits as a job's owner sees them. A release hub and a
//! release `cortex-device-agent` on loopback; a process exits and the bench measures how
//! long until the agent knew, the hub had it on disk, and a client's long poll had the
//! wake; beside it, in the same run, the polling ways people wait for a process today
//! (`tail --pid`, a `kill -0` loop with `sleep 5`, a 500 ms poll), as ratios. Then the
//! agent idle for a window with no waits and again with 1,000 armed pid waits: CPU time,
//! wakeups, memory and descriptors. Then log waits: a line appended to a log to the hub's
//! record, beside `tail -F | grep -m1` in the same run, and the agent idle with 1,000
//! armed log and silence waits. It checks every wait fired once, prints one report,
//! and leaves nothing running. Method and figures: docs/benchmarks.md, "Remote waits".

mod daemons;
/// Shared with the agent bench, which watches an idle hub the same way.
pub mod idle;
mod latency;
mod logs;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use serde_json::json;

use crate::bench_kit::procs::{Procs, ScratchDir, poll_every};
use crate::bench_kit::report;
use crate::bench_kit::{cargo_build, cpu, target_dir, workspace_root};
use daemons::{Agent, Hub};
use latency::{Poller, Rng, Sample};

/// The targets, exit to the hub's record.
const TARGET_P50_US: f64 = 1_000.0;
const TARGET_P99_US: f64 = 5_000.0;
/// Unmeasured remote waits before the measured ones.
const WARMUP: usize = 10;
/// The device's name on the bench hub.
const DEVICE: &str = "bench";
/// The hub's defaults this bench runs with: the keepalive ping each way, and the sweep's
/// `rescan` to every agent.
const PING: Duration = Duration::from_secs(20);
const SWEEP: Duration = Duration::from_secs(30);
/// Context switches one keepalive event may cost the agent (as the mesh bench allows).
const SWITCHES_PER_EVENT: u64 = 3;

/// `cargo xtask bench waits` flags.
#[derive(clap::Parser)]
#[command(name = "cargo xtask bench waits", disable_help_flag = true)]
struct Options {
    /// Measured remote waits (after the warm-up), and as many floor samples.
    #[arg(long, default_value_t = 200, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(10..))]
    runs: usize,
    /// `tail --pid` samples.
    #[arg(long, default_value_t = 30, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    tail_runs: usize,
    /// 500 ms poll samples.
    #[arg(long, default_value_t = 30, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    poll_runs: usize,
    /// `kill -0` loop samples.
    #[arg(long, default_value_t = 10, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    loop_runs: usize,
    /// Measured remote log waits (after the warm-up), and as many floor samples.
    #[arg(long, default_value_t = 200, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(10..))]
    log_runs: usize,
    /// `tail -F | grep -m1` samples.
    #[arg(long, default_value_t = 30, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    grep_runs: usize,
    /// Pid waits armed for the idle part (a device holds at most 4,096).
    #[arg(long, default_value_t = 1_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=4_000))]
    waits: usize,
    /// Seconds of each idle window.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    idle: u64,
    /// How long to wait for an idle machine before each part (0: don't).
    #[arg(long, default_value_t = 60)]
    quiet_wait: u64,
    /// Build the binaries first (`--no-build`: use those in target/release).
    #[arg(long = "no-build", action = clap::ArgAction::SetFalse)]
    build: bool,
}

fn parse_options(args: &[&str]) -> anyhow::Result<Options> {
    crate::bench_kit::parse_flags(args)
}

/// p50, p99 and max of a sample (nearest rank), in its unit.
#[derive(Debug, Clone, Copy)]
struct Dist {
    n: usize,
    p50: f64,
    p99: f64,
    max: f64,
}

impl Dist {
    fn of(v: &mut [f64]) -> Dist {
        v.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
            v[rank - 1]
        };
        Dist {
            n: v.len(),
            p50: at(0.50),
            p99: at(0.99),
            max: v.last().copied().unwrap_or(0.0),
        }
    }
}

pub fn run(args: &[&str]) -> anyhow::Result<()> {
    let opts = parse_options(args)?;
    for tool in ["tail", "sh", "sleep"] {
        ensure!(
            crate::bench_kit::on_path(tool),
            "missing on PATH: {tool} (coreutils)"
        );
    }
    let root = workspace_root();
    let release = target_dir(&root).join("release");
    if opts.build {
        cargo_build(&root, &["cortex-hub", "cortex-device-agent"])
            .context("building the hub and the agent")?;
    }
    let hub_bin = release.join("cortex-hub");
    let agent_bin = release.join("cortex-device-agent");
    for b in [&hub_bin, &agent_bin] {
        ensure!(
            b.is_file(),
            "{} is missing; run without --no-build",
            b.display()
        );
    }
    let scratch = ScratchDir::new("waits")?;
    let child_linked = latency::prepare(scratch.path())?;
    let mut procs = Procs::default();
    let date = report::utc_now();

    let hub = Hub::start(&hub_bin, &scratch.path().join("hub-home"), &mut procs)?;
    let agent = Agent::start(&agent_bin, &hub, DEVICE, scratch.path(), &mut procs)
        .with_context(|| format!("hub log tail:\n{}", hub.log_tail()))?;
    let with_logs = |e: anyhow::Error| {
        e.context(format!(
            "agent log tail:\n{}\nhub log tail:\n{}",
            agent.log_tail(),
            hub.log_tail()
        ))
    };

    // Exit to record: warm-up, then the measured runs.
    eprintln!(
        "bench: remote pid wait, exit → agent → hub record → client, {WARMUP} warm-up + {} runs",
        opts.runs
    );
    cpu::quiet(opts.quiet_wait)?;
    for _ in 0..WARMUP {
        latency::cortex_once(&hub, &agent, DEVICE).map_err(with_logs)?;
    }
    let (samples, cortex_noise) = cpu::watched(&[hub.pid, agent.pid], || {
        (0..opts.runs)
            .map(|_| latency::cortex_once(&hub, &agent, DEVICE))
            .collect::<anyhow::Result<Vec<Sample>>>()
    })
    .map_err(with_logs)?;
    let dist = |f: fn(&Sample) -> f64| Dist::of(&mut samples.iter().map(f).collect::<Vec<_>>());
    let (agent_d, received_d, record_d, seen_d) = (
        dist(|s| s.agent_us),
        dist(|s| s.received_us),
        dist(|s| s.record_us),
        dist(|s| s.seen_us),
    );
    eprintln!(
        "bench: the floor, exit → pidfd readable in the bench, {} runs",
        opts.runs
    );
    let mut floor = (0..opts.runs)
        .map(|_| latency::pidfd_once())
        .collect::<anyhow::Result<Vec<f64>>>()?;
    let floor_d = Dist::of(&mut floor);

    // The polling ways, same process, same machine, same run.
    let mut rng = Rng::seeded();
    let mut baselines = Vec::new();
    for (p, n) in [
        (Poller::TailPid, opts.tail_runs),
        (Poller::Poll500ms, opts.poll_runs),
        (Poller::KillLoop5s, opts.loop_runs),
    ] {
        eprintln!("bench: {}, {n} runs", p.label());
        let mut v = (0..n)
            .map(|_| latency::poller_once(p, &mut rng))
            .collect::<anyhow::Result<Vec<f64>>>()?;
        baselines.push((p, Dist::of(&mut v)));
    }

    // Idle: nothing armed, then the waits armed.
    eprintln!("bench: idle agent, no waits, {} s", opts.idle);
    std::thread::sleep(Duration::from_secs(2));
    cpu::quiet(opts.quiet_wait)?;
    let (idle0, idle0_noise) = cpu::watched(&[hub.pid, agent.pid], || {
        idle::observe(agent.pid, Duration::from_secs(opts.idle))
    })?;

    eprintln!(
        "bench: arming {} pid waits on {} sleeps",
        opts.waits, opts.waits
    );
    let mut sleeps = Vec::with_capacity(opts.waits);
    for _ in 0..opts.waits {
        let child = Command::new("sleep")
            .arg("3600")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting sleep")?;
        sleeps.push(procs.add("sleep", child));
    }
    let arm_start = Instant::now();
    for &i in &sleeps {
        let pid = procs.pid(i).context("a sleep's pid")?;
        hub.api(
            "POST",
            &format!("/api/devices/{DEVICE}/waits"),
            Some(json!({"kind": "pid", "pid": pid, "timeout_s": 7200})),
            201,
        )
        .map_err(with_logs)?;
    }
    let armed_in = poll_every(
        Duration::from_millis(50),
        Duration::from_secs(120),
        "every wait armed on the device",
        || {
            let d = hub.api("GET", &format!("/api/devices/{DEVICE}"), None, 200)?;
            let list = d["wait_list"].as_array().context("no wait_list")?;
            let armed = list.iter().filter(|w| w["state"] == "armed").count();
            Ok((armed == opts.waits).then(|| arm_start.elapsed()))
        },
    )
    .map_err(with_logs)?;
    eprintln!(
        "bench: idle agent, {} waits armed, {} s",
        opts.waits, opts.idle
    );
    // Its waits file written, the arms' burst over.
    std::thread::sleep(Duration::from_secs(2));
    cpu::quiet(opts.quiet_wait)?;
    let (idle1, idle1_noise) = cpu::watched(&[hub.pid, agent.pid], || {
        idle::observe(agent.pid, Duration::from_secs(opts.idle))
    })?;

    // All of them exit at once: each fires once.
    let fire_start = Instant::now();
    for &i in &sleeps {
        procs.kill(i);
    }
    let fired_in = poll_every(
        Duration::from_millis(20),
        Duration::from_secs(120),
        "every wait ended",
        || {
            let d = hub.api("GET", &format!("/api/devices/{DEVICE}"), None, 200)?;
            Ok((d["waits"] == 0).then(|| fire_start.elapsed()))
        },
    )
    .map_err(with_logs)?;

    // Log waits: a line appended → the hub's record, beside tail -F | grep.
    for tool in ["tail", "grep"] {
        ensure!(
            crate::bench_kit::on_path(tool),
            "missing on PATH: {tool} (coreutils, grep)"
        );
    }
    let log_dir = scratch.path().join("logs");
    std::fs::create_dir_all(&log_dir).context("creating the logs directory")?;
    let log = log_dir.join("train.log");
    eprintln!(
        "bench: remote log wait, append → agent → hub record, {WARMUP} warm-up + {} runs",
        opts.log_runs
    );
    cpu::quiet(opts.quiet_wait)?;
    for n in 0..WARMUP {
        logs::cortex_once(&hub, &agent, DEVICE, &log, n).map_err(with_logs)?;
    }
    let (log_samples, log_noise) = cpu::watched(&[hub.pid, agent.pid], || {
        (0..opts.log_runs)
            .map(|n| logs::cortex_once(&hub, &agent, DEVICE, &log, WARMUP + n))
            .collect::<anyhow::Result<Vec<logs::Sample>>>()
    })
    .map_err(with_logs)?;
    let log_agent = Dist::of(&mut log_samples.iter().map(|s| s.agent_us).collect::<Vec<_>>());
    let log_record = Dist::of(&mut log_samples.iter().map(|s| s.record_us).collect::<Vec<_>>());
    eprintln!(
        "bench: the floor, append → inotify readable in the bench, {} runs",
        opts.log_runs
    );
    let floor_log = log_dir.join("floor.log");
    let mut v = (0..opts.log_runs)
        .map(|_| logs::inotify_once(&floor_log))
        .collect::<anyhow::Result<Vec<f64>>>()?;
    let log_floor = Dist::of(&mut v);
    eprintln!("bench: tail -F | grep -m1, {} runs", opts.grep_runs);
    let grep_log = log_dir.join("grep.log");
    let mut v = (0..opts.grep_runs)
        .map(|n| logs::tail_grep_once(&grep_log, n))
        .collect::<anyhow::Result<Vec<f64>>>()?;
    let tail_grep = Dist::of(&mut v);

    eprintln!(
        "bench: arming {} idle log and silence waits (half each)",
        opts.waits
    );
    let idle_logs_armed_in =
        logs::arm_idle(&hub, DEVICE, &log_dir.join("idle"), opts.waits).map_err(with_logs)?;
    eprintln!(
        "bench: idle agent, {} log and silence waits armed, {} s",
        opts.waits, opts.idle
    );
    std::thread::sleep(Duration::from_secs(2));
    cpu::quiet(opts.quiet_wait)?;
    let (idle2, idle2_noise) = cpu::watched(&[hub.pid, agent.pid], || {
        idle::observe(agent.pid, Duration::from_secs(opts.idle))
    })?;
    procs.check_alive(hub.index)?;
    procs.check_alive(agent.index)?;

    let report = Report {
        log_runs: opts.log_runs,
        log_floor,
        log_agent,
        log_record,
        log_noise_cpus: log_noise.others_cpus,
        tail_grep,
        idle2,
        idle2_noise_cpus: idle2_noise.others_cpus,
        idle_logs_armed_in,
        date,
        machine: report::machine(),
        runs: opts.runs,
        child_linked,
        floor: floor_d,
        agent: agent_d,
        received: received_d,
        record: record_d,
        seen: seen_d,
        cortex_noise_cpus: cortex_noise.others_cpus,
        baselines,
        waits: opts.waits,
        idle0,
        idle0_noise_cpus: idle0_noise.others_cpus,
        idle1,
        idle1_noise_cpus: idle1_noise.others_cpus,
        armed_in,
        fired_in,
    };
    print!("{}", report.render());
    drop(procs);
    Ok(())
}

struct Report {
    log_runs: usize,
    log_floor: Dist,
    log_agent: Dist,
    log_record: Dist,
    log_noise_cpus: f64,
    tail_grep: Dist,
    idle2: idle::Figures,
    idle2_noise_cpus: f64,
    idle_logs_armed_in: Duration,
    date: String,
    machine: String,
    runs: usize,
    child_linked: &'static str,
    floor: Dist,
    agent: Dist,
    received: Dist,
    record: Dist,
    seen: Dist,
    cortex_noise_cpus: f64,
    baselines: Vec<(Poller, Dist)>,
    waits: usize,
    idle0: idle::Figures,
    idle0_noise_cpus: f64,
    idle1: idle::Figures,
    idle1_noise_cpus: f64,
    armed_in: Duration,
    fired_in: Duration,
}

impl Report {
    fn render(&self) -> String {
        let mut s = String::new();
        let mut line = |l: String| {
            s.push_str(&l);
            s.push('\n');
        };
        line(format!(
            "cortex bench waits, {} — {} (shared machine: other work may run beside it)",
            self.date, self.machine
        ));
        line(String::new());
        line(format!(
            "process exit → …, remote pid wait through the agent and the hub ({} runs; others used {:.2} CPUs meanwhile)",
            self.runs, self.cortex_noise_cpus
        ));
        line(format!(
            "  {:<44} {:>10} {:>10} {:>10}",
            "", "p50", "p99", "max"
        ));
        for (what, d) in [
            ("floor: a pidfd in the bench turns readable", self.floor),
            ("the agent logged the outcome (frame sent)", self.agent),
            ("the hub has the agent's frame", self.received),
            ("the hub's record is durable (signal + wake)", self.record),
            ("a client's long poll has the wake", self.seen),
        ] {
            line(format!(
                "  {what:<44} {:>10} {:>10} {:>10}",
                us(d.p50),
                us(d.p99),
                us(d.max)
            ));
        }
        line(format!(
            "  (the process: a minimal {} binary, {} ms old; record p50 - floor p50 = {}, cortex's own share)",
            self.child_linked,
            latency::CHILD_AGE.as_millis(),
            us(self.record.p50 - self.floor.p50)
        ));
        let met = self.record.p50 <= TARGET_P50_US && self.record.p99 <= TARGET_P99_US;
        line(format!(
            "  target exit → hub record: p50 <= {}, p99 <= {}: {}",
            us(TARGET_P50_US),
            us(TARGET_P99_US),
            if met { "met" } else { "NOT met" }
        ));
        line(String::new());
        line("process exit → the watcher knows, the ways people poll today (same run):".into());
        line(format!(
            "  {:<40} {:>5} {:>10} {:>10} {:>10} {:>12} {:>12}",
            "", "runs", "p50", "p99", "max", "p50 ratio", "p99 ratio"
        ));
        line(format!(
            "  {:<40} {:>5} {:>10} {:>10} {:>10} {:>12} {:>12}",
            "cortex (client has the wake)",
            self.seen.n,
            us(self.seen.p50),
            us(self.seen.p99),
            us(self.seen.max),
            "1x",
            "1x"
        ));
        for (p, d) in &self.baselines {
            line(format!(
                "  {:<40} {:>5} {:>10} {:>10} {:>10} {:>12} {:>12}",
                p.label(),
                d.n,
                us(d.p50),
                us(d.p99),
                us(d.max),
                format!("{:.0}x", d.p50 / self.seen.p50.max(1.0)),
                format!("{:.0}x", d.p99 / self.seen.p99.max(1.0)),
            ));
        }
        line("  (with fewer than 100 runs, p99 is the largest sample)".into());
        line(String::new());
        let keepalive = keepalive_events(self.idle1.window);
        line(format!(
            "the agent idle for {} s (keepalive: its pings and the hub's every {} s, each answered, a hub rescan every {} s = {} events, ~{} wakeups/min):",
            self.idle1.window.as_secs(),
            PING.as_secs(),
            SWEEP.as_secs(),
            keepalive,
            keepalive * SWITCHES_PER_EVENT * 60 / self.idle1.window.as_secs().max(1)
        ));
        line(format!(
            "  {:<24} {:>12} {:>8} {:>14} {:>10} {:>8} {:>8} {:>12}",
            "", "CPU", "ticks", "wakeups/min", "RSS", "fds", "threads", "others CPUs"
        ));
        for (what, f, noise) in [
            ("no waits".to_string(), &self.idle0, self.idle0_noise_cpus),
            (
                format!("{} pid waits armed", self.waits),
                &self.idle1,
                self.idle1_noise_cpus,
            ),
            (
                format!("{} log/silence waits", self.waits),
                &self.idle2,
                self.idle2_noise_cpus,
            ),
        ] {
            line(format!(
                "  {what:<24} {:>9.2} ms {:>8} {:>14.1} {:>6.1} MiB {:>8} {:>8} {:>12.2}",
                f.cpu_ms(),
                f.ticks,
                f.wakeups_per_min(),
                f.rss_kib as f64 / 1024.0,
                f.fds,
                f.threads,
                noise
            ));
        }
        line(format!(
            "  difference: {:+.2} ms CPU, {:+.1} wakeups/min, {:+.1} MiB RSS, {:+} descriptors",
            self.idle1.cpu_ms() - self.idle0.cpu_ms(),
            self.idle1.wakeups_per_min() - self.idle0.wakeups_per_min(),
            (self.idle1.rss_kib as f64 - self.idle0.rss_kib as f64) / 1024.0,
            self.idle1.fds as i64 - self.idle0.fds as i64
        ));
        line(format!(
            "  {} waits armed (POST and the agent's confirmation) in {:.2} s; all {} processes killed at once, every wait recorded once in {:.2} s",
            self.waits,
            self.armed_in.as_secs_f64(),
            self.waits,
            self.fired_in.as_secs_f64()
        ));
        line(format!(
            "  log/silence waits against none: {:+.2} ms CPU, {:+.1} wakeups/min, {:+.1} MiB RSS, {:+} descriptors; armed in {:.2} s",
            self.idle2.cpu_ms() - self.idle0.cpu_ms(),
            self.idle2.wakeups_per_min() - self.idle0.wakeups_per_min(),
            (self.idle2.rss_kib as f64 - self.idle0.rss_kib as f64) / 1024.0,
            self.idle2.fds as i64 - self.idle0.fds as i64,
            self.idle_logs_armed_in.as_secs_f64()
        ));
        line(String::new());
        line(format!(
            "a line appended to a log → …, remote log wait through the agent and the hub ({} runs; others used {:.2} CPUs meanwhile)",
            self.log_runs, self.log_noise_cpus
        ));
        line(format!(
            "  {:<44} {:>10} {:>10} {:>10} {:>12} {:>12}",
            "", "p50", "p99", "max", "p50 ratio", "p99 ratio"
        ));
        for (what, d) in [
            ("floor: an inotify watch in the bench", self.log_floor),
            ("the agent matched the line (outcome)", self.log_agent),
            (
                "the hub's record is durable (signal + wake)",
                self.log_record,
            ),
            ("tail -n0 -F FILE | grep -m1 (prints it)", self.tail_grep),
        ] {
            line(format!(
                "  {what:<44} {:>10} {:>10} {:>10} {:>12} {:>12}",
                us(d.p50),
                us(d.p99),
                us(d.max),
                format!("{:.2}x", d.p50 / self.log_record.p50.max(1.0)),
                format!("{:.2}x", d.p99 / self.log_record.p99.max(1.0)),
            ));
        }
        let met = self.log_record.p50 <= TARGET_P50_US;
        line(format!(
            "  target append → hub record: p50 <= {}: {} (ratios against the hub's record)",
            us(TARGET_P50_US),
            if met { "met" } else { "NOT met" }
        ));
        s
    }
}

/// Microseconds for people: us, ms, or s above a second.
fn us(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2} s", v / 1e6)
    } else {
        report::us(v)
    }
}

/// What the link does by itself in `window`: the agent's pings, the hub's pings and its
/// pongs to the agent's, and the sweep's rescans.
fn keepalive_events(window: Duration) -> u64 {
    let per = |d: Duration| window.as_secs() / d.as_secs().max(1);
    3 * per(PING) + per(SWEEP)
}
