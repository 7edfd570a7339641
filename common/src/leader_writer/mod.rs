//! The leader's writer: the one place that appends entries to the log.
//!
//! A [`LeaderWriter`] owns what only the leader of a view has: the ring
//! position, the next seq, and the flow-control bound (the position up to
//! which a majority stored everything, so that space may be reused). One
//! append places and encodes an entry, stores it in the leader's own ring
//! (canary last), posts the same bytes to every peer's ring at the same
//! offset (a WRAP marker first when the entry starts a new lap), publishes
//! the new tail in every region and rings the leader's doorbell. Nothing
//! waits for a round trip: acks arrive in the leader's region.
//!
//! The waiting itself is the caller's ([`AppendHooks::wait_for_room`]),
//! because what a wait must watch differs (the preload checks its role,
//! view and follower; a benchmark only bounds the time); the loop they wait
//! in is [`wait_until`], and the majority they wait for is [`AckMajority`].
//!
//! The preload runs this inside someone else's server: nothing here
//! allocates after [`LeaderWriter::new`] or logs, and no input makes it
//! panic (a payload above `max_entry` is an error). The ring size must be
//! a power of two of at least 4 KiB, as config validation ensures:
//! `RingWriter` asserts it.

use crate::config::Config;
use crate::entry::{self, EntryHeader, Kind};
use crate::region::{self, Region};
use crate::ring::{RingError, RingWriter};
use crate::transport::{Transport, TransportError};

mod ack_majority;
mod wait;

pub use ack_majority::AckMajority;
pub use wait::{wait_until, Waited};

/// What the caller of [`LeaderWriter::append`] does at the points where
/// the writer cannot decide alone.
pub trait AppendHooks {
    /// Why waiting for room failed.
    type Error;

    /// The ring is full: returns once a majority stored every entry up to
    /// `seq` (the writer then reuses their space), or fails.
    fn wait_for_room(&mut self, seq: u64) -> Result<(), Self::Error>;

    /// The entry is about to be written into `node`'s ring (the leader's
    /// own first, then each peer's). For measurements; does nothing by
    /// default.
    fn writing_to(&mut self, _node: u64) {}

    /// A write to peer `node` failed, for the first time since the writer
    /// was made, for another reason than fencing: that peer misses the
    /// entry, as with a lost one-sided write, and catches up from another
    /// node. Does nothing by default.
    fn peer_missed(&mut self, _node: u64, _error: &TransportError) {}
}

/// Why an entry could not be appended.
#[derive(Debug, thiserror::Error)]
pub enum AppendError<E> {
    /// Waiting for room failed; the entry was not written.
    #[error("{0}")]
    Room(E),
    /// A peer is in a newer view and refuses this view's writes. The entry
    /// is in the leader's ring and took its seq.
    #[error(transparent)]
    Fenced(TransportError),
    /// The ring cannot take the entry (still full after waiting for room);
    /// the entry was not written.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// The payload is longer than the cluster's `max_entry`.
    #[error("a {len}-byte payload is above max_entry ({max} bytes)")]
    TooLarge {
        /// Payload bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// What one append wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Posted {
    /// The entry's seq.
    pub seq: u64,
    /// The entry's conn (an ACCEPT's is its own seq).
    pub conn: u64,
    /// Ring position just past the entry (the published tail).
    pub end: u64,
}

/// The single writer of a view's log (see the module doc).
#[derive(Debug)]
pub struct LeaderWriter {
    me: u64,
    peers: Vec<u64>,
    majority: AckMajority,
    ring_size: u64,
    max_entry: usize,
    /// View the writer was started in (0: not yet).
    view: u64,
    next_seq: u64,
    ring: RingWriter,
    /// Position up to which a majority stored everything.
    safe: u64,
    /// The encoded entry (footprint of `max_entry`).
    scratch: Vec<u8>,
    /// Bit per peer id whose failed write was reported.
    missed: u64,
    /// The commit point the entries carry: this view's (see
    /// [`LeaderWriter::header_commit`]).
    header_commit: u64,
    /// Whether [`LeaderWriter::append`] leaves the doorbells and the
    /// transport's flush to the caller's [`post`] (see
    /// [`LeaderWriter::defer_posts`]).
    deferred: bool,
}

/// Makes what was appended so far move: rings `region`'s post doorbell
/// (the local follower parks there while this node leads) and flushes `transport` (the peers'
/// doorbells, batched network writes). For a writer whose appends are
/// deferred ([`LeaderWriter::defer_posts`]); needs no writer lock.
pub fn post(region: &Region, transport: &dyn Transport) {
    region.post_bell().ring();
    transport.flush();
}

impl LeaderWriter {
    /// A writer for node `me` of the cluster `ids` (`me` included), with a
    /// ring of `ring_size` bytes (a power of two of at least 4 KiB) and
    /// payloads of at most `max_entry` bytes. It appends nothing before
    /// [`LeaderWriter::start`].
    pub fn new(ids: &[u64], me: u64, ring_size: u64, max_entry: usize) -> LeaderWriter {
        LeaderWriter {
            me,
            peers: ids.iter().copied().filter(|&id| id != me).collect(),
            majority: AckMajority::new(ids),
            ring_size,
            max_entry,
            view: 0,
            next_seq: 1,
            ring: RingWriter::new(ring_size, 0),
            safe: 0,
            scratch: vec![0; entry::footprint(max_entry)],
            missed: 0,
            header_commit: 0,
            deferred: false,
        }
    }

