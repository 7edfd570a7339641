//! The only `unsafe` of the rdma transport: thin RAII wrappers over the
//! libibverbs and librdmacm objects it uses (through `rdma-sys`).
//!
//! Ownership mirrors what the hardware needs, and `Arc`s enforce the order
//! in which things are destroyed: a [`CmId`] with a queue pair holds its
//! [`ProtectionDomain`] and [`CompletionQueue`]; memory regions and
//! completion queues hold their protection domain or [`Device`]; the
//! protection domain holds the [`Device`], whose anchor id keeps the device
//! context open; every id holds its [`EventChannel`]. So a queue pair is
//! always destroyed before its completion queue, which goes before the
//! protection domain, which goes before the context and the channel.
//!
//! Only the data-path post ([`CmId::post_writes`]) stays `unsafe fn`: the
//! staged bytes it sends must stay put until the request completes.

use std::ffi::CStr;
use std::io;
use std::net::SocketAddr;
use std::os::raw::{c_int, c_void};
use std::sync::Arc;
use std::time::Duration;

use rdma_sys as sys;

use crate::region::{map_shared, Region};

/// Why a verb failed: one variant per verb, each with the OS error.
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    /// `ibv_get_device_list` found no RDMA device.
    #[error("no RDMA device found (ibv_get_device_list returned none)")]
    NoDevice,
    /// `ibv_get_device_list` failed for another reason.
    #[error("ibv_get_device_list: {0}")]
    GetDeviceList(io::Error),
    /// `ibv_fork_init` failed.
    #[error("ibv_fork_init: {0}")]
    ForkInit(io::Error),
    /// `ibv_query_device` failed.
    #[error("ibv_query_device: {0}")]
    QueryDevice(io::Error),
    /// No device context could be found for the bound address.
    #[error("no RDMA device context for {0} (rdma_get_devices returned none)")]
    NoContext(SocketAddr),
    /// `rdma_create_event_channel` failed.
    #[error("rdma_create_event_channel: {0}")]
    CreateEventChannel(io::Error),
    /// `rdma_get_cm_event` (or polling its channel) failed.
    #[error("rdma_get_cm_event: {0}")]
    GetEvent(io::Error),
    /// `rdma_create_id` failed.
    #[error("rdma_create_id: {0}")]
    CreateId(io::Error),
    /// `rdma_bind_addr` failed.
    #[error("rdma_bind_addr {addr}: {source}{}", bind_hint(source))]
    BindAddr {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// `rdma_listen` failed.
    #[error("rdma_listen: {0}")]
    Listen(io::Error),
    /// `rdma_resolve_addr` failed.
    #[error("rdma_resolve_addr {addr}: {source}")]
    ResolveAddr {
        /// The peer address.
        addr: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// `rdma_resolve_route` failed.
    #[error("rdma_resolve_route: {0}")]
    ResolveRoute(io::Error),
    /// `rdma_connect` failed.
    #[error("rdma_connect: {0}")]
    Connect(io::Error),
    /// `rdma_accept` failed.
    #[error("rdma_accept: {0}")]
    Accept(io::Error),
    /// `rdma_reject` failed.
    #[error("rdma_reject: {0}")]
    Reject(io::Error),
    /// `ibv_alloc_pd` failed.
    #[error("ibv_alloc_pd: {0}")]
    AllocProtectionDomain(io::Error),
    /// `ibv_reg_mr` failed.
    #[error("ibv_reg_mr ({what}, {len} bytes): {source}{}", memlock_hint(source))]
    RegisterMemoryRegion {
        /// Which memory.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The OS error.
        source: io::Error,
    },
    /// `ibv_create_cq` failed.
    #[error("ibv_create_cq: {0}")]
    CreateCompletionQueue(io::Error),
    /// `rdma_create_qp` failed.
    #[error("rdma_create_qp: {0}")]
    CreateQueuePair(io::Error),
    /// `ibv_modify_qp` failed.
    #[error("ibv_modify_qp: {0}")]
    ModifyQueuePair(io::Error),
    /// `ibv_post_send` failed.
    #[error("ibv_post_send: {0}")]
    PostSend(io::Error),
    /// `ibv_poll_cq` failed.
    #[error("ibv_poll_cq: {0}")]
    PollCompletionQueue(io::Error),
    /// `mmap` of a staging buffer failed.
    #[error("mmap of a {len}-byte staging buffer: {source}")]
    Mmap {
        /// Its length.
        len: usize,
        /// The OS error.
        source: io::Error,
    },
}

impl RdmaError {
    /// Whether this is a bind to an address some other id (in this or
    /// another process) already holds.
    pub fn is_addr_in_use(&self) -> bool {
        matches!(self, RdmaError::BindAddr { source, .. } if source.raw_os_error() == Some(libc::EADDRINUSE))
    }
}

fn bind_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ENODEV) | Some(libc::EADDRNOTAVAIL) => {
            " (this address is not on an RDMA-capable interface: give the node a control address on its RDMA NIC)"
        }
        _ => "",
    }
}

