//! Backups re-execute the log through their own server's event loop, so
//! replicas must stay identical whatever that loop waits in. Each test runs
//! a 3-node lockstep cluster (real followers, shm transport, static
//! election) of one server kind — beanstalkd (epoll, level-triggered), a
//! select(2) server, a poll(2) server and an edge-triggered epoll server —
//! drives an order-sensitive workload from several connections through the
//! leader, waits until every node applied everything, and compares the
//! whole state of the three servers, what the clients saw acknowledged, and
//! the divergence counters. One test also restarts a backup (follower and
//! server) in the middle, so the restarted node rebuilds its server by
//! replaying the log through the same event loop.
//!
//! The small servers live in tests/apply_servers/: `kv.pl` (Perl, select or
//! poll), `kv_epoll_et.c` and `workers.c` (compiled with `cc` into the
//! test's temp dir).

use lockstep_testkit::cluster;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cluster::{Options, TestCluster};

/// Generous bound for anything to happen (2 shared cores, debug build).
const LIMIT: Duration = Duration::from_secs(300);
/// Client connections per workload.
const CLIENTS: usize = 4;

fn sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/apply_servers")
}

/// Fails (never skips) when `program` is not installed.
fn require(program: &str, args: &[&str], package: &str) {
    match Command::new(program).args(args).output() {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "`{program}` is not installed: install the Debian package `{package}` \
             (scripts/setup does)"
        ),
        Err(e) => panic!("cannot run `{program}`: {e}"),
    }
}

/// A 3-node cluster whose servers run `argv`, started.
fn start_cluster(test: &str, argv: &[&str]) -> TestCluster {
    let mut c = TestCluster::new(test, Options::default());
    c.use_server_command(argv);
    c.start_all();
    c
}

/// A line-protocol client.
struct Client {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        s.set_read_timeout(Some(LIMIT)).unwrap();
        s.set_nodelay(true).unwrap();
        Client {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.w.write_all(bytes).expect("send");
    }

    /// One reply line, without its line end.
    fn line(&mut self) -> String {
        let mut l = String::new();
        let n = self.r.read_line(&mut l).expect("read reply");
        assert!(n > 0, "the server closed the connection");
        l.trim_end_matches('\n').trim_end_matches('\r').to_string()
    }

    /// `n` bytes of body and the CRLF after them.
    fn body(&mut self, n: usize) -> String {
        let mut b = vec![0u8; n + 2];
        self.r.read_exact(&mut b).expect("read body");
        assert_eq!(&b[n..], b"\r\n", "body not followed by CRLF");
        b.truncate(n);
        String::from_utf8(b).expect("utf-8 body")
    }

    /// Sends one command line (`\n` for the kv servers, `\r\n` for
    /// beanstalkd is added by the caller) and reads one reply line.
    fn cmd(&mut self, line: &str) -> String {
        self.send(line.as_bytes());
        self.line()
    }
}

// ---------------------------------------------------------------------------
// The kv servers (select, poll, edge-triggered epoll).

/// What one kv workload run had acknowledged.
#[derive(Default)]
struct KvAcked {
    /// Commands that changed the state (each answered `OK <seq> ...`).
    mutations: u64,
    /// `INCR ctr` answered.
    incrs: u64,
    /// Per shared key, per client: the tokens appended, in client order.
    appends: BTreeMap<String, Vec<Vec<String>>>,
}

impl KvAcked {
    fn merge(&mut self, o: KvAcked) {
        self.mutations += o.mutations;
        self.incrs += o.incrs;
        for (k, per) in o.appends {
            let mine = self.appends.entry(k).or_default();
            mine.extend(per);
        }
    }
}

/// `OK <seq> <value>` → (seq, value); panics on anything else.
fn kv_ok(reply: &str, what: &str) -> (u64, String) {
    let f: Vec<&str> = reply.split(' ').collect();
    assert!(
        f.len() == 3 && f[0] == "OK",
        "{what} answered {reply:?}, expected OK <seq> <value>"
    );
    (f[1].parse().expect("seq"), f[2].to_string())
}

