//! The script: a [`Reply`] is one answer (text, tool calls, an error, a stall, a cut-off
//! stream), and how it is written as OpenAI chat-completion chunks.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use super::{ReplyFn, WriteFn};

/// One answer the server gives.
#[derive(Clone)]
pub struct Reply {
    pub(super) kind: Kind,
    pub(super) usage: Usage,
    pub(super) done: bool,
    pub(super) chunk_delay: Duration,
    pub(super) head_delay: Duration,
    pub(super) split_every: Option<usize>,
    pub(super) crlf: bool,
    pub(super) pings: bool,
    pub(super) stall_after: Option<usize>,
    pub(super) cut_after: Option<usize>,
    pub(super) headers: Vec<(String, String)>,
    pub(super) reasoning: Option<String>,
}

#[derive(Clone)]
pub(super) enum Kind {
    /// Chat completion chunks (each one `data:` event); usage and `[DONE]` are added.
    Chunks(Vec<Value>),
    /// These exact bytes, each piece one write.
    Raw(Vec<Vec<u8>>),
    /// Each write made when it is due, as long as the function gives one (a body
    /// without end, or larger than is worth holding).
    Generated(WriteFn),
    Status {
        code: u16,
        body: String,
    },
    /// 200 and the stream's headers, then nothing.
    HangAfterHead,
    /// No answer at all.
    HangBeforeHead,
    Rule(ReplyFn),
}

#[derive(Clone, Copy)]
pub(super) enum Usage {
    /// Counted from the request and the chunks, when the request asks for it.
    Counted,
    Fixed(u64, u64),
    Never,
}

impl Reply {
    fn new(kind: Kind) -> Reply {
        Reply {
            kind,
            usage: Usage::Counted,
            done: true,
            chunk_delay: Duration::ZERO,
            head_delay: Duration::ZERO,
            split_every: None,
            crlf: false,
            pings: false,
            stall_after: None,
            cut_after: None,
            headers: Vec::new(),
            reasoning: None,
        }
    }

    /// A text answer streamed four characters a chunk (words split mid-way), then
    /// `finish_reason: "stop"`.
    pub fn text(text: &str) -> Reply {
        let chars: Vec<char> = text.chars().collect();
        let mut chunks = vec![delta(json!({"role": "assistant", "content": ""}), None)];
        for piece in chars.chunks(4) {
            let piece: String = piece.iter().collect();
            chunks.push(delta(json!({"content": piece}), None));
        }
        chunks.push(delta(json!({}), Some("stop")));
        Reply::new(Kind::Chunks(chunks))
    }

    /// A text answer cut where the request's `max_tokens` ran out, as servers end one:
    /// the text, then `finish_reason: "length"`.
    pub fn cut_at_max_tokens(text: &str) -> Reply {
        let mut chunks = vec![delta(json!({"role": "assistant", "content": ""}), None)];
        for piece in text.chars().collect::<Vec<_>>().chunks(4) {
            let piece: String = piece.iter().collect();
            chunks.push(delta(json!({"content": piece}), None));
        }
        chunks.push(delta(json!({}), Some("length")));
        Reply::new(Kind::Chunks(chunks))
    }

    /// One tool call as vLLM and llama.cpp stream it: a chunk with its id and name,
    /// then its arguments in fragments of five characters (split mid-string), then
    /// `finish_reason: "tool_calls"`.
    pub fn tool_call(name: &str, args: &str) -> Reply {
        Reply::tool_calls(&[(name, args)])
    }

    /// Several calls, one after the other, each numbered by `index`.
    pub fn tool_calls(calls: &[(&str, &str)]) -> Reply {
        let mut chunks = vec![delta(json!({"role": "assistant", "content": null}), None)];
        for (i, (name, args)) in calls.iter().enumerate() {
            chunks.push(delta(
                json!({"tool_calls": [{"index": i, "id": format!("call_{}", fresh_id()), "type": "function", "function": {"name": name, "arguments": ""}}]}),
                None,
            ));
            let chars: Vec<char> = args.chars().collect();
            for piece in chars.chunks(5) {
                let piece: String = piece.iter().collect();
                chunks.push(delta(
                    json!({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}),
                    None,
                ));
            }
        }
        chunks.push(delta(json!({}), Some("tool_calls")));
        Reply::new(Kind::Chunks(chunks))
    }

    /// A tool call as Ollama streams it: whole in one chunk, then `finish_reason: "stop"`.
    pub fn ollama_tool_call(name: &str, args: &str) -> Reply {
        Reply::new(Kind::Chunks(vec![
            delta(
                json!({"role": "assistant", "content": "", "tool_calls": [{"id": format!("call_{}", fresh_id()), "index": 0, "type": "function", "function": {"name": name, "arguments": args}}]}),
                None,
            ),
            delta(json!({"role": "assistant", "content": ""}), Some("stop")),
        ]))
    }

    /// These chunk objects as they are (usage and `[DONE]` still added).
    pub fn chunks(chunks: Vec<Value>) -> Reply {
        Reply::new(Kind::Chunks(chunks))
    }

    /// Exactly these bytes as the 200 stream's body, each piece one write.
    pub fn raw(pieces: Vec<Vec<u8>>) -> Reply {
        Reply::new(Kind::Raw(pieces))
    }

