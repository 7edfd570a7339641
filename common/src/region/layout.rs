//! Where everything is in a region: the control block's words (each field
//! on its own cache line), the offsets remote writers target, the sizes of
//! the rings, and what a region must be (`RegionSpec`).
//!
//! Control block (word indices): identity (magic, layout version, node,
//! ring size, cluster hash), view, leader, role, commit (with its view
//! tag), tail, doorbell, follower heartbeat, writer hand-off (next seq /
//! next position), attached preload, hand-over word, the apply stream, the
//! ack array and the applied array.

use std::path::PathBuf;

/// "LOCKSTEP" in ASCII, little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"LOCKSTEP");
/// Bumped whenever the control block layout changes.
pub const LAYOUT_VERSION: u64 = 4;
/// Bytes of control block before the ring.
pub const CONTROL_SIZE: u64 = 32 * 1024;
/// Highest node id (ids are 1..=MAX_NODES).
pub const MAX_NODES: usize = 15;

pub(super) const LINE: usize = 8; // words per cache line
pub(super) const W_MAGIC: usize = 0;
pub(super) const W_VERSION: usize = 1;
pub(super) const W_NODE: usize = 2;
pub(super) const W_RING_SIZE: usize = 3;
pub(super) const W_CLUSTER: usize = 4;
pub(super) const W_VIEW: usize = LINE;
pub(super) const W_LEADER: usize = 2 * LINE;
pub(super) const W_ROLE: usize = 3 * LINE;
// The view whose leader last wrote the commit word, just before it: a
// leader sends both in one write, view first (see `commit_record`).
pub(super) const W_COMMIT_VIEW: usize = 4 * LINE;
pub(super) const W_COMMIT: usize = 4 * LINE + 1;
pub(super) const W_TAIL: usize = 5 * LINE;
pub(super) const W_BELL: usize = 6 * LINE;
pub(super) const W_BELL_WAITERS: usize = 7 * LINE;
pub(super) const W_HEARTBEAT: usize = 8 * LINE;
// The backups that can apply (a mask by node id), as the leading node's
// follower sees them, for its preload's `max_apply_lag` (see `apply_lag`).
pub(super) const W_APPLIERS: usize = 8 * LINE + 1;
pub(super) const W_NEXT_SEQ: usize = 9 * LINE;
pub(super) const W_NEXT_POS: usize = 10 * LINE;
pub(super) const W_PRELOAD: usize = 11 * LINE;
// Highest seq whose input the leader's preload handed to its server, with
// HANDOVER_FENCED set once the follower stopped the hand-overs.
pub(super) const W_HANDOVER: usize = 12 * LINE;
pub(super) const HANDOVER_FENCED: u64 = 1 << 63;
// The apply stream (see `ApplyStream`): the follower's words, then the
// passive preload's, then the doorbell the preload's applier parks on.
pub(super) const W_APPLY_TAIL: usize = 13 * LINE;
pub(super) const W_APPLY_EPOCH: usize = 13 * LINE + 1;
pub(super) const W_APPLY_START_SEQ: usize = 13 * LINE + 2;
pub(super) const W_APPLY_HEAD: usize = 14 * LINE;
pub(super) const W_APPLIED: usize = 14 * LINE + 1;
pub(super) const W_DIVERGED: usize = 14 * LINE + 2;
pub(super) const W_APPLY_BELL: usize = 15 * LINE;
pub(super) const W_APPLY_BELL_WAITERS: usize = 15 * LINE + 1;
// ack[id] at W_ACK + id * LINE.
pub(super) const W_ACK: usize = 16 * LINE;
// applied[id] at W_APPLIED_BY + id * LINE: how far each backup's server
// applied, written by the backups into the leader's region, followed by
// the backup's report word (see `apply_lag::report_word`).
pub(super) const W_APPLIED_BY: usize = W_ACK + (MAX_NODES + 1) * LINE;
// The doorbell a leader's own writer rings for its follower (see
// `Region::post_bell`); in what earlier layouts left unused (zero), so a
// region file of layout 4 reads the same.
pub(super) const W_POST_BELL: usize = W_APPLIED_BY + (MAX_NODES + 1) * LINE;
pub(super) const W_POST_BELL_WAITERS: usize = W_POST_BELL + LINE;
// The doorbell a backup's preload rings when its server read on in the
// apply stream (see `ApplyStream::progress_bell`), likewise in words
// earlier layouts left zero.
pub(super) const W_PROGRESS_BELL: usize = W_POST_BELL_WAITERS + LINE;
pub(super) const W_PROGRESS_BELL_WAITERS: usize = W_PROGRESS_BELL + LINE;
// When the node's log began (µs since the epoch: the time of its first
// entry, the first leader's VIEW; 0: not known here), what a server reads
// before its first turn (see `Region::origin_us`); likewise in words
// earlier layouts left zero (read as "not known").
pub(super) const W_ORIGIN: usize = W_PROGRESS_BELL_WAITERS + LINE;
pub(super) const CONTROL_WORDS: usize = (CONTROL_SIZE / 8) as usize;

