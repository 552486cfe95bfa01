//! # shoal-btree: a B-link tree on the engine's guards
//!
//! This crate owns the tree's page layout ([`node`]: slotted pages with fence keys and
//! right-sibling links), order-preserving key encodings ([`key`]) and the tree operations with
//! optimistic lock coupling ([`tree`]): lookup, insert, upsert, update in place, remove (merging
//! underfull nodes), scans in both directions, count. [`verify`] walks a whole tree and checks
//! its structure, through guards or straight from a page store (`shoal inspect`). Trees are
//! named in the engine's catalog so that a reopened engine finds them.
//!
//! It must not know how pages move between memory, nodes and NVMe: it only takes guards from a
//! [`shoal_engine::Worker`] (or, for the verifier, page images from a reader its caller gives).

mod error;
mod key;
mod node;
mod overflow;
mod range;
mod tree;
mod txn;
pub mod value_hint;
mod verify;

pub use error::TreeError;
pub use key::{decode_u64, u64_key, KeyBuilder};
pub use node::{KIND_INNER, KIND_LEAF, MAX_KEY, MAX_RECORD};
pub use overflow::MAX_VALUE;
pub use range::Range;
pub use tree::{BTree, Batch, Direction, Insert, Put, LOOKUP_GROUP};
#[doc(hidden)]
pub use txn::set_isolation_for_checker_tests;
pub use txn::{
    backoff_after_conflict, transact, transact_with, Abort, Retry, Transaction, TxError,
};
pub use verify::{verify_tree, TreeReport};
