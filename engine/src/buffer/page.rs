//! Race-free access to page bytes.
//!
//! A frame's page may be read by optimistic readers while an exclusive holder writes it. In
//! Rust's memory model a plain read racing with a write is undefined behaviour, and so are racing
//! atomic accesses of *different sizes*. Shoal therefore accesses page memory in exactly one way
//! whenever a race is possible: as an array of `AtomicU64` words with `Relaxed` loads and stores.
//! Byte-level reads load the covering words and extract bytes; byte-level writes (only ever done
//! by the single exclusive holder) load, merge and store whole words. The latch's fences (see
//! [`crate::buffer::latch`]) provide the ordering; validation rejects anything torn.
//!
//! [`PageRef`] is *total*: every offset and length is accepted and out-of-range bytes read as
//! zero, because an optimistic reader may compute offsets from a page that is changing under it.
//! Such reads return garbage, never fault; the caller must validate before trusting anything.
//!
//! Only the first [`PAGE_DATA_SIZE`] bytes are visible; the trailer belongs to the store.

use byteorder::{ByteOrder, LittleEndian};
use shoal_storage::PAGE_DATA_SIZE;
use std::sync::atomic::{AtomicU64, Ordering};

const WORDS: usize = PAGE_DATA_SIZE / 8;
const _: () = assert!(PAGE_DATA_SIZE.is_multiple_of(8));

/// Read access to one page's data area.
#[derive(Clone, Copy)]
pub struct PageRef<'a> {
    words: &'a [AtomicU64; WORDS],
}

/// Write access to one page's data area (held only by the exclusive latch holder).
pub struct PageMut<'a> {
    words: &'a [AtomicU64; WORDS],
    /// Where the writes went, for the write-ahead log (None: not logged).
    changed: Option<&'a mut Changed>,
}

/// The byte ranges of a page an exclusive guard changed: at most [`Changed::MAX`] ranges,
/// sorted and disjoint; when more would be needed, the two closest merge (logging a few
/// unchanged bytes costs less than bookkeeping). Ranges closer than [`Changed::GAP`] merge.
/// Fixed size: no allocation per guard.
#[derive(Debug, Clone, Default)]
pub struct Changed {
    ranges: [(u16, u16); Changed::MAX + 1], // (start, end)
    n: usize,
}

impl Changed {
    pub const MAX: usize = 8;
    pub const GAP: u16 = 16;

    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Note a write of `len` bytes at `off` (within the data area).
    pub fn note(&mut self, off: usize, len: usize) {
        if len == 0 {
            return;
        }
        debug_assert!(off + len <= PAGE_DATA_SIZE);
        let (mut s, mut e) = (off as u16, (off + len) as u16);
        // merge every range that overlaps or nearly touches [s, e)
        let mut i = 0;
        while i < self.n {
            let (rs, re) = self.ranges[i];
            if rs <= e.saturating_add(Self::GAP) && s <= re.saturating_add(Self::GAP) {
                s = s.min(rs);
                e = e.max(re);
                self.ranges.copy_within(i + 1..self.n, i);
                self.n -= 1;
            } else {
                i += 1;
            }
        }
        let at = self.ranges[..self.n].partition_point(|r| r.0 < s);
        self.ranges.copy_within(at..self.n, at + 1);
        self.ranges[at] = (s, e);
        self.n += 1;
        if self.n > Self::MAX {
            let k = (0..self.n - 1)
                .min_by_key(|&k| self.ranges[k + 1].0 - self.ranges[k].1)
                .expect("at least two ranges");
            self.ranges[k].1 = self.ranges[k + 1].1;
            self.ranges.copy_within(k + 2..self.n, k + 1);
            self.n -= 1;
        }
        debug_assert!(self.ranges[..self.n].windows(2).all(|w| w[0].1 < w[1].0));
    }

    /// The changed ranges as (offset, length), in offset order.
    pub fn ranges(&self) -> impl ExactSizeIterator<Item = (u16, u16)> + '_ {
        self.ranges[..self.n].iter().map(|&(s, e)| (s, e - s))
    }
}

