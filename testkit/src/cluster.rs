//! A test harness for whole clusters on this machine: writes a config with
//! free loopback ports, starts real follower processes and real servers
//! under the preload, and stops everything (and removes region files and
//! data) when dropped — also when a test fails.

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use crate::commit_mode::{commit_line, commit_mode};
use crate::poll::poll_until;
#[allow(unused_imports)]
pub use lockstep_common::resp::{command_bytes, Value};
use lockstep_launcher::binaries::Binaries;
use lockstep_launcher::cluster_spec::{ClusterSpec, ElectionSpec, NodeSpec};
use lockstep_launcher::commands::{
    follower_command, memcached_command, preloaded_server, redis_command, under_preload,
};
#[allow(unused_imports)]
pub use lockstep_launcher::leader::{find_leader, leading};
#[allow(unused_imports)]
pub use lockstep_launcher::memcache::{McItem, Memcache};
#[allow(unused_imports)]
pub use lockstep_launcher::ports::free_port;
#[allow(unused_imports)]
pub use lockstep_launcher::process::processes_mentioning;
use lockstep_launcher::process::{
    kill_and_reap, kill_launched_and_reap, open_log, spawn_logged, Grouping,
};
#[allow(unused_imports)]
pub use lockstep_launcher::resp::Resp;
#[allow(unused_imports)]
pub use lockstep_launcher::zookeeper::{
    is_serving as zookeeper_serving, srvr as zookeeper_srvr, ZookeeperEnsemble, ZookeeperServer,
};

use lockstep_common::control::NodeStatus;

/// The programs of this build (`lockstep`, the follower, the preload).
pub fn binaries() -> Binaries {
    Binaries::of_test_build().unwrap_or_else(|e| panic!("{e:#}"))
}

/// Directory holding the built binaries (target/debug).
pub fn bin_dir() -> PathBuf {
    binaries().dir().to_path_buf()
}

/// What kind of server each node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    /// redis-server.
    Redis,
    /// memcached -t 1.
    Memcached,
}

/// A running test cluster.
pub struct TestCluster {
    /// Cluster name (unique per test).
    pub name: String,
    /// Temp directory with config, data and logs.
    pub dir: PathBuf,
    /// Config file path.
    pub config_path: PathBuf,
    /// Nodes.
    pub nodes: Vec<NodeSpec>,
    /// What the config file holds (changed and rewritten before the nodes
    /// start, e.g. by `use_zookeeper`).
    spec: ClusterSpec,
    server: Server,
    followers: Vec<Option<Child>>,
    servers: Vec<Option<Child>>,
    /// Servers a follower restored from a snapshot (not our children).
    restored: Vec<Option<u32>>,
    bins: Binaries,
    /// Set by `use_server_command`: replaces `server`.
    command: Option<Vec<String>>,
    /// Extra environment of one node's follower (`follower_env`).
    follower_env: Vec<(u64, String, String)>,
}

/// Options for a test cluster.
pub struct Options {
    /// Node count.
    pub nodes: usize,
    /// Transport name.
    pub transport: &'static str,
    /// Ring size string.
    pub ring_size: &'static str,
    /// Which server.
    pub server: Server,
    /// Extra top-level TOML lines.
    pub extra: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 3,
            transport: "shm",
            ring_size: "8MiB",
            server: Server::Redis,
            extra: String::new(),
        }
    }
}

