//! Pieces every `shoal` driver shares: the run's data directory, the load progress bar, and
//! running a cluster of local node processes over tcp.

use serde_json::Value;
use shoal_engine::{ClusterFile, Engine};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Mem,
    Tcp,
}

/// Where a driver's nodes run: the flags `shoal ycsb` and `shoal tpcc` share.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 1)]
    pub nodes: usize,
    /// Transport between nodes: mem (nodes are thread groups in this process) or tcp (one
    /// local process per node, over loopback).
    #[arg(long, value_enum, default_value = "mem")]
    pub transport: Transport,
    /// Run as one node of the cluster in this TOML file (multi-host runs: start every node
    /// with the same flags and its own --id; node 0 creates shared structures).
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// This node's id in --cluster.
    #[arg(long, requires = "cluster")]
    pub id: Option<u8>,
    /// With --transport tcp: seal every frame between the nodes (AES-256-GCM, keys
    /// from the run's secret and each handshake; docs/cluster.md, Security). With --cluster,
    /// set `encrypt = true` in the file instead.
    #[arg(long)]
    pub encrypt: bool,
    /// Plain per-node caches instead of one pool (mem clusters; with a cluster file, set
    /// `one_pool = false` there): no shared read is served by a sharer in place of the home's
    /// NVMe, and the provider does not evict other nodes' pages first. For comparisons.
    #[arg(long)]
    pub no_one_pool: bool,
}

impl ClusterArgs {
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.nodes == 0 || self.nodes > shoal_engine::MAX_NODES {
            return Err(anyhow::anyhow!(
                "--nodes {}: a cluster has 1 to {} nodes",
                self.nodes,
                shoal_engine::MAX_NODES
            ));
        }
        if self.encrypt && (self.transport != Transport::Tcp || self.cluster.is_some()) {
            return Err(anyhow::anyhow!(
                "--encrypt goes with --transport tcp (with --cluster, set `encrypt = true` in \
                 the cluster file)"
            ));
        }
        if self.no_one_pool && (self.transport != Transport::Mem || self.cluster.is_some()) {
            return Err(anyhow::anyhow!(
                "--no-one-pool is for mem clusters (with a cluster file, set `one_pool = false` \
                 in it)"
            ));
        }
        if self.cluster.is_some() && self.id.is_none() {
            return Err(anyhow::anyhow!(
                "--cluster needs --id (this node's id in the file)"
            ));
        }
        Ok(())
    }
}

/// How long the other node processes may keep running after one failed.
const GRACE: Duration = Duration::from_secs(60);

