//! Target `journal`: the bytes of the hub's journal file (`hub.journal` beside
//! `hub.redb`), through what reads it: `Journal::open` (the scan at start) and
//! `Journal::salvage` against a reference reader of the documented format, then
//! `Store::open` (which replays the records: change records and older hubs' operation
//! records) and `Store::recover_journal`. Properties: no panic, on the caller's thread or
//! the store's own; each returns a value or a typed error; the scans find exactly the
//! records the format says are there.
//!
//! Record: `len u32 | crc32c u32 | seq u64 | payload`, little-endian, the CRC-32C over
//! `seq | payload`. A change record's payload:
//! `0xC1 | count u32 | (name_len u16 | name | key_len u32 | key | 0 | 1 value_len u32 value)*`.

use std::path::Path;

use cortex_hub::engine::Settings;
use cortex_hub::store::Store;
use cortex_hub::store::kernel::journal::{Journal, MAX_RECORD, Record};
use proptest::prelude::*;

use crate::driver::{self, Budget, Mutation, Outcome, Target};

pub const TARGET: Target = Target {
    name: "journal",
    check,
    fuzz,
    seeds,
};

/// The hub's tables by name, as change records name them.
const TABLES: [&str; 14] = [
    "meta",
    "timer_queue",
    "waitpoints_v2",
    "signal_keys",
    "deadlines",
    "sessions",
    "session_waitpoints",
    "events",
    "message_keys",
    "devices",
    "hub_events",
    "device_waits",
    "timers",
    "device_wait_due",
];

const HEADER: usize = 16;

