//! The coherence protocol of a cluster node.
//!
//! **The rules** are pure state machines, checked by the model in tests/coherence_model.rs:
//!
//! | file | what |
//! |---|---|
//! | [`protocol`] | modes, node sets, the messages about a page, protocol errors |
//! | [`directory`] | what a page's home decides (holders, conflict epoch, anticipatory chaining) |
//! | [`possession`] | what a node does with its copy of a page |
//! | [`wire`] | the messages as 64-byte channel messages; control messages; batches |
//!
//! **The driver** runs them for one node over its `Buffer`, split by job:
//!
//! | file | who runs it | what |
//! |---|---|---|
//! | `acquire.rs` | workers | a page that is not resident with enough possession is requested from its home; the worker waits holding no latch, then looks the page up again |
//! | `evict.rs` | the page provider | a page homed elsewhere leaves by an eviction notice; one homed here through the directory, locally |
//! | `handler.rs` | the handler | applies every incoming message; never waits for a latch: a message whose frame is latched, that needs a free frame, or that would take a page its completing worker has not used yet stays held and is retried in order |
//! | `apply.rs` | the handler | one message under the page's frame latches: home requests, grants, pages, notices |
//! | `send.rs` | everyone | sending, batches of small messages per destination ([`outbox`]) |
//! | `failure.rs` | everyone | dead nodes: lost pages, refusals |
//! | `lease.rs` | workers, the handler | leases on other homes' pages (pings and their answers), the fence on a dead node, its shared copies forgotten at the home |
//! | `barrier.rs`, `alloc.rs` | workers, the handler | the cluster barrier; pages allocated on another node |
//! | `logged.rs` | everyone | with a write-ahead log: a page leaves only once durable, a page received dirty is logged whole, log fences for checkpoints |
//! | `census.rs` | a timed-out worker | what this node's frames and pages wait for, for the log |
//! | `rejoin.rs` | the transport's rejoin | a restarted node taken back: its old incarnation forgotten, copies of its pages dropped |
//!
//! Per page this node has touched it keeps a `PageState`: the page's directory entry
//! (meaningful at the page's home only), this node's [`PageCopy`] (whose data is the frame
//! holding the page), and the messages it could not apply yet.
//!
//! Frames and the home copy: at a page's home, the frame of the page (if resident) *is* the
//! home's copy of the page (the one the directory grants from); when this node holds the page
//! itself, the same frame is also its copy. The frame's `Possession` says what local guards
//! may do with it; a home copy that this node does not hold has possession none. At other
//! nodes a frame exists exactly while this node's copy holds it. Frames of pages homed
//! elsewhere are never written to the local store.
//!
//! Locks: a page's state is only touched under its shard's mutex; frames are latched with `try`
//! only (by the handler and the provider), so holding a shard mutex never waits for a latch.
//!
//! It must not know about guards, workers' operations or the provider's policy: it is given
//! page ids and frames, and answers with frames and errors.

pub mod directory;
pub mod outbox;
pub mod possession;
pub mod protocol;
pub mod wire;

mod acquire;
mod alloc;
mod apply;
mod barrier;
mod census;
mod evict;
mod failure;
mod handler;
mod home;
mod lease;
mod logged;
mod pool;
mod rejoin;
mod send;
#[cfg(test)]
mod tests;

use crate::buffer::{FrameIdx, Possession};
use crate::error::EngineError;
use crate::pid::Pid;
use alloc::RemoteAlloc;
use barrier::Barrier;
use directory::{DirEntry, Holds};
use outbox::Outboxes;
use parking_lot::{Condvar, Mutex};
use possession::PageCopy;
use protocol::{Mode, Msg, Node};
use shoal_messaging::{Channels, PAGE_BYTES};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Shards of the page-state map.
const SHARDS: usize = 64;
/// Longest time a completed request keeps its page for the worker that asked.
const RESERVE: Duration = Duration::from_millis(10);

/// A page travelling in a message, as the receiver sees it.
#[derive(Debug, Clone)]
pub(crate) enum Data {
    /// The home's own copy (a message the home sends itself).
    Home,
    /// Bytes that arrived attached to the message.
    Bytes(Box<[u8; PAGE_BYTES]>),
}

/// A message for a page, from `from`.
#[derive(Debug)]
pub(crate) struct Note {
    from: Node,
    msg: Msg<Data>,
    /// What this node's log holds of the page the message brought (`logged.rs`).
    logged: Receipt,
}

