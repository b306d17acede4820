//! The strict-compatibility walk: whether a data schema can go on the wire as OpenAI-style
//! strict tool parameters or a strict `response_format` (and so be enforced by the
//! endpoint's grammar), and if not, every reason why.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// The largest serialized data schema inlined into tool parameters or a
/// `response_format`; a larger one goes in the prompt as documentation.
pub const STRICT_MAX_BYTES: usize = 8 * 1024;

/// The deepest nesting of objects and arrays strict mode takes.
pub const STRICT_MAX_DEPTH: usize = 10;

/// The keywords strict mode understands. Anything else (`oneOf`, `allOf`, `not`,
/// `if`/`then`, `patternProperties`, `minLength`, `default`, ...) is refused by the
/// endpoint or silently not enforced.
const KEYWORDS: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "anyOf",
    "$ref",
    "$defs",
    "definitions",
    "description",
    "title",
    "$schema",
    "$comment",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minItems",
    "maxItems",
];

/// Whether `schema` is strict-compatible and small: see [`strict_problems`].
pub fn fits_strict(schema: &Value) -> bool {
    strict_problems(schema).is_empty()
}

/// Every reason `schema` cannot go on the wire strict: over [`STRICT_MAX_BYTES`]
/// serialized; a keyword strict mode does not take; an object that is not closed
/// (`additionalProperties: false`) or does not list every property in `required`; an
/// open record (an object without `properties`, or a `true` schema); a schema with no
/// `type` (nor `enum`, `const`, `anyOf`, `$ref`); a tuple `items`; nesting deeper than
/// [`STRICT_MAX_DEPTH`]; a `$ref` that is not `#/$defs/..` or `#/definitions/..` of
/// this schema; recursion. Empty means it fits.
pub fn strict_problems(schema: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let size = serde_json::to_string(schema).map_or(usize::MAX, |s| s.len());
    if size > STRICT_MAX_BYTES {
        problems.push(format!(
            "the schema is {size} bytes serialized, over {STRICT_MAX_BYTES}"
        ));
    }
    let defs = definitions(schema);
    let mut walk = Walk {
        problems: &mut problems,
        defs: &defs,
    };
    walk.node(schema, "#", 0);
    for (name, def) in &defs {
        walk.node(def, name, 0);
    }
    if let Some(cycle) = recursion(schema, &defs) {
        problems.push(format!(
            "the schema is recursive ({cycle} refers back to itself)"
        ));
    }
    problems
}

/// The schema's definitions by their ref (`#/$defs/Name`).
fn definitions(schema: &Value) -> BTreeMap<String, &Value> {
    let mut defs = BTreeMap::new();
    for key in ["$defs", "definitions"] {
        if let Some(map) = schema.get(key).and_then(Value::as_object) {
            for (name, def) in map {
                defs.insert(format!("#/{key}/{name}"), def);
            }
        }
    }
    defs
}

struct Walk<'a, 'b> {
    problems: &'a mut Vec<String>,
    defs: &'a BTreeMap<String, &'b Value>,
}

impl Walk<'_, '_> {
    fn node(&mut self, schema: &Value, at: &str, depth: usize) {
        let Some(obj) = schema.as_object() else {
            self.problems.push(format!(
                "{at} is an open schema ({schema}), not a typed one"
            ));
            return;
        };
        if depth > STRICT_MAX_DEPTH {
            self.problems
                .push(format!("{at} is nested deeper than {STRICT_MAX_DEPTH}"));
            return;
        }
        for key in obj.keys().filter(|k| !KEYWORDS.contains(&k.as_str())) {
            self.problems.push(format!(
                "{at} uses `{key}`, which strict mode does not take"
            ));
        }
        if let Some(r) = obj.get("$ref") {
            if !r.as_str().is_some_and(|r| self.defs.contains_key(r)) {
                self.problems.push(format!(
                    "{at} refers to {r}, not to a definition of this schema"
                ));
            }
            return;
        }
        let typed = ["type", "enum", "const", "anyOf"]
            .iter()
            .any(|k| obj.contains_key(*k));
        if !typed {
            self.problems.push(format!("{at} has no type"));
        }
        if is_object(obj) {
            self.object(obj, at, depth);
        }
        match obj.get("items") {
            Some(items @ Value::Object(_)) => self.node(items, &format!("{at}/items"), depth + 1),
            Some(_) => self
                .problems
                .push(format!("{at}/items is not a single schema")),
            None => {}
        }
        if let Some(variants) = obj.get("anyOf").and_then(Value::as_array) {
            for (i, v) in variants.iter().enumerate() {
                self.node(v, &format!("{at}/anyOf/{i}"), depth);
            }
        }
    }

    fn object(&mut self, obj: &serde_json::Map<String, Value>, at: &str, depth: usize) {
        if obj.get("additionalProperties") != Some(&Value::Bool(false)) {
            self.problems.push(format!(
                "{at} is an object without `additionalProperties: false`"
            ));
        }
        let Some(props) = obj.get("properties").and_then(Value::as_object) else {
            self.problems.push(format!(
                "{at} is an open record (an object without properties)"
            ));
            return;
        };
        let required: BTreeSet<&str> = obj
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for (name, prop) in props {
            if !required.contains(name.as_str()) {
                self.problems
                    .push(format!("{at}/properties/{name} is not in `required`"));
            }
            self.node(prop, &format!("{at}/properties/{name}"), depth + 1);
        }
    }
}

