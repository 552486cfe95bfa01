//! One device of a store: opening it, checking a set of devices, reading and writing its
//! pages, reserving its room; the layout arithmetic recovery and `shoal inspect` share.

use super::*;

/// One file or block device of a store, open.
pub(super) struct Device {
    pub(super) path: PathBuf,
    pub(super) file: File,
    pub(super) direct: bool,
    /// Bytes of the device with room reserved: the file's size at open, then what was
    /// reserved (regular files only).
    pub(super) extent: AtomicU64,
    pub(super) regular: bool,
    /// Reserve room by writing zero pages instead of `fallocate` (set when `fallocate` is not
    /// supported, or by `SHOAL_RESERVE_BY_WRITING=1`).
    pub(super) by_writing: AtomicBool,
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

pub(crate) fn io_err(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub(crate) fn classify_write_error(path: &Path, slot: u64, e: std::io::Error) -> StoreError {
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
pub(super) fn reserve_range(d: &Device, from: u64, to: u64) -> std::io::Result<()> {
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
pub(crate) fn check_device_path(path: &Path) -> StoreResult<()> {
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

pub(super) fn open_device(path: &Path) -> StoreResult<Device> {
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
pub(super) fn read_raw(
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

pub(super) fn write_raw(
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
