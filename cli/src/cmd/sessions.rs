//! `cortex sessions` and `cortex session new|say|events`: listing, creating and posting to
//! sessions, and reading their event log (with `--follow`, by long polls).

use std::io::Write;
use std::thread;
use std::time::Duration;

use anyhow::Context;
use cortex_protocol::api::{CreateSession, MessagePosted, PostMessage, SessionView, When};
use serde_json::Value;

use super::{print_raw, short, table};
use crate::hub::{Hub, segment};
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
    let rows: Vec<Vec<String>> = sessions
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.title
                    .as_deref()
                    .map_or_else(|| "-".to_string(), |t| short(t, 40)),
                s.armed_waitpoints.to_string(),
                format!(
                    "{} ({})",
                    utc(s.created_at),
                    crate::timefmt::relative(s.created_at, now)
                ),
            ]
        })
        .collect();
    table(out, &["ID", "TITLE", "ARMED", "CREATED"], &rows)
}

pub fn new(
    hub: &Hub,
    title: Option<String>,
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let reply = hub
        .post(
            "/api/sessions",
            &CreateSession {
                title,
                ..Default::default()
            },
        )
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

pub fn say(
    hub: &Hub,
    sid: &str,
    text: &str,
    now: bool,
    dedupe_key: Option<String>,
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let body = PostMessage {
        text: text.to_string(),
        when: if now { When::Now } else { When::NextTurn },
        dedupe_key,
    };
    let reply = hub
        .post(&format!("/api/sessions/{}/messages", segment(sid)), &body)
        .with_context(|| format!("posting to session {sid}"))?;
    if json {
        return print_raw(out, &reply);
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
