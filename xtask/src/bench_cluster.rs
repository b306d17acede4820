//! `cargo xtask bench cluster`: the store on PostgreSQL beside its floor. On one
//! throwaway cluster (Debian's server, fsync and synchronous_commit on): `pgbench` with a
//! one-row insert and commit per transaction (the floor), the hub's durable signal route
//! on redb, and the same hub on PostgreSQL, each at 50 connections (wrk), in interleaved
//! rounds so the machine's drift lands on all three. It checks that each hub recorded
//! every signal it acknowledged, prints the medians and the ratios, and leaves nothing
//! running. Method and figures: docs/benchmarks.md.
//!
//! This is the single-hub stage of several hubs on one database: the figures with three
//! hubs, wake latency over NOTIFY and failover come with the stages that build them.

use std::path::Path;
use std::process::{Output, Stdio};

use anyhow::{Context, bail, ensure};

use crate::bench_kit::hub::{Hub, Monitor, signal_body};
use crate::bench_kit::procs::{Procs, ScratchDir};
use crate::bench_kit::report::{machine, thousands, us, utc_now};
use crate::bench_kit::{cargo_build, target_dir, workspace_root};
use crate::bench_signals::tools::{self, Load, WrkRun};
use cortex_tests::postgres::Postgres;

/// The target: one hub on PostgreSQL at least this share of the floor's transactions/s.
const TARGET_PG_FLOOR_X: f64 = 0.5;
const CONNS: u32 = 50;

/// `cargo xtask bench cluster` flags.
#[derive(clap::Parser)]
#[command(name = "cargo xtask bench cluster", disable_help_flag = true)]
struct Options {
    /// Seconds per measured run.
    #[arg(long = "duration", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    seconds: u64,
    /// Rounds of the three runs, interleaved.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Monitors each hub's load is spread over.
    #[arg(long, default_value_t = 200, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    monitors: usize,
    /// Build the hub first (`--no-build`: use target/release/cortex-hub).
    #[arg(long = "no-build", action = clap::ArgAction::SetFalse)]
    build: bool,
}

/// One measured run's figures.
#[derive(Clone, Copy)]
struct Figures {
    per_s: f64,
    p50_us: f64,
    p99_us: f64,
}

impl From<&WrkRun> for Figures {
    fn from(r: &WrkRun) -> Self {
        Figures {
            per_s: r.ok() as f64 / r.duration_s,
            p50_us: r.p50_us,
            p99_us: r.p99_us,
        }
    }
}

pub fn run(args: &[&str]) -> anyhow::Result<()> {
    let opts: Options = crate::bench_kit::parse_flags(args)?;
    ensure!(
        tools::on_path("wrk"),
        "missing on PATH: wrk; install it with: apt-get install -y wrk"
    );
    let root = workspace_root();
    if opts.build {
        cargo_build(&root, &["cortex-hub"]).context("building cortex-hub")?;
    }
    let hub_bin = target_dir(&root).join("release").join("cortex-hub");
    ensure!(
        hub_bin.is_file(),
        "{} is missing; run without --no-build",
        hub_bin.display()
    );
    let scratch = ScratchDir::new("cluster")?;
    let mut procs = Procs::default();
    eprintln!("bench: starting a PostgreSQL cluster");
    // The tests' throwaway cluster: fsync and synchronous_commit on, loopback only,
    // stopped and removed when dropped.
    let cluster = Postgres::start();
    let version = cluster.query("postgres", "SHOW server_version");
    for db in ["floor", "hub"] {
        cluster.create_database(db);
    }
    cluster.query(
        "floor",
        "CREATE TABLE floor (id bigserial PRIMARY KEY, v bytea NOT NULL)",
    );
    let floor_sql = cluster.owned_dir("floor").join("floor.sql");
    std::fs::write(
        &floor_sql,
        "INSERT INTO floor (v) VALUES ('\\x7369676e616c');\n",
    )?;

    let redb = Hub::start_with_env(&hub_bin, &scratch.path().join("redb"), &[], &mut procs)?;
    let url = cluster.url("hub");
    let onpg = Hub::start_with_env(
        &hub_bin,
        &scratch.path().join("pg-home"),
        &[("CORTEX_STORE_URL", &url)],
        &mut procs,
    )?;
    let mut hubs = Vec::new();
    for (name, hub) in [("redb", &redb), ("pg", &onpg)] {
        let monitors = hub.create_monitors(opts.monitors)?;
        let script = scratch.path().join(format!("{name}.lua"));
        let bodies: Vec<String> = monitors
            .iter()
            .map(|m| signal_body(&m.id, &m.secret))
            .collect();
        std::fs::write(&script, tools::wrk_script("/webhook/signal", &bodies)?)?;
        hubs.push((hub, monitors, script));
    }

    let mut floor = Vec::new();
    let mut on_redb = Vec::new();
    let mut on_pg = Vec::new();
    let mut checks = Vec::new();
    let mut failures = Vec::new();
    for round in 1..=opts.rounds {
        eprintln!(
            "bench: round {round}: pgbench, {CONNS} clients, {} s",
            opts.seconds
        );
        floor.push(pgbench(&cluster, &floor_sql, opts.seconds)?);
        for (i, (hub, monitors, script)) in hubs.iter().enumerate() {
            let label = if i == 0 { "redb" } else { "PostgreSQL" };
            eprintln!(
                "bench: round {round}: the hub on {label}, {CONNS} connections, {} s",
                opts.seconds
            );
            let (run, recorded, load) = measured(hub, monitors, script, opts.seconds)
                .with_context(|| format!("hub log tail:\n{}", hub.log_tail()))?;
            procs.check_alive(hub.index)?;
            let check = crate::bench_signals::count_check(
                &format!("round {round}, the hub on {label}"),
                load,
                &run,
                recorded,
            );
            failures.extend(check.failure);
            checks.push(check.text);
            if i == 0 {
                on_redb.push(Figures::from(&run));
            } else {
                on_pg.push(Figures::from(&run));
            }
        }
    }
    // Where the hub's time on PostgreSQL goes: its reads by table (index scans: a point
    // read or a range page each), and its transactions (one per batch).
    let signals = onpg.recorded(&hubs[1].1)?;
    let scans = cluster.query(
        "hub",
        "SELECT string_agg(relname || ' ' || idx_scan, ', ' ORDER BY idx_scan DESC) FROM pg_stat_user_tables WHERE schemaname = 'cortex' AND idx_scan > 0",
    );
    let commits: u64 = cluster
        .query(
            "hub",
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
        )
        .parse()
        .context("xact_commit")?;
    let size: u64 = cluster
        .query("hub", "SELECT pg_database_size(current_database())")
        .parse()
        .context("pg_database_size")?;
    let monitors = opts.monitors;

    let (f, r, p) = (median(&floor), median(&on_redb), median(&on_pg));
    println!("# cargo xtask bench cluster, {}", utc_now());
    println!();
    println!(
        "{}; PostgreSQL {version} (fsync on, synchronous_commit on), loopback TCP",
        machine()
    );
    println!(
        "{} rounds of {} s each, interleaved; medians over the rounds; {CONNS} connections; hubs' load over {monitors} monitors each",
        opts.rounds, opts.seconds
    );
    println!();
    println!("| what | per s | p50 | p99 | x floor |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (what, x) in [
        ("pgbench: one-row insert and commit (the floor)", f),
        ("cortex-hub on redb: durable signal (202)", r),
        ("cortex-hub on PostgreSQL: durable signal (202)", p),
    ] {
        println!(
            "| {what} | {} | {} | {} | {:.2}x |",
            thousands(x.per_s),
            us(x.p50_us),
            us(x.p99_us),
            x.per_s / f.per_s
        );
    }
    println!();
    let pg_x = p.per_s / f.per_s;
    println!(
        "one hub on PostgreSQL: {pg_x:.2}x the floor (target at least {TARGET_PG_FLOOR_X}x): {}",
        if pg_x >= TARGET_PG_FLOOR_X {
            "met"
        } else {
            "NOT MET"
        }
    );
    println!(
        "one hub on PostgreSQL: {:.2}x the hub on redb",
        p.per_s / r.per_s
    );
    println!(
        "the hub's database after the runs: {:.1} MiB",
        size as f64 / (1 << 20) as f64
    );
    println!(
        "the hub on PostgreSQL: {} signals in {} transactions (about {:.0} a batch); reads by table (index scans): {scans}",
        thousands(signals as f64),
        thousands(commits as f64),
        signals as f64 / commits.max(1) as f64
    );
    println!();
    for c in &checks {
        println!("- {c}");
    }
    drop(hubs);
    drop(procs);
    drop(scratch);
    if !failures.is_empty() {
        bail!("the run is not valid: {}", failures.join("; "));
    }
    Ok(())
}

