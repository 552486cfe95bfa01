//! Self-checking YCSB values: every field of a value carries its record number and a
//! checksum, so a wrong, stale page's or torn value is detected by the reader, and so is a
//! single field read or written alone (YCSB's readallfields / writeallfields=false). A value
//! of plain `--value-size` bytes is one field.
//!
//! ```text
//! each field of `Layout::field` bytes, field f at f x field:
//! 0..8    record    u64 LE
//! 8..12   salt      u32 LE (changes with every write of the field)
//! 12..16  checksum  one field: CRC-32 of bytes 0..12 and 16..; several fields: a
//!                   multiply-rotate hash of f and those bytes' words (a CRC per 100-byte field
//!                   made a scan's checks cost more than the scan)
//! 16..    filler    derived from (record, f, salt)
//! ```
use byteorder::{ByteOrder, LittleEndian};

/// Smallest field (and value) that holds the header.
pub const MIN_VALUE: usize = 16;

/// A run's values: `size` bytes made of fields of `field` bytes (`field` divides `size`; one
/// field is the whole value), or with `lengths` other than constant, one field whose length
/// each record draws (YCSB's fieldlengthdistribution).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub size: usize,
    pub field: usize,
    pub lengths: Lengths,
}

/// How long a record's fields are (YCSB's fieldlengthdistribution and minfieldlength): each of
/// `count` fields draws a length in `min..=max` bytes and the record is their sum (at least
/// [`MIN_VALUE`]), drawn from the record's number so that every reader knows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase", tag = "distribution")]
pub enum Lengths {
    /// (Also what a data set described without lengths has.)
    #[default]
    Constant,
    Uniform {
        count: u32,
        min: u32,
        max: u32,
    },
    Zipfian {
        count: u32,
        min: u32,
        max: u32,
    },
}

/// Drawn field lengths: the distribution's name (YCSB's) and the fields' count, shortest and
/// longest length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drawn {
    pub name: &'static str,
    pub count: u32,
    pub min: u32,
    pub max: u32,
}

impl Lengths {
    /// `None` for constant lengths.
    pub fn drawn(&self) -> Option<Drawn> {
        let (name, count, min, max) = match *self {
            Lengths::Constant => return None,
            Lengths::Uniform { count, min, max } => ("uniform", count, min, max),
            Lengths::Zipfian { count, min, max } => ("zipfian", count, min, max),
        };
        Some(Drawn {
            name,
            count,
            min,
            max,
        })
    }
}

impl Layout {
    /// One field: the whole value.
    pub fn whole(size: usize) -> Layout {
        Layout {
            size,
            field: size,
            lengths: Lengths::Constant,
        }
    }

    /// Record `k`'s value size.
    pub fn size_of(&self, k: u64) -> usize {
        use rand::{Rng, SeedableRng};
        let (count, min, max, zipf) = match self.lengths {
            Lengths::Constant => return self.size,
            Lengths::Uniform { count, min, max } => (count, min, max, false),
            Lengths::Zipfian { count, min, max } => (count, min, max, true),
        };
        let mut rng = rand::rngs::SmallRng::seed_from_u64(crate::workload::fnv64(k ^ 0x1e57));
        let z = rand_distr::Zipf::new((max - min + 1) as f64, 0.99).ok();
        let one = |rng: &mut rand::rngs::SmallRng| match (zipf, &z) {
            (true, Some(z)) => min + (rand_distr::Distribution::sample(z, rng) as u32).max(1) - 1,
            _ => rng.random_range(min..=max),
        };
        let sum: u64 = (0..count).map(|_| u64::from(one(&mut rng).min(max))).sum();
        (sum as usize).max(MIN_VALUE)
    }

    pub fn fields(&self) -> usize {
        if self.lengths != Lengths::Constant {
            return 1;
        }
        self.size / self.field
    }

    /// The bytes of field `f` within the value.
    pub fn range(&self, f: usize) -> std::ops::Range<usize> {
        f * self.field..(f + 1) * self.field
    }

    /// Fill all of `v` (of `size` bytes) for record `k` with `salt`.
    pub fn fill(&self, v: &mut [u8], k: u64, salt: u32) {
        for (f, field) in v.chunks_mut(self.field).enumerate() {
            self.fill_field(field, k, f, salt);
        }
    }

    /// Whether `v` is an intact value of record `k`: every field intact.
    pub fn check(&self, v: &[u8], k: u64) -> bool {
        if self.lengths != Lengths::Constant {
            return v.len() == self.size_of(k) && self.check_field(v, k, 0);
        }
        v.len() == self.size
            && v.chunks(self.field)
                .enumerate()
                .all(|(f, field)| field.len() == self.field && self.check_field(field, k, f))
    }

