//! When a leader that lost its ZooKeeper session stops serving.
//!
//! ZooKeeper decides who may *claim* the next view; safety rests on view
//! fencing (a backup that promised view v+1 stores nothing of view v, see
//! [`super::fence::admits`]). While ZooKeeper is unreachable nobody can
//! claim a view, so a leader whose session is lost gives up nothing by
//! serving on: every entry it commits is stored by a majority of its view,
//! and any later view's candidate needs promises from a majority, which
//! intersects it and adopts the most up-to-date log. If ZooKeeper expired
//! the session and another node claims a view meanwhile, the backups that
//! promise it refuse this leader's writes before that view commits
//! anything: this leader then commits nothing more. So the leader keeps
//! serving while a majority of its view acknowledges, and stops only when
//! for a whole session timeout its appended entries did not commit, or
//! fewer than a majority (itself included) answered its probes (an idle
//! leader cut off from everyone learns it so). Its clients then fail over
//! instead of waiting on a leader that cannot answer.

use super::{Millis, Session};

/// Why a leader stops serving while its ZooKeeper session is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLoss {
    /// How long its oldest uncommitted entry waited, or how long no
    /// majority answered, whichever is longer.
    pub stuck: Millis,
    /// The session: disconnected, or expired.
    pub session: Session,
    /// A newer view a peer is in (it refused this leader's writes).
    pub newer_view: Option<u64>,
}

impl std::fmt::Display for SessionLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let zk = match self.session {
            Session::Expired => "the ZooKeeper session expired".to_string(),
            Session::Disconnected(d) => format!("ZooKeeper unreachable for {d} ms"),
            Session::Connected => "ZooKeeper connected".to_string(),
        };
        match self.newer_view {
            Some(v) => write!(f, "{zk} and a peer promised view {v}"),
            None => write!(f, "{zk} and no majority acknowledged for {} ms", self.stuck),
        }
    }
}

/// Whether (and why) a leader whose session is `session` stops serving,
/// when its oldest uncommitted entry has waited `stuck` ms (0: nothing
/// waits, or the commit point moved since), no majority answered for
/// `silent` ms ([`Contact::silent`]), and the session timeout is
/// `timeout`; at once when a peer is in a newer view (`newer_view`: with
/// the session lost, that view was handed out by ZooKeeper to another
/// node, which is making it: this leader commits nothing more). Connected:
/// never on this rule (a leader that can reach ZooKeeper but no majority
/// keeps its znode, and nobody else can make a view without that majority
/// either; a stray newer view is the stalled-view rule's).
pub fn session_loss(
    session: Session,
    stuck: Millis,
    silent: Millis,
    newer_view: Option<u64>,
    timeout: Millis,
) -> Option<SessionLoss> {
    let stuck = stuck.max(silent);
    match session {
        Session::Connected => None,
        _ if stuck < timeout && newer_view.is_none() => None,
        _ => Some(SessionLoss {
            stuck,
            session,
            newer_view,
        }),
    }
}

/// A leader's contact with its peers while its session is lost: when it
/// lost the session, and when each peer last answered a probe.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Contact {
    /// When the session was found lost (None: connected).
    lost_at: Option<Millis>,
    /// When a probe was last sent.
    probed_at: Option<Millis>,
    /// When the commit point last moved (a majority acknowledged) while
    /// the session was seen lost. Acks from before the loss was seen prove
    /// nothing after ZooKeeper last heard from this node; these do, and
    /// they are kept when the session flickers back (a frozen ZooKeeper
    /// that resumes looks connected for a moment, then lost again since
    /// long before).
    acked_at: Millis,
    /// (peer, when it last answered).
    heard: Vec<(u64, Millis)>,
}

impl Contact {
    /// The session is seen lost at `now` (again), the connection since
    /// `since` (ZooKeeper last heard from this node then, and expires the
    /// session a timeout later): probing starts, and the peers get one
    /// session timeout from `since` to answer.
    pub fn lost(&mut self, since: Millis, now: Millis) {
        if self.lost_at.is_none() {
            self.lost_at = Some(since.min(now));
            self.probed_at = None;
            self.heard.clear();
        }
    }

    /// The session is back (or the node stopped leading): no probing.
    pub fn reset(&mut self) {
        self.lost_at = None;
        self.heard.clear();
    }

    /// Whether to probe the peers now (every `period` while lost).
    pub fn probe_due(&mut self, now: Millis, period: Millis) -> bool {
        let due = self.lost_at.is_some()
            && self
                .probed_at
                .is_none_or(|t| now.saturating_sub(t) >= period);
        if due {
            self.probed_at = Some(now);
        }
        due
    }

    /// The commit point moved at `now`: a majority acknowledged.
    pub fn majority_acked(&mut self, now: Millis) {
        if self.lost_at.is_some() {
            self.acked_at = self.acked_at.max(now);
        }
    }

    /// `peer` answered at `now`.
    pub fn heard(&mut self, peer: u64, now: Millis) {
        if self.lost_at.is_none() {
            return;
        }
        match self.heard.iter_mut().find(|(p, _)| *p == peer) {
            Some(h) => h.1 = h.1.max(now),
            None => self.heard.push((peer, now)),
        }
    }

