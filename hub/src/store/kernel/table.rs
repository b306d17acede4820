//! Tables as the kernel sees them: registered by name and position, stored in redb, and
//! changed in memory first.
//!
//! A domain declares each of its tables as a [`TableSpec`] (a redb table definition and
//! its position in the hub's list) and lists it in the registry the store opens with.
//! Operations read and write through a typed [`Table`] facade; underneath, a table is the
//! last checkpoint's redb snapshot plus two layers of changes kept in memory (the
//! [`Overlay`]s): the one being checkpointed (frozen) and the current one. A read looks
//! at the current layer, then the frozen one, then the snapshot; a range merges the three
//! in key order. Keys are compared exactly as redb compares them ([`redb::Key::compare`]),
//! so a range over the layers sees the order redb will store.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use redb::{Key, ReadTransaction, ReadableTableMetadata, TableDefinition, Value};

use super::error::StoreError;
use super::ordered::Ordered;

/// A table of the hub: its redb definition and its position in the registry.
pub struct TableSpec<K: Key + 'static, V: Value + 'static> {
    pub index: usize,
    pub name: &'static str,
    pub def: TableDefinition<'static, K, V>,
}

impl<K: Key + 'static, V: Value + 'static> TableSpec<K, V> {
    pub const fn new(index: usize, name: &'static str) -> Self {
        TableSpec {
            index,
            name,
            def: TableDefinition::new(name),
        }
    }
}

/// A registered table without its types: what the kernel needs to open, compare and
/// checkpoint it.
pub trait AnyTable: Sync {
    fn index(&self) -> usize;
    fn name(&self) -> &'static str;
    fn compare(&self) -> fn(&[u8], &[u8]) -> Ordering;
    /// A key's bytes in an encoding whose byte order is [`AnyTable::compare`]'s order
    /// (what a backend comparing bytes stores: [`super::ordered`]).
    fn order(&self) -> fn(&[u8]) -> Vec<u8>;
    /// Creates the table if it is missing.
    fn create(&self, wtx: &redb::WriteTransaction) -> Result<(), StoreError>;
    /// Opens it in a read snapshot.
    fn open(&self, rtx: &ReadTransaction) -> Result<Box<dyn SnapTable>, StoreError>;
    /// Writes `changes` into redb.
    fn apply(&self, wtx: &redb::WriteTransaction, changes: &Changes) -> Result<(), StoreError>;
    /// Whether `key` (and `value`, if any) are well-formed for this table's types: what a
    /// journal record holds is read back only if they are.
    fn valid(&self, key: &[u8], value: Option<&[u8]>) -> bool;
}

