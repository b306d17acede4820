//! The document against the code: its routes are the router's (read from
//! `server/mod.rs`), `/api` is behind the token and nothing else is, and every example
//! fits the schema it illustrates.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::document;

const METHODS: &[&str] = &["get", "post", "put", "delete", "patch", "head", "options"];

fn doc() -> Value {
    serde_json::to_value(document()).expect("the document serializes")
}

/// `(METHOD, path)` of every operation in the document.
fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, _) in item.as_object().expect("path item") {
            if METHODS.contains(&method.as_str()) {
                out.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    out
}

/// Drops `//` comments, so a commented-out route is not read as one.
fn code_only(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            // A `//` inside a string literal (a URL) is kept: only a comment at the start
            // of the code on the line, or after whitespace, is cut.
            Some(i) if l[..i].trim().is_empty() || l[..i].ends_with(' ') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text of a call's arguments: from just after `open` (the index of its `(`) to its
/// matching `)`.
fn call_args(text: &str, open: usize) -> &str {
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &text[open + 1..open + i];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced call at {open}");
}

fn first_literal(args: &str) -> String {
    let start = args.find('"').expect("a string literal") + 1;
    let len = args[start..].find('"').expect("its end");
    args[start..start + len].to_string()
}

/// The HTTP methods an axum `MethodRouter` expression names (`get(a).post(b)`).
fn methods_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    for m in METHODS {
        let needle = format!("{m}(");
        let mut from = 0;
        while let Some(i) = expr[from..].find(&needle) {
            let at = from + i;
            let before = expr[..at].chars().next_back();
            if before.is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':')) {
                out.push(m.to_uppercase());
            }
            from = at + needle.len();
        }
    }
    out
}

/// `(METHOD, path)` of every route the router in `mod.rs` serves. Each `.route(` belongs to
/// the `Router::new()` chain before it; a chain bound with `let NAME =` and nested with
/// `.nest("/PREFIX", NAME)` has its paths under the prefix.
fn routed(source: &str) -> BTreeSet<(String, String)> {
    let text = code_only(source);
    let mut nests = std::collections::BTreeMap::new();
    let mut from = 0;
    while let Some(i) = text[from..].find(".nest(") {
        let open = from + i + ".nest".len();
        let args = call_args(&text, open);
        let prefix = first_literal(args);
        let name = args.rsplit(',').next().expect("nest's router").trim();
        nests.insert(name.to_string(), prefix);
        from = open;
    }
    // The start of each chain, with the name it is bound to (if any).
    let mut chains = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("Router::new()") {
        let at = from + i;
        let line = &text[text[..at].rfind('\n').map_or(0, |n| n + 1)..at];
        let name = line
            .trim()
            .strip_prefix("let ")
            .and_then(|l| l.strip_suffix('='))
            .map(|n| n.trim().to_string());
        chains.push((at, name));
        from = at + 1;
    }
    let mut out = BTreeSet::new();
    let mut from = 0;
    while let Some(i) = text[from..].find(".route(") {
        let open = from + i + ".route".len();
        let args = call_args(&text, open);
        let path = first_literal(args);
        let chain = chains
            .iter()
            .rev()
            .find(|(at, _)| *at < open)
            .expect("a route in a Router::new() chain");
        let prefix = match &chain.1 {
            Some(name) => nests
                .get(name)
                .unwrap_or_else(|| panic!("router {name} is never nested"))
                .clone(),
            None => String::new(),
        };
        let full = match (prefix.as_str(), path.as_str()) {
            ("", p) => p.to_string(),
            (pre, "/") => pre.to_string(),
            (pre, p) => format!("{pre}{p}"),
        };
        let methods = methods_in(&args[args.find(',').expect("a handler")..]);
        assert!(!methods.is_empty(), "no method for {full}");
        for m in methods {
            out.insert((m, full.clone()));
        }
        from = open;
    }
    out
}

