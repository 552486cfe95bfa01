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
}

/// Picks keys in `[0, n)` per the distribution.
pub struct KeyChooser {
    dist: Dist,
    zipf: Option<(u64, Zipf<f64>)>,
}

fn scramble(x: u64) -> u64 {
    // FNV-1a over the 8 bytes, as YCSB does to scatter zipfian ranks
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in x.to_le_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

impl KeyChooser {
    pub fn new(dist: Dist) -> Self {
        KeyChooser { dist, zipf: None }
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
            Dist::Zipf(t) => scramble(self.zipf_rank(n, t, rng)) % n.max(1),
            Dist::Latest(t) => n.max(1) - 1 - self.zipf_rank(n, t, rng),
        }
    }
}
