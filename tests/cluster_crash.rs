//! Durability on a cluster (docs/durability.md, "Clusters"): kill -9 of a process running a
//! 3-node cluster loses no acknowledged change, wherever the page's home and whichever node
//! changed it last.
//!
//! A child process (this test binary run again) opens a 3-node `Cluster` over `mem` with
//! `durability = commit`, small caches (pages move between nodes and are evicted to their
//! homes all the time) and a small log (checkpoints, with their log fences, all the time).
//! Two workers per node increment counters on random pages of every home: worker `g` owns
//! word `g` of every page, and prints its running total after each `Worker::commit`
//! returned. The parent kills the child with SIGKILL at a random moment (during the run, or
//! during the next start's recovery), and the next child reports what recovery gave back:
//! each worker's total must be its last acknowledged one, or one more (the increment in
//! flight at the kill). The last round is checked by the parent itself, which then closes the
//! cluster cleanly and opens it once more.
//!
//! Rounds: `SHOAL_CLUSTER_CRASH_ROUNDS` (default 6; docs/BENCHMARKS.md reports longer runs).
//!
//! Beside it: a crashed node's store is not recovered alone, a node closed after a peer died
//! stays unclean, a node whose peer died fails its changes with the checkpoint's cause once
//! its log is nearly full, and (asked to) checkpoints past it instead, carrying its records of
//! the pages it had handed it.

use rand::{Rng, SeedableRng};
use shoal_engine::{Cluster, Durability, Pid, Worker};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHILD: &str = "SHOAL_CLUSTER_CRASH_CHILD_DIR";
const NODES: usize = 3;
const WORKERS_PER_NODE: usize = 2;
const WORKERS: usize = NODES * WORKERS_PER_NODE;
const PAGES_PER_NODE: usize = 400;

fn env_num<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The test cluster, with checkpoints past a dead peer (the default).
fn open(dir: &Path) -> Cluster {
    open_with(dir, true)
}

/// As [`open`]; `past_dead`: `EngineConfig::checkpoint_past_dead_peers`.
fn open_with(dir: &Path, past_dead: bool) -> Cluster {
    Cluster::builder(NODES, dir)
        .cache_bytes(1 << 20) // 256 frames a node: evictions all the time
        .remote_timeout(Duration::from_secs(20))
        .configure(move |_, c| {
            c.durability = Durability::Commit;
            c.wal_bytes = 2 << 20; // a checkpoint every MiB of log
            c.free_target_percent = 10;
            c.checkpoint_past_dead_peers = past_dead;
        })
        .mem()
        .expect("the cluster opens (recovering)")
}

/// Where the pages are listed (written once, after they are durable).
fn pid_file(dir: &Path) -> PathBuf {
    dir.join("pids")
}

/// The counter pages: made (and their list written) on the first start.
fn pages(c: &Cluster, dir: &Path) -> Vec<Pid> {
    if let Ok(s) = std::fs::read_to_string(pid_file(dir)) {
        return s
            .split_whitespace()
            .map(|p| Pid(p.parse().unwrap()))
            .collect();
    }
    let mut pids = Vec::new();
    for n in 0..NODES {
        let w = c.node(n).worker();
        for _ in 0..PAGES_PER_NODE {
            pids.push(w.allocate().expect("allocate").pid());
        }
        w.commit().expect("the new pages are durable");
    }
    let text: Vec<String> = pids.iter().map(|p| p.raw().to_string()).collect();
    let tmp = dir.join("pids.tmp");
    std::fs::write(&tmp, text.join(" ")).unwrap();
    std::fs::File::open(&tmp).unwrap().sync_all().unwrap();
    std::fs::rename(&tmp, pid_file(dir)).unwrap();
    pids
}

/// Every worker's total: the sum of its word over every page.
fn totals(w: &Worker, pids: &[Pid]) -> Vec<u64> {
    let mut t = vec![0u64; WORKERS];
    for &p in pids {
        let g = w.run(|w| w.shared(p)).expect("read a counter page");
        for (i, t) in t.iter_mut().enumerate() {
            *t += g.page().u64(i * 8);
        }
    }
    t
}

