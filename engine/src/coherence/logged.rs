//! The protocol's part of durability on a cluster (docs/durability.md, "Clusters"): what a
//! node with a write-ahead log does when pages move.
//!
//! - **A page leaves only once its changes are durable** ([`Coherence::before_page_leaves`]):
//!   before a frame's bytes go to another node, this node's log is made durable up to the
//!   frame's last logged change. A change acknowledged on the next holder builds on this node's
//!   changes; if they could be lost with this node, recovery would find a gap and lose the
//!   acknowledged change (the model check's `the_model_catches_a_page_that_leaves_before_its_log_is_durable`).
//! - **A node that becomes responsible for a page's newest state logs it whole**
//!   ([`Coherence::log_received`]): a page that arrives dirty (handed over exclusively, copied
//!   back or evicted home) is logged as an image at the version it carries, in arrival order.
//!   The sender's records of the page are then needed only until that image is durable.
//! - **Log fences** ([`Coherence::fence_logs`]): a node's checkpoint drops its log's records
//!   before the checkpoint, including records of pages it gave away dirty. It asks every
//!   peer to make its log durable up to everything that peer received before the fence
//!   (`Control::LogFence`, answered by `Control::LogFenced` once durable). Messages from one
//!   node arrive in the order sent, so the receipt images of every page handed over before
//!   the fence are covered.
//! - **Checkpoints past a dead peer** ([`Coherence::carry_for_dead`]): a dead peer answers no
//!   fence, and its log may lack the receipt images of pages this node handed it. Every page
//!   handed over dirty is noted per peer until that peer answers a fence sent after it; a
//!   checkpoint that a dead peer could not fence copies this node's records of the pages noted
//!   for it into the log's carried file (read by every node's recovery) before the redo point
//!   moves past them.
//!
//! It must not know about checkpoints' other steps or the B-tree: it is given frames, page
//! bytes and the log.

use super::protocol::{Msg, Node};
use super::wire::Control;
use super::{Coherence, Data, Receipt};
use crate::buffer::frame::Frame;
use crate::buffer::Buffer;
use crate::durability::Log;
use crate::error::EngineError;
use crate::pid::Pid;
use shoal_messaging::PAGE_BYTES;
use shoal_storage::wal::put_image;
use shoal_storage::PAGE_DATA_SIZE;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

impl Coherence {
    /// This node logs its changes in `log` (durability other than none); `continuous`: its
    /// log writer flushes as soon as anything is complete (durability `commit`), so a page
    /// waiting for its changes to be durable can wait for the writer instead of flushing;
    /// `past_dead`: checkpoints may finish while a peer is dead
    /// (`EngineConfig::checkpoint_past_dead_peers`, [`Coherence::carry_for_dead`]); `logs`:
    /// the paths of every node's log, this one's first (read to bring back pages lost with a
    /// node that died: `rejoin.rs`).
    pub fn attach_log(
        &self,
        log: Arc<Log>,
        continuous: bool,
        past_dead: bool,
        logs: Vec<std::path::PathBuf>,
    ) {
        let _ = self.logged.log.set(log);
        let _ = self.logged.logs.set(logs);
        self.logged
            .continuous
            .store(continuous, std::sync::atomic::Ordering::Relaxed);
        self.logged.past_dead.store(past_dead, Ordering::Relaxed);
    }

    /// Whether `f`'s page may leave now without a flush of its own: no log, its changes are
    /// durable, or (the log writer flushing only on its tick) they were just made durable
    /// here. `false`: they will be soon (the log writer flushes continuously); the caller
    /// holds the message and tries again, rather than wait for a flush while it holds the
    /// handler's role. Not a guarantee: the frame may change before it is latched, and
    /// [`Coherence::before_page_leaves`] makes it one.
    pub(super) fn durable_soon(&self, f: &Frame) -> bool {
        let Some(log) = self.log() else {
            return true;
        };
        if log.durable() >= f.lsn() {
            return true;
        }
        if self.logged.continuous.load(Ordering::Relaxed) {
            self.driver
                .counters
                .held_for_log
                .fetch_add(1, Ordering::Relaxed);
            log.hurry();
            return false;
        }
        self.before_page_leaves(f).is_ok()
    }

    /// The log, if this node has one.
    pub(crate) fn log(&self) -> Option<&Arc<Log>> {
        self.logged.log.get()
    }

