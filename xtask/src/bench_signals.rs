//! `cargo xtask bench signals`: the durable signal route (`POST /webhook/signal`, 202 only
//! once the signal is committed to disk) against adnanh/webhook 2.8 checking a secret and
//! either storing nothing or running `/bin/true`, under wrk at 1 and 50 connections; the
//! raw fdatasync rate of the same disk; one `cortex-signal` against one `curl` (hyperfine).
//! It checks that the hub recorded every signal it acknowledged, prints one report, and
//! leaves nothing running. Method and figures: docs/benchmarks.md.

mod servers;
pub(crate) mod tools;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail, ensure};

use crate::bench_kit::hub::{Hub, signal_body};
use crate::bench_kit::procs::{Procs, ScratchDir};
use crate::bench_kit::report::{ms, thousands, us, utc_now};
use crate::bench_kit::{cargo_build, cpu, target_dir, workspace_root};
use servers::Webhook;
use tools::{Load, Timing, WrkRun};

/// The targets for this 2-core machine.
const TARGET_C1_P50_US: f64 = 250.0;
const TARGET_C1_P99_US: f64 = 1_500.0;
const TARGET_C50_RPS: f64 = 30_000.0;
const TARGET_C50_P99_US: f64 = 10_000.0;
/// One connection's p99 at most this many times the same run's fdatasync p99, both
/// counted as wrk counts a closed loop (see [`tools::wrk_corrected_percentile`]).
const TARGET_C1_P99_SYNC_X: f64 = 4.0;
/// 50 connections' throughput at least this share of webhook's (no store) in the same
/// run: the lower end of what the store reached before its checkpoints left the ack
/// path (0.88-0.98x).
const TARGET_C50_RPS_WEBHOOK_X: f64 = 0.88;

/// wrk's threads and connections: one connection, and 50 over `--threads` threads.
const C1: (u32, u32) = (1, 1);
const C50_CONNS: u32 = 50;
const HYPERFINE_WARMUP: u32 = 20;
/// How long webhook may keep running its `/bin/true` backlog before the bench moves on.
const IDLE_BOUND: Duration = Duration::from_secs(60);
/// Above this many CPUs used by others during a run, the report warns.
const NOISY_CPUS: f64 = cpu::QUIET_CPUS;

/// `cargo xtask bench signals` flags.
#[derive(clap::Parser)]
#[command(name = "cargo xtask bench signals", disable_help_flag = true)]
struct Options {
    /// Seconds per measured run.
    #[arg(long = "duration", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    seconds: u64,
    /// Seconds of warm-up before each run.
    #[arg(long = "warmup", default_value_t = 1)]
    warmup_seconds: u64,
    /// hyperfine runs of one `cortex-signal` and one `curl`.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(2..))]
    runs: u32,
    /// Monitors the load is spread over.
    #[arg(long, default_value_t = 200, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    monitors: usize,
    /// wrk threads for the 50-connection runs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(C50_CONNS)))]
    threads: u32,
    /// How long to wait for an idle machine before each measured run (0: don't).
    #[arg(long, default_value_t = 60)]
    quiet_wait: u64,
    /// Build the binaries first (`--no-build`: use those in target/release).
    #[arg(long = "no-build", action = clap::ArgAction::SetFalse)]
    build: bool,
}

impl Options {
    fn c50(&self) -> (u32, u32) {
        (self.threads, C50_CONNS)
    }
}

fn parse_options(args: &[&str]) -> anyhow::Result<Options> {
    crate::bench_kit::parse_flags(args)
}

