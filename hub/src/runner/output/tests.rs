use serde_json::json;

use super::*;

fn config(v: Value) -> OutputConfig {
    serde_json::from_value(v).expect("parse")
}

fn small() -> Value {
    json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false})
}

fn open() -> Value {
    json!({"type": "object", "properties": {"items": {"type": "array"}}, "required": ["items"]})
}

#[test]
fn the_config_reads_as_the_api_takes_it() {
    let c =
        config(json!({"schema": small(), "strategy": "respond", "forceTool": true, "doc": "off"}));
    assert_eq!(c.strategy, Strategy::Respond);
    assert!(c.force_tool);
    assert_eq!(c.doc.as_deref(), Some("off"));
    let d = config(json!({"schema": small()}));
    assert_eq!(
        (d.strategy, d.force_tool, d.doc),
        (Strategy::Auto, false, None)
    );
    assert!(
        serde_json::from_value::<OutputConfig>(json!({"schema": {}, "strategy": "grammar"}))
            .is_err()
    );
    let round = serde_json::to_value(&c).expect("encode");
    assert_eq!(round["forceTool"], true);
}

/// (config, accepted, words the error must hold).
#[test]
fn validate_refuses_what_cannot_run() {
    let cases = [
        (json!({"schema": small()}), None),
        (json!({"schema": true}), None),
        (
            json!({"schema": {"type": "bogus"}}),
            Some("output.schema is not a usable JSON Schema"),
        ),
        (json!({"schema": 5}), Some("output.schema")),
        (
            json!({"schema": {"$ref": "https://example.com/s.json"}}),
            Some("output.schema"),
        ),
        (
            json!({"schema": small(), "strategy": "emit", "forceTool": true}),
            Some("\"emit\""),
        ),
        (
            json!({"schema": small(), "strategy": "native", "forceTool": true}),
            Some("\"native\""),
        ),
        (
            json!({"schema": small(), "strategy": "respond", "forceTool": true}),
            None,
        ),
    ];
    for (v, want) in cases {
        let got = validate(&config(v.clone()));
        match (got, want) {
            (Ok(()), None) => {}
            (Err(e), Some(word)) => assert!(e.to_string().contains(word), "{v}: {e}"),
            (got, want) => panic!("{v}: got {got:?}, want {want:?}"),
        }
    }
}

/// What a session gets on each kind of endpoint: (output, endpoint, transport, respond
/// params, doc injected, response_format sent).
#[test]
fn plans_per_endpoint_and_schema() {
    let strict = compile(&config(json!({"schema": small()}))).expect("compile");
    let loose = compile(&config(json!({"schema": open()}))).expect("compile");
    let chat = Output::chat();
    let cases = [
        (
            &strict,
            Endpoint::OpenAi,
            Transport::Native,
            None,
            false,
            true,
        ),
        (
            &strict,
            Endpoint::LlamaCpp,
            Transport::Respond,
            Some(Params::Strict),
            false,
            false,
        ),
        (&strict, Endpoint::Groq, Transport::Emit, None, true, false),
        (&loose, Endpoint::OpenAi, Transport::Emit, None, true, false),
        (&loose, Endpoint::Vllm, Transport::Emit, None, true, false),
        (
            &chat,
            Endpoint::Ollama,
            Transport::Respond,
            Some(Params::Strict),
            false,
            false,
        ),
        (&chat, Endpoint::Groq, Transport::Emit, None, true, false),
    ];
    for (output, endpoint, transport, params, doc, format) in cases {
        let plan = output.plan(&endpoint.caps(), true);
        assert_eq!(plan.transport, transport, "{endpoint:?}");
        assert_eq!(
            plan.respond.as_ref().map(|r| r.params),
            params,
            "{endpoint:?}"
        );
        assert_eq!(plan.doc.is_some(), doc, "{endpoint:?}");
        assert_eq!(plan.response_format.is_some(), format, "{endpoint:?}");
        assert!(!plan.tool_choice_required);
    }
}

#[test]
fn explicit_respond_with_a_large_schema_goes_loose_with_the_doc() {
    let out = compile(&config(
        json!({"schema": open(), "strategy": "respond", "forceTool": true}),
    ))
    .expect("compile");
    let plan = out.plan(&Endpoint::Other.caps(), true);
    assert_eq!(plan.transport, Transport::Respond);
    assert_eq!(plan.respond.as_ref().map(|r| r.params), Some(Params::Loose));
    assert!(plan.tool_choice_required);
    let doc = plan.doc.expect("doc");
    assert!(
        doc.starts_with("OUTPUT SCHEMA\n") && doc.contains("calling `respond` alone"),
        "{doc}"
    );
}

#[test]
fn the_doc_setting_turns_it_off_or_replaces_it() {
    let caps = Endpoint::Groq.caps();
    let off = compile(&config(json!({"schema": open(), "doc": "off"}))).expect("compile");
    assert_eq!(off.plan(&caps, true).doc, None);
    let own = compile(&config(
        json!({"schema": open(), "doc": "Answer with a Nova screen."}),
    ))
    .expect("compile");
    assert_eq!(
        own.plan(&caps, true).doc.as_deref(),
        Some("Answer with a Nova screen.")
    );
}

#[test]
fn native_sends_the_strict_envelope_when_it_fits() {
    let strict = compile(&config(json!({"schema": small()}))).expect("compile");
    let rf = strict.response_format();
    assert_eq!(rf["type"], "json_schema");
    assert_eq!(rf["json_schema"]["strict"], true);
    assert_eq!(
        rf["json_schema"]["schema"]["required"],
        json!(["response", "data", "reasoning"])
    );
    let forced =
        compile(&config(json!({"schema": open(), "strategy": "native"}))).expect("compile");
    let rf = forced.response_format();
    assert_eq!(rf["json_schema"]["strict"], false);
    assert_eq!(rf["json_schema"]["schema"]["required"], json!(["data"]));
}

