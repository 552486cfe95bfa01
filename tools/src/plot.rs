//! `shoal plot`: SVG charts of results, several runs on one chart.
//!
//! - CSV files of `shoal ycsb --csv` (one row per second): throughput over time and the p99
//!   latency of each second, one line per file.
//! - CSV files of `shoal tpcc --csv`: transactions per second and each second's p99.
//! - JSON reports of `shoal ycsb --json` and `shoal tpcc --json`: the latency percentile
//!   distribution (the classic HdrHistogram plot: latency against percentile on a 1/(1-q)
//!   scale, so 99%, 99.9% and 99.99% are evenly spaced), one line per file, from its
//!   histograms (all operations or transactions, or one type with `--op`).

use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Results to draw: CSV files of `shoal ycsb --csv` or JSON reports of `--json` (not
    /// mixed).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// The SVG file to write.
    #[arg(long, short = 'o', default_value = "shoal-plot.svg")]
    pub out: PathBuf,
    /// With JSON reports: the operation type to draw (ycsb: read, update, insert, scan, rmw;
    /// tpcc: new_order, payment, order_status, delivery, stock_level); default: all.
    #[arg(long)]
    pub op: Option<String>,
    /// Chart title (default: the files' names).
    #[arg(long)]
    pub title: Option<String>,
}

/// One run's series.
struct Run {
    label: String,
    points: Vec<(f64, f64)>,
    /// CSV only: the p99 latency of each second.
    p99: Vec<(f64, f64)>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let is_csv = |p: &Path| p.extension().is_some_and(|e| e == "csv");
    let csv = a.files.iter().all(|p| is_csv(p));
    if !csv && a.files.iter().any(|p| is_csv(p)) {
        return Err(anyhow::anyhow!(
            "give CSV files (time series) or JSON reports (latency distributions), not both"
        ));
    }
    let runs = a
        .files
        .iter()
        .map(|p| {
            if csv {
                read_csv(p)
            } else {
                read_json(p, a.op.as_deref())
            }
        })
        .collect::<anyhow::Result<Vec<Run>>>()?;
    let title = a.title.clone().unwrap_or_else(|| {
        runs.iter()
            .map(|r| r.label.as_str())
            .collect::<Vec<_>>()
            .join(" vs ")
    });
    let drawn = if csv {
        draw_series(&a.out, &title, &runs)
    } else {
        draw_percentiles(&a.out, &title, &runs, a.op.as_deref())
    };
    drawn.map_err(|e| anyhow::anyhow!("drawing {}: {e}", a.out.display()))?;
    say!("wrote {}", a.out.display());
    Ok(ExitCode::SUCCESS)
}

fn label(p: &Path) -> String {
    p.file_stem().map_or_else(
        || p.display().to_string(),
        |s| s.to_string_lossy().into_owned(),
    )
}

fn read_csv(p: &Path) -> anyhow::Result<Run> {
    let text = std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
    let mut lines = text.lines();
    let head: Vec<&str> = lines
        .next()
        .ok_or_else(|| anyhow::anyhow!("{}: empty", p.display()))?
        .split(',')
        .collect();
    let col = |name: &str| {
        head.iter().position(|h| *h == name).ok_or_else(|| {
            anyhow::anyhow!(
                "{}: no column {name} (not a shoal ycsb or shoal tpcc --csv file?)",
                p.display()
            )
        })
    };
    // shoal ycsb --csv (ops_per_s, p99_us) or shoal tpcc --csv (txn_per_s, p99_us; none in
    // files of builds before 2026-11-27)
    let t = col("time_s")?;
    let ops = col("ops_per_s").or_else(|_| col("txn_per_s"))?;
    let p99 = col("p99_us").ok();
    let mut run = Run {
        label: label(p),
        points: Vec::new(),
        p99: Vec::new(),
    };
    for (n, line) in lines.enumerate() {
        let f: Vec<&str> = line.split(',').collect();
        let num = |i: usize| {
            f.get(i).and_then(|v| v.parse::<f64>().ok()).ok_or_else(|| {
                anyhow::anyhow!(
                    "{} line {}: not a number in column {}",
                    p.display(),
                    n + 2,
                    head[i]
                )
            })
        };
        run.points.push((num(t)?, num(ops)?));
        if let Some(c) = p99 {
            run.p99.push((num(t)?, num(c)?));
        }
    }
    if run.points.is_empty() {
        return Err(anyhow::anyhow!("{}: no rows", p.display()));
    }
    Ok(run)
}

