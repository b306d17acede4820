//! Talking to a model: the chat shapes (`wire`), the seam the runner calls for one
//! streamed step (`step`: [`Model`], [`StepRequest`], [`Delta`], [`StepOutput`]), and
//! the OpenAI-compatible HTTP client that implements it ([`ModelClient`]) with its
//! configuration ([`llm_config`]), and what an endpoint can enforce (`caps`: [`Endpoint`],
//! [`Caps`]). The client's parts: `cortex_host::sse` (bytes into events),
//! `assemble` (chunks into a step), `retry` (when to call again), `error`.

mod assemble;
mod caps;
mod client;
mod config;
mod error;
mod retry;
mod step;
#[cfg(test)]
mod tests;
pub mod wire;

pub use caps::{Caps, Endpoint};
pub use client::{ModelClient, request_body};
pub use config::{ModelConfig, RAW_BYTES_PER_REPLY_BYTE, llm_config};
pub use error::ModelError;
pub use step::{ContextFuture, ContextWindow, Delta, Model, StepFuture, StepOutput, StepRequest};
pub use wire::{ChatMessage, FunctionCall, Role, ToolCall, ToolSpec};