/// Start `nodes` copies of this binary as one cluster over loopback tcp: writes
/// `<dir>/cluster.toml` (free ports, `cache` per node, data in `<dir>/node<i>`), starts node `i`
/// with `args(i, cluster file, its JSON path)`, shows node 0's output (unless `quiet`), keeps
/// every node's output in `<dir>/node<i>.log`, and waits. Once a node fails the others get
/// [`GRACE`] to notice, then are killed. Returns every node's JSON report and whether all
/// exited with status 0; a node that wrote no report is an error (with its log's tail).
pub fn run_processes(
    nodes: usize,
    dir: &Path,
    cache: &str,
    quiet: bool,
    encrypt: bool,
    args: impl Fn(usize, &Path, &Path) -> Vec<String>,
) -> anyhow::Result<(Vec<Value>, bool)> {
    // free loopback ports outside the ephemeral range (no outgoing connection can take one
    // before its node binds it)
    let addrs = shoal_messaging::free_loopback_addrs(nodes)
        .map_err(|e| anyhow::anyhow!("cannot find free loopback ports: {e}"))?;
    let file = dir.join("cluster.toml");
    // a fresh secret per run: other local processes cannot join these nodes
    let secret = shoal_engine::new_secret_hex()
        .map_err(|e| anyhow::anyhow!("cannot make a cluster secret: {e}"))?;
    std::fs::write(
        &file,
        ClusterFile::local_text(&addrs, dir, cache, Some(&secret), encrypt),
    )
    .map_err(|e| anyhow::anyhow!("writing {}: {e}", file.display()))?;
    let exe = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("cannot find the shoal binary: {e}"))?;
    let mut kids: Vec<(Child, PathBuf, PathBuf)> = Vec::new();
    for i in 0..nodes {
        let json = dir.join(format!("node{i}.json"));
        let log = dir.join(format!("node{i}.log"));
        let out =
            std::fs::File::create(&log).map_err(|e| anyhow::anyhow!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(anyhow::Error::from)?;
        let mut c = Command::new(&exe);
        c.args(args(i, &file, &json)).stderr(Stdio::from(err));
        if i == 0 && !quiet {
            c.stdout(Stdio::inherit());
        } else {
            c.stdout(Stdio::from(out));
        }
        c.process_group(0);
        let child = c
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting node {i} ({}): {e}", exe.display()))?;
        crate::stop::remember_child(child.id());
        kids.push((child, json, log));
    }
    let mut codes: Vec<Option<i32>> = vec![None; kids.len()];
    let mut failed_at: Option<Instant> = None;
    let mut forwarded = false;
    while codes.iter().any(|c| c.is_none()) {
        for (i, (k, _, _)) in kids.iter_mut().enumerate() {
            if codes[i].is_none() {
                if let Some(st) = k.try_wait().map_err(anyhow::Error::from)? {
                    crate::stop::forget_child(k.id());
                    let code = exit_code(st);
                    codes[i] = Some(code);
                    if code != 0 && code != STOPPED_EXIT && failed_at.is_none() {
                        failed_at = Some(Instant::now());
                    }
                }
            }
        }
        if failed_at.is_some_and(|t| t.elapsed() > GRACE) {
            for (i, (k, _, _)) in kids.iter_mut().enumerate() {
                if codes[i].is_none() {
                    let _ = k.kill();
                    let _ = k.wait();
                    crate::stop::forget_child(k.id());
                    codes[i] = Some(128 + libc::SIGKILL);
                }
            }
        }
        if crate::stop::requested() && !forwarded {
            // the nodes run in their own process group (a terminal's Ctrl-C reaches only this
            // process): pass the stop on once, each node stops cleanly
            forwarded = true;
            for (i, (k, _, _)) in kids.iter().enumerate() {
                if codes[i].is_none() {
                    // SAFETY: kill(2) with a pid of a child not yet reaped (so not reused).
                    unsafe { libc::kill(k.id() as libc::pid_t, libc::SIGTERM) };
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut docs = Vec::new();
    let mut broken = Vec::new();
    for (i, (_, json, log)) in kids.iter().enumerate() {
        let doc = std::fs::read_to_string(json)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok());
        match doc {
            Some(d) if matches!(codes[i], Some(0 | 1 | STOPPED_EXIT)) => docs.push(d),
            // stopped by a signal before it had results (during the load): nothing to merge
            None if codes[i] == Some(STOPPED_EXIT) => {}
            _ => {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                eprintln!(
                    "node {i} failed ({}); last lines of {}:",
                    codes[i].map_or("no exit status".into(), exit_text),
                    log.display()
                );
                for l in tail.iter().rev() {
                    eprintln!("  {l}");
                }
                broken.push(i);
            }
        }
    }
    if !broken.is_empty() {
        return Err(anyhow::anyhow!(
            "nodes {broken:?} of the tcp cluster failed"
        ));
    }
    if docs.len() < nodes {
        return Err(anyhow::anyhow!(
            "{}: the nodes stopped before their run had results; each closed its store clean",
            crate::stop::STOPPED
        ));
    }
    let ok = codes.iter().all(|c| matches!(c, Some(0 | STOPPED_EXIT)));
    Ok((docs, ok))
}

const STOPPED_EXIT: i32 = crate::stop::STOPPED_EXIT as i32;

/// A child's exit status as a number: its code, or 128 + the signal that ended it (as a shell
/// reports it).
fn exit_code(st: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

/// Words for [`exit_code`]'s number.
fn exit_text(code: i32) -> String {
    match code {
        STOPPED_EXIT => "stopped by a signal, store closed".into(),
        crate::stop::ABORTED_EXIT => "exited at once on a second signal, store not closed".into(),
        c if c > 128 => {
            let sig = c - 128;
            let name = match sig {
                libc::SIGKILL => " (SIGKILL)",
                libc::SIGSEGV => " (SIGSEGV)",
                libc::SIGABRT => " (SIGABRT)",
                libc::SIGTERM => " (SIGTERM)",
                libc::SIGINT => " (SIGINT)",
                _ => "",
            };
            format!("killed by signal {sig}{name}")
        }
        c => format!("exit status {c}"),
    }
}

/// `--duration` and `--warmup` in seconds: a positive duration, a non-negative warm-up, both
/// at most 1e7 (also rules out NaN and infinities, on which `Duration::from_secs_f64` panics).
pub fn check_run_secs(duration: f64, warmup: f64) -> anyhow::Result<()> {
    let secs_ok = |s: f64| s.is_finite() && (0.0..=1e7).contains(&s);
    if !secs_ok(duration) || duration == 0.0 || !secs_ok(warmup) {
        return Err(anyhow::anyhow!(
            "--duration must be > 0 and --warmup >= 0 (seconds, at most 1e7)"
        ));
    }
    Ok(())
}

/// The run's data directory: `dir` (created if missing; it must be empty: the drivers load a
/// new data set, and a load is not resumable), or a temporary directory named `shoal-<what>-…`
/// that is removed when the returned guard drops.
pub fn data_dir(
    dir: Option<&Path>,
    what: &str,
) -> anyhow::Result<(PathBuf, Option<tempfile::TempDir>)> {
    match dir {
        Some(d) => {
            // only the directory itself is made: a parent that does not exist is more likely a
            // mistyped mount point than a wish to create directories up to the root
            if let Some(parent) = d.parent().filter(|p| !p.as_os_str().is_empty()) {
                if !parent.is_dir() {
                    return Err(Usage(format!(
                        "--data-dir {}: its parent directory {} does not exist (create it first; \
                         only the data directory itself is created)",
                        d.display(),
                        parent.display()
                    ))
                    .into());
                }
            }
            match std::fs::create_dir(d) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && d.is_dir() => {}
                Err(e) => return Err(anyhow::anyhow!("--data-dir {}: {e}", d.display())),
            }
            let entries = std::fs::read_dir(d)
                .map_err(|e| anyhow::anyhow!("--data-dir {}: {e}", d.display()))?;
            // what a crash can leave of a creation that never finished is not a data set: the
            // engine replaces it (a store is created whole or not at all)
            let mut kept = entries
                .filter_map(Result::ok)
                .filter(|e| !leftover(&e.file_name().to_string_lossy()));
            if kept.next().is_some() {
                if let Some(lock) = held_lock(d) {
                    return Err(anyhow::anyhow!(
                        "--data-dir {}: in use by another running process (it holds {}); stop \
                         it or use another directory",
                        d.display(),
                        lock.display()
                    ));
                }
                return Err(anyhow::anyhow!(
                    "--data-dir {}: not empty; shoal {what} loads a new data set into an empty directory \
                     (a load is not resumable): use a new or empty one (`shoal inspect {}` checks \
                     what this one holds)",
                    d.display(),
                    d.display()
                ));
            }
            remove_creation_leftovers(d)?;
            Ok((d.to_path_buf(), None))
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix(&format!("shoal-{what}-"))
                .tempdir()
                .map_err(|e| anyhow::anyhow!("cannot create a temporary data directory: {e}"))?;
            Ok((t.path().to_path_buf(), Some(t)))
        }
    }
}

/// Delete what a crash left of a store creation in `dir`, which holds nothing else (checked
/// by the caller): that creation never reached its commit point (device 0 renamed into
/// place), so none of it is data, and a load without a log would otherwise leave an old
/// log's temporary files beside the new store.
fn remove_creation_leftovers(dir: &Path) -> anyhow::Result<()> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| anyhow::anyhow!("--data-dir {}: {e}", dir.display()))?;
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name();
        if shoal_storage::creation_leftover(&name.to_string_lossy()) {
            let p = e.path();
            log::info!(
                "{}: removing what an unfinished store creation left",
                p.display()
            );
            std::fs::remove_file(&p)
                .map_err(|err| anyhow::anyhow!("--data-dir: removing {}: {err}", p.display()))?;
        }
    }
    Ok(())
}

