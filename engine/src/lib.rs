//! # shoal-engine: the buffer manager
//!
//! This crate owns a node's view of pages: buffer frames and their pool ([`frame`]), the free
//! frames ([`free_frames`]), the translation table from page id to frame ([`table`]), the
//! hybrid latch ([`latch`]), race-free page byte access ([`page`]), the guards and workers
//! that are the public API ([`guard`]), the page provider that evicts cold pages to NVMe
//! ([`provider`]), the catalog page ([`catalog`]), configuration ([`config`]) and the engine
//! itself ([`engine`]).
//!
//! The coherence protocol's rules exist as pure state machines: [`protocol`] (modes and
//! messages), [`directory`] (a page's home: holders, conflict epoch, anticipatory chaining) and
//! [`possession`] (a node's copy of a page), checked by the model in tests/coherence_model.rs;
//! [`wire`] packs the messages into 64-byte mailbox messages and [`outbox`] gathers small ones
//! into batches per destination. `coherence` (crate-private) drives them for a node of a
//! cluster: a handler thread per node, worker-side remote misses, and the provider's eviction
//! notices. [`cluster`] runs N nodes in one process; [`cluster_file`] reads
//! a TOML cluster file and starts one node of it per process over `tcp` ([`join`]).
//!
//! It must not know about B-tree layouts or workloads: it hands out latched pages by id.
//!
//! ```no_run
//! use shoal_engine::{Engine, EngineConfig, OpResult};
//! let engine = Engine::open(EngineConfig::new("/tmp/shoal-doc", 64 << 20)).unwrap();
//! let w = engine.worker();
//! let pid = {
//!     let mut g = w.allocate().unwrap();
//!     g.page_mut().set_u64(0, 42);
//!     g.pid()
//! };
//! let v = w.run(|w| -> OpResult<u64> {
//!     let g = w.optimistic(pid)?;
//!     let v = g.page().u64(0);
//!     g.validate()?;
//!     Ok(v)
//! }).unwrap();
//! assert_eq!(v, 42);
//! engine.close().unwrap();
//! ```

mod buffer;
pub mod catalog;
pub mod cluster;
pub mod cluster_file;
pub mod coherence;
pub mod config;
pub mod engine;
pub mod error;
pub mod guard;
mod node;
pub mod pid;
mod provider;
pub mod stats;

pub use buffer::page::{PageMut, PageRef};
pub use cluster::Cluster;
pub use cluster_file::{join, ClusterFile};
pub use config::{format_bytes, parse_bytes, EngineConfig, MIN_CACHE_FRAMES};
pub use engine::{lock_for_reading, Engine, Membership, ProtocolStats};
pub use error::{EngineError, OpResult, Restart};
pub use guard::{ExclusiveGuard, OptimisticGuard, SharedGuard, Worker};
pub use pid::{Pid, MAX_NODES};
pub use shoal_messaging::ChannelLayout;
pub use shoal_storage::{BackendChoice, OpenMode, PAGE_DATA_SIZE, PAGE_SIZE};
pub use stats::StatsSnapshot;
