//! What a person sees of a session's event stream while a model runs in it: the model's
//! text as it streams, one line per tool call and per tool result, wakes, retries, and how
//! a run ended. Pure: events in, [`Out`] pieces out; `cortex session say --follow` and
//! `cortex chat` decide where each piece goes.
//!
//! The rules for the model's text: the live pieces of a step (`model-delta` with `live`)
//! are printed as they come; the stored `model-delta` that closes the step holds the whole
//! text, so of it only what was not printed yet is printed (nothing after an unbroken live
//! stream, everything for a follower that joined late, the rest after a reconnect). A
//! live `retry` voids the pieces of its step printed so far: a marker line, then the new
//! attempt's text. Its stored copy, written when the step ends (after the new attempt's
//! pieces), voids nothing and is skipped; a follower that missed the live one sees it
//! as a marker only.

use std::collections::{HashMap, HashSet};

use cortex_protocol::api::{Decision, DeltaChannel, Event, EventBody, RunMeta, RunResult, Wake};
use serde_json::Value;

use crate::sse;
use crate::timefmt;

/// The note after an answer the model server cut at the session's token cap
/// (`meta.finishReason: "length"`).
pub const TRUNCATED: &str = "(answer cut at maxTokens: the model server stopped it at the token cap; a session made with a higher --max-tokens answers longer)";

/// One piece of output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    /// The model's answer text, printed as is (no newline added).
    Text(String),
    /// The model's reasoning text, printed as is (shown apart from the answer).
    Reasoning(String),
    /// A line about what happened (a tool call, a wake, an error); the newline is the
    /// writer's. Always preceded by the end of any text line in progress.
    Note(String),
}

/// Which events to show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Everything that happens in the session (`cortex chat`).
    All,
    /// Only the run whose `run-start` input holds the message with this seq, until its
    /// `run-end` (`cortex session say --follow`).
    Message(u64),
}

#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Print the model's reasoning channel (otherwise only its answer text).
    pub reasoning: bool,
    /// Notes are cut to this many characters (the terminal's width).
    pub width: usize,
}

/// The end of the run a [`Scope::Message`] follows.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    pub run_id: String,
    pub result: RunResult,
}

/// Parses one SSE message of a session's stream (`event: event` stored, `event: live`
/// live) into an event; `None` for anything else or for an event kind this version does
/// not know (a newer hub's), which is skipped. A live piece needs no `seq` or `ts` of its
/// own (neither is used for it).
pub fn parse(msg: &sse::Message) -> Option<Event> {
    if msg.event != "event" && msg.event != "live" {
        return None;
    }
    let mut v: Value = serde_json::from_str(&msg.data).ok()?;
    if msg.event == "live"
        && let Some(obj) = v.as_object_mut()
    {
        obj.entry("seq").or_insert(Value::from(0u64));
        obj.entry("ts").or_insert(Value::from(0u64));
    }
    serde_json::from_value(v).ok()
}

/// The renderer's state: what it printed of each step, and where the text line stands.
#[derive(Debug)]
pub struct Render {
    opts: Options,
    scope: Scope,
    /// The run a [`Scope::Message`] follows, once its `run-start` was seen.
    target: Option<String>,
    ended: Option<Ended>,
    /// The live text printed for each (run, step, reasoning?), until the stored copy.
    printed: HashMap<(String, u32, bool), String>,
    /// Runs that printed some answer text (a run that printed none shows its response
    /// at its end).
    spoke: HashSet<String>,
    /// Retries shown live (run, step, attempt), whose stored copy is skipped.
    live_retries: HashSet<(String, u32, u32)>,
    /// The text printed last does not end with a newline.
    mid_line: bool,
    /// The channel of the text printed last (a switch starts a new line).
    reasoning_last: bool,
}

impl Render {
    pub fn new(scope: Scope, opts: Options) -> Render {
        Render {
            opts,
            scope,
            target: None,
            ended: None,
            printed: HashMap::new(),
            spoke: HashSet::new(),
            live_retries: HashSet::new(),
            mid_line: false,
            reasoning_last: false,
        }
    }

