//! An RDMA device, opened: its context, protection domain, completion queue and registered
//! memory; the list of devices on the machine.

use super::*;

pub(super) fn errno_text() -> String {
    std::io::Error::last_os_error().to_string()
}

/// Names of the `n` devices of a list from `ibv_get_device_list`.
///
/// # Safety
/// `list` must be a live list from `ibv_get_device_list` holding `n` devices.
unsafe fn names_in(list: *mut *mut ffi::ibv_device, n: i32) -> Vec<String> {
    let mut names = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: i < n, the array holds n valid device pointers (caller's contract); the name
        // is a NUL-terminated string owned by the device, copied out here.
        unsafe {
            let name = ffi::ibv_get_device_name(*list.add(i));
            if !name.is_null() {
                names.push(CStr::from_ptr(name).to_string_lossy().into_owned());
            }
        }
    }
    names
}

/// Names of the RDMA devices on this machine (empty when there are none).
pub fn device_names() -> Vec<String> {
    let mut n: i32 = 0;
    // SAFETY: ibv_get_device_list writes the count through the valid pointer and returns a
    // NULL-terminated array (or NULL) that we free below with ibv_free_device_list.
    let list = unsafe { ffi::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Vec::new();
    }
    // SAFETY: `list` is live and holds `n` devices; it is freed once, after the names were copied.
    unsafe {
        let names = names_in(list, n);
        ffi::ibv_free_device_list(list);
        names
    }
}

/// Verbs objects of one node: device context, protection domain, the registered region, the
/// shared receive completion queue and its completion channel.
pub(super) struct Device {
    pub(super) ctx: *mut ffi::ibv_context,
    pub(super) pd: *mut ffi::ibv_pd,
    pub(super) region_mr: *mut ffi::ibv_mr,
    pub(super) channel: *mut ffi::ibv_comp_channel,
    pub(super) recv_cq: *mut ffi::ibv_cq,
    pub(super) port: u8,
    pub(super) gid_index: u8,
    pub(super) lid: u16,
    pub(super) gid: [u8; 16],
    pub(super) mtu: ffi::ibv_mtu::Type,
    pub(super) ethernet: bool,
}

