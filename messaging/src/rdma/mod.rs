//! `rdma` (cargo feature `rdma`): one-sided writes with ibverbs RDMA WRITE over
//! reliable-connection (RC) queue pairs.
//!
//! **Set-up.** The node opens an RDMA device (the first one, or the one named in the config),
//! checks that the port is active, and registers its whole [`Region`] once for remote writes.
//! It then connects to every peer over TCP exactly like the `tcp` transport (same dial/accept
//! rules and validated hello, with the magic `SHLR` so a `tcp` node never pairs with an `rdma`
//! node), and over each TCP connection the two nodes swap an [`Endpoint`]: queue pair number,
//! PSN, LID/GID, and the address, length and rkey of the region. Both move their queue pair
//! through INIT, RTR and RTS, then swap one "ready" byte so neither writes before the other can
//! receive. The TCP connection stays open afterwards only to notice a peer's death (EOF).
//!
//! **Writes.** A write up to the queue pair's inline limit goes out as an inline RDMA WRITE (the
//! NIC copies the bytes at post time); a larger one (a 4 KiB page) is first copied into a
//! registered staging buffer of that peer. A write that ends inside the peer's mailbox area uses
//! RDMA WRITE WITH IMMEDIATE, the immediate being the slot index: the write lands without the
//! peer's CPU, and the immediate produces a receive completion on the peer, whose doorbell
//! thread then wakes the slot's parked waiter ([`Region::wake_slot`]). Writes to one peer are
//! serialised by a per-peer lock and each waits for its send completion, so writes are applied
//! in order, an error is reported to the writer that caused it, and the staging buffer is free
//! again when `write` returns.
//!
//! **Ordering assumption.** A waiter that polls a mailbox flag (the last byte of a message) and
//! then reads the message relies on the NIC placing the bytes of one RDMA WRITE in increasing
//! address order, as the write/write mailbox designs in papers/002 do; the receive completion
//! of the immediate, which drives wake-ups, is ordered after the whole write by the RC rules.
//!
//! **Failure.** A peer whose TCP connection closes, or whose queue pair reports an error
//! completion, is marked dead; every waiter is woken and further writes fail with
//! [`MsgError::PeerDead`]. No RDMA device, an unknown device name or an inactive port are
//! reported as [`MsgError::Rdma`] before any network traffic.
//!
//! There is no RDMA hardware on the development machines: the device-free logic (endpoint
//! encoding and validation, write planning, immediate decoding, the no-device error) is unit
//! tested; the verbs path compiles in CI but has not run against a NIC.

mod device;
mod endpoint;
pub use device::device_names;
use device::*;
use endpoint::*;

use crate::error::MsgError;
use crate::region::{Region, SLOT_BYTES};
use crate::tcp::{connect_mesh, io, reject_strangers, TcpConfig};
use crate::transport::Transport;
use parking_lot::Mutex;
use rdma_sys as ffi;
use std::ffi::CStr;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Hello magic of the `rdma` transport's TCP set-up connections.
const MAGIC: [u8; 4] = *b"SHLR";
/// Tag at the start of an encoded [`Endpoint`].
const ENDPOINT_TAG: [u8; 4] = *b"SHEP";
/// Bytes of an encoded [`Endpoint`].
pub const ENDPOINT_BYTES: usize = 56;
/// Largest single write (and the size of each peer's staging buffer).
pub const MAX_WRITE: usize = 1 << 20;
/// Inline data we ask the queue pair for (a 64-byte message fits).
const WANT_INLINE: u32 = 64;
/// Receive work requests kept posted per queue pair (each RDMA WRITE WITH IMMEDIATE consumes one).
const RECV_DEPTH: u32 = 256;
/// How long a writer waits for its send completion before declaring the peer dead.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// `ibv_port_attr::link_layer` of RoCE ports (needs a GRH).
const LINK_LAYER_ETHERNET: u8 = 2;
/// Queue pair numbers and PSNs are 24-bit.
const MASK_24: u32 = 0x00FF_FFFF;

