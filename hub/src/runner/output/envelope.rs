//! The envelope every run ends in (`{response?, data, reasoning?}`): its JSON Schema built
//! from a session's data schema, and the judgement every transport's answer goes through
//! (envelope first, then the unwrap rung).

use jsonschema::Validator;
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::emit;

/// The envelope's human-facing text.
pub const RESPONSE: &str = "response";
/// The envelope's schema-typed payload.
pub const DATA: &str = "data";
/// The envelope's model-authored justification.
pub const REASONING: &str = "reasoning";

/// A longer validator message is cut here: an issue quotes the value it refused, and a
/// model reads a short issue better than a copy of its own answer.
const ISSUE_MESSAGE_MAX: usize = 300;

/// The key of the probe that decides the unwrap rung: a name no real schema declares.
const UNKNOWN_KEY: &str = "__unknown_key__";

/// A run's answer. `data` is absent for a chat agent (a session without a schema).
pub use cortex_protocol::api::Envelope;

/// One thing the validator refused: where (a JSON pointer into the answer; empty for the
/// whole answer) and why, worded for the model that has to fix it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Issue {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for Issue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            write!(f, "the answer as a whole: {}", self.message)
        } else {
            write!(f, "at {}: {}", self.path, self.message)
        }
    }
}

/// What an answer came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// A valid envelope: the run ends with it. `unwrapped` when it was a bare payload
    /// taken as `{data}` (the unwrap rung).
    Accepted { envelope: Envelope, unwrapped: bool },
    /// An answer that parsed and was refused: it counts against `outputRetries`.
    Refused { issues: Vec<Issue>, output: Value },
    /// No JSON object in the turn (prose, or JSON broken past repair): a correction that
    /// does not count against `outputRetries`. `syntax` is the parse error of text that
    /// started as JSON, when there was some.
    NoEnvelope { syntax: Option<String> },
}

/// The envelope's schema as the model is told it: `response` and `reasoning` optional
/// strings, `data` the session's schema and required; without a data schema (a chat
/// agent) `response` is required and there is no `data`. No other keys. The data
/// schema's `$defs`/`definitions` move to the root, so its `#/$defs/..` refs still
/// resolve.
pub fn envelope_schema(data: Option<&Value>) -> Value {
    build(data, false)
}

/// The same envelope in the form OpenAI-style strict mode needs (every property listed
/// in `required`): the optional fields are required but nullable, and a `null` one reads
/// as absent.
pub fn strict_envelope_schema(data: Option<&Value>) -> Value {
    build(data, true)
}

fn build(data: Option<&Value>, strict: bool) -> Value {
    let text = |description: &str, optional: bool| {
        let ty = if optional && strict {
            json!(["string", "null"])
        } else {
            json!("string")
        };
        json!({"type": ty, "description": description})
    };
    let mut props = Map::new();
    let mut root = Map::new();
    let required: Vec<&str> = match data {
        Some(schema) => {
            props.insert(RESPONSE.into(), text(RESPONSE_HELP, true));
            let (inner, defs) = hoisted(schema);
            props.insert(DATA.into(), inner);
            root.extend(defs);
            if strict {
                vec![RESPONSE, DATA, REASONING]
            } else {
                vec![DATA]
            }
        }
        None => {
            props.insert(RESPONSE.into(), text(RESPONSE_HELP, false));
            if strict {
                vec![RESPONSE, REASONING]
            } else {
                vec![RESPONSE]
            }
        }
    };
    props.insert(REASONING.into(), text(REASONING_HELP, true));
    root.insert("type".into(), json!("object"));
    root.insert("properties".into(), Value::Object(props));
    root.insert("required".into(), json!(required));
    root.insert("additionalProperties".into(), json!(false));
    Value::Object(root)
}

/// What `response` is for, in the schema and its documentation.
pub const RESPONSE_HELP: &str = "text for the person who asked";
/// What `reasoning` is for, in the schema and its documentation.
pub const REASONING_HELP: &str = "why you answered this way, in a sentence or two";

/// The data schema without its definitions, and the definitions to put at the root.
fn hoisted(schema: &Value) -> (Value, Map<String, Value>) {
    let mut inner = schema.clone();
    let mut defs = Map::new();
    if let Some(obj) = inner.as_object_mut() {
        for key in ["$defs", "definitions"] {
            if let Some(d) = obj.remove(key) {
                defs.insert(key.into(), d);
            }
        }
        // A `$schema` means nothing below the root.
        obj.remove("$schema");
    }
    (inner, defs)
}

