//! A backup: the model server under the real replay machine, with a host
//! that reads the node's own ring (the real codec) up to what the follower
//! delivered so far, and a scheduler that interleaves the follower's
//! delivery, the applier thread and the server's waits by the seed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockstep_common::entry::EntryHeader;
use lockstep_common::region::Region;
use lockstep_common::ring::{ReadOutcome, RingReader};

use super::log::{SimLog, MAX_ENTRY, RING_SIZE};
use super::server::{read_sp, wait_sp, Os, Read, Ready, Role, Server, Setup, Shape, LISTENER_FD};
use crate::backup::replay::{Host, Replay, Served};
use crate::determinism::clock::ORIGIN_US;
use crate::determinism::stack_depth::StackMarks;
use crate::determinism::thread_clock::ThreadClock;
use crate::determinism::turns::{TurnMarks, MAX_WIDTH};
use lockstep_launcher::rng::Rng;

/// One server thread as the backup's preload keeps it: its waits, whether
/// it runs a turn (between a wait's return and its next), its marks and
/// clock.
#[derive(Clone)]
pub struct SimThread {
    pub waits: u64,
    pub running: bool,
    pub marks: TurnMarks,
    pub clock: ThreadClock,
    pub stack: StackMarks,
}

impl SimThread {
    const NEW: SimThread = SimThread {
        waits: 0,
        running: false,
        marks: TurnMarks::NEW,
        clock: ThreadClock::NEW,
        stack: StackMarks::NEW,
    };
}

/// The backup's world: its region's ring, the server's threads, the
/// replay connections' kernel side and the server's clock.
pub struct SimHost {
    region: Arc<Region>,
    reader: RingReader,
    /// Each entry's seq and end, and how many the follower delivered.
    ends: Vec<(u64, u64)>,
    delivered: usize,
    pub applied: u64,
    pub diverged: u64,
    width: usize,
    /// The server's threads (slots) and the one calling now; the
    /// process's log time.
    pub threads: Vec<SimThread>,
    pub cur: usize,
    log_time: AtomicU64,
    /// Replay connections the server has yet to accept, and those whose
    /// log end was reached.
    backlog: VecDeque<u64>,
    /// Replay connections the log ended (the server's end reads EOF).
    shut: BTreeSet<u64>,
    /// The fd a bell byte waits in, and the loops whose alarm rang.
    pub bell: Option<i32>,
    pub alarms: BTreeSet<u64>,
    now: Duration,
}

impl SimHost {
    pub fn new(log: &SimLog, node: u64, width: usize, threads: usize) -> SimHost {
        SimHost {
            region: log.region(node),
            reader: RingReader::new(RING_SIZE, 0, 1, MAX_ENTRY as u32),
            ends: log.ends().to_vec(),
            delivered: 0,
            applied: 0,
            diverged: 0,
            width,
            threads: vec![SimThread::NEW; threads],
            cur: 0,
            log_time: AtomicU64::new(0),
            backlog: VecDeque::new(),
            shut: BTreeSet::new(),
            bell: None,
            alarms: BTreeSet::new(),
            now: Duration::ZERO,
        }
    }

    /// The follower delivers up to `n` more entries: false when it had
    /// delivered them all.
    fn deliver(&mut self, n: usize) -> bool {
        if self.delivered == self.ends.len() {
            return false;
        }
        self.delivered = (self.delivered + n.max(1)).min(self.ends.len());
        true
    }

    /// `ThreadClock::finish_read` of the calling thread.
    pub fn finish_read(&mut self, us: u64) -> u64 {
        let cur = self.cur;
        self.threads[cur].clock.finish_read(&self.log_time, us)
    }

    /// The last seq of the log.
    fn last_seq(&self) -> u64 {
        self.ends.last().map_or(0, |e| e.0)
    }

    /// What the server's clocks read now outside a counted read.
    pub fn reads_now(&self) -> u64 {
        match self.threads[self.cur].clock.now() {
            0 => ORIGIN_US,
            t => t,
        }
    }
}