/// Which RDMA device and port to use, on top of the TCP addresses used for set-up.
#[derive(Debug, Clone)]
pub struct RdmaConfig {
    pub tcp: TcpConfig,
    /// Device name (as `ibv_devices` lists it); `None` takes the first device.
    pub device: Option<String>,
    /// Port number on the device (1-based).
    pub port: u8,
    /// GID table index (RoCE needs the right one for the address family; 0 is the default).
    pub gid_index: u8,
}

impl RdmaConfig {
    pub fn new(tcp: TcpConfig) -> RdmaConfig {
        RdmaConfig {
            tcp,
            device: None,
            port: 1,
            gid_index: 0,
        }
    }
}

fn rdma_err(what: impl Into<String>) -> MsgError {
    MsgError::Rdma(what.into())
}

/// A registered buffer that large writes are copied into before posting.
struct Staging {
    buf: Box<[u8]>,
    mr: *mut ffi::ibv_mr,
}

/// The connection to one peer.
struct Link {
    qp: *mut ffi::ibv_qp,
    send_cq: *mut ffi::ibv_cq,
    remote: Endpoint,
    max_inline: u32,
    send: Mutex<Staging>,
    tcp: TcpStream,
    alive: AtomicBool,
}

impl Drop for Link {
    fn drop(&mut self) {
        // SAFETY: the QP, its send CQ and the staging MR belong to this link alone and are
        // destroyed once, QP first (it references the CQs).
        unsafe {
            if !self.qp.is_null() {
                ffi::ibv_destroy_qp(self.qp);
            }
            if !self.send_cq.is_null() {
                ffi::ibv_destroy_cq(self.send_cq);
            }
            let st = self.send.get_mut();
            if !st.mr.is_null() {
                ffi::ibv_dereg_mr(st.mr);
            }
        }
    }
}

struct Inner {
    node: u8,
    nodes: u8,
    // Field order is drop order: links (QPs) before the device (CQs, PD, context), then the
    // region whose registration the device holds.
    links: Vec<Option<Link>>,
    dev: Device,
    region: Arc<Region>,
    closed: AtomicBool,
}

// SAFETY: the raw pointers are verbs objects; libibverbs verbs are thread-safe, and the one
// non-thread-safe use (posting to a QP and polling its send CQ) is serialised by the link's
// `send` mutex. Everything else is immutable after start or atomic.
unsafe impl Send for Inner {}
// SAFETY: see `Send`.
unsafe impl Sync for Inner {}

/// One node's RDMA transport.
pub struct RdmaTransport {
    inner: Arc<Inner>,
}

fn modify(
    qp: *mut ffi::ibv_qp,
    attr: &mut ffi::ibv_qp_attr,
    mask: u32,
    what: &str,
) -> Result<(), MsgError> {
    // SAFETY: qp is a live QP, attr a valid, fully initialised attribute struct.
    let rc = unsafe { ffi::ibv_modify_qp(qp, attr, mask as i32) };
    if rc != 0 {
        return Err(rdma_err(format!(
            "moving the queue pair to {what}: {}",
            std::io::Error::from_raw_os_error(rc)
        )));
    }
    Ok(())
}

fn post_recvs(qp: *mut ffi::ibv_qp, peer: u8, count: u32) -> Result<(), MsgError> {
    for _ in 0..count {
        // SAFETY: a zero-length receive (no scatter list) is valid for WRITE WITH IMMEDIATE.
        let mut wr: ffi::ibv_recv_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = peer as u64;
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: qp is live; wr and bad are valid for the call.
        let rc = unsafe { ffi::ibv_post_recv(qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(rdma_err(format!(
                "posting receives: {}",
                std::io::Error::from_raw_os_error(rc)
            )));
        }
    }
    Ok(())
}

fn psn() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (t ^ std::process::id().rotate_left(12)) & MASK_24
}

