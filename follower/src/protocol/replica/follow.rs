//! Following a view: making this node's log the leader's (probing the
//! shared prefix, fetching the rest in chunks) and checking a deposed
//! leader's server against the log it keeps.

use super::*;

impl Replica {
    /// Phase 2 here (and a late join): take `leader`'s log, follow it.
    pub(super) fn follow(
        &mut self,
        view: u64,
        leader: u64,
        want: Option<u64>,
        host: &mut impl Host,
    ) {
        if let Err(e) = fence::check_requested_view(self.cfg.me, self.promised, self.log_view, view)
        {
            if want.is_some() {
                self.out.push(Action::Send {
                    to: leader,
                    msg: refusal(e),
                });
            }
            return;
        }
        if !matches!(&self.job, Job::Candidate(c) if c.view > view) {
            self.job = Job::Idle;
        }
        self.raise_view(view);
        self.step_down(host);
        let (last, _) = host.last();
        let floor = sync::sync_point(last, self.committed);
        self.job = Job::Follow(Follow {
            view,
            leader,
            want,
            step: Sync::Probing(PrefixSearch::new(last, floor)),
            deadline: self.now + self.cfg.request_timeout,
        });
        self.drive_follow(host);
    }

    pub(super) fn drive_follow(&mut self, _host: &mut impl Host) {
        let Job::Follow(f) = &mut self.job else {
            return;
        };
        let Sync::Probing(search) = &f.step else {
            return;
        };
        match search.next() {
            Probe::Ask(seq) => {
                let to = f.leader;
                self.out.push(Action::Send {
                    to,
                    msg: Message::Peek { seq },
                });
            }
            Probe::Done(cut) => {
                f.step = Sync::Fetching { cut, got: cut };
                f.deadline = self.now + self.cfg.request_timeout;
                let to = f.leader;
                self.truncate(cut);
                self.out.push(Action::ResetReader);
                self.out.push(Action::Send {
                    to,
                    msg: Message::Fetch {
                        from: cut + 1,
                        to: 0,
                    },
                });
            }
        }
    }

    pub(super) fn fail_follow(&mut self) {
        if let Job::Follow(f) = std::mem::replace(&mut self.job, Job::Idle) {
            if f.want.is_some() {
                self.out.push(Action::Send {
                    to: f.leader,
                    msg: Message::Refused,
                });
            }
        }
    }

    pub(super) fn on_peek_answer(
        &mut self,
        from: u64,
        seq: u64,
        view: Option<u64>,
        host: &mut impl Host,
    ) {
        let mine = host.view_at(seq);
        let same = mine.is_some() && view == mine;
        match &mut self.job {
            Job::Follow(f) if f.leader == from => {
                if let Sync::Probing(s) = &mut f.step {
                    if s.next() == Probe::Ask(seq) {
                        s.answer(same);
                        self.drive_follow(host);
                    }
                }
            }
            Job::Candidate(c) => {
                if let CandPhase::Adopting {
                    adopt,
                    step: Sync::Probing(s),
                    ..
                } = &mut c.phase
                {
                    if adopt.source == from && s.next() == Probe::Ask(seq) {
                        s.answer(same);
                        self.drive_adopt(host);
                    }
                }
            }
            _ => {}
        }
    }

    /// A chunk of a fetch's answer from `from` (`more`: others follow).
    /// Each chunk that continues the log is stored at once, so memory
    /// holds one chunk, never the whole answer; what a broken answer
    /// left stored is a longer prefix of the source's log, which a later
    /// sync keeps (its prefix search finds it) and fetches on from.
    pub(super) fn on_entries(
        &mut self,
        from: u64,
        es: Vec<EntryMeta>,
        more: bool,
        host: &mut impl Host,
    ) {
        match std::mem::replace(&mut self.job, Job::Idle) {
            Job::CatchUp {
                plan,
                at,
                from: first,
                next,
                deadline,
            } => {
                let asked = plan.get(at).map(|p| p.peer) == Some(from);
                // Only entries the ring reader would store: of the log this
                // node follows. A failed candidate's log ends in its own
                // view's entry while `leader` is still the one it followed
                // before, whose older view's entries must not go on it.
                let continues = consecutive(&es, next)
                    && es
                        .iter()
                        .all(|e| fence::admits(self.promised, self.log_view, e.view));
                let mut next = next;
                if asked && continues {
                    if let Some(e) = es.last() {
                        self.store_chunk(e.seq);
                        self.ack(e.seq);
                        next = e.seq + 1;
                    }
                }
                self.job = Job::CatchUp {
                    plan,
                    at,
                    from: first,
                    next,
                    deadline: if asked {
                        self.now + self.cfg.request_timeout
                    } else {
                        deadline
                    },
                };
                if !asked || (continues && more) {
                    return;
                }
                if continues && next > first {
                    self.job = Job::Idle;
                } else {
                    // This peer had nothing, or sent what does not
                    // continue the log: the next one may do better.
                    self.next_catch_up_peer();
                }
            }
            Job::Follow(mut f) => {
                let Sync::Fetching { cut, got } = f.step else {
                    self.job = Job::Follow(f);
                    return;
                };
                if f.leader != from {
                    self.job = Job::Follow(f);
                    return;
                }
                if !consecutive(&es, got + 1) {
                    self.job = Job::Follow(f);
                    self.fail_follow();
                    return;
                }
                if let Some(e) = es.last() {
                    self.store_chunk(e.seq);
                    f.step = Sync::Fetching { cut, got: e.seq };
                }
                if more {
                    f.deadline = self.now + self.cfg.request_timeout;
                    self.job = Job::Follow(f);
                    return;
                }
                self.finish_follow(f, cut, got, es, host);
            }
            Job::Candidate(mut c) => {
                let CandPhase::Adopting {
                    adopt,
                    floor,
                    step: Sync::Fetching { cut, got },
                } = c.phase
                else {
                    self.job = Job::Candidate(c);
                    return;
                };
                if adopt.source != from {
                    self.job = Job::Candidate(c);
                    return;
                }
                let es: Vec<EntryMeta> =
                    es.into_iter().filter(|e| e.seq <= adopt.last_seq).collect();
                if !consecutive(&es, got + 1) {
                    // Its log starts past what this one needs (compacted):
                    // the next candidacy fetches from an equal log
                    // elsewhere, or it would ask here in vain for ever.
                    if es.first().is_some_and(|e| e.seq > got + 1) {
                        self.adopt_refused = Some(from);
                    }
                    self.fail_candidacy();
                    return;
                }
                let stored = got;
                if let Some(e) = es.last() {
                    self.store_chunk(e.seq);
                    c.phase = CandPhase::Adopting {
                        adopt,
                        floor,
                        step: Sync::Fetching { cut, got: e.seq },
                    };
                }
                c.deadline = self.now + self.cfg.request_timeout;
                let view = c.view;
                self.job = Job::Candidate(c);
                if !more {
                    self.finish_adopt(view, adopt, stored, &es, host);
                }
            }
            Job::Idle => {}
        }
    }

