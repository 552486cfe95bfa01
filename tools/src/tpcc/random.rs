//! TPC-C's random inputs (clause 4.3.2 and 2.1.6): uniform numbers, alphanumeric and numeric
//! strings, NURand with the run's C constants, customer last names from syllables.

use rand::rngs::SmallRng;
use rand::Rng;

/// The C constants of NURand. The run's `c_last` differs from the load's by a delta in
/// 65..=119 other than 96 and 112 (clause 2.1.6.1).
#[derive(Clone, Copy, Debug)]
pub struct Constants {
    pub c_last: u32,
    pub c_id: u32,
    pub ol_i_id: u32,
}

impl Constants {
    pub fn load(rng: &mut SmallRng) -> Constants {
        Constants {
            c_last: rng.random_range(0..=255),
            c_id: rng.random_range(0..=1023),
            ol_i_id: rng.random_range(0..=8191),
        }
    }
    /// Constants for the measured run, valid against the load's.
    pub fn run(load: &Constants, rng: &mut SmallRng) -> Constants {
        let c_last = loop {
            let c = rng.random_range(0..=255u32);
            let delta = c.abs_diff(load.c_last);
            if (65..=119).contains(&delta) && delta != 96 && delta != 112 {
                break c;
            }
        };
        Constants {
            c_last,
            c_id: rng.random_range(0..=1023),
            ol_i_id: rng.random_range(0..=8191),
        }
    }
}

/// NURand(A, x, y) = (((random(0, A) | random(x, y)) + C) % (y - x + 1)) + x.
pub fn nurand(rng: &mut SmallRng, a: u32, x: u32, y: u32, c: u32) -> u32 {
    (((rng.random_range(0..=a) | rng.random_range(x..=y)) + c) % (y - x + 1)) + x
}

const SYLLABLES: [&str; 10] = [
    "BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING",
];

/// The last name for a number 0..=999: its three digits as syllables.
pub fn last_name(n: u32) -> Vec<u8> {
    let mut s = Vec::with_capacity(16);
    for d in [n / 100, n / 10 % 10, n % 10] {
        s.extend_from_slice(SYLLABLES[d as usize].as_bytes());
    }
    s
}

/// A random alphanumeric string of `lo..=hi` characters.
pub fn astring(rng: &mut SmallRng, lo: usize, hi: usize) -> Vec<u8> {
    const CH: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let n = rng.random_range(lo..=hi);
    (0..n).map(|_| CH[rng.random_range(0..CH.len())]).collect()
}

/// A random numeric string of `lo..=hi` digits.
pub fn nstring(rng: &mut SmallRng, lo: usize, hi: usize) -> Vec<u8> {
    let n = rng.random_range(lo..=hi);
    (0..n).map(|_| b'0' + rng.random_range(0..10u8)).collect()
}

/// `I_DATA` / `S_DATA`: 26..=50 characters, 10% containing "ORIGINAL" at a random place.
pub fn data_with_original(rng: &mut SmallRng) -> Vec<u8> {
    let mut s = astring(rng, 26, 50);
    if rng.random_range(0..10) == 0 {
        let at = rng.random_range(0..=s.len() - 8);
        s[at..at + 8].copy_from_slice(b"ORIGINAL");
    }
    s
}

/// A zip code: 4 random digits then "11111".
pub fn zip(rng: &mut SmallRng) -> Vec<u8> {
    let mut z = nstring(rng, 4, 4);
    z.extend_from_slice(b"11111");
    z
}

/// Seconds since the Unix epoch (dates in rows).
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn nurand_stays_in_range_and_run_constants_keep_their_distance() {
        let mut rng = SmallRng::seed_from_u64(3);
        for _ in 0..10_000 {
            let v = nurand(&mut rng, 1023, 1, 3000, 77);
            assert!((1..=3000).contains(&v));
        }
        for _ in 0..100 {
            let l = Constants::load(&mut rng);
            let r = Constants::run(&l, &mut rng);
            let d = r.c_last.abs_diff(l.c_last);
            assert!((65..=119).contains(&d) && d != 96 && d != 112);
        }
        assert_eq!(last_name(371), b"PRICALLYOUGHT".to_vec());
        assert_eq!(last_name(0), b"BARBARBAR".to_vec());
    }
}
