//! Scans: one leaf at a time under a shared guard, following right links forward and
//! descending again backward; the marks that refuse a write to a tree from inside its own scan.

use super::*;

thread_local! {
    /// Roots of the trees this thread is scanning right now (inside a `scan` callback). A mark
    /// is only ever set while the scan holds a leaf's shared guard, so a task (shoal_engine::
    /// tasks) never pauses with one set and another task of its thread never sees it.
    static SCANNING: std::cell::RefCell<Vec<Pid>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Marks a tree as being scanned by this thread until dropped.
pub(super) struct Scanning(Pid);

impl Scanning {
    pub(super) fn enter(root: Pid) -> Scanning {
        SCANNING.with(|s| s.borrow_mut().push(root));
        Scanning(root)
    }
}

impl Drop for Scanning {
    fn drop(&mut self) {
        SCANNING.with(|s| {
            let mut s = s.borrow_mut();
            let at = s.iter().rposition(|&r| r == self.0);
            debug_assert!(at.is_some(), "scan marks are dropped in order");
            if let Some(at) = at {
                s.remove(at);
            }
        });
    }
}

/// A write to the tree at `root` from inside one of its own scans would wait for the scan's
/// shared latch for ever: refuse it.
pub(crate) fn no_write_in_own_scan(root: Pid) -> Result<(), TreeError> {
    if SCANNING.with(|s| s.borrow().contains(&root)) {
        return Err(TreeError::WriteInScan);
    }
    Ok(())
}

/// Copy slot `i`'s whole value out of a leaf a scan holds shared, following an overflow
/// reference (the shared latch keeps its chain from being freed). False: in a task, a page of
/// the chain is one a paused task of this thread is loading (`Worker::run_while_holding`);
/// the scan lets the leaf go and starts over at this slot's key.
pub(super) fn value_in_scan(
    w: &Worker,
    g: &SharedGuard<'_>,
    i: usize,
    v: &mut Vec<u8>,
) -> Result<bool, TreeError> {
    let p = g.page();
    node::value_into(p, i, v);
    if node::val_flags(p, i) & FLAG_OVERFLOW != 0 {
        let r = ValueRef::decode(v).ok_or_else(|| damaged(g.pid()))?;
        return Ok(w.run_while_holding(|w| overflow::read(w, r, v))?.is_some());
    }
    Ok(true)
}

impl BTree {
    /// Visit entries from `start` in `dir` order (ascending: keys >= start; descending: keys
    /// <= start, so descending from `&[]` visits only an empty key: from the last key down is
    /// `iter(w).rev()`) until `f` returns `false`. `f` runs while a shared latch is held: a write to
    /// this tree from inside `f` fails with [`TreeError::WriteInScan`] (it would wait for
    /// that latch for ever). To write while iterating, use [`BTree::range`], which holds no
    /// latch between entries.
    pub fn scan(
        &self,
        w: &Worker,
        start: &[u8],
        dir: Direction,
        mut f: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), TreeError> {
        self.check_worker(w)?;
        let (mut k, mut v) = (Vec::new(), Vec::new());
        match dir {
            Direction::Ascending => {
                // where to (re)start: keys >= `from`. A scan starts over from the root, holding
                // no guard, where a task holding its leaf may not wait (`value_in_scan`,
                // `Worker::run_while_holding`).
                let mut from = start.to_vec();
                'descend: loop {
                    let mut g: SharedGuard<'_> =
                        w.run(|w| self.find_leaf(w, &from)?.to_shared())?;
                    // from here a leaf's guard is held (the next one is taken before the last
                    // is let go) until the scan ends or starts over
                    let _scanning = Scanning::enter(self.root);
                    let mut i = node::lower_bound(g.page(), &from).0;
                    loop {
                        let p = g.page();
                        while i < node::count(p) {
                            node::key_into(p, i, &mut k);
                            if !value_in_scan(w, &g, i, &mut v)? {
                                from.clone_from(&k);
                                continue 'descend;
                            }
                            if !f(&k, &v) {
                                return Ok(());
                            }
                            i += 1;
                        }
                        let r = node::right(p);
                        if r == NO_PAGE {
                            return Ok(());
                        }
                        match w.run_while_holding(|w| w.shared(Pid(r)))? {
                            Some(next) => g = next,
                            None => {
                                // the smallest key above this leaf's upper fence
                                let Some(mut up) = node::fence(p, true) else {
                                    return Err(TreeError::Engine(EngineError::Catalog(format!(
                                        "leaf {} has a right sibling but no upper fence",
                                        g.pid()
                                    ))));
                                };
                                up.push(0);
                                from = up;
                                continue 'descend;
                            }
                        }
                        i = 0;
                    }
                }
            }
            Direction::Descending => {
                let mut bound = start.to_vec();
                'leaf: loop {
                    let g = w.run(|w| self.find_leaf(w, &bound)?.to_shared())?;
                    let _scanning = Scanning::enter(self.root); // let go before `g`
                    let p = g.page();
                    let (i, exact) = node::lower_bound(p, &bound);
                    let mut j = if exact { i + 1 } else { i };
                    while j > 0 {
                        j -= 1;
                        node::key_into(p, j, &mut k);
                        if !value_in_scan(w, &g, j, &mut v)? {
                            // start over at this key (included), holding nothing
                            bound.clone_from(&k);
                            continue 'leaf;
                        }
                        if !f(&k, &v) {
                            return Ok(());
                        }
                    }
                    match node::fence(p, false) {
                        None => return Ok(()),
                        Some(lower) => bound = lower,
                    }
                }
            }
        }
    }
}
