//! Remote waits on the device: the hub's `WaitArm` run through the wait library
//! ([`cortex_host::wait`]), one task per armed wait, their outcomes kept until the hub
//! acknowledges them, and all of it persisted so a restarted agent re-arms what it held.
//!
//! The daemon loop owns a [`RemoteWaits`] and drives it from its one `handle`: a hub frame
//! (`arm`, `cancel`, `ack`), a task's outcome (`finished`), a link going up (`link_up`:
//! every unacknowledged outcome is queued again). Frames for the hub go into a queue the
//! loop pumps into the link when it has room ([`RemoteWaits::pump`]); nothing here
//! touches a socket.
//!
//! Identity: the waitpoint id is the wait's id on both sides. A `WaitArm` for an id this
//! agent already holds (armed, or ended and not yet acknowledged) arms nothing: it is
//! answered again, so two waits on one condition for one waitpoint never exist.
//!
//! Persistence: `$CORTEX_HOME/agent/waits.json`, replaced atomically (temp file, fsync,
//! rename, fsync of the directory) on the loop's tick (each second) when the state
//! changed, and at a clean stop. It
//! holds each armed wait's *resume* spec (a pid pinned to the start time read at arm time,
//! so a pid reused while the agent was down is never followed; a file with its arm-time
//! cursor, so a write made meanwhile fires; a log with its arm-time position, so a line
//! appended meanwhile is read and none from before the arm; an any with each of these)
//! and its deadline, and each unacknowledged
//! outcome. At start every wait is armed again: a pid that exited meanwhile fires at once.
//! Losing the file loses nothing the hub wants: the hello lists the ids held, and the hub
//! sends again what it wants and this agent lacks.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cortex_protocol::mesh::{AgentFrame, Frame, MAX_WAITS_PER_DEVICE, WaitEnd};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use cortex_host::wait::{Captured, Gone, WaitError, WaitOptions, WaitOutcome, WaitSpec, Waits};

use super::{FrameSink, now_ms};

/// The file's format version.
const FILE_VERSION: u32 = 1;

/// A wait's end as its task reports it to the loop.
#[derive(Debug)]
pub struct Finished {
    pub id: String,
    /// Which arming of `id` this is: an outcome that raced a cancel is not taken for a
    /// later arming of the same id.
    pub run: u64,
    pub outcome: WaitOutcome,
}

/// One armed wait, as persisted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldWait {
    pub id: String,
    /// The resume spec (see the module docs).
    pub spec: WaitSpec,
    /// The bound on this machine's clock, ms since the epoch.
    pub deadline_ms: u64,
    pub armed_at_ms: u64,
    /// What arming found, JSON.
    pub captured: String,
}

/// One ended wait whose outcome the hub has not acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoneWait {
    pub id: String,
    pub outcome: WaitEnd,
    pub payload: String,
    pub message: String,
}

/// `waits.json`.
#[derive(Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitsFile {
    pub version: u32,
    #[serde(default)]
    pub waits: Vec<HeldWait>,
    #[serde(default)]
    pub outbox: Vec<DoneWait>,
}

/// Why the waits file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum WaitStoreError {
    #[error("cannot {action} {}: {source}", .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{} is not a waits file of this agent ({why}); it was moved aside to {}, and the hub sends again the waits it wants",
        .path.display(), .aside.display()
    )]
    Corrupt {
        path: PathBuf,
        aside: PathBuf,
        why: String,
    },
}

/// Reads and replaces `waits.json`.
#[derive(Debug, Clone)]
pub struct WaitsStore {
    path: PathBuf,
}

