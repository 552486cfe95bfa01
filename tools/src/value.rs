//! Self-checking YCSB values: every value carries its key and a checksum, so a wrong, stale
//! page's or torn value is detected by the reader.
//!
//! ```text
//! 0..8    key        u64 LE
//! 8..12   salt       u32 LE (changes with every update)
//! 12..16  checksum   CRC-32 of bytes 0..12 and 16..len
//! 16..    filler     derived from (key, salt)
//! ```
use byteorder::{ByteOrder, LittleEndian};

/// Smallest value size that holds the header.
pub const MIN_VALUE: usize = 16;

/// Fill `v` (of the run's value size) for `key` with `salt`.
pub fn fill(v: &mut [u8], key: u64, salt: u32) {
    v[0..8].copy_from_slice(&key.to_le_bytes());
    v[8..12].copy_from_slice(&salt.to_le_bytes());
    let mut x = key ^ ((salt as u64) << 32) ^ 0x9E37_79B9_7F4A_7C15;
    for chunk in v[16..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    let sum = sum(v);
    v[12..16].copy_from_slice(&sum.to_le_bytes());
}

fn sum(v: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&v[0..12]);
    h.update(&v[16..]);
    h.finalize()
}

/// Whether `v` is an intact value of `key` with the expected size.
pub fn check(v: &[u8], key: u64, size: usize) -> bool {
    v.len() == size
        && v.len() >= MIN_VALUE
        && v[0..8] == key.to_le_bytes()
        && LittleEndian::read_u32(&v[12..]) == sum(v)
}

/// The salt of an intact value.
pub fn salt(v: &[u8]) -> u32 {
    LittleEndian::read_u32(&v[8..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_wrong_key_and_corruption() {
        let mut v = vec![0u8; 128];
        fill(&mut v, 42, 7);
        assert!(check(&v, 42, 128));
        assert!(!check(&v, 43, 128));
        assert!(!check(&v, 42, 129));
        assert_eq!(salt(&v), 7);
        v[100] ^= 1;
        assert!(!check(&v, 42, 128));
    }
}
