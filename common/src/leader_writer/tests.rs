//! The leader writer against in-process regions: every ring holds the same
//! bytes in order across wraps, a full ring waits for room exactly when
//! needed, fencing and lost peers, and the majority over the ack array.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::region::RegionSpec;
use crate::ring::{ReadOutcome, RingReader};

const IDS: [u64; 3] = [1, 2, 3];
const ME: u64 = 1;
const MAX: usize = 512;

/// Writes straight into the other nodes' regions, as the shm transport
/// does: refused when the target is in a newer view, failing for `down`.
struct Regions {
    nodes: Vec<Arc<Region>>,
    down: AtomicU64,
}

impl Regions {
    fn new(ring: u64) -> Regions {
        let nodes = IDS
            .iter()
            .map(|&node| {
                Arc::new(
                    Region::anonymous(&RegionSpec {
                        cluster: "writer".into(),
                        node,
                        ring_size: ring,
                    })
                    .unwrap(),
                )
            })
            .collect();
        Regions {
            nodes,
            down: AtomicU64::new(0),
        }
    }

    fn node(&self, id: u64) -> &Region {
        &self.nodes[id as usize - 1]
    }

    fn leader(&self) -> &Region {
        self.node(ME)
    }
}

impl Transport for Regions {
    fn write(&self, node: u64, view: u64, offset: u64, bytes: &[u8]) -> Result<(), TransportError> {
        if self.down.load(Ordering::Relaxed) & (1 << node) != 0 {
            return Err(TransportError::Unavailable(format!("node {node} is down")));
        }
        let r = self.node(node);
        if r.view() > view {
            return Err(TransportError::Fenced {
                node,
                ours: view,
                theirs: r.view(),
            });
        }
        r.write(offset, bytes)?;
        Ok(())
    }

    fn local(&self) -> &Region {
        self.leader()
    }
}

/// Hooks that record what the writer asked; room is made by acking
/// everything asked for on every node (unless `refuse`).
#[derive(Default)]
struct Recorder {
    room: Vec<u64>,
    writing: Vec<u64>,
    missed: Vec<u64>,
    refuse: bool,
}

impl Recorder {
    fn make_room(&mut self, regions: &Regions, seq: u64) -> Result<(), &'static str> {
        self.room.push(seq);
        if self.refuse {
            return Err("no room today");
        }
        for id in IDS {
            regions.leader().set_ack(id, seq);
        }
        Ok(())
    }
}

/// Hooks over `Recorder` that can reach the regions.
struct WithRegions<'a>(&'a mut Recorder, &'a Regions);

impl AppendHooks for WithRegions<'_> {
    type Error = &'static str;
    fn wait_for_room(&mut self, seq: u64) -> Result<(), &'static str> {
        self.0.make_room(self.1, seq)
    }
    fn writing_to(&mut self, node: u64) {
        self.0.writing.push(node);
    }
    fn peer_missed(&mut self, node: u64, _error: &TransportError) {
        self.0.missed.push(node);
    }
}

fn data(conn: u64) -> EntryHeader {
    EntryHeader::new(Kind::Data, 0, 0, conn, 0)
}

fn payload(seq: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seq as usize * 31 + i) as u8).collect()
}

/// Appends entries of `lens` and checks, after each, that a reader on
/// every node's ring finds exactly that entry next.
fn append_and_read(ring: u64, lens: &[usize]) -> (Regions, Recorder, LeaderWriter) {
    let regions = Regions::new(ring);
    let mut w = LeaderWriter::new(&IDS, ME, ring, MAX);
    w.start(1, 1, 0);
    let mut rec = Recorder::default();
    let mut readers: Vec<RingReader> = IDS
        .iter()
        .map(|_| RingReader::new(ring, 0, 1, MAX as u32))
        .collect();
    let mut buf = Vec::new();
    for (i, &len) in lens.iter().enumerate() {
        let seq = i as u64 + 1;
        let p = payload(seq, len);
        let posted = w
            .append(
                regions.leader(),
                &regions,
                &data(7),
                &p,
                &mut WithRegions(&mut rec, &regions),
            )
            .unwrap();
        assert_eq!((posted.seq, posted.conn, posted.end), (seq, 7, w.pos()));
        for (k, &id) in IDS.iter().enumerate() {
            let r = regions.node(id);
            assert_eq!(r.tail(), posted.end, "node {id}'s tail");
            match readers[k].poll(r.ring(), r.tail(), &mut buf) {
                ReadOutcome::Entry { header, .. } => {
                    assert_eq!((header.seq, header.view, header.conn), (seq, 1, 7));
                    let (_, body) = entry::decode(&buf, MAX as u32).unwrap();
                    assert_eq!(body, &p[..], "node {id} seq {seq}");
                }
                other => panic!("node {id} seq {seq}: {other:?}"),
            }
        }
    }
    (regions, rec, w)
}