impl Host for SimHost {
    fn stream(&mut self) -> Option<(u64, u64)> {
        Some((1, 1))
    }

    fn read_from(&mut self, start: u64) {
        self.reader = RingReader::new(RING_SIZE, 0, start, MAX_ENTRY as u32);
    }

    fn next_entry(&mut self, buf: &mut Vec<u8>) -> Option<(EntryHeader, u64)> {
        let tail = match self.delivered {
            0 => 0,
            n => self.ends[n - 1].1,
        };
        match self.reader.poll(self.region.ring(), tail, buf) {
            ReadOutcome::Entry { header, pos, len } => Some((header, pos + len as u64)),
            ReadOutcome::Empty => None,
            other => panic!("the simulated ring is unreadable: {other:?}"),
        }
    }

    fn set_head(&mut self, _pos: u64) {}

    fn release(&mut self, _pos: u64) {}

    fn set_applied(&mut self, seq: u64) {
        self.applied = self.applied.max(seq);
    }

    fn diverged(&mut self) {
        self.diverged += 1;
    }

    fn slot(&self) -> usize {
        self.cur
    }

    fn waits(&self, slot: usize) -> u64 {
        self.threads[slot].waits
    }

    fn running(&self, slot: usize) -> bool {
        self.threads[slot].running
    }

    fn due(&self, view: u64, waits: u32) -> bool {
        let t = &self.threads[self.cur];
        t.marks.due(view, waits, t.waits)
    }

    fn handed(&mut self, view: u64) {
        let t = &mut self.threads[self.cur];
        t.marks.handed(view, t.waits);
    }

    fn batch_width(&self) -> usize {
        self.width
    }

    fn wants_write(&self, _fd: i32) -> bool {
        false
    }

    fn loop_of(&self, _fd: i32) -> Option<u64> {
        None
    }

    fn wait_mark(&self) -> u64 {
        self.threads[self.cur].stack.last_wait()
    }

    fn read_returned_from(&self, since: u64) -> bool {
        self.threads[self.cur].stack.read_returned_from(since)
    }

    fn enter_input(&mut self, us: u64) {
        if us != 0 {
            self.log_time.store(us, Ordering::Release);
        }
    }

    fn enter_turn(&mut self, turn: u64, us: u64) {
        self.threads[self.cur].clock.enter_turn(turn, us);
    }

    fn enter_window(&mut self, turn: u64, anchor: u64, us: u64) {
        self.threads[self.cur].clock.enter_window(turn, anchor, us);
    }

    fn connect(&mut self, conn: u64) -> bool {
        self.backlog.push_back(conn);
        true
    }

    fn shut_write(&mut self, conn: u64) {
        self.shut.insert(conn);
    }

    fn disconnect(&mut self, conn: u64) {
        self.backlog.retain(|c| *c != conn);
        self.shut.insert(conn);
    }

    fn ring_bell(&mut self, _conn: u64, server_fd: i32) {
        if self.bell.is_none() {
            self.bell = Some(server_fd);
        }
    }

    fn bell_gone(&mut self, server_fd: i32) {
        if self.bell == Some(server_fd) {
            self.bell = None;
        }
    }

    fn wake_loop(&mut self, id: u64) {
        self.alarms.insert(id);
    }

    fn now(&self) -> Duration {
        self.now
    }
}

/// The backup's operating system as its server sees it: the preload's
/// backup hooks over the machine.
struct BackupOs<'a> {
    rng: &'a mut Rng,
    replay: &'a mut Replay,
    host: &'a mut SimHost,
    fds: BTreeMap<i32, u64>,
    next_fd: i32,
    /// What went wrong that a real backup would hang on.
    stalls: Vec<String>,
    shape: Shape,
    read_once: bool,
    /// Whether the server's waits never block.
    spins: bool,
    /// How likely the follower delivers more between two calls of the
    /// server (percent): 0 delivers only while the server waits for it.
    eagerness: u64,
    /// Waits so far (a bound against a spinning server).
    iterations: u64,
    /// How deep the server's loop runs now (see `Os::at_depth`).
    depth: u32,
    /// A server with two loops: the thread whose loop watches each
    /// connection (absent: handed over, not taken yet), and the
    /// connections the listener handed to the worker.
    watch: BTreeMap<i32, usize>,
    handed: VecDeque<(i32, u64)>,
}

