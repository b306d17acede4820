//! What an output schema may cost. The validator compiles each `$ref` target once, but
//! checking a value walks every path through the `$ref`s: a value that fails an `anyOf`
//! is tried against each branch. So a schema whose definitions refer to each other along
//! many paths — `anyOf` over two `$ref`s of the definition before, forty deep, a 2 KB
//! document — has 2⁴⁰ paths, and the first check of a value (the probe its compile makes
//! to decide the unwrap rung, then every answer) never ends: 1.25 s at depth 24 in a
//! release build, doubling with each level. Three bounds keep that off the hub:
//!
//! - [`precheck`]: before anything compiles, the subschemas a check may walk (every
//!   `$ref` followed, recursion counted once) and their depth are counted, cheaply (each
//!   node once, memoized), and a schema over [`MAX_EXPANDED`] or [`MAX_DEPTH`] is
//!   refused. This also bounds what checking one answer costs.
//! - [`compile_within`]: the compile runs on a blocking thread, never a runtime worker,
//!   and a caller waits at most `limits.schemaCompileMs` for it; past it the schema is
//!   refused. A thread cannot be stopped: one that ran past its budget burns on until the
//!   validator returns, so only one compile runs at a time in the whole hub ([`GATE`]):
//!   a compile that passed the precheck takes milliseconds, so waiting in line costs
//!   nothing, and however a schema slips past the precheck it holds at most one thread
//!   (the next callers are told the hub is busy compiling).
//! - A compiled schema is kept ([`cached`], keyed by the SHA-256 of its settings), so a
//!   session's schema is compiled once per process, not on every drive.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use super::{ConfigError, Output, OutputConfig};

/// The most subschemas an output schema may expand to once its `$ref`s are followed.
/// A hand-written answer schema has tens to hundreds; checking a value against this many
/// takes about a millisecond.
pub const MAX_EXPANDED: u64 = 20_000;

/// The deepest an output schema may nest (objects and arrays, `$ref`s followed): the
/// validator's compile and every check recurse this deep. A request body nests at most
/// as deep (the JSON parser's own limit), so only `$ref`s can go past it.
pub const MAX_DEPTH: usize = 128;

/// Compiled schemas kept; past it the cache starts over (a compile is cheap once the
/// precheck passed, the cache only spares repeating it on every drive).
const CACHE_MAX: usize = 512;

/// One compile at a time in the hub (see the module's comment).
static GATE: Semaphore = Semaphore::const_new(1);

static CACHE: LazyLock<Mutex<HashMap<[u8; 32], Output>>> = LazyLock::new(Mutex::default);

fn key(config: &OutputConfig) -> [u8; 32] {
    // Serializing a value that was deserialized cannot fail; an empty key would only
    // share one cache slot, never mix two schemas' checks (it is not stored then).
    let bytes = serde_json::to_vec(config).unwrap_or_default();
    Sha256::digest(&bytes).into()
}

/// The compiled checks of `config`, when compiled before in this process.
pub fn cached(config: &OutputConfig) -> Option<Output> {
    let k = key(config);
    CACHE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&k)
        .cloned()
}

pub(super) fn remember(config: &OutputConfig, out: &Output) {
    let k = key(config);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if cache.len() >= CACHE_MAX {
        cache.clear();
    }
    cache.insert(k, out.clone());
}

/// [`super::compile`] on a blocking thread, answered within `budget` (the wait for the
/// one compile slot included): [`ConfigError::TooSlow`] past it, [`ConfigError::Busy`]
/// when another compile still holds the slot.
pub async fn compile_within(
    config: &OutputConfig,
    budget: Duration,
) -> Result<Output, ConfigError> {
    if let Some(out) = cached(config) {
        return Ok(out);
    }
    // The cheap checks here, so a refused shape never waits for the slot.
    super::check_cheap(config)?;
    let ms = u64::try_from(budget.as_millis()).unwrap_or(u64::MAX);
    let deadline = tokio::time::Instant::now() + budget;
    let permit = match tokio::time::timeout_at(deadline, GATE.acquire()).await {
        Ok(Ok(p)) => p,
        // The gate is never closed; `Err` is only the wait running out.
        _ => return Err(ConfigError::Busy(ms)),
    };
    let c = config.clone();
    let task = tokio::task::spawn_blocking(move || {
        let out = super::compile(&c);
        // Held until the validator returns, however long after the caller gave up.
        drop(permit);
        out
    });
    match tokio::time::timeout_at(deadline, task).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => Err(ConfigError::Schema(format!(
            "the validator failed on it ({e})"
        ))),
        Err(_) => Err(ConfigError::TooSlow(ms)),
    }
}

/// A stored session's output for its runs (none without a schema): compiled within
/// `budget_ms`, or, should it not compile now (a newer validator, a bound it passed
/// before the bounds existed, a busy or slow compile), the checks that refuse every
/// answer. Never an error: a drive is not held up by its session's schema.
pub async fn for_run(config: Option<&OutputConfig>, budget_ms: u64) -> Option<Output> {
    let config = config?;
    let budget = Duration::from_millis(budget_ms);
    Some(compile_within(config, budget).await.unwrap_or_else(|e| {
        tracing::error!(error = %e, "a session's output schema does not compile now; its answers are refused");
        Output::refusing(config.clone())
    }))
}

/// Counts what `schema` expands to (see the module's comment): `Err` when it passes
/// [`MAX_EXPANDED`] subschemas or [`MAX_DEPTH`] levels.
pub fn precheck(schema: &Value) -> Result<(), ConfigError> {
    let mut walk = Walk {
        root: schema,
        ids: ids(schema),
        memo: HashMap::new(),
        stack: Vec::new(),
    };
    walk.node(schema).map(drop)
}

