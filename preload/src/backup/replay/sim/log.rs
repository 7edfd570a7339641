//! The log the simulated leader writes: the real [`LeaderWriter`] into real
//! (anonymous) regions, one per node, through a transport that copies the
//! one-sided writes into the peers' rings at once. What a backup has
//! received is a prefix of the entries (see [`SimLog::ends`]).

use std::sync::Arc;

use lockstep_common::entry::EntryHeader;
use lockstep_common::leader_writer::{AppendHooks, LeaderWriter};
use lockstep_common::region::{Region, RegionSpec};
use lockstep_common::transport::{Transport, TransportError};

/// Ring bytes per node: no run fills it (no flow control in the sim).
pub const RING_SIZE: u64 = 1 << 21;
/// The largest payload of one entry.
pub const MAX_ENTRY: usize = 4096;
/// Node ids: the leader, then the backups.
pub const NODES: [u64; 3] = [1, 2, 3];

/// The cluster's regions, as a transport sees them.
struct Regions(Vec<Arc<Region>>);

impl Transport for Regions {
    fn write(
        &self,
        node: u64,
        _view: u64,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), TransportError> {
        self.0[node as usize - 1].write(offset, bytes)?;
        Ok(())
    }

    fn local(&self) -> &Region {
        &self.0[0]
    }
}

/// The writer never waits for room: the ring is larger than any run.
struct NoRoom;

impl AppendHooks for NoRoom {
    type Error = String;

    fn wait_for_room(&mut self, seq: u64) -> Result<(), String> {
        Err(format!("the simulated ring is full at seq {seq}"))
    }
}

/// The log of one run.
pub struct SimLog {
    regions: Regions,
    writer: LeaderWriter,
    /// Each appended entry's seq and the ring position just past it.
    ends: Vec<(u64, u64)>,
}

impl SimLog {
    /// An empty log in view 1.
    pub fn new(run: &str) -> SimLog {
        let regions = NODES
            .iter()
            .map(|&node| {
                let spec = RegionSpec {
                    cluster: run.to_string(),
                    node,
                    ring_size: RING_SIZE,
                };
                Arc::new(Region::anonymous(&spec).expect("an anonymous region"))
            })
            .collect();
        let mut writer = LeaderWriter::new(&NODES, NODES[0], RING_SIZE, MAX_ENTRY);
        writer.start(1, 1, 0);
        SimLog {
            regions: Regions(regions),
            writer,
            ends: Vec::new(),
        }
    }

    /// Appends an entry (`fields`: kind, conn, flags, digest, time, waits
    /// and loop): its seq and conn (an ACCEPT's is its seq).
    pub fn append(&mut self, fields: &EntryHeader, payload: &[u8]) -> (u64, u64) {
        let posted = self
            .writer
            .append(
                &self.regions.0[0],
                &self.regions,
                fields,
                payload,
                &mut NoRoom,
            )
            .expect("the simulated log takes every entry");
        self.ends.push((posted.seq, posted.end));
        (posted.seq, posted.conn)
    }

    /// The view entries are written in.
    pub fn view(&self) -> u64 {
        self.writer.view()
    }

    /// Each entry's seq and end position, in log order.
    pub fn ends(&self) -> &[(u64, u64)] {
        &self.ends
    }

    /// Node `node`'s region (its ring holds every entry).
    pub fn region(&self, node: u64) -> Arc<Region> {
        self.regions.0[node as usize - 1].clone()
    }

    /// Prints every entry (a failing seed's details).
    pub fn dump(&self) {
        let region = self.region(1);
        let mut reader = lockstep_common::ring::RingReader::new(RING_SIZE, 0, 1, MAX_ENTRY as u32);
        let mut buf = Vec::new();
        let tail = self.ends.last().map_or(0, |e| e.1);
        while let lockstep_common::ring::ReadOutcome::Entry { header: h, .. } =
            reader.poll(region.ring(), tail, &mut buf)
        {
            let payload = &buf[lockstep_common::entry::HEADER_LEN..];
            eprintln!(
                "  {:>4} {:?} conn {} flags {} waits {} loop {:?} time {} out {:x} {:?}",
                h.seq,
                h.kind,
                h.conn,
                h.flags,
                h.waits,
                h.turn_loop,
                h.time_us,
                h.out_hash,
                String::from_utf8_lossy(&payload[..(h.len as usize).min(payload.len())])
            );
        }
    }
}