pub fn run(args: &[&str]) -> anyhow::Result<()> {
    let opts = parse_options(args)?;
    let missing: Vec<&str> = tools::TOOLS
        .into_iter()
        .filter(|t| !tools::on_path(t))
        .collect();
    if !missing.is_empty() {
        let curl = if missing.contains(&"curl") {
            " curl"
        } else {
            ""
        };
        bail!(
            "missing on PATH: {}; install them with:\n    {}{curl}",
            missing.join(", "),
            tools::INSTALL
        );
    }

    let root = workspace_root();
    let release = target_dir(&root).join("release");
    if opts.build {
        cargo_build(&root, &["cortex-hub"]).context("building cortex-hub")?;
    }
    let hub_bin = release.join("cortex-hub");
    ensure!(
        hub_bin.is_file(),
        "{} is missing; run without --no-build",
        hub_bin.display()
    );
    // cortex-signal may be mid-change; its row says so instead of failing the bench.
    let cli_bin = release.join("cortex-signal");
    let cli = match opts.build.then(|| cargo_build(&root, &["cortex-cli"])) {
        Some(Err(e)) => Err(format!("not measured: building cortex-cli failed ({e:#})")),
        _ if !cli_bin.is_file() => Err(format!("not measured: {} is missing", cli_bin.display())),
        _ => Ok(cli_bin),
    };

    let scratch = ScratchDir::new("signals")?;
    let mut procs = Procs::default();
    let facts = machine_facts(scratch.path());
    // As long as a measured run: a rare stall of the disk then has the same chance to
    // land in both.
    let sync_for = Duration::from_secs(opts.seconds);
    eprintln!("bench: fdatasync loop ({} s)", opts.seconds);
    wait_quiet(&opts)?;
    let (sync, sync_noise) = watched(None, || tools::fdatasync_loop(scratch.path(), sync_for))?;

    let hub_home = scratch.path().join("hub-home");
    let hub_timing = scratch.path().join("hub-timing.jsonl");
    let hub = Hub::start_timed(&hub_bin, &hub_home, &hub_timing, &mut procs)?;
    let monitors = hub.create_monitors(opts.monitors)?;
    let hub_script = scratch.path().join("hub.lua");
    let bodies: Vec<String> = monitors
        .iter()
        .map(|m| signal_body(&m.id, &m.secret))
        .collect();
    write(&hub_script, &tools::wrk_script("/webhook/signal", &bodies)?)?;

    let wh = Webhook::start(scratch.path(), &mut procs)?;
    let wh_bodies: Vec<String> = monitors
        .iter()
        .map(|m| signal_body(&m.id, &wh.secret))
        .collect();
    let mut wh_scripts = Vec::new();
    for hook in ["check", "true"] {
        let path = scratch.path().join(format!("webhook-{hook}.lua"));
        write(
            &path,
            &tools::wrk_script(&format!("/hooks/{hook}"), &wh_bodies)?,
        )?;
        wh_scripts.push(path);
    }

    let load = |(threads, connections): (u32, u32)| Load {
        threads,
        connections,
        seconds: opts.seconds,
    };
    let mut rows = Vec::new();
    let mut checks = Vec::new();
    let mut failures = Vec::new();
    let hub_pid = procs.pid(hub.index).context("the hub's pid")?;
    for conns in [C1, opts.c50()] {
        let l = load(conns);
        let label = "cortex durable signal";
        eprintln!("bench: {label}, {}, {} s", conn_s(l.connections), l.seconds);
        let (row, check) = (|| {
            let mut before = 0;
            let mut checkpoints_before = 0;
            let (run, noise) =
                measured_wrk(&hub_script, &hub.signal_url(), l, &opts, hub_pid, || {
                    settle();
                    before = hub.recorded(&monitors)?;
                    checkpoints_before = checkpoints(&hub_timing);
                    Ok(())
                })?;
            // Counted before the settle, whose idle time lets the next checkpoint start.
            let landed = checkpoints(&hub_timing).saturating_sub(checkpoints_before);
            procs.check_alive(hub.index)?;
            settle();
            let recorded = hub.recorded(&monitors)? - before;
            let mut check = count_check(label, l, &run, recorded);
            check.text.push_str(&format!(
                "; {landed} checkpoint(s) into redb landed during the run"
            ));
            anyhow::Ok((
                Row {
                    label,
                    conns: l.connections,
                    run,
                    noise,
                },
                check,
            ))
        })()
        .with_context(|| format!("hub log tail:\n{}", hub.log_tail()))?;
        failures.extend(check.failure);
        checks.push(check.text);
        rows.push(row);
    }
    let wh_pid = procs.pid(wh.index).context("webhook's pid")?;
    for (hook, script, label) in [
        ("check", &wh_scripts[0], "webhook: check secret"),
        ("true", &wh_scripts[1], "webhook: run /bin/true"),
    ] {
        let ticks_before = cpu::children_ticks(wh_pid)?;
        for conns in [C1, opts.c50()] {
            let l = load(conns);
            eprintln!("bench: {label}, {}, {} s", conn_s(l.connections), l.seconds);
            let (run, noise) = measured_wrk(script, &wh.url(hook), l, &opts, wh_pid, || {
                cpu::wait_idle(wh_pid, IDLE_BOUND).map(drop)
            })?;
            procs.check_alive(wh.index)?;
            let drained = cpu::wait_idle(wh_pid, IDLE_BOUND)?;
            let mut text = format!(
                "{label}, {}: {} answered 2xx, {} not, {} socket errors",
                conn_s(l.connections),
                thousands(run.ok() as f64),
                run.non_2xx,
                run.socket_errors()
            );
            if drained >= Duration::from_millis(100) {
                text.push_str(&format!(
                    "; webhook was still running commands {:.1} s after wrk stopped",
                    drained.as_secs_f64()
                ));
            }
            if run.non_2xx > 0 || run.socket_errors() > 0 {
                text.push_str("  <-- NOT CLEAN");
                failures.push(format!("{label} at {} had errors", conn_s(l.connections)));
            }
            checks.push(text);
            rows.push(Row {
                label,
                conns: l.connections,
                run,
                noise,
            });
        }
        let ran = cpu::children_ticks(wh_pid)? - ticks_before;
        let mut text = format!("{label}: webhook's children used {ran} CPU ticks over both runs");
        if hook == "true" {
            if ran == 0 {
                text.push_str("  <-- /bin/true NEVER RAN");
                failures.push("webhook never ran /bin/true".into());
            } else {
                text.push_str(" (so /bin/true really ran)");
            }
        }
        checks.push(text);
    }

    eprintln!(
        "bench: hyperfine, {HYPERFINE_WARMUP} warm-up + {} runs per command",
        opts.runs
    );
    let one_post = one_post(&hub, hub_pid, &cli, &opts, scratch.path())?;
    if let Some(f) = &one_post.failure {
        failures.push(f.clone());
    }
    checks.push(one_post.check.clone());
    procs.check_alive(hub.index)?;

    print_report(&Report {
        facts: &facts,
        opts: &opts,
        rows: &rows,
        checks: &checks,
        sync: &sync,
        sync_noise,
        one_post: &one_post,
    });
    drop(procs);
    drop(scratch);
    if !failures.is_empty() {
        bail!("the run is not valid: {}", failures.join("; "));
    }
    Ok(())
}

