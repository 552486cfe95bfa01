//! Anonymous memory mappings for the engine's large arrays, advised to use transparent huge
//! pages: page memory, frame descriptors ([`MappedSlice`]) and the translation table's per-node
//! arrays ([`MappedSlice::zeroed`], which reserves address space without committing it). These
//! are read on every page access at random positions; with 4 KiB pages those reads would miss
//! the TLB as well as the caches.

use std::ops::Deref;
use std::ptr::NonNull;

/// Map `bytes` of zeroed, private, anonymous memory (reserved; the kernel commits it on first
/// touch), advised to use transparent huge pages. Release it with [`unmap`].
#[cfg(not(miri))]
pub fn map_anonymous(bytes: usize) -> std::io::Result<NonNull<u8>> {
    let bytes = bytes.max(1);
    // SAFETY: anonymous private mapping with valid arguments; the result is checked.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the range was just mapped by us; the advice is only a hint.
    unsafe { libc::madvise(raw, bytes, libc::MADV_HUGEPAGE) };
    Ok(NonNull::new(raw.cast::<u8>()).expect("mmap returned a non-null address"))
}

/// Release a mapping made by [`map_anonymous`].
///
/// # Safety
/// `ptr` and `bytes` are a mapping from [`map_anonymous`], released once, with no reference
/// into it left.
#[cfg(not(miri))]
pub unsafe fn unmap(ptr: NonNull<u8>, bytes: usize) {
    // SAFETY: the caller passes a live mapping of ours (see the contract).
    unsafe { libc::munmap(ptr.as_ptr().cast(), bytes.max(1)) };
}

/// Under miri (which has no mmap): page-aligned zeroed heap memory, so that the unsafe-heavy
/// unit tests (frame pool, page bytes, latch) run under its checks. The translation table's
/// 16 GiB reservations do not fit: its tests are not in the miri set.
#[cfg(miri)]
pub fn map_anonymous(bytes: usize) -> std::io::Result<NonNull<u8>> {
    let layout = std::alloc::Layout::from_size_align(bytes.max(1), 4096)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    // SAFETY: the layout's size is not zero.
    let raw = unsafe { std::alloc::alloc_zeroed(layout) };
    NonNull::new(raw).ok_or_else(|| std::io::Error::other("out of memory"))
}

/// Under miri: release memory from [`map_anonymous`].
///
/// # Safety
/// As the mmap version's.
#[cfg(miri)]
pub unsafe fn unmap(ptr: NonNull<u8>, bytes: usize) {
    let layout = std::alloc::Layout::from_size_align(bytes.max(1), 4096).expect("mapped before");
    // SAFETY: allocated by `map_anonymous` with this layout (see the contract).
    unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
}

/// A fixed-length array of `T` in its own anonymous mapping.
pub struct MappedSlice<T> {
    ptr: NonNull<T>,
    len: usize,
    bytes: usize,
}

// SAFETY: MappedSlice owns its elements like Box<[T]> does.
unsafe impl<T: Send> Send for MappedSlice<T> {}
// SAFETY: shared access hands out only `&T`.
unsafe impl<T: Sync> Sync for MappedSlice<T> {}

impl<T> MappedSlice<T> {
    fn map(len: usize) -> std::io::Result<(NonNull<T>, usize)> {
        assert!(
            std::mem::align_of::<T>() <= 4096,
            "mappings are only page aligned"
        );
        let bytes = len
            .max(1)
            .checked_mul(std::mem::size_of::<T>().max(1))
            .ok_or_else(|| std::io::Error::other("array size overflows"))?;
        Ok((map_anonymous(bytes)?.cast::<T>(), bytes))
    }

    /// `len` elements made by `init(i)`.
    pub fn new(len: usize, mut init: impl FnMut(usize) -> T) -> std::io::Result<Self> {
        let (ptr, bytes) = Self::map(len)?;
        for i in 0..len {
            // SAFETY: i < len, inside the mapping, whose page-aligned base aligns every `T`;
            // each slot is written exactly once before any read.
            unsafe { ptr.as_ptr().add(i).write(init(i)) };
        }
        Ok(MappedSlice { ptr, len, bytes })
    }

    /// `len` elements of all-zero bytes, without touching the memory (the kernel supplies zero
    /// pages on first access, so only the parts used are ever committed).
    ///
    /// # Safety
    /// The all-zero bit pattern must be a valid `T`.
    pub unsafe fn zeroed(len: usize) -> std::io::Result<Self> {
        let (ptr, bytes) = Self::map(len)?;
        Ok(MappedSlice { ptr, len, bytes })
    }
}

impl<T> Deref for MappedSlice<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised elements live at `ptr` until drop.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for MappedSlice<T> {
    fn drop(&mut self) {
        // SAFETY: the elements are initialised and dropped once; then the mapping created in
        // `map` is unmapped; no borrow outlives `self`.
        unsafe {
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.len,
            ));
            unmap(self.ptr.cast(), self.bytes);
        }
    }
}

/// Ask the CPU to start loading the cache line holding `p` (a hint: never faults, no effect on
/// program semantics).
#[inline(always)]
pub fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch instructions do not access memory architecturally and never fault, even
    // for invalid addresses; `_mm_prefetch` only requires SSE, which x86_64 always has.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p.cast(), std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
