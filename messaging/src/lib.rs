//! # shoal-messaging: one-sided writes and mailboxes
//!
//! This crate owns how bytes move between nodes:
//!
//! - [`region`]: the memory a node registers for peers to write into (atomic words; every
//!   write's last word is published with Release, so a flag written last marks completion);
//! - [`transport`]: the [`Transport`] trait (one-sided, per-peer-ordered writes) and the
//!   in-process `mem` transport; [`tcp`]: one process per node over TCP; `rdma` (cargo
//!   feature `rdma`): ibverbs RC queue pairs with RDMA WRITE;
//! - [`message`]: fixed 64-byte messages with a validating encoding;
//! - [`channel`]: one-way message streams between every pair of nodes (rings with credit,
//!   pages attached), for protocols whose handlers must never wait for an answer;
//! - [`mailbox`]: request/response slots per (worker, peer), handler threads owning partitions
//!   of request slots, page pushes into a requester's frame before the reply;
//! - [`wait`]: spin-then-park waiting with writer wake-ups (busy-polling as an option).
//!
//! It must not know what pages contain or the coherence rules: it moves bytes and messages.

mod channel;
mod error;
mod mailbox;
mod message;
#[cfg(feature = "rdma")]
mod rdma;
mod region;
mod seal;
mod tcp;
mod transport;
mod wait;

pub use channel::{ChannelLayout, Channels, Incoming, BACKLOG_PAGES};
pub use error::MsgError;
pub use mailbox::{Layout, Mailboxes, Responder, PAGE_BYTES};
pub use message::{Echo, Envelope, Message, BODY_BYTES, MSG_BYTES};
#[cfg(feature = "rdma")]
pub use rdma::{device_names, RdmaConfig, RdmaTransport};
pub use region::{Region, Service};
pub use tcp::{dial_handshake, free_loopback_addrs, incarnation_now, TcpConfig, TcpTransport};
pub use transport::{mem_cluster, MemTransport, RejoinHook, Transport};
pub use wait::WaitMode;