impl<'a> BackupOs<'a> {
    /// The backup's world before its server starts: how eagerly its
    /// follower delivers is the seed's.
    fn new(
        rng: &'a mut Rng,
        replay: &'a mut Replay,
        host: &'a mut SimHost,
        setup: &Setup,
    ) -> BackupOs<'a> {
        let eagerness = [0, 5, 15, 40][rng.below(4) as usize];
        BackupOs {
            rng,
            replay,
            host,
            fds: BTreeMap::new(),
            next_fd: LISTENER_FD + 1,
            stalls: Vec::new(),
            shape: setup.shape,
            read_once: setup.read_once,
            spins: setup.spins,
            eagerness,
            iterations: 0,
            depth: 0,
            watch: BTreeMap::new(),
            handed: VecDeque::new(),
        }
    }
}

impl BackupOs<'_> {
    /// While the server blocks, the world moves: the follower delivers
    /// some entries, the applier runs, time passes. False when the
    /// follower had nothing more.
    fn world_moves(&mut self) -> bool {
        let delivered = self.host.deliver(1 + self.rng.below(4) as usize);
        self.replay.run(self.host);
        self.host.now += Duration::from_millis(1 + self.rng.below(50));
        delivered
    }

    /// The applier thread or the follower may act between any two calls of
    /// the server.
    fn meanwhile(&mut self) {
        if self.rng.percent(self.eagerness) {
            let n = 1 + self.rng.below(4) as usize;
            self.host.deliver(n);
        }
        if self.rng.percent(15) {
            self.replay.run(self.host);
        }
        self.host.now += Duration::from_micros(self.rng.below(300));
    }
}

impl BackupOs<'_> {
    /// The server's wait (`timeout` µs; None: none) through the preload's
    /// wait hooks: what it reports, or None once nothing more will come.
    fn event_wait(&mut self, timeout: Option<u64>) -> Option<Vec<Ready>> {
        let os = self;
        let (shape, loop_id) = (os.shape, os.shape.loop_id());
        os.iterations += 1;
        if os.iterations > 200_000 {
            os.stalls.push("the backup's server spins".into());
            return None;
        }
        // `dispatch::before_wait`.
        let th = &mut os.host.threads[0];
        th.stack.waited(wait_sp(os.depth));
        th.waits += 1;
        th.running = false;
        th.clock.leave_turn();
        os.replay.on_loop(os.host, loop_id);
        // The wait hook (`hooks::epoll`/`hooks::scan`).
        let unread = |os: &BackupOs| -> Vec<i32> {
            let fds: Vec<i32> = os
                .replay
                .unread(os.host)
                .into_iter()
                .take_while(|fd| *fd >= 0)
                .collect();
            fds
        };
        let mut keys = unread(&*os);
        let mut tick = os.replay.must_not_block(os.host, loop_id);
        let awaits = shape == Shape::Scan || loop_id != 0;
        if keys.is_empty() && !tick && timeout == Some(0) && awaits {
            // `region_host::await_turn`: the follower delivers until a turn
            // comes.
            while !os.replay.in_turn() {
                if !os.host.deliver(1 + os.rng.below(3) as usize) {
                    break;
                }
                os.replay.on_loop(os.host, loop_id);
            }
            keys = unread(&*os);
            tick = os.replay.must_not_block(os.host, loop_id);
            if os.spins && !os.replay.in_turn() && os.host.backlog.is_empty() {
                // The whole log ran: a spinning server would go on
                // spinning with nothing to do.
                return None;
            }
        }
        // The kernel's readiness: a connection whose end the log shut
        // reads EOF.
        let kernel = |os: &BackupOs| -> Vec<i32> {
            os.fds
                .iter()
                .filter(|(_, c)| os.host.shut.contains(c))
                .map(|(fd, _)| *fd)
                .collect()
        };
        let returns_at_once =
            !keys.is_empty() || tick || timeout == Some(0) || !kernel(&*os).is_empty();
        if !returns_at_once {
            // Blocked until the kernel reports something: the world moves.
            let mut quiet = 0;
            loop {
                if !os.host.backlog.is_empty()
                    || os.host.bell.is_some()
                    || !os.host.alarms.is_empty()
                    || !kernel(&*os).is_empty()
                {
                    break;
                }
                if timeout.is_some() && os.rng.percent(10) {
                    // The server's own timeout ends the wait.
                    break;
                }
                if !os.world_moves() {
                    quiet += 1;
                    if quiet > 20 {
                        return None;
                    }
                }
            }
        }
        // `dispatch::after_wait` and the bell's byte taken out.
        os.host.threads[0].running = true;
        os.replay.turn_returned(os.host, loop_id, !keys.is_empty());
        os.host.bell = None;
        os.host.alarms.clear();
        // `region_host::merge_events`: the log's connections first, in log
        // order, then the kernel's events.
        let mut ready: Vec<Ready> = keys.iter().map(|fd| Ready::Conn(*fd)).collect();
        let mut from_kernel = Vec::new();
        if !os.host.backlog.is_empty() {
            from_kernel.push(Ready::Listener);
        }
        for fd in kernel(&*os) {
            if !keys.contains(&fd) {
                from_kernel.push(Ready::Conn(fd));
            }
        }
        if os.replay.kernel_first() {
            from_kernel.append(&mut ready);
            ready = from_kernel;
        } else {
            ready.append(&mut from_kernel);
        }
        if std::env::var("LOCKSTEP_SIM_VERBOSE").is_ok() {
            eprintln!(
                "wait: n{} d{} {ready:?} {}",
                os.host.threads[0].waits,
                os.depth,
                os.replay.describe()
            );
        }
        Some(ready)
    }
}