impl Inner {
    /// Create the QP for `peer`, swap endpoints over `s`, and bring the QP to RTS.
    fn connect(&self, peer: u8, mut s: TcpStream) -> Result<Link, MsgError> {
        let dev = &self.dev;
        // SAFETY: ctx is open; a NULL result is checked.
        let send_cq = unsafe {
            ffi::ibv_create_cq(dev.ctx, 128, std::ptr::null_mut(), std::ptr::null_mut(), 0)
        };
        if send_cq.is_null() {
            return Err(rdma_err(format!("ibv_create_cq: {}", errno_text())));
        }
        let mut buf = vec![0u8; MAX_WRITE].into_boxed_slice();
        let staging_mr = match register(dev.pd, buf.as_mut_ptr(), buf.len(), false) {
            Ok(m) => m,
            Err(e) => {
                // SAFETY: created above, not used by anything yet.
                unsafe { ffi::ibv_destroy_cq(send_cq) };
                return Err(e);
            }
        };
        let mut link = Link {
            qp: std::ptr::null_mut(),
            send_cq,
            remote: Endpoint {
                lid: 0,
                qpn: 0,
                psn: 0,
                gid: [0; 16],
                addr: 0,
                rkey: 0,
                wake_slots: 0,
                len: 0,
            },
            max_inline: 0,
            send: Mutex::new(Staging {
                buf,
                mr: staging_mr,
            }),
            tcp: s.try_clone().map_err(io)?,
            alive: AtomicBool::new(true),
        };
        // SAFETY: plain C struct, zero is a valid starting value.
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = send_cq;
        init.recv_cq = dev.recv_cq;
        init.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
        init.cap.max_send_wr = 64;
        init.cap.max_recv_wr = RECV_DEPTH;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = WANT_INLINE;
        // SAFETY: pd and the CQs are live; init is valid; a NULL result is checked. The driver
        // writes the granted capabilities back into `init`.
        link.qp = unsafe { ffi::ibv_create_qp(dev.pd, &mut init) };
        if link.qp.is_null() {
            return Err(rdma_err(format!("ibv_create_qp: {}", errno_text())));
        }
        link.max_inline = init.cap.max_inline_data;
        // SAFETY: qp is live; qp_num is set by the driver at creation.
        let qpn = unsafe { (*link.qp).qp_num };
        // SAFETY: the MR was registered by open_device/start and lives as long as `dev`.
        let rkey = unsafe { (*dev.region_mr).rkey };
        let mine = Endpoint {
            lid: dev.lid,
            qpn,
            psn: psn(),
            gid: dev.gid,
            addr: self.region.base_ptr() as u64,
            rkey,
            wake_slots: self.region.wake_slots() as u32,
            len: self.region.len() as u64,
        };
        // RESET -> INIT
        // SAFETY: plain C struct, zero is a valid starting value.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = dev.port;
        a.qp_access_flags = ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        use ffi::ibv_qp_attr_mask as qpm;
        modify(
            link.qp,
            &mut a,
            (qpm::IBV_QP_STATE
                | qpm::IBV_QP_PKEY_INDEX
                | qpm::IBV_QP_PORT
                | qpm::IBV_QP_ACCESS_FLAGS)
                .0,
            "INIT",
        )?;
        post_recvs(link.qp, peer, RECV_DEPTH)?;
        // swap endpoints (both sides write first: 56 bytes always fit the socket buffer)
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(io)?;
        s.write_all(&mine.encode()).map_err(io)?;
        let mut b = [0u8; ENDPOINT_BYTES];
        s.read_exact(&mut b).map_err(io)?;
        link.remote = Endpoint::decode(&b)
            .map_err(|why| rdma_err(format!("node {peer} sent a bad endpoint: {why}")))?;
        // INIT -> RTR
        // SAFETY: plain C struct, zero is a valid starting value.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = dev.mtu;
        a.dest_qp_num = link.remote.qpn;
        a.rq_psn = link.remote.psn;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        a.ah_attr.dlid = link.remote.lid;
        a.ah_attr.port_num = dev.port;
        if dev.ethernet || link.remote.gid != [0; 16] {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = ffi::ibv_gid {
                raw: link.remote.gid,
            };
            a.ah_attr.grh.sgid_index = dev.gid_index;
            a.ah_attr.grh.hop_limit = 64;
        }
        modify(
            link.qp,
            &mut a,
            (qpm::IBV_QP_STATE
                | qpm::IBV_QP_AV
                | qpm::IBV_QP_PATH_MTU
                | qpm::IBV_QP_DEST_QPN
                | qpm::IBV_QP_RQ_PSN
                | qpm::IBV_QP_MAX_DEST_RD_ATOMIC
                | qpm::IBV_QP_MIN_RNR_TIMER)
                .0,
            "RTR",
        )?;
        // RTR -> RTS
        // SAFETY: plain C struct, zero is a valid starting value.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.sq_psn = mine.psn;
        a.max_rd_atomic = 1;
        modify(
            link.qp,
            &mut a,
            (qpm::IBV_QP_STATE
                | qpm::IBV_QP_TIMEOUT
                | qpm::IBV_QP_RETRY_CNT
                | qpm::IBV_QP_RNR_RETRY
                | qpm::IBV_QP_SQ_PSN
                | qpm::IBV_QP_MAX_QP_RD_ATOMIC)
                .0,
            "RTS",
        )?;
        // both sides ready to receive before anyone writes
        s.write_all(b"R").map_err(io)?;
        let mut r = [0u8; 1];
        s.read_exact(&mut r).map_err(io)?;
        if r != *b"R" {
            return Err(rdma_err(format!("node {peer} did not confirm readiness")));
        }
        s.set_read_timeout(None).map_err(io)?;
        Ok(link)
    }

