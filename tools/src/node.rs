//! `shoal node --config cluster.toml --id N`: run node N of a multi-process cluster and check
//! that the cluster keeps every update.
//!
//! Every node of the file is started with the same flags. Each node owns `--pages` counter
//! pages (homed on it, found by every node through the catalog entry `check/N`), plus a tally
//! page holding how many increments the node ever made. Workers increment random counters of
//! every node's pages under exclusive guards, so pages move between all nodes, and with a
//! small cache they are evicted to their homes all the time. At the end (and at start-up, after
//! a restart) every node checks that the sum of all counters equals the sum of all tallies:
//! any lost or doubled update shows. `--increments 0` only joins, checks and leaves.
//!
//! If a node dies, the others report errors for the pages they cannot reach, keep incrementing
//! the pages that do not depend on it, and exit with status 1 at the end instead of hanging.
//! Started again with the same command line (over tcp), it rejoins the running cluster unless
//! a page was lost with it (docs/cluster.md, "Rejoin"): its start says `rejoined the running
//! cluster` (the sums it reads then are no snapshot: only the end is judged), it meets the
//! others at the end of their run, and every node that met the others there leaves in order,
//! also one that saw errors on the way (its exit status is still 1).
//!
//! With a write-ahead log (`durability` in the cluster file), each increment also counts in
//! the node's tally, both pages changed under one log group (all of it or nothing after a
//! crash), and is committed before the next: the sums match after any crash, and a restart
//! of the whole cluster gives back every committed increment (docs/durability.md, "Clusters").

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use shoal_engine::{join, ClusterFile, Engine, EngineError, OpResult, Pid, Worker};
use shoal_storage::StoreError;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Counters per page (u64 each, from byte 64).
const COUNTERS: usize = 64;
/// Tally page layout: magic, pages, total increments, then the counter pages' pids.
const MAGIC: u64 = 0x5348_4f41_4c43_484b; // "SHOALCHK"
const PIDS_AT: usize = 24;
/// Most counter pages per node (their pids fill the tally page).
pub const MAX_PAGES: usize = 400;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The cluster file (TOML: ids, addresses, data directories; see docs/cluster.md).
    #[arg(long)]
    pub config: PathBuf,
    /// This node's id in the cluster file.
    #[arg(long)]
    pub id: u8,
    /// Worker threads on this node.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Increments this node makes (spread over its workers); 0: check and leave.
    #[arg(long, default_value_t = 100_000)]
    pub increments: u64,
    /// Counter pages homed on each node (set on the first run).
    #[arg(long, default_value_t = 128)]
    pub pages: usize,
    /// Seconds to wait for the other nodes at each barrier.
    #[arg(long, default_value_t = 120.0)]
    pub barrier_timeout: f64,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No per-second lines.
    #[arg(long)]
    pub quiet: bool,
    /// Open this node's store even if it was not shut down cleanly (after a crash) and the
    /// cluster runs without a log (`durability = "none"`, the default): the crashed run's
    /// increments are lost (those of pages written back before the crash may remain); the
    /// check then accepts the loss found at the start and requires every increment of this
    /// run to land. With a log a crashed store is recovered and the flag is not needed.
    #[arg(long)]
    pub allow_unclean: bool,
    /// Print this node's committed increments every 100 ms (`node N: committed C`), for
    /// crash tests (with a log: every increment is committed before the next).
    #[arg(long)]
    pub commit_lines: bool,
    /// Report every counter page's sum at the start (`start.page_sums`) and this node's
    /// committed increments of each page (`increments_by_page`) in the JSON, keyed by the
    /// page's number: a lost or doubled update then names its page.
    #[arg(long)]
    pub per_page: bool,
}

/// One node's counter pages and tally page.
struct Owned {
    tally: Pid,
    pages: Vec<Pid>,
}

fn read_u64(w: &Worker, pid: Pid, at: usize) -> Result<u64, EngineError> {
    w.run(|w| -> OpResult<u64> {
        let g = w.optimistic(pid)?;
        let v = g.page().u64(at);
        g.validate()?;
        Ok(v)
    })
}

