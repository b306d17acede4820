//! `cortex wait pid|file|flock|log|any`: waits on this machine, no hub involved. The
//! waiting itself is `cortex_host::wait`, the same code the device agent runs for
//! remote waits; this module owns only the command line around it: the flags, the one
//! "armed" line on stderr, the payload on stdout, the exit status (0 fired, 1 timed out,
//! 2 broke), and the `--cursor` file of a file or log wait. `any`'s conditions
//! (`pid:N`, `log:PATH~REGEX`, …) are read by `cortex_protocol::waits::parse_condition`,
//! the one parser the hub uses too. With `--device NAME` the same commands are remote
//! waits, run by `wait_remote.rs` instead.
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
    Captured, Cursor, FileCursor, Gone, LogCursor, PidMethod, WaitOptions, WaitOutcome, WaitSpec,
    Waits,
};
use cortex_protocol::waits::{Place, format_duration_ms};
use serde::{Deserialize, Serialize};

use super::parse_duration;
use super::wait_exit::{BROKE, FIRED, TIMED_OUT};
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
    /// (a waitpoint bound to the device; the wake goes to --session, or to your default
    /// session). A device the hub does not know is refused (exit 2)
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    /// With --device: the session the wake goes to [default: the session titled
    /// "cortex waits ($USER)", made by the first such wait and shared by the next]
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
    /// Refuse (exit 2) a pid that is not running when the wait is armed, rather than
    /// fire at once with "already_gone": true. A process that ended just before the arm
    /// and a pid that never existed (a typo) look the same to the kernel, so this refuses
    /// both
    #[arg(long)]
    pub must_exist: bool,
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
    #[arg(long, value_name = "FILE", conflicts_with = "silence")]
    pub cursor: Option<PathBuf>,
    /// Fire instead when the file has not grown for this long (a writer gone quiet; any
    /// growth restarts the clock, a missing file does not grow); a write is then no event
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub silence: Option<Duration>,
    #[command(flatten)]
    pub bound: Bound,
}

#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    /// The log to watch (it may not exist yet: then it is read from its start when it
    /// comes); followed across a rotation by rename and a truncation
    #[arg(value_name = "PATH")]
    pub path: PathBuf,
    /// The regular expression a line must match (regex crate syntax); fires on the first
    /// complete line appended after the arm (or after --cursor) that matches
    #[arg(long = "match", value_name = "REGEX")]
    pub pattern: String,
    /// Also fire when the log has not grown for this long, whichever comes first
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub silence: Option<Duration>,
    /// Keep the position in this file: read when armed (lines appended since are read),
    /// written when armed and when fired (just after the matching line), so the next run
    /// starts after the match
    #[arg(long, value_name = "FILE")]
    pub cursor: Option<PathBuf>,
    #[command(flatten)]
    pub bound: Bound,
}

