//! A serializability checker in the manner of Elle (Kingsbury and Alvaro, VLDB 2020), for
//! list-append histories: transactions read keys and append unique elements to the lists the
//! keys hold. Because every element is appended once, the final list of a key orders every
//! committed append to it, and a read that saw a list of length `n` saw exactly the first `n`
//! of them. From that the checker builds the dependency graph of the committed transactions:
//!
//! - **ww**: the transaction that appended element `i` of a key -> the one that appended
//!   element `i + 1`;
//! - **wr**: the one that appended the last element a read saw -> the reader;
//! - **rw** (anti-dependency): a reader that saw `n` elements -> the one that appended element
//!   `n` (it came after what the reader saw).
//!
//! A history is serializable only if that graph has no cycle. Besides cycles the checker
//! reports what breaks the model directly: a read that is not a prefix of its key's final list
//! (a value nobody committed, or an order that changed), and a committed append missing from
//! the final list or present twice (a lost or duplicated write).
#![allow(dead_code)] // each test binary uses its part

use shoal_btree::{backoff_after_conflict, u64_key, BTree, Transaction, TxError};
use shoal_engine::Worker;
use std::collections::HashMap;

/// One operation of a transaction.
#[derive(Debug, Clone)]
pub enum Op {
    /// Read `key`: the list it held (filled in when the transaction ran).
    Read { key: u64, saw: Vec<u32> },
    /// Append the unique `element` to `key`'s list.
    Append { key: u64, element: u32 },
}

/// A committed transaction.
#[derive(Debug, Clone)]
pub struct Committed {
    pub ops: Vec<Op>,
}

fn list(v: &[u8]) -> Vec<u32> {
    v.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect()
}

/// Run `ops` as one transaction until it commits; the reads it saw are filled in. Returns how
/// many tries conflicted.
pub fn run(w: &Worker, tree: &BTree, ops: &mut [Op]) -> Result<u32, TxError> {
    run_paused(w, tree, ops, None)
}

/// [`run`], sleeping for `pause` (if any) after the transaction's first operation, so that
/// other threads commit in between: the interleavings isolation must handle then come in
/// nearly every transaction, not only when the scheduler preempts a thread inside one.
pub fn run_paused(
    w: &Worker,
    tree: &BTree,
    ops: &mut [Op],
    pause: Option<std::time::Duration>,
) -> Result<u32, TxError> {
    let mut conflicts = 0;
    loop {
        let mut tx = Transaction::begin(w);
        let r = (|| -> Result<(), TxError> {
            for (i, op) in ops.iter_mut().enumerate() {
                if let (1, Some(p)) = (i, pause) {
                    std::thread::sleep(p);
                }
                match op {
                    Op::Read { key, saw } => {
                        *saw = tx
                            .get(tree, u64_key(*key))?
                            .map_or_else(Vec::new, |v| list(&v));
                    }
                    Op::Append { key, element } => {
                        let mut v = tx.get(tree, u64_key(*key))?.unwrap_or_default();
                        v.extend_from_slice(&element.to_le_bytes());
                        tx.upsert(tree, u64_key(*key), v)?;
                    }
                }
            }
            Ok(())
        })();
        match r.and_then(|()| tx.commit()) {
            Ok(()) => return Ok(conflicts),
            Err(TxError::Conflict) => {
                conflicts += 1;
                backoff_after_conflict(conflicts);
            }
            Err(e) => return Err(e),
        }
    }
}

/// The keys the transactions touch: few, so that they conflict.
pub const KEYS: u64 = 24;