/// Find (or on the first run create) node `me`'s pages.
fn own_pages(w: &Worker, me: u8, pages: usize) -> anyhow::Result<Owned> {
    let name = format!("check/{me}");
    let e = |e: EngineError| anyhow::anyhow!("setting up node {me}'s counter pages: {e}");
    if let Some(tally) = w.catalog_lookup(&name).map_err(e)? {
        return load_owned(w, me, tally);
    }
    let mut pids = Vec::with_capacity(pages);
    for _ in 0..pages {
        pids.push(w.allocate_on(me).map_err(e)?.pid());
    }
    let tally = {
        let mut g = w.allocate_on(me).map_err(e)?;
        let mut p = g.page_mut();
        p.set_u64(0, MAGIC);
        p.set_u64(8, pages as u64);
        p.set_u64(16, 0);
        for (i, pid) in pids.iter().enumerate() {
            p.set_u64(PIDS_AT + 8 * i, pid.raw());
        }
        g.pid()
    };
    w.catalog_insert(&name, tally).map_err(e)?;
    Ok(Owned { tally, pages: pids })
}

fn load_owned(w: &Worker, node: u8, tally: Pid) -> anyhow::Result<Owned> {
    let e = |e: EngineError| anyhow::anyhow!("reading node {node}'s tally page {tally}: {e}");
    let g = w.run(|w| w.shared(tally)).map_err(e)?;
    let p = g.page();
    let n = p.u64(8) as usize;
    if p.u64(0) != MAGIC || n == 0 || n > MAX_PAGES {
        return Err(anyhow::anyhow!(
            "node {node}'s tally page {tally} is not a check tally (magic {:#x}, {n} pages)",
            p.u64(0)
        ));
    }
    let pages = (0..n).map(|i| Pid(p.u64(PIDS_AT + 8 * i))).collect();
    Ok(Owned { tally, pages })
}

/// Sum of the counters of every counter page in the cluster, by page number.
fn page_sums(w: &Worker, all: &[Owned]) -> Result<BTreeMap<u64, u64>, EngineError> {
    let mut sums = BTreeMap::new();
    for &p in all.iter().flat_map(|o| o.pages.iter()) {
        sums.insert(p.0, page_sum(w, p)?);
    }
    Ok(sums)
}

fn page_sum(w: &Worker, p: Pid) -> Result<u64, EngineError> {
    w.run(|w| -> OpResult<u64> {
        let g = w.optimistic(p)?;
        let s = (0..COUNTERS).map(|k| g.page().u64(64 + 8 * k)).sum();
        g.validate()?;
        Ok(s)
    })
}

/// Sum of every counter and of every tally in the cluster.
fn sums(w: &Worker, all: &[Owned]) -> Result<(u64, u64), EngineError> {
    let (mut counters, mut tallies) = (0u64, 0u64);
    for o in all {
        tallies += read_u64(w, o.tally, 16)?;
        for &p in &o.pages {
            counters += page_sum(w, p)?;
        }
    }
    Ok((counters, tallies))
}

#[derive(Default)]
struct Errors {
    count: u64,
    by_home: BTreeMap<u8, u64>,
    by_kind: BTreeMap<&'static str, u64>,
    first: Option<String>,
    first_at: Option<Instant>,
    ok_after_first: u64,
}

fn error_kind(e: &EngineError) -> &'static str {
    match e {
        EngineError::PeerDead { .. } => "home_unreachable",
        EngineError::HolderDead { .. } => "holder_unreachable",
        EngineError::RemoteTimeout { .. } | EngineError::LeaseLapsed { .. } => "timeout",
        EngineError::Store(s) => match **s {
            StoreError::LogFull { .. } | StoreError::CheckpointFailed { .. } => "log_full",
            _ => "other",
        },
        _ => "other",
    }
}

