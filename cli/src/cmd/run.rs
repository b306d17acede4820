//! `cortex run [--label L] -- CMD…`: one line for the whole job. It arms a one-shot
//! waitpoint, runs the command with the signal environment set (`CORTEX_SIGNAL_ID`,
//! `CORTEX_SIGNAL_SECRET`, `CORTEX_HUB`), and signals its end the way `cortex-signal
//! --exit-code` does (ok on 0, fail otherwise, spooled when the hub is away), so a job needs
//! no edit at all. It exits with the command's status (128+N when a signal N ended it).
//!
//! The command runs whatever happens to the hub: when no waitpoint can be armed, it says so
//! on stderr and runs the command anyway (nobody is woken, and its status is still the
//! exit status). The command's stdin, stdout and stderr are this process's own.
//!
//! SIGTERM, SIGHUP and SIGQUIT sent to `cortex run` are passed to the command, and its end
//! is reported as usual. Ctrl-C reaches the command from the terminal itself (both are in
//! the terminal's foreground group); `cortex run` outlives it to report how it ended.

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::Context;
use cortex_protocol::api::{CreateWaitpoint, WaitpointCreated};

use super::{RunArgs, wait_remote};
use crate::hub::{Hub, segment};
use crate::signal::{self, Outcome, SignalArgs, SignalEnv};
use crate::timefmt::human;

/// The waitpoint a run reports to: its id and secret, and the signal route's URL.
pub struct Armed {
    pub id: String,
    pub secret: String,
    pub session: String,
    pub signal_url: String,
    pub hub: String,
}

/// What the run's end is reported as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct End {
    /// The exit status `cortex run` ends with: the command's code, 128+N for a signal N,
    /// 127 when it could not be found, 126 when it could not be started.
    pub code: u8,
    /// 0 for ok, anything else fails the waitpoint.
    pub exit_code: i64,
    /// The wake's one-line message.
    pub message: String,
    /// False when the command never ran.
    pub started: bool,
}

/// How a finished command is reported.
pub fn end_of(status: ExitStatus, took: Duration) -> End {
    use std::os::unix::process::ExitStatusExt;
    let took = human(took);
    match (status.code(), status.signal()) {
        (Some(c), _) => End {
            code: u8::try_from(c).unwrap_or(1),
            exit_code: i64::from(c),
            message: format!("exit={c} after {took}"),
            started: true,
        },
        (None, Some(n)) => End {
            code: u8::try_from(128 + n).unwrap_or(255),
            exit_code: i64::from(128 + n),
            message: format!("killed by signal {n} ({}) after {took}", signal_name(n)),
            started: true,
        },
        (None, None) => End {
            code: 1,
            exit_code: 1,
            message: format!("ended without an exit status after {took}"),
            started: true,
        },
    }
}

/// How a command that could not start is reported (the shell's 127 and 126).
pub fn not_started(program: &str, e: &std::io::Error) -> End {
    let code = if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    End {
        code,
        exit_code: i64::from(code),
        message: format!("cannot start {program}: {e}"),
        started: false,
    }
}

fn signal_name(n: i32) -> &'static str {
    match n {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        6 => "SIGABRT",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => "signal",
    }
}

/// The waitpoint's label when `--label` is not given: the program's file name.
pub fn default_label(command: &[OsString]) -> String {
    let first = command
        .first()
        .map(|c| c.to_string_lossy().to_string())
        .unwrap_or_default();
    let name = first.rsplit('/').next().unwrap_or(&first).to_string();
    let name: String = name.chars().take(60).collect();
    if name.is_empty() {
        "cortex run".to_string()
    } else {
        name
    }
}

