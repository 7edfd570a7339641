//! Named scenarios: the view changes of the VR paper and every failover
//! bug found so far, each driven through the same simulated cluster.

use lockstep_common::config::SnapshotEvery;
use lockstep_follower::protocol::{LeaderChoice, Message, Role};

use crate::cluster::Cluster;

const ZK: LeaderChoice = LeaderChoice::Zookeeper;
const STATIC: LeaderChoice = LeaderChoice::Static { leader: 1 };

/// Waits until the deposed leader's session ran out, then for a leader.
fn settle_after_isolation(c: &mut Cluster) -> u64 {
    let t = c.session_timeout + 50;
    c.run(t, 1000);
    settle(c)
}

fn settle(c: &mut Cluster) -> u64 {
    for _ in 0..400 {
        c.run(10, 1000);
        if let Some(l) = c.serving() {
            return l;
        }
    }
    panic!("no leader");
}

#[test]
fn a_cluster_elects_a_leader_and_commits() {
    for e in [ZK, STATIC] {
        let mut c = Cluster::new(3, e, 1);
        let l = settle(&mut c);
        assert_eq!(l, 1);
        c.run(200, 2);
        assert!(c.commit_point() > 50);
    }
}

/// VR: the leader fails; the new view adopts every committed entry.
#[test]
fn vr_leader_failure_keeps_committed_entries() {
    let mut c = Cluster::new(3, ZK, 2);
    settle(&mut c);
    c.run(100, 2);
    let before = c.commit_point();
    c.crash(1, false);
    let l = settle(&mut c);
    assert_ne!(l, 1);
    c.run(100, 2);
    assert!(c.commit_point() > before);
    // The old leader comes back and follows.
    c.start(1);
    c.run(600, 5);
    assert_eq!(c.serving(), Some(l));
    let n1 = &c.nodes[0];
    assert_eq!(n1.replica.as_ref().unwrap().role(), Role::Backup);
}

/// VR: a minority cannot start a view; the majority side goes on.
#[test]
fn vr_a_minority_partition_cannot_start_a_view() {
    let mut c = Cluster::new(5, ZK, 3);
    settle(&mut c);
    c.run(50, 2);
    c.isolate(1);
    let l = settle_after_isolation(&mut c);
    assert_ne!(l, 1);
    c.run(500, 3);
    // Node 1 never started a view after its isolation.
    let top = *c.started.keys().next_back().unwrap();
    assert_ne!(c.started[&top], 1);
}

/// VR (and Raft's figure 8): a node with a long tail of an old view does
/// not win over a node whose log follows a newer view.
#[test]
fn vr_log_view_beats_a_longer_stale_tail() {
    let mut c = Cluster::new(3, ZK, 4);
    settle(&mut c);
    c.run(50, 2);
    // Node 1 leads and writes a tail nobody else stores.
    c.isolate(1);
    c.run(30, 1);
    c.crash(1, false);
    c.heal();
    let l = settle(&mut c);
    c.run(50, 2);
    c.start(1);
    c.run(800, 5);
    assert_eq!(c.serving(), Some(l));
    // Restarted, node 1 rebuilt a fresh server from the new view's log.
    assert_eq!(c.nodes[0].replica.as_ref().unwrap().role(), Role::Backup);
    assert!(!c.nodes[0].stale);
}

/// Failover bug 1: a backup restarted after SIGKILL saved its commit point
/// lazily; a sync with a leader that does not answer must cut nothing.
#[test]
fn bug1_a_restarted_backup_keeps_its_log_while_the_leader_is_frozen() {
    let mut c = Cluster::new(3, ZK, 5);
    settle(&mut c);
    c.run(150, 1);
    let committed = c.commit_point();
    assert!(committed > 50);
    // SIGKILL node 2: its commit mark is lost.
    c.crash(2, true);
    c.start(2);
    // The leader freezes: it answers nothing, but ZooKeeper still names it.
    c.isolate(1);
    c.cut.remove(&(0, 1));
    c.run(300, 1000);
    let n2 = &c.nodes[1];
    assert!(
        n2.storage.log.len() as u64 >= committed.saturating_sub(5),
        "node 2 cut its log to {} while the leader was frozen",
        n2.storage.log.len()
    );
    // The leader dies; 2 and 3 go on with every acknowledged write.
    c.crash(1, false);
    c.heal();
    let l = settle(&mut c);
    assert_ne!(l, 1);
    c.run(100, 2);
}

