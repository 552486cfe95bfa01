//! Engine configuration, its defaults and its validation.

pub use crate::durability::Durability;
use crate::error::EngineError;
use shoal_storage::{BackendChoice, OpenMode, PAGE_SIZE};
use std::path::PathBuf;

/// Fewest frames a node's cache may have: the provider needs room to work and every worker may
/// fix a handful of pages at once (a B-tree split fixes up to three).
pub const MIN_CACHE_FRAMES: usize = 256;

/// Configuration of one node's engine.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EngineConfig {
    /// Directory holding the node's device files (`node<N>-<i>.dat`) and its lock file.
    pub data_dir: PathBuf,
    /// Number of device files to stripe over inside `data_dir` (ignored if `device_paths` set).
    pub devices: usize,
    /// Explicit files or block devices to stripe over, instead of files in `data_dir`.
    pub device_paths: Vec<PathBuf>,
    /// Bytes of DRAM for page frames.
    pub cache_bytes: usize,
    pub node_id: u8,
    pub cluster_id: u64,
    /// Open, create, or open-or-create (the default). A new store is made only in a new or
    /// empty directory, or one holding nothing but a store's own files (`node*`); a directory
    /// holding anything else is refused, naming what is there.
    pub mode: OpenMode,
    pub backend: BackendChoice,
    /// Open a store that was not shut down cleanly (see `StoreError::Unclean`).
    pub allow_unclean: bool,
    /// Recovery from a damaged log (`StoreError::LogDamaged`) replays up to the damage and
    /// gives up everything the log holds after it, instead of refusing to open. Off by default:
    /// only for a store whose damaged log cannot be repaired (`shoal recover
    /// --discard-damaged-log`).
    pub discard_damaged_log: bool,
    /// Most page slots the node's store may hold, 0 = unlimited.
    pub capacity_pages: u64,
    /// The page provider keeps at least this share of frames free (percent, 1..=50).
    pub free_target_percent: u32,
    /// How long a page fault waits for a free frame before failing with `NoFreeFrame` (the
    /// provider cannot evict: pages fixed by guards, or write-back failing).
    pub free_frame_timeout: std::time::Duration,
    /// Cluster nodes: use the cluster's DRAM as one pool before NVMe (docs/cluster.md "One
    /// pool"): a shared read whose home copy is not in memory is served by a node holding a
    /// copy, and the provider evicts copies of other nodes' pages before this node's own.
    /// Default on; off gives the plain per-node caches (for comparisons).
    pub one_pool: bool,
    /// When changes become durable (docs/durability.md). Default [`Durability::Commit`]: a
    /// commit that returned survives kill -9 and power loss, on a single node and on a
    /// cluster node (docs/durability.md, "Clusters").
    pub durability: Durability,
    /// A cluster node with a log: the logs of the cluster's other nodes, which its recovery
    /// reads for the records of its own pages (every node logs the changes its workers make,
    /// whatever the page's home), as do its homes' take-backs of pages lost with a dead node.
    /// Every log listed must be readable from this node: one that is not is an error naming
    /// it, never skipped (list only nodes that run with a log). [`crate::Cluster`] and
    /// cluster files fill it in.
    pub peer_logs: Vec<PathBuf>,
    /// Size of the write-ahead log file (with a log; 4 KiB multiple, at least 1 MiB; default
    /// 64 MiB, written once when the log is created). A checkpoint begins when half of it is
    /// in use: a larger log checkpoints less often under heavy writing.
    pub wal_bytes: u64,
    /// A cluster node with a log: let checkpoints finish while a peer is dead, carrying this
    /// node's records of the pages it had handed that peer into a file beside the log
    /// (docs/durability.md, "A checkpoint past a dead peer"). Default on. Off, a dead peer
    /// fails every checkpoint, and once the log is nearly full changes fail with
    /// `CheckpointFailed` naming it.
    pub checkpoint_past_dead_peers: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            data_dir: PathBuf::from("shoal-data"),
            devices: 1,
            device_paths: Vec::new(),
            cache_bytes: 1 << 30,
            node_id: 0,
            cluster_id: 0,
            mode: OpenMode::OpenOrCreate,
            backend: BackendChoice::Auto,
            allow_unclean: false,
            discard_damaged_log: false,
            capacity_pages: 0,
            free_target_percent: 5,
            one_pool: true,
            free_frame_timeout: std::time::Duration::from_secs(10),
            durability: Durability::Commit,
            peer_logs: Vec::new(),
            wal_bytes: 64 << 20,
            checkpoint_past_dead_peers: true,
        }
    }
}

impl EngineConfig {
    /// A configuration for `data_dir` with `cache_bytes` of cache; everything else default.
    pub fn new(data_dir: impl Into<PathBuf>, cache_bytes: usize) -> Self {
        EngineConfig {
            data_dir: data_dir.into(),
            cache_bytes,
            ..Default::default()
        }
    }

