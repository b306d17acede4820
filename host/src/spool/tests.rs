//! Spool tests: real files in temp dirs and a real inotify instance. Waits are bounded
//! (`timeout` around `next()`), never sleeps; "nothing else happened" is shown by ordering:
//! a sentinel file dropped afterwards must be the very next event.

use std::ffi::OsStr;
use std::fs;
use std::future::Future;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cortex_protocol::signal::MAX_BODY_BYTES;
use inotify::EventMask;

use super::dir::check_owner;
use super::watch::{Action, classify, classify_parent};
use super::*;

const BOUND: Duration = Duration::from_secs(10);

struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    dir: PathBuf,
    spool: Arc<Spool>,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().to_owned();
    let dir = root.join("home/tmp/signals");
    let spool = Arc::new(Spool::open(&dir).expect("open spool"));
    Fixture {
        _tmp: tmp,
        root,
        dir,
        spool,
    }
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).expect("stat").mode() & 0o7777
}

/// The one-line shell drop, run by a real shell: printf into `$f.tmp`, then mv to `$f.json`.
fn seed_drop(dir: &Path, stem: &str) -> String {
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(
            r#"f="$1/$2"; printf '{"id":"wp_1a2b3c4d5e6f","secret":"s","status":"%s","message":"exit=%s"}' ok 0 > "$f.tmp" && mv "$f.tmp" "$f.json""#,
        )
        .arg("sh")
        .arg(dir)
        .arg(stem)
        .status()
        .expect("run sh");
    assert!(status.success());
    format!("{stem}.json")
}

/// A `.json` written in place: create, write, close.
fn write_in_place(dir: &Path, name: &str, body: &[u8]) {
    let mut f = fs::File::create(dir.join(name)).expect("create");
    f.write_all(body).expect("write");
}

async fn next(w: &mut SpoolWatcher) -> SpoolEvent {
    tokio::time::timeout(BOUND, w.next())
        .await
        .expect("an event within the bound")
        .expect("watcher error")
}

async fn started(spool: &Arc<Spool>, periodic: Option<Duration>) -> SpoolWatcher {
    let mut w = SpoolWatcher::new(Arc::clone(spool), periodic).expect("watcher");
    assert_eq!(next(&mut w).await, SpoolEvent::Rescan(RescanReason::Start));
    w
}

// ---- open ----

#[test]
fn open_creates_dirs_0700_with_bad() {
    let f = fixture();
    assert!(f.dir.is_dir());
    assert_eq!(mode(&f.dir), 0o700);
    assert_eq!(mode(&f.dir.join(BAD_DIR)), 0o700);
    assert_eq!(
        mode(&f.root.join("home/tmp")),
        0o700,
        "parents are created 0700 too"
    );
    assert_eq!(f.spool.list().expect("list"), Vec::<String>::new());
    assert_eq!(f.spool.counts().expect("counts"), SpoolTally::default());
    // Opening again an existing spool is fine.
    Spool::open(&f.dir).expect("reopen existing");
}

#[test]
fn open_refuses_a_symlinked_spool() {
    let f = fixture();
    let link = f.root.join("link");
    std::os::unix::fs::symlink(&f.dir, &link).expect("symlink");
    for path in [link.clone(), link.join("")] {
        let err = Spool::open(&path).expect_err("a symlinked spool is refused");
        assert!(matches!(err, SpoolError::Symlink { .. }), "{err:?}");
        assert!(err.to_string().contains("symbolic link"), "{err}");
    }
}

#[test]
fn open_refuses_group_or_other_writable() {
    let f = fixture();
    for bits in [0o770, 0o707, 0o1777] {
        fs::set_permissions(&f.dir, fs::Permissions::from_mode(bits)).expect("chmod");
        let err = Spool::open(&f.dir).expect_err("writable by others is refused");
        assert!(
            matches!(err, SpoolError::Insecure { mode, .. } if mode == bits),
            "{err:?}"
        );
        assert!(err.to_string().contains("chmod 700"), "{err}");
    }
    // 0755 lets others read, not plant files: accepted.
    fs::set_permissions(&f.dir, fs::Permissions::from_mode(0o755)).expect("chmod");
    Spool::open(&f.dir).expect("0755 is accepted");
}

