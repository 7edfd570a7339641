//! Shared code of the preload tests: region files for a 3-node cluster, a
//! test acker standing in for the follower processes, servers run under
//! the preload (killed on drop), small protocol clients and checks over the
//! recorded log.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lockstep_common::entry::{self, EntryHeader, Kind};
use lockstep_common::region::{self, Region, Role};
use lockstep_common::ring::{ReadOutcome, RingReader};
use lockstep_common::Config;
use lockstep_follower::io::feed::Feeder;

pub use crate::commit_mode::commit_mode;
use crate::poll::poll_until;
#[allow(unused_imports)]
pub use lockstep_common::resp::{command_bytes, Value};
use lockstep_launcher::cluster_spec::ClusterSpec;
#[allow(unused_imports)]
pub use lockstep_launcher::commands::memcached_command;
use lockstep_launcher::commands::under_preload;
#[allow(unused_imports)]
pub use lockstep_launcher::ports::free_port;
#[allow(unused_imports)]
pub use lockstep_launcher::resp::Resp;

/// Generous limit for anything a test waits for.
pub const LIMIT: Duration = Duration::from_secs(60);

/// `liblockstep.so` next to the test binary (target/debug), built with
/// `cargo build -p lockstep-preload` if it is missing.
pub fn preload_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .to_path_buf();
    let lib = dir.join("liblockstep.so");
    if !lib.exists() {
        static BUILD: Mutex<()> = Mutex::new(());
        let _g = BUILD.lock().unwrap_or_else(|p| p.into_inner());
        if !lib.exists() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let st = Command::new(cargo)
                .args(["build", "-p", "lockstep-preload"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("run cargo build -p lockstep-preload");
            assert!(st.success(), "cargo build -p lockstep-preload failed");
        }
    }
    assert!(
        lib.exists(),
        "{} missing: run `cargo build -p lockstep-preload` first",
        lib.display()
    );
    lib
}

/// Polls `cond` every 10 ms until it holds or `limit` passes.
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let holds = || cond().then_some(()).ok_or_else(String::new);
    if poll_until(limit, Duration::from_millis(10), holds).is_err() {
        panic!("timed out after {limit:?} waiting for {what}");
    }
}

/// How to set up a fixture.
#[derive(Clone, Debug)]
pub struct Options {
    /// `ring_size` in the config.
    pub ring_size: &'static str,
    /// `max_entry` in the config.
    pub max_entry: &'static str,
    /// `backup_clients` in the config.
    pub backup_clients: &'static str,
    /// `protocol` in the config.
    pub protocol: &'static str,
    /// Whether to create the region files (the follower's job).
    pub regions: bool,
    /// Role of node 1.
    pub role: Role,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ring_size: "1MiB",
            max_entry: "4KiB",
            backup_clients: "deny",
            protocol: "other",
            regions: true,
            role: Role::Leader,
        }
    }
}

/// A 3-node cluster config with node 1's app on a free port, and (unless
/// told otherwise) the three region files, node 1 leading view 1. Removes
/// everything it created when dropped.
pub struct Fixture {
    /// Cluster name (unique per test and process).
    pub name: String,
    /// Scratch directory (config, server logs, data).
    pub dir: PathBuf,
    /// The config file.
    pub config_path: PathBuf,
    /// The parsed config.
    pub config: Config,
    /// Regions of nodes 1..=3 (empty without region files).
    pub regions: Vec<Arc<Region>>,
    /// Node 1's follower lock (`Region::claim`, on an open of its own):
    /// the test plays that follower; dropping the lock plays its death.
    follower_lock: Mutex<Option<Region>>,
}

