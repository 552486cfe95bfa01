//! Leases: how a node that is cut off stops using its copies before the others act on its
//! death (docs/protocol.md, "Fencing").
//!
//! A node may use its copy of a page homed at H (latch it) only while its **lease** from H
//! runs. Every node pings each live peer every [`PING_EVERY`] with the time it sent the ping
//! on its own clock; the peer records when it heard the ping and answers with the same time;
//! the answer extends the sender's lease from that peer to that time plus [`LEASE`]. So a
//! lease always ends at most [`LEASE`] after a moment the granting node has already passed:
//! when H last heard a ping from N, N's lease from H ends at most [`LEASE`] later, by any
//! clock that runs at about the same rate. The home waits [`LEASE`] and a margin after that
//! before it treats a dead N as fenced ([`Leases::fence_holds`]); then N, even if it is still
//! running (stopped by a signal, cut off by the network), uses no copy of H's pages any more,
//! and its shared copies can be forgotten as clean evictions.
//!
//! Clocks are never compared across nodes: a node compares only its own times. The clock is
//! the kernel's coarse monotonic clock, which keeps running while the process is stopped (a
//! counter kept by one of our threads would not), and costs a few nanoseconds to read.

use super::protocol::Node;
use super::wire::Control;
use super::Coherence;
use crate::buffer::Buffer;
use crate::error::EngineError;
use crate::pid::Pid;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a ping's answer lets the pinging node use its copies of the answering node's
/// pages, counted from when the ping left.
pub const LEASE: Duration = Duration::from_millis(1500);
/// How often a node pings each live peer: a lease is renewed about six times before it ends,
/// so a node whose threads are delayed (a loaded machine) rarely finds its lease lapsed.
pub const PING_EVERY: Duration = Duration::from_millis(250);
/// What a home adds to [`LEASE`] before it believes a dead node fenced: the coarse clock's
/// resolution at both ends (a few milliseconds each) and a rate difference of up to 1%.
const MARGIN: Duration = Duration::from_millis(50);

/// Now on the kernel's coarse monotonic clock, in nanoseconds (never 0 on a running system).
pub fn coarse_now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration, and
    // CLOCK_MONOTONIC_COARSE exists on every Linux this engine runs on (io_uring needs 5.1).
    let r = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    assert_eq!(r, 0, "clock_gettime(CLOCK_MONOTONIC_COARSE) failed");
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// One node's leases from its peers and what it heard from them.
pub(super) struct Leases {
    me: Node,
    /// Per peer H: until when (coarse nanoseconds) this node may use its copies of H's pages;
    /// 0 before H first answered. Only grows. Acquire/Release: a worker that sees a lease
    /// sees the answer's effects handled before it (nothing else is read through it).
    until: Box<[AtomicU64]>,
    /// Per peer N: when this node last heard a ping from N (0: never). Written by the handler
    /// role only; read by it too (Relaxed suffices: one thread at a time, under the role's
    /// mutex).
    heard: Box<[AtomicU64]>,
    /// When this node last pinged its peers, and when a waiting worker last pinged a home
    /// (apart: a worker's pings must not put off the periodic ones to the other peers).
    pinged: AtomicU64,
    pinged_soon: AtomicU64,
    /// Per peer: when (our clock) its last answer arrived; 0 before the first.
    answered: Box<[AtomicU64]>,
}

impl Leases {
    pub fn new(me: Node, nodes: u8) -> Leases {
        let zeros = || (0..nodes).map(|_| AtomicU64::new(0)).collect();
        Leases {
            me,
            until: zeros(),
            heard: zeros(),
            pinged: AtomicU64::new(0),
            pinged_soon: AtomicU64::new(0),
            answered: zeros(),
        }
    }

    /// Whether this node may use its copies of `home`'s pages now (always for its own).
    #[inline]
    pub fn valid(&self, home: Node) -> bool {
        home == self.me || coarse_now() < self.until[home as usize].load(Ordering::Acquire)
    }

    /// `home` answered a ping this node sent at `at`.
    pub fn renew(&self, home: Node, at: u64) {
        let until = at.saturating_add(nanos(LEASE));
        self.until[home as usize].fetch_max(until, Ordering::Release);
        self.answered[home as usize].fetch_max(coarse_now(), Ordering::Relaxed);
    }

