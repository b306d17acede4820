//! The measuring tools: wrk (driven by a generated Lua script whose `done` hook prints its
//! figures as one JSON line), hyperfine (read from `--export-json`), and the raw fdatasync
//! loop. Each returns plain numbers; judging and printing them is the caller's.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

/// What the bench needs on PATH, and how to get it (Debian's packages have the same names).
pub const TOOLS: [&str; 4] = ["wrk", "webhook", "hyperfine", "curl"];
pub const INSTALL: &str = "apt-get update && apt-get install -y webhook wrk hyperfine";

pub use crate::bench_kit::{on_path, version};

/// One wrk run's figures.
#[derive(Debug, Clone)]
pub struct WrkRun {
    pub requests: u64,
    pub duration_s: f64,
    /// Answers that were not 2xx/3xx.
    pub non_2xx: u64,
    pub connect_errors: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub timeouts: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl WrkRun {
    pub fn rps(&self) -> f64 {
        self.requests as f64 / self.duration_s
    }

    pub fn ok(&self) -> u64 {
        self.requests.saturating_sub(self.non_2xx)
    }

    pub fn socket_errors(&self) -> u64 {
        self.connect_errors + self.read_errors + self.write_errors + self.timeouts
    }
}

/// How wrk is driven: threads, connections, seconds.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub threads: u32,
    pub connections: u32,
    pub seconds: u64,
}

/// A wrk script that POSTs `bodies` to `path` in turn (each thread starting at its own
/// offset). The requests are formatted once in `init`, so wrk does the same small work per
/// request for every server.
pub fn wrk_script(path: &str, bodies: &[String]) -> anyhow::Result<String> {
    let mut s = String::from("local bodies = {\n");
    for b in bodies {
        ensure!(!b.contains("]]"), "a body holds ']]': {b}");
        s.push_str(&format!("  [[{b}]],\n"));
    }
    s.push_str(&format!(
        r#"}}
local reqs = {{}}
local i = 0
local threads = 0

function setup(thread)
  thread:set("offset", threads)
  threads = threads + 1
end

function init(args)
  for k, b in ipairs(bodies) do
    reqs[k] = wrk.format("POST", "{path}", {{["Content-Type"] = "application/json"}}, b)
  end
  i = ((offset or 0) * 37) % #reqs
end

function request()
  i = i % #reqs + 1
  return reqs[i]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "XTASK-WRK {{\"requests\":%d,\"duration_us\":%d,\"status\":%d,\"connect\":%d,\"read\":%d,\"write\":%d,\"timeout\":%d,\"p50_us\":%.1f,\"p99_us\":%.1f,\"max_us\":%.1f}}\n",
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50.0), latency:percentile(99.0), latency.max))
end
"#
    ));
    Ok(s)
}

/// Runs wrk with `script` against `url`.
pub fn wrk(script: &Path, url: &str, load: Load) -> anyhow::Result<WrkRun> {
    let out = Command::new("wrk")
        .arg(format!("-t{}", load.threads))
        .arg(format!("-c{}", load.connections))
        .arg(format!("-d{}s", load.seconds))
        .arg("--latency")
        .arg("-s")
        .arg(script)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .context("running wrk")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success(),
        "wrk failed ({}):\n{stdout}{stderr}",
        out.status
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("XTASK-WRK "))
        .with_context(|| format!("wrk printed no result line:\n{stdout}{stderr}"))?;
    let v: serde_json::Value =
        serde_json::from_str(line).with_context(|| format!("wrk's result line {line:?}"))?;
    let int = |k: &str| {
        v[k].as_u64()
            .with_context(|| format!("wrk result: {k} in {line}"))
    };
    let num = |k: &str| {
        v[k].as_f64()
            .with_context(|| format!("wrk result: {k} in {line}"))
    };
    let duration_us = int("duration_us")?;
    ensure!(duration_us > 0, "wrk ran for no time: {line}");
    Ok(WrkRun {
        requests: int("requests")?,
        duration_s: duration_us as f64 / 1e6,
        non_2xx: int("status")?,
        connect_errors: int("connect")?,
        read_errors: int("read")?,
        write_errors: int("write")?,
        timeouts: int("timeout")?,
        p50_us: num("p50_us")?,
        p99_us: num("p99_us")?,
        max_us: num("max_us")?,
    })
}

/// One command's timing from hyperfine, in seconds.
#[derive(Debug, Clone)]
pub struct Timing {
    pub mean: f64,
    pub stddev: f64,
    pub median: f64,
    pub min: f64,
}

