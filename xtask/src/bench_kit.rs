//! What the benches share: the machine's CPU accounting and quiet-machine waiting
//! ([`cpu`]), process and scratch-directory guards ([`procs`]), a release hub on loopback
//! ([`hub`]), the report's facts and number formats ([`report`]), and (here) one blocking
//! HTTP request over `ureq` for the benches' setup and checks (never on a measured path),
//! and finding and building the release binaries and tools.

pub mod agent;
pub mod cpu;
pub mod hub;
pub mod procs;
pub mod report;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, ensure};

/// Bound on one setup request (a long poll included).
const HTTP_TIMEOUT: Duration = Duration::from_secs(60);

/// An answer: the status code and the body.
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; `what` names the request in the error.
    pub fn json(&self, what: &str) -> anyhow::Result<serde_json::Value> {
        serde_json::from_slice(&self.body)
            .with_context(|| format!("{what}: the answer is not JSON: {}", self.text()))
    }

    /// The body as JSON of an answer that must have status `want`.
    pub fn expect(&self, want: u16, what: &str) -> anyhow::Result<serde_json::Value> {
        anyhow::ensure!(
            self.status == want,
            "{what}: HTTP {} (wanted {want}): {}",
            self.status,
            self.text()
        );
        self.json(what)
    }
}

/// The largest answer a bench reads.
const MAX_REPLY_BYTES: u64 = 256 << 20;

/// One request to `http://ADDR/PATH` (JSON body, bearer token if given) on a connection of
/// its own; any status is an answer.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: Option<&[u8]>,
) -> anyhow::Result<Reply> {
    request_on(&agent(), addr, method, path, bearer, body)
}

/// A client whose connections are kept alive between requests (for thousands of requests
/// from one thread, which would otherwise each leave a socket in TIME_WAIT). No proxy and
/// no redirects: the benches talk only to their own loopback servers.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .proxy(None)
        .timeout_global(Some(HTTP_TIMEOUT))
        .build()
        .into()
}

/// [`request`] through `agent` (its kept-alive connection when it has one).
pub fn request_on(
    agent: &ureq::Agent,
    addr: SocketAddr,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: Option<&[u8]>,
) -> anyhow::Result<Reply> {
    let url = format!("http://{addr}{path}");
    let what = || format!("{method} {url}");
    let mut req = ureq::http::Request::builder().method(method).uri(&url);
    if let Some(t) = bearer {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let answer = match body {
        Some(b) => agent.run(
            req.header("Content-Type", "application/json")
                .body(b)
                .with_context(what)?,
        ),
        None => agent.run(req.body(()).with_context(what)?),
    };
    let (parts, mut body) = answer.with_context(what)?.into_parts();
    // A waitpoint's view lists its latest 1,000 signals: 16 KB bodies make it ~16 MB,
    // past ureq's default 10 MiB cap.
    let body = body
        .with_config()
        .limit(MAX_REPLY_BYTES)
        .read_to_vec()
        .with_context(what)?;
    Ok(Reply {
        status: parts.status.as_u16(),
        body,
    })
}

/// A bench's flags (everything after `cargo xtask bench NAME`), parsed by clap: an
/// unknown flag, a missing value or one out of range is an error that names it and lists
/// the flags.
pub fn parse_flags<T: clap::Parser>(args: &[&str]) -> anyhow::Result<T> {
    let name = T::command().get_name().to_string();
    let argv = std::iter::once(name.as_str()).chain(args.iter().copied());
    T::try_parse_from(argv).map_err(|e| anyhow::anyhow!("{}", e.render()))
}

pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map_or(manifest.clone(), Path::to_path_buf)
}

pub fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|v| !v.is_empty())
        .map_or_else(|| root.join("target"), PathBuf::from)
}

/// `cargo build --release --quiet -p P…` in the workspace.
pub fn cargo_build(root: &Path, packages: &[&str]) -> anyhow::Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args(["build", "--release", "--quiet"]);
    for p in packages {
        cmd.args(["-p", p]);
    }
    let shown = packages
        .iter()
        .map(|p| format!("-p {p}"))
        .collect::<Vec<_>>()
        .join(" ");
    eprintln!("bench: cargo build --release {shown}");
    let status = cmd.status().context("running cargo")?;
    ensure!(status.success(), "cargo build --release {shown}: {status}");
    Ok(())
}

/// Whether `name` is an executable file in one of PATH's directories.
pub fn on_path(name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            std::fs::metadata(d.join(name))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// The first line a `--version`-like flag prints (stdout or stderr), for the report.
pub fn version(cmd: &str, flag: &str) -> String {
    let out = Command::new(cmd).arg(flag).stdin(Stdio::null()).output();
    match out {
        Ok(o) => {
            let text = [o.stdout, o.stderr].concat();
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("?")
                .trim()
                .to_string()
        }
        Err(_) => "?".to_string(),
    }
}

/// One of a daemon's timing records (`CORTEX_TIMING_FILE`, one JSON line each): its
/// event, its wait and its time in ns since the epoch; `None` for a line that is not one
/// (another shape, or cut).
pub fn timing_record(line: &str) -> Option<(String, String, i128)> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let event = v["event"].as_str()?.to_string();
    let wait = v["wait"].as_str()?.to_string();
    let us = v["us"].as_u64()?;
    Some((event, wait, i128::from(us) * 1_000))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn request_sends_the_token_and_body_and_reads_any_status() -> anyhow::Result<()> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let server = std::thread::spawn(move || -> anyhow::Result<String> {
            let (mut s, _) = listener.accept()?;
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&got).contains("{\"a\":1}") {
                let n = s.read(&mut buf)?;
                ensure!(n > 0, "closed early");
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 409 Conflict\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")?;
            Ok(String::from_utf8_lossy(&got).into_owned())
        });
        let r = request(addr, "POST", "/api/x", Some("tok"), Some(b"{\"a\":1}"))?;
        assert_eq!((r.status, r.text().as_str()), (409, "abcde"));
        let sent = server
            .join()
            .map_err(|_| anyhow::anyhow!("server panicked"))??;
        assert!(sent.starts_with("POST /api/x HTTP/1.1\r\n"), "{sent}");
        assert!(
            sent.to_ascii_lowercase()
                .contains("authorization: bearer tok"),
            "{sent}"
        );
        Ok(())
    }
}
