//! Replicas stay identical when the server reads the clock or draws random
//! numbers: every replica's server reads the log's time while it handles
//! an input (preload's `clock`), so keys expire at the same log position
//! everywhere, and draws from the cluster's entropy (preload's `entropy`).
//! The divergence detector is proven with a reply that depends on the node.
//! Real followers, real redis-server, both commit modes (the suite's).

use lockstep_testkit::cluster;

use std::time::Duration;

use cluster::*;

const LIMIT: Duration = Duration::from_secs(60);

/// The most common Redis pattern there is: a fixed-window rate limiter.
/// Before the log's time, a backup applied each input later and with its
/// own clock: an INCR that created a fresh key on the leader incremented an
/// old one on the backup, and the backups kept `rl = 1` with no TTL.
#[test]
fn a_rate_limiter_leaves_identical_replicas() {
    let mut c = TestCluster::new("det-rl", Options::default());
    c.start_all();
    let mut r = Resp::connect(c.app(1)).unwrap();
    let mut windows = 0;
    for _ in 0..3000 {
        match r.cmd(&[b"INCR", b"rl"]).unwrap() {
            Value::Int(1) => {
                windows += 1;
                assert_eq!(r.cmd(&[b"PEXPIRE", b"rl", b"15"]).unwrap(), Value::Int(1));
            }
            Value::Int(_) => {}
            other => panic!("INCR answered {other:?}"),
        }
    }
    assert!(windows > 1, "the window never expired: no test of expiry");
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}

/// Blocking pops with a timeout, the queue pattern: a consumer's `BLPOP`
/// times out (Redis checks its blocked clients' deadlines before each wait,
/// at the turn's time) or gets the element a producer pushed. Which of the
/// two happened decides where every element goes, so a backup must time
/// the consumer out in the same turn as the leader. Rounds of three kinds:
/// a pop of a pushed element, a pop of an empty list (always times out),
/// and a push racing the pop's deadline (either; replicas must agree). The
/// consumer's replies (compared entry by entry) and the digests agree.
#[test]
fn blocking_pops_time_out_at_the_same_point_everywhere() {
    let mut c = TestCluster::new("det-bl", Options::default());
    c.start_all();
    let mut consumer = Resp::connect(c.app(1)).unwrap();
    let mut producer = Resp::connect(c.app(1)).unwrap();
    let (mut got, mut timed_out) = (0, 0);
    for round in 0..60u64 {
        let job = format!("job{round}");
        let reply = match round % 3 {
            0 => {
                producer.cmd(&[b"RPUSH", b"q", job.as_bytes()]).unwrap();
                consumer.cmd(&[b"BLPOP", b"q", b"1"]).unwrap()
            }
            1 => consumer.cmd(&[b"BLPOP", b"q", b"0.02"]).unwrap(),
            _ => {
                consumer.send(&[b"BLPOP", b"q", b"0.02"]).unwrap();
                std::thread::sleep(Duration::from_millis(round % 5 * 6));
                producer.cmd(&[b"RPUSH", b"q", job.as_bytes()]).unwrap();
                let r = consumer.read().unwrap();
                // What the pop missed goes elsewhere: the list is empty
                // for the next round.
                producer.cmd(&[b"RPOPLPUSH", b"q", b"missed"]).unwrap();
                r
            }
        };
        match reply {
            Value::NullArray => timed_out += 1,
            Value::Array(kv) if kv.len() == 2 => got += 1,
            other => panic!("BLPOP answered {other:?}"),
        }
    }
    assert!(
        got >= 20 && timed_out >= 20,
        "got {got}, timed out {timed_out}"
    );
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}

