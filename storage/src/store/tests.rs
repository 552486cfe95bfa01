//! The store's own tests: pages written and read back across reopens, unclean stores,
//! device sets, superblock copies, old formats, capacity limits, large batches.

use super::*;

fn cfg(dir: &Path, n: usize) -> StoreConfig {
    StoreConfig::new((0..n).map(|i| dir.join(format!("d{i}.dat"))).collect())
}

fn write_one(s: &PageStore, slot: u64, pid: u64, fill: u8) {
    let mut p = AlignedPage::new();
    p[..100].fill(fill);
    let r = s.write_batch(&mut [WriteRequest {
        slot,
        pid,
        page: &mut p,
    }]);
    r.into_iter().for_each(|r| r.unwrap());
}

fn read_one(s: &PageStore, slot: u64, pid: u64) -> StoreResult<AlignedPage> {
    let mut p = AlignedPage::new();
    // SAFETY: p is exclusively owned and aligned.
    unsafe { s.read_into(slot, pid, p.as_mut_ptr())? };
    Ok(p)
}

#[test]
fn write_read_reopen_with_freelist() {
    for backend in [BackendChoice::Auto, BackendChoice::Pread] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cfg(dir.path(), 2);
        c.backend = backend;
        let s = PageStore::open(&c).unwrap();
        let slots: Vec<u64> = (0..10).map(|_| s.allocate().unwrap()).collect();
        for &sl in &slots {
            write_one(&s, sl, 1000 + sl, sl as u8);
        }
        s.free(3).unwrap();
        s.free(7).unwrap();
        s.close().unwrap();
        drop(s);
        c.mode = OpenMode::Open;
        let s = PageStore::open(&c).unwrap();
        assert_eq!(s.high_water(), 10);
        assert_eq!(s.slots_in_use(), 8);
        for &sl in &slots {
            if sl == 3 || sl == 7 {
                continue;
            }
            let p = read_one(&s, sl, 1000 + sl).unwrap();
            assert!(p[..100].iter().all(|&b| b == sl as u8));
        }
        let mut again = [s.allocate().unwrap(), s.allocate().unwrap()];
        again.sort();
        assert_eq!(again, [3, 7]);
        assert_eq!(s.allocate().unwrap(), 10);
        s.close().unwrap();
    }
}

#[test]
fn unclean_store_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path(), 1);
    let s = PageStore::open(&c).unwrap();
    for _ in 0..5 {
        let sl = s.allocate().unwrap();
        write_one(&s, sl, sl, 1);
    }
    drop(s); // no close
    c.mode = OpenMode::Open;
    let e = PageStore::open(&c).err().unwrap();
    assert!(matches!(e, StoreError::Unclean { .. }), "{e}");
    c.allow_unclean = true;
    let s = PageStore::open(&c).unwrap();
    // Written slots (0..5) are never handed out again; preallocated space beyond them may
    // be skipped (leaked), which costs disk space but never data.
    assert!(
        s.allocate().unwrap() >= 5,
        "written slots are never handed out again"
    );
    s.close().unwrap();
}

#[test]
fn create_refuses_existing_store_and_open_refuses_missing() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path(), 1);
    c.mode = OpenMode::Open;
    assert!(matches!(
        PageStore::open(&c),
        Err(StoreError::NotAStore { .. })
    ));
    c.mode = OpenMode::Create;
    PageStore::open(&c).unwrap().close().unwrap();
    assert!(matches!(
        PageStore::open(&c),
        Err(StoreError::AlreadyExists { .. })
    ));
}

#[test]
fn reordered_or_missing_devices_are_detected() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path(), 2);
    PageStore::open(&c).unwrap().close().unwrap();
    let mut swapped = c.clone();
    swapped.devices.reverse();
    swapped.mode = OpenMode::Open;
    let e = PageStore::open(&swapped).err().unwrap();
    assert!(e.to_string().contains("configured as device #0"), "{e}");
    let mut one = c.clone();
    one.devices.pop();
    let e = PageStore::open(&one).err().unwrap();
    assert!(e.to_string().contains("has 2 device(s)"), "{e}");
    let mut other_node = c.clone();
    other_node.node_id = 4;
    let e = PageStore::open(&other_node).err().unwrap();
    assert!(e.to_string().contains("this is node 4"), "{e}");
    // a device of another store of the same node and cluster, in its place
    let other = tempfile::tempdir().unwrap();
    let oc = cfg(other.path(), 2);
    PageStore::open(&oc).unwrap().close().unwrap();
    std::fs::copy(&oc.devices[1], &c.devices[1]).unwrap();
    let e = PageStore::open(&c).err().unwrap();
    assert!(e.to_string().contains("belongs to another store"), "{e}");
}