    /// Whether `peer`, which answered a ping before, has answered none for longer than
    /// `limit`. A peer that never answered is still starting (a node recovering its store
    /// before its handler runs can take longer than any timeout): never silent.
    pub fn silent_for(&self, peer: Node, limit: Duration) -> bool {
        let last = self.answered[peer as usize].load(Ordering::Relaxed);
        last != 0 && coarse_now() > last.saturating_add(nanos(limit))
    }

    /// A ping from `from` arrived now.
    pub fn heard(&self, from: Node) {
        self.heard[from as usize].store(coarse_now(), Ordering::Relaxed);
    }

    /// Forget `peer`'s old incarnation (it restarted, `rejoin.rs`): no lease from it, no ping
    /// heard from it, no answer yet (so the new one is not silent while it starts).
    pub fn forget(&self, peer: Node) {
        // Release: as `renew`; the others are read under the handler role
        self.until[peer as usize].store(0, Ordering::Release);
        self.heard[peer as usize].store(0, Ordering::Relaxed);
        self.answered[peer as usize].store(0, Ordering::Relaxed);
    }

    /// Whether `n`, believed dead, can no longer be using its copies of this node's pages: its
    /// last lease from us has run out, by our clock, with the margin. A node we never heard a
    /// ping from never had a lease.
    pub fn fence_holds(&self, n: Node) -> bool {
        self.fence_holds_at(n, coarse_now())
    }

    /// [`fence_holds`](Self::fence_holds) at time `now`.
    fn fence_holds_at(&self, n: Node, now: u64) -> bool {
        let heard = self.heard[n as usize].load(Ordering::Relaxed);
        heard == 0 || now >= heard.saturating_add(nanos(LEASE + MARGIN))
    }

    /// The time for a ping, if one is due (at most one caller gets it per [`PING_EVERY`]),
    /// or with `soon`, if none left in the last millisecond (a worker waits for a lease and
    /// pings the home itself).
    pub fn ping_due(&self, soon: bool) -> Option<u64> {
        let now = coarse_now();
        let (pinged, every) = if soon {
            (&self.pinged_soon, Duration::from_millis(1))
        } else {
            (&self.pinged, PING_EVERY)
        };
        let last = pinged.load(Ordering::Relaxed);
        if now < last.saturating_add(nanos(every)) {
            return None;
        }
        pinged
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .ok()
            .map(|_| now)
    }
}

impl Coherence {
    /// Whether this node may use its copy of `pid` now (its lease from the page's home runs).
    #[inline]
    pub fn lease_valid(&self, pid: Pid) -> bool {
        self.leases.valid(pid.node())
    }

    /// Ping every live peer if a ping is due (the handler thread calls it after each round),
    /// and sever a peer that answered none for the remote timeout: it is stopped, cut off or
    /// hung, every request that needs it would time out, and once severed the others go on
    /// without it as after its death (its shared copies are forgotten once fenced). Not on
    /// `mem`, where severing kills the node for the whole process.
    pub fn ping_peers(&self) {
        let Some(at) = self.leases.ping_due(false) else {
            return;
        };
        let limit = self.waiting.timeout;
        let transport = self.driver.ch.transport();
        for n in self.live_peers() {
            if transport.severs_one_link() && self.leases.silent_for(n, limit) {
                log::error!(
                    "node {}: node {n} answered no ping for {} ms (stopped, cut off or hung): \
                     its link is severed, and the cluster goes on as after its death",
                    self.me,
                    limit.as_millis()
                );
                self.driver
                    .counters
                    .peers_severed_silent
                    .fetch_add(1, Ordering::Relaxed);
                transport.sever(n);
                continue;
            }
            if let Err(e) = self.try_send_control(n, &Control::Ping { at }) {
                log::debug!("node {}: ping to node {n}: {e}", self.me);
            }
        }
    }

    /// A peer pinged us: note when, then answer (in that order: the home's fence counts from
    /// a moment after the lease it grants began).
    pub(super) fn on_ping(&self, from: Node, at: u64) {
        self.leases.heard(from);
        if let Err(e) = self.try_send_control(from, &Control::Pong { at }) {
            log::debug!("node {}: answer to node {from}'s ping: {e}", self.me);
        }
    }

    /// A peer answered our ping sent at `at`.
    pub(super) fn on_pong(&self, from: Node, at: u64) {
        if at > coarse_now() {
            // it echoes our own time: a later one is a peer's bug, and would give a lease
            // without end
            log::error!(
                "node {}: node {from} answered a ping from the future: ignored",
                self.me
            );
            return;
        }
        self.leases.renew(from, at);
    }

