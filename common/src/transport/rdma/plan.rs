//! Work-request planning for the rdma transport, as pure functions: how one
//! `write` becomes RDMA WRITEs, which of them are signaled, and where their
//! bytes sit in the registered staging buffer until they complete.
//!
//! No verbs here: compiled (and tested) with or without the `rdma` feature.

use std::ops::Range;

/// One RDMA WRITE of a planned write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The bytes of the caller's buffer this WRITE carries.
    pub src: Range<usize>,
    /// Region offset they go to.
    pub remote: u64,
    /// Whether they fit the queue pair's inline data (posted from the
    /// caller's buffer, no staging copy).
    pub inline: bool,
}

impl Piece {
    /// Bytes carried.
    pub fn len(&self) -> usize {
        self.src.len()
    }

    /// Whether the piece carries nothing (never, for a planned piece).
    pub fn is_empty(&self) -> bool {
        self.src.is_empty()
    }

    /// Bytes this piece needs in the staging buffer.
    pub fn staged(&self) -> usize {
        if self.inline {
            0
        } else {
            self.len()
        }
    }
}

/// The WRITEs of one write of `len` bytes (a non-zero multiple of 8) at
/// region offset `offset`: the body (everything but the last 8 bytes) in
/// pieces of at most `max_piece` bytes, in order, then the last 8 bytes as
/// a WRITE of their own. A reliable connection executes WRITEs in the order
/// they were posted, so the last word (an entry's canary, an ack, a tail)
/// lands after the whole body.
#[derive(Clone, Debug)]
pub struct Plan {
    offset: u64,
    body: usize,
    at: usize,
    max_piece: usize,
    max_inline: usize,
    done: bool,
}

/// Plans a write; see [`Plan`]. `max_piece` is rounded down to a multiple
/// of 8 (at least 8).
pub fn plan_write(offset: u64, len: usize, max_piece: usize, max_inline: usize) -> Plan {
    debug_assert!(len >= 8 && len.is_multiple_of(8));
    Plan {
        offset,
        body: len.saturating_sub(8),
        at: 0,
        max_piece: (max_piece / 8 * 8).max(8),
        max_inline,
        done: len < 8,
    }
}

impl Plan {
    fn piece(&self, src: Range<usize>) -> Piece {
        Piece {
            remote: self.offset + src.start as u64,
            inline: src.len() <= self.max_inline,
            src,
        }
    }
}

impl Iterator for Plan {
    type Item = Piece;

    fn next(&mut self) -> Option<Piece> {
        if self.done {
            return None;
        }
        if self.at < self.body {
            let end = (self.at + self.max_piece).min(self.body);
            let p = self.piece(self.at..end);
            self.at = end;
            return Some(p);
        }
        self.done = true;
        Some(self.piece(self.body..self.body + 8))
    }
}

/// Selective signaling: a work request is signaled every `every` requests,
/// and sooner once the unsignaled ones hold `byte_limit` staged bytes, so
/// that completions keep freeing send-queue slots and staging space. A
/// completion of a signaled request on a reliable connection means every
/// request posted before it completed too.
#[derive(Clone, Debug)]
pub struct Signaler {
    every: u32,
    byte_limit: usize,
    unsignaled: u32,
    unsignaled_bytes: usize,
}

impl Signaler {
    /// Signals every `every` (at least 1) requests or `byte_limit` staged
    /// bytes.
    pub fn new(every: u32, byte_limit: usize) -> Signaler {
        Signaler {
            every: every.max(1),
            byte_limit,
            unsignaled: 0,
            unsignaled_bytes: 0,
        }
    }

    /// Whether the next request, staging `staged` bytes, is signaled.
    pub fn next(&mut self, staged: usize) -> bool {
        self.unsignaled += 1;
        self.unsignaled_bytes += staged;
        if self.unsignaled >= self.every || self.unsignaled_bytes >= self.byte_limit {
            self.reset();
            true
        } else {
            false
        }
    }

