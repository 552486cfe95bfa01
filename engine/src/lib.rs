//! # shoal-engine: the buffer manager
//!
//! One node's view of pages, built in layers (each knows only the ones below it):
//!
//! | layer | where | what |
//! |---|---|---|
//! | engine | `engine.rs`, `cluster.rs`, `cluster_file.rs` | open, close, threads; [`Engine`], [`Cluster`], [`join`] |
//! | guards | `guard/`, `provider.rs` | [`Worker`] and the page guards (the API); the page provider |
//! | node | `node.rs` | a buffer, its log, and the coherence protocol on a cluster: the one place that tells a single node from a cluster node |
//! | coherence | `coherence/` | the protocol's rules as pure state machines ([`rules`]), and the driver that runs them over a buffer (its logging of page transfers, `coherence/logged.rs`, uses durability) |
//! | durability | `durability/` | the write-ahead log in memory, log groups, commits, transactions, checkpoints |
//! | buffer | `buffer/` | frames, hybrid latches, page bytes, translation table, free frames, the page store |
//! | tasks | [`tasks`] | many tasks per thread: where a worker would wait, a task pauses (used by every layer above) |
//!
//! The public surface is what this page re-exports, the [`catalog`] page format, [`tasks`],
//! and the coherence protocol's rules in [`rules`], which the model in
//! tests/coherence_model.rs drives; everything else is private.
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
mod cluster;
mod cluster_file;
mod coherence;
mod config;
mod durability;
mod engine;
mod error;
mod guard;
mod node;
mod pid;
mod provider;
pub mod rules;
mod stats;
pub mod tasks;

pub use buffer::page::{PageMut, PageRef};
pub use cluster::{Cluster, ClusterBuilder};
pub use cluster_file::{join, new_secret_hex, ClusterFile, Secret, SECRET_BYTES};
pub use config::{format_bytes, parse_bytes, Durability, EngineConfig, MIN_CACHE_FRAMES};
pub use durability::{CommitPoint, LogCounters};
pub use engine::{lock_for_reading, Engine};
pub use error::{EngineError, OpResult, Restart};
pub use guard::{ExclusiveGuard, OptimisticGuard, PageStamp, SharedGuard, Worker};
pub use node::{new_database_id, Membership};
pub use pid::{Pid, MAX_NODES};
pub use shoal_messaging::ChannelLayout;
pub use shoal_storage::{BackendChoice, OpenMode, PAGE_DATA_SIZE, PAGE_SIZE};
pub use stats::{ProtocolStats, StatsSnapshot};
