//! The directory: what a page's home node knows and decides about the page's copies.
//!
//! One [`DirEntry`] per page lives at the page's home node. It records who holds the page
//! (nobody, a set of node-shared holders, or one node-exclusive holder), the page's conflict
//! epoch, and whether the home is waiting for a copy-back. Decisions are made when a message
//! arrives (**immediate metadata updates**): a requester is recorded as holder at once and, on a
//! conflict, pointed at its predecessor, so the page moves strictly in the order requests reach
//! the home (**anticipatory chaining**). The home's own workers send their requests through the
//! same entry: the directory gives its node no shortcut.
//!
//! Rules (docs/protocol.md has the argument for each):
//! - nobody holds it: grant from the home's copy (the home's copy is current);
//! - shared, shared wanted: grant from the home's copy, add the requester;
//! - shared, exclusive wanted: the requester becomes the exclusive holder; it gets the page from
//!   the home (or keeps its own, an upgrade) and must invalidate every other sharer;
//! - exclusive at node O: the requester is pointed at O (O hands the page over and drops it); a
//!   shared requester becomes the only sharer and O also copies the page back home;
//! - shared, shared wanted, and the home's copy is not in memory (the caller says which sharers
//!   may serve instead, [`DirEntry::request_forwarding`]): the requester is pointed at a sharer S,
//!   which sends it a copy and **keeps its own**; the home then waits for S's copy-back (a
//!   notice without data) as after an exclusive-to-shared handover, so S stays a holder that
//!   cannot leave (its eviction notice is declined) until it has served. No NVMe read while
//!   the page is in some node's DRAM;
//! - nobody holds it and the home's provider evicts it: the home may offer it to a node that
//!   never asked ([`DirEntry::offer`]); requests wait for that node's answer, after which it is
//!   the only sharer or nobody holds the page;
//! - while a copy-back is outstanding the home's copy is stale: every request for the page
//!   waits ([`DirDecision::Defer`]) until it arrives (eviction notices are still answered: the
//!   node owing the copy-back may be waiting for that answer);
//! - an eviction notice is accepted only from a current holder; anyone else has been named as
//!   a source or is being invalidated, and must keep the page until that message reaches it
//!   (**owner stability**).
//!
//! The conflict epoch increases whenever a request names other nodes (a source to fetch from
//! or sharers to invalidate); each grant carries it, so every message about a possession says
//! which possession it is about, and a stale one is recognised (see [`crate::coherence::possession`]).

use crate::coherence::protocol::{
    bit, members, violation, Epoch, Mode, Node, NodeSet, ProtocolError,
};

/// The epoch after `e`. 64-bit epochs cannot wrap (see [`Epoch`]); the check makes the
/// argument an assertion.
fn next_epoch(e: Epoch) -> Epoch {
    e.checked_add(1)
        .expect("a page's conflict epoch ran out of 64 bits")
}

/// Who holds a page, as its home sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Holders {
    /// No node holds a copy; the home's copy is current.
    None,
    /// These nodes hold node-shared copies (never empty).
    Shared(NodeSet),
    /// This node holds (or is about to receive) the page node-exclusive.
    Exclusive(Node),
}

/// The home's metadata of one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DirEntry {
    pub holders: Holders,
    /// Conflict epoch: bumped whenever a request names other nodes.
    pub epoch: Epoch,
    /// The exclusive holder that must copy the page back home (after a shared request took it).
    pub awaiting_copy_back: Option<Node>,
    /// One pool: the node the home offered the page to (it evicted the page and nobody held
    /// it); requests wait for that node's answer.
    pub offered: Option<Node>,
    /// The reader of the forwarded read whose serving sharer's copy-back is due.
    pub forwarded_to: Option<Node>,
    /// Sharers that may hold no copy: readers whose serving sharer died before its copy-back
    /// came ([`forget_serving_sharer`](Self::forget_serving_sharer)). Never chosen to serve a
    /// forwarded read; one may ask for the page again without a copy.
    pub unsure: NodeSet,
    /// The node the last grant named as its source (an exclusive holder): it may still hold
    /// the page if the requester died before asking it ([`reclaim`](Self::reclaim)). Kept
    /// while the requester holds the page exclusively, or while the source's copy-back for a
    /// shared requester is due.
    pub handed_by: Option<Node>,
    /// The dead requester whose grant's page the home reclaims from its source (the copy-back
    /// due then comes from that source, or its `Gone`).
    pub reclaiming: Option<Node>,
    /// A chain of two hand-overs: the source of the grant before the last (`O`) and that
    /// grant's epoch, kept while the last grant's source (`handed_by`, `G`) got the page
    /// through it and the last requester holds the page exclusively. If `G` dies, it may have
    /// died before taking the page from `O`: then `O` still holds it and the last requester
    /// never got it ([`reclaim`](Self::reclaim) asks `O`).
    pub chain: Option<(Node, Epoch)>,
    /// The live exclusive holder whose grant waits on a reclaim through a chain (its page was
    /// to come from the dead `reclaiming`): nobody holds the page meanwhile.
    pub reclaiming_for: Option<Node>,
    /// The sharers an exclusive grant told its holder to invalidate, kept through the
    /// hand-overs that follow (a holder that dies before completing its grant leaves them
    /// undone for every later one) until nobody holds the page or a copy-back proves the
    /// holder completed. If the holders die, they may still hold copies that this entry no
    /// longer names: a page brought back lists them ([`brought_back`](Self::brought_back)).
    pub invalidating: NodeSet,
    /// Nodes listed by [`brought_back`](Self::brought_back) that have not answered the home's
    /// `Found` yet: requests wait until they have (so that each knows it may be listed
    /// without a copy before an invalidation reaches it).
    pub settling: NodeSet,
    /// Hand-overs between the exclusive holder (or, while a copy-back is due from an old
    /// exclusive holder, that node) and the last node known to have had the page (its
    /// grant came from the home, or it kept its own copy; or a `Gone` proved it took the
    /// page): 0 for a holder granted from the home, 1 when `handed_by` surely had the page,
    /// 2 when the chain's first source surely had it; [`MANY_HOPS`] for more, or not known.
    /// [`died_with`](Self::died_with) and [`brought_back`](Self::brought_back) rely on it.
    pub hops: u8,
}

/// [`DirEntry::hops`] of a holder that may be more than two hand-overs from the last node
/// known to have had the page (kept small: it is part of the model check's state).
pub const MANY_HOPS: u8 = 3;

/// What a live node holds of a page lost with a dead node, as it tells the page's home
/// when asked (`Control::Ask`, the census of [`DirEntry::counted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Holds {
    /// No copy, and nothing about the page under way here.
    Nothing,
    /// A node-shared copy, idle.
    Shared,
    /// A node-exclusive copy, idle.
    Exclusive,
    /// Something about the page is under way here (a request, a hand-over, a message queued
    /// or deferred): the census cannot count this node now.
    Busy,
}

/// What [`DirEntry::counted`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    /// The page's entry from now on.
    pub entry: DirEntry,
    /// No live node holds the page exclusively: its newest version is in the logs (merge
    /// them over the store's copy, as for a page [`brought_back`](DirEntry::brought_back)).
    /// Otherwise the exclusive holder's copy is the newest.
    pub from_logs: bool,
}

/// What the home does with a possession request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirDecision {
    /// The home's copy is stale until a copy-back arrives: keep the request and retry then.
    Defer,
    /// The exclusive holder asks again without a copy: the node its grant named as source died
    /// before handing the page over, and no chain leads back to a live source. The page died
    /// with `with` (the caller marks it lost and refuses the request).
    Lost { with: Node },
    /// Reply with this grant. `from_home`: push the home's copy of the page first.
    /// `source_keeps`: `source` is a sharer that keeps its copy (a forwarded read).
    Grant {
        mode: Mode,
        epoch: Epoch,
        from_home: bool,
        source: Option<Node>,
        invalidate: NodeSet,
        source_keeps: bool,
    },
}

