//! Errors of tree operations.

use shoal_engine::{EngineError, Pid};

#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TreeError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("key of {len} bytes is too large (at most {max})")]
    KeyTooLarge { len: usize, max: usize },
    #[error("value of {len} bytes is too large (at most {max})")]
    ValueTooLarge { len: usize, max: usize },
    #[error("a tree named '{0}' already exists")]
    Exists(String),
    #[error("no tree named '{0}' in the catalog")]
    NotFound(String),
    #[error("catalog entry '{0}' points at page {1}, which is not a B-tree node")]
    NotATree(String, Pid),
    #[error("a write to a tree from inside its own scan callback (it would wait for the scan's latch for ever): collect the keys first, or iterate with BTree::range")]
    WriteInScan,
    #[error("bytes {start}..{end} of a value were asked for, and the value ends before {end}")]
    PartOutside { start: usize, end: usize },
    #[error(
        "an add to bytes {start}..{end} of key {key:?}, which at the commit is absent, shorter, \
         or kept in overflow pages (nothing was written)"
    )]
    AddOutside {
        key: Vec<u8>,
        start: usize,
        end: usize,
    },
    /// A tree handle was used with a worker of another engine or cluster (or of the same
    /// store opened again): nothing was read or written.
    #[error(
        "the handle of tree {root} belongs to another engine (or to this store before it was \
         opened again): open the tree with this engine (BTree::open)"
    )]
    OtherEngine { root: Pid },
    /// A batch's commit failed for a reason of transactions ([`crate::TxError`]): too large
    /// for one commit (nothing written), or applied with its durability unknown
    /// ([`crate::TxError::DurabilityUnknown`]: written, maybe not durable).
    #[error("the batch's commit failed: {0}")]
    Commit(Box<crate::TxError>),
}
