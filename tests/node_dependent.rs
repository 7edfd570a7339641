//! Replies that describe the node (a connection's own address and fd, the
//! process's port, pid and figures) differ on every backup however exactly
//! the log is replayed; the divergence detector knows them by the command
//! that asked (preload's `node_dependent`) and does not count them — the
//! node's own configuration (`CONFIG GET`) too —, while a reply that
//! differs because the replicas behave differently (a backup configured
//! apart with a smaller hash encoding bound answers `OBJECT ENCODING`
//! otherwise) is still counted. Real followers, real redis-server, both
//! commit modes (the suite's).

use lockstep_testkit::cluster;

use std::time::Duration;

use cluster::*;

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn replies_describing_the_node_are_not_counted_and_configuration_is() {
    let mut c = TestCluster::new("nodedep", Options::default());
    c.start_all();
    // The backups, and only they, are configured apart (a direct client of
    // each, not replicated): a hash of 6 fields is a hashtable there.
    for id in 2..=3 {
        let mut b = Resp::connect(c.app(id)).unwrap();
        assert_eq!(
            b.cmd(&[b"CONFIG", b"SET", b"hash-max-listpack-entries", b"4"])
                .unwrap(),
            Value::Simple("OK".into())
        );
    }
    let mut r = Resp::connect(c.app(1)).unwrap();
    let node_dependent: [&[&[u8]]; 7] = [
        &[b"CLIENT", b"LIST"],
        &[b"CLIENT", b"INFO"],
        &[b"INFO", b"server"],
        &[b"CLIENT", b"ID"],
        &[b"MEMORY", b"USAGE", b"k"],
        &[b"CONFIG", b"GET", b"port"],
        &[b"CONFIG", b"GET", b"*"],
    ];
    r.cmd(&[b"SET", b"k", b"v"]).unwrap();
    for cmd in node_dependent {
        assert!(
            !matches!(r.cmd(cmd).unwrap(), Value::Error(_)),
            "{cmd:?} failed"
        );
        r.cmd(&[b"GET", b"k"]).unwrap();
    }
    // In a transaction: the reply comes with EXEC.
    r.send(&[b"MULTI"]).unwrap();
    r.send(&[b"CLIENT", b"INFO"]).unwrap();
    r.send(&[b"EXEC"]).unwrap();
    for _ in 0..3 {
        r.read().unwrap();
    }
    r.cmd(&[b"GET", b"k"]).unwrap();
    // Differs because the backups behave otherwise: counted, once.
    r.cmd(&[b"HSET", b"h", b"a", b"1", b"b", b"2", b"c", b"3"])
        .unwrap();
    r.cmd(&[b"HSET", b"h", b"d", b"4", b"e", b"5", b"f", b"6"])
        .unwrap();
    assert_eq!(
        r.cmd(&[b"OBJECT", b"ENCODING", b"h"]).unwrap(),
        Value::Bulk(b"listpack".to_vec())
    );
    r.cmd(&[b"GET", b"k"]).unwrap();
    c.wait_converged(LIMIT);
    for id in 2..=3 {
        // The replies did differ on this node: its own laddr and port.
        let mut b = Resp::connect(c.app(id)).unwrap();
        let Value::Bulk(info) = b.cmd(&[b"CLIENT", b"INFO"]).unwrap() else {
            panic!("CLIENT INFO on node {id} answered no text");
        };
        let port = c.app(id).port().to_string();
        assert!(
            String::from_utf8_lossy(&info).contains(&format!("laddr=127.0.0.1:{port}")),
            "node {id}'s CLIENT INFO does not name its own port"
        );
        // The follower copies the preload's count once per apply pass.
        c.wait(&format!("node {id} to count a divergence"), LIMIT, |c| {
            c.status(id).is_ok_and(|s| s.divergences >= 1)
        });
        let d = c.status(id).unwrap().divergences;
        assert_eq!(
            d,
            1,
            "node {id}: {d} divergent entries counted, expected 1 (OBJECT ENCODING)\n{}",
            c.logs()
        );
    }
    let log = std::fs::read_to_string(c.dir.join("server-2.log")).unwrap_or_default();
    assert!(
        log.contains("after `object`"),
        "node 2's divergence line does not name OBJECT:\n{log}"
    );
    c.assert_same_digest();
}