struct Row {
    label: &'static str,
    conns: u32,
    run: WrkRun,
    noise: cpu::Noise,
}

pub(crate) struct Check {
    pub text: String,
    pub failure: Option<String>,
}

/// A warm-up at the same load (unmeasured), `quiesce`, then the measured run, with the CPU
/// that processes other than the server and wrk used meanwhile.
fn measured_wrk(
    script: &Path,
    url: &str,
    l: Load,
    opts: &Options,
    server_pid: u32,
    mut quiesce: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<(WrkRun, cpu::Noise)> {
    wait_quiet(opts)?;
    if opts.warmup_seconds > 0 {
        let warm = Load {
            seconds: opts.warmup_seconds,
            ..l
        };
        tools::wrk(script, url, warm)?;
    }
    quiesce()?;
    watched(Some(server_pid), || tools::wrk(script, url, l))
}

/// Waits, at most --quiet-wait seconds, until nothing else uses the CPUs.
fn wait_quiet(opts: &Options) -> anyhow::Result<()> {
    cpu::quiet(opts.quiet_wait)
}

/// Runs `f` and measures what processes other than `server_pid`, the bench and its
/// children used meanwhile.
fn watched<T>(
    server_pid: Option<u32>,
    f: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, cpu::Noise)> {
    cpu::watched(server_pid.as_slice(), f)
}

/// Compares what wrk saw acknowledged with what the hub recorded.
/// How many checkpoints the hub's timing records say landed so far.
fn checkpoints(timing: &std::path::Path) -> usize {
    std::fs::read_to_string(timing)
        .unwrap_or_default()
        .lines()
        .filter_map(crate::bench_kit::timing_record)
        .filter(|(event, _, _)| event == "checkpoint")
        .count()
}

pub(crate) fn count_check(label: &str, l: Load, r: &WrkRun, recorded: u64) -> Check {
    // wrk counts only answers it read before it stopped; the requests still in flight
    // then (at most one per connection, plus any it gave up on) may be recorded too.
    let in_flight_max = u64::from(l.connections) + r.timeouts + r.read_errors + r.write_errors;
    let ok = r.ok();
    let mut text = format!(
        "{label}, {}: {} answered 202, {} recorded by the hub",
        conn_s(l.connections),
        thousands(ok as f64),
        thousands(recorded as f64)
    );
    if recorded >= ok {
        text.push_str(&format!(" ({} in flight when wrk stopped)", recorded - ok));
    }
    text.push_str(&format!(
        "; {} not 2xx, {} socket errors",
        r.non_2xx,
        r.socket_errors()
    ));
    let failure = if recorded < ok {
        Some(format!(
            "the hub acknowledged {ok} signals but recorded {recorded}: {} LOST",
            ok - recorded
        ))
    } else if recorded > ok + in_flight_max {
        Some(format!(
            "the hub recorded {recorded} signals, more than the {ok} acknowledged plus {in_flight_max} in flight"
        ))
    } else if r.non_2xx > 0 || r.socket_errors() > 0 {
        Some(format!(
            "{label} at {} had {} non-2xx answers and {} socket errors",
            conn_s(l.connections),
            r.non_2xx,
            r.socket_errors()
        ))
    } else {
        None
    };
    if let Some(f) = &failure {
        text.push_str(&format!("  <-- {f}"));
    }
    Check { text, failure }
}

/// Lets what was in flight when wrk stopped reach the store before counting.
pub(crate) fn settle() {
    std::thread::sleep(Duration::from_millis(500));
}

/// One POST as a process: `cortex-signal` and `curl` under hyperfine.
struct OnePost {
    cli: Result<Timing, String>,
    curl: Timing,
    noise: cpu::Noise,
    check: String,
    failure: Option<String>,
}

fn one_post(
    hub: &Hub,
    hub_pid: u32,
    cli: &Result<PathBuf, String>,
    opts: &Options,
    scratch: &Path,
) -> anyhow::Result<OnePost> {
    let m = hub
        .create_monitors(1)?
        .pop()
        .context("no monitor for hyperfine")?;
    let url = hub.signal_url();
    let body = signal_body(&m.id, &m.secret);
    let mut commands = Vec::new();
    if let Ok(bin) = cli {
        commands.push((
            "cortex-signal".to_string(),
            format!(
                "{} --id {} --secret {} --status progress --message bench --url {url}",
                bin.display(),
                m.id,
                m.secret
            ),
        ));
    }
    commands.push((
        "curl".to_string(),
        format!("curl -sS -XPOST {url} -H 'content-type: application/json' -d '{body}'"),
    ));
    // cortex-signal falls back to a spool when the hub fails; give it its own, and check
    // that nothing landed there.
    let client_home = scratch.join("client-home");
    std::fs::create_dir_all(&client_home)
        .with_context(|| format!("creating {}", client_home.display()))?;
    wait_quiet(opts)?;
    let (timings, noise) = watched(Some(hub_pid), || {
        tools::hyperfine(
            &commands,
            HYPERFINE_WARMUP,
            opts.runs,
            &[("CORTEX_HOME", &client_home)],
            &scratch.join("hyperfine.json"),
        )
    })?;
    let expected = u64::from(HYPERFINE_WARMUP + opts.runs) * commands.len() as u64;
    let recorded = hub.recorded(std::slice::from_ref(&m))?;
    let spooled = count_files(&client_home.join("tmp").join("signals"));
    let mut check = format!(
        "one POST as a process: {expected} POSTs run, {recorded} recorded by the hub, {spooled} spooled"
    );
    let failure = (recorded != expected || spooled > 0).then(|| {
        check.push_str("  <-- MISMATCH");
        format!("hyperfine's POSTs: {expected} run, {recorded} recorded, {spooled} spooled")
    });
    let mut t = timings.into_iter();
    let cli_timing = match cli {
        Ok(_) => Ok(t.next().context("no cortex-signal timing")?),
        Err(why) => Err(why.clone()),
    };
    Ok(OnePost {
        cli: cli_timing,
        curl: t.next().context("no curl timing")?,
        noise,
        check,
        failure,
    })
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().is_file())
                .count()
        })
        .unwrap_or(0)
}