    /// The paths of every node's log, this one's first (empty without a log).
    pub(super) fn logs(&self) -> &[std::path::PathBuf] {
        self.logged.logs.get().map_or(&[], |v| v.as_slice())
    }

    /// The write-ahead rule for pages that leave: the log is durable up to the last logged
    /// change of `f`'s page before its bytes go to another node. An error means the page must
    /// not leave (its changes could be lost while the next holder builds on them).
    pub(super) fn before_page_leaves(&self, f: &Frame) -> Result<(), EngineError> {
        let Some(log) = self.log() else {
            return Ok(());
        };
        let lsn = f.lsn();
        if log.durable() >= lsn {
            return Ok(());
        }
        self.driver
            .counters
            .flushes_before_send
            .fetch_add(1, Ordering::Relaxed);
        log.flush_to(lsn)?;
        Ok(())
    }

    /// A message from another node that makes this node responsible for the newest state of
    /// `pid` (a page handed over dirty, copied back or evicted home with its bytes) logs the
    /// page whole at the version it carries; where the image is, for
    /// [`Coherence::relog_received`].
    ///
    /// Except a page evicted home while the log is nearly full ([`Log::tight`]: this node's
    /// checkpoint cannot finish yet, e.g. it waits for a peer's log fence): it is not logged
    /// and the eviction is declined ([`Receipt::Declined`]); the evicting node keeps its copy
    /// and its own log keeps the changes. Evictions are the one arrival nobody waits for and
    /// whose number this node does not bound (its workers' requests bound the others), so
    /// logging them would take the room the checkpoint needs to finish, and then every
    /// append, this node's message handler's too, would wait for a checkpoint that waits for
    /// the handler (to apply the fence answers): a stall for good.
    pub(super) fn log_received<D>(
        &self,
        pid: Pid,
        msg: &Msg<D>,
        page: &[u8; PAGE_BYTES],
    ) -> Receipt {
        let Some(log) = self.log() else {
            return Receipt::Nothing;
        };
        if !carries_newest(msg) {
            return Receipt::Nothing;
        }
        if matches!(msg, Msg::Evict { .. }) && log.tight() {
            return Receipt::Declined;
        }
        match self.log_image(log, pid, page) {
            Ok(at) => {
                self.driver
                    .counters
                    .logged_on_arrival
                    .fetch_add(1, Ordering::Relaxed);
                Receipt::Logged(at)
            }
            // the sender's records still hold the page: its checkpoint waits for our fence
            // answer, which a failed log never gives
            Err(e) => {
                log::error!(
                    "node {}: logging {pid} received from another node failed: {e}",
                    self.me
                );
                Receipt::Nothing
            }
        }
    }

