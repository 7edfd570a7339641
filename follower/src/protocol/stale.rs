//! Stale detection: when a node's server no longer matches the log and
//! must be rebuilt (the node leaves the election and serves nothing until
//! its server and follower are restarted).
//!
//! Two ways: its server exited ([`server_exited`]; failover bug 5: a
//! leader whose server died steps down and goes stale), or it led a view
//! and its server consumed inputs the next view's log does not hold in
//! that order ([`demoted_server_fate`]; failover bug 3: output commit lets
//! a leader's server run an input before it is committed, and the new
//! view may drop it).

/// Whether the node's server exited: one attached once in this follower's
/// life (`pid` != 0) no longer holds its lock, and the node is not stale
/// already.
pub fn server_exited(pid: u64, attached: bool, stale: bool) -> bool {
    pid != 0 && !attached && !stale
}

/// What a demoted leader's server holds, measured against the new view's
/// log, when the node would stay up as a backup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerFate {
    /// The server consumed exactly a prefix of the new log: it resumes
    /// applying after `served`.
    InLine,
    /// The new log kept this seq of the led view, which the server never
    /// saw (its hand-over was fenced): replay cannot add it in the middle.
    Missed(u64),
    /// The server consumed this seq of the led view, which the new log does
    /// not hold (output commit: the server acts on inputs before they are
    /// committed, and the new view dropped an uncommitted one). Its state
    /// includes an input no replica applies.
    Dropped(u64),
}

/// Judges a demoted leader's server.
///
/// The server consumed the led view's inputs up to `served` (exact: the
/// hand-over fence). `cut` is where the node's log was cut to take the new
/// one (its commit point: everything up to it is the same everywhere).
/// `new_log` yields `(seq, view)` of the new log above `min(cut, served)`,
/// in order.
///
/// Entries carry the view of the leader that first wrote them, and a view
/// has one leader writing each seq once; so when the new log holds the led
/// view's own entry at `served`, it holds the led view's entries below it
/// too (a log that took that entry took its leader's prefix), and the
/// server consumed a prefix of the new log.
pub fn demoted_server_fate(
    led_view: u64,
    served: u64,
    cut: u64,
    new_log: impl IntoIterator<Item = (u64, u64)>,
) -> ServerFate {
    let mut holds_served = served <= cut;
    for (seq, view) in new_log {
        if seq == served && view == led_view {
            holds_served = true;
        }
        if seq > served && view == led_view {
            return ServerFate::Missed(seq);
        }
    }
    if holds_served {
        ServerFate::InLine
    } else {
        ServerFate::Dropped(served)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demoted_server_check() {
        use ServerFate::*;
        // Led view 3, served up to 10, log cut at 8.
        let fate = |log: &[(u64, u64)]| demoted_server_fate(3, 10, 8, log.iter().copied());
        assert_eq!(fate(&[(9, 3), (10, 3), (11, 4)]), InLine);
        assert_eq!(fate(&[(9, 3), (10, 3), (11, 3), (12, 3)]), Missed(11));
        // Output commit: the server ran 9 and 10, the new view kept neither.
        assert_eq!(fate(&[]), Dropped(10));
        assert_eq!(fate(&[(9, 3)]), Dropped(10));
        assert_eq!(fate(&[(9, 4), (10, 4)]), Dropped(10));
        // Everything served was committed (input commit): in line.
        assert_eq!(demoted_server_fate(3, 8, 8, []), InLine);
        assert_eq!(demoted_server_fate(3, 8, 10, [(9, 3)]), Missed(9));
    }

    proptest::proptest! {
        /// Against a model: a leader of view 3 wrote seqs `start..=top`,
        /// its server consumed up to `served`; the new log took the leader's
        /// entries up to `kept` and then entries of view 4. InLine exactly
        /// when the server's consumed inputs are a prefix of the new log.
        #[test]
        fn a_demoted_server_stays_only_when_it_consumed_a_prefix_of_the_new_log(
            start in 1u64..20, len in 0u64..20, served_off in 0u64..20,
            kept_off in 0u64..25, extra in 0u64..5,
        ) {
            let top = start + len;
            let served = (start + served_off).min(top);
            let kept = (start - 1 + kept_off).min(top);
            let cut = start - 1;
            let mut log: Vec<(u64, u64)> = (start..=kept).map(|s| (s, 3)).collect();
            log.extend((kept + 1..=kept + extra).map(|s| (s, 4)));
            let fate = demoted_server_fate(3, served, cut, log.iter().copied());
            let prefix = kept >= served;
            let missed = kept > served;
            match fate {
                ServerFate::InLine => proptest::prop_assert!(prefix && !missed),
                ServerFate::Missed(s) => proptest::prop_assert!(missed && s == served + 1),
                ServerFate::Dropped(s) => proptest::prop_assert!(!prefix && s == served),
            }
        }
    }

    #[test]
    fn a_server_that_exited_once_makes_the_node_stale() {
        assert!(server_exited(42, false, false));
        assert!(!server_exited(0, false, false), "never attached");
        assert!(!server_exited(42, true, false));
        assert!(!server_exited(42, false, true), "stale already");
    }
}
