//! Random identifiers from the OS (getrandom), with a fallback that never fails: a signal's
//! key or a spool file's name must not be the reason a signal is lost.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

fn fill(buf: &mut [u8]) {
    if getrandom::fill(buf).is_err() {
        // RandomState is seeded from the OS once per process and varies per instance.
        for chunk in buf.chunks_mut(8) {
            let mut h = RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0),
            );
            let v = h.finish().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// 32 lowercase hex characters (128 random bits).
pub fn key() -> String {
    let mut buf = [0u8; 16];
    fill(&mut buf);
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn u32() -> u32 {
    let mut buf = [0u8; 4];
    fill(&mut buf);
    u32::from_le_bytes(buf)
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_are_32_hex_and_fresh() {
        let a = super::key();
        assert_eq!(a.len(), 32);
        assert!(
            a.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_ne!(a, super::key());
    }
}
