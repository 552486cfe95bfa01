//! What a node waits for, for the log line of a timed-out remote wait: where a stall across
//! nodes shows.

use super::possession::Pending;
use super::Coherence;
use crate::buffer::Buffer;
use crate::pid::Pid;
use std::collections::HashSet;
use std::sync::atomic::Ordering;

impl Coherence {
    /// A worker's wait for `pid` timed out: log what the page and this node's frames wait for.
    pub(super) fn log_stuck(&self, buf: &Buffer, pid: Pid) {
        if let Some(s) = self.pages.shard(pid).lock().get(&pid) {
            log::warn!(
                "node {}: {pid}: no answer in {} ms: pending {:?}, page from {:?}, mode {:?}, held {:?}, deferred {:?}, directory {:?}, directory deferred {:?}, reserved {:?}, serve due {}",
                self.me,
                self.waiting.timeout.as_millis(),
                s.copy.pending,
                s.page_from,
                s.copy.mode,
                s.held.iter().map(|n| (n.from, n.msg.name())).collect::<Vec<_>>(),
                s.copy.deferred,
                s.dir,
                s.dir_deferred.iter().map(|n| (n.from, n.msg.name())).collect::<Vec<_>>(),
                s.reserved.map(|t| t.elapsed()),
                s.serve_due
            );
            let table = buf.resident_frame(pid);
            for (what, idx) in [("copy", s.copy.data), ("table", table)] {
                if let Some(i) = idx {
                    let f = buf.frame(i);
                    log::warn!(
                        "node {}: {pid}: {what} {i}: holds {}, state {:?}, latched {} (exclusive {}), possession {:?}",
                        self.me, f.pid(), f.state(), f.latch.is_latched(), f.latch.is_exclusive(), f.possession()
                    );
                }
            }
        }
        // (the census takes every shard's lock: not under the page's)
        log::warn!("node {}: {}", self.me, self.frame_census(buf));
    }

    /// What this node's frames hold: free, latched, home pages, and copies of pages homed
    /// elsewhere by the state of the node's copy (a node whose frames are all tied up cannot
    /// take an arriving page); then the pages that wait for something.
    fn frame_census(&self, buf: &Buffer) -> String {
        use std::collections::BTreeMap;
        let mut c: BTreeMap<&str, usize> = BTreeMap::new();
        let (mut cold, clock) = (0, buf.clock());
        for i in buf.frame_indexes() {
            let f = buf.frame(i);
            let pid = f.pid();
            let what = if !f.is_resident() || pid == Pid::NONE {
                "free or loading"
            } else if f.latch.is_latched() {
                "latched"
            } else {
                let shard = self.pages.shard(pid).lock();
                let ps = shard.get(&pid).filter(|s| s.copy.data == Some(i));
                let home = pid.node() == self.me;
                match ps.map(|s| {
                    (
                        s.copy.pending,
                        s.held.is_empty(),
                        s.copy.deferred.is_empty(),
                    )
                }) {
                    None if home => "home copy not held here",
                    None => "foreign page without a copy (!)",
                    Some((Pending::Evicting, ..)) => "copy: eviction notice out",
                    Some((Pending::Requested { .. }, ..)) => "copy: request out",
                    Some((Pending::Completing { .. }, ..)) => "copy: completing",
                    Some((Pending::Idle, false, _)) => "copy: messages held",
                    Some((Pending::Idle, _, false)) => "copy: messages deferred",
                    Some((Pending::Idle, ..)) if home => "home page held here, idle",
                    Some((Pending::Idle, ..)) => "foreign copy, idle",
                }
            };
            *c.entry(what).or_insert(0) += 1;
            if f.is_resident() && f.last_used() < clock {
                cold += 1;
            }
        }
        // pages that wait for something (at most 12): where a stall across nodes shows
        let mut waiting = Vec::new();
        let mut count = 0;
        let retry: HashSet<Pid> = self.pages.retry.pages();
        for shard in self.pages.shards.iter() {
            for (pid, s) in shard.lock().iter() {
                if !s.busy() {
                    continue;
                }
                count += 1;
                if waiting.len() < 12 {
                    waiting.push(format!(
                        "{pid}: {:?} held {:?} deferred {:?} dir {:?}/{:?} serve_due {} revoking {} reserved {:?} waiter {} retry {}",
                        s.copy.pending,
                        s.held.iter().map(|n| (n.from, n.msg.name())).collect::<Vec<_>>(),
                        s.copy.deferred,
                        s.dir.holders,
                        s.dir_deferred.iter().map(|n| (n.from, n.msg.name())).collect::<Vec<_>>(),
                        s.serve_due,
                        s.revoking,
                        s.reserved.map(|t| t.elapsed()),
                        s.waiter,
                        retry.contains(pid)
                    ));
                }
            }
        }
        format!(
            "frames: {c:?}; {} on the free list (target {}), {cold} last used before clock {clock}, {} provider rounds, {} evictions; {count} pages wait: {}",
            buf.free.len(),
            buf.free_target,
            buf.counters.provider_rounds.load(Ordering::Relaxed),
            buf.counters.evictions.load(Ordering::Relaxed),
            waiting.join("; ")
        )
    }
}
