//! Real MCP clients for the tests: `tests/mcp/client.py` on the official Python SDK (PyPI
//! `mcp`, in the virtualenv `.ci/run` makes at `target/mcp-venv`, or the interpreter
//! `CORTEX_TEST_MCP_PYTHON` names). A client holds one connection; each command is a JSON
//! line in, a JSON line out, read with a bound.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use serde_json::{Value, json};

use crate::{Hub, bin, target_dir};

/// The Python with the SDK, or `None` (said, and a failure under `CI=true`).
pub fn python_or_skip(what: &str) -> Option<PathBuf> {
    let p = std::env::var_os("CORTEX_TEST_MCP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("../mcp-venv/bin/python"));
    let ok = Command::new(&p)
        .args(["-c", "import mcp"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return Some(p);
    }
    missing(
        what,
        &format!("no Python with the MCP SDK at {}", p.display()),
        "python3 -m venv target/mcp-venv && target/mcp-venv/bin/pip install mcp==2.3.0",
    )
}

/// A client that is not installed: a failure under `CI=true` (`.ci/run` installs it),
/// else the test is skipped, saying why and how to install it.
fn missing<T>(what: &str, lack: &str, install: &str) -> Option<T> {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{what}: {lack}; .ci/run installs it ({install})");
    }
    println!("{what}: skipped: {lack} ({install})");
    None
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mcp/client.py")
}

/// The directory holding the official TypeScript SDK (`.ci/run` installs it in
/// `target/mcp-node`, or `CORTEX_TEST_MCP_NODE` names one), with `node` on the PATH; or
/// `None` (said, and a failure under `CI=true`).
pub fn node_or_skip(what: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("CORTEX_TEST_MCP_NODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("../mcp-node"));
    let sdk = dir.join("node_modules/@modelcontextprotocol/sdk/package.json");
    let node = Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if node && sdk.exists() {
        return Some(dir);
    }
    missing(
        what,
        &format!("no node with the MCP TypeScript SDK in {}", dir.display()),
        "npm install --prefix target/mcp-node @modelcontextprotocol/sdk@1.32.2",
    )
}

/// Claude Code's own `claude` (`.ci/run` installs npm `@anthropic-ai/claude-code` in
/// `target/claude-code`, or `CORTEX_TEST_CLAUDE` names the binary); or `None` (said, and
/// a failure under `CI=true`).
pub fn claude_or_skip(what: &str) -> Option<PathBuf> {
    let p = std::env::var_os("CORTEX_TEST_CLAUDE")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("../claude-code/node_modules/.bin/claude"));
    let ok = Command::new(&p)
        .arg("--version")
        .env("DISABLE_AUTOUPDATER", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return Some(p);
    }
    missing(
        what,
        &format!("no Claude Code at {}", p.display()),
        "npm install --prefix target/claude-code @anthropic-ai/claude-code@2.1.197",
    )
}

/// How a client reaches the hub.
pub enum Via<'a> {
    /// Streamable HTTP at the hub's `/mcp`, with these extra flags (`--token` is added
    /// unless one is given).
    Http(&'a [&'a str]),
    /// `cortex mcp` with these extra arguments, started by the client as its server.
    Stdio(&'a [&'a str]),
}

/// One client and its connection.
pub struct McpClient {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// The revision it negotiated.
    pub protocol: String,
    stderr: PathBuf,
    _dir: tempfile::TempDir,
}

impl McpClient {
    /// Starts a client (`mode`: `legacy` for the handshake, `auto` for 2026-07-28;
    /// `tasks`: it declares the tasks extension) and waits for its connection.
    pub fn start(
        py: &std::path::Path,
        hub: &Hub,
        via: Via<'_>,
        mode: &str,
        tasks: bool,
    ) -> Result<McpClient, String> {
        McpClient::start_as(py, hub, via, mode, tasks, "mcp")
    }

    /// [`McpClient::start`], the client naming itself `name` in its handshake.
    pub fn start_as(
        py: &std::path::Path,
        hub: &Hub,
        via: Via<'_>,
        mode: &str,
        tasks: bool,
        name: &str,
    ) -> Result<McpClient, String> {
        McpClient::start_with(py, hub, via, mode, tasks, &["--client-name", name])
    }

