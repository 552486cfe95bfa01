//! The translation table: page id -> frame index.
//!
//! Page ids are dense: a node's pages are slots `0..high_water` of its store. So the table is
//! a direct-mapped array per home node, indexed by slot, of `AtomicU32` entries (frame index +
//! 1, 0 = not resident). Each array is one anonymous `MAP_NORESERVE` mapping of
//! [`MAX_SLOTS_PER_NODE`] entries; the kernel materialises only the parts that are touched, so
//! a node with N pages costs about 4N bytes, and those bytes are contiguous: the translation
//! entries of a working set stay in the CPU caches where a hash table's scattered buckets did
//! not (measured in docs/BENCHMARKS.md).
//!
//! Lookups take no lock and write nothing: one atomic load. Inserts and removals of a pid take
//! the lock of its partition (one of [`PARTITIONS`] mutexes), which also serialises a fault's
//! "is it resident? no: claim a frame" decision for that pid.
//!
//! A lock-free lookup is a *hint*: the frame it names may be evicted and reused at any moment.
//! Callers re-check the frame's pid under its latch (and validation catches the rest).

use crate::buffer::frame::{FrameIdx, FramePool};
use crate::buffer::mapped::MappedSlice;
use crate::pid::{Pid, MAX_NODES};
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// Number of insert/remove partitions.
pub const PARTITIONS: usize = 256;
/// Most page slots one node's store may have (16 TiB of 4 KiB pages): the size of each
/// node's direct-mapped array (4 bytes per slot, reserved but not committed).
pub const MAX_SLOTS_PER_NODE: u64 = 1 << 32;

pub struct TranslationTable {
    nodes: Box<[OnceLock<MappedSlice<AtomicU32>>]>,
    locks: Box<[Mutex<()>]>,
}

/// Proof of holding the partition lock for one pid.
pub struct PartitionLock<'a> {
    _g: MutexGuard<'a, ()>,
    pid: Pid,
}

/// One node's array: MAX_SLOTS_PER_NODE entries, reserved, all "not resident".
fn node_array() -> std::io::Result<MappedSlice<AtomicU32>> {
    // SAFETY: all-zero bytes are a valid AtomicU32 (the value 0: "not resident").
    unsafe { MappedSlice::zeroed(MAX_SLOTS_PER_NODE as usize) }
}

impl TranslationTable {
    pub fn new() -> Self {
        TranslationTable {
            nodes: (0..MAX_NODES).map(|_| OnceLock::new()).collect(),
            locks: (0..PARTITIONS).map(|_| Mutex::new(())).collect(),
        }
    }

    /// Reserve node `node`'s array now. It is otherwise reserved at the first insert of one
    /// of its pages, where running out of address space could only panic; engines reserve the
    /// arrays of every node they will hold pages of when they open, so that a process without
    /// 16 GiB of address space per node (`ulimit -v`) gets an error instead.
    pub fn reserve(&self, node: u8) -> std::io::Result<()> {
        let Some(cell) = self.nodes.get(node as usize) else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("node {node}: at most {MAX_NODES} nodes"),
            ));
        };
        if cell.get().is_none() {
            // Another thread may have set it meanwhile: then ours is unmapped again.
            let _ = cell.set(node_array()?);
        }
        Ok(())
    }

    /// The entry of `pid`, if its node's array exists and the slot is in range.
    #[inline]
    fn entry(&self, pid: Pid) -> Option<&AtomicU32> {
        let arr = self.nodes.get(pid.node() as usize)?.get()?;
        arr.get(pid.slot() as usize)
    }

    /// The entry of `pid`, creating its node's array if needed (insert path).
    fn entry_or_map(&self, pid: Pid) -> &AtomicU32 {
        let arr = self.nodes[pid.node() as usize].get_or_init(|| {
            node_array().expect(
                "reserving address space for the translation table (engines reserve every \
                 member's array when they open, so this is only reached by a pid of a node \
                 outside the cluster)",
            )
        });
        &arr[pid.slot() as usize]
    }

    /// Lock-free lookup (a hint, see module docs).
    #[inline]
    pub fn lookup(&self, pool: &FramePool, pid: Pid) -> Option<FrameIdx> {
        // Acquire: pairs with the Release in `insert`, so the frame's pid written before the
        // entry is visible.
        let at = self.entry(pid)?.load(Ordering::Acquire);
        if at == 0 {
            return None;
        }
        // Start loading the page's first lines now, in parallel with the frame descriptor
        // (its pid and latch are the next, dependent, cache miss).
        pool.prefetch_page(FrameIdx(at - 1));
        Some(FrameIdx(at - 1))
    }

    /// Hint: `pid` will be looked up soon.
    #[inline]
    pub fn prefetch(&self, pid: Pid) {
        if let Some(e) = self.entry(pid) {
            crate::buffer::mapped::prefetch(e as *const AtomicU32 as *const u8);
        }
    }

    /// Hint: `pid` will be latched soon and its entry is (probably) cached: if it is resident,
    /// start loading its frame descriptor and first page lines. Returns whether it is
    /// resident (a hint too: it may be evicted at any moment).
    #[inline]
    pub fn prefetch_frame(&self, pool: &FramePool, pid: Pid) -> bool {
        // Relaxed: only a hint; whatever frame it names is re-checked when it is latched.
        match self.entry(pid).map(|e| e.load(Ordering::Relaxed)) {
            Some(at) if at != 0 => {
                pool.prefetch_frame(FrameIdx(at - 1));
                true
            }
            _ => false,
        }
    }

    /// Lock the partition of `pid`. Panics for a pid whose slot is out of range (callers check
    /// the slot against the store's high-water mark, which is below [`MAX_SLOTS_PER_NODE`]).
    pub fn lock(&self, pid: Pid) -> PartitionLock<'_> {
        assert!(
            (pid.node() as usize) < MAX_NODES && pid.slot() < MAX_SLOTS_PER_NODE,
            "pid {pid} outside the translation table"
        );
        let h = (pid.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize;
        PartitionLock {
            _g: self.locks[h % PARTITIONS].lock(),
            pid,
        }
    }

    /// Exact lookup under the partition lock.
    pub fn lookup_locked(&self, lock: &PartitionLock<'_>, pid: Pid) -> Option<FrameIdx> {
        debug_assert_eq!(lock.pid, pid);
        let at = self.entry(pid)?.load(Ordering::Relaxed);
        (at != 0).then(|| FrameIdx(at - 1))
    }

    /// Point `lock`'s pid at frame `idx` (whose pid is already set).
    pub fn insert(&self, pool: &FramePool, lock: &PartitionLock<'_>, idx: FrameIdx) {
        debug_assert_eq!(pool.frame(idx).pid(), lock.pid);
        // Release: publishes the frame's pid to lock-free readers of the entry.
        self.entry_or_map(lock.pid)
            .store(idx.0 + 1, Ordering::Release);
    }

    /// Remove `lock`'s pid if it points at frame `idx`. Returns whether it did.
    pub fn remove(&self, lock: &PartitionLock<'_>, idx: FrameIdx) -> bool {
        match self.entry(lock.pid) {
            Some(e) if e.load(Ordering::Relaxed) == idx.0 + 1 => {
                e.store(0, Ordering::Release);
                true
            }
            _ => false,
        }
    }
}

impl Default for TranslationTable {
    fn default() -> Self {
        Self::new()
    }
}
