//! `cargo xtask bench mesh`: the device mesh as a job on a device sees it. A release hub
//! and a release `cortex-device-agent` on loopback; the bench drops spool files the way
//! the one-line shell drop does (`NAME.tmp`, then a rename to `NAME.json`) and times each until the agent deletes
//! it, which it does only after the hub's ack, sent after the durable commit: drop to
//! accepted, p50/p99/max for bodies of ~100 B to ~64 KB, one file in flight. Then a burst
//! of files as fast as they can be written (files/s, each recorded once); the idle agent's
//! CPU time, wakeups and memory over a window, beside `inotifywait -m` on the same
//! directory; and a fresh hub's memory with thousands of simulated devices connected. It
//! checks that every file was recorded once and every link held, prints one report, and
//! leaves nothing running. Method and figures: docs/benchmarks.md.

pub(crate) mod agent;
mod devices;
mod idle;
mod spool;

use std::time::Duration;

use anyhow::{Context, bail, ensure};
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

use crate::bench_kit::agent::Agent;
use crate::bench_kit::hub::{Hub, Monitor};
use crate::bench_kit::procs::{Procs, ScratchDir, poll};
use crate::bench_kit::report::{self, thousands, us};
use crate::bench_kit::{cargo_build, cpu, target_dir, workspace_root};
use spool::SIZES;

/// The targets.
const TARGET_P50_US: f64 = 1_000.0;
const TARGET_P99_US: f64 = 5_000.0;
/// 10 MB and 50 KB, decimal.
const TARGET_AGENT_RSS_BYTES: f64 = 10e6;
const TARGET_LINK_BYTES: f64 = 50e3;

/// The hub's defaults this bench runs with (it sets neither): the keepalive ping each way,
/// and the sweep that sends every agent a `rescan`.
const PING: Duration = Duration::from_secs(20);
const SWEEP: Duration = Duration::from_secs(30);
/// Context switches one keepalive or rescan event may cost the agent (the runtime's I/O
/// driver wakes, hands the frame to a worker, which may wake another); see
/// docs/benchmarks.md.
const SWITCHES_PER_EVENT: u64 = 3;

/// Unmeasured drops before each size's measured ones.
const WARMUP: usize = 20;
/// Renames timed for the inotify floor.
const FLOOR_N: usize = 1_000;
/// How long one file may take before the bench calls it lost.
const DROP_BOUND: Duration = Duration::from_secs(10);
const BURST_BOUND: Duration = Duration::from_secs(300);
/// Above this many CPUs used by others during a part, the report warns.
const NOISY_CPUS: f64 = cpu::QUIET_CPUS;

