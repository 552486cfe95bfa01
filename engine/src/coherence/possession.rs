//! Possession: what one node holds of one page and how it answers the protocol's messages.
//!
//! A [`PageCopy`] is the node-side state machine of a page: the mode the node may use it in, the
//! page itself (once it arrived), whether it is newer than the home's copy, the epoch of the
//! grant it holds, the one directory interaction it may have outstanding ([`Pending`]), and
//! messages it could not serve yet ([`PageCopy::deferred`]).
//!
//! Rules (docs/protocol.md has the argument for each):
//! - a node has at most one outstanding request or eviction notice per page;
//! - a request completes when the page is there and every invalidation it had to send was
//!   acknowledged; the worker that asked uses the page before anyone else is served (messages
//!   that arrived meanwhile are served by [`PageCopy::served`]);
//! - a `Transfer` is served (page pushed, copy dropped, copy-back sent home for a shared
//!   successor) only when the node has the page and no request outstanding; before that it is
//!   deferred. That is anticipatory chaining: a node may be named as the source of a page that
//!   is still on its way to it;
//! - an `Invalidate` of an epoch older than the node's latest grant is about a copy already
//!   dropped: acknowledged at once. Otherwise the node drops its copy and acknowledges; if the
//!   shared grant it is about has not arrived yet, it waits for it (deferred). Answering old
//!   invalidations at once is what breaks the upgrade deadlock (two sharers upgrading at once);
//! - a node whose eviction notice was declined keeps its copy until the `Transfer` or
//!   `Invalidate` that the home expects reaches it.
//!
//! The engine calls these methods under the page's frame latch, and only when no local guard
//! holds the page (a latched page defers the message, exactly like a page still in flight).

use crate::coherence::protocol::{
    bit, members, violation, Epoch, Grant, Mode, Msg, Node, NodeSet, ProtocolError,
};

/// The node's outstanding directory interaction for a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pending {
    Idle,
    /// Request sent, grant not yet received.
    Requested {
        want: Mode,
    },
    /// Grant received; waiting for the page from a source and/or invalidation acknowledgements.
    Completing {
        want: Mode,
        awaiting_page: bool,
        acks: NodeSet,
    },
    /// Eviction notice sent, reply not yet received.
    Evicting,
}

/// A message that arrived but cannot be served yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Deferred {
    Transfer { to: Node, want: Mode, epoch: Epoch },
    Invalidate { from: Node, epoch: Epoch },
}

/// What happened when a message was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step<D> {
    /// Messages to send, as (destination, message).
    pub out: Vec<(Node, Msg<D>)>,
    /// The node's request completed: its worker may now use the page in this mode.
    pub completed: Option<Mode>,
}

impl<D> Default for Step<D> {
    fn default() -> Self {
        Step {
            out: Vec::new(),
            completed: None,
        }
    }
}

/// One node's state for one page.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PageCopy<D> {
    /// The page's home node.
    pub home: Node,
    /// This node.
    pub me: Node,
    /// Possession once complete (`None` while a request is in progress or nothing is held).
    pub mode: Option<Mode>,
    /// The page, when present.
    pub data: Option<D>,
    /// The page is newer than the home's copy.
    pub dirty: bool,
    /// Epoch of the latest grant received.
    pub epoch: Epoch,
    pub pending: Pending,
    pub deferred: Vec<Deferred>,
}

impl<D: Clone> PageCopy<D> {
    pub fn new(home: Node, me: Node) -> PageCopy<D> {
        PageCopy {
            home,
            me,
            mode: None,
            data: None,
            dirty: false,
            epoch: 0,
            pending: Pending::Idle,
            deferred: Vec::new(),
        }
    }

    /// The node may use the page in `want` without asking anyone (the local hot path).
    pub fn usable(&self, want: Mode) -> bool {
        self.pending == Pending::Idle
            && self.data.is_some()
            && match want {
                Mode::Shared => self.mode.is_some(),
                Mode::Exclusive => self.mode == Some(Mode::Exclusive),
            }
    }

    /// Ask the home for `want`. Only when idle and not already usable in that mode.
    pub fn request(&mut self, want: Mode) -> Result<(Node, Msg<D>), ProtocolError> {
        if self.pending != Pending::Idle || self.usable(want) {
            return violation(format!(
                "node {} requests {want:?} while {:?} holding {:?}",
                self.me, self.pending, self.mode
            ));
        }
        self.pending = Pending::Requested { want };
        Ok((
            self.home,
            Msg::Request {
                want,
                have: self.data.is_some(),
            },
        ))
    }

