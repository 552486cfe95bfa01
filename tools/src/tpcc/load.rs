//! The standard initial population (clause 4.3.3.1): 100,000 items; per warehouse 100,000
//! stock rows and 10 districts; per district 3,000 customers (with one history row each) and
//! 3,000 orders, the last 900 of them undelivered (new-order rows), 5 to 15 lines each.

use super::random::{astring, data_with_original, last_name, now, nstring, nurand, zip, Constants};
use super::schema::*;
use rand::rngs::SmallRng;
use rand::Rng;
use shoal_btree::TreeError;
use shoal_engine::Worker;
use std::sync::atomic::{AtomicU64, Ordering};

pub const ITEMS: u32 = 100_000;
pub const DISTRICTS: u8 = 10;
pub const CUSTOMERS: u32 = 3_000;
pub const ORDERS: u32 = 3_000;
/// Orders from this id on are undelivered at load time.
pub const FIRST_NEW_ORDER: u32 = 2_101;

/// Rows a warehouse's population inserts (order lines counted at their mean of 10), for
/// the progress bar.
pub const ROWS_PER_WAREHOUSE: u64 = 1
    + ITEMS as u64
    + DISTRICTS as u64
        * (1 + 3 * CUSTOMERS as u64
            + 2 * ORDERS as u64
            + 10 * ORDERS as u64
            + (ORDERS - FIRST_NEW_ORDER + 1) as u64);

fn insert(t: &shoal_btree::BTree, w: &Worker, k: &[u8], v: &[u8]) -> Result<(), TreeError> {
    if !t.insert(w, k, v)?.inserted() {
        return Err(TreeError::Engine(shoal_engine::EngineError::Catalog(
            format!("population: key {k:?} inserted twice (is the database loaded already?)"),
        )));
    }
    Ok(())
}