/// A page the home takes back from the source of a grant whose requester died
/// ([`DirEntry::reclaim`]): send `source` a `Reclaim { epoch }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reclaim {
    pub source: Node,
    /// The dead requester's grant.
    pub epoch: Epoch,
}

/// What the home does with an eviction notice (decided at once, never deferred: the node that
/// must copy a page back may itself be waiting for this answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictDecision {
    /// The node may drop its copy; `store`: the notice carried a dirty page, which becomes the
    /// home's copy (and is written to the home's store).
    Accept { store: bool },
    /// Keep the copy: a successor was pointed at this node, or an invalidation is on its way.
    Decline,
}

impl Default for DirEntry {
    fn default() -> Self {
        DirEntry::new()
    }
}

impl DirDecision {
    /// The nodes a grant needs to take part: the source that hands the page over and the
    /// sharers that must drop their copies. A home refuses a request whose grant needs a node
    /// it knows is dead, leaving its entry as it was (the engine's `home_request`; the model
    /// check uses the same rule).
    pub fn needs(&self) -> impl Iterator<Item = Node> {
        let (source, invalidate) = match *self {
            DirDecision::Grant {
                source, invalidate, ..
            } => (source, invalidate),
            DirDecision::Defer | DirDecision::Lost { .. } => (None, 0),
        };
        source.into_iter().chain(members(invalidate))
    }
}

impl DirEntry {
    /// The entry's invariants (the model checks them after every step; the engine in debug
    /// builds after every message): a shared holder set is never empty, and while a copy-back
    /// is outstanding nobody holds the page node-exclusive (exclusive requests wait for it).
    pub fn check(&self) -> Result<(), ProtocolError> {
        match (self.holders, self.awaiting_copy_back) {
            (Holders::Shared(0), _) => violation("an empty shared holder set"),
            (Holders::Exclusive(n), Some(o)) => violation(format!(
                "node {n} holds the page exclusively while a copy-back from node {o} is due"
            )),
            _ if self.offered.is_some()
                && (self.holders != Holders::None || self.awaiting_copy_back.is_some()) =>
            {
                violation(format!(
                    "the page is offered to node {:?} while held ({:?}, copy-back from {:?})",
                    self.offered, self.holders, self.awaiting_copy_back
                ))
            }
            _ if self.forwarded_to.is_some() != self.awaits_serving() => violation(format!(
                "forwarded to {:?} while a copy-back is due from {:?} ({:?})",
                self.forwarded_to, self.awaiting_copy_back, self.holders
            )),
            (Holders::Shared(s), _) if self.unsure & !s != 0 => violation(format!(
                "unsure sharers {:b} are not all sharers {s:b}",
                self.unsure
            )),
            _ if self.reclaiming.is_some() && self.awaiting_copy_back.is_none() => violation(
                format!("reclaiming for {:?} with no copy-back due", self.reclaiming),
            ),
            _ if self.chain.is_some()
                && (self.handed_by.is_none() || !matches!(self.holders, Holders::Exclusive(_))) =>
            {
                violation(format!(
                    "a chain {:?} without a hand-over ({:?}, handed by {:?})",
                    self.chain, self.holders, self.handed_by
                ))
            }
            _ if self.reclaiming_for.is_some()
                && (self.reclaiming.is_none() || self.holders != Holders::None) =>
            {
                violation(format!(
                    "reclaiming through a chain for {:?} while {:?} (reclaiming {:?})",
                    self.reclaiming_for, self.holders, self.reclaiming
                ))
            }
            (Holders::Shared(_) | Holders::None, due)
                if self.handed_by.is_some_and(|o| due != Some(o)) =>
            {
                violation(format!(
                    "handed by {:?} while {:?}, copy-back from {due:?}",
                    self.handed_by, self.holders
                ))
            }
            (Holders::None | Holders::Exclusive(_), _) if self.unsure != 0 => violation(format!(
                "unsure sharers {:b} while {:?}",
                self.unsure, self.holders
            )),
            _ => Ok(()),
        }
    }

    /// Whether the copy-back due is from a sharer serving a forwarded read.
    fn awaits_serving(&self) -> bool {
        self.awaiting_copy_back
            .is_some_and(|n| self.awaits_serving_sharer(n))
    }

    /// A page nobody caches (just allocated or only on the home's store).
    pub const fn new() -> DirEntry {
        DirEntry {
            holders: Holders::None,
            epoch: 0,
            awaiting_copy_back: None,
            offered: None,
            forwarded_to: None,
            unsure: 0,
            handed_by: None,
            reclaiming: None,
            chain: None,
            reclaiming_for: None,
            invalidating: 0,
            settling: 0,
            hops: 0,
        }
    }

    /// A possession request from `from`, who wants `want`; `have` = it holds a valid copy.
    /// The home's copy is at hand (in memory, or read from the store): never forwarded.
    pub fn request(
        &mut self,
        from: Node,
        want: Mode,
        have: bool,
    ) -> Result<DirDecision, ProtocolError> {
        self.request_forwarding(from, want, have, 0)
    }

    /// A request from `from` that asks again (`Msg::Request::again`): the node its last grant
    /// named as source died before handing the page over (`PageCopy::ask_again`). Returns the
    /// decision when it differs from that for any request ([`request`](Self::request) then):
    /// - `from` is still the exclusive holder: through a chain, the reclaim from the node
    ///   before its dead source decides, so the request waits (`reclaim`); without one, the
    ///   page died with that source ([`DirDecision::Lost`]);
    /// - the home already pointed the next holder at `from`, which never got the page: that
    ///   holder never will either, and the page died with `from`'s source (the chain's node).
    ///
    /// (The holder may ask for shared possession the second time: another of its workers
    /// asks after the first request did not reach the home.)
    pub fn asked_again(&self, from: Node, want: Mode) -> Option<DirDecision> {
        if self.awaiting_copy_back.is_some() || self.offered.is_some() || self.settling != 0 {
            return None;
        }
        match self.holders {
            Holders::Exclusive(x) if x == from => {
                let g = self.handed_by?;
                Some(match self.chain {
                    Some(_) => DirDecision::Defer,
                    None => DirDecision::Lost { with: g },
                })
            }
            Holders::Exclusive(_) if self.handed_by == Some(from) && want == Mode::Exclusive => {
                let (g, _) = self.chain?;
                Some(DirDecision::Lost { with: g })
            }
            _ => None,
        }
    }

