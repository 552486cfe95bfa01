//! The slot allocator of one page store.
//!
//! In memory: a high-water mark (`next_slot`, every slot below it has been handed out at least
//! once) and a LIFO free list of slots given back. At clean shutdown the free list is written
//! into the free slots themselves as a chain of pages (each holding up to
//! [`ENTRIES_PER_PAGE`] slot numbers), so persisting it costs no space; the superblock records
//! the chain's head and length. At open the chain is read back and its pages become free again.

use crate::error::{StoreError, StoreResult};
use crate::page::PAGE_DATA_SIZE;
use byteorder::{ByteOrder, LittleEndian};

/// Slot numbers one free-list page holds (header: next u64, count u32, pad u32).
pub const ENTRIES_PER_PAGE: usize = (PAGE_DATA_SIZE - 16) / 8;
/// "No slot" marker in free-list chains.
pub const NO_SLOT: u64 = u64::MAX;

/// In-memory allocator state.
#[derive(Debug, Default, Clone)]
pub struct Allocator {
    next_slot: u64,
    free: Vec<u64>,
    /// Maximum number of slots, 0 = unlimited.
    capacity: u64,
}

impl Allocator {
    pub fn new(next_slot: u64, free: Vec<u64>, capacity: u64) -> Self {
        Allocator {
            next_slot,
            free,
            capacity,
        }
    }

    /// Hand out a slot: a freed one if any, else the next new one.
    pub fn allocate(&mut self) -> StoreResult<u64> {
        self.allocate_noting_reuse().map(|(s, _)| s)
    }

    /// [`Allocator::allocate`], and whether the slot was used before (from the free list).
    pub fn allocate_noting_reuse(&mut self) -> StoreResult<(u64, bool)> {
        if let Some(s) = self.free.pop() {
            return Ok((s, true));
        }
        if self.capacity != 0 && self.next_slot >= self.capacity {
            return Err(StoreError::StoreFull {
                capacity: self.capacity,
            });
        }
        let s = self.next_slot;
        self.next_slot += 1;
        Ok((s, false))
    }

    /// Take back `slot`, just handed out by [`Allocator::allocate`] and never used: the next
    /// fresh slot again if it was that, else a free slot again.
    pub fn unallocate(&mut self, slot: u64) {
        if slot + 1 == self.next_slot {
            self.next_slot = slot;
        } else {
            debug_assert!(slot < self.next_slot && !self.free.contains(&slot));
            self.free.push(slot);
        }
    }

    /// Take a specific never-allocated slot (used for well-known pages such as the catalog).
    pub fn reserve_next(&mut self, slot: u64) -> StoreResult<()> {
        if slot != self.next_slot {
            return Err(StoreError::Config(format!(
                "slot {slot} is not the next fresh slot ({})",
                self.next_slot
            )));
        }
        self.next_slot += 1;
        Ok(())
    }

    /// Give a slot back.
    pub fn free(&mut self, slot: u64) -> StoreResult<()> {
        if slot >= self.next_slot {
            return Err(StoreError::SlotOutOfRange {
                slot,
                limit: self.next_slot,
            });
        }
        debug_assert!(!self.free.contains(&slot), "double free of slot {slot}");
        self.free.push(slot);
        Ok(())
    }

    /// Recovery: the log says `slot` was handed out (idempotent: replaying a record the
    /// snapshot already reflects changes nothing).
    pub fn replay_allocated(&mut self, slot: u64) {
        if slot >= self.next_slot {
            // slots skipped between were handed out before the snapshot or leak; never reused
            self.next_slot = slot + 1;
        } else if let Some(i) = self.free.iter().position(|&s| s == slot) {
            self.free.swap_remove(i);
        }
    }

    /// Recovery: the log says `slot` was given back (idempotent).
    pub fn replay_freed(&mut self, slot: u64) {
        if slot < self.next_slot && !self.free.contains(&slot) {
            self.free.push(slot);
        }
    }

    pub fn next_slot(&self) -> u64 {
        self.next_slot
    }
    pub fn free_slots(&self) -> &[u64] {
        &self.free
    }
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    /// Slots currently handed out.
    pub fn in_use(&self) -> u64 {
        self.next_slot - self.free.len() as u64
    }