    /// A configuration for a cluster node: as [`EngineConfig::new`] with durability
    /// [`Durability::None`] (speed runs and tests; set [`EngineConfig::durability`] for a
    /// cluster whose commits survive a crash, docs/durability.md "Clusters").
    pub fn for_cluster_node(data_dir: impl Into<PathBuf>, cache_bytes: usize) -> Self {
        EngineConfig {
            durability: Durability::None,
            ..EngineConfig::new(data_dir, cache_bytes)
        }
    }

    /// Number of frames the cache holds.
    pub fn frames(&self) -> usize {
        self.cache_bytes / PAGE_SIZE
    }

    /// Check the configuration; errors say what to change.
    pub fn validate(&self) -> Result<(), EngineError> {
        let min = MIN_CACHE_FRAMES * PAGE_SIZE;
        if self.cache_bytes < min {
            return Err(EngineError::Config(format!(
                "cache of {} is smaller than the minimum {} ({MIN_CACHE_FRAMES} pages of {PAGE_SIZE} bytes)",
                format_bytes(self.cache_bytes as u64),
                format_bytes(min as u64)
            )));
        }
        if self.frames() > u32::MAX as usize - 1 {
            return Err(EngineError::Config("cache larger than 16 TiB".into()));
        }
        if self.node_id as usize >= crate::pid::MAX_NODES {
            return Err(EngineError::Config(format!(
                "node id {} is out of range: a cluster has at most {} nodes (ids 0..{})",
                self.node_id,
                crate::pid::MAX_NODES,
                crate::pid::MAX_NODES - 1
            )));
        }
        if self.device_paths.is_empty() && !(1..=64).contains(&self.devices) {
            return Err(EngineError::Config(format!(
                "devices must be 1..=64, got {}",
                self.devices
            )));
        }
        if self.durability.logged()
            && (self.wal_bytes < (1 << 20) || !self.wal_bytes.is_multiple_of(4096))
        {
            return Err(EngineError::Config(format!(
                "the write-ahead log size must be a multiple of 4 KiB and at least 1 MiB, got {}",
                format_bytes(self.wal_bytes)
            )));
        }
        if !(1..=50).contains(&self.free_target_percent) {
            return Err(EngineError::Config(format!(
                "free_target_percent must be 1..=50, got {}",
                self.free_target_percent
            )));
        }
        Ok(())
    }

    /// Where this node's write-ahead log is (beside its first device), whether or not it
    /// runs with one.
    pub fn log_path(&self) -> Option<PathBuf> {
        let dev0 = self.device_list().into_iter().next()?;
        Some(shoal_storage::default_log_path(&dev0))
    }

    /// The device files of this node.
    /// The write-ahead log's configuration (None without one).
    pub fn wal_config(&self) -> Option<shoal_storage::WalConfig> {
        if !self.durability.logged() {
            return None;
        }
        let mut w = shoal_storage::WalConfig::new(self.log_path()?);
        w.file_bytes = self.wal_bytes;
        // the ring holds what a flush takes at once: 1/16 of the log, 1..=16 MiB
        w.ring_bytes =
            ((self.wal_bytes / 16).clamp(1 << 20, 16 << 20) as usize).next_power_of_two();
        Some(w)
    }

    pub fn device_list(&self) -> Vec<PathBuf> {
        if !self.device_paths.is_empty() {
            return self.device_paths.clone();
        }
        (0..self.devices)
            .map(|i| self.data_dir.join(format!("node{}-{i}.dat", self.node_id)))
            .collect()
    }
}

/// Parse a size such as `4096`, `64MiB`, `1GiB`, `512k`, `2G` (binary units).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (examples: 512MiB, 2GiB, 4096)"))?;
    // as dd reads them: K, M, G, T and KiB, MiB, ... are powers of 1024; KB, MB, GB, TB
    // are powers of 1000 (SI)
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        u => {
            return Err(format!(
                "unknown size unit '{u}' in '{s}' (use KiB, MiB, GiB, TiB: powers of 1024; \
                 or KB, MB, GB, TB: powers of 1000)"
            ))
        }
    };
    if n < 0.0 || !n.is_finite() {
        return Err(format!("'{s}' is not a size"));
    }
    Ok((n * mult as f64) as u64)
}

/// Human-readable binary size.
pub fn format_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("2g").unwrap(), 2 << 30);
        assert_eq!(
            parse_bytes("64MB").unwrap(),
            64_000_000,
            "MB is SI, as dd reads it"
        );
        assert_eq!(parse_bytes("64M").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("2kb").unwrap(), 2_000);
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("3parsecs").is_err());
        assert_eq!(format_bytes(1 << 30), "1.0 GiB");
    }

    #[test]
    fn validation_messages() {
        let c = EngineConfig::new("x", 4096);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("smaller than the minimum 1.0 MiB"), "{e}");
        let mut c = EngineConfig::new("x", 8 << 20);
        c.node_id = 64;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("at most 64 nodes"));
    }
}
