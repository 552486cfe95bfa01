//! Undo records of the tree's changes in a transaction, and rolling them back after a crash
//! (`roll_back`, the engine's hook).

use super::*;

/// Log how to undo an in-place update of `key`'s value from `old` to `new`: only the bytes
/// that changed (rows change a few fields).
pub(super) fn log_changed_bytes(w: &Worker, root: Pid, key: &[u8], old: &[u8], new: &[u8]) {
    if let Some(first) = old.iter().zip(new).position(|(a, b)| a != b) {
        let last = old.len()
            - old
                .iter()
                .zip(new)
                .rev()
                .position(|(a, b)| a != b)
                .unwrap_or(0);
        w.log_undo(&undo_range(root, key, first, &old[first..last]));
    }
}

/// How to undo one change of a tree in a transaction (`Worker::log_undo`): the tree's root
/// (fixed for its life), the key, and the value before (absent: the key was not there).
/// Layout: root u64, key length u16, kind u8 (0: the key was absent; 1: its old value
/// follows the key; 2: an offset u16 and the old bytes there follow, `undo_range`), key, rest.
pub(super) fn undo_record(root: Pid, key: &[u8], old: Option<&[u8]>) -> Vec<u8> {
    let mut r = Vec::with_capacity(11 + key.len() + old.map_or(0, <[u8]>::len));
    r.extend_from_slice(&root.raw().to_le_bytes());
    r.extend_from_slice(&(key.len() as u16).to_le_bytes());
    r.push(old.is_some() as u8);
    r.extend_from_slice(key);
    r.extend_from_slice(old.unwrap_or(&[]));
    r
}

/// How to undo a change of an overflow value: put its old reference back (kind 3; the old
/// chain is kept until the transaction commits).
pub(super) fn undo_reference(root: Pid, key: &[u8], reference: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(11 + key.len() + reference.len());
    r.extend_from_slice(&root.raw().to_le_bytes());
    r.extend_from_slice(&(key.len() as u16).to_le_bytes());
    r.push(3);
    r.extend_from_slice(key);
    r.extend_from_slice(reference);
    r
}

/// How to undo an in-place update: put `old` back at byte `off` of the value (kind 2).
pub(super) fn undo_range(root: Pid, key: &[u8], off: usize, old: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(13 + key.len() + old.len());
    r.extend_from_slice(&root.raw().to_le_bytes());
    r.extend_from_slice(&(key.len() as u16).to_le_bytes());
    r.push(2);
    r.extend_from_slice(key);
    r.extend_from_slice(&(off as u16).to_le_bytes());
    r.extend_from_slice(old);
    r
}

/// The engine's roll-back hook for B-tree transactions (`EngineConfig::roll_back`): after a
/// crash, each transaction cut off is undone newest change first, by putting back the value
/// each key had before (or removing a key the transaction inserted). Undoing twice (a crash
/// during the roll-back) gives the same result.
pub fn roll_back() -> shoal_engine::RollBack {
    shoal_engine::RollBack(std::sync::Arc::new(|w, unfinished| {
        for t in unfinished {
            for r in t.undo.iter().rev() {
                undo_one(w, r).map_err(|e| format!("transaction {}: {e}", t.txn))?;
            }
        }
        Ok(())
    }))
}

pub(super) fn undo_one(w: &Worker, r: &[u8]) -> Result<(), String> {
    if r.len() < 11 {
        return Err(format!("undo record of {} bytes is too short", r.len()));
    }
    let root = Pid(LittleEndian::read_u64(&r[0..]));
    let klen = u16::from_le_bytes([r[8], r[9]]) as usize;
    let Some(key) = r.get(11..11 + klen) else {
        return Err("undo record cut short".into());
    };
    let tree = BTree { root };
    let rest = &r[11 + klen..];
    match r[10] {
        0 => {
            tree.remove(w, key).map_err(|e| e.to_string())?;
        }
        1 => {
            tree.upsert(w, key, rest).map_err(|e| e.to_string())?;
        }
        2 if rest.len() >= 2 => {
            let off = u16::from_le_bytes([rest[0], rest[1]]) as usize;
            let old = &rest[2..];
            let mut fits = true;
            let found = tree
                .update(w, key, |v| match v.get_mut(off..off + old.len()) {
                    Some(dst) => dst.copy_from_slice(old),
                    None => fits = false,
                })
                .map_err(|e| e.to_string())?;
            if !found || !fits {
                return Err(format!(
                    "undoing an update of a key of {} bytes: the key is gone or its value shorter",
                    key.len()
                ));
            }
        }
        3 => {
            // put the old overflow reference back (its chain was kept: the transaction never
            // committed); a chain the transaction wrote there is freed by the put
            if ValueRef::decode(rest).is_none() {
                return Err("undo record with a bad overflow reference".into());
            }
            let mut old = Vec::new();
            tree.put_stored(w, key, rest, FLAG_OVERFLOW, Mode::Upsert, false, &mut old)
                .map_err(|e| e.to_string())?;
        }
        k => return Err(format!("undo record of unknown kind {k}")),
    }
    Ok(())
}