    /// As [`request`](Self::request), but a shared request may be forwarded to a sharer in
    /// `may_serve` instead of being granted from the home's copy. The home passes the live
    /// nodes other than itself when its copy of the page is not in memory (the grant would
    /// read the store), and 0 when it is. The lowest eligible sharer serves.
    pub fn request_forwarding(
        &mut self,
        from: Node,
        want: Mode,
        have: bool,
        may_serve: NodeSet,
    ) -> Result<DirDecision, ProtocolError> {
        if self.awaiting_copy_back.is_some() || self.offered.is_some() || self.settling != 0 {
            return Ok(DirDecision::Defer);
        }
        // every grant changes the holders: only a hand-over from an exclusive holder sets them
        let (before, before_epoch) = (self.handed_by, self.epoch);
        self.handed_by = None;
        self.chain = None;
        let grant = |mode, epoch, from_home, source, invalidate| DirDecision::Grant {
            mode,
            epoch,
            from_home,
            source,
            invalidate,
            source_keeps: false,
        };
        match (self.holders, want) {
            (Holders::None, _) => {
                // (nobody held it: every earlier holder completed its grant)
                self.invalidating = 0;
                self.hops = 0;
                self.holders = match want {
                    Mode::Shared => Holders::Shared(bit(from)),
                    Mode::Exclusive => Holders::Exclusive(from),
                };
                Ok(grant(want, self.epoch, true, None, 0))
            }
            (Holders::Shared(s), Mode::Shared) => {
                if s & bit(from) != 0 {
                    if have || self.unsure & bit(from) == 0 {
                        return violation(format!(
                            "node {from} asks for shared possession it already holds"
                        ));
                    }
                    // the sharer its forwarded read was pointed at died before serving it
                    // (`PageCopy::ask_again`): served as any new reader
                    self.unsure &= !bit(from);
                }
                let s = s & !bit(from);
                let eligible = s & may_serve & !self.unsure;
                if let Some(src) = members(eligible).next() {
                    // forwarded to a sharer: it names another node, so the epoch moves; the
                    // sharer owes a copy-back (its notice that it served) before anything else
                    self.epoch = next_epoch(self.epoch);
                    self.holders = Holders::Shared(s | bit(from));
                    self.awaiting_copy_back = Some(src);
                    self.forwarded_to = Some(from);
                    return Ok(DirDecision::Grant {
                        mode: Mode::Shared,
                        epoch: self.epoch,
                        from_home: false,
                        source: Some(src),
                        invalidate: 0,
                        source_keeps: true,
                    });
                }
                self.holders = Holders::Shared(s | bit(from));
                Ok(grant(Mode::Shared, self.epoch, true, None, 0))
            }
            (Holders::Shared(s), Mode::Exclusive) => {
                // a sharer that may hold nothing (see `unsure`) and says so asks as a
                // non-sharer
                let member = s & bit(from) != 0 && (have || self.unsure & bit(from) == 0);
                if member && !have {
                    return violation(format!("node {from} is a sharer but says it holds no copy"));
                }
                let others = s & !bit(from);
                if others != 0 {
                    self.epoch = next_epoch(self.epoch);
                }
                self.holders = Holders::Exclusive(from);
                self.unsure = 0;
                self.invalidating = others;
                self.hops = 0;
                Ok(grant(Mode::Exclusive, self.epoch, !member, None, others))
            }
            (Holders::Exclusive(o), _) if o == from => {
                violation(format!("node {from} asks for a page it holds exclusively"))
            }
            (Holders::Exclusive(o), _) => {
                self.handed_by = Some(o);
                self.epoch = next_epoch(self.epoch);
                match want {
                    Mode::Shared => {
                        self.holders = Holders::Shared(bit(from));
                        // (`hops` stays `o`'s: it hands the page over and copies back)
                        self.awaiting_copy_back = Some(o);
                    }
                    Mode::Exclusive => {
                        self.holders = Holders::Exclusive(from);
                        // `o` got the page from `before` (if the grant came from one)
                        self.chain = before.filter(|&b| b != from).map(|b| (b, before_epoch));
                        self.hops = (self.hops + 1).min(MANY_HOPS);
                    }
                }
                Ok(grant(want, self.epoch, false, Some(o), 0))
            }
        }
    }

    /// An eviction notice from `from` for its possession of `epoch`; `dirty` = it carries the
    /// page because it is newer than the home's copy.
    pub fn evict(
        &mut self,
        from: Node,
        epoch: Epoch,
        dirty: bool,
    ) -> Result<EvictDecision, ProtocolError> {
        if epoch > self.epoch {
            return violation(format!(
                "node {from} evicts a possession of epoch {epoch}, newer than the directory's {}",
                self.epoch
            ));
        }
        if self.offered == Some(from) {
            // it accepted the offer and evicts already, and its notice overtook its answer:
            // it keeps the copy, and becomes a holder when the answer arrives
            return Ok(EvictDecision::Decline);
        }
        if self.awaiting_copy_back == Some(from) {
            // a sharer serving a forwarded read (or an old exclusive holder that must copy
            // back, which is no holder any more): a successor's `Transfer` is on its way to it
            return Ok(EvictDecision::Decline);
        }
        match self.holders {
            Holders::Exclusive(o) if o == from => {
                self.holders = Holders::None;
                self.handed_by = None;
                self.chain = None;
                self.invalidating = 0;
                self.hops = 0;
                Ok(EvictDecision::Accept { store: dirty })
            }
            Holders::Shared(s) if s & bit(from) != 0 => {
                if dirty {
                    return violation(format!(
                        "node {from} holds a shared copy that it says is dirty"
                    ));
                }
                self.unsure &= !bit(from);
                let rest = s & !bit(from);
                self.holders = if rest == 0 {
                    Holders::None
                } else {
                    Holders::Shared(rest)
                };
                Ok(EvictDecision::Accept { store: false })
            }
            _ => Ok(EvictDecision::Decline),
        }
    }

    /// One pool: the home's provider evicts the page and would rather hand it to node `to`
    /// than leave it only on NVMe. Only a page nobody holds, with nothing outstanding, is
    /// offered (the caller sends it clean: the store holds the same image, so the home may
    /// drop its frame at once). Returns the epoch of the offered possession, or `None` when
    /// the page may not be offered now. Requests wait until `to` answers.
    pub fn offer(&mut self, to: Node) -> Option<Epoch> {
        if self.holders != Holders::None
            || self.awaiting_copy_back.is_some()
            || self.offered.is_some()
        {
            return None;
        }
        // a new possession: older invalidations reaching `to` must be seen as stale
        self.epoch = next_epoch(self.epoch);
        self.offered = Some(to);
        Some(self.epoch)
    }

    /// `from` answered the offer (`accepted`: it holds the page node-shared now). Also how the
    /// home ends an offer that cannot be answered (the send failed, or `from` died): as
    /// declined, the store holds the page.
    pub fn offer_reply(&mut self, from: Node, accepted: bool) -> Result<(), ProtocolError> {
        if self.offered != Some(from) {
            return violation(format!(
                "an answer to an offer from node {from} (offered to {:?})",
                self.offered
            ));
        }
        if self.holders != Holders::None {
            return violation(format!(
                "node {from} answered an offer while the page is held ({:?}): requests must wait",
                self.holders
            ));
        }
        self.offered = None;
        if accepted {
            self.holders = Holders::Shared(bit(from));
        }
        Ok(())
    }

    /// Whether the entry still counts on node `n`: as a holder (or a sharer that may hold
    /// nothing), for a copy-back, an offer's answer or a forwarded read, or in a reclaim. A
    /// home takes a restarted node back only once no entry counts on its old incarnation
    /// (`Coherence::take_back`). The source of the last grant (`handed_by`) and the first
    /// source of a chain (`chain`) are not counted: see [`forget_source`](Self::forget_source).
    pub fn counts_on(&self, n: Node) -> bool {
        let holds = match self.holders {
            Holders::None => false,
            Holders::Shared(s) => s & bit(n) != 0,
            Holders::Exclusive(x) => x == n,
        };
        holds
            || (self.unsure | self.settling) & bit(n) != 0
            || [
                self.awaiting_copy_back,
                self.offered,
                self.forwarded_to,
                self.reclaiming,
                self.reclaiming_for,
            ]
            .contains(&Some(n))
    }

