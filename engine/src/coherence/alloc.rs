//! Pages allocated on another node: `Control::Alloc` asks a home for a new page, which stays
//! resident there (zeroed, dirty, held by nobody) until the asker takes it like any remote
//! page. An answer that comes after its asker gave up is handed back (`Control::Unused`), and
//! the home frees the page only if it handed it to that node lately and nobody ever asked for it.

use super::protocol::Node;
use super::wire::Control;
use super::Coherence;
use crate::buffer::{Buffer, Possession};
use crate::error::EngineError;
use crate::pid::Pid;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Pages allocated for other nodes stay listed this long, so that their requesters can hand
/// them back when the answer came too late ...
const HANDED_KEEP: Duration = Duration::from_secs(60);
/// ... and at most this many are listed (the oldest go first).
const HANDED_MAX: usize = 1 << 16;

/// One node's allocations on behalf of others, and its own requests to others.
pub(super) struct RemoteAlloc {
    /// Allocation requests from other nodes waiting for a free frame, in arrival order.
    due: Mutex<VecDeque<(Node, u64)>>,
    /// Number of this node's next allocation request.
    next: AtomicU64,
    /// Answers to this node's requests, and the requests given up on.
    answers: Mutex<Answers>,
    /// Pages this node allocated for other nodes lately: (page, for whom, when).
    handed: Mutex<VecDeque<(Pid, Node, Instant)>>,
}

impl Default for RemoteAlloc {
    fn default() -> Self {
        RemoteAlloc {
            due: Mutex::new(VecDeque::new()),
            next: AtomicU64::new(1),
            answers: Mutex::new(Answers::default()),
            handed: Mutex::new(VecDeque::new()),
        }
    }
}

/// This node's allocation requests to other nodes.
#[derive(Default)]
struct Answers {
    /// Answers, by request number, not yet picked up by their requesters.
    done: HashMap<u64, u64>,
    /// Requests whose requesters gave up waiting.
    abandoned: HashSet<u64>,
}

impl Coherence {
    /// Allocate a new page homed on `home` (another node): it is zeroed and resident there;
    /// take it with a guard as any other page.
    pub fn allocate_on(&self, buf: &Buffer, home: Node) -> Result<Pid, EngineError> {
        if home >= self.nodes {
            return Err(EngineError::Config(format!(
                "node {home} is outside this cluster of {} nodes",
                self.nodes
            )));
        }
        let a = &self.alloc;
        let request = a.next.fetch_add(1, Ordering::Relaxed);
        self.try_send_control(home, &Control::Alloc { request })?;
        // A dead home answers no more: nothing is left behind there.
        let r = self.wait_until(
            buf,
            self.waiting.timeout,
            || a.answers.lock().done.remove(&request),
            || (!self.driver.ch.peer_alive(home)).then_some(home),
        )?;
        let raw = match r {
            Some(raw) => raw,
            None => {
                // Give up, unless the answer came just now; one that comes later is handed
                // back to the home (`answered`), so the page is not lost to everyone.
                let mut ans = a.answers.lock();
                match ans.done.remove(&request) {
                    Some(raw) => raw,
                    None => {
                        ans.abandoned.insert(request);
                        return Err(EngineError::AllocationTimeout {
                            home,
                            ms: self.waiting.timeout.as_millis() as u64,
                        });
                    }
                }
            }
        };
        if Pid(raw) == Pid::NONE {
            return Err(EngineError::AllocationRefused { home });
        }
        Ok(Pid(raw))
    }

    /// `from` asks for a page homed here (its `Control::Alloc`).
    pub(super) fn alloc_asked(&self, buf: &Buffer, from: Node, request: u64) {
        self.alloc.due.lock().push_back((from, request));
        self.serve_allocs(buf);
    }

