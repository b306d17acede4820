//! A session's prefix: the messages every model request of the session starts with,
//! written into its transcript once, when its configuration is fixed, and never rebuilt,
//! so a server's prefix cache keeps hitting: the instructions with the tool guides (and,
//! when the answer's transport leaves the output schema to the prompt, its OUTPUT SCHEMA
//! documentation), then the worked example.

#[cfg(test)]
use cortex_protocol::api::Policy;
use cortex_protocol::api::{CreateSession, MAX_EXAMPLES, MAX_INSTRUCTIONS_BYTES};

use super::output::{self, Caps};
use super::tools;
use crate::config::AgentDefaults;
use crate::model::{ChatMessage, Role};
use crate::store::agent::AgentConfig;

/// The instructions of a session whose creator and hub give none.
pub use crate::session_state::DEFAULT_INSTRUCTIONS;

/// The prefix of a session with `config`, made on a model server that can enforce `caps`.
/// Its guides name only the tools the session's policy shows.
pub fn build(config: &AgentConfig, caps: &Caps) -> Vec<ChatMessage> {
    let mut out = Vec::with_capacity(1 + config.examples.len());
    let shown = tools::Shown::of(&config.policy);
    let mut system = format!(
        "{}\n\n{}",
        config.instructions.trim(),
        tools::guides(&shown)
    );
    if let Some(doc) = output_plan(config, caps).and_then(|p| p.doc) {
        system.push_str("\n\n");
        system.push_str(&doc);
    }
    out.push(ChatMessage::system(system));
    out.extend(config.examples.iter().cloned());
    out
}

/// A session's configuration as `GET /api/sessions/{sid}` shows it.
/// `model`: the model the hub's runner calls, if any.
pub fn config_view(c: &AgentConfig, model: Option<String>) -> cortex_protocol::api::SessionConfig {
    cortex_protocol::api::SessionConfig {
        instructions: c.instructions.clone(),
        model,
        examples: c
            .examples
            .iter()
            .filter_map(|m| serde_json::to_value(m).ok())
            .collect(),
        max_tokens: c.max_tokens,
        stop: c.stop,
        policy: c.policy.clone(),
        tools: tools::Shown::of(&c.policy).names().to_vec(),
        unattended: c.unattended,
        output: c.output.clone(),
        transport: c.transport.map(|t| t.as_str().to_string()),
    }
}

/// The output plan of a session with `config` (none for a chat agent): what its requests
/// carry and whether its prefix documents the schema.
pub fn output_plan(config: &AgentConfig, caps: &Caps) -> Option<output::Plan> {
    let (out, transport) = (config.output.as_ref()?, config.transport?);
    // Checked when the session was made; a schema that stopped compiling (a newer
    // validator) leaves the session without a plan, and its answers are then refused.
    let compiled = output::compile(out).ok()?;
    Some(compiled.plan_for(transport, caps))
}

/// What a session's creator asked for (`req`, its title aside), over the hub's defaults,
/// on a model server that can enforce `caps`; `Err` says what is wrong.
pub fn config(
    defaults: &AgentDefaults,
    caps: &Caps,
    req: CreateSession,
) -> Result<AgentConfig, String> {
    let CreateSession {
        instructions,
        examples,
        max_tokens,
        stop,
        policy,
        unattended,
        output,
        ..
    } = req;
    let mut instructions = instructions
        .filter(|s| !s.trim().is_empty())
        .or_else(|| defaults.instructions.clone())
        .unwrap_or_else(|| DEFAULT_INSTRUCTIONS.to_string());
    if instructions.len() > MAX_INSTRUCTIONS_BYTES {
        return Err(format!(
            "instructions are {} bytes, over the cap of {MAX_INSTRUCTIONS_BYTES}; shorten them",
            instructions.len()
        ));
    }
    let raw = examples.unwrap_or_default();
    if raw.len() > MAX_EXAMPLES {
        return Err(format!(
            "examples holds {} messages, over the cap of {MAX_EXAMPLES}",
            raw.len()
        ));
    }
    let mut parsed = Vec::with_capacity(raw.len());
    for (i, v) in raw.into_iter().enumerate() {
        let m: ChatMessage = serde_json::from_value(v).map_err(|e| {
            format!("examples[{i}] is not an OpenAI chat message with text content ({e})")
        })?;
        if m.role == Role::System {
            return Err(format!(
                "examples[{i}] is a system message; put that text in instructions"
            ));
        }
        parsed.push(m);
    }
    if max_tokens == Some(0) {
        return Err("maxTokens must be above 0".into());
    }
    let stop = super::rules::merged(stop.unwrap_or_default(), defaults.stop);
    if stop.steps == Some(0) || stop.repeated_calls == Some(0) {
        return Err("stop.steps and stop.repeatedCalls must be above 0".into());
    }
    let policy = super::gate::resolve(policy, defaults.policy.clone())?;
    // The built-in instructions speak of waits only to a session that can arm one.
    let shown = tools::Shown::of(&policy);
    if instructions == DEFAULT_INSTRUCTIONS
        && !shown
            .names()
            .iter()
            .any(|t| t == "wait_create" || t.starts_with("device_wait_"))
    {
        instructions = crate::session_state::DEFAULT_INSTRUCTIONS_WITHOUT_WAITS.to_string();
    }
    let transport = match &output {
        Some(o) => {
            let compiled = output::compile(o).map_err(|e| e.to_string())?;
            let has_tools = !super::gate::shown_specs(&policy).is_empty();
            Some(compiled.plan(caps, has_tools).transport)
        }
        None => None,
    };
    Ok(AgentConfig {
        instructions,
        examples: parsed,
        max_tokens: max_tokens.or(defaults.max_tokens),
        stop,
        policy,
        unattended: unattended.or(defaults.unattended).unwrap_or(false),
        output,
        transport,
    })
}

