//! Which channel carries the envelope (`emit`, `respond`, `native`), chosen from what the
//! endpoint can enforce (its [`Caps`], which the model client knows): `auto`'s rule.

use serde_json::Value;

use super::strict::fits_strict;
pub use crate::model::{Caps, Endpoint};

/// How the envelope should travel (`output.strategy`); `auto` is [`choose`]'s rule.
pub use cortex_protocol::api::OutputStrategy as Strategy;

/// The channel the envelope travels on (a session keeps the one chosen when it was made).
pub use cortex_protocol::api::OutputTransport as Transport;

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
    fn transports_have_their_wire_names() {
        assert_eq!(
            serde_json::to_value(Transport::Respond).expect("encode"),
            "respond"
        );
        assert_eq!(Transport::Native.as_str(), "native");
    }
}