/// Flip one byte inside superblock copy `copy` of `path`.
fn damage_copy(path: &Path, copy: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(path)
        .unwrap();
    let at = copy * PAGE_SIZE as u64 + 44;
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0xff], at).unwrap();
}

fn copies_of(paths: &[PathBuf]) -> Vec<crate::superblock::DeviceCopies> {
    crate::inspect::StoreReader::open(paths)
        .unwrap()
        .superblock_copies()
        .to_vec()
}

/// A store on 2 devices with slots 0..6 written (pid 1000 + slot, fill = slot), closed.
fn closed_store(dir: &Path) -> StoreConfig {
    let c = cfg(dir, 2);
    let s = PageStore::open(&c).unwrap();
    for _ in 0..6 {
        let sl = s.allocate().unwrap();
        write_one(&s, sl, 1000 + sl, sl as u8);
    }
    s.close().unwrap();
    c
}

fn assert_pages_intact(s: &PageStore) {
    for sl in 0..6 {
        let p = read_one(s, sl, 1000 + sl).unwrap();
        assert!(p[..100].iter().all(|&b| b == sl as u8), "slot {sl}");
    }
}

#[test]
fn a_bad_superblock_copy_is_read_around_and_rewritten_at_open() {
    use crate::superblock::CopyState;
    let dir = tempfile::tempdir().unwrap();
    let c = closed_store(dir.path());
    let r = crate::inspect::StoreReader::open(&c.devices).unwrap();
    assert_eq!(
        r.superblock().format_version,
        crate::superblock::FORMAT_VERSION
    );
    for copy in 0..2 {
        damage_copy(&c.devices[0], copy);
        let found = copies_of(&c.devices);
        assert!(matches!(found[0].copies[copy as usize], CopyState::Bad(_)));
        assert_eq!(found[0].used, Some(1 - copy as usize), "{}", found[0]);
        assert!(found[0].to_string().contains("bad"), "{}", found[0]);
        let s = PageStore::open(&c).unwrap();
        assert_pages_intact(&s);
        s.close().unwrap();
        drop(s);
        let found = copies_of(&c.devices);
        let g = match found[0].copies[0] {
            CopyState::Intact { generation } => generation,
            ref bad => panic!("copy 0 not repaired: {bad:?}"),
        };
        assert!(found
            .iter()
            .all(|d| d.copies == vec![CopyState::Intact { generation: g }; 2]));
    }
}

#[test]
fn a_device_whose_copies_are_both_bad_is_rebuilt_from_another_device() {
    let dir = tempfile::tempdir().unwrap();
    let c = closed_store(dir.path());
    damage_copy(&c.devices[1], 0);
    damage_copy(&c.devices[1], 1);
    let found = copies_of(&c.devices);
    assert_eq!(found[1].used, None, "{}", found[1]);
    let s = PageStore::open(&c).unwrap();
    assert_pages_intact(&s);
    s.close().unwrap();
    drop(s);
    let found = copies_of(&c.devices);
    assert!(found.iter().all(|d| !d.needs_repair(0) && d.used.is_some()));
    // a device under another name is not rebuilt: it may belong to another store
    damage_copy(&c.devices[1], 0);
    damage_copy(&c.devices[1], 1);
    let renamed = dir.path().join("other.dat");
    std::fs::rename(&c.devices[1], &renamed).unwrap();
    let mut moved = c.clone();
    moved.devices[1] = renamed;
    let e = PageStore::open(&moved).err().unwrap();
    assert!(matches!(e, StoreError::BadSuperblock { .. }), "{e}");
}

#[test]
fn the_newest_intact_copy_wins_over_a_stale_one() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let c = closed_store(dir.path());
    let old = std::fs::read(&c.devices[0]).unwrap();
    // a later session frees slot 5 and closes: its superblocks record the free list
    let s = PageStore::open(&c).unwrap();
    s.free(5).unwrap();
    s.close().unwrap();
    drop(s);
    // as if a crash had stopped the close between copy 0 and copy 1 of device 0
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&c.devices[0])
        .unwrap();
    f.write_all_at(&old[PAGE_SIZE..2 * PAGE_SIZE], PAGE_SIZE as u64)
        .unwrap();
    let found = copies_of(&c.devices);
    assert_eq!(found[0].used, Some(0));
    assert!(found[0].needs_repair(u64::MAX));
    let s = PageStore::open(&c).unwrap();
    assert_eq!(s.slots_in_use(), 5, "the newer copy's free list is used");
    s.close().unwrap();
}

