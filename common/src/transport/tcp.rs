//! TCP transport: an emulated RNIC. Each node's follower runs a region
//! server that applies one-sided writes sent to it over TCP; writers post
//! writes into per-peer queues that sender threads push to the network.
//!
//! # Connection
//!
//! A writer connects to the peer's `control` address and runs the
//! [`handshake`] with [`Channel::Region`]; then the
//! stream carries write frames one way and fence notices the other way.
//!
//! # Frames (writer → region server), little-endian
//!
//! ```text
//! view u64 | offset u64 | len u32 | flags u32 (= 0) | len bytes
//! ```
//!
//! `len` is a non-zero multiple of 8 of at most [`MAX_WRITE`] (16 MiB;
//! [`TcpTransport`] splits longer writes into consecutive frames, the last
//! bytes still landing last), `offset` is 8-aligned, `offset + len` lies
//! inside the region and `offset` is not inside the identity words (the
//! first [`IDENTITY_BYTES`] bytes: magic, layout, node, ring size, cluster).
//! Every frame is thus a multiple of 8 bytes long.
//!
//! The server reads the whole frame into a buffer before it applies it with
//! [`Region::write`] (bounds-checked, last 8 bytes stored last with release
//! ordering, doorbell rung), so a frame is applied entirely or not at all.
//! Frames of one connection are applied in order.
//!
//! A frame whose `view` is older than the region's current view is not
//! applied. The server answers with a fence notice (below) the first time
//! it refuses a write for each newer region view on that connection, and
//! keeps the connection: later frames of a current view still land (a
//! leader that learns of a newer view stops by itself).
//!
//! Anything else that breaks the rules above (bad length, misaligned or
//! out-of-bounds offset, unknown flags, a connection ending inside a frame)
//! is garbage: the server logs a warning naming the peer, applies nothing of
//! that frame and closes the connection.
//!
//! # Notices (region server → writer), little-endian
//!
//! ```text
//! tag u32 (1 = fenced) | pad u32 (= 0) | view u64 (the region's view)
//! ```
//!
//! # Writer side
//!
//! [`TcpTransport::write`] never blocks on the network: it appends the frame
//! to the peer's queue (one mutex, no allocation once the buffers have
//! grown) and wakes the peer's sender thread if it is idle. Writes to the
//! local node go straight into the local region.
//!
//! Each peer gets a sender thread, started lazily on the first write to that
//! peer (constructing a `TcpTransport` does no I/O and starts no thread, so
//! it is safe wherever a constructor may run), plus a reader thread per live
//! connection that collects fence notices and notices a closed connection.
//! The sender connects lazily, reconnects with backoff (20 ms doubling up to
//! 1 s) while the peer is down, and sends everything queued with one
//! `write_all` per batch (double-buffered: writers fill one buffer while the
//! sender sends the other). A peer that reads nothing for 10 s loses its
//! connection. The queue holds at most [`MAX_QUEUE`] bytes (64 MiB, or one
//! write if that alone is longer); writes posted while it is full are
//! dropped — like a lost one-sided write, which the protocol tolerates (the
//! reader catches up from a peer) — and a write is never reordered with
//! another within a connection. Writes queued when a connection breaks go
//! out on the next one; a batch that failed half-way is lost (the server
//! discards the truncated frame).
//!
//! Dropping the `TcpTransport` stops its threads: each sender sends what is
//! still queued if it has a connection (bounded by a 1 s send timeout), then
//! closes it, which ends the reader. Threads are detached; none keeps the
//! process alive. No code here panics on I/O errors: this transport runs
//! inside the preloaded server too.

use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{
    check_remote_write, lock, start_once, write_local, PeerTable, RemotePeer, Transport,
    TransportError,
};
use crate::config::Config;
use crate::handshake::{self, Channel};
use crate::region::Region;

/// Bytes of a frame header.
pub const HEADER_LEN: usize = 24;
/// Largest payload of one frame.
pub const MAX_WRITE: usize = 16 << 20;
/// Bytes of a notice.
pub const NOTICE_LEN: usize = 16;
/// Notice tag: the region refused a write from an older view.
pub const NOTICE_FENCED: u32 = 1;
pub use super::IDENTITY_BYTES;
/// Most bytes queued per peer; writes beyond are dropped.
pub const MAX_QUEUE: usize = 64 << 20;

