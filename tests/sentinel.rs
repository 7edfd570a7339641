//! The Redis Sentinel protocol end to end: a ZooKeeper-election cluster of
//! real redis-servers whose followers each serve `sentinel = "host:port"`,
//! and unmodified client libraries writing through whoever leads: Debian's
//! redis-py 4 (RESP2), today's redis-py from PyPI and ioredis from npm (both
//! RESP3, pinned in `tests/clients/`, installed by `scripts/setup`). The
//! leader is SIGKILLed (server and follower); the same client object
//! carries on against the new leader, nothing it saw acknowledged is lost,
//! and `+switch-master` subscribers (the client's own, and this test's on
//! RESP2 and RESP3) hear of the switch. Another test checks that Sentinel
//! names no master while the leader cannot reach a majority.
//!
//! Durations only bound how long the test waits before it reports a hang.

use lockstep_testkit::cluster;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cluster::{Options, Resp, SparePorts, TestCluster, Value, ZookeeperServer};
use lockstep_common::resp::read_value;

const HANG: Duration = Duration::from_secs(180);
const SESSION_MS: u64 = 2000;
/// Debian's python3, with its python3-redis (redis-py 4).
const DEBIAN_PYTHON: &str = "/usr/bin/python3";

/// The redis-py client (4.x and today's alike): writes `sn:<i>` through
/// `master_for(name)`, one line per acknowledged key into `acked`; once
/// `killed` exists it writes 50 more and exits 0. Each write retries on
/// ConnectionError/TimeoutError (redis-py's MasterNotFoundError and its
/// "previous master is now a slave" are ConnectionErrors) at most 600
/// times, 0.2 s apart. A thread per sentinel subscribes to `+switch-master`
/// before the first write; the last line names the replicas
/// `discover_slaves` finds, the master and the switch heard. The
/// optional 5th argument is the protocol (2 or 3) for every connection.
const REDIS_PY: &str = r#"
import os, sys, threading, time
from redis import Redis
from redis.sentinel import Sentinel
from redis.exceptions import ConnectionError, TimeoutError

sentinels = [(h, int(p)) for h, p in (a.rsplit(":", 1) for a in sys.argv[1].split(","))]
name, acked_path, killed_path = sys.argv[2], sys.argv[3], sys.argv[4]
proto = {"protocol": int(sys.argv[5])} if len(sys.argv) > 5 else {}
sentinel = Sentinel(sentinels, socket_timeout=5, sentinel_kwargs=dict(socket_timeout=5, **proto), **proto)
master = sentinel.master_for(name, socket_timeout=5)

switches, subscribed = [], []
def watch(host, port):
    try:
        p = Redis(host=host, port=port, **proto).pubsub()
        p.subscribe("+switch-master")
        for m in p.listen():
            if m["type"] == "subscribe":
                subscribed.append(port)
            elif m["type"] == "message":
                switches.append(m["data"].decode())
    except Exception:
        pass
for h, p in sentinels:
    threading.Thread(target=watch, args=(h, p), daemon=True).start()
for _ in range(300):
    if len(subscribed) == len(sentinels):
        break
    time.sleep(0.1)
else:
    print("subscribed to only %r" % subscribed, flush=True)
    sys.exit(4)

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
for _ in range(300):
    if switches:
        break
    time.sleep(0.1)
host, port = sentinel.discover_master(name)
slaves = len(sentinel.discover_slaves(name))
print("writes %d retries %d slaves %d master %s:%d switch %s" % (i, retries, slaves, host, port, switches[:1]), flush=True)
"#;

/// The same client with ioredis: `new Redis({ sentinels, name })` with its
/// defaults (its `failoverDetector` stays off, as ioredis ships it: when a
/// switch message comes while the client is still resolving the master,
/// ioredis 6.0.0 ends the connection for good), its own `+switch-master`
/// subscriber on each sentinel, the same writes, retries and last line.
const IOREDIS: &str = r#"
const Redis = require("ioredis");
const fs = require("fs");
const [list, name, ackedPath, killedPath] = process.argv.slice(2);
const sentinels = list.split(",").map((a) => {
  const at = a.lastIndexOf(":");
  return { host: a.slice(0, at), port: Number(a.slice(at + 1)) };
});
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const retry = () => 200;

