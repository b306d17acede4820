//! The seam between the runner and a model: one streamed step ([`StepRequest`] in,
//! [`Delta`]s as it streams, [`StepOutput`] or a `ModelError` out) and the [`Model`]
//! trait the runner calls. The HTTP client implements it; tests may implement it in
//! process.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use cortex_protocol::api::Usage;

use super::caps::Caps;
use super::error::ModelError;
use super::wire::{ChatMessage, ToolCall, ToolSpec};

/// One model call: the whole transcript, the tools, the per-step token cap, and what a
/// typed answer asks of the endpoint.
#[derive(Debug, Clone, Copy)]
pub struct StepRequest<'a> {
    pub messages: &'a [ChatMessage],
    pub tools: &'a [ToolSpec],
    pub max_tokens: Option<u32>,
    /// Sent as the request's `response_format` (e.g. `{"type": "json_schema", …}`).
    pub response_format: Option<&'a serde_json::Value>,
    /// Sends `tool_choice: "required"`: the model must call a tool.
    pub tool_choice_required: bool,
}

/// A piece of a step as it streams.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    Text(String),
    /// Reasoning tokens some servers stream beside the text.
    Reasoning(String),
    /// A piece of a tool call as it streams. `index`: the call's position in the step,
    /// counted from 0 in the order the calls began (the same call keeps its index; the
    /// step's `tool_calls` follow the server's numbering, which is this order unless a
    /// server interleaves calls out of it). `name`: on the piece that carries the
    /// function's name (a fragment of it, where a server streams the name in pieces:
    /// the pieces joined are the name). `text`: this piece's fragment of the arguments
    /// (empty when only the name came); the fragments joined are the call's arguments.
    ToolArgs {
        index: usize,
        name: Option<String>,
        text: String,
    },
    /// The call is made again after `delay`: what was built from this attempt's deltas
    /// is void.
    Retry {
        attempt: u32,
        issues: String,
        delay: Duration,
    },
}

/// A finished step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutput {
    pub text: String,
    pub reasoning: String,
    /// Assembled, in the model's order. Non-empty means the model called tools,
    /// whatever `finish_reason` says.
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: Option<String>,
    /// `None` when the server reported none.
    pub usage: Option<Usage>,
}

/// How many tokens a request and its answer may hold, and who said so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextWindow {
    pub tokens: u64,
    /// Where the number came from (the server's `/props`, a setting), for the log.
    pub source: String,
}

/// The future of [`Model::context_window`].
pub type ContextFuture<'a> = Pin<Box<dyn Future<Output = Option<ContextWindow>> + Send + 'a>>;

/// The future of one step.
pub type StepFuture<'a> = Pin<Box<dyn Future<Output = Result<StepOutput, ModelError>> + Send + 'a>>;

/// A model the runner can call. Dropping the future stops the call at once.
pub trait Model: Send + Sync + 'static {
    /// What the endpoint enforces; nothing, unless the model says otherwise.
    fn caps(&self) -> Caps {
        Caps::default()
    }

    /// The model's context, asked once when the runner starts; `None`: unknown.
    fn context_window(&self) -> ContextFuture<'_> {
        Box::pin(async { None })
    }

    fn step<'a>(
        &'a self,
        req: StepRequest<'a>,
        on_delta: &'a mut (dyn FnMut(Delta) + Send),
    ) -> StepFuture<'a>;
}
