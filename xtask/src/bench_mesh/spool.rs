//! The device's side of a drop: spool files written as the one-line shell drop writes them
//! (`NAME.tmp`, then a rename to `NAME.json` in the same directory), bodies of a chosen size, and the bench's
//! own inotify watch that sees the agent delete a file (it does so only after the hub's
//! ack). Blocking, one thread; the burst's watch runs on a thread of its own.

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use cortex_protocol::signal::{MAX_BODY_BYTES, MAX_DATA_CHARS};
use inotify::{EventMask, Inotify, WatchMask};
use rustix::event::{PollFd, PollFlags, Timespec};
use serde_json::json;

use crate::bench_kit::hub::Monitor;

/// A body size the latency part measures.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    pub label: &'static str,
    /// Characters of `data` (none for the smallest).
    data_chars: usize,
    /// The character `data` is made of; its UTF-8 length sets the bytes a character costs.
    fill: char,
    /// Pad `data` so the whole body is this many bytes (ASCII fill only).
    exact_bytes: Option<usize>,
}

/// ~100 B (no data), 4 KB, 16 KB (the data cap in ASCII), and ~64 KB: the data cap of
/// 16,000 characters in 4-byte UTF-8 characters, the only way to reach 64 KB within it.
pub const SIZES: [Size; 4] = [
    Size {
        label: "~100 B",
        data_chars: 0,
        fill: 'x',
        exact_bytes: None,
    },
    Size {
        label: "4 KB",
        data_chars: 0,
        fill: 'x',
        exact_bytes: Some(4_096),
    },
    Size {
        label: "16 KB",
        data_chars: MAX_DATA_CHARS,
        fill: 'x',
        exact_bytes: None,
    },
    Size {
        label: "64 KB (4-byte chars)",
        data_chars: MAX_DATA_CHARS,
        fill: '\u{1D11E}',
        exact_bytes: None,
    },
];

/// A progress signal for `m` of `size`; checked against the hub's caps.
pub fn body(m: &Monitor, size: Size) -> anyhow::Result<String> {
    let with = |data: Option<String>| {
        let mut v =
            json!({"id": m.id, "secret": m.secret, "status": "progress", "message": "bench"});
        if let Some(d) = data {
            v["data"] = d.into();
        }
        v.to_string()
    };
    let text = match size.exact_bytes {
        Some(bytes) => {
            let envelope = with(Some(String::new())).len();
            ensure!(
                bytes > envelope,
                "{}: too small for the envelope",
                size.label
            );
            with(Some(size.fill.to_string().repeat(bytes - envelope)))
        }
        None if size.data_chars == 0 => with(None),
        None => with(Some(size.fill.to_string().repeat(size.data_chars))),
    };
    let data_chars = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["data"].as_str().map(|d| d.chars().count()))
        .unwrap_or(0);
    ensure!(
        text.len() <= MAX_BODY_BYTES && data_chars <= MAX_DATA_CHARS,
        "{}: a body of {} bytes with {data_chars} characters of data is over the caps",
        size.label,
        text.len()
    );
    Ok(text)
}

/// Writes `NAME.tmp` in `dir` and renames it to `NAME.json`; returns the time taken right
/// before the rename.
pub fn drop_file(dir: &Path, name: &str, body: &str) -> anyhow::Result<Instant> {
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, body).with_context(|| format!("writing {}", tmp.display()))?;
    let at = Instant::now();
    let to = dir.join(format!("{name}.json"));
    std::fs::rename(&tmp, &to).with_context(|| format!("renaming to {}", to.display()))?;
    Ok(at)
}

/// An inotify watch on one directory for the events in `mask`, read with a bound.
pub struct Watch {
    inotify: Inotify,
    buf: Vec<u8>,
    dir: PathBuf,
}

