//! The store's part of recovery: attaching the log at open, and replaying the page images
//! and allocations it holds into the slots of a store that was not closed cleanly (the
//! engine's log continues it and rolls back the transactions it found cut off).

use super::*;
use crate::wal::merge::{plan, Found};
use crate::wal::record::{page_record, Change, PageRecord};
use std::collections::HashMap;

/// A cluster node's recovery: the records of this store's pages from its own log and every
/// peer's, merged per page by version (`wal::merge::plan`).
#[derive(Default)]
struct Merge {
    /// Per slot, the records found (in any order).
    recs: HashMap<u64, Vec<Owned>>,
    /// Records found in the peers' logs.
    from_peers: u64,
    /// This log's records of pages homed elsewhere (kind, body).
    carry: Vec<(u8, Vec<u8>)>,
}

/// A page record, copied out of the log it was read from.
struct Owned {
    pid: u64,
    version: u64,
    image: bool,
    /// The image's data area, or the diff's ranges.
    bytes: Vec<u8>,
}

impl Owned {
    /// `r`, copied out, and its slot.
    fn of(r: &PageRecord<'_>) -> (u64, Owned) {
        let (image, bytes) = match r.change {
            Change::Image(d) => (true, d.to_vec()),
            Change::Diff(d) => (false, d.to_vec()),
        };
        let owned = Owned {
            pid: r.pid,
            version: r.version,
            image,
            bytes,
        };
        (r.slot, owned)
    }
}

impl Merge {
    fn add(&mut self, (slot, r): (u64, Owned)) {
        self.recs.entry(slot).or_default().push(r);
    }

