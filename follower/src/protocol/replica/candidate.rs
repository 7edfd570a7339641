//! Running a view change as candidate: elections, promises, the round's
//! conclusion, adopting the chosen log and starting the view.

use super::*;

impl Replica {
    pub(super) fn maybe_conclude(&mut self, host: &mut impl Host) {
        if let Job::Candidate(c) = &self.job {
            let round = matches!(c.phase, CandPhase::Preparing(_) | CandPhase::NewView { .. });
            if round && c.waiting.is_empty() {
                self.conclude_round(host);
            }
        }
    }

    /// Phase 1 here: fence every view below `view`, report the log.
    pub(super) fn promise(
        &mut self,
        view: u64,
        host: &mut impl Host,
    ) -> Result<Promise, ViewRefusal> {
        fence::check_requested_view(self.cfg.me, self.promised, self.log_view, view)?;
        if view > self.promised {
            // What this node was doing belongs to an older view (the
            // runtime serialises it before the promise; here it is
            // dropped, as a request that failed).
            match &self.job {
                Job::Candidate(c) if c.view == view => {}
                _ => self.job = Job::Idle,
            }
        }
        self.raise_view(view);
        self.step_down(host);
        self.view_change.promised(self.now);
        Ok(Promise {
            node: self.cfg.me,
            log_view: self.log_view,
            last_seq: host.last().0,
            committed: self.committed,
            led: self.view_change.led(),
        })
    }

    pub(super) fn fail_candidacy(&mut self) {
        self.job = Job::Idle;
        self.next_attempt = self.now + self.cfg.retry;
    }

    pub(super) fn on_election(
        &mut self,
        session: Session,
        candidate: bool,
        announced: Option<(u64, u64)>,
        followed_serving: bool,
        host: &mut impl Host,
    ) {
        if self.stale.is_some() {
            return;
        }
        if session == Session::Connected || self.role != Role::Leader {
            self.contact.reset();
        } else {
            let since = match session {
                Session::Disconnected(d) => self.now.saturating_sub(d),
                _ => self.now,
            };
            self.contact.lost(since, self.now);
        }
        let silent = self.contact.silent(self.now, self.cfg.members.len());
        let newer = self
            .view_change
            .stalled(self.promised, self.now, 0)
            .map(|(_, view)| view);
        if let Some(loss) =
            session::session_loss(session, self.stuck, silent, newer, self.cfg.session_timeout)
        {
            if self.role == Role::Leader {
                self.note(format!("{loss}: no longer accepting writes"));
            }
            self.demote(host);
        }
        if session == Session::Connected {
            if candidate {
                if viewchange::announces(self.views(), self.role == Role::Leader, announced) {
                    self.out.push(Action::Announce {
                        view: self.promised,
                    });
                }
                let idle =
                    !viewchange::leading(self.cfg.me, self.leader, self.promised, self.log_view)
                        && matches!(self.job, Job::Idle)
                        && self.now >= self.next_attempt;
                if idle
                    && viewchange::yields(self.views(), self.role == Role::Backup, followed_serving)
                {
                    self.note(format!(
                        "first in the election, but node {} still leads view {}: registering again behind it",
                        self.leader, self.log_view
                    ));
                    self.out.push(Action::Yield);
                    self.next_attempt = self.now + self.cfg.retry;
                } else if idle {
                    self.out.push(Action::ClaimView {
                        floor: self.view_floor(),
                    });
                    self.job = Job::Candidate(Candidacy {
                        view: 0,
                        phase: CandPhase::Claiming,
                        waiting: BTreeSet::new(),
                        outdated: Vec::new(),
                        deadline: self.now + self.cfg.request_timeout,
                    });
                }
            } else if let Some((view, leader)) = announced {
                if viewchange::joins_announced(self.views(), view, leader)
                    && matches!(self.job, Job::Idle)
                {
                    self.follow(view, leader, None, host);
                }
            }
        }
    }

    pub(super) fn on_leader_status(&mut self, view: u64, serving: bool, host: &mut impl Host) {
        let LeaderChoice::Static { leader } = self.cfg.election else {
            return;
        };
        if leader == self.cfg.me || !matches!(self.job, Job::Idle) {
            return;
        }
        if !self.caught_up_at_start {
            self.caught_up_at_start = true;
            if view == self.log_view {
                self.start_catch_up(host);
                return;
            }
        }
        if viewchange::follows_static(self.views(), view, serving) {
            self.follow(view, leader, None, host);
        }
    }

    /// The candidate's first round for `view`.
    pub(super) fn start_view(&mut self, view: u64, host: &mut impl Host) {
        let own = match self.promise(view, host) {
            Ok(p) => p,
            Err(_) => {
                self.fail_candidacy();
                return;
            }
        };
        self.note(format!("candidate for view {view}"));
        let mut cand = Candidate::new(view, self.cfg.me, &self.cfg.members);
        cand.avoid(self.adopt_refused);
        cand.promise(own);
        let peers = self.send_to_peers(Message::Prepare {
            view,
            candidate: self.cfg.me,
        });
        self.job = Job::Candidate(Candidacy {
            view,
            phase: CandPhase::Preparing(cand),
            waiting: peers.into_iter().collect(),
            outdated: Vec::new(),
            deadline: self.now + self.cfg.request_timeout,
        });
        self.maybe_conclude(host);
    }