    /// The home's grant arrived.
    pub fn on_grant(&mut self, g: Grant<D>) -> Result<Step<D>, ProtocolError> {
        let Pending::Requested { want } = self.pending else {
            return violation(format!("node {} got a grant it did not ask for", self.me));
        };
        if g.mode != want || g.epoch < self.epoch {
            return violation(format!(
                "node {} asked for {want:?} (epoch {}) and got {:?} at epoch {}",
                self.me, self.epoch, g.mode, g.epoch
            ));
        }
        self.epoch = g.epoch;
        let mut step = Step::default();
        if let Some(d) = g.data {
            self.data = Some(d);
            self.dirty = false;
        }
        if let Some(src) = g.source {
            // Any copy we still have is stale (we are no longer a holder at the home, and the
            // invalidation of it, of an older epoch, is on its way): drop it now.
            self.data = None;
            self.dirty = false;
            step.out.push((
                src,
                Msg::Transfer {
                    want,
                    epoch: g.epoch,
                },
            ));
        } else if self.data.is_none() {
            return violation(format!(
                "node {} was granted {want:?} with no page and no source",
                self.me
            ));
        }
        for n in members(g.invalidate) {
            step.out.push((n, Msg::Invalidate { epoch: g.epoch }));
        }
        self.pending = Pending::Completing {
            want,
            awaiting_page: g.source.is_some(),
            acks: g.invalidate,
        };
        self.finish(&mut step)?;
        Ok(step)
    }

    /// The page arrived from the source a grant named.
    pub fn on_page(&mut self, data: D, dirty: bool) -> Result<Step<D>, ProtocolError> {
        match &mut self.pending {
            Pending::Completing {
                want,
                awaiting_page: a @ true,
                ..
            } => {
                *a = false;
                self.data = Some(data);
                // A shared successor's source copies the page back home: it is clean here.
                self.dirty = dirty && *want == Mode::Exclusive;
            }
            _ => {
                return violation(format!(
                    "node {} got a page it was not waiting for",
                    self.me
                ))
            }
        }
        let mut step = Step::default();
        self.finish(&mut step)?;
        Ok(step)
    }

    /// `from` acknowledged our invalidation.
    pub fn on_invalidate_ack(&mut self, from: Node) -> Result<Step<D>, ProtocolError> {
        match &mut self.pending {
            Pending::Completing { acks, .. } if *acks & bit(from) != 0 => *acks &= !bit(from),
            _ => {
                return violation(format!(
                    "node {} got an unexpected invalidation ack from {from}",
                    self.me
                ))
            }
        }
        let mut step = Step::default();
        self.finish(&mut step)?;
        Ok(step)
    }

    /// `to` (a successor the home pointed at us) asks for the page.
    pub fn on_transfer(
        &mut self,
        to: Node,
        want: Mode,
        epoch: Epoch,
    ) -> Result<Step<D>, ProtocolError> {
        if epoch <= self.epoch && self.pending == Pending::Idle && self.data.is_some() {
            return violation(format!(
                "node {} asked by {to} for the page at epoch {epoch}, not newer than its own {}",
                self.me, self.epoch
            ));
        }
        self.deferred.push(Deferred::Transfer { to, want, epoch });
        let mut step = Step::default();
        self.serve_deferred(&mut step)?;
        Ok(step)
    }

    /// `from` (now holding or about to hold the page exclusively) invalidates our copy.
    pub fn on_invalidate(&mut self, from: Node, epoch: Epoch) -> Result<Step<D>, ProtocolError> {
        self.deferred.push(Deferred::Invalidate { from, epoch });
        let mut step = Step::default();
        self.serve_deferred(&mut step)?;
        Ok(step)
    }

    /// The local worker wrote the page (requires exclusive possession).
    pub fn wrote(&mut self, data: D) {
        debug_assert!(self.usable(Mode::Exclusive));
        self.data = Some(data);
        self.dirty = true;
    }

