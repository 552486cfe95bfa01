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

/// Bytes after an account's balance in [`open_wide_accounts`]: a leaf then holds about ten
/// accounts, so the accounts span many leaves and most transfers write two.
pub const WIDE_PAD: usize = 400;

/// Open every account with `START` and `WIDE_PAD` bytes of padding after the balance (one
/// transaction each: a commit writes at most a few KB into one gap of the keys).
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
    transact(w, |tx| {
        for &(from, to, amt) in legs {
            tx.update(tree, u64_key(from), |v| {
                let now = amount(v);
                v[..8].copy_from_slice(&(now - amt).to_le_bytes())
            })?;
            tx.update(tree, u64_key(to), |v| {
                let now = amount(v);
                v[..8].copy_from_slice(&(now + amt).to_le_bytes())
            })?;
        }
        Ok(())
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

/// Run `movers.len()` threads moving money and `auditors.len()` threads summing, for `secs`
/// (or, with `until_wrong`, until a wrong total is seen, at most `secs`). If nothing commits
/// for `STALL` the process exits with an error: transactions that stopped making progress
/// (a livelock) would otherwise hang the test for ever.
pub fn run(
    movers: Vec<Worker>,
    auditors: Vec<Worker>,
    tree: BTree,
    secs: f64,
    until_wrong: bool,
) -> Seen {
    run_legs(movers, auditors, tree, secs, until_wrong, 1)
}

/// [`run`] with transfers of `legs` moves each; with more than one, leg `i` moves money
/// within part `i` of the accounts, so that every transfer writes the same few leaves.
pub fn run_legs(
    movers: Vec<Worker>,
    auditors: Vec<Worker>,
    tree: BTree,
    secs: f64,
    until_wrong: bool,
    legs: usize,
) -> Seen {
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
                    transfer_legs(&w, tree, &moves).expect("a transfer failed");
                    transfers.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        for w in auditors {
            let (stop, audits, wrong, first_wrong, tree) =
                (&stop, &audits, &wrong, &first_wrong, &tree);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let sum = audit(&w, tree).expect("an audit failed");
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
