//! The nine TPC-C tables and two secondary indexes as B-trees: key encodings (order-preserving,
//! [`KeyBuilder`]) and fixed-layout rows.
//!
//! Every row of a table has the same length: strings are zero-padded to their maximum length,
//! money is an `i64` of cents, rates (tax, discount) are `u32` in units of 1/10,000. So a row is
//! changed in place (`BTree::update`, same length) by writing a field at its offset, and sums of
//! money are exact, which the consistency checks need.

use byteorder::{ByteOrder, LittleEndian};
use shoal_btree::{BTree, KeyBuilder, TreeError};
use shoal_engine::Worker;

/// A field of a row: `len` bytes at `off`.
#[derive(Clone, Copy, Debug)]
pub struct F {
    off: usize,
    len: usize,
}

impl F {
    const fn first(len: usize) -> F {
        F { off: 0, len }
    }
    /// The field after this one.
    const fn then(self, len: usize) -> F {
        F {
            off: self.off + self.len,
            len,
        }
    }
    pub const fn end(self) -> usize {
        self.off + self.len
    }
    /// The field's bytes within its row.
    pub const fn bytes(self) -> std::ops::Range<usize> {
        self.off..self.off + self.len
    }
    pub const fn size(self) -> usize {
        self.len
    }
}

pub fn get_u32(row: &[u8], f: F) -> u32 {
    debug_assert_eq!(f.len, 4);
    LittleEndian::read_u32(&row[f.off..])
}
pub fn set_u32(row: &mut [u8], f: F, v: u32) {
    debug_assert_eq!(f.len, 4);
    row[f.off..f.off + 4].copy_from_slice(&v.to_le_bytes());
}
pub fn get_i64(row: &[u8], f: F) -> i64 {
    debug_assert_eq!(f.len, 8);
    LittleEndian::read_i64(&row[f.off..])
}
pub fn set_i64(row: &mut [u8], f: F, v: i64) {
    debug_assert_eq!(f.len, 8);
    row[f.off..f.off + 8].copy_from_slice(&v.to_le_bytes());
}
/// The bytes of `f`, padding included.
pub fn raw(row: &[u8], f: F) -> &[u8] {
    &row[f.off..f.off + f.len]
}
/// The string in `f` (zero padding removed).
pub fn get_str(row: &[u8], f: F) -> &[u8] {
    let b = &row[f.off..f.off + f.len];
    let n = b.iter().rposition(|&c| c != 0).map_or(0, |i| i + 1);
    &b[..n]
}
/// Store `s` in `f`, truncated to the field and zero-padded.
pub fn set_str(row: &mut [u8], f: F, s: &[u8]) {
    let b = &mut row[f.off..f.off + f.len];
    let n = s.len().min(f.len);
    b[..n].copy_from_slice(&s[..n]);
    b[n..].fill(0);
}

/// An address block after field `$after`: street 1 (20), street 2 (20), city (20), state (2),
/// zip (9); evaluates to the zip field, which ends the block ([`ADDRESS_LEN`] bytes).
macro_rules! address {
    ($after:expr) => {{
        let street1 = $after.then(20);
        let street2 = street1.then(20);
        let city = street2.then(20);
        let state = city.then(2);
        state.then(9)
    }};
}

// the largest row with its key (customer, 7 bytes) fits a B-tree record
const _: () = assert!(customer::LEN + 7 <= shoal_btree::MAX_RECORD);

/// Bytes of an address block.
pub const ADDRESS_LEN: usize = 71;

pub mod warehouse {
    use super::F;
    pub const NAME: F = F::first(10);
    pub const ADDRESS_END: F = address!(NAME);
    pub const TAX: F = ADDRESS_END.then(4);
    pub const YTD: F = TAX.then(8);
    pub const LEN: usize = YTD.end();
}

pub mod district {
    use super::F;
    pub const NAME: F = F::first(10);
    pub const ADDRESS_END: F = address!(NAME);
    pub const TAX: F = ADDRESS_END.then(4);
    pub const YTD: F = TAX.then(8);
    pub const NEXT_O_ID: F = YTD.then(4);
    pub const LEN: usize = NEXT_O_ID.end();
}

pub mod customer {
    use super::F;
    pub const FIRST: F = F::first(16);
    pub const MIDDLE: F = FIRST.then(2);
    pub const LAST: F = MIDDLE.then(16);
    pub const ADDRESS_END: F = address!(LAST);
    pub const PHONE: F = ADDRESS_END.then(16);
    pub const SINCE: F = PHONE.then(8);
    pub const CREDIT: F = SINCE.then(2);
    pub const CREDIT_LIM: F = CREDIT.then(8);
    pub const DISCOUNT: F = CREDIT_LIM.then(4);
    pub const BALANCE: F = DISCOUNT.then(8);
    pub const YTD_PAYMENT: F = BALANCE.then(8);
    pub const PAYMENT_CNT: F = YTD_PAYMENT.then(4);
    pub const DELIVERY_CNT: F = PAYMENT_CNT.then(4);
    pub const DATA: F = DELIVERY_CNT.then(500);
    pub const LEN: usize = DATA.end();
}