/// Run `shoal node`.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if a.workers == 0 || a.workers > 1024 {
        return Err(anyhow::anyhow!("--workers {}: use 1 to 1024", a.workers));
    }
    if a.pages == 0 || a.pages > MAX_PAGES {
        return Err(anyhow::anyhow!("--pages {}: use 1 to {MAX_PAGES}", a.pages));
    }
    if !(a.barrier_timeout.is_finite() && a.barrier_timeout > 0.0 && a.barrier_timeout < 1e6) {
        return Err(anyhow::anyhow!(
            "--barrier-timeout must be a positive number of seconds"
        ));
    }
    let limit = Duration::from_secs_f64(a.barrier_timeout);
    if let Some(p) = &a.json {
        crate::cli::check_output("--json", p)?;
    }
    let file = ClusterFile::load(&a.config).map_err(anyhow::Error::from)?;
    let logged = file.durability.is_some_and(|d| d.logged());
    let mut cfg = file.engine_config(a.id).map_err(anyhow::Error::from)?;
    cfg.allow_unclean = a.allow_unclean;
    let n = file.nodes.len();
    say!(
        "node {}: joining a cluster of {n} nodes (listening on {}, data in {})",
        a.id,
        file.nodes[a.id as usize].address,
        cfg.data_dir.display()
    );
    let t_join = Instant::now();
    let engine = join(&file, a.id, cfg).map_err(anyhow::Error::from)?;
    say!(
        "node {}: connected in {:.2} s",
        a.id,
        t_join.elapsed().as_secs_f64()
    );
    let r = check(&engine, &a, n, limit, logged);
    let (report, ok, together) = match r {
        Ok(x) => x,
        Err(e) => {
            abandon(&engine);
            return Err(e);
        }
    };
    if let Some(path) = &a.json {
        std::fs::write(
            path,
            serde_json::to_string_pretty(&report).expect("json") + "\n",
        )
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    if !together {
        abandon(&engine);
        return Ok(ExitCode::from(1));
    }
    // every node met the others at the end of the run and read the sums: they all leave in
    // order, also those that saw errors on the way (a node that was away for a while)
    engine
        .leave(limit)
        .map_err(|e| anyhow::anyhow!("leaving the cluster: {e}"))?;
    say!("node {}: left the cluster cleanly", a.id);
    Ok(if !ok {
        ExitCode::from(1)
    } else if crate::stop::requested() {
        ExitCode::from(crate::stop::STOPPED_EXIT)
    } else {
        ExitCode::SUCCESS
    })
}

/// Shut down after a failure: send what can go home (bounded), then close locally.
fn abandon(engine: &Engine) {
    if let Err(e) = engine.send_pages_home(Duration::from_secs(5)) {
        eprintln!("{e}");
    }
    if let Err(e) = engine.close() {
        eprintln!("closing node {}: {e}", engine.node_id());
    }
}