/// The waitpoint's intent when `--intent` is not given: the command line, cut.
pub fn default_intent(command: &[OsString]) -> String {
    let line = command
        .iter()
        .map(|c| c.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let cut: String = line.chars().take(300).collect();
    let more = if cut.len() < line.len() { "…" } else { "" };
    format!("cortex run: {cut}{more} (its exit status is the signal)")
}

/// Arms the waitpoint: `--session`, else the default session of this user's waits.
fn arm(hub: &Hub, args: &RunArgs, user: Option<&str>) -> anyhow::Result<Armed> {
    let sid = match args.session.as_deref().filter(|s| !s.is_empty()) {
        Some(s) => s.to_string(),
        None => wait_remote::default_session(hub, user)?,
    };
    let body = CreateWaitpoint {
        label: args
            .label
            .clone()
            .unwrap_or_else(|| default_label(&args.command)),
        intent: args
            .intent
            .clone()
            .unwrap_or_else(|| default_intent(&args.command)),
        expires_in_hours: args.expires_in.map(|d| d.as_secs_f64() / 3600.0),
        ..CreateWaitpoint::default()
    };
    let created: WaitpointCreated = hub
        .post(
            &format!("/api/sessions/{}/waitpoints", segment(&sid)),
            &body,
        )
        .with_context(|| format!("arming a waitpoint in session {sid}"))?
        .json("POST /api/sessions/{sid}/waitpoints")?;
    Ok(Armed {
        id: created.head.id,
        secret: created.secret,
        session: created.head.session,
        // Every hub, the one that answered first: the end is signalled to the next if
        // that one is gone by then.
        signal_url: hub
            .bases()
            .iter()
            .map(|b| format!("{b}/webhook/signal"))
            .collect::<Vec<_>>()
            .join(","),
        hub: hub.bases().join(","),
    })
}

/// Runs the whole job; returns the exit status. `hub` is `Err` when no hub could be set
/// up (no token, a bad address): the command still runs.
pub fn run(
    hub: anyhow::Result<Hub>,
    args: &RunArgs,
    user: Option<&str>,
    cortex_home: &Result<std::path::PathBuf, crate::home::HomeError>,
    err: &mut dyn Write,
) -> u8 {
    // Caught from here on, before the armed line: a SIGTERM right after it is passed to
    // the command once it exists, not the end of this process.
    let forward = Forward::install();
    let armed = hub.and_then(|h| arm(&h, args, user));
    let armed = match armed {
        Ok(a) => {
            let _ = writeln!(
                err,
                "cortex: armed {} in session {}; it wakes when the command ends",
                a.id, a.session
            );
            Some(a)
        }
        Err(e) => {
            let _ = writeln!(
                err,
                "cortex: no waitpoint armed ({e:#}); running the command anyway, and no session hears how it ends"
            );
            None
        }
    };
    let _ = err.flush();
    let end = execute(&args.command, armed.as_ref(), &forward);
    if let Some(a) = &armed {
        report(a, &end, cortex_home, err);
    } else if !end.started {
        let _ = writeln!(err, "cortex: {}", end.message);
    }
    end.code
}

/// Starts the command, passes termination signals on, and waits for its end.
fn execute(command: &[OsString], armed: Option<&Armed>, forward: &Forward) -> End {
    let Some((program, rest)) = command.split_first() else {
        return End {
            code: 2,
            exit_code: 2,
            message: "no command".to_string(),
            started: false,
        };
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(rest);
    if let Some(a) = armed {
        cmd.env("CORTEX_SIGNAL_ID", &a.id)
            .env("CORTEX_SIGNAL_SECRET", &a.secret)
            .env("CORTEX_HUB", &a.hub);
    }
    let started = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return not_started(&program.to_string_lossy(), &e),
    };
    forward.attach(child.id());
    match child.wait() {
        Ok(status) => end_of(status, started.elapsed()),
        Err(e) => End {
            code: 1,
            exit_code: 1,
            message: format!("lost track of the command: {e}"),
            started: true,
        },
    }
}

/// SIGTERM, SIGHUP and SIGQUIT caught for the command: passed to it once it is attached,
/// the last one that came before kept and passed on at the attach. SIGINT is caught too,
/// so it leaves this process alive (the terminal gives it to the command itself).
struct Forward {
    /// The command's pid, 0 until it is attached.
    pid: std::sync::Arc<std::sync::atomic::AtomicI32>,
    /// A signal that came before the attach (its number, 0 for none).
    early: std::sync::Arc<std::sync::atomic::AtomicI32>,
}

impl Forward {
    fn install() -> Forward {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicI32, Ordering};
        use tokio::signal::unix::{SignalKind, signal};
        let pid = Arc::new(AtomicI32::new(0));
        let early = Arc::new(AtomicI32::new(0));
        let forward = Forward {
            pid: pid.clone(),
            early: early.clone(),
        };
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
        else {
            return forward;
        };
        let kinds = [
            (SignalKind::terminate(), Some(rustix::process::Signal::TERM)),
            (SignalKind::hangup(), Some(rustix::process::Signal::HUP)),
            (SignalKind::quit(), Some(rustix::process::Signal::QUIT)),
            (SignalKind::interrupt(), None),
        ];
        // Installed here, on this thread, before anything else happens.
        let streams: Vec<_> = {
            let _entered = rt.enter();
            kinds
                .into_iter()
                .filter_map(|(k, to)| signal(k).ok().map(|s| (s, to)))
                .collect()
        };
        std::thread::spawn(move || {
            rt.block_on(async move {
                let mut tasks = Vec::new();
                for (mut s, to) in streams {
                    let (pid, early) = (pid.clone(), early.clone());
                    tasks.push(tokio::spawn(async move {
                        while s.recv().await.is_some() {
                            let Some(sig) = to else { continue };
                            match rustix::process::Pid::from_raw(pid.load(Ordering::SeqCst)) {
                                Some(p) => {
                                    let _ = rustix::process::kill_process(p, sig);
                                }
                                None => {
                                    early.store(sig.as_raw(), Ordering::SeqCst);
                                    // Attached meanwhile: the attach may have looked first.
                                    let now = pid.load(Ordering::SeqCst);
                                    if let Some(p) = rustix::process::Pid::from_raw(now)
                                        && early.swap(0, Ordering::SeqCst) != 0
                                    {
                                        let _ = rustix::process::kill_process(p, sig);
                                    }
                                }
                            }
                        }
                    }));
                }
                for t in tasks {
                    let _ = t.await;
                }
            });
        });
        forward
    }

    /// The command is `pid`: signals go to it from now on, and one that came before now.
    fn attach(&self, pid: u32) {
        use std::sync::atomic::Ordering;
        let Some(p) = i32::try_from(pid).ok() else {
            return;
        };
        self.pid.store(p, Ordering::SeqCst);
        let sig = self.early.swap(0, Ordering::SeqCst);
        if let (Some(target), Some(sig)) = (
            rustix::process::Pid::from_raw(p),
            rustix::process::Signal::from_named_raw(sig),
        ) {
            let _ = rustix::process::kill_process(target, sig);
        }
    }
}

