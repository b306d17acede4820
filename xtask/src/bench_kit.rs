//! What the benches share: the machine's CPU accounting and quiet-machine waiting
//! ([`cpu`]), a small blocking HTTP client ([`http`]), process and scratch-directory guards
//! ([`procs`]), a release hub on loopback ([`hub`]), the report's facts and number formats
//! ([`report`]), and finding and building the release binaries and tools (here).

pub mod cpu;
pub mod http;
pub mod hub;
pub mod procs;
pub mod report;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, ensure};

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
