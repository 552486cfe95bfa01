//! A crash during the roll-back of cut-off transactions: the next open rolls them back again,
//! whole. Phase 1: a child process runs transfers (as in `crash_txn.rs`) and is killed with
//! SIGKILL. Phase 2: a second child opens the store with a roll-back hook that undoes only the
//! first half of each cut-off transaction's records and then aborts the process (SIGABRT, no
//! clean-up). Phase 3: the parent opens it with the real hook and checks that every balance
//! equals the recorded transfers. Without the undo records carried into the resumed log at
//! phase 2's open, phase 3 would find nothing to roll back and the half-undone transaction
//! would stay.

mod common;

use byteorder::{ByteOrder, LittleEndian};
use rand::{Rng, SeedableRng};
use shoal_btree::{decode_u64, u64_key, BTree, Direction};
use shoal_engine::{Durability, Engine, EngineConfig, RollBack};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const PHASE: &str = "SHOAL_ROLLBACK_PHASE";
const DIR: &str = "SHOAL_ROLLBACK_DIR";
/// Phase 1 stops in the middle of this transaction (after a flush that makes its first
/// records durable) and says "mid", so that the kill surely cuts a transaction off.
const PAUSE_AT: &str = "SHOAL_ROLLBACK_PAUSE_AT";
const ACCOUNTS: u64 = 500;
const START: u64 = 1_000_000;

fn config(dir: &Path, roll_back: RollBack) -> EngineConfig {
    let mut c = EngineConfig::new(dir, 4 << 20);
    c.durability = Durability::Commit;
    c.wal_bytes = 8 << 20;
    c.roll_back = Some(roll_back);
    c
}

fn add(t: &BTree, w: &shoal_engine::Worker, k: u64, delta: i64) {
    assert!(t
        .update(w, u64_key(k), |v| {
            let b = LittleEndian::read_u64(v);
            v[..8].copy_from_slice(&b.wrapping_add_signed(delta).to_le_bytes());
        })
        .unwrap());
}

/// Phase 1: transfers, each a transaction of many operations (so that a cut-off one has
/// records to undo in halves), until killed.
fn transfer(dir: &Path) {
    let e = Engine::open(config(dir, shoal_btree::roll_back())).unwrap();
    let w = e.worker();
    let a = BTree::create(&w, "accounts").unwrap();
    let t = BTree::create(&w, "transfers").unwrap();
    for k in 0..ACCOUNTS {
        assert!(a
            .insert(&w, u64_key(k), START.to_le_bytes())
            .unwrap()
            .inserted());
    }
    w.commit().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let out = std::io::stdout();
    let mut out = out.lock();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    let pause_at: Option<u64> = std::env::var(PAUSE_AT).ok().and_then(|v| v.parse().ok());
    for id in 0u64.. {
        w.begin_transaction().unwrap();
        // twenty moves out of one account into others, and the record of each
        let from = rng.random_range(0..ACCOUNTS);
        for j in 0..20u64 {
            if j == 10 && pause_at == Some(id) {
                // the log holds this transaction's first ten moves, durable; wait for the kill
                e.flush().unwrap();
                writeln!(out, "mid").unwrap();
                out.flush().unwrap();
                std::thread::sleep(Duration::from_secs(3600));
            }
            let to = rng.random_range(0..ACCOUNTS);
            let x = rng.random_range(1..100i64);
            add(&a, &w, from, -x);
            add(&a, &w, to, x);
            let mut rec = from.to_le_bytes().to_vec();
            rec.extend_from_slice(&to.to_le_bytes());
            rec.extend_from_slice(&x.to_le_bytes());
            assert!(t
                .insert(&w, u64_key(id * 100 + j), &rec)
                .unwrap()
                .inserted());
        }
        w.commit().unwrap();
    }
}

/// Phase 2: open with a hook that undoes half of each transaction, then crashes.
fn half_roll_back(dir: &Path) {
    let hook = RollBack(Arc::new(|w, unfinished| {
        let half: Vec<shoal_engine::Unfinished> = unfinished
            .iter()
            .map(|u| shoal_engine::Unfinished {
                txn: u.txn,
                undo: u.undo[u.undo.len() / 2..].to_vec(),
            })
            .collect();
        (shoal_btree::roll_back().0)(w, &half)?;
        // make what was undone durable, as a real roll-back's progress may be, then crash
        w.wait_durable(w.commit_later().unwrap()).unwrap();
        println!("half undone: {} transaction(s)", unfinished.len());
        std::process::abort();
    }));
    // returns only when the kill fell between transactions: nothing to roll back
    let e = Engine::open(config(dir, hook)).expect("open without cut-off transactions");
    assert_eq!(e.rolled_back(), 0);
}

