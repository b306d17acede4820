//! Measures the two ways a flock wait can tell that a lock is free, for the numbers in
//! `host/src/wait/flock.rs`:
//! - probing (`LOCK_EX|LOCK_NB`, then `LOCK_UN` at once): how long the lock is held per
//!   probe that finds it free, what a probe costs while it is held, and how often a job
//!   hammering `flock -n` fails because of a prober;
//! - reading `/proc/locks`: what one read and parse costs, with few locks and with 1,000.
//!
//! `cargo run --release -p cortex-host --example flock_probe`. About 5 s. Nothing
//! is left behind: the files live in a temp directory removed at the end.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cortex_host::wait::{open_lock_file, probe, proc_locks_held};
use rustix::fs::{FlockOperation, flock};

fn main() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("cortex-flock-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run(dir: &Path) -> anyhow::Result<()> {
    let lock = dir.join("job.lock");
    File::create(&lock)?;
    let fd = open_lock_file(&lock)?;

    // 1. A free lock: the window between asking for it and having given it back.
    let mut held = Vec::with_capacity(200_000);
    for _ in 0..200_000 {
        let t0 = Instant::now();
        let free = probe(&fd)?;
        held.push(t0.elapsed().as_nanos() as u64);
        anyhow::ensure!(free, "the lock should be free");
    }
    report(
        "probe, free lock: lock requested → released (upper bound of the hold)",
        &mut held,
    );

    // 2. A held lock: the probe fails at once and takes nothing.
    let holder = open_lock_file(&lock)?;
    flock(&holder, FlockOperation::LockExclusive)?;
    let mut busy = Vec::with_capacity(200_000);
    for _ in 0..200_000 {
        let t0 = Instant::now();
        let free = probe(&fd)?;
        busy.push(t0.elapsed().as_nanos() as u64);
        anyhow::ensure!(!free, "the lock should be held");
    }
    report("probe, held lock (fails, takes nothing)", &mut busy);
    let meta = std::fs::metadata(&lock)?;
    let (dev, ino) = (meta.dev(), meta.ino());

    // 3. /proc/locks, as it is, then with 1,000 more flocks held by this process.
    proc_locks(
        "/proc/locks: read + parse, the system's own locks",
        dev,
        ino,
    )?;
    let mut many = Vec::with_capacity(1000);
    for i in 0..1000 {
        let p = dir.join(format!("many-{i}"));
        File::create(&p)?;
        let f = open_lock_file(&p)?;
        flock(&f, FlockOperation::LockExclusive)?;
        many.push(f);
    }
    proc_locks("/proc/locks: read + parse, 1,000 more locks held", dev, ino)?;
    drop(many);
    flock(&holder, FlockOperation::Unlock)?;
    drop(holder);

    // 4. A job hammering `flock -n` (take, release) on a free lock for 2 s while a prober
    // probes every millisecond: how many of the job's attempts fail because of the prober.
    let stop = Arc::new(AtomicBool::new(false));
    let (tries, fails) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let job = {
        let (stop, tries, fails) = (stop.clone(), tries.clone(), fails.clone());
        let jfd = open_lock_file(&lock)?;
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                tries.fetch_add(1, Ordering::Relaxed);
                match flock(jfd.as_fd(), FlockOperation::NonBlockingLockExclusive) {
                    Ok(()) => {
                        let _ = flock(jfd.as_fd(), FlockOperation::Unlock);
                    }
                    Err(_) => {
                        fails.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };
    let (mut probes, mut found_free) = (0u64, 0u64);
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        probes += 1;
        if probe(&fd)? {
            found_free += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = job.join();
    let (t, f) = (tries.load(Ordering::Relaxed), fails.load(Ordering::Relaxed));
    println!(
        "job hammering flock -n for 2 s beside a 1 ms prober: {f} of {t} attempts failed (1 in {}); the prober found it free {found_free} of {probes} times",
        t.checked_div(f).map_or("∞".to_string(), |n| n.to_string()),
    );
    Ok(())
}

fn proc_locks(what: &str, dev: u64, ino: u64) -> anyhow::Result<()> {
    let mut times = Vec::with_capacity(2000);
    let mut seen = 0;
    for _ in 0..2000 {
        let t0 = Instant::now();
        let text = std::fs::read_to_string("/proc/locks")?;
        seen = proc_locks_held(&text, dev, ino);
        times.push(t0.elapsed().as_nanos() as u64);
    }
    anyhow::ensure!(
        seen == 1,
        "/proc/locks should list the held lock once, saw {seen}"
    );
    report(what, &mut times);
    Ok(())
}

fn report(what: &str, ns: &mut [u64]) {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() as f64 - 1.0) * q) as usize] as f64 / 1000.0;
    println!(
        "{what}: p50 {:.2} µs, p99 {:.2} µs, p99.99 {:.1} µs, max {:.1} µs (n={})",
        at(0.5),
        at(0.99),
        at(0.9999),
        at(1.0),
        ns.len()
    );
}
