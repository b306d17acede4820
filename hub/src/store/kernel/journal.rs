//! The acknowledgement journal: an append-only file of change records (each batch's keys
//! and new values, see `delta.rs`) that were acknowledged but are not yet in a redb
//! checkpoint.
//!
//! A redb commit rewrites scattered pages and syncs them; appending one record to a file
//! whose blocks are already allocated, then `fdatasync`, is one small sequential write.
//! The writer appends a batch's record here, syncs, and only then answers. Checkpoints
//! write the changes into redb later, in bulk, and each stores the sequence number of the
//! newest record it holds; the file is then reused from its start.
//!
//! Record: `len u32 LE | crc32c u32 LE | seq u64 LE | payload (len bytes)`, the CRC over
//! `seq | payload`. Sequence numbers never repeat and grow by one. A scan reads from the
//! start and stops at the first record that is torn, zero, or not the next number, so a
//! record left over from before a rewind (its number is lower) ends the scan.
//!
//! The file grows in zero-filled steps and never shrinks: once written, rewriting a block
//! changes no file metadata, so `fdatasync` flushes data only.
//!
//! Records that were written but must not count (their sync failed, or the batch they
//! belong to failed) are erased: overwritten with zeros and synced, so no scan finds them.
//! If even that fails, the caller must stop taking writes: a restart could replay them.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
#[cfg(test)]
use std::sync::Arc;
#[cfg(test)]
use std::sync::atomic::{AtomicU32, Ordering};

/// The file grows by this much at a time, with zeros.
const GROW: u64 = 1 << 20;
/// No record is larger: one batch's changes (a signal body is capped at 64 KB, but one
/// operation may change many keys, e.g. a deleted session's whole log).
pub const MAX_RECORD: usize = 64 << 20;
const HEADER: usize = 16;

/// The journal file, positioned after its newest record.
pub struct Journal {
    file: File,
    /// Where the next record goes.
    end: u64,
    /// The file's length: every byte below it was written, so overwriting needs no
    /// metadata change.
    len: u64,
    /// The newest record's number, or the number a rewind was given.
    last_seq: u64,
    /// Past this size the caller commits to redb and rewinds instead of appending.
    cap: u64,
    buf: Vec<u8>,
    /// What the scan at open found past its end that it should not have.
    damage: Option<Damage>,
    /// Test only: this many next flushes fail.
    #[cfg(test)]
    fail: Arc<AtomicU32>,
}

/// Where the journal stood before a write: what [`Journal::erase`] goes back to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    end: u64,
    last_seq: u64,
}

/// Why records could not be journaled.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Nothing of the failed write can be found by a scan.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The write failed and its records could not be erased: a scan (a restart) may find
    /// them although nobody was told they counted.
    #[error("{source}; its records could not be erased either ({erase})")]
    Unerased { source: io::Error, erase: io::Error },
}

impl JournalError {
    /// A write or flush failed with `source`; `erased` is how erasing what it wrote went.
    fn after(source: io::Error, erased: io::Result<()>) -> JournalError {
        match erased {
            Ok(()) => JournalError::Io(source),
            Err(erase) => JournalError::Unerased { source, erase },
        }
    }
}

/// Records found past the point where a scan stopped, numbered after the last one it
/// read: the scan stopped at damage in the middle, not at the end a crash leaves (a torn
/// last record, or the older pass a rewind left behind, whose numbers are lower).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// Where the scan stopped.
    pub at: u64,
    /// The last record it read (0: none).
    pub last_good: u64,
    /// The numbers of the readable records beyond.
    pub beyond: Vec<u64>,
}

/// A record read back by a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub payload: Vec<u8>,
}

impl Journal {
    /// Opens (or creates, mode 0600) the journal at `path` and reads its records. The
    /// journal is positioned after them; the caller replays what its store lacks, commits,
    /// and calls [`Journal::rewind`].
    pub fn open(path: &Path, cap: u64) -> io::Result<(Journal, Vec<Record>)> {
        let file = open_private(path)?;
        let len = file.metadata()?.len();
        let mut j = Journal {
            #[cfg(test)]
            fail: Arc::new(AtomicU32::new(0)),
            file,
            end: 0,
            len,
            last_seq: 0,
            cap: cap.max(GROW),
            buf: Vec::new(),
            damage: None,
        };
        let (records, end) = j.scan()?;
        j.end = end;
        j.last_seq = records.last().map_or(0, |r| r.seq);
        let beyond: Vec<u64> = readable(&j.read_all()?, end as usize)
            .into_iter()
            .map(|r| r.seq)
            .filter(|s| *s > j.last_seq)
            .collect();
        if !beyond.is_empty() {
            j.damage = Some(Damage {
                at: end,
                last_good: j.last_seq,
                beyond,
            });
        }
        Ok((j, records))
    }