/// Failover bug 2: a stray Prepare(view + 1000), promised but never
/// started, is superseded within a session timeout.
#[test]
fn bug2_a_stray_prepare_far_ahead_is_superseded() {
    let mut c = Cluster::new(3, STATIC, 6);
    settle(&mut c);
    c.run(50, 2);
    let view = c.nodes[0].replica.as_ref().unwrap().promised();
    c.inject(
        3,
        2,
        Message::Prepare {
            view: view + 1000,
            candidate: 3,
        },
    );
    c.inject(
        2,
        3,
        Message::Prepare {
            view: view + 1000,
            candidate: 2,
        },
    );
    let t0 = c.now;
    loop {
        c.run(10, 2);
        let l = &c.nodes[0];
        if l.replica.as_ref().unwrap().serving()
            && l.replica.as_ref().unwrap().promised() > view + 1000
        {
            break;
        }
        assert!(
            c.now - t0 < c.session_timeout + 1500,
            "still stuck below the stray view"
        );
    }
}

/// Failover bug 3: a deposed leader whose server ran an input the new view
/// dropped goes stale.
#[test]
fn bug3_a_deposed_leader_that_ran_a_dropped_input_goes_stale() {
    let mut c = Cluster::new(3, ZK, 7);
    settle(&mut c);
    c.run(50, 2);
    // Partitioned, node 1 still takes inputs its server runs at once.
    c.isolate(1);
    c.run(20, 1);
    let l = settle_after_isolation(&mut c);
    assert_ne!(l, 1);
    c.heal();
    c.run(1500, 5);
    assert!(c.nodes[0].stale, "node 1 must be stale");
    assert_eq!(c.serving(), Some(l));
}

/// Failover bug 4: a backup that promised a newer view stores no entry of
/// an older one.
#[test]
fn bug4_a_promise_fences_the_old_leaders_entries() {
    let mut c = Cluster::new(3, STATIC, 8);
    settle(&mut c);
    c.run(30, 2);
    let view = c.nodes[0].replica.as_ref().unwrap().promised();
    c.inject(
        3,
        2,
        Message::Prepare {
            view: view + 1,
            candidate: 3,
        },
    );
    let len = c.nodes[1].storage.log.len();
    c.run(20, 1);
    assert_eq!(
        c.nodes[1].storage.log.len(),
        len,
        "node 2 stored entries of a fenced view"
    );
    // Node 3's acks still commit them with the leader's, and node 2's
    // fence makes the leader pass view + 1 later (bug 2).
}

/// Failover bug 5: a leader whose server died steps down and goes stale;
/// another node leads.
#[test]
fn bug5_a_leader_whose_server_died_steps_down_and_goes_stale() {
    let mut c = Cluster::new(3, ZK, 9);
    settle(&mut c);
    c.run(50, 2);
    c.kill_server(1);
    assert!(c.nodes[0].stale);
    assert_ne!(c.nodes[0].replica.as_ref().unwrap().role(), Role::Leader);
    let l = settle(&mut c);
    assert_ne!(l, 1);
    let before = c.commit_point();
    c.run(100, 2);
    assert!(c.commit_point() > before);
}

/// Failover bug 6 (seed 220): the new leader's announcement is lost while
/// ZooKeeper is unreachable for less than a session timeout, so it keeps
/// the lead. The candidate publishes itself again once it can: backups
/// restarted after the view change learn the leader from the record and
/// follow it (they would otherwise wait for an announcement forever).
#[test]
fn bug6_a_lost_announcement_is_published_again() {
    let mut c = Cluster::new(3, ZK, 10);
    // Node 1 claims view 2 at its first election round, then loses
    // ZooKeeper while the view starts.
    c.run(25, 1000);
    c.cut.insert((0, 1));
    c.run(100, 1000);
    assert!(c.nodes[0].replica.as_ref().unwrap().serving());
    c.heal();
    // Both backups restart: they know the log's view, not its leader.
    for id in [2, 3] {
        c.crash(id, false);
        c.start(id);
    }
    c.run(200, 1000);
    for id in [2, 3] {
        let r = c.nodes[id as usize - 1].replica.as_ref().unwrap();
        assert_eq!((r.leader(), r.role()), (1, Role::Backup), "node {id}");
    }
    let before = c.commit_point();
    c.run(100, 2);
    assert!(c.commit_point() > before);
}

