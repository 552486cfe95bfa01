//! Records a cluster node carries over its recovery for the other nodes' pages
//! (docs/durability.md, "Clusters").
//!
//! A cluster node's log holds changes its workers made to pages homed on other nodes; those
//! nodes' recovery reads them from it. Recovery resumes a log after its end and moves its redo
//! point there, which would leave those records unreachable before every home has read them
//! (the nodes of a cluster of processes recover each at its own start). So before the move,
//! recovery writes them into a file beside the log, `<log>.carried`, whole and synced (written
//! under a temporary name and renamed), and every node's recovery reads a peer's carried file
//! after its log. The file goes at the node's next checkpoint that every peer answered a log
//! fence for: every peer is running, and recovered before it joined.
//!
//! A checkpoint that a dead peer could not fence adds to the file instead: this node's records
//! of the pages it handed that peer ([`page_records_before`], [`append_carried`]). Recovery
//! reads a node's own file too, for its own pages.
//!
//! Format: magic u64, count u64, then per record kind u8, length u32 and the body; a CRC-32
//! of everything before it closes the file. A file that fails its check is an error, never
//! read as fewer records.

use crate::error::{StoreError, StoreResult};
use byteorder::{ByteOrder, LittleEndian};
use std::path::{Path, PathBuf};

const MAGIC: u64 = 0x5952_5241_4341_4f48; // "HOACARRY"

/// The carried file of the log at `log`.
pub fn carried_path(log: &Path) -> PathBuf {
    crate::fs::with_suffix(log, ".carried")
}

/// Write `records` (kind, body) as the carried file of `log`, replacing any (atomically,
/// synced, the directory synced); with none, remove the file.
pub fn write_carried(log: &Path, records: &[(u8, Vec<u8>)]) -> StoreResult<()> {
    let path = carried_path(log);
    if records.is_empty() {
        return remove_carried(log);
    }
    let mut b = Vec::with_capacity(16 + records.iter().map(|r| 5 + r.1.len()).sum::<usize>());
    b.extend_from_slice(&MAGIC.to_le_bytes());
    b.extend_from_slice(&(records.len() as u64).to_le_bytes());
    for (kind, body) in records {
        b.push(*kind);
        b.extend_from_slice(&(body.len() as u32).to_le_bytes());
        b.extend_from_slice(body);
    }
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    crate::fs::write_atomic(&path, &b).map_err(|e| StoreError::Io {
        path: path.clone(),
        source: e,
    })
}

/// Remove the carried file of `log`, if any (the directory synced).
pub fn remove_carried(log: &Path) -> StoreResult<()> {
    let path = carried_path(log);
    match std::fs::remove_file(&path) {
        Ok(()) => crate::fs::sync_parent(&path).map_err(|e| StoreError::Io { path, source: e }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::Io { path, source: e }),
    }
}

/// The records of the carried file of `log` (none if there is no file).
pub fn read_carried(log: &Path) -> StoreResult<Vec<(u8, Vec<u8>)>> {
    let path = carried_path(log);
    let b = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StoreError::Io { path, source: e }),
    };
    let bad = |why: &str| StoreError::BadLog {
        path: path.clone(),
        why: format!("the records carried over a recovery: {why}"),
    };
    if b.len() < 20 || LittleEndian::read_u64(&b) != MAGIC {
        return Err(bad("not a carried-records file"));
    }
    let (body, tail) = b.split_at(b.len() - 4);
    if crc32fast::hash(body) != LittleEndian::read_u32(tail) {
        return Err(bad("its checksum fails (the file was damaged)"));
    }
    let count = LittleEndian::read_u64(&body[8..]);
    let mut out = Vec::new();
    let mut at = 16;
    for _ in 0..count {
        let Some(head) = body.get(at..at + 5) else {
            return Err(bad("cut short"));
        };
        let len = LittleEndian::read_u32(&head[1..]) as usize;
        let Some(rec) = body.get(at + 5..at + 5 + len) else {
            return Err(bad("cut short"));
        };
        out.push((head[0], rec.to_vec()));
        at += 5 + len;
    }
    if at != body.len() {
        return Err(bad("bytes after its last record"));
    }
    Ok(out)
}

/// Add `records` to the carried file of `log` (after those it holds; written as
/// [`write_carried`] does). A page's records older than its newest whole image are dropped
/// (recovery starts a page's chain again at an image: `merge::plan`), so the file holds at most
/// one image per page and the changes after it. Returns how many records the file holds now.
pub fn append_carried(log: &Path, records: Vec<(u8, Vec<u8>)>) -> StoreResult<usize> {
    let mut all = read_carried(log)?;
    all.extend(records);
    let mut newest_image: std::collections::HashMap<u64, u64> = Default::default();
    for (kind, body) in &all {
        if let Some(r) = super::record::page_record(*kind, body) {
            if matches!(r.change, super::record::Change::Image(_)) {
                let v = newest_image.entry(r.pid).or_default();
                *v = (*v).max(r.version);
            }
        }
    }
    all.retain(|(kind, body)| {
        super::record::page_record(*kind, body)
            .is_none_or(|r| newest_image.get(&r.pid).is_none_or(|&v| r.version >= v))
    });
    write_carried(log, &all)?;
    Ok(all.len())
}

/// The page records of the log at `log` from its redo point up to (not including) LSN
/// `upto` whose page id `want` accepts, as (kind, body), in log order: what a cluster node's
/// checkpoint carries over when a peer cannot answer its log fence (docs/durability.md,
/// "Clusters"). The log must be durable up to `upto`; it may be written after `upto`
/// meanwhile (the log of a running node). Reads the file and writes nothing; damage before
/// `upto` is an error.
pub fn page_records_before(
    log: &Path,
    upto: u64,
    want: impl Fn(u64) -> bool,
) -> StoreResult<Vec<(u8, Vec<u8>)>> {
    let (found, file) = super::read_existing(log, false)?;
    let redo = found.redo_lsn();
    let mut out = Vec::new();
    let scanned = super::scan_upto(
        log,
        &file,
        &found,
        super::ScanMode::End,
        upto,
        |lsn, kind, body| {
            let wanted = super::record::page_record(kind, body).is_some_and(|r| want(r.pid));
            if lsn >= redo && wanted {
                out.push((kind, body.to_vec()));
            }
            Ok(())
        },
    )?;
    if scanned.end.lsn < upto {
        // a chunk the caller made durable is not there: never carry fewer records silently
        return Err(StoreError::BadLog {
            path: log.to_path_buf(),
            why: format!(
                "the log ends at LSN {} on the device, before LSN {upto}, up to which it was \
                 made durable",
                scanned.end.lsn
            ),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carried_records_read_back_whole_and_a_damaged_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("n.wal");
        assert!(
            read_carried(&log).unwrap().is_empty(),
            "no file: no records"
        );
        let recs = vec![(9u8, vec![1, 2, 3]), (8u8, vec![7; 5000])];
        write_carried(&log, &recs).unwrap();
        assert_eq!(read_carried(&log).unwrap(), recs);
        let p = carried_path(&log);
        let mut b = std::fs::read(&p).unwrap();
        b[30] ^= 1;
        std::fs::write(&p, &b).unwrap();
        let e = read_carried(&log).unwrap_err().to_string();
        assert!(e.contains("checksum"), "{e}");
        write_carried(&log, &[]).unwrap();
        assert!(!p.exists(), "no records: no file");
    }
}
