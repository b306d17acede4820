//! A line appended to a log to "someone knows", for a remote log wait and for the way people
//! watch a log today (`tail -F FILE | grep -m1 PATTERN`), measured on the same kind of
//! append in the same run.
//!
//! The append: one `write(2)` of a whole line to a file opened `O_APPEND`, the realtime clock
//! read just before it. Before the matching line, a few lines that do not match are
//! written (and the watcher given time to read them), so each sample's match is a fresh
//! event and not the first read of the file.
//!
//! - cortex: a remote log wait armed (and confirmed armed by the agent) on the file; then
//!   the append. Two points, from the daemons' timing records: the agent's outcome (its
//!   inotify woke, it read the line, matched it and had the outcome) and the hub's durable
//!   record (signal and wake committed).
//! - the floor: an inotify watch (`IN_MODIFY`) in the bench itself, blocked in `poll(2)`,
//!   turning readable: what any watcher of a file must wait for.
//! - `tail -n0 -F FILE | grep -m1 --line-buffered PATTERN`: started on the file and given
//!   time to open it, then the append; the time until grep printed the line (read by the
//!   bench on grep's stdout).

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::json;

use super::daemons::{AGENT_ENDED, Agent, HUB_RECORDED, Hub, now_ns};
use crate::bench_kit::procs::poll_every;

/// One cortex sample, in µs after the append.
pub struct Sample {
    pub agent_us: f64,
    pub record_us: f64,
}

/// Appends `line` (a newline added) in one write, returning the clock read just before it.
fn append(path: &Path, line: &str) -> anyhow::Result<i128> {
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let bytes = format!("{line}\n");
    let t = now_ns();
    f.write_all(bytes.as_bytes())
        .with_context(|| format!("appending to {}", path.display()))?;
    Ok(t)
}

/// Lines that do not match, then a pause: the watcher has read past them before the match.
fn noise(path: &Path, n: usize) -> anyhow::Result<()> {
    for i in 0..n {
        append(path, &format!("step {i} loss=0.{i:04} lr=3e-4"))?;
    }
    std::thread::sleep(Duration::from_millis(20));
    Ok(())
}

/// One remote log wait on `path`, armed, fired by an appended line.
pub fn cortex_once(
    hub: &Hub,
    agent: &Agent,
    device: &str,
    path: &Path,
    n: usize,
) -> anyhow::Result<Sample> {
    let tag = format!("MATCH-{n:06}");
    let (wp, _) = super::latency::arm(
        hub,
        device,
        json!({
            "kind": "log",
            "path": path.to_string_lossy(),
            "match": format!("nan|{tag}"),
            "timeout_s": 600
        }),
    )?;
    noise(path, 3)?;
    let t_append = append(path, &format!("step {n} loss=0.5 {tag}"))?;
    let timed = |timing: &super::daemons::Timing, what: &str, who: &str| {
        poll_every(
            Duration::from_millis(2),
            Duration::from_secs(5),
            &format!("the {who}'s {what} record for {wp}"),
            || timing.take(what, &wp),
        )
    };
    let t_record = timed(&hub.timing, HUB_RECORDED, "hub")?;
    let t_agent = timed(&agent.timing, AGENT_ENDED, "agent")?;
    let us = |t: i128| (t - t_append) as f64 / 1_000.0;
    Ok(Sample {
        agent_us: us(t_agent),
        record_us: us(t_record),
    })
}

/// The floor: µs from the append to an inotify watch on the file, in the bench, turning
/// readable.
pub fn inotify_once(path: &Path) -> anyhow::Result<f64> {
    use rustix::event::{PollFd, PollFlags, poll};
    if !path.exists() {
        append(path, "the floor's file")?;
    }
    let mut ino = inotify::Inotify::init().context("inotify_init")?;
    ino.watches()
        .add(path, inotify::WatchMask::MODIFY)
        .with_context(|| format!("watching {}", path.display()))?;
    noise(path, 3)?;
    // Drain what the noise made.
    let mut buf = [0u8; 4096];
    while ino
        .read_events(&mut buf)
        .is_ok_and(|mut e| e.next().is_some())
    {}
    let t = append(path, "the floor's line")?;
    let mut fds = [PollFd::new(&ino, PollFlags::IN)];
    poll(&mut fds, None).context("poll on inotify")?;
    let seen = now_ns();
    Ok((seen - t) as f64 / 1_000.0)
}

/// `tail -n0 -F FILE | grep -m1 --line-buffered PATTERN`: µs from the append to grep's
/// printed line.
pub fn tail_grep_once(path: &Path, n: usize) -> anyhow::Result<f64> {
    let tag = format!("TAIL-{n:06}");
    let mut tail = Command::new("tail")
        .args(["-n0", "-F"])
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting tail -F")?;
    let tail_out = tail.stdout.take().context("tail's stdout")?;
    let grep = Command::new("grep")
        .args(["-m1", "--line-buffered", &tag])
        .stdin(tail_out)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut grep = match grep {
        Ok(g) => g,
        Err(e) => {
            let _ = tail.kill();
            let _ = tail.wait();
            return Err(e).context("starting grep");
        }
    };
    let result = (|| -> anyhow::Result<f64> {
        // tail opens the file, seeks to its end and sets its inotify watch.
        std::thread::sleep(Duration::from_millis(300));
        noise(path, 3)?;
        let t = append(path, &format!("step {n} loss=0.5 {tag}"))?;
        let out = grep.stdout.take().context("grep's stdout")?;
        let mut line = String::new();
        BufReader::new(out)
            .read_line(&mut line)
            .context("reading grep's line")?;
        let seen = now_ns();
        ensure!(line.contains(&tag), "grep printed {line:?}");
        Ok((seen - t) as f64 / 1_000.0)
    })();
    let _ = tail.kill();
    let _ = tail.wait();
    let _ = grep.kill();
    let _ = grep.wait();
    result
}

/// Arms `n` idle waits on the device, half log waits (with a pattern that never matches and
/// an hour of silence) and half silence waits (an hour), each on its own file in `dir`;
/// returns once the agent confirmed them all.
pub fn arm_idle(hub: &Hub, device: &str, dir: &Path, n: usize) -> anyhow::Result<Duration> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let start = std::time::Instant::now();
    for i in 0..n {
        let path = dir.join(format!("run-{i:04}.log"));
        append(&path, "started")?;
        let body = if i % 2 == 0 {
            json!({"kind": "log", "path": path.to_string_lossy(), "match": "never-printed-[0-9]{9}",
                   "silence": "1h", "timeout_s": 7200})
        } else {
            json!({"kind": "file", "path": path.to_string_lossy(), "silence": "1h", "timeout_s": 7200})
        };
        hub.api(
            "POST",
            &format!("/api/devices/{device}/waits"),
            Some(body),
            201,
        )?;
    }
    poll_every(
        Duration::from_millis(50),
        Duration::from_secs(120),
        "every log and silence wait armed on the device",
        || {
            let d = hub.api("GET", &format!("/api/devices/{device}"), None, 200)?;
            let list = d["wait_list"].as_array().context("no wait_list")?;
            let armed = list.iter().filter(|w| w["state"] == "armed").count();
            Ok((armed == n).then(|| start.elapsed()))
        },
    )
}
