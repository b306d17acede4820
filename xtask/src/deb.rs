//! `cargo xtask deb`: the three Debian packages (cortex-hub, cortex-cli,
//! cortex-device-agent) from the release binaries, through cargo-deb and each crate's
//! `[package.metadata.deb]` (the binaries, the units, the docs).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};

/// The crates that ship as packages, with their package names.
pub const PACKAGES: [&str; 3] = ["cortex-hub", "cortex-cli", "cortex-device-agent"];

/// `cargo xtask dist`: the man pages and shell completions the packages ship, by
/// package: `TARGET/dist/PACKAGE/man/*.1` and `TARGET/dist/PACKAGE/completions/`, where each
/// crate's `[package.metadata.deb]` takes them from.
pub fn run_dist(args: &[&str]) -> anyhow::Result<()> {
    if !args.is_empty() {
        bail!("usage: cargo xtask dist");
    }
    let root = crate::bench_kit::workspace_root();
    dist(&crate::bench_kit::target_dir(&root))
}

fn dist(target: &std::path::Path) -> anyhow::Result<()> {
    let dist = target.join("dist");
    // Nothing stale from a command since renamed.
    for package in PACKAGES {
        let _ = std::fs::remove_dir_all(dist.join(package));
    }
    for (package, cmd) in crate::dist_docs::packaged() {
        let dir = dist.join(package);
        crate::dist_docs::man_of(cmd.clone(), &dir.join("man"))?;
        crate::dist_docs::completions_of(cmd, &dir.join("completions"))?;
    }
    eprintln!("xtask: man pages and completions in {}", dist.display());
    Ok(())
}

pub fn run(args: &[&str]) -> anyhow::Result<()> {
    let mut out: Option<PathBuf> = None;
    let mut build = true;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match *a {
            "--out" => out = Some(it.next().context("--out needs a directory")?.into()),
            "--no-build" => build = false,
            other => {
                bail!("unknown argument {other:?}; usage: cargo xtask deb [--out DIR] [--no-build]")
            }
        }
    }
    let root = crate::bench_kit::workspace_root();
    let out = out.unwrap_or_else(|| crate::bench_kit::target_dir(&root).join("debian"));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let has_deb = Command::new(&cargo)
        .args(["deb", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_deb {
        bail!("cargo-deb is not installed: cargo install cargo-deb --locked");
    }
    if build {
        crate::bench_kit::cargo_build(&root, &PACKAGES)?;
    }
    dist(&crate::bench_kit::target_dir(&root))?;
    for p in PACKAGES {
        let st = Command::new(&cargo)
            .current_dir(&root)
            .args(["deb", "-p", p, "--no-build", "--no-strip", "-o"])
            .arg(&out)
            .status()
            .with_context(|| format!("running cargo deb -p {p}"))?;
        if !st.success() {
            bail!("cargo deb -p {p} failed ({st})");
        }
    }
    eprintln!("xtask: the packages are in {}", out.display());
    Ok(())
}
