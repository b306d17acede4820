//! Schema documentation: the OUTPUT SCHEMA chunk rendered from the same schema that
//! validates (so the two cannot drift), as a compact outline a model reads. Deterministic:
//! the same schema gives the same bytes, because it goes in the cached prefix.

use std::fmt::Write as _;

use serde_json::{Map, Value};

use super::envelope::{DATA, REASONING, REASONING_HELP, RESPONSE, RESPONSE_HELP};
use super::respond::RESPOND;
use super::transport::Transport;

/// Enum values listed before the rest are summarised.
const ENUM_SHOWN: usize = 30;

/// The OUTPUT SCHEMA chunk for a session: the envelope's fields with the data schema's
/// outline under `data` (fields, types, required or optional, enums, constraints,
/// descriptions; `$ref`s by name with the definitions listed once at the end), then how
/// to deliver the answer on `transport`.
pub fn schema_doc(data: Option<&Value>, transport: Transport) -> String {
    let mut out =
        String::from("OUTPUT SCHEMA\nWhen you are done, your answer is one JSON object:\n");
    match data {
        Some(schema) => {
            line(
                &mut out,
                0,
                RESPONSE,
                "string, optional",
                Some(RESPONSE_HELP),
            );
            field(&mut out, 0, DATA, schema, true);
        }
        None => line(
            &mut out,
            0,
            RESPONSE,
            "string, required",
            Some(RESPONSE_HELP),
        ),
    }
    line(
        &mut out,
        0,
        REASONING,
        "string, optional",
        Some(REASONING_HELP),
    );
    if let Some(schema) = data {
        definitions(&mut out, schema);
    }
    match transport {
        Transport::Respond => {
            let _ = writeln!(
                out,
                "Finish by calling `{RESPOND}` alone (no other tool call in the same turn) with \
                 this object as its arguments, or by replying with only this JSON object."
            );
        }
        Transport::Emit | Transport::Native => {
            out.push_str(
                "Finish by replying with only this JSON object: no text before or after it.\n",
            );
        }
    }
    out
}

/// One outline line: `- name (kind): description`.
fn line(out: &mut String, depth: usize, name: &str, kind: &str, description: Option<&str>) {
    let _ = write!(out, "{:indent$}- {name} ({kind})", "", indent = depth * 2);
    if let Some(d) = description.filter(|d| !d.is_empty()) {
        let _ = write!(out, ": {}", d.replace('\n', " "));
    }
    out.push('\n');
}

/// A field and, below it, what it holds.
fn field(out: &mut String, depth: usize, name: &str, schema: &Value, required: bool) {
    let mut kind = kind(schema);
    kind.push_str(if required { ", required" } else { ", optional" });
    kind.push_str(&constraints(schema));
    line(out, depth, name, &kind, description(schema));
    children(out, depth + 1, schema);
}

/// The fields of an object (or of an array's items), and the shapes of an `anyOf`.
fn children(out: &mut String, depth: usize, schema: &Value) {
    let Some(obj) = schema.as_object() else {
        return;
    };
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        let required = required(obj);
        for (name, prop) in props {
            field(out, depth, name, prop, required.contains(&name.as_str()));
        }
    }
    if let Some(items) = obj.get("items").filter(|i| i.is_object()) {
        children(out, depth, items);
    }
    for key in ["anyOf", "oneOf"] {
        for (i, shape) in obj
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let mut kind = kind(shape);
            kind.push_str(&constraints(shape));
            line(
                out,
                depth,
                &format!("shape {}", i + 1),
                &kind,
                description(shape),
            );
            children(out, depth + 1, shape);
        }
    }
}

/// What a schema holds, in a few words: `string`, `integer or null`, `array of Item`,
/// `one of 3 shapes`, `map of string to number`, `any`.
fn kind(schema: &Value) -> String {
    let Some(obj) = schema.as_object() else {
        return if schema == &Value::Bool(false) {
            "nothing".into()
        } else {
            "any".into()
        };
    };
    if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
        return ref_name(r).to_owned();
    }
    if let Some(c) = obj.get("const") {
        return format!("exactly {c}");
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(shapes) = obj.get(key).and_then(Value::as_array) {
            return format!("one of {} shapes", shapes.len());
        }
    }
    let types: Vec<&str> = match obj.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ if obj.contains_key("properties") => vec!["object"],
        _ if obj.contains_key("enum") => vec![],
        _ => return "any".into(),
    };
    let words: Vec<String> = types.iter().map(|t| type_word(t, obj)).collect();
    if words.is_empty() {
        "value".into()
    } else {
        words.join(" or ")
    }
}

fn type_word(ty: &str, obj: &Map<String, Value>) -> String {
    match ty {
        "array" => match obj.get("items") {
            Some(items @ Value::Object(_)) => format!("array of {}", kind(items)),
            _ => "array".into(),
        },
        "object" if !obj.contains_key("properties") => match obj.get("additionalProperties") {
            Some(v @ Value::Object(_)) => format!("map of string to {}", kind(v)),
            _ => "object".into(),
        },
        other => other.to_owned(),
    }
}

