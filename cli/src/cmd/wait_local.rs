//! `cortex wait pid|file|flock`: waits on this machine, no hub involved. The
//! waiting itself is `cortex_host::wait`, the same code the device agent runs for
//! remote waits; this module owns only the command line around it: the flags, the one
//! "armed" line on stderr, the payload on stdout, the exit status (0 fired, 1 timed out,
//! 2 broke), and the `--cursor` file of a file wait. With `--device NAME` the same
//! commands are remote waits, run by `wait_remote.rs` instead.
//!
//! A current-thread Tokio runtime is built here, inside these commands only, so the rest
//! of `cortex` (and `cortex-signal`) starts no runtime. SIGINT and SIGTERM end the wait
//! as "broke" (2): it stopped looking, and says so; everything it held is released by
//! dropping it.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use cortex_host::wait::{
    Captured, Cursor, FileCursor, Gone, PidMethod, WaitOptions, WaitOutcome, WaitSpec, Waits,
};
use serde::{Deserialize, Serialize};

use super::parse_duration;
use super::wait_for::{BROKE, FIRED, TIMED_OUT};
use crate::timefmt::{human, utc};

/// The bound and liveness flags every local wait takes.
#[derive(Debug, Clone, Args)]
pub struct Bound {
    /// Give up after this long and exit 1 (30s, 10m, 2h, 1.5h, 1d, or seconds)
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "24h")]
    pub timeout: Duration,
    /// Touch this file (create it, then update its mtime) while waiting, so a dead wait
    /// and a quiet one can be told apart by the file's age
    #[arg(long, value_name = "PATH")]
    pub heartbeat: Option<PathBuf>,
    /// How often to touch the --heartbeat file
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "10s")]
    pub heartbeat_every: Duration,
    /// Wait on this connected device instead, through the hub and the device's agent
    /// (a waitpoint bound to the device; the wake goes to --session, or a new session)
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    /// With --device: the session the wake goes to [default: a new session for this wait]
    #[arg(long, value_name = "SID", requires = "device")]
    pub session: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct PidArgs {
    /// The process to wait for (any process, not only a child)
    #[arg(value_name = "PID", allow_negative_numbers = true)]
    pub pid: i32,
    /// Its start time (field 22 of /proc/PID/stat, as the armed line prints it): when
    /// re-arming, makes sure another process that got the same pid is not waited on
    #[arg(long, value_name = "TICKS")]
    pub start_time: Option<u64>,
    #[command(flatten)]
    pub bound: Bound,
}

#[derive(Debug, Clone, Args)]
pub struct FileArgs {
    /// The file to wait for a write to (it may not exist yet)
    #[arg(value_name = "PATH")]
    pub path: PathBuf,
    /// Keep the position in this file: read when armed (a change since fires at once),
    /// written when armed and when fired, so a re-arm neither misses a write nor reports
    /// one twice
    #[arg(long, value_name = "FILE")]
    pub cursor: Option<PathBuf>,
    #[command(flatten)]
    pub bound: Bound,
}

#[derive(Debug, Clone, Args)]
pub struct FlockArgs {
    /// The lock file (as `flock FILE …` names it); it must exist
    #[arg(value_name = "PATH")]
    pub path: PathBuf,
    #[command(flatten)]
    pub bound: Bound,
}

/// The local waits, flattened into `cortex wait`'s subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum LocalWait {
    /// Wait for a process to exit, on this machine (no hub needed) or with --device on a
    /// connected device; print one JSON line (exit 0 exited, 1 timed out, 2 broke)
    Pid(PidArgs),
    /// Wait for a file to be written (closed after writing, moved into place, created),
    /// here or with --device on a device; never fires on a read (exit 0 written,
    /// 1 timed out, 2 broke)
    File(FileArgs),
    /// Wait for a flock(2) lock to be free, as `flock FILE true` would, without holding
    /// it, here or with --device on a device (exit 0 free, 1 timed out, 2 broke)
    Flock(FlockArgs),
}

impl LocalWait {
    /// The flags every kind shares.
    pub fn bound(&self) -> &Bound {
        match self {
            LocalWait::Pid(a) => &a.bound,
            LocalWait::File(a) => &a.bound,
            LocalWait::Flock(a) => &a.bound,
        }
    }

    /// `--device NAME`: a remote wait.
    pub fn device(&self) -> Option<&str> {
        self.bound().device.as_deref()
    }
}

/// Runs one local wait; returns the exit status.
pub fn run(wait: &LocalWait, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    match wait {
        LocalWait::Pid(a) => pid(a, out, err),
        LocalWait::File(a) => file(a, out, err),
        LocalWait::Flock(a) => flock(a, out, err),
    }
}

