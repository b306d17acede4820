//! A session's runs: what a run took, its tool calls, its result and meta.

use serde::{Deserialize, Serialize};

/// One inbox item a run took, as `run-start` names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct RunInput {
    /// The inbox item's seq.
    pub seq: u64,
    /// `message`, `wake` or `timer`.
    pub kind: String,
    /// The text the model reads for it.
    pub text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum DeltaChannel {
    Text,
    Reasoning,
}

/// A tool call as the model made it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct ToolCallView {
    /// The call's id (the model's, or the hub's when the model gave none).
    pub id: String,
    pub name: String,
    /// The arguments, parsed; the raw text as a string when they are not JSON.
    pub args: serde_json::Value,
}

/// What a tool call came to, as the model sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Observation {
    pub call_id: String,
    pub name: String,
    pub ok: bool,
    /// The tool's answer (on `ok`) or `{error}`.
    pub result: serde_json::Value,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct RunResult {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Envelope>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
}

/// A run's answer: prose for a person (`response`), data for a program (`data`), and the
/// model's own short reason (`reasoning`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Envelope {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

/// Why a run failed: `code` is `model_call_failed`, `output_invalid`, `stopped` (with
/// `stop`: `steps`, `tokens`, `duration`, `output_retries`, `repeated_calls`), `aborted`
/// or `unknown`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct RunError {
    pub code: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<String>,
    pub message: String,
}

/// What a run used and how it went, authored by the hub (never by the model).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunMeta {
    pub usage: Usage,
    /// The output transport that ran (`emit` for a chat session).
    pub strategy: String,
    pub steps: u32,
    pub output_retries: u32,
    pub elapsed_ms: u64,
    /// Why the run's last model call stopped, as the server said (`stop`, `tool_calls`,
    /// `length`: cut at `maxTokens`); absent when it said nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

/// Tokens, as the model server reported them (zero where it reported none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

/// `GET /api/sessions/{sid}/result`: the last run's result and meta.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct SessionResult {
    pub run_id: String,
    pub result: RunResult,
    pub meta: RunMeta,
}
