//! Three nodes on one host with the shm transport and a static leader: real
//! redis-server under the preload, real follower processes, real RocksDB.

use lockstep_testkit::cluster;

use std::time::Duration;

use cluster::{
    assert_converged_exactly, redis_mixed_workload, set_keys, BackgroundLoad, Options, Resp,
    TestCluster, Value,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const CONVERGE: Duration = Duration::from_secs(120);

#[test]
fn mixed_workload_leaves_identical_replicas() {
    let mut c = TestCluster::new("mixed", Options::default());
    c.start_all();
    redis_mixed_workload(c.app(1), 8, 300);
    c.wait_converged(CONVERGE);
    c.assert_same_digest();
    let mut r = Resp::connect(c.app(2)).unwrap();
    let len = r.cmd(&[b"LLEN", b"shared:list"]).unwrap();
    let pushes = 8 * (0..300).filter(|i| i % 7 < 2).count() as i64;
    assert_eq!(len, cluster::Value::Int(pushes), "list length on a backup");
    c.assert_no_divergence();
}

#[test]
fn follower_killed_mid_load_restarts_with_fresh_server_and_converges() {
    let mut c = TestCluster::new("restart", Options::default());
    c.start_all();
    let load = BackgroundLoad::start(c.app(1), 4);
    load.wait_more(&c, 1000, CONVERGE);
    // The leader and node 2 are a majority: clients go on meanwhile.
    c.restart_node_under_load(3, &load, CONVERGE);
    let acked = load.stop();
    assert_converged_exactly(&c, &acked, CONVERGE);
}

/// A running cluster whose ring is `ring_size`.
fn started_with_ring(name: &str, ring_size: &'static str) -> TestCluster {
    let mut c = TestCluster::new(
        name,
        Options {
            ring_size,
            ..Options::default()
        },
    );
    c.start_all();
    c
}

/// A cluster whose nodes 1 and 2 run (node 1 leads); node 3 is not started.
fn without_node_3(name: &str) -> TestCluster {
    let mut c = TestCluster::new(name, Options::default());
    for id in [1, 2] {
        c.start_follower(id);
    }
    for id in [1, 2] {
        c.start_server(id);
    }
    c.wait_leader(1);
    c
}

#[test]
fn follower_down_at_start_joins_later_and_converges() {
    let mut c = without_node_3("late");
    redis_mixed_workload(c.app(1), 4, 200);
    c.start_follower(3);
    c.start_server(3);
    redis_mixed_workload(c.app(1), 2, 50);
    c.wait_converged(CONVERGE);
    c.assert_same_digest();
}

#[test]
fn a_late_node_fetches_a_long_log_in_chunks_and_converges() {
    let mut c = without_node_3("chunks");
    // More entries than one chunk holds (1024), and more bytes (4 MiB).
    let mut r = Resp::connect(c.app(1)).unwrap();
    let value = vec![b'v'; 2048];
    for i in 0..3000 {
        r.cmd(&[b"SET", format!("k:{i}").as_bytes(), &value])
            .unwrap();
    }
    c.start_follower(3);
    c.start_server(3);
    c.wait_converged(CONVERGE);
    c.assert_same_digest();
    let log = std::fs::read_to_string(c.dir.join("follower-3.log")).unwrap();
    let chunks: u64 = log
        .lines()
        .filter_map(|l| {
            let rest = l.split("entries from node 1 in ").nth(1)?;
            rest.split(' ').next()?.parse::<u64>().ok()
        })
        .sum();
    assert!(
        chunks >= 3,
        "node 3 fetched its log in {chunks} chunks (expected at least 3):\n{log}"
    );
}

#[test]
fn follower_a_ring_lap_behind_catches_up_from_a_peer() {
    let c = started_with_ring("lap", "1MiB");
    let pid = c.status(3).unwrap().follower_pid as i32;
    kill(Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
    // More than a ring's worth of input while node 3 is frozen.
    let mut r = Resp::connect(c.app(1)).unwrap();
    let value = vec![b'v'; 4096];
    for i in 0..600 {
        r.cmd(&[b"SET", format!("big:{}", i % 97).as_bytes(), &value])
            .unwrap();
        r.cmd(&[b"APPEND", b"order", format!("{i},").as_bytes()])
            .unwrap();
    }
    kill(Pid::from_raw(pid), Signal::SIGCONT).unwrap();
    c.wait_converged(CONVERGE);
    c.assert_same_digest();
    let log = std::fs::read_to_string(c.dir.join("follower-3.log")).unwrap();
    assert!(
        log.contains("lap behind") || log.contains("fetched"),
        "node 3 never caught up:\n{log}"
    );
}

/// Stops node `id`'s server and waits until its region shows none attached.
fn stop_server(c: &mut TestCluster, id: u64) {
    c.kill_server(id);
    c.wait("the server gone", Duration::from_secs(60), |c| {
        !c.server_attached(id)
    });
}

fn follower_log(c: &TestCluster, id: u64) -> String {
    std::fs::read_to_string(c.dir.join(format!("follower-{id}.log"))).unwrap()
}

/// A follower stopped with SIGTERM after its server removes its region
/// file, and comes back (a new file, which the other nodes' writers map)
/// with nothing committed lost; one stopped beside its running server,
/// one started with --keep-region, and a SIGKILLed one leave the file,
/// which the next start reuses.
#[test]
fn a_cleanly_stopped_follower_removes_its_region_file_a_killed_one_leaves_it() {
    let mut c = TestCluster::new("stop", Options::default());
    c.start_all();
    set_keys(c.app(1), "before", 200);
    // A backup (the leader's writer must reach its new file), then the
    // leader (the backups' acks must).
    for id in [3, 1] {
        stop_server(&mut c, id);
        let status = c.stop_follower(id);
        assert!(status.success(), "follower {id}: {status}\n{}", c.logs());
        let log = follower_log(&c, id);
        assert!(
            !c.region_file(id).exists(),
            "node {id} left its region file\n{log}"
        );
        assert!(
            log.contains("removed region file") && log.contains("stopped cleanly"),
            "{log}"
        );
        if id == 3 {
            set_keys(c.app(1), "without-3", 100);
        }
        c.restart_node(id);
        c.wait_leader(1);
        set_keys(c.app(1), &format!("after-{id}"), 100);
    }
    // Beside its running server: the file stays, as after a crash.
    let status = c.stop_follower(2);
    assert!(status.success(), "follower 2: {status}\n{}", c.logs());
    let log = follower_log(&c, 2);
    assert!(c.region_file(2).exists(), "{log}");
    assert!(log.contains("left region file"), "{log}");
    stop_server(&mut c, 2);
    // So does one told to keep it (what `lockstep up` does).
    c.start_follower_with(2, &["--keep-region"]);
    assert!(!c.server_attached(2));
    let status = c.stop_follower(2);
    assert!(status.success(), "follower 2: {status}\n{}", c.logs());
    assert!(c.region_file(2).exists(), "{}", follower_log(&c, 2));
    c.restart_node(2);
    // SIGKILL leaves it too.
    stop_server(&mut c, 3);
    c.kill_follower(3);
    assert!(c.region_file(3).exists(), "a killed follower's region file");
    c.restart_node(3);
    set_keys(c.app(1), "end", 100);
    c.wait_converged(CONVERGE);
    c.assert_same_digest();
    for id in 1..=3 {
        let mut r = Resp::connect(c.app(id)).unwrap();
        assert_eq!(
            r.cmd(&[b"DBSIZE"]).unwrap(),
            Value::Int(600),
            "keys on node {id}"
        );
    }
    c.assert_no_divergence();
}

/// A value several times a backup's apply ring, read by the leader's
/// server in a few large reads (a turn's entries then outgrow the apply
/// ring): the backups take each turn's entries as the ring feeds them and
/// converge (they stalled, the leader with them at `max_apply_lag`, when a
/// turn's space came free only at its end).
#[test]
fn values_larger_than_a_backups_apply_ring_replicate() {
    // A 4 MiB ring: each backup's apply ring is 1 MiB.
    let c = started_with_ring("bigvalue", "4MiB");
    let mut r = Resp::connect(c.app(1)).unwrap();
    for i in 0..4u8 {
        let value = vec![b'a' + i; 3 << 20];
        let key = format!("big:{i}");
        assert_eq!(
            r.cmd(&[b"SET", key.as_bytes(), &value]).unwrap(),
            Value::Simple("OK".into()),
            "SET {key}"
        );
    }
    set_keys(c.app(1), "after", 100);
    c.wait_converged(CONVERGE);
    c.assert_same_digest();
    c.assert_no_divergence();
}
