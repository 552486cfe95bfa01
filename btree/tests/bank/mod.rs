//! The bank checker: accounts that transactions move money between, and read-only
//! transactions that sum every account. Isolation holds if every committed sum is the exact
//! total and the total at the end is too (money is neither made nor lost).
#![allow(dead_code)] // each test binary uses its part

use shoal_btree::{transact, u64_key, BTree, Direction, TxError};
use shoal_engine::Worker;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub const ACCOUNTS: u64 = 100;
pub const START: i64 = 1_000;
pub const TOTAL: i64 = ACCOUNTS as i64 * START;

fn amount(v: &[u8]) -> i64 {
    i64::from_le_bytes(v[..8].try_into().expect("an account holds 8 bytes"))
}

/// Open every account with `START` (one transaction).
pub fn open_accounts(w: &Worker, tree: &BTree) {
    transact(w, |tx| {
        for a in 0..ACCOUNTS {
            tx.upsert(tree, u64_key(a), START.to_le_bytes())?;
        }
        Ok(())
    })
    .expect("accounts opened");
}

/// A one-node engine under `dir` with a 64 MiB cache, a tree "bank" with every account
/// opened, and a worker.
pub fn one_node(dir: &std::path::Path) -> (shoal_engine::Engine, BTree, Worker) {
    let e = shoal_engine::Engine::open(shoal_engine::EngineConfig::new(dir, 64 << 20))
        .expect("engine opened");
    let w = e.worker();
    let tree = BTree::create(&w, "bank").expect("tree created");
    open_accounts(&w, &tree);
    (e, tree, w)
}

/// Bytes after an account's balance in [`open_wide_accounts`]: a leaf then holds about ten
/// accounts, so the accounts span many leaves and most transfers write two.
pub const WIDE_PAD: usize = 400;

/// Open every account with `START` and `WIDE_PAD` bytes of padding after the balance (one
/// transaction each).
pub fn open_wide_accounts(w: &Worker, tree: &BTree) {
    let mut v = vec![0u8; 8 + WIDE_PAD];
    v[..8].copy_from_slice(&START.to_le_bytes());
    for a in 0..ACCOUNTS {
        transact(w, |tx| tx.upsert(tree, u64_key(a), &v)).expect("account opened");
    }
}

/// Move `amt` from account `from` to `to` in one transaction.
pub fn transfer(w: &Worker, tree: &BTree, from: u64, to: u64, amt: i64) -> Result<(), TxError> {
    transfer_legs(w, tree, &[(from, to, amt)])
}

/// Make every move `(from, to, amt)` of `legs`, all in one transaction.
pub fn transfer_legs(w: &Worker, tree: &BTree, legs: &[(u64, u64, i64)]) -> Result<(), TxError> {
    transfer_paused(w, tree, legs, None)
}

/// [`transfer_legs`], sleeping for `pause` (if any) right after the first account was read.
fn transfer_paused(
    w: &Worker,
    tree: &BTree,
    legs: &[(u64, u64, i64)],
    pause: Option<Duration>,
) -> Result<(), TxError> {
    transact(w, |tx| {
        for (i, &(from, to, amt)) in legs.iter().enumerate() {
            tx.update(tree, u64_key(from), |v| {
                let now = amount(v);
                v[..8].copy_from_slice(&(now - amt).to_le_bytes())
            })?;
            if let (0, Some(p)) = (i, pause) {
                std::thread::sleep(p);
            }
            tx.update(tree, u64_key(to), |v| {
                let now = amount(v);
                v[..8].copy_from_slice(&(now + amt).to_le_bytes())
            })?;
        }
        Ok(())
    })
}

/// Two transfers interleaved by hand, on one thread: an outer one moves 10 from account 0 to
/// account 2; after it has read account 0, and only on its first try, an inner one (on
/// `inner`) moves 100 from account 0 to account 1 and commits. Returns how many times the
/// outer transaction ran. Isolated, the outer one conflicts and runs again, and the total
/// stays; without isolation, its write of account 0 undoes the inner transfer's debit:
/// 100 made.
pub fn transfer_around_another(outer: &Worker, inner: &Worker, tree: &BTree) -> u32 {
    let mut runs = 0;
    transact(outer, |tx| {
        runs += 1;
        tx.update(tree, u64_key(0), |v| {
            let now = amount(v);
            v[..8].copy_from_slice(&(now - 10).to_le_bytes())
        })?;
        if runs == 1 {
            transfer(inner, tree, 0, 1, 100).expect("the inner transfer committed");
        }
        tx.update(tree, u64_key(2), |v| {
            let now = amount(v);
            v[..8].copy_from_slice(&(now + 10).to_le_bytes())
        })
    })
    .expect("the outer transfer committed");
    runs
}

