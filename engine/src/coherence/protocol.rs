//! The coherence protocol's vocabulary: possession modes, node sets, the messages nodes send
//! each other about a page, and protocol errors. The rules live in [`crate::coherence::directory`] (what
//! a page's home node decides) and [`crate::coherence::possession`] (what every node does with its copy);
//! docs/protocol.md states them in prose with the argument for each race.
//!
//! Everything here is pure: no I/O, no latches, no threads. The engine drives these state
//! machines from its message handlers; the model in tests/coherence_model.rs drives the very
//! same code under every message order it can generate, so the two cannot drift apart.
//!
//! Page contents are a type parameter `D`: the engine passes frame handles, the model passes
//! version numbers so that it can check every read against the last write.

use std::fmt;

/// A node id (at most [`crate::MAX_NODES`] nodes: node sets are 64-bit bitmaps).
pub type Node = u8;

/// A page's conflict epoch: the directory counts the requests that named other nodes, and
/// every possession carries the epoch of its grant. 64 bits cannot wrap: at 10^9 conflicts a
/// second on one page (far above what any transport carries) they last 584 years, so epochs
/// compare with plain `<` and the directory adds with a checked `+ 1`. (They were 32 bits
/// until issue 30: 4.3 billion conflicts, half a day on one hot page at 100K a second, and
/// every comparison would have turned around.)
pub type Epoch = u64;

/// A set of nodes as a bitmap (bit `n` = node `n`).
pub type NodeSet = u64;

/// The bit of node `n` in a [`NodeSet`].
#[inline]
pub fn bit(n: Node) -> NodeSet {
    debug_assert!(n < 64);
    1u64 << n
}

/// Iterate the members of a node set in increasing order.
pub fn members(set: NodeSet) -> impl Iterator<Item = Node> {
    (0..64u8).filter(move |&n| set & bit(n) != 0)
}

/// What a node may do with its copy of a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// Node-shared: read; other nodes may hold copies too.
    Shared,
    /// Node-exclusive: read and write; no other node holds a copy.
    Exclusive,
}

/// The home's answer to a possession request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Grant<D> {
    /// The mode the requester will hold once the grant completes.
    pub mode: Mode,
    /// The page's conflict epoch after this request: identifies the requester's possession.
    pub epoch: Epoch,
    /// The page, pushed by the home before the grant (base case), if the home sends it.
    pub data: Option<D>,
    /// Fetch the page from this node (its predecessor in request order): it hands the page
    /// over, possibly after it got and used the page itself (anticipatory chaining).
    pub source: Option<Node>,
    /// Nodes whose shared copies the requester must invalidate before writing.
    pub invalidate: NodeSet,
    /// The `source` is a sharer that keeps its copy (a shared read forwarded to it because
    /// the home's copy is not in memory); it copies back nothing but a notice that it served.
    pub source_keeps: bool,
}

/// A protocol message about one page (the page id travels beside it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg<D> {
    /// Requester -> home: I want `want`; `have` = I hold a valid copy (an upgrade); `again`
    /// = the node my last grant named as source died before handing the page over, and I ask
    /// again for it (`PageCopy::ask_again`).
    Request { want: Mode, have: bool, again: bool },
    /// Home -> requester: the decision (and, in the base case, the page).
    Grant(Grant<D>),
    /// Requester -> the source a grant named: hand me the page. `epoch` is the requester's
    /// grant epoch, always newer than the source's own. `keep`: the source is a sharer the
    /// home forwarded a shared read to; it sends a copy and keeps its own.
    Transfer {
        want: Mode,
        epoch: Epoch,
        keep: bool,
    },
    /// Source -> requester: the page (pushed into the requester's frame); `dirty` = newer than
    /// the copy at the home.
    Page { data: D, dirty: bool },
    /// Source -> home after handing an exclusive page to a shared requester: the home's copy
    /// becomes current again (`data` is `None` when the page was clean). A sharer that served
    /// a forwarded read (`Transfer{keep}`) sends it too, without data: it may now evict.
    CopyBack { data: Option<D> },
    /// Requester -> sharer: drop your copy. `epoch` = the requester's grant epoch.
    Invalidate { epoch: Epoch },
    /// Sharer -> requester: dropped.
    InvalidateAck,
    /// Holder -> home: I want to evict my copy (`data` = the page when dirty). `epoch` = the
    /// holder's grant epoch.
    Evict { epoch: Epoch, data: Option<D> },
    /// Home -> holder: `accepted` = drop it; otherwise keep it, a successor is coming for it.
    EvictReply { accepted: bool },
    /// Home -> a node that did not ask for the page: take this clean page as a node-shared
    /// copy (one pool: the home's provider evicts the page, nobody else holds it, and the node
    /// has room). `epoch` identifies the possession it would be.
    Offer { epoch: Epoch, data: D },
    /// Node -> home: `accepted` = it holds the offered page now, node-shared.
    OfferReply { accepted: bool },
    /// Home -> the source a grant named, once the grant's requester is dead and fenced with
    /// every message it sent handled: the requester of the grant of `epoch` may have died
    /// before it asked you for the page. If you still hold it for that grant, copy it back
    /// home (`CopyBack`); if you handed it over already, answer `Gone`.
    Reclaim { epoch: Epoch },
    /// Source -> home, the answer to `Reclaim`: the page was handed over already (it died
    /// with the requester).
    Gone,
}

