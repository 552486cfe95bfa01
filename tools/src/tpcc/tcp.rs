//! `shoal tpcc --transport tcp --nodes N`: one local process per node over loopback
//! (`crate::cli::run_processes`), each started as `shoal tpcc --cluster FILE --id i` with the
//! same flags; their JSON reports (histograms included) are merged into one summary.

use super::{report, txn, Args, Mode, RunOut, Tally};
use serde_json::Value;
use std::path::Path;
use std::process::ExitCode;

fn node_args(a: &Args, file: &Path, id: usize, json: &Path) -> Vec<String> {
    let mode = match a.mode {
        Mode::Affinity => "affinity",
        Mode::Locality => "locality",
        Mode::Uniform => "uniform",
    };
    let mut v: Vec<String> = [
        "tpcc",
        "--cluster",
        &file.display().to_string(),
        "--id",
        &id.to_string(),
        "--json",
        &json.display().to_string(),
        "--warehouses",
        &a.warehouses.to_string(),
        "--workers",
        &a.workers.to_string(),
        "--mode",
        mode,
        "--warmup",
        &a.warmup.to_string(),
        "--duration",
        &a.duration.to_string(),
        "--seed",
        &a.seed.to_string(),
    ]
    .map(String::from)
    .to_vec();
    for (k, x) in [
        ("--durability", a.durability.to_string()),
        ("--wal-size", a.wal_size.to_string()),
        ("--pipeline", a.pipeline.to_string()),
        ("--weights", a.weights.map(|w| w.to_string()).join(",")),
    ] {
        v.push(k.into());
        v.push(x);
    }
    if a.check {
        v.push("--check".into());
    }
    if let Some(r) = a.rate {
        // each node its share of the rate
        v.push("--rate".into());
        v.push((r / a.net.nodes as f64).to_string());
    }
    if id != 0 || a.quiet {
        v.push("--quiet".into());
    }
    v
}

/// A node's tally back from its report.
fn tally_of(d: &Value) -> anyhow::Result<Tally> {
    let bad = || anyhow::anyhow!("a node wrote an unreadable report: {d}");
    let u = |k: &str| d[k].as_u64().ok_or_else(bad);
    let mut t = Tally::new();
    for (i, name) in txn::TYPES.iter().enumerate() {
        t.count[i] = d["types"][name]["count"].as_u64().ok_or_else(bad)?;
        t.aborts[i] = d["types"][name]["aborts"].as_u64().ok_or_else(bad)?;
        crate::report::add_hist_json(&mut t.hist[i], &d["histograms_us"][name])
            .map_err(|e| anyhow::anyhow!("a node wrote an unreadable report: {e}"))?;
    }
    t.rollbacks = u("rollbacks")?;
    t.remote_warehouse = u("remote_warehouse_txns")?;
    t.remote_node = u("remote_node_txns")?;
    t.anomalies = u("anomalies")?;
    t.errors = u("errors")?;
    t.first_error = d["first_error"].as_str().map(String::from);
    Ok(t)
}

/// Run the cluster of local processes and report.
pub fn run_local(a: &Args) -> anyhow::Result<ExitCode> {
    let (dir, _tmp) = crate::cli::data_dir(a.data_dir.as_deref(), "tpcc")?;
    let (docs, all_ok) = crate::cli::run_processes(
        a.net.nodes,
        &dir,
        &a.cache,
        a.quiet,
        a.net.encrypt,
        |i, f, j| node_args(a, f, i, j),
    )?;
    let mut out = RunOut {
        tally: Tally::new(),
        secs: 0.0,
        threads: 0,
        per_node: Vec::new(),
        log: Default::default(),
    };
    let (mut pages, mut load_s) = (0u64, 0f64);
    for d in &docs {
        out.tally.merge(&tally_of(d)?);
        out.secs = out.secs.max(d["duration_s"].as_f64().unwrap_or(0.0));
        out.threads += d["workers"].as_u64().unwrap_or(0) as usize;
        pages += d["data_bytes"].as_u64().unwrap_or(0) / 4096;
        load_s = load_s.max(d["load_s"].as_f64().unwrap_or(0.0));
        for n in d["per_node"].as_array().into_iter().flatten() {
            let g = |k: &str| n[k].as_u64().unwrap_or(0);
            let id = n["node"].as_u64().unwrap_or(0) as u8;
            out.per_node.push((
                id,
                [
                    g("remote_fetches"),
                    g("nvme_reads"),
                    g("nvme_writes"),
                    g("nvme_reads_avoided"),
                    g("pages_served_for_others"),
                    g("pages_given_away"),
                    g("pages_taken_in"),
                ],
            ));
        }
    }
    say!(
        "cluster of {} processes over tcp{}:",
        docs.len(),
        if a.net.encrypt { " (encrypted)" } else { "" }
    );
    // node 0 ran the check; its list of violations is the cluster's
    let check: Option<Vec<String>> = docs[0]["check"]["first"].as_array().map(|v| {
        v.iter()
            .filter_map(|s| s.as_str().map(String::from))
            .collect()
    });
    let mut doc = report(a, &out, pages, load_s, check.as_deref())?;
    doc["transport"] = "tcp".into();
    doc["encrypted"] = a.net.encrypt.into();
    if let Some(n) = docs[0]["check"]["violations"].as_u64() {
        doc["check"]["violations"] = n.into();
    }
    super::write_json(a, &doc)?;
    Ok(if all_ok {
        super::exit_code(&doc)
    } else {
        ExitCode::from(1)
    })
}
