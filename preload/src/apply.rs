//! The passive side: a backup's server re-executes the committed log, in
//! log order, through its own event loop.
//!
//! The follower copies committed entries into the region's apply ring (see
//! the follower's `feed` module for why). Here the [`Pump`] turns them into
//! what the server sees from real clients:
//!
//! - `ACCEPT`: the pump opens a TCP connection to the server's own app
//!   listener; the server accepts it like any client, and the accept hook
//!   recognises it by its source port (a *replay connection*).
//! - `DATA`: the pump writes the entry's bytes into that connection.
//! - `CLOSE`: the pump shuts its end down; the server reads EOF.
//! - `VIEW`: every replay connection ends (the new view's clients connect
//!   to its leader).
//!
//! Only one entry is in flight: the next one is written once the server
//! consumed the last (the read hook counts the bytes, in this process) and
//! went back to its event loop (the `epoll_wait`/`poll`/`select` hooks tell:
//! by then it wrote whatever it answers to that input). That keeps the
//! leader's exact cross-connection order, and each reply lands in the same
//! per-input interval as on the leader, without any round trip to another
//! process. The pump advances from the hooks themselves (the server thread
//! that re-enters its event loop writes the next entry, which its wait then
//! finds ready at once) and, when the server is idle, from a small applier
//! thread parked on the apply doorbell. A server that never waits in one of
//! those calls is still served: a consumed entry is taken as handled after
//! [`TURN_PATIENCE`].
//!
//! The server's replies on replay connections are dropped in the write hook
//! without a syscall. Their digest is compared, entry by entry, with the
//! digest the leader logged with the connection's next input: a divergence
//! names the connection, the seq whose output differed and the first bytes
//! this server wrote.

use std::cell::Cell;
use std::collections::HashMap;
use std::io::{ErrorKind, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lockstep_common::entry::{EntryHeader, Kind, OutputDigest, HEADER_LEN};
use lockstep_common::region::{apply_ring_size, Region, Role};
use lockstep_common::ring::{ReadOutcome, RingReader};
use once_cell::sync::OnceCell;

use crate::fdtable;

/// Bytes of a replay connection's output kept to show in a divergence.
const SHOWN: usize = 48;
/// A consumed entry counts as handled after this long even when the server
/// did not re-enter an event-loop wait the hooks see.
const TURN_PATIENCE: Duration = Duration::from_millis(500);

/// One replay connection.
struct Conn {
    /// The pump's end.
    stream: TcpStream,
    /// The server's end (-1 until the server accepted it).
    server_fd: i32,
    /// Payload bytes written / read by the server.
    written: u64,
    consumed: u64,
    /// The thread that last read from it, and its `TURNS` count then.
    read_slot: usize,
    read_turn: u64,
    /// The server read EOF, or closed its end.
    eof: bool,
    closed: bool,
    /// Output since the connection's last input, and its first bytes.
    out: OutputDigest,
    shown: [u8; SHOWN],
    /// Seq of the connection's last input (whose output `out` is).
    last_input: u64,
}

/// The entry being delivered.
struct Current {
    header: EntryHeader,
    /// Payload bytes written so far.
    sent: usize,
    /// When the server had consumed all of it.
    consumed_at: Option<Instant>,
}

/// The passive preload's applier state (one per process, behind a mutex).
pub struct Pump {
    region: Arc<Region>,
    app: SocketAddr,
    max_entry: u32,
    epoch: u64,
    reader: RingReader,
    /// Position just past the entry in `buf`.
    end_pos: u64,
    buf: Vec<u8>,
    current: Option<Current>,
    conns: HashMap<u64, Conn>,
    /// The stream is unreadable (said once; a new stream starts over).
    broken: bool,
    /// Replay connections the server has not accepted yet, by their
    /// address as the server sees it.
    by_addr: HashMap<SocketAddr, u64>,
}

static PUMP: OnceCell<Mutex<Pump>> = OnceCell::new();

/// Event-loop waits each thread of the server entered so far, one counter
/// per thread (a server may run several loops: memcached's listener and
/// its worker). Outside the mutex: the wait hook never blocks on the pump
/// (whoever holds it moves the pump on, and sees this). A read and that
/// thread's next wait happen in that order, so its count past the one
/// taken at a read proves the server finished handling what it read.
static TURNS: [AtomicU64; TURN_THREADS] = [const { AtomicU64::new(0) }; TURN_THREADS];
/// Threads with a counter of their own (more share the last one).
const TURN_THREADS: usize = 32;
static NEXT_TURN_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static TURN_SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// This thread's turn counter.
fn turn_slot() -> usize {
    TURN_SLOT
        .try_with(|c| {
            if c.get() == usize::MAX {
                let n = NEXT_TURN_SLOT.fetch_add(1, Ordering::Relaxed);
                c.set(n.min(TURN_THREADS - 1));
            }
            c.get()
        })
        .unwrap_or(TURN_THREADS - 1)
}

/// Sets up the pump for `region` and starts its applier thread (once).
pub fn start(region: Arc<Region>, app: SocketAddr, max_entry: u32) {
    let pump = Pump::new(region.clone(), app, max_entry);
    if PUMP.set(Mutex::new(pump)).is_err() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("lockstep-apply".into())
        .spawn(move || applier(region));
    if let Err(e) = spawned {
        log::error!("cannot start the applier thread: {e}; this backup applies only while its server is busy");
    }
}

fn pump() -> Option<MutexGuard<'static, Pump>> {
    PUMP.get()
        .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()))
}

