//! What an output schema may expand to, counted before anything compiles: the
//! subschemas a check may walk once every `$ref` is followed (recursion counted once)
//! and how deep they nest, each node visited once (memoized). Checking a value walks
//! every path through the `$ref`s (a value failing an `anyOf` is tried on each branch),
//! so 2 KB of definitions each an `anyOf` over two `$ref`s of the one before has 2⁴⁰
//! paths at depth 40; this count refuses it in well under a millisecond.

use std::collections::HashMap;

use serde_json::{Map, Value};

/// The most subschemas an output schema may expand to once its `$ref`s are followed.
/// A hand-written answer schema has tens to hundreds; checking a value against this many
/// takes about a millisecond.
pub const MAX_EXPANDED: u64 = 20_000;

/// The deepest an output schema may nest (objects and arrays, `$ref`s followed): the
/// validator's compile and every check recurse this deep. A request body nests at most
/// as deep (the JSON parser's own limit), so only `$ref`s can go past it.
pub const MAX_DEPTH: usize = 128;

/// Counts what `schema` expands to (see the module's comment): `Err` when it passes
/// [`MAX_EXPANDED`] subschemas or [`MAX_DEPTH`] levels.
pub fn precheck(schema: &Value) -> Result<(), Over> {
    let mut walk = Walk {
        root: schema,
        ids: ids(schema),
        memo: HashMap::new(),
        stack: Vec::new(),
    };
    walk.node(schema).map(drop)
}

/// Why a schema is refused before it compiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    Expanded,
    Depth,
}

struct Walk<'a> {
    root: &'a Value,
    /// The embedded resources (`$id` below the root), by the last segment of their id.
    ids: Vec<(&'a str, &'a Value)>,
    /// Per node (by address): the subschemas it expands to and how deep it goes.
    memo: HashMap<usize, (u64, usize)>,
    /// The nodes being walked, outermost first: a `$ref` to one of them is recursion,
    /// which the validator leaves for later (counted once).
    stack: Vec<usize>,
}

impl<'a> Walk<'a> {
    /// (subschemas, depth) of `v`.
    fn node(&mut self, v: &'a Value) -> Result<(u64, usize), Over> {
        let at = v as *const Value as usize;
        if let Some(&known) = self.memo.get(&at) {
            if self.stack.len() + known.1 > MAX_DEPTH {
                return Err(Over::Depth);
            }
            return Ok(known);
        }
        if self.stack.len() >= MAX_DEPTH {
            return Err(Over::Depth);
        }
        self.stack.push(at);
        let out = self.inner(v);
        self.stack.pop();
        let out = out?;
        self.memo.insert(at, out);
        Ok(out)
    }

    fn inner(&mut self, v: &'a Value) -> Result<(u64, usize), Over> {
        let (mut count, mut depth) = match v {
            Value::Object(_) => (1u64, 0usize),
            Value::Array(_) => (0, 0),
            _ => return Ok((0, 0)),
        };
        let children: Box<dyn Iterator<Item = (Option<&'a str>, &'a Value)>> = match v {
            Value::Object(m) => Box::new(m.iter().map(|(k, v)| (Some(k.as_str()), v))),
            Value::Array(a) => Box::new(a.iter().map(|v| (None, v))),
            _ => Box::new(std::iter::empty()),
        };
        for (k, child) in children {
            // Definitions are walked where a `$ref` leads, not where they are listed.
            if matches!(k, Some("$defs" | "definitions")) {
                continue;
            }
            let is_ref = matches!(k, Some("$ref" | "$dynamicRef" | "$recursiveRef"));
            let (c, d) = match (is_ref, child) {
                (true, Value::String(r)) => self.reference(r)?,
                (_, Value::Object(_) | Value::Array(_)) => self.node(child)?,
                _ => (0, 0),
            };
            count = count.saturating_add(c);
            depth = depth.max(d);
            if count > MAX_EXPANDED {
                return Err(Over::Expanded);
            }
        }
        Ok((count, depth + 1))
    }