/// Keys set with a TTL, then written again once expired: `SETNX` and
/// `INCR` see an expired key as absent on every replica.
#[test]
fn writes_after_expiry_agree_everywhere() {
    let mut c = TestCluster::new("det-px", Options::default());
    c.start_all();
    let mut r = Resp::connect(c.app(1)).unwrap();
    for i in 0..50 {
        let k = format!("px:{i}");
        assert_eq!(
            r.cmd(&[b"SET", k.as_bytes(), b"old", b"PX", b"30"])
                .unwrap(),
            Value::Simple("OK".into())
        );
    }
    std::thread::sleep(Duration::from_millis(100));
    for i in 0..50 {
        let k = format!("px:{i}");
        assert_eq!(
            r.cmd(&[b"SETNX", k.as_bytes(), b"new"]).unwrap(),
            Value::Int(1)
        );
        let n = format!("n:{i}");
        r.cmd(&[b"SET", n.as_bytes(), b"5", b"PX", b"20"]).unwrap();
    }
    std::thread::sleep(Duration::from_millis(60));
    for i in 0..50 {
        let n = format!("n:{i}");
        assert_eq!(r.cmd(&[b"INCR", n.as_bytes()]).unwrap(), Value::Int(1));
    }
    // The leader's TIME is the log's time too: every replica answered the
    // same.
    r.cmd(&[b"TIME"]).unwrap();
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}

/// Redis's own 64-bit Mersenne Twister, which it seeds from its clock and
/// pid in `main`, picks random members of large (hash-table) sets and
/// random keys. Every replica's server gets the cluster's seed at its first
/// event-loop wait (preload's `entropy`), so `SRANDMEMBER`, `SPOP` and
/// `RANDOMKEY` answer the same and leave the same data everywhere — also in
/// a node restarted afterwards, whose fresh server replays the whole log.
#[test]
fn random_commands_on_large_collections_agree_everywhere() {
    let mut c = TestCluster::new("det-rand", Options::default());
    c.start_all();
    let mut r = Resp::connect(c.app(1)).unwrap();
    // Redis's cron moves rehash steps (activerehashing) in the turns the
    // leader logged, at the log's time, on every replica: a key added while
    // its bucket waits to move lands in the same place of its chain, and
    // RANDOMKEY picks alike.
    for i in 0..200 {
        // Not integers: a hash table, not an intset.
        r.cmd(&[b"SADD", b"s", format!("m{i}").as_bytes()]).unwrap();
        r.cmd(&[b"SET", format!("k{i}").as_bytes(), b"v"]).unwrap();
    }
    // Reads step the keyspace's incremental rehash to its end on every
    // replica alike.
    for i in 0..400 {
        r.cmd(&[b"GET", format!("k{}", i % 200).as_bytes()])
            .unwrap();
    }
    let mut picked = Vec::new();
    for _ in 0..10 {
        picked.push(r.cmd(&[b"SRANDMEMBER", b"s", b"5"]).unwrap());
        picked.push(r.cmd(&[b"SPOP", b"s", b"3"]).unwrap());
        picked.push(r.cmd(&[b"RANDOMKEY"]).unwrap());
    }
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
    // A fresh server replays the log from its start: the same seed, the
    // same picks.
    c.kill_follower(3);
    c.kill_server(3);
    c.start_follower(3);
    c.start_server(3);
    r.cmd(&[b"SPOP", b"s"]).unwrap();
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}

/// The detector fires: a reply that differs on the backups (each backup,
/// and only they, configured by hand to encode small hashes otherwise:
/// `OBJECT ENCODING` answers `hashtable` there) is a divergent entry on
/// every backup, named with its connection and seq in the backup's server
/// log; the replies around it are not counted.
#[test]
fn a_node_dependent_reply_is_reported_as_a_divergence() {
    let mut c = TestCluster::new("det-diverge", Options::default());
    c.start_all();
    for id in 2..=3 {
        let mut b = Resp::connect(c.app(id)).unwrap();
        b.cmd(&[b"CONFIG", b"SET", b"hash-max-listpack-entries", b"1"])
            .unwrap();
    }
    let mut r = Resp::connect(c.app(1)).unwrap();
    for i in 0..20 {
        r.cmd(&[b"SET", format!("k{i}").as_bytes(), b"v"]).unwrap();
    }
    r.cmd(&[b"HSET", b"h", b"a", b"1", b"b", b"2"]).unwrap();
    r.cmd(&[b"OBJECT", b"ENCODING", b"h"]).unwrap();
    for i in 0..20 {
        r.cmd(&[b"GET", format!("k{i}").as_bytes()]).unwrap();
    }
    c.wait_converged(LIMIT);
    for id in 2..=3 {
        // The follower copies the preload's count once per apply pass.
        c.wait(&format!("node {id} to count a divergence"), LIMIT, |c| {
            c.status(id).is_ok_and(|s| s.divergences >= 1)
        });
        let d = c.status(id).unwrap().divergences;
        assert_eq!(
            d,
            1,
            "node {id}: {d} divergent entries for 1 node-dependent reply\n{}",
            c.logs()
        );
    }
    let log = std::fs::read_to_string(c.dir.join("server-2.log")).unwrap_or_default();
    assert!(
        log.contains("divergence on connection") && log.contains("the output after seq"),
        "node 2's server log names no divergent connection and seq:\n{log}"
    );
    // What diverged was a reply: the data is the same.
    c.assert_same_digest();
}

