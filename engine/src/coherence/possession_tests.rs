//! Unit tests of [`super`]: one test per rule.

//! Each rule of the module's list, one test each, with version numbers as page contents.
//! (The model in tests/coherence_model.rs drives the same code under every message order;
//! these pin the single steps.)
use super::*;

const HOME: Node = 0;
const ME: Node = 1;

fn copy() -> PageCopy<u64> {
    PageCopy::new(HOME, ME)
}

fn grant(mode: Mode, epoch: Epoch, data: Option<u64>) -> Grant<u64> {
    Grant {
        mode,
        epoch,
        data,
        source: None,
        invalidate: 0,
        source_keeps: false,
    }
}

/// A copy holding `v` in `mode` at `epoch`, granted by the home.
fn holding(mode: Mode, epoch: Epoch, v: u64) -> PageCopy<u64> {
    let mut c = copy();
    c.request(mode).unwrap();
    let s = c.on_grant(grant(mode, epoch, Some(v))).unwrap();
    assert_eq!(s.completed, Some(mode));
    c
}

#[test]
fn a_request_goes_home_once_and_only_when_needed() {
    let mut c = copy();
    assert_eq!(
        c.request(Mode::Shared).unwrap(),
        (
            HOME,
            Msg::Request {
                want: Mode::Shared,
                have: false,
                again: false
            }
        )
    );
    assert!(c.request(Mode::Exclusive).is_err(), "one outstanding");
    let mut c = holding(Mode::Shared, 0, 7);
    assert!(c.usable(Mode::Shared) && !c.usable(Mode::Exclusive));
    assert!(c.request(Mode::Shared).is_err(), "already usable");
    // an upgrade says it has the page
    assert_eq!(
        c.request(Mode::Exclusive).unwrap().1,
        Msg::Request {
            want: Mode::Exclusive,
            have: true,
            again: false
        }
    );
}

#[test]
fn a_grant_must_match_the_request() {
    let mut c = copy();
    assert!(
        c.on_grant(grant(Mode::Shared, 0, Some(1))).is_err(),
        "unasked"
    );
    c.request(Mode::Shared).unwrap();
    assert!(
        c.on_grant(grant(Mode::Exclusive, 0, Some(1))).is_err(),
        "mode"
    );
    let mut c = holding(Mode::Exclusive, 5, 1);
    c.epoch = 5;
    c.data = None;
    c.mode = None;
    c.request(Mode::Shared).unwrap();
    assert!(
        c.on_grant(grant(Mode::Shared, 4, Some(1))).is_err(),
        "older epoch"
    );
    let mut c = copy();
    c.request(Mode::Shared).unwrap();
    assert!(
        c.on_grant(grant(Mode::Shared, 0, None)).is_err(),
        "no page and no source"
    );
}

#[test]
fn a_grant_naming_a_source_drops_the_stale_copy_and_completes_when_the_page_arrives() {
    let mut c = holding(Mode::Shared, 1, 10);
    c.request(Mode::Exclusive).unwrap();
    let s = c
        .on_grant(Grant {
            source: Some(2),
            ..grant(Mode::Exclusive, 3, None)
        })
        .unwrap();
    assert_eq!(
        s.out,
        vec![(
            2,
            Msg::Transfer {
                want: Mode::Exclusive,
                epoch: 3,
                keep: false,
            }
        )]
    );
    assert_eq!(s.completed, None);
    assert_eq!(c.data, None, "the stale copy is gone");
    assert!(!c.usable(Mode::Shared));
    let s = c.on_page(11, true).unwrap();
    assert_eq!(s.completed, Some(Mode::Exclusive));
    assert_eq!((c.data, c.dirty, c.epoch), (Some(11), true, 3));
    assert!(c.on_page(12, false).is_err(), "a page nobody waits for");
}