    /// What a `$ref` to `r` adds: its target's expansion, or one node for recursion (and
    /// for a target outside the document, which the validator refuses anyway).
    fn reference(&mut self, r: &str) -> Result<(u64, usize), Over> {
        let targets = self.targets(r);
        let mut most = (0u64, 0usize);
        for t in targets {
            let at = t as *const Value as usize;
            let cost = if self.stack.contains(&at) {
                (1, 1)
            } else {
                self.node(t)?
            };
            most = (most.0.max(cost.0), most.1.max(cost.1));
        }
        Ok(most)
    }

    /// Where `r` may point in the document: exactly for a fragment (`#`, `#/pointer`,
    /// `#anchor`); for a reference naming a resource, every embedded resource whose `$id`
    /// ends the same way (the most costly of them is counted).
    fn targets(&self, r: &str) -> Vec<&'a Value> {
        let (base, fragment) = r.split_once('#').unwrap_or((r, ""));
        let scopes: Vec<&'a Value> = if base.is_empty() {
            vec![self.root]
        } else {
            let last = last_segment(base);
            self.ids
                .iter()
                .filter(|(id, _)| last_segment(id) == last)
                .map(|(_, v)| *v)
                .collect()
        };
        scopes
            .into_iter()
            .filter_map(|scope| in_scope(scope, fragment))
            .collect()
    }
}

fn last_segment(uri: &str) -> &str {
    let uri = uri.split('#').next().unwrap_or(uri).trim_end_matches('/');
    uri.rsplit('/').next().unwrap_or(uri)
}

/// The node `fragment` names in `scope`: a JSON pointer, or an anchor.
fn in_scope<'a>(scope: &'a Value, fragment: &str) -> Option<&'a Value> {
    if fragment.is_empty() {
        return Some(scope);
    }
    if fragment.starts_with('/') {
        return scope.pointer(&percent_decoded(fragment));
    }
    anchor(scope, fragment)
}

fn anchor<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    match v {
        Value::Object(m) => {
            let named = |k: &str| m.get(k).and_then(Value::as_str);
            if named("$anchor") == Some(name)
                || named("$dynamicAnchor") == Some(name)
                || named("$id").and_then(|id| id.strip_prefix('#')) == Some(name)
            {
                return Some(v);
            }
            m.values().find_map(|c| anchor(c, name))
        }
        Value::Array(a) => a.iter().find_map(|c| anchor(c, name)),
        _ => None,
    }
}