pub mod history {
    use super::F;
    pub const C_ID: F = F::first(4);
    pub const C_D_ID: F = C_ID.then(4);
    pub const C_W_ID: F = C_D_ID.then(4);
    pub const D_ID: F = C_W_ID.then(4);
    pub const W_ID: F = D_ID.then(4);
    pub const DATE: F = W_ID.then(8);
    pub const AMOUNT: F = DATE.then(8);
    pub const DATA: F = AMOUNT.then(24);
    pub const LEN: usize = DATA.end();
}

pub mod order {
    use super::F;
    pub const C_ID: F = F::first(4);
    pub const ENTRY_D: F = C_ID.then(8);
    /// 0: not delivered yet.
    pub const CARRIER_ID: F = ENTRY_D.then(4);
    pub const OL_CNT: F = CARRIER_ID.then(4);
    pub const ALL_LOCAL: F = OL_CNT.then(4);
    pub const LEN: usize = ALL_LOCAL.end();
}

pub mod order_line {
    use super::F;
    pub const I_ID: F = F::first(4);
    pub const SUPPLY_W_ID: F = I_ID.then(4);
    /// 0: not delivered yet.
    pub const DELIVERY_D: F = SUPPLY_W_ID.then(8);
    pub const QUANTITY: F = DELIVERY_D.then(4);
    pub const AMOUNT: F = QUANTITY.then(8);
    pub const DIST_INFO: F = AMOUNT.then(24);
    pub const LEN: usize = DIST_INFO.end();
}

pub mod item {
    use super::F;
    pub const IM_ID: F = F::first(4);
    pub const NAME: F = IM_ID.then(24);
    pub const PRICE: F = NAME.then(8);
    pub const DATA: F = PRICE.then(50);
    pub const LEN: usize = DATA.end();
}

pub mod stock {
    use super::F;
    pub const QUANTITY: F = F::first(4);
    /// `S_DIST_01` .. `S_DIST_10`, 24 bytes each: district `d` is at `DIST.off + 24 * (d - 1)`.
    pub const DIST: F = QUANTITY.then(240);
    pub const YTD: F = DIST.then(8);
    pub const ORDER_CNT: F = YTD.then(4);
    pub const REMOTE_CNT: F = ORDER_CNT.then(4);
    pub const DATA: F = REMOTE_CNT.then(50);
    pub const LEN: usize = DATA.end();

    /// `S_DIST_xx` of district `d` (1..=10).
    pub fn dist(d: u8) -> F {
        F {
            off: DIST.off + 24 * (d as usize - 1),
            len: 24,
        }
    }
}

// keys: warehouse u16, district u8, customer u32, order u32, item u32

/// A key of a fixed-width layout, built on the stack: big-endian fields as [`KeyBuilder`]
/// lays them out, without allocating (a transaction builds dozens of keys).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    len: u8,
    bytes: [u8; Key::MAX],
}

impl Key {
    /// The longest fixed-width key (history: 2 + 1 + 4 + 8 bytes).
    pub const MAX: usize = 16;