impl Fixture {
    /// A fixture named after `tag`.
    pub fn new(tag: &str, opts: Options) -> Fixture {
        let name = format!("pl-{tag}-{}", std::process::id());
        let dir = std::env::temp_dir().join(format!("lockstep-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let spec = ClusterSpec::new(&name, &dir.join("data"))
            .set("transport", "shm")
            .set("ring_size", opts.ring_size)
            .set("max_entry", opts.max_entry)
            .set("backup_clients", opts.backup_clients)
            .set("protocol", opts.protocol)
            .set_lines(&crate::commit_mode::commit_line())
            .loopback_nodes(3, false)
            .expect("free loopback ports");
        let config_path = dir.join("cluster.toml");
        spec.write(&config_path).expect("write config");
        let config = Config::load(&config_path).expect("valid test config");
        let mut f = Fixture {
            name,
            dir,
            config_path,
            config,
            regions: Vec::new(),
            follower_lock: Mutex::new(None),
        };
        if opts.regions {
            f.create_regions(opts.role);
        }
        f
    }

    /// Creates the three region files (the followers' job), node 1 in
    /// `role` of view 1 led by node 1, and takes node 1's follower lock.
    pub fn create_regions(&mut self, role: Role) {
        for id in 1..=3 {
            let spec = self.config.region_spec(id);
            let path = spec.default_path();
            let _ = std::fs::remove_file(&path);
            let r = Region::create(&path, &spec).expect("create region");
            r.set_view(1);
            r.set_leader(1);
            r.set_role(Role::Backup);
            self.regions.push(Arc::new(r));
        }
        let spec = self.config.region_spec(1);
        let lock = Region::open(&spec.default_path(), &spec).expect("open region");
        lock.claim().expect("claim node 1's region");
        *self.follower_lock.lock().unwrap() = Some(lock);
        self.set_role(role);
    }

    /// Plays the death of node 1's follower: its lock goes away.
    pub fn kill_follower(&self) {
        self.follower_lock.lock().unwrap().take();
    }

    /// Node `id`'s region.
    pub fn region(&self, id: u64) -> &Arc<Region> {
        &self.regions[id as usize - 1]
    }

    /// Sets node 1's role; a leader starts writing at seq 1, position 0.
    pub fn set_role(&self, role: Role) {
        let r = self.region(1);
        if role == Role::Leader {
            r.set_writer_start(1, 0);
        }
        r.set_role(role);
    }

    /// Node 1's app address.
    pub fn app(&self) -> SocketAddr {
        self.config.node(1).expect("node 1").app
    }

    /// Node 1's app port.
    pub fn port(&self) -> u16 {
        self.app().port()
    }

    /// Environment for a server under the preload as node 1.
    pub fn preload_env(&self, cmd: &mut Command) {
        under_preload(cmd, &preload_lib(), &self.config_path, 1)
            .env(
                "LOCKSTEP_LOG",
                format!("info:{}", self.dir.join("preload.log").display()),
            )
            .env_remove("LOCKSTEP_ALLOW_UNREPLICATED");
    }

    /// Starts `cmd` (`tag` names its output files) under the preload as
    /// node 1 and waits until the preload attached (at the server's
    /// listen: its pid is in the region before any client).
    pub fn spawn_attached(&self, mut cmd: Command, tag: &str) -> Server {
        self.preload_env(&mut cmd);
        let mut server = Server::spawn(cmd, self.port(), &self.dir, tag);
        wait_for("the preload to attach", LIMIT, || {
            server.assert_running();
            self.region(1).preload_pid() == server.pid() as u64
        });
        server
    }

    /// The preload's log file, for failure messages.
    pub fn preload_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("preload.log")).unwrap_or_default()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.regions.clear();
        for id in 1..=3 {
            let _ = std::fs::remove_file(region::region_path(&self.name, id));
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("preload test files kept in {}", self.dir.display());
        }
    }
}

/// One entry as the acker saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rec {
    /// Its header.
    pub header: EntryHeader,
    /// Its payload.
    pub payload: Vec<u8>,
}

#[derive(Default)]
struct Recorded {
    entries: Vec<Rec>,
    errors: Vec<String>,
}

/// Stands in for the three follower processes: reads node 1's ring and
/// the copies the preload posted into nodes 2 and 3, checks that the
/// copies are byte-identical, records the entries and then acks them for
/// all three nodes in node 1's region.
pub struct Acker {
    stop: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
    rec: Arc<Mutex<Recorded>>,
    thread: Option<JoinHandle<()>>,
}

