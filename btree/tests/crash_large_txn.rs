//! kill -9 during commits of large transactions leaves each of them whole or absent: a child
//! process (this test binary run again) commits, one after another, transactions that insert
//! a batch of 200 to 700 rows of 100 bytes at the end of a tree (all into one gap of the
//! last leaf: the commit splits leaves at its own keys, then latches tens of them) or rewrite
//! every row of an earlier batch with a new version, each with a record of the batch's size
//! and version; each is acknowledged on stdout once durable. The parent kills it with SIGKILL
//! at a random moment, reopens the store (recovery replays the log) and checks: every
//! acknowledged batch is there, every recorded batch has exactly its rows, each of them at the
//! recorded version, and no row belongs to a batch without a record. Small cache and log, so
//! the rounds cross evictions, checkpoints and the log's wrap.
//!
//! Rounds: `SHOAL_CRASH_LARGE_TXN_ROUNDS` (default 6; `scripts/nightly` runs 60).

mod common;

use rand::{Rng, SeedableRng};
use shoal_btree::{decode_u64, u64_key, BTree, Direction, Transaction, TxError};
use shoal_engine::{CommitPoint, Durability, Engine, EngineConfig};
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

const CHILD: &str = "SHOAL_CRASH_LARGE_TXN_CHILD_DIR";

fn config(dir: &Path) -> EngineConfig {
    let mut c = EngineConfig::new(dir, 8 << 20);
    c.durability = Durability::Commit;
    c.wal_bytes = 16 << 20;
    c
}

/// A row's key: its batch, then its number in the batch.
fn row_key(batch: u64, i: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&u64_key(batch));
    k[8..].copy_from_slice(&u64_key(i));
    k
}

/// A row's value: its batch's version, then padding.
fn row(version: u64) -> [u8; 100] {
    let mut v = [0xAB; 100];
    v[..8].copy_from_slice(&version.to_le_bytes());
    v
}

/// A batch's record: its rows and their version.
fn record(rows: u64, version: u64) -> [u8; 16] {
    let mut r = [0u8; 16];
    r[..8].copy_from_slice(&rows.to_le_bytes());
    r[8..].copy_from_slice(&version.to_le_bytes());
    r
}

fn read_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