/// `cargo xtask bench mesh` flags.
#[derive(clap::Parser)]
#[command(name = "cargo xtask bench mesh", disable_help_flag = true)]
struct Options {
    /// Seconds the agent is watched idle.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    idle: u64,
    /// Measured drops of each size.
    #[arg(long, default_value_t = 1_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(10..))]
    drops: usize,
    /// Files in the burst.
    #[arg(long, default_value_t = 20_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    burst: usize,
    /// Simulated devices held by the hub.
    #[arg(long, default_value_t = 5_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    devices: usize,
    /// Seconds the simulated devices are held.
    #[arg(long, default_value_t = 45)]
    hold: u64,
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

pub fn run(args: &[&str]) -> anyhow::Result<()> {
    let opts = parse_options(args)?;
    if !crate::bench_kit::on_path(agent::INOTIFYWAIT) {
        bail!(
            "missing on PATH: {}; install it with:\n    {}",
            agent::INOTIFYWAIT,
            agent::INSTALL
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
    // Thousands of links: one descriptor each in the hub, and in the bench for the
    // simulated devices. Raised here, inherited by every process the bench starts.
    let nofile = raise_nofile(opts.devices as u64 + 1_000)?;

    let scratch = ScratchDir::new("mesh")?;
    let mut procs = Procs::default();
    let date = report::utc_now();
    let mut checks = Vec::new();
    let mut failures = Vec::new();

    let hub = Hub::start_with_mesh(&hub_bin, &scratch.path().join("hub-home"), &mut procs)?;
    let hub_pid = procs.pid(hub.index).context("the hub's pid")?;
    let agent = Agent::start(&agent_bin, &hub, "bench-agent", scratch.path(), &mut procs)
        .with_context(|| format!("hub log tail:\n{}", hub.log_tail()))?;
    let spool_dir = agent.spool.clone();
    let with_logs = |e: anyhow::Error, agent: &Agent| {
        e.context(format!(
            "agent log tail:\n{}\nhub log tail:\n{}",
            agent.log_tail(),
            hub.log_tail()
        ))
    };

    // Idle: the agent connected with nothing to send, inotifywait on the same directory.
    let (iw_index, iw_pid) = agent::start_inotifywait(&spool_dir, &mut procs)?;
    eprintln!("bench: idle agent beside inotifywait, {} s", opts.idle);
    std::thread::sleep(Duration::from_secs(2));
    cpu::quiet(opts.quiet_wait)?;
    let (figs, idle_noise) = cpu::watched(&[hub_pid, agent.pid, iw_pid], || {
        idle::observe(&[agent.pid, iw_pid], Duration::from_secs(opts.idle))
    })?;
    let mut figs = figs.into_iter();
    let agent_idle = figs.next().context("no idle figures for the agent")?;
    let iw_idle = figs.next().context("no idle figures for inotifywait")?;
    procs.check_alive(iw_index)?;
    procs.kill(iw_index);
    let idle = Idle {
        window: Duration::from_secs(opts.idle),
        agent: agent_idle,
        inotifywait: iw_idle,
        noise: idle_noise,
    };

    eprintln!("bench: rename → IN_MOVED_TO floor, {FLOOR_N} renames");
    cpu::quiet(opts.quiet_wait)?;
    let (mut floor, floor_noise) = cpu::watched(&[hub_pid, agent.pid], || {
        spool::inotify_floor(&scratch.path().join("floor"), FLOOR_N)
    })?;
    let floor = Lat::of(&mut floor, floor_noise);

    // Drop to accepted, one size at a time, one file in flight.
    let monitors = hub.create_monitors(SIZES.len() + 1)?;
    let mut sizes = Vec::new();
    for (k, (size, m)) in SIZES.iter().zip(&monitors).enumerate() {
        let body = spool::body(m, *size)?;
        eprintln!(
            "bench: drop → accepted, {} ({} B), {WARMUP} warm-up + {} drops",
            size.label,
            body.len(),
            opts.drops
        );
        let (lat, cpu_us) = (|| {
            cpu::quiet(opts.quiet_wait)?;
            spool::drop_to_deleted(&spool_dir, &format!("warm{k}"), &body, WARMUP, DROP_BOUND)?;
            let before = [cpu::own_ticks(agent.pid)?, cpu::own_ticks(hub_pid)?];
            let (mut lat, noise) = cpu::watched(&[hub_pid, agent.pid], || {
                spool::drop_to_deleted(
                    &spool_dir,
                    &format!("lat{k}"),
                    &body,
                    opts.drops,
                    DROP_BOUND,
                )
            })?;
            let after = [cpu::own_ticks(agent.pid)?, cpu::own_ticks(hub_pid)?];
            let per_drop = |i: usize| {
                after[i].saturating_sub(before[i]) as f64 / cpu::TICKS_PER_S * 1e6
                    / opts.drops as f64
            };
            anyhow::Ok((Lat::of(&mut lat, noise), [per_drop(0), per_drop(1)]))
        })()
        .map_err(|e| with_logs(e, &agent))?;
        let want = (WARMUP + opts.drops) as u64;
        let recorded = hub.recorded(std::slice::from_ref(m))?;
        let mut text = format!(
            "drops of {}: {} files dropped and deleted, {} recorded by the hub",
            size.label,
            thousands(want as f64),
            thousands(recorded as f64)
        );
        if recorded != want {
            text.push_str("  <-- MISMATCH");
            failures.push(format!(
                "{}: {want} dropped, {recorded} recorded",
                size.label
            ));
        }
        checks.push(text);
        sizes.push(SizeRow {
            label: size.label,
            bytes: body.len(),
            lat,
            cpu_us,
        });
    }

    // Burst.
    let burst_m = monitors.last().context("no monitor for the burst")?;
    let burst = run_burst(
        &hub,
        hub_pid,
        &agent,
        burst_m,
        &opts,
        &mut checks,
        &mut failures,
    )
    .map_err(|e| with_logs(e, &agent))?;
    procs.check_alive(agent.index)?;
    procs.check_alive(hub.index)?;
    let (agent_rss_after, agent_hwm) = idle::memory_kib(agent.pid)?;
    procs.kill(agent.index);
    procs.kill(hub.index);

    // The hub with thousands of simulated devices: a fresh hub.
    cpu::quiet(opts.quiet_wait)?;
    let hub2 = Hub::start_with_mesh(&hub_bin, &scratch.path().join("hub2-home"), &mut procs)?;
    let hub2_pid = procs.pid(hub2.index).context("the second hub's pid")?;
    let (devs, devs_noise) = cpu::watched(&[hub2_pid], || {
        devices::run(
            &hub2,
            hub2_pid,
            opts.devices,
            Duration::from_secs(opts.hold),
        )
    })
    .with_context(|| format!("hub log tail:\n{}", hub2.log_tail()))?;
    procs.check_alive(hub2.index)?;
    procs.kill(hub2.index);
    let connected = devs.n - devs.failed;
    let mut text = format!(
        "devices: {} enrolled, {} connected ({} failed), {} listed online once connected, {} after the {} s hold; {} links ended during the hold",
        thousands(devs.n as f64),
        thousands(connected as f64),
        devs.failed,
        thousands(devs.online_connected as f64),
        thousands(devs.online_held as f64),
        devs.hold.as_secs(),
        devs.ended
    );
    if devs.failed > 0 || devs.online_held != devs.n || devs.ended > 0 {
        text.push_str("  <-- NOT ALL HELD");
        failures.push(format!(
            "of {} devices {} failed to connect, {} were online after the hold, {} links ended{}",
            devs.n,
            devs.failed,
            devs.online_held,
            devs.ended,
            devs.first_failure
                .as_deref()
                .map(|f| format!(" (first failure: {f})"))
                .unwrap_or_default()
        ));
    }
    checks.push(text);

    print_report(&Report {
        date: &date,
        scratch: &report::disk(scratch.path()),
        opts: &opts,
        nofile,
        floor: &floor,
        sizes: &sizes,
        burst: &burst,
        idle: &idle,
        agent_rss_after,
        agent_hwm,
        devices: &devs,
        devices_noise: devs_noise,
        checks: &checks,
    });
    drop(procs);
    drop(scratch);
    if !failures.is_empty() {
        bail!("the run is not valid: {}", failures.join("; "));
    }
    Ok(())
}

/// Raises this process's RLIMIT_NOFILE to at least `want` if the hard limit allows
/// (children inherit it); returns (soft before, soft after, hard).
fn raise_nofile(want: u64) -> anyhow::Result<(u64, u64, u64)> {
    let now = getrlimit(Resource::Nofile);
    let soft = now.current.unwrap_or(u64::MAX);
    let hard = now.maximum.unwrap_or(u64::MAX);
    if soft >= want {
        return Ok((soft, soft, hard));
    }
    ensure!(
        hard >= want,
        "the open-files limit is {soft} (hard {hard}); {want} are needed for the devices part: raise the hard limit (ulimit -Hn) or pass a smaller --devices"
    );
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(want),
            maximum: now.maximum,
        },
    )
    .context("raising RLIMIT_NOFILE")?;
    Ok((soft, want, hard))
}

/// Latencies of one series, in us.
struct Lat {
    n: usize,
    p50: f64,
    p99: f64,
    max: f64,
    noise: cpu::Noise,
}

impl Lat {
    fn of(v: &mut [f64], noise: cpu::Noise) -> Lat {
        v.sort_by(f64::total_cmp);
        Lat {
            n: v.len(),
            p50: percentile(v, 50.0),
            p99: percentile(v, 99.0),
            max: v.last().copied().unwrap_or(0.0),
            noise,
        }
    }
}

/// Nearest-rank percentile of sorted `v` (0 when empty).
fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

struct SizeRow {
    label: &'static str,
    bytes: usize,
    lat: Lat,
    /// CPU time per drop of the agent and of the hub, in us.
    cpu_us: [f64; 2],
}

struct BurstRow {
    n: usize,
    bytes: usize,
    run: spool::Burst,
    noise: cpu::Noise,
    agent_cpu: Duration,
    hub_cpu: Duration,
}

impl BurstRow {
    fn per_s(&self) -> f64 {
        self.n as f64 / self.run.drained.as_secs_f64().max(1e-9)
    }
}

fn run_burst(
    hub: &Hub,
    hub_pid: u32,
    agent: &Agent,
    m: &Monitor,
    opts: &Options,
    checks: &mut Vec<String>,
    failures: &mut Vec<String>,
) -> anyhow::Result<BurstRow> {
    let body = spool::body(m, SIZES[0])?;
    eprintln!("bench: burst of {} files", opts.burst);
    cpu::quiet(opts.quiet_wait)?;
    let ticks = |pid| cpu::own_ticks(pid).map(|t| t as f64 / cpu::TICKS_PER_S);
    let (a0, h0) = (ticks(agent.pid)?, ticks(hub_pid)?);
    let (run, noise) = cpu::watched(&[hub_pid, agent.pid], || {
        spool::burst(&agent.spool, "burst", &body, opts.burst, BURST_BOUND)
    })?;
    let (a1, h1) = (ticks(agent.pid)?, ticks(hub_pid)?);
    let want = opts.burst as u64;
    // Deleted means acknowledged; the count must already be there, and stay exact.
    let recorded = poll(Duration::from_secs(30), "the burst recorded", || {
        let r = hub.recorded(std::slice::from_ref(m))?;
        Ok((r >= want).then_some(r))
    })
    .or_else(|_| hub.recorded(std::slice::from_ref(m)))?;
    std::thread::sleep(Duration::from_millis(500));
    let recorded = recorded.max(hub.recorded(std::slice::from_ref(m))?);
    let left = spool::count_json(&agent.spool, "burst")?;
    let bad = count_dir(&agent.spool.join("bad"));
    let mut text = format!(
        "burst: {} files dropped, {} recorded by the hub, {left} left in the spool, {bad} parked in bad/",
        thousands(want as f64),
        thousands(recorded as f64)
    );
    if recorded != want || left > 0 || bad > 0 {
        text.push_str("  <-- LOST OR DOUBLED");
        failures.push(format!(
            "burst: {want} dropped, {recorded} recorded, {left} left, {bad} parked"
        ));
    }
    checks.push(text);
    Ok(BurstRow {
        n: opts.burst,
        bytes: body.len(),
        run,
        noise,
        agent_cpu: Duration::from_secs_f64(a1 - a0),
        hub_cpu: Duration::from_secs_f64(h1 - h0),
    })
}

fn count_dir(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.filter_map(Result::ok).count())
}

