//! The five TPC-C transactions (clause 2), each one Shoal transaction
//! ([`shoal_btree::Transaction`]): serializable, all of it or nothing, in every driver mode
//! (docs/tpcc.md). A transaction that conflicts with another is run again (after a short
//! pause) and counted as an abort of its type. NewOrder's 1% rollbacks are decided before
//! anything is written: the unused item id is found while the items are read, and the
//! transaction is then given up (nothing of it is written).
//!
//! ITEM is never written (the load fills it), so NewOrder reads its items with one multi-get
//! outside the transaction: a row that cannot change needs no validation.

use super::load::{CUSTOMERS, DISTRICTS, ITEMS};
use super::random::{last_name, now, nurand, Constants};
use super::schema::*;
use rand::rngs::SmallRng;
use rand::Rng;
use shoal_btree::{BTree, Direction, Transaction, TreeError};
use shoal_engine::{CommitPoint, Durability, Worker};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

/// The transaction types, in the order of the standard mix's table.
pub const TYPES: [&str; 5] = [
    "new_order",
    "payment",
    "order_status",
    "delivery",
    "stock_level",
];

/// Delivery's index in [`TYPES`].
const DELIVERY: usize = 3;

/// Stock-Level's index in [`TYPES`].
const STOCK_LEVEL: usize = 4;

/// The Deliveries asked for and not yet run, per warehouse: TPC-C runs Delivery deferred
/// (clause 2.7.2: the terminal's request is queued, and the deliveries are done later),
/// and here whoever asks for a Delivery while another worker runs one of the same warehouse
/// leaves it in the queue for that worker, which runs the queue empty before it stops.
/// Two Deliveries of one warehouse at once would remove the same oldest orders: one would
/// conflict and run again (14% of Deliveries with 2 workers on one warehouse, measured
/// before the queue). One process's queue: the processes of a tcp cluster each have theirs.
pub struct DeliveryQueue {
    /// Per warehouse (index: id - 1): Deliveries asked for and not yet done.
    asked: Vec<AtomicU32>,
    /// Per warehouse: a worker runs its queue.
    running: Vec<AtomicBool>,
}

impl DeliveryQueue {
    pub fn new(warehouses: u16) -> DeliveryQueue {
        DeliveryQueue {
            asked: (0..warehouses).map(|_| AtomicU32::new(0)).collect(),
            running: (0..warehouses).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Whether no Delivery is waiting (after a run: every queue was run empty).
    pub fn is_empty(&self) -> bool {
        self.asked.iter().all(|a| a.load(Ordering::SeqCst) == 0)
    }
}

/// The running flag of one warehouse's queue, let go on drop (an error in a Delivery too).
struct Running<'a>(&'a AtomicBool);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Most lines of a NewOrder (clause 2.4.1.3: 5 to 15).
const MAX_LINES: usize = 15;

/// The standard mix's weights (clause 5.2.3, BenchBase's default): 45% NewOrder, 43%
/// Payment, 4% each of the others.
pub const STANDARD_WEIGHTS: [u32; 5] = [45, 43, 4, 4, 4];

/// Pick a type by `weights` (one per type of [`TYPES`], not all zero).
pub fn pick(weights: &[u32; 5], rng: &mut SmallRng) -> usize {
    let total: u32 = weights.iter().sum();
    debug_assert!(total > 0, "checked when the flag was parsed");
    let mut x = rng.random_range(0..total.max(1));
    for (ty, &w) in weights.iter().enumerate() {
        if x < w {
            return ty;
        }
        x -= w;
    }
    0
}

/// `--weights`: five whole numbers, one per type in [`TYPES`]' order (BenchBase's
/// `weights`: NewOrder, Payment, OrderStatus, Delivery, StockLevel), not all zero.
pub fn parse_weights(s: &str) -> Result<[u32; 5], String> {
    let w = five(s, "weights", "a weight")?;
    if w.iter().all(|&x| x == 0) {
        return Err("the weights are all zero".into());
    }
    Ok(w)
}

/// TPC-C's keying times (clause 5.2.5.7), in ms, per type in [`TYPES`] order.
pub const KEYING_MS: [u32; 5] = [18_000, 3_000, 2_000, 2_000, 2_000];
/// TPC-C's minimum mean think times (clause 5.2.5.7), in ms.
pub const THINK_MS: [u32; 5] = [12_000, 12_000, 10_000, 5_000, 5_000];

/// `--keying-ms` / `--think-ms`: five times in milliseconds, one per type.
pub fn parse_times(s: &str) -> Result<[u32; 5], String> {
    five(s, "times", "a time in milliseconds")
}

/// Five whole numbers, one per transaction type.
fn five(s: &str, plural: &str, one: &str) -> Result<[u32; 5], String> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    if parts.len() != 5 {
        return Err(format!(
            "{s:?}: five {plural}, one per type in this order: {}",
            TYPES.join(", ")
        ));
    }
    let mut w = [0u32; 5];
    for (slot, p) in w.iter_mut().zip(&parts) {
        *slot = p
            .parse()
            .map_err(|_| format!("{p:?}: {one} is a whole number"))?;
    }
    Ok(w)
}

/// A think time with mean `mean_ms`: negative exponential, at most ten times the mean
/// (clause 5.2.5.4).
pub fn think_time(mean_ms: u32, rng: &mut SmallRng) -> Duration {
    let u: f64 = rng.random();
    let ms = (-(1.0 - u).ln() * mean_ms as f64).min(10.0 * mean_ms as f64);
    Duration::from_secs_f64(ms / 1000.0)
}

