//! The leader's `max_apply_lag` rule, and which backups it counts.
//!
//! A leader bounds how far its backups' servers may fall behind in
//! applying the log, so that a failover does not inherit a long backlog:
//! before it appends `seq` it waits until a majority of the cluster (itself
//! included: its server has everything) applied up to `seq -
//! max_apply_lag`. Only backups that *can* apply count: a server attached
//! to the backup's region, and the backup's follower reporting. A backup
//! without a server (or a dead one) never applies, so waiting for it would
//! hold every write for ever; when fewer than a majority can apply, the
//! leader goes on committing and says that the failover backlog grows.
//!
//! Backups report into the leader's region, every [`REPORT_PERIOD`] at
//! least: how far they applied, and a [`report_word`] (a count that moves
//! with each report, and whether it can apply: a server attached, not
//! stale). [`Appliers`] turns
//! what the leader's follower reads there into the set of backups that can
//! apply, which it publishes for the leader's preload; [`gate`] is the rule.

use std::time::Duration;

/// How often a backup reports at least (also when nothing moved).
pub const REPORT_PERIOD: Duration = Duration::from_millis(50);
/// A backup reports a new applied point at most this often: each report
/// is a write to the leader (over tcp a send, and a wake of the leader's
/// peer thread), and a report per apply step cost the leader's follower
/// more than the backup's apply itself. The bound it feeds is tens of
/// thousands of entries: a millisecond late changes nothing.
pub const REPORT_GAP: Duration = Duration::from_millis(1);

/// Whether a backup reports now: it applied up to `applied`, and last
/// reported `reported`, `since` ago.
pub fn report_due(applied: u64, reported: u64, since: Duration) -> bool {
    since >= REPORT_PERIOD || (applied != reported && since >= REPORT_GAP)
}

/// A backup whose report word did not move for this long is not counted:
/// its follower is gone or stuck.
pub const REPORT_STALE_MS: u64 = 1000;

/// What the leader does before appending an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Append: the apply lag is within bounds (or unbounded by config).
    Go,
    /// Wait until a majority of those that can apply reached this seq.
    Hold(u64),
    /// Append, although fewer than a majority can apply: a failover now
    /// would inherit a backlog that grows with every entry.
    Unbounded,
}

/// The rule. `seq`: the entry about to be appended; `max_apply_lag`: the
/// bound (0: none); `need`: a majority of the cluster; `backups`: for each
/// other member, how far it applied and whether it can apply.
pub fn gate(
    seq: u64,
    max_apply_lag: u64,
    need: usize,
    backups: impl IntoIterator<Item = (u64, bool)>,
) -> Gate {
    // The leader's own server consumed everything it logged.
    let mut applied = [0u64; 16];
    applied[0] = seq;
    let mut n = 1;
    for (seq, able) in backups {
        if able && n < applied.len() {
            applied[n] = seq;
            n += 1;
        }
    }
    if n < need {
        return Gate::Unbounded;
    }
    if max_apply_lag == 0 || seq <= max_apply_lag {
        return Gate::Go;
    }
    let floor = seq - max_apply_lag;
    if crate::quorum::acked_by(&applied[..n], need) >= floor {
        Gate::Go
    } else {
        Gate::Hold(floor)
    }
}

/// The word a backup reports beside its applied seq: `count` (which moves
/// with every report) and whether it can apply (a server is attached to
/// its region, and it is not stale).
pub fn report_word(count: u64, can_apply: bool) -> u64 {
    (count << 1) | can_apply as u64
}

/// Whether a report word says the backup can apply.
pub fn reports_can_apply(word: u64) -> bool {
    word & 1 == 1
}

/// One backup as the leader's follower last saw it.
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    /// The word last read (None: never since this node leads).
    word: Option<u64>,
    /// When the word last moved (None: not since this node leads).
    moved_at: Option<u64>,
}

/// Which backups can apply, from the report words the leader's follower
/// reads in its region (pure: the caller passes the time). A new one
/// for each time the node starts leading.
#[derive(Debug, Default)]
pub struct Appliers {
    seen: [Seen; 16],
}