#[derive(Debug, Clone, Args)]
pub struct AnyArgs {
    /// The conditions, each one of pid:N, file:PATH, flock:PATH, log:PATH~REGEX,
    /// log:PATH~REGEX~DUR (a match or DUR of silence), silence:PATH~DUR
    #[arg(value_name = "COND", required = true, num_args = 1..)]
    pub conditions: Vec<String>,
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

const PID_AFTER_HELP: &str = "\
Examples:
  cortex wait pid 4242 --timeout 6h
  cortex wait pid 4242 --must-exist        # a typo'd pid is an error, not an instant fire
  cortex wait pid 4242 --device gpu1       # on a device, through the hub

A pid not running when the wait is armed fires at once with \"already_gone\": true in the
payload (the process may have ended a moment ago); --must-exist makes it an error (exit 2)
instead. The kernel cannot tell a process that ended before the arm from a pid that never
existed, so --must-exist refuses both.

With --device, the wake goes to --session, else to your default session (titled
\"cortex waits ($USER)\", made once and shared by the next such waits; `cortex session
delete` removes it and the next wait makes it again). A pid wait on a job the device
started (device_exec) knows its exit: a non-zero code or a signal exits 3.";

/// The local waits, flattened into `cortex wait`'s subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum LocalWait {
    /// Wait for a process to exit, on this machine (no hub needed) or with --device on a
    /// connected device; print one JSON line (exit 0 exited, 1 timed out, 2 broke)
    #[command(after_help = PID_AFTER_HELP)]
    Pid(PidArgs),
    /// Wait for a file to be written (closed after writing, moved into place, created),
    /// here or with --device on a device; never fires on a read (exit 0 written,
    /// 1 timed out, 2 broke)
    #[command(
        after_help = "Examples:\n  cortex wait file /data/run7/metrics.json --timeout 2h\n  cortex wait file out.log --silence 20m                  # the writer went quiet\n  cortex wait file out.csv --cursor ~/.cache/out.cursor   # re-armed, no write missed\n  cortex wait file /data/run7/done --device gpu1"
    )]
    File(FileArgs),
    /// Wait for a flock(2) lock to be free, as `flock FILE true` would, without holding
    /// it, here or with --device on a device (exit 0 free, 1 timed out, 2 broke)
    #[command(
        after_help = "Examples:\n  cortex wait flock /tmp/train.lock --timeout 6h\n  cortex wait flock /var/lock/gpu0.lock --device gpu1"
    )]
    Flock(FlockArgs),
    /// Wait for a line matching --match to be appended to a log (or, with --silence, for
    /// the log to go quiet), here or with --device on a device (exit 0 matched or silent,
    /// 1 timed out, 2 broke)
    #[command(
        after_help = "Examples:\n  cortex wait log train.log --match 'epoch 10/10|Traceback' --timeout 8h\n  cortex wait log train.log --match 'loss=nan' --silence 30m\n  cortex wait log /data/run7/train.log --match '^DONE' --device gpu1"
    )]
    Log(LogArgs),
    /// Wait for the first of several conditions (pid:N, file:PATH, flock:PATH,
    /// log:PATH~REGEX, silence:PATH~DUR), here or with --device on a device; the payload
    /// says which fired (exit 0 one fired, 1 timed out, 2 one broke)
    #[command(
        after_help = "Examples:\n  cortex wait any pid:4242 'log:/data/train.log~Traceback'\n  cortex wait any pid:4242 silence:/data/train.log~30m --device gpu1"
    )]
    Any(AnyArgs),
}

impl LocalWait {
    /// The flags every kind shares.
    pub fn bound(&self) -> &Bound {
        match self {
            LocalWait::Pid(a) => &a.bound,
            LocalWait::File(a) => &a.bound,
            LocalWait::Flock(a) => &a.bound,
            LocalWait::Log(a) => &a.bound,
            LocalWait::Any(a) => &a.bound,
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
        LocalWait::Log(a) => log(a, out, err),
        LocalWait::Any(a) => any(a, out, err),
    }
}

/// What `--cursor FILE` holds: a file wait's cursor, or a log wait's (`log`).
#[derive(Debug, Serialize, Deserialize)]
struct CursorFile {
    path: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cursor: Option<FileCursor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    log: Option<LogCursor>,
}

/// A position kept in a `--cursor` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kept {
    File(FileCursor),
    Log(LogCursor),
}

/// Which kind of cursor a `--cursor` file keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CursorKind {
    File,
    Log,
}

/// A duration in whole milliseconds.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Refuses what no wait takes (a silence out of range, a pattern that does not compile),
/// in the words the hub would use.
fn checked(spec: WaitSpec) -> anyhow::Result<WaitSpec> {
    cortex_protocol::waits::check(&spec, Place::Here)?;
    Ok(spec)
}

pub fn pid(args: &PidArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    // `--must-exist` is the wait library's rule (a pid not running at arm time is refused
    // with `WaitError::NotRunning`), the same on a device.
    let spec = WaitSpec::Pid {
        pid: args.pid,
        start_time: args.start_time,
        must_exist: args.must_exist,
    };
    wait_with(spec, &args.bound, None, out, err)
}

pub fn file(args: &FileArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let prepared = spec_path(&args.path).and_then(|path| {
        let (store, kept) = open_cursor(args.cursor.as_deref(), &path, CursorKind::File)?;
        let cursor = match kept {
            Some(Kept::File(c)) => Some(c),
            _ => None,
        };
        let spec = checked(WaitSpec::File {
            path,
            cursor,
            silence_ms: args.silence.map(millis),
        })?;
        Ok((spec, store))
    });
    wait_prepared(prepared, &args.bound, out, err)
}

pub fn log(args: &LogArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let prepared = spec_path(&args.path).and_then(|path| {
        let (store, kept) = open_cursor(args.cursor.as_deref(), &path, CursorKind::Log)?;
        let cursor = match kept {
            Some(Kept::Log(c)) => Some(c),
            _ => None,
        };
        let spec = checked(WaitSpec::Log {
            path,
            pattern: args.pattern.clone(),
            cursor,
            silence_ms: args.silence.map(millis),
        })?;
        Ok((spec, store))
    });
    wait_prepared(prepared, &args.bound, out, err)
}

/// The `--cursor` file's store for `path` when one was given, and the position it kept.
fn open_cursor(
    file: Option<&Path>,
    path: &str,
    kind: CursorKind,
) -> anyhow::Result<(Option<CursorStore>, Option<Kept>)> {
    let store = match file {
        Some(f) => Some(CursorStore::open(f, Path::new(path), kind)?),
        None => None,
    };
    let kept = store.as_ref().and_then(|s| s.loaded);
    Ok((store, kept))
}

/// Waits on a spec built from the arguments, or says why none could be built (exit 2).
fn wait_prepared(
    prepared: anyhow::Result<(WaitSpec, Option<CursorStore>)>,
    bound: &Bound,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    match prepared {
        Ok((spec, store)) => wait(spec, bound, store.as_ref(), out, err),
        Err(e) => broke(err, &e),
    }
}

pub fn any(args: &AnyArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    match any_spec(&args.conditions) {
        Ok(spec) => wait(spec, &args.bound, None, out, err),
        Err(e) => broke(err, &e),
    }
}

/// The conditions as one spec (each path made absolute; one alone is itself).
pub fn any_spec(conditions: &[String]) -> anyhow::Result<WaitSpec> {
    let mut specs = Vec::with_capacity(conditions.len());
    for c in conditions {
        let mut spec = cortex_protocol::waits::parse_condition(c, Place::Here)?;
        match &mut spec {
            WaitSpec::File { path, .. } | WaitSpec::Flock { path } | WaitSpec::Log { path, .. } => {
                *path = spec_path(Path::new(path.as_str()))?;
            }
            WaitSpec::Pid { .. } | WaitSpec::Any { .. } => {}
        }
        specs.push(spec);
    }
    Ok(cortex_protocol::waits::any_of(specs, Place::Here)?)
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
    wait_with(spec, bound, store, out, err)
}

fn wait_with(
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
        let start = match armed.resume_spec() {
            WaitSpec::File {
                cursor: Some(c), ..
            } => Some(Kept::File(c)),
            WaitSpec::Log {
                cursor: Some(c), ..
            } => Some(Kept::Log(c)),
            _ => None,
        };
        if let (Some(store), Some(c)) = (store, start)
            && let Err(e) = store.save(c)
        {
            return broke(err, &e);
        }
        let outcome = tokio::select! {
            o = armed.wait(&opts) => o,
            why = cortex_host::shutdown_signal() => {
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
            let kept = match fire.cursor {
                Some(Cursor::File(c)) => Some(Kept::File(c)),
                Some(Cursor::Log(c)) => Some(Kept::Log(c)),
                None => None,
            };
            if let (Some(store), Some(c)) = (store, kept)
                && let Err(e) = store.save(c)
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
                // The reader closed the pipe: it wants no more; the wait still fired.
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => FIRED,
                Err(e) => broke(err, &anyhow::Error::new(e).context("writing the payload")),
            }
        }
        WaitOutcome::TimedOut => {
            let _ = writeln!(
                err,
                "cortex: timed out after {}: {}; run the same command again to keep waiting",
                human(bound.timeout),
                still(captured)
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
    match looking_for(c, store) {
        Looking::AtOnce(what) => format!("{what}; firing at once"),
        Looking::For(what) => format!("waiting for {what}; {tail}"),
    }
}

/// What a capture says a wait looks for, or why it fires at once.
enum Looking {
    For(String),
    AtOnce(String),
}

fn looking_for(c: &Captured, store: Option<&CursorStore>) -> Looking {
    let kept = || {
        store
            .map(|s| match s.loaded {
                Some(_) => format!("; cursor {}", s.file.display()),
                None => format!("; new cursor {}", s.file.display()),
            })
            .unwrap_or_default()
    };
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
                    Looking::AtOnce(format!("pid {} was already gone when armed", p.pid))
                }
                Some(Gone::Exited) => Looking::AtOnce(format!(
                    "pid {} ({who}) had already exited when armed",
                    p.pid
                )),
                Some(Gone::Reused { now }) => Looking::AtOnce(format!(
                    "pid {} now belongs to another process (start time {now}, not {}): the one meant is gone",
                    p.pid,
                    p.start_time.unwrap_or_default()
                )),
                None => {
                    let how = match p.method {
                        PidMethod::Pidfd => "",
                        PidMethod::Poll => "; no pidfd here, polling every 0.5s",
                    };
                    Looking::For(format!("pid {} ({who}) to exit{how}", p.pid))
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
            if let Some(ms) = f.silence_ms {
                return Looking::For(format!(
                    "{} to go {} without growing ({now})",
                    f.path.display(),
                    format_duration_ms(ms)
                ));
            }
            match f.since {
                Some(since) if f.now.changed_since(&since) => Looking::AtOnce(format!(
                    "{} changed since the cursor ({now})",
                    f.path.display()
                )),
                _ => Looking::For(format!("a write to {} ({now}{})", f.path.display(), kept())),
            }
        }
        Captured::Log(l) => {
            let now = if !l.exists {
                "does not exist yet; read from its start when it comes".to_string()
            } else if l.start == l.size {
                format!("{} bytes, reading from its end", l.size)
            } else {
                format!("{} bytes, reading from offset {}", l.size, l.start)
            };
            let quiet = l
                .silence_ms
                .map(|ms| format!(", or {} without growing", format_duration_ms(ms)))
                .unwrap_or_default();
            Looking::For(format!(
                "a line matching /{}/ appended to {} ({now}{}){quiet}",
                l.pattern,
                l.path.display(),
                kept()
            ))
        }
        Captured::Flock(l) => {
            if l.free {
                Looking::AtOnce(format!("the lock on {} is free", l.path.display()))
            } else {
                let how = if l.hinted {
                    ""
                } else {
                    "; closes not watched, probing every second at most"
                };
                Looking::For(format!(
                    "the lock on {} to be free (held now){how}",
                    l.path.display()
                ))
            }
        }
        Captured::Any(parts) => {
            let mut fors = Vec::new();
            for (i, part) in parts.iter().enumerate() {
                match looking_for(part, None) {
                    Looking::AtOnce(why) => {
                        return Looking::AtOnce(format!("condition {i}: {why}"));
                    }
                    Looking::For(what) => fors.push(what),
                }
            }
            Looking::For(format!("the first of: {}", fors.join(" | ")))
        }
    }
}

/// What a wait that timed out found still true.
fn still(c: &Captured) -> String {
    match c {
        Captured::Pid(c) => format!("pid {} is still running", c.pid),
        Captured::File(c) if c.silence_ms.is_some() => {
            format!("{} kept growing", c.path.display())
        }
        Captured::File(c) => format!("no write to {}", c.path.display()),
        Captured::Flock(c) => format!("the lock on {} is still held", c.path.display()),
        Captured::Log(c) => format!("no line matching /{}/ in {}", c.pattern, c.path.display()),
        Captured::Any(parts) => parts.iter().map(still).collect::<Vec<_>>().join("; "),
    }
}

/// The `--cursor FILE` of a file or log wait.
struct CursorStore {
    file: PathBuf,
    path: PathBuf,
    kind: CursorKind,
    loaded: Option<Kept>,
}

impl CursorStore {
    /// Reads the cursor file if it exists; one kept for another path, or by the other kind
    /// of wait, is refused.
    fn open(file: &Path, path: &Path, kind: CursorKind) -> anyhow::Result<CursorStore> {
        let file = absolute(file)?;
        let command = match kind {
            CursorKind::File => "cortex wait file",
            CursorKind::Log => "cortex wait log",
        };
        let loaded = match fs::read(&file) {
            Ok(bytes) => {
                let c: CursorFile = serde_json::from_slice(&bytes).with_context(|| {
                    format!(
                        "{} is not a cursor file of {command} (remove it to start afresh)",
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
                let kept = match (kind, c.cursor, c.log) {
                    (CursorKind::File, Some(f), None) => Kept::File(f),
                    (CursorKind::Log, None, Some(l)) => Kept::Log(l),
                    _ => anyhow::bail!(
                        "{} is not a cursor file of {command} (it keeps another kind of wait's position); give this wait its own cursor file",
                        file.display()
                    ),
                };
                Some(kept)
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
            kind,
            loaded,
        })
    }

    /// Replaces the cursor file atomically and durably (`cortex_host::atomic`).
    fn save(&self, kept: Kept) -> anyhow::Result<()> {
        let (cursor, log) = match (self.kind, kept) {
            (CursorKind::File, Kept::File(c)) => (Some(c), None),
            (CursorKind::Log, Kept::Log(c)) => (None, Some(c)),
            // Another kind's position is not this file's to keep.
            _ => return Ok(()),
        };
        let mut body = serde_json::to_vec(&CursorFile {
            path: self.path.clone(),
            cursor,
            log,
        })?;
        body.push(b'\n');
        cortex_host::atomic::write_file(&self.file, &body, 0o666)
            .with_context(|| format!("cannot write the cursor file {}", self.file.display()))
    }
}
