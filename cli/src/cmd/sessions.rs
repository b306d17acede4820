//! `cortex sessions` and `cortex session new|say|delete|result|events`: listing, creating,
//! deleting and posting to sessions (with `say --follow`, printing the model's answer as it streams),
//! the last run's result, and the event log (with `events --follow`, by long polls).

use std::io::Write;
use std::thread;
use std::time::Duration;

use anyhow::Context;
use cortex_protocol::api::{
    Compaction, CreateSession, Envelope, MessagePosted, OutputConfig, Policy, PostMessage,
    SessionResult, SessionView, When,
};
use serde_json::Value;

use super::follow::{Follow, FollowError, Item, Screen};
use super::render::{self, Options, Render, Scope};
use super::{NewArgs, Term, print_raw, short, table};
use crate::hub::{Hub, Reply, segment};
use crate::timefmt::{now_ms, utc};

/// How long the hub may hold a `--follow` poll open.
const FOLLOW_WAIT_SECS: u64 = 30;
const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

pub fn list(hub: &Hub, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = hub.get("/api/sessions").context("listing the sessions")?;
    if json {
        return print_raw(out, &reply);
    }
    let sessions: Vec<SessionView> = reply.json("GET /api/sessions")?;
    if sessions.is_empty() {
        writeln!(
            out,
            "no sessions yet; create one with: cortex session new --title TITLE"
        )?;
        return Ok(());
    }
    let now = now_ms();
    let rows: Vec<Vec<String>> = newest_first(sessions)
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.title
                    .as_deref()
                    .map_or_else(|| "-".to_string(), |t| short(t, 40)),
                s.state.words().to_string(),
                if s.runs { "agent" } else { "mailbox" }.to_string(),
                s.armed_waitpoints.to_string(),
                format!(
                    "{} ({})",
                    utc(s.created_at),
                    crate::timefmt::relative(s.created_at, now)
                ),
            ]
        })
        .collect();
    table(
        out,
        &["ID", "TITLE", "STATE", "KIND", "ARMED", "CREATED"],
        &rows,
    )
}

/// Sessions as people list them: the newest first.
pub fn newest_first(mut sessions: Vec<SessionView>) -> Vec<SessionView> {
    sessions.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
    sessions
}

/// The body of `POST /api/sessions` from `cortex session new`'s flags; `@FILE` and `@-`
/// (with `read_stdin`) are read here.
pub fn create_body(
    args: &NewArgs,
    read_stdin: &mut dyn FnMut() -> std::io::Result<String>,
) -> anyhow::Result<CreateSession> {
    let mut stdin_taken = false;
    let mut load = |flag: &str, v: &str| -> anyhow::Result<String> {
        match v.strip_prefix('@') {
            Some(lit) if lit.starts_with('@') => Ok(lit.to_string()),
            Some("-") => {
                anyhow::ensure!(
                    !stdin_taken,
                    "{flag} @-: stdin was already read for another flag; give one of them a file"
                );
                stdin_taken = true;
                read_stdin().with_context(|| format!("{flag} @-: reading stdin"))
            }
            Some(path) => std::fs::read_to_string(path)
                .with_context(|| format!("{flag} @{path}: cannot read the file")),
            None => Ok(v.to_string()),
        }
    };
    let instructions = match &args.instructions {
        Some(v) => Some(load("--instructions", v)?),
        None => None,
    };
    let examples = match &args.examples {
        Some(v) => {
            anyhow::ensure!(
                v.starts_with('@') && !v.starts_with("@@"),
                "--examples takes @FILE (or @-): a file holding a JSON array of chat messages"
            );
            let text = load("--examples", v)?;
            let list: Vec<Value> = serde_json::from_str(&text).with_context(|| {
                format!("--examples {v}: not a JSON array of chat messages (objects with role and content)")
            })?;
            if let Some(i) = list.iter().position(|m| !m.is_object()) {
                anyhow::bail!("--examples {v}: message {i} is not a JSON object");
            }
            Some(list)
        }
        None => None,
    };
    // `--allow ''` is an empty list (no tool), not a tool named "".
    let tools = |list: &Option<Vec<String>>| {
        list.as_ref().map(|l| {
            l.iter()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
                .collect::<Vec<_>>()
        })
    };
    let policy = (args.require_approval.is_some()
        || args.deny.is_some()
        || args.allow.is_some()
        || args.approval_timeout.is_some())
    .then(|| Policy {
        allow: tools(&args.allow),
        deny: tools(&args.deny),
        require_approval: tools(&args.require_approval),
        approval_timeout_ms: args
            .approval_timeout
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    });
    let output = match &args.schema {
        Some(v) => {
            anyhow::ensure!(
                v.starts_with('@') && !v.starts_with("@@"),
                "--schema takes @FILE (or @-): a file holding the JSON Schema of the answer's data"
            );
            let text = load("--schema", v)?;
            let schema: Value = serde_json::from_str(&text).with_context(|| {
                format!("--schema {v}: not JSON (a JSON Schema is a JSON object)")
            })?;
            Some(OutputConfig {
                schema,
                strategy: args.strategy.unwrap_or_default(),
                force_tool: false,
                doc: None,
            })
        }
        None => None,
    };
    Ok(CreateSession {
        title: args.title.clone(),
        instructions,
        examples,
        max_tokens: args.max_tokens,
        stop: None,
        policy,
        unattended: args.unattended.then_some(true),
        output,
        runs: args.runs.then_some(true),
    })
}

