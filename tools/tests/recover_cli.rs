//! After a real kill -9: `shoal inspect` reports a store with a log as needing recovery,
//! `shoal recover` brings back every record and leaves it clean, a store without a log is
//! reported as having lost its recent changes, and TPC-C recovers to a database that meets its
//! consistency conditions. Also: a log that does not fit is a clear error at start.

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const RECORDS: u64 = 20_000;

/// Run `shoal ARGS --data-dir DIR` and kill it with SIGKILL `after` its load line.
fn kill_after_load(args: &[&str], dir: &Path, after: Duration) {
    kill_after_line(args, dir, "load:", after)
}

/// Run `shoal ARGS --data-dir DIR` and kill it with SIGKILL `after` it printed a line starting
/// with `prefix`.
fn kill_after_line(args: &[&str], dir: &Path, prefix: &str, after: Duration) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(args)
        .args(["--duration", "60", "--quiet", "--data-dir"])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "shoal {args:?} ended before it printed {prefix}"
        );
        if line.starts_with(prefix) {
            break;
        }
    }
    std::thread::sleep(after);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}

/// Run `shoal ycsb` on `dir` and kill it with SIGKILL a second into its run.
fn run_and_kill(dir: &Path, durability: &str) {
    let records = RECORDS.to_string();
    let args = [
        "ycsb",
        "--records",
        &records,
        "--cache",
        "16MiB",
        "--warmup",
        "0",
    ];
    let args = [&args[..], &["--durability", durability]].concat();
    kill_after_load(&args, dir, Duration::from_secs(1));
}

fn shoal(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(args)
        .arg(dir)
        .output()
        .unwrap()
}

fn inspect(dir: &Path) -> (Option<i32>, serde_json::Value) {
    let out = shoal(&["inspect", "--quiet", "--json", "-"], dir);
    let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code(), v)
}

#[test]
fn a_run_killed_with_a_log_needs_recovery_and_recover_brings_back_every_record() {
    let dir = tempfile::tempdir().unwrap();
    run_and_kill(dir.path(), "commit");

    let (code, v) = inspect(dir.path());
    assert_eq!(code, Some(3), "{v}");
    let node = &v["nodes"][0];
    assert_eq!(node["state"], "needs_recovery", "{node}");
    assert!(
        node["log"]["pending_chunks"].as_u64().unwrap() > 0,
        "{node}"
    );
    assert_eq!(v["ok"], false);

    let out = shoal(&["recover"], dir.path());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("node 0: recovered:"), "{text}");

    let (code, v) = inspect(dir.path());
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["nodes"][0]["state"], "clean");
    assert_eq!(v["catalog"][0]["btree"]["entries"], RECORDS, "{v}");

    let out = shoal(&["recover"], dir.path());
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("clean, nothing to recover"));
}

#[test]
fn a_run_killed_without_a_log_is_reported_as_having_lost_its_changes() {
    let dir = tempfile::tempdir().unwrap();
    run_and_kill(dir.path(), "none");
    let (code, v) = inspect(dir.path());
    assert_eq!(code, Some(3), "{v}");
    assert_eq!(v["nodes"][0]["state"], "unclean_without_log", "{v}");
    let out = shoal(&["recover"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("cannot be recovered"));
}

#[test]
fn a_log_that_does_not_fit_is_a_clear_error_at_start_not_at_a_commit() {
    // A file-size limit of 200 MiB stands in for a full device (EFBIG, as ENOSPC): the 1 GiB
    // log is preallocated at open, so the run stops before its first write, with the reason.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -f 204800; exec {} ycsb --durability commit --records 1000 --warmup 0 \
             --duration 1 --quiet --data-dir {}",
            env!("CARGO_BIN_EXE_shoal"),
            data.display()
        ))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no room for the write-ahead log"), "{err}");
    assert!(err.contains("--wal-size"), "{err}");
    // a log that fits under the same limit works
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -f 204800; exec {} ycsb --durability commit --wal-size 64MiB --records 1000 \
             --warmup 0 --duration 1 --quiet --data-dir {}",
            env!("CARGO_BIN_EXE_shoal"),
            dir.path().join("e").display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn tpcc_killed_mid_run_recovers_to_a_consistent_database() {
    // After kill -9 the recovered database must meet TPC-C's consistency conditions 1-4 (no
    // half transaction: an order without its lines, a district counter without its order, a
    // payment without its history row).
    let dir = tempfile::tempdir().unwrap();
    kill_after_load(
        &[
            "tpcc",
            "--warehouses",
            "1",
            "--durability",
            "commit",
            "--wal-size",
            "256MiB",
        ],
        dir.path(),
        Duration::from_millis(1500),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args([
            "tpcc",
            "--warehouses",
            "1",
            "--check-existing",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("recovered:"), "{text}");
    assert!(text.contains("consistency conditions 1-4 hold"), "{text}");
}

/// `shoal ycsb load` of `records` records with durability commit and a log of `wal`, to the end.
fn load(dir: &Path, records: u64, wal: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["ycsb", "load", "--records", &records.to_string()])
        .args([
            "--durability",
            "commit",
            "--wal-size",
            wal,
            "--quiet",
            "--data-dir",
        ])
        .arg(dir)
        .output()
        .unwrap()
}

/// Whether this machine lets a test mount file systems in a mount namespace of its own.
fn mount_namespaces() -> bool {
    Command::new("unshare")
        .args(["-m", "sh", "-c", "mount -t tmpfs none /mnt"])
        .status()
        .is_ok_and(|s| s.success())
}

/// The log of the store in `dir` and what `survey` reads of it.
fn survey(dir: &Path) -> (std::path::PathBuf, shoal_storage::wal::LogInfo) {
    let log = dir.join("node0-0.wal");
    let info = shoal_storage::wal::survey(&log, shoal_storage::wal::ScanMode::Judge).unwrap();
    (log, info)
}

fn flip_byte(path: &Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x04], at).unwrap();
}

