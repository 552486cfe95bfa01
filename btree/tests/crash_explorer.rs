//! The crash-point explorer: one workload runs on the simulated device (`shoal_storage::sim`),
//! which records every change to the store's files; then, for hundreds of points of that
//! record, the files a crash or a power loss there would have left are rebuilt (unsynced writes
//! dropped, kept in part, or torn at sectors; sometimes durable data damaged too), and the
//! store is opened as recovery opens it.
//!
//! The workload, one worker with `durability commit` on a 4 MiB log and a 1 MiB cache (1.4 MB of data) (so
//! checkpoints, the log's wrap, evictions and write-backs all happen): create the store, create
//! two trees and 16 accounts, insert keys in random order (splits), update keys and move money
//! between accounts in transactions, flush (a checkpoint), delete a range of keys (merges),
//! and close. Each step commits; once `commit()` returns, the step is marked acknowledged.
//!
//! After a crash with no damage: the store opens (a store whose creation had not reached its
//! commit point may be absent, if nothing was acknowledged), both trees verify, and the data is
//! the state after some prefix of the steps holding every acknowledged one (nothing acknowledged
//! lost, no step half done: the accounts always sum up). With damage: the store may refuse to
//! open, or report an error reading or verifying, but whatever it returns without an error is
//! such a state too (no silent loss). One case is allowed to lose acknowledged steps, and is
//! counted apart: a write of the log's newest flush that the device put elsewhere leaves its
//! place as it was before, which is exactly what a power loss that cut that flush off leaves
//! (docs/durability.md, "Faults").
//!
//! `SHOAL_CRASH_POINTS` (default 300; scripts/nightly runs 5,000 for each of two seeds),
//! `SHOAL_CRASH_SEED`.
//! A failure prints the seed and point and saves the trace under target/tmp/crash-explorer/;
//! to replay it: `SHOAL_CRASH_REPLAY=<trace> SHOAL_CRASH_SEED=<seed>
//! SHOAL_CRASH_POINTS=<points> SHOAL_CRASH_ONLY=<point>` (the line printed says it whole);
//! `SHOAL_CRASH_KEEP=DIR` rebuilds the crashed files in DIR and stops there.

mod common;

use byteorder::{ByteOrder, LittleEndian};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use shoal_btree::{decode_u64, u64_key, BTree};
use shoal_engine::{Durability, Engine, EngineConfig, OpenMode};
use shoal_storage::sim::{self, Crash, Damage, Event, Trace};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const KEYS: u64 = 2_000;
const ACCOUNTS: u64 = 16;
const START: u64 = 1_000;
const VALUE: usize = 700;

fn config(dir: &Path) -> EngineConfig {
    let mut c = EngineConfig::new(dir, 1 << 20);
    c.durability = Durability::Commit;
    c.wal_bytes = 4 << 20;
    c
}

/// One committed unit of the workload.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Create the trees and the accounts (one transaction).
    Setup,
    Put {
        key: u64,
        version: u64,
    },
    Delete {
        key: u64,
    },
    Transfer {
        from: u64,
        to: u64,
        amount: u64,
    },
}

fn value(key: u64, version: u64) -> Vec<u8> {
    let mut v = vec![(key as u8) ^ (version as u8); VALUE];
    v[..8].copy_from_slice(&key.to_le_bytes());
    v[8..16].copy_from_slice(&version.to_le_bytes());
    v
}

/// The data a prefix of the steps leaves.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct State {
    setup: bool,
    kv: BTreeMap<u64, u64>,
    accounts: Vec<u64>,
}

impl State {
    fn apply(&mut self, s: &Step) {
        match *s {
            Step::Setup => {
                self.setup = true;
                self.accounts = vec![START; ACCOUNTS as usize];
            }
            Step::Put { key, version } => {
                self.kv.insert(key, version);
            }
            Step::Delete { key } => {
                self.kv.remove(&key);
            }
            Step::Transfer { from, to, amount } => {
                self.accounts[from as usize] -= amount;
                self.accounts[to as usize] += amount;
            }
        }
    }
}

