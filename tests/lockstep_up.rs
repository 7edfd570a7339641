//! `lockstep up` driven as a user would: spawn it, wait for its ready line,
//! run workloads with real clients through the leader, kill a node (or only
//! its server) and watch `up` restart it by itself, Ctrl-C it, and check
//! convergence and a clean stop (exit 0, no process, region file or port
//! left). Also its error lines, and the private ZooKeeper's lifecycle.

use lockstep_testkit::cluster;

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster::*;
use lockstep_launcher::process::session_of;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Generous limits against hangs (debug builds on a busy 2-core machine);
/// never asserted as performance.
const READY_LIMIT: Duration = Duration::from_secs(240);
const EXIT_LIMIT: Duration = Duration::from_secs(120);

const REDIS_SERVER: &str = r#"server = ["redis-server", "--port", "{port}", "--bind", "{host}", "--save", "", "--appendonly", "no", "--dir", "{data}", "--enable-debug-command", "yes"]"#;
const MEMCACHED_SERVER: &str =
    r#"server = ["memcached", "-u", "root", "-t", "1", "-U", "0", "-l", "{host}", "-p", "{port}"]"#;

/// A running `lockstep up`, its stdout and stderr collected line by line.
/// Dropping it interrupts it (and kills it if it does not exit), so a
/// failing test leaves nothing running.
struct Up {
    child: Option<Child>,
    out: Arc<Mutex<String>>,
}

impl Up {
    fn spawn(config: &std::path::Path, extra: &[&str]) -> Up {
        let mut child = Command::new(bin_dir().join("lockstep"))
            .arg("up")
            .arg(config)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn lockstep up");
        let out = collect_output(&mut child);
        Up {
            child: Some(child),
            out,
        }
    }

