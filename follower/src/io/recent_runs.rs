//! The log's newest runs, kept in memory as they were written: a backup's
//! apply thread reads the entries it hands its server right behind the
//! ingest, and reading them back from RocksDB (a seek through the memtable
//! and every level per read) was half of that thread's time.
//!
//! The runs held always end at the log's end and follow each other
//! without a gap, so a read that starts inside them is answered whole from
//! here; one that starts before them goes to RocksDB.

use std::collections::VecDeque;

use super::entry_run::{self, RunEntry, RunError};

/// How many bytes of runs are kept (the oldest go first).
pub const RECENT_BYTES: usize = 4 << 20;

/// The newest runs, oldest first: `(first seq, value)`.
#[derive(Debug, Default)]
pub struct RecentRuns {
    runs: VecDeque<(u64, Vec<u8>)>,
    bytes: usize,
}

impl RecentRuns {
    /// Adds the run that now ends the log (it must follow the last one
    /// held; the caller forgets everything when the log is cut).
    pub fn push(&mut self, first: u64, value: Vec<u8>) {
        self.bytes += value.len();
        self.runs.push_back((first, value));
        while self.bytes > RECENT_BYTES && self.runs.len() > 1 {
            self.pop_front();
        }
    }

    /// Forgets every run (the log was cut or restarted).
    pub fn clear(&mut self) {
        self.runs.clear();
        self.bytes = 0;
    }

    /// Forgets the runs that hold nothing after `seq` (compacted).
    pub fn forget_through(&mut self, seq: u64) {
        while self.runs.len() > 1 && self.runs[1].0 <= seq + 1 {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        if let Some((_, v)) = self.runs.pop_front() {
            self.bytes -= v.len();
        }
    }

    /// The first seq held, if any.
    pub fn first(&self) -> Option<u64> {
        self.runs.front().map(|(first, _)| *first)
    }

    /// The entries from `from` on, in order; None when `from` is before
    /// the runs held (read RocksDB instead).
    pub fn entries_from(
        &self,
        from: u64,
    ) -> Option<impl Iterator<Item = Result<RunEntry<'_>, RunError>> + '_> {
        if self.first()? > from {
            return None;
        }
        // From the last run that starts at or before `from`.
        let at = self.runs.partition_point(|(first, _)| *first <= from) - 1;
        Some(
            self.runs
                .range(at..)
                .flat_map(|(first, value)| entry_run::entries(*first, value))
                .filter(move |e| e.as_ref().map_or(true, |e| e.seq >= from)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::entry_run::RunBuilder;
    use lockstep_common::entry::{encode, EntryHeader, Kind};

    /// Runs of `per` entries from seq 1 to `last`, `len` payload bytes each.
    fn runs(last: u64, per: u64, len: usize) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        let mut pos = 0;
        for first in (1..=last).step_by(per as usize) {
            let mut b = RunBuilder::default();
            for seq in first..=(first + per - 1).min(last) {
                let bytes = encode(&EntryHeader::new(Kind::Data, 1, seq, 1, 0), &vec![0; len]);
                assert!(b.push(seq, pos, &bytes).is_none());
                pos += bytes.len() as u64;
            }
            out.extend(b.take());
        }
        out
    }

    fn seqs(r: &RecentRuns, from: u64, max: usize) -> Option<Vec<u64>> {
        Some(
            r.entries_from(from)?
                .take(max)
                .map(|e| e.unwrap().seq)
                .collect(),
        )
    }

    #[test]
    fn a_read_inside_the_runs_is_answered_and_one_before_them_is_not() {
        let mut r = RecentRuns::default();
        assert_eq!(seqs(&r, 1, 10), None);
        for (first, v) in runs(10, 4, 10) {
            r.push(first, v);
        }
        assert_eq!(seqs(&r, 6, 3), Some(vec![6, 7, 8]));
        assert_eq!(seqs(&r, 9, 10), Some(vec![9, 10]));
        assert_eq!(seqs(&r, 11, 10), Some(vec![]));
        r.forget_through(4);
        assert_eq!(r.first(), Some(5));
        r.forget_through(6);
        assert_eq!(r.first(), Some(5), "the run holding 7 stays");
        assert_eq!(seqs(&r, 4, 10), None);
        r.clear();
        assert_eq!(seqs(&r, 9, 10), None);
    }

    #[test]
    fn the_oldest_runs_go_past_the_bound() {
        let mut r = RecentRuns::default();
        let all = runs(4000, 16, 1000);
        for (first, v) in all {
            r.push(first, v);
        }
        assert!(r.bytes <= RECENT_BYTES);
        let first = r.first().unwrap();
        assert!(first > 1);
        assert_eq!(seqs(&r, first - 1, 1), None);
        assert_eq!(seqs(&r, first, 2), Some(vec![first, first + 1]));
    }
}
