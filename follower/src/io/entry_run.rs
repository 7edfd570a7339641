//! One value of the log store: a run of entries that lay back to back in
//! the ring, stored under the first one's seq.
//!
//! Why runs: a backup persists about a dozen entries per write under load,
//! and with one key per entry RocksDB's memtable insert (a skiplist search
//! per key) was a quarter of its ingest thread. One key per run makes that
//! one insert per write.
//!
//! Layout: the first entry's ring position (u64 LE), then the encoded
//! entries back to back, each exactly its footprint (as the ring holds
//! it). A value that holds one entry, what every value was before runs,
//! reads the same. Runs are cut at [`RUN_BYTES`] so that reading one entry
//! never reads much more.

use lockstep_common::entry::EntryHeader;

/// A run grows to about this many bytes; an entry that would take it past
/// starts the next run (an entry larger than this is a run of its own).
pub const RUN_BYTES: usize = 64 << 10;

/// Why a stored value does not read as a run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// Shorter than the ring position.
    #[error("the value of run {seq} is too short")]
    Short {
        /// The run's first seq.
        seq: u64,
    },
    /// An entry header does not parse.
    #[error("entry {seq}'s header: {what}")]
    Header {
        /// The entry's seq.
        seq: u64,
        /// What is wrong.
        what: String,
    },
    /// The value ends inside an entry.
    #[error("the value ends inside entry {seq}")]
    Truncated {
        /// The entry cut short.
        seq: u64,
    },
    /// An entry does not follow the one before it.
    #[error("entry {got} where {want} should follow")]
    Seq {
        /// Seq read.
        got: u64,
        /// Seq expected.
        want: u64,
    },
}

impl RunError {
    /// The seq where the run stopped reading.
    pub fn seq(&self) -> u64 {
        match self {
            RunError::Short { seq }
            | RunError::Header { seq, .. }
            | RunError::Truncated { seq } => *seq,
            RunError::Seq { want, .. } => *want,
        }
    }
}

/// One entry of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunEntry<'a> {
    /// Its seq.
    pub seq: u64,
    /// Its ring position.
    pub pos: u64,
    /// Its encoded bytes.
    pub bytes: &'a [u8],
}

/// The entries of the run stored under `first`, in order.
pub fn entries(first: u64, value: &[u8]) -> RunEntries<'_> {
    match value.split_first_chunk::<8>() {
        Some((pos, rest)) => RunEntries {
            rest,
            seq: first,
            pos: u64::from_le_bytes(*pos),
            failed: None,
        },
        None => RunEntries {
            rest: &[],
            seq: first,
            pos: 0,
            failed: Some(RunError::Short { seq: first }),
        },
    }
}

/// Iterator over a run's entries; yields an error once and stops (a value
/// too short for its position yields only that).
#[derive(Debug)]
pub struct RunEntries<'a> {
    rest: &'a [u8],
    seq: u64,
    pos: u64,
    /// Set once reading failed: yielded, then nothing more.
    failed: Option<RunError>,
}

impl<'a> Iterator for RunEntries<'a> {
    type Item = Result<RunEntry<'a>, RunError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.failed.take() {
            self.rest = &[];
            return Some(Err(e));
        }
        if self.rest.is_empty() {
            return None;
        }
        let h = match EntryHeader::parse(self.rest) {
            Ok(h) => h,
            Err(e) => {
                self.failed = Some(RunError::Header {
                    seq: self.seq,
                    what: e.to_string(),
                });
                return self.next();
            }
        };
        if h.seq != self.seq {
            self.failed = Some(RunError::Seq {
                got: h.seq,
                want: self.seq,
            });
            return self.next();
        }
        let take = h.footprint();
        if self.rest.len() < take {
            self.failed = Some(RunError::Truncated { seq: self.seq });
            return self.next();
        }
        let (bytes, rest) = self.rest.split_at(take);
        let e = RunEntry {
            seq: self.seq,
            pos: self.pos,
            bytes,
        };
        self.rest = rest;
        self.seq += 1;
        self.pos += take as u64;
        Some(Ok(e))
    }
}

/// Builds the runs of one append: entries go into the open run while they
/// continue it in the ring and it has room.
#[derive(Debug, Default)]
pub struct RunBuilder {
    value: Vec<u8>,
    first: u64,
    end: u64,
    /// Bytes of entries still to come (see [`RunBuilder::expecting`]).
    expected: usize,
}

impl RunBuilder {
    /// A builder for `bytes` of entries in all: each run's buffer is sized
    /// once as it starts (grown entry by entry, a run of a dozen entries
    /// took several reallocations).
    pub fn expecting(bytes: usize) -> RunBuilder {
        RunBuilder {
            expected: bytes,
            ..RunBuilder::default()
        }
    }