fn memlock_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ENOMEM) | Some(libc::EPERM) | Some(libc::EFAULT) => {
            " (registering memory pins it: raise the locked-memory limit, e.g. `ulimit -l unlimited` or LimitMEMLOCK=infinity, or grant CAP_IPC_LOCK)"
        }
        _ => "",
    }
}

/// `-1` + errno convention (librdmacm).
fn check(ret: c_int) -> io::Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Error-number-as-return-value convention (ibv_modify_qp, ibv_post_send).
fn check_errno(ret: c_int) -> io::Result<()> {
    match ret {
        0 => Ok(()),
        r if r > 0 => Err(io::Error::from_raw_os_error(r)),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Names of the RDMA devices on this host; [`RdmaError::NoDevice`] when
/// there is none.
pub fn device_names() -> Result<Vec<String>, RdmaError> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the call returns NULL or a
    // NULL-terminated array of `n` devices that we free below.
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        let e = io::Error::last_os_error();
        // No device, no provider or no kernel support: NULL with ENOSYS
        // (what a host without RDMA gives), ENODEV or no errno at all.
        return match e.raw_os_error() {
            None | Some(0) | Some(libc::ENOSYS) | Some(libc::ENODEV) | Some(libc::ENOENT) => {
                Err(RdmaError::NoDevice)
            }
            _ => Err(RdmaError::GetDeviceList(e)),
        };
    }
    let mut names = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: `list` holds `n` valid device pointers (checked non-null
        // above); ibv_get_device_name returns a C string owned by the
        // device, copied before the list is freed.
        unsafe {
            let dev = *list.add(i);
            if dev.is_null() {
                break;
            }
            let name = sys::ibv_get_device_name(dev);
            if !name.is_null() {
                names.push(CStr::from_ptr(name).to_string_lossy().into_owned());
            }
        }
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { sys::ibv_free_device_list(list) };
    if names.is_empty() {
        return Err(RdmaError::NoDevice);
    }
    Ok(names)
}

/// Whether pages registered by this process may be copied-on-write away
/// from the device when it forks (old kernels without fork support, and
/// neither `ibv_fork_init` nor `RDMAV_FORK_SAFE` used).
pub fn fork_unsafe() -> bool {
    // SAFETY: a status query without arguments.
    unsafe { sys::ibv_is_fork_initialized() == sys::IBV_FORK_DISABLED }
}

/// Keeps registered memory (and the providers' queue buffers) out of
/// forked children, so a fork cannot copy them away from the device. Must
/// come before the process's first other verbs call to take effect.
pub fn fork_init() -> Result<(), RdmaError> {
    // SAFETY: no arguments; it only sets libibverbs' global fork mode.
    check_errno(unsafe { sys::ibv_fork_init() }).map_err(RdmaError::ForkInit)
}

/// A socket address in the C layout librdmacm takes.
enum RawAddr {
    V4(libc::sockaddr_in),
    V6(libc::sockaddr_in6),
}

impl RawAddr {
    fn new(a: SocketAddr) -> RawAddr {
        match a {
            SocketAddr::V4(a) => RawAddr::V4(libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            }),
            SocketAddr::V6(a) => RawAddr::V6(libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            }),
        }
    }

    fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        match self {
            RawAddr::V4(a) => a as *mut libc::sockaddr_in as *mut libc::sockaddr,
            RawAddr::V6(a) => a as *mut libc::sockaddr_in6 as *mut libc::sockaddr,
        }
    }
}

// ---------------------------------------------------------------------------
// Event channel and events

/// A connection-manager event channel (its fd is non-blocking).
pub struct EventChannel {
    raw: *mut sys::rdma_event_channel,
}

// SAFETY: librdmacm event channels may be used from any thread; the only
// state is the kernel fd, and rdma_get_cm_event is thread-safe.
unsafe impl Send for EventChannel {}
// SAFETY: as above.
unsafe impl Sync for EventChannel {}

