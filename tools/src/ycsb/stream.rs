//! One stream of YCSB operations (a worker, or a task of one): which keys it reads, updates
//! and inserts, what it checks in every value, and its latencies.

use super::*;
use crate::harness::{self, RunState};

#[repr(align(64))]
#[derive(Default)]
pub(super) struct Counter(pub(super) AtomicU64);

/// One node's inserts during a run: the numbers handed out, and how many of them, from the
/// first, returned (YCSB's acknowledged counter): reads of the latest keys read only keys
/// whose inserts returned, never one still on its way.
#[derive(Default)]
pub(super) struct Inserts {
    /// The next insert number to hand out.
    started: AtomicU64,
    /// Every insert numbered below this one returned.
    acked: AtomicU64,
    /// Inserts that returned above `acked` (an earlier one is still on its way).
    early: std::sync::Mutex<std::collections::BTreeSet<u64>>,
}

impl Inserts {
    /// The number of a new insert.
    pub(super) fn begin(&self) -> u64 {
        self.started.fetch_add(1, Ordering::Relaxed)
    }

    /// Insert `n` returned.
    pub(super) fn done(&self, n: u64) {
        let mut early = self.early.lock().unwrap_or_else(|p| p.into_inner());
        early.insert(n);
        let mut acked = self.acked.load(Ordering::Relaxed);
        while early.remove(&acked) {
            acked += 1;
        }
        // Release: a reader that sees `acked` sees the inserts below it done (their tree
        // writes happened before their `done`)
        self.acked.store(acked, Ordering::Release);
    }

    /// How many inserts, from the first, returned.
    pub(super) fn acked(&self) -> u64 {
        self.acked.load(Ordering::Acquire)
    }

    /// How many insert numbers were handed out (the keys the run took).
    pub(super) fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }
}

#[derive(Default)]
pub(super) struct WorkerResult {
    /// Latencies per operation type (indexed as [`OP_NAMES`]), from each operation's start
    /// (its service time, YCSB's `[READ]`).
    pub(super) hists: Vec<Histogram<u64>>,
    /// Under --target: latencies from each operation's intended start, queueing included
    /// (YCSB's `[Intended-READ]`); empty otherwise.
    pub(super) intended: Vec<Histogram<u64>>,
    pub(super) ops: [u64; 5],
    pub(super) errors: u64,
    pub(super) misses: u64,
    pub(super) first_error: Option<String>,
}

pub(super) fn op_index(op: Op) -> usize {
    match op {
        Op::Read => 0,
        Op::Update => 1,
        Op::Insert => 2,
        Op::Scan => 3,
        Op::ReadModifyWrite => 4,
    }
}

pub(super) const OP_NAMES: [&str; 5] = ["read", "update", "insert", "scan", "rmw"];

/// Which keys a node loads, reads and inserts.
#[derive(Clone, Copy)]
pub(super) struct Keys {
    pub(super) records: u64,
    /// The loaded keys a run's reads and updates choose from: `first..first + count` (YCSB's
    /// insertstart and insertcount; all of `0..records` unless they say otherwise).
    pub(super) first: u64,
    pub(super) count: u64,
    /// The key of the first insert (past the loaded keys and earlier runs' inserts).
    pub(super) next_key: u64,
    pub(super) node: u64,
    pub(super) nodes: u64,
    pub(super) partitioned: bool,
}

impl Keys {
    /// The node's share of the loaded keys.
    pub(super) fn share(&self) -> (u64, u64) {
        (
            self.first + self.count * self.node / self.nodes,
            self.first + self.count * (self.node + 1) / self.nodes,
        )
    }
    /// A loaded key (for updates), from the node's share when partitioned.
    pub(super) fn existing(&self, c: &mut KeyChooser, rng: &mut SmallRng) -> u64 {
        if self.partitioned {
            let (lo, hi) = self.share();
            lo + c.next((hi - lo).max(1), rng).min(hi - lo - 1)
        } else {
            self.first + c.next(self.count, rng)
        }
    }
    /// A key that is loaded or was inserted during the run (reads, scans): `inserted` is how
    /// many inserts every node has seen return (node `i`'s `n`-th insert is
    /// [`Keys::inserted`]`(n)` there, so every key below the bound is in the tree; a process
    /// of a tcp cluster sees only its own node's and takes the others' to be as many). The
    /// chooser ranks the loaded keys first, then the inserted ones (`records..`) in order.
    pub(super) fn live(&self, c: &mut KeyChooser, inserted: u64, rng: &mut SmallRng) -> u64 {
        if self.partitioned {
            return self.existing(c, rng);
        }
        let i = c.next(
            self.count + (self.next_key - self.records) + inserted * self.nodes,
            rng,
        );
        if i < self.count {
            self.first + i
        } else {
            self.records + (i - self.count)
        }
    }
    /// The `n`-th key this node inserts (nodes insert disjoint keys).
    pub(super) fn inserted(&self, n: u64) -> u64 {
        self.next_key + n * self.nodes + self.node
    }
}