#[test]
fn a_shared_successor_holds_the_page_clean() {
    let mut c = copy();
    c.request(Mode::Shared).unwrap();
    c.on_grant(Grant {
        source: Some(2),
        ..grant(Mode::Shared, 2, None)
    })
    .unwrap();
    c.on_page(9, true).unwrap();
    assert!(!c.dirty, "the source copied it back home");
}

#[test]
fn a_write_completes_only_after_every_invalidation_is_acknowledged() {
    let mut c = holding(Mode::Shared, 0, 4);
    c.request(Mode::Exclusive).unwrap();
    let s = c
        .on_grant(Grant {
            invalidate: bit(2) | bit(3),
            ..grant(Mode::Exclusive, 1, None)
        })
        .unwrap();
    assert_eq!(
        s.out,
        vec![
            (2, Msg::Invalidate { epoch: 1 }),
            (3, Msg::Invalidate { epoch: 1 })
        ]
    );
    assert_eq!(s.completed, None);
    assert!(c.on_invalidate_ack(4).is_err(), "not asked");
    assert_eq!(c.on_invalidate_ack(3).unwrap().completed, None);
    assert!(c.on_invalidate_ack(3).is_err(), "twice");
    assert_eq!(
        c.on_invalidate_ack(2).unwrap().completed,
        Some(Mode::Exclusive)
    );
    assert!(c.usable(Mode::Exclusive));
}

#[test]
fn a_transfer_waits_for_the_page_and_the_worker_then_hands_the_page_over() {
    // named as the source while our own grant's page is still on its way
    let mut c = copy();
    c.request(Mode::Exclusive).unwrap();
    c.on_grant(Grant {
        source: Some(2),
        ..grant(Mode::Exclusive, 1, None)
    })
    .unwrap();
    let s = c.on_transfer(3, Mode::Exclusive, 2, false).unwrap();
    assert!(s.out.is_empty(), "deferred: no page yet");
    let s = c.on_page(20, false).unwrap();
    assert_eq!(s.completed, Some(Mode::Exclusive));
    assert!(s.out.is_empty(), "our worker uses the page first");
    c.wrote(21);
    let s = c.served().unwrap();
    assert_eq!(
        s.out,
        vec![(
            3,
            Msg::Page {
                data: 21,
                dirty: true
            }
        )]
    );
    assert_eq!((c.mode, c.data), (None, None), "handed over");
}

#[test]
fn a_dirty_page_handed_to_a_shared_successor_is_copied_back_home() {
    let mut c = holding(Mode::Exclusive, 1, 30);
    c.wrote(31);
    let s = c.on_transfer(2, Mode::Shared, 2, false).unwrap();
    assert_eq!(
        s.out,
        vec![
            (HOME, Msg::CopyBack { data: Some(31) }),
            (
                2,
                Msg::Page {
                    data: 31,
                    dirty: true
                }
            )
        ]
    );
    // clean: the copy-back carries no page
    let mut c = holding(Mode::Exclusive, 1, 30);
    let s = c.on_transfer(2, Mode::Shared, 2, false).unwrap();
    assert_eq!(s.out[0], (HOME, Msg::CopyBack { data: None }));
}

#[test]
fn a_transfer_not_newer_than_the_held_grant_is_a_violation() {
    let mut c = holding(Mode::Exclusive, 5, 1);
    assert!(c.on_transfer(2, Mode::Exclusive, 5, false).is_err());
    assert!(c.on_transfer(2, Mode::Exclusive, 4, false).is_err());
}

#[test]
fn an_old_invalidation_is_acknowledged_at_once_and_a_current_one_drops_the_copy() {
    let mut c = holding(Mode::Shared, 4, 1);
    let s = c.on_invalidate(2, 3).unwrap();
    assert_eq!(s.out, vec![(2, Msg::InvalidateAck)]);
    assert_eq!(
        c.data,
        Some(1),
        "an older epoch's invalidation keeps the copy"
    );
    let s = c.on_invalidate(3, 5).unwrap();
    assert_eq!(s.out, vec![(3, Msg::InvalidateAck)]);
    assert_eq!((c.mode, c.data), (None, None));
}

