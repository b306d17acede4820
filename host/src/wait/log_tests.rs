//! Log, silence and any-of wait tests: the pure line and position rules as tables, then
//! real files in temp dirs appended, rotated and truncated under real inotify, and real
//! processes for the any-of's pid condition. Every wait is bounded; nothing asserts on
//! elapsed time.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cortex_protocol::waits::{LOG_LINE_MAX_BYTES, LOG_LINES_BEFORE, compile_pattern};

use super::tests::utf8;
use super::*;

const BOUND: Duration = Duration::from_secs(20);

fn scanner(pattern: &str, at: u64) -> Scanner {
    Scanner::new(compile_pattern(pattern).expect("pattern"), at)
}

fn append(path: &Path, text: &str) {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open for append");
    f.write_all(text.as_bytes()).expect("append");
}

fn log_spec(path: &Path, pattern: &str) -> WaitSpec {
    WaitSpec::Log {
        path: utf8(path),
        pattern: pattern.into(),
        cursor: None,
        silence_ms: None,
    }
}

fn fired(o: WaitOutcome) -> Fire {
    match o {
        WaitOutcome::Fired(f) => f,
        other => panic!("expected Fired, got {other:?}"),
    }
}

fn spawn(armed: Armed) -> tokio::task::JoinHandle<WaitOutcome> {
    tokio::spawn(async move { armed.wait(&WaitOptions::new(BOUND)).await })
}

/// Lets the spawned wait run until it blocks (current-thread runtime: it runs on yields).
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

// ---- pure pieces ----

#[test]
fn lines_are_split_across_chunks_and_carry_their_offsets() {
    let mut s = scanner("^d", 100);
    assert_eq!(s.feed(b"ab"), None);
    assert_eq!(s.feed(b"c\nde"), None);
    let hit = s.feed(b"f\r\nghi\n").expect("hit");
    assert_eq!(hit.line, "def");
    assert_eq!(hit.before, vec!["abc".to_string()]);
    // "abc\n" is 100..104, "def\r\n" 104..109.
    assert_eq!((hit.offset, hit.end), (104, 109));
    assert_eq!(s.next_offset(), 109);
}

#[test]
fn a_line_without_its_newline_waits_for_it() {
    let mut s = scanner("nan", 0);
    assert_eq!(s.feed(b"loss=na"), None);
    assert_eq!(s.feed(b"n"), None, "no newline yet: not a line");
    assert_eq!(s.line_start(), 0);
    let hit = s.feed(b" step 3\n").expect("hit");
    assert_eq!(
        (hit.line.as_str(), hit.offset, hit.end),
        ("loss=nan step 3", 0, 16)
    );
}

#[test]
fn before_holds_the_last_few_lines() {
    let mut s = scanner("hit", 0);
    let mut text = String::new();
    for i in 0..10 {
        text.push_str(&format!("line {i}\n"));
    }
    text.push_str("hit\n");
    let hit = s.feed(text.as_bytes()).expect("hit");
    assert_eq!(hit.before.len(), LOG_LINES_BEFORE);
    assert_eq!(hit.before.last().map(String::as_str), Some("line 9"));
    assert_eq!(hit.before[0], format!("line {}", 10 - LOG_LINES_BEFORE));
}

#[test]
fn a_huge_line_is_matched_on_its_first_part_and_cut_in_the_payload() {
    let mut s = scanner("^x+nan", 0);
    let mut line = "x".repeat(MAX_PARTIAL_BYTES / 2);
    line.push_str("nan");
    line.push_str(&"y".repeat(MAX_PARTIAL_BYTES * 2));
    line.push('\n');
    // In small chunks, as a slow writer would.
    let mut hit = None;
    for c in line.as_bytes().chunks(4096) {
        if let Some(h) = s.feed(c) {
            hit = Some(h);
        }
    }
    let hit = hit.expect("hit");
    assert_eq!(hit.end, line.len() as u64, "the whole line is consumed");
    assert!(hit.line.ends_with('…'));
    assert!(hit.line.len() <= LOG_LINE_MAX_BYTES + '…'.len_utf8());
    // Past the kept part, a match is not seen.
    let mut s = scanner("nan", 0);
    let late = format!("{}nan\n", "z".repeat(MAX_PARTIAL_BYTES + 10));
    assert_eq!(s.feed(late.as_bytes()), None);
}

