//! The forwarder against a real spool in a temp dir and a fake outbox: the window, each
//! ack outcome, local refusals, offline behaviour, and the bounded queue.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cortex_protocol::mesh::{AgentFrame, FileOutcome, Frame, MAX_MESSAGE_BYTES};
use tokio::time::Instant;

use crate::agent::forward::{Forwarder, Outbox, QUEUE_CAP};
use cortex_host::spool::Spool;

/// Collects frames; `room` is how many it takes before reporting itself full.
struct FakeOut {
    frames: Vec<AgentFrame>,
    room: usize,
}

impl FakeOut {
    fn new() -> FakeOut {
        FakeOut {
            frames: Vec::new(),
            room: usize::MAX,
        }
    }

    fn names(&mut self) -> Vec<String> {
        self.frames
            .drain(..)
            .map(|f| match f {
                AgentFrame::File { name, .. } => name,
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }
}

impl Outbox for FakeOut {
    fn has_room(&self) -> bool {
        self.frames.len() < self.room
    }

    fn send(&mut self, frame: Vec<u8>) -> bool {
        self.frames
            .push(AgentFrame::decode(&frame).expect("a valid frame"));
        true
    }
}

pub(super) fn signal(n: usize) -> String {
    format!(r#"{{"id":"wp_{n}","secret":"s3cret","status":"ok","message":"exit=0"}}"#)
}

/// Writes `name` the way the one-line shell drop does: a `.tmp`, then a rename.
pub(super) fn drop_file(dir: &Path, name: &str, body: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, body).expect("write");
    std::fs::rename(&tmp, dir.join(name)).expect("rename");
}

fn setup() -> (tempfile::TempDir, Arc<Spool>, Forwarder) {
    let dir = tempfile::tempdir().expect("tmp");
    let spool = Arc::new(Spool::open(&dir.path().join("signals")).expect("spool"));
    let fwd = Forwarder::new(spool.clone(), Duration::from_secs(5));
    (dir, spool, fwd)
}

fn name(i: usize) -> String {
    format!("{i:04}.json")
}

fn reason_of(spool: &Spool, name: &str) -> String {
    std::fs::read_to_string(spool.path().join("bad").join(format!("{name}.reason")))
        .expect("a .reason file")
}

#[test]
fn the_window_bounds_the_files_in_flight() {
    let (_d, spool, mut fwd) = setup();
    for i in 0..10 {
        drop_file(spool.path(), &name(i), &signal(i));
    }
    let mut out = FakeOut::new();
    let now = Instant::now();
    fwd.link_up(3, MAX_MESSAGE_BYTES);
    fwd.pump(&mut out, now);
    assert_eq!(out.names(), [name(0), name(1), name(2)], "in name order");
    fwd.pump(&mut out, now);
    assert!(out.frames.is_empty(), "the window is full");
    assert_eq!(fwd.unacked(), 3);

    assert!(fwd.ack(&name(1), FileOutcome::Accepted, now));
    assert!(!spool.path().join(name(1)).exists(), "removed once acked");
    fwd.pump(&mut out, now);
    assert_eq!(out.names(), [name(3)]);

    // A full writer channel holds the rest back too.
    assert!(fwd.ack(&name(0), FileOutcome::Accepted, now));
    assert!(fwd.ack(&name(2), FileOutcome::Accepted, now));
    out.room = 1;
    fwd.pump(&mut out, now);
    assert_eq!(out.frames.len(), 1);
}

#[test]
fn each_outcome_does_what_the_protocol_says() {
    let (_d, spool, mut fwd) = setup();
    for i in 0..5 {
        drop_file(spool.path(), &name(i), &signal(i));
    }
    let mut out = FakeOut::new();
    let now = Instant::now();
    fwd.link_up(64, MAX_MESSAGE_BYTES);
    fwd.pump(&mut out, now);
    assert_eq!(out.names().len(), 5);

    fwd.ack(&name(0), FileOutcome::Accepted, now);
    fwd.ack(&name(1), FileOutcome::Duplicate, now);
    fwd.ack(&name(2), FileOutcome::Resolved, now);
    fwd.ack(
        &name(3),
        FileOutcome::Refused {
            reason: "wrong secret for waitpoint wp_3".into(),
        },
        now,
    );
    fwd.ack(
        &name(4),
        FileOutcome::Retry {
            reason: "store failure".into(),
        },
        now,
    );
    for i in 0..4 {
        assert!(!spool.path().join(name(i)).exists(), "{i} left the spool");
    }
    assert!(spool.path().join("bad").join(name(3)).exists());
    assert_eq!(
        reason_of(&spool, &name(3)),
        "refused by the hub: wrong secret for waitpoint wp_3\n"
    );
    assert!(spool.path().join(name(4)).exists(), "retry keeps the file");

    // A rescan does not send the retried file before its delay...
    fwd.rescan();
    fwd.pump(&mut out, now);
    assert!(out.frames.is_empty());
    // ...and after it, it goes again.
    fwd.tick(now + Duration::from_secs(5));
    fwd.pump(&mut out, now + Duration::from_secs(5));
    assert_eq!(out.names(), [name(4)]);
    let c = spool.counts().expect("counts");
    assert_eq!((c.pending, c.bad), (1, 1));
}

#[test]
fn malformed_files_are_parked_locally_and_never_sent() {
    let (_d, spool, mut fwd) = setup();
    let mut out = FakeOut::new();
    let now = Instant::now();
    fwd.link_up(64, MAX_MESSAGE_BYTES);
    fwd.pump(&mut out, now);

    drop_file(spool.path(), "a.json", "not json");
    drop_file(
        spool.path(),
        "b.json",
        &format!(
            r#"{{"id":"wp_1","secret":"s","message":"{}"}}"#,
            "x".repeat(2001)
        ),
    );
    std::os::unix::fs::symlink("/etc/passwd", spool.path().join("c.json")).expect("symlink");
    for n in ["a.json", "b.json", "c.json"] {
        fwd.file(n.into());
    }
    fwd.pump(&mut out, now);
    assert!(out.frames.is_empty(), "{:?}", out.frames);
    for n in ["a.json", "b.json", "c.json"] {
        assert!(spool.path().join("bad").join(n).exists(), "{n} parked");
    }
    assert!(
        reason_of(&spool, "b.json").contains("message"),
        "{}",
        reason_of(&spool, "b.json")
    );
    assert!(reason_of(&spool, "c.json").contains("symbolic link"));

    // A malformed file a listing finds while fresh may still be being written in place:
    // it is left for its close event or a later rescan.
    drop_file(spool.path(), "d.json", "{\"id\":");
    fwd.rescan();
    fwd.pump(&mut out, now);
    assert!(spool.path().join("d.json").exists());
    assert!(out.frames.is_empty());
}

#[test]
fn a_file_too_big_for_the_hubs_frame_cap_is_parked() {
    let (_d, spool, mut fwd) = setup();
    drop_file(spool.path(), "big.json", &signal(1));
    let mut out = FakeOut::new();
    fwd.link_up(64, 40);
    fwd.pump(&mut out, Instant::now());
    assert!(out.frames.is_empty());
    assert!(reason_of(&spool, "big.json").contains("40-byte cap"));
}

#[test]
fn offline_files_wait_and_go_on_the_next_link() {
    let (_d, spool, mut fwd) = setup();
    let mut out = FakeOut::new();
    let now = Instant::now();
    drop_file(spool.path(), &name(0), &signal(0));
    fwd.file(name(0));
    fwd.pump(&mut out, now);
    assert!(out.frames.is_empty(), "no link, nothing read");

    fwd.link_up(64, MAX_MESSAGE_BYTES);
    drop_file(spool.path(), &name(1), &signal(1));
    fwd.pump(&mut out, now);
    assert_eq!(out.names(), [name(0), name(1)]);

    // The link drops before the acks: both go again on the next one, once each.
    fwd.link_down();
    assert_eq!(fwd.unacked(), 0);
    fwd.file(name(1));
    fwd.link_up(64, MAX_MESSAGE_BYTES);
    fwd.pump(&mut out, now);
    assert_eq!(out.names(), [name(1), name(0)]);

    // An ack for something not in flight touches nothing.
    assert!(!fwd.ack("other.json", FileOutcome::Accepted, now));
    assert!(spool.path().join(name(0)).exists());
}

#[test]
fn a_hub_rescan_finds_files_inotify_never_announced() {
    let (_d, spool, mut fwd) = setup();
    let mut out = FakeOut::new();
    let now = Instant::now();
    fwd.link_up(64, MAX_MESSAGE_BYTES);
    fwd.pump(&mut out, now);
    drop_file(spool.path(), "quiet.json", &signal(1));
    fwd.pump(&mut out, now);
    assert!(out.frames.is_empty());
    fwd.rescan();
    fwd.pump(&mut out, now);
    assert_eq!(out.names(), ["quiet.json"]);
}

#[test]
fn the_queue_is_bounded_and_the_backlog_stays_on_disk() {
    let (_d, spool, mut fwd) = setup();
    let total = QUEUE_CAP + 500;
    for i in 0..total {
        drop_file(spool.path(), &format!("{i:06}.json"), &signal(i));
    }
    // Offline, the events of all of them arrive: only QUEUE_CAP names are kept.
    for i in 0..total {
        fwd.file(format!("{i:06}.json"));
    }
    assert!(!fwd.wants_events());

    let mut out = FakeOut::new();
    let now = Instant::now();
    fwd.link_up(256, MAX_MESSAGE_BYTES);
    let mut sent = 0;
    loop {
        fwd.pump(&mut out, now);
        let names = out.names();
        if names.is_empty() {
            break;
        }
        for n in &names {
            fwd.ack(n, FileOutcome::Accepted, now);
        }
        sent += names.len();
    }
    assert_eq!(sent, total, "every file sent exactly once");
    assert_eq!(spool.list().expect("list").len(), 0);
    assert!(fwd.wants_events());
}
