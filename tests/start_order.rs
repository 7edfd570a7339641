//! Start order does not matter: a backup's server started before its
//! follower has created the region waits for it and attaches when it comes,
//! then applies the log like any backup (real followers, real redis-server
//! under the preload, digests compared).

use lockstep_testkit::cluster;

use std::time::Duration;

use cluster::*;
use lockstep_launcher::rng::Rng;

/// Bound on every wait: reaching it means a hang, not slowness.
const HANG: Duration = Duration::from_secs(120);

#[test]
fn a_backup_server_started_before_its_follower_attaches_and_applies() {
    let mut c = TestCluster::new("early-server", Options::default());
    // Node 3's server first: no region, no follower anywhere yet.
    c.start_server_listening(3);
    let log = c.dir.join("server-3.log");
    let waits = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("waiting for this node's follower"))
            .count()
    };
    c.wait("node 3's server to say it waits", HANG, |_| waits() == 1);
    for id in 1..=3 {
        c.start_follower(id);
    }
    c.start_server(1);
    c.start_server(2);
    c.wait_leader(1);
    c.wait("node 3's early server to attach", HANG, |c| {
        c.status(3).is_ok_and(|s| s.server_pid != 0)
    });
    redis_mixed_workload(c.app(1), 4, 300);
    c.wait_converged(HANG);
    c.assert_same_digest();
    c.assert_no_divergence();
    let s = c.status(3).expect("node 3 status");
    assert_eq!(s.role, "backup", "{s:?}");
    assert_eq!(waits(), 1, "one line says the server waits\n{}", c.logs());
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !text.contains("cannot replicate"),
        "the early server gave up:\n{text}"
    );
}

/// Rounds of [`servers_and_followers_started_in_any_order_all_come_up`].
const ROUNDS: u64 = 20;

/// Every order of the six starts (three servers, three followers) with
/// short random delays between them, servers mostly first (the order a
/// person starting nodes by hand tends to use): every server stays alive,
/// every backup attaches and applies, and the replicas agree. A server
/// started before its follower used to be crashed by its own preload in
/// about one round of ten (its event loop handed an alarm's event it took
/// for one of its own fds). `LOCKSTEP_TEST_SEED` replays a failed run.
#[test]
fn servers_and_followers_started_in_any_order_all_come_up() {
    let seed = std::env::var("LOCKSTEP_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("LOCKSTEP_TEST_SEED={seed}");
    let mut rng = Rng::new(seed);
    for round in 0..ROUNDS {
        let mut c = TestCluster::new(&format!("any-order-{round}"), Options::default());
        // (is a server, node id): servers first in even rounds, shuffled
        // in odd ones.
        let mut starts: Vec<(bool, u64)> = (1..=3)
            .map(|id| (true, id))
            .chain((1..=3).map(|id| (false, id)))
            .collect();
        if round % 2 == 1 {
            rng.shuffle(&mut starts);
        }
        for (server, id) in &starts {
            std::thread::sleep(Duration::from_millis(rng.below(400)));
            if *server {
                c.start_server_listening(*id);
            } else {
                c.start_follower(*id);
            }
        }
        let order = || format!("round {round} (seed {seed}), starts {starts:?}");
        c.serve_and_agree(&[1, 2, 3], HANG);
        c.assert_no_divergence();
        for id in 1..=3 {
            assert!(
                c.server_running(id),
                "{}: node {id}'s server died\n{}",
                order(),
                c.logs()
            );
            let log =
                std::fs::read_to_string(c.dir.join(format!("server-{id}.log"))).unwrap_or_default();
            assert!(
                !log.contains("crashed") && !log.contains("cannot replicate"),
                "{}: node {id}'s server log:\n{log}",
                order()
            );
        }
    }
}
