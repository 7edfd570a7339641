//! Commit computation: what a leader may call committed, and what a backup
//! may learn from the commit points it is told.
//!
//! A seq is committed once a majority (the leader included) stored it in
//! the leader's view: the ack array proves it ([`leader_commit`]). The
//! leader never commits past what its server was handed (in input-commit
//! mode the preload hands an input over only once it is committed; the
//! commit word then stays at most the served point). Backups learn the
//! commit point from entry headers and from the leader's commit record;
//! either says something only about a log that follows that leader's view
//! ([`learn`], [`learn_record`]): a newer leader's commit point arriving
//! before this node joined its view would otherwise "commit" this log's
//! uncommitted tail of the old view.

use lockstep_common::quorum;
use lockstep_common::region::commit_of_view;

/// The commit point a leader's ack array proves: the highest seq a
/// majority of `ids` acknowledged (`ack(id)`), never past `served`.
pub fn leader_commit(
    ids: impl IntoIterator<Item = u64>,
    majority: usize,
    ack: impl Fn(u64) -> u64,
    served: u64,
) -> u64 {
    quorum::reached_by(ids, majority, ack).min(served)
}

/// The commit point of the leader of `view`: what the ack array proves
/// (`computed`, [`leader_commit`]) or what its region's commit word says,
/// whichever is higher. The word is `(record view, seq)`: the view's start
/// sets its seq, and the leader's preload raises it from the same ack
/// array when an output waits (a writer without a server, like the
/// benchmark's, raises it alone) — but a newer view's leader writes its
/// own commit records there too, which say nothing of this log
/// ([`commit_of_view`]).
pub fn leader_point(computed: u64, word: (u64, u64), view: u64) -> u64 {
    let (record_view, seq) = word;
    commit_of_view(record_view, seq, view).map_or(computed, |seq| computed.max(seq))
}

/// A backup's commit point after it learned that `seq` is committed, if
/// its log follows the view it is in (`log_view == view`); else unchanged.
pub fn learn(committed: u64, seq: u64, log_view: u64, view: u64) -> u64 {
    if log_view == view {
        committed.max(seq)
    } else {
        committed
    }
}

/// The seq a commit record `(record_view, seq)` lets a node whose log
/// follows `log_view` and ends at `persisted` take as committed, if any:
/// only a record of that very view, and never past its own log.
pub fn learn_record(record_view: u64, seq: u64, log_view: u64, persisted: u64) -> Option<u64> {
    (record_view == log_view).then_some(seq.min(persisted))
}

/// What a batch of entries read from the ring lets a backup take as
/// committed: the highest commit point their headers carry, never past
/// the batch's last seq.
pub fn learn_from_batch(last_committed: impl IntoIterator<Item = u64>, last: u64) -> u64 {
    last_committed.into_iter().max().unwrap_or(0).min(last)
}

/// How far a backup may apply: what is committed and stored. A node that
/// rebuilds its server before leading (it is the leader of a view it has
/// not started serving yet) applies everything it stored.
pub fn apply_target(committed: u64, persisted: u64, rebuilding_leader: bool) -> u64 {
    if rebuilding_leader {
        persisted
    } else {
        committed.min(persisted)
    }
}

/// Whether a node rebuilding its server before leading serves now: its
/// log follows the view it promised (the view started here) and its
/// server applied everything up to `target` ([`apply_target`]).
pub fn rebuilt(
    rebuilding_leader: bool,
    log_view: u64,
    promised: u64,
    applied: u64,
    target: u64,
) -> bool {
    rebuilding_leader && log_view == promised && applied >= target
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rebuilding_leader_serves_once_its_view_started_and_its_server_caught_up() {
        assert!(rebuilt(true, 4, 4, 10, 10));
        assert!(!rebuilt(false, 4, 4, 10, 10));
        assert!(!rebuilt(true, 3, 4, 10, 10));
        assert!(!rebuilt(true, 4, 4, 9, 10));
    }

    #[test]
    fn a_commit_word_raised_by_the_preload_counts() {
        assert_eq!(leader_point(7, (0, 9), 2), 9);
        assert_eq!(leader_point(7, (2, 9), 2), 9);
        assert_eq!(leader_point(7, (1, 3), 2), 7);
        assert_eq!(leader_point(7, (3, 40), 2), 7, "a newer view's record");
    }

    #[test]
    fn a_majority_of_acks_commits_but_never_past_what_was_served() {
        let acks = [0, 10, 7, 3];
        assert_eq!(leader_commit([1, 2, 3], 2, |i| acks[i as usize], 99), 7);
        assert_eq!(leader_commit([1, 2, 3], 2, |i| acks[i as usize], 5), 5);
        assert_eq!(leader_commit([1, 2, 3], 3, |i| acks[i as usize], 99), 3);
    }

    #[test]
    fn commit_points_of_another_view_teach_nothing() {
        assert_eq!(learn(5, 9, 3, 3), 9);
        assert_eq!(learn(5, 4, 3, 3), 5, "never goes back");
        assert_eq!(learn(5, 9, 3, 4), 5, "promised 4, log still follows 3");
        assert_eq!(learn_record(3, 12, 3, 10), Some(10));
        assert_eq!(learn_record(4, 12, 3, 20), None);
    }

    #[test]
    fn a_batch_teaches_at_most_its_own_end() {
        assert_eq!(learn_from_batch([3, 9, 5], 7), 7);
        assert_eq!(learn_from_batch([3, 4], 7), 4);
        assert_eq!(learn_from_batch([], 7), 0);
    }

    #[test]
    fn a_rebuilding_leader_applies_all_it_stored() {
        assert_eq!(apply_target(5, 9, false), 5);
        assert_eq!(apply_target(12, 9, false), 9);
        assert_eq!(apply_target(5, 9, true), 9);
    }
}
