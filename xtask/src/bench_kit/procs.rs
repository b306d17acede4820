//! Lifetimes of what a bench starts: a scratch directory and a process guard that remove
//! and kill everything on drop (also when the bench fails half-way), a child's stderr
//! drained into a short tail for error messages, free loopback ports, and polling with a
//! bound.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};

/// A directory under the system temp dir, removed on drop.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// `$TMPDIR/cortex-bench-{bench}-{pid}-{nanos}`.
    pub fn new(bench: &str) -> anyhow::Result<Self> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let path = std::env::temp_dir().join(format!(
            "cortex-bench-{bench}-{}-{nanos:x}",
            std::process::id()
        ));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(ScratchDir(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!("xtask: could not remove {}: {e}", self.0.display());
        }
    }
}

/// Every process the bench starts; each is killed and reaped on drop.
#[derive(Default)]
pub struct Procs(Vec<(String, Child)>);

impl Procs {
    pub fn add(&mut self, name: &str, child: Child) -> usize {
        self.0.push((name.to_string(), child));
        self.0.len() - 1
    }

    /// Fails if the process at `index` has already exited.
    pub fn check_alive(&mut self, index: usize) -> anyhow::Result<()> {
        let Some((name, child)) = self.0.get_mut(index) else {
            bail!("no process #{index}");
        };
        match child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => bail!("{name} exited early ({status})"),
            Err(e) => Err(e).with_context(|| format!("checking on {name}")),
        }
    }

    pub fn pid(&self, index: usize) -> Option<u32> {
        self.0.get(index).map(|(_, c)| c.id())
    }

    /// Kills and reaps the process at `index` now (SIGKILL: nothing to flush in a bench).
    pub fn kill(&mut self, index: usize) {
        if let Some((name, child)) = self.0.get_mut(index) {
            kill_one(name, child);
        }
    }
}

fn kill_one(name: &str, child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        if let Err(e) = child.kill() {
            eprintln!("xtask: could not kill {name} (pid {}): {e}", child.id());
        }
        let _ = child.wait();
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (name, child) in self.0.iter_mut().rev() {
            kill_one(name, child);
        }
    }
}

/// The last lines a child wrote to a pipe, kept for error messages while a thread drains
/// the pipe for the rest of the child's life (so it never blocks on a full pipe).
#[derive(Clone, Default)]
pub struct LogTail(Arc<Mutex<VecDeque<String>>>);

impl LogTail {
    /// How many lines are kept.
    const LINES: usize = 20;

    /// Drains `pipe` on a thread; the first line containing `marker` is also sent on the
    /// returned channel.
    pub fn drain(
        pipe: impl Read + Send + 'static,
        marker: &'static str,
    ) -> (LogTail, mpsc::Receiver<String>) {
        let tail = LogTail::default();
        let (tx, rx) = mpsc::channel();
        let t = tail.clone();
        std::thread::spawn(move || {
            let mut first = Some(tx);
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if line.contains(marker)
                    && let Some(tx) = first.take()
                {
                    let _ = tx.send(line.clone());
                }
                let mut lines = t.0.lock().unwrap_or_else(|e| e.into_inner());
                if lines.len() >= Self::LINES {
                    lines.pop_front();
                }
                lines.push_back(line);
            }
        });
        (tail, rx)
    }

    pub fn text(&self) -> String {
        let lines = self.0.lock().unwrap_or_else(|e| e.into_inner());
        lines.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

/// A free loopback port: bind port 0, read it, release it.
pub fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(l.local_addr().context("reading a bound address")?.port())
}

/// Polls `f` every 20 ms until it returns `Some`, for at most `bound`.
pub fn poll<T>(
    bound: Duration,
    what: &str,
    f: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    poll_every(Duration::from_millis(20), bound, what, f)
}

/// Polls `f` every `every` until it returns `Some`, for at most `bound`.
pub fn poll_every<T>(
    every: Duration,
    bound: Duration,
    what: &str,
    mut f: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        if start.elapsed() > bound {
            bail!("{what}: not ready after {bound:?}");
        }
        std::thread::sleep(every);
    }
}
