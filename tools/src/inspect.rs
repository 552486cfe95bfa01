//! `shoal inspect DIR`: check the stores in a data directory without starting an engine.
//!
//! For every node whose device files (`node<N>-<i>.dat`) are in DIR: the superblocks (format,
//! cluster and node id, device set, clean flag, allocator mark, free list), then every slot
//! below the allocator's mark read and verified (checksum, page id), then every B-tree named in
//! the catalog walked from its root with the tree's structural verifier (layouts, key order,
//! fences, levels, right links, no page reached twice). Nothing in DIR is written; a running
//! engine's store is refused (its lock file is held), and an engine cannot open a store while
//! it is inspected.
//!
//! The write-ahead log beside each store (`node<N>-0.wal`) is read too: its size, checkpoints,
//! and what recovery would replay. A store that was not shut down cleanly is reported as
//! needing recovery (with a log: `shoal recover DIR`) or as having lost its recent changes
//! (without one), never as "ok".
//!
//! `shoal inspect --cluster FILE`: the same for every node of a cluster file, each store read
//! from its node's `data_dir` (they must be reachable from here); a node with no store is a
//! problem. A store that needs recovery is then pointed to `shoal recover --cluster FILE`.
//!
//! Exit status: 0 when everything checks out, 1 when anything is corrupt or broken, 2 when
//! DIR cannot be inspected at all (no store, unreadable device, an engine is running), 3 when
//! a store was not shut down cleanly (the findings are from before any recovery).

use crate::cli::progress_bar;
use serde_json::json;
use shoal_btree::{verify_tree, TreeReport};
use shoal_engine::{catalog, lock_for_reading, Pid, PAGE_DATA_SIZE};
use shoal_storage::wal::{survey, LogEnd, LogInfo, ScanMode};
use shoal_storage::CopyState;
use shoal_storage::{SlotScan, StoreReader};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Data directory holding the device files `node<N>-<i>.dat` (the `--data-dir` of `shoal
    /// ycsb`/`shoal tpcc`, or a node's `data_dir` in a cluster file).
    #[arg(required_unless_present = "cluster", conflicts_with = "cluster")]
    pub dir: Option<PathBuf>,
    /// Inspect every node of the cluster this file describes (their data directories must be
    /// reachable from here), instead of the stores of one directory.
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// Also write the report as JSON to this file (`-` for standard output, instead of the
    /// summary).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Check superblocks and page checksums only, not the B-trees.
    #[arg(long)]
    pub no_trees: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// One node's store in DIR.
struct NodeReport {
    node: u8,
    devices: Vec<PathBuf>,
    reader: StoreReader,
    /// `None`: unclean store (its free list is stale).
    free: Option<HashSet<u64>>,
    scan: SlotScan,
    /// The log beside the store, if there is one (or why it could not be read).
    log: Option<(PathBuf, Result<LogInfo, String>)>,
}

impl NodeReport {
    /// "clean", "needs_recovery" (unclean, with a log), "log_missing" (unclean, last opened
    /// with a log that is gone) or "unclean_without_log".
    fn state(&self) -> &'static str {
        let sb = self.reader.superblock();
        match (sb.clean, &self.log) {
            (true, _) => "clean",
            (false, Some(_)) => "needs_recovery",
            (false, None) if sb.logged => "log_missing",
            (false, None) => "unclean_without_log",
        }
    }
}

/// One catalog entry.
struct Entry {
    name: String,
    root: Pid,
    /// `Ok(None)`: the root is not a B-tree node (some other page the application named).
    result: Result<Option<TreeReport>, String>,
}

/// What is inspected: a data directory, or the nodes of a cluster file.
enum Target {
    Dir(PathBuf),
    Cluster(PathBuf),
}

impl Target {
    fn label(&self) -> String {
        match self {
            Target::Dir(d) => d.display().to_string(),
            Target::Cluster(f) => format!("the cluster of {}", f.display()),
        }
    }

