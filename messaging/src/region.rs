//! [`Region`]: the memory of one node that peers write into with one-sided writes.
//!
//! The region is an array of `AtomicU64` words. Every write is a whole number of aligned words
//! and is applied by [`Region::apply`]: all words but the last with `Relaxed` stores, the last
//! with a `Release` store. A reader that observes the last word with an `Acquire` load therefore
//! sees the whole write. Mailbox messages put their "full" flag in the last byte of their last
//! word, so "flag seen" implies "message complete" (the flag is written last). Because all
//! accesses are word-sized atomics, a reader polling a slot while a writer fills it is never a
//! data race.
//!
//! Each 64-byte slot of the mailbox area may be tied to a wait queue; after applying a write
//! that ends in such a slot, the writer wakes the queue's parked thread (see [`crate::wait`]).
//!
//! A region may also carry its owner's **service** ([`Region::set_service`]): what the owning
//! node does with what arrives, callable by any thread (see [`Region::serve`]). A thread that
//! waits for an answer can then do the receiver's work itself instead of waking the thread
//! that would (the engine registers a round of its message handler). While such **helpers**
//! poll a region ([`Region::helpers`]), writes into it wake nobody. This crate does not know
//! what the service does.

use crate::error::MsgError;
pub use crate::wait::WaitQueue;
use byteorder::{ByteOrder, LittleEndian};
use std::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

/// A region owner's service: handle what arrived, if nobody else is doing it right now.
/// Returns whether it did some work. Must not block for long (it runs on other threads).
pub type Service = Box<dyn Fn() -> bool + Send + Sync>;

/// Bytes of one mailbox slot (one message).
pub const SLOT_BYTES: usize = 64;

pub struct Region {
    words: Box<[AtomicU64]>,
    /// Wait queue of each slot of the mailbox area (`slot_queue[i]` for slot `i`), if any.
    slot_queue: Box<[u32]>,
    queues: Box<[WaitQueue]>,
    /// The owner's current service: null, or one of `services` (see [`Region::serve`]).
    service: AtomicPtr<Service>,
    /// Every service registered so far (a restarted owner registers its own): kept until
    /// the region is dropped, so that `service` never points to a freed one. (Boxed again:
    /// `service` points to a `Service`, which must not move when the vector grows.)
    #[allow(clippy::vec_box)]
    services: Mutex<Vec<Box<Service>>>,
    /// Threads polling this region on its owner's behalf right now (see `helpers`).
    helpers: AtomicU32,
}

/// Marks a slot that no queue waits on.
pub const NO_QUEUE: u32 = u32::MAX;

impl Region {
    /// A zeroed region of `bytes` (a multiple of 8) whose first `slot_queue.len()` slots wake the
    /// given queues (of `queues` in all).
    pub fn new(bytes: usize, slot_queue: Vec<u32>, queues: usize) -> Result<Region, MsgError> {
        if !bytes.is_multiple_of(8) || slot_queue.len() * SLOT_BYTES > bytes {
            return Err(MsgError::Config(format!(
                "region of {bytes} bytes cannot hold {} slots",
                slot_queue.len()
            )));
        }
        if slot_queue
            .iter()
            .any(|&q| q != NO_QUEUE && q as usize >= queues)
        {
            return Err(MsgError::Config(
                "slot tied to a queue that does not exist".into(),
            ));
        }
        Ok(Region {
            words: (0..bytes / 8).map(|_| AtomicU64::new(0)).collect(),
            slot_queue: slot_queue.into_boxed_slice(),
            queues: (0..queues).map(|_| WaitQueue::new()).collect(),
            service: AtomicPtr::new(std::ptr::null_mut()),
            services: Mutex::new(Vec::new()),
            helpers: AtomicU32::new(0),
        })
    }

    /// Threads that poll this region and run its service themselves right now (workers that
    /// wait for an answer). While there are any, writers do not wake the region's parked
    /// threads (a wake-up is a system call on the writer's path and a context switch on a busy
    /// machine): a helper sees the message. See [`Region::stop_helping`] for why nothing is
    /// left behind when the last helper goes.
    pub fn helpers(&self) -> u32 {
        self.helpers.load(Ordering::SeqCst)
    }

    /// A thread starts polling this region (and running its service) for its owner.
    pub fn start_helping(&self) {
        self.helpers.fetch_add(1, Ordering::SeqCst);
    }

    /// A thread stops polling this region. The last one runs the service once more: a write
    /// that came after its last look saw helpers there and woke nobody. Dekker's argument (as
    /// in [`crate::wait`]): the writer publishes its message, fences (SeqCst) and reads the
    /// count; the helper decrements, fences and looks for messages. Either the writer reads
    /// zero and wakes the owner's threads, or this last look finds the message. If the look
    /// cannot take the owner's handler role, its holder is the owner's own thread (every
    /// other holder is a counted helper), which looks again before it parks.
    pub fn stop_helping(&self) {
        let before = self.helpers.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(before > 0, "stop_helping without start_helping");
        if before == 1 {
            fence(Ordering::SeqCst);
            self.serve();
        }
    }

    /// Register the owner's service, in place of an earlier one (an owner restarted into
    /// the same region: [`Region::reset`]; a thread running the earlier one finishes it).
    pub fn set_service(&self, s: Service) {
        let mut all = self.services.lock().unwrap_or_else(|e| e.into_inner());
        let mut b = Box::new(s);
        let p: *mut Service = &mut *b;
        all.push(b);
        // Release: a thread that loads the pointer (Acquire) sees the service it points to.
        self.service.store(p, Ordering::Release);
    }