impl Watch {
    pub fn new(dir: &Path, mask: WatchMask) -> anyhow::Result<Watch> {
        let inotify = Inotify::init().context("inotify_init")?;
        inotify
            .watches()
            .add(dir, mask | WatchMask::ONLYDIR)
            .with_context(|| format!("watching {}", dir.display()))?;
        Ok(Watch {
            inotify,
            // Room for many events: sizeof(inotify_event) + NAME_MAX + 1 each.
            buf: vec![0; 64 * 1024],
            dir: dir.to_path_buf(),
        })
    }

    /// Blocks until an event of `mask` for `name` arrives; returns when it was read. Other
    /// events are skipped. Fails after `bound`, or when the queue overflowed.
    pub fn wait_for(
        &mut self,
        mask: EventMask,
        name: &str,
        bound: Duration,
    ) -> anyhow::Result<Instant> {
        let until = Instant::now() + bound;
        loop {
            let mut found = false;
            let overflow = self.read(until, |m, n| {
                if m.contains(mask) && n == Some(OsStr::new(name)) {
                    found = true;
                }
            })?;
            let at = Instant::now();
            ensure!(
                !overflow,
                "the inotify queue on {} overflowed",
                self.dir.display()
            );
            if found {
                return Ok(at);
            }
            if Instant::now() >= until {
                bail!(
                    "no {mask:?} for {name} in {} within {bound:?}",
                    self.dir.display()
                );
            }
        }
    }

    /// Waits (until `until` at most) for events and hands each to `f`; returns whether the
    /// queue overflowed. Returns with nothing read when `until` passed.
    fn read(
        &mut self,
        until: Instant,
        mut f: impl FnMut(EventMask, Option<&OsStr>),
    ) -> anyhow::Result<bool> {
        let left = until.saturating_duration_since(Instant::now());
        let timeout = Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let ready = {
            let fd = self.inotify.as_fd();
            let mut fds = [PollFd::new(&fd, PollFlags::IN)];
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(n) => n,
                Err(rustix::io::Errno::INTR) => 0,
                Err(e) => return Err(e).context("poll on the inotify descriptor"),
            }
        };
        if ready == 0 {
            return Ok(false);
        }
        let mut overflow = false;
        match self.inotify.read_events(&mut self.buf) {
            Ok(events) => {
                for e in events {
                    overflow |= e.mask.contains(EventMask::Q_OVERFLOW);
                    f(e.mask, e.name);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e).context("reading inotify events"),
        }
        Ok(overflow)
    }
}

/// Rename → `IN_MOVED_TO` as the bench's own watch sees it, in a directory nobody else
/// watches: the floor under any spool watcher. `n` files, sequential; latencies in us.
pub fn inotify_floor(dir: &Path, n: usize) -> anyhow::Result<Vec<f64>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut watch = Watch::new(dir, WatchMask::MOVED_TO)?;
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("floor-{i:06}");
        let at = drop_file(dir, &name, "{}")?;
        let seen = watch.wait_for(
            EventMask::MOVED_TO,
            &format!("{name}.json"),
            Duration::from_secs(5),
        )?;
        lat.push(seen.duration_since(at).as_secs_f64() * 1e6);
        let path = dir.join(format!("{name}.json"));
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(lat)
}

/// Sequential drops into the agent's spool, one in flight: for each, the time from right
/// before the rename to the bench reading the file's `IN_DELETE`. Latencies in us.
pub fn drop_to_deleted(
    spool: &Path,
    prefix: &str,
    body: &str,
    n: usize,
    bound: Duration,
) -> anyhow::Result<Vec<f64>> {
    let mut watch = Watch::new(spool, WatchMask::DELETE)?;
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("{prefix}-{i:06}");
        let at = drop_file(spool, &name, body)?;
        let gone = watch
            .wait_for(EventMask::DELETE, &format!("{name}.json"), bound)
            .with_context(|| {
                format!("{name}.json was not deleted (not acknowledged by the hub?)")
            })?;
        lat.push(gone.duration_since(at).as_secs_f64() * 1e6);
    }
    Ok(lat)
}

/// What a burst took.
pub struct Burst {
    /// From the first rename to the last file written.
    pub dropped: Duration,
    /// From the first rename to the bench reading the last file's deletion.
    pub drained: Duration,
    /// The deletions were counted by polling the directory (the watch's queue overflowed).
    pub polled: bool,
}