/// The applier thread: moves the pump on when the server is idle.
fn applier(region: Arc<Region>) {
    // Its own calls (connect's poll, writes) must not re-enter the pump.
    crate::hooks::sys::own_thread();
    loop {
        let bell = region.apply().bell();
        let seen = bell.value();
        let busy = pump().is_some_and(|mut p| {
            p.run();
            p.current.is_some()
        });
        let nap = if busy {
            Duration::from_millis(20)
        } else {
            Duration::from_millis(50)
        };
        bell.wait(seen, nap);
    }
}

/// The server is about to wait in its event loop (`epoll_wait`, `poll`,
/// `select` and their variants): it has handled what it read.
pub fn on_loop() {
    let Some(m) = PUMP.get() else {
        return;
    };
    TURNS[turn_slot()].fetch_add(1, Ordering::AcqRel);
    if let Ok(mut p) = m.try_lock() {
        p.run();
    }
}

/// The server accepted a connection from `peer` on its app listener:
/// true when it is one of the pump's replay connections (`fd` is marked).
pub fn on_accept(fd: i32, peer: SocketAddr) -> bool {
    let Some(mut p) = pump() else {
        return false;
    };
    let Some(conn) = p.by_addr.remove(&canon(peer)) else {
        return false;
    };
    if let Some(c) = p.conns.get_mut(&conn) {
        c.server_fd = fd;
    }
    if let Some(slot) = fdtable::slot(fd) {
        slot.set_replay(conn);
    }
    log::debug!("fd {fd}: replay connection {conn}");
    p.run();
    true
}

/// The server read `n` bytes (0: EOF) from replay connection `conn`.
pub fn on_read(conn: u64, n: usize) {
    let Some(mut p) = pump() else {
        return;
    };
    if let Some(c) = p.conns.get_mut(&conn) {
        c.read_slot = turn_slot();
        c.read_turn = TURNS[c.read_slot].load(Ordering::Acquire);
        if n == 0 {
            c.eof = true;
        } else {
            c.consumed += n as u64;
        }
    }
    p.run();
}

/// The server wrote `segments` to replay connection `conn` (dropped; only
/// their digest is kept for the divergence check).
pub fn on_output(conn: u64, segments: &[&[u8]]) {
    let Some(mut p) = pump() else {
        return;
    };
    if let Some(c) = p.conns.get_mut(&conn) {
        for s in segments {
            let at = c.out.len as usize;
            if at < SHOWN {
                let n = (SHOWN - at).min(s.len());
                c.shown[at..at + n].copy_from_slice(&s[..n]);
            }
            c.out.update(s);
        }
    }
}