impl TestCluster {
    /// Writes the config; starts nothing yet.
    pub fn new(test: &str, opts: Options) -> TestCluster {
        let name = format!("t{}-{}", std::process::id(), test);
        let dir = std::env::temp_dir().join(format!("lockstep-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let spec = ClusterSpec::new(&name, &dir.join("data"))
            .set("transport", opts.transport)
            .set("ring_size", opts.ring_size)
            .set("backup_clients", "allow")
            .set("key", "test-cluster-key-0123456789")
            .set_lines(&commit_line())
            .set_lines(&opts.extra)
            .loopback_nodes(opts.nodes as u64, false)
            .expect("free loopback ports");
        let config_path = dir.join("cluster.toml");
        spec.write(&config_path).expect("write config");
        let nodes = spec.nodes().to_vec();
        let n = nodes.len();
        TestCluster {
            name,
            dir,
            config_path,
            nodes,
            spec,
            server: opts.server,
            followers: (0..n).map(|_| None).collect(),
            servers: (0..n).map(|_| None).collect(),
            restored: (0..n).map(|_| None).collect(),
            bins: binaries(),
            command: None,
            follower_env: Vec::new(),
        }
    }

    /// The loaded config.
    pub fn config(&self) -> lockstep_common::Config {
        lockstep_common::Config::load(&self.config_path).expect("config")
    }

    fn idx(&self, id: u64) -> usize {
        (id - 1) as usize
    }

    fn log(&self, what: &str, id: u64) -> std::fs::File {
        open_log(&self.dir.join(format!("{what}-{id}.log")), true).expect("log file")
    }

    /// Starts node `id`'s follower and waits until it answers.
    pub fn start_follower(&mut self, id: u64) {
        self.start_follower_with(id, &[]);
    }

    /// [`TestCluster::start_follower`] with more arguments.
    ///
    /// A follower that exits at start because ZooKeeper did not answer in
    /// time (one did so once on a loaded 2-core host, its sessions expiring
    /// as they started) is started once more, as `lockstep up` and a
    /// systemd unit restart it; anything else fails the test.
    pub fn start_follower_with(&mut self, id: u64, args: &[&str]) {
        let i = self.idx(id);
        for attempt in 1..=2 {
            let mut cmd = follower_command(&self.bins.follower, &self.config_path, id);
            cmd.args(args);
            cmd.env("LOCKSTEP_LOG", "info");
            for (_, k, v) in self.follower_env.iter().filter(|e| e.0 == id) {
                cmd.env(k, v);
            }
            let child = spawn(cmd, self.log("follower", id));
            self.followers[i] = Some(child);
            let mut exited = false;
            // A hang bound, not a speed check: a follower restoring its
            // server's image on a loaded 2-core host took over 30 s once.
            let answered = poll_until(Duration::from_secs(120), Duration::from_millis(50), || {
                if self.status(id).is_ok() {
                    return Ok(());
                }
                exited = self.followers[i]
                    .as_mut()
                    .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
                if exited {
                    return Ok(());
                }
                Err(String::new())
            });
            if answered.is_ok() && !exited {
                return;
            }
            let log = std::fs::read_to_string(self.dir.join(format!("follower-{id}.log")))
                .unwrap_or_default();
            let zookeeper = log
                .lines()
                .last()
                .is_some_and(|l| l.contains("ZooKeeper did not answer"));
            if exited && zookeeper && attempt == 1 {
                eprintln!(
                    "follower {id} exited at start (ZooKeeper did not answer): starting it again"
                );
                continue;
            }
            break;
        }
        panic!("timed out waiting for follower answering\n{}", self.logs());
    }

    /// Starts node `id`'s server under the preload and waits until it
    /// listens and is attached to its region.
    pub fn start_server(&mut self, id: u64) {
        // Its follower runs: the server starts dated when the log began
        // (a rebuilt node's follower learns that from its peers), as
        // `lockstep run` without `--no-wait` waits for.
        if self.followers[self.idx(id)].is_some() {
            self.wait(
                &format!("node {id} to know when the log began"),
                Duration::from_secs(60),
                |c| c.origin_us(id) != 0,
            );
        }
        self.spawn_server(id);
        self.wait_server_attached(id);
    }

    /// Starts node `id`'s server under the preload and waits only until
    /// it listens (its follower may not run yet).
    pub fn start_server_listening(&mut self, id: u64) {
        self.spawn_server(id);
        let app = self.app(id);
        self.wait("server listening", Duration::from_secs(60), |_| {
            TcpStream::connect(app).is_ok()
        });
    }

    /// Waits until node 1 leads and the servers of `ids` are attached,
    /// then runs a short mixed workload through the leader and waits
    /// until the replicas agree (same digest).
    pub fn serve_and_agree(&mut self, ids: &[u64], limit: Duration) {
        self.wait_leader(1);
        self.wait("the servers to attach", limit, |c| {
            ids.iter()
                .all(|&id| c.status(id).is_ok_and(|s| s.server_pid != 0))
        });
        redis_mixed_workload(self.app(1), 2, 100);
        self.wait_converged(limit);
        self.assert_same_digest();
    }

    /// Whether node `id`'s server (its launcher) was started and still
    /// runs.
    pub fn server_running(&mut self, id: u64) -> bool {
        let i = self.idx(id);
        self.servers[i]
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Node `id`'s server process id (0: none started).
    pub fn server_pid(&self, id: u64) -> u32 {
        self.servers[self.idx(id)].as_ref().map_or(0, |c| c.id())
    }

    /// Sets `key=value` in the environment of node `id`'s follower from
    /// its next start on.
    pub fn follower_env(&mut self, id: u64, key: &str, value: &str) {
        self.follower_env.push((id, key.into(), value.into()));
    }

    /// Starts node `id`'s server under the preload as a person starting
    /// it from a shell would: a plain child of this process, in its
    /// session (not a session leader) and PID namespace, its output on
    /// its log file; waits as `start_server` does.
    pub fn start_server_by_hand(&mut self, id: u64) {
        in_a_visible_session();
        self.spawn_server_as(id, false);
        self.wait_server_attached(id);
    }

    /// Waits until node `id`'s server listens and is attached to its
    /// region.
    fn wait_server_attached(&self, id: u64) {
        let app = self.app(id);
        self.wait(
            "server listening and attached",
            Duration::from_secs(60),
            |c| {
                TcpStream::connect(app).is_ok()
                    && c.status(id).map(|s| s.server_pid != 0).unwrap_or(false)
            },
        );
    }

    /// Spawns node `id`'s server under the preload (a fresh data dir).
    fn spawn_server(&mut self, id: u64) {
        self.spawn_server_as(id, true);
    }

    /// Spawns node `id`'s server under the preload (a fresh data dir),
    /// through `lockstep launch-server` when `launched`.
    fn spawn_server_as(&mut self, id: u64, launched: bool) {
        let n = self.nodes[self.idx(id)].clone();
        let data = self.dir.join(format!("server-{id}"));
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data).expect("server dir");
        let mut cmd = match self.server {
            Server::Redis => redis_command(
                n.app.port(),
                &data,
                &lockstep_common::config::REDIS_REPLICA_ARGS,
            ),
            Server::Memcached => memcached_command(n.app.port()),
        };
        if let Some(argv) = &self.command {
            cmd = templated_command(argv, n.app.port(), &data);
        }
        if !launched {
            under_preload(&mut cmd, &self.bins.preload, &self.config_path, id);
            let child = spawn(cmd, self.log("server", id));
            let i = self.idx(id);
            self.servers[i] = Some(child);
            return;
        }
        // In a PID namespace of its own, as `lockstep up` starts it: its
        // image can be restored.
        let log = self.dir.join(format!("server-{id}.log"));
        let cmd = preloaded_server(&self.bins, &self.config_path, id, &cmd, &log, false);
        let child = spawn(cmd, self.log("server", id));
        let i = self.idx(id);
        self.servers[i] = Some(child);
    }

    /// Starts every follower, then every server; waits until the leader
    /// serves.
    pub fn start_all(&mut self) {
        self.start_nodes();
        self.wait_leader(1);
    }

    /// Starts every follower, then every server (each waited for as in
    /// `start_follower` and `start_server`), not waiting for a leader.
    pub fn start_nodes(&mut self) {
        for id in 1..=self.nodes.len() as u64 {
            self.start_follower(id);
        }
        for id in 1..=self.nodes.len() as u64 {
            self.start_server(id);
        }
    }

    /// Waits until node `id` leads (its view change done, preload active).
    pub fn wait_leader(&mut self, id: u64) {
        self.wait("leader active", Duration::from_secs(60), |c| {
            c.status(id).map(|s| s.role == "leader").unwrap_or(false)
        });
    }

    /// The node among `ids` that leads (see [`leading`]), once one does;
    /// panics with the logs after `limit`.
    pub fn wait_leader_among(&self, ids: &[u64], limit: Duration) -> u64 {
        let found = std::cell::Cell::new(0);
        self.wait("a leader", limit, |c| {
            match find_leader(&c.config(), ids, Duration::from_secs(5)) {
                Some((_, l)) if ids.contains(&l) => {
                    found.set(l);
                    true
                }
                _ => false,
            }
        });
        found.get()
    }

    /// SIGKILLs node `id`'s follower.
    pub fn kill_follower(&mut self, id: u64) {
        let i = self.idx(id);
        kill_and_reap(&mut self.followers[i]);
    }

    /// Stops node `id`'s follower as an operator does (SIGTERM) and waits
    /// until it exited; its exit status.
    pub fn stop_follower(&mut self, id: u64) -> std::process::ExitStatus {
        let i = self.idx(id);
        let child = self.followers[i].as_mut().expect("follower running");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM");
        let mut status = None;
        let exited = poll_until(Duration::from_secs(60), Duration::from_millis(20), || {
            status = child.try_wait().ok().flatten();
            status.map(|_| ()).ok_or_else(String::new)
        });
        if exited.is_err() {
            panic!("follower {id} did not stop on SIGTERM\n{}", self.logs());
        }
        self.followers[i] = None;
        status.expect("exited")
    }

    /// Node `id`'s region file.
    pub fn region_file(&self, id: u64) -> PathBuf {
        lockstep_common::region::region_path(&self.name, id)
    }

    /// Whether a server is attached to node `id`'s region file (false:
    /// no file).
    pub fn server_attached(&self, id: u64) -> bool {
        let spec = self.config().region_spec(id);
        lockstep_common::region::Region::open(&self.region_file(id), &spec)
            .is_ok_and(|r| r.server_attached())
    }

    /// SIGKILLs node `id`'s server: the one started here, and the one its
    /// follower runs now when that is another (a peer's snapshot it
    /// installed replaced ours: with snapshots keeping their turns, a
    /// leader killed after its log was compacted comes back that way).
    pub fn kill_server(&mut self, id: u64) {
        let current = self.status(id).map(|s| s.server_pid as u32).unwrap_or(0);
        let i = self.idx(id);
        kill_launched_and_reap(&mut self.servers[i]);
        kill_restored(&mut self.restored[i]);
        if current != 0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(current as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            // Not our child: gone once /proc shows it no longer running
            // (its lock on the region goes with it).
            let gone = || {
                lockstep_launcher::process::stat_fields(current)
                    .is_none_or(|f| f.starts_with(['Z', 'X']))
            };
            let since = Instant::now();
            while !gone() && since.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        // With its follower already gone there was no pid to ask for: the
        // server in its PID namespace dies after its launcher, and a
        // follower started before it has gone refuses the region ("a
        // server is still attached"). Its lock on the region goes with it.
        let since = Instant::now();
        while self.server_attached(id) && since.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Brings node `id` back after it was killed: its follower, and a fresh
    /// server unless the follower restored one from a snapshot (that one is
    /// the node's then, stopped with it; a second would not even listen).
    pub fn restart_node(&mut self, id: u64) {
        if self.start_follower_restoring(id).is_none() {
            self.start_server(id);
        }
    }

    /// Starts node `id`'s follower; when it restored the node's server from
    /// a snapshot, that server is the node's (stopped with the cluster) and
    /// its pid is returned; None: no snapshot served, start a server.
    pub fn start_follower_restoring(&mut self, id: u64) -> Option<u32> {
        self.start_follower(id);
        let pid = self.status(id).map(|s| s.server_pid).unwrap_or(0);
        if pid == 0 {
            return None;
        }
        let i = self.idx(id);
        self.restored[i] = Some(pid as u32);
        Some(pid as u32)
    }

    /// Takes the server node `id`'s follower runs now (one it restored or
    /// installed from a snapshot) as the node's, stopped with the cluster;
    /// returns its pid.
    pub fn adopt_restored(&mut self, id: u64) -> u32 {
        let pid = self.status(id).map(|s| s.server_pid).unwrap_or(0) as u32;
        assert!(pid != 0, "node {id} runs no server\n{}", self.logs());
        let i = self.idx(id);
        if self.servers[i].as_ref().is_some_and(|c| c.id() == pid) {
            return pid;
        }
        kill_launched_and_reap(&mut self.servers[i]);
        self.restored[i] = Some(pid);
        pid
    }

    /// When the cluster's log began, as node `id`'s region shows it (0:
    /// not known there yet).
    pub fn origin_us(&self, id: u64) -> u64 {
        lockstep_launcher::commands::region_origin(&self.config(), id).unwrap_or(0)
    }

    /// Node `id`'s status over the control channel.
    pub fn status(&self, id: u64) -> Result<NodeStatus, String> {
        query_status(&self.config(), id)
    }

    /// Polls `cond` until true; panics with the follower logs after `limit`.
    pub fn wait(&self, what: &str, limit: Duration, cond: impl Fn(&TestCluster) -> bool) {
        let holds = || cond(self).then_some(()).ok_or_else(String::new);
        if poll_until(limit, Duration::from_millis(50), holds).is_err() {
            panic!("timed out waiting for {what}\n{}", self.logs());
        }
    }

    /// Waits until every node has applied everything the leader persisted.
    pub fn wait_converged(&self, limit: Duration) {
        self.wait("all nodes applied the leader's log", limit, |c| {
            let Ok(l) = c.status(1) else { return false };
            (1..=c.nodes.len() as u64).all(|id| {
                c.status(id)
                    .map(|s| s.applied >= l.persisted && s.persisted >= l.persisted)
                    .unwrap_or(false)
            })
        });
    }

    /// The tail of every log file, for failure messages.
    pub fn logs(&self) -> String {
        lockstep_launcher::process::log_tails(&[&self.dir], 15)
    }

    /// App address of node `id`.
    pub fn app(&self, id: u64) -> SocketAddr {
        self.nodes[self.idx(id)].app
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for c in self.servers.iter_mut() {
            kill_launched_and_reap(c);
        }
        for r in self.restored.iter_mut() {
            kill_restored(r);
        }
        for c in self.followers.iter_mut() {
            kill_and_reap(c);
        }
        // A server nobody here knows of (one a follower restored while the
        // test looked elsewhere) must not outlive the test: it works in a
        // directory of this cluster.
        for pid in processes_working_in(&self.dir) {
            eprintln!(
                "{}: stopping pid {pid}, left running in the cluster's directory",
                self.name
            );
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        for n in &self.nodes {
            let _ = std::fs::remove_file(lockstep_common::region::region_path(&self.name, n.id));
        }
        // A failing test keeps its logs; `LOCKSTEP_TEST_KEEP=1` keeps a
        // passing one's too (to read what its servers logged).
        if !std::thread::panicking() && std::env::var_os("LOCKSTEP_TEST_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Free loopback ports that none of a cluster's nodes took (they are free
/// until the nodes start) and that this picker has not handed out yet.
pub struct SparePorts(Vec<u16>);

impl SparePorts {
    /// Ports beside the nodes of `c`.
    pub fn of(c: &TestCluster) -> SparePorts {
        SparePorts(
            c.nodes
                .iter()
                .flat_map(|n| [n.app.port(), n.control.port()])
                .collect(),
        )
    }

    /// Keeps `ports` out too.
    pub fn besides(mut self, ports: impl IntoIterator<Item = u16>) -> SparePorts {
        self.0.extend(ports);
        self
    }

    /// The next free port.
    pub fn next_port(&mut self) -> u16 {
        let p = std::iter::repeat_with(free_port)
            .find(|p| !self.0.contains(p))
            .expect("a free port");
        self.0.push(p);
        p
    }
}

/// Collects a child's stdout and stderr (stderr lines tagged) into one
/// shared string, line by line, on two threads.
pub fn collect_output(child: &mut Child) -> std::sync::Arc<std::sync::Mutex<String>> {
    let out = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let collect = |r: Box<dyn Read + Send>, tag: &'static str| {
        let out = out.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(r).lines().map_while(Result::ok) {
                out.lock().unwrap().push_str(&format!("{tag}{l}\n"));
            }
        });
    };
    if let Some(o) = child.stdout.take() {
        collect(Box::new(o), "");
    }
    if let Some(e) = child.stderr.take() {
        collect(Box::new(e), "stderr: ");
    }
    out
}

/// Waits (at most `limit`) until the reader threads of
/// [`collect_output`] saw both pipes end (each holds a clone of `out`
/// until then): after the child exited, its last lines are in `out`.
pub fn wait_output_complete(out: &std::sync::Arc<std::sync::Mutex<String>>, limit: Duration) {
    let start = std::time::Instant::now();
    while std::sync::Arc::strong_count(out) > 1 && start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `GET path` on `addr` (HTTP/1.1, the connection closed after): the
/// status code and the body.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::Write;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    Ok((code, body.to_string()))
}

/// `lockstep status --json --config F`, parsed.
pub fn cli_status(config: &Path) -> serde_json::Value {
    let out = Command::new(bin_dir().join("lockstep"))
        .args(["status", "--json", "--config"])
        .arg(config)
        .output()
        .expect("run lockstep status");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "lockstep status --json printed no JSON ({e}): {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Status of node `id` over its control channel.
pub fn query_status(config: &lockstep_common::Config, id: u64) -> Result<NodeStatus, String> {
    lockstep_common::control::query_status(config, id, Duration::from_secs(5))
}

/// `DEBUG DIGEST` of the Redis server at `addr`.
pub fn redis_digest(addr: SocketAddr) -> String {
    let mut c = Resp::connect(addr).expect("connect for digest");
    match c.cmd(&[b"DEBUG", b"DIGEST"]).expect("DEBUG DIGEST") {
        Value::Simple(s) => s,
        other => panic!("DEBUG DIGEST answered {other:?}"),
    }
}

/// Runs `threads` clients against `addr`, each doing `ops` order-sensitive
/// operations on shared keys (lists, appends, counters, MULTI/EXEC, SELECT).
pub fn redis_mixed_workload(addr: SocketAddr, threads: usize, ops: usize) {
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Resp::connect(addr).expect("connect");
                for i in 0..ops {
                    redis_mixed_op(&mut c, t, i).expect("command");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("client thread");
    }
}

/// `n` SETs, one at a time, on the leader at `addr`: keys `<prefix>:<i>`,
/// each answered OK (one log entry each).
pub fn set_keys(addr: SocketAddr, prefix: &str, n: usize) {
    let mut r = Resp::connect(addr).expect("connect to the leader");
    for i in 0..n {
        let key = format!("{prefix}:{i}");
        match r.cmd(&[b"SET", key.as_bytes(), b"v"]).expect("SET") {
            Value::Simple(s) if s == "OK" => {}
            other => panic!("SET {key}: {other:?}"),
        }
    }
}

/// `n` SETs of `value` pipelined on `r` a thousand at a time: keys
/// `k<i>`, each answered OK (enough data for a save or a load to take a
/// while).
pub fn fill_keys(r: &mut Resp, n: usize, value: &[u8]) {
    for chunk in (0..n).step_by(1000) {
        let end = (chunk + 1000).min(n);
        for i in chunk..end {
            r.send(&[b"SET", format!("k{i}").as_bytes(), value])
                .expect("send SET");
        }
        for i in chunk..end {
            assert_eq!(
                r.read().expect("SET reply"),
                Value::Simple("OK".into()),
                "SET k{i}"
            );
        }
    }
}

/// Removes a path if it exists.
pub fn remove(p: &Path) {
    let _ = std::fs::remove_dir_all(p);
    let _ = std::fs::remove_file(p);
}

// ---- Helpers for the failover tests (tests/failover.rs) ----

impl TestCluster {
    /// Rewrites the (not yet used) config for ZooKeeper election at
    /// `zookeeper` with the given session timeout.
    pub fn use_zookeeper(&mut self, zookeeper: &str, session_timeout_ms: u64) {
        self.change_config(|s| {
            s.election(ElectionSpec::ZooKeeper {
                connect: zookeeper.to_string(),
                session_timeout_ms,
            })
        });
    }

    /// Changes the (not yet used) config and writes it again.
    pub fn change_config(&mut self, change: impl FnOnce(ClusterSpec) -> ClusterSpec) {
        self.spec = change(self.spec.clone());
        self.spec.write(&self.config_path).expect("write config");
        self.nodes = self.spec.nodes().to_vec();
    }

    /// Starts a private ZooKeeper on a port none of the nodes took and
    /// switches the (not yet used) config to elect through it with the
    /// given session timeout.
    pub fn start_zookeeper(&mut self, session_timeout_ms: u64) -> ZookeeperServer {
        let mut spare = SparePorts::of(self);
        let zk = ZookeeperServer::start_on_free_port(&self.dir.join("zk"), || spare.next_port())
            .expect("start ZooKeeper");
        self.use_zookeeper(&zk.addr().to_string(), session_timeout_ms);
        zk
    }

    /// Sets `backup_clients` ("allow" | "deny") in the (not yet used) config.
    pub fn set_backup_clients(&mut self, value: &str) {
        self.change_config(|s| s.set("backup_clients", value));
    }
}

// ---- Helpers for `lockstep up` tests: private ZooKeeper, process scan, memcached.

/// Runs `threads` memcached clients against `addr`, each doing `ops`
/// order-sensitive operations on shared keys: set (flags = thread),
/// append, prepend, cas after gets, delete, incr/decr on shared counters.
/// Returns the net change each counter `ctr:K` received (its start value is
/// `MC_COUNTER_START`, set by this function before the clients start).
pub fn memcached_mixed_workload(
    addr: SocketAddr,
    threads: usize,
    ops: usize,
    keys: usize,
) -> Vec<i64> {
    let mut c = Memcache::connect(addr).expect("connect");
    for k in 0..keys {
        assert_eq!(
            c.store(
                "set",
                &format!("ctr:{k}"),
                0,
                MC_COUNTER_START.to_string().as_bytes(),
                None
            )
            .unwrap(),
            "STORED"
        );
    }
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Memcache::connect(addr).expect("connect");
                let mut deltas = vec![0i64; keys];
                let ok = |r: std::io::Result<String>| {
                    let r = r.expect("memcached request");
                    assert!(
                        !r.starts_with("ERROR") && !r.contains("_ERROR"),
                        "memcached answered {r:?}"
                    );
                    r
                };
                for i in 0..ops {
                    let k = (i * 7 + t * 3) % keys;
                    let key = format!("str:{k}");
                    let v = format!("<{t}.{i}>");
                    match i % 8 {
                        0 | 7 => {
                            ok(c.store("set", &key, t as u32, v.as_bytes(), None));
                        }
                        1 => {
                            ok(c.store("append", &key, 0, v.as_bytes(), None));
                        }
                        2 => {
                            ok(c.store("prepend", &key, 0, v.as_bytes(), None));
                        }
                        3 => {
                            let by = (t + i) % 5 + 1;
                            let r = ok(c.request(format!("incr ctr:{k} {by}\r\n").as_bytes()));
                            assert!(r.parse::<u64>().is_ok(), "incr answered {r:?}");
                            deltas[k] += by as i64;
                        }
                        4 => {
                            let by = (t + i) % 3 + 1;
                            let r = ok(c.request(format!("decr ctr:{k} {by}\r\n").as_bytes()));
                            assert!(r.parse::<u64>().is_ok(), "decr answered {r:?}");
                            deltas[k] -= by as i64;
                        }
                        5 => {
                            if let Some((_, old, cas)) = c.gets(&key).expect("gets") {
                                let mut nv = old;
                                nv.extend_from_slice(b"+cas");
                                let r = ok(c.store("cas", &key, 100 + t as u32, &nv, Some(cas)));
                                assert!(
                                    r == "STORED" || r == "EXISTS" || r == "NOT_FOUND",
                                    "cas answered {r:?}"
                                );
                            }
                        }
                        _ => {
                            ok(c.request(format!("delete {key}\r\n").as_bytes()));
                        }
                    }
                }
                deltas
            })
        })
        .collect();
    let mut total = vec![0i64; keys];
    for h in handles {
        for (k, d) in h.join().expect("client thread").into_iter().enumerate() {
            total[k] += d;
        }
    }
    total
}

/// Start value of the workload's counters (high enough that decr never
/// clamps at 0, so the final values are exact).
pub const MC_COUNTER_START: u64 = 1_000_000;

/// How long the replicas' digests may take to agree once the log is
/// applied (generous: a backup is a few turns behind its leader at most).
const DIGEST_LIMIT: Duration = Duration::from_secs(30);

impl TestCluster {
    /// Like `wait_converged`, for the nodes `ids` only (others may be down);
    /// `ids[0]` is the leader.
    pub fn wait_converged_on(&self, ids: &[u64], limit: Duration) {
        self.wait("the nodes applied the leader's log", limit, |c| {
            let Ok(l) = c.status(ids[0]) else {
                return false;
            };
            ids.iter().all(|&id| {
                c.status(id)
                    .map(|s| s.applied >= l.persisted && s.persisted >= l.persisted)
                    .unwrap_or(false)
            })
        });
    }
}

// ---- Helpers for the restart and durability tests (follower_shm.rs, follower_fsync.rs).

/// The mixed workload's operation `i` of client `t` on `c` (the same mix
/// as `redis_mixed_workload`); panics on a server error reply.
pub fn redis_mixed_op(c: &mut Resp, t: usize, i: usize) -> std::io::Result<()> {
    let v = format!("{t}:{i}");
    let r = match i % 7 {
        0 => c.cmd(&[b"LPUSH", b"shared:list", v.as_bytes()]),
        1 => c.cmd(&[b"RPUSH", b"shared:list", v.as_bytes()]),
        2 => c.cmd(&[b"APPEND", b"shared:str", v.as_bytes()]),
        3 => c.cmd(&[b"INCR", b"shared:counter"]),
        4 => {
            c.send(&[b"MULTI"])?;
            c.send(&[b"INCRBY", b"shared:tx", b"3"])?;
            c.send(&[b"RPUSH", b"shared:txlist", v.as_bytes()])?;
            c.send(&[b"EXEC"])?;
            for _ in 0..3 {
                c.read()?;
            }
            c.read()
        }
        5 => {
            c.cmd(&[b"SELECT", b"3"])?;
            let r = c.cmd(&[b"RPUSH", b"db3:list", v.as_bytes()]);
            c.cmd(&[b"SELECT", b"0"])?;
            r
        }
        _ => c.cmd(&[
            b"SET",
            format!("key:{t}:{}", i % 50).as_bytes(),
            v.as_bytes(),
        ]),
    }?;
    if let Value::Error(e) = r {
        panic!("server error: {e}");
    }
    Ok(())
}

/// Key of client `t`'s own counter in [`BackgroundLoad`].
pub fn load_counter_key(t: usize) -> String {
    format!("acked:ctr:{t}")
}

/// Clients running the mixed workload against one server until stopped,
/// each also INCRing its own counter ([`load_counter_key`]) and keeping
/// the last value the server acknowledged. The load is not bounded by a
/// count, so a fault injected while it runs always lands mid-load.
pub struct BackgroundLoad {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    done: std::sync::Arc<std::sync::atomic::AtomicU64>,
    handles: Vec<std::thread::JoinHandle<(i64, Option<String>)>>,
}

impl BackgroundLoad {
    /// Starts `threads` clients against `addr`. A client stops at its
    /// first I/O error (see [`BackgroundLoad::stop_after_failure`]).
    pub fn start(addr: SocketAddr, threads: usize) -> BackgroundLoad {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::Arc;
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let handles = (0..threads)
            .map(|t| {
                let (stop, done) = (stop.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut c = Resp::connect(addr).expect("connect");
                    let key = load_counter_key(t);
                    let mut acked = 0i64;
                    let mut i = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        if let Err(e) = redis_mixed_op(&mut c, t, i) {
                            return (acked, Some(format!("client {t}: {e}")));
                        }
                        match c.cmd(&[b"INCR", key.as_bytes()]) {
                            Ok(Value::Int(v)) => {
                                assert!(v > acked, "client {t}: INCR answered {v} after {acked}");
                                acked = v;
                            }
                            Ok(other) => panic!("INCR answered {other:?}"),
                            Err(e) => return (acked, Some(format!("client {t}: {e}"))),
                        }
                        done.fetch_add(2, Ordering::Relaxed);
                        i += 1;
                    }
                    (acked, None)
                })
            })
            .collect();
        BackgroundLoad {
            stop,
            done,
            handles,
        }
    }