/// The compiled checks of one session's output: the envelope's shape, the data schema,
/// and whether the unwrap rung may be taken.
#[derive(Debug, Clone)]
pub struct Checker {
    shell: Validator,
    data: Option<Validator>,
    unwrap: bool,
}

impl Checker {
    /// Compiles the checks; `Err` is the validator's word on a data schema it cannot use.
    pub fn new(data: Option<&Value>) -> Result<Checker, String> {
        let data = data.map(compile).transpose()?;
        let shell = compile(&shell_schema(data.is_some()))?;
        let unwrap = data.as_ref().is_some_and(refuses_unknown_key);
        Ok(Checker {
            shell,
            data,
            unwrap,
        })
    }

    /// Whether a bare payload may be taken as `{data}` (see [`Checker::judge`]).
    pub fn unwrap_allowed(&self) -> bool {
        self.unwrap
    }

    /// The envelope in `value`, or every issue the validators found. The shape is
    /// checked first; the data schema only once the shape holds.
    pub fn validate_envelope(&self, value: &Value) -> Result<Envelope, Vec<Issue>> {
        let mut found = issues(&self.shell, value, "");
        if !found.is_empty() {
            return Err(found);
        }
        let data = value.get(DATA);
        if let (Some(v), Some(d)) = (&self.data, data) {
            found = issues(v, d, "/data");
            if !found.is_empty() {
                return Err(found);
            }
        }
        let text = |k: &str| value.get(k).and_then(Value::as_str).map(str::to_owned);
        Ok(Envelope {
            response: text(RESPONSE),
            data: data.cloned(),
            reasoning: text(REASONING),
        })
    }

    /// Judges a parsed answer. Envelope first: a valid envelope is accepted as it is.
    /// Then the unwrap rung: an answer that is not a plausible envelope (an object whose
    /// keys are not all envelope fields) but validates cleanly against the data schema
    /// is accepted as `{data: <answer>}` — only when the data schema refuses an object
    /// holding one unknown key; a schema that accepts such an object cannot tell a bare
    /// payload from an envelope with a misspelt key, so the answer is judged as an
    /// envelope. Anything else is refused with the envelope's issues.
    pub fn judge(&self, value: &Value) -> Verdict {
        let refused = match self.validate_envelope(value) {
            Ok(envelope) => {
                return Verdict::Accepted {
                    envelope,
                    unwrapped: false,
                };
            }
            Err(issues) => issues,
        };
        if let Some(data) = &self.data
            && self.unwrap
            && !plausible_envelope(value)
            && data.is_valid(value)
        {
            let envelope = Envelope {
                data: Some(value.clone()),
                ..Envelope::default()
            };
            return Verdict::Accepted {
                envelope,
                unwrapped: true,
            };
        }
        Verdict::Refused {
            issues: refused,
            output: value.clone(),
        }
    }

    /// Judges a turn's text (a completion, or a `respond` call's arguments): the first
    /// complete JSON object in it (fence-tolerant), judged as [`Checker::judge`] does.
    pub fn judge_text(&self, text: &str) -> Verdict {
        match emit::first_object(text) {
            Ok(value) => self.judge(&value),
            Err(none) => Verdict::NoEnvelope {
                syntax: none.syntax,
            },
        }
    }
}

/// A refused answer kept as a run's last output: its envelope fields where they have the
/// envelope's types (`response`, `reasoning` strings; `data` anything), else the whole
/// answer as `data`.
pub fn last_output(value: &Value) -> Envelope {
    let text = |k: &str| value.get(k).and_then(Value::as_str).map(str::to_owned);
    let typed = plausible_envelope(value)
        && [RESPONSE, REASONING]
            .iter()
            .all(|k| value.get(*k).is_none_or(Value::is_string));
    if typed {
        Envelope {
            response: text(RESPONSE),
            data: value.get(DATA).cloned(),
            reasoning: text(REASONING),
        }
    } else {
        Envelope {
            data: Some(value.clone()),
            ..Envelope::default()
        }
    }
}

/// An object whose keys are all envelope fields (and that has one).
pub fn plausible_envelope(value: &Value) -> bool {
    value.as_object().is_some_and(|o| {
        !o.is_empty()
            && o.keys()
                .all(|k| [RESPONSE, DATA, REASONING].contains(&k.as_str()))
    })
}

