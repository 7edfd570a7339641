//! What the preload does with each hooked call, free of `unsafe`: the
//! process-wide state, the fd table, the leader's replication path and the
//! passive consumption counting. `hooks` calls into it after the real call.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;
use lockstep_common::config::BackupClients;
use lockstep_common::entry::{EntryHeader, Kind, OutputDigest, OutputHash};
use lockstep_common::region::{self, Region, Role};
use lockstep_common::ring::{RingError, RingWriter};
use lockstep_common::transport::{self, Transport};
use lockstep_common::Config;
use once_cell::sync::OnceCell;

/// Fds tracked (the table is indexed by fd).
const MAX_FDS: usize = 1 << 16;
/// How long a leader call waits for a majority before failing the
/// connection (the follower process died, or no majority is reachable).
const ACK_PATIENCE: Duration = Duration::from_secs(30);

const TAG_CLIENT: u64 = 1 << 63;
const TAG_REPLAY: u64 = 1 << 62;
const TAG_CLOSED: u64 = 1 << 61;
const TAG_IGNORED: u64 = 1 << 60;
const ID_MASK: u64 = (1 << 48) - 1;

/// Set in a forked child: everything passes through.
pub static INERT: AtomicBool = AtomicBool::new(false);

/// What a hooked input call should return after the preload's work.
pub enum Verdict {
    /// Return the real call's result.
    Pass,
    /// Fail the connection: return -1 with ECONNRESET.
    Reset,
}

/// The process-wide state once initialised.
pub enum Init {
    /// Not configured (or unreplicated by request): pass everything through.
    Off,
    /// Replicating.
    On(Box<Preload>),
    /// Misconfigured: the server must not run unreplicated.
    Broken(String),
}

struct Writer {
    view: u64,
    seq: u64,
    safe: u64,
    ring: RingWriter,
    scratch: Vec<u8>,
}

/// The preload of one node.
pub struct Preload {
    config: Config,
    me: u64,
    region: Arc<Region>,
    transport: Box<dyn Transport>,
    app_port: u16,
    app_ip: std::net::IpAddr,
    fds: Vec<AtomicU64>,
    out_hash: Vec<AtomicU64>,
    out_len: Vec<AtomicU64>,
    writer: Mutex<Writer>,
}

static STATE: OnceCell<Init> = OnceCell::new();

/// The state, initialising it on first use.
pub fn state() -> &'static Init {
    STATE.get_or_init(init)
}

fn init() -> Init {
    let Ok(path) = std::env::var("LOCKSTEP_CONFIG") else {
        return Init::Off;
    };
    crate::logger::install();
    crate::hooks::register_fork_handler();
    match Preload::open(&path) {
        Ok(p) => {
            log::info!("lockstep: node {} replicating through {}", p.me, p.region.path().display());
            Init::On(Box::new(p))
        }
        Err(e) => {
            if std::env::var("LOCKSTEP_ALLOW_UNREPLICATED").as_deref() == Ok("1") {
                log::warn!("lockstep: {e}; running UNREPLICATED (LOCKSTEP_ALLOW_UNREPLICATED=1)");
                Init::Off
            } else {
                Init::Broken(e)
            }
        }
    }
}

fn zeroed(n: usize) -> Vec<AtomicU64> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

impl Preload {
    fn open(path: &str) -> Result<Preload, String> {
        let config = Config::load(std::path::Path::new(path)).map_err(|e| e.0)?;
        let me: u64 = std::env::var("LOCKSTEP_NODE")
            .map_err(|_| "LOCKSTEP_NODE is not set".to_string())?
            .parse()
            .map_err(|_| "LOCKSTEP_NODE is not a node id".to_string())?;
        let node = config.node(me).map_err(|e| e.0)?.clone();
        let spec = config.region_spec(me);
        let region = Arc::new(Region::open(&spec.default_path(), &spec).map_err(|e| e.to_string())?);
        let transport = transport::open(&config, me, region.clone()).map_err(|e| e.to_string())?;
        region.set_preload_pid(std::process::id() as u64);
        let ring_size = config.ring_size;
        let max = config.max_entry as usize;
        Ok(Preload {
            me,
            region,
            transport,
            app_port: node.app.port(),
            app_ip: node.app.ip(),
            fds: zeroed(MAX_FDS),
            out_hash: zeroed(MAX_FDS),
            out_len: zeroed(MAX_FDS),
            writer: Mutex::new(Writer {
                view: 0,
                seq: 1,
                safe: 0,
                ring: RingWriter::new(ring_size, 0),
                scratch: vec![0u8; lockstep_common::entry::footprint(max)],
            }),
            config,
        })
    }