/// A file that holds no data: a lock file, or what a crash left of a file being created.
fn leftover(name: &str) -> bool {
    let lock = name
        .strip_prefix("node")
        .and_then(|n| n.strip_suffix(".lock"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    lock || shoal_storage::creation_leftover(name) || name.ends_with(".json.new")
}

/// A run that started and then failed (a device filled up, a node died, a check failed): exit
/// status 1. Any other error (a bad flag or file, a data directory that cannot be used, a
/// store that does not open) means the command could not start as asked: exit status 2.
#[derive(Debug)]
pub struct RunFailed(anyhow::Error);

impl std::fmt::Display for RunFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for RunFailed {}

/// An error found inside a run that still means "could not start as asked" (exit status 2),
/// such as a data directory that already holds a table.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// Classify an error of a driver's run: [`RunFailed`] unless it is a [`Usage`] error.
pub fn during_run(e: anyhow::Error) -> anyhow::Error {
    if e.is::<Usage>() || e.is::<RunFailed>() {
        e
    } else {
        anyhow::Error::new(RunFailed(e))
    }
}

/// The exit status for an error a command returned (see [`RunFailed`]).
pub fn exit_status(e: &anyhow::Error) -> u8 {
    if e.is::<RunFailed>() {
        1
    } else {
        2
    }
}

/// The run's result after its store was closed: the run's own error comes first (a close
/// that fails after a failed run is usually its consequence: it is named after it).
pub fn first_error<T>(run: anyhow::Result<T>, closed: anyhow::Result<()>) -> anyhow::Result<T> {
    match (run, closed) {
        (Err(e), Err(c)) => {
            let failed = e.is::<RunFailed>();
            let both = anyhow::anyhow!("{e}\n(closing the store afterwards failed too: {c})");
            Err(if failed { during_run(both) } else { both })
        }
        (Ok(_), Err(c)) => Err(c),
        (r, Ok(())) => r,
    }
}

/// A store lock file (`node<i>.lock`, in `dir` or one level down) that a running engine holds.
fn held_lock(dir: &Path) -> Option<PathBuf> {
    use std::os::fd::AsRawFd;
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            files.extend(
                std::fs::read_dir(&p)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path()),
            );
        } else {
            files.push(p);
        }
    }
    files.into_iter().find(|p| {
        let lock = p.extension().is_some_and(|x| x == "lock");
        // a shared lock we cannot take: an engine holds it (ours, if taken, goes with `f`)
        lock && std::fs::File::open(p).is_ok_and(|f| {
            // SAFETY: flock on a file descriptor we own; no memory is involved.
            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) != 0 }
        })
    })
}

