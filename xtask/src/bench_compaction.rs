//! `cargo xtask bench compaction`: what a compaction costs and what it saves. A release hub
//! runs one chat session (one tool shown, `maxTokens` 64) for N turns of ~300-byte notes
//! against a model with a small context: by default a scripted server in this process
//! with a 2,048-token context (reported at `GET /props`, a request that reaches it refused
//! as llama.cpp refuses it), or a real OpenAI-compatible server (`--base-url`). Each
//! turn's prompt tokens as the server counted them (the run's usage), every `compaction`
//! event (cause, messages summarized, the hub's estimate before and after, the summary
//! call's time and tokens), then a forced one (`POST /api/sessions/{sid}/compact`).
//! Method and figures: docs/benchmarks.md, "Compaction".

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use cortex_tests::scripted_model::{Reply, ScriptedModel};
use serde_json::{Value, json};

use crate::bench_kit::hub::Hub;
use crate::bench_kit::procs::{Procs, ScratchDir};
use crate::bench_kit::report;
use crate::bench_kit::{cargo_build, target_dir, workspace_root};

/// How long one turn may take (a small local model writes ~60 tokens/s here).
const TURN: Duration = Duration::from_secs(300);

/// `cargo xtask bench compaction` flags.
#[derive(clap::Parser)]
#[command(name = "cargo xtask bench compaction", disable_help_flag = true)]
struct Options {
    /// Chat turns, each a ~300-byte note.
    #[arg(long, default_value_t = 30, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=500))]
    turns: usize,
    /// The scripted server's context in tokens (a token every four bytes).
    #[arg(long, default_value_t = 2_048, value_parser = clap::value_parser!(u64).range(512..))]
    context: u64,
    /// A running OpenAI-compatible server's base URL (`http://HOST:PORT/v1`) instead of
    /// the scripted one; its context is what it reports (llama.cpp: `GET /props`).
    #[arg(long)]
    base_url: Option<String>,
    /// The model name to ask a real server for.
    #[arg(long, default_value = "SmolLM2-135M-Instruct")]
    model: String,
    /// Build the hub first (`--no-build`: use target/release/cortex-hub).
    #[arg(long = "no-build", action = clap::ArgAction::SetFalse)]
    build: bool,
    /// Use target/debug/cortex-hub as it is (what is measured is the model's work and
    /// the tokens, not the hub's own time).
    #[arg(long)]
    debug: bool,
}

fn is_summary_call(body: &Value) -> bool {
    body["messages"][0]["content"]
        .as_str()
        .is_some_and(|c| c.starts_with("You summarize a conversation"))
}

