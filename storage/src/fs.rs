//! File-system steps that durability depends on: syncing files and
//! directories, replacing a file atomically. Every change the store makes to its files goes
//! through here (or reports itself with [`wrote`]), so that the simulated device
//! ([`crate::sim`]) sees all of them. What a crash (or a power loss) can leave behind of each
//! is said at each function; `docs/durability.md` ("Faults") has the whole list.

use crate::sim::{self, Event};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Open `path` for reading and writing, created if missing and cut to 0 bytes.
pub(crate) fn create(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    sim::record(|| Event::Create {
        path: path.to_path_buf(),
    });
    Ok(f)
}

/// `write_all_at` on `file` (opened as `path`).
pub(crate) fn write_at(file: &File, path: &Path, buf: &[u8], off: u64) -> io::Result<()> {
    file.write_all_at(buf, off)?;
    wrote(path, off, buf);
    Ok(())
}

/// Report a write that went to the device another way (io_uring, `pwritev`).
pub(crate) fn wrote(path: &Path, off: u64, buf: &[u8]) {
    sim::record(|| Event::Write {
        path: path.to_path_buf(),
        off,
        data: buf.to_vec(),
    });
}

/// Report that `path` was grown (or cut) to `len` bytes.
pub(crate) fn resized(path: &Path, len: u64) {
    sim::record(|| Event::SetLen {
        path: path.to_path_buf(),
        len,
    });
}

/// `fdatasync` of `file` (opened as `path`): its data written so far, and its size, survive a
/// power loss once this returns.
pub(crate) fn sync_data(file: &File, path: &Path) -> io::Result<()> {
    let begun = sim::now();
    sim::sync_fails(path)?;
    file.sync_data()?;
    sim::record(|| Event::Sync {
        path: path.to_path_buf(),
        begun,
    });
    Ok(())
}

/// `fsync` of `file` (opened as `path`).
pub(crate) fn sync_all(file: &File, path: &Path) -> io::Result<()> {
    let begun = sim::now();
    file.sync_all()?;
    sim::record(|| Event::Sync {
        path: path.to_path_buf(),
        begun,
    });
    Ok(())
}

/// Rename `from` to `to` (replacing `to`). Durable once the directory is synced.
pub(crate) fn rename(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::rename(from, to)?;
    sim::record(|| Event::Rename {
        from: from.to_path_buf(),
        to: to.to_path_buf(),
    });
    Ok(())
}

/// Remove `path`. Durable once the directory is synced.
pub(crate) fn remove(path: &Path) -> io::Result<()> {
    std::fs::remove_file(path)?;
    sim::record(|| Event::Remove {
        path: path.to_path_buf(),
    });
    Ok(())
}

/// `SHOAL_RESERVE_BY_WRITING=1`: behave as on a file system without `fallocate` (tests).
pub(crate) fn by_writing_forced() -> bool {
    std::env::var_os("SHOAL_RESERVE_BY_WRITING").is_some_and(|v| v == "1")
}

/// An error that says the file system lacks the operation (not a full device, not a bad
/// descriptor).
pub(crate) fn not_supported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL)
    )
}

/// Make the entries of directory `dir` durable (files created, renamed or removed in it):
/// without this, a power loss can take back a file that was just created or renamed.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    let named = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let begun = sim::now();
    File::open(named)?.sync_all()?;
    sim::record(|| Event::SyncDir {
        dir: dir.to_path_buf(),
        begun,
    });
    Ok(())
}

/// Sync the directory holding `path`.
pub fn sync_parent(path: &Path) -> io::Result<()> {
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// `path` with `suffix` added to its file name (`a.dat` + `.creating` -> `a.dat.creating`).
pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Replace the file at `path` with `bytes`, atomically and durably: written to `path.new`,
/// synced, renamed over `path`, and the directory synced. A crash leaves the old content or the
/// new one, never a mix or an empty file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = with_suffix(path, ".new");
    {
        let f = create(&tmp)?;
        write_at(&f, &tmp, bytes, 0)?;
        sync_all(&f, &tmp)?;
    }
    rename(&tmp, path)?;
    sync_parent(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under the simulated device: a power loss at any point of replacing a file leaves the
    /// old content or the new, never an empty or half-written file, and once the call has
    /// returned, the new (ycsb-dataset.json was 0 bytes after every one of 11 power losses
    /// when it was written without a sync).
    #[cfg(feature = "crash-sim")]
    #[test]
    fn a_power_loss_while_a_file_is_replaced_leaves_the_old_or_the_new_content() {
        use crate::sim::{self, Crash, Damage};
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("set.json");
        sim::start();
        write_atomic(&p, b"the old description").unwrap();
        let old_done = sim::now();
        write_atomic(&p, b"the new one").unwrap();
        let t = sim::stop();
        for upto in 0..=t.len() {
            for crash in [Crash::DropUnsynced, Crash::KeepSome, Crash::Tear] {
                for seed in 0..4 {
                    let out = tempfile::tempdir().unwrap();
                    t.materialize(upto, crash, Damage::None, seed, dir.path(), out.path())
                        .unwrap();
                    let got = std::fs::read(out.path().join("set.json")).ok();
                    let ok = match got.as_deref() {
                        Some(b"the new one") => true,
                        Some(b"the old description") => upto < t.len(),
                        None => upto < old_done,
                        _ => false,
                    };
                    assert!(
                        ok,
                        "after {upto} of {} events ({crash:?}): {got:?}",
                        t.len()
                    );
                }
            }
        }
    }

    #[test]
    fn an_atomic_write_replaces_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("set.json");
        write_atomic(&p, b"first, longer").unwrap();
        write_atomic(&p, b"second").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"second");
        assert!(!with_suffix(&p, ".new").exists());
    }
}
