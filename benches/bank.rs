//! The bank transfer of issue 43 measured in one process: 100 accounts of 1,000, 4 threads
//! moving money between random accounts and 1 thread summing every balance, in memory
//! (durability none). Two ways of writing the transfer take turns in phases of
//! `SHOAL_BANK_PHASE_MS` (default 1,000 ms) for `SHOAL_BENCH_SECS` (default 20) in all:
//!
//! - `transaction`: each transfer one [`shoal_btree::Transaction`] (two `update`s, run again on
//!   conflict), each sum one read-only transaction over every account;
//! - `two updates`: each transfer two `BTree::update` calls, each sum a plain scan: what a
//!   transfer was before transactions (each update atomic by itself, nothing isolated).
//!
//! `SHOAL_BANK_SUMMERS` sets the summing threads (default 1; 0 measures the movers alone).
//! `SHOAL_BANK_ACCOUNTS` (default 100) and `SHOAL_BANK_PAD` (bytes after each balance,
//! default 0) spread the accounts over many leaves (1,000 accounts with 1,000 bytes of
//! padding: 250 leaves); `SHOAL_BANK_AUDIT=points` sums by a point read of every account
//! instead of one range. A transactional sum that conflicts when its phase ends gives up
//! (counted as neither right nor wrong).
//!
//! Alternating in one process keeps the machine's drift out of the ratio. Each phase ends with
//! every thread finishing its transfer; the total is then checked (it must be exact in both
//! ways: a lone update cannot lose money, it only lets readers see a transfer half done).
//! Prints transfers/s, sums/s and wrong sums per way, and the ratio; with `SHOAL_BENCH_JSON`
//! set, writes the same as JSON to that file.
//!
//! Run: `cargo bench -p shoal-benches --bench bank`

use shoal_benches::bench_secs;
use shoal_btree::{transact, u64_key, BTree, Direction, TxError};
use shoal_engine::{Engine, Worker};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const START: i64 = 1_000;
const MOVERS: usize = 4;

/// The accounts and how they are summed (see the module docs).
#[derive(Clone, Copy)]
struct Bank {
    accounts: u64,
    pad: usize,
    points: bool,
}

impl Bank {
    fn total(&self) -> i64 {
        self.accounts as i64 * START
    }
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Way {
    Transaction,
    TwoUpdates,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Transaction => "transaction",
            Way::TwoUpdates => "two updates",
        }
    }
}

#[derive(Default, Clone, Copy)]
struct Counts {
    transfers: u64,
    sums: u64,
    wrong_sums: u64,
    secs: f64,
}

fn amount(v: &[u8]) -> i64 {
    i64::from_le_bytes(v[..8].try_into().expect("an account holds 8 bytes"))
}

fn add(v: &mut [u8], delta: i64) {
    let now = amount(v);
    v[..8].copy_from_slice(&(now + delta).to_le_bytes());
}

fn transfer(w: &Worker, t: &BTree, way: Way, from: u64, to: u64, amt: i64) {
    match way {
        Way::Transaction => transact(w, |tx| {
            tx.update(t, u64_key(from), |v| add(v, -amt))?;
            tx.update(t, u64_key(to), |v| add(v, amt))?;
            Ok(())
        })
        .expect("a transfer"),
        Way::TwoUpdates => {
            assert!(t
                .update(w, u64_key(from), |v| add(v, -amt))
                .expect("update"));
            assert!(t.update(w, u64_key(to), |v| add(v, amt)).expect("update"));
        }
    }
}

/// The sum of every balance (`None`: a transaction that conflicted once `stop` was set).
fn sum(w: &Worker, t: &BTree, way: Way, bank: Bank, stop: &AtomicBool) -> Option<i64> {
    match way {
        Way::Transaction => {
            let mut tries = 0;
            loop {
                let mut tx = shoal_btree::Transaction::begin(w);
                let r = (|| {
                    if bank.points {
                        let mut s = 0;
                        for a in 0..bank.accounts {
                            s += amount(&tx.get(t, u64_key(a))?.expect("an account"));
                        }
                        return Ok::<_, TxError>(s);
                    }
                    let all =
                        tx.range::<&[u8]>(t, .., Direction::Ascending, bank.accounts as usize + 1)?;
                    Ok(all.iter().map(|(_, v)| amount(v)).sum())
                })()
                .and_then(|s| tx.commit().map(|()| s));
                match r {
                    Ok(s) => return Some(s),
                    Err(e) if e.is_conflict() => {
                        if stop.load(Ordering::Relaxed) {
                            return None;
                        }
                        tries += 1;
                        shoal_btree::backoff_after_conflict(tries);
                    }
                    Err(e) => panic!("a sum: {e}"),
                }
            }
        }
        Way::TwoUpdates => {
            let mut s = 0;
            t.scan(w, &[], Direction::Ascending, |_, v| {
                s += amount(v);
                true
            })
            .expect("a scan");
            Some(s)
        }
    }
}