/// What this node's log holds of the page a message brought: its receipt image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Receipt {
    /// Nothing to hold: the message brought no page, or not the page's newest state.
    Nothing,
    /// The image, in the chunk at this LSN.
    Logged(u64),
    /// Not logged: a page evicted home while the log was nearly full, to be declined (the
    /// evicting node keeps it). Logging it would take the room this node's checkpoint
    /// needs to finish (`Log::tight`).
    Declined,
}

/// What this node knows and holds of one page.
struct PageState {
    /// The directory entry (used only when this node is the page's home).
    dir: DirEntry,
    copy: PageCopy<FrameIdx>,
    /// Messages not applied yet, in arrival order.
    held: VecDeque<Note>,
    /// Requests the directory deferred (a copy-back is outstanding).
    dir_deferred: VecDeque<Note>,
    /// A worker waits for the outstanding request (it will call `used`).
    waiter: bool,
    /// The request completed at this instant; its worker has not used the page yet.
    reserved: Option<Instant>,
    /// `copy.served()` is still to be called.
    serve_due: bool,
    /// The home refused the outstanding request.
    error: Option<EngineError>,
    /// A Transfer or Invalidate waits for local guards to leave the page: new local guards
    /// stay away (they wait), so a busy local worker cannot starve the other nodes.
    revoking: bool,
    /// When a Transfer of this copy was first held for the log writer (None: none is held);
    /// see `apply::LOG_HOLD_MAX`.
    log_hold_since: Option<Instant>,
    /// The node the last grant said the page comes from (to notice when it died).
    page_from: Option<Node>,
    /// The node whose page this copy asked for again after it died (`failure::ask_again`):
    /// the page is lost with it if a hand-over this copy never got waits here
    /// (`PageCopy::stuck_asking_again`).
    asked_after: Option<Node>,
    /// The page's only current copy died with this node: every access fails.
    lost: Option<Node>,
    /// Workers of this node parked until a handler round changes this page.
    parked: Vec<std::thread::Thread>,
    /// At the home: the home's copy read from the store outside the handler role (home.rs).
    store_copy: StoreCopy,
    /// At the home: bumped whenever the home's copy changes (an evicted or copied-back page
    /// arrives), so that a store read that was in flight meanwhile is not used.
    home_gen: u64,
    /// At the home, while it asks the live nodes what they hold of this page, lost with a
    /// restarted node (`rejoin.rs`, the census): their answers so far. Messages for the page
    /// wait here meanwhile (`apply`), so that the page stays where the answers say.
    census: Option<Vec<(Node, Holds)>>,
}

/// A page's home copy as read from the store for a request, outside the handler role: the
/// device read is done by whoever takes it from `Coherence::reads_due` (a helper, the
/// handler thread), so no round waits for the device and the reads of several threads overlap.
#[derive(Default)]
enum StoreCopy {
    #[default]
    None,
    /// Asked for when the page's `home_gen` was `gen`; the request that needs it is held.
    Reading { gen: u64 },
    /// Read; valid while `home_gen` is still `gen`. Dropped at the end of the `progress` that
    /// could use it (pages are not kept here).
    Read {
        gen: u64,
        page: Box<shoal_storage::AlignedPage>,
    },
    /// The read failed: the request is refused.
    Failed,
}

impl PageState {
    fn new(pid: Pid, me: Node) -> PageState {
        PageState {
            dir: DirEntry::new(),
            copy: PageCopy::new(pid.node(), me),
            held: VecDeque::new(),
            dir_deferred: VecDeque::new(),
            waiter: false,
            reserved: None,
            serve_due: false,
            error: None,
            revoking: false,
            log_hold_since: None,
            page_from: None,
            asked_after: None,
            lost: None,
            parked: Vec::new(),
            store_copy: StoreCopy::None,
            home_gen: 0,
            census: None,
        }
    }

    fn reserved_now(&mut self) -> bool {
        if self.reserved.is_some_and(|t| t.elapsed() > RESERVE) {
            self.reserved = None;
        }
        self.reserved.is_some()
    }

    /// Debug builds: the page's invariants hold (its copy's and, at the home, its directory
    /// entry's, as the model checks them; a lost page has no copy; a page kept for the worker
    /// that asked for it is there).
    fn debug_check(&self, pid: Pid, me: Node) {
        if !cfg!(debug_assertions) {
            return;
        }
        if let Err(e) = self.copy.check() {
            panic!("{pid}: {e}");
        }
        if pid.node() == me {
            if let Err(e) = self.dir.check() {
                panic!("{pid}: directory: {e}");
            }
        }
        assert!(
            self.lost.is_none() || self.copy.data.is_none(),
            "{pid}: lost, but a copy is held"
        );
        assert!(
            self.reserved.is_none() || self.copy.data.is_some(),
            "{pid}: kept for its worker, but not here"
        );
    }