const READ_BUF: usize = 256 << 10;
const KEEP_BUF: usize = 4 << 20;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
const FINAL_SEND_TIMEOUT: Duration = Duration::from_secs(1);
const MIN_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// The writer's view.
    pub view: u64,
    /// Region offset of the write.
    pub offset: u64,
    /// Payload bytes.
    pub len: u32,
    /// Must be 0.
    pub flags: u32,
}

impl FrameHeader {
    /// The header's wire bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&self.view.to_le_bytes());
        h[8..16].copy_from_slice(&self.offset.to_le_bytes());
        h[16..20].copy_from_slice(&self.len.to_le_bytes());
        h[20..24].copy_from_slice(&self.flags.to_le_bytes());
        h
    }

    /// Parses wire bytes (any bytes parse; see [`FrameHeader::check`]).
    pub fn decode(h: &[u8; HEADER_LEN]) -> FrameHeader {
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let u32_at = |i: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&h[i..i + 4]);
            u32::from_le_bytes(b)
        };
        FrameHeader {
            view: u64_at(0),
            offset: u64_at(8),
            len: u32_at(16),
            flags: u32_at(20),
        }
    }

    /// Checks the frame rules against a region of `region_len` bytes;
    /// the error says what is wrong.
    pub fn check(&self, region_len: u64) -> Result<(), String> {
        if self.flags != 0 {
            return Err(format!("unknown flags {:#x}", self.flags));
        }
        let len = self.len as usize;
        if len > MAX_WRITE {
            return Err(format!("length {len} is above the {MAX_WRITE}-byte limit"));
        }
        check_remote_write(self.offset, len, region_len).map_err(|e| e.to_string())
    }
}

fn fenced_notice(view: u64) -> [u8; NOTICE_LEN] {
    let mut n = [0u8; NOTICE_LEN];
    n[0..4].copy_from_slice(&NOTICE_FENCED.to_le_bytes());
    n[8..16].copy_from_slice(&view.to_le_bytes());
    n
}

// ---------------------------------------------------------------------------
// Server side

/// Applies the writes of authenticated region-channel connections to a
/// region.
#[derive(Clone, Debug)]
pub struct RegionServer {
    region: Arc<Region>,
}

/// How a served connection ended badly.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket failed (peer reset, listener stopped).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The peer broke the frame rules.
    #[error("{0}")]
    Garbage(String),
}

/// What a connection did, once it ended cleanly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServeStats {
    /// Frames applied.
    pub applied: u64,
    /// Frames refused for an old view.
    pub fenced: u64,
}

impl RegionServer {
    /// Serves writes into `region`.
    pub fn new(region: Arc<Region>) -> Self {
        RegionServer { region }
    }

    /// The region written into.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// Serves one connection that passed [`handshake::accept`] with
    /// [`Channel::Region`] for node `peer`, until the peer closes it, the
    /// socket fails or the peer sends garbage (logged; the connection is
    /// closed). Returns when the connection is done.
    pub fn serve(&self, stream: TcpStream, peer: u64) {
        let who = match stream.peer_addr() {
            Ok(a) => format!("node {peer} ({a})"),
            Err(_) => format!("node {peer}"),
        };
        match self.serve_frames(&stream) {
            Ok(s) => log::debug!(
                "region writes from {who}: connection closed after {} writes ({} fenced)",
                s.applied,
                s.fenced
            ),
            Err(ServeError::Garbage(what)) => {
                log::warn!("region writes from {who}: {what}; closing the connection")
            }
            Err(ServeError::Io(e)) => log::info!("region writes from {who}: {e}"),
        }
        let _ = stream.shutdown(Shutdown::Both);
    }

    /// Applies frames from `stream` until a clean end of stream (at a frame
    /// boundary) or an error. Does not close the stream.
    pub fn serve_frames(&self, stream: &TcpStream) -> Result<ServeStats, ServeError> {
        let _ = stream.set_nodelay(true);
        let mut rd = BufReader::with_capacity(READ_BUF, stream);
        self.apply_frames(&mut rd, &mut &*stream)
    }

