//! What the agent costs while its waits wait: CPU time (utime + stime of /proc/PID/stat,
//! dead threads included, 10 ms ticks; and the scheduler's run time of each thread,
//! /proc/PID/task/TID/schedstat, in ns), wakeups (voluntary + involuntary context
//! switches summed over the threads, /proc/PID/task/TID/status), resident memory and
//! open descriptors, over a window in which nothing happens.

use std::time::Duration;

use anyhow::Context;

use crate::bench_kit::cpu;

/// One process over a window.
#[derive(Debug, Clone)]
pub struct Figures {
    pub window: Duration,
    pub ticks: u64,
    pub run_ns: u64,
    pub wakeups: u64,
    pub rss_kib: u64,
    pub fds: usize,
    pub threads: usize,
}

impl Figures {
    pub fn cpu_ms(&self) -> f64 {
        self.run_ns as f64 / 1e6
    }

    pub fn wakeups_per_min(&self) -> f64 {
        self.wakeups as f64 * 60.0 / self.window.as_secs_f64().max(0.001)
    }
}

/// Per thread: run time (ns) and context switches. A thread that ends inside the window
/// takes its counts with it, which the tick count (dead threads included) covers.
fn threads(pid: u32) -> anyhow::Result<Vec<(u32, u64, u64)>> {
    let dir = format!("/proc/{pid}/task");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).with_context(|| format!("listing {dir}"))? {
        let e = e.with_context(|| format!("listing {dir}"))?;
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let (Ok(status), Ok(sched)) = (
            std::fs::read_to_string(e.path().join("status")),
            std::fs::read_to_string(e.path().join("schedstat")),
        ) else {
            continue;
        };
        let n = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        let run = sched
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        out.push((
            tid,
            run,
            n("voluntary_ctxt_switches:") + n("nonvoluntary_ctxt_switches:"),
        ));
    }
    Ok(out)
}

fn sum(t: &[(u32, u64, u64)], other: &[(u32, u64, u64)]) -> (u64, u64) {
    // Only threads alive at both ends are compared; new ones count from zero.
    let mut run = 0;
    let mut switches = 0;
    for (tid, r, s) in t {
        let (r0, s0) = other
            .iter()
            .find(|(t0, _, _)| t0 == tid)
            .map_or((0, 0), |(_, r0, s0)| (*r0, *s0));
        run += r.saturating_sub(r0);
        switches += s.saturating_sub(s0);
    }
    (run, switches)
}

/// Watches `pid` for `window` (sleeping, so the bench itself adds nothing).
pub fn observe(pid: u32, window: Duration) -> anyhow::Result<Figures> {
    let t0 = cpu::own_ticks(pid)?;
    let th0 = threads(pid)?;
    std::thread::sleep(window);
    let t1 = cpu::own_ticks(pid)?;
    let th1 = threads(pid)?;
    let (run_ns, wakeups) = sum(&th1, &th0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    Ok(Figures {
        window,
        ticks: t1.saturating_sub(t0),
        run_ns,
        wakeups,
        rss_kib,
        fds,
        threads: th1.len(),
    })
}
