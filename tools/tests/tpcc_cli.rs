//! `shoal tpcc` end to end: a short load and run with `--check` on 1 node, on 2 nodes over mem
//! and on 2 processes over tcp (conditions 1-4 must hold in affinity mode), JSON parsed, and the
//! data directory left behind checked by `shoal inspect`; bad flags rejected clearly.

use std::process::Command;

fn shoal() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shoal"))
}

/// `shoal inspect --json` of a data directory, which must pass.
fn inspect(data: &std::path::Path) -> serde_json::Value {
    let out = shoal()
        .args(["inspect", "--quiet", "--json", "-"])
        .arg(data)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert!(out.status.success(), "shoal inspect: {report}");
    report
}

/// The most a short checked run may take before it counts as hung (killed, and the test
/// fails): load, 2.2 s of run, check and close take a few seconds.
const HUNG: std::time::Duration = std::time::Duration::from_secs(90);

/// Run `cmd` to its end, or kill it after `limit` and fail.
fn output_within(mut cmd: Command, limit: std::time::Duration) -> std::process::Output {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("{cmd:?} did not finish within {limit:?} (killed)");
        }
    }
}

fn run_checked(args: &[&str]) -> serde_json::Value {
    run_checked_for(args, "2", None)
}

/// [`run_checked`] for `secs` seconds, with the per-second CSV written to `csv` if given.
fn run_checked_for(args: &[&str], secs: &str, csv: Option<&std::path::Path>) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let data = dir.path().join("data");
    let mut cmd = shoal();
    cmd.arg("tpcc")
        .args(args)
        .args(["--quiet", "--check", "--warmup", "0.2", "--duration", secs])
        .arg("--json")
        .arg(&json)
        .arg("--data-dir")
        .arg(&data);
    if let Some(csv) = csv {
        cmd.arg("--csv").arg(csv);
    }
    let out = output_within(cmd, HUNG);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "shoal tpcc {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("conditions 1-4 hold"), "{stdout}");
    assert!(stdout.contains("NewOrders/min"), "{stdout}");

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["errors"], 0, "{v}");
    // serializable transactions: no read can see another worker's order half inserted
    assert_eq!(v["anomalies"], 0, "{v}");
    // every transaction was counted under its type; a loaded CI machine may run only a few
    // dozen in 2 s, so only the two types that make 88% of the mix must have run (each type
    // runs deterministically in the unit test `tpcc::txn::tests`)
    let types = [
        "new_order",
        "payment",
        "order_status",
        "delivery",
        "stock_level",
    ];
    let sum: u64 = types
        .iter()
        .map(|t| v["types"][t]["count"].as_u64().unwrap())
        .sum();
    assert_eq!(sum, v["transactions"].as_u64().unwrap(), "{v}");
    for t in ["new_order", "payment"] {
        assert!(v["types"][t]["count"].as_u64().unwrap() > 0, "{t} ran: {v}");
        assert!(v["types"][t]["p50_us"].as_u64().unwrap() > 0, "{t}: {v}");
    }
    assert!(v["new_orders_per_min"].as_f64().unwrap() > 0.0);
    // the stores left behind are clean, every page intact, every tree sound
    let report = inspect(&data);
    let nodes = report["nodes"].as_array().unwrap();
    assert_eq!(nodes.len() as u64, v["nodes"].as_u64().unwrap(), "{report}");
    assert!(nodes.iter().all(|n| n["clean"] == true), "{report}");
    // the item table and one set of the other ten tables per node
    let trees = report["catalog"].as_array().unwrap();
    let sets = v["nodes"].as_u64().unwrap() as usize;
    assert_eq!(trees.len(), 1 + 10 * sets, "{report}");
    assert!(
        trees.iter().all(|t| t["btree"]["entries"].is_u64()),
        "{report}"
    );
    v
}