#[test]
fn the_daemon_must_own_its_spool_unless_root() {
    let p = Path::new("/s");
    assert!(check_owner(p, 1000, 1000).is_ok());
    assert!(
        check_owner(p, 1000, 0).is_ok(),
        "root may serve a user's spool"
    );
    let err = check_owner(p, 0, 1000).expect_err("a non-root daemon in root's spool");
    assert!(
        matches!(
            err,
            SpoolError::NotOwner {
                owner: 0,
                euid: 1000,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("chown"), "{err}");
}

#[test]
fn open_refuses_a_file_and_a_bad_symlink() {
    let f = fixture();
    let file = f.root.join("plain");
    fs::write(&file, b"x").expect("write");
    let err = Spool::open(&file).expect_err("a file is not a spool");
    assert!(matches!(err, SpoolError::NotDirectory { .. }), "{err:?}");

    let other = f.root.join("elsewhere");
    fs::create_dir(&other).expect("mkdir");
    fs::remove_dir(f.dir.join(BAD_DIR)).expect("rmdir bad");
    std::os::unix::fs::symlink(&other, f.dir.join(BAD_DIR)).expect("symlink bad");
    let err = Spool::open(&f.dir).expect_err("a symlinked bad/ is refused");
    assert!(
        matches!(&err, SpoolError::Symlink { path } if path.ends_with(BAD_DIR)),
        "{err:?}"
    );
}

// ---- list ----

#[test]
fn list_gives_candidates_sorted_and_parks_directories() {
    let f = fixture();
    for name in [
        "200.json",
        "100.json",
        ".hidden.json",
        "x.tmp",
        "300.json.tmp",
        "notes",
    ] {
        fs::write(f.dir.join(name), b"{}").expect("write");
    }
    fs::create_dir(f.dir.join("dir.json")).expect("mkdir");
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        f.dir.join("150.json"),
        Mode::from_raw_mode(0o600),
    )
    .expect("mkfifo");
    std::os::unix::fs::symlink("/etc/passwd", f.dir.join("120.json")).expect("symlink");
    assert_eq!(
        f.spool.list().expect("list"),
        ["100.json", "120.json", "150.json", "200.json"],
        "non-regular entries are listed so read() refuses them; a directory is parked"
    );
    assert!(f.dir.join("bad/dir.json").is_dir(), "the directory parked");
    let reason = fs::read_to_string(f.dir.join("bad/dir.json.reason")).expect("reason");
    assert!(reason.contains("a directory"), "{reason}");
    assert_eq!(
        f.spool.counts().expect("counts"),
        SpoolTally { pending: 4, bad: 1 }
    );
    for untouched in [".hidden.json", "x.tmp", "300.json.tmp", "notes"] {
        assert!(f.dir.join(untouched).exists(), "{untouched} left alone");
    }
}

#[test]
fn candidate_names() {
    for yes in ["1-2-3.json", "a.json", "x.y.json"] {
        assert!(is_candidate(yes), "{yes}");
    }
    for no in [
        ".json",
        ".a.json",
        "a.json.tmp",
        "a.tmp",
        "a.JSON",
        "a/b.json",
        "json",
        "",
    ] {
        assert!(!is_candidate(no), "{no}");
    }
}

// ---- read ----

#[test]
fn read_returns_a_normal_file_and_caps_size() {
    let f = fixture();
    let name = seed_drop(&f.dir, "1700000000000000000-42-7");
    let body = f.spool.read(&name).expect("read");
    let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(v["status"], "ok");

    fs::write(f.dir.join("max.json"), vec![b' '; MAX_BODY_BYTES]).expect("write");
    assert_eq!(
        f.spool.read("max.json").expect("exactly the cap").len(),
        MAX_BODY_BYTES
    );

    fs::write(f.dir.join("big.json"), vec![b' '; MAX_BODY_BYTES + 1]).expect("write");
    let r = f.spool.read("big.json").expect_err("over the cap");
    assert!(
        matches!(r, Refusal::TooLarge { bytes } if bytes == MAX_BODY_BYTES as u64 + 1),
        "{r:?}"
    );
    assert!(r.should_park());
    assert!(r.to_string().contains("65536-byte cap"), "{r}");
}

#[test]
fn read_refuses_a_symlink_and_leaves_its_target_alone() {
    let f = fixture();
    let target = f.root.join("precious");
    fs::write(&target, b"do not touch").expect("write");
    let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    fs::File::options()
        .write(true)
        .open(&target)
        .expect("open")
        .set_modified(old)
        .expect("set mtime");
    let before = fs::metadata(&target).expect("stat");
    std::os::unix::fs::symlink(&target, f.dir.join("link.json")).expect("symlink");

    let r = f.spool.read("link.json").expect_err("a link is refused");
    assert!(matches!(r, Refusal::Symlink), "{r:?}");
    assert!(r.should_park());

    // The open alone (no look-before) refuses it too, through O_NOFOLLOW's ELOOP.
    let r = open_and_read(&f.spool.handles(), "link.json").expect_err("ELOOP");
    assert!(matches!(r, Refusal::Symlink), "{r:?}");

    let after = fs::metadata(&target).expect("stat");
    assert_eq!(fs::read(&target).expect("read"), b"do not touch");
    assert_eq!(after.modified().expect("mtime"), old);
    assert_eq!(after.mtime_nsec(), before.mtime_nsec());
    assert_eq!(after.ctime(), before.ctime());
}

#[test]
fn read_refuses_a_hard_linked_file() {
    let f = fixture();
    fs::write(f.dir.join("a.json"), b"{}").expect("write");
    fs::hard_link(f.dir.join("a.json"), f.root.join("second-name")).expect("link");
    let r = f.spool.read("a.json").expect_err("two links");
    assert!(matches!(r, Refusal::HardLinked { nlink: 2 }), "{r:?}");
    assert!(r.should_park());
}

#[tokio::test]
async fn read_refuses_a_fifo_without_blocking() {
    let f = fixture();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        f.dir.join("p.json"),
        Mode::from_raw_mode(0o600),
    )
    .expect("mkfifo");
    let spool = Arc::clone(&f.spool);
    // A blocking open would hang here with no writer; the bound turns that into a failure.
    let (via_read, via_open) = tokio::time::timeout(
        BOUND,
        tokio::task::spawn_blocking(move || {
            let a = spool.read("p.json");
            // Skip the look-before-open: the O_NONBLOCK open and fstat must refuse it alone.
            let b = open_and_read(&spool.handles(), "p.json");
            (a, b)
        }),
    )
    .await
    .expect("reading a FIFO must not block")
    .expect("join");
    for r in [via_read, via_open] {
        let r = r.expect_err("a FIFO is refused");
        assert!(matches!(r, Refusal::NotRegular { kind: "a FIFO" }), "{r:?}");
        assert!(r.should_park());
    }
}