    /// The command that recovers what this target holds.
    fn recover_command(&self) -> String {
        match self {
            Target::Dir(d) => format!(
                "`shoal recover {}` (a cluster node's store: `shoal recover --cluster FILE`, or start the cluster)",
                d.display()
            ),
            Target::Cluster(f) => format!(
                "`shoal recover --cluster {}`, or start the cluster",
                f.display()
            ),
        }
    }
}

/// Every node's store of the cluster `file` describes, each found in its node's `data_dir`.
fn cluster_stores(file: &Path) -> anyhow::Result<BTreeMap<u8, Store>> {
    let f = shoal_engine::ClusterFile::load(file).map_err(anyhow::Error::from)?;
    let mut out = BTreeMap::new();
    for n in &f.nodes {
        let mut found = find_stores(&n.data_dir)
            .map_err(|e| anyhow::anyhow!("node {} of {}: {e:#}", n.id, file.display()))?;
        let Some(store) = found.remove(&n.id) else {
            return Err(anyhow::anyhow!(
                "node {} of {}: its data directory {} holds no store of node {} (has it ever \
                 started?)",
                n.id,
                file.display(),
                n.data_dir.display(),
                n.id
            ));
        };
        out.insert(n.id, store);
    }
    Ok(out)
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let target = match (&a.dir, &a.cluster) {
        (_, Some(f)) => Target::Cluster(f.clone()),
        (Some(d), None) => Target::Dir(d.clone()),
        (None, None) => unreachable!("clap requires DIR or --cluster"),
    };
    let nodes = match &target {
        Target::Dir(d) => find_stores(d)?,
        Target::Cluster(f) => cluster_stores(f)?,
    };
    // Hold every node's lock (shared) for the whole inspection.
    let mut _locks = Vec::new();
    for (node, store) in &nodes {
        _locks.push(lock_for_reading(&store.dir, *node)?);
    }
    let mut reports = Vec::new();
    for (node, Store { devices, .. }) in nodes {
        let reader =
            StoreReader::open(&devices).map_err(|e| anyhow::anyhow!("node {node}: {e}"))?;
        let free = reader
            .free_slots()
            .map_err(|e| anyhow::anyhow!("node {node}: {e}"))?
            .map(|f| f.into_iter().collect::<HashSet<u64>>());
        let bar = progress_bar(
            reader.slot_limit(),
            &format!("node {node}: check"),
            "pages",
            a.quiet || a.json.as_deref() == Some(Path::new("-")),
        );
        let scan = reader.scan(
            free.as_ref().unwrap_or(&HashSet::new()),
            |slot| Pid::new(node, slot).raw(),
            |done| bar.set_position(done),
        );
        bar.finish_and_clear();
        // a store that needs recovery: read the whole log, telling its end from damage
        let mode = if reader.superblock().clean {
            ScanMode::End
        } else {
            ScanMode::Judge
        };
        let log = devices
            .first()
            .map(|d| shoal_storage::default_log_path(d))
            .filter(|p| p.exists())
            .map(|p| {
                let info = survey(&p, mode).map_err(|e| e.to_string());
                (p, info)
            });
        reports.push(NodeReport {
            node,
            devices,
            reader,
            free,
            scan,
            log,
        });
    }
    let mut problems: Vec<String> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    for r in &reports {
        let sb = r.reader.superblock();
        if !sb.clean {
            notes.push(format!(
                "node {}: not shut down cleanly: pages written since the last clean shutdown may \
                 be missing; slots up to the end of the devices were checked",
                r.node
            ));
        }
        for (path, copies) in r.devices.iter().zip(r.reader.superblock_copies()) {
            if copies.needs_repair(sb.generation) {
                notes.push(format!(
                    "node {} {}: superblock {copies}: the next open rewrites every copy from \
                     generation {}",
                    r.node,
                    path.display(),
                    sb.generation
                ));
            }
        }
        match &r.log {
            Some((p, Err(why))) => {
                problems.push(format!("node {}: log {}: {why}", r.node, p.display()))
            }
            Some((p, Ok(l))) => {
                if let Some(d) = &l.damage {
                    problems.push(format!("node {}: {d}", r.node));
                }
                if l.store_id != sb.store_id && sb.format_version >= 3 {
                    problems.push(format!(
                        "node {}: log {} belongs to another store (id {:#018x}; the store's is \
                         {:#018x}): recovery refuses it",
                        r.node,
                        p.display(),
                        l.store_id,
                        sb.store_id
                    ));
                }
                if let (false, Some(LogEnd::TornTail { lsn, flush })) = (sb.clean, &l.end) {
                    notes.push(format!(
                        "node {}: the log's last flush ({flush}) was cut off at LSN {lsn} by the \
                         crash (never acknowledged); recovery replays up to it",
                        r.node
                    ));
                }
            }
            None if !sb.clean && sb.logged => problems.push(format!(
                "node {}: the store was last opened with a write-ahead log, and its log is \
                 missing: the changes since its last checkpoint cannot be recovered without it",
                r.node
            )),
            None => {}
        }
        let needed = r.reader.short_devices();
        for (path, len, want) in needed {
            problems.push(format!(
                "node {} {}: {len} bytes, but the allocated slots need {want}: the file was cut \
                 short and pages are missing",
                r.node,
                path.display()
            ));
        }
        if sb.node_id != r.node as u32 {
            problems.push(format!(
                "node {}: its files hold the store of node {}",
                r.node, sb.node_id
            ));
        }
        for (slot, why) in &r.scan.corrupt_slots {
            problems.push(format!("node {} slot {slot}: {why}", r.node));
        }
        if r.scan.corrupt > r.scan.corrupt_slots.len() as u64 {
            problems.push(format!(
                "node {}: {} more corrupt slots",
                r.node,
                r.scan.corrupt - r.scan.corrupt_slots.len() as u64
            ));
        }
        if sb.clean && r.scan.never_written > 0 {
            notes.push(format!(
                "node {}: {} slots in use were never written (first: {:?})",
                r.node,
                r.scan.never_written,
                &r.scan.never_written_slots[..r.scan.never_written_slots.len().min(10)]
            ));
        }
    }
    let clusters: HashSet<u64> = reports
        .iter()
        .map(|r| r.reader.superblock().cluster_id)
        .collect();
    if clusters.len() > 1 {
        problems.push(format!(
            "the stores of {} belong to different clusters: {clusters:?}",
            target.label()
        ));
    }

    let (entries, in_trees) = if a.no_trees {
        (None, None)
    } else {
        match check_trees(&reports) {
            Ok((entries, pages)) => (Some(entries), Some(pages)),
            Err(e) => {
                problems.push(e);
                (None, None)
            }
        }
    };
    for e in entries.iter().flatten() {
        if let Err(why) = &e.result {
            problems.push(format!("tree '{}' (root {}): {why}", e.name, e.root));
        }
    }
    // Pages in use that no tree reaches: the catalog page, pages the application keeps
    // outside trees, or leaked ones. Counted only when every tree checked out.
    let outside: Option<BTreeMap<u8, u64>> = in_trees
        .filter(|_| entries.iter().flatten().all(|e| e.result.is_ok()))
        .map(|pages| {
            reports
                .iter()
                .map(|r| {
                    let mine = pages.iter().filter(|p| p.node() == r.node).count() as u64;
                    (r.node, r.scan.intact.saturating_sub(mine))
                })
                .collect()
        });

    let ok = problems.is_empty() && reports.iter().all(|r| r.state() == "clean");
    let doc = json!({
        "dir": a.dir.as_ref().map(|d| d.display().to_string()),
        "cluster": a.cluster.as_ref().map(|f| f.display().to_string()),
        "ok": ok,
        "nodes": reports.iter().map(|r| node_json(r, outside.as_ref())).collect::<Vec<_>>(),
        "catalog": entries.as_ref().map(|es| es.iter().map(entry_json).collect::<Vec<_>>()),
        "problems": problems,
        "notes": notes,
    });
    match a.json.as_deref() {
        Some(p) if p == Path::new("-") => {
            say!("{}", serde_json::to_string_pretty(&doc).expect("json"))
        }
        other => {
            print_summary(
                &target,
                &reports,
                entries.as_deref(),
                outside.as_ref(),
                &problems,
                &notes,
            );
            if let Some(path) = other {
                std::fs::write(
                    path,
                    serde_json::to_string_pretty(&doc).expect("json") + "\n",
                )
                .map_err(|e| anyhow::anyhow!("--json {}: {e}", path.display()))?;
            }
        }
    }
    Ok(if reports.iter().any(|r| r.state() != "clean") {
        ExitCode::from(3)
    } else if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// One node's store: the directory holding its files and lock, and its device files in
/// stripe order.
pub(crate) struct Store {
    pub dir: PathBuf,
    pub devices: Vec<PathBuf>,
}

/// The stores in `dir`: device files right in it, and in subdirectories `node<i>` (where
/// `shoal ycsb --data-dir` puts the nodes of a cluster).
pub(crate) fn find_stores(dir: &Path) -> anyhow::Result<BTreeMap<u8, Store>> {
    let mut found: BTreeMap<u8, (PathBuf, BTreeMap<usize, PathBuf>)> = BTreeMap::new();
    let mut dirs = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < dirs.len() {
        let list = std::fs::read_dir(&dirs[i])
            .map_err(|e| anyhow::anyhow!("{}: {e}", dirs[i].display()))?;
        for entry in list {
            let entry = entry.map_err(|e| anyhow::anyhow!("{}: {e}", dirs[i].display()))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if i == 0 && entry.path().is_dir() && parse_node_dir(name).is_some() {
                dirs.push(entry.path());
                continue;
            }
            let Some((node, index)) = parse_device_name(name) else {
                continue;
            };
            let (at, files) = found
                .entry(node)
                .or_insert_with(|| (dirs[i].clone(), BTreeMap::new()));
            if *at != dirs[i] {
                return Err(anyhow::anyhow!(
                    "device files of node {node} in both {} and {}",
                    at.display(),
                    dirs[i].display()
                ));
            }
            files.insert(index, entry.path());
        }
        i += 1;
    }
    if found.is_empty() {
        let left = creation_leftovers(dir);
        if !left.is_empty() {
            return Err(anyhow::anyhow!(
                "no Shoal store in {}: only {} file(s) of a store whose creation a crash \
                 interrupted before it was complete ({}); nothing was stored in it, and the next \
                 creation replaces them",
                dir.display(),
                left.len(),
                left.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        return Err(anyhow::anyhow!(
            "no Shoal store in {}: expected device files named node<N>-<i>.dat (in it or in \
             subdirectories node<N>)",
            dir.display()
        ));
    }
    found
        .into_iter()
        .map(|(node, (at, files))| {
            // stripe order: node<N>-0.dat, -1, ... without gaps
            if let Some((i, _)) = files.keys().enumerate().find(|(i, k)| i != *k) {
                return Err(anyhow::anyhow!(
                    "node {node}: device file node{node}-{i}.dat is missing from {}",
                    at.display()
                ));
            }
            let devices = files.into_values().collect();
            Ok((node, Store { dir: at, devices }))
        })
        .collect()
}

/// Files in `dir` (and its `node<N>` subdirectories) that a store's interrupted creation left
/// (`*.creating`).
pub(crate) fn creation_leftovers(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(list) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in list.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if d == dir && e.path().is_dir() && parse_node_dir(&name).is_some() {
                dirs.push(e.path());
            } else if name.ends_with(shoal_storage::CREATING) {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// `node<N>` -> N.
fn parse_node_dir(name: &str) -> Option<u8> {
    name.strip_prefix("node")?.parse().ok()
}

/// `node<N>-<i>.dat` -> (N, i).
fn parse_device_name(name: &str) -> Option<(u8, usize)> {
    let (node, index) = name
        .strip_prefix("node")?
        .strip_suffix(".dat")?
        .split_once('-')?;
    let node: u8 = node.parse().ok()?;
    ((node as usize) < shoal_engine::MAX_NODES).then_some(())?;
    Some((node, index.parse().ok()?))
}

/// Walk every catalog entry whose root is a B-tree node. Returns the entries and every page
/// the trees (and the catalog) occupy. Fails only if the catalog itself cannot be read.
fn check_trees(reports: &[NodeReport]) -> Result<(Vec<Entry>, HashSet<Pid>), String> {
    let read = |pid: Pid| -> Result<Box<[u8; PAGE_DATA_SIZE]>, String> {
        let r = reports
            .iter()
            .find(|r| r.node == pid.node())
            .ok_or_else(|| {
                format!(
                    "page {pid} is on node {}, whose store is not here",
                    pid.node()
                )
            })?;
        if r.free.as_ref().is_some_and(|f| f.contains(&pid.slot())) {
            return Err(format!("page {pid} is a free slot"));
        }
        if pid.slot() >= r.reader.slot_limit() {
            return Err(format!(
                "page {pid} lies beyond its store's allocated slots"
            ));
        }
        let page = r
            .reader
            .read(pid.slot(), pid.raw())
            .map_err(|e| e.to_string())?;
        let mut data = Box::new([0u8; PAGE_DATA_SIZE]);
        data.copy_from_slice(&page[..PAGE_DATA_SIZE]);
        Ok(data)
    };
    let cat = read(Pid::CATALOG).map_err(|e| format!("the catalog: {e}"))?;
    let names = catalog::parse(&cat[..]).map_err(|e| e.to_string())?;
    let mut pages: HashSet<Pid> = HashSet::from([Pid::CATALOG]);
    let mut out = Vec::with_capacity(names.len());
    for (name, root) in names {
        let result = match read(root) {
            Err(e) => Err(e),
            Ok(p) if !matches!(p[0], shoal_btree::KIND_LEAF | shoal_btree::KIND_INNER) => {
                pages.insert(root);
                Ok(None)
            }
            Ok(_) => verify_tree(root, read).map(|t| {
                pages.extend(t.pages.iter().copied());
                Some(t)
            }),
        };
        out.push(Entry { name, root, result });
    }
    Ok((out, pages))
}

fn node_json(r: &NodeReport, outside: Option<&BTreeMap<u8, u64>>) -> serde_json::Value {
    let sb = r.reader.superblock();
    json!({
        "node": r.node,
        "devices": r.devices.iter().zip(r.reader.device_bytes()).map(|(p, b)| json!({
            "path": p.display().to_string(), "bytes": b,
        })).collect::<Vec<_>>(),
        "format_version": sb.format_version,
        "superblock_generation": sb.generation,
        "superblock_copies": r.devices.iter().zip(r.reader.superblock_copies()).map(|(p, c)| json!({
            "path": p.display().to_string(),
            "used": c.used,
            "copies": c.copies.iter().map(|c| match c {
                CopyState::Intact { generation } => json!({"intact": true, "generation": generation}),
                CopyState::Bad(why) => json!({"intact": false, "error": why}),
            }).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "cluster_id": sb.cluster_id,
        "store_id": format!("{:#018x}", sb.store_id),
        "logged": sb.logged,
        "clean": sb.clean,
        "allocated_slots": sb.next_slot,
        "capacity_slots": sb.capacity,
        "slots_checked": r.scan.slots,
        "free": r.free.as_ref().map(HashSet::len),
        "intact": r.scan.intact,
        "never_written": r.scan.never_written,
        "corrupt": r.scan.corrupt,
        "corrupt_slots": r.scan.corrupt_slots.iter().map(|(s, why)| json!({
            "slot": s, "pid": Pid::new(r.node, *s).raw(), "error": why,
        })).collect::<Vec<_>>(),
        "pages_outside_trees": outside.and_then(|o| o.get(&r.node)),
        "state": r.state(),
        "log": r.log.as_ref().map(|(p, info)| match info {
            Ok(l) => json!({
                "path": p.display().to_string(),
                "file_bytes": l.file_bytes,
                "checkpoints": l.checkpoints,
                "redo_lsn": l.redo_lsn,
                "end_lsn": l.end_lsn,
                "store_id": format!("{:#018x}", l.store_id),
                "end": match &l.end {
                    None => serde_json::Value::Null,
                    Some(LogEnd::Clean) => json!("clean"),
                    Some(LogEnd::Full) => json!("full"),
                    Some(LogEnd::TornTail { lsn, flush }) => json!({"torn_tail": {"lsn": lsn, "flush": flush}}),
                    Some(LogEnd::Discarded { lsn, .. }) => json!({"discarded_from": lsn}),
                },
                "damage": l.damage,
                "bad_header_blocks": l.bad_headers,
                "pending_chunks": l.pending.chunks,
                "pending_records": l.pending.records,
                "pending_bytes": l.pending.log_bytes,
            }),
            Err(why) => json!({"path": p.display().to_string(), "error": why}),
        }),
    })
}

fn entry_json(e: &Entry) -> serde_json::Value {
    let mut v = json!({ "name": e.name, "root": e.root.raw() });
    match &e.result {
        Ok(Some(t)) => {
            v["btree"] = json!({
                "entries": t.entries, "height": t.height, "leaves": t.leaves,
                "inner_nodes": t.inner_nodes, "pages": t.pages.len(), "fill": t.fill(),
                "overflow_values": t.overflow_values, "overflow_pages": t.overflow_pages,
                "underfull_nodes": t.underfull,
                "levels": t.levels.iter().enumerate().map(|(l, (nodes, bytes))| json!({
                    "level": l, "nodes": nodes,
                    "fill": *bytes as f64 / (*nodes as f64 * PAGE_DATA_SIZE as f64),
                })).collect::<Vec<_>>(),
            })
        }
        Ok(None) => v["btree"] = serde_json::Value::Null,
        Err(why) => v["error"] = json!(why),
    }
    v
}

fn print_summary(
    target: &Target,
    reports: &[NodeReport],
    entries: Option<&[Entry]>,
    outside: Option<&BTreeMap<u8, u64>>,
    problems: &[String],
    notes: &[String],
) {
    say!("inspect {}", target.label());
    for r in reports {
        let sb = r.reader.superblock();
        let bytes: u64 = r.reader.device_bytes().iter().sum();
        say!(
            "node {}: {} device(s), {}, format {}, cluster {}, {}",
            r.node,
            r.devices.len(),
            shoal_engine::format_bytes(bytes),
            sb.format_version,
            sb.cluster_id,
            if sb.clean {
                "clean"
            } else {
                "NOT shut down cleanly"
            }
        );
        let copies = r.reader.superblock_copies();
        if copies.iter().all(|c| !c.needs_repair(sb.generation)) {
            say!(
                "  superblock: generation {}, {} intact cop{} on every device",
                sb.generation,
                copies[0].copies.len(),
                if copies[0].copies.len() == 1 {
                    "y (format 1)"
                } else {
                    "ies"
                }
            );
        } else {
            for (p, c) in r.devices.iter().zip(copies) {
                say!("  superblock on {}: {c}", p.display());
            }
        }
        let free = r
            .free
            .as_ref()
            .map_or("unknown (unclean)".to_string(), |f| f.len().to_string());
        say!(
            "  slots: {} allocated, {free} free; checked {}: {} intact, {} never written, {} corrupt{}",
            sb.next_slot,
            r.scan.slots,
            r.scan.intact,
            r.scan.never_written,
            r.scan.corrupt,
            outside
                .and_then(|o| o.get(&r.node))
                .map_or(String::new(), |n| format!("; {n} in use outside every tree"))
        );
        match &r.log {
            None if sb.logged => say!("  log: MISSING (the store was last opened with one)"),
            None => say!("  log: none (durability none)"),
            Some((p, Ok(l))) if l.damage.is_some() => say!(
                "  log: {}: DAMAGED at LSN {} (see the problems below)",
                p.display(),
                l.end_lsn
            ),
            Some((p, Err(why))) => say!("  log: {}: UNREADABLE: {why}", p.display()),
            Some((p, Ok(l))) => say!(
                "  log: {}, {}, {} checkpoints; after the last (LSN {}): {} chunks, {:.1} MB{}",
                p.display(),
                shoal_engine::format_bytes(l.file_bytes),
                l.checkpoints,
                l.redo_lsn,
                l.pending.chunks,
                l.pending.log_bytes as f64 / 1e6,
                if sb.clean {
                    " (nothing to replay: clean)"
                } else {
                    " to replay"
                }
            ),
        }
    }
    match entries {
        None => say!("catalog: not checked"),
        Some(es) => {
            say!(
                "catalog: {} entr{}",
                es.len(),
                if es.len() == 1 { "y" } else { "ies" }
            );
            for e in es {
                match &e.result {
                    Ok(Some(t)) => say!(
                        "  {:<24} B-tree: {} entries, height {}, {} leaves + {} inner nodes, {:.0}% full, {} under a quarter full{}",
                        e.name,
                        t.entries,
                        t.height,
                        t.leaves,
                        t.inner_nodes,
                        t.fill() * 100.0,
                        t.underfull,
                        if t.overflow_values > 0 {
                            format!(
                                "; {} large values in {} overflow pages",
                                t.overflow_values, t.overflow_pages
                            )
                        } else {
                            String::new()
                        }
                    ),
                    Ok(None) => say!("  {:<24} page {} (not a B-tree: not checked)", e.name, e.root),
                    Err(why) => say!("  {:<24} BROKEN: {why}", e.name),
                }
            }
        }
    }
    for n in notes {
        say!("note: {n}");
    }
    if !problems.is_empty() {
        say!("{} problem(s):", problems.len());
        for p in problems {
            say!("  {p}");
        }
    }
    for r in reports {
        match r.state() {
            "needs_recovery" => say!(
                "node {}: NEEDS RECOVERY (not shut down cleanly; its log holds the changes): run {}, or open it with a log (durability commit or flush-every-ms); the findings above are from before recovery",
                r.node,
                target.recover_command()
            ),
            "unclean_without_log" => say!(
                "node {}: NOT shut down cleanly and no log: changes since its last clean shutdown are lost (an engine opens it only with allow_unclean)",
                r.node
            ),
            _ => {}
        }
    }
    if problems.is_empty() && reports.iter().all(|r| r.state() == "clean") {
        say!("ok: no problems found");
    }
}

#[cfg(test)]
mod tests {
    use super::parse_device_name;

    #[test]
    fn device_names() {
        assert_eq!(parse_device_name("node0-0.dat"), Some((0, 0)));
        assert_eq!(parse_device_name("node12-3.dat"), Some((12, 3)));
        assert_eq!(parse_device_name("node64-0.dat"), None);
        assert_eq!(parse_device_name("node0.lock"), None);
        assert_eq!(parse_device_name("node-0.dat"), None);
        assert_eq!(parse_device_name("nodex-0.dat"), None);
        assert_eq!(super::parse_node_dir("node3"), Some(3));
        assert_eq!(super::parse_node_dir("nodes"), None);
    }
}
