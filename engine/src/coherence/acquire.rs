//! The worker side: a remote miss requests possession from the page's home and waits for it.

use super::directory::{DirEntry, Holders};
use super::possession::{PageCopy, Pending};
use super::protocol::{Mode, Node};
use super::{Coherence, PageState};
use crate::buffer::{Buffer, FrameIdx};
use crate::error::EngineError;
use crate::pid::Pid;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a waiting worker that finds nothing to do spins before it yields between looks:
/// long enough for a round that another thread is running to end, short enough to leave the
/// core to the threads that produce the answer (a reader thread, a handler, the worker whose
/// round it is). With 20 us, `shoal ycsb --workload c --nodes 2` (4 workers a node on 2
/// cores) ran 0.89-0.90x as fast as with 2 us, and 0.81-0.82x over tcp (docs/BENCHMARKS.md,
/// "Remote-miss CPU"); parking at once costs a wake-up when a round held by another thread
/// ends. How long it looks in all before it parks is the transport's
/// [`Transport::answer_poll`].
///
/// [`Transport::answer_poll`]: shoal_messaging::Transport::answer_poll
const SPIN_FOR: Duration = Duration::from_micros(2);

impl Coherence {
    /// Obtain `want` possession of `pid` for a worker of this node. With `wait`, returns once
    /// the node holds it (`Ok(true)`: this worker's request completed, and it owes
    /// [`Coherence::used`] once it latched the page); without, only sends the request.
    pub fn acquire(
        &self,
        buf: &Buffer,
        pid: Pid,
        want: Mode,
        wait: bool,
    ) -> Result<bool, EngineError> {
        self.check_node(pid)?;
        // The wait fails once the request made no progress for `timeout`: each step of it
        // (granted, page arrived, an acknowledgement arrived) starts the time again. A request
        // has a handful of steps, so the wait stays bounded, while a machine too loaded to run
        // the nodes' threads for a while does not fail a request that is moving.
        let mut deadline = Instant::now() + self.waiting.timeout;
        let mut last_step: Option<Pending> = None;
        let mut asked = false;
        // since when this thread has found nothing to do
        let mut idle: Option<Instant> = None;
        // while this thread polls for its answer, the handler threads it stands in for need
        // not be woken by every message (see `Region::helpers`): from before the request
        // leaves, so that not even the request wakes the home's handler thread
        let mut helping = wait.then(|| self.driver.ch.helping());
        loop {
            let mut out = None;
            {
                let mut shard = self.pages.shard(pid).lock();
                let ps = shard
                    .entry(pid)
                    .or_insert_with(|| PageState::new(pid, self.me));
                if asked && last_step != Some(ps.copy.pending) {
                    if last_step.is_some() {
                        deadline = Instant::now() + self.waiting.timeout;
                    }
                    last_step = Some(ps.copy.pending);
                }
                if asked {
                    if let Some(e) = ps.error.take() {
                        return Err(e);
                    }
                }
                if let Some(dead) = ps.lost {
                    return Err(EngineError::HolderDead { pid, holder: dead });
                }
                if ps.copy.usable(want) && !ps.revoking {
                    return Ok(asked && ps.reserved.is_some());
                }
                if let Some(dead) = self.dead_source(ps) {
                    self.lose(buf, pid, ps, dead);
                    return Err(EngineError::HolderDead { pid, holder: dead });
                }
                if ps.copy.pending == Pending::Idle && !ps.serve_due && !ps.revoking {
                    let m = ps
                        .copy
                        .request(want)
                        .map_err(|e| EngineError::ProtocolViolation { pid, why: e.0 })?;
                    ps.waiter = wait;
                    ps.error = None;
                    asked = true;
                    out = Some(m);
                }
            }
            if let Some((to, msg)) = out {
                self.driver
                    .counters
                    .requests
                    .fetch_add(1, Ordering::Relaxed);
                if let Err(e) = self.send(to, pid, &msg, None) {
                    let mut shard = self.pages.shard(pid).lock();
                    if let Some(s) = shard.get_mut(&pid) {
                        // the request never left: nothing to wait for
                        self.request_over(pid, s);
                        s.waiter = false;
                    }
                    return Err(e);
                }
            }
            if !wait {
                return Ok(false);
            }
            if !self.driver.ch.peer_alive(pid.node()) {
                return Err(EngineError::PeerDead { node: pid.node() });
            }
            let now = Instant::now();
            if now >= deadline {
                self.log_stuck(buf, pid);
                return Err(EngineError::RemoteTimeout {
                    pid,
                    ms: self.waiting.timeout.as_millis() as u64,
                });
            }
            // Do the work that produces the answer instead of waking the threads that would:
            // this node's handler round and, where the transport allows (`mem`), the other
            // nodes' (the home, a source, sharers). An uncontended remote miss then completes
            // on this thread without a single wake-up.
            if self.help_everyone(buf) {
                idle = None;
                continue;
            }
            // Nothing to do here: another thread holds a role and is at it, or the answer comes
            // over the network. Look again for a moment (a round in progress elsewhere ends in
            // microseconds), then park until a handler round changes this page (it unparks the
            // page's waiters), 1 ms at most.
            // A task: let the thread's other tasks run while the answer is on its way (not
            // helping meanwhile: the handler threads may take over).
            if crate::tasks::may_pause() {
                drop(helping.take());
                crate::tasks::pause(crate::tasks::Wait::Idle);
                let _ = helping.insert(self.driver.ch.helping());
                continue;
            }
            let since = *idle.get_or_insert(now);
            let idle_for = now.duration_since(since);
            if idle_for < SPIN_FOR {
                for _ in 0..16 {
                    std::hint::spin_loop();
                }
                continue;
            }
            if idle_for < self.waiting.answer_poll {
                // the answer comes over the network: keep looking, leaving the core to others
                std::thread::yield_now();
                continue;
            }
            // not polling while parked: the handler threads take over again
            drop(helping.take());
            self.park_on(pid, Duration::from_millis(1).min(deadline - now));
            let _ = helping.insert(self.driver.ch.helping());
            idle = None;
        }
    }

