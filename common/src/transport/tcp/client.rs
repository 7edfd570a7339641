//! The writer side: per-peer queues that sender threads push to the peers'
//! region servers, and reader threads that collect fence notices.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::frames::{decode_notice, FrameHeader, HEADER_LEN, MAX_WRITE, NOTICE_FENCED, NOTICE_LEN};
use super::send_now::send_now;
use super::{KEEP_BUF, MAX_QUEUE};
use crate::config::Config;
use crate::handshake::{self, Channel};
use crate::region::Region;
use crate::transport::{
    lock, start_once, write_local, PeerTable, RemotePeer, Transport, TransportError,
};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
const FINAL_SEND_TIMEOUT: Duration = Duration::from_secs(1);
const MIN_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

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
    /// The connection's sending side: whoever holds it writes to the
    /// socket (a flush inline when it can, else the sender thread).
    /// Locked before `state` when both are.
    wire: Mutex<Wire>,
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
    /// A flush left bytes it could not send inline in `Wire::out`: the
    /// sender has work even with an empty queue.
    unsent: bool,
}

/// The connected socket and the batch being sent on it.
#[derive(Default)]
struct Wire {
    stream: Option<TcpStream>,
    /// Frames taken from the queue; `out[sent..]` is still to go out on
    /// this connection (a batch is never continued on another one: the
    /// server would read the middle of a frame as garbage).
    out: Vec<u8>,
    sent: usize,
}

impl Wire {
    fn rest(&self) -> &[u8] {
        &self.out[self.sent..]
    }

    /// Forgets the batch (sent, or lost with its connection).
    fn clear(&mut self) {
        self.out.clear();
        self.sent = 0;
        if self.out.capacity() > KEEP_BUF {
            self.out.shrink_to(KEEP_BUF);
        }
    }

    /// Takes the queued frames into `out` once the last batch is gone.
    fn take_queue(&mut self, st: &mut PeerState) {
        st.unsent = false;
        if self.rest().is_empty() {
            self.clear();
            std::mem::swap(&mut st.queue, &mut self.out);
        }
    }

    /// Closes the connection; what it had not sent is lost.
    fn close(&mut self) {
        if let Some(s) = self.stream.take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.clear();
    }
}

/// The sender's hold on a connection: set when the reader thread saw it end.
struct Conn {
    dead: Arc<AtomicBool>,
}

impl Conn {
    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
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
                wire: Mutex::new(Wire::default()),
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
            p.flush();
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
    /// Queues a checked write for the sender (see `TcpTransport::flush`).
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
        // The sender is woken by `flush`: a leader's turn (its entries,
        // wraps and tails) goes out in one send, with one wake-up.
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

    /// Sends the queued frames from the calling thread when the socket
    /// takes them all now and nobody else is sending; otherwise wakes the
    /// sender for what is left. Never blocks: a flush runs on the
    /// preloaded server's thread.
    fn flush(&self) {
        let mut wire = match self.wire.try_lock() {
            Ok(w) => w,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            // The sender is writing: it takes the queue next.
            Err(std::sync::TryLockError::WouldBlock) => return self.kick_if_queued(),
        };
        if wire.stream.is_none() || !wire.rest().is_empty() {
            drop(wire);
            return self.kick_if_queued();
        }
        {
            let mut st = lock(&self.state);
            if st.queue.is_empty() {
                return;
            }
            wire.take_queue(&mut st);
        }
        let w = &mut *wire;
        let Some(stream) = w.stream.as_ref() else {
            return;
        };
        match send_now(stream, &w.out) {
            Ok(n) if n == w.out.len() => w.clear(),
            Ok(n) => {
                // The socket is full: the sender sends the rest blocking.
                w.sent = n;
                drop(wire);
                let mut st = lock(&self.state);
                st.unsent = true;
                self.wake(&mut st);
            }
            Err(e) => {
                log::warn!("tcp transport: sending to node {}: {e}", self.node);
                // The reader thread sees the connection end and tells
                // the sender, which reconnects.
                w.close();
            }
        }
    }

    /// Wakes the sender if it waits while frames are queued.
    fn kick_if_queued(&self) {
        let mut st = lock(&self.state);
        if !st.queue.is_empty() {
            self.wake(&mut st);
        }
    }

    /// Wakes the sender if it is waiting for work.
    fn kick(&self) {
        self.wake(&mut lock(&self.state));
    }

    /// Wakes the sender if it waits (`st` is this peer's locked state).
    fn wake(&self, st: &mut PeerState) {
        if st.idle {
            st.idle = false;
            self.cv.notify_one();
        }
    }

    fn run_sender(self: Arc<Self>) {
        let mut conn: Option<Conn> = None;
        let mut backoff = MIN_BACKOFF;
        let mut last_failure: Option<String> = None;
        loop {
            let mut st = lock(&self.state);
            while !st.stop
                && st.queue.is_empty()
                && !st.unsent
                && !conn.as_ref().is_some_and(Conn::is_dead)
            {
                st.idle = true;
                st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            st.idle = false;
            if st.stop {
                break;
            }
            drop(st);
            if conn.as_ref().is_some_and(Conn::is_dead) {
                conn = None;
                lock(&self.wire).close();
                log::warn!("tcp transport: node {} closed the connection", self.node);
                continue;
            }
            if conn.is_none() {
                match self.connect() {
                    Ok((stream, c)) => {
                        {
                            let mut wire = lock(&self.wire);
                            wire.close();
                            wire.stream = Some(stream);
                        }
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
            let mut wire = lock(&self.wire);
            wire.take_queue(&mut lock(&self.state));
            let w = &mut *wire;
            let Some(stream) = w.stream.as_mut() else {
                // A flush's failed send closed it (its reader thread ends
                // on its own): connect again.
                conn = None;
                continue;
            };
            match stream.write_all(&w.out[w.sent..]) {
                Ok(()) => w.clear(),
                Err(e) => {
                    log::warn!("tcp transport: sending to node {}: {e}", self.node);
                    w.close();
                }
            }
        }
        // Stopped: best-effort send of what is still queued, then close.
        let mut wire = lock(&self.wire);
        if conn.is_some_and(|c| !c.is_dead()) {
            wire.take_queue(&mut lock(&self.state));
            let rest = std::mem::take(&mut lock(&self.state).queue);
            let w = &mut *wire;
            if let Some(s) = w.stream.as_mut() {
                let _ = s.set_write_timeout(Some(FINAL_SEND_TIMEOUT));
                let _ = s.write_all(&w.out[w.sent..]);
                let _ = s.write_all(&rest);
                let _ = s.flush();
            }
        }
        wire.close();
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

    fn connect(self: &Arc<Self>) -> Result<(TcpStream, Conn), String> {
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
        Ok((stream, Conn { dead }))
    }

    /// Reads fence notices until the connection ends, then tells the sender.
    fn run_reader(self: Arc<Self>, mut s: TcpStream, dead: Arc<AtomicBool>) {
        let mut n = [0u8; NOTICE_LEN];
        while s.read_exact(&mut n).is_ok() {
            let (tag, view) = decode_notice(&n);
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
