//! The provider's side: a page this node holds leaves through its directory. A page homed
//! elsewhere leaves by an eviction notice to its home (the handler frees the frame when the
//! home accepts); one homed here is released by the local directory at once; what remains is
//! plain home copies, which the provider writes back and drops like a single node's pages.

use super::directory::{EvictDecision, Holders};
use super::possession::Pending;
use super::protocol::Msg;
use super::wire::batchable;
use super::{msg_has_page, possession_of, Coherence};
use crate::buffer::{Buffer, FrameIdx, Possession};
use crate::pid::Pid;
use shoal_messaging::BACKLOG_PAGES;
use std::sync::atomic::Ordering;

impl Coherence {
    /// The provider wants to evict frame `idx` (unlatched, resident). Returns `true` if the
    /// frame is now a plain home copy that the provider may write back and drop; `false` if
    /// it must leave the frame alone (an eviction notice may have been sent; the handler frees
    /// the frame when the home accepts).
    pub fn prepare_evict(&self, buf: &Buffer, idx: FrameIdx) -> bool {
        let f = buf.frame(idx);
        let pid = f.pid();
        if pid == Pid::NONE {
            return false;
        }
        let home = pid.node() == self.me;
        if !home && self.driver.ch.backlog_pages(pid.node()) >= BACKLOG_PAGES {
            // the home has not taken the pages sent to it so far: no more now (sends never
            // wait, so this is what bounds the channel's backlog)
            return false;
        }
        let mut shard = self.pages.shard(pid).lock();
        let Some(ps) = shard.get_mut(&pid) else {
            return home; // a home copy nobody asked for through the protocol
        };
        if ps.copy.data != Some(idx) {
            if !home && ps.lost.is_some() {
                // the frame of a copy lost with a dead node (`Coherence::lose`): nothing
                // refers to it any more; free it
                if let Some(h) = buf.try_hold(idx, pid) {
                    h.drop_page();
                }
                return false;
            }
            return home && f.possession() == Possession::None;
        }
        if ps.copy.pending != Pending::Idle
            || ps.serve_due
            || ps.reserved_now()
            || !ps.held.is_empty()
            || !ps.copy.deferred.is_empty()
        {
            return false;
        }
        if !home && f.is_dirty() && !self.durable_soon(f) {
            return false; // its changes are not durable yet: another page first
        }
        let Some(h) = buf.try_hold(idx, pid) else {
            return false;
        };
        if !home && f.is_dirty() {
            ps.copy.mark_dirty();
        }
        if !home && !self.driver.ch.peer_alive(pid.node()) {
            // the home died: the page can never go home, nor be asked for again. A dirty
            // copy's newest state is then only in this node's log: its records are carried
            // over at checkpoints, as for a page handed to a dead peer (`carry_for_dead`)
            if ps.copy.dirty {
                self.note_kept_for(pid.node(), pid);
            }
            ps.lost = Some(pid.node());
            if let Err(e) = ps.copy.drop_for_dead_home() {
                log::error!("node {}: {pid}: {e}", self.me); // checked idle above
            }
            h.drop_page();
            return false;
        }
        let Some((to, msg)) = ps.copy.evict() else {
            h.release_unchanged();
            return false;
        };
        if home {
            // our own directory decides, at once
            let Msg::Evict { epoch, data } = msg else {
                unreachable!("PageCopy::evict sends Evict")
            };
            let accepted = match ps.dir.evict(self.me, epoch, data.is_some()) {
                Ok(EvictDecision::Accept { .. }) => true,
                Ok(EvictDecision::Decline) => false,
                Err(e) => {
                    log::error!("node {}: evicting own page {pid}: {e}", self.me);
                    false
                }
            };
            match ps.copy.on_evict_reply(accepted) {
                Ok(step) => debug_assert!(step.out.is_empty() && step.completed.is_none()),
                Err(e) => log::error!("node {}: {e}", self.me),
            }
            h.frame().set_possession(possession_of(&ps.copy));
            return accepted;
        }
        if msg_has_page(&msg) {
            if let Err(e) = self.before_page_leaves(h.frame()) {
                log::error!("node {}: {pid} not evicted: {e}", self.me);
                if let Err(e) = ps.copy.evict_unsent() {
                    log::error!("node {}: {pid}: {e}", self.me);
                }
                h.release_unchanged();
                return false;
            }
        }
        h.frame().set_possession(Possession::None);
        let page = msg_has_page(&msg).then(|| h.bytes());
        self.driver
            .counters
            .evict_notices
            .fetch_add(1, Ordering::Relaxed);
        let queued = batchable(&msg);
        if let Err(e) = self.send(to, pid, &msg, page) {
            log::warn!("node {}: eviction notice for {pid}: {e}", self.me);
            if !queued {
                // the notice never left: keep the page, as if just used (see
                // `restore_unsent`); nothing can have been deferred meanwhile (the page's
                // shard stayed locked). A notice in a batch that failed is made idle again
                // by `restore_unsent`.
                if let Err(e) = ps.copy.evict_unsent() {
                    log::error!("node {}: {pid}: {e}", self.me);
                }
                h.frame().set_possession(possession_of(&ps.copy));
                h.frame().touch(buf.clock());
            }
        }
        false
    }

    /// The provider holds frame `idx` (holding `pid`) exclusively and wants to drop it: only a
    /// plain home copy may go, not a frame that is (or is becoming) this node's copy of the
    /// page. The answer holds while the latch is held: the handler changes a page's frame
    /// only with the frame latched.
    pub fn droppable(&self, pid: Pid, idx: FrameIdx) -> bool {
        if pid.node() != self.me {
            // foreign pages leave through their home (`prepare_evict`), never here
            return false;
        }
        let shard = self.pages.shard(pid).lock();
        shard.get(&pid).is_none_or(|s| s.copy.data != Some(idx))
    }

    /// Pages homed here whose current image may not be here: another node holds them
    /// node-exclusive (possibly modified), a copy-back is due, or the current copy died with a
    /// node. Zero after an orderly shutdown (every node sent its pages home); otherwise this
    /// node's store must not be marked clean. Call with the handler stopped, or the answer may
    /// be stale at once.
    pub fn homed_pages_away(&self) -> usize {
        let mut away = 0;
        for shard in self.pages.shards.iter() {
            for (pid, ps) in shard.lock().iter() {
                if pid.node() != self.me {
                    continue;
                }
                let elsewhere = matches!(ps.dir.holders, Holders::Exclusive(n) if n != self.me);
                if elsewhere || ps.dir.awaiting_copy_back.is_some() || ps.lost.is_some() {
                    away += 1;
                }
            }
        }
        away
    }

    /// Ask every page homed elsewhere to go home (clean shutdown). Returns how many frames
    /// still hold such pages.
    pub fn release_remote(&self, buf: &Buffer) -> usize {
        if !self.pool.leaving.swap(true, Ordering::Relaxed) {
            self.advertise_room(buf); // no room from now on
        }
        let mut left = 0;
        for i in buf.frame_indexes() {
            let f = buf.frame(i);
            if f.is_resident() && f.pid() != Pid::NONE && f.pid().node() != self.me {
                left += 1;
                self.prepare_evict(buf, i);
            }
        }
        self.flush_batches();
        left
    }
}