    /// A message whose page was logged on arrival at `logged` (its chunk's LSN; 0: none)
    /// was just applied: the page is in a frame (dirty) or written to the store. If a
    /// checkpoint began after the receipt, that checkpoint may have looked for dirty frames
    /// before this one became dirty, and then drops the receipt with the log before it: the
    /// page's newest state would be in no log and not in the store. The image is logged
    /// again, after the checkpoint's start.
    pub(super) fn relog_received(&self, pid: Pid, logged: Receipt, page: &[u8; PAGE_BYTES]) {
        let Some(log) = self.log() else { return };
        let Receipt::Logged(logged) = logged else {
            return;
        };
        // SeqCst fence, paired with the one in `Log::begin_checkpoint` after the checkpoint's
        // start is published (the store-buffer pattern): either this load sees the new
        // start, or that checkpoint's search for dirty frames (after its fence) sees the
        // frame this message just made dirty. Both may happen: then the page is logged twice.
        std::sync::atomic::fence(Ordering::SeqCst);
        if log.checkpoint_start() <= logged {
            return; // the receipt is after every checkpoint's start: it stays in the log
        }
        match self.log_image(log, pid, page) {
            Ok(_) => {
                self.driver
                    .counters
                    .relogged_after_checkpoint
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => log::error!(
                "node {}: logging {pid} again after a checkpoint failed: {e}",
                self.me
            ),
        }
    }

    /// Log `page` (of `pid`) whole at the version it carries; returns its chunk's LSN.
    fn log_image(&self, log: &Log, pid: Pid, page: &[u8; PAGE_BYTES]) -> Result<u64, EngineError> {
        let version = shoal_storage::version(page);
        let mut buf = Vec::with_capacity(PAGE_DATA_SIZE + 64);
        let (at, _) = log.append(&mut buf, |_, b| {
            put_image(b, pid.slot(), pid.raw(), version, &page[..PAGE_DATA_SIZE])
        })?;
        Ok(at)
    }

    /// A peer's `LogFence`: answer once our log is durable up to everything placed in it so
    /// far (every page that peer handed over before the fence arrived is logged by now).
    pub(super) fn on_log_fence(&self, from: Node, seq: u64) {
        if let Some(log) = self.log() {
            if let Err(e) = log.flush_to(log.tail()) {
                log::error!("node {}: a log fence for node {from} failed: {e}", self.me);
                return; // no answer: the peer's checkpoint fails and is retried
            }
        }
        self.send_control(from, &Control::LogFenced { seq });
    }

    /// A message just sent to `to` (or tried) made `to` responsible for `pid`'s newest state:
    /// noted until `to` answers a log fence sent after it (see [`Coherence::carry_for_dead`]).
    pub(super) fn note_handed<D>(&self, to: Node, pid: Pid, msg: &Msg<D>) {
        if to == self.me || self.log().is_none() || !carries_newest(msg) {
            return;
        }
        // SeqCst, with the `fetch_add` in `fence_logs`: the message left before this load. If
        // the load sees fence `s - 1`, fence `s` was numbered after it, and its `LogFence`
        // left after the page (one connection keeps its order): an answer to `s` covers
        // the page. A load that sees `s` needs an answer to `s + 1` (later, never wrong).
        let mark = self.logged.fence_seq.load(Ordering::SeqCst);
        // (a note kept for good, `note_kept_for`, stays so)
        let mut handed = self.logged.handed[to as usize].lock();
        let m = handed.entry(pid).or_insert(mark);
        *m = (*m).max(mark);
    }

    /// `pid`'s newest state stays in this node's log for `dead` (a dirty copy of a page homed
    /// on `dead`, dropped because it can never go home): carried over at every checkpoint
    /// (a dead node answers no fence that would drop the note).
    pub(super) fn note_kept_for(&self, dead: Node, pid: Pid) {
        if self.log().is_some() {
            self.logged.handed[dead as usize]
                .lock()
                .insert(pid, u64::MAX);
        }
    }

    /// `peer` restarted and is being taken back (`rejoin.rs`), and will recover from this
    /// node's log: from now on no checkpoint finishes here until it answers a log fence (see
    /// `Logged::recovering`); returns once a checkpoint finishing now is done.
    pub(super) fn hold_checkpoints_for(&self, peer: Node) {
        let connection = self.driver.ch.transport().connection(peer);
        self.logged.recovering.lock()[peer as usize] = Some(Recovering {
            since: std::time::Instant::now(),
            connection,
        });
        drop(self.logged.finishing.lock());
    }

    /// Run `finish` (the end of a checkpoint, which moves the log's start) unless a restarted
    /// peer is recovering from this node's log (see `Logged::recovering`).
    pub fn finish_checkpoint_unless_recovering<T>(
        &self,
        finish: impl FnOnce() -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let _finishing = self.logged.finishing.lock();
        let recovering = self
            .logged
            .recovering
            .lock()
            .iter()
            .enumerate()
            .find_map(|(n, r)| {
                r.filter(|r| self.still_recovering(n as Node, r))
                    .map(|_| n as Node)
            });
        match recovering {
            Some(node) => Err(EngineError::PeerRecovering { node }),
            None => finish(),
        }
    }

    /// Whether restarted node `peer`, held for as `r` says, may still be reading this node's
    /// log: its connection taken back still runs, or it is not connected yet (the others'
    /// welcomes may take a while) and the remote timeout has not passed since. Not once that
    /// connection died: that incarnation reads nothing any more (a node killed again and again
    /// held every checkpoint here until the log was full).
    fn still_recovering(&self, peer: Node, r: &Recovering) -> bool {
        let now = self.driver.ch.transport().connection(peer);
        if now == r.connection {
            r.since.elapsed() < self.waiting.timeout
        } else {
            now == r.connection + 1 && self.driver.ch.peer_alive(peer)
        }
    }

    /// `peer` restarted and is being taken back (`rejoin.rs`): the pages noted for its old
    /// incarnation, also those kept for good, are dropped once the new one answers a fence
    /// numbered after now (it answers only once its recovery, which reads our log, is done);
    /// until then they are carried over if it dies again.
    pub(super) fn renote_for_rejoin(&self, peer: Node) {
        // SeqCst: as in `note_handed`
        let mark = self.logged.fence_seq.load(Ordering::SeqCst);
        for m in self.logged.handed[peer as usize].lock().values_mut() {
            *m = mark;
        }
    }

    /// A peer answered our fence `seq`: the pages handed it before that fence are logged
    /// there, durably.
    pub(super) fn on_log_fenced(&self, from: Node, seq: u64) {
        // a restarted peer answers only once its recovery is done
        self.logged.recovering.lock()[from as usize] = None;
        self.logged.fenced[from as usize].fetch_max(seq, Ordering::AcqRel);
        self.logged.handed[from as usize]
            .lock()
            .retain(|_, mark| *mark >= seq);
        self.waiting.notify();
    }

    /// Every live peer's log is durable up to every page this node handed it before the
    /// call (see the module's doc). Returns the peers that are dead and did not answer (the
    /// caller carries its records for them: [`Coherence::carry_for_dead`]). Fails if a live
    /// peer does not answer within `limit`.
    pub fn fence_logs(&self, buf: &Buffer, limit: Duration) -> Result<Vec<Node>, EngineError> {
        let seq = self.logged.fence_seq.fetch_add(1, Ordering::SeqCst) + 1;
        let alive = |n: Node| self.driver.ch.peer_alive(n);
        let (mut peers, mut dead) = (Vec::new(), Vec::new());
        for n in (0..self.nodes).filter(|&n| n != self.me) {
            if !alive(n) {
                dead.push(n);
                continue;
            }
            match self.try_send_control(n, &Control::LogFence { seq }) {
                Ok(()) => peers.push(n),
                Err(EngineError::PeerDead { .. }) => dead.push(n),
                Err(e) => return Err(e),
            }
        }
        let answered = |n: Node| self.logged.fenced[n as usize].load(Ordering::Acquire) >= seq;
        let r = self.wait_until(
            buf,
            limit,
            || {
                peers
                    .iter()
                    .all(|&n| answered(n) || !alive(n))
                    .then_some(())
            },
            || None,
        )?;
        if r.is_none() {
            return Err(EngineError::FenceTimeout {
                late: peers.iter().copied().filter(|&n| !answered(n)).collect(),
                ms: limit.as_millis() as u64,
            });
        }
        dead.extend(peers.into_iter().filter(|&n| !answered(n)));
        Ok(dead)
    }

    /// A checkpoint that began at LSN `c` and whose log fence the `dead` peers could not
    /// answer: their logs may lack the receipt images of pages this node handed them, so this
    /// node's records of those pages before `c` are its only durable copy, and the redo point
    /// is about to move past them. They are added to the log's carried file (synced), which
    /// every node's recovery reads after the log (`shoal_storage::wal::carried`). Returns how
    /// many records were carried. The log must be durable past `c`.
    /// Without `EngineConfig::checkpoint_past_dead_peers`, fails (`PeerDead`, naming the
    /// first): the checkpoint keeps the log.
    pub fn carry_for_dead(&self, dead: &[Node], c: u64) -> Result<u64, EngineError> {
        let Some(log) = self.log() else {
            return Ok(0);
        };
        if !self.logged.past_dead.load(Ordering::Relaxed) {
            if let Some(&node) = dead.first() {
                return Err(EngineError::PeerDead { node });
            }
        }
        let mut pages: HashSet<u64> = HashSet::new();
        for &n in dead {
            pages.extend(
                self.logged.handed[n as usize]
                    .lock()
                    .keys()
                    .map(|p| p.raw()),
            );
        }
        let records = if pages.is_empty() {
            Vec::new()
        } else {
            shoal_storage::wal::carried::page_records_before(log.path(), c, |pid| {
                pages.contains(&pid)
            })?
        };
        let n = records.len() as u64;
        if n > 0 {
            shoal_storage::wal::carried::append_carried(log.path(), records)?;
        }
        let counters = &self.driver.counters;
        counters
            .checkpoints_past_dead
            .fetch_add(1, Ordering::Relaxed);
        counters.records_carried.fetch_add(n, Ordering::Relaxed);
        log::info!(
            "node {}: checkpoint at LSN {c} past dead node(s) {dead:?}: {n} records of the {} \
             pages handed them carried over",
            self.me,
            pages.len()
        );
        Ok(n)
    }

    /// A checkpoint's part for pages that arrived dirty and wait, held, for a frame: each is
    /// logged whole again (after the checkpoint's start), as its receipt image is about to be
    /// dropped with the log before the checkpoint. Returns how many.
    pub fn log_held_pages(&self) -> Result<u64, EngineError> {
        let Some(log) = self.log() else {
            return Ok(0);
        };
        let mut n = 0;
        let mut buf = Vec::with_capacity(PAGE_DATA_SIZE + 64);
        for shard in self.pages.shards.iter() {
            let shard = shard.lock();
            for (pid, ps) in shard.iter() {
                for note in &ps.held {
                    let page = match &note.msg {
                        Msg::Page {
                            data: Data::Bytes(b),
                            dirty: true,
                        }
                        | Msg::CopyBack {
                            data: Some(Data::Bytes(b)),
                        }
                        | Msg::Evict {
                            data: Some(Data::Bytes(b)),
                            ..
                        } => b,
                        _ => continue,
                    };
                    let version = shoal_storage::version(page);
                    log.append(&mut buf, |_, b| {
                        put_image(b, pid.slot(), pid.raw(), version, &page[..PAGE_DATA_SIZE])
                    })?;
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// Whether `pid` is noted as handed to `to` (tests).
    #[cfg(test)]
    pub(super) fn noted_for(&self, to: Node, pid: Pid) -> bool {
        self.logged.handed[to as usize].lock().contains_key(&pid)
    }

    /// The wait a log fence gets (the remote timeout).
    pub fn fence_limit(&self) -> Duration {
        self.waiting.timeout
    }
}

/// The state of [`Coherence`]'s durability part.
pub(super) struct Logged {
    log: std::sync::OnceLock<Arc<Log>>,
    /// Every node's log, this one's first (`attach_log`).
    logs: std::sync::OnceLock<Vec<std::path::PathBuf>>,
    /// Our last fence's number.
    fence_seq: std::sync::atomic::AtomicU64,
    /// Per peer: the highest fence of ours it answered.
    fenced: Vec<std::sync::atomic::AtomicU64>,
    /// Per peer: the pages it was made responsible for (handed dirty) and our last fence's
    /// number when each left; dropped once the peer answers a later fence.
    handed: Vec<parking_lot::Mutex<HashMap<Pid, u64>>>,
    /// The log writer flushes continuously (durability `commit`).
    continuous: std::sync::atomic::AtomicBool,
    /// Checkpoints may finish while a peer is dead (`carry_for_dead`).
    past_dead: std::sync::atomic::AtomicBool,
    /// Per peer: when this node took it back as a restarted node (`rejoin.rs`), until it
    /// answers a log fence (its recovery, which reads this node's log, is done by then).
    /// Meanwhile no checkpoint here finishes (moves the log's start: the reader would find
    /// its records overwritten), unless the connection taken back died, or never came within
    /// the remote timeout (`Coherence::still_recovering`).
    recovering: parking_lot::Mutex<Vec<Option<Recovering>>>,
    /// Held by a checkpoint from its look at `recovering` to its end, and taken by a rejoin
    /// after it marked its peer: no checkpoint that missed the mark is still finishing.
    finishing: parking_lot::Mutex<()>,
}

/// A restarted node that may be reading this node's log (`Logged::recovering`).
#[derive(Clone, Copy)]
pub(super) struct Recovering {
    /// When this node took it back.
    since: std::time::Instant,
    /// Its connection number then (`Transport::connection`): the one taken back is the next.
    connection: u64,
}

impl Logged {
    pub(super) fn new(nodes: u8) -> Logged {
        Logged {
            log: std::sync::OnceLock::new(),
            logs: std::sync::OnceLock::new(),
            fence_seq: Default::default(),
            fenced: (0..nodes).map(|_| Default::default()).collect(),
            handed: (0..nodes).map(|_| Default::default()).collect(),
            continuous: Default::default(),
            past_dead: Default::default(),
            recovering: parking_lot::Mutex::new(vec![None; nodes as usize]),
            finishing: parking_lot::Mutex::new(()),
        }
    }
}

/// `msg` makes its receiver responsible for the newest state of its page (a page handed over
/// dirty, copied back or evicted home with its bytes): the receiver logs it whole.
fn carries_newest<D>(msg: &Msg<D>) -> bool {
    match msg {
        Msg::Page { dirty, .. } => *dirty,
        Msg::CopyBack { data } | Msg::Evict { data, .. } => data.is_some(),
        _ => false,
    }
}
