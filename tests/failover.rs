//! Failover end to end: a real ZooKeeper (the system package's server on a
//! private port), real redis-server under the preload, real follower
//! processes, SIGKILL, a lost ZooKeeper, and a leader isolated in its own
//! network namespace.
//!
//! Clients record which of their commands were acknowledged (a reply came
//! back); a command whose reply was lost counts as not acknowledged. After
//! failover the new leader must hold every acknowledged write exactly once
//! (unacknowledged ones may be there, at most once), and every surviving
//! replica must end with the same `DEBUG DIGEST`.
//!
//! No assertion depends on wall-clock time: durations here only bound how
//! long a test waits before it reports a hang (with the logs).

use lockstep_testkit::cluster;

use lockstep_launcher::cluster_spec::ElectionSpec;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cluster::{
    bin_dir, binaries, cli_status, free_port, serial, zookeeper_serving, Options, Resp,
    TestCluster, Value, ZookeeperServer,
};
use lockstep_common::control::NodeStatus;
use lockstep_launcher::binaries::Binaries;
use lockstep_launcher::commands::{follower_command, redis_on_host, under_preload};
use lockstep_launcher::leader::find_leader;
use lockstep_launcher::netns::{self, enter_netns_at, in_netns, spawn_in, Net};
use lockstep_launcher::process::{open_log, spawn_logged, Grouping};
use lockstep_testkit::poll::poll_until;

/// Bound on every wait: reaching it means a hang, not slowness.
const HANG: Duration = Duration::from_secs(180);
/// `election.session_timeout_ms` of the test clusters.
const SESSION_MS: u64 = 2000;
/// Shared counters the clients INCR.
const COUNTERS: usize = 4;
/// The shared list the clients RPUSH unique ids to.
const LIST: &str = "fo:list";

fn counter_key(i: usize) -> String {
    format!("fo:ctr:{i}")
}

// The tests of this file run one at a time (`serial`): each runs a JVM
// and several servers and followers, and the machine may have two cores.

// ---------------------------------------------------------------------
// Logs and status

/// The last lines of every log under `dir` (and `dir/zk`).
fn logs_in(dir: &Path) -> String {
    lockstep_launcher::process::log_tails(&[dir, &dir.join("zk")], 25)
}

/// Finds nodes' status and the leader over the control channels; cheap to
/// clone into client threads.
#[derive(Clone)]
struct Finder {
    config: Arc<lockstep_common::Config>,
    log_dir: PathBuf,
    timeout: Duration,
}

impl Finder {
    fn new(config_path: &Path, log_dir: &Path) -> Finder {
        Finder {
            config: Arc::new(lockstep_common::Config::load(config_path).expect("config")),
            log_dir: log_dir.to_path_buf(),
            timeout: Duration::from_secs(2),
        }
    }

    fn ids(&self) -> Vec<u64> {
        self.config.ids().collect()
    }

    fn app(&self, id: u64) -> SocketAddr {
        self.config.node(id).expect("node").app
    }

    fn status(&self, id: u64) -> Result<NodeStatus, String> {
        lockstep_common::control::query_status(&self.config, id, self.timeout)
    }

    /// The leader of the highest view any node in `among` reports, when
    /// that leader is among them and itself says it leads that view.
    fn leader(&self, among: &[u64]) -> Option<(u64, u64)> {
        find_leader(&self.config, among, self.timeout)
    }

    /// One line per node, for failure messages.
    fn describe(&self) -> String {
        let mut out = String::new();
        for id in self.ids() {
            match self.status(id) {
                Ok(s) => out.push_str(&format!(
                    "node {id}: role {} view {} leader {} persisted {} committed {} applied {} divergences {} server_pid {}\n",
                    s.role, s.view, s.leader, s.persisted, s.committed, s.applied, s.divergences, s.server_pid
                )),
                Err(e) => out.push_str(&format!("node {id}: down ({e})\n")),
            }
        }
        out
    }

    fn logs(&self) -> String {
        format!("{}\n{}", self.describe(), logs_in(&self.log_dir))
    }

    /// Polls `cond` until it holds; panics with `what`, status and logs after
    /// [`HANG`].
    fn wait(&self, what: &str, cond: impl FnMut() -> Result<(), String>) {
        if let Err(last) = poll_until(HANG, Duration::from_millis(100), cond) {
            panic!(
                "timed out waiting for {what} (last: {last})\n{}",
                self.logs()
            );
        }
    }

    /// Waits until a leader not in `not` (found among `among`) completes a
    /// write from a fresh connection; returns it.
    fn wait_leader(&self, among: &[u64], not: &[u64], what: &str) -> u64 {
        let mut found = 0;
        self.wait(what, || match self.leader(among) {
            None => Err("no node leads".into()),
            Some((view, l)) if not.contains(&l) => Err(format!("node {l} still leads view {view}")),
            Some((view, l)) => {
                probe_write(self.app(l))
                    .map_err(|e| format!("view {view} leader {l}: probe write: {e}"))?;
                found = l;
                Ok(())
            }
        });
        found
    }

    /// Waits until node `id` reports `role` in the view `leader` leads; a
    /// node that reports "stale" instead (its server must be rebuilt) fails
    /// at once.
    fn wait_role(&self, id: u64, role: &str, leader: u64) {
        let got = self.wait_role_any(id, &[role, "stale"], leader);
        assert_eq!(
            got, role,
            "node {id} is {got} under leader {leader}, not {role}: its server missed inputs, or applied inputs the \
             majority does not have (see its follower log)\n{}",
            self.logs()
        );
    }

    /// Waits until node `id`, restarted while `expected` led, is back: a
    /// backup of the node that leads now, or that leader itself.
    /// Leadership may have moved meanwhile (on a loaded host a leader can
    /// miss its ZooKeeper session, and the restarted node may win the next
    /// view): that is a failover like any other, and the returned leader
    /// is whoever leads. A node that reports "stale" fails at once.
    fn wait_rejoined(&self, id: u64, expected: u64) -> u64 {
        let all = self.ids();
        let mut now = 0;
        self.wait(&format!("node {id} to rejoin (leader {expected})"), || {
            let (view, l) = self.leader(&all).ok_or("no node leads")?;
            let s = self.status(id)?;
            assert_ne!(
                s.role, "stale",
                "node {id} is stale after its restart: its server missed inputs, or applied inputs the majority does not have (see its follower log)\n{}",
                self.logs()
            );
            if l == id || (s.role == "backup" && s.view == view && s.leader == l) {
                now = l;
                Ok(())
            } else {
                Err(format!(
                    "node {id}: role {} view {} leader {}; node {l} leads view {view}",
                    s.role, s.view, s.leader
                ))
            }
        });
        if now != expected {
            eprintln!(
                "leadership moved from node {expected} to node {now} while node {id} rejoined"
            );
        }
        now
    }

    /// Waits until node `id` reports one of `roles` in the view `leader`
    /// leads; returns it.
    fn wait_role_any(&self, id: u64, roles: &[&str], leader: u64) -> String {
        let mut got = String::new();
        self.wait(
            &format!("node {id} to be one of {roles:?} under leader {leader}"),
            || {
                let l = self.status(leader)?;
                let s = self.status(id)?;
                // A stale node waits for a restart wherever it stopped.
                let stale = s.role == "stale" && roles.contains(&"stale");
                if stale
                    || (roles.contains(&s.role.as_str()) && s.view == l.view && s.leader == leader)
                {
                    got = s.role.clone();
                    Ok(())
                } else {
                    Err(format!(
                        "node {id}: role {} view {} leader {}; leader's view {}",
                        s.role, s.view, s.leader, l.view
                    ))
                }
            },
        );
        got
    }

