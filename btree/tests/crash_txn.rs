//! kill -9 never leaves half a transaction: a child process (this test binary run again)
//! moves money between accounts, each transfer one transaction of three B-tree operations
//! (debit, credit, and the insert of the transfer's record), committed without waiting and
//! acknowledged on stdout once durable; one in ten is undone by the child itself before it
//! commits (as a failed transaction is). The parent kills it with SIGKILL at a random moment,
//! reopens the store (recovery rolls back the transactions the crash cut off), and checks:
//! every acknowledged transfer's record is there, and every balance equals the initial
//! balance plus what the recorded transfers moved. Half a transaction (a debit without its
//! credit, a record without its balances) breaks that equation. Small cache and log, so the
//! rounds cross evictions, checkpoints (with transactions running) and the log's wrap.
//!
//! Rounds: `SHOAL_CRASH_TXN_ROUNDS` (default 12).

mod common;

use byteorder::{ByteOrder, LittleEndian};
use rand::{Rng, SeedableRng};
use shoal_btree::{decode_u64, u64_key, BTree, Direction};
use shoal_engine::{CommitPoint, Durability, Engine, EngineConfig};
use std::collections::{HashSet, VecDeque};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

const CHILD: &str = "SHOAL_CRASH_TXN_CHILD_DIR";
const ACCOUNTS: u64 = 2_000;
const START: u64 = 1_000_000;

fn config(dir: &Path) -> EngineConfig {
    let mut c = EngineConfig::new(dir, 2 << 20);
    c.durability = Durability::Commit;
    c.wal_bytes = 4 << 20;
    c.roll_back = Some(shoal_btree::roll_back());
    c
}

fn get(t: &BTree, w: &shoal_engine::Worker, k: u64) -> u64 {
    let v = t.get(w, u64_key(k)).expect("lookup").expect("account");
    LittleEndian::read_u64(&v)
}

fn add(t: &BTree, w: &shoal_engine::Worker, k: u64, delta: i64) {
    let found = t
        .update(w, u64_key(k), |v| {
            let b = LittleEndian::read_u64(v);
            v[..8].copy_from_slice(&b.wrapping_add_signed(delta).to_le_bytes());
        })
        .expect("update");
    assert!(found, "account {k}");
}

/// The child: transfer forever (until killed), acknowledging each durable transfer.
fn child(dir: &Path, seed: u64) {
    let e = Engine::open(config(dir)).expect("open (recovering) in the child");
    let w = e.worker();
    let (accounts, transfers) = match BTree::open(&w, "accounts") {
        Ok(a) => (a, BTree::open(&w, "transfers").expect("transfers")),
        Err(_) => {
            let a = BTree::create(&w, "accounts").expect("accounts");
            let t = BTree::create(&w, "transfers").expect("transfers");
            for k in 0..ACCOUNTS {
                assert!(a
                    .insert(&w, u64_key(k), START.to_le_bytes())
                    .unwrap()
                    .inserted());
            }
            w.commit().expect("commit the set-up");
            (a, t)
        }
    };
    // continue numbering after the last recorded transfer
    let mut next = 0u64;
    transfers
        .scan(&w, &u64_key(u64::MAX), Direction::Descending, |k, _| {
            next = decode_u64(k).unwrap() + 1;
            false
        })
        .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let out = std::io::stdout();
    let mut out = out.lock();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    let mut pending: VecDeque<(CommitPoint, u64)> = VecDeque::new();
    loop {
        let (from, to) = (rng.random_range(0..ACCOUNTS), rng.random_range(0..ACCOUNTS));
        let x = rng.random_range(1..1000i64);
        w.begin_transaction().unwrap();
        add(&accounts, &w, from, -x);
        let mut rec = from.to_le_bytes().to_vec();
        rec.extend_from_slice(&to.to_le_bytes());
        rec.extend_from_slice(&x.to_le_bytes());
        assert!(transfers
            .insert(&w, u64_key(next), &rec)
            .unwrap()
            .inserted());
        add(&accounts, &w, to, x);
        if rng.random_range(0..10) == 0 {
            // undone by its owner, as a failed transaction is
            w.rolling_back();
            add(&accounts, &w, to, -x);
            assert!(transfers.remove(&w, u64_key(next)).unwrap());
            add(&accounts, &w, from, x);
            let _ended = w.commit_later().unwrap();
            continue;
        }
        pending.push_back((w.commit_later().unwrap(), next));
        next += 1;
        while let Some(&(p, id)) = pending.front() {
            if !w.is_durable(p).unwrap() {
                break;
            }
            writeln!(out, "ack {id}").unwrap();
            pending.pop_front();
        }
        out.flush().unwrap();
    }
}

#[test]
fn kill_9_never_leaves_half_a_transaction() {
    if let Ok(dir) = std::env::var(CHILD) {
        child(Path::new(&dir), common::env_num("SHOAL_CRASH_SEED", 1));
        return;
    }
    let rounds: usize = common::env_num("SHOAL_CRASH_TXN_ROUNDS", 12);
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xFEED);
    let mut acked: HashSet<u64> = HashSet::new();
    let mut rolled_back = 0;
    for round in 0..rounds {
        let ch = common::respawn(
            "kill_9_never_leaves_half_a_transaction",
            &[
                (CHILD, dir.path().display().to_string()),
                ("SHOAL_CRASH_SEED", (round as u64 + 1).to_string()),
            ],
        );
        let kill_after = Duration::from_millis(rng.random_range(100..1500));
        for l in common::kill_after(ch, kill_after, round) {
            if let Some(id) = l.strip_prefix("ack ").and_then(|s| s.parse().ok()) {
                acked.insert(id);
            }
        }
        let e = Engine::open(config(dir.path()))
            .unwrap_or_else(|err| panic!("round {round}: reopening after kill -9: {err}"));
        rolled_back += e.rolled_back();
        let w = e.worker();
        let (Ok(accounts), Ok(transfers)) =
            (BTree::open(&w, "accounts"), BTree::open(&w, "transfers"))
        else {
            assert!(
                acked.is_empty(),
                "round {round}: tables gone after acknowledgements"
            );
            continue;
        };
        accounts.verify(&w).unwrap();
        transfers.verify(&w).unwrap();
        let mut want = vec![START as i64; ACCOUNTS as usize];
        let mut recorded = HashSet::new();
        transfers
            .scan(&w, &[], Direction::Ascending, |k, v| {
                let from = LittleEndian::read_u64(&v[0..]);
                let to = LittleEndian::read_u64(&v[8..]);
                let x = LittleEndian::read_i64(&v[16..]);
                want[from as usize] -= x;
                want[to as usize] += x;
                recorded.insert(decode_u64(k).unwrap());
                true
            })
            .unwrap();
        for id in &acked {
            assert!(
                recorded.contains(id),
                "round {round}: acknowledged transfer {id} is gone"
            );
        }
        for k in 0..ACCOUNTS {
            assert_eq!(
                get(&accounts, &w, k) as i64,
                want[k as usize],
                "round {round}: account {k} does not match the recorded transfers (half a transaction)"
            );
        }
        drop(w);
        e.close().unwrap();
    }
    eprintln!(
        "{rounds} kills, {} acknowledged transfers, none lost, none half applied; {rolled_back} cut-off transactions rolled back",
        acked.len()
    );
}
