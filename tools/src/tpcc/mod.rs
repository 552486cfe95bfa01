//! `shoal tpcc`: TPC-C on Shoal's B-trees. Loads the standard population of `--warehouses`
//! (split across `--nodes`, each node loading its own warehouses so their pages are homed
//! there), runs the standard transaction mix for `--duration` seconds after `--warmup`, and
//! prints transactions/s per type, NewOrders per minute, p50/p99 latency per type and the
//! remote-warehouse share; `--check` verifies consistency conditions 1-4 afterwards (exit 1 on
//! a violation). Modes and why affinity keeps the conditions without transactions:
//! docs/tpcc.md.

mod check;
mod dataset;
mod load;
mod random;
mod run;
mod schema;
mod tcp;
mod txn;

use crate::cli::{parse_wal_size, ClusterArgs, Nodes, Transport};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use random::Constants;
use run::{run_phase, RunOut, Tally};
use schema::Tables;
use serde_json::json;
use shoal_engine::{format_bytes, Cluster, ClusterFile, Engine, EngineConfig};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Which part of a TPC-C run to do.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Load the database into an empty --data-dir, close it, stop.
    Load,
    /// Run the mix on the database a `load` left in --data-dir (BenchBase's --execute).
    Run,
}

/// Where `shoal tpcc load` / `run` keep the database without `--data-dir`.
const DEFAULT_DATA_DIR: &str = "shoal-tpcc-data";

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Each warehouse belongs to one worker of its node (workers = the node's warehouses at
    /// most); keeps every consistency condition.
    Affinity,
    /// Each transaction's home warehouse is one of its node's warehouses, at random.
    Locality,
    /// Each transaction's home warehouse is any warehouse, at random.
    Uniform,
}

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// `load`: load the database into an empty --data-dir and stop; `run`: run on the
    /// database a load left there, as many times as wanted (BenchBase's --create/--load and
    /// --execute). Without it: both, on a fresh directory.
    #[arg(value_enum)]
    pub phase: Option<Phase>,
    /// Flags given on the command line (set by main).
    #[arg(skip)]
    pub explicit: Vec<String>,
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
    /// With --durability commit: transactions a worker may have waiting for the log at once.
    /// Each counts (and its latency is taken) only when durable; the worker goes on with its
    /// next transaction meanwhile. 0: each transaction waits for its flush first.
    #[arg(long, default_value_t = 10_000)]
    pub pipeline: usize,
    /// Warehouses in the database (about 110 MiB of pages each).
    #[arg(long, default_value_t = 1)]
    pub warehouses: u16,
    /// Worker threads per node (affinity mode uses at most one per warehouse of the node).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Tasks per worker thread (1: no tasks): each task runs its own stream of transactions
    /// on the worker's warehouses; a task that waits (NVMe, a remote page, the log, a latch)
    /// lets the thread run another (docs/tpcc.md).
    #[arg(long, default_value_t = 1)]
    pub tasks: usize,
    #[command(flatten)]
    pub net: ClusterArgs,
    /// Page cache per node, e.g. 256MiB, 1GiB (one size for every node, or one per node
    /// separated by commas, as `shoal ycsb --cache`).
    #[arg(long, default_value = "1GiB")]
    pub cache: String,
    /// How a worker picks each transaction's home warehouse.
    #[arg(long, value_enum, default_value = "affinity")]
    pub mode: Mode,
    /// Seconds to run before measuring.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Seconds to measure.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// After the run, check consistency conditions 1-4; exit 1 on a violation.
    #[arg(long)]
    pub check: bool,
    /// Open the TPC-C database of --warehouses warehouses in --data-dir instead of loading one
    /// (recovering it first if a crash left it unclean and it has a log), check consistency
    /// conditions 1-4 and stop: no run. Single nodes.
    #[arg(long, requires = "data_dir")]
    pub check_existing: bool,
    /// Data directory (default: a temporary directory, removed after the run); must not hold
    /// a TPC-C database already (except with --check-existing).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Seed of the random inputs (the run is still timing-dependent).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write the results as JSON to this file (`-`: standard output; the per-second lines and
    /// the summary then go to standard error).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Target rate in transactions per second over all workers (BenchBase's `rate`): each
    /// worker starts its transactions on a fixed schedule, and latencies count from the
    /// intended start (queueing included).
    #[arg(long)]
    pub rate: Option<f64>,
    /// The transaction mix, as BenchBase's `weights`: five whole numbers for NewOrder,
    /// Payment, OrderStatus, Delivery and StockLevel (relative; the standard mix by default).
    #[arg(long, value_parser = txn::parse_weights, default_value = "45,43,4,4,4")]
    pub weights: [u32; 5],
    /// TPC-C's keying and think times (clause 5.2.5): each worker is a terminal that waits
    /// its keying time before a transaction (NewOrder 18 s, Payment 3 s, the others 2 s) and
    /// a think time after it, drawn from a negative exponential with mean 12, 12, 10, 5 and 5 s
    /// (at most ten times the mean). Latencies leave the waits out. Off by default, as in
    /// BenchBase; --keying-ms and --think-ms set other times.
    #[arg(long)]
    pub think: bool,
    /// Keying times in milliseconds, per type as --weights (turns terminal times on).
    #[arg(long, value_parser = txn::parse_times, value_name = "MS,MS,MS,MS,MS")]
    pub keying_ms: Option<[u32; 5]>,
    /// Mean think times in milliseconds, per type as --weights (turns terminal times on).
    #[arg(long, value_parser = txn::parse_times, value_name = "MS,MS,MS,MS,MS")]
    pub think_ms: Option<[u32; 5]>,
    /// Write one CSV row per second (warm-up included): transactions/s and NewOrders/min.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// No per-second lines and no progress bar.
    #[arg(long)]
    pub quiet: bool,
}

