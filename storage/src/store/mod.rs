//! [`PageStore`]: page slots striped over one or more devices.
//!
//! Slot `s` lives on device `s % n` at byte offset `(1 + s / n) * PAGE_SIZE`; page 0 of every
//! device is its superblock. Files are opened with O_DIRECT (falling back to buffered I/O with a
//! warning where the file system refuses it).

mod create;
mod device;
mod recover;
mod slots;
#[cfg(test)]
mod tests;

pub use create::default_log_path;
pub(crate) use create::{complete_creation, make_log, remove_log};
pub(crate) use device::*;

use crate::allocator::{decode_chain_page, encode_chain_page, Allocator, NO_SLOT};
use crate::error::{StoreError, StoreResult};
use crate::io::{self, fallocate, is_full, Backend, BackendChoice, IoOp};
use crate::page::{seal, AlignedPage, PAGE_DATA_SIZE, PAGE_SIZE};
use crate::superblock::{self, header_pages, Superblock, FORMAT_VERSION, FREELIST_PID};
use crate::wal::disk::alloc_path;
use crate::wal::record::rec;
use crate::wal::{self, LogFile, Replay};
use byteorder::{ByteOrder, LittleEndian};
use parking_lot::Mutex;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// How to treat existing devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpenMode {
    /// Make a new store; fail if any device already holds one.
    Create,
    /// Open an existing store; fail if there is none.
    Open,
    /// Open if device 0 holds a store, else create.
    #[default]
    OpenOrCreate,
}

/// Configuration of one node's page store.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreConfig {
    /// Files or block devices, in stripe order. At most 64.
    pub devices: Vec<PathBuf>,
    pub mode: OpenMode,
    pub backend: BackendChoice,
    /// Node that owns this store (checked against the superblock at open).
    pub node_id: u32,
    /// Cluster the store belongs to (checked against the superblock at open).
    pub cluster_id: u64,
    /// Maximum number of page slots, 0 = unlimited (bounded by the devices).
    pub capacity_pages: u64,
    /// Open a store that was not closed cleanly (no WAL exists: data since the last clean
    /// shutdown may be missing).
    pub allow_unclean: bool,
    /// Recovery replays a damaged log up to the damage and discards the rest (see
    /// [`StoreError::LogDamaged`]) instead of refusing to open.
    pub discard_damaged_log: bool,
    /// The write-ahead log (None: durability "none", no log; a log left by an earlier run is
    /// deleted at open, as the store is about to change without it).
    pub wal: Option<crate::wal::WalConfig>,
    /// A cluster node's store: recovery merges the records of this store's pages from every
    /// node's log (docs/durability.md, "Clusters"). None: a single node.
    pub cluster: Option<ClusterLogs>,
    /// The node a page id is homed on (the engine's page id layout), if the caller knows it:
    /// a single node's recovery then refuses a log holding records of another node's pages
    /// (a cluster node's log, which only the cluster's recovery may replay).
    pub page_home: Option<fn(u64) -> u8>,
}

/// What a cluster node's recovery needs beyond its own log (and [`StoreConfig::page_home`],
/// which it requires).
#[derive(Debug, Clone)]
pub struct ClusterLogs {
    /// The node whose store this is.
    pub node: u8,
    /// The logs of the cluster's other nodes that run with a log (read only, from their redo
    /// points): every one listed must be readable. A listed log that is not there is an
    /// error naming it (`StoreError::BadLog`), never skipped: a cluster's durability is one
    /// setting, so its absence means this node cannot see it (another host's directory), and
    /// recovering without it would lose its records of this store's pages silently.
    pub peers: Vec<PathBuf>,
}

impl StoreConfig {
    pub fn new(devices: Vec<PathBuf>) -> Self {
        StoreConfig {
            devices,
            mode: OpenMode::default(),
            backend: BackendChoice::default(),
            node_id: 0,
            cluster_id: 0,
            capacity_pages: 0,
            allow_unclean: false,
            discard_damaged_log: false,
            wal: None,
            cluster: None,
            page_home: None,
        }
    }
}

/// A write of one page image into a slot. The store seals the image (trailer) before writing.
pub struct WriteRequest<'a> {
    pub slot: u64,
    pub pid: u64,
    pub page: &'a mut AlignedPage,
}

/// A read of one page: `slot` into `dst` (page aligned, [`PAGE_SIZE`] bytes), which must then
/// hold `pid`.
pub struct ReadRequest {
    pub slot: u64,
    pub pid: u64,
    pub dst: *mut u8,
}

