//! `cortex wait pid|file|flock|log|any … --device NAME`: a remote wait. It asks the hub for one
//! (`POST /api/devices/{name}/waits`: a waitpoint bound to the device, which the device's
//! agent signals when the condition holds), prints one armed line on stderr, and then ends
//! like `cortex wait for` on that waitpoint, printing what the same wait on this machine
//! prints: the condition's payload as one JSON object on stdout when it fired (with
//! `device` and `waitpoint` added), nothing there otherwise; exit 0 fired, 1 timed out, 2
//! broke (the device lost and not back within the bound, the wait refused or cancelled,
//! the hub unreachable), 3 fired and a job the device started failed.
//!
//! The bound is the hub's: `--timeout` goes to the hub as `timeout_s`, and the hub (or the
//! agent) ends the wait then. This command waits that long plus [`SLACK`] for the wake, so
//! a hub that is slow to say so is still heard.
//!
//! Ctrl-C stops only this command: the waitpoint stays armed and still wakes its session
//! (`cortex wait cancel WP_ID` disarms it).
//!
//! A device the hub does not know is refused in one line before anything is made. A wait
//! without `--session` goes to one default session per user (titled `cortex waits (USER)`,
//! found by its title, made when missing), not a new session each time.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use cortex_protocol::api::{CreateDeviceWait, CreateSession, DeviceWaitCreated, SessionView};
use cortex_protocol::waits::{
    DurationValue, Place, WaitCondition, any_of, format_duration_ms, parse_condition,
};

use super::devices;
use super::wait_exit::BROKE;
use super::wait_for::{self, How};
use super::wait_local::LocalWait;
use crate::hub::{Hub, segment};
use crate::timefmt::human;

/// How long past its bound the wake may take to come: the hub's grace for the agent's
/// report (2 s), a commit, and a long poll's turn.
pub const SLACK: Duration = Duration::from_secs(30);

/// Asks for the wait and blocks until it ends; returns the exit status. `user` names the
/// default session a wait without `--session` goes to.
pub fn run(
    hub: &Hub,
    wait: &LocalWait,
    user: Option<&str>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let Some(device) = wait.device() else {
        return BROKE;
    };
    let asked = body(wait, device).and_then(|mut b| {
        // The device first: one the hub does not know is refused before anything is made.
        let view = devices::require(hub, device)?;
        if b.session.is_none() {
            b.session = Some(default_session(hub, user)?);
        }
        let created = match create(hub, device, &b) {
            // The default session deleted between the look and the ask: make it anew, once.
            Err(e) if e.is::<NoSession>() && wait.bound().session.is_none() => {
                b.session = Some(new_default_session(hub, user)?);
                create(hub, device, &b)
            }
            other => other,
        };
        Ok((view, created?))
    });
    let (view, created) = match asked {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(err, "cortex: {e:#}");
            return BROKE;
        }
    };
    let wp = &created.waitpoint;
    let online = Some(view.state == "online");
    let timeout = wait.bound().timeout;
    let _ = writeln!(
        err,
        "cortex: {}",
        armed_line(&created, device, online, timeout)
    );
    let _ = err.flush();
    let how = How {
        announce: false,
        payload: true,
    };
    wait_for::run_with(hub, &wp.head.id, Some(timeout + SLACK), how, out, err)
}

/// The title of the session remote waits without `--session` share, one per user.
pub fn default_title(user: Option<&str>) -> String {
    match user.map(str::trim).filter(|u| !u.is_empty()) {
        Some(u) => format!("cortex waits ({u})"),
        None => "cortex waits".to_string(),
    }
}

/// The id of the default session: the oldest session titled [`default_title`], made
/// when there is none (the first bare remote wait, or after it was deleted).
pub fn default_session(hub: &Hub, user: Option<&str>) -> anyhow::Result<String> {
    let title = default_title(user);
    let list: Vec<SessionView> = hub
        .get("/api/sessions")
        .context("looking for the default session of remote waits")?
        .json("GET /api/sessions")?;
    let found = list
        .iter()
        .filter(|s| s.title.as_deref() == Some(title.as_str()))
        .min_by_key(|s| s.created_at);
    match found {
        Some(s) => Ok(s.id.clone()),
        None => new_default_session(hub, user),
    }
}

fn new_default_session(hub: &Hub, user: Option<&str>) -> anyhow::Result<String> {
    let body = CreateSession {
        title: Some(default_title(user)),
        ..CreateSession::default()
    };
    let v: serde_json::Value = hub
        .post("/api/sessions", &body)
        .context("creating the default session of remote waits")?
        .json("POST /api/sessions")?;
    v["id"]
        .as_str()
        .map(str::to_string)
        .context("the hub's answer to POST /api/sessions has no id")
}

