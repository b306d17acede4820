//! lazyfs mounted for real: programs' calls go through the kernel's FUSE, a cut loses what
//! was not synced, and a mount over the same backing directory shows the durable state.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use lazyfs::{Cut, LazyFs, Names};

/// Skips (printing why) where FUSE cannot be mounted.
fn can_mount() -> bool {
    match lazyfs::available() {
        Ok(()) => true,
        Err(why) => {
            eprintln!("skipped: {why}");
            false
        }
    }
}

fn fsync_dir(p: &Path) {
    fs::File::open(p)
        .expect("open dir")
        .sync_all()
        .expect("fsync dir");
}

#[test]
fn a_cut_keeps_what_was_synced_and_loses_the_rest() {
    if !can_mount() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let (mnt, backing) = (tmp.path().join("mnt"), tmp.path().join("backing"));
    fs::create_dir(&mnt).expect("mnt");
    fs::create_dir(&backing).expect("backing");
    let lfs = LazyFs::mount(&mnt, &backing, Names::Strict).expect("mount");

    fs::create_dir(mnt.join("d")).expect("mkdir");
    // Synced data, synced name.
    let mut kept = fs::File::create(mnt.join("d/kept")).expect("create");
    kept.write_all(b"durable").expect("write");
    kept.sync_data().expect("fdatasync");
    fsync_dir(&mnt.join("d"));
    // Then more, never synced.
    kept.write_all(b" and lost").expect("write");
    // The atomic replace: tmp, fsync, rename, fsync the directory.
    let mut tmp_file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(mnt.join("d/state.tmp"))
        .expect("create");
    tmp_file.write_all(b"{\"v\":2}").expect("write");
    tmp_file.sync_all().expect("fsync");
    fs::rename(mnt.join("d/state.tmp"), mnt.join("d/state")).expect("rename");
    fsync_dir(&mnt.join("d"));
    // Data synced, name never.
    let mut orphan = fs::File::create(mnt.join("d/orphan")).expect("create");
    orphan.write_all(b"x").expect("write");
    orphan.sync_all().expect("fsync");
    // Unlinked but the directory not synced: it comes back.
    fs::remove_file(mnt.join("d/state")).expect("unlink");

    // The program sees its own writes.
    assert_eq!(
        fs::read(mnt.join("d/kept")).expect("read"),
        b"durable and lost"
    );
    assert!(!mnt.join("d/state").exists());
    let mut names: Vec<String> = fs::read_dir(mnt.join("d"))
        .expect("ls")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["kept", "orphan"]);

    let report = lfs.cut(Cut::Whole).expect("cut");
    assert!(
        report.changes_dropped >= 1 && report.names_dropped >= 2,
        "{report:?}"
    );
    // After the cut the disk is gone for whoever still runs.
    let late = kept.write_all(b"late");
    assert!(late.is_err(), "a write after the cut fails");
    drop((kept, orphan, tmp_file));
    lfs.unmount();

    let lfs = LazyFs::mount(&mnt, &backing, Names::Strict).expect("mount again");
    assert_eq!(fs::read(mnt.join("d/kept")).expect("kept"), b"durable");
    assert!(!mnt.join("d/orphan").exists(), "its name was never synced");
    assert_eq!(fs::read(mnt.join("d/state")).expect("state"), b"{\"v\":2}");
    assert!(!mnt.join("d/state.tmp").exists());
    // And the remounted filesystem works as before.
    fs::write(mnt.join("d/again"), b"ok").expect("write");
    assert_eq!(fs::read(mnt.join("d/again")).expect("read"), b"ok");
    lfs.unmount();
}
