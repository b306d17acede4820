//! `cargo xtask powerloss [CUTS] [--journaled]`: the power-loss torture at full length (30
//! cuts by default, for the hub and for a device agent) on release binaries, printing its
//! counts; `cargo xtask test` runs a short one. It runs with lazyfs's strict POSIX names
//! (a name is durable only with its directory's fsync); `--journaled` makes any fsync
//! commit earlier names, as ext4 or XFS would.

use anyhow::Context;

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
    let names = if strict { "strict" } else { "journaled" };
    // One test at a time: each prints its cuts in order, and neither slows the other.
    crate::test::release_it_test(
        "powerloss",
        &[
            ("CORTEX_POWERLOSS_CUTS", &cuts),
            ("CORTEX_POWERLOSS_NAMES", names),
        ],
        &["--test-threads", "1"],
        "the power-loss test",
    )
}