/// Small sets, hashes and sorted sets pick random members with the C
/// library's generator, which every replica seeds from the cluster's
/// stream (preload's `entropy`): `SPOP`, `SRANDMEMBER`, `HRANDFIELD` and
/// `ZRANDMEMBER` answer the same and leave the same data everywhere.
#[test]
fn random_commands_on_small_collections_agree_everywhere() {
    let mut c = TestCluster::new("det-small", Options::default());
    c.start_all();
    let mut r = Resp::connect(c.app(1)).unwrap();
    for i in 0..60 {
        let v = i.to_string();
        r.cmd(&[b"SADD", b"ints", v.as_bytes()]).unwrap();
        r.cmd(&[b"HSET", b"h", format!("f{i}").as_bytes(), v.as_bytes()])
            .unwrap();
        r.cmd(&[b"ZADD", b"z", v.as_bytes(), format!("m{i}").as_bytes()])
            .unwrap();
    }
    for _ in 0..10 {
        r.cmd(&[b"SRANDMEMBER", b"ints", b"3"]).unwrap();
        r.cmd(&[b"SPOP", b"ints"]).unwrap();
        r.cmd(&[b"HRANDFIELD", b"h", b"2"]).unwrap();
        r.cmd(&[b"ZRANDMEMBER", b"z", b"2"]).unwrap();
    }
    r.cmd(&[b"PING"]).unwrap();
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}

/// Keys expiring all through a long run, with writes, reads and `SETNX`
/// among them: every replica holds the same live keys with the same values
/// and the same remaining time to live, read at the log's time, and the
/// same keys physically (Redis's active expiry reclaims expired keys in
/// the turns the leader logged): `DEBUG DIGEST` and `DBSIZE` agree.
#[test]
fn keys_expiring_through_a_long_run_agree_everywhere() {
    let mut c = TestCluster::new("det-active", Options::default());
    c.start_all();
    let mut r = Resp::connect(c.app(1)).unwrap();
    let key = |i: u32| format!("e{}", i % 3000);
    for i in 0..20_000u32 {
        let k = key(i);
        let ttl = (5 + i % 40).to_string();
        let reply = match i % 5 {
            0 | 1 => r.cmd(&[b"SET", k.as_bytes(), b"v", b"PX", ttl.as_bytes()]),
            2 => r.cmd(&[b"INCR", format!("n{}", i % 50).as_bytes()]),
            3 => r.cmd(&[b"GET", k.as_bytes()]),
            _ => r.cmd(&[b"SETNX", k.as_bytes(), b"w"]),
        };
        reply.unwrap();
    }
    c.wait_converged(LIMIT);
    c.assert_no_divergence();
    let names: Vec<String> = (0..3000)
        .map(key)
        .chain((0..50).map(|i| format!("n{i}")))
        .collect();
    let live = |id: u64| {
        let mut conn = Resp::connect(c.app(id)).unwrap();
        names
            .iter()
            .map(|k| {
                let v = conn.cmd(&[b"GET", k.as_bytes()]).unwrap();
                let ttl = conn.cmd(&[b"PTTL", k.as_bytes()]).unwrap();
                (v, ttl)
            })
            .collect::<Vec<_>>()
    };
    let leader = live(1);
    assert!(
        leader.iter().any(|(v, _)| *v == Value::Null),
        "no key had expired at the end: no test of expiry"
    );
    c.assert_same_digest();
    for id in 2..=3 {
        let other = live(id);
        let differ: Vec<_> = names
            .iter()
            .zip(leader.iter().zip(&other))
            .filter(|(_, (a, b))| a != b)
            .take(5)
            .collect();
        assert!(
            differ.is_empty(),
            "node {id} differs from the leader: {differ:?}"
        );
    }
}