/// The sum of every account, read in one read-only transaction by a point read of each, in
/// an order that `seed` shuffles.
pub fn audit_points(w: &Worker, tree: &BTree, seed: u64) -> Result<i64, TxError> {
    let mut order: Vec<u64> = (0..ACCOUNTS).collect();
    let mut x = seed | 1;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    transact(w, |tx| {
        let mut sum = 0;
        for &a in &order {
            sum += amount(&tx.get(tree, u64_key(a))?.expect("an account"));
        }
        Ok(sum)
    })
}

/// The sum of every account, read in one read-only transaction (a range over all of them).
pub fn audit(w: &Worker, tree: &BTree) -> Result<i64, TxError> {
    transact(w, |tx| {
        let all = tx.range::<&[u8]>(tree, .., Direction::Ascending, ACCOUNTS as usize + 1)?;
        assert_eq!(all.len() as u64, ACCOUNTS, "an account went missing");
        Ok(all.iter().map(|(_, v)| amount(v)).sum())
    })
}

/// The total outside any transaction (once nothing runs).
pub fn total_now(w: &Worker, tree: &BTree) -> i64 {
    let mut v = Vec::new();
    (0..ACCOUNTS)
        .map(|a| {
            assert!(tree.lookup(w, u64_key(a), &mut v).unwrap(), "account {a}");
            amount(&v)
        })
        .sum()
}

/// What a run of the bank saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub transfers: u64,
    pub audits: u64,
    /// Committed audits whose sum was not the total.
    pub wrong_audits: u64,
    pub first_wrong: Option<i64>,
    pub total_after: i64,
}

/// How a bank run loads the accounts.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    /// How long it runs, in seconds.
    pub secs: f64,
    /// Stop at the first audit that sees a wrong total (at most `secs`).
    pub until_wrong: bool,
    /// Moves per transfer. With more than one, move `i` moves money within part `i` of the
    /// accounts, so that every transfer writes the same few leaves.
    pub legs: usize,
    /// A sleep inside every transfer, after it read its first account and before it reads
    /// the others: the other movers commit meanwhile, so the interleavings isolation has to
    /// handle come every few transfers instead of only when the scheduler happens to preempt
    /// a mover in the middle of one.
    pub pause_inside: Option<Duration>,
    /// Audits read every account by a point read, in a random order, instead of one range.
    pub audit_by_points: bool,
}

impl Load {
    /// Transfers of one move each, for `secs`, without pauses.
    pub fn for_secs(secs: f64) -> Load {
        Load {
            secs,
            until_wrong: false,
            legs: 1,
            pause_inside: None,
            audit_by_points: false,
        }
    }
}