impl<K: Ordered + Send + Sync + 'static, V: Value + Send + Sync + 'static> AnyTable
    for TableSpec<K, V>
{
    fn index(&self) -> usize {
        self.index
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn compare(&self) -> fn(&[u8], &[u8]) -> Ordering {
        K::compare
    }

    fn order(&self) -> fn(&[u8]) -> Vec<u8> {
        super::ordered::encode::<K>
    }

    fn create(&self, wtx: &redb::WriteTransaction) -> Result<(), StoreError> {
        wtx.open_table(self.def)?;
        Ok(())
    }

    fn open(&self, rtx: &ReadTransaction) -> Result<Box<dyn SnapTable>, StoreError> {
        match rtx.open_table(self.def) {
            Ok(t) => Ok(Box::new(Snap::<K, V>(t))),
            // A table this hub registers but the last checkpoint does not hold yet.
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(Box::new(Empty)),
            Err(e) => Err(e.into()),
        }
    }

    fn valid(&self, key: &[u8], value: Option<&[u8]>) -> bool {
        // redb's decoders assume well-formed bytes and panic otherwise; a journal record
        // whose checksum holds can still be forged or written by a broken build, so its
        // bytes are decoded here, where a panic is caught and becomes a refusal.
        std::panic::catch_unwind(|| {
            let k = K::from_bytes(key);
            K::as_bytes(&k).as_ref() == key
                && K::compare(key, key) == Ordering::Equal
                && value.is_none_or(|v| {
                    let x = V::from_bytes(v);
                    V::as_bytes(&x).as_ref() == v
                })
        })
        .unwrap_or(false)
    }

    fn apply(&self, wtx: &redb::WriteTransaction, changes: &Changes) -> Result<(), StoreError> {
        let mut t = wtx.open_table(self.def)?;
        for (k, v) in changes {
            let key = K::from_bytes(&k.bytes);
            match v {
                Some(v) => {
                    t.insert(key, V::from_bytes(v))?;
                }
                None => {
                    t.remove(key)?;
                }
            }
        }
        Ok(())
    }
}

/// A key's stored bytes, ordered as its table orders them.
#[derive(Clone)]
pub struct RawKey {
    pub bytes: Vec<u8>,
    cmp: fn(&[u8], &[u8]) -> Ordering,
}

impl RawKey {
    pub fn new(bytes: Vec<u8>, cmp: fn(&[u8], &[u8]) -> Ordering) -> Self {
        RawKey { bytes, cmp }
    }
}

impl PartialEq for RawKey {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for RawKey {}
impl PartialOrd for RawKey {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for RawKey {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.cmp)(&self.bytes, &o.bytes)
    }
}

/// One table's changes: a value, or `None` for a removed key.
pub type Changes = BTreeMap<RawKey, Option<Vec<u8>>>;

/// Changes to every table, by position.
#[derive(Default)]
pub struct Overlay {
    pub tables: Vec<Changes>,
}

impl Overlay {
    pub fn new(tables: usize) -> Self {
        Overlay {
            tables: (0..tables).map(|_| Changes::new()).collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.tables.iter().all(BTreeMap::is_empty)
    }
}

pub(super) type RawItem = Result<(Vec<u8>, Vec<u8>), StoreError>;
pub(super) type RawIter = Box<dyn Iterator<Item = RawItem>>;

/// A table as its backend stores it (a redb read snapshot, PostgreSQL), by bytes.
pub trait SnapTable: Send {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// The entries within the bounds, forwards or backwards.
    fn range(&self, lo: Bound<&[u8]>, hi: Bound<&[u8]>, rev: bool) -> Result<RawIter, StoreError>;
    fn count(&self) -> Result<u64, StoreError>;
    /// After a batch: `Some(changes)` it committed, `None` it failed (or the backend's
    /// connection was made again). A backend that keeps what it read updates or forgets it.
    fn settle(&self, _committed: Option<&Changes>) {}
}

struct Snap<K: Key + 'static, V: Value + 'static>(redb::ReadOnlyTable<K, V>);

fn key_bytes<K: Key>(k: &K::SelfType<'_>) -> Vec<u8> {
    K::as_bytes(k).as_ref().to_vec()
}

fn value_bytes<V: Value>(v: &V::SelfType<'_>) -> Vec<u8> {
    V::as_bytes(v).as_ref().to_vec()
}

impl<K: Key + Send + Sync + 'static, V: Value + Send + Sync + 'static> SnapTable for Snap<K, V> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .0
            .get(K::from_bytes(key))?
            .map(|g| value_bytes::<V>(&g.value())))
    }

    fn range(&self, lo: Bound<&[u8]>, hi: Bound<&[u8]>, rev: bool) -> Result<RawIter, StoreError> {
        let lo = lo.map(|b| K::from_bytes(b));
        let hi = hi.map(|b| K::from_bytes(b));
        let r = self.0.range::<K::SelfType<'_>>((lo, hi))?;
        let map = |x: Result<
            (redb::AccessGuard<'static, K>, redb::AccessGuard<'static, V>),
            redb::StorageError,
        >| {
            let (k, v) = x?;
            Ok((key_bytes::<K>(&k.value()), value_bytes::<V>(&v.value())))
        };
        Ok(if rev {
            Box::new(r.rev().map(map))
        } else {
            Box::new(r.map(map))
        })
    }

    fn count(&self) -> Result<u64, StoreError> {
        Ok(self.0.len()?)
    }
}

/// A table the snapshot does not have yet.
struct Empty;

impl SnapTable for Empty {
    fn get(&self, _: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(None)
    }
    fn range(&self, _: Bound<&[u8]>, _: Bound<&[u8]>, _: bool) -> Result<RawIter, StoreError> {
        Ok(Box::new(std::iter::empty()))
    }
    fn count(&self) -> Result<u64, StoreError> {
        Ok(0)
    }
}