impl Args {
    /// The terminals' (keying, mean think) times in milliseconds per type, if they wait.
    pub fn terminal_times(&self) -> Option<([u32; 5], [u32; 5])> {
        (self.think || self.keying_ms.is_some() || self.think_ms.is_some()).then(|| {
            (
                self.keying_ms.unwrap_or(txn::KEYING_MS),
                self.think_ms.unwrap_or(txn::THINK_MS),
            )
        })
    }
}

fn validate(a: &Args) -> anyhow::Result<Vec<usize>> {
    if a.terminal_times().is_some() && a.rate.is_some() {
        return Err(anyhow::anyhow!(
            "--rate and terminal times (--think, --keying-ms, --think-ms): choose one way to \
             pace the terminals"
        ));
    }
    if let Some(r) = a.rate {
        if !(r.is_finite() && r > 0.0) {
            return Err(anyhow::anyhow!("--rate {r}: transactions per second, > 0"));
        }
    }
    if a.csv.is_some() && a.net.transport == crate::cli::Transport::Tcp && a.net.cluster.is_none() {
        return Err(anyhow::anyhow!(
            "--csv with --transport tcp: not yet (each node can write its own with --cluster)"
        ));
    }
    a.net.validate()?;
    if a.warehouses == 0 || (a.warehouses as usize) < a.net.nodes {
        return Err(anyhow::anyhow!(
            "--warehouses {} with --nodes {}: every node needs at least one warehouse",
            a.warehouses,
            a.net.nodes
        ));
    }
    if schema::Tables::catalog_bytes(a.net.nodes) > shoal_engine::catalog::CAPACITY {
        let most = (1..a.net.nodes)
            .rev()
            .find(|&n| schema::Tables::catalog_bytes(n) <= shoal_engine::catalog::CAPACITY)
            .unwrap_or(1);
        return Err(anyhow::anyhow!(
            "--nodes {}: TPC-C keeps one set of tables per node in the catalog, which has \
             room for the sets of at most {most} nodes",
            a.net.nodes
        ));
    }
    if a.workers == 0 || a.workers > 1024 {
        return Err(anyhow::anyhow!("--workers {}: 1 to 1024", a.workers));
    }
    if a.tasks == 0 || a.tasks > shoal_engine::tasks::MAX_TASKS {
        return Err(anyhow::anyhow!(
            "--tasks {}: 1 to {}",
            a.tasks,
            shoal_engine::tasks::MAX_TASKS
        ));
    }
    crate::cli::check_run_secs(a.duration, a.warmup)?;
    let caches = crate::cli::parse_caches(&a.cache, a.net.nodes)?;
    if caches.iter().any(|&c| c < 4 << 20) {
        return Err(anyhow::anyhow!("--cache {}: at least 4MiB", a.cache));
    }
    Ok(caches)
}

