//! kill -9 loses no acknowledged write: a child process (this test binary run again) inserts
//! and updates keys of a B-tree with `durability = commit`, printing each write after
//! `Worker::commit` returned; the parent kills it with SIGKILL at a random moment, reopens the
//! store (recovery), and checks that every acknowledged write is there with that or a later
//! value, that nothing else is, and that the tree verifies. The cache is small and the log
//! is small, so the rounds cross evictions, write-backs, checkpoints and the log's wrap.
//!
//! Rounds: `SHOAL_CRASH_ROUNDS` (default 20); the long run in docs/BENCHMARKS.md uses 500.

mod common;

use byteorder::{ByteOrder, LittleEndian};
use rand::{Rng, SeedableRng};
use shoal_btree::{u64_key, BTree};
use shoal_engine::{Durability, Engine, EngineConfig};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

const CHILD: &str = "SHOAL_CRASH_CHILD_DIR";
const KEYS: u64 = 20_000;

fn config(dir: &Path) -> EngineConfig {
    let cache: usize = std::env::var("SHOAL_CRASH_CACHE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2 << 20);
    let mut c = EngineConfig::new(dir, cache); // 512 frames: evictions all the time
    c.durability = Durability::Commit;
    c.wal_bytes = std::env::var("SHOAL_CRASH_WAL")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4 << 20); // checkpoints every MiB of log, wraps often
    c
}

/// Value of key `k` at version `v`: a length that varies with both (splits, merges of space),
/// the version readable from the first 8 bytes, the rest a pattern derived from both.
fn value(k: u64, v: u64) -> Vec<u8> {
    let len = 8 + (k.wrapping_mul(7).wrapping_add(v.wrapping_mul(13)) % 120) as usize;
    let mut out = v.to_le_bytes().to_vec();
    out.extend((0..len - 8).map(|i| {
        (k as usize)
            .wrapping_add((v as usize).wrapping_mul(3))
            .wrapping_add(i) as u8
    }));
    out
}

/// The child: write forever (until killed), acknowledging each committed write on stdout.
fn child(dir: &Path, seed: u64) {
    let e = Engine::open(config(dir)).expect("open (recovering) in the child");
    let w = e.worker();
    let t = BTree::open_or_create(&w, "crash").expect("tree");
    w.commit().expect("commit the tree");
    let out = std::io::stdout();
    let mut out = out.lock();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    for (k, v) in Ops::new(seed) {
        match v {
            None => {
                t.remove(&w, u64_key(k)).expect("remove");
                w.commit().expect("commit");
                writeln!(out, "del {k}").unwrap();
            }
            Some(v) => {
                t.upsert(&w, u64_key(k), value(k, v)).expect("upsert");
                w.commit().expect("commit");
                writeln!(out, "put {k} {v}").unwrap();
            }
        }
        out.flush().unwrap();
    }
}

/// The child's writes, from its seed: (key, Some(version)) to put, (key, None) to delete. The
/// parent replays the same sequence to know the one write that was in flight at the kill.
struct Ops(rand::rngs::StdRng);

impl Ops {
    fn new(seed: u64) -> Ops {
        Ops(rand::rngs::StdRng::seed_from_u64(seed))
    }
}

impl Iterator for Ops {
    type Item = (u64, Option<u64>);
    fn next(&mut self) -> Option<(u64, Option<u64>)> {
        let k = self.0.random_range(0..KEYS);
        let v = self.0.random_range(1..u64::MAX / 2);
        Some((k, (self.0.random_range(0..10) != 0).then_some(v)))
    }
}