/// The last checkpoint, as a redb read snapshot with every registered table open.
pub struct Snapshot {
    pub(super) tables: Vec<Box<dyn SnapTable>>,
}

impl Snapshot {
    pub fn open(rtx: &ReadTransaction, registry: &[&dyn AnyTable]) -> Result<Self, StoreError> {
        let mut tables = Vec::with_capacity(registry.len());
        for t in registry {
            tables.push(t.open(rtx)?);
        }
        Ok(Snapshot { tables })
    }
}

/// A stored value (or key), owned, read as its type.
pub struct Guard<T: Value> {
    bytes: Vec<u8>,
    _t: PhantomData<T>,
}

impl<T: Value> Guard<T> {
    fn new(bytes: Vec<u8>) -> Self {
        Guard {
            bytes,
            _t: PhantomData,
        }
    }

    pub fn value(&self) -> T::SelfType<'_> {
        T::from_bytes(&self.bytes)
    }
}

/// A change the current batch made, to undo it: the table, the key, and what the current
/// layer held for it before (`None`: nothing).
pub type Undo = (usize, RawKey, Option<Option<Vec<u8>>>);

/// The layers of one table, read-only.
#[derive(Clone, Copy)]
pub struct Layers<'t> {
    pub(super) snap: &'t dyn SnapTable,
    pub(super) frozen: Option<&'t Changes>,
    pub(super) cur: &'t Changes,
    pub(super) cmp: fn(&[u8], &[u8]) -> Ordering,
}

impl<'t> Layers<'t> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let rk = RawKey::new(key.to_vec(), self.cmp);
        if let Some(v) = self.cur.get(&rk) {
            return Ok(v.clone());
        }
        if let Some(v) = self.frozen.and_then(|f| f.get(&rk)) {
            return Ok(v.clone());
        }
        self.snap.get(key)
    }

    /// The merged entries within the bounds.
    fn range(
        &self,
        lo: Bound<Vec<u8>>,
        hi: Bound<Vec<u8>>,
        rev: bool,
    ) -> Result<Merge<'t>, StoreError> {
        let empty = match (&lo, &hi) {
            (Bound::Included(a), Bound::Included(b)) => (self.cmp)(a, b) == Ordering::Greater,
            (Bound::Included(a) | Bound::Excluded(a), Bound::Excluded(b))
            | (Bound::Excluded(a), Bound::Included(b)) => (self.cmp)(a, b) != Ordering::Less,
            _ => false,
        };
        if empty {
            return Ok(Merge::empty(self.cmp, rev));
        }
        let snap = self
            .snap
            .range(bound_ref(&lo), bound_ref(&hi), rev)?
            .peekable();
        let rlo = lo.map(|b| RawKey::new(b, self.cmp));
        let rhi = hi.map(|b| RawKey::new(b, self.cmp));
        let layer = |c: &'t Changes| -> Layer<'t> {
            let r = c.range((rlo.clone(), rhi.clone()));
            let it: Box<dyn Iterator<Item = (&'t RawKey, &'t Option<Vec<u8>>)> + 't> =
                if rev { Box::new(r.rev()) } else { Box::new(r) };
            it.peekable()
        };
        Ok(Merge {
            snap,
            frozen: self.frozen.map(layer),
            cur: layer(self.cur),
            cmp: self.cmp,
            rev,
        })
    }
}

fn bound_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(v) => Bound::Included(v.as_slice()),
        Bound::Excluded(v) => Bound::Excluded(v.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

type Layer<'t> =
    std::iter::Peekable<Box<dyn Iterator<Item = (&'t RawKey, &'t Option<Vec<u8>>)> + 't>>;

/// The three layers of a range merged in key order: the current layer wins over the
/// frozen one, which wins over the snapshot; removed keys are skipped.
pub struct Merge<'t> {
    snap: std::iter::Peekable<RawIter>,
    frozen: Option<Layer<'t>>,
    cur: Layer<'t>,
    cmp: fn(&[u8], &[u8]) -> Ordering,
    rev: bool,
}

impl<'t> Merge<'t> {
    fn empty(cmp: fn(&[u8], &[u8]) -> Ordering, rev: bool) -> Self {
        let none: RawIter = Box::new(std::iter::empty());
        let layer: Box<dyn Iterator<Item = (&'t RawKey, &'t Option<Vec<u8>>)> + 't> =
            Box::new(std::iter::empty());
        Merge {
            snap: none.peekable(),
            frozen: None,
            cur: layer.peekable(),
            cmp,
            rev,
        }
    }