#[test]
fn lines_are_cut_at_a_character_boundary_and_read_lossily() {
    let e = "é".repeat(LOG_LINE_MAX_BYTES); // two bytes each
    let cut = cut_line(e.as_bytes());
    assert!(cut.ends_with('…'));
    assert!(cut.len() <= LOG_LINE_MAX_BYTES + '…'.len_utf8());
    assert_eq!(cut_line(b"ok"), "ok");
    assert_eq!(cut_line(b"a\xffb"), "a\u{fffd}b");
    let mut s = scanner("bad", 0);
    assert_eq!(s.feed(b"\xff bad\n").expect("hit").line, "\u{fffd} bad");
}

#[test]
fn a_start_in_the_middle_of_a_line_matches_it_whole() {
    let mut s = scanner("^loss=nan$", 0);
    s.resume_mid_line(5, b"loss=");
    let hit = s.feed(b"nan\n").expect("hit");
    assert_eq!((hit.line.as_str(), hit.offset, hit.end), ("loss=nan", 0, 9));
}

#[test]
fn where_a_log_wait_starts_reading() {
    let st = |ino, size| FileState { dev: 1, ino, size };
    let cur = |exists, ino, offset| LogCursor {
        exists,
        dev: 1,
        ino,
        offset,
    };
    let cases = [
        // No cursor: from the end.
        (None, st(7, 500), 500),
        // The same file, grown: on from the cursor.
        (Some(cur(true, 7, 200)), st(7, 500), 200),
        (Some(cur(true, 7, 500)), st(7, 500), 500),
        // Cut below the cursor: truncated, from 0.
        (Some(cur(true, 7, 600)), st(7, 500), 0),
        // Another inode: rotated, from 0.
        (Some(cur(true, 8, 200)), st(7, 500), 0),
        // It was not there when the cursor was taken: all of it is new.
        (Some(cur(false, 0, 0)), st(7, 500), 0),
    ];
    for (c, now, want) in cases {
        assert_eq!(start_offset(c.as_ref(), &now), want, "{c:?} {now:?}");
    }
}

#[test]
fn truncation_and_rotation_decided() {
    let st = |ino, size| FileState { dev: 1, ino, size };
    assert_eq!(turn(&st(7, 100), 50, Some(&st(7, 100))), Turn::ReadOn);
    assert_eq!(turn(&st(7, 100), 100, None), Turn::ReadOn);
    assert_eq!(turn(&st(7, 10), 50, Some(&st(7, 10))), Turn::Truncated);
    assert_eq!(turn(&st(7, 10), 50, None), Turn::Truncated);
    assert_eq!(turn(&st(7, 100), 50, Some(&st(8, 3))), Turn::Rotated);
    // Rotated wins: whatever is left of the old file is read, then the new one.
    assert_eq!(turn(&st(7, 10), 50, Some(&st(8, 3))), Turn::Rotated);
}

#[test]
fn what_counts_as_growth() {
    let c = |exists, ino, size| FileCursor {
        exists,
        dev: 1,
        ino,
        size,
        mtime_ns: 5,
    };
    assert!(grew(&c(true, 7, 10), &c(true, 7, 11)));
    assert!(
        grew(&c(true, 7, 10), &c(true, 7, 0)),
        "a truncation is activity"
    );
    assert!(
        grew(&c(true, 7, 10), &c(true, 8, 10)),
        "a new file is activity"
    );
    assert!(grew(&FileCursor::absent(), &c(true, 7, 0)), "created");
    assert!(!grew(&c(true, 7, 10), &c(true, 7, 10)));
    assert!(
        !grew(&c(true, 7, 10), &FileCursor::absent()),
        "gone is quiet"
    );
    let mut touched = c(true, 7, 10);
    touched.mtime_ns = 9;
    assert!(
        !grew(&c(true, 7, 10), &touched),
        "times alone are not growth"
    );
}

// ---- real files ----

