//! The leader: the model server under the leader's preload rules, fed by
//! scripted clients in simulated real time. Each rule it applies is the
//! preload's own code (`ThreadClock`, `TurnMarks`, `AppendTags`,
//! `turn_time::leader_value`, the engine's chunking, the real writer);
//! only the order `dispatch::before_wait` and `Engine::append` call them in
//! is restated here, each step naming its source.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::AtomicU64;

use lockstep_common::entry::{Kind, OutputDigest};

use super::log::{SimLog, MAX_ENTRY};
use super::server::{read_sp, wait_sp, Os, Read, Ready, Role, Server, Setup, Shape, LISTENER_FD};
use crate::determinism::clock::ORIGIN_US;
use crate::determinism::stack_depth::StackMarks;
use crate::determinism::thread_clock::ThreadClock;
use crate::determinism::turn_time::leader_value;
use crate::determinism::turns::TurnMarks;
use crate::leader::entry_tags::{turn_end, AppendTags};
use lockstep_launcher::rng::Rng;

/// The real time the run starts at (µs since the epoch).
pub const START_US: u64 = 1_700_000_000_000_000;

/// One scripted client: when it connects, what it sends when, whether it
/// hangs up after.
#[derive(Clone, Debug)]
pub struct Client {
    pub at: u64,
    pub sends: Vec<(u64, Vec<u8>)>,
    pub hangs_up: bool,
}

/// Random clients: a few, each sending a few lines (some split in two
/// sends), some hanging up.
pub fn clients(rng: &mut Rng) -> Vec<Client> {
    let n = 1 + rng.below(6);
    (0..n)
        .map(|_| {
            let mut t = START_US + rng.below(20_000);
            let at = t;
            let mut sends = Vec::new();
            for _ in 0..1 + rng.below(5) {
                let mut line = String::new();
                for _ in 0..1 + rng.below(3) {
                    let key = (b'a' + rng.below(4) as u8) as char;
                    let cmd = match rng.below(24) {
                        0..=8 => format!("set {key} {}", rng.below(1000)),
                        9..=17 => format!("get {key}"),
                        18 => format!("busy {}", 1 + rng.below(6)),
                        19 => format!("big {}", 1 + rng.below(20)),
                        20 => format!("script {}", 2 + rng.below(12)),
                        21 => "kill".to_string(),
                        _ => "what".to_string(),
                    };
                    line.push_str(&cmd);
                    line.push('\n');
                }
                t += rng.below(3_000);
                let bytes = line.into_bytes();
                if bytes.len() > 2 && rng.percent(20) {
                    let cut = 1 + rng.below(bytes.len() as u64 - 1) as usize;
                    sends.push((t, bytes[..cut].to_vec()));
                    t += rng.below(2_000);
                    sends.push((t, bytes[cut..].to_vec()));
                } else {
                    sends.push((t, bytes));
                }
            }
            Client {
                at,
                sends,
                hangs_up: rng.percent(60),
            }
        })
        .collect()
}

/// A client's connection on the leader.
struct LeaderConn {
    client: usize,
    /// Its ACCEPT's seq (the log's name for it).
    conn: u64,
    /// Sends it read so far.
    read: usize,
    /// Output since its last logged input.
    out: OutputDigest,
    eof_read: bool,
    /// Edge-triggered: the sends that had arrived when it was last
    /// reported, and whether its end was.
    edge_seen: usize,
    eof_edge: bool,
    /// What its socket takes until the client reads again (see
    /// `kernel_wait`).
    room: usize,
    /// The thread whose loop watches it (None: handed over, not taken
    /// yet).
    watcher: Option<usize>,
}

/// One loop thread of the leader's server, as the preload keeps it: its
/// clock, its turn marks and the waits it entered (`turns::enter_wait`).
struct LeaderThread {
    clock: ThreadClock,
    marks: TurnMarks,
    stack: StackMarks,
    waits: u64,
    /// Its loop (`loops`), and when its wait times out (µs, real time).
    loop_id: u64,
    deadline: u64,
}

impl LeaderThread {
    fn new(loop_id: u64) -> LeaderThread {
        LeaderThread {
            clock: ThreadClock::NEW,
            marks: TurnMarks::NEW,
            stack: StackMarks::NEW,
            waits: 0,
            loop_id,
            deadline: u64::MAX,
        }
    }
}

