//! Chat completion chunks into one step. Each SSE `data` payload is a chunk (or
//! `[DONE]`); its text and reasoning go out as deltas at once, its tool call pieces are
//! put together by `index` (or by `id` where a server sends none) and go out as
//! [`Delta::ToolArgs`] as they come, its `usage` kept
//! wherever it comes (a last chunk with empty `choices`, or beside the finish). The
//! shapes of the servers people run are all taken: a whole call in one chunk, an
//! id-and-name chunk then argument fragments, `finish_reason: "stop"` beside tool calls,
//! no usage, no `[DONE]`, an error object mid-stream, a non-streamed JSON answer.

use serde::Deserialize;
use serde_json::Value;

use cortex_protocol::api::Usage;

use super::error::ModelError;
use super::step::{Delta, StepOutput};
use super::wire::{FunctionCall, ToolCall};

/// What the stream says after a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    More,
    /// `[DONE]`: nothing more will come.
    Done,
}

#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    delta: Option<Message>,
    /// A non-streamed answer's message (taken as one delta).
    #[serde(default)]
    message: Option<Message>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Message {
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    reasoning_content: Option<Value>,
    #[serde(default)]
    reasoning: Option<Value>,
    #[serde(default)]
    tool_calls: Option<Vec<CallPiece>>,
}

#[derive(Debug, Deserialize)]
struct CallPiece {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionPiece>,
}

#[derive(Debug, Deserialize)]
struct FunctionPiece {
    #[serde(default)]
    name: Option<String>,
    /// A string of JSON text as OpenAI sends it; some servers send the object itself.
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    total_tokens: Option<u64>,
}

/// A tool call being put together.
#[derive(Debug, Default)]
struct Slot {
    index: Option<u64>,
    id: String,
    name: String,
    arguments: String,
}

/// One attempt's chunks, put together.
#[derive(Debug, Default)]
pub struct Assembler {
    text: String,
    reasoning: String,
    slots: Vec<Slot>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    done: bool,
    /// The reply's bytes so far: text, reasoning, tool names and arguments.
    bytes: u64,
}

impl Assembler {
    pub fn new() -> Self {
        Self::default()
    }

    /// The reply's bytes so far (text, reasoning, tool names and arguments): what
    /// `limits.replyBytes` bounds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// One event's data. Text and reasoning go to `on_delta` as they come.
    pub fn payload(
        &mut self,
        data: &str,
        on_delta: &mut (dyn FnMut(Delta) + Send),
    ) -> Result<Progress, ModelError> {
        let data = data.trim();
        match serde_json::from_str::<Chunk>(data) {
            Ok(chunk) => self.chunk(chunk, on_delta).map(|()| Progress::More),
            Err(_) if data == "[DONE]" => {
                self.done = true;
                Ok(Progress::Done)
            }
            Err(_) if data.is_empty() => Ok(Progress::More),
            // Chunks a server wrote on consecutive `data:` lines without the blank line
            // between them arrive as one event: each line is a chunk.
            Err(_) if data.contains('\n') => {
                for line in data.lines().map(str::trim).filter(|l| !l.is_empty()) {
                    if line == "[DONE]" {
                        self.done = true;
                        return Ok(Progress::Done);
                    }
                    let chunk =
                        serde_json::from_str::<Chunk>(line).map_err(|e| malformed(line, &e))?;
                    self.chunk(chunk, on_delta)?;
                }
                Ok(Progress::More)
            }
            Err(e) => Err(malformed(data, &e)),
        }
    }

    fn chunk(
        &mut self,
        chunk: Chunk,
        on_delta: &mut (dyn FnMut(Delta) + Send),
    ) -> Result<(), ModelError> {
        if let Some(err) = chunk.error {
            return Err(server_error(&err));
        }
        if let Some(u) = chunk.usage {
            let prompt = u.prompt_tokens.unwrap_or(0);
            let completion = u.completion_tokens.unwrap_or(0);
            self.usage = Some(Usage {
                prompt_tokens: prompt,
                completion_tokens: completion,
                total_tokens: u.total_tokens.unwrap_or(prompt + completion),
            });
        }
        // One answer asked for (no `n`): choices other than the first are not ours.
        for choice in chunk.choices.unwrap_or_default() {
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            if let Some(m) = choice.delta.or(choice.message) {
                let text = text_of(m.content.as_ref());
                if !text.is_empty() {
                    self.bytes += text.len() as u64;
                    self.text.push_str(&text);
                    on_delta(Delta::Text(text));
                }
                // Servers that send both fields send the same tokens in each.
                let reasoning = match text_of(m.reasoning_content.as_ref()) {
                    r if r.is_empty() => text_of(m.reasoning.as_ref()),
                    r => r,
                };
                if !reasoning.is_empty() {
                    self.bytes += reasoning.len() as u64;
                    self.reasoning.push_str(&reasoning);
                    on_delta(Delta::Reasoning(reasoning));
                }
                for piece in m.tool_calls.unwrap_or_default() {
                    self.call_piece(piece, on_delta);
                }
            }
            if let Some(f) = choice.finish_reason.filter(|f| !f.is_empty()) {
                self.finish_reason = Some(f);
            }
        }
        Ok(())
    }