#[tokio::test]
async fn a_log_wait_fires_on_the_first_matching_line_appended_after_the_arm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("train.log");
    append(&log, "epoch 1 loss=nan (old, before the arm)\n");
    let waits = Waits::new();
    let armed = waits.arm(&log_spec(&log, "loss=nan")).expect("arm");
    let Captured::Log(c) = armed.captured() else {
        panic!("not a log wait")
    };
    let old_len = fs::metadata(&log).expect("meta").len();
    assert!(c.exists && c.watching);
    assert_eq!((c.size, c.start), (old_len, old_len));
    let task = spawn(armed);
    settle().await;
    append(&log, "epoch 2 loss=0.5\n");
    append(&log, "epoch 3 loss=n");
    append(&log, "an\nepoch 4 loss=nan\n");
    let f = fired(task.await.expect("join"));
    assert_eq!(f.payload["kind"], "log");
    assert_eq!(f.payload["line"], "epoch 3 loss=nan");
    assert_eq!(f.payload["before"], serde_json::json!(["epoch 2 loss=0.5"]));
    let line_at = old_len + "epoch 2 loss=0.5\n".len() as u64;
    assert_eq!(f.payload["offset"], line_at);
    let cursor = f.cursor.and_then(Cursor::log).expect("a log cursor");
    assert_eq!(cursor.offset, line_at + "epoch 3 loss=nan\n".len() as u64);
    assert_eq!(cursor.ino, fs::metadata(&log).expect("meta").ino());
    assert_eq!(f.payload["cursor"]["offset"], cursor.offset);
    assert_eq!(
        waits.file_watches().descriptors(),
        0,
        "nothing left watched"
    );

    // Re-armed from the cursor: the next match, not the same line again.
    let spec = WaitSpec::Log {
        path: utf8(&log),
        pattern: "loss=nan".into(),
        cursor: Some(cursor),
        silence_ms: None,
    };
    let f = fired(
        waits
            .arm(&spec)
            .expect("arm")
            .wait(&WaitOptions::new(BOUND))
            .await,
    );
    assert_eq!(f.payload["line"], "epoch 4 loss=nan");
}

#[tokio::test]
async fn a_log_not_there_yet_is_read_from_its_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("later.log");
    let waits = Waits::new();
    let armed = waits.arm(&log_spec(&log, "ready")).expect("arm");
    let Captured::Log(c) = armed.captured() else {
        panic!("not a log wait")
    };
    assert!(!c.exists);
    let resume = armed.resume_spec();
    let task = spawn(armed);
    settle().await;
    append(&log, "starting\nready at 12:00\n");
    let f = fired(task.await.expect("join"));
    assert_eq!(
        (f.payload["line"].as_str(), f.payload["offset"].as_u64()),
        (Some("ready at 12:00"), Some(9))
    );
    // The resume spec says "not there": a re-arm reads the file from 0 too.
    let WaitSpec::Log { cursor, .. } = resume else {
        panic!("not a log spec")
    };
    assert_eq!(cursor, Some(LogCursor::default()));
}

#[tokio::test]
async fn a_log_rotated_by_rename_is_followed_to_the_new_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("app.log");
    let old = dir.path().join("app.log.1");
    append(&log, "boot\n");
    let waits = Waits::new();
    let task = spawn(waits.arm(&log_spec(&log, "ERROR")).expect("arm"));
    settle().await;
    // logrotate's default: rename, then a new file under the name.
    fs::rename(&log, &old).expect("rename");
    append(&log, "fresh start\nERROR in the new file\n");
    let f = fired(task.await.expect("join"));
    assert_eq!(f.payload["line"], "ERROR in the new file");
    assert_eq!(f.payload["offset"], 12);
    let cursor = f.cursor.and_then(Cursor::log).expect("cursor");
    assert_eq!(cursor.ino, fs::metadata(&log).expect("meta").ino());

    // A line the old writer still writes to the renamed file before the new one comes is
    // read through the descriptor held.
    let task = spawn(waits.arm(&log_spec(&log, "ERROR")).expect("arm"));
    settle().await;
    let older = dir.path().join("app.log.2");
    fs::rename(&log, &older).expect("rename");
    append(&older, "ERROR late in the old file\n");
    let f = fired(task.await.expect("join"));
    assert_eq!(f.payload["line"], "ERROR late in the old file");
}

