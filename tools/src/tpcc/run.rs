//! The measured run of `shoal tpcc` on the shared harness: each worker's stream of
//! transactions against its home warehouses, what it tallies, and the per-second line and
//! `--csv` row.

use super::*;
use crate::harness::{self, RunState, Stream};

/// One worker's measurements.
pub(super) struct Tally {
    pub(super) count: [u64; 5],
    pub(super) rollbacks: u64,
    /// Tries that conflicted with another transaction, per type (each was run again).
    pub(super) aborts: [u64; 5],
    pub(super) remote_warehouse: u64,
    pub(super) remote_node: u64,
    pub(super) anomalies: u64,
    pub(super) errors: u64,
    pub(super) first_error: Option<String>,
    pub(super) hist: Vec<Histogram<u64>>,
}

impl Tally {
    pub(super) fn new() -> Tally {
        Tally {
            count: [0; 5],
            rollbacks: 0,
            aborts: [0; 5],
            remote_warehouse: 0,
            remote_node: 0,
            anomalies: 0,
            errors: 0,
            first_error: None,
            hist: (0..5)
                .map(|_| Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds"))
                .collect(),
        }
    }
    pub(super) fn merge(&mut self, o: &Tally) {
        for i in 0..5 {
            self.count[i] += o.count[i];
            self.aborts[i] += o.aborts[i];
            self.hist[i].add(&o.hist[i]).expect("same bounds");
        }
        self.rollbacks += o.rollbacks;
        self.remote_warehouse += o.remote_warehouse;
        self.remote_node += o.remote_node;
        self.anomalies += o.anomalies;
        self.errors += o.errors;
        if self.first_error.is_none() {
            self.first_error.clone_from(&o.first_error);
        }
    }
}

pub(super) struct RunOut {
    pub(super) tally: Tally,
    pub(super) secs: f64,
    pub(super) threads: usize,
    /// Per node over the measured interval: node id, (remote fetches, NVMe reads, NVMe writes,
    /// and one pool's NVMe reads avoided, pages served for other homes, pages given away,
    /// pages taken in).
    pub(super) per_node: Vec<(u8, [u64; 7])>,
    /// The first node's log over the measured interval (single nodes with a log).
    pub(super) log: shoal_engine::LogCounters,
}

pub(super) fn node_counters(e: &Engine) -> [u64; 7] {
    let (s, p) = (e.stats(), e.protocol_stats());
    [
        p.requests,
        s.store_reads,
        s.store_writes,
        p.forwarded_reads,
        p.served_for_others,
        p.given_away,
        p.taken_in,
    ]
}
/// The streams of a run and what they share.
struct TpccRun<'a> {
    nodes: &'a Nodes<'a>,
    t: &'a Tables,
    a: &'a Args,
    c: &'a Constants,
    node_of: &'a [u8],
    /// Per worker thread: the warehouses it picks home warehouses from.
    homes: Vec<Vec<u16>>,
    /// Deliveries asked for while another worker delivers in the same warehouse.
    deliveries: txn::DeliveryQueue,
    /// Pacing under --rate: one transaction per stream every this long.
    pace: Option<Duration>,
    /// TPC-C's terminal times: (keying, mean think) in ms per type.
    terminal: Option<([u32; 5], [u32; 5])>,
    /// Which run on the database this is (0: its load's own run).
    run_number: u64,
    /// Transactions and NewOrders done (warm-up included), for the per-second line.
    total: AtomicU64,
    new_orders: AtomicU64,
    /// A transaction failed: the run stops (Relaxed: a stop signal; the tallies travel through
    /// the threads' joins).
    failed: AtomicBool,
    /// With --csv: the latencies (us, all types) since the last row, warm-up included.
    second: Option<std::sync::Mutex<hdrhistogram::Histogram<u64>>>,
}