/// Redis's active expiry reclaims keys nobody reads from its cron, and
/// `DBSIZE` and `SCAN` see what is not reclaimed yet: sent through the
/// leader while keys expire, every replica answers them alike (the cron
/// runs in the turns the leader logged, at the log's time), so no
/// divergence is counted, and the data agree at the end.
#[test]
fn active_expiry_runs_in_the_same_turns_everywhere() {
    let mut c = TestCluster::new("det-cron", Options::default());
    c.start_all();
    let mut r = Resp::connect(c.app(1)).unwrap();
    let mut sizes = Vec::new();
    for round in 0..40u32 {
        for i in 0..50u32 {
            let k = format!("x{round}:{i}");
            let ttl = (20 + (round * 50 + i) % 300).to_string();
            r.cmd(&[b"SET", k.as_bytes(), b"v", b"PX", ttl.as_bytes()])
                .unwrap();
        }
        match r.cmd(&[b"DBSIZE"]).unwrap() {
            Value::Int(n) => sizes.push(n),
            other => panic!("DBSIZE answered {other:?}"),
        }
        r.cmd(&[b"SCAN", b"0", b"COUNT", b"100"]).unwrap();
        // Idle turns: the leader's cron runs between the inputs.
        std::thread::sleep(Duration::from_millis(25));
    }
    // Never read: only the active expiry can have reclaimed keys.
    assert!(
        sizes
            .iter()
            .enumerate()
            .any(|(i, &n)| n < 50 * (i as i64 + 1)),
        "no key was reclaimed while the test ran: no test of active expiry ({sizes:?})"
    );
    c.wait_converged(LIMIT);
    c.assert_no_divergence();
    c.assert_same_digest();
}

/// memcached's clock (`current_time`) moves on its main thread's one-second
/// timer, which runs in the turns the leader logged, at the log's time;
/// its worker handles the inputs (the leader runs the two loops' turns one
/// at a time, as the log orders them). Items set with an `exptime`, read
/// and incremented around their expiry through the leader, answer alike
/// on every replica (no divergence), and every replica ends with the same
/// items.
#[test]
fn memcached_items_expire_at_the_same_point_everywhere() {
    let mut c = TestCluster::new(
        "det-mc",
        Options {
            server: Server::Memcached,
            ..Options::default()
        },
    );
    c.start_all();
    let missed = memcached_expiry_workload(c.app(1), "a", 24);
    assert!(
        missed > 0,
        "no item expired while the test ran: no test of exptime"
    );
    c.wait_converged(LIMIT);
    c.assert_no_divergence();
    assert_same_items(&c, &[2, 3], 1, &expiry_keys("a", 24));
}

/// memcached turns an absolute `exptime` (a Unix time) into its own clock
/// with its start time: both read the log's clock, so such items live
/// until their Unix time comes, like on a plain memcached, and expire at
/// the same point everywhere. Its uptime counts from the log's origin.
#[test]
fn memcached_absolute_exptimes_expire_at_their_unix_time() {
    let mut c = TestCluster::new(
        "det-mc-abs",
        Options {
            server: Server::Memcached,
            ..Options::default()
        },
    );
    c.start_all();
    let mut m = Memcache::connect(c.app(1)).unwrap();
    let unix_now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let soon = unix_now() + 3;
    let later = unix_now() + 3600;
    for i in 0..10 {
        let set = format!("set soon{i} 0 {soon} 1\r\n{i}\r\n");
        assert_eq!(m.request(set.as_bytes()).unwrap(), "STORED");
        let set = format!("set later{i} 0 {later} 1\r\n{i}\r\n");
        assert_eq!(m.request(set.as_bytes()).unwrap(), "STORED");
    }
    for i in 0..10 {
        assert!(
            m.gets(&format!("soon{i}")).unwrap().is_some(),
            "soon{i} (exptime {soon}, now {}) expired at once",
            unix_now()
        );
    }
    // memcached's clock has a one-second grain.
    while unix_now() <= soon + 1 {
        std::thread::sleep(Duration::from_millis(200));
    }
    for i in 0..10 {
        assert!(
            m.gets(&format!("soon{i}")).unwrap().is_none(),
            "soon{i} lives on"
        );
        assert!(
            m.gets(&format!("later{i}")).unwrap().is_some(),
            "later{i} expired"
        );
    }
    c.wait_converged(LIMIT);
    c.assert_no_divergence();
    let keys: Vec<String> = (0..10)
        .flat_map(|i| [format!("soon{i}"), format!("later{i}")])
        .collect();
    assert_same_items(&c, &[2, 3], 1, &keys);
}

