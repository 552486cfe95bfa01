//! `shoal ycsb --transport tcp --nodes N`: one local process per node over loopback. This
//! process writes a cluster file, starts N copies of itself as `shoal ycsb --cluster FILE --id
//! i` with the same workload flags, waits for them, and merges their JSON reports (latency
//! histograms included) into one summary. Node 0's per-second lines are shown; every node's
//! output is kept in `<data dir>/node<i>.log`.

use super::{Access, Args, Distribution, KeyNames, Plan};
use serde_json::{json, Value};
use std::path::Path;
use std::process::ExitCode;

/// The flags a node process gets: the workload's, not the launcher's.
fn node_args(a: &Args, plan: &Plan, file: &Path, id: usize, json: &Path) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "ycsb".into(),
        "--cluster".into(),
        file.display().to_string(),
        "--id".into(),
        id.to_string(),
        "--json".into(),
        json.display().to_string(),
    ];
    let mut f = |k: &str, val: String| {
        v.push(k.into());
        v.push(val);
    };
    f("--workers", a.workers.clone());
    f("--records", a.records.to_string());
    f("--value-size", a.value_size.to_string());
    f("--insert-start", plan.first.to_string());
    f("--insert-count", plan.count.to_string());
    if plan.layout.fields() > 1 {
        f("--field-length", plan.layout.field.to_string());
    }
    if let Some(d) = plan.layout.lengths.drawn() {
        f("--field-length", d.max.to_string());
        f("--field-length-distribution", d.name.into());
        f("--min-field-length", d.min.to_string());
    }
    let keys = match plan.names.names {
        KeyNames::Integer => "integer",
        KeyNames::Hashed => "hashed",
        KeyNames::Ordered => "ordered",
    };
    f("--keys", keys.into());
    f("--zero-padding", plan.names.zero_padding.to_string());
    f("--workload", a.workload.clone());
    if let Some(r) = a.read_ratio {
        f("--read-ratio", r.to_string());
    }
    if let Some(d) = a.distribution {
        let d = match d {
            Distribution::Uniform => "uniform",
            Distribution::Zipf => "zipf",
            Distribution::Latest => "latest",
            Distribution::Hotspot => "hotspot",
            Distribution::Sequential => "sequential",
            Distribution::Exponential => "exponential",
        };
        f("--distribution", d.into());
    }
    f("--zipf-theta", a.zipf_theta.to_string());
    f(
        "--hotspot-data-fraction",
        a.hotspot_data_fraction.to_string(),
    );
    f("--hotspot-op-fraction", a.hotspot_op_fraction.to_string());
    f(
        "--exponential-percentile",
        a.exponential_percentile.to_string(),
    );
    f("--exponential-frac", a.exponential_frac.to_string());
    let access = match a.access {
        Access::Random => "random",
        Access::Partitioned => "partitioned",
    };
    f("--access", access.into());
    f("--devices", a.devices.to_string());
    f("--warmup", a.warmup.to_string());
    f("--duration", a.duration.to_string());
    f("--max-scan", a.max_scan.to_string());
    let scan = match a.scan_length_distribution {
        super::ScanLengths::Uniform => "uniform",
        super::ScanLengths::Zipfian => "zipfian",
    };
    f("--scan-length-distribution", scan.into());
    f("--table", a.table.clone());
    f("--status-interval", a.status_interval.to_string());
    f("--seed", plan.seed.to_string());
    f("--durability", a.durability.to_string());
    f("--wal-size", a.wal_size.to_string());
    f("--pipeline", a.pipeline.to_string());
    // the workload's properties (the mix), and each node's share of the rate and operations
    for file in &a.property_files {
        f("-P", file.display().to_string());
    }
    for p in &a.properties {
        f("-p", p.clone());
    }
    let nodes = a.net.nodes as u64;
    if let Some(t) = a.target {
        f("--target", (t / nodes as f64).to_string());
    }
    if let Some(o) = a.operations {
        f(
            "--operations",
            (o / nodes + u64::from((id as u64) < o % nodes)).to_string(),
        );
    }
    if id != 0 || a.quiet {
        v.push("--quiet".into());
    }
    v
}

/// Run the cluster of local processes and report.
pub fn run_local(a: &Args, plan: &Plan) -> anyhow::Result<ExitCode> {
    let (dir, _tmp) = crate::cli::data_dir(a.data_dir.as_deref(), "ycsb")?;
    let (docs, all_ok) = crate::cli::run_processes(
        a.net.nodes,
        &dir,
        &a.cache,
        a.quiet,
        a.net.encrypt,
        |i, file, json| node_args(a, plan, file, i, json),
    )?;
    let mut merged = merge(&docs)?;
    merged["encrypted"] = a.net.encrypt.into();
    // the launcher's command line, not node 0's
    merged["run"] = crate::report::run_facts(plan.seed, plan.started);
    print_summary(&merged);
    if let Some(path) = &a.json {
        crate::report::write_json(path, &merged)?;
    }
    let errors = merged["value_errors"].as_u64().unwrap_or(0);
    Ok(if errors > 0 || !all_ok {
        eprintln!("error: {errors} values failed their check");
        ExitCode::from(1)
    } else if crate::stop::requested() {
        ExitCode::from(crate::stop::STOPPED_EXIT)
    } else {
        ExitCode::SUCCESS
    })
}

