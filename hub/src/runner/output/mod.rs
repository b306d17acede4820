//! Typed answers: a session's output schema and the envelope every run ends in
//! (`{response?, data, reasoning?}`), with the pure parts of carrying it — the transport
//! choice, the `respond` tool, the fence-tolerant parse, the unwrap rung, the corrections,
//! the schema documentation and the partial parse behind `output-partial`.
//!
//! The runner compiles a session's [`OutputConfig`] once into an [`Output`], asks it for a
//! [`Plan`] against the endpoint's [`Caps`] (what to send), and judges each turn's answer
//! with [`Output::judge_text`] (a completion, or a `respond` call's arguments).

pub mod budget;
pub mod correct;
pub mod doc;
pub mod emit;
pub mod envelope;
pub mod partial;
pub mod precheck;
pub mod respond;
pub mod stream;
pub mod strict;
pub mod transport;

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::model::ToolCall;

pub use envelope::{
    Checker, Envelope, Issue, Verdict, envelope_schema, last_output, strict_envelope_schema,
};
pub use respond::{Calls, Params, RESPOND, RespondTool, respond_alone, respond_tool};
pub use stream::Stream;
pub use strict::{fits_strict, strict_problems};
pub use transport::{Caps, Endpoint, Strategy, Transport, choose};

pub use cortex_protocol::api::OutputConfig;

/// Why a session's output settings cannot be used (a 400, in these words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("output.schema is not a usable JSON Schema: {0}")]
    Schema(String),
    #[error(
        "output.schema expands to more than {0} subschemas once its $refs are followed (a \
         definition referred to along many paths is checked once per path); refer to fewer \
         definitions from each, or flatten the schema"
    )]
    TooLarge(u64),
    #[error("output.schema nests deeper than {0} levels once its $refs are followed; flatten it")]
    TooDeep(usize),
    #[error("output.schema did not compile within limits.schemaCompileMs ({0} ms); simplify it")]
    TooSlow(u64),
    #[error("another output schema is still compiling past its budget ({0} ms); try again shortly")]
    Busy(u64),
    #[error(
        "output.forceTool cannot be combined with strategy \"{0}\": the answer there is a \
         content-only message, and forceTool makes every turn a tool call"
    )]
    ForceTool(&'static str),
}

/// Checks a session's output settings: the schema compiles, and `forceTool` is not
/// combined with a transport whose answer is a content-only turn (`emit`, `native`).
pub fn validate(config: &OutputConfig) -> Result<(), ConfigError> {
    compile(config).map(drop)
}

/// A session's output settings compiled for its runs, here and now: kept from an earlier
/// compile in this process, else checked ([`precheck::precheck`]) and compiled. An async
/// caller uses [`budget::compile_within`], which runs this on a blocking thread under the
/// hub's budget.
pub fn compile(config: &OutputConfig) -> Result<Output, ConfigError> {
    if let Some(out) = cached(config) {
        return Ok(out);
    }
    check_cheap(config)?;
    let checker = Checker::new(Some(&config.schema)).map_err(ConfigError::Schema)?;
    let out = Output {
        config: Some(config.clone()),
        checker,
    };
    remember(config, &out);
    Ok(out)
}

/// What is refused before anything compiles: `forceTool` with a content-only transport,
/// and a schema past the precheck's bounds.
fn check_cheap(config: &OutputConfig) -> Result<(), ConfigError> {
    match (config.force_tool, config.strategy) {
        (true, Strategy::Emit) => return Err(ConfigError::ForceTool("emit")),
        (true, Strategy::Native) => return Err(ConfigError::ForceTool("native")),
        _ => {}
    }
    precheck::precheck(&config.schema).map_err(ConfigError::from)
}
impl From<precheck::Over> for ConfigError {
    fn from(o: precheck::Over) -> ConfigError {
        match o {
            precheck::Over::Expanded => ConfigError::TooLarge(precheck::MAX_EXPANDED),
            precheck::Over::Depth => ConfigError::TooDeep(precheck::MAX_DEPTH),
        }
    }
}