/// `CLIENTS` connections to `addr`, each doing `ops` order-sensitive
/// commands on shared keys, interleaved: APPENDs to three shared keys,
/// INCRs of one counter, pipelined batches (several commands in one write),
/// and APPEND+DEL of a private key. `phase` keeps tokens unique across runs.
fn kv_workload(addr: SocketAddr, phase: usize, ops: usize) -> KvAcked {
    let handles: Vec<_> = (0..CLIENTS)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut acked = KvAcked::default();
                let mut mine: BTreeMap<String, Vec<String>> = BTreeMap::new();
                let mut last_seq = 0u64;
                let mut seen = |reply: &str, what: &str, acked: &mut KvAcked| {
                    let (seq, v) = kv_ok(reply, what);
                    assert!(
                        seq > last_seq,
                        "client {t}: seq {seq} after {last_seq} ({what})"
                    );
                    last_seq = seq;
                    acked.mutations += 1;
                    v
                };
                for i in 0..ops {
                    let token = format!("<{phase}.{t}.{i}>");
                    match i % 6 {
                        0..=2 => {
                            let key = format!("shared:{}", (i + t) % 3);
                            let r = c.cmd(&format!("APPEND {key} {token}\n"));
                            seen(&r, "APPEND", &mut acked);
                            mine.entry(key).or_default().push(token);
                        }
                        3 => {
                            let r = c.cmd("INCR ctr\n");
                            seen(&r, "INCR", &mut acked);
                            acked.incrs += 1;
                        }
                        4 => {
                            // One write, three commands: the server may
                            // read them as one input or several.
                            let a = format!("<{phase}.{t}.{i}.a>");
                            let b = format!("<{phase}.{t}.{i}.b>");
                            c.send(
                                format!("APPEND shared:log {a}\nINCR ctr\nAPPEND shared:log {b}\n")
                                    .as_bytes(),
                            );
                            for what in ["APPEND", "INCR", "APPEND"] {
                                let r = c.line();
                                seen(&r, what, &mut acked);
                            }
                            acked.incrs += 1;
                            let log = mine.entry("shared:log".into()).or_default();
                            log.push(a);
                            log.push(b);
                        }
                        _ => {
                            let key = format!("tmp:{phase}:{t}");
                            let r = c.cmd(&format!("APPEND {key} {token}\n"));
                            seen(&r, "APPEND", &mut acked);
                            let r = c.cmd(&format!("DEL {key}\n"));
                            let had = seen(&r, "DEL", &mut acked);
                            assert_eq!(had, "1", "client {t}: DEL {key} found nothing");
                        }
                    }
                }
                for (k, tokens) in mine {
                    acked.appends.insert(k, vec![tokens]);
                }
                acked
            })
        })
        .collect();
    let mut all = KvAcked::default();
    for h in handles {
        all.merge(h.join().expect("kv client"));
    }
    all
}

/// The whole state of the kv server at `addr`: its DUMP lines, END last.
fn kv_dump(addr: SocketAddr) -> Vec<String> {
    let mut c = Client::connect(addr);
    c.send(b"DUMP\n");
    let mut lines = Vec::new();
    loop {
        let l = c.line();
        let end = l.starts_with("END ");
        assert!(end || l.starts_with("KEY "), "DUMP answered {l:?}");
        lines.push(l);
        if end {
            return lines;
        }
    }
}