    /// The frame decoder of [`RegionServer::serve_frames`] over any byte
    /// source: applies the frames read from `rd` (fence notices go to
    /// `notices`) until a clean end at a frame boundary or an error. A
    /// frame's buffer is allocated only once its header passed the checks
    /// (at most [`MAX_WRITE`] bytes).
    pub fn apply_frames(
        &self,
        rd: &mut impl Read,
        notices: &mut impl Write,
    ) -> Result<ServeStats, ServeError> {
        let region = &*self.region;
        let mut hdr = [0u8; HEADER_LEN];
        let mut body: Vec<u8> = Vec::new();
        let mut told = 0u64;
        let mut stats = ServeStats::default();
        loop {
            if !read_header(rd, &mut hdr)? {
                return Ok(stats);
            }
            let h = FrameHeader::decode(&hdr);
            h.check(region.remote_len()).map_err(ServeError::Garbage)?;
            let len = h.len as usize;
            if body.len() < len {
                body.resize(len, 0);
            }
            if let Err(e) = rd.read_exact(&mut body[..len]) {
                return Err(if e.kind() == io::ErrorKind::UnexpectedEof {
                    ServeError::Garbage(format!(
                        "connection ended inside a {len}-byte write at offset {}",
                        h.offset
                    ))
                } else {
                    ServeError::Io(e)
                });
            }
            let current = region.view();
            if h.view < current {
                stats.fenced += 1;
                if current > told {
                    told = current;
                    log::info!(
                        "refusing writes of view {} (region is in view {current})",
                        h.view
                    );
                    notices.write_all(&fenced_notice(current))?;
                }
                continue;
            }
            region
                .write(h.offset, &body[..len])
                .map_err(|e| ServeError::Garbage(e.to_string()))?;
            stats.applied += 1;
            if body.len() > KEEP_BUF {
                body.truncate(KEEP_BUF);
                body.shrink_to(KEEP_BUF);
            }
        }
    }
}

/// Reads a frame header; `Ok(false)` at a clean end of stream.
fn read_header(rd: &mut impl Read, hdr: &mut [u8; HEADER_LEN]) -> Result<bool, ServeError> {
    let mut got = 0;
    while got < HEADER_LEN {
        match rd.read(&mut hdr[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(ServeError::Garbage(format!(
                    "connection ended inside a frame header ({got} of {HEADER_LEN} bytes)"
                )))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ServeError::Io(e)),
        }
    }
    Ok(true)
}

struct ListenerShared {
    stop: AtomicBool,
    conns: Mutex<HashMap<u64, TcpStream>>,
}

/// A running region listener (see [`spawn_listener`]). Stops on drop.
pub struct ListenerHandle {
    addr: SocketAddr,
    shared: Arc<ListenerShared>,
    thread: Option<JoinHandle<()>>,
}

impl ListenerHandle {
    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, closes every connection and waits for their
    /// threads. Idempotent.
    pub fn shutdown(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        {
            let conns = lock(&self.shared.conns);
            self.shared.stop.store(true, Ordering::SeqCst);
            for s in conns.values() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        // Wake the blocking accept with a connection of our own.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        match TcpStream::connect_timeout(&wake, Duration::from_secs(2)) {
            Ok(_) => {
                let _ = thread.join();
            }
            Err(e) => log::warn!("region listener {}: cannot wake it to stop: {e}", self.addr),
        }
    }
}

impl Drop for ListenerHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Listens on `addr` (port 0 picks one; see [`ListenerHandle::local_addr`]),
/// runs the handshake for every connection in a thread of its own, serves
/// region channels into `region` and refuses control channels. For tests
/// and for a follower without its own dispatcher.
pub fn spawn_listener<A: ToSocketAddrs>(
    addr: A,
    region: Arc<Region>,
    cluster: &str,
    key: &str,
) -> io::Result<ListenerHandle> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    let shared = Arc::new(ListenerShared {
        stop: AtomicBool::new(false),
        conns: Mutex::new(HashMap::new()),
    });
    let server = RegionServer::new(region);
    let cluster = cluster.to_string();
    let key = key.to_string();
    let sh = shared.clone();
    let thread = std::thread::Builder::new()
        .name("lockstep-region-listen".into())
        .spawn(move || accept_loop(listener, sh, server, cluster, key))?;
    Ok(ListenerHandle {
        addr: local,
        shared,
        thread: Some(thread),
    })
}