impl WaitsStore {
    /// The file under `home`: `home/agent/waits.json`.
    pub fn under(home: &Path) -> WaitsStore {
        WaitsStore {
            path: home.join("agent").join("waits.json"),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The saved state; empty when there is no file. A file that cannot be parsed is moved
    /// aside (kept for a person to look at) and reported, and an empty state returned.
    pub fn load(&self) -> (WaitsFile, Option<WaitStoreError>) {
        let bytes = match fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return (WaitsFile::default(), None),
            Err(source) => {
                return (
                    WaitsFile::default(),
                    Some(WaitStoreError::Io {
                        action: "read",
                        path: self.path.clone(),
                        source,
                    }),
                );
            }
        };
        let why = match serde_json::from_slice::<WaitsFile>(&bytes) {
            Ok(f) if f.version == FILE_VERSION => return (f, None),
            Ok(f) => format!("version {}, this agent reads {FILE_VERSION}", f.version),
            Err(e) => e.to_string(),
        };
        let aside = self.path.with_extension(format!("json.bad-{}", now_ms()));
        let _ = fs::rename(&self.path, &aside);
        (
            WaitsFile::default(),
            Some(WaitStoreError::Corrupt {
                path: self.path.clone(),
                aside,
                why,
            }),
        )
    }

    /// Replaces the file atomically and durably (`cortex_host::atomic`).
    pub fn save(&self, file: &WaitsFile) -> Result<(), WaitStoreError> {
        let err = |action: &'static str, path: &Path| {
            let path = path.to_owned();
            move |source| WaitStoreError::Io {
                action,
                path,
                source,
            }
        };
        let dir = self.path.parent().unwrap_or(Path::new("/"));
        create_private_dir(dir).map_err(err("create", dir))?;
        let body = serde_json::to_vec(file)
            .map_err(|e| io::Error::other(e.to_string()))
            .map_err(err("encode", &self.path))?;
        let mut body = body;
        body.push(b'\n');
        cortex_host::atomic::write_file(&self.path, &body, 0o666).map_err(err("write", &self.path))
    }
}

fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// An armed wait in memory: what is persisted, and its task.
struct Live {
    held: HeldWait,
    run: u64,
    task: JoinHandle<()>,
}

impl Drop for Live {
    fn drop(&mut self) {
        // Dropping the wait's future releases its pidfd, watches and lock file.
        self.task.abort();
    }
}

/// The agent's remote waits; see the module docs.
pub struct RemoteWaits {
    waits: Waits,
    store: WaitsStore,
    live: HashMap<String, Live>,
    /// Ended, not acknowledged, by id (ordered, so resends go oldest id first).
    outbox: BTreeMap<String, DoneWait>,
    /// Encoded frames for the hub, sent when the link has room.
    queue: VecDeque<Vec<u8>>,
    /// Numbers each arming (see [`Finished::run`]).
    runs: u64,
    finished: mpsc::Sender<Finished>,
    /// The state changed since it was last saved.
    dirty: bool,
    /// The last save failed (logged once per streak).
    save_failing: bool,
    /// Ended waits not yet logged: (id, outcome, message).
    ended_unlogged: Vec<(String, &'static str, String)>,
}

impl std::fmt::Debug for RemoteWaits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteWaits")
            .field("armed", &self.live.len())
            .field("outbox", &self.outbox.len())
            .field("queued", &self.queue.len())
            .finish_non_exhaustive()
    }
}

impl RemoteWaits {
    /// Empty; `finished` is where the waits' tasks report.
    pub fn new(waits: Waits, store: WaitsStore, finished: mpsc::Sender<Finished>) -> Self {
        RemoteWaits {
            waits,
            store,
            live: HashMap::new(),
            outbox: BTreeMap::new(),
            queue: VecDeque::new(),
            runs: 0,
            finished,
            dirty: false,
            save_failing: false,
            ended_unlogged: Vec::new(),
        }
    }

    /// Loads the saved state and arms every wait in it again (inside the runtime).
    pub fn restore(&mut self) {
        let (file, problem) = self.store.load();
        if let Some(e) = problem {
            tracing::error!(error = %e, "remote waits: the saved state is unusable");
        }
        let now = now_ms();
        let (n_waits, n_out) = (file.waits.len(), file.outbox.len());
        for d in file.outbox {
            self.outbox.insert(d.id.clone(), d);
        }
        for h in file.waits {
            if self.outbox.contains_key(&h.id) || self.live.contains_key(&h.id) {
                continue;
            }
            let left = Duration::from_millis(h.deadline_ms.saturating_sub(now));
            let spec = h.spec.clone();
            self.start(h.id.clone(), &spec, left, Some(h));
        }
        if n_waits + n_out > 0 {
            tracing::info!(
                armed = n_waits,
                unacknowledged = n_out,
                "remote waits restored from {}",
                self.store.path().display()
            );
        }
    }

