//! A test that the hub's modules import each other without a loop. It reads every file
//! under `src/`, lists each module's references to others (`crate::…`, `super::…`, and a
//! child named by a relative path such as `link::connection`) and looks for cycles: none
//! between top-level modules (`server`, `mesh`, `state`, …) and none between the files of
//! one. Run `cargo test -p cortex-hub layering -- --nocapture` to print the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level modules whose files may still use each other in a loop (a parent that
/// re-exports its children while they use its handle and error type). The rest may not.
const FILE_LOOPS_ALLOWED_IN: &[&str] = &[];

/// Module path (`mesh::link`, `` for the crate root) → file text.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("read src") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = p.strip_prefix(src).expect("under src").with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts == ["main"] {
                continue;
            }
            if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
                parts.pop();
            }
            let text = std::fs::read_to_string(&p).expect("read file");
            out.insert(parts.join("::"), code_only(&text));
        }
    }
    out
}

/// `text` with comments, strings and character literals blanked (lifetimes kept).
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c[i] == 'r'
            && (i == 0 || !ident(c[i - 1]) || c[i - 1] == 'b')
            && matches!(next, Some('"' | '#'))
        {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            while j < c.len() {
                if c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c[i] == '\'' && next == Some('\\') {
            i += 2;
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else if c[i] == '\'' && c.get(i + 2) == Some(&'\'') {
            i += 3;
            out.push_str("' '");
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The module `path` names: its longest prefix that is a module.
fn resolve(mods: &BTreeMap<String, String>, path: &[String]) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|m| mods.contains_key(m))
}

/// The paths after `kw::` in `code`: `a::b::C`, or each of a `{…}` group's.
fn paths_after(code: &str, kw: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let pat = format!("{kw}::");
    let mut from = 0;
    while let Some(at) = code[from..].find(&pat) {
        let start = from + at;
        from = start + pat.len();
        let before = code[..start].chars().next_back();
        if before.is_some_and(|b| b.is_alphanumeric() || b == '_' || b == ':') {
            continue;
        }
        let rest = &code[from..];
        let items: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let end = group
                .char_indices()
                .find(|&(_, ch)| {
                    match ch {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map_or(group.len(), |(i, _)| i);
            let mut items = Vec::new();
            let (mut depth, mut start) = (0, 0);
            for (i, ch) in group[..end].char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        items.push(&group[start..i]);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            items.push(&group[start..end]);
            items
        } else {
            vec![rest]
        };
        for item in items {
            let path: String = item
                .trim()
                .chars()
                .take_while(|ch| ch.is_alphanumeric() || *ch == '_' || *ch == ':' || *ch == '*')
                .collect();
            let parts: Vec<String> = path
                .split("::")
                .filter(|p| !p.is_empty())
                .map(String::from)
                .collect();
            if !parts.is_empty() {
                out.push(parts);
            }
        }
    }
    out
}

type Graph = BTreeMap<String, BTreeSet<String>>;

fn graph(mods: &BTreeMap<String, String>) -> Graph {
    let mut g = Graph::new();
    for (m, code) in mods {
        let here: Vec<String> = if m.is_empty() {
            Vec::new()
        } else {
            m.split("::").map(String::from).collect()
        };
        let parent = &here[..here.len().saturating_sub(1)];
        let mut refs = BTreeSet::new();
        for p in paths_after(code, "crate") {
            refs.extend(resolve(mods, &p));
        }
        for p in paths_after(code, "super") {
            // `use super::*` is an inline `mod tests` reaching its own file.
            if p.first().is_some_and(|s| s == "*") {
                continue;
            }
            let full: Vec<String> = parent.iter().cloned().chain(p).collect();
            refs.extend(resolve(mods, &full));
        }
        // Children named by a relative path (`link::connection`, `use writer::Job`).
        for child in mods.keys() {
            let Some(name) = child
                .strip_prefix(&format!("{m}::"))
                .or_else(|| m.is_empty().then_some(child.as_str()))
            else {
                continue;
            };
            if name.contains("::") || name.is_empty() {
                continue;
            }
            if !paths_after(code, name).is_empty() {
                refs.insert(child.clone());
            }
        }
        refs.remove(m);
        g.insert(m.clone(), refs);
    }
    g
}

fn cycles(g: &Graph) -> Vec<Vec<String>> {
    fn visit(
        g: &Graph,
        u: &str,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        found: &mut Vec<Vec<String>>,
    ) {
        stack.push(u.to_string());
        for v in g.get(u).into_iter().flatten() {
            if let Some(at) = stack.iter().position(|s| s == v) {
                let mut c = stack[at..].to_vec();
                c.push(v.clone());
                found.push(c);
            } else if !done.contains(v) {
                visit(g, v, stack, done, found);
            }
        }
        stack.pop();
        done.insert(u.to_string());
    }
    let (mut done, mut found) = (BTreeSet::new(), Vec::new());
    for u in g.keys() {
        if !done.contains(u) {
            visit(g, u, &mut Vec::new(), &mut done, &mut found);
        }
    }
    found
}

fn top(m: &str) -> String {
    m.split("::").next().unwrap_or_default().to_string()
}

fn show(g: &Graph) -> String {
    g.iter()
        .map(|(m, to)| {
            let to: Vec<&str> = to.iter().map(String::as_str).collect();
            format!(
                "{} -> {}\n",
                if m.is_empty() { "(crate)" } else { m },
                to.join(", ")
            )
        })
        .collect()
}

#[test]
fn no_two_modules_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = graph(&modules(&src));
    let mut tops = Graph::new();
    for (m, to) in &files {
        let t = tops.entry(top(m)).or_default();
        t.extend(to.iter().map(|x| top(x)).filter(|x| *x != top(m)));
    }
    println!("files:\n{}\ntop-level:\n{}", show(&files), show(&tops));
    let top_loops = cycles(&tops);
    assert!(top_loops.is_empty(), "top-level loops: {top_loops:?}");
    let file_loops: Vec<_> = cycles(&files)
        .into_iter()
        .filter(|c| {
            !c.iter()
                .all(|m| FILE_LOOPS_ALLOWED_IN.contains(&top(m).as_str()))
        })
        .collect();
    assert!(file_loops.is_empty(), "loops between files: {file_loops:?}");
}

#[test]
fn the_reader_sees_code_not_comments_or_strings() {
    let code = code_only(
        "use crate::a; // crate::b\nlet s = \"crate::c // x\"; let q = '\"'; /* crate::d */ crate::e::f(r#\"crate::g\"#); fn x<'a>() {}",
    );
    let found: Vec<String> = paths_after(&code, "crate")
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(found, ["a", "e::f"]);
    let group = paths_after("use crate::{secret, text::{X, Y}};", "crate");
    assert_eq!(
        group,
        [vec!["secret".to_string()], vec!["text".to_string()]]
    );
}
