//! What survives a cut, per rule of the model (no FUSE, no disk).

use super::*;

fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn fresh(names: Names) -> Model {
    Model::new(names, 0o755, 0, 0)
}

/// Cuts, reboots and returns the tree that came back.
fn after(mut m: Model, how: Cut) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    m.cut(&mut NoMirror, how).expect("cut");
    m.reboot();
    m.snapshot()
}

fn file(tree: &BTreeMap<PathBuf, Option<Vec<u8>>>, p: &str) -> Option<Vec<u8>> {
    tree.get(Path::new(p)).cloned().flatten()
}

/// A file created, written and fsynced, with its directory fsynced: durable.
fn durable_file(m: &mut Model, dir: Ino, name: &str, data: &[u8]) -> Ino {
    let f = m.create(dir, n(name), 0o644, 0, 0).expect("create");
    m.write(f, 0, data).expect("write");
    m.fsync(&mut NoMirror, f).expect("fsync");
    m.fsync_dir(&mut NoMirror, dir).expect("fsync dir");
    f
}

#[test]
fn the_program_reads_its_own_unsynced_writes() {
    let mut m = fresh(Names::Strict);
    let f = m.create(ROOT, n("f"), 0o644, 0, 0).expect("create");
    m.write(f, 0, b"hello").expect("write");
    m.write(f, 3, b"p!").expect("write");
    assert_eq!(m.read(f, 0, 100).expect("read"), b"help!");
    assert_eq!(m.read(f, 2, 2).expect("read"), b"lp");
    m.set_len(f, 2).expect("truncate");
    assert_eq!(m.read(f, 0, 100).expect("read"), b"he");
    assert_eq!(m.attr(f).expect("attr").size, 2);
}

#[test]
fn writes_without_fsync_are_lost_and_fsynced_ones_kept() {
    for names in [Names::Strict, Names::Journaled] {
        let mut m = fresh(names);
        let f = durable_file(&mut m, ROOT, "f", b"synced");
        m.write(f, 0, b"SYNCED and more").expect("write");
        let tree = after(m, Cut::Whole);
        assert_eq!(
            file(&tree, "f").as_deref(),
            Some(&b"synced"[..]),
            "{names:?}"
        );
    }
}

#[test]
fn fdatasync_after_writes_keeps_them_all() {
    let mut m = fresh(Names::Strict);
    let f = durable_file(&mut m, ROOT, "f", b"");
    assert!(!m.unsynced());
    m.write(f, 0, b"one ").expect("write");
    m.write(f, 4, b"two").expect("write");
    assert!(m.unsynced());
    m.fsync(&mut NoMirror, f).expect("fsync");
    assert!(!m.unsynced());
    m.set_len(f, 0).expect("truncate after the sync");
    let tree = after(m, Cut::Whole);
    assert_eq!(file(&tree, "f").as_deref(), Some(&b"one two"[..]));
}

#[test]
fn a_new_files_name_needs_its_directory_fsynced_under_strict() {
    let mut m = fresh(Names::Strict);
    let f = m.create(ROOT, n("f"), 0o644, 0, 0).expect("create");
    m.write(f, 0, b"data").expect("write");
    m.fsync(&mut NoMirror, f).expect("fsync the file only");
    let tree = after(m, Cut::Whole);
    assert_eq!(
        file(&tree, "f"),
        None,
        "the data is durable, its name is not"
    );
}

#[test]
fn any_fsync_commits_earlier_names_under_journaled() {
    let mut m = fresh(Names::Journaled);
    let d = m
        .mkdir(&mut NoMirror, ROOT, n("d"), 0o755, 0, 0)
        .expect("mkdir");
    let f = m.create(d, n("f"), 0o644, 0, 0).expect("create");
    m.write(f, 0, b"data").expect("write");
    let g = m.create(ROOT, n("g"), 0o644, 0, 0).expect("create");
    m.write(g, 0, b"never synced").expect("write");
    m.fsync(&mut NoMirror, f).expect("fsync f");
    // After the fsync: neither this name nor this write is committed.
    let h = m.create(ROOT, n("h"), 0o644, 0, 0).expect("create");
    m.write(f, 0, b"DATA").expect("write");
    let _ = h;
    let tree = after(m, Cut::Whole);
    assert_eq!(file(&tree, "d/f").as_deref(), Some(&b"data"[..]));
    assert_eq!(
        file(&tree, "g").as_deref(),
        Some(&b""[..]),
        "g's name was committed by f's fsync, its data never was"
    );
    assert!(!tree.contains_key(Path::new("h")));
}

