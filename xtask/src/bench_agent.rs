//! `cargo xtask bench agent`: the hub's runner (its model loop) against a zero-latency
//! scripted OpenAI-compatible server in this process, so every figure is the hub's own
//! cost. A release hub on loopback: the time a tool step costs between the model's answer
//! and the next request; a signal's 202 to the woken turn's request; then, on a second
//! hub, thousands of idle sessions with an armed waitpoint each (memory, idle CPU) woken
//! in one burst (time, wakes per second, and the most model requests at once, which must
//! stay within `agent.concurrency`). Method and figures: docs/benchmarks.md, "The runner".

pub(crate) mod fleet;
mod latency;

use std::time::Duration;

use anyhow::{Context, ensure};
use cortex_tests::scripted_model::{Reply, ScriptedModel};

use crate::bench_kit::hub::Hub;
use crate::bench_kit::procs::{Procs, ScratchDir};
use crate::bench_kit::report::{self, thousands};
use crate::bench_kit::{cargo_build, cpu, target_dir, workspace_root};
use crate::bench_waits::idle::Figures;

/// The targets.
const TARGET_STEP_P50_US: f64 = 1_000.0;
const TARGET_WAKE_P50_US: f64 = 2_000.0;
const TARGET_RSS_MIB: f64 = 50.0;
/// "No CPU while idle": less run time over the window than one clock tick (10 ms). The
/// tick count itself is sampled (a tick is charged to whoever runs when it fires), so a
/// process that ran 0.5 ms may be charged one tick or none; the scheduler's run time is
/// exact.
const IDLE_RUN_MS: f64 = 10.0;
/// `agent.concurrency` when settings.json does not set it, as this bench runs the hub.
const CONCURRENCY: usize = 8;
/// Unmeasured runs before the measured ones, for each latency part.
const WARMUP: usize = 5;

/// `cargo xtask bench agent` flags.
#[derive(clap::Parser)]
#[command(name = "cargo xtask bench agent", disable_help_flag = true)]
struct Options {
    /// Idle sessions, each with an armed waitpoint, then woken in one burst.
    #[arg(long, default_value_t = 10_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    sessions: usize,
    /// Tool steps (`wait_check`) in each measured run before the model answers.
    #[arg(long, default_value_t = 5, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=50))]
    steps: usize,
    /// Measured runs of each latency part (step cost, signal to woken turn).
    #[arg(long, default_value_t = 200, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(10..))]
    runs: usize,
    /// Seconds the idle sessions are watched.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    idle: u64,
    /// The model's fixed delay before each answer in the burst, in ms (so the concurrency
    /// bound is what limits the rate).
    #[arg(long, default_value_t = 5)]
    delay_ms: u64,
    /// Client threads that create the sessions and send the burst's signals.
    #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    threads: usize,
    /// How long to wait for an idle machine before each part (0: don't).
    #[arg(long, default_value_t = 60)]
    quiet_wait: u64,
    /// Build the hub first (`--no-build`: use target/release/cortex-hub).
    #[arg(long = "no-build", action = clap::ArgAction::SetFalse)]
    build: bool,
}