    /// Fill field `f` (all its bytes, at least [`MIN_VALUE`]) for record `k` with `salt`.
    pub fn fill_field(&self, v: &mut [u8], k: u64, f: usize, salt: u32) {
        v[0..8].copy_from_slice(&k.to_le_bytes());
        v[8..12].copy_from_slice(&salt.to_le_bytes());
        let mut x = k ^ ((salt as u64) << 32) ^ 0x9E37_79B9_7F4A_7C15 ^ (f as u64).rotate_left(17);
        for chunk in v[16..].chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = x.to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
        let sum = self.sum(v, f);
        v[12..16].copy_from_slice(&sum.to_le_bytes());
    }

    /// Whether `v` is an intact field `f` of record `k`.
    pub fn check_field(&self, v: &[u8], k: u64, f: usize) -> bool {
        v.len() >= MIN_VALUE
            && v[0..8] == k.to_le_bytes()
            && LittleEndian::read_u32(&v[12..]) == self.sum(v, f)
    }

    fn sum(&self, v: &[u8], f: usize) -> u32 {
        if self.fields() == 1 {
            let mut h = crc32fast::Hasher::new();
            h.update(&v[0..12]);
            h.update(&v[16..]);
            return h.finalize();
        }
        let mut h: u64 = 0x9E37_79B9_7F4A_7C15 ^ f as u64;
        let mut mix = |w: u64| h = (h.rotate_left(23) ^ w).wrapping_mul(0x2127_599B_F432_5C37);
        mix(LittleEndian::read_u64(&v[0..8]));
        mix(LittleEndian::read_u32(&v[8..12]) as u64);
        let (words, tail) = v[16..].as_chunks::<8>();
        for w in words {
            mix(u64::from_le_bytes(*w));
        }
        let mut last = [0u8; 8];
        last[..tail.len()].copy_from_slice(tail);
        mix(u64::from_le_bytes(last) ^ ((tail.len() as u64) << 56));
        (h ^ (h >> 32)) as u32
    }
}

/// The salt of an intact field.
pub fn salt(v: &[u8]) -> u32 {
    LittleEndian::read_u32(&v[8..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_wrong_key_and_corruption() {
        let whole = Layout::whole(128);
        let mut v = vec![0u8; 128];
        whole.fill(&mut v, 42, 7);
        assert!(whole.check(&v, 42));
        assert!(!whole.check(&v, 43));
        assert!(!Layout::whole(129).check(&v, 42));
        assert_eq!(salt(&v), 7);
        v[100] ^= 1;
        assert!(!whole.check(&v, 42));
    }

    /// Issue 47: YCSB's fields each check on their own: one written alone keeps the value
    /// whole, one read alone is checked, and a field in another field's place is caught.
    #[test]
    fn each_field_checks_on_its_own() {
        let l = Layout {
            size: 1000,
            field: 100,
            lengths: Lengths::Constant,
        };
        assert_eq!(l.fields(), 10);
        let mut v = vec![0u8; 1000];
        l.fill(&mut v, 9, 1);
        assert!(l.check(&v, 9));
        l.fill_field(&mut v[l.range(3)], 9, 3, 77);
        assert!(l.check(&v, 9), "one field rewritten alone");
        assert_eq!(salt(&v[l.range(3)]), 77);
        assert!(l.check_field(&v[l.range(3)], 9, 3));
        assert!(
            !l.check_field(&v[l.range(3)], 9, 4),
            "field 3 is not field 4"
        );
        for at in [0, 9, 13, 50, 99] {
            let mut w = v.clone();
            w[300 + at] ^= 4;
            assert!(!l.check(&w, 9), "a bit flipped at byte {at} of field 3");
        }
        let three = v[l.range(3)].to_vec();
        v[l.range(4)].copy_from_slice(&three);
        assert!(!l.check(&v, 9), "a field in another's place");
    }

    /// Issue 47: YCSB's field length distributions: each record's length is the sum of its
    /// fields' drawn lengths, the same for every reader, and checked.
    #[test]
    fn records_draw_their_lengths_and_are_checked_at_them() {
        for lengths in [
            Lengths::Uniform {
                count: 10,
                min: 1,
                max: 100,
            },
            Lengths::Zipfian {
                count: 10,
                min: 1,
                max: 100,
            },
        ] {
            let l = Layout {
                size: 1000,
                field: 1000,
                lengths,
            };
            let sizes: Vec<usize> = (0..2000).map(|k| l.size_of(k)).collect();
            assert!(sizes.iter().all(|&n| (MIN_VALUE..=1000).contains(&n)));
            assert_eq!(sizes[7], l.size_of(7), "the same for every reader");
            let mean = sizes.iter().sum::<usize>() as f64 / sizes.len() as f64;
            match lengths {
                // ten fields of 50.5 bytes on average
                Lengths::Uniform { .. } => assert!((480.0..530.0).contains(&mean), "{mean}"),
                // zipfian favours the shortest lengths
                _ => assert!(mean < 300.0, "{mean}"),
            }
            let mut v = vec![0u8; l.size_of(3)];
            l.fill(&mut v, 3, 1);
            assert!(l.check(&v, 3));
            v.push(0);
            assert!(!l.check(&v, 3), "a record of another length");
        }
    }
}
