//! A log whose sync fails after a commit's writes were applied: the commit says its durability
//! is unknown (never "nothing written"), the engine takes no more writes, closes with the
//! error, and the store opens afterwards with the commit whole or absent. The failure is
//! injected by the crash simulator (`shoal_storage::sim::fail_syncs_of`), process-wide: this
//! binary holds this one test.

use shoal_btree::{transact, u64_key, BTree, TxError};
use shoal_engine::{Durability, Engine, EngineConfig};

fn config(dir: &std::path::Path) -> EngineConfig {
    let mut c = EngineConfig::new(dir, 64 << 20);
    c.durability = Durability::Commit;
    c
}

#[test]
fn a_commit_whose_log_cannot_sync_is_durability_unknown_and_the_engine_takes_no_more_writes() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let w = e.worker();
    let t = BTree::create(&w, "t").unwrap();
    transact(&w, |tx| {
        for k in 0..100u64 {
            tx.upsert(&t, u64_key(k), [1u8; 100])?;
        }
        Ok(())
    })
    .unwrap();
    // the log's device fails every sync from now on
    shoal_storage::sim::fail_syncs_of(Some(".wal"));
    let r = transact(&w, |tx| {
        for k in 0..100u64 {
            tx.upsert(&t, u64_key(k), [2u8; 100])?;
        }
        Ok(())
    });
    assert!(
        matches!(r, Err(TxError::DurabilityUnknown(_))),
        "a commit applied but not synced: {r:?}"
    );
    // no more writes: nothing is changed on top of what the log may not hold
    let r = transact(&w, |tx| tx.upsert(&t, u64_key(500), [3u8; 100]));
    assert!(
        matches!(r, Err(TxError::Tree(_))),
        "a write after the log failed: {r:?}"
    );
    assert!(t.get(&w, u64_key(500)).unwrap().is_none(), "not written");
    drop(w);
    assert!(e.close().is_err(), "close reports the failed log");
    drop(e);
    // the device works again: the store opens, with the unsynced commit whole or absent
    shoal_storage::sim::fail_syncs_of(None);
    let e = Engine::open(config(dir.path())).unwrap();
    let w = e.worker();
    let t = BTree::open(&w, "t").unwrap();
    let first = t.get(&w, u64_key(0)).unwrap().expect("row 0");
    assert!(first == [1u8; 100] || first == [2u8; 100], "{first:?}");
    for k in 0..100u64 {
        let v = t.get(&w, u64_key(k)).unwrap().expect("a row");
        assert_eq!(v, first, "row {k}: the commit is whole or absent");
    }
    assert!(t.get(&w, u64_key(500)).unwrap().is_none());
    t.verify(&w).unwrap();
    drop(w);
    e.close().unwrap();
}