    /// Send an eviction notice (only when idle with the page and nothing deferred).
    pub fn evict(&mut self) -> Option<(Node, Msg<D>)> {
        if self.pending != Pending::Idle || self.data.is_none() || !self.deferred.is_empty() {
            return None;
        }
        self.pending = Pending::Evicting;
        let data = if self.dirty { self.data.clone() } else { None };
        Some((
            self.home,
            Msg::Evict {
                epoch: self.epoch,
                data,
            },
        ))
    }

    /// The home answered our eviction notice.
    pub fn on_evict_reply(&mut self, accepted: bool) -> Result<Step<D>, ProtocolError> {
        if self.pending != Pending::Evicting {
            return violation(format!(
                "node {} got an eviction reply it did not ask for",
                self.me
            ));
        }
        self.pending = Pending::Idle;
        let mut step = Step::default();
        if accepted {
            if !self.deferred.is_empty() {
                return violation(format!(
                    "node {}'s eviction was accepted while {:?} wait for its copy",
                    self.me, self.deferred
                ));
            }
            self.drop_copy();
        } else {
            self.serve_deferred(&mut step)?;
        }
        Ok(step)
    }

    /// The request never reached the home (its send failed), or the home refused it without
    /// recording it: the node is idle again and keeps what it held. Messages that arrived
    /// meanwhile stay deferred: the caller serves them with [`served`](Self::served) (the
    /// engine from its handler, under the frame latch), exactly as after a completion.
    pub fn request_unsent(&mut self) -> Result<(), ProtocolError> {
        if !matches!(self.pending, Pending::Requested { .. }) {
            return violation(format!(
                "node {}: a request that was not sent while {:?}",
                self.me, self.pending
            ));
        }
        self.pending = Pending::Idle;
        Ok(())
    }

    /// The eviction notice never reached the home (the batch it was in failed): the node
    /// keeps its copy, as if the home had declined, and the caller serves what arrived
    /// meanwhile with [`served`](Self::served). A successor's `Transfer` may be among it: the
    /// home pointed it at this node, which it still lists as the holder.
    pub fn evict_unsent(&mut self) -> Result<(), ProtocolError> {
        if self.pending != Pending::Evicting {
            return violation(format!(
                "node {}: an eviction notice that was not sent while {:?}",
                self.me, self.pending
            ));
        }
        self.pending = Pending::Idle;
        Ok(())
    }

    /// A page just created at this node (allocated here): held exclusively and clean (the
    /// directory lists this node as the exclusive holder; the epoch stays as it was).
    pub fn created(&mut self, data: D) -> Result<(), ProtocolError> {
        if self.pending != Pending::Idle || self.data.is_some() || !self.deferred.is_empty() {
            return violation(format!(
                "node {} creates a page it holds or asked for ({:?})",
                self.me, self.pending
            ));
        }
        self.mode = Some(Mode::Exclusive);
        self.data = Some(data);
        self.dirty = false;
        Ok(())
    }

    /// A local guard wrote the page: the copy is newer than the home's (the engine learns of
    /// writes from the frame's dirty flag, not through [`wrote`](Self::wrote)).
    pub fn mark_dirty(&mut self) {
        debug_assert!(self.data.is_some(), "a write without the page");
        self.dirty = true;
    }

    /// The page's only current copy died with another node: nothing is awaited any more.
    /// Returns the deferred messages, which the caller must answer with an error. (A page
    /// still here, if any, stays for the caller to drop with its frame.)
    pub fn lose(&mut self) -> Vec<Deferred> {
        self.pending = Pending::Idle;
        std::mem::take(&mut self.deferred)
    }

    /// The home died: the copy can never go home, nor be asked for again. Dropped without a
    /// notice (only when idle: an outstanding interaction is the caller's to end first).
    pub fn drop_for_dead_home(&mut self) -> Result<(), ProtocolError> {
        if self.pending != Pending::Idle {
            return violation(format!(
                "node {} drops its copy while {:?}",
                self.me, self.pending
            ));
        }
        self.drop_copy();
        Ok(())
    }

    fn drop_copy(&mut self) {
        self.mode = None;
        self.data = None;
        self.dirty = false;
    }

    /// Complete the request if the page is here and every ack arrived, then serve what waited.
    fn finish(&mut self, step: &mut Step<D>) -> Result<(), ProtocolError> {
        if let Pending::Completing {
            want,
            awaiting_page: false,
            acks: 0,
        } = self.pending
        {
            self.pending = Pending::Idle;
            self.mode = Some(want);
            // The worker that asked uses the page first: deferred messages wait for `served`.
            step.completed = Some(want);
            return Ok(());
        }
        if self.pending == Pending::Idle {
            self.serve_deferred(step)?;
        }
        Ok(())
    }

