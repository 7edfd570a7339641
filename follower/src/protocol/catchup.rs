//! Catch-up: when a backup fetches entries from a peer instead of reading
//! them from its ring, and from whom.
//!
//! A backup reads its ring in seq order. It fetches from a peer when the
//! ring cannot give it the next entry: it fell a whole lap behind, the
//! entry is corrupt, or the leader's tail is ahead of the reader and
//! nothing readable appears for [`GAP_PATIENCE_MS`] (a lost write). Tries
//! are at least [`CATCHUP_SPACING_MS`] apart ([`GapWatch`]). The leader is
//! asked first, for everything it has; any other peer only up to this
//! node's commit point ([`plan`]): only the leader's log is certain past
//! the commit point, another peer may hold a dead leader's tail there.

use super::Millis;

/// Catch up from a peer when the ring's tail is ahead of us but nothing
/// readable appears at our position for this long (a lost write).
pub const GAP_PATIENCE_MS: Millis = 200;
/// Minimum spacing of catch-up attempts.
pub const CATCHUP_SPACING_MS: Millis = 500;

/// What the poll loop saw when its ring had nothing readable for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stall {
    /// The writer's tail is past the reader's position.
    pub tail_ahead: bool,
    /// This node is the leader of its view (it reads its own writes).
    pub leader_node: bool,
    /// This node is a backup whose log follows the view it is in.
    pub following: bool,
}

/// The poll loop's catch-up timers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GapWatch {
    /// Since when the reader has been stuck behind the tail.
    gap_since: Option<Millis>,
    /// When the last catch-up started.
    last_catchup: Option<Millis>,
}

impl GapWatch {
    /// The reader stored entries: no gap.
    pub fn progress(&mut self) {
        self.gap_since = None;
    }

    /// Whether to catch up now, at `now`: `read_failed` when the ring
    /// reported a lap or a corrupt entry, `stall` what an empty read saw.
    /// Records the attempt when it says yes.
    pub fn decide(&mut self, now: Millis, read_failed: bool, stall: Stall) -> bool {
        let mut need = read_failed;
        if stall.tail_ahead && !stall.leader_node && stall.following {
            let since = *self.gap_since.get_or_insert(now);
            if now.saturating_sub(since) > GAP_PATIENCE_MS {
                need = true;
            }
        } else {
            self.gap_since = None;
        }
        let spaced = self
            .last_catchup
            .is_none_or(|t| now.saturating_sub(t) >= CATCHUP_SPACING_MS);
        if need && spaced {
            self.last_catchup = Some(now);
            self.gap_since = None;
            return true;
        }
        false
    }
}

/// One fetch to try: `peer`'s entries from the expected seq up to `to`
/// (0: all it has).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetchPlan {
    /// The peer asked.
    pub peer: u64,
    /// Last seq wanted (0: all).
    pub to: u64,
}

/// Whom node `me` asks for entries from `expected` on, in order: the
/// leader for everything, then every other member up to `committed`
/// (skipped when the commit point is below `expected`).
pub fn plan(
    me: u64,
    leader: u64,
    members: &[u64],
    committed: u64,
    expected: u64,
) -> Vec<FetchPlan> {
    let mut peers = Vec::new();
    if leader != 0 && leader != me {
        peers.push(FetchPlan {
            peer: leader,
            to: 0,
        });
    }
    if committed >= expected {
        peers.extend(
            members
                .iter()
                .filter(|&&i| i != leader && i != me && i != 0)
                .map(|&peer| FetchPlan {
                    peer,
                    to: committed,
                }),
        );
    }
    peers
}

#[cfg(test)]
mod tests {
    use super::*;

    const BACKUP: Stall = Stall {
        tail_ahead: true,
        leader_node: false,
        following: true,
    };

    #[test]
    fn a_lost_write_is_fetched_after_the_patience() {
        let mut g = GapWatch::default();
        assert!(!g.decide(1000, false, BACKUP));
        assert!(!g.decide(1000 + GAP_PATIENCE_MS, false, BACKUP));
        assert!(g.decide(1001 + GAP_PATIENCE_MS, false, BACKUP));
        // The clock starts again, and tries are spaced.
        assert!(!g.decide(1000 + CATCHUP_SPACING_MS, true, BACKUP));
        assert!(g.decide(1001 + GAP_PATIENCE_MS + CATCHUP_SPACING_MS, true, BACKUP));
    }

    #[test]
    fn progress_or_a_caught_up_reader_resets_the_clock() {
        let mut g = GapWatch::default();
        assert!(!g.decide(0, false, BACKUP));
        g.progress();
        assert!(!g.decide(GAP_PATIENCE_MS + 1, false, BACKUP));
        let idle = Stall {
            tail_ahead: false,
            ..BACKUP
        };
        assert!(!g.decide(GAP_PATIENCE_MS + 2, false, idle));
        assert!(!g.decide(2 * GAP_PATIENCE_MS + 2, false, BACKUP));
    }

    #[test]
    fn the_leader_and_unsynced_nodes_do_not_chase_the_tail() {
        let mut g = GapWatch::default();
        for s in [
            Stall {
                leader_node: true,
                ..BACKUP
            },
            Stall {
                following: false,
                ..BACKUP
            },
        ] {
            assert!(!g.decide(0, false, s));
            assert!(!g.decide(10 * GAP_PATIENCE_MS, false, s));
        }
        // A lap or a corrupt entry is fetched at once.
        assert!(g.decide(10 * GAP_PATIENCE_MS, true, Stall::default()));
    }

    #[test]
    fn the_leader_first_others_only_up_to_the_commit_point() {
        assert_eq!(
            plan(2, 1, &[1, 2, 3], 10, 5),
            vec![FetchPlan { peer: 1, to: 0 }, FetchPlan { peer: 3, to: 10 }]
        );
        assert_eq!(
            plan(2, 1, &[1, 2, 3], 4, 5),
            vec![FetchPlan { peer: 1, to: 0 }]
        );
        assert_eq!(plan(2, 0, &[1, 2, 3], 4, 5), vec![]);
    }
}