fn accept_loop(
    listener: TcpListener,
    shared: Arc<ListenerShared>,
    server: RegionServer,
    cluster: String,
    key: String,
) {
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    let mut next_id = 0u64;
    let cluster = Arc::new(cluster);
    let key = Arc::new(key);
    loop {
        let accepted = listener.accept();
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                log::warn!("region listener: accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        workers.retain(|h| !h.is_finished());
        let id = next_id;
        next_id += 1;
        let Ok(clone) = stream.try_clone() else {
            continue;
        };
        {
            let mut conns = lock(&shared.conns);
            if shared.stop.load(Ordering::SeqCst) {
                break;
            }
            conns.insert(id, clone);
        }
        let (sh, server, cluster, key) =
            (shared.clone(), server.clone(), cluster.clone(), key.clone());
        let spawned = std::thread::Builder::new()
            .name("lockstep-region-serve".into())
            .spawn(move || {
                let mut stream = stream;
                if let Ok(hello) =
                    handshake::accept_channels(&mut stream, &cluster, &key, &[Channel::Region])
                {
                    server.serve(stream, hello.node);
                }
                lock(&sh.conns).remove(&id);
            });
        match spawned {
            Ok(h) => workers.push(h),
            Err(e) => {
                log::warn!("region listener: cannot start a connection thread: {e}");
                lock(&shared.conns).remove(&id);
            }
        }
    }
    for h in workers {
        let _ = h.join();
    }
}

// ---------------------------------------------------------------------------
// Client side

/// Sends one-sided writes to peers' region servers over TCP.
pub struct TcpTransport {
    me: u64,
    local: Arc<Region>,
    peers: PeerTable<Peer>,
    fenced_by: Arc<AtomicU64>,
}

struct Peer {
    node: u64,
    me: u64,
    addr: SocketAddr,
    cluster: String,
    key: String,
    region_len: u64,
    state: Mutex<PeerState>,
    cv: Condvar,
    /// Highest view this peer reported in a fence notice.
    fenced: AtomicU64,
    fenced_by: Arc<AtomicU64>,
    started: AtomicBool,
}

#[derive(Default)]
struct PeerState {
    /// Frames waiting for the sender.
    queue: Vec<u8>,
    /// The sender waits on the condvar for work.
    idle: bool,
    /// The transport was dropped.
    stop: bool,
    /// Writes dropped because the queue was full.
    dropped: u64,
}

struct Conn {
    stream: TcpStream,
    dead: Arc<AtomicBool>,
}

impl Conn {
    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }
    fn close(self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

impl TcpTransport {
    /// Prepares writes from node `me` to every other node of `config`. Does
    /// no I/O and starts no thread: each peer's sender starts on the first
    /// write to that peer.
    pub fn new(config: &Config, me: u64, local: Arc<Region>) -> Result<Self, TransportError> {
        config
            .node(me)
            .map_err(|_| TransportError::UnknownNode(me))?;
        // Configured (the tcp transport needs one), so no I/O: this runs
        // inside the preloaded server too.
        let key = config.cluster_key()?.to_string();
        let fenced_by = Arc::new(AtomicU64::new(0));
        let peers = PeerTable::new(config, me, |n| {
            Ok(Peer {
                node: n.id,
                me,
                addr: n.control,
                cluster: config.cluster.clone(),
                key: key.clone(),
                region_len: config.region_spec(n.id).remote_len(),
                state: Mutex::new(PeerState::default()),
                cv: Condvar::new(),
                fenced: AtomicU64::new(0),
                fenced_by: fenced_by.clone(),
                started: AtomicBool::new(false),
            })
        })?;
        Ok(TcpTransport {
            me,
            local,
            peers,
            fenced_by,
        })
    }
}

impl Transport for TcpTransport {
    fn write(&self, node: u64, view: u64, offset: u64, bytes: &[u8]) -> Result<(), TransportError> {
        if node == self.me {
            return write_local(&self.local, node, view, offset, bytes);
        }
        self.peers
            .target(node, view, offset, bytes.len())?
            .post(view, offset, bytes)
    }

    fn flush(&self) {
        for p in self.peers.iter() {
            let mut st = lock(&p.state);
            if st.idle && !st.queue.is_empty() {
                st.idle = false;
                p.cv.notify_one();
            }
        }
    }

    fn fenced_by(&self) -> u64 {
        self.fenced_by.load(Ordering::Acquire)
    }

    fn local(&self) -> &Region {
        &self.local
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        for p in self.peers.iter() {
            lock(&p.state).stop = true;
            p.cv.notify_all();
        }
    }
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
    /// Queues a checked write and wakes the sender.
    fn post(self: &Arc<Self>, view: u64, offset: u64, bytes: &[u8]) -> Result<(), TransportError> {
        self.ensure_started()?;
        let frames = bytes.len().div_ceil(MAX_WRITE);
        let need = bytes.len() + frames * HEADER_LEN;
        let mut st = lock(&self.state);
        if st.stop {
            return Ok(());
        }
        if !st.queue.is_empty() && st.queue.len() + need > MAX_QUEUE {
            st.dropped += 1;
            return Ok(());
        }
        let mut at = offset;
        for chunk in bytes.chunks(MAX_WRITE) {
            let h = FrameHeader {
                view,
                offset: at,
                len: chunk.len() as u32,
                flags: 0,
            };
            st.queue.extend_from_slice(&h.encode());
            st.queue.extend_from_slice(chunk);
            at += chunk.len() as u64;
        }
        if st.idle {
            st.idle = false;
            self.cv.notify_one();
        }
        Ok(())
    }

    fn ensure_started(self: &Arc<Self>) -> Result<(), TransportError> {
        // The sender runs detached; dropping the transport stops it.
        start_once(
            &self.started,
            || format!("lockstep-tx-{}", self.node),
            || format!("the sender thread for node {}", self.node),
            || {
                let me = self.clone();
                move || me.run_sender()
            },
        )?;
        Ok(())
    }

    /// Wakes the sender if it is waiting for work.
    fn kick(&self) {
        let mut st = lock(&self.state);
        if st.idle {
            st.idle = false;
            self.cv.notify_one();
        }
    }

    fn run_sender(self: Arc<Self>) {
        let mut out: Vec<u8> = Vec::new();
        let mut conn: Option<Conn> = None;
        let mut backoff = MIN_BACKOFF;
        let mut last_failure: Option<String> = None;
        loop {
            let mut st = lock(&self.state);
            while !st.stop && st.queue.is_empty() && !conn.as_ref().is_some_and(Conn::is_dead) {
                st.idle = true;
                st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            st.idle = false;
            if st.stop {
                break;
            }
            if conn.as_ref().is_some_and(Conn::is_dead) {
                drop(st);
                if let Some(c) = conn.take() {
                    c.close();
                }
                log::warn!("tcp transport: node {} closed the connection", self.node);
                continue;
            }
            if conn.is_none() {
                drop(st);
                match self.connect() {
                    Ok(c) => {
                        conn = Some(c);
                        backoff = MIN_BACKOFF;
                        last_failure = None;
                        let dropped = std::mem::take(&mut lock(&self.state).dropped);
                        log::info!(
                            "tcp transport: connected to node {} at {} ({dropped} writes dropped while the queue was full)",
                            self.node,
                            self.addr
                        );
                    }
                    Err(e) => {
                        if last_failure.as_deref() != Some(e.as_str()) {
                            log::warn!(
                                "tcp transport: cannot reach node {} at {}: {e} (retrying)",
                                self.node,
                                self.addr
                            );
                            last_failure = Some(e);
                        }
                        self.pause(backoff);
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                }
                continue;
            }
            std::mem::swap(&mut st.queue, &mut out);
            drop(st);
            if let Some(c) = conn.as_mut() {
                if let Err(e) = c.stream.write_all(&out) {
                    log::warn!("tcp transport: sending to node {}: {e}", self.node);
                    if let Some(c) = conn.take() {
                        c.close();
                    }
                }
            }
            out.clear();
            if out.capacity() > KEEP_BUF {
                out.shrink_to(KEEP_BUF);
            }
        }
        // Stopped: best-effort send of what is still queued, then close.
        if let Some(mut c) = conn {
            let rest = std::mem::take(&mut lock(&self.state).queue);
            if !rest.is_empty() && !c.is_dead() {
                let _ = c.stream.set_write_timeout(Some(FINAL_SEND_TIMEOUT));
                let _ = c.stream.write_all(&rest);
            }
            let _ = c.stream.flush();
            c.close();
        }
    }

    /// Waits `d` or until the transport is dropped.
    fn pause(&self, d: Duration) {
        let deadline = Instant::now() + d;
        let mut st = lock(&self.state);
        while !st.stop {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            st = match self.cv.wait_timeout(st, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }

    fn connect(self: &Arc<Self>) -> Result<Conn, String> {
        let stream = handshake::connect(
            self.addr,
            &self.cluster,
            &self.key,
            self.me,
            Channel::Region,
            HANDSHAKE_TIMEOUT,
        )
        .map_err(|e| e.to_string())?;
        stream
            .set_write_timeout(Some(SEND_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let rd = stream.try_clone().map_err(|e| e.to_string())?;
        let dead = Arc::new(AtomicBool::new(false));
        let (peer, d) = (self.clone(), dead.clone());
        std::thread::Builder::new()
            .name(format!("lockstep-rx-{}", self.node))
            .spawn(move || peer.run_reader(rd, d))
            .map_err(|e| format!("cannot start the reader thread: {e}"))?;
        Ok(Conn { stream, dead })
    }

    /// Reads fence notices until the connection ends, then tells the sender.
    fn run_reader(self: Arc<Self>, mut s: TcpStream, dead: Arc<AtomicBool>) {
        let mut n = [0u8; NOTICE_LEN];
        while s.read_exact(&mut n).is_ok() {
            let tag = u32::from_le_bytes([n[0], n[1], n[2], n[3]]);
            let mut v = [0u8; 8];
            v.copy_from_slice(&n[8..16]);
            let view = u64::from_le_bytes(v);
            if tag != NOTICE_FENCED {
                log::warn!(
                    "tcp transport: node {} sent an unknown notice {tag}; closing the connection",
                    self.node
                );
                break;
            }
            let before = self.fenced.fetch_max(view, Ordering::AcqRel);
            self.fenced_by.fetch_max(view, Ordering::AcqRel);
            if view > before {
                log::warn!(
                    "tcp transport: node {} is in view {view} and refuses writes from older views",
                    self.node
                );
            }
        }
        dead.store(true, Ordering::Release);
        let _ = s.shutdown(Shutdown::Both);
        self.kick();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_checks() {
        let h = FrameHeader {
            view: 7,
            offset: 4096,
            len: 64,
            flags: 0,
        };
        assert_eq!(FrameHeader::decode(&h.encode()), h);
        assert!(h.check(1 << 20).is_ok());
        let bad = |f: FrameHeader| f.check(1 << 20).unwrap_err();
        assert!(bad(FrameHeader { flags: 1, ..h }).contains("flags"));
        assert!(bad(FrameHeader { len: 0, ..h }).contains("aligned"));
        assert!(bad(FrameHeader { len: 12, ..h }).contains("aligned"));
        assert!(bad(FrameHeader { offset: 4, ..h }).contains("aligned"));
        assert!(bad(FrameHeader { offset: 8, ..h }).contains("outside"));
        assert!(bad(FrameHeader {
            offset: (1 << 20) - 8,
            ..h
        })
        .contains("outside"));
        assert!(bad(FrameHeader {
            offset: u64::MAX - 7,
            ..h
        })
        .contains("outside"));
        assert!(bad(FrameHeader {
            len: (MAX_WRITE + 8) as u32,
            ..h
        })
        .contains("limit"));
    }
}
