//! Page identity.

use std::fmt;

/// Most nodes a cluster can have: sharer sets are 64-bit bitmaps.
pub const MAX_NODES: usize = 64;

/// A page id: bits 63..56 are the home node (where the page's directory entry lives and where it
/// is persisted), bits 55..0 the page's slot in the home node's page store.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pid(pub u64);

const SLOT_BITS: u32 = 56;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

impl Pid {
    /// The catalog page: node 0, slot 0.
    pub const CATALOG: Pid = Pid(0);
    /// Marks a frame that holds no page. Its node field (255) is beyond [`MAX_NODES`].
    pub const NONE: Pid = Pid(u64::MAX);

    /// The page in `slot` of `node`'s store.
    pub const fn new(node: u8, slot: u64) -> Pid {
        assert!(slot <= SLOT_MASK, "slot exceeds 56 bits");
        Pid(((node as u64) << SLOT_BITS) | slot)
    }
    /// Home node.
    pub const fn node(self) -> u8 {
        (self.0 >> SLOT_BITS) as u8
    }
    /// Slot in the home node's store.
    pub const fn slot(self) -> u64 {
        self.0 & SLOT_MASK
    }
    /// The raw 64-bit value (stored in pages, e.g. child pointers).
    pub const fn raw(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for Pid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Pid::NONE {
            f.write_str("Pid(none)")
        } else {
            write!(f, "Pid({}:{})", self.node(), self.slot())
        }
    }
}

impl fmt::Display for Pid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{} ({:#x})", self.node(), self.slot(), self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn fields() {
        let p = Pid::new(3, 12345);
        assert_eq!(p.node(), 3);
        assert_eq!(p.slot(), 12345);
        assert_eq!(Pid::CATALOG, Pid::new(0, 0));
        assert_eq!(Pid::NONE.node(), 255);
        assert_eq!(format!("{p}"), "3:12345 (0x300000000003039)");
    }
}
