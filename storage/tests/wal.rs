//! The log at the store level: a page whose write-back was torn by a crash (half new bytes,
//! half old) is repaired from the log at open, and a diff on top of it is replayed.

use shoal_storage::wal::{put_diff, put_image};
use shoal_storage::{AlignedPage, PageStore, StoreConfig, WalConfig, WriteRequest, PAGE_DATA_SIZE};
use std::os::unix::fs::FileExt;

fn config(dir: &std::path::Path) -> StoreConfig {
    let dev = dir.join("node0-0.dat");
    let mut c = StoreConfig::new(vec![dev.clone()]);
    let mut w = WalConfig::new(shoal_storage::store::default_log_path(&dev));
    w.file_bytes = 4 << 20;
    w.ring_bytes = 1 << 20;
    c.wal = Some(w);
    c
}

fn read(store: &PageStore, slot: u64) -> Result<Vec<u8>, shoal_storage::StoreError> {
    let mut buf = AlignedPage::new();
    // SAFETY: `buf` is an exclusively owned aligned page.
    unsafe { store.read_into(slot, slot, buf.as_mut_ptr())? };
    Ok(buf[..PAGE_DATA_SIZE].to_vec())
}

#[test]
fn a_torn_page_write_is_repaired_from_the_log_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut page = vec![0u8; PAGE_DATA_SIZE];
    let slot;
    {
        let store = PageStore::open(&cfg).unwrap();
        slot = store.allocate().unwrap();
        // the page's first change since the checkpoint goes in whole, the next as a diff
        page.iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i % 251) as u8);
        let w = store.wal().unwrap();
        let mut buf = Vec::new();
        w.append(&mut buf, |_, b| put_image(b, slot, slot, &page))
            .unwrap();
        page[100..108].copy_from_slice(b"changed!");
        let end = w
            .append(&mut buf, |_, b| {
                put_diff(b, slot, slot, [(100u16, 8u16)].into_iter(), &page)
            })
            .unwrap();
        w.flush_to(end).unwrap();
        // the write-back of the new image is torn: only its first half reaches the device
        let mut img = AlignedPage::new();
        img[..PAGE_DATA_SIZE].copy_from_slice(&page);
        store
            .write_batch(&mut [WriteRequest {
                slot,
                pid: slot,
                page: &mut img,
            }])
            .pop()
            .unwrap()
            .unwrap();
        store.sync().unwrap();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("node0-0.dat"))
            .unwrap();
        let (dev, off) = store.slot_location(slot);
        assert_eq!(dev, 0);
        f.write_all_at(&[0xAA; 2048], off + 2048).unwrap();
        assert!(
            read(&store, slot).is_err(),
            "the torn page fails its checksum"
        );
        // crash: dropped without close, the store stays unclean
    }
    let store = PageStore::open(&cfg).expect("recovery at open");
    let r = store.replayed().expect("the store was recovered");
    assert_eq!(r.pages, 1, "{r:?}");
    assert!(r.records >= 3, "image, diff and the allocation: {r:?}");
    assert_eq!(
        read(&store, slot).unwrap(),
        page,
        "repaired with the diff applied"
    );
    assert!(
        store.allocate().unwrap() != slot,
        "the slot stays allocated after recovery"
    );
    store.close().unwrap();
}
