//! Commands the hub starts on this device (`HubFrame::Exec`), for an agent run with
//! `--allow-exec`: the policy (off by default, narrowed by `--exec-allow`), the run's
//! record, the detached spawn, and the reaping of what this agent started.
//!
//! Identity: the `exec_id` names one run. Before anything is spawned its record is written
//! (`$CORTEX_HOME/exec/<exec_id>.json`, temp file + fsync + rename, 0600) in state
//! `starting`; once the child exists the record gets its pid and start time (`running`),
//! and its exit once this agent reaps it (`exited`). A second `Exec` with the same id
//! starts nothing: it is answered with the recorded run (`already: true`), or, for a
//! record left `starting` by an agent that stopped between the two writes, refused as
//! unknown, since the command may have started and starting it again could run it twice.
//!
//! Detached: the child is this binary run as a launcher ([`LAUNCH_ARG`]) that calls
//! `setsid(2)` and then `exec`s the command in place, so the command keeps the pid the
//! agent saw, leads its own session and process group, and outlives the agent (a
//! restart, SIGTERM or SIGKILL of the agent leaves it running). The launcher exists
//! because `setsid` between fork and exec needs `pre_exec`, which is `unsafe`, and this
//! workspace forbids `unsafe` code. The agent answers only once the command leads its
//! session (it polls the session field of `/proc/<pid>/stat`, bounded), so the hub never
//! gets a pid whose process group is still the agent's. Its stdin is `/dev/null`, its stdout and stderr are appended to
//! `$CORTEX_HOME/exec/<exec_id>.log` (0600).
//!
//! Reaping: the daemon loop calls [`Execs::reap`] on every SIGCHLD, and a pid wait that
//! fires on one of these pids asks [`Execs::exit_of`] first, which reaps that child at
//! once (it is a zombie by then), so the wait's payload carries its exit code. A child
//! reaped before a pid wait was armed on it is "no such process" to the wait library,
//! which fires at once: the wait still ends.
//!
//! Environment: the agent's own, less the device token and what systemd handed the agent
//! alone ([`NOT_INHERITED`]), plus the frame's. The frame's may hold a waitpoint's secret:
//! no value of it is logged or written to the record. A command runs as the agent's user
//! and can read what that user can (a token file included): `--exec-allow` and the hub's
//! approval are what bound it.

use std::collections::{HashMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use cortex_protocol::mesh::{AgentFrame, ExecRequest, Frame};
use serde::{Deserialize, Serialize};

use super::now_ms;

#[cfg(test)]
mod tests;

/// The launcher's first argument: `cortex-device-agent --cortex-exec-launch PROGRAM ARGV0
/// ARGS…` becomes a session leader and `exec`s `PROGRAM` with `ARGV0 ARGS…`.
pub const LAUNCH_ARG: &str = "--cortex-exec-launch";

/// The launcher this agent runs: its own executable, through the kernel's link, so an
/// upgrade that replaced the file on disk still launches this build.
pub const SELF_EXE: &str = "/proc/self/exe";

/// The record file's format version.
const RECORD_VERSION: u32 = 1;

/// An exec id's longest form: it is a file name.
pub const MAX_EXEC_ID: usize = 128;

/// Exits of this agent's children remembered for pid waits after their reaping.
const KEEP_EXITED: usize = 1024;

/// The PATH searched for a bare program name when neither the frame nor the agent has one.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Who may start what: `--allow-exec`, and `--exec-allow PROG` entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecPolicy {
    pub allow: bool,
    /// Empty: any program. Otherwise argv[0] must match one entry: an entry with a `/` by
    /// its full path, a bare entry by argv[0]'s file name.
    pub programs: Vec<String>,
}