impl EventChannel {
    /// Creates a channel.
    pub fn new() -> Result<Arc<EventChannel>, RdmaError> {
        // SAFETY: no arguments; NULL is checked.
        let raw = unsafe { sys::rdma_create_event_channel() };
        if raw.is_null() {
            return Err(RdmaError::CreateEventChannel(io::Error::last_os_error()));
        }
        let ch = EventChannel { raw };
        let fd = ch.fd();
        // SAFETY: fcntl on the channel's own open fd.
        let ok = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(RdmaError::CreateEventChannel(io::Error::last_os_error()));
        }
        Ok(Arc::new(ch))
    }

    fn fd(&self) -> c_int {
        // SAFETY: `raw` is a live channel until Drop.
        unsafe { (*self.raw).fd }
    }

    /// The next event, waiting at most `timeout`; `None` if none came.
    /// The event is acknowledged before this returns (what callers need
    /// is copied), so destroying its id never waits for it.
    pub fn next_event(self: &Arc<Self>, timeout: Duration) -> Result<Option<CmEvent>, RdmaError> {
        if let Some(e) = self.try_event()? {
            return Ok(Some(e));
        }
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(c_int::MAX as u128) as c_int;
        // SAFETY: one valid pollfd on the stack for the duration of the call.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(None);
            }
            return Err(RdmaError::GetEvent(e));
        }
        self.try_event()
    }

    fn try_event(self: &Arc<Self>) -> Result<Option<CmEvent>, RdmaError> {
        let mut ev: *mut sys::rdma_cm_event = std::ptr::null_mut();
        // SAFETY: `ev` is a valid out-pointer; the fd is non-blocking.
        if unsafe { sys::rdma_get_cm_event(self.raw, &mut ev) } != 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
                _ => Err(RdmaError::GetEvent(e)),
            };
        }
        // SAFETY: rdma_get_cm_event succeeded, so `ev` points to a live
        // event until rdma_ack_cm_event; the private data pointer (when not
        // NULL) is valid for `private_data_len` bytes until then. Every
        // event type we read `param.conn` of is a connection event.
        let event = unsafe {
            let e = &*ev;
            let (data, len) = (e.param.conn.private_data, e.param.conn.private_data_len);
            let private_data = if data.is_null() || len == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(data as *const u8, len as usize).to_vec()
            };
            let request = if e.event == sys::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST
                && !e.id.is_null()
            {
                // The new id of a connect request is ours to destroy; it
                // delivers its events on the listener's channel.
                Some(CmId {
                    raw: e.id,
                    qp: None,
                    channel: self.clone(),
                })
            } else {
                None
            };
            CmEvent {
                kind: e.event,
                status: e.status,
                id: e.id as usize,
                private_data,
                request,
            }
        };
        // SAFETY: acknowledging the event we got, exactly once.
        unsafe { sys::rdma_ack_cm_event(ev) };
        Ok(Some(event))
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id created on this channel holds an Arc to it, so
        // none is left when this runs.
        unsafe { sys::rdma_destroy_event_channel(self.raw) }
    }
}

/// Connection-manager event types this transport acts on.
pub use sys::rdma_cm_event_type as event;

/// A connection-manager event, acknowledged and copied.
pub struct CmEvent {
    /// The event type (see [`event`]).
    pub kind: u32,
    /// Its status (for REJECTED: the reject reason).
    pub status: i32,
    /// Identity of the id it is for (compare with [`CmId::key`]).
    pub id: usize,
    /// The private data it carried.
    pub private_data: Vec<u8>,
    request: Option<CmId>,
}

impl CmEvent {
    /// For a connect request: the new id, which the caller now owns.
    pub fn take_request(&mut self) -> Option<CmId> {
        self.request.take()
    }

    /// The event type's name.
    pub fn name(&self) -> String {
        event_name(self.kind)
    }
}

/// The name of an event type, for logs.
pub fn event_name(kind: u32) -> String {
    // SAFETY: rdma_event_str returns a static string for any value.
    unsafe {
        let s = sys::rdma_event_str(kind);
        if s.is_null() {
            format!("event {kind}")
        } else {
            CStr::from_ptr(s).to_string_lossy().into_owned()
        }
    }
}

// ---------------------------------------------------------------------------
// Connection ids (and the queue pairs on them)

/// Capabilities of a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send-queue depth.
    pub max_send_wr: u32,
    /// Largest inline payload.
    pub max_inline: u32,
}

/// A connection-manager id, with the reliable-connection queue pair created
/// on it, if any. Dropping it destroys the queue pair, then the id (which
/// disconnects a connected peer).
pub struct CmId {
    raw: *mut sys::rdma_cm_id,
    /// Present once a queue pair exists: what it was created with.
    qp: Option<(Arc<ProtectionDomain>, Arc<CompletionQueue>)>,
    channel: Arc<EventChannel>,
}