pub fn new(hub: &Hub, body: &CreateSession, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = hub
        .post("/api/sessions", body)
        .context("creating a session")?;
    if json {
        return print_raw(out, &reply);
    }
    let v: Value = reply.json("POST /api/sessions")?;
    let id = v["id"]
        .as_str()
        .context("the hub's answer to POST /api/sessions has no id")?;
    writeln!(out, "{id}")?;
    Ok(())
}

/// `cortex session delete SID`: `DELETE /api/sessions/{sid}`.
pub fn delete(hub: &Hub, sid: &str, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = hub
        .delete(&format!("/api/sessions/{}", segment(sid)))
        .with_context(|| format!("deleting session {sid}"))?;
    if json {
        return print_raw(out, &reply);
    }
    writeln!(
        out,
        "deleted session {sid} (its armed waitpoints were cancelled; a late signal is told \"already resolved\")"
    )?;
    Ok(())
}

/// A message to post (`cortex session say`).
#[derive(Debug, Clone)]
pub struct Post<'a> {
    pub sid: &'a str,
    pub text: &'a str,
    pub now: bool,
    pub dedupe_key: Option<String>,
}

impl Post<'_> {
    pub(super) fn send(&self, hub: &Hub) -> anyhow::Result<Reply> {
        let body = PostMessage {
            text: self.text.to_string(),
            when: if self.now { When::Now } else { When::NextTurn },
            dedupe_key: self.dedupe_key.clone(),
        };
        hub.post(
            &format!("/api/sessions/{}/messages", segment(self.sid)),
            &body,
        )
        .with_context(|| format!("posting to session {}", self.sid))
    }
}

pub fn say(
    hub: &Hub,
    post: &Post,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<()> {
    let reply = post.send(hub)?;
    if json {
        print_raw(out, &reply)?;
        let posted: MessagePosted = reply.json("POST /api/sessions/{sid}/messages")?;
        if !posted.runs {
            writeln!(err, "cortex: {}", no_turn(&posted))?;
        }
        return Ok(());
    }
    let posted: MessagePosted = reply.json("POST /api/sessions/{sid}/messages")?;
    if posted.duplicate {
        writeln!(
            out,
            "seq {} (a duplicate: this dedupe key was posted before)",
            posted.seq
        )?;
    } else {
        writeln!(out, "seq {}", posted.seq)?;
    }
    if !posted.runs {
        writeln!(err, "cortex: {}", no_turn(&posted))?;
    }
    Ok(())
}

/// What `say` tells when nothing will answer: the hub runs no model.
pub const NO_MODEL: &str = "the hub runs no model, so nothing will answer (the message is recorded); start the hub with CORTEX_LLM_BASE_URL (and CORTEX_LLM_MODEL) set";

/// What `say` tells when nothing will answer: the session is a mailbox.
pub const MAILBOX: &str = "this session is a mailbox, so no turn runs for it (the message is recorded for whoever reads its events); for a model's answers make an agent session: cortex session new --instructions TEXT (or --runs)";

/// Why no turn will take a post that says `runs: false`.
pub fn no_turn(posted: &MessagePosted) -> &'static str {
    if posted.mailbox { MAILBOX } else { NO_MODEL }
}