#[test]
fn an_invalidation_of_a_shared_grant_still_on_its_way_waits_for_it() {
    let mut c = copy();
    c.request(Mode::Shared).unwrap();
    let s = c.on_invalidate(2, 1).unwrap();
    assert!(s.out.is_empty(), "deferred");
    let s = c.on_grant(grant(Mode::Shared, 0, Some(8))).unwrap();
    assert_eq!(s.completed, Some(Mode::Shared));
    let s = c.served().unwrap();
    assert_eq!(s.out, vec![(2, Msg::InvalidateAck)]);
    assert_eq!(c.data, None);
}

#[test]
fn concurrent_upgrades_do_not_wait_for_each_other() {
    // both sharers ask to upgrade; the home picks the other one first (epoch 1) and then
    // us (epoch 2, pointed at the other): the other's Invalidate of epoch 1 reaches us
    // while our request is out, and is answered at once because our copy goes with it
    let mut c = holding(Mode::Shared, 0, 1);
    c.request(Mode::Exclusive).unwrap();
    let s = c.on_invalidate(2, 1).unwrap();
    assert_eq!(s.out, vec![(2, Msg::InvalidateAck)]);
    assert_eq!(c.data, None);
    let s = c
        .on_grant(Grant {
            source: Some(2),
            ..grant(Mode::Exclusive, 2, None)
        })
        .unwrap();
    assert_eq!(s.out.len(), 1, "asks the other for the page");
}

#[test]
fn eviction_sends_the_page_only_when_dirty_and_obeys_the_reply() {
    let mut c = copy();
    assert_eq!(c.evict(), None, "nothing to evict");
    let mut c = holding(Mode::Exclusive, 2, 1);
    assert_eq!(
        c.evict(),
        Some((
            HOME,
            Msg::Evict {
                epoch: 2,
                data: None
            }
        ))
    );
    assert_eq!(c.evict(), None, "one notice at a time");
    c.on_evict_reply(true).unwrap();
    assert_eq!((c.mode, c.data, c.pending), (None, None, Pending::Idle));
    assert!(c.on_evict_reply(true).is_err(), "a reply nobody asked for");

    let mut c = holding(Mode::Exclusive, 2, 1);
    c.wrote(2);
    assert_eq!(
        c.evict(),
        Some((
            HOME,
            Msg::Evict {
                epoch: 2,
                data: Some(2)
            }
        ))
    );
    // declined: a successor is coming; its Transfer, deferred meanwhile, is served now
    let s = c.on_transfer(3, Mode::Exclusive, 3, false).unwrap();
    assert!(s.out.is_empty(), "waits for the reply");
    let s = c.on_evict_reply(false).unwrap();
    assert_eq!(
        s.out,
        vec![(
            3,
            Msg::Page {
                data: 2,
                dirty: true
            }
        )]
    );
}

#[test]
fn an_unsent_notice_keeps_the_copy_and_a_waiting_successor_is_served() {
    let mut c = holding(Mode::Exclusive, 2, 1);
    c.wrote(5);
    assert!(c.evict_unsent().is_err(), "no notice out");
    c.evict().unwrap();
    // the home still lists us: a successor's Transfer arrives while the notice is "out"
    assert!(c
        .on_transfer(3, Mode::Exclusive, 3, false)
        .unwrap()
        .out
        .is_empty());
    c.evict_unsent().unwrap();
    assert_eq!((c.pending, c.data, c.dirty), (Pending::Idle, Some(5), true));
    let s = c.served().unwrap();
    assert_eq!(
        s.out,
        vec![(
            3,
            Msg::Page {
                data: 5,
                dirty: true
            }
        )]
    );
}