/// The memcached expiry workload across a failover through a real
/// ZooKeeper: the leader SIGKILLed half way, the rest on the new leader,
/// then the old node back with a fresh server that replays the whole log.
#[test]
fn memcached_replicas_agree_after_a_failover() {
    let mut c = TestCluster::new(
        "det-mc-failover",
        Options {
            server: Server::Memcached,
            ..Options::default()
        },
    );
    let _zk = c.start_zookeeper(2000);
    c.start_nodes();
    let stores = |app| {
        Memcache::connect(app)
            .and_then(|mut m| m.request(b"set probe 0 0 1\r\n1\r\n"))
            .is_ok_and(|r| r == "STORED")
    };
    let first = wait_any_leader_with(&c, &[1, 2, 3], stores);
    let mut missed = memcached_expiry_workload(c.app(first), "a", 12);
    c.kill_server(first);
    c.kill_follower(first);
    let rest: Vec<u64> = (1..=3).filter(|&i| i != first).collect();
    let second = wait_any_leader_with(&c, &rest, stores);
    missed += memcached_expiry_workload(c.app(second), "b", 12);
    assert!(missed > 0, "no item expired while the test ran");
    let other = rest.iter().copied().find(|&i| i != second).unwrap();
    c.rebuild_old_leader_and_agree(first, second, other, LIMIT);
    let mut keys = expiry_keys("a", 12);
    keys.extend(expiry_keys("b", 12));
    assert_same_items(&c, &[other, first], second, &keys);
}

