//! The writer's side: one reliable connection per peer, kept up by a
//! connector thread, and the posting of planned WRITEs on it.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::plan::{plan_write, Inflight, Signaler, StagingRing};
use super::verbs::{
    event, status_name, wc_status, CmId, Completion, CompletionQueue, EventChannel,
    ProtectionDomain, QpCaps, RdmaError, StagingBuffer, WriteWr,
};
use super::wire::{ConnAccept, ConnRequest, Refusal, RefusalCode};
use super::{MAX_PENDING, MAX_PIECE, SIGNAL_EVERY, SQ_DEPTH, STAGING_BYTES, WANT_INLINE};
use crate::transport::{lock, start_once, RemotePeer, TransportError};

const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the connector looks at `stop` and for a disconnect.
const TICK: Duration = Duration::from_millis(50);
const MIN_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How long a write waits for send-queue or staging room before it is
/// queued instead.
const ROOM_WAIT: Duration = Duration::from_millis(1);

/// An established connection into a peer's region.
struct Conn {
    /// The queue pair lives on the id; it goes first.
    id: CmId,
    cq: Arc<CompletionQueue>,
    remote: ConnAccept,
    caps: QpCaps,
    /// A completion failed: the connector replaces this connection.
    failed: bool,
}

/// What writers share under the peer's mutex.
struct PeerState {
    conn: Option<Conn>,
    staging: StagingBuffer,
    ring: StagingRing,
    inflight: Inflight,
    signaler: Signaler,
    /// Writes posted while not connected, in order.
    pending: VecDeque<(u64, Vec<u8>)>,
    pending_bytes: usize,
    /// Writes dropped because `pending` was full.
    dropped: u64,
    completions: Vec<Completion>,
}

impl PeerState {
    fn ready(&self) -> bool {
        self.conn.as_ref().is_some_and(|c| !c.failed)
    }

    fn reset_accounting(&mut self) {
        self.ring.clear();
        self.inflight = Inflight::default();
        self.signaler.reset();
    }
}

/// How a write was handled.
enum Posted {
    Done,
    /// No room for it right now (or no connection): queue it.
    Later,
}

/// One peer's region, as a write target.
pub(super) struct Peer {
    node: u64,
    me: u64,
    addr: SocketAddr,
    src: Option<SocketAddr>,
    region_len: u64,
    cluster: u64,
    key: String,
    state: Mutex<PeerState>,
    channel: Arc<EventChannel>,
    pd: Arc<ProtectionDomain>,
    /// Highest view written to this peer (sent when connecting).
    view: AtomicU64,
    /// Highest view this peer refused us with.
    fenced: AtomicU64,
    fenced_by: Arc<AtomicU64>,
    stop: AtomicBool,
    started: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// Settings of a peer, from the config.
pub(super) struct PeerSpec {
    pub node: u64,
    pub me: u64,
    pub addr: SocketAddr,
    pub src: Option<SocketAddr>,
    pub region_len: u64,
    pub cluster: u64,
    pub key: String,
}

impl RemotePeer for Peer {
    fn region_len(&self) -> u64 {
        self.region_len
    }
    fn fenced_view(&self) -> u64 {
        self.fenced.load(Ordering::Acquire)
    }
}

impl Peer {
    /// Prepares a peer (registers its staging buffer; no connection yet).
    pub fn new(
        spec: PeerSpec,
        pd: &Arc<ProtectionDomain>,
        fenced_by: Arc<AtomicU64>,
    ) -> Result<Peer, RdmaError> {
        let staging = StagingBuffer::new(pd, STAGING_BYTES)?;
        Ok(Peer {
            node: spec.node,
            me: spec.me,
            addr: spec.addr,
            src: spec.src,
            region_len: spec.region_len,
            cluster: spec.cluster,
            key: spec.key,
            state: Mutex::new(PeerState {
                conn: None,
                ring: StagingRing::new(staging.len()),
                staging,
                inflight: Inflight::default(),
                signaler: Signaler::new(SIGNAL_EVERY, STAGING_BYTES / 4),
                pending: VecDeque::new(),
                pending_bytes: 0,
                dropped: 0,
                completions: Vec::with_capacity(16),
            }),
            channel: EventChannel::new()?,
            pd: pd.clone(),
            view: AtomicU64::new(0),
            fenced: AtomicU64::new(0),
            fenced_by,
            stop: AtomicBool::new(false),
            started: AtomicBool::new(false),
            thread: Mutex::new(None),
        })
    }

