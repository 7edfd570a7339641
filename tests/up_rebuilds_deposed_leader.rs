//! Issue 11: a leader deposed while its server had executed an input that
//! never committed is rebuilt by `lockstep up`, converges to the new
//! leader's `DEBUG DIGEST`, and no acknowledged write is lost.
//!
//! The scenario, driven through `lockstep up` with ZooKeeper election (a
//! private ZooKeeper `up` starts itself), each step checked through the
//! nodes' status rather than by sleeping:
//!
//! 1. three nodes; acknowledged SETs through the leader L;
//! 2. SIGSTOP both backups' followers: nothing new can commit;
//! 3. a client connects to L and sends `SET dropped 1`; L's follower logs
//!    what L's server read (its `persisted` passes its `committed`); no
//!    reply comes. In output mode L's server has executed the SET and its
//!    reply is held; in input mode the server has not seen it (it is not
//!    even handed the connection before its ACCEPT commits);
//! 4. SIGSTOP L's follower (its ZooKeeper session expires), then SIGKILL
//!    both backups' followers: `up` restarts those two nodes. A restarted
//!    follower resets its region, so the `SET dropped` entry L posted into
//!    their rings (never persisted: their followers were stopped before it
//!    was sent) is gone, and the two form a newer view without L;
//! 5. acknowledged SETs through the new leader;
//! 6. SIGCONT L's follower: it learns it was deposed. Output mode: its
//!    server ran an input the new view dropped, so it reports `stale`
//!    ("... which the new view dropped") and `up` restarts it. Input mode:
//!    its server never saw the input, so it rejoins in place as a backup;
//! 7. every acknowledged SET is on every node, `dropped` on none, the held
//!    client never saw `+OK`, DEBUG DIGEST agrees on all three, no
//!    divergence.
//!
//! Durations only bound how long a step may take before the test reports
//! a hang (with `up`'s output and the nodes' logs); nothing asserts speed.

use lockstep_testkit::cluster;

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cluster::*;
use lockstep_common::control::NodeStatus;
use lockstep_common::Config;
use lockstep_testkit::poll::poll_until;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// Bound on every wait: reaching it means a hang, not slowness (debug
/// builds, a JVM and six processes on a busy 2-core machine).
const HANG: Duration = Duration::from_secs(240);
/// How long `up` may take to stop after SIGINT before it is killed.
const EXIT_LIMIT: Duration = Duration::from_secs(120);
/// `election.session_timeout_ms`.
const SESSION_MS: u64 = 1500;
/// How long the held SET must go unanswered (it cannot commit at all
/// while the backups are stopped: any reply would be a bug).
const NO_REPLY_FOR: Duration = Duration::from_millis(500);

const REDIS_SERVER: &str = r#"server = ["redis-server", "--port", "{port}", "--bind", "{host}", "--save", "", "--appendonly", "no", "--dir", "{data}", "--enable-debug-command", "yes"]"#;

// ---------------------------------------------------------------------
// `lockstep up`, and cleanup of what the test stopped

/// A running `lockstep up` (in its own process group), its stdout and
/// stderr collected. Dropping it first resumes every process the test
/// stopped, then interrupts `up` (SIGKILL to its group if it does not
/// exit), then kills by pid whatever process of this test's cluster is
/// still left: a failing test leaves nothing running or stopped.
struct Up {
    child: Option<Child>,
    out: Arc<Mutex<String>>,
    /// Processes this test SIGSTOPped and has not resumed or killed.
    stopped: Vec<i32>,
    /// The test's directory: every process of the cluster mentions it.
    dir: String,
}