impl Os for BackupOs<'_> {
    fn now(&self) -> u64 {
        self.host.reads_now()
    }

    fn wait(&mut self, timeout: Option<u64>) -> Option<Vec<Ready>> {
        self.event_wait(timeout)
    }

    fn accept(&mut self) -> Option<i32> {
        self.meanwhile();
        let conn = self.host.backlog.pop_front()?;
        let fd = self.next_fd;
        self.next_fd += 1;
        self.fds.insert(fd, conn);
        self.watch.insert(fd, self.host.cur);
        // `region_host::on_accept`.
        self.replay.accepted(self.host, conn, fd);
        self.replay.run(self.host);
        Some(fd)
    }

    fn read(&mut self, fd: i32) -> Read {
        self.meanwhile();
        let Some(&conn) = self.fds.get(&fd) else {
            return Read::Again;
        };
        // The read hook's mark (`stack_depth::reading`).
        let cur = self.host.cur;
        self.host.threads[cur].stack.read(read_sp(self.depth));
        let mut got = Vec::new();
        // A server that reads once per event reads with its whole buffer
        // (the leader's read took no more); one that reads until EAGAIN
        // may take any part.
        let cap = if self.read_once {
            16 * 1024
        } else {
            1 + self.rng.below(64) as usize
        };
        let served = self.replay.serve(self.host, conn, false, &mut |src| {
            let n = src.len().min(cap);
            got.extend_from_slice(&src[..n]);
            n
        });
        match served {
            Served::Bytes(n) if n > 0 => Read::Bytes(got),
            Served::Bytes(_) | Served::Empty => Read::Again,
            Served::Eof => Read::Eof,
        }
    }

    fn write(&mut self, fd: i32, bytes: &[u8]) -> usize {
        // A replay connection's writes are dropped: they always take all.
        if let Some(&conn) = self.fds.get(&fd) {
            self.replay.output(conn, &[bytes]);
        }
        bytes.len()
    }

    fn close(&mut self, fd: i32) {
        if let Some(conn) = self.fds.remove(&fd) {
            self.replay.closed(self.host, conn);
        }
    }

    /// `turn_reads::read` on a backup (`region_host::time_at`'s wait: the
    /// follower delivers more until the log says).
    fn clock(&mut self) -> u64 {
        self.meanwhile();
        let Some((at, mut now)) = self.host.threads[self.host.cur].clock.count_read() else {
            return self.host.reads_now();
        };
        loop {
            match self.replay.time_lookup(self.host, at, now) {
                Ok((us, _)) => return self.host.finish_read(us),
                Err(us) => now = us,
            }
            if !self.host.deliver(1) {
                self.stalls.push(format!(
                    "clock read {} after seq {} of the turn at seq {} waits for a log that has nothing more",
                    at.count, at.anchor, at.turn
                ));
                return self.host.finish_read(now);
            }
        }
    }

    fn busy(&mut self, _us: u64) {}

    fn at_depth(&mut self, depth: u32) {
        self.depth = depth;
    }

    fn hand_over(&mut self, fd: i32, id: u64) {
        self.watch.remove(&fd);
        self.handed.push_back((fd, id));
    }

    fn take_handed(&mut self) -> Vec<(i32, u64)> {
        let taken: Vec<(i32, u64)> = self.handed.drain(..).collect();
        for (fd, _) in &taken {
            self.watch.insert(*fd, self.host.cur);
        }
        taken
    }
}