struct Report<'a> {
    facts: &'a Facts,
    opts: &'a Options,
    rows: &'a [Row],
    checks: &'a [String],
    sync: &'a tools::SyncRun,
    sync_noise: cpu::Noise,
    one_post: &'a OnePost,
}

fn print_report(r: &Report<'_>) {
    let f = r.facts;
    println!();
    println!("cortex signal bench, {}", f.date);
    println!("machine: {}", f.machine);
    println!("scratch: {}", f.disk);
    println!("tools:   {}", f.tools);
    println!(
        "load:    wrk --latency, {} s per run after a {} s warm-up; 1 conn = -t{} -c{}, 50 conns = -t{} -c{}; wrk shares the CPUs with the server, loopback only",
        r.opts.seconds,
        r.opts.warmup_seconds,
        C1.0,
        C1.1,
        r.opts.c50().0,
        r.opts.c50().1
    );
    println!(
        "cortex:  {} monitors, status progress, each a new signal; 202 only after its journal record is synced (group commit: one fdatasync a batch; redb commits behind)",
        r.opts.monitors
    );
    println!();
    println!(
        "{:<24} {:>5} {:>9} {:>9} {:>9} {:>9} {:>13} {:>11} {:>7}",
        "server", "conns", "req/s", "p50", "p99", "max", "req/s÷cortex", "p99÷cortex", "others"
    );
    for row in r.rows {
        let base = r
            .rows
            .iter()
            .find(|b| b.label == "cortex durable signal" && b.conns == row.conns);
        let (rps_ratio, p99_ratio) = match base {
            Some(b) => (
                format!("{:.2}x", row.run.rps() / b.run.rps()),
                format!("{:.2}x", row.run.p99_us / b.run.p99_us),
            ),
            None => ("-".into(), "-".into()),
        };
        println!(
            "{:<24} {:>5} {:>9} {:>9} {:>9} {:>9} {:>13} {:>11} {:>7.2}",
            row.label,
            row.conns,
            thousands(row.run.rps()),
            us(row.run.p50_us),
            us(row.run.p99_us),
            us(row.run.max_us),
            rps_ratio,
            p99_ratio,
            row.noise.others_cpus
        );
    }
    println!(
        "req/s÷cortex above 1: more requests/s than cortex; p99÷cortex above 1: a slower p99 than cortex (same connection count)"
    );
    println!(
        "others: CPUs used by processes other than the server and wrk during the run (0.00 = a quiet machine)"
    );
    println!(
        "p50/p99: as wrk reports them, corrected for coordinated omission (a stall of N times a connection's mean interval adds about N samples)"
    );
    let noisy = r.rows.iter().any(|row| row.noise.others_cpus > NOISY_CPUS);
    let steal = r
        .rows
        .iter()
        .map(|row| row.noise.steal_cpus)
        .fold(0.0, f64::max);
    if noisy {
        println!(
            "WARNING: other processes used more than {NOISY_CPUS} CPU during some runs; those figures are low: rerun on a quiet machine"
        );
    }
    if steal > NOISY_CPUS {
        println!("WARNING: the hypervisor stole up to {steal:.2} CPU from this VM during a run");
    }
    println!();
    println!(
        "fdatasync, same disk, one thread, 100 B append + fdatasync for {} s: {} ops, {}/s, p50 {}, p99 {}, max {}; p99 as wrk counts (coordinated omission corrected) {} (others {:.2} CPU)",
        r.opts.seconds,
        thousands(r.sync.ops as f64),
        thousands(r.sync.per_s),
        us(r.sync.p50.as_secs_f64() * 1e6),
        us(r.sync.p99.as_secs_f64() * 1e6),
        ms(r.sync.max.as_secs_f64()),
        us(r.sync.p99_as_wrk.as_secs_f64() * 1e6),
        r.sync_noise.others_cpus
    );
    if r.sync.p50 < Duration::from_micros(500) {
        println!(
            "  note: a flush this cheap looks absorbed by the VM's host (a disk that really empties its write cache takes ~1-10 ms); \"durable\" here means the guest's fdatasync returned"
        );
    }
    println!();
    let p = r.one_post;
    println!(
        "one POST as a process (hyperfine -N, {HYPERFINE_WARMUP} warm-up + {} runs; others {:.2} CPU):",
        r.opts.runs, p.noise.others_cpus
    );
    let line = |name: &str, t: &Timing| {
        println!(
            "  {name:<14} mean {} ± {}   median {}   min {}",
            ms(t.mean),
            ms(t.stddev),
            ms(t.median),
            ms(t.min)
        );
    };
    match &p.cli {
        Ok(t) => line("cortex-signal", t),
        Err(why) => println!("  {:<14} {why}", "cortex-signal"),
    }
    line("curl", &p.curl);
    if let Ok(t) = &p.cli {
        println!(
            "  curl ÷ cortex-signal: {:.2}x (mean), {:.2}x (min)",
            p.curl.mean / t.mean,
            p.curl.min / t.min
        );
    }
    println!();
    println!("checks:");
    for c in r.checks {
        println!("  {c}");
    }
    println!();
    println!("targets:");
    let find = |conns| {
        r.rows
            .iter()
            .find(|b| b.label == "cortex durable signal" && b.conns == conns)
    };
    let verdict = |ok: bool| if ok { "met   " } else { "MISSED" };
    let sync_p99 = r.sync.p99_as_wrk.as_secs_f64() * 1e6;
    let sync_p99_raw = r.sync.p99.as_secs_f64() * 1e6;
    let webhook = |conns| {
        r.rows
            .iter()
            .find(|b| b.label == "webhook: check secret" && b.conns == conns)
    };
    // The tail targets, as ratios within this run: an answer never waits behind a redb
    // commit, so one connection's p99 stays near the disk's own flush, and 50
    // connections' p99 at or below webhook's, which stores nothing.
    if let Some(c1) = find(C1.1) {
        let (p50, p99) = (c1.run.p50_us, c1.run.p99_us);
        println!(
            "  [{}] 1 conn p99 <= {TARGET_C1_P99_SYNC_X:.0}x fdatasync p99, both as wrk counts: {} vs {} (x{:.2}; p99/p50 {:.1}; x{:.2} the raw fdatasync p99 {})",
            verdict(p99 <= TARGET_C1_P99_SYNC_X * sync_p99),
            us(p99),
            us(sync_p99),
            p99 / sync_p99,
            p99 / p50,
            p99 / sync_p99_raw,
            us(sync_p99_raw)
        );
    }
    if let (Some(c50), Some(wh)) = (find(C50_CONNS), webhook(C50_CONNS)) {
        let (p99, wh_p99) = (c50.run.p99_us, wh.run.p99_us);
        println!(
            "  [{}] 50 conns p99 <= webhook's: {} vs {} (x{:.2}; p99/p50 {:.1})",
            verdict(p99 <= wh_p99),
            us(p99),
            us(wh_p99),
            p99 / wh_p99,
            p99 / c50.run.p50_us
        );
        let ratio = c50.run.rps() / wh.run.rps();
        println!(
            "  [{}] 50 conns req/s >= {TARGET_C50_RPS_WEBHOOK_X:.2}x webhook's: {}/s vs {}/s (x{ratio:.2})",
            verdict(ratio >= TARGET_C50_RPS_WEBHOOK_X),
            thousands(c50.run.rps()),
            thousands(wh.run.rps())
        );
    }
    if let Some(c1) = find(C1.1) {
        let (p50, p99) = (c1.run.p50_us, c1.run.p99_us);
        println!(
            "  [{}] 1 conn p50 <= 250 us: {}",
            verdict(p50 <= TARGET_C1_P50_US),
            us(p50)
        );
        println!(
            "  [{}] 1 conn p99 <= 1.5 ms: {}",
            verdict(p99 <= TARGET_C1_P99_US),
            us(p99)
        );
    }
    if let Some(c50) = find(C50_CONNS) {
        let (rps, p99) = (c50.run.rps(), c50.run.p99_us);
        println!(
            "  [{}] 50 conns >= 30,000 durable signals/s: {}/s",
            verdict(rps >= TARGET_C50_RPS),
            thousands(rps)
        );
        println!(
            "  [{}] 50 conns p99 <= 10 ms: {}",
            verdict(p99 <= TARGET_C50_P99_US),
            us(p99)
        );
    }
    match &p.cli {
        Ok(t) => println!(
            "  [{}] cortex-signal faster than curl: {} vs {} (mean)",
            verdict(t.mean < p.curl.mean),
            ms(t.mean),
            ms(p.curl.mean)
        ),
        Err(why) => println!("  [n/a   ] cortex-signal faster than curl: {why}"),
    }
}

/// What the report says about the machine and tools.
struct Facts {
    date: String,
    machine: String,
    disk: String,
    tools: String,
}

fn machine_facts(scratch: &Path) -> Facts {
    Facts {
        date: utc_now(),
        machine: crate::bench_kit::report::machine(),
        disk: crate::bench_kit::report::disk(scratch),
        tools: [
            tools::version("wrk", "-v")
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" "),
            tools::version("webhook", "-version"),
            tools::version("hyperfine", "--version"),
            tools::version("curl", "--version")
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" "),
        ]
        .join(", "),
    }
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// `1 conn`, `50 conns`.
fn conn_s(n: u32) -> String {
    if n == 1 {
        "1 conn".into()
    } else {
        format!("{n} conns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() -> anyhow::Result<()> {
        let o = parse_options(&["--duration", "3", "--no-build"])?;
        assert_eq!((o.seconds, o.build, o.runs), (3, false, 200));
        assert!(parse_options(&["--duration"]).is_err());
        assert!(parse_options(&["--bogus"]).is_err());
        Ok(())
    }
}