    /// Posts a checked write (or queues it until the connection is up).
    pub fn write(
        self: &Arc<Self>,
        view: u64,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), TransportError> {
        self.view.fetch_max(view, Ordering::AcqRel);
        self.ensure_started()?;
        let mut st = lock(&self.state);
        if st.ready() && self.drain(&mut st) {
            if let Posted::Done = self.post(&mut st, offset, bytes) {
                return Ok(());
            }
        }
        self.queue(&mut st, offset, bytes);
        Ok(())
    }

    /// Reaps completions and posts queued writes.
    pub fn flush(&self) {
        if !self.started.load(Ordering::Acquire) {
            return;
        }
        let mut st = lock(&self.state);
        if st.ready() {
            self.reap(&mut st);
            self.drain(&mut st);
        }
    }

    fn queue(&self, st: &mut PeerState, offset: u64, bytes: &[u8]) {
        if !st.pending.is_empty() && st.pending_bytes + bytes.len() > MAX_PENDING {
            if st.dropped == 0 {
                log::warn!(
                    "rdma: {} MiB queued for node {}: dropping writes until it is reachable",
                    st.pending_bytes >> 20,
                    self.node
                );
            }
            st.dropped += 1;
            return;
        }
        st.pending_bytes += bytes.len();
        st.pending.push_back((offset, bytes.to_vec()));
    }

    /// Posts queued writes in order; true when none is left.
    fn drain(&self, st: &mut PeerState) -> bool {
        while let Some((offset, bytes)) = st.pending.pop_front() {
            if let Posted::Later = self.post(st, offset, &bytes) {
                st.pending.push_front((offset, bytes));
                return false;
            }
            st.pending_bytes -= bytes.len();
        }
        true
    }

    /// Posts one write as planned WRITEs: the body, then the last word.
    fn post(&self, st: &mut PeerState, offset: u64, bytes: &[u8]) -> Posted {
        let Some(conn) = st.conn.as_ref().filter(|c| !c.failed) else {
            return Posted::Later;
        };
        let (caps, remote) = (conn.caps, conn.remote);
        let mut wrs: Vec<WriteWr<'_>> = Vec::with_capacity(2);
        for piece in plan_write(offset, bytes.len(), MAX_PIECE, caps.max_inline as usize) {
            let deadline = Instant::now() + ROOM_WAIT;
            // Room in the send queue (leaving space for what this write
            // already planned) and, for a staged piece, in the staging ring.
            let reserved = loop {
                // (`outstanding` counts the pieces of this write planned so far.)
                let sq_ok = st.inflight.outstanding() < caps.max_send_wr as u64;
                if sq_ok {
                    if let Some(r) = st.ring.reserve(piece.staged()) {
                        break Some(r);
                    }
                }
                if Instant::now() >= deadline || !self.reap(st) {
                    break None;
                }
            };
            let Some((at, frees)) = reserved else {
                // The pieces planned so far are posted (a body without its
                // last word stays invisible) and the whole write is queued,
                // to be posted again once there is room.
                if !wrs.is_empty() {
                    self.post_wrs(st, &wrs);
                }
                return Posted::Later;
            };
            let src = &bytes[piece.src.clone()];
            let source = if piece.inline {
                super::verbs::Source::Inline(src)
            } else {
                st.staging.stage(at, src)
            };
            let signaled = st.signaler.next(piece.staged())
                || st.inflight.outstanding() + 1 >= caps.max_send_wr as u64 / 2;
            let wr_id = st.inflight.post(signaled, frees);
            wrs.push(WriteWr {
                wr_id,
                source,
                remote_addr: remote.addr + piece.remote,
                rkey: remote.rkey,
                signaled,
            });
        }
        if self.post_wrs(st, &wrs) {
            Posted::Done
        } else {
            Posted::Later
        }
    }