/// Waits until every node applied everything, then checks that the three
/// servers hold the same state, that it is exactly what the clients saw
/// acknowledged, and that no node saw a divergence.
fn assert_kv_replicas_identical(c: &TestCluster, acked: &KvAcked) {
    c.wait_converged(LIMIT);
    // The leader's DUMP is itself an input the backups replay (read-only).
    let leader = kv_dump(c.app(1));
    c.wait_converged(LIMIT);
    for id in 2..=c.nodes.len() as u64 {
        let other = kv_dump(c.app(id));
        if other != leader {
            let first = leader
                .iter()
                .zip(&other)
                .position(|(a, b)| a != b)
                .unwrap_or(leader.len().min(other.len()));
            panic!(
                "node {id}'s state differs from the leader's (first at line {first}: \
                 leader {:?}, node {id} {:?}; {} vs {} lines)\n{}",
                leader.get(first),
                other.get(first),
                leader.len(),
                other.len(),
                c.logs()
            );
        }
    }
    let mut state: BTreeMap<String, String> = BTreeMap::new();
    for l in &leader[..leader.len() - 1] {
        let mut f = l.splitn(3, ' ');
        f.next();
        let k = f.next().expect("key").to_string();
        state.insert(k, f.next().unwrap_or("").to_string());
    }
    let end: Vec<&str> = leader.last().unwrap().split(' ').collect();
    assert_eq!(
        end[1].parse::<u64>().unwrap(),
        acked.mutations,
        "the server ran another number of state changes than were acknowledged"
    );
    assert_eq!(
        state.get("ctr").map(String::as_str),
        Some(acked.incrs.to_string().as_str()),
        "counter"
    );
    assert!(
        !state.keys().any(|k| k.starts_with("tmp:")),
        "a deleted key survived: {state:?}"
    );
    for (key, per_client) in &acked.appends {
        let value = state.get(key).unwrap_or_else(|| panic!("{key} missing"));
        let tokens: Vec<String> = value.split_inclusive('>').map(String::from).collect();
        let want: usize = per_client.iter().map(Vec::len).sum();
        assert_eq!(
            tokens.len(),
            want,
            "{key}: {} tokens stored, {want} appends acknowledged",
            tokens.len()
        );
        let stored: BTreeSet<&String> = tokens.iter().collect();
        for client_tokens in per_client {
            // Each client's appends are all there, in its own order.
            let mut at = 0;
            for t in client_tokens {
                assert!(stored.contains(t), "{key}: acknowledged append {t} lost");
                let pos = tokens[at..]
                    .iter()
                    .position(|x| x == t)
                    .unwrap_or_else(|| panic!("{key}: {t} out of its client's order"));
                at += pos + 1;
            }
        }
    }
    c.assert_no_divergence();
}

fn perl_kv(test: &str, mode: &'static str) {
    require("perl", &["-e", "1"], "perl");
    let script = sources().join("kv.pl");
    let script = script.to_str().expect("utf-8 path");
    let c = start_cluster(test, &["perl", script, mode, "{port}"]);
    let acked = kv_workload(c.app(1), 0, 240);
    assert_kv_replicas_identical(&c, &acked);
}

/// Compiles `name`.c of tests/apply_servers into `dir`; fails naming
/// build-essential when there is no C compiler.
fn build_c_server(dir: &Path, name: &str) -> String {
    require("cc", &["--version"], "build-essential");
    let out = dir.join(name);
    let r = Command::new("cc")
        .args(["-O1", "-Wall", "-pthread", "-o"])
        .arg(&out)
        .arg(sources().join(format!("{name}.c")))
        .output()
        .expect("run cc");
    assert!(
        r.status.success(),
        "cc failed to build {name}.c:\n{}",
        String::from_utf8_lossy(&r.stderr)
    );
    out.to_str().expect("utf-8 path").to_string()
}

#[test]
fn select_server_replicas_stay_identical() {
    perl_kv("kvselect", "select");
}

#[test]
fn poll_server_replicas_stay_identical() {
    perl_kv("kvpoll", "poll");
}

#[test]
fn edge_triggered_epoll_server_replicas_stay_identical() {
    let mut c = TestCluster::new("kvepollet", Options::default());
    let bin = build_c_server(&c.dir, "kv_epoll_et");
    c.use_server_command(&[&bin, "{port}"]);
    c.start_all();
    let acked = kv_workload(c.app(1), 0, 240);
    assert_kv_replicas_identical(&c, &acked);
}

/// A backup's follower and server are killed and restarted: the fresh
/// server is rebuilt by replaying the whole log through its edge-triggered
/// loop (while the leader goes on taking writes), then applies live
/// entries again.
#[test]
fn edge_triggered_epoll_backup_restart_replays_the_log() {
    let mut c = TestCluster::new("kvetrestart", Options::default());
    let bin = build_c_server(&c.dir, "kv_epoll_et");
    c.use_server_command(&[&bin, "{port}"]);
    c.start_all();
    let mut acked = kv_workload(c.app(1), 0, 120);
    c.wait_converged(LIMIT);

    c.kill_follower(3);
    c.kill_server(3);
    // Nodes 1 and 2 are a majority: the leader goes on without node 3.
    acked.merge(kv_workload(c.app(1), 1, 120));
    // Node 3 comes back while clients keep writing.
    let app = c.app(1);
    let during = std::thread::spawn(move || kv_workload(app, 2, 300));
    c.start_follower(3);
    c.start_server(3);
    acked.merge(during.join().expect("workload during the restart"));
    acked.merge(kv_workload(c.app(1), 3, 120));
    assert_kv_replicas_identical(&c, &acked);
}

