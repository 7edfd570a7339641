//! Catching up: when a backup stops reading its ring and fetches from a
//! peer, and from which.

use super::*;

impl Replica {
    pub(super) fn maybe_catch_up(
        &mut self,
        read_failed: bool,
        tail_ahead: bool,
        host: &mut impl Host,
    ) {
        if !matches!(self.job, Job::Idle) {
            return;
        }
        let stall = Stall {
            tail_ahead,
            leader_node: self.leader == self.cfg.me,
            following: self.role == Role::Backup && self.log_view == self.promised,
        };
        if self.gap.decide(self.now, read_failed, stall) {
            self.start_catch_up(host);
        }
    }

    pub(super) fn start_catch_up(&mut self, host: &mut impl Host) {
        let from = host.last().0 + 1;
        let plan = catchup::plan(
            self.cfg.me,
            self.leader,
            &self.cfg.members,
            self.committed,
            from,
        );
        if plan.is_empty() {
            return;
        }
        self.out.push(Action::Send {
            to: plan[0].peer,
            msg: Message::Fetch {
                from,
                to: plan[0].to,
            },
        });
        self.job = Job::CatchUp {
            plan,
            at: 0,
            from,
            next: from,
            deadline: self.now + self.cfg.request_timeout,
        };
    }

    pub(super) fn next_catch_up_peer(&mut self) {
        let Job::CatchUp { plan, at, next, .. } = &mut self.job else {
            return;
        };
        *at += 1;
        if let Some(p) = plan.get(*at).copied() {
            // What earlier peers sent is stored: ask for the rest only.
            let from = *next;
            self.out.push(Action::Send {
                to: p.peer,
                msg: Message::Fetch { from, to: p.to },
            });
            if let Job::CatchUp { deadline, .. } = &mut self.job {
                *deadline = self.now + self.cfg.request_timeout;
            }
        } else {
            self.job = Job::Idle;
        }
    }

    pub(super) fn on_unanswered(&mut self, to: u64, host: &mut impl Host) {
        match &mut self.job {
            Job::CatchUp { plan, at, .. } if plan.get(*at).is_some_and(|p| p.peer == to) => {
                self.next_catch_up_peer()
            }
            Job::Follow(f) if f.leader == to => self.fail_follow(),
            Job::Candidate(c) => match &c.phase {
                // ZooKeeper did not give the view.
                CandPhase::Claiming if to == 0 => self.fail_candidacy(),
                CandPhase::Preparing(_) | CandPhase::NewView { .. } => {
                    c.waiting.remove(&to);
                    if c.waiting.is_empty() {
                        self.conclude_round(host);
                    }
                }
                // (A peer whose log was compacted below what this node
                // needs refuses the fetch: the next candidacy fetches from
                // an equal log elsewhere, or it would ask there in vain
                // for ever.)
                CandPhase::Adopting { adopt, .. } if adopt.source == to => {
                    self.adopt_refused = Some(to);
                    self.fail_candidacy()
                }
                _ => {}
            },
            _ => {}
        }
    }
}
