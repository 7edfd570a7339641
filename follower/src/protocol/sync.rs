//! Making a log equal to another node's (a view change's sync, a late
//! join, the candidate adopting a log).
//!
//! Entries carry the view of the leader that wrote them and a view's
//! leader writes each seq once, so equal `(seq, view)` means equal logs up
//! to there. A sync keeps the prefix its log shares with the source
//! ([`PrefixSearch`]): the last entry is probed first (the usual case:
//! this log is a prefix of the source's), then the boundary is bisected
//! between the node's commit point ([`sync_point`], the same everywhere)
//! and its last entry. The search fails, cutting nothing, when the source
//! does not answer: a sync must never cut entries it cannot fetch again
//! (failover bug 1: a backup restarted after SIGKILL saved its commit
//! point lazily, and cutting to it while the leader was frozen wiped
//! entries the next view needed).

/// Where a node's log is certainly equal to every other node's: its own
/// commit point (everything up to it is the same on every node; what is
/// above may be a dead leader's uncommitted tail).
pub fn sync_point(last_seq: u64, committed: u64) -> u64 {
    committed.min(last_seq)
}

/// What [`PrefixSearch`] needs next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// Ask the source for the view of its entry `seq`, and compare it with
    /// this log's (the answer: [`PrefixSearch::answer`]).
    Ask(u64),
    /// Both logs are equal up to this seq.
    Done(u64),
}

/// The search for how much of this node's log the source's holds too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixSearch {
    last: u64,
    lo: u64,
    hi: u64,
    state: State,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing above the commit point: one probe proves the source answers.
    Alive,
    /// Probing the last entry.
    Last,
    /// Bisecting `lo..hi` (lo matches, hi does not).
    Bisect,
    /// Found.
    Done(u64),
}

impl PrefixSearch {
    /// A search over a log ending at `last` whose entries up to `floor`
    /// are known equal.
    pub fn new(last: u64, floor: u64) -> PrefixSearch {
        PrefixSearch {
            last,
            lo: floor,
            hi: last,
            state: if last <= floor {
                State::Alive
            } else {
                State::Last
            },
        }
    }

    /// The next probe, or the result.
    pub fn next(&self) -> Probe {
        match self.state {
            State::Alive => Probe::Ask(self.last.max(1)),
            State::Last => Probe::Ask(self.last),
            State::Bisect => Probe::Ask(self.lo + (self.hi - self.lo) / 2),
            State::Done(cut) => Probe::Done(cut),
        }
    }

    /// The answer to the last [`Probe::Ask`]: whether both logs hold the
    /// same entry (this log has one, and the source's has the same view).
    pub fn answer(&mut self, same: bool) {
        match self.state {
            State::Alive => self.state = State::Done(self.last),
            State::Last if same => self.state = State::Done(self.last),
            State::Last => self.settle(),
            State::Bisect => {
                let mid = self.lo + (self.hi - self.lo) / 2;
                if same {
                    self.lo = mid;
                } else {
                    self.hi = mid;
                }
                self.settle();
            }
            State::Done(_) => {}
        }
    }

    fn settle(&mut self) {
        self.state = if self.hi - self.lo > 1 {
            State::Bisect
        } else {
            State::Done(self.lo)
        };
    }

    /// Runs the whole search with `same(seq)` as the source's answers.
    pub fn run<E>(mut self, mut same: impl FnMut(u64) -> Result<bool, E>) -> Result<u64, E> {
        loop {
            match self.next() {
                Probe::Done(cut) => return Ok(cut),
                Probe::Ask(seq) => {
                    let s = same(seq)?;
                    self.answer(s);
                }
            }
        }
    }
}

/// Where a candidate cuts its log before fetching the adopted one: the
/// prefix it shares with the source, never above the adopted log's end
/// (but never below its own commit point).
pub fn adopt_cut(shared: u64, adopted_last: u64, floor: u64) -> u64 {
    shared.min(adopted_last.max(floor))
}

/// Why a finished sync does not leave the log the view needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SyncError {
    /// The leader's log is shorter than its view's start.
    #[error("node {leader} sent the log up to {end}, its view starts at {want}")]
    Short {
        /// The source.
        leader: u64,
        /// Where the log ends now.
        end: u64,
        /// Where it must reach.
        want: u64,
    },
}

/// Checks the end of a synced log against what a `NewView` announced.
pub fn check_synced(leader: u64, end: u64, want: Option<u64>) -> Result<(), SyncError> {
    match want {
        Some(want) if end < want => Err(SyncError::Short { leader, end, want }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (seq, view) logs; `mine` shares `shared` entries with `theirs`.
    fn search(mine: &[u64], theirs: &[u64], floor: u64) -> (u64, usize) {
        let mut probes = 0;
        let cut = PrefixSearch::new(mine.len() as u64, floor)
            .run(|seq| {
                probes += 1;
                let i = seq as usize - 1;
                Ok::<_, ()>(i < mine.len() && theirs.get(i) == mine.get(i))
            })
            .unwrap();
        (cut, probes)
    }

    #[test]
    fn a_prefix_of_the_leaders_log_is_kept_whole_with_one_probe() {
        assert_eq!(search(&[1, 1, 2, 2], &[1, 1, 2, 2, 2, 3], 1), (4, 1));
    }

    #[test]
    fn a_dead_leaders_tail_is_cut_at_the_first_difference() {
        assert_eq!(search(&[1, 1, 2, 2, 2, 2], &[1, 1, 2, 3, 3], 1).0, 3);
        assert_eq!(search(&[1, 1, 2, 2, 2, 2], &[1, 3, 3], 1).0, 1);
        assert_eq!(search(&[1, 2, 2], &[], 0).0, 0);
    }

    #[test]
    fn nothing_above_the_commit_point_still_asks_once() {
        assert_eq!(search(&[1, 1], &[1, 1, 1], 2), (2, 1));
        assert_eq!(search(&[], &[1], 0), (0, 1));
    }

    #[test]
    fn a_silent_source_cuts_nothing() {
        let r = PrefixSearch::new(10, 3).run(|_| Err::<bool, _>("no answer"));
        assert_eq!(r, Err("no answer"));
    }

    #[test]
    fn adopting_never_cuts_below_the_commit_point() {
        assert_eq!(adopt_cut(9, 7, 3), 7);
        assert_eq!(adopt_cut(9, 2, 3), 3);
        assert_eq!(adopt_cut(5, 7, 3), 5);
        assert_eq!(sync_point(9, 4), 4);
        assert_eq!(sync_point(3, 4), 3);
    }

    proptest::proptest! {
        /// The search finds exactly the shared prefix above the floor.
        #[test]
        fn finds_the_shared_prefix(
            shared in 0usize..40, mine_extra in 0usize..20, theirs_extra in 0usize..20, floor in 0usize..40,
        ) {
            let mut mine: Vec<u64> = vec![1; shared];
            let mut theirs = mine.clone();
            mine.extend(std::iter::repeat_n(2, mine_extra));
            theirs.extend(std::iter::repeat_n(3, theirs_extra));
            let floor = floor.min(shared) as u64;
            let (cut, probes) = search(&mine, &theirs, floor);
            proptest::prop_assert_eq!(cut, shared as u64);
            proptest::prop_assert!(probes <= 8);
        }
    }
}