#[test]
fn one_node_two_warehouses_stays_consistent() {
    let v = run_checked(&["--warehouses", "2", "--workers", "2"]);
    assert_eq!(v["workers"], 2);
    // payments to other warehouses' customers and remote supply items
    assert!(v["remote_warehouse_share"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["remote_node_share"].as_f64().unwrap(), 0.0, "{v}");
}

#[test]
fn two_nodes_over_mem_stay_consistent() {
    let v = run_checked(&["--warehouses", "2", "--nodes", "2", "--cache", "64MiB"]);
    assert_eq!(v["nodes"], 2);
    // with one warehouse per node, every remote warehouse is on the other node
    let (rw, rn) = (
        v["remote_warehouse_share"].as_f64().unwrap(),
        v["remote_node_share"].as_f64().unwrap(),
    );
    assert_eq!(rn, rw, "{v}");
}

/// Uniform mode on 2 nodes: every worker writes the same warehouses' district leaves and
/// the last leaves of their order tables, on both nodes. Commits whose leaves the other node
/// kept taking back once fell to 0 transactions/s for whole seconds, or for good (the run
/// never ended): of six 8 s runs of that build, two hung and three had seconds without a
/// commit. The run must finish, commit in every second, and stay consistent.
#[test]
fn two_nodes_writing_the_same_warehouses_keep_committing() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("seconds.csv");
    let v = run_checked_for(
        &[
            "--warehouses",
            "2",
            "--nodes",
            "2",
            "--mode",
            "uniform",
            "--cache",
            "64MiB",
        ],
        "8",
        Some(&csv),
    );
    assert_eq!(v["nodes"], 2);
    // every whole second of the run committed something (1,100-2,500 a second here)
    let rows = std::fs::read_to_string(&csv).unwrap();
    let mut last = 0.0;
    for row in rows.lines().skip(1) {
        let f: Vec<&str> = row.split(',').collect();
        let (t, rate): (f64, f64) = (f[0].parse().unwrap(), f[2].parse().unwrap());
        if f[1] == "measure" && t - last >= 0.9 {
            assert!(
                rate > 0.0,
                "no transaction committed in the second to {t} s:\n{rows}"
            );
        }
        last = t;
    }
    assert_eq!(v["check"]["violations"], 0, "{v}");
    assert!(v["remote_node_share"].as_f64().unwrap() > 0.0, "{v}");
}

#[test]
fn two_processes_over_tcp_stay_consistent() {
    let v = run_checked(&[
        "--warehouses",
        "2",
        "--nodes",
        "2",
        "--transport",
        "tcp",
        "--cache",
        "256MiB",
    ]);
    assert_eq!(v["transport"], "tcp");
    assert_eq!(v["nodes"], 2, "both processes reported: {v}");
    assert_eq!(v["check"]["violations"], 0, "{v}");
    // one warehouse per process: every remote warehouse is in the other process
    assert_eq!(v["remote_node_share"], v["remote_warehouse_share"], "{v}");
}

#[test]
fn bad_flags_are_refused_with_a_reason() {
    for (args, says) in [
        (
            &["--warehouses", "0"][..],
            "every node needs at least one warehouse",
        ),
        (
            &["--warehouses", "1", "--nodes", "2"][..],
            "every node needs",
        ),
        (
            &["--warehouses", "17", "--nodes", "17"][..],
            "room for the sets of at most 16 nodes",
        ),
        (&["--cluster", "c.toml"][..], "--cluster needs --id"),
        (&["--cache", "1MiB"][..], "at least 4MiB"),
        (&["--duration", "0"][..], "--duration"),
        // (a panic in Duration::from_secs_f64 before)
        (&["--warmup", "1e300"][..], "at most 1e7"),
    ] {
        let out = shoal().arg("tpcc").args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// A device that fills up during the run (a file-size limit, `ulimit -f` in 512-byte blocks,
/// a little above what one warehouse loads) stops the run at the first failed transaction,
/// which writes nothing (a transaction's writes wait for its commit): the consistency check
/// passes and the store closes clean.
#[test]
fn a_full_device_stops_the_run_and_the_failed_transaction_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let data = dir.path().join("data");
    let limit_bytes: u64 = 119 << 20; // one warehouse loads about 115 MiB
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -f {} && exec '{}' tpcc --warehouses 1 --cache 32MiB --quiet --check \
             --warmup 0 --duration 120 --json '{}' --data-dir '{}'",
            limit_bytes / 512,
            env!("CARGO_BIN_EXE_shoal"),
            json.display(),
            data.display()
        ))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("the run stopped there"), "{stdout}");
    assert!(stdout.contains("conditions 1-4 hold"), "{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["errors"], 1, "{v}");
    let first = v["first_error"].as_str().unwrap();
    assert!(
        first.contains("is full") && first.contains("no room"),
        "{v}"
    );
    assert!(
        v["duration_s"].as_f64().unwrap() < 120.0,
        "did not stop: {v}"
    );
    assert_eq!(v["anomalies"], 0, "{v}");
    let report = inspect(&data);
    assert!(
        report["nodes"].as_array().unwrap()[0]["clean"] == true,
        "{report}"
    );
}