/// `, one of "a", "b"`, `, at least 1`, `, format date-time`, ... in a fixed order.
fn constraints(schema: &Value) -> String {
    let mut out = String::new();
    let Some(obj) = schema.as_object() else {
        return out;
    };
    if let Some(values) = obj.get("enum").and_then(Value::as_array) {
        let shown: Vec<String> = values
            .iter()
            .take(ENUM_SHOWN)
            .map(Value::to_string)
            .collect();
        let _ = write!(out, ", one of {}", shown.join(", "));
        if values.len() > ENUM_SHOWN {
            let _ = write!(out, " and {} more", values.len() - ENUM_SHOWN);
        }
    }
    for (key, word) in [
        ("minimum", "at least"),
        ("exclusiveMinimum", "more than"),
        ("maximum", "at most"),
        ("exclusiveMaximum", "less than"),
        ("multipleOf", "a multiple of"),
        ("minLength", "at least this many characters:"),
        ("maxLength", "at most this many characters:"),
        ("minItems", "at least this many items:"),
        ("maxItems", "at most this many items:"),
        ("pattern", "matching"),
        ("format", "format"),
        ("default", "default"),
    ] {
        if let Some(v) = obj.get(key) {
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
            let _ = write!(out, ", {word} {v}");
        }
    }
    out
}

fn description(schema: &Value) -> Option<&str> {
    schema
        .get("description")
        .or_else(|| schema.get("title"))
        .and_then(Value::as_str)
}

fn required(obj: &Map<String, Value>) -> Vec<&str> {
    obj.get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The last segment of a ref: `#/$defs/Node` is `Node`.
fn ref_name(r: &str) -> &str {
    r.rsplit('/').next().filter(|n| !n.is_empty()).unwrap_or(r)
}

/// The data schema's definitions, each once, after the envelope: refs name them.
fn definitions(out: &mut String, schema: &Value) {
    let mut defs: Vec<(&String, &Value)> = Vec::new();
    for key in ["$defs", "definitions"] {
        defs.extend(
            schema
                .get(key)
                .and_then(Value::as_object)
                .into_iter()
                .flatten(),
        );
    }
    if defs.is_empty() {
        return;
    }
    out.push_str("where:\n");
    for (name, def) in defs {
        let mut kind = kind(def);
        kind.push_str(&constraints(def));
        line(out, 0, name, &kind, description(def));
        children(out, 1, def);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_outline_shows_fields_types_required_enums_and_descriptions() {
        let schema = json!({
            "type": "object",
            "description": "the person found",
            "properties": {
                "name": {"type": "string", "description": "full name"},
                "age": {"type": ["integer", "null"], "minimum": 0},
                "role": {"enum": ["admin", "user"]},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                "address": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
                "extra": {"type": "object", "additionalProperties": {"type": "number"}},
            },
            "required": ["name", "role"],
        });
        let doc = schema_doc(Some(&schema), Transport::Emit);
        let want = "\
OUTPUT SCHEMA
When you are done, your answer is one JSON object:
- response (string, optional): text for the person who asked
- data (object, required): the person found
  - address (object, optional)
    - city (string, required)
  - age (integer or null, optional, at least 0)
  - extra (map of string to number, optional)
  - name (string, required): full name
  - role (value, required, one of \"admin\", \"user\")
  - tags (array of string, optional, at most this many items: 3)
- reasoning (string, optional): why you answered this way, in a sentence or two
Finish by replying with only this JSON object: no text before or after it.
";
        assert_eq!(doc, want);
        assert_eq!(
            schema_doc(Some(&schema), Transport::Emit),
            doc,
            "same schema, same bytes"
        );
    }

    #[test]
    fn refs_name_their_definitions_once_and_recursion_ends() {
        let schema = json!({
            "$defs": {"Node": {
                "type": "object",
                "properties": {"label": {"type": "string"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
                "required": ["label"],
            }},
            "anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}],
        });
        let doc = schema_doc(Some(&schema), Transport::Respond);
        assert!(
            doc.contains(
                "- data (one of 2 shapes, required)\n  - shape 1 (Node)\n  - shape 2 (null)\n"
            ),
            "{doc}"
        );
        assert!(doc.contains("where:\n- Node (object)\n  - kids (array of Node, optional)\n  - label (string, required)\n"), "{doc}");
        assert!(
            doc.ends_with("or by replying with only this JSON object.\n"),
            "{doc}"
        );
    }

    #[test]
    fn a_chat_agent_is_told_its_response_is_required() {
        let doc = schema_doc(None, Transport::Emit);
        assert!(doc.contains("- response (string, required)"), "{doc}");
        assert!(!doc.contains("- data"), "{doc}");
    }

    #[test]
    fn kinds_in_a_few_words() {
        let cases = [
            (json!(true), "any"),
            (json!({}), "any"),
            (json!({"const": "x"}), "exactly \"x\""),
            (json!({"type": "array"}), "array"),
            (json!({"properties": {}}), "object"),
            (json!({"$ref": "#/definitions/Item"}), "Item"),
            (json!({"oneOf": [{}, {}, {}]}), "one of 3 shapes"),
        ];
        for (schema, want) in cases {
            assert_eq!(kind(&schema), want, "{schema}");
        }
    }
}