    fn call_piece(&mut self, piece: CallPiece, on_delta: &mut (dyn FnMut(Delta) + Send)) {
        let id = piece.id.filter(|s| !s.is_empty());
        let (name, arguments) = match piece.function {
            Some(f) => (
                f.name.filter(|s| !s.is_empty()),
                match f.arguments {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s,
                    Some(other) => other.to_string(),
                },
            ),
            None => (None, String::new()),
        };
        let at = self.slot_for(piece.index, id.as_deref(), name.as_deref());
        let slot = &mut self.slots[at];
        if let Some(id) = id
            && slot.id.is_empty()
        {
            slot.id = id;
        }
        // What this piece added to the name, as the delta tells it.
        let mut added = None;
        if let Some(name) = name {
            // A name sent again whole is the same name; a different one is the next
            // fragment of a name streamed in pieces.
            if slot.name.is_empty() {
                slot.name.clone_from(&name);
                added = Some(name);
            } else if slot.name != name {
                slot.name.push_str(&name);
                added = Some(name);
            }
        }
        self.bytes += (arguments.len() + added.as_ref().map_or(0, String::len)) as u64;
        slot.arguments.push_str(&arguments);
        if added.is_some() || !arguments.is_empty() {
            on_delta(Delta::ToolArgs {
                index: at,
                name: added,
                text: arguments,
            });
        }
    }

    /// Which call a piece belongs to.
    fn slot_for(&mut self, index: Option<u64>, id: Option<&str>, name: Option<&str>) -> usize {
        let found = match index {
            // By index, unless it carries another call's id (servers that number every
            // call 0).
            Some(i) => self
                .slots
                .iter()
                .rposition(|s| s.index == Some(i))
                .filter(|&at| {
                    let s = &self.slots[at];
                    id.is_none_or(|id| s.id.is_empty() || s.id == id)
                }),
            None => match id {
                Some(id) => self.slots.iter().rposition(|s| s.id == id),
                // Neither: the call being streamed, unless this piece starts another
                // (a name, after a call that has its name and arguments).
                None => self.slots.len().checked_sub(1).filter(|&at| {
                    let s = &self.slots[at];
                    name.is_none() || s.name.is_empty() || s.arguments.is_empty()
                }),
            },
        };
        found.unwrap_or_else(|| {
            self.slots.push(Slot {
                index,
                ..Slot::default()
            });
            self.slots.len() - 1
        })
    }

    /// The step, once the stream ended (`[DONE]`, or closed). A stream closed with
    /// neither `[DONE]` nor a `finish_reason` was cut short.
    pub fn finish(mut self) -> Result<StepOutput, ModelError> {
        if !self.done && self.finish_reason.is_none() {
            return Err(ModelError::Truncated);
        }
        self.slots.sort_by_key(|s| s.index.unwrap_or(u64::MAX));
        let tool_calls: Vec<ToolCall> = self
            .slots
            .into_iter()
            .enumerate()
            .map(|(n, s)| ToolCall {
                id: if s.id.is_empty() {
                    format!("call_{n}")
                } else {
                    s.id
                },
                kind: "function".to_string(),
                function: FunctionCall {
                    name: s.name,
                    // A call with no arguments is sent by some servers as "".
                    arguments: if s.arguments.trim().is_empty() {
                        "{}".to_string()
                    } else {
                        s.arguments
                    },
                },
            })
            .collect();
        // Tool calls present means tool calls: Ollama and others say "stop" beside them.
        let finish_reason = match self.finish_reason {
            None if !tool_calls.is_empty() => Some("tool_calls".to_string()),
            Some(f) if f == "stop" && !tool_calls.is_empty() => Some("tool_calls".to_string()),
            other => other,
        };
        Ok(StepOutput {
            text: self.text,
            reasoning: self.reasoning,
            tool_calls,
            finish_reason,
            usage: self.usage,
        })
    }
}

/// Text content: a string, or an array of `{type: "text", text}` parts.
fn text_of(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

fn malformed(data: &str, e: &serde_json::Error) -> ModelError {
    ModelError::Malformed(format!(
        "an event is not a chat completion chunk ({e}): {}",
        excerpt(data, 200)
    ))
}

/// An `error` the server put in its stream (or in a JSON body): its message, and
/// whether it says the trouble is passing (a 408, 429 or 5xx code, a rate limit, an
/// overload, a server error).
pub fn server_error(err: &Value) -> ModelError {
    let message = match err {
        Value::String(s) => s.clone(),
        Value::Object(o) => o
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| err.to_string()),
        other => other.to_string(),
    };
    let code = err.get("code");
    let numeric = code
        .and_then(|c| {
            c.as_u64()
                .or_else(|| c.as_str().and_then(|s| s.parse().ok()))
        })
        .is_some_and(|c| c == 408 || c == 429 || (500..600).contains(&c));
    let words = [code, err.get("type")]
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|s| {
            let s = s.to_ascii_lowercase();
            [
                "rate_limit",
                "overloaded",
                "server_error",
                "timeout",
                "unavailable",
            ]
            .iter()
            .any(|w| s.contains(w))
        });
    ModelError::Server {
        message: excerpt(&message, 500),
        retryable: numeric || words,
    }
}

/// At most `max` characters of `s`, whitespace runs made one space, `…` where cut.
pub fn excerpt(s: &str, max: usize) -> String {
    let collapsed = s.split_whitespace().collect::<Vec<_>>().join(" ");
    match collapsed.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &collapsed[..at]),
        None => collapsed,
    }
}
