//! The decisions of a view change, free of I/O.
//!
//! Viewstamped-Replication style. Every node keeps a *log view*: the view
//! whose leader its log follows (raised when the node accepts that
//! leader's log, by normal replication or by a view change's sync). The
//! candidate of view `v`:
//!
//! 1. gets a [`Promise`] from a majority: each promiser fences every view
//!    below `v` first, so no older leader gets another entry acked by it;
//! 2. adopts the log of the promiser with the highest `(log_view, last_seq)`
//!    ([`Candidate::decide`]). Logs that follow the same leader are
//!    prefixes of that leader's log, so the longest one of the highest log
//!    view holds every entry any earlier view committed (a committed entry
//!    is on a majority, which meets the promise majority);
//! 3. makes the others' logs equal to it ([`sync_point`](super::sync::sync_point): everything above
//!    a node's own commit point is discarded and fetched again), appends a
//!    `VIEW` entry and counts the view as started once a majority holds it.
//!
//! Comparing the view of the *last entry* instead of the log view would be
//! wrong: a new leader re-sends older entries with their old view, so a
//! node holding a long stale tail of an old view could look as good as one
//! that holds a newer leader's log (the Raft paper's figure 8).

use std::collections::BTreeMap;

use super::Millis;

pub use lockstep_common::control::Promise;

/// Order of "more up to date".
fn rank(p: &Promise) -> (u64, u64) {
    (p.log_view, p.last_seq)
}

/// Which log the new view starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Adoption {
    /// The node holding it (the candidate itself when its own is as good).
    pub source: u64,
    /// The view whose leader wrote the adopted log.
    pub log_view: u64,
    /// The adopted log ends at this seq.
    pub last_seq: u64,
    /// The highest commit point any promiser knew: every seq up to it is
    /// committed, and at least this much of the log must be adopted.
    pub committed: u64,
}

impl Adoption {
    /// The adoption with the old leader's unserved tail dropped.
    ///
    /// The leader of the adopted log's view, once deposed, knows where
    /// that log became visible: its server consumed the view's inputs up
    /// to `served` (`led` = `(view, served)`, from its promise), and the
    /// hand-over fence makes that exact. Entries of the view above it were
    /// never given to any server (backups apply only what the leader
    /// committed, and it commits only what it handed over), so no client
    /// saw their effect: the new view may drop them, and the old leader's
    /// server stays in line with the log instead of having to be rebuilt.
    /// Committed entries are always kept. Without that leader's promise
    /// the tail is kept: it may have been served.
    pub fn trim_unserved(self, led: Option<(u64, u64)>) -> Adoption {
        match led {
            Some((view, served)) if view == self.log_view && served < self.last_seq => Adoption {
                last_seq: served.max(self.committed),
                ..self
            },
            _ => self,
        }
    }
}

pub use lockstep_common::quorum::majority;

/// The candidate's side of a view change: collects promises, decides.
#[derive(Clone, Debug)]
pub struct Candidate {
    view: u64,
    me: u64,
    members: Vec<u64>,
    promises: BTreeMap<u64, Promise>,
    /// A node that could not serve this candidate's last adoption.
    avoid: Option<u64>,
}

impl Candidate {
    /// A candidate `me` for `view` among `members` (ids, `me` included).
    pub fn new(view: u64, me: u64, members: &[u64]) -> Candidate {
        Candidate {
            view,
            me,
            members: members.to_vec(),
            promises: BTreeMap::new(),
            avoid: None,
        }
    }

    /// `node` could not serve this candidate's last adoption (its log
    /// did not reach back to what the candidate needed: compacted below
    /// it): among equal logs another is fetched from first.
    pub fn avoid(&mut self, node: Option<u64>) {
        self.avoid = node;
    }

    /// The view being started.
    pub fn view(&self) -> u64 {
        self.view
    }

