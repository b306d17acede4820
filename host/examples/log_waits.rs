//! Measures the log and silence waits, for the numbers in `docs/waits.md`:
//! - append to fire: a line appended to a log, to the wait's payload in hand (one log wait
//!   armed at a time, on the same runtime as the writer, so the time is the wait's own);
//! - what idle waits cost: 1,000 log waits and 1,000 silence waits (each on a file of its
//!   own, a silence of an hour) armed and left alone, the process's CPU time over 10 s.
//!
//! `cargo run --release -p cortex-host --example log_waits`. About 15 s. Nothing is left
//! behind: the files live in a temp directory removed at the end.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use cortex_host::wait::{WaitOptions, WaitOutcome, WaitSpec, Waits};

const IDLE_WAITS: usize = 1_000;
const ROUNDS: usize = 500;

fn main() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("cortex-log-waits-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(run(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn spec(path: &Path, silence_ms: Option<u64>, pattern: Option<&str>) -> WaitSpec {
    let path = path.to_string_lossy().into_owned();
    match pattern {
        Some(p) => WaitSpec::Log {
            path,
            pattern: p.into(),
            cursor: None,
            silence_ms,
        },
        None => WaitSpec::File {
            path,
            cursor: None,
            silence_ms,
        },
    }
}

/// This process's CPU time (user + system), from `/proc/self/stat` (clock ticks of 10 ms).
fn cpu_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    // Field 3 (state) is the first after the name; utime and stime are fields 14 and 15.
    let f: Vec<f64> = after
        .split_ascii_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    f.iter().sum::<f64>() * 10.0
}

async fn run(dir: &Path) -> anyhow::Result<()> {
    let waits = Waits::new();

    // 1. Append to fire.
    let log = dir.join("train.log");
    std::fs::write(&log, "start\n")?;
    let mut f = OpenOptions::new().append(true).open(&log)?;
    let mut lat = Vec::with_capacity(ROUNDS);
    for i in 0..ROUNDS {
        let armed = waits.arm(&spec(&log, None, Some("loss=nan")))?;
        let task = tokio::spawn(async move {
            let out = armed.wait(&WaitOptions::new(Duration::from_secs(10))).await;
            (out, Instant::now())
        });
        // Let the wait reach its first look and block.
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        writeln!(f, "step {i} loss=0.1")?;
        let t0 = Instant::now();
        writeln!(f, "step {i} loss=nan")?;
        let (out, at) = task.await?;
        anyhow::ensure!(matches!(out, WaitOutcome::Fired(_)), "round {i}: {out:?}");
        lat.push(at.duration_since(t0).as_nanos() as u64);
    }
    lat.sort_unstable();
    let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize] as f64 / 1e3;
    println!(
        "append to fire ({ROUNDS} rounds): p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs",
        q(0.5),
        q(0.99),
        q(1.0)
    );

    // 2. Idle waits, after the same process idle with none, for comparison.
    let (b0, bt0) = (cpu_ms(), Instant::now());
    tokio::time::sleep(Duration::from_secs(5)).await;
    println!(
        "nothing armed: {:.1} ms CPU in {:.0} ms",
        cpu_ms() - b0,
        bt0.elapsed().as_secs_f64() * 1e3
    );
    let mut held = Vec::with_capacity(IDLE_WAITS * 2);
    // The files first: each write in the directory is an event every wait there reads.
    for i in 0..IDLE_WAITS {
        std::fs::write(dir.join(format!("idle-{i}.log")), "x\n")?;
    }
    for i in 0..IDLE_WAITS {
        let p = dir.join(format!("idle-{i}.log"));
        held.push(waits.arm(&spec(&p, Some(3_600_000), Some("never")))?);
        held.push(waits.arm(&spec(
            &dir.join(format!("quiet-{i}")),
            Some(3_600_000),
            None,
        ))?);
    }
    let tasks: Vec<_> = held
        .into_iter()
        .map(|a| {
            tokio::spawn(async move { a.wait(&WaitOptions::new(Duration::from_secs(3600))).await })
        })
        .collect();
    // Every wait at its first look and blocked.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (c0, t0) = (cpu_ms(), Instant::now());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (c1, t1) = (cpu_ms(), Instant::now());
    let wall = t1.duration_since(t0).as_secs_f64() * 1e3;
    println!(
        "{IDLE_WAITS} log waits + {IDLE_WAITS} silence waits idle: {:.1} ms CPU in {:.0} ms ({:.3}%), {} inotify descriptors",
        c1 - c0,
        wall,
        (c1 - c0) / wall * 100.0,
        waits.file_watches().descriptors()
    );
    for t in &tasks {
        anyhow::ensure!(!t.is_finished(), "an idle wait ended");
    }
    for t in tasks {
        t.abort();
    }
    Ok(())
}
