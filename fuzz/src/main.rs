//! `cortex-fuzz [--seconds N] [--cases N] [TARGET...]`: each target's corpus replayed,
//! then generated cases for N seconds (default 600) or N cases, whichever ends first;
//! prints cases and failures per target and fails when any property did not hold.
//! `cortex-fuzz --write-seeds` writes the targets' valid seed inputs into the corpus.
//! `cargo xtask fuzz` builds and runs it.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use cortex_fuzz::{Budget, TARGETS, driver};

const USAGE: &str = "usage: cortex-fuzz [--seconds N] [--cases N] [TARGET...] | --write-seeds
targets: signal, frames, spool, journal (default: all)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut budget = Budget {
        time: Duration::from_secs(600),
        max_cases: u64::MAX,
    };
    let mut names: Vec<&str> = Vec::new();
    let mut it = args.iter().map(String::as_str);
    while let Some(a) = it.next() {
        match a {
            "--seconds" | "--cases" => {
                let Some(n) = it.next().and_then(|v| v.parse::<u64>().ok()) else {
                    eprintln!("cortex-fuzz: {a} takes a number\n{USAGE}");
                    return ExitCode::from(2);
                };
                if a == "--seconds" {
                    budget.time = Duration::from_secs(n);
                } else {
                    budget.max_cases = n;
                }
            }
            "--write-seeds" => {
                for t in &TARGETS {
                    match driver::write_seeds(t) {
                        Ok(n) => println!("{}: {n} seeds written", t.name),
                        Err(e) => {
                            eprintln!("cortex-fuzz: {}: cannot write seeds: {e}", t.name);
                            return ExitCode::FAILURE;
                        }
                    }
                }
                return ExitCode::SUCCESS;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            name if TARGETS.iter().any(|t| t.name == name) => names.push(name),
            other => {
                eprintln!("cortex-fuzz: unknown target or flag {other:?}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let mut failed = 0usize;
    let mut passed = 0usize;
    for t in TARGETS
        .iter()
        .filter(|t| names.is_empty() || names.contains(&t.name))
    {
        let start = Instant::now();
        let replayed = driver::corpus_files(t.name).len();
        let bad = driver::replay(t);
        for (path, why) in &bad {
            println!("{}: corpus file {} fails: {why}", t.name, path.display());
        }
        let known = bad.iter().map(|(_, why)| driver::signature(why)).collect();
        let out = (t.fuzz)(budget, known);
        for f in &out.failures {
            println!(
                "{}: FAILURE: {} (input saved at {})",
                t.name,
                f.reason,
                f.saved
                    .as_ref()
                    .map_or_else(|| "nowhere".into(), |p| p.display().to_string())
            );
        }
        let failures = bad.len() + out.failures.len();
        println!(
            "{}: {} corpus files replayed ({} failing), {} generated cases in {:.0} s ({:.0}/s), {} new failures, {} cases failing like a corpus file",
            t.name,
            replayed,
            bad.len(),
            out.cases,
            start.elapsed().as_secs_f64(),
            out.cases as f64 / start.elapsed().as_secs_f64().max(0.001),
            out.failures.len(),
            out.known
        );
        if failures == 0 {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    println!("fuzz targets: {passed} passed, {failed} failed");
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