/// Why a walk stopped.
#[derive(Debug)]
enum Over {
    Expanded,
    Depth,
}

impl From<Over> for ConfigError {
    fn from(o: Over) -> ConfigError {
        match o {
            Over::Expanded => ConfigError::TooLarge(MAX_EXPANDED),
            Over::Depth => ConfigError::TooDeep(MAX_DEPTH),
        }
    }
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
    fn node(&mut self, v: &'a Value) -> Result<(u64, usize), ConfigError> {
        let at = v as *const Value as usize;
        if let Some(&known) = self.memo.get(&at) {
            if self.stack.len() + known.1 > MAX_DEPTH {
                return Err(Over::Depth.into());
            }
            return Ok(known);
        }
        if self.stack.len() >= MAX_DEPTH {
            return Err(Over::Depth.into());
        }
        self.stack.push(at);
        let out = self.inner(v);
        self.stack.pop();
        let out = out?;
        self.memo.insert(at, out);
        Ok(out)
    }

    fn inner(&mut self, v: &'a Value) -> Result<(u64, usize), ConfigError> {
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
                return Err(Over::Expanded.into());
            }
        }
        Ok((count, depth + 1))
    }

    /// What a `$ref` to `r` adds: its target's expansion, or one node for recursion (and
    /// for a target outside the document, which the validator refuses anyway).
    fn reference(&mut self, r: &str) -> Result<(u64, usize), ConfigError> {
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

    fn config(schema: Value) -> OutputConfig {
        serde_json::from_value(json!({"schema": schema})).expect("config")
    }

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
        let cases: Vec<(Value, Option<&str>)> = vec![
            (
                json!({"type": "object", "properties": {"ok": {"type": "boolean"}}}),
                None,
            ),
            (json!(true), None),
            (tree, None),
            (json!({"properties": {"me": {"$ref": "#"}}}), None),
            // 2^14 - 3 subschemas: under the bound; one level more is over it.
            (chained_any_of(12), None),
            (chained_any_of(13), Some("more than 20000 subschemas")),
            (chained_any_of(40), Some("more than 20000 subschemas")),
            (anchored(12), None),
            (anchored(40), Some("more than 20000 subschemas")),
            (by_id(40), Some("more than 20000 subschemas")),
            // A pointer written with escapes is followed as the validator follows it.
            (escaped(), Some("more than 20000 subschemas")),
            (ref_chain(100), None),
            (ref_chain(200), Some("deeper than 128 levels")),
            (nested(60), None),
            (nested(70), Some("deeper than 128 levels")),
            // A target outside the document costs nothing here (the validator refuses it).
            (json!({"$ref": "https://example.com/s.json"}), None),
        ];
        for (i, (schema, want)) in cases.into_iter().enumerate() {
            let got = precheck(&schema).err().map(|e| e.to_string());
            match (want, got) {
                (None, None) => {}
                (Some(w), Some(g)) => assert!(g.contains(w), "case {i}: {g}"),
                (w, g) => panic!("case {i}: wanted {w:?}, got {g:?}"),
            }
        }
    }

    #[test]
    fn the_precheck_of_the_issues_schema_is_cheap() {
        let s = chained_any_of(40);
        assert!(s.to_string().len() < 2_600, "a 2 KB document");
        let t = std::time::Instant::now();
        let e = precheck(&s).expect_err("refused");
        eprintln!("the depth-40 chain refused in {:?}: {e}", t.elapsed());
        assert!(matches!(e, ConfigError::TooLarge(MAX_EXPANDED)), "{e:?}");
    }

    #[tokio::test]
    async fn a_compile_past_its_budget_is_refused_and_one_within_it_is_kept() {
        // Refused before anything compiles, with no budget to speak of.
        let e = compile_within(&config(chained_any_of(40)), Duration::ZERO)
            .await
            .expect_err("refused");
        assert!(matches!(e, ConfigError::TooLarge(_)), "{e:?}");
        // A schema the precheck lets through, its compile (16k paths for the probe)
        // taking longer than no time at all.
        let slow = config(json!({"description": "budget test", "allOf": [chained_any_of(12)]}));
        let e = compile_within(&slow, Duration::ZERO)
            .await
            .expect_err("past the budget");
        assert!(matches!(e, ConfigError::TooSlow(0)), "{e:?}");
        assert!(e.to_string().contains("schemaCompileMs (0 ms)"), "{e}");
        assert!(cached(&slow).is_none(), "a refused compile is not kept");
        // Within a budget it compiles; then it is kept, and asked again it is at once.
        let fine = config(json!({"description": "kept", "type": "object"}));
        compile_within(&fine, Duration::from_secs(60))
            .await
            .expect("compiles");
        assert!(cached(&fine).is_some());
        compile_within(&fine, Duration::ZERO)
            .await
            .expect("kept: no compile");
    }

    #[tokio::test]
    async fn a_stored_schema_that_does_not_compile_refuses_every_answer() {
        let stored = config(chained_any_of(40));
        let out = for_run(Some(&stored), 1_000).await.expect("an output");
        assert_eq!(out.schema(), Some(&stored.schema), "its settings kept");
        let v = out.judge(&json!({"data": "anything"}));
        assert!(matches!(v, super::super::Verdict::Refused { .. }), "{v:?}");
        assert!(
            for_run(None, 1_000).await.is_none(),
            "a chat agent has none"
        );
    }
}
