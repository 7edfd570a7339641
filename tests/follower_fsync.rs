//! `durability = "fsync"`: followers fsync (group commit) before they ack.
//! Real redis-server under the preload, real follower processes, real
//! RocksDB; faults are SIGKILLs. "No acknowledged write lost" is checked
//! with per-client INCR counters: the value a client saw acknowledged must
//! be at most the counter's value on every node afterwards.

use lockstep_testkit::cluster;

use std::time::Duration;

use cluster::{
    assert_acked_counters, assert_converged_exactly, redis_mixed_workload, BackgroundLoad, Options,
    Resp, TestCluster, Value,
};
use lockstep_common::config::Durability;

/// Bound on every wait: reaching it means a hang, not slowness.
const HANG: Duration = Duration::from_secs(180);

fn fsync_cluster(test: &str) -> TestCluster {
    let c = TestCluster::new(
        test,
        Options {
            extra: "durability = \"fsync\"\n".into(),
            ..Options::default()
        },
    );
    assert_eq!(c.config().durability, Durability::Fsync);
    c
}

/// The seqs node `id`'s follower reported its stored log ending at, one per
/// start ("log ends at seq N" in its log).
fn logged_store_ends(c: &TestCluster, id: u64) -> Vec<u64> {
    let log = std::fs::read_to_string(c.dir.join(format!("follower-{id}.log"))).unwrap_or_default();
    log.lines()
        .filter_map(|l| {
            let rest = &l[l.find("log ends at seq ")? + "log ends at seq ".len()..];
            rest.split(|ch: char| !ch.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

#[test]
fn fsync_cluster_converges_under_mixed_workload() {
    let mut c = fsync_cluster("fsync-mixed");
    c.start_all();
    let (threads, ops) = (8, 300);
    redis_mixed_workload(c.app(1), threads, ops);
    c.wait_converged(HANG);
    c.assert_same_digest();
    let pushes = threads as i64 * (0..ops).filter(|i| i % 7 < 2).count() as i64;
    for id in 1..=3 {
        let mut r = Resp::connect(c.app(id)).unwrap();
        assert_eq!(
            r.cmd(&[b"LLEN", b"shared:list"]).unwrap(),
            Value::Int(pushes),
            "list length on node {id}"
        );
    }
    c.assert_no_divergence();
}

#[test]
fn fsync_backup_sigkilled_mid_load_restarts_and_loses_no_acknowledged_write() {
    let mut c = fsync_cluster("fsync-kill");
    c.start_all();
    let load = BackgroundLoad::start(c.app(1), 4);
    load.wait_more(&c, 1000, HANG);
    // Everything node 3 reports stored was acked by it (it acks after the
    // fsynced write): its restarted follower must find at least that much.
    let stored_before = c.status(3).unwrap().persisted;
    c.restart_node_under_load(3, &load, HANG);
    let acked = load.stop();
    assert_converged_exactly(&c, &acked, HANG);
    match logged_store_ends(&c, 3).as_slice() {
        [_, after_restart, ..] => assert!(
            *after_restart >= stored_before,
            "node 3 reported {stored_before} stored before SIGKILL, but its restarted log ends at {after_restart}"
        ),
        other => eprintln!("note: follower-3.log has no 'log ends at seq' line per start ({other:?}); stored-log check skipped"),
    }
}

#[test]
fn fsync_whole_cluster_sigkilled_restarts_from_its_logs_with_every_acknowledged_write() {
    let mut c = fsync_cluster("fsync-all");
    c.start_all();
    let load = BackgroundLoad::start(c.app(1), 4);
    load.wait_more(&c, 1500, HANG);
    // SIGKILL every process while clients are mid-request; the replies
    // that came back before are the acknowledged writes.
    for id in 1..=3 {
        c.kill_server(id);
        c.kill_follower(id);
    }
    let acked = load.stop_after_failure();
    for id in 1..=3 {
        c.start_follower(id);
    }
    for id in 1..=3 {
        c.start_server(id);
    }
    c.wait("leader active again", HANG, |c| {
        c.status(1).map(|s| s.role == "leader").unwrap_or(false)
    });
    // The restarted leader serves only once its fresh server replayed its
    // log: every acknowledged INCR is there before any new input.
    let mut r = Resp::connect(c.app(1)).unwrap();
    for (t, &a) in acked.iter().enumerate() {
        let v = match r
            .cmd(&[b"GET", cluster::load_counter_key(t).as_bytes()])
            .unwrap()
        {
            Value::Bulk(b) => String::from_utf8_lossy(&b).parse::<i64>().unwrap(),
            other => panic!("GET answered {other:?}"),
        };
        assert!(
            v >= a,
            "restarted leader: counter {t} is {v}, the client saw {a} acknowledged\n{}",
            c.logs()
        );
    }
    redis_mixed_workload(c.app(1), 4, 100);
    c.wait_converged(HANG);
    c.assert_same_digest();
    assert_acked_counters(&c, &acked);
    c.assert_no_divergence();
}

/// Deterministic form of the race the whole-cluster test hits now and
/// then: the leader's own follower is stopped, so a write is acknowledged by
/// the two backups alone (a majority); then every process dies. The write
/// was answered OK, so the restarted cluster must still hold it — and must
/// not hang: the backups' logs already hold that seq.
#[test]
fn static_leader_restart_keeps_a_write_only_the_backups_stored() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let mut c = fsync_cluster("fsync-backups-only");
    c.start_all();
    redis_mixed_workload(c.app(1), 2, 50);
    c.wait_converged(HANG);
    let pid = c.status(1).unwrap().follower_pid as i32;
    kill(Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
    let mut r = Resp::connect(c.app(1)).unwrap();
    assert_eq!(
        r.cmd(&[b"SET", b"only-on-backups", b"acknowledged"])
            .unwrap(),
        Value::Simple("OK".into()),
        "a write acked by the two backups is answered"
    );
    drop(r);
    for id in 1..=3 {
        c.kill_server(id);
        c.kill_follower(id);
    }
    for id in 1..=3 {
        c.start_follower(id);
    }
    for id in 1..=3 {
        c.start_server(id);
    }
    c.wait("leader active again", HANG, |c| {
        c.status(1).map(|s| s.role == "leader").unwrap_or(false)
    });
    let mut r =
        Resp::connect_with(c.app(1), Duration::from_secs(5), Duration::from_secs(30)).unwrap();
    let got = r.cmd(&[b"GET", b"only-on-backups"]).unwrap_or_else(|e| {
        panic!(
            "the restarted leader never answered a GET ({e}): its input is not acknowledged\n{}",
            c.logs()
        )
    });
    assert_eq!(
        got,
        Value::Bulk(b"acknowledged".to_vec()),
        "the restarted leader lost an acknowledged write\n{}",
        c.logs()
    );
    c.wait_converged(HANG);
    c.assert_same_digest();
}
