//! `cargo xtask bench hostile`: the hub against a hostile model server
//! (`cortex_tests::hostile_model`: endless, drip, huge, spawn, timer) in this process.
//! For each mode, without and with a turn-only cancel a second in, a fresh hub (its
//! own home, settings.json `limits` as given) is told one message, watched for
//! `--seconds`, and its memory sampled from `/proc/PID/status` every 50 ms: the peak
//! (`VmHWM`) and the RSS at the end; then the counts the caps hold to (model calls,
//! sessions, armed waitpoints, events) and how the first run ended. It prints numbers and
//! asserts none. Method and figures: docs/benchmarks.md, "A hostile model".

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use cortex_tests::hostile_model::{MODES, Mode};
use serde_json::{Value, json};

use crate::bench_kit::hub::Hub;
use crate::bench_kit::procs::{Procs, ScratchDir};
use crate::bench_kit::{report, target_dir, workspace_root};

/// `cargo xtask bench hostile` flags.
#[derive(clap::Parser)]
#[command(name = "cargo xtask bench hostile", disable_help_flag = true)]
struct Options {
    /// The hub binary (default: target/release/cortex-hub, which must be built).
    #[arg(long)]
    hub: Option<PathBuf>,
    /// Seconds each mode runs.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..))]
    seconds: u64,
    /// The modes, comma-separated (default all: endless,drip,huge,spawn,timer).
    #[arg(long, default_value = "endless,drip,huge,spawn,timer")]
    modes: String,
    /// The huge mode's reply, in MiB.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    huge_mib: u64,
    /// settings.json `limits` for every hub, as JSON (default: none set, the defaults).
    #[arg(long, default_value = "{}")]
    limits: String,
    /// Only without a cancel, or only with one.
    #[arg(long, value_parser = ["without", "with"])]
    cancel: Option<String>,
}

/// What one mode did to one hub.
struct Row {
    mode: &'static str,
    cancel: bool,
    peak_kib: u64,
    end_kib: u64,
    calls: usize,
    sessions: usize,
    armed: u64,
    events: u64,
    sent_mib: f64,
    ended: String,
}

pub fn run(args: &[&str]) -> anyhow::Result<()> {
    let opts: Options = crate::bench_kit::parse_flags(args)?;
    let hub_bin = match &opts.hub {
        Some(p) => p.clone(),
        None => target_dir(&workspace_root())
            .join("release")
            .join("cortex-hub"),
    };
    ensure!(
        hub_bin.is_file(),
        "{} is missing; build it (cargo build --release -p cortex-hub) or name a hub with --hub PATH",
        hub_bin.display()
    );
    let limits: Value = serde_json::from_str(&opts.limits).context("--limits is not JSON")?;
    ensure!(limits.is_object(), "--limits must be a JSON object");
    let mut modes = Vec::new();
    for word in opts
        .modes
        .split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
    {
        let mode = match Mode::parse(word) {
            Some(Mode::Huge { .. }) => Mode::Huge {
                bytes: (opts.huge_mib << 20) as usize,
            },
            Some(m) => m,
            None => bail!(
                "--modes: {word:?} is not a mode; the modes are {}",
                MODES.join(", ")
            ),
        };
        modes.push(mode);
    }
    let cancels: &[bool] = match opts.cancel.as_deref() {
        Some("without") => &[false],
        Some("with") => &[true],
        _ => &[false, true],
    };
    let scratch = ScratchDir::new("hostile")?;
    let date = report::utc_now();
    let mut rows = Vec::new();
    for (n, mode) in modes.iter().enumerate() {
        for &cancel in cancels {
            eprintln!(
                "bench: {} {} a cancel, {} s",
                mode.name(),
                if cancel { "with" } else { "without" },
                opts.seconds
            );
            let home = scratch.path().join(format!("hub-{n}-{cancel}"));
            rows.push(one(&hub_bin, &home, mode, cancel, &limits, opts.seconds)?);
        }
    }
    println!(
        "\ncortex bench hostile, {date}; hub {}; limits {}; {} s a mode; huge {} MiB",
        hub_bin.display(),
        limits,
        opts.seconds,
        opts.huge_mib
    );
    println!(
        "{:<8} {:<7} {:>10} {:>10} {:>7} {:>9} {:>6} {:>8} {:>10}  first run",
        "mode", "cancel", "peak MiB", "end MiB", "calls", "sessions", "armed", "events", "sent MiB"
    );
    for r in &rows {
        println!(
            "{:<8} {:<7} {:>10.1} {:>10.1} {:>7} {:>9} {:>6} {:>8} {:>10.1}  {}",
            r.mode,
            if r.cancel { "yes" } else { "no" },
            r.peak_kib as f64 / 1024.0,
            r.end_kib as f64 / 1024.0,
            r.calls,
            r.sessions,
            r.armed,
            r.events,
            r.sent_mib,
            r.ended
        );
    }
    Ok(())
}