    /// Records a promise; ignores non-members and repeats.
    pub fn promise(&mut self, p: Promise) {
        if self.members.contains(&p.node) {
            self.promises.entry(p.node).or_insert(p);
        }
    }

    /// Whether a majority promised.
    pub fn has_majority(&self) -> bool {
        self.promises.len() >= majority(self.members.len())
    }

    /// The log to adopt, once a majority promised. Ties go to the
    /// candidate (nothing to fetch), then to a node not avoided (see
    /// [`Candidate::avoid`]), then to the lowest id.
    pub fn decide(&self) -> Option<Adoption> {
        if !self.has_majority() {
            return None;
        }
        let best = self.promises.values().max_by(|a, b| {
            rank(a)
                .cmp(&rank(b))
                .then_with(|| (a.node == self.me).cmp(&(b.node == self.me)))
                .then_with(|| (Some(a.node) != self.avoid).cmp(&(Some(b.node) != self.avoid)))
                .then_with(|| b.node.cmp(&a.node))
        })?;
        let committed = self
            .promises
            .values()
            .map(|p| p.committed)
            .max()
            .unwrap_or(0);
        let adoption = Adoption {
            source: best.node,
            log_view: best.log_view,
            last_seq: best.last_seq,
            committed,
        };
        // The adopted view's own leader, if it promised, says how much of
        // that view reached its server.
        let led = self
            .promises
            .values()
            .filter_map(|p| p.led)
            .find(|&(v, _)| v == best.log_view);
        Some(adoption.trim_unserved(led))
    }
}

/// Views newer than a node's own that its peers were seen in (a
/// `Prepare` or `NewView` refused as outdated, a write refused by a
/// peer's region), and since when. A view a peer promised may never start
/// (its candidate died, was cut off, or was no real candidate): the
/// candidate's next view must pass it ([`NewerViews::next_view`]), and a
/// leader whose peer sits in such a view for a whole patience stops
/// leading so that a view above it starts ([`NewerViews::stalled`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NewerViews {
    /// The highest view seen.
    highest: u64,
    /// Who was seen in it (0: a peer the transport did not name).
    node: u64,
    /// When a view newer than the observer's own was first seen, since
    /// the observer's view last passed every view seen.
    since: Option<Millis>,
}

impl NewerViews {
    /// Records that node `node` is in `view` while the observer's own
    /// view is `own`, at `now`. Views not above `own` say nothing.
    pub fn observe(&mut self, node: u64, view: u64, own: u64, now: Millis) {
        if view <= own {
            return;
        }
        if self.since.is_none() || self.highest <= own {
            self.since = Some(now);
        }
        if view > self.highest {
            self.highest = view;
            self.node = node;
        }
    }

    /// The highest view seen (0: none).
    pub fn highest(&self) -> u64 {
        self.highest
    }

    /// The view a candidate whose own views reach `floor` tries next:
    /// above its own and above every view a peer was seen in.
    pub fn next_view(&self, floor: u64) -> u64 {
        floor.max(self.highest).saturating_add(1)
    }

    /// For a leader of `own`: `(node, view)` once a peer has been seen in
    /// a newer view for at least `patience` (that view has not replaced
    /// this leader's in that time: it never started, or started without
    /// this node, which then learns it at the next view change).
    pub fn stalled(&self, own: u64, now: Millis, patience: Millis) -> Option<(u64, u64)> {
        let since = self.since?;
        (self.highest > own && now.saturating_sub(since) >= patience)
            .then_some((self.node, self.highest))
    }
}

/// What a node remembers across the steps of view changes: the view it led
/// and the last input its server consumed when it stopped leading, when it
/// last promised a view that has not started yet, and the newer views seen
/// at peers. [`crate::protocol::Replica`] keeps one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ViewChangeState {
    /// (the view it led, the last input its server consumed then), from
    /// its demotion until the next view's log is known.
    led: Option<(u64, u64)>,
    /// When it last promised a view that has not started yet.
    promised_at: Option<Millis>,
    /// Views newer than its own that peers were seen in.
    newer: NewerViews,
}