    /// Waits until every node in `ids` is in the leader's view and applied
    /// everything the leader persisted (call with the clients stopped).
    fn wait_converged(&self, leader: u64, ids: &[u64]) {
        self.wait(&format!("nodes {ids:?} to apply leader {leader}'s log"), || {
            let l = self.status(leader)?;
            for &id in ids {
                let s = self.status(id)?;
                if s.view != l.view || s.persisted < l.persisted || s.applied < l.persisted || s.applied > s.committed.max(s.persisted) {
                    return Err(format!(
                        "node {id}: view {} persisted {} committed {} applied {}; leader view {} persisted {}",
                        s.view, s.persisted, s.committed, s.applied, l.view, l.persisted
                    ));
                }
            }
            Ok(())
        });
    }

    /// Every node in `ids` ends with the same `DEBUG DIGEST` (and counted no
    /// divergence).
    fn assert_digests_agree(&self, ids: &[u64]) {
        let start = Instant::now();
        loop {
            let digests: Vec<(u64, Result<String, String>)> =
                ids.iter().map(|&id| (id, digest(self.app(id)))).collect();
            let first = &digests[0].1;
            if first.is_ok() && digests.iter().all(|(_, d)| d == first) {
                break;
            }
            if start.elapsed() > Duration::from_secs(30) {
                panic!(
                    "DEBUG DIGEST differs between nodes: {digests:?}\n{}\n{}",
                    self.data_diff(ids),
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        for &id in ids {
            let s = self.status(id).expect("status");
            assert_eq!(
                s.divergences,
                0,
                "node {id} counted divergences\n{}",
                self.logs()
            );
        }
    }
}

impl Finder {
    /// Which keys differ between the servers of `ids` (for failure
    /// messages): per key, each node's DEBUG DIGEST-VALUE and a summary.
    fn data_diff(&self, ids: &[u64]) -> String {
        let mut per_node: Vec<(u64, HashMap<String, String>)> = Vec::new();
        for &id in ids {
            let mut map = HashMap::new();
            let Ok(mut c) = Resp::connect_with(
                self.app(id),
                Duration::from_secs(2),
                Duration::from_secs(30),
            ) else {
                continue;
            };
            let Ok(Value::Array(keys)) = c.cmd(&[b"KEYS", b"*"]) else {
                continue;
            };
            for k in keys {
                let Value::Bulk(k) = k else { continue };
                let summary = match c.cmd(&[b"TYPE", &k]) {
                    Ok(Value::Simple(t)) if t == "list" => match c.cmd(&[b"LLEN", &k]) {
                        Ok(Value::Int(n)) => {
                            let tail = c.cmd(&[b"LRANGE", &k, b"-3", b"-1"]);
                            format!("list len {n} tail {tail:?}")
                        }
                        other => format!("list {other:?}"),
                    },
                    Ok(Value::Simple(t)) if t == "string" => match c.cmd(&[b"GET", &k]) {
                        Ok(Value::Bulk(v)) => format!("{:?}", String::from_utf8_lossy(&v)),
                        other => format!("{other:?}"),
                    },
                    other => format!("{other:?}"),
                };
                map.insert(String::from_utf8_lossy(&k).into_owned(), summary);
            }
            per_node.push((id, map));
        }
        let mut keys: Vec<&String> = per_node.iter().flat_map(|(_, m)| m.keys()).collect();
        keys.sort();
        keys.dedup();
        let mut out = String::from("keys that differ:\n");
        for k in keys {
            let vals: Vec<(u64, Option<&String>)> =
                per_node.iter().map(|(id, m)| (*id, m.get(k))).collect();
            if vals.iter().any(|(_, v)| *v != vals[0].1) {
                out.push_str(&format!("  {k}: {vals:?}\n"));
            }
        }
        out
    }
}

/// `DEBUG DIGEST` of the server at `addr`.
fn digest(addr: SocketAddr) -> Result<String, String> {
    let mut c = Resp::connect_with(addr, Duration::from_secs(2), Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    match c.cmd(&[b"DEBUG", b"DIGEST"]) {
        Ok(Value::Simple(s)) => Ok(s),
        other => Err(format!("{other:?}")),
    }
}

/// One SET from a fresh connection; Ok when it answered OK.
fn probe_write(addr: SocketAddr) -> Result<(), String> {
    probe_write_with(addr, Duration::from_secs(10))
}

fn probe_write_with(addr: SocketAddr, read: Duration) -> Result<(), String> {
    let mut c = Resp::connect_with(addr, Duration::from_secs(2), read)
        .map_err(|e| format!("connect: {e}"))?;
    match c.cmd(&[b"SET", b"fo:probe", b"1"]) {
        Ok(Value::Simple(s)) if s == "OK" => Ok(()),
        Ok(other) => Err(format!("answered {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

// ---------------------------------------------------------------------
// Clients that record what was acknowledged

/// What a client does when a command fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OnError {
    /// Find the (new) leader, reconnect, go on.
    Reconnect,
    /// Record the error and stop: every command must succeed on the first
    /// connection.
    Stop,
}

/// One client's history.
#[derive(Debug, Default)]
struct ClientLog {
    client: usize,
    /// INCRs sent per counter (acknowledged or not).
    incr_sent: [u64; COUNTERS],
    /// Acknowledged INCRs: (counter, value it returned), in client order.
    incr_acked: Vec<(usize, i64)>,
    /// Ids sent with RPUSH (acknowledged or not).
    push_sent: Vec<String>,
    /// Acknowledged RPUSHes: (id, list length it returned), in client order.
    push_acked: Vec<(String, i64)>,
    /// Connections opened after the first.
    reconnects: u64,
}

/// Client threads running INCR on shared counters and RPUSH of unique ids.
struct Load {
    stop: Arc<AtomicBool>,
    acked: Arc<Vec<AtomicU64>>,
    failed: Arc<AtomicBool>,
    errors: Arc<Mutex<Vec<String>>>,
    handles: Vec<JoinHandle<ClientLog>>,
}

impl Load {
    /// Starts clients (numbered by `clients`: their ids are unique across
    /// loads of one test) of the leader found among `among`.
    fn start(
        f: &Finder,
        among: &[u64],
        clients: std::ops::Range<usize>,
        on_error: OnError,
        read_timeout: Duration,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(AtomicBool::new(false));
        let acked: Arc<Vec<AtomicU64>> =
            Arc::new(clients.clone().map(|_| AtomicU64::new(0)).collect());
        let errors = Arc::new(Mutex::new(Vec::new()));
        let handles = clients
            .enumerate()
            .map(|(i, t)| {
                let (f, among) = (f.clone(), among.to_vec());
                let (stop, acked, failed, errors) =
                    (stop.clone(), acked.clone(), failed.clone(), errors.clone());
                std::thread::spawn(move || {
                    run_client(
                        t,
                        &f,
                        &among,
                        on_error,
                        read_timeout,
                        &stop,
                        &acked[i],
                        &failed,
                        &errors,
                    )
                })
            })
            .collect();
        Load {
            stop,
            acked,
            failed,
            errors,
            handles,
        }
    }

    fn acked(&self) -> Vec<u64> {
        self.acked
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect()
    }

    /// Waits until every client had `each` more commands acknowledged.
    fn wait_progress(&self, f: &Finder, each: u64, what: &str) {
        let base = self.acked();
        f.wait(what, || {
            if self.failed.load(Ordering::Relaxed) {
                panic!(
                    "a client failed: {:?}\n{}",
                    self.errors.lock().unwrap(),
                    f.logs()
                );
            }
            let now = self.acked();
            if now.iter().zip(&base).all(|(n, b)| *n >= b + each) {
                Ok(())
            } else {
                Err(format!("acknowledged per client: {now:?} (from {base:?})"))
            }
        });
    }

    /// Stops the clients; their histories, and the errors they met.
    fn finish(self) -> (Vec<ClientLog>, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let logs = self
            .handles
            .into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect();
        let errors = std::mem::take(&mut *self.errors.lock().unwrap());
        (logs, errors)
    }
}

#[allow(clippy::too_many_arguments)]
fn run_client(
    t: usize,
    f: &Finder,
    among: &[u64],
    on_error: OnError,
    read_timeout: Duration,
    stop: &AtomicBool,
    acked: &AtomicU64,
    failed: &AtomicBool,
    errors: &Mutex<Vec<String>>,
) -> ClientLog {
    let mut log = ClientLog {
        client: t,
        ..Default::default()
    };
    let mut conn: Option<Resp> = None;
    let mut connected_once = false;
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let Some(c) = conn.as_mut() else {
            let Some((_, l)) = f.leader(among) else {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            };
            match Resp::connect_with(f.app(l), Duration::from_secs(2), read_timeout) {
                Ok(c) => {
                    if connected_once {
                        log.reconnects += 1;
                    }
                    connected_once = true;
                    conn = Some(c);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
            continue;
        };
        n += 1;
        let (what, res) = if n & 1 == 0 {
            let k = (n as usize / 2) % COUNTERS;
            log.incr_sent[k] += 1;
            let r = c.cmd(&[b"INCR", counter_key(k).as_bytes()]);
            if let Ok(Value::Int(v)) = r {
                log.incr_acked.push((k, v));
            }
            (format!("INCR {}", counter_key(k)), r)
        } else {
            let id = format!("{t}:{n}");
            log.push_sent.push(id.clone());
            let r = c.cmd(&[b"RPUSH", LIST.as_bytes(), id.as_bytes()]);
            if let Ok(Value::Int(len)) = r {
                log.push_acked.push((id.clone(), len));
            }
            (format!("RPUSH {LIST} {id}"), r)
        };
        match res {
            Ok(Value::Int(_)) => {
                acked.fetch_add(1, Ordering::Relaxed);
            }
            other => {
                errors
                    .lock()
                    .unwrap()
                    .push(format!("client {t}: {what}: {other:?}"));
                conn = None;
                if on_error == OnError::Stop {
                    failed.store(true, Ordering::Relaxed);
                    break;
                }
            }
        }
    }
    log
}

/// Checks the clients' histories against the data on `leader`.
fn check_history(f: &Finder, leader: u64, logs: &[ClientLog]) {
    let mut c = Resp::connect_with(
        f.app(leader),
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("connect to leader {leader}: {e}\n{}", f.logs()));
    let mut acked_total = 0;
    for k in 0..COUNTERS {
        let key = counter_key(k);
        let value = match c.cmd(&[b"GET", key.as_bytes()]).expect("GET") {
            Value::Bulk(b) => String::from_utf8(b).unwrap().parse::<i64>().unwrap(),
            Value::Null => 0,
            other => panic!("GET {key}: {other:?}"),
        };
        let sent: u64 = logs.iter().map(|l| l.incr_sent[k]).sum();
        let mut seen = HashSet::new();
        for l in logs {
            let mut prev = 0;
            for &(_, v) in l.incr_acked.iter().filter(|(kk, _)| *kk == k) {
                assert!(
                    seen.insert(v),
                    "two acknowledged INCR {key} returned {v}: an acknowledged INCR was lost"
                );
                assert!(
                    v > prev,
                    "client {}: INCR {key} returned {v} after {prev}",
                    l.client
                );
                assert!(v <= value, "an acknowledged INCR {key} returned {v}, but {key} is {value} on leader {leader}");
                prev = v;
            }
        }
        acked_total += seen.len();
        assert!(
            value as usize >= seen.len(),
            "{key} = {value} on leader {leader}, but {} INCRs were acknowledged",
            seen.len()
        );
        assert!(
            value as u64 <= sent,
            "{key} = {value} on leader {leader}, but only {sent} INCRs were sent"
        );
    }
    let list: Vec<String> = match c
        .cmd(&[b"LRANGE", LIST.as_bytes(), b"0", b"-1"])
        .expect("LRANGE")
    {
        Value::Array(items) => items
            .into_iter()
            .map(|i| match i {
                Value::Bulk(b) => String::from_utf8(b).unwrap(),
                other => panic!("LRANGE item {other:?}"),
            })
            .collect(),
        other => panic!("LRANGE {LIST}: {other:?}"),
    };
    let sent: HashSet<&str> = logs
        .iter()
        .flat_map(|l| l.push_sent.iter().map(|s| s.as_str()))
        .collect();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for item in &list {
        assert!(
            sent.contains(item.as_str()),
            "{LIST} holds {item}, which no client sent"
        );
        *count.entry(item.as_str()).or_default() += 1;
    }
    for (id, n) in &count {
        assert_eq!(*n, 1, "{id} is {n} times in {LIST} on leader {leader}");
    }
    let mut lens = HashSet::new();
    for l in logs {
        let mut prev = 0;
        for (id, len) in &l.push_acked {
            assert_eq!(
                count.get(id.as_str()),
                Some(&1),
                "acknowledged RPUSH {id} is missing from {LIST} on leader {leader}"
            );
            assert!(
                lens.insert(*len),
                "two acknowledged RPUSHes returned length {len}: one was lost"
            );
            assert!(
                *len > prev && *len as usize <= list.len(),
                "client {}: RPUSH returned {len}",
                l.client
            );
            prev = *len;
        }
        acked_total += l.push_acked.len();
    }
    eprintln!(
        "history ok on leader {leader}: {acked_total} acknowledged commands, {} list items, {} reconnects",
        list.len(),
        logs.iter().map(|l| l.reconnects).sum::<u64>()
    );
}

// ---------------------------------------------------------------------
// Clusters with ZooKeeper election

/// A loopback cluster electing through a private ZooKeeper; followers and
/// servers started, not yet waited for a leader.
fn zk_cluster(test: &str, nodes: usize, backup_clients: &str) -> (TestCluster, ZookeeperServer) {
    let mut c = TestCluster::new(
        test,
        Options {
            nodes,
            ..Options::default()
        },
    );
    let zk = c.start_zookeeper(SESSION_MS);
    if backup_clients != "allow" {
        c.set_backup_clients(backup_clients);
    }
    c.start_nodes();
    (c, zk)
}

fn kill_node(c: &mut TestCluster, id: u64) {
    c.kill_server(id);
    c.kill_follower(id);
}

fn without(ids: &[u64], gone: u64) -> Vec<u64> {
    ids.iter().copied().filter(|&i| i != gone).collect()
}

#[test]
fn leader_sigkill_loses_no_acknowledged_write() {
    let _serial = serial();
    let (mut c, _zk) = zk_cluster("fo-kill", 3, "allow");
    let f = Finder::new(&c.config_path, &c.dir);
    let all = f.ids();
    let old = f.wait_leader(&all, &[], "a first leader");
    let load = Load::start(&f, &all, 0..8, OnError::Reconnect, Duration::from_secs(20));
    load.wait_progress(&f, 30, "load on the first leader");

    kill_node(&mut c, old);
    let alive = without(&all, old);
    let new = f.wait_leader(&alive, &[old], "a new leader after SIGKILL of the leader");
    load.wait_progress(&f, 30, "every client to be served by the new leader");
    let (logs, errors) = load.finish();
    eprintln!(
        "leader {old} killed, {new} took over; client errors: {}",
        errors.len()
    );
    for l in &logs {
        assert!(
            l.reconnects >= 1,
            "client {} never reconnected after its leader died",
            l.client
        );
    }

    check_history(&f, new, &logs);
    f.wait_converged(new, &alive);
    f.assert_digests_agree(&alive);

    let json = cli_status(&c.config_path);
    assert_eq!(json["leader"], new, "lockstep status --json: {json}");
    assert_eq!(json["leader_app"], f.app(new).to_string(), "{json}");
    assert_eq!(json["healthy"], true, "{json}");
    let nodes = json["nodes"].as_array().expect("nodes");
    for n in nodes {
        let id = n["node"].as_u64().expect("node id");
        let role = n["role"].as_str().expect("role");
        let want = if id == old {
            "down"
        } else if id == new {
            "leader"
        } else {
            "backup"
        };
        assert_eq!(role, want, "node {id} in lockstep status --json: {json}");
    }
}

#[test]
fn leader_server_killed_alone_fails_over() {
    let _serial = serial();
    let (mut c, _zk) = zk_cluster("fo-srvkill", 3, "allow");
    let f = Finder::new(&c.config_path, &c.dir);
    let all = f.ids();
    let old = f.wait_leader(&all, &[], "a first leader");
    let load = Load::start(&f, &all, 0..6, OnError::Reconnect, Duration::from_secs(20));
    load.wait_progress(&f, 30, "load on the first leader");

    // Only the server dies (the OOM killer's kind of fault); its follower
    // runs on and must hand the leadership over by itself.
    c.kill_server(old);
    let alive = without(&all, old);
    let new = f.wait_leader(
        &alive,
        &[old],
        "a new leader after the leader's server died",
    );
    f.wait_role(old, "stale", new);
    let why = f.status(old).expect("status").stale_reason;
    assert!(
        why.as_deref()
            .is_some_and(|w| w.contains("server") && w.contains("exited")),
        "stale reason: {why:?}"
    );
    let table = Command::new(bin_dir().join("lockstep"))
        .args(["status", "--config"])
        .arg(&c.config_path)
        .output()
        .expect("run lockstep status");
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains(&format!("node {old} is stale: its server")),
        "{table}"
    );
    load.wait_progress(&f, 30, "every client to be served by the new leader");
    let (logs, _) = load.finish();
    check_history(&f, new, &logs);

    // Restarted, the node rebuilds its server from the log as a backup.
    c.kill_follower(old);
    c.restart_node(old);
    f.wait_role(old, "backup", new);
    f.wait_converged(new, &all);
    f.assert_digests_agree(&all);
}

/// A backup whose server never runs must not make a new leader hold
/// writes (`max_apply_lag` counts only backups that can apply): with the
/// old leader dead and the other backup serverless, writes go on, status
/// says the failover backlog grows, and once the server comes it catches
/// up with nothing acknowledged lost.
#[test]
fn leader_death_while_a_backup_has_no_server_keeps_writes_going() {
    let _serial = serial();
    let mut c = TestCluster::new(
        "fo-noserver",
        Options {
            // Small, so that holding writes would show within a few.
            extra: "max_apply_lag = 50\n".into(),
            ..Options::default()
        },
    );
    // A longer session than the other tests': a spurious session loss on
    // a loaded machine could hand the lead to node 3, which has no server.
    let _zk = c.start_zookeeper(3 * SESSION_MS);
    // Nodes 1 and 2 elect a leader; node 3's follower joins later (its
    // election turn comes last) and its server does not run at all.
    c.start_follower(1);
    c.start_follower(2);
    c.start_server(1);
    c.start_server(2);
    let f = Finder::new(&c.config_path, &c.dir);
    let all = f.ids();
    let old = f.wait_leader(&[1, 2], &[], "a first leader among nodes 1 and 2");
    let other = 3 - old;
    c.start_follower(3);
    f.wait_role_any(3, &["backup", "catching-up"], old);
    let load = Load::start(&f, &all, 0..4, OnError::Reconnect, Duration::from_secs(20));
    load.wait_progress(&f, 30, "load on the first leader");
    // Waited for: a backup counts while its apply reports keep coming
    // (every 50 ms, stale after a second), which a loaded host may delay.
    f.wait(
        &format!("node {old} to count node {other} as applying"),
        || {
            let s = f.status(old)?;
            match s.failover_backlog {
                None => Ok(()),
                Some(b) => Err(format!("failover_backlog {b:?}")),
            }
        },
    );

    kill_node(&mut c, old);
    let new = f.wait_leader(
        &[other, 3],
        &[old],
        "a new leader after SIGKILL of the leader",
    );
    assert_eq!(new, other, "node 3 (no server) was elected");
    // Far more than max_apply_lag entries: none may wait for node 3.
    load.wait_progress(&f, 100, "writes to go on with no backup applying");
    // `lockstep status` (JSON and text) says why a failover now would
    // inherit a growing backlog.
    f.wait("status to say the failover backlog grows", || {
        let json = cli_status(&c.config_path);
        let me = &json["nodes"][(new - 1) as usize];
        let why = me["failover_backlog"].as_str().unwrap_or_default();
        if !(why.starts_with("only 1 of 3 nodes can apply") && why.contains("nodes 1, 3 have")) {
            return Err(format!("{json}"));
        }
        let table = Command::new(bin_dir().join("lockstep"))
            .args(["status", "--config"])
            .arg(&c.config_path)
            .output()
            .map_err(|e| e.to_string())?;
        let table = String::from_utf8_lossy(&table.stdout).into_owned();
        let line = format!("node {new} leads: only 1 of 3 nodes can apply");
        table.contains(&line).then_some(()).ok_or(table)
    });

    // Node 3's server comes: it applies everything, the warning goes.
    c.start_server(3);
    f.wait(
        &format!("node {new} to count node 3 as applying"),
        || match f.status(new)?.failover_backlog {
            Some(w) if w.contains("nodes 1, 3") => Err(w),
            _ => Ok(()),
        },
    );
    load.wait_progress(&f, 30, "load with node 3 applying");
    let (logs, _) = load.finish();
    check_history(&f, new, &logs);
    f.wait_converged(new, &[new, 3]);
    f.assert_digests_agree(&[new, 3]);
}

#[test]
fn three_leader_kills_in_a_row() {
    leader_kills_in_a_row("fo-kill3", 5, 3);
}

/// Output commit's main risk is a reply released for an input a new view
/// then drops: many rounds of SIGKILL under load, every acknowledged write
/// checked, every replica's digest compared.
#[test]
fn twenty_leader_kills_under_load_lose_nothing() {
    leader_kills_in_a_row("fo-kill20", 3, 20);
}

/// SIGKILLs the leader `rounds` times under load, restarting each killed
/// node as a backup; checks that no acknowledged write was lost and that
/// every replica converged to the same digest.
fn leader_kills_in_a_row(test: &str, nodes: usize, rounds: usize) {
    let _serial = serial();
    let (mut c, _zk) = zk_cluster(test, nodes, "allow");
    let f = Finder::new(&c.config_path, &c.dir);
    let all = f.ids();
    let mut leader = f.wait_leader(&all, &[], "a first leader");
    let load = Load::start(&f, &all, 0..6, OnError::Reconnect, Duration::from_secs(20));
    for round in 1..=rounds {
        load.wait_progress(&f, 20, &format!("load before kill {round}"));
        kill_node(&mut c, leader);
        let next = f.wait_leader(
            &without(&all, leader),
            &[leader],
            &format!("a new leader after kill {round}"),
        );
        eprintln!("round {round}: leader {leader} killed, {next} took over");
        load.wait_progress(&f, 20, &format!("clients served after kill {round}"));
        // The killed node comes back (same data dir) as a backup: its
        // server restored from its snapshot, else a fresh one rebuilt from
        // the log.
        c.restart_node(leader);
        leader = f.wait_rejoined(leader, next);
    }
    load.wait_progress(&f, 20, "load after the last rejoin");
    let (logs, _) = load.finish();
    check_history(&f, leader, &logs);
    f.wait_converged(leader, &all);
    f.assert_digests_agree(&all);
}

#[test]
fn zookeeper_unreachable_at_start_is_a_clear_error() {
    let _serial = serial();
    let mut c = TestCluster::new("fo-nozk", Options::default());
    let addr = format!("127.0.0.1:{}", free_port());
    c.use_zookeeper(&addr, SESSION_MS);
    let err_path = c.dir.join("follower-1.stderr");
    let mut child = Command::new(bin_dir().join("lockstep-follower"))
        .arg("--config")
        .arg(&c.config_path)
        .args(["--node", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&err_path).unwrap())
        .spawn()
        .expect("spawn follower");
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > HANG {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the follower still runs with ZooKeeper unreachable at {addr}: {}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stderr = std::fs::read_to_string(&err_path).unwrap();
    assert!(
        !status.success(),
        "the follower exited successfully without ZooKeeper: {stderr}"
    );
    assert!(
        !stderr.contains("panicked"),
        "the follower panicked: {stderr}"
    );
    assert!(
        stderr
            .lines()
            .any(|l| l.to_lowercase().contains("zookeeper") && l.contains(&addr)),
        "no line of the follower's stderr names ZooKeeper and {addr}:\n{stderr}"
    );
    eprintln!("follower without ZooKeeper: {status}: {}", stderr.trim());
}

/// How ZooKeeper goes away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ZkLoss {
    /// Its process is killed (SIGKILL): connections close at once.
    Killed,
    /// Its process is frozen (SIGSTOP): connections stay open, nothing
    /// answers (as behind a partition).
    Frozen,
}

/// How long the loss tests keep ZooKeeper away: several session timeouts
/// (the old rule stepped the leader down after one).
const OUTAGE: Duration = Duration::from_millis(4 * SESSION_MS);

#[test]
fn zookeeper_killed_leader_keeps_serving_under_load() {
    let _serial = serial();
    zookeeper_loss_body("fo-zklost", ZkLoss::Killed);
}

#[test]
fn zookeeper_frozen_leader_keeps_serving_under_load() {
    let _serial = serial();
    zookeeper_loss_body("fo-zkfrozen", ZkLoss::Frozen);
}

/// ZooKeeper goes away under load for several session timeouts: every
/// client of the leader goes on without a single failed command (nobody
/// can claim a view meanwhile, so the leader keeps serving while its
/// majority acks), `lockstep status` says healthy and names ZooKeeper;
/// when ZooKeeper is back a leader serves and nothing acknowledged is lost.
fn zookeeper_loss_body(test: &str, loss: ZkLoss) {
    let (c, mut zk) = zk_cluster(test, 3, "allow");
    let f = Finder::new(&c.config_path, &c.dir);
    let all = f.ids();
    let old = f.wait_leader(&all, &[], "a first leader");
    let load = Load::start(&f, &all, 0..4, OnError::Stop, HANG);
    load.wait_progress(&f, 20, "load before ZooKeeper goes away");

    let group = nix::unistd::Pid::from_raw(zk.pid() as i32);
    match loss {
        ZkLoss::Killed => zk.kill(),
        ZkLoss::Frozen => {
            nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGSTOP).unwrap()
        }
    }
    let gone = Instant::now();
    load.wait_progress(&f, 20, "clients served while ZooKeeper is away");
    std::thread::sleep(OUTAGE.saturating_sub(gone.elapsed()));
    load.wait_progress(
        &f,
        20,
        "clients served several session timeouts after ZooKeeper went away",
    );
    let json = cli_status(&c.config_path);
    assert_eq!(json["healthy"], true, "status without ZooKeeper: {json}");
    assert_eq!(json["leader"], old, "status without ZooKeeper: {json}");
    let zk_problem = json["zookeeper_problem"].as_str().unwrap_or_default();
    assert!(
        zk_problem.contains("ZooKeeper unreachable at"),
        "status does not name ZooKeeper: {json}"
    );
    eprintln!(
        "ZooKeeper {loss:?} for {:?}: leader {old} serves; status: {zk_problem}",
        gone.elapsed()
    );

    let _zk = match loss {
        ZkLoss::Killed => {
            // Same data dir, same port.
            let port = zk.port();
            drop(zk);
            ZookeeperServer::start(&c.dir.join("zk"), port).expect("restart ZooKeeper")
        }
        ZkLoss::Frozen => {
            nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGCONT).unwrap();
            zk
        }
    };
    // Sessions and registrations come back by themselves: every node
    // reports a session again.
    f.wait("every node back in ZooKeeper", || {
        let json = cli_status(&c.config_path);
        match json["zookeeper_problem"].as_str() {
            None => Ok(()),
            Some(p) => Err(p.to_string()),
        }
    });
    let (logs, errors) = load.finish();
    assert!(
        errors.is_empty(),
        "clients failed while ZooKeeper was {loss:?} or after it came back: {errors:?}\n{}",
        f.logs()
    );
    let leader = f.wait_leader(&all, &[], "a serving leader after ZooKeeper came back");
    eprintln!("ZooKeeper back: node {leader} leads (node {old} before)");
    check_history(&f, leader, &logs);
    f.wait_converged(leader, &all);
    f.assert_digests_agree(&all);
}

#[test]
fn zookeeper_restarted_three_times_a_leader_is_back_each_time() {
    let _serial = serial();
    let (c, mut zk) = zk_cluster("fo-zkrestart", 3, "allow");
    let f = Finder::new(&c.config_path, &c.dir);
    let all = f.ids();
    f.wait_leader(&all, &[], "a first leader");
    let load = Load::start(&f, &all, 0..3, OnError::Reconnect, Duration::from_secs(20));
    for round in 0..3 {
        load.wait_progress(&f, 20, &format!("load before restart {round}"));
        let port = zk.port();
        zk.kill();
        drop(zk);
        // The second restart starts from an empty data dir: every session,
        // znode and the view counter are gone.
        let wiped = round == 1;
        if wiped {
            std::fs::remove_dir_all(c.dir.join("zk").join("data")).expect("wipe ZooKeeper data");
        }
        std::thread::sleep(Duration::from_millis(SESSION_MS));
        zk = ZookeeperServer::start(&c.dir.join("zk"), port).expect("restart ZooKeeper");
        f.wait(
            &format!("every node back in ZooKeeper after restart {round}"),
            || {
                let json = cli_status(&c.config_path);
                match json["zookeeper_problem"].as_str() {
                    None => Ok(()),
                    Some(p) => Err(p.to_string()),
                }
            },
        );
        let leader = f.wait_leader(&all, &[], &format!("a leader after restart {round}"));
        load.wait_progress(&f, 20, &format!("load after restart {round}"));
        eprintln!("ZooKeeper restart {round} (data wiped: {wiped}): node {leader} leads");
    }
    let (logs, errors) = load.finish();
    let leader = f.wait_leader(&all, &[], "a serving leader after the restarts");
    eprintln!(
        "after 3 ZooKeeper restarts: {} client errors, node {leader} leads",
        errors.len()
    );
    rebuild_stale_then_check(c, &f, leader, &logs);
}

/// Restarts every node but `leader` that reports stale (a leader deposed
/// while reads were in flight may hold a server that missed a committed
/// input: it says so and asks for a restart), then checks the clients'
/// histories, convergence and digests on every node.
fn rebuild_stale_then_check(mut c: TestCluster, f: &Finder, leader: u64, logs: &[ClientLog]) {
    let all = f.ids();
    for id in without(&all, leader) {
        if f.wait_role_any(id, &["backup", "stale"], leader) == "stale" {
            eprintln!("node {id} reports stale: restarting it, as its log asks");
            kill_node(&mut c, id);
            c.restart_node(id);
            f.wait_role(id, "backup", leader);
        }
    }
    check_history(f, leader, logs);
    f.wait_converged(leader, &all);
    f.assert_digests_agree(&all);
}

/// Busy-loop processes, killed (by pid) when dropped.
struct CpuHog(Vec<Child>);

impl CpuHog {
    /// Two busy loops per core, in a session of their own: another program
    /// on the host, as a service is. (Loops started in the followers' own
    /// session would take that session's CPU share, which docs/guide/your-server.md says
    /// a follower must not share with busy work: `lockstep up` gives every
    /// follower a session of its own.)
    fn start() -> CpuHog {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        CpuHog(
            (0..2 * cores)
                .map(|_| {
                    let null = std::fs::File::create("/dev/null").expect("/dev/null");
                    spawn_logged(
                        Command::new("sh").args(["-c", "while :; do :; done"]),
                        null,
                        Grouping::OwnSession,
                    )
                    .expect("start a busy loop")
                })
                .collect(),
        )
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// How long the hog runs.
const HOG_FOR: Duration = Duration::from_secs(60);

/// No failover without a fault: with busy loops on twice the cores beside
/// a ZooKeeper-elected cluster (the example's session timeout) for a
/// minute, the view never changes and the leader's clients never fail.
#[test]
fn cpu_hog_beside_the_cluster_changes_no_view() {
    let _serial = serial();
    let (c, _zk) = zk_cluster("fo-hog", 3, "allow");
    let f = Finder::new(&c.config_path, &c.dir);
    let all = f.ids();
    let leader = f.wait_leader(&all, &[], "a first leader");
    let view = f.status(leader).expect("leader status").view;
    let load = Load::start(&f, &all, 0..2, OnError::Stop, HANG);
    load.wait_progress(&f, 10, "load before the hog");
    let hog = CpuHog::start();
    let start = Instant::now();
    let mut checks = 0;
    while start.elapsed() < HOG_FOR {
        std::thread::sleep(Duration::from_secs(1));
        // A node that answers late is slow, not a fault: only the views of
        // those that answer are compared.
        for &id in &all {
            if let Ok(s) = f.status(id) {
                checks += 1;
                assert_eq!(
                    (s.view, s.leader),
                    (view, leader),
                    "node {id} moved to another view under CPU load alone\n{}",
                    f.logs()
                );
            }
        }
    }
    drop(hog);
    load.wait_progress(&f, 10, "load after the hog");
    let (logs, errors) = load.finish();
    assert!(
        errors.is_empty(),
        "clients of the leader failed under CPU load: {errors:?}\n{}",
        f.logs()
    );
    for &id in &all {
        let s = f.status(id).expect("status after the hog");
        assert_eq!(
            (s.view, s.leader),
            (view, leader),
            "node {id}\n{}",
            f.logs()
        );
    }
    eprintln!("CPU hog for {HOG_FOR:?}: view {view} kept, {checks} status answers compared");
    check_history(&f, leader, &logs);
}

#[test]
fn zookeeper_paused_past_session_timeout_cluster_recovers() {
    let _serial = serial();
    // A ZooKeeper that stalls (GC pause, overloaded host) longer than the
    // session timeout expires every session at once when it resumes.
    let (c, zk) = zk_cluster("fo-zkpause", 3, "allow");
    let f = Finder::new(&c.config_path, &c.dir);
    let all = f.ids();
    let old = f.wait_leader(&all, &[], "a first leader");
    let load = Load::start(&f, &all, 0..4, OnError::Reconnect, Duration::from_secs(20));
    load.wait_progress(&f, 20, "load before ZooKeeper pauses");
    let group = nix::unistd::Pid::from_raw(zk.pid() as i32);
    nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_millis(3 * SESSION_MS));
    nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGCONT).unwrap();
    load.wait_progress(&f, 20, "clients served again after the ZooKeeper pause");
    let leader = f.wait_leader(&all, &[], "a serving leader after the ZooKeeper pause");
    let (logs, errors) = load.finish();
    eprintln!(
        "ZooKeeper paused: leader {old} before, {leader} after; {} client errors",
        errors.len()
    );
    rebuild_stale_then_check(c, &f, leader, &logs);
}

fn backup_kill_body(test: &str, zookeeper: bool) {
    let (mut c, _zk) = if zookeeper {
        let (c, zk) = zk_cluster(test, 3, "allow");
        (c, Some(zk))
    } else {
        let mut c = TestCluster::new(test, Options::default());
        c.start_all();
        (c, None)
    };
    let f = Finder::new(&c.config_path, &c.dir);
    let all = f.ids();
    let leader = f.wait_leader(&all, &[], "a leader");
    let backup = *all.iter().rev().find(|&&i| i != leader).unwrap();
    let load = Load::start(&f, &all, 0..4, OnError::Stop, HANG);
    load.wait_progress(&f, 20, "load before the backup is killed");
    kill_node(&mut c, backup);
    load.wait_progress(&f, 50, "clients of the leader after a backup was killed");
    let (logs, errors) = load.finish();
    assert!(
        errors.is_empty(),
        "clients of the leader failed: {errors:?}\n{}",
        f.logs()
    );
    for l in &logs {
        assert_eq!(l.reconnects, 0, "client {} reconnected", l.client);
    }
    let alive = without(&all, backup);
    assert_eq!(
        f.leader(&alive).map(|(_, l)| l),
        Some(leader),
        "leadership moved\n{}",
        f.logs()
    );
    check_history(&f, leader, &logs);
    f.wait_converged(leader, &alive);
    f.assert_digests_agree(&alive);
    // The backup comes back (fresh server, same data dir; its log is
    // already in the current view) and catches up.
    c.restart_node(backup);
    f.wait_role(backup, "backup", leader);
    f.wait_converged(leader, &all);
    f.assert_digests_agree(&all);
}

#[test]
fn backup_kill_does_not_interrupt_leader_clients() {
    let _serial = serial();
    backup_kill_body("fo-bkill", true);
}

#[test]
fn backup_kill_does_not_interrupt_leader_clients_static_election() {
    let _serial = serial();
    backup_kill_body("fo-bkill-static", false);
}

// ---------------------------------------------------------------------
// Network namespaces

/// Prefix of every namespace this file creates (`<prefix><pid>-…`).
const NET_PREFIX: &str = "lockstep-fo-";

/// A standalone ZooKeeper inside namespace `ns`, listening on `addr`.
struct NetnsZk {
    child: Option<Child>,
}

impl NetnsZk {
    fn start(dir: &Path, ns: &Path, addr: SocketAddr) -> NetnsZk {
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let cfg = dir.join("zoo.cfg");
        std::fs::write(
            &cfg,
            lockstep_launcher::zookeeper::standalone_config(&dir.join("data"), addr, ""),
        )
        .unwrap();
        let log = File::create(dir.join("zookeeper.log")).unwrap();
        let child = spawn_in(
            ns,
            Command::new("/usr/share/zookeeper/bin/zkServer.sh")
                .arg("start-foreground")
                .arg(&cfg)
                .current_dir(dir)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log),
        )
        .expect("spawn ZooKeeper in its namespace");
        let mut zk = NetnsZk { child: Some(child) };
        let start = Instant::now();
        while !zookeeper_serving(addr) {
            if let Some(st) = zk.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("ZooKeeper exited ({st}):\n{}", logs_in(dir));
            }
            assert!(
                start.elapsed() < HANG,
                "ZooKeeper on {addr} does not serve:\n{}",
                logs_in(dir)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        zk
    }
}

impl Drop for NetnsZk {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // zkServer.sh start-foreground execs the JVM: this is the JVM.
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A cluster whose node N runs its follower and server inside namespace N
/// (tcp transport, ZooKeeper election).
struct NetnsCluster {
    name: String,
    dir: PathBuf,
    config_path: PathBuf,
    ns_paths: Vec<PathBuf>,
    followers: Vec<Option<Child>>,
    servers: Vec<Option<Child>>,
    bins: Binaries,
}

impl NetnsCluster {
    fn new(test: &str, dir: PathBuf, net: &Net, zookeeper: SocketAddr) -> NetnsCluster {
        let name = format!("t{}-{test}", std::process::id());
        let config_path = dir.join("cluster.toml");
        netns::netns_spec(&name, &dir, net, &cluster::commit_line())
            .election(ElectionSpec::ZooKeeper {
                connect: zookeeper.to_string(),
                session_timeout_ms: SESSION_MS,
            })
            .write(&config_path)
            .unwrap();
        let n = net.node_ips.len();
        NetnsCluster {
            name,
            dir,
            config_path,
            ns_paths: (1..=n as u64).map(|id| net.node_path(id)).collect(),
            followers: (0..n).map(|_| None).collect(),
            servers: (0..n).map(|_| None).collect(),
            bins: binaries(),
        }
    }

    fn log(&self, what: &str, id: u64) -> File {
        open_log(&self.dir.join(format!("{what}-{id}.log")), true).unwrap()
    }

    /// Spawns `cmd` inside node `id`'s namespace.
    fn spawn_in(&self, id: u64, cmd: &mut Command) -> Child {
        spawn_in(&self.ns_paths[id as usize - 1], cmd).expect("spawn in the node's namespace")
    }

    fn start_follower(&mut self, id: u64, f: &Finder) {
        let log = self.log("follower", id);
        let child = self.spawn_in(
            id,
            follower_command(&self.bins.follower, &self.config_path, id)
                .env("LOCKSTEP_LOG", "info")
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log),
        );
        self.followers[id as usize - 1] = Some(child);
        f.wait(&format!("follower {id} answering"), || {
            f.status(id).map(|_| ())
        });
    }

    /// Stops node `id`'s server and follower (SIGKILL) and starts both
    /// again: a fresh server rebuilt from the log.
    fn rebuild(&mut self, id: u64, f: &Finder) {
        for slot in [&mut self.servers, &mut self.followers] {
            if let Some(mut child) = slot[id as usize - 1].take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        self.start_follower(id, f);
        self.start_server(id, f);
    }

    fn start_server(&mut self, id: u64, f: &Finder) {
        let app = f.app(id);
        let data = self.dir.join(format!("server-{id}"));
        std::fs::create_dir_all(&data).unwrap();
        let log = self.log("server", id);
        let mut server = redis_on_host(app, &data);
        // Dated when the log began, as on every replica (see `lockstep run`).
        f.wait(&format!("node {id} to know when the log began"), || {
            lockstep_launcher::commands::region_origin(&f.config, id)
                .map(|_| ())
                .ok_or_else(|| "not yet".to_string())
        });
        under_preload(&mut server, &self.bins.preload, &self.config_path, id);
        let child = self.spawn_in(
            id,
            server
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log),
        );
        self.servers[id as usize - 1] = Some(child);
        f.wait(&format!("server {id} listening and attached"), || {
            std::net::TcpStream::connect_timeout(&app, Duration::from_secs(1))
                .map_err(|e| e.to_string())?;
            match f.status(id)?.server_pid {
                0 => Err("not attached".into()),
                _ => Ok(()),
            }
        });
    }
}

impl Drop for NetnsCluster {
    fn drop(&mut self) {
        let children = self.servers.iter_mut().chain(self.followers.iter_mut());
        netns::tear_down(
            children.filter_map(|c| c.as_mut()),
            &self.name,
            self.ns_paths.len() as u64,
            &self.dir,
        );
    }
}

/// What the client inside the isolated leader's namespace saw.
#[derive(Debug, Default)]
struct IsolatedClient {
    /// SETs answered OK: (key, value).
    acked: Vec<(String, String)>,
    /// Every key it sent a SET for during the isolation.
    sent: Vec<String>,
    /// How its connection ended (or "stopped").
    end: String,
}

/// A 3-node tcp cluster, each node in a network namespace of its own, and
/// ZooKeeper in another; followers and servers started. Fields drop in
/// order: processes first, the network last.
struct NetnsRun {
    f: Finder,
    c: NetnsCluster,
    _zk: NetnsZk,
    net: Net,
    all: Vec<u64>,
}

impl NetnsRun {
    /// Starts it on `10.213.<subnet>.0/24`. The calling thread (and
    /// the client threads it starts) lives in the client namespace from
    /// then on: it reaches every node and ZooKeeper through the bridge,
    /// like any outside client.
    fn start(test: &str, subnet: u8) -> NetnsRun {
        let net = Net::required(NET_PREFIX, subnet, 3, &[("zk", 200)]);
        enter_netns_at(&Net::path(&net.client_ns)).expect("enter the client namespace");
        let dir = std::env::temp_dir().join(format!("lockstep-t{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (zk_ns, zk_ip) = net.host("zk").expect("the zk host");
        let zk_addr = SocketAddr::from((zk_ip, 2181));
        let zk = NetnsZk::start(&dir.join("zk"), &Net::path(zk_ns), zk_addr);
        let mut c = NetnsCluster::new(test, dir, &net, zk_addr);
        let f = Finder::new(&c.config_path, &c.dir);
        let all = f.ids();
        for &id in &all {
            c.start_follower(id, &f);
        }
        for &id in &all {
            c.start_server(id, &f);
        }
        NetnsRun {
            f,
            c,
            _zk: zk,
            net,
            all,
        }
    }
}

#[test]
fn isolated_leader_cannot_ack_and_rejoins() {
    let _serial = serial();
    // Bound in this order so that they drop in the struct's order.
    let NetnsRun {
        net,
        _zk,
        mut c,
        f,
        all,
    } = NetnsRun::start("fo-netns", 78);
    let old = f.wait_leader(&all, &[], "a first leader");
    // Load on the first leader, stopped before the isolation: then nothing
    // is in flight when the link goes down, and the only input the isolated
    // leader holds beyond the majority is the isolated client's. (With
    // load in flight, an entry the backups stored but whose acks were cut
    // off is committed by the new view without the old leader's server
    // having consumed it: that node then reports "stale" and needs a
    // restart, by design.)
    let before = Load::start(&f, &all, 0..4, OnError::Reconnect, Duration::from_secs(10));
    before.wait_progress(&f, 20, "load on the first leader");
    let (mut logs, _) = before.finish();

    // A client inside the old leader's namespace: it still reaches its
    // server after the link is down.
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let app = f.app(old);
    let iso = {
        let stop = stop.clone();
        in_netns(net.node_path(old), move || {
            let mut out = IsolatedClient::default();
            let mut conn = Resp::connect_with(app, Duration::from_secs(2), Duration::from_secs(2))
                .expect("connect inside the namespace");
            conn.set_read_timeout(Duration::from_secs(60)).unwrap();
            let r = conn
                .cmd(&[b"SET", b"iso:pre", b"before"])
                .expect("SET before isolation");
            assert_eq!(r, Value::Simple("OK".into()), "SET before isolation");
            out.acked.push(("iso:pre".into(), "before".into()));
            conn.set_read_timeout(Duration::from_secs(2)).unwrap();
            ready_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            let mut n = 0;
            'conn: while !stop.load(Ordering::Relaxed) {
                let (key, value) = (
                    format!("iso:{n}"),
                    format!("isolated-{}-{n}", std::process::id()),
                );
                out.sent.push(key.clone());
                if let Err(e) = conn.send(&[b"SET", key.as_bytes(), value.as_bytes()]) {
                    out.end = format!("send: {e}");
                    return out;
                }
                loop {
                    match conn.read() {
                        Ok(Value::Simple(s)) if s == "OK" => {
                            out.acked.push((key, value));
                            n += 1;
                            continue 'conn;
                        }
                        Ok(other) => {
                            out.end = format!("answered {other:?}");
                            return out;
                        }
                        Err(e) if is_timeout(&e) => {
                            if stop.load(Ordering::Relaxed) {
                                break 'conn;
                            }
                        }
                        Err(e) => {
                            out.end = e.to_string();
                            return out;
                        }
                    }
                }
            }
            out.end = "stopped while waiting".into();
            out
        })
        .expect("enter the old leader's namespace")
    };
    ready_rx
        .recv_timeout(HANG)
        .expect("the client in the leader's namespace");

    net.link(old, false)
        .expect("take the old leader's link down");
    go_tx.send(()).unwrap();
    let majority = without(&all, old);
    let new = f.wait_leader(&majority, &[old], "the majority to elect a new leader");
    eprintln!("leader {old} isolated; {new} leads the majority");
    let load = Load::start(
        &f,
        &majority,
        100..104,
        OnError::Reconnect,
        Duration::from_secs(10),
    );
    load.wait_progress(&f, 20, "clients served by the new leader");

    // Did the isolated leader notice that it lost ZooKeeper? (Reported, not
    // asserted: the fencing above is what keeps it from acknowledging.)
    let seen = {
        let f = f.clone();
        in_netns(net.node_path(old), move || f.status(old))
            .expect("enter the old leader's namespace")
            .join()
            .unwrap()
    };
    eprintln!(
        "isolated old leader {old} before the link comes back: {}",
        match seen {
            Ok(s) => format!(
                "role {} view {} leader {} persisted {} committed {}",
                s.role, s.view, s.leader, s.persisted, s.committed
            ),
            Err(e) => e,
        }
    );
    net.link(old, true).expect("bring the old leader's link up");
    if cluster::commit_mode() == "output" {
        // Output commit: the isolated leader's server executed the
        // isolated client's SETs at once (their replies were held), and
        // the new view dropped them. The node must say so and be rebuilt.
        f.wait_role(old, "stale", new);
        let why = f.status(old).expect("status").stale_reason;
        assert!(
            why.as_deref().is_some_and(|w| w.contains("dropped")),
            "stale reason: {why:?}"
        );
        stop.store(true, Ordering::Relaxed);
        c.rebuild(old, &f);
    }
    f.wait_role(old, "backup", new);
    stop.store(true, Ordering::Relaxed);
    let isolated = iso.join().expect("isolated client");
    eprintln!(
        "client of the isolated leader: {} acknowledged SETs (incl. the one before isolation), ended: {}",
        isolated.acked.len(),
        isolated.end
    );
    load.wait_progress(&f, 10, "load after the old leader rejoined");
    logs.extend(load.finish().0);

    let mut r =
        Resp::connect_with(f.app(new), Duration::from_secs(2), Duration::from_secs(60)).unwrap();
    for (key, value) in &isolated.acked {
        assert_eq!(
            r.cmd(&[b"GET", key.as_bytes()]).unwrap(),
            Value::Bulk(value.clone().into_bytes()),
            "the isolated leader acknowledged SET {key} {value}, but leader {new} does not have it\n{}",
            f.logs()
        );
    }
    check_history(&f, new, &logs);
    f.wait_converged(new, &all);
    // Before the digests, the precise question: does any node's server hold
    // a write of the isolation that the new leader does not?
    for key in &isolated.sent {
        let on: Vec<(u64, Option<String>)> =
            all.iter().map(|&id| (id, get(f.app(id), key))).collect();
        let leader_has = &on.iter().find(|(id, _)| *id == new).unwrap().1;
        assert!(
            on.iter().all(|(_, v)| v == leader_has),
            "SET {key}, sent to the isolated leader {old} and never acknowledged, differs between servers: {on:?} \
             (a node applied a write the majority does not have)\n{}",
            f.logs()
        );
    }
    f.assert_digests_agree(&all);
}

/// `GET key` on the server at `addr` (None: nil).
fn get(addr: SocketAddr, key: &str) -> Option<String> {
    let mut c = Resp::connect_with(addr, Duration::from_secs(2), Duration::from_secs(30))
        .expect("connect for GET");
    match c.cmd(&[b"GET", key.as_bytes()]).expect("GET") {
        Value::Bulk(b) => Some(String::from_utf8_lossy(&b).into_owned()),
        Value::Null => None,
        other => panic!("GET {key} answered {other:?}"),
    }
}

/// No flapping on blips: the leader's link (ZooKeeper and peers alike) goes
/// down for half the session timeout and comes back. ZooKeeper keeps the
/// session, so the view stays, the same node leads, and writes go on — with
/// nothing acknowledged lost. (Writes stall while the link is down: the
/// leader cannot reach a majority; that is the price of consistency.)
#[test]
fn a_blip_shorter_than_the_session_timeout_changes_no_view() {
    let _serial = serial();
    // Bound in this order so that they drop in the struct's order.
    let NetnsRun {
        net,
        _zk,
        c: _c,
        f,
        all,
    } = NetnsRun::start("fo-blip", 79);
    let leader = f.wait_leader(&all, &[], "a first leader");
    let view = f.status(leader).expect("leader status").view;
    let load = Load::start(&f, &all, 0..4, OnError::Reconnect, Duration::from_secs(10));
    load.wait_progress(&f, 20, "load on the leader");
    for round in 0..3 {
        net.link(leader, false)
            .expect("take the leader's link down");
        std::thread::sleep(Duration::from_millis(SESSION_MS / 2));
        net.link(leader, true).expect("bring the leader's link up");
        load.wait_progress(&f, 20, "load after the blip");
        let now = f.leader(&all);
        assert_eq!(
            now,
            Some((view, leader)),
            "blip {round} of {} ms (session timeout {SESSION_MS} ms) changed the view\n{}\n{}",
            SESSION_MS / 2,
            f.describe(),
            f.logs()
        );
        // Each blip on its own: ZooKeeper's client reconnects and pings
        // before the next one (back-to-back blips add up to an outage).
        std::thread::sleep(Duration::from_millis(SESSION_MS));
    }
    let (logs, _) = load.finish();
    check_history(&f, leader, &logs);
    f.wait_converged(leader, &all);
    f.assert_digests_agree(&all);
}
