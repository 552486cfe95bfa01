//! Merging one page's records from several logs: which records bring the page to its newest
//! version (docs/durability.md, "Clusters").
//!
//! On a cluster every node logs the changes its own workers make, whatever the page's home, so
//! the records of one page are spread over several logs. Each record names the page's version
//! after it (the page carries its version in its own bytes, from node to node and into the
//! store), which orders them across logs. A page's newest state is a *chain*: a base (the
//! store's copy at its version, or a whole image) followed by changes of one version each.
//!
//! [`plan`] is the rule, pure: the recovery of a cluster runs it per page, and the durability
//! model check (tests/coherence_model.rs) runs the same function over every crash it makes.
//!
//! It must not know about files, nodes or frames: it is given versions and kinds.

/// One record of a page, as far as the merge needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// The page's version after the record.
    pub version: u64,
    /// A whole image (else a change of the version before it).
    pub image: bool,
    /// The caller's handle of the record (returned in [`Plan::apply`]).
    pub at: usize,
}

/// What to do with one page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The handles of the records to apply, in order; empty: the store's copy is the newest.
    /// If the first is not an image, the chain starts from the store's copy.
    pub apply: Vec<usize>,
    /// The version the page reaches.
    pub version: u64,
    /// Records newer than [`Plan::version`] that cannot be applied: a change whose version
    /// before it is in no log and not the store's (the lowest such version, and the newest
    /// version found). With every node's durable log read, this never happens: it means a log
    /// is missing or damaged, and recovery reports it instead of going on without it.
    pub gap: Option<(u64, u64)>,
}

/// The chain that brings a page from the store's copy (`stored`: its version; `None` when the
/// store holds no copy) to the newest version the records allow. Records at or below a version
/// already reached are older states (a node's log may hold changes that a later holder's
/// changes or a write-back made older) and are skipped: a page never goes back in time. Two
/// records of one version are the same state (a page received dirty is logged whole at the
/// version it arrived with); either serves.
pub fn plan(stored: Option<u64>, found: &mut [Found]) -> Plan {
    found.sort_by_key(|f| (f.version, !f.image));
    let mut cur = stored;
    let mut apply: Vec<usize> = Vec::new();
    let mut gap = None;
    for f in found.iter() {
        let newer = cur.is_none_or(|c| f.version > c);
        if !newer {
            continue;
        }
        if f.image {
            // a whole page: the chain starts again here
            apply.clear();
            apply.push(f.at);
            cur = Some(f.version);
            gap = None;
        } else if cur.is_some_and(|c| c + 1 == f.version) {
            apply.push(f.at);
            cur = Some(f.version);
        } else {
            // a change whose base is missing; an image further on may still cover it
            let missing = cur.map_or(0, |c| c + 1);
            let (low, _) = gap.unwrap_or((missing, f.version));
            gap = Some((low, f.version));
        }
    }
    if let (Some((low, _)), Some(last)) = (gap, found.last()) {
        gap = Some((low, last.version));
    }
    Plan {
        apply,
        version: cur.unwrap_or(0),
        gap,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(version: u64, image: bool, at: usize) -> Found {
        Found { version, image, at }
    }

    #[test]
    fn changes_of_two_logs_join_into_one_chain_by_version() {
        // node A changed the page from the store's version 4 to 6, node B from 6 to 8
        let mut found = [
            f(7, false, 10),
            f(8, false, 11),
            f(5, false, 0),
            f(6, false, 1),
        ];
        let p = plan(Some(4), &mut found);
        assert_eq!(p.apply, vec![0, 1, 10, 11]);
        assert_eq!((p.version, p.gap), (8, None));
    }

    #[test]
    fn records_older_than_the_store_are_skipped_so_the_page_never_goes_back() {
        let mut found = [f(3, true, 0), f(4, false, 1), f(5, false, 2)];
        let p = plan(Some(9), &mut found);
        assert_eq!((p.apply, p.version, p.gap), (vec![], 9, None));
    }

    #[test]
    fn an_image_starts_the_chain_again_and_covers_a_missing_change() {
        let mut found = [
            f(6, false, 0),
            f(7, true, 1),
            f(8, false, 2),
            f(7, false, 3),
        ];
        let p = plan(Some(4), &mut found);
        assert_eq!(p.apply, vec![1, 2], "the image of version 7, then 8");
        assert_eq!((p.version, p.gap), (8, None));
    }

    #[test]
    fn a_change_whose_base_no_log_holds_is_a_gap_not_a_silent_end() {
        let mut found = [f(5, false, 0), f(7, false, 1), f(8, false, 2)];
        let p = plan(Some(4), &mut found);
        assert_eq!(p.apply, vec![0]);
        assert_eq!((p.version, p.gap), (5, Some((6, 8))));
        // without a copy in the store, a chain must begin with an image
        let mut found = [f(2, false, 0)];
        let p = plan(None, &mut found);
        assert_eq!((p.apply.len(), p.gap), (0, Some((0, 2))));
    }
}