/// The leader's operating system: simulated sockets and real time, with
/// the preload's logging in between.
struct LeaderOs<'a> {
    rng: &'a mut Rng,
    log: &'a mut SimLog,
    clients: &'a [Client],
    real: u64,
    log_time: AtomicU64,
    /// The server's loop threads, and the one running now (turns run one
    /// at a time: `turn_lock`).
    threads: Vec<LeaderThread>,
    cur: usize,
    /// Connections the listener handed to the worker, not taken yet.
    handed: VecDeque<(i32, u64)>,
    /// How deep the server's loop runs now, and whether the read being
    /// logged ran further out than its wait (`stack_depth`).
    depth: u32,
    returned: bool,
    /// The (thread, wait count) of the last entry's turn (`Engine`'s
    /// `w.turn`), and whether the last logged turn's end is not logged yet
    /// (`w.open`).
    writer_turn: Option<(usize, u64)>,
    open: bool,
    accepted: Vec<bool>,
    conns: BTreeMap<i32, LeaderConn>,
    next_fd: i32,
    /// Scratch for the engine's chunking.
    gather: Vec<u8>,
    shape: Shape,
    maxevents: usize,
    /// Whether the server's waits never block.
    spins: bool,
    /// Waits so far (a bound against a spinning server).
    turns: u64,
}

