//! `shoal ycsb`: load a table of `--records` keys, then run a YCSB core workload for
//! `--duration` seconds after `--warmup`, printing one line per second and a summary (and JSON
//! with `--json`). Every value read is checked (see [`crate::value`]); a run with value errors
//! exits with status 1.

mod props;
mod tcp;

use crate::cli::{parse_wal_size, ClusterArgs, Nodes, Transport};
use crate::value;
use crate::workload::{Dist, KeyChooser, Mix, Op};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use shoal_btree::{decode_u64, u64_key, BTree, Direction, TreeError, MAX_VALUE};
use shoal_engine::{
    format_bytes, Cluster, ClusterFile, Engine, EngineConfig, ProtocolStats, StatsSnapshot,
};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

const TABLE: &str = "usertable";
/// Where `shoal ycsb load` / `run` keep the data set without `--data-dir`.
const DEFAULT_DATA_SET_DIR: &str = "shoal-ycsb-data";

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Distribution {
    Uniform,
    Zipf,
    Latest,
}

/// Which part of a YCSB run to do.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Load the table into an empty --data-dir, close it, stop.
    Load,
    /// Run the workload on the table a `load` left in --data-dir (checked first).
    Run,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Random,
    Partitioned,
}

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// `load`: load the table into an empty --data-dir and stop; `run`: run the workload on
    /// the table a load left there (YCSB's two phases: load once, run many times). Without
    /// it: both, on a fresh directory.
    #[arg(value_enum)]
    pub phase: Option<Phase>,
    /// A YCSB workload file (`key=value` properties, e.g. workloads/workloada); several are
    /// read in order. Flags given on the command line override its properties.
    #[arg(short = 'P', value_name = "FILE")]
    pub property_files: Vec<PathBuf>,
    /// A YCSB property, e.g. `-p recordcount=1000000` (overrides -P files).
    #[arg(short = 'p', value_name = "KEY=VALUE")]
    pub properties: Vec<String>,
    /// Operations to run (YCSB's operationcount), shared by all workers; the run ends when
    /// they are done (or after --duration if that is given too).
    #[arg(long)]
    pub operations: Option<u64>,
    /// Target throughput in operations per second over all workers (YCSB's -target). Each
    /// worker starts its operations on a fixed schedule, and latencies are measured from the
    /// intended start: a run that falls behind shows its queueing in the latencies.
    #[arg(long)]
    pub target: Option<f64>,
    /// Write one CSV row per second: throughput (all and per operation type), the latency
    /// percentiles of that second, hit ratio, remote fetches, NVMe reads and writes (all and
    /// per node). `shoal plot` draws it.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write each second's latencies as an HdrHistogram interval log (a histogram per
    /// operation type and second, tagged with the type), for HdrHistogram's own tools.
    #[arg(long)]
    pub hdr: Option<PathBuf>,
    /// Flags given on the command line (set by main; properties do not override them).
    #[arg(skip)]
    pub explicit: Vec<String>,
    /// The value size came from fieldcount x fieldlength (for messages).
    #[arg(skip)]
    pub value_from_fields: Option<(u64, u64)>,
    /// When changes become durable: none (only a clean end; a crash loses changes since),
    /// commit (each write/transaction waits for the log: group commit), or flush-every-ms=N
    /// (the log is flushed every N ms; a crash loses at most that). Single nodes only;
    /// docs/durability.md.
    #[arg(long, default_value = "none", value_parser = shoal_engine::Durability::parse)]
    pub durability: shoal_engine::Durability,
    /// Size of the write-ahead log file with a log, e.g. 256MiB, 1GiB (preallocated at start;
    /// a checkpoint begins when half is in use).
    #[arg(long, default_value = "1GiB", value_parser = parse_wal_size)]
    pub wal_size: u64,
    #[command(flatten)]
    pub net: ClusterArgs,
    /// Worker threads per node.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Tasks per worker thread (1: no tasks). Each task runs its own stream of operations; a
    /// task that misses (NVMe read, remote fetch) pauses and the thread runs another, so one
    /// thread keeps many reads in flight (docs/ycsb.md, "Tasks").
    #[arg(long, default_value_t = 1)]
    pub tasks: usize,
    /// Records loaded before the run.
    #[arg(long, default_value_t = 200_000)]
    pub records: u64,
    /// Value size in bytes (keys are 8 bytes).
    #[arg(long, default_value_t = 128)]
    pub value_size: usize,
    /// YCSB core workload: a (50/50 read/update), b (95/5), c (read only), d (read latest, 5%
    /// inserts), e (short scans, 5% inserts), f (read-modify-write).
    #[arg(long, default_value = "a")]
    pub workload: String,
    /// Fraction of reads (the rest are updates); overrides the workload's mix.
    #[arg(long)]
    pub read_ratio: Option<f64>,
    /// Request distribution. As in YCSB's core workloads, the default is zipfian (scrambled:
    /// the hot keys are spread over the key space), and latest for workload d; `uniform` gives
    /// the shape of Shoal's runs before 2026-11-25 (docs/BENCHMARKS.md).
    #[arg(long, value_enum)]
    pub distribution: Option<Distribution>,
    /// Zipfian skew (YCSB's default is 0.99).
    #[arg(long, default_value_t = 0.99)]
    pub zipf_theta: f64,
    /// Which keys a node's workers touch: random (all keys) or partitioned (the node's share).
    #[arg(long, value_enum, default_value = "random")]
    pub access: Access,
    /// Page cache per node, e.g. 64MiB, 1GiB; or one per node, separated by commas
    /// (`--nodes 2 --cache 32MiB,512MiB`).
    #[arg(long, default_value = "256MiB")]
    pub cache: String,
    /// Data directory (default: a temporary directory, removed after the run); node i of a
    /// cluster uses its subdirectory `node<i>`.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Device files to stripe each node's store over.
    #[arg(long, default_value_t = 1)]
    pub devices: usize,
    /// Seconds to run before measuring.
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    /// Seconds to measure.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Longest scan of workload e.
    #[arg(long, default_value_t = 100)]
    pub max_scan: usize,
    /// With --durability commit: writes a worker may have waiting for the log at once. Each
    /// is acknowledged (counted, its latency taken) only when durable; the worker goes on with
    /// its next operation meanwhile. 0: each write waits for its flush first.
    #[arg(long, default_value_t = 10_000)]
    pub pipeline: usize,
    /// Seed of the workers' random choices (keys, operations); default: a fresh one, printed
    /// in the JSON report. The same seed gives the same sequence per worker (their
    /// interleaving still varies).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write the results as JSON to this file (`-`: standard output; the per-second lines and
    /// the summary then go to standard error).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No per-second lines and no progress bar.
    #[arg(long)]
    pub quiet: bool,
}

struct Plan {
    phase: Option<Phase>,
    mix: Mix,
    dist: Dist,
    /// Cache of each node (`--cache`, one entry per node).
    caches: Vec<usize>,
    label: String,
    seed: u64,
    started: std::time::SystemTime,
}