    /// Forgets the unsignaled requests (a new connection).
    pub fn reset(&mut self) {
        self.unsignaled = 0;
        self.unsignaled_bytes = 0;
    }
}

/// Byte ring over the staging buffer: bytes are reserved in posting order
/// and released in completion order (which is the same order on one
/// reliable connection). Positions grow forever; a position's offset in the
/// buffer is `pos % capacity`. A reservation never wraps inside itself: if
/// it does not fit before the end of the buffer, the rest of the lap is
/// skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagingRing {
    capacity: usize,
    head: u64,
    tail: u64,
}

impl StagingRing {
    /// An empty ring over `capacity` bytes.
    pub fn new(capacity: usize) -> StagingRing {
        StagingRing {
            capacity,
            head: 0,
            tail: 0,
        }
    }

    /// Reserves `n` contiguous bytes; returns their offset in the buffer
    /// and the position to release up to once the request using them
    /// completed. `None` when they do not fit now.
    pub fn reserve(&mut self, n: usize) -> Option<(usize, u64)> {
        if n == 0 {
            return Some(((self.head % self.capacity as u64) as usize, self.head));
        }
        let cap = self.capacity as u64;
        let mut start = self.head;
        let off = (start % cap) as usize;
        if off + n > self.capacity {
            start += cap - off as u64; // skip to the next lap
        }
        let end = start + n as u64;
        if end - self.tail > cap {
            return None;
        }
        self.head = end;
        Some(((start % cap) as usize, end))
    }

    /// Releases everything reserved before position `pos`.
    pub fn release(&mut self, pos: u64) {
        debug_assert!(pos <= self.head);
        self.tail = self.tail.max(pos.min(self.head));
    }

    /// Bytes reserved and not yet released (skipped lap ends included).
    pub fn used(&self) -> usize {
        (self.head - self.tail) as usize
    }

    /// Forgets every reservation (a new connection).
    pub fn clear(&mut self) {
        self.tail = self.head;
    }
}

/// The bookkeeping of posted work requests on one connection: how many are
/// outstanding, and which staging position each signaled one frees.
#[derive(Clone, Debug, Default)]
pub struct Inflight {
    posted: u64,
    completed: u64,
    /// (index of a signaled request, staging position it frees).
    marks: std::collections::VecDeque<(u64, u64)>,
}

impl Inflight {
    /// Records a posted request; returns its index (its `wr_id`).
    pub fn post(&mut self, signaled: bool, frees: u64) -> u64 {
        let i = self.posted;
        self.posted += 1;
        if signaled {
            self.marks.push_back((i, frees));
        }
        i
    }

    /// A signaled request `wr_id` completed: every request up to it did.
    /// Returns the staging position that may be released.
    pub fn complete(&mut self, wr_id: u64) -> Option<u64> {
        let mut frees = None;
        while let Some(&(i, pos)) = self.marks.front() {
            if i > wr_id {
                break;
            }
            frees = Some(pos);
            self.marks.pop_front();
        }
        self.completed = self.completed.max(wr_id.saturating_add(1).min(self.posted));
        frees
    }

