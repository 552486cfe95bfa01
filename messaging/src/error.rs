//! Messaging errors.

/// Errors of transports and mailboxes.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum MsgError {
    #[error("node {0} is unreachable (connection closed or peer died)")]
    PeerDead(u8),
    #[error("no reply from node {peer} within {ms} ms")]
    Timeout { peer: u8, ms: u64 },
    #[error("node {0} is not a member of this cluster of {1} nodes")]
    NoSuchPeer(u8, u8),
    #[error("write of {len} bytes at offset {offset} does not fit the region of {region} bytes (writes are 8-byte aligned, non-empty)")]
    OutOfBounds {
        offset: usize,
        len: usize,
        region: usize,
    },
    #[error("malformed message: {0}")]
    Decode(String),
    #[error("handshake with {addr} failed: {why}")]
    Handshake { addr: String, why: String },
    #[error("I/O: {0}")]
    Io(String),
    #[error("invalid messaging configuration: {0}")]
    Config(String),
    #[error("RDMA: {0}")]
    Rdma(String),
}
