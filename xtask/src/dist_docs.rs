//! `cargo xtask completions --out DIR` and `cargo xtask man --out DIR`: shell completions
//! (bash, zsh, fish, elvish, PowerShell) and man pages (one per command and subcommand,
//! section 1) for `cortex`, `cortex-signal`, `cortex-hub` and `cortex-device-agent`, built
//! from the same clap definitions their `--help` prints, which each crate's library holds.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::CommandFactory;
use clap_complete::Shell;

/// The four binaries' command lines, as their `--help` prints them.
pub fn commands() -> Vec<clap::Command> {
    packaged().into_iter().map(|(_, cmd)| cmd).collect()
}

/// Each binary's command line with the Debian package that ships it (`cargo xtask deb`).
pub fn packaged() -> [(&'static str, clap::Command); 4] {
    [
        ("cortex-cli", cortex_cli::cmd::Cli::command()),
        ("cortex-cli", cortex_cli::signal::SignalArgs::command()),
        ("cortex-hub", cortex_hub::cli::Args::command()),
        (
            "cortex-device-agent",
            cortex_device_agent::cli::Args::command(),
        ),
    ]
}

/// `--out DIR` from the task's arguments.
fn out_dir(args: &[&str], task: &str) -> anyhow::Result<PathBuf> {
    match args {
        ["--out", dir] => Ok(PathBuf::from(dir)),
        _ => anyhow::bail!("usage: cargo xtask {task} --out DIR"),
    }
}

pub fn run_completions(args: &[&str]) -> anyhow::Result<()> {
    let dir = out_dir(args, "completions")?;
    for path in completions(&dir)? {
        println!("{}", path.display());
    }
    Ok(())
}

pub fn run_man(args: &[&str]) -> anyhow::Result<()> {
    let dir = out_dir(args, "man")?;
    for path in man(&dir)? {
        println!("{}", path.display());
    }
    Ok(())
}

/// Writes every binary's completion script for every shell into `dir`; returns the files.
pub fn completions(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for cmd in commands() {
        written.extend(completions_of(cmd, dir)?);
    }
    Ok(written)
}

/// One binary's completion scripts, every shell, into `dir`.
pub fn completions_of(mut cmd: clap::Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = cmd.get_name().to_string();
    let mut written = Vec::new();
    for shell in [
        Shell::Bash,
        Shell::Zsh,
        Shell::Fish,
        Shell::Elvish,
        Shell::PowerShell,
    ] {
        let path = clap_complete::generate_to(shell, &mut cmd, &name, dir)
            .with_context(|| format!("writing {name}'s {shell} completions"))?;
        written.push(path);
    }
    Ok(written)
}

/// Writes a man page for every binary and each of its subcommands into `dir`
/// (`cortex.1`, `cortex-wait.1`, `cortex-wait-for.1`, …); returns the files.
pub fn man(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for cmd in commands() {
        written.extend(man_of(cmd, dir)?);
    }
    Ok(written)
}

/// One binary's man pages (its own and its subcommands') into `dir`.
pub fn man_of(mut cmd: clap::Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    // Built, so global flags (--hub, --json) appear on each subcommand's page too.
    cmd.build();
    let name = cmd.get_name().to_string();
    page(&cmd, &name, dir, &mut written)?;
    Ok(written)
}

/// `cmd`'s page as `name.1`, then its subcommands' as `name-SUB.1`.
fn page(
    cmd: &clap::Command,
    name: &str,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    let named = cmd
        .clone()
        .display_name(name.to_string())
        .version(env!("CARGO_PKG_VERSION"));
    let mut buf = Vec::new();
    clap_mangen::Man::new(named)
        .render(&mut buf)
        .with_context(|| format!("rendering the man page of {name}"))?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, buf).with_context(|| format!("writing {}", path.display()))?;
    written.push(path);
    for sub in cmd.get_subcommands() {
        // clap's own `help` subcommand has no page of its own.
        if sub.get_name() == "help" || sub.is_hide_set() {
            continue;
        }
        page(sub, &format!("{name}-{}", sub.get_name()), dir, written)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
