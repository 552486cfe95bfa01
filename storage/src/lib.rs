//! # shoal-storage: pages on NVMe
//!
//! This crate owns everything between a 4 KiB page in memory and the bytes on a device:
//!
//! - `page`: the on-disk page format (data area plus a 16-byte trailer holding the page id and
//!   a CRC-32C-style checksum) and [`AlignedPage`], a 4 KiB-aligned buffer for O_DIRECT I/O.
//! - `superblock`: the first page of every device: format version, cluster and node id, page
//!   size, device list, allocator state, clean-shutdown flag.
//! - `allocator`: the persistent slot allocator (high-water mark plus a free list that is
//!   stored, at clean shutdown, inside the free slots themselves).
//! - [`io`]: the I/O backends: io_uring (per-thread rings, batches with many requests in flight)
//!   and a portable pread/pwrite fallback.
//! - `store`: [`PageStore`], which stripes slots RAID-0 style over one or more files or block
//!   devices and ties the above together.
//! - `inspect`: [`StoreReader`], read-only access to a store for `shoal inspect`:
//!   superblocks, free list, single pages, and a scan verifying every slot.
//! - [`wal`]: the write-ahead log's on-disk side: the file's stamped sectors
//!   ([`wal::disk`]), the records ([`wal::record`]), writing a flush ([`wal::LogFile`]) and
//!   reading a log back after a crash, telling its end from damage. The log in memory (ring,
//!   group commit, checkpoints) is the engine's.
//! - `fs`: the file-system steps durability depends on (syncing files and
//!   directories, replacing a file atomically), each reported to [`sim`].
//! - [`sim`]: the simulated device of the crash tests (feature `crash-sim`): a record of
//!   every change to the store's files, and what a crash or power loss at any point of it
//!   leaves, with torn writes and damaged data.
//!
//! It must not know about buffer frames, nodes, latches or messages: it moves sealed pages
//! between aligned buffers and slots, verifies them, and nothing else. The engine maps its
//! page ids to slots of its own node's store.
//!
//! The modules are private; what other crates use is re-exported here, except three
//! namespaces: [`wal`] (the log's format and file), [`io`] (the hooks a thread running many
//! tasks installs) and [`sim`] (the simulated device of the crash tests).

mod allocator;
mod error;
mod fs;
mod inspect;
pub mod io;
mod page;
pub mod sim;
mod store;
mod superblock;
pub mod wal;

pub use allocator::Allocator;
pub use error::{StoreError, StoreResult};
pub use fs::{with_suffix, write_atomic};
pub use inspect::{SlotScan, StoreReader, MAX_LISTED};
pub use io::{Backend, BackendChoice};
pub use page::{
    checksum, seal, set_version, version, AlignedPage, PAGE_DATA_SIZE, PAGE_SIZE, TRAILER_SIZE,
    VERSION_OFF,
};
pub use store::creation_leftover;
pub use store::{
    default_log_path, ClusterLogs, OpenMode, OpenedLog, PageStore, ReadRequest, SlotChange,
    SlotLog, StoreConfig, StoreStats, WriteRequest, CREATING, GROW_CHUNK, MAX_DEVICES, WRITE_CHUNK,
};
pub use superblock::{CopyState, DeviceCopies, Superblock, FORMAT_VERSION};
pub use wal::{LogFile, WalConfig};