impl ExecPolicy {
    /// Whether `argv` (with `shell`) has a shape that may run here: exec allowed, argv
    /// not empty, a shell given exactly its script. `Err` is the one line the hub passes
    /// to the model. The allow-list is [`ExecPolicy::check_program`]'s.
    pub fn check(&self, argv: &[String], shell: bool) -> Result<(), String> {
        if !self.allow {
            return Err(NOT_ALLOWED.into());
        }
        let Some(first) = argv.first() else {
            return Err("argv is empty".into());
        };
        if let Some(i) = argv.iter().position(|a| a.contains('\0')) {
            return Err(format!("argv[{i}] holds a NUL byte"));
        }
        if shell && argv.len() != 1 {
            return Err(format!(
                "with shell: true, argv must be exactly one string, the script for /bin/sh -c (got {} strings)",
                argv.len()
            ));
        }
        if first.is_empty() {
            return Err(if shell {
                "the script is empty".into()
            } else {
                "argv[0] is empty".into()
            });
        }
        Ok(())
    }

    /// The allow-list for the program argv[0] names (`/bin/sh` for a shell), `resolved`
    /// being the file it found on disk, if any.
    pub fn check_program(
        &self,
        argv0: &str,
        resolved: Option<&Path>,
        shell: bool,
    ) -> Result<(), String> {
        if self.permits(argv0, resolved) {
            return Ok(());
        }
        let list = self.programs.join(", ");
        Err(if shell {
            format!("a shell (sh) is not on this device's exec allow-list: {list}")
        } else {
            format!(
                "{} is not on this device's exec allow-list: {list}",
                file_name(argv0)
            )
        })
    }

    /// The allow-list rule: no list allows all; an entry with a `/` matches argv[0] or the
    /// file it resolved to by full path; a bare entry matches argv[0]'s file name (so it
    /// allows that name wherever it is: list full paths to pin one program).
    pub fn permits(&self, argv0: &str, resolved: Option<&Path>) -> bool {
        self.programs.is_empty()
            || self.programs.iter().any(|entry| {
                if entry.contains('/') {
                    entry == argv0 || resolved.is_some_and(|r| Path::new(entry) == r)
                } else {
                    entry == file_name(argv0)
                }
            })
    }
}

/// The refusal of an agent run without `--allow-exec`.
pub const NOT_ALLOWED: &str = "this device does not allow exec (start its agent with --allow-exec)";

/// `python3` for `/usr/bin/python3`.
fn file_name(argv0: &str) -> &str {
    argv0.rsplit('/').next().unwrap_or(argv0)
}

/// Checks an exec id: it names the run's files, so it is a plain file name.
pub fn check_exec_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= MAX_EXEC_ID
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "exec id {:?} is not usable: 1-{MAX_EXEC_ID} of A-Z a-z 0-9 _ - . not starting with a dot",
            id.chars().take(64).collect::<String>()
        ))
    }
}

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecState {
    /// Recorded, not known to be spawned (the agent writes this first).
    Starting,
    Running,
    /// Reaped by this agent: the exit is in the record.
    Exited,
}

/// `$CORTEX_HOME/exec/<exec_id>.json`. Holds no environment value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRecord {
    pub version: u32,
    pub exec_id: String,
    pub state: ExecState,
    pub argv: Vec<String>,
    pub shell: bool,
    pub cwd: String,
    /// The log's absolute path.
    pub log: String,
    pub requested_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// Field 22 of `/proc/PID/stat`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<u64>,
}

/// How one of this agent's children ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    /// Its exit status, when it exited by itself.
    pub code: Option<i32>,
    /// The signal that killed it, when one did.
    pub signal: Option<i32>,
}

impl ExitInfo {
    fn of(status: ExitStatus) -> ExitInfo {
        use std::os::unix::process::ExitStatusExt;
        ExitInfo {
            code: status.code(),
            signal: status.signal(),
        }
    }

    /// `with code 3`, `killed by signal 9`.
    pub fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(c), _) => format!("with code {c}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            (None, None) => "with an unknown status".into(),
        }
    }
}

/// Reads and writes the run records under `$CORTEX_HOME/exec/`.
#[derive(Debug, Clone)]
pub struct ExecStore {
    dir: PathBuf,
}