async function main() {
  const switches = [];
  const subscribers = sentinels.map((s) => {
    const sub = new Redis({ ...s, protocol: 3, retryStrategy: retry, lazyConnect: true });
    sub.on("error", () => {});
    sub.on("message", (channel, message) => switches.push(message));
    return sub;
  });
  await Promise.all(subscribers.map((s) => s.subscribe("+switch-master")));
  const master = new Redis({
    sentinels, name, protocol: 3,
    sentinelRetryStrategy: retry, retryStrategy: retry,
    commandTimeout: 5000, maxRetriesPerRequest: 1,
  });
  master.on("error", () => {});
  const acked = fs.openSync(ackedPath, "a");
  let i = 0, after = null, retries = 0;
  for (;;) {
    const key = "sn:" + i;
    let done = false;
    for (let attempt = 0; attempt < 600 && !done; attempt++) {
      try {
        if ((await master.set(key, String(i))) !== "OK") throw new Error("not OK");
        done = true;
      } catch (e) {
        retries++;
        if (retries % 25 === 1) console.log(`retrying ${key}: ${e.message}`);
        await sleep(200);
      }
    }
    if (!done) { console.log("gave up on " + key); process.exit(2); }
    fs.writeSync(acked, key + "\n");
    i++;
    if (after === null && fs.existsSync(killedPath)) after = i;
    if (after !== null && i - after >= 50) break;
    if (i > 200000) { console.log("never saw the kill"); process.exit(3); }
  }
  for (let n = 0; n < 300 && switches.length === 0; n++) await sleep(100);
  const at = `${master.stream.remoteAddress}:${master.stream.remotePort}`;
  console.log(`writes ${i} retries ${retries} master ${at} switch ${JSON.stringify(switches.slice(0, 1))}`);
  process.exit(0);
}
main().catch((e) => { console.log("failed: " + (e && e.stack)); process.exit(5); });
"#;

/// One client program to run against the cluster.
struct ClientProgram {
    /// What it is, for messages.
    label: &'static str,
    /// The interpreter.
    program: PathBuf,
    /// The script's file name and text.
    script: (&'static str, &'static str),
    /// Arguments after the common ones.
    extra_args: Vec<String>,
    /// Environment the interpreter needs.
    env: Vec<(&'static str, PathBuf)>,
    /// Whether its last line says how many replicas it found (`slaves N`).
    lists_replicas: bool,
}

/// `tests/clients/`: the pinned client libraries of today.
fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// The version `tests/clients/requirements.txt` pins for `package`.
fn pinned(package: &str) -> String {
    let text = std::fs::read_to_string(clients_dir().join("requirements.txt"))
        .expect("read tests/clients/requirements.txt");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{package}==")))
        .unwrap_or_else(|| panic!("requirements.txt pins no {package}"))
        .trim()
        .to_string()
}

/// Runs `program args` and returns its trimmed output, or panics naming
/// `missing` (what to install) when it fails.
fn probe(program: &Path, args: &[&str], env: &[(&str, PathBuf)], missing: &str) -> String {
    let out = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env_remove("LD_PRELOAD")
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        Ok(o) => panic!(
            "{missing}: {} {args:?} failed: {}",
            program.display(),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!("{missing}: cannot run {}: {e}", program.display()),
    }
}

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
    let mut sentinels = Vec::new();
    c.change_config(|mut s| {
        for n in s.nodes_mut() {
            let a = SocketAddr::from(([127, 0, 0, 1], fresh()));
            n.sentinel = Some(a);
            sentinels.push(a);
        }
        s
    });
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

fn sentinel_cmd(addr: SocketAddr, args: &[&str]) -> Value {
    let mut r = Resp::connect(addr).expect("connect sentinel");
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    r.cmd(&args).expect("sentinel reply")
}

fn addr_reply(a: SocketAddr) -> Value {
    Value::Array(vec![
        Value::Bulk(a.ip().to_string().into_bytes()),
        Value::Bulk(a.port().to_string().into_bytes()),
    ])
}

/// A RESP3 `+switch-master` subscriber: `HELLO 3`, then `SUBSCRIBE`,
/// both answered as a Sentinel answers a RESP3 client.
fn resp3_subscriber(addr: SocketAddr) -> BufReader<TcpStream> {
    let s = TcpStream::connect(addr).expect("connect sentinel");
    s.set_read_timeout(Some(HANG)).unwrap();
    let mut r = BufReader::new(s);
    r.get_mut().write_all(b"HELLO 3\r\n").unwrap();
    match read_value(&mut r).expect("HELLO 3") {
        Value::Map(fields) => {
            let text = |r: &Value| match r {
                Value::Bulk(b) => String::from_utf8_lossy(b).to_string(),
                Value::Int(n) => n.to_string(),
                other => format!("{other:?}"),
            };
            let pairs: Vec<(String, String)> =
                fields.iter().map(|(k, v)| (text(k), text(v))).collect();
            let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
            assert_eq!(get("proto").as_deref(), Some("3"), "{pairs:?}");
            assert_eq!(get("mode").as_deref(), Some("sentinel"), "{pairs:?}");
            assert_eq!(get("server").as_deref(), Some("redis"), "{pairs:?}");
        }
        other => panic!("HELLO 3: {other:?}"),
    }
    r.get_mut()
        .write_all(b"SUBSCRIBE +switch-master\r\n")
        .unwrap();
    expect_bytes(
        &mut r,
        b">3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n",
    );
    r
}

/// Reads exactly `want.len()` bytes and compares them with `want`.
fn expect_bytes(r: &mut impl BufRead, want: &[u8]) {
    let mut got = vec![0u8; want.len()];
    r.read_exact(&mut got).expect("read from sentinel");
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(want),
        "from a sentinel"
    );
}

