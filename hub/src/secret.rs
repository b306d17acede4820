//! Secrets, tokens and ids: drawn from the OS, stored only as SHA-256, compared in
//! constant time; what must travel through a shared store is sealed (ChaCha20-Poly1305,
//! from `ring`, which rustls already builds) under a key derived from the operator token.
//! Nothing here logs or formats a secret.

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

/// A key for `purpose` from the operator token: every hub on a store has the token
/// (they must share it), the store holds only its plain SHA-256, from which this key
/// cannot be made.
pub fn derive_key(token: &str, purpose: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"cortex key\0");
    h.update(purpose.as_bytes());
    h.update(b"\0");
    h.update(token.as_bytes());
    h.finalize().into()
}

fn aead_key(key: &[u8; 32]) -> ring::aead::LessSafeKey {
    // A 32-byte key is what ChaCha20-Poly1305 takes: this cannot fail.
    let unbound = ring::aead::UnboundKey::new(&ring::aead::CHACHA20_POLY1305, key)
        .unwrap_or_else(|_| unreachable!("a 32-byte ChaCha20-Poly1305 key"));
    ring::aead::LessSafeKey::new(unbound)
}

/// `plain` sealed under `key`, bound to `context` (a random nonce, then the ciphertext
/// and its tag).
pub fn seal(key: &[u8; 32], context: &[u8], plain: &[u8]) -> Vec<u8> {
    let mut nonce = [0u8; 12];
    if let Err(e) = getrandom::fill(&mut nonce) {
        panic!("the OS random source failed: {e}");
    }
    let mut buf = plain.to_vec();
    let sealed = aead_key(key).seal_in_place_append_tag(
        ring::aead::Nonce::assume_unique_for_key(nonce),
        ring::aead::Aad::from(context),
        &mut buf,
    );
    // Sealing fails only past ChaCha20's 256 GiB per message.
    if sealed.is_err() {
        panic!("cannot seal {} bytes", plain.len());
    }
    let mut out = nonce.to_vec();
    out.extend_from_slice(&buf);
    out
}

/// What [`seal`] sealed, if `sealed` is intact and was sealed under `key` for `context`.
pub fn open(key: &[u8; 32], context: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
    let (nonce, body) = sealed.split_at_checked(12)?;
    let nonce = ring::aead::Nonce::try_assume_unique_for_key(nonce).ok()?;
    let mut buf = body.to_vec();
    let plain = aead_key(key)
        .open_in_place(nonce, ring::aead::Aad::from(context), &mut buf)
        .ok()?;
    Some(plain.to_vec())
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
    fn sealed_bytes_open_only_under_their_key_and_context_and_hide_the_plain_text() {
        let key = derive_key("operator", "exec-asks");
        assert_ne!(key, hash("operator"), "the store's hash is not the key");
        assert_ne!(key, derive_key("operator", "other"));
        let plain = b"CORTEX_SIGNAL_SECRET=abc123";
        let sealed = seal(&key, b"ex_1", plain);
        assert!(
            !sealed.windows(6).any(|w| w == b"abc123"),
            "sealed, not copied"
        );
        assert_ne!(sealed, seal(&key, b"ex_1", plain), "a nonce each time");
        assert_eq!(open(&key, b"ex_1", &sealed).as_deref(), Some(&plain[..]));
        assert_eq!(open(&key, b"ex_2", &sealed), None, "another context");
        let other = derive_key("another token", "exec-asks");
        assert_eq!(open(&other, b"ex_1", &sealed), None, "another key");
        let mut bent = sealed.clone();
        let last = bent.len() - 1;
        bent[last] ^= 1;
        assert_eq!(open(&key, b"ex_1", &bent), None, "tampered");
        assert_eq!(open(&key, b"ex_1", &sealed[..5]), None, "cut short");
    }

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