/// Sets items with exptimes of 1-2 s, `rounds` times 10, and between
/// rounds increments and reads items of earlier rounds, some expiring
/// about then. Returns how many of those found their item gone.
fn memcached_expiry_workload(app: std::net::SocketAddr, tag: &str, rounds: u32) -> u32 {
    let mut m = Memcache::connect(app).unwrap();
    let mut missed = 0;
    for round in 0..rounds {
        for i in 0..10u32 {
            let ttl = 1 + (round + i) % 2;
            let set = format!("set {tag}{round}:{i} 0 {ttl} 1\r\n5\r\n");
            assert_eq!(m.request(set.as_bytes()).unwrap(), "STORED");
        }
        for back in 1..=round.min(12) {
            let k = format!("{tag}{}:{}", round - back, back % 10);
            let r = m.request(format!("incr {k} 1\r\n").as_bytes()).unwrap();
            if r == "NOT_FOUND" {
                missed += 1;
            }
            if m.gets(&k).unwrap().is_none() {
                missed += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    missed
}

/// The keys `memcached_expiry_workload` sets.
fn expiry_keys(tag: &str, rounds: u32) -> Vec<String> {
    (0..rounds)
        .flat_map(|round| (0..10).map(move |i| format!("{tag}{round}:{i}")))
        .collect()
}

/// Eventually (a backup's clock follows the leader's ticks) the memcached
/// servers of `ids` hold the same of `keys` as `leader`'s. Items are read
/// one by one: a crawler dump (`lru_crawler metadump`) is written by
/// memcached's crawler thread, at moments of its own.
fn assert_same_items(c: &TestCluster, ids: &[u64], leader: u64, keys: &[String]) {
    let items = |id| {
        let mut m = Memcache::connect(c.app(id)).unwrap();
        keys.iter()
            .map(|k| m.gets(k).unwrap().map(|(flags, v, _)| (flags, v)))
            .collect::<Vec<_>>()
    };
    c.wait("the same items on every replica", LIMIT, |_| {
        let want = items(leader);
        ids.iter().all(|&id| items(id) == want)
    });
}

/// After a failover the replicas still agree: the same workloads on a
/// cluster electing through a real ZooKeeper, the leader SIGKILLed half
/// way, the rest on the new leader; then the old leader's node comes back
/// with a fresh server that replays the whole log.
#[test]
fn replicas_agree_after_a_failover() {
    let mut c = TestCluster::new("det-failover", Options::default());
    let _zk = c.start_zookeeper(2000);
    c.start_nodes();
    let first = wait_any_leader(&c, &[1, 2, 3]);
    nondeterministic_workload(c.app(first), "a");
    c.kill_server(first);
    c.kill_follower(first);
    let rest: Vec<u64> = (1..=3).filter(|&i| i != first).collect();
    let second = wait_any_leader(&c, &rest);
    nondeterministic_workload(c.app(second), "b");
    let others: Vec<u64> = rest.iter().copied().filter(|&i| i != second).collect();
    c.wait_converged_on(&[second, others[0]], LIMIT);
    c.start_follower(first);
    c.start_server(first);
    c.wait_converged_on(&[second, others[0], first], LIMIT);
    // Eventually: the leader's cron goes on reclaiming expired keys.
    let start = std::time::Instant::now();
    loop {
        let digest = redis_digest(c.app(second));
        let differing: Vec<u64> = [others[0], first]
            .into_iter()
            .filter(|&id| redis_digest(c.app(id)) != digest)
            .collect();
        if differing.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < LIMIT,
            "nodes {differing:?} differ from {second}\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for id in 1..=3 {
        assert_eq!(
            c.status(id).unwrap().divergences,
            0,
            "node {id}\n{}",
            c.logs()
        );
    }
}

/// The node among `ids` that leads, once it takes a write.
fn wait_any_leader(c: &TestCluster, ids: &[u64]) -> u64 {
    wait_any_leader_with(c, ids, |app| {
        Resp::connect(app)
            .and_then(|mut r| r.cmd(&[b"SET", b"probe", b"1"]))
            .is_ok_and(|rep| rep == Value::Simple("OK".into()))
    })
}

/// The node among `ids` that leads, once `writes(its app address)`.
fn wait_any_leader_with(
    c: &TestCluster,
    ids: &[u64],
    writes: impl Fn(std::net::SocketAddr) -> bool,
) -> u64 {
    let l = c.wait_leader_among(ids, LIMIT);
    c.wait("the leader to take a write", LIMIT, |c| writes(c.app(l)));
    l
}

/// Clock- and random-dependent commands on keys named with `tag`: a rate
/// limiter, writes after expiry, random picks in small and large
/// collections.
fn nondeterministic_workload(app: std::net::SocketAddr, tag: &str) {
    let mut r = Resp::connect(app).unwrap();
    let k = |name: &str| format!("{tag}:{name}");
    for _ in 0..1000 {
        if r.cmd(&[b"INCR", k("rl").as_bytes()]).unwrap() == Value::Int(1) {
            r.cmd(&[b"PEXPIRE", k("rl").as_bytes(), b"10"]).unwrap();
        }
    }
    for i in 0..100 {
        let key = k(&format!("px{i}"));
        r.cmd(&[b"SET", key.as_bytes(), b"old", b"PX", b"20"])
            .unwrap();
        r.cmd(&[b"SADD", k("big").as_bytes(), format!("m{i}").as_bytes()])
            .unwrap();
        r.cmd(&[b"SADD", k("small").as_bytes(), i.to_string().as_bytes()])
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    for i in 0..100 {
        let key = k(&format!("px{i}"));
        r.cmd(&[b"SETNX", key.as_bytes(), b"new"]).unwrap();
    }
    for _ in 0..10 {
        r.cmd(&[b"SPOP", k("big").as_bytes()]).unwrap();
        r.cmd(&[b"SPOP", k("small").as_bytes()]).unwrap();
        r.cmd(&[b"SRANDMEMBER", k("big").as_bytes(), b"3"]).unwrap();
    }
}