    /// The entry of a page lost with node `dead`, brought back from the logs by its home
    /// `home` when `dead` restarted (`Coherence::bring_back`), among `nodes` nodes of which
    /// `live` are not known dead there: nothing is pending, the epoch
    /// stays, and nobody holds the page but the sharers `dead` held it by a grant to
    /// invalidate (`invalidating`, the home aside: its copy ended with the loss), and the
    /// shared reader it was handing the page to when it died (its copy-back due). They may
    /// still hold copies (it may have died before it invalidated them), so they stay listed,
    /// unsure, and requests wait until each answered the home's `Found` (`settling`): one
    /// that holds nothing then answers invalidations at once (`PageCopy::maybe_listed`).
    /// `None` when it cannot be: the entry names another node
    /// ([`names_only`](Self::names_only)), or a live node may still hold the page as the
    /// source of the last grant or of a chain (`handed_by`, `chain`: call
    /// [`forget_source`](Self::forget_source) for `dead` first). Found by the model check
    /// with restarts.
    pub fn brought_back(
        &self,
        dead: Node,
        home: Node,
        nodes: Node,
        live: NodeSet,
    ) -> Option<DirEntry> {
        // An exclusive holder that died while it handed the page to a shared reader (its
        // copy-back due), and that surely had the page (`hops` 0: else it may have been
        // waiting for it from a live holder, found by the model check): the reader holds the
        // page as the holder left it (its log has that version: the page left only once it
        // was durable) or nothing, like a sharer the holder was to invalidate.
        let e = match (self.holders, self.awaiting_copy_back) {
            (Holders::Shared(s), Some(o)) if o == dead && s & bit(dead) == 0 && self.hops == 0 => {
                DirEntry {
                    holders: Holders::Exclusive(dead),
                    awaiting_copy_back: None,
                    invalidating: self.invalidating | s,
                    ..*self
                }
            }
            _ => *self,
        };
        if !e.names_only(dead, nodes) || e.handed_by.is_some() || e.chain.is_some() {
            return None;
        }
        let mut d = DirEntry::new();
        d.epoch = e.epoch;
        if e.holders == Holders::Exclusive(dead) {
            let listed = e.invalidating & live & !bit(dead) & !bit(home);
            if listed != 0 {
                d.holders = Holders::Shared(listed);
                d.unsure = listed;
                d.settling = listed;
            }
        }
        Some(d)
    }

    /// The entry of a page lost with a dead node that [`brought_back`](Self::brought_back)
    /// cannot bring back (the entry still names live nodes, or a chain), once every live
    /// node, the home's own copy among them, has said what it holds of the page (`answers`:
    /// the census). Every message the home sent about the page before it asked is applied at
    /// each node before it answers, and so is every hand-over a grant started (its requester
    /// is busy until it completes), so idle answers say where the page is:
    /// - one node holds it exclusively and nobody else holds it: that copy is the newest (the
    ///   dead node was granted the page after it, if at all, and never got it);
    /// - otherwise the sharers' copies, if any, are the newest version too (a holder that
    ///   was to invalidate them writes only after they acknowledged), and so is the logs'
    ///   merge: the page is brought back from the logs, shared by them.
    ///
    /// `None` when a node is busy with the page, or the answers disagree (two exclusive
    /// holders, an exclusive holder beside sharers): the page stays lost. The epoch stays.
    pub fn counted(&self, answers: &[(Node, Holds)]) -> Option<Counted> {
        let mut exclusive = None;
        let mut shared: NodeSet = 0;
        for &(n, h) in answers {
            match h {
                Holds::Nothing => {}
                Holds::Shared => shared |= bit(n),
                Holds::Exclusive if exclusive.is_none() => exclusive = Some(n),
                Holds::Exclusive | Holds::Busy => return None,
            }
        }
        let mut entry = DirEntry::new();
        entry.epoch = self.epoch;
        match (exclusive, shared) {
            (Some(_), s) if s != 0 => None,
            (Some(x), _) => {
                entry.holders = Holders::Exclusive(x);
                Some(Counted {
                    entry,
                    from_logs: false,
                })
            }
            (None, s) => {
                if s != 0 {
                    entry.holders = Holders::Shared(s);
                }
                Some(Counted {
                    entry,
                    from_logs: true,
                })
            }
        }
    }

    /// `from` answered the home's `Found` (see `settling`). Returns whether requests may go
    /// on now (the last one answered).
    pub fn settled(&mut self, from: Node) -> bool {
        let was = self.settling;
        self.settling &= !bit(from);
        was != 0 && self.settling == 0
    }

    /// Nodes in `gone` will never answer `Found` (dead): as if they had. Returns whether
    /// requests may go on now.
    pub fn forget_settling(&mut self, gone: NodeSet) -> bool {
        let was = self.settling;
        self.settling &= !gone;
        was != 0 && self.settling == 0
    }

    /// The page died with `g`: node `lost` lost its copy with `g` before it got the page
    /// (its report, its request asking again, or the home's own loss), and no live node holds
    /// the page. Either `lost` is the exclusive holder, named by a grant whose source was `g`
    /// (no chain), or the holder was pointed at `lost`, which was to get the page from the
    /// chain's first source `g` (`handed_by` is `lost`, `chain` starts at `g`), and `g`
    /// surely had the page (`hops` is 2: else `g` may have been waiting for it from a live
    /// node that still holds it, found by the model check): the holder waits for `lost`'s
    /// hand-over, which never comes. The entry then says `g` holds it,
    /// nothing else, so that its home brings it back when `g` restarts
    /// ([`brought_back`](Self::brought_back)); without the chain case, once `g` restarted
    /// and was forgotten as the chain's source the entry named the live holder and `lost`,
    /// and the page stayed lost (3 of 50 kills of the process test). Anything else is left as
    /// it is (a live node may still hold the page). Returns whether it applied.
    pub fn died_with(&mut self, lost: Node, g: Node) -> bool {
        let holder = self.holders == Holders::Exclusive(lost)
            && self.handed_by == Some(g)
            && self.chain.is_none();
        let middle = matches!(self.holders, Holders::Exclusive(_))
            && self.handed_by == Some(lost)
            && self.chain.is_some_and(|(o, _)| o == g)
            && self.hops == 2;
        if !holder && !middle {
            return false;
        }
        let (epoch, invalidating) = (self.epoch, self.invalidating);
        *self = DirEntry::new();
        self.epoch = epoch;
        self.invalidating = invalidating;
        self.holders = Holders::Exclusive(g);
        true
    }

    /// Whether the entry counts on no node but `n` (`counts_on`), among `nodes` nodes.
    pub fn names_only(&self, n: Node, nodes: Node) -> bool {
        (0..nodes).all(|m| m == n || !self.counts_on(m))
    }

    /// Forget that node `n` was the source of the last grant, or the first source of a
    /// chain: its old incarnation is gone for good (a restarted node took its place, and it
    /// holds nothing), so there is nothing to reclaim from it if the holder (or the chain's
    /// middle node) dies: the page then dies with that node. A chain whose first source died
    /// stays until the page's next grant otherwise (a holder that keeps the page keeps it),
    /// and would keep the restarted node waiting.
    pub fn forget_source(&mut self, n: Node) {
        if self.handed_by == Some(n) {
            // (a chain hangs on the last grant's source: `check`)
            self.handed_by = None;
            self.chain = None;
            // whether the holder got the page from it is not known
            if matches!(self.holders, Holders::Exclusive(_)) {
                self.hops = MANY_HOPS;
            }
        }
        if self.chain.is_some_and(|(o, _)| o == n) {
            self.chain = None;
        }
        // nor a copy the holder was to invalidate there (found by the model check)
        self.invalidating &= !bit(n);
    }

    /// Nodes in `gone` can no longer use their copies (dead, and fenced: see
    /// docs/protocol.md, "Fencing"): each that is a sharer leaves the shared holder set as by
    /// a clean eviction (a shared copy is never newer than the home's). Never an exclusive
    /// holder (its copy may be newer than any other), and nobody while a copy-back is due:
    /// the grant that made it due may have gone to a node in `gone`, whose source then waits
    /// for a hand-over request that never comes (docs/protocol.md, "What deaths still
    /// cost"); the entry keeps naming the dead node, so requests fail instead of waiting
    /// behind that copy-back for ever. Returns whether anyone left.
    pub fn forget_sharers(&mut self, gone: NodeSet) -> bool {
        let Holders::Shared(s) = self.holders else {
            return false;
        };
        if self.awaiting_copy_back.is_some() {
            return false;
        }
        let rest = s & !gone;
        if rest == s {
            return false;
        }
        self.unsure &= rest;
        self.holders = if rest == 0 {
            Holders::None
        } else {
            Holders::Shared(rest)
        };
        true
    }