    /// A worker found its lease on `pid`'s home run out: ping and wait for the answer,
    /// helping the handler meanwhile. `Ok` once the lease runs again; an error when the home
    /// is dead (its pages cannot be used any more: another node may have them now) or after
    /// the remote timeout.
    #[cold]
    pub fn wait_lease(&self, buf: &Buffer, pid: Pid) -> Result<(), EngineError> {
        let home = pid.node();
        self.driver
            .counters
            .lease_waits
            .fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + self.waiting.timeout;
        loop {
            if self.leases.valid(home) {
                return Ok(());
            }
            if !self.driver.ch.peer_alive(home) {
                return Err(EngineError::PeerDead { node: home });
            }
            if Instant::now() >= deadline {
                return Err(EngineError::LeaseLapsed {
                    pid,
                    home,
                    ms: self.waiting.timeout.as_millis() as u64,
                });
            }
            if let Some(at) = self.leases.ping_due(true) {
                // a ping that cannot leave renews nothing: this node is cut off from the home
                self.try_send_control(home, &Control::Ping { at })?;
            }
            if !self.help(buf) {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_runs_from_when_the_ping_left_and_only_grows() {
        let l = Leases::new(0, 3);
        assert!(l.valid(0), "a node's own pages need no lease");
        assert!(!l.valid(1), "no lease before the first answer");
        let now = coarse_now();
        l.renew(1, now);
        assert!(l.valid(1));
        assert!(!l.valid(2), "leases are per peer");
        // an answer to an old ping does not shorten the lease
        l.renew(1, now - nanos(LEASE));
        assert!(l.valid(1));
        // an answer that arrives after its lease ran out gives none
        l.renew(2, now - nanos(LEASE) - nanos(Duration::from_secs(1)));
        assert!(!l.valid(2));
    }

    #[test]
    fn the_fence_holds_a_lease_and_a_margin_after_the_last_ping_heard() {
        let l = Leases::new(0, 3);
        assert!(l.fence_holds(1), "never pinged us: never had a lease");
        l.heard(1);
        assert!(!l.fence_holds(1));
        // a lease after the ping was heard the margin still holds it back; after both, not
        let heard = l.heard[1].load(Ordering::Relaxed);
        assert!(!l.fence_holds_at(1, heard + nanos(LEASE)));
        assert!(!l.fence_holds_at(1, heard + nanos(LEASE + MARGIN) - 1));
        assert!(l.fence_holds_at(1, heard + nanos(LEASE + MARGIN)));
    }

    #[test]
    fn a_peer_that_answered_once_is_silent_once_no_answer_came_for_the_limit() {
        let l = Leases::new(0, 2);
        assert!(
            !l.silent_for(1, Duration::ZERO),
            "a peer that never answered is starting, not silent"
        );
        l.answered[1].store(
            coarse_now() - nanos(Duration::from_secs(2)),
            Ordering::Relaxed,
        );
        assert!(l.silent_for(1, Duration::from_secs(1)));
        l.renew(1, coarse_now());
        assert!(
            !l.silent_for(1, Duration::from_secs(1)),
            "an answer ends the silence"
        );
    }

    #[test]
    fn one_ping_is_due_per_period_and_a_waiting_worker_gets_one_sooner() {
        let l = Leases::new(0, 2);
        assert!(l.ping_due(false).is_some(), "the first is due at once");
        let ago = |d: Duration| coarse_now() - nanos(d);
        let later = coarse_now() + nanos(Duration::from_secs(60));
        // (times set by hand, so that no tick of the coarse clock decides the outcome)
        l.pinged.store(later, Ordering::Relaxed);
        assert!(l.ping_due(false).is_none(), "a period has not passed");
        l.pinged.store(ago(PING_EVERY * 2), Ordering::Relaxed);
        assert!(l.ping_due(false).is_some(), "a period has passed");
        // a waiting worker may ping every millisecond, whatever the periodic pings did
        l.pinged.store(later, Ordering::Relaxed);
        l.pinged_soon
            .store(ago(Duration::from_millis(5)), Ordering::Relaxed);
        assert!(l.ping_due(true).is_some());
        l.pinged_soon.store(later, Ordering::Relaxed);
        assert!(l.ping_due(true).is_none());
        // and its pings do not put off the periodic ones
        l.pinged.store(ago(PING_EVERY * 2), Ordering::Relaxed);
        assert!(l.ping_due(false).is_some());
    }
}
