//! `shoal ycsb`: load a table of `--records` keys, then run a YCSB core workload for
//! `--duration` seconds after `--warmup`, printing one line per second and a summary (and JSON
//! with `--json`). Every value read is checked (see [`crate::value`]); a run with value errors
//! exits with status 1.

mod flags;
mod names;
mod props;
mod tcp;

mod args;
mod dataset;
mod report;
mod series;
mod stream;
pub use args::Args;
use args::*;
use dataset::*;
pub use flags::ycsb_style;
pub use names::KeyNames;
use names::*;
use report::*;
use series::*;
use stream::*;

use crate::cli::{parse_wal_size, ClusterArgs, Nodes, Transport};
use crate::harness;
use crate::value;
use crate::workload::{Dist, KeyChooser, Mix, Op};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use shoal_btree::{decode_u64, BTree, Direction, TreeError, MAX_VALUE};
use shoal_engine::{
    format_bytes, Cluster, ClusterFile, Engine, EngineConfig, ProtocolStats, StatsSnapshot,
};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where `shoal ycsb load` / `run` keep the data set without `--data-dir`.
const DEFAULT_DATA_SET_DIR: &str = "shoal-ycsb-data";

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
    // a load into a directory that holds a data set adds its range of records (YCSB's
    // insertstart / insertcount: a load spread over several invocations)
    let adding = a.phase == Some(Phase::Load)
        && a.data_dir
            .as_deref()
            .is_some_and(|d| d.join(DATA_SET_FILE).exists());
    let kept = a.phase == Some(Phase::Run) || adding;
    if let (true, Some(d)) = (kept, a.data_dir.as_deref()) {
        // the run (or the added load) uses the loaded shape; flags that disagree are an error
        let set = DataSet::read(d)?;
        set.matches(&a)?;
        a.records = set.records;
        a.value_size = set.value_size;
        a.keys = Some(set.keys);
        a.zero_padding = set.zero_padding;
        if !a.explicit.iter().any(|e| e == "table") && !props.contains_key("table") {
            a.table = set.table.clone();
        }
        a.value_from_fields = (set.field_length > 0).then(|| {
            let f = set.field_length as u64;
            (set.value_size as u64 / f, f)
        });
        if let Some(d) = set.lengths.drawn() {
            a.value_from_fields = Some((d.count.into(), d.max.into()));
            a.min_field_length = d.min;
            a.field_length_distribution =
                <FieldLengths as clap::ValueEnum>::from_str(d.name, false)
                    .map_err(|e| anyhow::anyhow!("field lengths {}: {e}", d.name))?;
        }
    }
    let mut plan = validate(&a, mix)?;
    if adding {
        let d = a.data_dir.as_deref().expect("adding: a data directory");
        // refused before anything is written if the range was loaded already
        DataSet::read(d)?.add(plan.first, plan.count)?;
        plan.adding = true;
    }
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
        (Some(Phase::Load), Some(d)) if adding => (d.to_path_buf(), None),
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
        if a.phase == Some(Phase::Run) || adding {
            cfg.mode = shoal_engine::OpenMode::Open;
        }
        cfg.devices = a.devices;
        cfg.durability = a.durability;
        cfg.wal_bytes = a.wal_size;
        cfg
    };
    if let (Some(path), Some(id)) = (&a.net.cluster, a.net.id) {
        let file = ClusterFile::load(path).map_err(anyhow::Error::from)?;
        return crate::cli::run_as_member(&file, id, a.durability, a.wal_size, |nodes| {
            drive(nodes, &a, &plan)
        });
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

/// Create or open the table, load this process's share, run, report (or only load, or only
/// run on a loaded table: `plan.phase`).
fn drive(nodes: &Nodes, a: &Args, plan: &Plan) -> anyhow::Result<ExitCode> {
    // a member of a cluster file learns the cluster's size only now
    if plan.workers.len() != 1 && plan.workers.len() != nodes.cluster {
        return Err(anyhow::Error::new(crate::cli::Usage(format!(
            "--workers {}: {} counts for {} nodes (give one for all, or one per node)",
            a.workers,
            plan.workers.len(),
            nodes.cluster
        ))));
    }
    if plan.phase == Some(Phase::Run) {
        return drive_run_phase(nodes, a, plan);
    }
    let first = nodes.engines[0];
    let w0 = first.worker();
    let tree = if first.node_id() == 0 {
        let t = match BTree::open(&w0, &a.table) {
            Ok(t) if plan.adding => t,
            Ok(_) => {
                return Err(anyhow::Error::new(crate::cli::Usage(
                    "the data directory already holds a YCSB table; use an empty --data-dir".into(),
                )))
            }
            Err(_) => BTree::create(&w0, &a.table).map_err(anyhow::Error::from)?,
        };
        nodes.barrier("table created")?;
        t
    } else {
        nodes.barrier("table created")?;
        BTree::open(&w0, &a.table).map_err(anyhow::Error::from)?
    };
    drop(w0);
    say!(
        "shoal ycsb: {} ({}), {}, {} records x {} B{}, {} node{} ({}), {} workers/node{}, cache {}/node, {:?} access, seed {}",
        plan.label,
        mix_text(&plan.mix),
        dist_text(plan.dist),
        a.records,
        a.value_size,
        record_text(plan),
        nodes.cluster,
        if nodes.cluster > 1 { "s" } else { "" },
        if nodes.member { "tcp member" } else if nodes.cluster > 1 { "mem" } else { "embedded" },
        {
            let workers: Vec<String> = nodes
                .engines
                .iter()
                .map(|e| plan.workers_of(e).to_string())
                .collect();
            if workers.iter().all(|w| *w == workers[0]) {
                workers[0].clone()
            } else {
                workers.join(",")
            }
        },
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
    let load_s = load(nodes, &tree, a, plan)?;
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
        let mut set = if plan.adding {
            DataSet::read(dir)?
        } else {
            new_set(a, plan, nodes.cluster)
        };
        set.add(plan.first, plan.count)?;
        set.loaded_utc = crate::report::utc_text(std::time::SystemTime::now());
        set.write(dir)?;
        let missing = set.missing();
        say!(
            "loaded {} records ({}..{}) into {} ({}; next: shoal ycsb run --data-dir {} ...)",
            plan.count,
            plan.first,
            plan.first + plan.count,
            dir.display(),
            if missing == "none" {
                format!("all {} records loaded", set.records)
            } else {
                format!("not loaded yet: {missing}")
            },
            dir.display()
        );
        if let Some(path) = &a.json {
            let doc = json!({
                "schema": crate::report::SCHEMA,
                "command": "ycsb load",
                "run": crate::report::run_facts(plan.seed, plan.started),
                "records": a.records,
                "insert_start": plan.first,
                "insert_count": plan.count,
                "value_size": a.value_size,
                "keys": plan.names.names,
                "fields": fields_json(plan),
                "nodes": nodes.cluster,
                "load_s": load_s,
                "records_per_s": plan.count as f64 / load_s.max(1e-9),
            });
            crate::report::write_json(path, &doc)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut set = new_set(a, plan, nodes.cluster);
    set.add(plan.first, plan.count)?;
    report_run(nodes, &tree, a, plan, &set, load_s).map(|(code, _)| code)
}

/// The description of a data set of this run's shape, nothing loaded yet.
fn new_set(a: &Args, plan: &Plan, nodes: usize) -> DataSet {
    DataSet {
        records: a.records,
        value_size: a.value_size,
        nodes,
        keys: plan.names.names,
        zero_padding: plan.names.zero_padding,
        field_length: if plan.layout.fields() > 1 {
            plan.layout.field
        } else {
            0
        },
        lengths: plan.layout.lengths,
        table: a.table.clone(),
        loaded: Some(Vec::new()),
        next_key: a.records,
        loaded_utc: String::new(),
        runs: 0,
    }
}

/// `shoal ycsb run`: open the table a load left, check it holds every record the load and
/// earlier runs wrote, run, report, and record the keys this run inserted.
fn drive_run_phase(nodes: &Nodes, a: &Args, plan: &Plan) -> anyhow::Result<ExitCode> {
    let dir = a
        .data_dir
        .as_deref()
        .expect("validated: run has --data-dir");
    let mut set = DataSet::read(dir)?;
    if !set.covers(plan.first, plan.count) {
        return Err(anyhow::Error::new(crate::cli::Usage(format!(
            "this run reads and updates records {}..{}, which are not all loaded (not loaded yet: \
             {}): load them (shoal ycsb load with --insert-start / --insert-count, YCSB's \
             insertstart / insertcount), or run on the loaded ones",
            plan.first,
            plan.first + plan.count,
            set.missing()
        ))));
    }
    let w0 = nodes.engines[0].worker();
    let tree = BTree::open(&w0, &a.table).map_err(|e| {
        anyhow::Error::new(crate::cli::Usage(format!(
            "--data-dir {}: no YCSB table ({e}); load one with shoal ycsb load",
            dir.display()
        )))
    })?;
    let t0 = Instant::now();
    let count = tree.count(&w0).map_err(anyhow::Error::from)?;
    drop(w0);
    let loaded = set.loaded_count();
    if count < loaded {
        return Err(anyhow::anyhow!(
            "--data-dir {}: the table holds {count} records, the loads wrote {loaded}: records \
             were lost (shoal inspect {} checks the store)",
            dir.display(),
            dir.display()
        ));
    }
    // A run that crashed wrote its inserts but not the description: the next insert goes past
    // the largest key the table holds, whatever the description says.
    let w0 = nodes.engines[0].worker();
    let largest = largest_record(&tree, &w0, plan.names)?;
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
        "check: {count} records ({loaded} loaded, {} inserted by {} earlier run(s)) in {:.2} s",
        count - loaded,
        set.runs,
        t0.elapsed().as_secs_f64()
    );
    let (code, inserted) = report_run(nodes, &tree, a, plan, &set, 0.0)?;
    set.next_key += inserted * set.nodes as u64;
    set.runs += 1;
    set.write(dir)?;
    Ok(code)
}

/// What a record is made of beyond its size (YCSB's fields, key names), for the header line.
fn record_text(plan: &Plan) -> String {
    let l = plan.layout;
    let mut parts = Vec::new();
    if let Some(d) = l.lengths.drawn() {
        parts.push(format!(
            "{} fields of {} to {} B ({}), read and written whole",
            d.count, d.min, d.max, d.name
        ));
    }
    if l.fields() > 1 {
        let which = |one: bool| if one { "one" } else { "all" };
        parts.push(format!(
            "{} fields of {} B, {} read, {} written",
            l.fields(),
            l.field,
            which(plan.read_one),
            which(plan.write_one)
        ));
    }
    match plan.names.names {
        KeyNames::Integer => {}
        KeyNames::Hashed => parts.push("keys user<hash>".into()),
        KeyNames::Ordered => parts.push("keys user<number>".into()),
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

/// The largest record number the table holds: its last key's, or with key names (in no
/// number order) the largest of every entry's.
fn largest_record(
    tree: &BTree,
    w: &shoal_engine::Worker,
    names: Namer,
) -> anyhow::Result<Option<u64>> {
    if names.names == KeyNames::Integer {
        return Ok(match tree.range::<&[u8]>(w, ..).next_back() {
            Some(entry) => decode_u64(&entry.map_err(anyhow::Error::from)?.0),
            None => None,
        });
    }
    let (mut buf, mut largest) = (Vec::new(), None);
    tree.scan(w, &[], Direction::Ascending, |key, v| {
        largest = largest.max(names.number(key, v, &mut buf));
        true
    })
    .map_err(anyhow::Error::from)?;
    Ok(largest)
}

fn load(nodes: &Nodes, tree: &BTree, a: &Args, plan: &Plan) -> anyhow::Result<f64> {
    let (names, layout) = (plan.names, plan.layout);
    let done = AtomicU64::new(0);
    let t0 = Instant::now();
    let keys = |e: &Engine| Keys {
        records: a.records,
        first: plan.first,
        count: plan.count,
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
            // a node that runs no workers still loads its share
            let workers = (plan.workers_of(e) as u64).min(hi - lo).max(1);
            for t in 0..workers {
                let done = &done;
                let (from, to) = (
                    lo + (hi - lo) * t / workers,
                    lo + (hi - lo) * (t + 1) / workers,
                );
                hs.push(s.spawn(move || -> anyhow::Result<()> {
                    let w = e.worker();
                    let mut v = vec![0u8; a.value_size];
                    let mut key = Vec::new();
                    let mut n = 0;
                    for k in from..to {
                        if crate::stop::requested() {
                            break;
                        }
                        v.resize(layout.size_of(k), 0);
                        layout.fill(&mut v, k, 0);
                        if !tree.insert(&w, names.key(k, &mut key), &v)?.inserted() {
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

/// The streams of a run and what they share: the table, the key space, each stream's
/// operation counter, each node's insert counter and each stream's per-second histograms.
struct YcsbRun<'a> {
    nodes: &'a Nodes<'a>,
    tree: &'a BTree,
    a: &'a Args,
    plan: &'a Plan,
    set: &'a DataSet,
    /// The number of each engine's first worker thread (threads are numbered over every
    /// node, engine by engine).
    first_thread: Vec<usize>,
    counters: Vec<Counter>,
    inserts: Vec<Inserts>,
    /// Each second's latencies per stream and operation type (only for --csv / --hdr).
    intervals: Vec<std::sync::Mutex<Vec<Histogram<u64>>>>,
}

impl harness::Workload for YcsbRun<'_> {
    type Out = Result<WorkerResult, TreeError>;

    fn stream(&self, s: harness::Stream, phase: &harness::RunState) -> Self::Out {
        let (a, e) = (self.a, self.nodes.engines[s.engine]);
        let keys = Keys {
            records: self.set.records,
            first: self.plan.first,
            count: self.plan.count,
            next_key: self.set.next_key,
            node: e.node_id() as u64,
            nodes: self.nodes.cluster as u64,
            partitioned: a.access == Access::Partitioned,
        };
        // this stream's share of --operations and of --target
        let n = s.streams as u64;
        let i = s.index;
        let share = Share {
            quota: a.operations.map(|o| o / n + u64::from((i as u64) < o % n)),
            pace: a.target.map(|t| Duration::from_secs_f64(n as f64 / t)),
            interval: self.intervals.get(i),
        };
        // the seed's stream number is the stream's number on its node (with one task, the
        // worker thread's number there)
        let on_node = (s.thread - self.first_thread[s.engine]) * a.tasks + s.task;
        worker_loop(
            e,
            self.tree,
            a,
            self.plan,
            keys,
            on_node,
            share,
            phase,
            &self.counters[i].0,
            (&self.inserts, &self.inserts[s.engine]),
        )
    }
}

/// The supervisor of a YCSB run: the per-second line, the `--csv`/`--hdr` series, the
/// counters at the start of the measurement.
struct YcsbWatch<'a> {
    run: &'a YcsbRun<'a>,
    series: Option<Series>,
    start: Instant,
    before: Vec<Snap>,
    /// The last second's time, operations and summed counters (the per-second line).
    last: (Instant, u64, (StatsSnapshot, u64)),
}

impl YcsbWatch<'_> {
    fn snaps(&self) -> Vec<Snap> {
        self.run.nodes.engines.iter().map(|e| snap(e)).collect()
    }

    fn total_ops(&self) -> u64 {
        self.run
            .counters
            .iter()
            .map(|c| c.0.load(Ordering::Relaxed))
            .sum()
    }
}

/// The nodes' counters summed: (hits, faults, NVMe reads and writes) and remote fetches.
fn sum(v: &[Snap]) -> (StatsSnapshot, u64) {
    v.iter()
        .fold((StatsSnapshot::default(), 0u64), |(mut s, r), (x, q, _)| {
            s.hits += x.hits;
            s.faults += x.faults;
            s.store_reads += x.store_reads;
            s.store_writes += x.store_writes;
            (s, r + q)
        })
}

impl harness::Supervisor for YcsbWatch<'_> {
    fn measuring(&mut self) {
        self.before = self.snaps();
    }

    fn second(&mut self, tick: u64, warm: bool, whole: bool) -> anyhow::Result<()> {
        let snaps = self.snaps();
        if let Some(series) = &mut self.series {
            let per_op = take_intervals(&self.run.intervals);
            series.second(self.start, &per_op, &snaps, warm)?;
        }
        // a line every --status-interval seconds (YCSB's status.interval), over that interval
        if !self.run.a.quiet && whole && tick.is_multiple_of(self.run.a.status_interval) {
            let now = (Instant::now(), self.total_ops(), sum(&snaps));
            let last = &self.last;
            let dt = now.0.duration_since(last.0).as_secs_f64();
            let d = delta(&last.2 .0, &now.2 .0);
            let remote = now.2 .1 - last.2 .1;
            let hit = 100.0 * hit_ratio(&d, remote);
            say!(
                "[{:>4}s{}] {:>10.0} ops/s  hit {:>6.2}%  remote {:>7.0}/s  nvme r {:>7.0}/s w {:>7.0}/s",
                tick,
                // the second began in the warm-up (as the CSV marks it)
                if warm { " warm" } else { "" },
                (now.1 - last.1) as f64 / dt,
                hit,
                remote as f64 / dt,
                d.store_reads as f64 / dt,
                d.store_writes as f64 / dt
            );
            self.last = now;
        }
        Ok(())
    }
}

/// Run the workload on `tree` for `a`'s warm-up and duration (or until every stream did its
/// share of `--operations`): the streams' results, the measured seconds, the nodes' counters
/// at the start and the end of the measurement, and the most keys one node inserted.
fn run_phase(
    nodes: &Nodes,
    tree: &BTree,
    a: &Args,
    plan: &Plan,
    set: &DataSet,
) -> anyhow::Result<RunOutput> {
    // each node's --workers threads (a thread is the index of its engine in `nodes.engines`)
    let per_engine: Vec<usize> = nodes.engines.iter().map(|e| plan.workers_of(e)).collect();
    let threads: Vec<usize> = per_engine
        .iter()
        .enumerate()
        .flat_map(|(n, &w)| std::iter::repeat_n(n, w))
        .collect();
    let first_thread = per_engine
        .iter()
        .scan(0, |next, &w| {
            let first = *next;
            *next += w;
            Some(first)
        })
        .collect();
    // a stream of operations: one per worker thread, or per task with --tasks
    let n_units = threads.len() * a.tasks;
    let run = YcsbRun {
        nodes,
        tree,
        a,
        plan,
        set,
        first_thread,
        counters: (0..n_units).map(|_| Counter::default()).collect(),
        inserts: nodes.engines.iter().map(|_| Inserts::default()).collect(),
        intervals: if a.csv.is_some() || a.hdr.is_some() {
            (0..n_units)
                .map(|_| std::sync::Mutex::new((0..5).map(|_| crate::report::hist()).collect()))
                .collect()
        } else {
            Vec::new()
        },
    };
    let start = Instant::now();
    let mut watch = YcsbWatch {
        run: &run,
        series: Series::create(a, nodes.engines.len())?,
        start,
        before: Vec::new(),
        last: (start, 0, (StatsSnapshot::default(), 0)),
    };
    let first = watch.snaps();
    watch.last = (Instant::now(), 0, sum(&first));
    if let Some(series) = &mut watch.series {
        series.last = Some((start, first.clone()));
    }
    let timing = harness::Timing {
        warmup: Duration::from_secs_f64(a.warmup),
        duration: Duration::from_secs_f64(a.duration),
        // with --operations the run ends when the workers are done: look every 10 ms
        poll: a.operations.map(|_| Duration::from_millis(10)),
        until_all_finished: a.operations.is_some(),
    };
    let ran = harness::run(&threads, a.tasks, timing, &run, &mut watch)?;
    let after = watch.snaps();
    let before = if watch.before.is_empty() {
        first
    } else {
        std::mem::take(&mut watch.before)
    };
    if let Some(series) = watch.series.take() {
        series.finish()?;
    }
    let mut out = Vec::new();
    for t in ran.threads {
        for r in t.map_err(|e| anyhow::anyhow!("{e}"))? {
            out.push(r.map_err(|e| anyhow::anyhow!("the run failed: {e}"))?);
        }
    }
    let inserted = run.inserts.iter().map(Inserts::started).max().unwrap_or(0);
    Ok((out, ran.measured, before, after, inserted))
}
