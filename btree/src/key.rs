//! Order-preserving key encodings: byte strings whose lexicographic order equals the order of
//! the values they encode, so composite keys (TPC-C's `(warehouse, district, order)`) sort
//! correctly in the tree.
//!
//! - unsigned integers: big endian;
//! - signed integers: big endian with the sign bit flipped;
//! - byte strings inside a composite key: each 0x00 becomes 0x00 0xFF, terminated by 0x00 0x00,
//!   so a shorter string sorts before its extensions and components never run into each other.
//!   A byte string as the *last* component can be appended raw with [`KeyBuilder::raw`].

/// Builds an encoded key component by component.
#[derive(Debug, Default, Clone)]
pub struct KeyBuilder {
    buf: Vec<u8>,
}

impl KeyBuilder {
    pub fn new() -> Self {
        KeyBuilder {
            buf: Vec::with_capacity(32),
        }
    }
    pub fn u8(mut self, v: u8) -> Self {
        self.buf.push(v);
        self
    }
    pub fn u16(mut self, v: u16) -> Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn i32(self, v: i32) -> Self {
        self.u32((v as u32) ^ (1 << 31))
    }
    pub fn i64(self, v: i64) -> Self {
        self.u64((v as u64) ^ (1 << 63))
    }
    /// A byte string that may be followed by more components.
    pub fn bytes(mut self, v: &[u8]) -> Self {
        for &b in v {
            self.buf.push(b);
            if b == 0 {
                self.buf.push(0xFF);
            }
        }
        self.buf.extend_from_slice(&[0, 0]);
        self
    }
    pub fn str(self, v: &str) -> Self {
        self.bytes(v.as_bytes())
    }
    /// Raw bytes, as the last component.
    pub fn raw(mut self, v: &[u8]) -> Self {
        self.buf.extend_from_slice(v);
        self
    }
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Encode a u64 key.
pub fn u64_key(v: u64) -> [u8; 8] {
    v.to_be_bytes()
}

/// Decode a key made by [`u64_key`].
pub fn decode_u64(k: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(k.get(..8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_preserved() {
        let ints = [i64::MIN, -5, -1, 0, 1, 7, i64::MAX];
        let enc: Vec<Vec<u8>> = ints
            .iter()
            .map(|&v| KeyBuilder::new().i64(v).finish())
            .collect();
        assert!(enc.windows(2).all(|w| w[0] < w[1]));
        let strs: [&[u8]; 5] = [b"", b"\0", b"\0\0", b"a", b"a\0b"];
        let enc: Vec<Vec<u8>> = strs
            .iter()
            .map(|s| KeyBuilder::new().bytes(s).u32(0).finish())
            .collect();
        assert!(enc.windows(2).all(|w| w[0] < w[1]), "{enc:?}");
        // composite: first component dominates
        let a = KeyBuilder::new().u32(1).str("zzz").u32(0).finish();
        let b = KeyBuilder::new().u32(2).str("aaa").u32(0).finish();
        assert!(a < b);
        let a = KeyBuilder::new().str("ab").u32(9).finish();
        let b = KeyBuilder::new().str("abc").u32(0).finish();
        assert!(
            a < b,
            "a prefix string sorts first regardless of what follows"
        );
        assert_eq!(decode_u64(&u64_key(99)), Some(99));
    }
}