    fn slot(&self, fd: i32) -> Option<&AtomicU64> {
        usize::try_from(fd).ok().and_then(|i| self.fds.get(i))
    }

    /// Whether `addr` (a listening socket's local address) is the app's.
    pub fn is_app_listener(&self, addr: std::net::SocketAddr) -> bool {
        addr.port() == self.app_port && (addr.ip() == self.app_ip || addr.ip().is_unspecified() || self.app_ip.is_unspecified())
    }

    /// A client connection was accepted on the app listener. `peer_port`
    /// identifies replay connections. Returns false when the connection
    /// must be refused (closed by the caller).
    pub fn on_accept(&self, fd: i32, peer_port: u16) -> bool {
        let Some(slot) = self.slot(fd) else {
            return true;
        };
        self.out_hash[fd as usize].store(OutputHash::default().0, Ordering::Relaxed);
        self.out_len[fd as usize].store(0, Ordering::Relaxed);
        match self.region.role() {
            Role::Leader => match self.replicate(Kind::Accept, 0, &[], 0) {
                Some(seq) => {
                    slot.store(TAG_CLIENT | seq, Ordering::Release);
                    true
                }
                None => false,
            },
            Role::Backup | Role::Joining => {
                if let Some(i) = self.region.find_replay_slot(peer_port) {
                    slot.store(TAG_REPLAY | i as u64, Ordering::Release);
                    true
                } else if self.config.backup_clients == BackupClients::Allow {
                    slot.store(TAG_IGNORED, Ordering::Release);
                    true
                } else {
                    false
                }
            }
        }
    }

    /// Whether an fd needs the input path at all (one lookup).
    pub fn tracked(&self, fd: i32) -> bool {
        self.slot(fd)
            .map(|s| s.load(Ordering::Acquire) & (TAG_CLIENT | TAG_REPLAY) != 0)
            .unwrap_or(false)
    }

    /// A recv-type call on `fd` returned `n` (bytes in `data`), or an error
    /// `errno` when `n < 0`.
    pub fn on_input(&self, fd: i32, n: isize, errno: i32, data: &[u8]) -> Verdict {
        let Some(slot) = self.slot(fd) else {
            return Verdict::Pass;
        };
        let tag = slot.load(Ordering::Acquire);
        if tag & TAG_REPLAY != 0 {
            if n > 0 {
                self.region
                    .replay_slot((tag & ID_MASK) as usize)
                    .add_consumed(n as u64);
            }
            return Verdict::Pass;
        }
        if tag & TAG_CLIENT == 0 || tag & TAG_CLOSED != 0 {
            return Verdict::Pass;
        }
        let conn = tag & ID_MASK;
        if n > 0 {
            let out = self.digest(fd);
            let max = self.config.max_entry as usize;
            for chunk in data.chunks(max) {
                if self.replicate(Kind::Data, conn, chunk, out).is_none() {
                    slot.store(tag | TAG_CLOSED, Ordering::Release);
                    return Verdict::Reset;
                }
            }
            Verdict::Pass
        } else if n == 0 || errno == libc::ECONNRESET {
            self.log_close(fd);
            Verdict::Pass
        } else {
            Verdict::Pass
        }
    }

    fn digest(&self, fd: i32) -> u64 {
        OutputDigest {
            hash: OutputHash(self.out_hash[fd as usize].load(Ordering::Relaxed)),
            len: self.out_len[fd as usize].load(Ordering::Relaxed),
        }
        .pack()
    }

    /// Output written to `fd`.
    pub fn on_output(&self, fd: i32, data: &[u8]) {
        let Some(slot) = self.slot(fd) else { return };
        if slot.load(Ordering::Relaxed) & TAG_CLIENT == 0 || data.is_empty() {
            return;
        }
        let i = fd as usize;
        let mut d = OutputDigest {
            hash: OutputHash(self.out_hash[i].load(Ordering::Relaxed)),
            len: self.out_len[i].load(Ordering::Relaxed),
        };
        d.update(data);
        self.out_hash[i].store(d.hash.0, Ordering::Relaxed);
        self.out_len[i].store(d.len, Ordering::Relaxed);
    }