/// The checker itself can fail: a backup's server that ran an input other
/// than the committed entry of its seq is caught at the next check.
#[test]
#[should_panic(expected = "applied")]
fn the_checker_catches_a_server_that_ran_another_input() {
    let mut c = Cluster::new(3, ZK, 3);
    let leader = settle(&mut c);
    c.run(200, 2);
    assert!(c.commit_point() > 10, "entries committed");
    let backup = if leader == 2 { 3 } else { 2 };
    let n = &mut c.nodes[backup as usize - 1];
    let &(seq, view, value) = n.server.first().expect("the backup ran inputs");
    n.server.push((seq, view, value + 1_000_000));
    c.check();
}

/// The checker itself can fail: a serving leader that holds no committed
/// entry is caught.
#[test]
#[should_panic(expected = "lost committed seq")]
fn the_checker_catches_a_leader_that_lost_committed_entries() {
    let mut c = Cluster::new(3, ZK, 4);
    let leader = settle(&mut c);
    c.run(200, 2);
    assert!(c.commit_point() > 10, "entries committed");
    let n = &mut c.nodes[leader as usize - 1];
    n.storage.log.clear();
    // A fresh cluster view of the marks: what a restart would do.
    c.forget_checks();
    c.check();
}

/// ZooKeeper is needed for failover, not for serving: with ZooKeeper gone
/// for ten session timeouts, every session expired, the leader keeps
/// committing; when ZooKeeper comes back (sessions in a new order), the
/// followers give way to the serving leader: no view change.
#[test]
fn zookeeper_lost_for_long_changes_no_view_and_commits_go_on() {
    let mut c = Cluster::new(3, ZK, 21);
    let l = settle(&mut c);
    c.run(100, 2);
    let view = *c.started.keys().next_back().unwrap();
    c.lose_zookeeper();
    for _ in 0..10 {
        let before = c.commit_point();
        c.run(c.session_timeout, 2);
        assert_eq!(
            c.serving(),
            Some(l),
            "the leader stopped serving without ZooKeeper"
        );
        assert!(c.commit_point() > before, "no commit without ZooKeeper");
    }
    // The backups register first: one of them is the candidate.
    for id in (1..=3).filter(|&id| id != l) {
        c.cut.remove(&(0, id));
        c.cut.remove(&(id, 0));
    }
    c.run(2 * c.session_timeout, 2);
    c.heal();
    c.run(20 * c.session_timeout, 2);
    assert_eq!(c.serving(), Some(l));
    assert_eq!(
        *c.started.keys().next_back().unwrap(),
        view,
        "ZooKeeper's return started a view"
    );
}

/// Snapshots every 10 entries (the random runs' measure).
const EVERY: SnapshotEvery = SnapshotEvery {
    entries: 10,
    bytes: 0,
    image_percent: 0,
};

/// A node away while the others image and compact finds its log ending
/// before theirs: it installs a peer's image, catches up by entries, and
/// its server ends equal to the leader's. (The random runs cover the rest:
/// the same while view changes run, the node as their candidate.)
#[test]
fn a_node_away_while_the_others_compact_installs_an_image() {
    for e in [STATIC, ZK] {
        let mut c = Cluster::with_snapshots(5, e, 7, Some(EVERY));
        settle(&mut c);
        c.run(100, 2);
        c.crash(5, false);
        c.run(600, 2);
        let oldest = c.nodes[0].storage.compacted.0;
        assert!(
            oldest > 20,
            "{e:?}: the leader deleted its log up to {oldest}"
        );
        c.start(5);
        c.run(600, 2);
        assert!(
            c.snapshot_counts.installs >= 1,
            "{e:?}: {:?}",
            c.snapshot_counts
        );
        c.run(300, 1000);
        let (leader, back) = (&c.nodes[0], &c.nodes[4]);
        assert_eq!(
            back.replica.as_ref().map(|r| r.applied()),
            Some(c.commit_point()),
            "{e:?}: node 5 applied all that committed"
        );
        assert_eq!(back.server, leader.server, "{e:?}");
    }
}
