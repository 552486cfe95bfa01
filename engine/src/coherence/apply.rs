//! Applying one message to a page, under the latches of the page's frames: this node's copy
//! and, at the home, the home copy. A message that cannot be applied now (a latched frame, no
//! free frame, a page reserved for the worker that asked) is held and retried later.

use super::directory::EvictDecision;
use super::possession::{Deferred, Pending, Step};
use super::protocol::{Grant, Msg, ProtocolError};
use super::wire::REFUSE_HOLDER_DEAD;
use super::{possession_of, Coherence, Data, Note, PageState, Receipt};
use crate::buffer::{Buffer, FrameIdx, HeldFrame, Possession};
use crate::error::EngineError;
use crate::pid::Pid;
use shoal_messaging::PAGE_BYTES;
use shoal_storage::{AlignedPage, PAGE_DATA_SIZE};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What applying a message came to.
pub(super) enum Outcome {
    Done,
    /// Not applicable now: held, retried later.
    Stuck(Note),
}

/// Frames the handler holds exclusively while it applies a message.
#[derive(Default)]
pub(super) struct Latched<'b> {
    frames: Vec<HeldFrame<'b>>,
    /// The frame the translation table maps the page to, when it is one of `frames` (looked
    /// up once per message by `latch_for`, updated when a frame is added for the page).
    pub(super) resident: Option<FrameIdx>,
}

impl<'b> Latched<'b> {
    /// Hold frame `idx` if it still holds `pid` (or is held already).
    fn try_take(&mut self, buf: &'b Buffer, idx: FrameIdx, pid: Pid) -> bool {
        if self.frames.iter().any(|h| h.idx() == idx) {
            return true;
        }
        match buf.try_hold(idx, pid) {
            Some(h) => {
                self.frames.push(h);
                true
            }
            None => false,
        }
    }

    /// A frame held here. Panics if it is not: every frame the handler reads or writes was
    /// latched first (an invariant, not an input).
    pub(super) fn get(&self, idx: FrameIdx) -> &HeldFrame<'b> {
        self.frames
            .iter()
            .find(|h| h.idx() == idx)
            .unwrap_or_else(|| panic!("{idx} is not latched by the handler"))
    }

    fn get_mut(&mut self, idx: FrameIdx) -> &mut HeldFrame<'b> {
        self.frames
            .iter_mut()
            .find(|h| h.idx() == idx)
            .unwrap_or_else(|| panic!("{idx} is not latched by the handler"))
    }

    pub(super) fn push(&mut self, h: HeldFrame<'b>) {
        self.frames.push(h);
    }
}

/// How long local guards may go on changing a copy whose hand-over waits for the log writer
/// before new guards are kept away (see `apply`).
pub(super) const LOG_HOLD_MAX: Duration = Duration::from_millis(1);

