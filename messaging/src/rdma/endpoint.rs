//! What two RDMA nodes exchange to connect (an [`Endpoint`] per peer) and how one write is
//! laid out ([`plan_write`], [`imm_slot`]): pure, unit-tested without hardware.

use super::*;

/// What one node tells a peer about its queue pair and region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub lid: u16,
    pub qpn: u32,
    pub psn: u32,
    pub gid: [u8; 16],
    /// Address of the region in the sender's address space (the RDMA target address).
    pub addr: u64,
    pub rkey: u32,
    /// Number of mailbox slots at the start of the region whose writes should wake a waiter.
    pub wake_slots: u32,
    /// Length of the region in bytes.
    pub len: u64,
}

impl Endpoint {
    pub fn encode(&self) -> [u8; ENDPOINT_BYTES] {
        let mut b = [0u8; ENDPOINT_BYTES];
        b[0..4].copy_from_slice(&ENDPOINT_TAG);
        b[4..6].copy_from_slice(&self.lid.to_le_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_le_bytes());
        b[12..16].copy_from_slice(&self.psn.to_le_bytes());
        b[16..32].copy_from_slice(&self.gid);
        b[32..40].copy_from_slice(&self.addr.to_le_bytes());
        b[40..44].copy_from_slice(&self.rkey.to_le_bytes());
        b[44..48].copy_from_slice(&self.wake_slots.to_le_bytes());
        b[48..56].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decode and validate a peer's endpoint; anything impossible is an error.
    pub fn decode(b: &[u8; ENDPOINT_BYTES]) -> Result<Endpoint, String> {
        if b[0..4] != ENDPOINT_TAG {
            return Err("not an endpoint record (bad tag)".into());
        }
        if b[6..8] != [0, 0] {
            return Err("reserved endpoint bytes are not zero".into());
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        let e = Endpoint {
            lid: u16::from_le_bytes([b[4], b[5]]),
            qpn: u32_at(8),
            psn: u32_at(12),
            gid,
            addr: u64_at(32),
            rkey: u32_at(40),
            wake_slots: u32_at(44),
            len: u64_at(48),
        };
        if e.qpn == 0 || e.qpn > MASK_24 {
            return Err(format!(
                "queue pair number {} is not a 24-bit RC QPN",
                e.qpn
            ));
        }
        if e.psn > MASK_24 {
            return Err(format!("packet sequence number {} exceeds 24 bits", e.psn));
        }
        if e.addr == 0 || !e.addr.is_multiple_of(8) {
            return Err(format!("region address {:#x} is null or unaligned", e.addr));
        }
        if e.len == 0 || !e.len.is_multiple_of(8) || e.addr.checked_add(e.len).is_none() {
            return Err(format!(
                "region length {} is empty, unaligned or wraps",
                e.len
            ));
        }
        if (e.wake_slots as u64) * SLOT_BYTES as u64 > e.len {
            return Err(format!(
                "{} mailbox slots do not fit a region of {} bytes",
                e.wake_slots, e.len
            ));
        }
        Ok(e)
    }
}

/// How one write goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WritePlan {
    /// Target address in the peer's address space.
    pub remote_addr: u64,
    /// Sent inline (no staging copy, no local key).
    pub inline: bool,
    /// Immediate (mailbox slot to wake) when the write ends in the mailbox area.
    pub imm: Option<u32>,
}

/// Plan a write of `len` bytes at `offset` of `peer`'s region: bounds and alignment checked
/// against what the peer announced, inline if it fits `max_inline`.
pub fn plan_write(
    peer: &Endpoint,
    offset: usize,
    len: usize,
    max_inline: u32,
) -> Result<WritePlan, MsgError> {
    let bad = || MsgError::OutOfBounds {
        offset,
        len,
        region: usize::try_from(peer.len).unwrap_or(usize::MAX),
    };
    let end = offset.checked_add(len).ok_or_else(bad)?;
    if len == 0
        || len > MAX_WRITE
        || !offset.is_multiple_of(8)
        || !len.is_multiple_of(8)
        || end as u64 > peer.len
    {
        return Err(bad());
    }
    let last_slot = (end - 1) / SLOT_BYTES;
    Ok(WritePlan {
        remote_addr: peer.addr + offset as u64,
        inline: len <= max_inline as usize,
        imm: (last_slot < peer.wake_slots as usize).then_some(last_slot as u32),
    })
}

/// The mailbox slot an immediate names, if it is one this region can wake.
pub fn imm_slot(imm: u32, wake_slots: usize) -> Option<usize> {
    let s = imm as usize;
    (s < wake_slots).then_some(s)
}