    /// Posts planned WRITEs; false (connection marked failed) if the
    /// device refused them.
    fn post_wrs(&self, st: &mut PeerState, wrs: &[WriteWr<'_>]) -> bool {
        let Some(conn) = st.conn.as_mut() else {
            return false;
        };
        // SAFETY: staged sources lie in `st.staging`, registered on the
        // protection domain of this queue pair; their ring space is only
        // reused after a completion at or past their request (Inflight
        // marks), or after this connection is destroyed.
        match unsafe { conn.id.post_writes(wrs) } {
            Ok(()) => true,
            Err(e) => {
                log::warn!("rdma: node {}: {e}; reconnecting", self.node);
                conn.failed = true;
                false
            }
        }
    }

    /// Takes ready completions; frees what they cover. False if the
    /// connection failed (or none is there).
    fn reap(&self, st: &mut PeerState) -> bool {
        let PeerState {
            conn,
            ring,
            inflight,
            completions,
            ..
        } = st;
        let Some(c) = conn.as_mut().filter(|c| !c.failed) else {
            return false;
        };
        if let Err(e) = c.cq.poll(completions) {
            log::warn!("rdma: node {}: {e}; reconnecting", self.node);
            c.failed = true;
            return false;
        }
        for wc in completions.iter() {
            if wc.ok() {
                if let Some(pos) = inflight.complete(wc.wr_id) {
                    ring.release(pos);
                }
                continue;
            }
            if !c.failed {
                let why = match wc.status {
                    wc_status::IBV_WC_REM_ACCESS_ERR => {
                        " (it revoked our access: it moved to a newer view)"
                    }
                    wc_status::IBV_WC_RETRY_EXC_ERR => " (it does not answer)",
                    _ => "",
                };
                log::warn!(
                    "rdma: a write to node {} failed: {}{why}; reconnecting",
                    self.node,
                    status_name(wc.status)
                );
            }
            c.failed = true;
        }
        !c.failed
    }

    fn ensure_started(self: &Arc<Self>) -> Result<(), TransportError> {
        let started = start_once(
            &self.started,
            || format!("lockstep-rdma-{}", self.node),
            || format!("the rdma connector thread for node {}", self.node),
            || {
                let me = self.clone();
                move || me.run_connector()
            },
        )?;
        if let Some(h) = started {
            *lock(&self.thread) = Some(h);
        }
        Ok(())
    }

    /// Stops the connector thread and waits for it.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Keeps a connection up: connects (with backoff), watches for a
    /// disconnect or a failed completion, replaces a broken connection.
    fn run_connector(self: Arc<Self>) {
        let mut backoff = MIN_BACKOFF;
        let mut last_failure: Option<String> = None;
        while !self.stopping() {
            let (connected, failed) = {
                let st = lock(&self.state);
                (
                    st.conn.is_some(),
                    st.conn.as_ref().is_some_and(|c| c.failed),
                )
            };
            if connected {
                let mut gone = failed;
                if !gone {
                    match self.channel.next_event(TICK) {
                        Ok(Some(ev)) => match ev.kind {
                            event::RDMA_CM_EVENT_DISCONNECTED
                            | event::RDMA_CM_EVENT_DEVICE_REMOVAL => {
                                log::warn!("rdma: node {}: {}", self.node, ev.name());
                                gone = true;
                            }
                            _ => log::debug!("rdma: node {}: {}", self.node, ev.name()),
                        },
                        Ok(None) => {}
                        Err(e) => {
                            log::warn!("rdma: node {}: {e}", self.node);
                            gone = true;
                        }
                    }
                }
                if gone || lock(&self.state).conn.as_ref().is_some_and(|c| c.failed) {
                    let old = {
                        let mut st = lock(&self.state);
                        let old = st.conn.take();
                        st.reset_accounting();
                        old
                    };
                    // Destroying the queue pair outside the lock.
                    drop(old);
                }
                continue;
            }
            match self.connect() {
                Ok(conn) => {
                    backoff = MIN_BACKOFF;
                    last_failure = None;
                    let mut st = lock(&self.state);
                    st.reset_accounting();
                    st.conn = Some(conn);
                    let (queued, dropped) = (st.pending.len(), std::mem::take(&mut st.dropped));
                    self.drain(&mut st);
                    log::info!(
                        "rdma: connected to node {} at {} ({queued} queued writes posted, {dropped} dropped while it was unreachable)",
                        self.node,
                        self.addr
                    );
                }
                Err(e) => {
                    if let ConnectError::Refused(r) = &e {
                        if r.code == RefusalCode::Fenced {
                            self.fenced.fetch_max(r.view, Ordering::AcqRel);
                            self.fenced_by.fetch_max(r.view, Ordering::AcqRel);
                        }
                    }
                    let msg = e.to_string();
                    if last_failure.as_deref() != Some(msg.as_str()) {
                        log::warn!(
                            "rdma: cannot connect to node {} at {}: {msg} (retrying)",
                            self.node,
                            self.addr
                        );
                        last_failure = Some(msg);
                    }
                    self.pause(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    fn pause(&self, d: Duration) {
        let end = Instant::now() + d;
        while !self.stopping() {
            let now = Instant::now();
            if now >= end {
                break;
            }
            std::thread::sleep((end - now).min(TICK));
        }
    }

    /// Waits for an event on `id` of one of `want` kinds; anything else
    /// for it is a failure.
    fn wait_for(&self, id: &CmId, want: u32, timeout: Duration) -> Result<Vec<u8>, ConnectError> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.stopping() {
                return Err(ConnectError::Stopped);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(ConnectError::Timeout(super::verbs::event_name(want)));
            }
            let Some(ev) = self.channel.next_event((deadline - now).min(TICK))? else {
                continue;
            };
            if ev.id != id.key() {
                continue; // of an id already destroyed
            }
            if ev.kind == want {
                return Ok(ev.private_data);
            }
            if ev.kind == event::RDMA_CM_EVENT_REJECTED {
                return Err(match Refusal::decode(&ev.private_data) {
                    Ok(r) => ConnectError::Refused(r),
                    // IB reject reason 8, invalid service id: nothing
                    // listens on that address and port.
                    Err(_) if ev.status == 8 => ConnectError::Other(
                        "nobody takes rdma writes there (is that node's follower running with transport = \"rdma\"?)".into(),
                    ),
                    Err(_) => ConnectError::Event(ev.name(), ev.status),
                });
            }
            return Err(ConnectError::Event(ev.name(), ev.status));
        }
    }

    fn connect(&self) -> Result<Conn, ConnectError> {
        let mut id = CmId::new(&self.channel)?;
        id.resolve_addr(self.src, self.addr, RESOLVE_TIMEOUT)?;
        self.wait_for(&id, event::RDMA_CM_EVENT_ADDR_RESOLVED, RESOLVE_TIMEOUT * 2)?;
        id.resolve_route(RESOLVE_TIMEOUT)?;
        self.wait_for(
            &id,
            event::RDMA_CM_EVENT_ROUTE_RESOLVED,
            RESOLVE_TIMEOUT * 2,
        )?;
        if !id.same_device(&self.pd) {
            return Err(ConnectError::Other(format!(
                "the route to {} leaves through another RDMA device than {} (give each node one RDMA device and a control address on it)",
                self.addr,
                self.pd.device().name
            )));
        }
        let depth = SQ_DEPTH.min(self.pd.device().max_qp_wr);
        let cq = CompletionQueue::new(self.pd.device(), depth + 16)?;
        let want = QpCaps {
            max_send_wr: depth,
            max_inline: WANT_INLINE,
        };
        let mut caps = match id.create_qp(&self.pd, &cq, want) {
            Ok(c) => c,
            // Some devices take no inline data.
            Err(_) => id.create_qp(
                &self.pd,
                &cq,
                QpCaps {
                    max_inline: 0,
                    ..want
                },
            )?,
        };
        // A device may give more than asked; the completion queue is sized
        // for what was asked (every request can complete with an error).
        caps.max_send_wr = caps.max_send_wr.min(depth);
        let req = ConnRequest {
            from: self.me,
            to: self.node,
            view: self.view.load(Ordering::Acquire),
            cluster: self.cluster,
        };
        id.connect(&req.encode(&self.key))?;
        let data = self.wait_for(&id, event::RDMA_CM_EVENT_ESTABLISHED, CONNECT_TIMEOUT)?;
        let remote = ConnAccept::decode(&data).map_err(|e| ConnectError::Other(e.to_string()))?;
        if remote.node != self.node || remote.len != self.region_len {
            return Err(ConnectError::Other(format!(
                "it answered for node {} with a region of {} bytes; this node's config says node {} with {} bytes",
                remote.node, remote.len, self.node, self.region_len
            )));
        }
        Ok(Conn {
            id,
            cq,
            remote,
            caps,
            failed: false,
        })
    }
}

/// Why a connection attempt failed.
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error(transparent)]
    Verbs(#[from] RdmaError),
    #[error("refused: {0}")]
    Refused(Refusal),
    #[error("{0} (status {1})")]
    Event(String, i32),
    #[error("no {0} in time")]
    Timeout(String),
    #[error("{0}")]
    Other(String),
    #[error("stopping")]
    Stopped,
}