    /// Every id held, armed or ended and unacknowledged: the hello's `waits`.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .live
            .keys()
            .chain(self.outbox.keys())
            .cloned()
            .collect();
        ids.sort();
        ids.dedup();
        ids.truncate(MAX_WAITS_PER_DEVICE);
        ids
    }

    pub fn armed(&self) -> usize {
        self.live.len()
    }

    pub fn unacknowledged(&self) -> usize {
        self.outbox.len()
    }

    /// The hub's `WaitArm`.
    pub fn arm(&mut self, id: String, spec: &WaitSpec, timeout: Duration) {
        if let Some(l) = self.live.get(&id) {
            // Already armed: say so again, arm nothing new.
            let frame = armed_frame(&l.held);
            self.enqueue(frame);
            return;
        }
        if let Some(d) = self.outbox.get(&id) {
            // Already ended: its outcome, again.
            let frame = done_frame(d);
            self.enqueue(frame);
            return;
        }
        if self.live.len() + self.outbox.len() >= MAX_WAITS_PER_DEVICE {
            self.end(
                id,
                WaitEnd::Broke,
                json!({}),
                format!(
                    "this agent holds {MAX_WAITS_PER_DEVICE} remote waits already; end some before arming more"
                ),
            );
            return;
        }
        self.start(id, spec, timeout, None);
    }

    /// Arms `spec` and starts its task; `restored` is the persisted record of a wait armed
    /// before a restart (its deadline and first arm time are kept).
    fn start(&mut self, id: String, spec: &WaitSpec, left: Duration, restored: Option<HeldWait>) {
        if let Err(why) = check_absolute(spec) {
            self.end(id, WaitEnd::Broke, json!({}), why);
            return;
        }
        let armed = match self.waits.arm(spec) {
            Ok(a) => a,
            // `must_exist` and the pid not running: the wait breaks, it never fires.
            Err(e @ WaitError::NotRunning { pid }) => {
                let payload = json!({"kind": "pid", "pid": pid, "running": false});
                self.end(id, WaitEnd::Broke, payload, e.to_string());
                return;
            }
            Err(e) => {
                let msg = format!("cannot wait for {}: {e}", spec.describe());
                self.end(id, WaitEnd::Broke, json!({"error": e.to_string()}), msg);
                return;
            }
        };
        let now = now_ms();
        let held = HeldWait {
            id: id.clone(),
            spec: armed.resume_spec(),
            deadline_ms: restored
                .as_ref()
                .map_or_else(|| now.saturating_add(ms(left)), |r| r.deadline_ms),
            armed_at_ms: restored.as_ref().map_or(now, |r| r.armed_at_ms),
            captured: captured_json(&armed.captured()).to_string(),
        };
        let tx = self.finished.clone();
        let task_id = id.clone();
        self.runs += 1;
        let run = self.runs;
        let task = tokio::spawn(async move {
            let outcome = armed.wait(&WaitOptions::new(left)).await;
            let _ = tx
                .send(Finished {
                    id: task_id,
                    run,
                    outcome,
                })
                .await;
        });
        let frame = armed_frame(&held);
        self.enqueue(frame);
        self.live.insert(id, Live { held, run, task });
        self.dirty = true;
    }

    /// A wait's task ended. `exit_of` tells how a pid this agent started ended (the exec
    /// runs'), so a pid wait on one carries its exit code.
    pub fn finished(
        &mut self,
        f: Finished,
        exit_of: impl FnOnce(i32, Option<u64>) -> Option<super::exec::ExitInfo>,
    ) {
        if self.live.get(&f.id).is_none_or(|l| l.run != f.run) {
            // Cancelled while its outcome was on the way.
            return;
        }
        let Some(live) = self.live.remove(&f.id) else {
            return;
        };
        let h = &live.held;
        let (end, mut payload, mut message) = describe(h, f.outcome);
        if end == WaitEnd::Fired
            && let WaitSpec::Pid {
                pid, start_time, ..
            } = &h.spec
            && let Some(exit) = exit_of(*pid, *start_time)
            && let Value::Object(m) = &mut payload
        {
            m.insert("exit_code".into(), json!(exit.code));
            if let Some(sig) = exit.signal {
                m.insert("signal".into(), json!(sig));
            }
            message = if message.ends_with("exited") {
                format!("{message} {}", exit.describe())
            } else {
                format!("{message} (it exited {})", exit.describe())
            };
        }
        // Logged once the frame is on its way (see `log_ended`).
        self.ended_unlogged
            .push((f.id.clone(), end.as_str(), message.clone()));
        self.end(f.id, end, payload, message);
    }

    /// Whether outcomes wait to be logged.
    pub fn has_unlogged(&self) -> bool {
        !self.ended_unlogged.is_empty()
    }

    /// Logs the outcomes ended since the last call. The loop calls it after letting the
    /// link's writer send their frames: a log line costs tens of microseconds, which the
    /// hub would otherwise wait for.
    pub fn log_ended(&mut self) {
        for (id, end, message) in self.ended_unlogged.drain(..) {
            cortex_host::timing::record("remote_wait_ended", &id, None);
            tracing::info!(wait = %id, outcome = end, message = %message, "remote wait ended");
        }
    }

    fn end(&mut self, id: String, outcome: WaitEnd, payload: Value, message: String) {
        let d = DoneWait {
            id: id.clone(),
            outcome,
            payload: payload.to_string(),
            message,
        };
        let frame = done_frame(&d);
        self.outbox.insert(id, d);
        self.enqueue(frame);
        self.dirty = true;
    }

    /// The hub's `WaitCancel`: the wait (or its unacknowledged outcome) is dropped.
    pub fn cancel(&mut self, id: &str) {
        let armed = self.live.remove(id).is_some();
        let ended = self.outbox.remove(id).is_some();
        if armed || ended {
            tracing::info!(wait = id, "remote wait cancelled by the hub");
            self.dirty = true;
        }
    }

    /// The hub's `WaitAck`: the outcome is recorded there.
    pub fn ack(&mut self, id: &str) {
        if self.outbox.remove(id).is_some() {
            self.dirty = true;
        }
    }

    /// A link is up: every unacknowledged outcome goes again (the hub counts it once).
    pub fn link_up(&mut self) {
        self.queue.clear();
        let frames: Vec<Vec<u8>> = self.outbox.values().filter_map(done_frame).collect();
        self.queue.extend(frames);
    }

    /// The link is gone: queued frames are dropped (the next link's hello and resends
    /// cover them).
    pub fn link_down(&mut self) {
        self.queue.clear();
    }

    fn enqueue(&mut self, frame: Option<Vec<u8>>) {
        if let Some(f) = frame {
            self.queue.push_back(f);
        }
    }

    /// Sends queued frames while `sink` takes them.
    pub fn pump(&mut self, sink: &mut impl FrameSink) {
        while let Some(f) = self.queue.pop_front() {
            if !sink.try_send(f.clone()) {
                self.queue.push_front(f);
                return;
            }
        }
    }

    /// Frames waiting for room on the link.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    pub fn dirty(&self) -> bool {
        self.dirty
    }

    /// Saves the state if it changed. A failure is logged (once per streak) and retried
    /// at the next call.
    pub fn persist(&mut self) {
        if !self.dirty {
            return;
        }
        match self.store.save(&self.snapshot()) {
            Ok(()) => {
                self.dirty = false;
                if self.save_failing {
                    tracing::info!("remote waits: saving works again");
                }
                self.save_failing = false;
            }
            Err(e) => {
                if !self.save_failing {
                    tracing::error!(error = %e, "remote waits: cannot save their state; retrying each second (a restart now would lose what changed; the hub sends its waits again)");
                }
                self.save_failing = true;
            }
        }
    }

    /// What is saved.
    pub fn snapshot(&self) -> WaitsFile {
        let mut waits: Vec<HeldWait> = self.live.values().map(|l| l.held.clone()).collect();
        waits.sort_by(|a, b| a.id.cmp(&b.id));
        WaitsFile {
            version: FILE_VERSION,
            waits,
            outbox: self.outbox.values().cloned().collect(),
        }
    }
}

