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
//! - `DATA`: the server reads the entry's bytes from the log: the read
//!   hook copies them out of the pump (`serve`), and the wait hooks report
//!   the connection readable while the log holds bytes for it. No byte
//!   goes through the socket: a loopback write, its TCP processing and the
//!   server's read syscall cost about four times what the server's own
//!   work on a small command does (measured with `perf`: apply went from
//!   58k to 230k entries/s on 2 cores).
//! - `CLOSE`: the pump shuts its end down; the server reads EOF.
//! - `VIEW`: every replay connection ends (the new view's clients connect
//!   to its leader).
//! - `TICK`: a turn of the leader's server that read no input but moved
//!   its clock (see `clock`): the named loop's thread (see `loops`) runs
//!   one turn at the tick's time — its wait returns without blocking (its
//!   alarm wakes it) — and the tick is done when it waits again.
//!
//! Only one *turn* is in flight: the entries the leader's server read in
//! one event-loop turn (the leader flags them, `entry::SAME_TURN`), for at
//! most [`turns::batch_width`] connections, each once (see `joins`). The
//! next turn starts once the server read the last and went back to its
//! event loop (the `epoll_wait`/`poll`/`select` hooks tell: by then it
//! wrote whatever it answers). That keeps the leader's exact
//! cross-connection order, and each reply lands in the same per-input
//! interval as on the leader, without any round trip to another process.
//! Within a turn the server takes the connections in log order: an epoll
//! wait returns them first, in that order ([`merge_events`]); a server
//! that scans its own fd order (`poll`, `select`) is handed one connection
//! per turn. Entries of different leader turns never share one: a server
//! that changes a connection's interest between turns (beanstalkd sends a
//! reply in the turn after the request) sees them as its leader did; a
//! CLOSE is a turn of its own (the kernel reports the EOF, in its order).
//!
//! The pump advances from the hooks themselves (the server thread that
//! re-enters its event loop takes the next turn, which its wait then
//! reports at once) and, when the server is idle, from a small applier
//! thread parked on the apply doorbell. The log's bytes make no fd ready,
//! so that thread wakes a server blocked in its wait with one byte into
//! the turn's first connection (the *bell*), which the wait hook takes out
//! again. A server that never waits in one of those calls is still served:
//! a consumed turn is taken as handled after `TURN_PATIENCE`. Replay
//! connections must be non-blocking (a read with nothing in the log gets
//! EAGAIN), as in every event-loop server.
//!
//! The server's replies on replay connections are dropped in the write hook
//! without a syscall. Their digest is compared, entry by entry, with the
//! digest the leader logged with the connection's next input: a divergence
//! names the connection, the seq whose output differed and the first bytes
//! this server wrote.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lockstep_common::entry::{EntryHeader, Kind, OutputDigest, HEADER_LEN, SAME_TURN};
use lockstep_common::region::{apply_ring_size, Region, Role};
use lockstep_common::ring::{ReadOutcome, RingReader};
use once_cell::sync::OnceCell;

use crate::clock::TurnReads;
use crate::fdtable;
use crate::output_check::{Budget, PendingOutput, Verdict};
use crate::turn_time::{self, Record};
use crate::turns::{self, MAX_WIDTH};

/// A consumed turn counts as handled after this long even when the server
/// did not re-enter an event-loop wait the hooks see.
const TURN_PATIENCE: Duration = Duration::from_millis(500);
/// How long a turn may stay in flight before a warning names what it
/// waits for.
const TURN_STUCK: Duration = Duration::from_secs(5);
/// A clock read that waits this long for the log to say what it reads
/// gets a warning (once per read).
const SLOW_CLOCK: Duration = Duration::from_secs(5);

/// One replay connection.
struct Conn {
    /// The pump's end.
    stream: TcpStream,
    /// The server's end (-1 until the server accepted it).
    server_fd: i32,
    /// The bytes of the current turn for the server to read (a range of
    /// `Pump::payloads`) and how far it read them.
    inbox: (usize, usize),
    served: usize,
    /// The thread that last handled it (accepted it, read from it, read
    /// its EOF or closed it), and its turn count then: the turn is over
    /// when that thread waits again.
    handled_slot: usize,
    handled_turn: u64,
    /// The thread that last read its input (None: not read yet). Not the
    /// one that accepted it: a listener thread hands its connections to
    /// worker loops (memcached), and only the reader's wait sees a turn of
    /// the connection without the bell.
    read_slot: Option<usize>,
    /// The log ended the connection (CLOSE): its end is shut, the server
    /// reads EOF once the inbox is empty.
    closing: bool,
    /// The server read EOF, or closed its end.
    eof: bool,
    closed: bool,
    /// Output no digest of the leader's covered yet (what the leader's
    /// digest of an input covers is the output before the turn that read
    /// it: see `Pump::cut`).
    pending: PendingOutput,
    /// Seq of the connection's last input (whose output `pending` begins
    /// with).
    last_input: u64,
    /// Which of its replies differ per node by design.
    replies: crate::node_dependent::Replies,
}

impl Conn {
    /// Whether the server has bytes of the turn in flight to read here
    /// (a closing connection's end is the kernel's to report).
    fn has_unread(&self) -> bool {
        !self.closing && self.served < self.inbox.1
    }

    /// The calling server thread handled this connection in its current
    /// turn.
    fn handled_here(&mut self) {
        self.handled_slot = turns::slot();
        self.handled_turn = turns::count(self.handled_slot);
    }
}

/// What a read of a replay connection gets.
#[derive(Debug, PartialEq, Eq)]
pub enum Served {
    /// This many bytes of the log.
    Bytes(usize),
    /// The connection ended in the log.
    Eof,
    /// Nothing yet (EAGAIN).
    Empty,
}

/// A byte was written into this replay connection (server fd) to wake a
/// server blocked in its wait; the server thread drains it (-1: none).
static BELL_FD: AtomicI32 = AtomicI32::new(-1);