    pub(super) fn conclude_round(&mut self, host: &mut impl Host) {
        let Job::Candidate(c) = std::mem::replace(&mut self.job, Job::Idle) else {
            return;
        };
        if let Some(p) = viewchange::superseded(c.view, c.outdated.iter().copied()) {
            self.note(format!(
                "view {}: a peer promised view {p} already; trying a view above it",
                c.view
            ));
            self.fail_candidacy();
            return;
        }
        match c.phase {
            CandPhase::Preparing(cand) => {
                let Some(adopt) = cand.decide() else {
                    self.note(format!("view {}: no majority promised", c.view));
                    self.fail_candidacy();
                    return;
                };
                let (last, _) = host.last();
                let floor = sync::sync_point(last, self.committed);
                let view = c.view;
                if adopt.source == self.cfg.me {
                    self.job = Job::Candidate(Candidacy {
                        phase: CandPhase::Adopting {
                            adopt,
                            floor,
                            step: Sync::Fetching {
                                cut: last,
                                got: last,
                            },
                        },
                        ..c
                    });
                    self.finish_adopt(view, adopt, last.min(adopt.last_seq), &[], host);
                } else {
                    self.job = Job::Candidate(Candidacy {
                        phase: CandPhase::Adopting {
                            adopt,
                            floor,
                            step: Sync::Probing(PrefixSearch::new(last, floor)),
                        },
                        deadline: self.now + self.cfg.request_timeout,
                        ..c
                    });
                    self.drive_adopt(host);
                }
            }
            CandPhase::NewView { seq, holders } => {
                if holders.len() < self.majority() {
                    self.note(format!(
                        "view {}: only nodes {holders:?} hold its log, no majority",
                        c.view
                    ));
                    self.fail_candidacy();
                    return;
                }
                self.committed = self.committed.max(seq);
                self.out.push(Action::SaveCommit {
                    committed: self.committed,
                });
                self.out.push(Action::StartView {
                    view: c.view,
                    seq,
                    holders,
                });
                self.set_leader(self.cfg.me);
                self.set_role(Role::Joining);
                self.view_change.settled();
            }
            _ => {}
        }
    }

    pub(super) fn drive_adopt(&mut self, host: &mut impl Host) {
        let Job::Candidate(c) = &mut self.job else {
            return;
        };
        let CandPhase::Adopting {
            adopt,
            floor,
            step: Sync::Probing(search),
        } = &mut c.phase
        else {
            return;
        };
        let (adopt, floor) = (*adopt, *floor);
        match search.next() {
            Probe::Ask(seq) => self.out.push(Action::Send {
                to: adopt.source,
                msg: Message::Peek { seq },
            }),
            Probe::Done(shared) => {
                let cut = sync::adopt_cut(shared, adopt.last_seq, floor);
                self.ack_sent = (0, 0, 0, self.now);
                self.out.push(Action::Truncate { after: cut });
                self.out.push(Action::ResetReader);
                c.deadline = self.now + self.cfg.request_timeout;
                c.phase = CandPhase::Adopting {
                    adopt,
                    floor,
                    step: Sync::Fetching { cut, got: cut },
                };
                if adopt.last_seq > cut {
                    self.out.push(Action::Send {
                        to: adopt.source,
                        msg: Message::Fetch {
                            from: cut + 1,
                            to: adopt.last_seq,
                        },
                    });
                } else {
                    let view = c.view;
                    self.finish_adopt(view, adopt, cut, &[], host);
                }
            }
        }
    }

    /// The stored log holds the adopted one up to `stored`, and `above`
    /// (stored by this step's actions) follows it: cut it to the adopted
    /// end, append the view-start entry, run the second round.
    pub(super) fn finish_adopt(
        &mut self,
        view: u64,
        adopt: Adoption,
        stored: u64,
        above: &[EntryMeta],
        host: &mut impl Host,
    ) {
        let kept = stored.min(adopt.last_seq);
        let end = above
            .last()
            .map(|e| e.seq)
            .unwrap_or(kept)
            .min(adopt.last_seq);
        self.truncate(adopt.last_seq);
        if end != adopt.last_seq {
            self.fail_candidacy();
            return;
        }
        let seq = end + 1;
        let committed = self.committed;
        self.out.push(Action::AppendView {
            view,
            seq,
            last_committed: adopt.committed.max(committed),
        });
        self.log_view = view;
        self.out.push(Action::SaveViews {
            promised: self.promised,
            log_view: view,
        });
        self.out.push(Action::ResetReader);
        let mut new_log: Vec<EntryMeta> = above.to_vec();
        new_log.push(EntryMeta {
            seq,
            view,
            last_committed: 0,
        });
        if !self.check_demoted_server(adopt.committed.min(committed), kept, &new_log, host) {
            self.fail_candidacy();
            return;
        }
        let peers = self.send_to_peers(Message::NewView {
            view,
            leader: self.cfg.me,
            last: seq,
        });
        let Job::Candidate(c) = &mut self.job else {
            return;
        };
        c.phase = CandPhase::NewView {
            seq,
            holders: vec![self.cfg.me],
        };
        c.waiting = peers.into_iter().collect();
        c.deadline = self.now + self.cfg.request_timeout;
        self.maybe_conclude(host);
    }
}
