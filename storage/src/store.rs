//! [`PageStore`]: page slots striped over one or more devices.
//!
//! Slot `s` lives on device `s % n` at byte offset `(1 + s / n) * PAGE_SIZE`; page 0 of every
//! device is its superblock. Files are opened with O_DIRECT (falling back to buffered I/O with a
//! warning where the file system refuses it).

use crate::allocator::{decode_chain_page, encode_chain_page, Allocator, NO_SLOT};
use crate::error::{StoreError, StoreResult};
use crate::io::{self, fallocate, is_full, Backend, BackendChoice, IoOp};
use crate::page::{seal, verify, AlignedPage, PAGE_DATA_SIZE, PAGE_SIZE};
use crate::superblock::{self, header_pages, Superblock, FORMAT_VERSION, FREELIST_PID};
use crate::wal::disk::alloc_path;
use crate::wal::record::{apply_diff, rec, slot_pid as wal_slot_pid};
use crate::wal::{self, Replay, Wal};
use parking_lot::Mutex;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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

struct Device {
    path: PathBuf,
    file: File,
    direct: bool,
    /// Bytes of the device with room reserved: the file's size at open, then what was
    /// reserved (regular files only).
    extent: AtomicU64,
    regular: bool,
    /// Reserve room by writing zero pages instead of `fallocate` (set when `fallocate` is not
    /// supported, or by `SHOAL_RESERVE_BY_WRITING=1`).
    by_writing: AtomicBool,
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
    wal: Option<Wal>,
    /// What recovery replayed at open (None: nothing to recover).
    replayed: Option<Replay>,
    /// Transactions the crash cut off (undo records, no end record), not rolled back yet,
    /// and the LSN where their undo records were carried into the resumed log.
    unfinished: Mutex<(Vec<Unfinished>, Option<u64>)>,
}

/// A transaction a crash cut off: its undo records, oldest first (the layer that wrote them
/// rolls it back: newest first).
#[derive(Debug, Clone)]
pub struct Unfinished {
    pub txn: u64,
    pub undo: Vec<Vec<u8>>,
}

