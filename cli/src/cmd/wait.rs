//! `cortex wait create|check|cancel`: the waitpoint tools (arm, look, cancel) from the command
//! line. The secret is printed by `create` only: it is the one place it is handed out.

use std::io::Write;

use anyhow::Context;
use cortex_protocol::api::{
    CreateWaitpoint, SpawnConfig, WaitpointCreated, WaitpointList, WaitpointView,
};
use cortex_protocol::waits::DurationValue;

use super::{CreateArgs, print_list, print_raw, short, table};
use crate::hub::{Hub, segment};
use crate::timefmt::{now_ms, relative, utc};

const NO_SESSION: &str =
    "no session: pass --session SID or set CORTEX_SESSION (`cortex sessions` lists them)";

/// The request body from the flags; `--member` and `--members` add up, in order, once each;
/// `--spawn-instructions @FILE` (or `@-`) is read here.
pub fn create_body(args: &CreateArgs) -> anyhow::Result<CreateWaitpoint> {
    let mut members: Vec<String> = Vec::new();
    for m in args.member.iter().chain(&args.members).map(|m| m.trim()) {
        if !m.is_empty() && !members.iter().any(|x| x == m) {
            members.push(m.to_string());
        }
    }
    let seconds =
        |d: Option<std::time::Duration>| d.map(|d| DurationValue::Seconds(d.as_secs_f64()));
    let spawn = match &args.spawn_instructions {
        None => None,
        Some(v) => {
            let instructions = match v.strip_prefix('@') {
                Some(lit) if lit.starts_with('@') => lit.to_string(),
                Some("-") => std::io::read_to_string(std::io::stdin())
                    .context("--spawn-instructions @-: reading stdin")?,
                Some(path) => std::fs::read_to_string(path).with_context(|| {
                    format!("--spawn-instructions @{path}: cannot read the file")
                })?,
                None => v.clone(),
            };
            Some(SpawnConfig {
                instructions,
                title: args.spawn_title.clone(),
            })
        }
    };
    Ok(CreateWaitpoint {
        label: args.label.clone(),
        intent: args.intent.clone(),
        members: (!members.is_empty()).then_some(members),
        quorum: args.quorum,
        fail_fast: args.fail_fast,
        max_signals: args.max_signals,
        expires_in_hours: args
            .expires_in_hours
            .or(args.expires_in.map(|d| d.as_secs_f64() / 3600.0)),
        device: args.device.clone(),
        silence_after: seconds(args.silence_after),
        coalesce: seconds(args.coalesce),
        spawn,
    })
}

/// The request's fields and the `cortex wait create` flags that set them, for the hub's
/// refusals (`set max_signals above 1` is said `set --max-signals above 1`).
fn create_flags(args: &CreateArgs) -> Vec<(&'static str, &'static str)> {
    let expiry = if args.expires_in.is_some() {
        "--expires-in (in hours)"
    } else {
        "--expires-in-hours"
    };
    vec![
        ("max_signals", "--max-signals"),
        ("expires_in_hours", expiry),
        ("silence_after", "--silence-after"),
        ("fail_fast", "--fail-fast"),
        ("spawn.instructions", "--spawn-instructions"),
        ("spawn.title", "--spawn-title"),
        ("coalesce", "--coalesce"),
        ("quorum", "--quorum"),
        ("members", "--members"),
        ("label", "--label"),
        ("intent", "--intent"),
        ("spawn", "--spawn-instructions"),
    ]
}