    /// Add the records of the pages `wanted` picks (by page id) in `peer`'s log (from its
    /// redo point) and carried file.
    fn scan_peer(
        &mut self,
        peer: &std::path::Path,
        wanted: &dyn Fn(u64) -> bool,
    ) -> StoreResult<()> {
        // Every log listed here is one its node writes: a cluster's durability is one setting
        // for all its nodes, and a node without a log is not listed (`ClusterLogs::peers`).
        // So a log that is not there is one this node cannot see (another host's directory,
        // a directory not mounted here, hidden, or emptied), never one that need not exist:
        // going on without it would bring pages back without the changes it holds, silently.
        if let Err(e) = std::fs::metadata(peer) {
            let dir = peer.parent().filter(|d| d.is_dir());
            let seen = match dir {
                Some(d) => format!("its directory {} is here, but not the log", d.display()),
                None => "its node's directory is not reachable from here".to_string(),
            };
            return Err(StoreError::BadLog {
                path: peer.to_path_buf(),
                why: format!(
                    "cannot be read ({e}; {seen}). Every node of this cluster has a log, and \
                     recovery needs each one: that node's data directory must be reachable \
                     from this node (on separate hosts: share it, or copy its log here). \
                     Nothing was written; the pages whose changes it may hold stay \
                     unavailable until it can be read (docs/durability.md, \"Clusters\")"
                ),
            });
        }
        // A peer's log may be written while it is read: a node restarted into a running
        // cluster reads the running nodes' logs, a running node bringing back pages lost with
        // a dead node reads them too (its own included), and the nodes of a cluster
        // restarting at different moments read the logs of those already running. A flush
        // caught half-way (its pages land in the page cache in no particular order) looks
        // like damage at the log's tail. What the reader needs was durable before it began
        // (see the callers), and a concurrent write damages only what was not: so damage
        // that a later read finds intact (the read's damage, if any, is further on) was a
        // flush in progress, and that later read holds everything durable before the first
        // began. Damage found at the same place every time is believed (an error).
        let mut tries = 0;
        let mut damaged_at: Option<u64> = None;
        let found = loop {
            let read = read_peer_log(peer, wanted, wal::ScanMode::DiscardDamage);
            let PeerRead { found, damage } = match read {
                Ok(r) => r,
                Err(e @ StoreError::BadLog { .. }) if tries < PEER_LOG_TRIES => {
                    tries += 1;
                    log::warn!(
                        "{}: cannot be read ({e}); reading it again in case its node was \
                         writing it (attempt {} of {})",
                        peer.display(),
                        tries + 1,
                        PEER_LOG_TRIES + 1
                    );
                    std::thread::sleep(PEER_LOG_RETRY);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let Some((lsn, why)) = damage else {
                break found;
            };
            if damaged_at.is_some_and(|before| lsn > before) {
                break found;
            }
            if tries == PEER_LOG_TRIES {
                // the same damage every time: the judged read says what it is
                break read_peer_log(peer, wanted, wal::ScanMode::Judge)?.found;
            }
            tries += 1;
            damaged_at = Some(lsn);
            log::warn!(
                "{}: read as damaged at LSN {lsn} ({why}); reading it again in case its node \
                 was writing it (attempt {} of {})",
                peer.display(),
                tries + 1,
                PEER_LOG_TRIES + 1
            );
            std::thread::sleep(PEER_LOG_RETRY);
        };
        let n = found.len() as u64;
        for r in found {
            self.add(r);
        }
        self.from_peers += n;
        Ok(())
    }

    /// The newest page of every slot the logs name, as far as its chain reaches (an error if
    /// a chain has a gap: a log is missing or damaged).
    fn finish(self, store: &PageStore) -> StoreResult<HashMap<u64, (u64, AlignedPage)>> {
        let mut out = HashMap::new();
        for (slot, recs) in self.recs {
            let pid = recs[0].pid;
            let mut stored = AlignedPage::new();
            // (a slot used again continues its old page's versions: `allocate_versioned`)
            // SAFETY: `stored` is our own aligned page buffer, written only by this read.
            let stored_version = match unsafe { store.read_into(slot, pid, stored.as_mut_ptr()) } {
                Ok(()) => Some(crate::page::version(&stored)),
                Err(_) => None, // never written, or torn: the chain must begin with an image
            };
            let mut found: Vec<Found> = recs
                .iter()
                .enumerate()
                .map(|(at, r)| Found {
                    version: r.version,
                    image: r.image,
                    at,
                })
                .collect();
            let p = plan(stored_version, &mut found);
            if let Some((low, high)) = p.gap {
                return Err(StoreError::BadLog {
                    path: store.devices[0].path.clone(),
                    why: format!(
                        "page {pid:#x} (slot {slot}): the logs hold its changes up to version \
                         {high}, but none holds version {low} (the store's copy is at {}): a \
                         node's log is missing or damaged",
                        stored_version.map_or("none".to_string(), |v| v.to_string())
                    ),
                });
            }
            if p.apply.is_empty() {
                continue;
            }
            let mut page = stored;
            for &at in &p.apply {
                let r = &recs[at];
                let change = if r.image {
                    Change::Image(&r.bytes)
                } else {
                    Change::Diff(&r.bytes)
                };
                change.apply(&mut page[..PAGE_DATA_SIZE]);
            }
            crate::page::set_version(&mut page, p.version);
            out.insert(slot, (pid, page));
        }
        Ok(out)
    }
}

/// Times a peer's log that reads as damaged is read again before the damage is believed (see
/// `Merge::scan_peer`), and the pause before each.
const PEER_LOG_TRIES: u32 = 4;
const PEER_LOG_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// What [`read_peer_log`] found: the records (with their slots), and where the read stopped
/// at damage (its LSN, and what it was), if it did.
struct PeerRead {
    found: Vec<(u64, Owned)>,
    damage: Option<(u64, String)>,
}

/// The records of the pages `wanted` picks (by page id) in `peer`'s log (from its redo
/// point), then in its carried file. With [`wal::ScanMode::DiscardDamage`], the records
/// before damage in the log, and the damage's LSN and description.
fn read_peer_log(
    peer: &std::path::Path,
    wanted: &dyn Fn(u64) -> bool,
    mode: wal::ScanMode,
) -> StoreResult<PeerRead> {
    let (found, file) = wal::read_existing(peer, false)?;
    let redo = found.redo_lsn();
    let mut out = Vec::new();
    let mut keep = |kind: u8, body: &[u8]| {
        if let Some(r) = page_record(kind, body) {
            if wanted(r.pid) {
                out.push(Owned::of(&r));
            }
        }
    };
    let scanned = wal::scan(peer, &file, &found, mode, |lsn, kind, body| {
        if lsn >= redo {
            keep(kind, body);
        }
        Ok(())
    })?;
    let damage = match scanned.how {
        wal::LogEnd::Discarded { lsn, why } => Some((lsn, why)),
        _ => None,
    };
    // after the log: a peer that resumed its log (moving its redo point past these records)
    // wrote its carried file before (see wal/carried.rs)
    for (kind, body) in wal::carried::read_carried(peer)? {
        keep(kind, &body);
    }
    Ok(PeerRead { found: out, damage })
}

/// Replay one page record at `lsn` into `images` (slot -> page id and page, its version in
/// its trailer): an image replaces the page, a change applies to the page before it. Within
/// one log the records of a page follow its changes, each one version up (records of older
/// builds have version 0 and are applied in log order).
fn replay_page(
    images: &mut HashMap<u64, (u64, AlignedPage)>,
    r: &PageRecord<'_>,
    lsn: u64,
    path: &std::path::Path,
) -> StoreResult<()> {
    let bad = |why: String| StoreError::BadLog {
        path: path.to_path_buf(),
        why,
    };
    let page = match (r.change, images.get_mut(&r.slot)) {
        (Change::Image(_), Some(e)) => &mut e.1,
        (Change::Image(_), None) => {
            &mut images
                .entry(r.slot)
                .or_insert((r.pid, AlignedPage::new()))
                .1
        }
        (Change::Diff(_), None) => {
            return Err(bad(format!(
                "the change at LSN {lsn} to slot {} has no page image before it since the redo point (the log breaks its own rule)",
                r.slot
            )))
        }
        (Change::Diff(_), Some(e)) => {
            let had = crate::page::version(&e.1);
            if r.version != 0 && had + 1 != r.version {
                return Err(bad(format!(
                    "the change at LSN {lsn} makes slot {} version {}, but the page before it is at version {had} (the log breaks its own rule)",
                    r.slot, r.version
                )));
            }
            &mut e.1
        }
    };
    r.change.apply(&mut page[..PAGE_DATA_SIZE]);
    crate::page::set_version(page, r.version);
    Ok(())
}

impl PageStore {
    /// Bring back the pages of this store that `pids` names from the logs `logs` (every
    /// cluster node's, this one's included, each with its carried file), merged per page by
    /// version over the store's copy as for a recovery, and write them, durably. For a
    /// running cluster node whose pages were lost with a node that died holding them: once
    /// that node's log is final (it restarted, or is gone for good), their newest durable
    /// versions are in these logs. The other logs may be written meanwhile: records of these
    /// pages are not (nobody may change a lost page), and a log that reads as damaged is read
    /// again (`Merge::scan_peer`). Returns each page written, with its version; a page whose
    /// logs hold nothing newer than the store's copy is left as it is.
    ///
    /// An error (a log that cannot be read, damaged, or missing a page's change: a chain with
    /// a gap) writes nothing; it names the log, or the page.
    pub fn recover_pages(
        &self,
        logs: &[std::path::PathBuf],
        pids: &std::collections::HashSet<u64>,
    ) -> StoreResult<Vec<(u64, u64)>> {
        let mut m = Merge::default();
        let wanted = |pid: u64| pids.contains(&pid);
        for log in logs {
            m.scan_peer(log, &wanted)?;
        }
        let images = m.finish(self)?;
        let mut out: Vec<(u64, u64)> = images
            .values()
            .map(|(pid, page)| (*pid, crate::page::version(page)))
            .collect();
        out.sort_unstable();
        self.write_replayed(images)?;
        Ok(out)
    }

    /// Write pages replayed from logs (slot -> page id and page), a batch at a time, then make
    /// them durable. Returns how many were written.
    fn write_replayed(&self, images: HashMap<u64, (u64, AlignedPage)>) -> StoreResult<u64> {
        let mut all: Vec<(u64, (u64, AlignedPage))> = images.into_iter().collect();
        all.sort_unstable_by_key(|(slot, _)| *slot);
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
        Ok(all.len() as u64)
    }

    /// Set up the write-ahead log `cfg.wal` names: recover from it first if the store was not
    /// closed cleanly (`recover`), continue it if it exists, create it if not. Without a log,
    /// delete one an earlier run left (it no longer describes the store; the store is clean,
    /// `load` refuses an unclean one whose log recovery needs).
    pub(super) fn attach_log(&mut self, cfg: &StoreConfig, recover: bool) -> StoreResult<()> {
        let Some(wc) = &cfg.wal else {
            if let Some(p) = cfg.devices.first().map(|d| default_log_path(d)) {
                remove_log(&p);
            }
            return Ok(());
        };
        let id = self.sb.get_mut().store_id;
        if !wc.path.exists() {
            // a clean store opened with a log for the first time
            self.log = Some(self.new_log(wc)?);
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
            self.log = Some(match end {
                Ok(end) => LogFile::resume(wc, file, &found, end, &alloc)?,
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
        if cfg.cluster.is_none()
            && cfg.page_home.is_some()
            && wal::carried::carried_path(&wc.path).exists()
        {
            // records of other nodes' pages that a cluster recovery carried over: only the
            // cluster's recovery may go on from here (a single open would drop them)
            return Err(StoreError::BadLog {
                path: wc.path.clone(),
                why: "beside it are records of other nodes' pages carried over a recovery: this \
                      is a cluster node's log, which only its cluster's recovery replays (open \
                      the store as a member of its cluster, or `shoal recover --cluster FILE`; \
                      docs/durability.md, \"Clusters\")"
                    .into(),
            });
        }
        let mut alloc = wal::read_alloc(&wc.path, &found, self.sb.get_mut().capacity)?;
        self.check_lengths(alloc.next_slot())?;
        let mut images: HashMap<u64, (u64, AlignedPage)> = HashMap::new();
        let mut carried: Option<Vec<(u8, Vec<u8>)>> = None;
        // transactions seen (first LSN -> undo records), in order of their first record
        let mut txns: std::collections::BTreeMap<u64, Vec<Vec<u8>>> = Default::default();
        let redo_lsn = found.redo_lsn();
        let mut merge = cfg.cluster.as_ref().map(|_| Merge::default());
        // (a cluster's recovery sorts records by their pages' homes)
        let home = match (&cfg.cluster, cfg.page_home) {
            (Some(_), None) => {
                return Err(StoreError::Config(
                    "a cluster node's store needs page_home (the node a page id is homed on)"
                        .into(),
                ))
            }
            (_, h) => h.unwrap_or(|_| 0),
        };
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
            if let Some(r) = page_record(kind, body) {
                return match (&cfg.cluster, &mut merge) {
                    (Some(c), Some(m)) => {
                        if home(r.pid) == c.node {
                            m.add(Owned::of(&r));
                        } else {
                            m.carry.push((kind, body.to_vec()));
                        }
                        Ok(())
                    }
                    _ => {
                        if let Some(home) =
                            cfg.page_home.filter(|h| u32::from(h(r.pid)) != cfg.node_id)
                        {
                            return Err(StoreError::BadLog {
                                path: wc.path.clone(),
                                why: format!(
                                    "the change at LSN {lsn} is to page {:#x}, homed on node {}: this is a cluster node's log, which only its cluster's recovery replays (open the store as a member of its cluster, or `shoal recover --cluster FILE`; docs/durability.md, \"Clusters\")",
                                    r.pid,
                                    home(r.pid)
                                ),
                            });
                        }
                        replay_page(&mut images, &r, lsn, &wc.path)
                    }
                };
            }
            match kind {
                rec::ALLOC => alloc.replay_allocated(LittleEndian::read_u64(body)),
                rec::FREE => {
                    let slot = LittleEndian::read_u64(body);
                    images.remove(&slot);
                    alloc.replay_freed(slot);
                }
                rec::UNDO => {
                    let txn = LittleEndian::read_u64(body);
                    // 0: the transaction begins in this chunk, whose LSN is its id
                    let id = if txn == 0 { lsn } else { txn };
                    txns.entry(id).or_default().push(body[12..].to_vec());
                }
                rec::END => {
                    txns.remove(&LittleEndian::read_u64(body));
                }
                _ => {}
            }
            Ok(())
        })?;
        // Undo records without an end: transactions of an older build that this one cannot
        // roll back. Refused before anything is written (replaying pages and resuming the log
        // would leave those records unreachable, and the half-done transactions in the store
        // for good).
        if !txns.is_empty() {
            return Err(StoreError::OldTransactions {
                path: wc.path.clone(),
                count: txns.len(),
            });
        }
        if let (Some(c), Some(mut m)) = (&cfg.cluster, merge.take()) {
            let ours = |pid: u64| home(pid) == c.node;
            for peer in &c.peers {
                m.scan_peer(peer, &ours)?;
            }
            // this log's records of other homes' pages (and those an earlier recovery or a
            // checkpoint past a dead peer carried) stay readable for their homes' recovery
            // once the log is resumed below; those of this store's pages are replayed here
            let mut carry = Vec::new();
            for (kind, body) in wal::carried::read_carried(&wc.path)? {
                match page_record(kind, &body) {
                    Some(r) if home(r.pid) == c.node => m.add(Owned::of(&r)),
                    _ => carry.push((kind, body)),
                }
            }
            carry.append(&mut m.carry);
            images = m.finish(self)?;
            carried = Some(carry);
        }
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
        replay.pages = self.write_replayed(images)?;
        if let Some(carry) = carried {
            // only now that the pages replayed from it are durable in the store: the file
            // held this store's own pages' records too (a crash before this point finds it
            // as it was), and it must be written before the log is resumed past its records
            wal::carried::write_carried(&wc.path, &carry)?;
        }
        *self.alloc.get_mut() = alloc.clone();
        self.log = Some(LogFile::resume(wc, file, &found, end, &alloc)?);
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
    pub(super) fn new_log(&mut self, wc: &crate::wal::WalConfig) -> StoreResult<LogFile> {
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
        LogFile::resume(wc, file, &found, sc.end, &alloc)
    }
}