/// Percentiles drawn: q from 0 to 0.99999, as x = 1/(1-q).
fn read_json(p: &Path, op: Option<&str>) -> anyhow::Result<Run> {
    let text = std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
    // ycsb: one histogram in ns (and one per operation type); tpcc: one per transaction type,
    // in us
    let (hists, per_us): (Vec<&serde_json::Value>, f64) = if v["command"] == "tpcc" {
        let all = v["histograms_us"].as_object();
        let hs = match (op, all) {
            (None, Some(m)) => m.values().collect(),
            (Some(o), Some(m)) => m.get(o).into_iter().collect(),
            (_, None) => Vec::new(),
        };
        (hs, 1.0)
    } else {
        let h = match op {
            None => &v["histogram_ns"],
            Some(o) => &v["per_op"][o]["histogram_ns"],
        };
        (
            vec![h].into_iter().filter(|h| !h.is_null()).collect(),
            1000.0,
        )
    };
    if hists.is_empty() {
        return Err(anyhow::anyhow!(
            "{}: no histogram{} (a shoal ycsb or shoal tpcc --json report?)",
            p.display(),
            op.map_or(String::new(), |o| format!(" for type {o}"))
        ));
    }
    let mut h = crate::report::hist();
    for hj in hists {
        crate::report::add_hist_json(&mut h, hj)
            .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
    }
    if h.is_empty() {
        return Err(anyhow::anyhow!("{}: the histogram is empty", p.display()));
    }
    let mut points = Vec::new();
    let mut x = 1.0f64;
    while x <= 100_000.0 {
        let q = 1.0 - 1.0 / x;
        points.push((x, h.value_at_quantile(q).max(1) as f64 / per_us));
        x *= 1.1;
    }
    Ok(Run {
        label: label(p),
        points,
        p99: Vec::new(),
    })
}

fn max_of(runs: &[Run], f: impl Fn(&Run) -> &[(f64, f64)], k: impl Fn(&(f64, f64)) -> f64) -> f64 {
    runs.iter()
        .flat_map(|r| f(r).iter().map(&k))
        .fold(0.0, f64::max)
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

fn draw_series(out: &Path, title: &str, runs: &[Run]) -> DrawResult {
    let root = SVGBackend::new(out, (1000, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 22))?;
    let t_max = max_of(runs, |r| &r.points, |p| p.0).max(1.0);
    if runs.iter().all(|r| r.p99.is_empty()) {
        // no latencies in these files (an older tpcc CSV): throughput only, no empty panel
        panel(&root, t_max, "per second", runs, |r| &r.points, true)?;
        root.present()?;
        return Ok(());
    }
    let (upper, lower) = root.split_vertically(350);
    panel(&upper, t_max, "per second", runs, |r| &r.points, true)?;
    panel(
        &lower,
        t_max,
        "p99 latency of the second (us)",
        runs,
        |r| &r.p99,
        false,
    )?;
    root.present()?;
    Ok(())
}

/// One time-series chart on `area`: the series `of` each run, from 0 to `t_max` seconds.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    t_max: f64,
    y_desc: &str,
    runs: &[Run],
    of: impl Fn(&Run) -> &[(f64, f64)],
    legend: bool,
) -> DrawResult {
    let y_max = max_of(runs, &of, |p| p.1).max(1.0) * 1.1;
    let mut c = ChartBuilder::on(area)
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)?;
    c.configure_mesh()
        .x_desc("seconds")
        .y_desc(y_desc)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    for (i, r) in runs.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let drawn = c.draw_series(LineSeries::new(
            of(r).iter().copied(),
            color.stroke_width(2),
        ))?;
        if legend {
            drawn.label(r.label.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
    }
    if legend {
        c.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

fn draw_percentiles(out: &Path, title: &str, runs: &[Run], op: Option<&str>) -> DrawResult {
    let root = SVGBackend::new(out, (1000, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let lat_max = max_of(runs, |r| &r.points, |p| p.1).max(1.0) * 2.0;
    let lat_min = runs
        .iter()
        .flat_map(|r| r.points.iter().map(|p| p.1))
        .fold(f64::MAX, f64::min)
        .clamp(0.01, lat_max / 2.0);
    let mut c = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .margin_right(45)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d((1.0..100_000.0).log_scale(), (lat_min..lat_max).log_scale())?;
    c.configure_mesh()
        .x_desc("percentile")
        .y_desc(format!(
            "latency (us){}",
            op.map_or(String::new(), |o| format!(", {o}"))
        ))
        .x_label_formatter(&|x| {
            let q = 100.0 * (1.0 - 1.0 / x);
            if q < 99.0 {
                format!("{q:.0}%")
            } else {
                let t = format!("{q:.3}");
                format!("{}%", t.trim_end_matches('0').trim_end_matches('.'))
            }
        })
        .draw()?;
    for (i, r) in runs.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        c.draw_series(LineSeries::new(
            r.points.iter().copied(),
            color.stroke_width(2),
        ))?
        .label(r.label.clone())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
