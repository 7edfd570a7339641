//! The replay machine: the decisions of a backup's replay, free of I/O.
//!
//! See the `replay` module for what it decides; a [`Host`] reads the log
//! and carries out the effects.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use lockstep_common::entry::{EntryHeader, Kind, OutputDigest, HEADER_LEN, RETURNED, SAME_TURN};

use super::host::Host;
use crate::backup::output_check::{Budget, PendingOutput, Verdict};
use crate::determinism::clock::TurnReads;
use crate::determinism::turn_time::{self, Record};
use crate::determinism::turns::MAX_WIDTH;

/// A consumed turn counts as handled after this long even when the server
/// did not re-enter an event-loop wait the hooks see.
const TURN_PATIENCE: Duration = Duration::from_millis(500);
/// How long a turn may stay in flight before a warning names what it
/// waits for.
const TURN_STUCK: Duration = Duration::from_secs(5);

/// One replay connection.
struct Conn {
    /// Whether the replay connected it (an ACCEPT of a turn that is not
    /// due yet waits: see `Replay::dial_due`).
    dialed: bool,
    /// The server's end (-1 until the server accepted it).
    server_fd: i32,
    /// The bytes of the current turn for the server to read (a range of
    /// `Replay::payloads`) and how far it read them.
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
    /// The log ended the connection (CLOSE): the server reads EOF once the
    /// inbox is empty (its end is shut once it did).
    closing: bool,
    /// The server read EOF, or closed its end.
    eof: bool,
    closed: bool,
    /// Output no digest of the leader's covered yet (the leader's digest of
    /// an input covers the output since the server read the input before:
    /// see `Replay::check_upto`).
    pending: PendingOutput,
    /// Seq of the connection's last input (whose output `pending` begins
    /// with).
    last_input: u64,
    /// Which of its replies differ per node by design.
    replies: crate::backup::node_dependent::Replies,
}

impl Conn {
    /// Whether the server has something of the turn in flight to read
    /// here: bytes, or the EOF the log ended it with.
    fn has_unread(&self) -> bool {
        self.served < self.inbox.1 || (self.closing && !self.eof && !self.closed)
    }

    /// The calling server thread handled this connection in its current
    /// turn.
    fn handled_here(&mut self, host: &impl Host) {
        self.handled_slot = host.slot();
        self.handled_turn = host.waits(self.handled_slot);
    }
}

/// What a read of a replay connection gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// This many bytes of the log.
    Bytes(usize),
    /// The connection ended in the log.
    Eof,
    /// Nothing yet (EAGAIN).
    Empty,
}

/// A backup's replay: which turn of the log its server runs, when, on
/// which loop, at what time, when the turn is over, and whether its output
/// matches the leader's. One per process (behind the `region_host` lock).
#[derive(Default)]
pub struct Replay {
    /// The apply stream being read (see [`Host::stream`]).
    epoch: u64,
    /// The entry read last (header and payload).
    buf: Vec<u8>,
    /// An entry read but left for the next turn, and the ring position
    /// just past it; its bytes are in `buf`.
    held: Option<(EntryHeader, u64)>,
    /// The turn being handed over (empty: none), its payloads, and when
    /// the server had consumed all of it.
    turn: Vec<EntryHeader>,
    payloads: Vec<u8>,
    /// Where each entry of the turn begins in `payloads` (for DATA: its
    /// bytes; for the rest: where it stands among them).
    starts: Vec<usize>,
    /// The turn's inputs whose output checks wait for the server to read
    /// them (seqs, log order: every DATA entry and EOF; see `check_upto`).
    later: Vec<u64>,
    /// For each entry of the turn, the clock reads of its window the
    /// leader's server made before it read that entry (the highest read
    /// index of the window's records logged before it; see `readable`),
    /// and that maximum so far for the window being read from the log.
    after_reads: Vec<u32>,
    window_reads: u32,
    /// The furthest clock read of the turn in flight the server made:
    /// (window anchor, count).
    reads_made: Option<(u64, u32)>,
    consumed_at: Option<Duration>,
    /// When the turn in flight was first found unfinished, and whether a
    /// warning said it is stuck (once per turn).
    pending_since: Option<Duration>,
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
    /// The waits the leader's thread entered before the turn in flight
    /// (`EntryHeader::waits` of its first entry, or of its first clock
    /// record), and those of the stash's turn.
    turn_waits: u32,
    stash_waits: u32,
    /// The thread (slot) whose wait started the turn in flight, and its
    /// wait count then (None: no server thread started it yet); where on
    /// its stack that wait was (see `stack_depth`).
    started_at: Option<(usize, u64)>,
    started_sp: u64,
    /// The `TICK` being handed over: its loop, and the thread (slot) whose
    /// wait of that loop returned for it with its wait count then.
    tick: Option<(u64, Option<(usize, u64)>)>,
    conns: BTreeMap<u64, Conn>,
    /// The connections' unmatched output, against its bound.
    kept: Budget,
}

impl Replay {
    /// A machine that has read nothing yet.
    pub fn new() -> Replay {
        Replay::default()
    }

    /// Whether a turn is in flight.
    pub fn in_turn(&self) -> bool {
        !self.turn.is_empty()
    }

    /// The turn in flight, for a failing simulation's report.
    #[cfg(test)]
    pub fn describe(&self) -> String {
        let entries: Vec<String> = self
            .turn
            .iter()
            .map(|h| format!("{:?} {} conn {}", h.kind, h.seq, h.conn))
            .collect();
        format!(
            "started {} later {:?} [{}]",
            self.started(),
            self.later,
            entries.join(", ")
        )
    }

