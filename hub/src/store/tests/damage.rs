//! Damage: a journal torn, broken or missing after a crash.

use super::*;

/// Offsets of the records at the start of the journal file at `path`, in order.
fn record_offsets(path: &std::path::Path) -> Vec<usize> {
    let b = std::fs::read(path).expect("journal");
    let mut out = Vec::new();
    let mut at = 0;
    while at + 16 <= b.len() {
        let len = u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes")) as usize;
        if len == 0 {
            break;
        }
        out.push(at);
        at += 16 + len;
    }
    out
}

/// The journal file holding the newest records (the two alternate at each checkpoint).
fn newest_journal(dir: &std::path::Path) -> std::path::PathBuf {
    let paths = journal_paths(&dir.join("hub.redb"));
    let newest = |p: &std::path::Path| {
        Journal::open(p, 1 << 20)
            .expect("journal")
            .1
            .last()
            .map_or(0, |r| r.seq)
    };
    if newest(&paths[0]) >= newest(&paths[1]) {
        paths[0].clone()
    } else {
        paths[1].clone()
    }
}

/// A store in `dir` left by a crash with `n` signals in its journal only.
async fn crashed_with_signals(dir: &std::path::Path, n: usize) -> String {
    let (store, guard) = open(dir);
    let sid = session(&store).await;
    let (id, secret) = monitor(&store, &sid, 1_000).await;
    store.checkpoint().await;
    for i in 0..n {
        send(&store, progress(&id, &secret, &format!("k{i}")), T0 + 1).await;
    }
    crash(store, guard).await;
    id
}

#[tokio::test]
async fn damage_in_the_middle_of_the_journal_refuses_to_start_and_a_recovery_keeps_the_rest() {
    let dir = tempfile::tempdir().expect("tmp");
    let id = crashed_with_signals(dir.path(), 10).await;
    let jpath = newest_journal(dir.path());
    let offsets = record_offsets(&jpath);
    assert!(offsets.len() >= 10, "{offsets:?}");
    // One byte of the fourth signal's record flipped.
    let at = offsets[offsets.len() - 7] + 20;
    let mut bytes = std::fs::read(&jpath).expect("read");
    bytes[at] ^= 0xff;
    std::fs::write(&jpath, &bytes).expect("write");
    let err = match Store::open(&dir.path().join("hub.redb"), Settings::default()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a damaged journal was opened"),
    };
    assert!(err.contains("damaged"), "{err}");
    assert!(err.contains("--recover-journal"), "{err}");
    // The recovery keeps the nine readable signals and names the lost record.
    let r =
        Store::recover_journal(&dir.path().join("hub.redb"), Settings::default()).expect("recover");
    assert_eq!(r.applied, 9);
    assert_eq!(r.lost.len(), 1);
    assert_eq!(r.lost[0].0, r.lost[0].1, "one record lost");
    let (store, _guard) = open(dir.path());
    assert_eq!(signal_count(&store, &id).await, 9);
}

#[tokio::test]
async fn a_torn_last_record_is_an_end_not_damage() {
    let dir = tempfile::tempdir().expect("tmp");
    let id = crashed_with_signals(dir.path(), 5).await;
    let jpath = newest_journal(dir.path());
    let offsets = record_offsets(&jpath);
    let last = *offsets.last().expect("records");
    let mut bytes = std::fs::read(&jpath).expect("read");
    bytes[last + 20] ^= 0xff;
    std::fs::write(&jpath, &bytes).expect("write");
    let (store, _guard) = open(dir.path());
    assert_eq!(signal_count(&store, &id).await, 4);
}

#[tokio::test]
async fn a_missing_journal_after_a_crash_refuses_to_start_but_not_after_a_clean_stop() {
    let dir = tempfile::tempdir().expect("tmp");
    crashed_with_signals(dir.path(), 3).await;
    std::fs::remove_file(dir.path().join("hub.journal")).expect("rm");
    let err = match Store::open(&dir.path().join("hub.redb"), Settings::default()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a store missing its journal was opened"),
    };
    assert!(err.contains("missing"), "{err}");

    let clean = tempfile::tempdir().expect("tmp");
    let (store, guard) = open(clean.path());
    session(&store).await;
    drop(store);
    guard.join();
    std::fs::remove_file(clean.path().join("hub.journal")).expect("rm");
    let (store, _guard) = open(clean.path());
    assert_eq!(store.read(|r| r.sessions()).await.expect("read").len(), 1);
}
