//! Many sessions at once: created through the API with an armed waitpoint each (a few
//! client threads, kept-alive connections), the hub's resident memory, and all of them
//! woken in one burst of signals, timed to the last woken turn answered, with the most
//! model requests the runner had open at once.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use cortex_tests::scripted_model::ScriptedModel;
use serde_json::json;

use super::latency::{Session, run_result};
use crate::bench_kit::hub::Hub;
use crate::bench_kit::procs::poll_every;
use crate::bench_kit::{agent, request_on};

/// Bound on the burst's last woken turn.
const BURST_LIMIT: Duration = Duration::from_secs(600);

/// The sessions created, and how long that took.
pub struct Armed {
    pub sessions: Vec<Session>,
    pub took: Duration,
}

/// Creates `n` sessions, each with one armed waitpoint, from `threads` client threads.
pub fn create(hub: &Hub, n: usize, threads: usize) -> anyhow::Result<Armed> {
    let start = Instant::now();
    let shares = split(n, threads);
    let made: Vec<anyhow::Result<Vec<Session>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = shares
            .iter()
            .map(|&count| scope.spawn(move || create_some(hub, count)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a client thread panicked")))
            })
            .collect()
    });
    let mut sessions = Vec::with_capacity(n);
    for m in made {
        sessions.extend(m?);
    }
    Ok(Armed {
        sessions,
        took: start.elapsed(),
    })
}

fn create_some(hub: &Hub, count: usize) -> anyhow::Result<Vec<Session>> {
    let client = agent();
    (0..count)
        .map(|_| Session::create(hub, &client, "bench idle"))
        .collect()
}

/// `n` split into `parts` nearly equal shares.
fn split(n: usize, parts: usize) -> Vec<usize> {
    let parts = parts.max(1);
    (0..parts)
        .map(|i| n / parts + usize::from(i < n % parts))
        .collect()
}

/// The burst's figures.
pub struct Burst {
    /// First signal sent → the last 202 read.
    pub signalled_in: Duration,
    /// First signal sent → the last woken turn's answer written.
    pub answered_in: Duration,
    pub max_in_flight: usize,
}

/// Signals every waitpoint as fast as the route takes them (`threads` clients), waits for
/// every woken turn's model request to be answered, then checks every session's run ended.
pub fn burst(
    hub: &Hub,
    model: &ScriptedModel,
    armed: &Armed,
    threads: usize,
) -> anyhow::Result<Burst> {
    let n = armed.sessions.len();
    let chunk = n.div_ceil(threads.max(1)).max(1);
    model.reset_max_in_flight();
    let base = model.request_count();
    let start = Instant::now();
    let lasts: Vec<anyhow::Result<Instant>> = std::thread::scope(|scope| {
        let handles: Vec<_> = armed
            .sessions
            .chunks(chunk)
            .map(|part| scope.spawn(move || signal_all(hub, part)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a signal thread panicked")))
            })
            .collect()
    });
    let mut last = start;
    for l in lasts {
        last = last.max(l?);
    }
    let signalled_in = last - start;

    poll_every(
        Duration::from_millis(20),
        BURST_LIMIT,
        "every woken turn answered",
        || Ok((model.request_count() >= base + n && model.in_flight() == 0).then_some(())),
    )?;
    let timings = model.timings();
    ensure!(
        timings.len() == base + n,
        "{} model requests for {n} wakes",
        timings.len() - base
    );
    let mut answered = start;
    for (i, t) in timings[base..].iter().enumerate() {
        let at = t
            .answered
            .with_context(|| format!("the burst's model answer {i} was not written whole"))?;
        answered = answered.max(at);
    }
    let max_in_flight = model.max_in_flight();

    // Every run ended with the model's answer (not timed: after the figures).
    let checks: Vec<anyhow::Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = armed
            .sessions
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    let client = agent();
                    for s in part {
                        let r = run_result(hub, &client, &s.sid)?;
                        ensure!(
                            r["result"]["output"]["response"] == "noted",
                            "session {}'s woken run ended otherwise: {r}",
                            s.sid
                        );
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a check thread panicked")))
            })
            .collect()
    });
    for c in checks {
        c?;
    }
    Ok(Burst {
        signalled_in,
        answered_in: answered - start,
        max_in_flight,
    })
}

/// Signals each waitpoint of `part` once; the moment the last 202 was read.
fn signal_all(hub: &Hub, part: &[Session]) -> anyhow::Result<Instant> {
    let client = agent();
    for s in part {
        let body =
            json!({"id": s.wp, "secret": s.secret, "status": "ok", "message": "done"}).to_string();
        let r = request_on(
            &client,
            hub.addr,
            "POST",
            "/webhook/signal",
            None,
            Some(body.as_bytes()),
        )?;
        ensure!(
            r.status == 202,
            "signal to {}: HTTP {}: {}",
            s.wp,
            r.status,
            r.text()
        );
    }
    Ok(Instant::now())
}

/// The process's resident memory (`VmRSS` of /proc/PID/status), in KiB.
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("{path}: no VmRSS"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_and_differ_by_one_at_most() {
        assert_eq!(split(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(split(3, 4), vec![1, 1, 1, 0]);
        assert_eq!(split(10_000, 1), vec![10_000]);
        assert_eq!(split(7, 0), vec![7]);
    }

    #[test]
    fn reads_this_process_rss() -> anyhow::Result<()> {
        assert!(rss_kib(std::process::id())? > 0);
        Ok(())
    }
}
