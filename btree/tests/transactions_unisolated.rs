//! The bank checker of tests/transactions.rs fails when transactions are not isolated: with
//! read validation switched off (a whole-process switch, hence this binary of its own), money
//! is made or lost, or an audit sees a wrong total.

mod bank;

use shoal_btree::BTree;
use shoal_engine::{Engine, EngineConfig};

#[test]
fn the_bank_checker_catches_transactions_that_are_not_isolated() {
    shoal_btree::set_isolation_for_checker_tests(false);
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 64 << 20)).unwrap();
    let w = e.worker();
    let tree = BTree::create(&w, "bank").unwrap();
    bank::open_accounts(&w, &tree);
    let movers = (0..4).map(|_| e.worker()).collect();
    let seen = bank::run(movers, vec![e.worker()], tree, 20.0, true);
    let total = bank::total_now(&w, &tree);
    eprintln!("without isolation: {seen:?}, total after {total}");
    assert!(
        seen.wrong_audits > 0 || total != bank::TOTAL,
        "the checker saw nothing wrong without isolation: {seen:?}, total {total}"
    );
    drop(w);
    e.close().unwrap();
}
