//! Trimming: how much of the adopted log a new view keeps.
//!
//! The leader of the adopted log's view, once deposed, knows where that
//! log became visible: its server consumed the view's inputs up to
//! `served` (`led` = `(view, served)`, from its promise), and the
//! hand-over fence makes that exact. Entries of the view above it were
//! never given to any server (backups apply only what the leader
//! committed, and it commits only what it handed over), so no client saw
//! their effect: the new view may drop them, and the old leader's server
//! stays in line with the log instead of having to be rebuilt. Committed
//! entries are always kept. Without that leader's promise the tail is
//! kept: it may have been served.

use super::viewchange::Adoption;

/// The adoption with the old leader's unserved tail dropped (see the
/// module doc).
pub fn trim_unserved(adopt: Adoption, led: Option<(u64, u64)>) -> Adoption {
    match led {
        Some((view, served)) if view == adopt.log_view && served < adopt.last_seq => Adoption {
            last_seq: served.max(adopt.committed),
            ..adopt
        },
        _ => adopt,
    }
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
        assert_eq!(trim_unserved(a, Some((3, 17))).last_seq, 17);
        // Never below what is known committed.
        assert_eq!(trim_unserved(a, Some((3, 10))).last_seq, 15);
        // Another view's log, or a candidate that did not lead: untouched.
        assert_eq!(trim_unserved(a, Some((2, 17))), a);
        assert_eq!(trim_unserved(a, None), a);
        assert_eq!(trim_unserved(a, Some((3, 25))), a);
    }
}