    /// With [`Scope::Message`]: the followed run's end, once it came.
    pub fn ended(&self) -> Option<&Ended> {
        self.ended.as_ref()
    }

    /// With [`Scope::Message`]: the followed run, once it started.
    pub fn target(&self) -> Option<&str> {
        self.target.as_deref()
    }

    /// What to print for one event; `live` when it came as a live piece (`event: live`),
    /// never stored.
    pub fn event(&mut self, ev: &Event, live: bool) -> Vec<Out> {
        let mut out = Vec::new();
        if !self.in_scope(&ev.body) {
            return out;
        }
        match &ev.body {
            EventBody::ModelDelta {
                run_id,
                step,
                text,
                channel,
                live: piece,
            } => {
                let reasoning = *channel == DeltaChannel::Reasoning;
                let key = (run_id.clone(), *step, reasoning);
                let new = if *piece || live {
                    self.printed.entry(key).or_default().push_str(text);
                    text.as_str()
                } else {
                    // The stored copy: only what the live pieces did not show.
                    let shown = self.printed.remove(&key).unwrap_or_default();
                    text.strip_prefix(shown.as_str()).unwrap_or("")
                };
                self.text(&mut out, run_id, new, reasoning);
            }
            EventBody::ToolStart { call, .. } => {
                let args = compact(&call.args);
                self.note(&mut out, format!("→ {} {args}", call.name));
            }
            EventBody::ToolEnd { observation, .. } => {
                let line = match observation.ok {
                    true => format!("← ok {}", compact(&observation.result)),
                    false => format!("← error {}", error_text(&observation.result)),
                };
                self.note(&mut out, line);
            }
            EventBody::Retry {
                run_id,
                step,
                cause,
                attempt,
                issues,
                delay_ms,
            } => {
                let key = (run_id.clone(), *step, *attempt);
                // The stored copy of a retry shown live says nothing new.
                if !live && self.live_retries.remove(&key) {
                    return out;
                }
                let why = match issues.trim() {
                    "" => cause.clone(),
                    i => format!("{cause}: {}", first_line(i)),
                };
                let after = timefmt::human(std::time::Duration::from_millis(*delay_ms));
                let voided = live && {
                    // Only a live retry comes in order with the pieces it voids; the
                    // stored copy is written with the step's end, after the new attempt.
                    self.live_retries.insert(key);
                    let before = self.printed.len();
                    self.printed
                        .retain(|(r, s, _), _| !(r == run_id && s == step));
                    before != self.printed.len()
                };
                let line = match voided {
                    true => format!("↻ retry {attempt} in {after}, the text above is void: {why}"),
                    false => format!("↻ retry {attempt} in {after}: {why}"),
                };
                self.note(&mut out, line);
            }
            EventBody::Wake(w) => self.wake(&mut out, w),
            EventBody::WaitpointCancelled { waitpoint, by } => {
                let line = format!("⊘ waitpoint {} cancelled by {by}", waitpoint.label);
                self.note(&mut out, line);
            }
            EventBody::RunEnd {
                run_id,
                result,
                meta,
            } => {
                self.run_end(&mut out, run_id, result, meta);
            }
            EventBody::RunStart { run_id, .. } => {
                self.spoke.remove(run_id);
            }
            // The envelope as it streams: the text shows as model-delta already, and the
            // whole answer comes with run-end.
            EventBody::OutputDelta { .. } | EventBody::OutputPartial { .. } => {}
            EventBody::Message { text, .. } => {
                self.note(&mut out, format!("» {}", first_line(text)));
            }
            EventBody::ApprovalRequired { approval, .. } => {
                let line = match approval.kind.as_str() {
                    "question" => {
                        let qs: Vec<String> = approval
                            .questions
                            .iter()
                            .map(|q| match q.options.is_empty() {
                                true => q.question.clone(),
                                false => format!("{} [{}]", q.question, q.options.join(" / ")),
                            })
                            .collect();
                        format!("? question {}: {}", approval.id, qs.join(" · "))
                    }
                    _ => format!(
                        "⏸ approval {} needed: {} {} ({})",
                        approval.id,
                        approval.tool,
                        compact(&approval.args),
                        approval.reason
                    ),
                };
                self.note(&mut out, line);
                self.note(
                    &mut out,
                    "   `cortex approvals` shows how to answer it".to_string(),
                );
            }
            EventBody::Answer(a) => {
                let what = match (a.decision, &a.data) {
                    (Some(Decision::Deny), _) => "denied",
                    (_, Some(_)) => "answered",
                    _ => "allowed",
                };
                let always = if a.always { " (always)" } else { "" };
                let line = format!("✓ {} {what}{always} by {}", a.request_id, a.by);
                self.note(&mut out, line);
            }
            EventBody::Cancel { turn_only } => {
                let what = if *turn_only {
                    "the turn"
                } else {
                    "the session"
                };
                self.note(&mut out, format!("⊘ cancel: {what}"));
            }
            EventBody::Timer { name, text, .. } => {
                self.note(&mut out, format!("⏰ timer {name}: {}", first_line(text)));
            }
            EventBody::Compact {} => self.note(&mut out, "⇢ compaction asked".to_string()),
            EventBody::Compaction(c) => {
                let line = compaction_line(c);
                self.note(&mut out, line);
            }
            EventBody::LimitReached { limit, message, .. } => {
                self.note(
                    &mut out,
                    format!("⊘ limit {limit}: {}", first_line(message)),
                );
            }
            EventBody::WaitpointArmed { .. }
            | EventBody::InputTaken { .. }
            | EventBody::StepStart { .. } => {}
        }
        out
    }