    /// Run the owner's service, if one is registered. Returns whether it did some work.
    pub fn serve(&self) -> bool {
        // Acquire: pairs with the Release in `set_service`.
        let p = self.service.load(Ordering::Acquire);
        // SAFETY: `p` is null or points into a Box in `services`, which only grows and is
        // dropped with the region (a Box's contents never move), so it is valid for as long
        // as `&self`; services are `Sync` (`Service` is `Send + Sync`), so calling one through
        // a shared reference from any thread is sound.
        unsafe { p.as_ref() }.is_some_and(|s| s())
    }

    /// Zero every word, as in a new region, for the owner's next incarnation (a node that
    /// restarts into it, [`crate::MemTransport::revive`]), and wake every waiter. Nobody may
    /// write into the region meanwhile: the caller keeps its writers out (the owner is dead
    /// to them) and its owner's threads have stopped. Helpers and the service stay (the new
    /// owner registers its own).
    pub fn reset(&self) {
        for w in self.words.iter() {
            // Relaxed: published by the fence below and by whatever makes the owner alive again
            w.store(0, Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
        self.wake_all();
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.words.len() * 8
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Check that a write of `len` bytes at `offset` is aligned and inside the region.
    pub fn check(&self, offset: usize, len: usize) -> Result<(), MsgError> {
        let ok = len > 0
            && offset.is_multiple_of(8)
            && len.is_multiple_of(8)
            && offset.checked_add(len).is_some_and(|end| end <= self.len());
        if ok {
            Ok(())
        } else {
            Err(MsgError::OutOfBounds {
                offset,
                len,
                region: self.len(),
            })
        }
    }

    /// Apply a one-sided write (see module docs) and wake whoever waits on the slot it ends in.
    pub fn apply(&self, offset: usize, data: &[u8]) -> Result<(), MsgError> {
        self.check(offset, data.len())?;
        let first = offset / 8;
        let n = data.len() / 8;
        for (i, chunk) in data.chunks_exact(8).enumerate() {
            let w = LittleEndian::read_u64(chunk);
            // Relaxed for the body; Release for the last word publishes the whole write.
            let order = if i + 1 == n {
                Ordering::Release
            } else {
                Ordering::Relaxed
            };
            self.words[first + i].store(w, order);
        }
        self.wake_slot((offset + data.len() - 1) / SLOT_BYTES);
        Ok(())
    }

    /// Wake whoever waits on mailbox slot `slot` (for transports whose writes land without the
    /// CPU, like RDMA: the receiver learns of the write from a completion and wakes here). A slot
    /// outside the mailbox area or without a queue is ignored.
    pub fn wake_slot(&self, slot: usize) {
        if let Some(&q) = self.slot_queue.get(slot) {
            if q != NO_QUEUE {
                self.wake_unless_helped(q);
            }
        }
    }

    /// Wake queue `q`'s parked thread about new work, unless helpers poll this region (they
    /// take the work; see [`Region::stop_helping`] for why none is left behind).
    pub fn wake_unless_helped(&self, q: u32) {
        // SeqCst fence: orders the work just published before the load of `helpers`; a helper
        // that is there will see the work.
        fence(Ordering::SeqCst);
        if self.helpers.load(Ordering::Relaxed) > 0 {
            return;
        }
        self.queues[q as usize].wake();
    }

    /// Number of mailbox slots (the first `wake_slots() * SLOT_BYTES` bytes) that may have
    /// waiters to wake.
    pub fn wake_slots(&self) -> usize {
        self.slot_queue.len()
    }

    /// Start of the region's memory, for registering it with a NIC. Hardware writes into it
    /// behave like another thread's plain stores of whole words; Shoal's readers access the
    /// region only through atomic loads.
    pub fn base_ptr(&self) -> *mut u8 {
        self.words.as_ptr() as *mut u8
    }

    /// Load one word (Acquire: pairs with the Release of `apply`'s last word).
    #[inline]
    pub fn load(&self, offset: usize) -> u64 {
        self.words[offset / 8].load(Ordering::Acquire)
    }

    /// Store one word locally (Release).
    #[inline]
    pub fn store(&self, offset: usize, v: u64) {
        self.words[offset / 8].store(v, Ordering::Release)
    }

    /// Copy `out.len()` bytes (a multiple of 8) at `offset` out of the region.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), MsgError> {
        self.check(offset, out.len())?;
        for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
            // Relaxed: callers first observe the write's last word with `load` (Acquire).
            chunk.copy_from_slice(
                &self.words[offset / 8 + i]
                    .load(Ordering::Relaxed)
                    .to_le_bytes(),
            );
        }
        Ok(())
    }

    /// The wait queue `q`.
    pub fn queue(&self, q: u32) -> &WaitQueue {
        &self.queues[q as usize]
    }

    /// Wake every queue (a peer died: waiters must re-check and fail).
    pub fn wake_all(&self) {
        for q in self.queues.iter() {
            q.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_alignment_are_checked() {
        let r = Region::new(256, vec![NO_QUEUE; 2], 0).unwrap();
        assert!(r.apply(0, &[1u8; 64]).is_ok());
        assert!(matches!(
            r.apply(3, &[1u8; 8]),
            Err(MsgError::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.apply(8, &[1u8; 7]),
            Err(MsgError::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.apply(256, &[1u8; 8]),
            Err(MsgError::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.apply(usize::MAX - 7, &[1u8; 8]),
            Err(MsgError::OutOfBounds { .. })
        ));
        assert!(matches!(r.apply(0, &[]), Err(MsgError::OutOfBounds { .. })));
        let mut out = [0u8; 16];
        r.read(48, &mut out).unwrap();
        assert_eq!(out, [1u8; 16]);
        assert!(Region::new(100, vec![], 0).is_err());
        assert!(Region::new(64, vec![0], 0).is_err());
    }
}
