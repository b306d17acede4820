//! Waiting for a process to exit, any process, not only our children.
//!
//! The process is identified by its pid *and* its start time (`/proc/<pid>/stat` field 22,
//! clock ticks since boot), so a pid handed to another process is never taken for the one
//! we meant. The order matters: the pidfd is opened first and pins the process it names;
//! the start time read afterwards is then that process's, and is compared with the one the
//! caller gave (if any). A mismatch means the process we meant exited and its pid was
//! reused: the wait fires at once, saying so.
//!
//! How it blocks: `pidfd_open(2)` (Linux 5.3) gives a descriptor that turns readable when
//! the process exits; it is registered with Tokio's reactor, so a waiting pid costs no
//! thread and no syscall until it fires. The registration uses `AsyncFd::with_interest`,
//! which tokio 1.54 deprecates because a generic `AsRawFd` type may change or close its
//! descriptor behind the reactor's back; an [`OwnedFd`] cannot, which makes that call sound
//! here, and it is the same call the `inotify` crate's stream makes. The workspace forbids
//! `unsafe`, which rules out `AsyncFd::register`; the other safe road, a `spawn_blocking`
//! poll(2) per pid with a cancel pipe, would cost a blocked thread per waiting pid in the
//! device agent.
//!
//! Fallback: where `pidfd_open` is missing (`ENOSYS`, kernels before 5.3) or filtered by a
//! seccomp profile (`EPERM`), the wait asks every [`POLL_EVERY`]: `kill(pid, 0)` (`ESRCH`
//! gone, `EPERM` alive) plus the start time and state from `/proc/<pid>/stat` (a different
//! start time is another process, a zombie has exited). The payload says `"method":"poll"`.
//!
//! It never signals, never reaps, and never holds anything but the pidfd.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags};
use serde_json::{Value, json};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::{Fire, WaitError};

/// How often the fallback asks whether the process is still there.
pub const POLL_EVERY: Duration = Duration::from_millis(500);

/// The unit of `/proc` tick counts (`sysconf(_SC_CLK_TCK)`): fixed at 100 by the kernel's
/// ABI on every architecture this runs on. Used only to show a start time to people.
const USER_HZ: u64 = 100;

/// What `/proc/<pid>/stat` says about a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 2, without its parentheses (at most 15 bytes, may hold spaces and parentheses).
    pub comm: String,
    /// Field 3: `R`, `S`, `D`, `Z` (exited, not yet reaped), `X`, …
    pub state: char,
    /// Field 6: the session id as this pid namespace sees it; 0 when the session's leader
    /// lies outside the namespace (a container's processes started from outside).
    pub session: i32,
    /// Field 22: start time in clock ticks since boot.
    pub start_time: u64,
}

impl ProcStat {
    /// A zombie (`Z`) or dead (`X`) process has exited; only its entry remains.
    pub fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }
}

/// Parses one `/proc/<pid>/stat` line. Fields are counted after the *last* `)`, since the
/// command name may itself hold `) ` and spaces.
pub fn parse_stat(line: &str) -> Option<ProcStat> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let comm = line.get(open + 1..close)?.to_string();
    let mut rest = line.get(close + 1..)?.split_ascii_whitespace();
    // `rest` starts at field 3 (state); field 6 is 3 further on, field 22 16 after that.
    let state = rest.next()?.chars().next()?;
    let session = rest.nth(2)?.parse().ok()?;
    let start_time = rest.nth(15)?.parse().ok()?;
    Some(ProcStat {
        comm,
        state,
        session,
        start_time,
    })
}

/// Is the process now at this pid the one the caller meant?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// No start time was given: whatever holds the pid now is taken as the one.
    Adopted,
    /// The start time matches.
    Same,
    /// Another process holds the pid: the one meant has exited.
    Reused,
}

/// Compares the start time the caller expects with the one observed after the pidfd was
/// opened. Pure, so a reused pid can be tested without forcing pid wrap-around.
pub fn identify(expected: Option<u64>, observed: u64) -> Identity {
    match expected {
        None => Identity::Adopted,
        Some(e) if e == observed => Identity::Same,
        Some(_) => Identity::Reused,
    }
}

/// Reads and parses `/proc/<pid>/stat`. `Ok(None)`: no such entry (the process is gone, or
/// hidden from us).
pub fn read_stat(pid: i32) -> io::Result<Option<ProcStat>> {
    let path = format!("/proc/{pid}/stat");
    match fs::read_to_string(&path) {
        Ok(line) => parse_stat(&line).map(Some).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, format!("cannot parse {path}"))
        }),
        // ESRCH: the entry was open while the process was reaped.
        Err(e)
            if e.kind() == io::ErrorKind::NotFound
                || Errno::from_io_error(&e) == Some(Errno::SRCH) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The wall-clock time (ms since the epoch) a process started, from its start time in