/// The steps of the workload, from a seed.
fn plan(seed: u64) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut steps = vec![Step::Setup];
    let mut keys: Vec<u64> = (0..KEYS).collect();
    keys.shuffle(&mut rng);
    let mut version: BTreeMap<u64, u64> = BTreeMap::new();
    for k in keys {
        version.insert(k, 1);
        steps.push(Step::Put { key: k, version: 1 });
    }
    let mut balances = vec![START; ACCOUNTS as usize];
    for _ in 0..1_000 {
        if rng.random_range(0..3) == 0 {
            let (from, to) = (rng.random_range(0..ACCOUNTS), rng.random_range(0..ACCOUNTS));
            let amount = rng.random_range(0..=balances[from as usize].min(50));
            balances[from as usize] -= amount;
            balances[to as usize] += amount;
            steps.push(Step::Transfer { from, to, amount });
        } else {
            // a few hot keys take most updates, as in YCSB-A
            let k = if rng.random_range(0..2) == 0 {
                rng.random_range(0..20)
            } else {
                rng.random_range(0..KEYS)
            };
            let v = version.entry(k).or_insert(0);
            *v += 1;
            steps.push(Step::Put {
                key: k,
                version: *v,
            });
        }
    }
    for k in KEYS / 4..KEYS * 3 / 4 {
        steps.push(Step::Delete { key: k });
    }
    for _ in 0..200 {
        let k = rng.random_range(0..KEYS);
        let v = version.entry(k).or_insert(0);
        *v += 1;
        steps.push(Step::Put {
            key: k,
            version: *v,
        });
    }
    steps
}

/// Marks: `2 * i` before step `i` begins, `2 * i + 1` once it is acknowledged.
fn started(i: usize) -> u64 {
    2 * i as u64
}
fn acked(i: usize) -> u64 {
    2 * i as u64 + 1
}

/// Run the workload in `dir` (empty) on the simulated device.
fn record(dir: &Path, steps: &[Step]) -> Trace {
    sim::start();
    let e = Engine::open(config(dir)).expect("create the store");
    let w = e.worker();
    let mut trees: Option<(BTree, BTree)> = None;
    for (i, s) in steps.iter().enumerate() {
        sim::mark(started(i));
        match *s {
            Step::Setup => {
                let kv = BTree::create(&w, "kv").unwrap();
                let acc = BTree::create(&w, "accounts").unwrap();
                // the accounts in one transaction: all of them or none after a crash (trees
                // without accounts read as "not set up yet")
                shoal_btree::transact(&w, |tx| {
                    for a in 0..ACCOUNTS {
                        tx.upsert(&acc, u64_key(a), START.to_le_bytes())?;
                    }
                    Ok(())
                })
                .unwrap();
                trees = Some((kv, acc));
            }
            Step::Put { key, version } => {
                let (kv, _) = trees.as_ref().unwrap();
                kv.upsert(&w, u64_key(key), value(key, version)).unwrap();
            }
            Step::Delete { key } => {
                let (kv, _) = trees.as_ref().unwrap();
                assert!(kv.remove(&w, u64_key(key)).unwrap());
            }
            Step::Transfer { from, to, amount } => {
                let (_, acc) = trees.as_ref().unwrap();
                shoal_btree::transact(&w, |tx| {
                    for (k, d) in [(from, -(amount as i64)), (to, amount as i64)] {
                        assert!(tx.update(acc, u64_key(k), |v| {
                            let b = LittleEndian::read_u64(v);
                            v[..8].copy_from_slice(&b.wrapping_add_signed(d).to_le_bytes());
                        })?);
                    }
                    Ok(())
                })
                .unwrap();
            }
        }
        w.commit().unwrap();
        sim::mark(acked(i));
        if i == KEYS as usize + 500 {
            e.flush().unwrap(); // a checkpoint the workload asks for
        }
    }
    drop(w);
    e.close().unwrap();
    sim::stop()
}

/// How one crash point came out.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Recovered to the state after `steps` steps.
    Recovered { steps: usize },
    /// No store: its creation had not reached its commit point.
    NoStore,
    /// Damage was found and reported with an error.
    Refused,
    /// A write of the newest flush was sent elsewhere: it recovered to a state that lost
    /// acknowledged steps (the documented limit).
    NewestFlushLost,
}

/// Where the marks stand after the first `upto` events: (steps acknowledged, steps begun).
fn progress(t: &Trace, upto: usize) -> (usize, usize) {
    let (mut done, mut begun) = (0, 0);
    for e in &t.events[..upto] {
        if let Event::Mark { tag } = e {
            let i = (tag / 2) as usize;
            if tag % 2 == 1 {
                done = done.max(i + 1);
            } else {
                begun = begun.max(i + 1);
            }
        }
    }
    (done, begun)
}

/// Whether event `e` is a write of the log's newest synced flush before `upto` (its writes
/// come between the last two syncs of the log).
fn in_newest_flush(t: &Trace, upto: usize, e: usize) -> bool {
    let is_log = |p: &Path| p.to_string_lossy().ends_with(".wal");
    let syncs: Vec<usize> = (0..upto)
        .filter(|&i| matches!(&t.events[i], Event::Sync { path, .. } if is_log(path)))
        .collect();
    match syncs.as_slice() {
        [.., prev, last] => e > *prev && e < *last,
        [last] => e < *last,
        [] => false,
    }
}