// SAFETY: librdmacm ids and ibv queue pairs may be used from any thread;
// the transport serialises posts to one queue pair behind a mutex.
unsafe impl Send for CmId {}
// SAFETY: as above; shared use is read-only queries and thread-safe verbs.
unsafe impl Sync for CmId {}

impl CmId {
    /// A reliable-connection (`RDMA_PS_TCP`) id on `channel`.
    pub fn new(channel: &Arc<EventChannel>) -> Result<CmId, RdmaError> {
        let mut raw: *mut sys::rdma_cm_id = std::ptr::null_mut();
        // SAFETY: valid channel and out-pointer; the id is destroyed in Drop.
        let r = unsafe {
            sys::rdma_create_id(
                channel.raw,
                &mut raw,
                std::ptr::null_mut(),
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        };
        check(r).map_err(RdmaError::CreateId)?;
        Ok(CmId {
            raw,
            qp: None,
            channel: channel.clone(),
        })
    }

    /// Identity for matching events ([`CmEvent::id`]).
    pub fn key(&self) -> usize {
        self.raw as usize
    }

    /// The channel this id's events arrive on.
    pub fn channel(&self) -> &Arc<EventChannel> {
        &self.channel
    }

    fn verbs(&self) -> *mut sys::ibv_context {
        // SAFETY: `raw` is live until Drop.
        unsafe { (*self.raw).verbs }
    }

    /// Binds to a local address (port 0: any free port).
    pub fn bind(&self, addr: SocketAddr) -> Result<(), RdmaError> {
        let mut a = RawAddr::new(addr);
        // SAFETY: live id and a sockaddr that outlives the call.
        let r = unsafe { sys::rdma_bind_addr(self.raw, a.as_mut_ptr()) };
        check(r).map_err(|source| RdmaError::BindAddr { addr, source })
    }

    /// Listens for connect requests (after [`Self::bind`]).
    pub fn listen(&self, backlog: i32) -> Result<(), RdmaError> {
        // SAFETY: live, bound id.
        check(unsafe { sys::rdma_listen(self.raw, backlog) }).map_err(RdmaError::Listen)
    }

    /// Starts resolving `dst` (from `src` when given); completes with an
    /// ADDR_RESOLVED or ADDR_ERROR event.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<(), RdmaError> {
        let mut s = src.map(RawAddr::new);
        let mut d = RawAddr::new(dst);
        let sp = s.as_mut().map_or(std::ptr::null_mut(), |s| s.as_mut_ptr());
        // SAFETY: live id; both sockaddrs outlive the call (librdmacm
        // copies them).
        let r = unsafe {
            sys::rdma_resolve_addr(self.raw, sp, d.as_mut_ptr(), timeout.as_millis() as c_int)
        };
        check(r).map_err(|source| RdmaError::ResolveAddr { addr: dst, source })
    }

    /// Starts resolving the route; completes with ROUTE_RESOLVED or
    /// ROUTE_ERROR.
    pub fn resolve_route(&self, timeout: Duration) -> Result<(), RdmaError> {
        // SAFETY: live id with a resolved address.
        let r = unsafe { sys::rdma_resolve_route(self.raw, timeout.as_millis() as c_int) };
        check(r).map_err(RdmaError::ResolveRoute)
    }

    /// Whether this id's device is the one `pd` belongs to.
    pub fn same_device(&self, pd: &ProtectionDomain) -> bool {
        self.verbs() == pd.device.ctx
    }

    /// Creates a reliable-connection queue pair on this id, both queues
    /// completing on `cq`. Returns the capabilities it got.
    pub fn create_qp(
        &mut self,
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        want: QpCaps,
    ) -> Result<QpCaps, RdmaError> {
        // SAFETY: ibv_qp_init_attr is plain data (pointers and integers);
        // all-zero is its documented "unset" state.
        let mut attr: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq.raw;
        attr.recv_cq = cq.raw;
        attr.cap.max_send_wr = want.max_send_wr.max(1);
        attr.cap.max_recv_wr = 1;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        attr.cap.max_inline_data = want.max_inline;
        attr.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        // SAFETY: live id, live pd and cq (kept alive by the Arcs stored
        // below for as long as the queue pair exists), valid attr.
        let r = unsafe { sys::rdma_create_qp(self.raw, pd.raw, &mut attr) };
        check(r).map_err(RdmaError::CreateQueuePair)?;
        self.qp = Some((pd.clone(), cq.clone()));
        Ok(QpCaps {
            max_send_wr: attr.cap.max_send_wr,
            max_inline: attr.cap.max_inline_data,
        })
    }

