//! A backup's check of one replay connection's output against the
//! leader's: what its server wrote that no leader digest has covered yet,
//! and the comparison when its server reads the connection's next input,
//! which brings the leader's digest (see `replay::Replay::serve`). Pure:
//! bytes in, verdicts out.
//!
//! The leader's digest of an input covers the bytes its client socket
//! took between its server's read of the input before and its read of this
//! one. A backup checks at the same moment of its own server: when it reads
//! that input. Its bytes are then the leader's, or more:
//!
//! - A backup's writes are dropped, so they always "take" everything, while
//!   the leader's socket takes less when its client reads late (the socket
//!   is full; the server keeps the rest and sends it in a later interval).
//! - A backup that hands a leader's turn over in two (past the server's
//!   `maxevents`) lets its server write, at the end of the first part, what
//!   the leader's wrote at the end of the whole turn, after this read.
//!
//! So a digest that matches a prefix of the backup's bytes is a match, and
//! the rest wait for the next interval, where the leader has them. A backup
//! that really wrote more than the leader is then counted one interval
//! later (not at all for a connection's last output). Bytes are kept only
//! until a digest covers them: a fast reader's connection keeps one reply
//! at a time.

use lockstep_common::entry::OutputDigest;

/// Bytes of unmatched output one connection keeps at most. Beyond it (or
/// beyond the process's [`Budget`]) the check loses track of where the
/// leader stands: the bytes are dropped, and differences are not counted
/// until a digest matches again.
pub const KEEP: usize = 4 << 20;

/// Bytes of unmatched output all connections of a backup's server keep
/// together at most (many connections that only receive, e.g. pub/sub
/// subscribers, get no digest to match until they send something).
pub const BUDGET: usize = 64 << 20;

/// What all connections keep, against [`BUDGET`].
#[derive(Debug, Default)]
pub struct Budget {
    kept: usize,
}

impl Budget {
    /// Bytes kept by all connections.
    pub fn kept(&self) -> usize {
        self.kept
    }
}

/// Bytes of a differing output shown in the divergence line.
pub const SHOWN: usize = 48;

/// What one comparison found.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The leader's bytes are this server's (or a prefix of them).
    Same,
    /// They differ, but the check had lost track (more than [`KEEP`]
    /// unmatched bytes were dropped): not a divergence.
    Unsure,
    /// They differ: this server wrote `len` bytes in the interval,
    /// starting with `shown`.
    Differs {
        /// Bytes this server wrote in the interval.
        len: usize,
        /// Their first bytes (at most [`SHOWN`]).
        shown: Vec<u8>,
    },
}

/// One connection's output that no leader digest covered yet.
#[derive(Debug, Default)]
pub struct PendingOutput {
    bytes: Vec<u8>,
    /// Bytes were dropped over [`KEEP`]: differences are not counted until
    /// a digest matches again.
    unsynced: bool,
}

impl PendingOutput {
    /// The server wrote `s`.
    pub fn write(&mut self, s: &[u8], budget: &mut Budget) {
        if self.bytes.len() + s.len() > KEEP || budget.kept + s.len() > BUDGET {
            self.forget(budget);
            self.unsynced = true;
            return;
        }
        self.bytes.extend_from_slice(s);
        budget.kept += s.len();
    }

    /// Drops what it keeps (the connection ended, or the check lost
    /// track).
    pub fn forget(&mut self, budget: &mut Budget) {
        budget.kept -= self.bytes.len();
        self.bytes = Vec::new();
    }

