//! `cargo xtask bench cluster`: the store on PostgreSQL beside its floor. On one
//! throwaway cluster (Debian's server, fsync and synchronous_commit on): `pgbench` with a
//! one-row insert and commit per transaction (the floor), the hub's durable signal route
//! on redb, the same hub on PostgreSQL, and three hubs on one database (the 50
//! connections split over them, as clients with the three URLs would), each at 50
//! connections (wrk), in interleaved rounds so the machine's drift lands on all. It
//! checks that each hub recorded every signal it acknowledged, then times a wake across
//! hubs (a signal's 202 from one hub → a long poll on another returns, over NOTIFY) and
//! a failover (a hub SIGKILLed: its devices and its session on another), prints the
//! medians and the ratios, and leaves nothing running. Method and figures:
//! docs/benchmarks.md.

use std::path::Path;
use std::process::{Output, Stdio};

use anyhow::{Context, bail, ensure};

use crate::bench_kit::hub::{Hub, Monitor, signal_body};
use crate::bench_kit::procs::{Procs, ScratchDir};
use crate::bench_kit::report::{machine, thousands, us, utc_now};
use crate::bench_kit::{cargo_build, target_dir, workspace_root};
use crate::bench_signals::Check;
use crate::bench_signals::tools::{self, Load, WrkRun};
use cortex_tests::postgres::Postgres;

