//! # shoal-messaging: one-sided writes and mailboxes (not built yet)
//!
//! This crate will own the transports with one-sided-write semantics (`mem`: in-process copy
//! plus a release store; `tcp`: a framed stream per peer; `rdma` behind a cargo feature), the
//! mailboxes of fixed 64-byte messages (one request slot per worker and peer at the peer's
//! handler, one response slot at the worker, flag byte written last), and page pushes into a
//! requester's frame. See DESIGN.md, "Messaging", and the messaging issue.
//!
//! It must not know what pages contain or the coherence rules: it moves bytes and messages.