    /// Sends a connect request carrying `private_data`; completes with
    /// ESTABLISHED, REJECTED, UNREACHABLE or CONNECT_ERROR.
    pub fn connect(&self, private_data: &[u8]) -> Result<(), RdmaError> {
        let mut p = conn_param(private_data);
        // SAFETY: live id with a queue pair; the parameters and private
        // data outlive the call (librdmacm copies them).
        check(unsafe { sys::rdma_connect(self.raw, &mut p) }).map_err(RdmaError::Connect)
    }

    /// Accepts a connect request, answering with `private_data`.
    pub fn accept(&self, private_data: &[u8]) -> Result<(), RdmaError> {
        let mut p = conn_param(private_data);
        // SAFETY: as for `connect`.
        check(unsafe { sys::rdma_accept(self.raw, &mut p) }).map_err(RdmaError::Accept)
    }

    /// Refuses a connect request, answering with `private_data`.
    pub fn reject(&self, private_data: &[u8]) -> Result<(), RdmaError> {
        // SAFETY: live id of a connect request; data outlives the call.
        let r = unsafe {
            sys::rdma_reject(
                self.raw,
                private_data.as_ptr() as *const c_void,
                private_data.len().min(u8::MAX as usize) as u8,
            )
        };
        check(r).map_err(RdmaError::Reject)
    }

    /// Grants or revokes the peer's remote-write access to this queue pair
    /// (fencing: a revoked writer's next WRITE fails with a remote access
    /// error and its queue pair breaks).
    pub fn set_remote_write(&self, allowed: bool) -> Result<(), RdmaError> {
        // SAFETY: `raw` is live; its qp is checked below.
        let qp = unsafe { (*self.raw).qp };
        if qp.is_null() {
            return Ok(());
        }
        // SAFETY: plain data, zero is "unset" for every field not in the mask.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_access_flags = if allowed {
            sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
        } else {
            0
        };
        let mask = sys::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0 as c_int;
        // SAFETY: live queue pair, valid attr for the given mask.
        check_errno(unsafe { sys::ibv_modify_qp(qp, &mut attr, mask) })
            .map_err(RdmaError::ModifyQueuePair)
    }

    /// Posts RDMA WRITEs, chained, in order.
    ///
    /// # Safety
    /// For every [`Source::Staged`] request, `[addr, addr + len)` must lie
    /// in a memory region registered on this queue pair's protection domain
    /// under `lkey`, and those bytes must stay mapped and unchanged until
    /// the request (or a later signaled one) completes or this queue pair
    /// is destroyed. Inline sources are copied during the call.
    pub unsafe fn post_writes(&self, wrs: &[WriteWr<'_>]) -> Result<(), RdmaError> {
        const CHAIN: usize = 16;
        // SAFETY: `raw` is live.
        let qp = unsafe { (*self.raw).qp };
        if qp.is_null() {
            return Err(RdmaError::PostSend(io::Error::from_raw_os_error(
                libc::ENOTCONN,
            )));
        }
        for chunk in wrs.chunks(CHAIN) {
            // SAFETY: ibv_sge and ibv_send_wr are plain data (integers,
            // pointers, unions of those); all-zero is a valid empty state.
            let mut sges: [sys::ibv_sge; CHAIN] = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let mut chain: [sys::ibv_send_wr; CHAIN] = unsafe { std::mem::zeroed() };
            for (i, w) in chunk.iter().enumerate() {
                let (addr, len, lkey, inline) = match w.source {
                    Source::Inline(b) => (b.as_ptr() as u64, b.len() as u32, 0, true),
                    Source::Staged { addr, len, lkey } => (addr, len, lkey, false),
                };
                sges[i] = sys::ibv_sge {
                    addr,
                    length: len,
                    lkey,
                };
                let mut flags = 0;
                if w.signaled {
                    flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
                }
                if inline {
                    flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
                }
                let wr = &mut chain[i];
                wr.wr_id = w.wr_id;
                wr.num_sge = 1;
                wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                wr.send_flags = flags;
                wr.wr.rdma = sys::rdma_t {
                    remote_addr: w.remote_addr,
                    rkey: w.rkey,
                };
            }
            let base = chain.as_mut_ptr();
            for i in 0..chunk.len() {
                // SAFETY: `i` and `i + 1` index the stack arrays (the last
                // link is set to NULL); both live until after the post.
                unsafe {
                    let wr = &mut *base.add(i);
                    wr.sg_list = sges.as_mut_ptr().add(i);
                    wr.next = if i + 1 < chunk.len() {
                        base.add(i + 1)
                    } else {
                        std::ptr::null_mut()
                    };
                }
            }
            let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
            // SAFETY: live queue pair; the chain and its sges live on the
            // stack for the call; inline data is copied by the call and
            // staged data is the caller's contract (see # Safety).
            let r = unsafe { sys::ibv_post_send(qp, base, &mut bad) };
            check_errno(r).map_err(RdmaError::PostSend)?;
        }
        Ok(())
    }

    /// Asks the peer to disconnect (best effort; Drop does it anyway).
    pub fn disconnect(&self) {
        // SAFETY: live id; errors (not connected) are irrelevant here.
        unsafe { sys::rdma_disconnect(self.raw) };
    }
}