/// Check before a long run that an output file (`--json`) can be written, so that the results
/// are not lost at the end; a file that did not exist is not left behind.
pub fn check_output(flag: &str, path: &Path) -> anyhow::Result<()> {
    if path == Path::new("-") {
        return Ok(()); // standard output
    }
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| anyhow::anyhow!("{flag} {}: cannot write there: {e}", path.display()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// A loading progress bar over `len` `unit`s (hidden with `quiet`).
pub fn progress(len: u64, unit: &str, quiet: bool) -> indicatif::ProgressBar {
    progress_bar(len, "load", unit, quiet)
}

/// A progress bar labelled `what` over `len` `unit`s (hidden with `quiet`).
pub fn progress_bar(len: u64, what: &str, unit: &str, quiet: bool) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let b = indicatif::ProgressBar::new(len);
    // (narrow enough for 80 columns with 10-digit counts; the rate in whole units)
    b.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{what} {{bar:25}} {{pos}}/{{len}} {unit} ({{rate}}, eta {{eta}})"
        ))
        .expect("template")
        .with_key(
            "rate",
            |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&rate_text(s.per_sec()));
            },
        ),
    );
    b
}

/// A rate for a progress line: `950/s`, `12.3K/s`, `1.23M/s`.
pub fn rate_text(per_sec: f64) -> String {
    match per_sec {
        r if !r.is_finite() || r < 0.0 => "-/s".to_string(),
        r if r < 1e3 => format!("{r:.0}/s"),
        r if r < 1e6 => format!("{:.1}K/s", r / 1e3),
        r => format!("{:.2}M/s", r / 1e6),
    }
}

