//! Helpers shared by Shoal's cross-crate tests: small engines and stamped page contents.
//!
//! A *stamped* page carries `(pid, version)` at its start and, in every following 8-byte word,
//! a value derived from both. Any mix of two versions, a page from another pid, or a torn write
//! fails [`check_stamp`].

use byteorder::{ByteOrder, LittleEndian};
use shoal_engine::{
    Engine, EngineConfig, OpResult, PageMut, PageRef, Pid, Worker, PAGE_DATA_SIZE, PAGE_SIZE,
};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// An engine over `dir` with `frames` frames of cache.
pub fn engine(dir: &Path, frames: usize) -> Engine {
    Engine::open(config(dir, frames)).expect("open engine")
}

/// The configuration `engine` uses: without a log (durability none), as these tests are
/// about pages, caches and devices; the log has its own tests (engine/src/durability, the
/// crash tests of the B-tree).
pub fn config(dir: &Path, frames: usize) -> EngineConfig {
    let mut c = EngineConfig::new(dir, frames * PAGE_SIZE);
    c.durability = shoal_engine::Durability::None;
    c
}

fn word(pid: Pid, version: u64, i: usize) -> u64 {
    (pid.raw() ^ 0x9E37_79B9_7F4A_7C15)
        .wrapping_mul(version.wrapping_add(1))
        .rotate_left((i % 61) as u32)
        ^ i as u64
}

/// Write the stamp of `(pid, version)` over the whole data area.
pub fn stamp(page: &mut PageMut<'_>, pid: Pid, version: u64) {
    let mut buf = [0u8; PAGE_DATA_SIZE];
    buf[0..8].copy_from_slice(&pid.raw().to_le_bytes());
    buf[8..16].copy_from_slice(&version.to_le_bytes());
    for i in 2..PAGE_DATA_SIZE / 8 {
        buf[i * 8..i * 8 + 8].copy_from_slice(&word(pid, version, i).to_le_bytes());
    }
    page.copy_in(&buf);
}

/// Check a copied-out page against the stamp it claims; returns its version.
pub fn check_stamp(buf: &[u8], pid: Pid) -> Result<u64, String> {
    let got_pid = LittleEndian::read_u64(&buf[0..]);
    if got_pid != pid.raw() {
        return Err(format!("page {pid} holds pid {got_pid:#x}"));
    }
    let version = LittleEndian::read_u64(&buf[8..]);
    for i in 2..PAGE_DATA_SIZE / 8 {
        let w = LittleEndian::read_u64(&buf[i * 8..]);
        if w != word(pid, version, i) {
            return Err(format!("page {pid} version {version} torn at word {i}"));
        }
    }
    Ok(version)
}

/// Copy a page out through the optimistic accessors.
pub fn copy_out(page: PageRef<'_>) -> Box<[u8; PAGE_DATA_SIZE]> {
    let mut b = Box::new([0u8; PAGE_DATA_SIZE]);
    page.copy_out(&mut b);
    b
}

/// Allocate `n` pages on `w`'s node, each stamped with version 0.
pub fn stamped_pages(w: &Worker, n: usize) -> Vec<Pid> {
    (0..n)
        .map(|_| {
            let mut g = w.allocate().expect("allocate a page");
            let pid = g.pid();
            stamp(&mut g.page_mut(), pid, 0);
            pid
        })
        .collect()
}

/// Read `pid` optimistically and copy it out; a copy that validated but is not one whole
/// version of the page counts in `torn`.
pub fn read_counting_torn(w: &Worker, pid: Pid, torn: &AtomicU64) {
    w.run(|w| -> OpResult<()> {
        let g = w.optimistic(pid)?;
        let copy = copy_out(g.page());
        g.validate()?;
        if check_stamp(&copy[..], pid).is_err() {
            torn.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    })
    .expect("an optimistic read");
}