fn conn_param(private_data: &[u8]) -> sys::rdma_conn_param {
    sys::rdma_conn_param {
        private_data: private_data.as_ptr() as *const c_void,
        private_data_len: private_data.len().min(u8::MAX as usize) as u8,
        // RDMA WRITE only: no reads or atomics in either direction.
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the queue pair (if any) is destroyed before the id, both
        // exactly once; the protection domain, completion queue and channel
        // they use are still alive (held by our fields, dropped after this).
        unsafe {
            if self.qp.is_some() {
                sys::rdma_destroy_qp(self.raw);
            }
            sys::rdma_destroy_id(self.raw);
        }
    }
}

/// Where the bytes of a WRITE come from.
#[derive(Clone, Copy, Debug)]
pub enum Source<'a> {
    /// Copied into the work request when posted.
    Inline(&'a [u8]),
    /// Registered memory, read by the device after the post.
    Staged {
        /// Virtual address.
        addr: u64,
        /// Bytes.
        len: u32,
        /// Local key of its memory region.
        lkey: u32,
    },
}

/// One RDMA WRITE to post.
#[derive(Clone, Copy, Debug)]
pub struct WriteWr<'a> {
    /// Work-request id (reported by its completion).
    pub wr_id: u64,
    /// The bytes.
    pub source: Source<'a>,
    /// Remote virtual address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Whether it produces a completion when it succeeds.
    pub signaled: bool,
}

// ---------------------------------------------------------------------------
// Device, protection domain, completion queue, memory regions

/// An RDMA device context, found through the id bound to this node's
/// address (the "anchor", which keeps librdmacm's reference on the device
/// for as long as it lives), or for an address bound to no device, the
/// first of `rdma_get_devices` (whose list, holding references on the
/// devices, is kept until drop).
pub struct Device {
    ctx: *mut sys::ibv_context,
    /// The device's name.
    pub name: String,
    /// Most work requests per queue.
    pub max_qp_wr: u32,
    anchor: CmId,
    list: *mut *mut sys::ibv_context,
}

// SAFETY: an ibv_context is thread-safe; it is only passed to verbs.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl Device {
    /// The device of `anchor`, an id bound to a local address (for a
    /// wildcard or loopback address, the first device).
    pub fn open(anchor: CmId, addr: SocketAddr) -> Result<Arc<Device>, RdmaError> {
        let mut ctx = anchor.verbs();
        let mut list = std::ptr::null_mut();
        if ctx.is_null() {
            let mut n: c_int = 0;
            // SAFETY: valid out-pointer; a non-NULL list is freed exactly
            // once, by `Drop` (or below when it holds no device).
            list = unsafe { sys::rdma_get_devices(&mut n) };
            if !list.is_null() {
                // SAFETY: a non-NULL list holds `n` contexts, then NULL.
                unsafe {
                    if n > 0 {
                        ctx = *list;
                    } else {
                        sys::rdma_free_devices(list);
                        list = std::ptr::null_mut();
                    }
                }
            }
        }
        // From here on `list` (if any) is owned by a Device or freed.
        let mut dev = Device {
            ctx,
            name: String::new(),
            max_qp_wr: 1,
            anchor,
            list,
        };
        if ctx.is_null() {
            return Err(RdmaError::NoContext(addr));
        }
        // SAFETY: plain data filled by the call.
        let mut attr: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context, valid out-pointer.
        check_errno(unsafe { sys::ibv_query_device(ctx, &mut attr) })
            .map_err(RdmaError::QueryDevice)?;
        // SAFETY: a live context's device and its name string.
        let name = unsafe {
            let s = sys::ibv_get_device_name((*ctx).device);
            if s.is_null() {
                "?".to_string()
            } else {
                CStr::from_ptr(s).to_string_lossy().into_owned()
            }
        };
        dev.name = name;
        dev.max_qp_wr = attr.max_qp_wr.max(1) as u32;
        Ok(Arc::new(dev))
    }

    /// The id bound to this node's address (the listener, when it listens).
    pub fn anchor(&self) -> &CmId {
        &self.anchor
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if !self.list.is_null() {
            // SAFETY: the list from rdma_get_devices, freed once; every
            // object made on its context holds an Arc to this Device, so
            // none is left.
            unsafe { sys::rdma_free_devices(self.list) };
        }
    }
}

