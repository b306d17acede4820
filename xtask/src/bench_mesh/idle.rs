//! What a process does while nothing happens: its CPU time (utime + stime of
//! /proc/PID/stat, dead threads included) and its wakeups, counted as context switches
//! (voluntary + nonvoluntary, /proc/PID/task/TID/status) summed over its threads, and its
//! resident memory (VmRSS, VmHWM). Threads are sampled every second, so one that starts
//! or ends inside the window is counted too (from 0, and up to its last sample).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::bench_kit::cpu;

/// One thread's wakeups over the window.
#[derive(Debug, Clone)]
pub struct Thread {
    pub tid: u32,
    pub comm: String,
    pub switches: u64,
    /// Started inside the window.
    pub born: bool,
    /// Ended inside the window.
    pub died: bool,
}

/// One process over the window.
#[derive(Debug, Clone)]
pub struct Figures {
    pub cpu: Duration,
    pub wakeups: u64,
    pub threads: Vec<Thread>,
    pub rss_kib: u64,
    pub hwm_kib: u64,
}

struct Seen {
    comm: String,
    first: u64,
    last: u64,
    born: bool,
    alive: bool,
}

/// Counters of one process, sampled.
pub struct Watch {
    pid: u32,
    ticks: u64,
    threads: BTreeMap<u32, Seen>,
}

impl Watch {
    pub fn start(pid: u32) -> anyhow::Result<Watch> {
        let mut w = Watch {
            pid,
            ticks: cpu::own_ticks(pid)?,
            threads: BTreeMap::new(),
        };
        for (tid, comm, n) in threads(pid)? {
            w.threads.insert(
                tid,
                Seen {
                    comm,
                    first: n,
                    last: n,
                    born: false,
                    alive: true,
                },
            );
        }
        Ok(w)
    }

    pub fn sample(&mut self) -> anyhow::Result<()> {
        let now = threads(self.pid)?;
        for s in self.threads.values_mut() {
            s.alive = false;
        }
        for (tid, comm, n) in now {
            let s = self.threads.entry(tid).or_insert(Seen {
                comm: comm.clone(),
                first: 0,
                last: 0,
                born: true,
                alive: true,
            });
            s.comm = comm;
            s.last = n;
            s.alive = true;
        }
        Ok(())
    }

    pub fn finish(mut self) -> anyhow::Result<Figures> {
        self.sample()?;
        let cpu_ticks = cpu::own_ticks(self.pid)?.saturating_sub(self.ticks);
        let (rss_kib, hwm_kib) = memory_kib(self.pid)?;
        let threads: Vec<Thread> = self
            .threads
            .into_iter()
            .map(|(tid, s)| Thread {
                tid,
                comm: s.comm,
                switches: s.last.saturating_sub(s.first),
                born: s.born,
                died: !s.alive,
            })
            .collect();
        Ok(Figures {
            cpu: Duration::from_secs_f64(cpu_ticks as f64 / cpu::TICKS_PER_S),
            wakeups: threads.iter().map(|t| t.switches).sum(),
            threads,
            rss_kib,
            hwm_kib,
        })
    }
}

/// Watches `pids` for `window`, sampling every second; one [`Figures`] per pid.
pub fn observe(pids: &[u32], window: Duration) -> anyhow::Result<Vec<Figures>> {
    let mut watches = pids
        .iter()
        .map(|&p| Watch::start(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let start = Instant::now();
    while start.elapsed() < window {
        let left = window.saturating_sub(start.elapsed());
        std::thread::sleep(left.min(Duration::from_secs(1)));
        for w in &mut watches {
            w.sample()?;
        }
    }
    watches.into_iter().map(Watch::finish).collect()
}

/// Each thread of `pid`: id, name, voluntary + nonvoluntary context switches.
fn threads(pid: u32) -> anyhow::Result<Vec<(u32, String, u64)>> {
    let dir = format!("/proc/{pid}/task");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).with_context(|| format!("listing {dir}"))? {
        let e = e.with_context(|| format!("listing {dir}"))?;
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        // A thread may end between the listing and the read.
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(str::trim)
        };
        let n = |k: &str| field(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        out.push((
            tid,
            field("Name:").unwrap_or("?").to_string(),
            n("voluntary_ctxt_switches:") + n("nonvoluntary_ctxt_switches:"),
        ));
    }
    Ok(out)
}

/// VmRSS and VmHWM of `pid`, in KiB.
pub fn memory_kib(pid: u32) -> anyhow::Result<(u64, u64)> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let kib = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .with_context(|| format!("{path}: no {k}"))
    };
    Ok((kib("VmRSS:")?, kib("VmHWM:")?))
}