    fn mark_dead(&self, peer: u8, why: &str) {
        if let Some(Some(l)) = self.links.get(peer as usize) {
            if l.alive.swap(false, Ordering::AcqRel) && !self.closed.load(Ordering::Acquire) {
                log::error!("node {}: dropping node {peer}: {why}", self.node);
            }
            let _ = l.tcp.shutdown(Shutdown::Both);
        }
        self.region.wake_all();
    }

    /// Block on the peer's set-up connection; EOF or any byte means the peer is gone.
    fn watch(&self, peer: u8) {
        let Some(Some(l)) = self.links.get(peer as usize) else {
            return;
        };
        let mut b = [0u8; 1];
        let why = match (&l.tcp).read(&mut b) {
            Ok(0) => "connection closed".to_string(),
            Ok(_) => "unexpected bytes on the set-up connection".to_string(),
            Err(e) => format!("connection error ({e})"),
        };
        self.mark_dead(peer, &why);
    }

    /// Receive completions: wake mailbox waiters, repost receives, notice broken QPs.
    fn doorbell(&self) {
        let fd = {
            // SAFETY: channel is live for the life of `self`.
            unsafe { (*self.dev.channel).fd }
        };
        // SAFETY: recv_cq is live; arm it for the first event.
        unsafe { ffi::ibv_req_notify_cq(self.dev.recv_cq, 0) };
        // SAFETY: zeroed ibv_wc entries are valid output buffers.
        let mut wcs: Vec<ffi::ibv_wc> = (0..32).map(|_| unsafe { std::mem::zeroed() }).collect();
        while !self.closed.load(Ordering::Acquire) {
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: pfd is one valid pollfd; the 100 ms timeout lets shutdown be noticed.
            let ready = unsafe { libc::poll(&mut pfd, 1, 100) };
            if ready <= 0 {
                continue;
            }
            let mut cq: *mut ffi::ibv_cq = std::ptr::null_mut();
            let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: the fd is readable, so this does not block; out-pointers are valid.
            if unsafe { ffi::ibv_get_cq_event(self.dev.channel, &mut cq, &mut ctx) } != 0 {
                continue;
            }
            // SAFETY: one event was taken from this CQ; re-arm before draining so no
            // completion slips between the drain and the next event.
            unsafe {
                ffi::ibv_ack_cq_events(cq, 1);
                ffi::ibv_req_notify_cq(cq, 0);
            }
            loop {
                // SAFETY: wcs has room for wcs.len() completions.
                let n = unsafe { ffi::ibv_poll_cq(cq, wcs.len() as i32, wcs.as_mut_ptr()) };
                if n <= 0 {
                    break;
                }
                for wc in &wcs[..n as usize] {
                    let peer = wc.wr_id as u8;
                    if wc.status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
                        self.mark_dead(
                            peer,
                            &format!("receive completion {}", status_text(wc.status)),
                        );
                        continue;
                    }
                    if wc.opcode == ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM {
                        // SAFETY: WITH_IMM completions carry the immediate in this union field.
                        let imm =
                            u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data });
                        match imm_slot(imm, self.region.wake_slots()) {
                            Some(slot) => self.region.wake_slot(slot),
                            None => log::warn!("node {}: node {peer} sent immediate {imm} outside the mailbox area", self.node),
                        }
                    }
                    if let Some(Some(l)) = self.links.get(peer as usize) {
                        if post_recvs(l.qp, peer, 1).is_err() {
                            self.mark_dead(peer, "cannot repost receives");
                        }
                    }
                }
            }
        }
    }
}