    /// Whether an event belongs to what this renderer shows; notes a followed run's start.
    fn in_scope(&mut self, body: &EventBody) -> bool {
        let Scope::Message(seq) = self.scope else {
            return true;
        };
        if self.ended.is_some() {
            return false;
        }
        if let EventBody::RunStart { run_id, input } = body
            && self.target.is_none()
            && input.iter().any(|i| i.seq == seq)
        {
            self.target = Some(run_id.clone());
        }
        let Some(target) = &self.target else {
            return false;
        };
        match run_of(body) {
            Some(run) => run == target,
            None => false,
        }
    }

    fn text(&mut self, out: &mut Vec<Out>, run_id: &str, text: &str, reasoning: bool) {
        if text.is_empty() || (reasoning && !self.opts.reasoning) {
            return;
        }
        if self.mid_line && reasoning != self.reasoning_last {
            out.push(Out::Text("\n".to_string()));
        }
        self.reasoning_last = reasoning;
        self.mid_line = !text.ends_with('\n');
        match reasoning {
            true => out.push(Out::Reasoning(text.to_string())),
            false => {
                self.spoke.insert(run_id.to_string());
                out.push(Out::Text(text.to_string()));
            }
        }
    }

    fn note(&mut self, out: &mut Vec<Out>, line: String) {
        self.end_line(out);
        out.push(Out::Note(fit(&line, self.opts.width)));
    }

    fn end_line(&mut self, out: &mut Vec<Out>) {
        if self.mid_line {
            out.push(Out::Text("\n".to_string()));
            self.mid_line = false;
        }
    }

    fn wake(&mut self, out: &mut Vec<Out>, w: &Wake) {
        let waited = timefmt::human(std::time::Duration::from_millis(w.waited_ms));
        let head = format!(
            "⏰ wake: {} {} after {waited}",
            w.waitpoint.label,
            w.reason.as_str()
        );
        self.note(out, head);
        let first = first_line(&w.text);
        if !first.is_empty() {
            self.note(out, format!("   {first}"));
        }
    }

