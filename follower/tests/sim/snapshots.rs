//! The snapshot rules (`protocol::snapshot`) over a simulated cluster: a
//! leader appends, backups store and apply at their own pace, nodes die
//! and come back, each live node runs the rules every step on the states
//! the others reported one step earlier, and imaging a server takes a few
//! steps. Checked every step: the leader never starts imaging; fewer
//! than a majority never stop applying; every compacted entry is covered
//! by a majority's snapshots (or the node's own installed one); while a
//! majority lives, every live node can still catch up (a live peer keeps
//! the entry after its log's end, or holds a snapshot past it), and a node
//! that came back unable to rebuild its server from its own log (it had
//! deleted past its own newest snapshot, as a leader does) finds a peer's
//! image to install.

use lockstep_common::config::SnapshotEvery;
use lockstep_follower::protocol::snapshot::{self as rules, Member};

use crate::rng::Rng;

// The image rule is off: log bytes are not simulated, only the turns.
const EVERY: SnapshotEvery = SnapshotEvery {
    entries: 50,
    bytes: 0,
    image_percent: 0,
};

#[derive(Clone, Debug)]
struct Node {
    m: Member,
    /// Steps left of the image being taken, and its seq.
    taking: Option<(u64, u64)>,
    /// Came back after deleting its log past its own newest snapshot: its
    /// server cannot be rebuilt from its own log, it waits for a peer's
    /// image and applies nothing meanwhile.
    needy: bool,
    /// The step its latest image failed at (it goes last in the turn order
    /// for a while: `failing`, counted a little longer by itself).
    failed_at: Option<u64>,
}

/// Steps a failed image keeps a node `failing` in its peers' eyes; the
/// node itself counts [`OWN_GRACE`] more (the runtime's 60 s and 3 s, in
/// rounds of the rules).
const RECENT: u64 = 20;
const OWN_GRACE: u64 = 3;

