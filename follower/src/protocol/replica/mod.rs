//! [`Replica`]: one node's protocol state, stepped by [`Event`]s into
//! [`Action`]s. The rules it applies are the ones in the sibling modules;
//! the runtime ([`crate::runtime`]) and the simulated cluster feed it
//! events and carry out its actions, and decide nothing themselves.

use std::collections::BTreeSet;

use super::catchup::{self, FetchPlan, GapWatch, Stall};
use super::commit;
use super::fence::{self, ViewRefusal};
use super::session::{self, CommitProgress, Contact};
use super::stale::{self, ServerFate};
use super::sync::{self, PrefixSearch, Probe};
use super::viewchange::{self, Adoption, Candidate, Promise, ViewChangeState, Views};
use super::{Action, EntryMeta, Event, Host, Message, Millis, Role, Session, Words};

/// How often a backup at rest repeats its last ack (see `Replica::ack_sent`):
/// as often as a leader repeats its commit record.
pub const ACK_REPEAT_MS: Millis = 100;

/// A leader sends a new commit point at most this often. Under load every
/// entry it appends carries the commit point to the backups anyway (the
/// header's `last_committed`); a record per turn woke each backup's
/// follower a second time per turn (2 cores, Redis SET: about 5% of the
/// cluster's CPU per request). An idle leader's last point still goes out
/// within a heartbeat.
pub const COMMIT_RECORD_GAP_MS: Millis = 1;

/// How the leader is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaderChoice {
    /// The configured node leads; it alone starts views.
    Static {
        /// The configured leader.
        leader: u64,
    },
    /// ZooKeeper: the lowest znode is the candidate.
    Zookeeper,
}

/// A replica's fixed settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaConfig {
    /// This node.
    pub me: u64,
    /// Every member's id, this node included.
    pub members: Vec<u64>,
    /// How the leader is chosen.
    pub election: LeaderChoice,
    /// ZooKeeper session timeout (also the patience with a stray view).
    pub session_timeout: Millis,
    /// How long a control request may go unanswered.
    pub request_timeout: Millis,
    /// Pause after a failed view change attempt.
    pub retry: Millis,
}

/// What a replica restarts from (its durable meta keys).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// The promised view.
    pub view: u64,
    /// The log view (0: never saved).
    pub log_view: u64,
    /// The saved commit point (lazily saved: may be behind).
    pub committed: u64,
}

/// A view change this node runs as candidate.
#[derive(Clone, Debug)]
struct Candidacy {
    view: u64,
    phase: CandPhase,
    waiting: BTreeSet<u64>,
    outdated: Vec<u64>,
    deadline: Millis,
}

#[derive(Clone, Debug)]
enum CandPhase {
    /// Waiting for ZooKeeper's view.
    Claiming,
    /// Collecting promises.
    Preparing(Candidate),
    /// Making the own log the adopted one.
    Adopting {
        adopt: Adoption,
        floor: u64,
        step: Sync,
    },
    /// Collecting `Synced` answers.
    NewView { seq: u64, holders: Vec<u64> },
}

/// Where a log sync stands.
#[derive(Clone, Debug)]
enum Sync {
    Probing(PrefixSearch),
    /// The log was cut after `cut`; the source's entries after it come in
    /// chunks, each stored as it arrives: the log now ends at `got`.
    Fetching {
        cut: u64,
        got: u64,
    },
}

/// This node syncing with a new leader (a `NewView`, or a late join).
#[derive(Clone, Debug)]
struct Follow {
    view: u64,
    leader: u64,
    want: Option<u64>,
    step: Sync,
    deadline: Millis,
}

#[derive(Clone, Debug)]
enum Job {
    Idle,
    CatchUp {
        plan: Vec<FetchPlan>,
        at: usize,
        /// The first seq this catch-up asked for.
        from: u64,
        /// The first seq it has not stored yet (chunks move it on).
        next: u64,
        deadline: Millis,
    },
    Follow(Follow),
    Candidate(Candidacy),
}

/// One node's protocol state.
#[derive(Clone, Debug)]
pub struct Replica {
    cfg: ReplicaConfig,
    now: Millis,
    promised: u64,
    log_view: u64,
    committed: u64,
    leader: u64,
    role: Role,
    applied: u64,
    view_change: ViewChangeState,
    stale: Option<String>,
    gap: GapWatch,
    job: Job,
    next_attempt: Millis,
    commit_sent: (u64, Millis),
    /// The last ack sent (leader, view, seq) and when: a backup repeats it
    /// now and then ([`ACK_REPEAT_MS`]). A lost ack (a broken connection)
    /// is otherwise repaired only by the next entry's, and a leader whose
    /// writer waits for that ack to reuse ring space appends none.
    ack_sent: (u64, u64, u64, Millis),
    /// As leader: how long appended entries have waited for a majority.
    progress: CommitProgress,
    stuck: Millis,
    /// As leader without a ZooKeeper session: which peers still answer.
    contact: Contact,
    caught_up_at_start: bool,
    out: Vec<Action>,
}