/// What `--cursor FILE` holds.
#[derive(Debug, Serialize, Deserialize)]
struct CursorFile {
    path: PathBuf,
    cursor: FileCursor,
}

pub fn pid(args: &PidArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let spec = WaitSpec::Pid {
        pid: args.pid,
        start_time: args.start_time,
    };
    wait(spec, &args.bound, None, out, err)
}

pub fn file(args: &FileArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let prepared = spec_path(&args.path).and_then(|path| {
        let cursor = match &args.cursor {
            Some(f) => Some(CursorStore::open(f, Path::new(&path))?),
            None => None,
        };
        Ok((path, cursor))
    });
    let (path, store) = match prepared {
        Ok(p) => p,
        Err(e) => return broke(err, &e),
    };
    let spec = WaitSpec::File {
        path,
        cursor: store.as_ref().and_then(|s| s.loaded),
        silence_ms: None,
    };
    wait(spec, &args.bound, store.as_ref(), out, err)
}

pub fn flock(args: &FlockArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    match spec_path(&args.path) {
        Ok(path) => wait(WaitSpec::Flock { path }, &args.bound, None, out, err),
        Err(e) => broke(err, &e),
    }
}

fn broke(err: &mut dyn Write, e: &anyhow::Error) -> u8 {
    let _ = writeln!(err, "cortex: {e:#}");
    BROKE
}

/// Absolute without resolving links: the payload names the path the user meant.
fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("cannot make {} absolute", path.display()))
}

/// The path a wait's spec carries: absolute, and UTF-8 (the same spec a remote wait sends).
fn spec_path(path: &Path) -> anyhow::Result<String> {
    absolute(path)?.into_os_string().into_string().map_err(|p| {
        anyhow::anyhow!(
            "{} is not a UTF-8 path; cortex waits only for UTF-8 paths",
            Path::new(&p).display()
        )
    })
}

fn wait(
    spec: WaitSpec,
    bound: &Bound,
    store: Option<&CursorStore>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return broke(err, &anyhow::Error::new(e).context("starting the runtime")),
    };
    let opts = WaitOptions {
        timeout: bound.timeout,
        heartbeat: bound.heartbeat.clone(),
        heartbeat_every: bound.heartbeat_every,
    };
    rt.block_on(async {
        let armed = match Waits::new().arm(&spec) {
            Ok(a) => a,
            Err(e) => return broke(err, &e.into()),
        };
        let captured = armed.captured();
        let _ = writeln!(err, "cortex: {}", armed_line(&captured, bound, store));
        let _ = err.flush();
        // The position goes to disk before waiting: killed now, a re-arm still knows
        // where this wait started.
        if let (
            Some(store),
            WaitSpec::File {
                cursor: Some(c), ..
            },
        ) = (store, armed.resume_spec())
            && let Err(e) = store.save(&c)
        {
            return broke(err, &e);
        }
        let outcome = tokio::select! {
            o = armed.wait(&opts) => o,
            why = cortex_host::daemon::shutdown_signal() => {
                let _ = writeln!(err, "cortex: cancelled by {why}; nothing fired");
                return BROKE;
            }
        };
        finish(outcome, &captured, bound, store, out, err)
    })
}

fn finish(
    outcome: WaitOutcome,
    captured: &Captured,
    bound: &Bound,
    store: Option<&CursorStore>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    match outcome {
        WaitOutcome::Fired(fire) => {
            if let (Some(store), Some(c)) = (store, fire.cursor.and_then(Cursor::file))
                && let Err(e) = store.save(&c)
            {
                // Not printed as fired: the same change is reported again on re-arm, since
                // the old position is still on disk. Nothing is lost.
                return broke(
                    err,
                    &e.context("the file changed, but its new position could not be saved"),
                );
            }
            let printed = serde_json::to_string(&fire.payload)
                .map_err(io::Error::other)
                .and_then(|line| writeln!(out, "{line}"))
                .and_then(|()| out.flush());
            match printed {
                Ok(()) => FIRED,
                Err(e) => broke(err, &anyhow::Error::new(e).context("writing the payload")),
            }
        }
        WaitOutcome::TimedOut => {
            let what = match captured {
                Captured::Pid(c) => format!("pid {} is still running", c.pid),
                Captured::File(c) => format!("no write to {}", c.path.display()),
                Captured::Flock(c) => format!("the lock on {} is still held", c.path.display()),
                Captured::Log(c) => {
                    format!("no line matching /{}/ in {}", c.pattern, c.path.display())
                }
                Captured::Any(_) => "none of the conditions holds".to_string(),
            };
            let _ = writeln!(
                err,
                "cortex: timed out after {}: {what}; run the same command again to keep waiting",
                human(bound.timeout)
            );
            TIMED_OUT
        }
        WaitOutcome::Broke(e) => broke(err, &e.into()),
    }
}