fn run(seed: u64) {
    let mut rng = Rng::new(seed ^ 0x5a5a);
    let n = [3u64, 5][rng.below(2) as usize];
    let majority = n as usize / 2 + 1;
    let mut nodes: Vec<Node> = (1..=n)
        .map(|node| Node {
            m: Member {
                node,
                live: true,
                leader: node == 1,
                backup: node != 1,
                ..Member::default()
            },
            taking: None,
            needy: false,
            failed_at: None,
        })
        .collect();
    let mut top = 0u64;
    for step in 0..2000 {
        // What the peers read: a step old (`failing` as of the last step).
        let reported: Vec<Member> = nodes.iter().map(|x| x.m).collect();
        for x in nodes.iter_mut() {
            x.m.failing = x.failed_at.is_some_and(|t| step - t < RECENT);
        }
        // The leader (the lowest live node) appends and commits.
        let leader = nodes.iter().position(|x| x.m.live).unwrap();
        top += rng.below(8);
        for (i, x) in nodes.iter_mut().enumerate() {
            x.m.leader = i == leader;
            x.m.backup = i != leader && x.m.live;
            if !x.m.live {
                continue;
            }
            if x.m.last + 1 >= x.m.oldest.max(1) {
                x.m.last = (x.m.last + rng.below(10)).min(top);
            }
            x.m.committed = x.m.last;
            if x.needy {
                continue;
            }
            if x.taking.is_none() {
                x.m.applied = (x.m.applied + rng.below(10)).min(x.m.last);
            }
            x.m.taking = x.taking.is_some();
        }
        // Images finish; each live node runs the rules on what it heard.
        for x in nodes.iter_mut() {
            if let Some((seq, left)) = x.taking {
                x.taking = (left > 0).then(|| (seq, left - 1));
                if left == 0 {
                    // Some images fail (CRIU refuses, the server never
                    // idles): no snapshot, and the node goes last a while.
                    if rng.one_in(3) {
                        x.failed_at = Some(step);
                    } else {
                        x.m.snapshot = seq;
                        x.failed_at = None;
                    }
                    x.m.taking = false;
                }
            }
        }
        for i in 0..nodes.len() {
            if !nodes[i].m.live {
                continue;
            }
            let mut view = reported.clone();
            view[i] = nodes[i].m;
            view[i].failing = nodes[i]
                .failed_at
                .is_some_and(|t| step - t < RECENT + OWN_GRACE);
            let me = nodes[i].m.node;
            if rules::taker(&view, EVERY) == Some(me) && nodes[i].taking.is_none() {
                // (A backup imaging may be elected meanwhile: it leads
                // once its server applied everything, after the image.)
                assert!(
                    !nodes[i].m.leader,
                    "seed {seed} step {step}: the leader images its server"
                );
                let seq = nodes[i].m.applied;
                nodes[i].taking = Some((seq, 1 + rng.below(4)));
                nodes[i].m.taking = true;
            }
            let point = rules::compaction_point(me, &view);
            let x = &mut nodes[i].m;
            x.oldest = x.oldest.max(point + 1);
            if let Some(src) = rules::install_source(me, x.last, !nodes[i].needy, &view) {
                let s = view[src as usize - 1].snapshot;
                // The runtime installs and images one after the other.
                nodes[i].taking = None;
                nodes[i].needy = false;
                let x = &mut nodes[i].m;
                x.taking = false;
                x.last = s;
                x.applied = s;
                x.committed = s;
                x.snapshot = s;
                x.oldest = s + 1;
            }
        }
        // Faults: a node dies (its state kept) or comes back.
        let alive = nodes.iter().filter(|x| x.m.live).count();
        let i = rng.below(n) as usize;
        if rng.one_in(40) && (alive > 1 || !nodes[i].m.live) {
            nodes[i].m.live = !nodes[i].m.live;
            nodes[i].taking = None;
            nodes[i].m.taking = false;
            let m = nodes[i].m;
            if m.live && m.oldest > 1 && m.oldest > m.snapshot + 1 {
                nodes[i].needy = true;
            }
        }
        // Invariants.
        let live_applying = nodes
            .iter()
            .filter(|x| x.m.live && x.taking.is_none())
            .count();
        let live = nodes.iter().filter(|x| x.m.live).count();
        assert!(
            live < majority + 1 || live_applying >= majority,
            "seed {seed} step {step}: {live_applying} of {live} live nodes apply: {nodes:?}"
        );
        for x in &nodes {
            let mut snaps: Vec<u64> = nodes.iter().map(|y| y.m.snapshot).collect();
            snaps.sort_unstable_by(|a, b| b.cmp(a));
            assert!(
                // (A node that installed a snapshot starts after it.)
                x.m.oldest <= snaps[majority - 1].max(x.m.snapshot) + 1 || x.m.oldest <= 1,
                "seed {seed} step {step}: node {} deleted past a majority's snapshots: {nodes:?}",
                x.m.node
            );
            if x.m.live {
                let reachable = nodes.iter().any(|y| {
                    let peer = y.m.live && y.m.node != x.m.node;
                    if x.needy {
                        // Any peer's image whose log continues it will do.
                        return peer && y.m.snapshot > 0 && y.m.oldest <= y.m.snapshot + 1;
                    }
                    peer && (y.m.oldest.max(1) <= x.m.last + 1 || y.m.snapshot > x.m.last)
                });
                // With a live majority, one of them holds a snapshot at
                // or past every compaction (majorities intersect).
                assert!(
                    reachable || live < majority,
                    "seed {seed} step {step}: node {} cannot catch up: {nodes:?}",
                    x.m.node
                );
            }
        }
    }
}

#[test]
fn snapshot_rules_random_runs() {
    let seeds = crate::env_u64("LOCKSTEP_SIM_SEEDS", 10_000) / 10;
    for seed in 1..=seeds.max(1) {
        run(seed);
    }
}