/// One phase of `way`: the counts.
fn phase(
    e: &Engine,
    t: &BTree,
    way: Way,
    len: Duration,
    seed: u64,
    summers: usize,
    bank: Bank,
) -> Counts {
    let stop = AtomicBool::new(false);
    let (transfers, sums, wrong) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let start = Instant::now();
    std::thread::scope(|s| {
        for m in 0..MOVERS {
            let (stop, transfers) = (&stop, &transfers);
            s.spawn(move || {
                let w = e.worker();
                let mut x = (seed * 8 + m as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let mut next = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let a = next() % bank.accounts;
                    let b = (a + 1 + next() % (bank.accounts - 1)) % bank.accounts;
                    transfer(&w, t, way, a, b, (next() % 100) as i64 + 1);
                    n += 1;
                }
                transfers.fetch_add(n, Ordering::Relaxed);
            });
        }
        for _ in 0..summers {
            let (stop, sums, wrong) = (&stop, &sums, &wrong);
            s.spawn(move || {
                let w = e.worker();
                while !stop.load(Ordering::Relaxed) {
                    let Some(s) = sum(&w, t, way, bank, stop) else {
                        break;
                    };
                    if s != bank.total() {
                        wrong.fetch_add(1, Ordering::Relaxed);
                    }
                    sums.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        std::thread::sleep(len);
        stop.store(true, Ordering::Relaxed);
    });
    let secs = start.elapsed().as_secs_f64();
    let total = sum(&e.worker(), t, Way::TwoUpdates, bank, &stop);
    assert_eq!(
        total,
        Some(bank.total()),
        "after a phase of {}: money made or lost",
        way.name()
    );
    Counts {
        transfers: transfers.into_inner(),
        sums: sums.into_inner(),
        wrong_sums: wrong.into_inner(),
        secs,
    }
}

fn main() {
    let secs = bench_secs(20);
    let phase_len = Duration::from_millis(
        std::env::var("SHOAL_BANK_PHASE_MS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1000),
    );
    let summers: usize = env("SHOAL_BANK_SUMMERS", 1);
    let bank = Bank {
        accounts: env("SHOAL_BANK_ACCOUNTS", 100u64).max(2),
        pad: env("SHOAL_BANK_PAD", 0),
        points: std::env::var("SHOAL_BANK_AUDIT").is_ok_and(|a| a == "points"),
    };
    let dir = shoal_benches::bench_dir();
    let e = Engine::open(shoal_benches::config(dir.path(), 64 << 20)).expect("engine");
    let t = {
        let w = e.worker();
        let t = BTree::create(&w, "bank").expect("tree");
        let mut v = vec![0u8; 8 + bank.pad];
        v[..8].copy_from_slice(&START.to_le_bytes());
        for a in 0..bank.accounts {
            t.upsert(&w, u64_key(a), &v).expect("open an account");
        }
        t
    };
    let leaves = t.verify(&e.worker()).expect("a whole tree").leaves;
    let ways = [Way::Transaction, Way::TwoUpdates];
    let mut counts = [Counts::default(); 2];
    let phases = (secs.as_millis() / phase_len.as_millis().max(1)).max(2) as u64;
    for p in 0..phases {
        let i = (p % 2) as usize;
        let c = phase(&e, &t, ways[i], phase_len, p, summers, bank);
        let all = &mut counts[i];
        all.transfers += c.transfers;
        all.sums += c.sums;
        all.wrong_sums += c.wrong_sums;
        all.secs += c.secs;
        eprintln!(
            "phase {p:>3} {:<12} {:>9.0} transfers/s {:>8.0} sums/s {:>7} wrong sums",
            ways[i].name(),
            c.transfers as f64 / c.secs,
            c.sums as f64 / c.secs,
            c.wrong_sums
        );
    }
    println!(
        "bank: {} accounts in {leaves} leaves, {MOVERS} movers, {summers} summing thread(s) \
         (by {}), in memory, {phases} phases of {phase_len:?}",
        bank.accounts,
        if bank.points {
            "point reads"
        } else {
            "one range"
        }
    );
    let rate = |c: &Counts| c.transfers as f64 / c.secs;
    for (w, c) in ways.iter().zip(&counts) {
        println!(
            "  {:<12} {:>9.0} transfers/s {:>8.0} sums/s  wrong sums {} of {}",
            w.name(),
            rate(c),
            c.sums as f64 / c.secs,
            c.wrong_sums,
            c.sums
        );
    }
    let ratio = rate(&counts[0]) / rate(&counts[1]);
    println!("  transaction / two updates: {ratio:.2}x transfers/s");
    if let Ok(path) = std::env::var("SHOAL_BENCH_JSON") {
        let way = |c: &Counts| {
            format!(
                "{{\"transfers_per_s\":{:.0},\"sums_per_s\":{:.0},\"sums\":{},\"wrong_sums\":{}}}",
                rate(c),
                c.sums as f64 / c.secs,
                c.sums,
                c.wrong_sums
            )
        };
        let json = format!(
            "{{\"bench\":\"bank\",\"accounts\":{},\"leaves\":{leaves},\"audit\":\"{}\",\"summers\":{summers},\"transaction\":{},\"two_updates\":{},\"ratio\":{ratio:.3}}}\n",
            bank.accounts,
            if bank.points { "points" } else { "range" },
            way(&counts[0]),
            way(&counts[1])
        );
        std::fs::write(&path, json).expect("write SHOAL_BENCH_JSON");
    }
}