/// Where a thread of a two-loop server stands in its wait.
#[derive(Clone, Copy)]
enum InWait {
    /// It just called its wait (`timeout` µs; None: none): the hook has
    /// yet to look at the log.
    Entered(Option<u64>),
    /// Its wait blocks in the kernel; `timed_out`: its timeout passed.
    Blocked {
        timeout: Option<u64>,
        timed_out: bool,
    },
}

impl BackupOs<'_> {
    /// Thread `t` of a two-loop server calls its wait
    /// (`dispatch::before_wait`).
    fn enter_wait(&mut self, t: usize) {
        self.host.cur = t;
        let th = &mut self.host.threads[t];
        th.stack.waited(wait_sp(self.depth));
        th.waits += 1;
        th.running = false;
        th.clock.leave_turn();
        self.replay.on_loop(self.host, t as u64 + 1);
    }

    /// What the kernel reports to thread `t`'s loop: the listener's
    /// pending connections, the worker's pipe, the connections the log
    /// shut.
    fn kernel_of(&self, t: usize) -> Vec<Ready> {
        let mut r = Vec::new();
        if t == 0 && !self.host.backlog.is_empty() {
            r.push(Ready::Listener);
        }
        if t == 1 && !self.handed.is_empty() {
            r.push(Ready::Pipe);
        }
        for (fd, c) in &self.fds {
            if self.watch.get(fd) == Some(&t) && self.host.shut.contains(c) {
                r.push(Ready::Conn(*fd));
            }
        }
        r
    }

    /// Thread `t`'s wait (the epoll hook over loop `t + 1`): what it
    /// returns now, or None while it blocks (`state` says how far it got).
    fn poll_wait(&mut self, t: usize, state: &mut InWait) -> Option<Vec<Ready>> {
        self.host.cur = t;
        let loop_id = t as u64 + 1;
        let mut keys = Vec::new();
        match *state {
            InWait::Entered(timeout) => {
                // `region_host::epoll_unread`: the log's connections this loop
                // watches, up to the first it does not.
                let unread = |os: &BackupOs| -> Vec<i32> {
                    os.replay
                        .unread(os.host)
                        .into_iter()
                        .take_while(|fd| *fd >= 0 && os.watch.get(fd) == Some(&t))
                        .collect()
                };
                keys = unread(self);
                let mut tick = self.replay.must_not_block(self.host, loop_id);
                if keys.is_empty() && !tick && timeout == Some(0) {
                    // `region_host::await_turn`.
                    while !self.replay.in_turn() {
                        if !self.host.deliver(1 + self.rng.below(3) as usize) {
                            break;
                        }
                        self.replay.on_loop(self.host, loop_id);
                    }
                    keys = unread(self);
                    tick = self.replay.must_not_block(self.host, loop_id);
                }
                let at_once =
                    !keys.is_empty() || tick || timeout == Some(0) || !self.kernel_of(t).is_empty();
                if !at_once {
                    *state = InWait::Blocked {
                        timeout,
                        timed_out: false,
                    };
                    return None;
                }
            }
            InWait::Blocked { timed_out, .. } => {
                let bell = self
                    .host
                    .bell
                    .is_some_and(|fd| self.watch.get(&fd) == Some(&t));
                let woken = timed_out
                    || bell
                    || self.host.alarms.contains(&loop_id)
                    || !self.kernel_of(t).is_empty();
                if !woken {
                    return None;
                }
            }
        }
        // `dispatch::after_wait`, the bell's byte and the alarm taken out.
        self.host.threads[t].running = true;
        self.replay
            .turn_returned(self.host, loop_id, !keys.is_empty());
        if self
            .host
            .bell
            .is_some_and(|fd| self.watch.get(&fd) == Some(&t))
        {
            self.host.bell = None;
        }
        self.host.alarms.remove(&loop_id);
        let kernel: Vec<Ready> = self
            .kernel_of(t)
            .into_iter()
            .filter(|r| !matches!(r, Ready::Conn(fd) if keys.contains(fd)))
            .collect();
        Some(merge(&keys, kernel, self.replay.kernel_first()))
    }
}