    /// Commands acknowledged so far (all clients).
    pub fn done(&self) -> u64 {
        self.done.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits until `n` more commands than now were acknowledged; panics
    /// with the cluster's logs after `limit` (a hang) or if a client died.
    pub fn wait_more(&self, c: &TestCluster, n: u64, limit: Duration) {
        let target = self.done() + n;
        let start = Instant::now();
        while self.done() < target {
            if self.handles.iter().any(|h| h.is_finished()) {
                panic!(
                    "a load client stopped early (I/O error or panic)\n{}",
                    c.logs()
                );
            }
            if start.elapsed() > limit {
                panic!(
                    "load made no progress to {target} (at {})\n{}",
                    self.done(),
                    c.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the clients; returns each one's last acknowledged counter.
    /// Panics if a client hit an I/O error.
    pub fn stop(self) -> Vec<i64> {
        self.finish()
            .into_iter()
            .map(|(acked, err)| {
                assert!(
                    err.is_none(),
                    "load client failed: {}",
                    err.unwrap_or_default()
                );
                acked
            })
            .collect()
    }

    /// Stops the clients after a fault that may have cut their connections:
    /// I/O errors are expected. Returns each one's last acknowledged counter.
    pub fn stop_after_failure(self) -> Vec<i64> {
        self.finish().into_iter().map(|(acked, _)| acked).collect()
    }

    fn finish(self) -> Vec<(i64, Option<String>)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handles
            .into_iter()
            .map(|h| h.join().expect("load client panicked"))
            .collect()
    }
}

impl TestCluster {
    /// Asserts that every node's `DEBUG DIGEST` comes to equal node 1's;
    /// returns it. Not at one instant: the leader's timers go on changing
    /// its data (its active expiry reclaims keys in logged turns), and a
    /// backup follows a moment later; replicas that differ for good never
    /// agree.
    pub fn assert_same_digest(&self) -> String {
        let start = Instant::now();
        loop {
            let leader = redis_digest(self.app(1));
            let differing = (2..=self.nodes.len() as u64)
                .map(|id| (id, redis_digest(self.app(id))))
                .find(|(_, d)| *d != leader);
            match differing {
                None => return leader,
                Some((id, d)) if start.elapsed() > DIGEST_LIMIT => panic!(
                    "node {id} differs from the leader: {d} != {leader}\n{}",
                    self.logs()
                ),
                Some(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Asserts that no node's follower saw a divergence.
    pub fn assert_no_divergence(&self) {
        for id in 1..=self.nodes.len() as u64 {
            assert_eq!(
                self.status(id).unwrap().divergences,
                0,
                "node {id} saw divergences\n{}",
                self.logs()
            );
        }
    }

    /// With `load` running: SIGKILLs node `id`'s follower and server, lets
    /// the others serve on, restarts both (fresh server), and returns once
    /// the load moved on after each step.
    pub fn restart_node_under_load(&mut self, id: u64, load: &BackgroundLoad, limit: Duration) {
        self.kill_follower(id);
        self.kill_server(id);
        load.wait_more(self, 1000, limit);
        self.restart_node(id);
        load.wait_more(self, 1000, limit);
    }
}

/// After a load whose clients all got their last answer: waits until the
/// cluster converged, then checks identical digests, every node's counters
/// exactly as acknowledged (nothing is in doubt), and no divergence.
pub fn assert_converged_exactly(c: &TestCluster, acked: &[i64], limit: Duration) {
    c.wait_converged(limit);
    c.assert_same_digest();
    let counters = assert_acked_counters(c, acked);
    assert!(
        counters.iter().all(|v| v.as_slice() == acked),
        "counters {counters:?}, acknowledged {acked:?}"
    );
    c.assert_no_divergence();
}

/// Checks on every node of `c` that each client's counter holds at least
/// what the client saw acknowledged (`acked[t]`); returns the values read.
pub fn assert_acked_counters(c: &TestCluster, acked: &[i64]) -> Vec<Vec<i64>> {
    let mut all = Vec::new();
    for id in 1..=c.nodes.len() as u64 {
        let mut r = Resp::connect(c.app(id)).expect("connect for counters");
        let mut vals = Vec::new();
        for (t, &a) in acked.iter().enumerate() {
            let v = match r
                .cmd(&[b"GET", load_counter_key(t).as_bytes()])
                .expect("GET")
            {
                Value::Bulk(b) => String::from_utf8_lossy(&b).parse::<i64>().expect("counter"),
                Value::Null => 0,
                other => panic!("GET answered {other:?}"),
            };
            assert!(
                v >= a,
                "node {id}: counter of client {t} is {v}, but the client saw {a} acknowledged\n{}",
                c.logs()
            );
            vals.push(v);
        }
        all.push(vals);
    }
    all
}

// ---- Any server by command line (tests/apply_servers.rs).

impl TestCluster {
    /// Every node runs `argv` as its server (under the preload, like
    /// redis/memcached) instead of `Options::server`; call before starting
    /// servers. In each argument `{port}` becomes the node's app port and
    /// `{data}` the node's own (fresh, empty) server directory.
    pub fn use_server_command(&mut self, argv: &[&str]) {
        assert!(!argv.is_empty(), "empty server command");
        self.command = Some(argv.iter().map(|a| a.to_string()).collect());
    }

    /// Every node runs memcached as `user` with `threads` worker threads.
    pub fn use_memcached(&mut self, user: &str, threads: &str) {
        self.use_server_command(&[
            "memcached",
            "-u",
            user,
            "-t",
            threads,
            "-U",
            "0",
            "-l",
            "127.0.0.1",
            "-p",
            "{port}",
        ]);
    }

    /// After a failover from `old` to `leader`: waits until `leader` and
    /// `other` applied everything, restarts `old` (follower, then a fresh
    /// server that replays the whole log), waits until it applied
    /// everything too, and checks that no node counted a divergence.
    pub fn rebuild_old_leader_and_agree(
        &mut self,
        old: u64,
        leader: u64,
        other: u64,
        limit: Duration,
    ) {
        self.wait_converged_on(&[leader, other], limit);
        self.restart_node(old);
        self.wait_converged_on(&[leader, other, old], limit);
        for id in [leader, other, old] {
            assert_eq!(
                self.status(id).expect("status").divergences,
                0,
                "node {id} answered differently from the leader\n{}",
                self.logs()
            );
        }
    }
}

/// The processes whose working directory is `dir` or below it.
fn processes_working_in(dir: &Path) -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != std::process::id() as i32)
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(dir))
        })
        .collect()
}

/// SIGKILLs a restored server (by pid: it is nobody's child here).
fn kill_restored(slot: &mut Option<u32>) {
    if let Some(pid) = slot.take() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Spawns `cmd` with no stdin and stdout and stderr into `log`.
fn spawn(mut cmd: Command, log: std::fs::File) -> Child {
    spawn_logged(&mut cmd, log, Grouping::Inherit)
        .unwrap_or_else(|e| panic!("cannot spawn {cmd:?}: {e}"))
}

/// `argv` with `{port}` and `{data}` filled in.
fn templated_command(argv: &[String], port: u16, data: &Path) -> Command {
    let fill = |a: &String| {
        a.replace("{port}", &port.to_string())
            .replace("{data}", &data.display().to_string())
    };
    let mut c = Command::new(fill(&argv[0]));
    c.args(argv[1..].iter().map(fill));
    c
}

/// One cluster of the calling test binary at a time: hold the guard for
/// the whole test. For tests whose clusters are heavy enough (a JVM, four
/// server workers, a busy script) that two side by side on a 2-core
/// machine measure the scheduler rather than what the test names. A test
/// that failed while holding it does not poison it.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes this test process lead a session of its own when the session it
/// was started in is led from outside its PID namespace (CI runs the
/// tests through a container runtime's exec: `getsid` reads 0). A person
/// starting a server from a shell has the shell as a visible session
/// leader; this stands in for that shell, once per test binary. (A server
/// in an invisible session cannot be imaged at all: the follower refuses
/// it before CRIU runs, naming `lockstep run`.)
fn in_a_visible_session() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if nix::unistd::getsid(None).map(|s| s.as_raw()) == Ok(0) {
            nix::unistd::setsid().expect(
                "this test process's session is led from outside its PID namespace and it cannot lead one of its own (it leads its process group): run the tests from a shell",
            );
        }
    });
}