/// The passive preload's applier state (one per process, behind a mutex).
pub struct Pump {
    /// The node whose region this is, as the pump last saw it (another
    /// after a restore from a peer's image: see [`Pump::moved_to`]).
    node: u64,
    /// That node's identity could not be taken (see [`Pump::moved_to`]):
    /// nothing is applied, as a replay connection would reach the app
    /// address of the node the image came from.
    foreign: bool,
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
    turn: Vec<EntryHeader>,
    payloads: Vec<u8>,
    turn_end: u64,
    consumed_at: Option<Instant>,
    /// When the turn in flight was first found unfinished, and whether a
    /// warning said it is stuck (once per turn).
    pending_since: Option<Instant>,
    stuck_said: bool,
    /// The seq of the entry read last (clock records included).
    prev_seq: u64,
    /// The clock records of the turn in flight not read yet (see
    /// `turn_time`), the input the next one counts from, and whether the
    /// log already says no more of them come.
    times: VecDeque<Record>,
    anchor: u64,
    closed: bool,
    /// Clock records read before their turn's first input (or `TICK`):
    /// the start of a leader's turn whose kind is not known yet.
    stash: Vec<Record>,
    /// The highest seq the turn in flight took from the log.
    turn_last: u64,
    /// The first seq of the leader turn the last cut was taken at (see
    /// `cut`), and the connection of the last input handed over.
    cut_at: u64,
    last_input_conn: u64,
    /// The turn in flight's output checks are still to run (see
    /// `check_turn`), from a cut at this seq when it begins a leader turn.
    checks_due: Option<Option<u64>>,
    /// The waits the leader's thread entered before the turn in flight
    /// (`EntryHeader::waits` of its first entry, or of its first clock
    /// record), those of the stash's turn, and whether a server thread
    /// started handling the turn.
    turn_waits: u32,
    stash_waits: u32,
    started: bool,
    /// The `TICK` being handed over: its loop, and the thread (slot) whose
    /// wait of that loop returned for it with its wait count then.
    tick: Option<(u64, Option<(usize, u64)>)>,
    conns: HashMap<u64, Conn>,
    /// The connections' unmatched output, against its bound.
    kept: Budget,
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
    crate::reentry::own_thread();
    loop {
        let bell = region.apply().bell();
        let seen = bell.value();
        let busy = pump().is_some_and(|mut p| {
            p.run();
            let busy = !p.turn.is_empty();
            if busy {
                p.say_if_stuck();
            }
            busy
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
        p.run_from(true);
    }
}

/// Whether a wait of loop `loop_id` must not block: a `TICK` of that loop
/// waits for the loop's next turn, or a turn of that loop waits for the
/// calling thread to enter as many waits as the leader's did before it
/// (`EntryHeader::waits`; the server runs them without blocking).
pub fn must_not_block(loop_id: u64) -> bool {
    pump().is_some_and(|p| {
        let tick = p
            .tick
            .is_some_and(|(id, taken)| id == loop_id && taken.is_none());
        let held_back = !p.started
            && p.turn.first().is_some_and(|f| {
                f.kind == Kind::Data && f.turn_loop.map(u64::from) == Some(loop_id)
            })
            && !p.due();
        tick || held_back
    })
}

/// A backup's epoll timeout: none when a tick is due (this wait is its
/// turn); unbounded while the log has no time (the server's clock stands
/// at the origin, so no timer of its can come due: the first entry's bell
/// or alarm wakes it, a signal too); else the server's.
pub fn wait_timeout(tick: bool, timeout: i32) -> i32 {
    if tick {
        0
    } else if crate::clock::stilled()
        && crate::setup::engine().is_some_and(|e| e.region.role() != Role::Leader)
    {
        -1
    } else {
        timeout
    }
}

/// A backup's wait that asks not to block (timeout 0) while the pump has
/// no turn in flight: the server has a timer due (or polls inside a
/// command), and a due timer must run in the turn the leader ran it in,
/// whose entries may not be here yet — the leader's previous turn moved
/// the time past the timer with clock records, and its next turn (a
/// `TICK`, maybe with records of children it reaped) is on its way.
/// Returned at once, the wait would let the server run the timer outside
/// any turn (its cron then reaped a child for real where the log named no
/// reap). So it waits for the log's next entries: up to
/// [`TURN_NEWS_WAIT`] when the log has said nothing yet, longer
/// ([`TURN_STARTED_WAIT`]) when records of a turn whose kind is not known
/// yet are here (that turn comes for sure). True when a turn came. Only
/// for a wait of the server's event loop (the caller knows).
pub fn await_turn() -> bool {
    let since = Instant::now();
    loop {
        let Some(p) = pump() else {
            return false;
        };
        if p.region.role() == Role::Leader || crate::clock::stopping() {
            return false;
        }
        if !p.turn.is_empty() {
            return true;
        }
        let limit = if p.stash.is_empty() {
            TURN_NEWS_WAIT
        } else {
            TURN_STARTED_WAIT
        };
        let Some(left) = limit.checked_sub(since.elapsed()).filter(|d| !d.is_zero()) else {
            return false;
        };
        let region = p.region.clone();
        let seen = region.apply().bell().value();
        drop(p);
        region
            .apply()
            .bell()
            .wait(seen, left.min(Duration::from_millis(5)));
        on_loop();
    }
}

/// How long [`await_turn`] waits when the log has said nothing yet.
const TURN_NEWS_WAIT: Duration = Duration::from_millis(20);
/// How long [`await_turn`] waits when a turn's clock records are here.
const TURN_STARTED_WAIT: Duration = Duration::from_secs(2);

/// The server's wait in loop `loop_id` returned, on this thread: the turn
/// in flight starts here when it is this loop's, and the thread's clock
/// reads its time from now on. A `TICK` of this loop: this turn is the
/// tick's. DATA: when the wait reported the log's bytes (`delivers`) — a
/// wait that returned for anything else must not run the server's timers
/// at the turn's time before it read the turn's input. The kernel-reported
/// ACCEPT and CLOSE: in the loop whose turn read them on the leader (any
/// loop, for entries that do not name it). A `VIEW` is no loop's turn.
pub fn turn_returned(loop_id: u64, delivers: bool) {
    let Some(mut p) = pump() else {
        return;
    };
    let Some(first) = p.turn.first().copied() else {
        return;
    };
    if p.started && first.kind != Kind::Tick {
        return;
    }
    let due = p.due();
    let mine = match first.kind {
        Kind::Tick => match &mut p.tick {
            Some((id, taken @ None)) if *id == loop_id && due => {
                let slot = turns::slot();
                *taken = Some((slot, turns::count(slot)));
                true
            }
            _ => false,
        },
        _ => runs_in(&first, loop_id, delivers),
    };
    if mine {
        p.check_turn();
        p.started = true;
        turns::handed(first.view);
        crate::clock::enter_turn(first.seq, first.time_us);
    }
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
        let region = p.region.clone();
        let seen = region.apply().bell().value();
        match p.time_lookup(at, now) {
            Ok(found) => return found,
            Err(us) => now = us,
        }
        drop(p);
        if region.role() == Role::Leader || crate::clock::stopping() {
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

/// Whether a turn starting with `first` (not a `TICK`) runs in the wait of
/// loop `loop_id` that just returned (`delivers`: it reported the log's
/// bytes); see [`turn_returned`].
fn runs_in(first: &EntryHeader, loop_id: u64, delivers: bool) -> bool {
    match first.kind {
        Kind::Data => delivers,
        Kind::Accept | Kind::Close => first.turn_loop.is_none_or(|l| u64::from(l) == loop_id),
        Kind::Tick | Kind::View | Kind::Noop | Kind::Wrap | Kind::Time => false,
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
        c.handled_here();
    }
    // The server's clock reads count from the accept, as the leader's did.
    if let Some(h) = p
        .turn
        .iter()
        .find(|h| h.kind == Kind::Accept && h.seq == conn)
    {
        crate::clock::enter_window(h.seq, h.seq, h.time_us);
    }
    if let Some(slot) = fdtable::slot(fd) {
        slot.set_replay(conn);
    }
    log::debug!("fd {fd}: replay connection {conn}");
    p.run();
    true
}

/// The server reads replay connection `conn`: `fill` copies bytes into
/// its buffers and returns how many it took. A peek (`peek`) takes
/// nothing.
pub fn serve(conn: u64, peek: bool, fill: &mut dyn FnMut(&[u8]) -> usize) -> Served {
    let Some(mut guard) = pump() else {
        return Served::Empty;
    };
    let p = &mut *guard;
    let behind = p.waits_behind(conn);
    let Some(c) = p.conns.get_mut(&conn) else {
        // Ended by a CLOSE or a view change.
        return Served::Eof;
    };
    let (_, end) = c.inbox;
    if c.served < end {
        if behind {
            // The leader's server read an earlier connection of this turn
            // first: so must this one (see `Pump::waits_behind`).
            return Served::Empty;
        }
        let n = fill(&p.payloads[c.served..end]);
        if !peek && n > 0 {
            c.served += n;
            c.handled_here();
            c.read_slot = Some(c.handled_slot);
            // The server handles this connection's input now: its time,
            // and its clock reads count from its last entry.
            let turn = p.turn_start();
            if let Some(h) = p.turn.iter().rev().find(|h| h.conn == conn) {
                crate::clock::enter_window(turn, h.seq, h.time_us);
            }
        }
        return Served::Bytes(n);
    }
    if c.closing || c.closed {
        if !peek {
            c.eof = true;
            c.handled_here();
            p.enter_close_window(conn);
            p.run();
        }
        return Served::Eof;
    }
    Served::Empty
}

/// The replay connections of this turn the server has yet to read, in log
/// order, as their server fds (at most `MAX_WIDTH`; the rest are -1).
pub fn unread() -> [i32; MAX_WIDTH] {
    let mut fds = [-1; MAX_WIDTH];
    let Some(p) = pump() else {
        return fds;
    };
    if !p.started && !p.due() {
        // The leader's server read this turn some waits later.
        return fds;
    }
    let mut n = 0;
    for h in &p.turn {
        let Some(c) = p.conns.get(&h.conn) else {
            continue;
        };
        if !c.has_unread() || fds[..n].contains(&c.server_fd) {
            continue;
        }
        if c.server_fd < 0 {
            // Not accepted yet: the connections after it wait, or the
            // server would read them before it, against the log's order.
            break;
        }
        if n == MAX_WIDTH {
            break;
        }
        fds[n] = c.server_fd;
        n += 1;
    }
    fds
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
/// first, readable; a kernel event for one of them adds its other bits,
/// and the bell's readiness (`bell`: its key) is dropped. Returns the
/// count.
pub fn merge_events(
    events: &mut [libc::epoll_event],
    real: usize,
    unread: &[u64],
    bell: Option<u64>,
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
    out
}

/// The server wrote `segments` to replay connection `conn` (dropped; only
/// their digest is kept for the divergence check).
pub fn on_output(conn: u64, segments: &[&[u8]]) {
    let Some(mut p) = pump() else {
        return;
    };
    let Pump { conns, kept, .. } = &mut *p;
    if let Some(c) = conns.get_mut(&conn) {
        for s in segments {
            c.pending.write(s, kept);
        }
    }
}

/// The server closed replay connection `conn`.
pub fn on_close(conn: u64) {
    let Some(mut p) = pump() else {
        return;
    };
    if let Some(c) = p.conns.get_mut(&conn) {
        // A bell rung into it is gone with it: the next one may ring.
        let _ = BELL_FD.compare_exchange(c.server_fd, -1, Ordering::AcqRel, Ordering::Acquire);
        c.closed = true;
        c.server_fd = -1;
        c.handled_here();
    }
    p.enter_close_window(conn);
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

/// Writes the bell's byte into replay connection `c` (when it has a
/// server end and no bell is outstanding).
fn ring_bell_in(c: Option<&mut Conn>) {
    let Some(c) = c else {
        return;
    };
    if c.server_fd < 0 || BELL_FD.load(Ordering::Acquire) >= 0 {
        return;
    }
    if matches!(c.stream.write(&[0]), Ok(1)) {
        BELL_FD.store(c.server_fd, Ordering::Release);
    }
}

/// Whether `next` may join `turn` (entries the leader's server read in one
/// turn; `width`: how many connections one turn may hand over).
///
/// Only DATA joins, only when the leader flagged the entry as read in the
/// same turn as the one before (a CLOSE is a turn of its own: the server
/// learns of it from the kernel, whose order the pump does not set). A connection appears once, except
/// for the later chunks of one read (an input's first entry carries the
/// digest of the output since the last one, checked when the turn starts:
/// a second input of the connection in the same turn would be checked
/// before the server answered the first).
/// `prev_seq`: the entry read just before `next` (a clock record between
/// them belongs to the turn).
fn joins(turn: &[EntryHeader], next: &EntryHeader, prev_seq: u64, width: usize) -> bool {
    let Some(last) = turn.last() else {
        return true;
    };
    if next.flags & SAME_TURN == 0
        || next.kind != Kind::Data
        || last.kind != Kind::Data
        || next.seq != prev_seq + 1
    {
        return false;
    }
    if next.conn == last.conn {
        return next.out_hash == 0;
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
    /// Whether replay connection `conn` has bytes in the turn in flight
    /// behind an earlier connection of the turn the server has not read
    /// yet (or not accepted yet). Its read gets nothing for now (EAGAIN):
    /// the server reads the turn's connections in the leader's order even
    /// where a wait reports several at once and the server passes over
    /// some — memcached takes a new connection's first readiness to arm it
    /// and reads it at the next, so it read a later connection of the same
    /// wait first and stored an `append` before the leader's `set`.
    fn waits_behind(&self, conn: u64) -> bool {
        for h in self.turn.iter().filter(|h| h.kind == Kind::Data) {
            if h.conn == conn {
                return false;
            }
            if self.conns.get(&h.conn).is_some_and(Conn::has_unread) {
                return true;
            }
        }
        false
    }
    fn new(region: Arc<Region>, app: SocketAddr, max_entry: u32) -> Pump {
        let size = apply_ring_size(region.ring_size());
        Pump {
            node: region.node(),
            foreign: false,
            region,
            app: connect_addr(app),
            max_entry,
            epoch: 0,
            reader: RingReader::new(size, 0, 1, max_entry),
            buf: Vec::new(),
            held: None,
            turn: Vec::new(),
            prev_seq: 0,
            times: VecDeque::new(),
            anchor: 0,
            closed: false,
            stash: Vec::new(),
            turn_last: 0,
            cut_at: 0,
            last_input_conn: 0,
            checks_due: None,
            turn_waits: 0,
            stash_waits: 0,
            started: false,
            tick: None,
            payloads: Vec::new(),
            turn_end: 0,
            consumed_at: None,
            pending_since: None,
            stuck_said: false,
            conns: HashMap::new(),
            kept: Budget::default(),
            by_addr: HashMap::new(),
            broken: false,
        }
    }

    /// Hands over turns until one is in flight or none is left
    /// (`from_server`: on the server thread, about to wait).
    fn run_from(&mut self, from_server: bool) {
        let node = self.region.node();
        if node != self.node {
            self.moved_to(node);
        }
        if self.foreign {
            return;
        }
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
            if !self.take_turn(from_server) {
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
    fn take_turn(&mut self, from_server: bool) -> bool {
        // A turn that ended without a wait of the server starting it (a
        // server whose waits the hooks do not see) is checked now.
        self.check_turn();
        let width = turns::batch_width();
        let mut cut = None;
        while let Some((h, end)) = self.next_entry() {
            if h.kind == Kind::Time {
                if self.absorb_time(h, end) {
                    continue;
                }
                break;
            }
            if !joins(&self.turn, &h, self.prev_seq, width) {
                self.held = Some((h, end));
                break;
            }
            if self.turn.is_empty() {
                let adopted = self.adopt_stash(&h);
                self.turn_waits = if adopted { self.stash_waits } else { h.waits };
                if adopted || h.flags & SAME_TURN == 0 {
                    cut = Some(h.seq);
                }
            }
            self.prev_seq = h.seq;
            self.turn_last = h.seq;
            if matches!(h.kind, Kind::Data | Kind::Accept | Kind::Close) {
                // The turn's clock records from here count from this input.
                self.anchor = h.seq;
            }
            if h.kind == Kind::Tick || (self.turn.is_empty() && h.time_us == 0) {
                // A TICK is logged as the turn ends: its records came
                // first. A turn whose leader recorded no time logs none.
                self.closed = true;
            }
            if h.kind == Kind::Data {
                // A connection's entries in a turn are consecutive (see
                // `joins`): its inbox is one range, begun by its first.
                let continues = self.turn.last().is_some_and(|l| l.conn == h.conn);
                let at = self.payloads.len();
                self.payloads
                    .extend_from_slice(&self.buf[HEADER_LEN..HEADER_LEN + h.len as usize]);
                if let Some(c) = self.conns.get_mut(&h.conn) {
                    if !continues {
                        c.inbox.0 = at;
                        c.served = at;
                    }
                    c.inbox.1 = self.payloads.len();
                }
            }
            self.turn.push(h);
            self.turn_end = end;
        }
        for i in 0..self.turn.len() {
            let h = self.turn[i];
            self.begin(h);
        }
        if self.turn.is_empty() {
            return false;
        }
        self.checks_due = Some(cut);
        if self.tick.is_some() {
            self.wake_tick_loop();
        } else if !(from_server && self.read_here()) {
            self.ring_bell();
        }
        true
    }

    /// A `TICK` is handed over in a turn of its loop: wakes that loop's
    /// thread from its wait (its alarm; a `poll`/`select` loop by the bell
    /// in any replay connection). Without either it takes the tick when
    /// its own timeout ends the wait.
    fn wake_tick_loop(&mut self) {
        let Some((id, None)) = self.tick else {
            return;
        };
        if id != 0 {
            crate::loops::ring(id);
            return;
        }
        let any = self
            .conns
            .values_mut()
            .find(|c| c.server_fd >= 0 && !c.closing && !c.closed);
        ring_bell_in(any);
    }

    /// Whether the calling server thread (about to wait) is the one that
    /// reads the turn's first connection: then its own wait sees the turn,
    /// else the bell must wake that connection's thread (a server with
    /// several loops reads each connection on its own one).
    fn read_here(&self) -> bool {
        self.turn
            .iter()
            .find(|h| h.kind == Kind::Data)
            .and_then(|h| self.conns.get(&h.conn))
            .is_some_and(|c| c.read_slot == Some(turns::slot()))
    }

    /// The server may be blocked in its wait, and the log's bytes make no
    /// fd ready: one byte into the turn's first connection wakes it (the
    /// wait hook takes the byte out again and reports what the log holds).
    fn ring_bell(&mut self) {
        let first = self
            .turn
            .iter()
            .find(|h| h.kind == Kind::Data)
            .and_then(|h| self.conns.get_mut(&h.conn));
        ring_bell_in(first);
    }

    /// Hands over turns, off the server thread.
    fn run(&mut self) {
        self.run_from(false);
    }

    /// The region belongs to node `node` now: this server was restored
    /// from another node's image (whose listener and replay connections the
    /// follower moved to this node's app address). Before anything else
    /// connects, the preload takes that node's identity.
    fn moved_to(&mut self, node: u64) {
        match crate::setup::take_identity(node) {
            Some(app) => self.app = connect_addr(app),
            None => self.foreign = true,
        }
        self.node = node;
    }

    /// A new stream starts at `start`: whatever was in flight is gone.
    fn restart(&mut self, epoch: u64, start: u64) {
        log::info!("applying from seq {start} (stream {epoch})");
        self.epoch = epoch;
        self.broken = false;
        self.end_all();
        self.clear_turn();
        self.held = None;
        self.stash.clear();
        self.prev_seq = start.saturating_sub(1);
        let size = apply_ring_size(self.region.ring_size());
        self.reader = RingReader::new(size, 0, start, self.max_entry);
    }

    /// Ends every replay connection (the server reads EOF on each).
    fn end_all(&mut self) {
        for (_, mut c) in self.conns.drain() {
            let _ = c.stream.shutdown(Shutdown::Both);
            c.pending.forget(&mut self.kept);
        }
        self.by_addr.clear();
    }

    /// Starts handing over `h`: from now on the server reads its time.
    fn begin(&mut self, h: EntryHeader) {
        crate::clock::enter_input(h.time_us);
        match h.kind {
            Kind::Accept => self.open(h.seq),
            // Their output checks run as the server starts the turn.
            Kind::Data | Kind::Close => {}
            Kind::View => self.end_all(),
            Kind::Tick => self.tick = Some((h.conn, None)),
            Kind::Noop | Kind::Wrap | Kind::Time => {}
        }
        if h.kind == Kind::Close {
            if let Some(c) = self.conns.get_mut(&h.conn) {
                c.closing = true;
                let _ = c.stream.shutdown(Shutdown::Write);
            }
        }
    }

    /// The turn is over (or gone).
    fn clear_turn(&mut self) {
        for h in &self.turn {
            if let Some(c) = self.conns.get_mut(&h.conn) {
                c.inbox = (0, 0);
                c.served = 0;
            }
        }
        self.turn.clear();
        self.payloads.clear();
        self.consumed_at = None;
        self.pending_since = None;
        self.stuck_said = false;
        self.tick = None;
        self.times.clear();
        self.anchor = 0;
        self.closed = false;
        self.started = false;
        self.turn_waits = 0;
    }

    /// The server handled the whole turn: the follower may reuse its space.
    fn finish(&mut self) {
        if let Some(last) = self.turn.last() {
            let a = self.region.apply();
            a.set_applied(last.seq.max(self.turn_last));
            a.set_head(self.turn_end);
        }
        self.clear_turn();
    }

    /// Moves the turn on: true once the server handled all of it and the
    /// threads that handled it went back to wait. Like the leader's turn
    /// lock, that keeps what the server does after the input in that turn
    /// (memcached's listener runs its clock timer after the accept) before
    /// anything of the next turn.
    fn progress(&mut self) -> bool {
        let patience_over = self
            .consumed_at
            .is_some_and(|t| t.elapsed() >= TURN_PATIENCE);
        // Handled by a thread that waited since (or long enough ago).
        // Patience is for a server whose waits the hooks do not see: a
        // thread still running the turn (slow, on a loaded machine) is in
        // it, and its clock reads belong to it.
        let waited = |c: &Conn| {
            turns::count(c.handled_slot) > c.handled_turn
                || (patience_over && !turns::running(c.handled_slot))
        };
        let mut all_read = true;
        let mut done = true;
        let mut ended = Vec::new();
        for &h in &self.turn {
            let item_done = match h.kind {
                Kind::Accept => match self.conns.get(&h.seq) {
                    // It could not be opened: its inputs are skipped.
                    None => true,
                    Some(c) => {
                        let accepted = c.server_fd >= 0 || c.closed;
                        all_read &= accepted;
                        accepted && waited(c)
                    }
                },
                Kind::Data => match self.conns.get(&h.conn) {
                    None => true,
                    Some(c) if c.closed => waited(c),
                    Some(c) => {
                        let read = c.served >= c.inbox.1;
                        all_read &= read;
                        read
                            // A reply sent over several turns is not
                            // complete while the server waits to write.
                            && !fdtable::slot(c.server_fd).is_some_and(|s| s.wants_write())
                            && waited(c)
                    }
                },
                Kind::Close => match self.conns.get(&h.conn) {
                    None => true,
                    Some(c) => {
                        let seen = c.eof || c.closed;
                        all_read &= seen;
                        let done = seen && waited(c);
                        if done {
                            ended.push(h.conn);
                        }
                        done
                    }
                },
                // Its loop's thread went back to wait after the turn.
                Kind::Tick => match self.tick {
                    Some((_, Some((slot, n)))) => turns::count(slot) > n,
                    _ => patience_over,
                },
                Kind::View | Kind::Noop | Kind::Wrap | Kind::Time => true,
            };
            done &= item_done;
        }
        for conn in ended {
            if let Some(mut c) = self.conns.remove(&conn) {
                c.pending.forget(&mut self.kept);
            }
        }
        if all_read && self.consumed_at.is_none() {
            self.consumed_at = Some(Instant::now());
        }
        done
    }

    /// A turn still in flight after [`TURN_STUCK`]: one warning naming
    /// what it waits for (a server that never finishes a turn stops its
    /// node's apply; the operator and the tests see why). Asked by the
    /// applier thread while a turn is in flight, off the server's threads.
    fn say_if_stuck(&mut self) {
        let since = *self.pending_since.get_or_insert_with(Instant::now);
        if self.stuck_said || since.elapsed() < TURN_STUCK {
            return;
        }
        self.stuck_said = true;
        let mut what = String::new();
        for h in &self.turn {
            let c = self.conns.get(&h.conn).or_else(|| self.conns.get(&h.seq));
            what.push_str(&format!(
                " [{:?} seq {} conn {} loop {:?}: {}]",
                h.kind,
                h.seq,
                h.conn,
                h.turn_loop,
                match c {
                    None => "no replay connection".to_string(),
                    Some(c) => format!(
                        "fd {} (read by loop {:?}) served {}/{} eof {} closed {} handled by slot {} turn {} (now {}, running {})",
                        c.server_fd,
                        fdtable::slot(c.server_fd)
                            .map(|s| s.wait_epfd())
                            .filter(|e| *e >= 0)
                            .map(crate::loops::of_epfd),
                        c.served,
                        c.inbox.1,
                        c.eof,
                        c.closed,
                        c.handled_slot,
                        c.handled_turn,
                        turns::count(c.handled_slot),
                        turns::running(c.handled_slot)
                    ),
                }
            ));
        }
        log::warn!(
            "a turn has been in flight for {:?} (all read: {}, tick {:?}):{what}",
            since.elapsed(),
            self.consumed_at.is_some(),
            self.tick
        );
    }

    /// Takes clock record `h` (ending at ring position `end`) from the
    /// log: into the turn in flight when it is that turn's, else into the
    /// stash of a turn still to come. False when it is the next turn's
    /// and the turn in flight is not done (then it is held).
    fn absorb_time(&mut self, h: EntryHeader, end: u64) -> bool {
        let k = u32::try_from(h.conn).unwrap_or(u32::MAX);
        // A poll for children that reaped one names it (see `turn_time`).
        let child = self
            .buf
            .get(HEADER_LEN..HEADER_LEN + h.len as usize)
            .and_then(turn_time::Child::decode);
        let continues = h.flags & SAME_TURN != 0 && h.seq == self.prev_seq + 1;
        if !self.turn.is_empty() {
            if self.closed || !continues {
                self.held = Some((h, end));
                self.closed = true;
                return false;
            }
            if k == 0 {
                self.closed = true;
            } else {
                self.times.push_back(Record {
                    anchor: self.anchor,
                    k,
                    us: h.time_us,
                    child,
                });
            }
            self.prev_seq = h.seq;
            self.turn_last = h.seq;
            self.turn_end = end;
            return true;
        }
        let starts = h.flags & SAME_TURN == 0;
        if k != 0 && (starts || (continues && !self.stash.is_empty())) {
            if starts {
                self.stash.clear();
                self.stash_waits = h.waits;
            }
            self.stash.push(Record {
                anchor: 0,
                k,
                us: h.time_us,
                child,
            });
            self.prev_seq = h.seq;
            self.region.apply().set_head(end);
            return true;
        }
        // The end, or a record, of a turn this server already finished
        // (its reads did not need it).
        self.stash.clear();
        self.prev_seq = h.seq;
        let a = self.region.apply();
        a.set_applied(h.seq);
        a.set_head(end);
        true
    }

    /// The first entry `h` of a turn: the stashed clock records are that
    /// turn's when it continues them (the leader's same turn), else they
    /// were a turn that never came (its leader stopped).
    fn adopt_stash(&mut self, h: &EntryHeader) -> bool {
        let stash = std::mem::take(&mut self.stash);
        let adopted = !stash.is_empty() && h.flags & SAME_TURN != 0 && h.seq == self.prev_seq + 1;
        if adopted {
            self.times.extend(stash);
        }
        adopted
    }

    /// Whether the calling server thread entered as many waits since its
    /// last turn as the leader's thread did before the turn in flight.
    fn due(&self) -> bool {
        self.turn
            .first()
            .is_none_or(|f| turns::due(f.view, self.turn_waits))
    }

    /// The server read the EOF of, or closed, connection `conn`: its clock
    /// reads count from the connection's CLOSE when the turn has it.
    fn enter_close_window(&self, conn: u64) {
        if let Some(h) = self
            .turn
            .iter()
            .find(|h| h.kind == Kind::Close && h.conn == conn)
        {
            crate::clock::enter_window(self.turn_start(), h.seq, h.time_us);
        }
    }

    /// The output checks of the turn in flight, once: each input's digest
    /// against what this server wrote on its connection before it. They
    /// run when a wait of the server starts the turn, not when the pump
    /// takes it from the log: a server still inside its last turn (Redis's
    /// `DEBUG RELOAD` waits in its event loop while it loads, and the pump
    /// takes the next turn at such a wait) writes that turn's reply after
    /// the pump took the next one, and a check then counted the reply one
    /// input late on every backup.
    fn check_turn(&mut self) {
        let Some(cut) = self.checks_due.take() else {
            return;
        };
        if let Some(at) = cut {
            self.cut(at);
        }
        for i in 0..self.turn.len() {
            let h = self.turn[i];
            match h.kind {
                Kind::Data | Kind::Close => {
                    let adjacent = self.last_input_conn == h.conn;
                    self.check_output(&h, adjacent);
                    self.classify_input(&h);
                    self.last_input_conn = h.conn;
                }
                Kind::Accept => self.last_input_conn = h.seq,
                Kind::View => self.last_input_conn = 0,
                Kind::Tick | Kind::Noop | Kind::Wrap | Kind::Time => {}
            }
        }
    }

    /// A turn of the leader's begins (not the rest of one this server takes
    /// in parts): each connection's output so far is what the leader's
    /// digests of the turn's inputs cover. The leader's server writes what
    /// a turn causes (replies, pub/sub deliveries to other connections) as
    /// the turn ends, after reading all of its inputs; a backup that took
    /// the turn in parts wrote some of it between them.
    fn cut(&mut self, at: u64) {
        self.cut_at = at;
        for c in self.conns.values_mut() {
            c.pending.cut();
        }
    }

    /// The seq the turn in flight begins at (0: none).
    fn turn_start(&self) -> u64 {
        self.turn.first().map_or(0, |f| f.seq)
    }

    /// What a clock read `at` of the turn in flight reads (see
    /// [`time_at`]): Err with the time so far when the log does not say
    /// yet.
    fn time_lookup(
        &mut self,
        at: TurnReads,
        mut now: u64,
    ) -> Result<(u64, Option<turn_time::Child>), u64> {
        if at.turn != self.turn_start() {
            // A read of a turn that is over (or not begun): nothing of the
            // log is its.
            return Ok((now, None));
        }
        loop {
            let s = turn_time::settle(self.times.make_contiguous(), at, now);
            self.times.drain(..s.passed);
            now = s.us;
            if s.child.is_some() {
                return Ok((now, s.child));
            }
            if s.decided || self.closed || self.turn.is_empty() || self.window_closed(at.anchor) {
                return Ok((now, None));
            }
            match self.next_entry() {
                None => return Err(now),
                Some((h, end)) if h.kind == Kind::Time => {
                    self.absorb_time(h, end);
                }
                Some(next) => {
                    // A later input or turn: this window is over.
                    self.held = Some(next);
                    self.closed = true;
                }
            }
        }
    }

    /// Whether the turn in flight holds an input after `anchor` (the
    /// window of reads counted from `anchor` ended there).
    fn window_closed(&self, anchor: u64) -> bool {
        self.turn
            .iter()
            .any(|h| h.seq > anchor && matches!(h.kind, Kind::Data | Kind::Accept | Kind::Close))
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
                inbox: (0, 0),
                served: 0,
                closing: false,
                handled_slot: 0,
                handled_turn: 0,
                read_slot: None,
                eof: false,
                closed: false,
                pending: PendingOutput::default(),
                last_input: conn,
                replies: crate::node_dependent::Replies::default(),
            },
        );
    }

    /// DATA/CLOSE carry the leader's digest of the connection's output
    /// since its last input: compare with this server's, then start over.
    fn check_output(&mut self, h: &EntryHeader, adjacent: bool) {
        // Only an input's first entry carries a digest (the leader's
        // server read the whole input at once).
        if h.out_hash == 0 {
            return;
        }
        let Some(c) = self.conns.get_mut(&h.conn) else {
            return;
        };
        // The leader's server read this connection's last input just
        // before, in this same turn (a server that reads a connection until
        // EAGAIN and answers each request at once, as memcached does): it
        // wrote that answer before reading this one. Otherwise the digest
        // covers what it wrote before the turn that read this input; what
        // this server wrote since (in parts of that turn it took apart)
        // starts the next interval, as it does on the leader.
        let whole = adjacent && c.last_input >= self.cut_at;
        let prev = std::mem::replace(&mut c.last_input, h.seq);
        if h.out_hash == OutputDigest::WITHHELD {
            // The leader's server output never left it (it failed the
            // connection): nothing to compare; start over.
            c.pending.skip(whole, &mut self.kept);
            c.replies.take();
            log::debug!(
                "connection {}: the leader withheld its output before seq {} (not compared)",
                h.conn,
                h.seq
            );
            return;
        }
        let verdict = c.pending.check(h.out_hash, whole, &mut self.kept);
        // The commands that produced it describe the node: not counted.
        let node_dependent = c.replies.take();
        let command = c.replies.last_command();
        let (len, shown) = match verdict {
            Verdict::Same => return,
            Verdict::Unsure => {
                log::debug!(
                    "connection {}: the output after seq {prev} differs from the leader's, but more than {} bytes went unmatched before (not counted)",
                    h.conn,
                    crate::output_check::KEEP
                );
                return;
            }
            Verdict::Differs { len, shown } => (len, shown),
        };
        if node_dependent {
            log::debug!(
                "connection {}: the output after seq {prev} (`{command}`) differs from the leader's by design (not counted)",
                h.conn
            );
            return;
        }
        self.region.apply().add_diverged();
        let (_, leader_len) = OutputDigest::unpack(h.out_hash);
        log::warn!(
            "divergence on connection {}: the output after seq {prev} differs from the leader's \
             (after `{command}`; leader: {leader_len} bytes; this server: {len} bytes, starting {:?})",
            h.conn,
            String::from_utf8_lossy(&shown)
        );
    }

    /// DATA `h` (after its check): its commands, for the check of the
    /// output they produce (the turn's payloads hold its entries' bytes
    /// in order).
    fn classify_input(&mut self, h: &EntryHeader) {
        if h.kind != Kind::Data {
            return;
        }
        let at: usize = self
            .turn
            .iter()
            .take_while(|t| t.seq != h.seq)
            .filter(|t| t.kind == Kind::Data)
            .map(|t| t.len as usize)
            .sum();
        if let (Some(c), Some(bytes)) = (
            self.conns.get_mut(&h.conn),
            self.payloads.get(at..at + h.len as usize),
        ) {
            c.replies.input(bytes);
        }
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
    fn output_the_leader_withheld_is_not_compared_and_a_real_difference_is() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let spec = lockstep_common::region::RegionSpec {
            cluster: "withheld".into(),
            node: 2,
            ring_size: 1 << 16,
        };
        let region = Arc::new(Region::anonymous(&spec).unwrap());
        let mut p = Pump::new(region.clone(), listener.local_addr().unwrap(), 4096);
        p.open(7);
        // This server answered input 7; the leader failed the connection
        // instead of writing its answer.
        let Pump { conns, kept, .. } = &mut p;
        conns
            .get_mut(&7)
            .unwrap()
            .pending
            .write(b":863340\r\n", kept);
        p.cut(8);
        p.check_output(&data(8, 7, false, OutputDigest::WITHHELD), false);
        assert_eq!(region.apply().diverged(), 0);
        // A reply that differs is still counted.
        let Pump { conns, kept, .. } = &mut p;
        conns.get_mut(&7).unwrap().pending.write(b":1\r\n", kept);
        p.cut(9);
        p.check_output(&data(9, 7, false, OutputDigest::default().pack()), false);
        assert_eq!(region.apply().diverged(), 1);
    }

    #[test]
    fn a_turn_runs_in_the_loop_that_ran_it_on_the_leader() {
        let mut accept = EntryHeader::new(Kind::Accept, 1, 5, 5, 0);
        accept.turn_loop = Some(1);
        assert!(runs_in(&accept, 1, false), "the listener's wait");
        assert!(!runs_in(&accept, 2, false), "not the worker's");
        accept.turn_loop = None;
        assert!(
            runs_in(&accept, 2, false),
            "a log that does not name it: any loop's"
        );
        let mut close = EntryHeader::new(Kind::Close, 1, 9, 5, 0);
        close.turn_loop = Some(2);
        assert!(runs_in(&close, 2, false) && !runs_in(&close, 1, false));
        let data = data(6, 5, false, 0);
        assert!(runs_in(&data, 2, true), "reported the log's bytes");
        assert!(!runs_in(&data, 2, false), "returned for something else");
        let view = EntryHeader::new(Kind::View, 2, 10, 0, 0);
        assert!(
            !runs_in(&view, 1, false),
            "the follower's entry: no loop's turn"
        );
    }

    /// `joins` for a `next` read right after the turn's last entry.
    fn joins_last(turn: &[EntryHeader], next: &EntryHeader, width: usize) -> bool {
        joins(turn, next, turn.last().map_or(0, |l| l.seq), width)
    }

    #[test]
    fn a_clock_record_between_two_inputs_keeps_them_in_one_turn() {
        let t = [data(10, 1, false, 7)];
        assert!(
            joins(&t, &data(12, 2, true, 7), 11, 4),
            "seq 11 was a clock record of the turn"
        );
        assert!(!joins(&t, &data(12, 2, true, 7), 10, 4), "a gap");
    }

    #[test]
    fn entries_of_one_leader_turn_join_up_to_the_width() {
        let t = [data(10, 1, false, 7), data(11, 2, true, 7)];
        assert!(
            joins_last(&[], &data(10, 1, false, 7), 4),
            "a turn starts anywhere"
        );
        assert!(joins_last(&t[..1], &t[1], 4));
        assert!(joins_last(&t, &data(12, 3, true, 7), 4));
        assert!(
            !joins_last(&t, &data(12, 3, true, 7), 2),
            "two connections at most"
        );
        assert!(
            !joins_last(&t, &data(12, 3, false, 7), 4),
            "the leader's next turn"
        );
        assert!(
            !joins_last(&t, &data(13, 3, true, 7), 4),
            "not the next seq"
        );
    }

    #[test]
    fn a_connection_comes_back_only_with_a_later_chunk_of_its_read() {
        let t = [data(10, 1, false, 7), data(11, 2, true, 7)];
        assert!(
            joins_last(&t, &data(12, 2, true, 0), 4),
            "a later chunk of one read"
        );
        assert!(
            !joins_last(&t, &data(12, 2, true, 9), 4),
            "a second input of conn 2"
        );
        assert!(
            !joins_last(&t, &data(12, 1, true, 0), 4),
            "conn 1 after another"
        );
        let mut close = data(12, 3, true, 5);
        close.kind = Kind::Close;
        assert!(!joins_last(&t, &close, 4), "an EOF is a turn of its own");
    }

    #[test]
    fn only_inputs_join() {
        let mut accept = data(11, 0, true, 0);
        accept.kind = Kind::Accept;
        assert!(!joins_last(&[data(10, 1, false, 7)], &accept, 4));
        assert!(!joins_last(&[accept], &data(12, 1, true, 7), 4));
        let mut view = data(11, 0, true, 0);
        view.kind = Kind::View;
        assert!(!joins_last(&[data(10, 1, false, 7)], &view, 4));
    }

    #[test]
    fn the_logs_connections_come_first_in_log_order_and_the_bell_is_dropped() {
        let ev = |key: u64, events: u32| libc::epoll_event { events, u64: key };
        let (inn, out) = (libc::EPOLLIN as u32, libc::EPOLLOUT as u32);
        // The kernel returned: another fd (key 5), the bell's fd (key 9,
        // readable only), and conn 71 writable; the log has bytes for 72
        // then 71. Two slots of room follow the kernel's three.
        let mut got = [ev(5, inn), ev(9, inn), ev(71, out), ev(0, 0), ev(0, 0)];
        let n = merge_events(&mut got, 3, &[72, 71], Some(9));
        let view: Vec<(u64, u32)> = got[..n].iter().map(|e| (e.u64, e.events)).collect();
        assert_eq!(view, [(72, inn), (71, inn | out), (5, inn)]);
    }

    #[test]
    fn without_the_logs_bytes_the_kernels_events_stand() {
        let ev = |key: u64| libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: key,
        };
        let mut got = [ev(5), ev(6)];
        assert_eq!(merge_events(&mut got, 2, &[], None), 2);
        assert_eq!((got[0].u64, got[1].u64), (5, 6));
    }
}