/// The request body from the flags. Flags that only make sense on this machine are
/// refused with what to do instead.
pub fn body(wait: &LocalWait, device: &str) -> anyhow::Result<CreateDeviceWait> {
    let bound = wait.bound();
    anyhow::ensure!(
        bound.heartbeat.is_none(),
        "--heartbeat is for waits on this machine; a remote wait is kept alive by {device}'s agent, and `cortex devices` shows it"
    );
    let abs = |p: &std::path::Path| -> anyhow::Result<String> {
        let s = p
            .to_str()
            .with_context(|| format!("{} is not UTF-8; name the file in UTF-8", p.display()))?;
        anyhow::ensure!(
            s.starts_with('/'),
            "{s} is relative; give the absolute path of the file on {device}"
        );
        Ok(s.to_string())
    };
    let mut b = CreateDeviceWait {
        timeout_s: Some(bound.timeout.as_secs_f64()),
        session: bound.session.clone(),
        ..CreateDeviceWait::default()
    };
    match wait {
        LocalWait::Pid(a) => {
            b.condition.kind = "pid".into();
            b.condition.pid = Some(a.pid);
            b.condition.start_time = a.start_time;
            // The device's agent decides it, where the pid lives: one not running there
            // breaks the wait, and the hub and the session hear `broke`.
            b.condition.must_exist = a.must_exist;
        }
        LocalWait::File(a) => {
            anyhow::ensure!(
                a.cursor.is_none(),
                "--cursor is for waits on this machine; {device}'s agent keeps a remote file wait's position itself"
            );
            b.condition.kind = "file".into();
            b.condition.path = Some(abs(&a.path)?);
            b.condition.silence = a.silence.map(seconds);
        }
        LocalWait::Flock(a) => {
            b.condition.kind = "flock".into();
            b.condition.path = Some(abs(&a.path)?);
        }
        LocalWait::Log(a) => {
            anyhow::ensure!(
                a.cursor.is_none(),
                "--cursor is for waits on this machine; {device}'s agent keeps a remote log wait's position itself"
            );
            b.condition.kind = "log".into();
            b.condition.path = Some(abs(&a.path)?);
            b.condition.pattern = Some(a.pattern.clone());
            b.condition.silence = a.silence.map(seconds);
        }
        LocalWait::Any(a) => {
            // Read by the one parser, as the hub will: a bad condition is refused here,
            // in the same words.
            let mut specs = Vec::with_capacity(a.conditions.len());
            for c in &a.conditions {
                specs.push(parse_condition(c, Place::Device)?);
            }
            let spec = any_of(specs, Place::Device)?;
            b.condition = WaitCondition::from_spec(&spec);
        }
    }
    Ok(b)
}

fn seconds(d: Duration) -> DurationValue {
    DurationValue::Seconds(d.as_secs_f64())
}

/// The hub's 404 about the session a remote wait was to go to.
#[derive(Debug, thiserror::Error)]
#[error("no session {0}; `cortex sessions` lists them")]
struct NoSession(String);

fn create(hub: &Hub, device: &str, b: &CreateDeviceWait) -> anyhow::Result<DeviceWaitCreated> {
    let reply = match hub.post(&format!("/api/devices/{}/waits", segment(device)), b) {
        Ok(r) => r,
        Err(e) if devices::is_unknown(&e, device) => anyhow::bail!(devices::unknown(device)),
        Err(e) if e.status() == Some(404) => {
            return Err(NoSession(b.session.clone().unwrap_or_default()).into());
        }
        Err(e) => {
            let flags = [
                ("timeout_s", "--timeout (in seconds)"),
                ("match", "--match"),
                ("silence", "--silence"),
            ];
            return Err(super::refusal_in_flags(e, &flags))
                .with_context(|| format!("asking the hub for a wait on {device}"));
        }
    };
    Ok(reply.json("POST /api/devices/{name}/waits")?)
}

/// The one line on arm: what, where, the waitpoint, and the bound.
fn armed_line(
    c: &DeviceWaitCreated,
    device: &str,
    online: Option<bool>,
    timeout: Duration,
) -> String {
    let w = &c.wait;
    let quiet = |ms: u64| format_duration_ms(ms);
    let what = match (w.kind.as_str(), w.pid, w.path.as_deref()) {
        ("pid", Some(pid), _) => format!("pid {pid} to exit"),
        ("file", _, Some(p)) => match w.silence_ms {
            Some(ms) => format!("{p} to go {} without growing", quiet(ms)),
            None => format!("a write to {p}"),
        },
        ("flock", _, Some(p)) => format!("the lock on {p} to be free"),
        ("log", _, Some(p)) => {
            let pattern = w.pattern.as_deref().unwrap_or_default();
            match w.silence_ms {
                Some(ms) => format!(
                    "a line matching /{pattern}/ appended to {p}, or {} without growing",
                    quiet(ms)
                ),
                None => format!("a line matching /{pattern}/ appended to {p}"),
            }
        }
        ("any", _, _) => format!(
            "the first of: {}",
            w.conditions.as_deref().unwrap_or_default().join(" ")
        ),
        (k, _, _) => format!("a {k} wait"),
    };
    let state = match online {
        Some(true) => String::new(),
        Some(false) => format!("; {device} is offline and gets the wait when it reconnects"),
        None => String::new(),
    };
    format!(
        "waiting on {device} for {what} (waitpoint {}, session {}){state}; at most {}",
        c.waitpoint.head.id,
        c.waitpoint.head.session,
        human(timeout)
    )
}
