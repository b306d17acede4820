//! The fuzz loop every target shares: proptest's generator and shrinker run in batches
//! until a time or case budget is spent, each case guarded against panics (caught, with
//! the panic's message and place) and hangs (a watchdog), and every failing input saved
//! into the target's corpus directory so the corpus replay fails on it from then on.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once, PoisonError};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

/// One case running longer than this is a hang: the parsers here take microseconds, a
/// store open with its journal well under a second even in a debug build.
const HANG_LIMIT: Duration = Duration::from_secs(30);

/// Cases per proptest runner; a fresh runner (fresh random seed) per batch.
const BATCH: u32 = 256;

/// A run stops after this many new kinds of failure.
const MAX_NEW_FAILURES: usize = 8;

/// How long shrinking one failure may take before the smallest input so far is kept.
const SHRINK_MS: u32 = 60_000;

/// What one run may spend.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub time: Duration,
    pub max_cases: u64,
}

/// What one run did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub cases: u64,
    /// New failures, each saved in the corpus.
    pub failures: Vec<Failure>,
    /// Cases that failed like a corpus file already does.
    pub known: u64,
}

/// A property that did not hold: why, and where its input was saved.
#[derive(Debug)]
pub struct Failure {
    pub reason: String,
    pub saved: Option<PathBuf>,
}

/// A target: what it is called, how one corpus file goes through it, and its fuzz run.
pub struct Target {
    pub name: &'static str,
    /// One input as the corpus stores it (raw bytes) through every property.
    pub check: fn(&[u8]) -> Result<(), String>,
    /// Generated inputs through the same properties for a budget.
    /// Generated inputs through the same properties for a budget, knowing the
    /// [`signature`]s of the corpus's failures.
    pub fuzz: fn(Budget, Vec<String>) -> Outcome,
    /// Valid inputs: the corpus's `seed-*` files (`cortex-fuzz --write-seeds`).
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// The directory holding `<target>/` corpora: `fuzz/corpus` of this crate.
pub fn corpus_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

/// Every corpus file of `target`, sorted by name (a missing directory is empty).
pub fn corpus_files(target: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_root().join(target))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// The corpus's inputs of `target` (the generators mutate them).
pub fn corpus_inputs(target: &str) -> Vec<Vec<u8>> {
    corpus_files(target)
        .iter()
        .filter_map(|p| std::fs::read(p).ok())
        .collect()
}

/// Writes `target`'s seeds as `seed-<hash>` files of its corpus; returns how many.
pub fn write_seeds(target: &Target) -> std::io::Result<usize> {
    let seeds = (target.seeds)();
    let dir = corpus_root().join(target.name);
    std::fs::create_dir_all(&dir)?;
    for s in &seeds {
        std::fs::write(dir.join(format!("seed-{:016x}", fnv1a(s))), s)?;
    }
    Ok(seeds.len())
}

/// Runs every corpus file of `target` through `check`; returns the files that fail.
pub fn replay(target: &Target) -> Vec<(PathBuf, String)> {
    let mut failed = Vec::new();
    for path in corpus_files(target.name) {
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                failed.push((path, format!("cannot read: {e}")));
                continue;
            }
        };
        if let Err(e) = guarded(target.name, &bytes, || (target.check)(&bytes)) {
            failed.push((path, e));
        }
    }
    failed
}