    /// Whether the wait that hands over the turn in flight reports the
    /// kernel's events (the listener) before the log's connections: the
    /// leader's server accepted first.
    pub fn kernel_first(&self) -> bool {
        let t = &self.turn;
        !t.is_empty() && kernel_reported(t, 0) && (0..t.len()).any(|i| !kernel_reported(t, i))
    }

    /// Hands over turns until one is in flight or none is left, off the
    /// server's threads (the applier).
    pub fn run<H: Host>(&mut self, host: &mut H) {
        self.run_from(host, None);
    }

    /// The server is about to wait in its event loop `loop_id` (0: a
    /// `poll`/`select` loop; `epoll_wait`, `poll`, `select` and their
    /// variants): it has handled what it read.
    pub fn on_loop<H: Host>(&mut self, host: &mut H, loop_id: u64) {
        self.run_from(host, Some(loop_id));
    }

    /// Whether a wait of loop `loop_id` must not block: a `TICK` of that
    /// loop waits for the loop's next turn, or a turn of that loop waits
    /// for the calling thread to enter as many waits as the leader's did
    /// before it (`EntryHeader::waits`; the server runs them without
    /// blocking).
    pub fn must_not_block<H: Host>(&self, host: &H, loop_id: u64) -> bool {
        let tick = self
            .tick
            .is_some_and(|(id, taken)| id == loop_id && taken.is_none());
        let held_back = !self.started()
            && self.turn.first().is_some_and(|f| {
                matches!(f.kind, Kind::Data | Kind::Close | Kind::Accept)
                    && f.turn_loop.map(u64::from) == Some(loop_id)
            })
            && !self.due(host);
        tick || held_back
    }

    /// The server's wait in loop `loop_id` returned, on the calling
    /// thread: the turn in flight starts here when it is this loop's, and
    /// the thread's clock reads its time from now on. A `TICK` of this
    /// loop: this turn is the tick's. DATA: when the wait reported the
    /// log's bytes (`delivers`) — a wait that returned for anything else
    /// must not run the server's timers at the turn's time before it read
    /// the turn's input. The kernel-reported ACCEPT and CLOSE: in the loop
    /// whose turn read them on the leader (any loop, for entries that do
    /// not name it). A `VIEW` is no loop's turn.
    pub fn turn_returned<H: Host>(&mut self, host: &mut H, loop_id: u64, delivers: bool) {
        let Some(first) = self.turn.first().copied() else {
            return;
        };
        if (self.started() || self.undialed()) && first.kind != Kind::Tick {
            // Started, or its accepts are not connected yet: this wait saw
            // nothing of it.
            return;
        }
        let due = self.due(host);
        let mine = match first.kind {
            Kind::Tick => match &mut self.tick {
                Some((id, taken @ None)) if *id == loop_id && due => {
                    let slot = host.slot();
                    *taken = Some((slot, host.waits(slot)));
                    true
                }
                _ => false,
            },
            // An input its leader read only after the nested loop whose
            // wait began the turn returned: that wait reported nothing of
            // it (see `unread`), and the turn is its all the same.
            _ if first.flags & RETURNED != 0 => {
                due && first.turn_loop.is_none_or(|l| u64::from(l) == loop_id)
            }
            _ => runs_in(&first, loop_id, delivers),
        };
        if mine {
            let slot = host.slot();
            self.started_at = Some((slot, host.waits(slot)));
            self.started_sp = host.wait_mark();
            host.handed(first.view);
            host.enter_turn(first.seq, first.time_us);
        }
    }