/// The child: report the totals recovery gave back, then increment until killed.
fn child(dir: &Path, seed: u64) {
    let c = open(dir);
    let pids = pages(&c, dir);
    let start = totals(&c.node(0).worker(), &pids);
    let out = std::sync::Mutex::new(std::io::stdout());
    {
        let mut o = out.lock().unwrap();
        let t: Vec<String> = start.iter().map(|t| t.to_string()).collect();
        writeln!(o, "start {}", t.join(" ")).unwrap();
        o.flush().unwrap();
    }
    std::thread::scope(|s| {
        // what the run exercises: checkpoints (with their log fences), pages leaving only
        // once durable, pages logged whole on arrival, evictions
        s.spawn(|| loop {
            std::thread::sleep(Duration::from_millis(100));
            let (mut cp, mut sent, mut arrived, mut ev, mut pages, mut again) = (0, 0, 0, 0, 0, 0);
            for e in c.nodes() {
                let st = e.stats();
                let p = e.protocol_stats();
                cp += st.log.checkpoints;
                ev += st.evictions;
                // a page whose changes were not durable yet waited for them: held for the log
                // writer, or (rarely) flushed by the sender
                sent += p.flushes_before_send + p.held_for_log;
                arrived += p.logged_on_arrival;
                pages += p.pages;
                again += p.relogged_after_checkpoint;
            }
            let mut o = out.lock().unwrap();
            writeln!(o, "stats {cp} {sent} {arrived} {ev} {pages} {again}").unwrap();
            o.flush().unwrap();
        });
        for g in 0..WORKERS {
            let (c, pids, out, start) = (&c, &pids, &out, &start);
            s.spawn(move || {
                let w = c.node(g / WORKERS_PER_NODE).worker();
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 100 + g as u64);
                let mut total = start[g];
                loop {
                    let p = pids[rng.random_range(0..pids.len())];
                    {
                        let mut x = w.run(|w| w.exclusive(p)).expect("latch a counter page");
                        let v = x.page().u64(g * 8);
                        x.page_mut().set_u64(g * 8, v + 1);
                    }
                    w.commit().expect("commit");
                    total += 1;
                    let mut o = out.lock().unwrap();
                    writeln!(o, "ack {g} {total}").unwrap();
                    o.flush().unwrap();
                }
            });
        }
    });
}

