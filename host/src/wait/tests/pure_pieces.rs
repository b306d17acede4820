//! Pure pieces.

use super::*;
use crate::wait::file::{Action, classify, created_fires};

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