#[tokio::test]
async fn a_truncated_log_is_read_again_from_its_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("app.log");
    append(&log, &"filler line\n".repeat(50));
    let waits = Waits::new();
    let task = spawn(waits.arm(&log_spec(&log, "FATAL")).expect("arm"));
    settle().await;
    // copytruncate: the same inode, cut to 0, then written again.
    OpenOptions::new()
        .write(true)
        .open(&log)
        .expect("open")
        .set_len(0)
        .expect("truncate");
    append(&log, "FATAL after the cut\n");
    let f = fired(task.await.expect("join"));
    assert_eq!(
        (f.payload["line"].as_str(), f.payload["offset"].as_u64()),
        (Some("FATAL after the cut"), Some(0))
    );
}

#[tokio::test]
async fn a_resumed_log_wait_misses_nothing_written_meanwhile_and_repeats_nothing_older() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("run.log");
    append(&log, "nan before the arm\n");
    let waits = Waits::new();
    let armed = waits.arm(&log_spec(&log, "nan")).expect("arm");
    let resume = armed.resume_spec();
    // The waiter dies (dropped), a line is written while none is armed.
    drop(armed);
    append(&log, "ok\nnan while down\n");
    let f = fired(
        waits
            .arm(&resume)
            .expect("re-arm")
            .wait(&WaitOptions::new(BOUND))
            .await,
    );
    assert_eq!(f.payload["line"], "nan while down");
    assert_eq!(f.payload["before"], serde_json::json!(["ok"]));
}

#[tokio::test]
async fn a_log_wait_with_a_silence_fires_when_the_writer_stops_not_while_it_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("quiet.log");
    append(&log, "start\n");
    let waits = Waits::new();
    let spec = WaitSpec::Log {
        path: utf8(&log),
        pattern: "never-printed".into(),
        cursor: None,
        silence_ms: Some(1_000),
    };
    let task = spawn(waits.arm(&spec).expect("arm"));
    // Writes every 50 ms for 2 s: longer than the silence, so only the writes keep it
    // from firing.
    for i in 0..40 {
        append(&log, &format!("step {i}\n"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!task.is_finished(), "fired while the log was growing");
    }
    let size = fs::metadata(&log).expect("meta").len();
    let f = fired(task.await.expect("join"));
    assert_eq!(f.payload["reason"], "silent");
    assert_eq!(f.payload["size"], size);
    assert_eq!(
        f.cursor.and_then(Cursor::log).map(|c| c.offset),
        Some(size),
        "the position after every line read"
    );
}

#[tokio::test]
async fn a_file_silence_fires_when_it_stops_growing_and_a_missing_file_is_silent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("progress");
    let waits = Waits::new();
    let spec = |silence_ms| WaitSpec::File {
        path: utf8(&f),
        cursor: None,
        silence_ms: Some(silence_ms),
    };
    // Missing: nothing grows.
    let out = fired(
        waits
            .arm(&spec(200))
            .expect("arm")
            .wait(&WaitOptions::new(BOUND))
            .await,
    );
    assert_eq!(
        (
            out.payload["reason"].as_str(),
            out.payload["exists"].as_bool()
        ),
        (Some("silent"), Some(false))
    );

    let armed = waits.arm(&spec(1_000)).expect("arm");
    let resume = armed.resume_spec();
    assert!(matches!(
        resume,
        WaitSpec::File {
            silence_ms: Some(1_000),
            ..
        }
    ));
    let task = spawn(armed);
    for i in 0..40 {
        append(&f, &format!("{i}\n"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!task.is_finished(), "fired while the file was growing");
    }
    let size = fs::metadata(&f).expect("meta").len();
    let out = fired(task.await.expect("join"));
    assert_eq!(
        (out.payload["event"].as_str(), out.payload["size"].as_u64()),
        (Some("silent"), Some(size))
    );
    assert!(out.payload["silent_ms"].as_u64().expect("silent_ms") >= 1_000);
    assert_eq!(waits.file_watches().descriptors(), 0);
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sleeper() -> Proc {
    Proc(
        Command::new("sleep")
            .arg("300")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sleep"),
    )
}

#[tokio::test]
async fn any_fires_on_the_first_condition_and_drops_the_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("train.log");
    append(&log, "");
    let job = sleeper();
    let pid = job.0.id() as i32;
    let waits = Waits::new();
    let spec = WaitSpec::Any {
        conditions: vec![
            WaitSpec::Pid {
                pid,
                start_time: None,
                must_exist: false,
            },
            log_spec(&log, "Traceback|nan"),
        ],
    };
    let armed = waits.arm(&spec).expect("arm");
    let Captured::Any(parts) = armed.captured() else {
        panic!("not an any wait")
    };
    assert!(matches!(parts[..], [Captured::Pid(_), Captured::Log(_)]));
    let WaitSpec::Any { conditions } = armed.resume_spec() else {
        panic!("not an any spec")
    };
    assert!(matches!(
        conditions[0],
        WaitSpec::Pid {
            start_time: Some(_),
            ..
        }
    ));
    assert!(matches!(
        conditions[1],
        WaitSpec::Log {
            cursor: Some(_),
            ..
        }
    ));
    let task = spawn(armed);
    settle().await;
    append(&log, "Traceback (most recent call last):\n");
    let f = fired(task.await.expect("join"));
    assert_eq!(f.payload["kind"], "any");
    assert_eq!(f.payload["which"], 1);
    assert_eq!(
        f.payload["condition"],
        format!("log:{}~Traceback|nan", log.display())
    );
    assert_eq!(
        f.payload["fired"]["line"],
        "Traceback (most recent call last):"
    );
    // The log's watches are gone with the wait, the process untouched.
    assert_eq!(waits.file_watches().descriptors(), 0);
    assert!(Path::new(&format!("/proc/{pid}")).exists());

    // The pid first this time.
    let mut job = job;
    let armed = waits.arm(&spec).expect("arm");
    let task = spawn(armed);
    job.0.kill().expect("kill");
    let _ = job.0.wait();
    let f = fired(task.await.expect("join"));
    assert_eq!(
        (
            f.payload["which"].as_u64(),
            f.payload["fired"]["kind"].as_str()
        ),
        (Some(0), Some("pid"))
    );
    assert_eq!(waits.file_watches().descriptors(), 0);
}