/// Each armed pid wait holds a pidfd, and a file or flock wait a descriptor or a watch:
/// [`MAX_WAITS_PER_DEVICE`] waits need more descriptors than the usual soft limit of 1,024.
/// Raises the soft limit towards the hard one (as Go's runtime does at start); returns the
/// soft limit now in force.
pub fn raise_fd_limit() -> Option<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    const WANT: u64 = 65_536;
    let now = getrlimit(Resource::Nofile);
    let soft = now.current?;
    let target = now.maximum.map_or(WANT, |hard| hard.min(WANT));
    if soft >= target {
        return Some(soft);
    }
    match setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(target),
            maximum: now.maximum,
        },
    ) {
        Ok(()) => Some(target),
        Err(e) => {
            tracing::warn!(error = %e, soft, "cannot raise the open-file limit; remote waits beyond it will break with EMFILE");
            Some(soft)
        }
    }
}

fn armed_frame(h: &HeldWait) -> Option<Vec<u8>> {
    encode(&AgentFrame::WaitArmed {
        wait_id: h.id.clone(),
        captured: h.captured.clone(),
        resume: Some(h.spec.clone()),
    })
}

fn done_frame(d: &DoneWait) -> Option<Vec<u8>> {
    encode(&AgentFrame::WaitDone {
        wait_id: d.id.clone(),
        outcome: d.outcome,
        payload: d.payload.clone(),
        message: d.message.clone(),
    })
}