/// `region_host::merge_events`: the log's connections first, in log order, then
/// the kernel's events (the other way round when the leader's server
/// accepted first).
fn merge(keys: &[i32], mut kernel: Vec<Ready>, kernel_first: bool) -> Vec<Ready> {
    let mut ready: Vec<Ready> = keys.iter().map(|fd| Ready::Conn(*fd)).collect();
    if kernel_first {
        kernel.append(&mut ready);
        kernel
    } else {
        ready.append(&mut kernel);
        ready
    }
}

/// Replays the log on node `node`'s server with two loops (see
/// `leader::run_two_loops`): its threads' waits, the follower and the
/// applier interleaved by the seed; what both loops did, in order.
pub fn run_two_loops(rng: &mut Rng, setup: &Setup, log: &SimLog, node: u64) -> BackupRun {
    let width = setup.maxevents.clamp(1, MAX_WIDTH);
    let mut host = SimHost::new(log, node, width, 2);
    let mut replay = Replay::new();
    let mut servers = [
        Server::part(setup, ORIGIN_US, Role::Listener),
        Server::part(setup, ORIGIN_US, Role::Worker),
    ];
    let mut os = BackupOs::new(rng, &mut replay, &mut host, setup);
    let mut trace = Vec::new();
    let mut states = [InWait::Entered(None); 2];
    for (t, state) in states.iter_mut().enumerate() {
        os.enter_wait(t);
        *state = InWait::Entered(servers[t].timeout(os.host.reads_now()));
    }
    let mut quiet = 0;
    loop {
        os.iterations += 1;
        if os.iterations > 200_000 {
            os.stalls.push("the backup's server spins".into());
            break;
        }
        let first = os.rng.below(2) as usize;
        let mut ran = false;
        for t in [first, 1 - first] {
            let Some(ready) = os.poll_wait(t, &mut states[t]) else {
                continue;
            };
            servers[t].handle(&mut os, &ready);
            let who = ["listener", "worker"][t];
            trace.extend(servers[t].trace.drain(..).map(|l| format!("{who}: {l}")));
            os.enter_wait(t);
            states[t] = InWait::Entered(servers[t].timeout(os.host.reads_now()));
            ran = true;
            break;
        }
        if ran {
            quiet = 0;
            continue;
        }
        // Both loops block: the world moves.
        for state in &mut states {
            if let InWait::Blocked {
                timeout: Some(_),
                timed_out,
            } = state
            {
                // The server's own timeout ends the wait.
                *timed_out |= os.rng.percent(10);
            }
        }
        if !os.world_moves() {
            quiet += 1;
            if quiet > 20 {
                break;
            }
        }
    }
    let stalls = std::mem::take(&mut os.stalls);
    BackupRun {
        trace,
        diverged: host.diverged,
        applied: host.applied,
        last_seq: host.last_seq(),
        stalls,
    }
}