/// A protection domain.
pub struct ProtectionDomain {
    raw: *mut sys::ibv_pd,
    device: Arc<Device>,
}

// SAFETY: protection domains are thread-safe handles.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// Allocates one on `device`.
    pub fn new(device: &Arc<Device>) -> Result<Arc<ProtectionDomain>, RdmaError> {
        // SAFETY: live context; NULL is checked.
        let raw = unsafe { sys::ibv_alloc_pd(device.ctx) };
        if raw.is_null() {
            return Err(RdmaError::AllocProtectionDomain(io::Error::last_os_error()));
        }
        Ok(Arc::new(ProtectionDomain {
            raw,
            device: device.clone(),
        }))
    }

    /// Its device.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every queue pair and memory region on it holds an Arc to
        // it, so none is left; deallocated exactly once.
        let r = unsafe { sys::ibv_dealloc_pd(self.raw) };
        if r != 0 {
            log::warn!(
                "rdma: ibv_dealloc_pd: {}",
                io::Error::from_raw_os_error(r.abs())
            );
        }
    }
}

/// A completion queue.
pub struct CompletionQueue {
    raw: *mut sys::ibv_cq,
    _device: Arc<Device>,
}

// SAFETY: completion queues are thread-safe handles; the transport polls
// each one behind a mutex.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

/// One work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// `IBV_WC_*` status (0: success).
    pub status: u32,
}

impl Completion {
    /// Whether it succeeded.
    pub fn ok(&self) -> bool {
        self.status == sys::ibv_wc_status::IBV_WC_SUCCESS
    }
}

/// Completion statuses this transport tells apart.
pub use sys::ibv_wc_status as wc_status;

/// The name of a completion status, for logs.
pub fn status_name(status: u32) -> String {
    // SAFETY: ibv_wc_status_str returns a static string for any value.
    unsafe {
        let s = sys::ibv_wc_status_str(status);
        if s.is_null() {
            format!("status {status}")
        } else {
            CStr::from_ptr(s).to_string_lossy().into_owned()
        }
    }
}

