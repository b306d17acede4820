//! The watcher, and the one inotify instance it shares with the waits.

use std::future::Future;

use inotify::EventMask;

use super::*;
use crate::spool::watch::{Action, classify, classify_parent};

// ---- the watcher ----

#[tokio::test]
async fn watcher_sees_the_seed_pattern_and_in_place_writes_only() {
    let f = fixture();
    // A file dropped before the watcher exists is found by the first (start) rescan.
    let early = seed_drop(&f.dir, "0-early");
    let mut w = started(&f.spool, None).await;
    assert_eq!(f.spool.list().expect("list"), [early]);

    let name = seed_drop(&f.dir, "1700000000000000001-10-20");
    assert_eq!(
        next(&mut w).await,
        SpoolEvent::File(name),
        "File for the .json, nothing for the .tmp"
    );

    // A .tmp alone, a dotfile and a non-candidate yield nothing: the sentinel written in
    // place afterwards is the very next event (created, written, then closed: one event).
    write_in_place(&f.dir, "lonely.tmp", b"{}");
    write_in_place(&f.dir, ".hidden.json", b"{}");
    write_in_place(&f.dir, "notes.txt", b"{}");
    write_in_place(&f.dir, "2.json", b"{}");
    assert_eq!(next(&mut w).await, SpoolEvent::File("2.json".into()));
    let name = seed_drop(&f.dir, "3");
    assert_eq!(
        next(&mut w).await,
        SpoolEvent::File(name),
        "one event per in-place write"
    );
}

#[tokio::test]
async fn watcher_recreates_a_deleted_spool() {
    let f = fixture();
    let mut w = started(&f.spool, None).await;
    seed_drop(&f.dir, "doomed");
    assert_eq!(next(&mut w).await, SpoolEvent::File("doomed.json".into()));

    fs::remove_dir_all(&f.dir).expect("rm -rf spool");
    assert_eq!(
        next(&mut w).await,
        SpoolEvent::Rescan(RescanReason::Recreated)
    );
    assert_eq!(mode(&f.dir), 0o700);
    assert_eq!(mode(&f.dir.join(BAD_DIR)), 0o700);
    assert!(f.spool.path_matches().expect("stat"));

    let name = seed_drop(&f.dir, "after");
    assert_eq!(next(&mut w).await, SpoolEvent::File(name.clone()));
    assert!(
        f.spool.read(&name).is_ok(),
        "the Spool's handles were reopened"
    );
    f.spool.park(&name, "test").expect("park into the new bad/");
}

#[tokio::test]
async fn watcher_recreates_a_moved_spool_and_drops_the_old_watch() {
    let f = fixture();
    let mut w = started(&f.spool, None).await;
    let moved = f.root.join("moved-away");
    fs::rename(&f.dir, &moved).expect("mv spool");
    assert_eq!(
        next(&mut w).await,
        SpoolEvent::Rescan(RescanReason::Recreated)
    );

    // If the old watch still followed the moved directory, its event would come first.
    seed_drop(&moved, "old");
    let name = seed_drop(&f.dir, "new");
    assert_eq!(next(&mut w).await, SpoolEvent::File(name.clone()));
    assert_eq!(f.spool.list().expect("list"), [name]);
}

#[tokio::test]
async fn watcher_reports_a_failed_recreate_and_retries() {
    let f = fixture();
    let mut w = started(&f.spool, None).await;
    // Make recreating impossible: the spool's parent becomes a plain file.
    let parent = f.root.join("home/tmp");
    fs::remove_dir_all(&parent).expect("rm -rf parent");
    fs::write(&parent, b"in the way").expect("file in the parent's place");
    let err = tokio::time::timeout(BOUND, w.next())
        .await
        .expect("an answer within the bound")
        .expect_err("the spool cannot be recreated");
    assert!(matches!(err, SpoolError::Io { .. }), "{err:?}");

    // Fixed: the next call (after the 1 s retry delay) recreates it.
    fs::remove_file(&parent).expect("rm file");
    assert_eq!(
        next(&mut w).await,
        SpoolEvent::Rescan(RescanReason::Recreated)
    );
    assert_eq!(mode(&f.dir), 0o700);
    let name = seed_drop(&f.dir, "back");
    assert_eq!(next(&mut w).await, SpoolEvent::File(name));
}

