//! Hands committed entries to the local server's passive preload.
//!
//! # Why the preload applies the log, not the follower
//!
//! The follower used to replay each entry over a TCP connection of its own
//! into the server and, before an entry of another connection, wait until
//! the preload reported the server had read the last one: a cross-process
//! round trip per entry, plus reading and draining every reply. That capped
//! a backup at ~23k entries/s, below what the leader's server takes.
//!
//! Now the follower only copies committed entries, in log order, into the
//! region's apply ring (a memcpy; no syscall per entry) and rings the apply
//! doorbell. Inside the server, the passive preload replays the leader's
//! turns itself (`preload/src/backup/replay`): its wait hook reports a replay
//! connection readable when the next entry is that connection's, its read
//! hook copies the entry's bytes out of the log (no byte crosses a real
//! socket), and its write hook drops the server's replies, comparing them
//! with the leader's digest entry by entry. The server's own event loop
//! runs each turn, so epoll (level or edge triggered), poll and select
//! servers all work unchanged.
//!
//! The same path serves live apply, a restarted node rebuilding its server
//! from RocksDB, and entries fetched from a peer.

use std::sync::Arc;

use lockstep_common::entry::{self, EntryHeader};
use lockstep_common::region::{apply_ring_size, Region};
use lockstep_common::ring::{RingError, RingWriter};

/// The writer of a node's apply stream.
pub struct Feeder {
    region: Arc<Region>,
    writer: RingWriter,
    scratch: Vec<u8>,
    next: u64,
}

impl Feeder {
    /// Starts a new stream whose first entry is `next` (the preload drops
    /// whatever it held of an earlier stream).
    pub fn start(region: Arc<Region>, next: u64, max_entry: u32) -> Feeder {
        region.apply().restart(next);
        let size = apply_ring_size(region.ring_size());
        Feeder {
            region,
            writer: RingWriter::new(size, 0),
            scratch: vec![0; entry::footprint(max_entry as usize)],
            next,
        }
    }

    /// Goes on with the stream the region holds (see
    /// `ApplyStream::resume`: a server restored from an image reads on
    /// where it was): the next entry is the one after the last applied,
    /// written at the stream's tail.
    pub fn resume(region: Arc<Region>, max_entry: u32) -> Feeder {
        let a = region.apply();
        let (next, pos) = (a.applied() + 1, a.tail());
        let size = apply_ring_size(region.ring_size());
        Feeder {
            region,
            writer: RingWriter::new(size, pos),
            scratch: vec![0; entry::footprint(max_entry as usize)],
            next,
        }
    }

    /// Apply ring position of the next entry (the end of what was fed).
    pub fn pos(&self) -> u64 {
        self.writer.pos()
    }

    /// Seq of the next entry to feed.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Appends the entry `hdr.seq == next()` to the apply ring. False when
    /// the ring is full: the preload has not read far enough yet.
    pub fn feed(&mut self, hdr: &EntryHeader, payload: &[u8]) -> Result<bool, RingError> {
        debug_assert_eq!(hdr.seq, self.next);
        let head = self.region.apply().head();
        match self.writer.append(
            self.region.apply_ring(),
            hdr,
            payload,
            head,
            &mut self.scratch,
        ) {
            Ok(_) => {
                self.next = hdr.seq + 1;
                Ok(true)
            }
            Err(RingError::Full { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Publishes what was fed so far (wakes the preload's applier).
    pub fn publish(&self) {
        self.region.apply().set_tail(self.writer.pos());
    }

    /// Last seq the server consumed.
    pub fn applied(&self) -> u64 {
        self.region.apply().applied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_common::entry::Kind;
    use lockstep_common::region::RegionSpec;
    use lockstep_common::ring::{ReadOutcome, RingReader};

    #[test]
    fn fed_entries_read_back_in_order_and_the_head_bounds_the_writer() {
        let spec = RegionSpec {
            cluster: "feed".into(),
            node: 1,
            ring_size: 1 << 20,
        };
        let region = Arc::new(Region::anonymous(&spec).unwrap());
        let mut f = Feeder::start(region.clone(), 5, 64 << 10);
        assert_eq!(region.apply().epoch(), (1, 5));
        let payload = vec![7u8; 60 << 10];
        let mut fed = 0;
        loop {
            let h = EntryHeader::new(Kind::Data, 1, f.next(), 5, payload.len() as u32);
            if !f.feed(&h, &payload).unwrap() {
                break;
            }
            fed += 1;
        }
        assert!(
            fed >= 15,
            "a 1 MiB apply ring holds ~16 such entries, fed {fed}"
        );
        f.publish();
        let size = apply_ring_size(spec.ring_size);
        let mut r = RingReader::new(size, 0, 5, 64 << 10);
        let mut buf = Vec::new();
        for seq in 5..5 + fed {
            match r.poll(region.apply_ring(), region.apply().tail(), &mut buf) {
                ReadOutcome::Entry { header, .. } => assert_eq!(header.seq, seq),
                other => panic!("seq {seq}: {other:?}"),
            }
        }
        region.apply().set_head(r.pos());
        let h = EntryHeader::new(Kind::Data, 1, f.next(), 5, payload.len() as u32);
        assert!(f.feed(&h, &payload).unwrap(), "room again once read");
    }
}
