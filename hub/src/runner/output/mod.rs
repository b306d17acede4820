//! Typed answers: a session's output schema and the envelope every run ends in
//! (`{response?, data, reasoning?}`), with the pure parts of carrying it — the transport
//! choice, the `respond` tool, the fence-tolerant parse, the unwrap rung, the corrections,
//! the schema documentation and the partial parse behind `output-partial`.
//!
//! The runner compiles a session's [`OutputConfig`] once into an [`Output`], asks it for a
//! [`Plan`] against the endpoint's [`Caps`] (what to send), and judges each turn's answer
//! with [`Output::judge_text`] (a completion, or a `respond` call's arguments).

pub mod correct;
pub mod doc;
pub mod emit;
pub mod envelope;
pub mod partial;
pub mod respond;
pub mod strict;
pub mod transport;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub use envelope::{Checker, Envelope, Issue, Verdict, envelope_schema, strict_envelope_schema};
pub use respond::{Calls, Params, RESPOND, RespondTool, respond_alone, respond_tool};
pub use strict::{fits_strict, strict_problems};
pub use transport::{Caps, Endpoint, Strategy, Transport, choose};

/// A session's output settings, as `POST /api/sessions` takes them under `output`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputConfig {
    /// The JSON Schema of the envelope's `data`.
    pub schema: Value,
    #[serde(default)]
    pub strategy: Strategy,
    /// Every turn must be a tool call (`tool_choice: "required"`), so `respond` is the
    /// only exit.
    #[serde(default)]
    pub force_tool: bool,
    /// The schema documentation: `"off"` for none, any other text to replace it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doc: Option<String>,
}

/// Why a session's output settings cannot be used (a 400, in these words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("output.schema is not a usable JSON Schema: {0}")]
    Schema(String),
    #[error(
        "output.forceTool cannot be combined with strategy \"{0}\": the answer there is a \
         content-only message, and forceTool makes every turn a tool call"
    )]
    ForceTool(&'static str),
}

impl OutputConfig {
    /// Checks the settings: the schema compiles, and `forceTool` is not combined with a
    /// transport whose answer is a content-only turn (`emit`, `native`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.compile().map(drop)
    }

    /// The settings compiled for a run.
    pub fn compile(&self) -> Result<Output, ConfigError> {
        match (self.force_tool, self.strategy) {
            (true, Strategy::Emit) => return Err(ConfigError::ForceTool("emit")),
            (true, Strategy::Native) => return Err(ConfigError::ForceTool("native")),
            _ => {}
        }
        let checker = Checker::new(Some(&self.schema)).map_err(ConfigError::Schema)?;
        Ok(Output {
            config: Some(self.clone()),
            checker,
        })
    }
}

/// A session's output, compiled: its settings (none for a chat agent) and the checks.
#[derive(Debug, Clone)]
pub struct Output {
    config: Option<OutputConfig>,
    checker: Checker,
}

/// What the runner sends for a session's runs, fixed at run start.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// What `meta.strategy` reports.
    pub transport: Transport,
    /// The `respond` tool to add beside the session's tools (under `respond` only).
    pub respond: Option<RespondTool>,
    /// The request's `response_format` (under `native` only).
    pub response_format: Option<Value>,
    /// `tool_choice: "required"` on every step (`forceTool`).
    pub tool_choice_required: bool,
    /// The OUTPUT SCHEMA system chunk, placed once in the prefix, when the transport
    /// leaves the schema to the prompt.
    pub doc: Option<String>,
}

impl Output {
    /// A chat agent's output (no schema): `response` required, no `data`.
    pub fn chat() -> Output {
        // The envelope's own schemas are constants: no input can make this fail.
        let checker = Checker::new(None).expect("the envelope's own schema compiles");
        Output {
            config: None,
            checker,
        }
    }

    /// The data schema, when there is one.
    pub fn schema(&self) -> Option<&Value> {
        self.config.as_ref().map(|c| &c.schema)
    }

    /// The settings, when the session has an output schema.
    pub fn config(&self) -> Option<&OutputConfig> {
        self.config.as_ref()
    }

    /// The envelope in `value`, or the validator's issues (no unwrap rung).
    pub fn validate_envelope(&self, value: &Value) -> Result<Envelope, Vec<Issue>> {
        self.checker.validate_envelope(value)
    }

    /// A parsed answer judged: envelope first, then the unwrap rung.
    pub fn judge(&self, value: &Value) -> Verdict {
        self.checker.judge(value)
    }

    /// A turn's text judged (a completion, or a `respond` call's arguments): the first
    /// complete JSON object in it, envelope first, then the unwrap rung; no object is
    /// [`Verdict::NoEnvelope`].
    pub fn judge_text(&self, text: &str) -> Verdict {
        self.checker.judge_text(text)
    }

    /// What to send on an endpoint with `caps`. The schema documentation goes in the
    /// prefix when the transport leaves the schema to the prompt (`emit`, or `respond`
    /// with loose or permissive params), unless `output.doc` is `"off"`; another `doc`
    /// text replaces it.
    pub fn plan(&self, caps: &Caps, has_tools: bool) -> Plan {
        let (strategy, force_tool) = self
            .config
            .as_ref()
            .map_or((Strategy::Auto, false), |c| (c.strategy, c.force_tool));
        let transport = choose(strategy, caps, self.schema(), has_tools, force_tool);
        let respond = (transport == Transport::Respond).then(|| respond_tool(self.schema(), caps));
        let response_format = (transport == Transport::Native).then(|| self.response_format());
        let needs_doc = match &respond {
            Some(tool) => tool.needs_doc(),
            None => transport == Transport::Emit,
        };
        let doc = needs_doc.then(|| self.doc(transport)).flatten();
        Plan {
            transport,
            respond,
            response_format,
            tool_choice_required: force_tool,
            doc,
        }
    }

    /// The `response_format` for `native`: the strict envelope when the data schema fits
    /// strict mode, the plain envelope (not strict) when it was chosen anyway.
    pub fn response_format(&self) -> Value {
        let strict = self.schema().is_none_or(fits_strict);
        let schema = if strict {
            strict_envelope_schema(self.schema())
        } else {
            envelope_schema(self.schema())
        };
        json!({
            "type": "json_schema",
            "json_schema": {"name": "envelope", "strict": strict, "schema": schema},
        })
    }

    /// The OUTPUT SCHEMA chunk for `transport`, as `output.doc` says.
    pub fn doc(&self, transport: Transport) -> Option<String> {
        match self.config.as_ref().and_then(|c| c.doc.as_deref()) {
            Some("off") => None,
            Some(text) => Some(text.to_owned()),
            None => Some(doc::schema_doc(self.schema(), transport)),
        }
    }
}

#[cfg(test)]
mod tests;
