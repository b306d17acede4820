//! The spool's directory and its entries: open, list, read, remove and park.

use cortex_protocol::signal::MAX_BODY_BYTES;

use super::*;
use crate::spool::dir::check_owner;

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
