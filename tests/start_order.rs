//! Start order does not matter: a backup's server started before its
//! follower has created the region waits for it and attaches when it comes,
//! then applies the log like any backup (real followers, real redis-server
//! under the preload, digests compared).

mod cluster;

use std::time::Duration;

use cluster::*;

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
