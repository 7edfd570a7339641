//! The writer side: per-peer queues that sender threads push to the peers'
//! region servers, and reader threads that collect fence notices.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::frames::{decode_notice, FrameHeader, HEADER_LEN, MAX_WRITE, NOTICE_FENCED, NOTICE_LEN};
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