/// Open the crashed files in `dir` and judge what they hold. `may_lose`: the damage sent a
/// write of the newest flush elsewhere (see the module's doc): any state that reads without
/// an error is accepted, and counted.
fn judge(
    dir: &Path,
    steps: &[Step],
    lo: usize,
    hi: usize,
    damaged: bool,
    may_lose: bool,
) -> Result<Outcome, String> {
    let mut c = config(dir);
    c.mode = OpenMode::Open;
    let e = match Engine::open(c) {
        Ok(e) => e,
        Err(err) => {
            let no_store = !dir.join("node0-0.dat").exists();
            if no_store && lo == 0 {
                // nothing acknowledged and no store: a new one must be creatable over what
                // the interrupted creation left
                let e = Engine::open(config(dir))
                    .map_err(|e| format!("no store, and none can be created here: {e}"))?;
                e.close().map_err(|e| e.to_string())?;
                return Ok(Outcome::NoStore);
            }
            if damaged {
                return Ok(Outcome::Refused);
            }
            return Err(format!("the store does not open: {err}"));
        }
    };
    let w = e.worker();
    let read = || -> Result<State, String> {
        use shoal_btree::TreeError::NotFound;
        let (kv, acc) = match (BTree::open(&w, "kv"), BTree::open(&w, "accounts")) {
            (Ok(kv), Ok(acc)) => (kv, acc),
            // not created yet (an error reading the catalog is not that)
            (Err(NotFound(_)), Err(NotFound(_))) => return Ok(State::default()),
            (a, b) => return Err(format!("opening the trees: {:?} {:?}", a.err(), b.err())),
        };
        kv.verify(&w)?;
        acc.verify(&w)?;
        // trees made, their accounts' transaction not committed: not set up yet
        if acc
            .get(&w, u64_key(0))
            .map_err(|e| e.to_string())?
            .is_none()
            && kv.iter(&w).next().is_none()
        {
            return Ok(State::default());
        }
        let mut s = State {
            setup: true,
            ..State::default()
        };
        for entry in kv.range::<&[u8]>(&w, ..) {
            let (k, v) = entry.map_err(|e| e.to_string())?;
            let key = decode_u64(&k).ok_or("a key of the wrong size")?;
            let version = u64::from_le_bytes(v[8..16].try_into().map_err(|_| "short value")?);
            if v != value(key, version) {
                return Err(format!("key {key}: a value that was never written"));
            }
            s.kv.insert(key, version);
        }
        for a in 0..ACCOUNTS {
            let v = acc
                .get(&w, u64_key(a))
                .map_err(|e| e.to_string())?
                .ok_or(format!("account {a} missing"))?;
            s.accounts
                .push(u64::from_le_bytes(v[..8].try_into().map_err(|_| "short")?));
        }
        Ok(s)
    };
    let got = match read() {
        Ok(s) => s,
        Err(why) if damaged => {
            drop(w);
            drop(e);
            let _ = why;
            return Ok(Outcome::Refused);
        }
        Err(why) => return Err(why),
    };
    drop(w);
    drop(e);
    // the state after some prefix of the steps from `lo` to `hi`
    let mut want = State::default();
    for s in &steps[..lo] {
        want.apply(s);
    }
    for j in lo..=hi.min(steps.len()) {
        if j > lo {
            want.apply(&steps[j - 1]);
        }
        if want == got {
            return Ok(Outcome::Recovered { steps: j });
        }
    }
    if may_lose {
        return Ok(Outcome::NewestFlushLost);
    }
    let mut diff = Vec::new();
    let mut w = State::default();
    for s in &steps[..lo] {
        w.apply(s);
    }
    for (k, v) in &w.kv {
        if got.kv.get(k) != Some(v) {
            diff.push(format!("key {k}: want v{v}, got {:?}", got.kv.get(k)));
        }
    }
    if w.accounts != got.accounts {
        diff.push(format!(
            "accounts: want {:?} got {:?}",
            w.accounts, got.accounts
        ));
    }
    diff.truncate(8);
    Err(format!(
        "the data is no state between step {lo} (acknowledged) and {hi} (begun): {}",
        diff.join("; ")
    ))
}

/// What to do at point number `n` (of all points explored): the crash, and damage for one in
/// four.
fn fault_of(n: usize, rng: &mut StdRng) -> (Crash, Damage) {
    let crash = [
        Crash::DropUnsynced,
        Crash::KeepPrefix,
        Crash::KeepSome,
        Crash::Tear,
    ][n % 4];
    let damage = if n % 4 != 3 {
        Damage::None
    } else {
        match rng.random_range(0..6) {
            0 => Damage::FlipBit { suffix: ".wal" },
            1 => Damage::FlipBit { suffix: ".dat" },
            2 => Damage::FlipBit {
                suffix: ".wal.alloc0",
            },
            3 => Damage::Zero { suffix: ".wal" },
            4 => Damage::Zero { suffix: ".dat" },
            _ => Damage::Misdirect { suffix: ".wal" },
        }
    };
    (crash, damage)
}