mod failover;

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
    /// Failover trials (0: none).
    #[arg(long, default_value_t = 5)]
    failovers: usize,
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
        cargo_build(&root, &["cortex-hub", "cortex-device-agent"])
            .context("building cortex-hub and cortex-device-agent")?;
    }
    let hub_bin = target_dir(&root).join("release").join("cortex-hub");
    let agent_bin = target_dir(&root)
        .join("release")
        .join("cortex-device-agent");
    for bin in [&hub_bin, &agent_bin] {
        ensure!(
            bin.is_file(),
            "{} is missing; run without --no-build",
            bin.display()
        );
    }
    let scratch = ScratchDir::new("cluster")?;
    let mut procs = Procs::default();
    eprintln!("bench: starting a PostgreSQL cluster");
    // The tests' throwaway cluster: fsync and synchronous_commit on, loopback only,
    // stopped and removed when dropped.
    let cluster = Postgres::start();
    let version = cluster.query("postgres", "SHOW server_version");
    for db in ["floor", "hub", "hub3"] {
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
    // Three hubs on one database, sharing the first one's token.
    let url3 = cluster.url("hub3");
    let first = Hub::start_with_env(
        &hub_bin,
        &scratch.path().join("three-0"),
        &[("CORTEX_STORE_URL", &url3)],
        &mut procs,
    )?;
    let token = first.token().to_string();
    let mut three = vec![first];
    for i in 1..3 {
        three.push(Hub::start_with_env(
            &hub_bin,
            &scratch.path().join(format!("three-{i}")),
            &[
                ("CORTEX_STORE_URL", &url3),
                ("CORTEX_WEBHOOK_TOKEN", &token),
            ],
            &mut procs,
        )?);
    }
    let mut three_load = Vec::new();
    for (i, hub) in three.iter().enumerate() {
        let monitors = hub.create_monitors(opts.monitors.div_ceil(3))?;
        let script = scratch.path().join(format!("three-{i}.lua"));
        let bodies: Vec<String> = monitors
            .iter()
            .map(|m| signal_body(&m.id, &m.secret))
            .collect();
        std::fs::write(&script, tools::wrk_script("/webhook/signal", &bodies)?)?;
        three_load.push((hub, monitors, script));
    }
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
    let mut on_three = Vec::new();
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
        eprintln!(
            "bench: round {round}: three hubs on PostgreSQL, {CONNS} connections over them, {} s",
            opts.seconds
        );
        let (figures, round_checks) = measured_three(&three_load, opts.seconds, round)?;
        for c in round_checks {
            checks.push(c.text);
            failures.extend(c.failure);
        }
        on_three.push(figures);
    }
    eprintln!("bench: a wake across hubs, {WAKES} times");
    let wakes = wake_across(&three[0], &three[1])?;
    // A fourth hub on the same database that sends no NOTIFY: its batches reach the
    // others only by their poll of the log.
    let quiet = Hub::start_with_env(
        &hub_bin,
        &scratch.path().join("three-quiet"),
        &[
            ("CORTEX_STORE_URL", &url3),
            ("CORTEX_WEBHOOK_TOKEN", &token),
            ("CORTEX_STORE_NOTIFY", "off"),
        ],
        &mut procs,
    )?;
    eprintln!("bench: a wake across hubs with NOTIFY off, {WAKES} times");
    let polled = wake_across(&three[0], &quiet)?;
    eprintln!(
        "bench: {IDLE} idle sessions, each with an armed waitpoint, on the hub on PostgreSQL"
    );
    let idle = idle_cost(&onpg, &cluster, &procs)?;
    eprintln!(
        "bench: {} failovers, {} devices each (the default lease)",
        opts.failovers,
        failover::DEVICES
    );
    let failovers = failover::trials(
        &hub_bin,
        &agent_bin,
        &cluster,
        &scratch.path().join("failover"),
        opts.failovers,
    )?;
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

    let (f, r, p, t) = (
        median(&floor),
        median(&on_redb),
        median(&on_pg),
        median(&on_three),
    );
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
        (
            "three cortex-hubs on one PostgreSQL database: durable signal (202)",
            t,
        ),
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
        "three hubs on one database: {:.2}x one hub on it (writes are made one transaction at a time across the hubs)",
        t.per_s / p.per_s
    );
    println!(
        "a wake across hubs (the 202 from one → a long poll on another returns, NOTIFY on): p50 {}, p99 {}, max {} over {WAKES} (target p50 under 5 ms)",
        ms(pct(&wakes, 0.50)),
        ms(pct(&wakes, 0.99)),
        ms(pct(&wakes, 1.0)),
    );
    println!(
        "a wake across hubs with NOTIFY off (the other hub's poll, every {} ms): p50 {}, p99 {}, max {} over {WAKES} (target under the poll + 5 ms)",
        POLL_MS,
        ms(pct(&polled, 0.50)),
        ms(pct(&polled, 0.99)),
        ms(pct(&polled, 1.0)),
    );
    println!(
        "{IDLE} idle sessions with an armed waitpoint each: hub RSS {} -> {} MiB, its database {:.1} -> {:.1} MiB ({:.0} bytes a session)",
        idle.rss_before_kib / 1024,
        idle.rss_after_kib / 1024,
        idle.db_before as f64 / (1 << 20) as f64,
        idle.db_after as f64 / (1 << 20) as f64,
        (idle.db_after.saturating_sub(idle.db_before)) as f64 / IDLE as f64,
    );
    if !failovers.is_empty() {
        let sorted = |f: fn(&failover::Trial) -> f64| {
            let mut v: Vec<f64> = failovers.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let (devices, session) = (sorted(|t| t.devices_ms), sorted(|t| t.session_ms));
        println!(
            "failover, a hub SIGKILLed ({} trials, {} devices each, lease 10 s): its devices linked to the other hub p50 {}, max {}; its session driven again there p50 {}, max {} (target under the lease)",
            failovers.len(),
            failover::DEVICES,
            ms(pct(&devices, 0.50)),
            ms(pct(&devices, 1.0)),
            ms(pct(&session, 0.50)),
            ms(pct(&session, 1.0)),
        );
    }
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
    drop(three_load);
    drop(three);
    drop(quiet);
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

/// The three hubs' runs at once, [`CONNS`] connections split over them: the summed rate,
/// the middle hub's p50 and the worst p99; and each hub's count check.
fn measured_three(
    hubs: &[(&Hub, Vec<Monitor>, std::path::PathBuf)],
    seconds: u64,
    round: u32,
) -> anyhow::Result<(Figures, Vec<Check>)> {
    let conns = |i: usize| CONNS / 3 + u32::from((i as u32) < CONNS % 3);
    let load = |i, seconds| Load {
        threads: 1,
        connections: conns(i),
        seconds,
    };
    let all = |seconds| -> anyhow::Result<Vec<WrkRun>> {
        std::thread::scope(|s| {
            let runs: Vec<_> = hubs
                .iter()
                .enumerate()
                .map(|(i, (hub, _, script))| {
                    s.spawn(move || tools::wrk(script, &hub.signal_url(), load(i, seconds)))
                })
                .collect();
            runs.into_iter()
                .map(|r| {
                    r.join()
                        .map_err(|_| anyhow::anyhow!("a wrk thread panicked"))?
                })
                .collect()
        })
    };
    all(1)?;
    crate::bench_signals::settle();
    let before = hubs
        .iter()
        .map(|(h, m, _)| h.recorded(m))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let runs = all(seconds)?;
    crate::bench_signals::settle();
    let mut checks = Vec::new();
    for (i, ((hub, monitors, _), run)) in hubs.iter().zip(&runs).enumerate() {
        let recorded = hub.recorded(monitors)? - before[i];
        let c = crate::bench_signals::count_check(
            &format!("round {round}, hub {} of three", i + 1),
            load(i, seconds),
            run,
            recorded,
        );
        checks.push(c);
    }
    let per_s = runs.iter().map(|r| r.ok() as f64 / r.duration_s).sum();
    let mut p50: Vec<f64> = runs.iter().map(|r| r.p50_us).collect();
    p50.sort_by(f64::total_cmp);
    let p99 = runs.iter().map(|r| r.p99_us).fold(0.0, f64::max);
    Ok((
        Figures {
            per_s,
            p50_us: p50[p50.len() / 2],
            p99_us: p99,
        },
        checks,
    ))
}

/// The bus's poll interval (`kernel::pg::bus::POLL`).
const POLL_MS: u64 = 1000;
/// Idle sessions made for the cost figure.
const IDLE: usize = 10_000;

struct Idle {
    rss_before_kib: u64,
    rss_after_kib: u64,
    db_before: u64,
    db_after: u64,
}

/// [`IDLE`] sessions each with an armed waitpoint on `hub`: its RSS and its database's
/// size before and after (once it settled).
fn idle_cost(hub: &Hub, cluster: &Postgres, procs: &Procs) -> anyhow::Result<Idle> {
    let pid = procs.pid(hub.index).context("the hub's pid")?;
    let size = || -> anyhow::Result<u64> {
        cluster
            .query("hub", "SELECT pg_database_size(current_database())")
            .parse()
            .context("pg_database_size")
    };
    let (rss_before_kib, db_before) = (crate::bench_agent::fleet::rss_kib(pid)?, size()?);
    let agent = crate::bench_kit::agent();
    for _ in 0..IDLE {
        let s = hub.api_on(
            &agent,
            "POST",
            "/api/sessions",
            Some(serde_json::json!({"title": "idle"})),
            201,
        )?;
        let sid = s["id"].as_str().context("the new session has no id")?;
        hub.api_on(
            &agent,
            "POST",
            &format!("/api/sessions/{sid}/waitpoints"),
            Some(serde_json::json!({"label": "idle", "intent": "an idle wait"})),
            201,
        )?;
    }
    crate::bench_signals::settle();
    cluster.query("hub", "VACUUM");
    Ok(Idle {
        rss_before_kib,
        rss_after_kib: crate::bench_agent::fleet::rss_kib(pid)?,
        db_before,
        db_after: size()?,
    })
}

/// How many wakes across hubs are timed.
const WAKES: usize = 100;

/// Each of [`WAKES`] times: a waitpoint armed on `a`, a long poll on its session's events
/// there, the signal posted to `b`; the time from `b`'s 202 to `a`'s answer, in ms.
fn wake_across(a: &Hub, b: &Hub) -> anyhow::Result<Vec<f64>> {
    let s = a.api_json(
        "POST",
        "/api/sessions",
        Some(serde_json::json!({"title": "wake"})),
        201,
    )?;
    let sid = s["id"]
        .as_str()
        .context("the new session has no id")?
        .to_string();
    let mut out = Vec::with_capacity(WAKES);
    for _ in 0..WAKES {
        let w = a.api_json(
            "POST",
            &format!("/api/sessions/{sid}/waitpoints"),
            Some(serde_json::json!({"label": "wake", "intent": "wake"})),
            201,
        )?;
        let after = newest_seq(a, &sid)?;
        // A job's end (`ok`): the waitpoint fires.
        let body = serde_json::json!({
            "id": w["id"].as_str().context("a waitpoint without id")?,
            "secret": w["secret"].as_str().context("a waitpoint without secret")?,
            "status": "ok",
        })
        .to_string();
        let took = std::thread::scope(|s| -> anyhow::Result<f64> {
            // Long polls until one answers with the wake (an answer without it, woken
            // by another change, is asked again, as a client does).
            let poll = s.spawn(
                || -> (anyhow::Result<serde_json::Value>, std::time::Instant) {
                    let mut from = after;
                    loop {
                        let r = a.api_json(
                            "GET",
                            &format!("/api/sessions/{sid}/events?after={from}&wait=30"),
                            None,
                            200,
                        );
                        let now = std::time::Instant::now();
                        let Ok(v) = &r else { return (r, now) };
                        let evs = v["events"].as_array().cloned().unwrap_or_default();
                        if evs.iter().any(|e| e["kind"] == "wake") {
                            return (r, now);
                        }
                        from = evs.last().and_then(|e| e["seq"].as_u64()).unwrap_or(from);
                    }
                },
            );
            // The long poll parks on the hub before the signal goes out (a benchmark's
            // pause: the time measured starts at the 202).
            std::thread::sleep(std::time::Duration::from_millis(30));
            let reply = b.api(
                "POST",
                "/webhook/signal",
                Some(serde_json::from_str(&body)?),
            )?;
            let acked = std::time::Instant::now();
            ensure!(
                reply.status == 202,
                "the signal was answered {}",
                reply.status
            );
            let (r, woke) = poll
                .join()
                .map_err(|_| anyhow::anyhow!("the long poll panicked"))?;
            let got = r?;
            ensure!(
                got["events"]
                    .as_array()
                    .is_some_and(|e| e.iter().any(|e| e["kind"] == "wake")),
                "the long poll answered without the wake: {got}"
            );
            Ok(woke.saturating_duration_since(acked).as_secs_f64() * 1000.0)
        })?;
        out.push(took);
    }
    out.sort_by(f64::total_cmp);
    Ok(out)
}

/// The session's newest event's seq (its log read a page at a time).
fn newest_seq(hub: &Hub, sid: &str) -> anyhow::Result<u64> {
    let mut after = 0;
    loop {
        let v = hub.api_json(
            "GET",
            &format!("/api/sessions/{sid}/events?after={after}"),
            None,
            200,
        )?;
        match v["events"]
            .as_array()
            .and_then(|e| e.last())
            .and_then(|e| e["seq"].as_u64())
        {
            Some(seq) => after = seq,
            None => return Ok(after),
        }
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(v: f64) -> String {
    format!("{v:.1} ms")
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