impl ViewChangeState {
    /// A view was promised at `now`: a view change may be under way.
    pub fn promised(&mut self, now: Millis) {
        self.promised_at = Some(now);
    }

    /// The promised view started (here, or with this node following it).
    pub fn settled(&mut self) {
        self.promised_at = None;
    }

    /// Whether a view change this node promised may still be under way at
    /// `now` ([`changing`]).
    pub fn changing(&self, now: Millis) -> bool {
        changing(self.promised_at, now)
    }

    /// This node stops leading its log view `log_view`. The first time
    /// only (until [`ViewChangeState::take_led`]), `fence` stops every
    /// further hand-over to the server and returns the last input the
    /// server was handed: remembered, and returned (the server consumed
    /// everything up to there: it is never replayed).
    pub fn demoted(&mut self, log_view: u64, fence: impl FnOnce() -> u64) -> Option<u64> {
        if self.led.is_some() {
            return None;
        }
        let served = fence();
        self.led = Some((log_view, served));
        Some(served)
    }

    /// What this node led when it stopped leading, for its promise.
    pub fn led(&self) -> Option<(u64, u64)> {
        self.led
    }

    /// Takes what this node led, once the new view's log is known (its
    /// server is judged against that log once).
    pub fn take_led(&mut self) -> Option<(u64, u64)> {
        self.led.take()
    }

    /// Node `node` (0: a peer the transport did not name) is in `view`,
    /// this node in `own`, at `now` ([`NewerViews::observe`]).
    pub fn observe(&mut self, node: u64, view: u64, own: u64, now: Millis) {
        self.newer.observe(node, view, own, now);
    }

    /// For a leader of `own`: `(node, view)` once a peer has sat in a
    /// newer view for `patience` ([`NewerViews::stalled`]).
    pub fn stalled(&self, own: u64, now: Millis, patience: Millis) -> Option<(u64, u64)> {
        self.newer.stalled(own, now, patience)
    }

    /// The highest view known to this node (its own views reach `own`)
    /// and to every peer it saw: its next candidacy tries a view above.
    pub fn view_floor(&self, own: u64) -> u64 {
        self.newer.next_view(own) - 1
    }
}

/// The highest view the peers that refused a view change as outdated
/// promised, if any is at least `view` (the attempt cannot succeed: a
/// leader of `view` would find those peers fenced against it).
pub fn superseded(view: u64, promised: impl IntoIterator<Item = u64>) -> Option<u64> {
    promised.into_iter().filter(|&p| p >= view).max()
}

/// A promised view that has not started after this long no longer holds
/// back joining the announced leader.
pub const VIEW_CHANGE_PATIENCE_MS: Millis = 3000;

/// Whether a view change this node promised (at `promised_at`) may still
/// be under way at `now`.
pub fn changing(promised_at: Option<Millis>, now: Millis) -> bool {
    promised_at.is_some_and(|t| now.saturating_sub(t) < VIEW_CHANGE_PATIENCE_MS)
}

/// Whether node `me` leads: it is its region's leader, and its log follows
/// the view it promised (the view started here).
pub fn leading(me: u64, leader: u64, promised: u64, log_view: u64) -> bool {
    leader == me && promised == log_view
}

/// What a node knows of its own views when it hears of a leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Views {
    /// This node.
    pub me: u64,
    /// The view it promised (its region's view word).
    pub promised: u64,
    /// The view whose leader its log follows.
    pub log_view: u64,
    /// The leader it knows (0: none).
    pub leader: u64,
    /// A view change it promised may still be under way ([`changing`]).
    pub changing: bool,
}

