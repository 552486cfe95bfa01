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
//!   `Invalidate` that the home expects reaches it;
//! - a `Transfer{keep}` (a shared read the home forwarded to us as a sharer) is served with our
//!   shared copy, which we keep, also while our own upgrade request is out; a data-less
//!   `CopyBack` tells the home we served;
//! - an `Offer` (one pool: the home evicts a page nobody holds) is taken as a node-shared copy
//!   when we neither hold nor want anything about the page and the caller has a frame;
//!   otherwise declined. Either way the home gets an `OfferReply`.
//!
//! The engine calls these methods under the page's frame latch, and only when no local guard
//! holds the page (a latched page defers the message, exactly like a page still in flight).

use crate::coherence::directory::Holds;
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
        /// A shared read the home forwarded to a sharer, which keeps its copy (the home's
        /// copy is current): if that sharer dies before its page arrives, the read can be
        /// asked for again ([`PageCopy::ask_again`]) instead of losing the page.
        forwarded: bool,
    },
    /// Eviction notice sent, reply not yet received.
    Evicting,
}

/// A message that arrived but cannot be served yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Deferred {
    Transfer {
        to: Node,
        want: Mode,
        epoch: Epoch,
        keep: bool,
    },
    Invalidate {
        from: Node,
        epoch: Epoch,
    },
    /// The home's [`Msg::Reclaim`] of the copy a dead requester's grant of `epoch` was to take.
    Reclaim {
        epoch: Epoch,
    },
}