pub fn create(hub: &Hub, args: &CreateArgs, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let sid = args
        .session
        .as_deref()
        .filter(|s| !s.is_empty())
        .context(NO_SESSION)?;
    let body = create_body(args)?;
    // A device the hub does not know is refused before anything is armed.
    if let Some(device) = &args.device {
        super::devices::require(hub, device)?;
    }
    let reply = match hub.post(&format!("/api/sessions/{}/waitpoints", segment(sid)), &body) {
        Ok(r) => r,
        Err(e) => match args.device.as_deref() {
            Some(d) if super::devices::is_unknown(&e, d) => {
                anyhow::bail!(super::devices::unknown(d))
            }
            _ => {
                return Err(super::refusal_in_flags(e, &create_flags(args)))
                    .with_context(|| format!("arming a waitpoint in session {sid}"));
            }
        },
    };
    if json {
        return print_raw(out, &reply);
    }
    let wp: WaitpointCreated = reply.json("POST /api/sessions/{sid}/waitpoints")?;
    let how = &wp.how_to_signal;
    let recommended = match how.recommended.as_str() {
        "shell" => &how.shell,
        "curl" => &how.curl,
        "attach_to_pid" => &how.attach_to_pid,
        _ => &how.cli,
    };
    writeln!(out, "{}  {}  {}", wp.head.id, wp.head.state, wp.head.label)?;
    writeln!(
        out,
        "secret: {}  (shown this once; give it to the job, not to a log)",
        wp.secret
    )?;
    writeln!(
        out,
        "expires: {} ({})",
        utc(wp.head.expires_at),
        relative(wp.head.expires_at, now_ms())
    )?;
    if let Some(ms) = wp.head.silence_after_ms {
        writeln!(
            out,
            "silent after: {} without a signal (once per quiet spell)",
            cortex_protocol::waits::format_duration_ms(ms)
        )?;
    }
    if let Some(ms) = wp.head.coalesce_ms {
        writeln!(
            out,
            "coalesce: reports within {} of the first are one wake",
            cortex_protocol::waits::format_duration_ms(ms)
        )?;
    }
    if wp.head.spawn {
        writeln!(out, "spawn: each wake starts a new session")?;
    }
    writeln!(out, "signal it with:")?;
    writeln!(out, "  {}", how.env)?;
    for line in recommended.lines() {
        writeln!(out, "  {line}")?;
    }
    if let Some(note) = &wp.member_note {
        writeln!(out, "note: {note}")?;
    }
    Ok(())
}

pub fn check(
    hub: &Hub,
    session: Option<&str>,
    wp: Option<&str>,
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let views = match wp {
        Some(id) => {
            let reply = hub
                .get(&format!("/api/waitpoints/{}", segment(id)))
                .with_context(|| format!("checking waitpoint {id}"))?;
            if json {
                return print_raw(out, &reply);
            }
            vec![reply.json::<WaitpointView>("GET /api/waitpoints/{id}")?]
        }
        None => {
            let sid = session.filter(|s| !s.is_empty()).context(
                "no session: pass --session SID or set CORTEX_SESSION, or give a waitpoint id (cortex wait check WP_ID)",
            )?;
            let reply = hub
                .get(&format!("/api/sessions/{}/waitpoints", segment(sid)))
                .with_context(|| format!("listing the waitpoints of session {sid}"))?;
            if json {
                return print_list(
                    out,
                    &reply,
                    "waitpoints",
                    "GET /api/sessions/{sid}/waitpoints",
                );
            }
            let list: WaitpointList = reply.json("GET /api/sessions/{sid}/waitpoints")?;
            if list.waitpoints.is_empty() {
                writeln!(
                    out,
                    "no waitpoints in session {sid}; arm one with: cortex wait create --label L --intent I"
                )?;
                return Ok(());
            }
            list.waitpoints
        }
    };
    let now = now_ms();
    let rows: Vec<Vec<String>> = views.iter().map(|v| row(v, now)).collect();
    table(out, &["ID", "LABEL", "STATE", "SIGNALS", "EXPIRES"], &rows)?;
    // One waitpoint asked for by id: everything `--json` has, for people.
    if let (Some(_), [v]) = (wp, views.as_slice()) {
        details(v, now, out)?;
    }
    Ok(())
}

