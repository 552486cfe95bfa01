//! # shoal-storage: pages on NVMe
//!
//! This crate owns everything between a 4 KiB page in memory and the bytes on a device:
//!
//! - [`page`]: the on-disk page format (data area plus a 16-byte trailer holding the page id and
//!   a CRC-32C-style checksum) and [`AlignedPage`], a 4 KiB-aligned buffer for O_DIRECT I/O.
//! - [`superblock`]: the first page of every device: format version, cluster and node id, page
//!   size, device list, allocator state, clean-shutdown flag.
//! - [`allocator`]: the persistent slot allocator (high-water mark plus a free list that is
//!   stored, at clean shutdown, inside the free slots themselves).
//! - [`io`]: the I/O backends: io_uring (per-thread rings, batches with many requests in flight)
//!   and a portable pread/pwrite fallback.
//! - [`store`]: [`PageStore`], which stripes slots RAID-0 style over one or more files or block
//!   devices and ties the above together.
//! - [`inspect`]: [`inspect::StoreReader`], read-only access to a store for `shoal inspect`:
//!   superblocks, free list, single pages, and a scan verifying every slot.
//! - [`wal`]: the write-ahead log: the in-memory ring and group commit, the file's stamped
//!   sectors ([`wal::disk`]), the records ([`wal::record`]), and reading a log back after a
//!   crash, telling its end from damage.
//! - [`fs`]: the file-system steps durability depends on (syncing files and
//!   directories, replacing a file atomically), each reported to [`sim`].
//! - [`sim`]: the simulated device of the crash tests (feature `crash-sim`): a record of
//!   every change to the store's files, and what a crash or power loss at any point of it
//!   leaves, with torn writes and damaged data.
//!
//! It must not know about buffer frames, nodes, latches or messages: it moves sealed pages
//! between aligned buffers and slots, verifies them, and nothing else. The engine maps its
//! page ids to slots of its own node's store.

pub mod allocator;
pub mod error;
pub mod fs;
pub mod inspect;
pub mod io;
pub mod page;
pub mod sim;
pub mod store;
pub mod superblock;
pub mod wal;

pub use error::{StoreError, StoreResult};
pub use io::BackendChoice;
pub use page::{AlignedPage, PAGE_DATA_SIZE, PAGE_SIZE, TRAILER_SIZE};
pub use store::{OpenMode, PageStore, ReadRequest, StoreConfig, StoreStats, WriteRequest};
pub use wal::{LogCounters, Wal, WalConfig};
