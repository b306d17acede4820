//! Wait tests: real processes (`sleep`, killed), real files in temp dirs, real inotify, real
//! `flock(2)` locks held on other descriptors or by util-linux `flock`. Every wait is
//! bounded; nothing asserts on elapsed time. "It did not fire" is shown by ordering: a
//! sentinel event after the non-event has gone through the same instance, and the wait,
//! polled once, is still pending.

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use inotify::{EventMask, Inotify, WatchMask};
use rustix::fs::FlockOperation;
use serde_json::json;
use tokio_stream::StreamExt;

use super::file::{Action, classify, created_fires};
use super::*;

/// The bound on anything expected to happen; never reached when things work.
const BOUND: Duration = Duration::from_secs(20);

fn opts(timeout: Duration) -> WaitOptions {
    WaitOptions::new(timeout)
}

/// A child that is killed and reaped when dropped.
struct Proc(Child);

impl Proc {
    fn sleep() -> Proc {
        Proc(
            Command::new("sleep")
                .arg("300")
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn sleep"),
        )
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    /// SIGKILL without reaping: the process stays a zombie until dropped.
    fn kill(&mut self) {
        self.0.kill().expect("kill");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Polls `f` until true, at most [`BOUND`].
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while !f() {
        assert!(start.elapsed() < BOUND, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn fired(outcome: WaitOutcome) -> Fire {
    match outcome {
        WaitOutcome::Fired(f) => f,
        other => panic!("expected Fired, got {other:?}"),
    }
}

// ---- pure pieces ----

#[test]
fn parses_proc_stat_after_the_last_paren() {
    let tail = "S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 19 20";
    let s = parse_stat(&format!("42 (sleep) {tail}")).expect("parse");
    assert_eq!(
        s,
        ProcStat {
            comm: "sleep".into(),
            state: 'S',
            session: 3,
            start_time: 777
        }
    );
    // A name holding `) ` and spaces must not shift the fields.
    let s = parse_stat(&format!("42 (a) b (c) {tail}")).expect("parse");
    assert_eq!((s.comm.as_str(), s.start_time), ("a) b (c", 777));
    let z = parse_stat(&format!("42 (x) Z{}", &tail[1..])).expect("parse");
    assert!(z.exited());
    for bad in [
        "",
        "42 sleep S 1",
        "42 (sleep) S 1 2",
        "42 (sleep) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 x",
    ] {
        assert_eq!(parse_stat(bad), None, "{bad}");
    }
}

#[test]
fn identity_by_start_time() {
    assert_eq!(identify(None, 5), Identity::Adopted);
    assert_eq!(identify(Some(5), 5), Identity::Same);
    // Same pid, other start time: the pid was reused, the process meant is gone.
    assert_eq!(identify(Some(5), 6), Identity::Reused);
}

#[test]
fn file_events_classified() {
    let ours = OsStr::new("out.json");
    let other = OsStr::new("other");
    let cases: &[(u32, EventMask, Option<&OsStr>, Action)] = &[
        (
            0,
            EventMask::CLOSE_WRITE,
            Some(ours),
            Action::Fire("close_write"),
        ),
        (0, EventMask::MOVED_TO, Some(ours), Action::Fire("moved_to")),
        (0, EventMask::CREATE, Some(ours), Action::Created),
        (0, EventMask::CLOSE_NOWRITE, Some(ours), Action::Ignore),
        (0, EventMask::CLOSE_WRITE, Some(other), Action::Ignore),
        (
            0,
            EventMask::CREATE | EventMask::ISDIR,
            Some(ours),
            Action::Ignore,
        ),
        (0, EventMask::DELETE_SELF, None, Action::ParentGone),
        (0, EventMask::MOVE_SELF, None, Action::ParentGone),
        (0, EventMask::IGNORED, None, Action::ParentGone),
        (0, EventMask::UNMOUNT, None, Action::ParentGone),
        (1, EventMask::CLOSE_WRITE, None, Action::Fire("close_write")),
        (1, EventMask::CLOSE_NOWRITE, None, Action::Ignore),
        (1, EventMask::IGNORED, None, Action::Ignore),
        (1, EventMask::DELETE_SELF, None, Action::Ignore),
    ];
    for (key, mask, name, want) in cases {
        assert_eq!(
            classify(*key, *mask, *name, ours),
            *want,
            "{key} {mask:?} {name:?}"
        );
    }
}

#[test]
fn a_created_name_fires_only_when_nobody_is_writing_it() {
    let dir = tmp();
    let f = dir.path().join("f");
    fs::write(&f, "x").expect("write");
    let meta = |p: &Path| fs::symlink_metadata(p).expect("stat");
    // A fresh regular file: its creator's close after writing comes next.
    assert!(!created_fires(Some(&meta(&f))));
    let link = dir.path().join("hard");
    fs::hard_link(&f, &link).expect("link");
    assert!(created_fires(Some(&meta(&link))));
    let sym = dir.path().join("sym");
    std::os::unix::fs::symlink(&f, &sym).expect("symlink");
    assert!(created_fires(Some(&meta(&sym))));
    assert!(!created_fires(None));
}

#[test]
fn cursor_comparison() {
    let absent = FileCursor::absent();
    let a = FileCursor {
        exists: true,
        dev: 1,
        ino: 2,
        size: 3,
        mtime_ns: 4,
    };
    assert!(!absent.changed_since(&absent));
    assert!(a.changed_since(&absent), "created since");
    assert!(!absent.changed_since(&a), "deleted is not a write");
    assert!(!a.changed_since(&a));
    for b in [
        FileCursor { size: 9, ..a },
        FileCursor { mtime_ns: 9, ..a },
        FileCursor { ino: 9, ..a },
    ] {
        assert!(b.changed_since(&a), "{b:?}");
    }
}

#[test]
fn specs_and_cursors_on_the_wire() {
    let spec = WaitSpec::Pid {
        pid: 12,
        start_time: None,
        must_exist: false,
    };
    assert_eq!(
        serde_json::to_value(&spec).expect("json"),
        json!({"kind":"pid","pid":12}),
        "must_exist left out when false: an earlier reader sees what it always saw"
    );
    let must: WaitSpec =
        serde_json::from_value(json!({"kind":"pid","pid":12,"must_exist":true})).expect("parse");
    assert_eq!(
        must,
        WaitSpec::Pid {
            pid: 12,
            start_time: None,
            must_exist: true
        }
    );
    let spec: WaitSpec =
        serde_json::from_value(json!({"kind":"file","path":"/x/y","cursor":{"exists":false}}))
            .expect("parse");
    assert_eq!(
        spec,
        WaitSpec::File {
            path: "/x/y".into(),
            cursor: Some(FileCursor::absent()),
            silence_ms: None
        }
    );
    let spec: WaitSpec =
        serde_json::from_value(json!({"kind":"flock","path":"/l"})).expect("parse");
    assert_eq!(spec, WaitSpec::Flock { path: "/l".into() });
}

#[test]
fn proc_locks_lines() {
    let text = "\
1: FLOCK  ADVISORY  WRITE 4242 fd:01:123 0 EOF
1: -> FLOCK  ADVISORY  WRITE 4243 fd:01:123 0 EOF
2: POSIX  ADVISORY  WRITE 4244 fd:01:123 0 EOF
3: FLOCK  ADVISORY  READ 4245 fd:01:1234 0 EOF
4: OFDLCK ADVISORY  READ  -1 00:06:123 0 EOF
";
    let dev = rustix::fs::makedev(0xfd, 0x01);
    // Only the held flock on that very inode; not the blocked waiter, the POSIX lock, or
    // an inode whose number merely starts the same.
    assert_eq!(proc_locks_held(text, dev, 123), 1);
    assert_eq!(proc_locks_held(text, dev, 1234), 1);
    assert_eq!(proc_locks_held(text, dev, 9), 0);
}

#[test]
fn armed_waits_and_their_futures_are_send() {
    fn send<T: Send>(_: &T) {}
    fn send_type<T: Send>() {}
    send_type::<Armed>();
    send_type::<Waits>();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        let armed = Waits::new()
            .arm(&WaitSpec::Pid {
                pid: std::process::id() as i32,
                start_time: None,
                must_exist: false,
            })
            .expect("arm");
        let o = opts(Duration::ZERO);
        let fut = armed.wait(&o);
        send(&fut);
    });
}

// ---- pid ----

#[tokio::test]
async fn pid_fires_when_the_process_exits() {
    let mut p = Proc::sleep();
    let waits = Waits::new();
    let armed = waits
        .arm(&WaitSpec::Pid {
            pid: p.pid(),
            start_time: None,
            must_exist: false,
        })
        .expect("arm");
    let Captured::Pid(c) = armed.captured() else {
        panic!("not a pid wait")
    };
    let start = read_stat(p.pid())
        .expect("stat")
        .expect("running")
        .start_time;
    assert_eq!(c.comm.as_deref(), Some("sleep"));
    assert_eq!(c.start_time, Some(start));
    assert_eq!(c.method, PidMethod::Pidfd);
    assert!(c.gone.is_none() && armed.fired_at_arm().is_none());
    assert_eq!(
        armed.resume_spec(),
        WaitSpec::Pid {
            pid: p.pid(),
            start_time: Some(start),
            must_exist: false,
        }
    );
    let task = tokio::spawn(async move { armed.wait(&opts(BOUND)).await });
    p.kill();
    let f = fired(task.await.expect("join"));
    assert_eq!(
        f.payload,
        json!({"kind":"pid","pid":p.pid(),"start_time":start,"exited":true,"already_gone":false,"method":"pidfd"})
    );
}

#[tokio::test]
async fn pid_times_out_while_the_process_runs() {
    let p = Proc::sleep();
    let armed = Waits::new()
        .arm(&WaitSpec::Pid {
            pid: p.pid(),
            start_time: None,
            must_exist: false,
        })
        .expect("arm");
    let out = armed.wait(&opts(Duration::from_millis(50))).await;
    assert!(matches!(out, WaitOutcome::TimedOut), "{out:?}");
    assert_eq!(out.exit_code(), 1);
}

#[tokio::test]
async fn a_pid_already_gone_fires_at_once_saying_so() {
    let mut child = Command::new("true").spawn().expect("spawn true");
    let pid = child.id() as i32;
    child.wait().expect("reap");
    let armed = Waits::new()
        .arm(&WaitSpec::Pid {
            pid,
            start_time: None,
            must_exist: false,
        })
        .expect("arm");
    let f = armed.fired_at_arm().expect("fired at arm");
    assert_eq!(f.payload["already_gone"], true);
    assert!(
        f.payload["note"]
            .as_str()
            .expect("note")
            .contains("already gone")
    );
    let out = armed.wait(&opts(Duration::ZERO)).await;
    assert_eq!(
        fired(out).payload["already_gone"],
        true,
        "fires even with a zero bound"
    );
}

#[tokio::test]
async fn must_exist_refuses_a_pid_not_running_and_arms_a_live_one_without_it() {
    let mut child = Command::new("true").spawn().expect("spawn true");
    let gone = child.id() as i32;
    child.wait().expect("reap");
    let mut zombie = Proc::sleep();
    zombie.kill();
    // SIGKILL lands when the kernel gets to it: wait until the process is a zombie.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(format!("/proc/{}/stat", zombie.pid()))
        .ok()
        .and_then(|st| st.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
        != Some(true)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the killed sleep never became a zombie"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let live = Proc::sleep();
    let spec = |pid| WaitSpec::Pid {
        pid,
        start_time: None,
        must_exist: true,
    };
    let waits = Waits::new();
    for pid in [gone, zombie.pid()] {
        match waits.arm(&spec(pid)) {
            Err(e @ WaitError::NotRunning { .. }) => {
                assert!(e.to_string().contains(&format!("pid {pid} is not running")));
            }
            other => panic!("pid {pid}: {other:?}"),
        }
    }
    // Pinned to another start time: the process meant is gone, whoever holds the pid.
    let reused = WaitSpec::Pid {
        pid: live.pid(),
        start_time: Some(1),
        must_exist: true,
    };
    assert!(matches!(
        waits.arm(&reused),
        Err(WaitError::NotRunning { .. })
    ));
    let armed = waits.arm(&spec(live.pid())).expect("a live pid arms");
    assert!(armed.fired_at_arm().is_none());
    // A re-arm (a restart) follows the process it found, and a pid that exited meanwhile
    // then fires: the must-exist check was the first arm's.
    assert!(matches!(
        armed.resume_spec(),
        WaitSpec::Pid {
            must_exist: false,
            start_time: Some(_),
            ..
        }
    ));
}

#[tokio::test]
async fn a_zombie_has_exited() {
    let mut p = Proc::sleep();
    p.kill();
    // Not reaped: it stays a zombie, whose pidfd is readable.
    eventually("the zombie", || {
        read_stat(p.pid())
            .ok()
            .flatten()
            .is_some_and(|s| s.exited())
    })
    .await;
    for waits in [Waits::new(), Waits::new().force_pid_poll()] {
        let armed = waits
            .arm(&WaitSpec::Pid {
                pid: p.pid(),
                start_time: None,
                must_exist: false,
            })
            .expect("arm");
        let f = armed.fired_at_arm().expect("fired at arm");
        assert_eq!(f.payload["already_gone"], true);
        assert!(
            f.payload["note"]
                .as_str()
                .expect("note")
                .contains("already exited")
        );
    }
}

#[tokio::test]
async fn a_reused_pid_is_not_mistaken_for_the_one_we_meant() {
    // The pid now belongs to a process that started at another time than the one we
    // meant: exactly what a reused pid looks like. Faked by asking for a start time off
    // by one, with a real process holding the pid.
    let p = Proc::sleep();
    let real = read_stat(p.pid())
        .expect("stat")
        .expect("running")
        .start_time;
    for waits in [Waits::new(), Waits::new().force_pid_poll()] {
        let armed = waits
            .arm(&WaitSpec::Pid {
                pid: p.pid(),
                start_time: Some(real + 1),
                must_exist: false,
            })
            .expect("arm");
        let Captured::Pid(c) = armed.captured() else {
            panic!("not a pid wait")
        };
        assert_eq!(c.gone, Some(Gone::Reused { now: real }));
        let f = fired(armed.wait(&opts(BOUND)).await);
        assert_eq!(f.payload["already_gone"], true);
        assert_eq!(f.payload["reused"], true);
        assert_eq!(f.payload["start_time"], real + 1, "the identity we meant");
        assert!(
            f.payload["note"]
                .as_str()
                .expect("note")
                .contains("now belongs to another process")
        );
    }
    // The right start time: it waits for this very process.
    let armed = Waits::new()
        .arm(&WaitSpec::Pid {
            pid: p.pid(),
            start_time: Some(real),
            must_exist: false,
        })
        .expect("arm");
    assert!(armed.fired_at_arm().is_none());
}

#[tokio::test]
async fn the_poll_fallback_sees_an_exit() {
    let mut p = Proc::sleep();
    let armed = Waits::new()
        .force_pid_poll()
        .arm(&WaitSpec::Pid {
            pid: p.pid(),
            start_time: None,
            must_exist: false,
        })
        .expect("arm");
    let Captured::Pid(c) = armed.captured() else {
        panic!("not a pid wait")
    };
    assert_eq!(c.method, PidMethod::Poll);
    let task = tokio::spawn(async move { armed.wait(&opts(BOUND)).await });
    // Killed, not reaped: kill(pid, 0) still succeeds on the zombie; its state says Z.
    p.kill();
    let f = fired(task.await.expect("join"));
    assert_eq!(f.payload["method"], "poll");
    assert_eq!(f.payload["already_gone"], false);
}

#[tokio::test]
async fn bad_pids_are_refused() {
    for pid in [0, -1, -4242] {
        let e = Waits::new()
            .arm(&WaitSpec::Pid {
                pid,
                start_time: None,
                must_exist: false,
            })
            .expect_err("bad pid");
        assert!(matches!(e, WaitError::BadPid { .. }), "{e}");
    }
}

#[tokio::test]
async fn a_cancelled_pid_wait_closes_its_pidfd() {
    let p = Proc::sleep();
    let armed = Waits::new()
        .arm(&WaitSpec::Pid {
            pid: p.pid(),
            start_time: None,
            must_exist: false,
        })
        .expect("arm");
    let Inner::Pid(w) = armed.inner() else {
        panic!("not a pid wait")
    };
    let fd = w.pidfd().expect("a pidfd").as_raw_fd();
    let fdinfo = format!("/proc/self/fdinfo/{fd}");
    let pid_line = format!("Pid:\t{}", p.pid());
    assert!(
        fs::read_to_string(&fdinfo)
            .expect("fdinfo")
            .contains(&pid_line)
    );
    // Cancel = drop the future, here by a bound that passes first.
    let r = tokio::time::timeout(Duration::from_millis(20), armed.wait(&opts(BOUND))).await;
    assert!(r.is_err(), "still waiting when cancelled");
    // The number may have been reused by another test since, but not for this pid.
    let now = fs::read_to_string(&fdinfo).unwrap_or_default();
    assert!(!now.contains(&pid_line), "pidfd {fd} still open: {now}");
}

// ---- file ----

/// A path as a spec holds it (temp paths are UTF-8).
pub(crate) fn utf8(path: &Path) -> String {
    path.to_str().expect("a UTF-8 temp path").to_owned()
}

fn file_spec(path: &Path) -> WaitSpec {
    WaitSpec::File {
        path: utf8(path),
        cursor: None,
        silence_ms: None,
    }
}

/// A subscription on the same instance that sees `dir`'s events, including reads: once
/// it has seen the sentinel's creation, every earlier event has been dispatched.
struct Sentinel {
    sub: Subscription,
    dir: PathBuf,
}

impl Sentinel {
    fn new(waits: &Waits, dir: &Path) -> Sentinel {
        let mut sub = waits.file_watches().subscribe();
        sub.add(dir, WatchMask::CREATE | WatchMask::CLOSE_NOWRITE, 7)
            .expect("sentinel watch");
        Sentinel {
            sub,
            dir: dir.to_owned(),
        }
    }

    async fn pass(&self, saw_read_of: &OsStr) {
        let name = format!("sentinel-{}", rand_suffix());
        fs::create_dir(self.dir.join(&name)).expect("sentinel");
        let mut saw_read = false;
        loop {
            let d = tokio::time::timeout(BOUND, self.sub.next())
                .await
                .expect("sentinel event");
            if let Delivery::Event {
                mask,
                name: Some(n),
                ..
            } = &d
            {
                if mask.contains(EventMask::CLOSE_NOWRITE) && n == saw_read_of {
                    saw_read = true;
                }
                if mask.contains(EventMask::CREATE) && n.to_str() == Some(name.as_str()) {
                    break;
                }
            }
        }
        assert!(
            saw_read,
            "the read's IN_CLOSE_NOWRITE reached the shared instance first"
        );
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[tokio::test]
async fn a_file_wait_fires_on_close_write_and_not_on_a_read() {
    let dir = tmp();
    let f = dir.path().join("out.log");
    fs::write(&f, "old\n").expect("write");
    let waits = Waits::new();
    let armed = waits.arm(&file_spec(&f)).expect("arm");
    let Captured::File(c) = armed.captured() else {
        panic!("not a file wait")
    };
    assert!(c.now.exists && c.now.size == 4 && c.watching_file);
    let sentinel = Sentinel::new(&waits, dir.path());
    let o = opts(BOUND);
    let fut = armed.wait(&o);
    tokio::pin!(fut);
    assert!(
        tokio::time::timeout(Duration::ZERO, &mut fut)
            .await
            .is_err()
    );
    // Open for reading, read, close: IN_CLOSE_NOWRITE, which must not fire.
    assert_eq!(fs::read_to_string(&f).expect("read"), "old\n");
    sentinel.pass(OsStr::new("out.log")).await;
    assert!(
        tokio::time::timeout(Duration::ZERO, &mut fut)
            .await
            .is_err(),
        "fired on a read"
    );
    // Now a write: it fires, and the payload is about the write.
    let mut w = fs::OpenOptions::new().append(true).open(&f).expect("open");
    w.write_all(b"new\n").expect("write");
    drop(w);
    let fire = fired(tokio::time::timeout(BOUND, &mut fut).await.expect("fired"));
    assert_eq!(fire.payload["event"], "close_write");
    assert_eq!(fire.payload["kind"], "file");
    let cursor = fire.cursor.and_then(Cursor::file).expect("cursor");
    assert_eq!((cursor.exists, cursor.size), (true, 8));
    assert_eq!(
        fire.payload["cursor"],
        serde_json::to_value(cursor).expect("json")
    );
}

#[tokio::test]
async fn a_file_not_there_yet_fires_when_written_not_when_created() {
    let dir = tmp();
    let f = dir.path().join("result.json");
    let waits = Waits::new();
    let armed = waits.arm(&file_spec(&f)).expect("arm");
    let Captured::File(c) = armed.captured() else {
        panic!("not a file wait")
    };
    assert!(!c.now.exists && !c.watching_file);
    let task = tokio::spawn(async move { armed.wait(&opts(BOUND)).await });
    let mut w = fs::File::create(&f).expect("create");
    w.write_all(b"{}").expect("write");
    drop(w);
    let fire = fired(task.await.expect("join"));
    // Not "created": the file was empty then.
    assert_eq!(fire.payload["event"], "close_write");
    assert_eq!(fire.cursor.and_then(Cursor::file).expect("cursor").size, 2);
}

#[tokio::test]
async fn a_file_moved_or_linked_into_place_fires() {
    let dir = tmp();
    let f = dir.path().join("result.json");
    let staged = dir.path().join("result.json.tmp");
    fs::write(&staged, "done").expect("write");
    let waits = Waits::new();
    let armed = waits.arm(&file_spec(&f)).expect("arm");
    let task = tokio::spawn(async move { armed.wait(&opts(BOUND)).await });
    fs::rename(&staged, &f).expect("rename");
    assert_eq!(
        fired(task.await.expect("join")).payload["event"],
        "moved_to"
    );

    let g = dir.path().join("linked");
    let armed = waits.arm(&file_spec(&g)).expect("arm");
    let task = tokio::spawn(async move { armed.wait(&opts(BOUND)).await });
    fs::hard_link(&f, &g).expect("link");
    assert_eq!(fired(task.await.expect("join")).payload["event"], "created");
}

#[tokio::test]
async fn an_existing_file_replaced_atomically_fires() {
    let dir = tmp();
    let f = dir.path().join("state");
    fs::write(&f, "1").expect("write");
    let waits = Waits::new();
    let armed = waits.arm(&file_spec(&f)).expect("arm");
    let task = tokio::spawn(async move { armed.wait(&opts(BOUND)).await });
    let staged = dir.path().join(".state.tmp");
    fs::write(&staged, "22").expect("write");
    // The staged file's own close_write is another name: ignored. The rename fires.
    fs::rename(&staged, &f).expect("rename");
    let fire = fired(task.await.expect("join"));
    assert_eq!(fire.payload["event"], "moved_to");
    assert_eq!(fire.cursor.and_then(Cursor::file).expect("cursor").size, 2);
}

#[tokio::test]
async fn a_cursor_reports_what_happened_while_no_wait_was_armed_and_nothing_twice() {
    let dir = tmp();
    let f = dir.path().join("log");
    fs::write(&f, "a").expect("write");
    let waits = Waits::new();
    // First arm: no cursor yet. What to resume from is the file as it is now.
    let armed = waits.arm(&file_spec(&f)).expect("arm");
    let WaitSpec::File {
        cursor: Some(c0), ..
    } = armed.resume_spec()
    else {
        panic!("resume spec")
    };
    drop(armed);
    // Re-armed from it, unchanged: it waits.
    let spec = |c| WaitSpec::File {
        path: utf8(&f),
        cursor: Some(c),
        silence_ms: None,
    };
    let armed = waits.arm(&spec(c0)).expect("arm");
    assert!(armed.fired_at_arm().is_none());
    assert!(matches!(
        armed.wait(&opts(Duration::from_millis(20))).await,
        WaitOutcome::TimedOut
    ));
    // Written while no wait was armed: the re-arm fires at once.
    fs::write(&f, "ab").expect("write");
    let armed = waits.arm(&spec(c0)).expect("arm");
    let fire = armed.fired_at_arm().expect("fired at arm");
    assert_eq!(fire.payload["event"], "changed");
    let c1 = fire.cursor.and_then(Cursor::file).expect("cursor");
    assert_eq!(c1.size, 2);
    // Re-armed from the cursor it reported: that write is not reported again.
    let armed = waits.arm(&spec(c1)).expect("arm");
    assert!(armed.fired_at_arm().is_none());
    // A file that did not exist at the cursor and does now has changed; one that was
    // deleted since has not been written.
    let g = dir.path().join("new");
    fs::write(&g, "x").expect("write");
    let armed = waits
        .arm(&WaitSpec::File {
            path: utf8(&g),
            cursor: Some(FileCursor::absent()),
            silence_ms: None,
        })
        .expect("arm");
    assert!(armed.fired_at_arm().is_some());
    let armed = waits
        .arm(&WaitSpec::File {
            path: utf8(&dir.path().join("gone")),
            cursor: Some(c1),
            silence_ms: None,
        })
        .expect("arm");
    assert!(armed.fired_at_arm().is_none());
}

#[tokio::test]
async fn bad_file_paths_are_refused() {
    let dir = tmp();
    let waits = Waits::new();
    for (path, why) in [
        (dir.path().join("no/such/dir/f"), "does not exist"),
        (dir.path().to_owned(), "is a directory"),
        (PathBuf::from("/"), "names no file"),
    ] {
        let e = waits.arm(&file_spec(&path)).expect_err("refused");
        assert!(e.to_string().contains(why), "{path:?}: {e}");
    }
    assert_eq!(
        waits.file_watches().descriptors(),
        0,
        "refused arms leave no watch"
    );
}

/// A file, log or silence wait breaks (exit 2, "lost its directory") when the directory
/// it watches for its name is removed: each of them reads that event the same way.
#[tokio::test]
async fn a_file_log_or_silence_wait_breaks_when_its_directory_goes() {
    let dir = tmp();
    for (kind, spec) in [
        ("file", file_spec as fn(&Path) -> WaitSpec),
        ("log", |p: &Path| WaitSpec::Log {
            path: utf8(p),
            pattern: "never".into(),
            cursor: None,
            silence_ms: None,
        }),
        ("silence", |p: &Path| WaitSpec::File {
            path: utf8(p),
            cursor: None,
            silence_ms: Some(3_600_000),
        }),
    ] {
        let sub = dir.path().join(kind);
        fs::create_dir(&sub).expect("mkdir");
        let armed = Waits::new().arm(&spec(&sub.join("f"))).expect("arm");
        let task = tokio::spawn(async move { armed.wait(&opts(BOUND)).await });
        fs::remove_dir(&sub).expect("rmdir");
        let out = task.await.expect("join");
        assert_eq!(out.exit_code(), 2, "{kind}: {out:?}");
        assert!(
            format!("{out:?}").contains("lost its directory"),
            "{kind}: {out:?}"
        );
    }
}

#[tokio::test]
async fn waits_on_one_file_share_descriptors_and_leave_none_behind() {
    let dir = tmp();
    let f = dir.path().join("f");
    fs::write(&f, "").expect("write");
    let waits = Waits::new();
    let a = waits.arm(&file_spec(&f)).expect("arm");
    let b = waits.arm(&file_spec(&f)).expect("arm");
    // One for the directory, one for the file, whatever the number of waiters.
    assert_eq!(waits.file_watches().descriptors(), 2);
    // The first one cancelled (timed out and dropped): the other still sees the write.
    assert!(matches!(
        a.wait(&opts(Duration::from_millis(10))).await,
        WaitOutcome::TimedOut
    ));
    assert_eq!(waits.file_watches().descriptors(), 2);
    let task = tokio::spawn(async move { b.wait(&opts(BOUND)).await });
    fs::write(&f, "x").expect("write");
    assert_eq!(
        fired(task.await.expect("join")).payload["event"],
        "close_write"
    );
    assert_eq!(waits.file_watches().descriptors(), 0);
}

#[tokio::test]
async fn file_waits_can_ride_an_instance_someone_else_reads() {
    // The device agent's shape: its spool watcher reads the one instance and hands every
    // event to the waits.
    let dir = tmp();
    let f = dir.path().join("f");
    let mut stream = Inotify::init()
        .expect("init")
        .into_event_stream(vec![0u8; 4096])
        .expect("stream");
    let waits = Waits::sharing(stream.watches());
    let armed = waits.arm(&file_spec(&f)).expect("arm");
    let task = tokio::spawn(async move { armed.wait(&opts(BOUND)).await });
    fs::write(&f, "x").expect("write");
    let reader = {
        let waits = waits.clone();
        async move {
            while let Some(ev) = stream.next().await {
                waits.dispatch(&ev.expect("event"));
            }
        }
    };
    let out = tokio::select! {
        out = task => out.expect("join"),
        () = reader => panic!("the stream ended"),
    };
    assert_eq!(fired(out).payload["event"], "close_write");
}

// ---- flock ----

/// util-linux `flock FILE cat`: holds the lock until its stdin is closed.
struct Holder(Child);

impl Holder {
    fn start(path: &Path) -> Holder {
        let child = Command::new("flock")
            .arg(path)
            .arg("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn flock");
        Holder(child)
    }

    /// Closes `cat`'s stdin: it exits, and so does `flock`, releasing the lock.
    fn release(&mut self) {
        drop(self.0.stdin.take());
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn held_per_proc_locks(path: &Path) -> bool {
    let m = fs::metadata(path).expect("stat");
    let text = fs::read_to_string("/proc/locks").unwrap_or_default();
    proc_locks_held(&text, m.dev(), m.ino()) > 0
}

/// Can another descriptor take the lock right now (and give it back)?
fn free_now(path: &Path) -> bool {
    let fd = open_lock_file(path).expect("open");
    probe(&fd).expect("probe")
}

#[tokio::test]
async fn a_flock_wait_fires_when_a_held_flock_is_released() {
    let dir = tmp();
    let lock = dir.path().join("job.lock");
    fs::write(&lock, "").expect("create");
    let mut holder = Holder::start(&lock);
    // Known held without probing it: /proc/locks.
    eventually("flock(1) to take the lock", || held_per_proc_locks(&lock)).await;
    let waits = Waits::new();
    let armed = waits
        .arm(&WaitSpec::Flock { path: utf8(&lock) })
        .expect("arm");
    let Captured::Flock(c) = armed.captured() else {
        panic!("not a flock wait")
    };
    assert!(!c.free && c.hinted);
    let task = tokio::spawn(async move { armed.wait(&opts(BOUND)).await });
    holder.release();
    let fire = fired(task.await.expect("join"));
    assert_eq!(fire.payload["kind"], "flock");
    assert_eq!(fire.payload["already_free"], false);
    assert!(fire.payload["waited_ms"].is_u64());
    assert_eq!(waits.file_watches().descriptors(), 0);
    assert!(free_now(&lock), "the wait left the lock held");
}

#[tokio::test]
async fn a_lock_released_without_a_close_is_found_by_the_timer() {
    let dir = tmp();
    let lock = dir.path().join("l");
    fs::write(&lock, "").expect("create");
    let other = open_lock_file(&lock).expect("open");
    rustix::fs::flock(&other, FlockOperation::LockExclusive).expect("lock");
    let armed = Waits::new()
        .arm(&WaitSpec::Flock { path: utf8(&lock) })
        .expect("arm");
    assert!(armed.fired_at_arm().is_none());
    let task = tokio::spawn(async move { armed.wait(&opts(BOUND)).await });
    // LOCK_UN with the file kept open: no inotify event, only the backstop probe sees it.
    rustix::fs::flock(&other, FlockOperation::Unlock).expect("unlock");
    let fire = fired(task.await.expect("join"));
    assert_eq!(fire.payload["already_free"], false);
    drop(other);
}

#[tokio::test]
async fn a_free_lock_fires_at_once_and_is_not_kept() {
    let dir = tmp();
    let lock = dir.path().join("l");
    fs::write(&lock, "").expect("create");
    let waits = Waits::new();
    let armed = waits
        .arm(&WaitSpec::Flock { path: utf8(&lock) })
        .expect("arm");
    let f = armed.fired_at_arm().expect("fired at arm");
    assert_eq!(f.payload["already_free"], true);
    assert_eq!(f.payload["waited_ms"], 0);
    // Already released, descriptor and watch included, while the Armed still exists.
    let Inner::Flock(w) = armed.inner() else {
        panic!("not a flock wait")
    };
    assert!(!w.holds_fd());
    assert_eq!(waits.file_watches().descriptors(), 0);
    assert!(free_now(&lock));
    assert_eq!(
        fired(armed.wait(&opts(Duration::ZERO)).await).payload["already_free"],
        true
    );
}

#[tokio::test]
async fn a_flock_wait_refuses_a_missing_file_and_creates_nothing() {
    let dir = tmp();
    let lock = dir.path().join("nope.lock");
    let e = Waits::new()
        .arm(&WaitSpec::Flock { path: utf8(&lock) })
        .expect_err("missing");
    assert!(e.to_string().contains("does not exist"), "{e}");
    assert!(!lock.exists());
}

#[tokio::test]
async fn a_timed_out_flock_wait_holds_nothing() {
    let dir = tmp();
    let lock = dir.path().join("l");
    fs::write(&lock, "").expect("create");
    let other = open_lock_file(&lock).expect("open");
    rustix::fs::flock(&other, FlockOperation::LockExclusive).expect("lock");
    let waits = Waits::new();
    let armed = waits
        .arm(&WaitSpec::Flock { path: utf8(&lock) })
        .expect("arm");
    let out = armed.wait(&opts(Duration::from_millis(150))).await;
    assert!(matches!(out, WaitOutcome::TimedOut), "{out:?}");
    assert_eq!(waits.file_watches().descriptors(), 0);
    // The holder lets go; nothing of the wait stands in the way of the next taker.
    rustix::fs::flock(&other, FlockOperation::Unlock).expect("unlock");
    assert!(free_now(&lock));
}

// ---- heartbeat ----

#[tokio::test]
async fn the_heartbeat_file_is_touched_while_waiting() {
    let dir = tmp();
    let beat = dir.path().join("wait.beat");
    let mut p = Proc::sleep();
    let armed = Waits::new()
        .arm(&WaitSpec::Pid {
            pid: p.pid(),
            start_time: None,
            must_exist: false,
        })
        .expect("arm");
    let o = WaitOptions {
        heartbeat: Some(beat.clone()),
        heartbeat_every: Duration::from_millis(20),
        ..opts(BOUND)
    };
    let task = tokio::spawn(async move { armed.wait(&o).await });
    eventually("the heartbeat file", || beat.exists()).await;
    let mtime = |p: &Path| fs::metadata(p).map(|m| (m.mtime(), m.mtime_nsec())).ok();
    let first = mtime(&beat);
    eventually("a second touch", || mtime(&beat) > first).await;
    p.kill();
    fired(task.await.expect("join"));
}

#[tokio::test]
async fn a_heartbeat_that_cannot_be_written_breaks_the_wait() {
    let dir = tmp();
    let p = Proc::sleep();
    let armed = Waits::new()
        .arm(&WaitSpec::Pid {
            pid: p.pid(),
            start_time: None,
            must_exist: false,
        })
        .expect("arm");
    let o = WaitOptions {
        heartbeat: Some(dir.path().join("no/such/dir/beat")),
        ..opts(BOUND)
    };
    let out = armed.wait(&o).await;
    assert!(
        matches!(out, WaitOutcome::Broke(WaitError::Heartbeat { .. })),
        "{out:?}"
    );
}