/// Runs generated values of `strategy` through `check` until `budget` is spent;
/// `bytes_of` is how a value is stored in the corpus. A failure of a new kind (see
/// [`signature`]) is shrunk, saved and reported, and the run goes on looking for others;
/// one of a kind in `known` (the corpus's failing files) is only counted, so a bug not
/// yet fixed neither hides the rest nor adds a file to the corpus on every run.
pub fn fuzz<S>(
    target: &'static str,
    strategy: S,
    check: impl Fn(&S::Value) -> Result<(), String>,
    bytes_of: impl Fn(&S::Value) -> Vec<u8>,
    budget: Budget,
    known: Vec<String>,
) -> Outcome
where
    S: Strategy,
    S::Value: Debug,
{
    let start = Instant::now();
    let cases = Cell::new(0u64);
    let known_hits = Cell::new(0u64);
    let shrinking = Cell::new(false);
    let known = RefCell::new(known.into_iter().collect::<HashSet<String>>());
    let mut out = Outcome::default();
    let spent = || start.elapsed() >= budget.time || cases.get() >= budget.max_cases;
    let mut batch = 0u64;
    while !spent() && out.failures.len() < MAX_NEW_FAILURES {
        let mut config = Config {
            cases: BATCH,
            failure_persistence: None,
            max_shrink_time: SHRINK_MS,
            ..Config::default()
        };
        // A fresh random seed per batch; with PROPTEST_RNG_SEED=n, batch b uses n + b, so
        // a run can be repeated.
        if let RngSeed::Fixed(n) = config.rng_seed {
            config.rng_seed = RngSeed::Fixed(n.wrapping_add(batch));
        }
        batch += 1;
        let mut runner = TestRunner::new(config);
        shrinking.set(false);
        let result = runner.run(&strategy, |v| {
            // Past the budget the rest of the batch passes without running, unless a
            // failure is being shrunk.
            if !shrinking.get() {
                if spent() {
                    return Ok(());
                }
                cases.set(cases.get() + 1);
            }
            let bytes = bytes_of(&v);
            match guarded(target, &bytes, || check(&v)) {
                Ok(()) => Ok(()),
                Err(e) if known.borrow().contains(&signature(&e)) => {
                    if !shrinking.get() {
                        known_hits.set(known_hits.get() + 1);
                    }
                    Ok(())
                }
                Err(e) => {
                    shrinking.set(true);
                    Err(TestCaseError::fail(e))
                }
            }
        });
        match result {
            Ok(()) => {}
            Err(TestError::Fail(reason, value)) => {
                known.borrow_mut().insert(signature(reason.message()));
                let saved = save(target, "crash", &bytes_of(&value));
                out.failures.push(Failure {
                    reason: format!("{reason}; minimal input: {}", preview(&value)),
                    saved,
                });
            }
            Err(TestError::Abort(reason)) => {
                out.failures.push(Failure {
                    reason: format!("proptest gave up: {reason}"),
                    saved: None,
                });
                break;
            }
        }
    }
    out.cases = cases.get();
    out.known = known_hits.get();
    out
}

/// What makes two failures the same bug: a panic's file (its line left out: one bad
/// input reaches neighbouring lines of the same function), else the violated property's
/// words before any number or quoted value.
pub fn signature(reason: &str) -> String {
    if let Some(rest) = reason.strip_prefix("panicked")
        && let Some(at) = rest.rfind(" at ")
    {
        let place = &rest[at..];
        let file = place.rsplit_once(':').map_or(place, |(f, _)| f);
        return format!("panic{file}");
    }
    reason
        .split(|c: char| c.is_ascii_digit() || c == '"' || c == '{' || c == '(')
        .next()
        .unwrap_or(reason)
        .to_owned()
}

fn preview(v: &impl Debug) -> String {
    let s = format!("{v:?}");
    if s.len() > 400 {
        let cut = (0..=400)
            .rev()
            .find(|i| s.is_char_boundary(*i))
            .unwrap_or(0);
        format!("{}… ({} characters)", &s[..cut], s.len())
    } else {
        s
    }
}

/// Saves `bytes` as `<kind>-<hash>` in the target's corpus (same content, same name).
fn save(target: &str, kind: &str, bytes: &[u8]) -> Option<PathBuf> {
    let dir = corpus_root().join(target);
    let path = dir.join(format!("{kind}-{:016x}", fnv1a(bytes)));
    let written = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, bytes));
    match written {
        Ok(()) => Some(path),
        Err(e) => {
            eprintln!(
                "fuzz: {target}: cannot save a failing input to {}: {e}",
                path.display()
            );
            None
        }
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The case each fuzzing thread is running, for the watchdog.
struct Running {
    target: &'static str,
    since: Instant,
    bytes: Vec<u8>,
}

/// Panics of the store's threads, taken by the case that was running.
static STRAY: Mutex<Vec<String>> = Mutex::new(Vec::new());
static RUNNING: Mutex<Option<HashMap<ThreadId, Running>>> = Mutex::new(None);
static WATCHDOG: Once = Once::new();
static QUIET_HOOK: Once = Once::new();

thread_local! {
    /// Set while a guarded case runs: its panics are caught and reported, not printed.
    static QUIET: Cell<bool> = const { Cell::new(false) };
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Runs one case: a panic becomes an error naming its message and place; a case that
/// never returns is caught by the watchdog, which saves its input and ends the process
/// (a thread cannot be stopped from outside).
fn guarded(
    target: &'static str,
    bytes: &[u8],
    f: impl FnOnce() -> Result<(), String>,
) -> Result<(), String> {
    QUIET_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // The store's own threads (writer, checkpoint) run the code under test too;
            // their panics would end only that thread, silently: recorded as strays.
            let store_thread = std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("store-"));
            if QUIET.with(Cell::get) || store_thread {
                let place = info
                    .location()
                    .map(|l| format!(" at {}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                let msg = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a non-text panic".into());
                let what = format!("{msg}{place}");
                if store_thread {
                    STRAY
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(format!(
                            "in thread {:?}: {what}",
                            std::thread::current().name().unwrap_or("?")
                        ));
                } else {
                    LAST_PANIC.with(|p| *p.borrow_mut() = Some(what));
                }
            } else {
                previous(info);
            }
        }));
    });
    WATCHDOG.call_once(|| {
        std::thread::spawn(watchdog);
    });
    let me = std::thread::current().id();
    RUNNING
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(HashMap::new)
        .insert(
            me,
            Running {
                target,
                since: Instant::now(),
                bytes: bytes.to_vec(),
            },
        );
    QUIET.with(|q| q.set(true));
    let result = std::panic::catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(false));
    if let Some(map) = RUNNING
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_mut()
    {
        map.remove(&me);
    }
    let strays = std::mem::take(&mut *STRAY.lock().unwrap_or_else(PoisonError::into_inner));
    match result {
        Ok(Ok(())) if !strays.is_empty() => Err(format!("panicked {}", strays.join("; "))),
        Ok(r) => r,
        Err(_) => Err(format!(
            "panicked: {}",
            LAST_PANIC
                .with(|p| p.borrow_mut().take())
                .unwrap_or_else(|| "(no message)".into())
        )),
    }
}