// ---------------------------------------------------------------------------
// Two event loops on two threads (memcached's shape).

/// A backup hands its server the next turn only once the threads that
/// handled the last one went back to wait. What a listener loop does after
/// an accept, in the same turn (memcached runs its clock timer there: the
/// time its worker's commands read), comes before the worker loop reads
/// the connection's first input, as on the leader, whose turns never
/// overlap. `workers.c` with one worker (memcached `-t 1`) marks an accept
/// finished at the end of the listener's turn; every connection's first
/// command must see its own accept finished, on every replica (each
/// connection's close carries the digest of what it was answered).
#[test]
fn a_listeners_turn_ends_before_the_worker_reads_the_next_input() {
    let mut c = TestCluster::new("twoloops", Options::default());
    let bin = build_c_server(&c.dir, "workers");
    c.use_server_command(&[&bin, "{port}", "1"]);
    c.start_all();
    for _ in 0..8 {
        let mut k = Client::connect(c.app(1));
        assert_eq!(k.cmd("ACCEPTED\n"), "ACCEPTED yes");
    }
    c.wait_converged(LIMIT);
    c.assert_no_divergence();
}

/// A listener loop hands each connection to the next of four worker loops
/// in turn, and the workers append to shared keys (`workers.c`, shaped
/// like memcached `-t 4`). Sixteen connections ask which worker serves
/// them and append to three shared keys, some reading them back: every
/// backup's server answers each of them as the leader's did (the same
/// worker, the same interleaving of the workers' appends: any difference
/// is a divergence, checked at each connection's next input and close),
/// and the leader's values hold each connection's appends in its order.
/// Backups refuse their own clients with several workers, so the log's
/// own digests compare them.
#[test]
fn a_connection_runs_on_the_leaders_worker_loop_on_every_backup() {
    let mut c = TestCluster::new("fourloops", Options::default());
    let bin = build_c_server(&c.dir, "workers");
    c.use_server_command(&[&bin, "{port}", "4"]);
    c.start_all();
    const CONNS: usize = 16;
    const OPS: usize = 60;
    let app = c.app(1);
    let handles: Vec<_> = (0..CONNS)
        .map(|t| {
            std::thread::spawn(move || {
                let mut k = Client::connect(app);
                assert_eq!(k.cmd("ACCEPTED\n"), "ACCEPTED yes");
                let who = k.cmd("WHO\n");
                assert!(who.starts_with("WORKER "), "WHO answered {who:?}");
                for i in 0..OPS {
                    let r = k.cmd(&format!("APPEND shared:{} {t}.{i}\n", i % 3));
                    assert!(r.starts_with("OK "), "APPEND answered {r:?}");
                    if i % 7 == 0 {
                        let r = k.cmd(&format!("GET shared:{}\n", (i + t) % 3));
                        assert!(r.starts_with("VALUE "), "GET answered {r:?}");
                    }
                }
                who
            })
        })
        .collect();
    let mut workers = BTreeSet::new();
    for h in handles {
        workers.insert(h.join().expect("client"));
    }
    assert_eq!(workers.len(), 4, "connections landed on {workers:?}");
    {
        let mut k = Client::connect(app);
        for key in 0..3 {
            let v = k.cmd(&format!("GET shared:{key}\n"));
            for t in 0..CONNS {
                let mine: Vec<usize> = v
                    .split(' ')
                    .filter_map(|tok| tok.strip_prefix(&format!("{t}.")))
                    .map(|i| i.parse().expect("token"))
                    .collect();
                assert!(
                    mine.windows(2).all(|w| w[0] < w[1]) && mine.len() == OPS / 3,
                    "shared:{key} holds connection {t}'s appends as {mine:?}"
                );
            }
        }
    }
    c.wait_converged(LIMIT);
    c.assert_no_divergence();
}

// ---------------------------------------------------------------------------
// beanstalkd.

/// What the beanstalkd clients saw acknowledged.
#[derive(Default)]
struct BsAcked {
    /// Job id → body, for every `INSERTED`.
    inserted: BTreeMap<u64, String>,
    /// Ids answered `DELETED`.
    deleted: BTreeSet<u64>,
}

const TUBES: usize = 3;