    fn run_end(&mut self, out: &mut Vec<Out>, run_id: &str, result: &RunResult, meta: &RunMeta) {
        // Whatever a stream cut short is void now: the run's stored text came before.
        self.printed.retain(|(r, _, _), _| r != run_id);
        self.live_retries.retain(|(r, _, _)| r != run_id);
        let spoke = self.spoke.remove(run_id);
        if result.ok {
            // An answer given only in the run's output (not streamed as text) is shown here.
            let response = result.output.as_ref().and_then(|o| o.response.as_deref());
            if let (false, Some(r)) = (spoke, response.filter(|r| !r.trim().is_empty())) {
                self.end_line(out);
                self.mid_line = !r.ends_with('\n');
                self.reasoning_last = false;
                out.push(Out::Text(r.to_string()));
            }
            self.end_line(out);
            if let Some(d) = result.output.as_ref().and_then(|o| o.data.as_ref()) {
                out.push(Out::Note(format!("= data {}", compact(d))));
            }
            if meta.finish_reason.as_deref() == Some("length") {
                out.push(Out::Note(TRUNCATED.to_string()));
            }
        } else {
            let line = match &result.error {
                Some(e) => format!("✗ run failed: {}", failure(e, first_line(&e.message))),
                None => "✗ run failed (no reason given)".to_string(),
            };
            // Whole, not cut to the width: it is the one line that says what went wrong.
            self.end_line(out);
            out.push(Out::Note(line));
        }
        if self.target.as_deref() == Some(run_id) {
            self.ended = Some(Ended {
                run_id: run_id.to_string(),
                result: result.clone(),
            });
        }
    }
}

/// The run an event belongs to, for the events of a run.
pub fn run_of(body: &EventBody) -> Option<&str> {
    match body {
        EventBody::RunStart { run_id, .. }
        | EventBody::StepStart { run_id, .. }
        | EventBody::ModelDelta { run_id, .. }
        | EventBody::ToolStart { run_id, .. }
        | EventBody::ToolEnd { run_id, .. }
        | EventBody::Retry { run_id, .. }
        | EventBody::OutputDelta { run_id, .. }
        | EventBody::OutputPartial { run_id, .. }
        | EventBody::ApprovalRequired { run_id, .. }
        | EventBody::RunEnd { run_id, .. } => Some(run_id),
        _ => None,
    }
}

/// A `compaction` event in words.
pub fn compaction_line(c: &cortex_protocol::api::Compaction) -> String {
    if let Some(e) = &c.error {
        return format!("⇢ no compaction ({}): {}", c.cause, first_line(e));
    }
    let took = timefmt::human(std::time::Duration::from_millis(c.elapsed_ms));
    format!(
        "⇢ context compacted ({}): {} messages summarized, ~{} → ~{} of {} tokens, the summary took {took}",
        c.cause,
        c.through.saturating_sub(c.from),
        c.tokens_before,
        c.tokens_after,
        c.context_tokens
    )
}

/// A JSON value on one line (a string as its text).
fn compact(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// A failed tool's words: `{error: "…"}`'s text, or the value itself.
fn error_text(v: &Value) -> String {
    match v.get("error") {
        Some(Value::String(s)) => s.clone(),
        Some(e) => compact(e),
        None => compact(v),
    }
}

/// A failed run's error as one phrase: `code (stop): message`.
pub fn failure(e: &cortex_protocol::api::RunError, message: &str) -> String {
    let stop = e
        .stop
        .as_deref()
        .map(|s| format!(" ({s})"))
        .unwrap_or_default();
    format!("{}{stop}: {message}", e.code)
}

fn first_line(s: &str) -> &str {
    s.trim().lines().next().unwrap_or_default().trim_end()
}

/// `line` on one line of at most `width` characters, a cut marked with `…`.
pub fn fit(line: &str, width: usize) -> String {
    let one: String = line
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    let width = width.max(8);
    match one.char_indices().nth(width - 1) {
        Some((i, _)) if one.chars().count() > width => format!("{}…", &one[..i]),
        _ => one,
    }
}

#[cfg(test)]
mod tests;