/// ZooKeeper mode, not the candidate: whether to join the announced
/// leader `leader` of `view` (this node missed its view change: it was
/// down, cut off or restarted). Also when the log follows that view
/// already but this node does not know its leader (a restarted backup).
pub fn joins_announced(own: Views, view: u64, leader: u64) -> bool {
    let unknown = view == own.log_view && own.leader != leader;
    (view > own.log_view || unknown) && view >= own.promised && leader != own.me && !own.changing
}

/// ZooKeeper mode, the candidate: whether to publish itself as the leader
/// of its view now. It serves that view (`serving`: its preload went
/// active) and the record names an older view, or another leader of its
/// own view, or nothing. The first announcement can be lost (ZooKeeper
/// unreachable for less than the session timeout, so the lead is kept):
/// without publishing again, nodes that missed the view change (down,
/// cut off, restarted) never learn the leader, and none follows it.
pub fn announces(own: Views, serving: bool, announced: Option<(u64, u64)>) -> bool {
    let ours = serving && leading(own.me, own.leader, own.promised, own.log_view);
    ours && announced.is_none_or(|(view, leader)| {
        view < own.promised || (view == own.promised && leader != own.me)
    })
}

/// ZooKeeper mode, the candidate: whether to give way instead of claiming
/// a view, because the leader it follows still serves (its lowest znode
/// came back before the leader's after ZooKeeper lost the sessions, or the
/// leader lost only its own link to ZooKeeper). A new view would only cut
/// off a working leader's clients; when that leader dies, its status
/// query fails and the candidate claims. `followed_serving` is the
/// leader's answer (see [`super::Event::Election`]).
pub fn yields(own: Views, backup: bool, followed_serving: bool) -> bool {
    followed_serving
        && backup
        && own.leader != 0
        && own.leader != own.me
        && own.log_view == own.promised
}

