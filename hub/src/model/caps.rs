//! What an OpenAI-compatible endpoint can enforce: the servers the hub knows
//! ([`Endpoint`], named by `llm.endpoint` or told from the base URL's host) and their
//! capabilities ([`Caps`]), which decide how a typed answer travels.

use serde::{Deserialize, Serialize};

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

/// The OpenAI-compatible servers the hub knows, by what each can enforce. What the
/// runner's `auto` transport gives each, with tools in the request (a session always has
/// its built-in tools) and a small strict-compatible schema; any other schema gets `emit`
/// everywhere:
///
/// | endpoint | `auto` | why |
/// |---|---|---|
/// | OpenAI | `native` | strict `response_format` is enforced beside tools |
/// | vLLM | `respond` | guided decoding covers the whole completion, so no tool calls beside it |
/// | Ollama | `respond` | `format` is a grammar over the whole reply, not beside tools |
/// | llama.cpp server | `respond` | takes `response_format` beside tools, but its grammar then covers the whole reply and no tool call comes; a call's args follow the tool's params by grammar, `strict` or not |
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
    /// Every endpoint, in the order the words are listed to an operator.
    pub const ALL: [Endpoint; 6] = [
        Endpoint::OpenAi,
        Endpoint::Vllm,
        Endpoint::Ollama,
        Endpoint::LlamaCpp,
        Endpoint::Groq,
        Endpoint::Other,
    ];

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

    /// The word that names it (`llm.endpoint`, `CORTEX_LLM_ENDPOINT`).
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::OpenAi => "openai",
            Endpoint::Vllm => "vllm",
            Endpoint::Ollama => "ollama",
            Endpoint::LlamaCpp => "llamacpp",
            Endpoint::Groq => "groq",
            Endpoint::Other => "other",
        }
    }

    /// The endpoint a word names, case and surrounding blanks aside.
    pub fn from_word(word: &str) -> Option<Endpoint> {
        let word = word.trim();
        Endpoint::ALL
            .into_iter()
            .find(|e| e.as_str().eq_ignore_ascii_case(word))
    }

    /// The endpoint told from a base URL's host, when none is named: the hosted APIs by
    /// their hosts; anything else (a local server, a proxy) is `Other`, which asks for no
    /// grammar, since a wrong guess there would send what the server cannot enforce.
    pub fn from_base_url(base_url: &str) -> Endpoint {
        let host = reqwest::Url::parse(base_url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_ascii_lowercase));
        match host.as_deref().map(|h| h.trim_end_matches('.')) {
            Some("api.openai.com") => Endpoint::OpenAi,
            Some("api.groq.com") => Endpoint::Groq,
            _ => Endpoint::Other,
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Each endpoint's caps: the "why" column of [`Endpoint`]'s table.
    #[test]
    fn caps_per_endpoint() {
        use Endpoint::*;
        // (endpoint, structured_output, structured_with_tools, validates_tool_args,
        //  mangles_nested_tool_args)
        let cases = [
            (OpenAi, true, true, false, false),
            (Vllm, true, false, false, false),
            (Ollama, true, false, false, false),
            (LlamaCpp, true, false, false, false),
            (Groq, false, false, true, false),
            (Other, false, false, false, false),
        ];
        for (endpoint, so, swt, vta, mnta) in cases {
            assert_eq!(
                endpoint.caps(),
                Caps {
                    structured_output: so,
                    structured_with_tools: swt,
                    validates_tool_args: vta,
                    mangles_nested_tool_args: mnta,
                },
                "{endpoint:?}"
            );
        }
        assert_eq!(Endpoint::default(), Other);
    }

    #[test]
    fn endpoints_have_their_wire_names() {
        let e: Endpoint = serde_json::from_value(json!("llamacpp")).expect("parse");
        assert_eq!(e, Endpoint::LlamaCpp);
        assert_eq!(
            serde_json::to_value(Endpoint::OpenAi).expect("encode"),
            "openai"
        );
        // The words, serde's names and `as_str` agree, and each word reads back.
        for e in Endpoint::ALL {
            assert_eq!(serde_json::to_value(e).expect("encode"), e.as_str());
            assert_eq!(Endpoint::from_word(e.as_str()), Some(e));
            assert_eq!(e.to_string(), e.as_str());
        }
        assert_eq!(Endpoint::from_word(" LlamaCpp "), Some(Endpoint::LlamaCpp));
        assert_eq!(Endpoint::from_word("llama.cpp"), None);
        assert_eq!(Endpoint::from_word(""), None);
    }

    #[test]
    fn told_from_the_host() {
        let cases = [
            ("https://api.openai.com/v1", Endpoint::OpenAi),
            ("https://API.OpenAI.com./v1", Endpoint::OpenAi),
            ("https://api.groq.com/openai/v1", Endpoint::Groq),
            ("http://127.0.0.1:8080/v1", Endpoint::Other),
            ("http://localhost:11434/v1", Endpoint::Other),
            ("https://proxy.example/api.openai.com/v1", Endpoint::Other),
            ("https://api.openai.com.evil.example/v1", Endpoint::Other),
            ("https://user:pw@api.groq.com/openai/v1?x=1", Endpoint::Groq),
            ("not a url", Endpoint::Other),
        ];
        for (url, want) in cases {
            assert_eq!(Endpoint::from_base_url(url), want, "{url}");
        }
    }
}