const _: () = assert!(W_ORIGIN + LINE <= CONTROL_WORDS);

/// Bytes of a node's apply ring for a replication ring of `ring_size`: a
/// quarter of it, between 1 and 16 MiB (a power of two, like the ring).
pub fn apply_ring_size(ring_size: u64) -> u64 {
    (ring_size / 4).clamp(1 << 20, 16 << 20)
}

/// Byte offset in the region of a control word (for one-sided remote writes).
pub fn word_offset(word: usize) -> u64 {
    (word * 8) as u64
}

/// Region offset of node `id`'s ack slot.
pub fn ack_offset(id: u64) -> u64 {
    word_offset(W_ACK + id as usize * LINE)
}
/// Region offset of node `id`'s applied slot.
pub fn applied_by_offset(id: u64) -> u64 {
    word_offset(W_APPLIED_BY + id as usize * LINE)
}

/// Region offset of the commit word.
pub fn commit_offset() -> u64 {
    word_offset(W_COMMIT)
}
/// Region offset of a commit record (`commit_record`): the commit word's
/// view tag, followed by the commit word.
pub fn commit_record_offset() -> u64 {
    word_offset(W_COMMIT_VIEW)
}
/// What a leader of `view` writes at `commit_record_offset` to tell a peer
/// that `seq` is committed. Words are stored in order, the last with
/// release, so a reader that loads the commit word first (acquire) and
/// the tag second sees the tag of that write or of a later one.
pub fn commit_record(view: u64, seq: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&view.to_le_bytes());
    b[8..].copy_from_slice(&seq.to_le_bytes());
    b
}
/// The point of a commit word (`seq`, tagged `record_view`) that a log of
/// `view` may take: None when a newer view's leader wrote it (its commit
/// record reaches the region of a leader that has not noticed it was
/// deposed); that point is of another log.
pub fn commit_of_view(record_view: u64, seq: u64, view: u64) -> Option<u64> {
    (record_view <= view).then_some(seq)
}
/// Region offset of the tail word.
pub fn tail_offset() -> u64 {
    word_offset(W_TAIL)
}
/// Region offset of the view word.
pub fn view_offset() -> u64 {
    word_offset(W_VIEW)
}
/// Region offset of the doorbell word.
pub fn bell_offset() -> u64 {
    word_offset(W_BELL)
}
/// Region offset of ring byte `ring_offset`.
pub fn ring_offset(ring_offset: u64) -> u64 {
    CONTROL_SIZE + ring_offset
}

/// What a region must be: used to create one and to check one found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionSpec {
    /// Cluster name (hashed into the control block).
    pub cluster: String,
    /// Node id owning the region.
    pub node: u64,
    /// Ring size in bytes (power of two).
    pub ring_size: u64,
}

impl RegionSpec {
    /// Total bytes of the region file: control block, ring, apply ring.
    pub fn file_len(&self) -> u64 {
        CONTROL_SIZE + self.ring_size + apply_ring_size(self.ring_size)
    }

    /// Bytes that remote nodes may write: the control block and the ring
    /// (the apply ring is the local follower's, for its own server only).
    pub fn remote_len(&self) -> u64 {
        CONTROL_SIZE + self.ring_size
    }

    /// `/dev/shm/lockstep-<cluster>-<node>`.
    pub fn default_path(&self) -> PathBuf {
        region_path(&self.cluster, self.node)
    }
}

/// Path of node `node`'s region file for `cluster`.
pub fn region_path(cluster: &str, node: u64) -> PathBuf {
    PathBuf::from(format!("/dev/shm/lockstep-{cluster}-{node}"))
}

/// FNV-1a hash of a cluster name: stored in every region's control block
/// and sent in the tcp handshake.
pub fn cluster_hash(name: &str) -> u64 {
    let mut h = crate::entry::OutputHash::default();
    h.update(name.as_bytes());
    h.0
}