impl Acker {
    /// Starts acking for `f`'s regions.
    pub fn start(f: &Fixture) -> Acker {
        let regions: Vec<Arc<Region>> = f.regions.clone();
        let size = f.config.ring_size;
        let max = f.config.max_entry;
        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(AtomicBool::new(false));
        let rec = Arc::new(Mutex::new(Recorded::default()));
        let (s, p, r) = (stop.clone(), paused.clone(), rec.clone());
        let thread = std::thread::spawn(move || ack_loop(&regions, size, max, &s, &p, &r));
        Acker {
            stop,
            paused,
            rec,
            thread: Some(thread),
        }
    }

    /// Stops or resumes acknowledging (entries are still read).
    pub fn pause(&self, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
    }

    /// The entries recorded so far.
    pub fn entries(&self) -> Vec<Rec> {
        self.rec.lock().unwrap().entries.clone()
    }

    /// Problems seen so far (copies that differ, corrupt or lapped rings).
    pub fn errors(&self) -> Vec<String> {
        self.rec.lock().unwrap().errors.clone()
    }

    /// Waits until every ACCEPT recorded has its CLOSE.
    pub fn wait_all_closed(&self, f: &Fixture) {
        let start = Instant::now();
        loop {
            let e = self.entries();
            let accepts = e.iter().filter(|r| r.header.kind == Kind::Accept).count();
            let closes = e.iter().filter(|r| r.header.kind == Kind::Close).count();
            if accepts == closes {
                return;
            }
            assert!(
                start.elapsed() < LIMIT,
                "{accepts} ACCEPTs but {closes} CLOSEs after {LIMIT:?}; errors {:?}\n{}",
                self.errors(),
                f.preload_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Acker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn ack_loop(
    regions: &[Arc<Region>],
    size: u64,
    max: u32,
    stop: &AtomicBool,
    paused: &AtomicBool,
    rec: &Mutex<Recorded>,
) {
    let mut readers: Vec<RingReader> = regions
        .iter()
        .map(|_| RingReader::new(size, 0, 1, max))
        .collect();
    let mut buf = Vec::new();
    let mut copy = Vec::new();
    let leader = &regions[0];
    let error = |msg: String| {
        let mut r = rec.lock().unwrap();
        if r.errors.len() < 100 {
            r.errors.push(msg);
        }
    };
    let mut pending_ack: Option<u64> = None;
    while !stop.load(Ordering::SeqCst) {
        if let Some(seq) = pending_ack {
            if paused.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            for id in 1..=regions.len() as u64 {
                leader.set_ack(id, seq);
            }
            pending_ack = None;
        }
        // The preload's posts ring the leader's post bell (its follower's).
        let seen = leader.post_bell().value();
        match readers[0].poll(leader.ring(), leader.tail(), &mut buf) {
            ReadOutcome::Entry { header, len, .. } => {
                let bytes = buf[..len].to_vec();
                let payload = match entry::decode(&bytes, max) {
                    Ok((_, p)) => p.to_vec(),
                    Err(e) => {
                        error(format!("seq {}: {e}", header.seq));
                        Vec::new()
                    }
                };
                // The same bytes must arrive in every peer's ring.
                for (k, r) in regions.iter().enumerate().skip(1) {
                    let start = Instant::now();
                    loop {
                        let peer_seen = r.bell().value();
                        match readers[k].poll(r.ring(), r.tail(), &mut copy) {
                            ReadOutcome::Entry { len: l, .. } => {
                                if copy[..l] != bytes[..] {
                                    error(format!(
                                        "node {} holds other bytes for seq {}",
                                        k + 1,
                                        header.seq
                                    ));
                                }
                                break;
                            }
                            ReadOutcome::Empty if start.elapsed() < Duration::from_secs(10) => {
                                r.bell().wait(peer_seen, Duration::from_millis(1));
                            }
                            other => {
                                error(format!("node {}: seq {}: {other:?}", k + 1, header.seq));
                                break;
                            }
                        }
                    }
                }
                rec.lock().unwrap().entries.push(Rec { header, payload });
                pending_ack = Some(header.seq);
            }
            ReadOutcome::Empty => leader.post_bell().wait(seen, Duration::from_millis(2)),
            other => {
                error(format!("node 1: {other:?}"));
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// What the recorded log says, after [`check_log`] found it well formed.
#[derive(Debug, Default)]
pub struct Summary {
    /// Concatenated DATA payloads per conn id.
    pub data: BTreeMap<u64, Vec<u8>>,
    /// Conn ids, in ACCEPT order.
    pub accepted: Vec<u64>,
    /// Conn ids that got a CLOSE.
    pub closed: Vec<u64>,
    /// Total DATA payload bytes.
    pub data_bytes: usize,
    /// DATA entries.
    pub data_entries: usize,
    /// DATA entries with a non-zero output digest.
    pub with_out_hash: usize,
    /// Longest DATA payload.
    pub longest: usize,
    /// TICK entries (event-loop turns without input that moved the clock).
    pub ticks: usize,
    /// TIME records of clock reads inside a turn, and of turns' ends.
    pub clock_records: usize,
    pub turn_ends: usize,
}

/// Checks the invariants of a leader's log: seqs 1.. without gaps in view
/// 1, DATA and CLOSE only on accepted, open connections, at most one CLOSE
/// each, (when `all_closed`) a CLOSE for every ACCEPT, and TICKs with a
/// time and no bytes.
pub fn check_log(entries: &[Rec], all_closed: bool) -> Summary {
    let mut s = Summary::default();
    let mut open = std::collections::BTreeSet::new();
    for (i, r) in entries.iter().enumerate() {
        let h = &r.header;
        assert_eq!(
            h.seq,
            i as u64 + 1,
            "seqs must be gap-free: entry {i} has seq {}",
            h.seq
        );
        assert_eq!(h.view, 1, "seq {}: view", h.seq);
        assert_eq!(h.len as usize, r.payload.len());
        match h.kind {
            Kind::Accept => {
                assert_eq!(h.conn, h.seq, "an ACCEPT's conn id is its seq");
                assert!(r.payload.is_empty());
                open.insert(h.conn);
                s.accepted.push(h.conn);
            }
            Kind::Data => {
                assert!(
                    open.contains(&h.conn),
                    "seq {}: DATA on conn {} that is not open",
                    h.seq,
                    h.conn
                );
                assert!(!r.payload.is_empty(), "seq {}: empty DATA", h.seq);
                s.data
                    .entry(h.conn)
                    .or_default()
                    .extend_from_slice(&r.payload);
                s.data_bytes += r.payload.len();
                s.data_entries += 1;
                s.longest = s.longest.max(r.payload.len());
                if h.out_hash != 0 {
                    s.with_out_hash += 1;
                }
            }
            Kind::Close => {
                assert!(
                    open.remove(&h.conn),
                    "seq {}: CLOSE of conn {} that is not open (never accepted, or closed twice)",
                    h.seq,
                    h.conn
                );
                s.closed.push(h.conn);
            }
            Kind::Tick => {
                assert!(
                    r.payload.is_empty(),
                    "seq {}: a TICK carries no bytes",
                    h.seq
                );
                assert_ne!(h.time_us, 0, "seq {}: a TICK carries its time", h.seq);
                s.ticks += 1;
            }
            Kind::Time => {
                // A poll for children that reaped one names it: fork
                // ordinal, pid and status (12 bytes).
                assert!(
                    r.payload.is_empty() || (r.payload.len() == 12 && h.conn != 0),
                    "seq {}: a TIME record carries no bytes, or a reaped child's 12",
                    h.seq
                );
                if h.conn == 0 {
                    s.turn_ends += 1;
                } else {
                    assert_ne!(
                        h.time_us, 0,
                        "seq {}: a clock record carries its time",
                        h.seq
                    );
                    s.clock_records += 1;
                }
            }
            other => panic!("seq {}: unexpected {other:?} entry from the preload", h.seq),
        }
    }
    if all_closed {
        assert!(open.is_empty(), "connections without CLOSE: {open:?}");
    }
    s
}

/// A server process under the preload; killed when dropped.
pub struct Server {
    child: Child,
    /// Its port.
    pub port: u16,
    out: PathBuf,
    err: PathBuf,
}

impl Server {
    /// Starts `cmd` with stdout/stderr in files of `dir` named after `tag`.
    pub fn spawn(mut cmd: Command, port: u16, dir: &Path, tag: &str) -> Server {
        let out = dir.join(format!("{tag}.stdout"));
        let err = dir.join(format!("{tag}.stderr"));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).expect("stdout file"))
            .stderr(std::fs::File::create(&err).expect("stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Server {
            child,
            port,
            out,
            err,
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it wrote to stdout and stderr.
    pub fn output(&self) -> String {
        format!(
            "--- stdout\n{}\n--- stderr\n{}",
            std::fs::read_to_string(&self.out).unwrap_or_default(),
            std::fs::read_to_string(&self.err).unwrap_or_default()
        )
    }

    /// What it wrote to stderr.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Panics (with its output) if it has exited.
    pub fn assert_running(&mut self) {
        if let Some(st) = self.child.try_wait().expect("try_wait") {
            panic!("server exited ({st})\n{}", self.output());
        }
    }

    /// Sends SIGTERM and panics (with its output) unless it exits.
    pub fn assert_stops_on_sigterm(&mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM");
        assert!(
            self.wait_exit(LIMIT).is_some(),
            "the server did not stop on SIGTERM\n{}",
            self.output()
        );
    }

    /// Waits up to `limit` for it to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return Some(st);
            }
            if start.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `redis-server` on `port` (loopback, no persistence) as a command.
pub fn redis_command(port: u16, dir: &Path) -> Command {
    lockstep_launcher::commands::redis_command(port, dir, &["--save", "", "--appendonly", "no"])
}

/// Runs a client program to completion, killing it after `limit`.
pub fn run_client(cmd: &mut Command, limit: Duration) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let pid = child.id() as libc::pid_t;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("client output"),
        Err(_) => {
            // SAFETY: kill(2) on the pid of our own, not yet reaped child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let out = rx.recv().expect("client thread").expect("client output");
            panic!(
                "{cmd:?} did not finish within {limit:?}\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// A TCP stream with generous timeouts.
pub fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    lockstep_launcher::resp::connect_stream(addr, Duration::from_secs(5), LIMIT)
}

/// What a client of a refusing backup reads: connects, sends `request`
/// (when not empty), reads until the connection ends. Returns the bytes
/// read and whether it ended with a clean EOF (false: an error or a
/// timeout after them).
pub fn refusal(addr: SocketAddr, request: &[u8]) -> (Vec<u8>, bool) {
    let mut s = connect(addr).expect("connect to the backup");
    if !request.is_empty() {
        let _ = std::io::Write::write_all(&mut s, request);
    }
    let mut got = Vec::new();
    let mut b = [0u8; 256];
    loop {
        match s.read(&mut b) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(_) => return (got, false),
        }
    }
}

/// Whether the peer ended the connection: a read returns EOF or an error
/// other than a timeout within `limit`.
pub fn is_closed_by_peer(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).expect("timeout");
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
    }
}

/// Plays the follower's part for a backup's server: writes committed
/// entries into node 1's apply ring with the follower's own writer
/// ([`Feeder`]).
pub struct ApplyFeed {
    region: Arc<Region>,
    feeder: Feeder,
    max_entry: usize,
}

impl ApplyFeed {
    /// Starts a new apply stream at `first` (the seq of its first entry).
    pub fn start(f: &Fixture, first: u64) -> ApplyFeed {
        let region = f.region(1).clone();
        let max_entry = Config::load(&f.config_path).expect("config").max_entry;
        ApplyFeed {
            feeder: Feeder::start(region.clone(), first, max_entry),
            region,
            max_entry: max_entry as usize,
        }
    }

    /// Appends one committed input (DATA longer than `max_entry` as several
    /// entries, as the leader splits it) and publishes it; `after` is the
    /// output the server is expected to have written since the
    /// connection's last input (None: not checked). Returns the seq of its
    /// first entry (an ACCEPT's conn id).
    pub fn entry(&mut self, kind: Kind, conn: u64, after: Option<&[u8]>, payload: &[u8]) -> u64 {
        let first = self.feeder.next();
        let mut chunks = payload.chunks(self.max_entry.max(1)).peekable();
        if chunks.peek().is_none() {
            return self.one(kind, conn, after, &[]);
        }
        // Only the first chunk of a read carries the digest, as on the
        // leader.
        let mut after = after;
        for c in chunks {
            self.one(kind, conn, after.take(), c);
        }
        first
    }

    fn one(&mut self, kind: Kind, conn: u64, after: Option<&[u8]>, payload: &[u8]) -> u64 {
        let seq = self.feeder.next();
        let conn = if kind == Kind::Accept { seq } else { conn };
        let mut h = EntryHeader::new(kind, 1, seq, conn, payload.len() as u32);
        if let Some(out) = after {
            let mut d = entry::OutputDigest::default();
            d.update(out);
            h.out_hash = d.pack();
        }
        assert!(
            self.feeder.feed(&h, payload).expect("apply ring"),
            "apply ring full"
        );
        self.feeder.publish();
        seq
    }

    /// Waits until the server consumed everything fed.
    pub fn wait_applied(&self, server: &mut Server) {
        wait_for("the server to consume the fed entries", LIMIT, || {
            server.assert_running();
            self.region.apply().applied() + 1 >= self.feeder.next()
        });
    }

    /// Divergent entries the preload counted.
    pub fn diverged(&self) -> u64 {
        self.region.apply().diverged()
    }

    /// Replays one connection that sends each of `inputs` and expects the
    /// matching reply, then closes; waits until the server consumed it and
    /// returns how many replies differed.
    pub fn session(&mut self, server: &mut Server, exchange: &[(&[u8], &[u8])]) -> u64 {
        let before = self.diverged();
        let conn = self.entry(Kind::Accept, 0, None, &[]);
        let mut prev: Option<&[u8]> = None;
        for (input, reply) in exchange {
            self.entry(Kind::Data, conn, prev, input);
            prev = Some(reply);
        }
        self.entry(Kind::Close, conn, prev, &[]);
        self.wait_applied(server);
        self.diverged() - before
    }
}

/// Connects and pings until Redis answers (it may still be starting).
pub fn redis_ready(addr: SocketAddr, server: &mut Server) {
    let start = Instant::now();
    loop {
        server.assert_running();
        if let Ok(mut r) = Resp::connect(addr) {
            if r.cmd(&[b"PING"]).ok() == Some(Value::Simple("PONG".into())) {
                return;
            }
        }
        assert!(
            start.elapsed() < LIMIT,
            "redis did not answer PING\n{}",
            server.output()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A field of `INFO` output.
pub fn info_field(addr: SocketAddr, section: &str, field: &str) -> String {
    let mut r = Resp::connect(addr).expect("connect for INFO");
    let Value::Bulk(text) = r.cmd(&[b"INFO", section.as_bytes()]).expect("INFO") else {
        panic!("INFO reply");
    };
    let text = String::from_utf8_lossy(&text).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO {section}:\n{text}"))
        .trim()
        .to_string()
}

/// Parses RESP commands (arrays of bulk strings) from `bytes`; panics on
/// anything else or on a trailing partial command.
pub fn parse_resp_commands(bytes: &[u8]) -> Vec<Vec<Vec<u8>>> {
    fn line(b: &[u8], at: &mut usize) -> Option<String> {
        let rest = &b[*at..];
        let end = rest.windows(2).position(|w| w == b"\r\n")?;
        let s = String::from_utf8_lossy(&rest[..end]).into_owned();
        *at += end + 2;
        Some(s)
    }
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let head = line(bytes, &mut at).expect("complete command header");
        let n: usize = head
            .strip_prefix('*')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("not a RESP array: {head:?} at byte {at}"));
        let mut args = Vec::with_capacity(n);
        for _ in 0..n {
            let h = line(bytes, &mut at).expect("complete bulk header");
            let len: usize = h
                .strip_prefix('$')
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("not a bulk string: {h:?}"));
            assert!(at + len + 2 <= bytes.len(), "truncated bulk string");
            args.push(bytes[at..at + len].to_vec());
            assert_eq!(&bytes[at + len..at + len + 2], b"\r\n");
            at += len + 2;
        }
        out.push(args);
    }
    out
}
