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
//! Only one *turn* is in flight: the entries the leader's server read in
//! one event-loop turn (the leader flags them, `entry::SAME_TURN`), for at
//! most [`turns::batch_width`] connections, each once (see [`joins`]). The
//! next turn is written once the server consumed the last (the read hook
//! counts the bytes, in this process) and went back to its event loop (the
//! `epoll_wait`/`poll`/`select` hooks tell: by then it wrote whatever it
//! answers). That keeps the leader's exact cross-connection order, and
//! each reply lands in the same per-input interval as on the leader,
//! without any round trip to another process. Within a turn the server
//! must take the connections in log order: the epoll hook sorts the wait's
//! events so ([`order_events`]; the kernel lists a connection that was
//! ready in the last turn first), and a server that scans its own fd order
//! (`poll`, `select`) is handed one connection per turn. Entries of
//! different leader turns never share one: a server that changes a
//! connection's interest between turns (beanstalkd sends a reply in the
//! turn after the request) sees them as its leader did.
//!
//! The pump advances from the hooks themselves (the server thread that
//! re-enters its event loop writes the next turn, which its wait then
//! finds ready at once) and, when the server is idle, from a small applier
//! thread parked on the apply doorbell. A server that never waits in one of
//! those calls is still served: a consumed turn is taken as handled after
//! [`TURN_PATIENCE`].
//!
//! The server's replies on replay connections are dropped in the write hook
//! without a syscall. Their digest is compared, entry by entry, with the
//! digest the leader logged with the connection's next input: a divergence
//! names the connection, the seq whose output differed and the first bytes
//! this server wrote.