/// Run `movers.len()` threads moving money and `auditors.len()` threads summing, as `load`
/// says. If nothing commits for `STALL` the process exits with an error: transactions that
/// stopped making progress (a livelock) would otherwise hang the test for ever.
pub fn run(movers: Vec<Worker>, auditors: Vec<Worker>, tree: BTree, load: Load) -> Seen {
    let Load {
        secs,
        until_wrong,
        legs,
        pause_inside,
        audit_by_points,
    } = load;
    assert!(legs >= 1, "a transfer makes at least one move");
    let stop = AtomicBool::new(false);
    let transfers = AtomicU64::new(0);
    let audits = AtomicU64::new(0);
    let wrong = AtomicU64::new(0);
    let first_wrong = std::sync::Mutex::new(None);
    let end = Instant::now() + Duration::from_secs_f64(secs);
    std::thread::scope(|s| {
        for (t, w) in movers.into_iter().enumerate() {
            let (stop, transfers, tree) = (&stop, &transfers, &tree);
            s.spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(t as u64 + 1);
                let mut next = || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let mut moves = Vec::with_capacity(legs);
                while !stop.load(Ordering::Relaxed) {
                    moves.clear();
                    for leg in 0..legs as u64 {
                        let (a, b) = if legs == 1 {
                            let a = next() % ACCOUNTS;
                            (a, (a + 1 + next() % (ACCOUNTS - 1)) % ACCOUNTS)
                        } else {
                            // leg `i` between the two halves of its own part of the accounts:
                            // every transfer writes the same few leaves, as every TPC-C
                            // NewOrder of a warehouse writes its district's and its tables'
                            // last leaves
                            let part = ACCOUNTS / legs as u64;
                            let half = (part / 2).max(1);
                            let a = leg * part + next() % half;
                            (a, a + half)
                        };
                        moves.push((a, b, (next() % 100) as i64 + 1));
                    }
                    transfer_paused(&w, tree, &moves, pause_inside).expect("a transfer failed");
                    transfers.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        for w in auditors {
            let (stop, audits, wrong, first_wrong, tree) =
                (&stop, &audits, &wrong, &first_wrong, &tree);
            s.spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let sum = if audit_by_points {
                        audit_points(&w, tree, n)
                    } else {
                        audit(&w, tree)
                    }
                    .expect("an audit failed");
                    audits.fetch_add(1, Ordering::Relaxed);
                    if sum != TOTAL {
                        wrong.fetch_add(1, Ordering::Relaxed);
                        first_wrong.lock().unwrap().get_or_insert(sum);
                    }
                }
            });
        }
        const STALL: Duration = Duration::from_secs(30);
        let (mut done, mut since) = (0, Instant::now());
        while Instant::now() < end && !(until_wrong && wrong.load(Ordering::Relaxed) > 0) {
            std::thread::sleep(Duration::from_millis(10));
            let now = transfers.load(Ordering::Relaxed) + audits.load(Ordering::Relaxed);
            if now != done {
                (done, since) = (now, Instant::now());
            } else if since.elapsed() > STALL {
                eprintln!("no transfer or audit committed for {STALL:?}: the bank stalled");
                std::process::exit(101);
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    Seen {
        transfers: transfers.into_inner(),
        audits: audits.into_inner(),
        wrong_audits: wrong.into_inner(),
        first_wrong: first_wrong.into_inner().unwrap(),
        total_after: 0,
    }
}

/// The two accounts of [`flip_flop`]: x is key 0, y key `FLIP_Y`, and the 400 rows of 100
/// bytes between them put them in different leaves.
pub const FLIP_Y: u64 = 401;

/// Rows 0..=`FLIP_Y` of 100 bytes, x and y holding 1,000 each (so x + y = 2,000).
pub fn open_flip_flop(w: &Worker, tree: &BTree) {
    let mut v = vec![0u8; 100];
    v[..8].copy_from_slice(&START.to_le_bytes());
    for k in 0..=FLIP_Y {
        tree.upsert(w, u64_key(k), &v).expect("row written");
    }
}

/// What a flip-flop run saw.
#[derive(Debug, Default)]
pub struct FlipFlops {
    pub moves: u64,
    pub audits: u64,
    /// Committed audits that saw x + y other than 2,000.
    pub wrong_audits: u64,
    /// Committed audits that also wrote the sum they saw into `sums` (checked there too).
    pub writing_audits: u64,
}

/// One mover moves 10 from x to y and back, over and over (each value returns to what it
/// was, so a validation by value alone is fooled: x checked at 1,000, a move, y checked at
/// 1,010, and together they never existed); auditors read x, 100 rows between, then y, by
/// point reads in a transaction, and every other audit writes the sum it saw into `sums` (a commit that holds
/// a leaf). Runs for `secs`.
pub fn flip_flop(
    mover: Worker,
    auditors: Vec<Worker>,
    tree: BTree,
    sums: BTree,
    secs: f64,
) -> FlipFlops {
    let stop = AtomicBool::new(false);
    let (moves, audits, wrong, writing) = (
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
    );
    std::thread::scope(|s| {
        let (stop, moves, tree) = (&stop, &moves, &tree);
        s.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let (a, b) = if moves.load(Ordering::Relaxed).is_multiple_of(2) {
                    (0, FLIP_Y)
                } else {
                    (FLIP_Y, 0)
                };
                transfer(&mover, tree, a, b, 10).expect("a move");
                moves.fetch_add(1, Ordering::Relaxed);
            }
        });
        for (i, w) in auditors.into_iter().enumerate() {
            let (audits, wrong, writing, sums) = (&audits, &wrong, &writing, &sums);
            s.spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let writes = n.is_multiple_of(2);
                    let sum = transact(&w, |tx| {
                        let x = amount(&tx.get(tree, u64_key(0))?.expect("x"));
                        // reads of rows the mover leaves alone, between x and y: their checks
                        // at the commit leave time for a move between those of x and y
                        for k in 100..200 {
                            tx.get(tree, u64_key(k))?.expect("a row between");
                        }
                        let y = amount(&tx.get(tree, u64_key(FLIP_Y))?.expect("y"));
                        if writes {
                            tx.upsert(sums, u64_key(i as u64), (x + y).to_le_bytes())?;
                        }
                        Ok(x + y)
                    })
                    .expect("an audit failed");
                    audits.fetch_add(1, Ordering::Relaxed);
                    if writes {
                        writing.fetch_add(1, Ordering::Relaxed);
                    }
                    if sum != 2 * START {
                        wrong.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
    });
    FlipFlops {
        moves: moves.into_inner(),
        audits: audits.into_inner(),
        wrong_audits: wrong.into_inner(),
        writing_audits: writing.into_inner(),
    }
}

/// Registers of [`swaps`]: register `k` starts holding `k`, and swaps only permute the values,
/// so every state that ever existed holds each of `0..REGISTERS` exactly once.
pub const REGISTERS: u64 = 64;

/// Bytes after a register's value: three or four registers a leaf, so the registers span
/// about twenty leaves and most swaps and every audit read several.
pub const REGISTER_PAD: usize = 900;

/// Open every register (`k` holding `k`).
pub fn open_registers(w: &Worker, tree: &BTree) {
    let mut v = vec![0u8; 8 + REGISTER_PAD];
    for k in 0..REGISTERS {
        v[..8].copy_from_slice(&k.to_le_bytes());
        tree.upsert(w, u64_key(k), &v).expect("register written");
    }
}

/// What a swaps run saw.
#[derive(Debug, Default)]
pub struct Swaps {
    pub swaps: u64,
    pub audits: u64,
    /// Committed audits whose registers were not a permutation of `0..REGISTERS`.
    pub wrong_audits: u64,
}

/// Whether `values` (one per register) are a permutation of `0..REGISTERS`.
pub fn a_permutation(values: &[u64]) -> bool {
    let mut seen = [false; REGISTERS as usize];
    values.len() == REGISTERS as usize
        && values
            .iter()
            .all(|&v| v < REGISTERS && !std::mem::replace(&mut seen[v as usize], true))
}

/// `swappers` swap the values of two random registers in transactions (values come back all
/// the time: a register holds one of 64 values); `auditors` read every register in a
/// transaction, by point reads in a random order on odd audits and by one range on even ones,
/// and check they are a permutation. Each swapper sleeps `pause` after each swap (an audit
/// reads every leaf: a swapper without pause would change one before every audit finished,
/// and no audit would ever commit). Runs for `secs`.
pub fn swaps(
    swappers: Vec<Worker>,
    auditors: Vec<Worker>,
    tree: BTree,
    pause: Duration,
    secs: f64,
) -> Swaps {
    let stop = AtomicBool::new(false);
    let (swaps, audits, wrong) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let value = |v: &[u8]| u64::from_le_bytes(v[..8].try_into().expect("a register"));
    let rng = |seed: u64| {
        let mut x = 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(seed + 1);
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    };
    std::thread::scope(|s| {
        for (t, w) in swappers.into_iter().enumerate() {
            let (stop, swaps, tree) = (&stop, &swaps, &tree);
            s.spawn(move || {
                let mut next = rng(t as u64);
                while !stop.load(Ordering::Relaxed) {
                    let a = next() % REGISTERS;
                    let b = (a + 1 + next() % (REGISTERS - 1)) % REGISTERS;
                    transact(&w, |tx| {
                        let va = tx.get(tree, u64_key(a))?.expect("register a");
                        let vb = tx.get(tree, u64_key(b))?.expect("register b");
                        tx.upsert(tree, u64_key(a), &vb)?;
                        tx.upsert(tree, u64_key(b), &va)?;
                        Ok(())
                    })
                    .expect("a swap");
                    swaps.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(pause);
                }
            });
        }
        for (t, w) in auditors.into_iter().enumerate() {
            let (stop, audits, wrong, tree) = (&stop, &audits, &wrong, &tree);
            s.spawn(move || {
                let mut next = rng(1000 + t as u64);
                let mut order: Vec<u64> = (0..REGISTERS).collect();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    for i in (1..order.len()).rev() {
                        order.swap(i, (next() % (i as u64 + 1)) as usize);
                    }
                    let values = transact(&w, |tx| {
                        if n.is_multiple_of(2) {
                            let all = tx.range::<&[u8]>(
                                tree,
                                ..,
                                Direction::Ascending,
                                REGISTERS as usize + 1,
                            )?;
                            return Ok(all.iter().map(|(_, v)| value(v)).collect::<Vec<_>>());
                        }
                        let mut vs = Vec::with_capacity(order.len());
                        for &k in &order {
                            vs.push(value(&tx.get(tree, u64_key(k))?.expect("a register")));
                        }
                        Ok(vs)
                    })
                    .expect("an audit");
                    audits.fetch_add(1, Ordering::Relaxed);
                    if !a_permutation(&values) {
                        wrong.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
    });
    Swaps {
        swaps: swaps.into_inner(),
        audits: audits.into_inner(),
        wrong_audits: wrong.into_inner(),
    }
}
