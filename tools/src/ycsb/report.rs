//! The run's summary: YCSB's `[OVERALL]`/`[READ]` lines or the human one, per-node figures,
//! the JSON document.

use super::*;

/// Node-level counters over the measured interval.
pub(super) struct NodeReport {
    pub(super) node: u8,
    /// Operations this node's workers completed in the measured interval.
    pub(super) ops: u64,
    pub(super) d: StatsSnapshot,
    pub(super) remote: u64,
    /// One pool: this home's reads served by another node's copy instead of its NVMe.
    pub(super) forwarded: u64,
    /// One pool: pages this node's DRAM served in place of another home's NVMe.
    pub(super) served: u64,
    /// One pool: evicted pages of this home a peer took instead of NVMe alone.
    pub(super) given: u64,
    /// One pool: pages of other homes this node took in when they were evicted there.
    pub(super) taken: u64,
    /// With a log: times a page's hand-over was held for the log writer (its changes were not
    /// durable yet; one hand-over may be held several times), and pages that left only after
    /// a flush of their own.
    pub(super) held_for_log: u64,
    pub(super) flushed_to_leave: u64,
    pub(super) secs: f64,
    pub(super) logged: bool,
}

/// Share of page accesses served by this node's memory (not a fault, not a remote fetch).
pub(super) fn hit_ratio(d: &StatsSnapshot, remote: u64) -> f64 {
    if d.hits > 0 {
        d.hits.saturating_sub(d.faults + remote) as f64 / d.hits as f64
    } else {
        1.0
    }
}

impl NodeReport {
    pub(super) fn hit_ratio(&self) -> f64 {
        hit_ratio(&self.d, self.remote)
    }
    pub(super) fn json(&self) -> serde_json::Value {
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
            "pages_held_for_log": self.held_for_log,
            "flushes_before_send": self.flushed_to_leave,
        })
    }
}

/// Snapshot of one node: engine counters and remote fetches.
pub(super) fn snap(e: &Engine) -> Snap {
    let p = e.protocol_stats();
    (e.stats(), p.requests, p)
}

