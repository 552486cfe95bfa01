//! The set of free frames: frames that hold no page and belong to nobody.
//!
//! A bitmap with one bit per frame (set = free), so that a fault or an allocation can ask for
//! one *particular* frame, its page's preferred frame ([`crate::buffer::frame::FramePool::preferred`]), and take
//! any other only when that one is busy. A page in its preferred frame is found without waiting for
//! the translation table (the guards start loading the preferred frame while they read the table
//! entry); when the pool holds the whole data set every page is at home.
//!
//! Taking a frame clears its bit with one atomic read-modify-write, so exactly one taker wins
//! it; giving it back sets the bit. The count is kept beside the bitmap for the provider's
//! "enough frames free?" checks; it may lag the bitmap by the operations in flight, never
//! below the number of set bits (see [`FreeFrames::put`]).
//!
//! Owns only the bits: the frames' state (FREE, latch) is the caller's business, as before a
//! frame is handed out: a frame is put back only when it is unlatched, FREE and unlinked.

use crate::buffer::frame::FrameIdx;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

pub struct FreeFrames {
    bits: Box<[AtomicU64]>,
    frames: usize,
    /// Number of free frames (see module docs: at least the number of set bits).
    count: AtomicUsize,
    /// Word where the last search for any free frame succeeded: the next starts there.
    cursor: AtomicUsize,
}

impl FreeFrames {
    /// A set holding every one of `frames` frames.
    pub fn all(frames: usize) -> FreeFrames {
        let words = frames.div_ceil(64);
        let bits = (0..words)
            .map(|w| {
                let in_word = (frames - w * 64).min(64);
                AtomicU64::new(if in_word == 64 {
                    u64::MAX
                } else {
                    (1u64 << in_word) - 1
                })
            })
            .collect();
        FreeFrames {
            bits,
            frames,
            count: AtomicUsize::new(frames),
            cursor: AtomicUsize::new(0),
        }
    }

    /// How many frames are free (a snapshot; see module docs).
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Take frame `idx` if it is free.
    #[inline]
    pub fn take(&self, idx: FrameIdx) -> bool {
        let (w, m) = Self::at(idx);
        let Some(word) = self.bits.get(w) else {
            return false;
        };
        // Cheap test first: a busy preferred frame (the common case once the pool is full) costs a
        // read, not a cache-line write. Relaxed: only a hint; the claim below decides.
        if word.load(Ordering::Relaxed) & m == 0 {
            return false;
        }
        // Acquire: the frame's last owner put it back with a Release (see `put`); its writes
        // to the frame (state FREE, unlinked) happen before ours.
        if word.fetch_and(!m, Ordering::Acquire) & m == 0 {
            return false; // another taker won it
        }
        self.count.fetch_sub(1, Ordering::Relaxed);
        true
    }

    /// Take any free frame (the first one from where the last search ended).
    pub fn take_any(&self) -> Option<FrameIdx> {
        if self.is_empty() {
            return None; // the count is at least the number of set bits: no bit is set
        }
        let words = self.bits.len();
        let start = self.cursor.load(Ordering::Relaxed) % words;
        for k in 0..words {
            let w = (start + k) % words;
            let word = &self.bits[w];
            let mut v = word.load(Ordering::Relaxed);
            while v != 0 {
                let m = 1u64 << v.trailing_zeros();
                // Acquire: as in `take`.
                let before = word.fetch_and(!m, Ordering::Acquire);
                if before & m != 0 {
                    self.count.fetch_sub(1, Ordering::Relaxed);
                    self.cursor.store(w, Ordering::Relaxed);
                    return Some(FrameIdx((w * 64) as u32 + m.trailing_zeros()));
                }
                v = before & !m; // lost that bit to another taker: try the word's others
            }
        }
        None
    }

    /// Give frame `idx` back. It must not be free already (a frame has one owner).
    pub fn put(&self, idx: FrameIdx) {
        assert!(idx.get() < self.frames, "{idx} out of range");
        let (w, m) = Self::at(idx);
        // Count first, bit second: a taker decrements only after clearing a set bit, so the
        // count never drops below the number of set bits (and `take_any`'s empty test is safe).
        self.count.fetch_add(1, Ordering::Relaxed);
        // Release: publishes the frame's reset state (pid NONE, FREE) to its next taker.
        let before = self.bits[w].fetch_or(m, Ordering::Release);
        assert!(before & m == 0, "{idx} was put back twice");
    }

    #[inline]
    fn at(idx: FrameIdx) -> (usize, u64) {
        (idx.get() / 64, 1u64 << (idx.0 % 64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    const fn fx(i: u32) -> FrameIdx {
        FrameIdx(i)
    }

    #[test]
    fn takes_each_frame_once_then_none() {
        let f = FreeFrames::all(130);
        assert_eq!(f.len(), 130);
        assert!(f.take(fx(129)));
        assert!(!f.take(fx(129)), "taken twice");
        assert!(!f.take(fx(130)), "out of range");
        let mut seen = HashSet::from([fx(129)]);
        while let Some(i) = f.take_any() {
            assert!(i.get() < 130 && seen.insert(i), "{i} handed out twice");
        }
        assert_eq!(seen.len(), 130);
        assert!(f.is_empty());
        f.put(fx(7));
        assert_eq!(f.len(), 1);
        assert!(f.take(fx(7)));
        f.put(fx(64));
        assert_eq!(f.take_any(), Some(fx(64)));
        assert_eq!(f.take_any(), None);
    }

    #[test]
    #[should_panic(expected = "put back twice")]
    fn a_frame_put_back_twice_is_a_bug() {
        let f = FreeFrames::all(10);
        f.put(fx(3));
    }

    #[test]
    fn concurrent_takers_never_share_a_frame() {
        let f = FreeFrames::all(10_000);
        let taken: Vec<Vec<FrameIdx>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4u32)
                .map(|t| {
                    let f = &f;
                    s.spawn(move || {
                        let mut mine = Vec::new();
                        for i in 0..5_000u32 {
                            // half by "home" (overlapping between threads), half any
                            if f.take(fx((i * 2 + t) % 10_000)) {
                                mine.push(fx((i * 2 + t) % 10_000));
                            } else if let Some(x) = f.take_any() {
                                mine.push(x);
                            }
                            if i % 3 == 0 {
                                if let Some(x) = mine.pop() {
                                    f.put(x);
                                }
                            }
                        }
                        mine
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all = HashSet::new();
        for x in taken.iter().flatten() {
            assert!(all.insert(*x), "frame {x} held by two threads");
        }
        assert_eq!(f.len() + all.len(), 10_000);
        let mut rest = 0;
        while f.take_any().is_some() {
            rest += 1;
        }
        assert_eq!(rest + all.len(), 10_000);
    }
}
