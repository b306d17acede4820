//! Process exit to "someone knows", for a remote pid wait and for the polling ways people
//! use today, measured on the same kind of process in the same run.
//!
//! The process: a minimal program built at the bench's start (see [`EXIT_CHILD_SRC`]). It
//! blocks on its stdin; given a byte, it reads the realtime clock, writes that time to its
//! stdout and exits. So the exit's time is known from inside rather than guessed from a
//! `kill` outside. What follows the clock read is the kernel's teardown of the process,
//! which every watcher pays alike; the floor row shows it. The bench reads the time only
//! after the sample, so no bench thread is woken during it.
//!
//! - cortex: a remote pid wait armed (and confirmed armed by the agent) on the process;
//!   then the exit. Three points: the agent's log line when the wait's task reported (the
//!   pidfd woke and the loop had the outcome), the hub's log line after the commit holding
//!   the signal and the wake returned (the durable record), and the moment a long poll of
//!   the session's events (started before the exit) answered with the wake (what a client
//!   sees).
//! - `tail --pid=PID -f /dev/null`, `while kill -0 PID; do sleep 5; done` and a 500 ms
//!   poll loop (ntfy-style): the watcher started on the process, the exit triggered after a
//!   random delay (so the exit falls anywhere in the watcher's period), and the time until
//!   the watcher exited (reaped by the bench).

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use serde_json::json;

use super::daemons::{AGENT_ENDED, Agent, HUB_RECEIVED, HUB_RECORDED, Hub, now_ns};
use crate::bench_kit::procs::poll_every;
use crate::bench_kit::request;

/// The exit child's source: wait for a byte on stdin, read the realtime clock, write it
/// to stdout, exit. Nothing else, so its exit is as quick as a process's can be: the
/// kernel's teardown of a process grows with what it mapped and touched (this xtask's own
/// debug binary took 330-410 us here, a static binary like this one 140-150 us, the same
/// program in C 138-144 us), and that time passes before any watcher can know.
const EXIT_CHILD_SRC: &str = r#"
use std::io::{Read, Write};
fn main() {
    let mut b = [0u8; 1];
    let _ = std::io::stdin().read(&mut b);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{t}");
    let _ = out.flush();
    std::process::exit(0);
}
"#;

/// A started exit-child, with a thread of the bench blocked in `wait` on it from the
/// start, as a job's shell waits on the job: it reaps the child the moment it exits, so
/// watchers that look for the pid (`kill -0`, `tail --pid`) see it gone as they would in
/// life, and every sample pays for that parent's wake-up alike.
pub struct ExitChild {
    stdin: Option<ChildStdin>,
    stdout: Option<ChildStdout>,
    reaper: Option<std::thread::JoinHandle<std::io::Result<std::process::ExitStatus>>>,
    pub pid: u32,
    started: std::time::Instant,
}

/// How long every exit child lives before it is made to exit, in the cortex runs and the
/// floor's alike. A process that sat idle exits more slowly than one just started (its
/// teardown runs cold: 113 us p50 at once, 165 us after 5 ms, 256 us after 30 ms here for
/// a small dynamic binary), so the floor is only the floor of the cortex runs if their
/// children are as old.
pub const CHILD_AGE: Duration = Duration::from_millis(30);