    /// What the scan at open found beyond its end (see [`Damage`]).
    pub fn damage(&self) -> Option<&Damage> {
        self.damage.as_ref()
    }

    /// Every record readable anywhere in the file at `path`, whatever lies between them
    /// (for a recovery after damage), and the bytes that held none.
    pub fn salvage(path: &Path) -> io::Result<(Vec<Record>, u64)> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
            Err(e) => return Err(e),
        };
        let mut found = Vec::new();
        let mut unreadable = 0u64;
        let mut at = 0;
        while at < bytes.len() {
            match parse(&bytes[at..]) {
                Some((rec, size)) => {
                    found.push(rec);
                    at += size;
                }
                None => {
                    unreadable += u64::from(bytes[at] != 0);
                    at += 1;
                }
            }
        }
        Ok((found, unreadable))
    }

    fn read_all(&self) -> io::Result<Vec<u8>> {
        let len = usize::try_from(self.len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "journal too large"))?;
        let mut bytes = vec![0u8; len];
        self.file.read_exact_at(&mut bytes, 0)?;
        Ok(bytes)
    }

    /// Reads the records from the start of the file. Returns them and where they end.
    pub fn scan(&self) -> io::Result<(Vec<Record>, u64)> {
        let bytes = self.read_all()?;
        let mut records = Vec::new();
        let mut at = 0usize;
        let mut expected: Option<u64> = None;
        while let Some((rec, size)) = parse(&bytes[at..]) {
            if expected.is_some_and(|e| e != rec.seq) {
                break;
            }
            expected = rec.seq.checked_add(1);
            records.push(rec);
            at += size;
        }
        Ok((records, at as u64))
    }

    /// The newest record's number (or the rewind's).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Starts over at the beginning of the file: everything written so far is in a redb
    /// commit that stored `last_seq`, and the next record is `last_seq + 1`.
    pub fn rewind(&mut self, last_seq: u64) {
        self.end = 0;
        self.last_seq = last_seq;
    }

    /// Bytes written since the last rewind.
    pub fn used(&self) -> u64 {
        self.end
    }

    /// Whether records of these payload sizes fit before the cap.
    pub fn fits(&self, payload_bytes: usize, records: usize) -> bool {
        self.end + (payload_bytes + records * HEADER) as u64 <= self.cap
    }

    /// Appends one record per payload, numbered on from [`Journal::last_seq`], and syncs
    /// the data. Returns the newest number. On error nothing written counts: the records
    /// are erased (see [`JournalError`]) and the journal stays where it was.
    pub fn append<'a>(
        &mut self,
        payloads: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<u64, JournalError> {
        let mark = self.mark();
        let seq = self.write(payloads)?;
        let started = std::time::Instant::now();
        if let Err(source) = self.sync() {
            return Err(JournalError::after(source, self.erase(mark)));
        }
        crate::metrics::metrics().fsync(started.elapsed().as_secs_f64());
        Ok(seq)
    }

    /// Where the journal stands now.
    pub fn mark(&self) -> Mark {
        Mark {
            end: self.end,
            last_seq: self.last_seq,
        }
    }

    /// Writes one record per payload, numbered on from [`Journal::last_seq`], without
    /// syncing: they count only once a [`Journal::sync`] after this returned
    /// succeeds. Returns the newest number. A failed write is erased before it returns.
    pub fn write<'a>(
        &mut self,
        payloads: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<u64, JournalError> {
        self.buf.clear();
        let mut seq = self.last_seq;
        for p in payloads {
            if p.is_empty() || p.len() > MAX_RECORD {
                return Err(JournalError::Io(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("a journal record of {} bytes", p.len()),
                )));
            }
            seq += 1;
            encode(&mut self.buf, seq, p);
        }
        if self.buf.is_empty() {
            return Ok(self.last_seq);
        }
        let new_end = self.end + self.buf.len() as u64;
        if new_end > self.len {
            // Zero-fill the next step, so the step after this write is already allocated
            // and an overwrite on a later pass changes no metadata. (A failure here wrote
            // zeros at most: nothing to erase.)
            let target = new_end.div_ceil(GROW) * GROW;
            let zeros = vec![0u8; (target - self.len) as usize];
            self.file.write_all_at(&zeros, self.len)?;
            self.len = target;
        }
        if let Err(source) = self.file.write_all_at(&self.buf, self.end) {
            // Part of it may be there, and may even reach the disk on its own.
            let erased = self.zero(self.end, self.buf.len() as u64);
            return Err(JournalError::after(source, erased));
        }
        self.end = new_end;
        self.last_seq = seq;
        Ok(seq)
    }

    /// Flushes what was written.
    pub fn sync(&self) -> io::Result<()> {
        #[cfg(test)]
        if self
            .fail
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(io::Error::other("injected flush failure"));
        }
        self.file.sync_data()
    }

    /// Starts writing what was written since `mark` to the disk, without waiting for it
    /// (`posix_fadvise(POSIX_FADV_DONTNEED)`, which starts the range's writeback; partial
    /// pages, where the next records go, stay cached). A [`Journal::sync`] after it then
    /// finds the data on its way and mostly waits for the disk's flush: the writer does
    /// its work in between. Only a head start: durability still comes from the sync.
    pub fn start_writeback(&self, mark: Mark) {
        let len = self.end.saturating_sub(mark.end);
        if let Some(len) = std::num::NonZeroU64::new(len)
            && let Err(e) = rustix::fs::fadvise(
                &self.file,
                mark.end,
                Some(len),
                rustix::fs::Advice::DontNeed,
            )
        {
            tracing::debug!(error = %e, "cannot start the journal's writeback early");
        }
    }

    /// Forgets every record written after `mark`: overwritten with zeros and synced, so no
    /// scan finds them; the next write goes there again.
    pub fn erase(&mut self, mark: Mark) -> io::Result<()> {
        if self.end > mark.end {
            self.zero(mark.end, self.end - mark.end)?;
        }
        self.end = mark.end;
        self.last_seq = mark.last_seq;
        Ok(())
    }

    /// Overwrites `len` bytes at `at` with zeros and syncs them.
    fn zero(&self, at: u64, len: u64) -> io::Result<()> {
        self.file.write_all_at(&vec![0u8; len as usize], at)?;
        self.sync()
    }

    /// Test only: the next `n` flushes fail.
    #[cfg(test)]
    pub fn fail_next_syncs(&self, n: u32) {
        self.fail.store(n, Ordering::Release);
    }

    /// Test only: the counter behind [`Journal::fail_next_syncs`].
    #[cfg(test)]
    pub fn fail_handle(&self) -> Arc<AtomicU32> {
        self.fail.clone()
    }
}