impl Appliers {
    /// Notes node `id`'s report word, read at `now_ms` (any monotonic
    /// milliseconds); returns whether it can apply: it says so, and its
    /// word moved within [`REPORT_STALE_MS`] (a word seen once, maybe left
    /// from long ago, does not count until it moves).
    pub fn observe(&mut self, id: u64, word: u64, now_ms: u64) -> bool {
        let Some(s) = self.seen.get_mut(id as usize) else {
            return false;
        };
        match s.word {
            // Seen for the first time: it may be left from long ago.
            None => s.word = Some(word),
            Some(w) if w != word => {
                s.word = Some(word);
                s.moved_at = Some(now_ms);
            }
            Some(_) => {}
        }
        reports_can_apply(word)
            && s.moved_at
                .is_some_and(|t| now_ms.saturating_sub(t) < REPORT_STALE_MS)
    }
}

/// Whether a backup `lag` entries behind the commit point has caught up:
/// within `max_apply_lag` (or, with no bound configured, within the
/// default bound). Until then it is `catching-up`, not a healthy backup:
/// a failover to it would inherit the backlog.
pub fn caught_up(lag: u64, max_apply_lag: u64) -> bool {
    let bound = if max_apply_lag == 0 {
        crate::config::DEFAULT_MAX_APPLY_LAG
    } else {
        max_apply_lag
    };
    lag <= bound
}

/// What a leader (`me`, of `members`) says when fewer than a majority of
/// the nodes can apply (`appliers`: the backups that can, as a mask): who
/// cannot, and that the failover backlog grows. None while a majority can.
pub fn backlog_warning(me: u64, members: &[u64], appliers: u64) -> Option<String> {
    let backups = members.iter().filter(|&&id| id != me);
    let able = |id: u64| appliers & bit(id) != 0;
    let need = crate::quorum::majority(members.len());
    // The rule itself says when (its seq and bound play no part here).
    if gate(1, 0, need, backups.clone().map(|&id| (0, able(id)))) != Gate::Unbounded {
        return None;
    }
    let able = 1 + backups.clone().filter(|&&id| able(id)).count();
    let cannot: Vec<String> = backups
        .filter(|&&id| appliers & bit(id) == 0)
        .map(|id| id.to_string())
        .collect();
    let who = match cannot.as_slice() {
        [one] => format!("node {one} has"),
        many => format!("nodes {} have", many.join(", ")),
    };
    Some(format!(
        "only {able} of {} nodes can apply ({who} no server applying: none attached, stale, or its follower silent); writes go on, and a failover now inherits a backlog that grows with every write",
        members.len(),
    ))
}