/// The exit child's binary, built by [`prepare`].
static CHILD_BIN: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Builds the exit child into `dir` with `rustc` (`$RUSTC` if set): static if this
/// machine has a static libc, else dynamic (slower to exit). Returns how it was linked.
pub fn prepare(dir: &std::path::Path) -> anyhow::Result<&'static str> {
    let src = dir.join("exit_child.rs");
    std::fs::write(&src, EXIT_CHILD_SRC).with_context(|| format!("writing {}", src.display()))?;
    let bin = dir.join("exit-child");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let build = |static_crt: bool| -> anyhow::Result<bool> {
        let mut c = Command::new(&rustc);
        c.args(["--edition", "2021", "-O", "-C", "panic=abort"]);
        if static_crt {
            c.args(["-C", "target-feature=+crt-static"]);
        }
        let out = c
            .arg("-o")
            .arg(&bin)
            .arg(&src)
            .stdin(Stdio::null())
            .output()
            .context("running rustc for the exit child")?;
        if !out.status.success() && !static_crt {
            bail!(
                "rustc could not build the exit child: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(out.status.success())
    };
    let linked = if build(true)? {
        "static"
    } else {
        build(false)?;
        "dynamic (no static libc here)"
    };
    let _ = CHILD_BIN.set(bin);
    Ok(linked)
}

impl ExitChild {
    pub fn start() -> anyhow::Result<ExitChild> {
        let exe = CHILD_BIN
            .get()
            .context("the exit child's binary was not prepared")?;
        let mut child = Command::new(exe)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the exit child")?;
        let (stdin, stdout, pid) = (child.stdin.take(), child.stdout.take(), child.id());
        let reaper = std::thread::Builder::new()
            .name("exit-child-reaper".into())
            .spawn(move || child.wait())
            .context("starting the exit child's reaper")?;
        Ok(ExitChild {
            stdin,
            stdout,
            reaper: Some(reaper),
            pid,
            started: std::time::Instant::now(),
        })
    }

    /// Waits until the child is [`CHILD_AGE`] old (at once if it is older).
    pub fn wait_for_age(&self) {
        if let Some(left) = CHILD_AGE.checked_sub(self.started.elapsed()) {
            std::thread::sleep(left);
        }
    }

    /// Makes it exit. Nothing in the bench reads its stdout until [`ExitChild::exit_time`],
    /// so only the reaper wakes while the exit is measured.
    pub fn trigger(&mut self) -> anyhow::Result<()> {
        let mut stdin = self.stdin.take().context("the child's stdin")?;
        stdin.write_all(b"x").context("triggering the child")?;
        Ok(())
    }

    /// After [`ExitChild::trigger`]: the time it read just before exiting (ns since the
    /// epoch), once it was reaped.
    pub fn exit_time(&mut self) -> anyhow::Result<i128> {
        let reaper = self.reaper.take().context("the exit child's reaper")?;
        let status = reaper
            .join()
            .map_err(|_| anyhow::anyhow!("the exit child's reaper panicked"))?
            .context("waiting for the exit child")?;
        ensure!(status.success(), "the exit child failed: {status}");
        let out = self.stdout.take().context("the child's stdout")?;
        let mut line = String::new();
        BufReader::new(out)
            .read_line(&mut line)
            .context("reading the exit time")?;
        line.trim()
            .parse()
            .with_context(|| format!("the child's exit time {line:?}"))
    }
}

impl Drop for ExitChild {
    /// Not triggered (a sample failed): its stdin closes, so it exits; then it is reaped.
    fn drop(&mut self) {
        drop(self.stdin.take());
        if let Some(r) = self.reaper.take() {
            let _ = r.join();
        }
    }
}

/// One cortex sample, in µs after the exit.
pub struct Sample {
    pub agent_us: f64,
    pub received_us: f64,
    pub record_us: f64,
    pub seen_us: f64,
}

/// Asks `device` for the remote wait `body` and returns once its agent confirmed it armed:
/// the waitpoint's id and its session's.
pub fn arm(hub: &Hub, device: &str, body: serde_json::Value) -> anyhow::Result<(String, String)> {
    let created = hub.api(
        "POST",
        &format!("/api/devices/{device}/waits"),
        Some(body),
        201,
    )?;
    let wp = created["id"]
        .as_str()
        .context("no waitpoint id")?
        .to_string();
    let sid = created["session"]
        .as_str()
        .context("no session")?
        .to_string();
    poll_every(
        Duration::from_millis(2),
        Duration::from_secs(10),
        "the wait armed on the device",
        || {
            let d = hub.api("GET", &format!("/api/devices/{device}"), None, 200)?;
            let armed = d["wait_list"].as_array().is_some_and(|l| {
                l.iter()
                    .any(|w| w["id"] == wp.as_str() && w["state"] == "armed")
            });
            Ok(armed.then_some(()))
        },
    )?;
    Ok((wp, sid))
}

/// One remote pid wait, armed, fired by the child's exit.
pub fn cortex_once(hub: &Hub, agent: &Agent, device: &str) -> anyhow::Result<Sample> {
    let mut child = ExitChild::start()?;
    let (wp, sid) = arm(
        hub,
        device,
        json!({"kind": "pid", "pid": child.pid, "timeout_s": 600}),
    )?;
    let session = hub.api("GET", &format!("/api/sessions/{sid}"), None, 200)?;
    let after = session["last_seq"].as_u64().unwrap_or(0);
    // The long poll is in flight before the exit.
    let (addr, path) = (
        hub.addr,
        format!("/api/sessions/{sid}/events?after={after}&wait=30"),
    );
    let token = hub.token().to_string();
    let poller = std::thread::spawn(move || -> anyhow::Result<(i128, serde_json::Value)> {
        let r = request(addr, "GET", &path, Some(&token), None)?;
        let t = now_ns();
        Ok((t, r.json("the long poll")?))
    });
    // Let the poll reach the hub and park.
    std::thread::sleep(Duration::from_millis(10));
    child.wait_for_age();
    child.trigger()?;
    let (t_seen, page) = poller
        .join()
        .map_err(|_| anyhow::anyhow!("the long poll's thread panicked"))??;
    let t_exit = child.exit_time()?;
    let woke = page["events"].as_array().is_some_and(|e| {
        e.iter()
            .any(|e| e["kind"] == "wake" && e["reason"] == "fired")
    });
    ensure!(woke, "the long poll answered without a fired wake: {page}");
    let timed = |timing: &super::daemons::Timing, what: &str, who: &str| {
        poll_every(
            Duration::from_millis(2),
            Duration::from_secs(5),
            &format!("the {who}'s {what} record for {wp}"),
            || timing.take(what, &wp),
        )
    };
    let t_record = timed(&hub.timing, HUB_RECORDED, "hub")?;
    let t_received = timed(&hub.timing, HUB_RECEIVED, "hub")?;
    let t_agent = timed(&agent.timing, AGENT_ENDED, "agent")?;
    let us = |t: i128| (t - t_exit) as f64 / 1_000.0;
    Ok(Sample {
        agent_us: us(t_agent),
        received_us: us(t_received),
        record_us: us(t_record),
        seen_us: us(t_seen),
    })
}

/// The floor: µs from the exit to a pidfd on it turning readable, watched by the bench
/// itself (a blocking poll(2), nothing else in between), for a child as old as the cortex
/// runs' ones.
pub fn pidfd_once() -> anyhow::Result<f64> {
    use rustix::event::{PollFd, PollFlags, poll};
    use rustix::process::{Pid, PidfdFlags, pidfd_open};
    let mut child = ExitChild::start()?;
    let pid = Pid::from_raw(child.pid as i32).context("the child's pid")?;
    let fd = pidfd_open(pid, PidfdFlags::empty()).context("pidfd_open")?;
    child.wait_for_age();
    child.trigger()?;
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    poll(&mut fds, None).context("poll on the pidfd")?;
    let t = now_ns();
    let t_exit = child.exit_time()?;
    Ok((t - t_exit) as f64 / 1_000.0)
}

/// A polling watcher people use today.
#[derive(Clone, Copy)]
pub enum Poller {
    TailPid,
    KillLoop5s,
    Poll500ms,
}

impl Poller {
    pub fn label(self) -> &'static str {
        match self {
            Poller::TailPid => "tail --pid=PID -f /dev/null",
            Poller::KillLoop5s => "while kill -0 $pid; do sleep 5; done",
            Poller::Poll500ms => "500 ms poll (ntfy-style)",
        }
    }

    /// The watcher's polling period: the exit is triggered a random time into it.
    pub fn period(self) -> Duration {
        match self {
            // coreutils tail checks the pid once per --sleep-interval, 1 s by default.
            Poller::TailPid => Duration::from_secs(1),
            Poller::KillLoop5s => Duration::from_secs(5),
            Poller::Poll500ms => Duration::from_millis(500),
        }
    }

    fn command(self, pid: u32) -> Command {
        match self {
            Poller::TailPid => {
                let mut c = Command::new("tail");
                c.arg(format!("--pid={pid}")).args(["-f", "/dev/null"]);
                c
            }
            Poller::KillLoop5s => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("while kill -0 {pid} 2>/dev/null; do sleep 5; done"));
                c
            }
            Poller::Poll500ms => {
                let mut c = Command::new("sh");
                c.arg("-c").arg(format!(
                    "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done"
                ));
                c
            }
        }
    }
}