    /// The worker whose request completed has used the page (its latch is released): serve
    /// what waited for the page meanwhile.
    pub fn served(&mut self) -> Result<Step<D>, ProtocolError> {
        let mut step = Step::default();
        self.serve_deferred(&mut step)?;
        Ok(step)
    }

    /// Serve every deferred message that can be served now (in arrival order).
    fn serve_deferred(&mut self, step: &mut Step<D>) -> Result<(), ProtocolError> {
        let mut i = 0;
        while i < self.deferred.len() {
            match self.deferred[i] {
                Deferred::Invalidate { from, epoch } if epoch < self.epoch => {
                    // about a copy we already dropped (we hold a newer grant)
                    self.deferred.remove(i);
                    step.out.push((from, Msg::InvalidateAck));
                }
                Deferred::Invalidate { from, .. } => match self.pending {
                    // about a shared grant still on its way, or our copy while the home answers
                    // our eviction notice (it will decline): wait
                    Pending::Requested { want: Mode::Shared }
                    | Pending::Completing {
                        want: Mode::Shared, ..
                    }
                    | Pending::Evicting => i += 1,
                    // our current copy (an upgrade request may be in flight: it continues
                    // without the copy, the home will point it at the invalidating node)
                    Pending::Idle | Pending::Requested { .. } if self.data.is_some() => {
                        self.deferred.remove(i);
                        self.drop_copy();
                        step.out.push((from, Msg::InvalidateAck));
                    }
                    _ => {
                        return violation(format!(
                            "node {} invalidated by {from} while {:?} with {} copy",
                            self.me,
                            self.pending,
                            if self.data.is_some() { "a" } else { "no" }
                        ))
                    }
                },
                Deferred::Transfer { to, want, .. } => {
                    if self.pending == Pending::Idle && self.data.is_some() {
                        self.deferred.remove(i);
                        let data = self.data.clone().expect("checked above");
                        if want == Mode::Shared {
                            let back = if self.dirty { Some(data.clone()) } else { None };
                            step.out.push((self.home, Msg::CopyBack { data: back }));
                        }
                        step.out.push((
                            to,
                            Msg::Page {
                                data,
                                dirty: self.dirty,
                            },
                        ));
                        self.drop_copy();
                    } else {
                        i += 1;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
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
                    have: false
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
                have: true
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
                    epoch: 3
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
        let s = c.on_transfer(3, Mode::Exclusive, 2).unwrap();
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
        let s = c.on_transfer(2, Mode::Shared, 2).unwrap();
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
        let s = c.on_transfer(2, Mode::Shared, 2).unwrap();
        assert_eq!(s.out[0], (HOME, Msg::CopyBack { data: None }));
    }

    #[test]
    fn a_transfer_not_newer_than_the_held_grant_is_a_violation() {
        let mut c = holding(Mode::Exclusive, 5, 1);
        assert!(c.on_transfer(2, Mode::Exclusive, 5).is_err());
        assert!(c.on_transfer(2, Mode::Exclusive, 4).is_err());
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
        let s = c.on_transfer(3, Mode::Exclusive, 3).unwrap();
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
        assert!(c.on_transfer(3, Mode::Exclusive, 3).unwrap().out.is_empty());
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
        c.on_transfer(3, Mode::Exclusive, 2).unwrap();
        let d = c.lose();
        assert_eq!(
            d,
            vec![Deferred::Transfer {
                to: 3,
                want: Mode::Exclusive,
                epoch: 2
            }]
        );
        assert_eq!((c.pending, c.data, c.mode), (Pending::Idle, None, None));
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
        c.on_transfer(3, Mode::Exclusive, 3).unwrap();
        assert!(c.on_evict_reply(true).is_err());
        // and no notice while something is deferred
        let mut c = copy();
        c.request(Mode::Shared).unwrap();
        c.on_invalidate(2, 1).unwrap();
        c.on_grant(grant(Mode::Shared, 0, Some(1))).unwrap();
        assert_eq!(c.evict(), None, "the deferred invalidation comes first");
    }
}
