//! A full disk under the real hub: its home on a small tmpfs, filled by a filler file.
//! When the journal cannot grow, each signal gets a 503 in the JSON error shape (not a
//! hang, not a 202), the hub goes on answering and takes signals again once the filler
//! is deleted; when redb cannot checkpoint, the hub exits non-zero (so a service manager
//! restarts it). Either way, after a restart on the same home with space freed, every
//! signal that got a 202 is recorded exactly once and none that got a 503 is.

// Fields of JSON the hub just answered with; a panic is the test failing.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use cortex_tests::{Hub, wait_until};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);

/// A tmpfs of a few MiB mounted on a temp dir, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounting a filesystem needs root (CAP_SYS_ADMIN); CI and the development machine
    /// run the suite as root, so `id -u` is checked first. Without root this test fails
    /// and says why instead of skipping: a full disk is only real on a filesystem that can
    /// fill up, and filling the machine's own disk is not an option. (A user namespace,
    /// `unshare --user --map-root-user --mount`, could mount one, but the hub, restarted
    /// on the same home, would have to join that namespace each time; not built.)
    fn mount(mib: u32) -> Tmpfs {
        let uid = rustix::process::getuid().as_raw();
        assert_eq!(
            uid, 0,
            "the full-disk tests mount a small tmpfs, which needs root, and this is uid {uid}: run the suite as root (a user namespace is not used: the restarted hub would have to join it)"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mib}m,mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "cannot mount a tmpfs on {} as root: {}",
            dir.path().display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a filler file until the filesystem refuses with ENOSPC; returns its path.
    fn fill(&self) -> PathBuf {
        let path = self.path().join("filler");
        let mut f = std::fs::File::create(&path).expect("filler");
        let block = vec![0x55u8; 64 * 1024];
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error()) => {
                    break;
                }
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
        // Whatever a short write left: a page or two.
        let mut byte = [0u8; 1];
        while f.write(&byte).is_ok_and(|n| n == 1) {
            byte[0] = byte[0].wrapping_add(1);
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: a hub killed a moment ago may still hold a file open.
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}

/// What a signal got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Accepted,
    Refused,
    /// No answer: the hub exited, before or while the request was in flight.
    None,
}

/// A hub whose home is on a tmpfs, one waitpoint, and every signal's answer by key.
struct Run {
    // Dropped in this order: the hub killed before its filesystem is unmounted.
    hub: Hub,
    fs: Tmpfs,
    _logs: tempfile::TempDir,
    wp: Value,
    answers: HashMap<String, Answer>,
    next: usize,
}

impl Run {
    fn start() -> Run {
        let fs = Tmpfs::mount(16);
        let logs = tempfile::tempdir().expect("tempdir");
        let mut hub = Hub::at(
            &fs.path().join("home"),
            &logs.path().join("hub.log"),
            &[],
            &["--mesh-listen", "off"],
        );
        hub.spawn();
        let sid = hub.session();
        let wp = hub.waitpoint(
            &sid,
            json!({"label": "m", "intent": "x", "max_signals": 10000}),
        );
        Run {
            hub,
            fs,
            _logs: logs,
            wp,
            answers: HashMap::new(),
            next: 0,
        }
    }

    fn store_file(&self, name: &str) -> PathBuf {
        self.hub.home.join("hub").join(name)
    }

    /// Waits until redb was written after `since`: a checkpoint landed, so the changes
    /// made before `since` are frozen and the journal went on in its other file.
    fn wait_checkpoint(&self, since: SystemTime) {
        let db = self.store_file("hub.redb");
        wait_until(T, "a checkpoint into redb", || {
            let m = std::fs::metadata(&db).ok()?.modified().ok()?;
            (m > since).then_some(())
        });
    }

    /// Sends one progress signal of about 17 KB (`big`) or a few bytes, under a fresh key.
    fn send(&mut self, big: bool) -> Answer {
        let key = format!("k{}", self.next);
        self.next += 1;
        let mut b = json!({"id": self.wp["id"], "secret": self.wp["secret"],
            "status": "progress", "key": key});
        if big {
            b["message"] = json!("m".repeat(1900));
            b["data"] = json!("d".repeat(15_000));
        }
        let answer = match self.hub.try_signal(&b) {
            Ok((202, _)) => Answer::Accepted,
            Ok((503, v)) => {
                assert!(
                    v["error"].as_str().is_some_and(|e| !e.is_empty())
                        && v["message"].as_str().is_some_and(|m| !m.is_empty()),
                    "a 503 in the JSON error shape: {v}"
                );
                Answer::Refused
            }
            Ok((st, v)) => panic!("signal {key}: {st} {v}\n{}", self.hub.log()),
            Err(_) => Answer::None,
        };
        self.answers.insert(key, answer);
        answer
    }