/// Most devices one store stripes over.
pub const MAX_DEVICES: usize = 64;
/// Suffix of a file being created, until it is renamed into place.
pub const CREATING: &str = ".creating";

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

    /// Create a new store, atomically: every file is written whole under a temporary name
    /// (`<name>.creating`) and synced, then device 0 is renamed into place (the commit point)
    /// and the others after it, each directory synced. A crash before the commit leaves no
    /// store (the next creation overwrites the temporary files); after it, the open that
    /// follows finishes the renames ([`complete_creation`]). The new store is clean and empty;
    /// it is then opened like any other. Block devices cannot be renamed: their superblocks are
    /// written in place, device 0's last.
    fn create(cfg: &StoreConfig, backend: Backend, names: Vec<String>) -> StoreResult<()> {
        let mut buf = AlignedPage::new();
        for p in &cfg.devices {
            check_device_path(p)?;
            // Refuse to format over data that looks like a store (either copy).
            if let Ok(d) = open_device(p) {
                if d.file.metadata().map(|m| m.len()).unwrap_or(0) > 0 {
                    for copy in 0..header_pages(FORMAT_VERSION) {
                        let n = read_raw(backend, &d, copy * PAGE_SIZE as u64, &mut buf);
                        if matches!(n, Ok(n) if n == PAGE_SIZE)
                            && buf[0..8] == crate::superblock::MAGIC
                        {
                            return Err(StoreError::AlreadyExists { path: p.clone() });
                        }
                    }
                }
            }
        }
        if let Some(w) = &cfg.wal {
            if w.path.exists() {
                return Err(StoreError::Config(format!(
                    "{} is a write-ahead log, but {} holds no store: refusing to create a store \
                     over a log that may belong to one (move the log away if it is not needed)",
                    w.path.display(),
                    cfg.devices[0].display()
                )));
            }
        }
        let id = superblock::new_store_id();
        let mut sb = Superblock {
            format_version: FORMAT_VERSION,
            page_size: PAGE_SIZE as u32,
            cluster_id: cfg.cluster_id,
            node_id: cfg.node_id,
            device_count: cfg.devices.len() as u32,
            device_index: 0,
            clean: true,
            next_slot: 0,
            freelist_head: NO_SLOT,
            freelist_len: 0,
            capacity: cfg.capacity_pages,
            generation: 1,
            store_id: id,
            logged: cfg.wal.is_some(),
            device_names: names,
        };
        // (temporary path, final path), device 0 first
        let mut moves: Vec<(PathBuf, PathBuf)> = Vec::new();
        let mut in_place: Vec<(usize, PathBuf)> = Vec::new();
        for (i, p) in cfg.devices.iter().enumerate() {
            let block = std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device());
            sb.device_index = i as u32;
            sb.encode(&mut buf)?;
            if block {
                in_place.push((i, p.clone()));
                continue;
            }
            let tmp = crate::fs::with_suffix(p, CREATING);
            let write = || -> std::io::Result<()> {
                let f = crate::fs::create(&tmp)?;
                for copy in 0..header_pages(FORMAT_VERSION) {
                    crate::fs::write_at(&f, &tmp, &buf[..], copy * PAGE_SIZE as u64)?;
                }
                crate::fs::sync_all(&f, &tmp)
            };
            write().map_err(|e| io_err(&tmp, e))?;
            moves.push((tmp, p.clone()));
        }
        if let Some(w) = &cfg.wal {
            moves.extend(make_log(
                w,
                id,
                &Allocator::new(0, Vec::new(), cfg.capacity_pages),
            )?);
        }
        let dirs = |ps: &mut dyn Iterator<Item = &Path>| -> StoreResult<()> {
            let mut seen = std::collections::BTreeSet::new();
            for p in ps {
                let d = p.parent().unwrap_or(Path::new(".")).to_path_buf();
                if seen.insert(d.clone()) {
                    crate::fs::sync_dir(&d).map_err(|e| io_err(&d, e))?;
                }
            }
            Ok(())
        };
        // the temporary files are durable before any of them takes its name
        dirs(&mut moves.iter().map(|(t, _)| t.as_path()))?;
        // block devices: device 0's superblocks last (its copies are what makes a store)
        in_place.sort_by_key(|(i, _)| *i == 0);
        for (i, p) in &in_place {
            let d = open_device(p)?;
            sb.device_index = *i as u32;
            sb.encode(&mut buf)?;
            for copy in 0..header_pages(FORMAT_VERSION) {
                write_raw(backend, &d, copy * PAGE_SIZE as u64, &mut buf, 0)?;
                crate::fs::sync_data(&d.file, p).map_err(|e| io_err(p, e))?;
            }
        }
        let rename = |(from, to): &(PathBuf, PathBuf)| -> StoreResult<()> {
            crate::fs::rename(from, to).map_err(|e| io_err(to, e))?;
            crate::fs::sync_parent(to).map_err(|e| io_err(to, e))
        };
        if let Some(first) = moves.iter().find(|(_, to)| to == &cfg.devices[0]) {
            rename(first)?; // the commit point
        }
        for m in moves.iter().filter(|(_, to)| to != &cfg.devices[0]) {
            rename(m)?;
        }
        log::info!(
            "created a store on {} (store id {id:#018x})",
            cfg.devices[0].display()
        );
        Ok(())
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
            wal: None,
            replayed: None,
            unfinished: Mutex::new((Vec::new(), None)),
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

    /// Set up the write-ahead log `cfg.wal` names: recover from it first if the store was not
    /// closed cleanly (`recover`), continue it if it exists, create it if not. Without a log,
    /// delete one an earlier run left (it no longer describes the store; the store is clean,
    /// `load` refuses an unclean one whose log recovery needs).
    fn attach_log(&mut self, cfg: &StoreConfig, recover: bool) -> StoreResult<()> {
        let Some(wc) = &cfg.wal else {
            if let Some(p) = cfg.devices.first().map(|d| default_log_path(d)) {
                remove_log(&p);
            }
            return Ok(());
        };
        let id = self.sb.get_mut().store_id;
        if !wc.path.exists() {
            // a clean store opened with a log for the first time
            self.wal = Some(self.new_log(wc)?);
            return Ok(());
        }
        let (found, file) = wal::read_existing(&wc.path, true)?;
        if found.older_format().is_none() && found.store_id() != id {
            return Err(StoreError::ForeignLog {
                path: wc.path.clone(),
                found: found.store_id(),
                expected: id,
            });
        }
        if !recover {
            // A clean store: its log holds nothing to replay (the last checkpoint of a clean
            // close is its end); continue after what is there. A log this build does not
            // read, or a damaged one, is replaced: the store needs nothing from it.
            let end =
                match found.older_format() {
                    Some(f) => Err(format!("it is in the older format {f}")),
                    None => {
                        match wal::scan(&wc.path, &file, &found, wal::ScanMode::End, |_, _, _| {
                            Ok(())
                        }) {
                            Ok(sc) => Ok(sc.end),
                            Err(e @ StoreError::LogDamaged { .. }) => Err(e.to_string()),
                            Err(e) => return Err(e),
                        }
                    }
                };
            let alloc = self.alloc.lock().clone();
            self.wal = Some(match end {
                Ok(end) => Wal::resume(wc, file, &found, end, &alloc)?,
                Err(why) => {
                    log::warn!(
                        "{}: the store is clean, so its log is replaced by a new one ({why})",
                        wc.path.display()
                    );
                    drop(file);
                    self.new_log(wc)?
                }
            });
            return Ok(());
        }
        let mut alloc = wal::read_alloc(&wc.path, &found, self.sb.get_mut().capacity)?;
        self.check_lengths(alloc.next_slot())?;
        let mut images: std::collections::HashMap<u64, (u64, AlignedPage)> =
            std::collections::HashMap::new();
        // transactions seen (first LSN -> undo records), in order of their first record
        let mut txns: std::collections::BTreeMap<u64, Vec<Vec<u8>>> = Default::default();
        let redo_lsn = found.redo_lsn();
        let mode = if cfg.discard_damaged_log {
            wal::ScanMode::DiscardDamage
        } else {
            wal::ScanMode::Judge
        };
        let scanned = wal::scan(&wc.path, &file, &found, mode, |lsn, kind, body| {
            // before the redo point (kept for transactions running at the checkpoint) only
            // transactions' records count: the pages were written back by the checkpoint
            if lsn < redo_lsn && kind != rec::UNDO && kind != rec::END {
                return Ok(());
            }
            match kind {
                rec::IMAGE => {
                    let (slot, pid) = wal_slot_pid(body);
                    let mut page = AlignedPage::new();
                    page[..PAGE_DATA_SIZE].copy_from_slice(&body[16..16 + PAGE_DATA_SIZE]);
                    images.insert(slot, (pid, page));
                }
                rec::DIFF => {
                    let (slot, _) = wal_slot_pid(body);
                    let Some((_, page)) = images.get_mut(&slot) else {
                        return Err(StoreError::BadLog {
                            path: wc.path.clone(),
                            why: format!(
                                "the change at LSN {lsn} to slot {slot} has no page image before it since the redo point (the log breaks its own rule)"
                            ),
                        });
                    };
                    apply_diff(body, &mut page[..PAGE_DATA_SIZE]);
                }
                rec::ALLOC => alloc
                    .replay_allocated(u64::from_le_bytes(body[..8].try_into().expect("8 bytes"))),
                rec::FREE => {
                    let slot = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
                    images.remove(&slot);
                    alloc.replay_freed(slot);
                }
                rec::UNDO => {
                    let txn = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
                    // 0: the transaction begins in this chunk, whose LSN is its id
                    let id = if txn == 0 { lsn } else { txn };
                    txns.entry(id).or_default().push(body[12..].to_vec());
                }
                rec::END => {
                    txns.remove(&u64::from_le_bytes(body[..8].try_into().expect("8 bytes")));
                }
                _ => {}
            }
            Ok(())
        })?;
        let end = scanned.end;
        let mut replay = scanned.replay;
        replay.end = Some(scanned.how.clone());
        if let wal::LogEnd::Discarded { lsn, why } = &scanned.how {
            log::warn!(
                "{}: the log is damaged at LSN {lsn}; as asked (discard_damaged_log), recovery \
                 replays up to it and gives up everything after it: {why}",
                wc.path.display()
            );
        }
        if let wal::LogEnd::TornTail { lsn, flush } = &scanned.how {
            log::warn!(
                "{}: the log's last flush (number {flush}) was cut off by the crash at LSN {lsn}: \
                 its writes reached the device only in part, so it was never acknowledged; what \
                 follows LSN {lsn} is not replayed",
                wc.path.display()
            );
        }
        // write the replayed pages, a batch at a time, then make them durable
        let mut all: Vec<(u64, (u64, AlignedPage))> = images.into_iter().collect();
        all.sort_unstable_by_key(|(slot, _)| *slot);
        replay.pages = all.len() as u64;
        for batch in all.chunks_mut(64) {
            let mut reqs: Vec<WriteRequest<'_>> = batch
                .iter_mut()
                .map(|(slot, (pid, page))| WriteRequest {
                    slot: *slot,
                    pid: *pid,
                    page,
                })
                .collect();
            for r in self.write_batch(&mut reqs) {
                r?;
            }
        }
        self.sync()?;
        *self.alloc.get_mut() = alloc.clone();
        let wal = Wal::resume(wc, file, &found, end, &alloc)?;
        // Carry the undo records of the transactions the crash cut off into the resumed log
        // (the old part is no longer read): if the engine stops again before they are rolled
        // back, the next recovery finds them there.
        let unfinished: Vec<Unfinished> = txns
            .into_iter()
            .map(|(txn, undo)| Unfinished { txn, undo })
            .collect();
        let mut carried = None;
        let mut buf = Vec::new();
        for u in &unfinished {
            carried.get_or_insert(wal.tail());
            wal.append(&mut buf, |_, b| {
                for r in &u.undo {
                    crate::wal::put_undo(b, u.txn, r);
                }
            })?;
        }
        if carried.is_some() {
            wal.flush_all()?;
            log::warn!(
                "{}: {} transaction(s) were cut off by the crash; they must be rolled back \
                 (PageStore::unfinished)",
                self.devices[0].path.display(),
                unfinished.len()
            );
        }
        *self.unfinished.get_mut() = (unfinished, carried);
        self.wal = Some(wal);
        log::warn!(
            "{} was not shut down cleanly: recovered from its log: {} chunks ({} records, {:.1} MiB) replayed into {} pages in {:.2} s",
            self.devices[0].path.display(),
            replay.chunks,
            replay.records,
            replay.log_bytes as f64 / (1u64 << 20) as f64,
            replay.pages,
            replay.seconds
        );
        self.replayed = Some(replay);
        Ok(())
    }

    /// Make a new log for this (clean) store: created under a temporary name and renamed
    /// into place (over an old log, if any), the directory synced.
    fn new_log(&mut self, wc: &crate::wal::WalConfig) -> StoreResult<Wal> {
        let id = self.sb.get_mut().store_id;
        let alloc = self.alloc.lock().clone();
        for (from, to) in make_log(wc, id, &alloc)? {
            crate::fs::rename(&from, &to).map_err(|e| io_err(&to, e))?;
        }
        crate::fs::sync_parent(&wc.path).map_err(|e| io_err(&wc.path, e))?;
        let (found, file) = wal::read_existing(&wc.path, true)?;
        let sc = wal::scan(
            &wc.path,
            &file,
            &found,
            wal::ScanMode::End,
            |_, _, _| Ok(()),
        )?;
        Wal::resume(wc, file, &found, sc.end, &alloc)
    }

    /// The write-ahead log, if the store has one.
    pub fn wal(&self) -> Option<&Wal> {
        self.wal.as_ref()
    }

    /// The transactions a crash cut off, found by recovery at open and not rolled back yet.
    pub fn unfinished(&self) -> Vec<Unfinished> {
        self.unfinished.lock().0.clone()
    }

    /// The caller rolled back every transaction [`PageStore::unfinished`] returned and logged
    /// their end records durably: the log need not keep their undo records any more.
    pub fn unfinished_resolved(&self) {
        *self.unfinished.lock() = (Vec::new(), None);
    }

    /// What recovery replayed at open, if the store was recovered.
    pub fn replayed(&self) -> Option<&Replay> {
        self.replayed.as_ref()
    }

    /// Begin a checkpoint (see [`Wal::begin_checkpoint`]); None without a log.
    pub fn begin_checkpoint(&self) -> StoreResult<Option<u64>> {
        self.wal.as_ref().map(|w| w.begin_checkpoint()).transpose()
    }

    /// Finish the checkpoint begun at `c`: the caller has written back every page dirty at `c`.
    /// Syncs the devices, then records the allocator (after the log holding every allocation
    /// it reflects is durable) and the new redo point. `oldest`: see [`Wal::finish_checkpoint`].
    pub fn finish_checkpoint(&self, c: u64, oldest: Option<u64>) -> StoreResult<()> {
        let Some(w) = &self.wal else {
            return Ok(());
        };
        self.sync()?;
        let (alloc, upto) = {
            let a = self.alloc.lock();
            // every allocation and free reflected in `a` was logged under this lock, before
            // the tail read here
            (a.clone(), w.tail())
        };
        w.flush_to(upto)?;
        // unfinished transactions' undo records carried at open stay readable until resolved
        let carried = self.unfinished.lock().1;
        let oldest = match (oldest, carried) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        w.finish_checkpoint(c, oldest, &alloc)
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

    /// Allocate a page slot, with room for it on its device: a slot is handed out only once
    /// the device space it will be written to is reserved (`fallocate`), so a full device
    /// refuses the allocation ([`StoreError::NoRoom`]) instead of failing a later write-back of
    /// a page that then cannot leave memory. On file systems without `fallocate` (ext2, some
    /// network and FUSE file systems) the room is reserved by writing zero pages, a
    /// [`WRITE_CHUNK`] at a time, with the same guarantee.
    pub fn allocate(&self) -> StoreResult<u64> {
        // The allocator's lock is held while space is reserved so that a refused slot can be
        // taken back exactly (the next fresh slot again, not a free-list entry: free slots
        // hold the free-list chain at shutdown and must have room).
        let mut alloc = self.alloc.lock();
        let slot = alloc.allocate()?;
        if let Err(e) = self.ensure_space(slot) {
            alloc.unallocate(slot);
            return Err(e);
        }
        if let Some(w) = &self.wal {
            // logged under the allocator's lock: log order is allocation order
            if let Err(e) = log_slot(w, rec::ALLOC, slot) {
                alloc.unallocate(slot);
                return Err(e);
            }
        }
        Ok(slot)
    }

    /// Reserve the device range holding `slot` if it lies beyond what was reserved, a
    /// [`GROW_CHUNK`] at a time (just what `slot` needs when a whole chunk does not fit).
    /// Caller holds the allocator's lock.
    fn ensure_space(&self, slot: u64) -> StoreResult<()> {
        let (dev, off) = self.slot_location(slot);
        let d = &self.devices[dev];
        let end = off + PAGE_SIZE as u64;
        // Acquire/Release on `extent`: only allocations (serialised by the allocator's lock)
        // read and write it; the orderings just keep that true if a reader outside the lock
        // is ever added.
        let have = d.extent.load(Ordering::Acquire);
        if !d.regular || end <= have {
            return Ok(());
        }
        let step = if d.by_writing.load(Ordering::Relaxed) {
            WRITE_CHUNK
        } else {
            GROW_CHUNK
        };
        let chunk = end.div_ceil(step) * step;
        let mut last = None;
        for target in [chunk, end] {
            match reserve_range(d, have, target) {
                Ok(()) => {
                    d.extent.store(target, Ordering::Release);
                    return Ok(());
                }
                Err(e) if is_full(&e) => last = Some(e),
                Err(e) => return Err(io_err(&d.path, e)),
            }
        }
        Err(StoreError::NoRoom {
            path: d.path.clone(),
            slot,
            source: last.unwrap_or_else(|| std::io::Error::from_raw_os_error(libc::ENOSPC)),
        })
    }

    /// Take slot `slot`, which must be the next fresh one (well-known pages at format time).
    pub fn reserve(&self, slot: u64) -> StoreResult<()> {
        self.alloc.lock().reserve_next(slot)
    }

    /// Return a slot to the allocator.
    pub fn free(&self, slot: u64) -> StoreResult<()> {
        let mut alloc = self.alloc.lock();
        alloc.free(slot)?;
        if let Some(w) = &self.wal {
            log_slot(w, rec::FREE, slot)?;
        }
        Ok(())
    }

    /// Slots allocated at least once (the high-water mark).
    pub fn high_water(&self) -> u64 {
        self.alloc.lock().next_slot()
    }

    /// Slots currently in use.
    pub fn slots_in_use(&self) -> u64 {
        self.alloc.lock().in_use()
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
    /// `req.dst` is valid for reads of [`PAGE_SIZE`] bytes and nothing writes them now.
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
        // SAFETY: the read filled all PAGE_SIZE bytes of dst; nothing writes them now.
        let page = unsafe { &*(req.dst as *const [u8; PAGE_SIZE]) };
        verify(page, pid, slot, path).map_err(|e| {
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
    /// every dirty page first. Idempotent.
    pub fn close(&self) -> StoreResult<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if let Some(w) = &self.wal {
            let n = self.unfinished.lock().0.len();
            if n > 0 {
                self.closed.store(false, Ordering::Release);
                return Err(StoreError::BadLog {
                    path: w.path().to_path_buf(),
                    why: format!(
                        "{n} transaction(s) cut off by a crash were not rolled back; the store stays unclean (the next open recovers it again)"
                    ),
                });
            }
            // a last checkpoint, so that the next open finds the log's end at once
            let c = w.begin_checkpoint()?;
            self.finish_checkpoint(c, None)?;
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

fn log_slot(w: &Wal, kind: u8, slot: u64) -> StoreResult<u64> {
    let mut buf = Vec::with_capacity(16);
    w.append(&mut buf, |_, b| {
        b.push(kind);
        b.extend_from_slice(&slot.to_le_bytes());
    })
}

/// Where a store's log lives by default: beside device 0, named after it (`node0-0.dat` ->
/// `node0-0.wal`).
pub fn default_log_path(device0: &Path) -> PathBuf {
    device0.with_extension("wal")
}

/// The files of the log at `log`: its allocator snapshots, then the log itself (the order
/// they are renamed into place in: the log last).
fn log_files(log: &Path) -> [PathBuf; 3] {
    [alloc_path(log, 0), alloc_path(log, 1), log.to_path_buf()]
}

/// Make a new log for `wc` (store `id`, allocator `alloc`) under temporary names; returns the
/// renames (temporary, final) that put it into place, in order. The caller renames and syncs
/// the directory.
fn make_log(
    wc: &crate::wal::WalConfig,
    id: u64,
    alloc: &Allocator,
) -> StoreResult<Vec<(PathBuf, PathBuf)>> {
    let mut tc = wc.clone();
    tc.path = crate::fs::with_suffix(&wc.path, CREATING);
    drop(Wal::create(&tc, id, alloc)?);
    Ok(log_files(&tc.path)
        .into_iter()
        .zip(log_files(&wc.path))
        .collect())
}

/// Finish the creation of a store that a crash interrupted after its commit point (device 0
/// in place): every file of the store missing under its name but present as `<name>.creating`
/// is renamed into place, and the directory synced.
fn complete_creation(cfg: &StoreConfig) -> StoreResult<()> {
    let mut files: Vec<PathBuf> = cfg.devices[1..].to_vec();
    if let Some(w) = &cfg.wal {
        files.extend(log_files(&w.path));
    }
    for p in files {
        let tmp = crate::fs::with_suffix(&p, CREATING);
        if !p.exists() && tmp.exists() {
            log::warn!(
                "{}: finishing the creation of the store that a crash interrupted",
                p.display()
            );
            crate::fs::rename(&tmp, &p).map_err(|e| io_err(&p, e))?;
            crate::fs::sync_parent(&p).map_err(|e| io_err(&p, e))?;
        }
    }
    Ok(())
}

/// Delete a log and its allocator snapshots (a store opened without a log).
fn remove_log(path: &Path) {
    if path.exists() {
        log::warn!(
            "{}: deleting the write-ahead log of an earlier run: this run has durability \"none\" and the log would not describe the store any more",
            path.display()
        );
        for p in log_files(path) {
            let _ = crate::fs::remove(&p);
        }
        // durably gone before the superblocks say the store has no log: a log that came back
        // after a power loss would be replayed over pages changed without it
        if let Err(e) = crate::fs::sync_parent(path) {
            log::warn!("{}: syncing its directory: {e}", path.display());
        }
    }
}

/// Check that the superblocks read from `paths` (in configured order) describe one store
/// whose devices are all present, in their recorded order.
pub(crate) fn check_device_set(sbs: &[Superblock], paths: &[&Path]) -> StoreResult<()> {
    let sb0 = &sbs[0];
    if sb0.device_count as usize != paths.len() {
        return Err(StoreError::DeviceMismatch(format!(
            "the store on {} has {} device(s) ({}), the configuration lists {}",
            paths[0].display(),
            sb0.device_count,
            sb0.device_names.join(", "),
            paths.len()
        )));
    }
    for (i, (sb, p)) in sbs.iter().zip(paths).enumerate() {
        if sb.cluster_id != sb0.cluster_id
            || sb.node_id != sb0.node_id
            || sb.device_count != sb0.device_count
            || sb.store_id != sb0.store_id
        {
            return Err(StoreError::DeviceMismatch(format!(
                "{} belongs to another store (cluster {}, node {}, store id {:#x}) than {} \
                 (cluster {}, node {}, store id {:#x})",
                p.display(),
                sb.cluster_id,
                sb.node_id,
                sb.store_id,
                paths[0].display(),
                sb0.cluster_id,
                sb0.node_id,
                sb0.store_id
            )));
        }
        if sb.device_index as usize != i {
            return Err(StoreError::DeviceMismatch(format!(
                "{} is device #{} of its store but is configured as device #{i}",
                p.display(),
                sb.device_index
            )));
        }
    }
    Ok(())
}

/// Bytes device `i` of `n` (with `header` superblock pages) needs to hold every slot below
/// `next_slot` that stripes onto it.
pub(crate) fn device_bytes_needed(next_slot: u64, n: u64, i: u64, header: u64) -> u64 {
    let rows = if next_slot > i {
        (next_slot - i).div_ceil(n)
    } else {
        0
    };
    (header + rows) * PAGE_SIZE as u64
}

/// The allocator mark of a store that was not closed cleanly: slots beyond the recorded
/// `next_slot` may have been written since, so every slot the devices (of `lens` bytes, in
/// stripe order, each starting with `header` superblock pages) have room for counts
/// (preallocated space too, which only leaks slots).
pub(crate) fn mark_from_lengths(next_slot: u64, lens: &[u64], header: u64) -> u64 {
    let n = lens.len() as u64;
    let mut next = next_slot;
    for (i, len) in lens.iter().enumerate() {
        let pages = (len / PAGE_SIZE as u64).saturating_sub(header);
        if pages > 0 {
            next = next.max((pages - 1) * n + i as u64 + 1);
        }
    }
    next
}

/// Read the free-list chain of `len` slots starting at `head`; `read` fills a buffer with the
/// verified free-list page of a slot. `path` (device 0) names the store in errors.
pub(crate) fn walk_freelist(
    head: u64,
    len: u64,
    path: &Path,
    mut read: impl FnMut(u64, &mut AlignedPage) -> StoreResult<()>,
) -> StoreResult<Vec<u64>> {
    let bad = |why: String| StoreError::BadSuperblock {
        path: path.to_path_buf(),
        why,
    };
    let mut out = Vec::with_capacity(len.min(1 << 24) as usize);
    let mut buf = AlignedPage::new();
    let mut at = head;
    let mut hops = 0u64;
    while at != NO_SLOT {
        read(at, &mut buf)?;
        let (next, entries) = decode_chain_page(&buf[..])
            .map_err(|why| bad(format!("free-list page in slot {at}: {why}")))?;
        out.extend(entries);
        at = next;
        hops += 1;
        if hops > len + 1 {
            return Err(bad("free-list chain loops".into()));
        }
    }
    if out.len() as u64 != len {
        return Err(bad(format!(
            "free list holds {} slots, superblock says {len}",
            out.len()
        )));
    }
    Ok(out)
}

fn io_err(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn classify_write_error(path: &Path, slot: u64, e: std::io::Error) -> StoreError {
    if is_full(&e) {
        StoreError::DeviceFull {
            path: path.to_path_buf(),
            slot,
            source: e,
        }
    } else {
        io_err(path, e)
    }
}

/// Reserve the bytes `from..to` of device `d` (growing the file): `fallocate`, or zero pages
/// written where `fallocate` is not supported. The range lies past every allocated slot, so
/// writing zeros there overwrites nothing.
fn reserve_range(d: &Device, from: u64, to: u64) -> std::io::Result<()> {
    if !d.by_writing.load(Ordering::Relaxed) {
        match fallocate(&d.file, from, to - from) {
            Err(e) if !is_full(&e) => {
                log::info!(
                    "{}: fallocate is not supported here ({e}): reserving room by writing zeros",
                    d.path.display()
                );
                d.by_writing.store(true, Ordering::Relaxed);
            }
            r => {
                r?;
                crate::fs::resized(&d.path, to);
                return Ok(());
            }
        }
    }
    use std::os::unix::fs::FileExt;
    let zero = AlignedPage::new(); // aligned, as O_DIRECT needs
    let mut off = from / PAGE_SIZE as u64 * PAGE_SIZE as u64;
    while off < to {
        d.file.write_all_at(&zero[..], off)?;
        off += PAGE_SIZE as u64;
    }
    crate::fs::resized(&d.path, to);
    Ok(())
}

/// A device path's directory must exist and the path must not be a directory.
fn check_device_path(path: &Path) -> StoreResult<()> {
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() && !parent.is_dir() {
            return Err(StoreError::Config(format!(
                "directory {} of device {} does not exist or is not a directory",
                parent.display(),
                path.display()
            )));
        }
    }
    if path.is_dir() {
        return Err(StoreError::Config(format!(
            "device {} is a directory, not a file or block device",
            path.display()
        )));
    }
    Ok(())
}

fn open_device(path: &Path) -> StoreResult<Device> {
    check_device_path(path)?;
    let open = |direct: bool| {
        let mut o = OpenOptions::new();
        o.read(true).write(true);
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o.open(path)
    };
    let device = |file: File, direct: bool| {
        let meta = file.metadata().map_err(|e| io_err(path, e))?;
        Ok(Device {
            path: path.to_path_buf(),
            extent: AtomicU64::new(meta.len()),
            regular: meta.file_type().is_file(),
            by_writing: AtomicBool::new(
                std::env::var_os("SHOAL_RESERVE_BY_WRITING").is_some_and(|v| v == "1"),
            ),
            file,
            direct,
        })
    };
    match open(true) {
        Ok(file) => device(file, true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            log::warn!(
                "{}: the file system refuses O_DIRECT; using buffered I/O (page cache in use)",
                path.display()
            );
            let file = open(false).map_err(|e| io_err(path, e))?;
            device(file, false)
        }
        Err(e) => Err(io_err(path, e)),
    }
}

/// Read the page at byte `offset` of `d`; returns the bytes read (fewer than a page at the end
/// of the file; the rest of `buf` is then zero).
fn read_raw(
    backend: Backend,
    d: &Device,
    offset: u64,
    buf: &mut AlignedPage,
) -> StoreResult<usize> {
    let op = IoOp {
        fd: d.file.as_raw_fd(),
        offset,
        buf: buf.as_mut_ptr(),
        len: PAGE_SIZE as u32,
        write: false,
    };
    let mut res = [0i64];
    // SAFETY: buf is an exclusively borrowed aligned page.
    unsafe { io::run_batch(backend, std::slice::from_ref(&op), &mut res) };
    match res[0] {
        n if n < 0 => Err(io_err(
            &d.path,
            std::io::Error::from_raw_os_error(-n as i32),
        )),
        n => {
            let n = (n as usize).min(PAGE_SIZE);
            buf[n..].fill(0);
            Ok(n)
        }
    }
}

fn write_raw(
    backend: Backend,
    d: &Device,
    offset: u64,
    buf: &mut AlignedPage,
    slot: u64,
) -> StoreResult<()> {
    let op = IoOp {
        fd: d.file.as_raw_fd(),
        offset,
        buf: buf.as_mut_ptr(),
        len: PAGE_SIZE as u32,
        write: true,
    };
    let mut res = [0i64];
    // SAFETY: buf is an exclusively borrowed aligned page.
    unsafe { io::run_batch(backend, std::slice::from_ref(&op), &mut res) };
    match res[0] {
        n if n == PAGE_SIZE as i64 => {
            crate::fs::wrote(&d.path, offset, &buf[..]);
            Ok(())
        }
        n if n < 0 => Err(classify_write_error(
            &d.path,
            slot,
            std::io::Error::from_raw_os_error(-n as i32),
        )),
        n => Err(classify_write_error(
            &d.path,
            slot,
            std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                format!("short write ({n} bytes)"),
            ),
        )),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(dir: &Path, n: usize) -> StoreConfig {
        StoreConfig::new((0..n).map(|i| dir.join(format!("d{i}.dat"))).collect())
    }

    fn write_one(s: &PageStore, slot: u64, pid: u64, fill: u8) {
        let mut p = AlignedPage::new();
        p[..100].fill(fill);
        let r = s.write_batch(&mut [WriteRequest {
            slot,
            pid,
            page: &mut p,
        }]);
        r.into_iter().for_each(|r| r.unwrap());
    }

    fn read_one(s: &PageStore, slot: u64, pid: u64) -> StoreResult<AlignedPage> {
        let mut p = AlignedPage::new();
        // SAFETY: p is exclusively owned and aligned.
        unsafe { s.read_into(slot, pid, p.as_mut_ptr())? };
        Ok(p)
    }

    #[test]
    fn write_read_reopen_with_freelist() {
        for backend in [BackendChoice::Auto, BackendChoice::Pread] {
            let dir = tempfile::tempdir().unwrap();
            let mut c = cfg(dir.path(), 2);
            c.backend = backend;
            let s = PageStore::open(&c).unwrap();
            let slots: Vec<u64> = (0..10).map(|_| s.allocate().unwrap()).collect();
            for &sl in &slots {
                write_one(&s, sl, 1000 + sl, sl as u8);
            }
            s.free(3).unwrap();
            s.free(7).unwrap();
            s.close().unwrap();
            drop(s);
            c.mode = OpenMode::Open;
            let s = PageStore::open(&c).unwrap();
            assert_eq!(s.high_water(), 10);
            assert_eq!(s.slots_in_use(), 8);
            for &sl in &slots {
                if sl == 3 || sl == 7 {
                    continue;
                }
                let p = read_one(&s, sl, 1000 + sl).unwrap();
                assert!(p[..100].iter().all(|&b| b == sl as u8));
            }
            let mut again = [s.allocate().unwrap(), s.allocate().unwrap()];
            again.sort();
            assert_eq!(again, [3, 7]);
            assert_eq!(s.allocate().unwrap(), 10);
            s.close().unwrap();
        }
    }

    #[test]
    fn unclean_store_is_refused_unless_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cfg(dir.path(), 1);
        let s = PageStore::open(&c).unwrap();
        for _ in 0..5 {
            let sl = s.allocate().unwrap();
            write_one(&s, sl, sl, 1);
        }
        drop(s); // no close
        c.mode = OpenMode::Open;
        let e = PageStore::open(&c).err().unwrap();
        assert!(matches!(e, StoreError::Unclean { .. }), "{e}");
        c.allow_unclean = true;
        let s = PageStore::open(&c).unwrap();
        // Written slots (0..5) are never handed out again; preallocated space beyond them may
        // be skipped (leaked), which costs disk space but never data.
        assert!(
            s.allocate().unwrap() >= 5,
            "written slots are never handed out again"
        );
        s.close().unwrap();
    }

    #[test]
    fn create_refuses_existing_store_and_open_refuses_missing() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cfg(dir.path(), 1);
        c.mode = OpenMode::Open;
        assert!(matches!(
            PageStore::open(&c),
            Err(StoreError::NotAStore { .. })
        ));
        c.mode = OpenMode::Create;
        PageStore::open(&c).unwrap().close().unwrap();
        assert!(matches!(
            PageStore::open(&c),
            Err(StoreError::AlreadyExists { .. })
        ));
    }

    #[test]
    fn reordered_or_missing_devices_are_detected() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path(), 2);
        PageStore::open(&c).unwrap().close().unwrap();
        let mut swapped = c.clone();
        swapped.devices.reverse();
        swapped.mode = OpenMode::Open;
        let e = PageStore::open(&swapped).err().unwrap();
        assert!(e.to_string().contains("configured as device #0"), "{e}");
        let mut one = c.clone();
        one.devices.pop();
        let e = PageStore::open(&one).err().unwrap();
        assert!(e.to_string().contains("has 2 device(s)"), "{e}");
        let mut other_node = c.clone();
        other_node.node_id = 4;
        let e = PageStore::open(&other_node).err().unwrap();
        assert!(e.to_string().contains("this is node 4"), "{e}");
        // a device of another store of the same node and cluster, in its place
        let other = tempfile::tempdir().unwrap();
        let oc = cfg(other.path(), 2);
        PageStore::open(&oc).unwrap().close().unwrap();
        std::fs::copy(&oc.devices[1], &c.devices[1]).unwrap();
        let e = PageStore::open(&c).err().unwrap();
        assert!(e.to_string().contains("belongs to another store"), "{e}");
    }

    /// Flip one byte inside superblock copy `copy` of `path`.
    fn damage_copy(path: &Path, copy: u64) {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .read(true)
            .open(path)
            .unwrap();
        let at = copy * PAGE_SIZE as u64 + 44;
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0xff], at).unwrap();
    }

    fn copies_of(paths: &[PathBuf]) -> Vec<crate::superblock::DeviceCopies> {
        crate::inspect::StoreReader::open(paths)
            .unwrap()
            .superblock_copies()
            .to_vec()
    }

    /// A store on 2 devices with slots 0..6 written (pid 1000 + slot, fill = slot), closed.
    fn closed_store(dir: &Path) -> StoreConfig {
        let c = cfg(dir, 2);
        let s = PageStore::open(&c).unwrap();
        for _ in 0..6 {
            let sl = s.allocate().unwrap();
            write_one(&s, sl, 1000 + sl, sl as u8);
        }
        s.close().unwrap();
        c
    }

    fn assert_pages_intact(s: &PageStore) {
        for sl in 0..6 {
            let p = read_one(s, sl, 1000 + sl).unwrap();
            assert!(p[..100].iter().all(|&b| b == sl as u8), "slot {sl}");
        }
    }

    #[test]
    fn a_bad_superblock_copy_is_read_around_and_rewritten_at_open() {
        use crate::superblock::CopyState;
        let dir = tempfile::tempdir().unwrap();
        let c = closed_store(dir.path());
        let r = crate::inspect::StoreReader::open(&c.devices).unwrap();
        assert_eq!(
            r.superblock().format_version,
            crate::superblock::FORMAT_VERSION
        );
        for copy in 0..2 {
            damage_copy(&c.devices[0], copy);
            let found = copies_of(&c.devices);
            assert!(matches!(found[0].copies[copy as usize], CopyState::Bad(_)));
            assert_eq!(found[0].used, Some(1 - copy as usize), "{}", found[0]);
            assert!(found[0].to_string().contains("bad"), "{}", found[0]);
            let s = PageStore::open(&c).unwrap();
            assert_pages_intact(&s);
            s.close().unwrap();
            drop(s);
            let found = copies_of(&c.devices);
            let g = match found[0].copies[0] {
                CopyState::Intact { generation } => generation,
                ref bad => panic!("copy 0 not repaired: {bad:?}"),
            };
            assert!(found
                .iter()
                .all(|d| d.copies == vec![CopyState::Intact { generation: g }; 2]));
        }
    }

    #[test]
    fn a_device_whose_copies_are_both_bad_is_rebuilt_from_another_device() {
        let dir = tempfile::tempdir().unwrap();
        let c = closed_store(dir.path());
        damage_copy(&c.devices[1], 0);
        damage_copy(&c.devices[1], 1);
        let found = copies_of(&c.devices);
        assert_eq!(found[1].used, None, "{}", found[1]);
        let s = PageStore::open(&c).unwrap();
        assert_pages_intact(&s);
        s.close().unwrap();
        drop(s);
        let found = copies_of(&c.devices);
        assert!(found.iter().all(|d| !d.needs_repair(0) && d.used.is_some()));
        // a device under another name is not rebuilt: it may belong to another store
        damage_copy(&c.devices[1], 0);
        damage_copy(&c.devices[1], 1);
        let renamed = dir.path().join("other.dat");
        std::fs::rename(&c.devices[1], &renamed).unwrap();
        let mut moved = c.clone();
        moved.devices[1] = renamed;
        let e = PageStore::open(&moved).err().unwrap();
        assert!(matches!(e, StoreError::BadSuperblock { .. }), "{e}");
    }

    #[test]
    fn the_newest_intact_copy_wins_over_a_stale_one() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let c = closed_store(dir.path());
        let old = std::fs::read(&c.devices[0]).unwrap();
        // a later session frees slot 5 and closes: its superblocks record the free list
        let s = PageStore::open(&c).unwrap();
        s.free(5).unwrap();
        s.close().unwrap();
        drop(s);
        // as if a crash had stopped the close between copy 0 and copy 1 of device 0
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&c.devices[0])
            .unwrap();
        f.write_all_at(&old[PAGE_SIZE..2 * PAGE_SIZE], PAGE_SIZE as u64)
            .unwrap();
        let found = copies_of(&c.devices);
        assert_eq!(found[0].used, Some(0));
        assert!(found[0].needs_repair(u64::MAX));
        let s = PageStore::open(&c).unwrap();
        assert_eq!(s.slots_in_use(), 5, "the newer copy's free list is used");
        s.close().unwrap();
    }

    #[test]
    fn a_format_1_store_opens_and_keeps_its_layout() {
        use crate::superblock::{Superblock, SUPERBLOCK_PID};
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d0.dat");
        // one superblock copy at page 0, slot s at page 1 + s
        let sb = Superblock {
            format_version: 1,
            page_size: PAGE_SIZE as u32,
            cluster_id: 0,
            node_id: 0,
            device_count: 1,
            device_index: 0,
            clean: true,
            next_slot: 3,
            freelist_head: NO_SLOT,
            freelist_len: 0,
            capacity: 0,
            generation: 0,
            store_id: 0,
            logged: false,
            device_names: vec!["d0.dat".into()],
        };
        let f = std::fs::File::create(&path).unwrap();
        let mut p = AlignedPage::new();
        sb.encode(&mut p).unwrap();
        f.write_all_at(&p[..], 0).unwrap();
        for sl in 0..3u64 {
            let mut p = AlignedPage::new();
            p[..100].fill(sl as u8);
            crate::page::seal(&mut p, 1000 + sl);
            f.write_all_at(&p[..], (1 + sl) * PAGE_SIZE as u64).unwrap();
        }
        drop(f);
        let c = StoreConfig::new(vec![path.clone()]);
        let s = PageStore::open(&c).unwrap();
        assert_eq!(s.format_version(), 1);
        assert_eq!(read_one(&s, 2, 1002).unwrap()[0], 2);
        let sl = s.allocate().unwrap();
        write_one(&s, sl, 1000 + sl, sl as u8);
        s.close().unwrap();
        drop(s);
        let s = PageStore::open(&c).unwrap();
        for sl in 0..4 {
            assert_eq!(read_one(&s, sl, 1000 + sl).unwrap()[0], sl as u8);
        }
        s.close().unwrap();
        drop(s);
        // page 1 still holds slot 0, not a second superblock copy
        let mut b = AlignedPage::new();
        std::fs::File::open(&path)
            .unwrap()
            .read_exact_at(&mut b[..], PAGE_SIZE as u64)
            .unwrap();
        assert!(crate::page::verify(&b, SUPERBLOCK_PID, 0, &path).is_err());
        assert!(crate::page::verify(&b, 1000, 0, &path).is_ok());
        let found = copies_of(&[path]);
        assert_eq!(found[0].copies.len(), 1);
    }

    #[test]
    fn capacity_limit_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cfg(dir.path(), 1);
        c.capacity_pages = 2;
        let s = PageStore::open(&c).unwrap();
        s.allocate().unwrap();
        s.allocate().unwrap();
        let e = s.allocate().unwrap_err();
        assert!(e.to_string().contains("store is full"), "{e}");
    }

    #[test]
    fn never_written_slot_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let s = PageStore::open(&cfg(dir.path(), 1)).unwrap();
        let sl = s.allocate().unwrap();
        assert!(matches!(
            read_one(&s, sl, 5),
            Err(StoreError::NeverWritten { pid: 5, .. })
        ));
    }

    #[test]
    fn big_batch_larger_than_ring() {
        let dir = tempfile::tempdir().unwrap();
        let s = PageStore::open(&cfg(dir.path(), 3)).unwrap();
        let n = io::RING_ENTRIES as usize * 2 + 7;
        let mut pages: Vec<AlignedPage> = (0..n).map(|_| AlignedPage::new()).collect();
        let slots: Vec<u64> = (0..n).map(|_| s.allocate().unwrap()).collect();
        for (i, p) in pages.iter_mut().enumerate() {
            p[0..8].copy_from_slice(&(i as u64).to_le_bytes());
        }
        let mut reqs: Vec<WriteRequest<'_>> = pages
            .iter_mut()
            .zip(&slots)
            .map(|(page, &slot)| WriteRequest {
                slot,
                pid: slot + 1,
                page,
            })
            .collect();
        assert!(s.write_batch(&mut reqs).iter().all(|r| r.is_ok()));
        for (i, &sl) in slots.iter().enumerate() {
            let p = read_one(&s, sl, sl + 1).unwrap();
            assert_eq!(u64::from_le_bytes(p[0..8].try_into().unwrap()), i as u64);
        }
    }
}
