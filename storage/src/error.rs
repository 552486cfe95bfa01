//! Errors of the page store. Every variant names what the user needs to find the problem:
//! the device path, the slot, the page id.

use std::path::PathBuf;

/// Result alias for the page store.
pub type StoreResult<T> = Result<T, StoreError>;

/// Everything that can go wrong between a page buffer and a device.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("device {path} is full: writing slot {slot} failed: {source}")]
    DeviceFull {
        path: PathBuf,
        slot: u64,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "device {path} is full: no room for page slot {slot} ({source}); the slot was not allocated and pages already written are unaffected: free space on the device or add devices"
    )]
    NoRoom {
        path: PathBuf,
        slot: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("page store is full: all {capacity} page slots are in use")]
    StoreFull { capacity: u64 },
    #[error(
        "checksum mismatch for page {pid:#x} (slot {slot}) on {path}: stored {stored:#010x}, computed {computed:#010x}; the page is corrupt (or is another slot's page)"
    )]
    Checksum {
        pid: u64,
        slot: u64,
        path: PathBuf,
        stored: u32,
        computed: u32,
    },
    #[error(
        "page {expected:#x} (slot {slot}) on {path} holds page {found:#x}: misdirected write or corrupt slot"
    )]
    WrongPage {
        expected: u64,
        found: u64,
        slot: u64,
        path: PathBuf,
    },
    #[error(
        "page {pid:#x} (slot {slot}) was never written to {path} (read {got} bytes, no page image)"
    )]
    NeverWritten {
        pid: u64,
        slot: u64,
        path: PathBuf,
        got: usize,
    },
    #[error("no Shoal page store at {path}: {why}")]
    NotAStore { path: PathBuf, why: String },
    #[error("{path} already holds a Shoal page store; refusing to overwrite it")]
    AlreadyExists { path: PathBuf },
    #[error("corrupt superblock on {path}: {why}")]
    BadSuperblock { path: PathBuf, why: String },
    #[error("device set mismatch: {0}")]
    DeviceMismatch(String),
    #[error(
        "the store at {path} was not shut down cleanly and was run without a write-ahead log (durability \"none\"), so pages written since the last clean shutdown may be missing. `shoal inspect` shows what it holds; open it with `allow_unclean` (`shoal node --allow-unclean`) to use it anyway"
    )]
    Unclean { path: PathBuf },
    #[error("invalid store configuration: {0}")]
    Config(String),
    #[error("write-ahead log {path}: {why}")]
    BadLog { path: PathBuf, why: String },
    #[error(
        "write-ahead log {path} is full: all {} MiB hold changes since the last checkpoint and none finished in time; nothing acknowledged is lost, new commits are refused: give the log more room (`EngineConfig::wal_bytes`, `--wal-size`) or find what stalls the page provider's write-backs", bytes >> 20
    )]
    LogFull { path: PathBuf, bytes: u64 },
    #[error(
        "write-ahead log {path} is nearly full and its checkpoint failed: {why}; nothing acknowledged is lost, new changes are refused until a checkpoint finishes (the page provider tries again every second)"
    )]
    CheckpointFailed { path: PathBuf, why: String },
    #[error(
        "no room for the write-ahead log {path} ({} MiB): {source}; free space on its device or choose a smaller log (`EngineConfig::wal_bytes`, `--wal-size`)", bytes >> 20
    )]
    NoRoomForLog {
        path: PathBuf,
        bytes: u64,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "write-ahead log {path} is damaged, so recovery stops here instead of losing what follows: {why}. Nothing was written. Keep the files as they are; `shoal inspect` shows the log; `shoal recover --discard-damaged-log` recovers up to the damage and gives up everything after LSN {lsn}"
    )]
    LogDamaged {
        path: PathBuf,
        /// The first LSN that could not be read.
        lsn: u64,
        /// The next intact chunk found after the damage.
        resumes_at: Option<u64>,
        /// Pages the damaged chunk changed, as far as they could be read.
        pages: Vec<u64>,
        why: String,
    },
    #[error(
        "write-ahead log {path} belongs to another store (store id {found:#018x}; this store's id is {expected:#018x}): refusing to replay it; put this store's own log back"
    )]
    ForeignLog {
        path: PathBuf,
        found: u64,
        expected: u64,
    },
    #[error(
        "the store at {store} was last opened with a write-ahead log, and {path} is missing: it is needed to recover the changes since the last checkpoint; put it back (`shoal inspect` shows the store's state)"
    )]
    LogMissing { store: PathBuf, path: PathBuf },
    #[error(
        "the store at {store} was not shut down cleanly and has a write-ahead log ({path}) that recovery needs: open it with its log (durability commit, or `shoal recover`), not with durability none"
    )]
    NeedsRecovery { store: PathBuf, path: PathBuf },
    #[error(
        "device {path} is {len} bytes, but the store's slots 0..{slots} need {needed} bytes on it: the file was cut short and pages are missing; refusing to open it (restore the file)"
    )]
    Truncated {
        path: PathBuf,
        len: u64,
        needed: u64,
        slots: u64,
    },
    #[error("slot {slot} is out of range (store has {limit} slots allocated)")]
    SlotOutOfRange { slot: u64, limit: u64 },
    #[error(
        "write-ahead log {path} holds {count} transaction(s) of an older build of Shoal that a crash cut off; that build rolled them back at recovery, this one writes transactions whole at their commit and rolls nothing back. Nothing was written: recover the store with the build that wrote it (open and close it once), then open it here"
    )]
    OldTransactions { path: PathBuf, count: usize },
}
