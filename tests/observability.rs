//! What operators and proxies see: `lockstep status` (its exit code, its
//! JSON, a down node's line), the Prometheus metrics and the `/health` and
//! `/leader` endpoints on each node's metrics address — against a real
//! 3-node cluster whose nodes are killed one by one.

use lockstep_testkit::cluster;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cluster::*;

/// Bound on every wait: reaching it means a hang, not slowness.
const HANG: Duration = Duration::from_secs(120);

/// Gives every node of `c` a metrics address (before it starts).
fn with_metrics(c: &mut TestCluster) -> Vec<SocketAddr> {
    let mut addrs = Vec::new();
    c.change_config(|mut s| {
        for n in s.nodes_mut() {
            let a = SocketAddr::from(([127, 0, 0, 1], free_port()));
            n.metrics = Some(a);
            addrs.push(a);
        }
        s
    });
    addrs
}

/// Polls `GET path` on `addr` until `cond` holds for (code, body).
fn wait_http(
    c: &TestCluster,
    addr: SocketAddr,
    path: &str,
    what: &str,
    cond: impl Fn(u16, &str) -> bool,
) -> String {
    let start = Instant::now();
    loop {
        let got = http_get(addr, path);
        if let Ok((code, body)) = &got {
            if cond(*code, body) {
                return body.clone();
            }
        }
        assert!(
            start.elapsed() < HANG,
            "timed out waiting for {what} (GET {path} on {addr}: {got:?})\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `lockstep status --config F [--json]`: exit code and stdout.
fn cli_status(config: &Path, json: bool) -> (i32, String) {
    let mut cmd = Command::new(bin_dir().join("lockstep"));
    cmd.arg("status");
    if json {
        cmd.arg("--json");
    }
    let out = cmd
        .arg("--config")
        .arg(config)
        .output()
        .expect("run lockstep status");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn cli_status_json(config: &Path) -> (i32, serde_json::Value) {
    let (code, text) = cli_status(config, true);
    let v = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("lockstep status --json printed no JSON ({e}): {text}"));
    (code, v)
}

/// Waits until `lockstep status` exits with `code`; returns its table.
fn wait_status_code(c: &TestCluster, code: i32) -> String {
    let start = Instant::now();
    loop {
        let (got, text) = cli_status(&c.config_path, false);
        if got == code {
            return text;
        }
        assert!(
            start.elapsed() < HANG,
            "lockstep status kept exiting {got}, not {code}:\n{text}\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn status_exit_code_json_and_down_nodes() {
    let mut c = TestCluster::new("obs-status", Options::default());
    c.start_all();
    let path = c.config_path.display().to_string();

    let text = wait_status_code(&c, 0);
    assert!(text.contains("ok: node 1 leads view"), "{text}");
    let (code, json) = cli_status_json(&c.config_path);
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["healthy"], true, "{json}");
    assert_eq!(json["leader"], 1, "{json}");
    assert_eq!(json["leader_app"], c.app(1).to_string(), "{json}");
    for (i, n) in json["nodes"].as_array().expect("nodes").iter().enumerate() {
        assert_eq!(n["app"], c.app(i as u64 + 1).to_string(), "{json}");
    }

    // One backup down: the leader keeps a majority.
    c.kill_server(3);
    c.kill_follower(3);
    let text = wait_status_code(&c, 0);
    assert!(
        text.contains(&format!(
            "node 3 is down: the follower is not running (nothing listens on {})",
            c.nodes[2].control
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("lockstep-follower --config {path} --node 3")),
        "{text}"
    );
    assert!(
        !text.contains("handshake") && !text.contains("os error"),
        "{text}"
    );
    let (code, json) = cli_status_json(&c.config_path);
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["nodes"][2]["role"], "down", "{json}");
    assert_eq!(json["nodes"][2]["app"], c.app(3).to_string(), "{json}");

    // Two of three down: the leader answers, but has no majority.
    c.kill_server(2);
    c.kill_follower(2);
    let text = wait_status_code(&c, 1);
    assert!(
        text.contains("NOT OK: no leader with a live majority"),
        "{text}"
    );
    assert!(text.contains("only 1 of 3"), "{text}");
    let (code, json) = cli_status_json(&c.config_path);
    assert_eq!(code, 1, "{json}");
    assert_eq!(json["healthy"], false, "{json}");

    // Everything down.
    c.kill_server(1);
    c.kill_follower(1);
    let text = wait_status_code(&c, 1);
    assert!(text.contains("no node answers"), "{text}");
    let (code, json) = cli_status_json(&c.config_path);
    assert_eq!(code, 1, "{json}");
    assert_eq!(json["leader"], 0, "{json}");
    assert!(json["leader_app"].is_null(), "{json}");
}

#[test]
fn metrics_name_role_build_server_and_lag() {
    let mut c = TestCluster::new("obs-metrics", Options::default());
    let metrics = with_metrics(&mut c);
    c.start_all();
    let m1 = wait_http(&c, metrics[0], "/metrics", "node 1 leading", |code, b| {
        code == 200 && b.contains("lockstep_role{role=\"leader\"} 1\n")
    });
    let version = env!("CARGO_PKG_VERSION");
    for want in [
        "lockstep_role{role=\"backup\"} 0\n",
        "lockstep_role{role=\"joining\"} 0\n",
        "lockstep_role{role=\"stale\"} 0\n",
        &format!("lockstep_build_info{{version=\"{version}\"}} 1\n"),
        "# TYPE lockstep_build_info gauge\n",
        "lockstep_server_up 1\n",
        "lockstep_apply_lag_entries ",
        "lockstep_apply_lag_seconds ",
        "# TYPE lockstep_persisted_entries_total counter\n",
    ] {
        assert!(m1.contains(want), "no {want:?} in\n{m1}");
    }
    // No ZooKeeper in static election mode: no session gauge; no lag
    // without a unit.
    assert!(!m1.contains("lockstep_zookeeper_connected"), "{m1}");
    assert!(!m1.contains("lockstep_apply_lag "), "{m1}");
    wait_http(&c, metrics[1], "/metrics", "node 2 as backup", |code, b| {
        code == 200
            && b.contains("lockstep_role{role=\"backup\"} 1\n")
            && b.contains("lockstep_server_up 1\n")
    });

    // Node 2's server dies: its follower reports it.
    c.kill_server(2);
    wait_http(
        &c,
        metrics[1],
        "/metrics",
        "node 2 stale, server down",
        |code, b| {
            code == 200
                && b.contains("lockstep_role{role=\"stale\"} 1\n")
                && b.contains("lockstep_role{role=\"backup\"} 0\n")
                && b.contains("lockstep_server_up 0\n")
        },
    );
    let (code, m3) = http_get(metrics[2], "/metrics").expect("scrape node 3");
    assert_eq!(code, 200);
    assert!(m3.contains("lockstep_role{role=\"backup\"} 1\n"), "{m3}");
}

#[test]
fn health_and_leader_endpoints() {
    let mut c = TestCluster::new("obs-health", Options::default());
    let metrics = with_metrics(&mut c);
    c.start_all();
    let body = wait_http(&c, metrics[0], "/leader", "node 1 leading", |code, _| {
        code == 200
    });
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["leader"], 1, "{v}");
    assert_eq!(v["app"], c.app(1).to_string(), "{v}");
    assert!(v["view"].as_u64().is_some_and(|x| x >= 1), "{v}");
    for (i, m) in metrics.iter().enumerate().skip(1) {
        let (code, body) = http_get(*m, "/leader").expect("GET /leader");
        assert_eq!(code, 503, "node {}: {body}", i + 1);
        // The 503 names the leader it knows of.
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(v["app"], c.app(1).to_string(), "{v}");
    }
    for m in &metrics {
        wait_http(&c, *m, "/health", "every node healthy", |code, _| {
            code == 200
        });
    }
    let (code, _) = http_get(metrics[0], "/nothing-here").expect("GET");
    assert_eq!(code, 404);

    // A backup whose server died is no healthy member, nor the leader.
    c.kill_server(3);
    let body = wait_http(&c, metrics[2], "/health", "node 3 unhealthy", |code, _| {
        code == 503
    });
    assert!(body.contains("\"server_up\":false"), "{body}");
    assert_eq!(http_get(metrics[2], "/leader").expect("GET").0, 503);
    assert_eq!(http_get(metrics[0], "/health").expect("GET").0, 200);
    assert_eq!(http_get(metrics[0], "/leader").expect("GET").0, 200);
}

// ---------------------------------------------------------------------
// HAProxy in front of a ZooKeeper-elected cluster (examples/haproxy.cfg)

/// `haproxy -db -f cfg`, killed when dropped.
struct Haproxy(std::process::Child);

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One client's history: ids whose RPUSH was acknowledged, and how often
/// it had to reconnect.
#[derive(Default)]
struct ClientLog {
    acked: Vec<String>,
    reconnects: u64,
}

/// A client of `front` that RPUSHes unique ids to `list` until `stop`,
/// reconnecting to the same address whenever its connection fails.
fn client(
    front: SocketAddr,
    list: &'static str,
    t: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    acked: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> ClientLog {
    use std::sync::atomic::Ordering;
    let mut log = ClientLog::default();
    let mut conn: Option<Resp> = None;
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let c = match conn.as_mut() {
            Some(c) => c,
            None => {
                match Resp::connect_with(front, Duration::from_secs(2), Duration::from_secs(10)) {
                    Ok(c) => conn.insert(c),
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                }
            }
        };
        i += 1;
        let id = format!("c{t}-{i}");
        match c.cmd(&[b"RPUSH", list.as_bytes(), id.as_bytes()]) {
            Ok(Value::Int(_)) => {
                log.acked.push(id);
                acked.fetch_add(1, Ordering::Relaxed);
            }
            // No reply, or not a write: not acknowledged (it may or may not
            // be in the list); a fresh connection goes to the leader.
            _ => {
                conn = None;
                log.reconnects += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    log
}

/// The node that leads, per the followers' status.
fn leader_of(c: &TestCluster, among: &[u64]) -> Option<u64> {
    among.iter().copied().find(|&id| {
        c.status(id)
            .is_ok_and(|s| s.role == "leader" && s.leader == id)
    })
}

#[test]
fn haproxy_clients_follow_a_leader_kill() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    const LIST: &str = "ha:list";
    const CLIENTS: usize = 4;

    let mut c = TestCluster::new("obs-haproxy", Options::default());
    let metrics = with_metrics(&mut c);
    let mut spare = SparePorts::of(&c).besides(metrics.iter().map(|m| m.port()));
    let mut port = || spare.next_port();
    let zk =
        ZookeeperServer::start_on_free_port(&c.dir.join("zk"), &mut port).expect("start ZooKeeper");
    c.use_zookeeper(&zk.addr().to_string(), 2000);
    c.set_backup_clients("deny");
    let front = SocketAddr::from(([127, 0, 0, 1], port()));

    // The shipped example, pointed at this cluster's addresses.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/haproxy.cfg");
    let mut cfg = std::fs::read_to_string(&example).expect("examples/haproxy.cfg");
    let mut swaps = vec![("127.0.0.1:7300".to_string(), front.to_string())];
    for i in 1..=3u64 {
        swaps.push((format!("127.0.0.1:730{i}"), c.app(i).to_string()));
        let m = metrics[i as usize - 1].port();
        swaps.push((format!("port 750{i}"), format!("port {m}")));
    }
    for (needle, with) in swaps {
        assert!(
            cfg.contains(&needle),
            "examples/haproxy.cfg has no {needle}"
        );
        cfg = cfg.replace(&needle, &with);
    }
    let cfg_path = c.dir.join("haproxy.cfg");
    std::fs::write(&cfg_path, cfg).expect("write haproxy.cfg");
    let log = std::fs::File::create(c.dir.join("haproxy.log")).expect("haproxy log");
    let _haproxy = Haproxy(
        Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&cfg_path)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("run haproxy (scripts/setup installs it)"),
    );

    for id in 1..=3 {
        c.start_follower(id);
    }
    for id in 1..=3 {
        c.start_server(id);
    }
    let all = [1u64, 2, 3];
    let start = Instant::now();
    let old = loop {
        if let Some(l) = leader_of(&c, &all) {
            break l;
        }
        assert!(start.elapsed() < HANG, "no leader\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(100));
    };
    // The session gauge, with ZooKeeper election.
    wait_http(
        &c,
        metrics[0],
        "/metrics",
        "a ZooKeeper session",
        |code, b| code == 200 && b.contains("lockstep_zookeeper_connected 1\n"),
    );
    // HAProxy routes to the leader once its check passed.
    let start = Instant::now();
    while !Resp::connect_with(front, Duration::from_secs(2), Duration::from_secs(5))
        .and_then(|mut r| r.cmd(&[b"PING"]))
        .is_ok_and(|r| r == Value::Simple("PONG".into()))
    {
        assert!(
            start.elapsed() < HANG,
            "no PONG through HAProxy\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let (stop, acked) = (stop.clone(), acked.clone());
            std::thread::spawn(move || client(front, LIST, t, stop, acked))
        })
        .collect();
    let wait_acks = |c: &TestCluster, n: u64, what: &str| {
        let start = Instant::now();
        let from = acked.load(Ordering::Relaxed);
        while acked.load(Ordering::Relaxed) < from + n {
            assert!(
                start.elapsed() < HANG,
                "{what}: {} acknowledged writes\n{}",
                acked.load(Ordering::Relaxed) - from,
                c.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_acks(&c, 200, "writes through HAProxy to the first leader");

    c.kill_server(old);
    c.kill_follower(old);
    let alive: Vec<u64> = all.iter().copied().filter(|&i| i != old).collect();
    let start = Instant::now();
    let new = loop {
        if let Some(l) = leader_of(&c, &alive) {
            break l;
        }
        assert!(start.elapsed() < HANG, "no new leader\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(100));
    };
    wait_acks(&c, 200, "writes through HAProxy to the new leader");
    stop.store(true, Ordering::Relaxed);
    let logs: Vec<ClientLog> = clients.into_iter().map(|h| h.join().unwrap()).collect();

    // Every acknowledged id is on the new leader, once.
    let mut r = Resp::connect(c.app(new)).expect("connect to the new leader");
    let Value::Array(items) = r
        .cmd(&[b"LRANGE", LIST.as_bytes(), b"0", b"-1"])
        .expect("LRANGE")
    else {
        panic!("LRANGE answered no array");
    };
    let mut count = std::collections::HashMap::new();
    for it in items {
        if let Value::Bulk(b) = it {
            *count
                .entry(String::from_utf8_lossy(&b).into_owned())
                .or_insert(0u32) += 1;
        }
    }
    let mut total = 0;
    for (t, l) in logs.iter().enumerate() {
        assert!(l.reconnects >= 1, "client {t} never lost its leader");
        for id in &l.acked {
            assert_eq!(
                count.get(id),
                Some(&1),
                "acknowledged {id} on the new leader"
            );
        }
        total += l.acked.len();
    }
    assert!(count.values().all(|&n| n == 1), "an id twice in {LIST}");
    eprintln!(
        "leader {old} killed, {new} took over behind HAProxy: {total} acknowledged writes, reconnects {:?}",
        logs.iter().map(|l| l.reconnects).collect::<Vec<_>>()
    );
}

#[test]
fn a_rejoining_node_is_catching_up_and_unhealthy_until_it_applied_its_backlog() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;

    const LAG: usize = 200;
    let mut c = TestCluster::new(
        "obs-catchup",
        Options {
            extra: format!("max_apply_lag = {LAG}\n"),
            ..Options::default()
        },
    );
    let metrics = with_metrics(&mut c);
    c.start_all();
    // Node 3 goes away; the log grows long meanwhile.
    c.kill_server(3);
    c.kill_follower(3);
    set_keys(c.app(1), "rejoin:away", 10 * LAG);
    // It comes back (its data dir kept, a fresh server), and its server is
    // frozen as soon as it attached: whatever it replayed by then, the
    // entries written next are more than max_apply_lag that it has not.
    c.start_follower(3);
    c.start_server(3);
    // The server itself (it runs in a PID namespace under a launcher): the
    // pid its preload reports once attached.
    let mut attached = 0;
    c.wait("node 3's server to attach", HANG, |c| {
        c.status(3).is_ok_and(|s| s.server_pid != 0)
    });
    if let Ok(s) = c.status(3) {
        attached = s.server_pid;
    }
    let pid = Pid::from_raw(attached as i32);
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP node 3's server");
    set_keys(c.app(1), "rejoin:behind", 2 * LAG);
    c.wait("node 3 to store the leader's log", HANG, |c| {
        let (Ok(l), Ok(s)) = (c.status(1), c.status(3)) else {
            return false;
        };
        s.committed >= l.persisted
    });
    let s = c.status(3).expect("node 3 status");
    assert_eq!(s.role, "catching-up", "{s:?}");
    assert!(s.committed - s.applied > LAG as u64, "{s:?}");
    let body = wait_http(
        &c,
        metrics[2],
        "/health",
        "a 503 while catching up",
        |code, b| code == 503 && b.contains("\"role\":\"catching-up\""),
    );
    assert!(body.contains("\"server_up\":true"), "{body}");
    let m = wait_http(
        &c,
        metrics[2],
        "/metrics",
        "the catching-up role",
        |code, b| code == 200 && b.contains("lockstep_role{role=\"catching-up\"} 1\n"),
    );
    assert!(m.contains("lockstep_role{role=\"backup\"} 0\n"), "{m}");
    let (code, json) = cli_status_json(&c.config_path);
    assert_eq!(code, 0, "a catching-up node still acks: {json}");
    assert_eq!(json["nodes"][2]["role"], "catching-up", "{json}");
    assert!(
        json["nodes"][2]["lag"].as_u64() > Some(LAG as u64),
        "{json}"
    );
    let (_, text) = cli_status(&c.config_path, false);
    assert!(
        text.contains("node 3: catching up: ") && text.contains("entries left to apply"),
        "{text}"
    );

    // Thawed, it applies its backlog: then it is a backup, healthy.
    kill(pid, Signal::SIGCONT).expect("SIGCONT node 3's server");
    wait_http(
        &c,
        metrics[2],
        "/health",
        "a 200 once caught up",
        |code, b| code == 200 && b.contains("\"role\":\"backup\""),
    );
    c.wait_converged(HANG);
    assert_eq!(c.status(3).expect("node 3 status").role, "backup");
    c.assert_same_digest();
    c.assert_no_divergence();
}