/// Counters of one store (monotonic).
#[derive(Debug, Default)]
pub struct StoreStats {
    pub reads: AtomicU64,
    /// Calls of [`PageStore::read_batch`] with at least one request: reads submitted together
    /// (in one io_uring submission on that backend).
    pub read_batches: AtomicU64,
    pub writes: AtomicU64,
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
}

/// Device files grow in chunks of this many bytes, preallocated with `fallocate`: an O_DIRECT
/// write that extends a file takes ext4's inode lock exclusively and is serialised, while a
/// write inside the file's size runs in parallel with the others.
pub const GROW_CHUNK: u64 = 64 << 20;
/// Room reserved by writing zeros (file systems without `fallocate`) grows this much at a time.
pub const WRITE_CHUNK: u64 = 1 << 20;

/// One node's page store.
pub struct PageStore {
    devices: Vec<Device>,
    backend: Backend,
    alloc: Mutex<Allocator>,
    sb: Mutex<Superblock>,
    /// Pages at the start of each device holding superblock copies (2, or 1 in format 1).
    header: u64,
    stats: StoreStats,
    closed: AtomicBool,
    /// Opened after an unclean shutdown (with `allow_unclean`).
    opened_unclean: bool,
    /// The log file, from open until the engine takes it ([`PageStore::take_log`]).
    log: Option<LogFile>,
    /// The store runs with a log: every allocation and free is recorded in it
    /// ([`PageStore::set_slot_log`]).
    logged: bool,
    /// Where allocations and frees are recorded (the engine's log), once set.
    slot_log: Option<Arc<dyn SlotLog>>,
    /// What recovery replayed at open (None: nothing to recover).
    replayed: Option<Replay>,
}

/// Where the store records the slots it hands out and takes back: the write-ahead log, kept
/// by the engine. Called under the allocator's lock, so log order is allocation order.
pub trait SlotLog: Send + Sync {
    /// Record `change`; an error refuses the allocation (or reports the free's failure).
    fn record(&self, change: SlotChange) -> StoreResult<()>;
}

/// A change to the allocator that the log records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotChange {
    Allocated(u64),
    Freed(u64),
}

/// What the engine takes from a store opened with a log ([`PageStore::take_log`]).
#[derive(Debug)]
pub struct OpenedLog {
    /// The log file, continued after whatever it held.
    pub file: LogFile,
}

/// Most devices one store stripes over.
pub const MAX_DEVICES: usize = 64;
/// Suffix of a file being created, until it is renamed into place.
pub const CREATING: &str = ".creating";

/// Whether a file named `name` is what a store creation that never finished can leave: a
/// file still under its temporary name (`<file>.creating`), or the write-ahead log's allocator
/// snapshot files beside one (`<file>.creating.alloc0` and `.alloc1`, `wal::disk::alloc_path`).
/// A new creation replaces them.
pub fn creation_leftover(name: &str) -> bool {
    let file = name
        .strip_suffix(".alloc0")
        .or_else(|| name.strip_suffix(".alloc1"))
        .unwrap_or(name);
    file.ends_with(CREATING)
}

