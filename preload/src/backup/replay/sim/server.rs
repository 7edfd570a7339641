//! A model event-loop server: the same code runs on the leader and on each
//! backup, as an unmodified server does; only the calls it makes into its
//! operating system ([`Os`]) differ (the leader's preload logs, a backup's
//! replays).
//!
//! It keeps a small key-value store, answers each command at once, reads
//! its clock for every command (a busy command reads it many times while
//! it works, as a long script does) and runs a periodic timer. Everything
//! it does goes into its trace: two servers that did the same things in
//! the same order at the same times have equal traces.

use std::collections::BTreeMap;

/// How the server's event loop takes what its wait reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `epoll`, level-triggered: every ready event, in the wait's order
    /// (Redis).
    Epoll,
    /// `epoll`, one event per wait (beanstalkd).
    EpollOne,
    /// `epoll`, edge-triggered: a connection is reported when more comes,
    /// and the server reads it until EAGAIN.
    EpollEt,
    /// `poll`/`select`: every ready fd, in the server's own fd order.
    Scan,
}

impl Shape {
    /// The loop id the preload gives the server's loop (`loops`: an epoll
    /// instance has one; a scanning loop is loop 0).
    pub fn loop_id(self) -> u64 {
        match self {
            Shape::Epoll | Shape::EpollOne | Shape::EpollEt => 1,
            Shape::Scan => 0,
        }
    }
}

/// One run's server: its shape and habits (the same on every replica).
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    pub shape: Shape,
    /// The most events one wait returns (`EpollOne`: 1).
    pub maxevents: usize,
    /// It reads a ready connection once per event (Redis) rather than
    /// until EAGAIN (memcached).
    pub read_once: bool,
    /// Its timer runs, every `period` µs.
    pub timers: bool,
    pub period: u64,
    /// Its loop never blocks: every wait has a zero timeout (a server that
    /// polls its sockets while it does other work).
    pub spins: bool,
    /// A listener loop hands each connection to a worker loop through a
    /// pipe (memcached; see `Role`).
    pub two_loops: bool,
}

/// What a wait reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ready {
    /// The listener has connections to accept.
    Listener,
    /// A connection is readable.
    Conn(i32),
    /// The hand-over pipe from the listener's loop has connections for
    /// this worker (memcached's notify pipe).
    Pipe,
}

/// Which part of the server one event loop plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The whole server on one loop.
    Single,
    /// Accepts connections and hands each to the worker's loop; runs the
    /// timer (memcached's listener thread with its clock event).
    Listener,
    /// Serves the connections handed to it.
    Worker,
}

/// What a read got.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// These bytes.
    Bytes(Vec<u8>),
    /// The peer ended the connection.
    Eof,
    /// Nothing now (EAGAIN).
    Again,
}

/// The listener's fd (lowest: a scanning server looks at it first).
pub const LISTENER_FD: i32 = 3;

/// Where on its stack the model server waits when its loop runs `depth`
/// deep: a nested loop's frames lie 1.7 KiB below (as Redis's inside a
/// script).
pub fn wait_sp(depth: u32) -> u64 {
    (1 << 20) - 1_728 * u64::from(depth)
}

/// Where it reads in a loop `depth` deep: a little above that loop's wait.
pub fn read_sp(depth: u32) -> u64 {
    wait_sp(depth) + 300
}

