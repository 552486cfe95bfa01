//! YCSB's workload properties for `shoal ycsb`: `-P FILE` (YCSB's properties format: `key=value`
//! lines, `#` or `!` comments) and `-p key=value`, mapped onto the command's flags. Later files
//! and `-p` override earlier ones; a flag given on the command line overrides them all.

use super::{Args, KeyNames};
use crate::workload::Mix;
use std::collections::BTreeMap;
use std::path::Path;

/// Properties understood, and what they set.
const KNOWN: &[(&str, &str)] = &[
    ("recordcount", "--records"),
    ("operationcount", "--operations"),
    ("maxexecutiontime", "--duration (seconds)"),
    ("threadcount", "--workers"),
    ("target", "--target"),
    ("readproportion", "the mix"),
    ("updateproportion", "the mix"),
    ("insertproportion", "the mix"),
    ("scanproportion", "the mix"),
    ("readmodifywriteproportion", "the mix"),
    (
        "requestdistribution",
        "--distribution (uniform, zipfian, latest, hotspot, sequential, exponential)",
    ),
    ("zipfianconstant", "--zipf-theta"),
    ("hotspotdatafraction", "--hotspot-data-fraction"),
    ("hotspotopnfraction", "--hotspot-op-fraction"),
    ("exponential.percentile", "--exponential-percentile"),
    ("exponential.frac", "--exponential-frac"),
    ("fieldcount", "--value-size (fieldcount x fieldlength)"),
    ("fieldlength", "--value-size (fieldcount x fieldlength)"),
    ("maxscanlength", "--max-scan"),
    ("insertorder", "--keys (hashed or ordered)"),
    ("zeropadding", "--zero-padding"),
    ("insertstart", "--insert-start"),
    ("insertcount", "--insert-count"),
    ("fieldlengthdistribution", "--field-length-distribution"),
    ("scanlengthdistribution", "--scan-length-distribution"),
    ("table", "--table"),
    ("status.interval", "--status-interval"),
    ("minfieldlength", "--min-field-length"),
    ("readallfields", "--read-all-fields"),
    ("writeallfields", "--write-all-fields"),
];

/// Properties that are accepted without changing the run, each with what this driver does
/// instead: said on standard error when given with a value that differs from it.
const IGNORED: &[(&str, &[&str], &str)] = &[
    (
        "workload",
        &[],
        "the CoreWorkload is what shoal ycsb runs (anything else is refused)",
    ),
    (
        "measurementtype",
        &["hdrhistogram"],
        "latencies go into HdrHistograms",
    ),
    (
        "histogram.buckets",
        &[],
        "latencies go into HdrHistograms (no buckets)",
    ),
];

/// Read the property files and `-p` pairs of `a`, in order.
pub fn collect(a: &Args) -> anyhow::Result<BTreeMap<String, String>> {
    let mut props = BTreeMap::new();
    for f in &a.property_files {
        let text = std::fs::read_to_string(f)
            .map_err(|e| anyhow::anyhow!("-P {}: cannot read it: {e}", f.display()))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let (k, v) = split(line).ok_or_else(|| {
                anyhow::anyhow!(
                    "-P {} line {}: expected key=value, got {line:?}",
                    f.display(),
                    n + 1
                )
            })?;
            props.insert(k, v);
        }
    }
    for p in &a.properties {
        let (k, v) = split(p).ok_or_else(|| anyhow::anyhow!("-p {p:?}: expected key=value"))?;
        props.insert(k, v);
    }
    Ok(props)
}

fn split(s: &str) -> Option<(String, String)> {
    let (k, v) = s.split_once('=').or_else(|| s.split_once(':'))?;
    let k = k.trim();
    (!k.is_empty()).then(|| (k.to_ascii_lowercase(), v.trim().to_string()))
}