#[test]
fn read_refuses_another_users_file() {
    let f = fixture();
    fs::write(f.dir.join("theirs.json"), b"{}").expect("write");
    if !rustix::process::geteuid().is_root() {
        eprintln!("note: not root, cannot chown; skipping the wrong-owner assertion");
        return;
    }
    std::os::unix::fs::chown(f.dir.join("theirs.json"), Some(65534), None).expect("chown");
    let r = f.spool.read("theirs.json").expect_err("wrong owner");
    assert!(
        matches!(r, Refusal::WrongOwner { uid: 65534, owner } if owner == f.spool.owner()),
        "{r:?}"
    );
    assert!(r.should_park());
}

#[test]
fn read_of_a_missing_name_is_gone_and_paths_are_not_names() {
    let f = fixture();
    let r = f.spool.read("never.json").expect_err("missing");
    assert!(matches!(r, Refusal::Gone), "{r:?}");
    assert!(!r.should_park());

    fs::write(f.root.join("outside.json"), b"{}").expect("write");
    for bad in ["../outside.json", "a/b.json", "", ".", ".."] {
        let r = f.spool.read(bad).expect_err("not a plain name");
        assert!(
            matches!(&r, Refusal::Io(e) if e.kind() == io::ErrorKind::InvalidInput),
            "{bad}: {r:?}"
        );
        assert!(
            matches!(f.spool.park(bad, "x"), Err(SpoolError::BadName { .. })),
            "{bad}"
        );
        assert!(
            matches!(f.spool.remove(bad), Err(SpoolError::BadName { .. })),
            "{bad}"
        );
    }
    assert!(f.root.join("outside.json").exists());
}

// ---- remove and park ----

#[test]
fn remove_deletes_and_a_missing_name_is_fine() {
    let f = fixture();
    let name = seed_drop(&f.dir, "1");
    f.spool.remove(&name).expect("remove");
    assert!(!f.dir.join(&name).exists());
    f.spool.remove(&name).expect("removing again is fine");
}

