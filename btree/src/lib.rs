//! # shoal-btree: a B-link tree on the engine's guards (not built yet)
//!
//! This crate will own the tree's page layout (slotted pages, fence keys, right-sibling links),
//! order-preserving key encodings, and optimistic lock coupling over
//! `shoal_engine::{OptimisticGuard, SharedGuard, ExclusiveGuard}`.
//!
//! It must not know how pages move between memory, nodes and NVMe: it only uses guards.
