//! The circular log buffer: where entries go (writer) and which entry is
//! next (reader). Pure logic over a slice of atomic words, so the same code
//! runs on a mapped region and on a heap buffer in tests.
//!
//! Positions are absolute byte counts that only grow; the ring offset is
//! `pos % size`. An entry never straddles the end of the ring: when it does
//! not fit, the writer puts a `WRAP` marker (carrying the seq of the entry
//! that follows) and continues at the start of the next lap. When fewer than
//! [`MIN_FOOTPRINT`] bytes remain, the wrap is implicit on both sides.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::entry::{self, DecodeError, EntryHeader, Kind, CANARY_LEN, HEADER_LEN};
use crate::words;

/// Smallest footprint of any entry (an empty payload).
pub const MIN_FOOTPRINT: u64 = entry::footprint(0) as u64;

/// Ring arithmetic for a power-of-two ring of `size` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingGeometry {
    size: u64,
}

/// Where the next entry goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Absolute position of a WRAP marker to write first, if any.
    pub wrap_at: Option<u64>,
    /// Absolute position where the entry starts.
    pub start: u64,
    /// Absolute position just past the entry.
    pub end: u64,
}

/// Why the writer cannot place an entry now.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RingError {
    /// Writing would overwrite entries a majority has not acknowledged yet.
    #[error("ring full: entry needs up to {need} but only {safe} is acknowledged by a majority")]
    Full {
        /// Position the write would reach.
        need: u64,
        /// Position up to which entries may be overwritten, plus the ring size.
        safe: u64,
    },
    /// The entry can never fit in the ring.
    #[error("entry of {footprint} bytes cannot fit in a ring of {size} bytes")]
    TooLarge {
        /// Footprint of the entry.
        footprint: u64,
        /// Ring size.
        size: u64,
    },
}

impl RingGeometry {
    /// Geometry of a ring of `size` bytes; `size` must be a power of two of
    /// at least 4 KiB (config validation enforces a larger minimum).
    pub fn new(size: u64) -> Self {
        assert!(size.is_power_of_two() && size >= 4096, "ring size {size}");
        RingGeometry { size }
    }

    /// Ring size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Byte offset inside the ring of absolute position `pos`.
    pub fn offset(&self, pos: u64) -> u64 {
        pos & (self.size - 1)
    }

    /// Start of the lap after the one holding `pos`.
    pub fn next_lap(&self, pos: u64) -> u64 {
        (pos | (self.size - 1)) + 1
    }

    /// Position after skipping an implicit wrap (too little room left for
    /// any entry, not even a WRAP marker).
    pub fn skip_implicit_wrap(&self, pos: u64) -> u64 {
        if self.size - self.offset(pos) < MIN_FOOTPRINT {
            self.next_lap(pos)
        } else {
            pos
        }
    }

    /// Places an entry of `footprint` bytes at writer position `pos`, never
    /// reaching past `safe + size`, where `safe` is the position up to which
    /// every entry has been acknowledged by a majority.
    pub fn place(&self, pos: u64, footprint: u64, safe: u64) -> Result<Placement, RingError> {
        if footprint + MIN_FOOTPRINT > self.size {
            return Err(RingError::TooLarge {
                footprint,
                size: self.size,
            });
        }
        let pos = self.skip_implicit_wrap(pos);
        let (wrap_at, start) = if self.offset(pos) + footprint > self.size {
            (Some(pos), self.next_lap(pos))
        } else {
            (None, pos)
        };
        let end = start + footprint;
        if end > safe + self.size {
            return Err(RingError::Full {
                need: end,
                safe: safe + self.size,
            });
        }
        Ok(Placement {
            wrap_at,
            start,
            end,
        })
    }
}

/// The single writer of a ring: places, encodes and stores entries.
#[derive(Debug)]
pub struct RingWriter {
    geo: RingGeometry,
    pos: u64,
    wrap_buf: [u8; MIN_FOOTPRINT as usize],
}

/// What [`RingWriter::append`] stored, so that the same bytes can be posted
/// to every peer at the same ring offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    /// Ring offset of the WRAP marker written first, if any.
    pub wrap_offset: Option<u64>,
    /// Ring offset of the entry.
    pub offset: u64,
    /// Footprint of the entry in bytes.
    pub len: usize,
    /// Absolute position just past the entry (the new tail).
    pub end: u64,
}