/// `cortex session say --follow`: posts with the stream already open (so no live piece is
/// missed), then prints the run that takes the message until its end. Exit status: 0 the
/// run ended ok, 1 with an error, 2 nothing will answer or the session or stream is lost.
pub fn say_follow(
    hub: &Hub,
    post: &Post,
    reasoning: bool,
    json: bool,
    term: &Term,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<u8> {
    let sid = post.sid;
    let Some(view) = session_view(hub, sid, err)? else {
        return Ok(2);
    };
    let mut follow = match Follow::open(hub, sid, view.last_seq) {
        Ok(f) => f,
        Err(e) => return follow_failed(e, err),
    };
    let reply = post.send(hub)?;
    let posted: MessagePosted = reply.json("POST /api/sessions/{sid}/messages")?;
    if json {
        print_raw(out, &reply)?;
    }
    if !posted.runs {
        writeln!(err, "cortex: {}", no_turn(&posted))?;
        return Ok(2);
    }
    if posted.duplicate {
        // The first post's run may be over already: read the log again from its message.
        if let Err(e) = follow.restart(posted.seq.saturating_sub(1)) {
            return follow_failed(e, err);
        }
    }
    let opts = Options {
        reasoning,
        width: term.columns(),
    };
    let mut render = Render::new(Scope::Message(posted.seq), opts);
    loop {
        let item = match follow.next_item() {
            Ok(i) => i,
            Err(e) => return follow_failed(e, err),
        };
        match item {
            Item::Message(m) => {
                let Some(ev) = render::parse(&m) else {
                    continue;
                };
                let outs = render.event(&ev, m.event == "live");
                if json {
                    // Every event of the followed run, live pieces included, as it came.
                    if render.target().is_some() && render::run_of(&ev.body) == render.target() {
                        writeln!(out, "{}", m.data)?;
                        out.flush()?;
                    }
                } else {
                    let mut screen = Screen {
                        text: &mut *out,
                        notes: Some(&mut *err),
                        dim: term.stdout_tty && reasoning,
                    };
                    screen.put(&outs).context("writing the answer")?;
                }
            }
            Item::Dropped { reason } => {
                writeln!(
                    err,
                    "cortex: the event stream dropped ({reason}); reconnecting"
                )?;
            }
            Item::Back => writeln!(err, "cortex: reconnected")?,
        }
        if let Some(end) = render.ended() {
            if end.result.ok {
                return Ok(0);
            }
            if !json {
                // The renderer's note on stderr said the code and the message.
                return Ok(1);
            }
            let (code, msg) = match &end.result.error {
                Some(e) => (e.code.as_str(), e.message.as_str()),
                None => ("unknown", "no reason given"),
            };
            writeln!(err, "cortex: the run failed: {code}: {msg}")?;
            return Ok(1);
        }
    }
}

fn follow_failed(e: FollowError, err: &mut dyn Write) -> anyhow::Result<u8> {
    writeln!(err, "cortex: {e}")?;
    Ok(2)
}

/// `cortex session result SID`: the last run's answer (`--json`: the whole body).
pub fn result(
    hub: &Hub,
    sid: &str,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<u8> {
    let reply = hub
        .get(&format!("/api/sessions/{}/result", segment(sid)))
        .with_context(|| format!("reading the last result of session {sid} (404: no run has ended in it yet, or no such session)"))?;
    let res: SessionResult = reply.json("GET /api/sessions/{sid}/result")?;
    if json {
        print_raw(out, &reply)?;
    } else if let Some(o) = res.result.output.as_ref().filter(|_| res.result.ok) {
        print_envelope(o, out, err)?;
    }
    if res.result.ok {
        return Ok(0);
    }
    if !json {
        match &res.result.error {
            Some(e) => writeln!(
                err,
                "cortex: run {} failed: {}",
                res.run_id,
                render::failure(e, &e.message)
            )?,
            None => writeln!(err, "cortex: run {} failed (no reason given)", res.run_id)?,
        }
    }
    Ok(1)
}

/// An answer on the terminal: its `data` as JSON on stdout (for `jq` and scripts) with
/// its `response` on stderr; without data, the `response` on stdout.
fn print_envelope(o: &Envelope, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<()> {
    match (&o.response, &o.data) {
        (r, Some(d)) => {
            writeln!(out, "{}", serde_json::to_string_pretty(d)?)?;
            if let Some(r) = r.as_deref().map(str::trim_end).filter(|r| !r.is_empty()) {
                writeln!(err, "{r}")?;
            }
        }
        (Some(r), None) => writeln!(out, "{}", r.trim_end())?,
        (None, None) => {}
    }
    Ok(())
}

/// Prints the events after `after`; with `follow`, keeps long-polling for new ones and rides
/// out hub restarts.
pub fn events(
    hub: &Hub,
    sid: &str,
    after: u64,
    follow: bool,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut cursor = after;
    let mut backoff = BACKOFF_START;
    let mut down = false;
    loop {
        let path = match follow {
            true => format!(
                "/api/sessions/{}/events?after={cursor}&wait={FOLLOW_WAIT_SECS}",
                segment(sid)
            ),
            false => format!("/api/sessions/{}/events?after={cursor}", segment(sid)),
        };
        let asked = match follow {
            true => hub.get_slow(&path, Duration::from_secs(FOLLOW_WAIT_SECS + 15)),
            false => hub.get(&path),
        };
        let reply = match asked {
            Ok(r) => r,
            Err(e) if follow && e.is_transient() => {
                if !down {
                    writeln!(err, "cortex: {e}; retrying until it is back")?;
                    down = true;
                }
                thread::sleep(backoff);
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
            Err(e) => {
                return Err(e).with_context(|| format!("reading the events of session {sid}"));
            }
        };
        if down {
            writeln!(err, "cortex: the hub is back")?;
            down = false;
            backoff = BACKOFF_START;
        }
        let page: Value = reply.json("GET /api/sessions/{sid}/events")?;
        let list = events_of(&page)?;
        let before = cursor;
        for ev in list {
            if json {
                writeln!(out, "{}", serde_json::to_string(ev)?)?;
            } else {
                writeln!(out, "{}", event_line(ev))?;
            }
            cursor = cursor.max(ev["seq"].as_u64().unwrap_or(cursor));
        }
        out.flush()?;
        // Without --follow, read page after page until the log is exhausted.
        if !follow && (list.is_empty() || cursor == before) {
            return Ok(());
        }
    }
}

/// How long `cortex session compact` waits for the runner's answer.
const COMPACT_WAIT: Duration = Duration::from_secs(600);

/// `cortex session compact SID`: asks for a compaction now and waits for the runner's
/// `compaction` event answering it (an error when it summarized nothing).
pub fn compact(hub: &Hub, sid: &str, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = hub
        .post(
            &format!("/api/sessions/{}/compact", segment(sid)),
            &serde_json::json!({}),
        )
        .with_context(|| format!("asking session {sid} for a compaction"))?;
    let posted: Value = reply.json("POST /api/sessions/{sid}/compact")?;
    let mut cursor = posted["seq"].as_u64().unwrap_or(0);
    let until = std::time::Instant::now() + COMPACT_WAIT;
    while std::time::Instant::now() < until {
        let path = format!(
            "/api/sessions/{}/events?after={cursor}&wait={FOLLOW_WAIT_SECS}",
            segment(sid)
        );
        let page: Value = hub
            .get_slow(&path, Duration::from_secs(FOLLOW_WAIT_SECS + 15))
            .with_context(|| format!("reading the events of session {sid}"))?
            .json("GET /api/sessions/{sid}/events")?;
        for ev in events_of(&page)? {
            cursor = cursor.max(ev["seq"].as_u64().unwrap_or(cursor));
            if ev["kind"] != "compaction" || ev["cause"] != "forced" {
                continue;
            }
            if json {
                writeln!(out, "{}", serde_json::to_string(ev)?)?;
            }
            let c: Compaction = serde_json::from_value(ev.clone())
                .context("the hub's compaction event is not one")?;
            if let Some(e) = &c.error {
                anyhow::bail!("session {sid} was not compacted: {e}");
            }
            if !json {
                writeln!(out, "{}", render::compaction_line(&c))?;
            }
            return Ok(());
        }
    }
    anyhow::bail!(
        "session {sid} was asked for a compaction (seq {}) and has not answered in {} s; it does at its next boundary (cortex session events {sid} --follow shows it)",
        posted["seq"],
        COMPACT_WAIT.as_secs()
    )
}

/// The `events` array of an events page.
pub fn events_of(page: &Value) -> anyhow::Result<&Vec<Value>> {
    page["events"]
        .as_array()
        .context("the hub's events page has no `events` array")
}

/// One event for people: seq, time, kind and a short summary; a wake's text follows,
/// indented, as the agent reads it.
pub fn event_line(ev: &Value) -> String {
    let seq = ev["seq"].as_u64().unwrap_or(0);
    let ts = ev["ts"].as_u64().map(utc).unwrap_or_default();
    let kind = ev["kind"].as_str().unwrap_or("?");
    let wp = &ev["waitpoint"];
    let wp_ref = || {
        format!(
            "{} \"{}\"",
            wp["id"].as_str().unwrap_or("?"),
            wp["label"].as_str().unwrap_or("")
        )
    };
    let summary = match kind {
        "message" => {
            let now = if ev["when"] == "now" { "[now] " } else { "" };
            format!("{now}{}", short(ev["text"].as_str().unwrap_or(""), 100))
        }
        "wake" => {
            let text = ev["text"].as_str().unwrap_or("");
            let indented: String = text
                .lines()
                .map(|l| match l.trim() {
                    "" => "\n".to_string(),
                    _ => format!("\n    {l}"),
                })
                .collect();
            format!(
                "{} {}{indented}",
                wp_ref(),
                ev["reason"].as_str().unwrap_or("?")
            )
        }
        "waitpoint-armed" => wp_ref(),
        "compaction" => match serde_json::from_value::<Compaction>(ev.clone()) {
            Ok(c) => render::compaction_line(&c),
            Err(_) => "?".to_string(),
        },
        "waitpoint-cancelled" => format!("{} by {}", wp_ref(), ev["by"].as_str().unwrap_or("?")),
        _ => {
            let mut rest = ev.clone();
            if let Some(obj) = rest.as_object_mut() {
                for k in ["seq", "ts", "kind"] {
                    obj.remove(k);
                }
            }
            short(&rest.to_string(), 100)
        }
    };
    format!("{seq:>5}  {ts}  {kind:<19}  {summary}")
}

/// The session `sid`; `None` (said on `err`) when the hub has no such session.
pub fn session_view(
    hub: &Hub,
    sid: &str,
    err: &mut dyn Write,
) -> anyhow::Result<Option<SessionView>> {
    match hub.get(&format!("/api/sessions/{}", segment(sid))) {
        Ok(r) => Ok(Some(r.json::<SessionView>("GET /api/sessions/{sid}")?)),
        Err(e) if e.status() == Some(404) => {
            writeln!(err, "cortex: {e}")?;
            Ok(None)
        }
        Err(e) => Err(e).with_context(|| format!("reading session {sid}")),
    }
}