    /// The server accepted replay connection `conn` as `fd`.
    pub fn accepted<H: Host>(&mut self, host: &mut H, conn: u64, fd: i32) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.server_fd = fd;
            c.handled_here(host);
        }
        // The server's clock reads count from the accept, as the leader's
        // did.
        if let Some(h) = self
            .turn
            .iter()
            .find(|h| h.kind == Kind::Accept && h.seq == conn)
        {
            host.enter_window(self.turn_start(), h.seq, h.time_us);
        }
    }

    /// The server reads replay connection `conn`: `fill` copies bytes into
    /// its buffers and returns how many it took. A peek (`peek`) takes
    /// nothing.
    pub fn serve<H: Host>(
        &mut self,
        host: &mut H,
        conn: u64,
        peek: bool,
        fill: &mut dyn FnMut(&[u8]) -> usize,
    ) -> Served {
        let behind = self.read_waits(host, conn);
        let Some(c) = self.conns.get(&conn) else {
            // Ended by a CLOSE or a view change.
            return Served::Eof;
        };
        let (served, end) = (c.served, c.inbox.1);
        if served < end {
            if behind {
                // The leader's server read something else of this turn
                // first: so must this one (see `read_waits`).
                return Served::Empty;
            }
            let (from, limit, anchor, reached) = self.read_bounds(conn, served);
            if let (Some(seq), false) = (reached, peek) {
                // The server reads this input now: its output check runs
                // where the leader's read ended the digest's interval.
                self.check_upto(host, conn, seq);
            }
            let n = fill(&self.payloads[from..limit]);
            if !peek && n > 0 {
                let turn = self.turn_start();
                let time = self
                    .turn
                    .iter()
                    .find(|h| h.seq == anchor)
                    .map_or(0, |h| h.time_us);
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.served = from + n;
                    c.handled_here(host);
                    c.read_slot = Some(c.handled_slot);
                }
                // The server handles this input now: its time, and its
                // clock reads count from the input's last entry.
                host.enter_window(turn, anchor, time);
            }
            return Served::Bytes(n);
        }
        if c.closing || c.closed {
            if behind {
                return Served::Empty;
            }
            if !peek {
                if let Some(h) = self
                    .turn
                    .iter()
                    .find(|h| h.kind == Kind::Close && h.conn == conn)
                {
                    let seq = h.seq;
                    self.check_upto(host, conn, seq);
                }
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.eof = true;
                    c.handled_here(host);
                    // From now on the socket says so too.
                    host.shut_write(conn);
                }
                self.enter_close_window(host, conn);
                self.run(host);
            }
            return Served::Eof;
        }
        Served::Empty
    }

    /// The replay connections of this turn the server has yet to read, in
    /// log order, as their server fds (at most `MAX_WIDTH`; the rest are
    /// -1).
    pub fn unread<H: Host>(&self, host: &H) -> [i32; MAX_WIDTH] {
        let mut fds = [-1; MAX_WIDTH];
        if !self.started() && !self.due(host) {
            // The leader's server read this turn some waits later.
            return fds;
        }
        let mut n = 0;
        for h in &self.turn {
            let Some(c) = self.conns.get(&h.conn) else {
                continue;
            };
            if !c.has_unread() || fds[..n].contains(&c.server_fd) {
                continue;
            }
            if c.server_fd < 0 {
                // Not accepted yet: the connections after it wait, or the
                // server would read them before it, against the log's
                // order.
                break;
            }
            let returned = self
                .first_unread(h.conn)
                .is_some_and(|at| self.turn[at].flags & RETURNED != 0);
            if returned && !self.outer_wait(host) {
                // Its leader's server read it only once the nested loop
                // whose wait began the turn had returned, from an event
                // that wait did not report (see `stack_depth`): not this
                // wait either, nor a nested one after it.
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

    /// The server wrote `segments` to replay connection `conn` (dropped;
    /// only what the divergence check needs is kept).
    pub fn output(&mut self, conn: u64, segments: &[&[u8]]) {
        let Replay { conns, kept, .. } = self;
        if let Some(c) = conns.get_mut(&conn) {
            for s in segments {
                c.pending.write(s, kept);
            }
        }
    }

    /// The server closed replay connection `conn`.
    pub fn closed<H: Host>(&mut self, host: &mut H, conn: u64) {
        if let Some(c) = self.conns.get_mut(&conn) {
            host.bell_gone(c.server_fd);
            c.closed = true;
            c.server_fd = -1;
            c.handled_here(host);
        }
        self.enter_close_window(host, conn);
        self.run(host);
    }

    /// What a clock read `at` of the turn in flight reads (see
    /// `region_host::time_at`): Err with the time so far when the log does not
    /// say yet.
    pub fn time_lookup<H: Host>(
        &mut self,
        host: &mut H,
        at: TurnReads,
        mut now: u64,
    ) -> Result<(u64, Option<turn_time::Child>), u64> {
        if at.turn != self.turn_start() {
            // A read of a turn that is over (or not begun): nothing of the
            // log is its.
            return Ok((now, None));
        }
        if self
            .reads_made
            .is_none_or(|(anchor, count)| (at.anchor, at.count) > (anchor, count))
        {
            self.reads_made = Some((at.anchor, at.count));
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
            match self.next_entry(host) {
                None => return Err(now),
                Some((h, end)) if h.kind == Kind::Time => {
                    self.absorb_time(host, h, end);
                }
                Some(next) => {
                    // A later input or turn: this window is over.
                    self.held = Some(next);
                    self.closed = true;
                }
            }
        }
    }
}

/// Whether a turn starting with `first` (not a `TICK`) runs in the wait of
/// loop `loop_id` that just returned (`delivers`: it reported the log's
/// bytes); see [`Replay::turn_returned`].
fn runs_in(first: &EntryHeader, loop_id: u64, delivers: bool) -> bool {
    match first.kind {
        Kind::Data | Kind::Close => delivers,
        Kind::Accept => first.turn_loop.is_none_or(|l| u64::from(l) == loop_id),
        Kind::Tick | Kind::View | Kind::Noop | Kind::Wrap | Kind::Time => false,
    }
}

/// Whether `next` may join `turn` (entries the leader's server read in one
/// turn; `width`: how many connections one turn may hand over).
///
/// Only entries the leader flagged as read in the same turn as the one
/// before join: accepts, inputs and EOFs. A connection appears once, in one
/// run of entries: the chunks of one read, the later reads of the
/// connection in the same leader turn (a server that reads until EAGAIN got
/// more while it worked), and its EOF read right after. What the server
/// learns of from the kernel (the listener) comes all before what it reads
/// from the log (inputs, EOFs), or all after: a wait reports the kernel's
/// events after the log's connections, or before them when the turn begins
/// with an accept (see `Replay::kernel_first`).
/// `prev_seq`: the entry read just before `next` (a clock record between
/// them belongs to the turn).
fn joins(turn: &[EntryHeader], next: &EntryHeader, prev_seq: u64, width: usize) -> bool {
    let Some(last) = turn.last() else {
        return true;
    };
    if next.flags & SAME_TURN == 0 || next.seq != prev_seq + 1 {
        return false;
    }
    // A connection's later reads, and the EOF read right after them.
    if next.conn == last.conn && last.kind == Kind::Data {
        return matches!(next.kind, Kind::Data | Kind::Close);
    }
    let input = |k: Kind| matches!(k, Kind::Accept | Kind::Data | Kind::Close);
    if !input(next.kind) || !input(last.kind) {
        return false;
    }
    let mine: Vec<Kind> = turn
        .iter()
        .filter(|h| h.conn == next.conn)
        .map(|h| h.kind)
        .collect();
    if !mine.is_empty() {
        // A connection comes back (the server read it again later in the
        // turn) for more input or its EOF, not after its EOF; its read
        // waits until what comes before it in the turn is read (see
        // `read_waits`).
        return matches!(next.kind, Kind::Data | Kind::Close)
            && mine.iter().all(|k| *k == Kind::Data);
    }
    // What the kernel reports (accepts) may come before what the log
    // reports (inputs, EOFs), or after: not on both sides.
    let classes: Vec<bool> = (0..turn.len()).map(|i| kernel_reported(turn, i)).collect();
    let switches = classes.windows(2).filter(|w| w[0] != w[1]).count();
    let next_kernel = next.kind == Kind::Accept;
    if classes.last() != Some(&next_kernel) && switches > 0 {
        return false;
    }
    // Accepted connections take no room in the wait's result (the listener
    // is one fd); every other connection does.
    if next.kind == Kind::Accept {
        return true;
    }
    let conns = turn
        .iter()
        .enumerate()
        .filter(|&(i, h)| h.kind != Kind::Accept && (i == 0 || turn[i - 1].conn != h.conn))
        .count();
    conns < width
}

/// Whether the server learns of entry `i` of `turn` from the kernel (the
/// listener is ready) rather than from the log (an input or an EOF: the
/// wait reports the connection readable in log order).
fn kernel_reported(turn: &[EntryHeader], i: usize) -> bool {
    turn[i].kind == Kind::Accept
}

impl Replay {
    /// Whether a read of replay connection `conn` gets nothing for now
    /// (EAGAIN): its next entry in the turn in flight (bytes or its EOF)
    /// comes after entries of other connections the server has not read
    /// yet, or after clock reads it has not made yet (see `readable`). The
    /// server reads the turn's entries in the leader's order even where a
    /// wait reports several connections at once and the server passes over
    /// some — memcached takes a new connection's first readiness to arm it
    /// and reads it at the next, so it read a later connection of the same
    /// wait first and stored an `append` before the leader's `set`.
    fn read_waits<H: Host>(&self, host: &H, conn: u64) -> bool {
        let Some(at) = self.first_unread(conn) else {
            return false;
        };
        self.read_before(conn, at) || !self.readable(host, at)
    }

    /// The first entry of `conn` in the turn in flight still to be read.
    fn first_unread(&self, conn: u64) -> Option<usize> {
        self.turn
            .iter()
            .enumerate()
            .position(|(i, h)| h.conn == conn && self.entry_unread(i))
    }

    /// Whether the calling thread waits further out on its stack than the
    /// wait that began the turn in flight: the nested loop that wait was in
    /// returned (see `stack_depth`).
    fn outer_wait<H: Host>(&self, host: &H) -> bool {
        self.started()
            && self.started_sp != 0
            && host.wait_mark() as i64 - self.started_sp as i64
                > crate::determinism::stack_depth::RETURNED_BY
    }

    /// Whether the server may read entry `i` of the turn in flight: it
    /// made the clock reads of the entry's window that the leader's server
    /// made before reading it. A busy script's last reads come before the
    /// input its leader read after the script ended (Redis read a client's
    /// `PING` from an event its loop had fired before the script): handed
    /// over at once, a backup's server read it inside the script and
    /// answered `-BUSY`. The gate holds only while the thread that handled
    /// the turn runs it: once it waits again, those reads will not come.
    fn readable<H: Host>(&self, host: &H, i: usize) -> bool {
        if self.turn[i].flags & RETURNED != 0
            && self.started()
            && !host.read_returned_from(self.started_sp)
        {
            // The leader's server read it only after the function that
            // called the turn's wait returned (see `stack_depth`): not from
            // inside that function here either, whatever waits it makes.
            return false;
        }
        let need = self.after_reads.get(i).copied().unwrap_or(0);
        if need == 0 {
            return true;
        }
        let window = self.turn[..i]
            .iter()
            .rev()
            .find(|h| matches!(h.kind, Kind::Data | Kind::Accept | Kind::Close))
            .map_or(0, |h| h.seq);
        let made = self
            .reads_made
            .is_some_and(|(anchor, count)| anchor > window || (anchor == window && count >= need));
        made || !self.started() || self.reader_waited(host)
    }

    /// Whether a server thread's wait started the turn in flight.
    fn started(&self) -> bool {
        self.started_at.is_some()
    }

    /// Whether the thread whose wait started the turn in flight went back
    /// to wait.
    fn reader_waited<H: Host>(&self, host: &H) -> bool {
        self.started_at
            .is_some_and(|(slot, n)| host.waits(slot) > n)
    }

    /// Whether entry `i` of the turn in flight is still to be read: bytes
    /// the server has not taken, or an EOF it has not read.
    fn entry_unread(&self, i: usize) -> bool {
        let h = &self.turn[i];
        let Some(c) = self.conns.get(&h.conn) else {
            return false;
        };
        match h.kind {
            Kind::Data => !c.closed && c.served < self.starts[i] + h.len as usize,
            Kind::Close => !c.eof && !c.closed,
            _ => false,
        }
    }

    /// Whether entries of other connections before entry `at` are still to
    /// be read.
    fn read_before(&self, conn: u64, at: usize) -> bool {
        (0..at).any(|i| self.turn[i].conn != conn && self.entry_unread(i))
    }

    /// Hands over turns until one is in flight or none is left
    /// (`from_loop`: on the server thread about to wait in that loop).
    fn run_from<H: Host>(&mut self, host: &mut H, from_loop: Option<u64>) {
        self.run_turns(host, from_loop);
        #[cfg(debug_assertions)]
        self.check_invariants();
    }

    /// What no run of turns may break, checked in debug builds (the replay
    /// simulation and the preload tests) where it would break: the turn in
    /// flight has one payload start and one clock-read mark per entry, in
    /// log order (seqs rising), its payload starts rising within its
    /// payloads, and every connection's inbox within them.
    #[cfg(debug_assertions)]
    fn check_invariants(&self) {
        debug_assert_eq!(self.turn.len(), self.starts.len(), "a start per entry");
        debug_assert_eq!(
            self.turn.len(),
            self.after_reads.len(),
            "a read mark per entry"
        );
        debug_assert!(
            self.turn.windows(2).all(|w| w[0].seq < w[1].seq),
            "the turn's entries in log order"
        );
        debug_assert!(
            self.starts.windows(2).all(|w| w[0] <= w[1])
                && self.starts.last().is_none_or(|&s| s <= self.payloads.len()),
            "payload starts rising within the payloads"
        );
        debug_assert!(
            self.conns
                .values()
                .all(|c| c.inbox.0 <= c.inbox.1 && c.inbox.1 <= self.payloads.len()),
            "every inbox within the turn's payloads"
        );
    }

    fn run_turns<H: Host>(&mut self, host: &mut H, from_loop: Option<u64>) {
        let from_server = from_loop.is_some();
        let Some((epoch, start)) = host.stream() else {
            return;
        };
        if epoch != self.epoch {
            self.restart(host, epoch, start);
        }
        loop {
            if !self.turn.is_empty() {
                if let Some(id) = from_loop {
                    self.dial_due(host, id);
                }
                if !self.progress(host) {
                    return;
                }
                self.finish(host);
            }
            if !self.take_turn(host, from_server) {
                return;
            }
        }
    }

    /// The accepts of the turn in flight still to be connected.
    fn undialed_accepts(&self) -> impl Iterator<Item = u64> + '_ {
        self.turn
            .iter()
            .filter(|h| h.kind == Kind::Accept && self.conns.get(&h.seq).is_some_and(|c| !c.dialed))
            .map(|h| h.seq)
    }

    /// Whether accepts of the turn in flight wait to be connected.
    fn undialed(&self) -> bool {
        self.undialed_accepts().next().is_some()
    }

    /// Whether the turn's accepts wait until it is due: the leader's
    /// server accepted them some waits after its last turn, in an epoll
    /// loop (whose alarm wakes it). Connected at once, a replay connection
    /// is reported by any wait (the kernel's listener), and a server that
    /// runs a nested loop (Redis inside a busy script) would accept it,
    /// and read the turn's inputs, inside the script.
    fn defers_accepts(&self) -> bool {
        self.turn_waits > 0 && self.turn_loop().is_some_and(|l| l != 0)
    }

    /// The loop whose turn the turn in flight is (its first entry names it).
    fn turn_loop(&self) -> Option<u64> {
        self.turn.first().and_then(|f| f.turn_loop).map(u64::from)
    }

    /// On the server thread about to wait in loop `loop_id`: connects the
    /// turn's accepts when the turn is this loop's and due (see
    /// `defers_accepts`); this wait then reports them.
    fn dial_due<H: Host>(&mut self, host: &mut H, loop_id: u64) {
        if !self.undialed() || self.turn_loop() != Some(loop_id) || !self.due(host) {
            return;
        }
        let conns: Vec<u64> = self.undialed_accepts().collect();
        for conn in conns {
            self.dial(host, conn);
        }
    }

    /// The next entry (a held one first) and the ring position past it;
    /// its bytes are in `buf`.
    fn next_entry<H: Host>(&mut self, host: &mut H) -> Option<(EntryHeader, u64)> {
        if let Some(h) = self.held.take() {
            return Some(h);
        }
        host.next_entry(&mut self.buf)
    }

    /// Takes the next turn from the log and starts handing it over: false
    /// when there is none.
    fn take_turn<H: Host>(&mut self, host: &mut H, from_server: bool) -> bool {
        let width = host.batch_width();
        while let Some((h, end)) = self.next_entry(host) {
            if h.kind == Kind::Time {
                if self.absorb_time(host, h, end) {
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
                // The inbox spans a connection's entries in the turn, begun
                // by its first (a later run's bytes lie past other
                // connections': a read skips those, see `read_bounds`).
                let continues = self
                    .turn
                    .iter()
                    .any(|l| l.conn == h.conn && l.kind == Kind::Data);
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
            self.after_reads
                .push(std::mem::take(&mut self.window_reads));
            self.starts.push(if h.kind == Kind::Data {
                self.payloads.len() - h.len as usize
            } else {
                self.payloads.len()
            });
            self.turn.push(h);
            self.took(host, end);
        }
        for i in 0..self.turn.len() {
            let h = self.turn[i];
            self.begin(host, h);
        }
        if self.turn.is_empty() {
            return false;
        }
        if log::log_enabled!(log::Level::Trace) {
            let entries: Vec<String> = self
                .turn
                .iter()
                .map(|h| format!("{:?} {} conn {} waits {}", h.kind, h.seq, h.conn, h.waits))
                .collect();
            log::trace!("turn: {}", entries.join(", "));
        }
        self.later = self
            .turn
            .iter()
            .filter(|h| matches!(h.kind, Kind::Data | Kind::Close))
            .map(|h| h.seq)
            .collect();
        if self.tick.is_some() {
            self.wake_tick_loop(host);
        } else if self.undialed() {
            // Its loop's thread connects them once the turn is due: wake it
            // from its wait to count (the applier took the turn), or let it
            // go round without blocking (see `must_not_block`).
            if let Some(id) = self.turn_loop() {
                host.wake_loop(id);
            }
        } else if !(from_server && self.read_here(host)) {
            self.ring_bell(host);
        }
        true
    }

    /// A `TICK` is handed over in a turn of its loop: wakes that loop's
    /// thread from its wait (its alarm; a `poll`/`select` loop by the bell
    /// in any replay connection). Without either it takes the tick when
    /// its own timeout ends the wait.
    fn wake_tick_loop<H: Host>(&mut self, host: &mut H) {
        let Some((id, None)) = self.tick else {
            return;
        };
        if id != 0 {
            host.wake_loop(id);
            return;
        }
        // The lowest such connection: the same choice on every run.
        let any = self
            .conns
            .iter()
            .filter(|(_, c)| c.server_fd >= 0 && !c.closing && !c.closed)
            .map(|(conn, c)| (*conn, c.server_fd))
            .min();
        if let Some((conn, fd)) = any {
            host.ring_bell(conn, fd);
        }
    }

    /// Whether the calling server thread (about to wait) is the one that
    /// reads the turn's first connection: then its own wait sees the turn,
    /// else the bell must wake that connection's thread (a server with
    /// several loops reads each connection on its own one).
    fn read_here<H: Host>(&self, host: &H) -> bool {
        self.turn
            .iter()
            .find(|h| matches!(h.kind, Kind::Data | Kind::Close))
            .and_then(|h| self.conns.get(&h.conn))
            .is_some_and(|c| c.read_slot == Some(host.slot()))
    }

    /// The server may be blocked in its wait, and the log's bytes (or its
    /// EOFs) make no fd ready: one byte into the turn's first connection
    /// wakes it (the wait hook takes the byte out again and reports what
    /// the log holds).
    fn ring_bell<H: Host>(&mut self, host: &mut H) {
        let first = self
            .turn
            .iter()
            .find(|h| matches!(h.kind, Kind::Data | Kind::Close))
            .and_then(|h| self.conns.get(&h.conn).map(|c| (h.conn, c.server_fd)));
        if let Some((conn, fd)) = first.filter(|(_, fd)| *fd >= 0) {
            host.ring_bell(conn, fd);
        }
    }

    /// A new stream starts at `start`: whatever was in flight is gone.
    fn restart<H: Host>(&mut self, host: &mut H, epoch: u64, start: u64) {
        log::info!("applying from seq {start} (stream {epoch})");
        self.epoch = epoch;
        self.end_all(host);
        self.clear_turn();
        self.held = None;
        self.stash.clear();
        self.prev_seq = start.saturating_sub(1);
        host.read_from(start);
    }

    /// Ends every replay connection (the server reads EOF on each).
    fn end_all<H: Host>(&mut self, host: &mut H) {
        for (conn, mut c) in std::mem::take(&mut self.conns) {
            host.disconnect(conn);
            c.pending.forget(&mut self.kept);
        }
    }

    /// Starts handing over `h`: from now on the server reads its time.
    fn begin<H: Host>(&mut self, host: &mut H, h: EntryHeader) {
        host.enter_input(h.time_us);
        match h.kind {
            Kind::Accept => {
                self.register(h.seq);
                if !self.defers_accepts() {
                    self.dial(host, h.seq);
                }
            }
            // Their output checks run as the server starts the turn.
            Kind::Data | Kind::Close => {}
            Kind::View => self.end_all(host),
            Kind::Tick => self.tick = Some((h.conn, None)),
            Kind::Noop | Kind::Wrap | Kind::Time => {}
        }
        if h.kind == Kind::Close {
            // The server learns of the EOF as of the log's bytes: the wait
            // reports the connection readable in log order and its read
            // gets the end (see `serve`); the socket ends after that, or
            // the kernel would report it out of order or before the turn
            // is the server's.
            if let Some(c) = self.conns.get_mut(&h.conn) {
                c.closing = true;
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
        self.starts.clear();
        self.later.clear();
        self.after_reads.clear();
        self.window_reads = 0;
        self.reads_made = None;
        self.started_at = None;
        self.started_sp = 0;
        self.consumed_at = None;
        self.pending_since = None;
        self.stuck_said = false;
        self.tick = None;
        self.times.clear();
        self.anchor = 0;
        self.closed = false;
        self.turn_waits = 0;
    }

    /// The turn in flight took the log's entries up to apply ring position
    /// `end`: their bytes are in the turn's own buffers, so the follower
    /// may reuse their space at once. (Freed only at the turn's end, a
    /// turn larger than the apply ring waited for space that only its own
    /// end would free: a server reading a large value in one go stalled.)
    fn took<H: Host>(&mut self, host: &mut H, end: u64) {
        host.release(end);
    }

    /// The server handled the whole turn.
    fn finish<H: Host>(&mut self, host: &mut H) {
        // Inputs the server never reached (it closed the connection
        // first) are checked as the turn ends.
        self.check_rest(host);
        if let Some(last) = self.turn.last() {
            host.set_applied(last.seq.max(self.turn_last));
        }
        self.clear_turn();
    }

    /// Moves the turn on: true once the server handled all of it and the
    /// threads that handled it went back to wait. Like the leader's turn
    /// lock, that keeps what the server does after the input in that turn
    /// (memcached's listener runs its clock timer after the accept) before
    /// anything of the next turn.
    fn progress<H: Host>(&mut self, host: &mut H) -> bool {
        let patience_over = self
            .consumed_at
            .is_some_and(|t| host.now().saturating_sub(t) >= TURN_PATIENCE);
        // Handled by a thread that waited since (or long enough ago).
        // Patience is for a server whose waits the hooks do not see: a
        // thread still running the turn (slow, on a loaded machine) is in
        // it, and its clock reads belong to it.
        let waited = |c: &Conn| {
            host.waits(c.handled_slot) > c.handled_turn
                || (patience_over && !host.running(c.handled_slot))
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
                            && !host.wants_write(c.server_fd)
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
                    Some((_, Some((slot, n)))) => host.waits(slot) > n,
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
            self.consumed_at = Some(host.now());
        }
        done
    }

    /// A turn still in flight after [`TURN_STUCK`]: one warning naming
    /// what it waits for (a server that never finishes a turn stops its
    /// node's apply; the operator and the tests see why). Asked by the
    /// applier thread while a turn is in flight, off the server's threads.
    pub fn say_if_stuck<H: Host>(&mut self, host: &H) {
        let now = host.now();
        let since = *self.pending_since.get_or_insert(now);
        let stuck = now.saturating_sub(since);
        if self.stuck_said || stuck < TURN_STUCK {
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
                        host.loop_of(c.server_fd),
                        c.served,
                        c.inbox.1,
                        c.eof,
                        c.closed,
                        c.handled_slot,
                        c.handled_turn,
                        host.waits(c.handled_slot),
                        host.running(c.handled_slot)
                    ),
                }
            ));
        }
        log::warn!(
            "a turn has been in flight for {:?} (all read: {}, tick {:?}):{what}",
            stuck,
            self.consumed_at.is_some(),
            self.tick
        );
    }

    /// Takes clock record `h` (ending at ring position `end`) from the
    /// log: into the turn in flight when it is that turn's, else into the
    /// stash of a turn still to come. False when it is the next turn's
    /// and the turn in flight is not done (then it is held).
    fn absorb_time<H: Host>(&mut self, host: &mut H, h: EntryHeader, end: u64) -> bool {
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
                self.window_reads = self.window_reads.max(k);
            }
            self.prev_seq = h.seq;
            self.turn_last = h.seq;
            self.took(host, end);
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
            host.set_head(end);
            return true;
        }
        // The end, or a record, of a turn this server already finished
        // (its reads did not need it).
        self.stash.clear();
        self.prev_seq = h.seq;
        host.set_applied(h.seq);
        host.set_head(end);
        true
    }

    /// The first entry `h` of a turn: the stashed clock records are that
    /// turn's when it continues them (the leader's same turn), else they
    /// were a turn that never came (its leader stopped).
    fn adopt_stash(&mut self, h: &EntryHeader) -> bool {
        let stash = std::mem::take(&mut self.stash);
        let adopted = !stash.is_empty() && h.flags & SAME_TURN != 0 && h.seq == self.prev_seq + 1;
        if adopted {
            self.window_reads = stash.iter().map(|r| r.k).max().unwrap_or(0);
            self.times.extend(stash);
        }
        adopted
    }

    /// Whether the calling server thread entered as many waits since its
    /// last turn as the leader's thread did before the turn in flight. A
    /// turn that begins with accepts is due alike: its connections are
    /// dialed only then (see `defers_accepts`), where its loop can tell.
    fn due<H: Host>(&self, host: &H) -> bool {
        self.turn
            .first()
            .is_none_or(|f| host.due(f.view, self.turn_waits))
    }

    /// The server read the EOF of, or closed, connection `conn`: its clock
    /// reads count from the connection's CLOSE when the turn has it.
    fn enter_close_window<H: Host>(&self, host: &mut H, conn: u64) {
        if let Some(h) = self
            .turn
            .iter()
            .find(|h| h.kind == Kind::Close && h.conn == conn)
        {
            host.enter_window(self.turn_start(), h.seq, h.time_us);
        }
    }

    /// The server reached entry `seq` of connection `conn` (it reads its
    /// bytes, or its EOF): the output checks of the connection's inputs up
    /// to it run now, each against what this server wrote on the
    /// connection since it read the input before — the interval the
    /// leader's digest covers, ending where the leader's server read it.
    fn check_upto<H: Host>(&mut self, host: &mut H, conn: u64, seq: u64) {
        while let Some(i) = self
            .later
            .iter()
            .position(|&s| s <= seq && self.turn.iter().any(|h| h.seq == s && h.conn == conn))
        {
            let next = self.later.remove(i);
            if let Some(h) = self.turn.iter().find(|h| h.seq == next).copied() {
                self.check_output(host, &h);
                self.classify_input(&h);
            }
        }
    }

    /// Runs every check still to run (the server ended the turn without
    /// reading some input: a connection it closed first).
    fn check_rest<H: Host>(&mut self, host: &mut H) {
        for seq in std::mem::take(&mut self.later) {
            if let Some(h) = self.turn.iter().find(|h| h.seq == seq).copied() {
                self.check_output(host, &h);
                self.classify_input(&h);
            }
        }
    }

    /// Where the server's read of `conn` at `served` takes bytes from
    /// (past other connections' bytes when the connection comes back later
    /// in the turn) and must stop (the end of the input it reads: a read
    /// takes no more than the leader's read took), the last entry of that
    /// input (its clock reads count from there), and the last entry still
    /// to check that begins where the read starts or before.
    fn read_bounds(&self, conn: u64, served: usize) -> (usize, usize, u64, Option<u64>) {
        let mut from = served;
        let mut limit = served;
        let mut anchor = 0;
        let mut reached = None;
        let mut found = false;
        for (h, &start) in self.turn.iter().zip(&self.starts) {
            if h.conn != conn || h.kind != Kind::Data {
                continue;
            }
            let end = start + h.len as usize;
            if found {
                // The input goes on through its later chunks.
                if h.out_hash != 0 || start != limit {
                    break;
                }
                limit = end;
                anchor = h.seq;
                continue;
            }
            if end <= served {
                if self.later.contains(&h.seq) {
                    reached = Some(h.seq);
                }
                continue;
            }
            from = served.max(start);
            limit = end;
            anchor = h.seq;
            found = true;
            if self.later.contains(&h.seq) {
                reached = Some(h.seq);
            }
        }
        (from, limit, anchor, reached)
    }

    /// The seq the turn in flight begins at (0: none).
    fn turn_start(&self) -> u64 {
        self.turn.first().map_or(0, |f| f.seq)
    }

    /// Whether the turn in flight holds an input after `anchor` (the
    /// window of reads counted from `anchor` ended there).
    fn window_closed(&self, anchor: u64) -> bool {
        self.turn
            .iter()
            .any(|h| h.seq > anchor && matches!(h.kind, Kind::Data | Kind::Accept | Kind::Close))
    }

    /// ACCEPT: connects to the server (it accepts in its event loop); a
    /// connection that cannot be opened is dropped (its inputs skipped).
    fn dial<H: Host>(&mut self, host: &mut H, conn: u64) {
        if !host.connect(conn) {
            self.conns.remove(&conn);
            return;
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            c.dialed = true;
        }
    }

    /// ACCEPT: the connection the turn opens (see `dial`).
    fn register(&mut self, conn: u64) {
        self.conns.insert(
            conn,
            Conn {
                dialed: false,
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
                replies: crate::backup::node_dependent::Replies::default(),
            },
        );
    }

    /// DATA/CLOSE carry the leader's digest of the connection's output
    /// since its last input: compare with this server's, then start over.
    fn check_output<H: Host>(&mut self, host: &mut H, h: &EntryHeader) {
        // Only an input's first entry carries a digest (the leader's
        // server read the whole input at once).
        if h.out_hash == 0 {
            return;
        }
        let Some(c) = self.conns.get_mut(&h.conn) else {
            return;
        };
        let prev = std::mem::replace(&mut c.last_input, h.seq);
        if h.out_hash == OutputDigest::WITHHELD {
            // The leader's server output never left it (it failed the
            // connection): nothing to compare; start over.
            c.pending.skip(&mut self.kept);
            c.replies.take();
            log::debug!(
                "connection {}: the leader withheld its output before seq {} (not compared)",
                h.conn,
                h.seq
            );
            return;
        }
        let verdict = c.pending.check(h.out_hash, &mut self.kept);
        // The commands that produced it describe the node: not counted.
        let node_dependent = c.replies.take();
        let command = c.replies.last_command();
        let (len, shown) = match verdict {
            Verdict::Same => return,
            Verdict::Unsure => {
                log::debug!(
                    "connection {}: the output after seq {prev} differs from the leader's, but more than {} bytes went unmatched before (not counted)",
                    h.conn,
                    crate::backup::output_check::KEEP
                );
                return;
            }
            Verdict::Differs { len, shown } => (len, shown),
        };
        if node_dependent {
            log::debug!(
                "connection {}: the output after seq {prev} (`{command}`) differs from the leader's, as it may: that reply describes the node (its pid, addresses, ports, memory, uptime), not the data (not counted)",
                h.conn
            );
            return;
        }
        host.diverged();
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
        assert!(
            runs_in(&close, 2, true) && !runs_in(&close, 2, false),
            "an EOF is the log's to report, as bytes are"
        );
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
    fn a_connections_later_reads_and_eofs_join_until_its_eof() {
        let t = [data(10, 1, false, 7), data(11, 2, true, 7)];
        assert!(
            joins_last(&t, &data(12, 2, true, 0), 4),
            "a later chunk of one read"
        );
        assert!(
            joins_last(&t, &data(12, 2, true, 9), 4),
            "a later read of conn 2 in the same leader turn"
        );
        assert!(
            joins_last(&t, &data(12, 1, true, 9), 4),
            "conn 1 again, after another: the server read it again later in the turn"
        );
        let close = |conn| {
            let mut c = data(12, conn, true, 5);
            c.kind = Kind::Close;
            c
        };
        assert!(
            joins_last(&t, &close(2), 4),
            "conn 2's EOF, read right after"
        );
        assert!(
            joins_last(&t, &close(3), 4),
            "another connection's EOF: the log's to report, in its place"
        );
        assert!(!joins_last(&t, &close(3), 2), "within the width");
        let mut after = t.to_vec();
        after.push(close(2));
        assert!(
            joins_last(&after, &data(13, 3, true, 7), 4),
            "the turn goes on after an EOF it read"
        );
        assert!(
            !joins_last(&after, &data(13, 2, true, 7), 4),
            "nothing of a connection after its EOF"
        );
    }

    #[test]
    fn inputs_join_inputs_and_accepts_join_accepts() {
        let accept = |seq| {
            let mut a = data(seq, seq, true, 0);
            a.kind = Kind::Accept;
            a
        };
        assert!(
            joins_last(&[data(10, 1, false, 7)], &accept(11), 4),
            "accepts after the inputs: the listener after the log's connections"
        );
        assert!(
            joins_last(&[accept(11)], &data(12, 1, true, 7), 4),
            "inputs after the accepts: the listener first"
        );
        assert!(
            !joins_last(&[accept(11), data(12, 1, true, 7)], &accept(13), 4),
            "never accepts on both sides of an input"
        );
        assert!(
            !joins_last(
                &[data(10, 1, false, 7), accept(11)],
                &data(12, 2, true, 7),
                4
            ),
            "nor inputs on both sides of an accept"
        );
        assert!(
            joins_last(&[accept(11)], &accept(12), 4),
            "one accept loop's connections"
        );
        assert!(
            joins_last(&[accept(11), accept(12)], &accept(13), 1),
            "whatever the width: they take no room in the wait's result"
        );
        let mut view = data(11, 0, true, 0);
        view.kind = Kind::View;
        assert!(!joins_last(&[data(10, 1, false, 7)], &view, 4));
    }
}