/// The child: commit large transactions until killed, acknowledging each durable one as
/// `ack BATCH VERSION`.
fn child(dir: &Path, seed: u64) {
    let e = Engine::open(config(dir)).expect("open (recovering)");
    let w = e.worker();
    let rows = BTree::open_or_create(&w, "rows").expect("rows");
    let batches = BTree::open_or_create(&w, "batches").expect("batches");
    w.commit().expect("commit the set-up");
    let mut known: Vec<(u64, u64, u64)> = Vec::new(); // (batch, rows, version)
    batches
        .scan(&w, &[], Direction::Ascending, |k, v| {
            known.push((decode_u64(k).unwrap(), read_u64(v), read_u64(&v[8..])));
            true
        })
        .unwrap();
    let mut next = known.last().map_or(0, |b| b.0 + 1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut pending: VecDeque<(CommitPoint, u64, u64)> = VecDeque::new();
    let mut out = std::io::stdout();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    loop {
        let rewrite = !known.is_empty() && rng.random_range(0..2) == 0;
        let (batch, n, version) = if rewrite {
            let (b, n, v) = known[rng.random_range(0..known.len())];
            (b, n, v + 1)
        } else {
            (next, rng.random_range(200..700u64), 0)
        };
        let mut tx = Transaction::begin(&w);
        let built = (|| -> Result<(), TxError> {
            for i in 0..n {
                if rewrite {
                    assert!(tx.update(&rows, row_key(batch, i), |v| {
                        v[..8].copy_from_slice(&version.to_le_bytes())
                    })?);
                } else {
                    assert!(tx
                        .insert(&rows, row_key(batch, i), row(version))?
                        .inserted());
                }
            }
            tx.upsert(&batches, u64_key(batch), record(n, version))
        })();
        built.unwrap_or_else(|e| panic!("batch {batch}: {e}"));
        let point = tx
            .commit_later()
            .unwrap_or_else(|e| panic!("batch {batch}: {e}"));
        if rewrite {
            let k = known.iter_mut().find(|b| b.0 == batch).unwrap();
            k.2 = version;
        } else {
            known.push((batch, n, version));
            next += 1;
        }
        pending.push_back((point, batch, version));
        while let Some(&(p, b, v)) = pending.front() {
            if !w.is_durable(p).unwrap() {
                break;
            }
            writeln!(out, "ack {b} {v}").unwrap();
            pending.pop_front();
        }
        out.flush().unwrap();
    }
}

/// After a kill: every acknowledged batch at its acknowledged version or later, every recorded
/// batch whole at its recorded version, no row without a record.
fn check_after_kill(dir: &Path, acked: &HashMap<u64, u64>, round: usize) -> Result<usize, String> {
    let e = Engine::open(config(dir)).expect("open (recovering)");
    let w = e.worker();
    let (Ok(rows), Ok(batches)) = (BTree::open(&w, "rows"), BTree::open(&w, "batches")) else {
        return if acked.is_empty() {
            Ok(0)
        } else {
            Err(format!("round {round}: trees gone after acknowledgements"))
        };
    };
    rows.verify(&w).map_err(|e| format!("round {round}: {e}"))?;
    batches
        .verify(&w)
        .map_err(|e| format!("round {round}: {e}"))?;
    let mut recorded: HashMap<u64, (u64, u64)> = HashMap::new();
    batches
        .scan(&w, &[], Direction::Ascending, |k, v| {
            recorded.insert(decode_u64(k).unwrap(), (read_u64(v), read_u64(&v[8..])));
            true
        })
        .unwrap();
    let mut found: HashMap<u64, (u64, Vec<u64>)> = HashMap::new(); // rows, versions seen
    rows.scan(&w, &[], Direction::Ascending, |k, v| {
        let f = found.entry(decode_u64(&k[..8]).unwrap()).or_default();
        f.0 += 1;
        let version = read_u64(v);
        if !f.1.contains(&version) {
            f.1.push(version);
        }
        true
    })
    .unwrap();
    let result = (|| {
        for (b, v) in acked {
            match recorded.get(b) {
                Some(&(_, have)) if have >= *v => {}
                other => {
                    return Err(format!(
                        "round {round}: batch {b} was acknowledged at version {v}, the store \
                         records {other:?}"
                    ))
                }
            }
        }
        for (b, &(n, v)) in &recorded {
            match found.get(b) {
                Some((rows, versions)) if *rows == n && versions == &[v] => {}
                other => {
                    return Err(format!(
                        "round {round}: batch {b} is recorded with {n} rows at version {v}, the \
                         store holds (rows, versions) {other:?}: half a transaction"
                    ))
                }
            }
        }
        if let Some(b) = found.keys().find(|b| !recorded.contains_key(b)) {
            return Err(format!(
                "round {round}: rows of batch {b} without its record: half a transaction"
            ));
        }
        Ok(recorded.len())
    })();
    drop(w);
    e.close().unwrap();
    result
}

#[test]
fn kill_9_during_large_commits_leaves_each_whole_or_absent() {
    let test = "kill_9_during_large_commits_leaves_each_whole_or_absent";
    if let Ok(dir) = std::env::var(CHILD) {
        child(Path::new(&dir), common::env_num("SHOAL_CRASH_SEED", 1));
        return;
    }
    let rounds = common::env_num("SHOAL_CRASH_LARGE_TXN_ROUNDS", 6);
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x1A26E);
    let mut acked: HashMap<u64, u64> = HashMap::new();
    let mut batches = 0;
    for round in 0..rounds {
        let env = vec![
            (CHILD, dir.path().display().to_string()),
            ("SHOAL_CRASH_SEED", (round as u64 + 1).to_string()),
        ];
        let ch = common::respawn(test, &env);
        let kill_after = Duration::from_millis(rng.random_range(200..1500));
        for l in common::kill_after(ch, kill_after, round) {
            let mut it = l
                .strip_prefix("ack ")
                .into_iter()
                .flat_map(|s| s.split(' '));
            if let (Some(Ok(b)), Some(Ok(v))) =
                (it.next().map(str::parse), it.next().map(str::parse))
            {
                let e = acked.entry(b).or_insert(v);
                *e = (*e).max(v);
            }
        }
        batches = check_after_kill(dir.path(), &acked, round).unwrap_or_else(|e| panic!("{e}"));
    }
    eprintln!(
        "{rounds} kills, {} batches acknowledged, {batches} in the store, each whole",
        acked.len()
    );
    assert!(!acked.is_empty(), "some batch was acknowledged");
}