#[test]
fn a_rename_over_a_file_is_durable_with_its_directory_and_atomic() {
    let mut m = fresh(Names::Strict);
    durable_file(&mut m, ROOT, "state", b"old");
    let t = m.create(ROOT, n("state.tmp"), 0o644, 0, 0).expect("create");
    m.write(t, 0, b"new").expect("write");
    m.fsync(&mut NoMirror, t).expect("fsync tmp");
    m.rename(&mut NoMirror, ROOT, n("state.tmp"), ROOT, n("state"), false)
        .expect("rename");
    assert_eq!(m.read(t, 0, 10).expect("read"), b"new");
    let mut synced = fresh(Names::Strict);
    durable_file(&mut synced, ROOT, "state", b"old");
    let t2 = synced
        .create(ROOT, n("state.tmp"), 0o644, 0, 0)
        .expect("create");
    synced.write(t2, 0, b"new").expect("write");
    synced.fsync(&mut NoMirror, t2).expect("fsync tmp");
    synced
        .rename(&mut NoMirror, ROOT, n("state.tmp"), ROOT, n("state"), false)
        .expect("rename");
    synced.fsync_dir(&mut NoMirror, ROOT).expect("fsync dir");

    let tree = after(m, Cut::Whole);
    assert_eq!(file(&tree, "state").as_deref(), Some(&b"old"[..]));
    assert!(!tree.contains_key(Path::new("state.tmp")));
    let tree = after(synced, Cut::Whole);
    assert_eq!(file(&tree, "state").as_deref(), Some(&b"new"[..]));
    assert!(!tree.contains_key(Path::new("state.tmp")));
    // A prefix cut keeps the rename whole or not at all: never neither name.
    for seed in 0..50 {
        let mut m = fresh(Names::Strict);
        durable_file(&mut m, ROOT, "state", b"old");
        let t = m.create(ROOT, n("state.tmp"), 0o644, 0, 0).expect("create");
        m.write(t, 0, b"new").expect("write");
        m.fsync(&mut NoMirror, t).expect("fsync");
        m.rename(&mut NoMirror, ROOT, n("state.tmp"), ROOT, n("state"), false)
            .expect("rename");
        let tree = after(m, Cut::Prefix { seed });
        let state = file(&tree, "state");
        assert!(
            state.as_deref() == Some(&b"old"[..]) || state.as_deref() == Some(&b"new"[..]),
            "seed {seed}: {state:?}"
        );
    }
}

#[test]
fn an_unlink_not_synced_comes_back() {
    let mut m = fresh(Names::Strict);
    durable_file(&mut m, ROOT, "spool.json", b"{}");
    m.unlink(ROOT, n("spool.json")).expect("unlink");
    assert!(m.lookup(ROOT, n("spool.json")).is_err());
    let tree = after(m, Cut::Whole);
    assert_eq!(file(&tree, "spool.json").as_deref(), Some(&b"{}"[..]));
}

#[test]
fn a_rename_across_directories_is_durable_per_directory_under_strict() {
    let mut m = fresh(Names::Strict);
    let a = m
        .mkdir(&mut NoMirror, ROOT, n("a"), 0o755, 0, 0)
        .expect("mkdir");
    let b = m
        .mkdir(&mut NoMirror, ROOT, n("b"), 0o755, 0, 0)
        .expect("mkdir");
    durable_file(&mut m, a, "f", b"x");
    m.rename(&mut NoMirror, a, n("f"), b, n("f"), false)
        .expect("rename");
    m.fsync_dir(&mut NoMirror, b).expect("fsync b only");
    let tree = after(m, Cut::Whole);
    // Both names: the unlink from a was never made durable.
    assert_eq!(file(&tree, "a/f").as_deref(), Some(&b"x"[..]));
    assert_eq!(file(&tree, "b/f").as_deref(), Some(&b"x"[..]));
}

