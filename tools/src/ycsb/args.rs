//! `shoal ycsb`'s command line ([`Args`]) and what a run is made of once it is checked
//! ([`Plan`]).

use super::*;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Distribution {
    Uniform,
    /// (YCSB's name, `zipfian`, works too)
    #[value(alias = "zipfian")]
    Zipf,
    Latest,
    /// YCSB's hotspot (--hotspot-data-fraction, --hotspot-op-fraction).
    Hotspot,
    /// YCSB's sequential: each worker walks the keys in order.
    Sequential,
    /// YCSB's exponential over recency (--exponential-percentile, --exponential-frac).
    Exponential,
}

/// Which part of a YCSB run to do.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Load the table into an empty --data-dir, close it, stop.
    Load,
    /// Run the workload on the table a `load` left in --data-dir (checked first).
    Run,
}

/// YCSB's scanlengthdistribution.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanLengths {
    Uniform,
    Zipfian,
}

/// YCSB's fieldlengthdistribution.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldLengths {
    Constant,
    Uniform,
    Zipfian,
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
    /// The first record this load inserts, and a run's reads and updates choose from
    /// (YCSB's insertstart; 0 by default). Loads of separate ranges into one --data-dir add up
    /// to the table, as YCSB's clients spread a load.
    #[arg(long)]
    pub insert_start: Option<u64>,
    /// How many records from --insert-start (YCSB's insertcount; the rest of --records by
    /// default).
    #[arg(long)]
    pub insert_count: Option<u64>,
    /// Make each value of fields of this many bytes, each checked on its own (YCSB's
    /// fieldlength; --value-size a multiple of it). YCSB's properties make 10 of 100 bytes.
    #[arg(long)]
    pub field_length: Option<usize>,
    /// How long each field is (YCSB's fieldlengthdistribution): constant (--field-length or
    /// fieldlength bytes each), or uniform or zipfian from --min-field-length to that: a record
    /// is then one value as long as its fields together, drawn from its number, read and
    /// written whole.
    #[arg(long, value_enum, default_value = "constant")]
    pub field_length_distribution: FieldLengths,
    /// The shortest field under a uniform or zipfian --field-length-distribution (YCSB's
    /// minfieldlength).
    #[arg(long, default_value_t = 1)]
    pub min_field_length: u32,
    /// With YCSB's fields (fieldcount x fieldlength): false reads one field, chosen at random
    /// (YCSB's readallfields; default true).
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub read_all_fields: Option<bool>,
    /// With YCSB's fields: false makes an update (and a read-modify-write's write) change one
    /// field, chosen at random (YCSB's writeallfields; default false, as YCSB's).
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub write_all_fields: Option<bool>,
    /// The keys without --keys or insertorder: hashed with YCSB's properties, else integer.
    #[arg(skip = KeyNames::Integer)]
    pub default_keys: KeyNames,
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
    /// Worker threads per node: one count for every node, or one per node separated by
    /// commas (`4,0`: node 1 runs no workers and only serves node 0's misses).
    #[arg(long, default_value = "2")]
    pub workers: String,
    /// Tasks per worker thread (1: no tasks). Each task runs its own stream of operations; a
    /// task that misses (NVMe read, remote fetch) pauses and the thread runs another, so one
    /// thread keeps many reads in flight (docs/ycsb.md, "Tasks").
    #[arg(long, default_value_t = 1)]
    pub tasks: usize,
    /// Records loaded before the run.
    #[arg(long, default_value_t = 200_000)]
    pub records: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 128)]
    pub value_size: usize,
    /// The table's keys: integer (8-byte numbers in order), hashed (YCSB's `user` and the
    /// hash of the number: inserts land all over the key space) or ordered (YCSB's `user` and
    /// the number). Default: hashed with YCSB's properties (-P/-p, its insertorder default),
    /// else integer; a run on a kept data set uses the loaded keys.
    #[arg(long, value_enum)]
    pub keys: Option<KeyNames>,
    /// With hashed or ordered keys: the digits the number is padded to with zeros (YCSB's
    /// zeropadding; 1 pads nothing).
    #[arg(long, default_value_t = 1)]
    pub zero_padding: usize,
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
    /// Hotspot: the share of the keys that is hot (YCSB's hotspotdatafraction).
    #[arg(long, default_value_t = 0.2)]
    pub hotspot_data_fraction: f64,
    /// Hotspot: the share of the requests that go to the hot keys (hotspotopnfraction).
    #[arg(long, default_value_t = 0.8)]
    pub hotspot_op_fraction: f64,
    /// Exponential: the percentage of requests that fall within the newest
    /// --exponential-frac of the keys (YCSB's exponential.percentile).
    #[arg(long, default_value_t = 95.0)]
    pub exponential_percentile: f64,
    /// Exponential: see --exponential-percentile (YCSB's exponential.frac).
    #[arg(long, default_value_t = 0.857_142_857_1)]
    pub exponential_frac: f64,
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
    /// How long scans are, from 1 to --max-scan (YCSB's scanlengthdistribution): uniform, or
    /// zipfian (the shortest the most likely).
    #[arg(long, value_enum, default_value = "uniform")]
    pub scan_length_distribution: ScanLengths,
    /// The table (YCSB's table: the tree's name in the catalog).
    #[arg(long, default_value = "usertable")]
    pub table: String,
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
    /// Seconds between status lines (YCSB's status.interval); each line's rates cover them.
    #[arg(long, default_value_t = 1)]
    pub status_interval: u64,
    /// No per-second lines and no progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// The most worker threads one node runs.