    /// Split the free list into chain pages: returns (slot the page is stored in, next slot,
    /// entries). The chain pages live in the first free slots; every free slot (those included)
    /// is listed in some page.
    pub fn chain_pages(&self) -> Vec<(u64, u64, &[u64])> {
        let chunks: Vec<&[u64]> = self.free.chunks(ENTRIES_PER_PAGE).collect();
        let homes: Vec<u64> = self.free.iter().copied().take(chunks.len()).collect();
        chunks
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let next = homes.get(i + 1).copied().unwrap_or(NO_SLOT);
                (homes[i], next, *c)
            })
            .collect()
    }
}

/// Encode one free-list page's data area.
pub fn encode_chain_page(buf: &mut [u8], next: u64, entries: &[u64]) {
    assert!(entries.len() <= ENTRIES_PER_PAGE);
    buf[..PAGE_DATA_SIZE].fill(0);
    buf[0..8].copy_from_slice(&next.to_le_bytes());
    buf[8..12].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    for (i, e) in entries.iter().enumerate() {
        buf[16 + i * 8..24 + i * 8].copy_from_slice(&e.to_le_bytes());
    }
}

/// Decode one free-list page: (next, entries). Errors on an impossible count.
pub fn decode_chain_page(buf: &[u8]) -> Result<(u64, Vec<u64>), String> {
    let next = LittleEndian::read_u64(&buf[0..]);
    let n = LittleEndian::read_u32(&buf[8..]) as usize;
    if n > ENTRIES_PER_PAGE {
        return Err(format!(
            "free-list page claims {n} entries (max {ENTRIES_PER_PAGE})"
        ));
    }
    let entries = (0..n)
        .map(|i| LittleEndian::read_u64(&buf[16 + i * 8..]))
        .collect();
    Ok((next, entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unallocate_takes_back_exactly_what_allocate_handed_out() {
        let mut a = Allocator::new(10, vec![3], 0);
        let free_one = a.allocate().unwrap();
        assert_eq!(free_one, 3);
        let fresh = a.allocate().unwrap();
        assert_eq!(fresh, 10);
        a.unallocate(fresh);
        assert_eq!(a.next_slot(), 10, "a fresh slot is fresh again");
        a.unallocate(free_one);
        assert_eq!(a.free_slots(), &[3], "a free slot is free again");
        assert_eq!(a.in_use(), 9);
        assert_eq!(a.allocate().unwrap(), 3);
        assert_eq!(a.allocate().unwrap(), 10);
    }

    #[test]
    fn allocate_free_reuse_and_capacity() {
        let mut a = Allocator::new(0, vec![], 3);
        assert_eq!(a.allocate().unwrap(), 0);
        assert_eq!(a.allocate().unwrap(), 1);
        a.free(0).unwrap();
        assert_eq!(a.allocate().unwrap(), 0);
        assert_eq!(a.allocate().unwrap(), 2);
        assert!(matches!(
            a.allocate(),
            Err(StoreError::StoreFull { capacity: 3 })
        ));
        assert!(matches!(a.free(9), Err(StoreError::SlotOutOfRange { .. })));
    }

    #[test]
    fn chain_covers_every_free_slot() {
        let free: Vec<u64> = (0..(ENTRIES_PER_PAGE as u64 * 2 + 5)).rev().collect();
        let a = Allocator::new(10_000, free.clone(), 0);
        let pages = a.chain_pages();
        assert_eq!(pages.len(), 3);
        let mut all = Vec::new();
        let mut buf = vec![0u8; PAGE_DATA_SIZE];
        for (i, (home, next, entries)) in pages.iter().enumerate() {
            assert_eq!(*home, free[i]);
            encode_chain_page(&mut buf, *next, entries);
            let (n2, e2) = decode_chain_page(&buf).unwrap();
            assert_eq!(n2, *next);
            all.extend(e2);
        }
        assert_eq!(pages.last().unwrap().1, NO_SLOT);
        assert_eq!(all, free);
    }
}