/// The warehouses loaded on (and homed at) node `n` of `nodes`: `lo..=hi`.
fn share(warehouses: u16, n: usize, nodes: usize) -> (u16, u16) {
    let w = warehouses as usize;
    ((w * n / nodes + 1) as u16, (w * (n + 1) / nodes) as u16)
}

/// Run `shoal tpcc`.
pub fn run(mut a: Args) -> anyhow::Result<ExitCode> {
    if a.phase.is_some() && a.data_dir.is_none() {
        a.data_dir = Some(PathBuf::from(DEFAULT_DATA_DIR));
    }
    if a.phase.is_some() && (a.net.transport == Transport::Tcp || a.net.cluster.is_some()) {
        return Err(anyhow::Error::new(crate::cli::Usage(
            "shoal tpcc load/run: tcp clusters not yet (use --nodes N over mem, or the one-shot \
             command)"
                .into(),
        )));
    }
    if a.phase.is_some() && a.check_existing {
        return Err(anyhow::Error::new(crate::cli::Usage(
            "--check-existing checks a database without load or run; `run --check` checks \
             after a run"
                .into(),
        )));
    }
    if let (Some(Phase::Run), Some(d)) = (a.phase, a.data_dir.as_deref()) {
        // the run takes the loaded shape; flags that disagree are an error
        let set = dataset::TpccSet::read(d)?;
        let given = |id: &str| a.explicit.iter().any(|e| e == id);
        for (flag, theirs, mine, id) in [
            (
                "--warehouses",
                set.warehouses as usize,
                a.warehouses as usize,
                "warehouses",
            ),
            ("--nodes", set.nodes, a.net.nodes, "nodes"),
        ] {
            if given(id) && theirs != mine {
                return Err(anyhow::Error::new(crate::cli::Usage(format!(
                    "the database was loaded with {flag} {theirs}, this run asks for {mine}: run \
                     with the loaded shape (or load a new database)"
                ))));
            }
        }
        a.warehouses = set.warehouses;
        a.net.nodes = set.nodes;
    }
    let caches = validate(&a)?;
    STARTED.get_or_init(std::time::SystemTime::now);
    if let Some(p) = &a.json {
        crate::cli::check_output("--json", p)?;
    }
    crate::report::json_takes_stdout(a.json.as_deref());
    if let Some(p) = &a.csv {
        crate::cli::check_output("--csv", p)?;
    }
    if let (Some(path), Some(id)) = (&a.net.cluster, a.net.id) {
        let file = ClusterFile::load(path).map_err(anyhow::Error::from)?;
        if (a.warehouses as usize) < file.nodes.len() {
            return Err(anyhow::anyhow!(
                "--warehouses {} for a cluster of {} nodes: every node needs at least one warehouse",
                a.warehouses,
                file.nodes.len()
            ));
        }
        return crate::cli::run_as_member(&file, id, a.durability, a.wal_size, |nodes| {
            drive(nodes, &a)
        });
    }
    if a.check_existing {
        return check_existing(&a, caches[0]);
    }
    if a.net.transport == Transport::Tcp {
        return tcp::run_local(&a);
    }
    let (dir, _tmp) = match (a.phase, a.data_dir.as_deref()) {
        (Some(Phase::Run), Some(d)) => (d.to_path_buf(), None),
        (_, d) => crate::cli::data_dir(d, "tpcc")?,
    };
    let cfg = |i: u8| {
        let d = if a.net.nodes > 1 {
            dir.join(format!("node{i}"))
        } else {
            dir.clone()
        };
        let mut c = EngineConfig::new(d, caches[i as usize]);
        c.one_pool = !a.net.no_one_pool;
        c.durability = a.durability;
        c.wal_bytes = a.wal_size;
        if a.phase == Some(Phase::Run) {
            c.mode = shoal_engine::OpenMode::Open;
        }
        c
    };
    if a.net.nodes == 1 {
        let e = Engine::open(cfg(0)).map_err(anyhow::Error::from)?;
        let nodes = Nodes {
            engines: vec![&e],
            cluster: 1,
            member: false,
        };
        let r = drive(&nodes, &a).map_err(crate::cli::during_run);
        return crate::cli::first_error(
            r,
            e.close()
                .map_err(|e| crate::cli::during_run(anyhow::Error::from(e))),
        );
    }
    let c = Cluster::mem(a.net.nodes, Duration::from_secs(30), cfg).map_err(anyhow::Error::from)?;
    crate::cli::drive_cluster(c, |nodes| drive(nodes, &a))
}