/// Run the workload on `tree` (holding the records of `set`) and report.
pub(super) fn report_run(
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
    let mut intended: Vec<Histogram<u64>> = (0..5).map(|_| crate::report::hist()).collect();
    let mut ops = [0u64; 5];
    let (mut errors, mut misses) = (0, 0);
    let mut first_error = None;
    for r in &results {
        for (all, h) in per_op.iter_mut().zip(&r.hists) {
            all.add(h).expect("same bounds");
            hist.add(h).expect("same bounds");
        }
        for (all, h) in intended.iter_mut().zip(&r.intended) {
            all.add(h).expect("same bounds");
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
    // results come in thread order, each node's workers x tasks
    let mut rest = results.iter();
    let reports: Vec<NodeReport> = nodes
        .engines
        .iter()
        .zip(before.iter().zip(&after))
        .map(|(e, (b, f))| NodeReport {
            node: e.node_id(),
            ops: rest
                .by_ref()
                .take(plan.workers_of(e) * a.tasks)
                .map(|r| r.ops.iter().sum::<u64>())
                .sum(),
            d: delta(&b.0, &f.0),
            remote: f.1 - b.1,
            forwarded: f.2.forwarded_reads - b.2.forwarded_reads,
            served: f.2.served_for_others - b.2.served_for_others,
            given: f.2.given_away - b.2.given_away,
            taken: f.2.taken_in - b.2.taken_in,
            held_for_log: f.2.held_for_log - b.2.held_for_log,
            flushed_to_leave: f.2.flushes_before_send - b.2.flushes_before_send,
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
            say!(
                "  log node {:<4} {}, hand-overs held for the log {:.0}/s, flushed to leave {:.0}/s",
                r.node,
                r.d.log.summary(secs),
                r.held_for_log as f64 / secs,
                r.flushed_to_leave as f64 / secs
            );
        }
    }
    say!("  value errors  {errors}  (reads of keys inserted during the run and not yet visible: {misses})");
    if !a.property_files.is_empty() || !a.properties.is_empty() {
        ycsb_lines(secs, tput, &per_op, errors);
        if a.target.is_some() {
            op_lines("Intended-", &intended);
        }
    }
    if let Some(e) = &first_error {
        say!("  first error   {e}");
    }
    if let Some(path) = &a.json {
        let mut doc = json!({
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
            "keys": plan.names.names,
            "fields": fields_json(plan),
            "nodes": nodes.cluster,
            "transport": if nodes.member { "tcp" } else { "mem" },
            // node 0's, as cache_bytes_per_node
            "workers_per_node": plan.workers_of(first),
            "workers_of_nodes": nodes.engines.iter().map(|e| plan.workers_of(e)).collect::<Vec<_>>(),
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
            // under --target: latency from each operation's intended start (YCSB's Intended-)
            "per_op_intended": a.target.map(|_| intended.iter().enumerate().filter(|(_, h)| !h.is_empty()).map(|(i, h)| {
                (OP_NAMES[i].to_string(), crate::report::latency_json(h, secs))
            }).collect::<serde_json::Map<_, _>>()),
            "value_errors": errors,
            "first_error": first_error,
            "read_misses_of_new_keys": misses,
            "per_node": reports.iter().map(NodeReport::json).collect::<Vec<_>>(),
            // the latency histogram (value in ns, count), so runs of several processes merge
            "histogram_ns": crate::report::hist_json(&hist),
        });
        // (beside the rest: the json! macro's recursion limit)
        doc["insert_start"] = plan.first.into();
        doc["insert_count"] = plan.count.into();
        doc["table"] = a.table.clone().into();
        doc["scan_lengths"] = format!("{:?}", a.scan_length_distribution)
            .to_lowercase()
            .into();
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

/// The summary as YCSB prints it (`[OVERALL], RunTime(ms), ...`, then per operation type),
/// for those who parse YCSB's output: printed when a workload file or property was given.
pub(super) fn ycsb_lines(secs: f64, tput: f64, per_op: &[Histogram<u64>], errors: u64) {
    say!("[OVERALL], RunTime(ms), {:.0}", secs * 1000.0);
    say!("[OVERALL], Throughput(ops/sec), {tput:.2}");
    op_lines("", per_op);
    if errors > 0 {
        say!("[VALUE-ERRORS], Count, {errors}");
    }
}

/// YCSB's lines per operation type, named `[{prefix}READ]` and so on.
fn op_lines(prefix: &str, per_op: &[Histogram<u64>]) {
    let names = ["READ", "UPDATE", "INSERT", "SCAN", "READ-MODIFY-WRITE"];
    for (name, h) in names.iter().zip(per_op).filter(|(_, h)| !h.is_empty()) {
        let name = format!("{prefix}{name}");
        let us = |q: f64| h.value_at_quantile(q) / 1000;
        say!("[{name}], Operations, {}", h.len());
        say!("[{name}], AverageLatency(us), {:.3}", h.mean() / 1000.0);
        say!("[{name}], MinLatency(us), {}", h.min() / 1000);
        say!("[{name}], MaxLatency(us), {}", h.max() / 1000);
        say!("[{name}], 95thPercentileLatency(us), {}", us(0.95));
        say!("[{name}], 99thPercentileLatency(us), {}", us(0.99));
        if prefix.is_empty() {
            say!("[{name}], Return=OK, {}", h.len());
        }
    }
}

/// The request distribution for the summary: `zipfian 0.99`.
pub(super) fn dist_text(d: Dist) -> String {
    match d {
        Dist::Uniform => "uniform".into(),
        Dist::Zipf(t) => format!("zipfian {t}"),
        Dist::Latest(t) => format!("latest {t}"),
        Dist::Hotspot { data, op } => format!("hotspot {op} of requests to {data} of keys"),
        Dist::Sequential => "sequential".into(),
        Dist::Exponential { percentile, frac } => {
            format!("exponential {percentile}% within the newest {frac}")
        }
    }
}

/// The request distribution as JSON: `{"name": "zipfian", "theta": 0.99}`.
pub(super) fn dist_json(d: Dist) -> serde_json::Value {
    match d {
        Dist::Uniform => json!({"name": "uniform"}),
        Dist::Zipf(t) => json!({"name": "zipfian", "theta": t}),
        Dist::Latest(t) => json!({"name": "latest", "theta": t}),
        Dist::Hotspot { data, op } => {
            json!({"name": "hotspot", "data_fraction": data, "op_fraction": op})
        }
        Dist::Sequential => json!({"name": "sequential"}),
        Dist::Exponential { percentile, frac } => {
            json!({"name": "exponential", "percentile": percentile, "frac": frac})
        }
    }
}

/// The cache the node runs with, in bytes.
pub(super) fn cache_bytes(e: &Engine) -> u64 {
    e.frames() as u64 * shoal_engine::PAGE_SIZE as u64
}

pub(super) fn mix_text(m: &Mix) -> String {
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

pub(super) fn delta(a: &StatsSnapshot, b: &StatsSnapshot) -> StatsSnapshot {
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

/// YCSB's fields of a run's records (`null` for values of one field).
pub(super) fn fields_json(plan: &Plan) -> serde_json::Value {
    let l = plan.layout;
    if let Some(d) = l.lengths.drawn() {
        return json!({
            "count": d.count,
            "length": d.max,
            "min_length": d.min,
            "length_distribution": d.name,
            "read_all": true,
            "write_all": true,
        });
    }
    if l.fields() < 2 {
        return serde_json::Value::Null;
    }
    json!({
        "count": l.fields(),
        "length": l.field,
        "read_all": !plan.read_one,
        "write_all": !plan.write_one,
    })
}