/// ticks and the boot time in `/proc/stat`. For people only: the boot time has a resolution
/// of a second, and identity is always the tick count.
pub fn started_at_ms(start_time: u64) -> Option<u64> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let btime: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(btime * 1000 + start_time.saturating_mul(1000) / USER_HZ)
}

/// How the exit is detected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PidMethod {
    Pidfd,
    Poll,
}

impl PidMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            PidMethod::Pidfd => "pidfd",
            PidMethod::Poll => "poll",
        }
    }
}

/// What was found at arm time, for the caller's "armed" line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PidCaptured {
    pub pid: i32,
    /// `None` when the process was gone before it could be read.
    pub comm: Option<String>,
    /// The identity: the caller's, or the one read at arm time.
    pub start_time: Option<u64>,
    pub started_at_ms: Option<u64>,
    pub method: PidMethod,
    /// Why it fired at arm time, if it did.
    pub gone: Option<Gone>,
}

/// Why a pid wait fired without waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gone {
    /// No process has this pid.
    NoProcess,
    /// It has exited (a zombie, or its pidfd is already readable).
    Exited,
    /// Another process (a different start time) holds the pid now.
    Reused { now: u64 },
}

impl Gone {
    fn note(self, pid: i32) -> String {
        match self {
            Gone::NoProcess => format!("pid {pid} was already gone when the wait was armed"),
            Gone::Exited => format!("pid {pid} had already exited when the wait was armed"),
            Gone::Reused { now } => format!(
                "the process we meant is gone; pid {pid} now belongs to another process (start time {now})"
            ),
        }
    }
}

enum Watch {
    Pidfd(AsyncFd<OwnedFd>),
    Poll,
    /// Fired at arm time: nothing to hold.
    Done,
}

pub(crate) struct PidWait {
    captured: PidCaptured,
    watch: Watch,
}

impl std::fmt::Debug for PidWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PidWait")
            .field("captured", &self.captured)
            .finish_non_exhaustive()
    }
}

/// Arms a pid wait; `force_poll` skips pidfd (tests of the fallback).
pub(crate) fn arm(pid: i32, expected: Option<u64>, force_poll: bool) -> Result<PidWait, WaitError> {
    // Checked first: `Pid::from_raw` asserts on a negative number.
    let Some(rpid) = (pid > 0).then(|| Pid::from_raw(pid)).flatten() else {
        return Err(WaitError::BadPid { pid });
    };
    let pidfd = if force_poll {
        None
    } else {
        match rustix::process::pidfd_open(rpid, PidfdFlags::empty()) {
            Ok(fd) => Some(fd),
            Err(Errno::SRCH) => {
                return Ok(gone_at_arm(
                    pid,
                    expected,
                    PidMethod::Pidfd,
                    Gone::NoProcess,
                    None,
                ));
            }
            Err(Errno::NOSYS | Errno::PERM) => None,
            Err(Errno::INVAL) => return Err(WaitError::NotAProcess { pid }),
            Err(e) => {
                return Err(WaitError::Pid {
                    pid,
                    action: "open a pidfd for",
                    source: e.into(),
                });
            }
        }
    };
    let method = if pidfd.is_some() {
        PidMethod::Pidfd
    } else {
        PidMethod::Poll
    };
    // Read only now: with the pidfd open, the process at `pid` cannot change under us
    // unless the one we hold has exited, which the pidfd will say.
    let stat = read_stat(pid).map_err(|source| WaitError::Pid {
        pid,
        action: "read /proc/<pid>/stat of",
        source,
    })?;
    let exited_now = match &pidfd {
        Some(fd) => readable_now(fd).map_err(|source| WaitError::Pid {
            pid,
            action: "poll the pidfd of",
            source,
        })?,
        None => !alive(rpid)?,
    };
    let Some(stat) = stat else {
        if exited_now {
            return Ok(gone_at_arm(pid, expected, method, Gone::NoProcess, None));
        }
        // Alive (its pidfd is quiet, or kill(0) reaches it) yet no /proc entry: procfs is
        // mounted with hidepid, or in another pid namespace.
        return Err(WaitError::NotVisible { pid });
    };
    if identify(expected, stat.start_time) == Identity::Reused {
        let gone = Gone::Reused {
            now: stat.start_time,
        };
        return Ok(gone_at_arm(pid, expected, method, gone, Some(&stat.comm)));
    }
    if exited_now || stat.exited() {
        return Ok(gone_at_arm(
            pid,
            Some(stat.start_time),
            method,
            Gone::Exited,
            Some(&stat.comm),
        ));
    }
    let watch = match pidfd {
        Some(fd) => {
            // Sound for an OwnedFd (see the module docs); `register_with_interest` needs unsafe.
            #[allow(deprecated)]
            let afd = AsyncFd::with_interest(fd, Interest::READABLE).map_err(|source| {
                WaitError::Pid {
                    pid,
                    action: "register the pidfd of",
                    source,
                }
            })?;
            Watch::Pidfd(afd)
        }
        None => Watch::Poll,
    };
    Ok(PidWait {
        captured: PidCaptured {
            pid,
            comm: Some(stat.comm),
            start_time: Some(stat.start_time),
            started_at_ms: started_at_ms(stat.start_time),
            method,
            gone: None,
        },
        watch,
    })
}