/// A `spawn` monitor's sessions: the spawning session's configuration (`parent`, when it
/// has one) with `instructions`, else the hub's defaults with them; and their prefix.
pub fn spawned(
    defaults: &AgentDefaults,
    caps: &Caps,
    parent: Option<AgentConfig>,
    instructions: &str,
) -> Result<(AgentConfig, Vec<ChatMessage>), String> {
    if instructions.trim().is_empty() {
        return Err("spawn.instructions is empty; say what each new session is for".into());
    }
    if instructions.len() > MAX_INSTRUCTIONS_BYTES {
        return Err(format!(
            "spawn.instructions are {} bytes, over the cap of {MAX_INSTRUCTIONS_BYTES}; shorten them",
            instructions.len()
        ));
    }
    let config = match parent {
        Some(p) => AgentConfig {
            instructions: instructions.to_string(),
            ..p
        },
        None => config(
            defaults,
            caps,
            CreateSession {
                instructions: Some(instructions.to_string()),
                ..CreateSession::default()
            },
        )?,
    };
    let prefix = build(&config, caps);
    Ok((config, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn asked(
        instructions: Option<&str>,
        examples: Option<Vec<serde_json::Value>>,
        max_tokens: Option<u32>,
    ) -> CreateSession {
        CreateSession {
            instructions: instructions.map(str::to_string),
            examples,
            max_tokens,
            ..CreateSession::default()
        }
    }

    #[test]
    fn the_prefix_is_instructions_guides_then_the_example() {
        let d = AgentDefaults::default();
        let c = config(&d, &Caps::default(),
            asked(
                Some("Be brief."),
                Some(vec![
                    json!({"role": "user", "content": "wait for my job"}),
                    json!({"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "wait_create", "arguments": "{}"}}]}),
                    json!({"role": "tool", "tool_call_id": "c1", "content": "{}"}),
                ]),
                None,
            ),
        )
        .expect("valid");
        let p = build(&c, &Caps::default());
        assert_eq!(p.len(), 4);
        let sys = p[0].content.as_deref().unwrap_or_default();
        assert!(sys.starts_with("Be brief.\n\nTOOL GUIDES"), "{sys}");
        assert_eq!(p[2].tool_calls[0].function.name, "wait_create");
        // Built twice, the same bytes.
        assert_eq!(
            serde_json::to_string(&build(&c, &Caps::default())).expect("json"),
            serde_json::to_string(&p).expect("json")
        );
    }

    /// The prefix's guides are assembled from the tools the session's policy shows, and
    /// "no tools" has one form: an empty allow list.
    #[test]
    fn the_prefix_guides_only_the_tools_shown() {
        let d = AgentDefaults::default();
        let with = |policy: Policy| {
            let c = config(
                &d,
                &Caps::default(),
                CreateSession {
                    policy: Some(policy),
                    ..CreateSession::default()
                },
            );
            c.map(|c| {
                build(&c, &Caps::default())[0]
                    .content
                    .clone()
                    .unwrap_or_default()
            })
        };
        let open = with(Policy::default()).expect("valid");
        assert!(
            open.contains("call devices, then device_wait_pid"),
            "{open}"
        );
        let no_devices = with(Policy {
            deny: Some(vec!["devices".into()]),
            ..Policy::default()
        })
        .expect("valid");
        assert!(!no_devices.contains("devices,"), "{no_devices}");
        assert!(no_devices.contains("call device_wait_pid"), "{no_devices}");
        let none = with(Policy {
            allow: Some(Vec::new()),
            ..Policy::default()
        })
        .expect("an empty allow list: no tools");
        assert!(none.contains("You have no tools"), "{none}");
        assert!(!none.contains("wait_create"), "{none}");
        // Nor do the built-in instructions speak of waits it cannot arm.
        assert!(!none.contains("waitpoint or a device wait"), "{none}");
        assert!(open.contains("waitpoint or a device wait"), "{open}");
        let e = with(Policy {
            allow: Some(vec![String::new()]),
            ..Policy::default()
        })
        .expect_err("an empty name");
        assert!(
            e.contains("\"allow\": []") && e.contains("--allow ''"),
            "{e}"
        );
    }

    #[test]
    fn defaults_and_refusals() {
        let d = AgentDefaults {
            max_tokens: Some(256),
            ..AgentDefaults::default()
        };
        let c = config(&d, &Caps::default(), CreateSession::default()).expect("defaults");
        assert_eq!(c.instructions, DEFAULT_INSTRUCTIONS);
        assert_eq!(c.max_tokens, Some(256));
        assert!(!c.unattended);
        assert_eq!(
            c.policy.require_approval.as_deref(),
            Some(&["device_exec".to_string()][..]),
            "starting a command on a device asks a person unless a policy says otherwise"
        );
        let system = Some(vec![json!({"role": "system", "content": "x"})]);
        assert!(config(&d, &Caps::default(), asked(None, system, None)).is_err());
        let no_role = Some(vec![json!({"content": "no role"})]);
        assert!(config(&d, &Caps::default(), asked(None, no_role, None)).is_err());
        assert!(config(&d, &Caps::default(), asked(None, None, Some(0))).is_err());
        let long = "x".repeat(MAX_INSTRUCTIONS_BYTES + 1);
        assert!(config(&d, &Caps::default(), asked(Some(&long), None, None)).is_err());
        let unknown_tool = CreateSession {
            policy: Some(Policy {
                deny: Some(vec!["rm_rf".into()]),
                ..Policy::default()
            }),
            ..CreateSession::default()
        };
        let e =
            config(&d, &Caps::default(), unknown_tool).expect_err("an unknown tool in a policy");
        assert!(e.contains("rm_rf"), "{e}");
    }

    /// The transport is chosen when the session is made, and the OUTPUT SCHEMA goes in the
    /// prefix only when the transport leaves the schema to the prompt: (endpoint, schema,
    /// strategy, transport, documented).
    #[test]
    fn the_output_schema_is_documented_when_the_transport_needs_it() {
        use crate::model::Endpoint;
        use cortex_protocol::api::{OutputConfig, OutputStrategy, OutputTransport};
        let small = json!({"type": "object", "properties": {"ok": {"type": "boolean"}},
            "required": ["ok"], "additionalProperties": false});
        let open = json!({"type": "object", "additionalProperties": {"type": "string"}});
        let d = AgentDefaults::default();
        let cases = [
            (
                Endpoint::Other,
                &small,
                OutputStrategy::Auto,
                OutputTransport::Respond,
                false,
            ),
            (
                Endpoint::Other,
                &open,
                OutputStrategy::Auto,
                OutputTransport::Emit,
                true,
            ),
            (
                Endpoint::Groq,
                &small,
                OutputStrategy::Auto,
                OutputTransport::Emit,
                true,
            ),
            (
                Endpoint::Groq,
                &small,
                OutputStrategy::Respond,
                OutputTransport::Respond,
                true,
            ),
            (
                Endpoint::OpenAi,
                &small,
                OutputStrategy::Auto,
                OutputTransport::Native,
                false,
            ),
            (
                Endpoint::Other,
                &small,
                OutputStrategy::Emit,
                OutputTransport::Emit,
                true,
            ),
        ];
        for (endpoint, schema, strategy, transport, documented) in cases {
            let caps = endpoint.caps();
            let req = CreateSession {
                output: Some(OutputConfig {
                    schema: schema.clone(),
                    strategy,
                    force_tool: false,
                    doc: None,
                }),
                ..CreateSession::default()
            };
            let c = config(&d, &caps, req).expect("config");
            assert_eq!(c.transport, Some(transport), "{endpoint:?} {strategy:?}");
            let system = build(&c, &caps)[0].content.clone().unwrap_or_default();
            assert_eq!(
                system.contains("OUTPUT SCHEMA"),
                documented,
                "{endpoint:?} {strategy:?}: {system}"
            );
        }
        // A chat agent has no transport and no schema documentation.
        let chat = config(&d, &Caps::default(), CreateSession::default()).expect("config");
        assert_eq!(chat.transport, None);
        let system = build(&chat, &Caps::default())[0]
            .content
            .clone()
            .unwrap_or_default();
        assert!(!system.contains("OUTPUT SCHEMA"));
    }
}