fn respawn(dir: &Path, seed: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "kill_9_of_a_cluster_loses_no_acknowledged_change",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, dir)
        .env("SHOAL_CLUSTER_CRASH_SEED", seed.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Let the child run `after`, then SIGKILL it; its output lines.
fn kill_after(mut ch: Child, after: Duration) -> Vec<String> {
    let stdout = ch.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let t0 = Instant::now();
    while t0.elapsed() < after {
        if let Some(st) = ch.try_wait().unwrap() {
            panic!("the child ended by itself ({st})");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    ch.kill().unwrap();
    let _ = ch.wait();
    reader.join().unwrap()
}

/// Recovered totals against what was acknowledged: each is the last acknowledged total or one
/// more (the increment in flight).
fn check(round: usize, got: &[u64], acked: &[u64]) {
    for g in 0..WORKERS {
        assert!(
            got[g] == acked[g] || got[g] == acked[g] + 1,
            "round {round}: worker {g}'s total after recovery is {}, its last acknowledged total {} (totals {got:?}, acknowledged {acked:?})",
            got[g],
            acked[g]
        );
    }
}

#[test]
fn kill_9_of_a_cluster_loses_no_acknowledged_change() {
    if let Ok(dir) = std::env::var(CHILD) {
        child(Path::new(&dir), env_num("SHOAL_CLUSTER_CRASH_SEED", 1));
        return;
    }
    let rounds: usize = env_num("SHOAL_CLUSTER_CRASH_ROUNDS", 6);
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xC1057E);
    let mut acked = vec![0u64; WORKERS];
    let (mut started, mut acks) = (0, 0u64);
    // (checkpoints, waits before a page left, pages logged on arrival, evictions, pages
    // sent, pages logged again after a checkpoint), summed over the rounds from each round's
    // last report
    let mut seen = [0u64; 6];
    for round in 0..rounds {
        // the first round creates the cluster; later ones may be killed during recovery
        let after = Duration::from_millis(if round == 0 {
            2500
        } else {
            rng.random_range(150..2500)
        });
        let lines = kill_after(respawn(dir.path(), round as u64 + 1), after);
        let last = lines.iter().rev().find(|l| l.starts_with("stats "));
        if let Some(l) = last {
            for (s, x) in seen.iter_mut().zip(l.split_whitespace().skip(1)) {
                *s += x.parse::<u64>().unwrap();
            }
        }
        for l in &lines {
            let l = match l.find("start ") {
                Some(i) => &l[i..],
                None => l.as_str(),
            };
            let mut f = l.split_whitespace();
            match f.next() {
                Some("start") => {
                    let got: Vec<u64> = f.map(|x| x.parse().unwrap()).collect();
                    check(round, &got, &acked);
                    acked = got;
                    started += 1;
                }
                Some("ack") => {
                    let g: usize = f.next().unwrap().parse().unwrap();
                    let t: u64 = f.next().unwrap().parse().unwrap();
                    assert!(
                        t > acked[g],
                        "worker {g} acknowledged {t} after {}",
                        acked[g]
                    );
                    acked[g] = t;
                    acks += 1;
                }
                _ => {}
            }
        }
    }
    assert!(
        started >= 2 && acks > 0,
        "the children ran: {started} starts, {acks} acks"
    );
    let [checkpoints, sent, arrived, evictions, pages_sent, again] = seen;
    assert!(
        checkpoints > 0 && sent > 0 && arrived > 0 && evictions > 0,
        "the rounds crossed checkpoints ({checkpoints}), pages waiting for their changes to be durable before they left ({sent}), pages logged on arrival ({arrived}) and evictions ({evictions})"
    );
    // the parent recovers the last round, checks, closes cleanly and opens once more
    let c = open(dir.path());
    let pids = pages(&c, dir.path());
    let got = totals(&c.node(1).worker(), &pids);
    check(rounds, &got, &acked);
    c.close().unwrap();
    drop(c);
    let c = open(dir.path());
    assert_eq!(
        totals(&c.node(2).worker(), &pids),
        got,
        "a clean close keeps every total"
    );
    c.close().unwrap();
    eprintln!(
        "{rounds} kills, {started} recoveries checked, {acks} increments acknowledged; {checkpoints} checkpoints, {pages_sent} pages sent, {sent} waits for a page's changes to be durable before it left, {arrived} pages logged on arrival ({again} again after a checkpoint began), {evictions} evictions"
    );
}

/// A cluster node's store after a crash holds, in its log, changes to other nodes' pages:
/// opened on its own (a single engine, as `shoal recover` does) its recovery must refuse, not
/// replay them into its own slots nor resume the log past them; the cluster then recovers it.
#[test]
fn a_crashed_cluster_nodes_store_is_not_recovered_alone() {
    const ALONE: &str = "SHOAL_CLUSTER_ALONE_CHILD_DIR";
    if let Ok(dir) = std::env::var(ALONE) {
        let c = open(Path::new(&dir));
        let pids = pages(&c, Path::new(&dir));
        let w = c.node(0).worker();
        // node 0 changes pages homed on the other nodes
        for &p in pids.iter().filter(|p| p.node() != 0).take(50) {
            let mut x = w.run(|w| w.exclusive(p)).unwrap();
            let v = x.page().u64(0);
            x.page_mut().set_u64(0, v + 1);
        }
        w.commit().unwrap();
        println!("changed");
        std::io::stdout().flush().unwrap();
        std::thread::sleep(Duration::from_secs(3600));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut ch = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_crashed_cluster_nodes_store_is_not_recovered_alone",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ALONE, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(ch.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("changed") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the child ended early"
        );
    }
    ch.kill().unwrap();
    let _ = ch.wait();
    let mut cfg = shoal_engine::EngineConfig::new(dir.path().join("node0"), 1 << 20);
    cfg.durability = Durability::Commit;
    cfg.wal_bytes = 2 << 20;
    let err = shoal_engine::Engine::open(cfg)
        .err()
        .expect("refused alone");
    assert!(err.to_string().contains("cluster node's log"), "{err}");
    // the cluster recovers it, with every change
    let c = open(dir.path());
    let pids = pages(&c, dir.path());
    let w = c.node(2).worker();
    let changed = pids
        .iter()
        .filter(|p| p.node() != 0)
        .take(50)
        .filter(|&&p| w.run(|w| w.shared(p)).unwrap().page().u64(0) == 1)
        .count();
    assert_eq!(changed, 50);
    c.close().unwrap();
}

/// Node 0 adds 1 to word 0 of each of `pids` and commits; every page goes home (each home
/// logs it on arrival); then node 2 dies.
fn change_send_home_and_kill_node_2(c: &Cluster, pids: &[Pid]) {
    let w = c.node(0).worker();
    for &p in pids {
        let mut x = w.run(|w| w.exclusive(p)).unwrap();
        let v = x.page().u64(0);
        x.page_mut().set_u64(0, v + 1);
    }
    w.commit().unwrap();
    drop(w);
    c.node(0)
        .send_pages_home(Duration::from_secs(20))
        .expect("pages go home");
    c.kill(2);
}

/// A node's last checkpoint drops its log's records of pages it handed to peers, so it may
/// only close cleanly once every peer made its receipt of them durable (an orderly leave). A
/// node closed after a peer died must not claim a clean store: the dead peer may have lost
/// its receipt, and this log is then the only durable copy of the changes.
#[test]
fn a_node_closed_after_a_peer_died_stays_unclean_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let pids = pages(&c, dir.path());
    let others: Vec<Pid> = pids.iter().copied().filter(|p| p.node() != 0).collect();
    change_send_home_and_kill_node_2(&c, &others[..60]);
    let err = c
        .node(0)
        .close()
        .expect_err("a close after a peer died is not clean");
    assert!(err.to_string().contains("unclean"), "{err}");
    drop(c);
    // the next open recovers every node from the logs, with every change
    let c = open(dir.path());
    let w = c.node(1).worker();
    let changed = others
        .iter()
        .take(60)
        .filter(|&&p| w.run(|w| w.shared(p)).unwrap().page().u64(0) == 1)
        .count();
    assert_eq!(changed, 60);
    drop(w);
    c.close().unwrap();
}