impl Coherence {
    /// Apply what can be applied for `pid`. Returns true if something is still waiting.
    pub(super) fn progress(&self, buf: &Buffer, pid: Pid, ps: &mut PageState) -> bool {
        if ps.serve_due && !ps.reserved_now() {
            let mut l = Latched::default();
            if !self.latch_for(buf, pid, ps, &mut l) {
                self.release(pid, ps, l);
                return true;
            }
            self.sync_dirty(buf, pid, ps);
            match ps.copy.served() {
                Ok(step) => self.effects(pid, ps, step, &mut l),
                Err(e) => log::error!("node {}: {pid}: {e}", self.me),
            }
            ps.serve_due = false;
            self.release(pid, ps, l);
        }
        // Apply held messages in arrival order, except that a message that cannot be applied
        // yet holds back only the later messages *from the same sender*. Transports keep order
        // per sender only, so letting another sender's message pass is an arrival order that
        // could have happened anyway (the model explores every order). Holding everything behind
        // one stuck message was a cluster-wide stall: a home's own request waiting for a free
        // frame blocked the eviction notices of other nodes for the same page, whose frames were
        // what would have become free (docs/protocol.md, "Eviction never waits for a frame").
        let mut blocked: u64 = 0;
        let mut i = 0;
        while i < ps.held.len() {
            let from = ps.held[i].from;
            if blocked & (1u64 << from) != 0 {
                i += 1;
                continue;
            }
            let note = ps.held.remove(i).expect("index checked by the loop");
            match self.apply(buf, pid, ps, note) {
                Ok(Outcome::Done) => {
                    // an applied message may unblock an earlier one (and a copy-back puts the
                    // directory's deferred requests first): look again from the start
                    blocked = 0;
                    i = 0;
                }
                Ok(Outcome::Stuck(n)) => {
                    self.driver.counters.held.fetch_add(1, Ordering::Relaxed);
                    ps.held.insert(i, n);
                    blocked |= 1u64 << from;
                    i += 1;
                }
                Err(e) => {
                    log::error!("node {}: page {pid}: {e}", self.me);
                    ps.error = Some(EngineError::ProtocolViolation { pid, why: e.0 });
                    blocked = 0;
                    i = 0;
                }
            }
        }
        if matches!(ps.store_copy, super::StoreCopy::Read { .. }) {
            // a store read serves the requests of the pass it arrived for; pages are not kept
            ps.store_copy = super::StoreCopy::None;
        }
        if let Some(dead) = self.dead_source(ps) {
            // a grant naming a node that already died (the sweep for that death is over):
            // nobody else would end the wait if no worker waits here now (found by the model
            // with deaths)
            self.lose(buf, pid, ps, dead);
        }
        if ps.held.is_empty() {
            // Give the emptied queue's buffer back while it is in cache: the next message, for
            // whichever page, then gets a warm buffer from the allocator, where keeping this
            // one would miss the cache when a message for this page comes again (the page
            // states of every page touched are many, and cold). YCSB-C on 2 nodes: +8%
            // (docs/BENCHMARKS.md, "Remote-miss CPU").
            ps.held = std::collections::VecDeque::new();
        }
        !ps.held.is_empty() || ps.serve_due
    }