    /// The sharer a forwarded read was pointed at is in `gone` (dead, fenced, and every
    /// message it sent handled) and its copy-back never came: its copy-back carried no data
    /// (a sharer's copy equals the home's), so the home stops waiting for it and forgets it
    /// as a sharer. The reader it was to serve stays a sharer and asks again
    /// (`PageCopy::ask_again`) unless its page arrived. Returns whether anything changed.
    pub fn forget_serving_sharer(&mut self, gone: NodeSet) -> bool {
        match (self.awaiting_copy_back, self.holders) {
            (Some(x), Holders::Shared(s)) if gone & bit(x) != 0 && s & bit(x) != 0 => {
                self.awaiting_copy_back = None;
                // the reader stays a sharer (the page may have reached it before its server
                // died), but one that may hold nothing
                self.unsure |= self.forwarded_to.take().map_or(0, bit);
                self.forget_sharers(gone);
                true
            }
            _ => false,
        }
    }

    /// At the home, about its own copy: its forwarded read will never be served (the page was
    /// lost in flight to it, or its serving sharer died), though the entry may list it as a
    /// sharer: it may hold nothing, and asks again (`PageCopy::ask_again`).
    pub fn own_read_lost(&mut self, me: Node) {
        if matches!(self.holders, Holders::Shared(s) if s & bit(me) != 0) {
            self.unsure |= bit(me);
        }
    }

    /// Whether the copy-back awaited is from `n` serving a forwarded read (it is on the list
    /// of sharers: an exclusive holder that hands a shared reader the page is not).
    pub fn awaits_serving_sharer(&self, n: Node) -> bool {
        self.awaiting_copy_back == Some(n)
            && matches!(self.holders, Holders::Shared(s) if s & bit(n) != 0)
    }

    /// The requester of the last grant, in `gone` (dead, fenced, every message it sent handled
    /// here), may have died before asking that grant's source for the page, which the source
    /// then still holds: the home reclaims it. For an exclusive holder in `gone` whose grant
    /// named a live source, and for a shared reader in `gone` whose grant's source (an old
    /// exclusive holder) still owes its copy-back: nobody holds the page any more (a dead
    /// reader is forgotten once the copy-back came) and the copy-back is due from the
    /// source, which gets a `Reclaim`. Returns that source and the grant's epoch.
    ///
    /// Through a chain (`chain`: the dead node `g` that was to hand the page to the live
    /// exclusive holder `x` had been granted it from `o`): if `o` lives, it is asked for the
    /// page of `g`'s grant. Nobody holds the page meanwhile (`reclaiming_for` is `x`): a
    /// `CopyBack` means `g` never took the page, so `x` never got it and asks again
    /// ([`copy_back`](Self::copy_back)); `Gone` means `g` had it and `x` may have it too
    /// ([`gone`](Self::gone)). If `o` or `x` is in `gone` too, the chain is dropped.
    pub fn reclaim(&mut self, gone: NodeSet) -> Option<Reclaim> {
        if self.reclaiming.is_some() || self.offered.is_some() {
            return None;
        }
        if let (Some(g), Some((o, epoch)), Holders::Exclusive(x)) =
            (self.handed_by, self.chain, self.holders)
        {
            if gone & bit(g) != 0 {
                self.chain = None;
                if gone & (bit(o) | bit(x)) != 0 {
                    return None;
                }
                self.holders = Holders::None;
                self.awaiting_copy_back = Some(o);
                self.handed_by = None;
                self.reclaiming = Some(g);
                self.reclaiming_for = Some(x);
                self.hops = 0;
                return Some(Reclaim { source: o, epoch });
            }
        }
        let o = self.handed_by?;
        if gone & bit(o) != 0 {
            return None;
        }
        let g = match (self.holders, self.awaiting_copy_back) {
            (Holders::Exclusive(g), None) if gone & bit(g) != 0 => {
                self.holders = Holders::None;
                self.awaiting_copy_back = Some(o);
                g
            }
            (Holders::Shared(s), Some(due)) if due == o && s & !gone == 0 => members(s).next()?,
            _ => return None,
        };
        self.handed_by = None;
        self.chain = None;
        self.hops = 0;
        self.reclaiming = Some(g);
        Some(Reclaim {
            source: o,
            epoch: self.epoch,
        })
    }

    /// `from` answered a `Reclaim` with `Gone`: it had handed the page over to the requester
    /// that died, with which the page's newest state died too. Returns that requester (the
    /// caller marks the page lost with it); `None` for an answer no reclaim waits for.
    ///
    /// Through a chain, `None` too: the dead node had taken the page and may have handed it
    /// on to the live holder, which holds the page exclusively again (with the dead node as
    /// the source of its grant: if it asks again without a copy, the page died with that node,
    /// [`DirDecision::Lost`]).
    pub fn gone(&mut self, from: Node) -> Option<Node> {
        if self.awaiting_copy_back != Some(from) {
            return None;
        }
        let g = self.reclaiming.take()?;
        self.awaiting_copy_back = None;
        if let Some(x) = self.reclaiming_for.take() {
            self.holders = Holders::Exclusive(x);
            self.handed_by = Some(g);
            // (`g` took the page: the `Gone` says so)
            self.hops = 1;
            return None;
        }
        if self.holders == Holders::None {
            self.holders = Holders::Exclusive(g);
        }
        Some(g)
    }