impl Up {
    fn spawn(tc: &TestCluster) -> Up {
        let mut child = Command::new(bin_dir().join("lockstep"))
            .arg("up")
            .arg(&tc.config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("spawn lockstep up");
        let out = collect_output(&mut child);
        Up {
            child: Some(child),
            out,
            stopped: Vec::new(),
            dir: tc.dir.display().to_string(),
        }
    }

    fn output(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    fn mark(&self) -> usize {
        self.out.lock().unwrap().len()
    }

    /// Waits for a line after `mark` containing `pat`; panics with `why()`
    /// if `up` exits first or after [`HANG`].
    fn wait_line_from(&mut self, mark: usize, pat: &str, why: &dyn Fn() -> String) -> String {
        let start = Instant::now();
        loop {
            if let Some(l) = self.output()[mark..].lines().find(|l| l.contains(pat)) {
                return l.to_string();
            }
            if let Ok(Some(st)) = self.child.as_mut().unwrap().try_wait() {
                std::thread::sleep(Duration::from_millis(200));
                panic!(
                    "lockstep up exited ({st}) before printing {pat:?}:\n{}\n{}",
                    self.output(),
                    why()
                );
            }
            assert!(
                start.elapsed() < HANG,
                "no {pat:?} from lockstep up within {HANG:?}:\n{}\n{}",
                self.output(),
                why()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGSTOPs `pid` (remembered, so that a failing test resumes it) and
    /// waits until every thread of it is stopped.
    fn sigstop(&mut self, pid: i32) {
        self.stopped.push(pid);
        kill(Pid::from_raw(pid), Signal::SIGSTOP).expect("SIGSTOP");
        let start = Instant::now();
        while !all_threads_stopped(pid) {
            assert!(
                start.elapsed() < HANG,
                "pid {pid} did not stop after SIGSTOP"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn sigcont(&mut self, pid: i32) {
        kill(Pid::from_raw(pid), Signal::SIGCONT).expect("SIGCONT");
        self.stopped.retain(|&p| p != pid);
    }

    fn sigkill(&mut self, pid: i32) {
        kill(Pid::from_raw(pid), Signal::SIGKILL).expect("SIGKILL");
        self.stopped.retain(|&p| p != pid);
    }

    /// Ctrl-C: SIGINT, then wait for the exit.
    fn interrupt(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("lockstep up runs");
        kill(Pid::from_raw(c.id() as i32), Signal::SIGINT).expect("SIGINT");
        let start = Instant::now();
        loop {
            if let Some(st) = c.try_wait().expect("try_wait") {
                cluster::wait_output_complete(&self.out, Duration::from_secs(10));
                return st;
            }
            if start.elapsed() > EXIT_LIMIT {
                self.child = Some(c);
                panic!(
                    "lockstep up did not exit within {EXIT_LIMIT:?} of SIGINT:\n{}",
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        for &pid in &self.stopped {
            let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
        }
        self.stopped.clear();
        if let Some(mut c) = self.child.take() {
            let pid = Pid::from_raw(c.id() as i32);
            let _ = kill(pid, Signal::SIGINT);
            let start = Instant::now();
            while start.elapsed() < EXIT_LIMIT {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            // Its group (it leads it); its children get SIGTERM from the
            // kernel when it dies (parent-death signal).
            let _ = killpg(pid, Signal::SIGKILL);
            let _ = c.wait();
        }
        // Whatever of this test's cluster is still alive (the test dir is
        // this test's own: each of these was started for it).
        let start = Instant::now();
        loop {
            let left = processes_mentioning(&self.dir);
            if left.is_empty() || start.elapsed() > Duration::from_secs(30) {
                break;
            }
            for p in left {
                if let Some(pid) = p.split(':').next().and_then(|s| s.parse::<i32>().ok()) {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Every thread of `pid` is in the stopped state (`T` in /proc stat).
fn all_threads_stopped(pid: i32) -> bool {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for t in rd.flatten() {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let Some(state) = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.trim().chars().next())
        else {
            continue;
        };
        if state != 'T' && state != 't' {
            return false;
        }
        any = true;
    }
    any
}

/// Checks that `pid` is the follower of node `id` of this test's cluster
/// before the test signals it.
fn assert_follower(pid: u64, id: u64, config_path: &std::path::Path) {
    assert_ne!(pid, 0, "node {id} reports no follower pid");
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmd: Vec<String> = cmd
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).to_string())
        .collect();
    let cfg = config_path.display().to_string();
    let canon = config_path
        .canonicalize()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    assert!(
        cmd.first()
            .is_some_and(|c| c.ends_with("lockstep-follower"))
            && cmd.iter().any(|a| *a == cfg || *a == canon)
            && cmd
                .windows(2)
                .any(|w| w[0] == "--node" && w[1] == id.to_string()),
        "pid {pid} is not node {id}'s follower: {cmd:?}"
    );
}

// ---------------------------------------------------------------------
// Status and data

struct Nodes {
    config: Config,
    log_dir: std::path::PathBuf,
}

impl Nodes {
    fn status(&self, id: u64) -> Result<NodeStatus, String> {
        lockstep_common::control::query_status(&self.config, id, Duration::from_secs(1))
    }

    fn app(&self, id: u64) -> SocketAddr {
        self.config.node(id).expect("node").app
    }

    /// The leader of the highest view the nodes of `among` report, when
    /// it is among them and says itself that it leads that view.
    fn leader(&self, among: &[u64]) -> Option<(u64, u64)> {
        find_leader(&self.config, among, Duration::from_secs(1))
    }

    /// One line per node and the tail of every log under data_dir/logs
    /// (followers, servers) and of ZooKeeper's.
    fn describe(&self) -> String {
        let mut out = String::new();
        for id in self.config.ids() {
            match self.status(id) {
                Ok(s) => out.push_str(&format!("node {id}: {s:?}\n")),
                Err(e) => out.push_str(&format!("node {id}: no status ({e})\n")),
            }
        }
        let mut paths: Vec<std::path::PathBuf> = std::fs::read_dir(&self.log_dir)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        paths.sort();
        paths.push(self.config.data_dir.join("zookeeper").join("zookeeper.log"));
        for p in paths {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            // A follower stopped for a while finds a backlog of connections
            // their senders gave up on: one line for all of them.
            let noise = |l: &&str| l.contains("failed to fill whole buffer");
            let skipped = text.lines().filter(noise).count();
            let tail: Vec<&str> = text.lines().filter(|l| !noise(l)).rev().take(40).collect();
            out.push_str(&format!("--- {}\n", p.display()));
            if skipped > 0 {
                out.push_str(&format!(
                    "({skipped} lines about connections closed during the handshake left out)\n"
                ));
            }
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// Polls `cond` until it holds; panics with the last reason, `up`'s
    /// output and the logs after [`HANG`].
    fn wait(&self, up: &Up, what: &str, cond: impl FnMut() -> Result<(), String>) {
        if let Err(last) = poll_until(HANG, Duration::from_millis(100), cond) {
            panic!(
                "timed out waiting for {what} (last: {last})\nlockstep up:\n{}\n{}",
                up.output(),
                self.describe()
            );
        }
    }
}

fn connect(addr: SocketAddr) -> Resp {
    Resp::connect_with(addr, Duration::from_secs(5), Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
}

fn get(addr: SocketAddr, key: &str) -> Option<String> {
    match connect(addr).cmd(&[b"GET", key.as_bytes()]) {
        Ok(Value::Bulk(b)) => Some(String::from_utf8_lossy(&b).into_owned()),
        Ok(Value::Null) => None,
        other => panic!("GET {key} at {addr} answered {other:?}"),
    }
}

fn digest(addr: SocketAddr) -> Result<String, String> {
    let mut c = Resp::connect_with(addr, Duration::from_secs(5), Duration::from_secs(60))
        .map_err(|e| e.to_string())?;
    match c.cmd(&[b"DEBUG", b"DIGEST"]) {
        Ok(Value::Simple(s)) => Ok(s),
        other => Err(format!("{other:?}")),
    }
}

/// SETs `prefix:0..n` through `addr`, each acknowledged; returns them.
fn acked_sets(addr: SocketAddr, prefix: &str, n: usize) -> Vec<(String, String)> {
    let mut c = connect(addr);
    (0..n)
        .map(|i| {
            let (k, v) = (
                format!("{prefix}:{i}"),
                format!("{prefix}-{i}-{}", std::process::id()),
            );
            assert_eq!(
                c.cmd(&[b"SET", k.as_bytes(), v.as_bytes()])
                    .unwrap_or_else(|e| panic!("SET {k} through {addr}: {e}")),
                Value::Simple("OK".into()),
                "SET {k} through {addr}"
            );
            (k, v)
        })
        .collect()
}

/// The client whose `SET dropped 1` can never commit: reads until a reply,
/// the end of its connection, or `stop`; returns what it saw.
fn held_client(mut c: Resp, stop: Arc<AtomicBool>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        c.set_read_timeout(Duration::from_secs(1)).unwrap();
        loop {
            match c.read() {
                Ok(r) => return format!("reply {r:?}"),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if stop.load(Ordering::Relaxed) {
                        return "no reply, connection still open".into();
                    }
                }
                Err(e) => return format!("connection ended: {e}"),
            }
        }
    })
}

// ---------------------------------------------------------------------

#[test]
fn up_rebuilds_a_deposed_leader_whose_server_ran_a_dropped_input() {
    let mode = commit_mode();
    let mut tc = TestCluster::new(
        "updeposed",
        Options {
            extra: REDIS_SERVER.to_string(),
            ..Options::default()
        },
    );
    // A port none of the nodes took; nothing answers there, so `up`
    // starts a private ZooKeeper on it (and stops it on Ctrl-C).
    let zk_port = SparePorts::of(&tc).next_port();
    tc.use_zookeeper(&format!("127.0.0.1:{zk_port}"), SESSION_MS);
    let config = tc.config();
    let nodes = Nodes {
        log_dir: config.data_dir.join("logs"),
        config,
    };
    let all: Vec<u64> = nodes.config.ids().collect();

    let mut up = Up::spawn(&tc);
    let why = || nodes.describe();
    up.wait_line_from(0, "ready", &why);
    assert!(
        up.output().contains("starting a private one"),
        "lockstep up did not start its own ZooKeeper:\n{}",
        up.output()
    );

    // 1. A leader; acknowledged writes through it.
    let mut first = (0, 0);
    nodes.wait(&up, "a first leader", || {
        first = nodes.leader(&all).ok_or("no node leads")?;
        Ok(())
    });
    let (view1, old) = first;
    let backups: Vec<u64> = all.iter().copied().filter(|&i| i != old).collect();
    eprintln!("node {old} leads view {view1}; backups {backups:?}; commit = {mode}");
    let mut acked = acked_sets(nodes.app(old), "before", 20);

    // 2. Both backups' followers stop: no entry can commit from here on.
    let old_follower = nodes
        .status(old)
        .expect("status of the leader")
        .follower_pid;
    assert_follower(old_follower, old, &tc.config_path);
    let mut backup_followers = Vec::new();
    for &b in &backups {
        let pid = nodes
            .status(b)
            .unwrap_or_else(|e| panic!("status of node {b}: {e}"))
            .follower_pid;
        assert_follower(pid, b, &tc.config_path);
        up.sigstop(pid as i32);
        backup_followers.push(pid as i32);
    }
    let before_set = nodes.status(old).expect("status of the leader");

    // 3. The SET that never commits: L's follower logs what L's server
    //    read (persisted moves past committed), and no reply comes.
    //    (Output mode: L's server has executed it and holds the reply;
    //    input mode: nothing is handed to the server before it commits.)
    let mut held = Resp::connect_with(nodes.app(old), Duration::from_secs(5), NO_REPLY_FOR)
        .expect("connect to the leader");
    held.send(&[b"SET", b"dropped", b"1"])
        .expect("send SET dropped");
    // Output mode: the connection's ACCEPT and the SET's bytes are logged
    // (the server read both at once). Input mode: the ACCEPT waits for its
    // commit, so the server has not even read the SET; and a timer turn's
    // TICK logged after the backups stopped (it can never commit) holds the
    // server before it even accepts: then nothing more is logged, and any
    // entry above the commit point is the one that stays uncommitted.
    let logged_enough = |s: &NodeStatus| {
        if mode == "output" {
            s.persisted >= before_set.persisted + 2
        } else {
            s.persisted > before_set.committed
        }
    };
    let mut logged = before_set.clone();
    nodes.wait(&up, "the leader to log SET dropped", || {
        logged = nodes.status(old)?;
        if logged_enough(&logged) && logged.persisted > logged.committed {
            Ok(())
        } else {
            Err(format!("leader: {logged:?}"))
        }
    });
    match held.read() {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!(
            "SET dropped, which no backup stored, got {other:?} within {NO_REPLY_FOR:?}\n{}",
            nodes.describe()
        ),
    }
    assert_eq!(
        logged.view, view1,
        "the leader changed view meanwhile: {logged:?}"
    );
    eprintln!(
        "leader {old} logged SET dropped: persisted {} committed {}",
        logged.persisted, logged.committed
    );
    let stop_held = Arc::new(AtomicBool::new(false));
    let held = held_client(held, stop_held.clone());

    // 4. L's follower stops (its ZooKeeper session expires); both backups'
    //    followers die. `up` restarts the two backups: fresh followers
    //    reset their regions (dropping the unpersisted SET L posted into
    //    their rings), fresh servers replay their RocksDB logs, and the
    //    two elect a new leader without L.
    up.sigstop(old_follower as i32);
    let mark = up.mark();
    for &pid in &backup_followers {
        up.sigkill(pid);
    }
    for &b in &backups {
        let down = up.wait_line_from(mark, &format!("node {b} is down"), &why);
        assert!(down.contains("restarting it"), "{down}");
    }
    for &b in &backups {
        up.wait_line_from(mark, &format!("node {b} back as"), &why);
    }

    // 5. A newer view led by one of them; acknowledged writes through it.
    let mut second = (0, 0);
    nodes.wait(
        &up,
        "a new leader among the restarted nodes",
        || match nodes.leader(&backups) {
            Some((v, l)) if v > view1 => {
                second = (v, l);
                Ok(())
            }
            other => Err(format!("{other:?}")),
        },
    );
    let (view2, new) = second;
    eprintln!("node {new} leads view {view2}");
    assert_eq!(
        get(nodes.app(new), "dropped"),
        None,
        "the new leader has SET dropped, which never committed"
    );
    acked.extend(acked_sets(nodes.app(new), "after", 20));

    // 6. L's follower resumes and learns it was deposed.
    let mark = up.mark();
    up.sigcont(old_follower as i32);
    if mode == "output" {
        // Its server executed SET dropped, which the new view dropped: the
        // node is stale, and `up` rebuilds it.
        let stale = up.wait_line_from(mark, &format!("node {old} is stale"), &why);
        assert!(
            stale.contains("dropped") && stale.contains("restarting it"),
            "{stale}"
        );
        up.wait_line_from(mark, &format!("starting follower of node {old}"), &why);
        up.wait_line_from(mark, &format!("starting server of node {old}"), &why);
        let back = up.wait_line_from(mark, &format!("node {old} back as"), &why);
        assert!(back.contains("back as backup"), "{back}");
    }
    nodes.wait(&up, &format!("node {old} to follow node {new}"), || {
        let s = nodes.status(old)?;
        if s.role == "backup" && s.leader == new && s.view >= view2 {
            Ok(())
        } else {
            Err(format!("{s:?}"))
        }
    });
    if mode == "input" {
        // Its server never saw SET dropped: it rejoined in place.
        let out = up.output()[mark..].to_string();
        assert!(
            !out.contains(&format!("node {old} is stale"))
                && !out.contains(&format!("node {old} is down")),
            "input mode: the deposed leader should rejoin in place, but:\n{out}\n{}",
            nodes.describe()
        );
    }

    // 7. Everything acknowledged is everywhere; SET dropped nowhere.
    acked.extend(acked_sets(nodes.app(new), "rejoined", 5));
    nodes.wait(&up, "every node to apply the new leader's log", || {
        let l = nodes.status(new)?;
        for &id in &all {
            let s = nodes.status(id)?;
            if s.view != l.view || s.persisted < l.persisted || s.applied < l.persisted {
                return Err(format!("node {id}: {s:?}; leader: {l:?}"));
            }
        }
        Ok(())
    });
    // Every node's view of the data first, then one failure naming all
    // that is wrong (which keys each node lacks, where `dropped` is).
    let mut wrong = Vec::new();
    for &id in &all {
        let mut c = connect(nodes.app(id));
        let mut missing = Vec::new();
        for (k, v) in &acked {
            let got = c.cmd(&[b"GET", k.as_bytes()]).expect("GET");
            if got != Value::Bulk(v.clone().into_bytes()) {
                missing.push(format!("{k} ({got:?})"));
            }
        }
        if !missing.is_empty() {
            wrong.push(format!(
                "node {id} lacks {} of the {} acknowledged SETs: {}",
                missing.len(),
                acked.len(),
                missing.join(", ")
            ));
        }
        let d = c.cmd(&[b"GET", b"dropped"]).expect("GET");
        if d != Value::Null {
            wrong.push(format!(
                "node {id} has SET dropped, which never committed: {d:?}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{}\nlockstep up:\n{}\n{}",
        wrong.join("\n"),
        up.output(),
        nodes.describe()
    );
    let start = Instant::now();
    loop {
        let ds: Vec<Result<String, String>> = all.iter().map(|&id| digest(nodes.app(id))).collect();
        if ds[0].is_ok() && ds.iter().all(|d| *d == ds[0]) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "DEBUG DIGEST differs: {ds:?}\nlockstep up:\n{}\n{}",
            up.output(),
            nodes.describe()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let json = cli_status(&tc.config_path);
    assert_eq!(json["leader"], new, "lockstep status --json: {json}");
    for n in json["nodes"].as_array().expect("nodes") {
        let id = n["node"].as_u64().expect("node id");
        let want = if id == new { "leader" } else { "backup" };
        assert_eq!(n["role"], want, "node {id}: {json}");
        assert_eq!(n["divergences"], 0, "node {id}: {json}");
        assert!(n["stale_reason"].is_null(), "node {id}: {json}");
    }

    // The held client: never +OK. Its connection ends when L is fenced
    // (or when its server is stopped for the rebuild).
    let start = Instant::now();
    while !held.is_finished() && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop_held.store(true, Ordering::Relaxed);
    let seen = held.join().expect("held client");
    eprintln!("the client of SET dropped: {seen}");
    assert!(
        !seen.starts_with("reply"),
        "the client of SET dropped, which never committed, got {seen}\n{}",
        nodes.describe()
    );

    let st = up.interrupt();
    assert!(
        st.success(),
        "lockstep up exited with {st}:\n{}",
        up.output()
    );
    let left = processes_mentioning(&tc.dir.display().to_string());
    assert!(left.is_empty(), "processes left running: {left:?}");
}