impl LeaderOs<'_> {
    /// The running thread.
    fn th(&mut self) -> &mut LeaderThread {
        &mut self.threads[self.cur]
    }

    /// `Engine::append`: one input (or tick, or clock record) into the log.
    fn append(
        &mut self,
        kind: Kind,
        conn: u64,
        out_hash: u64,
        payload: &[u8],
        time: Option<u64>,
    ) -> u64 {
        let view = self.log.view();
        let cur = self.cur;
        let th = &mut self.threads[cur];
        let time_us = time.unwrap_or_else(|| th.clock.entry_time(&self.log_time, self.real));
        // `turns::current()`: the thread's slot and waits.
        let here = (th.waits > 0).then_some((cur, th.waits));
        let turn_loop = th.clock.turn_loop();
        let (marks, waits) = (&mut th.marks, th.waits);
        let mut tags = AppendTags::new(
            kind,
            view,
            conn,
            out_hash,
            time_us,
            here,
            &mut self.writer_turn,
            turn_loop,
            || marks.log_turn(view, waits),
        )
        .returned(self.returned && matches!(kind, Kind::Data | Kind::Close));
        let mut first = None;
        let log = &mut *self.log;
        let mut one = |payload: &[u8]| {
            let (_, conn) = log.append(tags.entry(), payload);
            first.get_or_insert(conn);
            Ok(())
        };
        if kind == Kind::Data {
            crate::leader::engine::for_each_chunk(
                &[payload],
                payload.len(),
                MAX_ENTRY,
                &mut self.gather,
                &mut one,
            )
            .expect("chunks");
        } else {
            one(payload).expect("one entry");
        }
        self.open = kind != Kind::Tick;
        if matches!(kind, Kind::Accept | Kind::Data | Kind::Close) {
            self.th().clock.input_logged();
        }
        first.unwrap_or(0)
    }

    /// `Engine::close_turn`: the loop is about to block with its last
    /// logged turn's end not in the log.
    fn close_turn(&mut self) {
        if !self.open {
            return;
        }
        let time_us = match self.th().clock.now() {
            0 => ORIGIN_US,
            t => t,
        };
        let fields = turn_end(self.log.view(), time_us, self.th().clock.turn_loop());
        self.log.append(&fields, &[]);
        self.open = false;
    }

    /// `dispatch::before_wait`: the turn's TICK when it owes one, then the
    /// wait counts and the turn's reads end.
    fn before_wait(&mut self, shape: Shape) {
        if let Some((t, loop_id)) = self.th().clock.take_unlogged() {
            self.append(Kind::Tick, loop_id, 0, &[], Some(t));
        }
        let sp = wait_sp(self.depth);
        self.th().stack.waited(sp);
        self.th().waits += 1;
        self.th().clock.leave_turn();
        if shape == Shape::Scan {
            // Only an epoll wait probes first (`closing_probe`).
            self.close_turn();
        }
    }

    /// A thread of a server with two loops enters its wait (`timeout` µs;
    /// None: none): it closes the log's turn when it is about to block.
    fn enter_wait(&mut self, timeout: Option<u64>) {
        self.before_wait(self.shape);
        let real = self.real;
        self.th().deadline = timeout.map_or(u64::MAX, |t| real + t);
        if self.ready().is_empty() && timeout != Some(0) {
            self.close_turn();
        }
    }

    /// What is ready now, in the kernel's order: the listener, then the
    /// connections in the order their data arrived (here: fd order).
    fn ready(&self) -> Vec<Ready> {
        let mut r = Vec::new();
        if self.cur == 0
            && self
                .clients
                .iter()
                .zip(&self.accepted)
                .any(|(c, a)| !a && c.at <= self.real)
        {
            r.push(Ready::Listener);
        }
        if self.cur == 1 && !self.handed.is_empty() {
            r.push(Ready::Pipe);
        }
        for (fd, c) in &self.conns {
            if c.watcher != Some(self.cur) {
                continue;
            }
            let client = &self.clients[c.client];
            let (data, ended) = if self.shape == Shape::EpollEt {
                // Only what came since it was last reported.
                (
                    self.arrived(c) > c.edge_seen,
                    client.hangs_up && self.arrived(c) == client.sends.len() && !c.eof_edge,
                )
            } else {
                (
                    client
                        .sends
                        .get(c.read)
                        .is_some_and(|(t, _)| *t <= self.real),
                    c.read == client.sends.len() && client.hangs_up && !c.eof_read,
                )
            };
            if data || ended {
                r.push(Ready::Conn(*fd));
            }
        }
        r
    }

    /// How many of `c`'s sends have arrived.
    fn arrived(&self, c: &LeaderConn) -> usize {
        let client = &self.clients[c.client];
        client
            .sends
            .iter()
            .take_while(|(t, _)| *t <= self.real)
            .count()
    }

    /// The wait reports `ready` (at most `maxevents` of them): an
    /// edge-triggered one will not report them again until more comes.
    fn report(&mut self, mut ready: Vec<Ready>) -> Vec<Ready> {
        if self.shape != Shape::Scan {
            ready.truncate(self.maxevents);
        }
        if self.shape == Shape::EpollEt {
            for r in &ready {
                if let Ready::Conn(fd) = r {
                    let Some(c) = self.conns.get(fd) else {
                        continue;
                    };
                    let n = self.arrived(c);
                    let all = n == self.clients[c.client].sends.len();
                    if let Some(c) = self.conns.get_mut(fd) {
                        c.edge_seen = n;
                        c.eof_edge |= all && self.clients[c.client].hangs_up;
                    }
                }
            }
        }
        ready
    }

    /// The next moment something arrives (None: nothing will).
    fn next_arrival(&self) -> Option<u64> {
        let accepts = self
            .clients
            .iter()
            .zip(&self.accepted)
            .filter(|(_, a)| !**a)
            .map(|(c, _)| c.at);
        let sends = self
            .conns
            .values()
            .filter_map(|c| self.clients[c.client].sends.get(c.read).map(|(t, _)| *t));
        accepts.chain(sends).min()
    }

    /// The wait (`timeout` µs; None: none) with the preload's hooks around
    /// it: what it reports, or None once every client is done and the
    /// server would block for good (the run is over).
    fn event_wait(&mut self, timeout: Option<u64>) -> Option<Vec<Ready>> {
        self.before_wait(self.shape);
        let all_done = self.accepted.iter().all(|a| *a)
            && self.ready().is_empty()
            && self.next_arrival().is_none();
        // A spinning server's run is over there too (its waits never
        // block, so this is where it would idle).
        if all_done && (timeout != Some(0) || self.spins) {
            self.close_turn();
            return None;
        }
        self.turns += 1;
        assert!(self.turns < 1_000_000, "the leader spins");
        let ready = self.kernel_wait(timeout)?;
        // `dispatch::after_wait`: the loop's turn starts.
        let real = self.real;
        let th = &mut self.threads[self.cur];
        let loop_id = th.loop_id;
        th.clock.turn_starts(&self.log_time, real, loop_id);
        Some(ready)
    }

    /// The kernel's wait: what is ready, after blocking (the real time
    /// moves on) when nothing is and `timeout` allows.
    fn kernel_wait(&mut self, timeout: Option<u64>) -> Option<Vec<Ready>> {
        let mut ready = self.ready();
        if ready.is_empty() && timeout != Some(0) {
            // About to block: the log must say where the turn ends.
            self.close_turn();
            let until = match (self.next_arrival(), timeout.map(|t| self.real + t)) {
                (Some(a), Some(t)) => a.min(t),
                (Some(a), None) => a,
                (None, Some(t)) => t,
                (None, None) => return None,
            };
            self.real = self.real.max(until);
            ready = self.ready();
        }
        self.returns();
        Some(self.report(ready))
    }

    /// A wait returns: a little real time passed, and each client read
    /// some (or all) of what was sent to it.
    fn returns(&mut self) {
        self.real += self.rng.below(400);
        for c in self.conns.values_mut() {
            c.room = if self.rng.percent(70) {
                usize::MAX
            } else {
                self.rng.below(3_000) as usize
            };
        }
    }

    /// Every client connected and nothing more will arrive (asked when no
    /// loop has anything ready: nothing is left to read or take either).
    fn all_done(&self) -> bool {
        self.accepted.iter().all(|a| *a) && self.next_arrival().is_none()
    }
}

