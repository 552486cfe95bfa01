//! Point reads: the optimistic descent to a leaf, single and batched lookups (several keys
//! descending together, their cache misses overlapping).

use super::*;

/// One key of a batched lookup.
pub(super) struct Lane<'w> {
    /// The node the key is at; `None`: a validation failed, look the key up again alone.
    node: Option<OptimisticGuard<'w>>,
    /// While descending: the child to go to next (`NO_PAGE`: none this round).
    child: Pid,
    /// At the leaf: the key's slot, if it exists.
    slot: Option<usize>,
}

/// Latch `child`, just read from `parent`, optimistically, and check that `parent` still
/// points at it. A merge may have freed `child` since `parent` was read, and loading a freed
/// page can fail (its slot holds an old image or nothing): such a failure is a restart when
/// `parent` changed meanwhile, and the error it is when not.
// Always inlined: it is every level of every lookup (out of line, sequential runs of the btree
// bench were slower; inlined, side-by-side runs match the build before it existed).
#[inline(always)]
pub(super) fn descend<'w>(
    w: &'w Worker,
    parent: &OptimisticGuard<'w>,
    child: Pid,
) -> OpResult<OptimisticGuard<'w>> {
    parent.validate()?; // `child` is a real pid
    let g = match w.optimistic(child) {
        Err(Restart::Fail(e)) => {
            parent.validate()?;
            return Err(Restart::Fail(e));
        }
        r => r?,
    };
    parent.validate()?; // and still the child for the key
    Ok(g)
}