/// Writes `n` files as fast as one thread can (each `.tmp` + rename) and waits, at most
/// `bound`, until the agent deleted them all; a thread counts the deletions meanwhile.
pub fn burst(
    spool: &Path,
    prefix: &str,
    body: &str,
    n: usize,
    bound: Duration,
) -> anyhow::Result<Burst> {
    let mut watch = Watch::new(spool, WatchMask::DELETE)?;
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<anyhow::Result<Option<Instant>>>();
    let counter = {
        let stop = stop.clone();
        let prefix = format!("{prefix}-");
        std::thread::spawn(move || {
            let mut seen = 0usize;
            let result = loop {
                if stop.load(Ordering::Relaxed) {
                    break Ok(None);
                }
                let until = Instant::now() + Duration::from_millis(200);
                let read = watch.read(until, |m, name| {
                    if m.contains(EventMask::DELETE)
                        && name
                            .and_then(OsStr::to_str)
                            .is_some_and(|s| s.starts_with(&prefix) && s.ends_with(".json"))
                    {
                        seen += 1;
                    }
                });
                match read {
                    // Overflowed: the caller counts by polling instead.
                    Ok(true) => break Ok(None),
                    Ok(false) if seen >= n => break Ok(Some(Instant::now())),
                    Ok(false) => {}
                    Err(e) => break Err(e),
                }
            };
            let _ = tx.send(result);
        })
    };
    let start = Instant::now();
    let written = (|| {
        for i in 0..n {
            drop_file(spool, &format!("{prefix}-{i:06}"), body)?;
        }
        anyhow::Ok(start.elapsed())
    })();
    let dropped = match written {
        Ok(d) => d,
        Err(e) => {
            stop.store(true, Ordering::Relaxed);
            let _ = counter.join();
            return Err(e);
        }
    };
    let left = bound.saturating_sub(start.elapsed());
    let outcome = rx.recv_timeout(left);
    stop.store(true, Ordering::Relaxed);
    let _ = counter.join();
    match outcome {
        Ok(Ok(Some(last))) => Ok(Burst {
            dropped,
            drained: last.duration_since(start),
            polled: false,
        }),
        Ok(Ok(None)) => {
            // Overflow: poll the directory every 5 ms until no file of the burst is left.
            let left = bound.saturating_sub(start.elapsed());
            let drained = crate::bench_kit::procs::poll_every(
                Duration::from_millis(5),
                left,
                "the spool to empty",
                || Ok((count_json(spool, prefix)? == 0).then(|| start.elapsed())),
            )?;
            Ok(Burst {
                dropped,
                drained,
                polled: true,
            })
        }
        Ok(Err(e)) => Err(e),
        Err(_) => bail!(
            "the spool still held {} of the burst's {n} files after {bound:?}",
            count_json(spool, prefix)?
        ),
    }
}

/// Files `PREFIX-….json` in `dir`.
pub fn count_json(dir: &Path, prefix: &str) -> anyhow::Result<usize> {
    let prefix = format!("{prefix}-");
    let mut n = 0;
    for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let e = e.with_context(|| format!("listing {}", dir.display()))?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) && name.ends_with(".json") {
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_have_their_sizes_and_stay_under_the_caps() -> anyhow::Result<()> {
        let m = Monitor {
            id: "wp_0123456789abcdef".into(),
            secret: "s".repeat(43),
        };
        let lens: Vec<usize> = SIZES
            .iter()
            .map(|s| body(&m, *s).map(|b| b.len()))
            .collect::<anyhow::Result<_>>()?;
        assert!(lens[0] < 200, "{lens:?}");
        assert_eq!(lens[1], 4_096);
        assert!((16_000..16_300).contains(&lens[2]), "{lens:?}");
        assert!((64_000..=MAX_BODY_BYTES).contains(&lens[3]), "{lens:?}");
        Ok(())
    }
}
