//! The control block's words as typed accessors: view, leader, role,
//! commit, tail, the ack and applied arrays, heartbeat, writer hand-off,
//! the attached preload and the region's doorbell.

use std::sync::atomic::Ordering;

use super::layout::*;

/// What a server's clocks read before its first turn when no origin is
/// known (2000-01-01T00:00:00Z): the preload's fallback, and the origin of
/// a log or snapshot made before origins were recorded (its replicas then
/// agree with the servers that started on it).
pub const PINNED_ORIGIN_US: u64 = 946_684_800_000_000;
use super::{Doorbell, Region};

/// Role of a node in its current view, as the preload sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Role {
    /// Not yet part of a view (follower starting, recovering): the preload
    /// serves only replay connections.
    Joining = 0,
    /// Backup: the preload is passive.
    Backup = 1,
    /// Leader: the preload is active and replicates inputs.
    Leader = 2,
}

impl Role {
    fn from_u64(v: u64) -> Role {
        match v {
            1 => Role::Backup,
            2 => Role::Leader,
            _ => Role::Joining,
        }
    }
}

impl Region {
    /// Current view of this node.
    pub fn view(&self) -> u64 {
        self.word(W_VIEW).load(Ordering::Acquire)
    }
    /// Sets the view (follower only).
    pub fn set_view(&self, v: u64) {
        self.word(W_VIEW).store(v, Ordering::Release)
    }
    /// Raises the view word to `v` (fencing: it never goes back).
    pub fn raise_view(&self, v: u64) {
        self.word(W_VIEW).fetch_max(v, Ordering::AcqRel);
    }
    /// Leader of the current view (0: none).
    pub fn leader(&self) -> u64 {
        self.word(W_LEADER).load(Ordering::Acquire)
    }
    /// Sets the leader id.
    pub fn set_leader(&self, id: u64) {
        self.word(W_LEADER).store(id, Ordering::Release)
    }
    /// This node's role, read by the preload.
    pub fn role(&self) -> Role {
        Role::from_u64(self.word(W_ROLE).load(Ordering::Acquire))
    }
    /// Sets the role (follower only).
    pub fn set_role(&self, r: Role) {
        self.word(W_ROLE).store(r as u64, Ordering::Release);
        self.ring_all();
    }
    /// Highest committed seq.
    pub fn commit(&self) -> u64 {
        self.word(W_COMMIT).load(Ordering::Acquire)
    }
    /// The commit word and the view of the leader that wrote it (a view
    /// at least that new: see `commit_record`). A commit point is only
    /// meaningful for a log that follows that view.
    pub fn commit_in_view(&self) -> (u64, u64) {
        let seq = self.word(W_COMMIT).load(Ordering::Acquire);
        (seq, self.word(W_COMMIT_VIEW).load(Ordering::Acquire))
    }
    /// Raises the commit word to at least `seq`.
    pub fn raise_commit(&self, seq: u64) {
        self.word(W_COMMIT).fetch_max(seq, Ordering::AcqRel);
    }
    /// Sets the commit word (view change only).
    pub fn set_commit(&self, seq: u64) {
        self.word(W_COMMIT).store(seq, Ordering::Release);
    }
    /// Writer's last published end position.
    pub fn tail(&self) -> u64 {
        self.word(W_TAIL).load(Ordering::Acquire)
    }
    /// Publishes the writer's end position.
    pub fn set_tail(&self, pos: u64) {
        self.word(W_TAIL).store(pos, Ordering::Release)
    }
    /// `ack[id]`: highest seq node `id` stored in the current view.
    pub fn ack(&self, id: u64) -> u64 {
        self.word(W_ACK + id as usize * LINE)
            .load(Ordering::Acquire)
    }
    /// Sets `ack[id]` locally.
    pub fn set_ack(&self, id: u64, seq: u64) {
        self.word(W_ACK + id as usize * LINE)
            .store(seq, Ordering::Release);
        self.bell().ring();
    }
    /// How far node `id`'s server applied the log, as it last told this
    /// (leading) node.
    pub fn applied_by(&self, id: u64) -> u64 {
        self.word(W_APPLIED_BY + id as usize * LINE)
            .load(Ordering::Acquire)
    }
    /// Node `id`'s report word beside its applied mark (see
    /// `apply_lag::report_word`).
    pub fn apply_report(&self, id: u64) -> u64 {
        self.word(W_APPLIED_BY + id as usize * LINE + 1)
            .load(Ordering::Acquire)
    }
    /// The backups that can apply, by node id (see `apply_lag`).
    pub fn appliers(&self) -> u64 {
        self.word(W_APPLIERS).load(Ordering::Acquire)
    }
    /// Publishes the backups that can apply (the leading node's follower).
    pub fn set_appliers(&self, mask: u64) {
        self.word(W_APPLIERS).store(mask, Ordering::Release)
    }
    /// Resets every ack slot (new view).
    pub fn clear_acks(&self) {
        for id in 0..=MAX_NODES as u64 {
            self.word(W_ACK + id as usize * LINE)
                .store(0, Ordering::Release);
        }
    }
    /// Follower heartbeat (milliseconds since the epoch; 0: never).
    pub fn heartbeat(&self) -> u64 {
        self.word(W_HEARTBEAT).load(Ordering::Acquire)
    }
    /// Updates the follower heartbeat.
    pub fn set_heartbeat(&self, ms: u64) {
        self.word(W_HEARTBEAT).store(ms, Ordering::Release)
    }
    /// When the cluster's log began (µs since the epoch; 0: not known on
    /// this node yet): the time of its first entry, the first leader's
    /// `VIEW`. A fresh server reads it until its first turn, on every
    /// replica (`lockstep run` hands it over as `LOCKSTEP_ORIGIN_US`).
    pub fn origin_us(&self) -> u64 {
        self.word(W_ORIGIN).load(Ordering::Acquire)
    }
    /// Sets the log's origin time (see [`Region::origin_us`]).
    pub fn set_origin_us(&self, us: u64) {
        self.word(W_ORIGIN).store(us, Ordering::Release)
    }
    /// Writer hand-off: (next seq, next ring position) for a new leader's
    /// preload, set by the follower before it flips the role to leader.
    pub fn writer_start(&self) -> (u64, u64) {
        (
            self.word(W_NEXT_SEQ).load(Ordering::Acquire),
            self.word(W_NEXT_POS).load(Ordering::Acquire),
        )
    }
    /// Sets the writer hand-off.
    pub fn set_writer_start(&self, seq: u64, pos: u64) {
        self.word(W_NEXT_SEQ).store(seq, Ordering::Release);
        self.word(W_NEXT_POS).store(pos, Ordering::Release);
    }
    /// Pid of the preloaded server attached to this region (0: none).
    pub fn preload_pid(&self) -> u64 {
        self.word(W_PRELOAD).load(Ordering::Acquire)
    }
    /// Records the attached server's pid.
    pub fn set_preload_pid(&self, pid: u64) {
        self.word(W_PRELOAD).store(pid, Ordering::Release)
    }
    /// The doorbell pollers of this region park on: rung by every remote
    /// write (a backup's entries, a leader's acks) and local ack.
    pub fn bell(&self) -> Doorbell<'_> {
        Doorbell::new(self.word(W_BELL), self.word(W_BELL_WAITERS))
    }
    /// The doorbell a leader's own writer rings when it posted entries
    /// into this (its local) ring, and its follower parks on while the node
    /// leads. Apart from [`Region::bell`] because the backups' acks ring
    /// that one, once each per turn: the leader's follower, which only
    /// stores the leader's own entries, woke for each of them.
    pub fn post_bell(&self) -> Doorbell<'_> {
        Doorbell::new(self.word(W_POST_BELL), self.word(W_POST_BELL_WAITERS))
    }
    /// Rings both doorbells: a change every poller must see (role, view).
    pub fn ring_all(&self) {
        self.bell().ring();
        self.post_bell().ring();
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_regions::spec;
    use super::super::{commit_record, commit_record_offset, Region};

    #[test]
    fn commit_records_carry_their_view() {
        let r = Region::anonymous(&spec(1)).unwrap();
        r.write(commit_record_offset(), &commit_record(4, 220))
            .unwrap();
        assert_eq!(r.commit_in_view(), (220, 4));
        assert_eq!(r.commit(), 220);
        // The leader's own raise leaves the tag alone.
        r.raise_commit(230);
        assert_eq!(r.commit_in_view(), (230, 4));
    }
}