const MAX_WORKERS: usize = 1024;

/// `--workers`: one count for every node, or one per node separated by commas (checked against
/// `nodes` when the cluster's size is known here; a member of a cluster file checks it once it
/// knows the file's). A node may run no workers, but some node must (a member given one count
/// may run none: the other members' flags are not known here).
pub(super) fn parse_workers(s: &str, nodes: Option<usize>) -> anyhow::Result<Vec<usize>> {
    let counts = s
        .split(',')
        .map(|p| p.trim().parse::<usize>())
        .collect::<Result<Vec<usize>, _>>()
        .map_err(|e| anyhow::anyhow!("--workers {s}: {e} (a count, or one per node: 4,0)"))?;
    if let Some(&n) = counts.iter().find(|&&n| n > MAX_WORKERS) {
        return Err(anyhow::anyhow!(
            "--workers {s}: {n} workers on one node; use at most {MAX_WORKERS}"
        ));
    }
    // one count for a member of a cluster file is its own: a member may only serve
    let member_alone = nodes.is_none() && counts.len() == 1;
    if counts.iter().all(|&n| n == 0) && !member_alone {
        return Err(anyhow::anyhow!(
            "--workers {s}: some node must run workers (1 to {MAX_WORKERS})"
        ));
    }
    if let Some(nodes) = nodes {
        if counts.len() != 1 && counts.len() != nodes {
            return Err(anyhow::anyhow!(
                "--workers {s}: {} counts for {nodes} nodes (give one for all, or one per node)",
                counts.len()
            ));
        }
    }
    Ok(counts)
}

pub(super) struct Plan {
    pub(super) phase: Option<Phase>,
    pub(super) mix: Mix,
    pub(super) dist: Dist,
    /// The records this run loads, and reads and updates: `first..first + count`.
    pub(super) first: u64,
    pub(super) count: u64,
    /// A load adds its records to a kept data set (which has others).
    pub(super) adding: bool,
    /// The table's keys.
    pub(super) names: Namer,
    /// The values: one self-checked field, or YCSB's fields.
    pub(super) layout: value::Layout,
    /// Reads take one field (readallfields=false).
    pub(super) read_one: bool,
    /// Updates write one field (writeallfields=false).
    pub(super) write_one: bool,
    /// Cache of each node (`--cache`, one entry per node).
    pub(super) caches: Vec<usize>,
    /// Worker threads of each node (`--workers`): one entry for every node, or one per node.
    pub(super) workers: Vec<usize>,
    pub(super) label: String,
    pub(super) seed: u64,
    pub(super) started: std::time::SystemTime,
}

impl Plan {
    /// Worker threads on node `node`.
    pub(super) fn workers_on(&self, node: usize) -> usize {
        match self.workers.as_slice() {
            [n] => *n,
            per_node => per_node[node],
        }
    }

    /// Worker threads on the node that engine `e` runs.
    pub(super) fn workers_of(&self, e: &shoal_engine::Engine) -> usize {
        self.workers_on(e.node_id() as usize)
    }
}