/// Run the check: its report, whether it passed, and whether this node met the others at
/// the end of the run and read the sums there (then every node leaves in order).
fn check(
    engine: &Engine,
    a: &Args,
    n: usize,
    limit: Duration,
    logged: bool,
) -> anyhow::Result<(serde_json::Value, bool, bool)> {
    let me = a.id;
    let barrier = |what: &str| {
        engine
            .barrier(limit)
            .map_err(|e| anyhow::anyhow!("node {me}: waiting for the cluster ({what}): {e}"))
    };
    let w = engine.worker();
    let mine = own_pages(&w, me, a.pages)?;
    barrier("set-up")?;
    let mut all = Vec::with_capacity(n);
    for j in 0..n as u8 {
        if j == me {
            all.push(Owned {
                tally: mine.tally,
                pages: mine.pages.clone(),
            });
            continue;
        }
        let tally = w
            .catalog_lookup(&format!("check/{j}"))
            .map_err(anyhow::Error::from)?
            .ok_or_else(|| anyhow::anyhow!("node {j} registered no counter pages"))?;
        all.push(load_owned(&w, j, tally)?);
    }
    let (c0, t0) = sums(&w, &all).map_err(|e| anyhow::anyhow!("reading the counters: {e}"))?;
    let tallies0 = all
        .iter()
        .map(|o| read_u64(&w, o.tally, 16))
        .collect::<Result<Vec<u64>, _>>()
        .map_err(|e| anyhow::anyhow!("reading the tallies: {e}"))?;
    let unclean = engine.store().opened_unclean();
    // restarted into a running cluster: the others increment while this node reads, so its
    // start is no snapshot, and only the end (all of them past the last barrier) is judged
    let rejoined = engine.rejoined();
    if rejoined {
        say!(
            "node {me}: start: rejoined the running cluster (counters sum {c0}, tallies sum {t0} \
             read while the others ran)"
        );
    } else {
        say!(
            "node {me}: start: counters sum {c0}, tallies sum {t0} ({}){}",
            if c0 == t0 { "consistent" } else { "MISMATCH" },
            match (c0 == t0, unclean) {
                (_, true) =>
                    ": this node's store was opened after a crash: increments not written \
                              back before it are lost, and the crashed run's tally was never written",
                (false, false) if a.allow_unclean => ": a store of the cluster lost updates in a crash",
                _ => "",
            }
        );
    }
    // read before the start barrier: once past it the others change them
    let page_sums0 = if a.per_page {
        Some(page_sums(&w, &all).map_err(|e| anyhow::anyhow!("reading the counters: {e}"))?)
    } else {
        None
    };
    barrier("start")?;

    let errors = Mutex::new(Errors::default());
    let done = AtomicU64::new(0);
    let pages: Vec<Pid> = all.iter().flat_map(|o| o.pages.iter().copied()).collect();
    let started = Instant::now();
    let by_page = std::thread::scope(|s| {
        let hs: Vec<_> = (0..a.workers)
            .map(|t| {
                let (errors, done, pages, tally) = (&errors, &done, &pages, mine.tally);
                let quota = a.increments / a.workers as u64
                    + u64::from((t as u64) < a.increments % a.workers as u64);
                s.spawn(move || {
                    let w = engine.worker();
                    let mut rng = SmallRng::seed_from_u64(((me as u64) << 32) | t as u64);
                    let mut made = 0;
                    let mut by_page = BTreeMap::<u64, u64>::new();
                    while made < quota && !crate::stop::requested() {
                        let p = pages[rng.random_range(0..pages.len())];
                        let at = 64 + 8 * rng.random_range(0..COUNTERS);
                        let r = w
                            .run(|w| -> OpResult<()> {
                                // both latched before either changes: an attempt that must
                                // start again has changed nothing
                                let mut g = w.exclusive(p)?;
                                // the tally counts it in the same log group
                                let t = if logged {
                                    Some(w.exclusive(tally)?)
                                } else {
                                    None
                                };
                                let v = g.page().u64(at);
                                g.page_mut().set_u64(at, v + 1);
                                if let Some(mut t) = t {
                                    let v = t.page().u64(16);
                                    t.page_mut().set_u64(16, v + 1);
                                }
                                Ok(())
                            })
                            .and_then(|()| w.commit());
                        match r {
                            Ok(()) => {
                                made += 1;
                                *by_page.entry(p.0).or_insert(0) += 1;
                                done.fetch_add(1, Ordering::Relaxed);
                                let mut e = errors.lock().expect("errors");
                                if e.first.is_some() {
                                    e.ok_after_first += 1;
                                }
                            }
                            Err(err) => {
                                let mut e = errors.lock().expect("errors");
                                e.count += 1;
                                *e.by_home.entry(p.node()).or_insert(0) += 1;
                                *e.by_kind.entry(error_kind(&err)).or_insert(0) += 1;
                                if e.first.is_none() {
                                    e.first = Some(err.to_string());
                                    e.first_at = Some(Instant::now());
                                }
                                if matches!(err, EngineError::Shutdown) {
                                    break;
                                }
                                // pages of a dead node fail at once: do not spin on them
                                drop(e);
                                std::thread::sleep(Duration::from_millis(1));
                                // an error still uses up one increment of the quota, so a
                                // run with an unreachable node ends
                                made += 1;
                            }
                        }
                    }
                    by_page
                })
            })
            .collect();
        let mut last = (Instant::now(), 0u64);
        let mut told = Instant::now();
        while !hs.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(50));
            if a.commit_lines && told.elapsed() >= Duration::from_millis(100) {
                say!("node {me}: committed {}", done.load(Ordering::Relaxed));
                told = Instant::now();
            }
            if !a.quiet && last.0.elapsed() >= Duration::from_secs(1) {
                let d = done.load(Ordering::Relaxed);
                let e = errors.lock().expect("errors");
                say!(
                    "node {me}: {:>9.0} increments/s  done {d}/{}  errors {} {:?}",
                    (d - last.1) as f64 / last.0.elapsed().as_secs_f64(),
                    a.increments,
                    e.count,
                    e.by_kind
                );
                drop(e);
                last = (Instant::now(), d);
            }
        }
        let mut by_page = BTreeMap::<u64, u64>::new();
        for h in hs {
            // a worker that panicked has already printed why; its pages count as unknown
            for (p, k) in h.join().unwrap_or_default() {
                *by_page.entry(p).or_insert(0) += k;
            }
        }
        by_page
    });
    let secs = started.elapsed().as_secs_f64();
    let made = done.load(Ordering::Relaxed);
    let errors = errors.into_inner().expect("errors");
    // record this node's increments in its tally (one more exclusive write, at its home;
    // with a log each increment counted there already)
    let tally = w
        .run(|w| -> OpResult<u64> {
            let mut g = w.exclusive(mine.tally)?;
            let v = g.page().u64(16) + if logged { 0 } else { made };
            g.page_mut().set_u64(16, v);
            Ok(v)
        })
        .and_then(|v| w.commit().map(|()| v))
        .map_err(|e| anyhow::anyhow!("writing the tally: {e}"));
    let finished = tally.and_then(|_| barrier("end of the run"));
    let mut verdict = json!(null);
    let mut exact = false;
    let mut together = false;
    if finished.is_ok() {
        match sums(&w, &all) {
            Ok((c1, t1)) => {
                together = true;
                // every increment of this run landed: the counters grew as much as the tallies
                // (after a crash the start already differs; that loss is reported at the start)
                let run_exact = rejoined || c1 as i128 - c0 as i128 == t1 as i128 - t0 as i128;
                exact = run_exact && (c1 == t1 || a.allow_unclean);
                verdict = json!({
                    "counters_sum": c1,
                    "tallies_sum": t1,
                    "exact": exact,
                    "this_run_exact": run_exact,
                });
                say!(
                    "node {me}: end: counters sum {c1}, tallies sum {t1}: {}",
                    match (run_exact, c1 == t1) {
                        (true, true) => "exact, no update lost".to_string(),
                        (true, false) => format!(
                            "every increment of this run landed (both grew by {}); the {} lost \
                             before the start stay lost",
                            t1 - t0,
                            (c0 as i128 - t0 as i128).abs()
                        ),
                        (false, _) => "MISMATCH: updates of this run lost or doubled".to_string(),
                    }
                );
            }
            Err(e) => verdict = json!({"error": e.to_string()}),
        }
    }
    drop(w);
    let p = engine.protocol_stats();
    let st = engine.stats();
    say!(
        "node {me}: {made} increments in {secs:.2} s ({:.0}/s), {} errors, {} remote requests, {} pages sent, {} evictions, {} eviction notices in {} batches",
        made as f64 / secs.max(1e-9),
        errors.count,
        p.requests,
        p.pages,
        st.evictions,
        p.evict_notices,
        p.batches
    );
    if let Some(f) = &errors.first {
        say!(
            "node {me}: first error: {f}; {} increments completed after it",
            errors.ok_after_first
        );
    }
    if let Err(e) = &finished {
        say!("node {me}: {e}");
    }
    let mut report = json!({
        "command": "node",
        "node": me,
        "nodes": n,
        "workers": a.workers,
        "increments": made,
        "duration_s": secs,
        "increments_per_s": made as f64 / secs.max(1e-9),
        "start": {"counters_sum": c0, "tallies_sum": t0, "tallies": tallies0, "consistent": c0 == t0, "opened_after_crash": unclean, "rejoined": rejoined},
        "stopped_by_signal": crate::stop::requested(),
        "end": verdict,
        "errors": errors.count,
        "errors_by_home": errors.by_home.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "errors_by_kind": errors.by_kind.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "first_error": errors.first,
        "increments_after_first_error": errors.ok_after_first,
        "finished": finished.as_ref().err().map(|e| e.to_string()),
        "remote_requests": p.requests,
        "messages": p.messages,
        "pages_sent": p.pages,
        "eviction_notices": p.evict_notices,
        "batches": p.batches,
        "lease_waits": p.lease_waits,
        "dead_sharers_forgotten": p.dead_sharers_forgotten,
        "reads_asked_again": p.reads_asked_again,
        "dead_servers_forgotten": p.dead_servers_forgotten,
        "grants_reclaimed": p.grants_reclaimed,
        "peers_severed_silent": p.peers_severed_silent,
        "deaths_noticed": p.deaths_noticed,
        "fences_held": p.fences_held,
        "checkpoints_past_dead": p.checkpoints_past_dead,
        "records_carried": p.records_carried,
        "rejoins": p.rejoins,
        "pages_brought_back": p.pages_brought_back,
        "pages_censused": p.pages_censused,
        "acks_of_fenced": p.acks_of_fenced,
        "evictions": st.evictions,
        "nvme_reads": st.store_reads,
        "nvme_writes": st.store_writes,
    });
    // (past the json! macro's recursion limit)
    for (k, v) in [
        ("longest_take_back_ms", p.longest_take_back_ms),
        ("rejoin_ms", p.rejoin_ms),
        ("evictions_declined", p.evictions_declined),
        ("evictions_declined_for_log", p.evictions_declined_for_log),
    ] {
        report[k] = json!(v);
    }
    if let Some(sums0) = page_sums0 {
        let keyed = |m: &BTreeMap<u64, u64>| {
            m.iter()
                .filter(|(_, &v)| v > 0)
                .map(|(p, v)| (p.to_string(), json!(v)))
                .collect::<serde_json::Map<_, _>>()
        };
        report["start"]["page_sums"] = json!(keyed(&sums0));
        report["increments_by_page"] = json!(keyed(&by_page));
    }
    // a start mismatch (a crash lost updates) is accepted only when asked to open after one
    let ok =
        (c0 == t0 || a.allow_unclean || rejoined) && exact && errors.count == 0 && finished.is_ok();
    Ok((report, ok, together))
}