impl PageStore {
    /// Open or create a store as `cfg` says.
    pub fn open(cfg: &StoreConfig) -> StoreResult<PageStore> {
        if cfg.devices.is_empty() || cfg.devices.len() > MAX_DEVICES {
            return Err(StoreError::Config(format!(
                "a store needs 1 to {MAX_DEVICES} devices, got {}",
                cfg.devices.len()
            )));
        }
        let backend = io::choose(cfg.backend).map_err(|e| {
            StoreError::Config(format!("io_uring was required but cannot be set up: {e}"))
        })?;
        let first = &cfg.devices[0];
        let has_store = match std::fs::metadata(first) {
            Ok(m) => m.file_type().is_block_device() || m.len() > 0,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(io_err(first, e)),
        };
        let create = match cfg.mode {
            OpenMode::Create => true,
            OpenMode::Open => false,
            OpenMode::OpenOrCreate => !has_store,
        };
        if !create && !has_store {
            return Err(StoreError::NotAStore {
                path: first.clone(),
                why: "the device does not exist or is empty".into(),
            });
        }
        let names: Vec<String> = cfg
            .devices
            .iter()
            .map(|p| {
                p.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| p.display().to_string())
            })
            .collect();
        if create {
            Self::create(cfg, backend, names)?;
        } else {
            complete_creation(cfg)?;
        }
        let mut devices = Vec::with_capacity(cfg.devices.len());
        for p in &cfg.devices {
            devices.push(open_device(p)?);
        }
        let store = Self::load(devices, backend, cfg)?;
        // (one lock: two in one format call would be held together and deadlock)
        let (allocated, free) = {
            let a = store.alloc.lock();
            (a.next_slot(), a.free_slots().len())
        };
        log::info!(
            "page store on {} device(s) via {}: {allocated} slots allocated, {free} free",
            store.devices.len(),
            store.backend,
        );
        Ok(store)
    }

    fn load(devices: Vec<Device>, backend: Backend, cfg: &StoreConfig) -> StoreResult<PageStore> {
        let paths: Vec<&Path> = devices.iter().map(|d| d.path.as_path()).collect();
        let mut aligned = AlignedPage::new();
        let chosen = superblock::choose(&paths, |d, page, buf| {
            let n = read_raw(backend, &devices[d], page * PAGE_SIZE as u64, &mut aligned)?;
            buf.copy_from_slice(&aligned[..]);
            Ok(n)
        })?;
        check_device_set(&chosen.per_device, &paths)?;
        let mut sb0 = chosen.superblock.clone();
        // format 3 records whether the store last ran with a log; older ones do not say
        let logged_known = sb0.format_version >= 3;
        if sb0.format_version == 2 {
            // same layout of slots; the superblocks gain a store id (written below)
            sb0.format_version = FORMAT_VERSION;
            sb0.store_id = superblock::new_store_id();
            log::info!(
                "{}: superblocks of format 2 are rewritten as format {FORMAT_VERSION} (store id \
                 {:#018x})",
                devices[0].path.display(),
                sb0.store_id
            );
        }
        for (path, copies) in paths.iter().zip(&chosen.copies) {
            if copies.needs_repair(sb0.generation) {
                log::warn!(
                    "{}: superblock {copies}; rewriting every copy from generation {}",
                    path.display(),
                    sb0.generation
                );
            }
        }
        if sb0.node_id != cfg.node_id || sb0.cluster_id != cfg.cluster_id {
            return Err(StoreError::DeviceMismatch(format!(
                "{} holds the store of node {} in cluster {}, but this is node {} of cluster {}",
                devices[0].path.display(),
                sb0.node_id,
                sb0.cluster_id,
                cfg.node_id,
                cfg.cluster_id
            )));
        }
        let mut store = PageStore {
            alloc: Mutex::new(Allocator::default()),
            devices,
            backend,
            header: header_pages(sb0.format_version),
            sb: Mutex::new(sb0.clone()),
            stats: StoreStats::default(),
            closed: AtomicBool::new(false),
            opened_unclean: false,
            log: None,
            logged: cfg.wal.is_some(),
            slot_log: None,
            replayed: None,
        };
        let log_path = cfg
            .wal
            .as_ref()
            .map(|w| w.path.clone())
            .unwrap_or_else(|| default_log_path(&store.devices[0].path));
        let mut log_exists = log_path.exists();
        if log_exists && logged_known && !sb0.logged {
            // The store last ran without a log (which deleted this one, but the deletion did
            // not survive a crash): the log is older than the pages, and replaying it would
            // put old images over newer changes.
            log::warn!(
                "{}: a write-ahead log from before the store last ran without one",
                log_path.display()
            );
            remove_log(&log_path);
            log_exists = false;
        }
        if !sb0.clean {
            let store_path = store.devices[0].path.clone();
            match (&cfg.wal, log_exists) {
                (None, true) => {
                    return Err(StoreError::NeedsRecovery {
                        store: store_path,
                        path: log_path,
                    })
                }
                (_, false) if sb0.logged => {
                    return Err(StoreError::LogMissing {
                        store: store_path,
                        path: log_path,
                    })
                }
                _ => {}
            }
        }
        let recoverable = !sb0.clean && cfg.wal.is_some() && log_exists;
        let alloc = if sb0.clean {
            store.check_lengths(sb0.next_slot)?;
            let free = store.read_freelist(sb0.freelist_head, sb0.freelist_len)?;
            Allocator::new(sb0.next_slot, free, sb0.capacity)
        } else if recoverable {
            // replaced by the log's snapshot in `attach_log`
            Allocator::new(sb0.next_slot, Vec::new(), sb0.capacity)
        } else if cfg.allow_unclean {
            // Slots beyond the recorded high-water mark may have been written since; derive the
            // mark from the device sizes so no written slot is handed out again (preallocated
            // space counts too, which only leaks slots). Freed slots of the lost session are
            // leaked, never double-allocated.
            let lens: Vec<u64> = store
                .devices
                .iter()
                .map(|d| d.file.metadata().map(|m| m.len()).unwrap_or(0))
                .collect();
            let next = mark_from_lengths(sb0.next_slot, &lens, store.header);
            let skipped = next - sb0.next_slot;
            log::warn!(
                "{} was not shut down cleanly; opening anyway: changes not written back before \
                 the crash are lost; {skipped} slots ({} MiB) past the recorded allocator mark \
                 {} are given up (the crashed run may have written pages there, and a written-back \
                 page may point at them), as are the {} slots of the free list",
                store.devices[0].path.display(),
                (skipped * PAGE_SIZE as u64) >> 20,
                sb0.next_slot,
                sb0.freelist_len
            );
            store.opened_unclean = true;
            Allocator::new(next, Vec::new(), sb0.capacity)
        } else {
            return Err(StoreError::Unclean {
                path: store.devices[0].path.clone(),
            });
        };
        *store.alloc.get_mut() = alloc;
        store.attach_log(cfg, recoverable)?;
        // Mark the store open (unclean) until close, and whether it runs with a log.
        let sb = store.sb.get_mut();
        sb.clean = false;
        sb.logged = cfg.wal.is_some();
        store.write_superblocks()?;
        Ok(store)
    }

    /// Every device must hold the slots below `next_slot` that stripe onto it: a device file
    /// cut short has lost pages, and opening it would make them "never written".
    fn check_lengths(&self, next_slot: u64) -> StoreResult<()> {
        let n = self.devices.len() as u64;
        for (i, d) in self.devices.iter().enumerate() {
            if !d.regular {
                continue;
            }
            let needed = device_bytes_needed(next_slot, n, i as u64, self.header);
            let len = d.file.metadata().map_err(|e| io_err(&d.path, e))?.len();
            if len < needed {
                return Err(StoreError::Truncated {
                    path: d.path.clone(),
                    len,
                    needed,
                    slots: next_slot,
                });
            }
        }
        Ok(())
    }

    /// Take the log file a store opened with a log holds (once; `None` without a log or
    /// after the first call). The caller must [`PageStore::set_slot_log`] before the next
    /// allocation.
    pub fn take_log(&mut self) -> Option<OpenedLog> {
        let file = self.log.take()?;
        Some(OpenedLog { file })
    }

    /// Record every allocation and free in `log` from now on (a store opened with a log
    /// refuses to allocate until this is set).
    pub fn set_slot_log(&mut self, log: Arc<dyn SlotLog>) {
        assert!(self.logged, "a slot log for a store opened without a log");
        self.slot_log = Some(log);
    }

    /// What recovery replayed at open, if the store was recovered.
    pub fn replayed(&self) -> Option<&Replay> {
        self.replayed.as_ref()
    }

    /// A copy of the allocator, and `also()` evaluated under the same lock: every allocation
    /// and free the copy reflects was recorded in the slot log before `also` runs (a
    /// checkpoint reads the log's tail there).
    pub fn allocator_snapshot<T>(&self, also: impl FnOnce() -> T) -> (Allocator, T) {
        let a = self.alloc.lock();
        let t = also();
        (a.clone(), t)
    }

    fn read_freelist(&self, head: u64, len: u64) -> StoreResult<Vec<u64>> {
        walk_freelist(head, len, &self.devices[0].path, |slot, buf| {
            // SAFETY: buf is an exclusively borrowed aligned page.
            unsafe { self.read_into(slot, FREELIST_PID, buf.as_mut_ptr()) }
        })
    }

    /// Write every superblock copy of every device with the next generation: copy 0, sync,
    /// copy 1, sync, device by device, so that a crash leaves at least one intact copy per
    /// device (see [`superblock`]).
    fn write_superblocks(&self) -> StoreResult<()> {
        let mut buf = AlignedPage::new();
        let mut sb = {
            let mut sb = self.sb.lock();
            sb.generation += 1;
            sb.clone()
        };
        for (i, d) in self.devices.iter().enumerate() {
            sb.device_index = i as u32;
            sb.encode(&mut buf)?;
            for copy in 0..self.header {
                write_raw(self.backend, d, copy * PAGE_SIZE as u64, &mut buf, 0)?;
                crate::fs::sync_data(&d.file, &d.path).map_err(|e| io_err(&d.path, e))?;
            }
        }
        Ok(())
    }

    /// The on-disk format of this store (see [`superblock::FORMAT_VERSION`]).
    pub fn format_version(&self) -> u32 {
        self.sb.lock().format_version
    }

    /// The store was opened after an unclean shutdown (`allow_unclean`): changes not written
    /// back before it are lost.
    pub fn opened_unclean(&self) -> bool {
        self.opened_unclean
    }

    /// Which device and byte offset hold `slot`.
    pub fn slot_location(&self, slot: u64) -> (usize, u64) {
        let n = self.devices.len() as u64;
        (
            (slot % n) as usize,
            (self.header + slot / n) * PAGE_SIZE as u64,
        )
    }

    /// Paths of the devices, in stripe order.
    pub fn device_paths(&self) -> Vec<&Path> {
        self.devices.iter().map(|d| d.path.as_path()).collect()
    }

    /// Whether every device is open with O_DIRECT.
    pub fn direct_io(&self) -> bool {
        self.devices.iter().all(|d| d.direct)
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    /// Read the page in `slot` into `dst` and verify that it is intact and holds `pid`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of [`PAGE_SIZE`] bytes, aligned to [`PAGE_SIZE`], and no
    /// Rust code may write those bytes until this returns (the kernel writes them).
    pub unsafe fn read_into(&self, slot: u64, pid: u64, dst: *mut u8) -> StoreResult<()> {
        let req = ReadRequest { slot, pid, dst };
        // SAFETY: forwarded from this function's contract.
        let mut r = unsafe { self.read_batch(std::slice::from_ref(&req)) };
        r.pop().expect("one result per request")
    }

    /// Read a batch of pages, all in flight together, verifying each like [`Self::read_into`].
    /// One result per request.
    ///
    /// # Safety
    /// Every request's `dst` must satisfy [`Self::read_into`]'s contract, and no two requests
    /// may share a destination.
    pub unsafe fn read_batch(&self, reqs: &[ReadRequest]) -> Vec<StoreResult<()>> {
        let ops: Vec<IoOp> = reqs
            .iter()
            .map(|r| {
                let (dev, off) = self.slot_location(r.slot);
                IoOp {
                    fd: self.devices[dev].file.as_raw_fd(),
                    offset: off,
                    buf: r.dst,
                    len: PAGE_SIZE as u32,
                    write: false,
                }
            })
            .collect();
        let mut res = vec![0i64; ops.len()];
        // SAFETY: forwarded from this function's contract.
        unsafe { io::run_batch(self.backend, &ops, &mut res) };
        self.stats
            .reads
            .fetch_add(reqs.len() as u64, Ordering::Relaxed);
        if !reqs.is_empty() {
            self.stats.read_batches.fetch_add(1, Ordering::Relaxed);
        }
        reqs.iter()
            .zip(res)
            .map(|(req, r)| {
                // SAFETY: the batch is complete; `dst` is ours per the contract.
                let out = unsafe { self.check_read(req, r) };
                if out.is_err() {
                    self.stats.read_errors.fetch_add(1, Ordering::Relaxed);
                }
                out
            })
            .collect()
    }

    /// Judge a finished read of `req` that returned `r` (bytes or `-errno`).
    ///
    /// # Safety
    /// `req.dst` is valid for reads and writes of [`PAGE_SIZE`] bytes (the read's destination,
    /// see [`Self::read_into`]) and nothing else reads or writes them now.
    unsafe fn check_read(&self, req: &ReadRequest, r: i64) -> StoreResult<()> {
        let (slot, pid) = (req.slot, req.pid);
        let path = &self.devices[self.slot_location(slot).0].path;
        if r < 0 {
            return Err(io_err(path, std::io::Error::from_raw_os_error(-r as i32)));
        }
        if (r as usize) < PAGE_SIZE {
            return Err(StoreError::NeverWritten {
                pid,
                slot,
                path: path.clone(),
                got: r as usize,
            });
        }
        // SAFETY: the read filled all PAGE_SIZE bytes of dst, which is ours (the caller's
        // buffer for this read); nothing else reads or writes them now.
        let page = unsafe { &mut *(req.dst as *mut [u8; PAGE_SIZE]) };
        crate::page::verify_and_upgrade(page, pid, slot, path).map_err(|e| {
            if page.iter().all(|&b| b == 0) {
                // preallocated space that no write reached
                StoreError::NeverWritten {
                    pid,
                    slot,
                    path: path.clone(),
                    got: PAGE_SIZE,
                }
            } else {
                e
            }
        })
    }

    /// Seal and write a batch of pages with `pwrite`, whatever the store's backend; pages in
    /// neighbouring slots of one device go out as one `pwritev` (`io::write_runs`). One
    /// result per request.
    ///
    /// Why not io_uring (2026-11-24, issue 22): with both cores saturated, io_uring write-backs
    /// of 10-17 O_DIRECT pages were delayed by seconds, on cluster nodes until a remote wait
    /// gave up (3 s or 30 s, whichever was set), on a single node past the 10 s free-frame
    /// timeout (`btree/tests/concurrent.rs` failed 2 of 3 runs beside 3 busy loops); the
    /// provider frees no dirty frame until its batch is written, so everything waiting for a
    /// frame waited with it. With pwrite the same runs passed. Reads keep the backend (their
    /// batches overlap cache misses).
    pub fn write_batch(&self, reqs: &mut [WriteRequest<'_>]) -> Vec<StoreResult<()>> {
        let mut ops = Vec::with_capacity(reqs.len());
        for r in reqs.iter_mut() {
            seal(r.page, r.pid);
            let (dev, off) = self.slot_location(r.slot);
            ops.push(IoOp {
                fd: self.devices[dev].file.as_raw_fd(),
                offset: off,
                buf: r.page.as_mut_ptr(),
                len: PAGE_SIZE as u32,
                write: true,
            });
        }
        let mut res = vec![0i64; ops.len()];
        // SAFETY: each buffer is an AlignedPage borrowed mutably by `reqs` for this call.
        unsafe { io::write_runs(&ops, &mut res) };
        self.stats
            .writes
            .fetch_add(reqs.len() as u64, Ordering::Relaxed);
        reqs.iter()
            .zip(res)
            .map(|(r, n)| {
                let (dev, off) = self.slot_location(r.slot);
                let path = &self.devices[dev].path;
                if n == PAGE_SIZE as i64 {
                    crate::fs::wrote(path, off, &r.page[..]);
                    return Ok(());
                }
                self.stats.write_errors.fetch_add(1, Ordering::Relaxed);
                let e = if n < 0 {
                    std::io::Error::from_raw_os_error(-n as i32)
                } else {
                    std::io::Error::new(
                        std::io::ErrorKind::WriteZero,
                        format!("short write ({n} bytes)"),
                    )
                };
                Err(classify_write_error(path, r.slot, e))
            })
            .collect()
    }

    /// Make all completed writes durable.
    pub fn sync(&self) -> StoreResult<()> {
        for d in &self.devices {
            crate::fs::sync_data(&d.file, &d.path).map_err(|e| io_err(&d.path, e))?;
        }
        Ok(())
    }

    /// Persist the allocator and mark the store cleanly closed. The caller must have written
    /// every dirty page first (and, with a log, finished a last checkpoint, so that the next
    /// open finds the log's end at once). Idempotent.
    pub fn close(&self) -> StoreResult<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let alloc = self.alloc.lock().clone();
        let chain = alloc.chain_pages();
        let mut bufs: Vec<AlignedPage> = chain.iter().map(|_| AlignedPage::new()).collect();
        for ((_, next, entries), b) in chain.iter().zip(bufs.iter_mut()) {
            encode_chain_page(&mut b[..], *next, entries);
        }
        let mut reqs: Vec<WriteRequest<'_>> = chain
            .iter()
            .zip(bufs.iter_mut())
            .map(|((home, _, _), page)| WriteRequest {
                slot: *home,
                pid: FREELIST_PID,
                page,
            })
            .collect();
        let r = self
            .write_batch(&mut reqs)
            .into_iter()
            .collect::<StoreResult<Vec<()>>>();
        if let Err(e) = r {
            self.closed.store(false, Ordering::Release);
            return Err(e);
        }
        self.sync()?;
        {
            let mut sb = self.sb.lock();
            sb.next_slot = alloc.next_slot();
            sb.freelist_head = chain.first().map(|c| c.0).unwrap_or(NO_SLOT);
            sb.freelist_len = alloc.free_slots().len() as u64;
            sb.clean = true;
        }
        self.write_superblocks()
    }
}

impl Drop for PageStore {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::Acquire) {
            log::debug!(
                "page store on {} dropped without close(): it will open as unclean",
                self.devices[0].path.display()
            );
        }
    }
}