fn status_text(status: ffi::ibv_wc_status::Type) -> String {
    // SAFETY: ibv_wc_status_str returns a static NUL-terminated string for any value.
    let s = unsafe { ffi::ibv_wc_status_str(status) };
    if s.is_null() {
        return format!("status {status}");
    }
    // SAFETY: non-null static C string.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

impl RdmaTransport {
    /// Open the RDMA device, register `region`, connect to every peer (TCP for set-up) and
    /// bring up one RC queue pair per peer. Fails at once, before any network traffic, when
    /// the machine has no usable RDMA device.
    pub fn start(
        cfg: RdmaConfig,
        listener: TcpListener,
        region: Arc<Region>,
    ) -> Result<Arc<Self>, MsgError> {
        let mut dev = open_device(&cfg)?;
        dev.region_mr = register(dev.pd, region.base_ptr(), region.len(), true)?;
        let (streams, listener) = connect_mesh(&cfg.tcp, listener, MAGIC)?;
        // a restarted node is not taken back over rdma: refuse every later connection
        let me = cfg.tcp.node;
        std::thread::Builder::new()
            .name(format!("shoal-tcp-reject-{me}"))
            .spawn(move || reject_strangers(listener, me))
            .map_err(io)?;
        let nodes = streams.len() as u8;
        let mut inner = Inner {
            node: cfg.tcp.node,
            nodes,
            links: Vec::new(),
            dev,
            region,
            closed: AtomicBool::new(false),
        };
        let mut links = Vec::with_capacity(nodes as usize);
        for (i, s) in streams.into_iter().enumerate() {
            links.push(match s {
                None => None,
                Some(l) => Some(inner.connect(i as u8, l.stream)?),
            });
        }
        inner.links = links;
        let inner = Arc::new(inner);
        let t = Arc::clone(&inner);
        std::thread::Builder::new()
            .name(format!("shoal-rdma-doorbell-{}", inner.node))
            .spawn(move || t.doorbell())
            .map_err(io)?;
        for (i, l) in inner.links.iter().enumerate() {
            if l.is_some() {
                let t = Arc::clone(&inner);
                std::thread::Builder::new()
                    .name(format!("shoal-rdma-watch-{}-{i}", inner.node))
                    .spawn(move || t.watch(i as u8))
                    .map_err(io)?;
            }
        }
        Ok(Arc::new(RdmaTransport { inner }))
    }

    /// Close every connection (peers see this node die); threads exit within 100 ms.
    pub fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::Release);
        for (i, l) in self.inner.links.iter().enumerate() {
            if l.is_some() {
                self.inner.mark_dead(i as u8, "shutdown");
            }
        }
    }
}