/// One waitpoint's intent and rules, its signals (status, member, source, when, message),
/// its wakes (reason, when, delivered) and its badges, below its row.
fn details(v: &WaitpointView, now: u64, out: &mut dyn Write) -> anyhow::Result<()> {
    let at = |t: u64| format!("{} ({})", utc(t), relative(t, now));
    writeln!(out)?;
    writeln!(out, "intent: {}", short(&v.head.intent, 200))?;
    writeln!(out, "session: {}", v.head.session)?;
    if !v.head.members.is_empty() {
        writeln!(out, "members: {}", v.head.members.join(", "))?;
    }
    if let Some(d) = &v.head.device {
        writeln!(out, "device: {d}")?;
    }
    writeln!(
        out,
        "rules: quorum {}, fail_fast {}, max_signals {}",
        v.head.quorum, v.head.fail_fast, v.head.max_signals
    )?;
    let shown = v.signals.len() as u64;
    if v.signals.is_empty() {
        writeln!(out, "signals: none yet")?;
    } else {
        if v.signal_count > shown {
            writeln!(out, "signals (the latest {shown} of {}):", v.signal_count)?;
        } else {
            writeln!(out, "signals:")?;
        }
        let rows: Vec<Vec<String>> = v
            .signals
            .iter()
            .map(|s| {
                vec![
                    s.status.as_str().to_string(),
                    s.member.clone().unwrap_or_else(|| "-".into()),
                    s.source.clone(),
                    at(s.at),
                    s.message
                        .as_deref()
                        .map_or_else(|| "-".to_string(), |m| short(m, 80)),
                ]
            })
            .collect();
        indented(out, &["STATUS", "MEMBER", "SOURCE", "AT", "MESSAGE"], &rows)?;
    }
    if v.wakes.is_empty() {
        writeln!(out, "wakes: none yet")?;
    } else {
        writeln!(out, "wakes:")?;
        let rows: Vec<Vec<String>> = v
            .wakes
            .iter()
            .map(|w| {
                let delivered = match (w.delivered, &w.spawned) {
                    (true, Some(sid)) => format!("yes (started {sid})"),
                    (true, None) => "yes".to_string(),
                    (false, _) => "no (due)".to_string(),
                };
                vec![w.reason.as_str().to_string(), at(w.at), delivered]
            })
            .collect();
        indented(out, &["REASON", "AT", "DELIVERED"], &rows)?;
    }
    let b = &v.badges;
    let mut badges = vec![format!(
        "{} of {} wakes this hour",
        b.wakes_this_hour, b.max_wakes_per_hour
    )];
    if b.wake_limit_reached {
        badges.push("wake limit reached (a wake is held back)".to_string());
    }
    if b.delivery_attempts > 0 {
        badges.push(format!("{} failed delivery attempts", b.delivery_attempts));
    }
    writeln!(out, "badges: {}", badges.join("; "))?;
    Ok(())
}

/// A table indented by two spaces, below a heading line.
fn indented(out: &mut dyn Write, header: &[&str], rows: &[Vec<String>]) -> anyhow::Result<()> {
    let mut buf = Vec::new();
    table(&mut buf, header, rows)?;
    for line in String::from_utf8_lossy(&buf).lines() {
        writeln!(out, "  {line}")?;
    }
    Ok(())
}

/// `cortex waits`: every armed waitpoint across the sessions, oldest first
/// (`GET /api/waitpoints?state=armed`; `--json`: that array).
pub fn armed(hub: &Hub, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = hub
        .get("/api/waitpoints?state=armed")
        .context("listing the armed waitpoints")?;
    if json {
        return print_raw(out, &reply);
    }
    let list: Vec<WaitpointView> = reply.json("GET /api/waitpoints?state=armed")?;
    if list.is_empty() {
        writeln!(
            out,
            "no armed waitpoints; arm one with: cortex wait create --session SID --label L --intent I"
        )?;
        return Ok(());
    }
    let now = now_ms();
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|v| {
            let mut r = row(v, now);
            r.insert(1, v.head.session.clone());
            r.insert(3, v.head.device.clone().unwrap_or_else(|| "-".into()));
            r.remove(4); // the state: armed, every one
            r
        })
        .collect();
    table(
        out,
        &["ID", "SESSION", "LABEL", "DEVICE", "SIGNALS", "EXPIRES"],
        &rows,
    )
}

fn row(v: &WaitpointView, now: u64) -> Vec<String> {
    // The hub's count (or the same rule over the listed signals, from an older hub).
    let signals = v.progress().summary;
    vec![
        v.head.id.clone(),
        short(&v.head.label, 40),
        v.head.state.clone(),
        signals,
        format!(
            "{} ({})",
            utc(v.head.expires_at),
            relative(v.head.expires_at, now)
        ),
    ]
}

pub fn cancel(hub: &Hub, wp: &str, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = hub
        .delete(&format!("/api/waitpoints/{}", segment(wp)))
        .with_context(|| format!("cancelling waitpoint {wp}"))?;
    if json {
        if reply.body.is_empty() {
            writeln!(
                out,
                "{}",
                serde_json::json!({"id": wp, "state": "cancelled"})
            )?;
            return Ok(());
        }
        return print_raw(out, &reply);
    }
    // The hub answers `{id, state, cancelled}`; `cancelled: false` when it had already ended.
    let answer: serde_json::Value = serde_json::from_slice(&reply.body).unwrap_or_default();
    match (answer["cancelled"].as_bool(), answer["state"].as_str()) {
        (Some(false), Some(state)) => {
            writeln!(out, "{wp} had already ended ({state}); nothing to cancel")?
        }
        _ => writeln!(
            out,
            "cancelled {wp} (the job it waited on, if any, keeps running)"
        )?,
    }
    Ok(())
}
