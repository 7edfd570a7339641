//! memcached with several worker threads (`-t 4`): a listener loop hands
//! each connection to a worker loop in turn, and each worker runs its own
//! event loop. Every backup must run the leader's turns on the same loops,
//! in log order.
//!
//! The replicas are compared through the log itself: after the load, every
//! key is read back through the leader on one connection, which then
//! closes. Each backup's server answers the same requests, and its
//! follower counts a divergence for every answer that differs from the
//! leader's (a CLOSE carries the digest of the last ones): 0 divergences
//! means every backup holds the leader's items, CAS values included. A
//! backup's own clients could not be used for that — backups refuse them
//! with several workers (see `a_backup_of_a_multi_worker_server_refuses_its_own_clients`).
//!
//! Durations only bound how long the test waits before it reports a hang.

mod cluster;

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::time::Duration;

use cluster::{memcached_mixed_workload, Memcache, Options, Server, TestCluster};

const LIMIT: Duration = Duration::from_secs(120);
const KEYS: usize = 16;

/// A 3-node memcached cluster whose servers run `threads` worker threads.
fn cluster(test: &str, threads: &str) -> TestCluster {
    let mut c = TestCluster::new(
        test,
        Options {
            server: Server::Memcached,
            // A refused client then reads why, in memcached's protocol.
            extra: "protocol = \"memcached\"\n".into(),
            ..Options::default()
        },
    );
    c.use_server_command(&[
        "memcached",
        "-u",
        "root",
        "-t",
        threads,
        "-U",
        "0",
        "-l",
        "127.0.0.1",
        "-p",
        "{port}",
    ]);
    c.start_all();
    c
}

/// Threads of process `pid` (`Threads:` of /proc/PID/status).
fn threads_of(pid: u64) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("proc status")
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("Threads line")
}

/// Reads every key back through the leader, then closes that connection
/// (its CLOSE carries the digest of the last answers), waits until every
/// node applied it, and checks that no node counted a divergence and that
/// each counter holds exactly what the clients were told.
fn read_back_and_compare(c: &TestCluster, ids: &[u64], deltas: &[i64]) {
    {
        let mut leader = Memcache::connect(c.app(ids[0])).expect("connect leader");
        for (k, delta) in deltas.iter().enumerate() {
            leader.gets(&format!("str:{k}")).expect("gets str");
            let (_, v, _) = leader
                .gets(&format!("ctr:{k}"))
                .expect("gets ctr")
                .unwrap_or_else(|| panic!("ctr:{k} missing"));
            let want = cluster::MC_COUNTER_START as i64 + delta;
            assert_eq!(
                String::from_utf8_lossy(&v).trim(),
                want.to_string(),
                "ctr:{k} on the leader"
            );
        }
    }
    c.wait_converged_on(ids, LIMIT);
    for &id in ids {
        assert_eq!(
            c.status(id).expect("status").divergences,
            0,
            "node {id} answered the load or the read-back differently from the leader\n{}",
            c.logs()
        );
    }
}

/// The load the issue describes: set, append, prepend, incr/decr, cas
/// after gets and delete on shared keys from 20 connections at once, which
/// the leader's four workers serve concurrently (one turn at a time). Every
/// backup ends with the leader's items and answered every request as it.
#[test]
fn memcached_with_four_workers_replicates_an_order_sensitive_load() {
    let c = cluster("mcthreads", "4");
    for id in 1..=3 {
        let pid = c.status(id).expect("status").server_pid;
        assert!(
            threads_of(pid) >= 5,
            "node {id}'s memcached runs {} threads, not a listener and 4 workers",
            threads_of(pid)
        );
    }
    let deltas = memcached_mixed_workload(c.app(1), 20, 400, KEYS);
    read_back_and_compare(&c, &[1, 2, 3], &deltas);
}

/// A backup's client would shift which worker memcached hands the next
/// replicated connection to (it picks them in turn), so a backup of a
/// server with several workers refuses its own clients even with
/// `backup_clients = "allow"` (test clusters allow them): the client reads
/// memcached's refusal line naming the leader, and the replicas still
/// agree on a load that comes after it.
#[test]
fn a_backup_of_a_multi_worker_server_refuses_its_own_clients() {
    let c = cluster("mcthreadsguest", "4");
    let leader_app = c.app(1).to_string();
    for id in 2..=3 {
        let s = TcpStream::connect(c.app(id)).expect("connect to a backup");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut line = String::new();
        BufReader::new(s)
            .read_line(&mut line)
            .expect("refusal line");
        assert!(
            line.starts_with("SERVER_ERROR") && line.contains(&leader_app),
            "node {id} answered {line:?}, not a refusal naming the leader {leader_app}"
        );
    }
    let deltas = memcached_mixed_workload(c.app(1), 8, 300, KEYS);
    read_back_and_compare(&c, &[1, 2, 3], &deltas);
}

/// A backup of a four-worker memcached is killed (follower and server) and
/// comes back while clients write: its fresh server replays the whole log,
/// every connection on the worker the leader's ran on, and then applies
/// live entries; it ends with the leader's items.
#[test]
fn memcached_with_four_workers_backup_restart_replays_the_log() {
    let mut c = cluster("mcthreadsrestart", "4");
    // Each load sets the counters to their start value first: only the
    // last one's changes count.
    memcached_mixed_workload(c.app(1), 12, 300, KEYS);
    c.wait_converged(LIMIT);
    c.kill_follower(3);
    c.kill_server(3);
    // Nodes 1 and 2 are a majority: the leader goes on without node 3.
    memcached_mixed_workload(c.app(1), 12, 200, KEYS);
    let app = c.app(1);
    let during = std::thread::spawn(move || memcached_mixed_workload(app, 6, 300, KEYS));
    c.start_follower(3);
    c.start_server(3);
    let deltas = during.join().expect("load during the restart");
    read_back_and_compare(&c, &[1, 2, 3], &deltas);
}