fn watchdog() {
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let guard = RUNNING.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(map) = guard.as_ref() else { continue };
        if let Some(r) = map.values().find(|r| r.since.elapsed() > HANG_LIMIT) {
            let saved = save(r.target, "hang", &r.bytes);
            eprintln!(
                "fuzz: {}: a case ran over {} s (a hang); its input is saved at {}",
                r.target,
                HANG_LIMIT.as_secs(),
                saved.map_or_else(|| "(not saved)".into(), |p| p.display().to_string())
            );
            std::process::exit(3);
        }
    }
}

/// Byte-level mutations of a seed: what a fuzzer's mutator does, as a strategy.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// XOR the byte at (index mod length).
    Flip(usize, u8),
    /// Insert bytes at (index mod length + 1).
    Insert(usize, Vec<u8>),
    /// Remove up to n bytes from (index mod length).
    Remove(usize, usize),
    /// Keep only the first (index mod length + 1) bytes.
    Truncate(usize),
    /// Copy a run of the input onto another place (repeats structure).
    Splice(usize, usize, usize),
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (any::<usize>(), 1..=255u8).prop_map(|(i, x)| Mutation::Flip(i, x)),
        2 => (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        2 => (any::<usize>(), 1..64usize).prop_map(|(i, n)| Mutation::Remove(i, n)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        1 => (any::<usize>(), any::<usize>(), 1..256usize)
            .prop_map(|(a, b, n)| Mutation::Splice(a, b, n)),
    ]
}

/// Applies `muts` to a copy of `seed`.
pub fn mutate(seed: &[u8], muts: &[Mutation]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for m in muts {
        let len = b.len();
        match m {
            Mutation::Flip(i, x) if len > 0 => b[i % len] ^= x,
            Mutation::Insert(i, bytes) => {
                let at = if len == 0 { 0 } else { i % (len + 1) };
                b.splice(at..at, bytes.iter().copied());
            }
            Mutation::Remove(i, n) if len > 0 => {
                let at = i % len;
                let end = (at + n).min(len);
                b.drain(at..end);
            }
            Mutation::Truncate(i) if len > 0 => b.truncate(i % len + 1),
            Mutation::Splice(from, to, n) if len > 0 => {
                let from = from % len;
                let n = (*n).min(len - from);
                let run = b[from..from + n].to_vec();
                let to = to % len;
                let end = (to + n).min(len);
                b.splice(to..end, run);
            }
            _ => {}
        }
    }
    b
}

/// Seeds mutated: the corpus's inputs (or `fallback` when it has none).
pub fn mutated(seeds: Vec<Vec<u8>>, fallback: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    use proptest::prelude::*;
    let seeds = if seeds.is_empty() { fallback } else { seeds };
    (
        proptest::sample::select(seeds),
        proptest::collection::vec(mutation(), 1..8),
    )
        .prop_map(|(seed, muts)| mutate(&seed, &muts))
}