#[test]
fn a_prefix_cut_keeps_a_prefix_of_the_writes_in_order_and_repeats_by_seed() {
    let writes: Vec<(u64, Vec<u8>)> = (0..12u8)
        .map(|i| (u64::from(i) * 3, vec![b'a' + i; 5]))
        .collect();
    let run = |seed: u64| {
        let mut m = fresh(Names::Strict);
        let f = durable_file(&mut m, ROOT, "f", b"base");
        for (at, d) in &writes {
            m.write(f, *at, d).expect("write");
        }
        file(&after(m, Cut::Prefix { seed }), "f").expect("f")
    };
    let mut kept = BTreeSet::new();
    for seed in 0..200 {
        let got = run(seed);
        assert_eq!(got, run(seed), "seed {seed}: the same seed keeps the same");
        let k = (0..=writes.len())
            .find(|&k| {
                let mut want = b"base".to_vec();
                for (at, d) in &writes[..k] {
                    Change::Write {
                        at: *at,
                        data: d.clone(),
                    }
                    .apply(&mut want);
                }
                want == got
            })
            .unwrap_or_else(|| panic!("seed {seed}: {got:?} is no prefix of the writes"));
        kept.insert(k);
    }
    assert!(
        kept.contains(&0) && kept.contains(&writes.len()) && kept.len() > 5,
        "{kept:?}"
    );
}

#[test]
fn after_a_cut_every_operation_fails_with_eio() {
    let mut m = fresh(Names::Strict);
    let f = durable_file(&mut m, ROOT, "f", b"x");
    m.cut(&mut NoMirror, Cut::Whole).expect("cut");
    assert_eq!(m.write(f, 0, b"late"), Err(Errno::IO));
    assert_eq!(m.fsync(&mut NoMirror, f), Err(Errno::IO));
    assert_eq!(m.lookup(ROOT, n("f")), Err(Errno::IO));
    assert_eq!(m.create(ROOT, n("g"), 0o644, 0, 0), Err(Errno::IO));
    assert_eq!(m.cut(&mut NoMirror, Cut::Whole), Err(Errno::IO));
}

#[test]
fn a_cut_reports_what_it_dropped() {
    let mut m = fresh(Names::Strict);
    let f = durable_file(&mut m, ROOT, "f", b"x");
    m.write(f, 0, b"a").expect("write");
    m.write(f, 1, b"b").expect("write");
    m.create(ROOT, n("g"), 0o644, 0, 0).expect("create");
    let r = m.cut(&mut NoMirror, Cut::Whole).expect("cut");
    assert_eq!(
        r,
        CutReport {
            files: 1,
            changes_kept: 0,
            changes_dropped: 2,
            names_kept: 0,
            names_dropped: 1,
            per_file: vec![(PathBuf::from("f"), 0, 2)],
        }
    );
}

#[test]
fn names_refuse_what_posix_refuses() {
    let mut m = fresh(Names::Strict);
    let d = m
        .mkdir(&mut NoMirror, ROOT, n("d"), 0o755, 0, 0)
        .expect("mkdir");
    durable_file(&mut m, d, "f", b"x");
    durable_file(&mut m, ROOT, "g", b"y");
    assert_eq!(m.create(d, n("f"), 0o644, 0, 0), Err(Errno::EXIST));
    assert_eq!(m.rmdir(&mut NoMirror, ROOT, n("d")), Err(Errno::NOTEMPTY));
    assert_eq!(
        m.rename(&mut NoMirror, ROOT, n("g"), d, n("f"), true),
        Err(Errno::EXIST),
        "RENAME_NOREPLACE"
    );
    assert_eq!(
        m.rename(&mut NoMirror, ROOT, n("g"), ROOT, n("d"), false),
        Err(Errno::ISDIR)
    );
    assert_eq!(m.unlink(ROOT, n("d")), Err(Errno::ISDIR));
    assert_eq!(m.lookup(ROOT, n("nope")), Err(Errno::NOENT));
    m.unlink(d, n("f")).expect("unlink");
    m.rmdir(&mut NoMirror, ROOT, n("d")).expect("rmdir");
    let tree = after(m, Cut::Whole);
    assert!(
        !tree.contains_key(Path::new("d")),
        "rmdir is written through"
    );
}
