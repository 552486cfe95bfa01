//! How record number `k` becomes the key stored in the table: shoal's 8-byte numbers, or
//! YCSB's key names (`user` followed by the number, or by its FNV-64 hash: YCSB's
//! `insertorder=hashed`, its default, which scatters the inserts over the key space).

use crate::workload::fnv64;
use shoal_btree::{decode_u64, u64_key};

/// Which keys a table has (`--keys`; YCSB's `insertorder`).
#[derive(
    clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum KeyNames {
    /// The number as 8 big-endian bytes: keys in number order (shoal's own runs).
    Integer,
    /// YCSB's insertorder=hashed: `user` and the decimal FNV-64 hash of the number.
    Hashed,
    /// YCSB's insertorder=ordered: `user` and the number in decimal.
    Ordered,
}

impl Default for KeyNames {
    /// (A data set described before key names existed has integer keys.)
    fn default() -> Self {
        KeyNames::Integer
    }
}

/// Longest `--zero-padding`: a key stays well within the tree's key limit.
pub const MAX_ZERO_PADDING: usize = 64;

/// Makes the keys of a run: [`KeyNames`] and YCSB's `zeropadding` (digits the number is
/// padded to with leading zeros; 1, YCSB's default, pads nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Namer {
    pub names: KeyNames,
    pub zero_padding: usize,
}

impl Namer {
    /// The key of record `k`, written into `buf` (which it returns). No allocation: scans
    /// name every entry they check.
    pub fn key<'b>(&self, k: u64, buf: &'b mut Vec<u8>) -> &'b [u8] {
        buf.clear();
        let (negative, mut x) = match self.names {
            KeyNames::Integer => {
                buf.extend_from_slice(&u64_key(k));
                return buf;
            }
            KeyNames::Hashed => {
                // Java's Math.abs of the hash as a signed long (i64::MIN stays negative)
                let h = (fnv64(k) as i64).wrapping_abs();
                (h < 0, h.unsigned_abs())
            }
            KeyNames::Ordered => (false, k),
        };
        let mut text = [0u8; 21];
        let mut at = text.len();
        loop {
            at -= 1;
            text[at] = b'0' + (x % 10) as u8;
            x /= 10;
            if x == 0 {
                break;
            }
        }
        if negative {
            at -= 1;
            text[at] = b'-';
        }
        let digits = &text[at..];
        buf.extend_from_slice(b"user");
        buf.extend(std::iter::repeat_n(
            b'0',
            self.zero_padding.saturating_sub(digits.len()),
        ));
        buf.extend_from_slice(digits);
        buf
    }

    /// The record number of an entry a scan returned, if its key is that number's key (the
    /// number is the key itself, or for key names the one its value says: see
    /// [`crate::value`]); `None` for an entry that is not a record of this table.
    pub fn number(&self, key: &[u8], value: &[u8], buf: &mut Vec<u8>) -> Option<u64> {
        let k = match self.names {
            KeyNames::Integer => return decode_u64(key),
            _ => u64::from_le_bytes(value.get(..8)?.try_into().ok()?),
        };
        (self.key(k, buf) == key).then_some(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 47: YCSB's key names, as its CoreWorkload builds them.
    #[test]
    fn key_names_are_ycsbs() {
        let mut buf = Vec::new();
        let hashed = Namer {
            names: KeyNames::Hashed,
            zero_padding: 1,
        };
        // YCSB's first keys (its Utils.fnvhash64 of 0 and 1, worked out apart from this code)
        assert_eq!(hashed.key(0, &mut buf), b"user6284781860667377211");
        assert_eq!(hashed.key(1, &mut buf), b"user8517097267634966620");
        assert_eq!(fnv64(0), 0xa8c7_f832_281a_39c5);
        let ordered = Namer {
            names: KeyNames::Ordered,
            zero_padding: 5,
        };
        assert_eq!(ordered.key(42, &mut buf), b"user00042");
        let long = Namer {
            zero_padding: 1,
            ..ordered
        };
        assert_eq!(long.key(1234567, &mut buf), b"user1234567");
        let integer = Namer {
            names: KeyNames::Integer,
            zero_padding: 1,
        };
        assert_eq!(integer.key(7, &mut buf), &7u64.to_be_bytes());
        // every name fits YCSB's 24-byte key and maps back through its value
        for k in [0, 1, 99, u64::MAX / 3, u64::MAX] {
            let key = hashed.key(k, &mut buf).to_vec();
            assert!(key.len() <= 24, "{}", String::from_utf8_lossy(&key));
            let mut value = vec![0u8; 16];
            value[..8].copy_from_slice(&k.to_le_bytes());
            assert_eq!(hashed.number(&key, &value, &mut buf), Some(k));
            value[0] ^= 1;
            assert_eq!(hashed.number(&key, &value, &mut buf), None);
        }
        // distinct records, distinct keys (and no order kept by the hash)
        let keys: std::collections::BTreeSet<Vec<u8>> = (0..10_000)
            .map(|k| hashed.key(k, &mut buf).to_vec())
            .collect();
        assert_eq!(keys.len(), 10_000);
    }
}