fn validate(a: &Args, mix_from_props: Option<Mix>) -> anyhow::Result<Plan> {
    a.net.validate()?;
    if a.phase.is_some() && (a.net.transport == Transport::Tcp || a.net.cluster.is_some()) {
        return Err(anyhow::anyhow!(
            "shoal ycsb load/run: tcp clusters not yet (use --nodes N over mem, or the one-shot \
             command)"
        ));
    }
    if a.operations == Some(0) {
        return Err(anyhow::anyhow!("--operations must be at least 1"));
    }
    if let Some(t) = a.target {
        if !(t.is_finite() && t > 0.0) {
            return Err(anyhow::anyhow!("--target {t}: operations per second, > 0"));
        }
    }
    if a.records == 0 {
        return Err(anyhow::anyhow!("--records must be at least 1"));
    }
    if a.records < a.net.nodes as u64 {
        return Err(anyhow::anyhow!(
            "--records {}: every node loads a share, so use at least --nodes ({})",
            a.records,
            a.net.nodes
        ));
    }
    if a.workers == 0 || a.workers > 1024 {
        return Err(anyhow::anyhow!("--workers {}: use 1 to 1024", a.workers));
    }
    if a.tasks == 0 || a.tasks > shoal_engine::tasks::MAX_TASKS {
        return Err(anyhow::anyhow!(
            "--tasks {}: use 1 to {}",
            a.tasks,
            shoal_engine::tasks::MAX_TASKS
        ));
    }
    // larger than a leaf's record (8-byte keys): kept in overflow pages, a page or more each
    let max_value = MAX_VALUE;
    if a.value_size < value::MIN_VALUE || a.value_size > max_value {
        return Err(anyhow::anyhow!(
            "--value-size {}: values hold their key and a checksum, so use {} to {max_value} bytes",
            a.value_size,
            value::MIN_VALUE
        ));
    }
    if a.zipf_theta.is_nan() || a.zipf_theta <= 0.0 || a.zipf_theta > 3.0 {
        return Err(anyhow::anyhow!(
            "--zipf-theta {}: use a value in (0, 3]",
            a.zipf_theta
        ));
    }
    crate::cli::check_run_secs(a.duration, a.warmup)?;
    if a.max_scan == 0 {
        return Err(anyhow::anyhow!("--max-scan must be at least 1"));
    }
    let wl = a.workload.to_ascii_lowercase();
    let wc = wl.chars().next().filter(|_| wl.len() == 1);
    let mut mix = wc
        .and_then(Mix::of)
        .ok_or_else(|| anyhow::anyhow!("--workload {}: use one of a, b, c, d, e, f", a.workload))?;
    let mut label = format!("workload {wl}");
    if let Some(m) = mix_from_props {
        mix = m;
        label = props::label(a).unwrap_or_else(|| "properties".into());
    }
    if let Some(r) = a.read_ratio {
        if !(0.0..=1.0).contains(&r) {
            return Err(anyhow::anyhow!(
                "--read-ratio {r}: use a fraction in [0, 1]"
            ));
        }
        mix = Mix::read_ratio(r);
        label = format!("read ratio {r}");
    }
    let dist = match a.distribution {
        Some(Distribution::Uniform) => Dist::Uniform,
        Some(Distribution::Zipf) => Dist::Zipf(a.zipf_theta),
        Some(Distribution::Latest) => Dist::Latest(a.zipf_theta),
        None if wc == Some('d') => Dist::Latest(a.zipf_theta),
        None => Dist::Zipf(a.zipf_theta),
    };
    let caches = crate::cli::parse_caches(&a.cache, a.net.nodes)?;
    Ok(Plan {
        phase: a.phase,
        mix,
        dist,
        caches,
        label,
        seed: a.seed.unwrap_or_else(crate::report::fresh_seed),
        started: std::time::SystemTime::now(),
    })
}

#[repr(align(64))]
#[derive(Default)]
struct Counter(AtomicU64);

const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

#[derive(Default)]
struct WorkerResult {
    /// Latencies per operation type (indexed as [`OP_NAMES`]).
    hists: Vec<Histogram<u64>>,
    ops: [u64; 5],
    errors: u64,
    misses: u64,
    first_error: Option<String>,
}

fn op_index(op: Op) -> usize {
    match op {
        Op::Read => 0,
        Op::Update => 1,
        Op::Insert => 2,
        Op::Scan => 3,
        Op::ReadModifyWrite => 4,
    }
}
const OP_NAMES: [&str; 5] = ["read", "update", "insert", "scan", "rmw"];

/// Which keys a node loads, reads and inserts.
#[derive(Clone, Copy)]
struct Keys {
    records: u64,
    /// The key of the first insert (past the loaded keys and earlier runs' inserts).
    next_key: u64,
    node: u64,
    nodes: u64,
    partitioned: bool,
}

impl Keys {
    /// The node's share of the loaded keys.
    fn share(&self) -> (u64, u64) {
        (
            self.records * self.node / self.nodes,
            self.records * (self.node + 1) / self.nodes,
        )
    }
    /// A loaded key (for updates), from the node's share when partitioned.
    fn existing(&self, c: &mut KeyChooser, rng: &mut SmallRng) -> u64 {
        if self.partitioned {
            let (lo, hi) = self.share();
            lo + c.next((hi - lo).max(1), rng).min(hi - lo - 1)
        } else {
            c.next(self.records, rng)
        }
    }
    /// A key that may have been inserted during the run (reads, scans): `inserted` is this
    /// node's insert count; every node inserts about as many.
    fn live(&self, c: &mut KeyChooser, inserted: u64, rng: &mut SmallRng) -> u64 {
        if self.partitioned {
            self.existing(c, rng)
        } else {
            c.next(self.next_key + inserted * self.nodes, rng)
        }
    }
    /// The `n`-th key this node inserts (nodes insert disjoint keys).
    fn inserted(&self, n: u64) -> u64 {
        self.next_key + n * self.nodes + self.node
    }
}

/// Run `shoal ycsb`.
pub fn run(mut a: Args) -> anyhow::Result<ExitCode> {
    if a.phase.is_some() && a.data_dir.is_none() {
        // the phases keep the data set: by default in ./shoal-ycsb-data
        a.data_dir = Some(PathBuf::from(DEFAULT_DATA_SET_DIR));
    }
    let props = props::collect(&a)?;
    let explicit = a.explicit.clone();
    let mix = props::apply(&mut a, &props, &explicit)?;
    if a.operations.is_some()
        && !explicit.iter().any(|e| e == "duration")
        && !props.contains_key("maxexecutiontime")
    {
        a.duration = 1e7; // until the operations are done
    }
    if let (Some(Phase::Run), Some(d)) = (a.phase, a.data_dir.as_deref()) {
        // the run uses the loaded shape; flags that disagree are an error
        let set = DataSet::read(d)?;
        set.matches(&a)?;
        a.records = set.records;
        a.value_size = set.value_size;
    }
    let plan = validate(&a, mix)?;
    if let Some(p) = &a.json {
        crate::cli::check_output("--json", p)?;
    }
    for (flag, p) in [("--csv", &a.csv), ("--hdr", &a.hdr)] {
        if let Some(p) = p {
            if p == std::path::Path::new("-") {
                return Err(anyhow::anyhow!(
                    "{flag}: give a file (standard output is for --json -)"
                ));
            }
            crate::cli::check_output(flag, p)?;
        }
    }
    if (a.csv.is_some() || a.hdr.is_some())
        && a.net.transport == Transport::Tcp
        && a.net.cluster.is_none()
    {
        return Err(anyhow::anyhow!(
            "--csv/--hdr with --transport tcp: not yet (each node can write its own with --cluster)"
        ));
    }
    crate::report::json_takes_stdout(a.json.as_deref());
    if a.net.cluster.is_none() && a.net.transport == Transport::Tcp {
        return tcp::run_local(&a, &plan);
    }
    let (dir, _tmp) = match (a.phase, a.data_dir.as_deref()) {
        (Some(Phase::Run), Some(d)) => (d.to_path_buf(), None),
        (_, d) => crate::cli::data_dir(d, "ycsb")?,
    };
    let node_cfg = |i: u8| {
        let d = if a.net.nodes > 1 {
            dir.join(format!("node{i}"))
        } else {
            dir.clone()
        };
        let mut cfg = EngineConfig::new(d, plan.caches[i as usize]);
        cfg.one_pool = !a.net.no_one_pool;
        if a.phase == Some(Phase::Run) {
            cfg.mode = shoal_engine::OpenMode::Open;
        }
        cfg.devices = a.devices;
        cfg.durability = a.durability;
        cfg.wal_bytes = a.wal_size;
        cfg.roll_back = Some(shoal_btree::roll_back());
        cfg
    };
    if let (Some(path), Some(id)) = (&a.net.cluster, a.net.id) {
        let file = ClusterFile::load(path).map_err(anyhow::Error::from)?;
        return crate::cli::run_as_member(&file, id, |nodes| drive(nodes, &a, &plan));
    }
    if a.net.nodes == 1 {
        let engine = Engine::open(node_cfg(0)).map_err(anyhow::Error::from)?;
        let nodes = Nodes {
            engines: vec![&engine],
            cluster: 1,
            member: false,
        };
        let r = drive(&nodes, &a, &plan).map_err(crate::cli::during_run);
        return crate::cli::first_error(
            r,
            engine
                .close()
                .map_err(|e| crate::cli::during_run(anyhow::Error::from(e))),
        );
    }
    let cluster = Cluster::mem(a.net.nodes, Duration::from_secs(30), node_cfg)
        .map_err(anyhow::Error::from)?;
    crate::cli::drive_cluster(cluster, |nodes| drive(nodes, &a, &plan))
}