pub(super) fn validate(a: &Args, mix_from_props: Option<Mix>) -> anyhow::Result<Plan> {
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
    let workers = parse_workers(&a.workers, a.net.cluster.is_none().then_some(a.net.nodes))?;
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
    if a.table.is_empty() || a.table.len() > 64 {
        return Err(anyhow::anyhow!(
            "--table {:?}: a name of 1 to 64 bytes",
            a.table
        ));
    }
    if a.status_interval == 0 {
        return Err(anyhow::anyhow!(
            "--status-interval must be at least 1 second"
        ));
    }
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
        Some(Distribution::Hotspot) => {
            let fraction = |flag: &str, v: f64| {
                if (0.0..=1.0).contains(&v) {
                    Ok(v)
                } else {
                    Err(anyhow::anyhow!("{flag} {v}: use a fraction in [0, 1]"))
                }
            };
            Dist::Hotspot {
                data: fraction("--hotspot-data-fraction", a.hotspot_data_fraction)?,
                op: fraction("--hotspot-op-fraction", a.hotspot_op_fraction)?,
            }
        }
        Some(Distribution::Sequential) => Dist::Sequential,
        Some(Distribution::Exponential) => {
            let (p, f) = (a.exponential_percentile, a.exponential_frac);
            if !(p > 0.0 && p < 100.0 && f > 0.0 && f <= 1.0) {
                return Err(anyhow::anyhow!(
                    "--exponential-percentile {p} and --exponential-frac {f}: use a percentage in \
                     (0, 100) and a fraction in (0, 1]"
                ));
            }
            Dist::Exponential {
                percentile: p,
                frac: f,
            }
        }
        None if wc == Some('d') => Dist::Latest(a.zipf_theta),
        None => Dist::Zipf(a.zipf_theta),
    };
    let caches = crate::cli::parse_caches(&a.cache, a.net.nodes)?;
    if a.zero_padding == 0 || a.zero_padding > MAX_ZERO_PADDING {
        return Err(anyhow::anyhow!(
            "--zero-padding {}: use 1 to {MAX_ZERO_PADDING} digits",
            a.zero_padding
        ));
    }
    let first = a.insert_start.unwrap_or(0);
    let count = a.insert_count.unwrap_or(a.records.saturating_sub(first));
    if first.checked_add(count).is_none_or(|end| end > a.records) || count < a.net.nodes as u64 {
        return Err(anyhow::anyhow!(
            "--insert-start {first} --insert-count {count}: the records must lie within \
             --records {} (0..{}), at least one per node",
            a.records,
            a.records
        ));
    }
    let names = Namer {
        names: a.keys.unwrap_or(a.default_keys),
        zero_padding: a.zero_padding,
    };
    // YCSB's fields, each self-checked, when the record is made of them (and a field holds
    // the check's header)
    let from_flag = match a.field_length {
        Some(l) if l < value::MIN_VALUE || !a.value_size.is_multiple_of(l) => {
            return Err(anyhow::anyhow!(
                "--field-length {l}: use at least {} bytes, a divisor of --value-size {}",
                value::MIN_VALUE,
                a.value_size
            ))
        }
        Some(l) => Some(((a.value_size / l) as u64, l as u64)),
        None => None,
    };
    let fields = from_flag.or(a.value_from_fields);
    let layout = match (a.field_length_distribution, fields) {
        (FieldLengths::Constant, Some((count, len)))
            if count > 1
                && len as usize >= value::MIN_VALUE
                && (count * len) as usize == a.value_size =>
        {
            value::Layout {
                size: a.value_size,
                field: len as usize,
                lengths: value::Lengths::Constant,
            }
        }
        (FieldLengths::Constant, _) => value::Layout::whole(a.value_size),
        (d, Some((count, len))) => {
            let (min, max) = (a.min_field_length, len as u32);
            if min == 0 || min > max {
                return Err(anyhow::anyhow!(
                    "--min-field-length {min}: use 1 to the field length ({max})"
                ));
            }
            let count = count as u32;
            value::Layout {
                size: a.value_size,
                field: a.value_size,
                lengths: match d {
                    FieldLengths::Uniform => value::Lengths::Uniform { count, min, max },
                    _ => value::Lengths::Zipfian { count, min, max },
                },
            }
        }
        (_, None) => {
            return Err(anyhow::anyhow!(
                "--field-length-distribution {:?}: needs fields (YCSB's fieldcount and \
                 fieldlength, or --field-length)",
                a.field_length_distribution
            ))
        }
    };
    let fields = layout.fields() > 1;
    if !fields && (a.read_all_fields == Some(false) || a.write_all_fields == Some(false)) {
        eprintln!(
            "note: a value of this run is one field ({} bytes; fields need fieldcount > 1 and a \
             fieldlength of at least {} bytes): reads and writes take all of it",
            a.value_size,
            value::MIN_VALUE
        );
    }
    Ok(Plan {
        phase: a.phase,
        mix,
        dist,
        first,
        count,
        adding: false,
        names,
        layout,
        read_one: fields && a.read_all_fields == Some(false),
        write_one: fields && a.write_all_fields != Some(true),
        caches,
        workers,
        label,
        seed: a.seed.unwrap_or_else(crate::report::fresh_seed),
        started: std::time::SystemTime::now(),
    })
}
