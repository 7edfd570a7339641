//! What the node's server applied, an installed image, and how far the
//! server may apply next.

use super::*;

impl Replica {
    pub(super) fn on_applied(&mut self, seq: u64) {
        self.applied = self.applied.max(seq);
    }

    pub(super) fn on_installed(&mut self, seq: u64) {
        self.applied = self.applied.max(seq);
        self.committed = self.committed.max(seq);
        match self.job {
            // Planned on the old log: start over on the new one (the
            // leader's next round, or the gap watch, asks again).
            Job::Follow(_) => self.fail_follow(),
            Job::CatchUp { .. } => self.job = Job::Idle,
            Job::Candidate(_) | Job::Idle => {}
        }
    }

    pub(super) fn maybe_apply(&mut self, host: &mut impl Host) {
        if self.role == Role::Leader || self.stale.is_some() {
            return;
        }
        let (last, _) = host.last();
        let rebuilding = self.role == Role::Joining && self.leader == self.cfg.me;
        let target = commit::apply_target(self.committed, last, rebuilding);
        if target > self.applied {
            self.out.push(Action::ApplyUpTo { seq: target });
        }
        if commit::rebuilt(
            rebuilding,
            self.log_view,
            self.promised,
            self.applied,
            target,
        ) && matches!(self.job, Job::Idle)
        {
            self.set_role(Role::Leader);
            if self.cfg.election == LeaderChoice::Zookeeper {
                self.out.push(Action::Announce {
                    view: self.promised,
                });
            }
        }
    }
}