pub fn run(args: &[&str]) -> anyhow::Result<()> {
    let opts: Options = crate::bench_kit::parse_flags(args)?;
    let root = workspace_root();
    if opts.build && !opts.debug {
        cargo_build(&root, &["cortex-hub"]).context("building the hub")?;
    }
    let profile = if opts.debug { "debug" } else { "release" };
    let hub_bin = target_dir(&root).join(profile).join("cortex-hub");
    ensure!(
        hub_bin.is_file(),
        "{} is missing; run without --no-build",
        hub_bin.display()
    );
    let scratch = ScratchDir::new("compaction")?;
    let mut procs = Procs::default();
    let scripted = match opts.base_url {
        Some(_) => None,
        None => {
            let m = ScriptedModel::start_with_default(
                Vec::new(),
                Reply::from_fn(|body| match is_summary_call(body) {
                    true => Reply::text(
                        "The person sent numbered notes about job 7's log; each was noted.",
                    ),
                    false => Reply::text("noted"),
                }),
            );
            m.set_context(Some(opts.context));
            Some(m)
        }
    };
    let (url, model_name, what) = match (&scripted, &opts.base_url) {
        (Some(m), _) => (
            m.url(),
            "scripted".to_string(),
            format!(
                "a scripted server in this process (context {} tokens, a token every 4 bytes)",
                opts.context
            ),
        ),
        (None, Some(u)) => (
            u.trim_end_matches('/').to_string(),
            opts.model.clone(),
            format!("{} at {u}", opts.model),
        ),
        (None, None) => bail!("no model server"),
    };
    let hub = Hub::start_with_env(
        &hub_bin,
        &scratch.path().join("hub"),
        &[
            ("CORTEX_LLM_BASE_URL", url.as_str()),
            ("CORTEX_LLM_MODEL", model_name.as_str()),
        ],
        &mut procs,
    )?;
    let with_log = |e: anyhow::Error| e.context(format!("hub log tail:\n{}", hub.log_tail()));

    println!("cortex bench compaction, {}", report::utc_now());
    println!("machine: {}", report::machine());
    println!("model: {what}");
    println!("hub: {}", hub_bin.display());
    println!(
        "one session (one tool shown, maxTokens 64), {} turns of ~300-byte notes\n",
        opts.turns
    );
    let s = hub.api_json(
        "POST",
        "/api/sessions",
        Some(
            json!({"title": "bench compaction", "instructions": "Be brief.",
                    "maxTokens": 64, "policy": {"allow": ["wait_create"]}}),
        ),
        201,
    )?;
    let sid = s["id"].as_str().context("a session id")?.to_string();
    let mut after = 0u64;
    let mut prompts: Vec<u64> = Vec::new();
    let mut compactions: Vec<(usize, Value)> = Vec::new();
    let mut failed = 0;
    println!("turn  prompt tokens  turn ms  what happened");
    for n in 1..=opts.turns {
        let text = format!(
            "note {n}: {}",
            "job 7 wrote another line of its log; ".repeat(8)
        );
        let started = Instant::now();
        hub.api_json(
            "POST",
            &format!("/api/sessions/{sid}/messages"),
            Some(json!({ "text": text })),
            201,
        )?;
        let events = until_run_end(&hub, &sid, &mut after).map_err(with_log)?;
        let took = started.elapsed().as_secs_f64() * 1e3;
        let end = events
            .iter()
            .find(|e| e["kind"] == "run-end")
            .context("a run-end")?;
        let prompt = end["meta"]["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
        prompts.push(prompt);
        let mut notes: Vec<String> = Vec::new();
        if end["result"]["ok"] != true {
            failed += 1;
            notes.push(format!("FAILED: {}", end["result"]["error"]["message"]));
        }
        for c in events.iter().filter(|e| e["kind"] == "compaction") {
            notes.push(compaction_note(c));
            compactions.push((n, c.clone()));
        }
        println!("{n:>4}  {prompt:>13}  {took:>7.0}  {}", notes.join("; "));
    }
    // Compactions posted from beside the steps after the last turn's end.
    for c in page(&hub, &sid, &mut after, 0)?
        .into_iter()
        .filter(|e| e["kind"] == "compaction")
    {
        println!("      after the last turn: {}", compaction_note(&c));
        compactions.push((opts.turns + 1, c));
    }

    // A forced compaction at the end.
    let started = Instant::now();
    let posted = hub.api_json("POST", &format!("/api/sessions/{sid}/compact"), None, 202)?;
    after = after.max(posted["seq"].as_u64().unwrap_or(after));
    let forced = loop {
        ensure!(
            started.elapsed() < TURN,
            "no forced compaction within {TURN:?}"
        );
        if let Some(c) = page(&hub, &sid, &mut after, 10)?
            .into_iter()
            .find(|e| e["kind"] == "compaction" && e["cause"] == "forced")
        {
            break c;
        }
    };
    let forced_ms = started.elapsed().as_secs_f64() * 1e3;
    println!(
        "\nforced (POST /compact, {forced_ms:.0} ms to its event): {}",
        compaction_note(&forced)
    );

    println!("\nsummary");
    println!("  turns: {}, failed: {failed}", opts.turns);
    let taken: Vec<&Value> = compactions
        .iter()
        .map(|(_, c)| c)
        .filter(|c| c.get("error").is_none())
        .collect();
    println!("  compactions with a summary: {}", taken.len());
    if !taken.is_empty() {
        let mut ms: Vec<u64> = taken
            .iter()
            .map(|c| c["elapsedMs"].as_u64().unwrap_or(0))
            .collect();
        ms.sort_unstable();
        let sum = |k: &str| {
            taken
                .iter()
                .map(|c| c["usage"][k].as_u64().unwrap_or(0))
                .sum::<u64>()
        };
        let n = taken.len() as u64;
        println!(
            "  the summary call: {} ms median, {} ms max; {} prompt + {} completion tokens on average",
            ms[ms.len() / 2],
            ms[ms.len() - 1],
            sum("prompt_tokens") / n,
            sum("completion_tokens") / n
        );
        let before: u64 = taken
            .iter()
            .map(|c| c["tokensBefore"].as_u64().unwrap_or(0))
            .sum();
        let after_: u64 = taken
            .iter()
            .map(|c| c["tokensAfter"].as_u64().unwrap_or(0))
            .sum();
        println!(
            "  the next request, as the hub estimates it: {} tokens before, {} after on average ({:.0} % less)",
            before / n,
            after_ / n,
            100.0 * (before.saturating_sub(after_)) as f64 / before.max(1) as f64
        );
    }
    let peak = prompts.iter().copied().max().unwrap_or(0);
    let last = prompts.last().copied().unwrap_or(0);
    println!(
        "  prompt tokens as the server counted them: first turn {}, peak {peak}, last turn {last}",
        prompts.first().copied().unwrap_or(0)
    );
    if let Some(m) = &scripted {
        println!("  requests refused for size: {}", m.refused());
        // Without compaction: the transcript's whole size at the end.
        let whole = m
            .requests()
            .iter()
            .filter(|b| !b.is_null() && !is_summary_call(b))
            .map(|b| b.to_string().len() as u64 / 4)
            .max()
            .unwrap_or(0);
        println!(
            "  the biggest step request sent: {whole} tokens (context {})",
            opts.context
        );
    }
    Ok(())
}

fn compaction_note(c: &Value) -> String {
    if let Some(e) = c["error"].as_str() {
        return format!(
            "no compaction ({}): {e}",
            c["cause"].as_str().unwrap_or("?")
        );
    }
    format!(
        "compaction ({}): {} messages summarized, est. {} -> {} tokens, the summary call {} ms, {}+{} tokens",
        c["cause"].as_str().unwrap_or("?"),
        c["through"].as_u64().unwrap_or(0) - c["from"].as_u64().unwrap_or(0),
        c["tokensBefore"],
        c["tokensAfter"],
        c["elapsedMs"],
        c["usage"]["prompt_tokens"],
        c["usage"]["completion_tokens"]
    )
}

/// The session's events up to and including the next `run-end`.
fn until_run_end(hub: &Hub, sid: &str, after: &mut u64) -> anyhow::Result<Vec<Value>> {
    let started = Instant::now();
    let mut seen = Vec::new();
    loop {
        ensure!(started.elapsed() < TURN, "no run-end within {TURN:?}");
        for e in page(hub, sid, after, 10)? {
            let end = e["kind"] == "run-end";
            let seq = e["seq"].as_u64().unwrap_or(0);
            seen.push(e);
            if end {
                // What came after it is the next turn's.
                *after = seq;
                return Ok(seen);
            }
        }
    }
}

/// The events after `after` (a long poll of up to `wait` s); `after` moves past them.
fn page(hub: &Hub, sid: &str, after: &mut u64, wait: u64) -> anyhow::Result<Vec<Value>> {
    let page = hub.api_json(
        "GET",
        &format!("/api/sessions/{sid}/events?after={after}&wait={wait}"),
        None,
        200,
    )?;
    let events = page["events"].as_array().cloned().unwrap_or_default();
    for e in &events {
        *after = (*after).max(e["seq"].as_u64().unwrap_or(0));
    }
    Ok(events)
}
