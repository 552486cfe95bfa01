//! A page's home answers requests: the directory decides, and the grant goes out.

use super::apply::{Latched, Outcome};
use super::directory::{DirDecision, Holders};
use super::protocol::{bit, Grant, Mode, Msg, Node, ProtocolError};
use super::wire::{REFUSE_HOLDER_DEAD, REFUSE_NO_PAGE, REFUSE_READ};
use super::{failure::refusal, Coherence, Note, PageState, StoreCopy};
use crate::buffer::Buffer;
use crate::pid::Pid;
use parking_lot::Mutex;
use shoal_messaging::PAGE_BYTES;
use shoal_storage::AlignedPage;
use std::sync::atomic::Ordering;

/// The home side's own state: store reads of home copies that rounds asked for.
#[derive(Default)]
pub(super) struct Home {
    /// Pages whose home copy a round asked to read from the store ([`StoreCopy::Reading`]).
    pub reads_due: Mutex<Vec<Pid>>,
}

impl Coherence {
    /// A request for `pid` at its home (this node): the directory decides; the grant goes
    /// out with the home's copy when it carries the page (from the home's frame, or read from
    /// the store). A request that needs a dead node, or a page that does not exist or cannot
    /// be read, is refused and leaves the directory as it was.
    pub(super) fn home_request<'b>(
        &self,
        buf: &'b Buffer,
        pid: Pid,
        ps: &mut PageState,
        note: Note,
        l: &mut Latched<'b>,
    ) -> Result<Outcome, ProtocolError> {
        let from = note.from;
        let Msg::Request { want, have, again } = note.msg else {
            unreachable!("home_request is called for requests")
        };
        if pid.node() != self.me {
            return Err(ProtocolError(format!(
                "node {from} sent a request for {pid} to a node that is not its home"
            )));
        }
        let refuse = |ps: &mut PageState, code: u8, node: Node| {
            if from == self.me {
                self.request_over(pid, ps);
                ps.error = Some(refusal(pid, code, node, self.me));
            } else {
                self.send_refusal(from, pid, code, node);
            }
            Ok(Outcome::Done)
        };
        if from != self.me && !self.driver.ch.peer_alive(from) {
            // the requester is dead: a grant to it would make the entry name a dead node
            // (the model's rule too; a requester cut off but running ends its request when it
            // notices this home dead)
            log::debug!(
                "node {}: {pid}: request from dead node {from} dropped",
                self.me
            );
            return Ok(Outcome::Done);
        }
        if pid.slot() >= buf.store().high_water() {
            return refuse(ps, REFUSE_NO_PAGE, 0);
        }
        let mut d = ps.dir;
        // One pool: when the grant would read the home's copy from the store, a live sharer
        // sends its copy instead (it keeps its own; docs/protocol.md "Forwarded reads").
        let at_hand = l.resident.is_some()
            || matches!(&ps.store_copy, StoreCopy::Read { gen, .. } if *gen == ps.home_gen);
        let may_serve = if at_hand || !self.pool.enabled || want != Mode::Shared {
            0
        } else {
            self.live_peers().fold(0, |set, n| set | bit(n))
        };
        let decision = match again.then(|| d.asked_again(from, want)).flatten() {
            Some(decision) => decision,
            None => d.request_forwarding(from, want, have, may_serve)?,
        };
        // A node that must hand the page over or drop its copy is gone: the request would wait
        // forever. Refuse it (the directory is left as it was: `d` is not stored).
        if let Some(dead) = self.first_dead(decision.needs()) {
            let dead_sharer = ps.dir.awaiting_copy_back.is_none()
                && matches!(ps.dir.holders, Holders::Shared(s) if s & bit(dead) != 0);
            let reclaimable = ps.dir.holders == Holders::Exclusive(dead)
                && ps
                    .dir
                    .handed_by
                    .is_some_and(|o| o == self.me || self.driver.ch.peer_alive(o));
            if dead_sharer || reclaimable {
                // a dead sharer whose fence does not hold yet (`after_fence` forgets it, in
                // every entry, once it does), or a dead holder whose grant's source may
                // still hold the page (`after_fence` reclaims it): the request waits for
                // that instead of failing
                ps.dir_deferred.push_back(note);
                return Ok(Outcome::Done);
            }
            return refuse(ps, REFUSE_HOLDER_DEAD, dead);
        }
        let (mode, epoch, from_home, source, invalidate, source_keeps) = match decision {
            DirDecision::Defer => {
                ps.dir_deferred.push_back(note);
                return Ok(Outcome::Done);
            }
            DirDecision::Lost { with } => {
                log::error!(
                    "node {}: page {pid} is lost: node {with} died before handing it to node {from}",
                    self.me
                );
                ps.dir.died_with(from, with);
                self.mark_lost_home(pid, ps, with);
                return refuse(ps, REFUSE_HOLDER_DEAD, with);
            }
            DirDecision::Grant {
                mode,
                epoch,
                from_home,
                source,
                invalidate,
                source_keeps,
            } => (mode, epoch, from_home, source, invalidate, source_keeps),
        };
        if let (true, false, Some(i)) = (from_home, from == self.me, l.resident) {
            if !self.durable_soon(l.get(i).frame()) {
                // held until the log writer has made the home frame's changes durable (the
                // directory is left as it was)
                return Ok(Outcome::Stuck(note));
            }
            // the home's frame leaves with the grant: its changes must be durable first (the
            // directory is left as it was: `d` is not stored)
            if let Err(e) = self.before_page_leaves(l.get(i).frame()) {
                log::error!("node {}: {pid} not granted to node {from}: {e}", self.me);
                return refuse(ps, REFUSE_READ, 0);
            }
        }
        if source_keeps {
            self.driver
                .counters
                .forwarded_reads
                .fetch_add(1, Ordering::Relaxed);
        }
        // the home copy, if the grant carries it: the home's frame, or the store (read outside
        // the handler role: the request waits, held, until the read is done)
        let mut home_idx = l.resident;
        let mut copy: Option<(u64, Box<AlignedPage>)> = None;
        if from_home && home_idx.is_none() {
            match std::mem::take(&mut ps.store_copy) {
                StoreCopy::Read { gen, page } if gen == ps.home_gen => {
                    if from == self.me {
                        // our own request: the page takes a frame here (the home's frame)
                        let Some(i) = self.install(buf, pid, &page, l) else {
                            ps.store_copy = StoreCopy::Read { gen, page };
                            return Ok(Outcome::Stuck(note));
                        };
                        // clean: the store holds this image
                        l.get(i).frame().set_dirty(false);
                        home_idx = Some(i);
                    } else {
                        copy = Some((gen, page));
                    }
                }
                StoreCopy::Reading { gen } => {
                    ps.store_copy = StoreCopy::Reading { gen };
                    return Ok(Outcome::Stuck(note));
                }
                StoreCopy::Failed => return refuse(ps, REFUSE_READ, 0),
                StoreCopy::None | StoreCopy::Read { .. } => {
                    ps.store_copy = StoreCopy::Reading { gen: ps.home_gen };
                    self.home.reads_due.lock().push(pid);
                    return Ok(Outcome::Stuck(note));
                }
            }
        }
        ps.dir = d;
        if from == self.me {
            // our own grant: delivered at once, while the home's frame is latched
            ps.page_from = source;
            let step = ps.copy.on_grant(Grant {
                mode,
                epoch,
                data: if from_home { home_idx } else { None },
                source,
                invalidate,
                source_keeps,
            })?;
            self.effects(pid, ps, step, l);
        } else {
            let page: Option<&[u8; PAGE_BYTES]> = match (&copy, home_idx) {
                _ if !from_home => None,
                (Some((_, b)), _) => Some(b),
                // the home's frame is in `l`: exclusively latched by us
                (None, Some(i)) => Some(l.get(i).bytes()),
                (None, None) => unreachable!("home copy loaded above"),
            };
            let g = Msg::Grant(Grant {
                mode,
                epoch,
                data: from_home.then_some(()),
                source,
                invalidate,
                source_keeps,
            });
            if let Err(e) = self.send(from, pid, &g, page) {
                log::warn!("node {}: {e}", self.me);
            }
            if let Some((gen, page)) = copy {
                // kept for the other requests this pass applies (`progress` drops it after)
                ps.store_copy = StoreCopy::Read { gen, page };
            }
        }
        Ok(Outcome::Done)
    }
}

