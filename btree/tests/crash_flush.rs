//! `Engine::flush` under kill -9 (issue 28): a child process writes rounds of records with
//! durability `flush-every-ms=60000` (the log writer would flush only once a minute), calls
//! `flush()` after each round and says so, and is killed with SIGKILL at a random moment.
//! Every record of every round reported flushed must be there after recovery. Without the
//! flush, nearly all of them would be lost (the child never commits).

mod common;

use shoal_btree::{u64_key, BTree};
use shoal_engine::{Durability, Engine, EngineConfig};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

const DIR: &str = "SHOAL_CRASH_FLUSH_DIR";
const PER_ROUND: u64 = 2_000;

fn config(dir: &Path) -> EngineConfig {
    let mut c = EngineConfig::new(dir, 8 << 20);
    c.durability = Durability::FlushEveryMs(60_000);
    c.wal_bytes = 64 << 20;
    c
}

fn record(k: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&k.to_le_bytes());
    v[8..].copy_from_slice(&(k ^ 0x5555).to_le_bytes());
    v
}

/// The child: rounds of inserts, a flush after each, until killed.
#[test]
fn child_writes_and_flushes() {
    let Ok(dir) = std::env::var(DIR) else {
        return; // only as a child
    };
    let e = Engine::open(config(Path::new(&dir))).unwrap();
    let w = e.worker();
    let t = BTree::open_or_create(&w, "t").unwrap();
    let out = std::io::stdout();
    let mut out = out.lock();
    for round in 0.. {
        for k in round * PER_ROUND..(round + 1) * PER_ROUND {
            assert!(t.insert(&w, u64_key(k), record(k)).unwrap().inserted());
        }
        e.flush().unwrap();
        writeln!(out, "flushed {round}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn every_record_before_a_flush_survives_kill_9() {
    let rounds: u32 = common::env_num("SHOAL_CRASH_FLUSH_ROUNDS", 6);
    for round in 0..rounds {
        let dir = tempfile::tempdir().unwrap();
        let child = common::respawn(
            "child_writes_and_flushes",
            &[(DIR, dir.path().display().to_string())],
        );
        let after = Duration::from_millis(300 + 150 * round as u64);
        let lines = common::kill_after(child, after, round);
        let flushed: Option<u64> = lines
            .iter()
            .filter_map(|l| l.rsplit("flushed ").next()?.trim().parse().ok())
            .max();
        let Some(last) = flushed else {
            continue; // killed before the first flush: nothing promised
        };
        println!("round {round}: {} rounds flushed before the kill", last + 1);
        let e = Engine::open(config(dir.path())).unwrap();
        let w = e.worker();
        let t = BTree::open(&w, "t").unwrap();
        for k in 0..(last + 1) * PER_ROUND {
            assert_eq!(
                t.get(&w, u64_key(k)).unwrap().as_deref(),
                Some(&record(k)[..]),
                "round {round}: record {k} of flushed round {} lost",
                k / PER_ROUND
            );
        }
        t.verify(&w).unwrap();
        drop(w);
        e.close().unwrap();
    }
}