#[test]
fn an_unsent_or_refused_request_leaves_the_node_as_it_was() {
    let mut c = holding(Mode::Shared, 1, 4);
    assert!(c.request_unsent().is_err(), "no request out");
    c.request(Mode::Exclusive).unwrap();
    c.request_unsent().unwrap();
    assert_eq!(
        (c.pending, c.mode, c.data),
        (Pending::Idle, Some(Mode::Shared), Some(4))
    );
    assert!(c.usable(Mode::Shared));
    c.request(Mode::Exclusive).unwrap(); // and may ask again
}

#[test]
fn a_created_page_is_held_exclusively_and_a_lost_one_is_gone() {
    let mut c = copy();
    c.created(1).unwrap();
    assert!(c.usable(Mode::Exclusive) && !c.dirty);
    assert!(c.created(2).is_err(), "created twice");
    c.mark_dirty();
    assert_eq!(
        c.evict().unwrap().1,
        Msg::Evict {
            epoch: 0,
            data: Some(1)
        }
    );
    let mut c = copy();
    c.request(Mode::Exclusive).unwrap();
    c.on_grant(Grant {
        source: Some(2),
        ..grant(Mode::Exclusive, 1, None)
    })
    .unwrap();
    c.on_transfer(3, Mode::Exclusive, 2, false).unwrap();
    let (d, page) = c.lose();
    assert_eq!(
        d,
        vec![Deferred::Transfer {
            to: 3,
            want: Mode::Exclusive,
            epoch: 2,
            keep: false,
        }]
    );
    assert_eq!(page, None);
    assert_eq!((c.pending, c.data, c.mode), (Pending::Idle, None, None));
    // an upgrade that waits for a sharer's acknowledgement holds the page (and its shared
    // mode): losing it drops both, so the copy stays consistent (found by the model with
    // deaths: the engine kept the mode without the page), and the page goes to the caller
    let mut c = holding(Mode::Shared, 0, 3);
    c.request(Mode::Exclusive).unwrap();
    c.on_grant(Grant {
        invalidate: bit(2),
        ..grant(Mode::Exclusive, 1, None)
    })
    .unwrap();
    assert!(matches!(c.pending, Pending::Completing { .. }));
    let (d, page) = c.lose();
    assert!(d.is_empty());
    assert_eq!(page, Some(3));
    assert_eq!((c.pending, c.data, c.mode), (Pending::Idle, None, None));
    c.check().unwrap();
    // a copy whose home died goes without a notice, only when nothing is outstanding
    let mut c = holding(Mode::Shared, 0, 3);
    c.drop_for_dead_home().unwrap();
    assert_eq!((c.mode, c.data), (None, None));
    c.request(Mode::Shared).unwrap();
    assert!(c.drop_for_dead_home().is_err());
}

#[test]
fn an_eviction_accepted_while_a_successor_waits_is_a_violation() {
    let mut c = holding(Mode::Exclusive, 2, 1);
    c.evict().unwrap();
    c.on_transfer(3, Mode::Exclusive, 3, false).unwrap();
    assert!(c.on_evict_reply(true).is_err());
    // and no notice while something is deferred
    let mut c = copy();
    c.request(Mode::Shared).unwrap();
    c.on_invalidate(2, 1).unwrap();
    c.on_grant(grant(Mode::Shared, 0, Some(1))).unwrap();
    assert_eq!(c.evict(), None, "the deferred invalidation comes first");
}