struct Idle {
    window: Duration,
    agent: idle::Figures,
    inotifywait: idle::Figures,
    noise: cpu::Noise,
}

impl Idle {
    /// Keepalive and rescan events the agent sees in the window: its own pings, the hub's
    /// pings, the hub's pongs to its pings, and the hub's rescans.
    fn expected_events(&self) -> (u64, u64) {
        let w = self.window.as_secs_f64();
        let pings = (w / PING.as_secs_f64()).round() as u64;
        let rescans = (w / SWEEP.as_secs_f64()).round() as u64;
        (3 * pings, rescans)
    }

    fn allowance(&self) -> u64 {
        let (keepalive, rescans) = self.expected_events();
        (keepalive + rescans) * SWITCHES_PER_EVENT
    }
}

struct Report<'a> {
    date: &'a str,
    scratch: &'a str,
    opts: &'a Options,
    nofile: (u64, u64, u64),
    floor: &'a Lat,
    sizes: &'a [SizeRow],
    burst: &'a BurstRow,
    idle: &'a Idle,
    agent_rss_after: u64,
    agent_hwm: u64,
    devices: &'a devices::Devices,
    devices_noise: cpu::Noise,
    checks: &'a [String],
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn print_report(r: &Report<'_>) {
    let mut noisy = false;
    let mut note = |n: cpu::Noise| {
        noisy |= n.others_cpus > NOISY_CPUS;
        format!("{:.2}", n.others_cpus)
    };
    println!();
    println!("cortex mesh bench, {}", r.date);
    println!("machine: {}", report::machine());
    println!("scratch: {}", r.scratch);
    println!(
        "tools:   {} (inotify-tools); release cortex-hub and cortex-device-agent; loopback only",
        crate::bench_kit::version(agent::INOTIFYWAIT, "--help")
    );
    let (before, after, hard) = r.nofile;
    println!(
        "limits:  RLIMIT_NOFILE {before} → {after} (hard {hard}) for the bench and what it starts"
    );
    println!(
        "hub:     defaults (ping {} s each way, rescan sweep {} s), redb store, ack only after the commit (fsync)",
        PING.as_secs(),
        SWEEP.as_secs()
    );
    let o = r.opts;
    println!(
        "runs:    {} drops per size, a burst of {}, {} s idle, {} simulated devices held {} s",
        thousands(o.drops as f64),
        thousands(o.burst as f64),
        o.idle,
        thousands(o.devices as f64),
        o.hold
    );
    println!();
    println!(
        "drop → accepted: write NAME.tmp, rename to NAME.json (timed from just before the rename) until the bench's inotify sees IN_DELETE; the agent deletes only after the hub's ack; one file in flight, {WARMUP} warm-up drops per size"
    );
    println!(
        "{:<22} {:>8} {:>6} {:>9} {:>9} {:>9} {:>10} {:>8} {:>7}",
        "body", "bytes", "n", "p50", "p99", "max", "agent CPU", "hub CPU", "others"
    );
    for s in r.sizes {
        println!(
            "{:<22} {:>8} {:>6} {:>9} {:>9} {:>9} {:>10} {:>8} {:>7}",
            s.label,
            thousands(s.bytes as f64),
            s.lat.n,
            us(s.lat.p50),
            us(s.lat.p99),
            us(s.lat.max),
            us(s.cpu_us[0]),
            us(s.cpu_us[1]),
            note(s.lat.noise)
        );
    }
    let f = r.floor;
    println!(
        "{:<22} {:>8} {:>6} {:>9} {:>9} {:>9} {:>10} {:>8} {:>7}",
        "floor: rename→MOVED_TO",
        "2",
        f.n,
        us(f.p50),
        us(f.p99),
        us(f.max),
        "-",
        "-",
        note(f.noise)
    );
    println!("agent CPU, hub CPU: what each used per drop over the measured drops (utime + stime)");
    println!(
        "floor: the bench's own inotify watch seeing its rename (no agent, no hub), the least any spool watcher can take"
    );
    println!();
    let b = r.burst;
    println!(
        "burst: {} files of {} B written by one thread (.tmp + rename) in {:.2} s ({}/s); all deleted (acknowledged) {:.2} s after the first: {} files/s (others {})",
        thousands(b.n as f64),
        b.bytes,
        b.run.dropped.as_secs_f64(),
        thousands(b.n as f64 / b.run.dropped.as_secs_f64().max(1e-9)),
        b.run.drained.as_secs_f64(),
        thousands(b.per_s()),
        note(b.noise)
    );
    println!(
        "  CPU over the burst: agent {:.2} s, hub {:.2} s; agent RSS after it {} (peak {}){}",
        b.agent_cpu.as_secs_f64(),
        b.hub_cpu.as_secs_f64(),
        mib(r.agent_rss_after),
        mib(r.agent_hwm),
        if b.run.polled {
            "; the bench's watch overflowed, deletions counted by polling every 5 ms"
        } else {
            ""
        }
    );
    println!();
    let i = r.idle;
    let (keepalive, rescans) = i.expected_events();
    println!(
        "idle, {} s, agent connected with nothing to send, inotifywait -m -e close_write,moved_to on the same spool (others {}):",
        i.window.as_secs(),
        note(i.noise)
    );
    println!(
        "{:<22} {:>9} {:>9} {:>12} {:>10} {:>10}",
        "process", "CPU", "wakeups", "wakeups/min", "RSS", "peak RSS"
    );
    let per_min = |n: u64| n as f64 * 60.0 / i.window.as_secs_f64();
    for (name, p) in [
        ("cortex-device-agent", &i.agent),
        ("inotifywait -m", &i.inotifywait),
    ] {
        println!(
            "{:<22} {:>9} {:>9} {:>12.1} {:>10} {:>10}",
            name,
            format!("{:.0} ms", p.cpu.as_secs_f64() * 1e3),
            p.wakeups,
            per_min(p.wakeups),
            mib(p.rss_kib),
            mib(p.hwm_kib)
        );
    }
    println!("  agent threads (context switches over the window):");
    for t in &i.agent.threads {
        let life = match (t.born, t.died) {
            (true, true) => " (started and ended in the window)",
            (true, false) => " (started in the window)",
            (false, true) => " (ended in the window)",
            (false, false) => "",
        };
        println!(
            "    {:<18} tid {:<8} {:>6}{life}",
            t.comm, t.tid, t.switches
        );
    }
    println!(
        "  the keepalive and the hub's rescans explain {} events in {} s ({keepalive} keepalive: own pings, the hub's pings, its pongs, every {} s; {rescans} rescans, every {} s); at {SWITCHES_PER_EVENT} switches an event, {} wakeups; the agent had {}",
        keepalive + rescans,
        i.window.as_secs(),
        PING.as_secs(),
        SWEEP.as_secs(),
        i.allowance(),
        i.agent.wakeups
    );
    println!();
    let d = r.devices;
    println!(
        "hub with {} simulated devices (one WebSocket each, hello/welcome, pings both ways every {} s; others {}):",
        thousands(d.n as f64),
        PING.as_secs(),
        note(r.devices_noise)
    );
    println!("  RSS fresh                         {}", mib(d.rss_fresh));
    println!(
        "  RSS after enrolling {} ({:.1} s, {}/s)  {}",
        thousands(d.n as f64),
        d.enrol.as_secs_f64(),
        thousands(d.n as f64 / d.enrol.as_secs_f64().max(1e-9)),
        mib(d.rss_enrolled)
    );
    println!(
        "  RSS with all connected ({:.1} s, {}/s)  {}",
        d.connect.as_secs_f64(),
        thousands(d.n as f64 / d.connect.as_secs_f64().max(1e-9)),
        mib(d.rss_connected)
    );
    println!(
        "  RSS after holding them {} s          {}",
        d.hold.as_secs(),
        mib(d.rss_held)
    );
    println!(
        "  per connection: {:.1} KB over the enrolled hub ((max of the last two − enrolled) / {}); {:.1} KB a device over the fresh hub",
        d.per_link_bytes() / 1e3,
        d.n,
        d.per_device_bytes() / 1e3
    );
    println!(
        "  the hub over the hold: {:.2} s CPU ({:.1}% of a core), {} wakeups ({:.0}/s)",
        d.hub_idle.cpu.as_secs_f64(),
        100.0 * d.hub_idle.cpu.as_secs_f64() / d.hold.as_secs_f64(),
        thousands(d.hub_idle.wakeups as f64),
        d.hub_idle.wakeups as f64 / d.hold.as_secs_f64()
    );
    println!();
    println!(
        "others: CPUs used by processes other than the hub, the agent, inotifywait and the bench during a part (0.00 = a quiet machine)"
    );
    if noisy {
        println!(
            "WARNING: other processes used more than {NOISY_CPUS} CPU during some parts; those figures are disturbed: rerun on a quiet machine"
        );
    }
    println!();
    println!("checks:");
    for c in r.checks {
        println!("  {c}");
    }
    println!();
    println!("targets:");
    let verdict = |ok: bool| if ok { "met   " } else { "MISSED" };
    for s in r.sizes {
        println!(
            "  [{}] {} drop → accepted p50 <= 1 ms: {}",
            verdict(s.lat.p50 <= TARGET_P50_US),
            s.label,
            us(s.lat.p50)
        );
        println!(
            "  [{}] {} drop → accepted p99 <= 5 ms: {}",
            verdict(s.lat.p99 <= TARGET_P99_US),
            s.label,
            us(s.lat.p99)
        );
    }
    let rss = i.agent.rss_kib as f64 * 1024.0;
    println!(
        "  [{}] idle agent RSS under 10 MB: {:.1} MB (inotifywait {:.1} MB)",
        verdict(rss < TARGET_AGENT_RSS_BYTES),
        rss / 1e6,
        i.inotifywait.rss_kib as f64 * 1024.0 / 1e6
    );
    println!(
        "  [{}] idle agent: no wakeups but the keepalive: {} in {} s, the keepalive and rescans explain up to {}",
        verdict(i.agent.wakeups <= i.allowance()),
        i.agent.wakeups,
        i.window.as_secs(),
        i.allowance()
    );
    println!(
        "  [{}] hub under 50 KB a connection with {} devices: {:.1} KB",
        verdict(d.per_link_bytes() < TARGET_LINK_BYTES),
        thousands(d.n as f64),
        d.per_link_bytes() / 1e3
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() -> anyhow::Result<()> {
        let o = parse_options(&["--idle", "5", "--devices", "100", "--no-build"])?;
        assert_eq!(
            (o.idle, o.devices, o.build, o.drops),
            (5, 100, false, 1_000)
        );
        assert!(parse_options(&["--idle"]).is_err());
        assert!(parse_options(&["--bogus"]).is_err());
        assert!(parse_options(&["--devices", "0"]).is_err());
        Ok(())
    }

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[], 99.0), 0.0);
    }
}