/// `CLIENTS` connections putting jobs into three tubes (priorities above and
/// below the urgent bound) and, interleaved, reserving whatever is ready in
/// any tube (so who gets which job depends on the order of all inputs), then
/// deleting, burying, releasing or keeping it (kept jobs go back to ready
/// when the connection closes), and kicking buried jobs back.
fn beanstalkd_workload(addr: SocketAddr, ops: usize) -> BsAcked {
    let handles: Vec<_> = (0..CLIENTS)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut acked = BsAcked::default();
                for tube in 0..TUBES {
                    let r = c.cmd(&format!("watch tube{tube}\r\n"));
                    assert!(r.starts_with("WATCHING "), "watch answered {r:?}");
                }
                for i in 0..ops {
                    let tube = format!("tube{}", (t + i) % TUBES);
                    assert_eq!(c.cmd(&format!("use {tube}\r\n")), format!("USING {tube}"));
                    let body = format!("job-{t}-{i}");
                    let pri = (i % 4) * 500;
                    let r = c.cmd(&format!("put {pri} 0 3600 {}\r\n{body}\r\n", body.len()));
                    let id: u64 = r
                        .strip_prefix("INSERTED ")
                        .unwrap_or_else(|| panic!("put answered {r:?}"))
                        .parse()
                        .expect("job id");
                    acked.inserted.insert(id, body);
                    if i % 2 == 1 {
                        let r = c.cmd("reserve-with-timeout 0\r\n");
                        if r == "TIMED_OUT" {
                            continue;
                        }
                        let f: Vec<&str> = r.split(' ').collect();
                        assert!(f.len() == 3 && f[0] == "RESERVED", "reserve answered {r:?}");
                        let id: u64 = f[1].parse().expect("job id");
                        let body = c.body(f[2].parse().expect("job size"));
                        assert!(body.starts_with("job-"), "job {id} holds {body:?}");
                        match (i / 2) % 4 {
                            0 => {
                                assert_eq!(c.cmd(&format!("delete {id}\r\n")), "DELETED");
                                acked.deleted.insert(id);
                            }
                            1 => assert_eq!(c.cmd(&format!("bury {id} 100\r\n")), "BURIED"),
                            2 => {
                                assert_eq!(c.cmd(&format!("release {id} {pri} 0\r\n")), "RELEASED")
                            }
                            _ => {} // kept reserved until the connection ends
                        }
                    }
                    if i % 25 == 24 {
                        let r = c.cmd("kick 2\r\n");
                        assert!(r.starts_with("KICKED "), "kick answered {r:?}");
                    }
                }
                acked
            })
        })
        .collect();
    let mut all = BsAcked::default();
    for h in handles {
        let a = h.join().expect("beanstalkd client");
        all.inserted.extend(a.inserted);
        all.deleted.extend(a.deleted);
    }
    all
}

