//! A hostile OpenAI-compatible model server, for the tests and the bench that show a
//! model cannot exhaust the hub: the scripted server ([`ScriptedModel`]) answering every
//! chat request in one of these [`Mode`]s.
//!
//! - `endless`: a text answer of 4 KiB deltas, written as fast as the client reads, never
//!   finished.
//! - `drip`: a text answer one byte at a time, a byte every `every` (a second by
//!   default), never finished: no gap between bytes is long enough for an idle bound.
//! - `huge`: one whole text answer of `bytes` bytes (64 KiB deltas), then the finish,
//!   usage and `[DONE]`.
//! - `spawn`: three `wait_create` calls, each a monitor (`max_signals: 2`) that wakes on
//!   silence after a second and `spawn`s a session whose instructions ask for the same
//!   again; a request whose last message is a tool's answer gets a text that ends the
//!   turn.
//! - `timer`: `schedule_wakeup {in_s: 0}` with a text that asks for the same again; a
//!   request whose last message is a tool's answer gets a text that ends the turn.
//!
//! The server's counts say what the hub did: [`ScriptedModel::request_count`] (model
//! calls), [`ScriptedModel::outcome`] (whether the hub cut an answer: `ClientGone`),
//! [`ScriptedModel::bytes_sent`].

use std::time::Duration;

use serde_json::{Value, json};

use crate::scripted_model::{Reply, ScriptedModel};

/// How the server answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    Endless,
    Drip { every: Duration },
    Huge { bytes: usize },
    Spawn,
    Timer,
}

/// The words [`Mode::parse`] takes.
pub const MODES: &[&str] = &["endless", "drip", "huge", "spawn", "timer"];

/// What the spawned sessions are told: the same again.
pub const SPAWN_INSTRUCTIONS: &str = "Arm three wait_create monitors with spawn, each with these same instructions, then end your turn.";
/// The text a timer fires with: the same again.
pub const TIMER_TEXT: &str = "Schedule this wakeup again with in_s 0.";

impl Mode {
    /// `endless`, `drip`, `huge` (32 MiB), `spawn` or `timer`.
    pub fn parse(word: &str) -> Option<Mode> {
        Some(match word {
            "endless" => Mode::Endless,
            "drip" => Mode::Drip {
                every: Duration::from_secs(1),
            },
            "huge" => Mode::Huge { bytes: 32 << 20 },
            "spawn" => Mode::Spawn,
            "timer" => Mode::Timer,
            _ => return None,
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Mode::Endless => "endless",
            Mode::Drip { .. } => "drip",
            Mode::Huge { .. } => "huge",
            Mode::Spawn => "spawn",
            Mode::Timer => "timer",
        }
    }

    /// The reply the server gives every request in this mode.
    pub fn reply(&self) -> Reply {
        match self {
            Mode::Endless => {
                let piece = event(&content(&"x".repeat(4096)));
                Reply::generated(move |n| {
                    Some(if n == 0 {
                        event(&role())
                    } else {
                        piece.clone()
                    })
                })
            }
            Mode::Drip { every } => {
                let piece = event(&content("x"));
                Reply::generated(move |n| Some(vec![piece[n % piece.len()]])).chunk_delay(*every)
            }
            Mode::Huge { bytes } => {
                let per = 64 << 10;
                let pieces = bytes.div_ceil(per);
                let piece = event(&content(&"x".repeat(per)));
                let end: Vec<u8> = [
                    event(&json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})),
                    event(&json!({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": bytes / 4, "total_tokens": 10 + bytes / 4}})),
                    b"data: [DONE]\n\n".to_vec(),
                ]
                .concat();
                Reply::generated(move |n| match n {
                    0 => Some(event(&role())),
                    n if n <= pieces => Some(piece.clone()),
                    n if n == pieces + 1 => Some(end.clone()),
                    _ => None,
                })
            }
            Mode::Spawn => Reply::from_fn(|body| {
                if last_is_tool(body) {
                    return Reply::text("armed; waiting");
                }
                let args = json!({
                    "label": "again",
                    "intent": "do it again",
                    "max_signals": 2,
                    "silence_after": 1,
                    "spawn": {"instructions": SPAWN_INSTRUCTIONS},
                })
                .to_string();
                Reply::tool_calls(&[
                    ("wait_create", &args),
                    ("wait_create", &args),
                    ("wait_create", &args),
                ])
            }),
            Mode::Timer => Reply::from_fn(|body| {
                if last_is_tool(body) {
                    return Reply::text("scheduled");
                }
                let args = json!({"name": "again", "in_s": 0, "text": TIMER_TEXT}).to_string();
                Reply::tool_call("schedule_wakeup", &args)
            }),
        }
    }

    /// A server answering every request in this mode.
    pub fn start(&self) -> ScriptedModel {
        ScriptedModel::start_with_default(Vec::new(), self.reply())
    }
}

fn role() -> Value {
    json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]})
}

fn content(text: &str) -> Value {
    json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
}

fn event(v: &Value) -> Vec<u8> {
    format!("data: {v}\n\n").into_bytes()
}

/// Whether the request's last message is a tool's answer (the turn then ends in text).
fn last_is_tool(body: &Value) -> bool {
    body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .is_some_and(|m| m["role"] == "tool")
}
