//! `cargo xtask test`: the project's one test command (README; `.ci/run` calls it).
//! Checks formatting, lints every crate and target with clippy (the workspace lints; any
//! warning fails), builds every binary (the end-to-end tests in `tests/` start the real
//! ones), then runs every test of the workspace, and the end-to-end tests a second time
//! with every hub's store on PostgreSQL. Extra arguments go to `cargo test`.

use anyhow::{Context, bail};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

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
    // `--workspace`: the root's default members leave out xtask itself.
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])
    .context("clippy warns: fix them (see above)")?;
    cargo(&["build", "--workspace", "--bins"])?;
    let mut args = vec!["test", "--workspace"];
    args.extend_from_slice(extra);
    let redb = cargo_test(&args, &[])?;
    // The whole-system tests again, every hub's store on PostgreSQL (a throwaway cluster
    // of Debian's server, a database per hub home): the contract is the same on both.
    let mut args = vec!["test", "-p", "cortex-tests", "--test", "it"];
    args.extend_from_slice(extra);
    let pg = cargo_test(&args, &[("CORTEX_TEST_STORE", "postgres")])?;
    println!(
        "tests: {} passed, {} failed, {} skipped (of which on PostgreSQL: {} passed, {} skipped)",
        redb.passed + pg.passed,
        redb.failed + pg.failed,
        redb.ignored + pg.ignored,
        pg.passed,
        pg.ignored
    );
    if redb.passed == 0 || pg.passed == 0 {
        bail!("cargo test ran no test");
    }
    Ok(())
}

/// Runs `cargo ARGS` with `env`, its output passed through, and sums its results (cargo's
/// own last line is the last crate's doc tests, often "0 passed").
fn cargo_test(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Totals> {
    let vars: String = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    eprintln!("xtask: {vars}cargo {}", args.join(" "));
    let mut child = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .spawn()
        .context("running cargo test")?;
    let out = child.stdout.take().context("cargo test's stdout")?;
    let mut total = Totals::default();
    for line in BufReader::new(out).lines() {
        let line = line.context("reading cargo test's output")?;
        println!("{line}");
        total.add(&line);
    }
    let st = child.wait().context("waiting for cargo test")?;
    if !st.success() {
        bail!("{vars}cargo test failed ({st})");
    }
    Ok(total)
}

/// Sums of cargo's `test result:` lines.
#[derive(Debug, Default, PartialEq)]
struct Totals {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl Totals {
    /// Adds `test result: ok. 5 passed; 0 failed; 1 ignored; …`; other lines are ignored.
    fn add(&mut self, line: &str) {
        let Some(rest) = line.strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

/// `cargo xtask torture [CYCLES]`: the crash torture test at full length (30 SIGKILL
/// cycles by default) on release binaries; `cargo xtask test` runs a short one.
pub fn torture(extra: &[&str]) -> anyhow::Result<()> {
    let cycles = cycles(extra, "torture")?;
    release_it_test(
        "torture",
        &[("CORTEX_TORTURE_CYCLES", &cycles)],
        &[],
        "the torture test",
    )
}

/// A torture's `[CYCLES]` argument (default 30), as text for its variable.
fn cycles(extra: &[&str], command: &str) -> anyhow::Result<String> {
    match extra {
        [] => Ok("30".to_string()),
        [n] => Ok(n
            .parse::<u32>()
            .with_context(|| format!("{n:?} is not a number of cycles"))?
            .to_string()),
        _ => bail!("usage: cargo xtask {command} [CYCLES]"),
    }
}

/// `cargo xtask cluster-torture [CYCLES]`: the cluster torture at full length (30 cycles).
pub fn cluster_torture(extra: &[&str]) -> anyhow::Result<()> {
    let cycles = cycles(extra, "cluster-torture")?;
    release_it_test(
        "cluster_torture",
        &[("CORTEX_CLUSTER_TORTURE_CYCLES", &cycles)],
        &[],
        "the cluster torture",
    )
}

/// Builds every binary in release, then runs the `it` tests matching `filter` in release
/// with `env` set and their output shown (`args` go to the test harness): the long forms
/// of the tortures, which print their counts as they go.
pub fn release_it_test(
    filter: &str,
    env: &[(&str, &str)],
    args: &[&str],
    what: &str,
) -> anyhow::Result<()> {
    cargo(&["build", "--release", "--workspace", "--bins"])?;
    let vars: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    eprintln!("xtask: {}", vars.join(" "));
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args([
        "test",
        "--release",
        "-p",
        "cortex-tests",
        "--test",
        "it",
        filter,
        "--",
        "--nocapture",
    ])
    .args(args)
    .envs(env.iter().copied());
    let st = cmd.status().with_context(|| format!("running {what}"))?;
    if !st.success() {
        bail!("{what} failed ({st})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Totals;

    #[test]
    fn sums_cargo_result_lines() {
        let mut t = Totals::default();
        t.add("test result: ok. 79 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.17s");
        t.add("test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out");
        t.add("running 4 tests");
        assert_eq!(
            t,
            Totals {
                passed: 82,
                failed: 1,
                ignored: 2
            }
        );
    }
}