    /// Whether anything waits on this page: an outstanding interaction, held or deferred
    /// messages, a due serve, a revocation.
    fn busy(&self) -> bool {
        self.copy.pending != possession::Pending::Idle
            || !self.held.is_empty()
            || !self.copy.deferred.is_empty()
            || !self.dir_deferred.is_empty()
            || self.serve_due
            || self.revoking
    }
}

/// Counters of the protocol at one node.
#[derive(Debug, Default)]
pub struct CoherenceCounters {
    /// Possession requests this node's workers sent.
    pub requests: AtomicU64,
    /// Protocol messages sent to other nodes.
    pub messages: AtomicU64,
    /// Pages sent to other nodes.
    pub pages: AtomicU64,
    /// Eviction notices sent.
    pub evict_notices: AtomicU64,
    /// Batches sent (each one message carrying several eviction notices or replies).
    pub batches: AtomicU64,
    /// Messages the handler had to hold and retry.
    pub held: AtomicU64,
    /// Messages applied by threads that waited for an answer (this node's workers, on `mem`
    /// also other nodes' workers) instead of the node's handler thread.
    pub helped: AtomicU64,
    /// Home copies read from the store for requests (outside the handler role).
    pub home_reads: AtomicU64,
    /// Shared requests this home forwarded to a sharer because its own copy was not in
    /// memory: store reads avoided.
    pub forwarded_reads: AtomicU64,
    /// Pages this node sent to others as a sharer serving a forwarded read (it kept its copy).
    pub served_for_others: AtomicU64,
    /// Pages this home offered to a peer when evicting them.
    pub offers: AtomicU64,
    /// Offered pages a peer took (given away instead of left only on NVMe).
    pub given_away: AtomicU64,
    /// Pages other homes offered that this node took in.
    pub taken_in: AtomicU64,
    /// Flushes before a page left / pages logged whole on arrival (`logged.rs`).
    pub flushes_before_send: AtomicU64,
    /// Messages held until the log writer made a page's changes durable.
    pub held_for_log: AtomicU64,
    pub logged_on_arrival: AtomicU64,
    /// See [`crate::stats::ProtocolStats::evictions_declined_for_log`].
    pub evictions_declined_for_log: AtomicU64,
    /// See [`crate::stats::ProtocolStats::evictions_declined`].
    pub evictions_declined: AtomicU64,
    pub relogged_after_checkpoint: AtomicU64,
    /// See [`crate::stats::ProtocolStats::lease_waits`].
    pub lease_waits: AtomicU64,
    /// See [`crate::stats::ProtocolStats::dead_sharers_forgotten`].
    pub dead_sharers_forgotten: AtomicU64,
    /// See [`crate::stats::ProtocolStats::reads_asked_again`].
    pub reads_asked_again: AtomicU64,
    /// See [`crate::stats::ProtocolStats::dead_servers_forgotten`].
    pub dead_servers_forgotten: AtomicU64,
    /// See [`crate::stats::ProtocolStats::grants_reclaimed`].
    pub grants_reclaimed: AtomicU64,
    /// See [`crate::stats::ProtocolStats::peers_severed_silent`].
    pub peers_severed_silent: AtomicU64,
    /// See [`crate::stats::ProtocolStats::deaths_noticed`].
    pub deaths_noticed: AtomicU64,
    /// See [`crate::stats::ProtocolStats::fences_held`].
    pub fences_held: AtomicU64,
    /// See [`crate::stats::ProtocolStats::checkpoints_past_dead`].
    pub checkpoints_past_dead: AtomicU64,
    /// See [`crate::stats::ProtocolStats::records_carried`].
    pub records_carried: AtomicU64,
    /// See [`crate::stats::ProtocolStats::rejoins`].
    pub rejoins: AtomicU64,
    /// See [`crate::stats::ProtocolStats::pages_brought_back`].
    pub pages_brought_back: AtomicU64,
    /// See [`crate::stats::ProtocolStats::pages_censused`].
    pub pages_censused: AtomicU64,
    /// See [`crate::stats::ProtocolStats::longest_take_back_ms`].
    pub longest_take_back_ms: AtomicU64,
    /// See [`crate::stats::ProtocolStats::rejoin_ms`].
    pub rejoin_ms: AtomicU64,
    /// See [`crate::stats::ProtocolStats::acks_of_fenced`].
    pub acks_of_fenced: AtomicU64,
}