    fn new() -> Key {
        Key {
            len: 0,
            bytes: [0; Key::MAX],
        }
    }
    fn put(mut self, b: &[u8]) -> Key {
        let at = self.len as usize;
        self.bytes[at..at + b.len()].copy_from_slice(b);
        self.len += b.len() as u8;
        self
    }
    fn u8(self, v: u8) -> Key {
        self.put(&[v])
    }
    fn u16(self, v: u16) -> Key {
        self.put(&v.to_be_bytes())
    }
    fn u32(self, v: u32) -> Key {
        self.put(&v.to_be_bytes())
    }
    fn u64(self, v: u64) -> Key {
        self.put(&v.to_be_bytes())
    }
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl std::ops::Deref for Key {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for Key {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_slice().fmt(f)
    }
}

pub fn warehouse_key(w: u16) -> Key {
    Key::new().u16(w)
}
pub fn district_key(w: u16, d: u8) -> Key {
    Key::new().u16(w).u8(d)
}
pub fn customer_key(w: u16, d: u8, c: u32) -> Key {
    Key::new().u16(w).u8(d).u32(c)
}
/// Customer by last name: `(w, d, last, first, c_id)`, value empty. A scan from
/// [`customer_name_prefix`] visits one last name's customers sorted by first name.
pub fn customer_name_key(w: u16, d: u8, last: &[u8], first: &[u8], c: u32) -> Vec<u8> {
    KeyBuilder::new()
        .u16(w)
        .u8(d)
        .bytes(last)
        .bytes(first)
        .u32(c)
        .finish()
}
pub fn customer_name_prefix(w: u16, d: u8, last: &[u8]) -> Vec<u8> {
    KeyBuilder::new().u16(w).u8(d).bytes(last).finish()
}
/// History rows have no primary key in TPC-C: `(w, d, c, unique)` where `unique` is made by
/// the inserting worker.
pub fn history_key(w: u16, d: u8, c: u32, unique: u64) -> Key {
    Key::new().u16(w).u8(d).u32(c).u64(unique)
}
pub fn order_key(w: u16, d: u8, o: u32) -> Key {
    Key::new().u16(w).u8(d).u32(o)
}
/// Orders by customer: `(w, d, c, o_id)`, value empty.
pub fn order_customer_key(w: u16, d: u8, c: u32, o: u32) -> Key {
    Key::new().u16(w).u8(d).u32(c).u32(o)
}
pub fn order_line_key(w: u16, d: u8, o: u32, n: u8) -> Key {
    Key::new().u16(w).u8(d).u32(o).u8(n)
}
pub fn item_key(i: u32) -> Key {
    Key::new().u32(i)
}
pub fn stock_key(w: u16, i: u32) -> Key {
    Key::new().u16(w).u32(i)
}

/// The last 4 bytes of a key, as the u32 component it ends with (c_id of a name-index key,
/// o_id of an order-by-customer key).
pub fn key_tail_u32(k: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(
        k.get(k.len().checked_sub(4)?..)?.try_into().ok()?,
    ))
}

/// The warehouse-keyed trees of the warehouses homed at one node.
#[derive(Clone, Copy)]
pub struct Set {
    pub warehouse: BTree,
    pub district: BTree,
    pub customer: BTree,
    pub customer_name: BTree,
    pub history: BTree,
    pub new_order: BTree,
    pub order: BTree,
    pub order_customer: BTree,
    pub order_line: BTree,
    pub stock: BTree,
}

/// Tables of a [`Set`], in its field order (catalog names: `tpcc.<table>` for node 0's set,
/// `tpcc.<table>.<node>` for the others').
const SET_TABLES: [&str; 10] = [
    "warehouse",
    "district",
    "customer",
    "customer_name",
    "history",
    "new_order",
    "order",
    "order_customer",
    "order_line",
    "stock",
];
const ITEM: &str = "tpcc.item";

/// The trees of one TPC-C database, by name from the catalog: `item` (read-only, shared by
/// every warehouse) and one [`Set`] of the other tables per node, holding the warehouses homed
/// at that node. Separate trees per node keep pages that every transaction writes (the
/// warehouse and district rows, the right edges and inner nodes of the growing order tables)
/// apart: with shared trees, two nodes' warehouses share those pages and each write moves
/// them between the nodes.
#[derive(Clone)]
pub struct Tables {
    pub item: BTree,
    sets: Vec<Set>,
    /// The node (set) of each warehouse (index: warehouse id - 1).
    node_of: Vec<u8>,
}

fn set_name(table: &str, node: usize) -> String {
    if node == 0 {
        format!("tpcc.{table}")
    } else {
        format!("tpcc.{table}.{node}")
    }
}

impl Tables {
    /// Create every tree (`create`) or open existing ones, for `warehouses` warehouses spread
    /// over `nodes` nodes as `node_of` says (index: warehouse id - 1).
    pub fn get(w: &Worker, create: bool, node_of: Vec<u8>) -> Result<Tables, TreeError> {
        let nodes = node_of.iter().map(|&n| n as usize + 1).max().unwrap_or(1);
        let tree = |name: &str| {
            if create {
                BTree::create(w, name)
            } else {
                BTree::open(w, name)
            }
        };
        let item = tree(ITEM)?;
        let mut sets = Vec::with_capacity(nodes);
        for n in 0..nodes {
            let mut t = Vec::with_capacity(SET_TABLES.len());
            for table in SET_TABLES {
                t.push(tree(&set_name(table, n))?);
            }
            sets.push(Set {
                warehouse: t[0],
                district: t[1],
                customer: t[2],
                customer_name: t[3],
                history: t[4],
                new_order: t[5],
                order: t[6],
                order_customer: t[7],
                order_line: t[8],
                stock: t[9],
            });
        }
        Ok(Tables {
            item,
            sets,
            node_of,
        })
    }