/// Static mode, a backup: whether to follow the configured leader, which
/// reports `view` and whether it serves (`serving`).
pub fn follows_static(own: Views, view: u64, serving: bool) -> bool {
    serving && view > own.log_view && view >= own.promised && !own.changing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unserved_tail_of_the_candidates_own_view_is_dropped() {
        let a = Adoption {
            source: 2,
            log_view: 3,
            last_seq: 20,
            committed: 15,
        };
        // Led view 3 and served up to 17: 18..=20 reached no server.
        assert_eq!(a.trim_unserved(Some((3, 17))).last_seq, 17);
        // Never below what is known committed.
        assert_eq!(a.trim_unserved(Some((3, 10))).last_seq, 15);
        // Another view's log, or a candidate that did not lead: untouched.
        assert_eq!(a.trim_unserved(Some((2, 17))), a);
        assert_eq!(a.trim_unserved(None), a);
        assert_eq!(a.trim_unserved(Some((3, 25))), a);
    }

    #[test]
    fn a_candidate_gives_way_only_to_a_serving_leader_it_follows() {
        let own = Views {
            me: 2,
            promised: 4,
            log_view: 4,
            leader: 1,
            changing: false,
        };
        assert!(yields(own, true, true));
        assert!(!yields(own, true, false), "the leader does not answer");
        assert!(!yields(own, false, true), "not a backup");
        assert!(!yields(Views { leader: 0, ..own }, true, true), "no leader");
        assert!(!yields(Views { leader: 2, ..own }, true, true), "itself");
        assert!(
            !yields(Views { promised: 5, ..own }, true, true),
            "promised a newer view"
        );
    }

    #[test]
    fn view_change_state_remembers_the_first_demotion_until_taken() {
        let mut s = ViewChangeState::default();
        assert_eq!(s.demoted(3, || 17), Some(17));
        assert_eq!(s.demoted(4, || panic!("fenced twice")), None);
        assert_eq!(s.led(), Some((3, 17)));
        assert_eq!(s.take_led(), Some((3, 17)));
        assert_eq!(s.led(), None);
        assert_eq!(s.demoted(5, || 20), Some(20));
    }

    #[test]
    fn view_change_state_is_changing_from_a_promise_until_settled() {
        let mut s = ViewChangeState::default();
        assert!(!s.changing(10));
        s.promised(10);
        assert!(s.changing(10 + VIEW_CHANGE_PATIENCE_MS - 1));
        assert!(!s.changing(10 + VIEW_CHANGE_PATIENCE_MS));
        s.settled();
        assert!(!s.changing(11));
    }

    #[test]
    fn view_change_state_floor_passes_views_seen_at_peers() {
        let mut s = ViewChangeState::default();
        assert_eq!(s.view_floor(4), 4);
        s.observe(2, 9, 4, 100);
        assert_eq!(s.view_floor(4), 9);
        assert_eq!(s.stalled(4, 150, 100), None);
        assert_eq!(s.stalled(4, 200, 100), Some((2, 9)));
    }

    fn p(node: u64, log_view: u64, last_seq: u64, committed: u64) -> Promise {
        Promise {
            node,
            log_view,
            last_seq,
            committed,
            led: None,
        }
    }

    #[test]
    fn the_deposed_leaders_promise_trims_what_its_server_never_got() {
        let mut c = Candidate::new(5, 3, &[1, 2, 3]);
        c.promise(p(3, 4, 20, 15));
        c.promise(Promise {
            led: Some((4, 17)),
            ..p(1, 4, 20, 15)
        });
        let a = c.decide().unwrap();
        assert_eq!((a.log_view, a.last_seq), (4, 17));
        // A record of an older view says nothing about view 4's log.
        let mut c = Candidate::new(5, 3, &[1, 2, 3]);
        c.promise(p(3, 4, 20, 15));
        c.promise(Promise {
            led: Some((3, 9)),
            ..p(1, 3, 12, 9)
        });
        assert_eq!(c.decide().unwrap().last_seq, 20);
    }

    #[test]
    fn needs_a_majority() {
        let mut c = Candidate::new(5, 1, &[1, 2, 3, 4, 5]);
        c.promise(p(1, 4, 10, 8));
        c.promise(p(2, 4, 12, 8));
        assert_eq!(c.decide(), None);
        c.promise(p(2, 4, 99, 8)); // a repeat does not count twice
        assert_eq!(c.decide(), None);
        c.promise(p(9, 4, 99, 8)); // nor a stranger
        assert_eq!(c.decide(), None);
        c.promise(p(3, 3, 20, 8));
        let a = c.decide().unwrap();
        assert_eq!((a.source, a.last_seq, a.committed), (2, 12, 8));
    }

    #[test]
    fn log_view_beats_length() {
        let mut c = Candidate::new(7, 3, &[1, 2, 3]);
        c.promise(p(1, 5, 100, 40));
        c.promise(p(3, 6, 50, 45));
        assert_eq!(c.decide().unwrap().source, 3);
    }

    #[test]
    fn ties_prefer_the_candidate_then_low_ids() {
        let mut c = Candidate::new(2, 3, &[1, 2, 3]);
        c.promise(p(2, 1, 9, 5));
        c.promise(p(3, 1, 9, 5));
        assert_eq!(c.decide().unwrap().source, 3);
        let mut c = Candidate::new(2, 3, &[1, 2, 3]);
        c.promise(p(2, 1, 9, 5));
        c.promise(p(1, 1, 9, 5));
        c.promise(p(3, 1, 8, 5));
        assert_eq!(c.decide().unwrap().source, 1);
        // Node 1 could not serve the last adoption: node 2's equal log.
        c.avoid(Some(1));
        assert_eq!(c.decide().unwrap().source, 2);
        // Only among equal logs.
        c.avoid(Some(2));
        assert_eq!(c.decide().unwrap().source, 1);
    }

    #[test]
    fn a_promised_view_that_never_started_is_passed() {
        let s = |ms: u64| 1_000 + ms;
        let patience = 2000;
        let mut n = NewerViews::default();
        assert_eq!(n.next_view(3), 4);
        assert_eq!(n.stalled(3, s(10_000), patience), None);
        // Views not above the observer's own say nothing.
        n.observe(2, 3, 3, s(0));
        assert_eq!((n.highest(), n.stalled(3, s(10_000), patience)), (0, None));
        // Node 2 promised view 1003 (issue 14's stray Prepare) while this
        // node leads view 3.
        n.observe(2, 1003, 3, s(100));
        assert_eq!(n.next_view(3), 1004);
        assert_eq!(n.next_view(2000), 2001);
        assert_eq!(n.stalled(3, s(2099), patience), None);
        // Seeing it again does not restart the clock.
        n.observe(2, 1003, 3, s(1500));
        assert_eq!(n.stalled(3, s(2100), patience), Some((2, 1003)));
        // A higher one is remembered with its node.
        n.observe(3, 1500, 3, s(2200));
        assert_eq!(n.stalled(3, s(2200), patience), Some((3, 1500)));
        // Once this node's view passed it: nothing stalls.
        assert_eq!(n.stalled(1501, s(9000), patience), None);
        // A newer one after that starts a new clock.
        n.observe(2, 1600, 1501, s(9000));
        assert_eq!(n.stalled(1501, s(10_999), patience), None);
        assert_eq!(n.stalled(1501, s(11_000), patience), Some((2, 1600)));
        assert_eq!(n.next_view(1501), 1601);
        // Never wraps.
        n.observe(2, u64::MAX, 1501, s(12_000));
        assert_eq!(n.next_view(7), u64::MAX);
    }

    #[test]
    fn joins_the_announced_leader_only_when_it_missed_its_view() {
        let own = Views {
            me: 2,
            promised: 4,
            log_view: 4,
            leader: 1,
            changing: false,
        };
        assert!(!joins_announced(own, 4, 1), "follows it already");
        assert!(joins_announced(own, 4, 3), "restarted: leader unknown");
        assert!(joins_announced(own, 5, 3));
        assert!(!joins_announced(own, 5, 2), "itself");
        assert!(!joins_announced(Views { promised: 6, ..own }, 5, 3));
        assert!(!joins_announced(
            Views {
                changing: true,
                ..own
            },
            5,
            3
        ));
        assert!(follows_static(own, 5, true));
        assert!(!follows_static(own, 5, false));
        assert!(!follows_static(own, 4, true));
        assert!(changing(Some(10), 10 + VIEW_CHANGE_PATIENCE_MS - 1));
        assert!(!changing(Some(10), 10 + VIEW_CHANGE_PATIENCE_MS));
        assert!(!changing(None, 0));
        assert!(leading(1, 1, 3, 3));
        assert!(!leading(1, 1, 4, 3));
        assert!(!leading(1, 2, 3, 3));
    }

    #[test]
    fn the_leader_publishes_itself_until_the_record_names_it() {
        let own = Views {
            me: 1,
            promised: 4,
            log_view: 4,
            leader: 1,
            changing: false,
        };
        assert!(announces(own, true, None), "lost first announcement");
        assert!(announces(own, true, Some((3, 2))), "older view's record");
        assert!(announces(own, true, Some((4, 2))));
        assert!(!announces(own, true, Some((4, 1))), "published already");
        assert!(!announces(own, true, Some((5, 2))), "a newer view's");
        assert!(!announces(own, false, None), "not serving yet");
        assert!(!announces(Views { promised: 5, ..own }, true, None));
        assert!(!announces(Views { leader: 0, ..own }, true, None));
    }

    #[test]
    fn refusals_supersede_an_attempt() {
        assert_eq!(superseded(4, []), None);
        assert_eq!(superseded(4, [2, 3]), None);
        assert_eq!(superseded(4, [1003, 5, 2]), Some(1003));
        assert_eq!(superseded(4, [4]), Some(4));
    }
}
