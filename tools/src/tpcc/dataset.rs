//! The description of a kept TPC-C database (`shoal tpcc load`, then `run` many times): what
//! was loaded, the load's NURand constants (a run's must keep their distance from them), and
//! how many runs wrote to it (each run's history rows get keys of their own).

use super::random::Constants;
use std::path::Path;

pub(super) const DATA_SET_FILE: &str = "tpcc-dataset.json";

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct TpccSet {
    pub(super) warehouses: u16,
    pub(super) nodes: usize,
    /// The load's C constants (clause 2.1.6).
    pub(super) load_c_last: u32,
    pub(super) load_c_id: u32,
    pub(super) load_ol_i_id: u32,
    pub(super) loaded_utc: String,
    pub(super) runs: u64,
}

impl TpccSet {
    pub(super) fn new(warehouses: u16, nodes: usize, c: &Constants) -> TpccSet {
        TpccSet {
            warehouses,
            nodes,
            load_c_last: c.c_last,
            load_c_id: c.c_id,
            load_ol_i_id: c.ol_i_id,
            loaded_utc: crate::report::utc_text(std::time::SystemTime::now()),
            runs: 0,
        }
    }

    pub(super) fn load_constants(&self) -> Constants {
        Constants {
            c_last: self.load_c_last,
            c_id: self.load_c_id,
            ol_i_id: self.load_ol_i_id,
        }
    }

    pub(super) fn read(dir: &Path) -> anyhow::Result<TpccSet> {
        crate::cli::read_description(dir, DATA_SET_FILE, "database of shoal tpcc load")
    }

    pub(super) fn write(&self, dir: &Path) -> anyhow::Result<()> {
        crate::cli::write_description(dir, DATA_SET_FILE, self)
    }
}