/// What the server asks of its operating system.
pub trait Os {
    /// What its clock reads now, outside any counted read (for its wait's
    /// timeout).
    fn now(&self) -> u64;
    /// Waits (`timeout` µs; None: none): what is ready, or None once the
    /// run is over.
    fn wait(&mut self, timeout: Option<u64>) -> Option<Vec<Ready>>;
    /// Accepts a pending connection: its fd.
    fn accept(&mut self) -> Option<i32>;
    /// Reads what `fd` has.
    fn read(&mut self, fd: i32) -> Read;
    /// Writes `bytes` to `fd`: how many the socket took (the rest waits
    /// in the server for a later turn).
    fn write(&mut self, fd: i32, bytes: &[u8]) -> usize;
    /// Closes `fd`.
    fn close(&mut self, fd: i32);
    /// Reads the wall clock (µs).
    fn clock(&mut self) -> u64;
    /// Hands connection `fd` (accepted `id`th) to the worker's loop: a
    /// queue and a byte into the worker's pipe.
    fn hand_over(&mut self, _fd: i32, _id: u64) {
        unreachable!("one loop hands nothing over")
    }
    /// The worker reads its pipe: the connections handed to it, which it
    /// adds to its loop's interest.
    fn take_handed(&mut self) -> Vec<(i32, u64)> {
        unreachable!("one loop hands nothing over")
    }
    /// The server works for `us` without a syscall.
    fn busy(&mut self, us: u64);
    /// The server's loop runs nested `depth` deep (inside a script's
    /// command: 1), which its waits and reads show on its stack (see
    /// [`wait_sp`]).
    fn at_depth(&mut self, depth: u32);
}

/// One client connection.
struct Conn {
    /// The order it was accepted in (the same on every replica).
    id: u64,
    /// Bytes read that do not end a line yet.
    buf: Vec<u8>,
    /// Replies the socket did not take yet.
    out: Vec<u8>,
}

/// The model server.
pub struct Server {
    pub shape: Shape,
    /// The most events one wait returns (`maxevents`: 1 for `EpollOne`).
    pub maxevents: usize,
    /// Whether its timer runs.
    timers: bool,
    /// Whether its waits never block.
    spins: bool,
    conns: BTreeMap<i32, Conn>,
    accepted: u64,
    store: BTreeMap<String, String>,
    /// When the timer is due next (µs), and its period.
    due: u64,
    period: u64,
    /// What it did, in order.
    pub trace: Vec<String>,
    /// The connection whose script runs (its events are not watched
    /// meanwhile), and whether a `kill` stopped it.
    script: Option<i32>,
    killed: bool,
    /// It reads a ready connection once per event, as Redis does (else
    /// until EAGAIN, as memcached does); only such a server lets its loop
    /// run inside a long script.
    pub read_once: bool,
    /// The fired events of the waits so far, as one array (see `handle`).
    fired: Vec<Ready>,
    /// The part this loop plays.
    pub role: Role,
    /// Replies made so far.
    replies: u64,
    /// Whether its fired array keeps what older waits left past the last
    /// wait's events (`LOCKSTEP_SIM_STALE_FIRED`, see the module doc).
    stale_fired: bool,
}

impl Server {
    /// A server as `setup` says; it starts at clock value `start`.
    pub fn new(setup: &Setup, start: u64) -> Server {
        let Setup {
            shape,
            maxevents,
            read_once,
            timers,
            period: period_us,
            spins,
            two_loops: _,
        } = *setup;
        Server {
            shape,
            maxevents: match shape {
                Shape::EpollOne => 1,
                Shape::Epoll | Shape::EpollEt | Shape::Scan => maxevents,
            },
            timers,
            spins,
            conns: BTreeMap::new(),
            accepted: 0,
            store: BTreeMap::new(),
            due: start + period_us,
            period: period_us,
            trace: Vec::new(),
            script: None,
            killed: false,
            read_once,
            fired: Vec::new(),
            role: Role::Single,
            replies: 0,
            stale_fired: std::env::var_os("LOCKSTEP_SIM_STALE_FIRED").is_some(),
        }
    }

    /// One loop of a server whose listener hands connections to a worker:
    /// only the listener runs the timer.
    pub fn part(setup: &Setup, start: u64, role: Role) -> Server {
        let mut s = Server::new(setup, start);
        s.role = role;
        s.timers &= role != Role::Worker;
        s
    }

    /// The wait's timeout for a clock reading `now` (µs; None: none).
    pub fn timeout(&self, now: u64) -> Option<u64> {
        if self.spins {
            return Some(0);
        }
        self.timers.then(|| self.due.saturating_sub(now))
    }

