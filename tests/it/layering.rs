//! The workspace's layering, read from the source: the rules docs/architecture.md draws,
//! each checked here so breaking one fails a test.
//!
//! The reader lists each module's references to others (`crate::…`, `super::…`, and a
//! child named by a relative path such as `link::connection`), comments and strings
//! blanked. On that graph:
//! - the hub: no loop between top-level modules (`server`, `mesh`, `state`, …) nor between
//!   any two files; the engine does no I/O and reads no clock; the store's kernel knows no
//!   domain; `state`, `registry`, `admission` and `intake` sit below `server` and `mesh`;
//!   only `store/` names redb and only `mesh/` the mesh's sockets;
//! - the CLI, protocol, cortex-host, cortex-daemon and the device agent: no loop between
//!   files (a child's use of what its parent module holds aside); protocol does no I/O;
//! - the crates: protocol depends on no workspace crate, cortex-host only on protocol, and
//!   the CLI's build (as cargo resolves it, features and all) holds no WebSocket stack, no
//!   log subscriber, no OpenAPI schema derive and no daemon crate.
//!
//! `cargo test -p cortex-tests --test it layering:: -- --nocapture` prints the graphs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`mesh::link`, `` for the crate root) → file text.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
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

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// A crate's files (module path → code) and their graph.
fn crate_graph(dir: &str) -> (BTreeMap<String, String>, Graph) {
    let mods = modules(&root().join(dir).join("src"));
    let g = graph(&mods);
    (mods, g)
}

/// Whether `m` is `of` or inside it.
fn within(m: &str, of: &str) -> bool {
    m == of || m.starts_with(&format!("{of}::"))
}

/// `g` without the edges from a module to one of its ancestors: a child using what its
/// parent module holds (its error type, a shared helper) is how Rust modules are built.
fn without_upward(g: &Graph) -> Graph {
    g.iter()
        .map(|(m, to)| {
            let kept = to
                .iter()
                .filter(|t| !(t.is_empty() || within(m, t)))
                .cloned()
                .collect();
            (m.clone(), kept)
        })
        .collect()
}

/// The I/O and clock names a pure module must not reach: `std::fs` and its kin, the
/// async runtime, the database, the host crate, and the clocks.
fn io_in(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for p in paths_after(code, "std") {
        if let Some(first) = p.first()
            && ["fs", "net", "process", "env", "thread", "io", "os"].contains(&first.as_str())
        {
            found.push(format!("std::{}", p.join("::")));
        }
        if p.iter().any(|s| s == "SystemTime" || s == "Instant") {
            found.push(format!("std::{}", p.join("::")));
        }
    }
    for krate in [
        "tokio",
        "tokio_stream",
        "redb",
        "rustix",
        "cortex_host",
        "cortex_daemon",
        "reqwest",
        "hyper",
        "axum",
    ] {
        if !paths_after(code, krate).is_empty() {
            found.push(format!("{krate}::"));
        }
    }
    for clock in ["SystemTime", "Instant"] {
        if words(code).any(|w| w == clock) {
            found.push(clock.to_string());
        }
    }
    found.sort();
    found.dedup();
    found
}

/// The modules `pick` keeps that reach I/O or a clock, with what they name ([`io_in`]).
fn io_of(mods: &BTreeMap<String, String>, pick: impl Fn(&str) -> bool) -> Vec<(&str, Vec<String>)> {
    mods.iter()
        .filter(|(m, _)| pick(m))
        .map(|(m, code)| (m.as_str(), io_in(code)))
        .filter(|(_, io)| !io.is_empty())
        .collect()
}

/// The identifiers in `code`.
fn words(code: &str) -> impl Iterator<Item = &str> {
    code.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
}

/// Each `(module, what)` in `mods` (those `pick` keeps) whose code names `what`.
fn naming<'a>(
    mods: &'a BTreeMap<String, String>,
    pick: impl Fn(&str) -> bool,
    what: &'a [&'a str],
) -> Vec<(&'a str, &'a str)> {
    mods.iter()
        .filter(|(m, _)| pick(m))
        .flat_map(|(m, code)| {
            what.iter()
                .filter(|w| !paths_after(code, w).is_empty())
                .map(move |w| (m.as_str(), *w))
        })
        .collect()
}

/// The edges of `g` from a module `from` keeps to one `to` keeps.
fn edges(g: &Graph, from: impl Fn(&str) -> bool, to: impl Fn(&str) -> bool) -> Vec<String> {
    g.iter()
        .filter(|(m, _)| from(m))
        .flat_map(|(m, ts)| {
            ts.iter()
                .filter(|t| to(t))
                .map(move |t| format!("{m} -> {t}"))
        })
        .collect()
}

#[test]
fn no_two_hub_modules_import_each_other() {
    let (_, files) = crate_graph("hub");
    let mut tops = Graph::new();
    for (m, to) in &files {
        let t = tops.entry(top(m)).or_default();
        t.extend(to.iter().map(|x| top(x)).filter(|x| *x != top(m)));
    }
    println!(
        "hub files:\n{}\nhub top-level:\n{}",
        show(&files),
        show(&tops)
    );
    let top_loops = cycles(&tops);
    assert!(top_loops.is_empty(), "top-level loops: {top_loops:?}");
    let file_loops = cycles(&files);
    assert!(file_loops.is_empty(), "loops between files: {file_loops:?}");
}

