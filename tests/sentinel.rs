//! The Redis Sentinel protocol end to end: a ZooKeeper-election cluster of
//! real redis-servers whose followers each serve `sentinel = "host:port"`,
//! and an unmodified client library (redis-py's `Sentinel(...).master_for`,
//! Debian's python3-redis) writing through whoever leads. The leader is
//! SIGKILLed (server and follower); the same client object carries on
//! against the new leader, nothing it saw acknowledged is lost, and a
//! `+switch-master` subscriber hears of the switch.
//!
//! Durations only bound how long the test waits before it reports a hang.

mod cluster;

use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cluster::{Options, Reply, Resp, SparePorts, TestCluster, ZookeeperServer};

const HANG: Duration = Duration::from_secs(180);
const SESSION_MS: u64 = 2000;
const PYTHON: &str = "/usr/bin/python3";

/// The client: writes `sn:<i>` through `master_for(name)`, one line per
/// acknowledged key into `acked`; once `killed` exists it writes 50 more and
/// exits 0. Each write retries on ConnectionError/TimeoutError (redis-py's
/// MasterNotFoundError and its "previous master is now a slave" are
/// ConnectionErrors) at most 600 times, 0.2 s apart.
const CLIENT: &str = r#"
import os, sys, time
from redis.sentinel import Sentinel
from redis.exceptions import ConnectionError, TimeoutError

sentinels = [(h, int(p)) for h, p in (a.rsplit(":", 1) for a in sys.argv[1].split(","))]
name, acked_path, killed_path = sys.argv[2], sys.argv[3], sys.argv[4]
sentinel = Sentinel(sentinels, socket_timeout=5)
master = sentinel.master_for(name, socket_timeout=5)
acked = open(acked_path, "a")
i, after, retries = 0, None, 0
while True:
    key = "sn:%d" % i
    for attempt in range(600):
        try:
            master.set(key, i)
            break
        except (ConnectionError, TimeoutError) as e:
            retries += 1
            if retries % 25 == 1:
                print("retrying %s: %r" % (key, e), flush=True)
            time.sleep(0.2)
    else:
        print("gave up on %s" % key, flush=True)
        sys.exit(2)
    acked.write(key + "\n")
    acked.flush()
    i += 1
    if after is None and os.path.exists(killed_path):
        after = i
    if after is not None and i - after >= 50:
        break
    if i > 200000:
        print("never saw the kill", flush=True)
        sys.exit(3)
print("writes %d retries %d master %s:%d" % ((i, retries) + sentinel.discover_master(name)), flush=True)
"#;

/// A ZooKeeper-election cluster of `nodes` Redis nodes with a sentinel
/// address each; returns them too.
fn sentinel_cluster(test: &str, nodes: usize) -> (TestCluster, ZookeeperServer, Vec<SocketAddr>) {
    let mut c = TestCluster::new(
        test,
        Options {
            nodes,
            extra: "protocol = \"redis\"\n".into(),
            ..Options::default()
        },
    );
    let mut spare = SparePorts::of(&c);
    let mut fresh = || spare.next_port();
    let mut text = std::fs::read_to_string(&c.config_path).expect("read config");
    let mut sentinels = Vec::new();
    for n in &c.nodes {
        let s = SocketAddr::from(([127, 0, 0, 1], fresh()));
        let line = format!("control = \"{}\"\n", n.control);
        assert!(text.contains(&line), "{text}");
        text = text.replacen(&line, &format!("{line}sentinel = \"{s}\"\n"), 1);
        sentinels.push(s);
    }
    std::fs::write(&c.config_path, text).expect("write config");
    let zk = ZookeeperServer::start_on_free_port(&c.dir.join("zk"), &mut fresh)
        .expect("start ZooKeeper");
    c.use_zookeeper(&zk.addr().to_string(), SESSION_MS);
    c.set_backup_clients("deny");
    for id in 1..=nodes as u64 {
        c.start_follower(id);
    }
    for id in 1..=nodes as u64 {
        c.start_server(id);
    }
    (c, zk, sentinels)
}

fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Kills the client when the test ends early.
struct Client(Child);

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sentinel_cmd(addr: SocketAddr, args: &[&str]) -> Reply {
    let mut r = Resp::connect(addr).expect("connect sentinel");
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    r.cmd(&args).expect("sentinel reply")
}

fn addr_reply(a: SocketAddr) -> Reply {
    Reply::Array(Some(vec![
        Reply::Bulk(Some(a.ip().to_string().into_bytes())),
        Reply::Bulk(Some(a.port().to_string().into_bytes())),
    ]))
}

