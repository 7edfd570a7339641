//! Replicas stay identical when the server reads the clock: every replica's
//! server reads the log's time while it handles an input (preload's
//! `clock`), so keys expire at the same log position everywhere.
//! Real followers, real redis-server, both commit modes (the suite's).

mod cluster;

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
            Reply::Int(1) => {
                windows += 1;
                assert_eq!(r.cmd(&[b"PEXPIRE", b"rl", b"15"]).unwrap(), Reply::Int(1));
            }
            Reply::Int(_) => {}
            other => panic!("INCR answered {other:?}"),
        }
    }
    assert!(windows > 1, "the window never expired: no test of expiry");
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
            Reply::Status("OK".into())
        );
    }
    std::thread::sleep(Duration::from_millis(100));
    for i in 0..50 {
        let k = format!("px:{i}");
        assert_eq!(
            r.cmd(&[b"SETNX", k.as_bytes(), b"new"]).unwrap(),
            Reply::Int(1)
        );
        let n = format!("n:{i}");
        r.cmd(&[b"SET", n.as_bytes(), b"5", b"PX", b"20"]).unwrap();
    }
    std::thread::sleep(Duration::from_millis(60));
    for i in 0..50 {
        let n = format!("n:{i}");
        assert_eq!(r.cmd(&[b"INCR", n.as_bytes()]).unwrap(), Reply::Int(1));
    }
    // The leader's TIME is the log's time too: every replica answered the
    // same.
    r.cmd(&[b"TIME"]).unwrap();
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}

/// What lockstep does not make deterministic is reported, not silent:
/// Redis picks random members of a large hash-table set with a generator
/// it seeds from its own clock and pid, so `SRANDMEMBER` answers differ, and
/// every backup counts divergent entries and names the connection and seq
/// in its server's log.
#[test]
fn random_replies_are_reported_as_divergences() {
    let mut c = TestCluster::new("det-rand", Options::default());
    c.start_all();
    let mut r = Resp::connect(c.app(1)).unwrap();
    for i in 0..200 {
        // Not integers: a hash table, not an intset.
        r.cmd(&[b"SADD", b"s", format!("m{i}").as_bytes()]).unwrap();
    }
    for _ in 0..5 {
        r.cmd(&[b"SRANDMEMBER", b"s", b"5"]).unwrap();
    }
    r.cmd(&[b"PING"]).unwrap();
    c.wait_converged(LIMIT);
    for id in 2..=3 {
        let d = c.status(id).unwrap().divergences;
        assert!(
            (1..=5).contains(&d),
            "node {id}: {d} divergent entries for 5 random replies\n{}",
            c.logs()
        );
    }
    let log = std::fs::read_to_string(c.dir.join("server-2.log")).unwrap_or_default();
    assert!(
        log.contains("divergence on connection") && log.contains("the output after seq"),
        "node 2's server log names no divergent connection and seq:\n{log}"
    );
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
