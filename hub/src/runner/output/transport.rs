//! Which channel carries the envelope (`emit`, `respond`, `native`), chosen from what the
//! endpoint can enforce: the endpoint's capabilities, and `auto`'s rule over them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::strict::fits_strict;

/// How the envelope should travel (`output.strategy`); `auto` is [`choose`]'s rule.
pub use cortex_protocol::api::OutputStrategy as Strategy;

/// The channel the envelope travels on (a session keeps the one chosen when it was made).
pub use cortex_protocol::api::OutputTransport as Transport;

/// What an OpenAI-compatible endpoint (with the model it serves) can enforce.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    /// `response_format: json_schema` is enforced by a grammar.
    pub structured_output: bool,
    /// ... and still with tools in the same request (without it the endpoint refuses the
    /// pair, or the grammar leaves no room for a tool call).
    pub structured_with_tools: bool,
    /// The endpoint checks tool arguments against the parameters itself and fails the
    /// whole request on a mismatch (Groq's `tool_use_failed`).
    pub validates_tool_args: bool,
    /// The model garbles nested payloads in tool-call arguments.
    pub mangles_nested_tool_args: bool,
}

/// The OpenAI-compatible servers the hub knows, by what each can enforce. What `auto`
/// gives each, with tools in the request (a session always has its built-in tools) and
/// a small strict-compatible schema; any other schema gets `emit` everywhere:
///
/// | endpoint | `auto` | why |
/// |---|---|---|
/// | OpenAI | `native` | strict `response_format` is enforced beside tools |
/// | vLLM | `respond` | guided decoding covers the whole completion, so no tool calls beside it |
/// | Ollama | `respond` | `format` is a grammar over the whole reply, not beside tools |
/// | llama.cpp server | `respond` | refuses a grammar (`response_format`) together with tools |
/// | Groq | `emit` | validates tool args itself, so `respond`'s params would enforce nothing |
/// | other | `respond` | nothing known: no grammar is asked for |
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    #[serde(rename = "openai")]
    OpenAi,
    Vllm,
    Ollama,
    #[serde(rename = "llamacpp")]
    LlamaCpp,
    Groq,
    #[default]
    Other,
}

impl Endpoint {
    /// What the endpoint enforces.
    pub fn caps(self) -> Caps {
        let grammar_alone = Caps {
            structured_output: true,
            ..Caps::default()
        };
        match self {
            Endpoint::OpenAi => Caps {
                structured_with_tools: true,
                ..grammar_alone
            },
            Endpoint::Vllm | Endpoint::Ollama | Endpoint::LlamaCpp => grammar_alone,
            Endpoint::Groq => Caps {
                validates_tool_args: true,
                ..Caps::default()
            },
            Endpoint::Other => Caps::default(),
        }
    }
}

/// The transport for a session. An explicit strategy is honored as it is. `auto` takes
/// the transport that enforces the most:
/// - `respond` when `forceTool` is set (every turn a tool call: `respond` is the only exit);
/// - `native` when the endpoint enforces `response_format` (beside tools, or there are
///   none) and the data schema is strict-compatible and small;
/// - `respond` when the tool params can enforce the contract: the endpoint does not
///   validate tool args itself, the data schema is strict-compatible and small, and the
///   model carries nested payloads on the tool channel intact;
/// - `emit` otherwise: every model can do it, and the contract rides the prompt.
///
/// A chat agent (no data schema) fits: its envelope is two strings.
pub fn choose(
    strategy: Strategy,
    caps: &Caps,
    schema: Option<&Value>,
    has_tools: bool,
    force_tool: bool,
) -> Transport {
    match strategy {
        Strategy::Emit => return Transport::Emit,
        Strategy::Respond => return Transport::Respond,
        Strategy::Native => return Transport::Native,
        Strategy::Auto => {}
    }
    if force_tool {
        return Transport::Respond;
    }
    let fits = schema.is_none_or(fits_strict);
    if fits && caps.structured_output && (caps.structured_with_tools || !has_tools) {
        return Transport::Native;
    }
    if fits && !caps.validates_tool_args && !caps.mangles_nested_tool_args {
        return Transport::Respond;
    }
    Transport::Emit
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn small() -> Value {
        json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false})
    }

    fn open() -> Value {
        json!({"type": "object", "additionalProperties": {"type": "string"}})
    }

    /// What `auto` gives each endpoint the hub knows: the table in [`Endpoint`]'s docs.
    #[test]
    fn auto_per_endpoint() {
        use Endpoint::*;
        use Transport::*;
        // (endpoint, with tools + small strict schema, with tools + open schema,
        //  no tools + small strict schema)
        let cases = [
            (OpenAi, Native, Emit, Native),
            (Vllm, Respond, Emit, Native),
            (Ollama, Respond, Emit, Native),
            (LlamaCpp, Respond, Emit, Native),
            (Groq, Emit, Emit, Emit),
            (Other, Respond, Emit, Respond),
        ];
        for (endpoint, small_tools, open_tools, small_alone) in cases {
            let caps = endpoint.caps();
            let pick =
                |schema: &Value, tools| choose(Strategy::Auto, &caps, Some(schema), tools, false);
            assert_eq!(pick(&small(), true), small_tools, "{endpoint:?}");
            assert_eq!(pick(&open(), true), open_tools, "{endpoint:?}");
            assert_eq!(pick(&small(), false), small_alone, "{endpoint:?}");
            // A chat agent fits wherever a small strict schema does.
            assert_eq!(
                choose(Strategy::Auto, &caps, None, true, false),
                small_tools,
                "{endpoint:?}"
            );
        }
    }

    #[test]
    fn auto_over_capabilities() {
        let c = |structured_output,
                 structured_with_tools,
                 validates_tool_args,
                 mangles_nested_tool_args| Caps {
            structured_output,
            structured_with_tools,
            validates_tool_args,
            mangles_nested_tool_args,
        };
        // (caps, force_tool, want)
        let cases = [
            (c(true, true, false, false), false, Transport::Native),
            (c(true, true, false, false), true, Transport::Respond),
            (c(false, false, true, false), true, Transport::Respond),
            (c(false, false, false, true), false, Transport::Emit),
            (c(false, false, true, false), false, Transport::Emit),
            (c(true, false, false, true), false, Transport::Emit),
            (c(false, false, false, false), false, Transport::Respond),
        ];
        for (caps, force, want) in cases {
            assert_eq!(
                choose(Strategy::Auto, &caps, Some(&small()), true, force),
                want,
                "{caps:?} {force}"
            );
        }
    }

    #[test]
    fn an_explicit_strategy_is_honored() {
        let groq = Endpoint::Groq.caps();
        for (s, want) in [
            (Strategy::Emit, Transport::Emit),
            (Strategy::Respond, Transport::Respond),
            (Strategy::Native, Transport::Native),
        ] {
            assert_eq!(choose(s, &groq, Some(&open()), true, false), want);
        }
    }

    #[test]
    fn endpoints_and_transports_have_their_wire_names() {
        let e: Endpoint = serde_json::from_value(json!("llamacpp")).expect("parse");
        assert_eq!(e, Endpoint::LlamaCpp);
        assert_eq!(
            serde_json::to_value(Endpoint::OpenAi).expect("encode"),
            "openai"
        );
        assert_eq!(
            serde_json::to_value(Transport::Respond).expect("encode"),
            "respond"
        );
        assert_eq!(Transport::Native.as_str(), "native");
    }
}