/// Every `$id` below the root, with the node it names.
fn ids(root: &Value) -> Vec<(&str, &Value)> {
    fn walk<'a>(v: &'a Value, out: &mut Vec<(&'a str, &'a Value)>, depth: usize) {
        if depth > MAX_DEPTH {
            return;
        }
        match v {
            Value::Object(m) => {
                if depth > 0
                    && let Some(id) = m.get("$id").and_then(Value::as_str)
                {
                    out.push((id, v));
                }
                m.values().for_each(|c| walk(c, out, depth + 1));
            }
            Value::Array(a) => a.iter().for_each(|c| walk(c, out, depth + 1)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(root, &mut out, 0);
    out
}

/// `%XX` escapes of a URI fragment decoded (a JSON pointer in a `$ref` is written so).
fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(h) = s.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(h, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The schema the issue found: `d{n}` is `anyOf` over two `$ref`s of `d{n-1}`, `depth`
/// times, the root a `$ref` of the last (2^depth subschemas, about 55 bytes a level).
pub fn chained_any_of(depth: usize) -> Value {
    let mut defs = Map::new();
    defs.insert("d0".into(), serde_json::json!({"type": "string"}));
    for n in 1..=depth {
        let prev = format!("#/$defs/d{}", n - 1);
        defs.insert(
            format!("d{n}"),
            serde_json::json!({"anyOf": [{"$ref": prev}, {"$ref": prev}]}),
        );
    }
    serde_json::json!({"$defs": defs, "$ref": format!("#/$defs/d{depth}")})
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A chain of `n` definitions each a `$ref` of the next: linear, but `n` deep.
    fn ref_chain(n: usize) -> Value {
        let mut defs = Map::new();
        defs.insert(format!("c{n}"), json!({"type": "integer"}));
        for i in 0..n {
            defs.insert(
                format!("c{i}"),
                json!({"$ref": format!("#/$defs/c{}", i + 1)}),
            );
        }
        json!({"$defs": defs, "$ref": "#/$defs/c0"})
    }

    /// The chained `anyOf` again, its refs by `$anchor`.
    fn anchored(depth: usize) -> Value {
        let mut defs = Map::new();
        defs.insert("d0".into(), json!({"$anchor": "a0", "type": "string"}));
        for n in 1..=depth {
            let prev = format!("#a{}", n - 1);
            defs.insert(
                format!("d{n}"),
                json!({"$anchor": format!("a{n}"), "anyOf": [{"$ref": prev}, {"$ref": prev}]}),
            );
        }
        json!({"$defs": defs, "$ref": format!("#a{depth}")})
    }

    /// The chained `anyOf` again, each definition its own resource (`$id`).
    fn by_id(depth: usize) -> Value {
        let mut defs = Map::new();
        defs.insert(
            "d0".into(),
            json!({"$id": "https://x.test/d0", "type": "string"}),
        );
        for n in 1..=depth {
            let prev = format!("d{}", n - 1);
            defs.insert(
                format!("d{n}"),
                json!({"$id": format!("https://x.test/d{n}"), "anyOf": [{"$ref": prev}, {"$ref": prev}]}),
            );
        }
        json!({"$id": "https://x.test/root", "$defs": defs, "$ref": format!("d{depth}")})
    }

    /// The chained `anyOf`, reached through a definition whose name is escaped in the
    /// `$ref` that names it.
    fn escaped() -> Value {
        let mut s = chained_any_of(40);
        s["$defs"]["top x"] = json!({"$ref": "#/$defs/d40"});
        s["$ref"] = json!("#/$defs/top%20x");
        s
    }

    fn nested(levels: usize) -> Value {
        let mut v = json!({"type": "string"});
        for _ in 0..levels {
            v = json!({"type": "object", "properties": {"x": v}});
        }
        v
    }

    /// (schema, what the precheck says: None passes).
    #[test]
    fn the_precheck_counts_what_a_check_may_walk() {
        let tree = json!({
            "$defs": {"Node": {"type": "object", "properties": {
                "label": {"type": "string"},
                "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}},
            "$ref": "#/$defs/Node"
        });
        let cases: Vec<(Value, Option<Over>)> = vec![
            (
                json!({"type": "object", "properties": {"ok": {"type": "boolean"}}}),
                None,
            ),
            (json!(true), None),
            (tree, None),
            (json!({"properties": {"me": {"$ref": "#"}}}), None),
            // 2^14 - 3 subschemas: under the bound; one level more is over it.
            (chained_any_of(12), None),
            (chained_any_of(13), Some(Over::Expanded)),
            (chained_any_of(40), Some(Over::Expanded)),
            (anchored(12), None),
            (anchored(40), Some(Over::Expanded)),
            (by_id(40), Some(Over::Expanded)),
            // A pointer written with escapes is followed as the validator follows it.
            (escaped(), Some(Over::Expanded)),
            (ref_chain(100), None),
            (ref_chain(200), Some(Over::Depth)),
            (nested(60), None),
            (nested(70), Some(Over::Depth)),
            // A target outside the document costs nothing here (the validator refuses it).
            (json!({"$ref": "https://example.com/s.json"}), None),
        ];
        for (i, (schema, want)) in cases.into_iter().enumerate() {
            assert_eq!(precheck(&schema).err(), want, "case {i}");
        }
    }

    #[test]
    fn the_precheck_of_the_issues_schema_is_cheap() {
        let s = chained_any_of(40);
        assert!(s.to_string().len() < 2_600, "a 2 KB document");
        let t = std::time::Instant::now();
        let e = precheck(&s).expect_err("refused");
        eprintln!("the depth-40 chain refused in {:?}: {e:?}", t.elapsed());
        assert_eq!(e, Over::Expanded);
    }
}