    /// Orders two keys in the direction of the walk.
    fn order(&self, a: &[u8], b: &[u8]) -> Ordering {
        let o = (self.cmp)(a, b);
        if self.rev { o.reverse() } else { o }
    }
}

impl Iterator for Merge<'_> {
    type Item = RawItem;

    fn next(&mut self) -> Option<RawItem> {
        loop {
            // The smallest key (in walk order) among the three heads.
            let mut best: Option<Vec<u8>> = None;
            match self.snap.peek() {
                Some(Err(_)) => return self.snap.next(),
                Some(Ok((k, _))) => best = Some(k.clone()),
                None => {}
            }
            let heads = [
                self.frozen.as_mut().and_then(|f| f.peek().map(|(k, _)| *k)),
                self.cur.peek().map(|(k, _)| *k),
            ];
            for k in heads.into_iter().flatten() {
                if best
                    .as_ref()
                    .is_none_or(|b| self.order(&k.bytes, b) == Ordering::Less)
                {
                    best = Some(k.bytes.clone());
                }
            }
            let key = best?;
            let mut value: Option<Option<Vec<u8>>> = None;
            if let Some(Ok((k, _))) = self.snap.peek()
                && (self.cmp)(k, &key) == Ordering::Equal
                && let Some(Ok((_, v))) = self.snap.next()
            {
                value = Some(Some(v));
            }
            if let Some(f) = self.frozen.as_mut()
                && f.peek()
                    .is_some_and(|(k, _)| (self.cmp)(&k.bytes, &key) == Ordering::Equal)
                && let Some((_, v)) = f.next()
            {
                value = Some(v.clone());
            }
            if self
                .cur
                .peek()
                .is_some_and(|(k, _)| (self.cmp)(&k.bytes, &key) == Ordering::Equal)
                && let Some((_, v)) = self.cur.next()
            {
                value = Some(v.clone());
            }
            if let Some(Some(v)) = value {
                return Some(Ok((key, v)));
            }
        }
    }
}

/// A typed entry of a range.
pub type Entry<K, V> = Result<(Guard<K>, Guard<V>), StoreError>;

fn encode_bounds<'k, K: Key + 'static>(
    r: &impl RangeBounds<K::SelfType<'k>>,
) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let f = |b: Bound<&K::SelfType<'k>>| b.map(|k| key_bytes::<K>(k));
    (f(r.start_bound()), f(r.end_bound()))
}

fn typed<K: Key, V: Value>(m: Merge<'_>) -> impl Iterator<Item = Entry<K, V>> + '_ {
    m.map(|x| x.map(|(k, v)| (Guard::new(k), Guard::new(v))))
}

/// One table, typed, read-only: what [`super::super::ReadTx`] hands out.
pub struct TableRef<'t, K: Key + 'static, V: Value + 'static> {
    layers: Layers<'t>,
    _t: PhantomData<(K, V)>,
}

/// One table, typed, for the writer's operations: reads as [`TableRef`], and writes into
/// the current layer, remembering what it replaced so a failed operation can be undone.
pub struct Table<'t, K: Key + 'static, V: Value + 'static> {
    index: usize,
    snap: &'t dyn SnapTable,
    frozen: Option<&'t Changes>,
    cur: &'t mut Overlay,
    undo: &'t mut Vec<Undo>,
    _t: PhantomData<(K, V)>,
}