#[test]
fn every_ring_holds_the_same_entries_in_order_across_wraps() {
    let lens: Vec<usize> = (0..300).map(|i| (i * 37) % (MAX + 1)).collect();
    let (regions, rec, w) = append_and_read(4096, &lens);
    assert!(w.pos() > 10 * 4096, "wrapped many times");
    let words = |id: u64| -> Vec<u64> {
        regions
            .node(id)
            .ring()
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect()
    };
    assert_eq!(words(1), words(2));
    assert_eq!(words(1), words(3));
    assert!(!rec.room.is_empty(), "a 4 KiB ring fills");
    // The leader's own ring is written first, then each peer's.
    assert_eq!(&rec.writing[rec.writing.len() - 3..], &[1, 2, 3]);
}

#[test]
fn a_full_ring_waits_once_for_the_majority_to_store_what_was_written() {
    let ring = 4096;
    let regions = Regions::new(ring);
    let mut w = LeaderWriter::new(&IDS, ME, ring, MAX);
    w.start(1, 1, 0);
    let mut rec = Recorder::default();
    let fp = entry::footprint(MAX) as u64;
    // Entries that fit in one lap need no room.
    let fit = ring / fp;
    for _ in 0..fit {
        w.append(
            regions.leader(),
            &regions,
            &data(1),
            &[9; MAX],
            &mut WithRegions(&mut rec, &regions),
        )
        .unwrap();
    }
    assert!(rec.room.is_empty(), "{:?}", rec.room);
    // The next one waits for everything before it.
    let posted = w
        .append(
            regions.leader(),
            &regions,
            &data(1),
            &[9; MAX],
            &mut WithRegions(&mut rec, &regions),
        )
        .unwrap();
    assert_eq!(rec.room, vec![fit]);
    assert_eq!(posted.seq, fit + 1);

    // A failed wait writes nothing and keeps the seq.
    let (seq, pos) = (w.next_seq(), w.pos());
    rec.refuse = true;
    let mut appended = 0;
    let err = loop {
        match w.append(
            regions.leader(),
            &regions,
            &data(1),
            &[9; MAX],
            &mut WithRegions(&mut rec, &regions),
        ) {
            Ok(_) => appended += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, AppendError::Room("no room today")), "{err}");
    assert_eq!(w.next_seq(), seq + appended);
    assert!(w.pos() <= pos + ring);

    // A payload above max_entry is refused before anything is written.
    let mut fresh = LeaderWriter::new(&IDS, ME, ring, MAX);
    fresh.start(1, 1, 0);
    let err = fresh
        .append(
            regions.leader(),
            &regions,
            &data(1),
            &vec![0; ring as usize],
            &mut WithRegions(&mut Recorder::default(), &regions),
        )
        .unwrap_err();
    assert!(matches!(err, AppendError::TooLarge { .. }), "{err}");
}

#[test]
fn accepts_fencing_lost_peers_and_restarts() {
    let regions = Regions::new(1 << 16);
    let mut w = LeaderWriter::new(&IDS, ME, 1 << 16, MAX);
    w.start(3, 40, 1024);
    let mut rec = Recorder::default();
    let accept = EntryHeader::new(Kind::Accept, 0, 0, 0, 0);
    let p = w
        .append(
            regions.leader(),
            &regions,
            &accept,
            &[],
            &mut WithRegions(&mut rec, &regions),
        )
        .unwrap();
    assert_eq!((p.seq, p.conn), (40, 40), "an ACCEPT's conn is its seq");

    // A lost peer is reported once and the others still get the entry.
    regions.down.store(1 << 3, Ordering::Relaxed);
    for _ in 0..3 {
        w.append(
            regions.leader(),
            &regions,
            &data(40),
            b"x",
            &mut WithRegions(&mut rec, &regions),
        )
        .unwrap();
    }
    assert_eq!(rec.missed, vec![3]);
    assert_eq!(regions.node(2).tail(), w.pos());
    regions.down.store(0, Ordering::Relaxed);

    // A peer in a newer view fences the writer; the entry took its seq.
    regions.node(2).set_view(4);
    let err = w
        .append(
            regions.leader(),
            &regions,
            &data(40),
            b"y",
            &mut WithRegions(&mut rec, &regions),
        )
        .unwrap_err();
    assert!(matches!(err, AppendError::Fenced(_)), "{err}");
    assert_eq!(w.next_seq(), 45);

    // The next view starts from the hand-off.
    w.start(4, 0, 8192);
    assert_eq!((w.view(), w.next_seq(), w.pos()), (4, 1, 8192));
}