/// Runs `client` against a 3-node cluster with a sentinel per node,
/// SIGKILLs the leader under its writes and checks that it follows the
/// switch with nothing acknowledged lost.
fn client_follows_a_leader_sigkill(test: &str, client: ClientProgram) {
    let (mut c, _zk, sentinels) = sentinel_cluster(test, 3);
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
            Value::Array(vec![
                Value::Bulk(b"sentinel".to_vec()),
                Value::Array(vec![Value::Bulk(name.clone().into_bytes())]),
            ])
        );
    }

    let acked = c.dir.join("acked.txt");
    let killed = c.dir.join("killed");
    let script = c.dir.join(client.script.0);
    std::fs::write(&script, client.script.1).expect("write client");
    let list: Vec<String> = sentinels.iter().map(|s| s.to_string()).collect();
    let log_path = c.dir.join("client.log");
    let out = std::fs::File::create(&log_path).expect("client log");
    let mut child = Client(
        Command::new(&client.program)
            .arg(&script)
            .arg(list.join(","))
            .arg(&name)
            .arg(&acked)
            .arg(&killed)
            .args(&client.extra_args)
            .envs(client.env.iter().map(|(k, v)| (k, v)))
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start the {} client: {e}", client.label)),
    );
    let client_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    c.wait("50 writes through the first leader", HANG, |_| {
        lines(&acked).len() >= 50
    });

    // Subscribers on a node that survives, in both protocols.
    let watcher = all.iter().copied().find(|&i| i != old).unwrap();
    let watched = sentinels[(watcher - 1) as usize];
    let mut sub = Resp::connect(watched).expect("subscribe");
    sub.set_read_timeout(HANG).unwrap();
    let reply = sub
        .cmd(&[b"SUBSCRIBE", b"+switch-master"])
        .expect("subscribed");
    assert_eq!(
        reply,
        Value::Array(vec![
            Value::Bulk(b"subscribe".to_vec()),
            Value::Bulk(b"+switch-master".to_vec()),
            Value::Int(1),
        ])
    );
    let mut sub3 = resp3_subscriber(watched);

    c.kill_server(old);
    c.kill_follower(old);
    std::fs::write(&killed, "").expect("mark killed");
    let alive: Vec<u64> = all.iter().copied().filter(|&i| i != old).collect();
    let new = c.wait_leader_among(&alive, HANG);

    let payload = format!(
        "{name} {} {} {} {}",
        c.app(old).ip(),
        c.app(old).port(),
        c.app(new).ip(),
        c.app(new).port()
    );
    let message = sub.read().expect("+switch-master message");
    assert_eq!(
        message,
        Value::Array(vec![
            Value::Bulk(b"message".to_vec()),
            Value::Bulk(b"+switch-master".to_vec()),
            Value::Bulk(payload.clone().into_bytes()),
        ]),
        "{}",
        c.logs()
    );
    let push = format!(
        ">3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n${}\r\n{payload}\r\n",
        payload.len()
    );
    expect_bytes(&mut sub3, push.as_bytes());

    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.0.try_wait().expect("client wait") {
            break s;
        }
        if start.elapsed() > HANG {
            panic!(
                "the {} client hung; its log:\n{}\n{}",
                client.label,
                client_log(),
                c.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = client_log();
    assert!(
        status.success(),
        "the {} client failed ({status}):\n{log}\n{}",
        client.label,
        c.logs()
    );
    eprintln!(
        "{}: leader {old} killed, {new} took over; client: {}",
        client.label,
        log.trim()
    );
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.contains(&format!("master {}", c.app(new))),
        "the {} client did not end on the new leader:\n{log}",
        client.label
    );
    assert!(
        last.contains(&format!("switch [\"{payload}\"]"))
            || last.contains(&format!("switch ['{payload}']")),
        "the {} client's subscriber did not hear `+switch-master {payload}`:\n{log}",
        client.label
    );

    if client.lists_replicas {
        // The nodes that do not lead, the dead one included (a Sentinel
        // lists a replica that is down too).
        assert!(
            last.contains(" slaves 2 "),
            "the {} client found other replicas than the 2 non-leaders:\n{log}",
            client.label
        );
    }

    // Every acknowledged write is on the new leader.
    let keys = lines(&acked);
    assert!(keys.len() >= 100, "{} writes", keys.len());
    let mut r = Resp::connect(c.app(new)).expect("connect new leader");
    for k in &keys {
        let i = k.strip_prefix("sn:").expect("key");
        assert_eq!(
            r.cmd(&[b"GET", k.as_bytes()]).expect("GET"),
            Value::Bulk(i.as_bytes().to_vec()),
            "acknowledged {k} missing on the new leader {new}"
        );
    }
    for s in alive.iter().map(|&i| sentinels[(i - 1) as usize]) {
        assert_eq!(
            sentinel_cmd(s, &["SENTINEL", "get-master-addr-by-name", &name]),
            addr_reply(c.app(new))
        );
        match sentinel_cmd(s, &["INFO"]) {
            Value::Bulk(b) => {
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

#[test]
fn redis_py_sentinel_client_follows_a_leader_sigkill() {
    let program = PathBuf::from(DEBIAN_PYTHON);
    probe(
        &program,
        &["-c", "import redis.sentinel"],
        &[],
        "install Debian's python3-redis (scripts/setup does)",
    );
    client_follows_a_leader_sigkill(
        "sentinel",
        ClientProgram {
            label: "redis-py (Debian's, RESP2)",
            program,
            script: ("client.py", REDIS_PY),
            extra_args: vec![],
            env: vec![],
            lists_replicas: true,
        },
    );
}

#[test]
fn todays_redis_py_follows_a_leader_sigkill_over_resp3() {
    let program = clients_dir().join(".venv/bin/python");
    let want = pinned("redis");
    let have = probe(
        &program,
        &["-c", "import redis.sentinel; print(redis.__version__)"],
        &[],
        "run scripts/setup (it installs tests/clients/requirements.txt into tests/clients/.venv)",
    );
    assert_eq!(
        have, want,
        "tests/clients/.venv has redis-py {have}, requirements.txt pins {want}: run scripts/setup"
    );
    client_follows_a_leader_sigkill(
        "sentinel-py3",
        ClientProgram {
            label: "redis-py (PyPI, RESP3)",
            program,
            script: ("client.py", REDIS_PY),
            extra_args: vec!["3".into()],
            env: vec![],
            lists_replicas: true,
        },
    );
}

#[test]
fn ioredis_follows_a_leader_sigkill_over_resp3() {
    let modules = clients_dir().join("node_modules");
    let program = PathBuf::from("node");
    let lock: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(clients_dir().join("package-lock.json"))
            .expect("read tests/clients/package-lock.json"),
    )
    .expect("parse package-lock.json");
    let want = lock["packages"]["node_modules/ioredis"]["version"]
        .as_str()
        .expect("package-lock.json locks ioredis")
        .to_string();
    let env = vec![("NODE_PATH", modules)];
    let have = probe(
        &program,
        &["-e", "console.log(require('ioredis/package.json').version)"],
        &env,
        "install Node.js and run scripts/setup (it runs npm ci in tests/clients)",
    );
    assert_eq!(have, want, "tests/clients/node_modules has ioredis {have}, package-lock.json locks {want}: run scripts/setup");
    client_follows_a_leader_sigkill(
        "sentinel-ioredis",
        ClientProgram {
            label: "ioredis (npm, RESP3)",
            program,
            script: ("client.js", IOREDIS),
            extra_args: vec![],
            env,
            lists_replicas: false,
        },
    );
}

/// Sentinel names a master only while it can commit: with both backups'
/// followers gone, the leader still leads its view (its ZooKeeper session
/// lives, so nothing deposes it) but no majority acknowledges anything, so
/// its sentinel answers nil (RESP2 and RESP3) and `INFO` says the master is
/// down.
#[test]
fn sentinel_names_no_master_while_the_leader_cannot_reach_a_majority() {
    let (mut c, _zk, sentinels) = sentinel_cluster("sentinel-nomajority", 3);
    let leader = c.wait_leader_among(&[1, 2, 3], HANG);
    let name = c.name.clone();
    let at_leader = sentinels[(leader - 1) as usize];
    c.wait("the leader's sentinel to name it", HANG, |c| {
        sentinel_cmd(at_leader, &["SENTINEL", "get-master-addr-by-name", &name])
            == addr_reply(c.app(leader))
    });
    for id in [1, 2, 3].into_iter().filter(|&i| i != leader) {
        c.kill_follower(id);
    }
    // The nil must come while the leader still claims its view (its own
    // status says leader, before and after the answer): the sentinel
    // tells from the others that it cannot commit.
    let leads = |c: &TestCluster| {
        c.status(leader)
            .map(|s| s.role == "leader" && s.leader == leader)
            .unwrap_or(false)
    };
    c.wait("the leader's sentinel to answer nil", HANG, |c| {
        let before = leads(c);
        let nil = sentinel_cmd(at_leader, &["SENTINEL", "get-master-addr-by-name", &name])
            == Value::NullArray;
        if nil {
            assert!(
                before && leads(c),
                "the sentinel answered nil only once node {leader} stopped leading\n{}",
                c.logs()
            );
        }
        nil
    });
    let mut r = BufReader::new(TcpStream::connect(at_leader).expect("connect sentinel"));
    r.get_mut().set_read_timeout(Some(HANG)).unwrap();
    r.get_mut().write_all(b"HELLO 3\r\n").unwrap();
    read_value(&mut r).expect("HELLO 3");
    let cmd = format!("SENTINEL get-master-addr-by-name {name}\r\n");
    r.get_mut().write_all(cmd.as_bytes()).unwrap();
    expect_bytes(&mut r, b"_\r\n");
    match sentinel_cmd(at_leader, &["INFO"]) {
        Value::Bulk(b) => {
            let text = String::from_utf8_lossy(&b).to_string();
            assert!(
                text.contains(&format!("status=odown,address={}", c.app(leader))),
                "{text}"
            );
        }
        other => panic!("INFO: {other:?}"),
    }
}