/// One sample of `p`: µs from the exit to the watcher's own exit. `rng` spreads the exit
/// over the watcher's period.
pub fn poller_once(p: Poller, rng: &mut Rng) -> anyhow::Result<f64> {
    let mut child = ExitChild::start()?;
    let mut watcher = p
        .command(child.pid)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", p.label()))?;
    // Started and polling; then an exit anywhere in its period.
    let lead = Duration::from_millis(200);
    let period = p.period();
    let phase = Duration::from_secs_f64(period.as_secs_f64() * rng.unit());
    std::thread::sleep(lead + phase);
    if let Ok(Some(st)) = watcher.try_wait() {
        bail!("{} ended before the exit ({st})", p.label());
    }
    child.trigger()?;
    let st = watcher
        .wait()
        .with_context(|| format!("waiting for {}", p.label()))?;
    let t_done = now_ns();
    let t_exit = child.exit_time()?;
    ensure!(
        st.success() || matches!(p, Poller::KillLoop5s | Poller::Poll500ms),
        "{} failed: {st}",
        p.label()
    );
    Ok((t_done - t_exit) as f64 / 1_000.0)
}

/// xorshift64*: a spread of phases, no crate needed.
pub struct Rng(u64);

impl Rng {
    pub fn seeded() -> Rng {
        Rng((now_ns() as u64) | 1)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}
