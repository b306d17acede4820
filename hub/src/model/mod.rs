//! Talking to a model: the chat shapes (`wire`), and the [`Model`] seam the runner calls
//! for one streamed step. The OpenAI-compatible HTTP client implements it; tests may
//! implement it in process.

pub mod wire;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use cortex_protocol::api::Usage;

pub use wire::{ChatMessage, FunctionCall, Role, ToolCall, ToolSpec};

/// One model call: the whole transcript, the tools, the per-step token cap.
#[derive(Debug, Clone, Copy)]
pub struct StepRequest<'a> {
    pub messages: &'a [ChatMessage],
    pub tools: &'a [ToolSpec],
    pub max_tokens: Option<u32>,
}

/// A piece of a step as it streams.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    Text(String),
    /// Reasoning tokens some servers stream beside the text.
    Reasoning(String),
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
    /// Assembled, in the model's order.
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: Option<String>,
    /// `None` when the server reported none.
    pub usage: Option<Usage>,
}

/// Why a model call failed, in words an operator can act on.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ModelError {
    #[error("{0}")]
    Failed(String),
}

/// The future of one step.
pub type StepFuture<'a> = Pin<Box<dyn Future<Output = Result<StepOutput, ModelError>> + Send + 'a>>;

/// A model the runner can call. Dropping the future stops the call at once.
pub trait Model: Send + Sync + 'static {
    fn step<'a>(
        &'a self,
        req: StepRequest<'a>,
        on_delta: &'a mut (dyn FnMut(Delta) + Send),
    ) -> StepFuture<'a>;
}