impl Coherence {
    /// Read the home copies that rounds asked for ([`StoreCopy::Reading`]), outside the
    /// handler role, one page at a time (several threads read in parallel); each page's held
    /// request is retried once its copy is there. Returns whether any page was read.
    pub(super) fn do_store_reads(&self, buf: &Buffer) -> bool {
        let mut did = false;
        loop {
            let Some(pid) = self.home.reads_due.lock().pop() else {
                return did;
            };
            let mut page = Box::new(AlignedPage::new());
            // SAFETY: `page` is an owned, aligned page buffer that nothing else references.
            let r = unsafe {
                buf.store()
                    .read_into(pid.slot(), pid.raw(), page.as_mut_ptr())
            };
            self.driver
                .counters
                .home_reads
                .fetch_add(1, Ordering::Relaxed);
            let mut shard = self.pages.shard(pid).lock();
            if let Some(ps) = shard.get_mut(&pid) {
                if let StoreCopy::Reading { gen } = ps.store_copy {
                    ps.store_copy = match r {
                        Ok(()) => StoreCopy::Read { gen, page },
                        Err(e) => {
                            log::error!("node {}: reading home page {pid}: {e}", self.me);
                            StoreCopy::Failed
                        }
                    };
                }
                self.pages.retry_later(pid);
            }
            did = true;
        }
    }
}
