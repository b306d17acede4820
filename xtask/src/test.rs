//! `cargo xtask test`: the project's one test command (README; `.ci/run` calls it).
//! Checks formatting, builds every binary (the end-to-end tests in `tests/` start the real
//! ones), then runs every test of the workspace. Extra arguments go to `cargo test`.

use anyhow::{Context, bail};
use std::process::Command;

fn cargo(args: &[&str]) -> anyhow::Result<()> {
    eprintln!("xtask: cargo {}", args.join(" "));
    let st = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .status()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !st.success() {
        bail!("cargo {} failed ({st})", args.join(" "));
    }
    Ok(())
}

pub fn run(extra: &[&str]) -> anyhow::Result<()> {
    cargo(&["fmt", "--all", "--check"]).context("formatting differs: run `cargo fmt --all`")?;
    cargo(&["build", "--workspace", "--bins"])?;
    let mut args = vec!["test", "--workspace"];
    args.extend_from_slice(extra);
    cargo(&args)
}

/// `cargo xtask torture [CYCLES]`: the crash torture test at full length (30 SIGKILL
/// cycles by default) on release binaries; `cargo xtask test` runs a short one.
pub fn torture(extra: &[&str]) -> anyhow::Result<()> {
    let cycles = match extra {
        [] => "30".to_string(),
        [n] => n
            .parse::<u32>()
            .with_context(|| format!("{n:?} is not a number of cycles"))?
            .to_string(),
        _ => bail!("usage: cargo xtask torture [CYCLES]"),
    };
    cargo(&["build", "--release", "--workspace", "--bins"])?;
    eprintln!("xtask: CORTEX_TORTURE_CYCLES={cycles}");
    let st = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "test",
            "--release",
            "-p",
            "cortex-tests",
            "--test",
            "it",
            "torture",
            "--",
            "--nocapture",
        ])
        .env("CORTEX_TORTURE_CYCLES", &cycles)
        .status()
        .context("running the torture test")?;
    if !st.success() {
        bail!("the torture test failed ({st})");
    }
    Ok(())
}