/// Wait for loader threads, moving `bar` to `done` (at most `total`) every 100 ms, then join
/// them in order: the first thread that panicked or failed ends it (`describe` words the
/// failure).
pub fn join_loaders<E>(
    hs: Vec<std::thread::ScopedJoinHandle<'_, Result<(), E>>>,
    bar: &indicatif::ProgressBar,
    done: &std::sync::atomic::AtomicU64,
    total: u64,
    describe: impl Fn(E) -> anyhow::Error,
) -> anyhow::Result<()> {
    while !hs.iter().all(|h| h.is_finished()) {
        bar.set_position(done.load(std::sync::atomic::Ordering::Relaxed).min(total));
        std::thread::sleep(Duration::from_millis(100));
    }
    for h in hs {
        h.join()
            .map_err(|_| anyhow::anyhow!("a loader thread panicked"))?
            .map_err(&describe)?;
    }
    Ok(())
}

/// The nodes this process drives and where they sit in the cluster.
pub struct Nodes<'e> {
    pub engines: Vec<&'e Engine>,
    /// Nodes in the whole cluster (more than `engines` when this process is one tcp member).
    pub cluster: usize,
    /// This process is one member of a multi-process cluster (barriers between phases).
    pub member: bool,
}

/// Run `drive` as node `id` of the cluster in `file` (`--cluster FILE --id N`): join, drive,
/// then leave the cluster in order (or, after a failure, just close this node).
pub fn run_as_member<T>(
    file: &ClusterFile,
    id: u8,
    durability: shoal_engine::Durability,
    wal_bytes: u64,
    drive: impl FnOnce(&Nodes) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    // the cluster file sets each node's cache and data directory; the run's durability is the
    // command line's, which must agree with the file's if it names one
    let mut cfg = file.engine_config(id).map_err(anyhow::Error::from)?;
    if let Some(d) = file.durability.filter(|&d| d != durability) {
        return Err(anyhow::anyhow!(
            "the cluster file says durability = \"{d}\", the command line --durability {durability}: give the same on both (the drivers' default is none)"
        ));
    }
    cfg.durability = durability;
    cfg.wal_bytes = wal_bytes;
    let engine = shoal_engine::join(file, id, cfg).map_err(anyhow::Error::from)?;
    let nodes = Nodes {
        engines: vec![&engine],
        cluster: file.nodes.len(),
        member: true,
    };
    let r = drive(&nodes).map_err(during_run);
    if r.is_ok() {
        engine
            .leave(BARRIER_LIMIT)
            .map_err(|e| during_run(anyhow::anyhow!("leaving the cluster: {e}")))?;
    } else if let Err(e) = engine.close() {
        eprintln!("closing node {id}: {e}");
    }
    r
}