/// The server closed replay connection `conn`.
pub fn on_close(conn: u64) {
    let Some(mut p) = pump() else {
        return;
    };
    if let Some(c) = p.conns.get_mut(&conn) {
        c.closed = true;
        c.server_fd = -1;
    }
    p.run();
}

/// An address as one family (IPv4-mapped IPv6 as IPv4), so both ends of a
/// connection name it alike.
fn canon(a: SocketAddr) -> SocketAddr {
    match a.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), a.port()),
            None => a,
        },
        _ => a,
    }
}

/// Where the pump connects: the app address, loopback for a wildcard.
fn connect_addr(app: SocketAddr) -> SocketAddr {
    match app.ip() {
        IpAddr::V4(a) if a.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), app.port())
        }
        IpAddr::V6(a) if a.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), app.port())
        }
        _ => app,
    }
}

impl Pump {
    fn new(region: Arc<Region>, app: SocketAddr, max_entry: u32) -> Pump {
        let size = apply_ring_size(region.ring_size());
        Pump {
            region,
            app: connect_addr(app),
            max_entry,
            epoch: 0,
            reader: RingReader::new(size, 0, 1, max_entry),
            end_pos: 0,
            buf: Vec::new(),
            current: None,
            conns: HashMap::new(),
            by_addr: HashMap::new(),
            broken: false,
        }
    }

    /// Delivers entries until one is in flight or none is left.
    fn run(&mut self) {
        if self.region.role() == Role::Leader {
            return;
        }
        let (epoch, start) = self.region.apply().epoch();
        if epoch != self.epoch {
            self.restart(epoch, start);
        }

        loop {
            if let Some(cur) = self.current.take() {
                if let Some(cur) = self.progress(cur) {
                    self.current = Some(cur);
                    return;
                }
            }
            let tail = self.region.apply().tail();
            match self
                .reader
                .poll(self.region.apply_ring(), tail, &mut self.buf)
            {
                ReadOutcome::Entry { header, pos, len } => {
                    self.end_pos = pos + len as u64;
                    self.current = Some(self.begin(header));
                }
                ReadOutcome::Empty => return,
                other => {
                    // The follower never overwrites what is not read: a
                    // bug or a broken region. Said once per stream: this
                    // runs in the server's hooks.
                    if !std::mem::replace(&mut self.broken, true) {
                        log::error!("apply ring: {other:?}; waiting for a new stream");
                    }
                    return;
                }
            }
        }
    }

    /// A new stream starts at `start`: whatever was in flight is gone.
    fn restart(&mut self, epoch: u64, start: u64) {
        log::info!("applying from seq {start} (stream {epoch})");
        self.epoch = epoch;
        self.broken = false;
        self.end_all();
        self.current = None;
        let size = apply_ring_size(self.region.ring_size());
        self.reader = RingReader::new(size, 0, start, self.max_entry);
    }

    /// Ends every replay connection (the server reads EOF on each).
    fn end_all(&mut self) {
        for (_, c) in self.conns.drain() {
            let _ = c.stream.shutdown(Shutdown::Both);
        }
        self.by_addr.clear();
    }

    /// Starts delivering `h`: from now on the server reads its time.
    fn begin(&mut self, h: EntryHeader) -> Current {
        crate::clock::enter_input(h.time_us);
        match h.kind {
            Kind::Accept => self.open(h.seq),
            Kind::Data | Kind::Close => self.check_output(&h),
            Kind::View => self.end_all(),
            Kind::Noop | Kind::Wrap => {}
        }
        if h.kind == Kind::Close {
            if let Some(c) = self.conns.get(&h.conn) {
                let _ = c.stream.shutdown(Shutdown::Write);
            }
        }
        Current {
            header: h,
            sent: 0,
            consumed_at: None,
        }
    }

