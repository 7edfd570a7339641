//! When a server's child process ends is part of the log: Redis forks for
//! `BGSAVE` and AOF rewrites and learns in its cron (`waitpid(-1, …,
//! WNOHANG)`) that the child is done. Each backup forks its own child, which
//! ends at a moment of its machine's; a backup reaps it where the leader
//! reaped its own (waiting for it if it still runs), so every reply that
//! depends on whether a child runs — `BGSAVE` "already in progress",
//! `LASTSAVE`, `DEBUG LOADAOF` after an AOF rewrite — is the same on every
//! replica. Real followers, real redis-server, both commit modes (the
//! suite's).
//!
//! Durations only bound how long the test waits before it reports a hang.

use lockstep_testkit::cluster;

use std::time::{Duration, Instant};

use cluster::*;

const LIMIT: Duration = Duration::from_secs(120);

/// Redis's `INFO persistence` field `name` at `app`.
fn persistence(app: std::net::SocketAddr, name: &str) -> String {
    let mut r = Resp::connect(app).unwrap();
    let Value::Bulk(info) = r.cmd(&[b"INFO", b"persistence"]).unwrap() else {
        panic!("INFO persistence answered no text");
    };
    String::from_utf8_lossy(&info)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")).map(str::to_string))
        .unwrap_or_else(|| panic!("no {name} in INFO persistence"))
}

/// `r`'s reply to `args`; a failure names the cluster's logs.
fn ask(c: &TestCluster, r: &mut Resp, args: &[&[u8]]) -> Value {
    r.cmd(args)
        .unwrap_or_else(|e| panic!("{:?}: {e}\n{}", String::from_utf8_lossy(args[0]), c.logs()))
}

/// Saves in the background again and again, as fast as the replies come:
/// each `BGSAVE` starts a child or finds one still running (an error
/// reply), depending on whether the cron has reaped the last one — on
/// every replica where the leader's did. `LASTSAVE` moves with each reap.
/// Then AOF on (a rewrite child), and `DEBUG LOADAOF` once the leader's
/// rewrite is done: a backup still waiting for its own rewrite there found
/// no AOF and exited (1 run of Redis's suite in about 6). Every backup
/// answers everything as the leader (without the log's record of each
/// reap, both backups counted divergences in every run), its server stays
/// up, and the data agree.
#[test]
fn backups_reap_their_children_where_the_leader_did() {
    let mut c = TestCluster::new("children", Options::default());
    c.start_all();
    let mut r = Resp::connect(c.app(1)).unwrap();
    r.set_read_timeout(LIMIT).unwrap();
    fill_keys(&mut r, 20_000, &[b'x'; 1000]);
    let (mut started, mut busy) = (0, 0);
    let start = Instant::now();
    while started < 15 && start.elapsed() < LIMIT {
        match ask(&c, &mut r, &[b"BGSAVE"]) {
            Value::Simple(_) => started += 1,
            Value::Error(_) => busy += 1,
            other => panic!("BGSAVE answered {other:?}"),
        }
        ask(&c, &mut r, &[b"LASTSAVE"]);
        ask(&c, &mut r, &[b"INCR", b"counter"]);
    }
    assert!(started >= 15, "{started} saves started in {LIMIT:?}");
    assert!(busy > 0, "no BGSAVE found a save still running");
    for round in 0..3 {
        ask(&c, &mut r, &[b"CONFIG", b"SET", b"appendonly", b"yes"]);
        let app = c.app(1);
        c.wait("the leader's AOF rewrite to end", LIMIT, |_| {
            persistence(app, "aof_rewrite_in_progress") == "0"
                && persistence(app, "aof_rewrite_scheduled") == "0"
        });
        let round = round.to_string();
        ask(&c, &mut r, &[b"SET", b"after-rewrite", round.as_bytes()]);
        assert_eq!(
            ask(&c, &mut r, &[b"DEBUG", b"LOADAOF"]),
            Value::Simple("OK".into()),
            "DEBUG LOADAOF, round {round}"
        );
        ask(&c, &mut r, &[b"CONFIG", b"SET", b"appendonly", b"no"]);
    }
    drop(r);
    c.wait_converged(LIMIT);
    for id in 1..=3 {
        let s = c.status(id).unwrap();
        assert_ne!(s.server_pid, 0, "node {id}'s server is gone\n{}", c.logs());
    }
    c.assert_no_divergence();
    c.assert_same_digest();
}