fn gone_at_arm(
    pid: i32,
    start_time: Option<u64>,
    method: PidMethod,
    gone: Gone,
    comm: Option<&str>,
) -> PidWait {
    PidWait {
        captured: PidCaptured {
            pid,
            comm: comm.map(str::to_string),
            start_time,
            started_at_ms: start_time.and_then(started_at_ms),
            method,
            gone: Some(gone),
        },
        watch: Watch::Done,
    }
}

/// Has the pidfd turned readable (the process exited)? Does not block.
fn readable_now(fd: &OwnedFd) -> io::Result<bool> {
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero))?;
    Ok(!fds[0].revents().is_empty())
}

/// `kill(pid, 0)`: `EPERM` means it exists but is not ours to signal.
fn alive(pid: Pid) -> Result<bool, WaitError> {
    match rustix::process::test_kill_process(pid) {
        Ok(()) | Err(Errno::PERM) => Ok(true),
        Err(Errno::SRCH) => Ok(false),
        Err(e) => Err(WaitError::Pid {
            pid: pid.as_raw_nonzero().get(),
            action: "kill(0)",
            source: e.into(),
        }),
    }
}

impl PidWait {
    pub(crate) fn captured(&self) -> &PidCaptured {
        &self.captured
    }

    /// The payload if it fired at arm time.
    pub(crate) fn ready(&self) -> Option<Fire> {
        self.captured.gone.map(|g| self.fire(Some(g)))
    }

    pub(crate) fn resume_start_time(&self) -> Option<u64> {
        self.captured.start_time
    }

    fn fire(&self, gone: Option<Gone>) -> Fire {
        let c = &self.captured;
        let mut payload = json!({
            "kind": "pid",
            "pid": c.pid,
            "start_time": c.start_time,
            "exited": true,
            "already_gone": gone.is_some(),
            "method": c.method.as_str(),
        });
        if let Some(g) = gone
            && let Value::Object(m) = &mut payload
        {
            if matches!(g, Gone::Reused { .. }) {
                m.insert("reused".into(), Value::Bool(true));
            }
            m.insert("note".into(), Value::String(g.note(c.pid)));
        }
        Fire {
            payload,
            cursor: None,
        }
    }

    /// Until the process exits. Dropping the future leaves nothing behind; dropping the
    /// wait closes the pidfd.
    pub(crate) async fn until_fired(&mut self) -> Result<Fire, WaitError> {
        let pid = self.captured.pid;
        match &self.watch {
            Watch::Done => Ok(self.fire(self.captured.gone)),
            Watch::Pidfd(afd) => {
                // Readable once, forever: no need to clear the readiness.
                let _ready = afd.readable().await.map_err(|source| WaitError::Pid {
                    pid,
                    action: "wait on the pidfd of",
                    source,
                })?;
                Ok(self.fire(None))
            }
            Watch::Poll => {
                let rpid = (pid > 0)
                    .then(|| Pid::from_raw(pid))
                    .flatten()
                    .ok_or(WaitError::BadPid { pid })?;
                let mut tick = tokio::time::interval(POLL_EVERY);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    if !self.still_there(rpid)? {
                        return Ok(self.fire(None));
                    }
                }
            }
        }
    }

    /// The fallback's check: the pid answers, and it is still the same, running process.
    fn still_there(&self, rpid: Pid) -> Result<bool, WaitError> {
        let pid = self.captured.pid;
        if !alive(rpid)? {
            return Ok(false);
        }
        let stat = read_stat(pid).map_err(|source| WaitError::Pid {
            pid,
            action: "read /proc/<pid>/stat of",
            source,
        })?;
        Ok(match stat {
            None => false,
            Some(s) => {
                !s.exited() && identify(self.captured.start_time, s.start_time) != Identity::Reused
            }
        })
    }

    /// The descriptor this wait holds, if any (tests check it is closed on drop).
    #[cfg(test)]
    pub(crate) fn pidfd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        match &self.watch {
            Watch::Pidfd(afd) => Some(afd.get_ref().as_fd()),
            _ => None,
        }
    }
}
