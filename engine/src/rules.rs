//! The coherence protocol's rules, as the model check sees them (tests/coherence_model.rs).
//!
//! The rules are pure state machines: what a page's home decides ([`DirEntry`]: holders,
//! conflict epoch, anticipatory chaining, evictions), what a node does with its copy
//! ([`PageCopy`]), and the messages between them ([`Msg`], [`Grant`]) with their 64-byte
//! encoding ([`Wire`]). The engine's driver (`coherence/`) runs the same rules over frames and
//! channels; the model runs them over every interleaving of in-flight messages, crashes and
//! evictions, and checks the invariants (`DirEntry::check`, `PageCopy::check`) after every
//! step. This module is the one way in to them from outside the engine; nothing else of the
//! protocol is public.
//!
//! docs/protocol.md describes the protocol in prose.

pub use crate::coherence::directory::{
    Counted, DirDecision, DirEntry, EvictDecision, Holders, Holds,
};
pub use crate::coherence::possession::{Deferred, PageCopy, Pending, Step};
pub use crate::coherence::protocol::{members, Grant, Mode, Msg, Node};
pub use crate::coherence::wire::Wire;