    fn count(&self, a: Answer) -> usize {
        self.answers.values().filter(|x| **x == a).count()
    }

    /// With the filler gone, the hub started again on the same home: every 202 recorded
    /// once, no 503 recorded, a signal without an answer at most once; and it takes new
    /// signals.
    fn check_after_restart(&mut self) {
        self.hub.spawn();
        let v = self.hub.get_waitpoint(self.wp["id"].as_str().unwrap());
        let mut seen: HashMap<String, usize> = HashMap::new();
        for s in v["signals"].as_array().unwrap() {
            *seen
                .entry(s["key"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
        let mut recorded = 0;
        for (key, answer) in &self.answers {
            let n = seen.get(key).copied().unwrap_or(0);
            recorded += n;
            match answer {
                Answer::Accepted => assert_eq!(n, 1, "{key} got 202: recorded once"),
                Answer::Refused => assert_eq!(n, 0, "{key} got 503: never recorded"),
                Answer::None => assert!(n <= 1, "{key}: recorded at most once"),
            }
        }
        assert_eq!(v["signal_count"], recorded, "nothing else counted");
        assert_eq!(self.send(false), Answer::Accepted, "{}", self.hub.log());
    }
}

/// The journal's active file must grow for the next record and cannot: every signal gets
/// a 503 (and nothing is checkpointed, since nothing changed), the hub stays up, and the
/// first signal after the filler is deleted gets a 202.
#[test]
fn a_journal_that_cannot_grow_answers_503_and_recovers_when_space_returns() {
    if cortex_tests::redb_only("the journal's file on a full disk") {
        return;
    }
    let mut run = Run::start();
    // The setup's changes checkpointed: the journal goes on in its other file, empty.
    run.wait_checkpoint(SystemTime::now());
    let filler = run.fs.fill();
    for _ in 0..5 {
        let a = run.send(true);
        assert_eq!(a, Answer::Refused, "a full disk:\n{}", run.hub.log());
    }
    assert!(
        run.hub.exited().is_none(),
        "the hub stays up\n{}",
        run.hub.log()
    );
    assert!(
        run.hub.log().contains("cannot write the store's journal"),
        "{}",
        run.hub.log()
    );

    std::fs::remove_file(&filler).unwrap();
    wait_until(T, "a 202 once the disk has room", || match run.send(true) {
        Answer::Accepted => Some(()),
        Answer::Refused => None,
        Answer::None => panic!("the hub stopped:\n{}", run.hub.log()),
    });
    for _ in 0..5 {
        assert_eq!(run.send(true), Answer::Accepted, "{}", run.hub.log());
    }
    assert!(run.hub.stop().success(), "{}", run.hub.log());
    assert!(run.count(Answer::Accepted) >= 6);
    run.check_after_restart();
}

/// Both journal files have room, redb has none: the signals get 202 (journaled), the
/// checkpoint fails, fails again, and the hub exits non-zero (a signal in flight as it
/// stops may get a 503, or no answer); the restart replays the journal and every 202 is
/// there once.
#[test]
fn redb_that_cannot_checkpoint_stops_the_hub_non_zero_and_the_journal_keeps_every_202() {
    if cortex_tests::redb_only("redb's file on a full disk") {
        return;
    }
    let mut run = Run::start();
    run.wait_checkpoint(SystemTime::now());
    // The journal's other file grows by its first record: both files have room now.
    assert_eq!(run.send(false), Answer::Accepted);
    let second = run.store_file("hub.journal2");
    wait_until(T, "both journal files allocated", || {
        let len = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
        (len(&run.store_file("hub.journal")) > 0 && len(&second) > 0).then_some(())
    });
    run.fs.fill();
    // About 500 KB of records: within the journal files' room, beyond redb's.
    for _ in 0..30 {
        if run.send(true) == Answer::None {
            break;
        }
    }
    let start = std::time::Instant::now();
    let st = loop {
        if let Some(st) = run.hub.exited() {
            break st;
        }
        assert!(
            start.elapsed() < T,
            "the hub did not exit:\n{}",
            run.hub.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!st.success(), "exits non-zero: {st}\n{}", run.hub.log());
    let log = run.hub.log();
    assert!(
        log.contains("checkpoints into redb keep failing") && log.contains("No space left"),
        "{log}"
    );
    // The writer ends by itself (it waits for no checkpoint that is not in flight); the
    // stop's bound is only a safety net.
    assert!(
        !log.contains("did not finish its last checkpoint in time"),
        "{log}"
    );
    assert!(run.count(Answer::Accepted) >= 2, "{log}");
    std::fs::remove_file(run.fs.path().join("filler")).unwrap();
    run.check_after_restart();
}