impl harness::Workload for TpccRun<'_> {
    type Out = Tally;

    fn stream(&self, s: Stream, phase: &RunState) -> Tally {
        let (a, e) = (self.a, self.nodes.engines[s.engine]);
        let homes = &self.homes[s.thread];
        let id = s.index;
        let w = e.worker();
        let mut next_at = Instant::now();
        let mut ctx = txn::Ctx {
            w: &w,
            t: self.t,
            warehouses: a.warehouses,
            node_of: self.node_of,
            node: e.node_id(),
            c: *self.c,
            rng: SmallRng::seed_from_u64(a.seed.wrapping_add(1 + id as u64 * 7919)),
            // history keys: this run's, this node's, this stream's, then a count (a run on a
            // kept database writes rows of its own, never over an earlier run's)
            history_seq: (self.run_number << 56)
                | ((e.node_id() as u64) << 48)
                | ((id as u64 + 1) << 32),
            deliveries: Some(&self.deliveries),
        };
        let mut tally = Tally::new();
        // with durability "commit", a transaction counts once its log is durable
        let pipelined = a.durability == shoal_engine::Durability::Commit;
        let mut acks = crate::acks::Acks::new(a.pipeline);
        let fail = |tally: &mut Tally, ty: usize, e: &dyn std::fmt::Display| {
            // (it wrote nothing: see txn::Ctx::run) A failed transaction makes the run's
            // numbers meaningless, in warm-up too: stop the run.
            tally.errors += 1;
            tally.first_error = Some(format!("{}: {e}", txn::TYPES[ty]));
            self.failed.store(true, Ordering::Relaxed);
        };
        loop {
            if phase.stopped() {
                break;
            }
            let ty = txn::pick(&a.weights, &mut ctx.rng);
            let home = homes[ctx.rng.random_range(0..homes.len())];
            if let Some((keying, _)) = self.terminal {
                // the terminal's keying time (not part of the latency)
                let at = Instant::now() + Duration::from_millis(keying[ty].into());
                harness::wait_until(at, phase);
                if phase.stopped() {
                    break;
                }
            }
            // with --rate, latency counts from the intended start
            let t0 = match self.pace {
                Some(p) => {
                    next_at += p;
                    harness::wait_until(next_at, phase);
                    next_at
                }
                None => Instant::now(),
            };
            let mut done = |t0: Instant, (ty, d): (usize, txn::Done)| {
                self.total.fetch_add(1, Ordering::Relaxed);
                if ty == 0 && !d.rolled_back {
                    self.new_orders.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(m) = &self.second {
                    let us = t0.elapsed().as_micros() as u64;
                    if let Ok(mut h) = m.lock() {
                        h.saturating_record(us.max(1));
                    }
                }
                if !phase.measuring() {
                    return;
                }
                let us = t0.elapsed().as_micros() as u64;
                tally.count[ty] += 1;
                tally.hist[ty].saturating_record(us.max(1));
                tally.rollbacks += d.rolled_back as u64;
                tally.aborts[ty] += d.aborts as u64;
                tally.remote_warehouse += d.remote_warehouse as u64;
                tally.remote_node += d.remote_node as u64;
                tally.anomalies += d.anomaly as u64;
            };
            let r = if pipelined {
                ctx.run_later(ty, home).and_then(|(d, point)| {
                    acks.push(ctx.w, point, t0, (ty, d), &mut done)
                        .map_err(txn::TxError::Commit)
                })
            } else {
                ctx.run(ty, home).map(|d| done(t0, (ty, d)))
            };
            if let Err(e) = r {
                fail(&mut tally, ty, &e);
                break;
            }
            if let Some((_, think)) = self.terminal {
                let at = Instant::now() + txn::think_time(think[ty], &mut ctx.rng);
                harness::wait_until(at, phase);
            }
            // a task gives the thread's other tasks a turn (nothing outside tasks)
            shoal_engine::tasks::yield_now();
        }
        // what is still waiting was committed after the measurement: not counted
        if let Err(e) = acks.drain(ctx.w, |_, _| {}) {
            fail(&mut tally, 0, &e);
        }
        tally
    }
}

/// The supervisor of a TPC-C run: the per-second line and `--csv` row, the counters at the
/// start of the measurement, and the stop when a transaction failed.
struct TpccWatch<'a> {
    run: &'a TpccRun<'a>,
    csv: Option<std::io::BufWriter<std::fs::File>>,
    start: Instant,
    /// The time, transactions and NewOrders of the last line.
    last: (Instant, u64, u64),
    before: Vec<[u64; 7]>,
    log0: shoal_engine::LogCounters,
}

impl TpccWatch<'_> {
    fn counts(&self) -> (Instant, u64, u64) {
        (
            Instant::now(),
            self.run.total.load(Ordering::Relaxed),
            self.run.new_orders.load(Ordering::Relaxed),
        )
    }
}

impl harness::Supervisor for TpccWatch<'_> {
    fn measuring(&mut self) {
        let engines = &self.run.nodes.engines;
        self.before = engines.iter().map(|e| node_counters(e)).collect();
        self.log0 = engines[0].stats().log;
        // (`last` is kept: the warm-up's last second, whose line comes right after this when
        // the warm-up is whole seconds, reports its own rate, not zero)
    }

    fn second(&mut self, _tick: u64, warm: bool, _whole: bool) -> anyhow::Result<()> {
        let quiet = self.run.a.quiet;
        if quiet && self.csv.is_none() {
            return Ok(());
        }
        let now = self.counts();
        let secs = now.0.duration_since(self.last.0).as_secs_f64().max(1e-9);
        let (tps, nopm) = (
            (now.1 - self.last.1) as f64 / secs,
            (now.2 - self.last.2) as f64 / secs * 60.0,
        );
        if !quiet {
            say!("{tps:>10.0} txn/s  {nopm:>10.0} NewOrders/min");
        }
        if let Some(f) = &mut self.csv {
            use std::io::Write as _;
            // this second's latencies (taken and cleared: the next row starts afresh)
            let (p50, p99) = match &self.run.second {
                Some(m) => {
                    let mut h = m.lock().unwrap_or_else(|p| p.into_inner());
                    let q = (h.value_at_quantile(0.5), h.value_at_quantile(0.99));
                    h.reset();
                    q
                }
                None => (0, 0),
            };
            let _ = writeln!(
                f,
                "{:.3},{},{tps:.1},{nopm:.1},{p50},{p99}",
                self.start.elapsed().as_secs_f64(),
                if warm { "warmup" } else { "measure" }
            );
        }
        self.last = now;
        Ok(())
    }

    fn failed(&self) -> bool {
        self.run.failed.load(Ordering::Relaxed)
    }
}