/// `--check-existing`: open (and so recover) the database in --data-dir and check it.
fn check_existing(a: &Args, cache: usize) -> anyhow::Result<ExitCode> {
    if a.net.nodes > 1 || a.net.cluster.is_some() {
        return Err(anyhow::anyhow!(
            "--check-existing is for a single node's data directory"
        ));
    }
    let dir = a.data_dir.as_deref().expect("clap requires --data-dir");
    let c = crate::cli::recovering_config(dir, 0, cache);
    let e = Engine::open(c).map_err(anyhow::Error::from)?;
    if let Some(r) = e.store().replayed() {
        say!(
            "recovered: {} chunks, {} records, {:.1} MB of log, {} pages, {:.2} s",
            r.chunks,
            r.records,
            r.log_bytes as f64 / 1e6,
            r.pages,
            r.seconds
        );
    }
    let r = (|| {
        let w = e.worker();
        let tables = Tables::get(&w, false, vec![0; a.warehouses as usize])
            .map_err(|err| anyhow::anyhow!("opening the TPC-C tables: {err}"))?;
        let mut bad = Vec::new();
        for wh in 1..=a.warehouses {
            bad.extend(check::warehouse(&w, &tables, wh).map_err(anyhow::Error::from)?);
        }
        say_check(&bad, a.warehouses);
        Ok(if bad.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    })();
    crate::cli::first_error(r, e.close().map_err(anyhow::Error::from))
}

/// Print the consistency check's result (the first 20 violations).
fn say_check(bad: &[String], warehouses: u16) {
    if bad.is_empty() {
        say!(
            "check: consistency conditions 1-4 hold on {}",
            match warehouses {
                1 => "the warehouse".to_string(),
                n => format!("all {n} warehouses"),
            }
        );
    } else {
        say!("check: {} violations", bad.len());
        for b in bad.iter().take(20) {
            say!("  {b}");
        }
    }
}

fn drive(nodes: &Nodes, a: &Args) -> anyhow::Result<ExitCode> {
    let w0 = nodes.engines[0].worker();
    let node_of: Vec<u8> = (1..=a.warehouses)
        .map(|w| {
            (0..nodes.cluster)
                .find(|&n| {
                    let (lo, hi) = share(a.warehouses, n, nodes.cluster);
                    (lo..=hi).contains(&w)
                })
                .expect("every warehouse has a node") as u8
        })
        .collect();
    let run_only = a.phase == Some(Phase::Run);
    let made = if nodes.leads() && !run_only {
        let exists = |e: shoal_btree::TreeError| match e {
            shoal_btree::TreeError::Exists(_) => anyhow::Error::new(crate::cli::Usage(format!(
                "the data directory already holds a TPC-C database; use an empty --data-dir ({e})"
            ))),
            e => anyhow::Error::from(e),
        };
        Some(Tables::get(&w0, true, node_of.clone()).map_err(exists))
    } else {
        None
    };
    // the others open the tables once node 0 made them (a failure there still meets them)
    nodes.barrier("tables created")?;
    let tables = match made {
        Some(t) => t?,
        None => Tables::get(&w0, false, node_of)
            .map_err(|e| anyhow::anyhow!("opening the tables: {e}"))?,
    };
    let mut rng = SmallRng::seed_from_u64(a.seed);
    let dir = a.data_dir.as_deref();
    // a run on a kept database: the load's constants, and history keys of its own
    let mut set = match (run_only, dir) {
        (true, Some(d)) => Some(dataset::TpccSet::read(d)?),
        _ => None,
    };
    let load_c = match &set {
        Some(s) => s.load_constants(),
        None => Constants::load(&mut rng),
    };
    let run_c = Constants::run(&load_c, &mut rng);
    let run_number = set.as_ref().map_or(0, |s| s.runs + 1);
    if run_only {
        return run_kept(nodes, &tables, a, &run_c, run_number, set.as_mut(), &w0);
    }

    let load_s = populate(nodes, &tables, a, &load_c)?;
    if crate::stop::requested() {
        say!(
            "load {} after {load_s:.1} s: the database is incomplete (the store is closed clean)",
            crate::stop::STOPPED
        );
        return Ok(ExitCode::from(crate::stop::STOPPED_EXIT));
    }
    let pages: u64 = nodes.engines.iter().map(|e| e.store().high_water()).sum();
    let mine: u16 = nodes
        .engines
        .iter()
        .map(|e| {
            let (lo, hi) = share(a.warehouses, e.node_id() as usize, nodes.cluster);
            hi - lo + 1
        })
        .sum();
    say!(
        "load: {} in {load_s:.1} s, {} of pages ({} per warehouse)",
        count(mine as u64, "warehouse"),
        format_bytes(pages * 4096),
        format_bytes(pages * 4096 / mine as u64),
    );
    nodes.barrier("loaded")?;
    if a.phase == Some(Phase::Load) {
        let d = dir.expect("load has a data directory");
        if nodes.leads() {
            dataset::TpccSet::new(a.warehouses, nodes.cluster, &load_c).write(d)?;
        }
        say!(
            "loaded {} into {} (next: shoal tpcc run --data-dir {} ...)",
            count(a.warehouses as u64, "warehouse"),
            d.display(),
            d.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    finish_run(nodes, &tables, a, &run_c, 0, pages, load_s, &w0)
}

/// `shoal tpcc run`: run on the kept database, report, and count the run in its description.
fn run_kept(
    nodes: &Nodes,
    tables: &Tables,
    a: &Args,
    run_c: &Constants,
    run_number: u64,
    set: Option<&mut dataset::TpccSet>,
    w0: &shoal_engine::Worker,
) -> anyhow::Result<ExitCode> {
    let set = set.expect("a run reads the description first");
    if run_number > 255 {
        // (a run's number is the top byte of its history rows' keys)
        return Err(anyhow::Error::new(crate::cli::Usage(format!(
            "the database has had {} runs, the most one takes: load a new one",
            set.runs
        ))));
    }
    let pages: u64 = nodes.engines.iter().map(|e| e.store().high_water()).sum();
    say!(
        "opened {} loaded {} ({} runs before this one)",
        count(set.warehouses as u64, "warehouse"),
        set.loaded_utc,
        set.runs
    );
    let code = finish_run(nodes, tables, a, run_c, run_number, pages, 0.0, w0)?;
    set.runs = run_number;
    let d = a.data_dir.as_deref().expect("run has a data directory");
    set.write(d)?;
    Ok(code)
}

/// The measured run, the check and the report.
#[allow(clippy::too_many_arguments)]
fn finish_run(
    nodes: &Nodes,
    tables: &Tables,
    a: &Args,
    run_c: &Constants,
    run_number: u64,
    pages: u64,
    load_s: f64,
    w0: &shoal_engine::Worker,
) -> anyhow::Result<ExitCode> {
    let out = run_phase(nodes, tables, a, run_c, tables.node_of(), run_number)?;
    nodes.barrier("run over")?;
    let check = if a.check && nodes.leads() {
        let mut bad = Vec::new();
        for w in 1..=a.warehouses {
            bad.extend(check::warehouse(w0, tables, w).map_err(anyhow::Error::from)?);
        }
        Some(bad)
    } else {
        None
    };
    // the others stay until node 0 has read their pages
    nodes.barrier("checked")?;
    let mut doc = report(a, &out, pages, load_s, check.as_deref())?;
    // (beside the report: one json! more would pass the macro's recursion limit)
    doc["keying_ms"] = json!(a.terminal_times().map(|t| t.0));
    doc["think_ms"] = json!(a.terminal_times().map(|t| t.1));
    doc["phase"] = json!(if run_number > 0 {
        "run"
    } else {
        "load and run"
    });
    doc["run_number"] = json!(run_number);
    write_json(a, &doc)?;
    Ok(exit_code(&doc))
}

fn write_json(a: &Args, doc: &serde_json::Value) -> anyhow::Result<()> {
    if let Some(path) = &a.json {
        crate::report::write_json(path, doc)?;
    }
    Ok(())
}

/// When this run started (for the report's `run.started_utc`).
static STARTED: std::sync::OnceLock<std::time::SystemTime> = std::sync::OnceLock::new();

/// 1 when the run had errors, anomalies where they are impossible, or check violations.
fn exit_code(doc: &serde_json::Value) -> ExitCode {
    let bad = doc["errors"].as_u64() != Some(0)
        || doc["anomalies_are_errors"].as_bool() != Some(false)
        || doc["check"]["violations"].as_u64().is_some_and(|v| v > 0);
    if bad {
        ExitCode::from(1)
    } else if crate::stop::requested() {
        ExitCode::from(crate::stop::STOPPED_EXIT)
    } else {
        ExitCode::SUCCESS
    }
}

/// Load every node's warehouses with its own workers (items on node 0); progress bar.
fn populate(nodes: &Nodes, t: &Tables, a: &Args, c: &Constants) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let done = AtomicU64::new(0);
    let whs: u64 = nodes
        .engines
        .iter()
        .map(|e| {
            let (lo, hi) = share(a.warehouses, e.node_id() as usize, nodes.cluster);
            (hi - lo + 1) as u64
        })
        .sum();
    let items = if nodes.leads() { load::ITEMS as u64 } else { 0 };
    let total = items + whs * load::ROWS_PER_WAREHOUSE;
    let bar = crate::cli::progress(total, "rows", a.quiet);
    let r: anyhow::Result<()> = std::thread::scope(|s| {
        let mut hs = Vec::new();
        for &e in &nodes.engines {
            let n = e.node_id() as usize;
            let (lo, hi) = share(a.warehouses, n, nodes.cluster);
            let workers = a.workers.min((hi - lo + 1) as usize).max(1);
            for k in 0..workers {
                let done = &done;
                let seed = a.seed ^ ((n as u64) << 32 | k as u64).wrapping_mul(0x9E37_79B9);
                hs.push(s.spawn(move || -> anyhow::Result<()> {
                    let w = e.worker();
                    let mut rng = SmallRng::seed_from_u64(seed);
                    if n == 0 {
                        // the item table, split over node 0's loaders
                        let per = load::ITEMS / workers as u32;
                        let lo = 1 + per * k as u32;
                        let hi = if k + 1 == workers {
                            load::ITEMS
                        } else {
                            lo + per - 1
                        };
                        load::items(&w, t, lo, hi, &mut rng, done).map_err(anyhow::Error::from)?;
                    }
                    for wid in (lo..=hi).filter(|x| (x - lo) as usize % workers == k) {
                        if crate::stop::requested() {
                            break; // Ctrl-C: the warehouses loaded so far stay
                        }
                        load::warehouse(&w, t, wid, c, &mut rng, done)
                            .map_err(|e| anyhow::anyhow!("loading warehouse {wid}: {e}"))?;
                    }
                    Ok(())
                }));
            }
        }
        crate::cli::join_loaders(hs, &bar, &done, total, |e| e)
    });
    r?;
    bar.finish_and_clear();
    Ok(t0.elapsed().as_secs_f64())
}

/// Print the summary (and the check's result) and return the run's JSON document: the same
/// fields for a node process and for the merged report of a tcp cluster (`tcp.rs`), plus the
/// raw counts and histograms that merging needs.
fn report(
    a: &Args,
    o: &RunOut,
    pages: u64,
    load_s: f64,
    check: Option<&[String]>,
) -> anyhow::Result<serde_json::Value> {
    let t = &o.tally;
    let committed: u64 = t.count.iter().sum();
    let tps = committed as f64 / o.secs;
    let new_orders = t.count[0] - t.rollbacks;
    let tpm_c = new_orders as f64 / o.secs * 60.0;
    say!(
        "tpcc: {}, {} in this report, {}, mode {:?}, {:.1} s measured",
        count(a.warehouses as u64, "warehouse"),
        count(o.per_node.len() as u64, "node"),
        count(o.threads as u64, "worker"),
        a.mode,
        o.secs
    );
    if let Some((keying, think)) = a.terminal_times() {
        let ms = |t: [u32; 5]| t.map(|x| x.to_string()).join(",");
        say!(
            "  terminals: keying {} ms, mean think {} ms, per type (waits not in the latencies)",
            ms(keying),
            ms(think)
        );
    }
    if a.weights != txn::STANDARD_WEIGHTS {
        say!(
            "  mix: weights {} for {} (not TPC-C's standard mix 45,43,4,4,4)",
            a.weights.map(|w| w.to_string()).join(","),
            txn::TYPES.join(", ")
        );
    }
    if crate::stop::requested() {
        say!(
            "  ({}: the figures cover the part that ran)",
            crate::stop::STOPPED
        );
    }
    say!(
        "  {:<13} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7}",
        "transaction",
        "count",
        "per s",
        "avg us",
        "min us",
        "p50 us",
        "p95 us",
        "p99 us",
        "max us",
        "aborts",
        "abort %"
    );
    let mut types = serde_json::Map::new();
    let mut hists = serde_json::Map::new();
    for (i, name) in txn::TYPES.iter().enumerate() {
        let h = &t.hist[i];
        // (microseconds; all zero for a type that did not run)
        let (avg, min, p50, p95, p99, max) = if h.is_empty() {
            (0.0, 0, 0, 0, 0, 0)
        } else {
            let q = |x: f64| h.value_at_quantile(x);
            (h.mean(), h.min(), q(0.5), q(0.95), q(0.99), h.max())
        };
        // conflicts per try: aborted tries / all tries
        let abort_rate = t.aborts[i] as f64 / (t.count[i] + t.aborts[i]).max(1) as f64;
        say!(
            "  {:<13} {:>9} {:>9.0} {:>8.0} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>6.2}%",
            name,
            t.count[i],
            t.count[i] as f64 / o.secs,
            avg,
            min,
            p50,
            p95,
            p99,
            max,
            t.aborts[i],
            100.0 * abort_rate
        );
        types.insert(
            name.to_string(),
            json!({"count": t.count[i], "per_s": t.count[i] as f64 / o.secs, "avg_us": avg,
                   "min_us": min, "p50_us": p50, "p95_us": p95, "p99_us": p99, "max_us": max,
                   "aborts": t.aborts[i], "abort_rate": abort_rate}),
        );
        hists.insert(name.to_string(), crate::report::hist_json(h));
    }
    let share = |n: u64| {
        if committed > 0 {
            n as f64 / committed as f64
        } else {
            0.0
        }
    };
    say!(
        "  total {tps:.0} txn/s; {tpm_c:.0} NewOrders/min; {} rollbacks ({:.2}% of NewOrders); remote-warehouse share {:.2}%, remote-node share {:.2}%; {} errors",
        t.rollbacks,
        100.0 * t.rollbacks as f64 / t.count[0].max(1) as f64,
        100.0 * share(t.remote_warehouse),
        100.0 * share(t.remote_node),
        t.errors
    );
    for (n, c) in &o.per_node {
        say!(
            "  node {n}: remote fetches {:.0}/s, NVMe reads {:.0}/s, writes {:.0}/s{}",
            c[0] as f64 / o.secs,
            c[1] as f64 / o.secs,
            c[2] as f64 / o.secs,
            if o.per_node.len() > 1 {
                format!(
                    "; one pool: NVMe reads avoided {:.0}/s, pages served for others {:.0}/s, given away {:.0}/s, taken in {:.0}/s",
                    c[3] as f64 / o.secs,
                    c[4] as f64 / o.secs,
                    c[5] as f64 / o.secs,
                    c[6] as f64 / o.secs
                )
            } else {
                String::new()
            }
        );
    }
    if a.durability.logged() {
        say!("  log: {}", o.log.summary(o.secs));
    }
    if let Some(e) = &t.first_error {
        say!("  first error (the run stopped there): {e}");
    }
    // transactions are serializable in every mode: a half-done order seen is a bug
    let anomalies_are_errors = t.anomalies > 0;
    if t.anomalies > 0 {
        say!(
            "  {} reads saw an order half inserted by another transaction: isolation broke, an \
             error",
            t.anomalies
        );
    }
    let check = check.map(|bad| {
        say_check(bad, a.warehouses);
        json!({"violations": bad.len(), "first": bad.iter().take(20).collect::<Vec<_>>()})
    });
    Ok(json!({
        "schema": crate::report::SCHEMA,
        "command": "tpcc",
        "run": crate::report::run_facts(a.seed, *STARTED.get_or_init(std::time::SystemTime::now)),
        "stopped_by_signal": crate::stop::requested(),
        "rate_txn_per_s": a.rate,
        "weights": txn::TYPES.iter().zip(a.weights).map(|(t, w)| (t.to_string(), json!(w))).collect::<serde_json::Map<_, _>>(),
        "warehouses": a.warehouses,
        "nodes": o.per_node.len(),
        "workers": o.threads,
        "durability": a.durability.to_string(),
        "log": crate::cli::log_json(&o.log, o.secs, a.durability.logged()),
        "mode": format!("{:?}", a.mode).to_lowercase(),
        "cache": a.cache,
        "data_bytes": pages * 4096,
        "load_s": load_s,
        "duration_s": o.secs,
        "transactions": committed,
        "throughput_txn_per_s": tps,
        "new_orders_per_min": tpm_c,
        "rollbacks": t.rollbacks,
        "remote_warehouse_share": share(t.remote_warehouse),
        "remote_node_share": share(t.remote_node),
        "remote_warehouse_txns": t.remote_warehouse,
        "remote_node_txns": t.remote_node,
        "errors": t.errors,
        "anomalies": t.anomalies,
        "anomalies_are_errors": anomalies_are_errors,
        "first_error": t.first_error,
        "check": check,
        "types": types,
        "histograms_us": hists,
        "per_node": o.per_node.iter().map(|(n, c)| json!({
            "node": n,
            "remote_fetches": c[0],
            "nvme_reads": c[1],
            "nvme_writes": c[2],
            "nvme_reads_avoided": c[3],
            "pages_served_for_others": c[4],
            "pages_given_away": c[5],
            "pages_taken_in": c[6],
        })).collect::<Vec<_>>(),
    }))
}

/// `1 warehouse`, `2 warehouses`.
fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