impl LeaderOs<'_> {
    /// A read of `fd` as the leader's read hook logs it.
    fn read_logged(&mut self, fd: i32) -> Read {
        let real = self.real;
        let Some(c) = self.conns.get_mut(&fd) else {
            return Read::Again;
        };
        let client = &self.clients[c.client];
        let mut bytes = Vec::new();
        while let Some((_, b)) = client.sends.get(c.read).filter(|(t, _)| *t <= real) {
            bytes.extend_from_slice(b);
            c.read += 1;
        }
        let conn = c.conn;
        if !bytes.is_empty() {
            let digest = std::mem::take(&mut c.out).pack();
            self.append(Kind::Data, conn, digest, &bytes, None);
            return Read::Bytes(bytes);
        }
        if c.read == client.sends.len() && client.hangs_up && !c.eof_read {
            c.eof_read = true;
            let digest = std::mem::take(&mut c.out).pack();
            self.append(Kind::Close, conn, digest, &[], None);
            return Read::Eof;
        }
        Read::Again
    }
}

impl Os for LeaderOs<'_> {
    fn now(&self) -> u64 {
        match self.threads[self.cur].clock.now() {
            0 => ORIGIN_US,
            t => t,
        }
    }

    fn wait(&mut self, timeout: Option<u64>) -> Option<Vec<Ready>> {
        self.event_wait(timeout)
    }

    fn accept(&mut self) -> Option<i32> {
        let i = (0..self.clients.len())
            .find(|&i| !self.accepted[i] && self.clients[i].at <= self.real)?;
        self.accepted[i] = true;
        let conn = self.append(Kind::Accept, 0, 0, &[], None);
        let fd = self.next_fd;
        self.next_fd += 1;
        self.conns.insert(
            fd,
            LeaderConn {
                client: i,
                conn,
                read: 0,
                out: OutputDigest::default(),
                eof_read: false,
                edge_seen: 0,
                eof_edge: false,
                room: usize::MAX,
                watcher: Some(self.cur),
            },
        );
        Some(fd)
    }

    fn hand_over(&mut self, fd: i32, id: u64) {
        if let Some(c) = self.conns.get_mut(&fd) {
            c.watcher = None;
        }
        self.handed.push_back((fd, id));
    }

    fn take_handed(&mut self) -> Vec<(i32, u64)> {
        let taken: Vec<(i32, u64)> = self.handed.drain(..).collect();
        for (fd, _) in &taken {
            if let Some(c) = self.conns.get_mut(fd) {
                c.watcher = Some(self.cur);
            }
        }
        taken
    }

    fn read(&mut self, fd: i32) -> Read {
        let sp = read_sp(self.depth);
        self.returned = self.th().stack.read(sp);
        let read = self.read_logged(fd);
        self.returned = false;
        read
    }

    fn at_depth(&mut self, depth: u32) {
        self.depth = depth;
    }

    fn write(&mut self, fd: i32, bytes: &[u8]) -> usize {
        let Some(c) = self.conns.get_mut(&fd) else {
            return bytes.len();
        };
        // A slow client's socket takes what room it has this turn.
        let n = bytes.len().min(c.room);
        c.room -= n;
        c.out.update(&bytes[..n]);
        n
    }

    fn close(&mut self, fd: i32) {
        self.conns.remove(&fd);
    }

    /// `turn_reads::read` on the leader.
    fn clock(&mut self) -> u64 {
        let Some((reads, now)) = self.th().clock.count_read() else {
            return match self.th().clock.now() {
                0 => ORIGIN_US,
                t => t,
            };
        };
        let (us, logs) = leader_value(self.real, now);
        let th = &mut self.threads[self.cur];
        let us = th.clock.finish_read(&self.log_time, us);
        if logs {
            self.append(Kind::Time, u64::from(reads.count), 0, &[], Some(us));
            self.th().clock.record_logged();
        }
        us
    }

    fn busy(&mut self, us: u64) {
        self.real += us;
    }
}