fn run_child(phase: &str, dir: &Path, pause_at: Option<u64>) -> std::process::Child {
    let mut env = vec![(PHASE, phase.to_string()), (DIR, dir.display().to_string())];
    if let Some(id) = pause_at {
        env.push((PAUSE_AT, id.to_string()));
    }
    common::respawn("a_crash_during_the_roll_back_rolls_back_again", &env)
}

#[test]
fn a_crash_during_the_roll_back_rolls_back_again() {
    if let (Ok(phase), Ok(dir)) = (std::env::var(PHASE), std::env::var(DIR)) {
        match phase.as_str() {
            "transfer" => transfer(Path::new(&dir)),
            _ => half_roll_back(Path::new(&dir)),
        }
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // rounds until two of them cut a transaction off (a kill between transactions leaves
    // nothing to roll back); at most 15. Even rounds stop the child in the middle of a
    // transaction before the kill (whether a kill at a random moment cuts one off depends on
    // how the time splits between a transaction's work and its commit: a debug build on a
    // loaded machine once went 15 rounds without), odd rounds kill it at a random moment.
    let mut rounds_with_half = 0;
    for round in 0..15u64 {
        if rounds_with_half == 2 {
            break;
        }
        let _ = std::fs::remove_dir_all(dir.path());
        // phase 1: transfers, killed mid-transaction (most of the time)
        let pause_at = round.is_multiple_of(2).then_some(5 + round);
        let mut ch = run_child("transfer", dir.path(), pause_at);
        let out = BufReader::new(ch.stdout.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let line = line.trim_end();
                if line.ends_with("ready") || line.ends_with("mid") {
                    let _ = tx.send(line.ends_with("mid"));
                }
            }
        });
        if rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = ch.kill();
            panic!("round {round}: the transfer child never got ready");
        }
        if pause_at.is_some() {
            if rx.recv_timeout(Duration::from_secs(120)) != Ok(true) {
                let _ = ch.kill();
                panic!("round {round}: the transfer child never stopped mid-transaction");
            }
        } else {
            std::thread::sleep(Duration::from_millis(300 + 100 * (round % 5)));
        }
        ch.kill().unwrap();
        ch.wait().unwrap();
        // phase 2: half a roll-back, then a crash
        let ch = run_child("half", dir.path(), None);
        let o = ch.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&o.stdout);
        if said.contains("half undone") {
            assert!(!o.status.success(), "round {round}: the hook aborts");
            rounds_with_half += 1;
        } else if pause_at.is_some() {
            panic!("round {round}: stopped mid-transaction, yet nothing to roll back: {said}");
        } else {
            assert!(o.status.success(), "round {round}: phase 2 failed: {said}");
        }
        // phase 3: the real roll-back; balances must match the recorded transfers
        let e = Engine::open(config(dir.path(), shoal_btree::roll_back())).unwrap_or_else(|err| {
            panic!("round {round}: open after the crash in roll-back: {err}")
        });
        if said.contains("half undone") {
            assert!(
                e.rolled_back() > 0,
                "round {round}: nothing left to roll back"
            );
        }
        let w = e.worker();
        let a = BTree::open(&w, "accounts").unwrap();
        let t = BTree::open(&w, "transfers").unwrap();
        let mut want = vec![START as i64; ACCOUNTS as usize];
        t.scan(&w, &[], Direction::Ascending, |_, v| {
            let from = LittleEndian::read_u64(&v[0..]);
            let to = LittleEndian::read_u64(&v[8..]);
            let x = LittleEndian::read_i64(&v[16..]);
            want[from as usize] -= x;
            want[to as usize] += x;
            true
        })
        .unwrap();
        for k in 0..ACCOUNTS {
            let v = a.get(&w, u64_key(k)).unwrap().unwrap();
            assert_eq!(
                LittleEndian::read_u64(&v) as i64,
                want[k as usize],
                "round {round}: account {k} does not match the recorded transfers"
            );
        }
        let mut n = 0;
        t.scan(&w, &[], Direction::Ascending, |k, _| {
            // a transaction's records are all there or none
            let _ = decode_u64(k);
            n += 1;
            true
        })
        .unwrap();
        assert_eq!(
            n % 20,
            0,
            "round {round}: {n} transfer records: half a transaction"
        );
        drop(w);
        e.close().unwrap();
    }
    assert!(rounds_with_half > 0, "no round cut a transaction off");
}