/// Whether the data schema refuses every object holding one unknown key (probed with a
/// string and with an object under that key: the values a misspelt `response` or `data`
/// would carry).
fn refuses_unknown_key(data: &Validator) -> bool {
    [json!("x"), json!({})]
        .into_iter()
        .all(|v| !data.is_valid(&json!({ UNKNOWN_KEY: v })))
}

/// The envelope's shape with any `data` (the data schema is checked on its own, so its
/// refs resolve against its own root). `null` optional text reads as absent.
fn shell_schema(with_data: bool) -> Value {
    let optional = json!({"type": ["string", "null"]});
    if with_data {
        json!({
            "type": "object",
            "properties": {RESPONSE: optional, DATA: true, REASONING: optional},
            "required": [DATA],
            "additionalProperties": false,
        })
    } else {
        json!({
            "type": "object",
            "properties": {RESPONSE: {"type": "string"}, REASONING: optional},
            "required": [RESPONSE],
            "additionalProperties": false,
        })
    }
}

fn compile(schema: &Value) -> Result<Validator, String> {
    jsonschema::validator_for(schema).map_err(|e| e.to_string())
}

fn issues(validator: &Validator, value: &Value, prefix: &str) -> Vec<Issue> {
    validator
        .iter_errors(value)
        .map(|e| Issue {
            path: format!("{prefix}{}", e.instance_path().as_str()),
            message: cut(&e.to_string(), ISSUE_MESSAGE_MAX),
        })
        .collect()
}