/// A worker's part of `--operations` (measured operations, then it stops) and of `--target`
/// (one operation started every `pace`), and where it records each second's latencies
/// (`--csv`, `--hdr`: per operation type, taken by the supervisor every second).
#[derive(Clone, Copy)]
pub(super) struct Share<'a> {
    pub(super) quota: Option<u64>,
    pub(super) pace: Option<Duration>,
    pub(super) interval: Option<&'a std::sync::Mutex<Vec<Histogram<u64>>>>,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn worker_loop(
    engine: &Engine,
    tree: &BTree,
    a: &Args,
    plan: &Plan,
    keys: Keys,
    t: usize,
    share: Share<'_>,
    phase: &RunState,
    counter: &AtomicU64,
    (inserts, mine): (&[Inserts], &Inserts),
) -> Result<WorkerResult, TreeError> {
    let w = engine.worker();
    // one stream per worker of each node, all from the run's seed
    let mut rng = SmallRng::seed_from_u64(
        plan.seed ^ (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (keys.node << 48),
    );
    let mut chooser = KeyChooser::new(plan.dist);
    let mut hists: Vec<Histogram<u64>> = (0..5).map(|_| crate::report::hist()).collect();
    let mut intended: Vec<Histogram<u64>> = match share.pace {
        Some(_) => (0..5).map(|_| crate::report::hist()).collect(),
        None => Vec::new(),
    };
    let mut res = WorkerResult::default();
    let mut buf = Vec::with_capacity(a.value_size);
    let mut val = vec![0u8; a.value_size];
    let (names, mut key, mut other) = (plan.names, Vec::new(), Vec::new());
    let mut measuring = false;
    let mut n_ops = 0u64;
    let pipelined = a.durability == shoal_engine::Durability::Commit;
    let mut acks = crate::acks::Acks::new(a.pipeline);
    let layout = plan.layout;
    // scanlengthdistribution=zipfian: lengths 1..=max_scan, the shortest the most likely
    let scan_zipf = (a.scan_length_distribution == ScanLengths::Zipfian)
        .then(|| rand_distr::Zipf::new(a.max_scan as f64, 0.99))
        .and_then(Result::ok);
    let note = |res: &mut WorkerResult, msg: String| {
        res.errors += 1;
        if res.first_error.is_none() {
            res.first_error = Some(msg);
        }
    };
    // the intended start of the next operation under --target
    let mut next_at = Instant::now();
    loop {
        if phase.stopped() {
            break;
        }
        if !measuring && phase.measuring() {
            measuring = true;
            hists.iter_mut().for_each(Histogram::reset);
            intended.iter_mut().for_each(Histogram::reset);
            res.ops = [0; 5];
        }
        if measuring
            && share
                .quota
                .is_some_and(|q| res.ops.iter().sum::<u64>() >= q)
        {
            break; // this worker's share of --operations is done
        }
        let op = plan.mix.pick(&mut rng);
        let live = inserts.iter().map(Inserts::acked).min().unwrap_or(0);
        // with --target, latency counts from the intended start (queueing included)
        let t0 = match share.pace {
            Some(p) => {
                next_at += p;
                harness::wait_until(next_at, phase);
                next_at
            }
            None => Instant::now(),
        };
        // the operation's own start (later than `t0` when the run is behind its schedule)
        let started = Instant::now();
        let mut ack = false;
        match op {
            Op::Read => {
                let k = keys.live(&mut chooser, live, &mut rng);
                let found = if plan.read_one {
                    // one field (readallfields=false): only its bytes are copied and checked
                    let f = rng.random_range(0..layout.fields());
                    let found =
                        tree.lookup_part(&w, names.key(k, &mut key), layout.range(f), &mut buf)?;
                    if found && !(buf.len() == layout.field && layout.check_field(&buf, k, f)) {
                        note(
                            &mut res,
                            format!("read of field {f} of key {k}: a bad field"),
                        );
                    }
                    found
                } else {
                    let found = tree.lookup(&w, names.key(k, &mut key), &mut buf)?;
                    if found && !layout.check(&buf, k) {
                        note(&mut res, format!("read of key {k} returned a bad value"));
                    }
                    found
                };
                if !found && k < a.records {
                    note(&mut res, format!("loaded key {k} not found"));
                } else if !found {
                    res.misses += 1;
                }
            }
            Op::Update | Op::ReadModifyWrite => {
                let k = keys.existing(&mut chooser, &mut rng);
                let salt: u32 = rng.random();
                let mut bad = false;
                let rmw = op == Op::ReadModifyWrite;
                // writeallfields=false: one field, chosen at random
                let one = plan.write_one.then(|| rng.random_range(0..layout.fields()));
                let found = tree.update(&w, names.key(k, &mut key), |v| {
                    // updates check what they overwrite, too
                    bad = !layout.check(v, k);
                    let part = match one {
                        Some(f) => layout.range(f),
                        None => 0..v.len(),
                    };
                    let s = if rmw {
                        value::salt(&v[part.clone()]).wrapping_add(1)
                    } else {
                        salt
                    };
                    match one {
                        Some(f) if part.end <= v.len() => layout.fill_field(&mut v[part], k, f, s),
                        _ => layout.fill(v, k, s),
                    }
                })?;
                ack = true;
                if !found {
                    note(&mut res, format!("update of loaded key {k}: not found"));
                } else if bad {
                    note(&mut res, format!("update of key {k} found a bad value"));
                }
            }
            Op::Insert => {
                let n = mine.begin();
                let k = keys.inserted(n);
                val.resize(layout.size_of(k), 0);
                layout.fill(&mut val, k, 0);
                if !tree.insert(&w, names.key(k, &mut key), &val)?.inserted() {
                    note(&mut res, format!("insert of new key {k}: already present"));
                }
                mine.done(n);
                ack = true;
            }
            Op::Scan => {
                let k = keys.live(&mut chooser, live, &mut rng);
                let len = match &scan_zipf {
                    Some(z) => (rand_distr::Distribution::sample(z, &mut rng) as usize)
                        .clamp(1, a.max_scan),
                    None => rng.random_range(1..=a.max_scan),
                };
                let mut seen = 0;
                let mut bad: Option<String> = None;
                let from = names.key(k, &mut key);
                tree.scan(&w, from, Direction::Ascending, |key, v| {
                    let kk = names.number(key, v, &mut other);
                    if bad.is_none() && (key < from || !kk.is_some_and(|kk| layout.check(v, kk))) {
                        bad = Some(format!(
                            "scan from {k} returned a bad entry for key {}",
                            String::from_utf8_lossy(key)
                        ));
                    }
                    seen += 1;
                    seen < len
                })?;
                if let Some(m) = bad {
                    note(&mut res, m);
                }
            }
        }
        let mut done = |t0: Instant, (op, started): (usize, Instant)| {
            let ns = started.elapsed().as_nanos().max(1) as u64;
            if measuring {
                let _ = hists[op].record(ns);
                if let Some(h) = intended.get_mut(op) {
                    let _ = h.record(t0.elapsed().as_nanos().max(1) as u64);
                }
                res.ops[op] += 1;
            }
            if let Some(m) = share.interval {
                if let Ok(mut h) = m.lock() {
                    let _ = h[op].record(ns);
                }
            }
            n_ops += 1;
        };
        if ack && pipelined {
            // counted when durable
            acks.push(
                &w,
                w.commit_later()?,
                t0,
                (op_index(op), started),
                &mut done,
            )?;
        } else {
            if ack {
                w.commit()?; // durability none or flush-every-ms: returns at once
            }
            done(t0, (op_index(op), started));
            acks.poll(&w, &mut done)?;
        }
        counter.store(n_ops, Ordering::Relaxed);
        // a task gives the thread's other tasks a turn every few operations (nothing
        // outside tasks)
        shoal_engine::tasks::turn();
    }
    // the writes still waiting were made after the measurement ended: not counted
    acks.drain(&w, |_, _| {})?;
    res.hists = hists;
    res.intended = intended;
    Ok(res)
}
