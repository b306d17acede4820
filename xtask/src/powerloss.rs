//! `cargo xtask powerloss [CUTS] [--journaled]`: the power-loss torture at full length (30
//! cuts by default, for the hub and for a device agent) on release binaries, printing its
//! counts; `cargo xtask test` runs a short one. It runs with lazyfs's strict POSIX names
//! (a name is durable only with its directory's fsync); `--journaled` makes any fsync
//! commit earlier names, as ext4 or XFS would.

use anyhow::{Context, bail};
use std::process::Command;

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

pub fn run(extra: &[&str]) -> anyhow::Result<()> {
    let mut cuts = "30".to_string();
    let mut strict = true;
    for a in extra {
        match *a {
            "--strict" => strict = true,
            "--journaled" => strict = false,
            n => {
                cuts = n
                    .parse::<u32>()
                    .with_context(|| format!("{n:?} is not a number of cuts"))?
                    .to_string()
            }
        }
    }
    eprintln!("xtask: cargo build --release --workspace --bins");
    let st = cargo()
        .args(["build", "--release", "--workspace", "--bins"])
        .status()
        .context("running cargo build")?;
    if !st.success() {
        bail!("cargo build failed ({st})");
    }
    let names = if strict { "strict" } else { "journaled" };
    eprintln!("xtask: CORTEX_POWERLOSS_CUTS={cuts} CORTEX_POWERLOSS_NAMES={names}");
    // One test at a time: each prints its cuts in order, and neither slows the other.
    let st = cargo()
        .args([
            "test",
            "--release",
            "-p",
            "cortex-tests",
            "--test",
            "it",
            "powerloss",
            "--",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("CORTEX_POWERLOSS_CUTS", &cuts)
        .env("CORTEX_POWERLOSS_NAMES", names)
        .status()
        .context("running the power-loss test")?;
    if !st.success() {
        bail!("the power-loss test failed ({st})");
    }
    Ok(())
}