    /// Stores a fetched chunk ending at `last`; the ring reader starts
    /// again after it.
    pub(super) fn store_chunk(&mut self, last: u64) {
        self.out.push(Action::Persist { last });
        self.out.push(Action::ResetReader);
    }

    /// The last chunk of a follow's fetch: the log was cut after `cut`,
    /// earlier chunks stored it up to `stored`, `es` (stored by this
    /// step's actions) follow.
    pub(super) fn finish_follow(
        &mut self,
        f: Follow,
        cut: u64,
        stored: u64,
        es: Vec<EntryMeta>,
        host: &mut impl Host,
    ) {
        let end = es.last().map(|e| e.seq).unwrap_or(stored);
        let fail = |r: &mut Replica| {
            if f.want.is_some() {
                r.out.push(Action::Send {
                    to: f.leader,
                    msg: Message::Refused,
                });
            }
        };
        if sync::check_synced(f.leader, end, f.want).is_err() {
            fail(self);
            return;
        }
        // From the commit point, not the cut: a sync broken mid-fetch left
        // the new log's entries above an earlier cut, which the next
        // sync's prefix search counts as shared, while the server
        // consumed the old log's there.
        let from = self.committed.min(cut);
        if !self.check_demoted_server(from, stored, &es, host) {
            fail(self);
            return;
        }
        self.log_view = f.view;
        self.out.push(Action::SaveViews {
            promised: self.promised,
            log_view: self.log_view,
        });
        self.set_leader(f.leader);
        self.set_role(Role::Backup);
        self.view_change.settled();
        self.out.push(Action::ResetReader);
        self.ack(end);
        if f.want.is_some() {
            self.out.push(Action::Send {
                to: f.leader,
                msg: Message::Synced { last: end },
            });
        }
    }

    /// The demoted leader's server against the new log: `from` is where
    /// the server's check starts, `cut` where the stored log ends (as the
    /// host reads it) and `above` the entries after it. False when the
    /// node went stale.
    pub(super) fn check_demoted_server(
        &mut self,
        from: u64,
        cut: u64,
        above: &[EntryMeta],
        host: &mut impl Host,
    ) -> bool {
        let Some((led_view, served)) = self.view_change.take_led() else {
            return true;
        };
        let start = from.min(served) + 1;
        let mut log: Vec<(u64, u64)> = (start..=cut)
            .filter_map(|s| host.view_at(s).map(|v| (s, v)))
            .collect();
        log.extend(
            above
                .iter()
                .filter(|e| e.seq >= start)
                .map(|e| (e.seq, e.view)),
        );
        match stale::demoted_server_fate(led_view, served, from, log) {
            ServerFate::InLine => {
                self.applied = self.applied.max(served);
                true
            }
            ServerFate::Missed(seq) => {
                self.go_stale(format!(
                    "its server consumed view {led_view} up to seq {served}, but the new view kept seq {seq} of that view, which the server never saw"
                ));
                false
            }
            ServerFate::Dropped(seq) => {
                self.go_stale(format!(
                    "its server executed seq {seq} of view {led_view}, which the new view dropped"
                ));
                false
            }
        }
    }

    pub(super) fn view_floor(&self) -> u64 {
        self.view_change
            .view_floor(self.promised.max(self.log_view))
    }
}
