//! The description of a kept data set (`shoal ycsb load`, then `run` many times): what was
//! loaded and which key the next insert takes.

use super::*;

pub(super) const DATA_SET_FILE: &str = "ycsb-dataset.json";

/// What `shoal ycsb load` left in a data directory (`ycsb-dataset.json`), updated by every
/// `run`: the table's shape, so that a run uses the same keys and checks that they are there.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct DataSet {
    pub(super) records: u64,
    pub(super) value_size: usize,
    pub(super) nodes: usize,
    /// The table's keys (a description without them is of a table of integer keys).
    #[serde(default)]
    pub(super) keys: KeyNames,
    #[serde(default = "one")]
    pub(super) zero_padding: usize,
    /// Bytes of each of YCSB's fields, each checked on its own (0: the value is one field,
    /// as every value of a description without it).
    #[serde(default)]
    pub(super) field_length: usize,
    /// The table's tree (usertable in a description without it).
    #[serde(default = "usertable")]
    pub(super) table: String,
    /// The fields' length distribution (constant in a description without it).
    #[serde(default)]
    pub(super) lengths: crate::value::Lengths,
    /// The records loaded, as `[start, end)` ranges in order (a description without them
    /// had all of `0..records`): loads of separate ranges (insertstart, insertcount) add up.
    #[serde(default)]
    pub(super) loaded: Option<Vec<[u64; 2]>>,
    /// The key the next insert takes (runs insert keys past the loaded ones).
    pub(super) next_key: u64,
    pub(super) loaded_utc: String,
    pub(super) runs: u64,
}

fn one() -> usize {
    1
}

fn usertable() -> String {
    "usertable".into()
}

impl DataSet {
    pub(super) fn read(dir: &std::path::Path) -> anyhow::Result<DataSet> {
        crate::cli::read_description(dir, DATA_SET_FILE, "data set of shoal ycsb load")
    }

    pub(super) fn write(&self, dir: &std::path::Path) -> anyhow::Result<()> {
        crate::cli::write_description(dir, DATA_SET_FILE, self)
    }

    /// The loaded ranges, `[start, end)`, in order and apart.
    pub(super) fn loaded(&self) -> Vec<[u64; 2]> {
        match &self.loaded {
            Some(l) => l.clone(),
            None => vec![[0, self.records]],
        }
    }

    /// Records loaded, over every range.
    pub(super) fn loaded_count(&self) -> u64 {
        self.loaded().iter().map(|[a, b]| b - a).sum()
    }

    /// Whether `first..first + count` was loaded.
    pub(super) fn covers(&self, first: u64, count: u64) -> bool {
        self.loaded()
            .iter()
            .any(|&[a, b]| a <= first && first + count <= b)
    }

    /// What of `0..records` is not loaded yet, as text ("none" if everything is).
    pub(super) fn missing(&self) -> String {
        let mut gaps = Vec::new();
        let mut at = 0;
        for [a, b] in self
            .loaded()
            .into_iter()
            .chain([[self.records, self.records]])
        {
            if a > at {
                gaps.push(format!("{at}..{a}"));
            }
            at = at.max(b);
        }
        if gaps.is_empty() {
            "none".into()
        } else {
            gaps.join(", ")
        }
    }

    /// Add the range `first..first + count` a load wrote: refused if it overlaps a loaded one.
    pub(super) fn add(&mut self, first: u64, count: u64) -> anyhow::Result<()> {
        let end = first + count;
        let mut ranges = self.loaded();
        if let Some([a, b]) = ranges.iter().find(|&&[a, b]| first < b && a < end) {
            return Err(anyhow::Error::new(crate::cli::Usage(format!(
                "records {first}..{end} overlap the records {a}..{b} loaded already (not loaded \
                 yet: {})",
                self.missing()
            ))));
        }
        ranges.push([first, end]);
        ranges.sort_unstable();
        let mut merged: Vec<[u64; 2]> = Vec::new();
        for r in ranges {
            match merged.last_mut() {
                Some(last) if last[1] == r[0] => last[1] = r[1],
                _ => merged.push(r),
            }
        }
        self.loaded = Some(merged);
        Ok(())
    }

    /// A run must use the loaded shape: flags or properties that disagree are an error.
    pub(super) fn matches(&self, a: &Args) -> anyhow::Result<()> {
        let given = |id: &str| a.explicit.iter().any(|e| e == id);
        let differ = |what: &str, theirs: String, mine: String| {
            anyhow::Error::new(crate::cli::Usage(format!(
                "the data set was loaded with {what} {theirs}, this run asks for {mine}: run with \
                 the loaded shape (or load a new data set)"
            )))
        };
        if (given("records") || !a.properties.is_empty() || !a.property_files.is_empty())
            && a.records != self.records
        {
            return Err(differ(
                "recordcount",
                self.records.to_string(),
                a.records.to_string(),
            ));
        }
        if a.value_size != self.value_size && (given("value_size") || a.value_from_fields.is_some())
        {
            return Err(differ(
                "value size",
                self.value_size.to_string(),
                a.value_size.to_string(),
            ));
        }
        let names = |n: KeyNames, p: usize| match n {
            KeyNames::Integer => "integer".to_string(),
            KeyNames::Hashed => format!("hashed (zeropadding {p})"),
            KeyNames::Ordered => format!("ordered (zeropadding {p})"),
        };
        if a.keys.is_some_and(|k| k != self.keys)
            || (a.keys.is_some() && a.zero_padding != self.zero_padding)
        {
            return Err(differ(
                "keys",
                names(self.keys, self.zero_padding),
                names(a.keys.unwrap_or_default(), a.zero_padding),
            ));
        }
        if let Some(l) = a.field_length.filter(|&l| l != self.field_length) {
            return Err(differ(
                "fields of",
                format!("{} bytes (0: one field)", self.field_length),
                format!("{l}"),
            ));
        }
        if a.net.nodes != self.nodes {
            return Err(differ(
                "--nodes",
                self.nodes.to_string(),
                a.net.nodes.to_string(),
            ));
        }
        Ok(())
    }
}