#[test]
fn the_parser_reads_nested_chains_and_every_method() {
    let src = r#"
        let api = Router::new()
            .route("/a/{x}", post(h::a).get(h::b))
            // .route("/commented", get(h::c))
            .route_layer(layer);
        Router::new()
            .route("/healthz", get(|| async { axum::Json(serde_json::json!({"ok": true})) }))
            .route("/w", post(signal::route))
            .nest("/api", api)
    "#;
    let got: Vec<_> = routed(src)
        .into_iter()
        .map(|(m, p)| format!("{m} {p}"))
        .collect();
    assert_eq!(
        got,
        [
            "GET /api/a/{x}",
            "GET /healthz",
            "POST /api/a/{x}",
            "POST /w"
        ]
    );
}

#[test]
fn the_document_names_exactly_the_routes_the_router_serves() {
    let routes = routed(include_str!("../mod.rs"));
    let doc = documented(&doc());
    assert!(
        routes.len() > 20,
        "the router's routes were not read: {routes:?}"
    );
    let undocumented: Vec<_> = routes.difference(&doc).collect();
    assert!(
        undocumented.is_empty(),
        "routes the router serves but the OpenAPI document (server/openapi/) and docs/api.md do not describe: {undocumented:?}"
    );
    let unrouted: Vec<_> = doc.difference(&routes).collect();
    assert!(
        unrouted.is_empty(),
        "routes the document describes but the router does not serve: {unrouted:?}"
    );
}

#[test]
fn routes_are_added_only_in_the_servers_mod_rs() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut stack = vec![dir.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs")
                || p.ends_with("server/mod.rs")
                || p.ends_with("server/openapi/tests.rs")
            {
                continue;
            }
            let text = code_only(&std::fs::read_to_string(&p).expect("read"));
            assert!(
                !text.contains(".route(") && !text.contains(".nest("),
                "{} adds routes; the OpenAPI test reads only server/mod.rs: read it there too",
                p.display()
            );
        }
    }
}

#[test]
fn the_api_needs_the_token_and_nothing_else_does() {
    let doc = doc();
    assert_eq!(
        doc["security"],
        json!([{super::TOKEN_SCHEME: []}]),
        "the default: the operator token"
    );
    for (method, path) in documented(&doc) {
        let op = &doc["paths"][&path][method.to_lowercase()];
        let security = op["security"].as_array().expect("every operation says");
        if path.starts_with("/api/") {
            assert_eq!(
                op["security"],
                json!([{super::TOKEN_SCHEME: []}, {super::COOKIE_SCHEME: []}]),
                "{method} {path}"
            );
            assert!(op["responses"]["401"].is_object(), "{method} {path}");
        } else {
            assert!(security.is_empty(), "{method} {path} is open");
        }
    }
}

