//! One collector per spool.

use super::*;

fn agent(name: &str) -> Collector {
    Collector::new("cortex-device-agent", Some(name))
}

fn held_by(e: SpoolError) -> String {
    match e {
        SpoolError::Held { holder, .. } => holder,
        other => panic!("expected Held, got {other:?}"),
    }
}

#[test]
fn a_second_collector_is_refused_and_told_who_holds_the_spool() {
    let f = fixture();
    f.spool.claim(&agent("gpu1")).expect("claim");
    f.spool
        .claim(&agent("gpu1"))
        .expect("claiming twice is harmless");
    let second = Spool::open(&f.dir).expect("open");
    let e = second.claim(&hub()).expect_err("refused");
    let text = e.to_string();
    let pid = std::process::id();
    assert!(
        text.contains(&format!(
            "is already collected by cortex-device-agent pid {pid} on host "
        )),
        "{text}"
    );
    assert!(text.contains("(device gpu1) since 20"), "{text}");
    assert!(
        text.contains(&f.dir.display().to_string()) && text.contains("another --home"),
        "{text}"
    );
    // The lock file is a dotfile: never a candidate, never parked, never counted.
    assert!(f.dir.join(LOCK_FILE).is_file());
    assert_eq!(f.spool.list().expect("list"), Vec::<String>::new());
    assert_eq!(
        f.spool.counts().expect("counts"),
        SpoolTally { pending: 0, bad: 0 }
    );
    assert_eq!(mode(&f.dir.join(LOCK_FILE)), 0o600);
    // Once the holder is gone, the lock is free.
    drop(f.spool);
    // A forked child of another test may hold a copy of the lock's descriptor until its
    // exec closes it (the flock is the open file's, shared by the copy): a bounded retry.
    within_forks("free once the first is gone", || second.claim(&hub()));
    let third = Spool::open(&f.dir).expect("open");
    assert!(held_by(third.claim(&agent("x")).expect_err("refused")).starts_with("cortex-hub pid"));
}

#[test]
fn an_unclaimed_spool_takes_no_lock() {
    let f = fixture();
    seed_drop(&f.dir, "1");
    assert_eq!(f.spool.list().expect("list"), ["1.json"]);
    assert!(!f.dir.join(LOCK_FILE).exists());
    Spool::open(&f.dir)
        .expect("open")
        .claim(&hub())
        .expect("nobody holds it");
}

#[test]
fn the_lock_is_taken_again_on_a_recreated_spool_and_kept_across_a_reopen() {
    let f = fixture();
    f.spool.claim(&hub()).expect("claim");
    // bad/ removed: park reopens the same directory, and must keep its own lock.
    fs::remove_dir(f.dir.join("bad")).expect("rm bad");
    fs::write(f.dir.join("x.json"), b"nope").expect("write");
    f.spool.park("x.json", "test").expect("park");
    let other = Spool::open(&f.dir).expect("open");
    held_by(other.claim(&agent("a")).expect_err("still ours"));
    drop(other);

    fs::remove_dir_all(&f.dir).expect("rm -rf");
    f.spool.reopen().expect("recreated, lock taken again");
    assert!(f.dir.join(LOCK_FILE).is_file());
    let other = Spool::open(&f.dir).expect("open");
    held_by(
        other
            .claim(&agent("a"))
            .expect_err("ours on the new directory"),
    );
}

#[test]
fn a_recreated_spool_another_collector_took_is_lost_for_good() {
    let f = fixture();
    f.spool.claim(&hub()).expect("claim");
    fs::remove_dir_all(&f.dir).expect("rm -rf");
    let thief = Spool::open(&f.dir).expect("recreate");
    thief
        .claim(&agent("gpu2"))
        .expect("the new directory is free");
    let e = f.spool.reopen().expect_err("lost");
    let text = e.to_string();
    assert!(matches!(e, SpoolError::LockLost { .. }), "{e:?}");
    assert!(
        text.contains("(device gpu2)") && text.contains("stopped collecting"),
        "{text}"
    );
    seed_drop(&f.dir, "1");
    assert!(matches!(f.spool.list(), Err(SpoolError::LockLost { .. })));
    // Lost for good, even once the thief is gone: a restart decides again.
    drop(thief);
    assert!(matches!(
        f.spool.check_lock(),
        Err(SpoolError::LockLost { .. })
    ));
}

#[test]
fn a_removed_lock_file_is_taken_again_by_its_collector() {
    let f = fixture();
    f.spool.claim(&hub()).expect("claim");
    fs::remove_file(f.dir.join(LOCK_FILE)).expect("rm lock");
    f.spool.check_lock().expect("taken again");
    let other = Spool::open(&f.dir).expect("open");
    held_by(other.claim(&agent("a")).expect_err("ours again"));
    // A replaced one, with someone else holding it, is lost.
    drop(other);
    fs::remove_file(f.dir.join(LOCK_FILE)).expect("rm lock");
    let thief = Spool::open(&f.dir).expect("open");
    thief.claim(&agent("b")).expect("the new lock file is free");
    assert!(matches!(
        f.spool.check_lock(),
        Err(SpoolError::LockLost { .. })
    ));
}

#[tokio::test]
async fn the_watcher_reports_a_lost_lock_once_and_keeps_watching() {
    let f = fixture();
    f.spool.claim(&hub()).expect("claim");
    let mut w = started(&f.spool, None).await;
    fs::remove_dir_all(&f.dir).expect("rm -rf");
    // The thief recreates the spool before the watcher hears of it.
    let thief = Spool::open(&f.dir).expect("recreate");
    thief.claim(&agent("gpu3")).expect("claim");
    let e = tokio::time::timeout(BOUND, w.next())
        .await
        .expect("within the bound")
        .expect_err("the loss");
    assert!(matches!(e, SpoolError::LockLost { .. }), "{e:?}");
    assert_eq!(
        next(&mut w).await,
        SpoolEvent::Rescan(RescanReason::Recreated)
    );
    let name = seed_drop(&f.dir, "after");
    assert_eq!(next(&mut w).await, SpoolEvent::File(name), "still watching");
}
