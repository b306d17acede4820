//! `cargo xtask`: developer tasks as code (matklad/cargo-xtask), so nobody keeps a private
//! shell script. This file only dispatches; each task lives in its own module beside it.

mod bench_agent;
mod bench_cluster;
mod bench_compaction;
mod bench_hostile;
mod bench_kit;
mod bench_mcp;
mod bench_mesh;
mod bench_signals;
mod bench_waits;
mod deb;
mod dist_docs;
mod fuzz;
mod powerloss;
mod real_model;
mod test;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <task> [args]

tasks:
  completions --out DIR
      shell completions (bash, zsh, fish, elvish, PowerShell) for cortex, cortex-signal,
      cortex-hub and cortex-device-agent, from their clap definitions
  man --out DIR
      man pages (section 1) for the same four, one per command and subcommand
  test [ARGS…]
      what CI runs (.ci/run): cargo fmt --check, build every binary, cargo test --workspace
      (ARGS go to cargo test)
  torture [CYCLES]
      the crash torture test at full length (default 30 SIGKILL cycles) on release binaries
  cluster-torture [CYCLES]
      three hubs on one PostgreSQL database under signals and agent turns, a random hub
      SIGKILLed and restarted or SIGSTOPped past its lease each cycle (default 30), on
      release binaries
  powerloss [CUTS] [--journaled]
      the power-loss torture at full length (default 30 power cuts each for the hub and a
      device agent, their homes on lazyfs; names durable only with their directory's
      fsync) on release binaries; --journaled: any fsync commits earlier names
  fuzz [--seconds N] [TARGET…]
      property-based fuzzing on stable Rust (fuzz/, proptest): each target (signal, frames,
      spool, journal; default all) replays its corpus, then runs generated cases for N
      seconds (default 600); prints cases and failures per target, saves failures in
      fuzz/corpus/<target>/
  bench signals [--duration SECS] [--warmup SECS] [--runs N] [--monitors N]
                [--threads N] [--quiet-wait SECS] [--no-build]
      the durable signal route against adnanh/webhook 2.8 (wrk), the disk's raw
      fdatasync rate, and one cortex-signal against one curl (hyperfine);
      see docs/benchmarks.md
  bench cluster [--duration SECS] [--rounds N] [--monitors N] [--no-build]
      the store on PostgreSQL: pgbench's one-row insert and commit (the floor), the hub's
      durable signal on redb and on PostgreSQL, 50 connections each (wrk), interleaved
      rounds on one throwaway cluster; see docs/benchmarks.md
  bench mcp [--calls N] [--wakes N] [--no-build]
      the hub as an MCP server: a tool call's round trip over MCP against the HTTP API
      (interleaved), and a signal's 202 until the client holds the wake, pushed and
      polled; see docs/benchmarks.md
  bench mesh [--idle SECS] [--drops N] [--burst N] [--devices N] [--hold SECS]
             [--quiet-wait SECS] [--no-build]
      the device mesh: spool drop to hub-accepted latency (~100 B to ~64 KB), a burst's
      files/s, the idle agent's CPU, wakeups and RSS beside inotifywait -m, and the hub's
      RSS with thousands of simulated devices; see docs/benchmarks.md
  bench waits [--runs N] [--tail-runs N] [--poll-runs N] [--loop-runs N] [--waits N]
              [--idle SECS] [--quiet-wait SECS] [--no-build]
      remote waits: process exit to the agent, the hub's durable record and a client's
      wake, beside tail --pid, a kill -0/sleep 5 loop and a 500 ms poll (ratios); the
      agent idle with no waits and with 1,000 armed pid waits; see docs/benchmarks.md
  bench agent [--sessions N] [--steps N] [--runs N] [--idle SECS] [--delay-ms MS]
              [--threads N] [--quiet-wait SECS] [--no-build]
      the hub's runner against a zero-latency scripted model: a tool step's cost, a
      signal's 202 to the woken turn's request, the hub's memory and idle CPU with N
      sessions each waiting (default 10,000), and all of them woken in one burst (the
      most model requests at once must stay within agent.concurrency); see
      docs/benchmarks.md
  bench compaction [--turns N] [--context TOKENS] [--base-url URL] [--model NAME]
                   [--no-build] [--debug]
      what a compaction costs (the summary call's time and tokens) and saves (prompt
      tokens before and after): one chat session, N turns, against a scripted server with
      a small context (default 2,048 tokens) or a real one; see docs/benchmarks.md
  bench hostile [--hub PATH] [--seconds N] [--modes LIST] [--huge-mib N] [--limits JSON]
                [--cancel without|with]
      the hub against a hostile model server (endless, drip, huge, spawn, timer), each
      mode without and with a turn-only cancel: the hub's peak and final RSS, model calls,
      sessions, armed waitpoints, events and how the first run ended; the hub is
      target/release/cortex-hub unless --hub names one; see docs/benchmarks.md
  deb [--out DIR] [--no-build]
      the Debian packages cortex-hub, cortex-cli and cortex-device-agent (cargo-deb:
      cargo install cargo-deb --locked) from stripped release binaries, with the units,
      man pages and shell completions; default DIR target/debian; see docs/install.md
  dist
      the man pages and completions the packages ship, by package, in target/dist/
  real-model [--base-url URL] [--serve SCRIPT] [--model NAME] [--no-build]
      the runner's story against a real OpenAI-compatible server (default: llama.cpp's
      llama-server with SmolLM2-135M through a serve script): a device_wait_pid call parsed
      and run, the turn ended, the process's exit waking the session, the wake running a
      turn; checks structure, never words; see docs/agent.md";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match words.as_slice() {
        ["test", rest @ ..] => test::run(rest),
        ["completions", rest @ ..] => dist_docs::run_completions(rest),
        ["man", rest @ ..] => dist_docs::run_man(rest),
        ["torture", rest @ ..] => test::torture(rest),
        ["cluster-torture", rest @ ..] => test::cluster_torture(rest),
        ["powerloss", rest @ ..] => powerloss::run(rest),
        ["fuzz", rest @ ..] => fuzz::run(rest),
        ["bench", "signals", rest @ ..] => bench_signals::run(rest),
        ["bench", "cluster", rest @ ..] => bench_cluster::run(rest),
        ["bench", "mesh", rest @ ..] => bench_mesh::run(rest),
        ["bench", "mcp", rest @ ..] => bench_mcp::run(rest),
        ["bench", "waits", rest @ ..] => bench_waits::run(rest),
        ["bench", "agent", rest @ ..] => bench_agent::run(rest),
        ["bench", "compaction", rest @ ..] => bench_compaction::run(rest),
        ["bench", "hostile", rest @ ..] => bench_hostile::run(rest),
        ["real-model", rest @ ..] => real_model::run(rest),
        ["deb", rest @ ..] => deb::run(rest),
        ["dist", rest @ ..] => deb::run_dist(rest),
        [] | ["help" | "-h" | "--help", ..] => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("xtask: unknown task {:?}\n\n{USAGE}", words.join(" "));
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}