#[test]
fn operations_are_whole() {
    let doc = doc();
    let mut ids = BTreeSet::new();
    for (method, path) in documented(&doc) {
        let op = &doc["paths"][&path][method.to_lowercase()];
        let id = op["operationId"].as_str().expect("an operationId");
        assert!(ids.insert(id.to_string()), "operationId {id} twice");
        assert!(op["tags"][0].is_string(), "{method} {path}: a tag");
        let responses = op["responses"].as_object().expect("responses");
        assert!(
            responses.keys().any(|c| c.starts_with('2') || c == "303"),
            "{method} {path}: a success"
        );
        // Every `{param}` of the path is declared, and nothing else in the path.
        let declared: BTreeSet<_> = op["parameters"]
            .as_array()
            .map(|ps| {
                ps.iter()
                    .filter(|p| p["in"] == "path")
                    .map(|p| p["name"].as_str().expect("name").to_string())
                    .collect()
            })
            .unwrap_or_default();
        let in_path: BTreeSet<_> = path
            .split('/')
            .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(str::to_string)
            .collect();
        assert_eq!(declared, in_path, "{method} {path}");
    }
    assert!(
        doc["openapi"].as_str().expect("openapi").starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
}

/// The schema `schema` (a `$ref` into the document's components, or inline) as a JSON
/// Schema that resolves those refs.
pub fn resolvable(doc: &Value, schema: &Value) -> Value {
    let mut root = schema.clone();
    root["components"] = doc["components"].clone();
    root
}

#[test]
fn every_example_fits_its_schema() {
    let doc = doc();
    let mut checked = 0;
    for (method, path) in documented(&doc) {
        let op = &doc["paths"][&path][method.to_lowercase()];
        let mut contents = vec![("request".to_string(), &op["requestBody"]["content"])];
        for (code, r) in op["responses"].as_object().expect("responses") {
            contents.push((code.clone(), &r["content"]));
        }
        for (what, content) in contents {
            let Some(content) = content.as_object() else {
                continue;
            };
            for (kind, c) in content {
                let Some(example) = c.get("example") else {
                    continue;
                };
                let schema = resolvable(&doc, &c["schema"]);
                let v = jsonschema::validator_for(&schema)
                    .unwrap_or_else(|e| panic!("{method} {path} {what}: {e}"));
                let errors: Vec<_> = v.iter_errors(example).map(|e| e.to_string()).collect();
                assert!(
                    errors.is_empty(),
                    "{method} {path} {what} {kind}: the example does not fit: {errors:?}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 25, "only {checked} examples");
}

#[test]
fn schemas_follow_serde() {
    // The derive reads serde's attributes; these are the ones a wrong schema would most
    // likely come from.
    let doc = doc();
    let s = &doc["components"]["schemas"];
    // A flattened, internally tagged body: `kind` in kebab-case beside `seq` and `ts`.
    let check = |schema: &str, value: Value, fits: bool| {
        let root = resolvable(
            &doc,
            &json!({"$ref": format!("#/components/schemas/{schema}")}),
        );
        let v = jsonschema::validator_for(&root).expect("compiles");
        assert_eq!(v.is_valid(&value), fits, "{schema}: {value}");
    };
    check(
        "Event",
        json!({"seq": 1, "ts": 2, "kind": "input-taken", "through": 3}),
        true,
    );
    check(
        "Event",
        json!({"seq": 1, "ts": 2, "kind": "input_taken", "through": 3}),
        false,
    );
    check("Event", json!({"seq": 1, "ts": 2, "kind": "cancel"}), true);
    // `quorum`: a number or "all", nothing else (untagged).
    check(
        "CreateWaitpoint",
        json!({"label": "l", "intent": "i", "quorum": "all"}),
        true,
    );
    check(
        "CreateWaitpoint",
        json!({"label": "l", "intent": "i", "quorum": 2}),
        true,
    );
    check(
        "CreateWaitpoint",
        json!({"label": "l", "intent": "i", "quorum": "most"}),
        false,
    );
    // deny_unknown_fields: a typo is refused, as the hub refuses it.
    check(
        "SignalRequest",
        json!({"id": "wp_1", "secret": "s", "stauts": "ok"}),
        false,
    );
    check(
        "SignalRequest",
        json!({"id": "wp_1", "secret": "s", "status": "progress"}),
        true,
    );
    // rename_all camelCase, and `match` renamed.
    check("StopConfig", json!({"durationMs": 5}), true);
    check("StopConfig", json!({"duration_ms": 5}), false);
    check(
        "CreateDeviceWait",
        json!({"kind": "log", "path": "/x", "match": "done", "silence": "20m"}),
        true,
    );
    check(
        "CreateDeviceWait",
        json!({"kind": "file", "path": "/x", "silence": 30}),
        true,
    );
    check(
        "CreateDeviceWait",
        json!({"kind": "pid", "pid": 7, "timeout_s": 60, "session": "s", "label": "l"}),
        true,
    );
    check(
        "CreateDeviceWait",
        json!({"kind": "pid", "pid": 7, "timeout": 60}),
        false,
    );
    // An optional field left out is fine; skip_serializing_if fields are not required.
    check("WaitpointRef", json!({"id": "wp_1", "label": "l"}), false);
    assert!(
        s["ErrorBody"]["required"] == json!(["error", "message"]),
        "{}",
        s["ErrorBody"]
    );
}