#[test]
fn a_compiled_output_judges_answers() {
    let out = compile(&config(json!({"schema": small()}))).expect("compile");
    assert_eq!(out.schema(), Some(&small()));
    let ok = out.judge_text("```json\n{\"data\": {\"ok\": true}, \"response\": \"yes\"}\n```");
    assert!(
        matches!(
            ok,
            Verdict::Accepted {
                unwrapped: false,
                ..
            }
        ),
        "{ok:?}"
    );
    let bare = out.judge_text("{\"ok\": false}");
    assert!(
        matches!(
            bare,
            Verdict::Accepted {
                unwrapped: true,
                ..
            }
        ),
        "{bare:?}"
    );
    let refused = out.judge_text("{\"data\": {\"ok\": \"yes\"}}");
    let Verdict::Refused { issues, .. } = refused else {
        panic!("{refused:?}")
    };
    let text = correct::refused(&issues, Transport::Emit);
    assert!(text.contains("at /data/ok:"), "{text}");
    assert_eq!(
        out.judge_text("I am done."),
        Verdict::NoEnvelope { syntax: None }
    );
    assert!(
        out.validate_envelope(&json!({"ok": false})).is_err(),
        "no unwrap rung here"
    );
}

fn call(id: &str, name: &str, args: &str) -> crate::model::ToolCall {
    crate::model::ToolCall {
        id: id.into(),
        kind: "function".into(),
        function: crate::model::FunctionCall {
            name: name.into(),
            arguments: args.into(),
        },
    }
}

/// What a finished turn comes to, per session kind and transport: (output, transport,
/// text, calls, the calls that run, the call that carried the answer, the verdict's kind).
#[test]
fn a_turn_is_judged_by_its_transport() {
    let typed = compile(&config(json!({"schema": small()}))).expect("compile");
    let chat = Output::chat();
    let good = r#"{"data": {"ok": true}}"#;
    let w = call("c1", "wait_check", "{}");
    let r = call("c2", RESPOND, good);
    #[derive(Debug, PartialEq)]
    enum Kind {
        Calls(Vec<&'static str>, usize),
        Accepted(Option<&'static str>),
        Refused(Option<&'static str>),
        NoEnvelope(Option<&'static str>),
    }
    use Transport::*;
    let cases: Vec<(&Output, Transport, &str, Vec<crate::model::ToolCall>, Kind)> = vec![
        // A chat agent: its text is the answer; tool calls run.
        (&chat, Emit, "Hello.", vec![], Kind::Accepted(None)),
        (&chat, Emit, "", vec![w.clone()], Kind::Calls(vec!["c1"], 0)),
        // respond: alone it answers; beside others it is dropped; none: the text is judged.
        (
            &typed,
            Respond,
            "",
            vec![r.clone()],
            Kind::Accepted(Some("c2")),
        ),
        (
            &typed,
            Respond,
            "",
            vec![w.clone(), r.clone()],
            Kind::Calls(vec!["c1"], 1),
        ),
        (&typed, Respond, good, vec![], Kind::Accepted(None)),
        (&typed, Respond, "thinking…", vec![], Kind::NoEnvelope(None)),
        (
            &typed,
            Respond,
            "",
            vec![call("c3", RESPOND, r#"{"data": {"ok": 1}}"#)],
            Kind::Refused(Some("c3")),
        ),
        // emit and native: a call named respond is no exit there, the text is.
        (
            &typed,
            Emit,
            "",
            vec![r.clone()],
            Kind::Calls(vec!["c2"], 0),
        ),
        (&typed, Emit, good, vec![], Kind::Accepted(None)),
        (
            &typed,
            Native,
            "{\"data\": {}}",
            vec![],
            Kind::Refused(None),
        ),
        (&typed, Native, "no", vec![], Kind::NoEnvelope(None)),
    ];
    for (out, transport, text, calls, want) in cases {
        let got = match out.judge_turn(transport, text, calls.clone()) {
            Judged::Calls { run, dropped } => Kind::Calls(
                run.iter()
                    .map(|c| match c.id.as_str() {
                        "c1" => "c1",
                        "c2" => "c2",
                        _ => "other",
                    })
                    .collect(),
                dropped,
            ),
            Judged::Answer { verdict, via } => {
                let via = via.map(|c| match c.id.as_str() {
                    "c2" => "c2",
                    "c3" => "c3",
                    _ => "other",
                });
                match verdict {
                    Verdict::Accepted { .. } => Kind::Accepted(via),
                    Verdict::Refused { .. } => Kind::Refused(via),
                    Verdict::NoEnvelope { .. } => Kind::NoEnvelope(via),
                }
            }
        };
        assert_eq!(got, want, "{transport:?} {text:?} {calls:?}");
    }
}

#[test]
fn a_refused_answer_is_kept_as_the_last_output() {
    assert_eq!(
        last_output(&json!({"data": {"ok": 1}, "response": "r"})),
        Envelope {
            response: Some("r".into()),
            data: Some(json!({"ok": 1})),
            reasoning: None,
        }
    );
    // Not an envelope (another key, or a field of the wrong type): all of it as data.
    for v in [json!({"ok": 1, "x": 2}), json!({"response": 5}), json!([1])] {
        assert_eq!(
            last_output(&v),
            Envelope {
                data: Some(v.clone()),
                ..Envelope::default()
            }
        );
    }
}
