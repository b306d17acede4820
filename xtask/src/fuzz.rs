//! `cargo xtask fuzz [--seconds N] [TARGET...]`: the long fuzz run. Builds `cortex-fuzz`
//! in release and runs each target (signal, frames, spool, journal; default all) for N
//! seconds (default 600), after replaying its corpus. It prints cases and failures per
//! target; every new failure is saved under `fuzz/corpus/<target>/` to be committed.

use anyhow::{Context, bail};
use std::process::Command;

const TARGETS: [&str; 4] = ["signal", "frames", "spool", "journal"];

pub fn run(args: &[&str]) -> anyhow::Result<()> {
    let mut seconds = 600u64;
    let mut targets = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match *a {
            "--seconds" => {
                let n = it.next().context("--seconds takes a number")?;
                seconds = n
                    .parse()
                    .with_context(|| format!("{n:?} is not a number of seconds"))?;
            }
            t if TARGETS.contains(&t) => targets.push(t),
            other => bail!(
                "unknown fuzz target or flag {other:?}; usage: cargo xtask fuzz [--seconds N] [{}]…",
                TARGETS.join("|")
            ),
        }
    }
    let seconds = seconds.to_string();
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args([
        "run",
        "--release",
        "-p",
        "cortex-fuzz",
        "--",
        "--seconds",
        &seconds,
    ])
    .args(&targets);
    eprintln!(
        "xtask: fuzzing {} for {seconds} s each",
        if targets.is_empty() {
            TARGETS.join(", ")
        } else {
            targets.join(", ")
        }
    );
    let st = cmd.status().context("running cortex-fuzz")?;
    if !st.success() {
        bail!("fuzzing found failures or could not run ({st}); see above");
    }
    Ok(())
}