    /// How long no majority of `members` (this node included, which
    /// always counts) answered; 0 while the session is connected.
    pub fn silent(&self, now: Millis, members: usize) -> Millis {
        let Some(lost_at) = self.lost_at else {
            return 0;
        };
        let lost_at = lost_at.max(self.acked_at);
        let mut times: Vec<Millis> = self.heard.iter().map(|h| h.1).collect();
        times.sort_unstable_by(|a, b| b.cmp(a));
        // This node and the (majority - 1) peers heard most recently.
        let need = super::viewchange::majority(members).saturating_sub(1);
        let majority_at = match need {
            0 => now,
            n => times.get(n - 1).copied().unwrap_or(lost_at).max(lost_at),
        };
        now.saturating_sub(majority_at)
    }
}

/// How long a leader's appended entries have waited for the commit point.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitProgress {
    /// The commit point last seen, and since when the oldest entry above
    /// it waits (None: nothing waits).
    waiting: Option<(u64, Millis)>,
}

impl CommitProgress {
    /// The leader's log ends at `last` and its commit point is `committed`
    /// at `now`; returns how long the oldest uncommitted entry has waited
    /// without the commit point moving.
    pub fn observe(&mut self, committed: u64, last: u64, now: Millis) -> Millis {
        if committed >= last {
            self.waiting = None;
            return 0;
        }
        match self.waiting {
            Some((c, since)) if c == committed => now.saturating_sub(since),
            _ => {
                self.waiting = Some((committed, now));
                0
            }
        }
    }

    /// Forget (the node stopped leading).
    pub fn reset(&mut self) {
        self.waiting = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connected_leader_never_stops_on_this_rule() {
        assert_eq!(
            session_loss(Session::Connected, 1_000_000, 1_000_000, Some(9), 100),
            None
        );
    }

    #[test]
    fn a_leader_without_zookeeper_serves_while_a_majority_acks() {
        // ZooKeeper gone for far longer than the session timeout, expired
        // or not: the commit point keeps moving, so the lead is kept.
        assert_eq!(
            session_loss(Session::Disconnected(60_000), 0, 0, None, 100),
            None
        );
        assert_eq!(session_loss(Session::Expired, 99, 99, None, 100), None);
    }

    #[test]
    fn a_leader_without_zookeeper_and_without_a_majority_stops() {
        let loss = session_loss(Session::Disconnected(5000), 100, 0, None, 100).unwrap();
        assert_eq!(loss.stuck, 100);
        let loss = session_loss(Session::Disconnected(5000), 0, 120, None, 100).unwrap();
        assert_eq!(loss.stuck, 120);
        let loss = session_loss(Session::Disconnected(5000), 100, 0, None, 100).unwrap();
        assert_eq!(
            loss.to_string(),
            "ZooKeeper unreachable for 5000 ms and no majority acknowledged for 100 ms"
        );
        assert!(session_loss(Session::Expired, 250, 0, None, 100).is_some());
        let loss = session_loss(Session::Expired, 0, 0, Some(7), 100).unwrap();
        assert_eq!(
            loss.to_string(),
            "the ZooKeeper session expired and a peer promised view 7"
        );
    }

    #[test]
    fn progress_counts_from_the_last_move_of_the_commit_point() {
        let mut p = CommitProgress::default();
        assert_eq!(p.observe(5, 5, 10), 0, "nothing waits");
        assert_eq!(p.observe(5, 7, 20), 0, "starts waiting");
        assert_eq!(p.observe(5, 8, 70), 50);
        assert_eq!(p.observe(6, 8, 80), 0, "the commit moved: a majority acks");
        assert_eq!(p.observe(6, 9, 130), 50);
        assert_eq!(p.observe(9, 9, 140), 0);
        assert_eq!(p.observe(9, 10, 150), 0);
        p.reset();
        assert_eq!(p.observe(9, 10, 500), 0);
    }

    #[test]
    fn contact_counts_from_the_loss_then_from_the_majoritys_last_answer() {
        let mut c = Contact::default();
        assert_eq!(c.silent(1000, 3), 0, "connected");
        assert!(!c.probe_due(1000, 50));
        c.lost(1000, 1000);
        assert!(c.probe_due(1000, 50));
        assert!(!c.probe_due(1040, 50));
        assert!(c.probe_due(1050, 50));
        assert_eq!(c.silent(1100, 3), 100, "nobody answered since the loss");
        c.heard(2, 1100);
        assert_eq!(c.silent(1300, 3), 200, "2 of 3");
        assert_eq!(c.silent(1300, 5), 300, "2 of 5 is no majority");
        c.heard(3, 1200);
        assert_eq!(c.silent(1300, 5), 200, "the older of the two answers");
        c.lost(1400, 1400);
        assert_eq!(
            c.silent(1400, 3),
            200,
            "a second loss report changes nothing"
        );
        assert_eq!(c.silent(5000, 1), 0, "alone, it is its own majority");
        c.reset();
        assert_eq!(c.silent(5000, 3), 0);
        c.majority_acked(5950);
        c.lost(5900, 6000);
        assert_eq!(
            c.silent(6000, 3),
            100,
            "counted from the disconnection: acks before the loss was seen do not count"
        );
        c.majority_acked(6500);
        assert_eq!(
            c.silent(6600, 3),
            100,
            "acks of a majority count as answers"
        );
        c.reset();
        c.lost(100, 6700);
        assert_eq!(
            c.silent(6700, 3),
            200,
            "the session flickered back: acks seen while it was lost still count"
        );
    }
}
