//! `shoal recover DIR`: recover the stores in a data directory that a crash left unclean,
//! without running any workload. For each node store: a clean one is left as it is; an
//! unclean one with a write-ahead log is opened (recovery replays the log from its last
//! checkpoint, writes the pages and syncs) and closed cleanly; an unclean one without a log
//! (durability "none") cannot be recovered, and is reported.
//!
//! A damaged log (a chunk that fails its checks with durable data after it) is refused with an
//! error naming the damaged range, and nothing is changed; `--discard-damaged-log` recovers up
//! to the damage instead and gives up the rest.
//!
//! `shoal recover --cluster FILE`: recover every node of a cluster with a log (docs/durability.md,
//! "Clusters"): each node's recovery reads every node's log, so they are recovered together,
//! in one process, then closed cleanly. A cluster node's store is refused by `shoal recover
//! DIR` (its log holds other nodes' pages).
//!
//! Exit status: 0 when every store is clean afterwards, 1 when a store could not be recovered
//! (no log, or its log is missing), 2 when DIR cannot be read or recovery failed (a damaged
//! log among the causes).

use serde_json::json;
use shoal_engine::{lock_for_reading, Durability, Engine};
use shoal_storage::wal::LogEnd;
use shoal_storage::StoreReader;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Data directory holding the device files `node<N>-<i>.dat` and logs `node<N>-0.wal`.
    #[arg(required_unless_present = "cluster", conflicts_with = "cluster")]
    pub dir: Option<PathBuf>,
    /// Recover every node of the cluster this file describes (their data directories must be
    /// reachable from here), instead of the stores of one directory.
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// A store whose log is damaged is recovered up to the damage, and everything the log
    /// holds after it is given up (without this, recovery refuses a damaged log and changes
    /// nothing). For a log that cannot be repaired or restored; `shoal inspect` shows the
    /// damage first.
    #[arg(long)]
    pub discard_damaged_log: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let dir = match (&a.dir, &a.cluster) {
        (_, Some(file)) => return recover_cluster(file, a.json.as_deref()),
        (Some(d), None) => d.clone(),
        (None, None) => unreachable!("clap requires DIR or --cluster"),
    };
    let stores = match crate::inspect::find_stores(&dir) {
        Ok(s) => s,
        Err(e) if !crate::inspect::creation_leftovers(&dir).is_empty() => {
            // a creation that never reached its commit point: there is nothing to recover
            say!("{e:#}");
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e),
    };
    let mut lost = 0;
    let mut nodes = Vec::new();
    for (node, store) in stores {
        let sb = {
            let _lock = lock_for_reading(&store.dir, node)?;
            StoreReader::open(&store.devices)
                .map_err(|e| anyhow::anyhow!("node {node}: {e}"))?
                .superblock()
                .clone()
        };
        let log = store
            .devices
            .first()
            .map(|d| shoal_storage::default_log_path(d))
            .filter(|p| p.exists());
        if sb.clean {
            say!("node {node}: clean, nothing to recover");
            nodes.push(json!({"node": node, "state": "clean"}));
            continue;
        }
        let Some(log) = log else {
            if sb.logged {
                say!(
                    "node {node}: not shut down cleanly, and its write-ahead log is missing \
                     (the store was last opened with one): it cannot be recovered without it; \
                     put the log back"
                );
                nodes.push(json!({"node": node, "state": "log_missing"}));
                lost += 1;
                continue;
            }
            say!(
                "node {node}: not shut down cleanly and has no log (durability none): it cannot \
                 be recovered; changes since its last clean shutdown are lost (an engine opens it \
                 only with allow_unclean)"
            );
            nodes.push(json!({"node": node, "state": "unclean_without_log"}));
            lost += 1;
            continue;
        };
        let mut cfg = crate::cli::recovering_config(&store.dir, node, 16 << 20);
        cfg.cluster_id = sb.cluster_id;
        cfg.devices = store.devices.len();
        cfg.discard_damaged_log = a.discard_damaged_log;
        debug_assert_eq!(
            cfg.durability,
            Durability::Commit,
            "{} has a log",
            log.display()
        );
        let engine = Engine::open(cfg).map_err(|e| anyhow::anyhow!("node {node}: {e}"))?;
        let r = engine.store().replayed().cloned().unwrap_or_default();
        engine
            .close()
            .map_err(|e| anyhow::anyhow!("node {node}: closing after recovery: {e}"))?;
        let ended = match &r.end {
            Some(LogEnd::TornTail { lsn, .. }) => format!(
                "; the log's last flush was cut off by the crash at LSN {lsn} (never acknowledged)"
            ),
            Some(LogEnd::Discarded { lsn, .. }) => format!(
                "; the log was DAMAGED at LSN {lsn}: everything after it was given up, as asked"
            ),
            _ => String::new(),
        };
        let mb = r.log_bytes as f64 / 1e6;
        let rate = if r.seconds > 0.0 { mb / r.seconds } else { 0.0 };
        say!(
            "node {node}: recovered: {} chunks, {} records, {mb:.1} MB of log, {} pages written, \
             {:.2} s ({rate:.0} MB/s of log); the store is clean{ended}",
            r.chunks,
            r.records,
            r.pages,
            r.seconds
        );
        nodes.push(json!({
            "node": node,
            "state": "recovered",
            "chunks": r.chunks,
            "records": r.records,
            "log_bytes": r.log_bytes,
            "pages": r.pages,
            "seconds": r.seconds,
            "log_mb_per_s": rate,
            "log_end": match &r.end {
                Some(LogEnd::TornTail { lsn, .. }) => json!({"torn_tail_at": lsn}),
                Some(LogEnd::Discarded { lsn, why }) => json!({"discarded_from": lsn, "damage": why}),
                Some(LogEnd::Full) => json!("full"),
                _ => json!("clean"),
            },
        }));
    }
    if let Some(path) = &a.json {
        let doc = json!({"dir": dir.display().to_string(), "nodes": nodes});
        std::fs::write(
            path,
            serde_json::to_string_pretty(&doc).expect("json") + "\n",
        )
        .map_err(|e| anyhow::anyhow!("--json {}: {e}", path.display()))?;
    }
    Ok(if lost > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// `shoal recover --cluster FILE`: open every node of the cluster in this process (over `mem`),
/// each recovering from every node's log, then close them all cleanly.
fn recover_cluster(
    file: &std::path::Path,
    json: Option<&std::path::Path>,
) -> anyhow::Result<ExitCode> {
    let f = shoal_engine::ClusterFile::load(file).map_err(anyhow::Error::from)?;
    let Some(durability) = f.durability.filter(|d| d.logged()) else {
        return Err(anyhow::anyhow!(
            "{}: the cluster names no durability with a log (durability = \"commit\" or \"flush-every-ms=N\"): its nodes have no log to recover from",
            file.display()
        ));
    };
    let nodes = f.nodes.len();
    let cluster = shoal_engine::Cluster::mem(nodes, f.remote_timeout, |i| {
        let mut c = f
            .engine_config(i)
            .expect("every id of the file has a configuration");
        c.mode = shoal_engine::OpenMode::Open;
        c.durability = durability;
        c
    })
    .map_err(|e| anyhow::anyhow!("recovering the cluster of {}: {e}", file.display()))?;
    let mut report = Vec::new();
    for (i, e) in cluster.nodes().iter().enumerate() {
        match e.store().replayed() {
            Some(r) => {
                say!(
                    "node {i}: recovered from the cluster's logs: {} chunks of its own log ({:.1} MiB), {} pages written",
                    r.chunks,
                    r.log_bytes as f64 / (1u64 << 20) as f64,
                    r.pages
                );
                report.push(
                    json!({"node": i, "state": "recovered", "pages": r.pages, "chunks": r.chunks}),
                );
            }
            None => {
                say!("node {i}: clean, nothing to recover");
                report.push(json!({"node": i, "state": "clean"}));
            }
        }
    }
    cluster
        .close()
        .map_err(|e| anyhow::anyhow!("closing the recovered cluster: {e}"))?;
    say!("every node of the cluster closed cleanly");
    if let Some(p) = json {
        let doc = json!({"cluster": file.display().to_string(), "nodes": report});
        std::fs::write(p, serde_json::to_string_pretty(&doc).expect("json") + "\n")
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", p.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}
