//! `shoal inspect` end to end: a sound store reports every page intact and its tree's exact
//! counts; a flipped byte, a sealed but broken node, a running engine and a directory without a
//! store are each reported with the right exit status; nothing is ever written.

use shoal_btree::{u64_key, BTree};
use shoal_engine::{Engine, EngineConfig, Pid};
use shoal_storage::{seal, PAGE_SIZE};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output};

const RECORDS: u64 = 20_000;

/// A data directory with one tree of RECORDS entries and a second, small one, closed cleanly.
fn make_store(dir: &Path) {
    let e = Engine::open(EngineConfig::new(dir, 16 << 20)).unwrap();
    let w = e.worker();
    let t = BTree::create(&w, "big").unwrap();
    for k in 0..RECORDS {
        assert!(t
            .insert(&w, u64_key(k * 7_919 % RECORDS), [k as u8; 100])
            .unwrap()
            .inserted());
    }
    let s = BTree::create(&w, "small").unwrap();
    assert!(s.insert(&w, b"only", b"one").unwrap().inserted());
    drop(w);
    e.close().unwrap();
}

fn inspect(dir: &Path) -> (Output, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["inspect", "--quiet", "--json", "-"])
        .arg(dir)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out, v)
}

fn device(dir: &Path) -> std::path::PathBuf {
    dir.join("node0-0.dat")
}

/// Write `bytes` at byte `at` of node 0's device (one device).
fn scribble(dir: &Path, at: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(device(dir))
        .unwrap();
    f.write_all_at(bytes, at).unwrap();
}

/// Rewrite slot `slot` of node 0 (one device) through `edit`, sealed again as a valid page.
fn reseal(dir: &Path, slot: u64, edit: impl FnOnce(&mut [u8])) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(device(dir))
        .unwrap();
    let off = (2 + slot) * PAGE_SIZE as u64; // after the two superblock copies
    let mut page = [0u8; PAGE_SIZE];
    f.read_exact_at(&mut page, off).unwrap();
    edit(&mut page);
    seal(&mut page, Pid::new(0, slot).raw());
    f.write_all_at(&page, off).unwrap();
}

#[test]
fn a_sound_store_is_counted_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    make_store(dir.path());
    let before = std::fs::read(device(dir.path())).unwrap();
    let (out, v) = inspect(dir.path());
    assert!(
        out.status.success(),
        "{v}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(v["ok"], true);
    let node = &v["nodes"][0];
    assert_eq!(node["clean"], true);
    assert_eq!(node["corrupt"], 0);
    assert_eq!(node["never_written"], 0);
    // every page in use is the catalog's or a tree's
    assert_eq!(node["pages_outside_trees"], 0, "{node}");
    let big = &v["catalog"][0];
    assert_eq!(big["name"], "big");
    assert_eq!(big["btree"]["entries"], RECORDS);
    assert!(big["btree"]["height"].as_u64().unwrap() >= 2, "{big}");
    let small = &v["catalog"][1];
    assert_eq!(
        (&small["btree"]["entries"], &small["btree"]["pages"]),
        (&1.into(), &1.into())
    );
    let pages = big["btree"]["pages"].as_u64().unwrap() + 1;
    assert_eq!(node["intact"].as_u64().unwrap(), pages + 1, "{node}");
    assert!(
        std::fs::read(device(dir.path())).unwrap() == before,
        "inspect wrote to the store"
    );
    // the readable summary says the same
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["inspect", "--quiet"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!("B-tree: {RECORDS} entries")),
        "{text}"
    );
    assert!(text.contains("ok: no problems found"), "{text}");
    // --no-trees: pages only
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["inspect", "--quiet", "--no-trees", "--json", "-"])
        .arg(dir.path())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(out.status.success(), "{v}");
    assert!(v["catalog"].is_null(), "{v}");
    assert_eq!(v["nodes"][0]["intact"], node["intact"]);
}

#[test]
fn a_bad_superblock_copy_is_reported_and_the_next_open_repairs_it() {
    let dir = tempfile::tempdir().unwrap();
    make_store(dir.path());
    scribble(dir.path(), 100, &[0x5A; 16]); // inside copy 0
    let (out, v) = inspect(dir.path());
    assert!(out.status.success(), "{v}");
    let copies = &v["nodes"][0]["superblock_copies"][0];
    assert_eq!(copies["used"], 1, "{copies}");
    assert_eq!(copies["copies"][0]["intact"], false, "{copies}");
    assert_eq!(copies["copies"][1]["intact"], true, "{copies}");
    let notes = v["notes"].to_string();
    assert!(
        notes.contains("copy 0 bad") && notes.contains("rewrites"),
        "{notes}"
    );
    // every record is still there, and the open rewrites the bad copy
    let e = Engine::open(EngineConfig::new(dir.path(), 16 << 20)).unwrap();
    let w = e.worker();
    let t = BTree::open(&w, "big").unwrap();
    let mut n = 0u64;
    t.scan(&w, &[], shoal_btree::Direction::Ascending, |_, _| {
        n += 1;
        true
    })
    .unwrap();
    assert_eq!(n, RECORDS);
    drop(w);
    e.close().unwrap();
    drop(e);
    let (out, v) = inspect(dir.path());
    assert!(out.status.success(), "{v}");
    let copies = &v["nodes"][0]["superblock_copies"][0];
    assert_eq!(copies["copies"][0]["intact"], true, "{copies}");
    assert_eq!(
        copies["copies"][0]["generation"],
        copies["copies"][1]["generation"]
    );
    assert_eq!(v["notes"].as_array().map(Vec::len), Some(0), "{v}");
}