    /// The event loop, until the run is over.
    pub fn run(&mut self, os: &mut dyn Os) {
        loop {
            let timeout = self.timeout(os.now());
            let Some(ready) = os.wait(timeout) else {
                return;
            };
            self.handle(os, &ready);
        }
    }

    /// Redis's `processEventsWhileBlocked`: up to four iterations of the
    /// loop, nested in the script, without blocking, while each handles
    /// something — an event, or replies the one before left to write (its
    /// `beforeSleep` writes them and counts them as events).
    fn while_blocked(&mut self, os: &mut dyn Os) {
        os.at_depth(1);
        let mut pending = false;
        for _ in 0..4 {
            let Some(ready) = os.wait(Some(0)) else {
                break;
            };
            let replies = self.replies;
            let events = self.handle(os, &ready) + usize::from(pending);
            pending = self.replies > replies;
            if events == 0 {
                break;
            }
        }
    }

    /// One loop iteration after a wait reported `ready`: how many events
    /// it handled.
    pub fn handle(&mut self, os: &mut dyn Os, ready: &[Ready]) -> usize {
        let mut ready = ready.to_vec();
        match self.shape {
            Shape::Epoll | Shape::EpollOne | Shape::EpollEt => ready.truncate(self.maxevents),
            Shape::Scan => ready.sort_by_key(|r| match r {
                Ready::Listener => LISTENER_FD,
                Ready::Conn(fd) => *fd,
                Ready::Pipe => LISTENER_FD - 1,
            }),
        }
        // A running script's own connection is not watched (Redis protects
        // it).
        ready.retain(|r| self.script.is_none_or(|fd| *r != Ready::Conn(fd)));
        // One array of fired events, as Redis's event loop has: a wait
        // inside a script's command overwrites its first entries, and once
        // the script ended the outer loop goes on up to its own wait's
        // count, over what the inner waits left there. Such a read runs
        // after the script's nested loop returned: the leader flags it
        // (`stack_depth`).
        let n = ready.len();
        if self.stale_fired {
            if self.fired.len() < n {
                self.fired.resize(n, Ready::Listener);
            }
            self.fired[..n].copy_from_slice(&ready);
        } else {
            self.fired = ready;
        }
        let mut j = 0;
        while j < n.min(self.fired.len()) {
            let r = self.fired[j];
            j += 1;
            match r {
                Ready::Listener => {
                    while let Some(fd) = os.accept() {
                        self.accepted += 1;
                        self.trace.push(format!("accept {}", self.accepted));
                        if self.role == Role::Listener {
                            os.hand_over(fd, self.accepted);
                        } else {
                            self.adopt(fd, self.accepted);
                        }
                    }
                }
                Ready::Pipe => {
                    // Not in the trace: where the pipe stands among a
                    // wait's events is the kernel's order, which no log
                    // records (a backup reports the log's connections
                    // first), and taking a connection is seen by nobody.
                    for (fd, id) in os.take_handed() {
                        self.adopt(fd, id);
                    }
                }
                Ready::Conn(fd) => self.serve(os, fd),
            }
        }
        // Replies a slow client's socket did not take go on each turn (a
        // reply sent over several turns).
        let pending: Vec<i32> = self
            .conns
            .iter()
            .filter(|(_, c)| !c.out.is_empty())
            .map(|(fd, _)| *fd)
            .collect();
        for fd in pending {
            self.flush(os, fd);
        }
        if self.timers && self.script.is_none() {
            let t = os.clock();
            if t >= self.due {
                self.trace.push(format!("timer at {t}"));
                self.due = t + self.period;
            }
        }
        n
    }

    /// Serves connection `fd`, the `id`th accepted.
    fn adopt(&mut self, fd: i32, id: u64) {
        self.conns.insert(
            fd,
            Conn {
                id,
                buf: Vec::new(),
                out: Vec::new(),
            },
        );
    }