#[test]
fn a_sharer_serves_a_forwarded_read_and_keeps_its_copy() {
    // idle sharer: a copy to the requester, a data-less copy-back home, the copy stays usable
    let mut c = holding(Mode::Shared, 0, 7);
    let s = c.on_transfer(2, Mode::Shared, 1, true).unwrap();
    assert_eq!(
        s.out,
        vec![
            (
                2,
                Msg::Page {
                    data: 7,
                    dirty: false
                }
            ),
            (HOME, Msg::CopyBack { data: None }),
        ]
    );
    assert!(c.usable(Mode::Shared));
    // with its own upgrade request out it still serves (the home holds that request until
    // this copy-back arrives: waiting for its grant would wait for ever)
    let mut c = holding(Mode::Shared, 0, 7);
    c.request(Mode::Exclusive).unwrap();
    let s = c.on_transfer(2, Mode::Shared, 1, true).unwrap();
    assert_eq!(s.out.len(), 2);
    assert_eq!(c.data, Some(7));
    // with its eviction notice out it waits for the (declining) answer, then serves
    let mut c = holding(Mode::Shared, 0, 7);
    c.evict().unwrap();
    assert!(c
        .on_transfer(2, Mode::Shared, 1, true)
        .unwrap()
        .out
        .is_empty());
    let s = c.on_evict_reply(false).unwrap();
    assert_eq!(s.out.len(), 2);
    assert!(c.usable(Mode::Shared));
    // while its own shared grant is still on its way (named as source through a chain of
    // forwards), it serves once the page is here
    let mut c = copy();
    c.request(Mode::Shared).unwrap();
    c.on_grant(Grant {
        source: Some(3),
        source_keeps: true,
        ..grant(Mode::Shared, 1, None)
    })
    .unwrap();
    assert!(c
        .on_transfer(2, Mode::Shared, 2, true)
        .unwrap()
        .out
        .is_empty());
    let s = c.on_page(9, false).unwrap();
    assert_eq!(s.completed, Some(Mode::Shared));
    let s = c.served().unwrap();
    assert_eq!(s.out.len(), 2);
    assert_eq!(c.data, Some(9));
    // a forwarded read may only ask for shared possession, and only of a holder
    let mut c = holding(Mode::Shared, 0, 7);
    assert!(c.on_transfer(2, Mode::Exclusive, 1, true).is_err());
    let mut c = copy();
    assert!(c.on_transfer(2, Mode::Shared, 1, true).is_err());
}

#[test]
fn a_forwarded_grant_sends_a_transfer_that_keeps_the_source_copy() {
    // (`forwarded_read` checks the Transfer)
    forwarded_read(4);
    // an exclusive grant from a source that keeps its copy would make two writers' worth
    let mut c = copy();
    c.request(Mode::Exclusive).unwrap();
    assert!(c
        .on_grant(Grant {
            source: Some(2),
            source_keeps: true,
            ..grant(Mode::Exclusive, 4, None)
        })
        .is_err());
}

/// A copy waiting for the page of a read the home forwarded to sharer 2 at `epoch`.
fn forwarded_read(epoch: Epoch) -> PageCopy<u64> {
    let mut c = copy();
    c.request(Mode::Shared).unwrap();
    let s = c
        .on_grant(Grant {
            source: Some(2),
            source_keeps: true,
            ..grant(Mode::Shared, epoch, None)
        })
        .unwrap();
    assert_eq!(
        s.out,
        vec![(
            2,
            Msg::Transfer {
                want: Mode::Shared,
                epoch,
                keep: true
            }
        )]
    );
    assert!(c.awaits_forwarded_page());
    c
}

#[test]
fn a_forwarded_read_whose_sharer_died_asks_the_home_again_and_answers_invalidations_at_once() {
    let mut c = forwarded_read(1);
    // a writer's invalidation of the copy that never came waits, as for any shared grant
    assert!(c.on_invalidate(3, 2).unwrap().out.is_empty());
    let out = c
        .ask_again()
        .expect("a forwarded read waiting for its page");
    assert_eq!(
        out,
        vec![
            (3, Msg::InvalidateAck),
            (
                HOME,
                Msg::Request {
                    want: Mode::Shared,
                    have: false,
                    again: true
                }
            )
        ]
    );
    assert_eq!(c.pending, Pending::Requested { want: Mode::Shared });
    // asking again, it holds nothing: a later writer's invalidation is answered at once
    assert_eq!(
        c.on_invalidate(4, 3).unwrap().out,
        vec![(4, Msg::InvalidateAck)]
    );
    // a grant older than that invalidation was invalidated before it arrived: no completion,
    // the page is dropped
    let s = c.on_grant(grant(Mode::Shared, 2, Some(7))).unwrap();
    assert_eq!(s.completed, None);
    assert_eq!((c.pending, c.mode, c.data), (Pending::Idle, None, None));
    // the worker asks again, and a grant newer than every answered invalidation completes
    c.request(Mode::Shared).unwrap();
    let s = c.on_grant(grant(Mode::Shared, 3, Some(8))).unwrap();
    assert_eq!(s.completed, Some(Mode::Shared));
    assert!(!c.asking_again && c.acked_asking == 0);
}

