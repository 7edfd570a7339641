//! Fencing: which views a replica still takes writes, entries and view
//! change requests of.
//!
//! A replica that promised view `v` (its region's view word) fences every
//! view below `v`: one-sided writes tagged with an older view are refused
//! by its region ([`accepts_write`]), entries of an older view are not
//! stored, and an older candidate gets `Outdated` ([`check_requested_view`]).
//! Entries are stored only from the leader the log follows ([`admits`]):
//! a node that promised a newer view but has not synced with its leader
//! yet stores nothing (failover bug 4: the check runs under the store lock
//! in the runtime, so a promise either sees a batch or fences it out).

/// Why a view change request is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ViewRefusal {
    /// This node promised a newer view already: the candidate tries above it.
    #[error("node {node} promised view {promised} already")]
    Outdated {
        /// The refusing node.
        node: u64,
        /// The view it promised.
        promised: u64,
    },
    /// The view is implausibly far above this node's own views (a stray
    /// message must not push the view to the top of the range).
    #[error("node {node}: view {view} is more than {step} above this node's view {own}", step = MAX_VIEW_STEP)]
    Implausible {
        /// The refusing node.
        node: u64,
        /// The requested view.
        view: u64,
        /// This node's own highest view (promised or log).
        own: u64,
    },
}

/// How far above a node's own view a `Prepare` or `NewView` may reach.
/// Views grow by one per attempt, so no real view change comes near; the
/// bound keeps a stray message from pushing a node's view to the top of
/// the range, from where no later view could pass it.
pub const MAX_VIEW_STEP: u64 = 1 << 32;

/// Whether a node that promised `promised` may accept a promise request or
/// entries of `view` (the view fence alone).
pub fn not_fenced(promised: u64, view: u64) -> bool {
    view >= promised
}

/// Whether a node that promised `promised` and whose log follows the
/// leader of `log_view` may store an entry of `view`: not from a fenced
/// view, and only from the leader its log follows.
pub fn admits(promised: u64, log_view: u64, view: u64) -> bool {
    not_fenced(promised, view) && view == log_view
}

/// Whether `view` is a plausible next view for a node whose own views
/// (promised, log) reach `own`.
pub fn plausible(own: u64, view: u64) -> bool {
    view <= own.saturating_add(MAX_VIEW_STEP)
}

/// Checks a view change request for `view` at node `node` against its own
/// views: not older than its promise, not implausibly far above it.
pub fn check_requested_view(
    node: u64,
    promised: u64,
    log_view: u64,
    view: u64,
) -> Result<(), ViewRefusal> {
    if !not_fenced(promised, view) {
        return Err(ViewRefusal::Outdated { node, promised });
    }
    let own = promised.max(log_view);
    if !plausible(own, view) {
        return Err(ViewRefusal::Implausible { node, view, own });
    }
    Ok(())
}

/// Whether a region in view `region_view` takes a one-sided write tagged
/// with the writer's view `write_view` (the transports' check: a newer
/// region refuses, and the writer learns the newer view).
pub fn accepts_write(region_view: u64, write_view: u64) -> bool {
    region_view <= write_view
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_promise_fences_older_views_and_an_unsynced_log_stores_nothing() {
        assert!(admits(3, 3, 3));
        assert!(!admits(4, 3, 3), "promised 4: view 3's entries are fenced");
        assert!(
            !admits(4, 3, 4),
            "promised 4, not synced yet: nothing stored"
        );
        assert!(admits(4, 4, 4));
        assert!(!admits(3, 2, 3));
    }

    #[test]
    fn requests_below_the_promise_are_outdated() {
        assert_eq!(
            check_requested_view(2, 5, 4, 4),
            Err(ViewRefusal::Outdated {
                node: 2,
                promised: 5
            })
        );
        assert_eq!(check_requested_view(2, 5, 4, 5), Ok(()));
        assert_eq!(check_requested_view(2, 5, 4, 6), Ok(()));
    }

    #[test]
    fn views_far_ahead_are_implausible() {
        assert!(plausible(3, 1003));
        assert!(plausible(3, 3 + MAX_VIEW_STEP));
        assert!(!plausible(3, 4 + MAX_VIEW_STEP));
        assert!(!plausible(3, u64::MAX));
        assert!(plausible(u64::MAX - 1, u64::MAX));
        assert!(matches!(
            check_requested_view(1, 3, 3, u64::MAX),
            Err(ViewRefusal::Implausible { .. })
        ));
    }

    #[test]
    fn regions_refuse_writes_of_older_views() {
        assert!(accepts_write(3, 3));
        assert!(accepts_write(3, 4));
        assert!(!accepts_write(4, 3));
    }
}