#[test]
fn redis_py_sentinel_client_follows_a_leader_sigkill() {
    let python_has_redis = Command::new(PYTHON)
        .args(["-c", "import redis.sentinel"])
        .env_remove("LD_PRELOAD")
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        python_has_redis,
        "{PYTHON} cannot import redis: install Debian's python3-redis (scripts/setup does)"
    );
    let (mut c, _zk, sentinels) = sentinel_cluster("sentinel", 3);
    let all = [1, 2, 3];
    let old = c.wait_leader_among(&all, HANG);
    let name = c.name.clone();
    for s in &sentinels {
        c.wait("every sentinel to name the leader", HANG, |c| {
            sentinel_cmd(*s, &["SENTINEL", "get-master-addr-by-name", &name])
                == addr_reply(c.app(old))
        });
        assert_eq!(
            sentinel_cmd(*s, &["ROLE"]),
            Reply::Array(Some(vec![
                Reply::Bulk(Some(b"sentinel".to_vec())),
                Reply::Array(Some(vec![Reply::Bulk(Some(name.clone().into_bytes()))])),
            ]))
        );
    }

    let acked = c.dir.join("acked.txt");
    let killed = c.dir.join("killed");
    let script = c.dir.join("client.py");
    std::fs::write(&script, CLIENT).expect("write client");
    let list: Vec<String> = sentinels.iter().map(|s| s.to_string()).collect();
    let out = std::fs::File::create(c.dir.join("client.log")).expect("client log");
    let mut client = Client(
        Command::new(PYTHON)
            .arg(&script)
            .arg(list.join(","))
            .arg(&name)
            .arg(&acked)
            .arg(&killed)
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start python client"),
    );
    c.wait("50 writes through the first leader", HANG, |_| {
        lines(&acked).len() >= 50
    });

    // A subscriber on a node that survives.
    let watcher = all.iter().copied().find(|&i| i != old).unwrap();
    let mut sub = Resp::connect(sentinels[(watcher - 1) as usize]).expect("subscribe");
    sub.set_read_timeout(HANG).unwrap();
    let reply = sub
        .cmd(&[b"SUBSCRIBE", b"+switch-master"])
        .expect("subscribed");
    assert_eq!(
        reply,
        Reply::Array(Some(vec![
            Reply::Bulk(Some(b"subscribe".to_vec())),
            Reply::Bulk(Some(b"+switch-master".to_vec())),
            Reply::Int(1),
        ]))
    );

    c.kill_server(old);
    c.kill_follower(old);
    std::fs::write(&killed, "").expect("mark killed");
    let alive: Vec<u64> = all.iter().copied().filter(|&i| i != old).collect();
    let new = c.wait_leader_among(&alive, HANG);

    let message = sub.read().expect("+switch-master message");
    let want = format!(
        "{name} {} {} {} {}",
        c.app(old).ip(),
        c.app(old).port(),
        c.app(new).ip(),
        c.app(new).port()
    );
    assert_eq!(
        message,
        Reply::Array(Some(vec![
            Reply::Bulk(Some(b"message".to_vec())),
            Reply::Bulk(Some(b"+switch-master".to_vec())),
            Reply::Bulk(Some(want.into_bytes())),
        ])),
        "{}",
        c.logs()
    );

    let start = Instant::now();
    let status = loop {
        if let Some(s) = client.0.try_wait().expect("client wait") {
            break s;
        }
        if start.elapsed() > HANG {
            panic!(
                "the client hung; its log:\n{}\n{}",
                std::fs::read_to_string(c.dir.join("client.log")).unwrap_or_default(),
                c.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut log = String::new();
    let _ =
        std::fs::File::open(c.dir.join("client.log")).and_then(|mut f| f.read_to_string(&mut log));
    assert!(
        status.success(),
        "client failed ({status}):\n{log}\n{}",
        c.logs()
    );
    eprintln!(
        "leader {old} killed, {new} took over; client: {}",
        log.trim()
    );
    assert!(
        log.contains(&format!("master {}", c.app(new))),
        "the client did not end on the new leader:\n{log}"
    );

    // Every acknowledged write is on the new leader.
    let keys = lines(&acked);
    assert!(keys.len() >= 100, "{} writes", keys.len());
    let mut r = Resp::connect(c.app(new)).expect("connect new leader");
    for k in &keys {
        let i = k.strip_prefix("sn:").expect("key");
        assert_eq!(
            r.cmd(&[b"GET", k.as_bytes()]).expect("GET"),
            Reply::Bulk(Some(i.as_bytes().to_vec())),
            "acknowledged {k} missing on the new leader {new}"
        );
    }
    for s in alive.iter().map(|&i| sentinels[(i - 1) as usize]) {
        assert_eq!(
            sentinel_cmd(s, &["SENTINEL", "get-master-addr-by-name", &name]),
            addr_reply(c.app(new))
        );
        match sentinel_cmd(s, &["INFO"]) {
            Reply::Bulk(Some(b)) => {
                let text = String::from_utf8_lossy(&b).to_string();
                assert!(
                    text.contains(&format!(
                        "master0:name={name},status=ok,address={},slaves=2,sentinels=3",
                        c.app(new)
                    )),
                    "{text}"
                );
            }
            other => panic!("INFO: {other:?}"),
        }
    }
}