    /// Adds entry `seq` at ring position `pos`; `bytes` must be exactly
    /// its footprint (the caller checks). Returns the run it closed, if
    /// this entry starts a new one: `(first seq, value)`.
    pub fn push(&mut self, seq: u64, pos: u64, bytes: &[u8]) -> Option<(u64, Vec<u8>)> {
        let continues = !self.value.is_empty()
            && pos == self.end
            && self.value.len() + bytes.len() <= RUN_BYTES + 8;
        let done = if continues { None } else { self.take() };
        if self.value.is_empty() {
            self.value
                .reserve_exact(8 + self.expected.min(RUN_BYTES).max(bytes.len()));
            self.value.extend_from_slice(&pos.to_le_bytes());
            self.first = seq;
        }
        self.value.extend_from_slice(bytes);
        self.end = pos + bytes.len() as u64;
        self.expected = self.expected.saturating_sub(bytes.len());
        done
    }

    /// The open run, if any: `(first seq, value)`.
    pub fn take(&mut self) -> Option<(u64, Vec<u8>)> {
        if self.value.is_empty() {
            return None;
        }
        Some((self.first, std::mem::take(&mut self.value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_common::entry::{encode, Kind};
    use proptest::prelude::*;

    fn e(seq: u64, payload_len: usize) -> Vec<u8> {
        encode(
            &EntryHeader::new(Kind::Data, 1, seq, 1, 0),
            &vec![seq as u8; payload_len],
        )
    }

    /// Pushes entries `(seq, pos, bytes)` and returns the runs written.
    fn build(es: &[(u64, u64, Vec<u8>)]) -> Vec<(u64, Vec<u8>)> {
        let mut b = RunBuilder::default();
        let mut runs: Vec<(u64, Vec<u8>)> = es
            .iter()
            .filter_map(|(seq, pos, bytes)| b.push(*seq, *pos, bytes))
            .collect();
        runs.extend(b.take());
        runs
    }

    #[test]
    fn a_run_sized_for_its_append_never_grows() {
        let es: Vec<Vec<u8>> = (1..=12).map(|i| e(i, 100)).collect();
        let total: usize = es.iter().map(Vec::len).sum();
        let mut b = RunBuilder::expecting(total);
        let mut pos = 0;
        for (i, bytes) in es.iter().enumerate() {
            assert!(b.push(i as u64 + 1, pos, bytes).is_none());
            pos += bytes.len() as u64;
        }
        let (_, value) = b.take().unwrap();
        assert_eq!(value.len(), 8 + total);
        assert_eq!(value.capacity(), 8 + total, "sized once, exactly");
    }

    #[test]
    fn a_value_of_one_entry_reads_as_a_run_of_one() {
        let a = e(7, 10);
        let mut v = 4096u64.to_le_bytes().to_vec();
        v.extend_from_slice(&a);
        let got: Vec<_> = entries(7, &v).map(Result::unwrap).collect();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].seq, got[0].pos, got[0].bytes), (7, 4096, &a[..]));
    }

    #[test]
    fn a_jump_in_the_ring_starts_a_new_run() {
        let (a, b, c) = (e(1, 5), e(2, 5), e(3, 5));
        let runs = build(&[
            (1, 0, a.clone()),
            (2, a.len() as u64, b.clone()),
            (3, 0, c.clone()),
        ]);
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].0, 1);
        assert_eq!(runs[1].0, 3);
        let first: Vec<_> = entries(1, &runs[0].1).map(Result::unwrap).collect();
        assert_eq!(first[1].pos, a.len() as u64);
        assert_eq!(first[1].bytes, &b[..]);
    }

    #[test]
    fn a_value_cut_inside_an_entry_is_an_error() {
        let runs = build(&[(1, 0, e(1, 5)), (2, 128, e(2, 5))]);
        let v = &runs[0].1[..runs[0].1.len() - 1];
        let got: Vec<_> = entries(1, v).map(|r| r.map(|e| e.seq)).collect();
        assert_eq!(got, vec![Ok(1), Err(RunError::Truncated { seq: 2 })]);
    }

    #[test]
    fn a_wrong_seq_inside_a_run_is_an_error() {
        let runs = build(&[(1, 0, e(1, 5)), (2, 128, e(2, 5))]);
        let got: Vec<_> = entries(5, &runs[0].1).collect();
        assert_eq!(got, vec![Err(RunError::Seq { got: 1, want: 5 })]);
        let got: Vec<_> = entries(1, &[1, 2]).collect();
        assert_eq!(got, vec![Err(RunError::Short { seq: 1 })]);
    }

    proptest! {
        /// Whatever the sizes and jumps, the runs read back every entry
        /// with its seq, position and bytes, and stay near RUN_BYTES.
        #[test]
        fn runs_read_back_what_was_pushed(
            sizes in proptest::collection::vec((0usize..20_000, any::<bool>()), 1..60),
        ) {
            let mut pos = 0u64;
            let mut es = Vec::new();
            for (i, (len, jump)) in sizes.iter().enumerate() {
                if *jump {
                    pos += 64;
                }
                let bytes = e(i as u64 + 1, *len);
                es.push((i as u64 + 1, pos, bytes.clone()));
                pos += bytes.len() as u64;
            }
            let runs = build(&es);
            let mut read = Vec::new();
            for (first, v) in &runs {
                let n = entries(*first, v).count();
                prop_assert!(n == 1 || v.len() <= RUN_BYTES + 8);
                for r in entries(*first, v) {
                    let r = r.unwrap();
                    read.push((r.seq, r.pos, r.bytes.to_vec()));
                }
            }
            prop_assert_eq!(read, es);
        }
    }
}
