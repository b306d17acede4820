//! The OpenAI Chat Completions shapes the hub stores and sends: a chat message (as kept
//! in a session's transcript, byte for byte what the next request carries), a tool call,
//! and a tool the model may call.

use serde::{Deserialize, Serialize};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// One chat message, as stored in a session's transcript and sent on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// On a `tool` message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn system(text: impl Into<String>) -> Self {
        Self::text(Role::System, text)
    }

    pub fn user(text: impl Into<String>) -> Self {
        Self::text(Role::User, text)
    }

    pub fn assistant(text: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        let text = text.into();
        ChatMessage {
            role: Role::Assistant,
            // A reply that is only tool calls has no content, as servers send it.
            content: (!text.is_empty() || tool_calls.is_empty()).then_some(text),
            tool_calls,
            tool_call_id: None,
            name: None,
        }
    }

    /// The answer to tool call `call_id`.
    pub fn tool(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: Role::Tool,
            content: Some(content.into()),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.into()),
            name: None,
        }
    }

    fn text(role: Role, text: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: Some(text.into()),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
}

/// A tool call as the model made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    /// Always `"function"`.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_kind() -> String {
    "function".to_string()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as the model wrote them (JSON text, not necessarily valid).
    pub arguments: String,
}

/// A tool the model may call. On the wire:
/// `{"type":"function","function":{"name","description","parameters","strict"?}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// The arguments' JSON Schema.
    pub parameters: serde_json::Value,
    /// Asks the endpoint to hold the arguments to `parameters` exactly (OpenAI's strict
    /// mode, which needs a strict-compatible schema); sent only when set.
    pub strict: bool,
}

impl Serialize for ToolSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut function = serde_json::json!({
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
        });
        if self.strict {
            function["strict"] = serde_json::Value::Bool(true);
        }
        serde_json::json!({"type": "function", "function": function}).serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_as_servers_write_them() {
        let wire = r#"{"role":"assistant","tool_calls":[{"id":"call_1","type":"function","function":{"name":"wait_create","arguments":"{\"label\":\"x\"}"}}]}"#;
        let m: ChatMessage = serde_json::from_str(wire).expect("parse");
        assert_eq!(m.role, Role::Assistant);
        assert_eq!(m.content, None);
        assert_eq!(m.tool_calls[0].function.name, "wait_create");
        assert_eq!(serde_json::to_string(&m).expect("encode"), wire);
        let t = ChatMessage::tool("call_1", "{}");
        assert_eq!(
            serde_json::to_string(&t).expect("encode"),
            r#"{"role":"tool","content":"{}","tool_call_id":"call_1"}"#
        );
    }

    #[test]
    fn a_tool_spec_goes_out_as_a_function() {
        let t = ToolSpec {
            name: "devices".into(),
            description: "the fleet".into(),
            parameters: serde_json::json!({"type": "object", "properties": {}}),
            strict: false,
        };
        let v = serde_json::to_value(&t).expect("encode");
        assert_eq!(v["type"], "function");
        assert_eq!(v["function"]["name"], "devices");
        // Not strict: no `strict` key at all, so a server without strict mode sees nothing new.
        assert!(v["function"].get("strict").is_none(), "{v}");
        let strict = ToolSpec { strict: true, ..t };
        let v = serde_json::to_value(&strict).expect("encode");
        assert_eq!(v["function"]["strict"], true);
        assert!(v.get("strict").is_none(), "{v}");
    }
}