/// One report for the whole cluster from the nodes' reports.
fn merge(docs: &[Value]) -> anyhow::Result<Value> {
    let mut hist = crate::report::hist();
    let mut per_op: std::collections::BTreeMap<String, hdrhistogram::Histogram<u64>> =
        Default::default();
    let (mut ops, mut tput, mut errors, mut misses, mut dur) = (0u64, 0f64, 0u64, 0u64, 0f64);
    let mut by_type = serde_json::Map::new();
    let mut per_node = Vec::new();
    // each node's configuration, from its own report
    let (mut caches, mut workers) = (Vec::new(), Vec::new());
    let mut first_error = Value::Null;
    for d in docs {
        let bad = || anyhow::anyhow!("a node wrote an unreadable report: {d}");
        ops += d["ops"].as_u64().ok_or_else(bad)?;
        tput += d["throughput_ops_per_s"].as_f64().ok_or_else(bad)?;
        errors += d["value_errors"].as_u64().ok_or_else(bad)?;
        misses += d["read_misses_of_new_keys"].as_u64().unwrap_or(0);
        dur = dur.max(d["duration_s"].as_f64().ok_or_else(bad)?);
        if first_error.is_null() {
            first_error = d["first_error"].clone();
        }
        for (k, v) in d["ops_by_type"].as_object().ok_or_else(bad)? {
            let n = by_type.get(k).and_then(Value::as_u64).unwrap_or(0) + v.as_u64().unwrap_or(0);
            by_type.insert(k.clone(), json!(n));
        }
        per_node.extend(d["per_node"].as_array().ok_or_else(bad)?.iter().cloned());
        caches.push(d["cache_bytes_per_node"].clone());
        workers.push(d["workers_per_node"].clone());
        crate::report::add_hist_json(&mut hist, &d["histogram_ns"])?;
        for (op, v) in d["per_op"].as_object().ok_or_else(bad)? {
            let h = per_op.entry(op.clone()).or_insert_with(crate::report::hist);
            crate::report::add_hist_json(h, &v["histogram_ns"])?;
        }
    }
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    let mut out = docs[0].clone();
    let o = out.as_object_mut().expect("a report is an object");
    o.remove("histogram_ns");
    for (k, v) in [
        ("transport", json!("tcp")),
        ("processes", json!(docs.len())),
        ("ops", json!(ops)),
        ("duration_s", json!(dur)),
        ("throughput_ops_per_s", json!(tput)),
        ("p50_us", json!(us(0.5))),
        ("p99_us", json!(us(0.99))),
        ("p999_us", json!(us(0.999))),
        ("max_us", json!(hist.max() as f64 / 1000.0)),
        ("ops_by_type", Value::Object(by_type)),
        (
            "per_op",
            Value::Object(
                per_op
                    .iter()
                    .map(|(op, h)| {
                        let mut v = crate::report::latency_json(h, dur);
                        v["histogram_ns"] = crate::report::hist_json(h);
                        (op.clone(), v)
                    })
                    .collect(),
            ),
        ),
        ("value_errors", json!(errors)),
        ("first_error", first_error),
        ("read_misses_of_new_keys", json!(misses)),
        ("per_node", Value::Array(per_node)),
        ("cache_bytes_of_nodes", Value::Array(caches)),
        ("workers_of_nodes", Value::Array(workers)),
    ] {
        o.insert(k.into(), v);
    }
    Ok(out)
}

fn print_summary(m: &Value) {
    let f = |k: &str| m[k].as_f64().unwrap_or(0.0);
    say!(
        "cluster of {} processes over tcp{}: {:.1} s measured",
        m["processes"],
        if m["encrypted"] == true {
            " (encrypted)"
        } else {
            ""
        },
        f("duration_s")
    );
    say!(
        "  throughput    {:.0} ops/s ({} ops)",
        f("throughput_ops_per_s"),
        m["ops"]
    );
    say!(
        "  latency       p50 {:.1} us  p99 {:.1} us  p99.9 {:.1} us  max {:.1} us",
        f("p50_us"),
        f("p99_us"),
        f("p999_us"),
        f("max_us")
    );
    for (op, v) in m["per_op"].as_object().into_iter().flatten() {
        let g = |k: &str| v[k].as_f64().unwrap_or(0.0);
        say!(
            "  {:<13} {:>9.0} ops/s  p50 {:.1} us  p99 {:.1} us  p99.9 {:.1} us  max {:.1} us",
            op,
            g("ops_per_s"),
            g("p50_us"),
            g("p99_us"),
            g("p999_us"),
            g("max_us")
        );
    }
    let secs = f("duration_s").max(1e-9);
    for n in m["per_node"].as_array().into_iter().flatten() {
        let g = |k: &str| n[k].as_f64().unwrap_or(0.0);
        say!(
            "  node {:<8} {:.0} ops/s  page hit ratio {:.2}%  remote fetches {:.0}/s  nvme reads {:.0}/s  writes {:.0}/s",
            n["node"],
            g("throughput_ops_per_s"),
            g("hit_ratio") * 100.0,
            g("remote_fetches") / secs,
            g("nvme_reads") / secs,
            g("nvme_writes") / secs
        );
        say!(
            "  one pool {:<4} nvme reads avoided {:.0}/s (served by a copy elsewhere)  pages served for others {:.0}/s  given away {:.0}/s  taken in {:.0}/s",
            n["node"],
            g("nvme_reads_avoided") / secs,
            g("pages_served_for_others") / secs,
            g("pages_given_away") / secs,
            g("pages_taken_in") / secs
        );
    }
    say!("  value errors  {}", m["value_errors"]);
}