    /// The copy-back from `from` arrived (the caller stores its data, if any, as the home's copy).
    pub fn copy_back(&mut self, from: Node) -> Result<(), ProtocolError> {
        if self.awaiting_copy_back != Some(from) {
            return violation(format!(
                "unexpected copy-back from node {from} (awaiting {:?})",
                self.awaiting_copy_back
            ));
        }
        // the holder completed its grant (its invalidations done)
        self.invalidating = 0;
        self.awaiting_copy_back = None;
        self.forwarded_to = None;
        self.handed_by = None;
        self.chain = None;
        self.hops = 0;
        // through a chain: the live holder never got the page (it asks again)
        self.reclaiming_for = None;
        if let Some(g) = self.reclaiming.take() {
            // a reclaimed page is back: the dead reader it was for (fenced) is no sharer
            self.forget_sharers(bit(g));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(d: DirDecision) -> (Mode, Epoch, bool, Option<Node>, NodeSet) {
        match d {
            DirDecision::Grant {
                mode,
                epoch,
                from_home,
                source,
                invalidate,
                ..
            } => (mode, epoch, from_home, source, invalidate),
            d => panic!("not a grant: {d:?}"),
        }
    }

    #[test]
    fn a_grant_needs_its_source_and_the_sharers_it_invalidates() {
        let mut d = DirEntry::new();
        assert_eq!(
            d.request(1, Mode::Shared, false).unwrap().needs().count(),
            0
        );
        d.request(2, Mode::Shared, false).unwrap();
        let inv = d.request(3, Mode::Exclusive, false).unwrap();
        assert_eq!(inv.needs().collect::<Vec<_>>(), vec![1, 2]);
        let handover = d.request(0, Mode::Exclusive, false).unwrap();
        assert_eq!(handover.needs().collect::<Vec<_>>(), vec![3]);
        assert_eq!(DirDecision::Defer.needs().count(), 0);
    }

    #[test]
    fn a_dead_serving_sharer_is_forgotten_and_its_reader_may_ask_again_but_never_serves() {
        let mut d = DirEntry::new();
        d.request(2, Mode::Shared, false).unwrap();
        let fwd = d
            .request_forwarding(1, Mode::Shared, false, 0b1110)
            .unwrap();
        assert_eq!(g(fwd).3, Some(2), "forwarded to sharer 2");
        assert_eq!((d.awaiting_copy_back, d.forwarded_to), (Some(2), Some(1)));
        assert!(d.awaits_serving_sharer(2));
        assert!(!d.forget_serving_sharer(0b1000), "node 3 serves nothing");
        assert!(d.forget_serving_sharer(0b100));
        assert_eq!(
            (d.holders, d.awaiting_copy_back, d.forwarded_to, d.unsure),
            (Holders::Shared(0b10), None, None, 0b10)
        );
        d.check().unwrap();
        // node 1 may hold nothing: a read is not forwarded to it
        let r3 = d
            .request_forwarding(3, Mode::Shared, false, 0b1110)
            .unwrap();
        assert!(g(r3).2, "from the home's copy");
        // node 1 asks again without a copy; node 3, a sharer sure of its copy, may not
        assert!(d.request(1, Mode::Shared, false).is_ok());
        assert_eq!(d.unsure, 0);
        assert!(d.request(3, Mode::Shared, false).is_err());
        // an unsure sharer that asks to write without a copy is served as a non-sharer
        let mut d = DirEntry::new();
        d.request(2, Mode::Shared, false).unwrap();
        d.request_forwarding(1, Mode::Shared, false, 0b110).unwrap();
        d.forget_serving_sharer(0b100);
        assert_eq!(
            g(d.request(1, Mode::Exclusive, false).unwrap()),
            (Mode::Exclusive, 1, true, None, 0)
        );
        assert_eq!((d.holders, d.unsure), (Holders::Exclusive(1), 0));
    }

    /// A chain O -> G -> X: G (dead) was to hand X the page it was granted from O. The
    /// reclaim asks O for G's grant: a copy-back means X never got the page (it asks again and
    /// is served from the home); `Gone` gives X the page back as holder, and X asking again
    /// without a copy then means the page died with G.
    #[test]
    fn a_chain_whose_middle_node_died_is_reclaimed_from_the_node_before_it() {
        let chain = || {
            let mut d = DirEntry::new();
            d.request(1, Mode::Exclusive, false).unwrap(); // O = 1
            d.request(2, Mode::Exclusive, false).unwrap(); // G = 2, from O
            let e1 = d.epoch;
            assert_eq!(g(d.request(3, Mode::Exclusive, false).unwrap()).3, Some(2));
            assert_eq!((d.handed_by, d.chain), (Some(2), Some((1, e1))));
            d.check().unwrap();
            (d, e1)
        };
        let (mut d, e1) = chain();
        // X = 3 asks again without a copy before the home fenced G: it waits
        assert_eq!(d.asked_again(3, Mode::Exclusive), Some(DirDecision::Defer));
        let r = d.reclaim(0b100).expect("reclaimed through the chain");
        assert_eq!((r.source, r.epoch), (1, e1));
        assert_eq!(
            (
                d.holders,
                d.awaiting_copy_back,
                d.reclaiming,
                d.reclaiming_for
            ),
            (Holders::None, Some(1), Some(2), Some(3))
        );
        d.check().unwrap();
        assert_eq!(
            d.request(0, Mode::Shared, false).unwrap(),
            DirDecision::Defer
        );
        // O never handed the page over: back home, and X is served from it
        d.copy_back(1).unwrap();
        assert_eq!(
            (d.holders, d.reclaiming_for, d.chain),
            (Holders::None, None, None)
        );
        d.check().unwrap();
        assert_eq!(
            g(d.request(3, Mode::Exclusive, false).unwrap()),
            (Mode::Exclusive, d.epoch, true, None, 0)
        );
        // O had handed it to G: X holds it again; asking again without a copy, it is lost
        let (mut d, _) = chain();
        d.reclaim(0b100).unwrap();
        assert_eq!(d.gone(1), None, "X may hold the page");
        assert_eq!((d.holders, d.handed_by), (Holders::Exclusive(3), Some(2)));
        d.check().unwrap();
        assert_eq!(
            d.asked_again(3, Mode::Exclusive),
            Some(DirDecision::Lost { with: 2 })
        );
        // O dead too: no reclaim, and X asking again finds the page lost with G
        let (mut d, _) = chain();
        assert_eq!(d.reclaim(0b110), None);
        assert_eq!(d.chain, None);
        assert_eq!(
            d.asked_again(3, Mode::Exclusive),
            Some(DirDecision::Lost { with: 2 })
        );
        // a next holder pointed at X before X asked again: it would wait for X for ever
        let (mut d, _) = chain();
        d.request(0, Mode::Exclusive, false).unwrap();
        assert_eq!((d.holders, d.handed_by), (Holders::Exclusive(0), Some(3)));
        assert_eq!(
            d.asked_again(3, Mode::Exclusive),
            Some(DirDecision::Lost { with: 2 }),
            "lost with X's source, G"
        );
        // a request that does not ask again is served as any other
        assert_eq!(d.asked_again(1, Mode::Exclusive), None);
        // X itself dead (G alive): reclaimed from G as any grant whose requester died, and
        // the chain goes with it
        let (mut d, _) = chain();
        let r = d.reclaim(0b1000).expect("reclaimed from G");
        assert_eq!((r.source, d.chain, d.reclaiming), (2, None, Some(3)));
        d.check().unwrap();
        // a grant from the home (no hand-over before it) starts no chain
        let mut d = DirEntry::new();
        d.request(2, Mode::Exclusive, false).unwrap();
        d.request(3, Mode::Exclusive, false).unwrap();
        assert_eq!((d.handed_by, d.chain), (Some(2), None));
    }

    #[test]
    fn a_page_granted_to_a_requester_that_died_is_reclaimed_from_its_source() {
        let mut d = DirEntry::new();
        d.request(1, Mode::Exclusive, false).unwrap();
        assert_eq!(g(d.request(2, Mode::Exclusive, false).unwrap()).3, Some(1));
        assert_eq!(d.handed_by, Some(1));
        assert_eq!(d.reclaim(0b1000), None, "node 3 holds nothing");
        assert_eq!(d.reclaim(0b110), None, "the source died too");
        let r = d.reclaim(0b100).unwrap();
        assert_eq!((r.source, r.epoch), (1, d.epoch));
        assert_eq!(
            (d.holders, d.awaiting_copy_back, d.reclaiming),
            (Holders::None, Some(1), Some(2))
        );
        d.check().unwrap();
        assert_eq!(
            d.request(3, Mode::Shared, false).unwrap(),
            DirDecision::Defer
        );
        d.copy_back(1).unwrap();
        assert_eq!(
            (d.holders, d.reclaiming, d.handed_by),
            (Holders::None, None, None)
        );
        // the source had handed it over: the page died with the requester
        let mut d = DirEntry::new();
        d.request(1, Mode::Exclusive, false).unwrap();
        d.request(2, Mode::Exclusive, false).unwrap();
        d.reclaim(0b100).unwrap();
        assert_eq!(d.gone(3), None, "not from the source");
        assert_eq!(d.gone(1), Some(2));
        assert_eq!(
            (d.holders, d.awaiting_copy_back),
            (Holders::Exclusive(2), None)
        );
        // a shared reader that died before asking: the source's copy-back is asked for
        let mut d = DirEntry::new();
        d.request(1, Mode::Exclusive, false).unwrap();
        d.request(2, Mode::Shared, false).unwrap();
        assert_eq!(d.reclaim(0b100).unwrap().source, 1);
        d.copy_back(1).unwrap();
        assert_eq!(d.holders, Holders::None, "the dead reader is forgotten");
        // a hand-over's source is forgotten with the next grant
        let mut d = DirEntry::new();
        d.request(1, Mode::Exclusive, false).unwrap();
        d.request(2, Mode::Exclusive, false).unwrap();
        d.request(3, Mode::Exclusive, false).unwrap();
        assert_eq!(d.handed_by, Some(2));
    }

    #[test]
    fn base_case_and_sharing_come_from_home() {
        let mut d = DirEntry::new();
        assert_eq!(
            g(d.request(1, Mode::Shared, false).unwrap()),
            (Mode::Shared, 0, true, None, 0)
        );
        assert_eq!(
            g(d.request(2, Mode::Shared, false).unwrap()),
            (Mode::Shared, 0, true, None, 0)
        );
        assert_eq!(d.holders, Holders::Shared(0b110));
        assert!(d.request(2, Mode::Shared, false).is_err());
    }

    #[test]
    fn exclusive_over_sharers_invalidates_them_and_upgrades_keep_data() {
        let mut d = DirEntry::new();
        d.request(1, Mode::Shared, false).unwrap();
        d.request(2, Mode::Shared, false).unwrap();
        // upgrade by 1: keeps its copy, invalidates 2, conflict epoch bumps
        assert_eq!(
            g(d.request(1, Mode::Exclusive, true).unwrap()),
            (Mode::Exclusive, 1, false, None, 0b100)
        );
        assert_eq!(d.holders, Holders::Exclusive(1));
        // a sole sharer upgrading is no conflict
        let mut d = DirEntry::new();
        d.request(3, Mode::Shared, false).unwrap();
        assert_eq!(
            g(d.request(3, Mode::Exclusive, true).unwrap()),
            (Mode::Exclusive, 0, false, None, 0)
        );
    }

    #[test]
    fn chaining_points_each_requester_at_its_predecessor() {
        let mut d = DirEntry::new();
        d.request(0, Mode::Exclusive, false).unwrap();
        assert_eq!(g(d.request(1, Mode::Exclusive, false).unwrap()).3, Some(0));
        assert_eq!(g(d.request(2, Mode::Exclusive, false).unwrap()).3, Some(1));
        assert_eq!(d.epoch, 2);
        // 1 was named as a source: its eviction is declined (owner stability)
        assert_eq!(d.evict(1, 1, true).unwrap(), EvictDecision::Decline);
        // the current holder may evict and its dirty copy goes home
        assert_eq!(
            d.evict(2, 2, true).unwrap(),
            EvictDecision::Accept { store: true }
        );
        assert_eq!(d.holders, Holders::None);
    }

    #[test]
    fn shared_after_exclusive_waits_for_the_copy_back() {
        let mut d = DirEntry::new();
        d.request(0, Mode::Exclusive, false).unwrap();
        assert_eq!(g(d.request(1, Mode::Shared, false).unwrap()).3, Some(0));
        assert_eq!(d.awaiting_copy_back, Some(0));
        assert_eq!(
            d.request(2, Mode::Shared, false).unwrap(),
            DirDecision::Defer
        );
        // the source owing the copy-back is no holder any more: its notice is declined at once
        assert_eq!(d.evict(0, 0, true).unwrap(), EvictDecision::Decline);
        assert!(d.copy_back(2).is_err());
        d.copy_back(0).unwrap();
        assert_eq!(
            g(d.request(2, Mode::Shared, false).unwrap()),
            (Mode::Shared, 1, true, None, 0)
        );
    }

    #[test]
    fn a_shared_read_goes_to_a_sharer_when_the_home_copy_is_not_in_memory() {
        let mut d = DirEntry::new();
        d.request(2, Mode::Shared, false).unwrap();
        d.request(3, Mode::Shared, false).unwrap();
        // 2 is not allowed to serve (dead, or the home's copy is in memory for it): 3 serves
        let fwd = d
            .request_forwarding(1, Mode::Shared, false, 0b1000)
            .unwrap();
        assert_eq!(g(fwd), (Mode::Shared, 1, false, Some(3), 0));
        assert!(matches!(
            fwd,
            DirDecision::Grant {
                source_keeps: true,
                ..
            }
        ));
        assert_eq!(fwd.needs().collect::<Vec<_>>(), vec![3]);
        assert_eq!(d.holders, Holders::Shared(0b1110));
        assert_eq!(d.awaiting_copy_back, Some(3));
        // the serving sharer may not leave before it served; the others may
        assert_eq!(d.evict(3, 0, false).unwrap(), EvictDecision::Decline);
        assert_eq!(
            d.request(0, Mode::Exclusive, false).unwrap(),
            DirDecision::Defer
        );
        assert_eq!(
            d.evict(2, 0, false).unwrap(),
            EvictDecision::Accept { store: false }
        );
        d.copy_back(3).unwrap();
        assert_eq!(
            d.evict(3, 0, false).unwrap(),
            EvictDecision::Accept { store: false }
        );
        // nobody eligible: from the home's copy, as always
        assert_eq!(
            g(d.request_forwarding(0, Mode::Shared, false, 0b0001)
                .unwrap()),
            (Mode::Shared, 1, true, None, 0)
        );
        // exclusive requests are never forwarded
        let mut d = DirEntry::new();
        d.request(2, Mode::Shared, false).unwrap();
        assert_eq!(
            g(d.request_forwarding(1, Mode::Exclusive, false, u64::MAX)
                .unwrap()),
            (Mode::Exclusive, 1, true, None, 0b100)
        );
    }

    #[test]
    fn an_offered_page_waits_for_the_answer_and_then_has_one_sharer() {
        let mut d = DirEntry::new();
        assert_eq!(d.offer(2), Some(1));
        assert_eq!(d.offer(3), None, "one offer at a time");
        // requests wait; the offered node's early notice is declined
        assert_eq!(
            d.request(1, Mode::Shared, false).unwrap(),
            DirDecision::Defer
        );
        assert_eq!(d.evict(2, 1, false).unwrap(), EvictDecision::Decline);
        assert!(d.offer_reply(3, true).is_err(), "not offered to 3");
        d.offer_reply(2, true).unwrap();
        assert_eq!(d.holders, Holders::Shared(0b100));
        d.check().unwrap();
        // held pages are not offered
        assert_eq!(d.offer(1), None);
        // a declined offer leaves nobody holding it
        let mut d = DirEntry::new();
        d.offer(2).unwrap();
        d.offer_reply(2, false).unwrap();
        assert_eq!((d.holders, d.offered), (Holders::None, None));
        // the home's copy is current again: a read comes from it
        assert_eq!(
            g(d.request(1, Mode::Shared, false).unwrap()),
            (Mode::Shared, 1, true, None, 0)
        );
    }

    #[test]
    fn a_fenced_dead_sharer_leaves_as_by_a_clean_eviction_but_an_owner_stays() {
        let mut d = DirEntry::new();
        d.request(1, Mode::Shared, false).unwrap();
        d.request(2, Mode::Shared, false).unwrap();
        assert!(!d.forget_sharers(0b1000), "3 holds nothing");
        assert!(d.forget_sharers(0b100));
        assert_eq!(d.holders, Holders::Shared(0b10));
        // the next exclusive request invalidates only the live sharer
        assert_eq!(
            g(d.request(3, Mode::Exclusive, false).unwrap()),
            (Mode::Exclusive, 1, true, None, 0b10)
        );
        // an exclusive holder is never forgotten: its copy may be the only current one
        assert!(!d.forget_sharers(0b1000));
        assert_eq!(d.holders, Holders::Exclusive(3));
        // the last sharer leaving leaves nobody: the home's copy is current
        let mut d = DirEntry::new();
        d.request(1, Mode::Shared, false).unwrap();
        assert!(d.forget_sharers(0b10));
        assert_eq!(d.holders, Holders::None);
        d.check().unwrap();
        // while a forwarded read is served nobody is forgotten (its requester may be the
        // dead one: the entry must go on naming it)
        let mut d = DirEntry::new();
        d.request(2, Mode::Shared, false).unwrap();
        d.request_forwarding(1, Mode::Shared, false, 0b100).unwrap();
        assert!(!d.forget_sharers(0b110));
        d.copy_back(2).unwrap();
        assert!(d.forget_sharers(0b10));
        assert_eq!(d.holders, Holders::Shared(0b100));
        d.check().unwrap();
    }

    #[test]
    fn impossible_messages_are_violations() {
        let mut d = DirEntry::new();
        d.request(0, Mode::Exclusive, false).unwrap();
        assert!(d.request(0, Mode::Shared, false).is_err());
        assert!(d.evict(0, 9, true).is_err());
        let mut d = DirEntry::new();
        d.request(1, Mode::Shared, false).unwrap();
        assert!(d.request(1, Mode::Exclusive, false).is_err());
        assert!(d.evict(1, 0, true).is_err());
    }

    /// Rejoin: a chain whose first source died (node 2 handed the page to node 0, which
    /// handed it to node 1, the holder now) does not keep the restarted node 2 waiting, and
    /// taking it back forgets it there; forgetting the last grant's source drops its chain too
    /// (a chain hangs on it).
    #[test]
    fn a_chain_through_a_restarted_node_does_not_count_on_it_and_is_forgotten() {
        let mut d = DirEntry::new();
        d.holders = Holders::Exclusive(1);
        d.handed_by = Some(0);
        d.chain = Some((2, 5));
        d.epoch = 6;
        d.check().unwrap();
        assert!(
            !d.counts_on(2),
            "the chain's first source is not waited for"
        );
        assert!(d.counts_on(1), "the holder is");
        d.forget_source(2);
        assert_eq!((d.chain, d.handed_by), (None, Some(0)));
        d.check().unwrap();
        d.chain = Some((2, 5));
        d.forget_source(0);
        assert_eq!((d.chain, d.handed_by), (None, None));
        d.check().unwrap();
    }

    /// Rejoin: a page brought back after its exclusive holder died lists the sharers that
    /// holder's grant told it to invalidate (it may have died first), the home and dead
    /// nodes aside, and requests wait until each answered `Found`; a page whose entry still
    /// names another node, or whose last grant's source may still hold it, is not brought
    /// back; one whose holder lost it with the dead source is attributed to that source.
    #[test]
    fn a_page_brought_back_lists_the_sharers_its_dead_holder_was_to_invalidate() {
        let mut d = DirEntry::new();
        d.request(1, Mode::Shared, false).unwrap();
        d.request(2, Mode::Shared, false).unwrap();
        d.request(3, Mode::Shared, false).unwrap();
        // node 3 upgrades: 1 and 2 are to be invalidated by it; then it dies
        d.request(3, Mode::Exclusive, true).unwrap();
        assert_eq!(d.invalidating, bit(1) | bit(2));
        // node 0 is the home, node 2 is dead too
        let back = d
            .brought_back(3, 0, 4, bit(0) | bit(1))
            .expect("brought back");
        assert_eq!(back.holders, Holders::Shared(bit(1)));
        assert_eq!(
            (back.unsure, back.settling, back.epoch),
            (bit(1), bit(1), d.epoch)
        );
        let mut back = back;
        assert_eq!(
            back.request(0, Mode::Exclusive, false).unwrap(),
            DirDecision::Defer,
            "nobody is served before node 1 answered"
        );
        assert!(back.settled(1));
        assert!(matches!(
            back.request(0, Mode::Exclusive, false).unwrap(),
            DirDecision::Grant { invalidate, .. } if invalidate == bit(1)
        ));
        // a live holder named: not brought back
        let mut held = DirEntry::new();
        held.request(1, Mode::Exclusive, false).unwrap();
        assert!(held.brought_back(3, 0, 4, bit(0) | bit(1)).is_none());
        // the holder never got it from the dead source: the page died with that source
        held.request(2, Mode::Exclusive, false).unwrap();
        assert_eq!(held.handed_by, Some(1));
        assert!(held.died_with(2, 1));
        assert_eq!(held.holders, Holders::Exclusive(1));
        assert!(held.brought_back(1, 0, 4, bit(0) | bit(2)).is_some());
    }

    /// Rejoin: node 1 held the page (granted from the home), node 2 was pointed at it and
    /// node 0 at node 2; node 1 died before handing it over, and node 2 lost its copy with
    /// it. Nobody live holds the page: it died with node 1, which brings it back when it
    /// restarts. One hand-over further back (node 1 was itself waiting for node 3, which may
    /// still hold it) the entry is left as it is.
    #[test]
    fn a_page_the_middle_of_a_chain_lost_died_with_the_chains_first_source_if_it_had_it() {
        let mut d = DirEntry::new();
        d.request(1, Mode::Exclusive, false).unwrap();
        d.request(2, Mode::Exclusive, false).unwrap();
        d.request(0, Mode::Exclusive, false).unwrap();
        assert_eq!(
            (d.handed_by, d.chain.map(|c| c.0), d.hops),
            (Some(2), Some(1), 2)
        );
        let mut longer = d;
        assert!(!d.died_with(0, 1), "node 0 is not the one that lost it");
        assert!(d.died_with(2, 1));
        assert_eq!(
            (d.holders, d.handed_by, d.chain),
            (Holders::Exclusive(1), None, None)
        );
        d.check().unwrap();
        assert!(d.brought_back(1, 0, 4, bit(0) | bit(2) | bit(3)).is_some());
        // node 3 got the page from the home, then node 1, 2, 0 in turn
        let mut from3 = DirEntry::new();
        from3.request(3, Mode::Exclusive, false).unwrap();
        for n in [1, 2, 0] {
            from3.request(n, Mode::Exclusive, false).unwrap();
        }
        assert_eq!(from3.hops, MANY_HOPS);
        assert!(!from3.died_with(2, 1), "node 3 may still hold the page");
        assert_eq!(from3.holders, Holders::Exclusive(0));
        // a grant's source forgotten (restarted): not known whether the holder got it
        longer.forget_source(2);
        assert_eq!(longer.hops, MANY_HOPS);
    }

    /// Rejoin: node 1 held the page (granted from the home) and died while it handed it to
    /// shared reader 2 (its copy-back due). Node 2 holds the page as node 1 left it, or
    /// nothing: brought back, node 2 stays listed, unsure, until it answered `Found`. If
    /// node 1 was itself waiting for the page from node 3 (a live node may hold it), the page
    /// stays lost.
    #[test]
    fn a_page_lost_while_handed_to_a_shared_reader_is_brought_back_listing_the_reader() {
        let mut d = DirEntry::new();
        d.request(1, Mode::Exclusive, false).unwrap();
        d.request(2, Mode::Shared, false).unwrap();
        assert_eq!(
            (d.holders, d.awaiting_copy_back),
            (Holders::Shared(bit(2)), Some(1))
        );
        d.forget_source(1);
        let back = d
            .brought_back(1, 0, 4, bit(0) | bit(2) | bit(3))
            .expect("brought back");
        assert_eq!(
            (
                back.holders,
                back.unsure,
                back.settling,
                back.awaiting_copy_back
            ),
            (Holders::Shared(bit(2)), bit(2), bit(2), None)
        );
        back.check().unwrap();
        let mut waited = DirEntry::new();
        waited.request(3, Mode::Exclusive, false).unwrap();
        waited.request(1, Mode::Exclusive, false).unwrap();
        waited.request(2, Mode::Shared, false).unwrap();
        waited.forget_source(1);
        assert!(waited
            .brought_back(1, 0, 4, bit(0) | bit(2) | bit(3))
            .is_none());
    }
}