    /// Moves `cur` on; None once the server consumed it.
    fn progress(&mut self, mut cur: Current) -> Option<Current> {
        let h = cur.header;
        let done = match h.kind {
            Kind::Accept => self
                .conns
                .get(&h.seq)
                .is_none_or(|c| c.server_fd >= 0 || c.closed),
            Kind::Data => match self.conns.get_mut(&h.conn) {
                None => true,
                Some(c) if c.closed => true,
                Some(c) => {
                    let payload = &self.buf[HEADER_LEN..HEADER_LEN + h.len as usize];
                    while cur.sent < payload.len() {
                        match c.stream.write(&payload[cur.sent..]) {
                            Ok(n) => {
                                cur.sent += n;
                                c.written += n as u64;
                            }
                            Err(e) if e.kind() == ErrorKind::Interrupted => {}
                            // The server reads on: the read hook resumes.
                            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                            Err(e) => {
                                log::warn!("replay connection {}: write: {e}", h.conn);
                                c.closed = true;
                                break;
                            }
                        }
                    }
                    let consumed = cur.sent == payload.len() && c.consumed >= c.written;
                    if consumed && cur.consumed_at.is_none() {
                        cur.consumed_at = Some(Instant::now());
                    }
                    c.closed
                        || (consumed
                            // A reply sent over several turns is not
                            // complete while the server waits to write.
                            && !fdtable::slot(c.server_fd).is_some_and(|s| s.wants_write())
                            && (TURNS[c.read_slot].load(Ordering::Acquire) > c.read_turn
                                || cur
                                    .consumed_at
                                    .is_some_and(|t| t.elapsed() >= TURN_PATIENCE)))
                }
            },
            Kind::Close => {
                let done = self.conns.get(&h.conn).is_none_or(|c| c.eof || c.closed);
                if done {
                    self.conns.remove(&h.conn);
                }
                done
            }
            Kind::View | Kind::Noop | Kind::Wrap => true,
        };
        if !done {
            return Some(cur);
        }
        let a = self.region.apply();
        a.set_applied(h.seq);
        a.set_head(self.end_pos);
        None
    }

    /// ACCEPT: connects to the server (it accepts in its event loop).
    fn open(&mut self, conn: u64) {
        // A plain blocking connect: the kernel completes it from the
        // listener's backlog without the server's help.
        let stream = match TcpStream::connect(self.app) {
            Ok(s) => s,
            Err(e) => {
                log::error!(
                    "replay connection {conn}: cannot connect to the server at {}: {e}; its inputs are skipped",
                    self.app
                );
                return;
            }
        };
        let _ = stream.set_nodelay(true);
        let _ = stream.set_nonblocking(true);
        if let Ok(local) = stream.local_addr() {
            self.by_addr.insert(canon(local), conn);
        }
        self.conns.insert(
            conn,
            Conn {
                stream,
                server_fd: -1,
                written: 0,
                consumed: 0,
                read_slot: 0,
                read_turn: 0,
                eof: false,
                closed: false,
                out: OutputDigest::default(),
                shown: [0; SHOWN],
                last_input: conn,
            },
        );
    }

    /// DATA/CLOSE carry the leader's digest of the connection's output
    /// since its last input: compare with this server's, then start over.
    fn check_output(&mut self, h: &EntryHeader) {
        // Only an input's first entry carries a digest (the leader's
        // server read the whole input at once).
        if h.out_hash == 0 {
            return;
        }
        let Some(c) = self.conns.get_mut(&h.conn) else {
            return;
        };
        let mine = std::mem::take(&mut c.out);
        let prev = std::mem::replace(&mut c.last_input, h.seq);
        if mine.pack() == h.out_hash {
            return;
        }
        self.region.apply().add_diverged();
        let (_, leader_len) = OutputDigest::unpack(h.out_hash);
        let shown = &c.shown[..(mine.len as usize).min(SHOWN)];
        log::warn!(
            "divergence on connection {}: the output after seq {prev} differs from the leader's \
             (leader: {leader_len} bytes; this server: {} bytes, starting {:?})",
            h.conn,
            mine.len,
            String::from_utf8_lossy(shown)
        );
    }
}