/// Transactions per thread: `SHOAL_ELLE_TXNS`, else 1500.
pub fn txns_per_thread() -> u32 {
    std::env::var("SHOAL_ELLE_TXNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1500)
}

/// Each worker runs `n` random transactions; returns the committed histories.
pub fn run_all(workers: Vec<Worker>, tree: BTree, n: u32) -> Vec<Committed> {
    run_all_paused(workers, tree, n, None)
}

/// [`run_all`], each transaction pausing as [`run_paused`] says.
pub fn run_all_paused(
    workers: Vec<Worker>,
    tree: BTree,
    n: u32,
    pause: Option<std::time::Duration>,
) -> Vec<Committed> {
    std::thread::scope(|s| {
        let handles: Vec<_> = workers
            .into_iter()
            .enumerate()
            .map(|(t, w)| {
                let tree = &tree;
                s.spawn(move || {
                    let mut x = 0x2545_F491_4F6C_DD1Du64.wrapping_mul(t as u64 + 1);
                    let mut next = || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    let mut done = Vec::new();
                    let mut conflicts = 0;
                    for i in 0..n {
                        let len = 1 + next() % 4;
                        let mut ops: Vec<Op> = (0..len)
                            .map(|j| {
                                let key = next() % KEYS;
                                if next() % 2 == 0 {
                                    Op::Read {
                                        key,
                                        saw: Vec::new(),
                                    }
                                } else {
                                    let element = (t as u32) << 24 | i << 2 | j as u32;
                                    Op::Append { key, element }
                                }
                            })
                            .collect();
                        conflicts +=
                            run_paused(&w, tree, &mut ops, pause).expect("a transaction failed");
                        done.push(Committed { ops });
                    }
                    eprintln!("thread {t}: {n} committed after {conflicts} conflicts");
                    done
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a thread panicked"))
            .collect()
    })
}

/// The final list of every key.
pub fn finals(w: &Worker, tree: &BTree) -> HashMap<u64, Vec<u32>> {
    (0..KEYS)
        .filter_map(|k| {
            let v = tree.get(w, u64_key(k)).expect("read a final list")?;
            let l = v
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect();
            Some((k, l))
        })
        .collect()
}

/// What the checker found wrong (empty: serializable).
pub fn check(history: &[Committed], finals: &HashMap<u64, Vec<u32>>) -> Vec<String> {
    let mut bad = Vec::new();
    // who appended each element, and where it stands in its key's final list
    let mut writer: HashMap<u32, usize> = HashMap::new();
    for (t, c) in history.iter().enumerate() {
        for op in &c.ops {
            if let Op::Append { element, .. } = op {
                if writer.insert(*element, t).is_some() {
                    bad.push(format!("element {element} appended twice"));
                }
            }
        }
    }
    let mut position: HashMap<u32, (u64, usize)> = HashMap::new();
    for (&key, l) in finals {
        for (i, &e) in l.iter().enumerate() {
            if position.insert(e, (key, i)).is_some() {
                bad.push(format!("key {key}: element {e} is in the list twice"));
            }
            if !writer.contains_key(&e) {
                bad.push(format!("key {key}: element {e} was never committed"));
            }
        }
    }
    for (&e, &t) in &writer {
        if !position.contains_key(&e) {
            bad.push(format!(
                "element {e} of transaction {t} was committed and is lost"
            ));
        }
    }
    // the dependency graph
    let n = history.len();
    let mut edges: Vec<Vec<(usize, &'static str)>> = vec![Vec::new(); n];
    for l in finals.values() {
        for pair in l.windows(2) {
            if let (Some(&a), Some(&b)) = (writer.get(&pair[0]), writer.get(&pair[1])) {
                if a != b {
                    edges[a].push((b, "ww"));
                }
            }
        }
    }
    for (t, c) in history.iter().enumerate() {
        for op in &c.ops {
            let Op::Read { key, saw } = op else { continue };
            let fin = finals.get(key).map_or(&[][..], |l| &l[..]);
            if saw.len() > fin.len() || saw[..] != fin[..saw.len()] {
                bad.push(format!(
                    "transaction {t} read key {key} as {saw:?}, not a prefix of its final list \
                     ({} elements)",
                    fin.len()
                ));
                continue;
            }
            if let Some(&last) = saw.last() {
                if let Some(&w) = writer.get(&last) {
                    if w != t {
                        edges[w].push((t, "wr"));
                    }
                }
            }
            if let Some(next) = fin.get(saw.len()) {
                if let Some(&w) = writer.get(next) {
                    if w != t {
                        edges[t].push((w, "rw"));
                    }
                }
            }
        }
    }
    if let Some(cycle) = find_cycle(&edges) {
        let text: Vec<String> = cycle
            .windows(2)
            .map(|p| {
                let kind = edges[p[0]]
                    .iter()
                    .find(|(b, _)| *b == p[1])
                    .map_or("?", |(_, k)| *k);
                format!("T{} -{kind}-> T{}", p[0], p[1])
            })
            .collect();
        bad.push(format!("a dependency cycle: {}", text.join(", ")));
    }
    bad
}

/// A cycle of the graph, if any (as a path whose last node is its first).
fn find_cycle(edges: &[Vec<(usize, &'static str)>]) -> Option<Vec<usize>> {
    // iterative depth-first search: 0 unseen, 1 on the stack, 2 done
    let n = edges.len();
    let mut state = vec![0u8; n];
    let mut parent = vec![usize::MAX; n];
    for root in 0..n {
        if state[root] != 0 {
            continue;
        }
        let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
        state[root] = 1;
        while let Some(&mut (v, ref mut i)) = stack.last_mut() {
            if let Some(&(u, _)) = edges[v].get(*i) {
                *i += 1;
                match state[u] {
                    0 => {
                        state[u] = 1;
                        parent[u] = v;
                        stack.push((u, 0));
                    }
                    1 => {
                        // back edge v -> u: the cycle is u .. v on the stack, then u again
                        let mut cycle = vec![v];
                        while *cycle.last().expect("starts with v") != u {
                            cycle.push(parent[*cycle.last().expect("not empty")]);
                        }
                        cycle.reverse();
                        cycle.push(u);
                        return Some(cycle);
                    }
                    _ => {}
                }
            } else {
                state[v] = 2;
                stack.pop();
            }
        }
    }
    None
}
