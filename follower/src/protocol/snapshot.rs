//! Snapshot policy: which node images its server next, how much of the
//! log every node may delete, and when a node must install a peer's
//! snapshot instead of fetching entries. Pure rules over what the nodes
//! tell each other ([`Member`]); the runtime gathers that and carries the
//! answers out.
//!
//! - [`taker`]: a snapshot is due on a backup once its server applied
//!   `snapshot_every` past its newest snapshot, and log bytes at least
//!   `snapshot_every.image_percent` of that snapshot's image (imaging
//!   costs about the image's size: this keeps its cost per entry the same
//!   with any dataset; a small server's image is below the default
//!   measures' log, a large one's is not). Never the leader (clients
//!   wait on it), never a stale or joining node, and never so many at once
//!   that fewer than a majority keep applying (a backup stops applying
//!   while its server is imaged; a backup still catching up applies too).
//!   Each node decides for itself on what the
//!   others reported a moment ago, so the turn must not hang on anything
//!   that changes meanwhile: the backups take turns in the order of their
//!   newest snapshot (oldest first, then the lowest id), which changes only
//!   when a snapshot is complete — the first in that order takes one once
//!   it is due, the others wait, one at a time whatever the cluster size,
//!   and only while a majority besides it applies. (Picking among the due
//!   backups instead let two start at once, one not yet seeing the other
//!   due: the snapshot sim found it.) The first in that order must be one
//!   that can take it, or nobody ever does: a stale node (it serves
//!   nothing until it is restarted) is left out of the order, and a node
//!   whose latest attempt failed lately goes after every other (it tries
//!   again when it is first again: everyone else's snapshot is newer, or
//!   its failure is no longer recent). Before, a node that kept failing, or
//!   a backup catching up after a failover (counted as not applying),
//!   held every other's turn: one snapshot in ~14M entries over twenty
//!   leader kills under load.
//! - [`compaction_point`]: once a majority holds a snapshot at ≥ S, every
//!   node deletes its entries ≤ S, the leader too — but never entries its
//!   own server has not applied, nor what a live peer still needs to catch
//!   up by fetching entries (everything after that peer's log end, or
//!   after its commit point: a view change probes and fetches the log
//!   above a node's commit point). A dead node does not hold the log back:
//!   it installs a snapshot when it comes back. A node may delete past its
//!   own newest snapshot (the leader takes none): restarted, it rebuilds
//!   its server from a peer's image instead (an image moves between nodes,
//!   see `snapshot::relocate`).
//! - [`install_source`]: a node whose log ends before the oldest entry a
//!   peer keeps cannot catch up by entries (the leader, or with no leader
//!   every peer that holds more: a view change, maybe with this node as
//!   its candidate, would fetch from them in vain), and a node whose own log and
//!   snapshots cannot rebuild its server (restarted after deleting past
//!   its newest snapshot) has nothing to replay: either installs a
//!   snapshot from an up-to-date peer, a backup rather than the leader
//!   (the leader serves clients), the newest snapshot first, then the
//!   lowest id.

use super::viewchange;

// How much log between two snapshots: the config's own type.
use lockstep_common::config::SnapshotEvery;

/// What a node knows of one member (itself included), from its own state
/// or the member's latest status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Member {
    /// Its id.
    pub node: u64,
    /// It answered lately (a node always counts itself live).
    pub live: bool,
    /// It leads.
    pub leader: bool,
    /// It follows the leader and applies: a backup, caught up or not (not
    /// stale, not joining).
    pub backup: bool,
    /// Its server must be rebuilt (it serves nothing until restarted): it
    /// takes no turn, and holds nobody's.
    pub stale: bool,
    /// Its latest snapshot attempt failed lately: it goes after the others.
    pub failing: bool,
    /// It is imaging its server now.
    pub taking: bool,
    /// Its server applied up to here.
    pub applied: u64,
    /// Its log's last seq.
    pub last: u64,
    /// The highest seq it knows committed.
    pub committed: u64,
    /// The first seq its log still holds (entries below were compacted;
    /// 1 or 0 when it holds the whole log).
    pub oldest: u64,
    /// Its newest complete snapshot's seq (0: none).
    pub snapshot: u64,
    /// Bytes of log it applied since that snapshot.
    pub bytes_since: u64,
    /// Bytes of that snapshot's image (0: none, or not known).
    pub image_bytes: u64,
}