/// Runs the leader's server until its clients are done and its loop
/// blocks with nothing more to come: its trace.
pub fn run(rng: &mut Rng, setup: &Setup, clients: &[Client], log: &mut SimLog) -> Vec<String> {
    let mut server = Server::new(setup, ORIGIN_US);
    let mut os = leader_os(rng, setup, clients, log, server.maxevents);
    server.run(&mut os);
    server.trace
}

/// Runs a server whose listener loop (loop 1, with the timer) hands each
/// connection to a worker loop (loop 2) through a pipe, as memcached does,
/// until its clients are done and both loops block with nothing more to
/// come: what both loops did, in the order they did it (the turn lock runs
/// one loop's turn at a time).
pub fn run_two_loops(
    rng: &mut Rng,
    setup: &Setup,
    clients: &[Client],
    log: &mut SimLog,
) -> Vec<String> {
    let mut servers = [
        Server::part(setup, ORIGIN_US, Role::Listener),
        Server::part(setup, ORIGIN_US, Role::Worker),
    ];
    let mut os = leader_os(rng, setup, clients, log, servers[0].maxevents);
    os.threads = vec![LeaderThread::new(1), LeaderThread::new(2)];
    let mut trace = Vec::new();
    for (t, server) in servers.iter().enumerate() {
        os.cur = t;
        let timeout = server.timeout(os.now());
        os.enter_wait(timeout);
    }
    loop {
        os.turns += 1;
        assert!(os.turns < 1_000_000, "the leader spins");
        let ready: Vec<usize> = (0..2)
            .filter(|&t| {
                os.cur = t;
                !os.ready().is_empty() || os.threads[t].deadline <= os.real
            })
            .collect();
        let Some(&t) = ready.get(os.rng.below(ready.len().max(1) as u64) as usize) else {
            if os.all_done() {
                break;
            }
            // Both loops block: the world moves on to the next arrival or
            // timeout.
            let deadline = os.threads.iter().map(|t| t.deadline).min();
            let until = os.next_arrival().into_iter().chain(deadline).min();
            os.real = os.real.max(until.unwrap_or(u64::MAX));
            continue;
        };
        os.cur = t;
        let ready = os.ready();
        os.returns();
        let ready = os.report(ready);
        // `dispatch::after_wait`: this loop's turn starts.
        let (real, th) = (os.real, &mut os.threads[t]);
        th.clock.turn_starts(&os.log_time, real, th.loop_id);
        servers[t].handle(&mut os, &ready);
        let who = ["listener", "worker"][t];
        trace.extend(servers[t].trace.drain(..).map(|l| format!("{who}: {l}")));
        let timeout = servers[t].timeout(os.now());
        os.enter_wait(timeout);
    }
    trace
}

/// The leader's world before the server starts.
fn leader_os<'a>(
    rng: &'a mut Rng,
    setup: &Setup,
    clients: &'a [Client],
    log: &'a mut SimLog,
    maxevents: usize,
) -> LeaderOs<'a> {
    let shape = setup.shape;
    LeaderOs {
        rng,
        log,
        clients,
        real: START_US,
        log_time: AtomicU64::new(0),
        threads: vec![LeaderThread::new(shape.loop_id())],
        cur: 0,
        handed: VecDeque::new(),
        depth: 0,
        returned: false,
        writer_turn: None,
        open: false,
        accepted: vec![false; clients.len()],
        conns: BTreeMap::new(),
        next_fd: LISTENER_FD + 1,
        gather: vec![0; MAX_ENTRY],
        shape,
        maxevents,
        spins: setup.spins,
        turns: 0,
    }
}