/// Apply `props` to `a` where its flags were not given on the command line (`explicit` holds
/// the ids of those that were). Returns the mix the proportions define, if any.
pub fn apply(
    a: &mut Args,
    props: &BTreeMap<String, String>,
    explicit: &[String],
) -> anyhow::Result<Option<Mix>> {
    let given = |id: &str| explicit.iter().any(|e| e == id);
    let num = |k: &str| -> anyhow::Result<Option<f64>> {
        props
            .get(k)
            .map(|v| {
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .ok_or_else(|| anyhow::anyhow!("property {k}={v}: not a number >= 0"))
            })
            .transpose()
    };
    let int = |k: &str| -> anyhow::Result<Option<u64>> {
        props
            .get(k)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| anyhow::anyhow!("property {k}={v}: not a whole number"))
            })
            .transpose()
    };
    for k in props.keys() {
        if !KNOWN.iter().any(|(n, _)| n == k) && !IGNORED.iter().any(|(n, _, _)| n == k) {
            return Err(anyhow::anyhow!(
                "property {k}: not understood by shoal ycsb (it understands {})",
                KNOWN.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            ));
        }
    }
    for (k, same, what) in IGNORED {
        if let Some(v) = props.get(*k) {
            if !same.contains(&v.as_str()) && *k != "workload" {
                eprintln!("note: property {k}={v} does not change this run: {what}");
            }
        }
    }
    if let Some(w) = props.get("workload") {
        if !w.ends_with("CoreWorkload") {
            return Err(anyhow::anyhow!(
                "property workload={w}: only YCSB's CoreWorkload is supported"
            ));
        }
    }
    // YCSB's key names: insertorder (hashed unless it says ordered) with YCSB's properties
    let ycsb_shape = !a.property_files.is_empty() || !a.properties.is_empty();
    if ycsb_shape {
        a.default_keys = KeyNames::Hashed;
    }
    let order = match props.get("insertorder").map(String::as_str) {
        None => None,
        Some("hashed") => Some(KeyNames::Hashed),
        Some("ordered") => Some(KeyNames::Ordered),
        Some(o) => {
            return Err(anyhow::anyhow!(
                "property insertorder={o}: use hashed or ordered"
            ))
        }
    };
    if order.is_some() && !given("keys") {
        a.keys = order;
    }
    for (key, id, field) in [
        ("readallfields", "read_all_fields", &mut a.read_all_fields),
        (
            "writeallfields",
            "write_all_fields",
            &mut a.write_all_fields,
        ),
    ] {
        if let Some(v) = props.get(key) {
            let v = match v.to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => return Err(anyhow::anyhow!("property {key}={v}: true or false")),
            };
            if !given(id) {
                *field = Some(v);
            }
        }
    }
    if let Some(d) = props.get("fieldlengthdistribution") {
        if !given("field_length_distribution") {
            a.field_length_distribution = match d.as_str() {
                "constant" => super::FieldLengths::Constant,
                "uniform" => super::FieldLengths::Uniform,
                "zipfian" => super::FieldLengths::Zipfian,
                other => {
                    return Err(anyhow::anyhow!(
                        "property fieldlengthdistribution={other}: shoal ycsb has constant, \
                         uniform and zipfian (not YCSB's histogram files)"
                    ))
                }
            };
        }
    }
    if let Some(d) = props.get("scanlengthdistribution") {
        if !given("scan_length_distribution") {
            a.scan_length_distribution = match d.as_str() {
                "uniform" => super::ScanLengths::Uniform,
                "zipfian" => super::ScanLengths::Zipfian,
                other => {
                    return Err(anyhow::anyhow!(
                        "property scanlengthdistribution={other}: shoal ycsb has uniform and \
                         zipfian"
                    ))
                }
            };
        }
    }
    if let Some(v) = int("status.interval")? {
        if !given("status_interval") {
            a.status_interval = v;
        }
    }
    if let Some(t) = props.get("table") {
        if !given("table") {
            a.table = t.clone();
        }
    }
    if let Some(v) = int("minfieldlength")? {
        if !given("min_field_length") {
            a.min_field_length = u32::try_from(v).unwrap_or(u32::MAX);
        }
    }
    if let Some(v) = int("zeropadding")? {
        if !given("zero_padding") {
            a.zero_padding = usize::try_from(v).unwrap_or(usize::MAX);
        }
    }
    if let Some(v) = int("recordcount")? {
        if !given("records") {
            a.records = v;
        }
    }
    if let Some(v) = int("operationcount")? {
        if !given("operations") {
            a.operations = Some(v);
        }
    }
    if let Some(v) = int("maxexecutiontime")? {
        if !given("duration") {
            a.duration = v as f64;
        }
    }
    if let Some(v) = int("threadcount")? {
        if !given("workers") {
            a.workers = v.to_string();
        }
    }
    if let Some(v) = num("target")? {
        if !given("target") && v > 0.0 {
            a.target = Some(v);
        }
    }
    if let Some(v) = num("zipfianconstant")? {
        if !given("zipf_theta") {
            a.zipf_theta = v;
        }
    }
    for (key, id, field) in [
        (
            "hotspotdatafraction",
            "hotspot_data_fraction",
            &mut a.hotspot_data_fraction,
        ),
        (
            "hotspotopnfraction",
            "hotspot_op_fraction",
            &mut a.hotspot_op_fraction,
        ),
        (
            "exponential.percentile",
            "exponential_percentile",
            &mut a.exponential_percentile,
        ),
        (
            "exponential.frac",
            "exponential_frac",
            &mut a.exponential_frac,
        ),
    ] {
        if let Some(v) = num(key)? {
            if !given(id) {
                *field = v;
            }
        }
    }
    for (key, id, field) in [
        ("insertstart", "insert_start", &mut a.insert_start),
        ("insertcount", "insert_count", &mut a.insert_count),
    ] {
        if let Some(v) = int(key)? {
            if !given(id) {
                *field = Some(v);
            }
        }
    }
    if let Some(v) = int("maxscanlength")? {
        if !given("max_scan") {
            a.max_scan = v as usize;
        }
    }
    // YCSB's record: fieldcount x fieldlength, 10 x 100 bytes unless the properties say
    // otherwise (as one value here); only when a workload file or property is given, so the
    // plain command keeps its 128-byte values
    // YCSB has no warm-up: with its properties, none unless --warmup asks for one
    if ycsb_shape && !given("warmup") {
        a.warmup = 0.0;
    }
    if ycsb_shape || props.contains_key("fieldcount") || props.contains_key("fieldlength") {
        // YCSB's defaults: 10 fields of 100 bytes
        let count = int("fieldcount")?.unwrap_or(10);
        let length = int("fieldlength")?.unwrap_or(100);
        if !given("value_size") {
            a.value_size = usize::try_from(count.saturating_mul(length)).unwrap_or(usize::MAX);
            a.value_from_fields = Some((count, length));
        }
    }
    if let Some(d) = props.get("requestdistribution") {
        if !given("distribution") {
            a.distribution = Some(match d.as_str() {
                "uniform" => super::Distribution::Uniform,
                "zipfian" => super::Distribution::Zipf,
                "latest" => super::Distribution::Latest,
                "hotspot" => super::Distribution::Hotspot,
                "sequential" => super::Distribution::Sequential,
                "exponential" => super::Distribution::Exponential,
                other => {
                    return Err(anyhow::anyhow!(
                        "property requestdistribution={other}: shoal ycsb has uniform, zipfian, \
                         latest, hotspot, sequential and exponential"
                    ))
                }
            });
        }
    }
    let proportions = [
        "readproportion",
        "updateproportion",
        "insertproportion",
        "scanproportion",
        "readmodifywriteproportion",
    ];
    if proportions.iter().any(|p| props.contains_key(*p)) && !given("read_ratio") {
        // YCSB's defaults for the ones not given: 0.95 reads, 0.05 updates, no others
        let read = num("readproportion")?.unwrap_or(0.95);
        let update = num("updateproportion")?.unwrap_or(0.05);
        let insert = num("insertproportion")?.unwrap_or(0.0);
        let scan = num("scanproportion")?.unwrap_or(0.0);
        let rmw = num("readmodifywriteproportion")?.unwrap_or(0.0);
        let sum = read + update + insert + scan + rmw;
        if sum <= 0.0 {
            return Err(anyhow::anyhow!("the operation proportions add up to 0"));
        }
        // normalised, as YCSB's chooser weighs them
        return Ok(Some(Mix {
            read: read / sum,
            update: update / sum,
            insert: insert / sum,
            scan: scan / sum,
            rmw: rmw / sum,
        }));
    }
    Ok(None)
}

/// The workload's label: the first property file's name (`workloada`), if any.
pub fn label(a: &Args) -> Option<String> {
    a.property_files
        .first()
        .and_then(|f| Path::new(f).file_name())
        .map(|n| n.to_string_lossy().into_owned())
}