#[test]
fn a_format_1_store_opens_and_keeps_its_layout() {
    use crate::superblock::{Superblock, SUPERBLOCK_PID};
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d0.dat");
    // one superblock copy at page 0, slot s at page 1 + s
    let sb = Superblock {
        format_version: 1,
        page_size: PAGE_SIZE as u32,
        cluster_id: 0,
        node_id: 0,
        device_count: 1,
        device_index: 0,
        clean: true,
        next_slot: 3,
        freelist_head: NO_SLOT,
        freelist_len: 0,
        capacity: 0,
        generation: 0,
        store_id: 0,
        logged: false,
        device_names: vec!["d0.dat".into()],
    };
    let f = std::fs::File::create(&path).unwrap();
    let mut p = AlignedPage::new();
    sb.encode(&mut p).unwrap();
    f.write_all_at(&p[..], 0).unwrap();
    for sl in 0..3u64 {
        let mut p = AlignedPage::new();
        p[..100].fill(sl as u8);
        crate::page::seal(&mut p, 1000 + sl);
        f.write_all_at(&p[..], (1 + sl) * PAGE_SIZE as u64).unwrap();
    }
    drop(f);
    let c = StoreConfig::new(vec![path.clone()]);
    let s = PageStore::open(&c).unwrap();
    assert_eq!(s.format_version(), 1);
    assert_eq!(read_one(&s, 2, 1002).unwrap()[0], 2);
    let sl = s.allocate().unwrap();
    write_one(&s, sl, 1000 + sl, sl as u8);
    s.close().unwrap();
    drop(s);
    let s = PageStore::open(&c).unwrap();
    for sl in 0..4 {
        assert_eq!(read_one(&s, sl, 1000 + sl).unwrap()[0], sl as u8);
    }
    s.close().unwrap();
    drop(s);
    // page 1 still holds slot 0, not a second superblock copy
    let mut b = AlignedPage::new();
    std::fs::File::open(&path)
        .unwrap()
        .read_exact_at(&mut b[..], PAGE_SIZE as u64)
        .unwrap();
    assert!(crate::page::verify(&b, SUPERBLOCK_PID, 0, &path).is_err());
    assert!(crate::page::verify(&b, 1000, 0, &path).is_ok());
    let found = copies_of(&[path]);
    assert_eq!(found[0].copies.len(), 1);
}

#[test]
fn capacity_limit_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path(), 1);
    c.capacity_pages = 2;
    let s = PageStore::open(&c).unwrap();
    s.allocate().unwrap();
    s.allocate().unwrap();
    let e = s.allocate().unwrap_err();
    assert!(e.to_string().contains("store is full"), "{e}");
}

#[test]
fn never_written_slot_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let s = PageStore::open(&cfg(dir.path(), 1)).unwrap();
    let sl = s.allocate().unwrap();
    assert!(matches!(
        read_one(&s, sl, 5),
        Err(StoreError::NeverWritten { pid: 5, .. })
    ));
}

#[test]
fn big_batch_larger_than_ring() {
    let dir = tempfile::tempdir().unwrap();
    let s = PageStore::open(&cfg(dir.path(), 3)).unwrap();
    let n = io::RING_ENTRIES as usize * 2 + 7;
    let mut pages: Vec<AlignedPage> = (0..n).map(|_| AlignedPage::new()).collect();
    let slots: Vec<u64> = (0..n).map(|_| s.allocate().unwrap()).collect();
    for (i, p) in pages.iter_mut().enumerate() {
        p[0..8].copy_from_slice(&(i as u64).to_le_bytes());
    }
    let mut reqs: Vec<WriteRequest<'_>> = pages
        .iter_mut()
        .zip(&slots)
        .map(|(page, &slot)| WriteRequest {
            slot,
            pid: slot + 1,
            page,
        })
        .collect();
    assert!(s.write_batch(&mut reqs).iter().all(|r| r.is_ok()));
    for (i, &sl) in slots.iter().enumerate() {
        let p = read_one(&s, sl, sl + 1).unwrap();
        assert_eq!(LittleEndian::read_u64(&p[0..]), i as u64);
    }
}