/// Node-level counters over the measured interval.
struct NodeReport {
    node: u8,
    /// Operations this node's workers completed in the measured interval.
    ops: u64,
    d: StatsSnapshot,
    remote: u64,
    /// One pool: this home's reads served by another node's copy instead of its NVMe.
    forwarded: u64,
    /// One pool: pages this node's DRAM served in place of another home's NVMe.
    served: u64,
    /// One pool: evicted pages of this home a peer took instead of NVMe alone.
    given: u64,
    /// One pool: pages of other homes this node took in when they were evicted there.
    taken: u64,
    secs: f64,
    logged: bool,
}

/// Share of page accesses served by this node's memory (not a fault, not a remote fetch).
fn hit_ratio(d: &StatsSnapshot, remote: u64) -> f64 {
    if d.hits > 0 {
        d.hits.saturating_sub(d.faults + remote) as f64 / d.hits as f64
    } else {
        1.0
    }
}

impl NodeReport {
    fn hit_ratio(&self) -> f64 {
        hit_ratio(&self.d, self.remote)
    }
    fn json(&self) -> serde_json::Value {
        json!({
            "node": self.node,
            "ops": self.ops,
            "throughput_ops_per_s": self.ops as f64 / self.secs,
            "page_hits": self.d.hits,
            "page_faults": self.d.faults,
            "hit_ratio": self.hit_ratio(),
            "remote_fetches": self.remote,
            "nvme_reads": self.d.store_reads,
            "nvme_writes": self.d.store_writes,
            "nvme_reads_avoided": self.forwarded,
            "pages_served_for_others": self.served,
            "pages_given_away": self.given,
            "pages_taken_in": self.taken,
            "evictions": self.d.evictions,
            "restarts": self.d.restarts,
            "log": crate::cli::log_json(&self.d.log, self.secs, self.logged),
        })
    }
}

/// Snapshot of one node: engine counters and remote fetches.
fn snap(e: &Engine) -> Snap {
    let p = e.protocol_stats();
    (e.stats(), p.requests, p)
}