/// Bit of node `id` in a mask of nodes.
pub fn bit(id: u64) -> u64 {
    1u64.checked_shl(id as u32).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_reports_progress_at_most_every_gap_and_always_every_period() {
        let ms = Duration::from_millis;
        assert!(!report_due(10, 5, Duration::ZERO));
        assert!(!report_due(10, 5, REPORT_GAP - Duration::from_micros(1)));
        assert!(report_due(10, 5, REPORT_GAP));
        assert!(!report_due(10, 10, ms(49)));
        assert!(report_due(10, 10, REPORT_PERIOD));
    }

    #[test]
    fn within_the_lag_or_without_a_bound_the_leader_goes_on() {
        assert_eq!(gate(10, 50, 2, [(0, true), (0, true)]), Gate::Go);
        assert_eq!(gate(1000, 0, 2, [(0, true), (0, true)]), Gate::Go);
        assert_eq!(gate(100, 50, 2, [(50, true), (0, true)]), Gate::Go);
    }

    #[test]
    fn a_majority_that_can_apply_but_lags_holds_the_leader() {
        assert_eq!(gate(100, 50, 2, [(49, true), (10, true)]), Gate::Hold(50));
        // Five nodes: two backups must reach the floor.
        assert_eq!(
            gate(100, 50, 3, [(90, true), (10, true), (0, true), (0, true)]),
            Gate::Hold(50)
        );
        assert_eq!(
            gate(100, 50, 3, [(90, true), (60, true), (0, true), (0, true)]),
            Gate::Go
        );
    }

    #[test]
    fn backups_that_cannot_apply_never_count() {
        // A high applied mark of a backup without a server does not let
        // the leader go on; the others decide.
        assert_eq!(gate(100, 50, 2, [(99, false), (10, true)]), Gate::Hold(50));
        assert_eq!(
            gate(100, 50, 3, [(99, false), (60, true), (60, true), (0, true)]),
            Gate::Go
        );
    }

    #[test]
    fn fewer_than_a_majority_able_to_apply_never_holds_writes() {
        // The case: one backup dead, the other without a server.
        assert_eq!(gate(100, 50, 2, [(0, false), (0, false)]), Gate::Unbounded);
        assert_eq!(gate(10, 50, 2, [(0, false), (0, false)]), Gate::Unbounded);
        assert_eq!(
            gate(100, 50, 3, [(0, true), (0, false), (0, false), (0, false)]),
            Gate::Unbounded
        );
        // A single node is its own majority.
        assert_eq!(gate(100, 50, 1, []), Gate::Go);
    }

    #[test]
    fn a_backup_counts_while_it_reports_with_a_server() {
        let mut a = Appliers::default();
        // Seen for the first time: its word may be left from long ago.
        assert!(!a.observe(2, report_word(7, true), 1000));
        assert!(a.observe(2, report_word(8, true), 1050));
        assert!(a.observe(2, report_word(8, true), 1050 + REPORT_STALE_MS - 1));
        // Silent for too long: its follower is gone.
        assert!(!a.observe(2, report_word(8, true), 1050 + REPORT_STALE_MS));
        assert!(a.observe(2, report_word(9, true), 3000));
        // Reporting, but no server attached.
        assert!(!a.observe(2, report_word(10, false), 3050));
        // Unknown ids never count.
        assert!(!a.observe(99, report_word(1, true), 3050));
    }

    #[test]
    fn a_backup_is_caught_up_within_the_bound() {
        assert!(caught_up(50, 50));
        assert!(!caught_up(51, 50));
        assert!(caught_up(0, 0));
        assert!(caught_up(crate::config::DEFAULT_MAX_APPLY_LAG, 0));
        assert!(!caught_up(crate::config::DEFAULT_MAX_APPLY_LAG + 1, 0));
    }

    #[test]
    fn the_backlog_warning_names_the_backups_that_cannot_apply() {
        // A majority can apply: no warning.
        for (me, members, able) in [
            (1, &[1, 2, 3][..], bit(2)),
            (1, &[1, 2, 3], bit(3)),
            (1, &[1, 2, 3], bit(2) | bit(3)),
            (1, &[1, 2, 3, 4, 5], bit(2) | bit(3)),
            (1, &[1], 0),
        ] {
            assert_eq!(
                backlog_warning(me, members, able),
                None,
                "{me} {members:?} {able}"
            );
        }
        let w = backlog_warning(2, &[1, 2, 3], 0).unwrap();
        assert!(
            w.starts_with("only 1 of 3 nodes can apply (nodes 1, 3 have no server"),
            "{w}"
        );
        let w = backlog_warning(1, &[1, 2, 3, 4, 5], bit(2)).unwrap();
        assert!(
            w.starts_with("only 2 of 5 nodes can apply (nodes 3, 4, 5 have"),
            "{w}"
        );
        let w = backlog_warning(1, &[1, 2], 0).unwrap();
        assert!(
            w.starts_with("only 1 of 2 nodes can apply (node 2 has no server"),
            "{w}"
        );
    }

    #[test]
    fn masks_have_one_bit_per_node() {
        assert_eq!(bit(1), 2);
        assert_eq!(bit(15), 1 << 15);
        assert_eq!(bit(64), 0);
    }
}