#[derive(Debug, thiserror::Error)]
pub enum TxError {
    #[error(transparent)]
    Tree(#[from] TreeError),
    /// Making the transaction durable failed (the log): it may or may not survive a crash.
    #[error("commit failed: {0}")]
    Commit(shoal_engine::EngineError),
    /// A row the transaction needs is absent: the database is inconsistent.
    #[error("{0}")]
    Missing(String),
}

/// Why one try of a transaction stopped: another transaction's change (run it again), or an
/// error (nothing of it was written).
#[derive(Debug)]
enum Stop {
    Conflict,
    Error(TxError),
}

impl From<shoal_btree::TxError> for Stop {
    fn from(e: shoal_btree::TxError) -> Stop {
        match e {
            shoal_btree::TxError::Conflict => Stop::Conflict,
            shoal_btree::TxError::Tree(e) => Stop::Error(TxError::Tree(e)),
            other => Stop::Error(TxError::Missing(other.to_string())),
        }
    }
}

impl From<TxError> for Stop {
    fn from(e: TxError) -> Stop {
        Stop::Error(e)
    }
}

impl From<TreeError> for Stop {
    fn from(e: TreeError) -> Stop {
        Stop::Error(TxError::Tree(e))
    }
}

type Try<T> = Result<T, Stop>;

/// What a finished transaction did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Done {
    pub rolled_back: bool,
    /// Touched a warehouse other than its home warehouse.
    pub remote_warehouse: bool,
    /// Touched a warehouse homed on another node.
    pub remote_node: bool,
    /// Saw another transaction half done (an order with fewer lines than its row says, a
    /// line missing when it is delivered): a broken isolation; the run counts it as an error.
    pub anomaly: bool,
    /// Tries that conflicted with other transactions before this one committed.
    pub aborts: u32,
}

/// One worker's state for running transactions.
pub struct Ctx<'a> {
    pub w: &'a Worker,
    pub t: &'a Tables,
    /// Warehouses in the database (ids 1..=warehouses).
    pub warehouses: u16,
    /// The node each warehouse's data was loaded on (index: warehouse id - 1).
    pub node_of: &'a [u8],
    pub node: u8,
    pub c: Constants,
    pub rng: SmallRng,
    /// Next history key suffix (unique per worker: the worker's id in the high bits).
    pub history_seq: u64,
    /// Deliveries are queued per warehouse here (`None`: each runs at once).
    pub deliveries: Option<&'a DeliveryQueue>,
}

fn missing(what: String) -> TxError {
    TxError::Missing(what)
}

fn wrong_size(what: &str, key: &[u8], got: usize, want: usize) -> TxError {
    TxError::Missing(format!(
        "{what} {key:?} is {got} bytes, a {what} row is {want}: not a row of this table"
    ))
}

/// The first key after every key that starts with `p` (`None`: no such key).
fn prefix_end(p: &[u8]) -> Option<Vec<u8>> {
    let mut e = p.to_vec();
    while let Some(last) = e.pop() {
        if last < 0xFF {
            e.push(last + 1);
            return Some(e);
        }
    }
    None
}

/// Keys starting with `p`, as a range.
fn with_prefix(p: &[u8]) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    (
        Bound::Included(p.to_vec()),
        prefix_end(p).map_or(Bound::Unbounded, Bound::Excluded),
    )
}

/// The row at `key`, which must exist and be `len` bytes long.
fn get(tx: &mut Transaction<'_>, tree: &BTree, key: &[u8], what: &str, len: usize) -> Try<Vec<u8>> {
    let row = tx
        .get(tree, key)?
        .ok_or_else(|| missing(format!("{what} {key:?} does not exist")))?;
    if row.len() != len {
        return Err(wrong_size(what, key, row.len(), len).into());
    }
    Ok(row)
}

/// Field `f` of the row at `key`: only its bytes are read, so only a change to them by
/// another transaction conflicts with this one (not one to the row's other columns).
fn get_field(tx: &mut Transaction<'_>, tree: &BTree, key: &[u8], what: &str, f: F) -> Try<Vec<u8>> {
    let bytes = tx
        .get_part(tree, key, f.bytes())?
        .ok_or_else(|| missing(format!("{what} {key:?} does not exist")))?;
    if bytes.len() != f.size() {
        return Err(too_short(what, key, f).into());
    }
    Ok(bytes)
}

/// Apply `change` to field `f` of the row at `key`: only its bytes are read and written
/// ([`Transaction::update_part`]), so another transaction may change the row's other columns
/// meanwhile without a conflict.
fn change_field(
    tx: &mut Transaction<'_>,
    tree: &BTree,
    key: &[u8],
    what: &str,
    f: F,
    change: impl FnOnce(&mut [u8]),
) -> Try<()> {
    match tx.update_part(tree, key, f.bytes(), change) {
        Ok(true) => Ok(()),
        Ok(false) => Err(missing(format!("{what} {key:?} does not exist")).into()),
        Err(shoal_btree::TxError::Tree(TreeError::PartOutside { .. })) => {
            Err(too_short(what, key, f).into())
        }
        Err(e) => Err(e.into()),
    }
}

fn too_short(what: &str, key: &[u8], f: F) -> TxError {
    TxError::Missing(format!(
        "{what} {key:?} ends before its field at {:?}: not a row of this table",
        f.bytes()
    ))
}