#[test]
fn a_bit_flipped_in_the_middle_of_the_log_is_refused_never_read_as_its_end() {
    // (on 97c8b21: recovery replayed half the log, said "the store is clean" and lost every
    // record after the flip)
    let dir = tempfile::tempdir().unwrap();
    run_and_kill(dir.path(), "commit");
    let (log, info) = survey(dir.path());
    assert!(info.damage.is_none(), "{info:?}");
    assert!(info.pending.chunks > 100, "{info:?}");
    // A chunk's payload is padded to 8 bytes with zeros that no checksum covers: a flip there
    // loses nothing and reads as the whole log. Such a flip is undone and the next byte taken,
    // until one lands on bytes the checksums cover (a failure of this test on 2026-11-29 was
    // a flip in such padding).
    let mut at = (info.keep_fpos + info.end_fpos) / 2;
    loop {
        flip_byte(&log, info.file_offset(at));
        let after = shoal_storage::wal::survey(&log, shoal_storage::wal::ScanMode::Judge).unwrap();
        if after.damage.is_some() {
            break;
        }
        assert_eq!(
            (after.end_lsn, after.pending.chunks, after.pending.records),
            (info.end_lsn, info.pending.chunks, info.pending.records),
            "a flip at stream position {at} that is not reported as damage loses nothing"
        );
        flip_byte(&log, info.file_offset(at)); // undone
        at += 1;
        assert!(at < info.end_fpos, "no flip was detected");
    }
    let before = std::fs::read(&log).unwrap();

    let (code, v) = inspect(dir.path());
    assert_eq!(code, Some(3), "{v}");
    let problems = v["problems"].to_string();
    assert!(problems.contains("is damaged"), "{v}");
    assert!(v["nodes"][0]["log"]["damage"].is_string(), "{v}");

    let out = shoal(&["recover"], dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("is damaged") && err.contains("LSN"), "{err}");
    assert!(err.contains("--discard-damaged-log"), "{err}");
    assert_eq!(
        std::fs::read(&log).unwrap(),
        before,
        "the log is left as it was"
    );
    let (code, _) = inspect(dir.path());
    assert_eq!(code, Some(3), "still needs recovery");

    // asked to, recovery keeps what precedes the damage
    let out = shoal(&["recover", "--discard-damaged-log"], dir.path());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("DAMAGED"), "{text}");
    let (code, v) = inspect(dir.path());
    assert_eq!(code, Some(0), "{v}");
}

#[test]
fn a_log_copied_from_another_store_is_refused() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    run_and_kill(a.path(), "commit");
    run_and_kill(b.path(), "commit");
    for f in ["node0-0.wal", "node0-0.wal.alloc0", "node0-0.wal.alloc1"] {
        std::fs::copy(a.path().join(f), b.path().join(f)).unwrap();
    }
    let out = shoal(&["recover"], b.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("belongs to another store"), "{err}");
    let (_, v) = inspect(b.path());
    assert!(v["problems"].to_string().contains("another store"), "{v}");
}

#[test]
fn a_deleted_log_is_named_missing_not_taken_for_durability_none() {
    let dir = tempfile::tempdir().unwrap();
    run_and_kill(dir.path(), "commit");
    std::fs::remove_file(dir.path().join("node0-0.wal")).unwrap();
    let (code, v) = inspect(dir.path());
    assert_eq!(code, Some(3), "{v}");
    assert_eq!(v["nodes"][0]["state"], "log_missing", "{v}");
    let out = shoal(&["recover"], dir.path());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("log is missing"), "{text}");
}