/// What a backup's run ended with.
pub struct BackupRun {
    pub trace: Vec<String>,
    pub diverged: u64,
    pub applied: u64,
    pub last_seq: u64,
    pub stalls: Vec<String>,
}

/// Replays the log on node `node`'s model server.
pub fn run(rng: &mut Rng, setup: &Setup, log: &SimLog, node: u64) -> BackupRun {
    // `turns::batch_width`: the wait's `maxevents` for epoll, one
    // connection for a scanning server.
    let width = match setup.shape {
        Shape::EpollOne | Shape::Scan => 1,
        Shape::Epoll | Shape::EpollEt => setup.maxevents.clamp(1, MAX_WIDTH),
    };
    let mut host = SimHost::new(log, node, width, 1);
    let mut replay = Replay::new();
    let mut server = Server::new(setup, ORIGIN_US);
    let mut os = BackupOs::new(rng, &mut replay, &mut host, setup);
    server.run(&mut os);
    let stalls = std::mem::take(&mut os.stalls);
    BackupRun {
        trace: server.trace,
        diverged: host.diverged,
        applied: host.applied,
        last_seq: host.last_seq(),
        stalls,
    }
}

#[cfg(test)]
mod tests {
    use lockstep_common::entry::{EntryHeader, Kind, OutputDigest, RETURNED, SAME_TURN};

    use super::*;

    /// A thread's wait begins (`dispatch::before_wait`).
    fn enter_wait(replay: &mut Replay, host: &mut SimHost) {
        enter_wait_at(replay, host, 0);
    }

    /// A wait of a loop running `depth` deep (see `Os::at_depth`).
    fn enter_wait_at(replay: &mut Replay, host: &mut SimHost, depth: u32) {
        host.threads[0].stack.waited(wait_sp(depth));
        host.threads[0].waits += 1;
        host.threads[0].running = false;
        host.threads[0].clock.leave_turn();
        replay.on_loop(host, 1);
    }

    /// Node 2 replays `log` (all delivered) up to its first turn, the
    /// accept of `conn`, which its server accepted as fd 10 in the outer
    /// loop (loop 1).
    fn accepted_as_fd_10(log: &SimLog, conn: u64) -> (SimHost, Replay) {
        let mut host = SimHost::new(log, 2, 8, 1);
        host.deliver(usize::MAX);
        let mut replay = Replay::new();
        enter_wait(&mut replay, &mut host);
        assert_eq!(host.backlog.pop_front(), Some(conn));
        host.threads[0].running = true;
        replay.turn_returned(&mut host, 1, false);
        replay.accepted(&mut host, conn, 10);
        (host, replay)
    }

    fn entry(kind: Kind, conn: u64, flags: u8, waits: u32, time_us: u64) -> EntryHeader {
        let mut h = EntryHeader::new(kind, 1, 0, conn, 0);
        h.flags = flags;
        h.waits = waits;
        h.time_us = time_us;
        h.turn_loop = Some(1);
        h
    }