impl CompletionQueue {
    /// A queue of at least `depth` entries on `device`.
    pub fn new(device: &Arc<Device>, depth: u32) -> Result<Arc<CompletionQueue>, RdmaError> {
        // SAFETY: live context; no channel, no context pointer; NULL is
        // checked.
        let raw = unsafe {
            sys::ibv_create_cq(
                device.ctx,
                depth.max(1) as c_int,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if raw.is_null() {
            return Err(RdmaError::CreateCompletionQueue(io::Error::last_os_error()));
        }
        Ok(Arc::new(CompletionQueue {
            raw,
            _device: device.clone(),
        }))
    }

    /// Takes the completions that are ready (at most 16), without waiting.
    pub fn poll(&self, out: &mut Vec<Completion>) -> Result<(), RdmaError> {
        const N: usize = 16;
        out.clear();
        // SAFETY: ibv_wc is plain data; all-zero is a valid empty state.
        let mut wc: [sys::ibv_wc; N] = unsafe { std::mem::zeroed() };
        // SAFETY: live completion queue and room for N completions.
        let n = unsafe { sys::ibv_poll_cq(self.raw, N as c_int, wc.as_mut_ptr()) };
        if n < 0 {
            return Err(RdmaError::PollCompletionQueue(
                io::Error::from_raw_os_error((-n).max(libc::EIO)),
            ));
        }
        out.extend(wc[..n as usize].iter().map(|w| Completion {
            wr_id: w.wr_id,
            status: w.status,
        }));
        Ok(())
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: every queue pair using it holds an Arc to it, so none is
        // left; destroyed exactly once.
        let r = unsafe { sys::ibv_destroy_cq(self.raw) };
        if r != 0 {
            log::warn!(
                "rdma: ibv_destroy_cq: {}",
                io::Error::from_raw_os_error(r.abs())
            );
        }
    }
}

fn reg_mr(
    pd: &ProtectionDomain,
    addr: *mut c_void,
    len: usize,
    access: u32,
    what: &'static str,
) -> Result<*mut sys::ibv_mr, RdmaError> {
    // SAFETY: live protection domain; the caller guarantees that
    // `[addr, addr + len)` is mapped for as long as the registration lives.
    let mr = unsafe { sys::ibv_reg_mr(pd.raw, addr, len, access as c_int) };
    if mr.is_null() {
        return Err(RdmaError::RegisterMemoryRegion {
            what,
            len,
            source: io::Error::last_os_error(),
        });
    }
    Ok(mr)
}

fn dereg_mr(mr: *mut sys::ibv_mr) {
    // SAFETY: a registration made by `reg_mr`, deregistered exactly once.
    let r = unsafe { sys::ibv_dereg_mr(mr) };
    if r != 0 {
        log::warn!(
            "rdma: ibv_dereg_mr: {}",
            io::Error::from_raw_os_error(r.abs())
        );
    }
}

/// A node's region registered for remote writes: bytes `skip..` of it (the
/// identity words before `skip` stay out of reach).
pub struct RegisteredRegion {
    mr: *mut sys::ibv_mr,
    base: u64,
    len: u64,
    _pd: Arc<ProtectionDomain>,
    _region: Arc<Region>,
}

// SAFETY: a registration is an immutable handle once made.
unsafe impl Send for RegisteredRegion {}
// SAFETY: as above.
unsafe impl Sync for RegisteredRegion {}

impl RegisteredRegion {
    /// Registers `region[skip..remote_len]` (control block and ring: never
    /// the local apply ring) with local and remote write access.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        region: &Arc<Region>,
        skip: u64,
    ) -> Result<RegisteredRegion, RdmaError> {
        let words = region.words();
        let base = words.as_ptr() as u64;
        let len = region.remote_len();
        let access = (sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
            .0;
        // The region's mapping lives as long as the Arc we keep.
        let mr = reg_mr(
            pd,
            (base + skip) as *mut c_void,
            (len - skip) as usize,
            access,
            "the node's region",
        )?;
        Ok(RegisteredRegion {
            mr,
            base,
            len,
            _pd: pd.clone(),
            _region: region.clone(),
        })
    }

    /// Virtual address of region offset 0.
    pub fn addr(&self) -> u64 {
        self.base
    }

    /// Region bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The remote key peers write with.
    pub fn rkey(&self) -> u32 {
        // SAFETY: live registration.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for RegisteredRegion {
    fn drop(&mut self) {
        dereg_mr(self.mr);
    }
}

/// A registered buffer that WRITEs are sent from: shared anonymous memory
/// (so a `fork` of the process never copies it away from the device).
pub struct StagingBuffer {
    mr: *mut sys::ibv_mr,
    ptr: *mut u8,
    len: usize,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: the buffer is owned memory; access goes through `&mut self`.
unsafe impl Send for StagingBuffer {}
// SAFETY: shared references only read the keys and addresses.
unsafe impl Sync for StagingBuffer {}

impl StagingBuffer {
    /// Maps and registers `len` bytes on `pd`.
    pub fn new(pd: &Arc<ProtectionDomain>, len: usize) -> Result<StagingBuffer, RdmaError> {
        let ptr = map_shared(None, len).map_err(|source| RdmaError::Mmap { len, source })?;
        match reg_mr(pd, ptr, len, 0, "a staging buffer") {
            Ok(mr) => Ok(StagingBuffer {
                mr,
                ptr: ptr as *mut u8,
                len,
                _pd: pd.clone(),
            }),
            Err(e) => {
                // SAFETY: unmapping the mapping made above, once.
                unsafe { libc::munmap(ptr, len) };
                Err(e)
            }
        }
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Copies `bytes` to offset `at` and returns the WRITE source for them.
    /// Panics if they do not fit (a planning bug).
    pub fn stage(&mut self, at: usize, bytes: &[u8]) -> Source<'static> {
        assert!(at
            .checked_add(bytes.len())
            .is_some_and(|end| end <= self.len));
        // SAFETY: `[at, at + len)` lies in our live mapping (checked); the
        // transport only reuses bytes whose requests completed, so the
        // device is not reading them.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(at), bytes.len());
        }
        Source::Staged {
            addr: self.ptr as u64 + at as u64,
            len: bytes.len() as u32,
            // SAFETY: live registration.
            lkey: unsafe { (*self.mr).lkey },
        }
    }
}

impl Drop for StagingBuffer {
    fn drop(&mut self) {
        dereg_mr(self.mr);
        // SAFETY: the mapping made in `new`, unmapped once, after its
        // registration is gone.
        unsafe { libc::munmap(self.ptr as *mut c_void, self.len) };
    }
}