/// A field's little-endian `u32`.
fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("a 4-byte field"))
}

/// Apply `f` to the row at `key`; an absent row, or one that is not `len` bytes long, is an
/// error (and nothing is written).
fn change(
    tx: &mut Transaction<'_>,
    tree: &BTree,
    key: &[u8],
    what: &str,
    len: usize,
    f: impl FnOnce(&mut [u8]),
) -> Try<()> {
    let mut size = len;
    let found = tx.update(tree, key, |row| {
        size = row.len();
        if size == len {
            f(row)
        }
    })?;
    if !found {
        return Err(missing(format!("{what} {key:?} does not exist")).into());
    }
    if size != len {
        return Err(wrong_size(what, key, size, len).into());
    }
    Ok(())
}

impl Ctx<'_> {
    /// Run one transaction of type `ty` (an index into [`TYPES`]) until it commits (a
    /// conflict runs it again: counted in [`Done::aborts`]); durable before it returns with
    /// durability `commit`. One that fails writes nothing.
    pub fn run(&mut self, ty: usize, home: u16) -> Result<Done, TxError> {
        let (done, point) = self.run_later(ty, home)?;
        if self.w.durability() == Durability::Commit {
            self.w.wait_durable(point).map_err(TxError::Commit)?;
        }
        Ok(done)
    }

    /// [`Ctx::run`], but commit without waiting for the log: the transaction counts once
    /// the returned point is durable (`Worker::is_durable`).
    pub fn run_later(&mut self, ty: usize, home: u16) -> Result<(Done, CommitPoint), TxError> {
        match self.deliveries {
            Some(q) if ty == DELIVERY => self.deliver_deferred(q, home),
            _ => self.run_now(ty, home),
        }
    }

    /// Queue a Delivery of warehouse `w`, and run its queue empty unless another worker runs
    /// it: returns what this worker ran (the aborts and anomalies of all of them; the commit
    /// point of the last, or of nothing when another worker runs the queue).
    fn deliver_deferred(
        &mut self,
        q: &DeliveryQueue,
        w: u16,
    ) -> Result<(Done, CommitPoint), TxError> {
        let (asked, running) = (&q.asked[w as usize - 1], &q.running[w as usize - 1]);
        // SeqCst on the count and the flag, in both roles: a worker that queues and then
        // fails to take the flag, and a runner that lets the flag go and then finds the
        // count 0, cannot both miss the other (one total order of the four operations): a
        // queued Delivery is never left behind.
        asked.fetch_add(1, Ordering::SeqCst);
        let mut done = Done::default();
        let mut last = None;
        while running
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            let flag = Running(running);
            while asked.load(Ordering::SeqCst) > 0 {
                let (d, point) = self.run_now(DELIVERY, w)?;
                let left = asked.fetch_sub(1, Ordering::SeqCst);
                assert!(left > 0, "only the runner takes Deliveries off the queue");
                done.aborts += d.aborts;
                done.anomaly |= d.anomaly;
                last = Some(point);
            }
            drop(flag);
            if asked.load(Ordering::SeqCst) == 0 {
                break;
            }
        }
        let point = match last {
            Some(p) => p,
            None => self.w.commit_later().map_err(TxError::Commit)?,
        };
        Ok((done, point))
    }

    /// Run one transaction of type `ty` now (see [`Ctx::run_later`]).
    fn run_now(&mut self, ty: usize, home: u16) -> Result<(Done, CommitPoint), TxError> {
        let mut aborts = 0u32;
        loop {
            // Stock-Level needs only level 1 isolation (clause 3.4.1): read committed
            let mut tx = if ty == STOCK_LEVEL {
                Transaction::read_committed(self.w)
            } else {
                Transaction::begin(self.w)
            };
            let r = match self.execute(&mut tx, ty, home) {
                Ok(done) if done.rolled_back => {
                    // NewOrder's rollback (clause 2.4.2.3): nothing of it is written
                    tx.abort();
                    self.w
                        .commit_later()
                        .map(|p| (done, p))
                        .map_err(|e| Stop::Error(TxError::Commit(e)))
                }
                Ok(done) => tx.commit_later().map(|p| (done, p)).map_err(Stop::from),
                Err(e) => Err(e),
            };
            match r {
                Ok((mut done, point)) => {
                    done.aborts = aborts;
                    return Ok((done, point));
                }
                Err(Stop::Conflict) => {
                    aborts += 1;
                    shoal_btree::backoff_after_conflict(aborts);
                }
                Err(Stop::Error(e)) => return Err(e),
            }
        }
    }

    fn execute(&mut self, tx: &mut Transaction<'_>, ty: usize, home: u16) -> Try<Done> {
        match ty {
            0 => self.new_order(tx, home),
            1 => self.payment(tx, home),
            2 => self.order_status(tx, home),
            3 => self.delivery(tx, home),
            _ => self.stock_level(tx, home),
        }
    }

    fn other_warehouse(&mut self, w: u16) -> u16 {
        let o = self.rng.random_range(1..self.warehouses);
        if o >= w {
            o + 1
        } else {
            o
        }
    }

    fn note_remote(&self, done: &mut Done, home: u16, other: u16) {
        if other != home {
            done.remote_warehouse = true;
            if self.node_of[other as usize - 1] != self.node {
                done.remote_node = true;
            }
        }
    }

    /// A customer by id (40%) or by last name (60%: the middle one by first name).
    fn customer(&mut self, tx: &mut Transaction<'_>, w: u16, d: u8) -> Try<u32> {
        if self.rng.random_range(0..100) >= 60 {
            return Ok(nurand(&mut self.rng, 1023, 1, CUSTOMERS, self.c.c_id));
        }
        let last = last_name(nurand(&mut self.rng, 255, 0, 999, self.c.c_last));
        let prefix = customer_name_prefix(w, d, &last);
        // (a name is shared by about three customers of a district)
        let mut ids: Vec<u32> = Vec::with_capacity(8);
        tx.scan(
            &self.t.at(w).customer_name,
            with_prefix(&prefix),
            Direction::Ascending,
            CUSTOMERS as usize,
            |k, _| ids.extend(key_tail_u32(k)),
        )?;
        if ids.is_empty() {
            // customers 1..=1000 of every district carry every last name
            return Err(missing(format!(
                "no customer named {} in district {w}/{d}",
                String::from_utf8_lossy(&last)
            ))
            .into());
        }
        Ok(ids[ids.len().div_ceil(2) - 1])
    }

    fn new_order(&mut self, tx: &mut Transaction<'_>, w: u16) -> Try<Done> {
        let mut done = Done::default();
        let d = self.rng.random_range(1..=DISTRICTS);
        let c = nurand(&mut self.rng, 1023, 1, CUSTOMERS, self.c.c_id);
        let ol_cnt = self.rng.random_range(5..=MAX_LINES as u8);
        let rollback = self.rng.random_range(0..100) == 0;
        // (item, supply warehouse, quantity)
        let mut lines = Vec::with_capacity(ol_cnt as usize);
        for n in 0..ol_cnt {
            let i = if rollback && n == ol_cnt - 1 {
                ITEMS + 1 // the unused item number
            } else {
                nurand(&mut self.rng, 8191, 1, ITEMS, self.c.ol_i_id)
            };
            let supply = if self.warehouses > 1 && self.rng.random_range(0..100) == 0 {
                self.other_warehouse(w)
            } else {
                w
            };
            self.note_remote(&mut done, w, supply);
            lines.push((i, supply, self.rng.random_range(1..=10u32)));
        }
        let set = self.t.at(w);
        // (the fields it needs alone: Payment adds to the warehouse's YTD meanwhile, and a
        // Payment or Delivery changes the customer's balance, without a conflict)
        let w_tax = le_u32(&get_field(
            tx,
            &set.warehouse,
            &warehouse_key(w),
            "warehouse",
            warehouse::TAX,
        )?) as i64;
        let discount = le_u32(&get_field(
            tx,
            &set.customer,
            &customer_key(w, d, c),
            "customer",
            customer::DISCOUNT,
        )?) as i64;
        // the items' prices: one multi-get outside the transaction (ITEM is never written),
        // whose lookups overlap their cache misses; the first line (in order) without a
        // proper item decides
        let item_keys: Vec<Key> = lines.iter().map(|&(i, _, _)| item_key(i)).collect();
        let mut prices = [0i64; MAX_LINES];
        let mut first_bad: Option<(usize, Option<usize>)> = None;
        self.t
            .item
            .lookup_many(self.w, &item_keys, |j, row| match row {
                Some(row) if row.len() == item::LEN => prices[j] = get_i64(row, item::PRICE),
                _ if first_bad.is_some() => {}
                row => first_bad = Some((j, row.map(<[u8]>::len))),
            })?;
        match first_bad {
            None => {}
            Some((j, Some(len))) => {
                return Err(wrong_size("item", &item_keys[j], len, item::LEN).into())
            }
            Some((j, None)) if lines[j].0 == ITEMS + 1 => {
                done.rolled_back = true;
                return Ok(done);
            }
            Some((j, None)) => {
                return Err(missing(format!("item {} does not exist", lines[j].0)).into())
            }
        }
        // the district's tax and next order id (not its YTD, which Payments change)
        let dkey = district_key(w, d);
        let d_tax = le_u32(&get_field(
            tx,
            &set.district,
            &dkey,
            "district",
            district::TAX,
        )?) as i64;
        let mut o_id = 0;
        change_field(
            tx,
            &set.district,
            &dkey,
            "district",
            district::NEXT_O_ID,
            |b| {
                o_id = le_u32(b);
                b.copy_from_slice(&(o_id + 1).to_le_bytes());
            },
        )?;
        let date = now();
        let mut orow = [0u8; order::LEN];
        set_u32(&mut orow, order::C_ID, c);
        set_i64(&mut orow, order::ENTRY_D, date);
        set_u32(&mut orow, order::OL_CNT, ol_cnt as u32);
        set_u32(&mut orow, order::ALL_LOCAL, !done.remote_warehouse as u32);
        // the order's keys are new: the district's next order id (read above, and validated
        // at the commit) makes them unique, so they are written without reading
        let okey = order_key(w, d, o_id);
        tx.upsert(&set.order, okey, orow)?;
        tx.upsert(&set.new_order, okey, [])?;
        tx.upsert(&set.order_customer, order_customer_key(w, d, c, o_id), [])?;
        let mut total = 0i64;
        let mut lrow = [0u8; order_line::LEN];
        for (n, (&(i, supply, qty), &price)) in lines.iter().zip(&prices).enumerate() {
            let mut dist = [0u8; 24];
            change(
                tx,
                &self.t.at(supply).stock,
                &stock_key(supply, i),
                "stock",
                stock::LEN,
                |row| {
                    let q = get_u32(row, stock::QUANTITY);
                    let q = if q >= qty + 10 { q - qty } else { q + 91 - qty };
                    set_u32(row, stock::QUANTITY, q);
                    set_i64(row, stock::YTD, get_i64(row, stock::YTD) + qty as i64);
                    set_u32(row, stock::ORDER_CNT, get_u32(row, stock::ORDER_CNT) + 1);
                    if supply != w {
                        set_u32(row, stock::REMOTE_CNT, get_u32(row, stock::REMOTE_CNT) + 1);
                    }
                    dist.copy_from_slice(raw(row, stock::dist(d)));
                },
            )?;
            let amount = qty as i64 * price;
            total += amount;
            set_u32(&mut lrow, order_line::I_ID, i);
            set_u32(&mut lrow, order_line::SUPPLY_W_ID, supply as u32);
            set_i64(&mut lrow, order_line::DELIVERY_D, 0);
            set_u32(&mut lrow, order_line::QUANTITY, qty);
            set_i64(&mut lrow, order_line::AMOUNT, amount);
            set_str(&mut lrow, order_line::DIST_INFO, &dist);
            tx.upsert(
                &set.order_line,
                order_line_key(w, d, o_id, n as u8 + 1),
                lrow,
            )?;
        }
        // the order's total as the terminal would show it (not stored)
        std::hint::black_box(total * (10_000 - discount) * (10_000 + w_tax + d_tax));
        Ok(done)
    }

    fn payment(&mut self, tx: &mut Transaction<'_>, w: u16) -> Try<Done> {
        let mut done = Done::default();
        let d = self.rng.random_range(1..=DISTRICTS);
        let amount: i64 = self.rng.random_range(100..=500_000);
        let (cw, cd) = if self.warehouses == 1 || self.rng.random_range(0..100) < 85 {
            (w, d)
        } else {
            (
                self.other_warehouse(w),
                self.rng.random_range(1..=DISTRICTS),
            )
        };
        self.note_remote(&mut done, w, cw);
        let set = self.t.at(w);
        // the YTD totals grow by the amount, added at the commit without being read: Payments
        // to one warehouse (all of them add to its total) and a NewOrder taking the
        // district's next order id meanwhile are no conflict
        tx.add_i64(
            &set.warehouse,
            warehouse_key(w),
            warehouse::YTD.bytes().start,
            amount,
        )?;
        tx.add_i64(
            &set.district,
            district_key(w, d),
            district::YTD.bytes().start,
            amount,
        )?;
        let c = self.customer(tx, cw, cd)?;
        change(
            tx,
            &self.t.at(cw).customer,
            &customer_key(cw, cd, c),
            "customer",
            customer::LEN,
            |row| {
                set_i64(
                    row,
                    customer::BALANCE,
                    get_i64(row, customer::BALANCE) - amount,
                );
                let ytd = get_i64(row, customer::YTD_PAYMENT);
                set_i64(row, customer::YTD_PAYMENT, ytd + amount);
                let cnt = get_u32(row, customer::PAYMENT_CNT);
                set_u32(row, customer::PAYMENT_CNT, cnt + 1);
                if get_str(row, customer::CREDIT) == b"BC" {
                    let mut data = format!("{c} {cd} {cw} {d} {w} {amount}|").into_bytes();
                    data.extend_from_slice(get_str(row, customer::DATA));
                    set_str(row, customer::DATA, &data);
                }
            },
        )?;
        let mut h = [0u8; history::LEN];
        set_u32(&mut h, history::C_ID, c);
        set_u32(&mut h, history::C_D_ID, cd as u32);
        set_u32(&mut h, history::C_W_ID, cw as u32);
        set_u32(&mut h, history::D_ID, d as u32);
        set_u32(&mut h, history::W_ID, w as u32);
        set_i64(&mut h, history::DATE, now());
        set_i64(&mut h, history::AMOUNT, amount);
        set_str(&mut h, history::DATA, b"payment");
        // a key of its own (the worker's id in the high bits of the sequence): no read needed
        self.history_seq += 1;
        let history = self.t.at(cw).history;
        tx.upsert(&history, history_key(cw, cd, c, self.history_seq), h)?;
        Ok(done)
    }

    fn order_status(&mut self, tx: &mut Transaction<'_>, w: u16) -> Try<Done> {
        let d = self.rng.random_range(1..=DISTRICTS);
        let c = self.customer(tx, w, d)?;
        let set = self.t.at(w);
        let crow = get(
            tx,
            &set.customer,
            &customer_key(w, d, c),
            "customer",
            customer::LEN,
        )?;
        std::hint::black_box(get_i64(&crow, customer::BALANCE));
        // the customer's latest order
        let mut latest = None;
        tx.scan(
            &set.order_customer,
            (
                Bound::Included(order_customer_key(w, d, c, 0)),
                Bound::Included(order_customer_key(w, d, c, u32::MAX)),
            ),
            Direction::Descending,
            1,
            |k, _| latest = key_tail_u32(k),
        )?;
        let o = latest.ok_or_else(|| missing(format!("customer {w}/{d}/{c} has no order")))?;
        let okey = order_key(w, d, o);
        let orow = get(tx, &set.order, &okey, "order", order::LEN)?;
        let ol_cnt = get_u32(&orow, order::OL_CNT);
        let (mut lines, mut bad) = (0u32, None);
        tx.scan(
            &set.order_line,
            with_prefix(&okey),
            Direction::Ascending,
            MAX_LINES + 1,
            |k, v| {
                lines += 1;
                match v.len() {
                    order_line::LEN => {
                        std::hint::black_box(get_i64(v, order_line::AMOUNT));
                    }
                    _ if bad.is_some() => {}
                    len => bad = Some(wrong_size("order line", k, len, order_line::LEN)),
                }
            },
        )?;
        if let Some(e) = bad {
            return Err(e.into());
        }
        Ok(Done {
            anomaly: lines != ol_cnt,
            ..Done::default()
        })
    }

    fn delivery(&mut self, tx: &mut Transaction<'_>, w: u16) -> Try<Done> {
        let carrier = self.rng.random_range(1..=10u32);
        let date = now();
        let mut done = Done::default();
        let set = self.t.at(w);
        for d in 1..=DISTRICTS {
            // the district's oldest undelivered order
            let mut oldest = None;
            tx.scan(
                &set.new_order,
                with_prefix(&district_key(w, d)),
                Direction::Ascending,
                1,
                |k, _| oldest = key_tail_u32(k),
            )?;
            let Some(o) = oldest else {
                continue;
            };
            let okey = order_key(w, d, o);
            tx.remove(&set.new_order, okey)?;
            let (mut c, mut ol_cnt) = (0, 0);
            change(tx, &set.order, &okey, "order", order::LEN, |row| {
                c = get_u32(row, order::C_ID);
                ol_cnt = get_u32(row, order::OL_CNT);
                set_u32(row, order::CARRIER_ID, carrier);
            })?;
            let mut sum = 0i64;
            for n in 1..=ol_cnt as u8 {
                let key = order_line_key(w, d, o, n);
                let mut size = order_line::LEN;
                let found = tx.update(&set.order_line, key, |row| {
                    size = row.len();
                    if size == order_line::LEN {
                        sum += get_i64(row, order_line::AMOUNT);
                        set_i64(row, order_line::DELIVERY_D, date);
                    }
                })?;
                if size != order_line::LEN {
                    return Err(wrong_size("order line", &key, size, order_line::LEN).into());
                }
                // a line its order's row promises but that is not there: a NewOrder seen
                // half done
                done.anomaly |= !found;
            }
            // (added at the commit without reading the customer: a Payment to the customer
            // meanwhile is no conflict)
            let ckey = customer_key(w, d, c);
            tx.add_i64(&set.customer, ckey, customer::BALANCE.bytes().start, sum)?;
            tx.add_u32(&set.customer, ckey, customer::DELIVERY_CNT.bytes().start, 1)?;
        }
        Ok(done)
    }

    fn stock_level(&mut self, tx: &mut Transaction<'_>, w: u16) -> Try<Done> {
        let d = self.rng.random_range(1..=DISTRICTS);
        let threshold = self.rng.random_range(10..=20u32);
        std::hint::black_box(self.low_stock_in(tx, w, d, threshold)?);
        Ok(Done::default())
    }

    /// StockLevel's query: how many distinct items of district `d`'s last 20 orders have
    /// fewer than `threshold` in stock (in a transaction of its own).
    #[cfg(test)]
    pub fn low_stock(&self, w: u16, d: u8, threshold: u32) -> Result<u32, TxError> {
        let mut tries = 0;
        loop {
            let mut tx = Transaction::begin(self.w);
            let r = self
                .low_stock_in(&mut tx, w, d, threshold)
                .and_then(|n| tx.commit().map(|()| n).map_err(Stop::from));
            match r {
                Ok(n) => return Ok(n),
                Err(Stop::Conflict) => {
                    tries += 1;
                    shoal_btree::backoff_after_conflict(tries);
                }
                Err(Stop::Error(e)) => return Err(e),
            }
        }
    }

    fn low_stock_in(&self, tx: &mut Transaction<'_>, w: u16, d: u8, threshold: u32) -> Try<u32> {
        let set = self.t.at(w);
        let next = le_u32(&get_field(
            tx,
            &set.district,
            &district_key(w, d),
            "district",
            district::NEXT_O_ID,
        )?);
        let mut items = Vec::with_capacity(20 * MAX_LINES + 1);
        let mut bad = None;
        tx.scan(
            &set.order_line,
            (
                Bound::Included(order_line_key(w, d, next.saturating_sub(20), 0)),
                Bound::Excluded(order_line_key(w, d, next, 0)),
            ),
            Direction::Ascending,
            20 * MAX_LINES + 1,
            |k, v| match v.len() {
                order_line::LEN => items.push(get_u32(v, order_line::I_ID)),
                _ if bad.is_some() => {}
                len => bad = Some(wrong_size("order line", k, len, order_line::LEN)),
            },
        )?;
        if let Some(e) = bad {
            return Err(e.into());
        }
        // Up to 300 independent stock lookups: one multi-get, whose lookups overlap their
        // cache misses.
        items.sort_unstable();
        items.dedup();
        let keys: Vec<_> = items.into_iter().map(|i| stock_key(w, i)).collect();
        let mut low = 0;
        // (only the quantities are copied: one cache line of each 310-byte row)
        let q = stock::QUANTITY;
        tx.get_many_part(&set.stock, &keys, q.bytes(), |j, quantity| match quantity {
            Some(b) if b.len() == q.size() => {
                if le_u32(b) < threshold {
                    low += 1;
                }
            }
            _ if bad.is_some() => {}
            Some(_) => bad = Some(too_short("stock", &keys[j], q)),
            None => bad = Some(missing(format!("stock {:?} does not exist", keys[j]))),
        })?;
        match bad {
            Some(e) => Err(e.into()),
            None => Ok(low),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::load;
    use super::*;
    use rand::SeedableRng;
    use std::collections::BTreeSet;

    /// Issue 47: `--weights` as BenchBase's: the standard mix by default, any mix asked for.
    #[test]
    fn weights_pick_the_mix_they_name() {
        assert_eq!(parse_weights("45,43,4,4,4"), Ok(STANDARD_WEIGHTS));
        assert!(parse_weights("45,43,4,4").is_err());
        assert!(parse_weights("0,0,0,0,0").is_err());
        assert!(parse_weights("45,43,4,4,x").is_err());
        let mut rng = SmallRng::seed_from_u64(3);
        let mut seen = [0u32; 5];
        for _ in 0..100_000 {
            seen[pick(&STANDARD_WEIGHTS, &mut rng)] += 1;
        }
        assert!((44_000..46_000).contains(&seen[0]), "{seen:?}");
        assert!((42_000..44_000).contains(&seen[1]), "{seen:?}");
        assert!(
            seen[2..].iter().all(|&n| (3_500..4_500).contains(&n)),
            "{seen:?}"
        );
        let only_payments = parse_weights("0, 1, 0, 0, 0").unwrap();
        assert!((0..1000).all(|_| pick(&only_payments, &mut rng) == 1));
    }

    fn district_field(ctx: &Ctx, d: u8) -> (u32, i64) {
        let r = ctx
            .t
            .at(1)
            .district
            .get(ctx.w, district_key(1, d))
            .unwrap()
            .unwrap();
        (get_u32(&r, district::NEXT_O_ID), get_i64(&r, district::YTD))
    }

    /// A worker's context on the one warehouse of `t`.
    fn ctx<'a>(
        w: &'a Worker,
        t: &'a Tables,
        c: Constants,
        node_of: &'a [u8],
        seed: u64,
    ) -> Ctx<'a> {
        Ctx {
            w,
            t,
            warehouses: 1,
            node_of,
            node: 0,
            c,
            rng: SmallRng::seed_from_u64(seed),
            history_seq: 1 << 32,
            deliveries: None,
        }
    }

    /// A Delivery asked for while another worker runs the warehouse's queue is left to that
    /// worker: it returns at once, delivering nothing; the next worker to take the queue runs
    /// the one left and its own, and leaves the queue empty.
    #[test]
    fn a_delivery_asked_for_during_another_is_queued_and_run_by_the_next() {
        let mut l = load::testing::one_warehouse(9);
        let (e, t) = (&l.engine, l.tables);
        let w = e.worker();
        let node_of = [0u8];
        let c = Constants::run(&l.constants, &mut l.rng);
        let q = DeliveryQueue::new(1);
        let mut ctx = ctx(&w, &t, c, &node_of, 11);
        ctx.deliveries = Some(&q);
        let undelivered = || t.at(1).new_order.count(&w).unwrap();
        let n0 = undelivered();
        // another worker runs the queue
        q.running[0].store(true, Ordering::SeqCst);
        let (d, _) = ctx.run_later(DELIVERY, 1).unwrap();
        assert_eq!((d.aborts, d.anomaly), (0, false));
        assert_eq!(
            undelivered(),
            n0,
            "nothing delivered while another runs the queue"
        );
        assert!(!q.is_empty());
        // it stopped without running it (it would have): the next Delivery runs both
        q.running[0].store(false, Ordering::SeqCst);
        let (_, _point) = ctx.run_later(DELIVERY, 1).unwrap(); // (durability none)
        assert_eq!(undelivered(), n0 - 2 * DISTRICTS as u64);
        assert!(q.is_empty() && !q.running[0].load(Ordering::SeqCst));
        assert!(super::super::check::warehouse(&w, &t, 1)
            .unwrap()
            .is_empty());
    }

    /// Each of the five transactions runs on a loaded warehouse and has the effect the
    /// standard describes.
    #[test]
    fn every_transaction_does_what_it_should() {
        let mut l = load::testing::one_warehouse(9);
        let (e, t) = (&l.engine, l.tables);
        let w = e.worker();
        let node_of = [0u8];
        let c = Constants::run(&l.constants, &mut l.rng);
        let mut ctx = ctx(&w, &t, c, &node_of, 11);
        let next_sum = |ctx: &Ctx| {
            (1..=DISTRICTS)
                .map(|d| district_field(ctx, d).0)
                .sum::<u32>()
        };
        let ytd_sum = |ctx: &Ctx| {
            (1..=DISTRICTS)
                .map(|d| district_field(ctx, d).1)
                .sum::<i64>()
        };

        // NewOrder: committed ones take the next order id and leave a new-order row
        let (n0, no0) = (next_sum(&ctx), t.at(1).new_order.count(&w).unwrap());
        let mut committed = 0;
        for _ in 0..50 {
            let d = ctx.run(0, 1).unwrap();
            committed += !d.rolled_back as u32;
            assert!(!d.remote_warehouse && !d.anomaly);
        }
        assert!(committed > 40, "{committed} of 50 committed");
        assert_eq!(next_sum(&ctx), n0 + committed);
        assert_eq!(t.at(1).new_order.count(&w).unwrap(), no0 + committed as u64);

        // Payment: warehouse and district YTD grow by the same amounts, one history row each
        let h0 = t.at(1).history.count(&w).unwrap();
        let wytd = |ctx: &Ctx| {
            let r = ctx
                .t
                .at(1)
                .warehouse
                .get(ctx.w, warehouse_key(1))
                .unwrap()
                .unwrap();
            get_i64(&r, warehouse::YTD)
        };
        let (w0, d0) = (wytd(&ctx), ytd_sum(&ctx));
        for _ in 0..20 {
            ctx.run(1, 1).unwrap();
        }
        assert!(wytd(&ctx) > w0);
        assert_eq!(wytd(&ctx) - w0, ytd_sum(&ctx) - d0);
        assert_eq!(t.at(1).history.count(&w).unwrap(), h0 + 20);

        // OrderStatus and StockLevel only read
        for ty in [2, 4] {
            for _ in 0..20 {
                let d = ctx.run(ty, 1).unwrap();
                assert!(!d.anomaly, "{}", TYPES[ty]);
            }
        }

        // Delivery: one new order per district is delivered (every district has some)
        let no1 = t.at(1).new_order.count(&w).unwrap();
        ctx.run(3, 1).unwrap();
        assert_eq!(t.at(1).new_order.count(&w).unwrap(), no1 - DISTRICTS as u64);

        assert!(super::super::check::warehouse(&w, &t, 1)
            .unwrap()
            .is_empty());

        // StockLevel's count, against one lookup per item of the last 20 orders
        for d in 1..=DISTRICTS {
            let next = district_field(&ctx, d).0;
            let end = order_line_key(1, d, next, 0);
            let mut items = BTreeSet::new();
            t.at(1)
                .order_line
                .scan(
                    &w,
                    &order_line_key(1, d, next - 20, 0),
                    Direction::Ascending,
                    |k, v| {
                        let more = k < end.as_slice();
                        if more {
                            items.insert(get_u32(v, order_line::I_ID));
                        }
                        more
                    },
                )
                .unwrap();
            assert!(items.len() > 50, "district {d}: {} items", items.len());
            let quantity = |i: u32| {
                let s = t.at(1).stock.get(&w, stock_key(1, i)).unwrap().unwrap();
                get_u32(&s, stock::QUANTITY)
            };
            for threshold in [10, 15, 20, 101] {
                let want = items.iter().filter(|&&i| quantity(i) < threshold).count();
                assert_eq!(ctx.low_stock(1, d, threshold).unwrap() as usize, want);
            }
            // a stock row gone: an error naming it, not a count that skips it
            if d == DISTRICTS {
                let gone = *items.iter().nth(items.len() / 2).unwrap();
                assert!(t.at(1).stock.remove(&w, stock_key(1, gone)).unwrap());
                match ctx.low_stock(1, d, 15) {
                    Err(TxError::Missing(m)) => assert!(m.starts_with("stock"), "{m}"),
                    other => panic!("stock level without a stock row: {other:?}"),
                }
            }
        }
        drop(w);
        e.close().unwrap();
    }

    /// A transaction that fails part-way leaves nothing behind: with every odd item's stock
    /// row gone, NewOrders fail at their first odd item, after the district, order,
    /// new-order, order-customer and some stock and order-line writes; each failed one leaves
    /// the database exactly as before it (its writes never left the transaction), and the
    /// consistency conditions hold throughout.
    #[test]
    fn a_transaction_that_fails_part_way_leaves_nothing() {
        let mut l = load::testing::one_warehouse(10);
        let (e, t) = (&l.engine, l.tables);
        let w = e.worker();
        let node_of = [0u8];
        let c = Constants::run(&l.constants, &mut l.rng);
        let mut ctx = ctx(&w, &t, c, &node_of, 12);
        for i in (1..=ITEMS).step_by(2) {
            assert!(t.at(1).stock.remove(&w, stock_key(1, i)).unwrap());
        }
        // everything a NewOrder writes: row counts, the districts' next order ids, and the
        // stock rows' year-to-date quantities and order counts
        let state = |ctx: &Ctx| {
            let s = ctx.t.at(1);
            let mut stock = (0i64, 0u64);
            s.stock
                .scan(ctx.w, &[], Direction::Ascending, |_, v| {
                    stock.0 += get_i64(v, stock::YTD);
                    stock.1 += get_u32(v, stock::ORDER_CNT) as u64;
                    true
                })
                .unwrap();
            let counts = [&s.order, &s.new_order, &s.order_customer, &s.order_line]
                .map(|tree| tree.count(ctx.w).unwrap());
            let next: Vec<u32> = (1..=DISTRICTS).map(|d| district_field(ctx, d).0).collect();
            (counts, next, stock)
        };
        let (mut failed, mut committed) = (0, 0);
        let mut before = state(&ctx);
        for _ in 0..60 {
            match ctx.run(0, 1) {
                Err(TxError::Missing(m)) => {
                    assert!(m.starts_with("stock"), "{m}");
                    failed += 1;
                    assert_eq!(state(&ctx), before, "a failed NewOrder left writes behind");
                }
                Ok(_) => {
                    committed += 1;
                    before = state(&ctx);
                }
                Err(other) => panic!("{other}"),
            }
            assert!(super::super::check::warehouse(&w, &t, 1)
                .unwrap()
                .is_empty());
        }
        assert!(failed > 50, "{failed} of 60 failed ({committed} committed)");
        drop(w);
        e.close().unwrap();
    }
}
