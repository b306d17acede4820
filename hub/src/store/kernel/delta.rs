//! A batch's journal record: the keys it changed and their new values, by table name.
//!
//! `0xC1 | count u32 | (name_len u16 | name | key_len u32 | key | 0 | 1 value_len u32 value)*`,
//! integers little-endian. `0xC1` is never the first byte of a MessagePack value, so a
//! record of this kind is told apart from the operation records older hubs wrote.

use std::collections::BTreeSet;

use super::error::StoreError;
use super::table::{AnyTable, Overlay, RawKey, Undo};

/// The first byte of every change record.
pub const TAG: u8 = 0xC1;

/// One change: table position, key, new value (`None`: removed).
pub type Change = (usize, Vec<u8>, Option<Vec<u8>>);

/// The record of the changes named by `undo` (a batch's), as `cur` holds them now.
pub fn encode(registry: &[&'static dyn AnyTable], cur: &Overlay, undo: &[Undo]) -> Vec<u8> {
    let touched: BTreeSet<(usize, &RawKey)> = undo.iter().map(|(t, k, _)| (*t, k)).collect();
    let mut out = Vec::with_capacity(64 + touched.len() * 128);
    out.push(TAG);
    out.extend_from_slice(&(touched.len() as u32).to_le_bytes());
    for (t, k) in touched {
        let name = registry[t].name().as_bytes();
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&(k.bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(&k.bytes);
        match cur.tables[t].get(k) {
            Some(Some(v)) => {
                out.push(1);
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                out.extend_from_slice(v);
            }
            _ => out.push(0),
        }
    }
    out
}

/// The size [`encode`] would give the changes named by `undo` alone, without building
/// the record (one job's share of a batch, to refuse a job too large for any record on
/// its own).
pub fn encoded_len(registry: &[&'static dyn AnyTable], cur: &Overlay, undo: &[Undo]) -> usize {
    let touched: BTreeSet<(usize, &RawKey)> = undo.iter().map(|(t, k, _)| (*t, k)).collect();
    let mut len = 1 + 4;
    for (t, k) in touched {
        len += 2 + registry[t].name().len() + 4 + k.bytes.len() + 1;
        if let Some(Some(v)) = cur.tables[t].get(k) {
            len += 4 + v.len();
        }
    }
    len
}

/// Reads a change record back, naming tables by their registry position.
pub fn decode(registry: &[&'static dyn AnyTable], b: &[u8]) -> Result<Vec<Change>, StoreError> {
    let bad =
        |what: &str| StoreError::Decode(format!("a journal change record is damaged: {what}"));
    let mut r = Reader { b, at: 0 };
    if r.take(1).map_err(|()| bad("empty"))? != [TAG] {
        return Err(bad("not a change record"));
    }
    let n = r.u32().map_err(|()| bad("count"))?;
    let mut out = Vec::new();
    for _ in 0..n {
        let name_len = r.u16().map_err(|()| bad("table name"))? as usize;
        let name = r.take(name_len).map_err(|()| bad("table name"))?;
        let name = std::str::from_utf8(name).map_err(|_| bad("table name"))?;
        let t = registry
            .iter()
            .position(|t| t.name() == name)
            .ok_or_else(|| {
                StoreError::Decode(format!(
                    "a journal record changes table {name:?}, which this hub does not know"
                ))
            })?;
        let klen = r.u32().map_err(|()| bad("key"))? as usize;
        let key = r.take(klen).map_err(|()| bad("key"))?.to_vec();
        let value = match r.take(1).map_err(|()| bad("value"))? {
            [0] => None,
            [1] => {
                let vlen = r.u32().map_err(|()| bad("value"))? as usize;
                Some(r.take(vlen).map_err(|()| bad("value"))?.to_vec())
            }
            _ => return Err(bad("value flag")),
        };
        if !registry[t].valid(&key, value.as_deref()) {
            return Err(StoreError::Decode(format!(
                "a journal change record holds a key or value that is not well-formed for table {name:?}"
            )));
        }
        out.push((t, key, value));
    }
    if r.at != b.len() {
        return Err(bad("trailing bytes"));
    }
    Ok(out)
}

/// Applies decoded changes to `cur` (a replay).
pub fn apply(registry: &[&'static dyn AnyTable], cur: &mut Overlay, changes: Vec<Change>) {
    for (t, k, v) in changes {
        cur.tables[t].insert(RawKey::new(k, registry[t].compare()), v);
    }
}

struct Reader<'b> {
    b: &'b [u8],
    at: usize,
}

impl<'b> Reader<'b> {
    fn take(&mut self, n: usize) -> Result<&'b [u8], ()> {
        let end = self.at.checked_add(n).ok_or(())?;
        let s = self.b.get(self.at..end).ok_or(())?;
        self.at = end;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16, ()> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().map_err(|_| ())?,
        ))
    }
    fn u32(&mut self) -> Result<u32, ()> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().map_err(|_| ())?,
        ))
    }
}