/// A second of warm-up at the same load, then the measured run; the signals the hub
/// recorded during it (each count read once the hub settled).
fn measured(
    hub: &Hub,
    monitors: &[Monitor],
    script: &Path,
    seconds: u64,
) -> anyhow::Result<(WrkRun, u64, Load)> {
    let load = |seconds| Load {
        threads: 1,
        connections: CONNS,
        seconds,
    };
    tools::wrk(script, &hub.signal_url(), load(1))?;
    crate::bench_signals::settle();
    let before = hub.recorded(monitors)?;
    let run = tools::wrk(script, &hub.signal_url(), load(seconds))?;
    crate::bench_signals::settle();
    let recorded = hub.recorded(monitors)? - before;
    Ok((run, recorded, load(seconds)))
}

/// pgbench's one-row insert at [`CONNS`] clients for `seconds`, latencies from its
/// per-transaction log.
fn pgbench(c: &Postgres, script: &Path, seconds: u64) -> anyhow::Result<Figures> {
    let logs = c.owned_dir("pgbench-log");
    for e in std::fs::read_dir(&logs)? {
        std::fs::remove_file(e?.path())?;
    }
    let out = c
        .tool("pgbench")
        .args([
            "-n",
            "-c",
            &CONNS.to_string(),
            "-j",
            "2",
            "-T",
            &seconds.to_string(),
        ])
        .arg("-f")
        .arg(script)
        .arg("-l")
        .arg("--log-prefix")
        .arg(logs.join("tx"))
        .arg("floor")
        .stdin(Stdio::null())
        .output()
        .context("running pgbench")?;
    ensure!(out.status.success(), "pgbench failed: {}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let tps: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("pgbench printed no tps:\n{stdout}"))?;
    // Each log line: client, transaction, latency (µs), script, epoch s, µs.
    let mut lat = Vec::new();
    for e in std::fs::read_dir(&logs)? {
        let body = std::fs::read_to_string(e?.path())?;
        lat.extend(
            body.lines()
                .filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok()),
        );
    }
    ensure!(!lat.is_empty(), "pgbench logged no transaction");
    lat.sort_unstable();
    let at = |p: f64| lat[((lat.len() - 1) as f64 * p).round() as usize] as f64;
    Ok(Figures {
        per_s: tps,
        p50_us: at(0.50),
        p99_us: at(0.99),
    })
}

/// The run with the median rate (its latencies with it).
fn median(runs: &[Figures]) -> Figures {
    let mut v = runs.to_vec();
    v.sort_by(|a, b| a.per_s.total_cmp(&b.per_s));
    v[v.len() / 2]
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