#[tokio::test]
async fn any_breaks_when_one_condition_breaks_and_says_which() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sub = dir.path().join("run");
    fs::create_dir(&sub).expect("mkdir");
    let job = sleeper();
    let spec = WaitSpec::Any {
        conditions: vec![
            WaitSpec::Pid {
                pid: job.0.id() as i32,
                start_time: None,
                must_exist: false,
            },
            log_spec(&sub.join("x.log"), "nan"),
        ],
    };
    let waits = Waits::new();
    let task = spawn(waits.arm(&spec).expect("arm"));
    settle().await;
    fs::remove_dir(&sub).expect("rmdir");
    match task.await.expect("join") {
        WaitOutcome::Broke(e @ WaitError::Condition { which: 1, .. }) => {
            assert!(e.to_string().contains("log:"), "{e}");
        }
        other => panic!("expected a broken condition 1, got {other:?}"),
    }
    // Arming refuses a condition that cannot be armed, naming it.
    let bad = WaitSpec::Any {
        conditions: vec![
            WaitSpec::Pid {
                pid: job.0.id() as i32,
                start_time: None,
                must_exist: false,
            },
            WaitSpec::Flock {
                path: utf8(&dir.path().join("missing.lock")),
            },
        ],
    };
    let e = waits.arm(&bad).expect_err("refused");
    assert!(e.to_string().contains("condition 1 (flock:"), "{e}");
}

#[tokio::test]
async fn bad_log_waits_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let waits = Waits::new();
    assert!(matches!(
        waits.arm(&log_spec(&dir.path().join("x"), "(")),
        Err(WaitError::BadPattern(_))
    ));
    assert!(matches!(
        waits.arm(&log_spec(&dir.path().join("nodir/x"), "a")),
        Err(WaitError::BadPath { .. })
    ));
    assert!(matches!(
        waits.arm(&log_spec(dir.path(), "a")),
        Err(WaitError::BadPath { .. })
    ));
}

#[test]
fn log_and_any_waits_are_send() {
    fn send<T: Send>(_: &T) {}
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = WaitSpec::Any {
            conditions: vec![
                log_spec(&dir.path().join("a"), "x"),
                WaitSpec::File {
                    path: utf8(&dir.path().join("b")),
                    cursor: None,
                    silence_ms: Some(1_000),
                },
            ],
        };
        let armed = Waits::new().arm(&spec).expect("arm");
        let o = WaitOptions::new(Duration::ZERO);
        let fut = armed.wait(&o);
        send(&fut);
    });
}