#[test]
fn park_moves_into_bad_with_a_reason_and_never_overwrites() {
    let f = fixture();
    let bad = f.dir.join(BAD_DIR);
    fs::write(f.dir.join("a.json"), b"first").expect("write");
    let parked = f
        .spool
        .park("a.json", "malformed: expected value at line 1")
        .expect("park");
    assert_eq!(parked.as_deref(), Some("a.json"));
    assert!(!f.dir.join("a.json").exists());
    assert_eq!(fs::read(bad.join("a.json")).expect("parked"), b"first");
    assert_eq!(
        fs::read_to_string(bad.join("a.json.reason")).expect("reason"),
        "malformed: expected value at line 1\n"
    );

    // The same name again gets a suffix; the first one stays as it was.
    fs::write(f.dir.join("a.json"), b"second").expect("write");
    let parked = f.spool.park("a.json", "refused again\n").expect("park");
    assert_eq!(parked.as_deref(), Some("a.json.1"));
    assert_eq!(fs::read(bad.join("a.json")).expect("first"), b"first");
    assert_eq!(fs::read(bad.join("a.json.1")).expect("second"), b"second");
    assert_eq!(
        fs::read_to_string(bad.join("a.json.1.reason")).expect("reason"),
        "refused again\n"
    );

    assert_eq!(
        f.spool.counts().expect("counts"),
        SpoolTally { pending: 0, bad: 2 }
    );
    assert_eq!(
        f.spool.park("a.json", "gone").expect("missing is fine"),
        None
    );
    // No temporaries left behind.
    let leftovers: Vec<_> = fs::read_dir(&bad)
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn park_moves_a_symlink_itself_not_its_target() {
    let f = fixture();
    let target = f.root.join("precious");
    fs::write(&target, b"keep").expect("write");
    std::os::unix::fs::symlink(&target, f.dir.join("l.json")).expect("symlink");
    let reason = f.spool.read("l.json").expect_err("refused").to_string();
    f.spool.park("l.json", &reason).expect("park");
    let parked = f.dir.join(BAD_DIR).join("l.json");
    assert!(
        fs::symlink_metadata(&parked)
            .expect("lstat")
            .file_type()
            .is_symlink()
    );
    assert_eq!(fs::read_link(&parked).expect("readlink"), target);
    assert_eq!(fs::read(&target).expect("target"), b"keep");
    assert!(
        fs::read_to_string(f.dir.join(BAD_DIR).join("l.json.reason"))
            .expect("reason")
            .contains("symbolic link")
    );
}

#[test]
fn park_recreates_a_removed_bad_dir() {
    let f = fixture();
    fs::write(f.dir.join("a.json"), b"x").expect("write");
    fs::remove_dir(f.dir.join(BAD_DIR)).expect("rmdir bad");
    assert_eq!(
        f.spool.park("a.json", "r").expect("park").as_deref(),
        Some("a.json")
    );
    assert!(f.dir.join(BAD_DIR).join("a.json").exists());
    assert_eq!(mode(&f.dir.join(BAD_DIR)), 0o700);
}

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

// ---- a file that does not parse: park it only once it stopped changing ----

/// Sets `name`'s mtime `ago` in the past.
fn age(dir: &Path, name: &str, ago: Duration) {
    let file = fs::File::options()
        .write(true)
        .open(dir.join(name))
        .expect("open");
    file.set_modified(SystemTime::now() - ago)
        .expect("set mtime");
}

#[test]
fn a_listed_file_is_settled_only_after_two_agreeing_looks_past_the_settle_time() {
    let f = fixture();
    fs::write(f.dir.join("x.json"), b"{half").expect("write");
    assert!(!f.spool.settled("x.json", false), "the first look");
    assert!(
        !f.spool.settled("x.json", false),
        "two looks agree, but it was written just now"
    );
    age(&f.dir, "x.json", Spool::SETTLE + Duration::from_secs(1));
    assert!(
        !f.spool.settled("x.json", false),
        "its mtime moved since the last look"
    );
    assert!(
        f.spool.settled("x.json", false),
        "the same twice and quiet for longer than the settle time"
    );
    assert!(!f.spool.settled("missing.json", false));
    assert!(
        !f.spool.settled("../escape.json", true),
        "names are checked"
    );
}

#[test]
fn a_listed_file_that_grows_or_is_replaced_between_looks_is_not_settled() {
    let f = fixture();
    let old = Spool::SETTLE + Duration::from_secs(1);
    fs::write(f.dir.join("grow.json"), b"{half").expect("write");
    age(&f.dir, "grow.json", old);
    assert!(!f.spool.settled("grow.json", false));
    // Appended, then the mtime put back: the size still tells.
    fs::File::options()
        .append(true)
        .open(f.dir.join("grow.json"))
        .expect("open")
        .write_all(b" more")
        .expect("append");
    age(&f.dir, "grow.json", old);
    assert!(!f.spool.settled("grow.json", false), "the size moved");

    fs::write(f.dir.join("swap.json"), b"{half").expect("write");
    age(&f.dir, "swap.json", old);
    assert!(!f.spool.settled("swap.json", false));
    // Another file of the same size and mtime renamed over it: a new inode.
    fs::write(f.dir.join("swap.tmp"), b"{half").expect("write");
    age(&f.dir, "swap.tmp", old);
    let mtime = fs::metadata(f.dir.join("swap.json"))
        .expect("stat")
        .modified()
        .expect("mtime");
    fs::File::options()
        .write(true)
        .open(f.dir.join("swap.tmp"))
        .expect("open")
        .set_modified(mtime)
        .expect("set mtime");
    fs::rename(f.dir.join("swap.tmp"), f.dir.join("swap.json")).expect("rename");
    assert!(!f.spool.settled("swap.json", false), "the inode moved");
}

#[test]
fn a_file_open_for_writing_is_never_settled_and_a_closed_one_at_once() {
    let f = fixture();
    let mut w = fs::File::create(f.dir.join("x.json")).expect("create");
    w.write_all(b"{\"id\":").expect("write");
    age(&f.dir, "x.json", Spool::SETTLE * 2);
    for _ in 0..3 {
        assert!(!f.spool.settled("x.json", false), "held open: listed");
        assert!(!f.spool.settled("x.json", true), "held open: announced");
    }
    drop(w);
    // Settled as soon as no process holds it for writing. Another test of this binary
    // that starts a process forks with every descriptor open, this file's too, until the
    // child's exec closes them: under load that window reaches milliseconds, so the
    // check is given a bound (no holder of our own is left; the file is never written).
    within_forks(
        "closed after writing (IN_CLOSE_WRITE): parked once no process holds it",
        || f.spool.settled("x.json", true).then_some(()).ok_or("held"),
    );
}

/// Polls `f` until it is `Ok`, for at most 5 s: long enough for another test's forked
/// child to reach its exec and drop the copies of our descriptors it holds.
fn within_forks<E: std::fmt::Display>(what: &str, mut f: impl FnMut() -> Result<(), E>) {
    let limit = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while let Err(e) = f() {
        assert!(std::time::Instant::now() < limit, "{what}: {e}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[tokio::test]
async fn a_file_written_in_place_slowly_is_never_parked_by_a_rescan() {
    // The hub's and the agent's rule: on a listing, park a malformed file only when settled.
    let f = fixture();
    let mut w = started(&f.spool, None).await;
    let mut file = fs::File::create(f.dir.join("slow.json")).expect("create");
    file.write_all(b"{\"id\":\"wp_1a2b3c4d5e6f\",")
        .expect("write");
    age(&f.dir, "slow.json", Spool::SETTLE * 2);
    for _ in 0..3 {
        let names = f.spool.list().expect("list");
        assert_eq!(names, ["slow.json"]);
        let body = f.spool.read("slow.json").expect("read");
        assert!(cortex_protocol::SignalRequest::parse(&body).is_err());
        assert!(!f.spool.settled("slow.json", false));
    }
    file.write_all(br#""secret":"s"}"#).expect("write");
    drop(file);
    assert_eq!(
        next(&mut w).await,
        SpoolEvent::File("slow.json".into()),
        "its close announces it"
    );
    let body = f.spool.read("slow.json").expect("read");
    assert!(cortex_protocol::SignalRequest::parse(&body).is_ok());
    assert_eq!(f.spool.counts().expect("counts").bad, 0);
}

// ---- one collector per spool ----

fn hub() -> Collector {
    Collector::new("cortex-hub", None)
}

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

// ---- entries that are never delivered ----

/// Undoes [`escape_name`].
fn unescape(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && b.get(i + 1) == Some(&b'\\') {
            out.push(b'\\');
            i += 2;
        } else if b[i] == b'\\' && b.get(i + 1) == Some(&b'x') {
            out.push(u8::from_str_radix(&s[i + 2..i + 4], 16).expect("hex"));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

#[test]
fn escaped_names_are_lossless() {
    for name in [
        &b"plain.json"[..],
        b"caf\xc3\xa9.json",
        b"\xff\xfe.json",
        b"back\\slash\\x41.json",
        b"\\xff\xff",
        b"\xe2\x82",
    ] {
        let e = escape_name(name);
        assert_eq!(unescape(&e), name, "{e}");
    }
    assert_eq!(escape_name(b"a\xffb\\"), "a\\xffb\\\\");
}

#[test]
fn a_name_that_is_not_utf8_is_parked_under_its_escape() {
    let f = fixture();
    let raw = OsStr::from_bytes(b"sig\xff\\.json");
    fs::write(f.dir.join(raw), b"{}").expect("write");
    let long: Vec<u8> = std::iter::repeat_n(0xfeu8, 120).collect();
    fs::write(f.dir.join(OsStr::from_bytes(&long)), b"{}").expect("write");
    // A writer's temporaries, even with such names, are left alone.
    fs::write(f.dir.join(OsStr::from_bytes(b"t\xff.tmp")), b"{").expect("write");
    fs::write(f.dir.join(OsStr::from_bytes(b".\xffdot")), b"{").expect("write");
    assert_eq!(f.spool.list().expect("list"), Vec::<String>::new());
    let parked = f.dir.join("bad/sig\\xff\\\\.json");
    assert_eq!(fs::read(&parked).expect("parked under its escape"), b"{}");
    let reason = fs::read_to_string(f.dir.join("bad/sig\\xff\\\\.json.reason")).expect("reason");
    assert!(
        reason.contains("not UTF-8") && reason.contains("sig\\xff\\\\.json"),
        "{reason}"
    );
    // The long one: cut in its parked name, whole in its reason.
    let escaped = escape_name(&long);
    let cut = &escaped[..MAX_PARKED_NAME];
    assert!(f.dir.join("bad").join(cut).is_file());
    let reason =
        fs::read_to_string(f.dir.join("bad").join(format!("{cut}.reason"))).expect("reason");
    assert!(reason.contains(&escaped), "{reason}");
    assert!(f.dir.join(OsStr::from_bytes(b"t\xff.tmp")).exists());
    assert!(f.dir.join(OsStr::from_bytes(b".\xffdot")).exists());
    assert_eq!(f.spool.counts().expect("counts").bad, 2);
}

#[test]
fn temporaries_and_the_lock_are_never_touched() {
    let f = fixture();
    f.spool.claim(&hub()).expect("claim");
    for name in [".x.json", "x.json.tmp", ".hidden"] {
        fs::write(f.dir.join(name), b"{").expect("write");
    }
    fs::create_dir(f.dir.join(".dotdir.json")).expect("mkdir");
    for _ in 0..2 {
        assert_eq!(f.spool.list().expect("list"), Vec::<String>::new());
    }
    for name in [
        LOCK_FILE,
        ".x.json",
        "x.json.tmp",
        ".hidden",
        ".dotdir.json",
    ] {
        assert!(f.dir.join(name).exists(), "{name} left alone");
    }
    assert_eq!(f.spool.counts().expect("counts").bad, 0);
}

/// A `MakeWriter` that keeps what the subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

#[test]
fn other_odd_names_are_logged_once_per_process() {
    let f = fixture();
    fs::write(f.dir.join("notes.txt"), b"x").expect("write");
    fs::create_dir(f.dir.join("subdir")).expect("mkdir");
    let out = Captured::default();
    let sub = tracing_subscriber::fmt()
        .with_writer(out.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(sub, || {
        for _ in 0..3 {
            assert_eq!(f.spool.list().expect("list"), Vec::<String>::new());
        }
    });
    let text = String::from_utf8(out.0.lock().expect("lock").clone()).expect("utf8");
    assert_eq!(text.matches("notes.txt").count(), 1, "{text}");
    assert_eq!(text.matches("subdir").count(), 1, "{text}");
    assert!(
        !text.contains("name=bad"),
        "bad/ itself is no odd name:\n{text}"
    );
    assert!(f.dir.join("notes.txt").exists() && f.dir.join("subdir").is_dir());
    assert_eq!(f.spool.counts().expect("counts").bad, 0);
}