impl<'a> PageRef<'a> {
    /// # Safety
    /// `ptr` must point to 8-aligned memory of at least [`PAGE_DATA_SIZE`] bytes that lives for
    /// `'a` and that is only accessed through atomics (or by the kernel for I/O) while shared.
    pub(crate) unsafe fn from_ptr(ptr: *const u8) -> Self {
        debug_assert_eq!(ptr as usize % 8, 0);
        PageRef {
            // SAFETY: AtomicU64 has the size and alignment of u64; the caller guarantees the
            // memory is valid, 8-aligned, long enough and only accessed atomically while shared.
            words: unsafe { &*(ptr as *const [AtomicU64; WORDS]) },
        }
    }

    #[inline]
    fn word(&self, i: usize) -> u64 {
        match self.words.get(i) {
            Some(w) => w.load(Ordering::Relaxed),
            None => 0,
        }
    }

    /// Read `dst.len()` bytes starting at `off` (out of range -> zeros).
    #[inline]
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        let mut i = 0;
        let mut pos = off;
        // Leading bytes up to a word boundary.
        let within = pos % 8;
        if within != 0 && !dst.is_empty() {
            let bytes = self.word(pos / 8).to_le_bytes();
            let n = (8 - within).min(dst.len());
            dst[..n].copy_from_slice(&bytes[within..within + n]);
            i = n;
            pos = pos.saturating_add(n);
        }
        // Whole words: one load and one 8-byte store each (one range check for all of them
        // when they lie inside the page).
        let (chunks, _) = dst[i..].as_chunks_mut::<8>();
        let (first, whole) = (pos / 8, chunks.len());
        match first
            .checked_add(whole)
            .and_then(|end| self.words.get(first..end))
        {
            Some(words) => {
                for (c, w) in chunks.iter_mut().zip(words) {
                    *c = w.load(Ordering::Relaxed).to_le_bytes();
                }
            }
            None => {
                for (k, c) in chunks.iter_mut().enumerate() {
                    *c = self.word(first.saturating_add(k)).to_le_bytes();
                }
            }
        }
        i += whole * 8;
        pos = pos.saturating_add(whole * 8);
        // Trailing bytes.
        if i < dst.len() {
            let bytes = self.word(pos / 8).to_le_bytes();
            let n = dst.len() - i;
            dst[i..].copy_from_slice(&bytes[..n]);
        }
    }

    /// Little-endian u64 at `off` (any alignment).
    #[inline]
    pub fn u64(&self, off: usize) -> u64 {
        if off.is_multiple_of(8) {
            return self.word(off / 8);
        }
        let mut b = [0u8; 8];
        self.read(off, &mut b);
        u64::from_le_bytes(b)
    }

    /// Little-endian u32 at `off`.
    #[inline]
    pub fn u32(&self, off: usize) -> u32 {
        if off % 8 <= 4 {
            return (self.word(off / 8) >> ((off % 8) * 8)) as u32;
        }
        let mut b = [0u8; 4];
        self.read(off, &mut b);
        u32::from_le_bytes(b)
    }

    /// Little-endian u16 at `off`.
    #[inline]
    pub fn u16(&self, off: usize) -> u16 {
        if off % 8 <= 6 {
            return (self.word(off / 8) >> ((off % 8) * 8)) as u16;
        }
        let mut b = [0u8; 2];
        self.read(off, &mut b);
        u16::from_le_bytes(b)
    }

    /// Byte at `off`.
    #[inline]
    pub fn u8(&self, off: usize) -> u8 {
        (self.word(off / 8) >> ((off % 8) * 8)) as u8
    }

    /// Hint: bytes `off..off + len` will be read soon (starts loading their cache lines; a
    /// garbage range from a changing page is harmless: prefetches never fault).
    #[inline]
    pub fn prefetch(&self, off: usize, len: usize) {
        let base = self.words.as_ptr() as *const u8;
        let end = off.saturating_add(len).min(PAGE_DATA_SIZE);
        let mut o = off & !63;
        while o < end {
            crate::buffer::mapped::prefetch(base.wrapping_add(o));
            o += 64;
        }
    }

    /// Copy the whole data area out.
    pub fn copy_out(&self, dst: &mut [u8; PAGE_DATA_SIZE]) {
        for (i, w) in self.words.iter().enumerate() {
            dst[i * 8..i * 8 + 8].copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
    }

    /// Compare `len` bytes at `off` with `other` (lexicographic, like `[u8]::cmp`).
    pub fn compare(&self, off: usize, len: usize, other: &[u8]) -> std::cmp::Ordering {
        let mut buf = [0u8; 64];
        let mut done = 0;
        while done < len && done < other.len() {
            let n = (len - done).min(other.len() - done).min(buf.len());
            self.read(off.saturating_add(done), &mut buf[..n]);
            match buf[..n].cmp(&other[done..done + n]) {
                std::cmp::Ordering::Equal => done += n,
                o => return o,
            }
        }
        len.cmp(&other.len())
    }
}