/// Issue 28: `shoal tpcc --json -` writes the report alone to standard output, with the run's
/// facts (schema, argv, seed).
#[test]
fn tpcc_json_goes_to_stdout_with_the_run_facts() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args([
            "tpcc",
            "--duration",
            "0.5",
            "--warmup",
            "0",
            "--seed",
            "9",
            "--json",
            "-",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema"], 2);
    assert_eq!(v["run"]["seed"], 9);
    assert!(v["throughput_txn_per_s"].as_f64().unwrap() > 0.0);
    assert!(String::from_utf8_lossy(&out.stderr).contains("txn/s"));
}

/// Issue 28: `--rate` paces the transactions (never above the rate: checked from above
/// only) and `--csv` writes a row per second.
#[test]
fn tpcc_rate_and_csv() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    let json = dir.path().join("t.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args([
            "tpcc",
            "--duration",
            "2",
            "--warmup",
            "1",
            "--rate",
            "400",
            "--quiet",
            "--csv",
        ])
        .arg(&csv)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let tps = v["throughput_txn_per_s"].as_f64().unwrap();
    assert!(tps > 0.0 && tps <= 400.0 * 1.05 + 5.0, "{tps} txn/s");
    assert_eq!(v["rate_txn_per_s"], 400.0);
    // issue 47: one warehouse is "1 warehouse"
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("tpcc: 1 warehouse, 1 node in this report"),
        "{stdout}"
    );
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("time_s,phase,txn_per_s,new_orders_per_min,p50_us,p99_us")
    );
    let rows: Vec<&str> = lines.collect();
    assert!(rows.iter().all(|r| r.split(',').count() == 6), "{text}");
    // issue 47: one row per second of the run (1 s warm-up + 2 s), none before its second
    // ended (no wall-clock upper bound: a busy machine may write a row late)
    assert_eq!(rows.len(), 3, "{text}");
    for (i, r) in rows.iter().enumerate() {
        let t: f64 = r.split(',').next().unwrap().parse().unwrap();
        assert!(t >= (i + 1) as f64, "row {i} at {t} s: {text}");
        let phase = r.split(',').nth(1).unwrap();
        assert_eq!(phase, if i == 0 { "warmup" } else { "measure" }, "{text}");
        // every second ran transactions, the warm-up's too (its row said 0 before)
        let rate: f64 = r.split(',').nth(2).unwrap().parse().unwrap();
        assert!(rate > 0.0, "row {i}: {rate} txn/s: {text}");
        // issue 47: each second's latency (us), p50 <= p99
        let (p50, p99): (u64, u64) = (
            r.split(',').nth(4).unwrap().parse().unwrap(),
            r.split(',').nth(5).unwrap().parse().unwrap(),
        );
        assert!(p50 > 0 && p50 <= p99, "row {i}: {text}");
    }
    // issue 47: shoal plot draws tpcc's CSV (with its latency panel) and JSON (all types, or
    // one)
    for (args, drawn) in [
        (vec![csv.as_os_str()], "p99 latency of the second"),
        (vec![json.as_os_str()], "percentile"),
        (
            vec![json.as_os_str(), "--op".as_ref(), "payment".as_ref()],
            "percentile",
        ),
    ] {
        let svg = dir.path().join("plot.svg");
        let out = shoal()
            .arg("plot")
            .args(&args)
            .arg("-o")
            .arg(&svg)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let svg = std::fs::read_to_string(&svg).unwrap();
        assert!(svg.contains(drawn), "{args:?}: no {drawn:?} in the chart");
    }
}

/// Issue 47: `--weights` picks the mix as BenchBase's `weights` does (here Payments only),
/// and each type's summary has BenchBase's figures: average, min, p50, p95, p99, max, aborts.
#[test]
fn weights_choose_the_mix_and_each_type_reports_its_latencies() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("t.json");
    let out = shoal()
        .args(["tpcc", "--duration", "1", "--warmup", "0", "--weights"])
        .arg("0,100,0,0,0")
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("mix: weights 0,100,0,0,0"), "{text}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["weights"]["payment"], 100, "{v}");
    let types = &v["types"];
    for t in ["new_order", "order_status", "delivery", "stock_level"] {
        assert_eq!(types[t]["count"], 0, "{t}: {v}");
    }
    let p = &types["payment"];
    assert!(p["count"].as_u64().unwrap() > 0, "{v}");
    let f = |k: &str| p[k].as_f64().unwrap();
    assert!(
        f("min_us") <= f("p50_us") && f("p50_us") <= f("p95_us"),
        "{p}"
    );
    assert!(
        f("p95_us") <= f("p99_us") && f("p99_us") <= f("max_us"),
        "{p}"
    );
    assert!(
        f("avg_us") >= f("min_us") && f("avg_us") <= f("max_us"),
        "{p}"
    );
    // a bad mix is refused before anything runs
    let out = shoal()
        .args(["tpcc", "--weights", "45,43,4"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("five weights"));
}

