//! The ring path and the clock: entries read and acked, the commit point
//! learned from them, what each tick does (commit records, heartbeats,
//! jobs that ran out of time).

use super::*;

impl Replica {
    pub(super) fn on_read(&mut self, entries: Vec<EntryMeta>, host: &mut impl Host) {
        let Some(last) = entries.last().copied() else {
            return;
        };
        let rewriting = !matches!(self.job, Job::Idle);
        let in_order = entries[0].seq == host.last().0 + 1;
        let admitted = entries
            .iter()
            .all(|e| fence::admits(self.promised, self.log_view, e.view));
        if rewriting || !in_order || !admitted {
            self.out.push(Action::ResetReader);
            return;
        }
        self.out.push(Action::Persist { last: last.seq });
        self.gap.progress();
        self.ack(last.seq);
        let lc = commit::learn_from_batch(entries.iter().map(|e| e.last_committed), last.seq);
        self.committed = commit::learn(self.committed, lc, self.log_view, self.promised);
    }

    pub(super) fn ack(&mut self, seq: u64) {
        self.ack_sent = (self.leader, self.promised, seq, self.now);
        self.out.push(Action::Ack {
            leader: self.leader,
            view: self.promised,
            seq,
        });
    }

    /// A backup at rest repeats its last ack every [`ACK_REPEAT_MS`] while
    /// it still follows the leader and view it acked to (the log it acked
    /// is unchanged: only a job cuts it, and a cut forgets the ack). A
    /// static backup that acked nothing yet (it restarted with its log)
    /// acks that log when it follows the log's view: only the configured
    /// leader ever leads a view, so the log is a prefix of its log.
    pub(super) fn repeat_ack(&mut self, host: &impl Host) {
        if self.role != Role::Backup || !matches!(self.job, Job::Idle) {
            return;
        }
        let (leader, view, seq, at) = self.ack_sent;
        if leader == 0 {
            let restarted = matches!(self.cfg.election, LeaderChoice::Static { leader } if leader == self.leader)
                && self.leader != self.cfg.me
                && self.log_view == self.promised;
            let last = host.last().0;
            if restarted && last > 0 {
                self.ack(last);
            }
            return;
        }
        let same = leader == self.leader && view == self.promised;
        if same && self.now.saturating_sub(at) >= ACK_REPEAT_MS {
            self.ack(seq);
        }
    }

    /// Cuts the log after `after`, forgetting the last ack (set apart
    /// where `self.job` is borrowed).
    pub(super) fn truncate(&mut self, after: u64) {
        self.ack_sent = (0, 0, 0, self.now);
        self.out.push(Action::Truncate { after });
    }

    pub(super) fn on_tick(&mut self, w: Words, host: &mut impl Host) {
        let last = host.last().0;
        if self.role == Role::Leader {
            let acks = w.acks.clone();
            let c = commit::leader_commit(
                self.cfg.members.iter().copied(),
                self.majority(),
                |id| {
                    acks.iter()
                        .find(|(n, _)| *n == id)
                        .map(|(_, a)| *a)
                        .unwrap_or(0)
                },
                w.served,
            );
            self.out.push(Action::RaiseCommit { seq: c });
            // What the preload raised the word to counts as much (it
            // commits by the same ack array): backups learn it too.
            let c = commit::leader_point(c, w.commit, self.promised);
            let before = self.committed;
            self.committed =
                commit::learn(self.committed, c.min(last), self.log_view, self.promised);
            if self.committed > before {
                self.contact.majority_acked(self.now);
            }
            self.stuck = self.progress.observe(self.committed, last, self.now);
            if self
                .contact
                .probe_due(self.now, self.cfg.session_timeout / 4)
            {
                // Any answer shows the peer reachable; a peer in a newer
                // view refuses the leader's writes instead (stalled, above).
                self.send_to_peers(Message::Peek {
                    seq: self.committed,
                });
            }
            let since = self.now.saturating_sub(self.commit_sent.1);
            if (c != self.commit_sent.0 && since >= COMMIT_RECORD_GAP_MS) || since > ACK_REPEAT_MS {
                for to in self.peers() {
                    self.out.push(Action::CommitRecord {
                        to,
                        view: self.promised,
                        seq: c,
                    });
                }
                self.commit_sent = (c, self.now);
            }
            self.observe_view(0, w.fenced_by);
            if let Some((node, view)) =
                self.view_change
                    .stalled(self.promised, self.now, self.cfg.session_timeout)
            {
                let who = if node == 0 {
                    "a peer".to_string()
                } else {
                    format!("node {node}")
                };
                self.note(format!(
                    "{who} has been in view {view} for {} ms, which did not replace view {} led here: \
                     starting a view above it; no longer accepting writes",
                    self.cfg.session_timeout, self.promised
                ));
                self.demote(host);
            }
        }
        if self.role != Role::Leader {
            self.progress.reset();
            self.contact.reset();
            self.stuck = 0;
        }
        self.repeat_ack(host);
        let (rv, rs) = w.commit_record;
        if let Some(seq) = commit::learn_record(rv, rs, self.log_view, last) {
            self.committed = commit::learn(self.committed, seq, self.log_view, self.promised);
        }
        self.expire_job(host);
        self.maybe_catch_up(false, w.tail_ahead, host);
        if let LeaderChoice::Static { leader } = self.cfg.election {
            if leader == self.cfg.me
                && !viewchange::leading(self.cfg.me, self.leader, self.promised, self.log_view)
                && self.stale.is_none()
                && matches!(self.job, Job::Idle)
                && self.now >= self.next_attempt
            {
                let view = self.view_floor() + 1;
                self.start_view(view, host);
            }
        }
    }

    pub(super) fn expire_job(&mut self, host: &mut impl Host) {
        let deadline = match &self.job {
            Job::Idle => return,
            Job::CatchUp { deadline, .. } => *deadline,
            Job::Follow(f) => f.deadline,
            Job::Candidate(c) => c.deadline,
        };
        if self.now < deadline {
            return;
        }
        match std::mem::replace(&mut self.job, Job::Idle) {
            Job::Candidate(c) => match c.phase {
                CandPhase::Preparing(_) | CandPhase::NewView { .. } => {
                    // A round ends when every peer answered or timed out.
                    self.job = Job::Candidate(c);
                    self.conclude_round(host);
                }
                _ => self.fail_candidacy(),
            },
            Job::CatchUp { .. } => {}
            Job::Follow(_) => {}
            Job::Idle => {}
        }
    }
}