/// The header of each entry carries the writer's commit point; a commit
/// record a newer view's leader wrote into a deposed writer's region is
/// not passed on to the backups still following it.
#[test]
fn entries_carry_this_views_commit_point_only() {
    let regions = Regions::new(1 << 16);
    let mut w = LeaderWriter::new(&IDS, ME, 1 << 16, MAX);
    w.start(2, 1, 0);
    let mut rec = Recorder::default();
    let mut reader = RingReader::new(1 << 16, 0, 1, MAX as u32);
    let mut buf = Vec::new();
    let mut append_and_read_commit = |w: &mut LeaderWriter| {
        w.append(
            regions.leader(),
            &regions,
            &data(7),
            &[1, 2, 3],
            &mut WithRegions(&mut rec, &regions),
        )
        .unwrap();
        let r = regions.node(2);
        match reader.poll(r.ring(), r.tail(), &mut buf) {
            ReadOutcome::Entry { header, .. } => header.last_committed,
            other => panic!("{other:?}"),
        }
    };
    regions.leader().raise_commit(1);
    assert_eq!(append_and_read_commit(&mut w), 1, "its own raise");
    // A record of this view (or an older one) counts.
    regions
        .leader()
        .write(region::commit_record_offset(), &region::commit_record(2, 2))
        .unwrap();
    assert_eq!(append_and_read_commit(&mut w), 2);
    // View 3's leader commits 40 of its own log here: not this log's.
    regions
        .leader()
        .write(
            region::commit_record_offset(),
            &region::commit_record(3, 40),
        )
        .unwrap();
    assert_eq!(append_and_read_commit(&mut w), 2, "a newer view's point");
}

#[test]
fn the_majority_reads_the_ack_array() {
    let regions = Regions::new(1 << 16);
    let m = AckMajority::new(&IDS);
    assert_eq!((m.ids(), m.need()), (&IDS[..], 2));
    let r = regions.leader();
    for (id, ack) in [(1, 10), (2, 7), (3, 3)] {
        r.set_ack(id, ack);
    }
    assert_eq!(m.acked(r), 7);
    assert!(m.has_acked(r, 7) && !m.has_acked(r, 8));
    assert_eq!(m.reached_by(|id| id * 100), 200);
}

/// A post wakes the leader's own follower on the post bell, not the
/// leader's server waiting on the acks' bell; acks ring only that one; a
/// role change rings both.
#[test]
fn a_post_rings_the_post_bell_and_an_ack_the_other() {
    let regions = Regions::new(1 << 16);
    let r = regions.leader();
    let bells = |r: &Region| (r.bell().value(), r.post_bell().value());
    let (b0, p0) = bells(r);
    post(r, &regions);
    assert_eq!(bells(r), (b0, p0.wrapping_add(1)));
    // A backup's ack, written remotely, and the follower's own ack.
    regions
        .write(ME, 1, crate::region::ack_offset(2), &5u64.to_le_bytes())
        .unwrap();
    r.set_ack(ME, 5);
    assert_eq!(bells(r), (b0.wrapping_add(2), p0.wrapping_add(1)));
    r.set_role(crate::region::Role::Backup);
    assert_eq!(bells(r), (b0.wrapping_add(3), p0.wrapping_add(2)));
}

proptest! {
    #[test]
    fn any_sizes_reach_every_ring_in_order(
        lens in proptest::collection::vec(0usize..=MAX, 1..120),
        small in any::<bool>(),
    ) {
        let ring = if small { 4096 } else { 8192 };
        let (regions, rec, w) = append_and_read(ring, &lens);
        prop_assert_eq!(w.next_seq(), lens.len() as u64 + 1);
        // Room is only asked for what was written before, in order.
        prop_assert!(rec.room.windows(2).all(|p| p[0] < p[1]));
        prop_assert!(rec.room.iter().all(|&s| s < lens.len() as u64));
        prop_assert_eq!(regions.node(3).tail(), w.pos());
    }

    #[test]
    fn a_majority_reaches_the_acked_point_and_none_beyond(
        acks in proptest::collection::vec(0u64..20, 1..=15),
    ) {
        let ids: Vec<u64> = (1..=acks.len() as u64).collect();
        let regions = Region::anonymous(&RegionSpec {
            cluster: "writer".into(),
            node: 1,
            ring_size: 1 << 16,
        }).unwrap();
        for (&id, &a) in ids.iter().zip(&acks) {
            regions.set_ack(id, a);
        }
        let m = AckMajority::new(&ids);
        let c = m.acked(&regions);
        prop_assert!(acks.iter().filter(|&&a| a >= c).count() >= m.need());
        prop_assert!(acks.iter().filter(|&&a| a > c).count() < m.need());
        for seq in 0..21 {
            let enough = acks.iter().filter(|&&a| a >= seq).count() >= m.need();
            prop_assert_eq!(m.has_acked(&regions, seq), enough);
        }
    }
}