/// How long a member waits for the others between phases (loading may take minutes).
pub const BARRIER_LIMIT: Duration = Duration::from_secs(3600);

impl Nodes<'_> {
    /// In a multi-process cluster, wait until every node got here (`what` names the phase).
    pub fn barrier(&self, what: &str) -> anyhow::Result<()> {
        if !self.member {
            return Ok(());
        }
        self.engines[0]
            .barrier(BARRIER_LIMIT)
            .map_err(|e| anyhow::anyhow!("waiting for the other nodes ({what}): {e}"))
    }
    /// This process holds node 0 (which creates shared structures and checks).
    pub fn leads(&self) -> bool {
        self.engines[0].node_id() == 0
    }
}

/// Run `drive` on the nodes of a cluster of this process, then close the cluster in order
/// (pages home, stores marked clean) even if `drive` panicked, for example on printing to a
/// closed pipe: a cluster dropped without `close` leaves its stores unclean. The panic resumes
/// after the close; an error of `drive` is returned after it.
pub fn drive_cluster<T>(
    cluster: shoal_engine::Cluster,
    drive: impl FnOnce(&Nodes) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let engines: Vec<&Engine> = cluster.nodes().iter().collect();
        drive(&Nodes {
            cluster: engines.len(),
            engines,
            member: false,
        })
        .map_err(during_run)
    }));
    let closed = cluster
        .close()
        .map_err(|e| during_run(anyhow::Error::from(e)));
    match r {
        Ok(r) => first_error(r, closed),
        Err(panic) => {
            if let Err(e) = closed {
                eprintln!("closing the cluster after a panic: {e}");
            }
            std::panic::resume_unwind(panic)
        }
    }
}

/// Open the existing store of `node` in `dir` as recovery does (`shoal recover`, `shoal tpcc
/// --check-existing`): with its log if it has one (kept at its size; without it the open
/// would delete the log), without one if it has none (a store that never had a log gets
/// none).
pub fn recovering_config(dir: &Path, node: u8, cache: usize) -> shoal_engine::EngineConfig {
    let mut c = shoal_engine::EngineConfig::new(dir, cache);
    c.node_id = node;
    c.mode = shoal_engine::OpenMode::Open;
    c.durability = shoal_engine::Durability::None;
    if let Some(m) = c.log_path().and_then(|log| std::fs::metadata(log).ok()) {
        c.durability = shoal_engine::Durability::Commit;
        // an existing log keeps its size; a valid size here lets the store itself judge a log
        // that was cut short (and say so) instead of the configuration refusing its length
        c.wal_bytes = (m.len() / 4096 * 4096).max(1 << 20);
    }
    c
}

/// The write-ahead log's figures over a measured interval, as JSON (`null` without a log).
pub fn log_json(d: &shoal_engine::LogCounters, secs: f64, logged: bool) -> serde_json::Value {
    if !logged {
        return serde_json::Value::Null;
    }
    let flushes = d.flushes.max(1) as f64;
    serde_json::json!({
        "bytes_written": d.bytes_written,
        "mb_per_s": d.bytes_written as f64 / 1e6 / secs,
        "flushes": d.flushes,
        "commits": d.commits,
        "commits_per_flush": d.commits as f64 / flushes,
        "fdatasync_mean_us": d.sync_nanos as f64 / flushes / 1e3,
        "fdatasync_max_us": d.sync_max_nanos as f64 / 1e3,
        "chunks": d.chunks,
        "whole_images": d.images,
        "checkpoints": d.checkpoints,
        "waits_for_space": d.full_waits,
    })
}

