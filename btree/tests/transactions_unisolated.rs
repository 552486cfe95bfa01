//! The bank checker of tests/transactions.rs fails when transactions are not isolated: with
//! read validation switched off (a whole-process switch, hence this binary of its own), money
//! is made or lost, or an audit sees a wrong total.

mod bank;

use bank::Load;
use std::time::Duration;

#[test]
fn without_isolation_a_transfer_committed_inside_another_makes_money() {
    shoal_btree::set_isolation_for_checker_tests(false);
    let dir = tempfile::tempdir().unwrap();
    let (e, tree, w) = bank::one_node(dir.path());
    let runs = bank::transfer_around_another(&w, &e.worker(), &tree);
    assert_eq!(runs, 1, "without isolation nothing conflicts");
    assert_eq!(
        bank::total_now(&w, &tree),
        bank::TOTAL + 100,
        "the outer transfer's write undid the inner one's debit"
    );
    drop(w);
    e.close().unwrap();
}

#[test]
fn the_bank_checker_catches_transactions_that_are_not_isolated() {
    shoal_btree::set_isolation_for_checker_tests(false);
    let dir = tempfile::tempdir().unwrap();
    let (e, tree, w) = bank::one_node(dir.path());
    let movers = (0..4).map(|_| e.worker()).collect();
    // movers pause inside their transfers, so that the others commit in between (left to
    // the scheduler, an interleaving came in 1 to 20 s on 2 busy cores, or not at all)
    let load = Load {
        until_wrong: true,
        pause_inside: Some(Duration::from_micros(50)),
        ..Load::for_secs(20.0)
    };
    let seen = bank::run(movers, vec![e.worker()], tree, load);
    let total = bank::total_now(&w, &tree);
    eprintln!("without isolation: {seen:?}, total after {total}");
    assert!(
        seen.wrong_audits > 0 || total != bank::TOTAL,
        "the checker saw nothing wrong without isolation: {seen:?}, total {total}"
    );
    drop(w);
    e.close().unwrap();
}

#[test]
fn the_swaps_checker_catches_transactions_that_are_not_isolated() {
    shoal_btree::set_isolation_for_checker_tests(false);
    let dir = tempfile::tempdir().unwrap();
    let (e, _, w) = bank::one_node(dir.path());
    let tree = shoal_btree::BTree::create(&w, "registers").unwrap();
    bank::open_registers(&w, &tree);
    let pause = Duration::from_micros(20);
    let seen = bank::swaps(
        vec![e.worker(), e.worker()],
        vec![e.worker()],
        tree,
        pause,
        2.0,
    );
    eprintln!("without isolation: {seen:?}");
    assert!(
        seen.wrong_audits > 0,
        "the checker saw nothing wrong: {seen:?}"
    );
    drop(w);
    e.close().unwrap();
}

#[test]
fn the_bank_checker_with_point_audits_over_many_leaves_catches_transactions_that_are_not_isolated()
{
    shoal_btree::set_isolation_for_checker_tests(false);
    let dir = tempfile::tempdir().unwrap();
    let e =
        shoal_engine::Engine::open(shoal_engine::EngineConfig::new(dir.path(), 64 << 20)).unwrap();
    let w = e.worker();
    let tree = shoal_btree::BTree::create(&w, "bank").unwrap();
    bank::open_wide_accounts(&w, &tree);
    let movers = (0..4).map(|_| e.worker()).collect();
    let load = Load {
        until_wrong: true,
        audit_by_points: true,
        pause_inside: Some(Duration::from_micros(50)),
        ..Load::for_secs(20.0)
    };
    let seen = bank::run(movers, vec![e.worker()], tree, load);
    let total = bank::total_now(&w, &tree);
    eprintln!("without isolation, point audits: {seen:?}, total after {total}");
    assert!(
        seen.wrong_audits > 0 || total != bank::TOTAL,
        "the checker saw nothing wrong without isolation: {seen:?}, total {total}"
    );
    drop(w);
    e.close().unwrap();
}