impl RingWriter {
    /// A writer that continues at absolute position `pos`.
    pub fn new(size: u64, pos: u64) -> Self {
        RingWriter {
            geo: RingGeometry::new(size),
            pos,
            wrap_buf: [0; MIN_FOOTPRINT as usize],
        }
    }

    /// Next write position.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// The encoded WRAP marker of the last append that needed one.
    pub fn wrap_bytes(&self) -> &[u8] {
        &self.wrap_buf
    }

    /// Encodes `hdr`/`payload` into `scratch` and stores it in `ring`
    /// (canary last), preceded by a WRAP marker when needed. `safe` is the
    /// position up to which a majority acknowledged. `scratch` must hold the
    /// entry's footprint; the encoded entry stays there for posting.
    pub fn append(
        &mut self,
        ring: &[AtomicU64],
        hdr: &EntryHeader,
        payload: &[u8],
        safe: u64,
        scratch: &mut [u8],
    ) -> Result<Appended, RingError> {
        let fp = entry::footprint(payload.len()) as u64;
        let place = self.geo.place(self.pos, fp, safe)?;
        let len = entry::encode_into(hdr, payload, scratch);
        let mut wrap_offset = None;
        if let Some(at) = place.wrap_at {
            let wrap = EntryHeader::new(Kind::Wrap, hdr.view, hdr.seq, 0, 0);
            entry::encode_into(&wrap, &[], &mut self.wrap_buf);
            let off = self.geo.offset(at);
            words::store(ring, off, &self.wrap_buf).expect("wrap marker inside ring");
            wrap_offset = Some(off);
        }
        let offset = self.geo.offset(place.start);
        words::store(ring, offset, &scratch[..len]).expect("placement inside ring");
        self.pos = place.end;
        Ok(Appended {
            wrap_offset,
            offset,
            len,
            end: place.end,
        })
    }
}

/// What the reader found at its position.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// The expected entry; its bytes are in the caller's buffer.
    Entry {
        /// The entry's header.
        header: EntryHeader,
        /// Absolute position where it starts.
        pos: u64,
        /// Its footprint in bytes.
        len: usize,
    },
    /// Nothing complete yet (or only an entry of an older view).
    Empty,
    /// The writer overwrote the expected entry: the reader fell a whole lap
    /// behind and must fetch the gap from a peer.
    Lapped {
        /// Seq the reader expected.
        expected: u64,
    },
    /// An entry with a valid canary failed its CRC: memory was corrupted.
    Corrupt {
        /// Seq the reader expected.
        expected: u64,
        /// What was wrong.
        error: DecodeError,
    },
}

/// Reads entries in order, accepting one only when its canary and CRC match
/// the seq it expects and its view is not older than `min_view`.
#[derive(Debug)]
pub struct RingReader {
    geo: RingGeometry,
    pos: u64,
    expect: u64,
    min_view: u64,
    max_len: u32,
}

impl RingReader {
    /// A reader at absolute position `pos` expecting seq `expect`.
    pub fn new(size: u64, pos: u64, expect: u64, max_len: u32) -> Self {
        RingReader {
            geo: RingGeometry::new(size),
            pos,
            expect,
            min_view: 0,
            max_len,
        }
    }

    /// Absolute position of the next entry.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// Seq of the next entry.
    pub fn expected(&self) -> u64 {
        self.expect
    }

    /// Moves the reader (after a catch-up or a view change).
    pub fn reset(&mut self, pos: u64, expect: u64) {
        self.pos = pos;
        self.expect = expect;
    }

    /// Entries of views older than `view` are ignored from now on.
    pub fn set_min_view(&mut self, view: u64) {
        self.min_view = view;
    }