/// `--cache`: one size for every node, or one per node separated by commas.
pub fn parse_caches(s: &str, nodes: usize) -> anyhow::Result<Vec<usize>> {
    let sizes = s
        .split(',')
        .map(|p| shoal_engine::parse_bytes(p.trim()).map(|b| b as usize))
        .collect::<Result<Vec<usize>, String>>()
        .map_err(|e| anyhow::anyhow!("--cache {s}: {e}"))?;
    match sizes.len() {
        1 => Ok(vec![sizes[0]; nodes]),
        n if n == nodes => Ok(sizes),
        n => Err(anyhow::anyhow!(
            "--cache {s}: {n} sizes for {nodes} nodes (give one for all, or one per node)"
        )),
    }
}

/// `--wal-size`: a size of at least 1 MiB, a multiple of 4 KiB.
pub fn parse_wal_size(s: &str) -> Result<u64, String> {
    let b = shoal_engine::parse_bytes(s)?;
    if b < (1 << 20) || !b.is_multiple_of(4096) {
        return Err(format!(
            "the log must be at least 1 MiB and a multiple of 4 KiB, got {s}"
        ));
    }
    Ok(b)
}

/// Read the description `file` a load left in `dir` (a kept data set: `what` names it in
/// errors, which are usage errors: load one first).
pub fn read_description<T: serde::de::DeserializeOwned>(
    dir: &Path,
    file: &str,
    what: &str,
) -> anyhow::Result<T> {
    let p = dir.join(file);
    let text = std::fs::read_to_string(&p).map_err(|e| {
        Usage(format!(
            "--data-dir {}: no {what} ({}: {e}); load one first",
            dir.display(),
            p.display()
        ))
    })?;
    serde_json::from_str(&text).map_err(|e| {
        Usage(format!(
            "{}: not a description of a {what}: {e}",
            p.display()
        ))
        .into()
    })
}

/// Write a kept data set's description `file` beside its stores in `dir`, atomically and
/// durably (a new file, synced, renamed over the old one, the directory synced): a crash
/// leaves the old description or the new one.
pub fn write_description<T: serde::Serialize>(
    dir: &Path,
    file: &str,
    description: &T,
) -> anyhow::Result<()> {
    let p = dir.join(file);
    let text = serde_json::to_string_pretty(description).expect("serialises") + "\n";
    shoal_storage::write_atomic(&p, text.as_bytes())
        .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
}

#[cfg(test)]
mod tests {
    /// Issue 47: a progress line's rate is short ("1,232,196.9393/s" wrapped lines at 80
    /// columns).
    #[test]
    fn a_rate_is_printed_in_a_few_digits() {
        assert_eq!(super::rate_text(1_232_196.939_3), "1.23M/s");
        assert_eq!(super::rate_text(45_678.9), "45.7K/s");
        assert_eq!(super::rate_text(950.4), "950/s");
        assert_eq!(super::rate_text(f64::NAN), "-/s");
    }

    /// A data directory that holds only what a killed store creation left takes a new load,
    /// and that load starts from a directory without those files (a load without a log left
    /// an old log's temporary files beside the new store). The lock file stays.
    #[test]
    fn a_new_load_removes_what_an_unfinished_creation_left() {
        let t = tempfile::tempdir().unwrap();
        let left = [
            "node0-0.dat.creating",
            "node0-0.wal.creating",
            "node0-0.wal.creating.alloc0",
            "node0-0.wal.creating.alloc1",
        ];
        for f in left.iter().chain(&["node0.lock"]) {
            std::fs::write(t.path().join(f), b"x").unwrap();
        }
        let (d, temp) = super::data_dir(Some(t.path()), "ycsb").unwrap();
        assert!(temp.is_none());
        let mut names: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, vec!["node0.lock".to_string()]);
        // a directory with anything else in it is refused and keeps everything
        std::fs::write(t.path().join("node0-0.wal.creating"), b"x").unwrap();
        std::fs::write(t.path().join("node0-0.dat"), b"x").unwrap();
        let e = super::data_dir(Some(t.path()), "ycsb").unwrap_err();
        assert!(e.to_string().contains("not empty"), "{e}");
        assert!(t.path().join("node0-0.wal.creating").exists());
    }
}
