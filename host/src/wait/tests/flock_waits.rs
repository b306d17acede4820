//! Flock waits.

use rustix::fs::FlockOperation;

use super::*;

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