    /// Run this node's handler round if nobody is running it and messages wait, and on
    /// transports that allow it the other nodes' (see [`Coherence::help`]). Returns whether
    /// any message was applied.
    pub(super) fn help_everyone(&self, buf: &Buffer) -> bool {
        let mut did = self.help(buf);
        let t = self.driver.ch.transport();
        for n in 0..self.nodes {
            if n != self.me {
                did |= t.assist(n);
            }
        }
        did
    }

    /// Park this thread until a handler round changes page `pid` (or `max` passes): the
    /// round unparks every thread listed in the page's `parked` (see [`Coherence::wake`]).
    fn park_on(&self, pid: Pid, max: Duration) {
        {
            let mut shard = self.pages.shard(pid).lock();
            let Some(ps) = shard.get_mut(&pid) else {
                return;
            };
            let me = std::thread::current();
            if !ps.parked.iter().any(|t| t.id() == me.id()) {
                ps.parked.push(me);
            }
        }
        // An unpark between the registration and here leaves a token: park returns at once.
        std::thread::park_timeout(max);
    }

    /// Wait (up to `limit`) until `done` says the wait is over, checking with `dead` whether
    /// a node it waits for died. `done` runs under no lock of ours; the handler notifies after
    /// every message.
    pub(super) fn wait_until<T>(
        &self,
        buf: &Buffer,
        limit: Duration,
        mut done: impl FnMut() -> Option<T>,
        mut dead: impl FnMut() -> Option<Node>,
    ) -> Result<Option<T>, EngineError> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(v) = done() {
                return Ok(Some(v));
            }
            if let Some(n) = dead() {
                // Acquire: pairs with the handler's Release, so what it did with n's last
                // messages is visible to `done`.
                let drained = self.driver.dead_drained.load(Ordering::Acquire) & (1 << n) != 0;
                if drained || self.driver.stop.load(Ordering::Acquire) {
                    // one last look: n's last messages may have finished the wait
                    if let Some(v) = done() {
                        return Ok(Some(v));
                    }
                    return Err(EngineError::PeerDead { node: n });
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            // as a remote miss does: produce the answer rather than wait for it
            let helped = {
                let _helping = self.driver.ch.helping();
                self.help_everyone(buf)
            };
            if helped {
                continue;
            }
            let mut g = self.waiting.done_mx.lock();
            self.waiting
                .done_cv
                .wait_for(&mut g, Duration::from_millis(5).min(deadline - now));
        }
    }

    /// The worker whose request completed has latched the page: others may be served once it
    /// releases the latch.
    pub fn used(&self, pid: Pid) {
        let mut shard = self.pages.shard(pid).lock();
        if let Some(s) = shard.get_mut(&pid) {
            s.reserved = None;
            s.waiter = false;
            if s.serve_due && s.copy.deferred.is_empty() {
                // nothing arrived meanwhile: serving is a no-op (`PageCopy::served` serves the
                // deferred messages only), so the handler need not be woken for it
                s.serve_due = false;
            }
            if s.serve_due || !s.held.is_empty() {
                self.pages.retry_later(pid);
                self.driver.ch.wake();
            }
            Self::wake(s);
        }
    }

    /// A page just allocated here, in frame `idx` (exclusively latched by the caller): this
    /// node holds it exclusively.
    pub fn adopt_new(&self, pid: Pid, idx: FrameIdx) {
        let mut shard = self.pages.shard(pid).lock();
        let ps = shard
            .entry(pid)
            .or_insert_with(|| PageState::new(pid, self.me));
        ps.dir = DirEntry {
            holders: Holders::Exclusive(self.me),
            invalidating: 0,
            ..ps.dir
        };
        if let Err(e) = ps.copy.created(idx) {
            // a page state left over from an earlier page of this id: the new page replaces it
            log::error!("node {}: {pid}: {e}", self.me);
            ps.copy = PageCopy::new(pid.node(), self.me);
            ps.copy.created(idx).expect("a fresh copy holds nothing");
        }
    }
}