#[test]
fn only_a_forwarded_read_waiting_for_its_page_with_nothing_forwarded_on_asks_again() {
    // a read forwarded on to us meanwhile: its reader waits for our page
    let mut c = forwarded_read(1);
    assert!(c
        .on_transfer(3, Mode::Shared, 2, true)
        .unwrap()
        .out
        .is_empty());
    assert_eq!(c.ask_again(), None);
    // a shared grant from an exclusive holder (its copy-back carries the page home)
    let mut c = copy();
    c.request(Mode::Shared).unwrap();
    c.on_grant(Grant {
        source: Some(2),
        ..grant(Mode::Shared, 1, None)
    })
    .unwrap();
    assert!(!c.awaits_forwarded_page());
    assert_eq!(c.ask_again(), None);
    // a page that arrived
    let mut c = forwarded_read(1);
    c.on_page(5, false).unwrap();
    assert_eq!(c.ask_again(), None);
}

#[test]
fn a_reclaimed_copy_goes_home_and_the_dead_requesters_transfer_is_void() {
    let mut c = holding(Mode::Exclusive, 1, 5);
    c.wrote(6);
    let s = c.on_reclaim(2).unwrap();
    assert_eq!(s.out, vec![(HOME, Msg::CopyBack { data: Some(6) })]);
    assert_eq!((c.mode, c.data), (None, None));
    // the dead requester's Transfer, arriving late, is void
    let late = c.on_transfer(3, Mode::Exclusive, 2, false).unwrap();
    assert!(late.out.is_empty() && c.deferred.is_empty());
    // and one waiting here when the Reclaim came is dropped
    let mut c = holding(Mode::Exclusive, 1, 5);
    c.evict().unwrap();
    assert!(c
        .on_transfer(3, Mode::Exclusive, 2, false)
        .unwrap()
        .out
        .is_empty());
    assert!(
        c.on_reclaim(2).unwrap().out.is_empty(),
        "waits for the eviction reply"
    );
    assert_eq!(c.deferred, vec![Deferred::Reclaim { epoch: 2 }]);
    let s = c.on_evict_reply(false).unwrap();
    assert_eq!(s.out, vec![(HOME, Msg::CopyBack { data: None })]);
}

#[test]
fn a_reclaim_after_the_hand_over_is_gone_and_one_before_the_holders_grant_waits_for_it() {
    let mut c = holding(Mode::Exclusive, 1, 5);
    assert_eq!(
        c.on_transfer(3, Mode::Exclusive, 2, false)
            .unwrap()
            .out
            .len(),
        1
    );
    assert_eq!(c.on_reclaim(2).unwrap().out, vec![(HOME, Msg::Gone)]);
    // an upgrade whose grant has not arrived: the Reclaim waits, then takes the page home
    let mut c = holding(Mode::Shared, 1, 5);
    c.request(Mode::Exclusive).unwrap();
    assert!(c.on_reclaim(2).unwrap().out.is_empty());
    let s = c.on_grant(grant(Mode::Exclusive, 1, None)).unwrap();
    assert_eq!(s.completed, Some(Mode::Exclusive));
    assert_eq!(
        c.served().unwrap().out,
        vec![(HOME, Msg::CopyBack { data: None })]
    );
    assert_eq!(c.data, None);
}