    /// A 200 stream whose write `n` is `f(n)`, made only when it is due, until `f`
    /// gives `None` (never, for a stream without end). Pacing (`chunk_delay`), stalls and
    /// cuts apply as to any stream; usage and `[DONE]` are `f`'s to write.
    pub fn generated(f: impl Fn(usize) -> Option<Vec<u8>> + Send + Sync + 'static) -> Reply {
        Reply::new(Kind::Generated(Arc::new(f)))
    }

    /// A 200 stream that starts an answer and then reports `error` inside it.
    pub fn stream_error(error: Value) -> Reply {
        Reply::new(Kind::Chunks(vec![
            delta(json!({"role": "assistant", "content": "Par"}), None),
            json!({"error": error}),
        ]))
        .without_done()
        .without_usage()
    }

    /// A non-2xx answer with this body (`application/json`).
    pub fn status(code: u16, body: &str) -> Reply {
        Reply::new(Kind::Status {
            code,
            body: body.to_string(),
        })
    }

    /// The head of a 200 stream, then silence until the client leaves.
    pub fn hang() -> Reply {
        Reply::new(Kind::HangAfterHead)
    }

    /// No answer at all: the request is read and left unanswered.
    pub fn hang_before_headers() -> Reply {
        Reply::new(Kind::HangBeforeHead)
    }

    /// The reply `f` picks for each request body (a rule-based model).
    pub fn from_fn(f: impl Fn(&Value) -> Reply + Send + Sync + 'static) -> Reply {
        Reply::new(Kind::Rule(Arc::new(f)))
    }

    /// No usage chunk, even when the request asks for one.
    pub fn without_usage(mut self) -> Reply {
        self.usage = Usage::Never;
        self
    }

    /// This usage (prompt, completion), when the request asks for usage.
    pub fn usage(mut self, prompt: u64, completion: u64) -> Reply {
        self.usage = Usage::Fixed(prompt, completion);
        self
    }

    /// No `data: [DONE]`: the stream just ends.
    pub fn without_done(mut self) -> Reply {
        self.done = false;
        self
    }

    /// Reasoning chunks (`reasoning_content`) before the answer.
    pub fn with_reasoning(mut self, text: &str) -> Reply {
        self.reasoning = Some(text.to_string());
        self
    }

    /// A pause before each write after the first.
    pub fn chunk_delay(mut self, d: Duration) -> Reply {
        self.chunk_delay = d;
        self
    }

    /// A pause before the answer's head.
    pub fn head_delay(mut self, d: Duration) -> Reply {
        self.head_delay = d;
        self
    }

    /// The stream's bytes written `n` at a time, wherever that cuts (mid-line,
    /// mid-character, mid-JSON).
    pub fn split_every(mut self, n: usize) -> Reply {
        self.split_every = Some(n.max(1));
        self
    }

    /// `\r\n` line ends.
    pub fn crlf(mut self) -> Reply {
        self.crlf = true;
        self
    }

    /// `: ping` comments and `event:` lines between the events.
    pub fn with_pings(mut self) -> Reply {
        self.pings = true;
        self
    }

    /// After `n` writes, silence until the client leaves (a stream stalled mid-answer).
    pub fn stall_after(mut self, n: usize) -> Reply {
        self.stall_after = Some(n);
        self
    }

    /// After `n` writes, the connection is dropped without the body's end (a server
    /// that crashed mid-answer).
    pub fn cut_after(mut self, n: usize) -> Reply {
        self.cut_after = Some(n);
        self
    }

    /// `Retry-After: secs` on the answer.
    pub fn retry_after(self, secs: u64) -> Reply {
        self.header("retry-after", &secs.to_string())
    }

    /// An extra header on the answer.
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// The stream's writes for a request that asked for usage (`include_usage`) or not.
    pub(super) fn writes(&self, include_usage: bool, request_bytes: usize) -> Vec<Vec<u8>> {
        let chunks = match &self.kind {
            Kind::Chunks(c) => c,
            Kind::Raw(pieces) => return pieces.clone(),
            _ => return Vec::new(),
        };
        let mut events: Vec<String> = Vec::new();
        if let Some(r) = &self.reasoning {
            let chars: Vec<char> = r.chars().collect();
            for piece in chars.chunks(4) {
                let piece: String = piece.iter().collect();
                events.push(delta(json!({"reasoning_content": piece}), None).to_string());
            }
        }
        events.extend(chunks.iter().map(Value::to_string));
        let usage = match self.usage {
            Usage::Counted if include_usage => {
                Some((request_bytes as u64 / 4, chunks.len() as u64))
            }
            Usage::Fixed(p, c) if include_usage => Some((p, c)),
            _ => None,
        };
        if let Some((p, c)) = usage {
            events.push(
                json!({"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}})
                    .to_string(),
            );
        }
        if self.done {
            events.push("[DONE]".to_string());
        }
        let nl = if self.crlf { "\r\n" } else { "\n" };
        let writes: Vec<Vec<u8>> = events
            .iter()
            .map(|e| {
                let pre = if self.pings {
                    format!(": ping{nl}{nl}event: message{nl}")
                } else {
                    String::new()
                };
                format!("{pre}data: {e}{nl}{nl}").into_bytes()
            })
            .collect();
        match self.split_every {
            Some(n) => writes.concat().chunks(n).map(<[u8]>::to_vec).collect(),
            None => writes,
        }
    }
}

/// One chunk with a delta for choice 0.
fn delta(delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "scripted",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    })
}

/// A number for made-up call ids, unique in the process.
fn fresh_id() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
