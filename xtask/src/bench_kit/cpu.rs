//! Who else used the CPUs during a run: the machine's busy time (/proc/stat) minus what the
//! processes under test, the bench and its reaped children (wrk) used (/proc/PID/stat). On
//! a 2-core box shared with builds this tells a quiet run from a disturbed one; waiting for
//! a quiet machine before measuring. Clock ticks throughout (USER_HZ, 100 a second on
//! Linux).

use std::time::{Duration, Instant};

use anyhow::Context;

pub const TICKS_PER_S: f64 = 100.0;
/// Below this many CPUs busy, the machine counts as quiet (a desktop's idle hum fits).
pub const QUIET_CPUS: f64 = 0.2;

/// One reading of the counters.
#[derive(Debug, Clone, Copy)]
pub struct Snap {
    /// All CPUs' busy ticks, steal excluded.
    busy: u64,
    /// Ticks the hypervisor gave to other guests.
    steal: u64,
    /// The processes under test's ticks, their reaped children included.
    server: u64,
    /// This process's ticks and its reaped children's (wrk once it has been waited for).
    ours: u64,
}

/// What others used between two snaps, in CPUs (1.0 = one core busy the whole time).
#[derive(Debug, Clone, Copy)]
pub struct Noise {
    pub others_cpus: f64,
    pub steal_cpus: f64,
}

/// Reads the machine's counters and those of `pids` (the processes under test).
pub fn snap(pids: &[u32]) -> anyhow::Result<Snap> {
    let (busy, steal) = machine_ticks()?;
    let mut server = 0;
    for pid in pids {
        server += proc_ticks(&pid.to_string())?;
    }
    Ok(Snap {
        busy,
        steal,
        server,
        ours: proc_ticks("self")?,
    })
}

/// Waits until the whole machine stays nearly idle (under [`QUIET_CPUS`] busy) for a
/// second, while the bench itself does nothing; returns how long it waited, or `None` if it
/// gave up after `bound`.
pub fn wait_quiet(bound: Duration) -> anyhow::Result<Option<Duration>> {
    let start = Instant::now();
    loop {
        let (a, _) = machine_ticks()?;
        std::thread::sleep(Duration::from_secs(1));
        let (b, _) = machine_ticks()?;
        if (b.saturating_sub(a) as f64) / TICKS_PER_S < QUIET_CPUS {
            return Ok(Some(start.elapsed().saturating_sub(Duration::from_secs(1))));
        }
        if start.elapsed() >= bound {
            return Ok(None);
        }
    }
}

/// All CPUs' busy ticks (steal excluded) and steal ticks, from /proc/stat.
fn machine_ticks() -> anyhow::Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let cpu: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("cpu "))
        .context("/proc/stat has no cpu line")?
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let field = |i: usize| cpu.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal guest guest_nice
    let busy = field(0) + field(1) + field(2) + field(5) + field(6);
    Ok((busy, field(7)))
}

pub fn between(a: Snap, b: Snap, seconds: f64) -> Noise {
    let used = b.busy.saturating_sub(a.busy);
    let known = b.server.saturating_sub(a.server) + b.ours.saturating_sub(a.ours);
    let per_s = |t: u64| t as f64 / TICKS_PER_S / seconds.max(0.001);
    Noise {
        others_cpus: per_s(used.saturating_sub(known)),
        steal_cpus: per_s(b.steal.saturating_sub(a.steal)),
    }
}

/// CPU ticks of a process's reaped children: grows when webhook runs commands.
pub fn children_ticks(pid: u32) -> anyhow::Result<u64> {
    let [_, _, cutime, cstime] = proc_fields(&pid.to_string())?;
    Ok(cutime + cstime)
}

/// Waits until `pid` and its children use no more CPU for 300 ms (webhook answers before it
/// runs the command, so a backlog of `/bin/true` can outlive wrk); returns how long that
/// took. Gives up after `bound`.
pub fn wait_idle(pid: u32, bound: Duration) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let mut last = proc_ticks(&pid.to_string())?;
    let mut quiet = 0;
    while quiet < 3 && start.elapsed() < bound {
        std::thread::sleep(Duration::from_millis(100));
        let now = proc_ticks(&pid.to_string())?;
        quiet = if now == last { quiet + 1 } else { 0 };
        last = now;
    }
    Ok(start.elapsed().saturating_sub(Duration::from_millis(300)))
}

/// The CPU time `pid` itself used (utime + stime over all its threads, dead ones included;
/// not its children), in ticks.
pub fn own_ticks(pid: u32) -> anyhow::Result<u64> {
    let [utime, stime, _, _] = proc_fields(&pid.to_string())?;
    Ok(utime + stime)
}

/// utime + stime + cutime + cstime of /proc/`pid`/stat.
fn proc_ticks(pid: &str) -> anyhow::Result<u64> {
    Ok(proc_fields(pid)?.iter().sum())
}

/// utime, stime, cutime, cstime (fields 14 to 17) of /proc/`pid`/stat.
fn proc_fields(pid: &str) -> anyhow::Result<[u64; 4]> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // The command name may hold spaces: count fields after the last ')', where field 3
    // (state) comes first.
    let after = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .with_context(|| format!("{path}: no ')'"))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let get = |n: usize| -> anyhow::Result<u64> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("{path}: field {n}"))
    };
    Ok([get(14)?, get(15)?, get(16)?, get(17)?])
}

/// Waits, at most `seconds` (0: don't), until nothing else uses the CPUs, saying on stderr
/// how long it waited or that it gave up.
pub fn quiet(seconds: u64) -> anyhow::Result<()> {
    if seconds == 0 {
        return Ok(());
    }
    match wait_quiet(Duration::from_secs(seconds))? {
        Some(w) if w >= Duration::from_secs(1) => {
            eprintln!(
                "bench:   waited {:.0} s for a quiet machine",
                w.as_secs_f64()
            );
        }
        Some(_) => {}
        None => eprintln!("bench:   the machine stayed busy for {seconds} s; measuring anyway"),
    }
    Ok(())
}

/// Runs `f` and measures what processes other than `pids`, the bench and its children used
/// meanwhile.
pub fn watched<T>(
    pids: &[u32],
    f: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, Noise)> {
    let start = Instant::now();
    let before = snap(pids)?;
    let out = f()?;
    let after = snap(pids)?;
    Ok((out, between(before, after, start.elapsed().as_secs_f64())))
}
