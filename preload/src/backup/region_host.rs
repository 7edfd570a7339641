//! The preload's host for the replay machine ([`crate::backup::replay`]): the
//! region's apply ring, the server threads' turn counters, the server's
//! clock and real replay connections, behind one lock.
//!
//! The functions here are what the hooks call; each takes the lock, turns
//! the call into the machine's, and lets it act through [`RegionHost`]. The
//! waits (a clock read for which the log does not say yet, a zero-timeout
//! wait that waits for the log's next turn) park on the apply doorbell
//! outside the lock.

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lockstep_common::entry::EntryHeader;
use lockstep_common::region::{apply_ring_size, Region, Role};
use lockstep_common::ring::{ReadOutcome, RingReader};
use once_cell::sync::OnceCell;

pub use crate::backup::replay::Served;
use crate::backup::replay::{Host, Replay};
use crate::determinism::clock::TurnReads;
use crate::determinism::turn_time;
use crate::determinism::turns::{self, MAX_WIDTH};
use crate::fdtable;

/// A clock read that waits this long for the log to say what it reads
/// gets a warning (once per read).
const SLOW_CLOCK: Duration = Duration::from_secs(5);

/// A byte was written into this replay connection (server fd) to wake a
/// server blocked in its wait; the server thread drains it (-1: none).
static BELL_FD: AtomicI32 = AtomicI32::new(-1);

/// Makes this server node `node` (its engine, its app address: see
/// `setup::take_identity`), None when it cannot be.
pub type TakeIdentity = fn(u64) -> Option<SocketAddr>;

/// The replay machine's world in a backup's server process.
pub struct RegionHost {
    /// The node whose region this is, as last seen (another after a
    /// restore from a peer's image: see [`RegionHost::moved_to`]).
    node: u64,
    /// Takes another node's identity (see [`RegionHost::moved_to`]).
    identity: TakeIdentity,
    /// That node's identity could not be taken: nothing is applied, as a
    /// replay connection would reach the app address of the node the
    /// image came from.
    foreign: bool,
    region: Arc<Region>,
    app: SocketAddr,
    max_entry: u32,
    reader: RingReader,
    /// The stream is unreadable (said once; a new stream starts over).
    broken: bool,
    /// The epoch of the stream being read (see [`RegionHost::in_stream`]).
    stream_epoch: u64,
    /// The replay connections' own ends.
    streams: HashMap<u64, TcpStream>,
    /// Replay connections the server has not accepted yet, by their
    /// address as the server sees it.
    by_addr: HashMap<SocketAddr, u64>,
    /// The origin of [`Host::now`].
    started: Instant,
}

impl RegionHost {
    fn new(
        region: Arc<Region>,
        app: SocketAddr,
        max_entry: u32,
        identity: TakeIdentity,
    ) -> RegionHost {
        let size = apply_ring_size(region.ring_size());
        RegionHost {
            node: region.node(),
            identity,
            foreign: false,
            region,
            app: connect_addr(app),
            max_entry,
            reader: RingReader::new(size, 0, 1, max_entry),
            broken: false,
            stream_epoch: 0,
            streams: HashMap::new(),
            by_addr: HashMap::new(),
            started: Instant::now(),
        }
    }

    /// Whether the follower still writes the stream this reads: after it
    /// started a new one (the head and applied words back at its start),
    /// a mark of the old stream would put them where the new one never
    /// was (the writer overrunning the reader, entries counted applied
    /// that were not), until the machine sees the new stream.
    fn in_stream(&self) -> bool {
        self.region.apply().epoch().0 == self.stream_epoch
    }

    /// The region belongs to node `node` now: this server was restored
    /// from another node's image (whose listener and replay connections
    /// the follower moved to this node's app address). Before anything
    /// else connects, the preload takes that node's identity.
    fn moved_to(&mut self, node: u64) {
        match (self.identity)(node) {
            Some(app) => self.app = connect_addr(app),
            None => self.foreign = true,
        }
        self.node = node;
    }
}