/// Runs hyperfine without a shell (`-N`) over `commands` (name, command line) with
/// `envs` set for them, and returns one timing per command in order.
pub fn hyperfine(
    commands: &[(String, String)],
    warmup: u32,
    runs: u32,
    envs: &[(&str, &Path)],
    json_out: &Path,
) -> anyhow::Result<Vec<Timing>> {
    let mut cmd = Command::new("hyperfine");
    cmd.args(["-N", "--style", "basic"])
        .args(["--warmup", &warmup.to_string(), "--runs", &runs.to_string()])
        .arg("--export-json")
        .arg(json_out);
    for (name, line) in commands {
        cmd.args(["--command-name", name]).arg(line);
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .context("running hyperfine")?;
    ensure!(
        out.status.success(),
        "hyperfine failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read(json_out)
        .with_context(|| format!("reading hyperfine's {}", json_out.display()))?;
    let v: serde_json::Value = serde_json::from_slice(&text).context("hyperfine's JSON")?;
    let results = v["results"]
        .as_array()
        .context("hyperfine's JSON has no results")?;
    ensure!(
        results.len() == commands.len(),
        "hyperfine gave {} results for {} commands",
        results.len(),
        commands.len()
    );
    results
        .iter()
        .map(|r| {
            let f = |k: &str| {
                r[k].as_f64()
                    .with_context(|| format!("hyperfine result: {k}"))
            };
            Ok(Timing {
                mean: f("mean")?,
                stddev: f("stddev")?,
                median: f("median")?,
                min: f("min")?,
            })
        })
        .collect()
}

/// The raw fdatasync loop's figures.
#[derive(Debug, Clone)]
pub struct SyncRun {
    pub ops: usize,
    pub per_s: f64,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    /// The p99 as wrk reports a one-connection run, which is also a closed loop of one
    /// operation at a time: see [`wrk_corrected_percentile`].
    pub p99_as_wrk: Duration,
}

/// Appends 100 bytes and calls fdatasync, over and over on one thread for `for_how_long`,
/// in a file under `dir` (the same disk as the hub's store).
pub fn fdatasync_loop(dir: &Path, for_how_long: Duration) -> anyhow::Result<SyncRun> {
    let path = dir.join("fdatasync.log");
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let record = [b'x'; 100];
    let mut lat = Vec::new();
    let start = Instant::now();
    while start.elapsed() < for_how_long {
        let t = Instant::now();
        f.write_all(&record)
            .with_context(|| format!("appending to {}", path.display()))?;
        f.sync_data()
            .with_context(|| format!("fdatasync on {}", path.display()))?;
        lat.push(t.elapsed());
    }
    let total = start.elapsed();
    if lat.is_empty() {
        bail!("the fdatasync loop did not run");
    }
    lat.sort_unstable();
    let micros: Vec<u64> = lat.iter().map(|d| d.as_micros() as u64).collect();
    let interval = total.as_micros() as u64 / lat.len() as u64;
    Ok(SyncRun {
        ops: lat.len(),
        per_s: lat.len() as f64 / total.as_secs_f64(),
        p50: percentile(&lat, 50.0),
        p99: percentile(&lat, 99.0),
        max: lat[lat.len() - 1],
        p99_as_wrk: Duration::from_micros(wrk_corrected_percentile(&micros, interval, 99.0)),
    })
}

/// The `p`th percentile of `samples_us` (microseconds) counted as wrk 4 counts its latency
/// percentiles. Before it reports, wrk corrects for coordinated omission: with
/// `interval_us` the run's mean time per request on a connection, every sample of at least
/// twice that adds one sample at each of `sample - interval`, `sample - 2 interval`, ...
/// down to just above `interval` (the requests a steady client would have sent during the
/// stall). One stall of 20 ms in a loop of 200 us operations so adds ~100 samples, and
/// moves the p99 of a 10 s run by itself. Comparing wrk's p99 with a raw loop's, one
/// counted that way and one not, compares two different statistics; this puts the loop
/// on wrk's footing. wrk's rank: the smallest value whose cumulative count reaches
/// `round(p / 100 * count + 0.5)`.
pub fn wrk_corrected_percentile(samples_us: &[u64], interval_us: u64, p: f64) -> u64 {
    use std::collections::BTreeMap;
    let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
    for &v in samples_us {
        *counts.entry(v).or_default() += 1;
    }
    if interval_us > 0 {
        let originals: Vec<(u64, u64)> = counts
            .range(interval_us.saturating_mul(2)..)
            .map(|(&v, &c)| (v, c))
            .collect();
        for (v, c) in originals {
            let mut m = v - interval_us;
            while m > interval_us {
                *counts.entry(m).or_default() += c;
                m -= interval_us;
            }
        }
    }
    let total: u64 = counts.values().sum();
    let rank = ((p / 100.0) * total as f64 + 0.5).round() as u64;
    let mut seen = 0;
    for (&v, &c) in &counts {
        seen += c;
        if seen >= rank {
            return v;
        }
    }
    counts.keys().next_back().copied().unwrap_or(0)
}

/// Nearest-rank percentile of sorted, non-empty `v`.
fn percentile(v: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrk_correction_adds_the_samples_a_stall_hid() {
        // 98 operations of 100 us and one stall of 1,000 us, at a mean interval of 100 us:
        // the stall adds samples at 900, 800, ..., 200 us (8 of them), so 107 in all.
        let mut v = vec![100; 98];
        v.push(1_000);
        // Uncorrected, the p99 (rank round(0.99 * 99 + 0.5) = 99) is the stall itself ...
        assert_eq!(wrk_corrected_percentile(&v, 0, 99.0), 1_000);
        // ... corrected, rank round(0.99 * 107 + 0.5) = 106: the 8th of the 9 values
        // above 100 us, counting up from 200.
        assert_eq!(wrk_corrected_percentile(&v, 100, 99.0), 900);
        // rank round(0.93 * 107 + 0.5) = 100: the 99th value is 200, the 100th 300.
        assert_eq!(wrk_corrected_percentile(&v, 100, 93.0), 300);
        assert_eq!(wrk_corrected_percentile(&v, 100, 90.0), 100);
        // Nothing at or above twice the interval: nothing added.
        assert_eq!(wrk_corrected_percentile(&[100, 150, 199], 100, 99.0), 199);
    }

    #[test]
    fn nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(percentile(&v, 50.0), Duration::from_micros(50));
        assert_eq!(percentile(&v, 99.0), Duration::from_micros(99));
        assert_eq!(percentile(&v[..1], 99.0), Duration::from_micros(1));
    }

    #[test]
    fn script_refuses_a_body_that_would_end_the_lua_string() {
        assert!(wrk_script("/x", &["{\"a\":\"]]\"}".to_string()]).is_err());
        assert!(wrk_script("/x", &["{}".to_string()]).is_ok());
    }
}