impl Deferred {
    /// Whether the deferred message came from, or is to be answered to, node `n`.
    pub fn involves(&self, n: Node) -> bool {
        match *self {
            Deferred::Transfer { to, .. } => to == n,
            Deferred::Invalidate { from, .. } => from == n,
            Deferred::Reclaim { .. } => false,
        }
    }
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
    /// The request out is a forwarded read asked for again ([`ask_again`](Self::ask_again)):
    /// the home may still list us as a sharer, so invalidations reach us that are about a
    /// copy we never got.
    pub asking_again: bool,
    /// The newest epoch of an invalidation acknowledged at once while asking again (0: none).
    /// A grant older than it was invalidated before it arrived: its page is dropped at once.
    pub acked_asking: Epoch,
    /// The epoch of a grant whose requester died and whose page the home reclaimed from us
    /// (0: none): that requester's `Transfer`, if it still arrives, is void.
    pub reclaimed: Epoch,
    /// The epoch of the last `Transfer` we served by handing our copy over (0: none): a
    /// `Reclaim` of that grant is answered `Gone`.
    pub handed_at: Epoch,
    /// The home may list this node as a sharer although it holds nothing, and no grant
    /// completed since: its copy ended by a loss ([`lose`](Self::lose)), or the home brought
    /// the page back listing every sharer the dead holder was to invalidate
    /// (`DirEntry::brought_back`, told by `Control::Found`: [`may_be_listed`](Self::may_be_listed)).
    /// An invalidation then is answered at once, as while asking again (found by the model
    /// check with restarts).
    pub maybe_listed: bool,
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
            asking_again: false,
            acked_asking: 0,
            reclaimed: 0,
            handed_at: 0,
            maybe_listed: false,
        }
    }

    /// The copy's invariants (the model checks them after every step; the engine in debug
    /// builds after every message): an idle copy that holds a mode holds the page; a dirty
    /// copy holds the page; a request never waits for this node's own acknowledgement; a
    /// copy that is being created or has nothing holds no mode.
    pub fn check(&self) -> Result<(), ProtocolError> {
        if self.pending == Pending::Idle && self.mode.is_some() && self.data.is_none() {
            return violation(format!(
                "node {}: idle, holds {:?} but no page",
                self.me, self.mode
            ));
        }
        if self.dirty && self.data.is_none() {
            return violation(format!("node {}: dirty without a page", self.me));
        }
        if let Pending::Completing { acks, .. } = self.pending {
            if acks & bit(self.me) != 0 {
                return violation(format!(
                    "node {}: waits for its own acknowledgement",
                    self.me
                ));
            }
        }
        Ok(())
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
                // a request that asked again and did not reach the home asks again still
                again: self.asking_again,
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
        if g.source_keeps && (g.source.is_none() || want != Mode::Shared) {
            return violation(format!(
                "node {} was granted {want:?} from a sharer that keeps its copy, source {:?}",
                self.me, g.source
            ));
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
                    keep: g.source_keeps,
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
            forwarded: g.source_keeps,
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
        keep: bool,
    ) -> Result<Step<D>, ProtocolError> {
        if keep && want != Mode::Shared {
            return violation(format!(
                "node {} asked by {to} to hand {want:?} possession over and keep its copy",
                self.me
            ));
        }
        if epoch == self.reclaimed && !keep {
            // from a requester that died: the home took the page back (`on_reclaim`)
            return Ok(Step::default());
        }
        if epoch <= self.epoch && self.pending == Pending::Idle && self.data.is_some() {
            return violation(format!(
                "node {} asked by {to} for the page at epoch {epoch}, not newer than its own {}",
                self.me, self.epoch
            ));
        }
        self.deferred.push(Deferred::Transfer {
            to,
            want,
            epoch,
            keep,
        });
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

    /// The home reclaims the copy that the grant of `epoch` was to take: its requester died
    /// (fenced, every message it sent handled at the home) and may never have asked us. Served
    /// unless our own grant is completing or our eviction notice is out: with the page of that
    /// grant, a `CopyBack` (the page if dirty) and the copy is dropped; without it (handed
    /// over already), `Gone`. A `Transfer` of that grant waiting here, or
    /// arriving later, is void.
    pub fn on_reclaim(&mut self, epoch: Epoch) -> Result<Step<D>, ProtocolError> {
        self.reclaimed = self.reclaimed.max(epoch);
        self.deferred.retain(
            |d| !matches!(*d, Deferred::Transfer { epoch: e, keep: false, .. } if e == epoch),
        );
        self.deferred.push(Deferred::Reclaim { epoch });
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

    /// One pool: the home offers us the page it is evicting (we did not ask). We take it as a
    /// node-shared copy when `data` is given (the caller had a frame for it: `None` = no room)
    /// and we neither hold, nor asked for, nor wait on anything about the page; else we
    /// decline. Either way the home gets an answer (its requests for the page wait for it).
    pub fn on_offer(&mut self, epoch: Epoch, data: Option<D>) -> Result<Step<D>, ProtocolError> {
        if epoch <= self.epoch {
            return violation(format!(
                "node {} offered the page at epoch {epoch}, not newer than its own {}",
                self.me, self.epoch
            ));
        }
        let take = data.is_some() && self.wants_offer();
        if take {
            self.mode = Some(Mode::Shared);
            self.data = data;
            self.dirty = false;
            self.epoch = epoch;
        }
        Ok(Step {
            out: vec![(self.home, Msg::OfferReply { accepted: take })],
            completed: None,
        })
    }

    /// Whether an offered page would be taken (the caller then finds it a frame).
    pub fn wants_offer(&self) -> bool {
        self.pending == Pending::Idle && self.data.is_none() && self.deferred.is_empty()
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
        // `asking_again` stays: the home may still list us as a sharer without a copy
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

    /// What this copy tells its home's census of a page lost with a dead node
    /// (`DirEntry::counted`): busy while anything about the page is under way (a request or
    /// hand-over, a deferred message, a request asking again that did not leave), else what
    /// it holds.
    pub fn holds(&self) -> Holds {
        if self.pending != Pending::Idle || !self.deferred.is_empty() || self.asking_again {
            return Holds::Busy;
        }
        match (self.mode, self.data.is_some()) {
            (None, false) => Holds::Nothing,
            (Some(Mode::Shared), true) => Holds::Shared,
            (Some(Mode::Exclusive), true) => Holds::Exclusive,
            // (not a state an idle copy is in: `check`)
            _ => Holds::Busy,
        }
    }

    /// The home brought the page back (`Control::Found`) and may list this node among the
    /// sharers the dead holder was to invalidate (`DirEntry::brought_back`): holding nothing,
    /// it answers invalidations at once from now on (`maybe_listed`); one that waited is
    /// answered now. Returns what to send.
    pub fn may_be_listed(&mut self) -> Result<Step<D>, ProtocolError> {
        let mut step = Step::default();
        if self.data.is_none() {
            self.maybe_listed = true;
            self.serve_deferred(&mut step)?;
        }
        Ok(step)
    }

    /// The page's only current copy died with another node: nothing is awaited any more and
    /// the copy is dropped (a page still here is not current: an upgrade that waited for a
    /// dead sharer's acknowledgement, or a copy invalidated while the grant was on its way).
    /// Returns the deferred messages, which the caller must answer with an error, and the
    /// dropped page, if any, for the caller to free with its frame.
    pub fn lose(&mut self) -> (Vec<Deferred>, Option<D>) {
        self.pending = Pending::Idle;
        self.maybe_listed = true;
        self.asking_again = false;
        self.acked_asking = 0;
        let page = self.data.take();
        self.drop_copy();
        (std::mem::take(&mut self.deferred), page)
    }

    /// The sharer a forwarded read was pointed at died, and nothing it sent can still arrive
    /// (its fence holds and its messages are all handled), before its page reached us: ask
    /// the home again. The request says we hold no copy; the home, which kept us on its list
    /// of sharers, serves it as any new read (its own copy is current for a forwarded read).
    /// Invalidations that waited for the page are acknowledged first (we hold nothing).
    /// Returns the messages to send, or `None` when a read was forwarded on to us meanwhile
    /// (its reader waits for our page while the home waits for our copy-back, so asking
    /// again would wait for ever) or this is not a forwarded read waiting for its page: the
    /// caller then loses the page as for any dead source.
    ///
    /// The same for an exclusive grant whose source (a node that held the page exclusively,
    /// never the home) died before handing the page over: the request asks for exclusive
    /// possession without a copy, and the home decides whether the page can be had again
    /// (`DirEntry::reclaim` through a chain) or died with the source.
    pub fn ask_again(&mut self) -> Option<Vec<(Node, Msg<D>)>> {
        let want = match self.pending {
            Pending::Completing {
                want: Mode::Shared,
                awaiting_page: true,
                acks: 0,
                forwarded: true,
            } => Mode::Shared,
            Pending::Completing {
                want: Mode::Exclusive,
                awaiting_page: true,
                acks: 0,
                forwarded: false,
            } => Mode::Exclusive,
            _ => return None,
        };
        let forwarded_on = self
            .deferred
            .iter()
            .any(|d| !matches!(d, Deferred::Invalidate { .. }));
        if forwarded_on || self.data.is_some() {
            return None;
        }
        // nothing is held (an upgrade's shared copy went when its grant named a source)
        self.drop_copy();
        self.pending = Pending::Requested { want };
        self.asking_again = true;
        let mut step = Step::default();
        // invalidations that waited for the page: answered now (see `serve_deferred`)
        let served = self.serve_deferred(&mut step);
        assert!(
            served.is_ok() && self.deferred.is_empty(),
            "only invalidations were deferred, and asking again answers them all: {served:?}"
        );
        let mut out = step.out;
        out.push((
            self.home,
            Msg::Request {
                want,
                have: false,
                again: true,
            },
        ));
        Some(out)
    }

    /// Whether the copy waits for the page of a forwarded read (see [`ask_again`](Self::ask_again)).
    pub fn awaits_forwarded_page(&self) -> bool {
        matches!(
            self.pending,
            Pending::Completing {
                awaiting_page: true,
                forwarded: true,
                ..
            }
        )
    }

    /// Asking again for exclusive possession without a copy ([`ask_again`](Self::ask_again)),
    /// with a hand-over (or a reclaim) deferred that it can never serve: the home pointed a
    /// successor at this node before it learned that the page's source died. The page is lost
    /// here (the caller's `lose`, which answers what waits): waiting would wait for ever, since
    /// the home defers this node's request behind the successor's hand-over.
    pub fn stuck_asking_again(&self) -> bool {
        if !self.asking_again || self.data.is_some() {
            return false;
        }
        // a hand-over of a possession this copy never got: any while it asks (or was
        // refused), one older than the new grant once that is here
        let never_got = |e: Epoch| match self.pending {
            Pending::Completing { .. } => e < self.epoch,
            _ => true,
        };
        self.deferred.iter().any(|d| match *d {
            Deferred::Transfer { epoch, .. } | Deferred::Reclaim { epoch } => never_got(epoch),
            Deferred::Invalidate { .. } => false,
        })
    }

    /// Whether the copy waits for a page a node other than the home hands over: a forwarded
    /// read's, or an exclusive grant's from the page's previous holder. If that node dies
    /// first, the copy asks again once it is fenced ([`ask_again`](Self::ask_again)) instead
    /// of losing the page at once.
    pub fn awaits_handed_page(&self) -> bool {
        self.awaits_forwarded_page()
            || matches!(
                self.pending,
                Pending::Completing {
                    want: Mode::Exclusive,
                    awaiting_page: true,
                    acks: 0,
                    forwarded: false,
                }
            )
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
            ..
        } = self.pending
        {
            self.pending = Pending::Idle;
            let unsure =
                std::mem::take(&mut self.asking_again) | std::mem::take(&mut self.maybe_listed);
            if unsure && std::mem::take(&mut self.acked_asking) > self.epoch {
                // asked again, and an invalidation newer than this grant was acknowledged
                // before it arrived: the copy is no longer ours (the writer holds the page);
                // the worker asks again
                self.drop_copy();
                self.serve_deferred(step)?;
                return Ok(());
            }
            self.acked_asking = 0;
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
                Deferred::Invalidate { from, epoch }
                    if (self.asking_again || self.maybe_listed)
                        && self.data.is_none()
                        && matches!(self.pending, Pending::Idle | Pending::Requested { .. }) =>
                {
                    // asking again (or about to, after a request that did not reach the
                    // home), we hold nothing, and no grant of ours is here yet: answered at
                    // once. Waiting for that grant, as a reader that was no sharer does, could
                    // wait for ever: the home may still have listed us as a sharer when this
                    // writer came, and may defer our request behind the writer's own
                    // hand-over, which waits for this answer (found by the model). If the
                    // invalidation is about the grant still on its way (newer than it),
                    // `finish` drops that grant's page.
                    self.deferred.remove(i);
                    self.acked_asking = self.acked_asking.max(epoch);
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
                Deferred::Reclaim { epoch } => {
                    if self.handed_at >= epoch {
                        // handed over for that grant (a copy-back it owed is on its way
                        // home before this answer), or for a later one
                        self.deferred.remove(i);
                        step.out.push((self.home, Msg::Gone));
                    } else if self.pending == Pending::Idle
                        && self.mode == Some(Mode::Exclusive)
                        && self.data.is_some()
                    {
                        // still the copy that grant was to take
                        self.deferred.remove(i);
                        let data = self.data.clone().expect("checked above");
                        let back = self.dirty.then_some(data);
                        step.out.push((self.home, Msg::CopyBack { data: back }));
                        self.drop_copy();
                    } else {
                        // the grant that made us the holder has not reached us or is still
                        // completing (an upgrade waiting for it, a page on its way to us), or
                        // our eviction notice is out (the home declines it): wait
                        i += 1;
                    }
                }
                Deferred::Transfer { to, keep: true, .. } => {
                    // A read the home forwarded to us as a sharer: we stay a holder, so we
                    // serve it with our shared copy even while our own upgrade request is out
                    // (the home defers that request until our copy-back: waiting for its grant
                    // here would wait for ever). A shared grant still on its way, or our
                    // eviction notice (the home declines it), waits.
                    let serving = self.data.is_some()
                        && self.mode == Some(Mode::Shared)
                        && matches!(self.pending, Pending::Idle | Pending::Requested { .. });
                    if serving {
                        self.deferred.remove(i);
                        let data = self.data.clone().expect("checked above");
                        step.out.push((to, Msg::Page { data, dirty: false }));
                        step.out.push((self.home, Msg::CopyBack { data: None }));
                    } else if self.pending == Pending::Idle && self.data.is_none() {
                        return violation(format!(
                            "node {} was forwarded a read by {to} but holds no copy",
                            self.me
                        ));
                    } else {
                        i += 1;
                    }
                }
                Deferred::Transfer {
                    to, want, epoch, ..
                } => {
                    if self.pending == Pending::Idle && self.data.is_some() {
                        self.deferred.remove(i);
                        self.handed_at = self.handed_at.max(epoch);
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
#[path = "possession_tests.rs"]
mod tests;