/// Create or open the table, load this process's share, run, report (or only load, or only
/// run on a loaded table: `plan.phase`).
fn drive(nodes: &Nodes, a: &Args, plan: &Plan) -> anyhow::Result<ExitCode> {
    if plan.phase == Some(Phase::Run) {
        return drive_run_phase(nodes, a, plan);
    }
    let first = nodes.engines[0];
    let w0 = first.worker();
    let tree = if first.node_id() == 0 {
        if BTree::open(&w0, TABLE).is_ok() {
            return Err(anyhow::Error::new(crate::cli::Usage(
                "the data directory already holds a YCSB table; use an empty --data-dir".into(),
            )));
        }
        let t = BTree::create(&w0, TABLE).map_err(anyhow::Error::from)?;
        nodes.barrier("table created")?;
        t
    } else {
        nodes.barrier("table created")?;
        BTree::open(&w0, TABLE).map_err(anyhow::Error::from)?
    };
    drop(w0);
    say!(
        "shoal ycsb: {} ({}), {}, {} records x {} B, {} node{} ({}), {} workers/node{}, cache {}/node, {:?} access, seed {}",
        plan.label,
        mix_text(&plan.mix),
        dist_text(plan.dist),
        a.records,
        a.value_size,
        nodes.cluster,
        if nodes.cluster > 1 { "s" } else { "" },
        if nodes.member { "tcp member" } else if nodes.cluster > 1 { "mem" } else { "embedded" },
        a.workers,
        if a.tasks > 1 { format!(" x {} tasks", a.tasks) } else { String::new() },
        {
            let caches: Vec<u64> = nodes.engines.iter().map(|e| cache_bytes(e)).collect();
            if caches.iter().all(|&c| c == caches[0]) {
                format_bytes(caches[0])
            } else {
                caches.iter().map(|&c| format_bytes(c)).collect::<Vec<_>>().join(",")
            }
        },
        a.access,
        plan.seed
    );
    let load_s = load(nodes, &tree, a)?;
    if crate::stop::requested() {
        // the records loaded so far stay (the caller closes the store clean)
        return Ok(ExitCode::from(crate::stop::STOPPED_EXIT));
    }
    nodes.barrier("loaded")?;
    if plan.phase == Some(Phase::Load) {
        let dir = a
            .data_dir
            .as_deref()
            .expect("validated: load has --data-dir");
        let set = DataSet {
            records: a.records,
            value_size: a.value_size,
            nodes: nodes.cluster,
            next_key: a.records,
            loaded_utc: crate::report::utc_text(std::time::SystemTime::now()),
            runs: 0,
        };
        set.write(dir)?;
        say!(
            "loaded {} records into {} (next: shoal ycsb run --data-dir {} ...)",
            a.records,
            dir.display(),
            dir.display()
        );
        if let Some(path) = &a.json {
            let doc = json!({
                "schema": crate::report::SCHEMA,
                "command": "ycsb load",
                "run": crate::report::run_facts(plan.seed, plan.started),
                "records": a.records,
                "value_size": a.value_size,
                "nodes": nodes.cluster,
                "load_s": load_s,
                "records_per_s": a.records as f64 / load_s.max(1e-9),
            });
            crate::report::write_json(path, &doc)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let set = DataSet {
        records: a.records,
        value_size: a.value_size,
        nodes: nodes.cluster,
        next_key: a.records,
        loaded_utc: String::new(),
        runs: 0,
    };
    report_run(nodes, &tree, a, plan, &set, load_s).map(|(code, _)| code)
}

/// `shoal ycsb run`: open the table a load left, check it holds every record the load and
/// earlier runs wrote, run, report, and record the keys this run inserted.
fn drive_run_phase(nodes: &Nodes, a: &Args, plan: &Plan) -> anyhow::Result<ExitCode> {
    let dir = a
        .data_dir
        .as_deref()
        .expect("validated: run has --data-dir");
    let mut set = DataSet::read(dir)?;
    let w0 = nodes.engines[0].worker();
    let tree = BTree::open(&w0, TABLE).map_err(|e| {
        anyhow::Error::new(crate::cli::Usage(format!(
            "--data-dir {}: no YCSB table ({e}); load one with shoal ycsb load",
            dir.display()
        )))
    })?;
    let t0 = Instant::now();
    let count = tree.count(&w0).map_err(anyhow::Error::from)?;
    drop(w0);
    if count < set.records {
        return Err(anyhow::anyhow!(
            "--data-dir {}: the table holds {count} records, the load wrote {}: records were \
             lost (shoal inspect {} checks the store)",
            dir.display(),
            set.records,
            dir.display()
        ));
    }
    // A run that crashed wrote its inserts but not the description: the next insert goes past
    // the largest key the table holds, whatever the description says.
    let w0 = nodes.engines[0].worker();
    let largest = match tree.range::<&[u8]>(&w0, ..).next_back() {
        Some(entry) => decode_u64(&entry.map_err(anyhow::Error::from)?.0),
        None => None,
    };
    drop(w0);
    if let Some(k) = largest.filter(|&k| k >= set.next_key) {
        say!(
            "the data set description said the next insert is key {}, the table holds keys up to \
             {k} (an earlier run stopped before it could record its inserts): inserts continue \
             after {k}",
            set.next_key
        );
        set.next_key = k + 1;
        set.write(dir)?;
    }
    say!(
        "check: {count} records ({} loaded, {} inserted by {} earlier run(s)) in {:.2} s",
        set.records,
        count - set.records,
        set.runs,
        t0.elapsed().as_secs_f64()
    );
    let (code, inserted) = report_run(nodes, &tree, a, plan, &set, 0.0)?;
    set.next_key += inserted * set.nodes as u64;
    set.runs += 1;
    set.write(dir)?;
    Ok(code)
}

/// Run the workload on `tree` (holding the records of `set`) and report.
fn report_run(
    nodes: &Nodes,
    tree: &BTree,
    a: &Args,
    plan: &Plan,
    set: &DataSet,
    load_s: f64,
) -> anyhow::Result<(ExitCode, u64)> {
    let first = nodes.engines[0];
    let (results, secs, before, after, inserted) = run_phase(nodes, tree, a, plan, set)?;
    nodes.barrier("run finished")?;
    let mut hist = crate::report::hist();
    let mut per_op: Vec<Histogram<u64>> = (0..5).map(|_| crate::report::hist()).collect();
    let mut ops = [0u64; 5];
    let (mut errors, mut misses) = (0, 0);
    let mut first_error = None;
    for r in &results {
        for (all, h) in per_op.iter_mut().zip(&r.hists) {
            all.add(h).expect("same bounds");
            hist.add(h).expect("same bounds");
        }
        for (total, n) in ops.iter_mut().zip(r.ops) {
            *total += n;
        }
        errors += r.errors;
        misses += r.misses;
        if first_error.is_none() {
            first_error = r.first_error.clone();
        }
    }
    // results come in thread order, `workers * tasks` per node
    let per_node = (a.workers * a.tasks).max(1);
    let reports: Vec<NodeReport> = nodes
        .engines
        .iter()
        .zip(before.iter().zip(&after))
        .enumerate()
        .map(|(i, (e, (b, f)))| NodeReport {
            node: e.node_id(),
            ops: results
                .iter()
                .skip(i * per_node)
                .take(per_node)
                .map(|r| r.ops.iter().sum::<u64>())
                .sum(),
            d: delta(&b.0, &f.0),
            remote: f.1 - b.1,
            forwarded: f.2.forwarded_reads - b.2.forwarded_reads,
            served: f.2.served_for_others - b.2.served_for_others,
            given: f.2.given_away - b.2.given_away,
            taken: f.2.taken_in - b.2.taken_in,
            secs,
            logged: a.durability.logged(),
        })
        .collect();
    let total: u64 = ops.iter().sum();
    let tput = total as f64 / secs;
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    say!(
        "run: {secs:.1} s measured after {:.1} s warmup{}",
        a.warmup,
        if crate::stop::requested() {
            format!(" ({})", crate::stop::STOPPED)
        } else {
            String::new()
        }
    );
    say!("  throughput    {:.0} ops/s ({total} ops)", tput);
    say!(
        "  latency       p50 {:.1} us  p99 {:.1} us  p99.9 {:.1} us  max {:.1} us",
        us(0.5),
        us(0.99),
        us(0.999),
        hist.max() as f64 / 1000.0
    );
    for (i, h) in per_op.iter().enumerate().filter(|(_, h)| !h.is_empty()) {
        say!(
            "  {:<13} {:>9.0} ops/s  {}",
            OP_NAMES[i],
            h.len() as f64 / secs,
            crate::report::latency_text(h)
        );
    }
    for r in &reports {
        say!(
            "  node {:<8} {:.0} ops/s  page hit ratio {:.2}%  remote fetches {:.0}/s  nvme reads {:.0}/s  writes {:.0}/s  evictions {:.0}/s",
            r.node,
            r.ops as f64 / secs,
            r.hit_ratio() * 100.0,
            r.remote as f64 / secs,
            r.d.store_reads as f64 / secs,
            r.d.store_writes as f64 / secs,
            r.d.evictions as f64 / secs
        );
        if nodes.cluster > 1 {
            say!(
                "  one pool {:<4} nvme reads avoided {:.0}/s (served by a copy elsewhere)  pages served for others {:.0}/s  given away {:.0}/s  taken in {:.0}/s",
                r.node,
                r.forwarded as f64 / secs,
                r.served as f64 / secs,
                r.given as f64 / secs,
                r.taken as f64 / secs
            );
        }
    }
    if a.durability.logged() {
        for r in &reports {
            say!("  log node {:<4} {}", r.node, r.d.log.summary(secs));
        }
    }
    say!("  value errors  {errors}  (reads of keys inserted during the run and not yet visible: {misses})");
    if !a.property_files.is_empty() || !a.properties.is_empty() {
        ycsb_lines(secs, tput, &per_op, errors);
    }
    if let Some(e) = &first_error {
        say!("  first error   {e}");
    }
    if let Some(path) = &a.json {
        let doc = json!({
            "schema": crate::report::SCHEMA,
            "command": "ycsb",
            "phase": if plan.phase == Some(Phase::Run) { "run" } else { "load and run" },
            "run": crate::report::run_facts(plan.seed, plan.started),
            "target_ops_per_s": a.target,
            "operations": a.operations,
            "workload": plan.label,
            "mix": plan.mix,
            "distribution": dist_json(plan.dist),
            "access": format!("{:?}", a.access).to_lowercase(),
            "records": a.records,
            "value_size": a.value_size,
            "nodes": nodes.cluster,
            "transport": if nodes.member { "tcp" } else { "mem" },
            "workers_per_node": a.workers,
            "tasks_per_worker": a.tasks,
            // what the engine runs with (a tcp member's cache comes from the cluster file)
            "cache_bytes_per_node": cache_bytes(first),
            "cache_bytes_of_nodes": nodes.engines.iter().map(|e| cache_bytes(e)).collect::<Vec<_>>(),
            "one_pool": !a.net.no_one_pool,
            "durability": a.durability.to_string(),
            "stopped_by_signal": crate::stop::requested(),
            "load_s": load_s,
            "warmup_s": a.warmup,
            "duration_s": secs,
            "ops": total,
            "throughput_ops_per_s": tput,
            "p50_us": us(0.5),
            "p99_us": us(0.99),
            "p999_us": us(0.999),
            "max_us": hist.max() as f64 / 1000.0,
            "ops_by_type": (0..5).map(|i| (OP_NAMES[i].to_string(), json!(ops[i]))).collect::<serde_json::Map<_, _>>(),
            // per operation type: count, rate, percentiles and the histogram (for merging)
            "per_op": per_op.iter().enumerate().filter(|(_, h)| !h.is_empty()).map(|(i, h)| {
                let mut v = crate::report::latency_json(h, secs);
                v["histogram_ns"] = crate::report::hist_json(h);
                (OP_NAMES[i].to_string(), v)
            }).collect::<serde_json::Map<_, _>>(),
            "value_errors": errors,
            "first_error": first_error,
            "read_misses_of_new_keys": misses,
            "per_node": reports.iter().map(NodeReport::json).collect::<Vec<_>>(),
            // the latency histogram (value in ns, count), so runs of several processes merge
            "histogram_ns": crate::report::hist_json(&hist),
        });
        crate::report::write_json(path, &doc)?;
    }
    let code = if errors > 0 {
        eprintln!("error: {errors} values failed their check");
        ExitCode::from(1)
    } else if crate::stop::requested() {
        ExitCode::from(crate::stop::STOPPED_EXIT)
    } else {
        ExitCode::SUCCESS
    };
    Ok((code, inserted))
}

/// What `shoal ycsb load` left in a data directory (`ycsb-dataset.json`), updated by every
/// `run`: the table's shape, so that a run uses the same keys and checks that they are there.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct DataSet {
    records: u64,
    value_size: usize,
    nodes: usize,
    /// The key the next insert takes (runs insert keys past the loaded ones).
    next_key: u64,
    loaded_utc: String,
    runs: u64,
}

const DATA_SET_FILE: &str = "ycsb-dataset.json";

impl DataSet {
    fn read(dir: &std::path::Path) -> anyhow::Result<DataSet> {
        let p = dir.join(DATA_SET_FILE);
        let usage = |why: String| anyhow::Error::new(crate::cli::Usage(why));
        let text = std::fs::read_to_string(&p).map_err(|e| {
            usage(format!(
                "--data-dir {}: no data set of shoal ycsb load ({}: {e}); load one first",
                dir.display(),
                p.display()
            ))
        })?;
        serde_json::from_str(&text)
            .map_err(|e| usage(format!("{}: not a data set description: {e}", p.display())))
    }

    /// Written beside the stores, atomically and durably (a new file, synced, renamed over
    /// the old one, the directory synced): a crash leaves the old description or the new one.
    fn write(&self, dir: &std::path::Path) -> anyhow::Result<()> {
        let p = dir.join(DATA_SET_FILE);
        let text = serde_json::to_string_pretty(self).expect("serialises") + "\n";
        shoal_storage::write_atomic(&p, text.as_bytes())
            .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
    }

    /// A run must use the loaded shape: flags or properties that disagree are an error.
    fn matches(&self, a: &Args) -> anyhow::Result<()> {
        let given = |id: &str| a.explicit.iter().any(|e| e == id);
        let differ = |what: &str, theirs: String, mine: String| {
            anyhow::Error::new(crate::cli::Usage(format!(
                "the data set was loaded with {what} {theirs}, this run asks for {mine}: run with \
                 the loaded shape (or load a new data set)"
            )))
        };
        if (given("records") || !a.properties.is_empty() || !a.property_files.is_empty())
            && a.records != self.records
        {
            return Err(differ(
                "recordcount",
                self.records.to_string(),
                a.records.to_string(),
            ));
        }
        if a.value_size != self.value_size && (given("value_size") || a.value_from_fields.is_some())
        {
            return Err(differ(
                "value size",
                self.value_size.to_string(),
                a.value_size.to_string(),
            ));
        }
        if a.net.nodes != self.nodes {
            return Err(differ(
                "--nodes",
                self.nodes.to_string(),
                a.net.nodes.to_string(),
            ));
        }
        Ok(())
    }
}

/// The summary as YCSB prints it (`[OVERALL], RunTime(ms), ...`, then per operation type),
/// for those who parse YCSB's output: printed when a workload file or property was given.
fn ycsb_lines(secs: f64, tput: f64, per_op: &[Histogram<u64>], errors: u64) {
    say!("[OVERALL], RunTime(ms), {:.0}", secs * 1000.0);
    say!("[OVERALL], Throughput(ops/sec), {tput:.2}");
    let names = ["READ", "UPDATE", "INSERT", "SCAN", "READ-MODIFY-WRITE"];
    for (name, h) in names.iter().zip(per_op).filter(|(_, h)| !h.is_empty()) {
        let us = |q: f64| h.value_at_quantile(q) / 1000;
        say!("[{name}], Operations, {}", h.len());
        say!("[{name}], AverageLatency(us), {:.3}", h.mean() / 1000.0);
        say!("[{name}], MinLatency(us), {}", h.min() / 1000);
        say!("[{name}], MaxLatency(us), {}", h.max() / 1000);
        say!("[{name}], 95thPercentileLatency(us), {}", us(0.95));
        say!("[{name}], 99thPercentileLatency(us), {}", us(0.99));
        say!("[{name}], Return=OK, {}", h.len());
    }
    if errors > 0 {
        say!("[VALUE-ERRORS], Count, {errors}");
    }
}

/// The request distribution for the summary: `zipfian 0.99`.
fn dist_text(d: Dist) -> String {
    match d {
        Dist::Uniform => "uniform".into(),
        Dist::Zipf(t) => format!("zipfian {t}"),
        Dist::Latest(t) => format!("latest {t}"),
    }
}

/// The request distribution as JSON: `{"name": "zipfian", "theta": 0.99}`.
fn dist_json(d: Dist) -> serde_json::Value {
    match d {
        Dist::Uniform => json!({"name": "uniform"}),
        Dist::Zipf(t) => json!({"name": "zipfian", "theta": t}),
        Dist::Latest(t) => json!({"name": "latest", "theta": t}),
    }
}

/// The cache the node runs with, in bytes.
fn cache_bytes(e: &Engine) -> u64 {
    e.frames() as u64 * shoal_storage::PAGE_SIZE as u64
}

fn mix_text(m: &Mix) -> String {
    let parts = [
        ("read", m.read),
        ("update", m.update),
        ("insert", m.insert),
        ("scan", m.scan),
        ("rmw", m.rmw),
    ];
    parts
        .iter()
        .filter(|(_, f)| *f > 0.0)
        .map(|(n, f)| format!("{n} {:.0}%", f * 100.0))
        .collect::<Vec<_>>()
        .join(" ")
}

fn delta(a: &StatsSnapshot, b: &StatsSnapshot) -> StatsSnapshot {
    StatsSnapshot {
        hits: b.hits - a.hits,
        faults: b.faults - a.faults,
        restarts: b.restarts - a.restarts,
        evictions: b.evictions - a.evictions,
        writebacks: b.writebacks - a.writebacks,
        write_errors: b.write_errors - a.write_errors,
        store_reads: b.store_reads - a.store_reads,
        store_writes: b.store_writes - a.store_writes,
        log: b.log.since(&a.log),
        ..b.clone()
    }
}

fn load(nodes: &Nodes, tree: &BTree, a: &Args) -> anyhow::Result<f64> {
    let done = AtomicU64::new(0);
    let t0 = Instant::now();
    let keys = |e: &Engine| Keys {
        records: a.records,
        next_key: a.records,
        node: e.node_id() as u64,
        nodes: nodes.cluster as u64,
        partitioned: true,
    };
    let mine: u64 = nodes
        .engines
        .iter()
        .map(|e| {
            let (lo, hi) = keys(e).share();
            hi - lo
        })
        .sum();
    let bar = crate::cli::progress(mine, "records", a.quiet);
    let r: anyhow::Result<()> = std::thread::scope(|s| {
        let mut hs = Vec::new();
        for &e in &nodes.engines {
            let (lo, hi) = keys(e).share();
            let workers = (a.workers as u64).min(hi - lo).max(1);
            for t in 0..workers {
                let done = &done;
                let (from, to) = (
                    lo + (hi - lo) * t / workers,
                    lo + (hi - lo) * (t + 1) / workers,
                );
                hs.push(s.spawn(move || -> anyhow::Result<()> {
                    let w = e.worker();
                    let mut v = vec![0u8; a.value_size];
                    let mut n = 0;
                    for k in from..to {
                        if crate::stop::requested() {
                            break;
                        }
                        value::fill(&mut v, k, 0);
                        if !tree.insert(&w, u64_key(k), &v)?.inserted() {
                            anyhow::bail!("loading record {k}: the key exists already");
                        }
                        n += 1;
                        if n % 1024 == 0 {
                            done.fetch_add(1024, Ordering::Relaxed);
                        }
                    }
                    done.fetch_add(n % 1024, Ordering::Relaxed);
                    Ok(())
                }));
            }
        }
        crate::cli::join_loaders(hs, &bar, &done, mine, |e| {
            anyhow::anyhow!("loading failed: {e}")
        })
    });
    r?;
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let loaded = done.load(Ordering::Relaxed);
    say!(
        "load: {loaded} records in {secs:.2} s ({:.0} records/s){}",
        loaded as f64 / secs,
        if loaded < mine {
            format!(" of {mine}: {}", crate::stop::STOPPED)
        } else {
            String::new()
        }
    );
    Ok(secs)
}

/// A node's engine counters, its remote fetches, and its protocol counters.
type Snap = (StatsSnapshot, u64, ProtocolStats);
/// Workers' results, measured seconds, node counters before and after, and the most inserts
/// one node made.
type RunOutput = (Vec<WorkerResult>, f64, Vec<Snap>, Vec<Snap>, u64);

fn run_phase(
    nodes: &Nodes,
    tree: &BTree,
    a: &Args,
    plan: &Plan,
    set: &DataSet,
) -> anyhow::Result<RunOutput> {
    let phase = AtomicU8::new(WARMUP);
    // (index of the engine in `nodes.engines`, worker thread on it)
    let threads: Vec<(usize, usize)> = (0..nodes.engines.len())
        .flat_map(|n| (0..a.workers).map(move |t| (n, t)))
        .collect();
    // a stream of operations: one per worker thread, or per task with --tasks
    let n_units = threads.len() * a.tasks;
    let counters: Vec<Counter> = (0..n_units).map(|_| Counter::default()).collect();
    let inserts: Vec<Counter> = nodes.engines.iter().map(|_| Counter::default()).collect();
    // each second's latencies per worker and operation type (only for --csv / --hdr)
    let intervals: Vec<std::sync::Mutex<Vec<Histogram<u64>>>> =
        if a.csv.is_some() || a.hdr.is_some() {
            (0..n_units)
                .map(|_| std::sync::Mutex::new((0..5).map(|_| crate::report::hist()).collect()))
                .collect()
        } else {
            Vec::new()
        };
    let mut series = Series::create(a, nodes.engines.len())?;
    let snaps = || nodes.engines.iter().map(|e| snap(e)).collect::<Vec<_>>();
    let sum = |v: &[Snap]| {
        v.iter()
            .fold((StatsSnapshot::default(), 0u64), |(mut s, r), (x, q, _)| {
                s.hits += x.hits;
                s.faults += x.faults;
                s.store_reads += x.store_reads;
                s.store_writes += x.store_writes;
                (s, r + q)
            })
    };
    std::thread::scope(|s| {
        let hs: Vec<_> = threads
            .iter()
            .enumerate()
            .map(|(th, &(n, t))| {
                let e = nodes.engines[n];
                let (phase, inserted) = (&phase, &inserts[n]);
                let (counters, intervals) = (&counters, &intervals);
                let keys = Keys {
                    records: set.records,
                    next_key: set.next_key,
                    node: e.node_id() as u64,
                    nodes: nodes.cluster as u64,
                    partitioned: a.access == Access::Partitioned,
                };
                // stream `k` of this thread: unit `i` of the run, stream `t * tasks + k` of
                // its node (the seed's stream number: with one task, the thread's number)
                let unit = move |k: usize| {
                    let i = th * a.tasks + k;
                    // this stream's share of --operations and of --target
                    let n_units = n_units as u64;
                    let quota = a
                        .operations
                        .map(|o| o / n_units + u64::from((i as u64) < o % n_units));
                    let pace = a
                        .target
                        .map(|t| Duration::from_secs_f64(n_units as f64 / t));
                    let share = Share {
                        quota,
                        pace,
                        interval: intervals.get(i),
                    };
                    worker_loop(
                        e,
                        tree,
                        a,
                        plan,
                        keys,
                        t * a.tasks + k,
                        share,
                        phase,
                        &counters[i].0,
                        &inserted.0,
                    )
                };
                s.spawn(
                    move || -> anyhow::Result<Vec<Result<WorkerResult, TreeError>>> {
                        if a.tasks == 1 {
                            return Ok(vec![unit(0)]);
                        }
                        let out: Vec<std::cell::RefCell<Option<Result<WorkerResult, TreeError>>>> =
                            (0..a.tasks).map(|_| Default::default()).collect();
                        shoal_engine::tasks::run(a.tasks, |k| {
                            *out[k].borrow_mut() = Some(unit(k));
                        })
                        .map_err(|e| anyhow::anyhow!("tasks: cannot map a task's stack: {e}"))?;
                        Ok(out
                            .into_iter()
                            .map(|r| r.into_inner().expect("every task ran to its end"))
                            .collect())
                    },
                )
            })
            .collect();
        let total_ops = || {
            counters
                .iter()
                .map(|c| c.0.load(Ordering::Relaxed))
                .sum::<u64>()
        };
        let start = Instant::now();
        if let Some(series) = &mut series {
            series.last = Some((start, snaps()));
        }
        let warm = Duration::from_secs_f64(a.warmup);
        let end = warm + Duration::from_secs_f64(a.duration);
        let mut before = snaps();
        let mut measure_start = start;
        let mut last = (Instant::now(), total_ops(), sum(&snaps()));
        let mut tick = 1u64;
        // with --operations the run ends when the workers are done: look every 10 ms
        let poll = a.operations.map(|_| Duration::from_millis(10));
        loop {
            let next = start + Duration::from_secs(tick);
            let stop_at = start + end;
            let mut wake = next.min(stop_at);
            if let Some(p) = poll {
                wake = wake.min(Instant::now() + p);
            }
            // the phase of the second that ends at `wake` (for --csv)
            let was_warm = phase.load(Ordering::Relaxed) == WARMUP;
            if phase.load(Ordering::Relaxed) == WARMUP && start + warm <= wake {
                if !crate::stop::sleep_until(start + warm) {
                    break;
                }
                before = snaps();
                measure_start = Instant::now();
                phase.store(MEASURE, Ordering::Relaxed);
            }
            if !crate::stop::sleep_until(wake) {
                break; // Ctrl-C: report what was measured so far
            }
            if a.operations.is_some() {
                if hs.iter().all(|h| h.is_finished()) {
                    break; // every worker did its share of --operations (or failed)
                }
            } else if hs.iter().any(|h| h.is_finished()) {
                break; // a worker stopped early: an error; collected below
            }
            if wake < next && wake < stop_at {
                continue; // a poll between ticks
            }
            if let Some(series) = &mut series {
                let per_op = take_intervals(&intervals);
                series.second(start, &per_op, &snaps(), was_warm)?;
            }
            if !a.quiet && wake == next {
                let now = (Instant::now(), total_ops(), sum(&snaps()));
                let dt = now.0.duration_since(last.0).as_secs_f64();
                let d = delta(&last.2 .0, &now.2 .0);
                let remote = now.2 .1 - last.2 .1;
                let hit = 100.0 * hit_ratio(&d, remote);
                say!(
                    "[{:>4}s{}] {:>10.0} ops/s  hit {:>6.2}%  remote {:>7.0}/s  nvme r {:>7.0}/s w {:>7.0}/s",
                    tick,
                    if phase.load(Ordering::Relaxed) == WARMUP { " warm" } else { "" },
                    (now.1 - last.1) as f64 / dt,
                    hit,
                    remote as f64 / dt,
                    d.store_reads as f64 / dt,
                    d.store_writes as f64 / dt
                );
                last = now;
            }
            if wake >= stop_at {
                break;
            }
            tick += 1;
        }
        phase.store(STOP, Ordering::Relaxed);
        let after = snaps();
        if let Some(series) = series.take() {
            series.finish()?;
        }
        let secs = measure_start.elapsed().as_secs_f64();
        let mut out = Vec::new();
        for h in hs {
            for r in h
                .join()
                .map_err(|_| anyhow::anyhow!("a worker thread panicked"))??
            {
                out.push(r.map_err(|e| anyhow::anyhow!("the run failed: {e}"))?);
            }
        }
        let inserted = inserts
            .iter()
            .map(|c| c.0.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0);
        Ok((out, secs, before, after, inserted))
    })
}

/// A worker's part of `--operations` (measured operations, then it stops) and of `--target`
/// (one operation started every `pace`), and where it records each second's latencies
/// (`--csv`, `--hdr`: per operation type, taken by the supervisor every second).
#[derive(Clone, Copy)]
struct Share<'a> {
    quota: Option<u64>,
    pace: Option<Duration>,
    interval: Option<&'a std::sync::Mutex<Vec<Histogram<u64>>>>,
}