/// Compiled schemas kept; past it the cache starts over (a compile is cheap once the
/// precheck passed, the cache only spares repeating it on every drive).
const CACHE_MAX: usize = 512;

static CACHE: LazyLock<Mutex<HashMap<[u8; 32], Output>>> = LazyLock::new(Mutex::default);

fn key(config: &OutputConfig) -> [u8; 32] {
    // Serializing a value that was deserialized cannot fail; an empty key would only
    // share one cache slot, never mix two schemas' checks (it is not stored then).
    let bytes = serde_json::to_vec(config).unwrap_or_default();
    Sha256::digest(&bytes).into()
}

/// The compiled checks of `config`, when compiled before in this process.
pub fn cached(config: &OutputConfig) -> Option<Output> {
    let k = key(config);
    CACHE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&k)
        .cloned()
}

fn remember(config: &OutputConfig, out: &Output) {
    let k = key(config);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if cache.len() >= CACHE_MAX {
        cache.clear();
    }
    cache.insert(k, out.clone());
}

/// A session's output, compiled: its settings (none for a chat agent) and the checks.
#[derive(Debug, Clone)]
pub struct Output {
    config: Option<OutputConfig>,
    checker: Checker,
}

/// A finished model turn, judged ([`Output::judge_turn`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Judged {
    /// Tool calls to run (the run goes on); `dropped` `respond` calls stood beside them
    /// and are left out of the record, the model told nothing.
    Calls { run: Vec<ToolCall>, dropped: usize },
    /// The turn's answer, carried by its text or by `via`, a `respond` call made alone.
    Answer {
        verdict: Verdict,
        via: Option<ToolCall>,
    },
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

    /// A session whose stored schema no longer compiles (a newer validator refuses what
    /// an older one took): every answer is refused, none let through unchecked.
    pub fn refusing(config: OutputConfig) -> Output {
        // `false` is a schema that refuses every value; it always compiles.
        let checker = Checker::new(Some(&Value::Bool(false))).expect("the schema `false` compiles");
        Output {
            config: Some(config),
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

    /// A finished model turn judged on `transport`: its tool calls to run, or its answer.
    ///
    /// - A chat agent's turn with no tool calls answers with its text as `response`.
    /// - Under `respond`, `respond` counts only alone ([`respond_alone`]): beside other
    ///   calls it is dropped and the others run; alone, its arguments are the answer; with
    ///   no call at all, the text is judged (an emitted envelope is a legal exit too).
    /// - Under `emit` and `native` a turn with tool calls runs them; one without is judged
    ///   by its text.
    pub fn judge_turn(&self, transport: Transport, text: &str, calls: Vec<ToolCall>) -> Judged {
        if self.config.is_none() {
            if !calls.is_empty() {
                return Judged::Calls {
                    run: calls,
                    dropped: 0,
                };
            }
            let envelope = Envelope {
                response: Some(text.trim().to_owned()),
                ..Envelope::default()
            };
            return Judged::Answer {
                verdict: Verdict::Accepted {
                    envelope,
                    unwrapped: false,
                },
                via: None,
            };
        }
        let (run, respond, dropped) = if transport == Transport::Respond {
            let c = respond_alone(calls);
            (c.run, c.respond, c.dropped.len())
        } else {
            (calls, None, 0)
        };
        if !run.is_empty() {
            return Judged::Calls { run, dropped };
        }
        match respond {
            Some(call) => Judged::Answer {
                verdict: self.judge_text(&call.function.arguments),
                via: Some(call),
            },
            None => Judged::Answer {
                verdict: self.judge_text(text),
                via: None,
            },
        }
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
        self.plan_for(transport, caps)
    }

    /// What to send for `transport` once it is chosen (a session keeps the transport
    /// chosen when it was made, so its prefix and its requests agree).
    pub fn plan_for(&self, transport: Transport, caps: &Caps) -> Plan {
        let force_tool = self.config.as_ref().is_some_and(|c| c.force_tool);
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