#[test]
fn a_data_file_cut_short_is_refused_by_recover() {
    // (on 97c8b21: "the store is clean", then inspect found pages never written)
    let dir = tempfile::tempdir().unwrap();
    let out = load(dir.path(), 20_000, "64MiB");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, v) = inspect(dir.path());
    let slots = v["nodes"][0]["allocated_slots"].as_u64().unwrap();
    assert!(slots > 100, "{v}");
    kill_after_line(
        &[
            "ycsb",
            "run",
            "--durability",
            "commit",
            "--wal-size",
            "64MiB",
            "--warmup",
            "0",
        ],
        dir.path(),
        "check:",
        Duration::from_millis(500),
    );
    let dat = dir.path().join("node0-0.dat");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&dat)
        .unwrap()
        .set_len((2 + slots / 2) * 4096)
        .unwrap();
    let out = shoal(&["recover"], dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cut short"), "{err}");
    let (code, v) = inspect(dir.path());
    assert_ne!(code, Some(0), "{v}");
    assert!(v["problems"].to_string().contains("cut short"), "{v}");
}

#[test]
fn a_store_killed_while_it_is_created_is_absent_or_whole() {
    // (on 97c8b21: 5 of 24 such kills left a directory nothing could open or reuse)
    let mut absent = 0;
    for delay_ms in [0u64, 20, 40, 60, 90, 120, 160, 220] {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_shoal"))
            .args([
                "ycsb",
                "load",
                "--records",
                "5000",
                "--durability",
                "commit",
                "--wal-size",
                "256MiB",
                "--quiet",
                "--data-dir",
            ])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        if dir.path().join("node0-0.dat").exists() {
            let out = shoal(&["recover"], dir.path());
            assert_eq!(
                out.status.code(),
                Some(0),
                "after {delay_ms} ms: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        } else {
            // no store: nothing to recover (exit 0 where an interrupted creation left files,
            // 2 where nothing was made at all), and the directory takes a new load
            absent += 1;
            let out = shoal(&["recover"], dir.path());
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                said.contains("no Shoal store"),
                "after {delay_ms} ms: {said}"
            );
            let left = std::fs::read_dir(dir.path()).unwrap().any(|e| {
                e.unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".creating")
            });
            let want = if left { 0 } else { 2 };
            assert_eq!(out.status.code(), Some(want), "after {delay_ms} ms: {said}");
            let out = load(dir.path(), 1000, "16MiB");
            assert!(
                out.status.success(),
                "after {delay_ms} ms: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    assert!(absent > 0, "some kill came before the store existed");
}

#[test]
fn a_run_killed_after_inserting_leaves_the_next_run_without_false_errors() {
    // (on 97c8b21: the next run inserted keys the crashed one had inserted: 12,607-24,920
    // "already present" value errors)
    let dir = tempfile::tempdir().unwrap();
    assert!(load(dir.path(), 20_000, "64MiB").status.success());
    let run = [
        "ycsb",
        "run",
        "--workload",
        "d",
        "--durability",
        "commit",
        "--wal-size",
        "64MiB",
        "--warmup",
        "0",
    ];
    kill_after_line(&run, dir.path(), "check:", Duration::from_millis(1500));
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(run)
        .args(["--duration", "1", "--quiet", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("inserts continue after"), "{text}");
}

#[test]
fn a_log_on_a_file_system_without_fallocate_is_reserved_by_writing() {
    // (on 97c8b21: --durability commit exited 2, "Operation not supported")
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args([
            "ycsb",
            "--records",
            "1000",
            "--durability",
            "commit",
            "--wal-size",
            "16MiB",
            "--warmup",
            "0",
            "--duration",
            "1",
            "--quiet",
            "--data-dir",
        ])
        .arg(dir.path().join("d"))
        .env("SHOAL_RESERVE_BY_WRITING", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // and on a real file system without fallocate (ext2 on a loop device), where this
    // machine lets a test mount one
    let img = dir.path().join("ext2.img");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let script = format!(
        "truncate -s 96M {img} && mkfs.ext2 -q {img} && mount -o loop {img} {mnt} && \
         {shoal} ycsb --records 1000 --durability commit --wal-size 16MiB --warmup 0 \
         --duration 1 --quiet --data-dir {mnt}/d; rc=$?; umount {mnt}; exit $rc",
        img = img.display(),
        mnt = mnt.display(),
        shoal = env!("CARGO_BIN_EXE_shoal")
    );
    let can_mount = mount_namespaces();
    if !can_mount {
        eprintln!("no mount namespace here: the ext2 part is not run");
        return;
    }
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn inspect_reads_a_store_on_a_read_only_file_system() {
    // (on 97c8b21: inspect opened the log for writing and failed)
    let dir = tempfile::tempdir().unwrap();
    run_and_kill(dir.path(), "commit");
    let can_mount = mount_namespaces();
    if !can_mount {
        eprintln!("no mount namespace here: not run");
        return;
    }
    let d = dir.path().display();
    let script = format!(
        "mount --bind {d} {d} && mount -o remount,bind,ro {d} && touch {d}/x 2>/dev/null && \
         exit 9; exec {} inspect --quiet --json - {d}",
        env!("CARGO_BIN_EXE_shoal")
    );
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(9), "the mount was not read-only");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{v}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(v["nodes"][0]["state"], "needs_recovery", "{v}");
    assert!(
        v["nodes"][0]["log"]["pending_chunks"].as_u64().unwrap() > 0,
        "{v}"
    );
}