/// Every property of one journal file.
pub fn check(bytes: &[u8]) -> Result<(), String> {
    let tmp = tempfile::tempdir().map_err(|e| format!("setup: a temp dir: {e}"))?;
    let dir = tmp.path();
    let journal = dir.join("hub.journal");
    std::fs::write(&journal, bytes).map_err(|e| format!("setup: {e}"))?;
    scans(&journal, bytes)?;
    // A fresh store with this journal beside it: replayed, or refused with a reason.
    match Store::open(&dir.join("hub.redb"), Settings::default()) {
        Ok((store, guard)) => {
            drop(store);
            guard.join();
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    // The operator's way out: recovery keeps what it can read.
    let again = dir.join("again");
    std::fs::create_dir(&again).map_err(|e| format!("setup: {e}"))?;
    std::fs::write(again.join("hub.journal"), bytes).map_err(|e| format!("setup: {e}"))?;
    match Store::recover_journal(&again.join("hub.redb"), Settings::default()) {
        Ok(r) => {
            let expected = salvage_ref(bytes).1;
            if r.unreadable_bytes != expected {
                return Err(format!(
                    "recovery counts {} unreadable bytes, the format says {expected}",
                    r.unreadable_bytes
                ));
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    Ok(())
}

/// `Journal::open`'s scan and `Journal::salvage` against the reference reader.
fn scans(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let (found, _) = Journal::salvage(path).map_err(|e| format!("salvage: {e}"))?;
    let (want, unreadable) = salvage_ref(bytes);
    if found != want {
        return Err(format!(
            "salvage found records {:?}, the format says {:?}",
            seqs(&found),
            seqs(&want)
        ));
    }
    let (j, records) = Journal::open(path, 1 << 20).map_err(|e| format!("open: {e}"))?;
    let want = scan_ref(bytes);
    if records != want {
        return Err(format!(
            "the scan found records {:?}, the format says {:?}",
            seqs(&records),
            seqs(&want)
        ));
    }
    if j.last_seq() != want.last().map_or(0, |r| r.seq) {
        return Err(format!("last_seq {} after {:?}", j.last_seq(), seqs(&want)));
    }
    let _ = unreadable;
    Ok(())
}

fn seqs(r: &[Record]) -> Vec<u64> {
    r.iter().map(|r| r.seq).collect()
}

/// One record at the start of `b`, as the format defines it.
fn parse_ref(b: &[u8]) -> Option<(Record, usize)> {
    let len = u32::from_le_bytes(b.get(0..4)?.try_into().ok()?) as usize;
    if len == 0 || len > MAX_RECORD {
        return None;
    }
    let crc = u32::from_le_bytes(b.get(4..8)?.try_into().ok()?);
    let seq = b.get(8..HEADER)?;
    let payload = b.get(HEADER..HEADER.checked_add(len)?)?;
    if crc32c(&[seq, payload]) != crc {
        return None;
    }
    let seq = u64::from_le_bytes(seq.try_into().ok()?);
    Some((
        Record {
            seq,
            payload: payload.to_vec(),
        },
        HEADER + len,
    ))
}

/// The scan at open: from the start, while records parse and number one after another.
fn scan_ref(b: &[u8]) -> Vec<Record> {
    let mut out: Vec<Record> = Vec::new();
    let mut at = 0;
    while let Some((r, size)) = parse_ref(&b[at..]) {
        if out
            .last()
            .is_some_and(|l| l.seq.checked_add(1) != Some(r.seq))
        {
            break;
        }
        out.push(r);
        at += size;
    }
    out
}

/// Salvage: every record anywhere, and the non-zero bytes between them.
fn salvage_ref(b: &[u8]) -> (Vec<Record>, u64) {
    let (mut out, mut unreadable, mut at) = (Vec::new(), 0, 0);
    while at < b.len() {
        if let Some((r, size)) = parse_ref(&b[at..]) {
            out.push(r);
            at += size;
        } else {
            unreadable += u64::from(b[at] != 0);
            at += 1;
        }
    }
    (out, unreadable)
}

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit: slow and obviously
/// right, an independent check of the journal's table-driven one.
pub fn crc32c(parts: &[&[u8]]) -> u32 {
    let mut crc = !0u32;
    for b in parts.iter().flat_map(|p| p.iter()) {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// One record in the file's format.
pub fn record(seq: u64, payload: &[u8]) -> Vec<u8> {
    let seq = seq.to_le_bytes();
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c(&[&seq, payload]).to_le_bytes());
    out.extend_from_slice(&seq);
    out.extend_from_slice(payload);
    out
}

/// One change: table name, key, new value (`None`: removed).
pub type Change = (String, Vec<u8>, Option<Vec<u8>>);

/// A change record's payload; `count` is normally `changes.len()`.
pub fn change_record(count: u32, changes: &[Change]) -> Vec<u8> {
    let mut out = vec![0xC1];
    out.extend_from_slice(&count.to_le_bytes());
    for (name, key, value) in changes {
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(key);
        match value {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                out.extend_from_slice(v);
            }
        }
    }
    out
}

/// A journal as records (number, payload), then byte mutations of the whole file.
#[derive(Debug, Clone)]
pub struct Case {
    pub records: Vec<(u64, Vec<u8>)>,
    pub zeros: usize,
    pub mutations: Vec<Mutation>,
}

impl Case {
    pub fn bytes(&self) -> Vec<u8> {
        let mut b: Vec<u8> = self
            .records
            .iter()
            .flat_map(|(seq, p)| record(*seq, p))
            .collect();
        // The file grows in zero-filled steps: a real one ends in zeros.
        b.resize(b.len() + self.zeros, 0);
        driver::mutate(&b, &self.mutations)
    }
}

/// Keys and values of the widths the tables use (8-byte numbers, short strings,
/// tuples) and of the wrong widths.
fn blob() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => any::<u64>().prop_map(|n| n.to_le_bytes().to_vec()),
        3 => "[a-z_0-9]{0,12}".prop_map(String::into_bytes),
        2 => proptest::collection::vec(any::<u8>(), 0..24),
        1 => ("[a-z_0-9]{0,8}", any::<u64>()).prop_map(|(s, n)| {
            // A (str, u64) tuple as a length-prefixed string, then the number.
            let mut b = (s.len() as u32).to_le_bytes().to_vec();
            b.extend_from_slice(s.as_bytes());
            b.extend_from_slice(&n.to_le_bytes());
            b
        }),
        1 => Just(Vec::new()),
    ]
}

fn change() -> impl Strategy<Value = Change> {
    let name = prop_oneof![
        8 => proptest::sample::select(TABLES.to_vec()).prop_map(str::to_owned),
        1 => "[a-z_]{0,12}",
    ];
    (name, blob(), proptest::option::of(blob()))
}

fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => proptest::collection::vec(change(), 0..6)
            .prop_map(|c| change_record(c.len() as u32, &c)),
        1 => (proptest::collection::vec(change(), 0..3), any::<u32>())
            .prop_map(|(c, n)| change_record(n, &c)),
        // Operation records older hubs wrote (MessagePack), as bytes.
        2 => proptest::collection::vec(any::<u8>(), 1..64),
        1 => proptest::collection::vec(change(), 1..3).prop_map(|c| {
            let mut p = change_record(c.len() as u32, &c);
            p.push(0);
            p
        }),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    // Mostly numbered one after another from 1 (a fresh store has checkpointed none).
    let step = prop_oneof![12 => Just(1u64), 1 => Just(0u64), 1 => Just(2u64), 1 => any::<u64>()];
    (
        proptest::collection::vec((step, payload()), 0..6),
        prop_oneof![Just(0usize), 0..64usize],
        proptest::collection::vec(driver::mutation(), 0..3),
    )
        .prop_map(|(recs, zeros, mutations)| {
            let mut seq = 0u64;
            let records = recs
                .into_iter()
                .map(|(step, p)| {
                    seq = seq.wrapping_add(step);
                    (seq, p)
                })
                .collect();
            Case {
                records,
                zeros,
                mutations,
            }
        })
}

/// Valid journals: one signal-sized change record, a few in a row, an empty file.
pub fn seeds() -> Vec<Vec<u8>> {
    let one = change_record(
        2,
        &[
            ("devices".into(), b"gpu1".to_vec(), Some(b"{}".to_vec())),
            ("hub_events".into(), 7u64.to_le_bytes().to_vec(), None),
        ],
    );
    let mut three = record(1, &one);
    three.extend(record(2, &change_record(0, &[])));
    three.extend(record(3, &one));
    three.resize(three.len() + 32, 0);
    vec![record(1, &one), three, Vec::new()]
}

pub fn strategy() -> impl Strategy<Value = Case> {
    let mutated = driver::mutated(driver::corpus_inputs(TARGET.name), seeds()).prop_map(|b| Case {
        // Stored as one opaque "record" would re-frame it: keep the bytes as they are.
        records: Vec::new(),
        zeros: 0,
        mutations: vec![Mutation::Insert(0, b)],
    });
    prop_oneof![
        6 => case(),
        3 => mutated,
        1 => proptest::collection::vec(any::<u8>(), 0..128).prop_map(|b| Case {
            records: Vec::new(),
            zeros: 0,
            mutations: vec![Mutation::Insert(0, b)],
        }),
    ]
}

fn fuzz(budget: Budget, known: Vec<String>) -> Outcome {
    driver::fuzz(
        TARGET.name,
        strategy(),
        |c| check(&c.bytes()),
        Case::bytes,
        budget,
        known,
    )
}