/// Signals the waitpoint with the command's end, as `cortex-signal --exit-code` would:
/// sent, else spooled; what went wrong is said on `err`.
fn report(
    a: &Armed,
    end: &End,
    cortex_home: &Result<std::path::PathBuf, crate::home::HomeError>,
    err: &mut dyn Write,
) {
    let args = SignalArgs {
        id: Some(a.id.clone()),
        secret: Some(a.secret.clone()),
        exit_code: Some(end.exit_code),
        status: None,
        message: Some(end.message.clone()),
        member: None,
        data: None,
        url: Some(a.signal_url.clone()),
        no_spool: false,
    };
    let env = SignalEnv {
        id: None,
        secret: None,
        hub: None,
        webhook_port: None,
        cortex_home: cortex_home.clone(),
    };
    let mut stderr = Vec::new();
    let outcome = signal::run(&args, &env, &mut std::io::empty(), &mut stderr);
    let said = String::from_utf8_lossy(&stderr);
    for line in said.lines() {
        let _ = writeln!(err, "{}", line.replacen("cortex-signal:", "cortex:", 1));
    }
    let line = match &outcome {
        Outcome::Accepted => format!("reported {} ({})", end.message, a.id),
        Outcome::AlreadyResolved => format!(
            "{} had already ended (the command signalled it itself); its end ({}) is not counted again",
            a.id, end.message
        ),
        Outcome::Spooled(_) => format!(
            "the hub could not be reached; {}'s end ({}) waits in the spool and is delivered when the hub collects it",
            a.id, end.message
        ),
        Outcome::Refused(status) => format!(
            "the hub refused {}'s end (HTTP {status}); the session does not hear of it",
            a.id
        ),
        Outcome::NotDelivered | Outcome::Usage => format!(
            "{}'s end ({}) was neither delivered nor spooled; the session does not hear of it",
            a.id, end.message
        ),
    };
    let _ = writeln!(err, "cortex: {line}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn ends_are_reported_as_the_shell_would_report_them() {
        let s = Duration::from_secs(3);
        for (raw, code, exit, msg) in [
            (0, 0, 0, "exit=0 after 3s"),
            (3 << 8, 3, 3, "exit=3 after 3s"),
            (9, 137, 137, "killed by signal 9 (SIGKILL) after 3s"),
            (15, 143, 143, "killed by signal 15 (SIGTERM) after 3s"),
        ] {
            let end = end_of(ExitStatus::from_raw(raw), s);
            assert_eq!(
                (end.code, end.exit_code, end.message.as_str()),
                (code, exit, msg),
                "{raw}"
            );
        }
        let gone = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(not_started("nosuch", &gone).code, 127);
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert_eq!(not_started("./x", &denied).code, 126);
    }

    #[test]
    fn the_label_and_intent_come_from_the_command() {
        let cmd: Vec<OsString> = ["/usr/bin/python3", "train.py", "--lr", "3e-4"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(default_label(&cmd), "python3");
        assert_eq!(
            default_intent(&cmd),
            "cortex run: /usr/bin/python3 train.py --lr 3e-4 (its exit status is the signal)"
        );
        let long: Vec<OsString> = vec!["x".repeat(500).into()];
        assert!(default_intent(&long).contains("…"));
        assert_eq!(default_label(&long).chars().count(), 60);
    }
}