    /// Looks for the expected entry. `tail` is the writer's last published
    /// end position (0 if unknown); it lets the reader notice a lap it
    /// missed even when the slot holds garbage. On `Entry` the entry's bytes
    /// are in `buf[..len]`.
    pub fn poll(&mut self, ring: &[AtomicU64], tail: u64, buf: &mut Vec<u8>) -> ReadOutcome {
        loop {
            self.pos = self.geo.skip_implicit_wrap(self.pos);
            if tail > self.pos + self.geo.size {
                return ReadOutcome::Lapped {
                    expected: self.expect,
                };
            }
            let off = self.geo.offset(self.pos);
            let word = |i: u64| ring[((off / 8) + i) as usize].load(Ordering::Relaxed);
            let w0 = word(0);
            let len = (w0 & 0xffff_ffff) as u32;
            let view = word(1);
            let seq = word(2);
            if len > self.max_len {
                return ReadOutcome::Empty;
            }
            let fp = entry::footprint(len as usize) as u64;
            if off + fp > self.geo.size {
                return ReadOutcome::Empty;
            }
            let canary_idx = ((off + fp - CANARY_LEN as u64) / 8) as usize;
            let canary = ring[canary_idx].load(Ordering::Acquire);
            if canary != entry::canary(seq, view) {
                return ReadOutcome::Empty;
            }
            // A complete entry is here. Is it the one we expect?
            if seq != self.expect {
                if seq > self.expect && view >= self.min_view {
                    return ReadOutcome::Lapped {
                        expected: self.expect,
                    };
                }
                return ReadOutcome::Empty;
            }
            if view < self.min_view {
                return ReadOutcome::Empty;
            }
            buf.resize(fp as usize, 0);
            if words::load(ring, off, &mut buf[..fp as usize]).is_err() {
                // Only a position off the entry grid gets here (a log
                // whose end a peer misreported): nothing readable.
                return ReadOutcome::Empty;
            }
            // Seqlock-style re-check: the writer of a later lap may have
            // started overwriting while we copied.
            if ring[canary_idx].load(Ordering::Acquire) != canary || word(2) != seq {
                return ReadOutcome::Lapped {
                    expected: self.expect,
                };
            }
            let header = match entry::decode(&buf[..fp as usize], self.max_len) {
                Ok((h, _)) => h,
                Err(error) => {
                    return ReadOutcome::Corrupt {
                        expected: self.expect,
                        error,
                    }
                }
            };
            debug_assert!(HEADER_LEN as u64 + header.len as u64 <= fp);
            if header.kind == Kind::Wrap {
                if off == 0 {
                    // No writer wraps at the start of a lap (every entry
                    // fits a whole ring): following this marker would find
                    // it again at the next lap, for ever. Garbage a peer
                    // wrote; the caller fetches the entry elsewhere.
                    return ReadOutcome::Empty;
                }
                self.pos = self.geo.next_lap(self.pos);
                continue;
            }
            let pos = self.pos;
            self.pos += fp;
            self.expect += 1;
            return ReadOutcome::Entry {
                header,
                pos,
                len: fp as usize,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::decode;
    use proptest::prelude::*;

    const SIZE: u64 = 4096;

    fn data(seq: u64, len: usize) -> (EntryHeader, Vec<u8>) {
        let payload: Vec<u8> = (0..len).map(|i| (seq as usize * 31 + i) as u8).collect();
        (EntryHeader::new(Kind::Data, 1, seq, 7, len as u32), payload)
    }

    #[test]
    fn geometry_places_and_wraps() {
        let g = RingGeometry::new(SIZE);
        let p = g.place(0, 128, 0).unwrap();
        assert_eq!(
            p,
            Placement {
                wrap_at: None,
                start: 0,
                end: 128
            }
        );
        // 256 bytes left at 3840: a 384-byte entry wraps with a marker.
        let p = g.place(3840, 384, 3840).unwrap();
        assert_eq!(p.wrap_at, Some(3840));
        assert_eq!(p.start, 4096);
        assert_eq!(p.end, 4096 + 384);
        // 64 bytes left: implicit wrap, no marker.
        let p = g.place(4032, 128, 4032).unwrap();
        assert_eq!(p.wrap_at, None);
        assert_eq!(p.start, 4096);
    }

    #[test]
    fn geometry_refuses_to_overrun_unacked_entries() {
        let g = RingGeometry::new(SIZE);
        assert!(matches!(g.place(4096, 128, 0), Err(RingError::Full { .. })));
        assert!(g.place(4096, 128, 128).is_ok());
        assert!(matches!(
            g.place(0, SIZE, 0),
            Err(RingError::TooLarge { .. })
        ));
    }

    #[test]
    fn wrap_around_over_many_laps_with_a_slow_reader() {
        let ring = words::zeroed(SIZE as usize);
        let mut w = RingWriter::new(SIZE, 0);
        let mut r = RingReader::new(SIZE, 0, 1, 1 << 20);
        let mut scratch = vec![0u8; 4096];
        let mut buf = Vec::new();
        let mut acked_end = 0u64; // what the reader consumed = what a majority acked
        let mut next_seq = 1u64;
        let mut read = 0u64;
        let mut tail = 0;
        while read < 400 {
            // Writer writes until the ring is full, with varying sizes.
            loop {
                let (h, p) = data(next_seq, (next_seq as usize * 37) % 700);
                match w.append(&ring, &h, &p, acked_end, &mut scratch) {
                    Ok(a) => {
                        tail = a.end;
                        next_seq += 1;
                    }
                    Err(RingError::Full { .. }) => break,
                    Err(e) => panic!("{e}"),
                }
            }
            // Slow reader takes only a few entries per round.
            for _ in 0..3 {
                match r.poll(&ring, tail, &mut buf) {
                    ReadOutcome::Entry { header, len, .. } => {
                        let (h, p) = data(header.seq, header.len as usize);
                        let (dh, dp) = decode(&buf[..len], 1 << 20).unwrap();
                        assert_eq!(dh, h);
                        assert_eq!(dp, &p[..]);
                        assert_eq!(header.seq, read + 1);
                        read += 1;
                        acked_end = r.pos();
                    }
                    other => panic!("unexpected {other:?} at seq {}", read + 1),
                }
            }
        }
        assert!(tail > 5 * SIZE, "wrote several laps: tail {tail}");
    }

    #[test]
    fn a_wrap_marker_at_the_start_of_a_lap_does_not_spin_the_reader() {
        // Found while writing the fuzz loop (tests/fuzz.rs hangs without
        // this): a peer writing a valid WRAP entry with the expected seq at
        // ring offset 0 sent the reader from lap to lap for ever.
        let ring = words::zeroed(SIZE as usize);
        let bytes = entry::encode(&EntryHeader::new(Kind::Wrap, 1, 1, 0, 0), &[]);
        words::store(&ring, 0, &bytes).unwrap();
        let mut r = RingReader::new(SIZE, 0, 1, 1 << 20);
        let mut buf = Vec::new();
        assert_eq!(r.poll(&ring, 0, &mut buf), ReadOutcome::Empty);
        assert_eq!(r.poll(&ring, SIZE / 2, &mut buf), ReadOutcome::Empty);
        // Anywhere else it still moves the reader to the next lap.
        let mut r = RingReader::new(SIZE, SIZE - 256, 1, 1 << 20);
        words::store(&ring, SIZE - 256, &bytes).unwrap();
        assert_eq!(r.poll(&ring, 0, &mut buf), ReadOutcome::Empty);
        assert_eq!(r.pos(), SIZE);
    }

    #[test]
    fn a_position_off_the_entry_grid_reads_nothing() {
        // Found by the fuzz loop (tests/fuzz.rs): the reader panicked on
        // an unaligned position (a log end a peer misreported; the
        // follower now refuses such fetched entries too).
        let ring = words::zeroed(SIZE as usize);
        let mut w = RingWriter::new(SIZE, 0);
        let (h, p) = data(1, 30);
        w.append(&ring, &h, &p, 0, &mut vec![0u8; 4096]).unwrap();
        for pos in [6, 4102] {
            let mut r = RingReader::new(SIZE, pos, 1, 1 << 20);
            assert_eq!(r.poll(&ring, 0, &mut Vec::new()), ReadOutcome::Empty);
        }
    }

    #[test]
    fn lapped_reader_says_so() {
        let ring = words::zeroed(SIZE as usize);
        let mut w = RingWriter::new(SIZE, 0);
        let mut scratch = vec![0u8; 4096];
        let mut tail = 0;
        // The writer ignores this reader (a majority acked without it).
        for seq in 1..200 {
            let (h, p) = data(seq, 40);
            tail = w.append(&ring, &h, &p, tail, &mut scratch).unwrap().end;
        }
        let mut r = RingReader::new(SIZE, 0, 1, 1 << 20);
        let mut buf = Vec::new();
        assert_eq!(
            r.poll(&ring, tail, &mut buf),
            ReadOutcome::Lapped { expected: 1 }
        );
        // Without the tail hint the overwritten slot still gives it away.
        assert_eq!(
            r.poll(&ring, 0, &mut buf),
            ReadOutcome::Lapped { expected: 1 }
        );
    }

    #[test]
    fn older_view_entries_are_ignored_after_a_view_change() {
        let ring = words::zeroed(SIZE as usize);
        let mut w = RingWriter::new(SIZE, 0);
        let mut scratch = vec![0u8; 4096];
        let (h, p) = data(1, 10);
        w.append(&ring, &h, &p, 0, &mut scratch).unwrap();
        let mut r = RingReader::new(SIZE, 0, 1, 1 << 20);
        r.set_min_view(2);
        let mut buf = Vec::new();
        assert_eq!(r.poll(&ring, 0, &mut buf), ReadOutcome::Empty);
        let mut w2 = RingWriter::new(SIZE, 0);
        let mut h2 = h;
        h2.view = 2;
        w2.append(&ring, &h2, &p, 0, &mut scratch).unwrap();
        assert!(
            matches!(r.poll(&ring, 0, &mut buf), ReadOutcome::Entry { header, .. } if header.view == 2)
        );
    }

    #[test]
    fn corrupt_entry_with_valid_canary_is_reported() {
        let ring = words::zeroed(SIZE as usize);
        let mut w = RingWriter::new(SIZE, 0);
        let mut scratch = vec![0u8; 4096];
        let (h, p) = data(1, 30);
        w.append(&ring, &h, &p, 0, &mut scratch).unwrap();
        ring[9].fetch_xor(1, Ordering::Relaxed); // a payload byte
        let mut r = RingReader::new(SIZE, 0, 1, 1 << 20);
        assert!(matches!(
            r.poll(&ring, 0, &mut Vec::new()),
            ReadOutcome::Corrupt { expected: 1, .. }
        ));
    }

    proptest! {
        /// Any subset of an entry's words written in any order, without the
        /// canary word, never makes it visible; the canary makes it visible
        /// exactly once.
        #[test]
        fn torn_entries_stay_invisible(len in 0usize..600, order in any::<u64>(), keep in 0.0f64..=1.0, start_seq in 1u64..1000) {
            let ring = words::zeroed(SIZE as usize);
            // A previous lap left another entry at the same place.
            let (oh, op) = data(start_seq, 200);
            RingWriter::new(SIZE, 0).append(&ring, &oh, &op, 0, &mut vec![0u8; 4096]).unwrap();

            let (h, p) = data(start_seq + 1, len);
            let bytes = entry::encode(&h, &p);
            let n = bytes.len() / 8;
            let mut idx: Vec<usize> = (0..n - 1).collect();
            // Deterministic shuffle from `order`.
            let mut s = order | 1;
            for i in (1..idx.len()).rev() {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                idx.swap(i, (s % (i as u64 + 1)) as usize);
            }
            let count = ((idx.len() as f64) * keep) as usize;
            let mut r = RingReader::new(SIZE, 0, start_seq + 1, 1 << 20);
            let mut buf = Vec::new();
            for &i in &idx[..count] {
                words::store(&ring, (i * 8) as u64, &bytes[i * 8..i * 8 + 8]).unwrap();
                prop_assert_eq!(r.poll(&ring, 0, &mut buf), ReadOutcome::Empty);
            }
            for &i in &idx[count..] {
                words::store(&ring, (i * 8) as u64, &bytes[i * 8..i * 8 + 8]).unwrap();
            }
            prop_assert_eq!(r.poll(&ring, 0, &mut buf), ReadOutcome::Empty);
            words::store(&ring, ((n - 1) * 8) as u64, &bytes[(n - 1) * 8..]).unwrap();
            let got = r.poll(&ring, 0, &mut buf);
            let is_entry = matches!(got, ReadOutcome::Entry { header, .. } if header == h);
            prop_assert!(is_entry);
            prop_assert_eq!(&buf[..bytes.len()], &bytes[..]);
            prop_assert_eq!(r.poll(&ring, 0, &mut buf), ReadOutcome::Empty);
        }
    }
}