fn due(m: &Member, every: SnapshotEvery) -> bool {
    let entries = m.applied.saturating_sub(m.snapshot);
    let measured = (every.entries != 0 && entries >= every.entries)
        || (every.bytes != 0 && m.bytes_since >= every.bytes);
    measured && m.bytes_since >= every.image_share(m.image_bytes)
}

/// Which member should image its server now (None: none), from the
/// members' states (`members` lists every member of the config once).
pub fn taker(members: &[Member], every: SnapshotEvery) -> Option<u64> {
    let majority = viewchange::majority(members.len());
    let applying = members
        .iter()
        .filter(|m| m.live && (m.leader || m.backup) && !m.taking)
        .count();
    // One more stops applying: the others must still be a majority.
    if applying < majority + 1 {
        return None;
    }
    if members.iter().any(|m| m.taking) {
        return None;
    }
    // The order counts every live node but the leader and stale ones,
    // joining ones too: a node that turns backup this moment must not find
    // itself first while another, which did not count it yet, starts.
    members
        .iter()
        .filter(|m| m.live && !m.leader && !m.stale)
        .min_by_key(|m| (m.failing, m.snapshot, m.node))
        .filter(|m| m.backup && due(m, every))
        .map(|m| m.node)
}

/// How long a failed snapshot attempt keeps a node behind the others in
/// the turn order (ms): long enough for the next backup to take its
/// turn, short enough that a node whose trouble passed soon tries again.
pub const FAILURE_RECENT_MS: u64 = 60_000;

/// How much longer a node counts itself failing than its peers count it
/// (ms; a few rounds of the rules): when it moves up in the order again,
/// every peer has seen it there for a round or more, so none of them
/// still takes itself for first and starts too (the peers read its status
/// up to a round late).
pub const OWN_FAILURE_GRACE_MS: u64 = 3_000;

/// Whether a node whose attempts failed `failures` times, the latest
/// `last_ms` ago, counts as [`Member::failing`]: in its own rules (`own`)
/// a little longer than in its peers' (see [`OWN_FAILURE_GRACE_MS`]).
pub fn failing_lately(failures: u64, last_ms: u64, own: bool) -> bool {
    let recent = FAILURE_RECENT_MS + if own { OWN_FAILURE_GRACE_MS } else { 0 };
    failures > 0 && last_ms < recent
}

/// Why a node whose log holds `entries` entries in `bytes` bytes is
/// degraded: more than `after` times `every` (either measure that is on)
/// and, with its newest image `image_bytes` large, more than `after` times
/// the log the image rule waits for; None when it is not, or `after` is 0
/// (never).
pub fn degraded(
    entries: u64,
    bytes: u64,
    every: SnapshotEvery,
    image_bytes: u64,
    after: u64,
) -> Option<String> {
    if after == 0 {
        return None;
    }
    let over_entries = every.entries != 0 && entries > every.entries.saturating_mul(after);
    let over_bytes = every.bytes != 0 && bytes > every.bytes.saturating_mul(after);
    let image_share = every.image_share(image_bytes).saturating_mul(after);
    if !over_entries && !over_bytes || bytes <= image_share {
        return None;
    }
    let bound = match (every.entries, every.bytes) {
        (0, b) => format!("{:.1} MiB", b.saturating_mul(after) as f64 / MIB),
        (e, 0) => format!("{} entries", e.saturating_mul(after)),
        (e, b) => format!(
            "{} entries or {:.1} MiB",
            e.saturating_mul(after),
            b.saturating_mul(after) as f64 / MIB
        ),
    };
    let image = if image_share > 0 {
        format!(
            " and {after} times image_percent of its newest image ({:.1} MiB)",
            image_share as f64 / MIB
        )
    } else {
        String::new()
    };
    Some(format!(
        "its log holds {entries} entries ({:.1} MiB), past snapshot_degraded_after = {after} times snapshot_every ({bound}){image}: snapshots are not keeping it short, a restart replays all of it",
        bytes as f64 / MIB
    ))
}

