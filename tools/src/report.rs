//! What every driver's results share: latency histograms and their JSON form (mergeable across
//! processes), the facts that say how to reproduce a run (version, commit, command line, seed,
//! time, host), and where the JSON goes (`--json FILE`, or `--json -` for standard output).

use hdrhistogram::Histogram;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Version of the JSON reports' layout. 2: `schema`, `run` facts, `per_op` histograms.
pub const SCHEMA: u32 = 2;

/// A latency histogram in nanoseconds (1 ns to 1 hour, 3 significant digits).
pub fn hist() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
}

/// A histogram as `[[value_ns, count], ...]`: runs of several processes merge these.
pub fn hist_json(h: &Histogram<u64>) -> Value {
    json!(h
        .iter_recorded()
        .map(|v| [v.value_iterated_to(), v.count_at_value()])
        .collect::<Vec<_>>())
}

/// Add a histogram in the form of [`hist_json`] to `h`.
pub fn add_hist_json(h: &mut Histogram<u64>, v: &Value) -> anyhow::Result<()> {
    let bad = || anyhow::anyhow!("not a histogram: {v}");
    for pair in v.as_array().ok_or_else(bad)? {
        let (Some(value), Some(count)) = (pair[0].as_u64(), pair[1].as_u64()) else {
            return Err(bad());
        };
        h.record_n(value.max(1), count)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(())
}

/// Operations, rate and latency percentiles (microseconds) of a histogram over `secs`.
pub fn latency_json(h: &Histogram<u64>, secs: f64) -> Value {
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    json!({
        "ops": h.len(),
        "ops_per_s": h.len() as f64 / secs.max(1e-9),
        "p50_us": us(0.5),
        "p99_us": us(0.99),
        "p999_us": us(0.999),
        "max_us": h.max() as f64 / 1000.0,
    })
}

/// One summary line for a histogram: `p50 .. p99 .. p99.9 .. max ..` in microseconds.
pub fn latency_text(h: &Histogram<u64>) -> String {
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    format!(
        "p50 {:.1} us  p99 {:.1} us  p99.9 {:.1} us  max {:.1} us",
        us(0.5),
        us(0.99),
        us(0.999),
        h.max() as f64 / 1000.0
    )
}

/// A seed from the operating system's random source (for runs not given `--seed`).
pub fn fresh_seed() -> u64 {
    use rand::{RngCore, SeedableRng};
    rand::rngs::StdRng::try_from_os_rng()
        .map(|mut r| r.next_u64())
        .unwrap_or_else(|_| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

/// How to reproduce the run: the build, the exact command line, the seed, when and where.
pub fn run_facts(seed: u64, started: std::time::SystemTime) -> Value {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let memory = read("/proc/meminfo").and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    json!({
        "shoal_version": env!("CARGO_PKG_VERSION"),
        "git_commit": option_env!("SHOAL_GIT_COMMIT").unwrap_or("unknown"),
        "argv": std::env::args().collect::<Vec<_>>(),
        "seed": seed,
        "started_utc": utc_text(started),
        "host": {
            "hostname": read("/proc/sys/kernel/hostname"),
            "kernel": read("/proc/sys/kernel/osrelease"),
            "cpus": std::thread::available_parallelism().map(|n| n.get()).ok(),
            "memory_bytes": memory,
        },
    })
}

/// `t` as RFC 3339 in UTC, to the second (`2026-11-25T03:11:52Z`).
pub fn utc_text(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // civil date from days since 1970-01-01 (H. Hinnant's algorithm)
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Human-readable output goes to standard error (the JSON report takes standard output).
static HUMAN_TO_STDERR: AtomicBool = AtomicBool::new(false);

/// With `--json -` the report is written to standard output: send the per-second lines and
/// the summary to standard error from now on.
pub fn json_takes_stdout(json: Option<&Path>) {
    if json == Some(Path::new("-")) {
        HUMAN_TO_STDERR.store(true, Ordering::Relaxed);
    }
}

/// Whether `say!` writes to standard error.
pub fn human_to_stderr() -> bool {
    HUMAN_TO_STDERR.load(Ordering::Relaxed)
}

/// Write a JSON report to `path` (`-`: standard output).
pub fn write_json(path: &Path, doc: &Value) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(doc).expect("a report serialises") + "\n";
    if path == Path::new("-") {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|e| anyhow::anyhow!("--json -: writing to standard output: {e}"))
    } else {
        std::fs::write(path, text).map_err(|e| anyhow::anyhow!("--json {}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn utc_text_matches_known_dates() {
        assert_eq!(utc_text(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400); // leap day
        assert_eq!(utc_text(t), "2000-02-29T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_795_576_312);
        assert_eq!(utc_text(t), "2026-11-25T03:11:52Z");
    }

    #[test]
    fn histograms_round_trip_through_json() {
        let mut h = hist();
        for v in [1_000u64, 2_000, 2_000, 1_000_000] {
            h.record(v).unwrap();
        }
        let mut back = hist();
        add_hist_json(&mut back, &hist_json(&h)).unwrap();
        assert_eq!(back.len(), 4);
        assert_eq!(back.max(), h.max());
        assert!(add_hist_json(&mut back, &json!([[1]])).is_err());
    }
}
