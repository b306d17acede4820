//! redb's file, with a checkpoint's writeback paced in small steps.
//!
//! A checkpoint commits megabytes into redb and then syncs them. Synced at once, they
//! reach the disk's queue together, and the journal's small write (an acknowledgement
//! waiting on it) queues behind all of them: it took 3-8 ms instead of about 0.15 ms
//! while a checkpoint was syncing. [`PacedFile`] keeps track of what redb wrote since its
//! last sync and, when redb syncs, first makes those bytes durable [`STEP`] bytes at a
//! time, each step waiting for its own completion. The journal's writes then wait behind
//! one step at most; the final `fdatasync` finds little left to do.
//!
//! A step is a ranged sync: the bytes are read back from the page cache and written again,
//! unchanged, through a second descriptor opened with `O_DSYNC`, whose every write returns
//! once its range (and only its range) is durable. The stable API has no other ranged
//! sync without `unsafe`. Correctness never depends on the steps: redb's own `fdatasync`
//! still follows them. Locking (one process per database) is redb's own file backend's.

use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Bound;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// How many bytes one step of writeback makes durable before the next starts.
pub const STEP: u64 = 256 << 10;

/// redb's file backend with paced writeback (see the module docs).
#[derive(Debug)]
pub struct PacedFile {
    inner: FileBackend,
    /// The same file, opened `O_DSYNC`: each write is a sync of its own range.
    dsync: File,
    /// Byte ranges `(start, end)` written since the last sync. Also held across each step's
    /// read-back and rewrite, so no write of redb's can land in between.
    dirty: Mutex<Vec<(u64, u64)>>,
}

impl PacedFile {
    /// Opens (creating with mode 0600) the database file at `path`.
    pub fn open(path: &Path) -> io::Result<PacedFile> {
        let file = super::journal::open_private(path)?;
        let dsync = OpenOptions::new()
            .write(true)
            .custom_flags(rustix::fs::OFlags::DSYNC.bits() as i32)
            .open(path)?;
        let inner = FileBackend::new(file).map_err(io::Error::other)?;
        Ok(PacedFile {
            inner,
            dsync,
            dirty: Mutex::new(Vec::new()),
        })
    }

    /// Makes the ranges written since the last sync durable, [`STEP`] bytes at a time.
    fn pace(&self) -> io::Result<()> {
        let mut ranges = std::mem::take(&mut *self.lock());
        ranges.sort_unstable();
        let mut buf = Vec::new();
        for (start, end) in merge(ranges) {
            let mut at = start;
            while at < end {
                let len = (end - at).min(STEP);
                buf.resize(len as usize, 0);
                let _held = self.lock();
                self.inner.read(at, &mut buf)?;
                self.dsync.write_all_at(&buf, at)?;
                at += len;
            }
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u64, u64)>> {
        self.dirty.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Opens (or creates, mode 0600) the redb database at `path` on a [`PacedFile`].
/// After a stop that was not clean redb repairs the file before it opens (its allocator
/// state is rebuilt from every page), which on a large store takes long: that is said,
/// with how far it is, at most every 2 s and at the end.
pub fn open_database(path: &Path) -> Result<redb::Database, redb::DatabaseError> {
    let started = std::time::Instant::now();
    let said = std::sync::Mutex::new(None::<std::time::Instant>);
    let db = redb::Database::builder()
        .set_cache_size(CACHE_BYTES)
        .set_repair_callback(move |session| {
            let mut last = said.lock().unwrap_or_else(PoisonError::into_inner);
            let now = std::time::Instant::now();
            if last.is_none_or(|t| now.duration_since(t) >= std::time::Duration::from_secs(2)) {
                *last = Some(now);
                tracing::warn!(
                    progress_pct = (session.progress() * 100.0).round() as u64,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "repairing the store after a stop that was not clean (redb checks every page); no connection is accepted until it is open"
                );
            }
        })
        .create_with_backend(PacedFile::open(path)?)?;
    Ok(db)
}

/// redb's page cache. Its default (1 GiB) keeps every page a checkpoint wrote resident, so
/// the hub's memory grew with all it ever stored (10,000 idle sessions: +70 MiB). The hot
/// state is in the writer's layers and the journal; the cache only spares re-reading
/// pages the kernel's page cache holds anyway.
const CACHE_BYTES: usize = 16 << 20;

/// Sorted ranges, with overlapping and touching ones joined.
fn merge(sorted: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(sorted.len());
    for (s, e) in sorted {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

impl StorageBackend for PacedFile {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut dirty = self.lock();
        dirty.retain_mut(|r| {
            r.1 = r.1.min(len);
            r.0 < r.1
        });
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        // A failed step leaves the rest to the full sync, which then reports the error.
        if let Err(e) = self.pace() {
            tracing::debug!(error = %e, "a paced writeback step failed; syncing the whole file");
        }
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut dirty = self.lock();
        self.inner.write(offset, data)?;
        if !data.is_empty() {
            dirty.push((offset, offset + data.len() as u64));
        }
        Ok(())
    }

    fn close(&self) -> io::Result<()> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{Database, ReadableDatabase, TableDefinition};

    const T: TableDefinition<u64, &[u8]> = TableDefinition::new("t");

    #[test]
    fn merge_joins_overlapping_and_touching_ranges() {
        assert_eq!(
            merge(vec![(0, 4), (2, 6), (6, 8), (10, 12), (11, 11)]),
            vec![(0, 8), (10, 12)]
        );
        assert_eq!(merge(vec![]), vec![]);
    }

    #[test]
    fn a_database_on_it_keeps_every_commit_across_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db.redb");
        let big = vec![7u8; 3 * STEP as usize / 2];
        {
            let db = Database::builder()
                .create_with_backend(PacedFile::open(&path).expect("open"))
                .expect("create");
            for i in 0..20u64 {
                let w = db.begin_write().expect("write");
                w.open_table(T)
                    .expect("table")
                    .insert(i, big.as_slice())
                    .expect("insert");
                w.commit().expect("commit");
            }
        }
        let mode = std::fs::metadata(&path).expect("stat");
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
        let db = Database::builder()
            .create_with_backend(PacedFile::open(&path).expect("open"))
            .expect("reopen");
        let r = db.begin_read().expect("read");
        let t = r.open_table(T).expect("table");
        for i in 0..20u64 {
            assert_eq!(t.get(i).expect("get").expect("present").value(), &big[..]);
        }
    }

    #[test]
    fn a_second_open_of_the_same_file_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db.redb");
        let _db = Database::builder()
            .create_with_backend(PacedFile::open(&path).expect("open"))
            .expect("create");
        let again = Database::builder().create_with_backend(PacedFile::open(&path).expect("open"));
        assert!(again.is_err(), "redb's lock must still hold");
    }

    #[test]
    fn a_sync_paces_what_was_written_and_forgets_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = PacedFile::open(&dir.path().join("f")).expect("open");
        f.set_len(4 * STEP).expect("len");
        f.write(0, &vec![1u8; (2 * STEP + 10) as usize])
            .expect("write");
        f.write(3 * STEP, b"tail").expect("write");
        assert_eq!(f.lock().len(), 2);
        f.sync_data().expect("sync");
        assert!(f.lock().is_empty());
        let mut back = vec![0u8; 4];
        f.read(3 * STEP, &mut back).expect("read");
        assert_eq!(&back, b"tail");
        // A shrink forgets what lies beyond the new end.
        f.write(3 * STEP, b"more").expect("write");
        f.set_len(STEP).expect("shrink");
        assert!(f.lock().is_empty());
    }
}
