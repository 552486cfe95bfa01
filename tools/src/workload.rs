//! YCSB workload definitions and key choosers.

use rand::rngs::SmallRng;
use rand::Rng;
use rand_distr::{Distribution, Zipf};

/// Operation kinds of YCSB's core workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Update,
    Insert,
    Scan,
    ReadModifyWrite,
}

/// Operation mix (fractions summing to 1).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Mix {
    pub read: f64,
    pub update: f64,
    pub insert: f64,
    pub scan: f64,
    pub rmw: f64,
}

impl Mix {
    /// The mix of YCSB core workload `w` (a-f).
    pub fn of(w: char) -> Option<Mix> {
        let m = |read, update, insert, scan, rmw| Mix {
            read,
            update,
            insert,
            scan,
            rmw,
        };
        Some(match w {
            'a' => m(0.5, 0.5, 0.0, 0.0, 0.0),
            'b' => m(0.95, 0.05, 0.0, 0.0, 0.0),
            'c' => m(1.0, 0.0, 0.0, 0.0, 0.0),
            'd' => m(0.95, 0.0, 0.05, 0.0, 0.0),
            'e' => m(0.0, 0.0, 0.05, 0.95, 0.0),
            'f' => m(0.5, 0.0, 0.0, 0.0, 0.5),
            _ => return None,
        })
    }

    /// Reads with fraction `r`, updates with the rest.
    pub fn read_ratio(r: f64) -> Mix {
        Mix {
            read: r,
            update: 1.0 - r,
            insert: 0.0,
            scan: 0.0,
            rmw: 0.0,
        }
    }

    pub fn pick(&self, rng: &mut SmallRng) -> Op {
        let x: f64 = rng.random();
        let mut acc = self.read;
        if x < acc {
            return Op::Read;
        }
        acc += self.update;
        if x < acc {
            return Op::Update;
        }
        acc += self.insert;
        if x < acc {
            return Op::Insert;
        }
        acc += self.scan;
        if x < acc {
            return Op::Scan;
        }
        if self.rmw > 0.0 {
            Op::ReadModifyWrite
        } else {
            Op::Read
        }
    }
}

/// Request distribution over existing keys.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub enum Dist {
    Uniform,
    /// Zipfian with the given theta; hot keys are scattered over the key space (YCSB's
    /// "scrambled zipfian").
    Zipf(f64),
    /// Zipfian over recency: the most recently inserted keys are the hottest.
    Latest(f64),
    /// YCSB's hotspot: a share `op` of the requests goes to the first `data` share of the
    /// keys (uniformly), the rest to the others (uniformly).
    Hotspot {
        data: f64,
        op: f64,
    },
    /// YCSB's sequential: every stream walks the keys in order, from the first, and wraps.
    Sequential,
    /// YCSB's exponential over recency: `percentile`% of the requests go to the newest `frac`
    /// share of the keys, the newest the hottest.
    Exponential {
        percentile: f64,
        frac: f64,
    },
}

/// Picks keys in `[0, n)` per the distribution.
pub struct KeyChooser {
    dist: Dist,
    zipf: Option<(u64, Zipf<f64>)>,
    /// The next key of [`Dist::Sequential`].
    next_in_order: u64,
}

/// YCSB's `Utils.fnvhash64` (before its `Math.abs`): FNV-1a over the number's 8 bytes, lowest
/// first. Scatters zipfian ranks and, in YCSB's key names, the records.
pub fn fnv64(x: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in x.to_le_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

impl KeyChooser {
    pub fn new(dist: Dist) -> Self {
        KeyChooser {
            dist,
            zipf: None,
            next_in_order: 0,
        }
    }

    fn zipf_rank(&mut self, n: u64, theta: f64, rng: &mut SmallRng) -> u64 {
        let rebuild = match &self.zipf {
            Some((m, _)) => *m != n,
            None => true,
        };
        if rebuild {
            let z = Zipf::new(n.max(1) as f64, theta).expect("theta validated at startup");
            self.zipf = Some((n, z));
        }
        let (_, z) = self.zipf.as_ref().expect("set above");
        (z.sample(rng) as u64).clamp(1, n.max(1)) - 1
    }

    /// A key among the first `n` keys.
    pub fn next(&mut self, n: u64, rng: &mut SmallRng) -> u64 {
        match self.dist {
            Dist::Uniform => rng.random_range(0..n.max(1)),
            Dist::Zipf(t) => fnv64(self.zipf_rank(n, t, rng)) % n.max(1),
            Dist::Latest(t) => n.max(1) - 1 - self.zipf_rank(n, t, rng),
            Dist::Hotspot { data, op } => {
                let n = n.max(1);
                let hot = ((n as f64 * data) as u64).clamp(1, n);
                if hot == n || rng.random::<f64>() < op {
                    rng.random_range(0..hot)
                } else {
                    rng.random_range(hot..n)
                }
            }
            Dist::Sequential => {
                let k = self.next_in_order % n.max(1);
                self.next_in_order = k + 1;
                k
            }
            Dist::Exponential { percentile, frac } => {
                // YCSB: gamma = -ln(1 - percentile/100) / (n * frac); a distance back from
                // the newest key, drawn again while it falls before the first key
                let n = n.max(1);
                let gamma = -(1.0 - percentile / 100.0).ln() / (n as f64 * frac);
                loop {
                    let u: f64 = rng.random();
                    let back = (-(1.0 - u).ln() / gamma) as u64;
                    if back < n {
                        return n - 1 - back;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn counts(dist: Dist, n: u64, draws: usize) -> Vec<u64> {
        let mut c = KeyChooser::new(dist);
        let mut rng = SmallRng::seed_from_u64(7);
        let mut seen = vec![0u64; n as usize];
        for _ in 0..draws {
            let k = c.next(n, &mut rng);
            assert!(k < n, "{dist:?} chose {k} of {n}");
            seen[k as usize] += 1;
        }
        seen
    }

    /// Issue 47: YCSB's hotspot, sequential and exponential distributions, as YCSB defines
    /// them.
    #[test]
    fn hotspot_sequential_and_exponential_choose_as_ycsb_does() {
        // hotspot 0.2 / 0.8: the first 20% of the keys take about 80% of the requests
        let seen = counts(Dist::Hotspot { data: 0.2, op: 0.8 }, 1000, 100_000);
        let hot: u64 = seen[..200].iter().sum();
        assert!((78_000..82_000).contains(&hot), "{hot}");
        assert!(
            seen[200..].iter().all(|&c| c > 0),
            "every cold key is reached"
        );
        // sequential: in order, wrapping
        let mut c = KeyChooser::new(Dist::Sequential);
        let mut rng = SmallRng::seed_from_u64(1);
        let keys: Vec<u64> = (0..7).map(|_| c.next(3, &mut rng)).collect();
        assert_eq!(keys, vec![0, 1, 2, 0, 1, 2, 0]);
        // exponential 95 / 0.857: 95% of the draws within the newest 85.7% of the keys
        let n = 10_000u64;
        let seen = counts(
            Dist::Exponential {
                percentile: 95.0,
                frac: 0.857_142_857_1,
            },
            n,
            100_000,
        );
        let newest = (n as f64 * 0.857_142_857_1) as usize;
        let recent: u64 = seen[(n as usize - newest)..].iter().sum();
        // (95% within the newest 85.7%, of the draws that fall on a key: 95 / 96.97)
        assert!((97_300..98_600).contains(&recent), "{recent}");
        assert!(
            seen[n as usize - 1] > seen[0],
            "the newest key is the hottest"
        );
    }
}