impl Replica {
    /// A replica starting from `restored` (the runtime's `Node::start`);
    /// the actions set up its region.
    pub fn new(cfg: ReplicaConfig, restored: Restored, now: Millis) -> (Replica, Vec<Action>) {
        let view = restored.view.max(1);
        let stored_log_view = restored.log_view;
        let (leader, log_view, role) = match cfg.election {
            LeaderChoice::Zookeeper => (0, stored_log_view, Role::Joining),
            LeaderChoice::Static { leader } => {
                let log_view = if stored_log_view == 0 {
                    view
                } else {
                    stored_log_view
                };
                if leader == cfg.me {
                    (0, log_view, Role::Joining)
                } else {
                    (leader, log_view, Role::Backup)
                }
            }
        };
        let mut r = Replica {
            cfg,
            now,
            promised: view,
            log_view,
            committed: restored.committed,
            leader,
            role,
            applied: 0,
            view_change: ViewChangeState::default(),
            stale: None,
            gap: GapWatch::default(),
            job: Job::Idle,
            next_attempt: now,
            commit_sent: (0, now),
            ack_sent: (0, 0, 0, now),
            progress: CommitProgress::default(),
            stuck: 0,
            contact: Contact::default(),
            caught_up_at_start: false,
            out: Vec::new(),
        };
        r.out.push(Action::SaveViews {
            promised: view,
            log_view,
        });
        r.out.push(Action::SetView { view });
        r.out.push(Action::SetLeader { leader });
        r.out.push(Action::SetRole { role });
        let out = std::mem::take(&mut r.out);
        (r, out)
    }

    /// The view this node promised (its region's view word).
    pub fn promised(&self) -> u64 {
        self.promised
    }
    /// The view whose leader the log follows.
    pub fn log_view(&self) -> u64 {
        self.log_view
    }
    /// The highest seq known committed.
    pub fn committed(&self) -> u64 {
        self.committed
    }
    /// The leader it follows (0: none).
    pub fn leader(&self) -> u64 {
        self.leader
    }
    /// Its role.
    pub fn role(&self) -> Role {
        self.role
    }
    /// How far its server applied (or consumed, as leader).
    pub fn applied(&self) -> u64 {
        self.applied
    }
    /// As leader: how long its oldest uncommitted entry has waited without
    /// the commit point moving (0: nothing waits, or not leading).
    pub fn commit_wait(&self) -> Millis {
        self.stuck
    }
    /// Why it is stale, if it is.
    pub fn stale(&self) -> Option<&str> {
        self.stale.as_deref()
    }
    /// Whether it leads a started view and its server serves.
    pub fn serving(&self) -> bool {
        self.role == Role::Leader
            && viewchange::leading(self.cfg.me, self.leader, self.promised, self.log_view)
    }
    /// The settings.
    pub fn config(&self) -> &ReplicaConfig {
        &self.cfg
    }

    fn majority(&self) -> usize {
        viewchange::majority(self.cfg.members.len())
    }

    fn peers(&self) -> Vec<u64> {
        let me = self.cfg.me;
        self.cfg
            .members
            .iter()
            .copied()
            .filter(|&i| i != me)
            .collect()
    }

    /// Handles one event at `now`; what to do, in order.
    pub fn step(&mut self, now: Millis, event: Event, host: &mut impl Host) -> Vec<Action> {
        self.now = self.now.max(now);
        #[cfg(debug_assertions)]
        let before = self.marks();
        match event {
            Event::Read(entries) => self.on_read(entries, host),
            Event::ReadFailed => self.maybe_catch_up(true, false, host),
            Event::Tick(words) => self.on_tick(words, host),
            Event::Message { from, msg } => self.on_message(from, msg, host),
            Event::Unanswered { to } => self.on_unanswered(to, host),
            Event::WriteRefused { peer, theirs } => self.observe_view(peer, theirs),
            Event::Election {
                session,
                candidate,
                announced,
                followed_serving,
            } => self.on_election(session, candidate, announced, followed_serving, host),
            Event::LeaderStatus { view, serving } => self.on_leader_status(view, serving, host),
            Event::ViewClaimed { view } => {
                if matches!(&self.job, Job::Candidate(c) if matches!(c.phase, CandPhase::Claiming))
                {
                    self.job = Job::Idle;
                    self.start_view(view, host);
                }
            }
            Event::Applied { seq } => self.on_applied(seq),
            Event::Installed { seq } => self.on_installed(seq),
            Event::ServerExited => {
                if stale::server_exited(1, false, self.stale.is_some()) {
                    self.go_stale("its server exited".into());
                    self.demote(host);
                }
            }
        }
        self.maybe_apply(host);
        #[cfg(debug_assertions)]
        self.check_invariants(before);
        std::mem::take(&mut self.out)
    }

    /// The marks that only ever move up: promised view, log view,
    /// commit point, applied point.
    #[cfg(debug_assertions)]
    fn marks(&self) -> [u64; 4] {
        [self.promised, self.log_view, self.committed, self.applied]
    }

    /// What no step may break, checked in debug builds (the simulations
    /// and the integration tests run them) where it would break: the
    /// promised view, the log's view, the commit point and the applied
    /// point only move up; the log's view is never past the promised one;
    /// a leader is the leader it names, of the view it promised.
    #[cfg(debug_assertions)]
    fn check_invariants(&self, before: [u64; 4]) {
        let names = ["promised view", "log view", "commit point", "applied point"];
        for ((name, was), is) in names.iter().zip(before).zip(self.marks()) {
            debug_assert!(
                is >= was,
                "node {}: the {name} went down from {was} to {is}",
                self.cfg.me
            );
        }
        debug_assert!(
            self.log_view <= self.promised,
            "node {}: log view {} past the promised view {}",
            self.cfg.me,
            self.log_view,
            self.promised
        );
        debug_assert!(
            self.role != Role::Leader || self.leader == self.cfg.me,
            "node {}: leads but names node {} leader",
            self.cfg.me,
            self.leader
        );
        debug_assert!(
            self.role != Role::Leader || self.log_view == self.promised,
            "node {}: leads with a log of view {} while it promised view {}",
            self.cfg.me,
            self.log_view,
            self.promised
        );
    }

