//! Making a new store: every file under a temporary name, synced, then renamed into place,
//! device 0 first (the commit point); finishing a creation a crash interrupted after it; the
//! log's files.

use super::*;

impl PageStore {
    /// Create a new store, atomically: every file is written whole under a temporary name
    /// (`<name>.creating`) and synced, then device 0 is renamed into place (the commit point)
    /// and the others after it, each directory synced. A crash before the commit leaves no
    /// store (the next creation overwrites the temporary files); after it, the open that
    /// follows finishes the renames ([`complete_creation`]). The new store is clean and empty;
    /// it is then opened like any other. Block devices cannot be renamed: their superblocks are
    /// written in place, device 0's last.
    pub(super) fn create(
        cfg: &StoreConfig,
        backend: Backend,
        names: Vec<String>,
    ) -> StoreResult<()> {
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
}

/// Where a store's log lives by default: beside device 0, named after it (`node0-0.dat` ->
/// `node0-0.wal`).
pub fn default_log_path(device0: &Path) -> PathBuf {
    device0.with_extension("wal")
}

/// The files of the log at `log`: its allocator snapshots, then the log itself (the order
/// they are renamed into place in: the log last).
pub(crate) fn log_files(log: &Path) -> [PathBuf; 3] {
    [alloc_path(log, 0), alloc_path(log, 1), log.to_path_buf()]
}

/// Make a new log for `wc` (store `id`, allocator `alloc`) under temporary names; returns the
/// renames (temporary, final) that put it into place, in order. The caller renames and syncs
/// the directory.
pub(crate) fn make_log(
    wc: &crate::wal::WalConfig,
    id: u64,
    alloc: &Allocator,
) -> StoreResult<Vec<(PathBuf, PathBuf)>> {
    let mut tc = wc.clone();
    tc.path = crate::fs::with_suffix(&wc.path, CREATING);
    drop(LogFile::create(&tc, id, alloc)?);
    Ok(log_files(&tc.path)
        .into_iter()
        .zip(log_files(&wc.path))
        .collect())
}

/// Finish the creation of a store that a crash interrupted after its commit point (device 0
/// in place): every file of the store missing under its name but present as `<name>.creating`
/// is renamed into place, and the directory synced.
pub(crate) fn complete_creation(cfg: &StoreConfig) -> StoreResult<()> {
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
pub(crate) fn remove_log(path: &Path) {
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