    /// Logs the connection's CLOSE once (EOF, reset, shutdown or close).
    pub fn log_close(&self, fd: i32) {
        let Some(slot) = self.slot(fd) else { return };
        let tag = slot.load(Ordering::Acquire);
        if tag & TAG_CLIENT == 0 || tag & TAG_CLOSED != 0 {
            return;
        }
        slot.store(tag | TAG_CLOSED, Ordering::Release);
        if self.region.role() == Role::Leader {
            let _ = self.replicate(Kind::Close, tag & ID_MASK, &[], 0);
        }
    }

    /// `fd` is being closed.
    pub fn on_close(&self, fd: i32) {
        self.log_close(fd);
        if let Some(slot) = self.slot(fd) {
            slot.store(0, Ordering::Release);
        }
    }

    /// Appends one entry, posts it to every peer and waits for a majority.
    /// Returns its seq, or None when this node cannot replicate now.
    fn replicate(&self, kind: Kind, conn: u64, payload: &[u8], out_hash: u64) -> Option<u64> {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let view = self.region.view();
        if self.region.role() != Role::Leader {
            return None;
        }
        if w.view != view {
            let (seq, pos) = self.region.writer_start();
            w.view = view;
            w.seq = seq.max(1);
            w.safe = pos;
            w.ring = RingWriter::new(self.config.ring_size, pos);
            log::info!("lockstep: leading view {view} from seq {} at ring position {pos}", w.seq);
        }
        let seq = w.seq;
        let mut hdr = EntryHeader::new(kind, view, seq, if kind == Kind::Accept { seq } else { conn }, payload.len() as u32);
        hdr.last_committed = self.region.commit();
        hdr.out_hash = out_hash;
        let a = loop {
            let Writer { ring, safe, scratch, .. } = &mut *w;
            match ring.append(self.region.ring(), &hdr, payload, *safe, scratch) {
                Ok(a) => break a,
                Err(RingError::Full { .. }) => {
                    // Everything written is acked once the last seq is.
                    let end = w.ring.pos();
                    if !self.wait_majority(seq - 1, view) {
                        return None;
                    }
                    w.safe = end;
                }
                Err(e) => {
                    log::error!("lockstep: {e}");
                    return None;
                }
            }
        };
        let wrap = a.wrap_offset;
        for peer in self.config.ids().filter(|&p| p != self.me) {
            let post = || -> Result<(), transport::TransportError> {
                if let Some(off) = wrap {
                    self.transport.write(peer, view, region::ring_offset(off), w.ring.wrap_bytes())?;
                }
                self.transport.write(peer, view, region::ring_offset(a.offset), &w.scratch[..a.len])?;
                self.transport.write(peer, view, region::tail_offset(), &a.end.to_le_bytes())
            };
            if let Err(e) = post() {
                if let transport::TransportError::Fenced { .. } = e {
                    log::warn!("lockstep: {e}");
                    return None;
                }
            }
        }
        self.transport.flush();
        self.region.set_tail(a.end);
        self.region.bell().ring();
        w.seq += 1;
        if !self.wait_majority(seq, view) {
            return None;
        }
        w.safe = a.end;
        self.region.raise_commit(seq);
        Some(seq)
    }

    /// Waits until a majority (this node's follower included) acked `seq`.
    fn wait_majority(&self, seq: u64, view: u64) -> bool {
        if seq == 0 {
            return true;
        }
        let need = self.config.majority();
        let backoff = Backoff::new();
        let start = Instant::now();
        loop {
            let bell = self.region.bell();
            let seen = bell.value();
            let acked = self.config.ids().filter(|&id| self.region.ack(id) >= seq).count();
            if acked >= need {
                return true;
            }
            if self.region.role() != Role::Leader || self.region.view() != view || self.transport.fenced_by() > view {
                log::warn!("lockstep: no longer leader of view {view}; failing the connection");
                return false;
            }
            if start.elapsed() > ACK_PATIENCE {
                log::error!("lockstep: seq {seq} not acknowledged by a majority within {ACK_PATIENCE:?}; failing the connection");
                return false;
            }
            if backoff.is_completed() {
                bell.wait(seen, Duration::from_millis(1));
            } else {
                backoff.snooze();
            }
        }
    }
}