impl<D> Msg<D> {
    /// The same message with its page (if it carries one) replaced by `f(page)`.
    pub fn map_data<E>(self, f: impl FnOnce(D) -> E) -> Msg<E> {
        match self {
            Msg::Request { want, have, again } => Msg::Request { want, have, again },
            Msg::Grant(g) => Msg::Grant(Grant {
                mode: g.mode,
                epoch: g.epoch,
                data: g.data.map(f),
                source: g.source,
                invalidate: g.invalidate,
                source_keeps: g.source_keeps,
            }),
            Msg::Transfer { want, epoch, keep } => Msg::Transfer { want, epoch, keep },
            Msg::Page { data, dirty } => Msg::Page {
                data: f(data),
                dirty,
            },
            Msg::CopyBack { data } => Msg::CopyBack { data: data.map(f) },
            Msg::Invalidate { epoch } => Msg::Invalidate { epoch },
            Msg::InvalidateAck => Msg::InvalidateAck,
            Msg::Evict { epoch, data } => Msg::Evict {
                epoch,
                data: data.map(f),
            },
            Msg::EvictReply { accepted } => Msg::EvictReply { accepted },
            Msg::Offer { epoch, data } => Msg::Offer {
                epoch,
                data: f(data),
            },
            Msg::OfferReply { accepted } => Msg::OfferReply { accepted },
            Msg::Reclaim { epoch } => Msg::Reclaim { epoch },
            Msg::Gone => Msg::Gone,
        }
    }

    /// The message's name, as docs/protocol.md and the model use it.
    pub fn name(&self) -> &'static str {
        match self {
            Msg::Request { .. } => "Request",
            Msg::Grant(_) => "Grant",
            Msg::Transfer { .. } => "Transfer",
            Msg::Page { .. } => "Page",
            Msg::CopyBack { .. } => "CopyBack",
            Msg::Invalidate { .. } => "Invalidate",
            Msg::InvalidateAck => "InvalidateAck",
            Msg::Evict { .. } => "Evict",
            Msg::EvictReply { .. } => "EvictReply",
            Msg::Offer { .. } => "Offer",
            Msg::OfferReply { .. } => "OfferReply",
            Msg::Reclaim { .. } => "Reclaim",
            Msg::Gone => "Gone",
        }
    }
}

/// A message that breaks the protocol's rules (a bug or a corrupt peer). The engine logs it
/// and fails the affected request; the model reports it as a violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "coherence protocol violation: {}", self.0)
    }
}

impl std::error::Error for ProtocolError {}

/// Shorthand for returning a [`ProtocolError`].
pub(crate) fn violation<T>(what: impl Into<String>) -> Result<T, ProtocolError> {
    Err(ProtocolError(what.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_sets_hold_exactly_their_members() {
        let s = bit(0) | bit(5) | bit(63);
        assert_eq!(members(s).collect::<Vec<_>>(), vec![0, 5, 63]);
        assert_eq!(members(0).count(), 0);
        assert_eq!(members(NodeSet::MAX).count(), 64);
    }

    #[test]
    fn messages_are_named_as_the_docs_name_them() {
        let names: Vec<&str> = [
            Msg::<u8>::Request {
                want: Mode::Shared,
                have: false,
                again: false,
            },
            Msg::Grant(Grant {
                mode: Mode::Shared,
                epoch: 0,
                data: None,
                source: None,
                invalidate: 0,
                source_keeps: false,
            }),
            Msg::Transfer {
                want: Mode::Shared,
                epoch: 0,
                keep: false,
            },
            Msg::Page {
                data: 0,
                dirty: false,
            },
            Msg::CopyBack { data: None },
            Msg::Invalidate { epoch: 0 },
            Msg::InvalidateAck,
            Msg::Evict {
                epoch: 0,
                data: None,
            },
            Msg::EvictReply { accepted: true },
            Msg::Offer { epoch: 1, data: 0 },
            Msg::OfferReply { accepted: true },
            Msg::Reclaim { epoch: 1 },
            Msg::Gone,
        ]
        .iter()
        .map(Msg::name)
        .collect();
        let docs = include_str!("../../../docs/protocol.md");
        for n in &names {
            assert!(
                docs.contains(&format!("`{n}`")),
                "docs/protocol.md names {n}"
            );
        }
        assert_eq!(names.len(), 13);
    }

    #[test]
    fn a_violation_says_it_is_one() {
        let e: Result<(), _> = violation("node 3 did a thing");
        assert_eq!(
            e.unwrap_err().to_string(),
            "coherence protocol violation: node 3 did a thing"
        );
    }
}