const MIB: f64 = (1 << 20) as f64;

/// The highest seq a majority of members holds a snapshot at or above
/// (0: no majority holds one).
pub fn majority_snapshot(members: &[Member]) -> u64 {
    let mut seqs: Vec<u64> = members.iter().map(|m| m.snapshot).collect();
    seqs.sort_unstable_by(|a, b| b.cmp(a));
    seqs.get(viewchange::majority(members.len()) - 1)
        .copied()
        .unwrap_or(0)
}

/// How far node `me` may delete its log (entries ≤ the answer; 0:
/// nothing), from the members' states.
pub fn compaction_point(me: u64, members: &[Member]) -> u64 {
    let Some(own) = members.iter().find(|m| m.node == me) else {
        return 0;
    };
    let mut point = majority_snapshot(members).min(own.applied).min(own.last);
    for m in members.iter().filter(|m| m.live && m.node != me) {
        // A live peer fetches what follows its log's end from someone,
        // and a view change syncs its log above its commit point.
        point = point.min(m.last).min(m.committed);
    }
    point
}

/// Whether a node whose log ends at `last` can no longer catch up by
/// entries from a peer whose log starts at `peer_oldest`.
pub fn behind_compaction(last: u64, peer_oldest: u64) -> bool {
    peer_oldest > last + 1
}

/// The peer node `me` installs a snapshot from when its log ends at
/// `last` before what the leader keeps, or when its server cannot be
/// rebuilt from its own log and snapshots (`can_rebuild`: false). None: it
/// need not (it fetches the entries from the leader), no leader is known,
/// or no peer can give one that reaches past `last`.
pub fn install_source(me: u64, last: u64, can_rebuild: bool, members: &[Member]) -> Option<u64> {
    let peers = || members.iter().filter(|m| m.live && m.node != me);
    // Entries come from the leader: while its log continues this node's,
    // and this node can replay them onto its server, fetching beats
    // replacing the server.
    let behind_leader = peers().any(|m| m.leader && behind_compaction(last, m.oldest));
    // With no leader (a view change runs, maybe with this node as its
    // candidate), from any peer: none that holds more may still hold what
    // follows this log's end (a node that was away while the others
    // compacted; it would fetch in vain, a candidate forever).
    let ahead = || peers().filter(|m| m.last > last);
    let behind_all = !peers().any(|m| m.leader)
        && ahead().next().is_some()
        && ahead().all(|m| behind_compaction(last, m.oldest));
    if can_rebuild && !behind_leader && !behind_all {
        return None;
    }
    peers()
        .filter(|m| m.snapshot > 0 && (m.leader || m.backup))
        .filter(|m| !can_rebuild || m.snapshot > last)
        // Its log must continue its snapshot: the entries after it come
        // from the log once installed.
        .filter(|m| !behind_compaction(m.snapshot, m.oldest))
        .min_by_key(|m| (m.leader, std::cmp::Reverse(m.snapshot), m.node))
        .map(|m| m.node)
}