fn encode(f: &AgentFrame) -> Option<Vec<u8>> {
    match f.encode() {
        Ok(b) => Some(b),
        Err(e) => {
            tracing::error!(error = %e, "cannot encode a remote wait's frame");
            None
        }
    }
}

/// Refuses a spec whose path is relative: it means nothing to a daemon whose working
/// directory is not the asker's.
pub fn check_absolute(spec: &WaitSpec) -> Result<(), String> {
    cortex_protocol::waits::check(spec, cortex_protocol::waits::Place::Device)
        .map_err(|e| e.to_string())
}

/// What arming found, as the JSON the hub shows.
pub fn captured_json(c: &Captured) -> Value {
    match c {
        Captured::Pid(p) => json!({
            "kind": "pid",
            "pid": p.pid,
            "comm": p.comm,
            "start_time": p.start_time,
            "started_at_ms": p.started_at_ms,
            "method": p.method.as_str(),
            "already_gone": p.gone.is_some(),
            "reused": matches!(p.gone, Some(Gone::Reused { .. })),
        }),
        Captured::File(f) => {
            let mut v = json!({
                "kind": "file",
                "path": f.path.to_string_lossy(),
                "exists": f.now.exists,
                "size": f.now.size,
                "mtime_ns": f.now.mtime_ns,
                "watching_file": f.watching_file,
            });
            if let Value::Object(m) = &mut v {
                match f.silence_ms {
                    Some(ms) => {
                        m.insert("silence_ms".into(), json!(ms));
                    }
                    None => {
                        m.insert(
                            "changed_since_cursor".into(),
                            json!(f.since.is_some_and(|s| f.now.changed_since(&s))),
                        );
                    }
                }
            }
            v
        }
        Captured::Log(l) => json!({
            "kind": "log",
            "path": l.path.to_string_lossy(),
            "match": l.pattern,
            "exists": l.exists,
            "size": l.size,
            "start": l.start,
            "watching": l.watching,
            "silence_ms": l.silence_ms,
        }),
        Captured::Any(parts) => json!({
            "kind": "any",
            "conditions": parts.iter().map(captured_json).collect::<Vec<_>>(),
        }),
        Captured::Flock(l) => json!({
            "kind": "flock",
            "path": l.path.to_string_lossy(),
            "free": l.free,
            "closes_watched": l.hinted,
        }),
    }
}