    /// Redis read a client's `PING` after a busy script ended, from an
    /// event its loop had fired before: the leader logged the clock reads
    /// the script's end made (a record for read 2 of the turn), then the
    /// input. A backup hands the turn over at the wait, but its server may
    /// read the input only once it made those reads (inside the script it
    /// answered `-BUSY`); had it waited again without making them, they
    /// would not come, and the input is its to read.
    /// Redis read a client's `PING` after a busy script ended, from an
    /// entry a nested wait had left in its fired array: no wait between
    /// the nested one and the read, which ran further out on the stack
    /// (`RETURNED`). A backup's nested wait where that turn is due starts
    /// it (its clock reads are the turn's) but reports nothing of it, and a
    /// read inside the script gets nothing (it would answer `-BUSY`),
    /// whatever nested waits follow; the outer loop reads it, from its own
    /// stale entry or after its next wait.
    #[test]
    fn an_input_the_leader_read_after_the_nested_loop_returned_waits_for_the_outer_loop() {
        let t = 1_700_000_000_000_000;
        for outer_wait in [false, true] {
            let mut log = SimLog::new("returned");
            let (_, conn) = log.append(&entry(Kind::Accept, 0, 0, 0, t), &[]);
            let mut ping = entry(Kind::Data, conn, RETURNED, 1, t + 1_000);
            ping.out_hash = OutputDigest::default().pack();
            log.append(&ping, b"PING\r\n");
            let (mut host, mut replay) = accepted_as_fd_10(&log, conn);
            // A read in the outer loop sets how far above its wait the
            // server reads.
            host.threads[0].stack.read(read_sp(0));
            // A script's nested loop waits: the input's turn is due there.
            enter_wait_at(&mut replay, &mut host, 1);
            assert_eq!(replay.unread(&host)[0], -1, "not reported");
            host.threads[0].running = true;
            replay.turn_returned(&mut host, 1, false);
            assert!(replay.describe().starts_with("started true"));
            let read = |replay: &mut Replay, host: &mut SimHost, depth: u32| {
                host.threads[0].stack.read(read_sp(depth));
                replay.serve(host, conn, false, &mut |b: &[u8]| b.len())
            };
            assert_eq!(read(&mut replay, &mut host, 1), Served::Empty);
            // More nested waits neither report it nor let the script's
            // loop read it.
            enter_wait_at(&mut replay, &mut host, 1);
            assert_eq!(replay.unread(&host)[0], -1);
            assert_eq!(read(&mut replay, &mut host, 1), Served::Empty);
            if outer_wait {
                // The script ended and the outer loop waits again.
                enter_wait_at(&mut replay, &mut host, 0);
                assert_eq!(replay.unread(&host)[0], 10, "reported to the outer loop");
            }
            assert_eq!(read(&mut replay, &mut host, 0), Served::Bytes(6));
        }
    }

    #[test]
    fn an_input_the_leader_read_after_clock_reads_waits_for_them() {
        let t = 1_700_000_000_000_000;
        for wait_instead in [false, true] {
            let mut log = SimLog::new("gate");
            let (_, conn) = log.append(&entry(Kind::Accept, 0, 0, 0, t), &[]);
            log.append(&entry(Kind::Time, 0, SAME_TURN, 0, t), &[]);
            log.append(&entry(Kind::Time, 2, 0, 1, t + 1_500), &[]);
            let mut ping = entry(Kind::Data, conn, SAME_TURN, 0, t + 1_000);
            ping.out_hash = OutputDigest::default().pack();
            log.append(&ping, b"PING\r\n");
            let (mut host, mut replay) = accepted_as_fd_10(&log, conn);
            // The next wait hands the input's turn over.
            enter_wait(&mut replay, &mut host);
            assert_eq!(replay.unread(&host)[0], 10, "reported at this wait");
            host.threads[0].running = true;
            replay.turn_returned(&mut host, 1, true);
            let read = |replay: &mut Replay, host: &mut SimHost| {
                replay.serve(host, conn, false, &mut |b: &[u8]| b.len())
            };
            assert_eq!(
                read(&mut replay, &mut host),
                Served::Empty,
                "not before the reads the leader made first"
            );
            if wait_instead {
                enter_wait(&mut replay, &mut host);
                assert_eq!(read(&mut replay, &mut host), Served::Bytes(6));
                continue;
            }
            for _ in 0..2 {
                let (at, now) = host.threads[0].clock.count_read().expect("in the turn");
                let us = replay
                    .time_lookup(&mut host, at, now)
                    .expect("the log says")
                    .0;
                host.finish_read(us);
            }
            assert_eq!(
                host.threads[0].clock.now(),
                t + 1_500,
                "read 2 reads the record"
            );
            assert_eq!(read(&mut replay, &mut host), Served::Bytes(6));
        }
    }
}