/// The read operations both facades share.
macro_rules! reads {
    () => {
        pub fn get<'k>(
            &self,
            key: impl Borrow<K::SelfType<'k>>,
        ) -> Result<Option<Guard<V>>, StoreError> {
            Ok(self
                .layers()
                .get(&key_bytes::<K>(key.borrow()))?
                .map(Guard::new))
        }

        pub fn range<'k>(
            &self,
            r: impl RangeBounds<K::SelfType<'k>>,
        ) -> Result<impl Iterator<Item = Entry<K, V>> + '_, StoreError> {
            let (lo, hi) = encode_bounds::<K>(&r);
            Ok(typed(self.layers().range(lo, hi, false)?))
        }

        pub fn iter(&self) -> Result<impl Iterator<Item = Entry<K, V>> + '_, StoreError> {
            Ok(typed(self.layers().range(
                Bound::Unbounded,
                Bound::Unbounded,
                false,
            )?))
        }

        pub fn first(&self) -> Result<Option<(Guard<K>, Guard<V>)>, StoreError> {
            self.iter()?.next().transpose()
        }

        pub fn last(&self) -> Result<Option<(Guard<K>, Guard<V>)>, StoreError> {
            typed(
                self.layers()
                    .range(Bound::Unbounded, Bound::Unbounded, true)?,
            )
            .next()
            .transpose()
        }

        /// How many entries the table holds (counts the layers: for tests and status).
        pub fn count(&self) -> Result<u64, StoreError> {
            let l = self.layers();
            if l.frozen.is_none_or(BTreeMap::is_empty) && l.cur.is_empty() {
                return l.snap.count();
            }
            let mut n = 0;
            for e in l.range(Bound::Unbounded, Bound::Unbounded, false)? {
                e?;
                n += 1;
            }
            Ok(n)
        }
    };
}

impl<'t, K: Key + 'static, V: Value + 'static> TableRef<'t, K, V> {
    pub(crate) fn new(layers: Layers<'t>) -> Self {
        TableRef {
            layers,
            _t: PhantomData,
        }
    }

    fn layers(&self) -> Layers<'t> {
        self.layers
    }

    reads!();
}

impl<'t, K: Key + 'static, V: Value + 'static> Table<'t, K, V> {
    pub(crate) fn new(
        index: usize,
        snap: &'t dyn SnapTable,
        frozen: Option<&'t Changes>,
        cur: &'t mut Overlay,
        undo: &'t mut Vec<Undo>,
    ) -> Self {
        Table {
            index,
            snap,
            frozen,
            cur,
            undo,
            _t: PhantomData,
        }
    }

    fn layers(&self) -> Layers<'_> {
        Layers {
            snap: self.snap,
            frozen: self.frozen,
            cur: &self.cur.tables[self.index],
            cmp: K::compare,
        }
    }

    reads!();

    /// Sets `key` to `value`, without reading what it held (on PostgreSQL a read is a
    /// round trip; see [`Table::replace`] for a caller that needs it).
    pub fn insert<'k, 'v>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
        value: impl Borrow<V::SelfType<'v>>,
    ) -> Result<(), StoreError> {
        let v = value_bytes::<V>(value.borrow());
        self.put(key_bytes::<K>(key.borrow()), Some(v));
        Ok(())
    }

    /// Sets `key` to `value`; returns what it held.
    pub fn replace<'k, 'v>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
        value: impl Borrow<V::SelfType<'v>>,
    ) -> Result<Option<Guard<V>>, StoreError> {
        let v = value_bytes::<V>(value.borrow());
        self.set(key_bytes::<K>(key.borrow()), Some(v))
    }

    /// Removes `key`; returns what it held.
    pub fn remove<'k>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
    ) -> Result<Option<Guard<V>>, StoreError> {
        self.set(key_bytes::<K>(key.borrow()), None)
    }

    fn set(
        &mut self,
        key: Vec<u8>,
        value: Option<Vec<u8>>,
    ) -> Result<Option<Guard<V>>, StoreError> {
        let old = self.layers().get(&key)?;
        if old.is_none() && value.is_none() {
            return Ok(None);
        }
        self.put(key, value);
        Ok(old.map(Guard::new))
    }

    /// Records the change in the batch's overlay (and how to undo it).
    fn put(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        let rk = RawKey::new(key, K::compare);
        let before = self.cur.tables[self.index].insert(rk.clone(), value);
        self.undo.push((self.index, rk, before));
    }
}

/// Undoes the changes after position `mark` of `undo`, newest first.
pub fn rollback(cur: &mut Overlay, undo: &mut Vec<Undo>, mark: usize) {
    while undo.len() > mark {
        let Some((t, k, before)) = undo.pop() else {
            break;
        };
        match before {
            Some(v) => {
                cur.tables[t].insert(k, v);
            }
            None => {
                cur.tables[t].remove(&k);
            }
        }
    }
}

#[cfg(test)]
mod tests;
