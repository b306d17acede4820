//! The synthetic `respond` tool: its parameters (strict, loose or permissive, from the
//! data schema and the endpoint), and the rule that a `respond` call counts only alone.

use serde_json::{Value, json};

use super::envelope::{
    DATA, REASONING, REASONING_HELP, RESPONSE, RESPONSE_HELP, strict_envelope_schema,
};
use super::strict::fits_strict;
use super::transport::Caps;
use crate::model::{ToolCall, ToolSpec};

/// The synthetic tool's name; no other tool may claim it.
pub const RESPOND: &str = "respond";

/// How much the `respond` parameters say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Params {
    /// The whole envelope schema, strict (the endpoint may enforce it).
    Strict,
    /// The envelope's fields with `data` unconstrained; the schema is in the prompt.
    Loose,
    /// The envelope's fields, constraining nothing: the endpoint validates tool args
    /// itself and would fail the request on a mismatch the client can repair.
    Permissive,
}

/// The `respond` tool for a session.
#[derive(Debug, Clone, PartialEq)]
pub struct RespondTool {
    pub spec: ToolSpec,
    pub params: Params,
}

impl RespondTool {
    /// Whether the schema documentation must go in the prefix: whenever the params do not
    /// carry the whole schema.
    pub fn needs_doc(&self) -> bool {
        self.params != Params::Strict
    }
}

/// The `respond` tool. Permissive params when the endpoint validates tool args itself;
/// the strict envelope when the data schema is strict-compatible and small (a chat
/// agent's always is); loose params otherwise, `data` pointing at OUTPUT SCHEMA in the
/// system prompt.
pub fn respond_tool(data: Option<&Value>, caps: &Caps) -> RespondTool {
    let params = if caps.validates_tool_args {
        Params::Permissive
    } else if data.is_none_or(fits_strict) {
        Params::Strict
    } else {
        Params::Loose
    };
    let parameters = match params {
        Params::Strict => strict_envelope_schema(data),
        Params::Loose => loose(data),
        Params::Permissive => permissive(data.is_some()),
    };
    let mut description = String::from(
        "Give your final answer and end your turn. Call it alone, as your last action, \
         with no other tool call beside it.",
    );
    if params != Params::Strict {
        description.push_str(" The arguments follow OUTPUT SCHEMA in the system prompt.");
    }
    let spec = ToolSpec {
        name: RESPOND.into(),
        description,
        parameters,
        strict: params == Params::Strict,
    };
    RespondTool { spec, params }
}

fn loose(data: Option<&Value>) -> Value {
    let mut d =
        json!({"description": "the answer's payload: see OUTPUT SCHEMA in the system prompt"});
    if data.and_then(|s| s.get("type")) == Some(&json!("object")) {
        d["type"] = json!("object");
    }
    json!({
        "type": "object",
        "properties": {
            RESPONSE: {"type": "string", "description": RESPONSE_HELP},
            DATA: d,
            REASONING: {"type": "string", "description": REASONING_HELP},
        },
        "required": [DATA],
    })
}

fn permissive(with_data: bool) -> Value {
    let mut props = serde_json::Map::new();
    props.insert(RESPONSE.into(), json!({}));
    if with_data {
        props.insert(DATA.into(), json!({}));
    }
    props.insert(REASONING.into(), json!({}));
    json!({"type": "object", "properties": props})
}

/// A turn's tool calls under the respond-alone rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Calls {
    /// The calls to record and run, in the model's order (never a `respond`).
    pub run: Vec<ToolCall>,
    /// The answer, when `respond` was called alone.
    pub respond: Option<ToolCall>,
    /// `respond` calls dropped because other calls stood beside them.
    pub dropped: Vec<ToolCall>,
}

/// `respond` must be called alone. Beside other tool calls it is dropped: the others run
/// as usual and the model is told nothing about it (no note: leave the dropped call out
/// of the assistant message as recorded, since every recorded call needs an answer).
/// A turn of only `respond` calls answers with the first; the rest are dropped.
pub fn respond_alone(calls: Vec<ToolCall>) -> Calls {
    let (responds, run): (Vec<ToolCall>, Vec<ToolCall>) =
        calls.into_iter().partition(|c| c.function.name == RESPOND);
    if !run.is_empty() {
        return Calls {
            run,
            respond: None,
            dropped: responds,
        };
    }
    let mut responds = responds.into_iter();
    let respond = responds.next();
    Calls {
        run,
        respond,
        dropped: responds.collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::FunctionCall;
    use crate::runner::output::transport::Endpoint;

    fn call(id: &str, name: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            kind: "function".into(),
            function: FunctionCall {
                name: name.into(),
                arguments: "{}".into(),
            },
        }
    }

    fn ids(calls: &[ToolCall]) -> Vec<&str> {
        calls.iter().map(|c| c.id.as_str()).collect()
    }

    /// (calls, run, respond, dropped), by id.
    #[test]
    fn respond_counts_only_alone() {
        type Case<'a> = (Vec<ToolCall>, &'a [&'a str], Option<&'a str>, &'a [&'a str]);
        let cases: Vec<Case> = vec![
            (vec![call("1", RESPOND)], &[], Some("1"), &[]),
            (vec![call("1", "wait_check")], &["1"], None, &[]),
            (
                vec![call("1", "wait_check"), call("2", RESPOND)],
                &["1"],
                None,
                &["2"],
            ),
            (
                vec![
                    call("1", RESPOND),
                    call("2", "devices"),
                    call("3", "wait_check"),
                ],
                &["2", "3"],
                None,
                &["1"],
            ),
            (
                vec![call("1", RESPOND), call("2", RESPOND)],
                &[],
                Some("1"),
                &["2"],
            ),
            (vec![], &[], None, &[]),
        ];
        for (calls, run, respond, dropped) in cases {
            let got = respond_alone(calls);
            assert_eq!(ids(&got.run), run);
            assert_eq!(got.respond.as_ref().map(|c| c.id.as_str()), respond);
            assert_eq!(ids(&got.dropped), dropped);
        }
    }

    #[test]
    fn params_follow_the_schema_and_the_endpoint() {
        let small = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false});
        let open = json!({"type": "object", "additionalProperties": true});
        let local = Endpoint::LlamaCpp.caps();
        let groq = Endpoint::Groq.caps();
        // (data schema, caps, params)
        let cases = [
            (Some(&small), &local, Params::Strict),
            (None, &local, Params::Strict),
            (Some(&open), &local, Params::Loose),
            (Some(&small), &groq, Params::Permissive),
            (None, &groq, Params::Permissive),
        ];
        for (data, caps, want) in cases {
            let tool = respond_tool(data, caps);
            assert_eq!(tool.params, want, "{data:?}");
            assert_eq!(tool.spec.name, RESPOND);
            assert_eq!(tool.spec.strict, want == Params::Strict);
            assert_eq!(tool.needs_doc(), want != Params::Strict);
            assert_eq!(
                tool.spec.description.contains("OUTPUT SCHEMA"),
                want != Params::Strict
            );
        }
        let strict = respond_tool(Some(&small), &local).spec.parameters;
        assert_eq!(strict["properties"]["data"], small);
        let loose = respond_tool(Some(&open), &local).spec.parameters;
        assert_eq!(loose["properties"]["data"]["type"], "object");
        assert_eq!(loose["required"], json!(["data"]));
        let permissive = respond_tool(Some(&small), &groq).spec.parameters;
        assert_eq!(permissive["properties"]["data"], json!({}));
        assert!(permissive.get("required").is_none());
        assert!(
            respond_tool(None, &groq).spec.parameters["properties"]
                .get("data")
                .is_none()
        );
    }
}
