//! Ctrl-C, SIGTERM and a closed standard output stop `shoal` commands cleanly: the workers stop,
//! what was measured is reported, the store is closed clean with every record (checked with
//! `shoal inspect`); a second signal exits at once. Real processes and real signals; every wait
//! is bounded.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);

fn shoal() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shoal"))
}

/// A running `shoal` whose output goes to a file; killed if the test ends first.
struct Running {
    child: Child,
    out: std::path::PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    fn start(args: &[&str], out: &Path) -> Running {
        let f = std::fs::File::create(out).unwrap();
        let child = shoal()
            .args(args)
            .stdout(Stdio::from(f.try_clone().unwrap()))
            .stderr(Stdio::from(f))
            .spawn()
            .unwrap();
        Running {
            child,
            out: out.to_path_buf(),
        }
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Wait until the output shows `what` (bounded).
    fn wait_for(&mut self, what: &str) {
        let t0 = Instant::now();
        while !self.text().contains(what) {
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!("ended ({st}) before {what:?}:\n{}", self.text());
            }
            assert!(
                t0.elapsed() < LIMIT,
                "no {what:?} in {LIMIT:?}:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child, not reaped yet (so its pid is not reused).
        let r = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(r, 0);
    }

    /// Wait for the exit (bounded): the exit code and the output.
    fn finish(&mut self) -> (Option<i32>, String) {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return (st.code(), self.text());
            }
            assert!(t0.elapsed() < LIMIT, "did not exit:\n{}", self.text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn inspect(dir: &Path) -> Output {
    shoal().arg("inspect").arg(dir).output().unwrap()
}

/// The store in `dir` is clean and intact and its YCSB table holds `records` entries.
fn clean_with(dir: &Path, records: &str) {
    let out = inspect(dir);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(", clean"),
        "the store is marked clean: {text}"
    );
    assert!(text.contains("0 corrupt"), "{text}");
    assert!(
        text.contains(&format!(
            "usertable                B-tree: {records} entries"
        )),
        "every record is there: {text}"
    );
}

/// Ctrl-C in the measured phase: the run stops within seconds, reports what it measured
/// (flagged as stopped), exits with 130, and the store is clean with every record. Checked on
/// purpose: with the handler not installed the process dies on the signal (no exit code) and
/// the store is unclean.
#[test]
fn ctrl_c_mid_run_reports_what_was_measured_and_closes_the_store_clean() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, json) = (tmp.path().join("data"), tmp.path().join("r.json"));
    let mut r = Running::start(
        &[
            "ycsb",
            "--records",
            "20000",
            "--warmup",
            "0.5",
            "--duration",
            "600",
            "--data-dir",
            dir.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ],
        &tmp.path().join("out"),
    );
    r.wait_for("[   2s]");
    r.signal(libc::SIGINT);
    let (code, text) = r.finish();
    assert_eq!(code, Some(130), "{text}");
    assert!(
        text.contains("stopped by a signal") && text.contains("throughput"),
        "{text}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["stopped_by_signal"], true, "{v}");
    assert!(v["ops"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["value_errors"], 0, "{v}");
    clean_with(&dir, "20000");
}

/// SIGTERM during the load: the load stops, the store is closed clean with the records loaded
/// so far (a B-tree that inspects intact), exit status 130.
#[test]
fn sigterm_during_the_load_keeps_what_was_loaded_and_closes_clean() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut r = Running::start(
        &[
            "ycsb",
            "--records",
            "50000000",
            "--data-dir",
            dir.to_str().unwrap(),
        ],
        &tmp.path().join("out"),
    );
    r.wait_for("shoal ycsb:");
    std::thread::sleep(Duration::from_millis(1500));
    r.signal(libc::SIGTERM);
    let (code, text) = r.finish();
    assert_eq!(code, Some(130), "{text}");
    let loaded: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("load: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a load line: {text}"));
    assert!(loaded > 0 && loaded < 50_000_000, "{text}");
    assert!(text.contains("of 50000000: stopped by a signal"), "{text}");
    clean_with(&dir, &loaded.to_string());
}

/// A second signal exits at once with status 3 (the store is not closed: unclean, as after a
/// crash). The node waits to join a 2-node cluster whose other node never comes, so the first
/// signal cannot finish the command before the second arrives.
#[test]
fn a_second_signal_exits_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let addrs = shoal_messaging::free_loopback_addrs(2).unwrap();
    let mut file = String::from("cache = \"1MiB\"\nconnect_timeout_ms = 100000\n");
    for (i, a) in addrs.iter().enumerate() {
        file += &format!("[[node]]\nid = {i}\naddress = \"{a}\"\ndata_dir = \"node{i}\"\n");
    }
    let cfg = tmp.path().join("cluster.toml");
    std::fs::write(&cfg, file).unwrap();
    let mut r = Running::start(
        &["node", "--config", cfg.to_str().unwrap(), "--id", "0"],
        &tmp.path().join("out"),
    );
    r.wait_for("joining a cluster of 2 nodes");
    r.signal(libc::SIGINT);
    r.wait_for("send the signal again to exit at once");
    r.signal(libc::SIGINT);
    let (code, text) = r.finish();
    assert_eq!(code, Some(3), "{text}");
}