/// `stats-tube` as field → value.
fn stats_tube(c: &mut Client, tube: &str) -> BTreeMap<String, String> {
    let r = c.cmd(&format!("stats-tube {tube}\r\n"));
    let n: usize = r
        .strip_prefix("OK ")
        .unwrap_or_else(|| panic!("stats-tube answered {r:?}"))
        .parse()
        .expect("size");
    c.body(n)
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// One peek-type reply: `FOUND <id> <n>` and the body, or the line.
fn peek(c: &mut Client, cmd: &str) -> String {
    let r = c.cmd(cmd);
    let f: Vec<&str> = r.split(' ').collect();
    if f.len() == 3 && f[0] == "FOUND" {
        let body = c.body(f[2].parse().expect("job size"));
        format!("{r} {body}")
    } else {
        assert_eq!(r, "NOT_FOUND", "{cmd:?} answered {r:?}");
        r
    }
}

/// The state of the beanstalkd at `addr`, as comparable lines: the tubes,
/// each tube's job counts and counters, the next ready and buried job of
/// each tube, and every job id up to `max_id + 1` with its body. Left out:
/// the fields that count open connections (current-using, -watching,
/// -waiting) — they describe who is connected, not the data.
fn beanstalkd_dump(addr: SocketAddr, max_id: u64) -> Vec<String> {
    let mut c = Client::connect(addr);
    let mut out = Vec::new();
    let r = c.cmd("list-tubes\r\n");
    let n: usize = r.strip_prefix("OK ").expect("list-tubes").parse().unwrap();
    let mut tubes: Vec<String> = c
        .body(n)
        .lines()
        .filter_map(|l| l.strip_prefix("- "))
        .map(String::from)
        .collect();
    tubes.sort();
    out.push(format!("tubes {tubes:?}"));
    for tube in &tubes {
        for (k, v) in stats_tube(&mut c, tube) {
            if !matches!(
                k.as_str(),
                "current-using" | "current-watching" | "current-waiting"
            ) {
                out.push(format!("{tube} {k}: {v}"));
            }
        }
    }
    for tube in &tubes {
        assert_eq!(c.cmd(&format!("use {tube}\r\n")), format!("USING {tube}"));
        for what in ["peek-ready", "peek-buried", "peek-delayed"] {
            let p = peek(&mut c, &format!("{what}\r\n"));
            out.push(format!("{tube} {what}: {p}"));
        }
    }
    for id in 1..=max_id + 1 {
        let p = peek(&mut c, &format!("peek {id}\r\n"));
        out.push(format!("job {id}: {p}"));
    }
    out
}

/// Waits until the leader's beanstalkd handled the end of every workload
/// connection (their kept jobs are back in ready): nobody watches tube0.
/// (The polling connection's inputs are replicated too; their replies are
/// the same on every node, as everything depends on the log only.)
fn wait_workload_closed(c: &TestCluster) {
    let mut cl = Client::connect(c.app(1));
    let start = std::time::Instant::now();
    while stats_tube(&mut cl, "tube0")
        .get("current-watching")
        .is_none_or(|v| v != "0")
    {
        assert!(
            start.elapsed() < LIMIT,
            "the leader's beanstalkd never closed the workload connections\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn beanstalkd_replicas_stay_identical() {
    require("beanstalkd", &["-v"], "beanstalkd");
    // In memory only (no -b binlog): the state is what the log rebuilt.
    let c = start_cluster(
        "beanstalkd",
        &["beanstalkd", "-l", "127.0.0.1", "-p", "{port}"],
    );
    let acked = beanstalkd_workload(c.app(1), 150);
    assert!(
        !acked.deleted.is_empty(),
        "the workload deleted no job: it did not exercise reserve"
    );
    wait_workload_closed(&c);
    c.wait_converged(LIMIT);
    let max_id = *acked.inserted.keys().max().expect("jobs");
    assert_eq!(
        max_id as usize,
        acked.inserted.len(),
        "job ids are not 1..=N"
    );
    let leader = beanstalkd_dump(c.app(1), max_id);
    c.wait_converged(LIMIT);
    for id in 2..=c.nodes.len() as u64 {
        let other = beanstalkd_dump(c.app(id), max_id);
        let diff: Vec<_> = leader
            .iter()
            .zip(&other)
            .filter(|(a, b)| a != b)
            .take(10)
            .collect();
        assert!(
            diff.is_empty() && leader.len() == other.len(),
            "node {id}'s beanstalkd differs from the leader's: {diff:?}\n{}",
            c.logs()
        );
    }
    // Nothing acknowledged is lost: every job put and not deleted is there
    // with its body, every deleted one is gone, and no other job exists.
    for (id, body) in &acked.inserted {
        let line = &leader[leader.len() - 1 - (max_id + 1 - id) as usize];
        if acked.deleted.contains(id) {
            assert_eq!(line, &format!("job {id}: NOT_FOUND"));
        } else {
            assert_eq!(line, &format!("job {id}: FOUND {id} {} {body}", body.len()));
        }
    }
    assert_eq!(
        leader.last().unwrap(),
        &format!("job {}: NOT_FOUND", max_id + 1)
    );
    let live: usize = leader
        .iter()
        .filter(|l| {
            [
                "current-jobs-ready",
                "current-jobs-reserved",
                "current-jobs-buried",
                "current-jobs-delayed",
            ]
            .iter()
            .any(|f| l.contains(&format!(" {f}: ")))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<usize>().unwrap())
        .sum();
    assert_eq!(
        live,
        acked.inserted.len() - acked.deleted.len(),
        "live jobs"
    );
    assert!(
        leader
            .iter()
            .any(|l| l.contains("current-jobs-buried: ") && !l.ends_with(": 0")),
        "no job stayed buried: the workload did not exercise bury"
    );
    c.assert_no_divergence();
}