    /// Requests posted and not known complete.
    pub fn outstanding(&self) -> u64 {
        self.posted - self.completed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(offset: u64, len: usize, max_piece: usize, max_inline: usize) -> Vec<Piece> {
        plan_write(offset, len, max_piece, max_inline).collect()
    }

    #[test]
    fn a_word_is_one_inline_write() {
        assert_eq!(
            pieces(4096, 8, 1 << 20, 64),
            vec![Piece {
                src: 0..8,
                remote: 4096,
                inline: true
            }]
        );
        assert!(!pieces(4096, 8, 1 << 20, 0)[0].inline);
    }

    #[test]
    fn body_then_last_word() {
        let p = pieces(1000 * 8, 128, 1 << 20, 64);
        assert_eq!(
            p,
            vec![
                Piece {
                    src: 0..120,
                    remote: 8000,
                    inline: false
                },
                Piece {
                    src: 120..128,
                    remote: 8120,
                    inline: true
                },
            ]
        );
        assert_eq!(p[0].staged(), 120);
        assert_eq!(p[1].staged(), 0);
        // A small entry's body goes inline too.
        assert!(pieces(0, 64, 1 << 20, 64).iter().all(|p| p.inline));
    }

    #[test]
    fn long_bodies_are_split_in_order_and_cover_everything_once() {
        for (len, max_piece) in [(72, 16), (4096, 1000), (1 << 20, 4096), (24, 8), (64, 3)] {
            let p = pieces(64, len, max_piece, 0);
            let last = p.last().unwrap();
            assert_eq!(
                last.src,
                len - 8..len,
                "the last word is a write of its own"
            );
            let mut at = 0;
            for piece in &p {
                assert_eq!(piece.src.start, at, "in order, no gap, no overlap");
                assert_eq!(piece.remote, 64 + at as u64);
                assert!(piece.len() <= (max_piece / 8 * 8).max(8));
                assert_eq!(piece.len() % 8, 0, "8-aligned pieces");
                at = piece.src.end;
            }
            assert_eq!(at, len);
        }
    }

    #[test]
    fn signaling_cadence() {
        let mut s = Signaler::new(4, usize::MAX);
        let got: Vec<bool> = (0..12).map(|_| s.next(0)).collect();
        assert_eq!(
            got,
            [false, false, false, true, false, false, false, true, false, false, false, true]
        );
        // Staged bytes force a signal sooner.
        let mut s = Signaler::new(64, 1000);
        assert!(!s.next(600));
        assert!(s.next(600));
        assert!(!s.next(10));
        // every = 1 signals everything; 0 is treated as 1.
        let mut s = Signaler::new(0, usize::MAX);
        assert!((0..5).all(|_| s.next(0)));
        let mut s = Signaler::new(3, usize::MAX);
        s.next(0);
        s.next(0);
        s.reset();
        assert!(!s.next(0));
    }

    #[test]
    fn staging_ring_reserves_releases_and_skips_lap_ends() {
        let mut r = StagingRing::new(100);
        assert_eq!(r.reserve(40), Some((0, 40)));
        assert_eq!(r.reserve(40), Some((40, 80)));
        // 40 more would cross the end: skip to the next lap, which is not
        // free yet.
        assert_eq!(r.reserve(40), None);
        r.release(40);
        assert_eq!(r.reserve(40), Some((0, 140)));
        assert_eq!(r.used(), 100);
        assert_eq!(r.reserve(8), None);
        r.release(140);
        assert_eq!(r.used(), 0);
        assert_eq!(r.reserve(60), Some((40, 200)));
        assert_eq!(r.reserve(0).map(|(o, _)| o), Some(0));
        assert_eq!(r.reserve(101), None, "never more than the buffer");
        r.clear();
        assert_eq!(r.used(), 0);
    }

    #[test]
    fn inflight_accounting() {
        let mut f = Inflight::default();
        let mut ring = StagingRing::new(1 << 10);
        let mut s = Signaler::new(3, usize::MAX);
        let mut ids = Vec::new();
        for _ in 0..7 {
            let (_, frees) = ring.reserve(16).unwrap();
            ids.push(f.post(s.next(16), frees));
        }
        assert_eq!(ids, (0..7).collect::<Vec<_>>());
        assert_eq!(f.outstanding(), 7);
        // Request 2 was signaled: 0..=2 are done, staging up to 48 is free.
        assert_eq!(f.complete(2), Some(48));
        assert_eq!(f.outstanding(), 4);
        assert_eq!(f.complete(5), Some(96));
        assert_eq!(f.outstanding(), 1);
        ring.release(96);
        assert_eq!(ring.used(), 16);
        // Unsignaled request 6 completes with the next signaled one.
        assert_eq!(f.post(true, 128), 7);
        assert_eq!(f.complete(7), Some(128));
        assert_eq!(f.outstanding(), 0);
    }
}