    /// Serve allocation requests from other nodes (handler). Returns true if some wait for a
    /// free frame.
    pub(super) fn serve_allocs(&self, buf: &Buffer) -> bool {
        let mut due = self.alloc.due.lock();
        while let Some(&(from, request)) = due.front() {
            let pid = if buf.is_shutdown() {
                Pid::NONE
            } else {
                let me = self.me;
                match buf.store().allocate_versioned(|s| Pid::new(me, s).raw()) {
                    Err(e) => {
                        log::error!("node {}: allocating a page for node {from}: {e}", self.me);
                        Pid::NONE
                    }
                    Ok((slot, version)) => {
                        let pid = Pid::new(self.me, slot);
                        let Some(mut h) = buf.take_frame_for(pid) else {
                            // no free frame now: give the slot back and try later
                            if let Err(e) = buf.store().free(slot) {
                                log::error!("node {}: {e}", self.me);
                            }
                            return true;
                        };
                        h.page_mut().fill(0, shoal_storage::PAGE_DATA_SIZE, 0);
                        // a slot used before continues its old page's versions
                        h.set_version(version);
                        // a home copy nobody holds yet; dirty so the store gets the page
                        debug_assert_eq!(h.frame().possession(), Possession::None);
                        h.frame().set_dirty(true);
                        h.frame().touch(buf.clock());
                        drop(h);
                        let mut handed = self.alloc.handed.lock();
                        let now = Instant::now();
                        while handed.front().is_some_and(|&(_, _, t)| {
                            handed.len() >= HANDED_MAX || now.duration_since(t) > HANDED_KEEP
                        }) {
                            handed.pop_front();
                        }
                        handed.push_back((pid, from, now));
                        pid
                    }
                }
            };
            due.pop_front();
            self.send_control(
                from,
                &Control::Allocated {
                    request,
                    pid: pid.raw(),
                },
            );
        }
        false
    }

    /// `from` answered this node's allocation request `request` with page `pid` (its
    /// `Control::Allocated`).
    pub(super) fn alloc_answered(&self, from: Node, request: u64, pid: u64) {
        // Relaxed: the request's number was taken before its Alloc was sent, which happens
        // before this answer arrives (through the transports' hand-overs).
        if request >= self.alloc.next.load(Ordering::Relaxed) {
            log::error!(
                "node {}: node {from} answered allocation request {request}, which was never made",
                self.me
            );
            return;
        }
        let mut a = self.alloc.answers.lock();
        if a.abandoned.remove(&request) {
            drop(a);
            if Pid(pid) != Pid::NONE {
                log::info!(
                    "node {}: page {} came after its allocation timed out: handing it back to node {from}",
                    self.me,
                    Pid(pid)
                );
                self.send_control(from, &Control::Unused { pid });
            }
        } else {
            a.done.insert(request, pid);
            drop(a);
            self.waiting.notify();
        }
    }

    /// `Control::Unused` from `from`: free `pid` if this node allocated it for `from` lately
    /// and no node ever sent a message about it (no page state here): then nobody but this
    /// node's store knows the page. Anything else is refused with a log line, so a wrong or
    /// hostile message cannot free a page in use.
    pub(super) fn free_unused(&self, buf: &Buffer, from: Node, pid: Pid) {
        let listed = {
            let mut handed = self.alloc.handed.lock();
            let at = handed.iter().position(|&(p, n, _)| p == pid && n == from);
            at.and_then(|i| handed.remove(i)).is_some()
        };
        // Never asked for: no node sent a message about it, so no page state exists.
        let asked = self.pages.shard(pid).lock().contains_key(&pid);
        if !listed || asked {
            log::warn!(
                "node {}: node {from} handed back page {pid}, which it may not (not allocated \
                 for it lately, or used since): kept",
                self.me
            );
            return;
        }
        // Nobody but `from` ever saw the pid, and `from` gave it up: no message about it can
        // come (a peer that sends one anyway breaks the protocol). The shard lock is not held
        // from here: the provider takes it while holding a frame latch (`droppable`).
        match buf.discard_page(pid) {
            Ok(()) => log::info!(
                "node {}: page {pid}, allocated for node {from} after it gave up, is free again",
                self.me
            ),
            Err(e) => log::error!("node {}: freeing unused page {pid}: {e}", self.me),
        }
    }
}