impl Drop for RdmaTransport {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Transport for RdmaTransport {
    fn sever(&self, peer: u8) {
        self.inner
            .mark_dead(peer, "it took no message for the credit timeout");
    }
    fn node(&self) -> u8 {
        self.inner.node
    }
    fn nodes(&self) -> u8 {
        self.inner.nodes
    }
    fn region(&self) -> &Region {
        &self.inner.region
    }
    fn write(&self, peer: u8, offset: usize, data: &[u8]) -> Result<(), MsgError> {
        let inner = &self.inner;
        if peer == inner.node {
            return inner.region.apply(offset, data);
        }
        let l = match inner.links.get(peer as usize) {
            Some(Some(l)) => l,
            _ => return Err(MsgError::NoSuchPeer(peer, inner.nodes)),
        };
        if !l.alive.load(Ordering::Acquire) {
            return Err(MsgError::PeerDead(peer));
        }
        let plan = plan_write(&l.remote, offset, data.len(), l.max_inline)?;
        let st = l.send.lock();
        let mut flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let sge_addr = if plan.inline {
            flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
            data.as_ptr() as u64
        } else {
            // SAFETY: the staging buffer is ours alone while the lock is held, and it is at
            // least MAX_WRITE >= data.len() bytes (checked by plan_write).
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), st.buf.as_ptr() as *mut u8, data.len())
            };
            st.buf.as_ptr() as u64
        };
        let mut sge = ffi::ibv_sge {
            addr: sge_addr,
            length: data.len() as u32,
            lkey: if plan.inline {
                0
            } else {
                // SAFETY: the staging MR lives as long as the link.
                unsafe { (*st.mr).lkey }
            },
        };
        // SAFETY: plain C struct, zero is a valid starting value.
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.send_flags = flags;
        wr.wr.rdma = ffi::rdma_t {
            remote_addr: plan.remote_addr,
            rkey: l.remote.rkey,
        };
        match plan.imm {
            Some(slot) => {
                wr.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                wr.imm_data_invalidated_rkey_union.imm_data = slot.to_be();
            }
            None => wr.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        }
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; wr, sge and the source bytes stay valid until the completion
        // is polled below (inline data is copied during the call).
        let rc = unsafe { ffi::ibv_post_send(l.qp, &mut wr, &mut bad) };
        if rc != 0 {
            drop(st);
            inner.mark_dead(
                peer,
                &format!("post_send: {}", std::io::Error::from_raw_os_error(rc)),
            );
            return Err(MsgError::PeerDead(peer));
        }
        // SAFETY: a zeroed ibv_wc is a valid output buffer.
        let mut wc: ffi::ibv_wc = unsafe { std::mem::zeroed() };
        let deadline = Instant::now() + SEND_TIMEOUT;
        loop {
            // SAFETY: the send CQ is live and polled only under the link's lock.
            let n = unsafe { ffi::ibv_poll_cq(l.send_cq, 1, &mut wc) };
            if n == 1 {
                break;
            }
            if n < 0 || Instant::now() > deadline {
                drop(st);
                inner.mark_dead(peer, "no send completion");
                return Err(MsgError::PeerDead(peer));
            }
            std::hint::spin_loop();
        }
        drop(st);
        if wc.status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
            inner.mark_dead(
                peer,
                &format!("write completion: {}", status_text(wc.status)),
            );
            return Err(MsgError::PeerDead(peer));
        }
        Ok(())
    }
    fn peer_alive(&self, peer: u8) -> bool {
        peer == self.inner.node
            || matches!(self.inner.links.get(peer as usize), Some(Some(l)) if l.alive.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn ep() -> Endpoint {
        Endpoint {
            lid: 7,
            qpn: 0x1234,
            psn: 0xABCDE,
            gid: [3; 16],
            addr: 0x7f00_0000_1000,
            rkey: 99,
            wake_slots: 16,
            len: 16 * 64 + 4096 * 4,
        }
    }

    #[test]
    fn endpoint_round_trips_and_rejects_impossible_fields() {
        let e = ep();
        assert_eq!(Endpoint::decode(&e.encode()), Ok(e));
        let bad = |f: &dyn Fn(&mut Endpoint)| {
            let mut x = ep();
            f(&mut x);
            Endpoint::decode(&x.encode()).unwrap_err()
        };
        assert!(bad(&|x| x.qpn = 0).contains("24-bit"));
        assert!(bad(&|x| x.qpn = 1 << 24).contains("24-bit"));
        assert!(bad(&|x| x.psn = 1 << 24).contains("24 bits"));
        assert!(bad(&|x| x.addr = 0).contains("null"));
        assert!(bad(&|x| x.addr = 0x1001).contains("unaligned"));
        assert!(bad(&|x| x.len = 0).contains("empty"));
        assert!(bad(&|x| x.len = 100).contains("unaligned"));
        assert!(bad(&|x| x.len = u64::MAX - 7).contains("wraps"));
        assert!(bad(&|x| x.wake_slots = 1000).contains("do not fit"));
        let mut b = e.encode();
        b[0] = b'X';
        assert!(Endpoint::decode(&b).unwrap_err().contains("tag"));
        let mut b = e.encode();
        b[7] = 1;
        assert!(Endpoint::decode(&b).unwrap_err().contains("reserved"));
    }

    #[test]
    fn random_endpoint_bytes_never_panic() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            let mut b = [0u8; ENDPOINT_BYTES];
            for byte in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *byte = x as u8;
            }
            b[0..4].copy_from_slice(&ENDPOINT_TAG);
            if let Ok(e) = Endpoint::decode(&b) {
                // whatever decodes must satisfy the invariants the writer relies on
                assert!(e.qpn != 0 && e.qpn <= MASK_24 && e.psn <= MASK_24);
                assert!(e.wake_slots as u64 * 64 <= e.len);
            }
        }
    }

    #[test]
    fn writes_are_planned_inline_staged_and_with_immediates() {
        let e = ep();
        // a 64-byte message into slot 3: inline, wakes slot 3
        let p = plan_write(&e, 3 * 64, 64, 64).unwrap();
        assert_eq!(
            p,
            WritePlan {
                remote_addr: e.addr + 192,
                inline: true,
                imm: Some(3)
            }
        );
        // a page into the frame area: staged, no immediate
        let p = plan_write(&e, 16 * 64, 4096, 64).unwrap();
        assert!(!p.inline);
        assert_eq!(p.imm, None);
        assert_eq!(p.remote_addr, e.addr + 1024);
        // a NIC that grants no inline data stages even small messages
        assert!(!plan_write(&e, 0, 64, 0).unwrap().inline);
        // a write ending in the last mailbox slot wakes it; one past does not
        assert_eq!(plan_write(&e, 15 * 64, 64, 64).unwrap().imm, Some(15));
        assert_eq!(plan_write(&e, 15 * 64, 128, 64).unwrap().imm, None);
    }

    #[test]
    fn bad_writes_are_refused_before_posting() {
        let e = ep();
        for (off, len) in [
            (0usize, 0usize),
            (3, 8),
            (8, 7),
            (e.len as usize - 8, 16),
            (usize::MAX - 7, 16),
            (0, MAX_WRITE + 8),
        ] {
            assert!(
                matches!(
                    plan_write(&e, off, len, 64),
                    Err(MsgError::OutOfBounds { .. })
                ),
                "offset {off} len {len}"
            );
        }
    }

    #[test]
    fn immediates_outside_the_mailbox_area_are_ignored() {
        assert_eq!(imm_slot(0, 16), Some(0));
        assert_eq!(imm_slot(15, 16), Some(15));
        assert_eq!(imm_slot(16, 16), None);
        assert_eq!(imm_slot(u32::MAX, 16), None);
    }

    #[test]
    fn unknown_device_name_is_a_clear_error() {
        let mut tcp = TcpConfig::new(0, 1, vec!["127.0.0.1:1".parse().unwrap()]);
        tcp.connect_timeout = Duration::from_secs(1);
        let mut cfg = RdmaConfig::new(tcp);
        cfg.device = Some("shoal-no-such-device".into());
        match open_device(&cfg) {
            Err(MsgError::Rdma(m)) => assert!(
                m.contains("shoal-no-such-device") || m.contains("no RDMA device"),
                "{m}"
            ),
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("opened a device that does not exist"),
        }
    }

    /// Without an RDMA device `start` fails with a clear error before touching the network
    /// (the peer address below does not exist). On a machine with a device the check is
    /// skipped: that path needs two nodes.
    #[test]
    fn no_device_fails_fast_and_clearly() {
        if !device_names().is_empty() {
            eprintln!("RDMA devices present ({:?}): skipping", device_names());
            return;
        }
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let me: SocketAddr = listener.local_addr().unwrap();
        let cfg = RdmaConfig::new(TcpConfig {
            node: 0,
            cluster_id: 1,
            addrs: vec![me, "127.0.0.1:9".parse().unwrap()],
            connect_timeout: Duration::from_secs(30),
            secret: Vec::new(),
            encrypt: false,
            incarnation: 1,
            messages_version: 0,
        });
        let region = Arc::new(Region::new(4096, vec![], 0).unwrap());
        // Had `start` dialled node 1 (nothing listens there) it would fail with a handshake
        // error after the connect timeout: the Rdma error shows the device check came first.
        match RdmaTransport::start(cfg, listener, region) {
            Err(MsgError::Rdma(m)) => {
                assert!(m.contains("no RDMA device"), "{m}");
                assert!(m.contains("tcp transport"), "{m}");
            }
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("started without a device"),
        }
    }
}
