//! The catalog: page [`Pid::CATALOG`] maps names (of trees, tables) to root page ids, so a
//! reopened engine finds its data structures.
//!
//! Layout of the page's data area:
//!
//! ```text
//! 0   count  u16
//! 8   entries, packed: name_len u8, name bytes, pid u64 (little endian)
//! ```

use crate::error::{EngineError, OpResult, Restart};
use crate::guard::Worker;
use crate::pid::Pid;
use byteorder::{ByteOrder, LittleEndian};
use shoal_storage::PAGE_DATA_SIZE;

/// Longest catalog name.
pub const MAX_NAME: usize = 255;
const HEADER: usize = 8;
/// Bytes of entries the catalog page holds (an entry takes its name's length + 9).
pub const CAPACITY: usize = PAGE_DATA_SIZE - HEADER;

/// The entries of a catalog page's data area (also for tools that read a store without an
/// engine, such as `shoal inspect`). A malformed page is an error, never a panic.
pub fn parse(data: &[u8]) -> Result<Vec<(String, Pid)>, EngineError> {
    if data.len() < HEADER {
        return Err(EngineError::Catalog("the catalog page is truncated".into()));
    }
    let count = u16::from_le_bytes([data[0], data[1]]) as usize;
    let mut out = Vec::with_capacity(count);
    let mut off = HEADER;
    for _ in 0..count {
        let corrupt = || EngineError::Catalog("the catalog page is corrupt".into());
        let len = *data.get(off).ok_or_else(corrupt)? as usize;
        let name = data.get(off + 1..off + 1 + len).ok_or_else(corrupt)?;
        let pid = data.get(off + 1 + len..off + 9 + len).ok_or_else(corrupt)?;
        out.push((
            String::from_utf8_lossy(name).into_owned(),
            Pid(LittleEndian::read_u64(pid)),
        ));
        off += 9 + len;
    }
    Ok(out)
}

fn used(entries: &[(String, Pid)]) -> usize {
    HEADER + entries.iter().map(|(n, _)| 9 + n.len()).sum::<usize>()
}

impl Worker {
    /// All catalog entries.
    pub fn catalog_list(&self) -> Result<Vec<(String, Pid)>, EngineError> {
        self.run(|w| {
            let g = w.shared(Pid::CATALOG)?;
            parse(g.data()).map_err(Restart::Fail)
        })
    }

    /// The page registered under `name`, if any.
    pub fn catalog_lookup(&self, name: &str) -> Result<Option<Pid>, EngineError> {
        Ok(self
            .catalog_list()?
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p))
    }

    /// Register `name` -> `pid`. Fails with [`EngineError::NameTaken`] if the name exists (the
    /// check and the insert happen under the catalog page's exclusive latch: of two callers
    /// registering one name at once, exactly one succeeds), or if the catalog page is full.
    pub fn catalog_insert(&self, name: &str, pid: Pid) -> Result<(), EngineError> {
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(EngineError::Catalog(format!(
                "name must be 1..={MAX_NAME} bytes, got {}",
                name.len()
            )));
        }
        self.run(|w| -> OpResult<()> {
            let mut g = w.exclusive(Pid::CATALOG)?;
            let entries = parse(g.data())?;
            if entries.iter().any(|(n, _)| n == name) {
                return Err(Restart::Fail(EngineError::NameTaken(name.to_string())));
            }
            let off = used(&entries);
            if off + 9 + name.len() > PAGE_DATA_SIZE {
                return Err(Restart::Fail(EngineError::Catalog(format!(
                    "the catalog page is full ({} entries)",
                    entries.len()
                ))));
            }
            let mut m = g.page_mut();
            m.set_u8(off, name.len() as u8);
            m.write(off + 1, name.as_bytes());
            m.set_u64(off + 1 + name.len(), pid.raw());
            m.set_u16(0, entries.len() as u16 + 1);
            Ok(())
        })
    }

    /// Remove `name`; returns the page it named, or `None` if it was not registered.
    pub fn catalog_remove(&self, name: &str) -> Result<Option<Pid>, EngineError> {
        self.catalog_rewrite(|entries| {
            let at = entries.iter().position(|(n, _)| n == name);
            Ok(at.map(|i| entries.remove(i).1))
        })
    }

    /// Rename `from` to `to`. Fails with [`EngineError::NameTaken`] if `to` exists, and with
    /// [`EngineError::Catalog`] if `from` does not.
    pub fn catalog_rename(&self, from: &str, to: &str) -> Result<(), EngineError> {
        if to.is_empty() || to.len() > MAX_NAME {
            return Err(EngineError::Catalog(format!(
                "name must be 1..={MAX_NAME} bytes, got {}",
                to.len()
            )));
        }
        self.catalog_rewrite(|entries| {
            if entries.iter().any(|(n, _)| n == to) {
                return Err(EngineError::NameTaken(to.to_string()));
            }
            let e = entries
                .iter_mut()
                .find(|(n, _)| n == from)
                .ok_or_else(|| EngineError::Catalog(format!("'{from}' is not registered")))?;
            e.0 = to.to_string();
            Ok(())
        })
    }

    /// Change the entries under the catalog page's exclusive latch and write them back.
    fn catalog_rewrite<T>(
        &self,
        mut change: impl FnMut(&mut Vec<(String, Pid)>) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        self.run(|w| -> OpResult<T> {
            let mut g = w.exclusive(Pid::CATALOG)?;
            let mut entries = parse(g.data())?;
            let out = change(&mut entries).map_err(Restart::Fail)?;
            if used(&entries) > PAGE_DATA_SIZE {
                return Err(Restart::Fail(EngineError::Catalog(format!(
                    "the catalog page is full ({} entries)",
                    entries.len()
                ))));
            }
            let mut m = g.page_mut();
            let mut off = HEADER;
            for (n, pid) in &entries {
                m.set_u8(off, n.len() as u8);
                m.write(off + 1, n.as_bytes());
                m.set_u64(off + 1 + n.len(), pid.raw());
                off += 9 + n.len();
            }
            m.set_u16(0, entries.len() as u16);
            Ok(out)
        })
    }
}
