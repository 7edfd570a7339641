//! A server that drops its privileges after starting (memcached `-u
//! nobody`, as root) still replicates: its preload opens the region files
//! (its own and, for the shm transport, its peers', all root's and mode
//! 0600) just before the server gives up its user id, and maps them from
//! those files later. A 3-node memcached cluster of such servers takes a
//! workload and every replica ends with the leader's items.
//!
//! Durations only bound how long the test waits before it reports a hang.

use lockstep_testkit::cluster;

use std::time::Duration;

use cluster::{memcached_mixed_workload, Memcache, Options, Server, TestCluster};

const LIMIT: Duration = Duration::from_secs(120);

/// The user id process `pid` runs as (`Uid:` of /proc/PID/status: real,
/// effective, saved, filesystem).
fn uids(pid: u64) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .expect("Uid line")
        .split_whitespace()
        .map(|u| u.parse().expect("uid"))
        .collect()
}

#[test]
fn memcached_dropping_to_nobody_replicates() {
    // Only root can make memcached change to another user.
    let me = uids(std::process::id() as u64);
    assert_eq!(me[1], 0, "this test runs as root (memcached -u needs it)");
    let mut c = TestCluster::new(
        "privdrop",
        Options {
            server: Server::Memcached,
            ..Options::default()
        },
    );
    c.use_memcached("nobody", "1");
    c.start_all();
    for id in 1..=3 {
        let s = c.status(id).expect("status");
        assert_ne!(
            s.server_pid,
            0,
            "node {id}: no server attached\n{}",
            c.logs()
        );
        let u = uids(s.server_pid);
        assert!(
            u.iter().all(|&u| u != 0),
            "node {id}'s memcached did not drop root: uids {u:?}"
        );
    }
    let keys = 16;
    let deltas = memcached_mixed_workload(c.app(1), 4, 200, keys);
    c.wait_converged(LIMIT);
    let mut leader = Memcache::connect(c.app(1)).expect("connect leader");
    for id in 2..=3 {
        let mut backup = Memcache::connect(c.app(id)).expect("connect backup");
        for k in 0..keys {
            for key in [format!("str:{k}"), format!("ctr:{k}")] {
                assert_eq!(
                    backup.gets(&key).expect("gets").map(|(f, v, _)| (f, v)),
                    leader.gets(&key).expect("gets").map(|(f, v, _)| (f, v)),
                    "node {id} differs on {key}\n{}",
                    c.logs()
                );
            }
        }
    }
    let (_, v, _) = leader.gets("ctr:0").expect("gets").expect("ctr:0");
    let want = cluster::MC_COUNTER_START as i64 + deltas[0];
    assert_eq!(String::from_utf8_lossy(&v), want.to_string());
}