/// Issue 47: TPC-C's terminal times: a worker waits its keying time before each transaction
/// and a think time after it, so it runs at most one transaction per keying time (waits are
/// at least as long as asked, so the bound holds on any machine); the times are reported, and
/// pacing by --rate as well is refused.
#[test]
fn terminals_wait_their_keying_and_think_times() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("t.json");
    let out = shoal()
        .args([
            "tpcc",
            "--duration",
            "2",
            "--warmup",
            "0",
            "--mode",
            "uniform",
        ])
        .args(["--workers", "2", "--keying-ms", "250,250,250,250,250"])
        .args(["--think-ms", "0,0,0,0,0", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("terminals: keying 250,250,250,250,250 ms"),
        "{text}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["keying_ms"][0], 250, "{v}");
    assert_eq!(v["think_ms"][4], 0, "{v}");
    let done = v["transactions"].as_u64().unwrap();
    let workers = v["workers"].as_u64().unwrap();
    let secs = v["duration_s"].as_f64().unwrap();
    let most = workers * ((secs / 0.25) as u64 + 1);
    assert!(
        done >= 1 && done <= most,
        "{done} transactions by {workers} terminals in {secs} s"
    );
    // pacing by --rate as well is refused, and so is a list that is not five times
    let out = shoal()
        .args(["tpcc", "--think", "--rate", "100"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("choose one way"));
    let out = shoal()
        .args(["tpcc", "--keying-ms", "1,2"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("five times"));
}

/// History rows of a database: entries of the `tpcc.history` trees, from `shoal inspect`.
fn history_rows(data: &std::path::Path) -> u64 {
    inspect(data)["catalog"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| {
            t["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("tpcc.history"))
        })
        .map(|t| t["btree"]["entries"].as_u64().unwrap())
        .sum()
}

/// Issue 47: `shoal tpcc load` then `run` several times on the kept database, as BenchBase's
/// --load then --execute: each run keeps conditions 1-4 and adds history rows of its own
/// (never over an earlier run's), a run that asks for another shape is refused, and a run
/// without a database says to load one.
#[test]
fn load_once_then_run_many_times_on_the_kept_database() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    let json = dir.path().join("run.json");
    let tpcc = |args: &[&str]| {
        let out = output_within(
            {
                let mut c = shoal();
                c.arg("tpcc").args(args).arg("--data-dir").arg(&data);
                c
            },
            HUNG,
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    let (code, text) = tpcc(&["load", "--warehouses", "2"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("loaded 2 warehouses"), "{text}");
    let mut rows = history_rows(&data);
    for run in 1..=2 {
        let (code, text) = tpcc(&[
            "run",
            "--duration",
            "1",
            "--warmup",
            "0",
            "--mode",
            "uniform",
            "--check",
            "--json",
            json.to_str().unwrap(),
        ]);
        assert_eq!(code, Some(0), "run {run}: {text}");
        assert!(
            text.contains(&format!("({} runs before this one)", run - 1)),
            "{text}"
        );
        assert!(
            text.contains("conditions 1-4 hold on all 2 warehouses"),
            "{text}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let payments = v["types"]["payment"]["count"].as_u64().unwrap();
        assert!(payments > 0, "{v}");
        let now = history_rows(&data);
        assert!(
            now >= rows + payments,
            "run {run}: {rows} rows before, {now} after {payments} payments"
        );
        rows = now;
    }
    let (code, text) = tpcc(&["run", "--warehouses", "3"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("loaded with --warehouses 2"), "{text}");
    let (code, text) = shoal()
        .args(["tpcc", "run", "--data-dir"])
        .arg(dir.path().join("none"))
        .output()
        .map(|o| {
            (
                o.status.code(),
                String::from_utf8_lossy(&o.stderr).to_string(),
            )
        })
        .unwrap();
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("load one first"), "{text}");
}
