//! A round of the snapshot rules ([`crate::protocol::snapshot`]): whether
//! this backup images its server now, how far its log is deleted, and
//! whether (and from whom) it installs a peer's snapshot — with the pause
//! between two tries of a failing install.

use super::super::snapshot as rules;
use super::*;

/// The pause after a failed install, doubled after each failure up to
/// [`INSTALL_BACKOFF_MAX_MS`] (a restore that cannot work would otherwise
/// be tried every round).
pub const INSTALL_RETRY_MS: Millis = 1000;
/// The longest pause between two tries of a failing install.
pub const INSTALL_BACKOFF_MAX_MS: Millis = 30_000;

/// When the next install may be tried, and the pause after the next
/// failure.
#[derive(Clone, Copy, Debug)]
pub(super) struct InstallBackoff {
    next: Millis,
    wait: Millis,
}

impl Default for InstallBackoff {
    fn default() -> InstallBackoff {
        InstallBackoff {
            next: 0,
            wait: INSTALL_RETRY_MS,
        }
    }
}

impl Replica {
    /// The rules over `round`, in the order the runtime carries them out:
    /// take (this backup's turn), compact, install.
    pub(super) fn on_snapshot_round(&mut self, round: SnapshotRound, host: &impl Host) {
        let Some(every) = self.cfg.snapshot_every else {
            return;
        };
        let me = self.cfg.me;
        let members = &round.members;
        // Not while its server ran past the commit point (a deposed
        // leader's, which consumed inputs before they committed): a new
        // view may still drop them, and an image of them, installed
        // elsewhere or restored here, would apply them again.
        if rules::taker(members, every) == Some(me) && self.applied <= self.committed {
            self.out.push(Action::TakeSnapshot);
        }
        let point = rules::compaction_point(me, members);
        if point > 0 {
            debug_assert!(
                point <= rules::majority_snapshot(members),
                "node {me}: compacting through {point}, past what a majority's snapshots cover"
            );
            debug_assert!(
                members
                    .iter()
                    .find(|m| m.node == me)
                    .is_some_and(|m| point <= m.applied && point <= m.last),
                "node {me}: compacting through {point}, past what its server applied or its log holds"
            );
            // The own member's applied point is its status's, shown no
            // further than the commit point it knew then, and the commit
            // point only moves up.
            debug_assert!(
                point <= self.committed,
                "node {me}: compacting through {point}, past its commit point {}",
                self.committed
            );
            self.out.push(Action::Compact { through: point });
        }
        let (last, _) = host.last();
        match rules::install_source(me, last, round.can_rebuild, members) {
            None => self.install.wait = INSTALL_RETRY_MS,
            Some(from) if self.now >= self.install.next => {
                self.out.push(Action::Install { from });
            }
            Some(_) => {}
        }
    }

    /// An install failed: the next waits, longer each time.
    pub(super) fn on_install_failed(&mut self) {
        self.install.next = self.now + self.install.wait;
        self.install.wait = (self.install.wait * 2).min(INSTALL_BACKOFF_MAX_MS);
    }

    /// An install worked: a later one is tried at once.
    pub(super) fn install_worked(&mut self) {
        self.install.wait = INSTALL_RETRY_MS;
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::config;
    use super::*;
    use lockstep_common::config::SnapshotEvery;
    use rules::Member;

    struct Log(u64);

    impl Host for Log {
        fn last(&self) -> (u64, u64) {
            (self.0, 1)
        }
        fn view_at(&self, seq: u64) -> Option<u64> {
            (seq >= 1 && seq <= self.0).then_some(1)
        }
        fn fence_handover(&mut self) -> u64 {
            0
        }
    }

    const EVERY: SnapshotEvery = SnapshotEvery {
        entries: 1000,
        bytes: 0,
        image_percent: 0,
    };

    fn backup(me: u64) -> Replica {
        let cfg = ReplicaConfig {
            me,
            snapshot_every: Some(EVERY),
            ..config(LeaderChoice::Static { leader: 1 })
        };
        let restored = Restored {
            committed: 5000,
            ..Restored::default()
        };
        Replica::new(cfg, restored, 0).0
    }

    fn members() -> Vec<Member> {
        crate::protocol::snapshot::test_cluster(3)
    }

    /// A step's snapshot decisions (the server applies meanwhile).
    fn decided(a: Vec<Action>) -> Vec<Action> {
        a.into_iter()
            .filter(|a| {
                matches!(
                    a,
                    Action::TakeSnapshot | Action::Compact { .. } | Action::Install { .. }
                )
            })
            .collect()
    }

    fn round(members: Vec<Member>, can_rebuild: bool) -> Event {
        Event::SnapshotRound(SnapshotRound {
            members,
            can_rebuild,
        })
    }

    #[test]
    fn a_round_takes_compacts_and_installs_as_the_rules_say() {
        let mut r = backup(2);
        let mut c = members();
        assert_eq!(
            decided(r.step(1, round(c.clone(), true), &mut Log(5000))),
            vec![Action::TakeSnapshot]
        );
        // Not while its server ran past the commit point (a deposed
        // leader's).
        r.step(1, Event::Applied { seq: 5001 }, &mut Log(5001));
        assert_eq!(
            decided(r.step(1, round(c.clone(), true), &mut Log(5001))),
            vec![]
        );
        let mut r = backup(2);
        c[1].snapshot = 4000;
        c[2].snapshot = 3000;
        assert_eq!(
            decided(r.step(2, round(c.clone(), true), &mut Log(5000))),
            vec![Action::Compact { through: 3000 }],
            "node 3's turn now; a majority covers 3000"
        );
        // Node 3's log ends before what the leader keeps.
        let mut r = backup(3);
        c[0].oldest = 3001;
        c[2] = Member {
            snapshot: 0,
            applied: 100,
            last: 100,
            committed: 100,
            ..c[2]
        };
        let a = decided(r.step(3, round(c.clone(), true), &mut Log(100)));
        assert_eq!(a, vec![Action::Install { from: 2 }]);
    }

    #[test]
    fn a_failing_install_is_tried_less_and_less_often() {
        let mut r = backup(3);
        let mut c = members();
        c[0].oldest = 3001;
        c[1].snapshot = 3000;
        c[1].oldest = 3001;
        c[2].last = 100;
        c[2].applied = 100;
        let mut tries = vec![];
        for now in (0..40_000).step_by(1000) {
            let a = decided(r.step(now, round(c.clone(), true), &mut Log(100)));
            if a.contains(&Action::Install { from: 2 }) {
                tries.push(now);
                r.step(now, Event::InstallFailed, &mut Log(100));
            }
        }
        assert_eq!(tries, [0, 1000, 3000, 7000, 15000, 31000]);
        // Once it need not install, the pause starts short again.
        let mut fine = members();
        fine[2].last = 100;
        fine[2].applied = 100;
        decided(r.step(40_000, round(fine, true), &mut Log(100)));
        r.step(40_000, Event::InstallFailed, &mut Log(100));
        let a = decided(r.step(41_000, round(c, true), &mut Log(100)));
        assert_eq!(a, vec![Action::Install { from: 2 }]);
    }

    #[test]
    fn a_replica_without_snapshots_decides_nothing() {
        let cfg = ReplicaConfig {
            me: 2,
            ..config(LeaderChoice::Static { leader: 1 })
        };
        let mut r = Replica::new(cfg, Restored::default(), 0).0;
        assert_eq!(
            decided(r.step(1, round(members(), false), &mut Log(5000))),
            vec![]
        );
    }
}