    /// One node's tables for a database of warehouses `1..=warehouses` (unit tests).
    #[cfg(test)]
    pub fn single(w: &Worker, warehouses: u16) -> Result<Tables, TreeError> {
        Tables::get(w, true, vec![0; warehouses as usize])
    }

    /// The trees that hold warehouse `wid`'s rows (of every table but `item`); node 0's for
    /// an id outside the database (where lookups then find nothing).
    pub fn at(&self, wid: u16) -> &Set {
        let node = self.node_of.get((wid as usize).wrapping_sub(1)).copied();
        &self.sets[node.unwrap_or(0) as usize]
    }

    /// The node of each warehouse (index: warehouse id - 1).
    pub fn node_of(&self) -> &[u8] {
        &self.node_of
    }

    /// Bytes the catalog needs for the trees of a database on `nodes` nodes (with entries of
    /// other data structures, the catalog page holds about 4 KiB).
    pub fn catalog_bytes(nodes: usize) -> usize {
        let entry = |name: &str| name.len() + 9;
        entry(ITEM)
            + (0..nodes)
                .flat_map(|n| SET_TABLES.iter().map(move |t| entry(&set_name(t, n))))
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_fit_and_fields_do_not_overlap() {
        assert_eq!(customer::LEN, customer::DATA.end());
        assert_eq!(stock::dist(10).end(), stock::YTD.off);
        let mut row = vec![0u8; customer::LEN];
        set_str(&mut row, customer::LAST, b"BARBARBAR");
        set_i64(&mut row, customer::BALANCE, -1000);
        set_u32(&mut row, customer::PAYMENT_CNT, 7);
        set_str(&mut row, customer::DATA, &[b'x'; 600]);
        assert_eq!(get_str(&row, customer::LAST), b"BARBARBAR");
        assert_eq!(get_i64(&row, customer::BALANCE), -1000);
        assert_eq!(get_u32(&row, customer::PAYMENT_CNT), 7);
        assert_eq!(get_str(&row, customer::DATA).len(), 500);
    }

    #[test]
    fn keys_sort_like_their_components() {
        assert!(order_key(1, 2, 3000) < order_key(1, 2, 3001));
        assert!(order_key(1, 2, 99_999) < order_key(1, 3, 1));
        assert!(
            customer_name_key(1, 1, b"ABLE", b"ZED", 9)
                < customer_name_key(1, 1, b"ABLEX", b"A", 1)
        );
        let k = customer_name_key(1, 1, b"ABLE", b"ZED", 9);
        assert!(k.starts_with(&customer_name_prefix(1, 1, b"ABLE")));
        assert!(!k.starts_with(&customer_name_prefix(1, 1, b"ABL")));
        assert_eq!(key_tail_u32(&k), Some(9));
    }

    /// Warehouses of one node share a set of trees, each node has its own, and a reopened
    /// database finds the same trees; the catalog holds 16 nodes' sets.
    #[test]
    fn each_node_has_its_own_set_of_trees_found_again_on_open() {
        use shoal_engine::{catalog::CAPACITY, Engine, EngineConfig};
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open(EngineConfig::new(dir.path(), 64 << 20)).unwrap();
        let w = e.worker();
        let node_of = vec![0, 0, 1, 2];
        let t = Tables::get(&w, true, node_of.clone()).unwrap();
        assert_eq!(t.at(1).district.root(), t.at(2).district.root());
        assert_ne!(t.at(2).district.root(), t.at(3).district.root());
        assert_ne!(t.at(3).stock.root(), t.at(4).stock.root());
        assert_ne!(t.at(4).stock.root(), t.at(1).stock.root());
        // an id outside the database reads node 0's set (and finds nothing there)
        assert_eq!(t.at(9).order.root(), t.at(1).order.root());
        assert_eq!(t.at(0).order.root(), t.at(1).order.root());
        let names = w.catalog_list().unwrap();
        assert_eq!(names.len(), 1 + 3 * 10);
        assert!(names.iter().any(|(n, _)| n == "tpcc.order_line.2"));
        assert!(names.iter().any(|(n, _)| n == "tpcc.warehouse"));
        let used: usize = names.iter().map(|(n, _)| n.len() + 9).sum();
        assert_eq!(used, Tables::catalog_bytes(3));
        let again = Tables::get(&w, false, node_of).unwrap();
        assert_eq!(again.item.root(), t.item.root());
        for wid in 1..=4 {
            assert_eq!(again.at(wid).history.root(), t.at(wid).history.root());
            assert_eq!(again.at(wid).warehouse.root(), t.at(wid).warehouse.root());
        }
        assert!(Tables::catalog_bytes(16) <= CAPACITY);
        assert!(Tables::catalog_bytes(17) > CAPACITY);
        drop(w);
        e.close().unwrap();
    }
}