    fn views(&self) -> Views {
        Views {
            me: self.cfg.me,
            promised: self.promised,
            log_view: self.log_view,
            leader: self.leader,
            changing: self.view_change.changing(self.now),
        }
    }

    fn on_read(&mut self, entries: Vec<EntryMeta>, host: &mut impl Host) {
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

    fn ack(&mut self, seq: u64) {
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
    fn repeat_ack(&mut self, host: &impl Host) {
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
    fn truncate(&mut self, after: u64) {
        self.ack_sent = (0, 0, 0, self.now);
        self.out.push(Action::Truncate { after });
    }

    fn on_tick(&mut self, w: Words, host: &mut impl Host) {
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
                for to in self.peers() {
                    self.out.push(Action::Send {
                        to,
                        msg: Message::Peek {
                            seq: self.committed,
                        },
                    });
                }
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

    fn expire_job(&mut self, host: &mut impl Host) {
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

    fn maybe_catch_up(&mut self, read_failed: bool, tail_ahead: bool, host: &mut impl Host) {
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

    fn start_catch_up(&mut self, host: &mut impl Host) {
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

    fn next_catch_up_peer(&mut self) {
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

    fn on_unanswered(&mut self, to: u64, host: &mut impl Host) {
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
                CandPhase::Adopting { adopt, .. } if adopt.source == to => self.fail_candidacy(),
                _ => {}
            },
            _ => {}
        }
    }

    fn on_message(&mut self, from: u64, msg: Message, host: &mut impl Host) {
        match msg {
            Message::Prepare { view, candidate } => {
                let answer = match self.promise(view, host) {
                    Ok(p) => Message::Promise(p),
                    Err(e) => refusal(e),
                };
                self.out.push(Action::Send {
                    to: candidate,
                    msg: answer,
                });
            }
            Message::NewView { view, leader, last } => self.follow(view, leader, Some(last), host),
            // Served by the caller from the stored log.
            Message::Peek { .. } | Message::Fetch { .. } => {}
            Message::PeekAnswer { seq, view } => {
                self.contact.heard(from, self.now);
                self.on_peek_answer(from, seq, view, host)
            }
            Message::Entries { entries, more } => self.on_entries(from, entries, more, host),
            Message::Promise(p) => {
                if let Job::Candidate(c) = &mut self.job {
                    if let CandPhase::Preparing(cand) = &mut c.phase {
                        if p.node == from && c.waiting.remove(&from) {
                            cand.promise(p);
                        }
                    }
                }
                self.maybe_conclude(host);
            }
            Message::Synced { last } => {
                if let Job::Candidate(c) = &mut self.job {
                    if let CandPhase::NewView { seq, holders } = &mut c.phase {
                        if c.waiting.remove(&from) && last >= *seq {
                            holders.push(from);
                        }
                    }
                }
                self.maybe_conclude(host);
            }
            Message::Outdated { promised } => {
                self.observe_view(from, promised);
                if let Job::Candidate(c) = &mut self.job {
                    if c.waiting.remove(&from) {
                        c.outdated.push(promised);
                    }
                }
                self.maybe_conclude(host);
            }
            Message::Refused => {
                if let Job::Candidate(c) = &mut self.job {
                    c.waiting.remove(&from);
                }
                self.maybe_conclude(host);
            }
        }
    }

    fn maybe_conclude(&mut self, host: &mut impl Host) {
        if let Job::Candidate(c) = &self.job {
            let round = matches!(c.phase, CandPhase::Preparing(_) | CandPhase::NewView { .. });
            if round && c.waiting.is_empty() {
                self.conclude_round(host);
            }
        }
    }

    fn observe_view(&mut self, node: u64, view: u64) {
        self.view_change
            .observe(node, view, self.promised, self.now);
    }

    /// Phase 1 here: fence every view below `view`, report the log.
    fn promise(&mut self, view: u64, host: &mut impl Host) -> Result<Promise, ViewRefusal> {
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

    fn raise_view(&mut self, view: u64) {
        self.promised = self.promised.max(view);
        self.out.push(Action::SaveViews {
            promised: self.promised,
            log_view: self.log_view,
        });
        self.out.push(Action::SetView {
            view: self.promised,
        });
    }

    fn step_down(&mut self, host: &mut impl Host) {
        if self.role == Role::Leader {
            if let Some(served) = self
                .view_change
                .demoted(self.log_view, || host.fence_handover())
            {
                self.applied = self.applied.max(served);
            }
            self.set_role(Role::Joining);
        }
        if self.leader == self.cfg.me {
            self.set_leader(0);
        }
    }

    fn demote(&mut self, host: &mut impl Host) {
        if self.role == Role::Leader {
            self.step_down(host);
        }
    }

    fn set_role(&mut self, role: Role) {
        self.role = role;
        self.out.push(Action::SetRole { role });
    }

    fn set_leader(&mut self, leader: u64) {
        self.leader = leader;
        self.out.push(Action::SetLeader { leader });
    }

    fn go_stale(&mut self, why: String) {
        if self.stale.is_none() {
            self.out.push(Action::GoStale { why: why.clone() });
            self.stale = Some(why);
        }
    }

    /// Phase 2 here (and a late join): take `leader`'s log, follow it.
    fn follow(&mut self, view: u64, leader: u64, want: Option<u64>, host: &mut impl Host) {
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

    fn drive_follow(&mut self, _host: &mut impl Host) {
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

    fn fail_follow(&mut self) {
        if let Job::Follow(f) = std::mem::replace(&mut self.job, Job::Idle) {
            if f.want.is_some() {
                self.out.push(Action::Send {
                    to: f.leader,
                    msg: Message::Refused,
                });
            }
        }
    }

    fn note(&mut self, what: String) {
        self.out.push(Action::Note { what });
    }

    fn fail_candidacy(&mut self) {
        self.job = Job::Idle;
        self.next_attempt = self.now + self.cfg.retry;
    }

    fn on_peek_answer(&mut self, from: u64, seq: u64, view: Option<u64>, host: &mut impl Host) {
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
    fn on_entries(&mut self, from: u64, es: Vec<EntryMeta>, more: bool, host: &mut impl Host) {
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
    fn store_chunk(&mut self, last: u64) {
        self.out.push(Action::Persist { last });
        self.out.push(Action::ResetReader);
    }

    /// The last chunk of a follow's fetch: the log was cut after `cut`,
    /// earlier chunks stored it up to `stored`, `es` (stored by this
    /// step's actions) follow.
    fn finish_follow(
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
    fn check_demoted_server(
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

    fn view_floor(&self) -> u64 {
        self.view_change
            .view_floor(self.promised.max(self.log_view))
    }

    fn on_election(
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

    fn on_leader_status(&mut self, view: u64, serving: bool, host: &mut impl Host) {
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
    fn start_view(&mut self, view: u64, host: &mut impl Host) {
        let own = match self.promise(view, host) {
            Ok(p) => p,
            Err(_) => {
                self.fail_candidacy();
                return;
            }
        };
        self.note(format!("candidate for view {view}"));
        let mut cand = Candidate::new(view, self.cfg.me, &self.cfg.members);
        cand.promise(own);
        let peers = self.peers();
        for &to in &peers {
            self.out.push(Action::Send {
                to,
                msg: Message::Prepare {
                    view,
                    candidate: self.cfg.me,
                },
            });
        }
        self.job = Job::Candidate(Candidacy {
            view,
            phase: CandPhase::Preparing(cand),
            waiting: peers.into_iter().collect(),
            outdated: Vec::new(),
            deadline: self.now + self.cfg.request_timeout,
        });
        self.maybe_conclude(host);
    }

    fn conclude_round(&mut self, host: &mut impl Host) {
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

    fn drive_adopt(&mut self, host: &mut impl Host) {
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
    fn finish_adopt(
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
        let peers = self.peers();
        for &to in &peers {
            self.out.push(Action::Send {
                to,
                msg: Message::NewView {
                    view,
                    leader: self.cfg.me,
                    last: seq,
                },
            });
        }
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

    fn on_applied(&mut self, seq: u64) {
        self.applied = self.applied.max(seq);
    }

    fn on_installed(&mut self, seq: u64) {
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

    fn maybe_apply(&mut self, host: &mut impl Host) {
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

fn consecutive(es: &[EntryMeta], first: u64) -> bool {
    es.iter()
        .enumerate()
        .all(|(i, e)| e.seq == first + i as u64)
}

fn refusal(e: ViewRefusal) -> Message {
    match e {
        ViewRefusal::Outdated { promised, .. } => Message::Outdated { promised },
        ViewRefusal::Implausible { .. } => Message::Refused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored log in memory (the views of seq 1, 2, …) that carries out
    /// the actions that change it, and the entries read but not stored.
    #[derive(Default)]
    struct Log {
        views: Vec<u64>,
        read: Vec<EntryMeta>,
        /// What the hand-over fence reports the server was handed.
        served: u64,
    }

    impl Host for Log {
        fn last(&self) -> (u64, u64) {
            (
                self.views.len() as u64,
                self.views.last().copied().unwrap_or(0),
            )
        }
        fn view_at(&self, seq: u64) -> Option<u64> {
            self.views.get((seq as usize).wrapping_sub(1)).copied()
        }
        fn fence_handover(&mut self) -> u64 {
            self.served
        }
    }

    impl Log {
        fn step(&mut self, r: &mut Replica, now: Millis, e: Event) -> Vec<Action> {
            match &e {
                Event::Read(es)
                | Event::Message {
                    msg: Message::Entries { entries: es, .. },
                    ..
                } => self.read = es.clone(),
                _ => {}
            }
            let actions = r.step(now, e, self);
            for a in &actions {
                match *a {
                    Action::Persist { last } => {
                        for e in std::mem::take(&mut self.read) {
                            if e.seq <= last && e.seq == self.views.len() as u64 + 1 {
                                self.views.push(e.view);
                            }
                        }
                    }
                    Action::Truncate { after } => self.views.truncate(after as usize),
                    Action::AppendView { view, .. } => self.views.push(view),
                    _ => {}
                }
            }
            actions
        }
    }

    fn config(election: LeaderChoice) -> ReplicaConfig {
        ReplicaConfig {
            me: 1,
            members: vec![1, 2, 3],
            election,
            session_timeout: 1000,
            request_timeout: 500,
            retry: 200,
        }
    }

    fn promise(node: u64) -> Message {
        Message::Promise(Promise {
            node,
            log_view: 0,
            last_seq: 0,
            committed: 0,
            led: None,
        })
    }

    #[test]
    fn a_view_claim_zookeeper_does_not_answer_is_tried_again_after_the_pause() {
        let (mut r, _) = Replica::new(config(LeaderChoice::Zookeeper), Restored::default(), 0);
        let mut log = Log::default();
        let candidate = Event::Election {
            session: Session::Connected,
            candidate: true,
            announced: None,
            followed_serving: false,
        };
        let claims = |a: Vec<Action>| {
            a.iter()
                .filter(|a| matches!(a, Action::ClaimView { .. }))
                .count()
        };
        assert_eq!(claims(log.step(&mut r, 0, candidate.clone())), 1);
        assert_eq!(
            claims(log.step(&mut r, 1, candidate.clone())),
            0,
            "one at a time"
        );
        log.step(&mut r, 2, Event::Unanswered { to: 0 });
        assert_eq!(
            claims(log.step(&mut r, 3, candidate.clone())),
            0,
            "a pause first"
        );
        assert_eq!(claims(log.step(&mut r, 202, candidate)), 1);
    }

    /// Node 1, the configured leader, starts view 2 with both peers (its
    /// start entry is seq 1) and serves.
    fn leading_view_2() -> (Replica, Log) {
        let (mut r, _) = Replica::new(
            config(LeaderChoice::Static { leader: 1 }),
            Restored::default(),
            0,
        );
        let mut log = Log::default();
        log.step(&mut r, 0, Event::Tick(Words::default()));
        peers_join(&mut log, &mut r, 1);
        (r, log)
    }

    /// The leader of view 2 (see `leading_view_2`) whose follower read
    /// the entries its preload appended, 2..=`last`.
    fn leader_read_up_to(last: u64) -> (Replica, Log) {
        let (mut r, mut log) = leading_view_2();
        let es = (2..=last)
            .map(|seq| EntryMeta {
                seq,
                view: 2,
                last_committed: 1,
            })
            .collect();
        log.step(&mut r, 4, Event::Read(es));
        (r, log)
    }

    #[test]
    fn a_commit_word_the_leaders_preload_raised_goes_to_the_backups_a_newer_views_does_not() {
        // Its preload appends 2..=5 and raises the commit word to 4 (an
        // output waited); the ack array says 3, the server was handed 5.
        let (mut r, mut log) = leader_read_up_to(5);
        let words = Words {
            acks: vec![(1, 5), (2, 3), (3, 1)],
            served: 5,
            commit: (0, 4),
            ..Words::default()
        };
        let actions = log.step(&mut r, 5, Event::Tick(words));
        assert!(actions.contains(&Action::RaiseCommit { seq: 3 }));
        for to in [2, 3] {
            assert!(
                actions.contains(&Action::CommitRecord {
                    to,
                    view: 2,
                    seq: 4
                }),
                "{actions:?}"
            );
        }
        assert_eq!(r.committed(), 4);
        // A newer view's leader wrote its commit record into this region
        // (this one has not noticed it was deposed): not this log's point.
        let words = Words {
            acks: vec![(1, 5), (2, 3), (3, 1)],
            served: 5,
            commit: (3, 40),
            commit_record: (3, 40),
            ..Words::default()
        };
        log.step(&mut r, 6, Event::Tick(words));
        assert_eq!(r.committed(), 4);
    }

    #[test]
    fn a_leader_sends_a_new_commit_point_at_most_once_per_gap_and_the_last_one_at_the_next_tick() {
        let (mut r, mut log) = leader_read_up_to(9);
        let raised = |commit: u64| Words {
            acks: vec![(1, 9), (2, 1), (3, 1)],
            served: 9,
            commit: (0, commit),
            ..Words::default()
        };
        let records = |actions: &[Action]| {
            actions
                .iter()
                .filter_map(|a| match a {
                    Action::CommitRecord { to, seq, .. } => Some((*to, *seq)),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            records(&log.step(&mut r, 10, Event::Tick(raised(4)))),
            [(2, 4), (3, 4)]
        );
        // The point moves twice more within the same millisecond: no record
        // (the entries appended meanwhile carry it).
        assert_eq!(records(&log.step(&mut r, 10, Event::Tick(raised(6)))), []);
        assert_eq!(records(&log.step(&mut r, 10, Event::Tick(raised(7)))), []);
        // The next tick a gap later sends the newest point.
        let at = 10 + COMMIT_RECORD_GAP_MS;
        assert_eq!(
            records(&log.step(&mut r, at, Event::Tick(raised(7)))),
            [(2, 7), (3, 7)]
        );
        // Unchanged: repeated only after ACK_REPEAT_MS.
        assert_eq!(
            records(&log.step(&mut r, at + 50, Event::Tick(raised(7)))),
            []
        );
        let later = at + ACK_REPEAT_MS + 1;
        assert_eq!(
            records(&log.step(&mut r, later, Event::Tick(raised(7)))),
            [(2, 7), (3, 7)]
        );
    }

    /// A replica that leads view `view` (ZooKeeper election) with its
    /// `VIEW` entry (seq 1) stored by both peers and applied.
    fn zookeeper_leader(log: &mut Log) -> Replica {
        let (mut r, _) = Replica::new(config(LeaderChoice::Zookeeper), Restored::default(), 0);
        let candidate = Event::Election {
            session: Session::Connected,
            candidate: true,
            announced: None,
            followed_serving: false,
        };
        log.step(&mut r, 0, candidate);
        log.step(&mut r, 1, Event::ViewClaimed { view: 2 });
        peers_join(log, &mut r, 2);
        r
    }

    /// Nodes 2 and 3 promise the view `r` started (at `t`), sync with it,
    /// and its server applies the `VIEW` entry: it serves.
    fn peers_join(log: &mut Log, r: &mut Replica, t: Millis) {
        for from in [2, 3] {
            let msg = promise(from);
            log.step(r, t, Event::Message { from, msg });
        }
        for from in [2, 3] {
            let msg = Message::Synced { last: 1 };
            log.step(r, t + 1, Event::Message { from, msg });
        }
        log.step(r, t + 2, Event::Applied { seq: 1 });
        assert!(r.serving(), "{r:?}");
    }

    /// The leader's preload appended `seq` (view 2); the peers acked
    /// `acked`; then the session is `session`, at `now`.
    fn lead_without_zookeeper(
        log: &mut Log,
        r: &mut Replica,
        now: Millis,
        seq: u64,
        acked: u64,
        session: Session,
    ) -> Vec<Action> {
        if seq > log.views.len() as u64 {
            let es = vec![EntryMeta {
                seq,
                view: 2,
                last_committed: 1,
            }];
            log.step(r, now, Event::Read(es));
        }
        let words = Words {
            acks: vec![(1, seq), (2, acked), (3, acked)],
            served: seq,
            ..Words::default()
        };
        let mut out = log.step(r, now, Event::Tick(words));
        out.extend(log.step(
            r,
            now,
            Event::Election {
                session,
                candidate: false,
                announced: None,
                followed_serving: false,
            },
        ));
        out
    }

    #[test]
    fn a_leader_that_lost_zookeeper_serves_on_while_its_majority_acks() {
        let mut log = Log::default();
        let mut r = zookeeper_leader(&mut log);
        // Ten session timeouts without ZooKeeper (expired, then unreachable),
        // every entry acknowledged by both backups: it keeps leading.
        for i in 0..100u64 {
            let session = if i % 2 == 0 {
                Session::Expired
            } else {
                Session::Disconnected(i * 100)
            };
            lead_without_zookeeper(&mut log, &mut r, 10 + i * 100, 2 + i, 2 + i, session);
            assert!(r.serving(), "step {i}: {r:?}");
        }
        assert_eq!(r.committed(), 101);
    }

    #[test]
    fn a_leader_that_lost_zookeeper_steps_down_once_no_majority_acks() {
        let mut log = Log::default();
        let mut r = zookeeper_leader(&mut log);
        let lost = Session::Disconnected(5000);
        lead_without_zookeeper(&mut log, &mut r, 10, 2, 2, lost);
        // Seq 3 is never acknowledged (the backups promised a newer view,
        // or cannot be reached): a session timeout later it stops.
        lead_without_zookeeper(&mut log, &mut r, 20, 3, 2, lost);
        // The peers answer probes (they are reachable, but do not ack).
        for from in [2, 3] {
            let msg = Message::PeekAnswer {
                seq: 2,
                view: Some(2),
            };
            log.step(&mut r, 1000, Event::Message { from, msg });
        }
        lead_without_zookeeper(&mut log, &mut r, 1019, 3, 2, lost);
        assert!(r.serving());
        let out = lead_without_zookeeper(&mut log, &mut r, 1020, 3, 2, lost);
        assert!(!r.serving());
        assert!(
            out.iter().any(|a| matches!(a, Action::Note { what }
                if what.contains("no majority acknowledged for 1000 ms"))),
            "{out:?}"
        );
    }

    #[test]
    fn a_leader_with_zookeeper_is_not_deposed_by_a_slow_majority() {
        let mut log = Log::default();
        let mut r = zookeeper_leader(&mut log);
        lead_without_zookeeper(&mut log, &mut r, 20, 2, 1, Session::Connected);
        lead_without_zookeeper(&mut log, &mut r, 5000, 2, 1, Session::Connected);
        assert!(r.serving());
    }

    #[test]
    fn an_idle_leader_without_zookeeper_steps_down_once_no_peer_answers() {
        let mut log = Log::default();
        let mut r = zookeeper_leader(&mut log);
        let lost = Session::Disconnected(5000);
        let out = lead_without_zookeeper(&mut log, &mut r, 10, 1, 1, lost);
        let out = [
            out,
            lead_without_zookeeper(&mut log, &mut r, 11, 1, 1, lost),
        ]
        .concat();
        let probes: Vec<u64> = out
            .iter()
            .filter_map(|a| match a {
                Action::Send {
                    to,
                    msg: Message::Peek { .. },
                } => Some(*to),
                _ => None,
            })
            .collect();
        assert_eq!(probes, [2, 3], "one probe per peer: {out:?}");
        // Node 3 answers now and then: with this node, a majority.
        for t in (300..3000).step_by(300) {
            log.step(
                &mut r,
                t,
                Event::Message {
                    from: 3,
                    msg: Message::PeekAnswer {
                        seq: 1,
                        view: Some(2),
                    },
                },
            );
            lead_without_zookeeper(&mut log, &mut r, t, 1, 1, lost);
            assert!(r.serving(), "at {t}");
        }
        // Then nobody answers: a session timeout after the last answer.
        lead_without_zookeeper(&mut log, &mut r, 3699, 1, 1, lost);
        assert!(r.serving());
        lead_without_zookeeper(&mut log, &mut r, 3700, 1, 1, lost);
        assert!(!r.serving());
    }

    fn metas(seqs: std::ops::RangeInclusive<u64>, view: u64) -> Vec<EntryMeta> {
        seqs.map(|seq| EntryMeta {
            seq,
            view,
            last_committed: 0,
        })
        .collect()
    }

    fn chunk(from: u64, seqs: std::ops::RangeInclusive<u64>, more: bool) -> Event {
        Event::Message {
            from,
            msg: Message::Entries {
                entries: metas(seqs, 1),
                more,
            },
        }
    }

    fn backup_of_1() -> (Replica, Log) {
        let cfg = ReplicaConfig {
            me: 2,
            ..config(LeaderChoice::Static { leader: 1 })
        };
        let (r, _) = Replica::new(cfg, Restored::default(), 0);
        (r, Log::default())
    }

    /// A static backup that restarts with its log acks it at once when
    /// its log follows the view it promised (the leader counts it again),
    /// and not when it promised a newer view than its log's.
    #[test]
    fn a_restarted_static_backup_acks_its_log() {
        for (log_view, acked) in [(2, true), (1, false)] {
            let cfg = ReplicaConfig {
                me: 2,
                ..config(LeaderChoice::Static { leader: 1 })
            };
            let restored = Restored {
                view: 2,
                log_view,
                committed: 0,
            };
            let (mut r, _) = Replica::new(cfg, restored, 0);
            let mut log = Log {
                views: vec![log_view; 3],
                ..Log::default()
            };
            let a = log.step(&mut r, 1, Event::Tick(Words::default()));
            let ack = Action::Ack {
                leader: 1,
                view: 2,
                seq: 3,
            };
            assert_eq!(a.contains(&ack), acked, "log view {log_view}: {a:?}");
        }
    }

    /// A catch-up stores only entries of the view its log follows: a
    /// failed candidate (its log ends in its own view's entry, its leader
    /// is still the one it followed) must not append that leader's older
    /// view's entries after its view entry.
    #[test]
    fn a_catch_up_stores_no_entry_of_another_view_than_its_log() {
        let (mut r, mut log) = backup_of_1();
        let status = Event::LeaderStatus {
            view: 1,
            serving: true,
        };
        log.step(&mut r, 0, status);
        let older = Event::Message {
            from: 1,
            msg: Message::Entries {
                entries: metas(1..=3, 0),
                more: false,
            },
        };
        let a = log.step(&mut r, 1, older);
        assert!(
            !a.iter().any(|a| matches!(a, Action::Persist { .. })),
            "{a:?}"
        );
        assert!(log.views.is_empty());
    }

    /// A lost ack is repaired without a new entry: a leader whose writer
    /// waits for it to reuse ring space appends none.
    #[test]
    fn a_backup_at_rest_repeats_its_last_ack() {
        let (mut r, mut log) = backup_of_1();
        let status = Event::LeaderStatus {
            view: 1,
            serving: true,
        };
        log.step(&mut r, 0, status);
        log.step(&mut r, 1, chunk(1, 1..=3, false));
        let acks = |a: &[Action]| -> Vec<Action> {
            a.iter()
                .filter(|a| matches!(a, Action::Ack { .. }))
                .cloned()
                .collect()
        };
        let tick = |log: &mut Log, r: &mut Replica, t| {
            acks(&log.step(r, t, Event::Tick(Words::default())))
        };
        assert_eq!(tick(&mut log, &mut r, 50), vec![], "not before the pause");
        let again = vec![Action::Ack {
            leader: 1,
            view: 1,
            seq: 3,
        }];
        assert_eq!(tick(&mut log, &mut r, 1 + ACK_REPEAT_MS), again);
        assert_eq!(tick(&mut log, &mut r, 2 + ACK_REPEAT_MS), vec![]);
        assert_eq!(tick(&mut log, &mut r, 1 + 2 * ACK_REPEAT_MS), again);
    }

    #[test]
    fn a_catch_up_stores_and_acks_each_chunk_as_it_arrives() {
        let (mut r, mut log) = backup_of_1();
        let a = log.step(
            &mut r,
            0,
            Event::LeaderStatus {
                view: 1,
                serving: true,
            },
        );
        assert!(a.contains(&Action::Send {
            to: 1,
            msg: Message::Fetch { from: 1, to: 0 }
        }));
        let a = log.step(&mut r, 1, chunk(1, 1..=3, true));
        assert!(a.contains(&Action::Persist { last: 3 }));
        assert!(a.contains(&Action::Ack {
            leader: 1,
            view: 1,
            seq: 3
        }));
        assert_eq!(log.views.len(), 3);
        // A chunk that does not continue the log is not stored; the
        // catch-up moves on (here: no other peer is certain past the
        // commit point 0), keeping what it stored.
        let a = log.step(&mut r, 2, chunk(1, 5..=6, true));
        assert!(!a.iter().any(|a| matches!(a, Action::Persist { .. })));
        assert_eq!(log.views.len(), 3);
        // The catch-up is over: chunks of it are no longer taken.
        let a = log.step(&mut r, 3, chunk(1, 4..=4, false));
        assert!(!a.iter().any(|a| matches!(a, Action::Persist { .. })));
    }

    #[test]
    fn a_follow_broken_mid_fetch_keeps_what_it_stored_and_fetches_the_rest() {
        let (mut r, mut log) = backup_of_1();
        let new_view = Event::Message {
            from: 1,
            msg: Message::NewView {
                view: 2,
                leader: 1,
                last: 6,
            },
        };
        let a = log.step(&mut r, 0, new_view.clone());
        assert!(a.contains(&Action::Send {
            to: 1,
            msg: Message::Peek { seq: 1 }
        }));
        let peek = |seq| Event::Message {
            from: 1,
            msg: Message::PeekAnswer { seq, view: Some(1) },
        };
        let a = log.step(&mut r, 1, peek(1));
        assert!(a.contains(&Action::Send {
            to: 1,
            msg: Message::Fetch { from: 1, to: 0 }
        }));
        log.step(&mut r, 2, chunk(1, 1..=3, true));
        assert_eq!(log.views.len(), 3);
        // The stream breaks: the sync fails, the chunk stays stored.
        let a = log.step(&mut r, 3, Event::Unanswered { to: 1 });
        assert!(a.contains(&Action::Send {
            to: 1,
            msg: Message::Refused
        }));
        assert_eq!(log.views.len(), 3);
        // The next sync finds it shared with the leader's log (one probe)
        // and fetches only what follows.
        let a = log.step(&mut r, 4, new_view);
        assert!(a.contains(&Action::Send {
            to: 1,
            msg: Message::Peek { seq: 3 }
        }));
        let a = log.step(&mut r, 5, peek(3));
        assert!(a.contains(&Action::Truncate { after: 3 }));
        assert!(a.contains(&Action::Send {
            to: 1,
            msg: Message::Fetch { from: 4, to: 0 }
        }));
        let a = log.step(&mut r, 6, chunk(1, 4..=6, false));
        assert!(a.contains(&Action::Send {
            to: 1,
            msg: Message::Synced { last: 6 }
        }));
        assert_eq!(log.views.len(), 6);
        assert_eq!(r.role(), Role::Backup);
        assert_eq!(r.log_view(), 2);
    }

    #[test]
    fn a_deposed_leader_whose_resumed_sync_kept_the_new_log_still_checks_its_server() {
        // Node 1 leads view 2 and its server is handed 2..=5, which nobody
        // else stored.
        let (mut r, mut log) = leading_view_2();
        log.step(&mut r, 4, Event::Read(metas(2..=5, 2)));
        log.served = 5;
        // Node 2 leads view 3 without them: its 2..=6 are view 3's.
        log.step(
            &mut r,
            5,
            Event::Message {
                from: 2,
                msg: Message::Prepare {
                    view: 3,
                    candidate: 2,
                },
            },
        );
        let new_view = Event::Message {
            from: 2,
            msg: Message::NewView {
                view: 3,
                leader: 2,
                last: 6,
            },
        };
        let peek = |seq| Event::Message {
            from: 2,
            msg: Message::PeekAnswer {
                seq,
                view: Some(if seq == 1 { 2 } else { 3 }),
            },
        };
        let view3 = |seqs, more| Event::Message {
            from: 2,
            msg: Message::Entries {
                entries: metas(seqs, 3),
                more,
            },
        };
        let mut a = log.step(&mut r, 6, new_view.clone());
        let mut now = 7;
        while let Some(seq) = a.iter().find_map(|a| match a {
            Action::Send {
                msg: Message::Peek { seq },
                ..
            } => Some(*seq),
            _ => None,
        }) {
            a = log.step(&mut r, now, peek(seq));
            now += 1;
        }
        assert!(a.contains(&Action::Truncate { after: 1 }), "{a:?}");
        // The fetch breaks after 2..=5 of view 3 were stored.
        log.step(&mut r, now, view3(2..=5, true));
        log.step(&mut r, now + 1, Event::Unanswered { to: 2 });
        assert_eq!(log.views, vec![2, 3, 3, 3, 3]);
        // The next sync keeps them (shared with node 2 now), but the
        // server consumed view 2's 2..=5, not these: the node goes stale
        // rather than apply 6 on top.
        let a = log.step(&mut r, now + 2, new_view);
        assert!(
            a.contains(&Action::Send {
                to: 2,
                msg: Message::Peek { seq: 5 }
            }),
            "{a:?}"
        );
        log.step(&mut r, now + 3, peek(5));
        let a = log.step(&mut r, now + 4, view3(6..=6, false));
        assert!(
            a.iter()
                .any(|a| matches!(a, Action::GoStale { why } if why.contains("seq 5 of view 2"))),
            "{a:?}"
        );
        assert!(r.stale().is_some());
    }
}