/// The carried file beside node `n`'s log (`<log>.carried`), if there is one.
fn carried_file(dir: &Path, n: usize) -> Option<PathBuf> {
    let sub = dir.join(format!("node{n}"));
    std::fs::read_dir(&sub)
        .unwrap_or_else(|e| panic!("{}: {e}", sub.display()))
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".wal.carried"))
}

#[test]
fn a_node_whose_peer_died_fails_changes_with_the_checkpoints_cause_once_its_log_is_nearly_full() {
    // Without checkpoints past a dead peer (`checkpoint_past_dead_peers = false`), no
    // checkpoint can finish while a peer is dead (its log fence goes unanswered), so the log
    // fills. A change that must wait for room then fails at once with why the checkpoint
    // failed, naming the node, instead of waiting 30 s for each change and then blaming the
    // log's size.
    let dir = tempfile::tempdir().unwrap();
    let c = open_with(dir.path(), false);
    let pids = pages(&c, dir.path());
    let mine: Vec<Pid> = pids.iter().copied().filter(|p| p.node() == 0).collect();
    c.kill(2);
    let w = c.node(0).worker();
    let t0 = Instant::now();
    let fill = [0xa5u8; 2048];
    let mut commits = 0u64;
    let err = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(240),
            "hang: {commits} commits and no error"
        );
        let p = mine[commits as usize % mine.len()];
        let r = w
            .run(|w| {
                let mut g = w.exclusive(p)?;
                g.page_mut().write(64 + (commits as usize % 8) * 8, &fill);
                Ok(())
            })
            .and_then(|()| w.commit());
        match r {
            Ok(()) => commits += 1,
            Err(e) => break e,
        }
    };
    let text = err.to_string();
    assert!(
        text.contains("checkpoint failed") && text.contains("node 2"),
        "after {commits} commits: {text}"
    );
    // changes went on while the log had room
    assert!(commits > 10, "failed after only {commits} commits: {text}");
    // and the next change fails the same way (the cause stands while the node is dead)
    let again = w
        .run(|w| w.exclusive(mine[0]).map(drop))
        .expect_err("the log is still nearly full");
    assert!(again.to_string().contains("node 2"), "{again}");
    drop(w);
}