    /// [`McpClient::start`] with more of the client's flags (`--elicit accept`: its person
    /// approves what it is asked through the client).
    pub fn start_with(
        py: &std::path::Path,
        hub: &Hub,
        via: Via<'_>,
        mode: &str,
        tasks: bool,
        flags: &[&str],
    ) -> Result<McpClient, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(py);
        cmd.arg(script()).args(["--mode", mode]).args(flags);
        if tasks {
            cmd.arg("--tasks");
        }
        McpClient::spawn(cmd, dir, hub, via)
    }

    /// Starts the TypeScript SDK's client (`tests/mcp/client.mjs`, beside the SDK in
    /// `node_dir`; it speaks 2025-11-25 and its tasks).
    pub fn start_node(
        node_dir: &std::path::Path,
        hub: &Hub,
        via: Via<'_>,
    ) -> Result<McpClient, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        // The script beside the SDK's modules, as node resolves them from the script.
        let js = dir.path().join("client.mjs");
        std::fs::copy(script().with_file_name("client.mjs"), &js).map_err(|e| e.to_string())?;
        std::os::unix::fs::symlink(
            node_dir.join("node_modules"),
            dir.path().join("node_modules"),
        )
        .map_err(|e| e.to_string())?;
        let mut cmd = Command::new("node");
        cmd.arg(js);
        McpClient::spawn(cmd, dir, hub, via)
    }

    fn spawn(
        mut cmd: Command,
        dir: tempfile::TempDir,
        hub: &Hub,
        via: Via<'_>,
    ) -> Result<McpClient, String> {
        match via {
            Via::Http(extra) => {
                cmd.args(["--http", &hub.url("/mcp")]);
                if !extra.contains(&"--token") {
                    cmd.args(["--token", &hub.token]);
                }
                cmd.args(extra);
            }
            Via::Stdio(extra) => {
                cmd.arg("--stdio")
                    .arg(bin("cortex"))
                    .args(["--hub", &hub.url("")])
                    .arg("mcp")
                    .args(extra)
                    .env("CORTEX_WEBHOOK_TOKEN", &hub.token)
                    .env_remove("CORTEX_HUB");
            }
        }
        let stderr = dir.path().join("stderr");
        let file = std::fs::File::create(&stderr).map_err(|e| e.to_string())?;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(file)
            .spawn()
            .map_err(|e| format!("spawn {cmd:?}: {e}"))?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut c = McpClient {
            child,
            stdin,
            lines,
            protocol: String::new(),
            stderr,
            _dir: dir,
        };
        let ready = c.read(Duration::from_secs(30))?;
        match ready["ready"].as_bool() {
            Some(true) => {
                c.protocol = ready["protocol"].as_str().unwrap_or("").to_string();
                Ok(c)
            }
            _ => Err(format!(
                "the client did not connect: {ready} {}",
                c.stderr()
            )),
        }
    }

    fn read(&mut self, limit: Duration) -> Result<Value, String> {
        match self.lines.recv_timeout(limit) {
            Ok(l) => serde_json::from_str(&l).map_err(|e| format!("{e}: {l}")),
            Err(_) => Err(format!(
                "the client said nothing within {limit:?}; its stderr:\n{}",
                self.stderr()
            )),
        }
    }

    /// The client's stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Sends one command and reads its answer (within `limit`).
    pub fn ask_within(&mut self, cmd: Value, limit: Duration) -> Value {
        let stdin = self.stdin.as_mut().expect("the client's stdin");
        writeln!(stdin, "{cmd}").expect("write to the client");
        stdin.flush().expect("flush");
        match self.read(limit) {
            Ok(v) => v,
            Err(e) => panic!("{cmd}: {e}"),
        }
    }

    /// Sends one command without reading its answer ([`McpClient::answer`] reads it).
    pub fn send(&mut self, cmd: Value) {
        let stdin = self.stdin.as_mut().expect("the client's stdin");
        writeln!(stdin, "{cmd}").expect("write to the client");
        stdin.flush().expect("flush");
    }

    /// The next answer, within `limit`.
    pub fn answer(&mut self, limit: Duration) -> Value {
        self.read(limit).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn ask(&mut self, cmd: Value) -> Value {
        self.ask_within(cmd, Duration::from_secs(60))
    }

    /// `tools/call` of `name` with `args`: `{ok, text, structured, progress}`.
    pub fn call(&mut self, name: &str, args: Value) -> Value {
        self.ask(json!({"op": "call", "name": name, "args": args}))
    }
}

impl Drop for McpClient {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