/// Items `lo..=hi`.
pub fn items(
    w: &Worker,
    t: &Tables,
    lo: u32,
    hi: u32,
    rng: &mut SmallRng,
    done: &AtomicU64,
) -> Result<(), TreeError> {
    let mut row = vec![0u8; item::LEN];
    for i in lo..=hi {
        set_u32(&mut row, item::IM_ID, rng.random_range(1..=10_000));
        set_str(&mut row, item::NAME, &astring(rng, 14, 24));
        set_i64(&mut row, item::PRICE, rng.random_range(100..=10_000));
        set_str(&mut row, item::DATA, &data_with_original(rng));
        insert(&t.item, w, &item_key(i), &row)?;
        if i % 1024 == 0 {
            done.fetch_add(1024, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// A random address in the block that ends with the zip field `zip_field`.
fn address(row: &mut [u8], zip_field: F, rng: &mut SmallRng) {
    let mut b = Vec::with_capacity(ADDRESS_LEN);
    for _ in 0..3 {
        let mut s = astring(rng, 10, 20);
        s.resize(20, 0);
        b.extend_from_slice(&s);
    }
    b.extend_from_slice(&astring(rng, 2, 2));
    b.extend_from_slice(&zip(rng));
    let start = zip_field.end() - ADDRESS_LEN;
    row[start..start + ADDRESS_LEN].copy_from_slice(&b);
}

/// One warehouse with its stock, districts, customers, history, orders, order lines and new
/// orders.
pub fn warehouse(
    w: &Worker,
    t: &Tables,
    wid: u16,
    c: &Constants,
    rng: &mut SmallRng,
    done: &AtomicU64,
) -> Result<(), TreeError> {
    let set = t.at(wid);
    let date = now();
    let mut row = vec![0u8; warehouse::LEN];
    set_str(&mut row, warehouse::NAME, &astring(rng, 6, 10));
    address(&mut row, warehouse::ADDRESS_END, rng);
    set_u32(&mut row, warehouse::TAX, rng.random_range(0..=2000));
    set_i64(&mut row, warehouse::YTD, 30_000_000);
    insert(&set.warehouse, w, &warehouse_key(wid), &row)?;

    let mut row = vec![0u8; stock::LEN];
    for i in 1..=ITEMS {
        set_u32(&mut row, stock::QUANTITY, rng.random_range(10..=100));
        for d in 1..=DISTRICTS {
            set_str(&mut row, stock::dist(d), &astring(rng, 24, 24));
        }
        set_i64(&mut row, stock::YTD, 0);
        set_u32(&mut row, stock::ORDER_CNT, 0);
        set_u32(&mut row, stock::REMOTE_CNT, 0);
        set_str(&mut row, stock::DATA, &data_with_original(rng));
        insert(&set.stock, w, &stock_key(wid, i), &row)?;
        if i % 1024 == 0 {
            done.fetch_add(1024, Ordering::Relaxed);
        }
    }

    for d in 1..=DISTRICTS {
        let mut row = vec![0u8; district::LEN];
        set_str(&mut row, district::NAME, &astring(rng, 6, 10));
        address(&mut row, district::ADDRESS_END, rng);
        set_u32(&mut row, district::TAX, rng.random_range(0..=2000));
        set_i64(&mut row, district::YTD, 3_000_000);
        set_u32(&mut row, district::NEXT_O_ID, ORDERS + 1);
        insert(&set.district, w, &district_key(wid, d), &row)?;

        let mut crow = vec![0u8; customer::LEN];
        let mut hrow = vec![0u8; history::LEN];
        for cid in 1..=CUSTOMERS {
            let last = if cid <= 1000 {
                last_name(cid - 1)
            } else {
                last_name(nurand(rng, 255, 0, 999, c.c_last))
            };
            let first = astring(rng, 8, 16);
            set_str(&mut crow, customer::FIRST, &first);
            set_str(&mut crow, customer::MIDDLE, b"OE");
            set_str(&mut crow, customer::LAST, &last);
            address(&mut crow, customer::ADDRESS_END, rng);
            set_str(&mut crow, customer::PHONE, &nstring(rng, 16, 16));
            set_i64(&mut crow, customer::SINCE, date);
            let bad = rng.random_range(0..10) == 0;
            set_str(&mut crow, customer::CREDIT, if bad { b"BC" } else { b"GC" });
            set_i64(&mut crow, customer::CREDIT_LIM, 5_000_000);
            set_u32(&mut crow, customer::DISCOUNT, rng.random_range(0..=5000));
            set_i64(&mut crow, customer::BALANCE, -1000);
            set_i64(&mut crow, customer::YTD_PAYMENT, 1000);
            set_u32(&mut crow, customer::PAYMENT_CNT, 1);
            set_u32(&mut crow, customer::DELIVERY_CNT, 0);
            set_str(&mut crow, customer::DATA, &astring(rng, 300, 500));
            insert(&set.customer, w, &customer_key(wid, d, cid), &crow)?;
            insert(
                &set.customer_name,
                w,
                &customer_name_key(wid, d, &last, &first, cid),
                &[],
            )?;
            set_u32(&mut hrow, history::C_ID, cid);
            set_u32(&mut hrow, history::C_D_ID, d as u32);
            set_u32(&mut hrow, history::C_W_ID, wid as u32);
            set_u32(&mut hrow, history::D_ID, d as u32);
            set_u32(&mut hrow, history::W_ID, wid as u32);
            set_i64(&mut hrow, history::DATE, date);
            set_i64(&mut hrow, history::AMOUNT, 1000);
            set_str(&mut hrow, history::DATA, &astring(rng, 12, 24));
            insert(&set.history, w, &history_key(wid, d, cid, 0), &hrow)?;
        }
        done.fetch_add(3 * CUSTOMERS as u64, Ordering::Relaxed);

        // orders: customers in a random permutation
        let mut perm: Vec<u32> = (1..=CUSTOMERS).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, rng.random_range(0..=i));
        }
        let mut orow = vec![0u8; order::LEN];
        let mut lrow = vec![0u8; order_line::LEN];
        let mut rows = 0u64;
        for o in 1..=ORDERS {
            let cid = perm[o as usize - 1];
            let delivered = o < FIRST_NEW_ORDER;
            let ol_cnt = rng.random_range(5..=15u32);
            set_u32(&mut orow, order::C_ID, cid);
            set_i64(&mut orow, order::ENTRY_D, date);
            let carrier = if delivered {
                rng.random_range(1..=10)
            } else {
                0
            };
            set_u32(&mut orow, order::CARRIER_ID, carrier);
            set_u32(&mut orow, order::OL_CNT, ol_cnt);
            set_u32(&mut orow, order::ALL_LOCAL, 1);
            insert(&set.order, w, &order_key(wid, d, o), &orow)?;
            insert(
                &set.order_customer,
                w,
                &order_customer_key(wid, d, cid, o),
                &[],
            )?;
            for n in 1..=ol_cnt as u8 {
                set_u32(&mut lrow, order_line::I_ID, rng.random_range(1..=ITEMS));
                set_u32(&mut lrow, order_line::SUPPLY_W_ID, wid as u32);
                set_i64(
                    &mut lrow,
                    order_line::DELIVERY_D,
                    if delivered { date } else { 0 },
                );
                set_u32(&mut lrow, order_line::QUANTITY, 5);
                let amount = if delivered {
                    0
                } else {
                    rng.random_range(1..=999_999)
                };
                set_i64(&mut lrow, order_line::AMOUNT, amount);
                set_str(&mut lrow, order_line::DIST_INFO, &astring(rng, 24, 24));
                insert(&set.order_line, w, &order_line_key(wid, d, o, n), &lrow)?;
            }
            if !delivered {
                insert(&set.new_order, w, &order_key(wid, d, o), &[])?;
                rows += 1;
            }
            rows += 2 + ol_cnt as u64;
        }
        done.fetch_add(rows + 1, Ordering::Relaxed);
    }
    Ok(())
}

/// For unit tests: an engine in a temporary directory with the items and warehouse 1 loaded.
#[cfg(test)]
pub mod testing {
    use super::super::random::Constants;
    use super::super::schema::Tables;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;
    use shoal_engine::{Engine, EngineConfig};
    use std::sync::atomic::AtomicU64;

    /// Fields drop in order: the engine before its directory.
    pub struct Loaded {
        pub engine: Engine,
        pub tables: Tables,
        /// The load's C constants.
        pub constants: Constants,
        /// The generator the load used, to go on with.
        pub rng: SmallRng,
        pub _dir: tempfile::TempDir,
    }

    pub fn one_warehouse(seed: u64) -> Loaded {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(EngineConfig::new(dir.path(), 512 << 20)).unwrap();
        let w = engine.worker();
        let tables = Tables::single(&w, 1).unwrap();
        let mut rng = SmallRng::seed_from_u64(seed);
        let constants = Constants::load(&mut rng);
        let done = AtomicU64::new(0);
        super::items(&w, &tables, 1, super::ITEMS, &mut rng, &done).unwrap();
        super::warehouse(&w, &tables, 1, &constants, &mut rng, &done).unwrap();
        drop(w);
        Loaded {
            engine,
            tables,
            constants,
            rng,
            _dir: dir,
        }
    }
}
