//! Secrets, tokens and ids: drawn from the OS, stored only as SHA-256, compared in
//! constant time. Nothing here logs or formats a secret.

use sha2::{Digest, Sha256};

/// `n` random bytes as lowercase hex.
pub fn random_hex(n: usize) -> String {
    let mut buf = vec![0u8; n];
    // The OS random source failing is not recoverable for a security product.
    if let Err(e) = getrandom::fill(&mut buf) {
        panic!("the OS random source failed: {e}");
    }
    hex(&buf)
}

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// A waitpoint secret: 256 random bits.
pub fn new_secret() -> String {
    random_hex(32)
}

pub fn hash(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Constant-time comparison of `secret`'s hash with a stored one.
pub fn matches(secret: &str, stored: &[u8; 32]) -> bool {
    same_hash(&hash(secret), stored)
}

/// Whether two stored hashes are the same, in constant time.
pub fn same_hash(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (x, y) in a.iter().zip(b.iter()) {
        diff |= x ^ y;
    }
    diff == 0
}

/// `wp_1a2b3c4d5e6f`, `ses_…`: a prefix and 48 random bits.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", random_hex(6))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_256_bits_and_match_only_themselves() {
        let s = new_secret();
        assert_eq!(s.len(), 64);
        let h = hash(&s);
        assert!(matches(&s, &h));
        assert!(!matches(&new_secret(), &h));
        assert!(!matches("", &h));
        assert_ne!(new_secret(), s);
    }

    #[test]
    fn ids_are_a_prefix_and_twelve_hex_digits() {
        let id = new_id("wp");
        assert_eq!(id.len(), 15);
        assert!(id.starts_with("wp_"));
        assert!(id[3..].chars().all(|c| c.is_ascii_hexdigit()));
    }
}