/// A schema describes objects when its `type` is (or includes) `object`, or it has
/// `properties`.
fn is_object(obj: &serde_json::Map<String, Value>) -> bool {
    let ty = obj.get("type");
    ty == Some(&Value::from("object"))
        || ty
            .and_then(Value::as_array)
            .is_some_and(|t| t.contains(&Value::from("object")))
        || obj.contains_key("properties")
}

/// A definition that reaches itself through refs, or a ref to the root (`#`): the first
/// found, by name.
fn recursion(schema: &Value, defs: &BTreeMap<String, &Value>) -> Option<String> {
    let mut root_refs = Vec::new();
    refs(schema, &mut root_refs, true);
    if root_refs.iter().any(|r| r == "#") {
        return Some("#".into());
    }
    let edges: BTreeMap<&str, Vec<String>> = defs
        .iter()
        .map(|(name, def)| {
            let mut out = Vec::new();
            refs(def, &mut out, false);
            (name.as_str(), out)
        })
        .collect();
    defs.keys()
        .find(|start| reaches(&edges, start, start))
        .cloned()
}

/// Whether `from` reaches `target` by one or more refs.
fn reaches(edges: &BTreeMap<&str, Vec<String>>, from: &str, target: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<&str> = edges
        .get(from)
        .map(|e| e.iter().map(String::as_str).collect())
        .unwrap_or_default();
    while let Some(next) = todo.pop() {
        if next == target {
            return true;
        }
        if seen.insert(next)
            && let Some(e) = edges.get(next)
        {
            todo.extend(e.iter().map(String::as_str));
        }
    }
    false
}

/// Every `$ref` in `schema`; at the root, not inside its definitions (walked apart).
fn refs(schema: &Value, out: &mut Vec<String>, root: bool) {
    match schema {
        Value::Object(obj) => {
            for (k, v) in obj {
                if k == "$ref" {
                    out.extend(v.as_str().map(str::to_owned));
                } else if !(root && (k == "$defs" || k == "definitions")) {
                    refs(v, out, false);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, out, false)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn closed(props: Value, required: &[&str]) -> Value {
        json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
    }

    /// (schema, fits, a word every problem list must hold when it does not fit).
    #[test]
    fn the_walk_says_what_strict_mode_cannot_take() {
        let name = json!({"type": "string", "description": "a name"});
        let big_enum: Vec<String> = (0..1000).map(|i| format!("value-{i}")).collect();
        let cases: Vec<(Value, bool, &str)> = vec![
            (closed(json!({"name": name}), &["name"]), true, ""),
            (json!({"type": "string", "enum": ["a", "b"]}), true, ""),
            (json!({"type": ["string", "null"]}), true, ""),
            (
                json!({"anyOf": [{"type": "string"}, {"type": "integer"}]}),
                true,
                "",
            ),
            (
                json!({"type": "array", "items": closed(json!({"n": {"type": "number", "minimum": 0}}), &["n"]), "maxItems": 5}),
                true,
                "",
            ),
            (
                json!({"$defs": {"P": closed(json!({"x": {"type": "integer"}}), &["x"])}, "type": "array", "items": {"$ref": "#/$defs/P"}}),
                true,
                "",
            ),
            (
                closed(json!({"name": name}), &[]),
                false,
                "not in `required`",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}),
                false,
                "additionalProperties",
            ),
            (
                json!({"type": "object", "additionalProperties": {"type": "string"}}),
                false,
                "open record",
            ),
            (
                json!({"type": "object", "additionalProperties": false}),
                false,
                "open record",
            ),
            (json!({"oneOf": [{"type": "string"}]}), false, "`oneOf`"),
            (
                json!({"type": "string", "minLength": 2}),
                false,
                "`minLength`",
            ),
            (
                json!({"type": "array", "items": [{"type": "string"}]}),
                false,
                "not a single schema",
            ),
            (closed(json!({"any": {}}), &["any"]), false, "no type"),
            (closed(json!({"any": true}), &["any"]), false, "open schema"),
            (
                json!({"type": "string", "enum": big_enum}),
                false,
                "bytes serialized",
            ),
            (
                json!({"$ref": "https://example.com/s.json"}),
                false,
                "not to a definition",
            ),
            (
                json!({
                    "$defs": {"Node": closed(json!({"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}), &["kids"])},
                    "$ref": "#/$defs/Node",
                }),
                false,
                "recursive",
            ),
            (
                closed(json!({"self": {"$ref": "#"}}), &["self"]),
                false,
                "recursive",
            ),
        ];
        for (schema, fits, word) in cases {
            let problems = strict_problems(&schema);
            assert_eq!(problems.is_empty(), fits, "{schema}: {problems:?}");
            assert!(
                fits || problems.iter().any(|p| p.contains(word)),
                "{schema}: {problems:?} lacks {word}"
            );
            assert_eq!(fits_strict(&schema), fits);
        }
    }

    #[test]
    fn nesting_past_the_limit_does_not_fit() {
        let mut s = json!({"type": "string"});
        for _ in 0..=STRICT_MAX_DEPTH {
            s = closed(json!({"x": s}), &["x"]);
        }
        let problems = strict_problems(&s);
        assert!(
            problems.iter().any(|p| p.contains("deeper")),
            "{problems:?}"
        );
    }
}