/// One fresh hub against `mode` for `seconds`.
fn one(
    bin: &Path,
    home: &Path,
    mode: &Mode,
    cancel: bool,
    limits: &Value,
    seconds: u64,
) -> anyhow::Result<Row> {
    std::fs::create_dir_all(home).with_context(|| format!("creating {}", home.display()))?;
    std::fs::write(
        home.join("settings.json"),
        json!({ "limits": limits }).to_string(),
    )
    .context("writing settings.json")?;
    let model = mode.start();
    let url = model.url();
    let mut procs = Procs::default();
    let hub = Hub::start_with_env(
        bin,
        home,
        &[
            ("CORTEX_LLM_BASE_URL", url.as_str()),
            ("CORTEX_LLM_MODEL", "hostile"),
        ],
        &mut procs,
    )?;
    let pid = procs.pid(hub.index).context("the hub's pid")?;
    let with_log = |e: anyhow::Error| e.context(format!("hub log tail:\n{}", hub.log_tail()));
    let s = hub
        .api_json("POST", "/api/sessions", Some(json!({"runs": true})), 201)
        .map_err(with_log)?;
    let sid = s["id"]
        .as_str()
        .context("the session has no id")?
        .to_string();
    hub.api_json(
        "POST",
        &format!("/api/sessions/{sid}/messages"),
        Some(json!({"text": "go"})),
        201,
    )
    .map_err(with_log)?;
    let start = Instant::now();
    let until = start + Duration::from_secs(seconds);
    let mut cancelled = !cancel;
    let mut peak = 0;
    while Instant::now() < until {
        if !cancelled && start.elapsed() >= Duration::from_secs(1) {
            cancelled = true;
            let r = hub
                .api_reply_on(
                    &crate::bench_kit::agent(),
                    "POST",
                    &format!("/api/sessions/{sid}/cancel"),
                    Some(json!({"turn_only": true})),
                )
                .map_err(with_log)?;
            eprintln!("bench:   cancel answered {}", r.status);
        }
        peak = peak.max(status_kib(pid, "VmHWM:")?);
        std::thread::sleep(Duration::from_millis(50));
    }
    let end_kib = status_kib(pid, "VmRSS:")?;
    peak = peak.max(status_kib(pid, "VmHWM:")?);
    let list = hub
        .api_json("GET", "/api/sessions", None, 200)
        .map_err(with_log)?;
    let sessions: Vec<Value> = match list {
        Value::Array(a) => a,
        other => other["sessions"].as_array().cloned().unwrap_or_default(),
    };
    let armed = sessions
        .iter()
        .map(|s| s["armed_waitpoints"].as_u64().unwrap_or(0))
        .sum();
    let events = sessions
        .iter()
        .map(|s| s["last_seq"].as_u64().unwrap_or(0))
        .sum();
    let ended = first_run_end(&hub, &sid).map_err(with_log)?;
    let row = Row {
        mode: mode.name(),
        cancel,
        peak_kib: peak,
        end_kib,
        calls: model.request_count(),
        sessions: sessions.len(),
        armed,
        events,
        sent_mib: model.bytes_sent() as f64 / (1 << 20) as f64,
        ended,
    };
    procs.kill(hub.index);
    Ok(row)
}

/// How the session's first run ended: `ok`, `CODE`, `CODE: STOP`, or `running`.
fn first_run_end(hub: &Hub, sid: &str) -> anyhow::Result<String> {
    let page = hub.api_json(
        "GET",
        &format!("/api/sessions/{sid}/events?after=0"),
        None,
        200,
    )?;
    let events = match &page {
        Value::Array(a) => a.clone(),
        other => other["events"].as_array().cloned().unwrap_or_default(),
    };
    Ok(events
        .iter()
        .find(|e| e["kind"] == "run-end")
        .map_or("running".into(), |e| {
            let r = &e["result"];
            if r["ok"] == true {
                return "ok".into();
            }
            let code = r["error"]["code"].as_str().unwrap_or("?");
            match r["error"]["stop"].as_str() {
                Some(stop) => format!("{code}: {stop}"),
                None => code.to_string(),
            }
        }))
}

/// A `/proc/PID/status` figure in KiB (`VmHWM:`, `VmRSS:`).
fn status_kib(pid: u32, key: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no {key} in /proc/{pid}/status"))
}
