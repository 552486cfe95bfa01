//! The structural verifier: walks a whole tree from its root and checks every invariant the
//! operations rely on.
//!
//! Per node: a well-formed layout ([`node::check_layout`]), keys strictly ascending and inside
//! the node's fences, fences equal to the separators its parent has on either side of it,
//! levels decreasing by one to 0 at the leaves. Per level: the right links chain the nodes of
//! the level in key order and the last one has none (the B-link invariant that lets a reader
//! who missed a split move right). Per overflow value: its chain's kinds, links and length
//! ([`crate::overflow::chain`]). Across the tree: no page is reached twice.
//!
//! Pages come from a caller-supplied reader, so the same walk serves tests and
//! [`crate::BTree::verify`] (through shared guards, on a quiet tree) and `shoal inspect`
//! (straight from the page store, with no engine running). Nothing here trusts a page: a
//! malformed one is an error naming it, never a panic.

use crate::node::{self, NodeRef, KIND_INNER, KIND_LEAF, NO_PAGE};
use crate::overflow::{self, ValueRef};
use shoal_engine::{Pid, PAGE_DATA_SIZE};
use std::collections::HashSet;

/// Levels a tree may have: far more than any tree of 2^64 pages needs, so a larger level is
/// corruption (and the walk's recursion stays bounded).
pub const MAX_HEIGHT: u16 = 32;

/// What a successful walk counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeReport {
    /// Key-value entries in the leaves.
    pub entries: u64,
    /// Levels (1 = the root is a leaf).
    pub height: u16,
    pub leaves: u64,
    pub inner_nodes: u64,
    /// Bytes in use over all nodes (headers, slots, fences, keys and values).
    pub bytes_used: u64,
    /// Every page of the tree, root first, then depth-first in key order (each leaf's overflow
    /// chains after it).
    pub pages: Vec<Pid>,
    /// Of `pages`, the overflow pages of values too large for a leaf.
    pub overflow_pages: u64,
    /// Values kept in overflow pages.
    pub overflow_values: u64,
    /// Per level, leaves first: (nodes, bytes in use).
    pub levels: Vec<(u64, u64)>,
    /// Nodes other than the root using less than a quarter of their page (removes merge or
    /// even them out with a neighbour, so few should remain).
    pub underfull: u64,
}

impl TreeReport {
    /// Average share of a node's page in use (0..=1).
    pub fn fill(&self) -> f64 {
        let nodes = self.pages.len() as u64 - self.overflow_pages;
        if nodes == 0 {
            return 0.0;
        }
        self.bytes_used as f64 / (nodes as f64 * PAGE_DATA_SIZE as f64)
    }
}

/// A page's data area, or why it could not be read.
pub type PageImage = Result<Box<[u8; PAGE_DATA_SIZE]>, String>;

/// Walk the tree rooted at `root`, reading pages with `read`, and check it (module docs).
pub fn verify_tree(root: Pid, read: impl FnMut(Pid) -> PageImage) -> Result<TreeReport, String> {
    let mut w = Walk {
        read,
        seen: HashSet::new(),
        levels: Vec::new(),
        report: TreeReport::default(),
    };
    let height = w.node(root, None, None, None)?;
    // levels[l] lists (pid, right link, bytes) of level l's nodes in key order
    for (level, nodes) in w.levels.iter().enumerate() {
        for pair in nodes.windows(2) {
            if pair[0].1 != pair[1].0.raw() {
                return Err(format!(
                    "node {} (level {level}) links right to {:#x}, expected its neighbour {}",
                    pair[0].0, pair[0].1, pair[1].0
                ));
            }
        }
        if let Some(last) = nodes.last() {
            if last.1 != NO_PAGE {
                return Err(format!(
                    "node {} is the last of level {level} but links right to {:#x}",
                    last.0, last.1
                ));
            }
        }
    }
    w.report.height = height;
    w.report.levels = w
        .levels
        .iter()
        .map(|l| (l.len() as u64, l.iter().map(|n| n.2).sum()))
        .collect();
    Ok(w.report)
}

struct Walk<R> {
    read: R,
    seen: HashSet<Pid>,
    /// Per level, in key order: (node, its right link, bytes in use).
    levels: Vec<Vec<(Pid, u64, u64)>>,
    report: TreeReport,
}

