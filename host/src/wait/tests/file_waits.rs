//! File waits.

use super::*;

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