/// Take (and reset) every worker's histograms of the last second, merged per operation type.
fn take_intervals(intervals: &[std::sync::Mutex<Vec<Histogram<u64>>>]) -> Vec<Histogram<u64>> {
    let mut all: Vec<Histogram<u64>> = (0..5).map(|_| crate::report::hist()).collect();
    for m in intervals {
        if let Ok(mut h) = m.lock() {
            for (a, w) in all.iter_mut().zip(h.iter_mut()) {
                a.add(&*w).expect("same bounds");
                w.reset();
            }
        }
    }
    all
}

/// The per-second series of `--csv` and `--hdr`.
struct Series {
    csv: Option<(std::io::BufWriter<std::fs::File>, PathBuf)>,
    hdr: Option<(Vec<u8>, PathBuf)>,
    serializer: hdrhistogram::serialization::V2DeflateSerializer,
    /// Node counters at the last second.
    last: Option<(Instant, Vec<Snap>)>,
    started: std::time::SystemTime,
}

impl Series {
    fn create(a: &Args, nodes: usize) -> anyhow::Result<Option<Series>> {
        if a.csv.is_none() && a.hdr.is_none() {
            return Ok(None);
        }
        let csv = match &a.csv {
            Some(p) => {
                use std::io::Write as _;
                let f = std::fs::File::create(p)
                    .map_err(|e| anyhow::anyhow!("--csv {}: {e}", p.display()))?;
                let mut w = std::io::BufWriter::new(f);
                let mut head = vec!["time_s".to_string(), "phase".into(), "ops_per_s".into()];
                head.extend(OP_NAMES.iter().map(|o| format!("{o}_ops_per_s")));
                head.extend(
                    [
                        "p50_us",
                        "p99_us",
                        "p999_us",
                        "max_us",
                        "hit_ratio",
                        "remote_per_s",
                    ]
                    .map(String::from),
                );
                head.extend(["nvme_reads_per_s", "nvme_writes_per_s"].map(String::from));
                for n in 0..nodes {
                    for c in [
                        "hit_ratio",
                        "remote_per_s",
                        "nvme_reads_per_s",
                        "nvme_writes_per_s",
                    ] {
                        head.push(format!("node{n}_{c}"));
                    }
                }
                writeln!(w, "{}", head.join(","))
                    .map_err(|e| anyhow::anyhow!("--csv {}: {e}", p.display()))?;
                Some((w, p.clone()))
            }
            None => None,
        };
        Ok(Some(Series {
            csv,
            hdr: a.hdr.clone().map(|p| (Vec::new(), p)),
            serializer: hdrhistogram::serialization::V2DeflateSerializer::new(),
            last: None,
            started: std::time::SystemTime::now(),
        }))
    }