impl CoherenceCounters {
    /// A copy of the counters now.
    pub fn snapshot(&self) -> crate::stats::ProtocolStats {
        let l = |a: &AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        crate::stats::ProtocolStats {
            requests: l(&self.requests),
            messages: l(&self.messages),
            pages: l(&self.pages),
            evict_notices: l(&self.evict_notices),
            batches: l(&self.batches),
            held: l(&self.held),
            helped: l(&self.helped),
            home_reads: l(&self.home_reads),
            forwarded_reads: l(&self.forwarded_reads),
            served_for_others: l(&self.served_for_others),
            offers: l(&self.offers),
            given_away: l(&self.given_away),
            taken_in: l(&self.taken_in),
            flushes_before_send: l(&self.flushes_before_send),
            held_for_log: l(&self.held_for_log),
            logged_on_arrival: l(&self.logged_on_arrival),
            evictions_declined_for_log: l(&self.evictions_declined_for_log),
            evictions_declined: l(&self.evictions_declined),
            relogged_after_checkpoint: l(&self.relogged_after_checkpoint),
            lease_waits: l(&self.lease_waits),
            dead_sharers_forgotten: l(&self.dead_sharers_forgotten),
            reads_asked_again: l(&self.reads_asked_again),
            dead_servers_forgotten: l(&self.dead_servers_forgotten),
            grants_reclaimed: l(&self.grants_reclaimed),
            peers_severed_silent: l(&self.peers_severed_silent),
            deaths_noticed: l(&self.deaths_noticed),
            fences_held: l(&self.fences_held),
            checkpoints_past_dead: l(&self.checkpoints_past_dead),
            records_carried: l(&self.records_carried),
            rejoins: l(&self.rejoins),
            pages_brought_back: l(&self.pages_brought_back),
            pages_censused: l(&self.pages_censused),
            longest_take_back_ms: l(&self.longest_take_back_ms),
            rejoin_ms: l(&self.rejoin_ms),
            acks_of_fenced: l(&self.acks_of_fenced),
        }
    }
}

/// One node's protocol state, in the parts its files work on: the pages it touched (shared by
/// all), the requester side (workers waiting for answers: `acquire.rs`, `barrier.rs`,
/// `alloc.rs`), the home side (`home.rs`, `pool.rs`) and the transport driver (`handler.rs`,
/// `send.rs`, `failure.rs`).
pub(crate) struct Coherence {
    me: Node,
    nodes: u8,
    pages: Pages,
    waiting: Waiting,
    driver: Driver,
    home: home::Home,
    pool: pool::OnePool,
    barrier: Barrier,
    alloc: RemoteAlloc,
    /// Durability: the log, log fences (`logged.rs`).
    logged: logged::Logged,
    /// Leases on other homes' pages, pings heard (`lease.rs`).
    /// At a take-back, the other live nodes' answers to `Control::Settle` (`rejoin.rs`).
    settles: rejoin::Settles,
    leases: lease::Leases,
}

/// What this node knows of every page it touched through the protocol.
struct Pages {
    shards: Box<[Mutex<HashMap<Pid, PageState>>]>,
    /// Pages whose held messages or due serve the handler must retry.
    retry: Retry,
}

/// The pages a handler round must retry, with their number for pollers that take no lock
/// (every helper and the handler thread ask "anything to retry?" on each poll).
struct Retry {
    set: Mutex<HashSet<Pid>>,
    /// `set.len()`, stored under the lock after each change. Release pairs with the Acquire
    /// of `is_empty`: a poller that sees a count and then takes the lock finds the pages. A
    /// poller that reads 0 while a page is being added saw the set as it was just before
    /// that insert, as a check under the lock at that moment would have.
    len: AtomicUsize,
}

impl Retry {
    fn new() -> Retry {
        Retry {
            set: Mutex::new(HashSet::new()),
            len: AtomicUsize::new(0),
        }
    }

    fn add(&self, pid: Pid) {
        let mut set = self.set.lock();
        set.insert(pid);
        self.len.store(set.len(), Ordering::Release);
    }

    /// Every page to retry (the set is left empty).
    fn take(&self) -> Vec<Pid> {
        if self.is_empty() {
            return Vec::new();
        }
        let mut set = self.set.lock();
        let pages = set.drain().collect();
        self.len.store(0, Ordering::Release);
        pages
    }

    fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    /// A copy of the set (for diagnostics).
    fn pages(&self) -> HashSet<Pid> {
        self.set.lock().clone()
    }
}