/// An outcome as (end, payload, one line for people).
fn describe(h: &HeldWait, outcome: WaitOutcome) -> (WaitEnd, Value, String) {
    let captured: Value = serde_json::from_str(&h.captured).unwrap_or(Value::Null);
    let what = h.spec.describe();
    match outcome {
        WaitOutcome::Fired(fire) => {
            let message = fired_message(&h.spec, &captured, &fire.payload);
            (WaitEnd::Fired, fire.payload, message)
        }
        WaitOutcome::TimedOut => {
            let bound = human(h.deadline_ms.saturating_sub(h.armed_at_ms));
            let state = still(&h.spec);
            (
                WaitEnd::TimedOut,
                json!({}),
                format!("timed out after {bound}: {state}"),
            )
        }
        WaitOutcome::Broke(e) => (
            WaitEnd::Broke,
            json!({"error": e.to_string()}),
            format!("the wait for {what} broke: {e}"),
        ),
    }
}

/// One line for people about a fired wait: `pid 4242 (python) exited`,
/// `/runs/7/train.log: a line matched /nan/: "loss=nan"`, `/x has not grown for 20m`,
/// `any: log:/x~nan fired first: …`.
pub fn fired_message(spec: &WaitSpec, captured: &Value, payload: &Value) -> String {
    if let Some(note) = payload["note"].as_str() {
        return note.to_string();
    }
    let silent = payload["reason"].as_str() == Some("silent");
    match spec {
        WaitSpec::Pid { pid, .. } => match captured["comm"].as_str() {
            Some(comm) => format!("pid {pid} ({comm}) exited"),
            None => format!("pid {pid} exited"),
        },
        WaitSpec::File { path, .. } | WaitSpec::Log { path, .. } if silent => {
            let ms = payload["silent_ms"]
                .as_u64()
                .or(spec.silence_ms())
                .unwrap_or_default();
            format!(
                "{path} has not grown for {}",
                cortex_protocol::waits::format_duration_ms(ms)
            )
        }
        WaitSpec::File { path, .. } => {
            let ev = payload["event"].as_str().unwrap_or("written");
            format!("{path} was written ({ev})")
        }
        WaitSpec::Flock { path } => format!("the lock on {path} is free"),
        WaitSpec::Log { path, pattern, .. } => {
            let line = payload["line"].as_str().unwrap_or_default();
            format!("{path}: a line matched /{pattern}/: {line:?}")
        }
        WaitSpec::Any { conditions } => {
            let which = payload["which"].as_u64().unwrap_or_default() as usize;
            let Some(spec) = conditions.get(which) else {
                return format!("{}: it holds", spec.describe());
            };
            let inner = fired_message(spec, &captured["conditions"][which], &payload["fired"]);
            format!(
                "any: {} fired first: {inner}",
                cortex_protocol::waits::condition_string(spec)
            )
        }
    }
}

/// What a wait that timed out says still holds.
fn still(spec: &WaitSpec) -> String {
    match spec {
        WaitSpec::Pid { pid, .. } => format!("pid {pid} is still running"),
        WaitSpec::File {
            path,
            silence_ms: Some(_),
            ..
        } => format!("{path} kept growing"),
        WaitSpec::File { path, .. } => format!("no write to {path}"),
        WaitSpec::Flock { path } => format!("the lock on {path} is still held"),
        WaitSpec::Log { path, pattern, .. } => format!("no line matching /{pattern}/ in {path}"),
        WaitSpec::Any { conditions } => format!(
            "none of {} holds",
            conditions
                .iter()
                .map(cortex_protocol::waits::condition_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `1.5s`, `10m`, `2h`, `3d`: the bound as people read it.
fn human(ms: u64) -> String {
    let s = ms as f64 / 1000.0;
    let (v, unit) = if s < 60.0 {
        (s, "s")
    } else if s < 3600.0 {
        (s / 60.0, "m")
    } else if s < 86_400.0 {
        (s / 3600.0, "h")
    } else {
        (s / 86_400.0, "d")
    };
    let text = format!("{v:.1}");
    format!("{}{unit}", text.trim_end_matches(".0"))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