    /// One second's row and interval histograms (the first call only takes the counters).
    fn second(
        &mut self,
        start: Instant,
        per_op: &[Histogram<u64>],
        now_snaps: &[Snap],
        warm: bool,
    ) -> anyhow::Result<()> {
        use std::io::Write as _;
        let now = Instant::now();
        let Some((then, last)) = self.last.replace((now, now_snaps.to_vec())) else {
            return Ok(());
        };
        let dt = now.duration_since(then).as_secs_f64().max(1e-9);
        let mut all = crate::report::hist();
        for h in per_op {
            all.add(h).expect("same bounds");
        }
        if let Some((w, p)) = &mut self.csv {
            let us = |q: f64| all.value_at_quantile(q) as f64 / 1000.0;
            let mut row = vec![
                format!("{:.3}", now.duration_since(start).as_secs_f64()),
                if warm { "warmup" } else { "measure" }.to_string(),
                format!("{:.1}", all.len() as f64 / dt),
            ];
            row.extend(per_op.iter().map(|h| format!("{:.1}", h.len() as f64 / dt)));
            row.extend(
                [us(0.5), us(0.99), us(0.999), all.max() as f64 / 1000.0]
                    .map(|v| format!("{v:.1}")),
            );
            let node_figures = |b: &Snap, a: &Snap| {
                let d = delta(&b.0, &a.0);
                let remote = a.1 - b.1;
                let hit = hit_ratio(&d, remote);
                [
                    hit,
                    remote as f64 / dt,
                    d.store_reads as f64 / dt,
                    d.store_writes as f64 / dt,
                ]
            };
            let per_node: Vec<[f64; 4]> = last
                .iter()
                .zip(now_snaps)
                .map(|(b, a)| node_figures(b, a))
                .collect();
            let n = per_node.len().max(1) as f64;
            row.push(format!(
                "{:.4}",
                per_node.iter().map(|f| f[0]).sum::<f64>() / n
            ));
            for k in 1..4 {
                row.push(format!("{:.1}", per_node.iter().map(|f| f[k]).sum::<f64>()));
            }
            for f in &per_node {
                row.push(format!("{:.4}", f[0]));
                row.extend(f[1..].iter().map(|v| format!("{v:.1}")));
            }
            writeln!(w, "{}", row.join(","))
                .map_err(|e| anyhow::anyhow!("--csv {}: {e}", p.display()))?;
        }
        if let Some((buf, _)) = &mut self.hdr {
            let mut log =
                hdrhistogram::serialization::interval_log::IntervalLogWriterBuilder::new()
                    .begin_log_with(buf, &mut self.serializer)
                    .map_err(|e| anyhow::anyhow!("--hdr: {e}"))?;
            let from = then.duration_since(start);
            for (i, h) in per_op.iter().enumerate().filter(|(_, h)| !h.is_empty()) {
                let tag = hdrhistogram::serialization::interval_log::Tag::new(OP_NAMES[i]);
                log.write_histogram(h, from, now.duration_since(then), tag)
                    .map_err(|e| anyhow::anyhow!("--hdr: {e}"))?;
            }
        }
        Ok(())
    }