    /// Latch this node's copy frame and (at the home) the home's frame. Elsewhere the table's
    /// frame for the page is the copy's frame, so `l.resident` is known either way.
    fn latch_for<'b>(
        &self,
        buf: &'b Buffer,
        pid: Pid,
        ps: &PageState,
        l: &mut Latched<'b>,
    ) -> bool {
        if let Some(f) = ps.copy.data {
            if !l.try_take(buf, f, pid) {
                return false;
            }
        }
        l.resident = if pid.node() == self.me {
            let h = buf.resident_frame(pid);
            if let Some(h) = h {
                if !l.try_take(buf, h, pid) {
                    return false;
                }
            }
            h
        } else {
            ps.copy.data
        };
        true
    }

    /// The frames are done with: the copy's frame gets its possession, a home copy none, any
    /// other frame (a copy this node dropped) is freed.
    fn release(&self, pid: Pid, ps: &PageState, l: Latched<'_>) {
        let home = pid.node() == self.me;
        for h in l.frames {
            if ps.copy.data == Some(h.idx()) {
                h.frame().set_possession(possession_of(&ps.copy));
            } else if home {
                h.frame().set_possession(Possession::None);
            } else {
                h.drop_page();
            }
        }
    }

    /// A guard may have written the page since the copy arrived: the copy is then newer than
    /// the home's.
    fn sync_dirty(&self, buf: &Buffer, pid: Pid, ps: &mut PageState) {
        if pid.node() != self.me {
            if let Some(f) = ps.copy.data {
                if buf.frame(f).is_dirty() {
                    ps.copy.mark_dirty();
                }
            }
        }
    }

    /// Put `bytes` into this node's frame of `pid` (the home's frame when there is one, else a
    /// free frame, latched and added to `l`). `None` when no frame is free.
    pub(super) fn install<'b>(
        &self,
        buf: &'b Buffer,
        pid: Pid,
        bytes: &[u8; PAGE_BYTES],
        l: &mut Latched<'b>,
    ) -> Option<FrameIdx> {
        let home = pid.node() == self.me;
        let idx = match l.resident {
            Some(i) => i,
            None => {
                let h = buf.take_frame_for(pid)?;
                let i = h.idx();
                l.push(h);
                l.resident = Some(i);
                i
            }
        };
        let h = l.get_mut(idx);
        let data: &[u8; PAGE_DATA_SIZE] =
            bytes[..PAGE_DATA_SIZE].try_into().expect("page data area");
        h.page_mut().copy_in(data);
        h.set_version(shoal_storage::version(bytes));
        // at the home the page may be newer than the store; elsewhere the store is not ours
        h.frame().set_dirty(home);
        h.frame().touch(buf.clock());
        Some(idx)
    }

    /// Write `bytes` as the home copy of `pid` straight to the store (an evicted or copied-back
    /// page arriving when no frame is free). Only for a page without a frame here (`l.resident`
    /// is none): the provider writes only resident frames and finishes a frame's write before
    /// dropping it, and only this thread gives a home page a frame, so no other write of the
    /// slot can be in flight, nor start, before this one completes.
    pub(super) fn write_home(
        &self,
        buf: &Buffer,
        pid: Pid,
        bytes: &[u8; PAGE_BYTES],
        l: &Latched<'_>,
    ) -> Result<(), EngineError> {
        assert!(
            pid.node() == self.me && l.resident.is_none(),
            "write_home: {pid} must be homed here and have no frame"
        );
        let mut page = AlignedPage::new();
        page[..PAGE_DATA_SIZE].copy_from_slice(&bytes[..PAGE_DATA_SIZE]);
        shoal_storage::set_version(&mut page, shoal_storage::version(bytes));
        let mut req = [shoal_storage::WriteRequest {
            slot: pid.slot(),
            pid: pid.raw(),
            page: &mut page,
        }];
        let r = buf.store().write_batch(&mut req).pop();
        r.expect("one result per request")?;
        buf.counters.writebacks.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn apply(
        &self,
        buf: &Buffer,
        pid: Pid,
        ps: &mut PageState,
        note: Note,
    ) -> Result<Outcome, ProtocolError> {
        if ps.census.is_some() {
            // the home asks where the page is (`rejoin.rs`): nothing about it changes here
            // until the answers are in
            return Ok(Outcome::Stuck(note));
        }
        if let Some(dead) = ps.lost {
            match note.msg {
                Msg::Transfer { want, epoch, keep } => self.answer_lost(
                    pid,
                    dead,
                    Deferred::Transfer {
                        to: note.from,
                        want,
                        epoch,
                        keep,
                    },
                ),
                Msg::Invalidate { epoch } => self.answer_lost(
                    pid,
                    dead,
                    Deferred::Invalidate {
                        from: note.from,
                        epoch,
                    },
                ),
                Msg::Reclaim { epoch } => self.answer_lost(pid, dead, Deferred::Reclaim { epoch }),
                Msg::Evict { .. } if note.from != self.me => {
                    // the page is lost at the evicting node too: it drops its copy and answers
                    // what waits there (a plain "accepted" is a protocol violation when an
                    // invalidation waits for that copy; found by the model with deaths)
                    self.send_refusal(note.from, pid, REFUSE_HOLDER_DEAD, dead)
                }
                Msg::Request { .. } if note.from != self.me => {
                    self.send_refusal(note.from, pid, REFUSE_HOLDER_DEAD, dead)
                }
                Msg::Offer { .. } => {
                    // not for a page lost here: declined (the home waits for the answer)
                    let no = Msg::<()>::OfferReply { accepted: false };
                    if let Err(e) = self.send(note.from, pid, &no, None) {
                        log::warn!("node {}: {e}", self.me);
                    }
                }
                _ => {}
            }
            if ps.copy.pending != Pending::Idle || !ps.copy.deferred.is_empty() {
                // the page was marked lost (at its home, by another node's report) while
                // this copy was busy: end it, answer what waits behind it (found by the model
                // with deaths)
                self.lose(buf, pid, ps, dead);
            }
            return Ok(Outcome::Done);
        }
        if let Msg::Transfer { keep: false, .. } = note.msg {
            if note.from != self.me && !self.driver.ch.peer_alive(note.from) {
                // a hand-over to a node that died: the page would die with it. Kept here
                // instead; the home reclaims it once that node is fenced (`after_fence`)
                log::warn!(
                    "node {}: {pid}: not handed to node {}, which died; kept for its home",
                    self.me,
                    note.from
                );
                return Ok(Outcome::Done);
            }
        }
        let takes = matches!(
            note.msg,
            Msg::Transfer { .. } | Msg::Invalidate { .. } | Msg::Reclaim { .. }
        );
        if takes && ps.reserved_now() {
            return Ok(Outcome::Stuck(note));
        }
        if let (Msg::Transfer { .. } | Msg::Reclaim { .. }, Some(f)) = (&note.msg, ps.copy.data) {
            // our copy leaves: held (the handler goes on) until the log writer has made its
            // changes durable, instead of a flush under the handler's role. Local guards may
            // go on changing it for a while (their changes travel with it), but not for
            // longer than `LOG_HOLD_MAX`: then no new guard takes the copy (as while waiting
            // for its latch, below). Else a hot page written on here all the time is never
            // durable up to its last change, and the requester waits behind this node's
            // workers (YCSB-A on 2 nodes with a log: one node at 3,000 operations a second,
            // the other at 1.6M; docs/BENCHMARKS.md, "Durability on clusters")
            if !self.durable_soon(buf.frame(f)) {
                let since = *ps.log_hold_since.get_or_insert_with(Instant::now);
                if !ps.revoking && since.elapsed() >= LOG_HOLD_MAX {
                    ps.revoking = true;
                    buf.frame(f).revoke_possession();
                }
                return Ok(Outcome::Stuck(note));
            }
            ps.log_hold_since = None;
        }
        let mut l = Latched::default();
        if !self.latch_for(buf, pid, ps, &mut l) {
            self.release(pid, ps, l);
            if takes && !ps.revoking {
                ps.revoking = true;
                if let Some(f) = ps.copy.data {
                    buf.frame(f).revoke_possession();
                }
            }
            return Ok(Outcome::Stuck(note));
        }
        if takes {
            ps.revoking = false;
            ps.log_hold_since = None;
        }
        let r = self.apply_latched(buf, pid, ps, note, &mut l);
        self.release(pid, ps, l);
        r
    }

    fn apply_latched<'b>(
        &self,
        buf: &'b Buffer,
        pid: Pid,
        ps: &mut PageState,
        note: Note,
        l: &mut Latched<'b>,
    ) -> Result<Outcome, ProtocolError> {
        let (from, logged) = (note.from, note.logged);
        let step = match note.msg {
            Msg::Request { .. } => return self.home_request(buf, pid, ps, note, l),
            Msg::Evict { epoch, ref data } => {
                let mut d = ps.dir;
                let mut dec = d.evict(from, epoch, data.is_some())?;
                if matches!(dec, EvictDecision::Accept { store: true })
                    && logged == Receipt::Declined
                {
                    // not logged on arrival, the log being nearly full (`log_received`): the
                    // holder keeps the page, nothing changes
                    self.driver
                        .counters
                        .evictions_declined_for_log
                        .fetch_add(1, Ordering::Relaxed);
                    d = ps.dir;
                    dec = EvictDecision::Decline;
                }
                if let (EvictDecision::Accept { store: true }, Some(Data::Bytes(b))) = (dec, data) {
                    // the home's copy changes: a store read in flight is stale
                    ps.home_gen += 1;
                    // Never wait for a frame here: the evicting node's frame is what may become
                    // free. Without one, the page goes straight to the store.
                    if self.install(buf, pid, b, l).is_none() {
                        if let Err(e) = self.write_home(buf, pid, b, l) {
                            // keep the page where it is (the holder keeps it, nothing changes)
                            log::warn!(
                                "node {}: writing {pid} evicted by node {from}: {e}; declined",
                                self.me
                            );
                            d = ps.dir;
                            dec = EvictDecision::Decline;
                        }
                    }
                    if matches!(dec, EvictDecision::Accept { .. }) {
                        self.relog_received(pid, logged, b);
                    }
                }
                ps.dir = d;
                let accepted = matches!(dec, EvictDecision::Accept { .. });
                if accepted {
                    // a request may wait for a dead holder's page to be reclaimed
                    // (`home_request`): the page is home now
                    self.requeue_deferred(ps);
                }
                if let Err(e) = self.send(from, pid, &Msg::<()>::EvictReply { accepted }, None) {
                    log::warn!("node {}: {e}", self.me);
                }
                return Ok(Outcome::Done);
            }
            Msg::CopyBack { ref data } => {
                let mut d = ps.dir;
                d.copy_back(from)?;
                if let Some(Data::Bytes(b)) = data {
                    // as for an eviction: a store read in flight is stale; no frame, then
                    // straight to the store
                    ps.home_gen += 1;
                    if self.install(buf, pid, b, l).is_none() {
                        if let Err(e) = self.write_home(buf, pid, b, l) {
                            log::warn!(
                                "node {}: writing {pid} copied back by node {from}: {e}; retrying",
                                self.me
                            );
                            return Ok(Outcome::Stuck(note));
                        }
                    }
                    self.relog_received(pid, logged, b);
                }
                ps.dir = d;
                self.requeue_deferred(ps);
                return Ok(Outcome::Done);
            }
            Msg::Grant(ref g) => {
                let data = match &g.data {
                    None => None,
                    Some(Data::Bytes(b)) => match self.install(buf, pid, b, l) {
                        Some(i) => Some(i),
                        None => return Ok(Outcome::Stuck(note)),
                    },
                    Some(Data::Home) => {
                        return Err(ProtocolError(
                            "a grant sent through the inbox names the home copy".into(),
                        ))
                    }
                };
                ps.page_from = g.source;
                ps.copy.on_grant(Grant {
                    mode: g.mode,
                    epoch: g.epoch,
                    data,
                    source: g.source,
                    invalidate: g.invalidate,
                    source_keeps: g.source_keeps,
                })?
            }
            Msg::Page { ref data, dirty } => {
                let Data::Bytes(b) = data else {
                    return Err(ProtocolError("a page message without a page".into()));
                };
                let fresh = l.resident.is_none();
                match self.install(buf, pid, b, l) {
                    Some(i) => {
                        if fresh && !dirty && pid.node() == self.me {
                            // Our own page, clean, into a new home frame: without a frame here
                            // the store holds the home copy, and a clean copy equals it, so
                            // the frame needs no write-back (a forwarded read, typically).
                            l.get(i).frame().set_dirty(false);
                        }
                        let step = ps.copy.on_page(i, dirty)?;
                        if ps.copy.dirty && pid.node() != self.me {
                            // our (exclusive) copy is now the page's newest state: the frame
                            // says so, so that a checkpoint logs it and an eviction carries
                            // it home (a shared copy of a dirty page is not ours to carry)
                            l.get(i).frame().set_dirty(true);
                        }
                        self.relog_received(pid, logged, b);
                        step
                    }
                    None => return Ok(Outcome::Stuck(note)),
                }
            }
            Msg::Transfer { want, epoch, keep } => {
                self.sync_dirty(buf, pid, ps);
                ps.copy.on_transfer(from, want, epoch, keep)?
            }
            Msg::Invalidate { epoch } => {
                self.sync_dirty(buf, pid, ps);
                ps.copy.on_invalidate(from, epoch)?
            }
            Msg::Reclaim { epoch } => {
                self.sync_dirty(buf, pid, ps);
                ps.copy.on_reclaim(epoch)?
            }
            Msg::Gone => {
                if let Some(g) = ps.dir.gone(from) {
                    log::error!(
                        "node {}: page {pid} is lost: node {from} had handed it to node {g}, which died",
                        self.me
                    );
                    self.mark_lost_home(pid, ps, g);
                } else {
                    // through a chain: the live holder holds the page again (its request
                    // asking again, if any, now finds it lost)
                    self.requeue_deferred(ps);
                    if !ps.held.is_empty() {
                        self.pages.retry_later(pid);
                    }
                }
                return Ok(Outcome::Done);
            }
            Msg::InvalidateAck => ps.copy.on_invalidate_ack(from)?,
            Msg::Offer { epoch, ref data } => {
                let Data::Bytes(b) = data else {
                    return Err(ProtocolError("an offer without a page".into()));
                };
                if pid.node() == self.me || from != pid.node() {
                    return Err(ProtocolError(format!(
                        "node {from} offered {pid}, which only its home {} may offer, to node {}",
                        pid.node(),
                        self.me
                    )));
                }
                // take it only with room to spare and nothing going on about the page
                let idx = if ps.lost.is_none()
                    && ps.copy.wants_offer()
                    && self.room(buf) > 0
                    && self.driver.ch.peer_alive(pid.node())
                {
                    self.install(buf, pid, b, l)
                } else {
                    None
                };
                if idx.is_some() {
                    self.driver
                        .counters
                        .taken_in
                        .fetch_add(1, Ordering::Relaxed);
                }
                ps.copy.on_offer(epoch, idx)?
            }
            Msg::OfferReply { .. }
                if ps.dir.offered != Some(from) && !self.driver.ch.peer_alive(from) =>
            {
                // sent before its sender died; the sweep ended that offer as declined
                return Ok(Outcome::Done);
            }
            Msg::OfferReply { accepted } => {
                ps.dir.offer_reply(from, accepted)?;
                if accepted {
                    self.driver
                        .counters
                        .given_away
                        .fetch_add(1, Ordering::Relaxed);
                }
                self.requeue_deferred(ps);
                return Ok(Outcome::Done);
            }
            Msg::EvictReply { accepted } => {
                self.sync_dirty(buf, pid, ps);
                let step = ps.copy.on_evict_reply(accepted)?;
                if !accepted {
                    // declined (the home's log is nearly full, its store write failed, ...):
                    // the provider's next round picks from every page, not only copies of
                    // other homes' pages (which may all be such copies), and tries this one
                    // after the others (as if just used)
                    self.driver
                        .counters
                        .evictions_declined
                        .fetch_add(1, Ordering::Relaxed);
                    if let Some(i) = l.resident {
                        l.get(i).frame().touch(buf.clock());
                    }
                }
                step
            }
        };
        self.effects(pid, ps, step, l);
        Ok(Outcome::Done)
    }

    /// The directory's requests that waited for a copy-back go first now.
    pub(super) fn requeue_deferred(&self, ps: &mut PageState) {
        while let Some(n) = ps.dir_deferred.pop_back() {
            ps.held.push_front(n);
        }
    }

    /// Carry out a state machine step: send its messages (pages from latched frames), note a
    /// completed request.
    pub(super) fn effects<'b>(
        &self,
        pid: Pid,
        ps: &mut PageState,
        step: Step<FrameIdx>,
        l: &mut Latched<'b>,
    ) {
        for (to, msg) in step.out {
            if to == self.me {
                match msg {
                    // we are the home and gave our own copy away to a shared requester: the
                    // home's frame already holds the page
                    Msg::CopyBack { .. } => {
                        if let Err(e) = ps.dir.copy_back(self.me) {
                            log::error!("node {}: {pid}: {e}", self.me);
                        }
                        self.requeue_deferred(ps);
                    }
                    m => ps.held.push_back(Note {
                        from: self.me,
                        msg: m.map_data(|_| Data::Home),
                        logged: Receipt::Nothing,
                    }),
                }
                continue;
            }
            let page = match &msg {
                // the frame is this node's copy, latched by us (in `l`)
                Msg::Page { data, .. } | Msg::CopyBack { data: Some(data) } => {
                    let h = l.get(*data);
                    if let Err(e) = self.before_page_leaves(h.frame()) {
                        // not sent: the requester's wait ends in an error, nothing is lost
                        log::error!("node {}: {pid} not sent to node {to}: {e}", self.me);
                        continue;
                    }
                    Some(h.bytes())
                }
                _ => None,
            };
            if matches!(msg, Msg::Page { .. }) && ps.copy.data.is_some() {
                // a page sent while our copy stays: a forwarded read we served as a sharer
                self.driver
                    .counters
                    .served_for_others
                    .fetch_add(1, Ordering::Relaxed);
            }
            if let Err(e) = self.send(to, pid, &msg, page) {
                log::warn!("node {}: {e}", self.me);
            }
        }
        if step.completed.is_some() {
            ps.serve_due = true;
            if ps.waiter {
                ps.reserved = Some(Instant::now());
            }
        }
    }
}