impl<'a> PageMut<'a> {
    /// # Safety
    /// As [`PageRef::from_ptr`], and the caller must be the only writer of this memory for `'a`.
    pub(crate) unsafe fn from_ptr(ptr: *mut u8) -> Self {
        debug_assert_eq!(ptr as usize % 8, 0);
        PageMut {
            // SAFETY: as in PageRef::from_ptr; the caller is the only writer for 'a.
            words: unsafe { &*(ptr as *const [AtomicU64; WORDS]) },
            changed: None,
        }
    }

    /// Record every write in `changed` (for the write-ahead log).
    pub(crate) fn tracking(mut self, changed: &'a mut Changed) -> Self {
        self.changed = Some(changed);
        self
    }

    /// Read view of the same page.
    #[inline]
    pub fn as_ref(&self) -> PageRef<'_> {
        PageRef { words: self.words }
    }

    fn check(off: usize, len: usize) {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= PAGE_DATA_SIZE),
            "page write out of range: {off}+{len} > {PAGE_DATA_SIZE}"
        );
    }

    /// Write `src` at `off`. Panics if the range leaves the data area (a programming error: the
    /// exclusive holder sees a consistent page).
    #[inline]
    pub fn write(&mut self, off: usize, src: &[u8]) {
        Self::check(off, src.len());
        if let Some(c) = self.changed.as_deref_mut() {
            c.note(off, src.len());
        }
        if off.is_multiple_of(8) && src.len().is_multiple_of(8) {
            // whole words (what `ExclusiveGuard::modify` stores): one store per word
            let words = &self.words[off / 8..(off + src.len()) / 8];
            for (w, b) in words.iter().zip(src.chunks_exact(8)) {
                w.store(LittleEndian::read_u64(b), Ordering::Relaxed);
            }
            return;
        }
        let mut i = 0;
        let mut pos = off;
        while i < src.len() {
            let wi = pos / 8;
            let within = pos % 8;
            let n = (8 - within).min(src.len() - i);
            let w = &self.words[wi];
            let new = if n == 8 {
                LittleEndian::read_u64(&src[i..])
            } else {
                // Only the exclusive holder writes, so load-merge-store loses nothing.
                let mut b = w.load(Ordering::Relaxed).to_le_bytes();
                b[within..within + n].copy_from_slice(&src[i..i + n]);
                u64::from_le_bytes(b)
            };
            w.store(new, Ordering::Relaxed);
            i += n;
            pos += n;
        }
    }

    pub fn set_u64(&mut self, off: usize, v: u64) {
        self.write(off, &v.to_le_bytes())
    }
    pub fn set_u32(&mut self, off: usize, v: u32) {
        self.write(off, &v.to_le_bytes())
    }
    pub fn set_u16(&mut self, off: usize, v: u16) {
        self.write(off, &v.to_le_bytes())
    }
    pub fn set_u8(&mut self, off: usize, v: u8) {
        self.write(off, &[v])
    }

    /// Fill `len` bytes at `off` with `byte`.
    pub fn fill(&mut self, off: usize, len: usize, byte: u8) {
        Self::check(off, len);
        let chunk = [byte; 64];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(64);
            self.write(off + done, &chunk[..n]);
            done += n;
        }
    }

    /// Move `len` bytes from `src` to `dst` within the page (ranges may overlap).
    pub fn copy_within(&mut self, src: usize, dst: usize, len: usize) {
        Self::check(src, len);
        Self::check(dst, len);
        let mut tmp = [0u8; PAGE_DATA_SIZE];
        self.as_ref().read(src, &mut tmp[..len]);
        self.write(dst, &tmp[..len]);
    }

    /// Replace the whole data area.
    pub fn copy_in(&mut self, src: &[u8; PAGE_DATA_SIZE]) {
        if let Some(c) = self.changed.as_deref_mut() {
            c.note(0, PAGE_DATA_SIZE);
        }
        for (i, w) in self.words.iter().enumerate() {
            w.store(LittleEndian::read_u64(&src[i * 8..]), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_storage::AlignedPage;

    #[test]
    fn unaligned_reads_and_writes_roundtrip() {
        let mut buf = AlignedPage::new();
        let p = buf.as_mut_ptr();
        // SAFETY: buf is a live aligned page used by this thread only.
        let mut m = unsafe { PageMut::from_ptr(p) };
        m.write(3, b"hello, shoal pages!");
        m.set_u64(29, 0x0102_0304_0506_0708);
        m.set_u16(7, 0xBEEF);
        m.set_u32(4090 - 16 - 4, 77);
        let r = m.as_ref();
        let mut out = [0u8; 19];
        r.read(3, &mut out);
        assert_eq!(&out[..4], b"hell");
        assert_eq!(out[4], 0xEF, "byte 7 was overwritten by the u16");
        assert_eq!(r.u16(7), 0xBEEF);
        assert_eq!(r.u64(29), 0x0102_0304_0506_0708);
        assert_eq!(r.u32(4090 - 16 - 4), 77);
        assert_eq!(r.u8(29), 8);
        m.copy_within(29, 30, 8);
        assert_eq!(m.as_ref().u64(30), 0x0102_0304_0506_0708);
        m.copy_within(30, 2, 8);
        assert_eq!(m.as_ref().u64(2), 0x0102_0304_0506_0708);
        assert_eq!(
            m.as_ref()
                .compare(2, 8, &0x0102_0304_0506_0708u64.to_le_bytes()),
            std::cmp::Ordering::Equal
        );
    }

    #[test]
    fn out_of_range_reads_are_zero_not_faults() {
        let mut buf = AlignedPage::new();
        buf[..PAGE_DATA_SIZE].fill(0xAA);
        // SAFETY: as above.
        let r = unsafe { PageRef::from_ptr(buf.as_mut_ptr()) };
        let mut out = [1u8; 16];
        r.read(PAGE_DATA_SIZE - 4, &mut out);
        assert_eq!(&out[..4], &[0xAA; 4]);
        assert_eq!(&out[4..], &[0u8; 12]);
        assert_eq!(r.u64(usize::MAX - 3), 0);
        r.read(usize::MAX - 2, &mut out);
        assert_eq!(out, [0u8; 16]);
    }

    #[test]
    fn reads_at_every_alignment_and_length_match_the_bytes() {
        let mut buf = AlignedPage::new();
        for (i, b) in buf[..PAGE_DATA_SIZE].iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let bytes: Vec<u8> = buf[..PAGE_DATA_SIZE].to_vec();
        // SAFETY: as above.
        let r = unsafe { PageRef::from_ptr(buf.as_mut_ptr()) };
        let starts = (0..40).chain(PAGE_DATA_SIZE - 40..PAGE_DATA_SIZE + 9);
        for off in starts {
            for len in 0..70 {
                let mut out = vec![0x55u8; len];
                r.read(off, &mut out);
                let want: Vec<u8> = (off..off + len)
                    .map(|o| bytes.get(o).copied().unwrap_or(0))
                    .collect();
                assert_eq!(out, want, "read({off}, {len})");
            }
        }
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn out_of_range_write_panics() {
        let mut buf = AlignedPage::new();
        // SAFETY: as above.
        let mut m = unsafe { PageMut::from_ptr(buf.as_mut_ptr()) };
        m.write(PAGE_DATA_SIZE - 2, b"abc");
    }
}