impl BTree {
    /// Optimistic descent to the leaf whose range holds `key`.
    pub(crate) fn find_leaf<'w>(&self, w: &'w Worker, key: &[u8]) -> OpResult<OptimisticGuard<'w>> {
        let mut g = w.optimistic(self.root)?;
        loop {
            let p = g.page();
            match node::kind(p) {
                KIND_LEAF => return Ok(g),
                KIND_INNER => {
                    let (i, _) = node::lower_bound(p, key);
                    let c = Pid(node::child(p, i));
                    w.prefetch(c);
                    if node::level(p) == 1 {
                        value_hint::prefetch(w, self.root, p, i, key, c);
                    }
                    g = descend(w, &g, c)?;
                }
                _ => {
                    g.validate()?;
                    return Err(not_a_node(g.pid()));
                }
            }
        }
    }

    /// Copy the value of `key` into `out`. Returns whether the key exists.
    pub fn lookup(
        &self,
        w: &Worker,
        key: impl AsRef<[u8]>,
        out: &mut Vec<u8>,
    ) -> Result<bool, TreeError> {
        self.check_worker(w)?;
        self.lookup_into(w, key.as_ref(), out)
    }

    pub(super) fn lookup_into(
        &self,
        w: &Worker,
        key: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<bool, TreeError> {
        Self::check_key(key)?;
        Ok(w.run(|w| {
            let g = self.find_leaf(w, key)?;
            let p = g.page();
            let (i, found) = node::lower_bound(p, key);
            let mut big = false;
            if found {
                value_hint::learn(self.root, p, i);
                node::value_into(p, i, out);
                big = node::val_flags(p, i) & FLAG_OVERFLOW != 0;
            }
            g.validate()?;
            if big {
                let r = ValueRef::decode(out).ok_or_else(|| bad_reference(g.pid()))?;
                let read = overflow::read(w, r, out);
                // the chain is only trustworthy while the leaf still points at it
                g.validate()?;
                read?;
            }
            Ok(found)
        })?)
    }

    /// Copy the bytes `part` of `key`'s value into `out` (clipped to the value: a part past its
    /// end is shorter or empty). Returns whether the key exists. For one column of a row kept
    /// as one value: only those bytes are copied from a leaf (a value in overflow pages is
    /// read whole, then cut).
    pub fn lookup_part(
        &self,
        w: &Worker,
        key: impl AsRef<[u8]>,
        part: std::ops::Range<usize>,
        out: &mut Vec<u8>,
    ) -> Result<bool, TreeError> {
        self.check_worker(w)?;
        let key = key.as_ref();
        Self::check_key(key)?;
        Ok(w.run(|w| {
            let g = self.find_leaf(w, key)?;
            let p = g.page();
            let (i, found) = node::lower_bound(p, key);
            let mut big = false;
            out.clear();
            if found {
                big = node::val_flags(p, i) & FLAG_OVERFLOW != 0;
                if big {
                    node::value_into(p, i, out);
                } else {
                    // (a page changing underneath gives garbage, within the page, that the
                    // validation below discards)
                    node::value_part_into(p, i, &part, out);
                }
            }
            g.validate()?;
            if big {
                let r = ValueRef::decode(out).ok_or_else(|| bad_reference(g.pid()))?;
                let read = overflow::read(w, r, out);
                g.validate()?;
                read?;
                let r = node::clip(&part, out.len());
                out.truncate(r.end);
                out.drain(..r.start);
            }
            Ok(found)
        })?)
    }

    /// Look up many keys at once: calls `each(i, value)` for every `keys[i]`, in order of `i`,
    /// with `None` for keys that are absent. Same results as calling [`BTree::lookup`] for each
    /// key, but faster for large batches (a multi-get).
    ///
    /// A single lookup is a chain of cache misses (each node's address is known only once its
    /// parent is searched), so it waits for memory once per level. Here groups of
    /// [`LOOKUP_GROUP`] keys walk down together, level by level: search every key's node, then
    /// start loading every key's child, then latch them, so the misses of a group overlap and
    /// the group waits about once per level instead of once per level and key. A key whose
    /// walk sees a concurrent change (failed validation) is looked up again alone.
    ///
    /// Values are copied and validated before `each` sees them, as in `lookup`.
    pub fn lookup_many<K: AsRef<[u8]>>(
        &self,
        w: &Worker,
        keys: &[K],
        mut each: impl FnMut(usize, Option<&[u8]>),
    ) -> Result<(), TreeError> {
        self.check_worker(w)?;
        self.walk_groups(w, keys, None, |first, group, lanes, bufs| {
            for (j, lane) in lanes.iter().enumerate() {
                let found = match lane.node {
                    Some(_) => lane.slot.is_some(),
                    None => self.lookup(w, group[j].as_ref(), &mut bufs[j])?,
                };
                each(first + j, found.then_some(&bufs[j][..]));
            }
            Ok(())
        })
    }

    /// [`BTree::lookup_many`] of bytes `part` of each value (clipped to the value, as in
    /// [`BTree::lookup_part`]): only those bytes are copied, so a lookup of one column of
    /// large rows loads one cache line of each row instead of all of it.
    pub fn lookup_many_part<K: AsRef<[u8]>>(
        &self,
        w: &Worker,
        keys: &[K],
        part: std::ops::Range<usize>,
        mut each: impl FnMut(usize, Option<&[u8]>),
    ) -> Result<(), TreeError> {
        self.check_worker(w)?;
        self.walk_groups(w, keys, Some(&part), |first, group, lanes, bufs| {
            for (j, lane) in lanes.iter().enumerate() {
                let found = match lane.node {
                    Some(_) => lane.slot.is_some(),
                    None => self.lookup_part(w, group[j].as_ref(), part.clone(), &mut bufs[j])?,
                };
                each(first + j, found.then_some(&bufs[j][..]));
            }
            Ok(())
        })
    }

    /// [`BTree::lookup_many`] for a transaction: `each(i, Some((value, leaf, stamp)))` for a
    /// key found or absent at a leaf with that stamp (`value` `None`: absent), `each(i, None)`
    /// for a key whose batched walk saw a change or whose value is in overflow pages (the
    /// caller looks it up alone).
    pub(crate) fn lookup_many_stamped<K: AsRef<[u8]>>(
        &self,
        w: &Worker,
        keys: &[K],
        mut each: impl FnMut(usize, Option<(Option<&[u8]>, Pid, shoal_engine::PageStamp)>),
    ) -> Result<(), TreeError> {
        self.walk_groups(w, keys, None, |first, _, lanes, bufs| {
            for (j, lane) in lanes.iter().enumerate() {
                let at = lane.node.as_ref().map(|g| {
                    let v = lane.slot.map(|_| &bufs[j][..]);
                    (v, g.pid(), g.stamp())
                });
                each(first + j, at);
            }
            Ok(())
        })
    }

    /// Walk `keys` down in groups of [`LOOKUP_GROUP`] (`walk_group`), handing each walked
    /// group to `done` with the index of its first key, its keys, lanes and value buffers
    /// (bytes `part` of each value, if given).
    fn walk_groups<'w, K: AsRef<[u8]>>(
        &self,
        w: &'w Worker,
        keys: &[K],
        part: Option<&std::ops::Range<usize>>,
        mut done: impl FnMut(usize, &[K], &[Lane<'w>], &mut [Vec<u8>]) -> Result<(), TreeError>,
    ) -> Result<(), TreeError> {
        for k in keys {
            Self::check_key(k.as_ref())?;
        }
        let width = keys.len().min(LOOKUP_GROUP);
        let mut lanes: Vec<Lane<'w>> = Vec::with_capacity(width);
        let mut bufs: Vec<Vec<u8>> = (0..width).map(|_| Vec::new()).collect();
        for (g, group) in keys.chunks(LOOKUP_GROUP).enumerate() {
            let root = match w.optimistic(self.root) {
                Ok(r) => Some(r),
                Err(Restart::Retry) => None,
                Err(Restart::Fail(e)) => return Err(e.into()),
            };
            lanes.clear();
            lanes.extend(group.iter().map(|_| Lane {
                node: root.clone(),
                child: Pid(NO_PAGE),
                slot: None,
            }));
            self.walk_group(w, group, part, &mut lanes, &mut bufs)?;
            done(g * LOOKUP_GROUP, group, &lanes, &mut bufs)?;
        }
        Ok(())
    }

    /// Walk a group of keys down to their leaves and copy their values, or bytes `part` of
    /// them (see `lookup_many`). Lanes whose walk fails validation end with `node == None`.
    pub(super) fn walk_group<'w, K: AsRef<[u8]>>(
        &self,
        w: &'w Worker,
        keys: &[K],
        part: Option<&std::ops::Range<usize>>,
        lanes: &mut [Lane<'w>],
        bufs: &mut [Vec<u8>],
    ) -> Result<(), TreeError> {
        // Every round takes each lane that is at an inner node one level down (a lane at a leaf
        // waits for the others), so the rounds end: the tree's height bounds them.
        let mut missing = Vec::new();
        loop {
            let mut descending = false;
            // Search every inner node; start loading the children's translation entries.
            for (lane, key) in lanes.iter_mut().zip(keys) {
                lane.child = Pid(NO_PAGE);
                let Some(g) = &lane.node else { continue };
                let p = g.page();
                match node::kind(p) {
                    KIND_LEAF => {}
                    KIND_INNER => {
                        let (i, _) = node::lower_bound(p, key.as_ref());
                        lane.child = Pid(node::child(p, i));
                        w.prefetch(lane.child);
                        descending = true;
                    }
                    // Not a node (a changing page, or corruption): the lookup alone finds
                    // out which, and reports corruption.
                    _ => lane.node = None,
                }
            }
            if !descending {
                break;
            }
            // The entries are on their way: start loading the children's frames and headers.
            // Children not in memory are read from the store together, not one by one.
            missing.clear();
            for lane in lanes.iter_mut().filter(|l| l.child != Pid(NO_PAGE)) {
                if !w.prefetch_frame(lane.child) {
                    match &lane.node {
                        // validated: `child` is a real page
                        Some(parent) if parent.is_valid() => missing.push(lane.child),
                        _ => lane.node = None,
                    }
                }
            }
            if missing.len() > 1 {
                // Only a head start: a page that fails to load here (say one a merge freed
                // after its parent was read) is loaded again below, where the error counts
                // only if the parent still points at the page.
                let _ = w.load_many(&missing);
            }
            // Latch the children (checking that each parent still points at its child), start
            // loading their slot arrays.
            for lane in lanes.iter_mut().filter(|l| l.child != Pid(NO_PAGE)) {
                let Some(parent) = &lane.node else { continue };
                let next = descend(w, parent, lane.child);
                if let Ok(g) = &next {
                    node::prefetch_slots(g.page());
                }
                lane.node = match next {
                    Ok(g) => Some(g),
                    Err(Restart::Retry) => None,
                    Err(Restart::Fail(e)) => return Err(e.into()),
                };
            }
        }
        // At the leaves: search, start loading the values, then copy them.
        for (lane, key) in lanes.iter_mut().zip(keys) {
            if let Some(g) = &lane.node {
                let p = g.page();
                let (i, found) = node::lower_bound(p, key.as_ref());
                if found {
                    lane.slot = Some(i);
                    match part {
                        None => node::prefetch_value(p, i),
                        Some(part) => node::prefetch_value_part(p, i, part),
                    }
                }
            }
        }
        for (lane, buf) in lanes.iter_mut().zip(bufs) {
            if let Some(g) = &lane.node {
                if let Some(i) = lane.slot {
                    match part {
                        None => node::value_into(g.page(), i, buf),
                        Some(part) => node::value_part_into(g.page(), i, part, buf),
                    }
                    if node::val_flags(g.page(), i) & FLAG_OVERFLOW != 0 {
                        lane.node = None; // an overflow value: a lookup of its own reads it
                        continue;
                    }
                }
                if !g.is_valid() {
                    lane.node = None;
                }
            }
        }
        Ok(())
    }

    /// The value of `key`, if present.
    pub fn get(&self, w: &Worker, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, TreeError> {
        self.check_worker(w)?;
        let mut v = Vec::new();
        Ok(self.lookup_into(w, key.as_ref(), &mut v)?.then_some(v))
    }
}