use std::collections::HashMap;
use std::io::{ErrorKind, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lockstep_common::entry::{EntryHeader, Kind, OutputDigest, HEADER_LEN, SAME_TURN};
use lockstep_common::region::{apply_ring_size, Region, Role};
use lockstep_common::ring::{ReadOutcome, RingReader};
use once_cell::sync::OnceCell;

use crate::fdtable;
use crate::turns::{self, MAX_WIDTH};

/// Bytes of a replay connection's output kept to show in a divergence.
const SHOWN: usize = 48;
/// A consumed turn counts as handled after this long even when the server
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
    /// The thread that last read from it, and its turn count then.
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

/// One entry of the turn being handed over.
struct Item {
    header: EntryHeader,
    /// Where its payload starts in `Pump::payloads`.
    at: usize,
    /// Payload bytes written so far.
    sent: usize,
}

/// The server fds of the replay connections handed over in the current
/// turn, in log order (`ORDER_LEN` of them): what `order_events` sorts
/// by. Outside the mutex: the wait hook reads it.
static ORDER: [AtomicI32; MAX_WIDTH] = [const { AtomicI32::new(-1) }; MAX_WIDTH];
static ORDER_LEN: AtomicUsize = AtomicUsize::new(0);

/// The passive preload's applier state (one per process, behind a mutex).
pub struct Pump {
    region: Arc<Region>,
    app: SocketAddr,
    max_entry: u32,
    epoch: u64,
    reader: RingReader,
    /// The entry read last (header and payload).
    buf: Vec<u8>,
    /// An entry read but left for the next turn, and the ring position
    /// just past it; its bytes are in `buf`.
    held: Option<(EntryHeader, u64)>,
    /// The turn being handed over (empty: none), its payloads, the ring
    /// position just past its last entry, and when the server had
    /// consumed all of it.
    turn: Vec<Item>,
    /// The turn's headers (kept to reuse the allocation).
    headers: Vec<EntryHeader>,
    payloads: Vec<u8>,
    turn_end: u64,
    consumed_at: Option<Instant>,
    conns: HashMap<u64, Conn>,
    /// The stream is unreadable (said once; a new stream starts over).
    broken: bool,
    /// Replay connections the server has not accepted yet, by their
    /// address as the server sees it.
    by_addr: HashMap<SocketAddr, u64>,
}

static PUMP: OnceCell<Mutex<Pump>> = OnceCell::new();

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
            !p.turn.is_empty()
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
    // The server handles this connection's input now: it reads its time.
    if let Some(i) = p.turn.iter().find(|i| i.header.conn == conn) {
        crate::clock::enter_input(i.header.time_us);
    }
    if let Some(c) = p.conns.get_mut(&conn) {
        c.read_slot = turns::slot();
        c.read_turn = turns::count(c.read_slot);
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

/// Puts the replay connections of the current turn among `events` (what
/// an epoll wait returned) in log order, in the places they hold: the
/// kernel lists a connection that was ready in the last turn first, the
/// leader's server handled them in the order its log holds.
pub fn order_events(events: &mut [libc::epoll_event]) {
    let n = ORDER_LEN.load(Ordering::Acquire).min(MAX_WIDTH);
    if n < 2 {
        return;
    }
    let mut keys = [0u64; MAX_WIDTH];
    for (k, fd) in keys.iter_mut().zip(&ORDER[..n]) {
        *k = fdtable::slot(fd.load(Ordering::Relaxed)).map_or(0, |s| s.wait_key());
    }
    let mut places = [0usize; MAX_WIDTH];
    let mut ranked = [(0usize, 0usize, 0u32, 0u64); MAX_WIDTH];
    let mut m = 0;
    for (i, e) in events.iter().enumerate() {
        let key = e.u64;
        if let Some(rank) = keys[..n].iter().position(|k| *k == key) {
            if m < MAX_WIDTH {
                places[m] = i;
                ranked[m] = (rank, i, e.events, key);
                m += 1;
            }
        }
    }
    // Unstable sort: no allocation in the hook; (rank, place) is unique.
    ranked[..m].sort_unstable_by_key(|r| (r.0, r.1));
    for (place, (_, _, ev, key)) in places[..m].iter().zip(&ranked[..m]) {
        events[*place] = libc::epoll_event { events: *ev, u64: *key };
    }
}

/// Whether `next` may join `turn` (entries the leader's server read in one
/// turn; `width`: how many connections one turn may hand over).
///
/// Only DATA and CLOSE join, only when the leader flagged the entry as read
/// in the same turn as the one before. A connection appears once, except
/// for the later chunks of one read (an input's first entry carries the
/// digest of the output since the last one, checked when the turn starts:
/// a second input of the connection in the same turn would be checked
/// before the server answered the first).
fn joins(turn: &[EntryHeader], next: &EntryHeader, width: usize) -> bool {
    let Some(last) = turn.last() else {
        return true;
    };
    if next.flags & SAME_TURN == 0
        || !matches!(next.kind, Kind::Data | Kind::Close)
        || !matches!(last.kind, Kind::Data | Kind::Close)
        || next.seq != last.seq + 1
    {
        return false;
    }
    if next.conn == last.conn {
        return next.kind == Kind::Data && last.kind == Kind::Data && next.out_hash == 0;
    }
    let mut conns = 1;
    for (i, h) in turn.iter().enumerate() {
        if h.conn == next.conn {
            return false;
        }
        if i > 0 && turn[i - 1].conn != h.conn {
            conns += 1;
        }
    }
    conns < width
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
            buf: Vec::new(),
            held: None,
            turn: Vec::new(),
            headers: Vec::new(),
            payloads: Vec::new(),
            turn_end: 0,
            consumed_at: None,
            conns: HashMap::new(),
            by_addr: HashMap::new(),
            broken: false,
        }
    }

    /// Hands over turns until one is in flight or none is left.
    fn run(&mut self) {
        if self.region.role() == Role::Leader {
            return;
        }
        let (epoch, start) = self.region.apply().epoch();
        if epoch != self.epoch {
            self.restart(epoch, start);
        }
        loop {
            if !self.turn.is_empty() {
                if !self.progress() {
                    return;
                }
                self.finish();
            }
            if !self.take_turn() {
                return;
            }
        }
    }

    /// The next entry (a held one first) and the ring position past it;
    /// its bytes are in `buf`.
    fn next_entry(&mut self) -> Option<(EntryHeader, u64)> {
        if let Some(h) = self.held.take() {
            return Some(h);
        }
        let tail = self.region.apply().tail();
        match self
            .reader
            .poll(self.region.apply_ring(), tail, &mut self.buf)
        {
            ReadOutcome::Entry { header, pos, len } => Some((header, pos + len as u64)),
            ReadOutcome::Empty => None,
            other => {
                // The follower never overwrites what is not read: a bug or
                // a broken region. Said once per stream: this runs in the
                // server's hooks.
                if !std::mem::replace(&mut self.broken, true) {
                    log::error!("apply ring: {other:?}; waiting for a new stream");
                }
                None
            }
        }
    }

    /// Takes the next turn from the log and starts handing it over: false
    /// when there is none.
    fn take_turn(&mut self) -> bool {
        let width = turns::batch_width();
        let mut headers = std::mem::take(&mut self.headers);
        headers.clear();
        while let Some((h, end)) = self.next_entry() {
            if !joins(&headers, &h, width) {
                self.held = Some((h, end));
                break;
            }
            let at = self.payloads.len();
            if h.kind == Kind::Data {
                self.payloads
                    .extend_from_slice(&self.buf[HEADER_LEN..HEADER_LEN + h.len as usize]);
            }
            self.turn.push(Item {
                header: h,
                at,
                sent: 0,
            });
            self.turn_end = end;
            headers.push(h);
        }
        for h in &headers {
            self.begin(*h);
        }
        self.headers = headers;
        if self.turn.is_empty() {
            return false;
        }
        self.publish_order();
        true
    }

    /// A new stream starts at `start`: whatever was in flight is gone.
    fn restart(&mut self, epoch: u64, start: u64) {
        log::info!("applying from seq {start} (stream {epoch})");
        self.epoch = epoch;
        self.broken = false;
        self.end_all();
        self.clear_turn();
        self.held = None;
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

    /// Starts handing over `h`: from now on the server reads its time.
    fn begin(&mut self, h: EntryHeader) {
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
    }

    /// Tells the wait hook the log order of this turn's connections.
    fn publish_order(&self) {
        let mut n = 0;
        for item in &self.turn {
            let Some(c) = self.conns.get(&item.header.conn) else {
                continue;
            };
            if n > 0 && ORDER[n - 1].load(Ordering::Relaxed) == c.server_fd {
                continue;
            }
            if n == MAX_WIDTH {
                break;
            }
            ORDER[n].store(c.server_fd, Ordering::Relaxed);
            n += 1;
        }
        ORDER_LEN.store(n, Ordering::Release);
    }

    /// The turn is over (or gone).
    fn clear_turn(&mut self) {
        ORDER_LEN.store(0, Ordering::Release);
        self.turn.clear();
        self.payloads.clear();
        self.consumed_at = None;
    }

    /// The server handled the whole turn: the follower may reuse its space.
    fn finish(&mut self) {
        if let Some(last) = self.turn.last() {
            let a = self.region.apply();
            a.set_applied(last.header.seq);
            a.set_head(self.turn_end);
        }
        self.clear_turn();
    }

    /// Moves the turn on: true once the server handled all of it.
    fn progress(&mut self) -> bool {
        let mut all_consumed = true;
        let mut done = true;
        for item in self.turn.iter_mut() {
            let h = item.header;
            let item_done = match h.kind {
                Kind::Accept => self
                    .conns
                    .get(&h.seq)
                    .is_none_or(|c| c.server_fd >= 0 || c.closed),
                Kind::Data => match self.conns.get_mut(&h.conn) {
                    None => true,
                    Some(c) if c.closed => true,
                    Some(c) => {
                        let payload = &self.payloads[item.at..item.at + h.len as usize];
                        while item.sent < payload.len() {
                            match c.stream.write(&payload[item.sent..]) {
                                Ok(n) => {
                                    item.sent += n;
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
                        let consumed = item.sent == payload.len() && c.consumed >= c.written;
                        all_consumed &= consumed || c.closed;
                        c.closed
                            || (consumed
                                // A reply sent over several turns is not
                                // complete while the server waits to write.
                                && !fdtable::slot(c.server_fd).is_some_and(|s| s.wants_write())
                                && (turns::count(c.read_slot) > c.read_turn
                                    || self
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
            done &= item_done;
        }
        if all_consumed && self.consumed_at.is_none() {
            self.consumed_at = Some(Instant::now());
        }
        done
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

#[cfg(test)]
mod tests {
    use super::*;

    fn data(seq: u64, conn: u64, same: bool, out_hash: u64) -> EntryHeader {
        let mut h = EntryHeader::new(Kind::Data, 1, seq, conn, 3);
        h.out_hash = out_hash;
        if same {
            h.flags = SAME_TURN;
        }
        h
    }

    #[test]
    fn entries_of_one_leader_turn_join_up_to_the_width() {
        let t = [data(10, 1, false, 7), data(11, 2, true, 7)];
        assert!(joins(&[], &data(10, 1, false, 7), 4), "a turn starts anywhere");
        assert!(joins(&t[..1], &t[1], 4));
        assert!(joins(&t, &data(12, 3, true, 7), 4));
        assert!(!joins(&t, &data(12, 3, true, 7), 2), "two connections at most");
        assert!(!joins(&t, &data(12, 3, false, 7), 4), "the leader's next turn");
        assert!(!joins(&t, &data(13, 3, true, 7), 4), "not the next seq");
    }

    #[test]
    fn a_connection_comes_back_only_with_a_later_chunk_of_its_read() {
        let t = [data(10, 1, false, 7), data(11, 2, true, 7)];
        assert!(joins(&t, &data(12, 2, true, 0), 4), "a later chunk of one read");
        assert!(!joins(&t, &data(12, 2, true, 9), 4), "a second input of conn 2");
        assert!(!joins(&t, &data(12, 1, true, 0), 4), "conn 1 after another");
        let mut close = data(12, 2, true, 5);
        close.kind = Kind::Close;
        assert!(!joins(&t, &close, 4), "EOF after an input of the same turn");
        close.conn = 3;
        assert!(joins(&t, &close, 4), "another connection's EOF");
    }

    #[test]
    fn only_inputs_join() {
        let mut accept = data(11, 0, true, 0);
        accept.kind = Kind::Accept;
        assert!(!joins(&[data(10, 1, false, 7)], &accept, 4));
        assert!(!joins(&[accept], &data(12, 1, true, 7), 4));
        let mut view = data(11, 0, true, 0);
        view.kind = Kind::View;
        assert!(!joins(&[data(10, 1, false, 7)], &view, 4));
    }

    #[test]
    fn events_of_the_turn_come_back_in_log_order_in_their_places() {
        // Replay connections on fds 900, 901, 902 registered under keys
        // 70, 71, 72; the turn hands over 902, 900, 901 in that order.
        for (fd, key) in [(900, 70), (901, 71), (902, 72)] {
            let s = fdtable::slot(fd).unwrap();
            s.set_replay(fd as u64);
            s.set_wait_key(key);
        }
        for (i, fd) in [902, 900, 901].into_iter().enumerate() {
            ORDER[i].store(fd, Ordering::Relaxed);
        }
        ORDER_LEN.store(3, Ordering::Release);
        let ev = |key: u64, events: u32| libc::epoll_event { events, u64: key };
        // The kernel listed 900 and 901 first (ready last turn), another
        // fd (key 5) sits between them.
        let mut got = [ev(70, 1), ev(5, 4), ev(71, 1), ev(72, 1)];
        order_events(&mut got);
        let keys: Vec<u64> = got.iter().map(|e| e.u64).collect();
        assert_eq!(keys, [72, 5, 70, 71]);
        ORDER_LEN.store(0, Ordering::Release);
        for fd in [900, 901, 902] {
            fdtable::slot(fd).unwrap().clear();
        }
    }
}