/// The one line on arm: what is watched, what was captured, the bound.
fn armed_line(c: &Captured, bound: &Bound, store: Option<&CursorStore>) -> String {
    let mut tail = format!("at most {}", human(bound.timeout));
    if let Some(h) = &bound.heartbeat {
        tail.push_str(&format!(
            "; heartbeat {} every {}",
            h.display(),
            human(bound.heartbeat_every)
        ));
    }
    match c {
        Captured::Pid(p) => {
            let who = match (&p.comm, p.start_time) {
                (Some(comm), Some(st)) => {
                    let at = p
                        .started_at_ms
                        .map(|ms| format!("started {}, ", utc(ms)))
                        .unwrap_or_default();
                    format!("{comm}, {at}start time {st}")
                }
                (None, Some(st)) => format!("start time {st}"),
                _ => "unknown".to_string(),
            };
            match p.gone {
                Some(Gone::NoProcess) => {
                    format!("pid {} was already gone when armed; firing at once", p.pid)
                }
                Some(Gone::Exited) => format!(
                    "pid {} ({who}) had already exited when armed; firing at once",
                    p.pid
                ),
                Some(Gone::Reused { now }) => format!(
                    "pid {} now belongs to another process (start time {now}, not {}): the one meant is gone; firing at once",
                    p.pid,
                    p.start_time.unwrap_or_default()
                ),
                None => {
                    let how = match p.method {
                        PidMethod::Pidfd => "",
                        PidMethod::Poll => "; no pidfd here, polling every 0.5s",
                    };
                    format!("waiting for pid {} ({who}) to exit{how}; {tail}", p.pid)
                }
            }
        }
        Captured::File(f) => {
            let now = if f.now.exists {
                format!(
                    "{} bytes, modified {}",
                    f.now.size,
                    utc((f.now.mtime_ns / 1_000_000).max(0) as u64)
                )
            } else {
                "does not exist yet".to_string()
            };
            let cursor = store
                .map(|s| match s.loaded {
                    Some(_) => format!("; cursor {}", s.file.display()),
                    None => format!("; new cursor {}", s.file.display()),
                })
                .unwrap_or_default();
            match f.since {
                Some(since) if f.now.changed_since(&since) => format!(
                    "{} changed since the cursor ({now}); firing at once",
                    f.path.display()
                ),
                _ => format!(
                    "waiting for a write to {} ({now}{cursor}); {tail}",
                    f.path.display()
                ),
            }
        }
        Captured::Log(l) => format!(
            "waiting for a line matching /{}/ in {}; {tail}",
            l.pattern,
            l.path.display()
        ),
        Captured::Any(_) => format!("waiting for the first of several conditions; {tail}"),
        Captured::Flock(l) => {
            if l.free {
                format!("the lock on {} is free; firing at once", l.path.display())
            } else {
                let how = if l.hinted {
                    ""
                } else {
                    "; closes not watched, probing every second at most"
                };
                format!(
                    "waiting for the lock on {} to be free (held now){how}; {tail}",
                    l.path.display()
                )
            }
        }
    }
}

/// The `--cursor FILE` of a file wait.
struct CursorStore {
    file: PathBuf,
    path: PathBuf,
    loaded: Option<FileCursor>,
}

impl CursorStore {
    /// Reads the cursor file if it exists; one kept for another path is refused.
    fn open(file: &Path, path: &Path) -> anyhow::Result<CursorStore> {
        let file = absolute(file)?;
        let loaded = match fs::read(&file) {
            Ok(bytes) => {
                let c: CursorFile = serde_json::from_slice(&bytes).with_context(|| {
                    format!(
                        "{} is not a cursor file of cortex wait file (remove it to start afresh)",
                        file.display()
                    )
                })?;
                anyhow::ensure!(
                    c.path == path,
                    "{} holds the cursor of {}, not of {}; give each file its own cursor file",
                    file.display(),
                    c.path.display(),
                    path.display()
                );
                Some(c.cursor)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("cannot read the cursor file {}", file.display())));
            }
        };
        Ok(CursorStore {
            file,
            path: path.to_owned(),
            loaded,
        })
    }

    /// Replaces the cursor file atomically and durably (`cortex_host::atomic`).
    fn save(&self, cursor: &FileCursor) -> anyhow::Result<()> {
        let mut body = serde_json::to_vec(&CursorFile {
            path: self.path.clone(),
            cursor: *cursor,
        })?;
        body.push(b'\n');
        cortex_host::atomic::write_file(&self.file, &body, 0o666)
            .with_context(|| format!("cannot write the cursor file {}", self.file.display()))
    }
}