/// p50, p90, p99 and max of a sample (nearest rank), in its unit.
#[derive(Debug, Clone, Copy)]
struct Dist {
    n: usize,
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

impl Dist {
    fn of(v: &mut [f64]) -> Dist {
        v.sort_by(f64::total_cmp);
        let at = |q: f64| {
            if v.is_empty() {
                return 0.0;
            }
            let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
            v[rank - 1]
        };
        Dist {
            n: v.len(),
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: v.last().copied().unwrap_or(0.0),
        }
    }
}

pub fn run(args: &[&str]) -> anyhow::Result<()> {
    let opts: Options = crate::bench_kit::parse_flags(args)?;
    let root = workspace_root();
    if opts.build {
        cargo_build(&root, &["cortex-hub"]).context("building the hub")?;
    }
    let hub_bin = target_dir(&root).join("release").join("cortex-hub");
    ensure!(
        hub_bin.is_file(),
        "{} is missing; run without --no-build",
        hub_bin.display()
    );
    let scratch = ScratchDir::new("agent")?;
    let mut procs = Procs::default();
    let date = report::utc_now();
    let load = loadavg();

    // Parts 1 and 2: one hub, one model; fresh sessions for every run.
    let model = ScriptedModel::start_with_default(Vec::new(), Reply::text("noted"));
    let hub = start_hub(&hub_bin, &scratch.path().join("hub-a"), &model, &mut procs)?;
    let hub_pid = procs.pid(hub.index).context("the hub's pid")?;
    let with_log = |e: anyhow::Error| e.context(format!("hub log tail:\n{}", hub.log_tail()));

    eprintln!(
        "bench: step cost, {WARMUP} warm-up + {} runs of {} wait_check steps",
        opts.runs, opts.steps
    );
    latency::set_step_model(&model, opts.steps);
    cpu::quiet(opts.quiet_wait)?;
    latency::step_costs(&hub, &model, opts.steps, WARMUP).map_err(with_log)?;
    let (mut steps, steps_noise) = cpu::watched(&[hub_pid], || {
        latency::step_costs(&hub, &model, opts.steps, opts.runs)
    })
    .map_err(with_log)?;

    eprintln!(
        "bench: signal 202 → woken turn's request, {WARMUP} warm-up + {} runs",
        opts.runs
    );
    model.set_default(Reply::text("noted"));
    cpu::quiet(opts.quiet_wait)?;
    latency::wake_latencies(&hub, &model, WARMUP).map_err(with_log)?;
    let (wakes, wake_noise) = cpu::watched(&[hub_pid], || {
        latency::wake_latencies(&hub, &model, opts.runs)
    })
    .map_err(with_log)?;
    procs.check_alive(hub.index)?;
    procs.kill(hub.index);
    drop(model);

    // Parts 3 and 4: a fresh hub, so its memory before is a new hub's.
    let model = ScriptedModel::start_with_default(
        Vec::new(),
        Reply::text("noted").head_delay(Duration::from_millis(opts.delay_ms)),
    );
    let hub = start_hub(&hub_bin, &scratch.path().join("hub-b"), &model, &mut procs)?;
    let hub_pid = procs.pid(hub.index).context("the hub's pid")?;
    let with_log = |e: anyhow::Error| e.context(format!("hub log tail:\n{}", hub.log_tail()));
    std::thread::sleep(Duration::from_secs(1));
    let rss_before = fleet::rss_kib(hub_pid)?;
    eprintln!(
        "bench: creating {} sessions with a waitpoint each ({} threads)",
        thousands(opts.sessions as f64),
        opts.threads
    );
    let (armed, create_noise) = cpu::watched(&[hub_pid], || {
        fleet::create(&hub, opts.sessions, opts.threads)
    })
    .map_err(with_log)?;
    // The creations' last checkpoint and allocations settle before memory is read.
    std::thread::sleep(Duration::from_secs(3));
    eprintln!(
        "bench: {} idle sessions, {} s",
        armed.sessions.len(),
        opts.idle
    );
    cpu::quiet(opts.quiet_wait)?;
    let (idle, idle_noise) = cpu::watched(&[hub_pid], || {
        crate::bench_waits::idle::observe(hub_pid, Duration::from_secs(opts.idle))
    })?;

    eprintln!(
        "bench: waking all {} at once ({} threads, model delay {} ms)",
        armed.sessions.len(),
        opts.threads,
        opts.delay_ms
    );
    cpu::quiet(opts.quiet_wait)?;
    let (burst, burst_noise) = cpu::watched(&[hub_pid], || {
        fleet::burst(&hub, &model, &armed, opts.threads)
    })
    .map_err(with_log)?;
    procs.check_alive(hub.index)?;

    let report = Report {
        date,
        machine: report::machine(),
        load,
        opts_steps: opts.steps,
        step: Dist::of(&mut steps),
        step_noise: steps_noise.others_cpus,
        wake_after_202: Dist::of(&mut wakes.iter().map(|w| w.after_202_us).collect::<Vec<_>>()),
        wake_after_post: Dist::of(&mut wakes.iter().map(|w| w.after_post_us).collect::<Vec<_>>()),
        wake_noise: wake_noise.others_cpus,
        sessions: armed.sessions.len(),
        created_in: armed.took,
        create_noise: create_noise.others_cpus,
        rss_before_kib: rss_before,
        idle,
        idle_noise: idle_noise.others_cpus,
        burst,
        burst_noise: burst_noise.others_cpus,
        delay_ms: opts.delay_ms,
        threads: opts.threads,
    };
    print!("{}", report.render());
    drop(procs);
    ensure!(
        report.burst.max_in_flight <= CONCURRENCY,
        "the runner had {} model requests in flight at once, past its bound of {CONCURRENCY}",
        report.burst.max_in_flight
    );
    Ok(())
}

/// A release hub whose runner calls `model`.
fn start_hub(
    bin: &std::path::Path,
    home: &std::path::Path,
    model: &ScriptedModel,
    procs: &mut Procs,
) -> anyhow::Result<Hub> {
    let url = model.url();
    Hub::start_with_env(
        bin,
        home,
        &[
            ("CORTEX_LLM_BASE_URL", url.as_str()),
            ("CORTEX_LLM_MODEL", "scripted"),
        ],
        procs,
    )
}

/// The 1-minute load average, as `uptime` shows it.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

struct Report {
    date: String,
    machine: String,
    load: String,
    opts_steps: usize,
    step: Dist,
    step_noise: f64,
    wake_after_202: Dist,
    wake_after_post: Dist,
    wake_noise: f64,
    sessions: usize,
    created_in: Duration,
    create_noise: f64,
    rss_before_kib: u64,
    idle: Figures,
    idle_noise: f64,
    burst: fleet::Burst,
    burst_noise: f64,
    delay_ms: u64,
    threads: usize,
}

impl Report {
    fn render(&self) -> String {
        let mut s = String::new();
        let mut line = |l: String| {
            s.push_str(&l);
            s.push('\n');
        };
        let met = |ok: bool| if ok { "met" } else { "NOT met" };
        line(format!(
            "cortex bench agent, {} — {} (load average {} at the start; shared machine: other work may run beside it)",
            self.date, self.machine, self.load
        ));
        line(String::new());
        line(format!(
            "the runner's own cost, zero-latency scripted model (concurrency {CONCURRENCY}, the default):"
        ));
        line(format!(
            "  {:<58} {:>6} {:>9} {:>9} {:>9} {:>9} {:>7}",
            "", "n", "p50", "p90", "p99", "max", "others"
        ));
        for (what, d, noise) in [
            (
                format!(
                    "a tool step: answer n written → request n+1 ({} steps/run)",
                    self.opts_steps
                ),
                self.step,
                self.step_noise,
            ),
            (
                "a wake: the signal's 202 → the woken turn's request".to_string(),
                self.wake_after_202,
                self.wake_noise,
            ),
            (
                "a wake: the signal POSTed → the woken turn's request".to_string(),
                self.wake_after_post,
                self.wake_noise,
            ),
        ] {
            line(format!(
                "  {what:<58} {:>6} {:>9} {:>9} {:>9} {:>9} {:>7.2}",
                d.n,
                report::us(d.p50),
                report::us(d.p90),
                report::us(d.p99),
                report::us(d.max),
                noise
            ));
        }
        line("  (others: CPUs used by other processes meanwhile; a 202 → request below zero means the model had the request before the client had the 202)".into());
        line(format!(
            "  target step p50 < {}: {}; target wake (202 → request) p50 < {}: {}",
            report::us(TARGET_STEP_P50_US),
            met(self.step.p50 < TARGET_STEP_P50_US),
            report::us(TARGET_WAKE_P50_US),
            met(self.wake_after_202.p50 < TARGET_WAKE_P50_US)
        ));
        line(String::new());
        let after_mib = self.idle.rss_kib as f64 / 1024.0;
        let before_mib = self.rss_before_kib as f64 / 1024.0;
        let per_session = (self.idle.rss_kib as f64 - self.rss_before_kib as f64) * 1024.0
            / self.sessions.max(1) as f64;
        line(format!(
            "{} idle sessions, each with an armed waitpoint (created through the API in {:.1} s, {} threads; others {:.2} CPUs):",
            thousands(self.sessions as f64),
            self.created_in.as_secs_f64(),
            self.threads,
            self.create_noise
        ));
        line(format!(
            "  hub RSS: {before_mib:.1} MiB new, {after_mib:.1} MiB with them: {:+.1} MiB, {} bytes a session",
            after_mib - before_mib,
            thousands(per_session)
        ));
        line(format!(
            "  idle {} s: {} ticks (10 ms each), {:.2} ms on CPU, {:.1} wakeups/min, {} threads, {} fds (others {:.2} CPUs)",
            self.idle.window.as_secs(),
            self.idle.ticks,
            self.idle.cpu_ms(),
            self.idle.wakeups_per_min(),
            self.idle.threads,
            self.idle.fds,
            self.idle_noise
        ));
        line(format!(
            "  target RSS < {TARGET_RSS_MIB:.0} MiB in all: {}; target no CPU while idle (under one tick, {IDLE_RUN_MS:.0} ms, of run time): {}",
            met(after_mib < TARGET_RSS_MIB),
            met(self.idle.cpu_ms() < IDLE_RUN_MS)
        ));
        line(String::new());
        let b = &self.burst;
        line(format!(
            "all {} woken in one burst ({} signal threads; the model answers each woken turn with text after {} ms; others {:.2} CPUs):",
            thousands(self.sessions as f64),
            self.threads,
            self.delay_ms,
            self.burst_noise
        ));
        line(format!(
            "  signals accepted (202) in {:.2} s: {} signals/s",
            b.signalled_in.as_secs_f64(),
            thousands(self.sessions as f64 / b.signalled_in.as_secs_f64().max(1e-9))
        ));
        line(format!(
            "  every woken turn answered in {:.2} s from the first signal: {} wakes/s; every session's run ended (checked after)",
            b.answered_in.as_secs_f64(),
            thousands(self.sessions as f64 / b.answered_in.as_secs_f64().max(1e-9))
        ));
        line(format!(
            "  model requests in flight at once: at most {} (bound: agent.concurrency {CONCURRENCY}, the default): {}",
            b.max_in_flight,
            if b.max_in_flight <= CONCURRENCY {
                "within"
            } else {
                "EXCEEDED"
            }
        ));
        s
    }
}