/// A dead peer answers no log fence. With `checkpoint_past_dead_peers` (the default), its
/// survivors' checkpoints go on past it instead of filling the log: each carries its own records of the
/// pages it had handed the dead node into its log's carried file, and the next open recovers
/// every change from the logs and those files.
#[test]
fn a_node_whose_peer_died_checkpoints_past_it_carrying_its_records_of_the_pages_it_handed_it() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let pids = pages(&c, dir.path());
    let mine: Vec<Pid> = pids.iter().copied().filter(|p| p.node() == 0).collect();
    let theirs: Vec<Pid> = pids
        .iter()
        .copied()
        .filter(|p| p.node() == 2)
        .take(60)
        .collect();
    change_send_home_and_kill_node_2(&c, &theirs);
    let w = c.node(0).worker();
    let fill = [0xa5u8; 2048];
    // about 6 MiB of log, three times its size: checkpoints must finish without node 2
    for i in 0..3000usize {
        let p = mine[i % mine.len()];
        w.run(|w| {
            let mut g = w.exclusive(p)?;
            g.page_mut().write(64 + (i % 8) * 8, &fill);
            Ok(())
        })
        .and_then(|()| w.commit())
        .unwrap_or_else(|e| panic!("commit {i} with node 2 dead: {e}"));
    }
    drop(w);
    let stats = c.node(0).protocol_stats();
    assert!(stats.checkpoints_past_dead >= 2, "{stats:?}");
    assert!(stats.records_carried >= theirs.len() as u64, "{stats:?}");
    // node 0's records of every page it handed node 2 are in its carried file
    let file = carried_file(dir.path(), 0).expect("node 0 has a carried file");
    let log = PathBuf::from(file.to_string_lossy().trim_end_matches(".carried"));
    let carried: std::collections::HashSet<u64> = shoal_storage::wal::carried::read_carried(&log)
        .unwrap()
        .iter()
        .filter_map(|(kind, body)| shoal_storage::wal::record::page_record(*kind, body))
        .map(|r| r.pid)
        .collect();
    for p in &theirs {
        assert!(carried.contains(&p.raw()), "{p} not carried");
    }
    drop(c); // a crash: the next open recovers from the logs and the carried files
    let c = open(dir.path());
    let w = c.node(1).worker();
    for p in &theirs {
        assert_eq!(w.run(|w| w.shared(*p)).unwrap().page().u64(0), 1, "{p}");
    }
    let mut end = [0u8; 8];
    for p in mine.iter().take(8) {
        // (every change wrote the fill over bytes 120 to 2,111)
        w.run(|w| w.shared(*p)).unwrap().page().read(1000, &mut end);
        assert_eq!(end, [0xa5; 8], "{p}: node 0's last changes");
    }
    drop(w);
    c.close().unwrap();
}

/// The cluster of the in-process restart tests: three nodes over tcp on loopback (`tcp`) or
/// over `mem`, logging with durability `commit`, small caches (pages move and are evicted
/// all the time).
fn restartable_cluster(dir: &Path, tcp: bool) -> Cluster {
    let b = Cluster::builder(NODES, dir)
        .cache_bytes(1 << 20)
        .remote_timeout(Duration::from_secs(3))
        .configure(|_, c| {
            c.durability = Durability::Commit;
            c.free_target_percent = 10;
        });
    if tcp { b.tcp_loopback() } else { b.mem() }.expect("the cluster opens")
}