#[test]
fn a_flipped_byte_is_found_and_named() {
    let dir = tempfile::tempdir().unwrap();
    make_store(dir.path());
    scribble(dir.path(), 32 * PAGE_SIZE as u64 + 777, &[0x5A]); // slot 30
    let (out, v) = inspect(dir.path());
    assert_eq!(out.status.code(), Some(1), "{v}");
    assert_eq!(v["ok"], false);
    assert_eq!(v["nodes"][0]["corrupt"], 1);
    assert_eq!(v["nodes"][0]["corrupt_slots"][0]["slot"], 30);
    let problems = v["problems"].to_string();
    assert!(
        problems.contains("slot 30") && problems.contains("checksum"),
        "{problems}"
    );
    // the tree that holds the page cannot be read through it
    assert!(problems.contains("tree 'big'"), "{problems}");
}

#[test]
fn sealed_but_broken_nodes_fail_the_tree_check() {
    // a node whose byte accounting is off (dead bytes that are not there)
    let dir = tempfile::tempdir().unwrap();
    make_store(dir.path());
    reseal(dir.path(), 40, |p| p[6] = p[6].wrapping_add(1));
    let (out, v) = inspect(dir.path());
    assert_eq!(out.status.code(), Some(1), "{v}");
    assert_eq!(
        v["nodes"][0]["corrupt"], 0,
        "the page itself is sealed correctly"
    );
    let err = v["catalog"][0]["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(err.contains("heap accounting"), "{v}");

    // a root that claims a right sibling
    let dir = tempfile::tempdir().unwrap();
    make_store(dir.path());
    let root = {
        let (_, v) = inspect(dir.path());
        v["catalog"][1]["root"].as_u64().unwrap()
    };
    reseal(dir.path(), Pid(root).slot(), |p| {
        p[8..16].copy_from_slice(&5u64.to_le_bytes())
    });
    let (out, v) = inspect(dir.path());
    assert_eq!(out.status.code(), Some(1), "{v}");
    let err = v["catalog"][1]["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(err.contains("links right"), "{v}");
    assert!(
        v["catalog"][0]["error"].is_null(),
        "the other tree is fine: {v}"
    );
}

#[test]
fn a_running_engine_or_a_missing_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    make_store(dir.path());
    let e = Engine::open(EngineConfig::new(dir.path(), 16 << 20)).unwrap();
    let (out, _) = inspect(dir.path());
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by a running engine"), "{err}");
    e.close().unwrap();
    drop(e);
    assert!(inspect(dir.path()).0.status.success());

    let empty = tempfile::tempdir().unwrap();
    let (out, _) = inspect(empty.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no Shoal store"));
    let (out, _) = inspect(&empty.path().join("nope"));
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_cluster_run_whose_output_pipe_closes_still_shuts_down_in_order() {
    // Printing to a closed pipe panics mid-run; the cluster must still be closed in order
    // (pages home, stores clean), not dropped (stores unclean, changes made on other nodes
    // lost).
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args([
            "ycsb",
            "--nodes",
            "2",
            "--records",
            "20000",
            "--cache",
            "16MiB",
        ])
        .args(["--warmup", "0", "--duration", "2", "--quiet", "--data-dir"])
        .arg(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // read the header and the load line, then stop reading: the report after the run fails
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    for _ in 0..2 {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    }
    drop(out);
    let status = child.wait().unwrap();
    assert!(!status.success(), "the run cannot report, so it fails");
    let (out, v) = inspect(dir.path());
    assert!(out.status.success(), "{v}");
    for node in v["nodes"].as_array().unwrap() {
        assert_eq!(node["clean"], true, "{node}");
    }
    assert_eq!(v["catalog"][0]["btree"]["entries"], 20_000);
}

/// Issue 28: values kept in overflow pages are checked too: their chains count as tree pages
/// (none "outside every tree"), and a chain page sealed but broken is a problem naming the tree.
#[test]
fn overflow_chains_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let chain_page = {
        let e = Engine::open(EngineConfig::new(dir.path(), 16 << 20)).unwrap();
        let w = e.worker();
        let t = BTree::create(&w, "blobs").unwrap();
        for k in 0..3u64 {
            t.upsert(&w, u64_key(k), vec![k as u8; 10_000 * (k as usize + 1)])
                .unwrap();
        }
        let report = t.verify(&w).unwrap();
        assert_eq!(report.overflow_values, 3);
        let last = *report.pages.last().unwrap(); // the last chain page of the last value
        drop(w);
        e.close().unwrap();
        last
    };
    let (out, v) = inspect(dir.path());
    assert!(out.status.success(), "{v}");
    assert_eq!(v["nodes"][0]["pages_outside_trees"], 0, "{v}");
    let b = &v["catalog"][0]["btree"];
    assert_eq!(b["overflow_values"], 3, "{b}");
    assert_eq!(b["overflow_pages"], 3 + 5 + 8, "{b}");
    reseal(dir.path(), chain_page.slot(), |p| p[0] = 9); // not an overflow page any more
    let (out, v) = inspect(dir.path());
    assert_eq!(out.status.code(), Some(1), "{v}");
    let problems = v["problems"].to_string();
    assert!(
        problems.contains("tree 'blobs'") && problems.contains("overflow page"),
        "{problems}"
    );
}