/// Open the device named in `cfg` (or the first one) and check its port. Fails with a clear
/// [`MsgError::Rdma`] when the machine has no RDMA device.
pub(super) fn open_device(cfg: &RdmaConfig) -> Result<Device, MsgError> {
    let mut n: i32 = 0;
    // SAFETY: as in `device_names`; freed on every path below.
    let list = unsafe { ffi::ibv_get_device_list(&mut n) };
    if list.is_null() || n <= 0 {
        let why = if list.is_null() {
            format!(" ({})", errno_text())
        } else {
            String::new()
        };
        if !list.is_null() {
            // SAFETY: from ibv_get_device_list, freed once.
            unsafe { ffi::ibv_free_device_list(list) };
        }
        return Err(rdma_err(format!(
            "no RDMA device found{why}: the rdma transport needs an InfiniBand or RoCE NIC with \
             its driver loaded; use the tcp transport on machines without one"
        )));
    }
    // SAFETY: `list` is live (freed on every path below) and holds `n` devices.
    let names = unsafe { names_in(list, n) };
    let index = match &cfg.device {
        None => Some(0),
        Some(want) => names.iter().position(|n| n == want),
    };
    let Some(index) = index.filter(|&i| i < n as usize) else {
        // SAFETY: from ibv_get_device_list, freed once.
        unsafe { ffi::ibv_free_device_list(list) };
        return Err(rdma_err(format!(
            "RDMA device {:?} not found (devices here: {names:?})",
            cfg.device.as_deref().unwrap_or("")
        )));
    };
    let name = names.get(index).cloned().unwrap_or_default();
    // SAFETY: index < n; the device pointer is valid until the list is freed, and an opened
    // context stays valid after freeing the list (libibverbs keeps the device referenced).
    let ctx = unsafe { ffi::ibv_open_device(*list.add(index)) };
    // SAFETY: from ibv_get_device_list, freed once.
    unsafe { ffi::ibv_free_device_list(list) };
    if ctx.is_null() {
        return Err(rdma_err(format!(
            "cannot open RDMA device {name}: {}",
            errno_text()
        )));
    }
    let mut dev = Device {
        ctx,
        pd: std::ptr::null_mut(),
        region_mr: std::ptr::null_mut(),
        channel: std::ptr::null_mut(),
        recv_cq: std::ptr::null_mut(),
        port: cfg.port,
        gid_index: cfg.gid_index,
        lid: 0,
        gid: [0; 16],
        mtu: ffi::ibv_mtu::IBV_MTU_1024,
        ethernet: false,
    };
    // SAFETY: ibv_port_attr is a plain C struct; all-zero is a valid value to be filled in.
    let mut attr: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: ctx is an open context, attr a valid out-pointer.
    if unsafe { ffi::___ibv_query_port(ctx, cfg.port, &mut attr) } != 0 {
        return Err(rdma_err(format!(
            "cannot query port {} of {name}: {}",
            cfg.port,
            errno_text()
        )));
    }
    if attr.state != ffi::ibv_port_state::IBV_PORT_ACTIVE {
        return Err(rdma_err(format!(
            "port {} of {name} is not active (state {})",
            cfg.port, attr.state
        )));
    }
    dev.lid = attr.lid;
    dev.mtu = attr.active_mtu;
    dev.ethernet = attr.link_layer == LINK_LAYER_ETHERNET;
    // SAFETY: ibv_gid is a plain union of bytes; zero is valid.
    let mut gid: ffi::ibv_gid = unsafe { std::mem::zeroed() };
    // SAFETY: ctx open, gid a valid out-pointer.
    if unsafe { ffi::ibv_query_gid(ctx, cfg.port, cfg.gid_index as i32, &mut gid) } != 0 {
        return Err(rdma_err(format!(
            "cannot read GID {} of {name} port {}: {}",
            cfg.gid_index,
            cfg.port,
            errno_text()
        )));
    }
    // SAFETY: every bit pattern of the union is a valid byte array.
    dev.gid = unsafe { gid.raw };
    // SAFETY: ctx is open; a NULL result is checked.
    dev.pd = unsafe { ffi::ibv_alloc_pd(ctx) };
    if dev.pd.is_null() {
        return Err(rdma_err(format!("ibv_alloc_pd: {}", errno_text())));
    }
    // SAFETY: ctx is open; a NULL result is checked.
    dev.channel = unsafe { ffi::ibv_create_comp_channel(ctx) };
    if dev.channel.is_null() {
        return Err(rdma_err(format!(
            "ibv_create_comp_channel: {}",
            errno_text()
        )));
    }
    let cqe = (RECV_DEPTH * cfg.tcp.addrs.len().max(1) as u32) as i32;
    // SAFETY: ctx and channel are valid; a NULL result is checked.
    dev.recv_cq = unsafe { ffi::ibv_create_cq(ctx, cqe, std::ptr::null_mut(), dev.channel, 0) };
    if dev.recv_cq.is_null() {
        return Err(rdma_err(format!("ibv_create_cq: {}", errno_text())));
    }
    Ok(dev)
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: each object was created by this Device, is destroyed once, in reverse order of
        // creation, after every queue pair using it was destroyed (Links drop first, see Inner).
        unsafe {
            if !self.region_mr.is_null() {
                ffi::ibv_dereg_mr(self.region_mr);
            }
            if !self.recv_cq.is_null() {
                ffi::ibv_destroy_cq(self.recv_cq);
            }
            if !self.channel.is_null() {
                ffi::ibv_destroy_comp_channel(self.channel);
            }
            if !self.pd.is_null() {
                ffi::ibv_dealloc_pd(self.pd);
            }
            ffi::ibv_close_device(self.ctx);
        }
    }
}

pub(super) fn register(
    pd: *mut ffi::ibv_pd,
    ptr: *mut u8,
    len: usize,
    remote: bool,
) -> Result<*mut ffi::ibv_mr, MsgError> {
    let mut access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    if remote {
        access |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    // SAFETY: ptr..ptr+len is memory owned by the caller that outlives the registration (the
    // region and staging buffers are dropped only after their MR is deregistered).
    let mr = unsafe { ffi::ibv_reg_mr(pd, ptr.cast(), len, access as i32) };
    if mr.is_null() {
        return Err(rdma_err(format!(
            "cannot register {len} bytes with the NIC: {} (check `ulimit -l`)",
            errno_text()
        )));
    }
    Ok(mr)
}