/// What one incrementing worker did to word `g` of each page: increments acknowledged (its
/// commit returned), and increments made but not acknowledged (the commit, or the guard's
/// release, failed: the change may or may not have lasted).
struct Increments {
    acked: Vec<u64>,
    unsure: Vec<u64>,
    errors: u64,
}

/// Increment word `g` of random pages from `w` until `stop` (or, with `until_error`, until
/// the first error: the worker of the node that crashes).
fn increment(
    w: Worker,
    g: usize,
    pids: Vec<Pid>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    until_error: bool,
) -> Increments {
    use std::sync::atomic::Ordering;
    let mut rng = rand::rngs::StdRng::seed_from_u64(g as u64 + 7);
    let mut done = Increments {
        acked: vec![0; pids.len()],
        unsure: vec![0; pids.len()],
        errors: 0,
    };
    while !stop.load(Ordering::Relaxed) {
        let i = rng.random_range(0..pids.len());
        let made = match w.run(|w| w.exclusive(pids[i])) {
            Ok(mut x) => {
                let v = x.page().u64(g * 8);
                x.page_mut().set_u64(g * 8, v + 1);
                true
            }
            Err(_) => false,
        };
        let acked = made && w.commit().is_ok();
        match (made, acked) {
            (true, true) => done.acked[i] += 1,
            (true, false) => done.unsure[i] += 1,
            _ => {}
        }
        if !acked {
            done.errors += 1;
            if until_error {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    done
}

#[test]
fn a_crashed_node_of_a_tcp_cluster_restarts_into_it_in_one_process_and_loses_no_acknowledged_increment(
) {
    crash_and_restart_node_2(true);
}

#[test]
fn a_crashed_node_of_a_mem_cluster_restarts_into_it_and_loses_no_acknowledged_increment() {
    crash_and_restart_node_2(false);
}

/// Issue 45, rejoin in one process (`Cluster::crash`, `Cluster::restart`): node 2 of a tcp
/// (or `mem`) cluster crashes (as under kill -9) while a worker on each node increments
/// counters on every node's pages; the two others go on incrementing; node 2 restarts into
/// the running cluster (the others are not restarted), a new worker on it goes on; at the
/// end every counter holds every acknowledged increment and at most the unacknowledged ones
/// on top, read from every node, and the cluster closes cleanly.
fn crash_and_restart_node_2(tcp: bool) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let mut c = restartable_cluster(dir.path(), tcp);
    let mut pids = Vec::new();
    for n in 0..NODES {
        let w = c.node(n).worker();
        for _ in 0..60 {
            pids.push(w.allocate().expect("allocate").pid());
        }
        w.commit().expect("the new pages are durable");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let spawn = |c: &Cluster, g: usize, until_error: bool| {
        let (w, pids, stop) = (c.node(g).worker(), pids.clone(), Arc::clone(&stop));
        std::thread::spawn(move || increment(w, g, pids, stop, until_error))
    };
    let survivors: Vec<_> = (0..2).map(|g| spawn(&c, g, false)).collect();
    let doomed = spawn(&c, 2, true);
    std::thread::sleep(Duration::from_millis(800));
    c.crash(2);
    assert!(c.crashed(2));
    let before = doomed.join().unwrap();
    assert!(
        before.acked.iter().sum::<u64>() > 0,
        "node 2's worker made increments before the crash"
    );
    // the survivors go on meanwhile (the pages that need node 2 fail, the others are served)
    std::thread::sleep(Duration::from_millis(1500));
    let noticed: u64 = (0..2)
        .map(|i| c.node(i).protocol_stats().deaths_noticed)
        .sum();
    assert!(noticed >= 2, "both survivors noticed the death ({noticed})");
    let t0 = Instant::now();
    c.restart(2)
        .expect("node 2 restarts into the running cluster");
    let took = t0.elapsed();
    assert!(
        c.node(2).rejoined(),
        "node 2 was taken back, not started afresh"
    );
    assert!(!c.crashed(2));
    let after = spawn(&c, 2, false);
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let mut by: Vec<Increments> = survivors.into_iter().map(|h| h.join().unwrap()).collect();
    let again = after.join().unwrap();
    assert!(
        again.acked.iter().sum::<u64>() > 0,
        "the restarted node's worker made increments"
    );
    // worker 2's word: its increments before the crash and after the restart
    let mut two = before;
    for i in 0..pids.len() {
        two.acked[i] += again.acked[i];
        two.unsure[i] += again.unsure[i];
    }
    two.errors += again.errors;
    by.push(two);
    for reader in 0..NODES {
        let w = c.node(reader).worker();
        for (i, &p) in pids.iter().enumerate() {
            let g = w
                .run(|w| w.shared(p))
                .unwrap_or_else(|e| panic!("node {reader} reads page {p} after the rejoin: {e}"));
            for (k, d) in by.iter().enumerate() {
                let v = g.page().u64(k * 8);
                assert!(
                    v >= d.acked[i] && v <= d.acked[i] + d.unsure[i],
                    "page {p} (home {}), worker {k}'s word read on node {reader}: {v}, {} \
                     acknowledged and {} unsure increments",
                    p.node(),
                    d.acked[i],
                    d.unsure[i]
                );
            }
        }
    }
    let s: Vec<_> = (0..NODES).map(|i| c.node(i).protocol_stats()).collect();
    assert_eq!(
        (s[0].rejoins, s[1].rejoins),
        (1, 1),
        "each survivor took node 2 back once"
    );
    eprintln!(
        "restart took {:.2} s (take-backs {} and {} ms, the restarted node's open {} ms); \
         increments acknowledged by worker: {:?}, errors {:?}; pages brought back {}",
        took.as_secs_f64(),
        s[0].longest_take_back_ms,
        s[1].longest_take_back_ms,
        s[2].rejoin_ms,
        by.iter()
            .map(|d| d.acked.iter().sum::<u64>())
            .collect::<Vec<_>>(),
        by.iter().map(|d| d.errors).collect::<Vec<_>>(),
        s.iter().map(|s| s.pages_brought_back).sum::<u64>(),
    );
    c.close()
        .expect("the cluster closes cleanly after the rejoin");
}

/// A home whose checkpoints cannot finish (a dead peer, `checkpoint_past_dead_peers` off)
/// keeps getting its pages evicted home dirty by a live peer, each to be logged whole on
/// arrival. Once its log is nearly full it declines them (the evicting node keeps its copy)
/// instead of logging them into the room its checkpoints need: its handler goes on serving
/// (no request waits for it), its log does not fail, and its own changes fail with the
/// checkpoint's cause.
#[test]
fn a_home_whose_log_is_nearly_full_declines_pages_evicted_home_instead_of_stalling() {
    let dir = tempfile::tempdir().unwrap();
    // only node 0's checkpoints wait for the dead node
    let c = Cluster::builder(NODES, dir.path())
        .cache_bytes(1 << 20)
        .remote_timeout(Duration::from_secs(20))
        .configure(move |i, c| {
            c.durability = Durability::Commit;
            c.wal_bytes = 2 << 20;
            c.free_target_percent = 10;
            c.checkpoint_past_dead_peers = i != 0;
        })
        .mem()
        .unwrap();
    let pids = pages(&c, dir.path());
    let homed_0: Vec<Pid> = pids.iter().copied().filter(|p| p.node() == 0).collect();
    c.kill(2);
    let w1 = c.node(1).worker();
    let fill = [0x5au8; 2048];
    let t0 = Instant::now();
    let (mut commits, mut errors) = (0u64, Vec::new());
    // more of node 0's pages than node 1's cache holds: node 1 evicts them home dirty
    while t0.elapsed() < Duration::from_secs(12) {
        let p = homed_0[(commits as usize + errors.len()) % homed_0.len()];
        let r = w1
            .run(|w| {
                let mut g = w.exclusive(p)?;
                g.page_mut().write(64, &fill);
                Ok(())
            })
            .and_then(|()| w1.commit());
        match r {
            Ok(()) => commits += 1,
            Err(e) => errors.push(e.to_string()),
        }
    }
    let declined = c.node(0).protocol_stats().evictions_declined_for_log;
    // node 0's handler still answers
    let t1 = Instant::now();
    let r = w1.run(|w| w.shared(homed_0[0]).map(drop));
    let answered = t1.elapsed();
    // (a handler that waits for room answers nothing: the read ends in `RemoteTimeout`)
    assert!(
        r.is_ok(),
        "node 0 did not answer a read ({r:?}, after {answered:?}); node 1 made {commits} \
         commits, errors: {:?}",
        &errors[..errors.len().min(3)]
    );
    assert!(
        !errors.iter().any(|e| e.contains("no answer")),
        "a request waited for node 0's handler: {:?}",
        &errors[..errors.len().min(3)]
    );
    // node 1 keeps the copies node 0 declined; its checkpoint, which must log them whole,
    // fails with a clear cause when they do not fit, instead of waiting for room that only
    // it could make (its log would fail after 30 s)
    assert!(
        !errors
            .iter()
            .any(|e| e.contains("none finished in time") || e.contains("earlier log write failed")),
        "node 1's log failed: {:?}",
        &errors[..errors.len().min(3)]
    );
    assert!(c.node(1).protocol_stats().evictions_declined >= declined);
    assert!(
        declined > 0,
        "node 0 declined no eviction ({commits} commits, errors {:?})",
        &errors[..errors.len().min(3)]
    );
    // node 0's log did not fail: its changes fail with why its checkpoints fail
    let w0 = c.node(0).worker();
    let mine = w0.run(|w| {
        let mut g = w.exclusive(homed_0[1])?;
        g.page_mut().write(64, &fill);
        Ok(())
    });
    let err = mine.expect_err("node 0's log is nearly full").to_string();
    assert!(err.contains("node 2"), "{err}");
    eprintln!(
        "node 1: {commits} commits, {} errors (first {:?}); node 0 declined {declined} \
         evictions, answered a read in {answered:?}",
        errors.len(),
        errors.first()
    );
    drop((w0, w1));
}

/// A cluster closed while a node is crashed (`Cluster::crash`, never restarted) says so
/// (`PeerDead` naming it), leaves the stores unclean, and the next open recovers every
/// acknowledged change, the crashed node's too.
#[test]
fn a_cluster_closed_with_a_crashed_node_names_it_and_the_next_open_recovers_everything() {
    let dir = tempfile::tempdir().unwrap();
    let c = restartable_cluster(dir.path(), false);
    let mut pids = Vec::new();
    for n in 0..NODES {
        let w = c.node(n).worker();
        for _ in 0..20 {
            pids.push(w.allocate().expect("allocate").pid());
        }
        w.commit().unwrap();
    }
    // every node writes its own word of every page, committed
    for n in 0..NODES {
        let w = c.node(n).worker();
        for &p in &pids {
            let mut x = w.run(|w| w.exclusive(p)).unwrap();
            x.page_mut().set_u64(n * 8, 1 + n as u64);
        }
        w.commit().unwrap();
    }
    c.crash(2);
    assert!(c.crashed(2));
    let err = c.close().expect_err("a node is crashed");
    assert!(
        matches!(err, shoal_engine::EngineError::PeerDead { node: 2 }),
        "{err}"
    );
    drop(c);
    let c = restartable_cluster(dir.path(), false);
    let w = c.node(1).worker();
    for &p in &pids {
        let g = w.run(|w| w.shared(p)).unwrap();
        let words: Vec<u64> = (0..NODES).map(|n| g.page().u64(n * 8)).collect();
        assert_eq!(words, [1, 2, 3], "page {p} after the recovery");
    }
    drop(w);
    c.close().unwrap();
}