#[tokio::test]
async fn watcher_periodic_rescan() {
    let f = fixture();
    let mut w = started(&f.spool, Some(Duration::from_millis(50))).await;
    assert_eq!(
        next(&mut w).await,
        SpoolEvent::Rescan(RescanReason::Periodic)
    );
    // Files still arrive as events between ticks.
    let name = seed_drop(&f.dir, "tick");
    loop {
        match next(&mut w).await {
            SpoolEvent::Rescan(RescanReason::Periodic) => continue,
            other => {
                assert_eq!(other, SpoolEvent::File(name));
                break;
            }
        }
    }
}

#[tokio::test]
async fn watcher_periodic_check_notices_a_moved_parent() {
    let f = fixture();
    let mut w = started(&f.spool, Some(Duration::from_millis(50))).await;
    // Moving the parent gives the spool's own watch no event; the periodic check sees that
    // the path no longer names the watched directory.
    fs::rename(f.root.join("home"), f.root.join("home-old")).expect("mv parent");
    loop {
        match next(&mut w).await {
            SpoolEvent::Rescan(RescanReason::Periodic) => continue,
            SpoolEvent::Rescan(RescanReason::Recreated) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(f.dir.is_dir());
    assert!(f.spool.path_matches().expect("stat"));
}

#[tokio::test]
async fn watcher_overflow_yields_a_rescan() {
    let max: usize = fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(usize::MAX);
    if max > 100_000 {
        eprintln!("note: max_queued_events is {max}; not forcing an overflow (classify is tested)");
        return;
    }
    let f = fixture();
    let mut w = started(&f.spool, None).await;
    // Each create+close of a file opened for writing queues one IN_CLOSE_WRITE. `.tmp` names
    // are ignored by the watcher, so the first thing it yields is the overflow's rescan.
    for i in 0..max + 16 {
        fs::File::create(f.dir.join(format!("{i}.tmp"))).expect("create");
    }
    assert_eq!(
        next(&mut w).await,
        SpoolEvent::Rescan(RescanReason::Overflow)
    );
    // The watch still works afterwards.
    let name = seed_drop(&f.dir, "after-overflow");
    loop {
        match next(&mut w).await {
            SpoolEvent::Rescan(_) => continue,
            other => {
                assert_eq!(other, SpoolEvent::File(name));
                break;
            }
        }
    }
}

#[test]
fn classify_maps_masks() {
    let json = Some(OsStr::new("1.json"));
    assert_eq!(classify(EventMask::Q_OVERFLOW, None), Action::Overflow);
    for gone in [
        EventMask::DELETE_SELF,
        EventMask::MOVE_SELF,
        EventMask::IGNORED,
        EventMask::UNMOUNT,
        EventMask::UNMOUNT | EventMask::IGNORED,
    ] {
        assert_eq!(classify(gone, None), Action::DirGone, "{gone:?}");
    }
    assert_eq!(
        classify(EventMask::MOVED_TO, json),
        Action::File("1.json".into())
    );
    assert_eq!(
        classify(EventMask::CLOSE_WRITE, json),
        Action::File("1.json".into())
    );
    assert_eq!(
        classify(EventMask::CREATE, json),
        Action::Ignore,
        "never on create"
    );
    assert_eq!(
        classify(EventMask::MOVED_TO | EventMask::ISDIR, json),
        Action::Ignore
    );
    assert_eq!(
        classify(EventMask::MOVED_TO, Some(OsStr::new("1.tmp"))),
        Action::Ignore
    );
    assert_eq!(
        classify(EventMask::CLOSE_WRITE, Some(OsStr::new(".1.json"))),
        Action::Ignore
    );
    assert_eq!(classify(EventMask::MOVED_TO, None), Action::Ignore);
}

#[test]
fn classify_parent_cares_only_about_the_spools_name() {
    let spool = OsStr::new("signals");
    let d = EventMask::ISDIR;
    for gone in [
        EventMask::DELETE,
        EventMask::MOVED_FROM,
        EventMask::MOVED_TO,
    ] {
        assert_eq!(
            classify_parent(gone | d, Some(spool), spool),
            Action::DirGone,
            "{gone:?}"
        );
        assert_eq!(
            classify_parent(gone, Some(OsStr::new("other")), spool),
            Action::Ignore
        );
    }
    for gone in [
        EventMask::DELETE_SELF,
        EventMask::MOVE_SELF,
        EventMask::IGNORED,
        EventMask::UNMOUNT,
    ] {
        assert_eq!(
            classify_parent(gone, None, spool),
            Action::DirGone,
            "{gone:?}"
        );
    }
    assert_eq!(
        classify_parent(EventMask::Q_OVERFLOW, None, spool),
        Action::Overflow
    );
    assert_eq!(
        classify_parent(EventMask::CREATE | d, Some(spool), spool),
        Action::Ignore
    );
}

#[tokio::test]
async fn watcher_notices_a_spool_replaced_by_another_directory() {
    let f = fixture();
    let mut w = started(&f.spool, None).await;
    let other = f.root.join("home/tmp/other");
    fs::create_dir(&other).expect("mkdir");
    fs::set_permissions(&other, fs::Permissions::from_mode(0o700)).expect("chmod");
    fs::write(other.join("inside.json"), b"{}").expect("write");
    // Replace the spool: remove it and move another directory into its place before the
    // watcher runs again; the Spool must end up holding the new directory.
    fs::remove_dir_all(&f.dir).expect("rm spool");
    fs::rename(&other, &f.dir).expect("mv other into the spool's place");
    assert_eq!(
        next(&mut w).await,
        SpoolEvent::Rescan(RescanReason::Recreated)
    );
    assert!(f.spool.path_matches().expect("stat"));
    assert_eq!(f.spool.list().expect("list"), ["inside.json"]);
    assert_eq!(f.spool.read("inside.json").expect("read"), b"{}");
}

#[test]
fn in_flight_deduplicates_by_name() {
    let mut inflight = InFlight::new();
    assert!(inflight.begin("a.json"));
    assert!(
        !inflight.begin("a.json"),
        "a rescan listing the same name is skipped"
    );
    assert!(inflight.begin("b.json"));
    assert_eq!(inflight.len(), 2);
    inflight.finish("a.json");
    assert!(!inflight.contains("a.json"));
    assert!(inflight.begin("a.json"));
}

#[test]
fn refusal_messages_say_what_to_do() {
    let cases: [(Refusal, &str); 5] = [
        (Refusal::Symlink, "mv it to NAME.json"),
        (Refusal::NotRegular { kind: "a FIFO" }, "a FIFO"),
        (
            Refusal::WrongOwner {
                uid: 7,
                owner: 1000,
            },
            "uid 7",
        ),
        (Refusal::HardLinked { nlink: 3 }, "3 links"),
        (Refusal::TooLarge { bytes: 70_000 }, "70000 bytes"),
    ];
    for (r, needle) in cases {
        assert!(r.to_string().contains(needle), "{r}");
    }
    let transient = Refusal::Io(io::Error::from_raw_os_error(
        rustix::io::Errno::IO.raw_os_error(),
    ));
    assert!(!transient.should_park());
    let denied = Refusal::Io(io::Error::from_raw_os_error(
        rustix::io::Errno::ACCESS.raw_os_error(),
    ));
    assert!(denied.should_park());
}

/// While nothing happens the watcher sleeps in the kernel: its future is polled a handful of
/// times (setting up readiness), not continually. The idle window bounds the observation; the
/// assertion is on the poll count, not on time.
#[tokio::test]
async fn idle_watcher_does_not_spin() {
    let f = fixture();
    let mut w = started(&f.spool, None).await;
    let mut polls = 0u32;
    let mut fut = std::pin::pin!(w.next());
    let counted = std::future::poll_fn(|cx| {
        polls += 1;
        fut.as_mut().poll(cx)
    });
    let idle = tokio::time::timeout(Duration::from_millis(300), counted).await;
    assert!(idle.is_err(), "nothing should happen: {idle:?}");
    assert!(polls < 10, "polled {polls} times while idle");
}

#[test]
fn types_can_cross_tasks() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>(_: &T) {}
    send_sync::<Spool>();
    send_sync::<SpoolError>();
    send_sync::<Refusal>();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let f = fixture();
    let mut w = SpoolWatcher::new(Arc::clone(&f.spool), None).expect("watcher");
    send(&w);
    // The daemon spawns its loop: `next()`'s future must be Send.
    send(&w.next());
}

// ---- one inotify instance for the spool and the waits ----

/// Drives the watcher (which routes the waits' events) until `fut` is done.
async fn while_watching<T>(w: &mut SpoolWatcher, fut: impl Future<Output = T>) -> T {
    let mut fut = std::pin::pin!(fut);
    tokio::time::timeout(BOUND, async {
        loop {
            tokio::select! {
                out = &mut fut => return out,
                ev = w.next() => { ev.expect("watcher error"); }
            }
        }
    })
    .await
    .expect("done within the bound")
}

#[tokio::test]
async fn a_file_wait_in_the_spool_shares_its_descriptor_and_leaves_it_in_place() {
    use crate::wait::{WaitOptions, WaitOutcome, WaitSpec};
    let f = fixture();
    let mut w = started(&f.spool, None).await;
    let waits = w.waits();
    let target = f.dir.join("result.txt");
    let armed = waits
        .arm(&WaitSpec::File {
            path: crate::wait::tests::utf8(&target),
            cursor: None,
            silence_ms: None,
        })
        .expect("arm");
    assert_eq!(
        waits.file_watches().descriptors(),
        1,
        "the spool's own descriptor"
    );
    let writer = async {
        tokio::task::yield_now().await;
        fs::write(&target, b"done").expect("write");
    };
    let (out, ()) = while_watching(
        &mut w,
        futures_util::future::join(armed.wait(&WaitOptions::new(BOUND)), writer),
    )
    .await;
    assert!(matches!(out, WaitOutcome::Fired(_)), "{out:?}");
    // The wait is gone; the spool's watch is not: a file dropped now is still seen.
    assert_eq!(waits.file_watches().descriptors(), 0);
    let name = seed_drop(&f.dir, "after");
    loop {
        match next(&mut w).await {
            SpoolEvent::File(n) if n == name => break,
            SpoolEvent::File(n) if n.starts_with("result") => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn re_watching_a_recreated_spool_keeps_a_waits_mask_on_the_shared_parent() {
    use crate::wait::{WaitOptions, WaitOutcome, WaitSpec};
    let f = fixture();
    let mut w = started(&f.spool, None).await;
    let waits = w.waits();
    // A file beside the spool: its wait shares the spool's parent descriptor.
    let parent = f.dir.parent().expect("parent").to_owned();
    let target = parent.join("done.flag");
    let armed = waits
        .arm(&WaitSpec::File {
            path: crate::wait::tests::utf8(&target),
            cursor: None,
            silence_ms: None,
        })
        .expect("arm");
    // The spool goes away and comes back: the watcher re-adds the parent's watch, which
    // with a plain add would replace the wait's mask (no IN_CLOSE_WRITE any more).
    fs::remove_dir_all(&f.dir).expect("rm -rf the spool");
    loop {
        if next(&mut w).await == SpoolEvent::Rescan(RescanReason::Recreated) {
            break;
        }
    }
    let writer = async {
        tokio::task::yield_now().await;
        fs::write(&target, b"1").expect("write");
    };
    let (out, ()) = while_watching(
        &mut w,
        futures_util::future::join(armed.wait(&WaitOptions::new(BOUND)), writer),
    )
    .await;
    match out {
        WaitOutcome::Fired(fire) => assert_eq!(fire.payload["event"], "close_write"),
        other => panic!("{other:?}"),
    }
}