impl Pages {
    fn new() -> Pages {
        Pages {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            retry: Retry::new(),
        }
    }

    fn shard(&self, pid: Pid) -> &Mutex<HashMap<Pid, PageState>> {
        let h = (pid.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize;
        &self.shards[h % SHARDS]
    }

    /// Schedule `pid`'s held messages (or due serve) for the handler's next round.
    fn retry_later(&self, pid: Pid) {
        self.retry.add(pid);
    }
}

/// The requester side: how workers wait for answers.
struct Waiting {
    done_mx: Mutex<()>,
    done_cv: Condvar,
    /// How long a worker waits for a remote page before failing.
    timeout: Duration,
    /// How long a worker waiting for an answer polls before it parks (the transport's
    /// `answer_poll`).
    answer_poll: Duration,
}

impl Waiting {
    /// Wake the workers waiting in [`Coherence::acquire`] (and barrier, allocation waits).
    fn notify(&self) {
        let _g = self.done_mx.lock();
        self.done_cv.notify_all();
    }
}

/// The transport driver: the channels, who applies incoming messages, what goes out.
pub(crate) struct Driver {
    pub ch: Channels,
    pub counters: CoherenceCounters,
    pub stop: AtomicBool,
    /// Bit n: node n is dead and the handler has handled everything it sent (a round that
    /// began with n seen dead ended with the inbox and rings empty). Waiters believe a death
    /// only then: a peer's last messages (a barrier arrival, say) may still sit in our rings
    /// when its closed connection is noticed.
    dead_drained: AtomicU64,
    /// The handler role: whoever holds it applies incoming messages (see `handler.rs`).
    role: Mutex<handler::Role>,
    /// Eviction notices and replies waiting to go out in batches, per destination.
    outbox: Outboxes,
    /// Pages whose eviction notice was queued but could not be sent (the handler makes their
    /// copies idle again).
    unsent: Mutex<Vec<Pid>>,
}

impl Coherence {
    pub fn new(ch: Channels, timeout: Duration, one_pool: bool) -> Coherence {
        let nodes = ch.nodes();
        let answer_poll = ch.transport().answer_poll();
        let ch_me = ch.node();
        Coherence {
            me: ch_me,
            nodes,
            pages: Pages::new(),
            waiting: Waiting {
                done_mx: Mutex::new(()),
                done_cv: Condvar::new(),
                timeout,
                answer_poll,
            },
            driver: Driver {
                ch,
                counters: CoherenceCounters::default(),
                stop: AtomicBool::new(false),
                dead_drained: AtomicU64::new(0),
                role: Mutex::new(handler::Role::default()),
                outbox: Outboxes::new(nodes),
                unsent: Mutex::new(Vec::new()),
            },
            home: home::Home::default(),
            pool: pool::OnePool::new(nodes, one_pool),
            barrier: Barrier::default(),
            alloc: RemoteAlloc::default(),
            logged: logged::Logged::new(nodes),
            leases: lease::Leases::new(ch_me, nodes),
            settles: rejoin::Settles::default(),
        }
    }

    /// The transport driver (channels, counters, the stop flag).
    pub fn driver(&self) -> &Driver {
        &self.driver
    }

    /// `EngineConfig::one_pool` of this node.
    pub fn one_pool(&self) -> bool {
        self.pool.enabled
    }

    /// Nodes in the cluster.
    pub fn nodes(&self) -> u8 {
        self.nodes
    }

    fn check_node(&self, pid: Pid) -> Result<(), EngineError> {
        if pid.node() >= self.nodes {
            return Err(EngineError::NoSuchNode {
                pid,
                nodes: self.nodes,
            });
        }
        Ok(())
    }

    /// Unpark the workers parked on a page that just changed (they look at it again).
    fn wake(ps: &mut PageState) {
        for t in ps.parked.drain(..) {
            t.unpark();
        }
    }
}

/// The possession local guards get from a copy in this state.
fn possession_of(c: &PageCopy<FrameIdx>) -> Possession {
    if c.usable(Mode::Exclusive) {
        Possession::Exclusive
    } else if c.usable(Mode::Shared) {
        Possession::Shared
    } else {
        Possession::None
    }
}

/// Whether a message carries a page.
fn msg_has_page<D>(m: &Msg<D>) -> bool {
    match m {
        Msg::Grant(g) => g.data.is_some(),
        Msg::Page { .. } | Msg::Offer { .. } => true,
        Msg::CopyBack { data } | Msg::Evict { data, .. } => data.is_some(),
        _ => false,
    }
}