    /// [`LeaderWriter::new`] for node `me` of `config`.
    pub fn for_node(config: &Config, me: u64) -> LeaderWriter {
        let ids: Vec<u64> = config.ids().collect();
        Self::new(&ids, me, config.ring_size, config.max_entry as usize)
    }

    /// Starts writing `view` at seq `next_seq` (at least 1) and ring
    /// position `pos`: the follower's hand-off (`Region::writer_start`).
    /// Everything before `pos` counts as stored by a majority.
    pub fn start(&mut self, view: u64, next_seq: u64, pos: u64) {
        self.view = view;
        self.header_commit = 0;
        self.next_seq = next_seq.max(1);
        self.ring = RingWriter::new(self.ring_size, pos);
        self.safe = pos;
    }

    /// The view the writer was started in (0: not started).
    pub fn view(&self) -> u64 {
        self.view
    }

    /// The commit point an entry carries: the region's commit word, unless
    /// a newer view's leader wrote it ([`region::commit_of_view`]): a
    /// backup still following this writer would take its own uncommitted
    /// tail as committed. Then the last point of this view stands.
    fn header_commit(&mut self, region: &Region) -> u64 {
        // The word first, then its tag: the tag of that write or a newer.
        let (seq, tag) = region.commit_in_view();
        if let Some(seq) = region::commit_of_view(tag, seq, self.view) {
            self.header_commit = self.header_commit.max(seq);
        }
        self.header_commit
    }

    /// Seq of the next entry.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Ring position of the next entry.
    pub fn pos(&self) -> u64 {
        self.ring.pos()
    }

    /// From now on [`LeaderWriter::append`] writes everywhere but wakes
    /// nobody: the caller calls [`post`] before it waits for acks, and
    /// whenever what it appended must move without a wait. A turn's
    /// inputs then reach the followers with one wake-up each (one
    /// `futex` syscall per parked poller, one network flush) instead of
    /// one per entry, and each follower stores them in one write.
    pub fn defer_posts(&mut self) {
        self.deferred = true;
    }

    /// The majority acks are counted over.
    pub fn majority(&self) -> &AckMajority {
        &self.majority
    }

    /// Appends one entry: `fields` gives its kind, conn, flags, out_hash
    /// and time_us; the writer sets its view, seq, length and
    /// last_committed (the leader region's commit word), and an ACCEPT's
    /// conn (its own seq). Writes it into `region`'s ring (the leader's),
    /// posts it through `transport` to every peer, publishes the tail and
    /// rings the doorbell. When the ring is full it asks
    /// `hooks.wait_for_room` once, then uses the space a majority stored.
    pub fn append<H: AppendHooks>(
        &mut self,
        region: &Region,
        transport: &dyn Transport,
        fields: &EntryHeader,
        payload: &[u8],
        hooks: &mut H,
    ) -> Result<Posted, AppendError<H::Error>> {
        if payload.len() > self.max_entry {
            return Err(AppendError::TooLarge {
                len: payload.len(),
                max: self.max_entry,
            });
        }
        let (view, seq) = (self.view, self.next_seq);
        let conn = if fields.kind == Kind::Accept {
            seq
        } else {
            fields.conn
        };
        let mut hdr = EntryHeader {
            view,
            seq,
            conn,
            len: payload.len() as u32,
            ..*fields
        };
        let mut waited = false;
        let a = loop {
            hdr.last_committed = self.header_commit(region);
            hooks.writing_to(self.me);
            match self
                .ring
                .append(region.ring(), &hdr, payload, self.safe, &mut self.scratch)
            {
                Ok(a) => break a,
                Err(RingError::Full { .. }) if !waited && seq > 1 => {
                    // Flow control: everything written so far must be
                    // stored by a majority before its space is reused.
                    hooks.wait_for_room(seq - 1).map_err(AppendError::Room)?;
                    self.safe = self.ring.pos();
                    waited = true;
                }
                Err(e) => return Err(AppendError::Ring(e)),
            }
        };
        self.next_seq = seq + 1;
        let bytes = &self.scratch[..a.len];
        let tail = a.end.to_le_bytes();
        for &peer in &self.peers {
            hooks.writing_to(peer);
            let posted = (|| -> Result<(), TransportError> {
                if let Some(off) = a.wrap_offset {
                    transport.write(
                        peer,
                        view,
                        region::ring_offset(off),
                        self.ring.wrap_bytes(),
                    )?;
                }
                transport.write(peer, view, region::ring_offset(a.offset), bytes)?;
                transport.write(peer, view, region::tail_offset(), &tail)
            })();
            match posted {
                Ok(()) => {}
                Err(e @ TransportError::Fenced { .. }) => return Err(AppendError::Fenced(e)),
                Err(e) => {
                    let bit = 1u64 << (peer & 63);
                    if self.missed & bit == 0 {
                        self.missed |= bit;
                        hooks.peer_missed(peer, &e);
                    }
                }
            }
        }
        region.set_tail(a.end);
        if !self.deferred {
            post(region, transport);
        }
        Ok(Posted {
            seq,
            conn,
            end: a.end,
        })
    }
}

#[cfg(test)]
mod tests;