/// `text` cut to at most `max` bytes on a character boundary, with an ellipsis.
pub(super) fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn person() -> Value {
        json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
            "additionalProperties": false,
        })
    }

    #[test]
    fn the_envelope_schema_wraps_the_data_schema() {
        let s = envelope_schema(Some(&person()));
        assert_eq!(s["required"], json!(["data"]));
        assert_eq!(s["properties"]["data"], person());
        assert_eq!(s["properties"]["response"]["type"], "string");
        assert_eq!(s["additionalProperties"], false);
        let chat = envelope_schema(None);
        assert_eq!(chat["required"], json!(["response"]));
        assert!(chat["properties"].get("data").is_none());
        let strict = strict_envelope_schema(Some(&person()));
        assert_eq!(strict["required"], json!(["response", "data", "reasoning"]));
        assert_eq!(
            strict["properties"]["reasoning"]["type"],
            json!(["string", "null"])
        );
    }

    #[test]
    fn definitions_move_to_the_envelope_root_and_still_resolve() {
        let data = json!({
            "$defs": {"Id": {"type": "integer"}},
            "type": "object",
            "properties": {"id": {"$ref": "#/$defs/Id"}},
            "required": ["id"],
        });
        let s = envelope_schema(Some(&data));
        assert!(s["properties"]["data"].get("$defs").is_none());
        let v = jsonschema::validator_for(&s).expect("compiles");
        assert!(v.is_valid(&json!({"data": {"id": 3}})));
        assert!(!v.is_valid(&json!({"data": {"id": "3"}})));
    }

    #[test]
    fn envelopes_are_validated_with_readable_issues() {
        let c = Checker::new(Some(&person())).expect("compiles");
        let cases: &[(Value, Result<Envelope, &[&str]>)] = &[
            (
                json!({"data": {"name": "Ada", "age": 36}, "response": "found her"}),
                Ok(Envelope {
                    response: Some("found her".into()),
                    data: Some(json!({"name": "Ada", "age": 36})),
                    reasoning: None,
                }),
            ),
            (
                json!({"data": {"name": "Ada", "age": 36}, "response": null, "reasoning": null}),
                Ok(Envelope {
                    data: Some(json!({"name": "Ada", "age": 36})),
                    ..Envelope::default()
                }),
            ),
            (
                json!({"data": {"name": "Ada", "age": "36"}}),
                Err(&["/data/age"]),
            ),
            (json!({"data": {"name": "Ada"}}), Err(&["/data"])),
            (json!({"response": "hi"}), Err(&[""])),
            (
                json!({"data": {"name": "Ada", "age": 1}, "respnse": "x"}),
                Err(&[""]),
            ),
            (
                json!({"data": {"name": "Ada", "age": 1}, "response": 5}),
                Err(&["/response"]),
            ),
            (json!([1]), Err(&[""])),
        ];
        for (value, want) in cases {
            let got = c.validate_envelope(value);
            match (got, want) {
                (Ok(e), Ok(w)) => assert_eq!(&e, w, "{value}"),
                (Err(issues), Err(paths)) => {
                    let got: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
                    assert_eq!(&got, paths, "{value}: {issues:?}");
                    assert!(issues.iter().all(|i| !i.message.is_empty()));
                }
                (got, _) => panic!("{value}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn an_issue_names_where_and_why() {
        let c = Checker::new(Some(&person())).expect("compiles");
        let issues = c
            .validate_envelope(&json!({"data": {"name": "Ada", "age": "x"}}))
            .expect_err("refused");
        assert_eq!(
            issues[0].to_string(),
            r#"at /data/age: "x" is not of type "integer""#
        );
        let whole = Issue {
            path: String::new(),
            message: "m".into(),
        };
        assert_eq!(whole.to_string(), "the answer as a whole: m");
    }

    #[test]
    fn a_chat_agent_needs_a_response_and_has_no_data() {
        let c = Checker::new(None).expect("compiles");
        assert!(c.validate_envelope(&json!({"response": "hello"})).is_ok());
        assert!(
            c.validate_envelope(&json!({"response": "hi", "data": 1}))
                .is_err()
        );
        assert!(c.validate_envelope(&json!({"reasoning": "r"})).is_err());
        assert!(matches!(c.judge(&json!({"x": 1})), Verdict::Refused { .. }));
    }

    /// The unwrap rung, case by case: (data schema, answer, accepted as what).
    #[test]
    fn the_unwrap_rung_takes_a_bare_payload_only_when_the_schema_can_tell() {
        // A Nova-like action: its own `data` field collides with the envelope's.
        let action = json!({
            "type": "object",
            "properties": {"type": {"const": "show"}, "data": {"type": "object"}},
            "required": ["type", "data"],
            "additionalProperties": false,
        });
        let open = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let needs_a = json!({"type": "object", "required": ["a"]});
        type Case = (Value, Value, Option<(Value, bool)>);
        let cases: Vec<Case> = vec![
            // A bare payload under a strict schema: accepted as {data}.
            (
                action.clone(),
                json!({"type": "show", "data": {}}),
                Some((json!({"type": "show", "data": {}}), true)),
            ),
            // The envelope itself: taken as an envelope first.
            (
                action.clone(),
                json!({"data": {"type": "show", "data": {}}}),
                Some((json!({"type": "show", "data": {}}), false)),
            ),
            // A plausible envelope whose data is wrong is refused, not unwrapped.
            (action.clone(), json!({"data": {"x": 1}}), None),
            // Not the payload either: refused.
            (action.clone(), json!({"type": "hide", "data": {}}), None),
            // An open schema accepts an object with one unknown key: no unwrap.
            (open.clone(), json!({"a": 1}), None),
            // Refuses {unknown: ..} only because `a` is missing: still refuses, so unwrap.
            (
                needs_a,
                json!({"a": 1, "b": 2}),
                Some((json!({"a": 1, "b": 2}), true)),
            ),
        ];
        for (schema, answer, want) in cases {
            let c = Checker::new(Some(&schema)).expect("compiles");
            match (c.judge(&answer), want) {
                (
                    Verdict::Accepted {
                        envelope,
                        unwrapped,
                    },
                    Some((data, u)),
                ) => {
                    assert_eq!(envelope.data, Some(data), "{answer}");
                    assert_eq!(unwrapped, u, "{answer}");
                }
                (Verdict::Refused { output, .. }, None) => assert_eq!(output, answer),
                (got, want) => panic!("{schema} {answer}: got {got:?}, want {want:?}"),
            }
        }
        assert!(
            !Checker::new(Some(&open))
                .expect("compiles")
                .unwrap_allowed()
        );
        assert!(
            Checker::new(Some(&action))
                .expect("compiles")
                .unwrap_allowed()
        );
    }

    #[test]
    fn text_turns_are_judged_through_the_fence_tolerant_parse() {
        let c = Checker::new(None).expect("compiles");
        let fenced = "Here you go:\n```json\n{\"response\": \"done\"}\n```\nbye";
        assert!(matches!(c.judge_text(fenced), Verdict::Accepted { .. }));
        assert_eq!(
            c.judge_text("just prose"),
            Verdict::NoEnvelope { syntax: None }
        );
        assert!(matches!(
            c.judge_text("{\"response\": \"cut"),
            Verdict::NoEnvelope { syntax: Some(_) }
        ));
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        assert_eq!(cut("abc", 5), "abc");
        assert_eq!(cut("ééé", 3), "é…");
    }
}