impl ExecStore {
    /// The records under `home/exec/`. `home` should be absolute: the log paths given to
    /// the hub are built from it.
    pub fn under(home: &Path) -> ExecStore {
        ExecStore {
            dir: home.join("exec"),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn record_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    pub fn log_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.log"))
    }

    /// The record of `id`, if any. `Err`: it exists and cannot be read or parsed.
    pub fn load(&self, id: &str) -> io::Result<Option<ExecRecord>> {
        let path = self.record_path(id);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Replaces the record atomically and durably, mode 0600.
    pub fn save(&self, rec: &ExecRecord) -> io::Result<()> {
        create_private_dir(&self.dir)?;
        let mut body = serde_json::to_vec_pretty(rec).map_err(io::Error::other)?;
        body.push(b'\n');
        cortex_host::atomic::write_file(&self.record_path(&rec.exec_id), &body, 0o600)
    }

    fn remove(&self, id: &str) -> io::Result<()> {
        match fs::remove_file(self.record_path(id)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// A child of this agent, not reaped yet.
struct Running {
    exec_id: String,
    start_time: u64,
    child: Child,
}

/// The agent's runs; see the module docs.
pub struct Execs {
    policy: ExecPolicy,
    store: ExecStore,
    /// The default working directory.
    default_cwd: PathBuf,
    /// The program that detaches and `exec`s (normally [`SELF_EXE`]).
    launcher: PathBuf,
    running: HashMap<i32, Running>,
    /// Recent exits by pid: (start time, exec id, exit).
    exited: HashMap<i32, (u64, String, ExitInfo)>,
    exited_order: VecDeque<i32>,
    /// Encoded answers for the hub, sent when the link has room.
    queue: VecDeque<Vec<u8>>,
}

impl std::fmt::Debug for Execs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Execs")
            .field("policy", &self.policy)
            .field("running", &self.running.len())
            .finish_non_exhaustive()
    }
}

impl Execs {
    /// `store`'s directory must be absolute; `default_cwd` is where a run without `cwd`
    /// starts.
    pub fn new(
        policy: ExecPolicy,
        store: ExecStore,
        default_cwd: PathBuf,
        launcher: PathBuf,
    ) -> Execs {
        Execs {
            policy,
            store,
            default_cwd,
            launcher,
            running: HashMap::new(),
            exited: HashMap::new(),
            exited_order: VecDeque::new(),
            queue: VecDeque::new(),
        }
    }

    pub fn policy(&self) -> &ExecPolicy {
        &self.policy
    }

    /// Children not reaped yet.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Handles one `Exec` that waited `waited` in this agent before it was handled: its
    /// answer is queued for the hub and returned.
    pub fn start(&mut self, req: ExecRequest, waited: Duration) -> AgentFrame {
        let exec_id = req.exec_id.clone();
        let answer = match self.try_start(req, waited) {
            Ok(a) => a,
            Err(reason) => {
                tracing::info!(exec = %exec_id, reason = %reason, "exec refused");
                AgentFrame::ExecRefused { exec_id, reason }
            }
        };
        match answer.encode() {
            Ok(b) => self.queue.push_back(b),
            Err(e) => tracing::error!(error = %e, "cannot encode an exec answer"),
        }
        answer
    }

    fn try_start(&mut self, req: ExecRequest, waited: Duration) -> Result<AgentFrame, String> {
        if !self.policy.allow {
            // Before the id is even looked at: such an agent writes nothing.
            return Err(NOT_ALLOWED.into());
        }
        check_exec_id(&req.exec_id)?;
        let id = &req.exec_id;
        match self.store.load(id) {
            Ok(Some(rec)) => return already(rec),
            Ok(None) => {}
            Err(e) => {
                return Err(format!(
                    "state unknown: the record {} cannot be read ({e})",
                    self.store.record_path(id).display()
                ));
            }
        }
        if waited > req.timeout() {
            return Err(format!(
                "the request reached the device after the hub stopped waiting ({} ms > {} ms); nothing was started",
                waited.as_millis(),
                req.timeout_ms
            ));
        }
        self.policy.check(&req.argv, req.shell)?;
        let cwd = match &req.cwd {
            None => self.default_cwd.clone(),
            Some(c) => {
                let p = PathBuf::from(c);
                if !p.is_absolute() {
                    return Err(format!(
                        "cwd {c} is not an absolute path; name a directory on the device from /"
                    ));
                }
                p
            }
        };
        if !cwd.is_dir() {
            return Err(if cwd.exists() {
                format!("cwd {} is not a directory", cwd.display())
            } else {
                format!("cwd {} does not exist", cwd.display())
            });
        }
        for (k, v) in &req.env {
            if k.is_empty() || k.contains(['=', '\0']) {
                return Err(format!(
                    "env name {:?} is not usable (empty, or holds '=' or NUL)",
                    k.chars().take(64).collect::<String>()
                ));
            }
            if v.contains('\0') {
                return Err(format!("the value of env {k} holds a NUL byte"));
            }
        }
        let (program_argv0, args): (String, Vec<String>) = if req.shell {
            (
                "/bin/sh".into(),
                vec!["-c".into(), req.argv.first().cloned().unwrap_or_default()],
            )
        } else {
            (req.argv[0].clone(), req.argv[1..].to_vec())
        };
        let path_var = req
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| OsString::from(v))
            .or_else(|| std::env::var_os("PATH"));
        let resolved = resolve(&program_argv0, &cwd, path_var.as_deref());
        self.policy.check_program(
            &program_argv0,
            resolved.as_ref().ok().map(PathBuf::as_path),
            req.shell,
        )?;
        let program = resolved?;

        let log = self.store.log_path(id);
        let mut rec = ExecRecord {
            version: RECORD_VERSION,
            exec_id: id.clone(),
            state: ExecState::Starting,
            argv: req.argv.clone(),
            shell: req.shell,
            cwd: cwd.to_string_lossy().into_owned(),
            log: log.to_string_lossy().into_owned(),
            requested_at_ms: now_ms(),
            pid: None,
            start_time: None,
            exit_code: None,
            signal: None,
            ended_at_ms: None,
        };
        self.store.save(&rec).map_err(|e| {
            format!(
                "cannot record the run under {}: {e}; nothing was started",
                self.store.dir().display()
            )
        })?;
        let spawned = self.spawn(&program, &program_argv0, &args, &cwd, &req.env, &log);
        let child = match spawned {
            Ok(c) => c,
            Err(e) => {
                // Nothing started: the id is free again.
                let _ = self.store.remove(id);
                return Err(format!("cannot start {}: {e}", program.display()));
            }
        };
        let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
        // The launcher runs, but may not have called setsid yet: answer only once the
        // command leads its own session, so whoever gets the pid may signal its group.
        if !wait_for_session(pid) {
            tracing::warn!(exec = %id, pid, "the command did not become a session leader within {SESSION_WAIT:?}; see its log");
        }
        // Our child cannot be reaped by anyone else, so its /proc entry is there (a zombie
        // at worst) until we wait for it.
        let start_time = match cortex_host::wait::read_stat(pid) {
            Ok(Some(s)) => s.start_time,
            _ => 0,
        };
        rec.state = ExecState::Running;
        rec.pid = Some(pid);
        rec.start_time = Some(start_time);
        if let Err(e) = self.store.save(&rec) {
            // The run is going; a restart would now answer "state unknown" for this id
            // rather than start it twice.
            tracing::error!(exec = %id, pid, error = %e, "cannot record the started run");
        }
        tracing::info!(exec = %id, program = %program_argv0, pid, "exec started");
        self.running.insert(
            pid,
            Running {
                exec_id: id.clone(),
                start_time,
                child,
            },
        );
        Ok(AgentFrame::ExecStarted {
            exec_id: id.clone(),
            pid,
            start_time,
            log: rec.log,
            already: false,
        })
    }

    fn spawn(
        &self,
        program: &Path,
        argv0: &str,
        args: &[String],
        cwd: &Path,
        env: &[(String, String)],
        log: &Path,
    ) -> io::Result<Child> {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(log)?;
        let err = out.try_clone()?;
        Command::new(&self.launcher)
            .arg(LAUNCH_ARG)
            .arg(program)
            .arg(argv0)
            .args(args)
            .current_dir(cwd)
            .env_clear()
            .envs(inherited_env())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
    }

    /// Reaps every child that exited (SIGCHLD), recording how.
    pub fn reap(&mut self) {
        let pids: Vec<i32> = self.running.keys().copied().collect();
        for pid in pids {
            self.try_reap(pid);
        }
    }

    /// Reaps `pid` if it is a child of ours that exited.
    fn try_reap(&mut self, pid: i32) -> Option<ExitInfo> {
        let r = self.running.get_mut(&pid)?;
        let exit = match r.child.try_wait() {
            Ok(None) => return None,
            Ok(Some(status)) => ExitInfo::of(status),
            Err(e) => {
                tracing::warn!(pid, error = %e, "cannot reap an exec's process");
                ExitInfo {
                    code: None,
                    signal: None,
                }
            }
        };
        let r = self.running.remove(&pid)?;
        self.ended(pid, r, exit);
        Some(exit)
    }

    fn ended(&mut self, pid: i32, r: Running, exit: ExitInfo) {
        tracing::info!(exec = %r.exec_id, pid, exit_code = ?exit.code, signal = ?exit.signal, "exec ended");
        match self.store.load(&r.exec_id) {
            Ok(Some(mut rec)) if rec.pid == Some(pid) => {
                rec.state = ExecState::Exited;
                rec.exit_code = exit.code;
                rec.signal = exit.signal;
                rec.ended_at_ms = Some(now_ms());
                if let Err(e) = self.store.save(&rec) {
                    tracing::warn!(exec = %r.exec_id, error = %e, "cannot record an exec's exit");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(exec = %r.exec_id, error = %e, "cannot read an exec's record"),
        }
        if self
            .exited
            .insert(pid, (r.start_time, r.exec_id, exit))
            .is_none()
        {
            self.exited_order.push_back(pid);
        }
        while self.exited_order.len() > KEEP_EXITED {
            if let Some(old) = self.exited_order.pop_front() {
                self.exited.remove(&old);
            }
        }
    }

    /// How `pid` ended, if it is a run of this agent that exited (reaped now if need be);
    /// `start_time`, when given, must be that run's.
    pub fn exit_of(&mut self, pid: i32, start_time: Option<u64>) -> Option<ExitInfo> {
        let same = |st: u64| start_time.is_none_or(|s| s == st);
        if let Some(r) = self.running.get(&pid) {
            if !same(r.start_time) {
                return None;
            }
            return self.try_reap(pid);
        }
        match self.exited.get(&pid) {
            Some((st, _, exit)) if same(*st) => Some(*exit),
            _ => None,
        }
    }

    /// A link is up or gone: answers queued for an older link are dropped (the hub asks
    /// again with the same id and gets `already`).
    pub fn link_changed(&mut self) {
        self.queue.clear();
    }

    /// Sends queued answers while `sink` takes them.
    pub fn pump(&mut self, sink: &mut impl super::FrameSink) {
        while let Some(f) = self.queue.pop_front() {
            if !sink.try_send(f.clone()) {
                self.queue.push_front(f);
                return;
            }
        }
    }
}

/// How long the agent waits for a started command to lead its own session (the
/// launcher's first act; it takes well under a millisecond).
const SESSION_WAIT: Duration = Duration::from_secs(2);

/// Polls until `pid` leads its own session; false if it ended first or the bound passed.
///
/// The session comes from `/proc/<pid>/stat`, not `getsid(2)`: inside a container the
/// launcher's session, begun outside the pid namespace, reads as 0 before its `setsid`.
fn wait_for_session(pid: i32) -> bool {
    let deadline = std::time::Instant::now() + SESSION_WAIT;
    loop {
        match cortex_host::wait::read_stat(pid) {
            Ok(Some(s)) if s.session == pid => return true,
            // Ended before its setsid (the launcher could not start it): nothing to wait for.
            Ok(Some(s)) if s.exited() => return false,
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return false,
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// What a run inherits of the agent's environment: all of it but the device's token
/// (`CORTEX_DEVICE_TOKEN`, when it came that way) and systemd's hand-offs meant for the
/// agent alone (its notify socket and watchdog, its sockets and credentials).
pub const NOT_INHERITED: &[&str] = &[
    "CORTEX_DEVICE_TOKEN",
    "NOTIFY_SOCKET",
    "WATCHDOG_PID",
    "WATCHDOG_USEC",
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
    "CREDENTIALS_DIRECTORY",
];

fn inherited_env() -> impl Iterator<Item = (OsString, OsString)> {
    std::env::vars_os().filter(|(k, _)| !NOT_INHERITED.iter().any(|n| k == *n))
}

/// The answer for an id that has a record.
fn already(rec: ExecRecord) -> Result<AgentFrame, String> {
    match (rec.state, rec.pid) {
        (ExecState::Starting, _) | (_, None) => Err(format!(
            "state unknown: the agent stopped while starting it (exec id {}); it may or may not be running, see {}",
            rec.exec_id, rec.log
        )),
        (_, Some(pid)) => Ok(AgentFrame::ExecStarted {
            exec_id: rec.exec_id,
            pid,
            start_time: rec.start_time.unwrap_or(0),
            log: rec.log,
            already: true,
        }),
    }
}

/// The program `argv0` names: a path (relative to `cwd`) when it holds a `/`, else the
/// first executable file of that name on `path`.
pub fn resolve(argv0: &str, cwd: &Path, path: Option<&OsStr>) -> Result<PathBuf, String> {
    if argv0.contains('/') {
        let p = cwd.join(argv0);
        return match executable(&p) {
            Ok(()) => Ok(p),
            Err(why) => Err(format!("{argv0}: {why}")),
        };
    }
    let path = path.unwrap_or(OsStr::new(DEFAULT_PATH));
    for dir in std::env::split_paths(path) {
        if dir.as_os_str().is_empty() {
            continue;
        }
        let p = cwd.join(dir).join(argv0);
        if executable(&p).is_ok() {
            return Ok(p);
        }
    }
    Err(format!(
        "{argv0} is not found on this device's PATH ({})",
        path.to_string_lossy()
    ))
}

fn executable(p: &Path) -> Result<(), &'static str> {
    match fs::metadata(p) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err("no such file"),
        Err(_) => Err("cannot be read"),
        Ok(md) if !md.is_file() => Err("is not a file"),
        Ok(md) if md.permissions().mode() & 0o111 == 0 => Err("is not executable"),
        Ok(_) => Ok(()),
    }
}

/// The launcher's `main`: `args` are what follows [`LAUNCH_ARG`] (PROGRAM ARGV0 ARGS…).
/// Becomes the leader of a new session (and process group), then `exec`s the program in
/// place; only returns when that failed, after one line on stderr (the run's log).
pub fn launch(args: &[OsString]) -> std::process::ExitCode {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let fail = |what: String| {
        let _ = writeln!(io::stderr(), "cortex-device-agent: {what}");
        std::process::ExitCode::from(127)
    };
    let [program, argv0, rest @ ..] = args else {
        return fail(format!("{LAUNCH_ARG} needs PROGRAM ARGV0 [ARGS…]"));
    };
    if let Err(e) = rustix::process::setsid() {
        return fail(format!("cannot start a new session: {e}"));
    }
    let e = Command::new(program).arg0(argv0).args(rest).exec();
    fail(format!("cannot run {}: {e}", Path::new(program).display()))
}