impl Host for RegionHost {
    fn stream(&mut self) -> Option<(u64, u64)> {
        let node = self.region.node();
        if node != self.node {
            self.moved_to(node);
        }
        if self.foreign || self.region.role() == Role::Leader {
            return None;
        }
        Some(self.region.apply().epoch())
    }

    fn read_from(&mut self, start: u64) {
        self.stream_epoch = self.region.apply().epoch().0;
        self.broken = false;
        let size = apply_ring_size(self.region.ring_size());
        self.reader = RingReader::new(size, 0, start, self.max_entry);
    }

    fn next_entry(&mut self, buf: &mut Vec<u8>) -> Option<(EntryHeader, u64)> {
        let tail = self.region.apply().tail();
        match self.reader.poll(self.region.apply_ring(), tail, buf) {
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

    fn set_head(&mut self, pos: u64) {
        if self.in_stream() {
            self.region.apply().set_head(pos);
        }
    }

    fn release(&mut self, pos: u64) {
        if self.in_stream() {
            self.region.apply().release(pos);
        }
    }

    fn set_applied(&mut self, seq: u64) {
        if self.in_stream() {
            self.region.apply().set_applied(seq);
        }
    }

    fn diverged(&mut self) {
        self.region.apply().add_diverged();
    }

    fn slot(&self) -> usize {
        turns::slot()
    }

    fn waits(&self, slot: usize) -> u64 {
        turns::count(slot)
    }

    fn running(&self, slot: usize) -> bool {
        turns::running(slot)
    }

    fn due(&self, view: u64, waits: u32) -> bool {
        turns::due(view, waits)
    }

    fn handed(&mut self, view: u64) {
        turns::handed(view);
    }

    fn batch_width(&self) -> usize {
        turns::batch_width()
    }

    fn wants_write(&self, fd: i32) -> bool {
        fdtable::slot(fd).is_some_and(|s| s.wants_write())
    }

    fn wait_mark(&self) -> u64 {
        crate::determinism::stack_depth::last_wait()
    }

    fn read_returned_from(&self, since: u64) -> bool {
        crate::determinism::stack_depth::read_returned_from(since)
    }

    fn loop_of(&self, fd: i32) -> Option<u64> {
        fdtable::slot(fd)
            .map(|s| s.wait_epfd())
            .filter(|e| *e >= 0)
            .map(crate::determinism::loops::of_epfd)
    }

    fn enter_input(&mut self, us: u64) {
        crate::determinism::clock::enter_input(us);
    }

    fn enter_turn(&mut self, turn: u64, us: u64) {
        crate::determinism::clock::enter_turn(turn, us);
    }

    fn enter_window(&mut self, turn: u64, anchor: u64, us: u64) {
        crate::determinism::clock::enter_window(turn, anchor, us);
    }

    fn connect(&mut self, conn: u64) -> bool {
        // A plain blocking connect: the kernel completes it from the
        // listener's backlog without the server's help.
        let stream = match TcpStream::connect(self.app) {
            Ok(s) => s,
            Err(e) => {
                log::error!(
                    "replay connection {conn}: cannot connect to the server at {}: {e}; its inputs are skipped",
                    self.app
                );
                return false;
            }
        };
        let _ = stream.set_nodelay(true);
        let _ = stream.set_nonblocking(true);
        if let Ok(local) = stream.local_addr() {
            self.by_addr.insert(canon(local), conn);
        }
        self.streams.insert(conn, stream);
        true
    }

    fn shut_write(&mut self, conn: u64) {
        if let Some(s) = self.streams.get(&conn) {
            let _ = s.shutdown(Shutdown::Write);
        }
    }

    fn disconnect(&mut self, conn: u64) {
        if let Some(s) = self.streams.remove(&conn) {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.by_addr.retain(|_, c| *c != conn);
    }

    fn ring_bell(&mut self, conn: u64, server_fd: i32) {
        if BELL_FD.load(Ordering::Acquire) >= 0 {
            return;
        }
        if let Some(mut s) = self.streams.get(&conn) {
            if matches!(s.write(&[0]), Ok(1)) {
                BELL_FD.store(server_fd, Ordering::Release);
            }
        }
    }

    fn bell_gone(&mut self, server_fd: i32) {
        // The next bell may ring.
        let _ = BELL_FD.compare_exchange(server_fd, -1, Ordering::AcqRel, Ordering::Acquire);
    }

    fn wake_loop(&mut self, id: u64) {
        crate::determinism::loops::ring(id);
    }

    fn now(&self) -> Duration {
        self.started.elapsed()
    }
}

/// The machine and its host, behind the one lock.
struct Pump {
    replay: Replay,
    host: RegionHost,
}

static PUMP: OnceCell<Mutex<Pump>> = OnceCell::new();

/// Sets up the replay for `region` and starts its applier thread (once).
pub fn start(region: Arc<Region>, app: SocketAddr, max_entry: u32, identity: TakeIdentity) {
    let pump = Pump {
        replay: Replay::new(),
        host: RegionHost::new(region.clone(), app, max_entry, identity),
    };
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

/// Runs `f` on the machine and its host under the lock (None: no replay
/// in this process).
fn with<T>(f: impl FnOnce(&mut Replay, &mut RegionHost) -> T) -> Option<T> {
    let mut guard = pump()?;
    let Pump { replay, host } = &mut *guard;
    Some(f(replay, host))
}

/// The applier thread: moves the replay on when the server is idle.
fn applier(region: Arc<Region>) {
    // Its own calls (connect's poll, writes) must not re-enter the pump.
    crate::reentry::own_thread();
    loop {
        let bell = region.apply().bell();
        let seen = bell.value();
        let busy = with(|r, h| {
            r.run(h);
            let busy = r.in_turn();
            if busy {
                r.say_if_stuck(h);
            }
            busy
        })
        .unwrap_or(false);
        let nap = if busy {
            Duration::from_millis(20)
        } else {
            Duration::from_millis(50)
        };
        bell.wait(seen, nap);
    }
}

/// The server is about to wait in its event loop `loop_id` (0: a
/// `poll`/`select` loop; see `loops`): it has handled what it read.
pub fn on_loop(loop_id: u64) {
    let Some(m) = PUMP.get() else {
        return;
    };
    if let Ok(mut p) = m.try_lock() {
        let Pump { replay, host } = &mut *p;
        replay.on_loop(host, loop_id);
    }
}

/// See [`Replay::must_not_block`].
pub fn must_not_block(loop_id: u64) -> bool {
    with(|r, h| r.must_not_block(h, loop_id)).unwrap_or(false)
}

/// A backup's wait that asks not to block (timeout 0) while the replay
/// has no turn in flight. The leader's server made the same wait, at the
/// same point (the backup's server is where the leader's was), and whether
/// that wait returned input is not in the log yet: the leader logs nothing
/// for a wait that found nothing, and the entries of one that found
/// something (a `SCRIPT KILL` read inside a busy script, a timer's `TICK`
/// with the children it reaped) may still be on their way. Returned at
/// once, the wait would let the server go on as if the leader's had found
/// nothing: a busy script ran on past the kill on every backup and
/// answered later clients `-BUSY`, a due timer ran outside its turn. So it
/// waits until the log says: the next turn of the log, whose wait count
/// (`EntryHeader::waits`) places it at this wait or a later one — then
/// this wait found nothing, as the hooks' `must_not_block` then lets it
/// see. A leader that goes on working logs that soon (its clock records,
/// its next turn); one that goes idle leaves this wait parked until its
/// next turn, as any wait for input would be. Not before the log has a
/// time (the server starts up: nothing of the log concerns it), once this
/// node leads or its server is stopping. True when a turn came. Only for a
/// wait of the server's event loop `loop_id` (the caller knows).
pub fn await_turn(loop_id: u64) -> bool {
    if crate::determinism::clock::stilled() {
        return false;
    }
    let since = Instant::now();
    let mut said = false;
    loop {
        let Some(p) = pump() else {
            return false;
        };
        let region = p.host.region.clone();
        if region.role() == Role::Leader || crate::determinism::clock::stopping() {
            return false;
        }
        if p.replay.in_turn() {
            return true;
        }
        if !said && since.elapsed() >= SLOW_CLOCK {
            said = true;
            log::debug!(
                "a wait that asks not to block waits for the log's next turn ({:.0?} so far: the leader logged none since)",
                since.elapsed()
            );
        }
        let seen = region.apply().bell().value();
        drop(p);
        region.apply().bell().wait(seen, Duration::from_millis(5));
        on_loop(loop_id);
    }
}

/// See [`Replay::turn_returned`].
pub fn turn_returned(loop_id: u64, delivers: bool) {
    with(|r, h| r.turn_returned(h, loop_id, delivers));
}

/// A backup's server thread reads the clock inside its turn (`at`: its
/// window and count; it reads `now` so far): the time the leader's
/// server read at the same read. Waits while the log does not say yet
/// (the record, a later one, or the end of the leader's turn is not in
/// the apply ring), as the server's wait would for its next input; not
/// once this node leads or its server is stopping.
pub fn time_at(at: TurnReads, now: u64) -> u64 {
    child_at(at, now).0
}

/// What read `at` of a backup's turn reads (see [`time_at`]) and the
/// child its record names: a poll for children (see `turn_time`) reaps
/// the child the leader's poll of the same count reaped, if any.
pub fn child_at(at: TurnReads, now: u64) -> (u64, Option<turn_time::Child>) {
    let mut now = now;
    let mut since = None;
    loop {
        let Some(mut p) = pump() else {
            return (now, None);
        };
        let region = p.host.region.clone();
        let seen = region.apply().bell().value();
        let Pump { replay, host } = &mut *p;
        match replay.time_lookup(host, at, now) {
            Ok(found) => return found,
            Err(us) => now = us,
        }
        drop(p);
        if region.role() == Role::Leader || crate::determinism::clock::stopping() {
            return (now, None);
        }
        let started: &mut Instant = since.get_or_insert_with(Instant::now);
        if started.elapsed() >= SLOW_CLOCK {
            log::warn!(
                "a clock read of the server's turn waits {:.0?} for the log (read {} after seq {})",
                started.elapsed(),
                at.count,
                at.anchor
            );
            *started = Instant::now();
        }
        region.apply().bell().wait(seen, Duration::from_millis(20));
    }
}

/// The server accepted a connection from `peer` on its app listener:
/// true when it is one of the replay connections (`fd` is marked).
pub fn on_accept(fd: i32, peer: SocketAddr) -> bool {
    with(|r, h| {
        let Some(conn) = h.by_addr.remove(&canon(peer)) else {
            return false;
        };
        r.accepted(h, conn, fd);
        if let Some(slot) = fdtable::slot(fd) {
            slot.set_replay(conn);
        }
        log::debug!("fd {fd}: replay connection {conn}");
        r.run(h);
        true
    })
    .unwrap_or(false)
}

/// See [`Replay::serve`].
pub fn serve(conn: u64, peek: bool, fill: &mut dyn FnMut(&[u8]) -> usize) -> Served {
    with(|r, h| r.serve(h, conn, peek, fill)).unwrap_or(Served::Empty)
}

/// See [`Replay::unread`].
pub fn unread() -> [i32; MAX_WIDTH] {
    with(|r, h| r.unread(h)).unwrap_or([-1; MAX_WIDTH])
}

/// After the server's wait: a byte rung to wake it is taken out again.
/// Returns the fd it was rung on: the kernel's read readiness of that fd
/// is the bell's, not the log's.
pub fn after_wait(mine: impl Fn(i32) -> bool) -> Option<i32> {
    // Only the wait that watches the bell's fd takes it: another thread's
    // wait (memcached's listener) would leave the reader asleep.
    let fd = BELL_FD.load(Ordering::Acquire);
    if fd < 0 || !mine(fd) {
        return None;
    }
    BELL_FD
        .compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Acquire)
        .ok()?;
    crate::sys::discard_input(fd);
    Some(fd)
}

/// The epoll keys of this turn's unread replay connections registered for
/// reading in `epfd`, in log order (`n` of them): those before the first
/// one that is not. A connection a listener thread handed to a worker
/// loop is not registered there until the worker took the hand-off (in a
/// later wait of its own): the connections behind it wait for that, or
/// the worker would read them first, against the log's order (memcached
/// `-t 1` stored an `append` before the `set` the leader ran first).
pub fn epoll_unread(epfd: i32) -> ([u64; MAX_WIDTH], usize) {
    let mut keys = [0; MAX_WIDTH];
    let mut n = 0;
    for fd in unread().into_iter().take_while(|fd| *fd >= 0) {
        let Some(s) = fdtable::slot(fd).filter(|s| s.wait_epfd() == epfd) else {
            break;
        };
        keys[n] = s.wait_key();
        n += 1;
    }
    (keys, n)
}

/// Builds what an epoll wait returns: `events[..real]` came from the
/// kernel, `events[real..]` is room for `unread` (log order), which go
/// first (after the kernel's when `kernel_first`: see
/// [`Replay::kernel_first`]), readable; a kernel event for one of them
/// adds its other bits, and the bell's readiness (`bell`: its key) is
/// dropped. Returns the count.
pub fn merge_events(
    events: &mut [libc::epoll_event],
    real: usize,
    unread: &[u64],
    bell: Option<u64>,
    kernel_first: bool,
) -> usize {
    let k = unread.len();
    let total = events.len().min(real + k);
    // The kernel's events move behind the log's.
    events.copy_within(..real.min(total - k), k);
    for (e, key) in events.iter_mut().zip(unread) {
        *e = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: *key,
        };
    }
    let mut out = k;
    for i in k..total {
        let mut e = events[i];
        let key = e.u64;
        if let Some(j) = unread.iter().position(|u| *u == key) {
            events[j].events |= e.events & !(libc::EPOLLIN as u32);
            continue;
        }
        if Some(key) == bell {
            e.events &= !((libc::EPOLLIN | libc::EPOLLRDNORM) as u32);
            if e.events == 0 {
                continue;
            }
        }
        events[out] = e;
        out += 1;
    }
    if kernel_first {
        events[..out].rotate_left(k);
    }
    out
}

/// See [`Replay::kernel_first`].
pub fn kernel_first() -> bool {
    with(|r, _| r.kernel_first()).unwrap_or(false)
}

/// The server wrote `segments` to replay connection `conn` (see
/// [`Replay::output`]).
pub fn on_output(conn: u64, segments: &[&[u8]]) {
    with(|r, _| r.output(conn, segments));
}

/// The server closed replay connection `conn`.
pub fn on_close(conn: u64) {
    with(|r, h| r.closed(h, conn));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_logs_connections_come_first_in_log_order_and_the_bell_is_dropped() {
        let ev = |key: u64, events: u32| libc::epoll_event { events, u64: key };
        let (inn, out) = (libc::EPOLLIN as u32, libc::EPOLLOUT as u32);
        // The kernel returned: another fd (key 5), the bell's fd (key 9,
        // readable only), and conn 71 writable; the log has bytes for 72
        // then 71. Two slots of room follow the kernel's three.
        let mut got = [ev(5, inn), ev(9, inn), ev(71, out), ev(0, 0), ev(0, 0)];
        let n = merge_events(&mut got, 3, &[72, 71], Some(9), false);
        let view: Vec<(u64, u32)> = got[..n].iter().map(|e| (e.u64, e.events)).collect();
        assert_eq!(view, [(72, inn), (71, inn | out), (5, inn)]);
        // The listener (key 3) first: the leader accepted before it read.
        let mut got = [ev(3, inn), ev(9, inn), ev(71, out), ev(0, 0), ev(0, 0)];
        let n = merge_events(&mut got, 3, &[72, 71], Some(9), true);
        let view: Vec<(u64, u32)> = got[..n].iter().map(|e| (e.u64, e.events)).collect();
        assert_eq!(view, [(3, inn), (72, inn), (71, inn | out)]);
    }

    #[test]
    fn without_the_logs_bytes_the_kernels_events_stand() {
        let ev = |key: u64| libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: key,
        };
        let mut got = [ev(5), ev(6)];
        assert_eq!(merge_events(&mut got, 2, &[], None, false), 2);
        assert_eq!((got[0].u64, got[1].u64), (5, 6));
    }
}
