//! The per-second series of `--csv` (a row per second) and `--hdr` (an HdrHistogram interval
//! log per operation type).

use super::*;

/// Take (and reset) every worker's histograms of the last second, merged per operation type.
pub(super) fn take_intervals(
    intervals: &[std::sync::Mutex<Vec<Histogram<u64>>>],
) -> Vec<Histogram<u64>> {
    let mut all: Vec<Histogram<u64>> = (0..5).map(|_| crate::report::hist()).collect();
    for m in intervals {
        if let Ok(mut h) = m.lock() {
            for (a, w) in all.iter_mut().zip(h.iter_mut()) {
                a.add(&*w).expect("same bounds");
                w.reset();
            }
        }
    }
    all
}

/// The per-second series of `--csv` and `--hdr`.
pub(super) struct Series {
    pub(super) csv: Option<(std::io::BufWriter<std::fs::File>, PathBuf)>,
    pub(super) hdr: Option<(Vec<u8>, PathBuf)>,
    pub(super) serializer: hdrhistogram::serialization::V2DeflateSerializer,
    /// Node counters at the last second.
    pub(super) last: Option<(Instant, Vec<Snap>)>,
    pub(super) started: std::time::SystemTime,
}

impl Series {
    pub(super) fn create(a: &Args, nodes: usize) -> anyhow::Result<Option<Series>> {
        if a.csv.is_none() && a.hdr.is_none() {
            return Ok(None);
        }
        let csv = match &a.csv {
            Some(p) => {
                use std::io::Write as _;
                let f = std::fs::File::create(p)
                    .map_err(|e| anyhow::anyhow!("--csv {}: {e}", p.display()))?;
                let mut w = std::io::BufWriter::new(f);
                let mut head = vec!["time_s".to_string(), "phase".into(), "ops_per_s".into()];
                head.extend(OP_NAMES.iter().map(|o| format!("{o}_ops_per_s")));
                head.extend(
                    [
                        "p50_us",
                        "p99_us",
                        "p999_us",
                        "max_us",
                        "hit_ratio",
                        "remote_per_s",
                    ]
                    .map(String::from),
                );
                head.extend(["nvme_reads_per_s", "nvme_writes_per_s"].map(String::from));
                for n in 0..nodes {
                    for c in [
                        "hit_ratio",
                        "remote_per_s",
                        "nvme_reads_per_s",
                        "nvme_writes_per_s",
                    ] {
                        head.push(format!("node{n}_{c}"));
                    }
                }
                writeln!(w, "{}", head.join(","))
                    .map_err(|e| anyhow::anyhow!("--csv {}: {e}", p.display()))?;
                Some((w, p.clone()))
            }
            None => None,
        };
        Ok(Some(Series {
            csv,
            hdr: a.hdr.clone().map(|p| (Vec::new(), p)),
            serializer: hdrhistogram::serialization::V2DeflateSerializer::new(),
            last: None,
            started: std::time::SystemTime::now(),
        }))
    }

    /// One second's row and interval histograms (the first call only takes the counters).
    pub(super) fn second(
        &mut self,
        start: Instant,
        per_op: &[Histogram<u64>],
        now_snaps: &[Snap],
        warm: bool,
    ) -> anyhow::Result<()> {
        use std::io::Write as _;
        let now = Instant::now();
        let Some((then, last)) = self.last.replace((now, now_snaps.to_vec())) else {
            return Ok(());
        };
        let dt = now.duration_since(then).as_secs_f64().max(1e-9);
        let mut all = crate::report::hist();
        for h in per_op {
            all.add(h).expect("same bounds");
        }
        if let Some((w, p)) = &mut self.csv {
            let us = |q: f64| all.value_at_quantile(q) as f64 / 1000.0;
            let mut row = vec![
                format!("{:.3}", now.duration_since(start).as_secs_f64()),
                if warm { "warmup" } else { "measure" }.to_string(),
                format!("{:.1}", all.len() as f64 / dt),
            ];
            row.extend(per_op.iter().map(|h| format!("{:.1}", h.len() as f64 / dt)));
            row.extend(
                [us(0.5), us(0.99), us(0.999), all.max() as f64 / 1000.0]
                    .map(|v| format!("{v:.1}")),
            );
            let node_figures = |b: &Snap, a: &Snap| {
                let d = delta(&b.0, &a.0);
                let remote = a.1 - b.1;
                let hit = hit_ratio(&d, remote);
                [
                    hit,
                    remote as f64 / dt,
                    d.store_reads as f64 / dt,
                    d.store_writes as f64 / dt,
                ]
            };
            let per_node: Vec<[f64; 4]> = last
                .iter()
                .zip(now_snaps)
                .map(|(b, a)| node_figures(b, a))
                .collect();
            let n = per_node.len().max(1) as f64;
            row.push(format!(
                "{:.4}",
                per_node.iter().map(|f| f[0]).sum::<f64>() / n
            ));
            for k in 1..4 {
                row.push(format!("{:.1}", per_node.iter().map(|f| f[k]).sum::<f64>()));
            }
            for f in &per_node {
                row.push(format!("{:.4}", f[0]));
                row.extend(f[1..].iter().map(|v| format!("{v:.1}")));
            }
            writeln!(w, "{}", row.join(","))
                .map_err(|e| anyhow::anyhow!("--csv {}: {e}", p.display()))?;
        }
        if let Some((buf, _)) = &mut self.hdr {
            let mut log =
                hdrhistogram::serialization::interval_log::IntervalLogWriterBuilder::new()
                    .begin_log_with(buf, &mut self.serializer)
                    .map_err(|e| anyhow::anyhow!("--hdr: {e}"))?;
            let from = then.duration_since(start);
            for (i, h) in per_op.iter().enumerate().filter(|(_, h)| !h.is_empty()) {
                let tag = hdrhistogram::serialization::interval_log::Tag::new(OP_NAMES[i]);
                log.write_histogram(h, from, now.duration_since(then), tag)
                    .map_err(|e| anyhow::anyhow!("--hdr: {e}"))?;
            }
        }
        Ok(())
    }

    /// Flush the CSV and write the interval log with its header.
    pub(super) fn finish(self) -> anyhow::Result<()> {
        use std::io::Write as _;
        if let Some((mut w, p)) = self.csv {
            w.flush()
                .map_err(|e| anyhow::anyhow!("--csv {}: {e}", p.display()))?;
        }
        if let Some((body, p)) = self.hdr {
            let secs = self
                .started
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let mut text = format!(
                "# shoal ycsb: latencies in ns, one histogram per operation type and second\n\
                 #[Histogram log format version 1.3]\n\
                 #[StartTime: {secs:.3} (seconds since epoch)]\n\
                 \"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\"\n"
            )
            .into_bytes();
            text.extend(body);
            std::fs::write(&p, text).map_err(|e| anyhow::anyhow!("--hdr {}: {e}", p.display()))?;
        }
        Ok(())
    }
}