#[test]
fn what_an_unfinished_creation_leaves_is_named_a_leftover() {
    let wal = Path::new("/data/node0-0.wal");
    let creating = crate::fs::with_suffix(wal, CREATING);
    for seq in [1, 2] {
        let snapshot = crate::wal::disk::alloc_path(&creating, seq);
        let name = snapshot.file_name().unwrap().to_string_lossy();
        assert!(creation_leftover(&name), "{name}");
        let done = crate::wal::disk::alloc_path(wal, seq);
        let name = done.file_name().unwrap().to_string_lossy();
        assert!(
            !creation_leftover(&name),
            "a finished log's snapshot {name}"
        );
    }
    assert!(creation_leftover("node0-0.dat.creating"));
    assert!(!creation_leftover("node0-0.dat"));
    assert!(!creation_leftover("node0-0.wal"));
}

/// A store with a small log in `dir`, left unclean (dropped without a close, nothing in it), and the
/// configuration that opens it again as node 0 of a cluster whose node 1's log is `peer`.
fn unclean_cluster_store(dir: &Path, peer: PathBuf) -> StoreConfig {
    std::fs::create_dir_all(dir).unwrap();
    let mut c = cfg(dir, 1);
    let mut w = crate::wal::WalConfig::new(dir.join("d0.wal"));
    w.file_bytes = 1 << 20;
    w.ring_bytes = 256 << 10;
    c.wal = Some(w);
    // (opened with a log, the store is unclean until closed; its allocations would need
    // the engine's slot log)
    drop(PageStore::open(&c).unwrap()); // no close
    c.mode = OpenMode::Open;
    c.page_home = Some(|_| 0);
    c.cluster = Some(ClusterLogs {
        node: 0,
        peers: vec![peer],
    });
    c
}

/// Issue 70: a peer's log that is not there, its directory present (another host's
/// directory, hidden here under an empty mount), is an error naming it at recovery, not a
/// node "without a log" skipped: every node of a cluster with a log has one.
#[test]
fn a_peer_log_missing_from_its_directory_is_an_error_naming_it_at_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let peer_dir = dir.path().join("node1");
    std::fs::create_dir(&peer_dir).unwrap();
    let peer = peer_dir.join("node1-0.wal");
    let c = unclean_cluster_store(&dir.path().join("node0"), peer.clone());
    let e = PageStore::open(&c).err().expect("recovery must refuse");
    match &e {
        StoreError::BadLog { path, why } => {
            assert_eq!(path, &peer, "{e}");
            assert!(why.contains("cannot be read"), "{e}");
            assert!(why.contains("must be reachable"), "{e}");
        }
        _ => panic!("not BadLog: {e}"),
    }
    // nothing was written: the store is still unclean (refused again), and recovers once
    // the peer's log is there (here a new one: that node holds no records of ours)
    let e = PageStore::open(&c).err().expect("still refused");
    assert!(matches!(e, StoreError::BadLog { .. }), "{e}");
    let mut p = cfg(&peer_dir, 1);
    let mut w = crate::wal::WalConfig::new(peer.clone());
    w.file_bytes = 1 << 20;
    w.ring_bytes = 256 << 10;
    p.wal = Some(w);
    PageStore::open(&p).unwrap().close().unwrap();
    let s = PageStore::open(&c).unwrap();
    s.close().unwrap();
}

/// Issue 70: the same when a home brings back pages lost with a dead node
/// (`PageStore::recover_pages`): an error naming the log, and nothing written.
#[test]
fn a_peer_log_that_cannot_be_read_is_an_error_naming_it_when_pages_are_brought_back() {
    let dir = tempfile::tempdir().unwrap();
    let own_dir = dir.path().join("node0");
    let peer_dir = dir.path().join("node1");
    std::fs::create_dir(&peer_dir).unwrap();
    let peer = peer_dir.join("node1-0.wal");
    let mut c = unclean_cluster_store(&own_dir, peer.clone());
    c.cluster = None;
    c.page_home = None;
    c.allow_unclean = true;
    let s = PageStore::open(&c).unwrap();
    let logs = vec![own_dir.join("d0.wal"), peer.clone()];
    let pids: std::collections::HashSet<u64> = [0u64].into_iter().collect();
    let e = s.recover_pages(&logs, &pids).expect_err("must refuse");
    match &e {
        StoreError::BadLog { path, why } => {
            assert_eq!(path, &peer, "{e}");
            assert!(why.contains("cannot be read"), "{e}");
        }
        _ => panic!("not BadLog: {e}"),
    }
    // a directory that is not there at all is the same error
    let gone = dir.path().join("node2").join("node2-0.wal");
    let e = s
        .recover_pages(&[own_dir.join("d0.wal"), gone.clone()], &pids)
        .expect_err("must refuse");
    assert!(
        matches!(&e, StoreError::BadLog { path, .. } if path == &gone),
        "{e}"
    );
}
