//! `cortex approvals`, `cortex answer` and `cortex session cancel`: what waits on a person
//! across sessions, answering it, and stopping a session's turn or the session.

use std::io::Write;

use anyhow::Context;
use cortex_protocol::api::{ApprovalList, Decision, PostAnswer, PostCancel};
use serde_json::Value;

use super::{print_list, print_raw, short, table};
use crate::hub::{Hub, segment};
use crate::timefmt::{now_ms, relative};

/// `cortex approvals`: one row per pending approval or question, oldest first, with the
/// command that answers it.
pub fn list(hub: &Hub, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = hub
        .get("/api/approvals")
        .context("listing what waits on a person")?;
    if json {
        return print_list(out, &reply, "approvals", "GET /api/approvals");
    }
    let list: ApprovalList = reply.json("GET /api/approvals")?;
    if list.approvals.is_empty() {
        writeln!(out, "nothing waits on a person")?;
        return Ok(());
    }
    let now = now_ms();
    let rows: Vec<Vec<String>> = list
        .approvals
        .iter()
        .map(|a| {
            let r = &a.request;
            let what = match r.kind.as_str() {
                "question" => r
                    .questions
                    .iter()
                    .map(|q| match q.options.is_empty() {
                        true => q.question.clone(),
                        false => format!("{} [{}]", q.question, q.options.join("/")),
                    })
                    .collect::<Vec<_>>()
                    .join(" · "),
                _ => format!("{} {}", r.tool, one_line(&r.args)),
            };
            let expires = r
                .expires_at
                .map_or_else(|| "-".to_string(), |at| relative(at, now));
            vec![
                a.session.clone(),
                r.id.clone(),
                r.kind.clone(),
                short(&what, 60),
                relative(r.asked_at, now),
                expires,
            ]
        })
        .collect();
    table(
        out,
        &["SESSION", "REQUEST", "KIND", "WHAT", "ASKED", "EXPIRES"],
        &rows,
    )?;
    writeln!(
        out,
        "\nanswer: cortex answer SESSION REQUEST allow|deny [--always] [--args JSON]; a question: cortex answer SESSION REQUEST allow --data JSON"
    )?;
    Ok(())
}

fn one_line(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// `cortex answer`'s body from its arguments.
pub fn answer_body(
    request_id: &str,
    decision: &str,
    always: bool,
    args: Option<&str>,
    data: Option<&str>,
) -> anyhow::Result<PostAnswer> {
    let decision = match decision {
        "allow" => Decision::Allow,
        "deny" => Decision::Deny,
        other => anyhow::bail!("the decision is allow or deny, not {other:?}"),
    };
    let parse = |flag: &str, text: &str| -> anyhow::Result<Value> {
        serde_json::from_str(text).with_context(|| format!("{flag} is not JSON: {text}"))
    };
    let args = args.map(|a| parse("--args", a)).transpose()?;
    if args.as_ref().is_some_and(|a| !a.is_object()) {
        anyhow::bail!("--args is the call's arguments as a JSON object");
    }
    let data = data.map(|d| parse("--data", d)).transpose()?;
    Ok(PostAnswer {
        request_id: request_id.to_string(),
        decision: Some(decision),
        always,
        args,
        data,
    })
}

/// `cortex answer SID REQUEST allow|deny`.
pub fn answer(
    hub: &Hub,
    sid: &str,
    body: &PostAnswer,
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let reply = hub
        .post(&format!("/api/sessions/{}/answers", segment(sid)), body)
        .with_context(|| format!("answering {} of session {sid}", body.request_id))?;
    if json {
        return print_raw(out, &reply);
    }
    let verb = match body.decision {
        Some(Decision::Deny) => "denied",
        _ if body.data.is_some() => "answered",
        _ => "allowed",
    };
    let v: Value = reply.json("POST /api/sessions/{sid}/answers")?;
    let dup = if v["duplicate"].as_bool() == Some(true) {
        " (it had been answered already; the first answer stands)"
    } else {
        ""
    };
    writeln!(out, "{} {verb}{dup}", body.request_id)?;
    Ok(())
}

/// `cortex session cancel SID [--turn]`.
pub fn cancel(
    hub: &Hub,
    sid: &str,
    turn_only: bool,
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let reply = hub
        .post(
            &format!("/api/sessions/{}/cancel", segment(sid)),
            &PostCancel { turn_only },
        )
        .with_context(|| format!("cancelling session {sid}"))?;
    if json {
        return print_raw(out, &reply);
    }
    match turn_only {
        true => writeln!(
            out,
            "the turn of {sid} is stopped; the next message starts a new one"
        )?,
        false => writeln!(
            out,
            "session {sid} is cancelled: its turn stopped, its waitpoints and timers cancelled"
        )?,
    }
    Ok(())
}
