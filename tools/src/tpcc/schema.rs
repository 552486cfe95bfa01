//! The nine TPC-C tables and two secondary indexes as B-trees: key encodings (order-preserving,
//! [`KeyBuilder`]) and fixed-layout rows.
//!
//! Every row of a table has the same length: strings are zero-padded to their maximum length,
//! money is an `i64` of cents, rates (tax, discount) are `u32` in units of 1/10,000. So a row is
//! changed in place (`BTree::update`, same length) by writing a field at its offset, and sums of
//! money are exact, which the consistency checks need.

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
}

pub fn get_u32(row: &[u8], f: F) -> u32 {
    debug_assert_eq!(f.len, 4);
    u32::from_le_bytes(row[f.off..f.off + 4].try_into().expect("4 bytes"))
}
pub fn set_u32(row: &mut [u8], f: F, v: u32) {
    debug_assert_eq!(f.len, 4);
    row[f.off..f.off + 4].copy_from_slice(&v.to_le_bytes());
}
pub fn get_i64(row: &[u8], f: F) -> i64 {
    debug_assert_eq!(f.len, 8);
    i64::from_le_bytes(row[f.off..f.off + 8].try_into().expect("8 bytes"))
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

pub fn warehouse_key(w: u16) -> Vec<u8> {
    KeyBuilder::new().u16(w).finish()
}
pub fn district_key(w: u16, d: u8) -> Vec<u8> {
    KeyBuilder::new().u16(w).u8(d).finish()
}
pub fn customer_key(w: u16, d: u8, c: u32) -> Vec<u8> {
    KeyBuilder::new().u16(w).u8(d).u32(c).finish()
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
pub fn history_key(w: u16, d: u8, c: u32, unique: u64) -> Vec<u8> {
    KeyBuilder::new().u16(w).u8(d).u32(c).u64(unique).finish()
}
pub fn order_key(w: u16, d: u8, o: u32) -> Vec<u8> {
    KeyBuilder::new().u16(w).u8(d).u32(o).finish()
}
/// Orders by customer: `(w, d, c, o_id)`, value empty.
pub fn order_customer_key(w: u16, d: u8, c: u32, o: u32) -> Vec<u8> {
    KeyBuilder::new().u16(w).u8(d).u32(c).u32(o).finish()
}
pub fn order_line_key(w: u16, d: u8, o: u32, n: u8) -> Vec<u8> {
    KeyBuilder::new().u16(w).u8(d).u32(o).u8(n).finish()
}
pub fn item_key(i: u32) -> Vec<u8> {
    KeyBuilder::new().u32(i).finish()
}
pub fn stock_key(w: u16, i: u32) -> Vec<u8> {
    KeyBuilder::new().u16(w).u32(i).finish()
}

/// The last 4 bytes of a key, as the u32 component it ends with (c_id of a name-index key,
/// o_id of an order-by-customer key).
pub fn key_tail_u32(k: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(
        k.get(k.len().checked_sub(4)?..)?.try_into().ok()?,
    ))
}

/// The trees of one TPC-C database, opened by name from the catalog.
#[derive(Clone, Copy)]
pub struct Tables {
    pub warehouse: BTree,
    pub district: BTree,
    pub customer: BTree,
    pub customer_name: BTree,
    pub history: BTree,
    pub new_order: BTree,
    pub order: BTree,
    pub order_customer: BTree,
    pub order_line: BTree,
    pub item: BTree,
    pub stock: BTree,
}

const NAMES: [&str; 11] = [
    "tpcc.warehouse",
    "tpcc.district",
    "tpcc.customer",
    "tpcc.customer_name",
    "tpcc.history",
    "tpcc.new_order",
    "tpcc.order",
    "tpcc.order_customer",
    "tpcc.order_line",
    "tpcc.item",
    "tpcc.stock",
];

impl Tables {
    /// Create every tree (`create`) or open existing ones.
    pub fn get(w: &Worker, create: bool) -> Result<Tables, TreeError> {
        let mut t = Vec::with_capacity(NAMES.len());
        for n in NAMES {
            t.push(if create {
                BTree::create(w, n)?
            } else {
                BTree::open(w, n)?
            });
        }
        Ok(Tables {
            warehouse: t[0],
            district: t[1],
            customer: t[2],
            customer_name: t[3],
            history: t[4],
            new_order: t[5],
            order: t[6],
            order_customer: t[7],
            order_line: t[8],
            item: t[9],
            stock: t[10],
        })
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
}