    /// Compares what was written with the interval the digest `leader`
    /// (packed, see [`OutputDigest::pack`]) covers: all of it, or a prefix
    /// (the rest is the next interval's). Covered bytes are forgotten; a
    /// differing interval is forgotten whole, so one difference counts
    /// once.
    pub fn check(&mut self, leader: u64, budget: &mut Budget) -> Verdict {
        let end = self.bytes.len();
        let interval = &self.bytes[..end];
        let (_, leader_len) = OutputDigest::unpack(leader);
        let prefix = leader_len as usize;
        let matched = if OutputDigest::same(digest(interval).pack(), leader) {
            Some(end)
        } else if prefix < end && OutputDigest::same(digest(&interval[..prefix]).pack(), leader) {
            // The leader's client took less so far, or its server wrote
            // the rest after this read.
            Some(prefix)
        } else {
            None
        };
        let verdict = match matched {
            Some(n) => {
                self.consume(n, budget);
                self.unsynced = false;
                return Verdict::Same;
            }
            None if self.unsynced => Verdict::Unsure,
            None => Verdict::Differs {
                len: end,
                shown: interval[..end.min(SHOWN)].to_vec(),
            },
        };
        self.consume(end, budget);
        verdict
    }

    /// Forgets the interval a digest would have covered, unchecked (the
    /// leader withheld its server's output).
    pub fn skip(&mut self, budget: &mut Budget) {
        self.consume(self.bytes.len(), budget);
    }

    /// Unmatched bytes kept.
    pub fn kept(&self) -> usize {
        self.bytes.len()
    }

    fn consume(&mut self, n: usize, budget: &mut Budget) {
        budget.kept -= n;
        self.bytes.drain(..n);
        if self.bytes.is_empty() && self.bytes.capacity() > 1 << 20 {
            // A burst is over: give its memory back.
            self.bytes = Vec::new();
        }
    }
}

