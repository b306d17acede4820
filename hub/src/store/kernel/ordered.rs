//! Keys as bytes that sort the way redb sorts them: what a backend that compares keys by
//! their bytes (PostgreSQL's `bytea`) stores, so a range there walks redb's order.
//!
//! A key is the concatenation of its parts: a `u64` as 8 bytes big-endian, a string as
//! its bytes with each 0x00 written 0x00 0xFF, then 0x00 0x00. The terminator sorts below
//! any byte a string goes on with, so a string sorts before every longer one it begins,
//! and tuples sort part by part, as redb's tuples do.

use redb::{Key, Value};

/// A key type whose values have an order-preserving encoding.
pub trait Ordered: Key {
    fn ordered(k: &Self::SelfType<'_>, out: &mut Vec<u8>);
}

/// One part of a key.
pub trait Part: Value {
    fn put(v: &Self::SelfType<'_>, out: &mut Vec<u8>);
}

impl Part for u64 {
    fn put(v: &u64, out: &mut Vec<u8>) {
        out.extend_from_slice(&v.to_be_bytes());
    }
}

impl Part for &str {
    fn put(v: &&str, out: &mut Vec<u8>) {
        for b in v.bytes() {
            out.push(b);
            if b == 0 {
                out.push(0xFF);
            }
        }
        out.extend_from_slice(&[0, 0]);
    }
}

impl Ordered for u64 {
    fn ordered(k: &u64, out: &mut Vec<u8>) {
        <u64 as Part>::put(k, out);
    }
}

impl Ordered for &str {
    fn ordered(k: &&str, out: &mut Vec<u8>) {
        <&str as Part>::put(k, out);
    }
}

impl<A: Part + Key, B: Part + Key> Ordered for (A, B) {
    fn ordered(k: &Self::SelfType<'_>, out: &mut Vec<u8>) {
        A::put(&k.0, out);
        B::put(&k.1, out);
    }
}

impl<A: Part + Key, B: Part + Key, C: Part + Key> Ordered for (A, B, C) {
    fn ordered(k: &Self::SelfType<'_>, out: &mut Vec<u8>) {
        A::put(&k.0, out);
        B::put(&k.1, out);
        C::put(&k.2, out);
    }
}

/// `raw` (a key as redb stores it) in the order-preserving encoding.
pub fn encode<K: Ordered>(raw: &[u8]) -> Vec<u8> {
    let k = K::from_bytes(raw);
    let mut out = Vec::with_capacity(raw.len() + 4);
    K::ordered(&k, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Ordering;

    fn raw<K: Key>(k: &K::SelfType<'_>) -> Vec<u8> {
        K::as_bytes(k).as_ref().to_vec()
    }

    /// Every pair of `keys` compares the same by redb and by the encoding's bytes.
    fn same_order<K: Ordered + 'static>(keys: &[Vec<u8>]) {
        for a in keys {
            for b in keys {
                let by_redb = K::compare(a, b);
                let by_bytes = encode::<K>(a).cmp(&encode::<K>(b));
                assert_eq!(by_redb, by_bytes, "{a:?} vs {b:?}");
            }
        }
    }

    const STRS: [&str; 9] = ["", "\0", "\0\0", "\0a", "a", "a\0", "a\0b", "ab", "b"];
    const NUMS: [u64; 6] = [0, 1, 255, 256, 1 << 40, u64::MAX];

    #[test]
    fn strings_and_numbers_sort_as_redb_sorts_them() {
        same_order::<&str>(&STRS.map(|s| raw::<&str>(&s)));
        same_order::<u64>(&NUMS.map(|n| raw::<u64>(&n)));
    }

    #[test]
    fn tuples_sort_part_by_part() {
        let (mut by_str, mut by_num, mut triples, mut strs) = (vec![], vec![], vec![], vec![]);
        for s in STRS {
            for n in NUMS {
                by_str.push(raw::<(&str, u64)>(&(s, n)));
                by_num.push(raw::<(u64, &str)>(&(n, s)));
                for t in ["", "x", "\0"] {
                    triples.push(raw::<(u64, &str, &str)>(&(n, s, t)));
                }
            }
            for t in STRS {
                strs.push(raw::<(&str, &str)>(&(s, t)));
            }
        }
        same_order::<(&str, u64)>(&by_str);
        same_order::<(u64, &str)>(&by_num);
        same_order::<(u64, &str, &str)>(&triples);
        same_order::<(&str, &str)>(&strs);
    }

    #[test]
    fn distinct_keys_stay_distinct() {
        let a = encode::<(&str, &str)>(&raw::<(&str, &str)>(&("a\0", "")));
        let b = encode::<(&str, &str)>(&raw::<(&str, &str)>(&("a", "\0")));
        assert_ne!(a, b);
        assert_eq!(a.cmp(&b), Ordering::Greater);
    }
}
