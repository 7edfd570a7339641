//! [`Replica`]: one node's protocol state, stepped by [`Event`]s into
//! [`Action`]s. The rules it applies are the ones in the sibling modules;
//! the runtime ([`crate::runtime`]) and the simulated cluster feed it
//! events and carry out its actions, and decide nothing themselves.
//!
//! Here: the state, [`Replica::step`] (which dispatches each event and
//! checks the invariants after it), the control messages' dispatch and
//! the role changes every part uses. The rest by concern:
//! - `reads`: the ring path and the clock (acks, the commit point, ticks);
//! - `catch_up`: when a backup fetches from a peer instead;
//! - `follow`: making this node's log the leader's;
//! - `candidate`: a view change this node runs;
//! - `apply`: what the server applied and may apply next;
//! - `snapshots`: a round of the snapshot rules (take, compact, install).

use std::collections::BTreeSet;

use super::catchup::{self, FetchPlan, GapWatch, Stall};
use super::commit;
use super::fence::{self, ViewRefusal};
use super::session::{self, CommitProgress, Contact};
use super::stale::{self, ServerFate};
use super::sync::{self, PrefixSearch, Probe};
use super::viewchange::{self, Adoption, Candidate, Promise, ViewChangeState, Views};
use super::{Action, EntryMeta, Event, Host, Message, Millis, Role, Session, SnapshotRound, Words};
use lockstep_common::config::SnapshotEvery;

mod apply;
mod candidate;
mod catch_up;
mod follow;
mod reads;
mod snapshots;

pub use snapshots::{INSTALL_BACKOFF_MAX_MS, INSTALL_RETRY_MS};

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
    /// How much log between two snapshots; None: this node takes,
    /// compacts and installs nothing (`snapshot = "off"`, or it has no
    /// image taker).
    pub snapshot_every: Option<SnapshotEvery>,
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
    /// When a failed install may be tried again.
    install: snapshots::InstallBackoff,
    /// The node whose log could not serve this node's last adoption as
    /// candidate (compacted below what it needed).
    adopt_refused: Option<u64>,
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
            install: snapshots::InstallBackoff::default(),
            adopt_refused: None,
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

    /// Sends `msg` to every peer; returns them (whose answers a request
    /// waits for).
    fn send_to_peers(&mut self, msg: Message) -> Vec<u64> {
        let peers = self.peers();
        for &to in &peers {
            self.out.push(Action::Send {
                to,
                msg: msg.clone(),
            });
        }
        peers
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
            Event::Installed { seq } => {
                self.install_worked();
                self.on_installed(seq)
            }
            Event::SnapshotRound(round) => self.on_snapshot_round(round, &*host),
            Event::InstallFailed => self.on_install_failed(),
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

    fn observe_view(&mut self, node: u64, view: u64) {
        self.view_change
            .observe(node, view, self.promised, self.now);
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

    fn note(&mut self, what: String) {
        self.out.push(Action::Note { what });
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

    pub(super) fn config(election: LeaderChoice) -> ReplicaConfig {
        ReplicaConfig {
            me: 1,
            members: vec![1, 2, 3],
            election,
            session_timeout: 1000,
            request_timeout: 500,
            retry: 200,
            snapshot_every: None,
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

    /// Tells backup `r` (at time 0) that node 1 leads view 1 and serves.
    fn leader_1_serves(log: &mut Log, r: &mut Replica) -> Vec<Action> {
        let status = Event::LeaderStatus {
            view: 1,
            serving: true,
        };
        log.step(r, 0, status)
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
        leader_1_serves(&mut log, &mut r);
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
        leader_1_serves(&mut log, &mut r);
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
        let a = leader_1_serves(&mut log, &mut r);
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