    fn output(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// Waits for an output line containing `pat`; panics (with the output)
    /// if `lockstep up` exits first or after `limit`.
    fn wait_line(&mut self, pat: &str, limit: Duration) -> String {
        self.wait_line_from(0, pat, limit)
    }

    /// How much output there is now (for `wait_line_from`).
    fn mark(&self) -> usize {
        self.out.lock().unwrap().len()
    }

    /// Like `wait_line`, for the output after `mark`.
    fn wait_line_from(&mut self, mark: usize, pat: &str, limit: Duration) -> String {
        let start = Instant::now();
        loop {
            if let Some(l) = self.output()[mark..].lines().find(|l| l.contains(pat)) {
                return l.to_string();
            }
            if let Ok(Some(st)) = self.child.as_mut().unwrap().try_wait() {
                cluster::wait_output_complete(&self.out, Duration::from_secs(10));
                panic!(
                    "lockstep up exited ({st}) before printing {pat:?}:\n{}",
                    self.output()
                );
            }
            assert!(
                start.elapsed() < limit,
                "no {pat:?} from lockstep up within {limit:?}:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for it to exit on its own.
    fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().expect("try_wait") {
                self.child = None;
                cluster::wait_output_complete(&self.out, Duration::from_secs(10));
                return st;
            }
            assert!(
                start.elapsed() < limit,
                "lockstep up did not exit within {limit:?}:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Ctrl-C: SIGINT, then wait for the exit.
    fn interrupt(&mut self) -> ExitStatus {
        let pid = Pid::from_raw(self.child.as_ref().unwrap().id() as i32);
        kill(pid, Signal::SIGINT).expect("SIGINT");
        self.wait_exit(EXIT_LIMIT)
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGINT);
        let start = Instant::now();
        while start.elapsed() < EXIT_LIMIT {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// A config with free loopback ports, a temp data dir and `server`; starts
/// nothing (TestCluster's Drop removes the dir and region files).
fn config(test: &str, server: Server) -> TestCluster {
    let line = match server {
        Server::Redis => REDIS_SERVER,
        Server::Memcached => MEMCACHED_SERVER,
    };
    TestCluster::new(
        test,
        Options {
            server,
            extra: line.to_string(),
            ..Options::default()
        },
    )
}

fn lockstep(args: &[&str]) -> std::process::Output {
    Command::new(bin_dir().join("lockstep"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run lockstep")
}

/// Ctrl-C stops `up` with exit status 0, and nothing of its cluster is
/// left running.
fn stop_cleanly(up: &mut Up, tc: &TestCluster) {
    let st = up.interrupt();
    assert!(
        st.success(),
        "lockstep up exited with {st} on Ctrl-C:\n{}",
        up.output()
    );
    assert_nothing_left(tc, &[]);
}

/// Everything `lockstep up` started is gone: no process mentions the test
/// dir (followers have the config path on their command line, servers in
/// LOCKSTEP_CONFIG, ZooKeeper its zoo.cfg), no region file, and every port
/// binds again.
fn assert_nothing_left(tc: &TestCluster, held: &[SocketAddr]) {
    let procs = processes_mentioning(&tc.dir.display().to_string());
    assert!(
        procs.is_empty(),
        "processes left running:\n{}",
        procs.join("\n")
    );
    let prefix = format!("lockstep-{}-", tc.name);
    let regions: Vec<String> = std::fs::read_dir("/dev/shm")
        .expect("/dev/shm")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(regions.is_empty(), "region files left: {regions:?}");
    let ours = tc.dir.display().to_string();
    for n in &tc.nodes {
        for a in [n.app, n.control] {
            if held.contains(&a) {
                continue;
            }
            if let Err(e) = TcpListener::bind(a) {
                // Tests run side by side: a port this test's config named
                // and never used may be another test's by now. Only a
                // listener that is this test's (its command line names
                // this test's directory, or cannot be read) is left over.
                let holder = listener_of(a);
                let others = holder_pids(&holder).iter().all(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| !String::from_utf8_lossy(&c).contains(&ours))
                });
                assert!(
                    others && !holder_pids(&holder).is_empty(),
                    "port {a} still in use after stop: {e}\n{holder}"
                );
            }
        }
    }
}

/// The pids `ss -p` names in `listing` (`pid=N`).
fn holder_pids(listing: &str) -> Vec<u32> {
    listing
        .split("pid=")
        .skip(1)
        .filter_map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// Waits until every node applied the leader's log, then until all
/// `digest`s agree (a read may trail its apply by an event-loop turn);
/// returns them.
fn converged<T: PartialEq + std::fmt::Debug>(
    tc: &TestCluster,
    ids: &[u64],
    digest: impl Fn(SocketAddr) -> T,
) -> Vec<T> {
    tc.wait_converged_on(ids, Duration::from_secs(120));
    let start = Instant::now();
    loop {
        let ds: Vec<T> = ids.iter().map(|&id| digest(tc.app(id))).collect();
        if ds.windows(2).all(|w| w[0] == w[1]) || start.elapsed() > Duration::from_secs(30) {
            return ds;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The exit line of a failed `lockstep up`: exactly one line on stderr,
/// naming the problem.
fn one_error_line(out: &std::process::Output) -> String {
    assert!(!out.status.success(), "lockstep up succeeded: {out:?}");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let lines: Vec<&str> = err.lines().filter(|l| !l.starts_with("warning:")).collect();
    assert_eq!(lines.len(), 1, "want one error line, got:\n{err}");
    assert!(
        lines[0].starts_with("lockstep: "),
        "unexpected error line: {err}"
    );
    lines[0].to_string()
}

#[test]
fn redis_up_workload_kill_backup_ctrl_c() {
    let tc = config("upredis", Server::Redis);
    let cfg = tc.config_path.to_str().unwrap().to_string();
    let mut up = Up::spawn(&tc.config_path, &[]);
    let ready = up.wait_line("ready", READY_LIMIT);
    assert!(
        ready.contains(&tc.app(1).to_string()),
        "ready line does not say where to connect: {ready}"
    );

    redis_mixed_workload(tc.app(1), 16, 300);
    let ds = converged(&tc, &[1, 2, 3], redis_digest);
    assert!(
        ds.iter().all(|d| *d == ds[0]),
        "replicas differ after the workload: {ds:?}"
    );
    assert_ne!(
        ds[0], "0000000000000000000000000000000000000000",
        "empty data set"
    );
    for id in 1..=3 {
        let s = tc.status(id).expect("status");
        assert_eq!(
            s.divergences, 0,
            "node {id} reports divergent replies: {s:?}"
        );
        // Each follower leads a session of its own (its own CPU share:
        // docs/guide/your-server.md).
        let pid = s.follower_pid as u32;
        assert_eq!(
            session_of(pid),
            Some(pid),
            "node {id}'s follower shares a session"
        );
    }

    // A backup dies: the leader keeps a majority and serves, and `up`
    // brings the node back by itself; it rebuilds its server from the log.
    let k = lockstep(&["kill", &cfg, "--node", "3"]);
    assert!(
        k.status.success(),
        "lockstep kill: {}",
        String::from_utf8_lossy(&k.stderr)
    );
    // Whichever of the two `up` sees exit first (the server runs in a
    // session of its own under its launcher), it restarts the node and
    // stops what is left of it.
    up.wait_line("of node 3 exited", READY_LIMIT);
    let mut c = Resp::connect(tc.app(1)).expect("connect to the leader");
    assert_eq!(
        c.cmd(&[b"SET", b"after-kill", b"1"]).unwrap(),
        Value::Simple("OK".into())
    );
    redis_mixed_workload(tc.app(1), 4, 50);
    drop(c);
    let down = up.wait_line("node 3 is down", READY_LIMIT);
    assert!(down.contains("restarting it"), "{down}");
    up.wait_line("node 3 back as backup", READY_LIMIT);
    redis_mixed_workload(tc.app(1), 4, 50);
    let ds = converged(&tc, &[1, 2, 3], redis_digest);
    assert!(
        ds.iter().all(|d| *d == ds[0]),
        "the restarted node differs: {ds:?}\n{}",
        up.output()
    );
    let mut c = Resp::connect(tc.app(3)).expect("connect to the restarted backup");
    assert_eq!(
        c.cmd(&[b"GET", b"after-kill"]).unwrap(),
        Value::Bulk(b"1".to_vec()),
        "a write made while node 3 was down is missing there"
    );
    drop(c);
    for id in 1..=3 {
        let s = tc.status(id).expect("status");
        assert_eq!(s.divergences, 0, "node {id}: {s:?}");
    }

    let st = up.interrupt();
    assert!(
        st.success(),
        "lockstep up exited with {st} on Ctrl-C:\n{}",
        up.output()
    );
    assert!(
        up.output().contains("stopped"),
        "no stop line:\n{}",
        up.output()
    );
    assert_nothing_left(&tc, &[]);
}

/// Only a backup's server dies (SIGKILL, as the OOM killer would): its
/// follower reports the node stale, `up` restarts the node (follower and a
/// fresh server) while clients keep writing through the leader, and it
/// converges with every acknowledged write on every node.
#[test]
fn redis_up_heals_a_backup_whose_server_died() {
    let tc = config("upheal", Server::Redis);
    let mut up = Up::spawn(&tc.config_path, &[]);
    up.wait_line("ready", READY_LIMIT);
    let load = BackgroundLoad::start(tc.app(1), 4);
    load.wait_more(&tc, 2000, READY_LIMIT);

    let pid = tc.status(3).expect("status of node 3").server_pid;
    assert_ne!(pid, 0, "node 3 has no server");
    let mark = up.mark();
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).expect("SIGKILL node 3's server");
    up.wait_line_from(mark, "server of node 3 exited", READY_LIMIT);
    let stale = up.wait_line_from(mark, "node 3 is stale", READY_LIMIT);
    assert!(
        stale.contains("server") && stale.contains("exited") && stale.contains("restarting it"),
        "{stale}"
    );
    up.wait_line_from(mark, "starting follower of node 3", READY_LIMIT);
    up.wait_line_from(mark, "starting server of node 3", READY_LIMIT);
    up.wait_line_from(mark, "node 3 back as backup", READY_LIMIT);
    let out = up.output()[mark..].to_string();
    let at = |p: &str| out.find(p).unwrap_or_else(|| panic!("no {p:?} in:\n{out}"));
    assert!(
        at("node 3 is stale") < at("starting follower of node 3")
            && at("starting follower of node 3") < at("starting server of node 3")
            && at("starting server of node 3") < at("node 3 back as backup"),
        "steps out of order:\n{out}"
    );
    assert!(!out.contains("failed"), "a restart attempt failed:\n{out}");

    // The leader served all along; the rebuilt node keeps up.
    load.wait_more(&tc, 2000, READY_LIMIT);
    let acked = load.stop();
    let ds = converged(&tc, &[1, 2, 3], redis_digest);
    assert!(
        ds.iter().all(|d| *d == ds[0]),
        "replicas differ after the rebuild: {ds:?}\n{}",
        up.output()
    );
    let counters = assert_acked_counters(&tc, &acked);
    assert!(
        counters.iter().all(|v| *v == acked),
        "counters {counters:?}, acknowledged {acked:?}"
    );
    for id in 1..=3 {
        let s = tc.status(id).expect("status");
        assert_eq!(s.divergences, 0, "node {id}: {s:?}");
        assert_eq!(s.role, if id == 1 { "leader" } else { "backup" }, "{s:?}");
    }

    stop_cleanly(&mut up, &tc);
}

/// A rebuilt node is back only once it has caught up: while it has a long
/// log to replay, `up` says it is catching up (entries left), and `node N
/// back as backup` comes after. The server command waits on a gate file
/// (`<data>.hold`) before it becomes redis-server, so the test decides
/// when the rebuilt node's server starts: meanwhile its follower stores
/// the whole log and applies none of it.
#[test]
fn up_says_a_rebuilt_node_is_back_only_once_caught_up() {
    const LAG: usize = 200;
    let gated = r#"server = ["sh", "-c", "while [ -e {data}.hold ]; do sleep 0.05; done; exec redis-server --port {port} --bind {host} --save '' --appendonly no --dir {data} --enable-debug-command yes"]"#;
    let tc = TestCluster::new(
        "upcatchup",
        Options {
            extra: format!("{gated}\nmax_apply_lag = {LAG}\n"),
            ..Options::default()
        },
    );
    let mut up = Up::spawn(&tc.config_path, &[]);
    up.wait_line("ready", READY_LIMIT);
    set_keys(tc.app(1), "catchup:before", 10 * LAG);

    let hold = tc.config().data_dir.join("server-3.hold");
    std::fs::write(&hold, b"").expect("gate file");
    let pid = tc.status(3).expect("status of node 3").server_pid;
    let mark = up.mark();
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).expect("SIGKILL node 3's server");
    up.wait_line_from(mark, "starting server of node 3", READY_LIMIT);
    set_keys(tc.app(1), "catchup:during", 2 * LAG);
    let line = up.wait_line_from(mark, "node 3 catching up: ", READY_LIMIT);
    assert!(line.contains("entries left to apply"), "{line}");
    assert!(
        !up.output()[mark..].contains("node 3 back as"),
        "back before its server even started:\n{}",
        up.output()
    );
    let s = tc.status(3).expect("status of node 3");
    assert_eq!(s.role, "catching-up", "{s:?}");

    std::fs::remove_file(&hold).expect("open the gate");
    up.wait_line_from(mark, "node 3 back as backup", READY_LIMIT);
    let out = up.output()[mark..].to_string();
    assert!(
        out.find("node 3 catching up") < out.find("node 3 back as backup"),
        "{out}"
    );
    let s = tc.status(3).expect("status of node 3");
    assert_eq!(s.role, "backup", "back while still behind: {s:?}");
    let ds = converged(&tc, &[1, 2, 3], redis_digest);
    assert!(ds.iter().all(|d| *d == ds[0]), "replicas differ: {ds:?}");
    stop_cleanly(&mut up, &tc);
}

/// `lockstep snapshot` has a backup image its server; `lockstep kill`
/// takes the node down; `up` restarts its follower, which restores the
/// image (up adopts that server instead of starting a fresh one) and
/// replays only the entries after it; the replicas agree, and Ctrl-C
/// stops the restored server too.
#[test]
fn redis_up_restarts_a_killed_backup_from_its_snapshot() {
    let tc = config("upsnap", Server::Redis);
    let mut up = Up::spawn(&tc.config_path, &[]);
    up.wait_line("ready", READY_LIMIT);
    let load = BackgroundLoad::start(tc.app(1), 2);
    load.wait_more(&tc, 2000, READY_LIMIT);
    let config = tc.config_path.to_str().unwrap();
    let out = lockstep(&["snapshot", config, "--node", "2"]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success() && said.starts_with("node 2: snapshot at seq "),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seq: u64 = said["node 2: snapshot at seq ".len()..]
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .expect("a seq");
    let leader = lockstep(&["snapshot", config, "--node", "1"]);
    assert!(
        !leader.status.success()
            && String::from_utf8_lossy(&leader.stderr).contains("only backups snapshot"),
        "the leader must refuse"
    );
    load.wait_more(&tc, 2000, READY_LIMIT);

    let mark = up.mark();
    assert!(lockstep(&["kill", config, "--node", "2"]).status.success());
    up.wait_line_from(mark, "node 2 is down", READY_LIMIT);
    up.wait_line_from(
        mark,
        "node 2: its follower restored the server from a snapshot",
        READY_LIMIT,
    );
    up.wait_line_from(mark, "node 2 back as backup", READY_LIMIT);
    let out = up.output()[mark..].to_string();
    assert!(
        !out.contains("starting server of node 2"),
        "a fresh server was started:\n{out}"
    );
    let follower = std::fs::read_to_string(tc.dir.join("data/logs/follower-2.log")).unwrap();
    assert!(
        follower.contains(&format!("applying from seq {} (restored server)", seq + 1)),
        "{follower}"
    );

    load.wait_more(&tc, 2000, READY_LIMIT);
    let acked = load.stop();
    let ds = converged(&tc, &[1, 2, 3], redis_digest);
    assert!(ds.iter().all(|d| *d == ds[0]), "replicas differ: {ds:?}");
    let counters = assert_acked_counters(&tc, &acked);
    assert!(
        counters.iter().all(|v| *v == acked),
        "{counters:?} != {acked:?}"
    );
    stop_cleanly(&mut up, &tc);
}

/// One node per host: three `lockstep up --node i` processes (one per
/// node, static election) form a working cluster; writes go through the
/// leader and every replica agrees; a node whose server is SIGKILLed is
/// brought back by its own `up --node`, and SIGINT stops only that node.
#[test]
fn redis_up_node_per_host_forms_a_cluster_and_heals() {
    let tc = config("upnode", Server::Redis);
    let mut ups: Vec<Up> = (1..=3)
        .map(|id| Up::spawn(&tc.config_path, &["--node", &id.to_string()]))
        .collect();
    for (i, up) in ups.iter_mut().enumerate() {
        let ready = up.wait_line("ready", READY_LIMIT);
        let id = i as u64 + 1;
        assert!(
            ready.contains(&format!("node {id}")) && ready.contains(&tc.app(id).to_string()),
            "{ready}"
        );
    }
    // Each runs its own node only.
    for (i, up) in ups.iter().enumerate() {
        let out = up.output();
        for other in (1..=3u64).filter(|&o| o != i as u64 + 1) {
            assert!(
                !out.contains(&format!("starting server of node {other}")),
                "up --node {} started node {other}:
{out}",
                i + 1
            );
        }
    }

    let load = BackgroundLoad::start(tc.app(1), 4);
    load.wait_more(&tc, 1000, READY_LIMIT);
    // Node 3's server dies: its own `up --node 3` rebuilds it.
    let pid = tc.status(3).expect("status of node 3").server_pid;
    assert_ne!(pid, 0, "node 3 has no server");
    let mark = ups[2].mark();
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).expect("SIGKILL node 3's server");
    ups[2].wait_line_from(mark, "server of node 3 exited", READY_LIMIT);
    ups[2].wait_line_from(mark, "restarting it", READY_LIMIT);
    ups[2].wait_line_from(mark, "node 3 back as backup", READY_LIMIT);
    load.wait_more(&tc, 1000, READY_LIMIT);
    let acked = load.stop();
    let ds = converged(&tc, &[1, 2, 3], redis_digest);
    assert!(
        ds.iter().all(|d| *d == ds[0]),
        "replicas differ: {ds:?}\n{}",
        ups[2].output()
    );
    let counters = assert_acked_counters(&tc, &acked);
    assert!(
        counters.iter().all(|v| *v == acked),
        "counters {counters:?}, acknowledged {acked:?}"
    );
    for id in 1..=3 {
        let s = tc.status(id).expect("status");
        assert_eq!(s.divergences, 0, "node {id}: {s:?}");
        assert_eq!(s.role, if id == 1 { "leader" } else { "backup" }, "{s:?}");
    }

    // SIGINT to node 3's `up` stops node 3 only.
    let st = ups[2].interrupt();
    assert!(
        st.success(),
        "up --node 3 exited with {st}:\n{}",
        ups[2].output()
    );
    assert!(
        tc.status(3).is_err(),
        "node 3 still answers after its up stopped"
    );
    assert!(tc.status(1).is_ok() && tc.status(2).is_ok());
    let mut c = Resp::connect(tc.app(1)).expect("connect to the leader");
    assert_eq!(
        c.cmd(&[b"SET", b"two-left", b"1"]).unwrap(),
        Value::Simple("OK".into())
    );
    drop(c);
    for up in ups.iter_mut().take(2) {
        let st = up.interrupt();
        assert!(st.success(), "{st}:\n{}", up.output());
    }
    assert_nothing_left(&tc, &[]);
}

/// `lockstep up --node N` starts no ZooKeeper: an unreachable one is one
/// error line, and nothing is started.
#[test]
fn up_node_needs_a_reachable_zookeeper() {
    let mut tc = config("upnodezk", Server::Redis);
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    tc.use_zookeeper(&format!("127.0.0.1:{port}"), 2000);
    let cfg = tc.config_path.to_str().unwrap().to_string();
    let out = lockstep(&["up", &cfg, "--node", "2"]);
    let line = one_error_line(&out);
    assert!(
        line.contains("election.zookeeper") && line.contains("--node"),
        "{line}"
    );
    let out = lockstep(&["up", &cfg, "--node", "9"]);
    let line = one_error_line(&out);
    assert!(line.contains("--node") && line.contains('9'), "{line}");
    assert_nothing_left(&tc, &[]);
}

/// A restart that fails (the node's port is taken, so its new server exits
/// at once) is retried after a growing pause, with a line saying why, and
/// `up` runs on; once the port is free the node comes back and catches up.
#[test]
fn redis_up_retries_a_failing_restart() {
    let tc = config("upretry", Server::Redis);
    let cfg = tc.config_path.to_str().unwrap().to_string();
    let mut up = Up::spawn(&tc.config_path, &[]);
    up.wait_line("ready", READY_LIMIT);
    let mut c = Resp::connect(tc.app(1)).expect("connect to the leader");
    assert_eq!(
        c.cmd(&[b"SET", b"before", b"1"]).unwrap(),
        Value::Simple("OK".into())
    );

    let mark = up.mark();
    let k = lockstep(&["kill", &cfg, "--node", "3"]);
    assert!(
        k.status.success(),
        "lockstep kill: {}",
        String::from_utf8_lossy(&k.stderr)
    );
    // Take node 3's app port as soon as its dead server lets go of it
    // (long before `up` has started the node's follower, then its server).
    let start = Instant::now();
    let holder = loop {
        match TcpListener::bind(tc.app(3)) {
            Ok(l) => break l,
            Err(e) => {
                assert!(
                    start.elapsed() < EXIT_LIMIT,
                    "cannot take node 3's port: {e}\n{}",
                    up.output()
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    };
    let first = up.wait_line_from(mark, "restarting node 3 failed", READY_LIMIT);
    assert!(
        first.contains("its server exited") && first.contains("trying again in 1s"),
        "{first}"
    );
    up.wait_line_from(mark, "trying again in 2s", READY_LIMIT);
    // The cluster serves on meanwhile.
    assert_eq!(
        c.cmd(&[b"SET", b"during", b"2"]).unwrap(),
        Value::Simple("OK".into())
    );
    drop(holder);
    up.wait_line_from(mark, "node 3 back as backup", READY_LIMIT);
    drop(c);

    let ds = converged(&tc, &[1, 3], redis_digest);
    assert_eq!(ds[0], ds[1], "the restarted node differs\n{}", up.output());
    let mut c = Resp::connect(tc.app(3)).expect("connect to node 3");
    for (k, v) in [(&b"before"[..], &b"1"[..]), (b"during", b"2")] {
        assert_eq!(
            c.cmd(&[b"GET", k]).unwrap(),
            Value::Bulk(v.to_vec()),
            "key {}",
            String::from_utf8_lossy(k)
        );
    }
    drop(c);
    stop_cleanly(&mut up, &tc);
}

#[test]
fn memcached_up_workload_dumps_agree() {
    let tc = config("upmemc", Server::Memcached);
    let mut up = Up::spawn(&tc.config_path, &[]);
    up.wait_line("ready", READY_LIMIT);

    let keys = 12;
    let deltas = memcached_mixed_workload(tc.app(1), 16, 400, keys);
    // The workload's keys, read one by one: memcached's crawler (a
    // metadump) may miss items its LRU maintainer moves meanwhile.
    let names: Vec<String> = (0..keys)
        .flat_map(|k| [format!("ctr:{k}"), format!("str:{k}")])
        .collect();
    let dumps = converged(&tc, &[1, 2, 3], |a| {
        Memcache::connect(a)
            .expect("connect")
            .items(names.iter().cloned())
            .expect("items")
    });
    assert!(!dumps[0].is_empty(), "no keys on the leader");
    for (i, d) in dumps.iter().enumerate().skip(1) {
        if *d != dumps[0] {
            let diff: Vec<&String> = dumps[0]
                .keys()
                .chain(d.keys())
                .filter(|k| dumps[0].get(*k) != d.get(*k))
                .collect();
            panic!("node {} differs from the leader in keys {diff:?}", i + 1);
        }
    }
    // The counters got exactly what the clients sent.
    for (k, delta) in deltas.iter().enumerate() {
        let (_, v) = &dumps[0][&format!("ctr:{k}")];
        let want = MC_COUNTER_START as i64 + delta;
        assert_eq!(
            String::from_utf8_lossy(v).trim(),
            want.to_string(),
            "counter ctr:{k}"
        );
    }

    stop_cleanly(&mut up, &tc);
}

#[test]
fn ctrl_c_while_starting_leaves_nothing() {
    let tc = config("upintr", Server::Redis);
    let mut up = Up::spawn(&tc.config_path, &[]);
    up.wait_line("starting server of node 1", READY_LIMIT);
    let st = up.interrupt();
    let out = up.output();
    // Interrupted before ready: one error line; after ready: a clean stop.
    if !st.success() {
        assert!(out.contains("lockstep: interrupted"), "{out}");
    }
    assert_nothing_left(&tc, &[]);
}

#[test]
fn up_killed_leaves_no_orphans_and_restarts() {
    let tc = config("upsigkill", Server::Redis);
    let mut up = Up::spawn(&tc.config_path, &[]);
    up.wait_line("ready", READY_LIMIT);
    let mut c = Resp::connect(tc.app(1)).expect("connect");
    assert_eq!(
        c.cmd(&[b"SET", b"survives", b"yes"]).unwrap(),
        Value::Simple("OK".into())
    );
    drop(c);
    // SIGKILL: no cleanup by `lockstep up`; the kernel's parent-death
    // signal stops its children.
    up.child
        .as_mut()
        .unwrap()
        .kill()
        .expect("SIGKILL lockstep up");
    up.wait_exit(EXIT_LIMIT);
    let dir = tc.dir.display().to_string();
    let start = Instant::now();
    while !processes_mentioning(&dir).is_empty() {
        assert!(
            start.elapsed() < EXIT_LIMIT,
            "orphans: {:?}",
            processes_mentioning(&dir)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // An exiting process drops its command line and environment before
    // its sockets: wait for the ports too.
    for n in &tc.nodes {
        for a in [n.app, n.control] {
            while let Err(e) = TcpListener::bind(a) {
                assert!(
                    start.elapsed() < EXIT_LIMIT,
                    "port {a} still held after the kill: {e}\n{}",
                    listener_of(a)
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    // A new `up` removes the stale region files and rebuilds from the log.
    let mut up = Up::spawn(&tc.config_path, &[]);
    up.wait_line("ready", READY_LIMIT);
    assert!(up.output().contains("stale region file"), "{}", up.output());
    let mut c = Resp::connect(tc.app(1)).expect("connect");
    assert_eq!(
        c.cmd(&[b"GET", b"survives"]).unwrap(),
        Value::Bulk(b"yes".to_vec())
    );
    drop(c);
    stop_cleanly(&mut up, &tc);
}

#[test]
fn bad_config_is_one_line_and_starts_nothing() {
    let tc = config("upbadcfg", Server::Redis);
    std::fs::write(
        &tc.config_path,
        std::fs::read_to_string(&tc.config_path).unwrap() + "ring_sise = \"1MiB\"\n",
    )
    .unwrap();
    let out = lockstep(&["up", tc.config_path.to_str().unwrap()]);
    let line = one_error_line(&out);
    assert!(
        line.contains("ring_sise"),
        "error does not name the field: {line}"
    );
    assert_nothing_left(&tc, &[]);
}

#[test]
fn port_in_use_is_one_line_and_starts_nothing() {
    let tc = config("upport", Server::Redis);
    let taken = tc.app(2);
    let _holder = TcpListener::bind(taken).expect("hold node 2's port");
    let out = lockstep(&["up", tc.config_path.to_str().unwrap()]);
    let line = one_error_line(&out);
    assert!(
        line.contains("port in use") && line.contains(&taken.to_string()),
        "{line}"
    );
    assert_nothing_left(&tc, &[taken]);
}

#[test]
fn missing_server_binary_is_one_line() {
    let tc = config("upnobin", Server::Redis);
    let out = lockstep(&[
        "up",
        tc.config_path.to_str().unwrap(),
        "--server-cmd",
        "/nonexistent/redis-server",
        "--port",
        "{port}",
    ]);
    let line = one_error_line(&out);
    assert!(
        line.contains("/nonexistent/redis-server") && line.contains("not found"),
        "{line}"
    );
    assert_nothing_left(&tc, &[]);
}

#[test]
fn server_failing_at_start_stops_everything() {
    let tc = config("upsrvfail", Server::Redis);
    let mut up = Up::spawn(
        &tc.config_path,
        &[
            "--server-cmd",
            "redis-server",
            "--port",
            "{port}",
            "--no-such-option",
            "x",
        ],
    );
    let st = up.wait_exit(READY_LIMIT);
    assert!(!st.success(), "lockstep up succeeded with a failing server");
    let out = up.output();
    let err: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("stderr: lockstep: "))
        .collect();
    assert_eq!(err.len(), 1, "want one error line:\n{out}");
    assert!(
        err[0].contains("server of node") && err[0].contains("exited"),
        "{out}"
    );
    assert_nothing_left(&tc, &[]);
}

#[test]
fn private_zookeeper_starts_serves_and_stops_on_drop() {
    let dir = std::env::temp_dir().join(format!("lockstep-zk-{}", std::process::id()));
    remove(&dir);
    let zk = ZookeeperServer::start_on_free_port(&dir, free_port).expect("start ZooKeeper");
    let addr = zk.addr();
    let srvr = zookeeper_srvr(addr, Duration::from_secs(5)).expect("srvr answer");
    assert!(srvr.contains("Mode: standalone"), "srvr: {srvr}");
    let pid = zk.pid();
    assert!(pid != 0 && std::path::Path::new(&format!("/proc/{pid}")).exists());
    // It uses our config, not the system's.
    assert!(!processes_mentioning(&dir.display().to_string()).is_empty());
    drop(zk);
    assert!(
        !zookeeper_serving(addr),
        "ZooKeeper still serves after drop"
    );
    let left = processes_mentioning(&dir.display().to_string());
    assert!(left.is_empty(), "left running: {left:?}");
    TcpListener::bind(addr).expect("ZooKeeper's port is free after drop");
    remove(&dir);
}

/// Who listens on `a`, as `ss` tells (for failure messages: a server
/// renames itself, so the command-line scan cannot find it).
fn listener_of(a: SocketAddr) -> String {
    Command::new("ss")
        .args(["-Hltnp", &format!("sport = :{}", a.port())])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_else(|e| format!("(ss: {e})"))
}

/// SIGKILLs every process whose command line names `needle` (what this
/// test's `up` started: a ZooKeeper's zoo.cfg path); returns how many.
fn kill_mentioning(needle: &str) -> usize {
    let procs = processes_mentioning(needle);
    for p in &procs {
        let pid: i32 = p.split(':').next().unwrap_or("").parse().expect("pid");
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    procs.len()
}

/// SETs `n` keys `prefix:i` on one connection to `addr`; each must be
/// acknowledged.
fn set_keys(addr: SocketAddr, prefix: &str, n: usize) {
    let mut c = Resp::connect(addr).expect("connect to the leader");
    for i in 0..n {
        let key = format!("{prefix}:{i}");
        assert_eq!(
            c.cmd(&[b"SET", key.as_bytes(), b"1"]).unwrap(),
            Value::Simple("OK".into()),
            "SET {key} on {addr}"
        );
    }
}

/// Waits until every answering node has a ZooKeeper session again.
fn wait_zookeeper_back(tc: &TestCluster, up: &Up) {
    let start = Instant::now();
    loop {
        let json = cli_status(&tc.config_path);
        if json["zookeeper_problem"].is_null() && json["healthy"] == true {
            return;
        }
        assert!(
            start.elapsed() < READY_LIMIT,
            "nodes did not get a ZooKeeper session back: {json}\n{}\n{}",
            up.output(),
            tc.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The private ZooKeeper `up` started is SIGKILLed: the leader keeps
/// serving (writes acknowledged while ZooKeeper is away), `up` says so and
/// restarts ZooKeeper with the same data and port, every node registers
/// again, and the same leader goes on.
#[test]
fn redis_up_restarts_its_zookeeper_and_writes_go_on() {
    let mut tc = config("upzkrestart", Server::Redis);
    let port = SparePorts::of(&tc).next_port();
    tc.use_zookeeper(&format!("127.0.0.1:{port}"), 2000);
    let mut up = Up::spawn(&tc.config_path, &[]);
    up.wait_line("ready", READY_LIMIT);
    let leader = tc.wait_leader_among(&[1, 2, 3], READY_LIMIT);
    set_keys(tc.app(leader), "before", 10);
    let zoo = tc.config().data_dir.join("zookeeper").join("zoo.cfg");
    let mark = up.mark();
    assert!(
        kill_mentioning(zoo.to_str().unwrap()) > 0,
        "no ZooKeeper process runs with {}",
        zoo.display()
    );
    up.wait_line_from(mark, "ZooKeeper exited", READY_LIMIT);
    set_keys(tc.app(leader), "during", 50);
    let line = up.wait_line_from(mark, "ZooKeeper serves again", READY_LIMIT);
    assert!(line.contains(&port.to_string()), "{line}");
    wait_zookeeper_back(&tc, &up);
    set_keys(tc.app(leader), "after", 10);
    assert_eq!(
        tc.wait_leader_among(&[1, 2, 3], READY_LIMIT),
        leader,
        "the leader changed although only ZooKeeper restarted\n{}",
        up.output()
    );
    stop_cleanly(&mut up, &tc);
}

/// `up` with a real 3-member ZooKeeper ensemble: one member dies, the
/// cluster keeps serving, every node's session moves to a live member, and
/// a failover still works with the two members left.
#[test]
fn redis_up_with_a_zookeeper_ensemble_survives_a_member_loss() {
    let mut tc = config("upzkensemble", Server::Redis);
    let mut spare = SparePorts::of(&tc);
    let ports: Vec<(u16, u16, u16)> = (0..3)
        .map(|_| (spare.next_port(), spare.next_port(), spare.next_port()))
        .collect();
    let mut zk = ZookeeperEnsemble::start(&tc.dir.join("zk"), &ports)
        .expect("start a 3-member ZooKeeper ensemble");
    tc.use_zookeeper(&zk.connect_string(), 2000);
    let mut up = Up::spawn(&tc.config_path, &[]);
    up.wait_line("using the ZooKeeper ensemble", READY_LIMIT);
    up.wait_line("ready", READY_LIMIT);
    let leader = tc.wait_leader_among(&[1, 2, 3], READY_LIMIT);
    set_keys(tc.app(leader), "before", 10);
    // The first member: every follower's client tries it first.
    zk.member(0).kill();
    set_keys(tc.app(leader), "during", 50);
    wait_zookeeper_back(&tc, &up);
    // Failover through the two members left.
    let cfg = tc.config_path.to_str().unwrap().to_string();
    let k = lockstep(&["kill", &cfg, "--node", &leader.to_string()]);
    assert!(
        k.status.success(),
        "lockstep kill: {}",
        String::from_utf8_lossy(&k.stderr)
    );
    let others: Vec<u64> = [1, 2, 3].into_iter().filter(|&i| i != leader).collect();
    let new = tc.wait_leader_among(&others, READY_LIMIT);
    set_keys(tc.app(new), "after", 10);
    let mut c = Resp::connect(tc.app(new)).expect("connect to the new leader");
    for key in ["before:9", "during:49"] {
        assert_eq!(
            c.cmd(&[b"GET", key.as_bytes()]).unwrap(),
            Value::Bulk(b"1".to_vec()),
            "{key} is missing on the new leader {new}\n{}",
            up.output()
        );
    }
    drop(c);
    let st = up.interrupt();
    assert!(
        st.success(),
        "lockstep up exited with {st} on Ctrl-C:\n{}",
        up.output()
    );
    // The ensemble is the test's, not `up`'s: stopped before the check.
    drop(zk);
    assert_nothing_left(&tc, &[]);
}