    /// Flush the CSV and write the interval log with its header.
    fn finish(self) -> anyhow::Result<()> {
        use std::io::Write as _;
        if let Some((mut w, p)) = self.csv {
            w.flush()
                .map_err(|e| anyhow::anyhow!("--csv {}: {e}", p.display()))?;
        }
        if let Some((body, p)) = self.hdr {
            let secs = self
                .started
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let mut text = format!(
                "# shoal ycsb: latencies in ns, one histogram per operation type and second\n\
                 #[Histogram log format version 1.3]\n\
                 #[StartTime: {secs:.3} (seconds since epoch)]\n\
                 \"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\"\n"
            )
            .into_bytes();
            text.extend(body);
            std::fs::write(&p, text).map_err(|e| anyhow::anyhow!("--hdr {}: {e}", p.display()))?;
        }
        Ok(())
    }
}

/// Wait until `at` (sleeping, then spinning the last 100 us), or until the run stops.
fn wait_until(at: Instant, phase: &AtomicU8) {
    loop {
        let now = Instant::now();
        if now >= at || phase.load(Ordering::Relaxed) == STOP {
            return;
        }
        let left = at - now;
        if shoal_engine::tasks::yield_now() {
            continue; // a task: the thread's other tasks run meanwhile
        }
        if left > Duration::from_micros(200) {
            std::thread::sleep((left - Duration::from_micros(100)).min(Duration::from_millis(10)));
        } else {
            std::hint::spin_loop();
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn worker_loop(
    engine: &Engine,
    tree: &BTree,
    a: &Args,
    plan: &Plan,
    keys: Keys,
    t: usize,
    share: Share<'_>,
    phase: &AtomicU8,
    counter: &AtomicU64,
    inserted: &AtomicU64,
) -> Result<WorkerResult, TreeError> {
    let w = engine.worker();
    // one stream per worker of each node, all from the run's seed
    let mut rng = SmallRng::seed_from_u64(
        plan.seed ^ (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (keys.node << 48),
    );
    let mut chooser = KeyChooser::new(plan.dist);
    let mut hists: Vec<Histogram<u64>> = (0..5).map(|_| crate::report::hist()).collect();
    let mut res = WorkerResult::default();
    let mut buf = Vec::with_capacity(a.value_size);
    let mut val = vec![0u8; a.value_size];
    let mut measuring = false;
    let mut n_ops = 0u64;
    let pipelined = a.durability == shoal_engine::Durability::Commit;
    let mut acks = crate::acks::Acks::new(a.pipeline);
    let vs = a.value_size;
    let note = |res: &mut WorkerResult, msg: String| {
        res.errors += 1;
        if res.first_error.is_none() {
            res.first_error = Some(msg);
        }
    };
    // the intended start of the next operation under --target
    let mut next_at = Instant::now();
    loop {
        match phase.load(Ordering::Relaxed) {
            STOP => break,
            MEASURE if !measuring => {
                measuring = true;
                hists.iter_mut().for_each(Histogram::reset);
                res.ops = [0; 5];
            }
            _ => {}
        }
        if measuring
            && share
                .quota
                .is_some_and(|q| res.ops.iter().sum::<u64>() >= q)
        {
            break; // this worker's share of --operations is done
        }
        let op = plan.mix.pick(&mut rng);
        let live = inserted.load(Ordering::Relaxed);
        // with --target, latency counts from the intended start (queueing included)
        let t0 = match share.pace {
            Some(p) => {
                next_at += p;
                wait_until(next_at, phase);
                next_at
            }
            None => Instant::now(),
        };
        let mut ack = false;
        match op {
            Op::Read => {
                let k = keys.live(&mut chooser, live, &mut rng);
                if tree.lookup(&w, u64_key(k), &mut buf)? {
                    if !value::check(&buf, k, vs) {
                        note(&mut res, format!("read of key {k} returned a bad value"));
                    }
                } else if k < a.records {
                    note(&mut res, format!("loaded key {k} not found"));
                } else {
                    res.misses += 1;
                }
            }
            Op::Update | Op::ReadModifyWrite => {
                let k = keys.existing(&mut chooser, &mut rng);
                let salt: u32 = rng.random();
                let mut bad = false;
                let rmw = op == Op::ReadModifyWrite;
                let found = tree.update(&w, u64_key(k), |v| {
                    // updates check what they overwrite, too
                    bad = !value::check(v, k, vs);
                    let s = if rmw {
                        value::salt(v).wrapping_add(1)
                    } else {
                        salt
                    };
                    value::fill(v, k, s);
                })?;
                ack = true;
                if !found {
                    note(&mut res, format!("update of loaded key {k}: not found"));
                } else if bad {
                    note(&mut res, format!("update of key {k} found a bad value"));
                }
            }
            Op::Insert => {
                let k = keys.inserted(inserted.fetch_add(1, Ordering::Relaxed));
                value::fill(&mut val, k, 0);
                if !tree.insert(&w, u64_key(k), &val)?.inserted() {
                    note(&mut res, format!("insert of new key {k}: already present"));
                }
                ack = true;
            }
            Op::Scan => {
                let k = keys.live(&mut chooser, live, &mut rng);
                let len = rng.random_range(1..=a.max_scan);
                let mut seen = 0;
                let mut bad: Option<String> = None;
                tree.scan(&w, &u64_key(k), Direction::Ascending, |key, v| {
                    let kk = decode_u64(key).unwrap_or(u64::MAX);
                    if bad.is_none() && (kk < k || !value::check(v, kk, vs)) {
                        bad = Some(format!("scan from {k} returned a bad entry for key {kk}"));
                    }
                    seen += 1;
                    seen < len
                })?;
                if let Some(m) = bad {
                    note(&mut res, m);
                }
            }
        }
        let mut done = |t0: Instant, op: usize| {
            let ns = t0.elapsed().as_nanos().max(1) as u64;
            if measuring {
                let _ = hists[op].record(ns);
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
            acks.push(&w, w.commit_later()?, t0, op_index(op), &mut done)?;
        } else {
            if ack {
                w.commit()?; // durability none or flush-every-ms: returns at once
            }
            done(t0, op_index(op));
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
    Ok(res)
}