#[test]
fn no_two_files_import_each_other_in_the_other_crates() {
    for dir in ["cli", "protocol", "host", "daemon", "device-agent"] {
        let (_, files) = crate_graph(dir);
        println!("{dir} files:\n{}", show(&files));
        let loops = cycles(&without_upward(&files));
        assert!(loops.is_empty(), "{dir}: loops between files: {loops:?}");
    }
}

/// The engine does no I/O and reads no clock (time is passed in): it imports no other hub
/// module, nothing of the filesystem, the network, processes, the runtime or the
/// database, and no clock.
#[test]
fn the_engine_does_no_io_and_reads_no_clock() {
    let (mods, g) = crate_graph("hub");
    let engine = |m: &str| within(m, "engine");
    let out = edges(&g, engine, |t| !engine(t));
    assert!(out.is_empty(), "the engine imports hub modules: {out:?}");
    let io = io_of(&mods, engine);
    assert!(io.is_empty(), "the engine reaches I/O or a clock: {io:?}");
}

/// The store's kernel knows no domain: its files import only each other and the hub's
/// counters (`metrics`), never a domain module (the store's own tables and operations,
/// the engine, the server, …) nor the wire types.
#[test]
fn the_store_kernel_knows_no_domain() {
    let (mods, g) = crate_graph("hub");
    let kernel = |m: &str| within(m, "store::kernel");
    let out = edges(&g, kernel, |t| !(kernel(t) || t == "metrics"));
    assert!(out.is_empty(), "the kernel imports the domain: {out:?}");
    let wire = naming(&mods, kernel, &["cortex_protocol"]);
    assert!(wire.is_empty(), "the kernel names wire types: {wire:?}");
}

/// The directions the map states between the hub's modules.
#[test]
fn the_hub_layers_point_one_way() {
    let (mods, g) = crate_graph("hub");
    let below = |m: &str| ["state", "registry", "admission", "intake"].contains(&top(m).as_str());
    let above = |t: &str| ["server", "mesh"].contains(&top(t).as_str());
    let up = edges(&g, below, above);
    assert!(
        up.is_empty(),
        "below server and mesh, yet imports them: {up:?}"
    );
    let mesh_up = [
        edges(
            &g,
            |m| within(m, "mesh::waits"),
            |t| within(t, "mesh::link"),
        ),
        edges(&g, |m| within(m, "mesh::tls"), |t| t == "mesh"),
    ]
    .concat();
    assert!(
        mesh_up.is_empty(),
        "within mesh, against the grain: {mesh_up:?}"
    );
    let redb = naming(&mods, |m| top(m) != "store", &["redb"]);
    assert!(redb.is_empty(), "redb outside store/: {redb:?}");
    // PostgreSQL's client is the kernel's own: the domain works through `Tx` alone.
    let pg = naming(&mods, |m| !within(m, "store::kernel"), &["postgres"]);
    assert!(pg.is_empty(), "postgres outside store/kernel/: {pg:?}");
    let sockets = naming(
        &mods,
        |m| top(m) != "mesh",
        &["tokio_tungstenite", "cortex_daemon::connection"],
    );
    assert!(
        sockets.is_empty(),
        "the mesh's sockets outside mesh/: {sockets:?}"
    );
}

#[test]
fn protocol_does_no_io() {
    let (mods, _) = crate_graph("protocol");
    let io = io_of(&mods, |_| true);
    assert!(io.is_empty(), "protocol reaches I/O or a clock: {io:?}");
}

/// A crate's `[dependencies]` (normal ones, by package name) from its Cargo.toml.
fn dependencies(dir: &str) -> BTreeSet<String> {
    let path = root().join(dir).join("Cargo.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = BTreeSet::new();
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
            continue;
        }
        if !inside || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name: String = line
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        out.insert(name);
    }
    out
}

/// The workspace crates' directories by package name.
const CRATES: &[(&str, &str)] = &[
    ("cortex-protocol", "protocol"),
    ("cortex-host", "host"),
    ("cortex-daemon", "daemon"),
    ("cortex-hub", "hub"),
    ("cortex-device-agent", "device-agent"),
    ("cortex-cli", "cli"),
];

#[test]
fn the_crates_depend_as_drawn() {
    let workspace = |deps: &BTreeSet<String>| -> Vec<String> {
        deps.iter()
            .filter(|d| CRATES.iter().any(|(name, _)| name == d))
            .cloned()
            .collect()
    };
    assert_eq!(
        workspace(&dependencies("protocol")),
        Vec::<String>::new(),
        "protocol"
    );
    assert_eq!(
        workspace(&dependencies("host")),
        ["cortex-protocol"],
        "cortex-host"
    );
    let cli = built("cortex-cli");
    let never = [
        "cortex-daemon",
        "cortex-hub",
        "cortex-device-agent",
        "tokio-tungstenite",
        "tracing-subscriber",
        "utoipa",
    ];
    let linked: Vec<_> = never.iter().filter(|n| cli.contains(**n)).collect();
    assert!(
        linked.is_empty(),
        "the CLI links {linked:?} (through {cli:?})"
    );
    // The hub does build the schemas: the check above reads a real resolution.
    assert!(
        built("cortex-hub").contains("utoipa"),
        "the hub builds no utoipa"
    );
}

/// The packages `package`'s normal build compiles, as cargo resolves them (its enabled
/// features decide which optional dependencies are in).
fn built(package: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}", "-p", package])
        .current_dir(root())
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
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