/// Opens `path` for reading and writing, creating it with mode 0600 (the store's files
/// are the hub's alone) and keeping what it holds.
pub fn open_private(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
}

fn encode(buf: &mut Vec<u8>, seq: u64, payload: &[u8]) {
    let seq_bytes = seq.to_le_bytes();
    let crc = crc32c::crc32c_append(crc32c::crc32c(&seq_bytes), payload);
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&crc.to_le_bytes());
    buf.extend_from_slice(&seq_bytes);
    buf.extend_from_slice(payload);
}

/// Every record readable in `b` from `from` on, looking at every offset (a damaged
/// record's length cannot be trusted), in file order.
fn readable(b: &[u8], from: usize) -> Vec<Record> {
    let mut out = Vec::new();
    let mut at = from;
    while at + HEADER <= b.len() {
        match parse(&b[at..]) {
            Some((rec, size)) => {
                out.push(rec);
                at += size;
            }
            None => at += 1,
        }
    }
    out
}

/// One record at the start of `b`, with its size; `None` if there is none (zeros, torn,
/// or damaged).
fn parse(b: &[u8]) -> Option<(Record, usize)> {
    let len = u32::from_le_bytes(b.get(0..4)?.try_into().ok()?) as usize;
    if len == 0 || len > MAX_RECORD {
        return None;
    }
    let crc = u32::from_le_bytes(b.get(4..8)?.try_into().ok()?);
    let seq_bytes: [u8; 8] = b.get(8..16)?.try_into().ok()?;
    let payload = b.get(HEADER..HEADER + len)?;
    if crc32c::crc32c_append(crc32c::crc32c(&seq_bytes), payload) != crc {
        return None;
    }
    Some((
        Record {
            seq: u64::from_le_bytes(seq_bytes),
            payload: payload.to_vec(),
        },
        HEADER + len,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payloads(n: usize, tag: &str) -> Vec<Vec<u8>> {
        (0..n).map(|i| format!("{tag}-{i}").into_bytes()).collect()
    }

    /// A new journal (1 MiB cap) in a temp dir: the dir (kept alive), its path, the journal.
    fn fresh() -> (tempfile::TempDir, std::path::PathBuf, Journal) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("j");
        let (j, found) = Journal::open(&path, 1 << 20).expect("open");
        assert!(found.is_empty());
        (dir, path, j)
    }

    /// The journal at `path` opened again, with the records a scan finds.
    fn reopen(path: &Path) -> (Journal, Vec<Record>) {
        Journal::open(path, 1 << 20).expect("reopen")
    }

    #[test]
    fn crc32c_check_value() {
        // The standard check value of CRC-32C over "123456789".
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn records_come_back_in_order_after_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("j");
        let (mut j, found) = Journal::open(&path, 1 << 20).expect("open");
        assert!(found.is_empty());
        let p = payloads(3, "a");
        assert_eq!(j.append(p.iter().map(Vec::as_slice)).expect("append"), 3);
        assert_eq!(j.append([b"one more".as_slice()]).expect("append"), 4);
        drop(j);
        let (j, found) = reopen(&path);
        let seqs: Vec<u64> = found.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [1, 2, 3, 4]);
        assert_eq!(found[3].payload, b"one more");
        assert_eq!(j.last_seq(), 4);
        // The file grew in a zero-filled step, not record by record.
        assert_eq!(std::fs::metadata(&path).expect("stat").len(), GROW);
    }

    #[test]
    fn a_rewind_hides_the_older_pass() {
        let (_dir, path, mut j) = fresh();
        let p = payloads(10, "old");
        j.append(p.iter().map(Vec::as_slice)).expect("append");
        j.rewind(10);
        // Nothing written after the rewind: the old records are numbered 1..=10, all at or
        // below the mark the caller keeps, so a scan returns them and the caller skips them.
        let (records, _) = j.scan().expect("scan");
        assert_eq!(records.len(), 10);
        // Two new records overwrite the first two; the scan stops where the old pass
        // continues, since its next number (3) is not 13.
        let q = payloads(2, "new");
        assert_eq!(j.append(q.iter().map(Vec::as_slice)).expect("append"), 12);
        drop(j);
        let (j, found) = reopen(&path);
        assert_eq!(found.iter().map(|r| r.seq).collect::<Vec<_>>(), [11, 12]);
        assert_eq!(found[0].payload, b"new-0");
        assert_eq!(j.last_seq(), 12);
    }

    #[test]
    fn a_torn_or_damaged_record_ends_the_scan() {
        let (_dir, path, mut j) = fresh();
        let p = payloads(3, "x");
        j.append(p.iter().map(Vec::as_slice)).expect("append");
        let second_at = (HEADER + p[0].len()) as u64;
        let third_at = second_at + (HEADER + p[1].len()) as u64;
        drop(j);
        // Damage one byte of the third record's payload: the first two survive.
        let f = OpenOptions::new().write(true).open(&path).expect("open rw");
        f.write_all_at(b"?", third_at + HEADER as u64)
            .expect("damage");
        let (_, found) = reopen(&path);
        assert_eq!(found.len(), 2);
        // A torn header (half a length) on the second: only the first survives.
        f.write_all_at(&[0xff, 0xff], second_at).expect("tear");
        let (j, found) = reopen(&path);
        assert_eq!(found.len(), 1);
        assert_eq!(
            j.used(),
            second_at,
            "the next record overwrites the torn one"
        );
    }

    #[test]
    fn damage_in_the_middle_is_told_from_a_torn_end() {
        let (_dir, path, mut j) = fresh();
        let p = payloads(5, "x");
        j.append(p.iter().map(Vec::as_slice)).expect("append");
        let second_at = (HEADER + p[0].len()) as u64;
        drop(j);
        let (j, _) = reopen(&path);
        assert_eq!(j.damage(), None, "a clean journal");
        // The last record torn (a crash): an end, not damage.
        let last_at = second_at + 3 * (HEADER + p[1].len()) as u64;
        let f = OpenOptions::new().write(true).open(&path).expect("open rw");
        f.write_all_at(&[0xee; 3], last_at + HEADER as u64)
            .expect("tear");
        let (j, found) = reopen(&path);
        assert_eq!((found.len(), j.damage()), (4, None));
        // One byte flipped in the second: the third and fourth are still readable beyond.
        f.write_all_at(b"?", second_at + HEADER as u64)
            .expect("flip");
        let (j, found) = reopen(&path);
        assert_eq!(found.len(), 1);
        assert_eq!(
            j.damage(),
            Some(&Damage {
                at: second_at,
                last_good: 1,
                beyond: vec![3, 4],
            })
        );
        // A salvage keeps every readable record and counts the bytes it could not read.
        let (all, unreadable) = Journal::salvage(&path).expect("salvage");
        assert_eq!(all.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 3, 4]);
        assert!(unreadable >= 3, "the damaged record's bytes: {unreadable}");
    }

    #[test]
    fn erased_records_are_never_found() {
        let (_dir, path, mut j) = fresh();
        let p = payloads(2, "kept");
        j.append(p.iter().map(Vec::as_slice)).expect("append");
        let mark = j.mark();
        let q = payloads(3, "gone");
        assert_eq!(j.write(q.iter().map(Vec::as_slice)).expect("write"), 5);
        j.sync().expect("sync");
        j.erase(mark).expect("erase");
        assert_eq!((j.last_seq(), j.mark()), (2, mark));
        let (found, _) = j.scan().expect("scan");
        assert_eq!(found.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2]);
        // The next write takes the erased numbers and place again.
        assert_eq!(j.append([b"next".as_slice()]).expect("append"), 3);
        drop(j);
        let (_, found) = reopen(&path);
        assert_eq!(found.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(found[2].payload, b"next");
    }

    #[test]
    fn a_failed_flush_leaves_nothing_a_scan_would_count() {
        let (_dir, path, mut j) = fresh();
        j.append([b"acked".as_slice()]).expect("append");
        j.fail_next_syncs(1);
        let e = j
            .append([b"not acked".as_slice()])
            .expect_err("the flush fails");
        assert!(matches!(e, JournalError::Io(_)), "{e}");
        assert_eq!(j.last_seq(), 1);
        drop(j);
        let (mut j, found) = reopen(&path);
        assert_eq!(found.len(), 1, "the unacknowledged record was erased");
        // When erasing cannot be made durable either, the caller is told so.
        j.fail_next_syncs(2);
        let e = j
            .append([b"stuck".as_slice()])
            .expect_err("both flushes fail");
        assert!(matches!(e, JournalError::Unerased { .. }), "{e}");
    }

    #[test]
    fn a_head_start_on_the_writeback_changes_nothing_but_time() {
        let (_dir, path, mut j) = fresh();
        // Small records and a batch over a page: all read back, the partial page too.
        for round in 0..3 {
            let mark = j.mark();
            let p = payloads(if round == 1 { 60 } else { 3 }, &format!("r{round}"));
            j.write(p.iter().map(Vec::as_slice)).expect("write");
            j.start_writeback(mark);
            j.sync().expect("sync");
        }
        drop(j);
        let (j, found) = reopen(&path);
        assert_eq!(found.len(), 66);
        assert_eq!(j.last_seq(), 66);
        assert_eq!(found[65].payload, b"r2-2");
    }

    #[test]
    fn fits_and_bad_payloads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut j, _) = Journal::open(&dir.path().join("j"), GROW).expect("open");
        assert!(j.fits(GROW as usize - HEADER, 1));
        assert!(!j.fits(GROW as usize, 1));
        assert!(j.append([b"".as_slice()]).is_err());
        assert_eq!(j.last_seq(), 0, "a refused append numbers nothing");
        assert_eq!(j.append(std::iter::empty()).expect("nothing"), 0);
    }
}