    /// Reads `fd` until it has nothing more, answering each whole line.
    fn serve(&mut self, os: &mut dyn Os, fd: i32) {
        let during_script = self.script.is_some();
        loop {
            match os.read(fd) {
                Read::Again => return,
                Read::Eof => {
                    if let Some(c) = self.conns.remove(&fd) {
                        self.trace.push(format!("{} closed", c.id));
                    }
                    os.close(fd);
                    return;
                }
                Read::Bytes(bytes) => {
                    let Some(c) = self.conns.get_mut(&fd) else {
                        return;
                    };
                    c.buf.extend_from_slice(&bytes);
                    let id = c.id;
                    while let Some(end) = self
                        .conns
                        .get(&fd)
                        .and_then(|c| c.buf.iter().position(|b| *b == b'\n'))
                    {
                        let line: Vec<u8> = self
                            .conns
                            .get_mut(&fd)
                            .map(|c| c.buf.drain(..=end).collect())
                            .unwrap_or_default();
                        let line = String::from_utf8_lossy(&line[..end]).to_string();
                        let reply = if during_script {
                            self.while_busy(id, &line)
                        } else {
                            self.command(os, fd, id, &line)
                        };
                        if let Some(c) = self.conns.get_mut(&fd) {
                            c.out.extend_from_slice(reply.as_bytes());
                        }
                        self.replies += 1;
                        self.flush(os, fd);
                    }
                    if self.read_once {
                        return;
                    }
                }
            }
        }
    }

    /// Sends what the socket of `fd` takes of its pending replies.
    fn flush(&mut self, os: &mut dyn Os, fd: i32) {
        let Some(c) = self.conns.get_mut(&fd) else {
            return;
        };
        if c.out.is_empty() {
            return;
        }
        let n = os.write(fd, &c.out);
        c.out.drain(..n);
    }

    /// A command that comes while a script runs: only `kill` runs (it
    /// stops the script), the rest are refused.
    fn while_busy(&mut self, id: u64, line: &str) -> String {
        let reply = if line == "kill" {
            self.killed = true;
            "+killed\n".to_string()
        } else {
            "-busy\n".to_string()
        };
        self.trace
            .push(format!("{id} {line} while busy: {}", reply.trim_end()));
        reply
    }

    /// Runs one command of connection `id` (on `fd`): its reply.
    fn command(&mut self, os: &mut dyn Os, fd: i32, id: u64, line: &str) -> String {
        let mut words = line.split(' ');
        let t = os.clock();
        let reply = match (words.next(), words.next(), words.next()) {
            (Some("set"), Some(k), Some(v)) => {
                self.store.insert(k.to_string(), format!("{v}@{t}"));
                format!("+ok {t}\n")
            }
            (Some("get"), Some(k), None) => match self.store.get(k) {
                Some(v) => format!("${v}\n"),
                None => "$-\n".to_string(),
            },
            (Some("script"), Some(n), None) => {
                // A long script: it works, reads the clock, and every 2 ms
                // of it lets the event loop run once without blocking
                // (Redis's `processEventsWhileBlocked`), where a `kill`
                // can stop it.
                let n: u64 = n.parse().unwrap_or(0);
                self.script = Some(fd);
                let (mut last, mut polled, mut done) = (t, t, 0);
                while done < n && !self.killed {
                    os.busy(700);
                    last = os.clock();
                    done += 1;
                    if last >= polled + 2_000 {
                        polled = last;
                        if !self.read_once {
                            continue;
                        }
                        self.while_blocked(os);
                    }
                }
                self.script = None;
                os.at_depth(0);
                let killed = std::mem::take(&mut self.killed);
                format!("+script {done} {} killed {killed}\n", last - t)
            }
            (Some("big"), Some(n), None) => {
                let n: usize = n.parse().unwrap_or(0);
                format!("${}\n", "x".repeat(n * 1000))
            }
            (Some("busy"), Some(n), None) => {
                let n: u64 = n.parse().unwrap_or(0);
                let mut last = t;
                for _ in 0..n {
                    os.busy(700);
                    last = os.clock();
                }
                format!("+busy {}\n", last - t)
            }
            _ => format!("-what {t}\n"),
        };
        self.trace
            .push(format!("{id} {line} at {t}: {}", reply.trim_end()));
        reply
    }
}
