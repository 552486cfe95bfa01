//! The list-append checker of tests/serializable.rs fails when transactions are not isolated:
//! with read validation switched off (a whole-process switch, hence this binary of its own)
//! the committed histories have dependency cycles or lose appends.

mod elle;

use shoal_btree::BTree;
use shoal_engine::{Engine, EngineConfig};
use std::time::Duration;

#[test]
fn the_list_append_checker_catches_transactions_that_are_not_isolated() {
    shoal_btree::set_isolation_for_checker_tests(false);
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 64 << 20)).unwrap();
    let w = e.worker();
    let tree = BTree::create(&w, "lists").unwrap();
    let workers = (0..4).map(|_| e.worker()).collect();
    // transactions pause inside, so that the others commit in between (left to the
    // scheduler, the checker found 4-22 problems a run on 2 cores: luck, not a guarantee)
    let history = elle::run_all_paused(workers, tree, 1500, Some(Duration::from_micros(50)));
    let bad = elle::check(&history, &elle::finals(&w, &tree));
    eprintln!(
        "without isolation the checker found {} problems; first: {:?}",
        bad.len(),
        bad.first()
    );
    assert!(
        !bad.is_empty(),
        "the checker saw nothing wrong without isolation"
    );
    drop(w);
    e.close().unwrap();
}