/// Run the transaction mix for `a`'s warm-up and duration on every node of `nodes`.
pub(super) fn run_phase(
    nodes: &Nodes,
    t: &Tables,
    a: &Args,
    c: &Constants,
    node_of: &[u8],
    run_number: u64,
) -> anyhow::Result<RunOut> {
    // (engine index, the warehouses the worker picks home warehouses from), per worker thread
    let mut plan: Vec<(usize, Vec<u16>)> = Vec::new();
    for (ix, e) in nodes.engines.iter().enumerate() {
        let (lo, hi) = share(a.warehouses, e.node_id() as usize, nodes.cluster);
        match a.mode {
            Mode::Affinity => {
                let workers = a.workers.min((hi - lo + 1) as usize);
                if workers < a.workers {
                    say!(
                        "note: affinity mode runs one worker per warehouse: {workers} on node {} \
                         ({} warehouses there), not the {} asked for",
                        e.node_id(),
                        hi - lo + 1,
                        a.workers
                    );
                }
                for k in 0..workers {
                    let mine = (lo..=hi)
                        .filter(|x| (x - lo) as usize % workers == k)
                        .collect();
                    plan.push((ix, mine));
                }
            }
            Mode::Locality => {
                for _ in 0..a.workers {
                    plan.push((ix, (lo..=hi).collect()));
                }
            }
            Mode::Uniform => {
                for _ in 0..a.workers {
                    plan.push((ix, (1..=a.warehouses).collect()));
                }
            }
        }
    }
    let threads = plan.len();
    let csv = match &a.csv {
        Some(p) => {
            use std::io::Write as _;
            let mut f = std::fs::File::create(p)
                .map(std::io::BufWriter::new)
                .map_err(|e| anyhow::anyhow!("--csv {}: {e}", p.display()))?;
            writeln!(f, "time_s,phase,txn_per_s,new_orders_per_min,p50_us,p99_us")
                .map_err(|e| anyhow::anyhow!("--csv {}: {e}", p.display()))?;
            Some(f)
        }
        None => None,
    };
    let engines: Vec<usize> = plan.iter().map(|(ix, _)| *ix).collect();
    let run = TpccRun {
        nodes,
        t,
        a,
        c,
        node_of,
        homes: plan.into_iter().map(|(_, h)| h).collect(),
        deliveries: txn::DeliveryQueue::new(a.warehouses),
        // each stream's share of --rate: one transaction every `pace`
        pace: a
            .rate
            .map(|r| Duration::from_secs_f64((threads * a.tasks) as f64 / r)),
        terminal: a.terminal_times(),
        run_number,
        total: AtomicU64::new(0),
        new_orders: AtomicU64::new(0),
        failed: AtomicBool::new(false),
        second: a
            .csv
            .as_ref()
            .map(|_| std::sync::Mutex::new(crate::report::hist())),
    };
    let start = Instant::now();
    let mut watch = TpccWatch {
        run: &run,
        csv,
        start,
        last: (start, 0, 0),
        before: Vec::new(),
        log0: Default::default(),
    };
    let timing = harness::Timing {
        warmup: Duration::from_secs_f64(a.warmup),
        duration: Duration::from_secs_f64(a.duration),
        // a failed transaction stops the run within this
        poll: Some(Duration::from_millis(200)),
        until_all_finished: false,
    };
    let ran = harness::run(&engines, a.tasks, timing, &run, &mut watch)?;
    let after: Vec<[u64; 7]> = nodes.engines.iter().map(|e| node_counters(e)).collect();
    let log1 = nodes.engines[0].stats().log;
    if watch.before.is_empty() {
        // stopped before the measurement began
        harness::Supervisor::measuring(&mut watch);
    }
    if let Some(mut f) = watch.csv.take() {
        use std::io::Write as _;
        if let Err(e) = f.flush() {
            eprintln!("--csv: {e}");
        }
    }
    let mut all = Tally::new();
    for thread in ran.threads {
        match thread {
            Ok(tallies) => tallies.iter().for_each(|t| all.merge(t)),
            Err(e) => {
                all.errors += 1;
                all.first_error.get_or_insert(e);
            }
        }
    }
    if all.errors == 0 && !run.deliveries.is_empty() {
        // (a worker runs the queue it takes empty before it stops; only an error ends one
        // with Deliveries left)
        all.errors += 1;
        all.first_error
            .get_or_insert_with(|| "delivery: queued Deliveries were never run".into());
    }
    Ok(RunOut {
        tally: all,
        secs: ran.measured,
        threads,
        per_node: nodes
            .engines
            .iter()
            .zip(watch.before.iter().zip(&after))
            .map(|(e, (b, a))| (e.node_id(), [0, 1, 2, 3, 4, 5, 6].map(|i| a[i] - b[i])))
            .collect(),
        log: log1.since(&watch.log0),
    })
}