/// `n` live members, node 1 leading, each with 5000 entries applied,
/// stored and committed and its whole log kept: the rules' unit tests'
/// cluster.
#[cfg(test)]
pub(crate) fn test_cluster(n: u64) -> Vec<Member> {
    (1..=n)
        .map(|node| Member {
            node,
            live: true,
            leader: node == 1,
            backup: node != 1,
            applied: 5000,
            last: 5000,
            committed: 5000,
            oldest: 1,
            ..Member::default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(n: u64) -> Vec<Member> {
        test_cluster(n)
    }

    const EVERY: SnapshotEvery = SnapshotEvery {
        entries: 1000,
        bytes: 0,
        image_percent: 100,
    };

    #[test]
    fn one_backup_of_three_at_a_time_never_the_leader() {
        let mut c = cluster(3);
        assert_eq!(taker(&c, EVERY), Some(2));
        c[1].taking = true;
        assert_eq!(taker(&c, EVERY), None, "two backups of three at once");
        c[1].taking = false;
        c[1].snapshot = 5000;
        assert_eq!(taker(&c, EVERY), Some(3), "the oldest snapshot goes next");
        c[2].snapshot = 4500;
        assert_eq!(taker(&c, EVERY), None, "not due: 500 entries since");
        // The first in turn is not due yet: the others wait for it.
        let mut c = cluster(3);
        c[1].applied = 500;
        assert_eq!(taker(&c, EVERY), None);
        // The leader is never the one, however due; a joining node first
        // in turn holds the others back until it follows.
        let mut c = cluster(3);
        c[1].backup = false; // joining
        assert_eq!(taker(&c, EVERY), None);
        c[1].snapshot = 5000;
        c[2].snapshot = 100;
        assert_eq!(taker(&c, EVERY), None, "too few apply besides it");
        let mut c = cluster(5);
        c[1].backup = false;
        c[1].snapshot = 5000;
        assert_eq!(taker(&c, EVERY), Some(3));
        // A dead backup leaves no room for one to stop applying.
        let mut c = cluster(3);
        c[2].live = false;
        assert_eq!(taker(&c, EVERY), None);
    }

    #[test]
    fn one_at_a_time_in_five_nodes_too_and_bytes_count() {
        let mut c = cluster(5);
        assert_eq!(taker(&c, EVERY), Some(2));
        c[1].taking = true;
        assert_eq!(taker(&c, EVERY), None);
        // A dead backup is skipped while a majority besides the taker applies.
        let mut c = cluster(5);
        c[1].live = false;
        assert_eq!(taker(&c, EVERY), Some(3));
        let mut c = cluster(3);
        for m in &mut c {
            m.applied = 10;
            m.bytes_since = 2 << 20;
        }
        let bytes = SnapshotEvery {
            entries: 0,
            bytes: 1 << 20,
            image_percent: 0,
        };
        assert_eq!(taker(&c, bytes), Some(2));
        assert_eq!(taker(&c, EVERY), None);
    }

    #[test]
    fn a_large_image_waits_for_a_log_of_its_share_a_small_one_for_the_measures() {
        let mut c = cluster(3);
        for m in &mut c {
            m.snapshot = 1000;
            m.image_bytes = 10 << 20;
            m.bytes_since = 4 << 20;
        }
        assert_eq!(
            taker(&c, EVERY),
            None,
            "4000 entries since, but 40% of the image"
        );
        for m in &mut c {
            m.bytes_since = 10 << 20;
        }
        assert_eq!(taker(&c, EVERY), Some(2), "the log reached the image");
        let half = SnapshotEvery {
            image_percent: 50,
            ..EVERY
        };
        for m in &mut c {
            m.bytes_since = 5 << 20;
        }
        assert_eq!(taker(&c, half), Some(2), "50%");
        assert_eq!(taker(&c, EVERY), None);
        let off = SnapshotEvery {
            image_percent: 0,
            ..EVERY
        };
        assert_eq!(taker(&c, off), Some(2), "the rule off");
        // A small image: the entry measure decides.
        for m in &mut c {
            m.image_bytes = 64 << 10;
            m.bytes_since = 100 << 10;
            m.applied = 1500;
        }
        assert_eq!(taker(&c, EVERY), None, "500 entries since");
        for m in &mut c {
            m.applied = 2000;
        }
        assert_eq!(taker(&c, EVERY), Some(2));
    }

    #[test]
    fn compaction_waits_for_a_majority_and_for_live_nodes_that_need_entries() {
        let mut c = cluster(3);
        c[1].snapshot = 4000;
        assert_eq!(compaction_point(2, &c), 0, "one snapshot is no majority");
        c[2].snapshot = 3000;
        assert_eq!(majority_snapshot(&c), 3000);
        assert_eq!(compaction_point(2, &c), 3000);
        assert_eq!(compaction_point(3, &c), 3000);
        // The leader too, without a snapshot of its own: restarted, it
        // installs a backup's.
        assert_eq!(compaction_point(1, &c), 3000);
        c[2].snapshot = 3500;
        assert_eq!(compaction_point(2, &c), 3500);
        assert_eq!(compaction_point(3, &c), 3500);
        c[2].snapshot = 3000;
        // A live node whose log ends at 2000 still fetches from 2001.
        c[0].last = 2000;
        assert_eq!(compaction_point(2, &c), 2000);
        // Nor one that knows the commit only up to 2200.
        c[0].last = 5000;
        c[0].committed = 2200;
        assert_eq!(compaction_point(2, &c), 2200);
        // Dead, it installs a snapshot instead: no longer holds it back.
        c[0].live = false;
        assert_eq!(compaction_point(2, &c), 3000);
        // Never past what the node's own server applied.
        c[1].applied = 2500;
        assert_eq!(compaction_point(2, &c), 2500);
    }

    #[test]
    fn a_node_behind_the_compacted_log_installs_from_a_backup() {
        let mut c = cluster(3);
        for m in &mut c[..2] {
            m.snapshot = 3000;
            m.oldest = 3001;
        }
        c[2].last = 100;
        assert!(behind_compaction(100, 3001));
        assert!(!behind_compaction(3000, 3001));
        assert_eq!(
            install_source(3, 100, true, &c),
            Some(2),
            "a backup, not the leader"
        );
        c[1].live = false;
        assert_eq!(
            install_source(3, 100, true, &c),
            Some(1),
            "the leader when no backup can"
        );
        // Not behind: entries will do.
        let mut c = cluster(3);
        assert_eq!(install_source(3, 100, true, &c), None);
        // Behind a backup's log only: the leader's log serves.
        c[1].snapshot = 3000;
        c[1].oldest = 3001;
        assert_eq!(install_source(3, 100, true, &c), None);
        // No leader: behind every log that holds more, it installs (a
        // candidate that was away while the others compacted); one log
        // that continues it will do instead.
        c[0].leader = false;
        c[0].backup = true;
        assert_eq!(install_source(3, 100, true, &c), None);
        c[0].snapshot = 2000;
        c[0].oldest = 2001;
        assert_eq!(install_source(3, 100, true, &c), Some(2), "the newest");
    }

    #[test]
    fn a_node_that_cannot_rebuild_its_server_installs_whatever_its_log() {
        // The leader restarted after deleting its log up to 3000 with no
        // snapshot of its own: its log reaches 5000, but nothing of its own
        // rebuilds its server.
        let mut c = cluster(3);
        c[0].leader = false;
        c[0].oldest = 3001;
        c[1].snapshot = 2000;
        c[1].oldest = 2001;
        c[2].snapshot = 3000;
        c[2].oldest = 3001;
        assert_eq!(install_source(1, 5000, false, &c), Some(3), "the newest");
        // A peer whose log does not continue its snapshot cannot serve.
        c[2].oldest = 3500;
        assert_eq!(install_source(1, 5000, false, &c), Some(2));
        c[1].snapshot = 0;
        assert_eq!(install_source(1, 5000, false, &c), None, "nobody has one");
    }

    #[test]
    fn a_log_past_the_bound_is_degraded_and_one_within_is_not() {
        let every = SnapshotEvery {
            entries: 1000,
            bytes: 1 << 20,
            image_percent: 100,
        };
        assert_eq!(degraded(3000, 1 << 20, every, 0, 3), None);
        let why = degraded(3001, 1, every, 0, 3).unwrap();
        assert!(
            why.contains("3001 entries") && why.contains("3000 entries or 3.0 MiB"),
            "{why}"
        );
        assert!(!why.contains("image"), "no image, no image bound: {why}");
        assert!(degraded(10, (3 << 20) + 1, every, 0, 3).is_some(), "bytes");
        assert_eq!(degraded(u64::MAX, u64::MAX, every, 0, 0), None, "0: never");
        let entries_only = SnapshotEvery {
            entries: 1000,
            bytes: 0,
            image_percent: 0,
        };
        assert_eq!(degraded(10, u64::MAX, entries_only, 0, 3), None);
        // A large image lets the log grow to `after` times its share.
        let image = 64 << 20;
        assert_eq!(degraded(30_000, 100 << 20, every, image, 3), None);
        let why = degraded(30_000, (192 << 20) + 1, every, image, 3).unwrap();
        assert!(why.contains("image (192.0 MiB)"), "{why}");
        assert!(failing_lately(1, 0, false) && !failing_lately(0, 0, true));
        assert!(!failing_lately(3, FAILURE_RECENT_MS, false));
        // A node moves up again only after its peers saw it move.
        assert!(failing_lately(3, FAILURE_RECENT_MS, true));
        assert!(!failing_lately(
            3,
            FAILURE_RECENT_MS + OWN_FAILURE_GRACE_MS,
            true
        ));
    }

    #[test]
    fn a_node_that_cannot_take_its_turn_holds_no_other_backups() {
        // Node 2 (oldest snapshot) failed its latest attempt: node 3 goes.
        let mut c = cluster(3);
        c[2].snapshot = 3000;
        c[2].applied = 5000;
        c[1].failing = true;
        c[2].applied = 4000;
        assert_eq!(taker(&c, EVERY), Some(3));
        // Node 3 not due yet: nobody (node 2 waits for its turn again).
        c[2].snapshot = 3500;
        assert_eq!(taker(&c, EVERY), None);
        // Every backup failing: the oldest snapshot tries again.
        c[2].failing = true;
        c[2].snapshot = 3000;
        assert_eq!(taker(&c, EVERY), Some(2));
        // A stale node (oldest snapshot of all) takes no turn and holds
        // none, in five nodes (three apply besides the taker).
        let mut c = cluster(5);
        c[1].stale = true;
        c[1].backup = false;
        for m in &mut c[2..] {
            m.snapshot = 1000;
        }
        assert_eq!(taker(&c, EVERY), Some(3));
    }

    #[test]
    fn a_backup_catching_up_applies_and_takes_its_turn() {
        // After a failover under load the restarted node catches up: it
        // applies (the others may image), and it goes first when its
        // snapshot is the oldest, as a node that led and is back is.
        let mut c = cluster(3);
        c[0].leader = false;
        c[0].backup = true; // led, killed, back (catching up or not)
        c[1].leader = true;
        c[1].backup = false;
        c[0].snapshot = 0;
        c[2].snapshot = 3000;
        assert_eq!(taker(&c, EVERY), Some(1));
        c[0].snapshot = 4500;
        c[2].snapshot = 4800;
        assert_eq!(taker(&c, EVERY), None, "node 1 is first and not due");
        c[0].snapshot = 3500;
        c[2].snapshot = 0;
        assert_eq!(taker(&c, EVERY), Some(3));
    }

    /// The order of turns over many failovers: every backup's log since
    /// its newest image stays within about two `snapshot_every` when
    /// images complete in a round or two — also when the leader keeps
    /// changing, the node that led comes back catching up, and one node's
    /// attempts fail for a while.
    #[test]
    fn snapshots_keep_their_cadence_through_many_failovers() {
        let every = SnapshotEvery {
            entries: 1000,
            bytes: 0,
            image_percent: 0,
        };
        let mut c = cluster(3);
        let mut taking: Option<(usize, u64, u32)> = None;
        let mut worst = 0u64;
        // Since when each node is a backup (a node that led has an old
        // image: it gets a few turns' time to take its own).
        let mut backup_since = [0u64; 3];
        for round in 0..4000u64 {
            // Every 300 rounds the leader dies and comes back as a backup
            // catching up; the next node leads.
            if round % 300 == 0 && round > 0 {
                let old = c.iter().position(|m| m.leader).unwrap();
                let new = (old + 1) % 3;
                c[old].leader = false;
                c[old].backup = true;
                backup_since[old] = round;
                c[new].leader = true;
                c[new].backup = false;
                if taking.is_some_and(|t| t.0 == new) {
                    taking = None;
                    c[new].taking = false;
                }
            }
            for m in &mut c {
                m.last += 40;
                m.committed = m.last;
                if !m.taking {
                    m.applied = m.last;
                }
            }
            // Node 3 fails its attempts for a stretch.
            let broken = (1000..1600).contains(&round);
            if let Some((i, seq, left)) = taking {
                if left == 0 {
                    c[i].taking = false;
                    if broken && c[i].node == 3 {
                        c[i].failing = true;
                    } else {
                        c[i].snapshot = seq;
                        c[i].failing = false;
                    }
                    taking = None;
                } else {
                    taking = Some((i, seq, left - 1));
                }
            }
            if round % 50 == 0 {
                // A failure is recent for a while only.
                for m in &mut c {
                    m.failing = m.failing && broken;
                }
            }
            if taking.is_none() {
                if let Some(t) = taker(&c, every) {
                    let i = c.iter().position(|m| m.node == t).unwrap();
                    c[i].taking = true;
                    taking = Some((i, c[i].applied, 2));
                }
            }
            for (i, m) in c.iter().enumerate() {
                let settled = round > backup_since[i] + 100;
                if m.backup && settled && !(broken && m.node == 3) {
                    worst = worst.max(m.applied - m.snapshot);
                }
            }
        }
        assert!(
            worst <= 2 * every.entries + 200,
            "a backup's log since its image reached {worst} entries"
        );
    }

    proptest::proptest! {
        /// Nothing that cannot take a snapshot holds the others' turn: with
        /// nobody imaging, enough applying and every other live node a
        /// backup or stale, the backup first among those not failing
        /// takes one whenever it is due.
        #[test]
        fn no_failing_or_stale_node_holds_the_turn(
            seed in proptest::collection::vec((0u8..4, 0u64..3000, 0u64..3000), 5),
        ) {
            let mut c = cluster(5);
            for (m, (flags, snap, applied)) in c.iter_mut().zip(seed) {
                if m.leader {
                    continue;
                }
                m.failing = flags & 1 == 1;
                m.stale = flags & 2 == 2 && m.node == 5;
                m.backup = !m.stale;
                m.applied = applied.max(snap);
                m.snapshot = snap;
            }
            let applying = c.iter().filter(|m| m.leader || m.backup).count();
            let first = c
                .iter()
                .filter(|m| m.backup)
                .min_by_key(|m| (m.failing, m.snapshot, m.node))
                .copied()
                .unwrap();
            let got = taker(&c, EVERY);
            if applying > viewchange::majority(5) {
                proptest::prop_assert_eq!(got, due(&first, EVERY).then_some(first.node));
            } else {
                proptest::prop_assert_eq!(got, None);
            }
            if let Some(t) = got {
                let m = c.iter().find(|m| m.node == t).unwrap();
                proptest::prop_assert!(!m.stale && m.backup);
                proptest::prop_assert!(!m.failing || c.iter().filter(|x| x.backup).all(|x| x.failing));
            }
        }
    }

    proptest::proptest! {
        /// Whoever the rule picks, a majority of members still applies
        /// (live leader or backups not imaging) while it images.
        #[test]
        fn a_majority_keeps_applying(
            n in 1u64..8, seed in proptest::collection::vec((0u8..4, 0u64..3000, 0u64..3000), 8),
        ) {
            let mut c = cluster(n);
            for (m, (flags, applied, snap)) in c.iter_mut().zip(seed) {
                m.live = flags & 1 == 0;
                m.taking = flags & 2 == 2 && !m.leader;
                m.failing = applied % 3 == 0;
                m.applied = applied;
                m.snapshot = snap.min(applied);
            }
            if let Some(t) = taker(&c, EVERY) {
                let m = c.iter().find(|m| m.node == t).unwrap();
                proptest::prop_assert!(m.backup && !m.leader && m.live && !m.taking);
                let applying = c
                    .iter()
                    .filter(|m| m.live && (m.leader || m.backup) && !m.taking && m.node != t)
                    .count();
                proptest::prop_assert!(applying >= viewchange::majority(n as usize));
            }
        }
    }
}