/// `shoal ycsb | head -1`: the closed pipe stops the run like Ctrl-C (no panic), and the store
/// is closed clean. Checked on purpose: with `println!` (which panics on a closed stdout) the
/// run died with "failed printing to stdout" and status 101.
#[test]
fn a_closed_stdout_stops_the_run_without_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut child = shoal()
        .args([
            "ycsb",
            "--records",
            "20000",
            "--duration",
            "600",
            "--data-dir",
        ])
        .arg(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("shoal ycsb:"), "{first}");
    // the reader is dropped: the pipe is closed
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > LIMIT {
            let _ = child.kill();
            panic!("did not stop after its stdout closed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(st.code(), Some(130), "{err}");
    clean_with(&dir, "20000");
}

/// Output paths are checked before the load, and a data directory held by a running `shoal`
/// is named as in use (not as "not empty").
#[test]
fn bad_output_paths_and_busy_data_directories_are_refused_up_front() {
    let t0 = Instant::now();
    let out = shoal()
        .args([
            "ycsb",
            "--records",
            "2000000",
            "--json",
            "/nonexistent/dir/x.json",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--json /nonexistent/dir/x.json"), "{err}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("load:"),
        "refused before loading"
    );
    assert!(t0.elapsed() < LIMIT);

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut r = Running::start(
        &[
            "ycsb",
            "--records",
            "20000",
            "--duration",
            "600",
            "--data-dir",
            dir.to_str().unwrap(),
        ],
        &tmp.path().join("out"),
    );
    r.wait_for("[   3s]");
    let out = shoal()
        .args(["ycsb", "--data-dir", dir.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("in use by another running process"), "{err}");
    r.signal(libc::SIGINT);
    let (code, text) = r.finish();
    assert_eq!(code, Some(130), "{text}");
    clean_with(&dir, "20000");
}

/// `shoal ycsb --transport tcp`: a SIGTERM to the launcher alone is passed on to its node
/// processes (their own process group), each stops and closes clean, and the launcher merges
/// what they measured.
#[test]
fn a_signal_to_the_tcp_launcher_stops_every_node_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut r = Running::start(
        &[
            "ycsb",
            "--nodes",
            "2",
            "--transport",
            "tcp",
            "--records",
            "20000",
            "--cache",
            "16MiB",
            "--duration",
            "600",
            "--data-dir",
            dir.to_str().unwrap(),
        ],
        &tmp.path().join("out"),
    );
    // (the second second, still in the default 2-s warm-up: "[   2s warm]")
    r.wait_for("[   2s");
    r.signal(libc::SIGTERM);
    let (code, text) = r.finish();
    assert_eq!(code, Some(130), "{text}");
    assert!(text.contains("throughput"), "merged report: {text}");
    for i in 0..2 {
        let log = std::fs::read_to_string(dir.join(format!("node{i}.log"))).unwrap();
        assert!(
            log.contains("shoal: stopping"),
            "node {i} got the signal: {log}"
        );
    }
    let out = inspect(&dir);
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{t}");
    assert_eq!(t.matches(", clean").count(), 2, "both stores clean: {t}");
    assert!(t.contains("B-tree: 20000 entries"), "{t}");
}

/// `shoal tpcc --check`: Ctrl-C in the measured phase stops the transactions (each one either
/// done or undone), the consistency check still runs and passes, the report says the run was
/// stopped, exit 130, the store is clean.
#[test]
fn ctrl_c_stops_tpcc_with_a_consistent_database() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut r = Running::start(
        &[
            "tpcc",
            "--warehouses",
            "1",
            "--check",
            "--warmup",
            "0.5",
            "--duration",
            "600",
            "--data-dir",
            dir.to_str().unwrap(),
        ],
        &tmp.path().join("out"),
    );
    r.wait_for("NewOrders/min");
    r.wait_for("NewOrders/min\n");
    std::thread::sleep(Duration::from_millis(1500));
    r.signal(libc::SIGINT);
    let (code, text) = r.finish();
    assert_eq!(code, Some(130), "{text}");
    assert!(text.contains("stopped by a signal"), "{text}");
    assert!(
        text.contains("check: consistency conditions 1-4 hold"),
        "{text}"
    );
    let out = inspect(&dir);
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && t.contains(", clean"), "{t}");
}
