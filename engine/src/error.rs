//! Engine errors and the restart signal of optimistic code.

use crate::pid::Pid;
use shoal_storage::StoreError;
use std::path::PathBuf;
use std::sync::Arc;

/// Errors an engine operation reports to its caller.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error("page store: {0}")]
    Store(Arc<StoreError>),
    #[error("reading page {pid} failed: {source}")]
    PageRead {
        pid: Pid,
        #[source]
        source: Arc<StoreError>,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("data directory {path}: {why}")]
    DataDir { path: PathBuf, why: String },
    #[error("no free buffer frame after {waited_ms} ms: {why}")]
    NoFreeFrame { waited_ms: u64, why: String },
    #[error("page {pid} is homed on node {home}; this node is {node} and remote pages need the coherence protocol")]
    RemotePage { pid: Pid, home: u8, node: u8 },
    #[error("page {pid} does not exist (slot beyond the store's allocated range)")]
    NoSuchPage { pid: Pid },
    #[error("catalog: {0}")]
    Catalog(String),
    #[error("catalog: '{0}' is already registered")]
    NameTaken(String),
    #[error("page {pid} is homed on a node outside this cluster of {nodes} nodes")]
    NoSuchNode { pid: Pid, nodes: u8 },
    #[error("node {node} is unreachable (it died or its connection closed)")]
    PeerDead { node: u8 },
    #[error(
        "page {pid} was lost with node {holder}, which died holding it (unavailable until that node restarts and the page's home brings it back from the logs, or until the whole cluster restarts)"
    )]
    HolderDead { pid: Pid, holder: u8 },
    #[error("page {pid}: no answer from the cluster within {ms} ms")]
    RemoteTimeout { pid: Pid, ms: u64 },
    #[error("page {pid}: this node's lease from its home, node {home}, ran out and node {home} has not renewed it within {ms} ms (this node may be cut off: its copies of node {home}'s pages are not used)")]
    LeaseLapsed { pid: Pid, home: u8, ms: u64 },
    #[error("node {node}: joining the cluster: {why}")]
    Join { node: u8, why: String },
    #[error("node {home} could not read page {pid} from its store (see its log)")]
    RemoteRead { pid: Pid, home: u8 },
    #[error("sending {what} to node {to} failed: {why}")]
    SendFailed { to: u8, what: String, why: String },
    #[error("barrier {generation}: nodes {late:?} did not arrive within {ms} ms")]
    BarrierTimeout {
        generation: u64,
        late: Vec<u8>,
        ms: u64,
    },
    #[error("node {home} could not allocate a page (store full or failing: see its log)")]
    AllocationRefused { home: u8 },
    #[error("node {home} did not answer an allocation within {ms} ms")]
    AllocationTimeout { home: u8, ms: u64 },
    #[error("log fence: nodes {late:?} did not make their logs durable within {ms} ms (a checkpoint waits for them; docs/durability.md, \"Clusters\")")]
    FenceTimeout { late: Vec<u8>, ms: u64 },
    #[error("node {node} restarted and is recovering from this node's log: no checkpoint moves the log's start meanwhile (docs/protocol.md, \"Rejoin\")")]
    PeerRecovering { node: u8 },
    #[error("page {pid}: protocol violation: {why}")]
    ProtocolViolation { pid: Pid, why: String },
    #[error("node {node}: {count} pages {why}")]
    PagesAway { node: u8, count: usize, why: String },
    #[error("cannot set up {what}: {source}")]
    Resources {
        what: String,
        #[source]
        source: Arc<std::io::Error>,
    },
    #[error(
        "node {node}: the store stays marked unclean: not every peer made its log durable before \
         this close (the cluster did not leave in order: a peer died, or Engine::close without \
         Engine::leave); the next open recovers from the logs"
    )]
    Unfenced { node: u8 },
    #[error("node {node}: a checkpoint must log whole the {pages} pages of other homes this node holds dirty ({need_kib} KiB), more than its log has free ({free_kib} KiB): they leave as the provider evicts them home (once their homes take them), and the checkpoint is tried again a second later; give the log more room than the cache holds (`wal_bytes`)")]
    CheckpointNoRoom {
        node: u8,
        pages: usize,
        need_kib: u64,
        free_kib: u64,
    },
    #[error("the engine is shut down")]
    Shutdown,
    #[error("flush failed: {0}")]
    FlushFailed(String),
}

impl From<StoreError> for EngineError {
    fn from(e: StoreError) -> Self {
        EngineError::Store(Arc::new(e))
    }
}

/// Why an optimistic operation must stop: try again from the top, or give up with an error.
#[derive(Debug, Clone)]
pub enum Restart {
    /// Something changed under an optimistic read (or a latch was contended): retry.
    Retry,
    /// A real error (I/O, corrupt page, shutdown): retrying will not help.
    Fail(EngineError),
}

impl From<EngineError> for Restart {
    fn from(e: EngineError) -> Self {
        Restart::Fail(e)
    }
}

/// Result of one attempt of an optimistic operation.
pub type OpResult<T> = Result<T, Restart>;