#[test]
fn no_crash_point_loses_an_acknowledged_commit_or_leaves_a_store_unopenable() {
    let points: usize = common::env_num("SHOAL_CRASH_POINTS", 300);
    let seed: u64 = common::env_num("SHOAL_CRASH_SEED", 0x5eed);
    let only: Option<usize> = std::env::var("SHOAL_CRASH_ONLY")
        .ok()
        .and_then(|s| s.parse().ok());
    let steps = plan(seed);
    let run = tempfile::tempdir().unwrap();
    let run_dir = run.path().join("store");
    std::fs::create_dir(&run_dir).unwrap();
    let (trace, run_dir) = match std::env::var_os("SHOAL_CRASH_REPLAY") {
        Some(p) => {
            // the trace's own directory is the one its paths name
            let t = Trace::load(Path::new(&p)).unwrap();
            let dir = t
                .events
                .iter()
                .find_map(|e| match e {
                    Event::Create { path } => path.parent().map(Path::to_path_buf),
                    _ => None,
                })
                .unwrap();
            (t, dir)
        }
        None => (record(&run_dir, &steps), run_dir),
    };
    let n = trace.len();
    let mut rng = StdRng::seed_from_u64(seed);
    // every event of the store's creation (up to the first mark), every Nth event, then
    // random ones
    let created = trace
        .events
        .iter()
        .position(|e| matches!(e, Event::Mark { .. }))
        .unwrap_or(0);
    let mut at: Vec<usize> = (0..=created).collect();
    let rest = points.saturating_sub(at.len());
    at.extend((1..=rest / 2).map(|i| i * n / (rest / 2 + 1)));
    at.extend((0..rest - rest / 2).map(|_| rng.random_range(1..=n)));
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for (k, &upto) in at.iter().enumerate() {
        let (crash, damage) = fault_of(k, &mut rng);
        if only.is_some_and(|o| o != k) {
            continue;
        }
        let point_seed = seed ^ (k as u64) << 20;
        let tmp = tempfile::tempdir().unwrap();
        // SHOAL_CRASH_KEEP=DIR: rebuild the crashed files there and stop (to look at them)
        let dir = match std::env::var_os("SHOAL_CRASH_KEEP") {
            Some(p) => {
                let p = PathBuf::from(p);
                let _ = std::fs::remove_dir_all(&p);
                std::fs::create_dir_all(&p).unwrap();
                p
            }
            None => tmp.path().to_path_buf(),
        };
        let m = trace
            .materialize(upto, crash, damage, point_seed, &run_dir, &dir)
            .unwrap();
        let (lo, begun) = progress(&trace, upto);
        if std::env::var_os("SHOAL_CRASH_KEEP").is_some() {
            eprintln!(
                "point {k} (event {upto}, {crash:?}/{damage:?}, {m:?}): rebuilt in {}; {lo} \
                 steps acknowledged, {begun} begun",
                dir.display()
            );
            continue;
        }
        // a write of the newest flush sent elsewhere (see the module's doc)
        let may_lose = m
            .misdirected
            .is_some_and(|e| in_newest_flush(&trace, upto, e));
        let result = judge(&dir, &steps, lo, begun, damage != Damage::None, may_lose);
        let kind = format!("{crash:?}/{damage:?}");
        match result {
            Ok(o) => {
                let name = match o {
                    Outcome::Recovered { .. } => "recovered",
                    Outcome::NoStore => "no store yet",
                    Outcome::Refused => "damage reported",
                    Outcome::NewestFlushLost => "newest flush misdirected, lost",
                };
                *counts.entry(name.to_string()).or_default() += 1;
            }
            Err(why) => {
                let keep = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                    .join("crash-explorer")
                    .join(format!("seed-{seed}-point-{k}"));
                let _ = std::fs::remove_dir_all(&keep);
                let _ = std::fs::create_dir_all(&keep);
                let saved = keep.join("trace");
                let _ = trace.save(&saved);
                failures.push(format!(
                    "point {k} (event {upto} of {n}, {kind}, {m:?}): {why}\n  replay: \
                     SHOAL_CRASH_REPLAY={} SHOAL_CRASH_SEED={seed} SHOAL_CRASH_POINTS={points} \
                     SHOAL_CRASH_ONLY={k} cargo test -p shoal-btree --test crash_explorer",
                    saved.display()
                ));
            }
        }
    }
    eprintln!(
        "crash explorer: {} points over {n} events (seed {seed:#x}): {counts:?}, {} failed",
        at.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} crash points failed:\n{}",
        failures.len(),
        at.len(),
        failures.join("\n")
    );
    if only.is_none() {
        assert!(
            counts.get("recovered").copied().unwrap_or(0) > at.len() / 2,
            "most points recover: {counts:?}"
        );
    }
}