/// The digest of `bytes`.
pub fn digest(bytes: &[u8]) -> OutputDigest {
    let mut d = OutputDigest::default();
    d.update(bytes);
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn packed(b: &[u8]) -> u64 {
        digest(b).pack()
    }

    /// The digest of a leader whose client's socket refused some output,
    /// as leaders used to flag it (logs written then still replay).
    fn backlogged(b: &[u8]) -> u64 {
        digest(b).pack() | OutputDigest::BACKLOGGED
    }

    #[test]
    fn the_same_output_matches_and_is_forgotten() {
        let mut p = PendingOutput::default();
        let mut b = Budget::default();
        p.write(b"+OK\r\n", &mut b);
        assert_eq!(p.check(packed(b"+OK\r\n"), &mut b), Verdict::Same);
        assert_eq!(p.kept(), 0);
        // No output on both sides matches too.
        assert_eq!(p.check(packed(b""), &mut b), Verdict::Same);
    }

    #[test]
    fn bytes_past_the_leaders_interval_wait_for_the_next_one() {
        let mut p = PendingOutput::default();
        let mut b = Budget::default();
        // The backup's server wrote the second reply before this read; the
        // leader's wrote it after.
        p.write(b":1\r\n", &mut b);
        p.write(b":2\r\n", &mut b);
        assert_eq!(p.check(packed(b":1\r\n"), &mut b), Verdict::Same);
        assert_eq!(p.check(packed(b":2\r\n"), &mut b), Verdict::Same);
        // A reply too many here shows in the next interval.
        p.write(b":3\r\n", &mut b);
        p.write(b":3\r\n", &mut b);
        assert_eq!(p.check(packed(b":3\r\n"), &mut b), Verdict::Same);
        p.write(b":4\r\n", &mut b);
        assert!(matches!(
            p.check(packed(b":4\r\n"), &mut b),
            Verdict::Differs { len: 8, .. }
        ));
    }

    #[test]
    fn a_late_reader_s_leader_bytes_are_a_prefix_and_the_rest_follows() {
        let mut p = PendingOutput::default();
        let mut b = Budget::default();
        let reply = vec![b'x'; 10_000];
        p.write(&reply, &mut b);
        // The leader's socket took 3000 bytes of it, then 0, then the rest.
        assert_eq!(p.check(backlogged(&reply[..3000]), &mut b), Verdict::Same);
        p.write(b":5\r\n", &mut b);
        assert_eq!(p.check(backlogged(b""), &mut b), Verdict::Same);
        let mut rest = reply[3000..].to_vec();
        rest.extend_from_slice(b":5\r\n");
        assert_eq!(p.check(packed(&rest), &mut b), Verdict::Same);
        assert_eq!(p.kept(), 0);
    }

    #[test]
    fn a_real_difference_is_named_once_and_the_check_starts_over() {
        let mut p = PendingOutput::default();
        let mut b = Budget::default();
        p.write(b":863340\r\n", &mut b);
        assert_eq!(
            p.check(packed(b":1\r\n"), &mut b),
            Verdict::Differs {
                len: 9,
                shown: b":863340\r\n".to_vec()
            }
        );
        p.write(b"+OK\r\n", &mut b);
        assert_eq!(p.check(packed(b"+OK\r\n"), &mut b), Verdict::Same);
        // More bytes on the leader than here is a difference, not a prefix.
        p.write(b"+O", &mut b);
        assert!(matches!(
            p.check(packed(b"+OK\r\n"), &mut b),
            Verdict::Differs { len: 2, .. }
        ));
    }

    #[test]
    fn past_the_keep_bound_differences_are_not_counted_until_a_match() {
        let mut p = PendingOutput::default();
        let mut b = Budget::default();
        let chunk = vec![b'y'; 1 << 20];
        for _ in 0..(KEEP >> 20) + 1 {
            p.write(&chunk, &mut b);
        }
        assert!(p.kept() < KEEP);
        assert_eq!(p.check(packed(b"whatever"), &mut b), Verdict::Unsure);
        p.write(b"+OK\r\n", &mut b);
        assert_eq!(p.check(packed(b"+OK\r\n"), &mut b), Verdict::Same);
        p.write(b"-ERR\r\n", &mut b);
        assert!(matches!(
            p.check(packed(b"+OK\r\n"), &mut b),
            Verdict::Differs { .. }
        ));
    }

    #[test]
    fn all_connections_share_one_budget_and_give_back_what_they_drop() {
        let mut b = Budget::default();
        let chunk = vec![b'z'; KEEP];
        let mut conns: Vec<PendingOutput> = (0..BUDGET / KEEP + 1)
            .map(|_| PendingOutput::default())
            .collect();
        for c in &mut conns {
            c.write(&chunk, &mut b);
        }
        assert_eq!(b.kept(), BUDGET);
        let last = conns.last_mut().unwrap();
        assert_eq!(last.kept(), 0);
        assert_eq!(last.check(packed(b"x"), &mut b), Verdict::Unsure);
        conns[0].forget(&mut b);
        assert_eq!(b.kept(), BUDGET - KEEP);
        assert_eq!(conns[1].check(packed(&chunk), &mut b), Verdict::Same);
        assert_eq!(b.kept(), BUDGET - 2 * KEEP);
    }

    #[test]
    fn a_withheld_interval_is_skipped() {
        let mut p = PendingOutput::default();
        let mut b = Budget::default();
        p.write(b"lost", &mut b);
        p.skip(&mut b);
        p.write(b"+OK\r\n", &mut b);
        assert_eq!(p.check(packed(b"+OK\r\n"), &mut b), Verdict::Same);
    }

    proptest! {
        /// However a leader's socket splits one output stream into
        /// intervals (each interval's bytes what it took by then, never
        /// more than was written), the backup finds no difference.
        #[test]
        fn any_split_of_the_same_stream_matches(
            replies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 1..30),
            took in proptest::collection::vec(0.0f64..=1.0, 30),
        ) {
            let mut p = PendingOutput::default();
            let mut b = Budget::default();
            let mut written = Vec::new();
            let mut sent = 0usize;
            for (i, r) in replies.iter().enumerate() {
                p.write(r, &mut b);
                written.extend_from_slice(r);
                        // The leader's socket took some of what is unsent.
                let upto = sent + ((written.len() - sent) as f64 * took[i]) as usize;
                let d = digest(&written[sent..upto]).pack();
                prop_assert_eq!(p.check(d, &mut b), Verdict::Same);
                sent = upto;
            }
            // It takes the rest at last.
                prop_assert_eq!(p.check(packed(&written[sent..]), &mut b), Verdict::Same);
            prop_assert_eq!(p.kept(), 0);
        }
    }
}
