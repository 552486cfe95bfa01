//! The tree on a cluster of nodes (`Cluster::mem`): every node reads and writes one tree, and
//! removes on a cluster node leave it valid without leaking pages (cluster nodes cannot free
//! pages yet, so they do not merge).

use shoal_btree::{u64_key, BTree};
use shoal_engine::{Cluster, EngineConfig};
use std::time::Duration;

#[test]
fn removes_on_a_cluster_node_keep_the_tree_whole_and_leak_no_page() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::mem(2, Duration::from_secs(20), |i| {
        EngineConfig::new(dir.path().join(format!("n{i}")), 16 << 20)
    })
    .unwrap();
    let (w0, w1) = (c.node(0).worker(), c.node(1).worker());
    let t = BTree::create(&w0, "t").unwrap();
    let n = 6_000u64;
    for k in 0..n {
        let w = if k % 2 == 0 { &w0 } else { &w1 };
        assert!(t.insert(w, &u64_key(k), &[k as u8; 100]).unwrap());
    }
    // node 1 removes all but every 20th key: many leaves end up nearly empty
    for k in (0..n).filter(|k| k % 20 != 0) {
        assert!(t.remove(&w1, &u64_key(k)).unwrap());
    }
    let report = t.verify(&w0).unwrap();
    assert_eq!(report.entries, n / 20);
    for k in 0..n {
        let v = t.get(&w1, &u64_key(k)).unwrap();
        assert_eq!(v, (k % 20 == 0).then(|| vec![k as u8; 100]), "key {k}");
    }
    // every page in use on either node is the catalog's or the tree's
    let in_use: u64 = c.nodes().iter().map(|e| e.store().slots_in_use()).sum();
    assert_eq!(in_use, 1 + report.pages.len() as u64, "{:?}", report.levels);
    drop((w0, w1));
    c.close().unwrap();
}