#[test]
fn kill_9_at_random_moments_loses_no_acknowledged_write() {
    if let Ok(dir) = std::env::var(CHILD) {
        child(Path::new(&dir), common::env_num("SHOAL_CRASH_SEED", 1));
        return;
    }
    let rounds: usize = common::env_num("SHOAL_CRASH_ROUNDS", 20);
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xC0FFEE);
    // what the store must hold: key -> Some(version) / None (deleted), acknowledged writes only
    let mut acked: HashMap<u64, Option<u64>> = HashMap::new();
    let mut total_acks = 0u64;
    for round in 0..rounds {
        let ch = common::respawn(
            "kill_9_at_random_moments_loses_no_acknowledged_write",
            &[
                (CHILD, dir.path().display().to_string()),
                ("SHOAL_CRASH_SEED", (round as u64 + 1).to_string()),
            ],
        );
        let kill_after = Duration::from_millis(rng.random_range(50..1200));
        let lines = common::kill_after(ch, kill_after, round);
        // pipe lines after "ready" are acknowledged (printed after commit returned)
        let mut ready = false;
        for l in &lines {
            let p: Vec<&str> = l.split_whitespace().collect();
            match p.as_slice() {
                ["ready"] => ready = true,
                ["put", k, v] => {
                    acked.insert(k.parse().unwrap(), Some(v.parse().unwrap()));
                    total_acks += 1;
                }
                ["del", k] => {
                    acked.insert(k.parse().unwrap(), None);
                    total_acks += 1;
                }
                _ => {} // a line cut by the kill
            }
        }
        let _ = ready;
        let n_acked = lines
            .iter()
            .filter(|l| l.starts_with("put ") || l.starts_with("del "))
            .filter(|l| l.split_whitespace().count() == if l.starts_with("put") { 3 } else { 2 })
            .count();
        // the one write that may or may not have made it: the first one not acknowledged
        let in_flight = Ops::new(round as u64 + 1).nth(n_acked);
        // reopen: recovery, then check every key
        let e = Engine::open(config(dir.path()))
            .unwrap_or_else(|err| panic!("round {round}: reopening after kill -9 failed: {err}"));
        let w = e.worker();
        let t = match BTree::open(&w, "crash") {
            Ok(t) => t,
            Err(err) => {
                assert!(
                    acked.is_empty(),
                    "round {round}: the tree is gone after {total_acks} acknowledged writes: {err}"
                );
                continue;
            }
        };
        t.verify(&w).unwrap_or_else(|err| {
            panic!("round {round}: the tree is broken after recovery: {err}")
        });
        let mut buf = Vec::new();
        for k in 0..KEYS {
            let found = t.lookup(&w, u64_key(k), &mut buf).unwrap();
            let want = acked.get(&k).copied().flatten();
            let got = found.then(|| LittleEndian::read_u64(&buf));
            if let Some((fk, fv)) = in_flight {
                if fk == k && got == fv && got != want {
                    // the in-flight write made it (durable though not acknowledged)
                    if let Some(v) = fv {
                        assert_eq!(
                            buf,
                            value(k, v),
                            "round {round}: key {k} holds a torn value"
                        );
                    }
                    acked.insert(k, got);
                    continue;
                }
            }
            match (found, want) {
                (true, Some(v)) => {
                    assert_eq!(got, Some(v), "round {round}: key {k} holds another version than the acknowledged one");
                    assert_eq!(buf, value(k, v), "round {round}: key {k} value differs");
                }
                (false, Some(v)) => {
                    let last_line = lines.iter().rposition(|l| l.split_whitespace().nth(1) == Some(&k.to_string()));
                    panic!(
                        "round {round}: key {k} lost its acknowledged version {v} (this round's line {:?} of {}; replayed {:?})",
                        last_line,
                        lines.len(),
                        e.store().replayed()
                    )
                }
                (true, None) => panic!(
                    "round {round}: key {k} is there (version {got:?}) though its acknowledged state is deleted or never written"
                ),
                (false, None) => {}
            }
        }
        e.close().unwrap();
    }
    eprintln!("{rounds} kills, {total_acks} acknowledged writes, none lost");
}

const DEFAULT_CHILD: &str = "SHOAL_CRASH_DEFAULT_CHILD_DIR";

/// The child of the next test: an engine opened without choosing anything but where and how
/// much cache, transactions committed one after another, each acknowledged once `commit`
/// returned.
fn default_child(dir: &Path) {
    let e = Engine::open(EngineConfig::new(dir, 8 << 20)).expect("open (recovering) in the child");
    let w = e.worker();
    let t = BTree::open_or_create(&w, "default").expect("tree");
    w.commit().expect("commit the tree");
    let mut next = t.count(&w).expect("count");
    let mut out = std::io::stdout().lock();
    loop {
        shoal_btree::transact(&w, |tx| {
            tx.upsert(&t, u64_key(next), value(next, 1))?;
            Ok(())
        })
        .expect("a transaction");
        writeln!(out, "ack {next}").unwrap();
        out.flush().unwrap();
        next += 1;
    }
}

#[test]
fn an_engine_opened_without_choosing_durability_loses_no_commit_to_kill_9() {
    if let Ok(dir) = std::env::var(DEFAULT_CHILD) {
        default_child(Path::new(&dir));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut acked = 0u64;
    for round in 0..3 {
        let ch = common::respawn(
            "an_engine_opened_without_choosing_durability_loses_no_commit_to_kill_9",
            &[(DEFAULT_CHILD, dir.path().display().to_string())],
        );
        for l in common::kill_after(ch, Duration::from_millis(400 + 300 * round), round) {
            if let Some(k) = l.strip_prefix("ack ").and_then(|s| s.parse::<u64>().ok()) {
                acked = acked.max(k + 1);
            }
        }
        let e = Engine::open(EngineConfig::new(dir.path(), 8 << 20))
            .unwrap_or_else(|err| panic!("round {round}: reopening after kill -9: {err}"));
        let w = e.worker();
        let t = BTree::open(&w, "default").expect("the tree survived");
        for k in 0..acked {
            let got = t.get(&w, u64_key(k)).unwrap();
            assert_eq!(
                got,
                Some(value(k, 1)),
                "round {round}: committed key {k} lost"
            );
        }
        drop(w);
        e.close().unwrap();
    }
    assert!(acked > 10, "only {acked} commits in three rounds");
    eprintln!("{acked} acknowledged commits with the default configuration, none lost");
}