impl<R: FnMut(Pid) -> PageImage> Walk<R> {
    /// Check the subtree at `pid`, whose keys must lie in (`lower`, `upper`] and whose level
    /// must be `level` (any for the root). Returns the subtree's height.
    fn node(
        &mut self,
        pid: Pid,
        lower: Option<&[u8]>,
        upper: Option<&[u8]>,
        level: Option<u16>,
    ) -> Result<u16, String> {
        if pid == Pid::NONE {
            return Err("a child pointer is missing (no page)".into());
        }
        if !self.seen.insert(pid) {
            return Err(format!("page {pid} is reached twice"));
        }
        let page = (self.read)(pid).map_err(|e| format!("node {pid}: {e}"))?;
        node::check_layout(&page).map_err(|e| format!("node {pid}: {e}"))?;
        self.report.pages.push(pid);
        let n = NodeRef::new(&page);
        let used = (PAGE_DATA_SIZE - n.free_space()) as u64;
        self.report.bytes_used += used;
        if level.is_some() && used < (PAGE_DATA_SIZE / 4) as u64 {
            self.report.underfull += 1;
        }
        let lvl = n.level();
        match level {
            Some(l) if l != lvl => {
                return Err(format!("node {pid} has level {lvl}, expected {l}"));
            }
            None if lvl >= MAX_HEIGHT => {
                return Err(format!("root {pid} has level {lvl} (at most {MAX_HEIGHT})"));
            }
            _ => {}
        }
        let (lo, up) = n.fences();
        if lo.as_deref() != lower || up.as_deref() != upper {
            return Err(format!(
                "node {pid} has fences ({lo:?}, {up:?}), its parent says ({lower:?}, {upper:?})"
            ));
        }
        for i in 0..n.count() {
            let k = n.key(i);
            if i > 0 && n.key(i - 1) >= k {
                return Err(format!("node {pid}: keys out of order at slot {i}"));
            }
            if lower.is_some_and(|l| k <= l) || upper.is_some_and(|u| k > u) {
                return Err(format!("node {pid}: key of slot {i} is outside its fences"));
            }
        }
        if self.levels.len() <= lvl as usize {
            self.levels.resize(lvl as usize + 1, Vec::new());
        }
        self.levels[lvl as usize].push((pid, n.right(), used));
        match n.kind() {
            KIND_LEAF if lvl != 0 => Err(format!("leaf {pid} at level {lvl}")),
            KIND_LEAF => {
                self.report.leaves += 1;
                self.report.entries += n.count() as u64;
                for i in 0..n.count() {
                    if n.flags(i) & node::FLAG_OVERFLOW == 0 {
                        continue;
                    }
                    let r = ValueRef::decode(n.value(i)).ok_or_else(|| {
                        format!("leaf {pid}: slot {i} holds a bad overflow reference")
                    })?;
                    let chain = overflow::chain(r, |p| (self.read)(p))
                        .map_err(|e| format!("leaf {pid} slot {i}: {e}"))?;
                    for p in chain {
                        if !self.seen.insert(p) {
                            return Err(format!(
                                "page {p} is reached twice (overflow chain of leaf {pid})"
                            ));
                        }
                        self.report.pages.push(p);
                        self.report.overflow_pages += 1;
                    }
                    self.report.overflow_values += 1;
                }
                Ok(1)
            }
            KIND_INNER if lvl == 0 => Err(format!("inner node {pid} at level 0")),
            KIND_INNER => {
                self.report.inner_nodes += 1;
                let mut lo = lower.map(<[u8]>::to_vec);
                for i in 0..n.count() {
                    let sep = n.key(i).to_vec();
                    self.node(Pid(n.child(i)), lo.as_deref(), Some(&sep), Some(lvl - 1))?;
                    lo = Some(sep);
                }
                self.node(Pid(n.upper_child()), lo.as_deref(), upper, Some(lvl - 1))?;
                Ok(lvl + 1)
            }
            k => Err(format!("page {pid} has node kind {k}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::NodeMut;
    use std::collections::HashMap;

    type Pages = HashMap<Pid, Box<[u8; PAGE_DATA_SIZE]>>;

    fn node(
        kind: u8,
        level: u16,
        fences: (Option<&[u8]>, Option<&[u8]>),
        entries: &[(&[u8], u64)],
        right: u64,
        upper: u64,
    ) -> Box<[u8; PAGE_DATA_SIZE]> {
        let mut b = Box::new([0u8; PAGE_DATA_SIZE]);
        let mut n = NodeMut::new(&mut b);
        n.init(kind, level, fences.0, fences.1);
        for (i, (k, v)) in entries.iter().enumerate() {
            n.insert_at(i, k, &v.to_le_bytes());
        }
        n.set_right(right);
        n.set_upper_child(upper);
        b
    }

    fn leaf(
        fences: (Option<&[u8]>, Option<&[u8]>),
        entries: &[(&[u8], u64)],
        right: u64,
    ) -> Box<[u8; PAGE_DATA_SIZE]> {
        node(KIND_LEAF, 0, fences, entries, right, NO_PAGE)
    }

    /// Root 1 (separator "m") over leaves 2 ("a", "f") and 3 ("p", "x").
    fn two_levels() -> Pages {
        let mut p = Pages::new();
        p.insert(
            Pid(1),
            node(KIND_INNER, 1, (None, None), &[(b"m", 2)], NO_PAGE, 3),
        );
        p.insert(Pid(2), leaf((None, Some(b"m")), &[(b"a", 1), (b"f", 2)], 3));
        p.insert(
            Pid(3),
            leaf((Some(b"m"), None), &[(b"p", 3), (b"x", 4)], NO_PAGE),
        );
        p
    }

    fn check(p: &Pages) -> Result<TreeReport, String> {
        verify_tree(Pid(1), |pid| {
            p.get(&pid).cloned().ok_or_else(|| format!("no page {pid}"))
        })
    }

    #[test]
    fn a_sound_tree_is_counted() {
        let r = check(&two_levels()).unwrap();
        assert_eq!((r.entries, r.height, r.leaves, r.inner_nodes), (4, 2, 2, 1));
        assert_eq!(r.pages, vec![Pid(1), Pid(2), Pid(3)]);
        assert_eq!(r.levels.iter().map(|l| l.0).collect::<Vec<_>>(), vec![2, 1]);
        assert_eq!(r.levels.iter().map(|l| l.1).sum::<u64>(), r.bytes_used);
        assert!(r.fill() > 0.0 && r.fill() < 0.1, "{}", r.fill());
    }

    #[test]
    fn every_broken_invariant_is_named() {
        let broken = |f: &dyn Fn(&mut Pages), expect: &str| {
            let mut p = two_levels();
            f(&mut p);
            let e = check(&p).expect_err(expect);
            assert!(e.contains(expect), "expected '{expect}' in: {e}");
        };
        broken(
            &|p| {
                p.insert(Pid(2), leaf((None, Some(b"m")), &[(b"f", 1)], NO_PAGE));
            },
            "links right to",
        );
        broken(
            &|p| {
                p.insert(Pid(3), leaf((Some(b"m"), None), &[(b"c", 3)], NO_PAGE));
            },
            "outside its fences",
        );
        broken(
            &|p| {
                p.insert(Pid(3), leaf((Some(b"k"), None), &[(b"p", 3)], NO_PAGE));
            },
            "its parent says",
        );
        broken(
            &|p| {
                p.insert(
                    Pid(1),
                    node(KIND_INNER, 1, (None, None), &[(b"m", 2)], NO_PAGE, 2),
                );
            },
            "reached twice",
        );
        broken(
            &|p| {
                p.insert(
                    Pid(1),
                    node(KIND_INNER, 2, (None, None), &[(b"m", 2)], NO_PAGE, 3),
                );
            },
            "expected 1",
        );
        broken(
            &|p| {
                p.remove(&Pid(3));
            },
            "no page 0:3",
        );
        broken(
            &|p| {
                // swap the two keys of leaf 2 behind the node code's back: heads and infos
                // (2 slots: heads at HEADER, infos at HEADER + 16)
                let b = p.get_mut(&Pid(2)).unwrap();
                for at in [node::HEADER, node::HEADER + 16] {
                    let (x, y) = (b[at..at + 8].to_vec(), b[at + 8..at + 16].to_vec());
                    b[at..at + 8].copy_from_slice(&y);
                    b[at + 8..at + 16].copy_from_slice(&x);
                }
            },
            "out of order",
        );
        broken(
            &|p| p.get_mut(&Pid(2)).unwrap()[node::HEADER] ^= 1, // a head byte
            "head does not match",
        );
        broken(&|p| p.get_mut(&Pid(3)).unwrap()[0] = 7, "node kind 7");
        broken(
            &|p| p.get_mut(&Pid(3)).unwrap()[2] = 168, // count: slots run into the heap
            "heap starts at",
        );
        broken(
            &|p| p.get_mut(&Pid(3)).unwrap()[6] = 9, // dead bytes that are not there
            "heap accounting",
        );
        broken(
            &|p| {
                let b = p.get_mut(&Pid(3)).unwrap();
                // slot 1's record moved onto slot 0's (2 slots: infos at HEADER + 16)
                let (i0, i1) = (node::HEADER + 16, node::HEADER + 24);
                let o0 = b[i0..i0 + 2].to_vec();
                b[i1..i1 + 2].copy_from_slice(&o0);
            },
            "overlaps",
        );
    }

    #[test]
    fn an_empty_record_at_the_heap_start_is_sound() {
        // an empty key with an empty value sits at the heap start, where the fence may be:
        // zero bytes overlap nothing (a proptest case found the check calling it an overlap)
        let mut b = Box::new([0u8; PAGE_DATA_SIZE]);
        let mut n = NodeMut::new(&mut b);
        n.init(KIND_LEAF, 0, None, Some(b"zz"));
        n.insert_at(0, b"", b"");
        n.insert_at(1, b"a", b"xyz");
        assert_eq!(node::check_layout(&b), Ok(()));
    }

    #[test]
    fn garbage_pages_are_errors_never_panics() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut errors = 0;
        for round in 0..2_000 {
            let mut p = two_levels();
            let victim = p.get_mut(&Pid(1 + round % 3)).unwrap();
            // scribble over a few header, slot or heap bytes
            for _ in 0..rng.random_range(1..6) {
                let at = if rng.random_bool(0.7) {
                    rng.random_range(0..node::HEADER + 3 * node::SLOT)
                } else {
                    rng.random_range(0..PAGE_DATA_SIZE)
                };
                victim[at] = rng.random();
            }
            if check(&p).is_err() {
                errors += 1;
            }
        }
        // most scribbles break something; none may panic or loop
        assert!(
            errors > 1_000,
            "{errors} of 2000 scribbled trees failed the check"
        );
    }
}
